/*
 * A stoppable job: the calling thread waits for fn on a thread of its own,
 * and looks at a stop flag every POLL_MS meanwhile. What it is for: an
 * engine that sits in one wait on the backend for seconds (the driver
 * cannot be interrupted there) while the user has asked it to stop.
 */
#include <pthread.h>
#include <stdlib.h>

#include "stoppable.h"
#include "util.h"

/* A job on a thread of its own, and whether it has returned. */
struct stoppable {
	void (*fn)(void *);
	void *arg;
	pthread_mutex_t mu;
	pthread_cond_t cond;
	bool done;
};

static void *
stoppable_main(void *p)
{
	struct stoppable *j = p;
	j->fn(j->arg);
	pthread_mutex_lock(&j->mu);
	j->done = true;
	pthread_cond_signal(&j->cond);
	pthread_mutex_unlock(&j->mu);
	return NULL;
}

enum { POLL_MS = 50 };

bool
gfs_run_stoppable(void (*fn)(void *), void *arg, const atomic_int *stop, int grace_ms)
{
	/* Left to the thread when abandoned: it may still signal it. */
	struct stoppable *j = gfs_xcalloc(1, sizeof *j);
	*j = (struct stoppable){.fn = fn, .arg = arg};
	pthread_mutex_init(&j->mu, NULL);
	pthread_cond_init(&j->cond, NULL);
	pthread_t t;
	bool threaded = pthread_create(&t, NULL, stoppable_main, j) == 0;
	if (!threaded) {
		fn(arg);
		j->done = true;
	}
	double stop_at = 0;
	pthread_mutex_lock(&j->mu);
	while (!j->done) {
		if (atomic_load(stop) && stop_at == 0)
			stop_at = gfs_mono_seconds() + grace_ms / 1000.0;
		if (stop_at != 0 && gfs_mono_seconds() >= stop_at)
			break;
		struct timespec ts;
		gfs_deadline_in(&ts, POLL_MS);
		pthread_cond_timedwait(&j->cond, &j->mu, &ts);
	}
	bool done = j->done;
	pthread_mutex_unlock(&j->mu);
	if (!done)
		return false;
	if (threaded)
		pthread_join(t, NULL);
	pthread_mutex_destroy(&j->mu);
	pthread_cond_destroy(&j->cond);
	free(j);
	return true;
}
