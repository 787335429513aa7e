/*
 * walk: a sorted, depth-first walk of a directory tree for import, with
 * include/exclude globs, hidden and temporary file skipping, and a symlink
 * policy that detects loops instead of spinning on them.
 *
 * Glob syntax (gfs_glob_match): '*' any run of characters except '/',
 * '?' one character except '/', '[abc]', '[a-z]', '[!a]' a class, '**' any
 * run of characters including '/' ("**" followed by '/' may match nothing,
 * so "**" "/x" matches "x"), '\' quotes the next character.
 *
 * A pattern without '/' is matched against the last component (the file or
 * directory name); a pattern with '/' against the whole relative path (a
 * leading '/' only anchors it). An excluded directory is not descended into.
 * Include patterns, when any are given, select files only: directories are
 * always descended, and a file is taken when it matches one of them.
 * Exclusion wins over inclusion. A followed symlink is judged by what it
 * leads to: the directory rules for a directory, the file rules otherwise.
 */
#ifndef GFS_WALK_H
#define GFS_WALK_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

#include "error.h"

typedef struct gfs_walk_opts {
	const char *const *include;   /* NULL or n_include patterns */
	size_t n_include;
	const char *const *exclude;
	size_t n_exclude;
	bool hidden;            /* take names starting with '.' */
	bool temp;              /* take temporary files: *.part, *~, .#* */
	bool follow_symlinks;   /* follow symlinks to files and directories */
	/* NULL, or what else a file (its path relative to the root) must pass: --files-from */
	bool (*select)(const char *rel, void *ctx);
	void *select_ctx;
} gfs_walk_opts;

enum gfs_walk_kind {
	GFS_WALK_FILE,          /* a regular file to consider */
	GFS_WALK_SYMLINK,       /* a symlink not followed (informational) */
	GFS_WALK_SPECIAL,       /* a FIFO, socket or device: not importable */
	GFS_WALK_ERROR,         /* a directory or entry that could not be walked */
};

typedef struct gfs_walk_entry {
	enum gfs_walk_kind kind;
	const char *rel;         /* path bytes relative to the root, '/'-separated, NUL-terminated */
	size_t rel_len;
	const struct stat *st;   /* for FILE and SPECIAL */
	const char *reason;      /* for ERROR and SPECIAL */
	bool broken_link;        /* ERROR: a dangling symlink or a symlink loop, which hides nothing */
} gfs_walk_entry;

/* Returns false to stop the walk. */
typedef bool (*gfs_walk_fn)(const gfs_walk_entry *e, void *ctx);

/*
 * Walks root, calling fn for every selected entry in byte order of names.
 * Returns false only when the root itself cannot be opened (err set) or fn
 * stopped the walk (err GFS_ECANCELED); problems below the root are
 * reported through fn as GFS_WALK_ERROR and the walk goes on.
 */
bool gfs_walk(const char *root, const gfs_walk_opts *o, gfs_walk_fn fn, void *ctx, gfs_error *err);

/* ---- the pure selection logic, shared with import --delete ----------- */

bool gfs_glob_match(const char *pattern, const char *s);
bool gfs_walk_is_hidden(const char *name);
bool gfs_walk_is_temp(const char *name);
/* Whether the walk would descend into the directory rel (whose last component is name). */
bool gfs_walk_dir_selected(const gfs_walk_opts *o, const char *rel, const char *name);
/* Whether the walk would take the file rel (whose last component is name). */
bool gfs_walk_file_selected(const gfs_walk_opts *o, const char *rel, const char *name);
/*
 * Whether a file at relative path rel would be taken by a walk, checking
 * every directory above it too. Used to protect excluded names from --delete.
 */
bool gfs_walk_path_selected(const gfs_walk_opts *o, const char *rel);

#endif
