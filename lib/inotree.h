/*
 * inotree: inotify over a whole directory tree. inotify watches one
 * directory at a time, so new directories get watches as they appear, and
 * the files already inside them (created before the watch existed) are
 * reported as changed.
 */
#ifndef GFS_INOTREE_H
#define GFS_INOTREE_H

#include <stdbool.h>

#include "gfs.h"
#include "walk.h"

enum gfs_inotree_kind {
	GFS_INO_CHANGED,      /* a file was written and closed, or moved in */
	GFS_INO_FOUND,        /* a file found in a new directory: it may still be open for writing */
	GFS_INO_REMOVED,      /* a file was deleted or moved out */
	GFS_INO_DIR_REMOVED,  /* a directory was deleted or moved out: everything under rel is gone */
	GFS_INO_OVERFLOW,     /* events were lost: the watches are renewed, rescan every file */
};

typedef struct gfs_inotree_event {
	enum gfs_inotree_kind kind;
	const char *rel;      /* path relative to the root, '/'-separated; "" for OVERFLOW */
} gfs_inotree_event;

typedef void (*gfs_inotree_fn)(const gfs_inotree_event *ev, void *ctx);

typedef struct gfs_inotree gfs_inotree;

/* Watches root and every selected directory below it. sel may be NULL (everything). */
gfs_inotree *gfs_inotree_open(const char *root, const gfs_walk_opts *sel, gfs_error *err);
void gfs_inotree_close(gfs_inotree *t);
/* The inotify descriptor, non-blocking, for poll/epoll. */
int gfs_inotree_fd(const gfs_inotree *t);
/* Number of directories watched. */
size_t gfs_inotree_count(const gfs_inotree *t);
/*
 * Reads what is pending and reports it through fn. Returns false (err set)
 * when the descriptor failed, or when the root was deleted, moved or
 * unmounted: there is nothing left to watch. A directory that cannot be
 * watched (the max_user_watches limit, a permission) is reported through
 * warn_fn.
 */
bool gfs_inotree_read(gfs_inotree *t, gfs_inotree_fn fn, void *ctx, gfs_error *err);

/* Where problems that do not stop watching are sent (path, reason). */
typedef void (*gfs_inotree_warn_fn)(const char *rel, const char *reason, void *ctx);
void gfs_inotree_on_warning(gfs_inotree *t, gfs_inotree_warn_fn fn, void *ctx);

#endif
