/*
 * Markers: how a killed writer's half-done work is found and finished.
 *
 * GridFS writes a file in two steps (chunks, then the files document) and
 * removes it in two (the files document, then the chunks). A writer killed
 * between them leaves chunks no files document names, which nothing could
 * tell from another writer's upload in progress. So before its first step
 * a writer records what it is doing in a marker, a document in the bucket's
 * uploads collection (BUCKET.gridfsctl_uploads), and removes the marker
 * once the work is complete. A marker left over names work whose writer
 * died; recovery finishes it, but only once that writer is known gone (its
 * lock free, its process gone, or older than any live writer could be), so
 * that a live writer never finds its work undone under it.
 *
 * The kinds, told apart by their fields:
 *
 *   put's upload    {_id: files_id, filename, lock: "put-ID", verb, keep?,
 *                   givenId?}. Written by gfs_put() (lib/write.c) before
 *                   its first chunk, under a lock of its own (renewed while
 *                   it runs, free once its process is gone); recovered by
 *                   gfs_put_recover(), which whoever can take the lock may
 *                   run: put, rm, import, verify --repair.
 *   import's upload {_id: files_id, filename, keep, owner, scope?, verb,
 *                   started}. Written in batches by import's workers
 *                   (gfs_import_marker_new) under the import lock of their
 *                   prefix (named in scope); recovered by
 *                   gfs_import_markers_recover(), which import runs while
 *                   holding an overlapping import lock.
 *   deletion        {_id, deleting: [ids], started, owner fields, lock?}.
 *                   Written by gfs_delete_many() (every removal of files:
 *                   rm, trims of old revisions, import and mirror --delete,
 *                   watch) before the first delete; finished by
 *                   gfs_finish_deletions() once its writer is gone, or at
 *                   once by whoever holds the lock it names.
 *
 * An upload's recovery removes the chunks of a file without a files
 * document, and trims the old revisions of one that is complete (keep).
 * A chunk the dead writer had in flight may land after that, so the
 * marker is flagged ("recovered") rather than removed, and goes only when
 * a later pass finds nothing landed; its id is then remembered in
 * BUCKET.gridfsctl_recovered for some minutes, and every gfs_put_recover()
 * removes what of it lands even later.
 *
 * For reports (doctor, verify), gfs_marker_find/live/verb/left_by say which
 * marker covers a file, whether its writer may be at work, and what will
 * finish it, by the same rules recovery applies.
 *
 * A new kind of marker: its fields, its writer and its recovery here
 * (docs/design.md, "A new marker kind").
 */
#ifndef GFS_MARKERS_H
#define GFS_MARKERS_H

#include "gfs.h"
#include "lock.h"

/* The uploads collection, BUCKET.gridfsctl_uploads, that holds every marker. */
#define GFS_UPLOADS_SUFFIX "gridfsctl_uploads"
/* Uploads recovered in the last minutes, whose late writes recovery still removes. */
#define GFS_RECOVERED_SUFFIX "gridfsctl_recovered"
/* Set on the marker of a dead upload whose chunks recovery removed once. */
#define GFS_RECOVERED_FIELD "recovered"
/* On an upload marker of an import of a prefix: the lock it holds (gfs_marker_live asks it). */
#define GFS_SCOPE_FIELD "scope"

/* ---- put's upload markers ---------------------------------------------- */

/* A put's marker while the put runs: the lock "put-ID" it holds (NULL: not written yet). */
struct gfs_put_marker {
	gfs_lock *lock;
	char *lock_name;
};
/* Takes the lock of put id and records the marker (before the first chunk). */
bool gfs_put_marker_begin(gfs_session *s, const bson_value_t *id, const gfs_put_opts *o,
                          struct gfs_put_marker *m, gfs_error *err);
/* settled: the upload is stored, or its chunks are gone; else recovery decides later. */
void gfs_put_marker_end(gfs_session *s, const bson_value_t *id, struct gfs_put_marker *m,
                        bool settled);
/*
 * Removes what puts killed mid-upload left (their chunks when no files
 * document was written), skipping puts still running; *removed counts the
 * uploads newly recovered. A recovered upload's marker stays, flagged, until
 * a later call finds no chunk of it (one the dead put had in flight can land
 * late): call it again once the command's own work is done.
 */
bool gfs_put_recover(gfs_session *s, size_t *removed, gfs_error *err);
/*
 * Remembers ids as uploads recovered, whose markers go: for some minutes,
 * every gfs_put_recover() removes whatever of them lands late (a files
 * document first, then chunks) that their dead writer had in flight.
 */
bool gfs_recovered_add(gfs_session *s, const bson_value_t *ids, size_t n, gfs_error *err);

/* ---- import's upload markers ------------------------------------------- */

/*
 * The marker of an import's upload of id as name (scope: the lock of the
 * import's prefix, NULL for the whole bucket); the caller inserts and
 * destroys it.
 */
bson_t *gfs_import_marker_new(const bson_value_t *id, const char *name, int keep, const char *owner,
                              const char *scope, int64_t started);
/*
 * Recovers the upload markers of imports whose writers are gone, found in
 * uploads (only_flagged: only those recovered before, on the pass at the
 * end of a run); held is the import lock the caller holds. *recovered
 * counts uploads newly recovered, *late chunks that landed after their
 * upload's first recovery.
 */
bool gfs_import_markers_recover(gfs_session *s, mongoc_collection_t *uploads, const char *held,
                                bool only_flagged, uint64_t *recovered, int64_t *late,
                                gfs_error *err);
/*
 * A new revision that is complete: the revisions of its name older than it,
 * beyond keep - 1 of them, are to go. The one just written, and any newer
 * one, is never among them.
 */
struct gfs_newrev {
	const char *name;
	bson_oid_t id;
	int keep;
};
/*
 * Removes the old revisions of revs[0..n) in one gfs_delete_many() (lock:
 * the caller's, as there): one query by filename equality per name, never
 * one $in (rule 2 of docs/design.md).
 */
bool gfs_trim_revisions(gfs_session *s, const char *lock, const struct gfs_newrev *revs, size_t n,
                        gfs_error *err);

/* ---- deletion markers -------------------------------------------------- */

/*
 * Completes the removals that writers cut short recorded: those whose
 * writer ran on this host and is gone, or started more than a lock's ttl
 * ago, and those covered by the lock held (NULL: none), which the caller
 * holds. *files counts the ids finished.
 */
bool gfs_finish_deletions(gfs_session *s, const char *held, size_t *files, gfs_error *err);

/* ---- what markers say, for reports ------------------------------------- */

/*
 * The marker in BUCKET.gridfsctl_uploads of files_id fid, an upload's (by
 * _id) or else a removal's (naming fid in "deleting"). 1 found (*out set),
 * 0 none, -1 error.
 */
int gfs_marker_find(gfs_session *s, const bson_value_t *fid, bson_t *out, gfs_error *err);
/*
 * Whether the writer of marker may still be at work: 1 yes, 0 no (its work
 * is left for the next run that finishes it), -1 error. held: a lock the
 * caller holds (NULL: none), whose markers' writers are gone. The rule is
 * the one the finishing runs apply (gfs_put_recover, gfs_finish_deletions,
 * import's recovery), so what is called left over is what they take.
 */
int gfs_marker_live(gfs_session *s, const bson_t *marker, const char *held, gfs_error *err);
/* "left by an interrupted VERB (the next ... removes them)" for a marker whose writer is gone. */
void gfs_marker_left_by(const bson_t *marker, char *buf, size_t len);
/* The verb a marker's writer ran ("put", "rm", "import", ...), from its "verb" or its shape. */
const char *gfs_marker_verb(const bson_t *marker);

#endif
