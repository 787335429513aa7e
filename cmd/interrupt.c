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
#include <sys/signalfd.h>

#include "cmd.h"

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
