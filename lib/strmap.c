/*
 * A chained hash map keyed by strings: FNV-1a, power-of-two buckets, grows
 * at load 1. Each node carries a copy of its key, so a lookup that finds
 * its hash touches one allocation, not a node and then a key elsewhere:
 * serve looks up two of these per request in tables of 50,000 names, where
 * every extra cache miss shows.
 */
#include <stdlib.h>
#include <string.h>

#include "strmap.h"
#include "util.h"

struct node {
	struct node *next;
	uint64_t hash;
	void *value;
	char key[];
};

struct strmap {
	struct node **buckets;
	size_t nbuckets;   /* a power of two */
	size_t count;
};

uint64_t
strmap_hash(const char *key)
{
	uint64_t h = 1469598103934665603ULL;
	for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
		h ^= *p;
		h *= 1099511628211ULL;
	}
	return h;
}

strmap *
strmap_new(size_t expected)
{
	strmap *m = gfs_xcalloc(1, sizeof *m);
	m->nbuckets = 64;
	while (m->nbuckets < expected)
		m->nbuckets *= 2;
	m->buckets = gfs_xcalloc(m->nbuckets, sizeof *m->buckets);
	return m;
}

void
strmap_free(strmap *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->nbuckets; i++) {
		struct node *n = m->buckets[i];
		while (n) {
			struct node *next = n->next;
			free(n);
			n = next;
		}
	}
	free(m->buckets);
	free(m);
}

size_t
strmap_count(const strmap *m)
{
	return m->count;
}

static struct node **
find_slot(const strmap *m, const char *key, uint64_t h)
{
	struct node **pp = &m->buckets[h & (m->nbuckets - 1)];
	while (*pp && ((*pp)->hash != h || strcmp((*pp)->key, key) != 0))
		pp = &(*pp)->next;
	return pp;
}

void *
strmap_get(const strmap *m, const char *key)
{
	struct node **pp = find_slot(m, key, strmap_hash(key));
	return *pp ? (*pp)->value : NULL;
}

static void
grow(strmap *m)
{
	size_t nb = m->nbuckets * 2;
	struct node **b = gfs_xcalloc(nb, sizeof *b);
	for (size_t i = 0; i < m->nbuckets; i++) {
		struct node *n = m->buckets[i];
		while (n) {
			struct node *next = n->next;
			n->next = b[n->hash & (nb - 1)];
			b[n->hash & (nb - 1)] = n;
			n = next;
		}
	}
	free(m->buckets);
	m->buckets = b;
	m->nbuckets = nb;
}

void *
strmap_put(strmap *m, const char *key, void *value)
{
	uint64_t h = strmap_hash(key);
	struct node **pp = find_slot(m, key, h);
	if (*pp) {
		void *old = (*pp)->value;
		(*pp)->value = value;
		return old;
	}
	size_t len = strlen(key);
	struct node *n = gfs_xcalloc(1, sizeof *n + len + 1);
	n->hash = h;
	memcpy(n->key, key, len + 1);
	n->value = value;
	*pp = n;
	if (++m->count > m->nbuckets)
		grow(m);
	return NULL;
}

void *
strmap_del(strmap *m, const char *key)
{
	struct node **pp = find_slot(m, key, strmap_hash(key));
	struct node *n = *pp;
	if (!n)
		return NULL;
	void *v = n->value;
	*pp = n->next;
	free(n);
	m->count--;
	return v;
}

void
strmap_each(const strmap *m, void (*fn)(const char *key, void *value, void *ctx), void *ctx)
{
	for (size_t i = 0; i < m->nbuckets; i++)
		for (struct node *n = m->buckets[i]; n; n = n->next)
			fn(n->key, n->value, ctx);
}
