/* gridfsctl: the entry point (the verbs are listed in cmd/commands.c). */
#include <locale.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/lock.h"
#include "cmd.h"

static void
print_usage(FILE *out)
{
	fprintf(out, "usage: %s [global options] COMMAND [options] [args]\n\ncommands:\n", progname);
	for (const struct cmd_entry *const *c = commands; *c; c++)
		fprintf(out, "  %-10s %s\n", (*c)->name, (*c)->summary);
	fputs("\nglobal options (before or after COMMAND):\n", out);
	print_opt_rows(out, leading_opts);
	fprintf(out, "\nRun '%s COMMAND --help' for a command's options; see gridfsctl(1).\n", progname);
}

/* mongofiles' verbs, answered with the command that does the same here: users type them. */
static const struct {
	const char *verb, *answer;
} mongofiles_verbs[] = {
	{"list", "use gridfsctl ls [PREFIX|'PATTERN']"},
	{"search", "use gridfsctl ls --regex RE, or gridfsctl ls 'PATTERN'"},
	{"delete", "use gridfsctl rm NAME..."},
	{"delete_id", "use gridfsctl rm --id ID"},
	{"get_id", "use gridfsctl get --id ID (an ObjectId, or str:TEXT, int:N, long:N)"},
	{"put_id", "use gridfsctl put FILE --name NAME --id ID"},
	{"get_regex", "use gridfsctl get --regex RE -o DIR"},
};

/* Says what an unknown verb may have meant, in one line; returns the exit status. */
static int
unknown_command(const char *name)
{
	for (size_t i = 0; i < sizeof mongofiles_verbs / sizeof mongofiles_verbs[0]; i++)
		if (strcmp(name, mongofiles_verbs[i].verb) == 0) {
			warnx_("'%s' is mongofiles' verb: %s", name, mongofiles_verbs[i].answer);
			return EXIT_USAGE;
		}
	struct nearest n;
	nearest_begin(&n, name);
	for (const struct cmd_entry *const *c = commands; *c; c++)
		nearest_offer(&n, (*c)->name);
	if (n.best)
		warnx_("unknown command '%s'; did you mean '%s'?", name, n.best);
	else
		warnx_("unknown command '%s'; see '%s --help'", name, progname);
	return EXIT_USAGE;
}

/* Global options before the subcommand; the same options after it are handled by parse_options(). */
static int
parse_leading_globals(int argc, char **argv)
{
	int i = 1;
	while (i < argc && argv[i][0] == '-' && argv[i][1] != '\0') {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			print_usage(stdout);
			exit(close_stdout(EXIT_OK));
		}
		if (strcmp(argv[i], "--version") == 0) {
			printf("gridfsctl %s (mongo-c-driver %s)\n", GRIDFSCTL_VERSION, mongoc_get_version());
			exit(close_stdout(EXIT_OK));
		}
		int used = global_option(argc - i, argv + i);
		if (used < 0)
			exit(EXIT_USAGE);
		const char *near = used == 0 ? nearest_option(leading_opts, argv[i]) : NULL;
		if (near) {
			warnx_("unknown option '%s'; did you mean '--%s'?", argv[i], near);
			exit(EXIT_USAGE);
		}
		if (used == 0) {
			usage_error("unknown option '%s'", argv[i]);
			exit(EXIT_USAGE);
		}
		i += used;
	}
	return i;
}

/*
 * The driver logs to stderr by default, including warnings that are noise to
 * a user (a server without endSessions) and never a substitute for the
 * errors we report. Show them only when asked to.
 */
static void
driver_log(mongoc_log_level_t level, const char *domain, const char *message, void *data)
{
	(void)data;
	if (!getenv("GRIDFSCTL_DEBUG"))
		return;
	/* The driver names hosts as it parsed them: maybe a piece of the password. */
	char shown[2048];
	snprintf(shown, sizeof shown, "%s", message);
	gfs_redact(shown, sizeof shown);
	fprintf(stderr, "%s: driver %s: %s: %s\n", progname, mongoc_log_level_str(level), domain,
	        shown);
}

int
main(int argc, char **argv)
{
	setlocale(LC_ALL, "");
	progname = "gridfsctl";
	char *help_argv[3] = {NULL, "--help", NULL};
	int i = parse_leading_globals(argc, argv);
	if (i >= argc) {
		print_usage(stderr);
		return EXIT_USAGE;
	}
	if (strcmp(argv[i], "help") == 0) {
		if (i + 1 >= argc) {
			print_usage(stdout);
			return close_stdout(EXIT_OK);
		}
		help_argv[0] = argv[i + 1];
		argv = help_argv;
		argc = 2;
		i = 0;
	}
	if (strcmp(argv[i], "_options") == 0 || strcmp(argv[i], "_complete") == 0)
		return close_stdout(run_completion_verb(argc - i, argv + i));
	const struct cmd_entry *c = find_command(argv[i]);
	if (!c && strcmp(argv[i], "_names") != 0)
		return unknown_command(argv[i]);
	cmdname = c ? c->name : NULL;
	gfs_owner_set_verb(cmdname);
	if (load_settings() < 0)
		return EXIT_USAGE;
	mongoc_log_set_handler(driver_log, NULL);
	mongoc_init();
	int rc = c ? c->run(argc - i, argv + i) : run_completion_verb(argc - i, argv + i);
	mongoc_cleanup();
	return close_stdout(rc);
}
