/*
 * A chained hash map keyed by bytes: FNV-1a, power-of-two buckets, grows
 * at load 1. Each node carries a copy of its key, so a lookup that finds
 * its hash touches one allocation, not a node and then a key elsewhere:
 * serve looks up two of these per request in tables of 50,000 names, where
 * every extra cache miss shows. Import keeps every stored name in one and
 * verify every files document's id, so a node is only what a lookup needs.
 */
#include <stdlib.h>
#include <string.h>

#include "strmap.h"
#include "util.h"

struct node {
	struct node *next;
	uint64_t hash;
	void *value;
	uint32_t len;
	char key[];        /* len bytes and a NUL */
};

struct strmap {
	struct node **buckets;
	size_t nbuckets;   /* a power of two */
	size_t count;
};

uint64_t
gfs_fnv1a(const void *p, size_t len, uint64_t basis)
{
	const unsigned char *b = p;
	uint64_t h = basis;
	for (size_t i = 0; i < len; i++) {
		h ^= b[i];
		h *= 0x100000001b3ULL;
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
find_slot(const strmap *m, const void *key, size_t len, uint64_t h)
{
	struct node **pp = &m->buckets[h & (m->nbuckets - 1)];
	while (*pp && ((*pp)->hash != h || (*pp)->len != len || memcmp((*pp)->key, key, len) != 0))
		pp = &(*pp)->next;
	return pp;
}

void *
strmap_getn(const strmap *m, const void *key, size_t len)
{
	struct node **pp = find_slot(m, key, len, gfs_fnv1a(key, len, GFS_FNV1A_BASIS));
	return *pp ? (*pp)->value : NULL;
}

void *
strmap_get(const strmap *m, const char *key)
{
	return strmap_getn(m, key, strlen(key));
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

void **
strmap_slot(strmap *m, const void *key, size_t len)
{
	/* Longer keys than a node can say would be a bug; names and ids are far shorter. */
	if (len > UINT32_MAX)
		abort();
	uint64_t h = gfs_fnv1a(key, len, GFS_FNV1A_BASIS);
	struct node **pp = find_slot(m, key, len, h);
	if (*pp)
		return &(*pp)->value;
	struct node *n = gfs_xcalloc(1, offsetof(struct node, key) + len + 1);
	n->hash = h;
	n->len = (uint32_t)len;
	memcpy(n->key, key, len);
	*pp = n;
	/* The slot is in the node, which growing does not move. */
	if (++m->count > m->nbuckets)
		grow(m);
	return &n->value;
}

void *
strmap_put(strmap *m, const char *key, void *value)
{
	void **slot = strmap_slot(m, key, strlen(key));
	void *old = *slot;
	*slot = value;
	return old;
}

void *
strmap_del(strmap *m, const char *key)
{
	size_t len = strlen(key);
	struct node **pp = find_slot(m, key, len, gfs_fnv1a(key, len, GFS_FNV1A_BASIS));
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
