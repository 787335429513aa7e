/*
 * Mirror's scan: the files to write from one pass over all chunks.
 *
 * When most of the bucket is to be written (read_strategy.c decides), one find
 * over fs.chunks in natural order (no filter, no sort, hint $natural: the
 * query rule of docs/design.md) reads every chunk once, sequentially,
 * rather than one query per file. Chunks come in any order and interleaved
 * between files: each file takes its chunks in order of n into its
 * temporary file, and holds the ones that come before their turn, up to a
 * bound for the whole pass (--hold); past it, or past SCAN_OPEN_MAX
 * temporary files open at once, a file is given up and left to the
 * per-file write, as are files the pass saw no chunk of.
 *
 * Every chunk is checked as gfs_read checks it (its n, its length) and
 * the whole by its hash. A duplicate or a chunk past the last can come at
 * any time, so a complete file is renamed into place only once the pass is
 * over; a file still open then lacks a chunk. After a stop, a complete
 * file goes into place only once its chunks are counted by files_id. A
 * pass read from a secondary reports no damage itself: the file is read
 * again by the per-file write, which asks the primary before it reports.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../strmap.h"
#include "internal.h"

/* Where a file to write is in the scan. */
enum {
	SE_NEW,             /* no chunk of it yet */
	SE_OPEN,            /* its temporary file takes its chunks in order of n */
	SE_COMPLETE,        /* written and checked; renamed when the scan ends (a late chunk fails it) */
	SE_DONE,            /* reported, or given up: the per-file write takes it */
};

struct scan_entry {
	char *key;
	size_t idx;
	int state;
	int fd;             /* SE_OPEN: the temporary file */
	char tmp[64];       /* its name, beside the target */
	int64_t next;       /* SE_OPEN: the n it wants */
	gfs_digest *h;
	gfs_held *held;     /* chunks before their turn */
};

/* Temporary files open at once in a scan; past it a file is left to the per-file write. */
#define SCAN_OPEN_MAX 64

struct scan {
	gfs_mirror_dir *d;
	const gfs_mirror_plan *plan;
	strmap *map;
	struct scan_entry *entries;
	size_t n;
	gfs_mirror_done_fn done;
	void *ctx;
	size_t hold, held_bytes;     /* bytes of chunks held before their turn, and the bound */
	size_t open;                 /* temporary files open */
	gfs_mirror_finisher *fin;    /* NULL: finish each file on the scan thread */
	bool secondary;              /* the pass reads from a secondary, which may be behind */
};

/* A map key for an _id of any type: the type, then its text; equal numbers share one. */
static char *
id_key(const bson_value_t *id)
{
	bson_value_t c = gfs_id_canonical(id);
	char *text = gfs_id_string(&c);
	char *key = bson_strdup_printf("%d:%s", (int)c.value_type, text);
	free(text);
	return key;
}

static const struct gfs_mirror_item *
entry_item(const struct scan *sc, const struct scan_entry *e)
{
	return &sc->plan->items[e->idx];
}

/* Removes the entry's temporary file, closed or open. */
static void
scan_unlink(struct scan *sc, struct scan_entry *e)
{
	if (e->fd >= 0) {
		close(e->fd);
		e->fd = -1;
		sc->open--;
	}
	if (e->state != SE_OPEN && e->state != SE_COMPLETE)
		return;
	size_t dl;
	gfs_mirror_leaf(entry_item(sc, e), &dl);
	gfs_error derr;
	int pfd = gfs_mirror_dir_get(sc->d, entry_item(sc, e)->rel, dl, false, &derr);
	if (pfd >= 0)
		unlinkat(pfd, e->tmp, 0);
}

/* Drops what the scan has of the file; err NULL: left unreported, for the per-file write. */
static void
scan_fail(struct scan *sc, struct scan_entry *e, const gfs_error *err)
{
	scan_unlink(sc, e);
	if (e->h) {
		char hex[65], md5[33];
		gfs_digest_final(e->h, hex, md5);
		e->h = NULL;
	}
	sc->held_bytes -= gfs_held_free(&e->held);
	e->state = SE_DONE;
	if (err)
		sc->done(e->idx, err, sc->ctx);
}

/*
 * Damage in what the pass read. Read from a secondary, the file may only
 * be behind (its chunks still replicating): it is left to the per-file
 * write, which reads it again and, still damaged, from the primary, whose
 * word goes (issue 31). Otherwise it is reported here.
 */
static void
scan_damaged(struct scan *sc, struct scan_entry *e, const gfs_error *err)
{
	scan_fail(sc, e, sc->secondary ? NULL : err);
}

/* The first chunk of a file in its turn: its temporary file. */
static bool
scan_open(struct scan *sc, struct scan_entry *e)
{
	if (sc->open >= SCAN_OPEN_MAX) {
		scan_fail(sc, e, NULL);
		return false;
	}
	struct gfs_mirror_temp t;
	gfs_error err;
	if (!gfs_mirror_temp_open(sc->d, entry_item(sc, e), &t, &err)) {
		scan_fail(sc, e, &err);
		return false;
	}
	e->fd = t.fd;
	memcpy(e->tmp, t.name, sizeof e->tmp);
	sc->open++;
	e->state = SE_OPEN;
	e->h = gfs_digest_new(&entry_item(sc, e)->file);
	return true;
}

/* Writes the chunk whose turn it is; false when the file failed. */
static bool
scan_write(struct scan *sc, struct scan_entry *e, const bson_t *doc)
{
	if (e->state == SE_NEW && !scan_open(sc, e))
		return false;
	const struct gfs_mirror_item *it = entry_item(sc, e);
	const uint8_t *data;
	uint32_t len;
	gfs_error err;
	if (!gfs_chunk_data(doc, it->file.length, it->file.chunk_size, e->next,
	                    gfs_mirror_item_name(it), &data, &len, &err)) {
		scan_damaged(sc, e, &err);
		return false;
	}
	e->next++;
	gfs_digest_update(e->h, data, len);
	int error = 0;
	if (!gfs_mirror_write_all(e->fd, data, len, NULL, &error)) {
		gfs_mirror_local_error(&err, it, "write", error);
		scan_fail(sc, e, &err);
		return false;
	}
	return true;
}

/* All chunks 0..count-1 are in: check the whole; it is renamed when the scan ends. */
static void
scan_complete(struct scan *sc, struct scan_entry *e)
{
	gfs_error err;
	bool intact = gfs_digest_check(e->h, &entry_item(sc, e)->file, NULL, &err);
	e->h = NULL;
	if (!intact) {
		scan_damaged(sc, e, &err);
		return;
	}
	close(e->fd);
	e->fd = -1;
	sc->open--;
	e->state = SE_COMPLETE;
}

static void
scan_chunk(struct scan *sc, const bson_t *doc)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, doc, "files_id"))
		return;
	char *key = id_key(bson_iter_value(&it));
	struct scan_entry *e = strmap_get(sc->map, key);
	bson_free(key);
	if (!e || e->state == SE_DONE)
		return;
	const struct gfs_mirror_item *item = entry_item(sc, e);
	const char *name = gfs_mirror_item_name(item);
	int64_t expected = gfs_chunk_count(item->file.length, item->file.chunk_size);
	int64_t n;
	gfs_error err;
	if (gfs_chunk_n_place(doc, &n) != GFS_N_NUMBER) {
		gfs_error_set(&err, GFS_EBADDOC, "%s: chunk without a valid n", name);
		scan_damaged(sc, e, &err);
		return;
	}
	/* A chunk after the last, or a second copy: damage, whenever it comes. */
	if (e->state == SE_COMPLETE || n < e->next || n >= expected || gfs_held_has(e->held, n)) {
		gfs_error_set(&err, GFS_EEXTRACHUNK, "%s: extra chunk n=%lld (expected %lld chunks)",
		              name, (long long)n, (long long)expected);
		scan_damaged(sc, e, &err);
		return;
	}
	if (n > e->next) {
		if (sc->held_bytes + doc->len > sc->hold)
			scan_fail(sc, e, NULL);   /* past the bound: written file by file later */
		else
			sc->held_bytes += gfs_held_put(&e->held, doc, n);
		return;
	}
	if (!scan_write(sc, e, doc))
		return;
	bson_t *next;
	while ((next = gfs_held_take(&e->held, e->next)) != NULL) {
		sc->held_bytes -= next->len;
		bool ok = scan_write(sc, e, next);
		bson_destroy(next);
		if (!ok)
			return;
	}
	if (e->next == expected)
		scan_complete(sc, e);
}

/*
 * 1 when the file has no chunk beyond those written (a duplicate, an extra
 * that a scan stopped early has not met yet), 0 when it has, -1 when the
 * count failed: its chunks by files_id, counted.
 */
static int
no_more_chunks(gfs_session *s, const struct gfs_mirror_item *it)
{
	int64_t n = gfs_chunk_docs(s, &it->file.id);
	return n < 0 ? -1 : n == gfs_chunk_count(it->file.length, it->file.chunk_size);
}

/*
 * The scan is over: complete files go into place, the others fail with what
 * is missing. After a stop (canceled) a complete file goes into place once
 * its chunks are counted; after any other failure no complete file does.
 */
static void
scan_end(struct scan *sc, gfs_session *s, bool complete, bool canceled)
{
	for (size_t i = 0; i < sc->n; i++) {
		struct scan_entry *e = &sc->entries[i];
		const struct gfs_mirror_item *it = entry_item(sc, e);
		gfs_error err;
		if (e->state == SE_COMPLETE && !complete) {
			int whole = canceled ? no_more_chunks(s, it) : 0;
			if (whole < 0)
				canceled = false;   /* the backend is not answering: ask no more */
			if (whole != 1)
				scan_fail(sc, e, NULL);
		} else if (e->state == SE_OPEN && complete) {
			gfs_error_set(&err, GFS_EMISSINGCHUNK, "%s: missing chunk n=%lld",
			              gfs_mirror_item_name(it), (long long)e->next);
			scan_damaged(sc, e, &err);
		} else if (e->state == SE_OPEN) {
			scan_fail(sc, e, NULL); /* unfinished: its temporary file goes, no verdict */
		}
		sc->held_bytes -= gfs_held_free(&e->held);
		if (e->state != SE_COMPLETE)
			continue;
		e->state = SE_DONE;
		size_t dl;
		gfs_mirror_leaf(it, &dl);
		struct gfs_mirror_temp t = {.pfd = gfs_mirror_dir_get(sc->d, it->rel, dl, false, &err),
		                            .fd = -1};
		memcpy(t.name, e->tmp, sizeof t.name);
		if (t.pfd >= 0)
			t.fd = openat(t.pfd, t.name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
		if (t.pfd < 0) {
			gfs_mirror_prefix_name(&err, it);
		} else if (t.fd < 0) {
			gfs_mirror_local_error(&err, it, "reopen the temporary file", errno);
			unlinkat(t.pfd, t.name, 0);
		} else if (!sc->fin) {
			bool ok = gfs_mirror_temp_finish(sc->d, it, &t, true, &err);
			sc->done(e->idx, ok ? NULL : &err, sc->ctx);
			continue;
		} else if (gfs_mirror_finisher_take(sc->fin, sc->d, e->idx, &t, &err)) {
			continue;
		} else {
			close(t.fd);
			unlinkat(t.pfd, t.name, 0);
		}
		sc->done(e->idx, &err, sc->ctx);
	}
}

static int32_t
scan_batch_size(const gfs_mirror_plan *plan, const size_t *idx, size_t n)
{
	int32_t max = 1;
	for (size_t i = 0; i < n; i++)
		if (plan->items[idx[i]].file.chunk_size > max)
			max = plan->items[idx[i]].file.chunk_size;
	return gfs_chunk_batch_size(max);
}

/* One pass over all chunks in natural order through the scan. */
static bool
scan_pass(struct scan *sc, gfs_session *s, int32_t batch, gfs_error *err)
{
	bson_t all = BSON_INITIALIZER, opts = BSON_INITIALIZER;
	gfs_read_scan_opts(&opts, batch);
	mongoc_cursor_t *cur = gfs_session_find(s, s->chunks, &all, &opts);
	bson_destroy(&opts);
	bool ok = true;
	const bson_t *doc;
	while (mongoc_cursor_next(cur, &doc)) {
		if (sc->d->opts->stop && atomic_load(sc->d->opts->stop)) {
			gfs_error_set(err, GFS_ECANCELED, "interrupted");
			ok = false;
			break;
		}
		scan_chunk(sc, doc);
	}
	return gfs_cursor_done(cur, "read chunks", err) && ok;
}

bool
gfs_mirror_scan(gfs_mirror_dir *d, gfs_session *s, const gfs_mirror_plan *plan,
                const size_t *idx, size_t n, size_t hold_bytes, int finishers,
                gfs_mirror_done_fn done, void *ctx, gfs_error *err)
{
	struct scan sc = {.d = d, .plan = plan, .map = strmap_new(n), .n = n, .done = done,
	                  .ctx = ctx, .hold = hold_bytes ? hold_bytes : GFS_READ_HOLD_DEFAULT};
	sc.entries = gfs_xcalloc(n ? n : 1, sizeof *sc.entries);
	sc.secondary = gfs_session_on_secondary(s);
	if (finishers > 0 && d->opts->fsync)
		sc.fin = gfs_mirror_finisher_start(plan, finishers, done, ctx);
	for (size_t i = 0; i < n; i++) {
		struct scan_entry *e = &sc.entries[i];
		e->idx = idx[i];
		e->fd = -1;
		/*
		 * An empty file is left to the per-file write, whose one query
		 * (limit 1) finds a stray chunk of it, extra as for any file.
		 */
		if (plan->items[idx[i]].file.length == 0)
			e->state = SE_DONE;
		e->key = id_key(&plan->items[idx[i]].file.id);
		strmap_put(sc.map, e->key, e);
	}
	bool ok = scan_pass(&sc, s, scan_batch_size(plan, idx, n), err);
	scan_end(&sc, s, ok, !ok && err->code == GFS_ECANCELED);
	gfs_error ferr;
	if (!gfs_mirror_finisher_stop(sc.fin, &ferr) && ok) {
		*err = ferr;
		ok = false;
	}
	for (size_t i = 0; i < n; i++)
		bson_free(sc.entries[i].key);
	strmap_free(sc.map);
	free(sc.entries);
	return ok;
}

