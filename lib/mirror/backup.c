/*
 * Mirror's backup directory (--backup-dir; the design is in backup.h):
 * where B may be, and keeping one entry there by rename, hard link or
 * copy. A link or copy is made under a mirror temporary name
 * (localpath.c) and renamed over B/rel, so that B/rel is always a whole
 * file, and what a crash leaves has a name that says what it is.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../safepath.h"
#include "../util.h"
#include "backup.h"
#include "mirror.h"

/* Whether the directory `inner` is `outer` or beneath it, by walking up from inner through "..". */
static int
is_within(int inner, const struct stat *outer)
{
	int fd = fcntl(inner, F_DUPFD_CLOEXEC, 0);
	for (int depth = 0; fd >= 0 && depth < 4096; depth++) {
		struct stat st, up;
		if (fstat(fd, &st) < 0)
			break;
		if (st.st_dev == outer->st_dev && st.st_ino == outer->st_ino) {
			close(fd);
			return 1;
		}
		int parent = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		close(fd);
		fd = parent;
		if (fd < 0 || fstat(fd, &up) < 0)
			break;
		if (up.st_dev == st.st_dev && up.st_ino == st.st_ino) {
			close(fd);
			return 0; /* the root */
		}
	}
	if (fd >= 0)
		close(fd);
	return -1;
}

/*
 * Refuses B (open as bfd) when it is DIR, inside DIR or, for an existing B
 * (holds_too), holds DIR. False with err set.
 */
static bool
refuse_placement(int bfd, int rootfd, const char *path, bool holds_too, gfs_error *err)
{
	struct stat bst, rst;
	if (fstat(bfd, &bst) < 0 || fstat(rootfd, &rst) < 0) {
		gfs_error_set(err, GFS_ELOCAL, "--backup-dir %s: %s", path, strerror(errno));
		return false;
	}
	int in = is_within(bfd, &rst), holds = holds_too ? is_within(rootfd, &bst) : 0;
	if (in == 0 && holds == 0)
		return true;
	gfs_error_set(err, in < 0 || holds < 0 ? GFS_ELOCAL : GFS_EINVAL,
	              in < 0 || holds < 0 ? "--backup-dir %s: cannot tell where it is" :
	              in > 0 ? "--backup-dir %s is inside the mirror's directory, whose sweep would "
	                       "delete it" :
	                       "--backup-dir %s holds the mirror's directory", path);
	return false;
}

bool
gfs_backup_check(const char *path, int rootfd, gfs_error *err)
{
	char *p = gfs_xstrdup(path);
	bool ok = true;
	for (bool self = true;; self = false) {
		int fd = open(p[0] ? p : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd >= 0) {
			/* A directory still to be made holds nothing yet: only where it goes matters. */
			ok = refuse_placement(fd, rootfd, path, self, err);
			close(fd);
			break;
		}
		/* Anything else (not a directory, no permission) is mkdir's or open's to report. */
		if (errno != ENOENT || !p[0])
			break;
		size_t n = strlen(p);
		while (n > 1 && p[n - 1] == '/')
			p[--n] = '\0';
		char *slash = strrchr(p, '/');
		if (slash == p)
			p[1] = '\0';
		else if (slash)
			*slash = '\0';
		else
			p[0] = '\0';
	}
	free(p);
	return ok;
}

bool
gfs_backup_open(gfs_backup *b, const char *path, int rootfd, bool fsync, gfs_error *err)
{
	b->fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	b->fsync = fsync;
	atomic_init(&b->kept, 0);
	if (b->fd < 0) {
		gfs_error_set(err, GFS_ELOCAL, "--backup-dir %s: %s", path, strerror(errno));
		return false;
	}
	/* Again, on what was opened: the path may have been swapped since the check. */
	if (!refuse_placement(b->fd, rootfd, path, true, err)) {
		gfs_backup_close(b);
		return false;
	}
	return true;
}

void
gfs_backup_close(gfs_backup *b)
{
	if (b->fd >= 0)
		close(b->fd);
	b->fd = -1;
}

static bool
backup_fail(gfs_error *err, const char *rel, size_t len, const char *what, int e)
{
	gfs_error_set(err, GFS_ELOCAL, "%.*s: --backup-dir: %s: %s", (int)len, rel, what, strerror(e));
	return false;
}

/* Copies the regular file src (open) into the new file dst, with its mode and times. */
static bool
copy_file(int src, int dst, const struct stat *st, bool sync)
{
	char buf[65536];
	ssize_t n;
	while ((n = read(src, buf, sizeof buf)) > 0) {
		for (ssize_t off = 0; off < n;) {
			ssize_t w = write(dst, buf + off, (size_t)(n - off));
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0)
				return false;
			off += w;
		}
	}
	if (n < 0)
		return false;
	struct timespec times[2] = {st->st_atim, st->st_mtim};
	if (fchmod(dst, st->st_mode & 07777) < 0 || futimens(dst, times) < 0)
		return false;
	return !sync || fsync(dst) == 0;
}

/* A copy of name (dirfd) as the temporary tmp in pfd. */
static bool
copy_to_temp(int dirfd, const char *name, const struct stat *st, int pfd, const char *tmp,
             bool sync)
{
	if (S_ISLNK(st->st_mode)) {
		char target[PATH_MAX];
		ssize_t n = readlinkat(dirfd, name, target, sizeof target - 1);
		if (n < 0)
			return false;
		target[n] = '\0';
		return symlinkat(target, pfd, tmp) == 0;
	}
	if (!S_ISREG(st->st_mode)) {
		errno = EINVAL; /* a fifo or a device: nothing mirror wrote */
		return false;
	}
	int src = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (src < 0)
		return false;
	int dst = openat(pfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	bool ok = dst >= 0 && copy_file(src, dst, st, sync);
	int e = errno;
	close(src);
	if (dst >= 0 && close(dst) < 0 && ok) {
		ok = false;
		e = errno;
	}
	errno = e;
	return ok;
}

/* Puts name (dirfd) at leaf in pfd: rename or link on one file system, else a copy. */
static bool
place(gfs_backup *b, int dirfd, const char *name, const struct stat *st, int pfd, const char *leaf,
      bool keep)
{
	if (!keep && renameat(dirfd, name, pfd, leaf) == 0)
		return true;
	if (!keep && errno != EXDEV)
		return false;
	char tmp[64];
	gfs_mirror_temp_name(tmp);
	bool ok = keep && linkat(dirfd, name, pfd, tmp, 0) == 0;
	if (!ok && (!keep || errno == EXDEV || errno == EPERM))
		ok = copy_to_temp(dirfd, name, st, pfd, tmp, b->fsync);
	if (ok && renameat(pfd, tmp, pfd, leaf) == 0)
		return keep || unlinkat(dirfd, name, 0) == 0 || errno == ENOENT;
	int e = errno;
	unlinkat(pfd, tmp, 0);
	errno = e;
	return false;
}

bool
gfs_backup_entry(gfs_backup *b, int dirfd, const char *name, const char *rel, size_t len,
                 bool keep, gfs_error *err)
{
	struct stat st;
	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? true : backup_fail(err, rel, len, "stat", errno);
	size_t dl = gfs_safepath_dirlen(rel, len);
	int pfd = gfs_safepath_opendir(b->fd, rel, dl, GFS_SAFEPATH_CREATE | (b->fsync ? GFS_SAFEPATH_SYNC : 0),
	                               err);
	if (pfd < 0)
		return backup_fail(err, rel, len, "cannot open its folder in the backup", errno);
	char leaf[GFS_SAFEPATH_SEG_MAX + 1];
	size_t ll = len - dl - (dl ? 1 : 0);
	memcpy(leaf, rel + len - ll, ll);
	leaf[ll] = '\0';
	bool ok = place(b, dirfd, name, &st, pfd, leaf, keep);
	int e = errno;
	if (ok && b->fsync && fsync(pfd) < 0) {
		ok = false;
		e = errno;
	}
	close(pfd);
	if (!ok)
		return backup_fail(err, rel, len, keep ? "cannot copy the old file there" :
		            "cannot move the file there", e);
	atomic_fetch_add(&b->kept, 1);
	return true;
}

bool
gfs_backup_keep(gfs_backup *b, int rootfd, const char *rel, size_t len, gfs_error *err)
{
	size_t dl = gfs_safepath_dirlen(rel, len);
	int dirfd = gfs_safepath_opendir(rootfd, rel, dl, 0, err);
	if (dirfd < 0)
		return errno == ENOENT || errno == ENOTDIR || errno == ELOOP;
	char leaf[GFS_SAFEPATH_SEG_MAX + 1];
	size_t ll = len - dl - (dl ? 1 : 0);
	memcpy(leaf, rel + len - ll, ll);
	leaf[ll] = '\0';
	struct stat st;
	bool ok = true;
	if (fstatat(dirfd, leaf, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode))
		ok = gfs_backup_entry(b, dirfd, leaf, rel, len, true, err);
	close(dirfd);
	return ok;
}
