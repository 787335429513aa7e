/*
 * The control socket: a Unix stream socket, mode 0600 in a directory of
 * ours alone, that "gridfsctl supervise status|restart|reload|stop" talks
 * to (sv_control_request is that client). A request is one line; the
 * answer one JSON document, after which the supervisor closes the
 * connection ("stop" is answered only once everything has stopped). The
 * requests are the table below. When we run out of descriptors, accepting
 * pauses for ACCEPT_PAUSE_S instead of spinning on a readable socket.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <bson/bson.h>

#include "../util.h"
#include "internal.h"

/* How long the control socket goes unwatched when we have no descriptor to accept with. */
#define ACCEPT_PAUSE_S 1.0

char *
sv_default_control_path(void)
{
	char buf[4096];
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	if (xdg && *xdg)
		snprintf(buf, sizeof buf, "%s/gridfsctl-supervise.sock", xdg);
	else if (geteuid() == 0)
		snprintf(buf, sizeof buf, "/run/gridfsctl/supervise.sock");
	else
		snprintf(buf, sizeof buf, "/tmp/gridfsctl-%u/supervise.sock", (unsigned)geteuid());
	return gfs_xstrdup(buf);
}

static bool
fill_sockaddr(struct sockaddr_un *sa, const char *path, char *err, size_t errlen)
{
	memset(sa, 0, sizeof *sa);
	sa->sun_family = AF_UNIX;
	if (strlen(path) >= sizeof sa->sun_path) {
		snprintf(err, errlen, "control socket path too long: %s", path);
		return false;
	}
	strcpy(sa->sun_path, path);
	return true;
}

static bool
dir_is_private(const char *dir, char *err, size_t errlen)
{
	struct stat st;
	if (lstat(dir, &st) != 0) {
		snprintf(err, errlen, "control socket directory %s: %s", dir, strerror(errno));
		return false;
	}
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 07777) != 0700) {
		snprintf(err, errlen, "control socket directory %s is not a directory of uid %u with "
		         "mode 0700 (%s, uid %u, mode %04o): refusing to use it; remove it or pass "
		         "--control", dir, (unsigned)geteuid(), S_ISDIR(st.st_mode) ? "directory"
		         : S_ISLNK(st.st_mode) ? "symlink" : "not a directory", (unsigned)st.st_uid,
		         (unsigned)(st.st_mode & 07777));
		return false;
	}
	return true;
}

/*
 * Creates the socket's directory owner-only. The default one (in /tmp, or
 * $XDG_RUNTIME_DIR) must also be ours alone when it exists already:
 * another user could have made it first and would see, or swap, our socket.
 */
static bool
make_parent_dir(const char *path, bool must_be_private, char *err, size_t errlen)
{
	char *dir = gfs_xstrdup(path);
	char *slash = strrchr(dir, '/');
	bool ok = true;
	if (slash && slash != dir) {
		*slash = '\0';
		mkdir(dir, 0700);
		if (must_be_private)
			ok = dir_is_private(dir, err, errlen);
	}
	free(dir);
	return ok;
}

int
sv_bind_control(const char *path, bool is_default, bool *busy, char *err, size_t errlen)
{
	struct sockaddr_un sa;
	*busy = false;
	if (!fill_sockaddr(&sa, path, err, errlen))
		return -1;
	if (!make_parent_dir(path, is_default, err, errlen))
		return -1;
	int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof sa) == 0) {
		close(probe);
		*busy = true;
		snprintf(err, errlen, "another supervisor answers on %s", path);
		return -1;
	}
	if (probe >= 0)
		close(probe);
	unlink(path); /* stale: nobody answers */
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -1;
	}
	mode_t old = umask(077);
	int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
	umask(old);
	if (rc != 0 || chmod(path, 0600) != 0 || listen(fd, 16) != 0) {
		snprintf(err, errlen, "control socket %s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

char *
sv_control_request(const char *path, const char *request, int timeout_ms, char *err, size_t errlen)
{
	struct sockaddr_un sa;
	if (!fill_sockaddr(&sa, path, err, errlen))
		return NULL;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return NULL;
	}
	struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		snprintf(err, errlen, "no supervisor on %s: %s", path, strerror(errno));
		close(fd);
		return NULL;
	}
	size_t rlen = strlen(request);
	char *msg = gfs_xmalloc(rlen + 2);
	memcpy(msg, request, rlen);
	msg[rlen] = '\n';
	bool sent = send(fd, msg, rlen + 1, MSG_NOSIGNAL) == (ssize_t)(rlen + 1);
	free(msg);
	if (!sent) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		close(fd);
		return NULL;
	}
	shutdown(fd, SHUT_WR);
	size_t len = 0, cap = 4096;
	char *buf = gfs_xmalloc(cap);
	for (;;) {
		if (len + 1024 > cap) {
			cap *= 2;
			buf = gfs_xreallocarray(buf, cap, 1);
		}
		ssize_t n = read(fd, buf + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			snprintf(err, errlen, "%s: %s", path,
			         errno == EAGAIN ? "no answer in time" : strerror(errno));
			free(buf);
			close(fd);
			return NULL;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = '\0';
	if (len == 0) {
		snprintf(err, errlen, "%s: empty answer", path);
		free(buf);
		return NULL;
	}
	return buf;
}

static void
append_instance(bson_t *arr, const char *key, const struct instance *in, double t)
{
	const struct sv_program *c = &in->prog->cfg;
	bson_t d;
	bson_append_document_begin(arr, key, -1, &d);
	BSON_APPEND_UTF8(&d, "name", in->name);
	BSON_APPEND_UTF8(&d, "program", c->name);
	BSON_APPEND_UTF8(&d, "state", sv_states[in->state].name);
	BSON_APPEND_INT32(&d, "pid", sv_alive(in) ? in->pid : 0);
	BSON_APPEND_INT32(&d, "restarts", (int32_t)in->restarts);
	/* Integers: libbson prints doubles with 20 digits. */
	BSON_APPEND_INT64(&d, "uptimeMs", sv_alive(in) ? (int64_t)((t - in->started_at) * 1000) : 0);
	if (*in->last_exit)
		BSON_APPEND_UTF8(&d, "lastExit", in->last_exit);
	if (c->health)
		BSON_APPEND_UTF8(&d, "health", in->health == 1 ? "ok" : in->health == 0 ? "failing"
		                                                                        : "unknown");
	if (in->health == 0)
		BSON_APPEND_UTF8(&d, "healthError", in->health_msg);
	if (sv_alive(in) && in->fd_soft != 0) {
		bson_t f;
		BSON_APPEND_DOCUMENT_BEGIN(&d, "fds", &f);
		BSON_APPEND_INT64(&f, "open", in->fds.total);
		BSON_APPEND_INT64(&f, "limit", in->fd_soft);
		BSON_APPEND_INT64(&f, "hardLimit", in->fd_hard);
		BSON_APPEND_INT64(&f, "sockets", in->fds.sockets);
		BSON_APPEND_INT64(&f, "files", in->fds.files);
		BSON_APPEND_INT64(&f, "pipes", in->fds.pipes);
		BSON_APPEND_INT64(&f, "other", in->fds.other);
		BSON_APPEND_INT64(&f, "trendPerMin", (int64_t)(fdw_trend_slope(&in->trend) * 60));
		bson_append_document_end(&d, &f);
	}
	bson_append_document_end(arr, &d);
}

static char *
status_json(struct sv *s)
{
	bson_t doc = BSON_INITIALIZER, arr;
	BSON_APPEND_BOOL(&doc, "ok", true);
	BSON_APPEND_INT32(&doc, "pid", getpid());
	BSON_APPEND_ARRAY_BEGIN(&doc, "instances", &arr);
	double t = gfs_mono_seconds();
	int k = 0;
	for (struct program *p = s->progs; p; p = p->next)
		for (int i = 0; i < p->ninst; i++) {
			char key[16];
			snprintf(key, sizeof key, "%d", k++);
			append_instance(&arr, key, &p->inst[i], t);
		}
	bson_append_array_end(&doc, &arr);
	char *json = bson_as_relaxed_extended_json(&doc, NULL);
	bson_destroy(&doc);
	return json;
}

static char *
reply_json(bool ok, const char *msg)
{
	bson_t doc = BSON_INITIALIZER;
	BSON_APPEND_BOOL(&doc, "ok", ok);
	BSON_APPEND_UTF8(&doc, ok ? "message" : "error", msg);
	char *json = bson_as_relaxed_extended_json(&doc, NULL);
	bson_destroy(&doc);
	return json;
}

static void
client_close(struct sv *s, struct client *cl)
{
	struct client **pp = &s->clients;
	while (*pp && *pp != cl)
		pp = &(*pp)->next;
	if (*pp)
		*pp = cl->next;
	sv_ep_close(s, &cl->fd);
	free(cl);
}

static void
client_send(struct client *cl, char *json)
{
	/* Replies are small; a client that stops reading gets cut off by the send timeout. */
	int flags = fcntl(cl->fd, F_GETFL);
	fcntl(cl->fd, F_SETFL, flags & ~O_NONBLOCK);
	struct timeval tv = {1, 0};
	setsockopt(cl->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	size_t len = strlen(json);
	json[len] = '\n';
	(void)!send(cl->fd, json, len + 1, MSG_NOSIGNAL);
	json[len] = '\0';
	bson_free(json);
}

static bool
req_status(struct sv *s, struct client *cl, const char *arg)
{
	client_send(cl, status_json(s));
	return true;
}

static bool
req_restart(struct sv *s, struct client *cl, const char *name)
{
	char msg[300];
	bool ok = sv_restart_named(s, name, msg, sizeof msg);
	client_send(cl, reply_json(ok, msg));
	return true;
}

static bool
req_reload(struct sv *s, struct client *cl, const char *arg)
{
	sv_reload(s);
	client_send(cl, reply_json(true, "reloaded"));
	return true;
}

/* Answered when everything has stopped (sv_clients_stopped), so the client can wait for that. */
static bool
req_stop(struct sv *s, struct client *cl, const char *arg)
{
	sv_stop_all(s, "stop requested");
	cl->waiting_stop = true;
	epoll_ctl(s->epfd, EPOLL_CTL_DEL, cl->fd, NULL);
	return false;
}

/* The requests a client may send, one line each: a word, and for some an argument after a space. */
static const struct request {
	const char *word;
	bool arg;
	/* Answers; false keeps the client open for a later answer. */
	bool (*handle)(struct sv *s, struct client *cl, const char *arg);
} requests[] = {
	{"status", false, req_status},
	{"restart", true, req_restart},
	{"reload", false, req_reload},
	{"stop", false, req_stop},
};

static const struct request *
find_request(const char *req, const char **arg)
{
	for (size_t i = 0; i < sizeof requests / sizeof requests[0]; i++) {
		const struct request *r = &requests[i];
		size_t n = strlen(r->word);
		if (strncmp(req, r->word, n) != 0 || req[n] != (r->arg ? ' ' : '\0'))
			continue;
		*arg = r->arg ? req + n + 1 : NULL;
		return r;
	}
	return NULL;
}

static void
client_request(struct sv *s, struct client *cl, char *req)
{
	const char *arg;
	const struct request *r = find_request(req, &arg);
	if (r && !r->handle(s, cl, arg))
		return;
	if (!r) {
		char msg[300];
		snprintf(msg, sizeof msg, "unknown request '%.100s'", req);
		client_send(cl, reply_json(false, msg));
	}
	client_close(s, cl);
}

void
sv_on_client(struct sv *s, struct client *cl)
{
	ssize_t n = read(cl->fd, cl->buf + cl->len, sizeof cl->buf - 1 - cl->len);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0 && cl->len == 0) {
		client_close(s, cl);
		return;
	}
	if (n > 0)
		cl->len += (size_t)n;
	cl->buf[cl->len] = '\0';
	char *nl = strchr(cl->buf, '\n');
	if (!nl && n > 0 && cl->len < sizeof cl->buf - 1)
		return;
	if (nl)
		*nl = '\0';
	client_request(s, cl, cl->buf);
}

void
sv_on_accept(struct sv *s)
{
	int fd = accept4(s->ctlfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
		/* The connection stays queued and the socket readable: pause, or we would spin. */
		sv_self_fd_note(s, "control connection");
		epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->ctlfd, NULL);
		s->t_accept = gfs_mono_seconds() + ACCEPT_PAUSE_S;
		return;
	}
	if (fd < 0)
		return; /* gone before we got to it (ECONNABORTED, EAGAIN) */
	struct client *cl = gfs_xcalloc(1, sizeof *cl);
	cl->sv = s;
	cl->fd = fd;
	cl->next = s->clients;
	s->clients = cl;
	sv_ep_add(s, fd, &cl->w, W_CLIENT, cl);
}

/*
 * Everything has stopped: the clients that asked for a stop are answered
 * and let go (they read to the end), and the socket closed, so that
 * neither a stop nor a new supervisor on this path waits for our exit,
 * which may still give a slow reader of our output its second.
 */
void
sv_clients_stopped(struct sv *s)
{
	struct client *next;
	for (struct client *cl = s->clients; cl; cl = next) {
		next = cl->next;
		if (!cl->waiting_stop)
			continue;
		client_send(cl, reply_json(true, "stopped"));
		client_close(s, cl);
	}
	sv_control_close(s);
}

void
sv_control_close(struct sv *s)
{
	if (s->ctlfd < 0)
		return;
	sv_ep_close(s, &s->ctlfd);
	if (s->control_path)
		unlink(s->control_path);
}

void
sv_clients_free(struct sv *s)
{
	while (s->clients)
		client_close(s, s->clients);
}
