/* gridfsctl: entry point and the table of subcommands. */
#include <locale.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"

const struct command commands[] = {
	{"ls", "ls [PREFIX] [-l [-h]] [-a] [--json]", "list files in the bucket", ls_help, cmd_ls, ls_options,
	 "0 ok, 2 usage, 3 backend, 5 standard output could not be written"},
	{"get", "get NAME|--id OID [-r N] [-o FILE|-] [-f]", "write a stored file to disk or stdout", get_help, cmd_get, get_options,
	 "0 ok, 1 the stored file is damaged, 2 usage, 3 backend, 4 no such name, id or revision, "
	 "5 the output exists or cannot be written, 130 interrupted"},
	{"put", "put FILE|- [-n NAME] [-t MIME] [-k N] [--chunk-size SIZE] [--json]", "store a file, replacing older revisions when complete", put_help, cmd_put, put_options,
	 "0 ok, 1 stored but older revisions not removed, 2 usage, 3 backend, "
	 "5 FILE cannot be read or changed while read, 130 interrupted"},
	{"rm", "rm NAME...|--id OID [-f] [-n] [-v] [--json]", "remove files (all revisions of a name)", rm_help, cmd_rm, rm_options,
	 "0 ok, 1 some of several names failed, 2 usage, 3 backend, 4 no such name or id, 130 interrupted"},
	{"stat", "stat NAME|--id OID [-r N] [--json]", "show one file's document", stat_help, cmd_stat, stat_options,
	 "0 ok, 2 usage, 3 backend, 4 no such name, id or revision"},
	{"import", "import DIR [-p P] [--delete] [-n] [-j N] [-v] [--json] [options]", "bulk-load a directory tree", import_help, cmd_import, import_options,
	 "0 ok, 1 some files failed, 2 usage, 3 backend, 5 DIR cannot be read, "
	 "6 another import holds the lock, 7 --max-delete stopped the deletions, 130 interrupted"},
	{"verify", "verify [-p P] [--against DIR] [--repair [-n]] [--json] [options]", "check stored files for damage", verify_help, cmd_verify, verify_options,
	 "0 no problem (or all repaired), 1 problems found, 2 usage, 3 backend, "
	 "5 DIR or the --combined file I/O, 6 --repair while an import runs, 130 interrupted"},
	{"mirror", "mirror DIR [-p P] [--delete] [-n] [-j N] [--json] [options]", "write the bucket back to a disk tree", mirror_help, cmd_mirror, mirror_options,
	 "0 ok, 1 some files failed, 2 usage, 3 backend, 5 DIR cannot be created or opened, "
	 "6 another mirror writes into DIR, 7 --max-delete stopped the run, 130 interrupted"},
	{"watch", "watch DIR [-p P] [--delete] [--json] [options]", "keep the bucket in sync with a directory", watch_help, cmd_watch, watch_options,
	 "0 stopped by SIGTERM, 1 some changes failed or were left waiting, 2 usage, "
	 "3 backend unreachable at start or in the first pass, 5 DIR cannot be watched or went away, "
	 "7 --max-delete stopped it, 130 stopped by SIGINT"},
	{"serve", "serve [--listen ADDR:PORT] [--prefix P] [options]", "serve files over HTTP", serve_help, cmd_serve, serve_options,
	 "0 stopped by SIGTERM, 2 usage, 5 cannot listen or open the access log, 130 stopped by SIGINT"},
	{"supervise", "supervise -c FILE | [options] -- CMD ARGS... | status [--json]|restart NAME|reload|stop", "keep backends and servers running, watching their descriptors", supervise_help, cmd_supervise, supervise_options,
	 "0 stopped (any signal or stop), request done, or status all healthy; "
	 "1 status: some instance unhealthy; 2 usage or configuration; 3 no supervisor answers; "
	 "4 no such program; 5 the control socket cannot be made; 6 another supervisor runs"},
	{"doctor", "doctor [--sample N] [--json]", "check the backend, the bucket's indexes, the import lock and orphan chunks", doctor_help, cmd_doctor, doctor_options,
	 "0 healthy, 1 problems found, 2 usage, 3 backend unreachable or a command failed"},
	{NULL, NULL, NULL, NULL, NULL, NULL, NULL},
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
