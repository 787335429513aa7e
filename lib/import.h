/*
 * import: load a directory tree into a bucket, fast, idempotent and
 * resumable.
 *
 * The pipeline: one query reads the state of every file under the prefix
 * into a table; the walk (the calling thread) skips files whose size and
 * mtime (or, with checksum, sha256) match, and queues the rest on a bounded
 * queue; worker threads, each with its own session and libmagic handle,
 * read, hash and type files and batch their chunks across many files into
 * bulk inserts; a file's document is inserted only after all its chunks are
 * acknowledged, and older revisions of its name are removed only after that.
 *
 * Resumability: before the first chunk of a file is sent, a marker
 * {_id: files_id, filename, keep} goes into <bucket>.gridfsctl_uploads; it
 * is removed once the file is complete and its old revisions are gone. The
 * next import (holding the "import" lock of its prefix or of the whole
 * bucket, so no other import of an overlapping prefix can be writing; a
 * marker names the prefix's lock in "scope", and markers of prefixes whose
 * lock is held are left alone) finishes or undoes whatever the markers
 * name: chunks without
 * a files document are removed, old revisions of completed files trimmed.
 * Files being removed (old revisions, --delete) get a marker
 * {_id, deleting: [ids]} first, so that their chunks can still be found
 * by id when a crash leaves them without files documents; recovery
 * finishes those removals before anything else.
 * Markers with a "lock" field are put's (lib/write.c), whose process may
 * still run: recovery leaves them to gfs_put_recover(), which asks the lock.
 * A dead process's chunk insert can still be applied after recovery removed
 * its chunks (the server runs what it received, client gone or not), so a
 * recovered marker is not removed at once but flagged "recovered"; at the
 * end of the run, when such a write has long landed, its chunks are removed
 * again, and the marker goes only once a pass finds none.
 * Readers never see a partial file, since they find files documents first.
 */
#ifndef GFS_IMPORT_H
#define GFS_IMPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "gfs.h"
#include "watch_names.h"
#include "maxdelete.h"
#include "markers.h"
#include "walk.h"

/* The import lock over the whole bucket; over a prefix, gfs_lock_scoped_name(GFS_IMPORT_LOCK, prefix). */
#define GFS_IMPORT_LOCK "import"
/* The longest stored name, in bytes: the index key limit of MongoDB before 4.2. */
#define GFS_IMPORT_MAX_NAME 1024
#define GFS_IMPORT_DEFAULT_BATCH (8u * 1024 * 1024)
#define GFS_IMPORT_DEFAULT_JOBS 4

typedef struct gfs_import_stats {
	uint64_t scanned;    /* regular files found by the walk and selected */
	uint64_t uploaded;   /* stored under a name that did not exist */
	uint64_t replaced;   /* stored as a new revision of an existing name */
	uint64_t skipped;    /* unchanged */
	uint64_t deleted;    /* names removed by delete_missing */
	uint64_t delete_refused;   /* names delete_missing kept: the walk found no file (allow_empty) */
	uint64_t failed;     /* files and directories that could not be imported */
	uint64_t bytes;      /* content bytes stored (or, dry run, that would be) */
	uint64_t recovered;  /* unfinished uploads of an interrupted run removed */
	uint64_t queued_files, queued_bytes;   /* found to need uploading so far */
	uint64_t done_files, done_bytes;       /* of those, finished (stored or failed) */
	double seconds;
	bool walk_errors;    /* some directory or entry could not be walked */
} gfs_import_stats;

enum gfs_import_event_kind {
	GFS_IMPORT_UPLOADED,
	GFS_IMPORT_REPLACED,
	GFS_IMPORT_SKIPPED,
	GFS_IMPORT_DELETED,
	GFS_IMPORT_FAILED,   /* path and/or name, with reason */
	GFS_IMPORT_NOTICE,   /* reason only: something the user should know */
};

typedef struct gfs_import_event {
	enum gfs_import_event_kind kind;
	bool dry_run;              /* the action would be taken */
	const char *path;          /* path bytes relative to the directory (maybe not UTF-8), or NULL */
	const char *name;          /* the GridFS filename, or NULL */
	const char *reason;        /* for FAILED and NOTICE */
	const gfs_import_stats *stats;
	int64_t bytes;             /* UPLOADED, REPLACED: the length stored; else -1 */
} gfs_import_event;

/* Called from any thread, one call at a time. */
typedef void (*gfs_import_event_fn)(const gfs_import_event *ev, void *ctx);

typedef struct gfs_import_opts {
	const char *dir;
	const char *prefix;          /* NULL or "": the bucket's top level */
	gfs_walk_opts walk;
	const char *content_type;    /* NULL: from libmagic */
	bool checksum;               /* compare sha256 instead of size and mtime */
	bool delete_missing;         /* remove names under the prefix missing on disk */
	bool allow_empty;            /* ... even when the walk found no file at all */
	gfs_max_delete max_delete;   /* ... unless they are more (GFS_ELIMIT, nothing deleted) */
	bool dry_run;
	int keep_revisions;          /* revisions of a name to keep in all; 0: every one */
	int jobs;                    /* worker threads, >= 1 */
	size_t batch_bytes;          /* chunk data per bulk insert */
	int32_t chunk_size;          /* 0: the default */
	int lock_ttl;                /* seconds; 0: the default */
	/*
	 * NULL, or the names a long-running writer knows stored (watch_names.h):
	 * a full run fills it, gfs_import_paths asks the server only for names
	 * it does not know absent, and both add what they store.
	 */
	gfs_known_names *known;
	gfs_import_event_fn on_event;
	void *ctx;
} gfs_import_opts;

typedef struct gfs_import gfs_import;

gfs_import *gfs_import_new(gfs_conn *conn, const gfs_import_opts *opts);
/*
 * Runs the import. False on a fatal error (the directory cannot be opened,
 * the backend fails, the lock is held: GFS_EBUSY) or when canceled
 * (GFS_ECANCELED); stats are filled in either way. Problems with single
 * files are events and counted in stats->failed, not fatal.
 */
bool gfs_import_run(gfs_import *imp, gfs_import_stats *stats, gfs_error *err);
/*
 * A file that changed, for gfs_import_paths: rel is relative to the
 * directory; changed says it was seen written or moved in, so that its
 * content decides whether it is stored, not its size and mtime (cp -p,
 * rsync -t and tar set an old mtime).
 */
typedef struct gfs_import_path {
	const char *rel;
	bool changed;
} gfs_import_path;

/*
 * Stores the files at the given paths, as gfs_import_run would have found
 * them, through the same batched, parallel workers (at most one per path):
 * watch's way to store many settled changes at once. Reads the state of
 * those names only (and of none that opts.known says absent), walks
 * nothing, removes nothing but the old revisions of what it stores, and
 * leaves recovery to full runs; it holds the
 * import lock while it writes (GFS_EBUSY when another holds it). A path
 * that is gone or is not a regular file is passed over without an event.
 * Not a dry run. One call per gfs_import.
 */
bool gfs_import_paths(gfs_import *imp, const gfs_import_path *paths, size_t n,
                      gfs_import_stats *stats, gfs_error *err);
/*
 * Asks a running import to stop after the files in flight: safe to call
 * from a signal handler.
 */
void gfs_import_cancel(gfs_import *imp);
void gfs_import_free(gfs_import *imp);

#endif
