/*
 * The job queue and the workers. A job is a fetch (a body into the memory
 * cache, and the disk tier), a lookup (a name or id the index does not
 * hold) or a stream (stream.c). Requests for the same key join the job in
 * flight (srv->inflight) instead of queueing another; beyond queue_max,
 * 503. Each worker has its own backend session; a finished job resumes
 * its waiting connections, whose on_request then answers them. A
 * stream's job is started here too (start_stream) and reads through
 * stream.c, below this file.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- jobs ------------------------------------------------------------ */

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

/*
 * Attaches r to the job for key, starting one when none is in flight, and
 * suspends the connection. Suspension happens under jobs_mu so that the
 * worker's resume can only come after it: a worker may take the job at
 * once, but hands it back only through resume_waiters.
 */
enum MHD_Result
wait_for_job(struct req *r, struct job *proto)
{
	struct httpserve *srv = r->srv;
	pthread_mutex_lock(&srv->jobs_mu);
	struct job *j = proto->key ? strmap_get(srv->inflight, proto->key) : NULL;
	/* stop_threads sets stopping under jobs_mu, then closes: an offer here meets an open queue. */
	if (!j && (srv->stopping || !gfs_workq_offer(srv->jobs, proto, 0))) {
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
	}
	r->next_waiter = j->waiters;
	j->waiters = r;
	r->phase = PHASE_WAITING;
	MHD_suspend_connection(r->conn);
	pthread_mutex_unlock(&srv->jobs_mu);
	return MHD_YES;
}

enum MHD_Result
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

enum MHD_Result
start_lookup(struct req *r, const char *name, int rev, const char *id_key, const char *key)
{
	struct job *j = gfs_xcalloc(1, sizeof *j);
	j->kind = JOB_LOOKUP;
	j->key = strdup_or_empty(key);
	j->name = name ? strdup_or_empty(name) : NULL;
	j->rev = rev;
	j->id_key = id_key ? strdup_or_empty(id_key) : NULL;
	return wait_for_job(r, j);
}

/*
 * The stream's producer runs on a worker while the connection waits, as a
 * fetch's does: its status is sent only once the first window is read, so
 * that a backend that cannot answer gets a 503, not a 200 cut off.
 */
enum MHD_Result
start_stream(struct req *r, gfs_meta *m)
{
	struct job *j = gfs_xcalloc(1, sizeof *j);
	j->kind = JOB_STREAM;
	j->meta = gfs_meta_ref(m);
	j->stream = stream_new(r, m);
	j->request = gfs_xasprintf("%s %.*s", r->method, (int)r->target_len, (const char *)r->target);
	return wait_for_job(r, j);
}

/* ---- worker side ----------------------------------------------------- */

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
			serve_logf(srv, "backend unreachable, answering 503 for files not in the cache: %s", err->msg);
		return 503;
	case GFS_ECANCELED:
		return 503;
	default:
		serve_logf(srv, "%s", err->msg);
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

/*
 * Read from a secondary, a file that looks damaged or missing may only be
 * behind the primary (docs/scale-out.md): a session on the primary to read
 * it again on, counted, whose word goes; NULL when there is none to ask
 * (ses reads the primary, err is the backend's or a stop), or none answers
 * (err then says why).
 */
static gfs_session *
primary_for(struct httpserve *srv, gfs_session *ses, gfs_error *err)
{
	if (!gfs_session_may_lag(ses, err))
		return NULL;
	gfs_session *p = gfs_session_primary(ses, err);
	if (p)
		atomic_fetch_add(&srv->primary_rereads, 1);
	return p;
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

http_cache_entry *
memcache_insert(struct httpserve *srv, gfs_meta *m, http_cache_body *b)
{
	struct MHD_Response *resp = body_response(srv, m, b);
	return http_cache_put(srv->cache, m->cache_key, b, resp, gfs_meta_ref(m));
}

/* Reads m whole into b, checked by the integrity rule. */
static bool
read_body(gfs_session *ses, const gfs_meta *m, http_cache_body *b, gfs_error *err)
{
	gfs_file f;
	gfs_meta_file(m, &f);
	struct copy_state cs = {b, 0};
	gfs_error_clear(err);
	if (!gfs_read(ses, &f, true, copy_chunk, &cs, NULL, err))
		return false;
	if (cs.off == b->len)
		return true;
	gfs_error_set(err, GFS_EWRONGSIZE, "%s: short read", m->key);
	return false;
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
	http_cache_body *b = http_cache_body_new((size_t)m->length);
	gfs_error err;
	int64_t t0 = mono_us();
	bool ok = read_body(ses, m, b, &err);
	gfs_session *p = ok ? NULL : primary_for(srv, ses, &err);
	if (p)
		ok = read_body(p, m, b, &err);
	observe_latency(srv, mono_us() - t0);
	if (!ok) {
		http_cache_body_unref(b);
		if (err.code == GFS_ECHECKSUM)
			atomic_fetch_add(&srv->integrity_failures, 1);
		*status = read_failure_status(srv, p ? p : ses, m, &err);
		gfs_session_push(p);
		return NULL;
	}
	gfs_session_push(p);
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
stream_chunks(struct httpserve *srv, gfs_session *ses, struct job *j, struct tee *tee,
              gfs_session **primary)
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
		/* A revision's chunks never change: the primary's follow the secondary's sent. */
		if (!ok && !*primary && (*primary = primary_for(srv, ses, &err)))
			ok = stream_window(ses = *primary, m, s, tee, next, w1, &next, &err);
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
	gfs_session *primary = NULL;
	bool ok = j->meta->length <= 0 || stream_chunks(srv, ses, j, &tee, &primary);
	gfs_session_push(primary);
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

void *
worker_main(void *arg)
{
	struct httpserve *srv = arg;
	gfs_session *ses = gfs_session_pop(srv->conn);
	struct job *j;
	/* Once stopping, what is still queued is answered 503, then the closed queue ends the loop. */
	while ((j = gfs_workq_pop(srv->jobs)) != NULL)
		run_job(srv, ses, j, atomic_load(&srv->stopping));
	gfs_session_push(ses);
	return NULL;
}
