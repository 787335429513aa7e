/*
 * verify's second half: what the pass (verify.h) found, compared with a
 * disk tree and repaired.
 *
 * A gfs_verify_disk is fed every problem and verdict of a gfs_verify()
 * pass (gfs_verify_disk_problem, gfs_verify_disk_file: call them from the
 * pass's callbacks) and keeps what a comparison or a repair needs. After
 * the pass, gfs_verify_disk_compare() walks the directory as import would
 * and matches it name by name with the newest revision of each stored
 * name; gfs_verify_disk_repair() then acts on what is left. Every problem
 * found here and every repair tried is handed to on_event, in order, on
 * the calling thread.
 *
 * Repairs never remove what a reader could read: a damaged file goes only
 * after its replacement from disk is complete, incomplete uploads and
 * orphan chunks only after a second look (their files document or chunks
 * may have come since), duplicates only when a hash proves the copies read
 * right. Orphan chunks younger than the grace may be an upload in progress.
 */
#ifndef GFS_VERIFY_DISK_H
#define GFS_VERIFY_DISK_H

#include <stdatomic.h>

#include "gfs.h"
#include "verify.h"

enum gfs_verify_disk_event_kind {
	GFS_VD_PROBLEM,     /* what: MISSING-IN-GRIDFS, MISSING-ON-DISK, DIFFERS, DISK-ERROR */
	GFS_VD_REPAIR,      /* what: the repair (upload, reupload, remove-orphans, ..., none) */
	GFS_VD_COMPARED,    /* mark: '=' same, '-' only on disk, '+' only in GridFS, '*' differs,
	                       '!' damaged in GridFS (or the disk copy unreadable) */
};

typedef struct gfs_verify_disk_event {
	enum gfs_verify_disk_event_kind kind;
	const char *what;
	const char *name;           /* the GridFS name, or (DISK-ERROR of the walk) the path; may be NULL */
	const bson_value_t *id;     /* the files _id (orphans: their files_id), or NULL */
	const char *detail;
	const char *rel;            /* PROBLEM about a file on disk: its path relative to dir, or NULL */
	size_t rel_len;
	bool ok;                    /* REPAIR: done (with dry_run: would be tried) */
	char mark;                  /* COMPARED */
} gfs_verify_disk_event;

typedef void (*gfs_verify_disk_event_fn)(const gfs_verify_disk_event *ev, void *ctx);

typedef struct gfs_verify_disk_opts {
	const char *dir;            /* the tree to compare with; NULL: none */
	const char *prefix;         /* normalized (filename.h); NULL or "": the top level */
	bool (*select)(const char *rel, void *ctx);  /* NULL, or which files of dir to compare */
	bool repair;
	bool dry_run;               /* with repair: say what would be done, do nothing */
	long grace_s;               /* orphan chunks younger than this are left */
	gfs_verify_disk_event_fn on_event;
	void *ctx;
	const atomic_int *stop;     /* when non-zero, the comparison and the repairs end */
} gfs_verify_disk_opts;

typedef struct gfs_verify_disk_stats {
	uint64_t problems;          /* found here, beyond the pass's */
	uint64_t same, differ, only_disk, only_gridfs, damaged;
	uint64_t repaired, unrepaired;   /* problems, each counted once (not with dry_run) */
} gfs_verify_disk_stats;

typedef struct gfs_verify_disk gfs_verify_disk;

gfs_verify_disk *gfs_verify_disk_new(const gfs_verify_disk_opts *o);
void gfs_verify_disk_free(gfs_verify_disk *d);
/* Keeps a problem of the pass (GFS_VK_IN_PROGRESS is nobody's to repair and is not kept). */
void gfs_verify_disk_problem(gfs_verify_disk *d, const gfs_verify_problem *p);
/* Ties the problems kept since the last verdict to this file; keeps the verdict when comparing. */
void gfs_verify_disk_file(gfs_verify_disk *d, const gfs_verify_file *v);
/*
 * Compares with opts.dir. False with err when the tree cannot be walked,
 * or with GFS_ECANCELED when stopped; differences are not failures.
 */
bool gfs_verify_disk_compare(gfs_verify_disk *d, gfs_session *s, gfs_error *err);
/* Repairs what was found, one REPAIR event per problem; stops early when told. */
void gfs_verify_disk_repair(gfs_verify_disk *d, gfs_session *s);
const gfs_verify_disk_stats *gfs_verify_disk_stats_of(const gfs_verify_disk *d);

#endif
