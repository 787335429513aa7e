/*
 * Children's output. Each instance has two pipes, read without blocking
 * into a buffer of LINE_MAX_ bytes and split into lines. A line goes to the
 * instance's log file (raw, a whole read per write) or else to our stdout
 * as "[instance] line" through the relay, and is matched against
 * restart_on when the stream is one restart_on reads (stderr unless told:
 * stdout may carry what clients sent). A line longer than the buffer is
 * passed on in pieces that overlap by LINE_OVERLAP, so a match across a
 * cut is still seen. Reads are bounded per wakeup: a child that writes
 * without end cannot starve the rest of the loop.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

void
sv_stream_open(struct instance *in, struct stream *st, int fd)
{
	st->fd = fd;
	st->len = st->seen = 0;
	fcntl(fd, F_SETFL, O_NONBLOCK);
	sv_ep_add(in->sv, fd, &st->w, W_OUTPUT, st);
}

/* Whether restart_on looks at this stream: request data a server logs must not restart it. */
static bool
stream_matched(const struct stream *st)
{
	int which = st->in->prog->cfg.restart_on_stream;
	return which == SV_STREAM_BOTH || (which == SV_STREAM_STDERR) == st->is_err;
}

/*
 * One line, or one piece of an overlong one, in line[0..len): matched
 * whole, but relayed from from on, since line[0..from) went with the piece
 * before it.
 */
static void
on_line(struct stream *st, char *line, size_t from, size_t len)
{
	struct instance *in = st->in;
	struct sv *s = in->sv;
	char save = line[len];
	line[len] = '\0';
	if (!in->log)
		sv_relay_printf(s, &s->out, "[%s] %s\n", in->name, line + (from < len ? from : len));
	int which = stream_matched(st) ? sv_patterns_match(&in->prog->pats, line) : -1;
	if (which >= 0)
		sv_restart_for_pattern(in, line, which);
	line[len] = save;
}

/* Raw output to the log: whole reads at a time, one write(2) for many lines. */
static void
log_bytes(struct instance *in, const char *data, size_t len)
{
	if (in->log && len && !logfile_write(in->log, data, len))
		sv_event(in->sv, "%s: log write: %s", in->name, strerror(errno));
}

/* An overlong line fills the buffer: passed on as a piece, its tail kept to match with the next. */
static void
take_piece(struct stream *st)
{
	on_line(st, st->buf, st->seen, st->len);
	log_bytes(st->in, st->buf + st->seen, st->len - st->seen);
	log_bytes(st->in, "\n", 1);
	memmove(st->buf, st->buf + st->len - LINE_OVERLAP, LINE_OVERLAP);
	st->len = st->seen = LINE_OVERLAP;
}

/* Passes on the complete lines held, and keeps what follows the last newline. */
static void
take_lines(struct stream *st)
{
	char *start = st->buf, *nl;
	while ((nl = memchr(start, '\n', st->len - (size_t)(start - st->buf))) != NULL) {
		size_t l = (size_t)(nl - start);
		if (l && start[l - 1] == '\r')
			l--;
		on_line(st, start, start == st->buf ? st->seen : 0, l);
		start = nl + 1;
	}
	if (start == st->buf) {
		if (st->len == sizeof st->buf - 1)
			take_piece(st);
		return;
	}
	log_bytes(st->in, st->buf + st->seen, (size_t)(start - st->buf) - st->seen);
	st->len -= (size_t)(start - st->buf);
	st->seen = 0;
	memmove(st->buf, start, st->len);
}

void
sv_handle_output(struct stream *st, bool drain_all)
{
	/* Bounded even when draining: a process left behind may write forever. */
	for (int rounds = 0; st->fd >= 0 && rounds < (drain_all ? 256 : 16); rounds++) {
		ssize_t n = read(st->fd, st->buf + st->len, sizeof st->buf - 1 - st->len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n == 0 || errno != EAGAIN)
				sv_ep_close(st->in->sv, &st->fd);
			return;
		}
		st->len += (size_t)n;
		take_lines(st);
	}
}

/* What a child that has exited left in a pipe, and a last line without a newline. */
void
sv_drain_stream(struct stream *st)
{
	sv_handle_output(st, true);
	sv_ep_close(st->in->sv, &st->fd);
	if (st->len > st->seen) {
		on_line(st, st->buf, st->seen, st->len);
		log_bytes(st->in, st->buf + st->seen, st->len - st->seen);
		log_bytes(st->in, "\n", 1);
	}
	st->len = st->seen = 0;
}
