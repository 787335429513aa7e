/* Unit tests: the work queue (lib/workq), as import, verify and serve's workers use it. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "../../lib/workq.h"

/* Items are opaque: small numbers stand for them. */
static void *
item(uintptr_t n)
{
	return (void *)n;
}

static void
pops_in_push_order_and_drains_after_close(void **state)
{
	(void)state;
	gfs_workq *q = gfs_workq_new(8, 0);
	for (uintptr_t i = 1; i <= 5; i++)
		assert_true(gfs_workq_push(q, item(i), 0));
	assert_int_equal(gfs_workq_count(q), 5);
	assert_ptr_equal(gfs_workq_pop(q), item(1));
	gfs_workq_close(q);
	gfs_workq_close(q);
	/* Closed: pushes fail, what is queued still comes out, then NULL for good. */
	assert_false(gfs_workq_push(q, item(9), 0));
	assert_false(gfs_workq_offer(q, item(9), 0));
	for (uintptr_t i = 2; i <= 5; i++)
		assert_ptr_equal(gfs_workq_pop(q), item(i));
	assert_null(gfs_workq_pop(q));
	assert_null(gfs_workq_pop(q));
	assert_int_equal(gfs_workq_count(q), 0);
	gfs_workq_free(q, NULL);
}

static void
offer_is_refused_at_the_item_bound(void **state)
{
	(void)state;
	gfs_workq *q = gfs_workq_new(3, 0);
	assert_true(gfs_workq_offer(q, item(1), 0));
	assert_true(gfs_workq_offer(q, item(2), 0));
	assert_true(gfs_workq_offer(q, item(3), 0));
	assert_false(gfs_workq_offer(q, item(4), 0));
	assert_int_equal(gfs_workq_count(q), 3);
	assert_ptr_equal(gfs_workq_pop(q), item(1));
	assert_true(gfs_workq_offer(q, item(4), 0));
	gfs_workq_free(q, NULL);
}

/* A bound of 0 items is a bound of one: an empty queue always takes one. */
static void
zero_items_means_one(void **state)
{
	(void)state;
	gfs_workq *q = gfs_workq_new(0, 0);
	assert_true(gfs_workq_offer(q, item(1), 0));
	assert_false(gfs_workq_offer(q, item(2), 0));
	gfs_workq_free(q, NULL);
}

static void
byte_bound_takes_one_heavy_item_when_empty(void **state)
{
	(void)state;
	gfs_workq *q = gfs_workq_new(100, 1000);
	/* Heavier than the bound: taken, since nothing else is queued. */
	assert_true(gfs_workq_offer(q, item(1), 5000));
	assert_false(gfs_workq_offer(q, item(2), 1));
	assert_ptr_equal(gfs_workq_pop(q), item(1));
	assert_true(gfs_workq_offer(q, item(2), 600));
	assert_false(gfs_workq_offer(q, item(3), 401));
	assert_true(gfs_workq_offer(q, item(3), 400));
	/* Exactly at the bound, an item of no weight still fits (verify's end of a file). */
	assert_true(gfs_workq_offer(q, item(4), 0));
	assert_false(gfs_workq_offer(q, item(5), 1));
	gfs_workq_free(q, NULL);
}

static void
ring_keeps_order_across_wraps_and_growth(void **state)
{
	(void)state;
	gfs_workq *q = gfs_workq_new(1000, 0);
	uintptr_t in = 1, out = 1;
	/* Grow while the ring has wrapped, at several sizes. */
	for (int round = 0; round < 50; round++) {
		for (int k = 0; k < 7 * round % 37 + 3; k++)
			assert_true(gfs_workq_offer(q, item(in++), 0));
		for (int k = 0; k < 5 * round % 29 + 1 && out < in; k++)
			assert_ptr_equal(gfs_workq_pop(q), item(out++));
	}
	assert_int_equal(gfs_workq_count(q), in - out);
	gfs_workq_close(q);
	void *p;
	while ((p = gfs_workq_pop(q)) != NULL)
		assert_ptr_equal(p, item(out++));
	assert_int_equal(out, in);
	gfs_workq_free(q, NULL);
}

static size_t dropped_sum;

static void
drop(void *p)
{
	dropped_sum += (uintptr_t)p;
}

static void
free_drops_what_is_left(void **state)
{
	(void)state;
	gfs_workq *q = gfs_workq_new(4, 0);
	for (uintptr_t i = 1; i <= 4; i++)
		assert_true(gfs_workq_push(q, item(i), 0));
	assert_ptr_equal(gfs_workq_pop(q), item(1));
	dropped_sum = 0;
	gfs_workq_free(q, drop);
	assert_int_equal(dropped_sum, 2 + 3 + 4);
}

/* ---- with threads -------------------------------------------------------- */

struct producer {
	gfs_workq *q;
	uintptr_t first, n;
	size_t bytes;
	size_t pushed;
};

static void *
produce(void *arg)
{
	struct producer *p = arg;
	for (uintptr_t i = 0; i < p->n; i++)
		if (gfs_workq_push(p->q, item(p->first + i), p->bytes))
			p->pushed++;
	return NULL;
}

struct consumer {
	gfs_workq *q;
	uint64_t sum;
	size_t n;
	bool in_order;         /* for one producer: each item is one more than the last */
};

static void *
consume(void *arg)
{
	struct consumer *c = arg;
	uintptr_t last = 0;
	c->in_order = true;
	void *p;
	while ((p = gfs_workq_pop(c->q)) != NULL) {
		if ((uintptr_t)p != last + 1)
			c->in_order = false;
		last = (uintptr_t)p;
		c->sum += (uintptr_t)p;
		c->n++;
	}
	return NULL;
}

/* A producer at the bound waits for the worker, and everything arrives in order. */
static void
blocked_push_resumes_as_the_worker_pops(void **state)
{
	(void)state;
	gfs_workq *q = gfs_workq_new(2, 64);
	struct producer p = {q, 1, 20000, 16, 0};
	struct consumer c = {q, 0, 0, false};
	pthread_t pt, ct;
	assert_int_equal(pthread_create(&ct, NULL, consume, &c), 0);
	assert_int_equal(pthread_create(&pt, NULL, produce, &p), 0);
	pthread_join(pt, NULL);
	gfs_workq_close(q);
	pthread_join(ct, NULL);
	assert_int_equal(p.pushed, 20000);
	assert_int_equal(c.n, 20000);
	assert_true(c.in_order);
	gfs_workq_free(q, NULL);
}

static void
many_producers_and_workers_lose_nothing(void **state)
{
	(void)state;
	enum { NP = 4, NC = 3, PER = 25000 };
	gfs_workq *q = gfs_workq_new(16, 0);
	struct producer p[NP];
	struct consumer c[NC] = {{0}};
	pthread_t pt[NP], ct[NC];
	for (int i = 0; i < NC; i++) {
		c[i].q = q;
		assert_int_equal(pthread_create(&ct[i], NULL, consume, &c[i]), 0);
	}
	for (int i = 0; i < NP; i++) {
		p[i] = (struct producer){q, 1 + (uintptr_t)i * PER, PER, 0, 0};
		assert_int_equal(pthread_create(&pt[i], NULL, produce, &p[i]), 0);
	}
	for (int i = 0; i < NP; i++)
		pthread_join(pt[i], NULL);
	gfs_workq_close(q);
	uint64_t sum = 0;
	size_t n = 0;
	for (int i = 0; i < NC; i++) {
		pthread_join(ct[i], NULL);
		sum += c[i].sum;
		n += c[i].n;
	}
	uint64_t total = (uint64_t)NP * PER;
	assert_int_equal(n, total);
	assert_true(sum == total * (total + 1) / 2);
	gfs_workq_free(q, NULL);
}

/* Closing wakes a producer waiting at the bound (its push fails) and idle workers (NULL). */
static void
close_wakes_blocked_pushers_and_poppers(void **state)
{
	(void)state;
	gfs_workq *full = gfs_workq_new(1, 0);
	assert_true(gfs_workq_push(full, item(1), 0));
	struct producer p = {full, 2, 1, 0, 0};
	pthread_t pt;
	assert_int_equal(pthread_create(&pt, NULL, produce, &p), 0);

	gfs_workq *empty = gfs_workq_new(4, 0);
	struct consumer c[2] = {{empty, 0, 0, false}, {empty, 0, 0, false}};
	pthread_t ct[2];
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&ct[i], NULL, consume, &c[i]), 0);

	gfs_workq_close(full);
	gfs_workq_close(empty);
	pthread_join(pt, NULL);
	for (int i = 0; i < 2; i++) {
		pthread_join(ct[i], NULL);
		assert_int_equal(c[i].n, 0);
	}
	assert_int_equal(p.pushed, 0);
	assert_ptr_equal(gfs_workq_pop(full), item(1));
	assert_null(gfs_workq_pop(full));
	gfs_workq_free(full, NULL);
	gfs_workq_free(empty, NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(pops_in_push_order_and_drains_after_close),
		cmocka_unit_test(offer_is_refused_at_the_item_bound),
		cmocka_unit_test(zero_items_means_one),
		cmocka_unit_test(byte_bound_takes_one_heavy_item_when_empty),
		cmocka_unit_test(ring_keeps_order_across_wraps_and_growth),
		cmocka_unit_test(free_drops_what_is_left),
		cmocka_unit_test(blocked_push_resumes_as_the_worker_pops),
		cmocka_unit_test(many_producers_and_workers_lose_nothing),
		cmocka_unit_test(close_wakes_blocked_pushers_and_poppers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
