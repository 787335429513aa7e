/* Names from the database made into paths that stay beneath one directory. */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "safepath.h"

bool
gfs_safepath_check(const char *rel, size_t len, gfs_error *err)
{
	if (len == 0) {
		gfs_error_set(err, GFS_EINVAL, "empty name");
		return false;
	}
	if (memchr(rel, '\0', len)) {
		gfs_error_set(err, GFS_EINVAL, "name contains a NUL byte");
		return false;
	}
	if (rel[0] == '/') {
		gfs_error_set(err, GFS_EINVAL, "absolute name");
		return false;
	}
	if (len > GFS_SAFEPATH_MAX) {
		gfs_error_set(err, GFS_EINVAL, "name longer than %d bytes", GFS_SAFEPATH_MAX);
		return false;
	}
	size_t start = 0;
	while (start <= len) {
		const char *slash = memchr(rel + start, '/', len - start);
		size_t end = slash ? (size_t)(slash - rel) : len;
		size_t seg = end - start;
		/*
		 * "a//b", "./a" and "a/" would land on the same file as "a/b" and
		 * "a", so two stored names could fight over one path: refuse them.
		 */
		if (seg == 0) {
			gfs_error_set(err, GFS_EINVAL, "empty path segment");
			return false;
		}
		if (seg == 1 && rel[start] == '.') {
			gfs_error_set(err, GFS_EINVAL, "'.' path segment");
			return false;
		}
		if (seg == 2 && rel[start] == '.' && rel[start + 1] == '.') {
			gfs_error_set(err, GFS_EINVAL, "'..' path segment");
			return false;
		}
		if (seg > GFS_SAFEPATH_SEG_MAX) {
			gfs_error_set(err, GFS_EINVAL, "path segment longer than %d bytes",
			              GFS_SAFEPATH_SEG_MAX);
			return false;
		}
		if (!slash)
			break;
		start = end + 1;
	}
	return true;
}

size_t
gfs_safepath_dirlen(const char *rel, size_t len)
{
	for (size_t i = len; i > 0; i--)
		if (rel[i - 1] == '/')
			return i - 1;
	return 0;
}

/* 1 usable, 0 not tried yet, -1 the kernel or a seccomp filter refuses it. */
static atomic_int have_openat2;

static int
try_openat2(int rootfd, const char *path)
{
	if (atomic_load(&have_openat2) < 0)
		return -1;
	struct open_how how = {
		.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	long fd = syscall(SYS_openat2, rootfd, path, &how, sizeof how);
	if (fd >= 0) {
		atomic_store(&have_openat2, 1);
		return (int)fd;
	}
	if (errno == ENOSYS || errno == EPERM || errno == E2BIG)
		atomic_store(&have_openat2, -1);
	return -1;
}

static void
describe(int dirfd, const char *dir, size_t upto, const char *seg, int e, gfs_error *err)
{
	struct stat st;
	if (fstatat(dirfd, seg, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
		gfs_error_set(err, GFS_ELOCAL, "'%.*s' is a symlink; not following it", (int)upto, dir);
	else if (e == ENOTDIR || e == ELOOP)
		gfs_error_set(err, GFS_ELOCAL, "'%.*s' is not a directory", (int)upto, dir);
	else
		gfs_error_set(err, GFS_ELOCAL, "cannot open directory '%.*s': %s", (int)upto, dir,
		              strerror(e));
	errno = e;
}

/* Opens one segment beneath fd, making it first when asked and missing. */
static int
open_segment(int fd, const char *seg, int how)
{
	int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
	int next = openat(fd, seg, flags);
	if (next >= 0 || errno != ENOENT || !(how & GFS_SAFEPATH_CREATE))
		return next;
	if (mkdirat(fd, seg, 0777) < 0) {
		if (errno != EEXIST)
			return -1;
	} else if ((how & GFS_SAFEPATH_SYNC) && fsync(fd) < 0) {
		return -1;
	}
	return openat(fd, seg, flags);
}

int
gfs_safepath_opendir(int rootfd, const char *dir, size_t len, int flags, gfs_error *err)
{
	if (len == 0) {
		int fd = fcntl(rootfd, F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			gfs_error_set(err, GFS_ELOCAL, "cannot duplicate a descriptor: %s", strerror(errno));
		return fd;
	}
	char path[GFS_SAFEPATH_MAX + 1];
	if (len > GFS_SAFEPATH_MAX) {
		gfs_error_set(err, GFS_EINVAL, "directory name too long");
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(path, dir, len);
	path[len] = '\0';
	int fd = try_openat2(rootfd, path);
	if (fd >= 0)
		return fd;

	/* The walk: authoritative, creates what is missing, and names the culprit. */
	fd = rootfd;
	size_t start = 0;
	for (;;) {
		char *slash = memchr(path + start, '/', len - start);
		size_t end = slash ? (size_t)(slash - path) : len;
		path[end] = '\0';
		int next = open_segment(fd, path + start, flags);
		int e = errno;
		if (next < 0)
			describe(fd, dir, end, path + start, e, err);
		if (fd != rootfd)
			close(fd);
		if (next < 0) {
			errno = e;
			return -1;
		}
		fd = next;
		if (!slash)
			return fd;
		path[end] = '/';
		start = end + 1;
	}
}
