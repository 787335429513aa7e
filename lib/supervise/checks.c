/*
 * Checks on a running instance, each driven by a deadline of its own in
 * struct instance (loop.c's deadline table calls it when due):
 *
 *   health       a mongodb:// ping or an http:// GET, in a forked checker
 *                process with a deadline, so a hanging server never blocks
 *                the loop; health_retries failures in a row stop the
 *                instance for the restart policy. Within startsecs a
 *                failure is "not ready yet", not a failure.
 *   descriptors  /proc samples of the instance's open descriptors against
 *                its RLIMIT_NOFILE, with a trend (fdwatch.c decides): raise
 *                the soft limit live, warn, or restart before it runs out.
 *
 * A new check is a deadline field in struct instance, armed in
 * sv_arm_watches (spawn.c), a row in loop.c's deadline table, and its
 * function here; a verdict that needs a restart calls sv_stop_instance
 * with AFTER_POLICY, so the restart budget applies to it as to a crash.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <bson/bson.h>

#include "../addr.h"
#include "../gfs.h"
#include "internal.h"

static bool
check_mongodb(const char *url, int timeout_ms, char *msg, size_t len)
{
	char *u = gfs_xmalloc(strlen(url) + 128);
	strcpy(u, url);
	const char *after_scheme = strstr(u, "://") + 3;
	bool has_q = strchr(after_scheme, '?') != NULL;
	bool has_path = strchr(after_scheme, '/') != NULL;
	/* The driver's timeouts, not our SIGKILL, should end a check that gets no answer. */
	if (!has_path)
		strcat(u, "/");
	if (!strcasestr(u, "serverSelectionTimeoutMS")) {
		sprintf(u + strlen(u), "%sserverSelectionTimeoutMS=%d", has_q ? "&" : "?", timeout_ms);
		has_q = true;
	}
	if (!strcasestr(u, "connectTimeoutMS"))
		sprintf(u + strlen(u), "%sconnectTimeoutMS=%d", has_q ? "&" : "?", timeout_ms);
	gfs_error err;
	gfs_conn *conn = gfs_conn_open(u, NULL, NULL, &err);
	free(u);
	bool ok = conn && gfs_conn_ping(conn, &err);
	if (!ok)
		snprintf(msg, len, "%.380s", err.msg);
	gfs_conn_close(conn);
	return ok;
}

static bool
check_http(const char *url, int timeout_ms, char *msg, size_t len)
{
	const char *hp = url + 7;
	const char *path = strchr(hp, '/');
	char h[256], port[8];
	unsigned pn;
	if (!gfs_hostport_parse(hp, 80, h, sizeof h, &pn, msg, len))
		return false; /* checked when the config was read */
	snprintf(port, sizeof port, "%u", pn);
	int hl = (int)(path ? (size_t)(path - hp) : strlen(hp));
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
	int rc = getaddrinfo(h, port, &hints, &res);
	if (rc != 0) {
		snprintf(msg, len, "%s: %s", h, gai_strerror(rc));
		return false;
	}
	int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
	if (fd >= 0) {
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	}
	if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
		snprintf(msg, len, "connect %s:%s: %s", h, port, strerror(errno));
		freeaddrinfo(res);
		if (fd >= 0)
			close(fd);
		return false;
	}
	freeaddrinfo(res);
	char req[1024];
	int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %.*s\r\nConnection: close\r\n\r\n",
	                 path ? path : "/", hl, hp);
	if (n < 0 || (size_t)n >= sizeof req || send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
		snprintf(msg, len, "send: %s", strerror(errno));
		close(fd);
		return false;
	}
	char resp[256];
	size_t got = 0;
	while (got < sizeof resp - 1 && !memchr(resp, '\n', got)) {
		ssize_t r = read(fd, resp + got, sizeof resp - 1 - got);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	resp[got] = '\0';
	resp[strcspn(resp, "\r\n")] = '\0';
	int code = 0;
	/* Only the status line matters: "HTTP/1.x NNN reason". */
	if (sscanf(resp, "HTTP/%*d.%*d %d", &code) != 1) {
		snprintf(msg, len, "no HTTP status line (got %zu bytes)", got);
		return false;
	}
	if (code < 200 || code > 299) {
		snprintf(msg, len, "%s", resp);
		return false;
	}
	return true;
}

/*
 * A checker inherits our stderr as the caller's blocking descriptor, not
 * the relay's: a driver warning written there while nobody reads it would
 * hold the check until its deadline and fail a healthy program. Its answer
 * goes through its pipe, so it says nothing anywhere else.
 */
static void
checker_quiet(void)
{
	int fd = open("/dev/null", O_WRONLY);
	if (fd < 0)
		return;
	dup2(fd, STDOUT_FILENO);
	dup2(fd, STDERR_FILENO);
	if (fd > STDERR_FILENO)
		close(fd);
}

void
sv_start_check(struct instance *in)
{
	struct sv *s = in->sv;
	const struct sv_program *c = &in->prog->cfg;
	in->t_health = gfs_mono_seconds() + c->health_interval_ms / 1000.0;
	if (in->checker > 0)
		return; /* the last one is still running: its deadline handles it */
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC) != 0) {
		sv_self_fd_note(s, "health check pipe");
		return;
	}
	pid_t pid = fork();
	if (pid < 0) {
		close(pfd[0]);
		close(pfd[1]);
		return;
	}
	if (pid == 0) {
		close(pfd[0]);
		checker_quiet();
		char msg[400] = "";
		bool ok = strncmp(c->health, "http://", 7) == 0
		              ? check_http(c->health, c->health_timeout_ms, msg, sizeof msg)
		              : check_mongodb(c->health, c->health_timeout_ms, msg, sizeof msg);
		if (!ok)
			(void)!write(pfd[1], msg, strlen(msg));
		_exit(ok ? 0 : 1);
	}
	close(pfd[1]);
	in->checker = pid;
	in->checker_pipe = pfd[0];
	in->checker_pidfd = sv_pidfd_open(pid);
	if (in->checker_pidfd >= 0)
		sv_ep_add(s, in->checker_pidfd, &in->w_chk, W_CHECKER, in);
	in->t_check_deadline = gfs_mono_seconds() + c->health_timeout_ms / 1000.0;
}

void
sv_on_checker_exit(struct instance *in, int status)
{
	struct sv *s = in->sv;
	const struct sv_program *c = &in->prog->cfg;
	char msg[400] = "";
	if (in->checker_pipe >= 0) {
		fcntl(in->checker_pipe, F_SETFL, O_NONBLOCK);
		ssize_t n = read(in->checker_pipe, msg, sizeof msg - 1);
		msg[n > 0 ? n : 0] = '\0';
		close(in->checker_pipe);
		in->checker_pipe = -1;
	}
	sv_ep_close(s, &in->checker_pidfd);
	in->checker = 0;
	bool timed_out = in->t_check_deadline < 0;
	in->t_check_deadline = 0;
	if (!sv_states[in->state].up)
		return;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		if (in->health != 1) {
			char *shown = gfs_uri_redact(c->health); /* never a password in the log */
			sv_event(s, "%s: healthy%s (%s)", in->name, in->health_failures ? " again" : "", shown);
			bson_free(shown);
		}
		in->health = 1;
		in->health_failures = 0;
		return;
	}
	if (timed_out)
		snprintf(msg, sizeof msg, "no answer within %.1f s", c->health_timeout_ms / 1000.0);
	else if (!*msg)
		sv_describe_status(status, msg, sizeof msg);
	snprintf(in->health_msg, sizeof in->health_msg, "%.380s", msg);
	if (in->state == ST_STARTING && in->health != 1) {
		/* Still within startsecs and never healthy yet: not ready is not failing. */
		sv_event(s, "%s: not ready yet: %s", in->name, msg);
		return;
	}
	in->health = 0;
	in->health_failures++;
	sv_event(s, "%s: health check failed (%d of %d): %s", in->name, in->health_failures,
	         c->health_retries, msg);
	if (in->health_failures >= c->health_retries)
		sv_stop_instance(in, AFTER_POLICY, "health check failed");
}

void
sv_sample_fds(struct instance *in)
{
	struct sv *s = in->sv;
	const struct sv_program *c = &in->prog->cfg;
	double t = gfs_mono_seconds();
	in->t_fd = t + c->fd_interval_ms / 1000.0;
	struct fdw_counts fc;
	long soft, hard;
	if (!fdw_count(in->pid, &fc) || !fdw_limits(in->pid, &soft, &hard))
		return;
	in->fds = fc;
	in->fd_soft = soft;
	in->fd_hard = hard;
	fdw_trend_add(&in->trend, t, fc.total);
	double slope = fdw_trend_slope(&in->trend), eta;
	struct fdw_policy pol = {c->fd_threshold_pct, c->fd_horizon_s, c->fd_raise};
	enum fdw_action act = fdw_decide(fc.total, soft, hard, slope, &pol, &eta);
	if (act == FDW_OK) {
		in->fd_warned = false;
		return;
	}
	char what[300], etas[64] = "";
	if (eta >= 0)
		snprintf(etas, sizeof etas, ", limit reached in ~%.0f s", eta);
	snprintf(what, sizeof what, "%ld of %ld descriptors open (sockets %ld, files %ld, pipes %ld, "
	         "other %ld), trend %+.1f/s%s", fc.total, soft, fc.sockets, fc.files, fc.pipes,
	         fc.other, slope, etas);
	if (act == FDW_RAISE) {
		long target = fdw_raise_target(soft, hard);
		char err[200];
		if (fdw_set_soft(in->pid, target, err, sizeof err)) {
			in->fd_soft = target;
			fdw_trend_reset(&in->trend); /* judge the new limit on fresh samples */
			sv_event(s, "%s: %s: raised its soft limit live %ld -> %ld (hard %ld)", in->name, what,
			         soft, target, hard);
		} else {
			sv_event(s, "%s: %s: cannot raise its limit: %s", in->name, what, err);
		}
		return;
	}
	if (act == FDW_WARN) {
		if (!in->fd_warned)
			sv_event(s, "%s: %s; at its hard limit, nothing left to raise", in->name, what);
		in->fd_warned = true;
		return;
	}
	sv_event(s, "%s: %s; at its hard limit and still climbing: restarting", in->name, what);
	in->emfile_cause = true;
	sv_stop_instance(in, AFTER_POLICY, "descriptors exhausted");
}
