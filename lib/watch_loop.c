/*
 * The watch loop (watch_loop.h): a table of changes waiting to settle, a
 * queue of moves and the removals they must follow, outages of the
 * backend, retries, bounded waiting and full passes, around epoll sets of
 * inotify, a timer and the caller's descriptor, with one worker thread
 * that makes every backend call, a turn of work at a time.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "import.h"
#include "inotify_tree.h"
#include "watch_names.h"
#include "lock.h"
#include "filename.h"
#include "strmap.h"
#include "util.h"
#include "watch_loop.h"

/* A file found by listing must stay the same at least this long: nothing says it is complete. */
#define FOUND_SETTLE_MS 200
/* Backoff of retries, from the first to the cap. */
#define RETRY_FIRST_MS 250
#define BACKEND_RETRY_CAP_MS 5000
#define LOCAL_RETRY_CAP_MS 60000
/* Full passes for directories that cannot be watched, when --rescan-every does not say. */
#define UNWATCHED_RESCAN_S 60
/*
 * Files stored in one batch through import's workers, at most: between
 * batches the loop reads inotify, so that a long burst does not overflow
 * the kernel's queue while a batch is being written.
 */
#define BATCH_MAX 2000
/*
 * Fewer files than this go one by one, as put stores them: a batch's
 * fixed cost (the import lock, a thread, a libmagic handle per worker)
 * is more than a few files' round trips, and a single change is the
 * latency that matters.
 */
#define BATCH_MIN 8
/*
 * Single-file moves and removals acted on in one batch, at most: a few
 * equality queries each and one bulk write, a few seconds at most, after
 * which the loop reads inotify again.
 */
#define OPS_BATCH 500
/* While names stored without the import lock are unsure and another holds it, a look this often. */
#define RECHECK_MS 1000

/* FILE_FOUND: found in a new directory, never seen closed; it may still be written. */
enum file_change { FILE_NONE, FILE_CHANGED, FILE_FOUND, FILE_REMOVED };

/*
 * A path with changes not yet acted on. A folder removed and a file made
 * under the same name within the settle time are both facts: one pending
 * kind would lose the folder's removal and leave its files stored.
 */
struct pending {
	char *rel;
	bool dir_removed;
	enum file_change file;
	struct stat seen;     /* FILE_FOUND: as last looked at */
	int64_t due_ms;
	int64_t since_ms;     /* wall clock of the first change not acted on */
	unsigned attempts;    /* failed local attempts, for the backoff */
	bool failed;          /* the batch it was in could not store it */
};

/* A move, or a removal a move must follow, in the order they happened. */
struct op {
	bool move;
	bool is_dir;
	char *from;           /* the move's source; NULL for a removal */
	char *rel;            /* the move's target, or what is removed */
	int64_t since_ms;
	struct op *next;
};

struct gfs_watcher {
	gfs_watch_opts o;
	bool delete, initial, unwatched_fail;
	gfs_max_delete max_delete;
	bool over_limit;      /* --max-delete stopped watching */
	long settle_ms, jobs, max_pending;
	gfs_watcher_event_fn on_event;
	void (*on_progress)(void *ctx);
	void *ctx;
	gfs_conn *conn;
	gfs_session *s;
	gfs_magic *magic;
	gfs_inotree *tree;
	int tfd;              /* the timer of what is next due */
	strmap *pending;
	gfs_known_names *known;   /* so that a burst of new names needs no lookups */
	struct op *ops, **ops_tail;
	size_t n_ops;
	uint64_t failures;
	/* full passes: owed after lost events or a dropped table, and periodic */
	bool pass_owed, overflowed;
	long pass_every_s;    /* 0: none */
	int64_t next_pass_ms;
	/* an outage of the backend */
	bool down;
	int64_t down_since_ms, retry_ms, backoff_ms;
	int64_t recheck_ms;   /* the next look at the import lock's takes, for unsure names */
	size_t in_flight;     /* changes in the batch being acted on */
	size_t retrying;      /* changes that failed and wait for their retry */
	/*
	 * The work (every backend call) runs on a thread of its own, one turn
	 * at a time, while the loop answers the caller's descriptor (status,
	 * the watchdog): the loop touches no state while busy, and the worker
	 * owns it, publishing what status says into shown.
	 */
	bool busy;
	pthread_t worker;
	int done_fd;          /* an eventfd: the worker's turn is over */
	bool work_ok;         /* what the turn's work() returned */
	atomic_bool stopping; /* asked to stop: the turn ends after the batch in flight */
	pthread_mutex_t mu;
	gfs_watcher_status shown;
};

static int64_t
mono_ms(void)
{
	return (int64_t)(gfs_mono_seconds() * 1000);
}

static void
emit(const gfs_watcher *w, gfs_watcher_event *ev)
{
	w->on_event(ev, w->ctx);
}

static void warning(const gfs_watcher *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
warning(const gfs_watcher *w, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *msg = bson_strdupv_printf(fmt, ap);
	va_end(ap);
	emit(w, &(gfs_watcher_event){.kind = GFS_WEV_WARNING, .message = msg});
	bson_free(msg);
}

/*
 * What is stored under a name changed, in the participles of gridfsctl(1),
 * JSON OUTPUT: "uploaded" or "replaced" (bytes), "deleted", "deleted-folder".
 */
static void
report(const gfs_watcher *w, const char *action, const char *name, int64_t bytes)
{
	gfs_watcher_event ev = {.kind = GFS_WEV_ACTION, .action = action, .name = name, .bytes = bytes};
	emit(w, &ev);
}

/* ---- the table of pending changes ------------------------------------- */

static size_t
waiting(const gfs_watcher *w)
{
	return strmap_count(w->pending) + w->n_ops;
}

static void
oldest_of(const char *key, void *value, void *ctx)
{
	(void)key;
	const struct pending *p = value;
	int64_t *oldest = ctx;
	if (!*oldest || p->since_ms < *oldest)
		*oldest = p->since_ms;
}

/* Wall clock ms of the oldest change waiting; 0 when none does. */
static int64_t
oldest_waiting(const gfs_watcher *w)
{
	int64_t oldest = 0;
	strmap_each(w->pending, oldest_of, &oldest);
	for (const struct op *op = w->ops; op; op = op->next)
		if (!oldest || op->since_ms < oldest)
			oldest = op->since_ms;
	return oldest;
}

static void
free_pending(const char *key, void *value, void *ctx)
{
	(void)key;
	(void)ctx;
	struct pending *p = value;
	free(p->rel);
	free(p);
}

static void
free_ops(gfs_watcher *w)
{
	while (w->ops) {
		struct op *op = w->ops;
		w->ops = op->next;
		free(op->from);
		free(op->rel);
		free(op);
	}
	w->ops_tail = &w->ops;
	w->n_ops = 0;
}

/* Past the bound, single changes give way to one full pass, which finds them all again. */
static void
drop_all(gfs_watcher *w)
{
	warning(w, "more than %ld changes wait; a full pass of %s replaces them", w->max_pending, w->o.dir);
	strmap_each(w->pending, free_pending, NULL);
	strmap_free(w->pending);
	w->pending = strmap_new(64);
	w->retrying = 0;
	free_ops(w);
	w->pass_owed = true;
}

static void
drop_pending(gfs_watcher *w, struct pending *p)
{
	if (p->attempts)
		w->retrying--;
	strmap_del(w->pending, p->rel);
	free(p->rel);
	free(p);
}

static struct pending *
pending_for(gfs_watcher *w, const char *rel)
{
	struct pending *p = strmap_get(w->pending, rel);
	if (p)
		return p;
	p = gfs_xcalloc(1, sizeof *p);
	p->rel = gfs_xstrdup(rel);
	p->since_ms = gfs_now_ms();
	strmap_put(w->pending, p->rel, p);
	return p;
}

static void
push_op(gfs_watcher *w, bool move, const char *from, const char *rel, bool is_dir)
{
	struct op *op = gfs_xcalloc(1, sizeof *op);
	op->move = move;
	op->is_dir = is_dir;
	op->from = gfs_xstrdup(from);
	op->rel = gfs_xstrdup(rel);
	op->since_ms = gfs_now_ms();
	*w->ops_tail = op;
	w->ops_tail = &op->next;
	w->n_ops++;
}

/*
 * Looks at a found file again; true when its size and mtime are those
 * seen a settle time ago. A file that cannot be looked at is left for
 * gfs_watch_sync_file to report.
 */
static bool
unchanged_since_seen(const gfs_watcher *w, struct pending *p)
{
	char *path;
	path = gfs_xasprintf("%s/%s", w->o.dir, p->rel);
	struct stat st;
	int rc = lstat(path, &st);
	free(path);
	if (rc < 0)
		return true;
	bool same = st.st_size == p->seen.st_size && st.st_mtim.tv_sec == p->seen.st_mtim.tv_sec &&
	            st.st_mtim.tv_nsec == p->seen.st_mtim.tv_nsec;
	p->seen = st;
	return same;
}

static int64_t
found_settle_ms(const gfs_watcher *w)
{
	return w->settle_ms > FOUND_SETTLE_MS ? w->settle_ms : FOUND_SETTLE_MS;
}

/* Whether rel is top or below it. */
static bool
is_under(const char *rel, const char *top)
{
	size_t n = strlen(top);
	return strncmp(rel, top, n) == 0 && (rel[n] == '\0' || rel[n] == '/');
}

struct related {
	const char *a, *b;
	struct pending **v;
	size_t n;
};

static void
collect_related(const char *key, void *value, void *ctx)
{
	struct related *r = ctx;
	if (is_under(key, r->a) || is_under(r->a, key) || (r->b && (is_under(key, r->b) || is_under(r->b, key))))
		r->v[r->n++] = value;
}

static int
by_rel(const void *a, const void *b)
{
	const struct pending *x = *(struct pending *const *)a, *y = *(struct pending *const *)b;
	return strcmp(x->rel, y->rel);
}

/*
 * Before a move is queued, the removals waiting at its ends, above them
 * and below them are queued ahead of it: applied after the rename, they
 * would remove what it brought. A file removed under a folder moved away
 * is removed under its old name first; left waiting, it would be lost
 * (the folder's new name has no such file to remove) and the rename
 * would carry the stored file along.
 */
static void
queue_removals_before(gfs_watcher *w, const char *from, const char *to)
{
	struct related r = {.a = from, .b = to};
	r.v = gfs_xreallocarray(NULL, strmap_count(w->pending) + 1, sizeof *r.v);
	strmap_each(w->pending, collect_related, &r);
	qsort(r.v, r.n, sizeof *r.v, by_rel);
	for (size_t i = 0; i < r.n; i++) {
		struct pending *p = r.v[i];
		if (p->dir_removed)
			push_op(w, false, NULL, p->rel, true);
		p->dir_removed = false;
	}
	for (size_t i = 0; i < r.n; i++) {
		struct pending *p = r.v[i];
		if (p->file == FILE_REMOVED && (is_under(p->rel, to) || is_under(p->rel, from))) {
			push_op(w, false, NULL, p->rel, false);
			p->file = FILE_NONE;
		}
		if (p->file == FILE_NONE && !p->dir_removed)
			drop_pending(w, p);
	}
	free(r.v);
}

/* What waits under a directory moved away waits under its new name. */
static void
rekey_under(gfs_watcher *w, const char *from, const char *to)
{
	struct related r = {.a = from};
	r.v = gfs_xreallocarray(NULL, strmap_count(w->pending) + 1, sizeof *r.v);
	strmap_each(w->pending, collect_related, &r);
	size_t cut = strlen(from);
	for (size_t i = 0; i < r.n; i++) {
		struct pending *p = r.v[i];
		if (!is_under(p->rel, from) || !p->rel[cut])
			continue;
		char *rel;
		rel = gfs_xasprintf("%s%s", to, p->rel + cut);
		enum file_change file = p->file;
		struct stat seen = p->seen;
		drop_pending(w, p);
		if (file == FILE_CHANGED || file == FILE_FOUND) {
			struct pending *q = pending_for(w, rel);
			q->file = file;
			q->seen = seen;
			q->due_ms = mono_ms() + w->settle_ms;
		}
		free(rel);
	}
	free(r.v);
}

static void on_change(const gfs_inotree_event *ev, void *ctx);

static void
on_moved(gfs_watcher *w, const gfs_inotree_event *ev)
{
	bool is_dir = ev->kind == GFS_INO_DIR_MOVED;
	if (!w->delete) {
		/* the old name stays stored: the new one needs its own copy */
		if (is_dir)
			gfs_inotree_list(w->tree, ev->rel, on_change, w);
		else
			on_change(&(gfs_inotree_event){.kind = GFS_INO_CHANGED, .rel = ev->rel}, w);
		return;
	}
	queue_removals_before(w, ev->from, ev->rel);
	struct pending *src = strmap_get(w->pending, ev->from);
	bool carried = !is_dir && src && (src->file == FILE_CHANGED || src->file == FILE_FOUND);
	if (carried) {
		/* not stored yet as it is: the copy renamed is stale, the new name is stored after */
		src->file = FILE_NONE;
		if (!src->dir_removed)
			drop_pending(w, src);
	}
	if (is_dir)
		rekey_under(w, ev->from, ev->rel);
	push_op(w, true, ev->from, ev->rel, is_dir);
	if (carried) {
		struct pending *p = pending_for(w, ev->rel);
		p->file = FILE_CHANGED;
		p->due_ms = mono_ms() + w->settle_ms;
	}
}

static void
on_change(const gfs_inotree_event *ev, void *ctx)
{
	gfs_watcher *w = ctx;
	if (ev->kind == GFS_INO_OVERFLOW) {
		w->pass_owed = w->overflowed = true;
		return;
	}
	if (ev->kind == GFS_INO_MOVED || ev->kind == GFS_INO_DIR_MOVED) {
		on_moved(w, ev);
	} else {
		struct pending *p = pending_for(w, ev->rel);
		/* For the file, the latest event decides: written then removed is removed. */
		if (ev->kind == GFS_INO_DIR_REMOVED) {
			p->dir_removed = true;
		} else if (ev->kind == GFS_INO_CHANGED) {
			p->file = FILE_CHANGED;
		} else if (ev->kind == GFS_INO_REMOVED) {
			p->file = FILE_REMOVED;
		} else if (ev->kind == GFS_INO_FOUND && p->file != FILE_CHANGED) {
			p->file = FILE_FOUND;
			unchanged_since_seen(w, p);
		}
		p->due_ms = mono_ms() + (p->file == FILE_FOUND ? found_settle_ms(w) : w->settle_ms);
	}
	if ((long)waiting(w) > w->max_pending)
		drop_all(w);
}

static void
on_inotree_warning(const char *rel, const char *reason, void *ctx)
{
	gfs_watcher *w = ctx;
	warning(w, "%s/%s: cannot watch: %s", w->o.dir, rel, reason);
}

/* ---- the backend and its outages ------------------------------------- */

static void publish(gfs_watcher *w);

static void
backend_down(gfs_watcher *w, const gfs_error *err)
{
	w->backoff_ms = w->backoff_ms ? w->backoff_ms * 2 : RETRY_FIRST_MS;
	if (w->backoff_ms > BACKEND_RETRY_CAP_MS)
		w->backoff_ms = BACKEND_RETRY_CAP_MS;
	w->retry_ms = mono_ms() + w->backoff_ms;
	if (w->down)
		return;
	/* once per outage: a line per file would bury the one that matters */
	w->down = true;
	w->down_since_ms = gfs_now_ms();
	/* Status asked once the event is out must say so, while the worker still works. */
	publish(w);
	gfs_watcher_event ev = {.kind = GFS_WEV_BACKEND_DOWN, .message = err->msg,
	                        .pending = waiting(w), .since_ms = w->down_since_ms};
	emit(w, &ev);
}

/* During an outage, a ping when the backoff says; true once the backend answers again. */
static bool
backend_up(gfs_watcher *w)
{
	if (!w->down)
		return true;
	if (mono_ms() < w->retry_ms)
		return false;
	gfs_error err;
	if (!gfs_conn_ping(w->conn, &err)) {
		backend_down(w, &err);
		return false;
	}
	gfs_watcher_event ev = {.kind = GFS_WEV_BACKEND_UP, .pending = waiting(w),
	                        .since_ms = w->down_since_ms};
	w->down = false;
	w->backoff_ms = 0;
	publish(w);
	emit(w, &ev);
	return true;
}

/*
 * A failed action: of the backend, an outage starts and the change waits
 * for it; of the local side, this path alone is retried later.
 * Either way the change stays.
 */
static void
action_failed(gfs_watcher *w, struct pending *p, const char *what, const gfs_error *err)
{
	if (err->code == GFS_EBACKEND) {
		backend_down(w, err);
		return;
	}
	if (!p) {
		warning(w, "%s: %s", what, err->msg);
		w->failures++;
		return;
	}
	if (p->attempts++ == 0) {
		w->retrying++;
		warning(w, "%s: %s; retrying", what, err->msg);
	}
	int64_t wait = (int64_t)RETRY_FIRST_MS << (p->attempts < 8 ? p->attempts : 8);
	p->due_ms = mono_ms() + (wait < LOCAL_RETRY_CAP_MS ? wait : LOCAL_RETRY_CAP_MS);
}

/* ---- acting on changes ----------------------------------------------- */

static void
report_removed(const gfs_watcher *w, const char *rel, bool is_dir, uint64_t removed)
{
	if (!is_dir && !removed)
		return;
	/* A folder's files may have gone one by one already; its own removal is still news. */
	char *name = gfs_prefix_join(w->o.prefix, rel);
	report(w, is_dir ? "deleted-folder" : "deleted", name, -1);
	free(name);
}

static char *
stored_name(const gfs_watcher *w, const char *rel)
{
	bool escaped;
	return gfs_stored_name(w->o.prefix, rel, strlen(rel), &escaped);
}

/* True when done; false when it must wait (the change stays). */
static bool
remove_path(gfs_watcher *w, struct pending *p, const char *rel, bool is_dir)
{
	gfs_error err;
	uint64_t removed;
	if (!gfs_watch_remove(w->s, &w->o, rel, is_dir, &removed, &err)) {
		action_failed(w, p, rel, &err);
		return false;
	}
	char *name = stored_name(w, rel);
	if (is_dir)
		gfs_known_names_forget_folder(w->known, name);
	else
		gfs_known_names_forget(w->known, name);
	free(name);
	report_removed(w, rel, is_dir, removed);
	return true;
}

static bool
sync_path(gfs_watcher *w, struct pending *p)
{
	gfs_error err;
	enum gfs_watch_action a;
	char *name = stored_name(w, p->rel);
	gfs_known_names_add(w->known, name); /* before: a write whose reply is lost may land */
	gfs_known_names_unsure(w->known, name);
	free(name);
	int64_t bytes;
	bool ok = gfs_watch_sync_file(w->s, w->magic, &w->o, p->rel, p->file == FILE_CHANGED, &a, &name,
	                              &bytes, &err);
	if (!ok)
		action_failed(w, p, p->rel, &err);
	else if (a == GFS_WATCH_UPLOADED || a == GFS_WATCH_REPLACED)
		report(w, gfs_watch_action_name(a), name, bytes);
	free(name);
	return ok;
}

static void
report_moved(const gfs_watcher *w, const struct op *op, uint64_t moved)
{
	char *from = gfs_prefix_join(w->o.prefix, op->from), *to = gfs_prefix_join(w->o.prefix, op->rel);
	gfs_watcher_event ev = {.kind = GFS_WEV_MOVED, .from = from, .name = to, .is_dir = op->is_dir,
	                        .files = moved};
	emit(w, &ev);
	free(from);
	free(to);
}

/* A move that cannot be a rename (a name that is not UTF-8): stored again, the old removed. */
static void
move_by_copy(gfs_watcher *w, const struct op *op)
{
	push_op(w, false, NULL, op->from, op->is_dir);
	if (op->is_dir) {
		gfs_inotree_list(w->tree, op->rel, on_change, w);
		return;
	}
	struct pending *p = pending_for(w, op->rel);
	p->file = FILE_CHANGED;
	p->due_ms = mono_ms();
}

/* A folder's move or removal, alone: one range query. */
static bool
apply_op(gfs_watcher *w, struct op *op)
{
	if (!op->move)
		return remove_path(w, NULL, op->rel, op->is_dir) || !w->down;
	gfs_error err;
	uint64_t moved;
	char *from = stored_name(w, op->from), *to = stored_name(w, op->rel);
	gfs_known_names_copy_folder(w->known, from, to);
	bool ok = gfs_watch_move(w->s, &w->o, op->from, op->rel, true, &moved, &err);
	if (ok)
		gfs_known_names_forget_folder(w->known, from);
	free(from);
	free(to);
	if (ok) {
		report_moved(w, op, moved);
		return true;
	}
	if (err.code == GFS_EINVAL) {
		move_by_copy(w, op);
		return true;
	}
	action_failed(w, NULL, op->rel, &err);
	return !w->down;
}

/* What status says, as of now; from the thread that owns the state. */
static void
status_now(const gfs_watcher *w, gfs_watcher_status *st)
{
	st->pending = waiting(w);
	st->in_flight = w->in_flight;
	st->retrying = w->retrying;
	st->oldest_ms = oldest_waiting(w);
	st->down = w->down;
	st->down_since_ms = w->down_since_ms;
	st->pass_owed = w->pass_owed;
	st->directories = w->tree ? gfs_inotree_count(w->tree) : 0;
	st->unwatched = w->tree ? gfs_inotree_unwatched(w->tree) : 0;
	st->failures = w->failures;
}

/* The worker's state, for status asked while it works. */
static void
publish(gfs_watcher *w)
{
	gfs_watcher_status st;
	status_now(w, &st);
	pthread_mutex_lock(&w->mu);
	w->shown = st;
	pthread_mutex_unlock(&w->mu);
}

/* Asked to stop: a turn ends after the batch in flight (the last turn, all, does everything). */
static bool
stop_asked(gfs_watcher *w, bool all)
{
	return !all && atomic_load(&w->stopping);
}

static void
pop_op(gfs_watcher *w)
{
	struct op *op = w->ops;
	w->ops = op->next;
	if (!w->ops)
		w->ops_tail = &w->ops;
	w->n_ops--;
	free(op->from);
	free(op->rel);
	free(op);
}

/*
 * The single-file moves and removals at the head of the queue that share
 * no name (a batch acts on what it found first), at most OPS_BATCH.
 */
static size_t
head_run(const gfs_watcher *w, struct op **v)
{
	strmap *names = strmap_new(64);
	size_t n = 0;
	for (struct op *op = w->ops; op && !op->is_dir && n < OPS_BATCH; op = op->next) {
		if (strmap_get(names, op->rel) || (op->from && strmap_get(names, op->from)))
			break;
		strmap_put(names, op->rel, op);
		if (op->from)
			strmap_put(names, op->from, op);
		v[n++] = op;
	}
	strmap_free(names);
	return n;
}

static void
op_done(gfs_watcher *w, const struct op *op, const gfs_watch_op *r)
{
	char *name = stored_name(w, op->move ? op->from : op->rel);
	if (!op->move) {
		gfs_known_names_forget(w->known, name);
		report_removed(w, op->rel, false, r->files);
	} else if (r->by_copy) {
		move_by_copy(w, op);
	} else {
		gfs_known_names_forget(w->known, name);
		report_moved(w, op, r->files);
	}
	free(name);
}

/* A run of single-file ops in one batch; false when it must wait (an outage). */
static bool
apply_run(gfs_watcher *w, struct op **v, size_t n)
{
	gfs_watch_op *ops = gfs_xcalloc(n, sizeof *ops);
	for (size_t i = 0; i < n; i++) {
		ops[i].from = v[i]->move ? v[i]->from : NULL;
		ops[i].rel = v[i]->rel;
		if (v[i]->move) {
			/* before: a rename whose reply is lost may land */
			char *to = stored_name(w, v[i]->rel);
			gfs_known_names_add(w->known, to);
			gfs_known_names_unsure(w->known, to);
			free(to);
		}
	}
	w->in_flight = n;
	publish(w);
	gfs_error err;
	bool ok = gfs_watch_apply(w->s, &w->o, ops, n, &err);
	w->in_flight = 0;
	for (size_t i = 0; ok && i < n; i++)
		op_done(w, v[i], &ops[i]);
	free(ops);
	if (ok)
		return true;
	action_failed(w, NULL, v[0]->rel, &err);
	return !w->down;
}

/* Acts on the queue in order, in batches; stops at an outage, leaving the rest queued. */
static void
process_ops(gfs_watcher *w, bool all)
{
	struct op *v[OPS_BATCH];
	while (w->ops && !w->down && !stop_asked(w, all)) {
		size_t n = head_run(w, v);
		if (n == 0 && !apply_op(w, w->ops))
			break;
		if (n && !apply_run(w, v, n))
			break;
		for (size_t i = 0; i < (n ? n : 1); i++)
			pop_op(w);
		publish(w);
	}
}

struct due {
	struct pending **v;
	size_t n;
	int64_t now;
};

static void
collect_due(const char *key, void *value, void *ctx)
{
	(void)key;
	struct due *d = ctx;
	struct pending *p = value;
	if (p->due_ms <= d->now)
		d->v[d->n++] = p;
}

/*
 * A file the batch could not store stays, retried with backoff; one that
 * is gone meanwhile is not a failure: its removal is news of its own.
 */
static void
on_batch_event(const gfs_import_event *ev, void *ctx)
{
	gfs_watcher *w = ctx;
	if (w->on_progress)
		w->on_progress(w->ctx);
	if (ev->kind == GFS_IMPORT_UPLOADED || ev->kind == GFS_IMPORT_REPLACED) {
		report(w, ev->kind == GFS_IMPORT_UPLOADED ? "uploaded" : "replaced", ev->name, ev->bytes);
		return;
	}
	if (ev->kind == GFS_IMPORT_NOTICE) {
		warning(w, "%s", ev->reason);
		return;
	}
	struct pending *p = ev->kind == GFS_IMPORT_FAILED && ev->path ? strmap_get(w->pending, ev->path) : NULL;
	if (!p)
		return;
	char *path;
	path = gfs_xasprintf("%s/%s", w->o.dir, p->rel);
	struct stat st;
	bool gone = lstat(path, &st) < 0 && errno == ENOENT;
	free(path);
	if (gone)
		return;
	p->failed = true;
	gfs_error err;
	gfs_error_set(&err, GFS_ELOCAL, "%s", ev->reason ? ev->reason : "failed");
	action_failed(w, p, p->rel, &err);
}

/* One at a time, as put does: when another import holds the lock that batches need. */
static void
sync_one_by_one(gfs_watcher *w, struct pending **v, size_t n)
{
	for (size_t i = 0; i < n && !w->down; i++)
		if (sync_path(w, v[i]))
			drop_pending(w, v[i]);
}

/* Stores the files of v in one batch through import's engine; what fails stays. */
static void
sync_batch(gfs_watcher *w, struct pending **v, size_t n)
{
	if (n < BATCH_MIN) {
		sync_one_by_one(w, v, n);
		return;
	}
	gfs_import_path *paths = gfs_xreallocarray(NULL, n, sizeof *paths);
	for (size_t i = 0; i < n; i++) {
		paths[i].rel = v[i]->rel;
		paths[i].changed = v[i]->file == FILE_CHANGED;
		v[i]->failed = false;
	}
	gfs_import_opts io = {
		.dir = w->o.dir,
		.prefix = w->o.prefix,
		.walk = w->o.walk,
		.content_type = w->o.content_type,
		.keep_revisions = w->o.keep_revisions,
		.chunk_size = w->o.chunk_size,
		.jobs = (int)w->jobs,
		.known = w->known,
		.on_event = on_batch_event,
		.ctx = w,
	};
	gfs_import *imp = gfs_import_new(w->conn, &io);
	gfs_import_stats st;
	gfs_error err;
	w->in_flight = n;
	publish(w);
	bool ok = gfs_import_paths(imp, paths, n, &st, &err);
	w->in_flight = 0;
	gfs_import_free(imp);
	free(paths);
	if (!ok && err.code == GFS_EBUSY) {
		sync_one_by_one(w, v, n);
		return;
	}
	if (!ok) {
		/* all or nothing again: what was stored is found stored by the retry, and not stored twice */
		if (err.code == GFS_EBACKEND)
			backend_down(w, &err);
		else
			for (size_t i = 0; i < n; i++)
				action_failed(w, v[i], v[i]->rel, &err);
		return;
	}
	for (size_t i = 0; i < n; i++)
		if (!v[i]->failed)
			drop_pending(w, v[i]);
}

/* Removes the files of v in one batch (equality per name); what fails stays. */
static void
remove_batch(gfs_watcher *w, struct pending **v, size_t n)
{
	gfs_watch_op *ops = gfs_xcalloc(n, sizeof *ops);
	for (size_t i = 0; i < n; i++)
		ops[i].rel = v[i]->rel;
	w->in_flight = n;
	publish(w);
	gfs_error err;
	bool ok = gfs_watch_apply(w->s, &w->o, ops, n, &err);
	w->in_flight = 0;
	if (!ok && err.code == GFS_EBACKEND)
		backend_down(w, &err);   /* once: the outage is one, however many wait for it */
	for (size_t i = 0; i < n && !w->down; i++) {
		if (!ok) {
			action_failed(w, v[i], v[i]->rel, &err);
			continue;
		}
		char *name = stored_name(w, v[i]->rel);
		gfs_known_names_forget(w->known, name);
		free(name);
		report_removed(w, v[i]->rel, false, ops[i].files);
		drop_pending(w, v[i]);
	}
	free(ops);
}

static void
process_pending(gfs_watcher *w, bool all)
{
	struct due d = {.now = all ? INT64_MAX : mono_ms()};
	d.v = gfs_xreallocarray(NULL, strmap_count(w->pending) + 1, sizeof *d.v);
	strmap_each(w->pending, collect_due, &d);
	/* sorted, so that a folder's removal comes before what is made under it */
	qsort(d.v, d.n, sizeof *d.v, by_rel);
	/* folders' removals first, one by one; files removed together, then those to store */
	struct pending **rm = gfs_xreallocarray(NULL, d.n + 1, sizeof *rm);
	size_t nsync = 0, nrm = 0;
	for (size_t i = 0; i < d.n && !w->down && !stop_asked(w, all) && (all || nsync < BATCH_MAX) &&
	                   nrm < OPS_BATCH; i++) {
		struct pending *p = d.v[i];
		if (!all && p->file == FILE_FOUND && !unchanged_since_seen(w, p)) {
			p->due_ms = mono_ms() + found_settle_ms(w); /* still being written */
			continue;
		}
		if (p->dir_removed && w->delete && !remove_path(w, p, p->rel, true))
			continue;
		p->dir_removed = false;
		if (p->file == FILE_CHANGED || p->file == FILE_FOUND)
			d.v[nsync++] = p; /* i >= nsync: the slot is read already */
		else if (p->file == FILE_REMOVED && w->delete)
			rm[nrm++] = p;
		else
			drop_pending(w, p);
	}
	if (nrm && !w->down)
		remove_batch(w, rm, nrm);
	if (nsync && !w->down)
		sync_batch(w, d.v, nsync);
	free(rm);
	free(d.v);
	publish(w);
}

/* ---- full passes ----------------------------------------------------- */

static void
on_import_event(const gfs_import_event *ev, void *ctx)
{
	gfs_watcher *w = ctx;
	if (w->on_progress)
		w->on_progress(w->ctx);
	if (ev->kind == GFS_IMPORT_FAILED || ev->kind == GFS_IMPORT_NOTICE) {
		warning(w, "%s%s%s", ev->name ? ev->name : ev->path ? ev->path : "",
		       ev->name || ev->path ? ": " : "", ev->reason ? ev->reason : "failed");
		if (ev->kind == GFS_IMPORT_FAILED)
			w->failures++;
	}
}

static void
report_pass(const gfs_watcher *w, const gfs_import_stats *st)
{
	gfs_watcher_event ev = {.kind = GFS_WEV_SYNCED, .stats = st,
	                        .unwatched = gfs_inotree_unwatched(w->tree)};
	emit(w, &ev);
}

/* An import of the whole directory; false (err set) when it could not run to the end. */
static bool
full_pass(gfs_watcher *w, gfs_error *err)
{
	gfs_import_opts io = {
		.dir = w->o.dir,
		.prefix = w->o.prefix,
		.walk = w->o.walk,
		.content_type = w->o.content_type,
		.delete_missing = w->delete,
		.max_delete = w->max_delete,
		.keep_revisions = w->o.keep_revisions,
		.jobs = (int)w->jobs,
		.known = w->known,
		.on_event = on_import_event,
		.ctx = w,
	};
	gfs_import *imp = gfs_import_new(w->conn, &io);
	gfs_import_stats st;
	bool ok = gfs_import_run(imp, &st, err);
	gfs_import_free(imp);
	if (ok)
		report_pass(w, &st);
	return ok;
}

static void
schedule_pass(gfs_watcher *w)
{
	w->next_pass_ms = w->pass_every_s ? mono_ms() + w->pass_every_s * 1000 : 0;
}

/* Directories that cannot be watched are covered by periodic passes, or end watching. */
static bool
check_unwatched(gfs_watcher *w)
{
	size_t n = gfs_inotree_unwatched(w->tree);
	if (!n)
		return true;
	if (w->unwatched_fail) {
		warning(w, "%zu directories under %s cannot be watched (--unwatched fail)", n, w->o.dir);
		return false;
	}
	if (!w->pass_every_s) {
		w->pass_every_s = UNWATCHED_RESCAN_S;
		schedule_pass(w);
		warning(w, "%zu directories under %s cannot be watched; a full pass every %ld s covers them",
		       n, w->o.dir, w->pass_every_s);
	}
	return true;
}

/* The pass owed, or the periodic one, once the queue is done; false when watching must end. */
static bool
maybe_pass(gfs_watcher *w)
{
	if (w->next_pass_ms && mono_ms() >= w->next_pass_ms)
		w->pass_owed = true;
	if (!w->pass_owed || w->down || w->ops)
		return true;
	if (w->overflowed)
		warning(w, "inotify lost events; rescanning %s", w->o.dir);
	gfs_error err;
	if (w->next_pass_ms && !gfs_inotree_rewalk(w->tree, &err)) {
		warning(w, "%s", err.msg);
		return false;
	}
	if (!full_pass(w, &err)) {
		if (err.code == GFS_ELIMIT) {
			warning(w, "%s", err.msg);
			w->over_limit = true;
			return false;
		}
		if (err.code == GFS_EBACKEND || err.code == GFS_EBUSY) {
			/* a pass is all or nothing: owed still, tried when the backend answers */
			backend_down(w, &err);
			return true;
		}
		warning(w, "%s", err.msg);
		w->failures++;
	}
	w->pass_owed = w->overflowed = false;
	schedule_pass(w);
	return check_unwatched(w);
}

/* ---- the loop -------------------------------------------------------- */

struct earliest {
	int64_t at;
};

static void
earliest_due(const char *key, void *value, void *ctx)
{
	(void)key;
	const struct pending *p = value;
	struct earliest *e = ctx;
	if (e->at < 0 || p->due_ms < e->at)
		e->at = p->due_ms;
}

/* When something is next to do, in ms from now; -1 for nothing. */
static int64_t
next_wakeup(const gfs_watcher *w)
{
	struct earliest e = {.at = -1};
	if (w->down) {
		e.at = w->retry_ms;
	} else {
		strmap_each(w->pending, earliest_due, &e);
		if (w->ops || w->pass_owed)
			e.at = 0;
		if (w->next_pass_ms && (e.at < 0 || w->next_pass_ms < e.at))
			e.at = w->next_pass_ms;
		if (gfs_known_names_any_unsure(w->known) && (e.at < 0 || w->recheck_ms < e.at))
			e.at = w->recheck_ms;
	}
	if (e.at < 0)
		return -1;
	int64_t wait = e.at - mono_ms();
	return wait > 0 ? wait : 0;
}

static void
arm(int tfd, int64_t ms)
{
	struct itimerspec its = {0};
	if (ms >= 0) {
		if (ms == 0)
			ms = 1;
		its.it_value.tv_sec = ms / 1000;
		its.it_value.tv_nsec = (ms % 1000) * 1000000;
	}
	timerfd_settime(tfd, 0, &its, NULL);
}

/* ---- --max-delete ---------------------------------------------------- */

struct removals {
	gfs_watcher *w;
	int64_t now;
	uint64_t files;
	bool due;             /* one of them is to be carried out now */
	char *last;           /* the name counted last: revisions of one name count once */
	bool ok;
	gfs_error err;
};

static bool
count_one(struct removals *r, const char *name)
{
	if (r->last && name && strcmp(r->last, name) == 0)
		return true;
	free(r->last);
	r->last = name ? gfs_xstrdup(name) : NULL;
	r->files++;
	return true;
}

static bool
count_name(const gfs_file *f, void *ctx)
{
	return count_one(ctx, f->filename);
}

/* A malformed document's name would be removed as any other: it counts. */
static bool
count_bad_name(const bson_t *doc, const char *name, const gfs_error *why, void *ctx)
{
	(void)doc;
	(void)why;
	return count_one(ctx, name);
}

/* Adds the stored names under the folder rel ("" for the whole prefix). */
static void
count_stored(struct removals *r, const char *rel)
{
	if (!r->ok)
		return;
	char *name = rel[0] ? gfs_prefix_join(r->w->o.prefix, rel) : gfs_xstrdup(r->w->o.prefix ? r->w->o.prefix : "");
	size_t len = strlen(name);
	char *folder = gfs_xmalloc(len + 2);
	snprintf(folder, len + 2, "%s%s", name, len && name[len - 1] != '/' ? "/" : "");
	r->ok = gfs_list(r->w->s, folder, count_name, count_bad_name, r, &r->err);
	free(r->last);
	r->last = NULL;
	free(folder);
	free(name);
}

static void
count_due_removal(const char *key, void *value, void *ctx)
{
	(void)key;
	struct removals *r = ctx;
	const struct pending *p = value;
	if (!p->dir_removed && p->file != FILE_REMOVED)
		return;
	r->due |= p->due_ms <= r->now;
	if (p->dir_removed)
		count_stored(r, p->rel);
	if (p->file == FILE_REMOVED)
		r->files++;
}

/*
 * --max-delete between full passes: "a run" is every removal waiting when
 * the first of them is due (queued, settled or still settling: a burst
 * within --settle of its first removal is one batch), counted in stored
 * files before any is carried out. Over the limit, none is, and watching
 * ends (exit 7): a mass removal is what an rm -rf in the wrong place looks
 * like.
 */
static bool
removals_within_limit(gfs_watcher *w, bool all)
{
	if (!w->delete || !w->max_delete.set)
		return true;
	struct removals r = {.w = w, .now = all ? INT64_MAX : mono_ms(), .ok = true};
	for (const struct op *op = w->ops; op; op = op->next) {
		if (op->move)
			continue;
		if (op->is_dir)
			count_stored(&r, op->rel);
		else
			r.files++;
		r.due = true;
	}
	strmap_each(w->pending, count_due_removal, &r);
	uint64_t removing = r.files;
	if (!r.due)
		return true;
	if (r.ok && removing > 0 && w->max_delete.percent) {
		r.files = 0;
		count_stored(&r, "");
	}
	gfs_error err;
	if (!r.ok) {
		backend_down(w, &r.err);
		return true; /* nothing is done while it is down */
	}
	if (gfs_max_delete_check(&w->max_delete, removing, r.files, "watch --delete", &err))
		return true;
	if (!w->over_limit)
		warning(w, "%s", err.msg);
	w->over_limit = true;
	return false;
}

/*
 * Names stored without the import lock, once nobody holds it or a lock
 * whose scope overlaps ours: when the takes counted on our prefix's lock
 * say another import held one since, it may have stored them
 * too, and each writer's trim kept its own revision. Each is trimmed
 * again to the newest (equality queries), rather than at watch's next start.
 */
static void
recheck_unsure(gfs_watcher *w)
{
	if (!gfs_known_names_any_unsure(w->known) || mono_ms() < w->recheck_ms)
		return;
	w->recheck_ms = mono_ms() + RECHECK_MS;
	/* The lock of our prefix, as our batches and passes take it (gfs_import_new). */
	char *prefix = gfs_prefix_normalize(w->o.prefix);
	char *lock = gfs_lock_scoped_name(GFS_IMPORT_LOCK, prefix);
	free(prefix);
	gfs_error err;
	int held = gfs_lock_overlap_held(w->s, lock, &err);
	int64_t takes = held == 0 ? gfs_lock_takes(w->s, lock, &err) : 0;
	free(lock);
	if (held < 0 || takes < 0) {
		action_failed(w, NULL, "the import lock", &err);
		return;
	}
	if (held)
		return;
	char **names;
	size_t n = gfs_known_names_settle(w->known, takes, &names);
	bool ok = true;
	for (size_t i = 0; i < n; i++) {
		if (ok && !(ok = gfs_delete_old_revisions(w->s, names[i], w->o.keep_revisions, NULL, &err)))
			action_failed(w, NULL, names[i], &err);
		if (!ok)
			gfs_known_names_recheck(w->known, names[i]); /* looked at again once it answers */
		free(names[i]);
	}
	free(names);
}

/* Does what is due; false when watching must end. */
static bool
work(gfs_watcher *w, bool all)
{
	if (!backend_up(w))
		return true;
	if (!removals_within_limit(w, all))
		return false;
	process_ops(w, all);
	if (!maybe_pass(w))
		return false;
	if (!w->down)
		process_pending(w, all);
	if (!w->down)
		recheck_unsure(w);
	return true;
}

void
gfs_watcher_finish(gfs_watcher *w)
{
	if (w->down)
		w->retry_ms = 0;
	work(w, true);
	if (waiting(w) || w->pass_owed) {
		warning(w, "stopping with %zu changes not acted on%s", waiting(w),
		        w->pass_owed ? " and a full pass owed" : "");
		w->failures++;
	}
}

/* The timer or inotify is readable: false when watching must end (*end set). */
static bool
on_ready(gfs_watcher *w, int fd, bool *timer, enum gfs_watcher_end *end)
{
	if (fd == w->tfd) {
		uint64_t ticks;
		*timer = read(w->tfd, &ticks, sizeof ticks) > 0 || *timer;
		return true;
	}
	gfs_error err;
	if (gfs_inotree_read(w->tree, on_change, w, &err))
		return true;
	warning(w, "%s", err.msg);
	*end = GFS_WATCHER_FAILED;
	return false;
}

static void *
worker(void *arg)
{
	gfs_watcher *w = arg;
	w->work_ok = work(w, false);
	uint64_t one = 1;
	if (write(w->done_fd, &one, sizeof one) < 0)
		abort();   /* an eventfd's counter cannot be full after one write: a broken invariant */
	return NULL;
}

/* A turn of work on the worker thread; inline when no thread can be made. */
static void
start_work(gfs_watcher *w)
{
	publish(w);
	w->busy = true;
	if (pthread_create(&w->worker, NULL, worker, w) == 0)
		return;
	w->busy = false;
	w->work_ok = work(w, false);
	uint64_t one = 1;
	if (write(w->done_fd, &one, sizeof one) < 0)
		abort();
}

/* The turn is over: the state is the loop's again. */
static void
end_work(gfs_watcher *w)
{
	uint64_t n;
	if (read(w->done_fd, &n, sizeof n) < 0 && errno != EAGAIN)
		abort();
	if (w->busy)
		pthread_join(w->worker, NULL);
	w->busy = false;
}

static int
epoll_of(const int *fds, size_t n)
{
	int ep = epoll_create1(EPOLL_CLOEXEC);
	for (size_t i = 0; ep >= 0 && i < n; i++) {
		struct epoll_event ev = {.events = EPOLLIN, .data.fd = fds[i]};
		epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
	}
	return ep;
}

/*
 * Two sets: idle, the loop reads inotify and the timer and starts a turn
 * of work when the timer says; busy, it answers only the caller's
 * descriptor and waits for the turn to end (inotify's events wait in the
 * kernel meanwhile, as they would for any other batch).
 */
enum gfs_watcher_end
gfs_watcher_run(gfs_watcher *w, int xfd, gfs_watcher_fd_fn fn, void *ctx)
{
	int idle = epoll_of((int[]){gfs_inotree_fd(w->tree), xfd, w->tfd, w->done_fd}, 4);
	int busy = epoll_of((int[]){xfd, w->done_fd}, 2);
	enum gfs_watcher_end end = GFS_WATCHER_ASKED;
	bool go = true;
	arm(w->tfd, next_wakeup(w));
	while (go) {
		struct epoll_event evs[4];
		int n = epoll_wait(w->busy ? busy : idle, evs, 4, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			warning(w, "epoll: %s", strerror(errno));
			end = GFS_WATCHER_FAILED;
			break;
		}
		bool timer = false, ended = false;
		for (int i = 0; i < n && go; i++) {
			int fd = evs[i].data.fd;
			if (fd == xfd)
				go = fn(ctx);
			else if (fd == w->done_fd)
				ended = true;
			else if (!w->busy)
				go = on_ready(w, fd, &timer, &end);
		}
		if (ended) {
			end_work(w);
			if (!w->work_ok) {
				go = false;
				end = w->over_limit ? GFS_WATCHER_LIMIT : GFS_WATCHER_FAILED;
			}
		}
		/* events alone only move deadlines; the work is done when the timer says */
		if (go && timer && !w->busy && !ended)
			start_work(w);
		if (!w->busy)
			arm(w->tfd, next_wakeup(w));
	}
	if (w->busy) {
		atomic_store(&w->stopping, true);
		struct epoll_event ev;
		while (epoll_wait(busy, &ev, 1, -1) < 0 && errno == EINTR)
			;
		end_work(w);
	}
	atomic_store(&w->stopping, false);
	close(idle);
	close(busy);
	return end;
}

bool
gfs_watcher_start(gfs_watcher *w, gfs_error *err)
{
	/* Watches first, then the full pass: a change made during the pass is not missed. */
	w->tree = gfs_inotree_open(w->o.dir, &w->o.walk, on_inotree_warning, w, err);
	if (!w->tree) {
		warning(w, "%s", err->msg);
		err->code = GFS_ELOCAL;
		return false;
	}
	schedule_pass(w);
	if (!check_unwatched(w)) {
		gfs_error_set(err, GFS_ELOCAL, "%s", "directories cannot be watched");
		return false;
	}
	if (w->initial && !full_pass(w, err)) {
		warning(w, "%s", err->msg);
		return false;
	}
	return true;
}

gfs_watcher *
gfs_watcher_new(gfs_conn *conn, const gfs_watcher_opts *o)
{
	gfs_watcher *w = gfs_xcalloc(1, sizeof *w);
	w->o = o->o;
	w->delete = o->delete;
	w->initial = o->initial;
	w->unwatched_fail = o->unwatched_fail;
	w->max_delete = o->max_delete;
	w->settle_ms = o->settle_ms;
	w->jobs = o->jobs;
	w->max_pending = o->max_pending;
	w->pass_every_s = o->rescan_every_s;
	w->on_event = o->on_event;
	w->on_progress = o->on_progress;
	w->ctx = o->ctx;
	w->conn = conn;
	w->ops_tail = &w->ops;
	gfs_error err;
	w->magic = gfs_magic_open(&err);   /* NULL: the type is left to the server's default */
	w->s = gfs_session_pop(conn);
	w->pending = strmap_new(64);
	w->known = gfs_known_names_new();
	w->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	w->done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	pthread_mutex_init(&w->mu, NULL);
	return w;
}

void
gfs_watcher_free(gfs_watcher *w)
{
	if (!w)
		return;
	strmap_each(w->pending, free_pending, NULL);
	strmap_free(w->pending);
	gfs_known_names_free(w->known);
	free_ops(w);
	if (w->tree)
		gfs_inotree_close(w->tree);
	close(w->tfd);
	close(w->done_fd);
	pthread_mutex_destroy(&w->mu);
	gfs_session_push(w->s);
	gfs_magic_close(w->magic);
	free(w);
}

void
gfs_watcher_status_of(gfs_watcher *w, gfs_watcher_status *st)
{
	if (!w->busy) {
		status_now(w, st);
		return;
	}
	pthread_mutex_lock(&w->mu);
	*st = w->shown;
	pthread_mutex_unlock(&w->mu);
}
