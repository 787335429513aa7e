/*
 * Safe paths beneath a directory: turning a name that came from the
 * database (and so from anyone who could write to it) into a place on disk
 * that cannot be outside the directory the user named.
 *
 * Two halves. gfs_safepath_check() is pure: it refuses names that are empty,
 * absolute, contain NUL, have empty, "." or ".." segments, or segments or
 * totals too long for the file system interface. gfs_safepath_opendir()
 * then opens the directory part beneath a directory descriptor one segment
 * at a time with O_NOFOLLOW, so a symlink already on disk (planted before
 * or during the run) is refused rather than followed. Where the kernel has
 * openat2(), RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS opens the whole path in
 * one call; the segment walk is the fallback and the source of precise
 * error messages.
 */
#ifndef GFS_SAFEPATH_H
#define GFS_SAFEPATH_H

#include <stdbool.h>
#include <stddef.h>

#include "error.h"

/* Limits of one segment and of the whole relative path, as Linux has them. */
#define GFS_SAFEPATH_SEG_MAX 255
#define GFS_SAFEPATH_MAX 4000

/*
 * Checks rel[0..len) as a relative path of one or more segments separated
 * by single '/'. On refusal, err (GFS_EINVAL) says why; the caller names
 * the file.
 */
bool gfs_safepath_check(const char *rel, size_t len, gfs_error *err);

/*
 * Length of the directory part of a checked path: the bytes before the last
 * '/', or 0 when the path is a single segment.
 */
size_t gfs_safepath_dirlen(const char *rel, size_t len);

/*
 * Opens the directory dir[0..len) (a checked path, or len 0 for rootfd
 * itself) beneath rootfd for reading, never following a symlink in any
 * segment. With GFS_SAFEPATH_CREATE, missing segments are made (mode 0777
 * less umask); with GFS_SAFEPATH_SYNC as well, the directory that gained a
 * new entry is fsync'd so the new directory survives a crash. Returns a descriptor (O_CLOEXEC), or -1 with err set (GFS_ELOCAL) and
 * errno kept: ELOOP or ENOTDIR when a segment is a symlink or not a
 * directory.
 */
enum { GFS_SAFEPATH_CREATE = 1, GFS_SAFEPATH_SYNC = 2 };
int gfs_safepath_opendir(int rootfd, const char *dir, size_t len, int flags, gfs_error *err);

#endif
