/*
 * Interrupts: the one way a verb is asked to stop.
 *
 * The first SIGINT or SIGTERM only records itself (and calls the verb's
 * hook, which must be async-signal-safe), so that the verb can stop where
 * it is safe to, clean up, and exit 130. The handler is reset as it runs:
 * a second signal kills as the default action would, for when a clean stop
 * takes too long. The flag is a lock-free C11 atomic rather than a volatile
 * sig_atomic_t because worker threads read it too, not only the thread the
 * handler interrupted.
 *
 * An event loop takes its signals from a signalfd instead: they are blocked
 * before any thread exists (the driver starts monitor threads), so that
 * they reach only the descriptor.
 */
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <sys/signalfd.h>

#include "cmd.h"
#include "../lib/util.h"

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "a signal handler needs a lock-free atomic_int");

atomic_int stop_signal;

static void (*stop_hook)(int sig);

static void
on_stop_signal(int sig)
{
	atomic_store(&stop_signal, sig);
	if (stop_hook)
		stop_hook(sig);
}

void
catch_interrupts(int flags, void (*hook)(int sig))
{
	stop_hook = hook;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop_signal;
	sa.sa_flags = SA_RESETHAND | (flags & INTERRUPT_RESTART ? SA_RESTART : 0);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

void
release_interrupts(void)
{
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	stop_hook = NULL;
}

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
run_stoppable(void (*fn)(void *), void *arg, int grace_ms)
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
		if (atomic_load(&stop_signal) && stop_at == 0)
			stop_at = gfs_mono_seconds() + grace_ms / 1000.0;
		if (stop_at != 0 && gfs_mono_seconds() >= stop_at)
			break;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += POLL_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
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

int
interrupt_signalfd(int extra)
{
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	if (extra)
		sigaddset(&mask, extra);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	return signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
}
