/*
 * inotify_tree: inotify over a whole directory tree. inotify watches one
 * directory at a time, so new directories get watches as they appear, and
 * the files already inside them (created before the watch existed) are
 * reported as changed.
 *
 * A rename within the tree is reported as one move (the two halves of a
 * rename are queued together and paired by cookie), so that a caller can
 * rename what it stores instead of copying it. A directory that cannot be
 * watched is reported through the warning callback, given at open so that
 * the first walk is covered, and counted, so that a caller can cover it
 * some other way (a periodic full pass).
 */
#ifndef GFS_INOTREE_H
#define GFS_INOTREE_H

#include <stdbool.h>

#include "error.h"
#include "walk.h"

enum gfs_inotree_kind {
	GFS_INO_CHANGED,      /* a file was written and closed, or moved in */
	GFS_INO_FOUND,        /* a file found in a new directory: it may still be open for writing */
	GFS_INO_REMOVED,      /* a file was deleted or moved out */
	GFS_INO_DIR_REMOVED,  /* a directory was deleted or moved out: everything under rel is gone */
	GFS_INO_OVERFLOW,     /* events were lost: the watches are renewed, rescan every file */
	GFS_INO_MOVED,        /* a file renamed within the tree, from -> rel */
	GFS_INO_DIR_MOVED,    /* a directory renamed within the tree: what was under from is under rel */
};

typedef struct gfs_inotree_event {
	enum gfs_inotree_kind kind;
	const char *rel;      /* path relative to the root, '/'-separated; "" for OVERFLOW */
	const char *from;     /* MOVED, DIR_MOVED: the old path; else NULL */
} gfs_inotree_event;

typedef void (*gfs_inotree_fn)(const gfs_inotree_event *ev, void *ctx);

typedef struct gfs_inotree gfs_inotree;

/* Where problems that do not stop watching are sent (path, reason). */
typedef void (*gfs_inotree_warn_fn)(const char *rel, const char *reason, void *ctx);

/*
 * Watches root and every selected directory below it. sel may be NULL
 * (everything); warn may be NULL. Fails only when root cannot be watched.
 */
gfs_inotree *gfs_inotree_open(const char *root, const gfs_walk_opts *sel, gfs_inotree_warn_fn warn,
                              void *warn_ctx, gfs_error *err);
void gfs_inotree_close(gfs_inotree *t);
/* The inotify descriptor, non-blocking, for poll/epoll. */
int gfs_inotree_fd(const gfs_inotree *t);
/* Number of directories watched. */
size_t gfs_inotree_count(const gfs_inotree *t);
/* Directories that could not be watched since the last walk of the whole tree. */
size_t gfs_inotree_unwatched(const gfs_inotree *t);
/*
 * Walks the whole tree again: watches what can be watched now (root too,
 * when it was replaced), forgets what is gone. Files are not reported.
 * False (err set) when root itself cannot be watched any more.
 */
bool gfs_inotree_rewalk(gfs_inotree *t, gfs_error *err);
/* Reports every selected file under the directory rel as FOUND (watching it, if it was not). */
void gfs_inotree_list(gfs_inotree *t, const char *rel, gfs_inotree_fn fn, void *ctx);
/*
 * Reads what is pending and reports it through fn. Returns false (err set)
 * when the descriptor failed, or when the root was deleted, moved or
 * unmounted: there is nothing left to watch. A directory that cannot be
 * watched (the max_user_watches limit, a permission) is reported through
 * warn_fn.
 */
bool gfs_inotree_read(gfs_inotree *t, gfs_inotree_fn fn, void *ctx, gfs_error *err);

#endif
