/* gridfsctl watch: keep a bucket in step with a directory through inotify. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "../lib/import.h"
#include "../lib/inotree.h"
#include "../lib/names.h"
#include "../lib/strmap.h"
#include "../lib/watch.h"
#include "cmd.h"

const char watch_help[] =
    "  -p, --prefix P          store under the folder P (default: the top level)\n"
    "  -x, --exclude GLOB      ignore files and directories matching GLOB (repeatable)\n"
    "  -i, --include GLOB      watch only files matching GLOB (repeatable)\n"
    "      --hidden            take hidden files and directories\n"
    "      --keep-temp         take temporary files (*.part, *~, .#*)\n"
    "  -t, --type MIME         content type for every file (default: libmagic)\n"
    "      --delete            remove stored files when they are removed from DIR\n"
    "      --no-initial        skip the first full pass (an import of DIR)\n"
    "      --settle MS         wait until a path has been quiet this long (default 200)\n"
    "  -j, --jobs N            parallelism of the first pass (default 4)\n"
    "      --json              one JSON object per action on stdout\n";

enum { OPT_HIDDEN = 1, OPT_KEEP_TEMP, OPT_DELETE, OPT_NO_INITIAL, OPT_SETTLE, OPT_JSON };

const struct option watch_options[] = {
	{"prefix", required_argument, NULL, 'p'},
	{"exclude", required_argument, NULL, 'x'},
	{"include", required_argument, NULL, 'i'},
	{"hidden", no_argument, NULL, OPT_HIDDEN},
	{"keep-temp", no_argument, NULL, OPT_KEEP_TEMP},
	{"type", required_argument, NULL, 't'},
	{"delete", no_argument, NULL, OPT_DELETE},
	{"no-initial", no_argument, NULL, OPT_NO_INITIAL},
	{"settle", required_argument, NULL, OPT_SETTLE},
	{"jobs", required_argument, NULL, 'j'},
	{"json", no_argument, NULL, OPT_JSON},
	{NULL, 0, NULL, 0},
};

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
};

struct watch_cli {
	gfs_watch_opts o;
	const char **include, **exclude;
	size_t n_include, n_exclude;
	bool delete, initial, json;
	long settle_ms, jobs;
	gfs_conn *conn;
	gfs_session *s;
	gfs_magic *magic;
	strmap *pending;
	bool rescan;
	uint64_t failures;
};

static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct watch_cli *w = ctx;
	switch (opt) {
	case 'p': w->o.prefix = arg; return 0;
	case 'x': add_glob(&w->exclude, &w->n_exclude, arg); return 0;
	case 'i': add_glob(&w->include, &w->n_include, arg); return 0;
	case 't': w->o.content_type = arg; return 0;
	case OPT_HIDDEN: w->o.walk.hidden = true; return 0;
	case OPT_KEEP_TEMP: w->o.walk.temp = true; return 0;
	case OPT_DELETE: w->delete = true; return 0;
	case OPT_NO_INITIAL: w->initial = false; return 0;
	case OPT_JSON: w->json = true; return 0;
	case OPT_SETTLE:
		if (parse_int(arg, 0, 600000, &w->settle_ms))
			return 0;
		usage_error("--settle takes milliseconds, not '%s'", arg);
		return -1;
	case 'j':
		if (parse_int(arg, 1, 64, &w->jobs))
			return 0;
		usage_error("--jobs takes 1 to 64, not '%s'", arg);
		return -1;
	}
	return -1;
}

static int64_t
mono_ms(void)
{
	return (int64_t)(gfs_mono_seconds() * 1000);
}

static void
report(const struct watch_cli *w, const char *event, const char *name, int64_t bytes)
{
	if (G.quiet)
		return;
	if (w->json) {
		bson_t doc = BSON_INITIALIZER;
		BSON_APPEND_UTF8(&doc, "event", event);
		if (name)
			BSON_APPEND_UTF8(&doc, "name", name);
		if (bytes >= 0)
			BSON_APPEND_INT64(&doc, "bytes", bytes);
		print_json(stdout, &doc);
	} else {
		printf("%s %s\n", event, name ? name : "");
	}
	fflush(stdout);
}

/* ---- the first pass, and rescans after lost events ------------------- */

static void
on_import_event(const gfs_import_event *ev, void *ctx)
{
	struct watch_cli *w = ctx;
	if (ev->kind == GFS_IMPORT_FAILED || ev->kind == GFS_IMPORT_NOTICE) {
		warnx_("%s%s%s", ev->name ? ev->name : ev->path ? ev->path : "",
		       ev->name || ev->path ? ": " : "", ev->reason ? ev->reason : "failed");
		if (ev->kind == GFS_IMPORT_FAILED)
			w->failures++;
	}
}

static bool
full_pass(struct watch_cli *w)
{
	gfs_import_opts io = {
		.dir = w->o.dir,
		.prefix = w->o.prefix,
		.walk = w->o.walk,
		.content_type = w->o.content_type,
		.delete_missing = w->delete,
		.keep_revisions = w->o.keep_revisions,
		.jobs = (int)w->jobs,
		.on_event = on_import_event,
		.ctx = w,
	};
	gfs_import *imp = gfs_import_new(w->conn, &io);
	gfs_import_stats st;
	gfs_error err;
	bool ok = gfs_import_run(imp, &st, &err);
	gfs_import_free(imp);
	if (!ok) {
		warnx_("%s", err.msg);
		return false;
	}
	bson_t doc = BSON_INITIALIZER;
	if (w->json && !G.quiet) {
		BSON_APPEND_UTF8(&doc, "event", "synced");
		BSON_APPEND_INT64(&doc, "uploaded", (int64_t)(st.uploaded + st.replaced));
		BSON_APPEND_INT64(&doc, "deleted", (int64_t)st.deleted);
		BSON_APPEND_INT64(&doc, "failed", (int64_t)st.failed);
		print_json(stdout, &doc);
		fflush(stdout);
	}
	bson_destroy(&doc);
	return true;
}

/* ---- pending changes ------------------------------------------------- */

/*
 * Looks at a found file again; true when its size and mtime are those
 * seen a settle time ago. A file that cannot be looked at is left for
 * gfs_watch_sync_file to report.
 */
static bool
unchanged_since_seen(const struct watch_cli *w, struct pending *p)
{
	char *path;
	if (asprintf(&path, "%s/%s", w->o.dir, p->rel) < 0)
		abort();
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

/* Nothing says a found file is complete; it is taken once it has stopped changing. */
static void
found(const struct watch_cli *w, struct pending *p)
{
	p->file = FILE_FOUND;
	unchanged_since_seen(w, p);
}

static void
on_change(const gfs_inotree_event *ev, void *ctx)
{
	struct watch_cli *w = ctx;
	if (ev->kind == GFS_INO_OVERFLOW) {
		w->rescan = true;
		return;
	}
	struct pending *p = strmap_get(w->pending, ev->rel);
	if (!p) {
		p = calloc(1, sizeof *p);
		if (!p)
			abort();
		p->rel = strdup(ev->rel);
		strmap_put(w->pending, p->rel, p);
	}
	/* For the file, the latest event decides: written then removed is removed. */
	if (ev->kind == GFS_INO_DIR_REMOVED)
		p->dir_removed = true;
	else if (ev->kind == GFS_INO_CHANGED)
		p->file = FILE_CHANGED;
	else if (ev->kind == GFS_INO_REMOVED)
		p->file = FILE_REMOVED;
	else if (ev->kind == GFS_INO_FOUND && p->file != FILE_CHANGED)
		found(w, p);
	p->due_ms = mono_ms() + w->settle_ms;
}

static void
on_inotree_warning(const char *rel, const char *reason, void *ctx)
{
	(void)ctx;
	warnx_("%s: cannot watch: %s", *rel ? rel : ".", reason);
}

static void
act_file(struct watch_cli *w, const struct pending *p)
{
	gfs_error err;
	if (p->file == FILE_CHANGED || p->file == FILE_FOUND) {
		enum gfs_watch_action a;
		char *name;
		int64_t bytes;
		if (!gfs_watch_sync_file(w->s, w->magic, &w->o, p->rel, &a, &name, &bytes, &err)) {
			warnx_("%s", err.msg);
			w->failures++;
		} else if (a == GFS_WATCH_UPLOADED || a == GFS_WATCH_REPLACED) {
			report(w, gfs_watch_action_name(a), name, bytes);
		}
		free(name);
		return;
	}
	if (p->file != FILE_REMOVED || !w->delete)
		return;
	uint64_t removed;
	if (!gfs_watch_remove(w->s, &w->o, p->rel, false, &removed, &err)) {
		warnx_("%s: %s", p->rel, err.msg);
		w->failures++;
	} else if (removed) {
		char *name = gfs_prefix_join(w->o.prefix, p->rel);
		report(w, "removed", name, -1);
		free(name);
	}
}

static void
act_folder(struct watch_cli *w, const struct pending *p)
{
	if (!p->dir_removed || !w->delete)
		return;
	gfs_error err;
	uint64_t removed;
	if (!gfs_watch_remove(w->s, &w->o, p->rel, true, &removed, &err)) {
		warnx_("%s: %s", p->rel, err.msg);
		w->failures++;
		return;
	}
	/* A folder's files may have gone one by one already; its own removal is still news. */
	char *name = gfs_prefix_join(w->o.prefix, p->rel);
	report(w, "removed-folder", name, -1);
	free(name);
}

struct due {
	struct pending **v;
	size_t n;
	int64_t now, next;
};

static void
collect_due(const char *key, void *value, void *ctx)
{
	(void)key;
	struct due *d = ctx;
	struct pending *p = value;
	if (p->due_ms <= d->now)
		d->v[d->n++] = p;
	else if (d->next < 0 || p->due_ms < d->next)
		d->next = p->due_ms;
}

static int
by_rel(const void *a, const void *b)
{
	const struct pending *x = *(struct pending *const *)a, *y = *(struct pending *const *)b;
	return strcmp(x->rel, y->rel);
}

/* Acts on what has settled; returns ms until the next path settles, or -1. */
static int64_t
process_due(struct watch_cli *w, bool all)
{
	struct due d = {.now = all ? INT64_MAX : mono_ms(), .next = -1};
	d.v = malloc((strmap_count(w->pending) + 1) * sizeof *d.v);
	if (!d.v)
		abort();
	strmap_each(w->pending, collect_due, &d);
	qsort(d.v, d.n, sizeof *d.v, by_rel);
	/* Folders removed go first, so that new files under the same names stay stored. */
	for (size_t i = 0; i < d.n; i++)
		act_folder(w, d.v[i]);
	for (size_t i = 0; i < d.n; i++) {
		struct pending *p = d.v[i];
		if (!all && p->file == FILE_FOUND && !unchanged_since_seen(w, p)) {
			/* still being written: its folder's removal is done, the file waits */
			p->dir_removed = false;
			p->due_ms = mono_ms() + w->settle_ms;
			if (d.next < 0 || p->due_ms < d.next)
				d.next = p->due_ms;
			continue;
		}
		act_file(w, p);
		strmap_del(w->pending, p->rel);
		free(p->rel);
		free(p);
	}
	free(d.v);
	if (d.next < 0)
		return -1;
	/* Acting took time: a path may have settled meanwhile, and must not wait for the next event. */
	int64_t wait = d.next - mono_ms();
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

/* ---- the loop -------------------------------------------------------- */

static int
run_loop(struct watch_cli *w, gfs_inotree *tree, int sfd, int tfd)
{
	int ep = epoll_create1(EPOLL_CLOEXEC);
	int fds[] = {gfs_inotree_fd(tree), sfd, tfd};
	for (size_t i = 0; i < 3; i++) {
		struct epoll_event ev = {.events = EPOLLIN, .data.fd = fds[i]};
		epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
	}
	int rc = EXIT_OK;
	for (;;) {
		struct epoll_event evs[4];
		int n = epoll_wait(ep, evs, 4, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			warn_("epoll");
			rc = EXIT_LOCAL;
			break;
		}
		bool stop = false;
		for (int i = 0; i < n; i++) {
			int fd = evs[i].data.fd;
			if (fd == sfd) {
				struct signalfd_siginfo si;
				if (read(sfd, &si, sizeof si) == sizeof si) {
					stop = true;
					rc = si.ssi_signo == SIGINT ? EXIT_INTERRUPTED : EXIT_OK;
				}
			} else if (fd == tfd) {
				uint64_t ticks;
				if (read(tfd, &ticks, sizeof ticks) < 0 && errno != EAGAIN)
					warn_("timerfd");
			} else {
				gfs_error err;
				if (!gfs_inotree_read(tree, on_change, w, &err)) {
					warnx_("%s", err.msg);
					stop = true;
					rc = EXIT_LOCAL;
				}
			}
		}
		if (w->rescan) {
			w->rescan = false;
			warnx_("inotify lost events; rescanning %s", w->o.dir);
			if (!full_pass(w))
				w->failures++;
		}
		arm(tfd, process_due(w, stop));
		if (stop)
			break;
	}
	close(ep);
	return rc;
}

static int
watch(struct watch_cli *w, const sigset_t *mask)
{
	int sfd = signalfd(-1, mask, SFD_CLOEXEC | SFD_NONBLOCK);
	int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	gfs_error err;
	/* Watches first, then the full pass: a change made during the pass is not missed. */
	gfs_inotree *tree = gfs_inotree_open(w->o.dir, &w->o.walk, &err);
	if (!tree) {
		warnx_("%s", err.msg);
		close(sfd);
		close(tfd);
		return EXIT_LOCAL;
	}
	gfs_inotree_on_warning(tree, on_inotree_warning, w);
	int rc = EXIT_OK;
	if (w->initial && !full_pass(w))
		rc = EXIT_BACKEND;
	if (rc == EXIT_OK) {
		if (w->json && !G.quiet) {
			bson_t doc = BSON_INITIALIZER;
			BSON_APPEND_UTF8(&doc, "event", "ready");
			BSON_APPEND_INT64(&doc, "directories", (int64_t)gfs_inotree_count(tree));
			print_json(stdout, &doc);
			bson_destroy(&doc);
			fflush(stdout);
		} else if (!G.quiet) {
			fprintf(stderr, "%s watch: watching %s (%zu directories)\n", progname, w->o.dir,
			        gfs_inotree_count(tree));
		}
		rc = run_loop(w, tree, sfd, tfd);
	}
	gfs_inotree_close(tree);
	close(sfd);
	close(tfd);
	return rc;
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

int
cmd_watch(int argc, char **argv)
{
	struct watch_cli w = {.initial = true, .settle_ms = 200, .jobs = 4};
	w.o.keep_revisions = 1;
	int i = parse_options(argc, argv, "p:x:i:t:j:", watch_options, on_opt, &w);
	int rc = EXIT_USAGE;
	if (i < 0)
		goto out;
	if (argc - i != 1) {
		usage_error(argc - i ? "one DIR at a time" : "a DIR is required");
		goto out;
	}
	w.o.dir = argv[i];
	w.o.walk.include = w.include;
	w.o.walk.n_include = w.n_include;
	w.o.walk.exclude = w.exclude;
	w.o.walk.n_exclude = w.n_exclude;
	/*
	 * Blocked before any thread exists (the driver starts monitor threads),
	 * so that the signals reach only the signalfd.
	 */
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	gfs_error err;
	w.conn = connect_or_warn();
	if (!w.conn)
		goto out;
	if (!gfs_conn_ping(w.conn, &err)) {
		rc = fail(&err);
		gfs_conn_close(w.conn);
		goto out;
	}
	w.magic = gfs_magic_open(&err);
	w.s = gfs_session_pop(w.conn);
	w.pending = strmap_new(64);
	rc = watch(&w, &mask);
	if (rc == EXIT_OK && w.failures)
		rc = EXIT_PARTIAL;
	strmap_each(w.pending, free_pending, NULL);
	strmap_free(w.pending);
	gfs_session_push(w.s);
	gfs_magic_close(w.magic);
	gfs_conn_close(w.conn);
out:
	free(w.include);
	free(w.exclude);
	return rc;
}
