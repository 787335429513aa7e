/* The accepting thread: hands connections over, pauses without descriptors, resumes. */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../lib/serve/acceptor.h"

struct seen {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int conns;
	int limits;
	int last_err;
};

static void
on_conn(void *ctx, int fd, const struct sockaddr *addr, socklen_t len)
{
	struct seen *s = ctx;
	assert_true(len > 0 && addr->sa_family == AF_INET);
	close(fd);
	pthread_mutex_lock(&s->mu);
	s->conns++;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

static void
on_limit(void *ctx, int err)
{
	struct seen *s = ctx;
	pthread_mutex_lock(&s->mu);
	s->limits++;
	s->last_err = err;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/* Waits until *counter reaches want, 10 s at most; returns its value. */
static int
wait_count(struct seen *s, int *counter, int want)
{
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 10;
	pthread_mutex_lock(&s->mu);
	while (*counter < want && pthread_cond_timedwait(&s->cv, &s->mu, &dl) == 0)
		;
	int n = *counter;
	pthread_mutex_unlock(&s->mu);
	return n;
}

static int
listen_any(unsigned *port)
{
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof ss);
	struct sockaddr_in *in = (struct sockaddr_in *)&ss;
	in->sin_family = AF_INET;
	in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	gfs_error err;
	gfs_error_clear(&err);
	int fd = acceptor_listen(&ss, true, 16, &err);
	assert_true(fd >= 0);
	socklen_t len = sizeof ss;
	assert_int_equal(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
	*port = ntohs(in->sin_port);
	return fd;
}

static int
connect_to(unsigned port, int sock)
{
	struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	return connect(sock, (struct sockaddr *)&in, sizeof in);
}

/* An acceptor on a new listening socket of any port. */
static acceptor *
start_any(struct seen *s, unsigned *port, int *lfd)
{
	*lfd = listen_any(port);
	gfs_error err;
	gfs_error_clear(&err);
	acceptor *a = acceptor_start(*lfd, on_conn, on_limit, s, &err);
	assert_non_null(a);
	return a;
}

static void
test_hands_over_every_connection(void **state)
{
	(void)state;
	struct seen s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};
	unsigned port;
	int lfd;
	acceptor *a = start_any(&s, &port, &lfd);
	int clients[5];
	for (int i = 0; i < 5; i++) {
		clients[i] = socket(AF_INET, SOCK_STREAM, 0);
		assert_int_equal(connect_to(port, clients[i]), 0);
	}
	assert_int_equal(wait_count(&s, &s.conns, 5), 5);
	assert_int_equal(s.limits, 0);
	acceptor_resume(a); /* not paused: nothing happens */
	acceptor_stop(a);
	acceptor_stop(a);   /* twice is harmless */
	acceptor_resume(a); /* and so is a late resume */
	acceptor_free(a);
	for (int i = 0; i < 5; i++)
		close(clients[i]);
	close(lfd);
}

/* What the kernel queued after the thread stopped is handed over too, up to the limit given. */
static void
test_drain_takes_the_queue(void **state)
{
	(void)state;
	struct seen s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};
	unsigned port;
	int lfd;
	acceptor *a = start_any(&s, &port, &lfd);
	acceptor_stop(a);
	int clients[6];
	for (int i = 0; i < 6; i++) {
		clients[i] = socket(AF_INET, SOCK_STREAM, 0);
		assert_int_equal(connect_to(port, clients[i]), 0); /* queued: nobody accepts */
	}
	acceptor_drain(a, 4);
	assert_int_equal(s.conns, 4);
	acceptor_drain(a, 100);
	assert_int_equal(s.conns, 6);
	acceptor_drain(a, 100); /* empty: returns at once */
	assert_int_equal(s.conns, 6);
	acceptor_free(a);
	for (int i = 0; i < 6; i++)
		close(clients[i]);
	close(lfd);
}

/* In a child process, since it lowers the descriptor limit. */
static int
out_of_descriptors_child(void)
{
	struct seen s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};
	unsigned port;
	int lfd = listen_any(&port);
	int client = socket(AF_INET, SOCK_STREAM, 0);
	gfs_error err;
	gfs_error_clear(&err);
	acceptor *a = acceptor_start(lfd, on_conn, on_limit, &s, &err);
	if (!a || client < 0)
		return 1;
	struct rlimit old, none;
	getrlimit(RLIMIT_NOFILE, &old);
	int spare = dup(0);
	none.rlim_cur = (rlim_t)spare; /* every descriptor below the spare one is taken */
	none.rlim_max = old.rlim_max;
	close(spare);
	/* The lowest free descriptor is now the spare one, which the limit forbids. */
	if (setrlimit(RLIMIT_NOFILE, &none) != 0)
		return 2;
	if (connect_to(port, client) != 0)
		return 3;
	if (wait_count(&s, &s.limits, 1) < 1 || s.last_err != EMFILE || s.conns != 0)
		return 4;
	setrlimit(RLIMIT_NOFILE, &old);
	acceptor_resume(a);
	if (wait_count(&s, &s.conns, 1) != 1)
		return 5;
	acceptor_free(a);
	close(client);
	close(lfd);
	return 0;
}

static void
test_pauses_out_of_descriptors_then_resumes(void **state)
{
	(void)state;
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(out_of_descriptors_child());
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hands_over_every_connection),
		cmocka_unit_test(test_drain_takes_the_queue),
		cmocka_unit_test(test_pauses_out_of_descriptors_then_resumes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
