/*
 * The HTTP server behind `gridfsctl serve`, on libmicrohttpd: routing,
 * conditional and range requests, the response cache, the disk tier, the
 * metadata index, backend fetches on a worker pool with suspended
 * connections, metrics and the access log. It prints nothing itself:
 * messages go to cfg->log. This is lib/serve/'s face, the one header of
 * it cmd/serve.c includes; internal.h lists the parts behind it.
 */
#ifndef GFS_SERVE_SERVE_H
#define GFS_SERVE_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../gfs.h"

struct httpserve_config {
	const char *host;          /* numeric address to bind, e.g. "127.0.0.1" or "::1" */
	unsigned port;             /* 0: any free port */
	int listen_fd;             /* >= 0: serve on this listening socket instead */
	bool reuse_port;           /* SO_REUSEPORT, so several servers can share the port */
	const char *prefix;        /* serve PREFIX/<path>; normalized, "" for the whole bucket */
	size_t cache_size;         /* bytes of bodies kept in memory */
	size_t stream_threshold;   /* larger files stream chunk by chunk, uncached */
	unsigned threads;          /* event threads */
	unsigned workers;          /* backend fetch threads, each with its own session */
	unsigned queue_max;        /* fetches waiting beyond this are answered 503 */
	unsigned max_connections;
	unsigned timeout_s;        /* idle connection timeout */
	int header_timeout_ms;     /* a request's line and headers must arrive within this */
	unsigned max_per_ip;       /* connections open at once from one address; 0: no limit */
	size_t conn_memory;        /* per-connection memory, which bounds request headers */
	const char *cache_control; /* NULL: no Cache-Control header */
	FILE *access_log;          /* NULL: none; combined format, one line per request */
	int poll_ms;               /* look for new uploads this often */
	int poll_window_ms;        /* and that far back: how late a writer's dates may be */
	int reload_ms;             /* reread the whole index this often (deletions, renames) */
	int neg_ttl_ms;            /* remember a missing name or id this long */
	bool preload;              /* fill the caches in one pass over the chunks, while serving */
	const char *cache_dir;     /* NULL: no disk tier (lib/serve/disktier.h) */
	uint64_t cache_dir_size;   /* bytes the disk tier may hold; 0: its default */
	void (*log)(const char *msg);
	/* With preload: the pass is over (ok: it read to the end), on the preload thread. */
	void (*preloaded)(bool ok, uint64_t files, double seconds);
};

/* Where the preload pass is; /_health gives its word. */
enum httpserve_preload {
	HTTPSERVE_PRELOAD_OFF,      /* no --preload */
	HTTPSERVE_PRELOAD_RUNNING,  /* waiting for the index, or reading */
	HTTPSERVE_PRELOAD_DONE,     /* read to the end: every file it could take is cached */
	HTTPSERVE_PRELOAD_FAILED,   /* ended on an error: the rest is read on demand */
};

typedef struct httpserve httpserve;

/*
 * Loads the index (a backend that does not answer is not fatal: the server
 * starts and answers 503 until it does) and listens; then, if asked,
 * preloads on a thread of its own, once the index is loaded, while
 * requests are answered from the backend (see cfg->preloaded).
 */
httpserve *httpserve_start(gfs_conn *conn, const struct httpserve_config *cfg, gfs_error *err);
enum httpserve_preload httpserve_preload_state(httpserve *h);
/* "running", "done", "failed"; NULL for HTTPSERVE_PRELOAD_OFF. */
const char *httpserve_preload_word(enum httpserve_preload state);
unsigned httpserve_port(httpserve *h);
/* Swaps the access log (after log rotation); returns the old one for the caller to close. */
FILE *httpserve_set_access_log(httpserve *h, FILE *log);
/* Stops accepting new connections; open ones are still served. */
void httpserve_quiesce(httpserve *h);
/* Waits until no request is in progress; false when timeout_ms passed first. */
bool httpserve_drain(httpserve *h, int timeout_ms);
/* Ends every connection and frees everything. */
void httpserve_stop(httpserve *h);

#endif
