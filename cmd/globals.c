/* The settings every subcommand shares (struct globals) and the rows of the global options. */
#include "cmd.h"

struct globals G;

const struct cmd_opt global_opts[] = {
	CMD_OPT(0, "uri", "URI", "connection string (default $GRIDFSCTL_URI, the config file, or "
	        GFS_DEFAULT_URI ")", .id = OPT_URI),
	CMD_OPT(0, "db", "NAME", "database (default: from the URI path, else " GFS_DEFAULT_DB ")",
	        .id = OPT_DB),
	CMD_OPT(0, "bucket", "NAME", "GridFS bucket: the NAME.files and NAME.chunks collections, "
	        "mongofiles' --prefix (default " GFS_DEFAULT_BUCKET ")", .id = OPT_BUCKET),
	CMD_OPT('q', "quiet", NULL, "print only errors", .id = OPT_QUIET),
	CMD_OPT(0, "no-progress", NULL, "never draw a progress bar", .id = OPT_NO_PROGRESS),
	CMD_OPT(0, "progress", NULL, "draw the progress bar even when stderr is not a terminal "
	        "(under | tee)", .id = OPT_PROGRESS),
	CMD_OPT(0, "stats", "SECONDS", "instead of a bar, one progress line every SECONDS (a duration: "
	        "30s, 5m) on stderr, for logs", .id = OPT_STATS),
	CMD_OPT('h', "help", NULL, "help for gridfsctl or for COMMAND", .id = OPT_HELP),
	CMD_OPT_END,
};

const struct cmd_opt leading_opts[] = {
	CMD_OPT_GROUP(global_opts),
	CMD_OPT(0, "version", NULL, "print the version", .id = OPT_VERSION),
	CMD_OPT_END,
};
