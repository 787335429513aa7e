/* The health check behind `gridfsctl doctor`: see doctor.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doctor.h"
#include "import.h"
#include "lock.h"

/* MongoDB's NamespaceNotFound: listIndexes on a collection not created yet. */
#define NS_NOT_FOUND 26

static bool
server_version(gfs_session *s, gfs_doctor_report *r, gfs_error *err)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	BSON_APPEND_INT32(&cmd, "buildInfo", 1);
	bson_error_t berr;
	bool ok = mongoc_client_command_simple(s->client, "admin", &cmd, NULL, &reply, &berr);
	bson_iter_t it;
	if (ok && bson_iter_init_find(&it, &reply, "version") && BSON_ITER_HOLDS_UTF8(&it))
		snprintf(r->version, sizeof r->version, "%s", bson_iter_utf8(&it, NULL));
	if (ok && bson_iter_init_find(&it, &reply, "ferretdbVersion") && BSON_ITER_HOLDS_UTF8(&it))
		snprintf(r->ferretdb, sizeof r->ferretdb, "%s", bson_iter_utf8(&it, NULL));
	if (!ok)
		gfs_error_from_bson(err, &berr, "buildInfo");
	bson_destroy(&cmd);
	bson_destroy(&reply);
	return ok;
}

/*
 * Whether the bucket's collections exist: an empty bucket has them once
 * anything was written, a misspelt --bucket or --db never does. One
 * listCollections on the database, by name.
 */
static bool
bucket_exists(gfs_session *s, gfs_doctor_report *r, gfs_error *err)
{
	const char *files = mongoc_collection_get_name(s->files);
	const char *chunks = mongoc_collection_get_name(s->chunks);
	bson_t opts = BSON_INITIALIZER, filter, in;
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "filter", &filter);
	BSON_APPEND_DOCUMENT_BEGIN(&filter, "name", &in);
	bson_t names;
	BSON_APPEND_ARRAY_BEGIN(&in, "$in", &names);
	BSON_APPEND_UTF8(&names, "0", files);
	BSON_APPEND_UTF8(&names, "1", chunks);
	bson_append_array_end(&in, &names);
	bson_append_document_end(&filter, &in);
	bson_append_document_end(&opts, &filter);
	BSON_APPEND_BOOL(&opts, "nameOnly", true);
	mongoc_database_t *db = mongoc_client_get_database(s->client, gfs_conn_db(s->conn));
	bson_error_t berr;
	char **found = mongoc_database_get_collection_names_with_opts(db, &opts, &berr);
	mongoc_database_destroy(db);
	bson_destroy(&opts);
	if (!found) {
		gfs_error_from_bson(err, &berr, "listCollections");
		return false;
	}
	r->exists = found[0] != NULL;
	bson_strfreev(found);
	return true;
}

/*
 * The collection's document count as its storage keeps it: aggregate's
 * $collStats {count: {}} (summed over shards), which MongoDB and FerretDB
 * read from metadata (FerretDB: PostgreSQL's estimate of the table's rows,
 * negative until the table was first analyzed). The count command
 * (estimatedDocumentCount) is the fallback for a server without $collStats
 * or without an estimate yet: FerretDB answers it, and the collStats
 * command, by reading every document (seconds for the chunks of 52,000
 * posters), so it is never the first choice.
 */
static bool
count(mongoc_collection_t *coll, int64_t *out, gfs_error *err)
{
	bson_t *pipeline = BCON_NEW("pipeline", "[", "{", "$collStats", "{", "count", "{", "}", "}", "}",
	                            "]");
	mongoc_cursor_t *cur = mongoc_collection_aggregate(coll, MONGOC_QUERY_NONE, pipeline, NULL, NULL);
	bson_destroy(pipeline);
	const bson_t *doc;
	bson_iter_t it;
	bool found = false;
	*out = 0;
	while (mongoc_cursor_next(cur, &doc)) {
		if (bson_iter_init_find(&it, doc, "count") && BSON_ITER_HOLDS_NUMBER(&it)) {
			*out += bson_iter_as_int64(&it);
			found = true;
		}
	}
	bson_error_t berr;
	bool failed = mongoc_cursor_error(cur, &berr);
	mongoc_cursor_destroy(cur);
	if (found && !failed && *out >= 0)
		return true;
	*out = mongoc_collection_estimated_document_count(coll, NULL, NULL, NULL, &berr);
	if (*out >= 0)
		return true;
	char what[200];
	snprintf(what, sizeof what, "count %s", mongoc_collection_get_name(coll));
	gfs_error_from_bson(err, &berr, what);
	return false;
}

/* The index with exactly these keys: GFS_INDEX_OK, _MISSING or _NOT_UNIQUE (when want_unique). */
static bool
check_index(mongoc_collection_t *coll, const bson_t *keys, bool want_unique,
            enum gfs_doctor_index *state, gfs_error *err)
{
	*state = GFS_INDEX_MISSING;
	mongoc_cursor_t *cur = mongoc_collection_find_indexes_with_opts(coll, NULL);
	const bson_t *doc;
	while (mongoc_cursor_next(cur, &doc)) {
		bson_iter_t it;
		uint32_t len;
		const uint8_t *data;
		bson_t key;
		if (!bson_iter_init_find(&it, doc, "key") || !BSON_ITER_HOLDS_DOCUMENT(&it))
			continue;
		bson_iter_document(&it, &len, &data);
		if (!bson_init_static(&key, data, len) || !gfs_index_keys_equal(&key, keys))
			continue;
		bool unique = bson_iter_init_find(&it, doc, "unique") && bson_iter_as_bool(&it);
		*state = !want_unique || unique ? GFS_INDEX_OK : GFS_INDEX_NOT_UNIQUE;
		if (*state == GFS_INDEX_OK)
			break;
	}
	bson_error_t berr;
	bool ok = !mongoc_cursor_error(cur, &berr) || berr.code == NS_NOT_FOUND;
	if (!ok) {
		char what[200];
		snprintf(what, sizeof what, "listIndexes %s", mongoc_collection_get_name(coll));
		gfs_error_from_bson(err, &berr, what);
	}
	mongoc_cursor_destroy(cur);
	return ok;
}

/* The spec's indexes: {filename: 1, uploadDate: 1} on files, unique {files_id: 1, n: 1} on chunks. */
static bool
check_indexes(gfs_session *s, gfs_doctor_report *r, gfs_error *err)
{
	bson_t fk = BSON_INITIALIZER, ck = BSON_INITIALIZER;
	BSON_APPEND_INT32(&fk, "filename", 1);
	BSON_APPEND_INT32(&fk, "uploadDate", 1);
	BSON_APPEND_INT32(&ck, "files_id", 1);
	BSON_APPEND_INT32(&ck, "n", 1);
	bool ok = check_index(s->files, &fk, false, &r->files_index, err) &&
	          check_index(s->chunks, &ck, true, &r->chunks_index, err);
	bson_destroy(&fk);
	bson_destroy(&ck);
	/* Drivers create them on the first write to an empty bucket, and only then. */
	bool empty = r->files == 0 && r->chunks == 0;
	if (empty && r->files_index == GFS_INDEX_MISSING)
		r->files_index = GFS_INDEX_NOT_NEEDED;
	if (empty && r->chunks_index == GFS_INDEX_MISSING)
		r->chunks_index = GFS_INDEX_NOT_NEEDED;
	return ok;
}

/* The import locks' documents (the whole bucket's, prefixes'), as gfs_lock_read() reads them. */
static bool
check_lock(gfs_session *s, gfs_doctor_report *r, gfs_error *err)
{
	gfs_lock_state st;
	int found = gfs_lock_read(s, GFS_IMPORT_LOCK, &st, err);
	r->lock = found <= 0 ? GFS_LOCK_FREE : st.held ? GFS_LOCK_HELD : GFS_LOCK_STALE;
	r->lock_expires = st.expires;
	snprintf(r->lock_owner, sizeof r->lock_owner, "%s", found > 0 ? st.holder : "");
	snprintf(r->lock_malformed, sizeof r->lock_malformed, "%s", st.malformed);
	return found >= 0 &&
	       gfs_lock_sweep(s, GFS_IMPORT_LOCK ":", false, &r->prefix_locks_held,
	                      &r->prefix_locks_stale, err) &&
	       gfs_lock_sweep(s, GFS_PUT_LOCK_PREFIX, false, &r->put_locks_held, &r->put_locks_stale, err);
}

/* ---- orphan chunks ----------------------------------------------------- */

/* One distinct files_id of the sample and how many sampled chunks carry it. */
struct owner {
	bson_value_t id;
	int64_t chunks;
};

struct sample {
	struct owner *owners;
	size_t n, cap;
	int64_t chunks;
};

static void
sample_add(struct sample *smp, const bson_value_t *id)
{
	smp->chunks++;
	for (size_t i = 0; i < smp->n; i++)
		if (gfs_id_equal(&smp->owners[i].id, id)) {
			smp->owners[i].chunks++;
			return;
		}
	GFS_GROW(smp->owners, smp->n + 1, smp->cap, 64);
	bson_value_copy(id, &smp->owners[smp->n].id);
	smp->owners[smp->n++].chunks = 1;
}

static void
sample_free(struct sample *smp)
{
	for (size_t i = 0; i < smp->n; i++)
		bson_value_destroy(&smp->owners[i].id);
	free(smp->owners);
}

/*
 * The files_id of the first size chunks in natural order: no filter, no
 * sort, a limit, so MongoDB reads them off the start of the collection and
 * FerretDB reads size rows (it pushes the limit down); one more is asked
 * for, to know whether these were all. In one reply where it fits: a getMore
 * costs FerretDB as much as the first batch. Rule 1 of docs/design.md.
 */
static bool
read_first(gfs_session *s, int64_t size, struct sample *smp, bool *all, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER;
	bson_t *opts = BCON_NEW("projection", "{", "_id", BCON_INT32(0), "files_id", BCON_INT32(1), "}",
	                        "hint", "{", "$natural", BCON_INT32(1), "}", "limit", BCON_INT64(size + 1),
	                        "batchSize", BCON_INT32((int32_t)(size + 1 < 10000 ? size + 1 : 10000)));
	mongoc_cursor_t *cur = gfs_session_find(s, s->chunks, &filter, opts);
	bson_destroy(opts);
	const bson_t *doc;
	bson_iter_t it;
	int64_t seen = 0;
	while (mongoc_cursor_next(cur, &doc))
		if (++seen <= size && bson_iter_init_find(&it, doc, "files_id"))
			sample_add(smp, bson_iter_value(&it));
	*all = seen <= size;
	return gfs_cursor_done(cur, "read the first chunks", err);
}

static bool
estimate_orphans(gfs_session *s, int64_t size, gfs_doctor_report *r, gfs_error *err)
{
	r->sampling = GFS_SAMPLE_NONE;
	if (size <= 0)
		return true;
	struct sample smp = {0};
	bool all;
	bool ok = read_first(s, size, &smp, &all, err);
	if (ok && smp.chunks > 0)
		r->sampling = all ? GFS_SAMPLE_ALL : GFS_SAMPLE_FIRST;
	/*
	 * Each distinct owner by _id equality: an index seek on every server.
	 * Chunks whose marker's writer is gone are orphans too, which the next
	 * run of its kind takes.
	 */
	for (size_t i = 0; ok && i < smp.n; i++) {
		const bson_value_t *id = &smp.owners[i].id;
		bson_t m;
		int file = gfs_exists(s, s->files, "_id", id, err);
		int marker = file == 0 ? gfs_marker_find(s, id, &m, err) : 0;
		int live = marker > 0 ? gfs_marker_live(s, &m, NULL, err) : 0;
		ok = file >= 0 && marker >= 0 && live >= 0;
		if (ok && file == 0 && live > 0)
			r->sampled_uploading += smp.owners[i].chunks;
		else if (ok && file == 0)
			r->sampled_orphans += smp.owners[i].chunks;
		if (ok && file == 0 && marker > 0 && live == 0) {
			r->sampled_left += smp.owners[i].chunks;
			if (!r->left_by[0])
				gfs_marker_left_by(&m, r->left_by, sizeof r->left_by);
		}
		if (marker > 0)
			bson_destroy(&m);
	}
	r->sampled = smp.chunks;
	sample_free(&smp);
	if (!ok)
		return false;
	if (r->sampling == GFS_SAMPLE_ALL || r->sampled == 0)
		r->orphan_estimate = r->sampled_orphans;
	else
		r->orphan_estimate = (int64_t)((double)r->sampled_orphans / (double)r->sampled *
		                               (double)r->chunks + 0.5);
	return true;
}

/*
 * Orphans are a PROBLEM, so they are decided from what the primary says,
 * as a repair is: the sample and its owners' lookups on one session pinned
 * to it, so that no lagging member calls a chunk's new files document absent.
 */
static bool
estimate_orphans_on_primary(gfs_session *s, int64_t size, gfs_doctor_report *r, gfs_error *err)
{
	gfs_session *p = gfs_session_primary(s, err);
	bool ok = p && estimate_orphans(p, size, r, err);
	gfs_session_push(p);
	return ok;
}

bool
gfs_doctor(gfs_conn *conn, int64_t sample_size, gfs_doctor_report *r, gfs_error *err)
{
	memset(r, 0, sizeof *r);
	gfs_error_clear(err);
	if (!gfs_conn_ping(conn, err))
		return false;
	r->reachable = true;
	/*
	 * The survey (version, the bucket, its counts and indexes) reads where
	 * the URI's read preference sends each command: it describes and decides
	 * nothing, and a monitor on a secondary should not load the primary.
	 * Locks are read on the primary (gfs_session_bucket_collection).
	 */
	gfs_session *s = gfs_session_pop(conn);
	bool ok = server_version(s, r, err) && bucket_exists(s, r, err) &&
	          count(s->files, &r->files, err) &&
	          count(s->chunks, &r->chunks, err) && check_indexes(s, r, err) &&
	          check_lock(s, r, err) && estimate_orphans_on_primary(s, sample_size, r, err);
	gfs_session_push(s);
	r->problems = (r->files_index == GFS_INDEX_MISSING) + (r->chunks_index == GFS_INDEX_MISSING ||
	              r->chunks_index == GFS_INDEX_NOT_UNIQUE) + (r->sampled_orphans > 0);
	return ok;
}

const char *
gfs_doctor_index_name(enum gfs_doctor_index s)
{
	switch (s) {
	case GFS_INDEX_OK: return "ok";
	case GFS_INDEX_MISSING: return "missing";
	case GFS_INDEX_NOT_UNIQUE: return "not-unique";
	case GFS_INDEX_NOT_NEEDED: return "not-needed";
	}
	return "unknown";
}

const char *
gfs_doctor_lock_name(enum gfs_doctor_lock s)
{
	switch (s) {
	case GFS_LOCK_FREE: return "free";
	case GFS_LOCK_HELD: return "held";
	case GFS_LOCK_STALE: return "stale";
	}
	return "unknown";
}

const char *
gfs_doctor_sampling_name(enum gfs_doctor_sampling s)
{
	switch (s) {
	case GFS_SAMPLE_NONE: return "none";
	case GFS_SAMPLE_ALL: return "all";
	case GFS_SAMPLE_FIRST: return "first";
	}
	return "unknown";
}
