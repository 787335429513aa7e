/*
 * Streaming: a file above the stream threshold goes to its client chunk
 * by chunk, in windows read ahead up to STREAM_BUFFER_BYTES, never whole
 * in memory. A worker pushes buffers (stream_push) and libmicrohttpd pulls
 * them (stream_read), the connection suspended while the buffer is empty.
 * The tee checks a whole stream's digest as it goes and fills the disk
 * tier; a stream whose revision disappears or whose content fails the
 * integrity rule is cut off, never completed with wrong bytes. The stream
 * and its reading are here; the job that runs it on a worker is jobs.c's
 * (start_stream, stream_chunks), which calls down into this file.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* ---- streaming ------------------------------------------------------- */

void
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

void
stream_free_cb(void *cls)
{
	struct stream *s = cls;
	pthread_mutex_lock(&s->mu);
	s->cancelled = true;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	stream_unref(s);
}

/* r's stream of m (its range, else all of m), referenced by r and by its producer. */
struct stream *
stream_new(struct req *r, const gfs_meta *m)
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
	return s;
}

/* Called once the first window is in: the response takes the request's reference. */
enum MHD_Result
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

void
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

void
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
bool
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
bool
tee_release(struct stream *s, struct tee *t)
{
	bool ok = !t->held || stream_push(s, t->held, t->held_len);
	free(t->held);
	t->held = NULL;
	return ok;
}

void
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
bool
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
void
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
void
cut_damaged(struct stream *s, int64_t sent, gfs_error *err)
{
	pthread_mutex_lock(&s->mu);
	s->damaged = true;
	pthread_mutex_unlock(&s->mu);
	size_t n = strlen(err->msg);
	snprintf(err->msg + n, sizeof err->msg - n, "; connection cut off after %lld of %lld bytes",
	         (long long)sent, (long long)(s->last - s->first + 1));
}
