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
#include "strmap.h"

#define NAME_MAX_ 72               /* "k-" and 64 hex digits, and a NUL */
#define TMP_MAX_AGE_S 3600         /* a temporary file this old is abandoned, whoever made it */
#define QUEUE_MAX_BYTES (16u << 20) /* bodies waiting for the writer; past this, fills are dropped */
#define WRITER_NICE 19             /* the writer's priority: below everything that answers */
#define BACKOFF_FIRST_S 1.0        /* no fills this long after a failure, */
#define BACKOFF_MAX_S 60.0         /* twice as long after each failure that follows, up to this */

struct dentry {
	char name[NAME_MAX_];
	uint64_t size;
	int64_t mtime;                 /* only to order the index at start */
	struct dentry *prev, *next;    /* prev: more recently used */
};

/* A body waiting for the writer thread; done(ctx) releases it. */
struct pending {
	struct pending *next;
	char name[NAME_MAX_];
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

	pthread_mutex_t wmu;           /* the writer's queue */
	pthread_cond_t wcv;
	struct pending *whead, *wtail;
	size_t wbytes;
	bool wstop, writer_started;
	pthread_t writer;
	atomic_uint_fast64_t dropped;
};

struct disktier_fill {
	disktier *t;
	int fd;
	bool failed;
	uint64_t want, have;
	char name[NAME_MAX_];
	char tmp[NAME_MAX_ + 48];
};

static void *writer_main(void *arg);

static void
logf_(disktier *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
logf_(disktier *t, const char *fmt, ...)
{
	if (!t->log)
		return;
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	t->log(buf);
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
	if (s[0] == 'k' && s[1] == '-')
		s += 2;
	return strlen(s) == 64 && is_hex64(s);
}

/* The 64 hex digits of s in lower case, in one pass: false if s is anything else. */
static bool
lower_hex64(const char *s, char out[65])
{
	for (int i = 0; i < 64; i++) {
		char c = s[i];
		if (c >= 'A' && c <= 'F')
			c = (char)(c - 'A' + 'a');
		if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
			return false; /* the NUL of a shorter string too */
		out[i] = c;
	}
	out[64] = '\0';
	return s[64] == '\0';
}

static void
name_of(const gfs_meta *m, char out[NAME_MAX_])
{
	if (lower_hex64(m->sha256, out))
		return;
	/* No content hash: the revision's identity, typed _id and all, names it instead. */
	char sha[65], buf[512];
	int len = snprintf(buf, sizeof buf, "%s\n%lld\n%lld", m->key, (long long)m->length,
	                   (long long)m->upload_ms);
	gfs_sha256 *h = gfs_sha256_new();
	if (len >= (int)sizeof buf) {
		gfs_sha256_update(h, m->key, strlen(m->key));
		len = snprintf(buf, sizeof buf, "\n%lld\n%lld", (long long)m->length, (long long)m->upload_ms);
	}
	gfs_sha256_update(h, buf, (size_t)len);
	gfs_sha256_final(h, sha);
	snprintf(out, NAME_MAX_, "k-%s", sha);
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

/* Records name as present with size bytes, most recently used. */
static void
note_present(disktier *t, const char *name, uint64_t size)
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
	}
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

/* One pass over DIR: every entry, the oldest fill coldest. */
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
	while ((de = readdir(d))) {
		struct stat st;
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
	if (all.n)
		qsort(all.v, all.n, sizeof *all.v, by_mtime);
	for (size_t i = 0; i < all.n; i++) {
		e = all.v[i];
		strmap_put(t->map, e->name, e);
		push_head(t, e);
		t->bytes += e->size;
	}
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

int
disktier_get(disktier *t, const gfs_meta *m)
{
	char name[NAME_MAX_];
	name_of(m, name);
	int fd = open_entry(t, name);
	if (fd < 0) {
		forget(t, name); /* evicted by another server, or never there */
		atomic_fetch_add(&t->misses, 1);
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != m->length) {
		/* Torn by a crash before its data reached the disk: never served. */
		close(fd);
		unlinkat(t->dirfd, name, 0);
		forget(t, name);
		atomic_fetch_add(&t->misses, 1);
		return -1;
	}
	note_present(t, name, (uint64_t)st.st_size);
	atomic_fetch_add(&t->hits, 1);
	return fd;
}

bool
disktier_touch(disktier *t, const gfs_meta *m)
{
	char name[NAME_MAX_];
	name_of(m, name);
	pthread_mutex_lock(&t->mu);
	struct dentry *e = strmap_get(t->map, name);
	bool ok = e && e->size == (uint64_t)m->length;
	if (ok && t->head != e) {
		unlink_node(t, e);
		push_head(t, e);
	}
	pthread_mutex_unlock(&t->mu);
	if (ok)
		atomic_fetch_add(&t->hits, 1);
	return ok;
}

bool
disktier_has(disktier *t, const gfs_meta *m)
{
	char name[NAME_MAX_];
	name_of(m, name);
	pthread_mutex_lock(&t->mu);
	struct dentry *e = strmap_get(t->map, name);
	bool ok = e && e->size == (uint64_t)m->length;
	pthread_mutex_unlock(&t->mu);
	return ok;
}

/* ---- fills ------------------------------------------------------------- */

static disktier_fill *
fill_named(disktier *t, const char *name, uint64_t len)
{
	if (len > t->max || backing_off(t))
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
	return f;
}

disktier_fill *
disktier_fill_begin(disktier *t, const gfs_meta *m)
{
	char name[NAME_MAX_];
	if (m->length < 0)
		return NULL;
	name_of(m, name);
	return fill_named(t, name, (uint64_t)m->length);
}

bool
disktier_fill_write(disktier_fill *f, const void *data, size_t len)
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
		f->have += (uint64_t)n;
	}
	return !f->failed;
}

void
disktier_fill_abort(disktier_fill *f)
{
	if (!f)
		return;
	if (f->fd >= 0)
		close(f->fd);
	unlinkat(f->t->tmpfd, f->tmp, 0);
	free(f);
}

void
disktier_fill_commit(disktier_fill *f)
{
	disktier *t = f->t;
	if (f->failed || f->have != f->want) {
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
	note_present(t, f->name, f->want);
	free(f);
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
	char name[NAME_MAX_];
	if (m->length < 0 || (uint64_t)m->length != len)
		return;
	name_of(m, name);
	put_named(t, name, data, len);
}

/* ---- the writer thread --------------------------------------------------- */

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
		while (!t->whead && !t->wstop)
			pthread_cond_wait(&t->wcv, &t->wmu);
		struct pending *p = t->whead;
		if (!p)
			break; /* stopping, and the queue is written out */
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
	if (m->length < 0 || (uint64_t)m->length != len || len > t->max || disktier_has(t, m) ||
	    backing_off(t)) {
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
	char name[NAME_MAX_];
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
		if (len && len - 1 == e->size)
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
	pthread_mutex_unlock(&t->mu);
	out->hits = atomic_load(&t->hits);
	out->misses = atomic_load(&t->misses);
	out->evictions = atomic_load(&t->evictions);
	out->errors = atomic_load(&t->errors);
	out->dropped = atomic_load(&t->dropped);
}
