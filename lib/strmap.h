/*
 * The hash map of the library, with chaining, keyed by strings or by any
 * bytes (ids as BSON). Keys are copied into the map. Not thread-safe;
 * callers lock. gfs_fnv1a() is its hash, and the library's only one.
 */
#ifndef GFS_STRMAP_H
#define GFS_STRMAP_H

#include <stddef.h>
#include <stdint.h>

#define GFS_FNV1A_BASIS 0xcbf29ce484222325ULL

/* 64-bit FNV-1a of len bytes, from basis (GFS_FNV1A_BASIS; xor a seed into it for a seeded hash). */
uint64_t gfs_fnv1a(const void *p, size_t len, uint64_t basis);

typedef struct strmap strmap;

strmap *strmap_new(size_t expected);
/* Frees the table; values are the caller's. */
void strmap_free(strmap *m);
size_t strmap_count(const strmap *m);
void *strmap_get(const strmap *m, const char *key);
/* Inserts or replaces; returns the value replaced, or NULL. */
void *strmap_put(strmap *m, const char *key, void *value);
/* Removes key; returns its value, or NULL. */
void *strmap_del(strmap *m, const char *key);
/*
 * Calls fn for every entry; fn must not change the map. key stays valid
 * until its entry is removed (a byte key is followed by a NUL).
 */
void strmap_each(const strmap *m, void (*fn)(const char *key, void *value, void *ctx), void *ctx);

/* The same with a key of len bytes. */
void *strmap_getn(const strmap *m, const void *key, size_t len);
/*
 * The value of key, inserted as NULL when absent (*slot == NULL then): one
 * lookup for find-or-add. The caller stores a non-NULL value in it.
 */
void **strmap_slot(strmap *m, const void *key, size_t len);

#endif
