/*
 * Micro-benchmark: the name table of import and the id table of verify,
 * as lib/strmap serves them, beside the private tables they had before
 * (kept here, reduced to what was measured, as the peer). No backend: the
 * workloads replay what the tables see for N files of a poster tree.
 *
 *   import  N stored names found-or-added (load), again (the walk), then
 *           every directory above each name looked up (--delete's under_link)
 *   verify  N files documents' ids added, then one lookup per chunk group
 *
 * Prints per workload and table: best of R runs in CPU ns per file (the
 * process's CPU clock, steadier than wall time on a loaded machine), and heap
 * bytes per file (mallinfo2) while the table is full.
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Ilib bench/strmap_bench.c lib/strmap.c lib/util.c \
 *       $(pkg-config --cflags --libs libmongoc-1.0) -lm -o /tmp/strmap_bench
 *   /tmp/strmap_bench [N] [R]
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gfs.h"
#include "strmap.h"

/* ---- the state each table holds per file, as import.c and verify.c have it ---- */

struct state {
	bool existing, seen, link_dir;
	int64_t length, upload_ms;
	bson_oid_t oid;
	bool has_oid;
	int64_t mtime_ns;
	bool has_mtime, mtime_ms_only, racy;
	char sha[65];
};

/* ---- the peers: import's and verify's tables before issue 15 ---- */

struct old_entry {
	struct old_entry *next;
	uint64_t hash;
	char *name;
	struct state st;
};

struct old_names {
	struct old_entry **slots;
	size_t nslots, count;
};

static void
old_names_grow(struct old_names *t)
{
	size_t n = t->nslots ? t->nslots * 2 : 1024;
	struct old_entry **slots = gfs_xcalloc(n, sizeof *slots);
	for (size_t i = 0; i < t->nslots; i++) {
		struct old_entry *e = t->slots[i], *next;
		for (; e; e = next) {
			next = e->next;
			e->next = slots[e->hash & (n - 1)];
			slots[e->hash & (n - 1)] = e;
		}
	}
	free(t->slots);
	t->slots = slots;
	t->nslots = n;
}

static struct old_entry *
old_names_find(const struct old_names *t, const char *name, uint64_t h)
{
	if (!t->nslots)
		return NULL;
	for (struct old_entry *e = t->slots[h & (t->nslots - 1)]; e; e = e->next)
		if (e->hash == h && strcmp(e->name, name) == 0)
			return e;
	return NULL;
}

static struct state *
old_names_get(struct old_names *t, const char *name)
{
	uint64_t h = gfs_fnv1a(name, strlen(name), GFS_FNV1A_BASIS);
	struct old_entry *e = old_names_find(t, name, h);
	if (e)
		return &e->st;
	if (t->nslots == 0 || t->count * 4 >= t->nslots * 3)
		old_names_grow(t);
	e = gfs_xcalloc(1, sizeof *e);
	e->name = gfs_xstrdup(name);
	e->hash = h;
	e->next = t->slots[h & (t->nslots - 1)];
	t->slots[h & (t->nslots - 1)] = e;
	t->count++;
	return &e->st;
}

static bool
old_under_link(const struct old_names *t, const char *name)
{
	char *copy = gfs_xstrdup(name);
	bool found = false;
	for (char *slash = strchr(copy, '/'); !found && slash; slash = strchr(slash + 1, '/')) {
		*slash = '\0';
		const struct old_entry *e =
		    old_names_find(t, copy, gfs_fnv1a(copy, strlen(copy), GFS_FNV1A_BASIS));
		found = e && e->st.link_dir;
		*slash = '/';
	}
	free(copy);
	return found;
}

static void
old_names_free(struct old_names *t)
{
	for (size_t i = 0; i < t->nslots; i++) {
		struct old_entry *e = t->slots[i], *next;
		for (; e; e = next) {
			next = e->next;
			free(e->name);
			free(e);
		}
	}
	free(t->slots);
	memset(t, 0, sizeof *t);
}

struct old_vfile {
	bson_t key;
	uint64_t hash;
	bson_value_t id;
	gfs_file f;
	bool bad, seen;
	char *bad_name;
	char bad_detail[512];
};

struct old_ids {
	struct old_vfile **slots;
	size_t cap, count;
};

static uint64_t
key_hash(const bson_t *key)
{
	return gfs_fnv1a(bson_get_data(key), key->len, GFS_FNV1A_BASIS);
}

static bool
key_eq(const bson_t *a, const bson_t *b)
{
	return a->len == b->len && memcmp(bson_get_data(a), bson_get_data(b), a->len) == 0;
}

static void
old_ids_grow(struct old_ids *t)
{
	size_t ncap = t->cap ? t->cap * 2 : 1024;
	struct old_vfile **ns = gfs_xcalloc(ncap, sizeof *ns);
	for (size_t i = 0; i < t->cap; i++) {
		struct old_vfile *v = t->slots[i];
		if (!v)
			continue;
		size_t j = v->hash & (ncap - 1);
		while (ns[j])
			j = (j + 1) & (ncap - 1);
		ns[j] = v;
	}
	free(t->slots);
	t->slots = ns;
	t->cap = ncap;
}

static struct old_vfile *
old_ids_find(const struct old_ids *t, const bson_t *key, uint64_t h)
{
	if (!t->cap)
		return NULL;
	for (size_t j = h & (t->cap - 1); t->slots[j]; j = (j + 1) & (t->cap - 1))
		if (t->slots[j]->hash == h && key_eq(&t->slots[j]->key, key))
			return t->slots[j];
	return NULL;
}

static bool
old_ids_add(struct old_ids *t, struct old_vfile *v)
{
	if ((t->count + 1) * 2 > t->cap)
		old_ids_grow(t);
	if (old_ids_find(t, &v->key, v->hash))
		return false;
	size_t j = v->hash & (t->cap - 1);
	while (t->slots[j])
		j = (j + 1) & (t->cap - 1);
	t->slots[j] = v;
	t->count++;
	return true;
}

/* The new vfile: verify.c's, without key and hash. */
struct vfile {
	bson_value_t id;
	gfs_file f;
	bool bad, seen;
	char *bad_name;
	char bad_detail[512];
};

/* ---- the workloads ---- */

static char **names;
static bson_oid_t *oids;

static void
id_key(const bson_oid_t *oid, bson_t *key)
{
	bson_init(key);
	bson_append_oid(key, "", 0, oid);
}

static double
now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static size_t
heap(void)
{
	return mallinfo2().uordblks;
}

static struct state *
new_get(strmap *m, const char *name)
{
	void **slot = strmap_slot(m, name, strlen(name));
	if (!*slot)
		*slot = gfs_xcalloc(1, sizeof(struct state));
	return *slot;
}

static bool
new_under_link(const strmap *m, const char *name)
{
	for (const char *slash = strchr(name, '/'); slash; slash = strchr(slash + 1, '/')) {
		const struct state *e = strmap_getn(m, name, (size_t)(slash - name));
		if (e && e->link_dir)
			return true;
	}
	return false;
}

static void
free_value(const char *key, void *value, void *ctx)
{
	(void)key;
	(void)ctx;
	free(value);
}

static size_t sink;

static void
import_old(size_t n, double *secs, size_t *bytes)
{
	size_t h0 = heap();
	double t0 = now();
	struct old_names t = {0};
	for (size_t i = 0; i < n; i++)
		old_names_get(&t, names[i])->existing = true;
	for (size_t i = 0; i < n; i++)
		old_names_get(&t, names[i])->seen = true;
	*bytes = heap() - h0;
	for (size_t i = 0; i < n; i++)
		sink += old_under_link(&t, names[i]);
	*secs = now() - t0;
	old_names_free(&t);
}

static void
import_new(size_t n, double *secs, size_t *bytes)
{
	size_t h0 = heap();
	double t0 = now();
	strmap *m = strmap_new(1024);
	for (size_t i = 0; i < n; i++)
		new_get(m, names[i])->existing = true;
	for (size_t i = 0; i < n; i++)
		new_get(m, names[i])->seen = true;
	*bytes = heap() - h0;
	for (size_t i = 0; i < n; i++)
		sink += new_under_link(m, names[i]);
	*secs = now() - t0;
	strmap_each(m, free_value, NULL);
	strmap_free(m);
}

static void
verify_old(size_t n, double *secs, size_t *bytes)
{
	size_t h0 = heap();
	double t0 = now();
	struct old_ids t = {0};
	struct old_vfile **all = gfs_xcalloc(n, sizeof *all);
	for (size_t i = 0; i < n; i++) {
		struct old_vfile *v = all[i] = gfs_xcalloc(1, sizeof *v);
		v->id.value_type = BSON_TYPE_OID;
		v->id.value.v_oid = oids[i];
		id_key(&oids[i], &v->key);
		v->hash = key_hash(&v->key);
		old_ids_add(&t, v);
	}
	*bytes = heap() - h0;
	for (size_t i = 0; i < n; i++) {
		bson_t key;
		id_key(&oids[i], &key);
		uint64_t h = key_hash(&key);
		sink += old_ids_find(&t, &key, h) != NULL;
		bson_destroy(&key);
	}
	*secs = now() - t0;
	for (size_t i = 0; i < n; i++) {
		bson_destroy(&all[i]->key);
		free(all[i]);
	}
	free(all);
	free(t.slots);
}

static void
verify_new(size_t n, double *secs, size_t *bytes)
{
	size_t h0 = heap();
	double t0 = now();
	strmap *m = strmap_new(1024);
	struct vfile **all = gfs_xcalloc(n, sizeof *all);
	for (size_t i = 0; i < n; i++) {
		struct vfile *v = all[i] = gfs_xcalloc(1, sizeof *v);
		v->id.value_type = BSON_TYPE_OID;
		v->id.value.v_oid = oids[i];
		bson_t key;
		id_key(&oids[i], &key);
		void **slot = strmap_slot(m, bson_get_data(&key), key.len);
		if (!*slot)
			*slot = v;
		bson_destroy(&key);
	}
	*bytes = heap() - h0;
	for (size_t i = 0; i < n; i++) {
		bson_t key;
		id_key(&oids[i], &key);
		sink += strmap_getn(m, bson_get_data(&key), key.len) != NULL;
		bson_destroy(&key);
	}
	*secs = now() - t0;
	for (size_t i = 0; i < n; i++)
		free(all[i]);
	free(all);
	strmap_free(m);
}

static void
run(const char *what, void (*old)(size_t, double *, size_t *),
    void (*new)(size_t, double *, size_t *), size_t n, int repeat)
{
	double best[2] = {1e9, 1e9};
	size_t bytes[2] = {0, 0};
	for (int r = 0; r < repeat; r++) {
		for (int k = 0; k < 2; k++) {
			double s;
			(k ? new : old)(n, &s, &bytes[k]);
			if (s < best[k])
				best[k] = s;
		}
	}
	printf("%-7s before %6.0f ns/file %5zu B/file | after %6.0f ns/file %5zu B/file | "
	       "time %.2fx, memory %.2fx\n", what, best[0] * 1e9 / n, bytes[0] / n,
	       best[1] * 1e9 / n, bytes[1] / n, best[1] / best[0], (double)bytes[1] / bytes[0]);
}

int
main(int argc, char **argv)
{
	size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 52000;
	int repeat = argc > 2 ? atoi(argv[2]) : 5;
	names = gfs_xcalloc(n, sizeof *names);
	oids = gfs_xcalloc(n, sizeof *oids);
	for (size_t i = 0; i < n; i++) {
		/* gen_posters.py's layout: posters/ab/cd/<40 hex>.jpg */
		char hex[41];
		uint64_t a = gfs_fnv1a(&i, sizeof i, GFS_FNV1A_BASIS), b = gfs_fnv1a(&a, sizeof a, 7);
		snprintf(hex, sizeof hex, "%016llx%016llx%08x", (unsigned long long)a,
		         (unsigned long long)b, (unsigned)(a ^ b));
		char buf[80];
		snprintf(buf, sizeof buf, "posters/%.2s/%.2s/%s.jpg", hex, hex + 2, hex);
		names[i] = gfs_xstrdup(buf);
		bson_oid_init(&oids[i], NULL);
	}
	printf("%zu files, best of %d\n", n, repeat);
	run("import", import_old, import_new, n, repeat);
	run("verify", verify_old, verify_new, n, repeat);
	return sink == 0;
}
