/*
 * verify: one pass over the chunks of a bucket, hashing in parallel.
 *
 * The calling thread reads: it loads the selected files documents into a
 * table keyed by _id, then streams chunk documents with no sort: one pass
 * over the whole chunks collection in natural order, or per-file queries
 * that lib/read_each.c runs on other connections and hands back file by file.
 * A chunk is fed to its file's checker when it is the file's next (n), or
 * when its place does not matter to the checker (an extra, a duplicate, a
 * chunk after a fault); one that comes before its turn is held until the
 * ones before it have come. Its data is copied into the queue of the
 * hashing thread that owns that file (a file stays with one thread, so its
 * chunks are hashed in order). The checker thus sees every file's chunks
 * as a pass sorted by {files_id, n} would show them, and gives the same
 * verdicts.
 *
 * In a scan a file's last chunk may come at any time, so a file whose
 * chunks 0..count-1 are in is hashed at once and its hash state freed, but
 * its verdict waits for the end of the pass (a late duplicate is still an
 * EXTRA-CHUNK). The chunks held are bounded in bytes; past the bound the
 * file they belong to is given up in the scan and read again by files_id
 * at the end. Callbacks always run on the calling thread.
 *
 * Memory: the table of files documents and per file its checker (a few
 * hundred bytes), the queues and the held chunks (bounded in bytes), and
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

#include "read_each.h"
#include "import.h"
#include "filename.h"
#include "lock.h"
#include "strmap.h"
#include "verify.h"
#include "workq.h"

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
	enum gfs_chunk_place place = gfs_chunk_place(n, c->next, c->expected);
	if (place == GFS_CHUNK_OUTSIDE || place == GFS_CHUNK_DUPLICATE) {
		if (c->extras++ == 0)
			c->first_extra_n = n;
		if (place == GFS_CHUNK_DUPLICATE)
			c->dups++;
		return 0;
	}
	if (c->failed)
		return 0;
	if (place == GFS_CHUNK_GAP) {
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
	bool reread;           /* given up in the scan: read again by files_id at the end */
	struct slot *sl;       /* its checker while the pass reads it; NULL before and after */
	char *bad_name;        /* BAD-DOC: filename if it had one */
	char bad_detail[512];
};

struct table {
	strmap *ids;           /* id_key() of _id to its vfile */
	struct vfile **list;   /* in _id order */
	size_t count, list_cap;
};

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
	bson_value_t *extra_ids;   /* GFS_VERIFY_MAX_EXTRA_IDS, allocated at the first */
	bool aborted;              /* the scan stopped inside this file: no verdict */
	struct slot *next_done;
	/* reading: see "reading" below; only the reader thread touches these */
	struct hasher *h;
	gfs_held *held;            /* chunks before their turn, by n */
	int64_t after_bad;         /* chunks with an n that sorts after every number, not fed yet */
	bool has_oor;              /* an extra numbered count or beyond, or below 0, was fed */
	int64_t first_oor_n;       /* the lowest of those */
	bool bad_first;            /* a chunk with no n (sorted first) was fed */
	bool ended;                /* handed to the hasher for its end */
	bool final;                /* no more chunks can come: the verdict when hashed */
	bool hashed;               /* the hasher is done with it */
};

struct item {
	struct slot *slot;
	uint8_t *data;            /* NULL with end set: the file's last item */
	uint32_t len;
	bool end;
};

/* A hashing thread and its queue, bounded in items and in bytes of chunk data. */
struct hasher {
	pthread_t thread;
	gfs_workq *q;
	struct verify *v;
};

struct verify {
	const gfs_verify_opts *o;
	size_t hold;               /* bytes of held chunks allowed; 0: no bound (one file at a time) */
	size_t held_bytes;
	size_t rereads;            /* files given up in the scan */
	uint64_t ended;            /* files whose chunks are in, for progress */
	bool orphans_only;         /* a pass that looks only for chunks of no selected file */
	strmap *orphans;           /* id_key() of a files_id with no files document: struct orphan */
	struct orphan **orphan_list;
	size_t n_orphans, orphans_cap;
	char *nprefix;                  /* o->prefix normalized, for o->select */
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
	gfs_error lookup_err;           /* why; the verdicts still to come cannot be given */
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

static void
item_free(void *p)
{
	struct item *it = p;
	free(it->data);
	free(it);
}

static void *
hasher_main(void *arg)
{
	struct hasher *h = arg;
	struct item *it;
	while ((it = gfs_workq_pop(h->q)) != NULL) {
		hash_item(h->v, it);
		item_free(it);
	}
	return NULL;
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
	/* The queue closes only once the reader is done putting. */
	if (!gfs_workq_push(h->q, it, len))
		abort();
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
		h->q = gfs_workq_new(QUEUE_ITEMS, QUEUE_BYTES);
		if (pthread_create(&h->thread, NULL, hasher_main, h) != 0) {
			gfs_workq_free(h->q, NULL);
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
		gfs_workq_close(h->q);
		pthread_join(h->thread, NULL);
		gfs_workq_free(h->q, item_free);
	}
	free(v->h);
	v->h = NULL;
	v->nh = 0;
}

/* ---- verdicts -------------------------------------------------------- */

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
	int found = gfs_exists(v->s, v->s->files, "_id", p->id, &err);
	v->lookups_failed = found < 0;
	if (found < 0)
		v->lookup_err = err;
	if (found != 0)
		return;
	size_t n = strlen(p->detail);
	snprintf(p->detail + n, sizeof p->detail - n, "%s%s: removed while verify ran",
	         n ? " " : "", gfs_verify_kind_name(p->kind));
	p->kind = GFS_VK_IN_PROGRESS;
}

/*
 * Whether the primary has the file (or, for orphan chunks, the document of
 * their files_id) whole: 1 yes, 0 no, -1 could not tell.
 */
static int
whole_on_primary(struct verify *v, const gfs_verify_problem *p)
{
	gfs_session *s = gfs_session_pop(v->conn);
	gfs_error err;
	gfs_file f;
	int rc = -1;
	if (gfs_session_to_primary(s, &err) && gfs_find_by_id(s, p->id, &f, &err)) {
		rc = p->kind == GFS_VK_ORPHAN_CHUNKS || gfs_read(s, &f, true, NULL, NULL, NULL, &err);
		gfs_file_free(&f);
	} else if (err.code == GFS_ENOTFOUND) {
		rc = 0;
	}
	gfs_session_push(s);
	return rc;
}

/*
 * A pass read from a secondary, which may be behind the primary (issue
 * 31): damage the primary does not have is the secondary's lag, reported
 * as such (in progress), never as damage, and never repaired.
 */
static void
unless_whole_on_primary(struct verify *v, gfs_verify_problem *p)
{
	if (!p->id || p->kind == GFS_VK_IN_PROGRESS || p->kind == GFS_VK_BAD_DOC ||
	    !gfs_session_on_secondary(v->s) || whole_on_primary(v, p) != 1)
		return;
	size_t n = strlen(p->detail);
	snprintf(p->detail + n, sizeof p->detail - n, "%s%s: the secondary is behind (whole on the "
	         "primary)", n ? " " : "", gfs_verify_kind_name(p->kind));
	p->kind = GFS_VK_IN_PROGRESS;
}

static void
report(struct verify *v, gfs_verify_problem *p)
{
	unless_removed_meanwhile(v, p);
	unless_whole_on_primary(v, p);
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
	free(sl->extra_ids);
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
			if (rule == GFS_CHECK_MALFORMED) {
				/* Nothing to compare with: the content's own sha256 goes with it. */
				snprintf(p.detail, sizeof p.detail, "stored %s is malformed; content sha256 %s",
				         f->bad_hash, sl->sha256);
				got = sl->sha256;
			} else {
				snprintf(p.detail, sizeof p.detail, "%s %s, stored %s", sha ? "sha256" : "md5",
				         got, want);
			}
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
	uint64_t files = v->st->files_checked > v->ended ? v->st->files_checked : v->ended;
	v->o->on_progress(files, v->st->bytes, v->o->ctx);
}

/* The verdict on a file whose chunks are all in and hashed; its slot goes. */
static void
judge(struct verify *v, struct slot *sl)
{
	if (sl->vf->sl == sl)
		sl->vf->sl = NULL;
	/* Verdicts come after the pass: without the backend, whether the file is gone is unknown. */
	if (v->lookups_failed)
		sl->aborted = true;
	verdict(v, sl);
	slot_free(sl);
}

/* The hasher is done with sl: judged now when no chunk of it can come any more. */
static void
hashed(struct verify *v, struct slot *sl)
{
	v->in_flight--;
	sl->hashed = true;
	if (sl->final)
		judge(v, sl);
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
			hashed(v, sl);
		}
		pthread_mutex_lock(&v->done_mu);
	}
	struct slot *list = v->done;
	v->done = NULL;
	pthread_mutex_unlock(&v->done_mu);
	for (struct slot *sl = list, *nx; sl; sl = nx) {
		nx = sl->next_done;
		hashed(v, sl);
	}
	progress(v, false);
}

/* ---- reading --------------------------------------------------------- */

/* Chunks of a files_id that no files document has: counted, judged at the end. */
struct orphan {
	bson_value_t files_id;
	int64_t chunks, bytes;
};

/* Who is at work on chunks whose marker's writer is alive. */
static const char *
live_writer(const bson_t *marker)
{
	bson_iter_t it;
	bool put = bson_iter_init_find(&it, marker, "lock") && BSON_ITER_HOLDS_UTF8(&it) &&
	           !gfs_lock_of_family(bson_iter_utf8(&it, NULL), GFS_IMPORT_LOCK);
	if (!bson_has_field(marker, "deleting"))
		return put ? "a put" : "an import";
	return strcmp(gfs_marker_verb(marker), "import") == 0 ? "an import" : "a live writer";
}

/*
 * Chunks with no files document in the table: in progress (p->kind set to
 * GFS_VK_IN_PROGRESS) or orphans, with why in p->detail's tail. The marker
 * is looked for before the files document, and whether the chunks are still
 * there last: see verify.h. Whether a marker's writer is alive, and who
 * finishes its work when it is not, are lib/markers.c's (gfs_marker_live), as
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
	int file = gfs_exists(v->s, v->s->files, "_id", fid, &err);
	int still = file == 0 && live == 0 ? gfs_exists(v->s, v->s->chunks, "files_id", fid, &err) : 1;
	v->lookups_failed = found < 0 || live < 0 || file < 0 || still < 0;
	if (v->lookups_failed)
		v->lookup_err = err;
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

static void
note_extra_id(struct slot *sl, const bson_t *doc)
{
	bson_iter_t it;
	if (sl->n_extra_ids >= GFS_VERIFY_MAX_EXTRA_IDS || !bson_iter_init_find(&it, doc, "_id"))
		return;
	if (!sl->extra_ids)
		sl->extra_ids = gfs_xcalloc(GFS_VERIFY_MAX_EXTRA_IDS, sizeof *sl->extra_ids);
	bson_value_copy(bson_iter_value(&it), &sl->extra_ids[sl->n_extra_ids++]);
}

/* Feeds one chunk to its file's checker now, and its data to the hasher when it is content. */
static void
take(struct verify *v, struct slot *sl, const bson_t *doc)
{
	bson_iter_t it;
	int64_t n;
	bool has_n = gfs_chunk_n(doc, &n);
	if (!has_n)
		n = -1;
	bool has_data = false;
	uint32_t len = 0;
	const uint8_t *data = NULL;
	if (bson_iter_init_find(&it, doc, "data") && BSON_ITER_HOLDS_BINARY(&it)) {
		bson_subtype_t sub;
		bson_iter_binary(&it, &sub, &len, &data);
		has_data = true;
	}
	v->st->bytes += len;
	gfs_chunk_check *c = &sl->check;
	int64_t extras = c->extras, dups = c->dups;
	int rc = gfs_chunk_check_add(c, has_n, n, has_data, len);
	if (rc == 1 && !sl->ended)
		hasher_put(sl->h, sl, data, len, false);
	if (c->extras == extras)
		return;
	/* A pass sorted by n meets the lowest extra first. */
	if (n < c->first_extra_n)
		c->first_extra_n = n;
	if (c->dups > dups) {
		note_extra_id(sl, doc);
	} else if (!sl->has_oor || n < sl->first_oor_n) {
		sl->has_oor = true;
		sl->first_oor_n = n;
	}
}

/*
 * A chunk with no n sorts before all others: had it come first, the
 * checker would have failed at once and counted as extra only the chunks
 * numbered count or beyond, or below 0. It comes late: make it so.
 */
static void
bad_first(struct slot *sl)
{
	gfs_chunk_check *c = &sl->check;
	c->extras -= c->dups;
	c->dups = 0;
	c->first_extra_n = c->extras ? sl->first_oor_n : -1;
	for (size_t i = 0; i < sl->n_extra_ids; i++)
		bson_value_destroy(&sl->extra_ids[i]);
	sl->n_extra_ids = 0;
	c->failed = false;
	c->next = 0;
	gfs_chunk_check_add(c, false, -1, false, 0);
	sl->bad_first = true;
}

static void
held_free(struct verify *v, struct slot *sl)
{
	v->held_bytes -= gfs_held_free(&sl->held);
}

/* Feeds the held chunks whose turn has come (all of them once the checker has failed, or all). */
static void
take_held(struct verify *v, struct slot *sl, bool all)
{
	bson_t *doc;
	while ((doc = gfs_held_take(&sl->held, all || sl->check.failed ? INT64_MAX
	                                                                 : sl->check.next)) != NULL) {
		v->held_bytes -= doc->len;
		take(v, sl, doc);
		bson_destroy(doc);
	}
}

/* Hands the slot to its hasher for the end; the verdict comes when it is hashed and final. */
static void
end_slot(struct verify *v, struct slot *sl)
{
	if (sl->ended)
		return;
	sl->ended = true;
	if (!sl->aborted)
		v->ended++;
	hasher_put(sl->h, sl, NULL, 0, true);
}

/*
 * When the file's content is settled (all chunks 0..count-1 in, or the
 * checker failed, which no later chunk but one with no n changes), its
 * hashing ends; late chunks still reach the checker until the verdict.
 */
static void
settle(struct verify *v, struct slot *sl)
{
	gfs_chunk_check *c = &sl->check;
	if (sl->ended || sl->held || (!c->failed && c->next < c->expected))
		return;
	if (sl->after_bad && !c->failed)
		gfs_chunk_check_add(c, false, -1, false, 0);
	end_slot(v, sl);
}

/* No more chunks of this file can come: feed what is held, then the verdict. */
static void
file_end(struct verify *v, struct slot *sl)
{
	if (!sl->ended) {
		take_held(v, sl, true);
		if (sl->after_bad && !sl->check.failed)
			gfs_chunk_check_add(&sl->check, false, -1, false, 0);
		gfs_chunk_check_end(&sl->check);
		end_slot(v, sl);
	}
	sl->final = true;
	if (sl->hashed)
		judge(v, sl);
}

/* The scan gives up on the file: no verdict from it, and a read by files_id at the end. */
static void
give_up(struct verify *v, struct vfile *vf)
{
	struct slot *sl = vf->sl;
	held_free(v, sl);
	sl->aborted = true;
	vf->sl = NULL;
	vf->reread = true;
	v->rereads++;
	end_slot(v, sl);
	sl->final = true;
	if (sl->hashed)
		judge(v, sl);
}

static void
hold(struct verify *v, struct vfile *vf, const bson_t *doc, int64_t n)
{
	struct slot *sl = vf->sl;
	if (v->hold && v->held_bytes + doc->len > v->hold) {
		give_up(v, vf);
		return;
	}
	v->held_bytes += gfs_held_put(&sl->held, doc, n);
}

static struct slot *
slot_open(struct verify *v, struct vfile *vf)
{
	struct slot *sl = slot_new(vf);
	sl->h = &v->h[v->next_h];
	v->next_h = (v->next_h + 1) % v->nh;
	v->in_flight++;
	vf->sl = sl;
	return sl;
}

/* One chunk of a selected file, in whatever order the server sent it. */
static void
file_chunk(struct verify *v, struct vfile *vf, const bson_t *doc)
{
	struct slot *sl = vf->sl ? vf->sl : slot_open(v, vf);
	gfs_chunk_check *c = &sl->check;
	int64_t n;
	switch (gfs_chunk_n_place(doc, &n)) {
	case GFS_N_BEFORE:
		if (sl->bad_first || (!c->failed && c->next == 0 && c->extras == 0))
			take(v, sl, doc);
		else
			bad_first(sl);
		sl->bad_first = true;
		break;
	case GFS_N_AFTER:
		if (c->failed || sl->ended)
			take(v, sl, doc);
		else
			sl->after_bad++;
		break;
	case GFS_N_NUMBER:
		if (!c->failed && !sl->ended && n > c->next && n < c->expected) {
			hold(v, vf, doc, n);
			return;
		}
		take(v, sl, doc);
	}
	take_held(v, sl, false);
	settle(v, sl);
}

static void
orphan_chunk(struct verify *v, const bson_value_t *fid, const bson_t *key, const bson_t *doc)
{
	if (!v->orphans)
		v->orphans = strmap_new(64);
	void **slot = strmap_slot(v->orphans, bson_get_data(key), key->len);
	struct orphan *o = *slot;
	if (!o) {
		o = gfs_xcalloc(1, sizeof *o);
		bson_value_copy(fid, &o->files_id);
		*slot = o;
		GFS_GROW(v->orphan_list, v->n_orphans + 1, v->orphans_cap, 16);
		v->orphan_list[v->n_orphans++] = o;
	}
	bson_iter_t it;
	o->chunks++;
	if (bson_iter_init_find(&it, doc, "data") && BSON_ITER_HOLDS_BINARY(&it)) {
		uint32_t len;
		const uint8_t *data;
		bson_subtype_t sub;
		bson_iter_binary(&it, &sub, &len, &data);
		o->bytes += len;
	}
}

/* Reports the orphan groups of the pass, each once, and forgets them. */
static void
report_orphans(struct verify *v, bool complete)
{
	for (size_t i = 0; i < v->n_orphans; i++) {
		struct orphan *o = v->orphan_list[i];
		if (complete && !v->lookups_failed) {
			gfs_verify_problem p;
			problem_init(&p, GFS_VK_ORPHAN_CHUNKS, NULL);
			p.id = &o->files_id;
			p.count = o->chunks;
			p.bytes = o->bytes;
			snprintf(p.detail, sizeof p.detail, "count=%lld bytes=%lld", (long long)o->chunks,
			         (long long)o->bytes);
			judge_orphans(v, &o->files_id, &p);
			report(v, &p);
		}
		bson_value_destroy(&o->files_id);
		free(o);
	}
	free(v->orphan_list);
	v->orphan_list = NULL;
	v->n_orphans = v->orphans_cap = 0;
	strmap_free(v->orphans);
	v->orphans = NULL;
}

/* One chunk of a pass: to its file, or to the orphans. */
static void
feed(struct verify *v, const bson_t *doc)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, doc, "files_id")) {
		/* Not a chunk of anything: count it as an orphan group of its own. */
		v->st->chunks++;
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
	struct vfile *vf = table_find(&v->t, &key);
	if (!vf || !v->orphans_only)
		v->st->chunks++;
	/*
	 * Only a pass over the whole bucket can call chunks orphans: under a
	 * prefix or sample they may belong to a file not selected.
	 */
	if (!vf && v->st->orphans_checked)
		orphan_chunk(v, fid, &key, doc);
	bson_destroy(&key);
	if (!vf || v->orphans_only)
		return;
	vf->seen = true;
	if (!vf->bad && !vf->reread)
		file_chunk(v, vf, doc);
	drain(v, false);
}

static bool
stopped(struct verify *v, gfs_error *err)
{
	if (!v->o->stop || !*v->o->stop)
		return false;
	gfs_error_set(err, GFS_ECANCELED, "verify interrupted");
	return true;
}

/*
 * After a pass: every file still open is at its end (complete), or gets no
 * verdict (the pass stopped inside it).
 */
static void
pass_end(struct verify *v, bool complete)
{
	for (size_t i = 0; i < v->t.count; i++) {
		struct slot *sl = v->t.list[i]->sl;
		if (!sl)
			continue;
		if (!complete) {
			held_free(v, sl);
			sl->aborted = true;
		}
		file_end(v, sl);
	}
	report_orphans(v, complete);
}

/*
 * One pass over the whole chunks collection in natural order: no filter,
 * no sort, so that the server reads its storage once and answers at once.
 */
static bool
scan(struct verify *v, int32_t batch, gfs_error *err)
{
	bson_t all = BSON_INITIALIZER, opts = BSON_INITIALIZER;
	gfs_read_scan_opts(&opts, batch);
	mongoc_cursor_t *cur = gfs_session_find(v->s, v->s->chunks, &all, &opts);
	bson_destroy(&opts);
	const bson_t *doc;
	bool ok = true;
	while (ok && mongoc_cursor_next(cur, &doc)) {
		ok = !stopped(v, err);
		if (ok)
			feed(v, doc);
	}
	if (!gfs_cursor_done(cur, "read chunks", err))
		ok = false;
	pass_end(v, ok);
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
	snprintf(vf->bad_detail, sizeof vf->bad_detail, "%s", perr->msg);
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
	    gfs_session_aggregate(v->s, v->s->files, &pipeline, &opts);
	bson_destroy(&pipeline);
	bson_destroy(&opts);
	v->st->sampled_by_server = true;
	return cur;
}

/*
 * The selected files documents. A prefix is a range on filename, which the
 * GridFS index {filename: 1, uploadDate: 1} serves on MongoDB.
 */
/* Whether o->select takes the file; a document without a usable name is always checked. */
static bool
selected(const struct verify *v, const bson_t *doc)
{
	bson_iter_t it;
	if (!v->o->select || !bson_iter_init_find(&it, doc, "filename") || !BSON_ITER_HOLDS_UTF8(&it))
		return true;
	const char *rel = gfs_prefix_strip(v->nprefix, bson_iter_utf8(&it, NULL));
	return !rel || v->o->select(rel, v->o->ctx);
}

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
		cur = gfs_session_find(v->s, v->s->files, &filter, &opts);
		bson_destroy(&filter);
		bson_destroy(&opts);
	}
	const bson_t *doc;
	*max_chunk = 1;
	while (mongoc_cursor_next(cur, &doc))
		if (selected(v, doc))
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

/*
 * The chunks of the selected files (only_rereads: of those the scan gave
 * up on), a query per file on several connections at once; a file's
 * chunks end with its query, so it is judged then.
 */
static bool
read_files(struct verify *v, bool only_rereads, int32_t batch, gfs_error *err)
{
	const bson_value_t **ids = gfs_xcalloc(v->t.count + 1, sizeof *ids);
	struct vfile **vfs = gfs_xcalloc(v->t.count + 1, sizeof *vfs);
	size_t n = 0;
	for (size_t i = 0; i < v->t.count; i++) {
		struct vfile *vf = v->t.list[i];
		if (vf->bad || (only_rereads && !vf->reread))
			continue;
		/* Read again from the start: what the scan saw of it counts for nothing. */
		vf->reread = false;
		vf->seen = false;
		vfs[n] = vf;
		ids[n++] = &vf->id;
	}
	/* One file at a time is read here: its chunks before their turn are held, whatever they weigh. */
	v->hold = 0;
	gfs_fetch *f = gfs_fetch_start(v->conn, ids, n, v->o->jobs > 0 ? v->o->jobs : DEFAULT_JOBS,
	                               batch);
	bson_t *doc;
	size_t file, cur = SIZE_MAX;
	int rc;
	bool ok = true;
	while (ok && (rc = gfs_fetch_next(f, &doc, &file, err)) > 0) {
		ok = !stopped(v, err);
		if (ok && file != cur) {
			if (cur != SIZE_MAX && vfs[cur]->sl)
				file_end(v, vfs[cur]->sl);
			cur = file;
		}
		if (ok)
			feed(v, doc);
		bson_destroy(doc);
	}
	if (ok && rc < 0)
		ok = false;
	gfs_fetch_free(f);
	pass_end(v, ok);
	free(vfs);
	free(ids);
	return ok;
}

/*
 * The whole bucket is read in one scan. A selection is read the way
 * gfs_read_choose() picks from the server's answer to explain: see
 * read_strategy.h and gridfsctl-verify(1).
 */
static enum gfs_read_strategy
choose(struct verify *v, bool partial)
{
	enum gfs_read_strategy want = v->o->strategy;
	if (want != GFS_READ_AUTO)
		return want;
	if (!partial)
		return GFS_READ_SCAN;
	gfs_read_caps_probe(v->s, &v->caps);
	int64_t total = -1;
	if (v->t.count > GFS_READ_FEW) {
		bson_error_t berr;
		total = mongoc_collection_estimated_document_count(v->s->files, NULL, NULL, NULL, &berr);
	}
	return gfs_read_choose(&v->caps, false, v->t.count, total);
}

/*
 * The chunks: one scan, then the files it gave up on by files_id; or a
 * query per file, then (for the whole bucket) a scan for orphans only.
 */
static bool
read_chunks(struct verify *v, bool partial, int32_t batch, gfs_error *err)
{
	if (gfs_read_resolve(v->st->strategy) == GFS_READ_SCAN) {
		if (!scan(v, batch, err))
			return false;
		return v->rereads == 0 || read_files(v, true, batch, err);
	}
	if (!read_files(v, false, batch, err))
		return false;
	if (partial)
		return true;
	v->orphans_only = true;
	return scan(v, batch, err);
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
	v.hold = o->hold_bytes ? o->hold_bytes : GFS_READ_HOLD_DEFAULT;
	bool partial = (o->prefix && *o->prefix) || (o->sample > 0 && o->sample < 1.0) || o->select;
	v.nprefix = gfs_prefix_normalize(o->prefix);
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
	if (ok)
		ok = read_chunks(&v, partial, gfs_chunk_batch_size(max_chunk), err);
	if (v.nh) {
		drain(&v, true);
		hashers_stop(&v);
	}
	if (ok && v.lookups_failed) {
		*err = v.lookup_err;
		ok = false;
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
	free(v.nprefix);
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
	mongoc_cursor_t *cur = gfs_session_find(s, s->chunks, &filter, &opts);
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
	return gfs_exists(s, s->files, "_id", id, err);
}

int
gfs_verify_chunks_exist(gfs_session *s, const bson_value_t *files_id, gfs_error *err)
{
	return gfs_exists(s, s->chunks, "files_id", files_id, err);
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
