/*
 * The responses every part sends: the canned statuses (400, 404, 405,
 * 500, 503) made once at start, the headers every file's response carries
 * (add_file_headers: a new one goes there), a cached body's 200
 * (body_response), the Content-Range of a range, and queueing one for a
 * request, which records its status and body bytes for the access log.
 * It decides nothing: which response a request gets is requests.c's
 * (and jobs.c's and stream.c's, once a job ends).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

char *
strdup_or_empty(const char *s)
{
	return gfs_xstrdup(s ? s : "");
}

/* libmicrohttpd makes no response only when memory runs out; give up then, as gfs_xcalloc does. */
struct MHD_Response *
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

void
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
struct MHD_Response *
body_response(struct httpserve *srv, const gfs_meta *m, http_cache_body *b)
{
	struct MHD_Response *r = made(MHD_create_response_from_buffer_with_free_callback_cls(
	    b->len, b->data, http_cache_body_release_cb, http_cache_body_ref(b)));
	add_file_headers(srv, r, m, true);
	return r;
}

/* Queues resp, which other requests share (ours stays), with status for r. */
enum MHD_Result
queue_shared(struct req *r, unsigned status, struct MHD_Response *resp, uint64_t body_bytes)
{
	r->status = status;
	r->body_bytes = r->head ? 0 : body_bytes;
	return MHD_queue_response(r->conn, status, resp);
}

/* Queues a response made for this request only, and drops our reference to it. */
enum MHD_Result
queue_once(struct req *r, unsigned status, struct MHD_Response *resp, uint64_t body_bytes)
{
	if (!resp)
		return MHD_NO;
	enum MHD_Result ret = queue_shared(r, status, resp, body_bytes);
	MHD_destroy_response(resp);
	return ret;
}

static const char body400[] = "400 Bad Request\n", body404[] = "404 Not Found\n",
                  body405[] = "405 Method Not Allowed\n", body500[] = "500 Internal Server Error\n",
                  body503[] = "503 Service Unavailable\n",
                  body503busy[] = "503 Service Unavailable: too many fetches waiting\n";

void
make_status_responses(struct httpserve *srv)
{
	srv->r400 = text_response(body400, 400);
	srv->r404 = text_response(body404, 404);
	srv->r405 = text_response(body405, 405);
	srv->r500 = text_response(body500, 500);
	srv->r503 = text_response(body503, 503);
	srv->r503busy = text_response(body503busy, 503);
}

enum MHD_Result
send_status(struct req *r, unsigned status)
{
	struct httpserve *srv = r->srv;
	switch (status) {
	case 400: return queue_shared(r, status, srv->r400, sizeof body400 - 1);
	case 404: return queue_shared(r, status, srv->r404, sizeof body404 - 1);
	case 405: return queue_shared(r, status, srv->r405, sizeof body405 - 1);
	case 503: return queue_shared(r, status, srv->r503, sizeof body503 - 1);
	default: return queue_shared(r, 500, srv->r500, sizeof body500 - 1);
	}
}

enum MHD_Result
send_busy(struct req *r)
{
	atomic_fetch_add(&r->srv->queue_full, 1);
	return queue_shared(r, 503, r->srv->r503busy, sizeof body503busy - 1);
}

void
add_content_range(struct MHD_Response *resp, const struct req *r, const gfs_meta *m)
{
	char cr[96];
	snprintf(cr, sizeof cr, "bytes %lld-%lld/%lld", (long long)r->first, (long long)r->last,
	         (long long)m->length);
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
}
