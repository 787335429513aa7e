/*
 * The event loop. One thread, one epoll set, no polling sleeps: every
 * source is a descriptor (signalfd, pidfds, output pipes, the timerfd, the
 * control socket and its clients, relays waiting for their reader), and a
 * struct watch in the epoll data says which part handles it (the handler
 * table below). Time is one timerfd armed at the earliest deadline of all
 * instances; the deadline table says which field of struct instance is a
 * deadline and what happens when it falls due, so arming and firing never
 * disagree. A new periodic job is a deadline field and a row there.
 * systemd hears from here too (sdnotify.h): READY once every program has
 * been started, WATCHDOG=1 from the same timer (STOPPING from sv_stop_all).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "../sdnotify.h"
#include "../util.h"
#include "internal.h"

/* How long an exiting supervisor gives its readers to take what is held. */
#define EXIT_DRAIN_S 1.0

void
sv_event(struct sv *s, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (s->cb.event)
		s->cb.event(s->cb.ctx, line);
	sv_relay_event(s, line);
}

/* systemd's Type=notify (sdnotify.h): a failure is an event, never fatal. */
void
sv_notify(struct sv *s, const char *state)
{
	if (gfs_sd_notify(state) < 0)
		sv_event(s, "NOTIFY_SOCKET %s: %s", gfs_sd_notify_socket(), strerror(errno));
}

void
sv_ep_add(struct sv *s, int fd, struct watch *w, enum wkind kind, void *ptr)
{
	w->kind = kind;
	w->ptr = ptr;
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = w};
	if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
		sv_event(s, "epoll_ctl: %s", strerror(errno));
}

void
sv_ep_close(struct sv *s, int *fd)
{
	if (*fd < 0)
		return;
	epoll_ctl(s->epfd, EPOLL_CTL_DEL, *fd, NULL);
	close(*fd);
	*fd = -1;
}

/* Counts our own descriptors, to say so when the supervisor itself runs out. */
void
sv_self_fd_note(struct sv *s, const char *what)
{
	if (errno != EMFILE && errno != ENFILE)
		return;
	struct fdw_counts c = {0};
	long soft = -1, hard = -1;
	if (fdw_count(getpid(), &c))
		fdw_limits(getpid(), &soft, &hard);
	sv_event(s, "the supervisor itself is out of descriptors (%s: %ld open, limit %ld): raise its "
	         "own limit (LimitNOFILE= in the unit, ulimit -n)", what, c.total, soft);
}

static void
consider(double *earliest, double t)
{
	if (t > 0 && (*earliest == 0 || t < *earliest))
		*earliest = t;
}

/* ---- deadlines ---------------------------------------------------------- */

/* A grace period ran out: the group gets SIGKILL. */
static void
kill_due(struct instance *in)
{
	if (!sv_alive(in))
		return;
	sv_event(in->sv, "%s: pid %d did not stop within %.1f s: sending SIGKILL", in->name,
	         (int)in->pid, in->prog->cfg.stop_grace_ms / 1000.0);
	sv_signal_group(in, SIGKILL);
}

static void
group_kill_due(struct instance *in)
{
	if (in->leftover_pgid > 0)
		sv_kill_leftovers(in);
}

/* The backoff is over. */
static void
start_due(struct instance *in)
{
	if (in->state == ST_BACKOFF)
		sv_start_instance(in);
}

/* Up for startsecs: started, and a rolling restart may go on to the next instance. */
static void
running_due(struct instance *in)
{
	if (in->state != ST_STARTING)
		return;
	in->state = ST_RUNNING;
	if (in->prog->rolling >= 0)
		sv_rolling_advance(in->prog);
}

static void
check_deadline_due(struct instance *in)
{
	if (in->checker <= 0)
		return;
	in->t_check_deadline = -1; /* tells sv_on_checker_exit it timed out; never arms the timer */
	kill(in->checker, SIGKILL);
}

static void
health_due(struct instance *in)
{
	if (sv_states[in->state].up)
		sv_start_check(in);
}

static void
fd_due(struct instance *in)
{
	if (sv_states[in->state].up)
		sv_sample_fds(in);
}

/* Every deadline of an instance, in the order they are acted on when due together. */
static const struct deadline {
	size_t off;             /* of the double in struct instance: monotonic s, 0 none */
	void (*fire)(struct instance *in);
} deadlines[] = {
	{offsetof(struct instance, t_kill), kill_due},
	{offsetof(struct instance, t_group_kill), group_kill_due},
	{offsetof(struct instance, t_start), start_due},
	{offsetof(struct instance, t_running), running_due},
	{offsetof(struct instance, t_check_deadline), check_deadline_due},
	{offsetof(struct instance, t_health), health_due},
	{offsetof(struct instance, t_fd), fd_due},
};

#define NDEADLINES (sizeof deadlines / sizeof deadlines[0])

static double *
deadline_of(struct instance *in, const struct deadline *d)
{
	return (double *)((char *)in + d->off);
}

static void
arm_timer(struct sv *s)
{
	double earliest = s->t_accept;
	consider(&earliest, s->t_watchdog);
	for (struct program *p = s->progs; p; p = p->next)
		for (int i = 0; i < p->ninst; i++)
			for (size_t d = 0; d < NDEADLINES; d++)
				consider(&earliest, *deadline_of(&p->inst[i], &deadlines[d]));
	struct itimerspec its = {0};
	if (earliest > 0) {
		its.it_value.tv_sec = (time_t)earliest;
		its.it_value.tv_nsec = (long)((earliest - (double)(time_t)earliest) * 1e9);
		if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
			its.it_value.tv_nsec = 1;
	}
	timerfd_settime(s->timerfd, TFD_TIMER_ABSTIME, &its, NULL);
}

static bool
due(double *t, double now)
{
	if (*t > 0 && *t <= now) {
		*t = 0;
		return true;
	}
	return false;
}

static void
on_timer(struct sv *s, void *unused)
{
	uint64_t ticks;
	(void)!read(s->timerfd, &ticks, sizeof ticks);
	double t = gfs_mono_seconds() + 0.0005;
	if (due(&s->t_accept, t))
		sv_ep_add(s, s->ctlfd, &s->w_ctl, W_CONTROL, NULL);
	if (due(&s->t_watchdog, t)) {
		sv_notify(s, "WATCHDOG=1");
		s->t_watchdog = t + s->watchdog_s;
	}
	for (struct program *p = s->progs; p; p = p->next)
		for (int i = 0; i < p->ninst; i++)
			for (size_t d = 0; d < NDEADLINES; d++)
				if (due(deadline_of(&p->inst[i], &deadlines[d]), t))
					deadlines[d].fire(&p->inst[i]);
}

/* ---- signals ------------------------------------------------------------ */

static void
on_sigchld(struct sv *s, int sig)
{
	sv_reap(s);
}

static void
on_sighup(struct sv *s, int sig)
{
	sv_reload(s);
}

/* The first asks every program to stop; another one kills what is left. */
static void
on_stop_signal(struct sv *s, int sig)
{
	if (s->stopping && ++s->stop_signals > 1) {
		sv_event(s, "%s again: killing every program now", sv_signal_name(sig));
		for (struct program *p = s->progs; p; p = p->next)
			for (int i = 0; i < p->ninst; i++) {
				if (sv_alive(&p->inst[i]))
					sv_signal_group(&p->inst[i], SIGKILL);
				if (p->inst[i].leftover_pgid > 0)
					sv_kill_leftovers(&p->inst[i]);
			}
	}
	sv_stop_all(s, sv_signal_name(sig));
	s->stop_signals++;
}

/* The signals the loop takes through its signalfd (and blocks otherwise). */
static const struct {
	int sig;
	void (*handle)(struct sv *s, int sig);
} signals[] = {
	{SIGCHLD, on_sigchld},
	{SIGHUP, on_sighup},
	{SIGTERM, on_stop_signal},
	{SIGINT, on_stop_signal},
};

#define NSIGNALS (sizeof signals / sizeof signals[0])

static void
on_signal(struct sv *s, void *unused)
{
	struct signalfd_siginfo si;
	while (read(s->sigfd, &si, sizeof si) == (ssize_t)sizeof si)
		for (size_t i = 0; i < NSIGNALS; i++)
			if (signals[i].sig == (int)si.ssi_signo)
				signals[i].handle(s, signals[i].sig);
}

static int
signal_fd(void)
{
	/*
	 * An inherited SIGCHLD = SIG_IGN makes the kernel reap our children
	 * itself: no exit status, and pidfds that stay readable forever.
	 */
	signal(SIGCHLD, SIG_DFL);
	sigset_t mask;
	sigemptyset(&mask);
	for (size_t i = 0; i < NSIGNALS; i++)
		sigaddset(&mask, signals[i].sig);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	return signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
}

/* ---- the loop ----------------------------------------------------------- */

static void
on_control(struct sv *s, void *unused)
{
	sv_on_accept(s);
}

static void
on_client(struct sv *s, void *cl)
{
	sv_on_client(s, cl);
}

static void
on_output(struct sv *s, void *st)
{
	sv_handle_output(st, false);
}

/* A pidfd, of a child or of a health checker, is readable: it has exited. */
static void
on_pidfd(struct sv *s, void *unused)
{
	sv_reap(s);
}

static void
on_relay(struct sv *s, void *r)
{
	sv_relay_flush(s, r);
}

static const struct {
	void (*handle)(struct sv *s, void *ptr);
	bool repoll;            /* may free what later events of the batch point at */
} handlers[] = {
	[W_SIGNAL] = {on_signal, true},
	[W_TIMER] = {on_timer, false},
	[W_CONTROL] = {on_control, false},
	[W_CLIENT] = {on_client, true},
	[W_OUTPUT] = {on_output, false},
	[W_PIDFD] = {on_pidfd, true},
	[W_CHECKER] = {on_pidfd, true},
	[W_RELAY] = {on_relay, false},
};

/*
 * Started with 0, 1 or 2 closed, our sockets and pipes would take those
 * numbers and the children's stdio would land on them.
 */
static void
fill_stdio(void)
{
	for (int fd = 0; fd <= 2; fd++)
		if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0)
			break;
}

struct sv *
sv_new(struct sv_config *cfg, const char *config_path, const char *control_path,
       const struct sv_callbacks *cb, bool *busy, char *err, size_t errlen)
{
	fill_stdio();
	struct sv *s = gfs_xcalloc(1, sizeof *s);
	s->cb = *cb;
	s->sigfd = s->timerfd = s->ctlfd = -1;
	s->out.fd = s->err.fd = -1;
	/* Before anything can have an event to tell, and a relay to wait for its reader with. */
	s->epfd = epoll_create1(EPOLL_CLOEXEC);
	sv_relays_open(s, cb);
	s->config_path = config_path ? realpath(config_path, NULL) : NULL;
	if (config_path && !s->config_path)
		s->config_path = gfs_xstrdup(config_path);
	s->control_path = control_path ? gfs_xstrdup(control_path)
	                : cfg->control ? gfs_xstrdup(cfg->control) : sv_default_control_path();
	s->ctlfd = sv_bind_control(s->control_path, !control_path && !cfg->control, busy, err, errlen);
	if (s->ctlfd < 0) {
		free(s->control_path);
		s->control_path = NULL; /* not ours to unlink */
		sv_config_free(cfg);
		sv_free(s);
		return NULL;
	}
	for (size_t i = 0; i < cfg->nprogs; i++)
		sv_append_program(s, sv_prog_new(s, &cfg->progs[i]));
	sv_config_free(cfg);
	s->sigfd = signal_fd();
	s->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (s->sigfd < 0 || s->epfd < 0 || s->timerfd < 0) {
		snprintf(err, errlen, "event loop setup: %s", strerror(errno));
		sv_free(s);
		return NULL;
	}
	sv_ep_add(s, s->sigfd, &s->w_sig, W_SIGNAL, NULL);
	sv_ep_add(s, s->timerfd, &s->w_timer, W_TIMER, NULL);
	sv_ep_add(s, s->ctlfd, &s->w_ctl, W_CONTROL, NULL);
	/* A closed stdout or control client must not kill the supervisor of everything. */
	signal(SIGPIPE, SIG_IGN);
	/* The programs are not ours to speak for to systemd, nor it for them. */
	gfs_sd_notify_detach();
	/* Orphans of daemonising children become ours, not init's: we can still see them. */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	return s;
}

int
sv_run(struct sv *s)
{
	sv_event(s, "supervising %s; control socket %s",
	         s->config_path ? s->config_path : "one program", s->control_path);
	for (struct program *p = s->progs; p; p = p->next)
		sv_start_program(p);
	sv_advance_order(s);
	/* Started, not yet proven running: systemd's READY means "the supervisor is up". */
	sv_notify(s, "READY=1\nSTATUS=supervising");
	uint64_t wd = gfs_sd_watchdog_usec();
	s->watchdog_s = (double)wd / 2e6;
	s->t_watchdog = wd ? gfs_mono_seconds() + s->watchdog_s : 0;
	while (!(s->stopping && sv_all_quiet(s))) {
		arm_timer(s);
		struct epoll_event evs[32];
		int n = epoll_wait(s->epfd, evs, 32, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			sv_event(s, "epoll_wait: %s", strerror(errno));
			return 1;
		}
		for (int i = 0; i < n; i++) {
			struct watch *w = evs[i].data.ptr;
			enum wkind kind = w->kind; /* w may be freed by its handler */
			handlers[kind].handle(s, w->ptr);
			if (handlers[kind].repoll)
				break;
		}
		sv_advance_order(s);
		sv_release_idle_listen(s);
	}
	sv_event(s, "every program stopped; exiting");
	/* What stop promises is done: its clients do not wait for our readers. */
	sv_clients_stopped(s);
	double deadline = gfs_mono_seconds() + EXIT_DRAIN_S;
	sv_relay_drain(s, &s->out, deadline);
	sv_relay_drain(s, s->ev, deadline);
	return 0;
}

void
sv_free(struct sv *s)
{
	if (!s)
		return;
	sv_clients_free(s);
	sv_relay_close(s, &s->out);
	sv_relay_close(s, &s->err);
	free(s->out.buf);
	free(s->err.buf);
	struct program *p = s->progs;
	while (p) {
		struct program *next = p->next;
		if (p->replacement)
			sv_prog_free(p->replacement);
		for (int i = 0; i < p->ninst; i++) {
			sv_ep_close(s, &p->inst[i].pidfd);
			sv_ep_close(s, &p->inst[i].out.fd);
			sv_ep_close(s, &p->inst[i].err.fd);
			sv_ep_close(s, &p->inst[i].checker_pidfd);
			if (p->inst[i].checker_pipe >= 0)
				close(p->inst[i].checker_pipe);
		}
		sv_prog_free(p);
		p = next;
	}
	sv_control_close(s);
	/*
	 * The signals stay blocked: a SIGTERM that arrives while we exit after a
	 * clean stop must not turn exit status 0 into death by signal.
	 */
	if (s->sigfd >= 0)
		close(s->sigfd);
	if (s->timerfd >= 0)
		close(s->timerfd);
	if (s->epfd >= 0)
		close(s->epfd);
	free(s->control_path);
	free(s->config_path);
	free(s);
}
