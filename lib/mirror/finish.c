/*
 * Mirror's finishers: fsync and rename, off the readers.
 *
 * Finishing a file (fsync, rename) costs a disk flush each; the one scan
 * thread, or the per-file writers, hand complete files to a few finisher
 * threads so that flushes overlap with each other and with reading. A
 * complete file is queued with its mode and mtime set and a descriptor of
 * its directory of its own; the queue is bounded (four jobs a thread), so
 * a reader waits rather than open files without end. Each finisher fsyncs
 * a directory once when it moves on to another, as gfs_mirror_dir does; a
 * directory fsync that fails is kept and reported when the finishers stop.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

struct finish_job {
	size_t idx;
	int fd;             /* the complete temporary file, mode and mtime set */
	int dirfd;          /* its directory: our own descriptor */
	char tmp[64];
};

struct gfs_mirror_finisher {
	pthread_mutex_t lock;
	pthread_cond_t more, room;
	struct finish_job *q;   /* a ring of cap jobs */
	size_t cap, head, count;
	bool closing;
	const gfs_mirror_plan *plan;
	gfs_mirror_done_fn done;
	void *ctx;
	pthread_t *tids;
	int n;
	gfs_error dir_err;      /* the first directory fsync that failed */
	bool dir_failed;
};

static bool
fin_pop(struct gfs_mirror_finisher *f, struct finish_job *job)
{
	pthread_mutex_lock(&f->lock);
	while (f->count == 0 && !f->closing)
		pthread_cond_wait(&f->more, &f->lock);
	bool got = f->count > 0;
	if (got) {
		*job = f->q[f->head];
		f->head = (f->head + 1) % f->cap;
		f->count--;
		pthread_cond_signal(&f->room);
	}
	pthread_mutex_unlock(&f->lock);
	return got;
}

static void
fin_push(struct gfs_mirror_finisher *f, const struct finish_job *job)
{
	pthread_mutex_lock(&f->lock);
	while (f->count == f->cap)
		pthread_cond_wait(&f->room, &f->lock);
	f->q[(f->head + f->count) % f->cap] = *job;
	f->count++;
	pthread_cond_signal(&f->more);
	pthread_mutex_unlock(&f->lock);
}

struct fin_dir {
	int fd;
	dev_t dev;
	ino_t ino;
	bool dirty;
};

static void
fin_dir_sync(struct gfs_mirror_finisher *f, struct fin_dir *fd)
{
	if (fd->fd < 0)
		return;
	if (fd->dirty && fsync(fd->fd) < 0) {
		pthread_mutex_lock(&f->lock);
		if (!f->dir_failed)
			gfs_error_set(&f->dir_err, GFS_ELOCAL, "fsync of a directory: %s", strerror(errno));
		f->dir_failed = true;
		pthread_mutex_unlock(&f->lock);
	}
	close(fd->fd);
	fd->fd = -1;
	fd->dirty = false;
}

/* Keeps job's directory as the current one (syncing the previous), or closes it. */
static void
fin_dir_note(struct gfs_mirror_finisher *f, struct fin_dir *cur, int dirfd, bool renamed)
{
	struct stat st;
	if (fstat(dirfd, &st) < 0) {
		close(dirfd);
		return;
	}
	if (cur->fd >= 0 && st.st_dev == cur->dev && st.st_ino == cur->ino) {
		close(dirfd);
	} else {
		fin_dir_sync(f, cur);
		cur->fd = dirfd;
		cur->dev = st.st_dev;
		cur->ino = st.st_ino;
	}
	cur->dirty |= renamed;
}

static void *
fin_thread(void *arg)
{
	struct gfs_mirror_finisher *f = arg;
	struct fin_dir cur = {.fd = -1};
	struct finish_job job;
	while (fin_pop(f, &job)) {
		const struct gfs_mirror_item *it = &f->plan->items[job.idx];
		size_t dl;
		const char *leaf = gfs_mirror_leaf(it, &dl);
		gfs_error err;
		bool ok = true;
		if (fsync(job.fd) < 0)
			ok = gfs_mirror_local_error(&err, it, "fsync", errno);
		if (close(job.fd) < 0 && ok)
			ok = gfs_mirror_local_error(&err, it, "close", errno);
		if (ok && renameat(job.dirfd, job.tmp, job.dirfd, leaf) < 0)
			ok = gfs_mirror_local_error(&err, it, "rename into place", errno);
		if (!ok)
			unlinkat(job.dirfd, job.tmp, 0);
		fin_dir_note(f, &cur, job.dirfd, ok);
		f->done(job.idx, ok ? NULL : &err, f->ctx);
	}
	fin_dir_sync(f, &cur);
	return NULL;
}

/* Frees a finisher whose threads have ended or never started. */
static void
fin_free(struct gfs_mirror_finisher *f)
{
	free(f->q);
	free(f->tids);
	pthread_mutex_destroy(&f->lock);
	pthread_cond_destroy(&f->more);
	pthread_cond_destroy(&f->room);
	free(f);
}

gfs_mirror_finisher *
gfs_mirror_finisher_start(const gfs_mirror_plan *plan, int n, gfs_mirror_done_fn done,
                          void *ctx)
{
	if (n <= 0)
		return NULL;
	struct gfs_mirror_finisher *f = gfs_xcalloc(1, sizeof *f);
	pthread_mutex_init(&f->lock, NULL);
	pthread_cond_init(&f->more, NULL);
	pthread_cond_init(&f->room, NULL);
	f->cap = (size_t)n * 4;
	f->q = gfs_xcalloc(f->cap, sizeof *f->q);
	f->tids = gfs_xcalloc((size_t)n, sizeof *f->tids);
	f->plan = plan;
	f->done = done;
	f->ctx = ctx;
	for (int i = 0; i < n; i++) {
		if (pthread_create(&f->tids[i], NULL, fin_thread, f) != 0)
			break;
		f->n++;
	}
	if (f->n == 0) {
		fin_free(f);
		return NULL; /* finish inline instead */
	}
	return f;
}

bool
gfs_mirror_finisher_stop(gfs_mirror_finisher *f, gfs_error *err)
{
	if (!f)
		return true;
	pthread_mutex_lock(&f->lock);
	f->closing = true;
	pthread_cond_broadcast(&f->more);
	pthread_mutex_unlock(&f->lock);
	for (int i = 0; i < f->n; i++)
		pthread_join(f->tids[i], NULL);
	bool ok = !f->dir_failed;
	if (!ok)
		*err = f->dir_err;
	fin_free(f);
	return ok;
}

bool
gfs_mirror_finisher_take(gfs_mirror_finisher *f, gfs_mirror_dir *d, size_t idx,
                         struct gfs_mirror_temp *t, gfs_error *err)
{
	const struct gfs_mirror_item *it = &f->plan->items[idx];
	struct finish_job job = {.idx = idx, .fd = t->fd};
	memcpy(job.tmp, t->name, sizeof job.tmp);
	if (!gfs_mirror_set_attrs(t->fd, it, d->opts->create_mode, err))
		return false;
	job.dirfd = fcntl(t->pfd, F_DUPFD_CLOEXEC, 0);
	if (job.dirfd < 0)
		return gfs_mirror_local_error(err, it, "duplicate a descriptor", errno);
	t->fd = -1; /* the finisher owns it now */
	fin_push(f, &job);
	return true;
}

bool
gfs_mirror_write_queued(gfs_mirror_dir *d, gfs_session *s, size_t idx,
                        gfs_mirror_finisher *f, gfs_error *err)
{
	const struct gfs_mirror_item *it = &f->plan->items[idx];
	struct gfs_mirror_temp t;
	if (!gfs_mirror_temp_open(d, it, &t, err))
		return false;
	bool ok = gfs_mirror_temp_fill(d, s, it, &t, err);
	if (ok && gfs_mirror_finisher_take(f, d, idx, &t, err))
		return true;
	close(t.fd);
	unlinkat(t.pfd, t.name, 0);
	return false;
}
