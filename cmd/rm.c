/* gridfsctl rm: remove files, every revision of each name, or one by id. */
#include <stdlib.h>
#include <string.h>

#include "cmd.h"

const char rm_help[] =
    "      --id OID      remove the file with this _id (one revision)\n"
    "  -f, --force       a missing name is not an error\n"
    "      --json        print one JSON object per name: {name, removed}\n";

enum { OPT_ID = 1, OPT_JSON };

const struct option rm_options[] = {
	{"id", required_argument, NULL, OPT_ID},
	{"force", no_argument, NULL, 'f'},
	{"json", no_argument, NULL, OPT_JSON},
	{NULL, 0, NULL, 0},
};

struct rm_opts {
	const char *id;
	bool force, json;
};

static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct rm_opts *o = ctx;
	switch (opt) {
	case OPT_ID: o->id = arg; return 0;
	case 'f': o->force = true; return 0;
	case OPT_JSON: o->json = true; return 0;
	}
	return -1;
}

/* --json: one object per name; when it failed, "error" repeats the message. */
static void
report(const struct rm_opts *o, const char *what, int64_t removed, int rc)
{
	if (!o->json)
		return;
	bson_t doc = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&doc, o->id ? "id" : "name", what);
	BSON_APPEND_INT64(&doc, "removed", removed);
	if (rc != EXIT_OK)
		BSON_APPEND_UTF8(&doc, "error", last_message());
	print_json(stdout, &doc);
	bson_destroy(&doc);
}

/* Deletes one revision; *gone keeps the id of one found already deleted. */
static int
rm_one(gfs_session *s, const char *name, const bson_value_t *fid, char **gone, int64_t *removed)
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
		rc = rm_one(s, name, &id, &gone, &removed);
		bson_value_destroy(&id);
	}
	free(gone);
	if (rc == EXIT_OK && err.code != GFS_ENOTFOUND)
		rc = fail(&err);
	else if (rc == EXIT_OK && removed == 0 && !o->force)
		rc = fail(&err);
	report(o, name, removed, rc);
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
	int rc = ok || (err.code == GFS_ENOTFOUND && o->force) ? EXIT_OK : fail(&err);
	report(o, o->id, ok ? 1 : 0, rc);
	return rc;
}

int
cmd_rm(int argc, char **argv)
{
	struct rm_opts o = {0};
	int i = parse_options(argc, argv, "f", rm_options, on_opt, &o);
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
	catch_stop_signals();
	int rc = EXIT_OK;
	if (o.id) {
		rc = rm_id(s, &o);
	} else {
		int nfail = 0, last = EXIT_OK, nnames = argc - i;
		for (; i < argc; i++) {
			int r = rm_name(s, &o, argv[i]);
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
