/* Streaming a file's chunks in order, checking each against the files document. */
#include <string.h>

#include "gfs.h"

/* Batches stay near 8 MiB: far under the 16 MiB reply limit and the 48 MB message limit. */
#define CHUNK_BATCH_BYTES (8 * 1024 * 1024)

int32_t
gfs_chunk_batch_size(int32_t chunk_size)
{
	if (chunk_size <= 0)
		return 1;
	int32_t n = CHUNK_BATCH_BYTES / chunk_size;
	return n < 1 ? 1 : n > 1000 ? 1000 : n;
}

bool
gfs_cursor_done(mongoc_cursor_t *cur, const char *what, gfs_error *err)
{
	bson_error_t berr;
	bool ok = !mongoc_cursor_error(cur, &berr);
	if (!ok)
		gfs_error_from_bson(err, &berr, what);
	mongoc_cursor_destroy(cur);
	return ok;
}

struct read_state {
	const gfs_file *f;
	const char *name;
	int64_t expected;     /* chunk count */
	int64_t next;         /* the n we want next */
};

static bool
check_chunk(struct read_state *st, const bson_t *doc, const uint8_t **data, uint32_t *len,
            gfs_error *err)
{
	bson_iter_t it;
	int64_t n;
	if (!gfs_chunk_n(doc, &n)) {
		gfs_error_set(err, GFS_EBADDOC, "%s: chunk without a valid n", st->name);
		return false;
	}
	if (n < st->next || n >= st->expected) {
		gfs_error_set(err, GFS_EEXTRACHUNK, "%s: extra chunk n=%lld (expected %lld chunks)",
		              st->name, (long long)n, (long long)st->expected);
		return false;
	}
	if (n > st->next) {
		gfs_error_set(err, GFS_EMISSINGCHUNK, "%s: missing chunk n=%lld", st->name,
		              (long long)st->next);
		return false;
	}
	bson_subtype_t sub;
	if (!bson_iter_init_find(&it, doc, "data") || !BSON_ITER_HOLDS_BINARY(&it)) {
		gfs_error_set(err, GFS_EBADDOC, "%s: chunk n=%lld has no binary data", st->name,
		              (long long)n);
		return false;
	}
	bson_iter_binary(&it, &sub, len, data);
	int32_t want = gfs_chunk_expected_len(st->f->length, st->f->chunk_size, n);
	if ((int64_t)*len != want) {
		gfs_error_set(err, GFS_EWRONGSIZE, "%s: chunk n=%lld has %u bytes, expected %d",
		              st->name, (long long)n, *len, want);
		return false;
	}
	st->next++;
	return true;
}

/* Reads the chunks in order into fn and d; false with err set on any fault. */
static bool
read_chunks(gfs_session *s, struct read_state *st, gfs_digest *d, gfs_data_fn fn, void *ctx,
            gfs_error *err)
{
	const gfs_file *f = st->f;
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, sort;
	gfs_id_filter(&filter, "files_id", &f->id);
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &sort);
	BSON_APPEND_INT32(&sort, "n", 1);
	bson_append_document_end(&opts, &sort);
	BSON_APPEND_INT32(&opts, "batchSize", gfs_chunk_batch_size(f->chunk_size));
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(s->chunks, &filter, &opts, NULL);
	bson_destroy(&filter);
	bson_destroy(&opts);

	const bson_t *doc;
	bool ok = true;
	while (ok && mongoc_cursor_next(cur, &doc)) {
		const uint8_t *data;
		uint32_t len;
		ok = check_chunk(st, doc, &data, &len, err);
		if (!ok)
			break;
		gfs_digest_update(d, data, len);
		if (fn && !fn(data, len, ctx)) {
			gfs_error_set(err, GFS_ECANCELED, "%s: read stopped", st->name);
			ok = false;
		}
	}
	if (!gfs_cursor_done(cur, "read chunks", err))
		ok = false;
	if (ok && st->next < st->expected) {
		gfs_error_set(err, GFS_EMISSINGCHUNK, "%s: missing chunk n=%lld", st->name,
		              (long long)st->next);
		ok = false;
	}
	return ok;
}

bool
gfs_read(gfs_session *s, const gfs_file *f, bool verify_hash, gfs_data_fn fn, void *ctx,
         char *sha256_out, gfs_error *err)
{
	struct read_state st = {
		.f = f,
		.name = f->filename ? f->filename : "(unnamed)",
		.expected = gfs_chunk_count(f->length, f->chunk_size),
		.next = 0,
	};
	gfs_digest *d = gfs_digest_new(f);
	/* The spec: a zero-length file MUST NOT query the chunks collection. */
	bool ok = f->length == 0 || read_chunks(s, &st, d, fn, ctx, err);
	char hex[65], md5[33];
	gfs_digest_final(d, hex, md5);
	if (ok && verify_hash)
		ok = gfs_integrity_check(f, hex, md5, err);
	if (sha256_out)
		memcpy(sha256_out, hex, 65);
	return ok;
}
