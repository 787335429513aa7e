/*
 * Descriptor watch: how many descriptors a process holds (and of what kind),
 * against its RLIMIT_NOFILE, and where the trend is heading. The decision
 * logic is pure so it can be unit tested; sampling reads /proc.
 */
#ifndef GFS_FDWATCH_H
#define GFS_FDWATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct fdw_counts {
	long total, sockets, files, pipes, other;
};

/* Counts /proc/PID/fd by kind. False when the process is gone or unreadable. */
bool fdw_count(pid_t pid, struct fdw_counts *out);
/* Reads "Max open files" from /proc/PID/limits; -1 means unlimited. */
bool fdw_limits(pid_t pid, long *soft, long *hard);
/* The parsing half of fdw_limits, for a limits file's text. */
bool fdw_parse_limits(const char *text, long *soft, long *hard);
/* Sets the soft RLIMIT_NOFILE of a running process with prlimit(2), keeping its hard limit. */
bool fdw_set_soft(pid_t pid, long soft, char *err, size_t errlen);

#define FDW_WINDOW 10

/* The last FDW_WINDOW samples, for a least-squares slope. */
struct fdw_trend {
	double t[FDW_WINDOW];
	long n[FDW_WINDOW];
	size_t len, head;
};

void fdw_trend_reset(struct fdw_trend *tr);
void fdw_trend_add(struct fdw_trend *tr, double t_s, long count);
/* Descriptors per second over the window; 0 with fewer than 3 samples. */
double fdw_trend_slope(const struct fdw_trend *tr);

enum fdw_action {
	FDW_OK,
	FDW_RAISE,    /* raise the soft limit live */
	FDW_WARN,     /* heading for the limit, nothing left to raise, not critical yet */
	FDW_RESTART,  /* at the hard limit and still climbing */
};

struct fdw_policy {
	int threshold_pct;  /* share of the soft limit that counts as pressure */
	int horizon_s;      /* a trend exhausting the limit within this counts too */
	bool raise;         /* raising the soft limit is allowed */
};

/*
 * Decides what to do about count descriptors under limits soft/hard (-1
 * unlimited) rising at slope per second. *eta_s gets the projected seconds
 * to exhaustion (-1 when not rising).
 */
enum fdw_action fdw_decide(long count, long soft, long hard, double slope,
                           const struct fdw_policy *pol, double *eta_s);
/* The soft limit to raise to: double, capped at the hard limit (and at 1<<20 when unlimited). */
long fdw_raise_target(long soft, long hard);

#endif
