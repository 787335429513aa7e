/*
 * What every part keeps count with, at the bottom of serve's own parts:
 * the monotonic clock in microseconds, the backend latency histogram
 * (metrics.c prints it with the rest of the metrics block), the wake-up of
 * a drain waiting for the counts of requests and unanswered connections
 * to reach zero, and serve_logf, the one way a part reports a message
 * (cfg.log). It calls nothing of serve's.
 */
#include <stdarg.h>

#include "internal.h"

const double latency_bounds[NBUCKETS - 1] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                             0.1, 0.25, 0.5, 1, 2.5, 5};

void
serve_logf(struct httpserve *srv, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	gfs_vlog_to(srv->cfg.log, fmt, ap);
	va_end(ap);
}

int64_t
mono_us(void)
{
	return (int64_t)(gfs_mono_seconds() * 1e6);
}

void
observe_latency(struct httpserve *srv, int64_t us)
{
	double s = (double)us / 1e6;
	int b = 0;
	while (b < NBUCKETS - 1 && s > latency_bounds[b])
		b++;
	atomic_fetch_add(&srv->latency_bucket[b], 1);
	atomic_fetch_add(&srv->latency_count, 1);
	atomic_fetch_add(&srv->latency_sum_us, (uint64_t)us);
}

/* The lock only while draining, so that requests never contend for it otherwise. */
void
wake_drain(struct httpserve *srv)
{
	pthread_mutex_lock(&srv->active_mu);
	pthread_cond_broadcast(&srv->active_cv);
	pthread_mutex_unlock(&srv->active_mu);
}

void
connection_answered(struct httpserve *srv)
{
	if (atomic_fetch_sub(&srv->unanswered_connections, 1) == 1 && atomic_load(&srv->draining))
		wake_drain(srv);
}
