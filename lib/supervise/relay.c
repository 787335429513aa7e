/*
 * Relays: children's output without a log file, and event lines, on their
 * way to our stdout and stderr. A reader of those that stops (a pager, a
 * full pipe) must not stop the supervisor: a blocked write would leave
 * every child's pipe unread, and the children blocked in turn. So a relay
 * never blocks. It holds what the reader has not taken up to its max, then
 * drops whole lines until the reader has caught up, and then says how much
 * went. While it holds something, epoll waits for the descriptor to take
 * more (W_RELAY). With 2>&1 one relay serves both, so lines keep their
 * order.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../util.h"
#include "internal.h"

/* Relayed output held for a reader that falls behind; beyond it, lines are dropped. */
#define RELAY_MAX (1024 * 1024)
/* Event lines held for a reader of standard error; they are short, so this is thousands of them. */
#define EVENTS_MAX (256 * 1024)

static void
relay_open(struct relay *r, int fd, size_t max, const char *what)
{
	r->fd = -1;
	r->max = max;
	r->what = what;
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0)
		return;
	if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) {
		r->fd = fd; /* a local file never waits for a reader */
		return;
	}
	if (S_ISSOCK(st.st_mode)) {
		r->fd = fd;
		r->sock = true;
		return;
	}
	/*
	 * A pipe, FIFO or terminal. O_NONBLOCK on fd itself would change the
	 * open file description we share with our parent (and maybe stderr);
	 * an opening of our own makes only our writes non-blocking.
	 */
	char path[64];
	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	int own = open(path, O_WRONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
	if (own >= 0) {
		r->fd = own;
		r->own = true;
		return;
	}
	/* No /proc: better a shared O_NONBLOCK than a supervisor that blocks. */
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	r->fd = fd;
}

/* True when a and b lead to the same pipe, terminal, socket or file. */
static bool
same_file(int a, int b)
{
	struct stat sa, sb;
	return a >= 0 && b >= 0 && fstat(a, &sa) == 0 && fstat(b, &sb) == 0 &&
	       sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/*
 * With 2>&1 two relays would each hold and drop their own lines and write
 * in whatever order their reader let them: event lines could overtake the
 * output they are about, or split a long line. One relay keeps the order.
 */
void
sv_relays_open(struct sv *s, const struct sv_callbacks *cb)
{
	relay_open(&s->out, cb->output_fd, RELAY_MAX, "standard output");
	s->ev = &s->err;
	if (cb->event_fd >= 0 && s->out.fd >= 0 && same_file(cb->output_fd, cb->event_fd))
		s->ev = &s->out;
	else
		relay_open(&s->err, cb->event_fd, EVENTS_MAX, "standard error");
}

static void
relay_watch(struct sv *s, struct relay *r, bool on)
{
	if (r->fd < 0 || on == r->watched)
		return;
	r->w.kind = W_RELAY;
	r->w.ptr = r;
	struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = &r->w};
	if (epoll_ctl(s->epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, r->fd, &ev) == 0)
		r->watched = on;
}

void
sv_relay_close(struct sv *s, struct relay *r)
{
	relay_watch(s, r, false);
	if (r->own && r->fd >= 0)
		close(r->fd);
	r->fd = -1;
	r->off = r->len = 0;
}

static ssize_t
relay_write(const struct relay *r, const char *data, size_t len)
{
	if (r->sock)
		return send(r->fd, data, len, MSG_DONTWAIT | MSG_NOSIGNAL);
	return write(r->fd, data, len);
}

/* Once the buffer has emptied, what was dropped is said where it went missing. */
static void
relay_note_dropped(struct relay *r)
{
	if (r->dropped == 0)
		return;
	int n = snprintf(r->buf, r->max + 1, "[%llu bytes dropped (%llu lines): %s was not being "
	                 "read]\n", r->dropped, r->dropped_lines, r->what);
	r->off = 0;
	r->len = n > 0 ? (size_t)n : 0;
	r->dropped = r->dropped_lines = 0;
}

/* Writes what the reader takes now; waits in epoll for the rest. */
void
sv_relay_flush(struct sv *s, struct relay *r)
{
	while (r->fd >= 0 && r->off < r->len) {
		ssize_t n = relay_write(r, r->buf + r->off, r->len - r->off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			relay_watch(s, r, true);
			if (!r->watched)
				break; /* cannot wait for it: give up below */
			return;
		}
		if (n <= 0)
			break;
		r->off += (size_t)n;
		if (r->off == r->len) {
			r->off = r->len = 0;
			relay_note_dropped(r);
		}
	}
	if (r->fd >= 0 && r->off < r->len) {
		const char *why = strerror(errno);
		sv_relay_close(s, r);
		/* Reaches the event callback, or standard error when only stdout failed. */
		sv_event(s, "%s: %s: %s discarded from now on", r->what, why,
		         r != s->ev ? "children's output without a log file is"
		         : r == &s->out ? "children's output and event lines are" : "event lines are");
		return;
	}
	relay_watch(s, r, false);
}

/* Makes room for need more bytes, or counts them as dropped. */
static bool
relay_room(struct sv *s, struct relay *r, size_t need)
{
	if (!r->buf) {
		r->buf = gfs_xmalloc(r->max + 1);
	}
	if (r->dropped == 0 && r->off > 0 && r->max - r->len < need) {
		/* What the reader took leaves room at the front. */
		memmove(r->buf, r->buf + r->off, r->len - r->off);
		r->len -= r->off;
		r->off = 0;
	}
	if (r->dropped == 0 && r->max - r->len >= need)
		return true;
	/* Dropping goes on until the reader has caught up, so the note marks one gap. */
	bool first = r->dropped == 0;
	r->dropped += need;
	r->dropped_lines++;
	/* Said on standard error; when that is this relay, the note will say it. */
	if (first && r != s->ev)
		sv_event(s, "%s is not being read: dropping children's output until it is", r->what);
	return false;
}

void
sv_relay_printf(struct sv *s, struct relay *r, const char *fmt, ...)
{
	if (r->fd < 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n <= 0 || !relay_room(s, r, (size_t)n))
		return;
	va_start(ap, fmt);
	vsnprintf(r->buf + r->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	r->len += (size_t)n;
	if (!r->watched)
		sv_relay_flush(s, r);
}

void
sv_relay_event(struct sv *s, const char *line)
{
	struct timespec ts;
	struct tm tm;
	char when[32];
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
	sv_relay_printf(s, s->ev, "%s%s.%03ldZ %s\n", s->cb.event_prefix ? s->cb.event_prefix : "",
	                when, ts.tv_nsec / 1000000, line);
}

/*
 * At exit nothing is left to supervise, and a reader that is merely slow
 * (systemd's journal, a busy terminal) should still get the last lines.
 * One that has stopped costs us EXIT_DRAIN_S.
 */
void
sv_relay_drain(struct sv *s, struct relay *r, double deadline)
{
	sv_relay_flush(s, r);
	while (r->fd >= 0 && r->off < r->len) {
		double left = deadline - gfs_mono_seconds();
		struct pollfd pfd = {.fd = r->fd, .events = POLLOUT};
		if (left <= 0 || poll(&pfd, 1, (int)(left * 1000) + 1) <= 0)
			return;
		sv_relay_flush(s, r);
	}
}
