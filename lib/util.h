/* Clocks, allocation and number parsing, for every part of the library (no driver headers). */
#ifndef GFS_UTIL_H
#define GFS_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct stat;

/* CLOCK_REALTIME in ms since the epoch. */
int64_t gfs_now_ms(void);
/* A monotonic clock in seconds, for durations and deadlines. */
double gfs_mono_seconds(void);
/* The clock clk (CLOCK_REALTIME, CLOCK_BOOTTIME, ...) in ns. */
int64_t gfs_clock_ns(clockid_t clk);
/* ts in ns (int64_t holds +-292 years around the epoch). */
int64_t gfs_timespec_ns(const struct timespec *ts);
/* ts in ms, the sub-second part truncated. */
int64_t gfs_timespec_ms(const struct timespec *ts);
/* st's mtime in ns since the epoch, as stored in metadata.mtimeNs. */
int64_t gfs_stat_mtime_ns(const struct stat *st);
/* ns as the ms of metadata.mtime: floored, so times before 1970 round as later ones do. */
int64_t gfs_mtime_ms(int64_t ns);

/*
 * Allocation that cannot fail: out of memory aborts (nothing here can go on
 * without it), and so does a size that overflows. None returns NULL.
 */
/* malloc; 0 bytes allocates 1. */
void *gfs_xmalloc(size_t size);
/* calloc; 0 elements or bytes allocates 1. */
void *gfs_xcalloc(size_t n, size_t size);
/* realloc of p to n * size bytes (at least 1). */
void *gfs_xreallocarray(void *p, size_t n, size_t size);
/* A copy of s, or NULL for NULL. */
char *gfs_xstrdup(const char *s);
/* A copy of at most n bytes of s, always terminated. */
char *gfs_xstrndup(const char *s, size_t n);
/* asprintf(3) into a new string. */
char *gfs_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * Makes room for need elements in the array p of capacity cap (both lvalues;
 * evaluated more than once): when need > cap, cap doubles (from first when 0,
 * and at least to need) and p is reallocated with gfs_xreallocarray.
 */
#define GFS_GROW(p, need, cap, first) \
	do { \
		if ((need) > (cap)) { \
			size_t gfs_grow_cap_ = (cap) ? (size_t)(cap) * 2 : (size_t)(first); \
			(cap) = gfs_grow_cap_ < (size_t)(need) ? (size_t)(need) : gfs_grow_cap_; \
			(p) = gfs_xreallocarray((p), (cap), sizeof *(p)); \
		} \
	} while (0)

/* A growable string: p holds len bytes and a NUL (NULL until the first append); free(p) ends it. */
struct gfs_buf {
	char *p;
	size_t len, cap;
};
/* Appends the formatted text to b, growing it as GFS_GROW does; aborts when it cannot format. */
void gfs_buf_printf(struct gfs_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Formats one message (cut at 1023 bytes) and hands it to log, a
 * library's log callback; nothing when log is NULL.
 */
void gfs_vlog_to(void (*log)(const char *msg), const char *fmt, va_list ap);

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
