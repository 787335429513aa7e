/*
 * gridfsctl watch: keep a bucket in step with a directory through inotify.
 *
 * The loop, its table of changes waiting to settle, its retries and full
 * passes are lib/watch_loop.c. This file parses options, prints what the
 * loop reports (human lines or JSON), speaks the sd_notify protocol and
 * takes the signals: SIGINT and SIGTERM stop watching, SIGUSR1 prints a
 * status line.
 *
 * Under a systemd watchdog (WatchdogSec=), WATCHDOG=1 goes out at most half
 * an interval apart: a timer beside the signals wakes the loop, which
 * answers it (and SIGUSR1) while the library's worker waits on the
 * backend. Each backend call is bounded by the interval (the driver's
 * timeouts, unless the URI or GRIDFSCTL_TIMEOUT set them), so that a call
 * that hangs ends rather than being pinged over for ever. Before the loop
 * runs, the first full pass pings for each file it handles.
 *
 * The library's events come from its worker (and import's threads), the
 * status line from the loop's thread: output is one line at a time under
 * a lock.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "../lib/sdnotify.h"
#include "../lib/watch_loop.h"
#include "cmd.h"

enum {
	OPT_DELETE = 1, OPT_NO_INITIAL, OPT_SETTLE, OPT_JSON, OPT_RESCAN_EVERY, OPT_UNWATCHED,
	OPT_MAX_PENDING, OPT_MAX_DELETE,
};
/* --unwatched's words, in the order its row gives them. */
enum { UNWATCHED_RESCAN, UNWATCHED_FAIL };

#define DEFAULT_MAX_PENDING 100000

struct watch_cli {
	gfs_watch_opts o;
	struct tree_select sel;
	bool delete, initial, json;
	int unwatched;        /* --unwatched: its index among the row's words */
	gfs_max_delete max_delete;
	long settle_ms, jobs, rescan_every_s, max_pending;
	gfs_watcher *watcher;
	uint64_t failures;    /* actions given up on */
	uint64_t uploaded, replaced, deleted, moved;   /* for the summary */
	int sfd;              /* SIGINT, SIGTERM and SIGUSR1 */
	int rc;               /* set when a signal says stop */
	/* the systemd watchdog: every_ms 0 when none is asked for */
	int64_t ping_every_ms;
	_Atomic int64_t next_ping_ms;
	int tfd, ep;          /* its timer, and one epoll set of it and sfd for the loop */
	pthread_mutex_t out;  /* one line at a time on stdout and stderr */
};

#define TO(field) CMD_TO(struct watch_cli, field)

static const struct cmd_opt watch_opts[] = {
	CMD_OPT_GROUP(tree_opts),
	CMD_OPT(0, "delete", NULL, "remove stored files when they are removed from DIR", .id = OPT_DELETE,
	        .kind = CMD_SET, .to = TO(delete)),
	CMD_OPT(0, "max-delete", "N|P%", "with --delete: a settled batch or full pass that would "
	        "remove more than N files (P% of those stored) removes none; exit 7",
	        .id = OPT_MAX_DELETE),
	CMD_OPT(0, "no-initial", NULL, "skip the first full pass (an import of DIR)", .id = OPT_NO_INITIAL,
	        .kind = CMD_CLEAR, .to = TO(initial)),
	CMD_OPT(0, "settle", "MS", "wait until a path has been quiet this long (default 50)",
	        .id = OPT_SETTLE, .kind = CMD_COUNT, .to = TO(settle_ms), .max = 600000,
	        .bad = "--settle takes milliseconds, not '%s'"),
	CMD_OPT(0, "rescan-every", "S", "a full pass every S seconds (default: never)",
	        .id = OPT_RESCAN_EVERY, .kind = CMD_COUNT, .to = TO(rescan_every_s), .min = 1,
	        .max = 30L * 86400, .bad = "--rescan-every takes seconds (1 to 2592000), not '%s'"),
	CMD_OPT(0, "unwatched", "ACTION", "a directory inotify cannot watch: rescan (default) or fail",
	        .id = OPT_UNWATCHED, .values = "rescan fail", .kind = CMD_WORD, .to = TO(unwatched),
	        .bad = "--unwatched takes rescan or fail, not '%s'"),
	CMD_OPT(0, "max-pending", "N", "changes kept waiting before a full pass replaces them",
	        .id = OPT_MAX_PENDING, .kind = CMD_COUNT, .to = TO(max_pending), .min = 1,
	        .max = 100000000, .bad = "--max-pending takes a count, not '%s'"),
	CMD_OPT('j', "jobs", "N", "parallelism of full passes and batches (default 4)",
	        .kind = CMD_COUNT, .to = TO(jobs), .min = 1, .max = 64,
	        .bad = "--jobs takes 1 to 64, not '%s'"),
	CMD_OPT(0, "json", NULL, "one JSON object per action on stdout", .id = OPT_JSON,
	        .kind = CMD_SET, .to = TO(json)),
	CMD_OPT_END,
};

/* The rows of the tree selection, and --max-delete. */
static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct watch_cli *w = ctx;
	if (opt == OPT_MAX_DELETE)
		return max_delete_option(arg, &w->max_delete);
	return tree_option(opt, arg, &w->sel) == 0 ? 0 : -1;
}

static void
emit_json(bson_t *doc)
{
	print_json(stdout, doc);
	fflush(stdout);
	bson_destroy(doc);
}

static void
report(const struct watch_cli *w, const char *event, const char *name, int64_t bytes)
{
	if (G.quiet)
		return;
	if (w->json) {
		bson_t doc;
		json_event(&doc, json_action(event));
		if (name)
			json_filename(&doc, name);
		if (bytes >= 0)
			BSON_APPEND_INT64(&doc, "bytes", bytes);
		emit_json(&doc);
	} else {
		/* "deleted-folder": "deleted folder NAME" */
		size_t n = strcspn(event, "-");
		human_line(stdout, "%.*s%s %s", (int)n, event, event[n] ? " folder" : "", name ? name : "");
		fflush(stdout);
	}
}

static int64_t
mono_ms(void)
{
	return gfs_clock_ns(CLOCK_MONOTONIC) / 1000000;
}

/* WATCHDOG=1 unless one went out less than ping_every_ms ago; from any thread. */
static void
ping_if_due(struct watch_cli *w)
{
	if (!w->ping_every_ms)
		return;
	int64_t now = mono_ms();
	int64_t next = atomic_load(&w->next_ping_ms);
	if (now < next || !atomic_compare_exchange_strong(&w->next_ping_ms, &next, now + w->ping_every_ms))
		return;
	notify_systemd("WATCHDOG=1");
}

static void
on_progress(void *ctx)
{
	ping_if_due(ctx);
}

static void
report_moved(const struct watch_cli *w, const gfs_watcher_event *ev)
{
	if (G.quiet)
		return;
	if (w->json) {
		bson_t doc;
		json_event(&doc, json_action(ev->is_dir ? "moved-folder" : "moved"));
		json_filename(&doc, ev->name);
		BSON_APPEND_UTF8(&doc, "from", ev->from);
		BSON_APPEND_INT64(&doc, "files", (int64_t)ev->files);
		emit_json(&doc);
	} else {
		human_line(stdout, "moved%s %s -> %s", ev->is_dir ? " folder" : "", ev->from, ev->name);
		fflush(stdout);
	}
}

static void
report_pass(const struct watch_cli *w, const gfs_watcher_event *ev)
{
	if (!w->json || G.quiet)
		return;
	const gfs_import_stats *st = ev->stats;
	bson_t doc;
	json_event(&doc, "synced");
	BSON_APPEND_INT64(&doc, "uploaded", (int64_t)st->uploaded);
	BSON_APPEND_INT64(&doc, "replaced", (int64_t)st->replaced);
	BSON_APPEND_INT64(&doc, "deleted", (int64_t)st->deleted);
	BSON_APPEND_INT64(&doc, "failed", (int64_t)st->failed);
	BSON_APPEND_INT64(&doc, "unwatched", (int64_t)ev->unwatched);
	emit_json(&doc);
}

/* Once per outage: a line per file would bury the one that matters. */
static void
report_down(const struct watch_cli *w, const gfs_watcher_event *ev)
{
	warnx_("backend unreachable: %s; %zu changes wait, retrying", ev->message, ev->pending);
	notify_systemd("STATUS=backend unreachable; changes wait");
	if (w->json && !G.quiet) {
		bson_t doc;
		json_event(&doc, "backend-down");
		BSON_APPEND_UTF8(&doc, "error", ev->message);
		BSON_APPEND_INT64(&doc, "pending", (int64_t)ev->pending);
		BSON_APPEND_DATE_TIME(&doc, "since", ev->since_ms);
		emit_json(&doc);
	}
}

static void
report_up(const struct watch_cli *w, const gfs_watcher_event *ev)
{
	int64_t secs = (gfs_now_ms() - ev->since_ms) / 1000;
	warnx_("backend reachable again after %lld s; acting on %zu changes", (long long)secs, ev->pending);
	notify_systemd("STATUS=watching");
	if (w->json && !G.quiet) {
		bson_t doc;
		json_event(&doc, "backend-up");
		BSON_APPEND_INT64(&doc, "pending", (int64_t)ev->pending);
		BSON_APPEND_DATE_TIME(&doc, "since", ev->since_ms);
		emit_json(&doc);
	}
}

static void
count_action(struct watch_cli *w, const char *action)
{
	if (strcmp(action, "uploaded") == 0)
		w->uploaded++;
	else if (strcmp(action, "replaced") == 0)
		w->replaced++;
	else if (strncmp(action, "deleted", 7) == 0)
		w->deleted++;
}

static void
count_pass(struct watch_cli *w, const gfs_import_stats *st)
{
	w->uploaded += st->uploaded;
	w->replaced += st->replaced;
	w->deleted += st->deleted;
}

static void
on_event(const gfs_watcher_event *ev, void *ctx)
{
	struct watch_cli *w = ctx;
	ping_if_due(w);
	pthread_mutex_lock(&w->out);
	switch (ev->kind) {
	case GFS_WEV_WARNING: warnx_("%s", ev->message); break;
	case GFS_WEV_ACTION: count_action(w, ev->action); report(w, ev->action, ev->name, ev->bytes); break;
	case GFS_WEV_MOVED: w->moved++; report_moved(w, ev); break;
	case GFS_WEV_SYNCED: count_pass(w, ev->stats); report_pass(w, ev); break;
	case GFS_WEV_BACKEND_DOWN: report_down(w, ev); break;
	case GFS_WEV_BACKEND_UP: report_up(w, ev); break;
	}
	pthread_mutex_unlock(&w->out);
}

/* SIGUSR1: what waits, and since when, on stderr (and as JSON with --json). */
static void
status_line(struct watch_cli *w)
{
	gfs_watcher_status st;
	gfs_watcher_status_of(w->watcher, &st);
	pthread_mutex_lock(&w->out);
	if (w->json && !G.quiet) {
		bson_t doc;
		json_event(&doc, "status");
		BSON_APPEND_INT64(&doc, "pending", (int64_t)st.pending);
		BSON_APPEND_INT64(&doc, "inFlight", (int64_t)st.in_flight);
		BSON_APPEND_INT64(&doc, "retrying", (int64_t)st.retrying);
		if (st.oldest_ms)
			BSON_APPEND_DATE_TIME(&doc, "since", st.oldest_ms);
		BSON_APPEND_BOOL(&doc, "backend", !st.down);
		if (st.down)
			BSON_APPEND_DATE_TIME(&doc, "downSince", st.down_since_ms);
		BSON_APPEND_BOOL(&doc, "passOwed", st.pass_owed);
		BSON_APPEND_INT64(&doc, "directories", (int64_t)st.directories);
		BSON_APPEND_INT64(&doc, "unwatched", (int64_t)st.unwatched);
		emit_json(&doc);
	}
	int64_t now = gfs_now_ms();
	fprintf(stderr, "%s watch: %zu changes waiting (%zu in flight, %zu retrying)", progname,
	        st.pending, st.in_flight, st.retrying);
	if (st.oldest_ms)
		fprintf(stderr, " (the oldest for %lld s)", (long long)(now - st.oldest_ms) / 1000);
	if (st.down)
		fprintf(stderr, "; backend unreachable for %lld s", (long long)(now - st.down_since_ms) / 1000);
	if (st.pass_owed)
		fprintf(stderr, "; a full pass is owed");
	fprintf(stderr, "; %zu directories watched, %zu not\n", st.directories, st.unwatched);
	pthread_mutex_unlock(&w->out);
}

/* The watchdog's timer, or one signal: false when a signal says stop (w->rc set). */
static bool
on_signal(void *ctx)
{
	struct watch_cli *w = ctx;
	uint64_t ticks;
	if (w->tfd >= 0 && read(w->tfd, &ticks, sizeof ticks) == sizeof ticks)
		ping_if_due(w);
	struct signalfd_siginfo si;
	if (read(w->sfd, &si, sizeof si) != sizeof si)
		return true;
	if (si.ssi_signo == SIGUSR1) {
		status_line(w);
		return true;
	}
	w->rc = si.ssi_signo == SIGINT ? EXIT_INTERRUPTED : EXIT_OK;
	return false;
}

static void
say_ready(const struct watch_cli *w)
{
	gfs_watcher_status st;
	gfs_watcher_status_of(w->watcher, &st);
	char msg[128];
	snprintf(msg, sizeof msg, "READY=1\nSTATUS=watching %zu directories", st.directories);
	notify_systemd(msg);
	if (G.quiet)
		return;
	if (w->json) {
		bson_t doc;
		json_event(&doc, "ready");
		BSON_APPEND_INT64(&doc, "directories", (int64_t)st.directories);
		BSON_APPEND_INT64(&doc, "unwatched", (int64_t)st.unwatched);
		emit_json(&doc);
	}
	fprintf(stderr, "%s watch: ready: watching %s (%zu directories%s)\n", progname, w->o.dir,
	        st.directories, st.unwatched ? ", some not watched" : "");
}

/*
 * The descriptor the loop watches for us: the signalfd alone, or with a
 * watchdog, one epoll set of it and a timer ticking at a quarter of the
 * interval (so a ping, due at half of it, is never a whole one late).
 */
static int
loop_fd(struct watch_cli *w)
{
	w->tfd = w->ep = -1;
	uint64_t usec = gfs_sd_watchdog_usec();
	if (!usec)
		return w->sfd;
	w->ping_every_ms = usec < 2000 ? 1 : (int64_t)(usec / 2000);
	int64_t tick_ns = (int64_t)usec * 250;
	struct itimerspec its = {
		.it_interval = {.tv_sec = tick_ns / 1000000000, .tv_nsec = tick_ns % 1000000000},
	};
	its.it_value = its.it_interval;
	w->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	w->ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event sev = {.events = EPOLLIN, .data.fd = w->sfd};
	struct epoll_event tev = {.events = EPOLLIN, .data.fd = w->tfd};
	if (w->tfd < 0 || w->ep < 0 || timerfd_settime(w->tfd, 0, &its, NULL) < 0 ||
	    epoll_ctl(w->ep, EPOLL_CTL_ADD, w->sfd, &sev) < 0 ||
	    epoll_ctl(w->ep, EPOLL_CTL_ADD, w->tfd, &tev) < 0) {
		warn_("the systemd watchdog's timer");
		return w->sfd;   /* pings then come only with events and passes */
	}
	return w->ep;
}

static void
loop_fd_close(struct watch_cli *w)
{
	if (w->ep >= 0)
		close(w->ep);
	if (w->tfd >= 0)
		close(w->tfd);
}

/*
 * Under a watchdog, no backend call outlasts its interval: the loop pings
 * while the worker waits, so only a bound on each call keeps a hung one
 * from being pinged over. The user's GRIDFSCTL_TIMEOUT, and the URI's own
 * timeouts, are theirs to choose.
 */
static void
bound_calls_by_watchdog(void)
{
	uint64_t usec = gfs_sd_watchdog_usec();
	const char *t = getenv("GRIDFSCTL_TIMEOUT");
	if (!usec || (t && *t) || usec / 1000 >= GFS_REPLY_TIMEOUT_MS)
		return;
	gfs_conn_set_timeout(usec < 1000 ? 1 : (int)(usec / 1000));
}

/* The watcher from start to finish; an exit status. */
static int
watch(struct watch_cli *w, gfs_conn *conn)
{
	gfs_watcher_opts wo = {
		.o = w->o,
		.delete = w->delete,
		.initial = w->initial,
		.unwatched_fail = w->unwatched == UNWATCHED_FAIL,
		.max_delete = w->max_delete,
		.settle_ms = w->settle_ms,
		.jobs = w->jobs,
		.rescan_every_s = w->rescan_every_s,
		.max_pending = w->max_pending,
		.on_event = on_event,
		.on_progress = on_progress,
		.ctx = w,
	};
	w->watcher = gfs_watcher_new(conn, &wo);
	gfs_error err;
	int rc;
	if (!gfs_watcher_start(w->watcher, &err)) {
		rc = exit_code_for(&err);   /* the cause is said already */
	} else {
		say_ready(w);
		enum gfs_watcher_end end = gfs_watcher_run(w->watcher, loop_fd(w), on_signal, w);
		loop_fd_close(w);
		rc = end == GFS_WATCHER_ASKED ? w->rc : end == GFS_WATCHER_LIMIT ? EXIT_LIMIT : EXIT_LOCAL;
		notify_systemd("STOPPING=1");
		gfs_watcher_finish(w->watcher);
	}
	gfs_watcher_status st;
	gfs_watcher_status_of(w->watcher, &st);
	w->failures = st.failures;
	gfs_watcher_free(w->watcher);
	w->watcher = NULL;
	return rc;
}

/* The last line of --json: how long it watched, what failed, and why it stopped if not cleanly. */
static void
print_summary(const struct watch_cli *w, int rc, double seconds)
{
	struct json_summary sum;
	json_summary_begin(&sum, "watch", false);
	BSON_APPEND_INT64(&sum.body, "uploaded", (int64_t)w->uploaded);
	BSON_APPEND_INT64(&sum.body, "replaced", (int64_t)w->replaced);
	BSON_APPEND_INT64(&sum.body, "deleted", (int64_t)w->deleted);
	BSON_APPEND_INT64(&sum.body, "moved", (int64_t)w->moved);
	BSON_APPEND_INT64(&sum.body, "failed", (int64_t)w->failures);
	const char *error = NULL;
	if (rc == EXIT_INTERRUPTED)
		error = "interrupted";
	else if (rc != EXIT_OK)
		error = last_message()[0] ? last_message() : "failed";
	json_summary_end(stdout, &sum, seconds, error);
}

static int
cmd_watch(int argc, char **argv)
{
	double started = gfs_mono_seconds();
	struct watch_cli w = {.initial = true, .settle_ms = 50, .jobs = 4, .max_pending = DEFAULT_MAX_PENDING,
	                      .out = PTHREAD_MUTEX_INITIALIZER};
	w.o.keep_revisions = 1;
	int i = parse_options(argc, argv, &cmd_watch_entry, on_opt, &w);
	int rc = EXIT_USAGE;
	if (i < 0)
		goto out;
	if (argc - i != 1) {
		usage_error(argc - i ? "one DIR at a time" : "a DIR is required");
		goto out;
	}
	w.o.dir = argv[i];
	if (!max_delete_fits(&w.max_delete, w.delete))
		goto out;
	w.o.prefix = w.sel.prefix;
	w.o.content_type = w.sel.content_type;
	tree_select_walk(&w.sel, &w.o.walk);
	/* Before any thread exists (the driver starts monitor threads): see cmd/interrupt.c. */
	w.sfd = interrupt_signalfd(SIGUSR1);
	bound_calls_by_watchdog();
	gfs_error err;
	gfs_conn *conn = connect_for_writes();
	if (!conn) {
		close(w.sfd);
		goto out;
	}
	if (!gfs_conn_ping(conn, &err)) {
		rc = fail(&err);
		gfs_conn_close(conn);
		close(w.sfd);
		goto out;
	}
	rc = watch(&w, conn);
	close(w.sfd);
	if (rc == EXIT_OK && w.failures)
		rc = EXIT_PARTIAL;
	gfs_conn_close(conn);
out:
	if (w.json && i >= 0)
		print_summary(&w, rc, gfs_mono_seconds() - started);
	free_tree_select(&w.sel);
	return rc;
}

static const struct cmd_exit watch_exits[] = {
	{0, "stopped by SIGTERM"}, {1, "some changes failed or were left waiting"}, {2, "usage"},
	{3, "backend unreachable at start or in the first pass"},
	{5, "DIR cannot be watched or went away"}, {7, "--max-delete stopped it"},
	{130, "stopped by SIGINT"}, {-1, NULL},
};

const struct cmd_entry cmd_watch_entry = {
	.name = "watch",
	.summary = "keep the bucket in sync with a directory",
	.operands = "DIR",
	.opts = watch_opts,
	.exits = watch_exits,
	.run = cmd_watch,
};
