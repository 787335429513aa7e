/*
 * The HTTP server: libmicrohttpd event threads answer from the index and
 * the cache; everything that needs the backend runs on worker threads
 * while the connection is suspended, so an event thread never waits on
 * MongoDB.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "acceptor.h"
#include "httpcache.h"
#include "disktier.h"
#include "httpserve.h"
#include "httputil.h"
#include "nameindex.h"
#include "names.h"
#include "strmap.h"

#define STREAM_BUFFER_BYTES (1024 * 1024)  /* read ahead of a streaming client */
#define STREAM_BLOCK 65536
#define NBUCKETS 13
#define MAX_DAEMONS 64
#define LISTEN_BACKLOG 4096
#define OPEN_ENTRIES_MAX 16384  /* tier entries kept open */
#define SEEN_BITS 65536         /* the open entries' admission filter */
#define OPEN_GATE_WINDOW 1024   /* requests for the tier a thread counts to judge the open set */
#define OPEN_GATE_REST 15       /* windows it then passes the set by, when the set does not pay */

static const double latency_bounds[NBUCKETS - 1] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                    0.1, 0.25, 0.5, 1, 2.5, 5};

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
	struct job *next;
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

	pthread_mutex_t jobs_mu;
	pthread_cond_t jobs_cv;
	struct job *qhead, *qtail;
	unsigned queued;
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

static void
logf_(struct httpserve *srv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
logf_(struct httpserve *srv, const char *fmt, ...)
{
	if (!srv->cfg.log)
		return;
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	srv->cfg.log(buf);
}

static char *
xstrdup(const char *s)
{
	return gfs_xstrdup(s ? s : "");
}

static int64_t
mono_us(void)
{
	return (int64_t)(gfs_mono_seconds() * 1e6);
}

/* ---- responses ------------------------------------------------------- */

/* libmicrohttpd makes no response only when memory runs out; give up then, as gfs_xcalloc does. */
static struct MHD_Response *
made(struct MHD_Response *r)
{
	if (!r)
		abort();
	return r;
}

static struct MHD_Response *
text_response(const char *body, unsigned status)
{
	struct MHD_Response *r =
	    made(MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT));
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	if (status == MHD_HTTP_SERVICE_UNAVAILABLE)
		MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
	return r;
}

static void
add_file_headers(struct httpserve *srv, struct MHD_Response *r, const gfs_meta *m, bool body)
{
	if (body)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, m->content_type);
	MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, m->etag);
	MHD_add_response_header(r, MHD_HTTP_HEADER_LAST_MODIFIED, m->last_modified);
	MHD_add_response_header(r, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
	if (srv->cfg.cache_control)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, srv->cfg.cache_control);
}

/* The whole-file 200 response a cache entry keeps; it holds a reference to body. */
static struct MHD_Response *
body_response(struct httpserve *srv, const gfs_meta *m, http_cache_body *b)
{
	struct MHD_Response *r = made(MHD_create_response_from_buffer_with_free_callback_cls(
	    b->len, b->data, http_cache_body_release_cb, http_cache_body_ref(b)));
	add_file_headers(srv, r, m, true);
	return r;
}

static enum MHD_Result
queue(struct req *r, unsigned status, struct MHD_Response *resp, uint64_t body_bytes)
{
	r->status = status;
	r->body_bytes = r->head ? 0 : body_bytes;
	return MHD_queue_response(r->conn, status, resp);
}

/* Queues a response made for this request only, and drops our reference to it. */
static enum MHD_Result
queue_once(struct req *r, unsigned status, struct MHD_Response *resp, uint64_t body_bytes)
{
	if (!resp)
		return MHD_NO;
	enum MHD_Result ret = queue(r, status, resp, body_bytes);
	MHD_destroy_response(resp);
	return ret;
}

static const char body400[] = "400 Bad Request\n", body404[] = "404 Not Found\n",
                  body405[] = "405 Method Not Allowed\n", body500[] = "500 Internal Server Error\n",
                  body503[] = "503 Service Unavailable\n",
                  body503busy[] = "503 Service Unavailable: too many fetches waiting\n";

static enum MHD_Result
send_status(struct req *r, unsigned status)
{
	struct httpserve *srv = r->srv;
	switch (status) {
	case 400: return queue(r, status, srv->r400, sizeof body400 - 1);
	case 404: return queue(r, status, srv->r404, sizeof body404 - 1);
	case 405: return queue(r, status, srv->r405, sizeof body405 - 1);
	case 503: return queue(r, status, srv->r503, sizeof body503 - 1);
	default: return queue(r, 500, srv->r500, sizeof body500 - 1);
	}
}

static enum MHD_Result
send_busy(struct req *r)
{
	atomic_fetch_add(&r->srv->queue_full, 1);
	return queue(r, 503, r->srv->r503busy, sizeof body503busy - 1);
}

static enum MHD_Result
not_modified(struct req *r, const gfs_meta *m)
{
	struct MHD_Response *resp =
	    made(MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT));
	add_file_headers(r->srv, resp, m, false);
	return queue_once(r, MHD_HTTP_NOT_MODIFIED, resp, 0);
}

static enum MHD_Result
not_satisfiable(struct req *r, const gfs_meta *m)
{
	char cr[64];
	snprintf(cr, sizeof cr, "bytes */%lld", (long long)m->length);
	struct MHD_Response *resp =
	    made(MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT));
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
	add_file_headers(r->srv, resp, m, false);
	return queue_once(r, MHD_HTTP_RANGE_NOT_SATISFIABLE, resp, 0);
}

static void
add_content_range(struct MHD_Response *resp, const struct req *r, const gfs_meta *m)
{
	char cr[96];
	snprintf(cr, sizeof cr, "bytes %lld-%lld/%lld", (long long)r->first, (long long)r->last,
	         (long long)m->length);
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
}

static enum MHD_Result
send_entry(struct req *r)
{
	http_cache_entry *e = r->entry;
	gfs_meta *m = e->user;
	if (!r->range)
		return queue(r, MHD_HTTP_OK, e->resp, e->body->len);
	/* The range was checked against r->meta; the cache key ties both to one length. */
	if (r->last >= (int64_t)e->body->len)
		return send_status(r, 500);
	size_t len = (size_t)(r->last - r->first + 1);
	struct MHD_Response *resp = made(MHD_create_response_from_buffer_with_free_callback_cls(
	    len, e->body->data + r->first, http_cache_body_release_cb,
	    http_cache_body_ref(e->body)));
	add_file_headers(r->srv, resp, m, true);
	add_content_range(resp, r, m);
	return queue_once(r, MHD_HTTP_PARTIAL_CONTENT, resp, len);
}

static ssize_t
no_body(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)cls;
	(void)pos;
	(void)buf;
	(void)max;
	return MHD_CONTENT_READER_END_WITH_ERROR;
}

/*
 * libmicrohttpd 0.9.75 sends a descriptor response's headers by themselves,
 * pushed, then the body by sendfile: two segments where one would do, each
 * costing the receiver's path too (on loopback, CPU of this machine). With
 * the socket corked until the response is done (on_completed), they leave
 * together, as nginx's tcp_nopush has them: at c=100 on 52,000 posters,
 * 2.4 segments per request instead of 4.2 and about a fifth less CPU (see
 * docs/benchmarks.md). Without it nothing is lost but that, so a failure
 * is not reported.
 */
static void
cork(struct req *r, bool on)
{
	const union MHD_ConnectionInfo *ci =
	    MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	int v = on;
	if (ci && setsockopt(ci->connect_fd, IPPROTO_TCP, TCP_CORK, &v, sizeof v) == 0)
		r->corked = on;
}

/*
 * A disk tier hit, sent from the descriptor (sendfile), never copied: the
 * response owns fd and closes it when the last connection is done with it.
 */
static enum MHD_Result
send_disk(struct req *r, const gfs_meta *m, int fd)
{
	uint64_t len = r->range ? (uint64_t)(r->last - r->first + 1) : (uint64_t)m->length;
	struct MHD_Response *resp;
	if (len == 0) {
		close(fd);
		resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
	} else if (r->range) {
		resp = MHD_create_response_from_fd_at_offset64(len, fd, (uint64_t)r->first);
	} else {
		resp = MHD_create_response_from_fd64(len, fd);
	}
	if (!resp) {
		if (len)
			close(fd);
		return send_status(r, 500);
	}
	add_file_headers(r->srv, resp, m, true);
	if (r->range)
		add_content_range(resp, r, m);
	if (len)
		cork(r, true);
	return queue_once(r, r->range ? MHD_HTTP_PARTIAL_CONTENT : MHD_HTTP_OK, resp, len);
}

/*
 * Keeps tier entries open with a prebuilt 200 response each, as nginx's
 * open_file_cache keeps descriptors: a hit then costs no open(2) and no
 * response to build. libmicrohttpd sends one descriptor to any number of
 * connections at once (sendfile with an explicit offset). An entry the
 * tier evicted meanwhile is dropped, so that its disk space is freed
 * (close_evicted lets go of those not asked for again), and so is one
 * whose file changed since the tier proved it (see disktier.h). The
 * entry's body is a struct kept: the descriptor, for the tier's fstat, and
 * the tier's name for it, so that a hit computes none.
 */
struct kept {
	int fd;                         /* the response's; -1 for an empty file */
	char name[DISKTIER_NAME_MAX];
};

static http_cache_entry *
open_kept(struct httpserve *srv, gfs_meta *m)
{
	http_cache_entry *e = http_cache_get(srv->open, m->cache_key);
	if (!e)
		return NULL;
	const struct kept *k = (const struct kept *)(const void *)e->body->data;
	if (disktier_touch(srv->tier, k->name, k->fd))
		return e;
	http_cache_entry_release(srv->open, e);
	http_cache_drop(srv->open, m->cache_key);
	return NULL;
}

/*
 * Whether a tier hit not yet open is worth keeping open: while the set has
 * room, or when the file was asked for before, recently (a bit per key
 * hash, all cleared once as many were set as the set holds). When the
 * files asked for outnumber the set (52,000 posters, 5,000 open), keeping
 * every hit open made each one push another out: a response built and
 * destroyed, a close(2) and the hash and list work on top of the open(2),
 * more CPU per request than a descriptor opened for that request alone
 * (0.036-0.042 ms against 0.031-0.032 with this rule, c=100, see
 * docs/benchmarks.md). A file asked for again soon still gets kept.
 */
static bool
admit(struct httpserve *srv, const char *key)
{
	if (http_cache_has_room(srv->open, 0))
		return true;
	uint64_t h = gfs_fnv1a(key, strlen(key), GFS_FNV1A_BASIS);
	unsigned bit = (unsigned)(h & (SEEN_BITS - 1));
	uint64_t mask = 1ULL << (bit % 64);
	if (atomic_fetch_or(&srv->seen[bit / 64], mask) & mask)
		return true;
	if (atomic_fetch_add(&srv->seen_marks, 1) + 1 >= srv->seen_window) {
		atomic_store(&srv->seen_marks, 0);
		for (size_t i = 0; i < SEEN_BITS / 64; i++)
			atomic_store_explicit(&srv->seen[i], 0, memory_order_relaxed);
	}
	return false;
}

/*
 * The open set pays only when most tier hits find their file in it. When
 * the files asked for outnumber it many times (52,000 posters at random,
 * 5,000 kept: a tenth found), the lookup, the admission check and the
 * entries that admission swaps cost more than that tenth saves: at c=2,
 * 10, 100 and 1000, 0.003-0.006 ms more CPU per request than with no set
 * at all (docs/benchmarks.md). So each event thread counts, over a window
 * of requests that reach the tier, how many the full set answered; under half, it
 * passes the set by for the next OPEN_GATE_REST windows, then counts
 * again, so a hot subset that the set could hold is noticed within some
 * 16,000 requests. A set still filling is never judged. The state is the
 * thread's own: no lock and no shared counter per request.
 */
struct open_gate {
	unsigned tries, hits;   /* this window */
	unsigned rest;          /* requests left to pass the set by */
	unsigned bypassed;      /* not yet added to srv->open_bypassed */
};
static _Thread_local struct open_gate gate;

static bool
open_gate_pass(struct httpserve *srv)
{
	if (gate.rest == 0)
		return true;
	gate.rest--;
	if (++gate.bypassed == OPEN_GATE_WINDOW) {
		atomic_fetch_add(&srv->open_bypassed, gate.bypassed);
		gate.bypassed = 0;
	}
	return false;
}

static void
open_gate_note(struct httpserve *srv, bool found)
{
	gate.hits += found;
	if (++gate.tries < OPEN_GATE_WINDOW)
		return;
	if (gate.hits * 2 < gate.tries && !http_cache_has_room(srv->open, 0))
		gate.rest = OPEN_GATE_WINDOW * OPEN_GATE_REST;
	gate.tries = gate.hits = 0;
}

static enum MHD_Result
send_kept(struct req *r, const gfs_meta *m)
{
	if (m->length > 0)
		cork(r, true);
	return queue(r, MHD_HTTP_OK, r->open_entry->resp, (uint64_t)m->length);
}

/* Keeps fd, the tier's entry name, open as m's entry; NULL (fd closed) when no response can be made. */
static http_cache_entry *
keep_open(struct httpserve *srv, gfs_meta *m, int fd, const char *name)
{
	struct MHD_Response *resp;
	if (m->length == 0) {
		close(fd);
		fd = -1;
		resp = made(MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT));
	} else if (!(resp = MHD_create_response_from_fd64((uint64_t)m->length, fd))) {
		close(fd);
		return NULL;
	}
	add_file_headers(srv, resp, m, true);
	struct kept k = {.fd = fd}; /* the response owns fd */
	snprintf(k.name, sizeof k.name, "%s", name);
	http_cache_body *b = http_cache_body_new(sizeof k);
	memcpy(b->data, &k, sizeof k);
	http_cache_entry *e = http_cache_put(srv->open, m->cache_key, b, resp, gfs_meta_ref(m));
	http_cache_body_unref(b);
	return e;
}

/* HEAD of a file not in the cache: the headers need only the metadata. */
static enum MHD_Result
send_head(struct req *r, const gfs_meta *m)
{
	struct MHD_Response *resp =
	    made(MHD_create_response_from_callback((uint64_t)m->length, 4096, no_body, NULL, NULL));
	add_file_headers(r->srv, resp, m, true);
	return queue_once(r, MHD_HTTP_OK, resp, 0);
}

/* ---- jobs ------------------------------------------------------------ */

static void stream_unref(struct stream *s);

static void
job_free(struct job *j)
{
	if (j->stream)
		stream_unref(j->stream);
	free(j->key);
	free(j->name);
	free(j->id_key);
	free(j->request);
	gfs_meta_unref(j->meta);
	free(j);
}

/* Called with jobs_mu held. */
static void
enqueue(struct httpserve *srv, struct job *j)
{
	if (srv->qtail)
		srv->qtail->next = j;
	else
		srv->qhead = j;
	srv->qtail = j;
	srv->queued++;
	pthread_cond_signal(&srv->jobs_cv);
}

/*
 * Attaches r to the job for key, starting one when none is in flight, and
 * suspends the connection. Suspension happens under jobs_mu so that the
 * worker's resume can only come after it.
 */
static enum MHD_Result
wait_for_job(struct req *r, struct job *proto)
{
	struct httpserve *srv = r->srv;
	pthread_mutex_lock(&srv->jobs_mu);
	struct job *j = proto->key ? strmap_get(srv->inflight, proto->key) : NULL;
	if (!j && (srv->stopping || srv->queued >= srv->cfg.queue_max)) {
		bool stopping = srv->stopping;
		pthread_mutex_unlock(&srv->jobs_mu);
		job_free(proto);
		return stopping ? send_status(r, 503) : send_busy(r);
	}
	if (j) {
		atomic_fetch_add(&srv->coalesced, 1);
		job_free(proto);
	} else {
		j = proto;
		if (j->key)
			strmap_put(srv->inflight, j->key, j);
		enqueue(srv, j);
	}
	r->next_waiter = j->waiters;
	j->waiters = r;
	r->phase = PHASE_WAITING;
	MHD_suspend_connection(r->conn);
	pthread_mutex_unlock(&srv->jobs_mu);
	return MHD_YES;
}

static enum MHD_Result
start_fetch(struct req *r, gfs_meta *m)
{
	struct job *j = gfs_xcalloc(1, sizeof *j);
	j->kind = JOB_FETCH;
	j->meta = gfs_meta_ref(m);
	size_t n = strlen(m->cache_key) + 3;
	j->key = gfs_xmalloc(n);
	snprintf(j->key, n, "F:%s", m->cache_key);
	return wait_for_job(r, j);
}

static enum MHD_Result
start_lookup(struct req *r, const char *name, int rev, const char *id_key, const char *key)
{
	struct job *j = gfs_xcalloc(1, sizeof *j);
	j->kind = JOB_LOOKUP;
	j->key = xstrdup(key);
	j->name = name ? xstrdup(name) : NULL;
	j->rev = rev;
	j->id_key = id_key ? xstrdup(id_key) : NULL;
	return wait_for_job(r, j);
}

/* ---- streaming ------------------------------------------------------- */

static void
stream_unref(struct stream *s)
{
	if (atomic_fetch_sub(&s->refs, 1) != 1)
		return;
	while (s->head) {
		struct sbuf *b = s->head;
		s->head = b->next;
		free(b);
	}
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s);
}

/* Called with s->mu held: wakes the connection if it waits for data. */
static void
stream_wake(struct stream *s)
{
	if (s->suspended) {
		s->suspended = false;
		MHD_resume_connection(s->conn);
	}
}

static ssize_t
stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	struct stream *s = cls;
	pthread_mutex_lock(&s->mu);
	ssize_t ret;
	if (s->head) {
		size_t n = 0;
		while (s->head && n < max) {
			struct sbuf *b = s->head;
			size_t take = b->len - b->off < max - n ? b->len - b->off : max - n;
			memcpy(buf + n, b->data + b->off, take);
			n += take;
			b->off += take;
			s->queued -= take;
			if (b->off == b->len) {
				s->head = b->next;
				if (!s->head)
					s->tail = NULL;
				free(b);
			}
		}
		pthread_cond_signal(&s->cv);
		ret = (ssize_t)n;
	} else if (s->failed || s->cancelled) {
		ret = MHD_CONTENT_READER_END_WITH_ERROR;
	} else if (s->done) {
		ret = MHD_CONTENT_READER_END_OF_STREAM;
	} else {
		/* Nothing yet: park the connection until the producer has some. */
		s->suspended = true;
		MHD_suspend_connection(s->conn);
		ret = 0;
	}
	pthread_mutex_unlock(&s->mu);
	return ret;
}

static void
stream_free_cb(void *cls)
{
	struct stream *s = cls;
	pthread_mutex_lock(&s->mu);
	s->cancelled = true;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	stream_unref(s);
}

/*
 * The stream's producer runs on a worker while the connection waits, as a
 * fetch's does: its status is sent only once the first window is read, so
 * that a backend that cannot answer gets a 503, not a 200 cut off.
 */
static enum MHD_Result
start_stream(struct req *r, gfs_meta *m)
{
	struct stream *s = gfs_xcalloc(1, sizeof *s);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	atomic_init(&s->refs, 2); /* the request's (then its response's) and the producer's */
	s->conn = r->conn;
	s->stopping = &r->srv->stopping;
	s->first = r->range ? r->first : 0;
	s->last = r->range ? r->last : m->length - 1;
	r->stream = s;

	struct job *j = gfs_xcalloc(1, sizeof *j);
	j->kind = JOB_STREAM;
	j->meta = gfs_meta_ref(m);
	j->stream = s;
	j->request = gfs_xasprintf("%s %.*s", r->method, (int)r->target_len, (const char *)r->target);
	return wait_for_job(r, j);
}

/* Called once the first window is in: the response takes the request's reference. */
static enum MHD_Result
send_stream(struct req *r)
{
	struct stream *s = r->stream;
	r->stream = NULL;
	if (r->fetch_status != 200 || !r->meta) {
		stream_free_cb(s);
		return send_status(r, r->fetch_status ? r->fetch_status : 500);
	}
	uint64_t len = (uint64_t)(s->last - s->first + 1);
	atomic_fetch_add(&s->refs, 1);
	r->sent = s;
	struct MHD_Response *resp =
	    made(MHD_create_response_from_callback(len, STREAM_BLOCK, stream_read, s, stream_free_cb));
	add_file_headers(r->srv, resp, r->meta, true);
	if (r->range) {
		add_content_range(resp, r, r->meta);
		/* Only the chunks in range are read: their numbering and sizes are all that was checked. */
		if (s->first != 0 || s->last != r->meta->length - 1)
			MHD_add_response_header(resp, "Gridfsctl-Checked", "chunks");
		return queue_once(r, MHD_HTTP_PARTIAL_CONTENT, resp, len);
	}
	return queue_once(r, MHD_HTTP_OK, resp, len);
}

/* Pushes data to the stream, waiting while the client is behind; false when it went away. */
static bool
stream_push(struct stream *s, const uint8_t *data, size_t len)
{
	struct sbuf *b = gfs_xmalloc(sizeof *b + len);
	memcpy(b->data, data, len);
	b->len = len;
	b->off = 0;
	b->next = NULL;
	pthread_mutex_lock(&s->mu);
	/* Timed, so that a client that stopped reading cannot hold a worker past shutdown. */
	while (s->queued >= STREAM_BUFFER_BYTES && !s->cancelled && !atomic_load(s->stopping)) {
		struct timespec ts;
		gfs_deadline_in(&ts, 200);
		pthread_cond_timedwait(&s->cv, &s->mu, &ts);
	}
	bool ok = !s->cancelled && !atomic_load(s->stopping);
	if (ok) {
		if (s->tail)
			s->tail->next = b;
		else
			s->head = b;
		s->tail = b;
		s->queued += len;
		stream_wake(s);
	} else {
		free(b);
	}
	pthread_mutex_unlock(&s->mu);
	return ok;
}

static void
stream_finish(struct stream *s, bool ok)
{
	pthread_mutex_lock(&s->mu);
	if (ok)
		s->done = true;
	else
		s->failed = true;
	stream_wake(s);
	pthread_mutex_unlock(&s->mu);
	stream_unref(s);
}

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

static void
tee_begin(struct httpserve *srv, const gfs_meta *m, const struct stream *s, struct tee *t)
{
	memset(t, 0, sizeof *t);
	if (s->first != 0 || s->last != m->length - 1)
		return;
	gfs_file f;
	gfs_meta_file(m, &f);
	t->digest = gfs_digest_new(&f);
	if (srv->tier)
		t->fill = disktier_fill_begin(srv->tier, m);
}

/* Passes a chunk's bytes in range on to the client, holding back the last of a whole stream. */
static bool
tee_push(struct stream *s, struct tee *t, const uint8_t *data, size_t len, bool last)
{
	if (!t->digest || !last)
		return stream_push(s, data, len);
	t->held = gfs_xmalloc(len ? len : 1);
	memcpy(t->held, data, len);
	t->held_len = len;
	return true;
}

static void
tee_data(struct tee *t, const uint8_t *data, size_t len)
{
	if (t->digest)
		gfs_digest_update(t->digest, data, len);
	if (t->fill)
		disktier_fill_write(t->fill, data, len);
}

/*
 * After the last chunk: false, with err naming the request and the file,
 * when a whole stream's content fails the integrity rule; counted.
 */
static bool
tee_check(struct httpserve *srv, const struct job *j, struct tee *t, gfs_error *err)
{
	if (!t->digest)
		return true;
	gfs_file f;
	gfs_meta_file(j->meta, &f);
	gfs_error cerr;
	t->checked = gfs_digest_check(t->digest, &f, NULL, &cerr);
	t->digest = NULL;
	if (t->checked)
		return true;
	atomic_fetch_add(&srv->integrity_failures, 1);
	gfs_error_set(err, GFS_ECHECKSUM, "%s: %s", j->request, cerr.msg);
	return false;
}

/* Sends what was held back; the stream's end follows. */
static bool
tee_release(struct stream *s, struct tee *t)
{
	bool ok = !t->held || stream_push(s, t->held, t->held_len);
	free(t->held);
	t->held = NULL;
	return ok;
}

static void
tee_end(struct tee *t, bool ok)
{
	free(t->held);
	if (t->digest) {
		char sha[65], md5[33];
		gfs_digest_final(t->digest, sha, md5);
	}
	if (!t->fill)
		return;
	if (t->checked && ok)
		disktier_fill_commit(t->fill);
	else
		disktier_fill_abort(t->fill);
	t->fill = NULL;
}

/* Checks chunk n as gfs_read does and pushes its bytes in range. */
static bool
stream_chunk(const gfs_meta *m, struct stream *s, struct tee *tee, const bson_t *doc, int64_t n,
             const char *name, gfs_error *err)
{
	uint32_t len;
	const uint8_t *data;
	if (!gfs_chunk_data(doc, m->length, m->chunk_size, n, name, &data, &len, err))
		return false;
	tee_data(tee, data, len);
	int64_t base = n * m->chunk_size;
	int64_t from = s->first > base ? s->first - base : 0;
	int64_t to = s->last < base + len - 1 ? s->last - base : (int64_t)len - 1;
	if (!tee_push(s, tee, data + from, (size_t)(to - from + 1), base + to == s->last)) {
		gfs_error_set(err, GFS_ECANCELED, "%s: client went away", name);
		return false;
	}
	return true;
}

/*
 * Reads chunks w0..w1 in order, each by {files_id, n} equality (no range,
 * no sort), checking them as gfs_read does, and pushes the bytes in range;
 * *next is the chunk wanted next.
 */
static bool
stream_window(gfs_session *ses, const gfs_meta *m, struct stream *s, struct tee *tee, int64_t w0,
              int64_t w1, int64_t *next, gfs_error *err)
{
	const char *name = m->name ? m->name : m->key;
	for (*next = w0; *next <= w1; (*next)++) {
		bson_t *doc;
		int rc = gfs_chunk_by_n(ses, &m->id, *next, name, &doc, err);
		if (rc == 0)
			gfs_error_set(err, GFS_EMISSINGCHUNK, "%s: missing chunk n=%lld", name,
			              (long long)*next);
		if (rc <= 0)
			return false;
		bool ok = stream_chunk(m, s, tee, doc, *next, name, err);
		bson_destroy(doc);
		if (!ok)
			return false;
	}
	return true;
}

/*
 * A chunk went missing mid-stream. When the revision itself is gone (a new
 * one replaced it and the old was removed), say so: the client has been
 * promised Content-Length bytes and gets fewer, the connection cut short.
 */
static void
explain_cut_off(gfs_session *ses, const gfs_meta *m, int64_t sent, int64_t total, gfs_error *err)
{
	gfs_file f;
	gfs_error ferr;
	gfs_error_clear(&ferr);
	if (gfs_find_by_id(ses, &m->id, &f, &ferr)) {
		gfs_file_free(&f);
		return; /* still there: damage, reported as it is */
	}
	if (ferr.code != GFS_ENOTFOUND)
		return;
	gfs_error_set(err, GFS_EMISSINGCHUNK,
	              "%s: revision removed while streaming; connection cut off after %lld of %lld bytes",
	              m->name ? m->name : m->key, (long long)sent, (long long)total);
}

/*
 * A whole stream's content failed the integrity rule after its 200 went:
 * the bytes held back are never sent, the connection is cut short (as for
 * a removed revision), and the request is recorded as 500.
 */
static void
cut_damaged(struct stream *s, int64_t sent, gfs_error *err)
{
	pthread_mutex_lock(&s->mu);
	s->damaged = true;
	pthread_mutex_unlock(&s->mu);
	size_t n = strlen(err->msg);
	snprintf(err->msg + n, sizeof err->msg - n, "; connection cut off after %lld of %lld bytes",
	         (long long)sent, (long long)(s->last - s->first + 1));
}

/* ---- worker side ----------------------------------------------------- */

static void
observe_latency(struct httpserve *srv, int64_t us)
{
	double s = (double)us / 1e6;
	int b = 0;
	while (b < NBUCKETS - 1 && s > latency_bounds[b])
		b++;
	atomic_fetch_add(&srv->latency_bucket[b], 1);
	atomic_fetch_add(&srv->latency_count, 1);
	atomic_fetch_add(&srv->latency_sum_us, (uint64_t)us);
}

/* Maps a backend failure to a status, and remembers an unreachable backend. */
static unsigned
status_for(struct httpserve *srv, const gfs_error *err)
{
	switch (err->code) {
	case GFS_ENOTFOUND:
	case GFS_ENOREVISION:
		return 404;
	case GFS_EBACKEND:
		if (!atomic_exchange(&srv->backend_down, true))
			logf_(srv, "backend unreachable, answering 503 for files not in the cache: %s", err->msg);
		return 503;
	case GFS_ECANCELED:
		return 503;
	default:
		logf_(srv, "%s", err->msg);
		return 500;
	}
}

/* The status for a failed read of m, before anything of it was sent. */
static unsigned
read_failure_status(struct httpserve *srv, gfs_session *ses, const gfs_meta *m,
                    const gfs_error *err)
{
	if (err->code == GFS_EBACKEND)
		return status_for(srv, err);
	/* A revision removed since the index saw it: its files document goes first. */
	gfs_file probe;
	gfs_error perr;
	gfs_error_clear(&perr);
	if (gfs_find_by_id(ses, &m->id, &probe, &perr))
		gfs_file_free(&probe);
	else if (perr.code == GFS_ENOTFOUND)
		return 404;
	return status_for(srv, err);
}

struct copy_state {
	http_cache_body *b;
	size_t off;
};

static bool
copy_chunk(const uint8_t *data, size_t len, void *ctx)
{
	struct copy_state *c = ctx;
	if (len > c->b->len - c->off)
		return false;
	memcpy(c->b->data + c->off, data, len);
	c->off += len;
	return true;
}

static http_cache_entry *
memcache_insert(struct httpserve *srv, gfs_meta *m, http_cache_body *b)
{
	struct MHD_Response *resp = body_response(srv, m, b);
	return http_cache_put(srv->cache, m->cache_key, b, resp, gfs_meta_ref(m));
}

/* Reads a whole file into the cache; on failure returns NULL and the status to answer. */
static http_cache_entry *
fetch_body(struct httpserve *srv, gfs_session *ses, gfs_meta *m, unsigned *status, bool *fresh)
{
	http_cache_entry *e = http_cache_peek(srv->cache, m->cache_key);
	if (e) {
		*status = 200;
		return e;
	}
	atomic_fetch_add(&srv->backend_reads, 1);
	gfs_file f;
	gfs_meta_file(m, &f);
	http_cache_body *b = http_cache_body_new((size_t)m->length);
	struct copy_state cs = {b, 0};
	gfs_error err;
	gfs_error_clear(&err);
	int64_t t0 = mono_us();
	bool ok = gfs_read(ses, &f, true, copy_chunk, &cs, NULL, &err);
	observe_latency(srv, mono_us() - t0);
	if (!ok || cs.off != b->len) {
		http_cache_body_unref(b);
		if (ok)
			gfs_error_set(&err, GFS_EWRONGSIZE, "%s: short read", m->key);
		if (err.code == GFS_ECHECKSUM)
			atomic_fetch_add(&srv->integrity_failures, 1);
		*status = read_failure_status(srv, ses, m, &err);
		return NULL;
	}
	*status = 200;
	*fresh = true;
	e = memcache_insert(srv, m, b);
	http_cache_body_unref(b);
	return e;
}

static bool
under_prefix(struct httpserve *srv, const char *name)
{
	return !srv->prefix[0] || (name && gfs_prefix_strip(srv->prefix, name));
}

static void
run_lookup(struct httpserve *srv, gfs_session *ses, struct job *j)
{
	gfs_file f;
	gfs_error err;
	gfs_error_clear(&err);
	bool ok;
	int64_t t0 = mono_us();
	if (j->name) {
		ok = gfs_find_by_name(ses, j->name, j->rev, &f, &err);
	} else {
		bson_value_t id;
		gfs_id_parse_oid(j->id_key, &id);
		ok = gfs_find_by_id(ses, &id, &f, &err);
	}
	observe_latency(srv, mono_us() - t0);
	if (ok && !under_prefix(srv, f.filename)) {
		gfs_file_free(&f);
		ok = false;
		gfs_error_set(&err, GFS_ENOTFOUND, "not under the prefix");
	}
	if (!ok) {
		j->status = status_for(srv, &err);
		if (j->status == 404)
			http_cache_neg_put(srv->cache, j->key, gfs_now_ms() + srv->cfg.neg_ttl_ms);
		return;
	}
	j->meta = gfs_meta_from_file(&f);
	gfs_file_free(&f);
	j->status = 200;
	/* On disk already: the resumed request sends it from there. */
	if ((size_t)j->meta->length <= srv->cfg.stream_threshold &&
	    !(srv->tier && disktier_has(srv->tier, j->meta)))
		j->entry = fetch_body(srv, ses, j->meta, &j->status, &j->fresh);
}

/* Hands the job's outcome to every waiting request and resumes them. */
static void
resume_waiters(struct httpserve *srv, struct job *j)
{
	pthread_mutex_lock(&srv->jobs_mu);
	if (j->key)
		strmap_del(srv->inflight, j->key);
	struct req *next;
	for (struct req *r = j->waiters; r; r = next) {
		next = r->next_waiter; /* once resumed, r may be finished and freed at any time */
		r->fetch_status = j->status;
		if (!r->meta && j->meta)
			r->meta = gfs_meta_ref(j->meta);
		if (j->entry)
			r->entry = http_cache_entry_ref(j->entry);
		r->phase = PHASE_RESUMED;
		MHD_resume_connection(r->conn);
	}
	j->waiters = NULL;
	pthread_mutex_unlock(&srv->jobs_mu);
}

/* The disk tier's writer takes a reference to the body and writes it later. */
static void
finish_job(struct httpserve *srv, struct job *j)
{
	resume_waiters(srv, j);
	if (j->entry && j->fresh && srv->tier)
		disktier_put_async(srv->tier, j->meta, j->entry->body->data, j->entry->body->len,
		                   http_cache_body_release_cb, http_cache_body_ref(j->entry->body));
	if (j->entry)
		http_cache_entry_release(srv->cache, j->entry);
	job_free(j);
}

/*
 * The first window is what the read-ahead buffer holds, so that it is read
 * whole, without waiting for the client, before the status is sent.
 */
static int64_t
first_window(int32_t chunk_size)
{
	int64_t per = gfs_chunk_batch_size(chunk_size);
	int64_t fit = chunk_size > 0 ? STREAM_BUFFER_BYTES / chunk_size : 1;
	return fit < 1 ? 1 : fit < per ? fit : per;
}

/*
 * Streams chunks first/chunk_size .. last/chunk_size, one batch per query:
 * a cursor left open across batches may or may not see chunks removed
 * after it opened (MongoDB does, a snapshot does not), and a fresh query
 * per batch makes a revision removed mid-stream show the same everywhere.
 * A failure in the first window (a whole stream's digest too, when the
 * file fits in it) is answered with a status, as a fetch's is; after it
 * the client has its 200 and sees the connection cut short.
 */
static bool
stream_chunks(struct httpserve *srv, gfs_session *ses, struct job *j, struct tee *tee)
{
	const gfs_meta *m = j->meta;
	struct stream *s = j->stream;
	gfs_error err;
	gfs_error_clear(&err);
	int64_t n0 = s->first / m->chunk_size, n1 = s->last / m->chunk_size;
	int64_t per = first_window(m->chunk_size), next = n0;
	for (int64_t w0 = n0, w1; w0 <= n1; w0 = w1 + 1) {
		w1 = w0 + per - 1 < n1 ? w0 + per - 1 : n1;
		bool ok = stream_window(ses, m, s, tee, w0, w1, &next, &err);
		if (ok && w1 == n1)
			ok = tee_check(srv, j, tee, &err);
		if (w0 == n0) {
			j->status = ok ? 200 : read_failure_status(srv, ses, m, &err);
			resume_waiters(srv, j);
			per = gfs_chunk_batch_size(m->chunk_size);
		} else if (!ok && err.code != GFS_ECANCELED) {
			int64_t upto = next * m->chunk_size < s->last + 1 ? next * m->chunk_size : s->last + 1;
			int64_t sent = upto - s->first - (int64_t)tee->held_len;
			if (err.code == GFS_EMISSINGCHUNK)
				explain_cut_off(ses, m, sent, s->last - s->first + 1, &err);
			if (err.code == GFS_ECHECKSUM)
				cut_damaged(s, sent, &err);
			(void)status_for(srv, &err);
		}
		if (!ok)
			return false;
	}
	return tee_release(s, tee);
}

static void
run_stream(struct httpserve *srv, gfs_session *ses, struct job *j)
{
	j->status = 200;
	atomic_fetch_add(&srv->backend_reads, 1);
	struct tee tee;
	tee_begin(srv, j->meta, j->stream, &tee);
	bool ok = j->meta->length <= 0 || stream_chunks(srv, ses, j, &tee);
	stream_finish(j->stream, ok);
	tee_end(&tee, ok);
	j->stream = NULL;
}

static void
run_job(struct httpserve *srv, gfs_session *ses, struct job *j, bool stopping)
{
	if (stopping) {
		j->status = 503;
		if (j->stream)
			stream_finish(j->stream, false);
		j->stream = NULL;
	} else if (j->kind == JOB_FETCH) {
		j->entry = fetch_body(srv, ses, j->meta, &j->status, &j->fresh);
	} else if (j->kind == JOB_LOOKUP) {
		run_lookup(srv, ses, j);
	} else {
		run_stream(srv, ses, j);
	}
	finish_job(srv, j);
}

static void *
worker_main(void *arg)
{
	struct httpserve *srv = arg;
	gfs_session *ses = gfs_session_pop(srv->conn);
	for (;;) {
		pthread_mutex_lock(&srv->jobs_mu);
		while (!srv->qhead && !srv->stopping)
			pthread_cond_wait(&srv->jobs_cv, &srv->jobs_mu);
		struct job *j = srv->qhead;
		if (!j) {
			pthread_mutex_unlock(&srv->jobs_mu);
			break;
		}
		srv->qhead = j->next;
		if (!srv->qhead)
			srv->qtail = NULL;
		srv->queued--;
		bool stopping = srv->stopping;
		pthread_mutex_unlock(&srv->jobs_mu);
		run_job(srv, ses, j, stopping);
	}
	gfs_session_push(ses);
	return NULL;
}

/* ---- request handling ------------------------------------------------ */

static const char *
header(struct req *r, const char *name)
{
	return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

/* Sends the body of m: from the cache, from the disk tier, streamed, or after a fetch. */
static enum MHD_Result
serve_body(struct req *r, gfs_meta *m)
{
	struct httpserve *srv = r->srv;
	if (!r->entry)
		r->entry = http_cache_get(srv->cache, m->cache_key);
	if (r->entry)
		return send_entry(r);
	if (r->head && !r->range)
		return send_head(r, m);
	if (srv->tier) {
		bool keep = srv->open && !r->range && open_gate_pass(srv);
		if (keep) {
			r->open_entry = open_kept(srv, m);
			open_gate_note(srv, r->open_entry != NULL);
			if (r->open_entry)
				return send_kept(r, m);
		}
		char name[DISKTIER_NAME_MAX];
		int fd = disktier_get(srv->tier, m, name);
		if (fd >= 0 && !(keep && admit(srv, m->cache_key)))
			return send_disk(r, m, fd);
		if (fd >= 0 && (r->open_entry = keep_open(srv, m, fd, name)))
			return send_kept(r, m);
	}
	if (atomic_load(&srv->backend_down))
		return send_status(r, 503);
	if ((size_t)m->length > srv->cfg.stream_threshold)
		return start_stream(r, m);
	return start_fetch(r, m);
}

/* Conditional requests and ranges, which need only the metadata, then the body. */
static enum MHD_Result
serve_meta(struct req *r, gfs_meta *m)
{
	if (m->bad) {
		logf_(r->srv, "%s: malformed files document: %s", m->name, m->bad);
		return send_status(r, 500);
	}
	const char *inm = header(r, MHD_HTTP_HEADER_IF_NONE_MATCH);
	int64_t lm = m->upload_ms / 1000;
	if (inm) {
		if (http_etag_list_match(inm, m->etag))
			return not_modified(r, m);
	} else {
		const char *ims = header(r, MHD_HTTP_HEADER_IF_MODIFIED_SINCE);
		int64_t t = ims ? http_date_parse(ims) : -1;
		if (t >= 0 && lm <= t)
			return not_modified(r, m);
	}
	const char *rh = r->head ? NULL : header(r, MHD_HTTP_HEADER_RANGE);
	r->range = false;
	if (rh && http_if_range_ok(header(r, MHD_HTTP_HEADER_IF_RANGE), m->etag, lm)) {
		switch (http_range_parse(rh, m->length, &r->first, &r->last)) {
		case HTTP_RANGE_UNSATISFIABLE: return not_satisfiable(r, m);
		case HTTP_RANGE_OK: r->range = true; break;
		case HTTP_RANGE_NONE: break;
		}
	}
	return serve_body(r, m);
}

static enum MHD_Result
after_wait(struct req *r)
{
	if (r->stream)
		return send_stream(r);
	if (r->fetch_status != 200 || !r->meta)
		return send_status(r, r->fetch_status ? r->fetch_status : 500);
	return serve_meta(r, r->meta);
}

static enum MHD_Result
serve_by_id(struct req *r, const char *hex)
{
	struct httpserve *srv = r->srv;
	if (!http_is_oid(hex))
		return send_status(r, 400);
	char key[32];
	snprintf(key, sizeof key, "%.24s", hex);
	for (char *p = key; *p; p++)
		if (*p >= 'A' && *p <= 'F')
			*p = (char)(*p - 'A' + 'a');
	gfs_meta *m = name_index_get_id(srv->index, key);
	if (m) {
		r->meta = m;
		return serve_meta(r, m);
	}
	char lkey[40];
	snprintf(lkey, sizeof lkey, "I:%s", key);
	if (http_cache_neg_has(srv->cache, lkey, gfs_now_ms()))
		return send_status(r, 404);
	if (atomic_load(&srv->backend_down))
		return send_status(r, 503);
	return start_lookup(r, NULL, -1, key, lkey);
}

static enum MHD_Result
serve_by_name(struct req *r, const char *path)
{
	struct httpserve *srv = r->srv;
	const char *revs = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "rev");
	int rev = -1;
	if (revs && !http_parse_rev(revs, &rev))
		return send_status(r, 400);
	if (!*path)
		return send_status(r, 404);
	char buf[1024];
	size_t plen = strlen(srv->prefix), len = strlen(path);
	size_t need = plen + len + 1;
	char *name = need <= sizeof buf ? buf : gfs_xmalloc(need);
	memcpy(name, srv->prefix, plen); /* snprintf here was 1 % of a tier hit's CPU */
	memcpy(name + plen, path, len + 1);
	enum MHD_Result ret;
	if (rev == -1 && name_index_loaded(srv->index)) {
		/* The index is authoritative for newest revisions, within its staleness bound. */
		gfs_meta *m = name_index_get(srv->index, name);
		if (m) {
			r->meta = m;
			ret = serve_meta(r, m);
		} else {
			ret = send_status(r, 404);
		}
	} else {
		size_t klen = need + 24;
		char *lkey = gfs_xmalloc(klen);
		snprintf(lkey, klen, "N:%d:%s", rev, name);
		if (http_cache_neg_has(srv->cache, lkey, gfs_now_ms()))
			ret = send_status(r, 404);
		else if (atomic_load(&srv->backend_down))
			ret = send_status(r, 503);
		else
			ret = start_lookup(r, name, rev, NULL, lkey);
		free(lkey);
	}
	if (name != buf)
		free(name);
	return ret;
}

static enum MHD_Result serve_metrics(struct req *r);
static void header_arrived(struct MHD_Connection *conn);

/* With --preload, a second line says whether the pass is over: see gridfsctl-serve(1). */
static enum MHD_Result
serve_health(struct req *r)
{
	struct httpserve *srv = r->srv;
	bool ok = !atomic_load(&srv->backend_down) && name_index_loaded(srv->index);
	const char *preload = httpserve_preload_word(httpserve_preload_state(srv));
	char body[64];
	int len = snprintf(body, sizeof body, "%s\n%s%s%s", ok ? "ok" : "backend unavailable",
	                   preload ? "preload: " : "", preload ? preload : "", preload ? "\n" : "");
	struct MHD_Response *resp =
	    made(MHD_create_response_from_buffer((size_t)len, body, MHD_RESPMEM_MUST_COPY));
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	return queue_once(r, ok ? 200 : 503, resp, (uint64_t)len);
}

static void
copy_field(char *dst, size_t size, const char *src)
{
	snprintf(dst, size, "%s", src ? src : "-");
}

/*
 * What libmicrohttpd lets through but the name lookup must not see: a NUL
 * (decoded from %00, or raw, which cuts the target short before the
 * version) would truncate the name, and HTTP/1.1 requires Host (RFC 9112
 * 3.2).
 */
static bool
request_well_formed(struct req *r, const char *version)
{
	if (r->bad_target || !version)
		return false;
	/*
	 * libmicrohttpd (0.9.7x) keeps the request line in its read buffer and
	 * ends the target where the version begins; a version further on than
	 * the target's string reaches means a raw NUL inside the target. A
	 * version kept anywhere else is not taken for one.
	 */
	uintptr_t v = (uintptr_t)version, end = r->target + r->target_len + 1;
	if (*version && v > end && v - r->target < r->srv->cfg.conn_memory)
		return false;
	return strcmp(version, MHD_HTTP_VERSION_1_1) != 0 || header(r, MHD_HTTP_HEADER_HOST);
}

static enum MHD_Result
on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
           const char *version, const char *upload_data, size_t *upload_data_size, void **req_cls)
{
	(void)cls;
	(void)upload_data;
	struct req *r = *req_cls;
	if (!r)
		return MHD_NO; /* the URI callback always sets it */
	if (r->phase == PHASE_RESUMED) {
		r->phase = PHASE_NEW;
		return after_wait(r);
	}
	if (!r->handled) {
		r->handled = true;
		header_arrived(conn);
		/* Draining: answer, then let a keep-alive client go instead of holding the drain. */
		if (atomic_load(&r->srv->draining))
			MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 1u);
		copy_field(r->method, sizeof r->method, method);
		copy_field(r->version, sizeof r->version, version);
		if (r->srv->cfg.access_log) {
			const char *ref = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_REFERER);
			const char *ua = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_USER_AGENT);
			r->referer = ref ? xstrdup(ref) : NULL;
			r->agent = ua ? xstrdup(ua) : NULL;
		}
		r->head = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
		/* Refusing at once closes the connection, which is what a stray upload deserves. */
		if (!r->head && strcmp(method, MHD_HTTP_METHOD_GET) != 0)
			return send_status(r, 405);
		if (!request_well_formed(r, version))
			return send_status(r, 400);
		/*
		 * libmicrohttpd 0.9.75 closes the connection after a response
		 * queued in this first call; answering in the next keeps it alive.
		 */
		return MHD_YES;
	}
	if (*upload_data_size) {
		*upload_data_size = 0; /* a body we did not ask for */
		return MHD_YES;
	}
	if (strcmp(url, "/_health") == 0)
		return serve_health(r);
	if (strcmp(url, "/_metrics") == 0)
		return serve_metrics(r);
	if (strncmp(url, "/id/", 4) == 0)
		return serve_by_id(r, url + 4);
	if (url[0] != '/')
		return send_status(r, 400);
	return serve_by_name(r, url + 1);
}

/* The lock only while draining, so that requests never contend for it otherwise. */
static void
wake_drain(struct httpserve *srv)
{
	pthread_mutex_lock(&srv->active_mu);
	pthread_cond_broadcast(&srv->active_cv);
	pthread_mutex_unlock(&srv->active_mu);
}

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

/* ---- slow clients: a deadline for headers, a limit per address ------ */

/*
 * libmicrohttpd's timeout restarts at every byte received, so a client
 * that trickles its headers a byte at a time holds a connection for ever.
 * A request's line and headers get header_timeout_ms from the moment they
 * are due (the connection's start, or for a later request on a kept-alive
 * connection, the idle timeout after the previous one ends); a guard
 * thread shuts down the sockets of the late ones, and libmicrohttpd then
 * closes them as it would any connection its client ended. Connections
 * are listed under guard_mu, which their close also takes: libmicrohttpd
 * closes a descriptor only after telling us, so the guard never shuts a
 * reused one.
 */

static int64_t
mono_ms(void)
{
	return mono_us() / 1000;
}

/* The numeric address of a client, as the per-address count and the access log name it. */
static bool
addr_text(const struct sockaddr *sa, char out[INET6_ADDRSTRLEN])
{
	if (sa && sa->sa_family == AF_INET)
		return inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out,
		                 INET6_ADDRSTRLEN) != NULL;
	if (sa && sa->sa_family == AF_INET6)
		return inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out,
		                 INET6_ADDRSTRLEN) != NULL;
	return false;
}

/* Counts a connection from key, unless that address has max_per_ip open already. */
static bool
admit_address(struct httpserve *srv, const char *key)
{
	pthread_mutex_lock(&srv->guard_mu);
	uintptr_t n = (uintptr_t)strmap_get(srv->per_ip, key);
	bool ok = n < srv->cfg.max_per_ip;
	if (ok)
		strmap_put(srv->per_ip, key, (void *)(n + 1));
	pthread_mutex_unlock(&srv->guard_mu);
	if (ok)
		return true;
	atomic_fetch_add(&srv->per_ip_refused, 1);
	int64_t now = gfs_now_ms(), last = atomic_load(&srv->last_per_ip_log_ms);
	if (now - last >= 10000 && atomic_compare_exchange_strong(&srv->last_per_ip_log_ms, &last, now))
		logf_(srv, "connection from %s refused: %u open from that address already (the limit)",
		      key, srv->cfg.max_per_ip);
	return false;
}

/* Called with guard_mu held. */
static void
release_address(struct httpserve *srv, const char *key)
{
	uintptr_t n = (uintptr_t)strmap_get(srv->per_ip, key);
	if (n > 1)
		strmap_put(srv->per_ip, key, (void *)(n - 1));
	else
		strmap_del(srv->per_ip, key);
}

static void
guard_track(struct httpserve *srv, struct MHD_Connection *conn, struct conn_state *cs)
{
	const union MHD_ConnectionInfo *fi = MHD_get_connection_info(conn,
	                                                             MHD_CONNECTION_INFO_CONNECTION_FD);
	const union MHD_ConnectionInfo *ai = MHD_get_connection_info(conn,
	                                                             MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	cs->fd = fi ? fi->connect_fd : -1;
	if (srv->cfg.max_per_ip && ai && !addr_text(ai->client_addr, cs->addr))
		cs->addr[0] = '\0';
	atomic_init(&cs->header_deadline_ms, mono_ms() + srv->cfg.header_timeout_ms);
	pthread_mutex_lock(&srv->guard_mu);
	cs->next = srv->conns;
	if (srv->conns)
		srv->conns->prev = cs;
	srv->conns = cs;
	pthread_mutex_unlock(&srv->guard_mu);
}

static void
guard_untrack(struct httpserve *srv, struct conn_state *cs)
{
	pthread_mutex_lock(&srv->guard_mu);
	if (cs->prev)
		cs->prev->next = cs->next;
	else
		srv->conns = cs->next;
	if (cs->next)
		cs->next->prev = cs->prev;
	if (cs->addr[0])
		release_address(srv, cs->addr);
	pthread_mutex_unlock(&srv->guard_mu);
}

static struct conn_state *
conn_state_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn,
	                                                             MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	return ci ? ci->socket_context : NULL;
}

/* A request's headers are in: no deadline while it is answered. */
static void
header_arrived(struct MHD_Connection *conn)
{
	struct conn_state *cs = conn_state_of(conn);
	if (cs)
		atomic_store(&cs->header_deadline_ms, 0);
}

/* A request is over; the next one on this connection is due within the idle timeout. */
static void
header_due(struct httpserve *srv, struct MHD_Connection *conn)
{
	struct conn_state *cs = conn_state_of(conn);
	if (cs)
		atomic_store(&cs->header_deadline_ms, mono_ms() + (int64_t)srv->cfg.timeout_s * 1000 +
		                                          srv->cfg.header_timeout_ms);
}

static void
shut_late_headers(struct httpserve *srv, int64_t now)
{
	for (struct conn_state *cs = srv->conns; cs; cs = cs->next) {
		int64_t d = atomic_load(&cs->header_deadline_ms);
		if (!d || now < d || cs->shut || cs->fd < 0)
			continue;
		shutdown(cs->fd, SHUT_RDWR);
		cs->shut = true;
		atomic_fetch_add(&srv->header_timeouts, 1);
	}
}

static bool
evicted_from_tier(void *user, void *ctx)
{
	return !disktier_has(ctx, user);
}

/*
 * An unlinked entry's space is freed only when its last descriptor is
 * closed: open entries the tier evicted are let go once it has evicted
 * something, not when (if ever) they are asked for again, or a full disk
 * stays full of files no one can see.
 */
static void
close_evicted(struct httpserve *srv, uint64_t *seen)
{
	if (!srv->open)
		return;
	struct disktier_stats st;
	disktier_stats(srv->tier, &st);
	if (st.evictions == *seen)
		return;
	*seen = st.evictions;
	http_cache_drop_if(srv->open, evicted_from_tier, srv->tier);
}

/* Shuts connections whose headers are late; lets go of open entries the tier evicted. */
static void *
guard_main(void *arg)
{
	struct httpserve *srv = arg;
	int64_t step = srv->cfg.header_timeout_ms / 4;
	step = step < 50 ? 50 : step > 250 ? 250 : step;
	uint64_t evictions = 0;
	pthread_mutex_lock(&srv->guard_mu);
	while (!srv->guard_stop) {
		struct timespec ts;
		gfs_deadline_in(&ts, (int)step);
		pthread_cond_timedwait(&srv->guard_cv, &srv->guard_mu, &ts);
		if (srv->guard_stop)
			break;
		shut_late_headers(srv, mono_ms());
		pthread_mutex_unlock(&srv->guard_mu);
		close_evicted(srv, &evictions);
		pthread_mutex_lock(&srv->guard_mu);
	}
	pthread_mutex_unlock(&srv->guard_mu);
	return NULL;
}

/* Stops a thread that waits on cv for *stop, if it was started. */
static void
stop_and_join(pthread_mutex_t *mu, pthread_cond_t *cv, bool *stop, pthread_t t, bool *started)
{
	if (!*started)
		return;
	pthread_mutex_lock(mu);
	*stop = true;
	pthread_cond_signal(cv);
	pthread_mutex_unlock(mu);
	pthread_join(t, NULL);
	*started = false;
}

static void
note_request(struct httpserve *srv, struct MHD_Connection *conn)
{
	struct conn_state *cs = conn_state_of(conn);
	if (!cs || cs->had_request)
		return;
	cs->had_request = true;
	if (atomic_fetch_sub(&srv->unanswered_connections, 1) == 1 && atomic_load(&srv->draining))
		wake_drain(srv);
}

/* libmicrohttpd calls this first for every request, with the raw URI. */
static void *
on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
	struct httpserve *srv = cls;
	struct req *r = gfs_xcalloc(1, sizeof *r);
	r->srv = srv;
	r->conn = conn;
	if (srv->cfg.access_log) {
		r->uri = xstrdup(uri);
		r->start_ms = gfs_now_ms();
	}
	r->bad_target = http_uri_has_nul(uri);
	r->target = (uintptr_t)uri;
	r->target_len = strlen(uri);
	atomic_fetch_add(&srv->active, 1);
	note_request(srv, conn);
	return r;
}

/* Combined log format, as Apache and nginx write it. */
static void
write_access_log(struct httpserve *srv, struct req *r, unsigned status)
{
	char addr[INET6_ADDRSTRLEN] = "-";
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn,
	                                                             MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	if (!ci || !addr_text(ci->client_addr, addr))
		snprintf(addr, sizeof addr, "-");
	time_t t = (time_t)(r->start_ms / 1000);
	struct tm tm;
	localtime_r(&t, &tm);
	static const char mon[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
	                                "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
	long off = tm.tm_gmtoff / 60;
	char when[64];
	snprintf(when, sizeof when, "%02d/%s/%04d:%02d:%02d:%02d %c%02ld%02ld", tm.tm_mday,
	         mon[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec,
	         off < 0 ? '-' : '+', labs(off) / 60, labs(off) % 60);
	char bytes[24] = "-";
	if (r->body_bytes)
		snprintf(bytes, sizeof bytes, "%llu", (unsigned long long)r->body_bytes);
	pthread_mutex_lock(&srv->log_mu);
	fprintf(srv->access_log, "%s - - [%s] \"%s %s %s\" %u %s \"%s\" \"%s\"\n", addr, when,
	        r->method[0] ? r->method : "-", r->uri, r->version[0] ? r->version : "-", status,
	        bytes, r->referer ? r->referer : "-", r->agent ? r->agent : "-");
	pthread_mutex_unlock(&srv->log_mu);
}

static void
on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
             enum MHD_RequestTerminationCode toe)
{
	struct httpserve *srv = cls;
	struct req *r = *req_cls;
	if (!r)
		return;
	*req_cls = NULL;
	if (r->corked)
		cork(r, false);
	header_due(srv, conn);
	/* A request libmicrohttpd refused before our handler saw it was answered 4xx by it. */
	unsigned status = r->status ? r->status : r->handled ? 499 : 400;
	if (r->sent) {
		pthread_mutex_lock(&r->sent->mu);
		if (r->sent->damaged)
			status = 500; /* its 200 went, but the server failed to deliver the file */
		pthread_mutex_unlock(&r->sent->mu);
		stream_unref(r->sent);
	}
	if (status < 600)
		atomic_fetch_add(&srv->status_count[status], 1);
	if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
		atomic_fetch_add(&srv->bytes_sent, r->body_bytes);
	else
		r->body_bytes = 0;
	if (srv->cfg.access_log)
		write_access_log(srv, r, status);
	if (r->entry)
		http_cache_entry_release(srv->cache, r->entry);
	if (r->open_entry)
		http_cache_entry_release(srv->open, r->open_entry);
	if (r->stream)
		stream_free_cb(r->stream); /* answered before its response took the stream over */
	gfs_meta_unref(r->meta);
	free(r->uri);
	free(r->referer);
	free(r->agent);
	free(r);
	if (atomic_fetch_sub(&srv->active, 1) == 1 && atomic_load(&srv->draining))
		wake_drain(srv);
}

static void
on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
              enum MHD_ConnectionNotificationCode toe)
{
	struct loop *lp = cls;
	struct httpserve *srv = lp->srv;
	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		struct conn_state *cs = gfs_xcalloc(1, sizeof *cs);
		*socket_ctx = cs;
		guard_track(srv, conn, cs);
		return; /* counted open and unanswered in on_accept already */
	}
	struct conn_state *cs = *socket_ctx;
	if (cs)
		guard_untrack(srv, cs);
	atomic_fetch_sub(&lp->conns, 1);
	atomic_fetch_sub(&srv->open_connections, 1);
	acceptor_resume(atomic_load(&srv->acceptor));
	if (cs && !cs->had_request &&
	    atomic_fetch_sub(&srv->unanswered_connections, 1) == 1 && atomic_load(&srv->draining))
		wake_drain(srv);
	free(cs);
	*socket_ctx = NULL;
}

/* ---- metrics --------------------------------------------------------- */

static long
count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	long n = 0;
	while (readdir(d))
		n++;
	closedir(d);
	return n - 3; /* ".", ".." and the directory's own descriptor */
}

struct buf {
	char *p;
	size_t len, cap;
};

static void
bprintf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
bprintf(struct buf *b, const char *fmt, ...)
{
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (n >= 0 && (size_t)n < b->cap - b->len) {
			b->len += (size_t)n;
			return;
		}
		b->cap = b->cap * 2 + (size_t)(n > 0 ? n : 0);
		b->p = gfs_xreallocarray(b->p, b->cap, 1);
	}
}

#define P "gridfsctl_serve_"

/* The memory cache's, the disk tier's and its open entries' counters. */
static void
metrics_caches(struct httpserve *srv, struct buf *b)
{
	struct http_cache_stats cs;
	http_cache_stats(srv->cache, &cs);
	bprintf(b, "# TYPE " P "cache_hits_total counter\n" P "cache_hits_total %llu\n"
	        "# TYPE " P "cache_misses_total counter\n" P "cache_misses_total %llu\n"
	        "# TYPE " P "cache_evictions_total counter\n" P "cache_evictions_total %llu\n"
	        "# TYPE " P "negative_cache_hits_total counter\n" P "negative_cache_hits_total %llu\n"
	        "# TYPE " P "cache_bytes gauge\n" P "cache_bytes %zu\n"
	        "# TYPE " P "cache_max_bytes gauge\n" P "cache_max_bytes %zu\n"
	        "# TYPE " P "cache_entries gauge\n" P "cache_entries %zu\n"
	        "# TYPE " P "preloaded_files_total counter\n" P "preloaded_files_total %llu\n",
	        (unsigned long long)cs.hits, (unsigned long long)cs.misses,
	        (unsigned long long)cs.evictions, (unsigned long long)cs.neg_hits, cs.bytes,
	        cs.max_bytes, cs.entries, (unsigned long long)atomic_load(&srv->preloaded));
	struct disktier_stats ds = {0};
	if (srv->tier)
		disktier_stats(srv->tier, &ds);
	bprintf(b, "# TYPE " P "disk_hits_total counter\n" P "disk_hits_total %llu\n"
	        "# TYPE " P "disk_misses_total counter\n" P "disk_misses_total %llu\n"
	        "# TYPE " P "disk_evictions_total counter\n" P "disk_evictions_total %llu\n"
	        "# TYPE " P "disk_errors_total counter\n" P "disk_errors_total %llu\n"
	        "# TYPE " P "disk_fills_dropped_total counter\n" P "disk_fills_dropped_total %llu\n"
	        "# TYPE " P "disk_bytes gauge\n" P "disk_bytes %llu\n"
	        "# TYPE " P "disk_max_bytes gauge\n" P "disk_max_bytes %llu\n"
	        "# TYPE " P "disk_entries gauge\n" P "disk_entries %llu\n"
	        "# TYPE " P "disk_unproven_entries gauge\n" P "disk_unproven_entries %llu\n"
	        "# TYPE " P "disk_proofs_total counter\n" P "disk_proofs_total %llu\n"
	        "# TYPE " P "disk_proof_failures_total counter\n" P "disk_proof_failures_total %llu\n"
	        "# HELP " P "backend_reads_total File bodies read from the backend, for any reason.\n"
	        "# TYPE " P "backend_reads_total counter\n" P "backend_reads_total %llu\n"
	        "# HELP " P "integrity_failures_total Bodies read for a request that failed the integrity rule.\n"
	        "# TYPE " P "integrity_failures_total counter\n" P "integrity_failures_total %llu\n",
	        (unsigned long long)ds.hits, (unsigned long long)ds.misses,
	        (unsigned long long)ds.evictions, (unsigned long long)ds.errors,
	        (unsigned long long)ds.dropped, (unsigned long long)ds.bytes, (unsigned long long)ds.max_bytes,
	        (unsigned long long)ds.entries, (unsigned long long)ds.unproven,
	        (unsigned long long)ds.proofs, (unsigned long long)ds.proof_failures,
	        (unsigned long long)atomic_load(&srv->backend_reads),
	        (unsigned long long)atomic_load(&srv->integrity_failures));
	struct http_cache_stats kept = {0};
	if (srv->open)
		http_cache_stats(srv->open, &kept);
	bprintf(b, "# TYPE " P "disk_open_entries gauge\n" P "disk_open_entries %zu\n"
	        "# TYPE " P "disk_open_bypassed_total counter\n" P "disk_open_bypassed_total %llu\n",
	        kept.entries, (unsigned long long)atomic_load(&srv->open_bypassed));
}

static void
metrics_backend_latency(struct httpserve *srv, struct buf *b)
{
	bprintf(b, "# HELP " P "backend_seconds Time to read a file or look one up.\n"
	        "# TYPE " P "backend_seconds histogram\n");
	uint64_t cum = 0;
	for (int i = 0; i < NBUCKETS; i++) {
		cum += atomic_load(&srv->latency_bucket[i]);
		if (i < NBUCKETS - 1)
			bprintf(b, P "backend_seconds_bucket{le=\"%g\"} %llu\n", latency_bounds[i],
			        (unsigned long long)cum);
		else
			bprintf(b, P "backend_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
	}
	bprintf(b, P "backend_seconds_sum %.6f\n" P "backend_seconds_count %llu\n",
	        (double)atomic_load(&srv->latency_sum_us) / 1e6,
	        (unsigned long long)atomic_load(&srv->latency_count));
}

static enum MHD_Result
serve_metrics(struct req *r)
{
	struct httpserve *srv = r->srv;
	struct buf b = {gfs_xmalloc(8192), 0, 8192};
	bprintf(&b, "# HELP " P "requests_total Requests answered, by status.\n# TYPE " P "requests_total counter\n");
	for (int s = 100; s < 600; s++) {
		uint64_t n = atomic_load(&srv->status_count[s]);
		if (n)
			bprintf(&b, P "requests_total{code=\"%d\"} %llu\n", s, (unsigned long long)n);
	}
	bprintf(&b, "# HELP " P "response_bytes_total Body bytes sent.\n# TYPE " P "response_bytes_total counter\n"
	        P "response_bytes_total %llu\n", (unsigned long long)atomic_load(&srv->bytes_sent));
	metrics_caches(srv, &b);
	metrics_backend_latency(srv, &b);
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	pthread_mutex_lock(&srv->jobs_mu);
	unsigned queued = srv->queued;
	size_t inflight = strmap_count(srv->inflight);
	pthread_mutex_unlock(&srv->jobs_mu);
	bprintf(&b, "# TYPE " P "open_connections gauge\n" P "open_connections %ld\n"
	        "# TYPE " P "open_fds gauge\n" P "open_fds %ld\n"
	        "# TYPE " P "max_fds gauge\n" P "max_fds %llu\n"
	        "# TYPE " P "accept_emfile_total counter\n" P "accept_emfile_total %llu\n"
	        "# TYPE " P "queue_full_total counter\n" P "queue_full_total %llu\n"
	        "# TYPE " P "coalesced_total counter\n" P "coalesced_total %llu\n"
	        "# TYPE " P "header_timeouts_total counter\n" P "header_timeouts_total %llu\n"
	        "# TYPE " P "per_address_refused_total counter\n" P "per_address_refused_total %llu\n"
	        "# TYPE " P "fetch_queue gauge\n" P "fetch_queue %u\n"
	        "# TYPE " P "fetches_in_flight gauge\n" P "fetches_in_flight %zu\n"
	        "# TYPE " P "backend_up gauge\n" P "backend_up %d\n"
	        "# TYPE " P "index_files gauge\n" P "index_files %zu\n"
	        "# TYPE " P "index_age_seconds gauge\n" P "index_age_seconds %.3f\n"
	        "# TYPE " P "index_poll_seconds gauge\n" P "index_poll_seconds %.3f\n"
	        "# TYPE " P "index_reload_seconds gauge\n" P "index_reload_seconds %.3f\n"
	        "# TYPE " P "index_poll_interval_seconds gauge\n" P "index_poll_interval_seconds %.3f\n",
	        atomic_load(&srv->open_connections), count_fds(), (unsigned long long)rl.rlim_cur,
	        (unsigned long long)atomic_load(&srv->emfile_events),
	        (unsigned long long)atomic_load(&srv->queue_full),
	        (unsigned long long)atomic_load(&srv->coalesced),
	        (unsigned long long)atomic_load(&srv->header_timeouts),
	        (unsigned long long)atomic_load(&srv->per_ip_refused), queued, inflight,
	        atomic_load(&srv->backend_down) ? 0 : 1, name_index_count(srv->index),
	        name_index_fresh_ms(srv->index) ? (double)(gfs_now_ms() - name_index_fresh_ms(srv->index)) / 1e3 : -1.0,
	        (double)atomic_load(&srv->poll_us) / 1e6, (double)atomic_load(&srv->reload_us) / 1e6,
	        (double)atomic_load(&srv->poll_interval_ms) / 1e3);
	bprintf(&b, "# HELP " P "thread_connections Open connections of each event thread.\n"
	        "# TYPE " P "thread_connections gauge\n");
	for (unsigned i = 0; i < srv->nd; i++)
		bprintf(&b, P "thread_connections{thread=\"%u\"} %ld\n", i, atomic_load(&srv->loops[i].conns));
	struct MHD_Response *resp =
	    made(MHD_create_response_from_buffer(b.len, b.p, MHD_RESPMEM_MUST_FREE));
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	return queue_once(r, 200, resp, b.len);
}

/* ---- libmicrohttpd's log, and running out of descriptors ---------- */

static void
on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	struct httpserve *srv = cls;
	char msg[512];
	vsnprintf(msg, sizeof msg, fmt, ap);
	size_t n = strlen(msg);
	while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
		msg[--n] = '\0';
	/* Bad requests are the clients' business: a line a second at most. */
	int64_t now = gfs_now_ms(), last = atomic_load(&srv->last_mhd_log_ms);
	if (now - last >= 1000 && atomic_compare_exchange_strong(&srv->last_mhd_log_ms, &last, now))
		logf_(srv, "http: %s", msg);
}

/*
 * accept() found no descriptor (or memory) to spare. The line names
 * "Too many open files" so that a supervisor watching the log can act;
 * one every 10 seconds at most, however long the shortage lasts.
 */
static void
on_accept_limit(void *ctx, int err)
{
	struct httpserve *srv = ctx;
	atomic_fetch_add(&srv->emfile_events, 1);
	int64_t now = gfs_now_ms(), last = atomic_load(&srv->last_emfile_log_ms);
	if (now - last < 10000 || !atomic_compare_exchange_strong(&srv->last_emfile_log_ms, &last, now))
		return;
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	logf_(srv, "accept: %s (limit %llu, %ld connections open); not accepting until a connection closes",
	      err == EMFILE ? "Too many open files" : err == ENFILE ? "Too many open files in system"
	                                                          : strerror(err),
	      (unsigned long long)rl.rlim_cur, atomic_load(&srv->open_connections));
}

/* The loop with the fewest connections; ties go round, so two clients never share a thread. */
static void
on_accept(void *ctx, int fd, const struct sockaddr *addr, socklen_t len)
{
	struct httpserve *srv = ctx;
	char key[INET6_ADDRSTRLEN];
	bool counted = srv->cfg.max_per_ip && addr_text(addr, key);
	if (counted && !admit_address(srv, key)) {
		close(fd);
		return;
	}
	unsigned best = srv->next_loop % srv->nd;
	for (unsigned k = 1; k < srv->nd; k++) {
		unsigned i = (srv->next_loop + k) % srv->nd;
		if (atomic_load(&srv->loops[i].conns) < atomic_load(&srv->loops[best].conns))
			best = i;
	}
	srv->next_loop = best + 1;
	/*
	 * Counted before the hand-over: libmicrohttpd starts the connection
	 * later, on the event thread, and a drain in between must wait for it.
	 * Should it drop one unstarted (out of memory), a drain waits out its
	 * timeout: the safe side. Open from now on too: the accepting thread
	 * takes a burst of connections before an event thread starts any, and
	 * counted only once started, a burst that ran out of descriptors was
	 * reported with "1 connections open".
	 */
	atomic_fetch_add(&srv->unanswered_connections, 1);
	atomic_fetch_add(&srv->loops[best].conns, 1);
	atomic_fetch_add(&srv->open_connections, 1);
	/* On failure libmicrohttpd has closed fd, and logged why (its connection limit, memory). */
	if (MHD_add_connection(srv->loops[best].d, fd, addr, len) == MHD_YES)
		return;
	atomic_fetch_sub(&srv->loops[best].conns, 1);
	atomic_fetch_sub(&srv->open_connections, 1);
	if (counted) {
		pthread_mutex_lock(&srv->guard_mu);
		release_address(srv, key);
		pthread_mutex_unlock(&srv->guard_mu);
	}
	if (atomic_fetch_sub(&srv->unanswered_connections, 1) == 1 && atomic_load(&srv->draining))
		wake_drain(srv);
}

/* ---- index upkeep ---------------------------------------------------- */

/* Both of the poller's query kinds give way to the backend as it slows down. */
#define POLL_DUTY 5      /* a poll waits at least 5 times as long as the last one took */
#define RELOAD_DUTY 10   /* a reload, 10 times */

static int64_t
max64(int64_t a, int64_t b)
{
	return a > b ? a : b;
}

/*
 * Keeps the index fresh and tells whether the backend answers. On a server
 * that must scan the files collection for any query (FerretDB does), a poll
 * costs as much as the collection is large, so the intervals stretch to
 * keep polling under a fifth of the backend's time.
 */
static void *
poller_main(void *arg)
{
	struct httpserve *srv = arg;
	gfs_session *ses = gfs_session_pop(srv->conn);
	int64_t last_full = name_index_loaded(srv->index) ? gfs_now_ms() : 0;
	int64_t wait_ms = srv->cfg.poll_ms;
	pthread_mutex_lock(&srv->poll_mu);
	while (!srv->poll_stop) {
		struct timespec ts;
		gfs_deadline_in(&ts, wait_ms);
		pthread_cond_timedwait(&srv->poll_cv, &srv->poll_mu, &ts);
		if (srv->poll_stop)
			break;
		pthread_mutex_unlock(&srv->poll_mu);
		gfs_error err;
		gfs_error_clear(&err);
		int64_t reload_every = max64(srv->cfg.reload_ms,
		                             RELOAD_DUTY * atomic_load(&srv->reload_us) / 1000);
		bool full = !name_index_loaded(srv->index) || gfs_now_ms() - last_full >= reload_every;
		int64_t t0 = mono_us();
		bool ok = full ? name_index_load(srv->index, ses, &err)
		               : name_index_poll(srv->index, ses, srv->cfg.poll_window_ms, &err);
		int64_t took = mono_us() - t0;
		atomic_store(full ? &srv->reload_us : &srv->poll_us, took);
		if (ok && full) {
			last_full = gfs_now_ms();
			if (srv->tier)
				disktier_reconcile(srv->tier, srv->index); /* deleted files leave the tier */
		}
		wait_ms = max64(srv->cfg.poll_ms, POLL_DUTY * took / 1000);
		atomic_store(&srv->poll_interval_ms, wait_ms);
		if (ok && atomic_exchange(&srv->backend_down, false))
			logf_(srv, "backend reachable again");
		else if (!ok && !atomic_exchange(&srv->backend_down, true))
			logf_(srv, "backend unreachable, answering 503 for files not in the cache: %s", err.msg);
		if (!ok)
			wait_ms = srv->cfg.poll_ms; /* a failure is fast or timed out: retry at the normal pace */
		if (srv->cfg.access_log) {
			pthread_mutex_lock(&srv->log_mu);
			fflush(srv->access_log);
			pthread_mutex_unlock(&srv->log_mu);
		}
		pthread_mutex_lock(&srv->poll_mu);
	}
	pthread_mutex_unlock(&srv->poll_mu);
	gfs_session_push(ses);
	return NULL;
}

/* ---- preload: one pass over the chunks collection ------------------- */

/*
 * The pass runs while the server answers (a restart at 52,000 files once
 * refused connections for the 35 s it took), and gives way to a stop.
 */
static bool
preload_stopping(struct httpserve *srv)
{
	pthread_mutex_lock(&srv->preload_mu);
	bool stop = srv->preload_stop;
	pthread_mutex_unlock(&srv->preload_mu);
	return stop || atomic_load(&srv->draining);
}

struct partial {
	gfs_meta *meta;
	http_cache_body *body;
	bool memory;       /* within the memory cache's budget; else for the disk tier only */
	uint64_t have;     /* bit n: chunk n arrived */
	int64_t count;
};

struct preload {
	struct httpserve *srv;
	strmap *want;      /* id key -> struct partial */
	size_t budget;
};

/*
 * What the memory cache cannot hold goes to the disk tier, if there is
 * one; a file on disk already costs no backend read.
 */
static void
want_meta(gfs_meta *m, void *ctx)
{
	struct preload *p = ctx;
	disktier *tier = p->srv->tier;
	int64_t count = gfs_chunk_count(m->length, m->chunk_size);
	if (m->bad || count > 64 || (tier && disktier_has(tier, m)))
		return;
	bool memory = (size_t)m->length <= p->srv->cfg.stream_threshold &&
	              (size_t)m->length + 512 <= p->budget;
	if (!memory && !tier)
		return;
	if (memory)
		p->budget -= (size_t)m->length + 512;
	if (count == 0) {
		/* No chunks to wait for: cached now, so the scan can stop once the rest are in. */
		http_cache_body *b = http_cache_body_new(0);
		if (memory)
			http_cache_entry_release(p->srv->cache, memcache_insert(p->srv, m, b));
		if (tier)
			disktier_put(tier, m, b->data, 0);
		http_cache_body_unref(b);
		atomic_fetch_add(&p->srv->preloaded, 1);
		return;
	}
	struct partial *pt = gfs_xcalloc(1, sizeof *pt);
	pt->meta = gfs_meta_ref(m);
	pt->count = count;
	pt->memory = memory;
	strmap_put(p->want, m->key, pt);
}

static void
free_partial(const char *key, void *value, void *ctx)
{
	(void)key;
	(void)ctx;
	struct partial *pt = value;
	if (pt->body)
		http_cache_body_unref(pt->body);
	gfs_meta_unref(pt->meta);
	free(pt);
}

/* Adds one chunk; when the file is complete and its hash checks, caches it. */
static void
preload_chunk(struct preload *p, const bson_t *doc)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, doc, "files_id"))
		return;
	char *key = gfs_meta_key(bson_iter_value(&it));
	struct partial *pt = key ? strmap_get(p->want, key) : NULL;
	free(key);
	if (!pt)
		return;
	gfs_meta *m = pt->meta;
	uint32_t len;
	const uint8_t *data;
	bson_subtype_t sub;
	int64_t n;
	if (!gfs_chunk_n(doc, &n))
		return;
	if (n < 0 || n >= pt->count || (pt->have & (1ULL << n)) ||
	    !bson_iter_init_find(&it, doc, "data") || !BSON_ITER_HOLDS_BINARY(&it))
		return;
	bson_iter_binary(&it, &sub, &len, &data);
	if ((int64_t)len != gfs_chunk_expected_len(m->length, m->chunk_size, n))
		return; /* left incomplete: a request will read it and report the damage */
	if (!pt->body)
		pt->body = http_cache_body_new((size_t)m->length);
	memcpy(pt->body->data + n * (int64_t)m->chunk_size, data, len);
	pt->have |= 1ULL << n;
	if (pt->have != (pt->count == 64 ? ~0ULL : (1ULL << pt->count) - 1))
		return;
	gfs_file f;
	gfs_meta_file(m, &f);
	gfs_digest *d = gfs_digest_new(&f);
	gfs_digest_update(d, pt->body->data, pt->body->len);
	gfs_error err;
	if (!gfs_digest_check(d, &f, NULL, &err)) {
		/* Not cached: a request will read it again and report the damage. */
		free_partial(NULL, strmap_del(p->want, m->key), NULL);
		return;
	}
	if (pt->memory)
		http_cache_entry_release(p->srv->cache, memcache_insert(p->srv, m, pt->body));
	if (p->srv->tier)
		disktier_put(p->srv->tier, m, pt->body->data, pt->body->len);
	atomic_fetch_add(&p->srv->preloaded, 1);
	atomic_fetch_add(&p->srv->backend_reads, 1);
	free_partial(NULL, strmap_del(p->want, m->key), NULL);
}

static bool
preload(struct httpserve *srv, gfs_error *err)
{
	struct preload p = {srv, strmap_new(name_index_count(srv->index)), srv->cfg.cache_size};
	name_index_each(srv->index, want_meta, &p);
	gfs_session *ses = gfs_session_pop(srv->conn);
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, hint;
	BSON_APPEND_INT32(&opts, "batchSize", gfs_chunk_batch_size(GFS_DEFAULT_CHUNK_SIZE));
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "hint", &hint);
	BSON_APPEND_INT32(&hint, "$natural", 1);
	bson_append_document_end(&opts, &hint);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(ses->chunks, &filter, &opts, NULL);
	const bson_t *doc;
	while (strmap_count(p.want) > 0 && !preload_stopping(srv) && mongoc_cursor_next(cur, &doc))
		preload_chunk(&p, doc);
	bool ok = gfs_cursor_done(cur, "preload", err);
	bson_destroy(&filter);
	bson_destroy(&opts);
	gfs_session_push(ses);
	strmap_each(p.want, free_partial, NULL);
	strmap_free(p.want);
	return ok;
}

/* A backend down at start: the poller loads the index once it answers, and the pass follows. */
static bool
preload_wait_for_index(struct httpserve *srv)
{
	pthread_mutex_lock(&srv->preload_mu);
	while (!srv->preload_stop && !atomic_load(&srv->draining) && !name_index_loaded(srv->index)) {
		struct timespec ts;
		gfs_deadline_in(&ts, 100);
		pthread_cond_timedwait(&srv->preload_cv, &srv->preload_mu, &ts);
	}
	bool go = !srv->preload_stop && !atomic_load(&srv->draining);
	pthread_mutex_unlock(&srv->preload_mu);
	return go;
}

static void *
preload_main(void *arg)
{
	struct httpserve *srv = arg;
	if (!preload_wait_for_index(srv))
		return NULL;
	int64_t t0 = mono_us();
	gfs_error err;
	gfs_error_clear(&err);
	bool ok = preload(srv, &err);
	if (preload_stopping(srv))
		return NULL; /* cut short by the stop: nobody waits for it any more */
	atomic_store(&srv->preload_state, ok ? HTTPSERVE_PRELOAD_DONE : HTTPSERVE_PRELOAD_FAILED);
	if (!ok)
		logf_(srv, "preload stopped early: %s; the rest is read when asked for", err.msg);
	if (srv->cfg.preloaded)
		srv->cfg.preloaded(ok, atomic_load(&srv->preloaded), (double)(mono_us() - t0) / 1e6);
	return NULL;
}

/* ---- start and stop -------------------------------------------------- */

static void
free_meta_cb(void *m)
{
	gfs_meta_unref(m);
}

static bool
resolve(const char *host, unsigned port, struct sockaddr_storage *ss, gfs_error *err)
{
	struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE,
	                         .ai_socktype = SOCK_STREAM};
	struct addrinfo *ai;
	char ports[16];
	snprintf(ports, sizeof ports, "%u", port);
	int rc = getaddrinfo(host, ports, &hints, &ai);
	if (rc != 0) {
		gfs_error_set(err, GFS_EINVAL, "cannot listen on %s: %s", host, gai_strerror(rc));
		return false;
	}
	memcpy(ss, ai->ai_addr, ai->ai_addrlen);
	freeaddrinfo(ai);
	return true;
}

static void
free_server(struct httpserve *srv)
{
	struct MHD_Response *rs[] = {srv->r400, srv->r404, srv->r405, srv->r500, srv->r503, srv->r503busy};
	for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++)
		if (rs[i])
			MHD_destroy_response(rs[i]);
	disktier_close(srv->tier); /* first: its writer may still hold bodies */
	if (srv->open)
		http_cache_free(srv->open);
	http_cache_free(srv->cache);
	name_index_free(srv->index);
	strmap_free(srv->inflight);
	strmap_free(srv->per_ip);
	free(srv->workers);
	free(srv->prefix);
	free(srv);
}

static void
stop_threads(struct httpserve *srv)
{
	pthread_mutex_lock(&srv->jobs_mu);
	srv->stopping = true;
	pthread_cond_broadcast(&srv->jobs_cv);
	pthread_mutex_unlock(&srv->jobs_mu);
	for (unsigned i = 0; i < srv->nworkers; i++)
		pthread_join(srv->workers[i], NULL);
	srv->nworkers = 0;
	stop_and_join(&srv->preload_mu, &srv->preload_cv, &srv->preload_stop, srv->preloader,
	              &srv->preloader_started);
	stop_and_join(&srv->guard_mu, &srv->guard_cv, &srv->guard_stop, srv->guard, &srv->guard_started);
	stop_and_join(&srv->poll_mu, &srv->poll_cv, &srv->poll_stop, srv->poller, &srv->poller_started);
}

/* Starts an event thread: a libmicrohttpd daemon with no socket of its own. */
static struct MHD_Daemon *
start_loop(struct httpserve *srv, struct loop *lp, unsigned limit)
{
	const struct httpserve_config *c = &srv->cfg;
	unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
	                 MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
	struct MHD_OptionItem opts[] = {
		{MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)on_mhd_log, srv},
		{MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)on_uri, srv},
		{MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, srv},
		{MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)on_connection, lp},
		{MHD_OPTION_CONNECTION_LIMIT, limit, NULL},
		{MHD_OPTION_CONNECTION_TIMEOUT, c->timeout_s, NULL},
		{MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)c->conn_memory, NULL},
		{MHD_OPTION_END, 0, NULL},
	};
	return MHD_start_daemon(flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_ARRAY, opts,
	                        MHD_OPTION_END);
}

static bool
open_listener(struct httpserve *srv, gfs_error *err)
{
	const struct httpserve_config *c = &srv->cfg;
	if (c->listen_fd >= 0) {
		srv->listen_fd = c->listen_fd;
		return true;
	}
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof ss);
	if (!resolve(c->host, c->port, &ss, err))
		return false;
	gfs_error lerr;
	gfs_error_clear(&lerr);
	srv->listen_fd = acceptor_listen(&ss, c->reuse_port, LISTEN_BACKLOG, &lerr);
	if (srv->listen_fd >= 0)
		return true;
	gfs_error_set(err, GFS_ELOCAL, "cannot listen on %s port %u: %s", c->host, c->port, lerr.msg);
	return false;
}

/* Every event thread, then the thread that accepts for them. */
static bool
start_daemons(struct httpserve *srv, gfs_error *err)
{
	const struct httpserve_config *c = &srv->cfg;
	unsigned count = c->threads < 1 ? 1 : c->threads > MAX_DAEMONS ? MAX_DAEMONS : c->threads;
	unsigned limit = c->max_connections / count ? c->max_connections / count : 1;
	for (srv->nd = 0; srv->nd < count; srv->nd++) {
		struct loop *lp = &srv->loops[srv->nd];
		lp->srv = srv;
		atomic_init(&lp->conns, 0);
		lp->d = start_loop(srv, lp, limit);
		if (!lp->d) {
			gfs_error_set(err, GFS_ELOCAL, "cannot start the HTTP event threads");
			return false;
		}
	}
	if (!open_listener(srv, err))
		return false;
	acceptor *a = acceptor_start(srv->listen_fd, on_accept, on_accept_limit, srv, err);
	atomic_store(&srv->acceptor, a);
	if (!a && c->listen_fd >= 0)
		gfs_error_set(err, GFS_ELOCAL, "cannot serve on the inherited socket (fd %d)", c->listen_fd);
	return a != NULL;
}

static void
stop_accepting(struct httpserve *srv)
{
	acceptor_stop(atomic_load(&srv->acceptor));
	if (srv->listen_fd >= 0)
		close(srv->listen_fd);
	srv->listen_fd = -1;
}

/* The acceptor goes last: closing connections tell it to resume until then. */
static void
stop_daemons(struct httpserve *srv)
{
	stop_accepting(srv);
	for (unsigned i = 0; i < srv->nd; i++)
		MHD_stop_daemon(srv->loops[i].d);
	srv->nd = 0;
	acceptor_free(atomic_exchange(&srv->acceptor, NULL));
}

/* Listening already: the pass fills the caches behind requests answered from the backend. */
static void
start_preload(struct httpserve *srv)
{
	atomic_store(&srv->preload_state, HTTPSERVE_PRELOAD_RUNNING);
	srv->preloader_started = pthread_create(&srv->preloader, NULL, preload_main, srv) == 0;
	if (srv->preloader_started)
		return;
	atomic_store(&srv->preload_state, HTTPSERVE_PRELOAD_FAILED);
	logf_(srv, "preload stopped early: cannot start its thread; files are read when asked for");
	if (srv->cfg.preloaded)
		srv->cfg.preloaded(false, 0, 0);
}

httpserve *
httpserve_start(gfs_conn *conn, const struct httpserve_config *cfg, gfs_error *err)
{
	struct httpserve *srv = gfs_xcalloc(1, sizeof *srv);
	srv->listen_fd = -1;
	srv->cfg = *cfg;
	srv->access_log = cfg->access_log;
	srv->conn = conn;
	srv->prefix = gfs_prefix_normalize(cfg->prefix);
	srv->index = name_index_new(srv->prefix);
	srv->cache = http_cache_new(cfg->cache_size, free_meta_cb);
	srv->inflight = strmap_new(256);
	if (srv->cfg.stream_threshold > cfg->cache_size / 8)
		srv->cfg.stream_threshold = cfg->cache_size / 8;
	pthread_mutex_init(&srv->jobs_mu, NULL);
	pthread_cond_init(&srv->jobs_cv, NULL);
	pthread_mutex_init(&srv->poll_mu, NULL);
	pthread_cond_init(&srv->poll_cv, NULL);
	pthread_mutex_init(&srv->active_mu, NULL);
	pthread_cond_init(&srv->active_cv, NULL);
	pthread_mutex_init(&srv->log_mu, NULL);
	pthread_mutex_init(&srv->guard_mu, NULL);
	pthread_cond_init(&srv->guard_cv, NULL);
	pthread_mutex_init(&srv->preload_mu, NULL);
	pthread_cond_init(&srv->preload_cv, NULL);
	srv->per_ip = strmap_new(256);
	atomic_init(&srv->last_emfile_log_ms, 0);
	atomic_init(&srv->last_mhd_log_ms, 0);
	srv->r400 = text_response(body400, 400);
	srv->r404 = text_response(body404, 404);
	srv->r405 = text_response(body405, 405);
	srv->r500 = text_response(body500, 500);
	srv->r503 = text_response(body503, 503);
	srv->r503busy = text_response(body503busy, 503);
	if (cfg->cache_dir) {
		srv->tier = disktier_open(cfg->cache_dir, cfg->cache_dir_size, cfg->log, err);
		if (!srv->tier) {
			free_server(srv);
			return NULL;
		}
		/* A quarter of the descriptors at most: connections need the rest. */
		struct rlimit rl;
		rlim_t n = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur / 4 : 256;
		n = n > OPEN_ENTRIES_MAX ? OPEN_ENTRIES_MAX : n;
		if (MHD_is_feature_supported(MHD_FEATURE_RESPONSES_SHARED_FD) == MHD_YES)
			srv->open = http_cache_new((size_t)n * (HTTP_CACHE_ENTRY_OVERHEAD + sizeof(struct kept)),
			    free_meta_cb);
		srv->seen_window = n > 64 ? (unsigned)n : 64;
	}

	gfs_session *ses = gfs_session_pop(conn);
	gfs_error lerr;
	gfs_error_clear(&lerr);
	int64_t t0 = mono_us();
	bool loaded = name_index_load(srv->index, ses, &lerr);
	atomic_store(&srv->reload_us, mono_us() - t0);
	atomic_store(&srv->poll_interval_ms, cfg->poll_ms);
	if (!loaded) {
		atomic_store(&srv->backend_down, true);
		logf_(srv, "cannot load the index yet (will retry): %s", lerr.msg);
	}
	gfs_session_push(ses);
	if (srv->tier && loaded)
		disktier_reconcile(srv->tier, srv->index);
	srv->workers = gfs_xcalloc(cfg->workers, sizeof *srv->workers);
	for (; srv->nworkers < cfg->workers; srv->nworkers++)
		if (pthread_create(&srv->workers[srv->nworkers], NULL, worker_main, srv) != 0)
			break;
	srv->poller_started = pthread_create(&srv->poller, NULL, poller_main, srv) == 0;
	srv->guard_started = pthread_create(&srv->guard, NULL, guard_main, srv) == 0;
	if (srv->nworkers == 0 || !srv->poller_started || !srv->guard_started) {
		gfs_error_set(err, GFS_ELOCAL, "cannot start threads");
		stop_threads(srv);
		free_server(srv);
		return NULL;
	}
	if (!start_daemons(srv, err)) {
		stop_daemons(srv);
		stop_threads(srv);
		free_server(srv);
		return NULL;
	}
	if (cfg->preload)
		start_preload(srv);
	return srv;
}

enum httpserve_preload
httpserve_preload_state(httpserve *srv)
{
	return (enum httpserve_preload)atomic_load(&srv->preload_state);
}

const char *
httpserve_preload_word(enum httpserve_preload state)
{
	static const char *const words[] = {
		[HTTPSERVE_PRELOAD_OFF] = NULL, [HTTPSERVE_PRELOAD_RUNNING] = "running",
		[HTTPSERVE_PRELOAD_DONE] = "done", [HTTPSERVE_PRELOAD_FAILED] = "failed",
	};
	return words[state];
}

unsigned
httpserve_port(httpserve *srv)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	if (srv->listen_fd < 0 || getsockname(srv->listen_fd, (struct sockaddr *)&ss, &len) != 0)
		return srv->cfg.port;
	if (ss.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

FILE *
httpserve_set_access_log(httpserve *srv, FILE *log)
{
	pthread_mutex_lock(&srv->log_mu);
	FILE *old = srv->access_log;
	if (old)
		fflush(old);
	srv->access_log = log;
	pthread_mutex_unlock(&srv->log_mu);
	return old;
}

void
httpserve_quiesce(httpserve *srv)
{
	if (srv->quiesced)
		return;
	srv->quiesced = true;
	/*
	 * Our own socket's queue dies with it, so take it first (at most what
	 * it can hold: it keeps filling until the close). An inherited one
	 * stays open in the process that passed it, for the next server.
	 */
	if (srv->cfg.listen_fd < 0)
		acceptor_drain(atomic_load(&srv->acceptor), LISTEN_BACKLOG);
	stop_accepting(srv);
}

bool
httpserve_drain(httpserve *srv, int timeout_ms)
{
	struct timespec ts;
	gfs_deadline_in(&ts, timeout_ms);
	atomic_store(&srv->draining, true);
	pthread_mutex_lock(&srv->active_mu);
	int rc = 0;
	/*
	 * Requests in progress, and connections accepted whose request may still
	 * be on its way: closing those unanswered would fail a client that did
	 * nothing wrong (seen under ab -c 25 during a supervised restart).
	 */
	while ((atomic_load(&srv->active) > 0 || atomic_load(&srv->unanswered_connections) > 0) && rc == 0)
		rc = pthread_cond_timedwait(&srv->active_cv, &srv->active_mu, &ts);
	bool drained = atomic_load(&srv->active) == 0 && atomic_load(&srv->unanswered_connections) == 0;
	pthread_mutex_unlock(&srv->active_mu);
	return drained;
}

void
httpserve_stop(httpserve *srv)
{
	if (!srv)
		return;
	/* Workers answer what is queued with 503 and resume every waiting connection first. */
	stop_threads(srv);
	stop_daemons(srv);
	if (srv->access_log)
		fflush(srv->access_log);
	free_server(srv);
}
