/* Mirror: planning which files to write, writing them atomically, sweeping the rest. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "backup.h"
#include "mirror.h"
#include "names.h"
#include "safepath.h"
#include "strmap.h"

/* ---- names ----------------------------------------------------------- */

bool
gfs_mirror_is_temp_name(const char *base, size_t len)
{
	size_t pl = strlen(GFS_MIRROR_TMP_PREFIX), sl = strlen(GFS_MIRROR_TMP_SUFFIX);
	if (len != pl + 16 + sl || memcmp(base, GFS_MIRROR_TMP_PREFIX, pl) != 0 ||
	    memcmp(base + pl + 16, GFS_MIRROR_TMP_SUFFIX, sl) != 0)
		return false;
	for (size_t i = pl; i < pl + 16; i++)
		if (!strchr("0123456789abcdef", base[i]) || base[i] == '\0')
			return false;
	return true;
}

void
gfs_mirror_temp_name(char buf[64])
{
	static atomic_uint_fast64_t counter;
	uint64_t r;
	if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		r = ((uint64_t)getpid() << 40) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
	}
	r ^= atomic_fetch_add(&counter, 1);
	snprintf(buf, 64, "%s%016llx%s", GFS_MIRROR_TMP_PREFIX, (unsigned long long)r,
	         GFS_MIRROR_TMP_SUFFIX);
}

static size_t
count_char(const char *s, size_t len, char c)
{
	size_t n = 0;
	for (size_t i = 0; i < len; i++)
		n += s[i] == c;
	return n;
}

/*
 * With rawName, the stored name is (import prefix) + escape(raw), and
 * escaping never touches '/', so segments match one to one: the last
 * segments of the filename must be exactly escape(raw). The local path is
 * then the filename below the mirror prefix with those segments swapped for
 * the raw bytes; when the mirror prefix reaches into them, their leading
 * raw segments are dropped instead.
 */
static bool
restore_raw(const char *filename, size_t tail_off, const char *raw, size_t raw_len, char **out,
            size_t *out_len, gfs_error *err)
{
	bool escaped;
	char *esc = gfs_name_from_bytes(raw, raw_len, &escaped);
	size_t fl = strlen(filename), el = strlen(esc);
	bool match = el <= fl && strcmp(filename + fl - el, esc) == 0 &&
	             (el == fl || filename[fl - el - 1] == '/');
	free(esc);
	if (!match) {
		gfs_error_set(err, GFS_EINVAL, "metadata.rawName does not match the filename");
		return false;
	}
	size_t raw_off = fl - el;
	char *buf = gfs_xmalloc(fl - tail_off + raw_len + 1);
	size_t n = 0;
	if (tail_off <= raw_off) {
		memcpy(buf, filename + tail_off, raw_off - tail_off);
		n = raw_off - tail_off;
		memcpy(buf + n, raw, raw_len);
		n += raw_len;
	} else {
		size_t skip = count_char(filename + raw_off, tail_off - raw_off, '/');
		size_t i = 0;
		while (skip > 0 && i < raw_len)
			skip -= raw[i++] == '/';
		memcpy(buf, raw + i, raw_len - i);
		n = raw_len - i;
	}
	buf[n] = '\0';
	*out = buf;
	*out_len = n;
	return true;
}

bool
gfs_mirror_name_check(const char *rel, size_t len, gfs_error *err)
{
	if (!gfs_safepath_check(rel, len, err))
		return false;
	size_t dl = gfs_safepath_dirlen(rel, len);
	size_t bo = dl ? dl + 1 : 0;
	if (gfs_mirror_is_temp_name(rel + bo, len - bo)) {
		gfs_error_set(err, GFS_EINVAL, "name has the form of a mirror temporary file");
		return false;
	}
	if (count_char(rel, len, '/') > GFS_MIRROR_DEPTH_MAX) {
		gfs_error_set(err, GFS_EINVAL, "more than %d folders deep, deeper than the sweep goes",
		              GFS_MIRROR_DEPTH_MAX);
		return false;
	}
	return true;
}

bool
gfs_mirror_local_path(const char *filename, const char *nprefix, const char *raw,
                      size_t raw_len, char **out, size_t *out_len, gfs_error *err)
{
	*out = NULL;
	const char *tail = gfs_prefix_strip(nprefix ? nprefix : "", filename);
	if (!tail) {
		gfs_error_set(err, GFS_EINVAL, "not under the prefix");
		return false;
	}
	/* "p//e" under the prefix "p/" is not an absolute name: the stored name has an empty segment. */
	if (nprefix && *nprefix && *tail == '/') {
		gfs_error_set(err, GFS_EINVAL, "empty path segment");
		return false;
	}
	char *rel;
	size_t len;
	if (raw) {
		if (!restore_raw(filename, (size_t)(tail - filename), raw, raw_len, &rel, &len, err))
			return false;
	} else {
		rel = gfs_xstrdup(tail);
		len = strlen(rel);
	}
	if (!gfs_mirror_name_check(rel, len, err)) {
		free(rel);
		return false;
	}
	*out = rel;
	*out_len = len;
	return true;
}

/* ---- planning -------------------------------------------------------- */

struct load_ctx {
	gfs_mirror_plan *plan;
	char *nprefix;
	gfs_mirror_refuse_fn refuse;
	void *ctx;
	size_t *refused;
	bson_t *pending;        /* newest revision so far of the current name */
	const char *pending_name;
	uint32_t pending_len;
	bool pending_bad;       /* it is malformed: ... */
	gfs_error pending_why;  /* ... for this reason */
};

static void
item_free(struct gfs_mirror_item *it)
{
	bson_value_destroy(&it->file.id);
	free(it->file.filename);
	free(it->rel);
}

static const char *
item_name(const struct gfs_mirror_item *it)
{
	return it->file.filename;
}

static void
refuse(struct load_ctx *lc, const char *name, const gfs_error *why)
{
	(*lc->refused)++;
	if (lc->refuse)
		lc->refuse(name, why, lc->ctx);
}

/* The filename as stored, with its BSON length (which counts any NUL inside). */
static const char *
doc_filename(const bson_t *doc, uint32_t *len)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, doc, "filename") && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, len);
	return NULL;
}

/*
 * A name with a NUL inside would be cut short at it, and could then stand
 * in for another stored name: refused.
 */
static bool
check_filename(const bson_t *doc, const gfs_file *f, gfs_error *why)
{
	uint32_t len = 0;
	if (!f->filename || !doc_filename(doc, &len)) {
		gfs_error_set(why, GFS_EINVAL, "files document without a filename");
		return false;
	}
	if (strlen(f->filename) != len) {
		gfs_error_set(why, GFS_EINVAL, "name has a NUL byte inside");
		return false;
	}
	return true;
}

/*
 * A name whose newest document is malformed: refused, and its local path
 * (when it has a safe one) held, so that neither --delete nor an older
 * revision takes the place of what it holds.
 */
static void
hold(struct load_ctx *lc, const bson_t *doc, const gfs_error *why)
{
	const char *name = gfs_doc_filename(doc);
	refuse(lc, name ? name : "(no filename)", why);
	size_t raw_len = 0, len;
	char *raw = gfs_raw_name(doc, &raw_len), *rel;
	gfs_error ignored;
	bool safe = name && gfs_mirror_local_path(name, lc->nprefix, raw, raw_len, &rel, &len, &ignored);
	free(raw);
	if (!safe)
		return;
	gfs_mirror_plan *p = lc->plan;
	GFS_GROW(p->held, p->nheld + 1, p->capheld, 16);
	p->held[p->nheld].rel = rel;
	p->held[p->nheld++].len = len;
}

/* Turns the newest revision of one name into a plan item, or refuses it. */
static void
finish_pending(struct load_ctx *lc)
{
	if (!lc->pending)
		return;
	bson_t *doc = lc->pending;
	lc->pending = NULL;
	gfs_file f;
	gfs_error why;
	if (lc->pending_bad || !gfs_file_parse(doc, &f, &why)) {
		hold(lc, doc, lc->pending_bad ? &lc->pending_why : &why);
		bson_destroy(doc);
		return;
	}
	const char *name = f.filename ? f.filename : "(no filename)";
	size_t raw_len = 0;
	char *raw = gfs_raw_name(doc, &raw_len);
	char *rel = NULL;
	size_t rel_len = 0;
	bool ok = check_filename(doc, &f, &why) &&
	          gfs_mirror_local_path(f.filename, lc->nprefix, raw, raw_len, &rel, &rel_len, &why);
	free(raw);
	if (!ok) {
		refuse(lc, name, &why);
		gfs_file_free(&f);
		bson_destroy(doc);
		return;
	}
	gfs_mirror_plan *p = lc->plan;
	GFS_GROW(p->items, p->count + 1, p->cap, 1024);
	struct gfs_mirror_item *it = &p->items[p->count++];
	memset(it, 0, sizeof *it);
	bson_iter_t mi;
	it->mtime_exact = bson_iter_init(&mi, doc) && bson_iter_find_descendant(&mi, "metadata.mtimeNs", &mi);
	it->mtime_ns = f.mtime_ns >= 0 ? f.mtime_ns : gfs_ms_to_ns(f.upload_date);
	it->mode = f.mode >= 0 ? (f.mode & 0777) : -1;
	it->rel = rel;
	it->rel_len = rel_len;
	/* Keep only what gfs_read needs; the document itself can go. */
	it->file = f;
	it->file.doc = NULL;
	it->file.content_type = NULL;
	free(f.content_type);
	bson_destroy(f.doc);
	bson_destroy(doc);
	p->total_bytes += (uint64_t)it->file.length;
}

/*
 * The listing comes in filename, then uploadDate order: the last of a run
 * of one name wins, a malformed one too (bad, why).
 */
static bool
listed(struct load_ctx *lc, const bson_t *doc, const gfs_error *bad)
{
	uint32_t len = 0;
	const char *name = doc_filename(doc, &len);
	/* Whole BSON strings: "a" and "a\0b" are different names. */
	if (lc->pending && name && lc->pending_name && len == lc->pending_len &&
	    memcmp(lc->pending_name, name, len) == 0) {
		bson_destroy(lc->pending);
		lc->pending = NULL;
	}
	finish_pending(lc);
	lc->pending = bson_copy(doc);
	lc->pending_name = doc_filename(lc->pending, &lc->pending_len);
	lc->pending_bad = bad != NULL;
	if (bad)
		lc->pending_why = *bad;
	return true;
}

static bool
on_listed(const gfs_file *f, void *ctx)
{
	return listed(ctx, f->doc, NULL);
}

static bool
on_listed_bad(const bson_t *doc, const char *name, const gfs_error *why, void *ctx)
{
	(void)name;
	return listed(ctx, doc, why);
}

static int
relcmp(const char *a, size_t al, const char *b, size_t bl)
{
	int c = memcmp(a, b, al < bl ? al : bl);
	if (c)
		return c;
	return al < bl ? -1 : al > bl;
}

static int
by_rel_cmp(const void *x, const void *y)
{
	const struct gfs_mirror_item *a = *(struct gfs_mirror_item *const *)x;
	const struct gfs_mirror_item *b = *(struct gfs_mirror_item *const *)y;
	return relcmp(a->rel, a->rel_len, b->rel, b->rel_len);
}

static void
sort_by_rel(gfs_mirror_plan *plan)
{
	free(plan->by_rel);
	plan->by_rel = NULL;
	if (!plan->count)
		return;
	plan->by_rel = gfs_xmalloc(plan->count * sizeof *plan->by_rel);
	for (size_t i = 0; i < plan->count; i++)
		plan->by_rel[i] = &plan->items[i];
	qsort(plan->by_rel, plan->count, sizeof *plan->by_rel, by_rel_cmp);
}

static int
held_cmp(const void *x, const void *y)
{
	const struct gfs_mirror_held *a = x, *b = y;
	return relcmp(a->rel, a->len, b->rel, b->len);
}

static void refuse_conflicts(struct load_ctx *lc, gfs_mirror_plan *plan);

bool
gfs_mirror_plan_load(gfs_session *s, const char *prefix, gfs_mirror_plan *plan,
                     gfs_mirror_refuse_fn refuse_fn, void *ctx, size_t *refused, gfs_error *err)
{
	struct load_ctx lc = {
		.plan = plan,
		.nprefix = gfs_prefix_normalize(prefix),
		.refuse = refuse_fn,
		.ctx = ctx,
		.refused = refused,
	};
	*refused = 0;
	bool ok = gfs_list(s, lc.nprefix, on_listed, on_listed_bad, &lc, err);
	if (ok)
		finish_pending(&lc);
	if (lc.pending)
		bson_destroy(lc.pending);
	free(lc.nprefix);
	if (!ok)
		return false;
	sort_by_rel(plan);
	if (plan->nheld)
		qsort(plan->held, plan->nheld, sizeof *plan->held, held_cmp);
	refuse_conflicts(&lc, plan);
	return true;
}

void
gfs_mirror_plan_free(gfs_mirror_plan *plan)
{
	for (size_t i = 0; i < plan->count; i++)
		item_free(&plan->items[i]);
	free(plan->items);
	free(plan->by_rel);
	for (size_t i = 0; i < plan->nheld; i++)
		free(plan->held[i].rel);
	free(plan->held);
	memset(plan, 0, sizeof *plan);
}

void
gfs_mirror_plan_filter(gfs_mirror_plan *plan,
                       bool (*keep)(const char *rel, size_t len, void *ctx), void *ctx)
{
	size_t n = 0;
	plan->total_bytes = 0;
	for (size_t i = 0; i < plan->count; i++) {
		struct gfs_mirror_item *it = &plan->items[i];
		if (!keep(it->rel, it->rel_len, ctx)) {
			item_free(it);
			continue;
		}
		plan->items[n++] = *it;
		plan->total_bytes += (uint64_t)it->file.length;
	}
	plan->count = n;
	sort_by_rel(plan);
}

/* Index of the first item whose rel is not less than key. */
static size_t
lower_bound(const gfs_mirror_plan *p, const char *key, size_t len)
{
	size_t lo = 0, hi = p->count;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct gfs_mirror_item *it = p->by_rel[mid];
		if (relcmp(it->rel, it->rel_len, key, len) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Index of the first held path not less than key. */
static size_t
held_lower_bound(const gfs_mirror_plan *p, const char *key, size_t len)
{
	size_t lo = 0, hi = p->nheld;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (relcmp(p->held[mid].rel, p->held[mid].len, key, len) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static bool
plan_has_file(const gfs_mirror_plan *p, const char *rel, size_t len)
{
	size_t i = lower_bound(p, rel, len);
	if (i < p->count && relcmp(p->by_rel[i]->rel, p->by_rel[i]->rel_len, rel, len) == 0)
		return true;
	i = held_lower_bound(p, rel, len);
	return i < p->nheld && relcmp(p->held[i].rel, p->held[i].len, rel, len) == 0;
}

/* True when some planned file lies beneath the directory rel. */
static bool
plan_has_dir(const gfs_mirror_plan *p, char *rel, size_t len)
{
	/* rel has room for one more byte: it is the sweep's path buffer. */
	char saved = rel[len];
	rel[len] = '/';
	size_t i = lower_bound(p, rel, len + 1);
	bool has = i < p->count && p->by_rel[i]->rel_len > len + 1 &&
	           memcmp(p->by_rel[i]->rel, rel, len + 1) == 0;
	size_t h = held_lower_bound(p, rel, len + 1);
	has = has || (h < p->nheld && p->held[h].len > len + 1 &&
	              memcmp(p->held[h].rel, rel, len + 1) == 0);
	rel[len] = saved;
	return has;
}

/* ---- local paths that collide ---------------------------------------- */

/*
 * Stored names that are distinct can still want the same local path (a
 * rawName that restores to another name's bytes), and a name can want as
 * its file a path that another name needs as a folder ("a" and "a/b").
 * Whichever was written first would make the other fail on every run, so
 * all the names involved are refused, each with the name it collides with.
 */
enum conflict_kind { CONFLICT_NONE, CONFLICT_SAME, CONFLICT_IS_DIR, CONFLICT_UNDER_FILE };

struct conflict {
	enum conflict_kind kind;
	const struct gfs_mirror_item *other;
};

static void
mark_conflict(struct conflict *c, const gfs_mirror_plan *p, const struct gfs_mirror_item *it,
              enum conflict_kind kind, const struct gfs_mirror_item *other)
{
	struct conflict *slot = &c[it - p->items];
	if (slot->kind != CONFLICT_NONE)
		return; /* one message per name: the first collision found */
	slot->kind = kind;
	slot->other = other;
}

/* Marks the file at by_rel[k] and every planned path beneath it as a folder. */
static bool
mark_beneath(struct conflict *c, const gfs_mirror_plan *p, size_t k)
{
	const struct gfs_mirror_item *it = p->by_rel[k];
	char key[GFS_SAFEPATH_MAX + 2];
	if (it->rel_len + 1 > GFS_SAFEPATH_MAX)
		return false; /* nothing checked can be beneath it */
	memcpy(key, it->rel, it->rel_len);
	key[it->rel_len] = '/';
	size_t klen = it->rel_len + 1;
	bool found = false;
	for (size_t j = lower_bound(p, key, klen); j < p->count; j++) {
		const struct gfs_mirror_item *under = p->by_rel[j];
		if (under->rel_len < klen || memcmp(under->rel, key, klen) != 0)
			break;
		mark_conflict(c, p, it, CONFLICT_IS_DIR, under);
		mark_conflict(c, p, under, CONFLICT_UNDER_FILE, it);
		found = true;
	}
	return found;
}

static bool
find_conflicts(struct conflict *c, const gfs_mirror_plan *p)
{
	bool found = false;
	for (size_t k = 0; k < p->count; k++) {
		const struct gfs_mirror_item *a = p->by_rel[k];
		if (k + 1 < p->count) {
			const struct gfs_mirror_item *b = p->by_rel[k + 1];
			if (relcmp(a->rel, a->rel_len, b->rel, b->rel_len) == 0) {
				mark_conflict(c, p, a, CONFLICT_SAME, b);
				mark_conflict(c, p, b, CONFLICT_SAME, a);
				found = true;
			}
		}
		found |= mark_beneath(c, p, k);
	}
	return found;
}

static void
conflict_error(gfs_error *why, const struct conflict *c)
{
	const char *other = item_name(c->other);
	switch (c->kind) {
	case CONFLICT_SAME:
		gfs_error_set(why, GFS_EINVAL, "its local path is also that of '%s'", other);
		break;
	case CONFLICT_IS_DIR:
		gfs_error_set(why, GFS_EINVAL, "its local path is also the folder of '%s'", other);
		break;
	case CONFLICT_UNDER_FILE:
		gfs_error_set(why, GFS_EINVAL, "a folder on its local path is also the file '%s'",
		              other);
		break;
	case CONFLICT_NONE:
		break;
	}
}

static void
refuse_conflicts(struct load_ctx *lc, gfs_mirror_plan *p)
{
	if (p->count < 2)
		return;
	struct conflict *c = gfs_xcalloc(p->count, sizeof *c);
	if (!find_conflicts(c, p)) {
		free(c);
		return;
	}
	/* Messages first, while the names they mention are all still there. */
	for (size_t i = 0; i < p->count; i++) {
		gfs_error why;
		if (c[i].kind == CONFLICT_NONE)
			continue;
		conflict_error(&why, &c[i]);
		refuse(lc, item_name(&p->items[i]), &why);
	}
	size_t kept = 0;
	for (size_t i = 0; i < p->count; i++) {
		if (c[i].kind == CONFLICT_NONE) {
			p->items[kept++] = p->items[i];
			continue;
		}
		p->total_bytes -= (uint64_t)p->items[i].file.length;
		item_free(&p->items[i]);
	}
	p->count = kept;
	free(c);
	sort_by_rel(p);
}

/* ---- the per-thread directory ---------------------------------------- */

struct gfs_mirror_dir {
	int rootfd;
	const struct gfs_mirror_opts *opts;
	char *rel;          /* the open directory, relative to rootfd */
	size_t len;
	int fd;             /* -1: none open */
	bool dirty;         /* a rename happened in it since the last fsync */
	bool sync_failed;   /* a directory left behind failed its fsync: */
	gfs_error sync_err; /* the first such, reported at close */
};

gfs_mirror_dir *
gfs_mirror_dir_new(int rootfd, const struct gfs_mirror_opts *opts)
{
	gfs_mirror_dir *d = gfs_xcalloc(1, sizeof *d);
	d->rootfd = rootfd;
	d->opts = opts;
	d->fd = -1;
	return d;
}

/*
 * A rename is durable once its directory is fsync'd. One fsync when the
 * thread leaves a folder, rather than one per file, keeps that promise for
 * the whole run at a fraction of the cost; a crash before it can lose only
 * renames, never leave a partial file.
 */
static bool
dir_release(gfs_mirror_dir *d, gfs_error *err)
{
	bool ok = true;
	if (d->fd >= 0 && d->dirty && d->opts->fsync && fsync(d->fd) < 0) {
		gfs_error_set(err, GFS_ELOCAL, "fsync of directory '%.*s': %s", (int)d->len,
		              d->len ? d->rel : ".", strerror(errno));
		ok = false;
	}
	if (d->fd >= 0)
		close(d->fd);
	d->fd = -1;
	d->dirty = false;
	free(d->rel);
	d->rel = NULL;
	d->len = 0;
	return ok;
}

bool
gfs_mirror_dir_close(gfs_mirror_dir *d, gfs_error *err)
{
	if (!d)
		return true;
	bool ok = dir_release(d, err);
	if (ok && d->sync_failed) {
		*err = d->sync_err;
		ok = false;
	}
	free(d);
	return ok;
}

static int
dir_get(gfs_mirror_dir *d, const char *rel, size_t len, bool create, gfs_error *err)
{
	if (d->fd >= 0 && d->len == len && memcmp(d->rel, rel, len) == 0)
		return d->fd;
	/*
	 * The fsync of the directory being left is no fault of the file that
	 * asked for another: kept for gfs_mirror_dir_close to report.
	 */
	gfs_error serr;
	if (!dir_release(d, &serr) && !d->sync_failed) {
		d->sync_err = serr;
		d->sync_failed = true;
	}
	int flags = create ? GFS_SAFEPATH_CREATE | (d->opts->fsync ? GFS_SAFEPATH_SYNC : 0) : 0;
	int fd = gfs_safepath_opendir(d->rootfd, rel, len, flags, err);
	if (fd < 0)
		return -1;
	d->rel = gfs_xmalloc(len + 1);
	memcpy(d->rel, rel, len);
	d->rel[len] = '\0';
	d->len = len;
	d->fd = fd;
	return fd;
}

/* ---- comparing ------------------------------------------------------- */

static const char *
leaf_of(const struct gfs_mirror_item *it, size_t *dirlen)
{
	*dirlen = gfs_safepath_dirlen(it->rel, it->rel_len);
	return it->rel + (*dirlen ? *dirlen + 1 : 0);
}

static void
prefix_name(gfs_error *err, const struct gfs_mirror_item *it)
{
	char msg[sizeof err->msg];
	memcpy(msg, err->msg, sizeof msg);
	gfs_error_set(err, err->code, "%s: %s", item_name(it), msg);
}

/* errno from opening a folder on a file's path: something that is not a directory is there. */
static bool
blocked(int e)
{
	return e == ENOTDIR || e == ELOOP;
}

static void
add_hint(gfs_error *err, const char *hint)
{
	char msg[sizeof err->msg];
	memcpy(msg, err->msg, sizeof msg);
	gfs_error_set(err, err->code, "%s (%s)", msg, hint);
}

/* The mtime to set, split without overflow even at the int64 limits. */
static void
times_of(const struct gfs_mirror_item *it, struct timespec ts[2])
{
	int64_t sec = it->mtime_ns / 1000000000, nsec = it->mtime_ns % 1000000000;
	if (nsec < 0) {
		sec--;
		nsec += 1000000000;
	}
	ts[0].tv_sec = 0;
	ts[0].tv_nsec = UTIME_OMIT;
	ts[1].tv_sec = (time_t)sec;
	ts[1].tv_nsec = (long)nsec;
}

/*
 * Compared as seconds and nanoseconds: a local mtime past 2262 would
 * overflow a count of nanoseconds.
 */
static bool
mtime_matches(const struct stat *st, const struct gfs_mirror_item *it)
{
	struct timespec ts[2];
	times_of(it, ts);
	if (st->st_mtim.tv_sec != ts[1].tv_sec)
		return false;
	if (it->mtime_exact)
		return st->st_mtim.tv_nsec == ts[1].tv_nsec;
	return st->st_mtim.tv_nsec / 1000000 == ts[1].tv_nsec / 1000000;
}

/*
 * Opens a regular file for reading. The entry may have been swapped for a
 * FIFO since it was checked, and opening a FIFO would block until a writer
 * came (forever, holding DIR's lock): O_NONBLOCK makes that open return, and
 * the type is checked on the descriptor itself.
 */
static int
open_regular(int pfd, const char *leaf)
{
	int fd = openat(pfd, leaf, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return -1;
	struct stat st;
	int e = 0, fl;
	if (fstat(fd, &st) < 0)
		e = errno;
	else if (!S_ISREG(st.st_mode))
		e = EAGAIN; /* changed since it was checked */
	else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
		e = errno;
	if (e) {
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

static bool
hash_local(int pfd, const char *leaf, const struct gfs_mirror_item *it, char hex[65],
           gfs_error *err)
{
	int fd = open_regular(pfd, leaf);
	if (fd < 0) {
		gfs_error_set(err, GFS_ELOCAL, "%s: cannot read the local file: %s", item_name(it),
		              strerror(errno));
		return false;
	}
	gfs_sha256 *h = gfs_sha256_new();
	static const size_t bufsz = 256 * 1024;
	uint8_t *buf = gfs_xmalloc(bufsz);
	ssize_t n;
	while ((n = read(fd, buf, bufsz)) > 0 || (n < 0 && errno == EINTR))
		if (n > 0)
			gfs_sha256_update(h, buf, (size_t)n);
	int e = errno;
	free(buf);
	close(fd);
	gfs_sha256_final(h, hex);
	if (n < 0) {
		gfs_error_set(err, GFS_ELOCAL, "%s: cannot read the local file: %s", item_name(it),
		              strerror(e));
		return false;
	}
	return true;
}

static bool
same_content(gfs_mirror_dir *d, gfs_session *s, int pfd, const char *leaf,
             const struct gfs_mirror_item *it, bool *same, gfs_error *err)
{
	(void)d;
	char local[65], stored[65];
	if (!hash_local(pfd, leaf, it, local, err))
		return false;
	if (it->file.sha256[0]) {
		memcpy(stored, it->file.sha256, sizeof stored);
	} else if (!gfs_read(s, &it->file, false, NULL, NULL, stored, err)) {
		return false;
	}
	*same = strcasecmp(local, stored) == 0;   /* stored hex may be upper case */
	return true;
}

bool
gfs_mirror_decide(gfs_mirror_dir *d, gfs_session *s, const struct gfs_mirror_item *it,
                  enum gfs_mirror_action *out, gfs_error *err)
{
	*out = GFS_MIRROR_WRITE;
	if (d->rootfd < 0)
		return true;
	size_t dl;
	const char *leaf = leaf_of(it, &dl);
	int pfd = dir_get(d, it->rel, dl, false, err);
	if (pfd < 0) {
		int e = errno;
		if (e == ENOENT || (blocked(e) && d->opts->clear))
			return true; /* written after what is in the way goes */
		prefix_name(err, it);
		if (blocked(e))
			add_hint(err, "--delete replaces it with a directory");
		return false;
	}
	struct stat st;
	if (fstatat(pfd, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno == ENOENT)
			return true;
		gfs_error_set(err, GFS_ELOCAL, "%s: %s", item_name(it), strerror(errno));
		return false;
	}
	if (S_ISDIR(st.st_mode)) {
		if (d->opts->clear)
			return true;
		gfs_error_set(err, GFS_ELOCAL, "%s: a directory is in the way (--delete replaces it)",
		              item_name(it));
		return false;
	}
	if (S_ISREG(st.st_mode) && d->opts->ignore_existing) {
		*out = GFS_MIRROR_SKIP;
		return true;
	}
	if (!S_ISREG(st.st_mode) || st.st_size != it->file.length)
		return true;
	if (d->opts->size_only) {
		*out = GFS_MIRROR_SKIP;
		return true;
	}
	bool same_time = mtime_matches(&st, it);
	if (!d->opts->checksum && !same_time)
		return true;
	if (d->opts->checksum) {
		bool same;
		if (!same_content(d, s, pfd, leaf, it, &same, err))
			return false;
		if (!same)
			return true;
	}
	bool same_mode = it->mode < 0 || (int32_t)(st.st_mode & 07777) == it->mode;
	if (same_time && same_mode) {
		*out = GFS_MIRROR_SKIP;
		return true;
	}
	/*
	 * A hard link shares its inode with names that may lie outside DIR:
	 * chmod or futimens would change those too. A write replaces only our
	 * link, by rename.
	 */
	*out = st.st_nlink > 1 ? GFS_MIRROR_WRITE : GFS_MIRROR_ATTRS;
	return true;
}

/* ---- writing --------------------------------------------------------- */

struct write_ctx {
	int fd;
	int error;          /* errno of a failed write, 0 when none */
	const atomic_int *stop;
};

static bool
write_chunk(const uint8_t *data, size_t len, void *ctx)
{
	struct write_ctx *w = ctx;
	if (w->stop && atomic_load(w->stop))
		return false;
	while (len > 0) {
		ssize_t n = write(w->fd, data, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			w->error = errno;
			return false;
		}
		data += n;
		len -= (size_t)n;
	}
	return true;
}

static bool
local_error(gfs_error *err, const struct gfs_mirror_item *it, const char *what, int e)
{
	gfs_error_set(err, GFS_ELOCAL, "%s: %s: %s", item_name(it), what, strerror(e));
	return false;
}

/* Sets mode and mtime on an open file; mode < 0 means the mode for new files. */
static bool
set_attrs(int fd, const struct gfs_mirror_item *it, mode_t create_mode, gfs_error *err)
{
	mode_t mode = it->mode >= 0 ? (mode_t)it->mode : create_mode;
	struct timespec ts[2];
	times_of(it, ts);
	if (fchmod(fd, mode) < 0)
		return local_error(err, it, "chmod", errno);
	if (futimens(fd, ts) < 0)
		return local_error(err, it, "set mtime", errno);
	return true;
}

/* ---- clearing the way ------------------------------------------------ */

static bool sweep_remove_tree(const struct gfs_mirror_opts *opts, int rootfd, int pfd,
                              const char *leaf, const char *rel, size_t len);

static void
report_removed(const struct gfs_mirror_opts *opts, enum gfs_mirror_sweep_kind kind,
               const char *rel, size_t len)
{
	if (opts->removed)
		opts->removed(kind, rel, len, NULL, opts->removed_ctx);
}

/*
 * Removes the first non-directory on the folder path rel[0..dl) of it. The
 * planning refused names whose folders are planned files, so what is there
 * is not planned. unlinkat without AT_REMOVEDIR never takes a directory,
 * so another thread that got there first and made the folder is harmless.
 */
static bool
clear_path(gfs_mirror_dir *d, const struct gfs_mirror_item *it, size_t dl, gfs_error *err)
{
	char seg[GFS_SAFEPATH_SEG_MAX + 1];
	int fd = fcntl(d->rootfd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return local_error(err, it, "duplicate a descriptor", errno);
	bool ok = true;
	for (size_t start = 0; start < dl;) {
		const char *slash = memchr(it->rel + start, '/', dl - start);
		size_t end = slash ? (size_t)(slash - it->rel) : dl;
		memcpy(seg, it->rel + start, end - start);
		seg[end - start] = '\0';
		struct stat st;
		if (fstatat(fd, seg, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno != ENOENT)
				ok = local_error(err, it, "stat a folder on its path", errno);
			break; /* missing: the walk that creates folders makes it */
		}
		if (!S_ISDIR(st.st_mode)) {
			if (d->opts->backup) {
				ok = gfs_backup_entry(d->opts->backup, fd, seg, it->rel, end, false, err);
				if (ok)
					report_removed(d->opts, GFS_MIRROR_DELETE, it->rel, end);
			} else if (unlinkat(fd, seg, 0) == 0) {
				report_removed(d->opts, GFS_MIRROR_DELETE, it->rel, end);
			} else if (errno != ENOENT && errno != EISDIR) {
				ok = local_error(err, it, "remove what is in the way", errno);
			}
			break;
		}
		int next = openat(fd, seg, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0) {
			ok = local_error(err, it, "open a folder on its path", errno);
			break;
		}
		close(fd);
		fd = next;
		start = end + 1;
	}
	close(fd);
	return ok;
}

/* Removes a directory tree standing where the file of it is to go. */
static bool
clear_leaf(gfs_mirror_dir *d, const struct gfs_mirror_item *it, int pfd, gfs_error *err)
{
	size_t dl;
	const char *leaf = leaf_of(it, &dl);
	struct stat st;
	if (fstatat(pfd, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
		return true; /* nothing there, or what the rename replaces */
	if (sweep_remove_tree(d->opts, d->rootfd, pfd, leaf, it->rel, it->rel_len))
		return true;
	gfs_error_set(err, GFS_ELOCAL, "%s: a directory is in the way and could not all be removed",
	              item_name(it));
	return false;
}

/* The target's directory, made if missing and, with clear, cleared of what is in the way. */
static int
target_dir(gfs_mirror_dir *d, const struct gfs_mirror_item *it, gfs_error *err)
{
	size_t dl;
	leaf_of(it, &dl);
	int pfd = dir_get(d, it->rel, dl, true, err);
	if (pfd < 0 && d->opts->clear && blocked(errno)) {
		if (!clear_path(d, it, dl, err))
			return -1;
		pfd = dir_get(d, it->rel, dl, true, err);
	}
	if (pfd < 0) {
		prefix_name(err, it);
		return -1;
	}
	if (d->opts->clear && !clear_leaf(d, it, pfd, err))
		return -1;
	return pfd;
}

/* A temporary file beside the target, ready for the content. */
struct temp {
	int pfd;            /* the target's directory (owned by the gfs_mirror_dir) */
	int fd;
	char name[64];
};

static bool
temp_open(gfs_mirror_dir *d, const struct gfs_mirror_item *it, struct temp *t, gfs_error *err)
{
	t->fd = -1;
	t->pfd = target_dir(d, it, err);
	if (t->pfd < 0)
		return false;
	for (int tries = 0; tries < 16 && t->fd < 0; tries++) {
		gfs_mirror_temp_name(t->name);
		t->fd = openat(t->pfd, t->name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (t->fd < 0 && errno != EEXIST)
			break;
	}
	if (t->fd < 0)
		return local_error(err, it, "cannot create a temporary file", errno);
	return true;
}

/*
 * With ok, gives the temporary file its mode and mtime, syncs it and renames
 * it over the target; otherwise (or when any of that fails) removes it.
 */
static bool
temp_finish(gfs_mirror_dir *d, const struct gfs_mirror_item *it, struct temp *t, bool ok,
            gfs_error *err)
{
	size_t dl;
	const char *leaf = leaf_of(it, &dl);
	if (ok)
		ok = set_attrs(t->fd, it, d->opts->create_mode, err);
	if (ok && d->opts->fsync && fsync(t->fd) < 0)
		ok = local_error(err, it, "fsync", errno);
	if (close(t->fd) < 0 && ok)
		ok = local_error(err, it, "close", errno);
	t->fd = -1;
	if (ok && renameat(t->pfd, t->name, t->pfd, leaf) < 0)
		ok = local_error(err, it, "rename into place", errno);
	if (!ok) {
		unlinkat(t->pfd, t->name, 0);
		return false;
	}
	d->dirty = true;
	return true;
}

/*
 * Read from a secondary, a file that looks damaged may only be behind: its
 * chunks are read again from the primary, whose word goes (issue 31). The
 * files document is the same by its _id (GridFS never rewrites one).
 */
static bool
again_on_primary(gfs_session *s, const struct gfs_mirror_item *it, struct temp *t,
                 struct write_ctx *w, gfs_error *err)
{
	if (ftruncate(t->fd, 0) < 0 || lseek(t->fd, 0, SEEK_SET) < 0) {
		w->error = errno;
		return false;
	}
	gfs_session *p = gfs_session_pop(s->conn);
	bool ok = gfs_session_to_primary(p, err) && gfs_read(p, &it->file, true, write_chunk, w, NULL, err);
	gfs_session_push(p);
	return ok;
}

/* Streams the stored file into the temporary t, checking every chunk and the sha256. */
static bool
fill_temp(gfs_mirror_dir *d, gfs_session *s, const struct gfs_mirror_item *it, struct temp *t,
          gfs_error *err)
{
	struct write_ctx w = {.fd = t->fd, .stop = d->opts->stop};
	bool ok = gfs_read(s, &it->file, true, write_chunk, &w, NULL, err);
	if (!ok && !w.error && err->code != GFS_ECANCELED && gfs_session_on_secondary(s))
		ok = again_on_primary(s, it, t, &w, err);
	if (!ok && w.error)
		local_error(err, it, "write", w.error);
	else if (!ok && err->code == GFS_ECANCELED)
		gfs_error_set(err, GFS_ECANCELED, "%s: interrupted", item_name(it));
	return ok;
}

static bool
write_file(gfs_mirror_dir *d, gfs_session *s, const struct gfs_mirror_item *it, gfs_error *err)
{
	struct temp t;
	if (!temp_open(d, it, &t, err))
		return false;
	bool ok = fill_temp(d, s, it, &t, err);
	return temp_finish(d, it, &t, ok, err);
}

/*
 * Fixes mode and mtime in place; the content is already right. A file
 * that gained a hard link since the decision is written instead, so that
 * the other name keeps its attributes.
 */
static bool
fix_attrs(gfs_mirror_dir *d, gfs_session *s, const struct gfs_mirror_item *it, gfs_error *err)
{
	size_t dl;
	const char *leaf = leaf_of(it, &dl);
	int pfd = dir_get(d, it->rel, dl, false, err);
	if (pfd < 0) {
		prefix_name(err, it);
		return false;
	}
	int fd = openat(pfd, leaf, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return local_error(err, it, "open", errno);
	struct stat st;
	bool ok = true;
	if (fstat(fd, &st) < 0)
		ok = local_error(err, it, "stat", errno);
	else if (!S_ISREG(st.st_mode))
		ok = local_error(err, it, "changed while mirroring", EAGAIN);
	if (ok && st.st_nlink > 1) {
		close(fd);
		return write_file(d, s, it, err);
	}
	if (ok)
		ok = set_attrs(fd, it, d->opts->create_mode, err);
	close(fd);
	return ok;
}

bool
gfs_mirror_apply(gfs_mirror_dir *d, gfs_session *s, const struct gfs_mirror_item *it,
                 enum gfs_mirror_action action, gfs_error *err)
{
	switch (action) {
	case GFS_MIRROR_WRITE: return write_file(d, s, it, err);
	case GFS_MIRROR_ATTRS: return fix_attrs(d, s, it, err);
	case GFS_MIRROR_SKIP: return true;
	}
	return true;
}

/* ---- one pass over all chunks -------------------------------------- */

enum gfs_read_strategy
gfs_mirror_choose_read(gfs_session *s, const gfs_read_caps *caps, size_t nwrite)
{
	int64_t total = -1;
	if (nwrite > GFS_READ_FEW) {
		bson_error_t berr;
		total = mongoc_collection_estimated_document_count(s->files, NULL, NULL, NULL, &berr);
	}
	return gfs_read_choose(caps, false, nwrite, total);
}

/*
 * Finishing a file (fsync, rename) costs a disk flush each; the one scan
 * thread hands complete files to a few finisher threads so that flushes
 * overlap with each other and with reading. Each finisher fsyncs a
 * directory once when it moves on to another, as gfs_mirror_dir does.
 */
struct finish_job {
	size_t idx;
	int fd;             /* the complete temporary file, mode and mtime set */
	int dirfd;          /* its directory: our own descriptor */
	char tmp[64];
};

struct gfs_mirror_finisher {
	pthread_mutex_t lock;
	pthread_cond_t more, room;
	struct finish_job *q;   /* a ring of cap jobs */
	size_t cap, head, count;
	bool closing;
	const gfs_mirror_plan *plan;
	gfs_mirror_done_fn done;
	void *ctx;
	pthread_t *tids;
	int n;
	gfs_error dir_err;      /* the first directory fsync that failed */
	bool dir_failed;
};

static bool
fin_pop(struct gfs_mirror_finisher *f, struct finish_job *job)
{
	pthread_mutex_lock(&f->lock);
	while (f->count == 0 && !f->closing)
		pthread_cond_wait(&f->more, &f->lock);
	bool got = f->count > 0;
	if (got) {
		*job = f->q[f->head];
		f->head = (f->head + 1) % f->cap;
		f->count--;
		pthread_cond_signal(&f->room);
	}
	pthread_mutex_unlock(&f->lock);
	return got;
}

static void
fin_push(struct gfs_mirror_finisher *f, const struct finish_job *job)
{
	pthread_mutex_lock(&f->lock);
	while (f->count == f->cap)
		pthread_cond_wait(&f->room, &f->lock);
	f->q[(f->head + f->count) % f->cap] = *job;
	f->count++;
	pthread_cond_signal(&f->more);
	pthread_mutex_unlock(&f->lock);
}

struct fin_dir {
	int fd;
	dev_t dev;
	ino_t ino;
	bool dirty;
};

static void
fin_dir_sync(struct gfs_mirror_finisher *f, struct fin_dir *fd)
{
	if (fd->fd < 0)
		return;
	if (fd->dirty && fsync(fd->fd) < 0) {
		pthread_mutex_lock(&f->lock);
		if (!f->dir_failed)
			gfs_error_set(&f->dir_err, GFS_ELOCAL, "fsync of a directory: %s", strerror(errno));
		f->dir_failed = true;
		pthread_mutex_unlock(&f->lock);
	}
	close(fd->fd);
	fd->fd = -1;
	fd->dirty = false;
}

/* Keeps job's directory as the current one (syncing the previous), or closes it. */
static void
fin_dir_note(struct gfs_mirror_finisher *f, struct fin_dir *cur, int dirfd, bool renamed)
{
	struct stat st;
	if (fstat(dirfd, &st) < 0) {
		close(dirfd);
		return;
	}
	if (cur->fd >= 0 && st.st_dev == cur->dev && st.st_ino == cur->ino) {
		close(dirfd);
	} else {
		fin_dir_sync(f, cur);
		cur->fd = dirfd;
		cur->dev = st.st_dev;
		cur->ino = st.st_ino;
	}
	cur->dirty |= renamed;
}

static void *
fin_thread(void *arg)
{
	struct gfs_mirror_finisher *f = arg;
	struct fin_dir cur = {.fd = -1};
	struct finish_job job;
	while (fin_pop(f, &job)) {
		const struct gfs_mirror_item *it = &f->plan->items[job.idx];
		size_t dl;
		const char *leaf = leaf_of(it, &dl);
		gfs_error err;
		bool ok = true;
		if (fsync(job.fd) < 0)
			ok = local_error(&err, it, "fsync", errno);
		if (close(job.fd) < 0 && ok)
			ok = local_error(&err, it, "close", errno);
		if (ok && renameat(job.dirfd, job.tmp, job.dirfd, leaf) < 0)
			ok = local_error(&err, it, "rename into place", errno);
		if (!ok)
			unlinkat(job.dirfd, job.tmp, 0);
		fin_dir_note(f, &cur, job.dirfd, ok);
		f->done(job.idx, ok ? NULL : &err, f->ctx);
	}
	fin_dir_sync(f, &cur);
	return NULL;
}

/* Frees a finisher whose threads have ended or never started. */
static void
fin_free(struct gfs_mirror_finisher *f)
{
	free(f->q);
	free(f->tids);
	pthread_mutex_destroy(&f->lock);
	pthread_cond_destroy(&f->more);
	pthread_cond_destroy(&f->room);
	free(f);
}

static struct gfs_mirror_finisher *
fin_start(const gfs_mirror_plan *plan, int n, gfs_mirror_done_fn done, void *ctx)
{
	struct gfs_mirror_finisher *f = gfs_xcalloc(1, sizeof *f);
	pthread_mutex_init(&f->lock, NULL);
	pthread_cond_init(&f->more, NULL);
	pthread_cond_init(&f->room, NULL);
	f->cap = (size_t)n * 4;
	f->q = gfs_xcalloc(f->cap, sizeof *f->q);
	f->tids = gfs_xcalloc((size_t)n, sizeof *f->tids);
	f->plan = plan;
	f->done = done;
	f->ctx = ctx;
	for (int i = 0; i < n; i++) {
		if (pthread_create(&f->tids[i], NULL, fin_thread, f) != 0)
			break;
		f->n++;
	}
	if (f->n == 0) {
		fin_free(f);
		return NULL; /* finish inline instead */
	}
	return f;
}

/* Finishes what is queued, stops the threads; false with err when a directory fsync failed. */
static bool
fin_stop(struct gfs_mirror_finisher *f, gfs_error *err)
{
	if (!f)
		return true;
	pthread_mutex_lock(&f->lock);
	f->closing = true;
	pthread_cond_broadcast(&f->more);
	pthread_mutex_unlock(&f->lock);
	for (int i = 0; i < f->n; i++)
		pthread_join(f->tids[i], NULL);
	bool ok = !f->dir_failed;
	if (!ok)
		*err = f->dir_err;
	fin_free(f);
	return ok;
}

/*
 * Sets mode and mtime on a complete temporary file and queues it for fsync
 * and rename. On failure the temporary file is still the caller's.
 */
static bool
fin_hand_off(struct gfs_mirror_finisher *f, gfs_mirror_dir *d, const struct gfs_mirror_item *it,
             size_t idx, struct temp *t, gfs_error *err)
{
	struct finish_job job = {.idx = idx, .fd = t->fd};
	memcpy(job.tmp, t->name, sizeof job.tmp);
	if (!set_attrs(t->fd, it, d->opts->create_mode, err))
		return false;
	job.dirfd = fcntl(t->pfd, F_DUPFD_CLOEXEC, 0);
	if (job.dirfd < 0)
		return local_error(err, it, "duplicate a descriptor", errno);
	t->fd = -1; /* the finisher owns it now */
	fin_push(f, &job);
	return true;
}

gfs_mirror_finisher *
gfs_mirror_finisher_start(const gfs_mirror_plan *plan, int threads, gfs_mirror_done_fn done,
                          void *ctx)
{
	return threads > 0 ? fin_start(plan, threads, done, ctx) : NULL;
}

bool
gfs_mirror_finisher_stop(gfs_mirror_finisher *f, gfs_error *err)
{
	return fin_stop(f, err);
}

bool
gfs_mirror_write_queued(gfs_mirror_dir *d, gfs_session *s, size_t idx,
                        gfs_mirror_finisher *f, gfs_error *err)
{
	const struct gfs_mirror_item *it = &f->plan->items[idx];
	struct temp t;
	if (!temp_open(d, it, &t, err))
		return false;
	bool ok = fill_temp(d, s, it, &t, err);
	if (ok && fin_hand_off(f, d, it, idx, &t, err))
		return true;
	close(t.fd);
	unlinkat(t.pfd, t.name, 0);
	return false;
}

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
	struct gfs_mirror_finisher *fin;   /* NULL: finish each file on the scan thread */
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
	leaf_of(entry_item(sc, e), &dl);
	gfs_error derr;
	int pfd = dir_get(sc->d, entry_item(sc, e)->rel, dl, false, &derr);
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

/* The first chunk of a file in its turn: its temporary file. */
static bool
scan_open(struct scan *sc, struct scan_entry *e)
{
	if (sc->open >= SCAN_OPEN_MAX) {
		scan_fail(sc, e, NULL);
		return false;
	}
	struct temp t;
	gfs_error err;
	if (!temp_open(sc->d, entry_item(sc, e), &t, &err)) {
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
	if (!gfs_chunk_data(doc, it->file.length, it->file.chunk_size, e->next, item_name(it), &data,
	                    &len, &err)) {
		scan_fail(sc, e, &err);
		return false;
	}
	e->next++;
	gfs_digest_update(e->h, data, len);
	struct write_ctx w = {.fd = e->fd};
	if (!write_chunk(data, len, &w)) {
		local_error(&err, it, "write", w.error);
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
		scan_fail(sc, e, &err);
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
	const char *name = item_name(item);
	int64_t expected = gfs_chunk_count(item->file.length, item->file.chunk_size);
	int64_t n;
	gfs_error err;
	if (gfs_chunk_n_place(doc, &n) != GFS_N_NUMBER) {
		gfs_error_set(&err, GFS_EBADDOC, "%s: chunk without a valid n", name);
		scan_fail(sc, e, &err);
		return;
	}
	/* A chunk after the last, or a second copy: damage, whenever it comes. */
	if (e->state == SE_COMPLETE || n < e->next || n >= expected || gfs_held_has(e->held, n)) {
		gfs_error_set(&err, GFS_EEXTRACHUNK, "%s: extra chunk n=%lld (expected %lld chunks)",
		              name, (long long)n, (long long)expected);
		scan_fail(sc, e, &err);
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
			gfs_error_set(&err, GFS_EMISSINGCHUNK, "%s: missing chunk n=%lld", item_name(it),
			              (long long)e->next);
			scan_fail(sc, e, &err);
		} else if (e->state == SE_OPEN) {
			scan_fail(sc, e, NULL); /* unfinished: its temporary file goes, no verdict */
		}
		sc->held_bytes -= gfs_held_free(&e->held);
		if (e->state != SE_COMPLETE)
			continue;
		e->state = SE_DONE;
		size_t dl;
		leaf_of(it, &dl);
		struct temp t = {.pfd = dir_get(sc->d, it->rel, dl, false, &err), .fd = -1};
		memcpy(t.name, e->tmp, sizeof t.name);
		if (t.pfd >= 0)
			t.fd = openat(t.pfd, t.name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
		if (t.pfd < 0) {
			prefix_name(&err, it);
		} else if (t.fd < 0) {
			local_error(&err, it, "reopen the temporary file", errno);
			unlinkat(t.pfd, t.name, 0);
		} else if (!sc->fin) {
			bool ok = temp_finish(sc->d, it, &t, true, &err);
			sc->done(e->idx, ok ? NULL : &err, sc->ctx);
			continue;
		} else if (fin_hand_off(sc->fin, sc->d, it, e->idx, &t, &err)) {
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
	if (finishers > 0 && d->opts->fsync)
		sc.fin = fin_start(plan, finishers, done, ctx);
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
	if (!fin_stop(sc.fin, &ferr) && ok) {
		*err = ferr;
		ok = false;
	}
	for (size_t i = 0; i < n; i++)
		bson_free(sc.entries[i].key);
	strmap_free(sc.map);
	free(sc.entries);
	return ok;
}

/* ---- sweeping -------------------------------------------------------- */


/*
 * Which mount a directory is on. The device tells file systems apart but
 * not a bind mount of a folder of the same file system; the mount id does,
 * where statx has it (Linux 5.8).
 */
struct mount_id {
	dev_t dev;
	uint64_t mnt;
	bool has_mnt;
};

static bool
mount_of(int fd, struct mount_id *id)
{
	struct statx stx;
	if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &stx) == 0) {
		id->dev = makedev(stx.stx_dev_major, stx.stx_dev_minor);
		id->has_mnt = (stx.stx_mask & STATX_MNT_ID) != 0;
		id->mnt = stx.stx_mnt_id;
		return true;
	}
	struct stat st;
	if (fstat(fd, &st) < 0)
		return false;
	id->dev = st.st_dev;
	id->has_mnt = false;
	return true;
}

static bool
same_mount(const struct mount_id *a, const struct mount_id *b)
{
	if (a->dev != b->dev)
		return false;
	return !a->has_mnt || !b->has_mnt || a->mnt == b->mnt;
}

struct sweep {
	const gfs_mirror_plan *plan;
	bool del, dry_run;
	gfs_mirror_sweep_fn fn;
	void *ctx;
	bool ok;
	struct mount_id root;   /* DIR's mount: other mounts beneath are left alone */
	gfs_backup *backup;     /* where deleted files go, or NULL */
	uint64_t files_kept;    /* non-directories left in place, for --max-delete */
	int depth;
	char path[GFS_SAFEPATH_MAX + GFS_SAFEPATH_SEG_MAX + 8];
};

static void
sweep_fail(struct sweep *sw, enum gfs_mirror_sweep_kind kind, size_t len, const char *what, int e)
{
	gfs_error err;
	gfs_error_set(&err, GFS_ELOCAL, "%.*s: %s: %s", (int)len, len ? sw->path : ".", what,
	              strerror(e));
	sw->ok = false;
	sw->fn(kind, sw->path, len, &err, sw->ctx);
}

/* Removes (or reports) one non-directory entry; true when it is gone. */
static bool
sweep_unlink(struct sweep *sw, int dirfd, const char *name, size_t len,
             enum gfs_mirror_sweep_kind kind)
{
	if (!sw->dry_run && kind == GFS_MIRROR_DELETE && sw->backup) {
		gfs_error err;
		if (!gfs_backup_entry(sw->backup, dirfd, name, sw->path, len, false, &err)) {
			sw->ok = false;
			sw->fn(kind, sw->path, len, &err, sw->ctx);
			return false;
		}
	} else if (!sw->dry_run && unlinkat(dirfd, name, 0) < 0 && errno != ENOENT) {
		sweep_fail(sw, kind, len, "cannot remove", errno);
		return false;
	}
	sw->fn(kind, sw->path, len, NULL, sw->ctx);
	return true;
}

static size_t sweep_dir(struct sweep *sw, int fd, size_t plen);

/*
 * Opens a subdirectory to sweep; -1 when it cannot be or must not be: a
 * mount point (another file system, perhaps a bind mount of something the
 * user cares about) is not ours to empty, and too deep a tree would run
 * out of descriptors.
 */
static int
sweep_open(struct sweep *sw, int dirfd, const char *name, size_t len)
{
	if (sw->depth >= GFS_MIRROR_DEPTH_MAX) {
		gfs_error err;
		/* The reason first: a path this deep does not fit in the message. */
		gfs_error_set(&err, GFS_ELOCAL, "not swept, more than %d levels deep: %.*s",
		              GFS_MIRROR_DEPTH_MAX, (int)len, sw->path);
		sw->ok = false;
		sw->fn(GFS_MIRROR_RMDIR, sw->path, len, &err, sw->ctx);
		return -1;
	}
	int sub = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sub < 0) {
		sweep_fail(sw, GFS_MIRROR_RMDIR, len, "cannot open", errno);
		return -1;
	}
	struct mount_id id;
	if (!mount_of(sub, &id)) {
		sweep_fail(sw, GFS_MIRROR_RMDIR, len, "cannot stat", errno);
		close(sub);
		return -1;
	}
	if (!same_mount(&id, &sw->root)) {
		close(sub);
		return -1;
	}
	return sub;
}

/* Sweeps a subdirectory, then removes it if it is left empty and unplanned. */
static bool
sweep_subdir(struct sweep *sw, int dirfd, const char *name, size_t len)
{
	int sub = sweep_open(sw, dirfd, name, len);
	if (sub < 0)
		return false;
	sw->depth++;
	size_t kept = sweep_dir(sw, sub, len);
	sw->depth--;
	if (!sw->del || kept > 0 || plan_has_dir(sw->plan, sw->path, len))
		return false;
	if (!sw->dry_run && unlinkat(dirfd, name, AT_REMOVEDIR) < 0) {
		if (errno == ENOTEMPTY || errno == EEXIST)
			return false;
		sweep_fail(sw, GFS_MIRROR_RMDIR, len, "cannot remove", errno);
		return false;
	}
	sw->fn(GFS_MIRROR_RMDIR, sw->path, len, NULL, sw->ctx);
	return true;
}

/* Sweeps one entry of the directory dirfd; true when it is gone. */
static bool
sweep_entry(struct sweep *sw, int dirfd, const struct dirent *de, size_t len)
{
	const char *name = de->d_name;
	size_t nl = strlen(name);
	unsigned char type = de->d_type;
	struct stat st;
	if (type == DT_UNKNOWN && fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
		type = S_ISDIR(st.st_mode) ? DT_DIR : DT_REG;
	if (type == DT_DIR)
		return sweep_subdir(sw, dirfd, name, len);
	if (gfs_mirror_is_temp_name(name, nl))
		return sweep_unlink(sw, dirfd, name, len, GFS_MIRROR_CLEAN);
	if (sw->del && !plan_has_file(sw->plan, sw->path, len))
		return sweep_unlink(sw, dirfd, name, len, GFS_MIRROR_DELETE);
	sw->files_kept++;
	return false;
}

/*
 * Sweeps the directory open as fd, which it takes over (one descriptor per
 * level, not two). Returns how many entries stay in it.
 */
static size_t
sweep_dir(struct sweep *sw, int fd, size_t plen)
{
	DIR *dp = fdopendir(fd);
	if (!dp) {
		sweep_fail(sw, GFS_MIRROR_RMDIR, plen, "cannot read directory", errno);
		close(fd);
		return 1;
	}
	size_t kept = 0;
	struct dirent *de;
	while ((errno = 0, de = readdir(dp)) != NULL) {
		const char *name = de->d_name;
		if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
			continue;
		size_t nl = strlen(name);
		size_t len = plen + (plen ? 1 : 0) + nl;
		if (len > GFS_SAFEPATH_MAX) {
			kept++; /* too deep to be anything mirror wrote */
			continue;
		}
		if (plen)
			sw->path[plen] = '/';
		memcpy(sw->path + len - nl, name, nl);
		sw->path[len] = '\0';
		kept += !sweep_entry(sw, fd, de, len);
		sw->path[plen] = '\0';
	}
	if (errno != 0)
		sweep_fail(sw, GFS_MIRROR_RMDIR, plen, "cannot read directory", errno);
	closedir(dp);
	return kept;
}

static void
removed_nowhere(enum gfs_mirror_sweep_kind kind, const char *rel, size_t len,
                const gfs_error *err, void *ctx)
{
	(void)kind;
	(void)rel;
	(void)len;
	(void)err;
	(void)ctx;
}

/*
 * Removes the directory leaf beneath pfd (rel[0..len) beneath DIR) with
 * everything in it, as the sweep with --delete would; true when it is gone.
 */
static bool
sweep_remove_tree(const struct gfs_mirror_opts *opts, int rootfd, int pfd, const char *leaf,
                  const char *rel, size_t len)
{
	struct mount_id root;
	if (!opts->plan || len > GFS_SAFEPATH_MAX || !mount_of(rootfd, &root))
		return false;
	struct sweep *sw = gfs_xcalloc(1, sizeof *sw);
	sw->root = root;
	sw->plan = opts->plan;
	sw->del = true;
	sw->fn = opts->removed ? opts->removed : removed_nowhere;
	sw->ctx = opts->removed_ctx;
	sw->backup = opts->backup;
	sw->ok = true;
	memcpy(sw->path, rel, len);
	sw->path[len] = '\0';
	bool gone = sweep_subdir(sw, pfd, leaf, len);
	free(sw);
	return gone;
}

static bool
sweep_run(struct sweep *sw, int rootfd)
{
	sw->ok = true;
	/* Its own open directory, read from the start: a dup would share a position another sweep moved. */
	int fd = openat(rootfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || !mount_of(fd, &sw->root)) {
		sweep_fail(sw, GFS_MIRROR_RMDIR, 0, "cannot read directory", errno);
		if (fd >= 0)
			close(fd);
	} else {
		sweep_dir(sw, fd, 0);
	}
	return sw->ok;
}

bool
gfs_mirror_sweep(int rootfd, const gfs_mirror_plan *plan, bool del, bool dry_run,
                 gfs_backup *backup, gfs_mirror_sweep_fn fn, void *ctx)
{
	struct sweep *sw = gfs_xcalloc(1, sizeof *sw);
	sw->plan = plan;
	sw->del = del;
	sw->dry_run = dry_run;
	sw->backup = backup;
	sw->fn = fn;
	sw->ctx = ctx;
	bool ok = sweep_run(sw, rootfd);
	free(sw);
	return ok;
}

static void
count_delete(enum gfs_mirror_sweep_kind kind, const char *rel, size_t len, const gfs_error *err,
             void *ctx)
{
	(void)rel;
	(void)len;
	if (kind == GFS_MIRROR_DELETE && !err)
		(*(uint64_t *)ctx)++;
}

bool
gfs_mirror_count_deletes(int rootfd, const gfs_mirror_plan *plan, uint64_t *deletes,
                         uint64_t *kept)
{
	struct sweep *sw = gfs_xcalloc(1, sizeof *sw);
	*deletes = 0;
	sw->plan = plan;
	sw->del = true;
	sw->dry_run = true;
	sw->fn = count_delete;
	sw->ctx = deletes;
	bool ok = sweep_run(sw, rootfd);
	*kept = sw->files_kept;
	free(sw);
	return ok;
}
