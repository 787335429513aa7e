/*
 * A job the caller can leave behind (lib/stoppable.c): fn runs on a thread
 * of its own, so that a stop asked for (a signal's flag) is answered within
 * a grace period even when fn sits in a wait it cannot leave. The verbs
 * create no thread themselves: cmd/ passes its stop_signal here.
 */
#ifndef GFS_STOPPABLE_H
#define GFS_STOPPABLE_H

#include <stdatomic.h>
#include <stdbool.h>

/*
 * Runs fn(arg) on a thread of its own, polling *stop meanwhile. True when
 * fn returned; false when *stop was set and fn had not returned grace_ms
 * later. fn is then still running: the caller says what was not done and
 * leaves with _exit(), touching nothing fn uses.
 */
bool gfs_run_stoppable(void (*fn)(void *), void *arg, const atomic_int *stop, int grace_ms);

#endif
