/* Clocks and number parsing, for every part of the library (no driver headers). */
#ifndef GFS_UTIL_H
#define GFS_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

int64_t gfs_now_ms(void);
/* A monotonic clock in seconds, for durations and deadlines. */
double gfs_mono_seconds(void);
#include <stddef.h>

/* Allocation that cannot fail: out of memory aborts (nothing here can go on without it). */
void *gfs_xcalloc(size_t n, size_t size);
/* A copy of s, or NULL for NULL. */
char *gfs_xstrdup(const char *s);

/* The CLOCK_REALTIME time ms from now, for pthread_cond_timedwait. */
void gfs_deadline_in(struct timespec *ts, int64_t ms);
/* A whole number in [min, max], nothing else in s. */
bool gfs_parse_long(const char *s, long min, long max, long *out);
/* A size: digits with an optional K, M, G or T (powers of 1024), optional "i" and "B". */
bool gfs_parse_size(const char *s, uint64_t *out);
/*
 * A duration as milliseconds in [min_ms, max_ms]: a decimal number with an
 * optional unit, ms, s, m, min or h (none means seconds), rounded to the
 * nearest millisecond. NaN, infinities and negatives are refused.
 */
bool gfs_parse_duration_ms(const char *s, long min_ms, long max_ms, long *out);
/* Formats ms since the epoch as ISO 8601 UTC with milliseconds. */
void gfs_iso8601(int64_t ms, char buf[32]);

#endif
