/* A one-line progress display on stderr, only when it is a terminal. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd.h"

struct progress {
	const char *what;
	uint64_t total_items, total_bytes;
	uint64_t items, bytes;
	double started, last_draw;
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

static void
draw(struct progress *p, bool final)
{
	double elapsed = gfs_mono_seconds() - p->started;
	double rate = elapsed > 0 ? (double)p->bytes / elapsed : 0;
	char done[32], total[32], speed[32], eta[32] = "";
	human_bytes((double)p->bytes, done, sizeof done);
	human_bytes(rate, speed, sizeof speed);
	int pct = -1;
	if (p->total_bytes) {
		human_bytes((double)p->total_bytes, total, sizeof total);
		pct = (int)(100.0 * (double)p->bytes / (double)p->total_bytes);
		if (rate > 0 && !final) {
			long left = (long)((double)(p->total_bytes - (p->bytes < p->total_bytes ? p->bytes : p->total_bytes)) / rate);
			snprintf(eta, sizeof eta, " ETA %ld:%02ld", left / 60, left % 60);
		}
	} else if (p->total_items) {
		pct = (int)(100.0 * (double)p->items / (double)p->total_items);
	}
	char bar[23] = "";
	if (pct >= 0) {
		int fill = pct > 100 ? 20 : pct / 5;
		bar[0] = '[';
		for (int i = 0; i < 20; i++)
			bar[1 + i] = i < fill ? '#' : '.';
		bar[21] = ']';
		bar[22] = '\0';
	}
	fprintf(stderr, "\r\033[K%s %s %llu", p->what, bar, (unsigned long long)p->items);
	if (p->total_items)
		fprintf(stderr, "/%llu", (unsigned long long)p->total_items);
	fprintf(stderr, " files, %s", done);
	if (p->total_bytes)
		fprintf(stderr, "/%s", total);
	fprintf(stderr, ", %s/s%s", speed, eta);
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
	if (gfs_mono_seconds() - p->last_draw >= 0.2)
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
