/* serve's disk tier; the design is in disktier.h. */
#include <dirent.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "disktier.h"
#include "../strmap.h"

#define TRAILER 64                 /* an entry's last bytes: its body's sha256 in hex */
#define PROVE_INLINE_MAX (256u << 10) /* larger unproven entries are misses until the writer proves them */
#define TMP_MAX_AGE_S 3600         /* a temporary file this old is abandoned, whoever made it */
#define QUEUE_MAX_BYTES (16u << 20) /* bodies waiting for the writer; past this, fills are dropped */
#define WRITER_NICE 19             /* the writer's priority: below everything that answers */
#define BACKOFF_FIRST_S 1.0        /* no fills this long after a failure, */
#define BACKOFF_MAX_S 60.0         /* twice as long after each failure that follows, up to this */

/* What fstat says of one write of an entry: a write, truncate or rename changes some of it. */
struct ident {
	uint64_t dev, ino;
	int64_t size, mtime_ns, ctime_ns;
};

struct dentry {
	char name[DISKTIER_NAME_MAX];
	uint64_t size;                 /* on disk: body and trailer */
	int64_t mtime;                 /* only to order the index at start */
	bool proven;                   /* id is the file whose body was hashed to sha */
	struct ident id;
	char sha[65];
	struct dentry *prev, *next;    /* prev: more recently used */
};

enum proof { PROOF_UNKNOWN, PROOF_OK, PROOF_WRONG };

/*
 * A body waiting for the writer thread; done(ctx) releases it. The queue is
 * not a gfs_workq (lib/workq.h): a fill is dropped rather than waited for,
 * and only when it fits under QUEUE_MAX_BYTES (an empty queue included);
 * its bytes count until the writer has written it, since the body is held
 * until then; and an idle writer proves the entries found at start, which
 * a pop that only waits for items could not let it do.
 */
struct pending {
	struct pending *next;
	char name[DISKTIER_NAME_MAX];
	const void *data;
	size_t len;
	void (*done)(void *ctx);
	void *ctx;
};

struct disktier {
	char *dir;
	int dirfd, tmpfd;
	void (*log)(const char *msg);
	pthread_mutex_t mu;            /* map, list, bytes */
	strmap *map;                   /* name -> struct dentry */
	struct dentry *head, *tail;    /* head: most recently used */
	uint64_t bytes, max;
	atomic_uint_fast64_t hits, misses, evictions, errors;
	atomic_uint seq;
	double pause_until;            /* under mu: no fills before this (gfs_mono_seconds) */
	double backoff_s;              /* under mu: the last pause; 0 when not failing */
	double last_failure;           /* under mu */
	uint64_t unproven;             /* entries in the map not proven (under mu) */
	atomic_uint_fast64_t proofs, proof_failures;
	atomic_int_fast64_t last_proof_log_ms;

	pthread_mutex_t wmu;           /* the writer's queue */
	pthread_cond_t wcv;
	struct pending *whead, *wtail;
	size_t wbytes;
	bool wstop, writer_started;
	pthread_t writer;
	atomic_uint_fast64_t dropped;
	char (*to_prove)[DISKTIER_NAME_MAX];   /* found at start, newest first: the writer proves them when idle */
	size_t nprove, next_prove;     /* under wmu */
};

struct disktier_fill {
	disktier *t;
	int fd;
	bool failed;
	gfs_sha256 *sha;               /* of the body, for the trailer */
	uint64_t want, have;
	char name[DISKTIER_NAME_MAX];
	char tmp[DISKTIER_NAME_MAX + 48];
};

static void *writer_main(void *arg);

static void
logf_(disktier *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
logf_(disktier *t, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	gfs_vlog_to(t->log, fmt, ap);
	va_end(ap);
}

/*
 * Counts every failure, and backs off: no fill is tried for a pause that
 * doubles with each failure after the last pause, from BACKOFF_FIRST_S to
 * BACKOFF_MAX_S, and each pause is one line. On a nearly full disk small
 * fills still fit between failing large ones; a line for each failure and
 * each success (as before) made 194 lines in two short runs.
 */
static void
tier_failed(disktier *t, const char *what, const char *name, int e)
{
	atomic_fetch_add(&t->errors, 1);
	double now = gfs_mono_seconds();
	pthread_mutex_lock(&t->mu);
	t->last_failure = now;
	bool said = now < t->pause_until; /* a fill begun before this pause */
	if (!said) {
		t->backoff_s = t->backoff_s ? t->backoff_s * 2 : BACKOFF_FIRST_S;
		if (t->backoff_s > BACKOFF_MAX_S)
			t->backoff_s = BACKOFF_MAX_S;
		t->pause_until = now + t->backoff_s;
	}
	double pause = t->backoff_s;
	pthread_mutex_unlock(&t->mu);
	if (!said)
		logf_(t, "disk tier %s: %s %s: %s; no fills for %.0f s, serving from memory and the "
		      "backend meanwhile", t->dir, what, name, strerror(e), pause);
}

/* Within a pause after a failure? A fill not tried then counts as dropped. */
static bool
backing_off(disktier *t)
{
	pthread_mutex_lock(&t->mu);
	bool wait = gfs_mono_seconds() < t->pause_until;
	pthread_mutex_unlock(&t->mu);
	if (wait)
		atomic_fetch_add(&t->dropped, 1);
	return wait;
}

/*
 * A fill worked. The back-off is forgotten (and "writing again" said) only
 * once fills have worked for two pauses' length without a failure: on a
 * disk that stays nearly full, fills work and fail by turns.
 */
static void
tier_wrote(disktier *t)
{
	double now = gfs_mono_seconds();
	pthread_mutex_lock(&t->mu);
	bool recovered = t->backoff_s && now - t->last_failure >= 2 * t->backoff_s;
	if (recovered)
		t->backoff_s = 0;
	pthread_mutex_unlock(&t->mu);
	if (recovered)
		logf_(t, "disk tier %s: writing again", t->dir);
}

static bool
is_hex64(const char *s)
{
	for (int i = 0; i < 64; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return s[64] == '\0';
}

/* Only names the tier makes are entries; anything else in DIR is left alone. */
static bool
entry_name_ok(const char *s)
{
	return s[0] == 'r' && s[1] == '-' && is_hex64(s + 2);
}

/* Entries of earlier versions (by content, or "k-" and a revision hash; no trailer): never served. */
static bool
old_entry_name(const char *s)
{
	if (s[0] == 'k' && s[1] == '-')
		s += 2;
	return strlen(s) == 64 && is_hex64(s);
}

/*
 * The revision's identity names its entry: typed _id, length and stored
 * hash (the cache key) and uploadDate. An entry is only ever written from
 * a read of this revision's own chunks, so a files document whose hash
 * names another file's content never finds that file's bytes.
 */
static void
name_of(const gfs_meta *m, char out[DISKTIER_NAME_MAX])
{
	char sha[65], when[32];
	int len = snprintf(when, sizeof when, "\n%lld", (long long)m->upload_ms);
	gfs_sha256 *h = gfs_sha256_new();
	gfs_sha256_update(h, m->cache_key, strlen(m->cache_key));
	gfs_sha256_update(h, when, (size_t)len);
	gfs_sha256_final(h, sha);
	snprintf(out, DISKTIER_NAME_MAX, "r-%s", sha);
}

/* The 64 hex digits of m's metadata.sha256 in lower case; false when it has none that is one. */
static bool
meta_sha(const gfs_meta *m, char out[65])
{
	for (int i = 0; i < 64; i++) {
		char c = m->sha256[i];
		if (c >= 'A' && c <= 'F')
			c = (char)(c - 'A' + 'a');
		if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
			return false; /* the NUL of a shorter string too */
		out[i] = c;
	}
	out[64] = '\0';
	return m->sha256[64] == '\0';
}

static void
ident_of(struct ident *id, const struct stat *st)
{
	id->dev = (uint64_t)st->st_dev;
	id->ino = (uint64_t)st->st_ino;
	id->size = (int64_t)st->st_size;
	id->mtime_ns = gfs_timespec_ns(&st->st_mtim);
	id->ctime_ns = gfs_timespec_ns(&st->st_ctim);
}

static bool
ident_same(const struct ident *a, const struct ident *b)
{
	return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
	       a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns;
}

/* ---- the list, under mu ------------------------------------------------ */

static void
unlink_node(disktier *t, struct dentry *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		t->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		t->tail = e->prev;
	e->prev = e->next = NULL;
}

static void
push_head(disktier *t, struct dentry *e)
{
	e->prev = NULL;
	e->next = t->head;
	if (t->head)
		t->head->prev = e;
	else
		t->tail = e;
	t->head = e;
}

static void
drop_locked(disktier *t, struct dentry *e)
{
	unlink_node(t, e);
	strmap_del(t->map, e->name);
	t->bytes -= e->size;
	if (!e->proven)
		t->unproven--;
}

/* Records e as proven to be id with body sha, or (id NULL) as not proven. */
static void
set_proof(disktier *t, struct dentry *e, const struct ident *id, const char *sha)
{
	if (!id) {
		t->unproven += e->proven;
		e->proven = false;
		return;
	}
	t->unproven -= !e->proven;
	e->proven = true;
	e->id = *id;
	memcpy(e->sha, sha, sizeof e->sha);
}

struct victims {
	struct dentry **v;
	size_t n, cap;
};

static void
victim_add(struct victims *vs, struct dentry *e)
{
	GFS_GROW(vs->v, vs->n + 1, vs->cap, 16);
	vs->v[vs->n++] = e;
}

/* Takes entries off the cold end until the tier fits; they are unlinked after the lock. */
static void
shrink_locked(disktier *t, struct victims *vs)
{
	while (t->bytes > t->max && t->tail) {
		struct dentry *e = t->tail;
		drop_locked(t, e);
		victim_add(vs, e);
	}
}

/*
 * Removes the victims' files. Another server may have written one of these
 * names again meanwhile: unlinking it costs that server a miss, no more.
 */
static void
unlink_victims(disktier *t, struct victims *vs)
{
	for (size_t i = 0; i < vs->n; i++) {
		if (unlinkat(t->dirfd, vs->v[i]->name, 0) != 0 && errno != ENOENT)
			tier_failed(t, "cannot remove", vs->v[i]->name, errno);
		free(vs->v[i]);
	}
	atomic_fetch_add(&t->evictions, vs->n);
	free(vs->v);
	vs->v = NULL;
	vs->n = vs->cap = 0;
}

/*
 * Records name as present with size bytes, most recently used, proven to
 * be the file id with body sha (id NULL: not proven).
 */
static void
note_present(disktier *t, const char *name, uint64_t size, const struct ident *id,
             const char *sha)
{
	struct victims vs = {0};
	pthread_mutex_lock(&t->mu);
	struct dentry *e = strmap_get(t->map, name);
	if (e) {
		unlink_node(t, e);
		t->bytes -= e->size;
	} else {
		e = gfs_xcalloc(1, sizeof *e);
		memcpy(e->name, name, strlen(name) + 1); /* one of ours: at most 66 */
		strmap_put(t->map, e->name, e);
		t->unproven++;
	}
	set_proof(t, e, id, sha);
	e->size = size;
	t->bytes += size;
	push_head(t, e);
	shrink_locked(t, &vs);
	pthread_mutex_unlock(&t->mu);
	unlink_victims(t, &vs);
}

static void
forget(disktier *t, const char *name)
{
	pthread_mutex_lock(&t->mu);
	struct dentry *e = strmap_get(t->map, name);
	if (e) {
		drop_locked(t, e);
		free(e);
	}
	pthread_mutex_unlock(&t->mu);
}

/* ---- opening and indexing ---------------------------------------------- */

/* Temporary files of servers that are gone: "<name>.<pid>.<n>". */
static void
clean_tmp(disktier *t)
{
	int fd = dup(t->tmpfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	time_t now = time(NULL);
	struct dirent *de;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		const char *dot = strchr(de->d_name, '.');
		long pid = dot ? strtol(dot + 1, NULL, 10) : 0;
		struct stat st;
		if (fstatat(t->tmpfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		bool gone = pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH);
		if (gone || now - st.st_mtime > TMP_MAX_AGE_S)
			unlinkat(t->tmpfd, de->d_name, 0);
	}
	closedir(d);
}

static int
by_mtime(const void *a, const void *b)
{
	const struct dentry *x = *(struct dentry *const *)a, *y = *(struct dentry *const *)b;
	return x->mtime < y->mtime ? -1 : x->mtime > y->mtime;
}

/*
 * One pass over DIR: every entry, the oldest fill coldest, none proven yet
 * (the writer proves them, newest first). Entries of an earlier version
 * are removed: no revision is named so any more.
 */
static bool
scan(disktier *t, gfs_error *err)
{
	int fd = dup(t->dirfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		gfs_error_set(err, GFS_ELOCAL, "%s: %s", t->dir, strerror(errno));
		if (fd >= 0)
			close(fd);
		return false;
	}
	struct victims all = {0};
	struct dentry *e;
	struct dirent *de;
	size_t old = 0;
	while ((de = readdir(d))) {
		struct stat st;
		if (old_entry_name(de->d_name)) {
			old += unlinkat(t->dirfd, de->d_name, 0) == 0;
			continue;
		}
		if (!entry_name_ok(de->d_name) ||
		    fstatat(t->dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
			continue;
		e = gfs_xcalloc(1, sizeof *e);
		memcpy(e->name, de->d_name, strlen(de->d_name) + 1); /* checked: at most 66 */
		e->size = (uint64_t)st.st_size;
		e->mtime = gfs_stat_mtime_ns(&st);
		victim_add(&all, e);
	}
	closedir(d);
	if (old)
		logf_(t, "disk tier %s: removed %zu entries of an earlier version", t->dir, old);
	if (all.n)
		qsort(all.v, all.n, sizeof *all.v, by_mtime);
	t->to_prove = gfs_xreallocarray(NULL, all.n ? all.n : 1, sizeof *t->to_prove);
	for (size_t i = 0; i < all.n; i++) {
		e = all.v[i];
		strmap_put(t->map, e->name, e);
		push_head(t, e);
		t->bytes += e->size;
		t->unproven++;
		memcpy(t->to_prove[all.n - 1 - i], e->name, DISKTIER_NAME_MAX);
	}
	t->nprove = all.n;
	free(all.v);
	return true;
}

static uint64_t
default_size(disktier *t)
{
	struct statvfs vfs;
	if (fstatvfs(t->dirfd, &vfs) != 0)
		return 0;
	uint64_t free_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	/* What the tier holds already is space it may keep: a restart must not shrink it. */
	uint64_t size = free_bytes / 100 * DISKTIER_DEFAULT_PERCENT + t->bytes;
	return size > DISKTIER_DEFAULT_CAP ? DISKTIER_DEFAULT_CAP : size;
}

static int
open_dir_at(int at, const char *path)
{
	if (mkdirat(at, path, 0700) != 0 && errno != EEXIST)
		return -1;
	return openat(at, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

disktier *
disktier_open(const char *dir, uint64_t max_bytes, void (*log)(const char *msg), gfs_error *err)
{
	disktier *t = gfs_xcalloc(1, sizeof *t);
	t->dir = gfs_xstrdup(dir);
	t->log = log;
	t->tmpfd = -1;
	pthread_mutex_init(&t->mu, NULL);
	pthread_mutex_init(&t->wmu, NULL);
	pthread_cond_init(&t->wcv, NULL);
	t->map = strmap_new(4096);
	t->dirfd = open_dir_at(AT_FDCWD, dir);
	if (t->dirfd < 0) {
		gfs_error_set(err, GFS_ELOCAL, "--cache-dir %s: %s", dir, strerror(errno));
		disktier_close(t);
		return NULL;
	}
	t->tmpfd = open_dir_at(t->dirfd, "tmp");
	if (t->tmpfd < 0) {
		gfs_error_set(err, GFS_ELOCAL, "--cache-dir %s/tmp: %s", dir, strerror(errno));
		disktier_close(t);
		return NULL;
	}
	clean_tmp(t);
	if (!scan(t, err)) {
		disktier_close(t);
		return NULL;
	}
	t->max = max_bytes ? max_bytes : default_size(t);
	struct victims vs = {0};
	pthread_mutex_lock(&t->mu);
	shrink_locked(t, &vs);
	pthread_mutex_unlock(&t->mu);
	unlink_victims(t, &vs);
	if (pthread_create(&t->writer, NULL, writer_main, t) != 0) {
		gfs_error_set(err, GFS_ELOCAL, "--cache-dir %s: cannot start the writer thread", dir);
		disktier_close(t);
		return NULL;
	}
	t->writer_started = true;
	return t;
}

static void
free_entry(const char *key, void *value, void *ctx)
{
	(void)key;
	(void)ctx;
	free(value);
}

void
disktier_close(disktier *t)
{
	if (!t)
		return;
	if (t->writer_started) {
		pthread_mutex_lock(&t->wmu);
		t->wstop = true;
		pthread_cond_signal(&t->wcv);
		pthread_mutex_unlock(&t->wmu);
		pthread_join(t->writer, NULL);
	}
	pthread_mutex_destroy(&t->wmu);
	pthread_cond_destroy(&t->wcv);
	strmap_each(t->map, free_entry, NULL);
	strmap_free(t->map);
	free(t->to_prove);
	if (t->dirfd >= 0)
		close(t->dirfd);
	if (t->tmpfd >= 0)
		close(t->tmpfd);
	pthread_mutex_destroy(&t->mu);
	free(t->dir);
	free(t);
}

/* ---- hits -------------------------------------------------------------- */

/*
 * Without O_NOATIME, the first send of a new entry would update its atime
 * (relatime: atime is not newer than mtime) and so dirty the inode, one
 * inode write per fill for a time nothing reads. Only the files' owner may
 * ask for it; a DIR shared with another user falls back.
 */
static int
open_entry(disktier *t, const char *name)
{
	int flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW;
	int fd = openat(t->dirfd, name, flags | O_NOATIME);
	if (fd < 0 && errno == EPERM)
		fd = openat(t->dirfd, name, flags);
	return fd;
}

/* Hashes fd's first len bytes into hex; false on a read error. */
static bool
hash_body(int fd, uint64_t len, char hex[65])
{
	gfs_sha256 *h = gfs_sha256_new();
	char buf[32768];
	uint64_t off = 0;
	bool ok = true;
	while (ok && off < len) {
		size_t want = len - off < sizeof buf ? (size_t)(len - off) : sizeof buf;
		ssize_t n = pread(fd, buf, want, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		ok = n > 0;
		if (ok) {
			gfs_sha256_update(h, buf, (size_t)n);
			off += (uint64_t)n;
		}
	}
	gfs_sha256_final(h, hex);
	return ok;
}

/* Says that an entry failed its proof: one line a second at most, the rest counted. */
static void
proof_failed(disktier *t, const char *name, const gfs_meta *m)
{
	uint64_t n = atomic_fetch_add(&t->proof_failures, 1) + 1;
	int64_t now = gfs_now_ms(), last = atomic_load(&t->last_proof_log_ms);
	if (now - last < 1000 || !atomic_compare_exchange_strong(&t->last_proof_log_ms, &last, now))
		return;
	logf_(t, "disk tier %s: entry %s%s%s does not hold what was written to it; removed, read "
	      "from the backend instead (%llu such entries so far)", t->dir, name, m ? " of " : "",
	      m ? (m->name ? m->name : m->key) : "", (unsigned long long)n);
}

/*
 * Proves fd, the entry name whose fstat is st: its body hashes to its
 * trailer (and to m's sha256, when m has one), and the file did not
 * change while it was read. Remembered only while name is still that file.
 */
static enum proof
prove(disktier *t, int fd, const char *name, const struct stat *st, const gfs_meta *m)
{
	atomic_fetch_add(&t->proofs, 1);
	char got[65], trailer[TRAILER + 1], want[65];
	bool ok = st->st_size >= TRAILER;
	uint64_t len = ok ? (uint64_t)st->st_size - TRAILER : 0;
	ok = ok && hash_body(fd, len, got) && pread(fd, trailer, TRAILER, (off_t)len) == TRAILER;
	trailer[TRAILER] = '\0';
	ok = ok && strcmp(got, trailer) == 0 && !(m && meta_sha(m, want) && strcmp(want, got) != 0);
	struct ident id, again;
	struct stat after;
	ident_of(&id, st);
	if (fstat(fd, &after) != 0)
		return PROOF_UNKNOWN;
	ident_of(&again, &after);
	if (!ident_same(&id, &again))
		return PROOF_UNKNOWN; /* written to while we read it: what was read proves nothing */
	if (!ok) {
		proof_failed(t, name, m);
		return PROOF_WRONG;
	}
	struct stat now;
	if (fstatat(t->dirfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_ino == st->st_ino &&
	    now.st_dev == st->st_dev)
		note_present(t, name, (uint64_t)st->st_size, &id, got);
	return PROOF_OK;
}

/* Removes name's entry, of which fd was read: never served. */
static void
discard(disktier *t, int fd, const char *name)
{
	close(fd);
	unlinkat(t->dirfd, name, 0);
	forget(t, name);
}

/*
 * What the tier remembers of name's entry, whose fstat is st: proven, and
 * the same file still (with m's sha256, when given), is a hit (marked
 * used); a proof for another write of it, or none, proves nothing. st is
 * of the file name is now, or (held) of one a caller kept open, which a
 * rename may have replaced since: that says nothing of the new one.
 */
static enum proof
recall(disktier *t, const char *name, const struct stat *st, const gfs_meta *m, bool held)
{
	struct ident id;
	ident_of(&id, st);
	char want[65];
	bool has_sha = m && meta_sha(m, want);
	enum proof p = PROOF_UNKNOWN;
	pthread_mutex_lock(&t->mu);
	struct dentry *e = strmap_get(t->map, name);
	bool replaced = e && (e->id.dev != id.dev || e->id.ino != id.ino);
	if (e && e->proven && !ident_same(&e->id, &id) && !(held && replaced))
		set_proof(t, e, NULL, NULL); /* changed since: prove it again */
	else if (e && e->proven && ident_same(&e->id, &id))
		p = has_sha && strcmp(e->sha, want) != 0 ? PROOF_WRONG : PROOF_OK;
	if (p == PROOF_OK && t->head != e) {
		unlink_node(t, e);
		push_head(t, e);
	}
	pthread_mutex_unlock(&t->mu);
	return p;
}

int
disktier_get(disktier *t, const gfs_meta *m, char name[DISKTIER_NAME_MAX])
{
	char mine[DISKTIER_NAME_MAX];
	if (!name)
		name = mine;
	name_of(m, name);
	int fd = open_entry(t, name);
	if (fd < 0) {
		forget(t, name); /* evicted by another server, or never there */
		atomic_fetch_add(&t->misses, 1);
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != m->length + TRAILER) {
		/* Torn by a crash before its data reached the disk: never served. */
		discard(t, fd, name);
		atomic_fetch_add(&t->misses, 1);
		return -1;
	}
	enum proof p = recall(t, name, &st, m, false);
	if (p == PROOF_UNKNOWN && (uint64_t)m->length <= PROVE_INLINE_MAX)
		p = prove(t, fd, name, &st, m);
	if (p != PROOF_OK) {
		/* Not proven yet and large: the writer proves it, or a read of the backend writes it anew. */
		if (p == PROOF_WRONG)
			discard(t, fd, name);
		else
			close(fd);
		atomic_fetch_add(&t->misses, 1);
		return -1;
	}
	atomic_fetch_add(&t->hits, 1);
	return fd;
}

bool
disktier_touch(disktier *t, const char *name, int fd)
{
	struct stat st;
	bool ok;
	if (fd >= 0) {
		ok = fstat(fd, &st) == 0 && recall(t, name, &st, NULL, true) == PROOF_OK;
	} else {
		/* Nothing is sent of an empty file: only whether the tier still has it matters. */
		pthread_mutex_lock(&t->mu);
		ok = strmap_get(t->map, name) != NULL;
		pthread_mutex_unlock(&t->mu);
	}
	if (ok)
		atomic_fetch_add(&t->hits, 1);
	return ok;
}

bool
disktier_has(disktier *t, const gfs_meta *m)
{
	char name[DISKTIER_NAME_MAX];
	name_of(m, name);
	pthread_mutex_lock(&t->mu);
	struct dentry *e = strmap_get(t->map, name);
	bool ok = e && e->size == (uint64_t)m->length + TRAILER;
	pthread_mutex_unlock(&t->mu);
	return ok;
}

/* ---- fills ------------------------------------------------------------- */

static disktier_fill *
fill_named(disktier *t, const char *name, uint64_t len)
{
	if (len + TRAILER > t->max || backing_off(t))
		return NULL;
	disktier_fill *f = gfs_xcalloc(1, sizeof *f);
	f->t = t;
	f->want = len;
	memcpy(f->name, name, strlen(name) + 1);
	snprintf(f->tmp, sizeof f->tmp, "%s.%ld.%u", f->name, (long)getpid(),
	         atomic_fetch_add(&t->seq, 1));
	f->fd = openat(t->tmpfd, f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (f->fd < 0) {
		tier_failed(t, "cannot create", f->tmp, errno);
		free(f);
		return NULL;
	}
	f->sha = gfs_sha256_new();
	return f;
}

disktier_fill *
disktier_fill_begin(disktier *t, const gfs_meta *m)
{
	char name[DISKTIER_NAME_MAX];
	if (m->length < 0)
		return NULL;
	name_of(m, name);
	return fill_named(t, name, (uint64_t)m->length);
}

static bool
write_all(disktier_fill *f, const void *data, size_t len)
{
	const char *p = data;
	while (!f->failed && len > 0) {
		ssize_t n = write(f->fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			tier_failed(f->t, "cannot write", f->tmp, n < 0 ? errno : EIO);
			f->failed = true;
			break;
		}
		p += n;
		len -= (size_t)n;
	}
	return !f->failed;
}

bool
disktier_fill_write(disktier_fill *f, const void *data, size_t len)
{
	gfs_sha256_update(f->sha, data, len);
	f->have += len;
	return write_all(f, data, len);
}

static void
fill_free(disktier_fill *f)
{
	char hex[65];
	if (f->sha)
		gfs_sha256_final(f->sha, hex);
	free(f);
}

void
disktier_fill_abort(disktier_fill *f)
{
	if (!f)
		return;
	if (f->fd >= 0)
		close(f->fd);
	unlinkat(f->t->tmpfd, f->tmp, 0);
	fill_free(f);
}

/*
 * The body's sha256 goes after it, so that a restart can prove the entry
 * without the backend; the file written is remembered as proven, unless
 * another server's rename of the same name came between.
 */
void
disktier_fill_commit(disktier_fill *f)
{
	disktier *t = f->t;
	char sha[65];
	gfs_sha256_final(f->sha, sha);
	f->sha = NULL;
	struct stat mine, st;
	if (f->failed || f->have != f->want || !write_all(f, sha, TRAILER) || fstat(f->fd, &mine) != 0) {
		disktier_fill_abort(f);
		return;
	}
	int fd = f->fd;
	f->fd = -1;
	if (close(fd) != 0) {
		tier_failed(t, "cannot write", f->tmp, errno);
		disktier_fill_abort(f);
		return;
	}
	if (renameat(t->tmpfd, f->tmp, t->dirfd, f->name) != 0) {
		tier_failed(t, "cannot rename", f->tmp, errno);
		disktier_fill_abort(f);
		return;
	}
	tier_wrote(t);
	struct ident id;
	bool same = fstatat(t->dirfd, f->name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	            st.st_ino == mine.st_ino && st.st_dev == mine.st_dev;
	if (same)
		ident_of(&id, &st);
	note_present(t, f->name, f->want + TRAILER, same ? &id : NULL, sha);
	fill_free(f);
}

static void
put_named(disktier *t, const char *name, const void *data, size_t len)
{
	disktier_fill *f = fill_named(t, name, len);
	if (!f)
		return;
	disktier_fill_write(f, data, len);
	disktier_fill_commit(f);
}

void
disktier_put(disktier *t, const gfs_meta *m, const void *data, size_t len)
{
	char name[DISKTIER_NAME_MAX];
	if (m->length < 0 || (uint64_t)m->length != len)
		return;
	name_of(m, name);
	put_named(t, name, data, len);
}

/* ---- the writer thread --------------------------------------------------- */

/* Proves name's entry if it is still there and not proven (by a request) meanwhile. */
static void
prove_known(disktier *t, const char *name)
{
	pthread_mutex_lock(&t->mu);
	struct dentry *e = strmap_get(t->map, name);
	bool need = e && !e->proven;
	pthread_mutex_unlock(&t->mu);
	if (!need)
		return;
	int fd = open_entry(t, name);
	if (fd < 0) {
		forget(t, name);
		return;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || prove(t, fd, name, &st, NULL) == PROOF_WRONG)
		discard(t, fd, name);
	else
		close(fd);
}

/*
 * Creating, renaming and unlinking files wait on the file system's journal,
 * which a busy neighbour's fsyncs can hold for milliseconds: a worker that
 * did this itself would read nothing from the backend meanwhile.
 */
static void *
writer_main(void *arg)
{
	disktier *t = arg;
	/*
	 * A fill is work for later and an answer work for now: on a busy
	 * machine (the backend on the same cores, a first touch of many files)
	 * the writer takes the idle moments rather than the CPU answers need.
	 * Linux's nice is per thread; failing leaves it at the process's.
	 */
	(void)setpriority(PRIO_PROCESS, (id_t)gettid(), WRITER_NICE);
	pthread_setname_np(pthread_self(), "tier-writer"); /* top -H; named once niced */
	pthread_mutex_lock(&t->wmu);
	for (;;) {
		while (!t->whead && !t->wstop && t->next_prove == t->nprove)
			pthread_cond_wait(&t->wcv, &t->wmu);
		struct pending *p = t->whead;
		if (!p && t->wstop)
			break; /* stopping, and the queue is written out */
		if (!p) {
			/* Idle: prove the next entry found at start, before a request needs it. */
			char name[DISKTIER_NAME_MAX];
			memcpy(name, t->to_prove[t->next_prove++], DISKTIER_NAME_MAX);
			pthread_mutex_unlock(&t->wmu);
			prove_known(t, name);
			pthread_mutex_lock(&t->wmu);
			continue;
		}
		t->whead = p->next;
		if (!t->whead)
			t->wtail = NULL;
		pthread_mutex_unlock(&t->wmu);
		put_named(t, p->name, p->data, p->len);
		p->done(p->ctx);
		pthread_mutex_lock(&t->wmu);
		t->wbytes -= p->len;
		free(p);
	}
	pthread_mutex_unlock(&t->wmu);
	return NULL;
}

void
disktier_put_async(disktier *t, const gfs_meta *m, const void *data, size_t len,
                   void (*done)(void *ctx), void *ctx)
{
	if (m->length < 0 || (uint64_t)m->length != len || len + TRAILER > t->max ||
	    disktier_has(t, m) || backing_off(t)) {
		done(ctx);
		return;
	}
	struct pending *p = gfs_xcalloc(1, sizeof *p);
	name_of(m, p->name);
	p->data = data;
	p->len = len;
	p->done = done;
	p->ctx = ctx;
	pthread_mutex_lock(&t->wmu);
	bool take = t->writer_started && !t->wstop && t->wbytes + len <= QUEUE_MAX_BYTES;
	if (take) {
		if (t->wtail)
			t->wtail->next = p;
		else
			t->whead = p;
		t->wtail = p;
		t->wbytes += len;
		pthread_cond_signal(&t->wcv);
	}
	pthread_mutex_unlock(&t->wmu);
	if (take)
		return;
	/* The disk is behind: this one is filled on a later miss instead. */
	atomic_fetch_add(&t->dropped, 1);
	free(p);
	done(ctx);
}

/* ---- reconciling with the metadata index -------------------------------- */

static void
expect_meta(gfs_meta *m, void *ctx)
{
	char name[DISKTIER_NAME_MAX];
	name_of(m, name);
	/* Stored as length + 1, so that an empty file is not a NULL value. */
	strmap_put(ctx, name, (void *)(uintptr_t)((uint64_t)m->length + 1));
}

void
disktier_reconcile(disktier *t, name_index *ix)
{
	strmap *want = strmap_new(name_index_count(ix) + 1);
	name_index_each(ix, expect_meta, want);
	struct victims vs = {0};
	pthread_mutex_lock(&t->mu);
	struct dentry *next;
	for (struct dentry *e = t->head; e; e = next) {
		next = e->next;
		uintptr_t len = (uintptr_t)strmap_get(want, e->name);
		if (len && len - 1 + TRAILER == e->size)
			continue;
		drop_locked(t, e);
		victim_add(&vs, e);
	}
	pthread_mutex_unlock(&t->mu);
	strmap_free(want);
	unlink_victims(t, &vs);
}

void
disktier_stats(disktier *t, struct disktier_stats *out)
{
	pthread_mutex_lock(&t->mu);
	out->bytes = t->bytes;
	out->max_bytes = t->max;
	out->entries = strmap_count(t->map);
	out->unproven = t->unproven;
	pthread_mutex_unlock(&t->mu);
	out->proofs = atomic_load(&t->proofs);
	out->proof_failures = atomic_load(&t->proof_failures);
	out->hits = atomic_load(&t->hits);
	out->misses = atomic_load(&t->misses);
	out->evictions = atomic_load(&t->evictions);
	out->errors = atomic_load(&t->errors);
	out->dropped = atomic_load(&t->dropped);
}
