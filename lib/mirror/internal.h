/*
 * Mirror's private header: the plan every part reads, and the calls
 * between the parts. Nothing outside lib/mirror/ includes it. Each part is
 * one file, its design in its opening comment:
 *
 *   run.c        the run (gfs_mirror_run): DIR, its lock and --backup-dir,
 *                the worker threads and their phases, the counts and events
 *   scan.c       one pass over all chunks in natural order, for when most
 *                of the bucket is to be written
 *   finish.c     finisher threads: fsync and rename off the readers
 *   onefile.c    one file: compared with the disk, written to a temporary
 *                file and renamed into place, what is in its way cleared;
 *                each thread's open directory
 *   sweep.c      the walk of DIR afterwards: temporary files, and with
 *                --delete what the bucket does not have
 *   backup.c     --backup-dir: what would be destroyed is kept (backup.h)
 *   plan.c       the listing: newest revision of each name, its local path,
 *                names refused or held, local paths that collide
 *   localpath.c  a stored name's local path and the rules it must meet;
 *                the temporary files' names
 *
 * Calls between parts are gfs_mirror_*; what a part keeps to itself is
 * static. A part calls only parts listed after it (run.c all of them), so
 * that no two files call each other, directly or round a loop.
 */
#ifndef GFS_MIRROR_INTERNAL_H
#define GFS_MIRROR_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mirror.h"

struct gfs_backup;

/* ---- plan.c ----------------------------------------------------------- */

struct gfs_mirror_item {
	gfs_file file;          /* the fields gfs_read uses; doc is NULL */
	char *rel;              /* path beneath DIR: raw bytes, NUL-terminated */
	size_t rel_len;
	int64_t mtime_ns;       /* to set: metadata mtime, else uploadDate */
	bool mtime_exact;       /* metadata.mtimeNs was stored; else compare to the ms */
	int32_t mode;           /* permission bits (no setuid, setgid, sticky), -1 none */
};

typedef struct gfs_mirror_plan {
	struct gfs_mirror_item *items;  /* in filename order */
	size_t count, cap;
	uint64_t total_bytes;
	struct gfs_mirror_item **by_rel; /* sorted by rel bytes, for the sweep */
	/*
	 * Local paths of names refused for a malformed files document (newest
	 * revision): neither written nor deleted, nor an older revision
	 * written in their place. Sorted by rel bytes.
	 */
	struct gfs_mirror_held {
		char *rel;
		size_t len;
	} *held;
	size_t nheld, capheld;
	/*
	 * The filters the plan went through (gfs_mirror_plan_filter), or NULL:
	 * a local path they leave out is neither deleted nor cleared away.
	 */
	gfs_mirror_select_fn select;
	void *select_ctx;
} gfs_mirror_plan;

/* Told about each stored name that cannot be mirrored, and why. */
typedef void (*gfs_mirror_refuse_fn)(const char *name, const gfs_error *why, void *ctx);

/*
 * Lists the newest revision of every name under prefix (a folder; NULL or
 * "" for the whole bucket) into plan, which must be zeroed. Names that are
 * unsafe, have a NUL inside, or the rawName of cannot be matched go to
 * refuse (and are left out), and so do names whose newest files document
 * is malformed (their local paths are held: plan.held) and names whose local paths collide:
 * the same path, or one's file path being a folder on another's. *refused
 * counts them. False only when the listing fails.
 */
bool gfs_mirror_plan_load(gfs_session *s, const char *prefix, gfs_mirror_plan *plan,
                          gfs_mirror_refuse_fn refuse, void *ctx, size_t *refused,
                          gfs_error *err);
void gfs_mirror_plan_free(gfs_mirror_plan *plan);
/*
 * Leaves in plan only the items keep(rel, rel_len, ctx) is true of
 * (--include, --exclude, ...), and keeps keep for gfs_mirror_plan_takes.
 */
void gfs_mirror_plan_filter(gfs_mirror_plan *plan, gfs_mirror_select_fn keep, void *ctx);
/* Whether the plan's filters take the local path rel[0..len) (rel[len] is NUL); true without. */
bool gfs_mirror_plan_takes(const gfs_mirror_plan *p, const char *rel, size_t len);
/* Whether rel[0..len) is a planned (or held) file. */
bool gfs_mirror_plan_has_file(const gfs_mirror_plan *p, const char *rel, size_t len);
/* Whether a planned (or held) file lies beneath the directory rel[0..len); rel[len] is writable. */
bool gfs_mirror_plan_has_dir(const gfs_mirror_plan *p, char *rel, size_t len);
/* The stored name of an item, for messages. */
const char *gfs_mirror_item_name(const struct gfs_mirror_item *it);
/* The item's file name within rel, and the length of the folder part before it. */
const char *gfs_mirror_leaf(const struct gfs_mirror_item *it, size_t *dirlen);

/* ---- onefile.c -------------------------------------------------------- */

/* What a file needs. */
enum gfs_mirror_action {
	GFS_MIRROR_SKIP,    /* same content, mode and mtime */
	GFS_MIRROR_WRITE,   /* missing or different: write it */
	GFS_MIRROR_ATTRS,   /* same content: only mode or mtime to fix */
};

/* What the sweep does (or, in a dry run, would do) with one local entry. */
enum gfs_mirror_sweep_kind {
	GFS_MIRROR_CLEAN,   /* a temporary file left by an earlier run */
	GFS_MIRROR_DELETE,  /* a file (or symlink, or special file) the bucket does not have */
	GFS_MIRROR_RMDIR,   /* a directory left empty */
};
/* err is NULL when the step worked (or would, in a dry run). */
typedef void (*gfs_mirror_sweep_fn)(enum gfs_mirror_sweep_kind kind, const char *rel, size_t len,
                                    const gfs_error *err, void *ctx);

struct gfs_mirror_opts {
	bool checksum;      /* compare sha256 rather than size and mtime */
	bool size_only;     /* a regular file of the right size is the same file (rsync --size-only) */
	bool ignore_existing;  /* a regular file there is left as it is (rsync --ignore-existing) */
	bool fsync;         /* fsync files and directories */
	mode_t create_mode; /* mode for files without metadata.mode (0666 less umask) */
	const atomic_int *stop;       /* when set, reads in progress give up (GFS_ECANCELED) */
	/*
	 * With clear, what stands where a file is to be written is removed
	 * first, rather than failing that file on every run: a non-directory
	 * where its folder must be, or a directory tree (on DIR's file system,
	 * holding nothing in plan) where the file must be. Each removal goes
	 * to removed, as the sweep reports them; it may be called from any
	 * thread. Without clear, decide fails such a file.
	 */
	bool clear;
	const struct gfs_mirror_plan *plan;
	gfs_mirror_sweep_fn removed;
	void *removed_ctx;
	struct gfs_backup *backup;    /* --backup-dir: what clear removes is kept there; NULL: none */
};

/*
 * One thread's open directory: the parent of the file last handled, kept
 * open for the next file in the same folder, and fsync'd once when the
 * thread moves on, rather than once per file.
 */
typedef struct gfs_mirror_dir {
	int rootfd;
	const struct gfs_mirror_opts *opts;
	char *rel;          /* the open directory, relative to rootfd */
	size_t len;
	int fd;             /* -1: none open */
	bool dirty;         /* a rename happened in it since the last fsync */
	bool sync_failed;   /* a directory left behind failed its fsync: */
	gfs_error sync_err; /* the first such, reported at close */
} gfs_mirror_dir;

/* rootfd < 0: DIR does not exist (a dry run); every file is to be written. */
gfs_mirror_dir *gfs_mirror_dir_new(int rootfd, const struct gfs_mirror_opts *opts);
/* Syncs what is pending and closes; false with err when any directory fsync of d failed. */
bool gfs_mirror_dir_close(gfs_mirror_dir *d, gfs_error *err);
/* The directory rel[0..len) beneath DIR, opened (made, with create) or already open; -1, err. */
int gfs_mirror_dir_get(gfs_mirror_dir *d, const char *rel, size_t len, bool create, gfs_error *err);

/*
 * Compares one planned file with the disk. Reads the local file (and, with
 * checksum and no stored sha256, the stored one) only when needed.
 */
bool gfs_mirror_decide(gfs_mirror_dir *d, gfs_session *s, const struct gfs_mirror_item *it,
                       enum gfs_mirror_action *out, gfs_error *err);

/*
 * Carries out WRITE or ATTRS. On failure nothing is left behind: the old
 * local file is untouched and the temporary file removed. Damage in the
 * stored file comes back as gfs_read's codes, local trouble as GFS_ELOCAL.
 */
bool gfs_mirror_apply(gfs_mirror_dir *d, gfs_session *s, const struct gfs_mirror_item *it,
                      enum gfs_mirror_action action, gfs_error *err);

/* A temporary file beside the target, ready for the content. */
struct gfs_mirror_temp {
	int pfd;            /* the target's directory (owned by the gfs_mirror_dir) */
	int fd;
	char name[64];
};
/* Creates t beside its target (its folders made, with clear what is in the way removed). */
bool gfs_mirror_temp_open(gfs_mirror_dir *d, const struct gfs_mirror_item *it,
                          struct gfs_mirror_temp *t, gfs_error *err);
/* Streams the stored file into t, checked chunk by chunk and by its hash. */
bool gfs_mirror_temp_fill(gfs_mirror_dir *d, gfs_session *s, const struct gfs_mirror_item *it,
                          struct gfs_mirror_temp *t, gfs_error *err);
/*
 * With ok, gives t its mode and mtime, syncs it and renames it over the
 * target; otherwise (or when any of that fails) removes it.
 */
bool gfs_mirror_temp_finish(gfs_mirror_dir *d, const struct gfs_mirror_item *it,
                            struct gfs_mirror_temp *t, bool ok, gfs_error *err);
/* Sets mode and mtime on an open file; an item without a mode gets create_mode. */
bool gfs_mirror_set_attrs(int fd, const struct gfs_mirror_item *it, mode_t create_mode,
                          gfs_error *err);
/* Writes all of data to fd; false (errno in *error) when it cannot, or stop is set. */
bool gfs_mirror_write_all(int fd, const uint8_t *data, size_t len, const atomic_int *stop,
                          int *error);
/* Sets err (GFS_ELOCAL) to "NAME: what: strerror(e)"; returns false. */
bool gfs_mirror_local_error(gfs_error *err, const struct gfs_mirror_item *it, const char *what,
                            int e);
/* Puts the item's name in front of err's message. */
void gfs_mirror_prefix_name(gfs_error *err, const struct gfs_mirror_item *it);

/* ---- finish.c --------------------------------------------------------- */

/* Told about each file finished: err is NULL when it was written. */
typedef void (*gfs_mirror_done_fn)(size_t idx, const gfs_error *err, void *ctx);

/*
 * Finisher threads: they fsync complete temporary files, rename them into
 * place and fsync each directory once when they move on, so that readers
 * never wait on the disk. done is called from them. NULL when threads <= 0
 * or none could start: write synchronously then.
 */
typedef struct gfs_mirror_finisher gfs_mirror_finisher;
gfs_mirror_finisher *gfs_mirror_finisher_start(const gfs_mirror_plan *plan, int threads,
                                               gfs_mirror_done_fn done, void *ctx);
/* Finishes what is queued and stops (f may be NULL); false with err when a dir fsync failed. */
bool gfs_mirror_finisher_stop(gfs_mirror_finisher *f, gfs_error *err);
/*
 * Sets mode and mtime on the complete temporary file t of plan item idx
 * and queues it for fsync and rename. On failure t is still the caller's.
 */
bool gfs_mirror_finisher_take(gfs_mirror_finisher *f, gfs_mirror_dir *d, size_t idx,
                              struct gfs_mirror_temp *t, gfs_error *err);
/*
 * Like gfs_mirror_apply() with GFS_MIRROR_WRITE for plan item idx, but the
 * complete file goes to f, which reports it through done. False (nothing
 * queued, nothing left behind) when reading or writing failed first.
 */
bool gfs_mirror_write_queued(gfs_mirror_dir *d, gfs_session *s, size_t idx,
                             gfs_mirror_finisher *f, gfs_error *err);

/* ---- scan.c ----------------------------------------------------------- */

/*
 * Writes the plan items idx[0..n) from one pass over all chunks in natural
 * order (no sort), with the same checks as gfs_read() and the same
 * temporary-file-and-rename as gfs_mirror_apply(). A file's chunks are
 * written to its temporary file in order of n; chunks that come before
 * their turn are held, up to hold_bytes in all (0: GFS_READ_HOLD_DEFAULT).
 * A file is renamed into place only when the pass is over, since a
 * duplicate or extra chunk may come last. Items not finished by the pass
 * are not reported: those it saw no chunk of (empty files, files whose
 * chunks are all gone) and those it gave up on (past the bound, too many
 * open at once); the caller writes them one by one, which also reports
 * what is missing. With fsync, finishers threads (0: none) fsync and
 * rename complete files; done is then called from them. False when the
 * cursor failed, a stop was requested or a directory fsync failed; files
 * finished until then stay reported.
 */
bool gfs_mirror_scan(gfs_mirror_dir *d, gfs_session *s, const gfs_mirror_plan *plan,
                     const size_t *idx, size_t n, size_t hold_bytes, int finishers,
                     gfs_mirror_done_fn done, void *ctx, gfs_error *err);

/* ---- sweep.c ---------------------------------------------------------- */

/*
 * Walks the tree beneath rootfd without following symlinks, without going
 * into other file systems mounted beneath it, and at most 512 levels deep
 * (one descriptor a level; deeper directories are reported). Always removes
 * temporary files; with del, also what the plan does not have but its
 * filters take, and directories that end up empty and hold nothing planned
 * (with filters: that they take, or that the sweep emptied). With dry_run,
 * only reports. With backup, what del removes is moved into it instead
 * (lib/backup.h), and a file that could not be is left in place. False
 * when the walk itself failed somewhere (also reported).
 */
bool gfs_mirror_sweep(int rootfd, const gfs_mirror_plan *plan, bool del, bool dry_run,
                      struct gfs_backup *backup, gfs_mirror_sweep_fn fn, void *ctx);

/*
 * For --max-delete, before anything is written or deleted: how many files
 * a sweep with del would delete (*deletes) and how many files DIR holds
 * that it would keep (*kept). Temporary files and directories are not
 * counted. False when the walk failed somewhere.
 */
bool gfs_mirror_count_deletes(int rootfd, const gfs_mirror_plan *plan, uint64_t *deletes,
                              uint64_t *kept);

/*
 * Removes the directory leaf beneath pfd (rel[0..len) beneath DIR) with
 * everything in it, as the sweep with --delete would (opts: the plan, where
 * removals are told, the backup); true when it is gone.
 */
bool gfs_mirror_remove_tree(const struct gfs_mirror_opts *opts, int rootfd, int pfd,
                            const char *leaf, const char *rel, size_t len);

#endif
