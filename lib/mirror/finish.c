/*
 * Mirror's finishers: fsync and rename, off the readers.
 *
 * Finishing a file (fsync, rename) costs a disk flush each; the one scan
 * thread, or the per-file writers, hand complete files to a few finisher
 * threads so that flushes overlap with each other and with reading. A
 * complete file is queued (a gfs_workq) with its mode and mtime set and a
 * descriptor of its directory of its own; the queue is bounded (four jobs
 * a thread), so a reader waits rather than open files without end. Each finisher fsyncs
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

#include "../workq.h"
#include "internal.h"

struct finish_job {
	size_t idx;
	int fd;             /* the complete temporary file, mode and mtime set */
	int dirfd;          /* its directory: our own descriptor */
	char tmp[64];
};

struct gfs_mirror_finisher {
	gfs_workq *q;           /* of struct finish_job, four a thread */
	const gfs_mirror_plan *plan;
	gfs_mirror_done_fn done;
	void *ctx;
	pthread_t *tids;
	int n;
	pthread_mutex_t lock;   /* dir_err, dir_failed */
	gfs_error dir_err;      /* the first directory fsync that failed */
	bool dir_failed;
};

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
	struct finish_job *job;
	while ((job = gfs_workq_pop(f->q)) != NULL) {
		const struct gfs_mirror_item *it = &f->plan->items[job->idx];
		size_t dl;
		const char *leaf = gfs_mirror_leaf(it, &dl);
		gfs_error err;
		bool ok = true;
		if (fsync(job->fd) < 0)
			ok = gfs_mirror_local_error(&err, it, "fsync", errno);
		if (close(job->fd) < 0 && ok)
			ok = gfs_mirror_local_error(&err, it, "close", errno);
		if (ok && renameat(job->dirfd, job->tmp, job->dirfd, leaf) < 0)
			ok = gfs_mirror_local_error(&err, it, "rename into place", errno);
		if (!ok)
			unlinkat(job->dirfd, job->tmp, 0);
		fin_dir_note(f, &cur, job->dirfd, ok);
		f->done(job->idx, ok ? NULL : &err, f->ctx);
		free(job);
	}
	fin_dir_sync(f, &cur);
	return NULL;
}

/* Frees a finisher whose threads have ended or never started. */
static void
fin_free(struct gfs_mirror_finisher *f)
{
	gfs_workq_free(f->q, NULL); /* the threads emptied it, or none ever pushed */
	free(f->tids);
	pthread_mutex_destroy(&f->lock);
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
	f->q = gfs_workq_new((size_t)n * 4, 0);
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
	gfs_workq_close(f->q);
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
	if (!gfs_mirror_set_attrs(t->fd, it, d->opts->create_mode, err))
		return false;
	int dirfd = fcntl(t->pfd, F_DUPFD_CLOEXEC, 0);
	if (dirfd < 0)
		return gfs_mirror_local_error(err, it, "duplicate a descriptor", errno);
	struct finish_job *job = gfs_xmalloc(sizeof *job);
	*job = (struct finish_job){.idx = idx, .fd = t->fd, .dirfd = dirfd};
	memcpy(job->tmp, t->name, sizeof job->tmp);
	if (!gfs_workq_push(f->q, job, 0)) {
		/* Closed only once every writer is done, so never: but said if it happens. */
		close(dirfd);
		free(job);
		return gfs_mirror_local_error(err, it, "hand over to be finished", ECANCELED);
	}
	t->fd = -1; /* the finisher owns it now */
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
