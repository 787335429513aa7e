/*
 * Mirror's one file: compared with the disk, and written so that a reader
 * sees the old file or the new one, never a part.
 *
 * Comparing (gfs_mirror_decide) reads the local file only when size and
 * mtime are not enough (--checksum), and the stored one only when it has
 * no sha256 to compare with. A file whose content is right but whose mode
 * or mtime is not is fixed in place, unless it has another hard link,
 * whose attributes are not ours to change: that one is written instead.
 *
 * Writing goes through a temporary file beside the target: created
 * O_EXCL under a fresh random name, filled from gfs_read (every chunk and
 * the hash checked; read from a secondary, a file that looks damaged is
 * read again from the primary, whose word goes), given its mode and mtime,
 * fsync'd and renamed over the target. On any failure the temporary file
 * goes and the old file stays as it was. Folders are opened one segment at
 * a time without following symlinks (safepath), so nothing is written
 * outside DIR. With --delete, what stands in a file's way (a file where a
 * folder must be, a directory tree where the file must be) is removed
 * first, as the sweep would, or kept in the backup directory.
 *
 * Each thread keeps its current directory open (gfs_mirror_dir) and
 * fsyncs it once when it moves on to another, not once per file: a crash
 * can then lose renames, never leave a partial file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../safepath.h"
#include "backup.h"
#include "internal.h"

/* ---- the per-thread directory ---------------------------------------- */

gfs_mirror_dir *
gfs_mirror_dir_new(int rootfd, const struct gfs_mirror_opts *opts)
{
	gfs_mirror_dir *d = gfs_xcalloc(1, sizeof *d);
	d->rootfd = rootfd;
	d->opts = opts;
	d->fd = -1;
	return d;
}

/*
 * A rename is durable once its directory is fsync'd. One fsync when the
 * thread leaves a folder, rather than one per file, keeps that promise for
 * the whole run at a fraction of the cost; a crash before it can lose only
 * renames, never leave a partial file.
 */
static bool
dir_release(gfs_mirror_dir *d, gfs_error *err)
{
	bool ok = true;
	if (d->fd >= 0 && d->dirty && d->opts->fsync && fsync(d->fd) < 0) {
		gfs_error_set(err, GFS_ELOCAL, "fsync of directory '%.*s': %s", (int)d->len,
		              d->len ? d->rel : ".", strerror(errno));
		ok = false;
	}
	if (d->fd >= 0)
		close(d->fd);
	d->fd = -1;
	d->dirty = false;
	free(d->rel);
	d->rel = NULL;
	d->len = 0;
	return ok;
}

bool
gfs_mirror_dir_close(gfs_mirror_dir *d, gfs_error *err)
{
	if (!d)
		return true;
	bool ok = dir_release(d, err);
	if (ok && d->sync_failed) {
		*err = d->sync_err;
		ok = false;
	}
	free(d);
	return ok;
}

int
gfs_mirror_dir_get(gfs_mirror_dir *d, const char *rel, size_t len, bool create, gfs_error *err)
{
	if (d->fd >= 0 && d->len == len && memcmp(d->rel, rel, len) == 0)
		return d->fd;
	/*
	 * The fsync of the directory being left is no fault of the file that
	 * asked for another: kept for gfs_mirror_dir_close to report.
	 */
	gfs_error serr;
	if (!dir_release(d, &serr) && !d->sync_failed) {
		d->sync_err = serr;
		d->sync_failed = true;
	}
	int flags = create ? GFS_SAFEPATH_CREATE | (d->opts->fsync ? GFS_SAFEPATH_SYNC : 0) : 0;
	int fd = gfs_safepath_opendir(d->rootfd, rel, len, flags, err);
	if (fd < 0)
		return -1;
	d->rel = gfs_xmalloc(len + 1);
	memcpy(d->rel, rel, len);
	d->rel[len] = '\0';
	d->len = len;
	d->fd = fd;
	return fd;
}

/* ---- comparing ------------------------------------------------------- */

void
gfs_mirror_prefix_name(gfs_error *err, const struct gfs_mirror_item *it)
{
	char msg[sizeof err->msg];
	memcpy(msg, err->msg, sizeof msg);
	gfs_error_set(err, err->code, "%s: %s", gfs_mirror_item_name(it), msg);
}

/* errno from opening a folder on a file's path: something that is not a directory is there. */
static bool
blocked(int e)
{
	return e == ENOTDIR || e == ELOOP;
}

static void
add_hint(gfs_error *err, const char *hint)
{
	char msg[sizeof err->msg];
	memcpy(msg, err->msg, sizeof msg);
	gfs_error_set(err, err->code, "%s (%s)", msg, hint);
}

/* The mtime to set, split without overflow even at the int64 limits. */
static void
times_of(const struct gfs_mirror_item *it, struct timespec ts[2])
{
	int64_t sec = it->mtime_ns / 1000000000, nsec = it->mtime_ns % 1000000000;
	if (nsec < 0) {
		sec--;
		nsec += 1000000000;
	}
	ts[0].tv_sec = 0;
	ts[0].tv_nsec = UTIME_OMIT;
	ts[1].tv_sec = (time_t)sec;
	ts[1].tv_nsec = (long)nsec;
}

/*
 * Compared as seconds and nanoseconds: a local mtime past 2262 would
 * overflow a count of nanoseconds.
 */
static bool
mtime_matches(const struct stat *st, const struct gfs_mirror_item *it)
{
	struct timespec ts[2];
	times_of(it, ts);
	if (st->st_mtim.tv_sec != ts[1].tv_sec)
		return false;
	if (it->mtime_exact)
		return st->st_mtim.tv_nsec == ts[1].tv_nsec;
	return st->st_mtim.tv_nsec / 1000000 == ts[1].tv_nsec / 1000000;
}

/*
 * Opens a regular file for reading. The entry may have been swapped for a
 * FIFO since it was checked, and opening a FIFO would block until a writer
 * came (forever, holding DIR's lock): O_NONBLOCK makes that open return, and
 * the type is checked on the descriptor itself.
 */
static int
open_regular(int pfd, const char *leaf)
{
	int fd = openat(pfd, leaf, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return -1;
	struct stat st;
	int e = 0, fl;
	if (fstat(fd, &st) < 0)
		e = errno;
	else if (!S_ISREG(st.st_mode))
		e = EAGAIN; /* changed since it was checked */
	else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
		e = errno;
	if (e) {
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

static bool
hash_local(int pfd, const char *leaf, const struct gfs_mirror_item *it, char hex[65],
           gfs_error *err)
{
	int fd = open_regular(pfd, leaf);
	if (fd < 0) {
		gfs_error_set(err, GFS_ELOCAL, "%s: cannot read the local file: %s", gfs_mirror_item_name(it),
		              strerror(errno));
		return false;
	}
	gfs_sha256 *h = gfs_sha256_new();
	static const size_t bufsz = 256 * 1024;
	uint8_t *buf = gfs_xmalloc(bufsz);
	ssize_t n;
	while ((n = read(fd, buf, bufsz)) > 0 || (n < 0 && errno == EINTR))
		if (n > 0)
			gfs_sha256_update(h, buf, (size_t)n);
	int e = errno;
	free(buf);
	close(fd);
	gfs_sha256_final(h, hex);
	if (n < 0) {
		gfs_error_set(err, GFS_ELOCAL, "%s: cannot read the local file: %s", gfs_mirror_item_name(it),
		              strerror(e));
		return false;
	}
	return true;
}

static bool
same_content(gfs_mirror_dir *d, gfs_session *s, int pfd, const char *leaf,
             const struct gfs_mirror_item *it, bool *same, gfs_error *err)
{
	(void)d;
	char local[65], stored[65];
	if (!hash_local(pfd, leaf, it, local, err))
		return false;
	if (it->file.sha256[0]) {
		memcpy(stored, it->file.sha256, sizeof stored);
	} else if (!gfs_read(s, &it->file, false, NULL, NULL, stored, err)) {
		return false;
	}
	*same = strcasecmp(local, stored) == 0;   /* stored hex may be upper case */
	return true;
}

bool
gfs_mirror_decide(gfs_mirror_dir *d, gfs_session *s, const struct gfs_mirror_item *it,
                  enum gfs_mirror_action *out, gfs_error *err)
{
	*out = GFS_MIRROR_WRITE;
	if (d->rootfd < 0)
		return true;
	size_t dl;
	const char *leaf = gfs_mirror_leaf(it, &dl);
	int pfd = gfs_mirror_dir_get(d, it->rel, dl, false, err);
	if (pfd < 0) {
		int e = errno;
		if (e == ENOENT || (blocked(e) && d->opts->clear))
			return true; /* written after what is in the way goes */
		gfs_mirror_prefix_name(err, it);
		if (blocked(e))
			add_hint(err, "--delete replaces it with a directory");
		return false;
	}
	struct stat st;
	if (fstatat(pfd, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno == ENOENT)
			return true;
		gfs_error_set(err, GFS_ELOCAL, "%s: %s", gfs_mirror_item_name(it), strerror(errno));
		return false;
	}
	if (S_ISDIR(st.st_mode)) {
		if (d->opts->clear)
			return true;
		gfs_error_set(err, GFS_ELOCAL, "%s: a directory is in the way (--delete replaces it)",
		              gfs_mirror_item_name(it));
		return false;
	}
	if (S_ISREG(st.st_mode) && d->opts->ignore_existing) {
		*out = GFS_MIRROR_SKIP;
		return true;
	}
	if (!S_ISREG(st.st_mode) || st.st_size != it->file.length)
		return true;
	if (d->opts->size_only) {
		*out = GFS_MIRROR_SKIP;
		return true;
	}
	bool same_time = mtime_matches(&st, it);
	if (!d->opts->checksum && !same_time)
		return true;
	if (d->opts->checksum) {
		bool same;
		if (!same_content(d, s, pfd, leaf, it, &same, err))
			return false;
		if (!same)
			return true;
	}
	bool same_mode = it->mode < 0 || (int32_t)(st.st_mode & 07777) == it->mode;
	if (same_time && same_mode) {
		*out = GFS_MIRROR_SKIP;
		return true;
	}
	/*
	 * A hard link shares its inode with names that may lie outside DIR:
	 * chmod or futimens would change those too. A write replaces only our
	 * link, by rename.
	 */
	*out = st.st_nlink > 1 ? GFS_MIRROR_WRITE : GFS_MIRROR_ATTRS;
	return true;
}

/* ---- writing --------------------------------------------------------- */

struct write_ctx {
	int fd;
	int error;          /* errno of a failed write, 0 when none */
	const atomic_int *stop;
};

bool
gfs_mirror_write_all(int fd, const uint8_t *data, size_t len, const atomic_int *stop, int *error)
{
	if (stop && atomic_load(stop))
		return false;
	while (len > 0) {
		ssize_t n = write(fd, data, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			*error = errno;
			return false;
		}
		data += n;
		len -= (size_t)n;
	}
	return true;
}

/* gfs_read's sink: each chunk as it is checked goes to the temporary file. */
static bool
write_chunk(const uint8_t *data, size_t len, void *ctx)
{
	struct write_ctx *w = ctx;
	return gfs_mirror_write_all(w->fd, data, len, w->stop, &w->error);
}

bool
gfs_mirror_local_error(gfs_error *err, const struct gfs_mirror_item *it, const char *what,
                       int e)
{
	gfs_error_set(err, GFS_ELOCAL, "%s: %s: %s", gfs_mirror_item_name(it), what, strerror(e));
	return false;
}

bool
gfs_mirror_set_attrs(int fd, const struct gfs_mirror_item *it, mode_t create_mode,
                     gfs_error *err)
{
	mode_t mode = it->mode >= 0 ? (mode_t)it->mode : create_mode;
	struct timespec ts[2];
	times_of(it, ts);
	if (fchmod(fd, mode) < 0)
		return gfs_mirror_local_error(err, it, "chmod", errno);
	if (futimens(fd, ts) < 0)
		return gfs_mirror_local_error(err, it, "set mtime", errno);
	return true;
}

/* ---- clearing the way ------------------------------------------------ */

static void
report_removed(const struct gfs_mirror_opts *opts, enum gfs_mirror_sweep_kind kind,
               const char *rel, size_t len)
{
	if (opts->removed)
		opts->removed(kind, rel, len, NULL, opts->removed_ctx);
}

/*
 * Removes the non-directory seg of dirfd, rel[0..end) of it, which is in
 * its way, or keeps it in the backup directory. One the filters leave out
 * is not the run's to remove: the file fails instead.
 */
static bool
clear_entry(gfs_mirror_dir *d, const struct gfs_mirror_item *it, int dirfd, const char *seg,
            size_t end, gfs_error *err)
{
	char path[GFS_SAFEPATH_MAX + 1];
	memcpy(path, it->rel, end);
	path[end] = '\0';
	if (d->opts->plan && !gfs_mirror_plan_takes(d->opts->plan, path, end)) {
		gfs_error_set(err, GFS_ELOCAL, "%s: '%s' is in the way, and the filters leave it out",
		              gfs_mirror_item_name(it), path);
		return false;
	}
	if (d->opts->backup) {
		if (!gfs_backup_entry(d->opts->backup, dirfd, seg, it->rel, end, false, err))
			return false;
	} else if (unlinkat(dirfd, seg, 0) < 0) {
		if (errno != ENOENT && errno != EISDIR)
			return gfs_mirror_local_error(err, it, "remove what is in the way", errno);
		return true;
	}
	report_removed(d->opts, GFS_MIRROR_DELETE, it->rel, end);
	return true;
}

/*
 * Removes the first non-directory on the folder path rel[0..dl) of it. The
 * planning refused names whose folders are planned files, so what is there
 * is not planned. unlinkat without AT_REMOVEDIR never takes a directory,
 * so another thread that got there first and made the folder is harmless.
 */
static bool
clear_path(gfs_mirror_dir *d, const struct gfs_mirror_item *it, size_t dl, gfs_error *err)
{
	char seg[GFS_SAFEPATH_SEG_MAX + 1];
	int fd = fcntl(d->rootfd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return gfs_mirror_local_error(err, it, "duplicate a descriptor", errno);
	bool ok = true;
	for (size_t start = 0; start < dl;) {
		const char *slash = memchr(it->rel + start, '/', dl - start);
		size_t end = slash ? (size_t)(slash - it->rel) : dl;
		memcpy(seg, it->rel + start, end - start);
		seg[end - start] = '\0';
		struct stat st;
		if (fstatat(fd, seg, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno != ENOENT)
				ok = gfs_mirror_local_error(err, it, "stat a folder on its path", errno);
			break; /* missing: the walk that creates folders makes it */
		}
		if (!S_ISDIR(st.st_mode)) {
			ok = clear_entry(d, it, fd, seg, end, err);
			break;
		}
		int next = openat(fd, seg, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0) {
			ok = gfs_mirror_local_error(err, it, "open a folder on its path", errno);
			break;
		}
		close(fd);
		fd = next;
		start = end + 1;
	}
	close(fd);
	return ok;
}

/* Removes a directory tree standing where the file of it is to go. */
static bool
clear_leaf(gfs_mirror_dir *d, const struct gfs_mirror_item *it, int pfd, gfs_error *err)
{
	size_t dl;
	const char *leaf = gfs_mirror_leaf(it, &dl);
	struct stat st;
	if (fstatat(pfd, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
		return true; /* nothing there, or what the rename replaces */
	if (gfs_mirror_remove_tree(d->opts, d->rootfd, pfd, leaf, it->rel, it->rel_len))
		return true;
	gfs_error_set(err, GFS_ELOCAL, "%s: a directory is in the way and could not all be removed",
	              gfs_mirror_item_name(it));
	return false;
}

/* The target's directory, made if missing and, with clear, cleared of what is in the way. */
static int
target_dir(gfs_mirror_dir *d, const struct gfs_mirror_item *it, gfs_error *err)
{
	size_t dl;
	gfs_mirror_leaf(it, &dl);
	int pfd = gfs_mirror_dir_get(d, it->rel, dl, true, err);
	if (pfd < 0 && d->opts->clear && blocked(errno)) {
		if (!clear_path(d, it, dl, err))
			return -1;
		pfd = gfs_mirror_dir_get(d, it->rel, dl, true, err);
	}
	if (pfd < 0) {
		gfs_mirror_prefix_name(err, it);
		return -1;
	}
	if (d->opts->clear && !clear_leaf(d, it, pfd, err))
		return -1;
	return pfd;
}

bool
gfs_mirror_temp_open(gfs_mirror_dir *d, const struct gfs_mirror_item *it,
                     struct gfs_mirror_temp *t, gfs_error *err)
{
	t->fd = -1;
	t->pfd = target_dir(d, it, err);
	if (t->pfd < 0)
		return false;
	for (int tries = 0; tries < 16 && t->fd < 0; tries++) {
		gfs_mirror_temp_name(t->name);
		t->fd = openat(t->pfd, t->name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (t->fd < 0 && errno != EEXIST)
			break;
	}
	if (t->fd < 0)
		return gfs_mirror_local_error(err, it, "cannot create a temporary file", errno);
	return true;
}

bool
gfs_mirror_temp_finish(gfs_mirror_dir *d, const struct gfs_mirror_item *it,
                       struct gfs_mirror_temp *t, bool ok, gfs_error *err)
{
	size_t dl;
	const char *leaf = gfs_mirror_leaf(it, &dl);
	if (ok)
		ok = gfs_mirror_set_attrs(t->fd, it, d->opts->create_mode, err);
	if (ok && d->opts->fsync && fsync(t->fd) < 0)
		ok = gfs_mirror_local_error(err, it, "fsync", errno);
	if (close(t->fd) < 0 && ok)
		ok = gfs_mirror_local_error(err, it, "close", errno);
	t->fd = -1;
	if (ok && renameat(t->pfd, t->name, t->pfd, leaf) < 0)
		ok = gfs_mirror_local_error(err, it, "rename into place", errno);
	if (!ok) {
		unlinkat(t->pfd, t->name, 0);
		return false;
	}
	d->dirty = true;
	return true;
}

/*
 * Read from a secondary, a file that looks damaged may only be behind: its
 * chunks are read again from the primary, whose word goes (issue 31). The
 * files document is the same by its _id (GridFS never rewrites one).
 */
static bool
again_on_primary(gfs_session *s, const struct gfs_mirror_item *it, struct gfs_mirror_temp *t,
                 struct write_ctx *w, gfs_error *err)
{
	if (ftruncate(t->fd, 0) < 0 || lseek(t->fd, 0, SEEK_SET) < 0) {
		w->error = errno;
		return false;
	}
	return gfs_read_on_primary(s, &it->file, write_chunk, w, err);
}

bool
gfs_mirror_temp_fill(gfs_mirror_dir *d, gfs_session *s, const struct gfs_mirror_item *it,
                     struct gfs_mirror_temp *t, gfs_error *err)
{
	struct write_ctx w = {.fd = t->fd, .stop = d->opts->stop};
	bool ok = gfs_read(s, &it->file, true, write_chunk, &w, NULL, err);
	if (!ok && !w.error && err->code != GFS_ECANCELED && gfs_session_on_secondary(s))
		ok = again_on_primary(s, it, t, &w, err);
	if (!ok && w.error)
		gfs_mirror_local_error(err, it, "write", w.error);
	else if (!ok && err->code == GFS_ECANCELED)
		gfs_error_set(err, GFS_ECANCELED, "%s: interrupted", gfs_mirror_item_name(it));
	return ok;
}

static bool
write_file(gfs_mirror_dir *d, gfs_session *s, const struct gfs_mirror_item *it, gfs_error *err)
{
	struct gfs_mirror_temp t;
	if (!gfs_mirror_temp_open(d, it, &t, err))
		return false;
	bool ok = gfs_mirror_temp_fill(d, s, it, &t, err);
	return gfs_mirror_temp_finish(d, it, &t, ok, err);
}

/*
 * Fixes mode and mtime in place; the content is already right. A file
 * that gained a hard link since the decision is written instead, so that
 * the other name keeps its attributes.
 */
static bool
fix_attrs(gfs_mirror_dir *d, gfs_session *s, const struct gfs_mirror_item *it, gfs_error *err)
{
	size_t dl;
	const char *leaf = gfs_mirror_leaf(it, &dl);
	int pfd = gfs_mirror_dir_get(d, it->rel, dl, false, err);
	if (pfd < 0) {
		gfs_mirror_prefix_name(err, it);
		return false;
	}
	int fd = openat(pfd, leaf, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return gfs_mirror_local_error(err, it, "open", errno);
	struct stat st;
	bool ok = true;
	if (fstat(fd, &st) < 0)
		ok = gfs_mirror_local_error(err, it, "stat", errno);
	else if (!S_ISREG(st.st_mode))
		ok = gfs_mirror_local_error(err, it, "changed while mirroring", EAGAIN);
	if (ok && st.st_nlink > 1) {
		close(fd);
		return write_file(d, s, it, err);
	}
	if (ok)
		ok = gfs_mirror_set_attrs(fd, it, d->opts->create_mode, err);
	close(fd);
	return ok;
}

bool
gfs_mirror_apply(gfs_mirror_dir *d, gfs_session *s, const struct gfs_mirror_item *it,
                 enum gfs_mirror_action action, gfs_error *err)
{
	switch (action) {
	case GFS_MIRROR_WRITE: return write_file(d, s, it, err);
	case GFS_MIRROR_ATTRS: return fix_attrs(d, s, it, err);
	case GFS_MIRROR_SKIP: return true;
	}
	return true;
}

