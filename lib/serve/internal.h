/*
 * serve's private header: the structures every part shares and the calls
 * between the parts. Nothing outside lib/serve/ includes it (cmd/serve.c
 * includes serve.h). Each part is one file, its design in its opening
 * comment. The parts form layers, lowest first, one line each: a file
 * calls only files on the lines above its own (files on one line call
 * none of each other's), so each can be read knowing only what is above
 * it; tests/test_structure.py fails on a loop between them.
 *
 *   httpparse.c revledger.c   pure: the HTTP parsers (fuzzed), the revisions the poll saw
 *   nameindex.c               names -> metadata, polled and reloaded
 *   memcache.c disktier.c acceptor.c  bodies in memory, bodies on disk, accept(2) with back-off
 *   counters.c                the clock, the latency histogram, the drain's wake-up, serve_logf
 *   reply.c                   the responses every part sends: statuses, file headers, queueing
 *   guard.c                   slow clients: header deadlines, per-address limit
 *   stream.c                  a large file chunk by chunk, checked as it goes (the tee)
 *   jobs.c                    the job queue and the workers: fetches, lookups, streams
 *   preload.c                 the name index's upkeep (the poller) and --preload
 *   metrics.c                 the /_metrics page and the access log
 *   requests.c                a request from its URI to its answer: routing, conditions, ranges
 *   loop.c                    start, quiesce, drain, stop: the event threads and the others
 *
 * The first three lines have headers of their own. What a part keeps to
 * itself is static. An event thread never waits on MongoDB: whatever needs
 * the backend is a job, run on a worker while its connection is suspended.
 */
#ifndef GFS_SERVE_INTERNAL_H
#define GFS_SERVE_INTERNAL_H

#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../filename.h"
#include "../strmap.h"
#include "../util.h"
#include "../workq.h"
#include "acceptor.h"
#include "disktier.h"
#include "httpparse.h"
#include "memcache.h"
#include "nameindex.h"
#include "serve.h"

#define STREAM_BUFFER_BYTES (1024 * 1024)  /* read ahead of a streaming client */
#define STREAM_BLOCK 65536
#define NBUCKETS 13
#define MAX_DAEMONS 64
#define LISTEN_BACKLOG 4096
#define OPEN_ENTRIES_MAX 16384  /* tier entries kept open */
#define SEEN_BITS 65536         /* the open entries' admission filter */
#define OPEN_GATE_WINDOW 1024   /* requests for the tier a thread counts to judge the open set */
#define OPEN_GATE_REST 15       /* windows it then passes the set by, when the set does not pay */

enum job_kind { JOB_FETCH, JOB_LOOKUP, JOB_STREAM };
enum phase { PHASE_NEW, PHASE_WAITING, PHASE_RESUMED };

struct stream;

struct req {
	struct httpserve *srv;
	struct MHD_Connection *conn;
	char *uri;
	int64_t start_ms;
	char method[16];
	char version[16];
	char *referer, *agent;   /* only kept when there is an access log */
	bool handled, head, range;
	bool corked;             /* see cork() */
	bool bad_target;         /* the raw target holds %00 */
	uintptr_t target;        /* where libmicrohttpd holds the raw target, and its length */
	size_t target_len;       /* up to the first NUL */
	enum phase phase;
	unsigned status;
	uint64_t body_bytes;
	int64_t first, last;
	gfs_meta *meta;
	http_cache_entry *entry;
	http_cache_entry *open_entry;  /* from srv->open */
	unsigned fetch_status;   /* from the worker: 200, or the status to answer */
	struct stream *stream;   /* waiting for its first window; ours until its response holds it */
	struct stream *sent;     /* the stream its response sends (referenced): how it ended */
	struct req *next_waiter;
};

struct job {
	enum job_kind kind;
	char *key;               /* in the in-flight map; NULL for streams, never shared */
	gfs_meta *meta;          /* FETCH, STREAM; the result of a LOOKUP */
	char *name;              /* LOOKUP by name */
	int rev;
	char *id_key;            /* LOOKUP by id */
	char *request;           /* STREAM: the request line's method and target, for the log */
	struct stream *stream;
	struct req *waiters;
	unsigned status;
	http_cache_entry *entry;
	bool fresh;              /* entry was read from the backend just now: fill the disk tier */
};

struct sbuf {
	struct sbuf *next;
	size_t len, off;
	uint8_t data[];
};

struct stream {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	atomic_int refs;
	struct MHD_Connection *conn;
	struct sbuf *head, *tail;
	size_t queued;
	bool suspended, done, failed, cancelled;
	bool damaged;            /* cut off because its content failed the integrity rule */
	int64_t first, last;
	const atomic_bool *stopping;
};

/* An event thread: one libmicrohttpd daemon, and how many connections it has. */
struct loop {
	struct httpserve *srv;
	struct MHD_Daemon *d;
	atomic_long conns;
};

struct httpserve {
	struct httpserve_config cfg;
	char *prefix;
	gfs_conn *conn;
	struct loop loops[MAX_DAEMONS];
	unsigned nd;
	unsigned next_loop;          /* the accepting thread's own: where ties go next */
	int listen_fd;               /* ours, or the inherited one; -1 once closed */
	acceptor *_Atomic acceptor;  /* event threads read it when a connection closes */
	bool quiesced;
	name_index *index;
	http_cache *cache;
	disktier *tier;              /* NULL without --cache-dir */
	http_cache *open;            /* the tier's open descriptors, with their 200 responses */
	_Atomic uint64_t seen[SEEN_BITS / 64]; /* tier hits asked for recently: see admit() */
	atomic_uint seen_marks;      /* bits set since the filter was last cleared */
	unsigned seen_window;        /* clear it after this many: the open set's size */
	atomic_ullong open_bypassed; /* requests that passed the open set by: open_gate_pass() */

	pthread_mutex_t jobs_mu;     /* the in-flight map and each job's waiters */
	gfs_workq *jobs;             /* jobs for the workers, at most queue_max; closed when stopping */
	strmap *inflight;
	atomic_bool stopping;
	pthread_t *workers;
	unsigned nworkers;

	pthread_t poller;
	bool poller_started;
	pthread_mutex_t poll_mu;
	pthread_cond_t poll_cv;
	bool poll_stop;

	atomic_long active;          /* requests begun and not completed */
	atomic_bool draining;
	pthread_mutex_t active_mu;   /* with active_cv: wakes the drain when active reaches 0 */
	pthread_cond_t active_cv;

	pthread_mutex_t log_mu;
	FILE *access_log;            /* under log_mu; set once at start when logging is on */
	atomic_bool backend_down;
	atomic_int_fast64_t last_emfile_log_ms;
	atomic_int_fast64_t last_mhd_log_ms;

	struct MHD_Response *r400, *r404, *r405, *r500, *r503, *r503busy;

	/* metrics */
	atomic_uint_fast64_t status_count[600];
	atomic_uint_fast64_t bytes_sent;
	atomic_uint_fast64_t latency_bucket[NBUCKETS];
	atomic_uint_fast64_t latency_count, latency_sum_us;
	atomic_uint_fast64_t emfile_events, queue_full, coalesced;
	atomic_long open_connections;
	atomic_long unanswered_connections;   /* accepted, first request not yet begun */
	atomic_uint_fast64_t preloaded;
	atomic_uint_fast64_t backend_reads;   /* file bodies read from the backend, for any reason */
	atomic_uint_fast64_t integrity_failures; /* of them, failed the integrity rule */
	atomic_uint_fast64_t primary_rereads; /* files a secondary showed damaged, read on the primary */
	atomic_uint_fast64_t header_timeouts, per_ip_refused;
	atomic_int_fast64_t last_per_ip_log_ms;

	/* Slow clients: every open connection, and how many each address has. */
	pthread_mutex_t guard_mu;
	pthread_cond_t guard_cv;
	struct conn_state *conns;
	strmap *per_ip;
	bool guard_stop;
	pthread_t guard;
	bool guard_started;
	atomic_int_fast64_t poll_us, reload_us, poll_interval_ms;

	/* --preload: the pass runs on a thread of its own while the server answers. */
	pthread_mutex_t preload_mu;
	pthread_cond_t preload_cv;
	bool preload_stop;            /* under preload_mu */
	pthread_t preloader;
	bool preloader_started;
	atomic_int preload_state;     /* enum httpserve_preload */
};

/*
 * A connection accepted but not yet sent its first request must not be
 * closed by a drain: its client did nothing wrong. One that is idle between
 * keep-alive requests may be closed, as HTTP allows.
 */
struct conn_state {
	bool had_request;   /* only the connection's own thread touches it */
	/* The rest is for the header deadline and the per-address count (guard_mu). */
	struct conn_state *prev, *next;
	int fd;
	bool shut;
	atomic_int_fast64_t header_deadline_ms;   /* monotonic; 0 while not reading a header */
	char addr[INET6_ADDRSTRLEN];              /* "" when not counted */
};

/*
 * A whole stream is checked as it goes, and its last bytes are held back
 * until the digest of all of it checks: a body that fails the integrity
 * rule never reaches a client whole (the connection is cut short, as for
 * a removed revision). A whole file streamed also fills the disk tier,
 * once its digest checks.
 */
struct tee {
	gfs_digest *digest;     /* whole streams only */
	bool checked;           /* the digest was final and matched */
	disktier_fill *fill;
	uint8_t *held;          /* the bytes of the last chunk, for the client */
	size_t held_len;
};

/* An open tier entry's body (see requests.c's open_kept). */
struct kept {
	int fd;                         /* the response's; -1 for an empty file */
	char name[DISKTIER_NAME_MAX];
};

/* counters.c: the clock, the latency histogram, the drain's wake-up, messages */

/* The upper bounds, in seconds, of the latency histogram's buckets but the last (+Inf). */
extern const double latency_bounds[NBUCKETS - 1];
/* Monotonic microseconds. */
int64_t mono_us(void);
/* Counts a backend read that took us microseconds in the latency histogram. */
void observe_latency(struct httpserve *srv, int64_t us);
/* Formats a message to cfg.log; nothing when there is none. */
void serve_logf(struct httpserve *srv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Wakes httpserve_drain to look at the counts again. */
void wake_drain(struct httpserve *srv);
/* One connection fewer waits for its first answer; a drain waiting for none is woken. */
void connection_answered(struct httpserve *srv);

/* reply.c: the responses every part sends */

/* A copy of s, or of "" when s is NULL (a header libmicrohttpd did not give). */
char *strdup_or_empty(const char *s);
/* r itself; exits when libmicrohttpd could make no response (memory ran out). */
struct MHD_Response *made(struct MHD_Response *r);
/* Makes the canned status responses (400, 404, 405, 500, 503) srv answers with. */
void make_status_responses(struct httpserve *srv);
/* Adds m's ETag, Last-Modified, Accept-Ranges, Cache-Control and, with body, type to r. */
void add_file_headers(struct httpserve *srv, struct MHD_Response *r, const gfs_meta *m, bool body);
/* A 200 response over a cached body, which it holds until libmicrohttpd frees it. */
struct MHD_Response *body_response(struct httpserve *srv, const gfs_meta *m, http_cache_body *b);
/* Queues resp, which other requests share (ours stays), with status for r. */
enum MHD_Result queue_shared(struct req *r, unsigned status, struct MHD_Response *resp,
                             uint64_t body_bytes);
/* Queues resp with status for r, then drops our reference to resp. */
enum MHD_Result queue_once(struct req *r, unsigned status, struct MHD_Response *resp,
                           uint64_t body_bytes);
/* Answers r with the canned response for status (500 for one without). */
enum MHD_Result send_status(struct req *r, unsigned status);
/* Answers r 503: too many fetches are waiting. */
enum MHD_Result send_busy(struct req *r);
/* Adds the Content-Range of r's range of m to resp. */
void add_content_range(struct MHD_Response *resp, const struct req *r, const gfs_meta *m);

/* guard.c: the slow-client guard */

/* Writes sa's numeric address to out; false when it is neither IPv4 nor IPv6. */
bool addr_text(const struct sockaddr *sa, char out[INET6_ADDRSTRLEN]);
/* Counts one more connection for the address key; false when it is at the limit. */
bool admit_address(struct httpserve *srv, const char *key);
/* Counts one connection of the address key fewer; the caller holds guard_mu. */
void release_address(struct httpserve *srv, const char *key);
/* Lists conn's state cs for the guard, its header deadline starting now. */
void guard_track(struct httpserve *srv, struct MHD_Connection *conn, struct conn_state *cs);
/* Unlists cs (its connection is closing) and releases its address. */
void guard_untrack(struct httpserve *srv, struct conn_state *cs);
/* conn's request line and headers are in: its header deadline stops. */
void header_arrived(struct MHD_Connection *conn);
/* conn's next request is due: its header deadline starts (after the idle timeout). */
void header_due(struct httpserve *srv, struct MHD_Connection *conn);
/* The guard thread (arg: srv): shuts late connections, closes evicted tier entries. */
void *guard_main(void *arg);
/* conn has begun its first request: it no longer counts as unanswered. */
void note_request(struct httpserve *srv, struct MHD_Connection *conn);

/* stream.c: streaming a large file chunk by chunk */

/* r's stream of m (r's range of it, else all of it), referenced twice: r's and its producer's. */
struct stream *stream_new(struct req *r, const gfs_meta *m);
/* Drops a reference to s; the last frees it. */
void stream_unref(struct stream *s);
/* libmicrohttpd's free callback for a stream's response: cancels and unreferences it. */
void stream_free_cb(void *cls);
/* Answers r with its stream, once its first window arrived (or the status it failed with). */
enum MHD_Result send_stream(struct req *r);
/* Marks s ended (ok: every byte pushed) and wakes its reader. */
void stream_finish(struct stream *s, bool ok);
/* Sets t up for s: a digest when s is all of m, a disk-tier fill when there is a tier. */
void tee_begin(struct httpserve *srv, const gfs_meta *m, const struct stream *s, struct tee *t);
/* After the last chunk: false (counted, err set) when a whole stream's digest fails. */
bool tee_check(struct httpserve *srv, const struct job *j, struct tee *t, gfs_error *err);
/* Pushes the held-back last bytes to s; false when s was cancelled. */
bool tee_release(struct stream *s, struct tee *t);
/* Ends t: commits the tier fill when the digest checked and ok, else aborts it. */
void tee_end(struct tee *t, bool ok);
/* Pushes chunks w0..w1 of m to s (*next: the one reached); false and err on failure. */
bool stream_window(gfs_session *ses, const gfs_meta *m, struct stream *s, struct tee *tee,
                   int64_t w0, int64_t w1, int64_t *next, gfs_error *err);
/* When m's revision is gone, says in err that its stream was cut off after sent bytes. */
void explain_cut_off(gfs_session *ses, const gfs_meta *m, int64_t sent, int64_t total,
                     gfs_error *err);
/* Cuts s off for failing the integrity rule after sent bytes, and says so in err. */
void cut_damaged(struct stream *s, int64_t sent, gfs_error *err);

/* jobs.c: the job queue and the workers */

/* Joins r to a job like proto in flight, or queues proto; suspends r (503 when full). */
enum MHD_Result wait_for_job(struct req *r, struct job *proto);
/* Reads m's body on a worker into the cache, r waiting suspended. */
enum MHD_Result start_fetch(struct req *r, gfs_meta *m);
/* Looks a name (rev) or an id (id_key) up on a worker, r waiting suspended. */
enum MHD_Result start_lookup(struct req *r, const char *name, int rev, const char *id_key,
                             const char *key);
/* Starts streaming m (r's range of it) on a worker, r waiting for the first window. */
enum MHD_Result start_stream(struct req *r, gfs_meta *m);
/* Puts b in the memory cache as m's body; the entry returned is referenced (or NULL). */
http_cache_entry *memcache_insert(struct httpserve *srv, gfs_meta *m, http_cache_body *b);
/* A worker thread (arg: srv): runs jobs on a backend session of its own until stopping. */
void *worker_main(void *arg);

/* preload.c: the name index's upkeep and --preload */

/* The poller thread (arg: srv): keeps the name index current, giving way as the backend slows. */
void *poller_main(void *arg);
/* The --preload thread (arg: srv): fills the memory cache in one pass over the chunks. */
void *preload_main(void *arg);

/* metrics.c: the metrics page and the access log */

/* Writes r's line, answered status, to the access log (combined format). */
void write_access_log(struct httpserve *srv, struct req *r, unsigned status);
/* Answers r with the Prometheus text of srv's metrics. */
enum MHD_Result serve_metrics(struct req *r);

/* requests.c: a request from its URI to its answer */

/* libmicrohttpd's request handler: routes, and answers or hands the request to a job. */
enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                           const char *method, const char *version, const char *upload_data,
                           size_t *upload_data_size, void **req_cls);
/* libmicrohttpd's first call for a request: makes its struct req and counts it active. */
void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn);
/* libmicrohttpd's last call for a request: counts and logs it, frees its struct req. */
void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                  enum MHD_RequestTerminationCode toe);

#endif
