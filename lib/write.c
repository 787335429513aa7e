/* Writing, deleting and renaming files, chunks first as the spec requires. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gfs.h"
#include "import.h"
#include "lock.h"
#include "names.h"

/* Each bulk insert carries at most this much chunk data (one or two wire messages). */
#define PUT_BATCH_BYTES (8 * 1024 * 1024)
/* And this many chunks: with a tiny chunk size, bytes alone would allow millions of documents. */
#define PUT_BATCH_DOCS 10000

struct gfs_chunk_batch {
	bson_t **docs;
	size_t count, cap;
	size_t bytes, max_bytes;
};

gfs_chunk_batch *
gfs_chunk_batch_new(size_t max_bytes)
{
	gfs_chunk_batch *b = gfs_xcalloc(1, sizeof *b);
	b->max_bytes = max_bytes;
	return b;
}

static void
batch_clear(gfs_chunk_batch *b)
{
	for (size_t i = 0; i < b->count; i++)
		bson_destroy(b->docs[i]);
	b->count = 0;
	b->bytes = 0;
}

void
gfs_chunk_batch_free(gfs_chunk_batch *b)
{
	if (!b)
		return;
	batch_clear(b);
	free(b->docs);
	free(b);
}

size_t
gfs_chunk_batch_bytes(const gfs_chunk_batch *b)
{
	return b->bytes;
}

size_t
gfs_chunk_batch_count(const gfs_chunk_batch *b)
{
	return b->count;
}

void
gfs_chunk_batch_add(gfs_chunk_batch *b, const bson_value_t *files_id, int64_t n,
                    const uint8_t *data, size_t len)
{
	GFS_GROW(b->docs, b->count + 1, b->cap, 64);
	/* The spec types n as int32: a wrapped number would silently corrupt the file. */
	if (n < 0 || n > INT32_MAX)
		abort();
	bson_t *doc = bson_sized_new((uint32_t)len + 64);
	bson_oid_t oid;
	bson_oid_init(&oid, NULL);
	BSON_APPEND_OID(doc, "_id", &oid);
	BSON_APPEND_VALUE(doc, "files_id", files_id);
	BSON_APPEND_INT32(doc, "n", (int32_t)n);
	BSON_APPEND_BINARY(doc, "data", BSON_SUBTYPE_BINARY, data, (uint32_t)len);
	b->docs[b->count++] = doc;
	b->bytes += len;
}

bool
gfs_chunk_batch_flush(gfs_chunk_batch *b, gfs_session *s, gfs_error *err)
{
	if (b->count == 0)
		return true;
	bson_t opts = BSON_INITIALIZER, reply;
	BSON_APPEND_BOOL(&opts, "ordered", false);
	bson_error_t berr;
	bool ok = mongoc_collection_insert_many(s->chunks, (const bson_t **)b->docs, b->count, &opts,
	                                        &reply, &berr);
	if (!ok)
		gfs_error_from_bson(err, &berr, "insert chunks");
	bson_destroy(&opts);
	bson_destroy(&reply);
	batch_clear(b);
	return ok;
}

void
gfs_files_doc(bson_t *doc, const bson_value_t *id, const char *filename, int64_t length,
              int32_t chunk_size, int64_t upload_date_ms, const char *content_type,
              const char *sha256_hex, const bson_t *metadata)
{
	BSON_APPEND_VALUE(doc, "_id", id);
	BSON_APPEND_INT64(doc, "length", length);
	BSON_APPEND_INT32(doc, "chunkSize", chunk_size);
	BSON_APPEND_DATE_TIME(doc, "uploadDate", upload_date_ms);
	BSON_APPEND_UTF8(doc, "filename", filename);
	if (content_type)
		BSON_APPEND_UTF8(doc, "contentType", content_type);
	bson_t meta;
	BSON_APPEND_DOCUMENT_BEGIN(doc, "metadata", &meta);
	bson_iter_t it;
	if (metadata && bson_iter_init(&it, metadata)) {
		while (bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);
			if (strcmp(k, "sha256") == 0 || (content_type && strcmp(k, "contentType") == 0))
				continue;
			BSON_APPEND_VALUE(&meta, k, bson_iter_value(&it));
		}
	}
	if (content_type)
		BSON_APPEND_UTF8(&meta, "contentType", content_type);
	if (sha256_hex)
		BSON_APPEND_UTF8(&meta, "sha256", sha256_hex);
	bson_append_document_end(doc, &meta);
}

void
gfs_metadata_from_stat(bson_t *meta, const struct stat *st)
{
	int64_t ns = gfs_stat_mtime_ns(st);
	BSON_APPEND_DATE_TIME(meta, "mtime", gfs_mtime_ms(ns));
	BSON_APPEND_INT64(meta, "mtimeNs", ns);
	BSON_APPEND_INT64(meta, "size", (int64_t)st->st_size);
	BSON_APPEND_INT32(meta, "mode", (int32_t)(st->st_mode & 07777));
}

ssize_t
gfs_source_fd(uint8_t *buf, size_t len, void *ctx)
{
	int fd = *(int *)ctx;
	size_t got = 0;
	while (got < len) {
		ssize_t r = read(fd, buf + got, len - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

static bool
remove_chunks(gfs_session *s, const bson_value_t *id)
{
	bson_t filter = BSON_INITIALIZER;
	gfs_id_filter(&filter, "files_id", id);
	bool ok = mongoc_collection_delete_many(s->chunks, &filter, NULL, NULL, NULL);
	bson_destroy(&filter);
	return ok;
}

/*
 * One equality statement per value, not one {field: {$in: values}}: a
 * server that cannot serve $in from an index (FerretDB) reads the whole
 * collection for it, every chunk of the bucket for a removal of one file,
 * while an equality is an index seek on every server. Ordered, so that the
 * first failure stops the rest; the driver sends the statements in as few
 * delete commands as the server's batch limits allow.
 */
bool
gfs_delete_each(mongoc_collection_t *coll, const bson_t *also, const char *field,
                const bson_value_t *values, size_t n, int64_t *deleted, const char *what,
                gfs_error *err)
{
	if (deleted)
		*deleted = 0;
	if (n == 0)
		return true;
	bson_t opts = BSON_INITIALIZER, reply;
	BSON_APPEND_BOOL(&opts, "ordered", true);
	mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts(coll, &opts);
	bson_destroy(&opts);
	bson_error_t berr;
	bool ok = true;
	for (size_t i = 0; ok && i < n; i++) {
		bson_t filter = BSON_INITIALIZER;
		if (also)
			bson_concat(&filter, also);
		gfs_id_filter(&filter, field, &values[i]);
		ok = mongoc_bulk_operation_remove_many_with_opts(bulk, &filter, NULL, &berr);
		bson_destroy(&filter);
	}
	if (ok) {
		/* Sets reply whatever happens; what was removed before a failure is counted too. */
		ok = mongoc_bulk_operation_execute(bulk, &reply, &berr) != 0;
		bson_iter_t it;
		if (deleted && bson_iter_init_find(&it, &reply, "nRemoved"))
			*deleted = bson_iter_as_int64(&it);
		bson_destroy(&reply);
	}
	if (!ok)
		gfs_error_from_bson(err, &berr, what);
	mongoc_bulk_operation_destroy(bulk);
	return ok;
}

/* Files documents first, then chunks, as the spec orders a removal. */
static bool
remove_files(gfs_session *s, const bson_value_t *ids, size_t n, int64_t *files, gfs_error *err)
{
	return gfs_delete_each(s->files, NULL, "_id", ids, n, files, "delete files documents", err) &&
	       gfs_delete_each(s->chunks, NULL, "files_id", ids, n, NULL, "delete chunks", err);
}

/* ---- upload markers ---------------------------------------------------- */

/*
 * A put killed between its first chunk and its files document leaves
 * chunks that no reader finds. So before the first chunk it takes the
 * lock "put-ID" (lib/lock.c: renewed while it runs, free at once when its
 * process is gone) and records {_id: ID, filename, lock} in the uploads
 * collection import uses; both go when the file is complete or its chunks
 * are removed. Whoever can take the lock of a marker knows its put is dead.
 */
struct put_marker {
	gfs_lock *lock;
	char *lock_name;
};

static bool
marker_begin(gfs_session *s, const bson_value_t *id, const gfs_put_opts *o, struct put_marker *m,
             gfs_error *err)
{
	char *ids = gfs_id_string(id);
	m->lock_name = bson_strdup_printf(GFS_PUT_LOCK_PREFIX "%s", ids);
	free(ids);
	m->lock = gfs_lock_acquire(s->conn, m->lock_name, 0, err);
	if (!m->lock)
		return false;
	bson_t doc = BSON_INITIALIZER;
	BSON_APPEND_VALUE(&doc, "_id", id);
	BSON_APPEND_UTF8(&doc, "filename", o->filename);
	BSON_APPEND_UTF8(&doc, "lock", m->lock_name);
	if (gfs_owner_verb())
		BSON_APPEND_UTF8(&doc, "verb", gfs_owner_verb());
	if (o->keep_revisions > 0)
		BSON_APPEND_INT32(&doc, "keep", o->keep_revisions);
	/* The caller's id may be used again soon: late writes of it are not told from a new file's. */
	if (o->id)
		BSON_APPEND_BOOL(&doc, "givenId", true);
	mongoc_collection_t *uploads = gfs_session_bucket_collection(s, GFS_UPLOADS_SUFFIX);
	bson_error_t berr;
	bool ok = mongoc_collection_insert_one(uploads, &doc, NULL, NULL, &berr);
	if (!ok)
		gfs_error_from_bson(err, &berr, "insert upload marker");
	mongoc_collection_destroy(uploads);
	bson_destroy(&doc);
	if (!ok) {
		gfs_lock_release(m->lock);
		m->lock = NULL;
	}
	return ok;
}

/* Removes a marker (ours, or a dead put's whose lock we hold). */
static bool
marker_remove(gfs_session *s, const bson_value_t *id, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER;
	gfs_id_filter(&filter, "_id", id);
	mongoc_collection_t *uploads = gfs_session_bucket_collection(s, GFS_UPLOADS_SUFFIX);
	bson_error_t berr;
	bool ok = mongoc_collection_delete_one(uploads, &filter, NULL, NULL, &berr);
	if (!ok && err)
		gfs_error_from_bson(err, &berr, "remove upload marker");
	mongoc_collection_destroy(uploads);
	bson_destroy(&filter);
	return ok;
}

/* settled: the upload is stored, or its chunks are gone; else recovery decides later. */
static void
marker_end(gfs_session *s, const bson_value_t *id, struct put_marker *m, bool settled)
{
	if (m->lock) {
		if (settled)
			marker_remove(s, id, NULL);
		gfs_lock_release(m->lock);
	}
	bson_free(m->lock_name);
}

/* Chunks of id removed; *n how many, so that a recovery knows whether any had landed late. */
static bool
remove_dead_chunks(gfs_session *s, const bson_value_t *id, int64_t *n, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, reply;
	gfs_id_filter(&filter, "files_id", id);
	bson_error_t berr;
	bool ok = mongoc_collection_delete_many(s->chunks, &filter, NULL, &reply, &berr);
	bson_iter_t it;
	*n = ok && bson_iter_init_find(&it, &reply, "deletedCount") ? bson_iter_as_int64(&it) : 0;
	if (!ok)
		gfs_error_from_bson(err, &berr, "remove orphan chunks");
	bson_destroy(&reply);
	bson_destroy(&filter);
	return ok;
}

/* Flags a dead put's marker as recovered: its process is known gone, its lock no longer asked. */
static bool
marker_flag(gfs_session *s, const bson_value_t *id, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, update = BSON_INITIALIZER, set;
	gfs_id_filter(&filter, "_id", id);
	BSON_APPEND_DOCUMENT_BEGIN(&update, "$set", &set);
	BSON_APPEND_BOOL(&set, GFS_RECOVERED_FIELD, true);
	bson_append_document_end(&update, &set);
	mongoc_collection_t *uploads = gfs_session_bucket_collection(s, GFS_UPLOADS_SUFFIX);
	bson_error_t berr;
	bool ok = mongoc_collection_update_one(uploads, &filter, &update, NULL, NULL, &berr);
	if (!ok)
		gfs_error_from_bson(err, &berr, "flag upload marker recovered");
	mongoc_collection_destroy(uploads);
	bson_destroy(&filter);
	bson_destroy(&update);
	return ok;
}

#define RECOVER_MAX 1000

/*
 * A write that a dead process had sent can still be applied after its
 * upload was recovered: the server runs what it received, its sender gone
 * or not, and the sender's kernel goes on sending what its socket held for
 * a while after the process died. A chunk batch leaves orphans then, a
 * files document a file with no chunks. So an upload whose marker goes
 * after recovery is remembered in BUCKET.gridfsctl_recovered as
 * {_id: files_id, until} for RECOVERED_KEEP_S, far longer than any such
 * write takes, and every recovery removes what of it has landed since.
 */
#define RECOVERED_KEEP_S 600

static bool
recovered_add(gfs_session *s, const bson_value_t *id, gfs_error *err)
{
	bson_t doc = BSON_INITIALIZER;
	BSON_APPEND_VALUE(&doc, "_id", id);
	BSON_APPEND_DATE_TIME(&doc, "until", gfs_now_ms() + (int64_t)RECOVERED_KEEP_S * 1000);
	mongoc_collection_t *rec = gfs_session_bucket_collection(s, GFS_RECOVERED_SUFFIX);
	bson_error_t berr;
	/* Already there: a pass before ours remembered it. */
	bool ok = mongoc_collection_insert_one(rec, &doc, NULL, NULL, &berr) || berr.code == 11000;
	if (!ok)
		gfs_error_from_bson(err, &berr, "remember a recovered upload");
	mongoc_collection_destroy(rec);
	bson_destroy(&doc);
	return ok;
}

bool
gfs_recovered_add(gfs_session *s, const bson_value_t *ids, size_t n, gfs_error *err)
{
	bool ok = true;
	for (size_t i = 0; ok && i < n; i++)
		ok = recovered_add(s, &ids[i], err);
	return ok;
}

/* Removes what landed of recovered uploads since, and forgets those past their time. */
static bool
sweep_recovered(gfs_session *s, gfs_error *err)
{
	bson_t opts = BSON_INITIALIZER;
	BSON_APPEND_INT64(&opts, "limit", RECOVER_MAX);
	mongoc_collection_t *rec = gfs_session_bucket_collection(s, GFS_RECOVERED_SUFFIX);
	bson_t all = BSON_INITIALIZER;
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(rec, &all, &opts, NULL);
	bson_value_t *ids = gfs_xcalloc(RECOVER_MAX, sizeof *ids), *old = gfs_xcalloc(RECOVER_MAX, sizeof *old);
	size_t n = 0, nold = 0;
	int64_t now = gfs_now_ms();
	const bson_t *doc;
	while (n < RECOVER_MAX && mongoc_cursor_next(cur, &doc)) {
		bson_iter_t id, until;
		if (!bson_iter_init_find(&id, doc, "_id"))
			continue;
		bson_value_copy(bson_iter_value(&id), &ids[n++]);
		if (!bson_iter_init_find(&until, doc, "until") || !BSON_ITER_HOLDS_DATE_TIME(&until) ||
		    bson_iter_date_time(&until) < now)
			old[nold++] = ids[n - 1];
	}
	bool ok = gfs_cursor_done(cur, "read recovered uploads", err);
	bson_destroy(&opts);
	bson_destroy(&all);
	/* Those past their time are looked at once more, then forgotten. */
	ok = ok && (n == 0 || remove_files(s, ids, n, NULL, err)) &&
	     (nold == 0 || gfs_delete_each(rec, NULL, "_id", old, nold, NULL, "forget recovered uploads", err));
	for (size_t i = 0; i < n; i++)
		bson_value_destroy(&ids[i]);
	free(ids);
	free(old);
	mongoc_collection_destroy(rec);
	return ok;
}

/*
 * Finishes one marker whose put is gone; false only on a backend error.
 * A chunk insert the dead put had in flight can still land after its
 * chunks were removed, so the marker stays, flagged, until a later pass
 * (at the end of the recovering command, or the next one) finds no chunk;
 * then the upload is remembered as recovered for what lands even later.
 * A files document found on that later pass was written over chunks that
 * are gone: it goes too.
 */
static bool
recover_marker(gfs_session *s, const bson_t *doc, size_t *removed, gfs_error *err)
{
	bson_iter_t it, lk;
	if (!bson_iter_init_find(&it, doc, "_id") || !bson_iter_init_find(&lk, doc, "lock") ||
	    !BSON_ITER_HOLDS_UTF8(&lk))
		return true;
	const bson_value_t *id = bson_iter_value(&it);
	bool flagged = bson_iter_init_find(&it, doc, GFS_RECOVERED_FIELD) && bson_iter_as_bool(&it);
	int keep = bson_iter_init_find(&it, doc, "keep") && BSON_ITER_HOLDS_NUMBER(&it)
	               ? (int)bson_iter_as_int64(&it)
	               : 0;
	const char *name = bson_iter_init_find(&it, doc, "filename") && BSON_ITER_HOLDS_UTF8(&it)
	                       ? bson_iter_utf8(&it, NULL)
	                       : NULL;
	bool given = bson_iter_init_find(&it, doc, "givenId") && bson_iter_as_bool(&it);
	gfs_lock *l = NULL;
	if (!flagged) {
		gfs_error lerr;
		l = gfs_lock_acquire(s->conn, bson_iter_utf8(&lk, NULL), 0, &lerr);
		if (!l && lerr.code == GFS_EBUSY)
			return true; /* still running */
		if (!l) {
			*err = lerr;
			return false;
		}
	}
	int64_t late = 0, files = 0;
	int has = gfs_exists(s->files, "_id", id, err);
	bool ok = has >= 0, exists = has > 0;
	if (ok && exists && !flagged) {
		/* Complete; its writer died before removing older revisions, if it was to. */
		ok = (keep <= 0 || !name || gfs_delete_old_revisions(s, name, keep, id, err)) &&
		     marker_remove(s, id, err);
	} else if (ok && !flagged) {
		ok = remove_dead_chunks(s, id, &late, err) && marker_flag(s, id, err);
		*removed += ok;
	} else if (ok) {
		ok = (!exists || gfs_delete_each(s->files, NULL, "_id", id, 1, &files,
		                                 "remove a late files document", err)) &&
		     remove_dead_chunks(s, id, &late, err);
		/* Something landed: writes of the dead may be landing still, so the next pass looks again. */
		if (ok && late + files == 0)
			ok = (given || recovered_add(s, id, err)) && marker_remove(s, id, err);
	}
	if (l)
		gfs_lock_release(l);
	return ok;
}

bool
gfs_put_recover(gfs_session *s, size_t *removed, gfs_error *err)
{
	*removed = 0;
	bson_t filter = BSON_INITIALIZER, exists, opts = BSON_INITIALIZER;
	BSON_APPEND_DOCUMENT_BEGIN(&filter, "lock", &exists);
	BSON_APPEND_BOOL(&exists, "$exists", true);
	bson_append_document_end(&filter, &exists);
	/* A deletion marker names the lock that covers it too: gfs_finish_deletions() has those. */
	BSON_APPEND_DOCUMENT_BEGIN(&filter, "deleting", &exists);
	BSON_APPEND_BOOL(&exists, "$exists", false);
	bson_append_document_end(&filter, &exists);
	BSON_APPEND_INT64(&opts, "limit", RECOVER_MAX);
	mongoc_collection_t *uploads = gfs_session_bucket_collection(s, GFS_UPLOADS_SUFFIX);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(uploads, &filter, &opts, NULL);
	/* Read them all first: recovering removes markers, and the cursor could skip some. */
	bson_t **docs = gfs_xcalloc(RECOVER_MAX, sizeof *docs);
	size_t n = 0;
	const bson_t *doc;
	while (n < RECOVER_MAX && mongoc_cursor_next(cur, &doc))
		docs[n++] = bson_copy(doc);
	bool ok = gfs_cursor_done(cur, "read upload markers", err);
	mongoc_collection_destroy(uploads);
	bson_destroy(&filter);
	bson_destroy(&opts);
	ok = ok && sweep_recovered(s, err);
	for (size_t i = 0; i < n; i++) {
		ok = ok && recover_marker(s, docs[i], removed, err);
		bson_destroy(docs[i]);
	}
	free(docs);
	/* A put killed between taking its lock and releasing it leaves a lock nobody takes again. */
	int64_t held, stale;
	return ok && gfs_lock_sweep(s, GFS_PUT_LOCK_PREFIX, true, &held, &stale, err);
}

/* Flushes the batch, recording the marker before the file's first chunk goes. */
static bool
flush_marked(gfs_chunk_batch *b, gfs_session *s, const bson_value_t *id, const gfs_put_opts *o,
             struct put_marker *m, gfs_error *err)
{
	if (!m->lock && !marker_begin(s, id, o, m, err))
		return false;
	return gfs_chunk_batch_flush(b, s, err);
}

/* True only when the backend answers that no files document has this id. */
static bool
upload_absent(gfs_session *s, const bson_value_t *id)
{
	gfs_file f;
	gfs_error err;
	if (gfs_find_by_id(s, id, &f, &err)) {
		gfs_file_free(&f);
		return false;
	}
	return err.code == GFS_ENOTFOUND;
}

/* One upload in progress: what the steps of gfs_put share. */
struct put {
	gfs_session *s;
	const gfs_put_opts *o;
	bson_value_t id;
	int32_t cs;               /* chunk size */
	struct put_marker marker;
	int64_t length;           /* bytes read from the source */
	bool wrote;               /* chunks were sent, so some may have landed */
	char sha256[65];
};

/* The caller's id, or a new ObjectId. */
static void
put_id(const gfs_put_opts *o, bson_value_t *id)
{
	if (o->id) {
		bson_value_copy(o->id, id);
		return;
	}
	memset(id, 0, sizeof *id);
	id->value_type = BSON_TYPE_OID;
	bson_oid_init(&id->value.v_oid, NULL);
}

/*
 * Reads src to its end and sends it as chunks in bulk inserts, the marker
 * recorded before the first; the length and SHA-256 read go into p.
 */
static bool
put_chunks(struct put *p, gfs_source_fn src, void *src_ctx, gfs_error *err)
{
	const gfs_put_opts *o = p->o;
	uint8_t *buf = gfs_xmalloc((size_t)p->cs);
	gfs_chunk_batch *batch = gfs_chunk_batch_new(PUT_BATCH_BYTES);
	gfs_sha256 *h = gfs_sha256_new();
	int64_t n = 0;
	bool ok = true;
	for (;;) {
		ssize_t r = src(buf, (size_t)p->cs, src_ctx);
		if (r < 0) {
			gfs_error_set(err, GFS_ELOCAL, "%s: read: %s", o->filename, strerror(errno));
			ok = false;
			break;
		}
		if (r == 0)
			break;
		if (n > INT32_MAX) {
			gfs_error_set(err, GFS_EINVAL,
			              "%s: needs more than 2147483648 chunks of %d bytes, GridFS's limit; "
			              "use a larger chunk size", o->filename, (int)p->cs);
			ok = false;
			break;
		}
		gfs_sha256_update(h, buf, (size_t)r);
		gfs_chunk_batch_add(batch, &p->id, n++, buf, (size_t)r);
		p->length += r;
		if (gfs_chunk_batch_bytes(batch) >= PUT_BATCH_BYTES ||
		    gfs_chunk_batch_count(batch) >= PUT_BATCH_DOCS) {
			p->wrote = true;
			if (!(ok = flush_marked(batch, p->s, &p->id, o, &p->marker, err)))
				break;
		}
		if (r < p->cs)
			break;
	}
	if (ok && gfs_chunk_batch_count(batch)) {
		p->wrote = true;
		ok = flush_marked(batch, p->s, &p->id, o, &p->marker, err);
	}
	gfs_sha256_final(h, p->sha256);
	gfs_chunk_batch_free(batch);
	free(buf);
	return ok;
}

/*
 * Inserts the files document, which makes the file visible; out gets it
 * parsed. o is read only now: a source may fill in content_type as it reads.
 */
static bool
put_files_doc(struct put *p, gfs_file *out, gfs_error *err)
{
	const gfs_put_opts *o = p->o;
	bson_t doc = BSON_INITIALIZER;
	gfs_files_doc(&doc, &p->id, o->filename, p->length, p->cs, gfs_now_ms(), o->content_type,
	              p->sha256, o->metadata);
	bson_error_t berr;
	bool ok = mongoc_collection_insert_one(p->s->files, &doc, NULL, NULL, &berr);
	if (!ok)
		gfs_error_from_bson(err, &berr, "insert files document");
	else if (out)
		ok = gfs_file_parse(&doc, out, err);
	bson_destroy(&doc);
	return ok;
}

bool
gfs_put(gfs_session *s, const gfs_put_opts *o, gfs_source_fn src, void *src_ctx, gfs_file *out,
        gfs_error *err)
{
	if (!o->filename) {
		gfs_error_set(err, GFS_EINVAL, "a filename is required");
		return false;
	}
	struct put p = {.s = s, .o = o};
	p.cs = o->chunk_size > 0 ? o->chunk_size : GFS_DEFAULT_CHUNK_SIZE;
	put_id(o, &p.id);
	if (!gfs_ensure_indexes(s, err)) {
		bson_value_destroy(&p.id);
		return false;
	}
	bool ok = put_chunks(&p, src, src_ctx, err);
	/* Past its lease, a recovery may have taken our chunks for a dead put's. */
	if (ok && gfs_lock_lost(p.marker.lock)) {
		gfs_error_set(err, GFS_EBACKEND, "%s: the upload's lock was lost (backend unreachable "
		              "for too long); nothing stored", o->filename);
		ok = false;
	}
	/* An empty file sends no chunk, but the trim its caller does next needs the marker too. */
	if (ok && o->keep_revisions > 0 && !p.marker.lock)
		ok = marker_begin(s, &p.id, o, &p.marker, err);
	bool doc_tried = ok;
	if (ok)
		ok = put_files_doc(&p, out, err);
	/*
	 * The spec cleans up after an abort only and leaves chunks behind when an
	 * insert fails, since a write that failed on the wire may have been
	 * applied. Ours are safe to remove when their files_id is a new ObjectId
	 * (no opts->id): no other file has it, so only this upload's chunks go;
	 * a given id may be another file's, whose chunks made ours fail. Once
	 * the files document was sent it may have landed, and then the chunks
	 * are a complete file: they go only when a lookup shows no such document.
	 */
	bool drop = !ok && p.wrote && !o->id && (!doc_tried || upload_absent(s, &p.id)) &&
	            remove_chunks(s, &p.id);
	/*
	 * Chunks kept for want of an answer stay marked: the next put's recovery
	 * looks again. A stored file's marker stays for its caller's trim.
	 */
	marker_end(s, &p.id, &p.marker, ok ? o->keep_revisions <= 0 : !p.wrote || drop);
	bson_value_destroy(&p.id);
	return ok;
}

bool
gfs_put_trimmed(gfs_session *s, const bson_value_t *id, gfs_error *err)
{
	return marker_remove(s, id, err);
}

/* ---- removals ---------------------------------------------------------- */

/*
 * GridFS removes a file in two writes, its files document first so that no
 * reader meets a file whose chunks are going. A writer killed between the
 * two leaves chunks that nothing names any more, and no later run could
 * tell them from others' uploads in progress. So the ids go first into a
 * deletion marker {_id, deleting: [ids], started, owner fields, lock} beside
 * the upload markers; gfs_finish_deletions() completes it once its writer
 * is gone, or at once for whoever holds the lock it names. The ids were
 * decided before the marker was written, so finishing a removal is never
 * wrong; it waits for the writer only so that a live one does not find its
 * files gone and report them missing.
 */
#define DELETE_BATCH 500

static bool
delete_batch(gfs_session *s, mongoc_collection_t *uploads, const bson_value_t *ids, size_t n,
             const char *lock, int64_t *files, gfs_error *err)
{
	bson_t doc = BSON_INITIALIZER;
	bson_value_t mid = {.value_type = BSON_TYPE_OID};
	bson_oid_init(&mid.value.v_oid, NULL);
	BSON_APPEND_VALUE(&doc, "_id", &mid);
	gfs_append_values(&doc, "deleting", ids, n);
	BSON_APPEND_DATE_TIME(&doc, "started", gfs_now_ms());
	gfs_owner_append(&doc);
	if (lock)
		BSON_APPEND_UTF8(&doc, "lock", lock);
	bson_error_t berr;
	bool ok = mongoc_collection_insert_one(uploads, &doc, NULL, NULL, &berr);
	bson_destroy(&doc);
	if (!ok) {
		gfs_error_from_bson(err, &berr, "insert deletion marker");
		return false;
	}
	/* On a failure the marker stays: the removal was decided, and recovery completes it. */
	return remove_files(s, ids, n, files, err) &&
	       gfs_delete_each(uploads, NULL, "_id", &mid, 1, NULL, "remove deletion marker", err);
}

bool
gfs_delete_many(gfs_session *s, const bson_value_t *ids, size_t n, const char *lock,
                int64_t *files, gfs_error *err)
{
	mongoc_collection_t *uploads = gfs_session_bucket_collection(s, GFS_UPLOADS_SUFFIX);
	int64_t total = 0;
	bool ok = true;
	for (size_t i = 0; ok && i < n; i += DELETE_BATCH) {
		int64_t got = 0;
		ok = delete_batch(s, uploads, ids + i, n - i < DELETE_BATCH ? n - i : DELETE_BATCH, lock,
		                  &got, err);
		total += got;
	}
	mongoc_collection_destroy(uploads);
	if (files)
		*files = total;
	return ok;
}

bool
gfs_delete(gfs_session *s, const bson_value_t *id, gfs_error *err)
{
	int64_t files = 0;
	if (!gfs_delete_many(s, id, 1, NULL, &files, err))
		return false;
	if (files == 0) {
		char *ids = gfs_id_string(id);
		gfs_error_set(err, GFS_ENOTFOUND, "id %s: no such file", ids);
		free(ids);
		return false;
	}
	return true;
}

/*
 * A marker whose writer is gone, or older than any live writer's could be,
 * or one covered by the lock we hold (held, may be NULL), whose writer
 * would hold it if it were alive.
 */
static bool
deletion_abandoned(const bson_t *doc, const char *held)
{
	bson_iter_t it;
	if (held && bson_iter_init_find(&it, doc, "lock") && BSON_ITER_HOLDS_UTF8(&it) &&
	    gfs_lock_excludes(held, bson_iter_utf8(&it, NULL)))
		return true;
	/* Before markers named their writer, only imports wrote them. */
	if (!bson_iter_init_find(&it, doc, "pid"))
		return held && strcmp(held, GFS_IMPORT_LOCK) == 0;
	if (gfs_owner_gone(doc))
		return true;
	int64_t started = bson_iter_init_find(&it, doc, "started") && BSON_ITER_HOLDS_DATE_TIME(&it)
	                      ? bson_iter_date_time(&it)
	                      : 0;
	return started < gfs_now_ms() - (int64_t)GFS_LOCK_DEFAULT_TTL * 1000;
}

/* Completes the removal one deletion marker records, then removes the marker. */
static bool
finish_deletion(gfs_session *s, mongoc_collection_t *uploads, const bson_t *doc, size_t *files,
                gfs_error *err)
{
	bson_iter_t it, arr;
	if (!bson_iter_init_find(&it, doc, "_id"))
		return true;
	bson_value_t mid;
	bson_value_copy(bson_iter_value(&it), &mid);
	bson_value_t *ids = NULL;
	size_t n = 0, cap = 0;
	if (bson_iter_init_find(&it, doc, "deleting") && BSON_ITER_HOLDS_ARRAY(&it) &&
	    bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			GFS_GROW(ids, n + 1, cap, 16);
			bson_value_copy(bson_iter_value(&arr), &ids[n++]);
		}
	}
	bool ok = true;
	for (size_t i = 0; ok && i < n; i += DELETE_BATCH)
		ok = remove_files(s, ids + i, n - i < DELETE_BATCH ? n - i : DELETE_BATCH, NULL, err);
	ok = ok && gfs_delete_each(uploads, NULL, "_id", &mid, 1, NULL, "remove deletion marker", err);
	if (ok)
		*files += n;
	for (size_t i = 0; i < n; i++)
		bson_value_destroy(&ids[i]);
	free(ids);
	bson_value_destroy(&mid);
	return ok;
}

bool
gfs_finish_deletions(gfs_session *s, const char *held, size_t *files, gfs_error *err)
{
	*files = 0;
	bson_t filter = BSON_INITIALIZER, exists;
	BSON_APPEND_DOCUMENT_BEGIN(&filter, "deleting", &exists);
	BSON_APPEND_BOOL(&exists, "$exists", true);
	bson_append_document_end(&filter, &exists);
	mongoc_collection_t *uploads = gfs_session_bucket_collection(s, GFS_UPLOADS_SUFFIX);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(uploads, &filter, NULL, NULL);
	bson_destroy(&filter);
	/* Few (one per writer at most): read them all before removing any. */
	bson_t **docs = NULL;
	size_t n = 0, cap = 0;
	const bson_t *doc;
	while (mongoc_cursor_next(cur, &doc)) {
		if (!deletion_abandoned(doc, held))
			continue;
		GFS_GROW(docs, n + 1, cap, 8);
		docs[n++] = bson_copy(doc);
	}
	bool ok = gfs_cursor_done(cur, "read deletion markers", err);
	for (size_t i = 0; i < n; i++) {
		ok = ok && finish_deletion(s, uploads, docs[i], files, err);
		bson_destroy(docs[i]);
	}
	free(docs);
	mongoc_collection_destroy(uploads);
	return ok;
}

/* ---- what markers say, for reports ---------------------------------- */

int
gfs_marker_find(gfs_session *s, const bson_value_t *fid, bson_t *out, gfs_error *err)
{
	static const char *const fields[] = {"_id", "deleting"};
	mongoc_collection_t *uploads = gfs_session_bucket_collection(s, GFS_UPLOADS_SUFFIX);
	int rc = 0;
	for (size_t i = 0; rc == 0 && i < sizeof fields / sizeof fields[0]; i++) {
		bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER;
		gfs_id_filter(&filter, fields[i], fid);
		BSON_APPEND_INT64(&opts, "limit", 1);
		mongoc_cursor_t *cur = mongoc_collection_find_with_opts(uploads, &filter, &opts, NULL);
		const bson_t *doc;
		if (mongoc_cursor_next(cur, &doc)) {
			bson_copy_to(doc, out);
			rc = 1;
		}
		if (!gfs_cursor_done(cur, "look up a marker", err)) {
			if (rc > 0)
				bson_destroy(out);
			rc = -1;
		}
		bson_destroy(&filter);
		bson_destroy(&opts);
	}
	mongoc_collection_destroy(uploads);
	return rc;
}

static const char *
marker_lock(const bson_t *m)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, m, "lock") && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL)
	                                                                       : NULL;
}

/*
 * Under the import lock: an import's upload, or its removal (named so, or
 * from before markers named their writer).
 */
static bool
import_marker(const bson_t *m)
{
	const char *lock = marker_lock(m);
	if (!bson_has_field(m, "deleting"))
		return !lock;
	return lock ? gfs_lock_of_family(lock, GFS_IMPORT_LOCK) : !bson_has_field(m, "pid");
}

int
gfs_marker_live(gfs_session *s, const bson_t *m, const char *held, gfs_error *err)
{
	/* A removal whose writer named itself: finished by the rule gfs_finish_deletions() applies. */
	if (bson_has_field(m, "deleting") && bson_has_field(m, "pid"))
		return !deletion_abandoned(m, held);
	/* An import's upload names the lock of its prefix in "scope"; before prefixes, none. */
	const char *lock = marker_lock(m);
	bson_iter_t it;
	if (!lock && bson_iter_init_find(&it, m, GFS_SCOPE_FIELD) && BSON_ITER_HOLDS_UTF8(&it))
		lock = bson_iter_utf8(&it, NULL);
	if (!lock)
		lock = GFS_IMPORT_LOCK;
	if (held && gfs_lock_excludes(held, lock))
		return 0;
	return gfs_lock_held(s, lock, err);
}

const char *
gfs_marker_verb(const bson_t *m)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, m, "verb") && BSON_ITER_HOLDS_UTF8(&it) && *bson_iter_utf8(&it, NULL))
		return bson_iter_utf8(&it, NULL);
	if (import_marker(m))
		return "import";
	return bson_has_field(m, "deleting") ? "command" : "put";
}

void
gfs_marker_left_by(const bson_t *m, char *buf, size_t len)
{
	bool removal = bson_has_field(m, "deleting"), import = import_marker(m);
	const char *next = removal ? import ? "import or verify --repair finishes its removal"
	                                    : "rm, put, import or verify --repair finishes its removal"
	                           : import ? "import removes them"
	                                    : "put, rm, import or verify --repair removes them";
	snprintf(buf, len, "left by an interrupted %s (the next %s)", gfs_marker_verb(m), next);
}

/*
 * Which revisions go, newest first: ranks alone cannot be trusted, since
 * another writer's clock may be ahead of ours or tie to the millisecond.
 * So keep_id is never among them, counts as one of the keep, and what
 * sorts before it (a later write, or a later date) is not ours to remove.
 * A trim (keep > 0) passes over malformed revisions: they are problems to
 * report (ls, verify), neither kept as a revision nor removed unseen.
 */
bool
gfs_find_old_revisions(gfs_session *s, const char *name, int keep, const bson_value_t *keep_id,
                       bson_value_t **out, size_t *nout, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, sort, proj;
	BSON_APPEND_UTF8(&filter, "filename", name);
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &sort);
	BSON_APPEND_INT32(&sort, "uploadDate", -1);
	BSON_APPEND_INT32(&sort, "_id", -1);
	bson_append_document_end(&opts, &sort);
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "projection", &proj);
	BSON_APPEND_INT32(&proj, "_id", 1);
	BSON_APPEND_INT32(&proj, "length", 1);
	BSON_APPEND_INT32(&proj, "chunkSize", 1);
	bson_append_document_end(&opts, &proj);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(s->files, &filter, &opts, NULL);
	bson_destroy(&filter);
	bson_destroy(&opts);

	bson_value_t *ids = NULL;
	size_t count = 0, cap = 0;
	int kept = 0;
	bool passed = keep_id == NULL;
	const bson_t *doc;
	while (mongoc_cursor_next(cur, &doc)) {
		bson_iter_t it;
		gfs_error why;
		if (!bson_iter_init_find(&it, doc, "_id") || (keep > 0 && gfs_doc_malformed(doc, &why)))
			continue;
		if (keep_id && gfs_id_equal(bson_iter_value(&it), keep_id)) {
			passed = true;
			kept++;
			continue;
		}
		if (!passed)
			continue;
		if (kept < keep) {
			kept++;
			continue;
		}
		GFS_GROW(ids, count + 1, cap, 8);
		bson_value_copy(bson_iter_value(&it), &ids[count++]);
	}
	bool ok = gfs_cursor_done(cur, "find old revisions", err);
	*out = ids;
	*nout = count;
	return ok;
}

bool
gfs_delete_old_revisions(gfs_session *s, const char *name, int keep, const bson_value_t *keep_id,
                         gfs_error *err)
{
	bson_value_t *ids;
	size_t count;
	/* Collect first: deleting while the cursor is open could make it skip or repeat. */
	bool ok = gfs_find_old_revisions(s, name, keep < 1 ? 1 : keep, keep_id, &ids, &count, err);
	ok = ok && gfs_delete_many(s, ids, count, NULL, NULL, err);
	for (size_t i = 0; i < count; i++)
		bson_value_destroy(&ids[i]);
	free(ids);
	return ok;
}

bool
gfs_rename(gfs_session *s, const bson_value_t *id, const char *new_name, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, update = BSON_INITIALIZER, set, reply;
	gfs_id_filter(&filter, "_id", id);
	BSON_APPEND_DOCUMENT_BEGIN(&update, "$set", &set);
	BSON_APPEND_UTF8(&set, "filename", new_name);
	bson_append_document_end(&update, &set);
	/* The raw bytes spelled the old name: kept, mirror would refuse the new one. */
	BSON_APPEND_DOCUMENT_BEGIN(&update, "$unset", &set);
	BSON_APPEND_UTF8(&set, "metadata." GFS_RAWNAME_FIELD, "");
	bson_append_document_end(&update, &set);
	bson_error_t berr;
	bool ok = mongoc_collection_update_one(s->files, &filter, &update, NULL, &reply, &berr);
	if (!ok) {
		gfs_error_from_bson(err, &berr, "rename");
	} else {
		bson_iter_t it;
		if (bson_iter_init_find(&it, &reply, "matchedCount") && bson_iter_as_int64(&it) == 0) {
			char *ids = gfs_id_string(id);
			gfs_error_set(err, GFS_ENOTFOUND, "id %s: no such file", ids);
			free(ids);
			ok = false;
		}
	}
	bson_destroy(&filter);
	bson_destroy(&update);
	bson_destroy(&reply);
	return ok;
}
