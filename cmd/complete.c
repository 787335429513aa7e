/*
 * The hidden verbs the shell completions ask, so that an option added to a
 * command's table and --help text is completed by bash, zsh and fish without
 * editing them:
 *
 *   _options [CMD]   the commands, or CMD's long options ("=" when they take
 *                    an argument)
 *   _complete [CMD]  one line per word the shell may offer, five fields split
 *                    by tabs, "-" for an empty one (bash's read folds empty
 *                    tab-separated fields into one):
 *                      WORD SHORT KIND VALUES DESCRIPTION
 *                    WORD is a --long option, a command name, or "@args" for
 *                    CMD's operands; KIND is flag, file, dir, number, enum,
 *                    name (a stored name), command or string; VALUES are
 *                    an enum's words, space-separated.
 *   _names PREFIX    stored names starting with PREFIX, at most NAMES_MAX,
 *                    giving up after NAMES_TIMEOUT_MS: a TAB must never hang.
 *
 * Everything comes from the command's option rows (cmd/cmd.h), as --help
 * does: the short letter, the argument's kind (from the name --help gives
 * it), an enum's values, and the help line shortened to a description.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"

#define NAMES_MAX 200
#define NAMES_TIMEOUT_MS 300
#define DESC_MAX 72

/* The argument kind a --help metavar stands for; any other is a free string. */
static const struct {
	const char *metavar, *kind;
} metavar_kinds[] = {
	{"FILE", "file"}, {"F", "file"}, {"FILE|-", "file"}, {"PATH", "file"}, {"DIR", "dir"},
	{"N", "number"}, {"N%", "number"}, {"SECONDS", "number"}, {"SECS", "number"},
	{"SIZE", "number"}, {"TIME", "number"},
};

/* The operand kind the first word of a usage line stands for. */
static const struct {
	const char *metavar, *kind;
} operand_kinds[] = {
	{"DIR", "dir"}, {"FILE", "file"}, {"NAME", "name"}, {"PREFIX", "name"},
};

static const char *
lookup_kind(const char *metavar, bool operand)
{
	size_t n = operand ? sizeof operand_kinds / sizeof operand_kinds[0]
	                   : sizeof metavar_kinds / sizeof metavar_kinds[0];
	for (size_t i = 0; i < n; i++) {
		const char *m = operand ? operand_kinds[i].metavar : metavar_kinds[i].metavar;
		if (strcmp(m, metavar) == 0)
			return operand ? operand_kinds[i].kind : metavar_kinds[i].kind;
	}
	return NULL;
}

/*
 * A row's help made short enough for a completion menu: the spaces
 * squeezed, remarks in parentheses and anything after a ';'
 * (or a ': ' that follows a phrase rather than a label) left out, cut at a
 * word boundary.
 */
static void
shorten(const char *text, char *out)
{
	size_t n = 0;
	int depth = 0;
	bool space = false;
	const char *p = text;
	for (; *p && *p != ';' && n < DESC_MAX; p++) {
		if (*p == ':' && p[1] == ' ' && n >= 20)
			break;
		if (*p == '(' || *p == ')') {
			depth += *p == '(' ? 1 : -1;
			continue;
		}
		if (depth > 0)
			continue;
		if (isspace((unsigned char)*p)) {
			space = n > 0;
			continue;
		}
		if (space && *p != ',' && n + 1 < DESC_MAX)
			out[n++] = ' ';
		space = false;
		out[n++] = *p;
	}
	out[n] = '\0';
	/* Cut in the middle of a word: end at the last whole one. */
	if (n == DESC_MAX && *p && !isspace((unsigned char)*p)) {
		char *cut = strrchr(out, ' ');
		if (cut)
			*cut = '\0';
		n = strlen(out);
	}
	while (n > 0 && (out[n - 1] == ',' || out[n - 1] == ' '))
		out[--n] = '\0';
}

static const char *
or_dash(const char *s)
{
	return s && *s ? s : "-";
}

/* no_short: the command took the letter for itself (ls -h), so this option has none. */
static void
print_option(const struct cmd_opt *o, bool no_short)
{
	char desc[DESC_MAX + 1];
	shorten(o->help ? o->help : "", desc);
	const char *kind = !o->arg ? "flag" : o->values ? "enum" : lookup_kind(o->arg, false);
	char shortopt[3] = {o->shortopt && !no_short ? '-' : '\0', o->shortopt, '\0'};
	printf("--%s\t%s\t%s\t%s\t%s\n", o->name, or_dash(shortopt), kind ? kind : "string",
	       or_dash(o->values), or_dash(desc));
}

static void
print_operands(const struct cmd_entry *c)
{
	char values[256] = "", metavar[32] = "";
	size_t n = 0;
	struct cmd_opt_iter it;
	cmd_opt_begin(&it, c->opts);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));)
		if (o->word && n + strlen(o->word) + 2 < sizeof values)
			n += (size_t)snprintf(values + n, sizeof values - n, "%s%s", n ? " " : "", o->word);
	if (*values) {
		printf("@args\t-\tenum\t%s\t-\n", values);
		return;
	}
	const char *first = c->operands ? c->operands : "";
	first += strspn(first, " [");
	size_t m = strcspn(first, " ]|.");
	if (m < sizeof metavar) {
		memcpy(metavar, first, m);
		metavar[m] = '\0';
	}
	const char *kind = lookup_kind(metavar, true);
	printf("@args\t-\t%s\t-\t-\n", kind ? kind : "none");
}

/* Whether one of c's own options takes the letter. */
static bool
takes_letter(const struct cmd_entry *c, char letter)
{
	struct cmd_opt_iter it;
	cmd_opt_begin(&it, c->opts);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));)
		if (cmd_opt_listed(o) && o->shortopt == letter)
			return true;
	return false;
}

/* The global options; --version only before a command. */
static void
print_globals(const struct cmd_entry *c)
{
	struct cmd_opt_iter it;
	cmd_opt_begin(&it, c ? global_opts : leading_opts);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));)
		print_option(o, c && o->shortopt && takes_letter(c, o->shortopt));
}

static int
print_completions(const char *name)
{
	if (!name) {
		for (const struct cmd_entry *const *c = commands; *c; c++)
			printf("%s\t-\tcommand\t-\t%s\n", (*c)->name, (*c)->summary);
		printf("help\t-\tcommand\t-\thelp for a command\n");
		print_globals(NULL);
		return EXIT_OK;
	}
	if (strcmp(name, "help") == 0) {
		printf("@args\t-\tcommand\t-\t-\n");
		return EXIT_OK;
	}
	const struct cmd_entry *c = find_command(name);
	if (!c) {
		fprintf(stderr, "%s: unknown command '%s'\n", progname, name);
		return EXIT_USAGE;
	}
	struct cmd_opt_iter it;
	cmd_opt_begin(&it, c->opts);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));)
		if (cmd_opt_listed(o))
			print_option(o, false);
	print_globals(c);
	print_operands(c);
	return EXIT_OK;
}

static int
print_option_names(const char *name)
{
	if (!name) {
		for (const struct cmd_entry *const *c = commands; *c; c++)
			printf("%s\n", (*c)->name);
		return EXIT_OK;
	}
	const struct cmd_entry *c = find_command(name);
	struct cmd_opt_iter it;
	cmd_opt_begin(&it, c ? c->opts : NULL);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));)
		if (cmd_opt_listed(o))
			printf("--%s%s\n", o->name, o->arg ? "=" : "");
	return EXIT_OK;
}

struct names {
	char last[4096];
	size_t count;
};

/* A name the human-output rule would escape cannot be typed at a prompt as it is. */
static bool
typeable(const char *s)
{
	char *shown = printable(s, strlen(s));
	bool same = strcmp(shown, s) == 0;
	free(shown);
	return same;
}

static bool
offer(struct names *n, const char *name)
{
	if (!name || !typeable(name) || strcmp(name, n->last) == 0)
		return true;
	printf("%s\n", name);
	snprintf(n->last, sizeof n->last, "%s", name);
	return ++n->count < NAMES_MAX;
}

static bool
on_name(const gfs_file *f, void *ctx)
{
	return offer(ctx, f->filename);
}

/* A name whose document is malformed is still stored: a verb may name it (rm, verify). */
static bool
on_bad_name(const bson_t *doc, const char *name, const gfs_error *why, void *ctx)
{
	(void)doc;
	(void)why;
	return offer(ctx, name);
}

static int
print_names(const char *prefix)
{
	char *uri = uri_with_option(G.uri, "serverSelectionTimeoutMS", NAMES_TIMEOUT_MS);
	char *quick = uri ? uri_with_option(uri, "connectTimeoutMS", NAMES_TIMEOUT_MS) : NULL;
	free(uri);
	if (!quick)
		abort();
	gfs_error err;
	gfs_conn *conn = gfs_conn_open(quick, G.db, G.bucket, &err);
	free(quick);
	if (!conn)
		return fail(&err);
	gfs_session *s = gfs_session_pop(conn);
	struct names n = {.count = 0};
	bool ok = gfs_list(s, prefix, on_name, on_bad_name, &n, &err);
	gfs_session_push(s);
	gfs_conn_close(conn);
	return ok ? EXIT_OK : fail(&err);
}

/* _names [PREFIX] with the global options before or after it, as every verb takes them. */
static int
names_verb(int argc, char **argv)
{
	const char *prefix = NULL;
	for (int i = 1; i < argc;) {
		if (strcmp(argv[i], "--") == 0 && i + 1 < argc && !prefix) {
			prefix = argv[i + 1]; /* a prefix that starts with '-' */
			i += 2;
			continue;
		}
		int used = argv[i][0] == '-' ? global_option(argc - i, argv + i) : 0;
		if (used < 0)
			return EXIT_USAGE;
		if (used > 0) {
			i += used;
			continue;
		}
		if (prefix) {
			usage_error("at most one PREFIX");
			return EXIT_USAGE;
		}
		prefix = argv[i++];
	}
	return print_names(prefix ? prefix : "");
}

int
run_completion_verb(int argc, char **argv)
{
	const char *verb = argv[0], *arg = argc > 1 ? argv[1] : NULL;
	if (strcmp(verb, "_options") == 0)
		return print_option_names(arg);
	if (strcmp(verb, "_complete") == 0)
		return print_completions(arg);
	return names_verb(argc, argv);
}
