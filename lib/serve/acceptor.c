/* The accepting thread; see acceptor.h for why there is one. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "acceptor.h"
#include "../util.h"

/* Out of descriptors and no connection closing: look again this often. */
#define PAUSE_MS 250
/* Connections taken per wakeup before looking at the wake descriptor again. */
#define ACCEPT_BURST 64

struct acceptor {
	int listen_fd;
	int wake_fd;              /* eventfd: stop, or a descriptor was freed */
	acceptor_conn_fn on_conn;
	acceptor_limit_fn on_limit;
	void *ctx;
	pthread_t thread;
	atomic_bool paused;
	atomic_bool stop;
	bool joined;
};

int
acceptor_listen(const struct sockaddr_storage *addr, bool reuse_port, int backlog, gfs_error *err)
{
	int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		gfs_error_set(err, GFS_ELOCAL, "socket: %s", strerror(errno));
		return -1;
	}
	int one = 1;
	socklen_t len = addr->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
	                                             : sizeof(struct sockaddr_in);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (addr->ss_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
	if ((reuse_port && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) ||
	    bind(fd, (const struct sockaddr *)addr, len) != 0 || listen(fd, backlog) != 0) {
		gfs_error_set(err, GFS_ELOCAL, "%s", strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

static bool
out_of_resources(int e)
{
	return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM;
}

/* Takes what is waiting; false when accepting must pause. */
static bool
accept_burst(acceptor *a)
{
	for (int i = 0; i < ACCEPT_BURST; i++) {
		struct sockaddr_storage ss;
		socklen_t len = sizeof ss;
		int fd = accept4(a->listen_fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0) {
			a->on_conn(a->ctx, fd, (const struct sockaddr *)&ss, len);
			continue;
		}
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return true;
		if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO || errno == EPERM)
			continue; /* that client's trouble, not ours */
		if (out_of_resources(errno))
			a->on_limit(a->ctx, errno);
		return false; /* anything else would repeat at once: wait a little */
	}
	return true;
}

static void
drain_wake(acceptor *a)
{
	uint64_t n;
	while (read(a->wake_fd, &n, sizeof n) > 0)
		;
}

static void *
accept_main(void *arg)
{
	acceptor *a = arg;
	struct pollfd pfd[2] = {{.fd = a->wake_fd, .events = POLLIN},
	                        {.fd = a->listen_fd, .events = POLLIN}};
	while (!atomic_load(&a->stop)) {
		bool paused = atomic_load(&a->paused);
		int n = poll(pfd, paused ? 1 : 2, paused ? PAUSE_MS : -1);
		if (n < 0 && errno != EINTR) {
			/* Only a shortage (ENOMEM) gets here; leaving would stop accepting for good. */
			a->on_limit(a->ctx, errno);
			struct timespec backoff = {0, PAUSE_MS * 1000000L};
			nanosleep(&backoff, NULL);
			continue;
		}
		if (n > 0 && (pfd[0].revents & POLLIN))
			drain_wake(a);
		if (atomic_load(&a->stop))
			break;
		if (paused) {
			atomic_store(&a->paused, false); /* freed descriptor or pause over: try again */
			pfd[1].revents = POLLIN;
		}
		if (n >= 0 && (pfd[1].revents & (POLLIN | POLLERR | POLLHUP)) && !accept_burst(a))
			atomic_store(&a->paused, true);
		pfd[1].revents = 0;
	}
	return NULL;
}

acceptor *
acceptor_start(int listen_fd, acceptor_conn_fn on_conn, acceptor_limit_fn on_limit, void *ctx,
               gfs_error *err)
{
	/* An inherited socket may be blocking; accepting in bursts needs it not to be. */
	int fl = fcntl(listen_fd, F_GETFL);
	if (fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		gfs_error_set(err, GFS_ELOCAL, "listening socket (fd %d): %s", listen_fd, strerror(errno));
		return NULL;
	}
	acceptor *a = gfs_xcalloc(1, sizeof *a);
	a->listen_fd = listen_fd;
	a->on_conn = on_conn;
	a->on_limit = on_limit;
	a->ctx = ctx;
	a->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	int rc = a->wake_fd < 0 ? errno : pthread_create(&a->thread, NULL, accept_main, a);
	if (rc != 0) {
		gfs_error_set(err, GFS_ELOCAL, "cannot start the accepting thread: %s", strerror(rc));
		if (a->wake_fd >= 0)
			close(a->wake_fd);
		free(a);
		return NULL;
	}
	return a;
}

static void
wake(acceptor *a)
{
	uint64_t one = 1;
	while (write(a->wake_fd, &one, sizeof one) < 0 && errno == EINTR)
		;
}

void
acceptor_resume(acceptor *a)
{
	if (a && atomic_load_explicit(&a->paused, memory_order_relaxed))
		wake(a);
}

void
acceptor_stop(acceptor *a)
{
	if (!a || a->joined)
		return;
	atomic_store(&a->stop, true);
	wake(a);
	pthread_join(a->thread, NULL);
	a->joined = true;
	atomic_store(&a->paused, false); /* acceptor_resume does nothing from now on */
}

/*
 * A listening socket's queue dies with it: the kernel resets every
 * connection still in it, and with SO_REUSEPORT the queue holds
 * connections the kernel chose this socket for, which no other server can
 * take. So the queue is emptied into on_conn first; what arrives between
 * the last accept and the close is the caller's to document.
 */
void
acceptor_drain(acceptor *a, int max)
{
	if (!a)
		return;
	acceptor_stop(a);
	for (int i = 0; i < max; i++) {
		struct sockaddr_storage ss;
		socklen_t len = sizeof ss;
		int fd = accept4(a->listen_fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0)
			a->on_conn(a->ctx, fd, (const struct sockaddr *)&ss, len);
		else if (errno != EINTR && errno != ECONNABORTED && errno != EPROTO && errno != EPERM)
			return; /* EAGAIN: empty; anything else would not get better by trying again */
	}
}

void
acceptor_free(acceptor *a)
{
	if (!a)
		return;
	acceptor_stop(a);
	close(a->wake_fd);
	free(a);
}
