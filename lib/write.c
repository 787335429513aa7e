/*
 * Writing and renaming files, chunks first as the spec requires. A put
 * records its upload marker (lib/markers.h) before its first chunk;
 * removals, which record a deletion marker first, are in lib/markers.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gfs.h"
#include "lock.h"
#include "markers.h"
#include "filename.h"

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

/* Flushes the batch, recording the marker before the file's first chunk goes. */
static bool
flush_marked(gfs_chunk_batch *b, gfs_session *s, const bson_value_t *id, const gfs_put_opts *o,
             struct gfs_put_marker *m, gfs_error *err)
{
	if (!m->lock && !gfs_put_marker_begin(s, id, o, m, err))
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
	struct gfs_put_marker marker;
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
		ok = gfs_put_marker_begin(s, &p.id, o, &p.marker, err);
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
	gfs_put_marker_end(s, &p.id, &p.marker, ok ? o->keep_revisions <= 0 : !p.wrote || drop);
	bson_value_destroy(&p.id);
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
