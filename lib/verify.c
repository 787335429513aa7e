/*
 * verify: one pass over the chunks of a bucket, hashing in parallel.
 *
 * The calling thread reads: it loads the selected files documents into a
 * table keyed by _id, then streams chunk documents sorted by files_id and n
 * (from one cursor, several, or per-file queries that lib/fetch.c runs on
 * other connections and hands back in order).
 * Every chunk is checked for number and size on the reader; its data is
 * copied into the queue of the hashing thread that owns that file (a file
 * stays with one thread, so its chunks are hashed in order). When a file's
 * last chunk has been hashed the thread hands the file back and the reader
 * gives its verdict, so callbacks always run on the calling thread.
 *
 * Memory: the table of files documents, the queues (bounded in bytes), and
 * per file in flight its hash state.
 */
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fetch.h"
#include "import.h"
#include "lock.h"
#include "strmap.h"
#include "verify.h"

/* Bytes of chunk data waiting in one hashing queue before the reader blocks. */
#define QUEUE_BYTES (16 * 1024 * 1024)
/* ...and items, so that tiny chunks cannot pile up without bound either. */
#define QUEUE_ITEMS 8192
#define DEFAULT_JOBS 4
#define MAX_THREADS 16

const char *
gfs_verify_kind_name(enum gfs_verify_kind k)
{
	switch (k) {
	case GFS_VK_MISSING_CHUNK: return "MISSING-CHUNK";
	case GFS_VK_WRONG_SIZE: return "WRONG-SIZE";
	case GFS_VK_EXTRA_CHUNK: return "EXTRA-CHUNK";
	case GFS_VK_CHECKSUM: return "CHECKSUM";
	case GFS_VK_UNVERIFIABLE: return "UNVERIFIABLE";
	case GFS_VK_ORPHAN_CHUNKS: return "ORPHAN-CHUNKS";
	case GFS_VK_INCOMPLETE: return "INCOMPLETE";
	case GFS_VK_BAD_DOC: return "BAD-DOC";
	case GFS_VK_IN_PROGRESS: return "IN-PROGRESS";
	}
	return "UNKNOWN";
}

/* ---- pure helpers ---------------------------------------------------- */

bool
gfs_verify_parse_percent(const char *s, double *out)
{
	char *end;
	if (!s || !*s)
		return false;
	double v = strtod(s, &end);
	if (end == s)
		return false;
	if (*end == '%')
		end++;
	if (*end || !(v > 0) || v > 100)
		return false;
	*out = v / 100.0;
	return true;
}

/*
 * The bytes that identify an id: its canonical form's BSON element with an
 * empty key, so that ids the server finds equal (Int64 77, Int32 77) share
 * one key and one hash.
 */
static void
id_key(const bson_value_t *id, bson_t *key)
{
	bson_value_t c = gfs_id_canonical(id);
	bson_init(key);
	bson_append_value(key, "", 0, &c);
}

bool
gfs_verify_sampled(const bson_value_t *id, double fraction, uint64_t seed)
{
	if (fraction >= 1.0)
		return true;
	bson_t key;
	id_key(id, &key);
	uint64_t h = gfs_fnv1a(bson_get_data(&key), key.len, GFS_FNV1A_BASIS ^ seed);
	bson_destroy(&key);
	/* The low bits of FNV are weak; mix before scaling. */
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	return (double)(h >> 11) / (double)(1ULL << 53) < fraction;
}

void
gfs_chunk_check_init(gfs_chunk_check *c, int64_t length, int32_t chunk_size)
{
	memset(c, 0, sizeof *c);
	c->length = length;
	c->chunk_size = chunk_size;
	c->expected = gfs_chunk_count(length, chunk_size);
	c->fail_n = -1;
	c->first_extra_n = -1;
}

static void
check_fail(gfs_chunk_check *c, enum gfs_verify_kind kind, int64_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void
check_fail(gfs_chunk_check *c, enum gfs_verify_kind kind, int64_t n, const char *fmt, ...)
{
	c->failed = true;
	c->fail_kind = kind;
	c->fail_n = n;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->fail_detail, sizeof c->fail_detail, fmt, ap);
	va_end(ap);
}

int
gfs_chunk_check_add(gfs_chunk_check *c, bool has_n, int64_t n, bool has_data, uint32_t len)
{
	if (!has_n) {
		if (!c->failed)
			check_fail(c, GFS_VK_BAD_DOC, -1, "a chunk has no numeric n");
		return 0;
	}
	/* Extra chunks do not stop the check: the rest may still be whole. */
	if (n >= c->expected || n < c->next || n < 0) {
		if (c->extras++ == 0)
			c->first_extra_n = n;
		if (n >= 0 && n < c->expected)
			c->dups++;
		return 0;
	}
	if (c->failed)
		return 0;
	if (n > c->next) {
		check_fail(c, GFS_VK_MISSING_CHUNK, c->next, "n=%lld", (long long)c->next);
		return 0;
	}
	if (!has_data) {
		check_fail(c, GFS_VK_BAD_DOC, n, "n=%lld has no binary data", (long long)n);
		return 0;
	}
	int32_t want = gfs_chunk_expected_len(c->length, c->chunk_size, n);
	if ((int64_t)len != want) {
		check_fail(c, GFS_VK_WRONG_SIZE, n, "n=%lld has %u bytes, expected %d", (long long)n,
		           len, want);
		return 0;
	}
	c->next++;
	return 1;
}

void
gfs_chunk_check_end(gfs_chunk_check *c)
{
	if (!c->failed && c->next < c->expected)
		check_fail(c, GFS_VK_MISSING_CHUNK, c->next, "n=%lld", (long long)c->next);
}

/* ---- the files table ------------------------------------------------- */

struct vfile {
	bson_value_t id;       /* copy, also for BAD-DOC entries */
	gfs_file f;            /* valid when !bad */
	bool bad;
	bool seen;             /* chunks arrived for it */
	char *bad_name;        /* BAD-DOC: filename if it had one */
	char bad_detail[512];
};

struct table {
	strmap *ids;           /* id_key() of _id to its vfile */
	struct vfile **list;   /* in _id order */
	size_t count, list_cap;
};

static bool
key_eq(const bson_t *a, const bson_t *b)
{
	return a->len == b->len && memcmp(bson_get_data(a), bson_get_data(b), a->len) == 0;
}

static struct vfile *
table_find(const struct table *t, const bson_t *key)
{
	return t->ids ? strmap_getn(t->ids, bson_get_data(key), key->len) : NULL;
}

/* Returns false when the id is already there (a duplicate _id cannot happen on MongoDB). */
static bool
table_add(struct table *t, struct vfile *v)
{
	if (!t->ids)
		t->ids = strmap_new(1024);
	bson_t key;
	id_key(&v->id, &key);
	void **slot = strmap_slot(t->ids, bson_get_data(&key), key.len);
	bson_destroy(&key);
	if (*slot)
		return false;
	*slot = v;
	GFS_GROW(t->list, t->count + 1, t->list_cap, 1024);
	t->list[t->count++] = v;
	return true;
}

static void
vfile_free(struct vfile *v)
{
	bson_value_destroy(&v->id);
	if (!v->bad)
		gfs_file_free(&v->f);
	free(v->bad_name);
	free(v);
}

static void
table_free(struct table *t)
{
	for (size_t i = 0; i < t->count; i++)
		vfile_free(t->list[i]);
	free(t->list);
	strmap_free(t->ids);
	memset(t, 0, sizeof *t);
}

/* ---- hashing threads ------------------------------------------------- */

/* One file in flight: its checker, and its hash state until the verdict. */
struct slot {
	struct vfile *vf;
	gfs_chunk_check check;
	EVP_MD_CTX *sha, *md5;     /* md5 only for legacy files without sha256 */
	char sha256[65], md5hex[33];
	size_t n_extra_ids;
	bson_value_t extra_ids[GFS_VERIFY_MAX_EXTRA_IDS];
	bool aborted;              /* the scan stopped inside this file: no verdict */
	struct slot *next_done;
};

struct item {
	struct slot *slot;
	uint8_t *data;            /* NULL with end set: the file's last item */
	uint32_t len;
	bool end;
	struct item *next;
};

struct hasher {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t can_take, can_put;
	struct item *head, *tail;
	size_t bytes, count;
	bool closing;
	struct verify *v;
};

struct verify {
	const gfs_verify_opts *o;
	gfs_verify_stats *st;
	gfs_conn *conn;
	gfs_session *s;
	gfs_read_caps caps;
	struct table t;
	struct hasher *h;
	int nh;
	int next_h;
	pthread_mutex_t done_mu;
	struct slot *done;         /* slots whose hashing finished, for the reader */
	size_t in_flight;
	pthread_cond_t done_cond;
	double last_progress;
	bool lookups_failed;            /* a second look failed: the backend is gone, stop asking */
};

static void
hex_digest(EVP_MD_CTX *ctx, char *hex)
{
	static const char digits[] = "0123456789abcdef";
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int n = 0;
	if (EVP_DigestFinal_ex(ctx, md, &n) != 1)
		abort();
	for (unsigned int i = 0; i < n; i++) {
		hex[2 * i] = digits[md[i] >> 4];
		hex[2 * i + 1] = digits[md[i] & 15];
	}
	hex[2 * n] = '\0';
}

static void
slot_finish_hash(struct slot *sl)
{
	hex_digest(sl->sha, sl->sha256);
	EVP_MD_CTX_free(sl->sha);
	sl->sha = NULL;
	if (sl->md5) {
		hex_digest(sl->md5, sl->md5hex);
		EVP_MD_CTX_free(sl->md5);
		sl->md5 = NULL;
	}
}

static void
hash_item(struct verify *v, struct item *it)
{
	struct slot *sl = it->slot;
	if (it->data) {
		if (EVP_DigestUpdate(sl->sha, it->data, it->len) != 1)
			abort();
		if (sl->md5 && EVP_DigestUpdate(sl->md5, it->data, it->len) != 1)
			abort();
	}
	if (!it->end)
		return;
	slot_finish_hash(sl);
	pthread_mutex_lock(&v->done_mu);
	sl->next_done = v->done;
	v->done = sl;
	pthread_cond_signal(&v->done_cond);
	pthread_mutex_unlock(&v->done_mu);
}

static void *
hasher_main(void *arg)
{
	struct hasher *h = arg;
	for (;;) {
		pthread_mutex_lock(&h->mu);
		while (!h->head && !h->closing)
			pthread_cond_wait(&h->can_take, &h->mu);
		struct item *it = h->head;
		if (!it) {
			pthread_mutex_unlock(&h->mu);
			return NULL;
		}
		h->head = it->next;
		if (!h->head)
			h->tail = NULL;
		h->bytes -= it->len;
		h->count--;
		pthread_cond_signal(&h->can_put);
		pthread_mutex_unlock(&h->mu);
		hash_item(h->v, it);
		free(it->data);
		free(it);
	}
}

static void
hasher_put(struct hasher *h, struct slot *sl, const uint8_t *data, uint32_t len, bool end)
{
	struct item *it = gfs_xcalloc(1, sizeof *it);
	it->slot = sl;
	it->end = end;
	if (data) {
		it->data = gfs_xmalloc(len);
		memcpy(it->data, data, len);
		it->len = len;
	}
	pthread_mutex_lock(&h->mu);
	while (h->head && (h->bytes + len > QUEUE_BYTES || h->count >= QUEUE_ITEMS))
		pthread_cond_wait(&h->can_put, &h->mu);
	if (h->tail)
		h->tail->next = it;
	else
		h->head = it;
	h->tail = it;
	h->bytes += len;
	h->count++;
	pthread_cond_signal(&h->can_take);
	pthread_mutex_unlock(&h->mu);
}

static int
default_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	/* One CPU reads and parses; on small machines the backend shares them too. */
	if (n <= 2)
		return 1;
	return n - 1 > 4 ? 4 : (int)(n - 1);
}

static bool
hashers_start(struct verify *v, int n)
{
	v->h = gfs_xcalloc((size_t)n, sizeof *v->h);
	for (int i = 0; i < n; i++) {
		struct hasher *h = &v->h[i];
		h->v = v;
		pthread_mutex_init(&h->mu, NULL);
		pthread_cond_init(&h->can_take, NULL);
		pthread_cond_init(&h->can_put, NULL);
		if (pthread_create(&h->thread, NULL, hasher_main, h) != 0) {
			pthread_mutex_destroy(&h->mu);
			pthread_cond_destroy(&h->can_take);
			pthread_cond_destroy(&h->can_put);
			v->nh = i;
			return false;
		}
		v->nh = i + 1;
	}
	return true;
}

static void
hashers_stop(struct verify *v)
{
	for (int i = 0; i < v->nh; i++) {
		struct hasher *h = &v->h[i];
		pthread_mutex_lock(&h->mu);
		h->closing = true;
		pthread_cond_signal(&h->can_take);
		pthread_mutex_unlock(&h->mu);
		pthread_join(h->thread, NULL);
		pthread_mutex_destroy(&h->mu);
		pthread_cond_destroy(&h->can_take);
		pthread_cond_destroy(&h->can_put);
	}
	free(v->h);
	v->h = NULL;
	v->nh = 0;
}

/* ---- verdicts -------------------------------------------------------- */

static int exists(mongoc_collection_t *coll, const char *field, const bson_value_t *id,
                  char **lock, gfs_error *err);

/*
 * Damage to a file whose document is gone by now is an import or rm that
 * removed it while verify read it (documents go first, then chunks): in
 * progress, not damage, and nothing to repair.
 */
static void
unless_removed_meanwhile(struct verify *v, gfs_verify_problem *p)
{
	if (!p->file || !p->id || p->kind == GFS_VK_IN_PROGRESS || p->kind == GFS_VK_BAD_DOC)
		return;
	if (v->lookups_failed)
		return;
	gfs_error err;
	gfs_error_clear(&err);
	int found = exists(v->s->files, "_id", p->id, NULL, &err);
	v->lookups_failed = found < 0;
	if (found != 0)
		return;
	size_t n = strlen(p->detail);
	snprintf(p->detail + n, sizeof p->detail - n, "%s%s: removed while verify ran",
	         n ? " " : "", gfs_verify_kind_name(p->kind));
	p->kind = GFS_VK_IN_PROGRESS;
}

static void
report(struct verify *v, gfs_verify_problem *p)
{
	unless_removed_meanwhile(v, p);
	if (p->kind == GFS_VK_IN_PROGRESS)
		v->st->in_progress++;
	else
		v->st->problems++;
	v->st->by_kind[p->kind]++;
	if (v->o->on_problem)
		v->o->on_problem(p, v->o->ctx);
}

static void
problem_init(gfs_verify_problem *p, enum gfs_verify_kind kind, const struct vfile *vf)
{
	memset(p, 0, sizeof *p);
	p->kind = kind;
	p->n = -1;
	if (vf) {
		p->id = &vf->id;
		p->filename = vf->bad ? vf->bad_name : vf->f.filename;
		p->file = vf->bad ? NULL : &vf->f;
	}
}

static void
slot_free(struct slot *sl)
{
	if (sl->sha)
		EVP_MD_CTX_free(sl->sha);
	if (sl->md5)
		EVP_MD_CTX_free(sl->md5);
	for (size_t i = 0; i < sl->n_extra_ids; i++)
		bson_value_destroy(&sl->extra_ids[i]);
	free(sl);
}

/* Everything known about one file is in: report what is wrong with it, once per fault. */
static void
verdict(struct verify *v, struct slot *sl)
{
	const gfs_file *f = &sl->vf->f;
	gfs_chunk_check *c = &sl->check;
	gfs_verify_problem p;
	gfs_verify_file res = {.file = f};
	bool hash_ok = false;

	/* Chunks not read are not missing: a half-read file gets no verdict at all. */
	if (sl->aborted)
		return;
	v->st->files_checked++;
	if (c->failed) {
		problem_init(&p, c->fail_kind, sl->vf);
		p.n = c->fail_n;
		snprintf(p.detail, sizeof p.detail, "%s", c->fail_detail);
		report(v, &p);
	} else {
		memcpy(res.sha256, sl->sha256, sizeof res.sha256);
		/* The rule get, mirror and serve apply too: one verdict on what is intact. */
		enum gfs_check rule = gfs_integrity_rule(f);
		bool sha = rule == GFS_CHECK_SHA256;
		const char *want = sha ? f->sha256 : f->md5;
		const char *got = sha ? sl->sha256 : sl->md5hex;
		gfs_error cerr;
		if (!gfs_integrity_check(f, sl->sha256, sl->md5hex, &cerr)) {
			problem_init(&p, GFS_VK_CHECKSUM, sl->vf);
			snprintf(p.detail, sizeof p.detail, "%s %s, stored %s", sha ? "sha256" : "md5", got,
			         want);
			memcpy(p.actual, got, strlen(got) + 1);
			report(v, &p);
		} else if (rule != GFS_CHECK_NONE) {
			hash_ok = true;
			res.verified = true;
		} else if (f->length > 0) {
			problem_init(&p, GFS_VK_UNVERIFIABLE, sl->vf);
			snprintf(p.detail, sizeof p.detail, "no metadata.sha256 or md5");
			report(v, &p);
			hash_ok = true;   /* complete, just not provably right */
		} else {
			hash_ok = true;   /* nothing stored, nothing to be wrong */
		}
	}
	if (c->extras) {
		problem_init(&p, GFS_VK_EXTRA_CHUNK, sl->vf);
		p.n = c->first_extra_n;
		p.count = c->extras;
		p.data_intact = !c->failed && hash_ok;
		p.verified = res.verified;
		p.chunk_count = c->expected;
		p.dups = c->dups;
		p.n_extra_ids = sl->n_extra_ids;
		p.extra_ids = sl->extra_ids;
		snprintf(p.detail, sizeof p.detail, "n=%lld (%lld extra, file has %lld chunks)",
		         (long long)c->first_extra_n, (long long)c->extras, (long long)c->expected);
		report(v, &p);
	}
	res.data_whole = !c->failed && hash_ok;
	res.intact = res.data_whole && !c->extras;
	if (v->o->on_file)
		v->o->on_file(&res, v->o->ctx);
}

static struct slot *
slot_new(struct vfile *vf)
{
	struct slot *sl = gfs_xcalloc(1, sizeof *sl);
	sl->vf = vf;
	gfs_chunk_check_init(&sl->check, vf->f.length, vf->f.chunk_size);
	sl->sha = EVP_MD_CTX_new();
	if (!sl->sha || EVP_DigestInit_ex(sl->sha, EVP_sha256(), NULL) != 1)
		abort();
	if (gfs_integrity_rule(&vf->f) == GFS_CHECK_MD5) {
		sl->md5 = EVP_MD_CTX_new();
		if (!sl->md5 || EVP_DigestInit_ex(sl->md5, EVP_md5(), NULL) != 1)
			abort();
	}
	return sl;
}

static void
progress(struct verify *v, bool force)
{
	if (!v->o->on_progress)
		return;
	double now = gfs_mono_seconds();
	if (!force && now - v->last_progress < 0.1)
		return;
	v->last_progress = now;
	v->o->on_progress(v->st->files_checked, v->st->bytes, v->o->ctx);
}

/* Gives verdicts on the files whose hashing finished; wait: until none is in flight. */
static void
drain(struct verify *v, bool wait)
{
	pthread_mutex_lock(&v->done_mu);
	while (wait && v->in_flight > 0) {
		struct slot *list = v->done;
		v->done = NULL;
		if (!list) {
			pthread_cond_wait(&v->done_cond, &v->done_mu);
			continue;
		}
		pthread_mutex_unlock(&v->done_mu);
		for (struct slot *sl = list, *nx; sl; sl = nx) {
			nx = sl->next_done;
			verdict(v, sl);
			slot_free(sl);
			v->in_flight--;
		}
		pthread_mutex_lock(&v->done_mu);
	}
	struct slot *list = v->done;
	v->done = NULL;
	pthread_mutex_unlock(&v->done_mu);
	for (struct slot *sl = list, *nx; sl; sl = nx) {
		nx = sl->next_done;
		verdict(v, sl);
		slot_free(sl);
		v->in_flight--;
	}
	progress(v, false);
}

/* ---- reading --------------------------------------------------------- */

/* The group of consecutive chunks with one files_id. */
struct group {
	bool active;
	bson_t key;                /* id_key() of files_id */
	bson_value_t files_id;
	struct vfile *vf;          /* NULL: orphans (or a file not selected) */
	bool skip;                 /* a BAD-DOC file, or a file not in the sample */
	struct slot *sl;
	struct hasher *h;
	int64_t chunks, bytes;     /* for orphans */
};

/*
 * 1: a document whose field equals id (as the server matches) is in coll;
 * 0: none; -1: error. lock (may be NULL) gets a copy of that document's
 * "lock" field, which a put's upload marker names its own lock in.
 */
static int
exists(mongoc_collection_t *coll, const char *field, const bson_value_t *id, char **lock,
       gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, proj;
	gfs_id_filter(&filter, field, id);
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "projection", &proj);
	BSON_APPEND_INT32(&proj, "_id", 1);
	BSON_APPEND_INT32(&proj, "lock", 1);
	bson_append_document_end(&opts, &proj);
	BSON_APPEND_INT64(&opts, "limit", 1);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(coll, &filter, &opts, NULL);
	bson_destroy(&filter);
	bson_destroy(&opts);
	const bson_t *doc;
	bson_iter_t it;
	int rc = mongoc_cursor_next(cur, &doc) ? 1 : 0;
	if (rc && lock && bson_iter_init_find(&it, doc, "lock") && BSON_ITER_HOLDS_UTF8(&it))
		*lock = gfs_xstrdup(bson_iter_utf8(&it, NULL));
	if (!gfs_cursor_done(cur, "look up a files_id", err))
		rc = -1;
	return rc;
}

/* Who is at work on chunks whose marker's writer is alive. */
static const char *
live_writer(const bson_t *marker)
{
	bson_iter_t it;
	bool put = bson_iter_init_find(&it, marker, "lock") && BSON_ITER_HOLDS_UTF8(&it) &&
	           strcmp(bson_iter_utf8(&it, NULL), GFS_IMPORT_LOCK) != 0;
	if (!bson_has_field(marker, "deleting"))
		return put ? "a put" : "an import";
	return strcmp(gfs_marker_verb(marker), "import") == 0 ? "an import" : "a live writer";
}

/*
 * Chunks with no files document in the table: in progress (p->kind set to
 * GFS_VK_IN_PROGRESS) or orphans, with why in p->detail's tail. The marker
 * is looked for before the files document, and whether the chunks are still
 * there last: see verify.h. Whether a marker's writer is alive, and who
 * finishes its work when it is not, are lib/write.c's (gfs_marker_live), as
 * the runs that finish it judge; --repair holds the import lock, so import's
 * markers are left over then.
 */
static void
judge_orphans(struct verify *v, const bson_value_t *fid, gfs_verify_problem *p)
{
	size_t n = strlen(p->detail);
	char *tail = p->detail + n;
	size_t room = sizeof p->detail - n;
	if (v->lookups_failed) {
		snprintf(tail, room, " (whether an upload is in progress is unknown: the backend "
		         "did not answer)");
		return;
	}
	gfs_error err;
	gfs_error_clear(&err);
	bson_t m;
	int found = gfs_marker_find(v->s, fid, &m, &err);
	int live = found > 0 ? gfs_marker_live(v->s, &m, v->o->own_import_lock ? GFS_IMPORT_LOCK : NULL,
	                                       &err)
	                     : 0;
	int file = exists(v->s->files, "_id", fid, NULL, &err);
	int still = file == 0 && live == 0 ? exists(v->s->chunks, "files_id", fid, NULL, &err) : 1;
	v->lookups_failed = found < 0 || live < 0 || file < 0 || still < 0;
	if (file > 0) {
		p->kind = GFS_VK_IN_PROGRESS;
		snprintf(tail, room, ": its files document was written while verify ran");
	} else if (live > 0) {
		p->kind = GFS_VK_IN_PROGRESS;
		snprintf(tail, room, ": %s is %s it", live_writer(&m),
		         bson_has_field(&m, "deleting") ? "removing" : "uploading");
	} else if (still == 0) {
		p->kind = GFS_VK_IN_PROGRESS;
		snprintf(tail, room, ": removed while verify ran");
	} else if (found > 0 && live == 0) {
		char why[300];
		gfs_marker_left_by(&m, why, sizeof why);
		snprintf(tail, room, ": %s", why);
	} else if (v->lookups_failed) {
		snprintf(tail, room, " (whether an upload is in progress is unknown: %s)", err.msg);
	}
	if (found > 0)
		bson_destroy(&m);
}

/* complete: all the group's chunks were read (the scan did not stop inside it). */
static void
group_end(struct verify *v, struct group *g, bool complete)
{
	if (!g->active)
		return;
	if (g->sl) {
		if (complete)
			gfs_chunk_check_end(&g->sl->check);
		else
			g->sl->aborted = true;
		hasher_put(g->h, g->sl, NULL, 0, true);
		g->sl = NULL;
	} else if (!g->vf && !g->skip && complete) {
		gfs_verify_problem p;
		problem_init(&p, GFS_VK_ORPHAN_CHUNKS, NULL);
		p.id = &g->files_id;
		p.count = g->chunks;
		p.bytes = g->bytes;
		snprintf(p.detail, sizeof p.detail, "count=%lld bytes=%lld", (long long)g->chunks,
		         (long long)g->bytes);
		judge_orphans(v, &g->files_id, &p);
		report(v, &p);
	}
	bson_destroy(&g->key);
	bson_value_destroy(&g->files_id);
	memset(g, 0, sizeof *g);
}

static void
group_begin(struct verify *v, struct group *g, const bson_value_t *files_id, bson_t *key)
{
	g->active = true;
	g->key = *key;             /* takes ownership */
	bson_value_copy(files_id, &g->files_id);
	g->vf = table_find(&v->t, key);
	if (!g->vf) {
		/*
		 * Only a scan of the whole bucket can call chunks orphans: under a
		 * prefix or sample they may belong to a file not selected.
		 */
		g->skip = !v->st->orphans_checked;
		return;
	}
	g->vf->seen = true;
	if (g->vf->bad) {
		g->skip = true;
		return;
	}
	g->sl = slot_new(g->vf);
	g->h = &v->h[v->next_h];
	v->next_h = (v->next_h + 1) % v->nh;
	v->in_flight++;
}

static void
note_extra_id(struct slot *sl, const bson_t *doc)
{
	bson_iter_t it;
	if (sl->n_extra_ids >= GFS_VERIFY_MAX_EXTRA_IDS || !bson_iter_init_find(&it, doc, "_id"))
		return;
	bson_value_copy(bson_iter_value(&it), &sl->extra_ids[sl->n_extra_ids++]);
}

static void
chunk(struct verify *v, struct group *g, const bson_t *doc)
{
	bson_iter_t it;
	bool has_data = false;
	int64_t n;
	bool has_n = gfs_chunk_n(doc, &n);
	if (!has_n)
		n = -1;
	uint32_t len = 0;
	const uint8_t *data = NULL;
	if (bson_iter_init_find(&it, doc, "data") && BSON_ITER_HOLDS_BINARY(&it)) {
		bson_subtype_t sub;
		bson_iter_binary(&it, &sub, &len, &data);
		has_data = true;
	}
	v->st->chunks++;
	if (!g->vf || g->skip) {
		g->chunks++;
		g->bytes += len;
		return;
	}
	v->st->bytes += len;
	int64_t dups = g->sl->check.dups;
	if (gfs_chunk_check_add(&g->sl->check, has_n, n, has_data, len) == 1)
		hasher_put(g->h, g->sl, data, len, false);
	else if (g->sl->check.dups > dups)
		note_extra_id(g->sl, doc);
}

/* One chunk of a pass: it joins the group of chunks with its files_id, or starts one. */
static void
feed(struct verify *v, struct group *g, const bson_t *doc)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, doc, "files_id")) {
		/* Not a chunk of anything: count it as an orphan group of its own. */
		gfs_verify_problem p;
		problem_init(&p, GFS_VK_ORPHAN_CHUNKS, NULL);
		p.count = 1;
		snprintf(p.detail, sizeof p.detail, "a chunk without files_id");
		if (v->st->orphans_checked)
			report(v, &p);
		return;
	}
	const bson_value_t *fid = bson_iter_value(&it);
	bson_t key;
	id_key(fid, &key);
	if (g->active && key_eq(&g->key, &key)) {
		bson_destroy(&key);
	} else {
		group_end(v, g, true);
		group_begin(v, g, fid, &key);
	}
	chunk(v, g, doc);
	drain(v, false);
}

/* Streams one cursor of chunks sorted by files_id, n. */
static bool
stream(struct verify *v, const bson_t *filter, int32_t batch, gfs_error *err)
{
	bson_t opts = BSON_INITIALIZER, sort;
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &sort);
	BSON_APPEND_INT32(&sort, "files_id", 1);
	BSON_APPEND_INT32(&sort, "n", 1);
	bson_append_document_end(&opts, &sort);
	BSON_APPEND_INT32(&opts, "batchSize", batch);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(v->s->chunks, filter, &opts, NULL);
	bson_destroy(&opts);

	struct group g;
	memset(&g, 0, sizeof g);
	const bson_t *doc;
	bool ok = true;
	while (mongoc_cursor_next(cur, &doc)) {
		if (v->o->stop && *v->o->stop) {
			gfs_error_set(err, GFS_ECANCELED, "verify interrupted");
			ok = false;
			break;
		}
		feed(v, &g, doc);
	}
	if (!gfs_cursor_done(cur, "read chunks", err))
		ok = false;
	/*
	 * Always end the group: its slot must reach the hasher to be freed. After
	 * an interruption or a cursor error it may be only partly read.
	 */
	group_end(v, &g, ok);
	return ok;
}

/* ---- loading the files documents -------------------------------------- */

static void
add_bad(struct verify *v, const bson_t *doc, const gfs_error *perr)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, doc, "_id")) {
		gfs_verify_problem p;
		problem_init(&p, GFS_VK_BAD_DOC, NULL);
		snprintf(p.detail, sizeof p.detail, "%s", perr->msg);
		report(v, &p);
		return;
	}
	struct vfile *vf = gfs_xcalloc(1, sizeof *vf);
	vf->bad = true;
	bson_value_copy(bson_iter_value(&it), &vf->id);
	if (bson_iter_init_find(&it, doc, "filename") && BSON_ITER_HOLDS_UTF8(&it))
		vf->bad_name = gfs_xstrdup(bson_iter_utf8(&it, NULL));
	/* The parser's message names the file; keep only its reason. */
	const char *reason = strstr(perr->msg, ": ");
	snprintf(vf->bad_detail, sizeof vf->bad_detail, "%s", reason ? reason + 2 : perr->msg);
	if (!table_add(&v->t, vf))
		vfile_free(vf);
}

/* One files document into the table (or, malformed, as BAD-DOC), when it is in the sample. */
static void
add_doc(struct verify *v, const bson_t *doc, double sample, int32_t *max_chunk)
{
	gfs_error perr;
	struct vfile *vf = gfs_xcalloc(1, sizeof *vf);
	if (!gfs_file_parse(doc, &vf->f, &perr)) {
		free(vf);
		add_bad(v, doc, &perr);
		return;
	}
	bson_value_copy(&vf->f.id, &vf->id);
	/* $sample may return a document twice: the table keeps one. */
	if (!gfs_verify_sampled(&vf->id, sample, v->o->seed) || !table_add(&v->t, vf)) {
		vfile_free(vf);
		return;
	}
	int32_t longest = vf->f.length < vf->f.chunk_size ? (int32_t)vf->f.length : vf->f.chunk_size;
	if (longest > *max_chunk)
		*max_chunk = longest;
	v->st->total_bytes += (uint64_t)vf->f.length;
}

/*
 * A sample drawn by the server: aggregate's $sample reads only the
 * documents it returns (MongoDB picks them with a random cursor when they
 * are under 5 % of the collection). NULL when the server has no $sample,
 * or the bucket's size is unknown: then every files document is read and
 * the sample drawn here.
 */
static mongoc_cursor_t *
sample_cursor(struct verify *v, double fraction)
{
	if (!gfs_read_has_sample(v->s))
		return NULL;
	bson_error_t berr;
	int64_t all = mongoc_collection_estimated_document_count(v->s->files, NULL, NULL, NULL, &berr);
	if (all <= 0)
		return NULL;
	double want = fraction * (double)all;
	int64_t size = (int64_t)want;
	if ((double)size < want || size == 0)
		size++;
	bson_t pipeline = BSON_INITIALIZER, stage, spec, opts = BSON_INITIALIZER;
	BSON_APPEND_DOCUMENT_BEGIN(&pipeline, "0", &stage);
	BSON_APPEND_DOCUMENT_BEGIN(&stage, "$sample", &spec);
	BSON_APPEND_INT64(&spec, "size", size);
	bson_append_document_end(&stage, &spec);
	bson_append_document_end(&pipeline, &stage);
	BSON_APPEND_INT32(&opts, "batchSize", 1000);
	mongoc_cursor_t *cur =
	    mongoc_collection_aggregate(v->s->files, MONGOC_QUERY_NONE, &pipeline, &opts, NULL);
	bson_destroy(&pipeline);
	bson_destroy(&opts);
	v->st->sampled_by_server = true;
	return cur;
}

/*
 * The selected files documents. A prefix is a range on filename, which the
 * GridFS index {filename: 1, uploadDate: 1} serves on MongoDB.
 */
static bool
load_files(struct verify *v, int32_t *max_chunk, gfs_error *err)
{
	double sample = v->o->sample > 0 ? v->o->sample : 1.0;
	bool prefix = v->o->prefix && *v->o->prefix;
	mongoc_cursor_t *cur = sample < 1.0 && !prefix ? sample_cursor(v, sample) : NULL;
	if (cur) {
		sample = 1.0;   /* every document returned is in the sample */
	} else {
		bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, sort;
		gfs_prefix_filter(&filter, v->o->prefix);
		BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &sort);
		BSON_APPEND_INT32(&sort, "_id", 1);
		bson_append_document_end(&opts, &sort);
		BSON_APPEND_INT32(&opts, "batchSize", 1000);
		cur = mongoc_collection_find_with_opts(v->s->files, &filter, &opts, NULL);
		bson_destroy(&filter);
		bson_destroy(&opts);
	}
	const bson_t *doc;
	*max_chunk = 1;
	while (mongoc_cursor_next(cur, &doc))
		add_doc(v, doc, sample, max_chunk);
	bool ok = gfs_cursor_done(cur, "read files documents", err);
	v->st->files = v->t.count;
	return ok;
}

/* BAD-DOC entries, and files that no chunk belonged to. */
static void
unseen_files(struct verify *v)
{
	for (size_t i = 0; i < v->t.count; i++) {
		struct vfile *vf = v->t.list[i];
		gfs_verify_problem p;
		if (vf->bad) {
			problem_init(&p, GFS_VK_BAD_DOC, vf);
			snprintf(p.detail, sizeof p.detail, "%s", vf->bad_detail);
			report(v, &p);
			continue;
		}
		if (vf->seen)
			continue;
		if (vf->f.length > 0) {
			v->st->files_checked++;
			problem_init(&p, GFS_VK_INCOMPLETE, vf);
			snprintf(p.detail, sizeof p.detail, "length=%lld, no chunks",
			         (long long)vf->f.length);
			report(v, &p);
			if (v->o->on_file) {
				gfs_verify_file res = {.file = &vf->f};
				v->o->on_file(&res, v->o->ctx);
			}
			continue;
		}
		/* An empty file: its verdict needs no chunk. */
		struct slot *sl = slot_new(vf);
		slot_finish_hash(sl);
		verdict(v, sl);
		slot_free(sl);
	}
}

/* Chunks of the selected files, by $in queries over batches of their ids. */
static bool
stream_batched(struct verify *v, int32_t batch, gfs_error *err)
{
	size_t per = v->o->ids_per_batch > 0 ? (size_t)v->o->ids_per_batch : gfs_read_batch_ids(&v->caps);
	for (size_t i = 0; i < v->t.count; i += per) {
		bson_t filter = BSON_INITIALIZER, fid, in;
		BSON_APPEND_DOCUMENT_BEGIN(&filter, "files_id", &fid);
		BSON_APPEND_ARRAY_BEGIN(&fid, "$in", &in);
		size_t k = 0;
		for (size_t j = i; j < i + per && j < v->t.count; j++) {
			struct vfile *vf = v->t.list[j];
			if (vf->bad)
				continue;
			char idx[16];
			const char *key;
			bson_uint32_to_string((uint32_t)k++, &key, idx, sizeof idx);
			bson_append_value(&in, key, -1, &vf->id);
		}
		bson_append_array_end(&fid, &in);
		bson_append_document_end(&filter, &fid);
		bool ok = k == 0 || stream(v, &filter, batch, err);
		bson_destroy(&filter);
		if (!ok)
			return false;
	}
	return true;
}

/* Chunks of the selected files, a query per file on several connections at once. */
static bool
stream_each(struct verify *v, int32_t batch, gfs_error *err)
{
	const bson_value_t **ids = gfs_xcalloc(v->t.count + 1, sizeof *ids);
	size_t n = 0;
	for (size_t i = 0; i < v->t.count; i++)
		if (!v->t.list[i]->bad)
			ids[n++] = &v->t.list[i]->id;
	gfs_fetch *f = gfs_fetch_start(v->conn, ids, n, v->o->jobs > 0 ? v->o->jobs : DEFAULT_JOBS,
	                               batch);
	struct group g;
	memset(&g, 0, sizeof g);
	bson_t *doc;
	size_t file;
	int rc;
	bool ok = true;
	while (ok && (rc = gfs_fetch_next(f, &doc, &file, err)) > 0) {
		if (v->o->stop && *v->o->stop) {
			gfs_error_set(err, GFS_ECANCELED, "verify interrupted");
			ok = false;
		} else {
			feed(v, &g, doc);
		}
		bson_destroy(doc);
	}
	if (ok && rc < 0)
		ok = false;
	group_end(v, &g, ok);
	gfs_fetch_free(f);
	free(ids);
	return ok;
}

/*
 * A whole-bucket check that read chunks by id has not seen the chunks of no
 * file yet: the files_ids the chunks collection holds are listed ($group),
 * and the chunks of each that no files document has are read as a scan
 * reads them, so that every strategy finds the same orphans.
 */
static bool
stream_orphans(struct verify *v, int32_t batch, gfs_error *err)
{
	bson_t pipeline = BSON_INITIALIZER, stage, spec, opts = BSON_INITIALIZER;
	BSON_APPEND_DOCUMENT_BEGIN(&pipeline, "0", &stage);
	BSON_APPEND_DOCUMENT_BEGIN(&stage, "$group", &spec);
	BSON_APPEND_UTF8(&spec, "_id", "$files_id");
	bson_append_document_end(&stage, &spec);
	bson_append_document_end(&pipeline, &stage);
	BSON_APPEND_INT32(&opts, "batchSize", 1000);
	mongoc_cursor_t *cur =
	    mongoc_collection_aggregate(v->s->chunks, MONGOC_QUERY_NONE, &pipeline, &opts, NULL);
	bson_destroy(&pipeline);
	bson_destroy(&opts);
	bson_value_t *lost = NULL;
	size_t n = 0, cap = 0;
	const bson_t *doc;
	while (mongoc_cursor_next(cur, &doc)) {
		bson_iter_t it;
		if (!bson_iter_init_find(&it, doc, "_id"))
			continue;
		bson_t key;
		id_key(bson_iter_value(&it), &key);
		bool known = table_find(&v->t, &key) != NULL;
		bson_destroy(&key);
		if (known)
			continue;
		GFS_GROW(lost, n + 1, cap, 16);
		bson_value_copy(bson_iter_value(&it), &lost[n++]);
	}
	bool ok = gfs_cursor_done(cur, "list the chunks' files_ids", err);
	/* A null group stands for chunks without files_id too: {$eq: null} finds both. */
	for (size_t i = 0; ok && i < n; i++) {
		bson_t filter = BSON_INITIALIZER;
		gfs_id_filter(&filter, "files_id", &lost[i]);
		ok = stream(v, &filter, batch, err);
		bson_destroy(&filter);
	}
	for (size_t i = 0; i < n; i++)
		bson_value_destroy(&lost[i]);
	free(lost);
	return ok;
}

/*
 * The whole bucket is read in one sorted scan. A selection is read the
 * way gfs_read_choose() picks from the server's answer to explain: see
 * readplan.h and gridfsctl-verify(1).
 */
static enum gfs_read_strategy
choose(struct verify *v, bool partial)
{
	enum gfs_read_strategy want = v->o->strategy;
	if (want == GFS_READ_SCAN || (want == GFS_READ_AUTO && !partial))
		return GFS_READ_SCAN;
	gfs_read_caps_probe(v->s, &v->caps);
	if (want != GFS_READ_AUTO)
		return want;
	int64_t total = -1;
	if (v->t.count > GFS_READ_FEW) {
		bson_error_t berr;
		total = mongoc_collection_estimated_document_count(v->s->files, NULL, NULL, NULL, &berr);
	}
	/* A large selection costs what the whole bucket costs: one scan, as for the whole. */
	return gfs_read_choose(&v->caps, false, v->t.count, total, false);
}

bool
gfs_verify(gfs_conn *conn, const gfs_verify_opts *o, gfs_verify_stats *st, gfs_error *err)
{
	struct verify v;
	memset(&v, 0, sizeof v);
	memset(st, 0, sizeof *st);
	v.o = o;
	v.st = st;
	v.conn = conn;
	bool partial = (o->prefix && *o->prefix) || (o->sample > 0 && o->sample < 1.0);
	v.s = gfs_session_pop(conn);
	pthread_mutex_init(&v.done_mu, NULL);
	pthread_cond_init(&v.done_cond, NULL);

	int32_t max_chunk;
	bool ok = load_files(&v, &max_chunk, err);
	st->strategy = ok ? choose(&v, partial) : GFS_READ_SCAN;
	/* Under a prefix or sample a chunk outside the selection is not an orphan. */
	st->orphans_checked = !partial;
	int n = o->threads > 0 ? o->threads : default_threads();
	st->threads = n > MAX_THREADS ? MAX_THREADS : n;
	if (ok && !hashers_start(&v, st->threads)) {
		gfs_error_set(err, GFS_ELOCAL, "cannot start hashing threads");
		ok = false;
	}
	progress(&v, true);
	int32_t batch = gfs_chunk_batch_size(max_chunk);
	if (ok && st->strategy == GFS_READ_SCAN) {
		bson_t all = BSON_INITIALIZER;
		ok = stream(&v, &all, batch, err);
		bson_destroy(&all);
	} else if (ok) {
		ok = st->strategy == GFS_READ_EACH ? stream_each(&v, batch, err)
		                                   : stream_batched(&v, batch, err);
		if (ok && !partial)
			ok = stream_orphans(&v, batch, err);
	}
	if (v.nh) {
		drain(&v, true);
		hashers_stop(&v);
	}
	if (ok)
		unseen_files(&v);
	/* A pass that stopped has not looked at every chunk: it cannot vouch for orphans. */
	if (!ok)
		st->orphans_checked = false;
	progress(&v, true);
	table_free(&v.t);
	pthread_mutex_destroy(&v.done_mu);
	pthread_cond_destroy(&v.done_cond);
	gfs_session_push(v.s);
	return ok;
}

/* ---- repairs --------------------------------------------------------- */

/* Whether a repair removes this chunk of its file (ctx: what the caller's rule needs). */
typedef bool (*chunk_pick_fn)(const bson_t *chunk, const void *ctx);

/*
 * Removes the chunks of files_id that pick selects: they are read by
 * files_id equality, without a sort, and removed by {files_id, _id}
 * equality each, so that no range reaches the chunks collection (rule 1 of
 * docs/design.md). A chunk that lands between the read and the removal
 * stays, and *deleted says how many went.
 */
static bool
remove_picked(gfs_session *s, const bson_value_t *files_id, chunk_pick_fn pick, const void *ctx,
              int64_t *deleted, const char *what, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, proj;
	gfs_id_filter(&filter, "files_id", files_id);
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "projection", &proj);
	BSON_APPEND_INT32(&proj, "_id", 1);
	BSON_APPEND_INT32(&proj, "n", 1);
	bson_append_document_end(&opts, &proj);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(s->chunks, &filter, &opts, NULL);
	bson_destroy(&opts);
	bson_value_t *ids = NULL;
	size_t n = 0, cap = 0;
	const bson_t *doc;
	bson_iter_t it;
	while (mongoc_cursor_next(cur, &doc)) {
		if (!pick(doc, ctx) || !bson_iter_init_find(&it, doc, "_id"))
			continue;
		GFS_GROW(ids, n + 1, cap, 16);
		bson_value_copy(bson_iter_value(&it), &ids[n++]);
	}
	bool ok = gfs_cursor_done(cur, what, err) &&
	          gfs_delete_each(s->chunks, &filter, "_id", ids, n, deleted, what, err);
	for (size_t i = 0; i < n; i++)
		bson_value_destroy(&ids[i]);
	free(ids);
	bson_destroy(&filter);
	return ok;
}

/* An ObjectId _id made before the second *ctx (a uint32_t), as {_id: {$lt: that second's first id}}. */
static bool
pick_older(const bson_t *chunk, const void *ctx)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, chunk, "_id") && BSON_ITER_HOLDS_OID(&it) &&
	       (uint32_t)bson_oid_get_time_t(bson_iter_oid(&it)) < *(const uint32_t *)ctx;
}

/* A number n at or beyond *ctx (an int64_t), or below 0, as the server compares numbers. */
static bool
pick_beyond(const bson_t *chunk, const void *ctx)
{
	int64_t count = *(const int64_t *)ctx;
	bson_iter_t it;
	if (!bson_iter_init_find(&it, chunk, "n"))
		return false;
	if (BSON_ITER_HOLDS_INT32(&it) || BSON_ITER_HOLDS_INT64(&it)) {
		int64_t n = bson_iter_as_int64(&it);
		return n >= count || n < 0;
	}
	if (!BSON_ITER_HOLDS_DOUBLE(&it))
		return false;
	double d = bson_iter_double(&it);
	return d >= (double)count || d < 0;
}

bool
gfs_verify_remove_chunks(gfs_session *s, const bson_value_t *files_id, int64_t before_ms,
                         int64_t *deleted, gfs_error *err)
{
	uint32_t secs = (uint32_t)(before_ms / 1000);
	if (before_ms <= 0)
		return gfs_delete_each(s->chunks, NULL, "files_id", files_id, 1, deleted, "delete chunks",
		                       err);
	return remove_picked(s, files_id, pick_older, &secs, deleted, "delete chunks", err);
}

int
gfs_verify_file_exists(gfs_session *s, const bson_value_t *id, gfs_error *err)
{
	return exists(s->files, "_id", id, NULL, err);
}

int
gfs_verify_chunks_exist(gfs_session *s, const bson_value_t *files_id, gfs_error *err)
{
	return exists(s->chunks, "files_id", files_id, NULL, err);
}

bool
gfs_verify_remove_chunks_beyond(gfs_session *s, const bson_value_t *files_id, int64_t count,
                                int64_t *deleted, gfs_error *err)
{
	return remove_picked(s, files_id, pick_beyond, &count, deleted, "delete extra chunks", err);
}

bool
gfs_verify_remove_chunk_ids(gfs_session *s, const bson_value_t *files_id, const bson_value_t *ids,
                            size_t n, int64_t *deleted, gfs_error *err)
{
	bson_t also = BSON_INITIALIZER;
	gfs_id_filter(&also, "files_id", files_id);
	bool ok = gfs_delete_each(s->chunks, &also, "_id", ids, n, deleted, "delete extra chunks", err);
	bson_destroy(&also);
	return ok;
}

bool
gfs_verify_set_sha256(gfs_session *s, const bson_value_t *id, const char *sha256_hex,
                      gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, update = BSON_INITIALIZER, set;
	gfs_id_filter(&filter, "_id", id);
	BSON_APPEND_DOCUMENT_BEGIN(&update, "$set", &set);
	BSON_APPEND_UTF8(&set, "metadata.sha256", sha256_hex);
	bson_append_document_end(&update, &set);
	bson_error_t berr;
	bool ok = mongoc_collection_update_one(s->files, &filter, &update, NULL, NULL, &berr);
	if (!ok)
		gfs_error_from_bson(err, &berr, "set metadata.sha256");
	bson_destroy(&filter);
	bson_destroy(&update);
	return ok;
}

/* ---- sealing ---------------------------------------------------------- */

bool
gfs_verify_unsealed(const gfs_file *f)
{
	bson_iter_t it, found;
	if (!f->doc || bson_has_field(f->doc, "md5"))
		return false;
	return !(bson_iter_init(&it, f->doc) && bson_iter_find_descendant(&it, "metadata.sha256", &found));
}

void
gfs_seal_init(gfs_seal *sl, const gfs_file *f, const char *sha256_hex)
{
	memset(sl, 0, sizeof *sl);
	bson_value_copy(&f->id, &sl->id);
	sl->filename = f->filename ? gfs_xstrdup(f->filename) : NULL;
	snprintf(sl->sha256, sizeof sl->sha256, "%s", sha256_hex);
	bson_iter_t it;
	sl->metadata_ok = !bson_iter_init_find(&it, f->doc, "metadata") || BSON_ITER_HOLDS_DOCUMENT(&it);
	bson_init(&sl->match);
	gfs_id_filter(&sl->match, "_id", &f->id);
	static const char *const same[] = {"length", "uploadDate", "md5", "metadata.sha256"};
	for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
		gfs_same_filter(&sl->match, f->doc, same[i]);
}

void
gfs_seal_free(gfs_seal *sl)
{
	bson_value_destroy(&sl->id);
	free(sl->filename);
	bson_destroy(&sl->match);
}

int
gfs_verify_seal(gfs_session *s, const gfs_seal *sl, int64_t now_ms, gfs_error *err)
{
	if (!sl->metadata_ok) {
		gfs_error_set(err, GFS_EINVAL, "its metadata is not a document; left unsealed");
		return 0;
	}
	bson_t update = BSON_INITIALIZER, set, reply;
	BSON_APPEND_DOCUMENT_BEGIN(&update, "$set", &set);
	BSON_APPEND_UTF8(&set, "metadata.sha256", sl->sha256);
	BSON_APPEND_DATE_TIME(&set, "metadata.sealedAt", now_ms);
	bson_append_document_end(&update, &set);
	bson_error_t berr;
	int rc = -1;
	if (mongoc_collection_update_one(s->files, &sl->match, &update, NULL, &reply, &berr)) {
		bson_iter_t it;
		rc = bson_iter_init_find(&it, &reply, "matchedCount") && bson_iter_as_int64(&it) == 1;
		if (!rc)
			gfs_error_set(err, GFS_EINVAL, "its files document changed since it was read; "
			              "left unsealed");
	} else {
		gfs_error_from_bson(err, &berr, "seal");
	}
	bson_destroy(&update);
	bson_destroy(&reply);
	return rc;
}
