/*
 * The option parser every subcommand shares: a verb's own rows (through its
 * on_opt) and the global options (cmd/globals.c), accepted before or after
 * the subcommand name, and --help.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"

static bool no_progress, force_progress;
static const char *stats_arg;

/*
 * A password typed into --uri is readable by every local user through
 * /proc/PID/cmdline. Warn, and blank it in our argv so that it is visible
 * for as short a time as we can manage. This goes by syntax, not by
 * mongoc_uri_new(): a URI the driver refuses (a bad option, say) may still
 * hold a real password. The userinfo ends at the last '@' before the
 * options, so an '@' in an option value is not taken for it.
 */
static void
scrub_password(char *uri_arg)
{
	char *start = strstr(uri_arg, "://");
	start = start ? start + 3 : uri_arg;
	size_t n;
	const char *pw = gfs_uri_password(start, strcspn(start, "?"), &n);
	if (!pw || n == 0)
		return;
	memset(start + (pw - start), 'x', n);
	fprintf(stderr, "%s: warning: a password in --uri is visible to other users; "
	                "use $GRIDFSCTL_URI or the config file\n", progname);
}

/* Whether one of e's own rows takes the letter c (ls takes -h: --help has no letter there). */
static bool
own_letter(const struct cmd_entry *e, char c)
{
	struct cmd_opt_iter it;
	cmd_opt_begin(&it, e->opts);
	for (const struct cmd_opt *o; (o = cmd_opt_next(&it));)
		if (o->name && o->shortopt == c)
			return true;
	return false;
}

static void
set_global(int id, char *arg)
{
	switch (id) {
	case OPT_URI:
		G.uri = strdup(arg);
		scrub_password(arg);
		break;
	case OPT_DB: G.db = arg; break;
	case OPT_BUCKET: G.bucket = arg; break;
	case OPT_QUIET: G.quiet = true; break;
	case OPT_NO_PROGRESS: no_progress = true; break;
	case OPT_PROGRESS: force_progress = true; break;
	case OPT_STATS: stats_arg = arg; break;
	}
}

/* The global row argv[0] names ("-q", "--db", "--db=x"); *value is what follows '=', if anything. */
static const struct cmd_opt *
find_global(const char *a, const char **value)
{
	*value = NULL;
	for (const struct cmd_opt *o = global_opts; o->name; o++) {
		if (o->id == OPT_HELP)
			continue;
		if (o->shortopt && a[0] == '-' && a[1] == o->shortopt && a[2] == '\0')
			return o;
		size_t n = strlen(o->name);
		if (strncmp(a, "--", 2) != 0 || strncmp(a + 2, o->name, n) != 0)
			continue;
		if (a[2 + n] == '=' && o->arg) {
			*value = a + 2 + n + 1;
			return o;
		}
		if (a[2 + n] == '\0')
			return o;
	}
	return NULL;
}

int
global_option(int argc, char **argv)
{
	const char *value;
	const struct cmd_opt *o = find_global(argv[0], &value);
	if (!o)
		return 0;
	if (value || !o->arg) {
		set_global(o->id, (char *)value);
		return 1;
	}
	if (argc < 2) {
		usage_error("option '--%s' needs an argument", o->name);
		return -1;
	}
	set_global(o->id, argv[1]);
	return 2;
}

/*
 * Whether and how progress is shown: on a terminal unless --no-progress or
 * -q; anywhere with --progress; as a line every --stats interval. False
 * after a usage error.
 */
static bool
progress_settings(void)
{
	G.stats_s = 0;
	if (stats_arg) {
		long ms;
		if (!gfs_parse_duration_ms(stats_arg, 100, 86400000L, &ms)) {
			usage_error("--stats takes a duration from 0.1s to 24h (30s, 5m), not '%s'", stats_arg);
			return false;
		}
		G.stats_s = ms / 1000.0;
	}
	if (no_progress && (force_progress || stats_arg)) {
		usage_error("--no-progress contradicts --%s", stats_arg ? "stats" : "progress");
		return false;
	}
	G.progress = !no_progress && !G.quiet &&
	             (force_progress || stats_arg || isatty(STDERR_FILENO));
	return true;
}

int
parse_options(int argc, char **argv, const struct cmd_entry *e, opt_fn on_opt, void *ctx)
{
	char *shorts;
	struct option *all;
	getopt_tables(e->opts, global_opts, &shorts, &all);
	int rc = 0, opt;
	bool help = false;
	optind = 1;
	opterr = 0;
	while (rc == 0 && !help && (opt = getopt_long(argc, argv, shorts, all, NULL)) != -1) {
		switch (opt) {
		case OPT_HELP:
			help = true;
			break;
		case OPT_URI:
		case OPT_DB:
		case OPT_BUCKET:
		case OPT_QUIET:
		case OPT_NO_PROGRESS:
		case OPT_PROGRESS:
		case OPT_STATS:
			set_global(opt, optarg);
			break;
		case ':':
			usage_error("option '%s' needs an argument", argv[optind - 1]);
			rc = -1;
			break;
		case '?': {
			const char *near = optopt ? NULL : nearest_option(e->opts, argv[optind - 1]);
			if (optopt)
				usage_error("unknown option '-%c'", optopt);
			else if (near)
				warnx_("unknown option '%s'; did you mean '--%s'?", argv[optind - 1], near);
			else
				usage_error("unknown option '%s'", argv[optind - 1]);
			rc = -1;
			break;
		}
		default:
			/* -h and -q are the global options' unless the command took the letter. */
			if (opt == 'h' && !own_letter(e, 'h'))
				help = true;
			else if (opt == 'q' && !own_letter(e, 'q'))
				set_global(OPT_QUIET, NULL);
			else if (cmd_opt_take(e->opts, cmd_opt_resolve(e->opts, opt), optarg, on_opt, ctx) < 0)
				rc = -1;
		}
	}
	free(all);
	free(shorts);
	if (help) {
		print_command_help(stdout, e);
		exit(close_stdout(EXIT_OK));
	}
	if (rc == 0 && !progress_settings())
		rc = -1;
	return rc < 0 ? -1 : optind;
}
