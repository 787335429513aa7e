/*
 * A string-keyed hash map with chaining. Keys are copied into the map.
 * Not thread-safe; callers lock.
 */
#ifndef GFS_STRMAP_H
#define GFS_STRMAP_H

#include <stddef.h>
#include <stdint.h>

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
/* Calls fn for every entry; fn must not change the map. */
void strmap_each(const strmap *m, void (*fn)(const char *key, void *value, void *ctx), void *ctx);

uint64_t strmap_hash(const char *key);

#endif
