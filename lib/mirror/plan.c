/*
 * Mirror's plan: which files a run writes, and where.
 *
 * One listing of fs.files under the prefix (filename, then uploadDate
 * order) gives the newest revision of each name, the last of its run. Each
 * becomes an item: the fields gfs_read needs, its local path (localpath.c),
 * the mtime and mode to set. What cannot be mirrored is refused, told to the
 * caller and counted, never silently left out: an unsafe name, a name with a
 * NUL inside, a rawName that does not match, and a newest files document
 * that is malformed. The local path of the last is held: neither deleted by
 * the sweep nor taken by an older revision, since what is stored there may
 * well be intact.
 *
 * Distinct names can still collide on disk (the same local path through a
 * rawName, or one name's file being a folder on another's path): all the
 * names involved are refused, each with the name it collides with, since
 * whichever was written first would make the other fail on every run.
 *
 * The items sorted by local path (by_rel) answer the sweep's questions: is
 * this path planned, does this directory hold anything planned.
 */
#include <stdlib.h>
#include <string.h>

#include "../filename.h"
#include "../safepath.h"
#include "internal.h"

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

const char *
gfs_mirror_item_name(const struct gfs_mirror_item *it)
{
	return it->file.filename;
}

const char *
gfs_mirror_leaf(const struct gfs_mirror_item *it, size_t *dirlen)
{
	*dirlen = gfs_safepath_dirlen(it->rel, it->rel_len);
	return it->rel + (*dirlen ? *dirlen + 1 : 0);
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
gfs_mirror_plan_filter(gfs_mirror_plan *plan, gfs_mirror_select_fn keep, void *ctx)
{
	size_t n = 0;
	plan->select = keep;
	plan->select_ctx = ctx;
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

bool
gfs_mirror_plan_takes(const gfs_mirror_plan *p, const char *rel, size_t len)
{
	return !p->select || p->select(rel, len, p->select_ctx);
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

bool
gfs_mirror_plan_has_file(const gfs_mirror_plan *p, const char *rel, size_t len)
{
	size_t i = lower_bound(p, rel, len);
	if (i < p->count && relcmp(p->by_rel[i]->rel, p->by_rel[i]->rel_len, rel, len) == 0)
		return true;
	i = held_lower_bound(p, rel, len);
	return i < p->nheld && relcmp(p->held[i].rel, p->held[i].len, rel, len) == 0;
}

bool
gfs_mirror_plan_has_dir(const gfs_mirror_plan *p, char *rel, size_t len)
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
	const char *other = gfs_mirror_item_name(c->other);
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
		refuse(lc, gfs_mirror_item_name(&p->items[i]), &why);
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

