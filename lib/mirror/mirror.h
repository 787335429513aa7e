/*
 * Mirror: writing a bucket back to a directory tree, the face of
 * lib/mirror/ (the only header outside it that anything includes).
 *
 * A run (gfs_mirror_run) lists the newest revision of every name under a
 * prefix and works out the local path of each (prefix stripped,
 * metadata.rawName restored, every name checked by safepath). Each planned
 * file is then compared with what is on disk (size and mtime, or sha256)
 * and, when it differs, written to a temporary file beside its target,
 * fsync'd, given its mode and mtime and renamed into place: a reader sees
 * the old file or the new one, never a part. A sweep of the tree afterwards
 * removes temporary files that an interrupted run left behind and, when
 * asked, local files the bucket does not have. Nothing is written outside
 * DIR; what --delete or an overwrite would destroy can be kept in a backup
 * directory first.
 *
 * The parts, and what each one does, are listed in lib/mirror/internal.h.
 * The name rules below are the ones every writer checks too, so that
 * nothing is stored that mirror would refuse on every run.
 */
#ifndef GFS_MIRROR_H
#define GFS_MIRROR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../gfs.h"
#include "../maxdelete.h"
#include "../read_strategy.h"

/* Temporary files: ".gridfsctl-mirror-" 16 hex digits ".tmp". */
#define GFS_MIRROR_TMP_PREFIX ".gridfsctl-mirror-"
#define GFS_MIRROR_TMP_SUFFIX ".tmp"

/*
 * The sweep holds one descriptor per level it is inside, so it goes at most
 * this many folders deep, well below the usual limit of 1024 open files;
 * names deeper than that are refused, so that a tree mirror wrote is always
 * one it can sweep.
 */
#define GFS_MIRROR_DEPTH_MAX 512

/*
 * The rules a stored name (below the mirror prefix; raw bytes when it has a
 * rawName) must meet to become a local path: gfs_safepath_check(), and a
 * last segment that is not a temporary-file name, and at most
 * GFS_MIRROR_DEPTH_MAX folders. Writers check names with
 * it too, so nothing is stored that mirror would refuse on every run.
 */
bool gfs_mirror_name_check(const char *rel, size_t len, gfs_error *err);

/*
 * The local path for a stored filename under the normalized prefix: the
 * name with the prefix stripped or, when raw (metadata.rawName) is given,
 * those bytes in place of the matching trailing segments. Checked with
 * gfs_safepath_check(); temporary-file names and paths more than
 * GFS_MIRROR_DEPTH_MAX folders deep are refused too. Caller frees *out.
 */
bool gfs_mirror_local_path(const char *filename, const char *nprefix, const char *raw,
                           size_t raw_len, char **out, size_t *out_len, gfs_error *err);

/* True when base (one path segment) has the form of a mirror temporary file. */
bool gfs_mirror_is_temp_name(const char *base, size_t len);
/* Writes a fresh temporary name into buf. */
void gfs_mirror_temp_name(char buf[64]);

/* ---- a run ------------------------------------------------------------ */

/* Whether a run takes the local path rel[0..len) (rel[len] is NUL). */
typedef bool (*gfs_mirror_select_fn)(const char *rel, size_t len, void *ctx);

/* What a run has counted (a snapshot: events carry one, gfs_mirror_run fills one). */
typedef struct gfs_mirror_stats {
	uint64_t files;        /* planned: newest revisions the run takes */
	uint64_t total_bytes;  /* their length */
	uint64_t written, attrs, skipped;   /* files written, given mode and mtime, up to date */
	uint64_t deleted, rmdirs, cleaned;  /* the sweep's: files, directories, temporary files */
	uint64_t failed;       /* failures, names refused among them */
	uint64_t refused;      /* stored names that cannot be mirrored */
	uint64_t bytes;        /* content written (or, dry run, to be written) */
	uint64_t backed_up;    /* entries kept in the backup directory */
	uint64_t done, done_bytes;   /* of the files, finished (either way) so far */
	bool backend_down;     /* the backend failed: the run stopped early */
	bool empty_refused;    /* --delete refused: nothing planned, and DIR not empty */
	bool interrupted;      /* a stop was asked for: files finished so far are in place */
} gfs_mirror_stats;

enum gfs_mirror_event_kind {
	GFS_MIRROR_EV_PROBLEM,   /* msg: one line, something failed or was refused */
	GFS_MIRROR_EV_REFUSED,   /* name cannot be mirrored, msg why (a problem too) */
	GFS_MIRROR_EV_BEGIN,     /* the plan is known (stats->files, total_bytes): work starts */
	GFS_MIRROR_EV_PROGRESS,  /* stats->done and done_bytes moved (at most five a second) */
	GFS_MIRROR_EV_END,       /* the files are done; the sweep comes next */
	GFS_MIRROR_EV_WRITE,     /* rel: written (dry run: to write); name and bytes too */
	GFS_MIRROR_EV_ATTRS,     /* rel: mode and mtime fixed (or to fix); name and bytes too */
	GFS_MIRROR_EV_CLEAN,     /* rel: a temporary file of an earlier run removed */
	GFS_MIRROR_EV_DELETE,    /* rel: a file the bucket does not have removed (or kept away) */
	GFS_MIRROR_EV_RMDIR,     /* rel: a directory left empty removed */
};

typedef struct gfs_mirror_event {
	enum gfs_mirror_event_kind kind;
	bool dry_run;              /* the action would be taken */
	const char *rel;           /* the local path beneath DIR (raw bytes), or NULL */
	size_t rel_len;
	const char *name;          /* the stored name, or NULL */
	int64_t bytes;             /* WRITE, ATTRS: the file's length; else -1 */
	const char *msg;           /* PROBLEM, REFUSED */
	const gfs_mirror_stats *stats;
} gfs_mirror_event;

/*
 * Called from any thread, one call at a time. WRITE and ATTRS come in name
 * order once the files are done (END); the sweep's as it goes (and from the
 * writers, for what stood in a file's way).
 */
typedef void (*gfs_mirror_event_fn)(const gfs_mirror_event *ev, void *ctx);

typedef struct gfs_mirror_run_opts {
	const char *dir;            /* DIR: made (mkdir -p) when missing, unless a dry run */
	const char *prefix;         /* the folder mirrored; NULL or "": the whole bucket */
	/*
	 * NULL, or which local paths the run takes (--include, --exclude, ...):
	 * stored names it leaves out are not written, local files it leaves out
	 * are never deleted.
	 */
	gfs_mirror_select_fn select;
	void *select_ctx;
	bool delete_missing;        /* remove local files the bucket lacks (never after a failure) */
	bool allow_empty;           /* ... even when nothing is planned */
	gfs_max_delete max_delete;  /* ... unless they are more (GFS_ELIMIT, nothing changed) */
	const char *backup_dir;     /* NULL, or where destroyed files are kept (not inside DIR) */
	bool dry_run;
	bool checksum;              /* compare sha256 rather than size and mtime */
	bool size_only;             /* a regular file of the right size is up to date */
	bool ignore_existing;       /* a regular file there is left as it is */
	bool fsync;                 /* fsync files and directories */
	int jobs;                   /* worker threads, >= 1 */
	enum gfs_read_strategy read;   /* how chunks are read (read_strategy.h) */
	size_t hold;                /* scan: bytes of chunks held for their turn; 0 the default */
	const atomic_int *stop;     /* when set, the run stops after what is in flight */
	gfs_mirror_event_fn on_event;
	void *ctx;
} gfs_mirror_run_opts;

/*
 * Mirrors the bucket of conn (reading with its read concern) into o->dir,
 * locked (flock) against another mirror into it. False before any file was
 * written, with err's code the kind: the listing failed, DIR could not be
 * made or opened (GFS_ELOCAL) or is locked (GFS_EBUSY), --backup-dir is
 * refused, --max-delete stopped the run (GFS_ELIMIT). Otherwise true, with
 * each file's problem counted in stats->failed. Every failure is also a
 * PROBLEM event, the one to print. stats is filled in either way.
 */
bool gfs_mirror_run(gfs_conn *conn, const gfs_mirror_run_opts *o, gfs_mirror_stats *stats,
                    gfs_error *err);

#endif
