/* The work queue: see workq.h. */
#include <pthread.h>
#include <stdlib.h>

#include "util.h"
#include "workq.h"

struct slot {
	void *item;
	size_t bytes;
};

struct gfs_workq {
	pthread_mutex_t mu;
	pthread_cond_t not_empty, not_full;
	struct slot *ring;
	size_t cap, head, count;   /* count slots from head, wrapping at cap */
	size_t bytes;
	size_t max_items, max_bytes;
	bool closed;
};

gfs_workq *
gfs_workq_new(size_t max_items, size_t max_bytes)
{
	gfs_workq *q = gfs_xcalloc(1, sizeof *q);
	pthread_mutex_init(&q->mu, NULL);
	pthread_cond_init(&q->not_empty, NULL);
	pthread_cond_init(&q->not_full, NULL);
	q->max_items = max_items ? max_items : 1;
	q->max_bytes = max_bytes;
	return q;
}

void
gfs_workq_free(gfs_workq *q, void (*drop)(void *item))
{
	if (!q)
		return;
	for (size_t i = 0; drop && i < q->count; i++)
		drop(q->ring[(q->head + i) % q->cap].item);
	free(q->ring);
	pthread_mutex_destroy(&q->mu);
	pthread_cond_destroy(&q->not_empty);
	pthread_cond_destroy(&q->not_full);
	free(q);
}

/* Whether an item of bytes must wait; the caller holds q->mu. */
static bool
full_locked(const gfs_workq *q, size_t bytes)
{
	if (q->count == 0)
		return false;
	if (q->count >= q->max_items)
		return true;
	if (!q->max_bytes)
		return false;
	/* q->bytes + bytes > q->max_bytes, without the overflow */
	return q->bytes > q->max_bytes || bytes > q->max_bytes - q->bytes;
}

/* Makes room for one more slot, keeping the order; the caller holds q->mu. */
static void
grow_locked(gfs_workq *q)
{
	if (q->count < q->cap)
		return;
	/* An append comes with count < max_items (full_locked), so max_items has room. */
	size_t cap = q->cap ? q->cap * 2 : 16;
	if (cap > q->max_items)
		cap = q->max_items;
	struct slot *ring = gfs_xcalloc(cap, sizeof *ring);
	for (size_t i = 0; i < q->count; i++)
		ring[i] = q->ring[(q->head + i) % q->cap];
	free(q->ring);
	q->ring = ring;
	q->cap = cap;
	q->head = 0;
}

static void
append_locked(gfs_workq *q, void *item, size_t bytes)
{
	grow_locked(q);
	q->ring[(q->head + q->count) % q->cap] = (struct slot){item, bytes};
	q->count++;
	q->bytes += bytes;
	pthread_cond_signal(&q->not_empty);
}

bool
gfs_workq_push(gfs_workq *q, void *item, size_t bytes)
{
	pthread_mutex_lock(&q->mu);
	while (!q->closed && full_locked(q, bytes))
		pthread_cond_wait(&q->not_full, &q->mu);
	bool open = !q->closed;
	if (open)
		append_locked(q, item, bytes);
	pthread_mutex_unlock(&q->mu);
	return open;
}

bool
gfs_workq_offer(gfs_workq *q, void *item, size_t bytes)
{
	pthread_mutex_lock(&q->mu);
	bool take = !q->closed && !full_locked(q, bytes);
	if (take)
		append_locked(q, item, bytes);
	pthread_mutex_unlock(&q->mu);
	return take;
}

void *
gfs_workq_pop(gfs_workq *q)
{
	pthread_mutex_lock(&q->mu);
	while (q->count == 0 && !q->closed)
		pthread_cond_wait(&q->not_empty, &q->mu);
	void *item = NULL;
	if (q->count > 0) {
		struct slot s = q->ring[q->head];
		q->head = (q->head + 1) % q->cap;
		q->count--;
		q->bytes -= s.bytes;
		item = s.item;
		/*
		 * With a byte bound the producer woken may still not fit and wait
		 * on, while another's smaller item would: wake them all then.
		 */
		if (q->max_bytes)
			pthread_cond_broadcast(&q->not_full);
		else
			pthread_cond_signal(&q->not_full);
	}
	pthread_mutex_unlock(&q->mu);
	return item;
}

void
gfs_workq_close(gfs_workq *q)
{
	pthread_mutex_lock(&q->mu);
	q->closed = true;
	pthread_cond_broadcast(&q->not_empty);
	pthread_cond_broadcast(&q->not_full);
	pthread_mutex_unlock(&q->mu);
}

size_t
gfs_workq_count(gfs_workq *q)
{
	pthread_mutex_lock(&q->mu);
	size_t n = q->count;
	pthread_mutex_unlock(&q->mu);
	return n;
}
