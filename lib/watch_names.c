/* The names a writer knows stored: see watch_names.h. */
#include <stdlib.h>
#include <string.h>

#include "watch_names.h"
#include "strmap.h"
#include "util.h"

/* strmap needs a non-NULL value to tell a member from a miss. */
static char member;

struct gfs_known_names {
	strmap *names;
	bool trusted;
	int64_t generation;   /* the last take of the import lock we know of */
	uint64_t gaps;        /* takes by another holder seen between two of ours */
	strmap *unsure;       /* names stored without the lock (gfs_known_names_unsure) */
	uint64_t unsure_gaps; /* gaps when the first of them was stored */
	bool recheck;         /* some of them are to be looked at again whatever the takes */
};

gfs_known_names *
gfs_known_names_new(void)
{
	gfs_known_names *k = gfs_xcalloc(1, sizeof *k);
	k->names = strmap_new(1024);
	k->unsure = strmap_new(64);
	return k;
}

void
gfs_known_names_free(gfs_known_names *k)
{
	if (!k)
		return;
	strmap_free(k->names);
	strmap_free(k->unsure);
	free(k);
}

void
gfs_known_names_begin(gfs_known_names *k, int64_t generation)
{
	strmap_free(k->names);
	k->names = strmap_new(1024);
	if (generation <= 0 || generation != k->generation + 1)
		k->gaps++;
	k->generation = generation;
	k->trusted = generation > 0;
}

void
gfs_known_names_follow(gfs_known_names *k, int64_t generation)
{
	if (generation <= 0 || generation != k->generation + 1) {
		k->trusted = false;
		k->gaps++;
	}
	k->generation = generation;
}

void
gfs_known_names_unsure(gfs_known_names *k, const char *name)
{
	if (!strmap_count(k->unsure))
		k->unsure_gaps = k->gaps;
	strmap_put(k->unsure, name, &member);
}

void
gfs_known_names_recheck(gfs_known_names *k, const char *name)
{
	gfs_known_names_unsure(k, name);
	k->recheck = true;
}

bool
gfs_known_names_any_unsure(const gfs_known_names *k)
{
	return strmap_count(k->unsure) > 0;
}

struct names_out {
	char **v;
	size_t n;
};

static void
copy_name(const char *key, void *value, void *ctx)
{
	(void)value;
	struct names_out *o = ctx;
	o->v[o->n++] = gfs_xstrdup(key);
}

size_t
gfs_known_names_settle(gfs_known_names *k, int64_t takes, char ***recheck)
{
	*recheck = NULL;
	bool other = k->recheck || k->gaps != k->unsure_gaps || takes != k->generation;
	if (takes != k->generation) {
		/* a take that was not ours: what another import stored is not known */
		k->trusted = false;
		k->gaps++;
		k->generation = takes;
	}
	struct names_out o = {0};
	if (other) {
		o.v = gfs_xreallocarray(NULL, strmap_count(k->unsure) + 1, sizeof *o.v);
		strmap_each(k->unsure, copy_name, &o);
		*recheck = o.v;
	}
	strmap_free(k->unsure);
	k->unsure = strmap_new(64);
	k->recheck = false;
	return o.n;
}

bool
gfs_known_names_absent(const gfs_known_names *k, const char *name)
{
	return k && k->trusted && !strmap_get(k->names, name);
}

void
gfs_known_names_add(gfs_known_names *k, const char *name)
{
	strmap_put(k->names, name, &member);
}

void
gfs_known_names_forget(gfs_known_names *k, const char *name)
{
	strmap_del(k->names, name);
}

struct under {
	const char *folder;
	size_t len;
	char **found;
	size_t n, cap;
};

static void
collect_under(const char *key, void *value, void *ctx)
{
	(void)value;
	struct under *u = ctx;
	if (strncmp(key, u->folder, u->len) != 0 || key[u->len] != '/')
		return;
	GFS_GROW(u->found, u->n + 1, u->cap, 64);
	u->found[u->n++] = gfs_xstrdup(key);
}

/* The known names under folder/, copied out (strmap_each forbids changes while it runs). */
static struct under
names_under(const gfs_known_names *k, const char *folder)
{
	struct under u = {.folder = folder, .len = strlen(folder)};
	strmap_each(k->names, collect_under, &u);
	return u;
}

static void
under_free(struct under *u)
{
	for (size_t i = 0; i < u->n; i++)
		free(u->found[i]);
	free(u->found);
}

void
gfs_known_names_copy_folder(gfs_known_names *k, const char *from, const char *to)
{
	struct under u = names_under(k, from);
	for (size_t i = 0; i < u.n; i++) {
		char *moved = gfs_xasprintf("%s%s", to, u.found[i] + u.len);
		gfs_known_names_add(k, moved);
		free(moved);
	}
	under_free(&u);
}

void
gfs_known_names_forget_folder(gfs_known_names *k, const char *folder)
{
	struct under u = names_under(k, folder);
	for (size_t i = 0; i < u.n; i++)
		gfs_known_names_forget(k, u.found[i]);
	under_free(&u);
}
