/* Sampling /proc/PID/fd and deciding when descriptor use needs action. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "fdwatch.h"

bool
fdw_count(pid_t pid, struct fdw_counts *out)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	if (!d)
		return false;
	memset(out, 0, sizeof *out);
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		char target[256];
		ssize_t n = readlinkat(dirfd(d), e->d_name, target, sizeof target - 1);
		out->total++;
		if (n < 0) {
			out->other++;
			continue;
		}
		target[n] = '\0';
		if (strncmp(target, "socket:", 7) == 0)
			out->sockets++;
		else if (strncmp(target, "pipe:", 5) == 0)
			out->pipes++;
		else if (target[0] == '/')
			out->files++;
		else
			out->other++;
	}
	closedir(d);
	return true;
}

static long
parse_limit_word(const char *s, const char **end)
{
	while (*s == ' ')
		s++;
	if (strncmp(s, "unlimited", 9) == 0) {
		*end = s + 9;
		return -1;
	}
	char *e;
	long v = strtol(s, &e, 10);
	*end = e == s ? NULL : e;
	return v;
}

bool
fdw_parse_limits(const char *text, long *soft, long *hard)
{
	const char *line = strstr(text, "Max open files");
	if (!line)
		return false;
	const char *p = line + strlen("Max open files"), *end;
	*soft = parse_limit_word(p, &end);
	if (!end)
		return false;
	*hard = parse_limit_word(end, &end);
	return end != NULL;
}

bool
fdw_limits(pid_t pid, long *soft, long *hard)
{
	char path[64], buf[4096];
	snprintf(path, sizeof path, "/proc/%d/limits", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	return fdw_parse_limits(buf, soft, hard);
}

bool
fdw_set_soft(pid_t pid, long soft, char *err, size_t errlen)
{
	struct rlimit old, want;
	if (prlimit(pid, RLIMIT_NOFILE, NULL, &old) != 0) {
		snprintf(err, errlen, "prlimit: %s", strerror(errno));
		return false;
	}
	want.rlim_cur = (rlim_t)soft;
	want.rlim_max = old.rlim_max;
	if (prlimit(pid, RLIMIT_NOFILE, &want, NULL) != 0) {
		snprintf(err, errlen, "prlimit: %s", strerror(errno));
		return false;
	}
	return true;
}

void
fdw_trend_reset(struct fdw_trend *tr)
{
	memset(tr, 0, sizeof *tr);
}

void
fdw_trend_add(struct fdw_trend *tr, double t_s, long count)
{
	tr->t[tr->head] = t_s;
	tr->n[tr->head] = count;
	tr->head = (tr->head + 1) % FDW_WINDOW;
	if (tr->len < FDW_WINDOW)
		tr->len++;
}

double
fdw_trend_slope(const struct fdw_trend *tr)
{
	if (tr->len < 3)
		return 0;
	size_t first = (tr->head + FDW_WINDOW - tr->len) % FDW_WINDOW;
	double t0 = tr->t[first], st = 0, sn = 0, stt = 0, stn = 0;
	for (size_t i = 0; i < tr->len; i++) {
		size_t k = (first + i) % FDW_WINDOW;
		double t = tr->t[k] - t0, n = (double)tr->n[k];
		st += t;
		sn += n;
		stt += t * t;
		stn += t * n;
	}
	double len = (double)tr->len, den = len * stt - st * st;
	if (den <= 0)
		return 0;
	return (len * stn - st * sn) / den;
}

long
fdw_raise_target(long soft, long hard)
{
	long cap = hard < 0 ? 1L << 20 : hard;
	long want = soft < 32 ? 64 : soft * 2;
	return want > cap ? cap : want;
}

enum fdw_action
fdw_decide(long count, long soft, long hard, double slope, const struct fdw_policy *pol,
           double *eta_s)
{
	*eta_s = -1;
	if (soft < 0)
		return FDW_OK;
	bool pressure = (double)count * 100.0 >= (double)soft * pol->threshold_pct;
	bool rising = false;
	if (slope > 0.01) {
		*eta_s = count >= soft ? 0 : (double)(soft - count) / slope;
		rising = *eta_s <= pol->horizon_s;
	}
	if (!pressure && !rising)
		return FDW_OK;
	bool can_raise = pol->raise && (hard < 0 || soft < hard) && fdw_raise_target(soft, hard) > soft;
	if (can_raise)
		return FDW_RAISE;
	/* Full, or nearly full and still climbing: opens are failing or about to. */
	if (count >= soft || (pressure && slope > 0.01))
		return FDW_RESTART;
	return FDW_WARN;
}
