/*
 * mirror --backup-dir: what --delete or an overwrite would destroy in the
 * mirror's DIR is kept in a backup directory B, at the same relative path
 * (DIR/a/b.jpg goes to B/a/b.jpg). Paths beneath B are opened one segment
 * at a time without following symlinks (lib/safepath.c), so nothing is
 * ever written outside B. On B's file system a deletion is a rename and an
 * overwrite keeps a hard link; across file systems the file is copied
 * (content, mode, mtime, fsync'd) and, for a deletion, then unlinked.
 * A backup path already there is replaced: B holds the latest version.
 */
#ifndef GFS_BACKUP_H
#define GFS_BACKUP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "../error.h"

typedef struct gfs_backup {
	int fd;                  /* B, open O_DIRECTORY */
	bool fsync;              /* fsync copies and the directories that gain an entry */
	atomic_size_t kept;      /* entries moved or copied into B */
} gfs_backup;

/*
 * Refuses path as B for the mirror of rootfd (GFS_EINVAL) before anything
 * is made: an existing directory as gfs_backup_open() does; a missing one
 * when its nearest existing ancestor is DIR or inside it, where mkdir -p
 * would make it. GFS_ELOCAL when where it is cannot be told.
 */
bool gfs_backup_check(const char *path, int rootfd, gfs_error *err);
/*
 * Opens the existing directory path as B for the mirror of rootfd: refused
 * (GFS_EINVAL) when B is DIR, inside DIR (the sweep would delete it) or
 * holds DIR (a backup path could then be inside DIR).
 */
bool gfs_backup_open(gfs_backup *b, const char *path, int rootfd, bool fsync, gfs_error *err);
void gfs_backup_close(gfs_backup *b);

/*
 * Keeps the non-directory entry name of dirfd, which is rel[0..len)
 * beneath DIR, as B/rel. With keep the entry stays where it is (an
 * overwrite follows); without, it is moved out (a deletion). False with
 * err (GFS_ELOCAL) when it could not be kept: the caller then must not
 * destroy it.
 */
bool gfs_backup_entry(gfs_backup *b, int dirfd, const char *name, const char *rel, size_t len,
                      bool keep, gfs_error *err);

/*
 * gfs_backup_entry(keep) for the file at rel[0..len) beneath rootfd, when
 * there is one: nothing there, or a directory, is nothing to keep.
 */
bool gfs_backup_keep(gfs_backup *b, int rootfd, const char *rel, size_t len, gfs_error *err);

#endif
