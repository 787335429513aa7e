/* The names a writer knows stored: see knownnames.h. */
#include <stdlib.h>
#include <string.h>

#include "knownnames.h"
#include "strmap.h"
#include "util.h"

/* strmap needs a non-NULL value to tell a member from a miss. */
static char member;

struct gfs_known_names {
	strmap *names;
	bool trusted;
	int64_t generation;   /* the last take of the import lock we know of */
};

gfs_known_names *
gfs_known_names_new(void)
{
	gfs_known_names *k = gfs_xcalloc(1, sizeof *k);
	k->names = strmap_new(1024);
	return k;
}

void
gfs_known_names_free(gfs_known_names *k)
{
	if (!k)
		return;
	strmap_free(k->names);
	free(k);
}

void
gfs_known_names_begin(gfs_known_names *k, int64_t generation)
{
	strmap_free(k->names);
	k->names = strmap_new(1024);
	k->generation = generation;
	k->trusted = generation > 0;
}

void
gfs_known_names_follow(gfs_known_names *k, int64_t generation)
{
	if (generation <= 0 || generation != k->generation + 1)
		k->trusted = false;
	k->generation = generation;
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
