/*
 * The name index's upkeep and --preload. The poller thread keeps the index
 * (nameindex.c) current: a poll of recent changes every poll interval, a
 * full reload now and then, both spaced out as the backend slows down.
 * --preload fills the memory cache in one pass over the chunks collection
 * in natural order, on a thread of its own while the server answers;
 * where that pass is (httpserve_preload_state) is told from here too.
 * It fills the cache as a fetch does (jobs.c's memcache_insert).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* ---- index upkeep ---------------------------------------------------- */

/* Both of the poller's query kinds give way to the backend as it slows down. */
#define POLL_DUTY 5      /* a poll waits at least 5 times as long as the last one took */
#define RELOAD_DUTY 10   /* a reload, 10 times */

static int64_t
max64(int64_t a, int64_t b)
{
	return a > b ? a : b;
}

/*
 * Keeps the index fresh and tells whether the backend answers. On a server
 * that must scan the files collection for any query (FerretDB does), a poll
 * costs as much as the collection is large, so the intervals stretch to
 * keep polling under a fifth of the backend's time.
 */
void *
poller_main(void *arg)
{
	struct httpserve *srv = arg;
	gfs_session *ses = gfs_session_pop(srv->conn);
	int64_t last_full = name_index_loaded(srv->index) ? gfs_now_ms() : 0;
	int64_t wait_ms = srv->cfg.poll_ms;
	pthread_mutex_lock(&srv->poll_mu);
	while (!srv->poll_stop) {
		struct timespec ts;
		gfs_deadline_in(&ts, wait_ms);
		pthread_cond_timedwait(&srv->poll_cv, &srv->poll_mu, &ts);
		if (srv->poll_stop)
			break;
		pthread_mutex_unlock(&srv->poll_mu);
		gfs_error err;
		gfs_error_clear(&err);
		int64_t reload_every = max64(srv->cfg.reload_ms,
		                             RELOAD_DUTY * atomic_load(&srv->reload_us) / 1000);
		bool full = !name_index_loaded(srv->index) || gfs_now_ms() - last_full >= reload_every;
		int64_t t0 = mono_us();
		bool ok = full ? name_index_load(srv->index, ses, &err)
		               : name_index_poll(srv->index, ses, srv->cfg.poll_window_ms, &err);
		int64_t took = mono_us() - t0;
		atomic_store(full ? &srv->reload_us : &srv->poll_us, took);
		if (ok && full) {
			last_full = gfs_now_ms();
			if (srv->tier)
				disktier_reconcile(srv->tier, srv->index); /* deleted files leave the tier */
		}
		wait_ms = max64(srv->cfg.poll_ms, POLL_DUTY * took / 1000);
		atomic_store(&srv->poll_interval_ms, wait_ms);
		if (ok && atomic_exchange(&srv->backend_down, false))
			serve_logf(srv, "backend reachable again");
		else if (!ok && !atomic_exchange(&srv->backend_down, true))
			serve_logf(srv, "backend unreachable, answering 503 for files not in the cache: %s", err.msg);
		if (!ok)
			wait_ms = srv->cfg.poll_ms; /* a failure is fast or timed out: retry at the normal pace */
		if (srv->cfg.access_log) {
			pthread_mutex_lock(&srv->log_mu);
			fflush(srv->access_log);
			pthread_mutex_unlock(&srv->log_mu);
		}
		pthread_mutex_lock(&srv->poll_mu);
	}
	pthread_mutex_unlock(&srv->poll_mu);
	gfs_session_push(ses);
	return NULL;
}

/* ---- preload: one pass over the chunks collection ------------------- */

/*
 * The pass runs while the server answers (a restart at 52,000 files once
 * refused connections for the 35 s it took), and gives way to a stop.
 */
static bool
preload_stopping(struct httpserve *srv)
{
	pthread_mutex_lock(&srv->preload_mu);
	bool stop = srv->preload_stop;
	pthread_mutex_unlock(&srv->preload_mu);
	return stop || atomic_load(&srv->draining);
}

struct partial {
	gfs_meta *meta;
	http_cache_body *body;
	bool memory;       /* within the memory cache's budget; else for the disk tier only */
	uint64_t have;     /* bit n: chunk n arrived */
	int64_t count;
};

struct preload {
	struct httpserve *srv;
	strmap *want;      /* id key -> struct partial */
	size_t budget;
	gfs_session *ses;  /* the pass's, and the count of each file's chunks */
};

/*
 * Whether the file has no chunk documents beyond its count: an extra chunk
 * or a second copy is damage to every reader, and the pass cannot rule one
 * out for a file it caches before its end (the extra may come later, or
 * after the pass stops early). One files_id equality count a file.
 */
static bool
only_its_chunks(struct preload *p, const gfs_meta *m, int64_t count)
{
	return gfs_chunk_docs(p->ses, &m->id) == count;
}

/*
 * What the memory cache cannot hold goes to the disk tier, if there is
 * one; a file on disk already costs no backend read.
 */
static void
want_meta(gfs_meta *m, void *ctx)
{
	struct preload *p = ctx;
	disktier *tier = p->srv->tier;
	int64_t count = gfs_chunk_count(m->length, m->chunk_size);
	if (m->bad || count > 64 || (tier && disktier_has(tier, m)))
		return;
	bool memory = (size_t)m->length <= p->srv->cfg.stream_threshold &&
	              (size_t)m->length + 512 <= p->budget;
	if (!memory && !tier)
		return;
	if (memory)
		p->budget -= (size_t)m->length + 512;
	if (count == 0) {
		/* No chunks to wait for: cached now, so the scan can stop once the rest are in. */
		if (!only_its_chunks(p, m, 0))
			return; /* a request will read it and report the stray chunk */
		http_cache_body *b = http_cache_body_new(0);
		if (memory)
			http_cache_entry_release(p->srv->cache, memcache_insert(p->srv, m, b));
		if (tier)
			disktier_put(tier, m, b->data, 0);
		http_cache_body_unref(b);
		atomic_fetch_add(&p->srv->preloaded, 1);
		return;
	}
	struct partial *pt = gfs_xcalloc(1, sizeof *pt);
	pt->meta = gfs_meta_ref(m);
	pt->count = count;
	pt->memory = memory;
	strmap_put(p->want, m->key, pt);
}

static void
free_partial(const char *key, void *value, void *ctx)
{
	(void)key;
	(void)ctx;
	struct partial *pt = value;
	if (pt->body)
		http_cache_body_unref(pt->body);
	gfs_meta_unref(pt->meta);
	free(pt);
}

/* Adds one chunk; when the file is complete and its hash checks, caches it. */
static void
preload_chunk(struct preload *p, const bson_t *doc)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, doc, "files_id"))
		return;
	char *key = gfs_meta_key(bson_iter_value(&it));
	struct partial *pt = key ? strmap_get(p->want, key) : NULL;
	free(key);
	if (!pt)
		return;
	gfs_meta *m = pt->meta;
	uint32_t len;
	const uint8_t *data;
	bson_subtype_t sub;
	int64_t n;
	if (!gfs_chunk_n(doc, &n))
		return;
	if (n < 0 || n >= pt->count || (pt->have & (1ULL << n)) ||
	    !bson_iter_init_find(&it, doc, "data") || !BSON_ITER_HOLDS_BINARY(&it))
		return;
	bson_iter_binary(&it, &sub, &len, &data);
	if ((int64_t)len != gfs_chunk_expected_len(m->length, m->chunk_size, n))
		return; /* left incomplete: a request will read it and report the damage */
	if (!pt->body)
		pt->body = http_cache_body_new((size_t)m->length);
	memcpy(pt->body->data + n * (int64_t)m->chunk_size, data, len);
	pt->have |= 1ULL << n;
	if (pt->have != (pt->count == 64 ? ~0ULL : (1ULL << pt->count) - 1))
		return;
	gfs_file f;
	gfs_meta_file(m, &f);
	gfs_digest *d = gfs_digest_new(&f);
	gfs_digest_update(d, pt->body->data, pt->body->len);
	gfs_error err;
	if (!gfs_digest_check(d, &f, NULL, &err) || !only_its_chunks(p, m, pt->count)) {
		/* Not cached: a request will read it again and report the damage. */
		free_partial(NULL, strmap_del(p->want, m->key), NULL);
		return;
	}
	if (pt->memory)
		http_cache_entry_release(p->srv->cache, memcache_insert(p->srv, m, pt->body));
	if (p->srv->tier)
		disktier_put(p->srv->tier, m, pt->body->data, pt->body->len);
	atomic_fetch_add(&p->srv->preloaded, 1);
	atomic_fetch_add(&p->srv->backend_reads, 1);
	free_partial(NULL, strmap_del(p->want, m->key), NULL);
}

static bool
preload(struct httpserve *srv, gfs_error *err)
{
	gfs_session *ses = gfs_session_pop(srv->conn);
	struct preload p = {srv, strmap_new(name_index_count(srv->index)), srv->cfg.cache_size, ses};
	name_index_each(srv->index, want_meta, &p);
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, hint;
	BSON_APPEND_INT32(&opts, "batchSize", gfs_chunk_batch_size(GFS_DEFAULT_CHUNK_SIZE));
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "hint", &hint);
	BSON_APPEND_INT32(&hint, "$natural", 1);
	bson_append_document_end(&opts, &hint);
	mongoc_cursor_t *cur = gfs_session_find(ses, ses->chunks, &filter, &opts);
	const bson_t *doc;
	while (strmap_count(p.want) > 0 && !preload_stopping(srv) && mongoc_cursor_next(cur, &doc))
		preload_chunk(&p, doc);
	bool ok = gfs_cursor_done(cur, "preload", err);
	bson_destroy(&filter);
	bson_destroy(&opts);
	gfs_session_push(ses);
	strmap_each(p.want, free_partial, NULL);
	strmap_free(p.want);
	return ok;
}

/* A backend down at start: the poller loads the index once it answers, and the pass follows. */
static bool
preload_wait_for_index(struct httpserve *srv)
{
	pthread_mutex_lock(&srv->preload_mu);
	while (!srv->preload_stop && !atomic_load(&srv->draining) && !name_index_loaded(srv->index)) {
		struct timespec ts;
		gfs_deadline_in(&ts, 100);
		pthread_cond_timedwait(&srv->preload_cv, &srv->preload_mu, &ts);
	}
	bool go = !srv->preload_stop && !atomic_load(&srv->draining);
	pthread_mutex_unlock(&srv->preload_mu);
	return go;
}

void *
preload_main(void *arg)
{
	struct httpserve *srv = arg;
	if (!preload_wait_for_index(srv))
		return NULL;
	int64_t t0 = mono_us();
	gfs_error err;
	gfs_error_clear(&err);
	bool ok = preload(srv, &err);
	if (preload_stopping(srv))
		return NULL; /* cut short by the stop: nobody waits for it any more */
	atomic_store(&srv->preload_state, ok ? HTTPSERVE_PRELOAD_DONE : HTTPSERVE_PRELOAD_FAILED);
	if (!ok)
		serve_logf(srv, "preload stopped early: %s; the rest is read when asked for", err.msg);
	if (srv->cfg.preloaded)
		srv->cfg.preloaded(ok, atomic_load(&srv->preloaded), (double)(mono_us() - t0) / 1e6);
	return NULL;
}

enum httpserve_preload
httpserve_preload_state(httpserve *srv)
{
	return (enum httpserve_preload)atomic_load(&srv->preload_state);
}

const char *
httpserve_preload_word(enum httpserve_preload state)
{
	static const char *const words[] = {
		[HTTPSERVE_PRELOAD_OFF] = NULL, [HTTPSERVE_PRELOAD_RUNNING] = "running",
		[HTTPSERVE_PRELOAD_DONE] = "done", [HTTPSERVE_PRELOAD_FAILED] = "failed",
	};
	return words[state];
}
