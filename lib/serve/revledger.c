/* Documents seen, to notice removals from one count: see revledger.h. */
#include <stdlib.h>
#include <string.h>

#include "revledger.h"
#include "../strmap.h"
#include "../util.h"

struct gfs_rev_ledger {
	strmap *ids;      /* id key -> &seen_mark */
	strmap *names;    /* filename -> int64_t* documents of that name */
	int64_t known;
};

static char seen_mark;

gfs_rev_ledger *
gfs_rev_ledger_new(void)
{
	gfs_rev_ledger *l = gfs_xcalloc(1, sizeof *l);
	l->ids = strmap_new(1024);
	l->names = strmap_new(1024);
	return l;
}

static void
free_value(const char *key, void *value, void *ctx)
{
	(void)key;
	(void)ctx;
	free(value);
}

void
gfs_rev_ledger_free(gfs_rev_ledger *l)
{
	if (!l)
		return;
	strmap_free(l->ids);
	strmap_each(l->names, free_value, NULL);
	strmap_free(l->names);
	free(l);
}

static int64_t *
name_slot(gfs_rev_ledger *l, const char *name)
{
	void **slot = strmap_slot(l->names, name, strlen(name));
	if (!*slot)
		*slot = gfs_xcalloc(1, sizeof(int64_t));
	return *slot;
}

bool
gfs_rev_ledger_see(gfs_rev_ledger *l, const char *id_key, const char *name)
{
	void **slot = strmap_slot(l->ids, id_key, strlen(id_key));
	if (*slot)
		return false;
	*slot = &seen_mark;
	l->known++;
	if (name)
		(*name_slot(l, name))++;
	return true;
}

int64_t
gfs_rev_ledger_known(const gfs_rev_ledger *l)
{
	return l->known;
}

int64_t
gfs_rev_ledger_of_name(const gfs_rev_ledger *l, const char *name)
{
	int64_t *n = strmap_get(l->names, name);
	return n ? *n : 0;
}

void
gfs_rev_ledger_set_name(gfs_rev_ledger *l, const char *name, int64_t n)
{
	int64_t *have = name_slot(l, name);
	l->known += n - *have;
	*have = n;
}

bool
gfs_rev_ledger_removed(const gfs_rev_ledger *l, int64_t count_before)
{
	return count_before < l->known;
}
