/*
 * Mirror's run (gfs_mirror_run): one mirror from the listing to the sweep.
 *
 * The listing comes first (plan.c), so that an unreachable backend leaves
 * no empty DIR behind. DIR is then opened (made, unless a dry run) and
 * locked with flock against another mirror into it, whose sweep would take
 * our temporary files; --backup-dir is checked and opened, and --max-delete
 * counted, before anything changes.
 *
 * The files are done in phases, each spread over the worker threads (a
 * session and a gfs_mirror_dir each, plan items taken by one atomic index):
 * compare every file with the disk, fixing mode and mtime in place where
 * only those differ; keep in the backup directory what is about to be
 * overwritten; write what differs, from one pass over all chunks when most
 * of the bucket is to be written (scan.c), then file by file whatever is
 * left, with finisher threads (finish.c) taking the flushes off the
 * readers. Meanwhile the calling thread sends progress events. A backend
 * that fails stops the phases, and so does a stop request, after what is
 * in flight.
 *
 * The sweep comes last. It deletes nothing after any failure in the run,
 * nor when nothing is planned and DIR is not empty (a mistyped prefix, the
 * wrong bucket look like that) unless allow_empty says it is meant.
 *
 * Counts are atomics; events go out one at a time, under one lock.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backup.h"
#include "internal.h"

/* What became of each plan item, so that the actions can be told in name order. */
enum { RES_PENDING, RES_SKIP, RES_TODO, RES_WRITE, RES_ATTRS, RES_FAILED };

/*
 * The phases: compare every file with the disk, then write what differs,
 * either from one pass over all chunks (on one thread) or file by file.
 * A phase's workers take plan items by one atomic index (next), not from
 * a gfs_workq: every item is known before they start, so there is no
 * producer to wait for and nothing to bound. The finishers, which complete
 * files come to as they are read, are fed through one (finish.c).
 */
enum phase { PHASE_DECIDE, PHASE_WRITE, PHASE_SCAN };

struct run {
	const gfs_mirror_run_opts *o;
	gfs_conn *conn;
	gfs_mirror_plan plan;
	struct gfs_mirror_opts fo;  /* what the per-file calls take */
	gfs_backup backup;
	int rootfd;                 /* -1: DIR does not exist (a dry run) */
	unsigned char *results;
	size_t *todo;               /* indexes of the files to write */
	size_t ntodo;
	enum phase phase;
	gfs_mirror_finisher *fin;   /* fsync and rename for the per-file writers */

	atomic_size_t next;
	atomic_size_t written, attrs, skipped, failed, deleted, rmdirs, cleaned, done;
	atomic_uint_fast64_t bytes, done_bytes;
	atomic_bool backend_down;
	size_t refused;
	bool empty_refused;         /* --delete refused: nothing planned, DIR not empty */

	pthread_mutex_t evlock;     /* one event at a time */
	pthread_mutex_t lock;       /* running, cond */
	pthread_cond_t cond;
	int running;
};

static bool
interrupted(const struct run *r)
{
	return r->o->stop && atomic_load(r->o->stop) != 0;
}

static bool
stopped(struct run *r)
{
	return interrupted(r) || atomic_load(&r->backend_down);
}

/* ---- counts and events ----------------------------------------------- */

static void
snapshot(struct run *r, gfs_mirror_stats *st)
{
	memset(st, 0, sizeof *st);
	st->files = r->plan.count;
	st->total_bytes = r->plan.total_bytes;
	st->written = atomic_load(&r->written);
	st->attrs = atomic_load(&r->attrs);
	st->skipped = atomic_load(&r->skipped);
	st->deleted = atomic_load(&r->deleted);
	st->rmdirs = atomic_load(&r->rmdirs);
	st->cleaned = atomic_load(&r->cleaned);
	st->failed = atomic_load(&r->failed);
	st->refused = r->refused;
	st->bytes = atomic_load(&r->bytes);
	st->backed_up = atomic_load(&r->backup.kept);
	st->done = atomic_load(&r->done);
	st->done_bytes = atomic_load(&r->done_bytes);
	st->backend_down = atomic_load(&r->backend_down);
	st->empty_refused = r->empty_refused;
	st->interrupted = interrupted(r);
}

static void
emit(struct run *r, gfs_mirror_event *ev)
{
	if (!r->o->on_event)
		return;
	gfs_mirror_stats st;
	ev->dry_run = r->o->dry_run;
	pthread_mutex_lock(&r->evlock);
	snapshot(r, &st);
	ev->stats = &st;
	r->o->on_event(ev, r->o->ctx);
	pthread_mutex_unlock(&r->evlock);
}

static void
emit_kind(struct run *r, enum gfs_mirror_event_kind kind)
{
	gfs_mirror_event ev = {.kind = kind, .bytes = -1};
	emit(r, &ev);
}

static void
problem(struct run *r, const char *msg)
{
	gfs_mirror_event ev = {.kind = GFS_MIRROR_EV_PROBLEM, .msg = msg, .bytes = -1};
	emit(r, &ev);
}

static void
problemf(struct run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
problemf(struct run *r, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *msg = bson_strdupv_printf(fmt, ap);
	va_end(ap);
	problem(r, msg);
	bson_free(msg);
}

/* A failure that ends the run before any file: told in full, its kind in err. Returns false. */
static bool
fatal(struct run *r, gfs_error *err, enum gfs_errcode code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static bool
fatal(struct run *r, gfs_error *err, enum gfs_errcode code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *msg = bson_strdupv_printf(fmt, ap);
	va_end(ap);
	problem(r, msg);
	gfs_error_set(err, code, "%s", msg);
	bson_free(msg);
	return false;
}

static void
on_refused(const char *name, const gfs_error *why, void *ctx)
{
	gfs_mirror_event ev = {.kind = GFS_MIRROR_EV_REFUSED, .name = name, .msg = why->msg,
	                       .bytes = -1};
	emit(ctx, &ev);
}

static void
tell_item(struct run *r, enum gfs_mirror_event_kind kind, const struct gfs_mirror_item *it)
{
	gfs_mirror_event ev = {.kind = kind, .rel = it->rel, .rel_len = it->rel_len,
	                       .name = it->file.filename, .bytes = it->file.length};
	emit(r, &ev);
}

/* What the sweep, or a writer clearing the way, did with one local entry. */
static void
on_swept(enum gfs_mirror_sweep_kind kind, const char *rel, size_t len, const gfs_error *err,
         void *ctx)
{
	struct run *r = ctx;
	if (err) {
		atomic_fetch_add(&r->failed, 1);
		problem(r, err->msg);
		return;
	}
	static const enum gfs_mirror_event_kind kinds[] = {
		[GFS_MIRROR_CLEAN] = GFS_MIRROR_EV_CLEAN,
		[GFS_MIRROR_DELETE] = GFS_MIRROR_EV_DELETE,
		[GFS_MIRROR_RMDIR] = GFS_MIRROR_EV_RMDIR,
	};
	switch (kind) {
	case GFS_MIRROR_CLEAN: atomic_fetch_add(&r->cleaned, 1); break;
	case GFS_MIRROR_DELETE: atomic_fetch_add(&r->deleted, 1); break;
	case GFS_MIRROR_RMDIR: atomic_fetch_add(&r->rmdirs, 1); break;
	}
	gfs_mirror_event ev = {.kind = kinds[kind], .rel = rel, .rel_len = len, .bytes = -1};
	emit(r, &ev);
}

/* In name order: what a dry run would write, or what was written; and whose attributes. */
static void
tell_file_actions(struct run *r)
{
	unsigned char write = r->o->dry_run ? RES_TODO : RES_WRITE;
	for (size_t i = 0; i < r->plan.count; i++) {
		if (r->results[i] == write)
			tell_item(r, GFS_MIRROR_EV_WRITE, &r->plan.items[i]);
		else if (r->results[i] == RES_ATTRS)
			tell_item(r, GFS_MIRROR_EV_ATTRS, &r->plan.items[i]);
	}
}

/* ---- the workers ----------------------------------------------------- */

static void
count_failure(struct run *r, size_t i, const gfs_error *err)
{
	r->results[i] = RES_FAILED;
	if (err->code == GFS_ECANCELED && interrupted(r))
		return;
	atomic_fetch_add(&r->failed, 1);
	if (err->code == GFS_EBACKEND)
		atomic_store(&r->backend_down, true);
	problem(r, err->msg);
}

static void
count_done(struct run *r, size_t i)
{
	atomic_fetch_add(&r->done_bytes, (uint64_t)r->plan.items[i].file.length);
	atomic_fetch_add(&r->done, 1);
}

static void
decide_item(struct run *r, gfs_mirror_dir *d, gfs_session *s, size_t i)
{
	const struct gfs_mirror_item *it = &r->plan.items[i];
	enum gfs_mirror_action action;
	gfs_error err;
	gfs_error_clear(&err);
	bool ok = gfs_mirror_decide(d, s, it, &action, &err);
	if (ok && action == GFS_MIRROR_ATTRS && !r->o->dry_run)
		ok = gfs_mirror_apply(d, s, it, action, &err);
	if (!ok) {
		count_failure(r, i, &err);
		count_done(r, i);
		return;
	}
	switch (action) {
	case GFS_MIRROR_SKIP:
		r->results[i] = RES_SKIP;
		atomic_fetch_add(&r->skipped, 1);
		count_done(r, i);
		break;
	case GFS_MIRROR_ATTRS:
		r->results[i] = RES_ATTRS;
		atomic_fetch_add(&r->attrs, 1);
		count_done(r, i);
		break;
	case GFS_MIRROR_WRITE:
		r->results[i] = RES_TODO;
		if (r->o->dry_run) {
			atomic_fetch_add(&r->written, 1);
			atomic_fetch_add(&r->bytes, (uint64_t)it->file.length);
			count_done(r, i);
		}
		break;
	}
}

/* A file written (err NULL) or given up on, by either way of writing. */
static void
write_done(size_t i, const gfs_error *err, void *ctx)
{
	struct run *r = ctx;
	if (err) {
		count_failure(r, i, err);
	} else {
		r->results[i] = RES_WRITE;
		atomic_fetch_add(&r->written, 1);
		atomic_fetch_add(&r->bytes, (uint64_t)r->plan.items[i].file.length);
	}
	count_done(r, i);
}

static void
write_item(struct run *r, gfs_mirror_dir *d, gfs_session *s, size_t i)
{
	if (r->results[i] != RES_TODO)
		return;
	gfs_error err;
	gfs_error_clear(&err);
	if (r->fin) {
		if (!gfs_mirror_write_queued(d, s, i, r->fin, &err))
			write_done(i, &err, r);
		return;
	}
	bool ok = gfs_mirror_apply(d, s, &r->plan.items[i], GFS_MIRROR_WRITE, &err);
	write_done(i, ok ? NULL : &err, r);
}

static void
scan_all(struct run *r, gfs_mirror_dir *d, gfs_session *s)
{
	gfs_error err;
	gfs_error_clear(&err);
	if (!gfs_mirror_scan(d, s, &r->plan, r->todo, r->ntodo, r->o->hold, r->o->jobs, write_done,
	                     r, &err) &&
	    !(err.code == GFS_ECANCELED && interrupted(r))) {
		atomic_fetch_add(&r->failed, 1);
		if (err.code == GFS_EBACKEND)
			atomic_store(&r->backend_down, true);
		problem(r, err.msg);
	}
}

static void *
worker(void *arg)
{
	struct run *r = arg;
	gfs_session *s = gfs_session_pop(r->conn);
	gfs_mirror_dir *d = gfs_mirror_dir_new(r->rootfd, &r->fo);
	if (r->phase == PHASE_SCAN)
		scan_all(r, d, s);
	while (r->phase != PHASE_SCAN && !stopped(r)) {
		size_t i = atomic_fetch_add(&r->next, 1);
		if (i >= r->plan.count)
			break;
		if (r->phase == PHASE_DECIDE)
			decide_item(r, d, s, i);
		else
			write_item(r, d, s, i);
	}
	gfs_error err;
	if (!gfs_mirror_dir_close(d, &err)) {
		atomic_fetch_add(&r->failed, 1);
		problem(r, err.msg);
	}
	gfs_session_push(s);
	pthread_mutex_lock(&r->lock);
	r->running--;
	pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

/* Runs one phase on n threads; the calling thread sends progress meanwhile. */
static void
run_phase(struct run *r, enum phase phase, long n)
{
	r->phase = phase;
	atomic_store(&r->next, 0);
	pthread_t *tids = gfs_xcalloc((size_t)n, sizeof *tids);
	r->running = 0;
	for (long i = 0; i < n; i++) {
		pthread_mutex_lock(&r->lock);
		r->running++;
		pthread_mutex_unlock(&r->lock);
		if (pthread_create(&tids[i], NULL, worker, r) != 0) {
			pthread_mutex_lock(&r->lock);
			r->running--;
			pthread_mutex_unlock(&r->lock);
			n = i;
			break;
		}
	}
	if (n == 0) {
		r->running = 1;
		worker(r); /* no thread could start: do the work here */
	}
	pthread_mutex_lock(&r->lock);
	while (r->running > 0) {
		struct timespec ts;
		gfs_deadline_in(&ts, 200);
		pthread_cond_timedwait(&r->cond, &r->lock, &ts);
		pthread_mutex_unlock(&r->lock);
		emit_kind(r, GFS_MIRROR_EV_PROGRESS);
		pthread_mutex_lock(&r->lock);
	}
	pthread_mutex_unlock(&r->lock);
	for (long i = 0; i < n; i++)
		pthread_join(tids[i], NULL);
	free(tids);
}

/*
 * Reading many files at once (read_strategy.h has what each way costs): each
 * file's chunks by a query of its own, or one pass over all chunks when
 * most of the bucket is to be written. The bucket's files are counted only
 * for more than GFS_READ_FEW files to write.
 */
static enum gfs_read_strategy
choose_read(gfs_session *s, const gfs_read_caps *caps, size_t nwrite)
{
	int64_t total = -1;
	if (nwrite > GFS_READ_FEW) {
		bson_error_t berr;
		total = mongoc_collection_estimated_document_count(s->files, NULL, NULL, NULL, &berr);
	}
	return gfs_read_choose(caps, false, nwrite, total);
}

/* Whether to write from a scan before the per-file writes. */
static bool
want_scan(struct run *r)
{
	enum gfs_read_strategy used = gfs_read_resolve(r->o->read);
	if (used == GFS_READ_AUTO) {
		gfs_session *s = gfs_session_pop(r->conn);
		gfs_read_caps caps;
		gfs_read_caps_probe(s, &caps);
		used = choose_read(s, &caps, r->ntodo);
		gfs_session_push(s);
	}
	return used == GFS_READ_SCAN;
}

/*
 * --backup-dir: the files about to be overwritten are kept first. One that
 * cannot be is not written, so nothing is destroyed unkept.
 */
static void
backup_overwrites(struct run *r)
{
	size_t n = 0;
	for (size_t k = 0; k < r->ntodo && !interrupted(r); k++) {
		size_t i = r->todo[k];
		const struct gfs_mirror_item *it = &r->plan.items[i];
		gfs_error err;
		if (gfs_backup_keep(r->fo.backup, r->rootfd, it->rel, it->rel_len, &err)) {
			r->todo[n++] = i;
			continue;
		}
		count_failure(r, i, &err);
		count_done(r, i);
	}
	r->ntodo = n;
}

static void
run_workers(struct run *r)
{
	long jobs = r->o->jobs;
	if ((size_t)jobs > r->plan.count)
		jobs = r->plan.count ? (long)r->plan.count : 1;
	emit_kind(r, GFS_MIRROR_EV_BEGIN);
	run_phase(r, PHASE_DECIDE, jobs);
	r->todo = gfs_xcalloc(r->plan.count + 1, sizeof *r->todo);
	for (size_t i = 0; i < r->plan.count; i++)
		if (r->results[i] == RES_TODO)
			r->todo[r->ntodo++] = i;
	if (r->fo.backup && !r->o->dry_run)
		backup_overwrites(r);
	if (!r->o->dry_run && r->ntodo > 0 && !stopped(r) && want_scan(r))
		run_phase(r, PHASE_SCAN, 1);
	/*
	 * File by file: everything, or what the scan saw no chunk of. With
	 * fsync, finisher threads take the flushes off the readers.
	 */
	if (!r->o->dry_run && r->ntodo > 0 && !stopped(r)) {
		if (r->fo.fsync)
			r->fin = gfs_mirror_finisher_start(&r->plan, r->o->jobs, write_done, r);
		run_phase(r, PHASE_WRITE, jobs);
		gfs_error err;
		if (!gfs_mirror_finisher_stop(r->fin, &err)) {
			atomic_fetch_add(&r->failed, 1);
			problem(r, err.msg);
		}
		r->fin = NULL;
	}
	emit_kind(r, GFS_MIRROR_EV_END);
}

/* ---- setting up ------------------------------------------------------ */

/* mkdir -p for DIR itself, which the user named and so may contain symlinks. */
static int
make_dirs(const char *path)
{
	if (path[0] == '\0') {
		errno = ENOENT; /* the loop below starts after the first byte */
		return -1;
	}
	char *p = gfs_xstrdup(path);
	int rc = 0;
	for (char *s = p + 1; rc == 0; s++) {
		if (*s != '/' && *s != '\0')
			continue;
		char c = *s;
		*s = '\0';
		if (mkdir(p, 0777) < 0 && errno != EEXIST)
			rc = -1;
		*s = c;
		if (c == '\0')
			break;
	}
	free(p);
	return rc;
}

/* Opens (and unless a dry run, creates and locks) DIR. */
static bool
open_root(struct run *r, gfs_error *err)
{
	const char *dir = r->o->dir;
	r->rootfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (r->rootfd < 0 && errno == ENOENT && r->o->dry_run)
		return true; /* nothing there yet: everything would be written */
	if (r->rootfd < 0 && errno == ENOENT) {
		if (make_dirs(dir) < 0)
			return fatal(r, err, GFS_ELOCAL, "%s: cannot create: %s", dir, strerror(errno));
		r->rootfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	}
	if (r->rootfd < 0)
		return fatal(r, err, GFS_ELOCAL, "%s: %s", dir, strerror(errno));
	if (r->o->dry_run)
		return true;
	/* The sweep removes temporary files, so two runs into one DIR must not overlap. */
	if (flock(r->rootfd, LOCK_EX | LOCK_NB) < 0) {
		if (errno == EWOULDBLOCK)
			return fatal(r, err, GFS_EBUSY, "%s: another mirror is writing into this directory",
			             dir);
		return fatal(r, err, GFS_ELOCAL, "%s: cannot lock: %s", dir, strerror(errno));
	}
	return true;
}

/* --backup-dir opened (made if missing), and --max-delete checked before anything changes. */
static bool
guard_deletes(struct run *r, gfs_error *err)
{
	const gfs_mirror_run_opts *o = r->o;
	/* A dry run makes nothing, so a BDIR still to be made is not checked yet. */
	/* Refused before anything is made: a BDIR made inside DIR would stay there. */
	if (o->backup_dir && r->rootfd >= 0 && !gfs_backup_check(o->backup_dir, r->rootfd, err)) {
		problem(r, err->msg);
		return false;
	}
	bool backup = o->backup_dir && r->rootfd >= 0 &&
	              !(o->dry_run && access(o->backup_dir, F_OK) < 0);
	if (backup) {
		if (!o->dry_run && make_dirs(o->backup_dir) < 0)
			return fatal(r, err, GFS_ELOCAL, "--backup-dir %s: cannot create: %s",
			             o->backup_dir, strerror(errno));
		if (!gfs_backup_open(&r->backup, o->backup_dir, r->rootfd, o->fsync, err)) {
			problem(r, err->msg);
			return false;
		}
		r->fo.backup = &r->backup;
	}
	if (!o->delete_missing || !o->max_delete.set || r->rootfd < 0)
		return true;
	uint64_t deletes, kept;
	if (!gfs_mirror_count_deletes(r->rootfd, &r->plan, &deletes, &kept))
		return fatal(r, err, GFS_ELOCAL, "not deleting anything: %s could not all be read to "
		             "count what --delete would remove", o->dir);
	if (gfs_max_delete_check(&o->max_delete, deletes, deletes + kept, "mirror --delete", err))
		return true;
	problem(r, err->msg);
	return false;
}

static bool
load_plan(struct run *r, gfs_error *err)
{
	gfs_session *s = gfs_session_pop(r->conn);
	bool ok = gfs_mirror_plan_load(s, r->o->prefix, &r->plan, on_refused, r, &r->refused, err);
	gfs_session_push(s);
	if (ok && r->o->select)
		gfs_mirror_plan_filter(&r->plan, r->o->select, r->o->select_ctx);
	atomic_fetch_add(&r->failed, r->refused);
	if (!ok)
		problem(r, err->msg);
	return ok;
}

/* The per-file calls' options, from the run's. */
static void
file_opts(struct run *r)
{
	mode_t um = umask(0);
	umask(um);
	r->fo.checksum = r->o->checksum;
	r->fo.size_only = r->o->size_only;
	r->fo.ignore_existing = r->o->ignore_existing;
	r->fo.fsync = r->o->fsync;
	r->fo.create_mode = 0666 & ~um;
	r->fo.stop = r->o->stop;
	r->fo.clear = r->o->delete_missing;
	r->fo.plan = &r->plan;
	r->fo.removed = on_swept;
	r->fo.removed_ctx = r;
}

/* ---- the sweep --------------------------------------------------------- */

/* True when DIR holds anything but temporary files (or cannot be read). */
static bool
holds_files(int rootfd)
{
	int fd = fcntl(rootfd, F_DUPFD_CLOEXEC, 0);
	DIR *dp = fd >= 0 ? fdopendir(fd) : NULL;
	if (!dp) {
		if (fd >= 0)
			close(fd);
		return true;
	}
	bool found = false;
	struct dirent *de;
	while (!found && (errno = 0, de = readdir(dp)) != NULL) {
		const char *n = de->d_name;
		found = strcmp(n, ".") != 0 && strcmp(n, "..") != 0 &&
		        !gfs_mirror_is_temp_name(n, strlen(n));
	}
	if (!found && errno != 0)
		found = true; /* unreadable: assume the worst */
	closedir(dp);
	return found;
}

/* Whether a sweep with --delete would delete anything (without filters: DIR is not empty). */
static bool
would_delete(struct run *r)
{
	if (!r->plan.select)
		return holds_files(r->rootfd);
	uint64_t deletes, kept;
	return !gfs_mirror_count_deletes(r->rootfd, &r->plan, &deletes, &kept) || deletes > 0;
}

/*
 * An empty plan with --delete would remove everything in DIR, and that is
 * what a mistyped --prefix or the wrong bucket look like: refused unless
 * the user says it is meant.
 */
static bool
refuse_empty_delete(struct run *r)
{
	const gfs_mirror_run_opts *o = r->o;
	if (r->plan.count > 0 || o->allow_empty || !would_delete(r))
		return false;
	bool prefixed = o->prefix && o->prefix[0];
	if (r->plan.select && prefixed)
		problemf(r, "not deleting anything: the filters take no file under '%s' in the bucket, "
		         "and %s holds files they take; --allow-empty to delete them", o->prefix, o->dir);
	else if (r->plan.select)
		problemf(r, "not deleting anything: the filters take no file of the bucket, and %s "
		         "holds files they take; --allow-empty to delete them", o->dir);
	else if (prefixed)
		problemf(r, "not deleting anything: no files under '%s' in the bucket, and %s is not "
		         "empty; --allow-empty to delete all of it", o->prefix, o->dir);
	else
		problemf(r, "not deleting anything: the bucket has no files, and %s is not empty; "
		         "--allow-empty to delete all of it", o->dir);
	r->empty_refused = true;
	return true;
}

/* Removes stale temporary files always, and with --delete what the bucket lacks. */
static void
sweep(struct run *r)
{
	if (r->rootfd < 0 || stopped(r))
		return;
	bool del = r->o->delete_missing;
	size_t failed = atomic_load(&r->failed);
	if (del && failed > 0) {
		problemf(r, "not deleting anything: %zu error%s in this run", failed,
		         failed == 1 ? "" : "s");
		del = false;
	}
	if (del && refuse_empty_delete(r))
		del = false;
	gfs_mirror_sweep(r->rootfd, &r->plan, del, r->o->dry_run, r->fo.backup, on_swept, r);
}

/* ---- the run ----------------------------------------------------------- */

static void
run_free(struct run *r)
{
	if (r->fo.backup)
		gfs_backup_close(r->fo.backup);
	if (r->rootfd >= 0)
		close(r->rootfd);
	free(r->results);
	free(r->todo);
	gfs_mirror_plan_free(&r->plan);
	pthread_mutex_destroy(&r->evlock);
	pthread_mutex_destroy(&r->lock);
	pthread_cond_destroy(&r->cond);
	free(r);
}

bool
gfs_mirror_run(gfs_conn *conn, const gfs_mirror_run_opts *o, gfs_mirror_stats *stats,
               gfs_error *err)
{
	struct run *r = gfs_xcalloc(1, sizeof *r);
	r->o = o;
	r->conn = conn;
	r->rootfd = -1;
	pthread_mutex_init(&r->evlock, NULL);
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->cond, NULL);
	gfs_error_clear(err);
	bool ok = load_plan(r, err) && open_root(r, err) && guard_deletes(r, err);
	if (ok) {
		r->results = gfs_xcalloc(r->plan.count + 1, 1);
		file_opts(r);
		run_workers(r);
		tell_file_actions(r);
		sweep(r);
		if (interrupted(r))
			problem(r, "interrupted; files finished so far are in place");
	}
	snapshot(r, stats);
	run_free(r);
	return ok;
}
