/* Per-file chunk reads on several connections: see read_each.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "read_each.h"

/* Files a worker may start ahead of the one the consumer is on, per worker. */
#define WINDOW_PER_JOB 2
/* Bytes of documents one file may have waiting before its worker waits. */
#define FILE_BYTES (4 * 1024 * 1024)
#define MAX_JOBS 32

struct doc {
	bson_t *b;
	struct doc *next;
};

struct file {
	struct doc *head, *tail;
	size_t bytes;
	bool done;
	bool failed;
	gfs_error err;
};

/*
 * Not a gfs_workq (lib/workq.h): the consumer takes documents in the order
 * of ids, not as they come, so each file has a queue of its own, bounded in
 * bytes, and workers start a file only within a window of the one the
 * consumer is on. One lock and one condition cover the files and the
 * window together, since a worker waits on both.
 */
struct gfs_fetch {
	gfs_conn *conn;
	const bson_value_t *const *ids;
	size_t n;
	int32_t batch;
	struct file *files;
	size_t next_start;     /* the next file a worker takes */
	size_t current;        /* the file the consumer is on */
	size_t window;
	bool closing;
	pthread_mutex_t mu;
	pthread_cond_t changed;
	pthread_t threads[MAX_JOBS];
	int nthreads;
};

/* Adds one document to file i; waits while the file has its share queued. False when closing. */
static bool
put(struct gfs_fetch *f, size_t i, const bson_t *doc)
{
	struct doc *d = gfs_xcalloc(1, sizeof *d);
	d->b = bson_copy(doc);
	pthread_mutex_lock(&f->mu);
	struct file *fl = &f->files[i];
	while (fl->head && fl->bytes + doc->len > FILE_BYTES && !f->closing)
		pthread_cond_wait(&f->changed, &f->mu);
	bool open = !f->closing;
	if (open) {
		if (fl->tail)
			fl->tail->next = d;
		else
			fl->head = d;
		fl->tail = d;
		fl->bytes += doc->len;
		pthread_cond_broadcast(&f->changed);
	}
	pthread_mutex_unlock(&f->mu);
	if (!open) {
		bson_destroy(d->b);
		free(d);
	}
	return open;
}

static void
read_file(struct gfs_fetch *f, gfs_session *s, size_t i)
{
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER;
	gfs_id_filter(&filter, "files_id", f->ids[i]);
	BSON_APPEND_INT32(&opts, "batchSize", f->batch);
	mongoc_cursor_t *cur = gfs_session_find(s, s->chunks, &filter, &opts);
	bson_destroy(&filter);
	bson_destroy(&opts);
	const bson_t *doc;
	bool open = true;
	while (open && mongoc_cursor_next(cur, &doc))
		open = put(f, i, doc);
	gfs_error err;
	bool failed = !gfs_cursor_done(cur, "read chunks", &err);
	pthread_mutex_lock(&f->mu);
	f->files[i].done = true;
	f->files[i].failed = failed;
	if (failed)
		f->files[i].err = err;
	pthread_cond_broadcast(&f->changed);
	pthread_mutex_unlock(&f->mu);
}

static void *
worker(void *arg)
{
	struct gfs_fetch *f = arg;
	gfs_session *s = gfs_session_pop(f->conn);
	for (;;) {
		pthread_mutex_lock(&f->mu);
		while (!f->closing && f->next_start < f->n && f->next_start >= f->current + f->window)
			pthread_cond_wait(&f->changed, &f->mu);
		if (f->closing || f->next_start >= f->n) {
			pthread_mutex_unlock(&f->mu);
			break;
		}
		size_t i = f->next_start++;
		pthread_mutex_unlock(&f->mu);
		read_file(f, s, i);
	}
	gfs_session_push(s);
	return NULL;
}

gfs_fetch *
gfs_fetch_start(gfs_conn *conn, const bson_value_t *const *ids, size_t n, int jobs, int32_t batch)
{
	struct gfs_fetch *f = gfs_xcalloc(1, sizeof *f);
	f->conn = conn;
	f->ids = ids;
	f->n = n;
	f->batch = batch;
	f->files = gfs_xcalloc(n ? n : 1, sizeof *f->files);
	if (jobs < 1)
		jobs = 1;
	if (jobs > MAX_JOBS)
		jobs = MAX_JOBS;
	if ((size_t)jobs > n)
		jobs = n ? (int)n : 1;
	f->window = (size_t)jobs * WINDOW_PER_JOB;
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->changed, NULL);
	for (int i = 0; i < jobs; i++)
		if (pthread_create(&f->threads[f->nthreads], NULL, worker, f) == 0)
			f->nthreads++;
	return f;
}

int
gfs_fetch_next(gfs_fetch *f, bson_t **doc, size_t *file, gfs_error *err)
{
	pthread_mutex_lock(&f->mu);
	for (;;) {
		if (f->current >= f->n) {
			pthread_mutex_unlock(&f->mu);
			return 0;
		}
		struct file *fl = &f->files[f->current];
		if (fl->head) {
			struct doc *d = fl->head;
			fl->head = d->next;
			if (!fl->head)
				fl->tail = NULL;
			fl->bytes -= d->b->len;
			pthread_cond_broadcast(&f->changed);
			pthread_mutex_unlock(&f->mu);
			*doc = d->b;
			*file = f->current;
			free(d);
			return 1;
		}
		if (fl->done && fl->failed) {
			*err = fl->err;
			pthread_mutex_unlock(&f->mu);
			return -1;
		}
		if (fl->done) {
			f->current++;
			pthread_cond_broadcast(&f->changed);
			continue;
		}
		if (f->nthreads == 0) {
			/* No thread could start: nothing will ever come. */
			pthread_mutex_unlock(&f->mu);
			gfs_error_set(err, GFS_ELOCAL, "cannot start reading threads");
			return -1;
		}
		pthread_cond_wait(&f->changed, &f->mu);
	}
}

void
gfs_fetch_free(gfs_fetch *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->mu);
	f->closing = true;
	pthread_cond_broadcast(&f->changed);
	pthread_mutex_unlock(&f->mu);
	for (int i = 0; i < f->nthreads; i++)
		pthread_join(f->threads[i], NULL);
	for (size_t i = 0; i < f->n; i++) {
		for (struct doc *d = f->files[i].head, *nx; d; d = nx) {
			nx = d->next;
			bson_destroy(d->b);
			free(d);
		}
	}
	free(f->files);
	pthread_mutex_destroy(&f->mu);
	pthread_cond_destroy(&f->changed);
	free(f);
}
