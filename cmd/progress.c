/*
 * A one-line progress display on stderr, only when it is a terminal (or
 * --progress asks for it anyway). With --stats it is a log instead: a plain
 * line every interval and one at the end, each ended by a newline.
 *
 * The line never reaches the last column (a terminal that wraps there would
 * leave each redraw on a new row), and on a terminal without escapes
 * (TERM=dumb, or unset) it is rewritten with '\r' and padded with blanks
 * over what the last one left. Every size is in the units of human_bytes().
 */
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "cmd.h"

/* An ETA before this many seconds comes from a rate that has not settled yet. */
#define ETA_AFTER_S 3.0

struct progress {
	const char *what;
	uint64_t total_items, total_bytes;
	uint64_t items, bytes;
	double started, last_draw;
	bool plain;          /* no escape sequences */
	size_t last_len;     /* of the line drawn last, for plain redraws */
};

void
human_bytes(double b, char *buf, size_t len)
{
	const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	int u = 0;
	while (b >= 1024 && u < 4) {
		b /= 1024;
		u++;
	}
	snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", b, units[u]);
}

/* Columns of the terminal on stderr: the window size, else $COLUMNS, else 80. */
static size_t
term_width(void)
{
	struct winsize ws;
	if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
		return ws.ws_col;
	long n;
	const char *cols = getenv("COLUMNS");
	if (cols && parse_int(cols, 1, 10000, &n))
		return (size_t)n;
	return 80;
}

static bool
dumb_terminal(void)
{
	const char *term = getenv("TERM");
	return !term || !*term || strcmp(term, "dumb") == 0;
}

static void
format_eta(double secs, char *buf, size_t len)
{
	long s = (long)(secs + 0.5);
	if (s >= 3600)
		snprintf(buf, len, " ETA %ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
	else
		snprintf(buf, len, " ETA %ld:%02ld", s / 60, s % 60);
}

/* The counts and rates part: "12/40 files, 1.2 MiB/3.0 MiB, 800.0 KiB/s ETA 0:02". */
static void
format_counts(const struct progress *p, bool final, double elapsed, char *buf, size_t len)
{
	double rate = elapsed > 0 ? (double)p->bytes / elapsed : 0;
	char done[32], total[32] = "", speed[32], eta[32] = "", items[64];
	human_bytes((double)p->bytes, done, sizeof done);
	human_bytes(rate, speed, sizeof speed);
	if (p->total_bytes) {
		total[0] = '/';
		human_bytes((double)p->total_bytes, total + 1, sizeof total - 1);
		if (rate > 0 && !final && elapsed >= ETA_AFTER_S) {
			uint64_t left = p->bytes < p->total_bytes ? p->total_bytes - p->bytes : 0;
			format_eta((double)left / rate, eta, sizeof eta);
		}
	}
	if (p->total_items)
		snprintf(items, sizeof items, "%llu/%llu", (unsigned long long)p->items,
		         (unsigned long long)p->total_items);
	else
		snprintf(items, sizeof items, "%llu", (unsigned long long)p->items);
	snprintf(buf, len, "%s files, %s%s, %s/s%s", items, done, total, speed, eta);
}

static void
draw(struct progress *p, bool final)
{
	double elapsed = gfs_mono_seconds() - p->started;
	char counts[256], line[512];
	format_counts(p, final, elapsed, counts, sizeof counts);
	int pct = -1;
	if (p->total_bytes)
		pct = (int)(100.0 * (double)p->bytes / (double)p->total_bytes);
	else if (p->total_items)
		pct = (int)(100.0 * (double)p->items / (double)p->total_items);
	size_t width = term_width();
	size_t room = width > 1 ? width - 1 : 1;
	/* The bar takes what the words leave, 10 to 30 columns, or goes. */
	size_t words = strlen(p->what) + 1 + strlen(counts);
	size_t bar = pct < 0 || room < words + 13 ? 0 : room - words - 3 > 30 ? 30 : room - words - 3;
	size_t n = (size_t)snprintf(line, sizeof line, "%s ", p->what);
	if (bar >= 10) {
		size_t fill = (size_t)(pct > 100 ? 100 : pct) * bar / 100;
		line[n++] = '[';
		for (size_t i = 0; i < bar; i++)
			line[n++] = i < fill ? '#' : '.';
		line[n++] = ']';
		line[n++] = ' ';
	}
	snprintf(line + n, sizeof line - n, "%s", counts);
	n = strlen(line);
	if (G.stats_s > 0) {
		fprintf(stderr, "%s: %s %s\n", progname, p->what, counts);
		fflush(stderr);
		p->last_draw = gfs_mono_seconds();
		return;
	}
	if (n > room)
		n = room, line[n] = '\0';
	if (p->plain) {
		/* Blanks over the rest of a longer line drawn before; never past room. */
		size_t pad = p->last_len > n ? p->last_len - n : 0;
		fprintf(stderr, "\r%s%*s", line, (int)pad, "");
		if (pad)
			fprintf(stderr, "\r%s", line);
	} else {
		fprintf(stderr, "\r\033[K%s", line);
	}
	p->last_len = n;
	if (final)
		fputc('\n', stderr);
	fflush(stderr);
	p->last_draw = gfs_mono_seconds();
}

struct progress *
progress_start(const char *what, uint64_t total_items, uint64_t total_bytes)
{
	if (!G.progress)
		return NULL;
	struct progress *p = calloc(1, sizeof *p);
	if (!p)
		return NULL;
	p->what = what;
	p->total_items = total_items;
	p->total_bytes = total_bytes;
	p->started = p->last_draw = gfs_mono_seconds();
	p->plain = dumb_terminal();
	return p;
}

void
progress_set_totals(struct progress *p, uint64_t total_items, uint64_t total_bytes)
{
	if (!p)
		return;
	p->total_items = total_items;
	p->total_bytes = total_bytes;
}

void
progress_update(struct progress *p, uint64_t items, uint64_t bytes)
{
	if (!p)
		return;
	p->items = items;
	p->bytes = bytes;
	if (gfs_mono_seconds() - p->last_draw >= (G.stats_s > 0 ? G.stats_s : 0.2))
		draw(p, false);
}

void
progress_done(struct progress *p)
{
	if (!p)
		return;
	draw(p, true);
	free(p);
}
