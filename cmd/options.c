/* The option layer shared by every subcommand, and the settings it fills in. */
#include <errno.h>
#include <ini.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd.h"
#include "../lib/names.h"

struct globals G;
const char *progname = "gridfsctl";
const char *cmdname = NULL;

enum { OPT_URI = 0x1000, OPT_DB, OPT_BUCKET, OPT_QUIET, OPT_NO_PROGRESS, OPT_PROGRESS, OPT_STATS,
       OPT_HELP, OPT_VERSION };

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
			else if (on_opt(cmd_opt_resolve(e->opts, opt), optarg, ctx) < 0)
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

/* ---- settings: environment and config file --------------------------- */

struct file_settings {
	char *uri, *db, *bucket;
	char why[300];      /* what is wrong with the first line inih was told is wrong */
};

/*
 * A misspelt key or section would be a setting silently not taken (a
 * bucket name ignored, so another bucket written): it is an error, named
 * with its line by ini_parse_file's return.
 */
static int
on_ini(void *user, const char *section, const char *name, const char *value)
{
	struct file_settings *fs = user;
	bool first = fs->why[0] == '\0';
	if (strcmp(section, "connection") != 0) {
		if (first)
			snprintf(fs->why, sizeof fs->why, "unknown section [%s] (there is only [connection])",
			         section);
		return 0;
	}
	char **slot = strcmp(name, "uri") == 0 ? &fs->uri
	            : strcmp(name, "db") == 0 ? &fs->db
	            : strcmp(name, "bucket") == 0 ? &fs->bucket : NULL;
	if (!slot) {
		if (first)
			snprintf(fs->why, sizeof fs->why, "unknown key '%s' in [connection] (uri, db, bucket)",
			         name);
		return 0;
	}
	free(*slot);
	*slot = strdup(value);
	return 1;
}

static char *
config_path(void)
{
	const char *p = getenv("GRIDFSCTL_CONFIG");
	if (p)
		return strdup(p);
	char buf[4096];
	const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
	if (xdg && *xdg)
		snprintf(buf, sizeof buf, "%s/gridfsctl/config", xdg);
	else if (home && *home)
		snprintf(buf, sizeof buf, "%s/.config/gridfsctl/config", home);
	else
		return NULL;
	return strdup(buf);
}

int
load_settings(void)
{
	const char *env_uri = getenv("GRIDFSCTL_URI");
	if (!G.uri && env_uri && *env_uri)
		G.uri = env_uri;
	const char *timeout = getenv("GRIDFSCTL_TIMEOUT");
	long secs;
	if (timeout && *timeout) {
		if (!parse_int(timeout, 1, 86400, &secs)) {
			usage_error("GRIDFSCTL_TIMEOUT takes seconds from 1 to 86400, not '%s'", timeout);
			return -1;
		}
		gfs_conn_set_timeout((int)secs * 1000);
	}

	char *path = config_path();
	struct file_settings fs = {0};
	FILE *f = path ? fopen(path, "r") : NULL;
	if (!f && path && getenv("GRIDFSCTL_CONFIG")) {
		warn_("%s", path);
		free(path);
		return -1;
	}
	if (f) {
		int line = ini_parse_file(f, on_ini, &fs);
		struct stat st;
		bool shared = fstat(fileno(f), &st) == 0 && (st.st_mode & 077);
		fclose(f);
		if (line != 0) {
			char *why = printable(fs.why, strlen(fs.why));
			fprintf(stderr, "%s: %s:%d: %s\n", progname, path, line,
			        line < 0 ? "cannot read" : *why ? why : "cannot parse");
			free(why);
			free(fs.uri);
			free(fs.db);
			free(fs.bucket);
			free(path);
			return -1;
		}
		if (fs.uri && shared && strchr(fs.uri, '@'))
			fprintf(stderr, "%s: warning: %s holds credentials but others can read it (chmod 600)\n",
			        progname, path);
	}
	free(path);
	if (!G.uri && fs.uri)
		G.uri = fs.uri;
	else
		free(fs.uri);
	if (!G.db && fs.db)
		G.db = fs.db;
	else
		free(fs.db);
	if (!G.bucket && fs.bucket)
		G.bucket = fs.bucket;
	else
		free(fs.bucket);
	if (!G.uri)
		G.uri = GFS_DEFAULT_URI;
	return 0;
}

/* ---- messages and exit codes ----------------------------------------- */

static char last_msg[1024];

const char *
last_message(void)
{
	return last_msg;
}

/* Messages name stored files and local paths: escaped like every human line. */
static void
vmessage(const char *fmt, va_list ap, const char *suffix)
{
	char *msg = bson_strdupv_printf(fmt, ap);
	char *safe = printable(msg, strlen(msg));
	flockfile(stderr);
	char *kept = suffix ? bson_strdup_printf("%s: %s", msg, suffix) : NULL;
	gfs_shorten(last_msg, sizeof last_msg, kept ? kept : msg, strlen(kept ? kept : msg));
	bson_free(kept);
	if (cmdname)
		fprintf(stderr, "%s %s: ", progname, cmdname);
	else
		fprintf(stderr, "%s: ", progname);
	fputs(safe, stderr);
	if (suffix)
		fprintf(stderr, ": %s", suffix);
	fputc('\n', stderr);
	funlockfile(stderr);
	free(safe);
	bson_free(msg);
}

void
warnx_(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmessage(fmt, ap, NULL);
	va_end(ap);
}

void
warn_(const char *fmt, ...)
{
	const char *e = strerror(errno);
	va_list ap;
	va_start(ap, fmt);
	vmessage(fmt, ap, e);
	va_end(ap);
}

void
usage_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmessage(fmt, ap, NULL);
	va_end(ap);
	if (cmdname)
		fprintf(stderr, "see '%s %s --help'\n", progname, cmdname);
}

int
exit_code_for(const gfs_error *err)
{
	switch (err->code) {
	case GFS_OK: return EXIT_OK;
	case GFS_ENOTFOUND:
	case GFS_ENOREVISION: return EXIT_NOTFOUND;
	case GFS_EBACKEND: return EXIT_BACKEND;
	case GFS_ELOCAL:
	case GFS_EEXISTS: return EXIT_LOCAL;
	case GFS_EINVAL: return EXIT_USAGE;
	case GFS_EBUSY: return EXIT_BUSY;
	case GFS_ECANCELED: return EXIT_INTERRUPTED;
	case GFS_ELIMIT: return EXIT_LIMIT;
	default: return EXIT_PARTIAL;
	}
}

int
fail(const gfs_error *err)
{
	warnx_("%s", err->msg);
	return exit_code_for(err);
}

gfs_conn *
connect_or_warn(void)
{
	gfs_error err;
	gfs_conn *conn = gfs_conn_open(G.uri, G.db, G.bucket, &err);
	if (!conn) {
		warnx_("%s", err.msg);
		return NULL;
	}
	return conn;
}

gfs_conn *
connect_for_writes(void)
{
	gfs_conn *conn = connect_or_warn();
	if (conn)
		gfs_conn_read_primary(conn);
	return conn;
}

/* text as valid UTF-8 without NUL: any other byte is written as %XX, as names are stored. */
static char *
utf8_or_escaped(const char *text, size_t len)
{
	bool escaped;
	return gfs_name_from_bytes(text, len, &escaped);
}

static void sanitize_value(bson_iter_t *it, const char *key, bson_t *out);

/* Copies the elements under it into out, keys and strings made valid. */
static void
sanitize_elements(bson_iter_t *it, bson_t *out)
{
	while (bson_iter_next(it)) {
		char *k = utf8_or_escaped(bson_iter_key(it), bson_iter_key_len(it));
		sanitize_value(it, k, out);
		free(k);
	}
}

static void
sanitize_value(bson_iter_t *it, const char *key, bson_t *out)
{
	bson_iter_t sub;
	bson_t child;
	uint32_t len;
	switch (bson_iter_type(it)) {
	case BSON_TYPE_UTF8: {
		const char *v = bson_iter_utf8(it, &len);
		char *clean = utf8_or_escaped(v, len);
		BSON_APPEND_UTF8(out, key, clean);
		free(clean);
		return;
	}
	case BSON_TYPE_DOCUMENT:
		if (!bson_iter_recurse(it, &sub))
			return;
		BSON_APPEND_DOCUMENT_BEGIN(out, key, &child);
		sanitize_elements(&sub, &child);
		bson_append_document_end(out, &child);
		return;
	case BSON_TYPE_ARRAY:
		if (!bson_iter_recurse(it, &sub))
			return;
		BSON_APPEND_ARRAY_BEGIN(out, key, &child);
		sanitize_elements(&sub, &child);
		bson_append_array_end(out, &child);
		return;
	default:
		BSON_APPEND_VALUE(out, key, bson_iter_value(it));
		return;
	}
}

/*
 * File names and paths need not be UTF-8 (another client may have stored
 * raw bytes, and put --json prints the local path), but libbson gives up on
 * a whole document with one bad string. Escape such bytes first.
 */
static void
sanitize_doc(const bson_t *in, bson_t *out)
{
	bson_iter_t it;
	if (bson_iter_init(&it, in))
		sanitize_elements(&it, out);
}

void
print_json(FILE *out, const bson_t *doc)
{
	bson_t clean = BSON_INITIALIZER;
	sanitize_doc(doc, &clean);
	if (!json_write(out, &clean))
		warnx_("a document could not be written as JSON");
	bson_destroy(&clean);
}

bool
parse_int(const char *s, long min, long max, long *out)
{
	return gfs_parse_long(s, min, max, out);
}

bool
parse_size(const char *s, uint64_t *out)
{
	return gfs_parse_size(s, out);
}
