/* gridfsctl rm: remove files, every revision of each name, or one by id. */
#include <stdlib.h>
#include <string.h>

#include "cmd.h"

enum { OPT_ID = 1, OPT_JSON };

static const struct cmd_opt rm_opts[] = {
	CMD_OPT(0, "id", "OID", "remove the file with this _id (one revision)", .id = OPT_ID),
	CMD_OPT('f', "force", NULL, "a missing name is not an error"),
	CMD_OPT('n', "dry-run", NULL, "say what would be removed; remove nothing"),
	CMD_OPT('v', "verbose", NULL, "print each revision removed"),
	CMD_OPT(0, "json", NULL, "print one JSON object per name: {name, removed}", .id = OPT_JSON),
	CMD_OPT_END,
};

struct rm_opts {
	const char *id;
	bool force, json, dry_run, verbose;
};

static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct rm_opts *o = ctx;
	switch (opt) {
	case OPT_ID: o->id = arg; return 0;
	case 'f': o->force = true; return 0;
	case 'n': o->dry_run = true; return 0;
	case 'v': o->verbose = true; return 0;
	case OPT_JSON: o->json = true; return 0;
	}
	return -1;
}

/*
 * --json: one object per name; when it failed, "error" repeats the message.
 * A dry run removes nothing: the same line, marked "dryRun", counts and lists ("ids") what would go.
 */
static void
report(const struct rm_opts *o, const char *what, int64_t removed, const bson_t *ids, int rc)
{
	if (!o->json)
		return;
	bson_t doc;
	json_event(&doc, "removed");
	if (o->id)
		BSON_APPEND_UTF8(&doc, "id", what);
	else
		json_filename(&doc, what);
	/* A dry run is the same line, marked: "removed" is what would be. */
	BSON_APPEND_INT64(&doc, "removed", removed);
	if (o->dry_run) {
		BSON_APPEND_BOOL(&doc, "dryRun", true);
		if (ids)
			BSON_APPEND_ARRAY(&doc, "ids", ids);
	}
	if (rc != EXIT_OK)
		BSON_APPEND_UTF8(&doc, "error", last_message());
	print_json(stdout, &doc);
	bson_destroy(&doc);
}

/* Deletes one revision; *gone keeps the id of one found already deleted. */
static int
rm_one(gfs_session *s, const struct rm_opts *o, const char *name, const bson_value_t *fid,
       char **gone, int64_t *removed)
{
	if (stop_signal) {
		warnx_("interrupted");
		return EXIT_INTERRUPTED;
	}
	char *id = gfs_id_string(fid);
	if (*gone && strcmp(*gone, id) == 0) {
		warnx_("%s: id %s is still listed after it was deleted", name, id);
		free(id);
		return EXIT_BACKEND;
	}
	gfs_error err;
	if (gfs_delete(s, fid, &err)) {
		(*removed)++;
		if (o->verbose && !o->json)
			human_line(stdout, "removed %s (id %s)", name, id);
		free(id);
		return EXIT_OK;
	}
	if (err.code != GFS_ENOTFOUND) {
		free(id);
		return fail(&err);
	}
	free(*gone);
	*gone = id;
	return EXIT_OK;
}

/*
 * Removes every revision, oldest first, so the newest stays what readers get
 * until it is the last one left. Revisions are found by id alone, so that a
 * malformed files document (one verify calls BAD-DOC) goes too. A revision
 * another process removed first is not counted. find returning the very id
 * that delete just found gone would loop forever, so that is a backend error.
 */
static int
rm_name(gfs_session *s, const struct rm_opts *o, const char *name)
{
	int64_t removed = 0;
	char *gone = NULL;
	gfs_error err;
	bson_value_t id;
	int rc = EXIT_OK;
	while (rc == EXIT_OK && gfs_find_first_id(s, name, &id, &err)) {
		rc = rm_one(s, o, name, &id, &gone, &removed);
		bson_value_destroy(&id);
	}
	free(gone);
	if (rc == EXIT_OK && err.code != GFS_ENOTFOUND)
		rc = fail(&err);
	else if (rc == EXIT_OK && removed == 0 && !o->force)
		rc = fail(&err);
	report(o, name, removed, NULL, rc);
	return rc;
}

static int
rm_id(gfs_session *s, const struct rm_opts *o)
{
	bson_value_t id;
	if (!gfs_id_parse_oid(o->id, &id)) {
		usage_error("'%s' is not an ObjectId (24 hex digits)", o->id);
		return EXIT_USAGE;
	}
	gfs_error err;
	bool ok = gfs_delete(s, &id, &err);
	if (ok && o->verbose && !o->json)
		human_line(stdout, "removed id %s", o->id);
	int rc = ok || (err.code == GFS_ENOTFOUND && o->force) ? EXIT_OK : fail(&err);
	report(o, o->id, ok ? 1 : 0, NULL, rc);
	return rc;
}

/*
 * What rm would find, by the same queries: every files document of name
 * (or the one with id), malformed ones too, oldest first. Said one line
 * per revision, or listed in the JSON object. Returns the exit code rm
 * would give, or that of the query.
 */
static int
dry_run(gfs_session *s, const struct rm_opts *o, const char *name)
{
	bson_t filter = BSON_INITIALIZER, ids = BSON_INITIALIZER;
	bson_value_t oid;
	if (o->id && !gfs_id_parse_oid(o->id, &oid)) {
		usage_error("'%s' is not an ObjectId (24 hex digits)", o->id);
		return EXIT_USAGE;
	}
	if (o->id)
		gfs_id_filter(&filter, "_id", &oid);
	else
		BSON_APPEND_UTF8(&filter, "filename", name);
	bson_t *opts = BCON_NEW("sort", "{", "uploadDate", BCON_INT32(1), "_id", BCON_INT32(1), "}",
	                        "projection", "{", "_id", BCON_INT32(1), "filename", BCON_INT32(1),
	                        "length", BCON_INT32(1), "}");
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(s->files, &filter, opts, NULL);
	const bson_t *doc;
	bson_iter_t it;
	int64_t n = 0;
	while (mongoc_cursor_next(cur, &doc)) {
		if (!bson_iter_init_find(&it, doc, "_id"))
			continue;
		char *id = gfs_id_string(bson_iter_value(&it));
		char buf[16];
		const char *key;
		bson_uint32_to_string((uint32_t)n++, &key, buf, sizeof buf);
		BSON_APPEND_UTF8(&ids, key, id);
		const char *fname = bson_iter_init_find(&it, doc, "filename") && BSON_ITER_HOLDS_UTF8(&it)
		                  ? bson_iter_utf8(&it, NULL) : "";
		int64_t len = bson_iter_init_find(&it, doc, "length") && BSON_ITER_HOLDS_NUMBER(&it)
		            ? bson_iter_as_int64(&it) : -1;
		if (!o->json)
			human_line(stdout, "would remove %s (id %s, %lld bytes)", fname, id, (long long)len);
		free(id);
	}
	gfs_error err;
	int rc = EXIT_OK;
	if (!gfs_cursor_done(cur, "find in files collection", &err)) {
		rc = fail(&err);
	} else if (n == 0 && !o->force) {
		gfs_error_set(&err, GFS_ENOTFOUND, o->id ? "id %s: no such file" : "%s: no such file",
		              o->id ? o->id : name);
		rc = fail(&err);
	}
	bson_destroy(opts);
	bson_destroy(&filter);
	report(o, o->id ? o->id : name, n, &ids, rc);
	bson_destroy(&ids);
	return rc;
}

static int
cmd_rm(int argc, char **argv)
{
	struct rm_opts o = {0};
	int i = parse_options(argc, argv, &cmd_rm_entry, on_opt, &o);
	if (i < 0)
		return EXIT_USAGE;
	if (o.id ? argc - i != 0 : argc - i < 1) {
		usage_error(o.id ? "give NAMEs or --id, not both" : "a NAME or --id is required");
		return EXIT_USAGE;
	}
	gfs_conn *conn = connect_or_warn();
	if (!conn)
		return EXIT_USAGE;
	gfs_session *s = gfs_session_pop(conn);
	catch_interrupts(0, NULL);
	/* A removal an rm killed midway left is finished first, as put does. */
	int rc = o.dry_run ? EXIT_OK : recover_interrupted(s, NULL);
	if (rc != EXIT_OK) {
		/* The first name's line carries the error, as when its own removal fails. */
		report(&o, o.id ? o.id : argv[i], 0, NULL, rc);
	} else if (o.id) {
		rc = o.dry_run ? dry_run(s, &o, NULL) : rm_id(s, &o);
	} else {
		int nfail = 0, last = EXIT_OK, nnames = argc - i;
		for (; i < argc; i++) {
			int r = o.dry_run ? dry_run(s, &o, argv[i]) : rm_name(s, &o, argv[i]);
			if (r != EXIT_OK) {
				nfail++;
				last = r;
			}
			if (r == EXIT_BACKEND || r == EXIT_INTERRUPTED)
				break;
		}
		/* One name: its own status. Several: 1 when only some failed. */
		bool fatal = last == EXIT_BACKEND || last == EXIT_INTERRUPTED;
		rc = nfail == 0 ? EXIT_OK : (fatal || nfail == nnames) ? last : EXIT_PARTIAL;
	}
	gfs_session_push(s);
	gfs_conn_close(conn);
	return rc;
}

static const struct cmd_exit rm_exits[] = {
	{0, "ok"}, {1, "some of several names failed"}, {2, "usage"}, {3, "backend"},
	{4, "no such name or id"}, {130, "interrupted"}, {-1, NULL},
};

const struct cmd_entry cmd_rm_entry = {
	"rm", "remove files (all revisions of a name)", "NAME...|--id OID", rm_opts, rm_exits, cmd_rm,
};
