/*
 * Known names: which names a bucket holds under one prefix, as the one
 * long-running writer there (watch) knows it, so that storing a file under
 * a name known to be absent costs no round trip to ask.
 *
 * A full import pass reads every name under the prefix anyway: it fills the
 * set (gfs_known_names_begin) while it holds the import lock. From then on
 * the writer adds every name it is about to store or rename to, before the
 * write goes out (a write whose reply is lost may still have landed), and
 * drops names only once their removal or rename away is acknowledged. The
 * set is thus a superset of the stored names, and only absence is trusted:
 * a name in the set is looked up as before.
 *
 * Other writers break that. Every take of the import lock is numbered
 * (gfs_lock_generation): when the writer's next take is not numbered one
 * past its last, another import held the lock in between, and the set is
 * doubted (every name is asked for) until the next full pass. Writers that
 * take no lock (put, rm, other clients) are not seen; watch(1) says so.
 *
 * Not thread-safe: used from the thread that queues work.
 */
#ifndef GFS_KNOWNNAMES_H
#define GFS_KNOWNNAMES_H

#include <stdbool.h>
#include <stdint.h>

typedef struct gfs_known_names gfs_known_names;

gfs_known_names *gfs_known_names_new(void);
void gfs_known_names_free(gfs_known_names *k);

/* Empties the set for a full pass under the lock take numbered generation (0: unknown). */
void gfs_known_names_begin(gfs_known_names *k, int64_t generation);
/* A later take of the lock: trust stays only when it is numbered one past the last. */
void gfs_known_names_follow(gfs_known_names *k, int64_t generation);

/*
 * Names the writer stored without holding the import lock (put's way, one
 * by one, or a rename onto them): an import that held the lock meanwhile
 * may have stored them too, and each writer's trim keeps its own revision.
 * They stay unsure until gfs_known_names_settle is told the lock's takes.
 */
void gfs_known_names_unsure(gfs_known_names *k, const char *name);
/* An unsure name to look at again whatever the takes say (a look that failed). */
void gfs_known_names_recheck(gfs_known_names *k, const char *name);
bool gfs_known_names_any_unsure(const gfs_known_names *k);
/*
 * The count of the lock's takes now (gfs_lock_takes), read while nobody
 * holds it: when some take since the first unsure name was not ours,
 * *recheck receives the unsure names (caller frees each and the array) to
 * look at again, and their number is returned; else 0 (*recheck NULL).
 * Either way none is unsure any more, and a take not ours ends the trust.
 */
size_t gfs_known_names_settle(gfs_known_names *k, int64_t takes, char ***recheck);

/* True when the name is surely not stored: the set is trusted and lacks it. */
bool gfs_known_names_absent(const gfs_known_names *k, const char *name);
void gfs_known_names_add(gfs_known_names *k, const char *name);
/* Acknowledged gone (all revisions removed, or renamed away). */
void gfs_known_names_forget(gfs_known_names *k, const char *name);

/*
 * Folders, by the names below them ("a/b" stands for every name under
 * "a/b/"): copy adds under `to` every known name under `from` (before a
 * rename goes out); forget drops every known name under the folder.
 */
void gfs_known_names_copy_folder(gfs_known_names *k, const char *from, const char *to);
void gfs_known_names_forget_folder(gfs_known_names *k, const char *folder);

#endif
