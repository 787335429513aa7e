/* Streaming a file's chunks in order of n, checking each against the files document. */
#include <stdlib.h>
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

enum gfs_n_place
gfs_chunk_n_place(const bson_t *doc, int64_t *n)
{
	bson_iter_t it;
	if (gfs_chunk_n(doc, n))
		return GFS_N_NUMBER;
	*n = -1;
	if (!bson_iter_init_find(&it, doc, "n"))
		return GFS_N_BEFORE;
	bson_type_t t = bson_iter_type(&it);
	return t == BSON_TYPE_NULL || t == BSON_TYPE_UNDEFINED || t == BSON_TYPE_MINKEY
	           ? GFS_N_BEFORE
	           : GFS_N_AFTER;
}

size_t
gfs_held_put(gfs_held **list, const bson_t *doc, int64_t n)
{
	gfs_held *h = gfs_xcalloc(1, sizeof *h);
	h->doc = bson_copy(doc);
	h->n = n;
	while (*list && (*list)->n <= n)
		list = &(*list)->next;
	h->next = *list;
	*list = h;
	return doc->len;
}

bson_t *
gfs_held_take(gfs_held **list, int64_t upto)
{
	gfs_held *h = *list;
	if (!h || h->n > upto)
		return NULL;
	*list = h->next;
	bson_t *doc = h->doc;
	free(h);
	return doc;
}

bool
gfs_held_has(const gfs_held *list, int64_t n)
{
	for (; list && list->n <= n; list = list->next)
		if (list->n == n)
			return true;
	return false;
}

size_t
gfs_held_free(gfs_held **list)
{
	size_t bytes = 0;
	for (gfs_held *h = *list, *nx; h; h = nx) {
		nx = h->next;
		bytes += h->doc->len;
		bson_destroy(h->doc);
		free(h);
	}
	*list = NULL;
	return bytes;
}

/* Bytes of one file's chunks held before their turn; past it they are read again by n. */
#define READ_HOLD_BYTES (16 * 1024 * 1024)

struct read_state {
	const gfs_file *f;
	const char *name;
	int64_t expected;     /* chunk count */
	int64_t next;         /* the n we want next */
	gfs_held *held;       /* chunks before their turn */
	size_t held_bytes;
	int64_t *later;       /* numbers of chunks not held (over the bound), sorted, to read by n */
	size_t nlater, later_cap;
	/* The first fault a read sorted by n meets, of those found out of turn. */
	bool faulty;
	int64_t fault_at;     /* it stops the read once next passes it */
	gfs_error fault;
	gfs_session *s;
	gfs_digest *d;
	gfs_data_fn fn;
	void *ctx;
};

bool
gfs_chunk_data(const bson_t *doc, int64_t length, int32_t chunk_size, int64_t n,
               const char *name, const uint8_t **data, uint32_t *len, gfs_error *err)
{
	bson_iter_t it;
	bson_subtype_t sub;
	if (!bson_iter_init_find(&it, doc, "data") || !BSON_ITER_HOLDS_BINARY(&it)) {
		gfs_error_set(err, GFS_EBADDOC, "%s: chunk n=%lld has no binary data", name,
		              (long long)n);
		return -1;
	}
	bson_iter_binary(&it, &sub, len, data);
	int32_t want = gfs_chunk_expected_len(length, chunk_size, n);
	if ((int64_t)*len != want) {
		gfs_error_set(err, GFS_EWRONGSIZE, "%s: chunk n=%lld has %u bytes, expected %d", name,
		              (long long)n, *len, want);
		return false;
	}
	return true;
}

/* The checks of a chunk whose turn it is, then its data on its way; false with err on a fault. */
static bool
deliver(struct read_state *st, const bson_t *doc, gfs_error *err)
{
	const uint8_t *data;
	uint32_t len;
	if (!gfs_chunk_data(doc, st->f->length, st->f->chunk_size, st->next, st->name, &data, &len,
	                    err))
		return false;
	st->next++;
	/* libbson gives an empty binary a NULL pointer; callbacks memcpy from it. */
	static const uint8_t none[1];
	if (!data)
		data = none;
	gfs_digest_update(st->d, data, len);
	if (st->fn && !st->fn(data, len, st->ctx)) {
		gfs_error_set(err, GFS_ECANCELED, "%s: read stopped", st->name);
		return false;
	}
	return true;
}

/* A fault found out of turn: kept when a sorted read would meet it before the one kept. */
static void
fault(struct read_state *st, int64_t at, int code, const char *what, int64_t n)
{
	if (st->faulty && st->fault_at <= at)
		return;
	st->faulty = true;
	st->fault_at = at;
	if (code == GFS_EBADDOC)
		gfs_error_set(&st->fault, code, "%s: chunk without a valid n", st->name);
	else
		gfs_error_set(&st->fault, code, "%s: %s chunk n=%lld (expected %lld chunks)", st->name,
		              what, (long long)n, (long long)st->expected);
}

/* False with err when a fault found out of turn comes before the next chunk. */
static bool
fault_due(struct read_state *st, gfs_error *err)
{
	if (!st->faulty || st->fault_at >= st->next)
		return true;
	*err = st->fault;
	return false;
}

static size_t
later_index(const struct read_state *st, int64_t n)
{
	size_t lo = 0, hi = st->nlater;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (st->later[mid] < n)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static bool
is_later(const struct read_state *st, int64_t n)
{
	size_t i = later_index(st, n);
	return i < st->nlater && st->later[i] == n;
}

static void
add_later(struct read_state *st, int64_t n)
{
	size_t i = later_index(st, n);
	GFS_GROW(st->later, st->nlater + 1, st->later_cap, 16);
	memmove(st->later + i + 1, st->later + i, (st->nlater - i) * sizeof *st->later);
	st->later[i] = n;
	st->nlater++;
}

/* Delivers the held chunks whose turn has come. */
static bool
deliver_held(struct read_state *st, gfs_error *err)
{
	bson_t *doc;
	while ((doc = gfs_held_take(&st->held, st->next)) != NULL) {
		st->held_bytes -= doc->len;
		bool ok = deliver(st, doc, err) && fault_due(st, err);
		bson_destroy(doc);
		if (!ok)
			return false;
	}
	return true;
}

/* One chunk as the server sent it: delivered in its turn, held, or left for later. */
static bool
arrive(struct read_state *st, const bson_t *doc, gfs_error *err)
{
	int64_t n;
	enum gfs_n_place place = gfs_chunk_n_place(doc, &n);
	if (place != GFS_N_NUMBER) {
		fault(st, place == GFS_N_BEFORE ? INT64_MIN : INT64_MAX, GFS_EBADDOC, NULL, -1);
		return fault_due(st, err);
	}
	if (n < st->next || n >= st->expected || gfs_held_has(st->held, n) || is_later(st, n)) {
		/* A second copy sorts right after the first: due once the first is delivered. */
		fault(st, n, GFS_EEXTRACHUNK, "extra", n);
		return fault_due(st, err);
	}
	if (n > st->next) {
		if (st->held_bytes + doc->len <= READ_HOLD_BYTES)
			st->held_bytes += gfs_held_put(&st->held, doc, n);
		else
			add_later(st, n);
		return true;
	}
	return deliver(st, doc, err) && fault_due(st, err) && deliver_held(st, err);
}

int
gfs_chunk_by_n(gfs_session *s, const bson_value_t *files_id, int64_t n, const char *name,
               bson_t **doc, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER;
	gfs_id_filter(&filter, "files_id", files_id);
	BSON_APPEND_INT64(&filter, "n", n);
	BSON_APPEND_INT32(&opts, "batchSize", 2);
	mongoc_cursor_t *cur = gfs_session_find(s, s->chunks, &filter, &opts);
	bson_destroy(&filter);
	bson_destroy(&opts);
	const bson_t *found;
	*doc = NULL;
	if (mongoc_cursor_next(cur, &found))
		*doc = bson_copy(found);
	bool two = *doc && mongoc_cursor_next(cur, &found);
	if (!gfs_cursor_done(cur, "read a chunk", err) || two) {
		if (two)
			gfs_error_set(err, GFS_EEXTRACHUNK, "%s: extra chunk n=%lld (a second copy)", name,
			              (long long)n);
		if (*doc)
			bson_destroy(*doc);
		*doc = NULL;
		return -1;
	}
	return *doc ? 1 : 0;
}

/* Reads chunk n of the file by {files_id, n} equality and delivers it; none is a missing chunk. */
static bool
deliver_by_n(struct read_state *st, int64_t n, gfs_error *err)
{
	bson_t *doc;
	int rc = gfs_chunk_by_n(st->s, &st->f->id, n, st->name, &doc, err);
	if (rc == 0)
		gfs_error_set(err, GFS_EMISSINGCHUNK, "%s: missing chunk n=%lld", st->name,
		              (long long)n);
	if (rc <= 0)
		return false;
	bool ok = deliver(st, doc, err);
	bson_destroy(doc);
	return ok;
}

/* After the cursor: the held chunks and those left for later, in turn, then what is missing. */
static bool
finish(struct read_state *st, gfs_error *err)
{
	while (st->next < st->expected) {
		if (!fault_due(st, err) || !deliver_held(st, err))
			return false;
		if (st->next >= st->expected)
			break;
		if (!is_later(st, st->next)) {
			gfs_error_set(err, GFS_EMISSINGCHUNK, "%s: missing chunk n=%lld", st->name,
			              (long long)st->next);
			return false;
		}
		if (!deliver_by_n(st, st->next, err))
			return false;
	}
	if (st->faulty) {
		*err = st->fault;
		return false;
	}
	return true;
}

/* Reads the chunks by files_id, no sort, into fn and d in order of n; false with err on any fault. */
static bool
read_chunks(struct read_state *st, gfs_error *err)
{
	const gfs_file *f = st->f;
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER;
	gfs_id_filter(&filter, "files_id", &f->id);
	/* An empty file has no chunk: one found is extra, and one is enough to say so. */
	if (st->expected == 0)
		BSON_APPEND_INT64(&opts, "limit", 1);
	else
		BSON_APPEND_INT32(&opts, "batchSize", gfs_chunk_batch_size(f->chunk_size));
	mongoc_cursor_t *cur = gfs_session_find(st->s, st->s->chunks, &filter, &opts);
	bson_destroy(&filter);
	bson_destroy(&opts);

	const bson_t *doc;
	bool ok = true;
	while (ok && mongoc_cursor_next(cur, &doc))
		ok = arrive(st, doc, err);
	if (!gfs_cursor_done(cur, "read chunks", err))
		ok = false;
	if (ok)
		ok = finish(st, err);
	gfs_held_free(&st->held);
	free(st->later);
	return ok;
}

bool
gfs_read(gfs_session *s, const gfs_file *f, bool verify_hash, gfs_data_fn fn, void *ctx,
         char *sha256_out, gfs_error *err)
{
	gfs_digest *d = gfs_digest_new(f);
	struct read_state st = {
		.f = f,
		.name = f->filename ? f->filename : "(unnamed)",
		.expected = gfs_chunk_count(f->length, f->chunk_size),
		.s = s,
		.d = d,
		.fn = fn,
		.ctx = ctx,
	};
	/*
	 * An empty file's chunks are queried too (limit 1), though the spec
	 * lets readers skip them: a stray chunk is extra, damage to every reader.
	 */
	bool ok = read_chunks(&st, err);
	char hex[65], md5[33];
	gfs_digest_final(d, hex, md5);
	if (ok && verify_hash)
		ok = gfs_integrity_check(f, hex, md5, err);
	if (sha256_out)
		memcpy(sha256_out, hex, 65);
	return ok;
}

bool
gfs_read_on_primary(gfs_session *s, const gfs_file *f, gfs_data_fn fn, void *ctx, gfs_error *err)
{
	gfs_session *p = gfs_session_primary(s, err);
	bool ok = p && gfs_read(p, f, true, fn, ctx, NULL, err);
	gfs_session_push(p);
	return ok;
}
