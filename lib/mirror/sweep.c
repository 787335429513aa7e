/*
 * Mirror's sweep: the walk of DIR after the files are written.
 *
 * It removes the temporary files an interrupted run left behind, always,
 * and with --delete what the plan does not have (held paths count as
 * planned), then the directories left empty that hold nothing planned.
 * With --backup-dir a deleted file is moved there instead, and one that
 * cannot be stays. The same walk, dry, counts what --delete would remove
 * for --max-delete before anything changes.
 *
 * The walk never follows a symlink (it removes the link, not what it
 * leads to), never goes into another mount beneath DIR (a bind mount of
 * something the user cares about is not ours to empty), and goes at most
 * GFS_MIRROR_DEPTH_MAX levels deep, holding one descriptor a level.
 * Writers use its tree removal for a directory standing where a file must
 * go (gfs_mirror_remove_tree).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "../safepath.h"
#include "backup.h"
#include "internal.h"

/*
 * Which mount a directory is on. The device tells file systems apart but
 * not a bind mount of a folder of the same file system; the mount id does,
 * where statx has it (Linux 5.8).
 */
struct mount_id {
	dev_t dev;
	uint64_t mnt;
	bool has_mnt;
};

static bool
mount_of(int fd, struct mount_id *id)
{
	struct statx stx;
	if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &stx) == 0) {
		id->dev = makedev(stx.stx_dev_major, stx.stx_dev_minor);
		id->has_mnt = (stx.stx_mask & STATX_MNT_ID) != 0;
		id->mnt = stx.stx_mnt_id;
		return true;
	}
	struct stat st;
	if (fstat(fd, &st) < 0)
		return false;
	id->dev = st.st_dev;
	id->has_mnt = false;
	return true;
}

static bool
same_mount(const struct mount_id *a, const struct mount_id *b)
{
	if (a->dev != b->dev)
		return false;
	return !a->has_mnt || !b->has_mnt || a->mnt == b->mnt;
}

struct sweep {
	const gfs_mirror_plan *plan;
	bool del, dry_run;
	gfs_mirror_sweep_fn fn;
	void *ctx;
	bool ok;
	struct mount_id root;   /* DIR's mount: other mounts beneath are left alone */
	gfs_backup *backup;     /* where deleted files go, or NULL */
	uint64_t files_kept;    /* non-directories left in place, for --max-delete */
	uint64_t gone;          /* entries removed (or, dry, to be) so far */
	int depth;
	char path[GFS_SAFEPATH_MAX + GFS_SAFEPATH_SEG_MAX + 8];
};

static void
sweep_fail(struct sweep *sw, enum gfs_mirror_sweep_kind kind, size_t len, const char *what, int e)
{
	gfs_error err;
	gfs_error_set(&err, GFS_ELOCAL, "%.*s: %s: %s", (int)len, len ? sw->path : ".", what,
	              strerror(e));
	sw->ok = false;
	sw->fn(kind, sw->path, len, &err, sw->ctx);
}

/* Removes (or reports) one non-directory entry; true when it is gone. */
static bool
sweep_unlink(struct sweep *sw, int dirfd, const char *name, size_t len,
             enum gfs_mirror_sweep_kind kind)
{
	if (!sw->dry_run && kind == GFS_MIRROR_DELETE && sw->backup) {
		gfs_error err;
		if (!gfs_backup_entry(sw->backup, dirfd, name, sw->path, len, false, &err)) {
			sw->ok = false;
			sw->fn(kind, sw->path, len, &err, sw->ctx);
			return false;
		}
	} else if (!sw->dry_run && unlinkat(dirfd, name, 0) < 0 && errno != ENOENT) {
		sweep_fail(sw, kind, len, "cannot remove", errno);
		return false;
	}
	sw->gone++;
	sw->fn(kind, sw->path, len, NULL, sw->ctx);
	return true;
}

static size_t sweep_dir(struct sweep *sw, int fd, size_t plen);

/*
 * Opens a subdirectory to sweep; -1 when it cannot be or must not be: a
 * mount point (another file system, perhaps a bind mount of something the
 * user cares about) is not ours to empty, and too deep a tree would run
 * out of descriptors.
 */
static int
sweep_open(struct sweep *sw, int dirfd, const char *name, size_t len)
{
	if (sw->depth >= GFS_MIRROR_DEPTH_MAX) {
		gfs_error err;
		/* The reason first: a path this deep does not fit in the message. */
		gfs_error_set(&err, GFS_ELOCAL, "not swept, more than %d levels deep: %.*s",
		              GFS_MIRROR_DEPTH_MAX, (int)len, sw->path);
		sw->ok = false;
		sw->fn(GFS_MIRROR_RMDIR, sw->path, len, &err, sw->ctx);
		return -1;
	}
	int sub = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sub < 0) {
		sweep_fail(sw, GFS_MIRROR_RMDIR, len, "cannot open", errno);
		return -1;
	}
	struct mount_id id;
	if (!mount_of(sub, &id)) {
		sweep_fail(sw, GFS_MIRROR_RMDIR, len, "cannot stat", errno);
		close(sub);
		return -1;
	}
	if (!same_mount(&id, &sw->root)) {
		close(sub);
		return -1;
	}
	return sub;
}

/* Sweeps a subdirectory, then removes it if it is left empty and unplanned. */
static bool
sweep_subdir(struct sweep *sw, int dirfd, const char *name, size_t len)
{
	int sub = sweep_open(sw, dirfd, name, len);
	if (sub < 0)
		return false;
	uint64_t gone = sw->gone;
	sw->depth++;
	size_t kept = sweep_dir(sw, sub, len);
	sw->depth--;
	if (!sw->del || kept > 0 || gfs_mirror_plan_has_dir(sw->plan, sw->path, len))
		return false;
	/* An empty directory the filters leave out is theirs, unless the sweep emptied it. */
	if (sw->gone == gone && !gfs_mirror_plan_takes(sw->plan, sw->path, len))
		return false;
	if (!sw->dry_run && unlinkat(dirfd, name, AT_REMOVEDIR) < 0) {
		if (errno == ENOTEMPTY || errno == EEXIST)
			return false;
		sweep_fail(sw, GFS_MIRROR_RMDIR, len, "cannot remove", errno);
		return false;
	}
	sw->gone++;
	sw->fn(GFS_MIRROR_RMDIR, sw->path, len, NULL, sw->ctx);
	return true;
}

/* Sweeps one entry of the directory dirfd; true when it is gone. */
static bool
sweep_entry(struct sweep *sw, int dirfd, const struct dirent *de, size_t len)
{
	const char *name = de->d_name;
	size_t nl = strlen(name);
	unsigned char type = de->d_type;
	struct stat st;
	if (type == DT_UNKNOWN && fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
		type = S_ISDIR(st.st_mode) ? DT_DIR : DT_REG;
	if (type == DT_DIR)
		return sweep_subdir(sw, dirfd, name, len);
	if (gfs_mirror_is_temp_name(name, nl))
		return sweep_unlink(sw, dirfd, name, len, GFS_MIRROR_CLEAN);
	if (sw->del && !gfs_mirror_plan_has_file(sw->plan, sw->path, len) &&
	    gfs_mirror_plan_takes(sw->plan, sw->path, len))
		return sweep_unlink(sw, dirfd, name, len, GFS_MIRROR_DELETE);
	sw->files_kept++;
	return false;
}

/*
 * Sweeps the directory open as fd, which it takes over (one descriptor per
 * level, not two). Returns how many entries stay in it.
 */
static size_t
sweep_dir(struct sweep *sw, int fd, size_t plen)
{
	DIR *dp = fdopendir(fd);
	if (!dp) {
		sweep_fail(sw, GFS_MIRROR_RMDIR, plen, "cannot read directory", errno);
		close(fd);
		return 1;
	}
	size_t kept = 0;
	struct dirent *de;
	while ((errno = 0, de = readdir(dp)) != NULL) {
		const char *name = de->d_name;
		if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
			continue;
		size_t nl = strlen(name);
		size_t len = plen + (plen ? 1 : 0) + nl;
		if (len > GFS_SAFEPATH_MAX) {
			kept++; /* too deep to be anything mirror wrote */
			continue;
		}
		if (plen)
			sw->path[plen] = '/';
		memcpy(sw->path + len - nl, name, nl);
		sw->path[len] = '\0';
		kept += !sweep_entry(sw, fd, de, len);
		sw->path[plen] = '\0';
	}
	if (errno != 0)
		sweep_fail(sw, GFS_MIRROR_RMDIR, plen, "cannot read directory", errno);
	closedir(dp);
	return kept;
}

static void
removed_nowhere(enum gfs_mirror_sweep_kind kind, const char *rel, size_t len,
                const gfs_error *err, void *ctx)
{
	(void)kind;
	(void)rel;
	(void)len;
	(void)err;
	(void)ctx;
}

bool
gfs_mirror_remove_tree(const struct gfs_mirror_opts *opts, int rootfd, int pfd, const char *leaf,
                       const char *rel, size_t len)
{
	struct mount_id root;
	if (!opts->plan || len > GFS_SAFEPATH_MAX || !mount_of(rootfd, &root))
		return false;
	struct sweep *sw = gfs_xcalloc(1, sizeof *sw);
	sw->root = root;
	sw->plan = opts->plan;
	sw->del = true;
	sw->fn = opts->removed ? opts->removed : removed_nowhere;
	sw->ctx = opts->removed_ctx;
	sw->backup = opts->backup;
	sw->ok = true;
	memcpy(sw->path, rel, len);
	sw->path[len] = '\0';
	bool gone = sweep_subdir(sw, pfd, leaf, len);
	free(sw);
	return gone;
}

static bool
sweep_run(struct sweep *sw, int rootfd)
{
	sw->ok = true;
	/* Its own open directory, read from the start: a dup would share a position another sweep moved. */
	int fd = openat(rootfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || !mount_of(fd, &sw->root)) {
		sweep_fail(sw, GFS_MIRROR_RMDIR, 0, "cannot read directory", errno);
		if (fd >= 0)
			close(fd);
	} else {
		sweep_dir(sw, fd, 0);
	}
	return sw->ok;
}

bool
gfs_mirror_sweep(int rootfd, const gfs_mirror_plan *plan, bool del, bool dry_run,
                 gfs_backup *backup, gfs_mirror_sweep_fn fn, void *ctx)
{
	struct sweep *sw = gfs_xcalloc(1, sizeof *sw);
	sw->plan = plan;
	sw->del = del;
	sw->dry_run = dry_run;
	sw->backup = backup;
	sw->fn = fn;
	sw->ctx = ctx;
	bool ok = sweep_run(sw, rootfd);
	free(sw);
	return ok;
}

static void
count_delete(enum gfs_mirror_sweep_kind kind, const char *rel, size_t len, const gfs_error *err,
             void *ctx)
{
	(void)rel;
	(void)len;
	if (kind == GFS_MIRROR_DELETE && !err)
		(*(uint64_t *)ctx)++;
}

bool
gfs_mirror_count_deletes(int rootfd, const gfs_mirror_plan *plan, uint64_t *deletes,
                         uint64_t *kept)
{
	struct sweep *sw = gfs_xcalloc(1, sizeof *sw);
	*deletes = 0;
	sw->plan = plan;
	sw->del = true;
	sw->dry_run = true;
	sw->fn = count_delete;
	sw->ctx = deletes;
	bool ok = sweep_run(sw, rootfd);
	*kept = sw->files_kept;
	free(sw);
	return ok;
}
