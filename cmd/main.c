/* gridfsctl: entry point and the table of subcommands. */
#include <locale.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"

const struct command commands[] = {
	{"ls", "ls [PREFIX] [-l] [--json]", "list files in the bucket", ls_help, cmd_ls, ls_options},
	{"get", "get NAME|--id OID [-o FILE|-] [--force]", "write a stored file to disk or stdout", get_help, cmd_get, get_options},
	{"put", "put FILE [--name NAME] [--type MIME]", "store a file, replacing older revisions when complete", put_help, cmd_put, put_options},
	{"rm", "rm NAME...|--id OID", "remove files (all revisions of a name)", rm_help, cmd_rm, rm_options},
	{"stat", "stat NAME|--id OID [--json]", "show one file's document", stat_help, cmd_stat, stat_options},
	{"import", "import DIR [--prefix P] [options]", "bulk-load a directory tree", import_help, cmd_import, import_options},
	{"verify", "verify [--prefix P] [--against DIR] [--repair]", "check stored files for damage", verify_help, cmd_verify, verify_options},
	{"mirror", "mirror DIR [--prefix P] [--delete]", "write the bucket back to a disk tree", mirror_help, cmd_mirror, mirror_options},
	{"watch", "watch DIR [--prefix P]", "keep the bucket in sync with a directory", watch_help, cmd_watch, watch_options},
	{"serve", "serve [--listen ADDR:PORT] [--prefix P]", "serve files over HTTP", serve_help, cmd_serve, serve_options},
	{"supervise", "supervise -c FILE | [options] -- CMD ARGS... | status|restart NAME|reload|stop", "keep backends and servers running, watching their descriptors", supervise_help, cmd_supervise, supervise_options},
	{"doctor", "doctor [--sample N] [--json]", "check the backend, the bucket's indexes, the import lock and orphan chunks", doctor_help, cmd_doctor, doctor_options},
	{NULL, NULL, NULL, NULL, NULL, NULL},
};

const char global_help[] =
    "  --uri URI       connection string (default $GRIDFSCTL_URI, the config file, or "
    GFS_DEFAULT_URI ")\n"
    "  --db NAME       database (default: from the URI path, else " GFS_DEFAULT_DB ")\n"
    "  --bucket NAME   GridFS bucket prefix (default " GFS_DEFAULT_BUCKET ")\n"
    "  -q, --quiet     print only errors\n"
    "  --no-progress   never draw a progress bar\n"
    "  -h, --help      help for gridfsctl or for COMMAND\n"
    "  --version       print the version\n";

static void
print_usage(FILE *out)
{
	fprintf(out, "usage: %s [global options] COMMAND [options] [args]\n\ncommands:\n", progname);
	for (const struct command *c = commands; c->name; c++)
		fprintf(out, "  %-10s %s\n", c->name, c->summary);
	fprintf(out, "\nglobal options (before or after COMMAND):\n%s"
	             "\nRun '%s COMMAND --help' for a command's options; see gridfsctl(1).\n",
	        global_help, progname);
}

const struct command *
find_command(const char *name)
{
	for (const struct command *c = commands; c->name; c++)
		if (strcmp(c->name, name) == 0)
			return c;
	return NULL;
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
	const struct command *c = find_command(argv[i]);
	if (!c && strcmp(argv[i], "_names") != 0) {
		fprintf(stderr, "%s: unknown command '%s'; see '%s --help'\n", progname, argv[i], progname);
		return EXIT_USAGE;
	}
	cmdname = c ? c->name : NULL;
	if (load_settings() < 0)
		return EXIT_USAGE;
	mongoc_log_set_handler(driver_log, NULL);
	mongoc_init();
	int rc = c ? c->run(argc - i, argv + i) : run_completion_verb(argc - i, argv + i);
	mongoc_cleanup();
	return close_stdout(rc);
}
