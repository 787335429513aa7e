/*
 * The serve command's response cache: bounded in bytes of file
 * bodies, each with a prebuilt 200 response that every hit queues again
 * (libmicrohttpd counts references to a response, so one object serves
 * any number of connections at once without copying the body).
 *
 * Bodies are reference counted apart from entries, so a 206 response can
 * point into a body that is evicted while it is being sent.
 *
 * Also a negative cache: keys recently found missing, with an expiry.
 */
#ifndef GFS_SERVE_MEMCACHE_H
#define GFS_SERVE_MEMCACHE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct MHD_Response;

typedef struct http_cache_body {
	atomic_int refs;
	size_t len;
	uint8_t data[];
} http_cache_body;

/* A body of len bytes with one reference; data is uninitialised. */
http_cache_body *http_cache_body_new(size_t len);
http_cache_body *http_cache_body_ref(http_cache_body *b);
void http_cache_body_unref(http_cache_body *b);
/* libmicrohttpd's free callback shape: drops the reference a response holds. */
void http_cache_body_release_cb(void *cls);

typedef struct http_cache_entry {
	const char *key;
	http_cache_body *body;
	struct MHD_Response *resp;   /* 200 with every header set; owned by the entry */
	void *user;                  /* the caller's (a gfs_meta); released through the cache's free_user */
	/* private */
	atomic_int refs;
	size_t cost;
	struct http_cache_entry *prev, *next;
	bool linked;
	bool referenced;             /* hit since the eviction hand last passed */
} http_cache_entry;

typedef struct http_cache http_cache;

/* Per-entry bookkeeping counted against the budget, so tiny files cannot overrun it. */
#define HTTP_CACHE_ENTRY_OVERHEAD 512

http_cache *http_cache_new(size_t max_bytes, void (*free_user)(void *));
void http_cache_free(http_cache *c);

/* A referenced entry (release with http_cache_entry_release), or NULL; counts a hit or a miss. */
http_cache_entry *http_cache_get(http_cache *c, const char *key);
/* Like get without counting or reordering. */
http_cache_entry *http_cache_peek(http_cache *c, const char *key);
/*
 * Inserts key (copied) with body and resp, adding a reference to body,
 * ownership of resp and of user. Returns the entry (referenced), which is
 * an older one for the same key when there was one (the new parts are then
 * released). Evicts from the cold end to make room; an entry larger than
 * the whole cache is not kept but still returned.
 */
http_cache_entry *http_cache_put(http_cache *c, const char *key, http_cache_body *body,
                            struct MHD_Response *resp, void *user);
/* Forgets key's entry (those holding a reference keep it until they release it). */
void http_cache_drop(http_cache *c, const char *key);
/*
 * Forgets, as http_cache_drop does, every entry whose user gone() says is
 * gone; gone runs under the cache's lock (quick, never calling back).
 * Returns how many.
 */
size_t http_cache_drop_if(http_cache *c, bool (*gone)(void *user, void *ctx), void *ctx);
http_cache_entry *http_cache_entry_ref(http_cache_entry *e);
void http_cache_entry_release(http_cache *c, http_cache_entry *e);
/* Would an entry of len bytes fit without evicting anything? */
bool http_cache_has_room(http_cache *c, size_t len);

/* Negative cache. */
void http_cache_neg_put(http_cache *c, const char *key, int64_t expires_ms);
bool http_cache_neg_has(http_cache *c, const char *key, int64_t now_ms);

struct http_cache_stats {
	uint64_t hits, misses, evictions, neg_hits;
	size_t bytes, max_bytes, entries, neg_entries;
};
void http_cache_stats(http_cache *c, struct http_cache_stats *out);

#endif
