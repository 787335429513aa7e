/*
 * serve's disk tier: a content-addressed cache of file bodies in a local
 * directory, between the memory cache and the backend, so that files beyond
 * RAM are served at disk speed and a restart starts warm. GridFS stays the
 * source of truth; everything here may be lost at any time.
 *
 * Naming. An entry is named "r-" and the SHA-256 of the revision's identity:
 * typed _id key, length, stored hash (the cache key) and uploadDate. Stored
 * names never become paths; a new revision has another _id or uploadDate,
 * so it can never be answered with the old bytes. An entry is written only
 * from a read of its own revision's chunks that passed the integrity rule,
 * so a files document whose hash names another file's content is never
 * answered with that file's bytes: two files with the same content have
 * two entries (sharing one would serve a file whose own chunks were never
 * read).
 *
 * Proof. An entry is the body followed by its SHA-256 in 64 hex digits
 * (the trailer), hashed as it is written. What the tier serves is proven:
 * its body hashes to its trailer (and to the file's metadata.sha256 when it
 * has one), and the file is still the one that was hashed, by fstat's
 * identity (device, inode, size, mtime, ctime) remembered with the proof. A
 * hit pays an fstat anyway: an entry whose identity changed since (written
 * to, truncated, replaced by a rename) is proven again, or, when that fails,
 * removed, before a byte of it is sent. A fill is proven as it is written;
 * an entry found at start (or written by another server) is not, until the
 * writer thread has hashed it in its idle moments, newest first, or a hit
 * proves it first: inline when the body is at most PROVE_INLINE_MAX (256
 * KiB), else the hit is a miss (the backend read writes it anew). A change
 * within the file system's timestamp granularity of the proof, keeping the
 * size, inode and times, is not seen: the identity is what fstat can tell.
 *
 * Atomic fill. A fill writes DIR/tmp/<name>.<pid>.<n> and renames it to
 * DIR/<name> once complete and checked; no fsync (the tier is a cache). A
 * crash may leave a renamed entry whose data never reached the disk: its
 * size or its trailer is then wrong and the entry is discarded when opened,
 * proven or indexed, never served.
 *
 * Restart. disktier_open() indexes DIR in one pass (readdir and fstatat, no
 * backend reads), oldest fill first in the LRU order; entries of earlier
 * versions (named by content, without a trailer) are removed.
 * disktier_reconcile() then checks the entries against serve's metadata
 * index: an entry no file refers to, or with the wrong size, is evicted.
 * Temporary files left by a process that is gone (or older than an hour)
 * are removed.
 *
 * Eviction. Least recently used by bytes (st_size), down to max_bytes, when
 * a fill commits. Hits only reorder the in-memory list; nothing is written
 * on a hit (entries are opened O_NOATIME).
 *
 * Cost of a fill: a create, a write and a rename, about 0.05 ms of system
 * CPU for 40 KB on ext4, and hashing the body, about 0.03 ms. A proof
 * costs the hashing too: 0.18 s of CPU for 5,000 posters after a restart. On an ext4 without a journal, inode allocation
 * skips every inode deleted in the last minute or more (the kernel's
 * recently_deleted()), so fills while the tier evicts, or after DIR was
 * emptied, cost about ten times that; the manual says where to put DIR.
 *
 * Errors. A full disk or an I/O error on the tier drops the fill and backs
 * off: no fill is tried for a pause that doubles with each failure (1 s to
 * 60 s), one log line per pause, until fills have worked for twice the last
 * pause ("writing again"). Serving goes on from memory and the backend.
 * Evicted entries are unlinked; a caller that holds them open must close
 * them for their space to be freed (disktier_stats' evictions tell when).
 *
 * Concurrency. Threads: one mutex over the map and the LRU list, never held
 * across I/O. Fills from serve's fetches are written by one writer thread of
 * the tier's own, from a queue bounded in bytes, so that no fetch waits on
 * the file system (its journal can stall behind a neighbour's fsync); a
 * fill that finds the queue full is dropped. The writer ("tier-writer")
 * runs at nice 19: on a busy machine fills take the idle moments, not the
 * CPU that answers need. Processes: several
 * servers may share DIR (the supervisor runs two). Temporary names carry the
 * pid, renames are atomic and entries under one name are identical by
 * construction, so a server only ever opens a complete entry; one that finds
 * an entry it does not know adopts it, one whose entry another evicted sees
 * ENOENT and counts a miss. Each server bounds only the bytes it knows of,
 * so n servers on one DIR may hold up to n times max_bytes: give each its
 * share. Servers sharing DIR must serve the same bucket and prefix, or
 * reconciling evicts each other's entries.
 */
#ifndef GFS_DISKTIER_H
#define GFS_DISKTIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../gfs.h"
#include "nameindex.h"

/* The default size: this share of the free space at start, at most DISKTIER_DEFAULT_CAP. */
#define DISKTIER_NAME_MAX 72   /* an entry's name: "r-" and 64 hex digits, and a NUL */
#define DISKTIER_DEFAULT_PERCENT 90
#define DISKTIER_DEFAULT_CAP (100ULL << 30)

typedef struct disktier disktier;
typedef struct disktier_fill disktier_fill;

/*
 * Opens (creating it 0700) and indexes dir. max_bytes 0: the default size.
 * log receives one-line messages (may be NULL).
 */
disktier *disktier_open(const char *dir, uint64_t max_bytes, void (*log)(const char *msg),
                        gfs_error *err);
void disktier_close(disktier *t);

/*
 * A read-only descriptor of m's entry, proven (see Proof), for the caller
 * to close; -1 on a miss. Counts a hit or a miss. May hash an entry of up
 * to PROVE_INLINE_MAX bytes. name (may be NULL) receives the entry's name.
 */
int disktier_get(disktier *t, const gfs_meta *m, char name[DISKTIER_NAME_MAX]);
/*
 * For a caller that holds fd, a descriptor of the entry disktier_get named
 * name, open (-1 for an empty file): counts a hit and marks it used, if
 * the tier still has it and fd is still the file proven (false: evicted or
 * changed meanwhile; close it and ask disktier_get). Computes no name: the
 * hit of an entry held open costs an fstat and a lookup.
 */
bool disktier_touch(disktier *t, const char *name, int fd);
/* Is m's entry known to be present (proven or not)? Counts nothing. */
bool disktier_has(disktier *t, const gfs_meta *m);

/*
 * Starts writing m's entry; NULL when it cannot be kept (larger than the
 * tier, or the tier cannot create files right now). Write the whole body,
 * then commit (the size is checked) or abort; both free the fill.
 */
disktier_fill *disktier_fill_begin(disktier *t, const gfs_meta *m);
bool disktier_fill_write(disktier_fill *f, const void *data, size_t len);
void disktier_fill_commit(disktier_fill *f);
void disktier_fill_abort(disktier_fill *f);
/* begin, write, commit in one. */
void disktier_put(disktier *t, const gfs_meta *m, const void *data, size_t len);
/*
 * The same on the tier's writer thread, which then calls done(ctx): data
 * must stay valid until then. When more than a bound of bytes waits
 * already, or the entry is there, done is called at once and nothing is
 * written (a later miss fills it).
 */
void disktier_put_async(disktier *t, const gfs_meta *m, const void *data, size_t len,
                        void (*done)(void *ctx), void *ctx);

/* Evicts entries that no file in ix refers to, or whose size is not its file's. */
void disktier_reconcile(disktier *t, name_index *ix);

struct disktier_stats {
	uint64_t hits, misses, evictions, errors, dropped;
	uint64_t proofs, proof_failures;   /* entries hashed after their fill; of them, wrong */
	uint64_t bytes, max_bytes, entries, unproven;
};
void disktier_stats(disktier *t, struct disktier_stats *out);

#endif
