/*
 * What a command's option rows (struct cmd_opt, cmd/cmd.h) are turned into:
 * the getopt tables, the usage line and the option list of --help. The
 * completions read the same rows (cmd/complete.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "../lib/util.h"

#define WIDTH 80          /* --help is wrapped to this many columns */
#define COLUMN_MAX 32     /* where option descriptions start, at most */

static bool
row_end(const struct cmd_opt *o)
{
	return !o->name && !o->help && !o->word && !o->group && !o->alias_of;
}

void
cmd_opt_begin(struct cmd_opt_iter *it, const struct cmd_opt *rows)
{
	it->at[0] = rows;
	it->depth = rows ? 1 : 0;
}

const struct cmd_opt *
cmd_opt_next(struct cmd_opt_iter *it)
{
	while (it->depth > 0) {
		const struct cmd_opt **top = &it->at[it->depth - 1];
		if (row_end(*top)) {
			it->depth--;
			continue;
		}
		const struct cmd_opt *o = (*top)++;
		if (!o->group)
			return o;
		if (it->depth == CMD_OPT_DEPTH) {
			fprintf(stderr, "%s: internal error: option groups nested too deep\n", progname);
			abort();
		}
		it->at[it->depth++] = o->group;
	}
	return NULL;
}

int
cmd_opt_id(const struct cmd_opt *o)
{
	return o->id ? o->id : o->shortopt;
}

bool
cmd_opt_listed(const struct cmd_opt *o)
{
	return o->name && !o->alias_of;
}

/* The row of rows (groups spliced in) with that long name, or NULL. */
static const struct cmd_opt *
find_row(const struct cmd_opt *rows, const char *name)
{
	struct cmd_opt_iter it;
	cmd_opt_begin(&it, rows);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));)
		if (cmd_opt_listed(o) && strcmp(o->name, name) == 0)
			return o;
	return NULL;
}

/* "-n" or "--strategy": how the user spelt an alias row. */
static void
spelling(const struct cmd_opt *o, char *buf, size_t size)
{
	if (o->name)
		snprintf(buf, size, "--%s", o->name);
	else
		snprintf(buf, size, "-%c", o->shortopt);
}

int
cmd_opt_resolve(const struct cmd_opt *rows, int id)
{
	struct cmd_opt_iter it;
	cmd_opt_begin(&it, rows);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));) {
		if (!o->alias_of || cmd_opt_id(o) != id)
			continue;
		const struct cmd_opt *target = find_row(rows, o->alias_of);
		char old[64];
		spelling(o, old, sizeof old);
		warnx_("warning: '%s' is deprecated and goes in the next release; use '--%s'", old,
		       o->alias_of);
		return target ? cmd_opt_id(target) : id;
	}
	return id;
}

/* ---- getopt ------------------------------------------------------------ */

static size_t
count_options(const struct cmd_opt *rows)
{
	struct cmd_opt_iter it;
	size_t n = 0;
	cmd_opt_begin(&it, rows);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));)
		n += o->name || o->alias_of;
	return n;
}

/* Two rows with one name or one id would have one of them silently never seen. */
static void
check_unique(const struct option *longs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		for (size_t j = i + 1; j < n; j++)
			if (longs[i].val == longs[j].val || strcmp(longs[i].name, longs[j].name) == 0) {
				fprintf(stderr, "%s: internal error: options --%s and --%s share an id or a name\n",
				        progname, longs[i].name, longs[j].name);
				abort();
			}
}

/*
 * Adds the row's letter to shorts. A global option leaves a letter to the
 * command's own (ls -h before the global -h); two of the command's own
 * rows with one letter are a mistake.
 */
static void
add_short(char *shorts, const struct cmd_opt *o, bool own)
{
	if (!o->shortopt)
		return;
	if (strchr(shorts + 1, o->shortopt) && own) {
		fprintf(stderr, "%s: internal error: two options take -%c\n", progname, o->shortopt);
		abort();
	}
	if (strchr(shorts + 1, o->shortopt))
		return;
	size_t n = strlen(shorts);
	shorts[n++] = o->shortopt;
	if (o->arg)
		shorts[n++] = ':';
	shorts[n] = '\0';
}

static void
add_rows(const struct cmd_opt *rows, bool own, char *shorts, struct option *longs, size_t *n)
{
	struct cmd_opt_iter it;
	cmd_opt_begin(&it, rows);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));) {
		if (o->alias_of)
			add_short(shorts, o, own);
		if (!o->name)
			continue;
		if (!o->alias_of)
			add_short(shorts, o, own);
		longs[(*n)++] = (struct option){o->name, o->arg ? required_argument : no_argument, NULL,
		                                cmd_opt_id(o)};
	}
}

void
getopt_tables(const struct cmd_opt *rows, const struct cmd_opt *extra, char **shorts,
              struct option **longs)
{
	size_t max = count_options(rows) + count_options(extra), n = 0;
	*longs = gfs_xcalloc(max + 1, sizeof **longs);
	/* A leading ':' reports a missing argument apart from an unknown option. */
	*shorts = gfs_xcalloc(2 * max + 2, 1);
	(*shorts)[0] = ':';
	add_rows(rows, true, *shorts, *longs, &n);
	add_rows(extra, false, *shorts, *longs, &n);
	check_unique(*longs, n);
}

/* ---- "did you mean" ---------------------------------------------------- */

/*
 * The optimal string alignment distance: insertions, deletions,
 * substitutions and swaps of two neighbours ("improt") each cost one.
 * Words longer than NEAR_MAX are never a typo of anything we have.
 */
enum { NEAR_MAX = 40 };

static size_t
osa_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	if (la > NEAR_MAX || lb > NEAR_MAX)
		return SIZE_MAX;
	size_t d[NEAR_MAX + 1][NEAR_MAX + 1];
	for (size_t i = 0; i <= la; i++)
		d[i][0] = i;
	for (size_t j = 0; j <= lb; j++)
		d[0][j] = j;
	for (size_t i = 1; i <= la; i++)
		for (size_t j = 1; j <= lb; j++) {
			size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
			if (d[i - 1][j] + 1 < best)
				best = d[i - 1][j] + 1;
			if (d[i][j - 1] + 1 < best)
				best = d[i][j - 1] + 1;
			if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
			    d[i - 2][j - 2] + 1 < best)
				best = d[i - 2][j - 2] + 1;
			d[i][j] = best;
		}
	return d[la][lb];
}

void
nearest_begin(struct nearest *n, const char *typed)
{
	*n = (struct nearest){.typed = typed, .dist = SIZE_MAX};
}

/*
 * Close enough to be a typo: at most two edits, and fewer than a third of
 * the word, so that "ls" is not offered for every two-letter mistake.
 */
void
nearest_offer(struct nearest *n, const char *word)
{
	size_t d = osa_distance(n->typed, word), len = strlen(word);
	if (d == 0 || d > 2 || 3 * d > len + 1 || d >= n->dist)
		return;
	n->best = word;
	n->dist = d;
}

static void
offer_rows(struct nearest *n, const struct cmd_opt *rows)
{
	struct cmd_opt_iter it;
	cmd_opt_begin(&it, rows);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));)
		if (cmd_opt_listed(o))
			nearest_offer(n, o->name);
}

const char *
nearest_option(const struct cmd_opt *rows, const char *arg)
{
	if (strncmp(arg, "--", 2) != 0)
		return NULL;
	char typed[NEAR_MAX + 1];
	size_t len = strcspn(arg + 2, "=");
	if (len == 0 || len > NEAR_MAX)
		return NULL;
	memcpy(typed, arg + 2, len);
	typed[len] = '\0';
	struct nearest n;
	nearest_begin(&n, typed);
	offer_rows(&n, rows);
	offer_rows(&n, global_opts);
	return n.best;
}

/* ---- --help ------------------------------------------------------------ */

/* A cursor on an output line, for word wrapping. */
struct line {
	FILE *out;
	int at;        /* the column the next character goes to */
	int indent;    /* where a continuation line starts */
	bool words;    /* a word is on the line already: the next one needs a space */
};

/* Writes one word (len bytes), on a new line when it would pass WIDTH. */
static void
put_word(struct line *l, const char *w, int len)
{
	if (l->words && l->at + 1 + len > WIDTH) {
		fprintf(l->out, "\n%*s", l->indent, "");
		l->at = l->indent;
	} else if (l->words) {
		fputc(' ', l->out);
		l->at++;
	}
	fwrite(w, 1, (size_t)len, l->out);
	l->at += len;
	l->words = true;
}

static void
put_words(struct line *l, const char *text)
{
	for (const char *p = text + strspn(text, " "); *p; p += strspn(p, " ")) {
		int len = (int)strcspn(p, " ");
		put_word(l, p, len);
		p += len;
	}
}

/* "  -x, --long ARG", "      --long ARG" or "  word ARGS": the left side of a row. */
static int
row_left(const struct cmd_opt *o, char *buf, size_t size)
{
	if (o->word)
		return snprintf(buf, size, "  %s%s%s", o->word, o->arg ? " " : "", o->arg ? o->arg : "");
	char s[8] = "    ";
	if (o->shortopt)
		snprintf(s, sizeof s, "-%c, ", o->shortopt);
	return snprintf(buf, size, "  %s--%s%s%s", s, o->name, o->arg ? " " : "", o->arg ? o->arg : "");
}

static int
help_column(const struct cmd_opt *rows)
{
	struct cmd_opt_iter it;
	char buf[128];
	int col = 0;
	cmd_opt_begin(&it, rows);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));) {
		int n = cmd_opt_listed(o) || o->word ? row_left(o, buf, sizeof buf) + 2 : 0;
		if (n > col && n <= COLUMN_MAX)
			col = n;
	}
	return col;
}

void
print_opt_rows(FILE *out, const struct cmd_opt *rows)
{
	struct cmd_opt_iter it;
	char left[128];
	int col = help_column(rows);
	cmd_opt_begin(&it, rows);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));) {
		if (o->alias_of)
			continue;
		if (!o->name && !o->word) {
			fprintf(out, "%s\n", o->help);
			continue;
		}
		int n = row_left(o, left, sizeof left);
		struct line l = {out, n, col, false};
		fputs(left, out);
		if (n + 2 > col) {
			fputs("  ", out);
			l.at += 2;
		} else {
			fprintf(out, "%*s", col - n, "");
			l.at = col;
		}
		put_words(&l, o->help ? o->help : "");
		fputc('\n', out);
	}
}

/* The usage line: every option in brackets, then the operands, wrapped under the verb. */
static void
print_usage_line(FILE *out, const struct cmd_entry *e)
{
	int n = fprintf(out, "usage: %s %s", progname, e->name);
	struct line l = {out, n, n + 1, true};
	struct cmd_opt_iter it;
	char word[128];
	cmd_opt_begin(&it, e->opts);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));) {
		if (!cmd_opt_listed(o))
			continue;
		/* An option the operands name already ("NAME|--id OID") */
		snprintf(word, sizeof word, "--%s ", o->name);
		if (e->operands && strstr(e->operands, word))
			continue;
		int len = o->shortopt ? snprintf(word, sizeof word, "[-%c%s%s]", o->shortopt,
		                                 o->arg ? " " : "", o->arg ? o->arg : "")
		                      : snprintf(word, sizeof word, "[--%s%s%s]", o->name,
		                                 o->arg ? " " : "", o->arg ? o->arg : "");
		put_word(&l, word, len);
	}
	/* The operands stay together: "NAME|--id OID" is one choice. */
	if (e->operands)
		put_word(&l, e->operands, (int)strlen(e->operands));
	fputc('\n', out);
}

/* "global options: --uri URI, ..., -q/--quiet, ...": what a verb takes besides its own. */
static void
print_globals_line(FILE *out)
{
	const char *sep = "global options: ";
	for (const struct cmd_opt *o = global_opts; !row_end(o); o++) {
		if (!o->name || strcmp(o->name, "help") == 0)
			continue;
		fputs(sep, out);
		if (o->shortopt)
			fprintf(out, "-%c/", o->shortopt);
		fprintf(out, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
		sep = ", ";
	}
	fputc('\n', out);
}

static void
print_exits(FILE *out, const struct cmd_entry *e)
{
	fputs("exit status: ", out);
	for (const struct cmd_exit *x = e->exits; x && x->code >= 0; x++)
		fprintf(out, "%s%d %s", x == e->exits ? "" : "; ", x->code, x->why);
	fprintf(out, "; see %s-%s(1)\n", progname, e->name);
}

/* "deprecated: -n for --name; ...": the old spellings that still work, and for how long. */
static void
print_aliases(FILE *out, const struct cmd_opt *rows)
{
	struct cmd_opt_iter it;
	const char *sep = "deprecated (they warn, and go in the next release): ";
	char old[64];
	cmd_opt_begin(&it, rows);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));) {
		if (!o->alias_of)
			continue;
		spelling(o, old, sizeof old);
		fprintf(out, "%s%s for --%s", sep, old, o->alias_of);
		sep = "; ";
	}
	if (*sep == ';')
		fputs("\n", out);
}

void
print_command_help(FILE *out, const struct cmd_entry *e)
{
	print_usage_line(out, e);
	fprintf(out, "\n%s.\n\n", e->summary);
	if (count_options(e->opts) > 0) {
		fputs("options:\n", out);
		print_opt_rows(out, e->opts);
		print_aliases(out, e->opts);
		fputc('\n', out);
	}
	print_globals_line(out);
	print_exits(out, e);
}
