/* gridfsctl rm: remove files, every revision of each name, a folder, or one by id. */
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "../lib/maxdelete.h"
#include "../lib/filename.h"
#include "../lib/select.h"

enum { OPT_ID = 1, OPT_JSON, OPT_MAXDEL };

struct rm_opts {
	const char *id, *prefix;
	gfs_max_delete max_delete;
	bool force, json, dry_run, verbose, recursive;
};

#define TO(field) CMD_TO(struct rm_opts, field)

static const struct cmd_opt rm_opts[] = {
	CMD_OPT(0, "id", "ID", "remove the file with this _id (one revision): " ID_SYNTAX, .id = OPT_ID,
	        .kind = CMD_STRING, .to = TO(id)),
	CMD_OPT('r', "recursive", NULL, "each operand is a folder: remove every file under it",
	        .kind = CMD_SET, .to = TO(recursive)),
	PREFIX_OPT("remove every file under the folder P (as -r P)", .kind = CMD_STRING,
	           .to = TO(prefix)),
	CMD_OPT(0, "max-delete", "N", "remove nothing (exit 7) when more than N files would go",
	        .id = OPT_MAXDEL),
	CMD_OPT('f', "force", NULL, "a missing name is not an error", .kind = CMD_SET, .to = TO(force)),
	CMD_OPT('n', "dry-run", NULL, "say what would be removed; remove nothing", .kind = CMD_SET,
	        .to = TO(dry_run)),
	CMD_OPT('v', "verbose", NULL, "print each revision removed", .kind = CMD_SET,
	        .to = TO(verbose)),
	CMD_OPT(0, "json", NULL, "print one JSON object per name: {filename, deleted}", .id = OPT_JSON,
	        .kind = CMD_SET, .to = TO(json)),
	CMD_OPT_END,
};

/* The one row that is rm's own: --max-delete, a count only. */
static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct rm_opts *o = ctx;
	if (opt != OPT_MAXDEL || max_delete_option(arg, &o->max_delete) < 0)
		return -1;
	if (!o->max_delete.percent)
		return 0;
	usage_error("rm --max-delete takes a count of files, not a percentage");
	return -1;
}

/*
 * What one operand selects: a name, a folder or an id, and the revisions
 * it found, revs.v[first..end) of the run's one list.
 */
struct target {
	const char *what;
	enum { T_NAME, T_FOLDER, T_ID } kind;
	size_t first, end;
	int rc;   /* of its lookup or removal */
};

/*
 * --json: one object per stored name; "error" repeats the message when it
 * failed. A dry run removes nothing: the same line, marked "dryRun",
 * counts and lists ("ids") what would go. A target that found nothing is
 * one line too: "filename" for a name, "prefix" for a folder, "id".
 */
static void
report(const struct rm_opts *o, const struct target *t, const char *name, const gfs_rev *v,
       size_t n, int rc)
{
	if (!o->json)
		return;
	bson_t doc, ids = BSON_INITIALIZER;
	json_event(&doc, "delete");
	if (t->kind == T_ID)
		BSON_APPEND_UTF8(&doc, "id", t->what);
	else if (n > 0 || t->kind == T_NAME)
		json_filename(&doc, name);
	else
		BSON_APPEND_UTF8(&doc, "prefix", t->what);
	BSON_APPEND_INT64(&doc, "deleted", rc == EXIT_OK ? (int64_t)n : 0);
	if (o->dry_run) {
		BSON_APPEND_BOOL(&doc, "dryRun", true);
		for (size_t i = 0; i < n; i++) {
			char *id = gfs_id_string(&v[i].id), key[24];
			snprintf(key, sizeof key, "%zu", i);
			BSON_APPEND_UTF8(&ids, key, id);
			free(id);
		}
		BSON_APPEND_ARRAY(&doc, "ids", &ids);
	}
	if (rc != EXIT_OK)
		BSON_APPEND_UTF8(&doc, "error", last_message());
	print_json(stdout, &doc);
	bson_destroy(&doc);
	bson_destroy(&ids);
}

/* The human lines of revisions removed (-v) or that would be (--dry-run). */
static void
say(const struct rm_opts *o, const gfs_rev *v, size_t n)
{
	if (o->json || !(o->verbose || o->dry_run))
		return;
	for (size_t i = 0; i < n; i++) {
		char *id = gfs_id_string(&v[i].id);
		const char *name = v[i].filename ? v[i].filename : "";
		if (o->dry_run)
			action_line(stdout, true, "would delete %s (id %s, %lld bytes)", name, id,
			            (long long)v[i].length);
		else if (o->id)
			human_line(stdout, "deleted id %s", id);
		else
			human_line(stdout, "deleted %s (id %s)", name, id);
		free(id);
	}
}

/* Reports t: one line per stored name among its revisions (they come sorted by name). */
static void
report_target(const struct rm_opts *o, const struct target *t, const gfs_revs *revs)
{
	if (t->first == t->end) {
		report(o, t, t->what, NULL, 0, t->rc);
		return;
	}
	say(o, revs->v + t->first, t->end - t->first);
	for (size_t i = t->first, j; i < t->end; i = j) {
		const char *name = revs->v[i].filename;
		for (j = i + 1; j < t->end; j++) {
			const char *next = revs->v[j].filename;
			if (!name != !next || (name && strcmp(name, next) != 0))
				break;
		}
		report(o, t, name ? name : "", revs->v + i, j - i, t->rc);
	}
}

/* Finds what t selects, appended to revs: one query (by name, folder range or id). */
static int
find_target(gfs_session *s, const struct rm_opts *o, struct target *t, gfs_revs *revs)
{
	gfs_error err;
	bson_t filter = BSON_INITIALIZER;
	bson_value_t id = {0};
	if (t->kind == T_ID && !parse_id_option(t->what, &id))
		return EXIT_USAGE;
	char *folder = t->kind == T_FOLDER ? gfs_prefix_normalize(t->what) : NULL;
	if (t->kind == T_ID)
		gfs_id_filter(&filter, "_id", &id);
	else if (t->kind == T_FOLDER)
		gfs_prefix_filter(&filter, folder);
	else
		BSON_APPEND_UTF8(&filter, "filename", t->what);
	t->first = revs->n;
	bool ok = gfs_revs_find(s, &filter, revs, &err);
	t->end = revs->n;
	bson_destroy(&filter);
	bson_value_destroy(&id);
	int rc = EXIT_OK;
	if (!ok)
		rc = fail(&err);
	else if (t->first == t->end && !o->force) {
		if (t->kind == T_ID)
			gfs_error_set(&err, GFS_ENOTFOUND, "id %s: no such file", t->what);
		else if (t->kind == T_FOLDER)
			gfs_error_set(&err, GFS_ENOTFOUND, "%s: nothing stored under it", folder);
		else
			gfs_error_set(&err, GFS_ENOTFOUND, "%s: no such file", t->what);
		rc = fail(&err);
	}
	free(folder);
	return rc;
}

/*
 * Removes revs in batches (gfs_delete_many: a deletion marker, then one
 * equality statement per id in ordered bulk writes), checking for a stop
 * between them. Each name's revisions come oldest first, so until its
 * last batch a reader still gets its newest. *done: how many were removed
 * (or found gone).
 */
#define RM_BATCH 500

static int
remove_revs(gfs_session *s, const gfs_revs *revs, size_t *done)
{
	bson_value_t *ids = gfs_xcalloc(RM_BATCH, sizeof *ids);
	int rc = EXIT_OK;
	for (*done = 0; rc == EXIT_OK && *done < revs->n;) {
		if (stop_signal) {
			warnx_("interrupted");
			rc = EXIT_INTERRUPTED;
			break;
		}
		size_t k = revs->n - *done < RM_BATCH ? revs->n - *done : RM_BATCH;
		for (size_t i = 0; i < k; i++)
			ids[i] = revs->v[*done + i].id; /* shallow: revs keeps them */
		gfs_error err;
		if (!gfs_delete_many(s, ids, k, NULL, NULL, &err))
			rc = fail(&err);
		else
			*done += k;
	}
	free(ids);
	return rc;
}

/* One operand's status; several: 1 when only some failed (cmd/util.c: tally). */
static int
overall(const struct target *t, size_t n)
{
	struct tally all = {0};
	for (size_t i = 0; i < n; i++)
		tally_add(&all, t[i].rc);
	return tally_status(&all);
}

static int
run_rm(gfs_session *s, const struct rm_opts *o, struct target *t, size_t nt)
{
	gfs_revs revs = {0};
	size_t looked = 0;
	for (; looked < nt; looked++) {
		t[looked].rc = find_target(s, o, &t[looked], &revs);
		if (t[looked].rc == EXIT_BACKEND || t[looked].rc == EXIT_USAGE)
			break;
	}
	int rc = EXIT_OK;
	gfs_error err;
	if (looked < nt) {
		looked++;
	} else if (!gfs_max_delete_check(&o->max_delete, revs.n, revs.n, "rm", &err)) {
		rc = fail(&err);
	} else if (!o->dry_run) {
		size_t done;
		rc = remove_revs(s, &revs, &done);
		/* What a failed or stopped batch held is reported as not removed. */
		for (size_t i = 0; i < nt; i++)
			if (rc != EXIT_OK && t[i].end > done && t[i].rc == EXIT_OK)
				t[i].rc = rc;
	}
	for (size_t i = 0; i < looked; i++) {
		if (rc == EXIT_LIMIT && t[i].rc == EXIT_OK)
			t[i].rc = rc;
		report_target(o, &t[i], &revs);
	}
	gfs_revs_free(&revs);
	return rc == EXIT_LIMIT ? rc : overall(t, looked);
}

static int
cmd_rm(int argc, char **argv)
{
	struct rm_opts o = {0};
	int i = parse_options(argc, argv, &cmd_rm_entry, on_opt, &o);
	if (i < 0)
		return EXIT_USAGE;
	size_t nt = (size_t)(argc - i) + (o.prefix != NULL) + (o.id != NULL);
	if (o.id ? nt != 1 : nt < 1) {
		usage_error(o.id ? "give NAMEs or --id, not both" : "a NAME, --prefix P or --id is required");
		return EXIT_USAGE;
	}
	struct target *t = gfs_xcalloc(nt, sizeof *t);
	size_t n = 0;
	if (o.id)
		t[n++] = (struct target){.what = o.id, .kind = T_ID};
	if (o.prefix)
		t[n++] = (struct target){.what = o.prefix, .kind = T_FOLDER};
	for (; i < argc; i++)
		t[n++] = (struct target){.what = argv[i], .kind = o.recursive ? T_FOLDER : T_NAME};
	int rc = EXIT_USAGE;
	gfs_conn *conn = connect_for_writes();
	if (conn) {
		gfs_session *s = gfs_session_pop(conn);
		catch_interrupts(0, NULL);
		/* A removal an rm killed midway left is finished first, as put does. */
		rc = o.dry_run ? EXIT_OK : recover_interrupted(s, NULL);
		if (rc != EXIT_OK)
			report(&o, &t[0], t[0].what, NULL, 0, rc); /* the first line carries the error */
		else
			rc = run_rm(s, &o, t, nt);
		gfs_session_push(s);
		gfs_conn_close(conn);
	}
	free(t);
	return rc;
}

static const struct cmd_exit rm_exits[] = {
	{0, "ok"}, {1, "some of several names failed"}, {2, "usage"}, {3, "backend"},
	{4, "no such name or id, or nothing under the folder"},
	{7, "--max-delete: more would have been removed; nothing was"}, {130, "interrupted"},
	{-1, NULL},
};

const struct cmd_entry cmd_rm_entry = {
	.name = "rm",
	.summary = "remove files (all revisions of a name, or of a folder)",
	.operands = "NAME...|--id ID",
	.opts = rm_opts,
	.exits = rm_exits,
	.run = cmd_rm,
};
