/*
 * The watch loop: keeps a bucket in step with a directory through inotify
 * (inotify_tree.h), acting through watch_actions.h's per-file actions and import's
 * engine.
 *
 * Changes wait in a table keyed by path (the latest event decides) until
 * the path has been quiet for the settle time. A change that fails stays
 * in the table: a failure of the backend starts an outage, during which
 * nothing is tried but a ping, with backoff; once the backend answers,
 * everything waiting is acted on. A local failure is retried for that
 * path alone, with backoff. The table is bounded: past the bound it is
 * dropped and a full pass (an import) owed instead. The files due
 * together are stored together, through import's batched, parallel
 * workers (gfs_import_paths), when there are more than a few.
 *
 * Moves within the tree are renames in GridFS. Their order matters (a
 * name moved away may be made again at once), so they, and the removals
 * they must follow, wait in a queue that is acted on before the table.
 * Single files' moves and removals go in batches as uploads do: each
 * name found by equality, the renames in one ordered bulk write, the
 * removals in one; a folder's is one range query.
 *
 * Every backend call is made by a worker thread, one turn of work at a
 * time, while the loop keeps answering the caller's descriptor: status
 * and the caller's timers (a watchdog) never wait for the backend. The
 * loop leaves the state alone while a turn runs; the worker publishes
 * what status reports.
 *
 * Nothing here prints or knows signals: what happens is handed to
 * on_event (from the worker, or from import's threads during a batch:
 * one call at a time, but not on the loop's thread), and the caller's own
 * descriptor (a signalfd, say) is watched beside inotify and the timer
 * and handed back to the caller, on the loop's thread, who says whether
 * to go on.
 */
#ifndef GFS_WATCHLOOP_H
#define GFS_WATCHLOOP_H

#include <stdbool.h>
#include <stdint.h>

#include "gfs.h"
#include "import.h"
#include "maxdelete.h"
#include "watch_actions.h"

enum gfs_watcher_event_kind {
	GFS_WEV_WARNING,       /* message: something the user should know */
	/* action, name: "uploaded" or "replaced" (bytes), "removed" or "removed-folder" (bytes -1) */
	GFS_WEV_ACTION,
	GFS_WEV_MOVED,         /* from, name, is_dir, files: renamed in GridFS */
	GFS_WEV_SYNCED,        /* a full pass ended: stats, unwatched */
	GFS_WEV_BACKEND_DOWN,  /* message (why), pending, since_ms: an outage starts */
	GFS_WEV_BACKEND_UP,    /* pending, since_ms: the outage that began then is over */
};

typedef struct gfs_watcher_event {
	enum gfs_watcher_event_kind kind;
	const char *message;
	const char *action;
	const char *name;
	const char *from;
	bool is_dir;
	int64_t bytes;
	uint64_t files;
	const gfs_import_stats *stats;
	size_t unwatched;
	size_t pending;
	int64_t since_ms;           /* wall clock, ms since the epoch */
} gfs_watcher_event;

typedef void (*gfs_watcher_event_fn)(const gfs_watcher_event *ev, void *ctx);

typedef struct gfs_watcher_opts {
	gfs_watch_opts o;           /* the directory, the prefix and how files are stored */
	bool delete;                /* removals and moves away remove stored names */
	bool initial;               /* a full pass before watching */
	bool unwatched_fail;        /* a directory inotify cannot watch ends watching */
	gfs_max_delete max_delete;
	long settle_ms;
	long jobs;                  /* parallelism of full passes and batches */
	long rescan_every_s;        /* 0: no periodic full pass */
	long max_pending;           /* changes kept waiting before a full pass replaces them */
	gfs_watcher_event_fn on_event;
	/*
	 * A sign of life while the loop waits on a full pass or a batch: called
	 * for each file they handle (stored, skipped or failed), from any
	 * thread, one call at a time, with ctx. NULL: none.
	 */
	void (*on_progress)(void *ctx);
	void *ctx;
} gfs_watcher_opts;

typedef struct gfs_watcher_status {
	size_t pending;             /* changes waiting, those in flight and retrying included */
	size_t in_flight;           /* in the batch being acted on */
	size_t retrying;            /* failed, waiting for their retry (outages aside) */
	int64_t oldest_ms;          /* wall clock of the oldest change waiting; 0 when none */
	bool down;                  /* the backend is unreachable, since down_since_ms */
	int64_t down_since_ms;
	bool pass_owed;
	size_t directories, unwatched;
	uint64_t failures;          /* actions given up on */
} gfs_watcher_status;

enum gfs_watcher_end {
	GFS_WATCHER_ASKED,          /* the caller's descriptor said stop */
	GFS_WATCHER_LIMIT,          /* --max-delete: a run of removals was over the limit */
	GFS_WATCHER_FAILED,         /* watching cannot go on (said in a warning) */
};

typedef struct gfs_watcher gfs_watcher;

gfs_watcher *gfs_watcher_new(gfs_conn *conn, const gfs_watcher_opts *o);
void gfs_watcher_free(gfs_watcher *w);
/*
 * Watches first, then the full pass (opts.initial): a change made during
 * the pass is not missed. False when watching cannot start; the cause has
 * been said in a warning, and err's code is its kind (GFS_ELOCAL for the
 * directory, else that of the initial pass's error).
 */
bool gfs_watcher_start(gfs_watcher *w, gfs_error *err);
/*
 * The loop, until fn (called when fd is readable, also while a turn of
 * work runs) returns false or watching cannot go on; a turn running then
 * ends after its batch in flight. It does not finish: see gfs_watcher_finish.
 */
typedef bool (*gfs_watcher_fd_fn)(void *ctx);
enum gfs_watcher_end gfs_watcher_run(gfs_watcher *w, int fd, gfs_watcher_fd_fn fn, void *ctx);
/* At the end, one more try of everything waiting; what is left is said, not lost silently. */
void gfs_watcher_finish(gfs_watcher *w);
/* As of now, or as of the running turn's last batch: never waits for it. From the loop's thread. */
void gfs_watcher_status_of(gfs_watcher *w, gfs_watcher_status *st);

#endif
