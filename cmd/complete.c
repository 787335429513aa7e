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
 * The short letter, the argument's kind and the description come from the
 * --help text (the "  -x, --long META  description" lines), so they cannot
 * drift from it; only enum values need the small table below.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"

#define NAMES_MAX 200
#define NAMES_TIMEOUT_MS 300
#define DESC_MAX 72

/* Values of options whose argument is one of a few words; each is checked against --help by the tests. */
static const struct {
	const char *cmd, *option, *values;
} enum_values[] = {
	{"mirror", "read", "auto each batched scan"},
	{"verify", "strategy", "auto scan batched each"},
};

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

/* One option as --help describes it. */
struct help_entry {
	char shortopt;
	char metavar[32];
	char desc[DESC_MAX + 1];
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

static const char *
lookup_enum(const char *cmd, const char *option)
{
	for (size_t i = 0; i < sizeof enum_values / sizeof enum_values[0]; i++)
		if (strcmp(enum_values[i].cmd, cmd) == 0 && strcmp(enum_values[i].option, option) == 0)
			return enum_values[i].values;
	return NULL;
}

/* Indented by at most six spaces: an option or control line; deeper lines continue the one above. */
static bool
is_entry_line(const char *line, const char **text)
{
	size_t indent = strspn(line, " ");
	*text = line + indent;
	return indent <= 6 && **text != '\n' && **text != '\0';
}

/*
 * A --help description made short enough for a completion menu: the
 * continuation lines joined, remarks in parentheses and anything after a ';'
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

/* Copies the entry's description: the rest of its line and its continuation lines. */
static void
entry_description(const char *start, struct help_entry *e)
{
	char buf[1024];
	size_t n = 0;
	const char *p = start, *text;
	for (;;) {
		const char *eol = strchrnul(p, '\n');
		size_t len = (size_t)(eol - p);
		if (n + len + 2 < sizeof buf) {
			memcpy(buf + n, p, len);
			n += len;
			buf[n++] = ' ';
		}
		if (!*eol || is_entry_line(eol + 1, &text) || eol[1] == '\0')
			break;
		p = eol + 1;
	}
	buf[n] = '\0';
	shorten(buf, e->desc);
}

/* Parses one "  -x, --long META  description" line; false if it is not about --name. */
static bool
parse_entry(const char *text, const char *name, bool has_arg, struct help_entry *e)
{
	memset(e, 0, sizeof *e);
	if (text[0] == '-' && text[1] != '-' && text[1] && text[2] == ',') {
		e->shortopt = text[1];
		text += 3 + strspn(text + 3, " ");
	}
	size_t n = strlen(name);
	if (strncmp(text, "--", 2) != 0 || strncmp(text + 2, name, n) != 0)
		return false;
	text += 2 + n;
	if (*text != ' ' && *text != '\n' && *text != '\0')
		return false;
	text += strspn(text, " ");
	if (has_arg) {
		size_t m = strcspn(text, " \n");
		if (m < sizeof e->metavar) {
			memcpy(e->metavar, text, m);
			e->metavar[m] = '\0';
		}
		text += m + strspn(text + m, " ");
	}
	entry_description(text, e);
	return true;
}

static bool
find_entry(const char *help, const char *name, bool has_arg, struct help_entry *e)
{
	for (const char *line = help; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
		const char *text;
		if (is_entry_line(line, &text) && parse_entry(text, name, has_arg, e))
			return true;
	}
	memset(e, 0, sizeof *e);
	return false;
}

static const char *
or_dash(const char *s)
{
	return s && *s ? s : "-";
}

/* no_short: the command took the letter for itself (ls -h), so this option has none. */
static void
print_option(const char *cmd, const struct option *o, const char *help, bool no_short)
{
	struct help_entry e;
	find_entry(help, o->name, o->has_arg != no_argument, &e);
	const char *values = cmd ? lookup_enum(cmd, o->name) : NULL;
	const char *kind = o->has_arg == no_argument ? "flag"
	                 : values ? "enum"
	                 : lookup_kind(e.metavar, false);
	char shortopt[3] = {e.shortopt && !no_short ? '-' : '\0', e.shortopt, '\0'};
	printf("--%s\t%s\t%s\t%s\t%s\n", o->name, or_dash(shortopt), kind ? kind : "string",
	       or_dash(values), or_dash(e.desc));
}

/* Control words of a command's --help (lines that start with a lowercase word, like supervise's "status"). */
static void
control_words(const char *help, char *out, size_t size)
{
	size_t n = 0;
	out[0] = '\0';
	for (const char *line = help; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
		const char *text;
		if (line[0] != ' ' || !is_entry_line(line, &text) || !islower((unsigned char)*text))
			continue;
		size_t len = strspn(text, "abcdefghijklmnopqrstuvwxyz-");
		if (n + len + 2 > size)
			break;
		if (n)
			out[n++] = ' ';
		memcpy(out + n, text, len);
		n += len;
		out[n] = '\0';
	}
}

static void
print_operands(const struct command *c)
{
	char values[256], metavar[32] = "";
	control_words(c->help, values, sizeof values);
	if (*values) {
		printf("@args\t-\tenum\t%s\t-\n", values);
		return;
	}
	const char *first = c->usage + strlen(c->name);
	first += strspn(first, " [");
	size_t m = strcspn(first, " ]|.");
	if (m < sizeof metavar) {
		memcpy(metavar, first, m);
		metavar[m] = '\0';
	}
	const char *kind = lookup_kind(metavar, true);
	printf("@args\t-\t%s\t-\t-\n", kind ? kind : "none");
}

/* The global options, as print_usage's text describes them; --version only before a command. */
static void
print_globals(const struct command *c)
{
	static const struct option version = {"version", no_argument, NULL, 0};
	bool own_h = false;
	for (const struct option *o = c ? c->long_opts : NULL; o && o->name; o++)
		own_h |= o->val == 'h';
	for (const struct option *o = global_longopts; o->name; o++)
		print_option(NULL, o, global_help, own_h && strcmp(o->name, "help") == 0);
	if (!c)
		print_option(NULL, &version, global_help, false);
}

static int
print_completions(const char *name)
{
	if (!name) {
		for (const struct command *c = commands; c->name; c++)
			printf("%s\t-\tcommand\t-\t%s\n", c->name, c->summary);
		printf("help\t-\tcommand\t-\thelp for a command\n");
		print_globals(NULL);
		return EXIT_OK;
	}
	if (strcmp(name, "help") == 0) {
		printf("@args\t-\tcommand\t-\t-\n");
		return EXIT_OK;
	}
	const struct command *c = find_command(name);
	if (!c) {
		fprintf(stderr, "%s: unknown command '%s'\n", progname, name);
		return EXIT_USAGE;
	}
	for (const struct option *o = c->long_opts; o && o->name; o++)
		print_option(c->name, o, c->help, false);
	print_globals(c);
	print_operands(c);
	return EXIT_OK;
}

static int
print_option_names(const char *name)
{
	if (!name) {
		for (const struct command *c = commands; c->name; c++)
			printf("%s\n", c->name);
		return EXIT_OK;
	}
	const struct command *c = find_command(name);
	for (const struct option *o = c ? c->long_opts : NULL; o && o->name; o++)
		printf("--%s%s\n", o->name, o->has_arg == no_argument ? "" : "=");
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
on_name(const gfs_file *f, void *ctx)
{
	struct names *n = ctx;
	const char *name = f->filename;
	if (!name || !typeable(name) || strcmp(name, n->last) == 0)
		return true;
	printf("%s\n", name);
	snprintf(n->last, sizeof n->last, "%s", name);
	return ++n->count < NAMES_MAX;
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
	bool ok = gfs_list(s, prefix, on_name, &n, &err);
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
