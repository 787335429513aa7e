/*
 * gridfsctl mirror: write the newest revision of every file under a prefix
 * back to a directory tree, incrementally and atomically, never outside it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../lib/backup.h"
#include "../lib/maxdelete.h"
#include "../lib/mirror.h"
#include "../lib/names.h"
#include "cmd.h"

enum { OPT_DELETE = 0x100, OPT_NO_FSYNC, OPT_JSON, OPT_READ, OPT_ALLOW_EMPTY, OPT_MAX_DELETE,
       OPT_BACKUP_DIR, OPT_HOLD, OPT_SIZE_ONLY, OPT_IGNORE_EXISTING };

static const struct cmd_opt mirror_opts[] = {
	PREFIX_OPT("mirror the files under folder P (DIR/x for P/x)"),
	CMD_OPT_GROUP(filter_opts),
	CMD_OPT(0, "delete", NULL, "remove local files the bucket does not have (never after an error)",
	        .id = OPT_DELETE),
	CMD_OPT(0, "allow-empty", NULL, "let --delete empty DIR when nothing is stored under the prefix",
	        .id = OPT_ALLOW_EMPTY),
	CMD_OPT(0, "max-delete", "N|P%", "let --delete remove at most N files (P% of the files in DIR); "
	        "above that change nothing and exit 7", .id = OPT_MAX_DELETE),
	CMD_OPT(0, "backup-dir", "DIR", "move what --delete or an overwrite would destroy there (same "
	        "relative path; not inside the mirrored DIR)", .id = OPT_BACKUP_DIR),
	CMD_OPT('n', "dry-run", NULL, "print what would be done, change nothing"),
	CMD_OPT('v', "verbose", NULL, "print each file written, fixed or deleted"),
	CMD_OPT('j', "jobs", "N", "files read in parallel (default 4)"),
	CMD_OPT('c', "checksum", NULL, "compare content by sha256, not size and mtime"),
	CMD_OPT(0, "size-only", NULL, "a local file of the stored size is up to date (mtime and mode "
	        "not compared)", .id = OPT_SIZE_ONLY),
	CMD_OPT(0, "ignore-existing", NULL, "leave every local file that exists as it is; write only "
	        "missing ones", .id = OPT_IGNORE_EXISTING),
	CMD_OPT(0, "no-fsync", NULL, "do not fsync files and directories (faster, not crash-safe)",
	        .id = OPT_NO_FSYNC),
	CMD_OPT(0, "read", "MODE", "how chunks are read: auto (default: by what is to be written and "
	        "what the server serves from an index), each (a query per file, --jobs at once; "
	        "batched is the same) or scan (one pass over all chunks in natural order)",
	        .id = OPT_READ, .values = "auto each batched scan"),
	CMD_OPT(0, "hold", "SIZE", "scan: chunks kept while they wait for their turn (default 64M); "
	        "past it their files are read one by one", .id = OPT_HOLD),
	CMD_OPT(0, "json", NULL, "a JSON summary at the end; with --dry-run or -v, one object per action",
	        .id = OPT_JSON),
	CMD_OPT_END,
};

#define DEFAULT_JOBS 4
#define MAX_JOBS 64

/* Per-item result, kept so a dry run can list actions in name order. */
enum { RES_PENDING, RES_SKIP, RES_TODO, RES_WRITE, RES_ATTRS, RES_FAILED };

struct mirror {
	/* options */
	const char *dir, *prefix, *backup_dir;
	bool del, allow_empty, dry_run, verbose, checksum, no_fsync, json, size_only, ignore_existing;
	struct name_filter filter;
	gfs_max_delete max_delete;
	gfs_backup backup;
	long jobs;
	size_t hold;           /* --hold: bytes of chunks a scan keeps waiting for their turn */

	gfs_conn *conn;
	gfs_mirror_plan plan;
	struct gfs_mirror_opts opts;
	int rootfd;
	unsigned char *results;
	size_t *todo;          /* indexes of the files to write */
	size_t ntodo;
	enum gfs_read_strategy read_mode;
	enum gfs_read_strategy read_used;   /* what read_mode came to for this run */
	gfs_read_caps caps;
	int phase;
	gfs_mirror_finisher *fin;  /* fsync and rename for the per-file writers */

	atomic_size_t next;
	atomic_size_t written, attrs, skipped, failed, deleted, rmdirs, cleaned, done;
	atomic_uint_fast64_t bytes, done_bytes;
	atomic_bool backend_down;
	size_t refused;
	bool empty_refused;     /* --delete refused: nothing planned, DIR not empty */
	char *error;            /* the first error reported, for the JSON summary */

	pthread_mutex_t lock;
	pthread_cond_t cond;
	int running;
};

static bool
interrupted(void)
{
	return atomic_load(&stop_signal) != 0;
}

static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct mirror *m = ctx;
	switch (opt) {
	case 'p': m->prefix = arg; return 0;
	case OPT_SIZE_ONLY: m->size_only = true; return 0;
	case OPT_IGNORE_EXISTING: m->ignore_existing = true; return 0;
	case OPT_DELETE: m->del = true; return 0;
	case OPT_ALLOW_EMPTY: m->allow_empty = true; return 0;
	case OPT_MAX_DELETE: return max_delete_option(arg, &m->max_delete);
	case OPT_BACKUP_DIR: m->backup_dir = arg; return 0;
	case 'n': m->dry_run = true; return 0;
	case 'v': m->verbose = true; return 0;
	case 'c': m->checksum = true; return 0;
	case OPT_NO_FSYNC: m->no_fsync = true; return 0;
	case OPT_JSON: m->json = true; return 0;
	case OPT_READ: return read_option("read", arg, &m->read_mode);
	case OPT_HOLD: return hold_option(arg, &m->hold);
	case 'j':
		if (!parse_int(arg, 1, MAX_JOBS, &m->jobs)) {
			usage_error("--jobs needs a number from 1 to %d", MAX_JOBS);
			return -1;
		}
		return 0;
	}
	return filter_option(opt, arg, &m->filter) == 0 ? 0 : -1;
}

/*
 * One error line; stdio's recursive lock keeps it whole among threads. The
 * first is kept for the summary, so that it says what went wrong.
 */
static void
report(struct mirror *m, const char *msg)
{
	pthread_mutex_lock(&m->lock);
	if (!m->error)
		m->error = strdup(msg);
	pthread_mutex_unlock(&m->lock);
	flockfile(stderr);
	if (G.progress && G.stats_s == 0)
		fputs("\r\033[K", stderr);
	warnx_("%s", msg);
	funlockfile(stderr);
}

static void
reportf(struct mirror *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
reportf(struct mirror *m, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *msg = bson_strdupv_printf(fmt, ap);
	va_end(ap);
	report(m, msg);
	bson_free(msg);
}

static void
on_refused(const char *name, const gfs_error *why, void *ctx)
{
	char shown[GFS_NAME_SHOWN_MAX];
	reportf(ctx, "%s: refused: %s", shown_name(shown, name), why->msg);
}

/* ---- the workers ----------------------------------------------------- */

/*
 * The run has phases, each spread over the worker threads: compare every
 * file with the disk (fixing mode and mtime in place where only those
 * differ), then write what differs, either file by file or, when most of
 * the bucket is to be written, from one pass over all chunks in natural order.
 */
enum phase { PHASE_DECIDE, PHASE_WRITE, PHASE_SCAN };

static void
count_failure(struct mirror *m, size_t i, const gfs_error *err)
{
	m->results[i] = RES_FAILED;
	if (err->code == GFS_ECANCELED && interrupted())
		return;
	atomic_fetch_add(&m->failed, 1);
	if (err->code == GFS_EBACKEND)
		atomic_store(&m->backend_down, true);
	report(m, err->msg);
}

static void
count_done(struct mirror *m, size_t i)
{
	atomic_fetch_add(&m->done_bytes, (uint64_t)m->plan.items[i].file.length);
	atomic_fetch_add(&m->done, 1);
}

static void
decide_item(struct mirror *m, gfs_mirror_dir *d, gfs_session *s, size_t i)
{
	const struct gfs_mirror_item *it = &m->plan.items[i];
	enum gfs_mirror_action action;
	gfs_error err;
	gfs_error_clear(&err);
	bool ok = gfs_mirror_decide(d, s, it, &action, &err);
	if (ok && action == GFS_MIRROR_ATTRS && !m->dry_run)
		ok = gfs_mirror_apply(d, s, it, action, &err);
	if (!ok) {
		count_failure(m, i, &err);
		count_done(m, i);
		return;
	}
	switch (action) {
	case GFS_MIRROR_SKIP:
		m->results[i] = RES_SKIP;
		atomic_fetch_add(&m->skipped, 1);
		count_done(m, i);
		break;
	case GFS_MIRROR_ATTRS:
		m->results[i] = RES_ATTRS;
		atomic_fetch_add(&m->attrs, 1);
		count_done(m, i);
		break;
	case GFS_MIRROR_WRITE:
		m->results[i] = RES_TODO;
		if (m->dry_run) {
			atomic_fetch_add(&m->written, 1);
			atomic_fetch_add(&m->bytes, (uint64_t)it->file.length);
			count_done(m, i);
		}
		break;
	}
}

/* A file written (err NULL) or given up on, by either way of writing. */
static void
write_done(size_t i, const gfs_error *err, void *ctx)
{
	struct mirror *m = ctx;
	if (err) {
		count_failure(m, i, err);
	} else {
		m->results[i] = RES_WRITE;
		atomic_fetch_add(&m->written, 1);
		atomic_fetch_add(&m->bytes, (uint64_t)m->plan.items[i].file.length);
	}
	count_done(m, i);
}

static void
write_item(struct mirror *m, gfs_mirror_dir *d, gfs_session *s, size_t i)
{
	if (m->results[i] != RES_TODO)
		return;
	gfs_error err;
	gfs_error_clear(&err);
	if (m->fin) {
		if (!gfs_mirror_write_queued(d, s, i, m->fin, &err))
			write_done(i, &err, m);
		return;
	}
	bool ok = gfs_mirror_apply(d, s, &m->plan.items[i], GFS_MIRROR_WRITE, &err);
	write_done(i, ok ? NULL : &err, m);
}

static void
scan_all(struct mirror *m, gfs_mirror_dir *d, gfs_session *s)
{
	gfs_error err;
	gfs_error_clear(&err);
	if (!gfs_mirror_scan(d, s, &m->plan, m->todo, m->ntodo, m->hold, (int)m->jobs, write_done,
	                     m, &err) &&
	    !(err.code == GFS_ECANCELED && interrupted())) {
		atomic_fetch_add(&m->failed, 1);
		if (err.code == GFS_EBACKEND)
			atomic_store(&m->backend_down, true);
		report(m, err.msg);
	}
}

static void *
worker(void *arg)
{
	struct mirror *m = arg;
	gfs_session *s = gfs_session_pop(m->conn);
	gfs_mirror_dir *d = gfs_mirror_dir_new(m->rootfd, &m->opts);
	if (m->phase == PHASE_SCAN)
		scan_all(m, d, s);
	while (m->phase != PHASE_SCAN && !interrupted() && !atomic_load(&m->backend_down)) {
		size_t i = atomic_fetch_add(&m->next, 1);
		if (i >= m->plan.count)
			break;
		if (m->phase == PHASE_DECIDE)
			decide_item(m, d, s, i);
		else
			write_item(m, d, s, i);
	}
	gfs_error err;
	if (!gfs_mirror_dir_close(d, &err)) {
		atomic_fetch_add(&m->failed, 1);
		report(m, err.msg);
	}
	gfs_session_push(s);
	pthread_mutex_lock(&m->lock);
	m->running--;
	pthread_cond_signal(&m->cond);
	pthread_mutex_unlock(&m->lock);
	return NULL;
}

static void
draw_progress(struct mirror *m, struct progress *p)
{
	progress_update(p, atomic_load(&m->done), atomic_load(&m->done_bytes));
}

/* Runs one phase on n threads; the calling thread keeps the progress line moving. */
static void
run_phase(struct mirror *m, enum phase phase, long n, struct progress *p)
{
	m->phase = phase;
	atomic_store(&m->next, 0);
	pthread_t *tids = gfs_xcalloc((size_t)n, sizeof *tids);
	m->running = 0;
	for (long i = 0; i < n; i++) {
		pthread_mutex_lock(&m->lock);
		m->running++;
		pthread_mutex_unlock(&m->lock);
		if (pthread_create(&tids[i], NULL, worker, m) != 0) {
			pthread_mutex_lock(&m->lock);
			m->running--;
			pthread_mutex_unlock(&m->lock);
			n = i;
			break;
		}
	}
	if (n == 0) {
		m->running = 1;
		worker(m); /* no thread could start: do the work here */
	}
	pthread_mutex_lock(&m->lock);
	while (m->running > 0) {
		struct timespec ts;
		gfs_deadline_in(&ts, 200);
		pthread_cond_timedwait(&m->cond, &m->lock, &ts);
		pthread_mutex_unlock(&m->lock);
		draw_progress(m, p);
		pthread_mutex_lock(&m->lock);
	}
	pthread_mutex_unlock(&m->lock);
	for (long i = 0; i < n; i++)
		pthread_join(tids[i], NULL);
	free(tids);
}

static bool
stopped(struct mirror *m)
{
	return interrupted() || atomic_load(&m->backend_down);
}

/* Whether to write from a scan before the per-file writes. */
static bool
want_scan(struct mirror *m)
{
	m->read_used = gfs_read_resolve(m->read_mode);
	if (m->read_used != GFS_READ_AUTO)
		return m->read_used == GFS_READ_SCAN;
	gfs_session *s = gfs_session_pop(m->conn);
	gfs_read_caps_probe(s, &m->caps);
	if (m->read_mode == GFS_READ_AUTO)
		m->read_used = gfs_mirror_choose_read(s, &m->caps, m->ntodo);
	gfs_session_push(s);
	return m->read_used == GFS_READ_SCAN;
}

/*
 * --backup-dir: the files about to be overwritten are kept first. One that
 * cannot be is not written, so nothing is destroyed unkept.
 */
static void
backup_overwrites(struct mirror *m)
{
	size_t n = 0;
	for (size_t k = 0; k < m->ntodo && !interrupted(); k++) {
		size_t i = m->todo[k];
		const struct gfs_mirror_item *it = &m->plan.items[i];
		gfs_error err;
		if (gfs_backup_keep(m->opts.backup, m->rootfd, it->rel, it->rel_len, &err)) {
			m->todo[n++] = i;
			continue;
		}
		count_failure(m, i, &err);
		count_done(m, i);
	}
	m->ntodo = n;
}

static void
run_workers(struct mirror *m)
{
	long jobs = m->jobs;
	if ((size_t)jobs > m->plan.count)
		jobs = m->plan.count ? (long)m->plan.count : 1;
	struct progress *p = progress_start("mirror", m->plan.count, m->plan.total_bytes);
	run_phase(m, PHASE_DECIDE, jobs, p);
	m->todo = gfs_xcalloc(m->plan.count + 1, sizeof *m->todo);
	for (size_t i = 0; i < m->plan.count; i++)
		if (m->results[i] == RES_TODO)
			m->todo[m->ntodo++] = i;
	if (m->opts.backup && !m->dry_run)
		backup_overwrites(m);
	if (!m->dry_run && m->ntodo > 0 && !stopped(m) && want_scan(m))
		run_phase(m, PHASE_SCAN, 1, p);
	/*
	 * File by file: everything, or what the scan saw no chunk of. With
	 * fsync, finisher threads take the flushes off the readers.
	 */
	if (!m->dry_run && m->ntodo > 0 && !stopped(m)) {
		if (m->opts.fsync)
			m->fin = gfs_mirror_finisher_start(&m->plan, (int)m->jobs, write_done, m);
		run_phase(m, PHASE_WRITE, jobs, p);
		gfs_error err;
		if (!gfs_mirror_finisher_stop(m->fin, &err)) {
			atomic_fetch_add(&m->failed, 1);
			report(m, err.msg);
		}
		m->fin = NULL;
	}
	draw_progress(m, p);
	progress_done(p);
}

/* ---- output ---------------------------------------------------------- */

static void
print_action(struct mirror *m, const char *action, const char *rel, size_t len,
             const struct gfs_mirror_item *it)
{
	if (!m->json) {
		action_line(stdout, m->dry_run, "%s %.*s", action, (int)len, rel);
		return;
	}
	bson_t doc;
	json_event(&doc, action);
	json_path(&doc, rel, len);
	if (it) {
		json_filename(&doc, it->file.filename);
		BSON_APPEND_INT64(&doc, "bytes", it->file.length);
	}
	if (m->dry_run)
		BSON_APPEND_BOOL(&doc, "dryRun", true);
	print_json(stdout, &doc);
	bson_destroy(&doc);
}

/* In name order: what a dry run would write, or (-v) what was written. */
static void
print_file_actions(struct mirror *m)
{
	unsigned char write = m->dry_run ? RES_TODO : RES_WRITE;
	for (size_t i = 0; i < m->plan.count; i++) {
		const struct gfs_mirror_item *it = &m->plan.items[i];
		if (m->results[i] == write)
			print_action(m, "write", it->rel, it->rel_len, it);
		else if (m->results[i] == RES_ATTRS)
			print_action(m, "attrs", it->rel, it->rel_len, it);
	}
}

static void
on_swept(enum gfs_mirror_sweep_kind kind, const char *rel, size_t len, const gfs_error *err,
         void *ctx)
{
	struct mirror *m = ctx;
	if (err) {
		atomic_fetch_add(&m->failed, 1);
		report(m, err->msg);
		return;
	}
	switch (kind) {
	case GFS_MIRROR_CLEAN: atomic_fetch_add(&m->cleaned, 1); break;
	case GFS_MIRROR_DELETE: atomic_fetch_add(&m->deleted, 1); break;
	case GFS_MIRROR_RMDIR: atomic_fetch_add(&m->rmdirs, 1); break;
	}
	if (m->dry_run || m->verbose) {
		const char *names[] = {"clean", "delete", "rmdir"};
		print_action(m, names[kind], rel, len, NULL);
	}
}

/* The counts, and with a failed run (rc not EXIT_OK) the first error as "error". */
static void
print_summary(struct mirror *m, int rc, double seconds)
{
	struct json_summary sum;
	json_summary_begin(&sum, "mirror", m->dry_run);
	bson_t *doc = &sum.body;
	BSON_APPEND_INT64(doc, "files", (int64_t)m->plan.count);
	BSON_APPEND_INT64(doc, "written", (int64_t)atomic_load(&m->written));
	BSON_APPEND_INT64(doc, "attrs", (int64_t)atomic_load(&m->attrs));
	BSON_APPEND_INT64(doc, "skipped", (int64_t)atomic_load(&m->skipped));
	BSON_APPEND_INT64(doc, "deleted", (int64_t)atomic_load(&m->deleted));
	BSON_APPEND_INT64(doc, "removedDirs", (int64_t)atomic_load(&m->rmdirs));
	BSON_APPEND_INT64(doc, "cleaned", (int64_t)atomic_load(&m->cleaned));
	BSON_APPEND_INT64(doc, "failed", (int64_t)atomic_load(&m->failed));
	BSON_APPEND_INT64(doc, "refused", (int64_t)m->refused);
	BSON_APPEND_INT64(doc, "bytes", (int64_t)atomic_load(&m->bytes));
	if (m->backup_dir)
		BSON_APPEND_INT64(doc, "backedUp", (int64_t)atomic_load(&m->backup.kept));
	const char *error = NULL;
	if (rc != EXIT_OK)
		error = m->error ? m->error : "interrupted";
	json_summary_end(stdout, &sum, seconds, error);
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

/* Opens (and unless a dry run, creates and locks) DIR. Returns an exit code. */
static int
open_root(struct mirror *m)
{
	m->rootfd = open(m->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (m->rootfd < 0 && errno == ENOENT && m->dry_run)
		return EXIT_OK; /* nothing there yet: everything would be written */
	if (m->rootfd < 0 && errno == ENOENT) {
		if (make_dirs(m->dir) < 0) {
			reportf(m, "%s: cannot create: %s", m->dir, strerror(errno));
			return EXIT_LOCAL;
		}
		m->rootfd = open(m->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	}
	if (m->rootfd < 0) {
		reportf(m, "%s: %s", m->dir, strerror(errno));
		return EXIT_LOCAL;
	}
	if (m->dry_run)
		return EXIT_OK;
	/* The sweep removes temporary files, so two runs into one DIR must not overlap. */
	if (flock(m->rootfd, LOCK_EX | LOCK_NB) < 0) {
		if (errno == EWOULDBLOCK) {
			reportf(m, "%s: another mirror is writing into this directory", m->dir);
			return EXIT_BUSY;
		}
		reportf(m, "%s: cannot lock: %s", m->dir, strerror(errno));
		return EXIT_LOCAL;
	}
	return EXIT_OK;
}

/* --backup-dir opened (made if missing), and --max-delete checked before anything changes. */
static int
guard_deletes(struct mirror *m)
{
	gfs_error err;
	/* A dry run makes nothing, so a BDIR still to be made is not checked yet. */
	/* Refused before anything is made: a BDIR made inside DIR would stay there. */
	if (m->backup_dir && m->rootfd >= 0 && !gfs_backup_check(m->backup_dir, m->rootfd, &err)) {
		report(m, err.msg);
		return exit_code_for(&err);
	}
	bool backup = m->backup_dir && m->rootfd >= 0 && !(m->dry_run && access(m->backup_dir, F_OK) < 0);
	if (backup) {
		if (!m->dry_run && make_dirs(m->backup_dir) < 0) {
			reportf(m, "--backup-dir %s: cannot create: %s", m->backup_dir, strerror(errno));
			return EXIT_LOCAL;
		}
		if (!gfs_backup_open(&m->backup, m->backup_dir, m->rootfd, !m->no_fsync, &err)) {
			report(m, err.msg);
			return exit_code_for(&err);
		}
		m->opts.backup = &m->backup;
	}
	if (!m->del || !m->max_delete.set || m->rootfd < 0)
		return EXIT_OK;
	uint64_t deletes, kept;
	if (!gfs_mirror_count_deletes(m->rootfd, &m->plan, &deletes, &kept)) {
		reportf(m, "not deleting anything: %s could not all be read to count what --delete "
		        "would remove", m->dir);
		return EXIT_LOCAL;
	}
	if (gfs_max_delete_check(&m->max_delete, deletes, deletes + kept, "mirror --delete", &err))
		return EXIT_OK;
	report(m, err.msg);
	return exit_code_for(&err);
}

/* A planned path the name filters take (the path is a stored name's, below --prefix). */
static bool
filtered_in(const char *rel, size_t len, void *ctx)
{
	(void)len;
	return filter_selects(ctx, rel);
}

static bool
load_plan(struct mirror *m, gfs_error *err)
{
	gfs_session *s = gfs_session_pop(m->conn);
	bool ok = gfs_mirror_plan_load(s, m->prefix, &m->plan, on_refused, m, &m->refused, err);
	gfs_session_push(s);
	if (ok && filter_active(&m->filter))
		gfs_mirror_plan_filter(&m->plan, filtered_in, &m->filter);
	atomic_fetch_add(&m->failed, m->refused);
	return ok;
}

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

/*
 * An empty plan with --delete would remove everything in DIR, and that is
 * what a mistyped --prefix or the wrong bucket look like: refused unless
 * the user says it is meant.
 */
static bool
refuse_empty_delete(struct mirror *m)
{
	if (m->plan.count > 0 || m->allow_empty || !holds_files(m->rootfd))
		return false;
	if (m->prefix && m->prefix[0])
		reportf(m, "not deleting anything: no files under '%s' in the bucket, and %s is not "
		        "empty; --allow-empty to delete all of it", m->prefix, m->dir);
	else
		reportf(m, "not deleting anything: the bucket has no files, and %s is not empty; "
		        "--allow-empty to delete all of it", m->dir);
	m->empty_refused = true;
	return true;
}

/* Removes stale temporary files always, and with --delete what the bucket lacks. */
static void
sweep(struct mirror *m)
{
	if (m->rootfd < 0 || interrupted() || atomic_load(&m->backend_down))
		return;
	bool del = m->del;
	size_t failed = atomic_load(&m->failed);
	if (del && failed > 0) {
		reportf(m, "not deleting anything: %zu error%s in this run", failed, failed == 1 ? "" : "s");
		del = false;
	}
	if (del && refuse_empty_delete(m))
		del = false;
	gfs_mirror_sweep(m->rootfd, &m->plan, del, m->dry_run, m->opts.backup, on_swept, m);
}

static int
exit_status(struct mirror *m)
{
	if (interrupted())
		return EXIT_INTERRUPTED;
	if (atomic_load(&m->backend_down))
		return EXIT_BACKEND;
	return atomic_load(&m->failed) || m->empty_refused ? EXIT_PARTIAL : EXIT_OK;
}

static int
mirror_run(struct mirror *m)
{
	double started = gfs_mono_seconds();
	m->conn = connect_or_warn();
	/* What a mirror writes to disk must not be undone by a rollback. */
	if (m->conn)
		gfs_conn_read_majority(m->conn);
	if (!m->conn) {
		m->error = strdup(last_message());
		if (m->json)
			print_summary(m, EXIT_USAGE, gfs_mono_seconds() - started);
		free(m->error);
		return EXIT_USAGE;
	}
	catch_interrupts(0, NULL);
	/* The listing first: an unreachable backend should leave no empty DIR behind. */
	gfs_error err;
	int rc = EXIT_OK;
	if (!load_plan(m, &err)) {
		report(m, err.msg);
		rc = exit_code_for(&err);
	} else {
		rc = open_root(m);
	}
	if (rc == EXIT_OK)
		rc = guard_deletes(m);
	if (rc != EXIT_OK) {
		if (m->json)
			print_summary(m, rc, gfs_mono_seconds() - started);
		free(m->error);
		gfs_mirror_plan_free(&m->plan);
		gfs_conn_close(m->conn);
		return rc;
	}
	m->results = gfs_xcalloc(m->plan.count + 1, 1);
	mode_t um = umask(0);
	umask(um);
	m->opts.checksum = m->checksum;
	m->opts.size_only = m->size_only;
	m->opts.ignore_existing = m->ignore_existing;
	m->opts.fsync = !m->no_fsync;
	m->opts.create_mode = 0666 & ~um;
	m->opts.stop = &stop_signal;
	m->opts.clear = m->del;
	m->opts.plan = &m->plan;
	m->opts.removed = on_swept;
	m->opts.removed_ctx = m;

	run_workers(m);
	if (m->dry_run || m->verbose)
		print_file_actions(m);
	sweep(m);
	if (interrupted())
		reportf(m, "interrupted; files finished so far are in place");
	rc = exit_status(m);
	if (m->json)
		print_summary(m, rc, gfs_mono_seconds() - started);
	free(m->error);
	free(m->results);
	free(m->todo);
	gfs_mirror_plan_free(&m->plan);
	gfs_conn_close(m->conn);
	return rc;
}

/* The operands and the options that do not go together; false after a usage error. */
static bool
usable(struct mirror *m, int nargs, char **args)
{
	if (nargs != 1) {
		usage_error(nargs < 1 ? "missing DIR" : "too many arguments");
		return false;
	}
	m->dir = args[0];
	if (!max_delete_fits(&m->max_delete, m->del))
		return false;
	if (m->dir[0] == '\0') {
		usage_error("DIR must not be empty");
		return false;
	}
	if (m->size_only && m->checksum) {
		usage_error("--size-only and --checksum contradict each other");
		return false;
	}
	/* The sweep would take a local file the filters leave out for one the bucket lacks. */
	if (m->del && filter_active(&m->filter)) {
		usage_error("--delete does not go with --include, --exclude or --files-from yet: "
		            "it would remove the local files they leave out");
		return false;
	}
	return true;
}

static int
cmd_mirror(int argc, char **argv)
{
	struct mirror m = {.jobs = DEFAULT_JOBS, .rootfd = -1, .read_mode = GFS_READ_AUTO};
	int first = parse_options(argc, argv, &cmd_mirror_entry, on_opt, &m);
	if (first < 0 || !usable(&m, argc - first, argv + first)) {
		free_name_filter(&m.filter);
		return EXIT_USAGE;
	}
	pthread_mutex_init(&m.lock, NULL);
	pthread_cond_init(&m.cond, NULL);
	int rc = mirror_run(&m);
	if (m.opts.backup)
		gfs_backup_close(m.opts.backup);
	if (m.rootfd >= 0)
		close(m.rootfd);
	pthread_mutex_destroy(&m.lock);
	pthread_cond_destroy(&m.cond);
	free_name_filter(&m.filter);
	return rc;
}

static const struct cmd_exit mirror_exits[] = {
	{0, "ok"}, {1, "some files failed"}, {2, "usage"}, {3, "backend"},
	{5, "DIR cannot be created or opened"}, {6, "another mirror writes into DIR"},
	{7, "--max-delete stopped the run"}, {130, "interrupted"}, {-1, NULL},
};

const struct cmd_entry cmd_mirror_entry = {
	"mirror", "write the bucket back to a disk tree", "DIR", mirror_opts, mirror_exits, cmd_mirror,
};
