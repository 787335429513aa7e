/* Size-based log rotation for supervised programs' output. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../util.h"
#include "logrotate.h"

/* How long after a failed rotation output goes on into the current file. */
#define LOGFILE_RETRY_S 5.0

static int
open_append(const char *path, uint64_t *size)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
	if (fd < 0)
		return -1;
	struct stat st;
	*size = fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
	return fd;
}

/* Creates the missing directories above path, as mkdir -p. */
static void
make_parents(const char *path)
{
	char *dir = gfs_xstrdup(path);
	for (char *p = dir + 1; (p = strchr(p, '/')) != NULL; p++) {
		*p = '\0';
		mkdir(dir, 0750);
		*p = '/';
	}
	free(dir);
}

struct logfile *
logfile_open(const char *path, uint64_t max, int backups)
{
	uint64_t size;
	int fd = open_append(path, &size);
	if (fd < 0 && errno == ENOENT) {
		make_parents(path);
		fd = open_append(path, &size);
	}
	if (fd < 0)
		return NULL;
	struct logfile *lf = gfs_xcalloc(1, sizeof *lf);
	lf->path = gfs_xstrdup(path);
	lf->fd = fd;
	lf->size = size;
	lf->max = max;
	lf->backups = backups;
	return lf;
}

static char *
numbered(const char *path, int n)
{
	size_t len = strlen(path) + 16;
	char *s = gfs_xmalloc(len);
	snprintf(s, len, "%s.%d", path, n);
	return s;
}

/* FILE -> FILE.1 ... FILE.N-1 -> FILE.N; the oldest falls off. */
static bool
shift_files(struct logfile *lf)
{
	for (int i = lf->backups - 1; i >= 0; i--) {
		char *from = i == 0 ? gfs_xstrdup(lf->path) : numbered(lf->path, i);
		char *to = numbered(lf->path, i + 1);
		int rc = rename(from, to);
		int e = errno;
		free(from);
		free(to);
		if (rc != 0 && e != ENOENT) {
			errno = e;
			return false;
		}
	}
	return true;
}

bool
logfile_rotate(struct logfile *lf)
{
	if (lf->backups == 0) {
		if (ftruncate(lf->fd, 0) != 0)
			return false;
		lf->size = 0;
		return true;
	}
	/* After a failed reopen FILE.1 is our file already: shifting again would drop a backup. */
	if (!lf->shifted && !shift_files(lf))
		return false;
	lf->shifted = true;
	uint64_t size;
	int fd = open_append(lf->path, &size);
	if (fd < 0)
		return false;
	close(lf->fd);
	lf->fd = fd;
	lf->size = size;
	lf->shifted = false;
	return true;
}

/* After a failed rotation, none is tried for a while: output goes on into the current file. */
static bool
backing_off(const struct logfile *lf)
{
	return lf->retry_at > 0 && gfs_mono_seconds() < lf->retry_at;
}

/* On failure the old descriptor stays, so output is not lost. */
static bool
rotate_or_back_off(struct logfile *lf)
{
	if (logfile_rotate(lf)) {
		lf->retry_at = 0;
		return true;
	}
	int e = errno;
	lf->retry_at = gfs_mono_seconds() + LOGFILE_RETRY_S;
	errno = e;
	return false;
}

static bool
write_all(struct logfile *lf, const char *data, size_t len)
{
	while (len > 0) {
		ssize_t n = write(lf->fd, data, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return false;
		}
		data += n;
		len -= (size_t)n;
		lf->size += (uint64_t)n;
	}
	return true;
}

/*
 * data holds whole lines (the caller writes many at once). Lines are never
 * split across files: the file is rotated before a line would take it past
 * max, and only a single line longer than max can make a file bigger.
 */
bool
logfile_write(struct logfile *lf, const char *data, size_t len)
{
	int failed = 0; /* the errno of a failed rotation */
	while (len > 0) {
		size_t n = len;
		if (lf->max && lf->size + len > lf->max && !backing_off(lf)) {
			uint64_t room = lf->max > lf->size ? lf->max - lf->size : 0;
			const char *nl = room ? memrchr(data, '\n', room < len ? (size_t)room : len) : NULL;
			if (nl) {
				n = (size_t)(nl - data) + 1;
			} else if (lf->size > 0) {
				if (!rotate_or_back_off(lf))
					failed = errno;
				continue;
			} else {
				nl = memchr(data, '\n', len);
				n = nl ? (size_t)(nl - data) + 1 : len;
			}
		}
		if (!write_all(lf, data, n))
			return false;
		data += n;
		len -= n;
	}
	errno = failed;
	return failed == 0;
}

void
logfile_close(struct logfile *lf)
{
	if (!lf)
		return;
	close(lf->fd);
	free(lf->path);
	free(lf);
}
