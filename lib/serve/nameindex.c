/* serve's name index: newest revision per filename, swapped whole on reload. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "httpparse.h"
#include "nameindex.h"
#include "revledger.h"
#include "../strmap.h"

struct name_index {
	pthread_rwlock_t lock;
	char *prefix;
	strmap *by_name;     /* filename -> gfs_meta (one reference held by the map) */
	strmap *by_id;       /* key -> the same gfs_meta (no extra reference) */
	int64_t since_ms;    /* wall clock when the last successful load or poll began */
	gfs_rev_ledger *ledger; /* every document loads and polls saw: removals (the poller's own) */
	strmap *recent;      /* names the last poll found new revisions of (the poller's own) */
	atomic_bool loaded;
	_Atomic int64_t fresh_ms;
};

/* An entity tag safe to quote: printable ASCII without quotes or backslashes. */
static bool
tag_safe(const char *s, size_t max)
{
	size_t n = 0;
	for (; s[n]; n++)
		if (n >= max || s[n] <= ' ' || s[n] > '~' || s[n] == '"' || s[n] == '\\')
			return false;
	return true;
}

static void
make_etag(gfs_meta *m, const char *md5)
{
	if (m->sha256[0]) {
		snprintf(m->etag, sizeof m->etag, "\"%s\"", m->sha256);
		return;
	}
	if (md5[0]) {
		snprintf(m->etag, sizeof m->etag, "\"%s\"", md5);
		return;
	}
	/* A revision's content never changes, so its id and upload time name it. */
	if (tag_safe(m->key, 48)) {
		snprintf(m->etag, sizeof m->etag, "\"%s-%llx\"", m->key, (unsigned long long)m->upload_ms);
		return;
	}
	char hex[65];
	gfs_sha256 *h = gfs_sha256_new();
	gfs_sha256_update(h, m->key, strlen(m->key));
	gfs_sha256_final(h, hex);
	snprintf(m->etag, sizeof m->etag, "\"%.40s-%llx\"", hex, (unsigned long long)m->upload_ms);
}

char *
gfs_meta_key(const bson_value_t *id)
{
	char *text = gfs_id_string(id);
	if (!text || id->value_type == BSON_TYPE_OID)
		return text;
	size_t n = strlen(text) + 8;
	char *key = gfs_xmalloc(n);
	snprintf(key, n, "~%02x:%s", (unsigned)id->value_type, text);
	free(text);
	return key;
}

/*
 * One _id can name different content over time (deleted, then uploaded
 * again with the same id), so the cache key names the content as well: a
 * body cached for the old file is never sent under the new one's headers.
 */
static char *
make_cache_key(const gfs_meta *m)
{
	size_t n = strlen(m->key) + strlen(m->etag) + 32;
	char *key = gfs_xmalloc(n);
	snprintf(key, n, "%s %lld %s", m->key, (long long)m->length, m->etag);
	return key;
}

gfs_meta *
gfs_meta_from_file(const gfs_file *f)
{
	gfs_meta *m = gfs_xcalloc(1, sizeof *m);
	atomic_init(&m->refs, 1);
	m->name = f->filename ? gfs_xstrdup(f->filename) : NULL;
	m->key = gfs_meta_key(&f->id);
	if (!m->key)
		abort();
	bson_value_copy(&f->id, &m->id);
	m->length = f->length;
	m->chunk_size = f->chunk_size;
	m->upload_ms = f->upload_date;
	memcpy(m->sha256, f->sha256, sizeof m->sha256);
	memcpy(m->md5, f->md5, sizeof m->md5);
	memcpy(m->bad_hash, f->bad_hash, sizeof m->bad_hash);
	/* A stored type with a control byte cannot be sent (nor must it forge a header): guess. */
	m->content_type = gfs_xstrdup(http_header_value_ok(f->content_type) ? f->content_type
	                                                                    : http_type_by_ext(f->filename));
	make_etag(m, f->md5);
	m->cache_key = make_cache_key(m);
	int64_t secs = f->upload_date >= 0 ? f->upload_date / 1000 : 0;
	http_date_format(secs, m->last_modified);
	return m;
}

gfs_meta *
gfs_meta_ref(gfs_meta *m)
{
	if (m)
		atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
	return m;
}

void
gfs_meta_unref(gfs_meta *m)
{
	if (!m || atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) != 1)
		return;
	free(m->name);
	free(m->key);
	free(m->cache_key);
	bson_value_destroy(&m->id);
	free(m->content_type);
	free(m->bad);
	free(m);
}

/* A revision whose files document does not parse, named so that it can be the newest. */
static gfs_meta *
meta_bad(const bson_t *doc, const char *name, const gfs_error *why)
{
	bson_iter_t it;
	if (!name || !bson_iter_init_find(&it, doc, "_id"))
		return NULL;
	gfs_meta *m = gfs_xcalloc(1, sizeof *m);
	atomic_init(&m->refs, 1);
	m->name = gfs_xstrdup(name);
	bson_value_copy(bson_iter_value(&it), &m->id);
	m->key = gfs_meta_key(&m->id);
	if (!m->key)
		abort();
	if (bson_iter_init_find(&it, doc, "uploadDate") && BSON_ITER_HOLDS_DATE_TIME(&it))
		m->upload_ms = bson_iter_date_time(&it);
	m->content_type = gfs_xstrdup("application/octet-stream");
	m->cache_key = make_cache_key(m);
	m->bad = gfs_xstrdup(why->msg);
	return m;
}

void
gfs_meta_file(const gfs_meta *m, gfs_file *out)
{
	memset(out, 0, sizeof *out);
	out->id = m->id;
	out->filename = m->name;
	out->length = m->length;
	out->chunk_size = m->chunk_size;
	out->upload_date = m->upload_ms;
	memcpy(out->sha256, m->sha256, sizeof out->sha256);
	memcpy(out->md5, m->md5, sizeof out->md5);
	memcpy(out->bad_hash, m->bad_hash, sizeof out->bad_hash);
	out->mtime_ns = -1;
	out->mode = -1;
}

/* ---- the index ------------------------------------------------------- */

name_index *
name_index_new(const char *prefix)
{
	name_index *ix = gfs_xcalloc(1, sizeof *ix);
	pthread_rwlock_init(&ix->lock, NULL);
	ix->prefix = gfs_xstrdup(prefix ? prefix : "");
	ix->by_name = strmap_new(1024);
	ix->by_id = strmap_new(1024);
	return ix;
}

static void
unref_value(const char *key, void *value, void *ctx)
{
	(void)key;
	(void)ctx;
	gfs_meta_unref(value);
}

static void
free_maps(strmap *by_name, strmap *by_id)
{
	strmap_each(by_name, unref_value, NULL);
	strmap_free(by_name);
	strmap_free(by_id);
}

void
name_index_free(name_index *ix)
{
	if (!ix)
		return;
	free_maps(ix->by_name, ix->by_id);
	gfs_rev_ledger_free(ix->ledger);
	strmap_free(ix->recent);
	pthread_rwlock_destroy(&ix->lock);
	free(ix->prefix);
	free(ix);
}

/* The spec's revision order: uploadDate, then _id. True when a is newer than b. */
static bool
newer(const gfs_meta *a, const gfs_meta *b)
{
	if (a->upload_ms != b->upload_ms)
		return a->upload_ms > b->upload_ms;
	if (a->id.value_type == BSON_TYPE_OID && b->id.value_type == BSON_TYPE_OID)
		return bson_oid_compare(&a->id.value.v_oid, &b->id.value.v_oid) > 0;
	return strcmp(a->key, b->key) > 0;
}

/* Adds m (taking its reference) unless the map holds a newer revision of its name. */
static void
add_meta(strmap *by_name, strmap *by_id, gfs_meta *m)
{
	gfs_meta *old = strmap_get(by_name, m->name);
	if (old && !newer(m, old)) {
		gfs_meta_unref(m);
		return;
	}
	strmap_put(by_name, m->name, m);
	if (old) {
		/* After a rename seen by a poll, the id may already name another entry. */
		if (strmap_get(by_id, old->key) == old)
			strmap_del(by_id, old->key);
		gfs_meta_unref(old);
	}
	strmap_put(by_id, m->key, m);
}

/*
 * Notes doc in the ledger (when there is one); a filename whose document
 * is new to it goes to touched (when given). A document without an _id
 * counts for nothing: the server never stores one.
 */
static void
note(gfs_rev_ledger *lg, strmap *touched, const bson_t *doc)
{
	bson_iter_t it;
	if (!lg || !bson_iter_init_find(&it, doc, "_id"))
		return;
	char *key = gfs_meta_key(bson_iter_value(&it));
	if (!key)
		return;
	const char *name = bson_iter_init_find(&it, doc, "filename") && BSON_ITER_HOLDS_UTF8(&it)
	                 ? bson_iter_utf8(&it, NULL) : NULL;
	if (gfs_rev_ledger_see(lg, key, name) && name && touched)
		strmap_put(touched, name, touched);
	free(key);
}

/*
 * Runs a files query and hands each revision to add_meta. Only the fields
 * the index keeps are asked for, and no sort: the map orders revisions.
 * Every document, parsed or not, is noted in lg (see revledger.h).
 */
static bool
scan(gfs_session *s, const bson_t *filter, strmap *by_name, strmap *by_id, gfs_rev_ledger *lg,
     strmap *touched, int64_t *docs, gfs_error *err)
{
	bson_t opts = BSON_INITIALIZER, proj;
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "projection", &proj);
	const char *fields[] = {"_id", "filename", "length", "chunkSize", "uploadDate", "md5",
	                        "contentType", "metadata.sha256", "metadata.contentType"};
	for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
		BSON_APPEND_INT32(&proj, fields[i], 1);
	bson_append_document_end(&opts, &proj);
	BSON_APPEND_INT32(&opts, "batchSize", 5000);
	mongoc_cursor_t *cur = gfs_session_find(s, s->files, filter, &opts);
	bson_destroy(&opts);
	const bson_t *doc;
	while (mongoc_cursor_next(cur, &doc)) {
		gfs_file f;
		gfs_error perr;
		note(lg, touched, doc);
		if (docs)
			(*docs)++;
		if (!gfs_file_parse(doc, &f, &perr)) {
			/* A problem of its name: as the newest revision it answers 500, never an older one. */
			gfs_meta *m = meta_bad(doc, gfs_doc_filename(doc), &perr);
			if (m)
				add_meta(by_name, by_id, m);
			continue;
		}
		if (f.filename)
			add_meta(by_name, by_id, gfs_meta_from_file(&f));
		gfs_file_free(&f);
	}
	return gfs_cursor_done(cur, "index: read the files collection", err);
}

bool
name_index_load(name_index *ix, gfs_session *s, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER;
	gfs_prefix_filter(&filter, ix->prefix);
	strmap *by_name = strmap_new(strmap_count(ix->by_name) + 1024);
	strmap *by_id = strmap_new(strmap_count(ix->by_id) + 1024);
	gfs_rev_ledger *lg = gfs_rev_ledger_new();
	int64_t started = gfs_now_ms();
	bool ok = scan(s, &filter, by_name, by_id, lg, NULL, NULL, err);
	bson_destroy(&filter);
	if (!ok) {
		free_maps(by_name, by_id);
		gfs_rev_ledger_free(lg);
		return false;
	}
	pthread_rwlock_wrlock(&ix->lock);
	strmap *old_name = ix->by_name, *old_id = ix->by_id;
	gfs_rev_ledger *old_lg = ix->ledger;
	ix->by_name = by_name;
	ix->by_id = by_id;
	ix->ledger = lg;
	ix->since_ms = started;
	ix->loaded = true;
	pthread_rwlock_unlock(&ix->lock);
	free_maps(old_name, old_id);
	gfs_rev_ledger_free(old_lg);
	atomic_store(&ix->fresh_ms, gfs_now_ms());
	return true;
}

struct collected {
	gfs_meta **items;
	size_t n, cap;
};

static void
collect(const char *key, void *value, void *ctx)
{
	(void)key;
	struct collected *c = ctx;
	GFS_GROW(c->items, c->n + 1, c->cap, 16);
	c->items[c->n++] = value;
}

/*
 * The files documents under prefix, counted before a poll's query. The
 * whole collection: estimatedDocumentCount, which MongoDB answers from the
 * collection's metadata, reading no document and no index key. Under a
 * prefix: a count of the filename range, which MongoDB answers from the
 * keys of the spec's {filename: 1, uploadDate: 1} index alone.
 */
static bool
count_files(gfs_session *s, const char *prefix, int64_t *out, gfs_error *err)
{
	bson_error_t berr;
	bson_t opts;
	/* On the poll's server: a count from another member would prove removals that are lag. */
	gfs_session_read_opts(s, NULL, &opts);
	if (!*prefix) {
		*out = mongoc_collection_estimated_document_count(s->files, &opts, NULL, NULL, &berr);
	} else {
		bson_t filter = BSON_INITIALIZER;
		gfs_prefix_filter(&filter, prefix);
		*out = mongoc_collection_count_documents(s->files, &filter, &opts, NULL, NULL, &berr);
		bson_destroy(&filter);
	}
	bson_destroy(&opts);
	if (*out >= 0)
		return true;
	gfs_error_from_bson(err, &berr, "index: count the files collection");
	return false;
}

/* Puts m (taking its reference) as name's entry, or removes the entry when m is NULL. */
static void
set_entry(name_index *ix, const char *name, gfs_meta *m)
{
	pthread_rwlock_wrlock(&ix->lock);
	gfs_meta *old = m ? strmap_put(ix->by_name, name, m) : strmap_del(ix->by_name, name);
	if (old && strmap_get(ix->by_id, old->key) == old)
		strmap_del(ix->by_id, old->key);
	if (m)
		strmap_put(ix->by_id, m->key, m);
	pthread_rwlock_unlock(&ix->lock);
	gfs_meta_unref(old);
}

/*
 * Rereads one name's revisions (an equality query on the spec's index):
 * its newest becomes the entry, whether newer or older than the one held,
 * and none removes it; the ledger learns how many it has.
 */
static bool
refresh_name(name_index *ix, gfs_session *s, const char *name, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&filter, "filename", name);
	strmap *by_name = strmap_new(4), *by_id = strmap_new(4);
	int64_t docs = 0;
	bool ok = scan(s, &filter, by_name, by_id, ix->ledger, NULL, &docs, err);
	bson_destroy(&filter);
	if (ok) {
		gfs_rev_ledger_set_name(ix->ledger, name, docs);
		set_entry(ix, name, strmap_del(by_name, name));
	}
	free_maps(by_name, by_id);
	return ok;
}

/* Names refreshed one by one when a poll must explain a removal; past this, one reload costs less. */
#define REFRESH_MAX 64

struct refresh {
	name_index *ix;
	gfs_session *s;
	gfs_error *err;
	const strmap *done;  /* names already reread, or NULL */
	bool ok;
};

static void
refresh_each(const char *name, void *value, void *ctx)
{
	(void)value;
	struct refresh *r = ctx;
	if (r->ok && !(r->done && strmap_get(r->done, name)))
		r->ok = refresh_name(r->ix, r->s, name, r->err);
}

/*
 * After a poll's query: when the count taken before it proves a removal
 * (revledger.h), first the names that have new revisions, in this poll or
 * the one before, are reread (a replacement removes its old revisions
 * just after it inserts the new one, which may fall on either side of a
 * poll; that explains the count without a reload); whatever is still
 * unexplained is a removal of a name the polls did not see, and the whole
 * index is reread. A poll that finds nothing removed costs the count alone.
 */
static bool
name_index_removals(name_index *ix, gfs_session *s, int64_t count, strmap *touched, gfs_error *err)
{
	if (!gfs_rev_ledger_removed(ix->ledger, count))
		return true;
	size_t recent = ix->recent ? strmap_count(ix->recent) : 0;
	if (strmap_count(touched) + recent <= REFRESH_MAX) {
		/* refresh_name changes ix's maps, never these two */
		struct refresh r = {ix, s, err, NULL, true};
		strmap_each(touched, refresh_each, &r);
		r.done = touched;
		if (ix->recent)
			strmap_each(ix->recent, refresh_each, &r);
		if (!r.ok)
			return false;
		if (!gfs_rev_ledger_removed(ix->ledger, count))
			return true;
	}
	return name_index_load(ix, s, err);
}

/*
 * Not "newer than the newest seen": a writer whose clock is behind, or one
 * that took a while between dating a file and inserting its document, adds
 * files dated before revisions already seen. Anything inserted since the
 * last poll began is dated after that moment less the writer's lag, so the
 * query reaches back overlap_ms before it; it reads only what was uploaded
 * lately, however large the collection, and nothing once uploads stop.
 */
bool
name_index_poll(name_index *ix, gfs_session *s, int64_t overlap_ms, gfs_error *err)
{
	pthread_rwlock_rdlock(&ix->lock);
	int64_t since = ix->since_ms - overlap_ms;
	pthread_rwlock_unlock(&ix->lock);
	int64_t count;
	if (!count_files(s, ix->prefix, &count, err))
		return false; /* before the query: see revledger.h */
	strmap *touched = strmap_new(64);

	bson_t filter = BSON_INITIALIZER, range;
	gfs_prefix_filter(&filter, ix->prefix);
	BSON_APPEND_DOCUMENT_BEGIN(&filter, "uploadDate", &range);
	BSON_APPEND_DATE_TIME(&range, "$gte", since);
	bson_append_document_end(&filter, &range);
	strmap *by_name = strmap_new(64), *by_id = strmap_new(64);
	int64_t started = gfs_now_ms();
	bool ok = scan(s, &filter, by_name, by_id, ix->ledger, touched, NULL, err);
	bson_destroy(&filter);
	if (!ok) {
		free_maps(by_name, by_id);
		strmap_free(touched);
		return false;
	}
	struct collected c = {0};
	strmap_each(by_name, collect, &c);
	pthread_rwlock_wrlock(&ix->lock);
	for (size_t i = 0; i < c.n; i++)
		add_meta(ix->by_name, ix->by_id, c.items[i]); /* takes the scan's reference */
	if (started > ix->since_ms)
		ix->since_ms = started;
	pthread_rwlock_unlock(&ix->lock);
	free(c.items);
	strmap_free(by_name);
	strmap_free(by_id);
	ok = name_index_removals(ix, s, count, touched, err);
	strmap_free(ix->recent);
	ix->recent = touched;
	if (ok)
		atomic_store(&ix->fresh_ms, gfs_now_ms());
	return ok;
}

gfs_meta *
name_index_get(name_index *ix, const char *name)
{
	pthread_rwlock_rdlock(&ix->lock);
	gfs_meta *m = gfs_meta_ref(strmap_get(ix->by_name, name));
	pthread_rwlock_unlock(&ix->lock);
	return m;
}

gfs_meta *
name_index_get_id(name_index *ix, const char *key)
{
	pthread_rwlock_rdlock(&ix->lock);
	gfs_meta *m = gfs_meta_ref(strmap_get(ix->by_id, key));
	pthread_rwlock_unlock(&ix->lock);
	return m;
}

bool
name_index_loaded(name_index *ix)
{
	return atomic_load(&ix->loaded);
}

size_t
name_index_count(name_index *ix)
{
	pthread_rwlock_rdlock(&ix->lock);
	size_t n = strmap_count(ix->by_name);
	pthread_rwlock_unlock(&ix->lock);
	return n;
}

int64_t
name_index_fresh_ms(name_index *ix)
{
	return atomic_load(&ix->fresh_ms);
}

struct each_ctx {
	void (*fn)(gfs_meta *m, void *ctx);
	void *ctx;
};

static void
each_value(const char *key, void *value, void *ctx)
{
	(void)key;
	struct each_ctx *e = ctx;
	e->fn(value, e->ctx);
}

void
name_index_each(name_index *ix, void (*fn)(gfs_meta *m, void *ctx), void *ctx)
{
	struct each_ctx e = {fn, ctx};
	pthread_rwlock_rdlock(&ix->lock);
	strmap_each(ix->by_name, each_value, &e);
	pthread_rwlock_unlock(&ix->lock);
}
