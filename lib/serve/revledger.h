/*
 * A ledger of the files documents a reader has seen, so that one count on
 * the server tells whether any of them went away (serve's name index: a
 * removal must be noticed within --poll, as a new revision is, without
 * rereading the files collection every poll).
 *
 * Every document a load or a poll returns is noted by its id; the ledger
 * knows how many it has seen and not since learnt gone, in all and per
 * filename. Documents are only ever added to a collection or removed from
 * it, so a count taken before a poll's query, smaller than what the
 * ledger knows after it, proves a removal: the poll has seen at least
 * every document inserted before the count. (Equal or larger proves
 * nothing was removed among what the ledger knows.) The reverse does not
 * hold: an insert between the count and the query makes the ledger know
 * more than the count; the caller then looks closer, at a cost, and is
 * never wrong.
 *
 * Not thread-safe: one poller owns it.
 */
#ifndef GFS_REVLEDGER_H
#define GFS_REVLEDGER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct gfs_rev_ledger gfs_rev_ledger;

gfs_rev_ledger *gfs_rev_ledger_new(void);
void gfs_rev_ledger_free(gfs_rev_ledger *l);
/* Notes a document by its id key and filename (NULL: none); true when the ledger had not seen it. */
bool gfs_rev_ledger_see(gfs_rev_ledger *l, const char *id_key, const char *name);
/* Documents seen and not known to be gone. */
int64_t gfs_rev_ledger_known(const gfs_rev_ledger *l);
/* Documents of name seen and not known to be gone. */
int64_t gfs_rev_ledger_of_name(const gfs_rev_ledger *l, const char *name);
/* An equality query on name found n documents (each already seen): corrects the counts. */
void gfs_rev_ledger_set_name(gfs_rev_ledger *l, const char *name, int64_t n);
/* Whether a count taken before the last query, compared with what the ledger knows, proves a removal. */
bool gfs_rev_ledger_removed(const gfs_rev_ledger *l, int64_t count_before);

#endif
