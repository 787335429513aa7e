/*
 * watch: the per-file actions that keep a bucket in step with a directory
 * as inotify reports changes (lib/inotify_tree.c). The first full pass and any
 * rescan after lost events are an import (lib/import.c). Every action is
 * idempotent, so that the caller can retry it after a failure: a retried
 * upload that finds its content stored only trims old revisions.
 */
#ifndef GFS_WATCH_H
#define GFS_WATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "gfs.h"
#include "magic.h"
#include "walk.h"

typedef struct gfs_watch_opts {
	const char *dir;
	const char *prefix;          /* NULL or "": the top level */
	gfs_walk_opts walk;
	const char *content_type;    /* NULL: from libmagic */
	int32_t chunk_size;          /* 0: the default */
	int keep_revisions;          /* >= 1 */
} gfs_watch_opts;

enum gfs_watch_action {
	GFS_WATCH_NOTHING,     /* not a regular file, or not selected */
	GFS_WATCH_UNCHANGED,   /* stored already (size and mtime, and content when changed) */
	GFS_WATCH_UPLOADED,    /* stored under a new name */
	GFS_WATCH_REPLACED,    /* stored as a new revision; older ones removed */
	GFS_WATCH_VANISHED,    /* gone before it could be read */
};

const char *gfs_watch_action_name(enum gfs_watch_action a);

/*
 * Stores dir/rel unless it is stored already with the same size and mtime
 * and, when changed (the file was seen written or moved in), the same
 * sha256. *name receives the stored name (caller frees) and *bytes its length.
 */
bool gfs_watch_sync_file(gfs_session *s, gfs_magic *m, const gfs_watch_opts *o, const char *rel,
                         bool changed, enum gfs_watch_action *act, char **name, int64_t *bytes,
                         gfs_error *err);

/*
 * Removes every revision of the name of rel (found by filename equality),
 * or with is_dir every name under the folder rel (one range query).
 * *removed counts the files documents removed.
 */
bool gfs_watch_remove(gfs_session *s, const gfs_watch_opts *o, const char *rel, bool is_dir,
                      uint64_t *removed, gfs_error *err);

/* A single file's move or removal, one of a batch for gfs_watch_apply. */
typedef struct gfs_watch_op {
	const char *from;    /* the move's source; NULL: a removal of rel */
	const char *rel;     /* the move's target, or what is removed */
	uint64_t files;      /* out: documents renamed or removed */
	/*
	 * out: the move cannot be a rename (nothing stored under from, a name
	 * that is not UTF-8, raw name bytes): the caller stores rel and removes
	 * from instead. Nothing was done for it.
	 */
	bool by_copy;
} gfs_watch_op;

/*
 * Acts on single-file moves and removals as one batch, in their order:
 * each name's revisions found by filename equality, the renames (the
 * spec's: filename updated, no chunk written) in one ordered bulk write,
 * then what the targets held and what is removed in one removal by id.
 * No name may be in two ops of a batch: the caller cuts its runs there,
 * so that what is found first is what each op acts on.
 */
bool gfs_watch_apply(gfs_session *s, const gfs_watch_opts *o, gfs_watch_op *ops, size_t n,
                     gfs_error *err);

/*
 * Renames every revision of the name of from (with is_dir, every name under
 * the folder from, found in one range query over both folders) to the name
 * of to. What to held before is removed after. With is_dir, GFS_EINVAL when
 * a name that is not UTF-8 is involved: the caller stores and removes
 * instead; a file's *moved is 0 then, and when nothing was stored under from.
 */
bool gfs_watch_move(gfs_session *s, const gfs_watch_opts *o, const char *from, const char *to,
                    bool is_dir, uint64_t *moved, gfs_error *err);

#endif
