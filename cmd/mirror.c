/*
 * gridfsctl mirror: write the newest revision of every file under a prefix
 * back to a directory tree, incrementally and atomically, never outside it.
 */
#include <stdlib.h>
#include <string.h>

#include "../lib/mirror/mirror.h"
#include "cmd.h"

enum { OPT_DELETE = 0x100, OPT_NO_FSYNC, OPT_JSON, OPT_READ, OPT_ALLOW_EMPTY, OPT_MAX_DELETE,
       OPT_BACKUP_DIR, OPT_HOLD, OPT_SIZE_ONLY, OPT_IGNORE_EXISTING };

#define DEFAULT_JOBS 4
#define MAX_JOBS 64

struct mirror {
	gfs_mirror_run_opts o;
	bool verbose, json, no_fsync;
	struct name_filter filter;
	struct progress *progress;
	char *error;            /* the first problem reported, for the JSON summary */
};

#define TO(field) CMD_TO(struct mirror, field)
/* --jobs' message names the bound. */
_Static_assert(MAX_JOBS == 64, "mirror's --jobs row names MAX_JOBS");

static const struct cmd_opt mirror_opts[] = {
	PREFIX_OPT("mirror the files under folder P (DIR/x for P/x)", .kind = CMD_STRING,
	           .to = TO(o.prefix)),
	CMD_OPT_GROUP(filter_opts),
	CMD_OPT(0, "delete", NULL, "remove local files the bucket does not have (never after an error; "
	        "never files the filters leave out)",
	        .id = OPT_DELETE, .kind = CMD_SET, .to = TO(o.delete_missing)),
	CMD_OPT(0, "allow-empty", NULL, "let --delete empty DIR when nothing is stored under the prefix",
	        .id = OPT_ALLOW_EMPTY, .kind = CMD_SET, .to = TO(o.allow_empty)),
	CMD_OPT(0, "max-delete", "N|P%", "let --delete remove at most N files (P% of the files in DIR); "
	        "above that change nothing and exit 7", .id = OPT_MAX_DELETE),
	CMD_OPT(0, "backup-dir", "DIR", "move what --delete or an overwrite would destroy there (same "
	        "relative path; not inside the mirrored DIR)", .id = OPT_BACKUP_DIR, .kind = CMD_STRING,
	        .to = TO(o.backup_dir)),
	CMD_OPT('n', "dry-run", NULL, "print what would be done, change nothing", .kind = CMD_SET,
	        .to = TO(o.dry_run)),
	CMD_OPT('v', "verbose", NULL, "print each file written, fixed or deleted", .kind = CMD_SET,
	        .to = TO(verbose)),
	CMD_OPT('j', "jobs", "N", "files read in parallel (default 4)", .kind = CMD_COUNT,
	        .to = TO(o.jobs), .min = 1, .max = MAX_JOBS, .bad = "--jobs needs a number from 1 to 64"),
	CMD_OPT('c', "checksum", NULL, "compare content by sha256, not size and mtime", .kind = CMD_SET,
	        .to = TO(o.checksum)),
	CMD_OPT(0, "size-only", NULL, "a local file of the stored size is up to date (mtime and mode "
	        "not compared)", .id = OPT_SIZE_ONLY, .kind = CMD_SET, .to = TO(o.size_only)),
	CMD_OPT(0, "ignore-existing", NULL, "leave every local file that exists as it is; write only "
	        "missing ones", .id = OPT_IGNORE_EXISTING, .kind = CMD_SET, .to = TO(o.ignore_existing)),
	CMD_OPT(0, "no-fsync", NULL, "do not fsync files and directories (faster, not crash-safe)",
	        .id = OPT_NO_FSYNC, .kind = CMD_SET, .to = TO(no_fsync)),
	CMD_OPT(0, "read", "MODE", "how chunks are read: auto (default: by what is to be written and "
	        "what the server serves from an index), each (a query per file, --jobs at once; "
	        "batched is the same) or scan (one pass over all chunks in natural order)",
	        .id = OPT_READ, .values = "auto each batched scan"),
	CMD_OPT(0, "hold", "SIZE", "scan: chunks kept while they wait for their turn (default 64M); "
	        "past it their files are read one by one", .id = OPT_HOLD),
	CMD_OPT(0, "json", NULL, "a JSON summary at the end; with --dry-run or -v, one object per action",
	        .id = OPT_JSON, .kind = CMD_SET, .to = TO(json)),
	CMD_OPT_END,
};

/* --max-delete, --read, --hold and the name filters. */
static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct mirror *m = ctx;
	switch (opt) {
	case OPT_MAX_DELETE: return max_delete_option(arg, &m->o.max_delete);
	case OPT_READ: return read_option("read", arg, &m->o.read);
	case OPT_HOLD: return hold_option(arg, &m->o.hold);
	}
	return filter_option(opt, arg, &m->filter) == 0 ? 0 : -1;
}

/* One error line; the first is kept for the summary, so that it says what went wrong. */
static void
report(struct mirror *m, const char *msg)
{
	if (!m->error)
		m->error = strdup(msg);
	if (G.progress && G.stats_s == 0)
		fputs("\r\033[K", stderr);
	warnx_("%s", msg);
}

static void
print_action(struct mirror *m, const gfs_mirror_event *ev)
{
	static const char *const actions[] = {
		[GFS_MIRROR_EV_WRITE] = "write", [GFS_MIRROR_EV_ATTRS] = "attrs",
		[GFS_MIRROR_EV_CLEAN] = "clean", [GFS_MIRROR_EV_DELETE] = "delete",
		[GFS_MIRROR_EV_RMDIR] = "rmdir",
	};
	const char *action = actions[ev->kind];
	if (!m->json) {
		action_line(stdout, ev->dry_run, "%s %.*s", action, (int)ev->rel_len, ev->rel);
		return;
	}
	bson_t doc;
	json_event(&doc, action);
	json_path(&doc, ev->rel, ev->rel_len);
	if (ev->name) {
		json_filename(&doc, ev->name);
		BSON_APPEND_INT64(&doc, "bytes", ev->bytes);
	}
	if (ev->dry_run)
		BSON_APPEND_BOOL(&doc, "dryRun", true);
	print_json(stdout, &doc);
	bson_destroy(&doc);
}

/* Called by the library from its threads, one call at a time. */
static void
on_event(const gfs_mirror_event *ev, void *ctx)
{
	struct mirror *m = ctx;
	const gfs_mirror_stats *st = ev->stats;
	char shown[GFS_NAME_SHOWN_MAX];
	switch (ev->kind) {
	case GFS_MIRROR_EV_PROBLEM:
		report(m, ev->msg);
		return;
	case GFS_MIRROR_EV_REFUSED: {
		char *msg = bson_strdup_printf("%s: refused: %s", shown_name(shown, ev->name), ev->msg);
		report(m, msg);
		bson_free(msg);
		return;
	}
	case GFS_MIRROR_EV_BEGIN:
		m->progress = progress_start("mirror", st->files, st->total_bytes);
		return;
	case GFS_MIRROR_EV_PROGRESS:
		progress_update(m->progress, st->done, st->done_bytes);
		return;
	case GFS_MIRROR_EV_END:
		progress_update(m->progress, st->done, st->done_bytes);
		progress_done(m->progress);
		m->progress = NULL;
		return;
	default:
		if (m->o.dry_run || m->verbose)
			print_action(m, ev);
	}
}

/* The counts, and with a failed run (rc not EXIT_OK) the first error as "error". */
static void
print_summary(struct mirror *m, const gfs_mirror_stats *st, int rc, double seconds)
{
	struct json_summary sum;
	json_summary_begin(&sum, "mirror", m->o.dry_run);
	bson_t *doc = &sum.body;
	BSON_APPEND_INT64(doc, "files", (int64_t)st->files);
	BSON_APPEND_INT64(doc, "written", (int64_t)st->written);
	BSON_APPEND_INT64(doc, "attrs", (int64_t)st->attrs);
	BSON_APPEND_INT64(doc, "skipped", (int64_t)st->skipped);
	BSON_APPEND_INT64(doc, "deleted", (int64_t)st->deleted);
	BSON_APPEND_INT64(doc, "removedDirs", (int64_t)st->rmdirs);
	BSON_APPEND_INT64(doc, "cleaned", (int64_t)st->cleaned);
	BSON_APPEND_INT64(doc, "failed", (int64_t)st->failed);
	BSON_APPEND_INT64(doc, "refused", (int64_t)st->refused);
	BSON_APPEND_INT64(doc, "bytes", (int64_t)st->bytes);
	if (m->o.backup_dir)
		BSON_APPEND_INT64(doc, "backedUp", (int64_t)st->backed_up);
	const char *error = NULL;
	if (rc != EXIT_OK)
		error = m->error ? m->error : "interrupted";
	json_summary_end(stdout, &sum, seconds, error);
}

static int
exit_status(const gfs_mirror_stats *st)
{
	if (st->interrupted)
		return EXIT_INTERRUPTED;
	if (st->backend_down)
		return EXIT_BACKEND;
	return st->failed || st->empty_refused ? EXIT_PARTIAL : EXIT_OK;
}

/* A planned path the name filters take (the path is a stored name's, below --prefix). */
static bool
filtered_in(const char *rel, size_t len, void *ctx)
{
	(void)len;
	return filter_selects(ctx, rel);
}

static int
mirror_run(struct mirror *m)
{
	double started = gfs_mono_seconds();
	gfs_conn *conn = connect_or_warn();
	if (!conn) {
		gfs_mirror_stats none = {0};
		m->error = strdup(last_message());
		if (m->json)
			print_summary(m, &none, EXIT_USAGE, gfs_mono_seconds() - started);
		free(m->error);
		return EXIT_USAGE;
	}
	/* What a mirror writes to disk must not be undone by a rollback. */
	gfs_conn_read_majority(conn);
	catch_interrupts(0, NULL);
	m->o.fsync = !m->no_fsync;
	m->o.stop = &stop_signal;
	m->o.on_event = on_event;
	m->o.ctx = m;
	if (filter_active(&m->filter)) {
		m->o.select = filtered_in;
		m->o.select_ctx = &m->filter;
	}
	gfs_mirror_stats st;
	gfs_error err;
	int rc = gfs_mirror_run(conn, &m->o, &st, &err) ? exit_status(&st) : exit_code_for(&err);
	if (m->json)
		print_summary(m, &st, rc, gfs_mono_seconds() - started);
	free(m->error);
	gfs_conn_close(conn);
	return rc;
}

/* The operands and the options that do not go together; false after a usage error. */
static bool
usable(struct mirror *m, int nargs, char **args)
{
	if (nargs != 1) {
		usage_error(nargs < 1 ? "missing DIR" : "too many arguments");
		return false;
	}
	m->o.dir = args[0];
	if (!max_delete_fits(&m->o.max_delete, m->o.delete_missing))
		return false;
	if (m->o.dir[0] == '\0') {
		usage_error("DIR must not be empty");
		return false;
	}
	if (m->o.size_only && m->o.checksum) {
		usage_error("--size-only and --checksum contradict each other");
		return false;
	}
	return true;
}

static int
cmd_mirror(int argc, char **argv)
{
	struct mirror m = {.o = {.jobs = DEFAULT_JOBS, .read = GFS_READ_AUTO}};
	int first = parse_options(argc, argv, &cmd_mirror_entry, on_opt, &m);
	int rc = EXIT_USAGE;
	if (first >= 0 && usable(&m, argc - first, argv + first))
		rc = mirror_run(&m);
	free_name_filter(&m.filter);
	return rc;
}

static const struct cmd_exit mirror_exits[] = {
	{0, "ok"}, {1, "some files failed"}, {2, "usage"}, {3, "backend"},
	{5, "DIR cannot be created or opened"}, {6, "another mirror writes into DIR"},
	{7, "--max-delete stopped the run"}, {130, "interrupted"}, {-1, NULL},
};

const struct cmd_entry cmd_mirror_entry = {
	.name = "mirror",
	.summary = "write the bucket back to a disk tree",
	.operands = "DIR",
	.opts = mirror_opts,
	.exits = mirror_exits,
	.run = cmd_mirror,
};
