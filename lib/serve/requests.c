/*
 * Requests, from their URI to their answer. libmicrohttpd calls on_uri,
 * then on_request (perhaps again after a resume), then on_completed.
 * on_request routes (/_health, /_metrics, /id/<hex>, /<name>) and answers
 * from the name index and the caches on the event thread: conditional
 * requests, ranges, HEAD, the disk tier's descriptors and the entries kept
 * open. What needs the backend becomes a job (jobs.c) or a stream
 * (stream.c), and its answer is sent here once it resumes. A new rule for
 * one request goes here (serve_meta, serve_body, on_request); the
 * responses themselves are made in reply.c. The top of the request side:
 * only loop.c, which hands these callbacks to libmicrohttpd, is above it.
 */
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h"

/* ---- responses ------------------------------------------------------- */

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


static enum MHD_Result
send_entry(struct req *r)
{
	http_cache_entry *e = r->entry;
	gfs_meta *m = e->user;
	if (!r->range)
		return queue_shared(r, MHD_HTTP_OK, e->resp, e->body->len);
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
	return queue_shared(r, MHD_HTTP_OK, r->open_entry->resp, (uint64_t)m->length);
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
		serve_logf(r->srv, "%s: malformed files document: %s", m->name, m->bad);
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

enum MHD_Result
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
			r->referer = ref ? strdup_or_empty(ref) : NULL;
			r->agent = ua ? strdup_or_empty(ua) : NULL;
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

/* libmicrohttpd calls this first for every request, with the raw URI. */
void *
on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
	struct httpserve *srv = cls;
	struct req *r = gfs_xcalloc(1, sizeof *r);
	r->srv = srv;
	r->conn = conn;
	if (srv->cfg.access_log) {
		r->uri = strdup_or_empty(uri);
		r->start_ms = gfs_now_ms();
	}
	r->bad_target = http_uri_has_nul(uri);
	r->target = (uintptr_t)uri;
	r->target_len = strlen(uri);
	atomic_fetch_add(&srv->active, 1);
	note_request(srv, conn);
	return r;
}

void
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
