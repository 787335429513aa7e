/* gridfsctl import: bulk-load a directory tree (the work is in lib/import.c). */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/import.h"
#include "../lib/filename.h"
#include "../lib/safepath.h"
#include "cmd.h"

enum { OPT_DELETE = 1, OPT_ALLOW_EMPTY, OPT_UNSAFE, OPT_BATCH, OPT_CHUNK, OPT_JSON, OPT_MAX_DELETE };

struct import_cli {
	gfs_import_opts o;
	struct tree_select sel;
	bool verbose, json, allow_unsafe;
	struct progress *progress;
	char *first_failure;   /* the first file's error line, for the JSON summary */
};

#define TO(field) CMD_TO(struct import_cli, field)

static const struct cmd_opt import_opts[] = {
	CMD_OPT_GROUP(tree_opts),
	CMD_OPT('L', "follow-symlinks", NULL, "follow symlinks (loops are detected and reported)",
	        .kind = CMD_SET, .to = TO(o.walk.follow_symlinks)),
	CMD_OPT('c', "checksum", NULL, "compare sha256 instead of size and mtime to find changes",
	        .kind = CMD_SET, .to = TO(o.checksum)),
	CMD_OPT('k', "keep-revisions", "N", "keep the N newest revisions of a changed name "
	        "(default 1; 0 keeps every revision)", .kind = CMD_COUNT, .to = TO(o.keep_revisions),
	        .max = 1000000, .bad = "--keep-revisions takes a count, not '%s'"),
	CMD_OPT(0, "allow-unsafe-name", NULL, "take a --prefix that mirror and get would refuse as a "
	        "path", .id = OPT_UNSAFE, .kind = CMD_SET, .to = TO(allow_unsafe)),
	CMD_OPT(0, "delete", NULL, "remove stored files under the prefix that are gone from DIR",
	        .id = OPT_DELETE, .kind = CMD_SET, .to = TO(o.delete_missing)),
	CMD_OPT(0, "allow-empty", NULL, "let --delete remove everything when DIR has no file to import",
	        .id = OPT_ALLOW_EMPTY, .kind = CMD_SET, .to = TO(o.allow_empty)),
	CMD_OPT(0, "max-delete", "N|P%", "let --delete remove at most N files (P% of those stored "
	        "under the prefix); above that delete nothing and exit 7", .id = OPT_MAX_DELETE),
	CMD_OPT('n', "dry-run", NULL, "print what would be done; change nothing",
	        .kind = CMD_SET, .to = TO(o.dry_run)),
	CMD_OPT('j', "jobs", "N", "worker threads and connections (default 4)", .kind = CMD_COUNT,
	        .to = TO(o.jobs), .min = 1, .max = 64,
	        .bad = "--jobs takes a number from 1 to 64, not '%s'"),
	CMD_OPT(0, "batch-size", "SIZE", "chunk data per bulk insert (default 8M)", .id = OPT_BATCH,
	        .kind = CMD_BYTES, .to = TO(o.batch_bytes), .min = 64 * 1024, .max = 256u << 20,
	        .bad = "--batch-size takes a size from 64K to 256M, not '%s'"),
	CMD_OPT(0, "chunk-size", "SIZE", "chunk size of new files (default 255K)", .id = OPT_CHUNK,
	        .kind = CMD_BYTES, .to = TO(o.chunk_size), .min = 1, .max = 15u << 20,
	        .bad = "--chunk-size takes a size from 1 byte to 15M, not '%s'"),
	CMD_OPT('v', "verbose", NULL, "print each stored and deleted file",
	        .kind = CMD_SET, .to = TO(verbose)),
	CMD_OPT(0, "json", NULL, "print a summary object (and, with -v or -n, one per file)",
	        .id = OPT_JSON, .kind = CMD_SET, .to = TO(json)),
	CMD_OPT_END,
};

/* The rows of the tree selection, and --max-delete. */
static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct import_cli *c = ctx;
	if (opt == OPT_MAX_DELETE)
		return max_delete_option(arg, &c->o.max_delete);
	return tree_option(opt, arg, &c->sel) == 0 ? 0 : -1;
}

/* The path as the user would type it, with bytes that are not UTF-8 written as %XX. */
static char *
display_path(const char *dir, const char *rel)
{
	bool escaped;
	char *d = gfs_name_from_bytes(dir, strlen(dir), &escaped);
	if (!rel) {
		return d;
	}
	char *r = gfs_name_from_bytes(rel, strlen(rel), &escaped);
	size_t dl = strlen(d);
	char *out = gfs_xmalloc(dl + strlen(r) + 2);
	sprintf(out, "%s%s%s", d, dl && d[dl - 1] == '/' ? "" : "/", r);
	free(d);
	free(r);
	return out;
}

static const char *
action_name(enum gfs_import_event_kind kind)
{
	switch (kind) {
	case GFS_IMPORT_UPLOADED: return "upload";
	case GFS_IMPORT_REPLACED: return "replace";
	case GFS_IMPORT_DELETED: return "delete";
	default: return NULL;
	}
}

static void
print_action(struct import_cli *c, const gfs_import_event *ev)
{
	const char *action = action_name(ev->kind);
	if (!action || !(ev->dry_run || c->verbose))
		return;
	if (c->json) {
		bson_t doc;
		json_event(&doc, action);
		json_filename(&doc, ev->name);
		if (ev->dry_run)
			BSON_APPEND_BOOL(&doc, "dryRun", true);
		print_json(stdout, &doc);
		bson_destroy(&doc);
		return;
	}
	static const char *done[] = {"uploaded", "replaced", NULL, "deleted"};
	if (ev->dry_run)
		action_line(stdout, true, "would %s %s", action, ev->name);
	else
		human_line(stdout, "%s %s", done[ev->kind], ev->name);
}

/* Called by the library from its threads, one call at a time. */
static void
on_event(const gfs_import_event *ev, void *ctx)
{
	struct import_cli *c = ctx;
	if (ev->kind == GFS_IMPORT_FAILED || (ev->kind == GFS_IMPORT_NOTICE && !G.quiet)) {
		if (c->progress)
			fputs("\r\033[K", stderr);
		if (ev->kind == GFS_IMPORT_NOTICE) {
			warnx_("%s", ev->reason);
		} else {
			char *p = ev->path ? display_path(c->o.dir, ev->path) : strdup(ev->name ? ev->name : "?");
			char shown[GFS_NAME_SHOWN_MAX];
			warnx_("%s: %s", shown_name(shown, p), ev->reason);
			if (!c->first_failure)
				c->first_failure = bson_strdup_printf("%s: %s", p, ev->reason);
			free(p);
		}
	}
	print_action(c, ev);
	if (c->progress) {
		progress_set_totals(c->progress, ev->stats->queued_files, ev->stats->queued_bytes);
		progress_update(c->progress, ev->stats->done_files, ev->stats->done_bytes);
	}
}

static void
print_summary(const struct import_cli *c, const gfs_import_stats *st, const gfs_error *err)
{
	struct json_summary sum;
	json_summary_begin(&sum, "import", c->o.dry_run);
	bson_t *doc = &sum.body;
	BSON_APPEND_INT64(doc, "scanned", (int64_t)st->scanned);
	BSON_APPEND_INT64(doc, "uploaded", (int64_t)st->uploaded);
	BSON_APPEND_INT64(doc, "skipped", (int64_t)st->skipped);
	BSON_APPEND_INT64(doc, "replaced", (int64_t)st->replaced);
	BSON_APPEND_INT64(doc, "deleted", (int64_t)st->deleted);
	BSON_APPEND_INT64(doc, "failed", (int64_t)st->failed);
	BSON_APPEND_INT64(doc, "bytes", (int64_t)st->bytes);
	BSON_APPEND_INT64(doc, "recovered", (int64_t)st->recovered);
	char *msg = NULL;
	if (err->code == GFS_OK && st->failed)
		msg = bson_strdup_printf("%llu file%s failed, the first: %s",
		                         (unsigned long long)st->failed, st->failed == 1 ? "" : "s",
		                         c->first_failure ? c->first_failure : "?");
	json_summary_end(stdout, &sum, st->seconds, err->code != GFS_OK ? err->msg : msg);
	bson_free(msg);
}

static gfs_import *running;

/* The first signal asks for a clean stop (cmd/interrupt.c); a second one kills. */
static void
on_interrupt(int sig)
{
	(void)sig;
	static const char msg[] =
	    "gridfsctl import: stopping after the files in flight (interrupt again to abort)\n";
	if (running)
		gfs_import_cancel(running);
	ssize_t r = write(STDERR_FILENO, msg, sizeof msg - 1);
	(void)r;
}

/* As mirror --delete does when the bucket has nothing: refuse, and say how to insist. */
static void
refused_delete(const struct import_cli *c, const gfs_import_stats *st, gfs_error *err)
{
	char *dir = display_path(c->o.dir, NULL);
	gfs_error_set(err, GFS_EINVAL,
	              "not deleting anything: %s has no file to import, and --delete would remove "
	              "all %llu stored name%s under the prefix (an unmounted file system looks like "
	              "this); --allow-empty to delete them", dir,
	              (unsigned long long)st->delete_refused, st->delete_refused == 1 ? "" : "s");
	free(dir);
}

static int
run(struct import_cli *c)
{
	gfs_conn *conn = connect_for_writes();
	if (!conn) {
		gfs_import_stats none = {0};
		gfs_error err;
		gfs_error_set(&err, GFS_EINVAL, "%s", last_message());
		if (c->json)
			print_summary(c, &none, &err);
		return EXIT_USAGE;
	}
	c->o.on_event = on_event;
	c->o.ctx = c;
	gfs_import *imp = gfs_import_new(conn, &c->o);
	c->progress = progress_start("import", 0, 0);
	running = imp;
	catch_interrupts(INTERRUPT_RESTART, on_interrupt);
	gfs_import_stats st;
	gfs_error err;
	bool ok = gfs_import_run(imp, &st, &err);
	release_interrupts();
	running = NULL;
	progress_done(c->progress);
	c->progress = NULL;
	int rc = ok ? (st.failed ? EXIT_PARTIAL : EXIT_OK) : exit_code_for(&err);
	if (ok && st.delete_refused) {
		refused_delete(c, &st, &err);
		rc = EXIT_PARTIAL;
	}
	if (err.code != GFS_OK)
		warnx_("%s", err.msg);
	if (c->json)
		print_summary(c, &st, &err);
	gfs_import_free(imp);
	gfs_conn_close(conn);
	bson_free(c->first_failure);
	return rc;
}

/*
 * Every name stored is the prefix and a path the walk found, whose segments
 * are safe: a prefix mirror would refuse makes every one of them refused.
 */
static bool
prefix_safe(const char *prefix)
{
	char *norm = gfs_prefix_normalize(prefix);
	size_t len = strlen(norm);
	gfs_error err;
	bool ok = len == 0 || gfs_safepath_check(norm, len - 1, &err);
	/* "/" alone normalizes to "": still an absolute name, as the user wrote it. */
	if (ok && len == 0 && prefix && *prefix) {
		gfs_error_set(&err, GFS_EINVAL, "absolute name");
		ok = false;
	}
	char shown[GFS_NAME_SHOWN_MAX];
	if (!ok)
		warnx_("--prefix %s: %s, so mirror and get would refuse every name under it; "
		       "--allow-unsafe-name to use it anyway", shown_name(shown, prefix), err.msg);
	free(norm);
	return ok;
}

static int
cmd_import(int argc, char **argv)
{
	struct import_cli c;
	memset(&c, 0, sizeof c);
	c.o.keep_revisions = 1;
	c.o.jobs = GFS_IMPORT_DEFAULT_JOBS;
	int first = parse_options(argc, argv, &cmd_import_entry, on_opt, &c);
	int rc = EXIT_USAGE;
	if (first < 0)
		goto out;
	c.o.prefix = c.sel.prefix;
	c.o.content_type = c.sel.content_type;
	tree_select_walk(&c.sel, &c.o.walk);
	if (argc - first != 1) {
		usage_error(argc - first < 1 ? "a directory is required" : "only one directory, please");
		goto out;
	}
	c.o.dir = argv[first];
	if (!max_delete_fits(&c.o.max_delete, c.o.delete_missing))
		goto out;
	/* Mostly for tests: a lease that runs out in seconds, not a minute. */
	const char *ttl = getenv("GRIDFSCTL_IMPORT_LOCK_TTL");
	long v;
	if (ttl && *ttl) {
		if (!parse_int(ttl, 3, 3600, &v)) {
			usage_error("GRIDFSCTL_IMPORT_LOCK_TTL takes seconds from 3 to 3600, not '%s'", ttl);
			goto out;
		}
		c.o.lock_ttl = (int)v;
	}
	if (c.o.prefix && !gfs_utf8_valid(c.o.prefix, strlen(c.o.prefix))) {
		usage_error("the prefix must be UTF-8");
		goto out;
	}
	if (!c.allow_unsafe && !prefix_safe(c.o.prefix))
		goto out;
	rc = run(&c);
out:
	free_tree_select(&c.sel);
	return rc;
}

static const struct cmd_exit import_exits[] = {
	{0, "ok"}, {1, "some files failed"}, {2, "usage"}, {3, "backend"}, {5, "DIR cannot be read"},
	{6, "another import holds the lock"}, {7, "--max-delete stopped the deletions"},
	{130, "interrupted"}, {-1, NULL},
};

const struct cmd_entry cmd_import_entry = {
	.name = "import",
	.summary = "bulk-load a directory tree",
	.operands = "DIR",
	.opts = import_opts,
	.exits = import_exits,
	.run = cmd_import,
};
