/* gridfsctl doctor: is the bucket reachable and sound? For monit and cron. */
#include <stdlib.h>
#include <string.h>

#include "../lib/doctor.h"
#include "../lib/topology.h"
#include "cmd.h"

enum { OPT_SAMPLE = 1, OPT_JSON, OPT_ALLOW_EMPTY };

struct doctor_opts {
	long sample;
	bool json, allow_empty;
};

#define TO(field) CMD_TO(struct doctor_opts, field)

static const struct cmd_opt doctor_opts[] = {
	CMD_OPT(0, "sample", "N", "chunks to look at for the orphan estimate, the first in natural "
	        "order (default 200; 0: skip it); a bucket of up to N chunks is counted exactly",
	        .id = OPT_SAMPLE, .kind = CMD_COUNT, .to = TO(sample), .max = 100000,
	        .bad = "--sample takes a number of chunks from 0 to 100000, not '%s'"),
	CMD_OPT(0, "allow-empty", NULL, "a bucket that does not exist yet (no BUCKET.files or "
	        "BUCKET.chunks) is not a problem", .id = OPT_ALLOW_EMPTY, .kind = CMD_SET,
	        .to = TO(allow_empty)),
	CMD_OPT(0, "json", NULL, "print one JSON object", .id = OPT_JSON, .kind = CMD_SET,
	        .to = TO(json)),
	CMD_OPT_END,
};

static void
index_json(bson_t *doc, const char *key, enum gfs_doctor_index st)
{
	BSON_APPEND_UTF8(doc, key, gfs_doctor_index_name(st));
}

/* When the run began, for the summary's "seconds". */
static double started;

static void
print_as_json(const gfs_doctor_report *r, const gfs_topology *topo, const char *db,
              const char *bucket, bool done, const char *error)
{
	struct json_summary sum;
	json_summary_begin(&sum, "doctor", false);
	bson_t *doc = &sum.body, sub;
	BSON_APPEND_UTF8(doc, "db", db);
	BSON_APPEND_UTF8(doc, "bucket", bucket);
	BSON_APPEND_BOOL(doc, "reachable", r->reachable);
	if (r->version[0])
		BSON_APPEND_UTF8(doc, "serverVersion", r->version);
	if (r->ferretdb[0])
		BSON_APPEND_UTF8(doc, "ferretdbVersion", r->ferretdb);
	if (r->version[0])
		BSON_APPEND_UTF8(doc, "server", r->ferretdb[0] ? "FerretDB" : "MongoDB");
	if (done) {
		BSON_APPEND_BOOL(doc, "exists", r->exists);
		BSON_APPEND_INT64(doc, "files", r->files);
		BSON_APPEND_INT64(doc, "chunks", r->chunks);
		BSON_APPEND_DOCUMENT_BEGIN(doc, "indexes", &sub);
		index_json(&sub, "files", r->files_index);
		index_json(&sub, "chunks", r->chunks_index);
		bson_append_document_end(doc, &sub);
		BSON_APPEND_DOCUMENT_BEGIN(doc, "importLock", &sub);
		BSON_APPEND_UTF8(&sub, "state", gfs_doctor_lock_name(r->lock));
		if (r->lock != GFS_LOCK_FREE) {
			char date[32];
			gfs_iso8601(r->lock_expires, date);
			BSON_APPEND_UTF8(&sub, "owner", r->lock_owner);
			if (r->lock_expires >= 0)
				BSON_APPEND_UTF8(&sub, "expires", date);
			if (r->lock_malformed[0])
				BSON_APPEND_UTF8(&sub, "malformed", r->lock_malformed);
		}
		bson_append_document_end(doc, &sub);
		BSON_APPEND_DOCUMENT_BEGIN(doc, "prefixLocks", &sub);
		BSON_APPEND_INT64(&sub, "held", r->prefix_locks_held);
		BSON_APPEND_INT64(&sub, "stale", r->prefix_locks_stale);
		bson_append_document_end(doc, &sub);
		BSON_APPEND_DOCUMENT_BEGIN(doc, "putLocks", &sub);
		BSON_APPEND_INT64(&sub, "held", r->put_locks_held);
		BSON_APPEND_INT64(&sub, "stale", r->put_locks_stale);
		bson_append_document_end(doc, &sub);
		BSON_APPEND_DOCUMENT_BEGIN(doc, "orphans", &sub);
		BSON_APPEND_UTF8(&sub, "method", gfs_doctor_sampling_name(r->sampling));
		BSON_APPEND_INT64(&sub, "sampled", r->sampled);
		BSON_APPEND_INT64(&sub, "found", r->sampled_orphans);
		BSON_APPEND_INT64(&sub, "uploading", r->sampled_uploading);
		BSON_APPEND_INT64(&sub, "interrupted", r->sampled_left);
		BSON_APPEND_INT64(&sub, "estimate", r->orphan_estimate);
		bson_append_document_end(doc, &sub);
		topology_json(doc, topo);
		BSON_APPEND_INT64(doc, "problems", r->problems);
	}
	json_summary_end(stdout, &sum, gfs_mono_seconds() - started, error);
}

/*
 * One line per check on stdout, as verify prints its problems there; with
 * -q only the problems. The exit status says whether there were any.
 */
static void
line(bool problem, const char *what, const char *detail)
{
	if (problem || !G.quiet)
		human_line(stdout, "%-14s%s%s", what, problem ? "PROBLEM: " : "", detail);
}

static const char *
index_words(enum gfs_doctor_index st, bool chunks)
{
	switch (st) {
	case GFS_INDEX_OK:
		return chunks ? "ok (unique {files_id: 1, n: 1})" : "ok ({filename: 1, uploadDate: 1})";
	case GFS_INDEX_MISSING:
		return chunks ? "missing: no unique {files_id: 1, n: 1} (create it; drivers only do on an empty bucket)"
		              : "missing: no {filename: 1, uploadDate: 1} (create it; drivers only do on an empty bucket)";
	case GFS_INDEX_NOT_UNIQUE:
		return "not unique: {files_id: 1, n: 1} lets a chunk be stored twice";
	case GFS_INDEX_NOT_NEEDED:
		return "none yet (the bucket is empty: the first write creates it)";
	}
	return "?";
}

/*
 * The server by the name it gives itself: FerretDB answers buildInfo with
 * the MongoDB version it is compatible with, and its own in ferretdbVersion
 * ("unknown" when built without it, as the embedded backend is).
 */
static void
server_words(const gfs_doctor_report *r, char *buf, size_t len)
{
	if (!r->ferretdb[0])
		snprintf(buf, len, "reachable, MongoDB %s", r->version);
	else if (strcmp(r->ferretdb, "unknown") == 0)
		snprintf(buf, len, "reachable, FerretDB (it does not report its own version), "
		         "compatible with MongoDB %s", r->version);
	else
		snprintf(buf, len, "reachable, FerretDB %s, compatible with MongoDB %s", r->ferretdb,
		         r->version);
}

static void
print_text(const gfs_doctor_report *r, const char *db, const char *bucket, bool allow_empty)
{
	char buf[600], date[32];
	server_words(r, buf, sizeof buf);
	line(false, "backend:", buf);
	if (r->exists)
		snprintf(buf, sizeof buf, "%lld files, %lld chunks (estimated counts)",
		         (long long)r->files, (long long)r->chunks);
	else
		snprintf(buf, sizeof buf, "does not exist: no %s.files or %s.chunks in database %s%s",
		         bucket, bucket, db, allow_empty ? " (allowed by --allow-empty)"
		                                         : " (a misspelt --bucket or --db? --allow-empty "
		                                           "if nothing was written yet)");
	line(!r->exists && !allow_empty, "bucket:", buf);
	line(r->files_index == GFS_INDEX_MISSING, "files index:",
	     index_words(r->files_index, false));
	line(r->chunks_index == GFS_INDEX_MISSING || r->chunks_index == GFS_INDEX_NOT_UNIQUE,
	     "chunks index:", index_words(r->chunks_index, true));
	gfs_iso8601(r->lock_expires, date);
	char bad[160] = "";
	if (r->lock_malformed[0])
		snprintf(bad, sizeof bad, "; its document is malformed: %s", r->lock_malformed);
	if (r->lock == GFS_LOCK_FREE)
		snprintf(buf, sizeof buf, "free");
	else if (r->lock == GFS_LOCK_HELD)
		snprintf(buf, sizeof buf, "held by %s (lease until %s%s)", r->lock_owner, date, bad);
	else if (r->lock_expires < 0)
		snprintf(buf, sizeof buf, "stale, left by %s (it has no lease%s; the next import or "
		         "verify --repair takes it over)", r->lock_owner, bad);
	else
		snprintf(buf, sizeof buf, "stale, left by %s (lease ended %s or its process is gone%s; "
		         "the next import or verify --repair takes it over)", r->lock_owner, date, bad);
	line(false, "import lock:", buf);
	if (r->prefix_locks_held || r->prefix_locks_stale) {
		snprintf(buf, sizeof buf, "%lld held by imports of a prefix at work, %lld stale (left by "
		         "killed ones; the next import of an overlapping prefix takes it over)",
		         (long long)r->prefix_locks_held, (long long)r->prefix_locks_stale);
		line(false, "prefix locks:", buf);
	}
	if (r->put_locks_held || r->put_locks_stale) {
		snprintf(buf, sizeof buf, "%lld held by puts at work, %lld stale (left by killed puts; "
		         "the next put, rm, import or verify --repair removes them)",
		         (long long)r->put_locks_held, (long long)r->put_locks_stale);
		line(false, "put locks:", buf);
	}
	const char *how = r->sampling == GFS_SAMPLE_ALL ? "counted in every chunk"
	                : "estimated from the first chunks in natural order, the oldest";
	if (r->sampling == GFS_SAMPLE_NONE)
		snprintf(buf, sizeof buf, "not estimated");
	else
		snprintf(buf, sizeof buf, "%s%lld chunk%s (%lld of %lld looked at have no file; %s)%s",
		         r->sampling == GFS_SAMPLE_ALL ? "" : "about ", (long long)r->orphan_estimate,
		         r->orphan_estimate == 1 ? "" : "s",
		         (long long)r->sampled_orphans, (long long)r->sampled, how,
		         r->sampled_orphans ? ": 'gridfsctl verify --repair' removes them" : "");
	line(r->sampled_orphans > 0, "orphans:", buf);
	if (r->sampled_left) {
		snprintf(buf, sizeof buf, "%lld of the orphan chunks looked at were %s",
		         (long long)r->sampled_left, r->left_by);
		line(true, "interrupted:", buf);
	}
	if (r->sampled_uploading) {
		snprintf(buf, sizeof buf, "%lld sampled chunks belong to uploads or removals in progress "
		         "(an import, put or rm is at work on them)", (long long)r->sampled_uploading);
		line(false, "uploads:", buf);
	}
}

static int
cmd_doctor(int argc, char **argv)
{
	started = gfs_mono_seconds();
	struct doctor_opts o = {.sample = GFS_DOCTOR_DEFAULT_SAMPLE};
	int i = parse_options(argc, argv, &cmd_doctor_entry, NULL, &o);
	if (i < 0)
		return EXIT_USAGE;
	if (i < argc) {
		usage_error("unexpected argument '%s'", argv[i]);
		return EXIT_USAGE;
	}
	gfs_conn *conn = connect_or_warn();
	gfs_doctor_report r = {0};
	if (!conn) {
		if (o.json)
			print_as_json(&r, NULL, G.db ? G.db : "", G.bucket ? G.bucket : GFS_DEFAULT_BUCKET, false,
			              last_message());
		return EXIT_USAGE;
	}
	char *db = strdup(gfs_conn_db(conn)), *bucket = strdup(gfs_conn_bucket(conn));
	gfs_error err;
	gfs_topology topo;
	bool ok = gfs_doctor(conn, o.sample, &r, &err) && gfs_topology_probe(conn, &topo, &err);
	if (ok)
		r.problems += topo.problems;
	gfs_conn_close(conn);
	/* A typo in a monitoring check's --bucket must not pass as an empty bucket. */
	if (ok && !r.exists && !o.allow_empty)
		r.problems++;
	int rc = ok ? (r.problems ? EXIT_PARTIAL : EXIT_OK) : fail(&err);
	if (o.json)
		print_as_json(&r, &topo, db, bucket, ok, !ok ? err.msg : r.problems ? "problems found" : NULL);
	else if (ok) {
		print_text(&r, db, bucket, o.allow_empty);
		topology_print(&topo, bucket, line);
	}
	free(db);
	free(bucket);
	return rc;
}

static const struct cmd_exit doctor_exits[] = {
	{0, "healthy"}, {1, "problems found (a bucket that does not exist too)"}, {2, "usage"},
	{3, "backend unreachable or a command failed"}, {-1, NULL},
};

const struct cmd_entry cmd_doctor_entry = {
	.name = "doctor",
	.summary = "check the backend, the bucket's indexes, the import lock and orphan chunks",
	.opts = doctor_opts,
	.exits = doctor_exits,
	.run = cmd_doctor,
};
