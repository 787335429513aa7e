/* Small things every part needs: clocks, allocation and number parsing. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "util.h"

int64_t
gfs_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return gfs_timespec_ms(&ts);
}

int64_t
gfs_clock_ns(clockid_t clk)
{
	struct timespec ts;
	clock_gettime(clk, &ts);
	return gfs_timespec_ns(&ts);
}

int64_t
gfs_timespec_ns(const struct timespec *ts)
{
	return (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec;
}

int64_t
gfs_timespec_ms(const struct timespec *ts)
{
	return (int64_t)ts->tv_sec * 1000 + ts->tv_nsec / 1000000;
}

int64_t
gfs_stat_mtime_ns(const struct stat *st)
{
	return gfs_timespec_ns(&st->st_mtim);
}

int64_t
gfs_mtime_ms(int64_t ns)
{
	return ns >= 0 ? ns / 1000000 : -((-ns + 999999) / 1000000);
}

void
gfs_iso8601(int64_t ms, char buf[32])
{
	time_t secs = (time_t)(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
	int frac = (int)(ms - (int64_t)secs * 1000);
	struct tm tm;
	gmtime_r(&secs, &tm);
	size_t n = strftime(buf, 32, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf + n, 32 - n, ".%03dZ", frac);
}

double
gfs_mono_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void *
gfs_xmalloc(size_t size)
{
	void *p = malloc(size ? size : 1);
	if (!p)
		abort();
	return p;
}

void *
gfs_xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);
	if (!p)
		abort();
	return p;
}

void *
gfs_xreallocarray(void *p, size_t n, size_t size)
{
	if (size && n > SIZE_MAX / size)
		abort();
	size_t bytes = n * size;
	void *q = realloc(p, bytes ? bytes : 1);
	if (!q)
		abort();
	return q;
}

char *
gfs_xstrdup(const char *s)
{
	if (!s)
		return NULL;
	char *d = strdup(s);
	if (!d)
		abort();
	return d;
}

char *
gfs_xstrndup(const char *s, size_t n)
{
	char *d = strndup(s, n);
	if (!d)
		abort();
	return d;
}

char *
gfs_xasprintf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *s;
	int n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0)
		abort();
	return s;
}

void
gfs_buf_printf(struct gfs_buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(b->p ? b->p + b->len : NULL, b->cap - b->len, fmt, ap);
	va_end(ap);
	if (n < 0)
		abort();
	if ((size_t)n >= b->cap - b->len) {
		GFS_GROW(b->p, b->len + (size_t)n + 1, b->cap, 256);
		va_start(ap, fmt);
		vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
		va_end(ap);
	}
	b->len += (size_t)n;
}

void
gfs_vlog_to(void (*log)(const char *msg), const char *fmt, va_list ap)
{
	if (!log)
		return;
	char buf[1024];
	vsnprintf(buf, sizeof buf, fmt, ap);
	log(buf);
}

void
gfs_deadline_in(struct timespec *ts, int64_t ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	}
}

bool
gfs_parse_long(const char *s, long min, long max, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return false;
	*out = v;
	return true;
}

static double
duration_unit_ms(const char *unit)
{
	static const struct { const char *name; double ms; } units[] = {
		{"", 1000}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"min", 60000}, {"h", 3600000},
	};
	for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
		if (strcmp(unit, units[i].name) == 0)
			return units[i].ms;
	return 0;
}

bool
gfs_parse_duration_ms(const char *s, long min_ms, long max_ms, long *out)
{
	/* strtod also reads "nan", "inf" and hex floats: only digits and a point may start a duration. */
	if ((*s < '0' || *s > '9') && *s != '.')
		return false;
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	double unit = duration_unit_ms(end);
	if (errno || end == s || unit == 0 || !isfinite(v))
		return false;
	double ms = v * unit + 0.5;
	if (ms < (double)min_ms || ms >= (double)max_ms + 1)
		return false;
	*out = (long)ms;
	return true;
}

bool
gfs_parse_size(const char *s, uint64_t *out)
{
	/* strtoull skips leading blanks and negates a '-', so " -5" would parse as 2^64-5. */
	if (*s < '0' || *s > '9')
		return false;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return false;
	uint64_t mult = 1;
	switch (*end) {
	case '\0': break;
	case 'k': case 'K': mult = 1ULL << 10; end++; break;
	case 'm': case 'M': mult = 1ULL << 20; end++; break;
	case 'g': case 'G': mult = 1ULL << 30; end++; break;
	case 't': case 'T': mult = 1ULL << 40; end++; break;
	default: return false;
	}
	if (*end == 'i' && mult > 1)
		end++;
	if ((*end == 'B' || *end == 'b') && end[1] == '\0')
		end++;
	if (*end || v > UINT64_MAX / mult)
		return false;
	*out = v * mult;
	return true;
}
