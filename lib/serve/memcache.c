/*
 * Prebuilt responses bounded in bytes, evicted by second chance (CLOCK), and
 * a negative cache. A hit only marks its entry: moving it to the head of a
 * list, as strict LRU does, would write to two neighbours that are cold in
 * the CPU cache, on every request. The eviction hand gives marked entries
 * one more round instead.
 */
#include <microhttpd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "memcache.h"
#include "../strmap.h"
#include "../util.h"

/* The negative cache is cleared whole when it reaches this many names. */
#define NEG_MAX 100000

struct http_cache {
	pthread_mutex_t mu;
	strmap *map;             /* key -> http_cache_entry */
	http_cache_entry *head, *tail; /* head: most recent */
	size_t bytes, max_bytes;
	void (*free_user)(void *);
	uint64_t hits, misses, evictions, neg_hits;
	pthread_mutex_t neg_mu;
	strmap *neg;             /* key -> struct neg */
};

struct neg {
	int64_t expires_ms;
	char key[];
};

http_cache_body *
http_cache_body_new(size_t len)
{
	http_cache_body *b = gfs_xmalloc(sizeof *b + (len ? len : 1));
	atomic_init(&b->refs, 1);
	b->len = len;
	return b;
}

http_cache_body *
http_cache_body_ref(http_cache_body *b)
{
	atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
	return b;
}

void
http_cache_body_unref(http_cache_body *b)
{
	if (b && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
		free(b);
}

void
http_cache_body_release_cb(void *cls)
{
	http_cache_body_unref(cls);
}

http_cache *
http_cache_new(size_t max_bytes, void (*free_user)(void *))
{
	http_cache *c = gfs_xcalloc(1, sizeof *c);
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->neg_mu, NULL);
	c->map = strmap_new(4096);
	c->neg = strmap_new(256);
	c->max_bytes = max_bytes;
	c->free_user = free_user;
	return c;
}

static void
entry_destroy(http_cache *c, http_cache_entry *e)
{
	if (e->resp)
		MHD_destroy_response(e->resp); /* the body goes when the last connection lets go */
	http_cache_body_unref(e->body);
	if (e->user && c->free_user)
		c->free_user(e->user);
	free((char *)e->key);
	free(e);
}

http_cache_entry *
http_cache_entry_ref(http_cache_entry *e)
{
	atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
	return e;
}

void
http_cache_entry_release(http_cache *c, http_cache_entry *e)
{
	if (e && atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1)
		entry_destroy(c, e);
}

static void
free_neg(const char *key, void *value, void *ctx)
{
	(void)key;
	(void)ctx;
	free(value);
}

void
http_cache_free(http_cache *c)
{
	if (!c)
		return;
	http_cache_entry *e = c->head;
	while (e) {
		http_cache_entry *next = e->next;
		http_cache_entry_release(c, e);
		e = next;
	}
	strmap_free(c->map);
	strmap_each(c->neg, free_neg, NULL);
	strmap_free(c->neg);
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&c->neg_mu);
	free(c);
}

static void
unlink_entry(http_cache *c, http_cache_entry *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		c->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		c->tail = e->prev;
	e->prev = e->next = NULL;
}

static void
push_front(http_cache *c, http_cache_entry *e)
{
	e->prev = NULL;
	e->next = c->head;
	if (c->head)
		c->head->prev = e;
	c->head = e;
	if (!c->tail)
		c->tail = e;
}

http_cache_entry *
http_cache_get(http_cache *c, const char *key)
{
	pthread_mutex_lock(&c->mu);
	http_cache_entry *e = strmap_get(c->map, key);
	if (e) {
		c->hits++;
		e->referenced = true;
		atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
	} else {
		c->misses++;
	}
	pthread_mutex_unlock(&c->mu);
	return e;
}

http_cache_entry *
http_cache_peek(http_cache *c, const char *key)
{
	pthread_mutex_lock(&c->mu);
	http_cache_entry *e = strmap_get(c->map, key);
	if (e)
		atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
	pthread_mutex_unlock(&c->mu);
	return e;
}

bool
http_cache_has_room(http_cache *c, size_t len)
{
	pthread_mutex_lock(&c->mu);
	bool room = c->bytes + len + HTTP_CACHE_ENTRY_OVERHEAD <= c->max_bytes;
	pthread_mutex_unlock(&c->mu);
	return room;
}

/*
 * Called with the lock held; the entries are released after it is dropped.
 * The tail is the oldest entry; one used since it last came round goes back
 * to the head unmarked. Every entry is unmarked after one lap, so this ends.
 */
static http_cache_entry *
evict_one(http_cache *c)
{
	http_cache_entry *e = c->tail;
	while (e && e->referenced) {
		e->referenced = false;
		unlink_entry(c, e);
		push_front(c, e);
		e = c->tail;
	}
	if (!e)
		return NULL;
	unlink_entry(c, e);
	strmap_del(c->map, e->key);
	e->linked = false;
	c->bytes -= e->cost;
	c->evictions++;
	return e;
}

void
http_cache_drop(http_cache *c, const char *key)
{
	pthread_mutex_lock(&c->mu);
	http_cache_entry *e = strmap_get(c->map, key);
	if (e) {
		unlink_entry(c, e);
		strmap_del(c->map, e->key);
		e->linked = false;
		c->bytes -= e->cost;
	}
	pthread_mutex_unlock(&c->mu);
	if (e)
		http_cache_entry_release(c, e);
}

size_t
http_cache_drop_if(http_cache *c, bool (*gone)(void *user, void *ctx), void *ctx)
{
	http_cache_entry *dropped = NULL;
	size_t n = 0;
	pthread_mutex_lock(&c->mu);
	http_cache_entry *next;
	for (http_cache_entry *e = c->head; e; e = next) {
		next = e->next;
		if (!gone(e->user, ctx))
			continue;
		unlink_entry(c, e);
		strmap_del(c->map, e->key);
		e->linked = false;
		c->bytes -= e->cost;
		e->next = dropped;
		dropped = e;
		n++;
	}
	pthread_mutex_unlock(&c->mu);
	while (dropped) {
		next = dropped->next;
		http_cache_entry_release(c, dropped);
		dropped = next;
	}
	return n;
}

http_cache_entry *
http_cache_put(http_cache *c, const char *key, http_cache_body *body, struct MHD_Response *resp,
               void *user)
{
	http_cache_entry *e = gfs_xcalloc(1, sizeof *e);
	e->key = gfs_xstrdup(key);
	e->body = http_cache_body_ref(body);
	e->resp = resp;
	e->user = user;
	e->cost = body->len + HTTP_CACHE_ENTRY_OVERHEAD;
	atomic_init(&e->refs, 2); /* the cache's and the caller's */

	http_cache_entry *victims = NULL;
	pthread_mutex_lock(&c->mu);
	http_cache_entry *old = strmap_get(c->map, key);
	if (old) {
		atomic_fetch_add_explicit(&old->refs, 1, memory_order_relaxed);
		pthread_mutex_unlock(&c->mu);
		atomic_store(&e->refs, 1);
		http_cache_entry_release(c, e);
		return old;
	}
	if (e->cost > c->max_bytes) {
		pthread_mutex_unlock(&c->mu);
		atomic_store(&e->refs, 1);
		return e; /* served once, never kept */
	}
	while (c->bytes + e->cost > c->max_bytes) {
		http_cache_entry *v = evict_one(c);
		v->next = victims;
		victims = v;
	}
	strmap_put(c->map, e->key, e);
	push_front(c, e);
	e->linked = true;
	c->bytes += e->cost;
	pthread_mutex_unlock(&c->mu);
	while (victims) {
		http_cache_entry *next = victims->next;
		http_cache_entry_release(c, victims);
		victims = next;
	}
	return e;
}

void
http_cache_neg_put(http_cache *c, const char *key, int64_t expires_ms)
{
	size_t len = strlen(key);
	struct neg *n = gfs_xmalloc(sizeof *n + len + 1);
	n->expires_ms = expires_ms;
	memcpy(n->key, key, len + 1);
	pthread_mutex_lock(&c->neg_mu);
	if (strmap_count(c->neg) >= NEG_MAX) {
		strmap_each(c->neg, free_neg, NULL);
		strmap_free(c->neg);
		c->neg = strmap_new(256);
	}
	free(strmap_put(c->neg, n->key, n));
	pthread_mutex_unlock(&c->neg_mu);
}

bool
http_cache_neg_has(http_cache *c, const char *key, int64_t now_ms)
{
	pthread_mutex_lock(&c->neg_mu);
	struct neg *n = strmap_get(c->neg, key);
	bool hit = n && n->expires_ms > now_ms;
	if (n && !hit)
		free(strmap_del(c->neg, key));
	if (hit)
		c->neg_hits++;
	pthread_mutex_unlock(&c->neg_mu);
	return hit;
}

void
http_cache_stats(http_cache *c, struct http_cache_stats *out)
{
	pthread_mutex_lock(&c->mu);
	out->hits = c->hits;
	out->misses = c->misses;
	out->evictions = c->evictions;
	out->bytes = c->bytes;
	out->max_bytes = c->max_bytes;
	out->entries = strmap_count(c->map);
	pthread_mutex_unlock(&c->mu);
	pthread_mutex_lock(&c->neg_mu);
	out->neg_hits = c->neg_hits;
	out->neg_entries = strmap_count(c->neg);
	pthread_mutex_unlock(&c->neg_mu);
}
