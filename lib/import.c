/* import: the pipeline described in import.h. */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "import.h"
#include "lock.h"
#include "magic.h"
#include "markers.h"
#include "filename.h"
#include "strmap.h"
#include "workq.h"

/* Files waiting in the queue per worker: enough to keep workers busy, small in memory. */
#define QUEUE_PER_JOB 64
/* Files whose documents wait for one flush, at most: bounds memory with many tiny files. */
#define MAX_PENDING 2000
/* Names or markers handled per batch (lookups, then one removal). */
#define IN_BATCH 500
/* Chunks per bulk insert, at most: with a tiny --chunk-size, bytes alone allow millions. */
#define MAX_BATCH_CHUNKS 10000
/*
 * A file modified this close to (or after) the start of its read may change
 * again within the same timestamp tick (coarse kernel ticks; 2 s on FAT,
 * server rounding on NFS) without its size or mtime changing.
 */
#define RACY_WINDOW_NS 2000000000LL
#define TOO_MANY_CHUNKS \
	"needs more than 2147483648 chunks, GridFS's limit; use a larger --chunk-size"

/* ---- the table of names: existing files and names seen by the walk --- */

/* A name's state, the value of imp->names; the map holds the name itself. */
struct entry {
	bool existing;        /* a files document has this name */
	bool seen;            /* the walk produced this name */
	bool link_dir;        /* a symlink to a directory, not followed: names below it exist */
	int64_t length;       /* of the newest revision */
	int64_t upload_ms;
	bson_oid_t oid;       /* its _id, when an ObjectId: breaks uploadDate ties */
	bool has_oid;
	int64_t mtime_ns;     /* meaningful only with has_mtime: before 1970 it is negative */
	bool has_mtime;
	bool mtime_ms_only;   /* only metadata.mtime (ms) was stored */
	bool racy;            /* metadata.mtimeRacy: size and mtime prove nothing */
	char sha[65];
	/*
	 * A files document of this name is malformed: reported, and never a
	 * reason to delete the name (--delete leaves it, trimming leaves the
	 * malformed revisions); a malformed newest revision is never current.
	 */
	bool malformed;
};

/* The entry of name, made empty when there is none. */
static struct entry *
entry_get(strmap *names, const char *name)
{
	void **slot = strmap_slot(names, name, strlen(name));
	if (!*slot)
		*slot = gfs_xcalloc(1, sizeof(struct entry));
	return *slot;
}

static void
entry_free(const char *name, void *e, void *ctx)
{
	(void)name;
	(void)ctx;
	free(e);
}

/* ---- the queue between the walk and the workers ---------------------- */

struct job {
	char *rel;            /* path bytes relative to the directory */
	size_t rel_len;
	char *name;           /* the GridFS filename */
	bool escaped;         /* rel was not UTF-8: store metadata.rawName */
	bool replacing;       /* the name exists */
	char old_sha[65];     /* the stored sha256 to compare with (checksum mode, racy state) */
	bool settle;          /* racy state: once found the same, clear the flag on old_id */
	bson_oid_t old_id;
	struct stat st;
};

static void
job_free(struct job *j)
{
	if (!j)
		return;
	free(j->rel);
	free(j->name);
	free(j);
}

static void
job_drop(void *j)
{
	job_free(j);
}

/* ---- the import ------------------------------------------------------ */

struct gfs_import {
	gfs_conn *conn;
	gfs_import_opts o;
	char *prefix;             /* normalized */
	char *uploads_name;       /* <bucket>.gridfsctl_uploads */
	char owner[300];
	int root_fd;
	int32_t chunk_size;
	atomic_bool cancel;
	atomic_bool fatal;
	pthread_mutex_t mu;       /* guards stats, fatal_err and event calls */
	gfs_error fatal_err;
	gfs_import_stats st;
	strmap *names;            /* stored names and names the walk saw: struct entry */
	gfs_workq *q;             /* the walk's jobs for the workers, closed after the walk */
	gfs_lock *lock;
	char *lock_name;          /* the import lock of the prefix (lib/lock.h) */
	double started;
	bool content_decides;     /* gfs_import_paths: the file being queued was seen written */
};

/* Calls the event callback, with the bytes stored or -1; the caller holds imp->mu. */
static void
emit_bytes_locked(gfs_import *imp, enum gfs_import_event_kind kind, const char *path,
                  const char *name, const char *reason, int64_t bytes)
{
	if (!imp->o.on_event)
		return;
	imp->st.seconds = gfs_mono_seconds() - imp->started;
	gfs_import_event ev = {kind, imp->o.dry_run, path, name, reason, &imp->st, bytes};
	imp->o.on_event(&ev, imp->o.ctx);
}

static void
emit_locked(gfs_import *imp, enum gfs_import_event_kind kind, const char *path, const char *name,
            const char *reason)
{
	emit_bytes_locked(imp, kind, path, name, reason, -1);
}

static void
notice(gfs_import *imp, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
notice(gfs_import *imp, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&imp->mu);
	emit_locked(imp, GFS_IMPORT_NOTICE, NULL, NULL, msg);
	pthread_mutex_unlock(&imp->mu);
}

/* A failure before the file got anywhere near the database. */
static void
file_failed(gfs_import *imp, const char *rel, const char *name, bool queued, uint64_t size,
            const char *reason)
{
	pthread_mutex_lock(&imp->mu);
	imp->st.failed++;
	if (queued) {
		imp->st.done_files++;
		imp->st.done_bytes += size;
	}
	emit_locked(imp, GFS_IMPORT_FAILED, rel, name, reason);
	pthread_mutex_unlock(&imp->mu);
}

static void
set_fatal(gfs_import *imp, const gfs_error *err)
{
	pthread_mutex_lock(&imp->mu);
	if (!atomic_load(&imp->fatal))
		imp->fatal_err = *err;
	atomic_store(&imp->fatal, true);
	pthread_mutex_unlock(&imp->mu);
}

/* False, with err set, once the import lock may be another's: the next write must not go out. */
static bool
lock_held(gfs_import *imp, gfs_error *err)
{
	if (!gfs_lock_lost(imp->lock))
		return true;
	gfs_error_set(err, GFS_EBUSY,
	              "lost the import lock (its lease ran out or it was taken over); stopped "
	              "before writing more");
	return false;
}

static bool
stopping(gfs_import *imp)
{
	return atomic_load(&imp->cancel) || atomic_load(&imp->fatal);
}

gfs_import *
gfs_import_new(gfs_conn *conn, const gfs_import_opts *opts)
{
	gfs_import *imp = gfs_xcalloc(1, sizeof *imp);
	imp->conn = conn;
	imp->o = *opts;
	if (imp->o.jobs < 1)
		imp->o.jobs = 1;
	if (imp->o.keep_revisions < 0)
		imp->o.keep_revisions = 1;
	if (imp->o.batch_bytes == 0)
		imp->o.batch_bytes = GFS_IMPORT_DEFAULT_BATCH;
	imp->chunk_size = opts->chunk_size > 0 ? opts->chunk_size : GFS_DEFAULT_CHUNK_SIZE;
	imp->prefix = gfs_prefix_normalize(opts->prefix);
	imp->lock_name = gfs_lock_scoped_name(GFS_IMPORT_LOCK, imp->prefix);
	imp->uploads_name = bson_strdup_printf("%s.%s", gfs_conn_bucket(conn), GFS_UPLOADS_SUFFIX);
	char host[256] = "";
	gethostname(host, sizeof host - 1);
	snprintf(imp->owner, sizeof imp->owner, "%s/%ld", host, (long)getpid());
	imp->root_fd = -1;
	imp->names = strmap_new(1024);
	pthread_mutex_init(&imp->mu, NULL);
	imp->q = gfs_workq_new((size_t)imp->o.jobs * QUEUE_PER_JOB, 0);
	atomic_init(&imp->cancel, false);
	atomic_init(&imp->fatal, false);
	return imp;
}

void
gfs_import_cancel(gfs_import *imp)
{
	atomic_store(&imp->cancel, true);
}

void
gfs_import_free(gfs_import *imp)
{
	if (!imp)
		return;
	gfs_workq_free(imp->q, job_drop);
	if (imp->names)
		strmap_each(imp->names, entry_free, NULL);
	strmap_free(imp->names);
	pthread_mutex_destroy(&imp->mu);
	if (imp->root_fd >= 0)
		close(imp->root_fd);
	free(imp->prefix);
	free(imp->lock_name);
	bson_free(imp->uploads_name);
	free(imp);
}

/* ---- recovery of an interrupted run (the markers: lib/markers.h) ----- */

/*
 * Finishes what an interrupted import left: we hold the import lock of our
 * prefix, so every marker of an overlapping prefix (or of none) belongs to a
 * process that is gone; others' are left to their writers unless their
 * locks are free. Called again at
 * the end of the run (settle), when the writes those processes had in
 * flight have landed or never will: recovered uploads lose what landed, and
 * their markers go unless something had.
 */
static bool
recover(gfs_import *imp, gfs_session *s, bool settle, gfs_error *err)
{
	mongoc_collection_t *uploads =
	    mongoc_client_get_collection(s->client, gfs_conn_db(imp->conn), imp->uploads_name);
	size_t puts = 0;
	int64_t late = 0;
	uint64_t before = imp->st.recovered;
	size_t files = 0;
	/* Deletions first: their chunks have no files document to be found by. */
	bool ok = (settle || gfs_finish_deletions(s, imp->lock_name, &files, err)) &&
	          gfs_put_recover(s, &puts, err) &&
	          gfs_import_markers_recover(s, uploads, imp->lock_name, settle, &imp->st.recovered, &late,
	                                     err);
	imp->st.recovered += puts;
	if (files)
		notice(imp, "finished deleting %zu file%s an interrupted import or put had begun to delete",
		       files, files == 1 ? "" : "s");
	mongoc_collection_destroy(uploads);
	unsigned long long n = (unsigned long long)(imp->st.recovered - before);
	if (ok && n)
		notice(imp, "removed %llu unfinished upload%s left by an interrupted import or put", n,
		       n == 1 ? "" : "s");
	if (ok && late)
		notice(imp, "removed %lld chunk%s that landed after their upload was recovered%s",
		       (long long)late, late == 1 ? "" : "s", settle ? "; the next run looks again" : "");
	return ok;
}

/* ---- the existing state ---------------------------------------------- */

static bool
iter_int64(bson_iter_t *it, int64_t *out)
{
	if (!BSON_ITER_HOLDS_NUMBER(it))
		return false;
	*out = bson_iter_as_int64(it);
	return true;
}

static void
read_metadata(bson_iter_t *meta, struct entry *e)
{
	bson_iter_t it;
	int64_t v;
	e->has_mtime = false;
	e->mtime_ms_only = false;
	e->racy = false;
	e->sha[0] = '\0';
	if (!BSON_ITER_HOLDS_DOCUMENT(meta) || !bson_iter_recurse(meta, &it))
		return;
	int64_t ms = 0;
	bool has_ms = false;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "mtimeNs") == 0 && iter_int64(&it, &v)) {
			e->mtime_ns = v;
			e->has_mtime = true;
		} else if (strcmp(k, "mtime") == 0) {
			if (BSON_ITER_HOLDS_DATE_TIME(&it)) {
				ms = bson_iter_date_time(&it);
				has_ms = true;
			} else if (iter_int64(&it, &v)) {
				ms = v;
				has_ms = true;
			}
		} else if (strcmp(k, "mtimeRacy") == 0) {
			e->racy = bson_iter_as_bool(&it);
		} else if (strcmp(k, "sha256") == 0 && BSON_ITER_HOLDS_UTF8(&it)) {
			uint32_t len;
			const char *s = bson_iter_utf8(&it, &len);
			if (len == 64)
				memcpy(e->sha, s, 65);
		}
	}
	/* A date no file system can hold would overflow in nanoseconds: treat it as unknown. */
	if (!e->has_mtime && has_ms && ms <= INT64_MAX / 1000000 && ms >= INT64_MIN / 1000000) {
		e->mtime_ns = ms * 1000000;
		e->has_mtime = true;
		e->mtime_ms_only = true;
	}
}

static void
add_existing(gfs_import *imp, const bson_t *doc)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, doc, "filename") || !BSON_ITER_HOLDS_UTF8(&it))
		return;
	const char *name = bson_iter_utf8(&it, NULL);
	struct entry *e = entry_get(imp->names, name);
	gfs_error why;
	bool bad = gfs_doc_malformed(doc, &why);
	if (bad && !e->malformed) {
		e->malformed = true;
		file_failed(imp, NULL, name, false, 0, why.msg);
	}
	int64_t upload = 0, length = -1;
	bool has_oid = false;
	bson_oid_t oid;
	if (bson_iter_init_find(&it, doc, "uploadDate") && BSON_ITER_HOLDS_DATE_TIME(&it))
		upload = bson_iter_date_time(&it);
	if (bson_iter_init_find(&it, doc, "_id") && BSON_ITER_HOLDS_OID(&it)) {
		bson_oid_copy(bson_iter_oid(&it), &oid);
		has_oid = true;
	}
	/* Keep the newest revision: the one readers get. */
	if (e->existing && (upload < e->upload_ms ||
	                    (upload == e->upload_ms && (!has_oid || !e->has_oid ||
	                                                bson_oid_compare(&oid, &e->oid) < 0))))
		return;
	e->existing = true;
	e->upload_ms = upload;
	e->has_oid = has_oid;
	if (has_oid)
		bson_oid_copy(&oid, &e->oid);
	if (bson_iter_init_find(&it, doc, "length"))
		iter_int64(&it, &length);
	e->length = length;
	if (bson_iter_init_find(&it, doc, "metadata"))
		read_metadata(&it, e);
	else
		e->has_mtime = false, e->racy = false, e->sha[0] = '\0';
	/* A malformed newest revision is never what disk holds: the file is stored anew. */
	if (bad)
		e->length = -1, e->has_mtime = false, e->sha[0] = '\0';
}

/* What the state query reads of each files document. */
static void
state_projection(bson_t *opts)
{
	bson_t proj;
	BSON_APPEND_DOCUMENT_BEGIN(opts, "projection", &proj);
	BSON_APPEND_INT32(&proj, "filename", 1);
	BSON_APPEND_INT32(&proj, "length", 1);
	BSON_APPEND_INT32(&proj, "chunkSize", 1);
	BSON_APPEND_INT32(&proj, "uploadDate", 1);
	BSON_APPEND_INT32(&proj, "metadata.mtimeNs", 1);
	BSON_APPEND_INT32(&proj, "metadata.mtime", 1);
	BSON_APPEND_INT32(&proj, "metadata.mtimeRacy", 1);
	BSON_APPEND_INT32(&proj, "metadata.sha256", 1);
	bson_append_document_end(opts, &proj);
	BSON_APPEND_INT32(opts, "batchSize", 5000);
}

static bool
load_matching(gfs_import *imp, gfs_session *s, const bson_t *filter, const char *what,
              gfs_error *err)
{
	bson_t opts = BSON_INITIALIZER;
	state_projection(&opts);
	/*
	 * What need not be uploaded (and, with --delete, what goes) is decided
	 * from the primary: a lagging member would have an import store again
	 * what is stored, or miss what it must replace.
	 */
	mongoc_cursor_t *cur = gfs_primary_find(s->files, filter, &opts);
	const bson_t *doc;
	while (mongoc_cursor_next(cur, &doc))
		add_existing(imp, doc);
	bool ok = gfs_cursor_done(cur, what, err);
	bson_destroy(&opts);
	return ok;
}

static bool
load_existing(gfs_import *imp, gfs_session *s, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER;
	gfs_prefix_filter(&filter, imp->prefix);
	bool ok = load_matching(imp, s, &filter, "read the files under the prefix", err);
	bson_destroy(&filter);
	return ok;
}

/*
 * The state of one name, by equality, for gfs_import_paths: only for names
 * not known absent (opts.known), one by one, each while the workers store
 * the paths queued before it. A query for many names at once would save
 * round trips on MongoDB, but FerretDB pushes down only equality: an $in
 * of names, or a range of them, reads the whole files collection there,
 * and took seconds a batch at a few thousand files. Known names spare the
 * lookups on both: a burst of new files asks nothing.
 */
static bool
load_name(gfs_import *imp, gfs_session *s, const char *name, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&filter, "filename", name);
	bool ok = load_matching(imp, s, &filter, "read the state of a changed file", err);
	bson_destroy(&filter);
	return ok;
}

/* ---- workers --------------------------------------------------------- */

enum upload_state { UP_READING, UP_DONE, UP_FAILED };

struct upload {
	bson_value_t id;
	struct job *job;
	enum upload_state state;
	bool marked;              /* its marker is in the uploads collection */
	bool racy;                /* modified too close to its read for size and mtime to tell */
	int64_t length;
	char sha[65];
	char *content_type;
	struct stat st;           /* as read */
	char reason[300];
};

struct worker {
	gfs_import *imp;
	pthread_t thread;
	gfs_session *s;
	mongoc_collection_t *uploads;
	gfs_chunk_batch *batch;
	gfs_magic *magic;
	uint8_t *buf;
	struct upload **pending;
	size_t npending, cap;
};

static void
upload_free(struct upload *u)
{
	bson_value_destroy(&u->id);
	job_free(u->job);
	free(u->content_type);
	free(u);
}

static bool
insert_markers(struct worker *w, gfs_error *err)
{
	gfs_import *imp = w->imp;
	bson_t **docs = gfs_xcalloc(w->npending, sizeof *docs);
	size_t n = 0;
	int64_t now = gfs_now_ms();
	for (size_t i = 0; i < w->npending; i++) {
		struct upload *u = w->pending[i];
		if (u->marked)
			continue;
		docs[n++] = gfs_import_marker_new(&u->id, u->job->name, imp->o.keep_revisions, imp->owner,
		                                  imp->prefix[0] ? imp->lock_name : NULL, now);
	}
	bool ok = true;
	if (n) {
		bson_t opts = BSON_INITIALIZER;
		BSON_APPEND_BOOL(&opts, "ordered", false);
		bson_error_t berr;
		ok = mongoc_collection_insert_many(w->uploads, (const bson_t **)docs, n, &opts, NULL, &berr);
		if (!ok)
			gfs_error_from_bson(err, &berr, "insert upload markers");
		bson_destroy(&opts);
	}
	for (size_t i = 0; i < n; i++)
		bson_destroy(docs[i]);
	free(docs);
	if (ok)
		for (size_t i = 0; i < w->npending; i++)
			w->pending[i]->marked = true;
	return ok;
}

static void
files_doc(gfs_import *imp, const struct upload *u, int64_t now, bson_t *doc)
{
	const struct stat *st = &u->st;
	int64_t ns = gfs_stat_mtime_ns(st);
	bson_t meta = BSON_INITIALIZER;
	BSON_APPEND_DATE_TIME(&meta, "mtime", gfs_mtime_ms(ns));
	BSON_APPEND_INT64(&meta, "mtimeNs", ns);
	if (u->racy)
		BSON_APPEND_BOOL(&meta, "mtimeRacy", true);
	BSON_APPEND_INT64(&meta, "size", u->length);
	BSON_APPEND_INT32(&meta, "mode", (int32_t)(st->st_mode & 07777));
	if (u->job->escaped)
		BSON_APPEND_BINARY(&meta, GFS_RAWNAME_FIELD, BSON_SUBTYPE_BINARY,
		                   (const uint8_t *)u->job->rel, (uint32_t)u->job->rel_len);
	gfs_files_doc(doc, &u->id, u->job->name, u->length, imp->chunk_size, now, u->content_type,
	              u->sha, &meta);
	bson_destroy(&meta);
}

static bool
insert_files(struct worker *w, gfs_error *err)
{
	bson_t **docs = gfs_xcalloc(w->npending, sizeof *docs);
	size_t n = 0;
	int64_t now = gfs_now_ms();
	for (size_t i = 0; i < w->npending; i++) {
		if (w->pending[i]->state != UP_DONE)
			continue;
		docs[n] = bson_new();
		files_doc(w->imp, w->pending[i], now, docs[n++]);
	}
	bool ok = true;
	if (n) {
		bson_t opts = BSON_INITIALIZER;
		BSON_APPEND_BOOL(&opts, "ordered", false);
		bson_error_t berr;
		ok = mongoc_collection_insert_many(w->s->files, (const bson_t **)docs, n, &opts, NULL, &berr);
		if (!ok)
			gfs_error_from_bson(err, &berr, "insert files documents");
		bson_destroy(&opts);
	}
	for (size_t i = 0; i < n; i++)
		bson_destroy(docs[i]);
	free(docs);
	return ok;
}

/* After the files documents: old revisions go, failed uploads' chunks go, then their markers. */
static bool
finish_pending(struct worker *w, gfs_error *err)
{
	gfs_import *imp = w->imp;
	struct gfs_newrev *revs = gfs_xcalloc(w->npending + 1, sizeof *revs);
	struct gfs_idlist failed = {0}, finished = {0};
	size_t nrevs = 0;
	for (size_t i = 0; i < w->npending; i++) {
		struct upload *u = w->pending[i];
		if (u->state == UP_READING)
			continue;
		gfs_idlist_add(&finished, &u->id);
		if (u->state == UP_FAILED) {
			gfs_idlist_add(&failed, &u->id);
		} else if (u->job->replacing && imp->o.keep_revisions > 0) {
			revs[nrevs].name = u->job->name;
			bson_oid_copy(&u->id.value.v_oid, &revs[nrevs].id);
			revs[nrevs++].keep = imp->o.keep_revisions;
		}
	}
	bool ok = gfs_trim_revisions(w->s, imp->lock_name, revs, nrevs, err) &&
	          gfs_delete_each(w->s->chunks, NULL, "files_id", failed.v, failed.n, NULL,
	                          "remove chunks of failed files", err) &&
	          gfs_delete_each(w->uploads, NULL, "_id", finished.v, finished.n, NULL,
	                          "remove upload markers", err);
	gfs_idlist_free(&failed);
	gfs_idlist_free(&finished);
	free(revs);
	return ok;
}

static void
account_pending(struct worker *w)
{
	gfs_import *imp = w->imp;
	size_t keep = 0;
	pthread_mutex_lock(&imp->mu);
	for (size_t i = 0; i < w->npending; i++) {
		struct upload *u = w->pending[i];
		if (u->state == UP_READING) {
			w->pending[keep++] = u;
			continue;
		}
		imp->st.done_files++;
		imp->st.done_bytes += (uint64_t)u->job->st.st_size;
		if (u->state == UP_FAILED) {
			imp->st.failed++;
			emit_locked(imp, GFS_IMPORT_FAILED, u->job->rel, u->job->name, u->reason);
		} else {
			if (u->job->replacing)
				imp->st.replaced++;
			else
				imp->st.uploaded++;
			imp->st.bytes += (uint64_t)u->length;
			emit_bytes_locked(imp, u->job->replacing ? GFS_IMPORT_REPLACED : GFS_IMPORT_UPLOADED,
			                  u->job->rel, u->job->name, NULL, u->length);
		}
		upload_free(u);
	}
	pthread_mutex_unlock(&imp->mu);
	w->npending = keep;
}

/*
 * Sends what is batched: markers for files not yet marked, then the chunks,
 * then the documents of the files now complete, then the clean-up.
 */
static bool
flush(struct worker *w)
{
	gfs_error err;
	gfs_error_clear(&err);
	/*
	 * Each step can take long or be paused: once the lease may have run
	 * out, another import may have removed our chunks and markers, and
	 * a files document written then would name chunks that are gone.
	 */
	bool ok = lock_held(w->imp, &err) && insert_markers(w, &err) &&
	          lock_held(w->imp, &err) && gfs_chunk_batch_flush(w->batch, w->s, &err) &&
	          lock_held(w->imp, &err) && insert_files(w, &err) &&
	          lock_held(w->imp, &err) && finish_pending(w, &err);
	if (!ok) {
		set_fatal(w->imp, &err);
		return false;
	}
	account_pending(w);
	return true;
}

static bool
batch_full(const struct worker *w)
{
	return gfs_chunk_batch_bytes(w->batch) >= w->imp->o.batch_bytes ||
	       gfs_chunk_batch_count(w->batch) >= MAX_BATCH_CHUNKS;
}

static bool
flush_if_full(struct worker *w)
{
	if (!batch_full(w) && w->npending < MAX_PENDING)
		return true;
	return flush(w);
}

static struct upload *
upload_new(struct worker *w, struct job *j)
{
	struct upload *u = gfs_xcalloc(1, sizeof *u);
	u->id.value_type = BSON_TYPE_OID;
	bson_oid_init(&u->id.value.v_oid, NULL);
	u->job = j;
	GFS_GROW(w->pending, w->npending + 1, w->cap, 64);
	w->pending[w->npending++] = u;
	return u;
}

/*
 * How much to read next of a file whose size was size at open: one byte
 * past it is enough to tell that it grew, and a file growing while read
 * must not be read on and on.
 */
static size_t
read_len(const gfs_import *imp, off_t size, int64_t done)
{
	int64_t left = (int64_t)size + 1 - done;
	if (left <= 0)
		return 0;
	return left < imp->chunk_size ? (size_t)left : (size_t)imp->chunk_size;
}

/* Hashes the file (up to size + 1 bytes): 1 and the hex digest, 0 on a read error (errno set). */
static int
hash_file(struct worker *w, int fd, off_t size, char hex[65])
{
	gfs_sha256 *h = gfs_sha256_new();
	ssize_t r = 0;
	int64_t done = 0;
	size_t len;
	int rc = 1;
	while ((len = read_len(w->imp, size, done)) > 0 && (r = gfs_source_fd(w->buf, len, &fd)) > 0) {
		gfs_sha256_update(h, w->buf, (size_t)r);
		done += r;
	}
	if (r < 0)
		rc = 0;
	int saved = errno;
	gfs_sha256_final(h, hex);
	errno = saved;
	return rc;
}

static bool
same_file_state(const struct stat *a, const struct stat *b)
{
	return a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
	       a->st_mtim.tv_nsec == b->st_mtim.tv_nsec && a->st_ctim.tv_sec == b->st_ctim.tv_sec &&
	       a->st_ctim.tv_nsec == b->st_ctim.tv_nsec && a->st_ino == b->st_ino;
}

/*
 * "Racily clean", as git says: a file modified within RACY_WINDOW_NS of
 * the start of its read (or later, by a clock ahead of ours) may have
 * changed again after the read without a new size or mtime.
 */
static bool
racy_state(const struct stat *st, int64_t read_start_ns)
{
	return gfs_stat_mtime_ns(st) >= read_start_ns - RACY_WINDOW_NS;
}

/* The content proved the same long enough after its mtime: size and mtime can be trusted again. */
static bool
settle(struct worker *w, const struct job *j)
{
	gfs_error err;
	gfs_error_clear(&err);
	if (!lock_held(w->imp, &err)) {
		set_fatal(w->imp, &err);
		return false;
	}
	bson_t filter = BSON_INITIALIZER, update = BSON_INITIALIZER, unset;
	BSON_APPEND_OID(&filter, "_id", &j->old_id);
	BSON_APPEND_INT64(&filter, "metadata.mtimeNs", gfs_stat_mtime_ns(&j->st));
	BSON_APPEND_DOCUMENT_BEGIN(&update, "$unset", &unset);
	BSON_APPEND_UTF8(&unset, "metadata.mtimeRacy", "");
	bson_append_document_end(&update, &unset);
	bson_error_t berr;
	bool ok = mongoc_collection_update_one(w->s->files, &filter, &update, NULL, NULL, &berr);
	if (!ok) {
		gfs_error_from_bson(&err, &berr, "record an unchanged file's state");
		set_fatal(w->imp, &err);
	}
	bson_destroy(&filter);
	bson_destroy(&update);
	return ok;
}

static void
skip_unchanged(gfs_import *imp, struct job *j)
{
	pthread_mutex_lock(&imp->mu);
	imp->st.skipped++;
	imp->st.done_files++;
	imp->st.done_bytes += (uint64_t)j->st.st_size;
	emit_locked(imp, GFS_IMPORT_SKIPPED, j->rel, j->name, NULL);
	pthread_mutex_unlock(&imp->mu);
}

/* Reads the open file into the batch as upload u; false on a fatal (backend) error. */
static bool
read_into_batch(struct worker *w, int fd, struct upload *u)
{
	gfs_import *imp = w->imp;
	gfs_sha256 *h = gfs_sha256_new();
	int64_t n = 0;
	size_t len;
	gfs_sniff sn = {0};
	const void *head;
	size_t head_len;
	if (!u->content_type && imp->o.content_type)
		u->content_type = gfs_xstrdup(imp->o.content_type);
	while ((len = read_len(imp, u->st.st_size, u->length)) > 0) {
		ssize_t r = gfs_source_fd(w->buf, len, &fd);
		if (r < 0) {
			snprintf(u->reason, sizeof u->reason, "read: %s", strerror(errno));
			u->state = UP_FAILED;
			break;
		}
		if (!u->content_type &&
		    gfs_sniff_add(&sn, w->buf, (size_t)r, (size_t)r < len, &head, &head_len))
			u->content_type = gfs_xstrdup(gfs_magic_type(w->magic, head, head_len));
		if (r == 0)
			break;
		/* It grew past what on_walk checked. */
		if (n > INT32_MAX) {
			snprintf(u->reason, sizeof u->reason, "%s", TOO_MANY_CHUNKS);
			u->state = UP_FAILED;
			break;
		}
		gfs_sha256_update(h, w->buf, (size_t)r);
		gfs_chunk_batch_add(w->batch, &u->id, n++, w->buf, (size_t)r);
		u->length += r;
		if (batch_full(w) && !flush(w)) {
			gfs_sniff_free(&sn);
			gfs_sha256_final(h, u->sha);
			return false;
		}
		if ((size_t)r < len)
			break;
	}
	/* It ended on a whole read (or grew): type what was gathered. */
	if (!u->content_type && gfs_sniff_add(&sn, w->buf, 0, true, &head, &head_len))
		u->content_type = gfs_xstrdup(gfs_magic_type(w->magic, head, head_len));
	gfs_sniff_free(&sn);
	gfs_sha256_final(h, u->sha);
	return true;
}

static void
process(struct worker *w, struct job *j)
{
	gfs_import *imp = w->imp;
	int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (imp->o.walk.follow_symlinks ? 0 : O_NOFOLLOW);
	int fd = openat(imp->root_fd, j->rel, flags);
	struct stat before;
	char reason[300];
	if (fd < 0 || fstat(fd, &before) != 0) {
		snprintf(reason, sizeof reason, "%s: %s", errno == ENOENT ? "vanished" : "cannot open",
		         strerror(errno));
		if (fd >= 0)
			close(fd);
		file_failed(imp, j->rel, j->name, true, (uint64_t)j->st.st_size, reason);
		job_free(j);
		return;
	}
	if (!S_ISREG(before.st_mode)) {
		close(fd);
		file_failed(imp, j->rel, j->name, true, (uint64_t)j->st.st_size, "not a regular file");
		job_free(j);
		return;
	}
	/* O_NONBLOCK only kept a FIFO swapped in since the walk from hanging the open. */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	bool racy = racy_state(&before, gfs_clock_ns(CLOCK_REALTIME));
	if (j->old_sha[0] && before.st_size == j->st.st_size) {
		char hex[65];
		if (!hash_file(w, fd, before.st_size, hex)) {
			snprintf(reason, sizeof reason, "read: %s", strerror(errno));
			close(fd);
			file_failed(imp, j->rel, j->name, true, (uint64_t)j->st.st_size, reason);
			job_free(j);
			return;
		}
		if (strcmp(hex, j->old_sha) == 0) {
			close(fd);
			/* Settle only a state read well after its mtime, and the one stored. */
			bool settled = true;
			if (j->settle && !racy && gfs_stat_mtime_ns(&before) == gfs_stat_mtime_ns(&j->st))
				settled = settle(w, j);
			if (settled)
				skip_unchanged(imp, j);
			job_free(j);
			return;
		}
		lseek(fd, 0, SEEK_SET);
	}
	struct upload *u = upload_new(w, j);
	u->st = before;
	u->racy = racy;
	if (!read_into_batch(w, fd, u)) {
		close(fd);
		return;
	}
	struct stat after;
	if (u->state == UP_READING) {
		if (fstat(fd, &after) != 0 || !same_file_state(&before, &after) ||
		    u->length != (int64_t)before.st_size) {
			snprintf(u->reason, sizeof u->reason, "changed while being read; not stored");
			u->state = UP_FAILED;
		} else {
			u->state = UP_DONE;
		}
	}
	close(fd);
	flush_if_full(w);
}

static void *
worker_main(void *arg)
{
	struct worker *w = arg;
	gfs_import *imp = w->imp;
	struct job *j;
	while ((j = gfs_workq_pop(imp->q)) != NULL) {
		if (stopping(imp)) {
			job_free(j);   /* canceled: drop what has not started */
			continue;
		}
		process(w, j);
	}
	/* Files in flight are finished even when canceled, so a stop leaves nothing half-done. */
	if (!atomic_load(&imp->fatal) && w->npending)
		flush(w);
	return NULL;
}

static bool
workers_start(gfs_import *imp, struct worker *ws, gfs_error *err)
{
	for (int i = 0; i < imp->o.jobs; i++) {
		struct worker *w = &ws[i];
		w->imp = imp;
		if (!(w->magic = gfs_magic_open(err)))
			return false;
		w->s = gfs_session_pop(imp->conn);
		w->uploads = mongoc_client_get_collection(w->s->client, gfs_conn_db(imp->conn),
		                                          imp->uploads_name);
		w->batch = gfs_chunk_batch_new(imp->o.batch_bytes);
		w->buf = gfs_xmalloc((size_t)imp->chunk_size);
	}
	/* Signals go to the walking thread, which the caller set up to handle them. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (int i = 0; i < imp->o.jobs; i++)
		if (pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]) != 0)
			abort();
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return true;
}

static void
workers_free(struct worker *ws, int n)
{
	for (int i = 0; i < n; i++) {
		struct worker *w = &ws[i];
		for (size_t k = 0; k < w->npending; k++)
			upload_free(w->pending[k]);
		free(w->pending);
		gfs_chunk_batch_free(w->batch);
		if (w->uploads)
			mongoc_collection_destroy(w->uploads);
		gfs_session_push(w->s);
		gfs_magic_close(w->magic);
		free(w->buf);
	}
	free(ws);
}

/* ---- the walk -------------------------------------------------------- */

/* GridFS numbers chunks with an int32: a file needing more cannot be stored. */
static bool
too_many_chunks(const struct stat *st, int32_t chunk_size)
{
	return st->st_size > 0 && (st->st_size - 1) / chunk_size > INT32_MAX;
}

static bool
unchanged(const struct entry *e, const struct stat *st)
{
	if (e->length != (int64_t)st->st_size || !e->has_mtime)
		return false;
	int64_t ns = gfs_stat_mtime_ns(st);
	if (e->mtime_ms_only)
		return e->mtime_ns / 1000000 == gfs_mtime_ms(ns);
	return e->mtime_ns == ns;
}

/* Dry run with checksums: the walk hashes the file itself. */
static bool
dry_same_content(gfs_import *imp, const char *rel, const char *sha, bool *same, char *reason,
                 size_t len)
{
	/* As process() opens it: what was swapped in since the walk must not be followed or read. */
	int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (imp->o.walk.follow_symlinks ? 0 : O_NOFOLLOW);
	int fd = openat(imp->root_fd, rel, flags);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		snprintf(reason, len, "cannot open: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return false;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(reason, len, "not a regular file");
		close(fd);
		return false;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	struct worker w = {.imp = imp, .buf = gfs_xmalloc((size_t)imp->chunk_size)};
	char hex[65];
	bool ok = hash_file(&w, fd, st.st_size, hex) == 1;
	if (!ok)
		snprintf(reason, len, "read: %s", strerror(errno));
	free(w.buf);
	close(fd);
	*same = ok && strcmp(hex, sha) == 0;
	return ok;
}

static void
dry_run_file(gfs_import *imp, struct job *j)
{
	if (j->old_sha[0]) {
		bool same;
		char reason[300];
		if (!dry_same_content(imp, j->rel, j->old_sha, &same, reason, sizeof reason)) {
			file_failed(imp, j->rel, j->name, true, (uint64_t)j->st.st_size, reason);
			return;
		}
		if (same) {
			skip_unchanged(imp, j);
			return;
		}
	}
	pthread_mutex_lock(&imp->mu);
	if (j->replacing)
		imp->st.replaced++;
	else
		imp->st.uploaded++;
	imp->st.bytes += (uint64_t)j->st.st_size;
	imp->st.done_files++;
	imp->st.done_bytes += (uint64_t)j->st.st_size;
	emit_locked(imp, j->replacing ? GFS_IMPORT_REPLACED : GFS_IMPORT_UPLOADED, j->rel, j->name, NULL);
	pthread_mutex_unlock(&imp->mu);
}

static void
walk_failed(gfs_import *imp, const gfs_walk_entry *e, bool incomplete)
{
	pthread_mutex_lock(&imp->mu);
	imp->st.failed++;
	if (incomplete)
		imp->st.walk_errors = true;
	emit_locked(imp, GFS_IMPORT_FAILED, e->rel, NULL, e->reason);
	pthread_mutex_unlock(&imp->mu);
}

/* A path that is there but cannot be stored keeps its stored copy safe from --delete. */
static struct entry *
mark_seen(gfs_import *imp, const gfs_walk_entry *e)
{
	bool escaped;
	char *name = gfs_stored_name(imp->prefix, e->rel, e->rel_len, &escaped);
	struct entry *ent = entry_get(imp->names, name);
	ent->seen = true;
	free(name);
	return ent;
}

/*
 * A symlink not followed still leads to a file or a tree that is there:
 * its stored copies are not "gone from disk". A dangling link or a loop
 * leads nowhere and hides nothing, as with -L.
 */
static void
mark_link(gfs_import *imp, const gfs_walk_entry *e)
{
	struct stat st;
	if (fstatat(imp->root_fd, e->rel, &st, 0) != 0)
		return;
	mark_seen(imp, e)->link_dir = S_ISDIR(st.st_mode);
}

static bool
on_walk(const gfs_walk_entry *e, void *ctx)
{
	gfs_import *imp = ctx;
	if (stopping(imp))
		return false;
	switch (e->kind) {
	case GFS_WALK_SYMLINK: mark_link(imp, e); return true;
	/* A dangling link or a loop hides no file, so --delete can still trust the walk. */
	case GFS_WALK_ERROR: walk_failed(imp, e, !e->broken_link); return true;
	case GFS_WALK_SPECIAL: mark_seen(imp, e); walk_failed(imp, e, false); return true;
	case GFS_WALK_FILE: break;
	}
	pthread_mutex_lock(&imp->mu);
	imp->st.scanned++;
	pthread_mutex_unlock(&imp->mu);

	bool escaped;
	char *name = gfs_stored_name(imp->prefix, e->rel, e->rel_len, &escaped);
	char reason[300];
	if (strlen(name) > GFS_IMPORT_MAX_NAME) {
		snprintf(reason, sizeof reason, "name too long (%zu bytes, at most %d)", strlen(name),
		         GFS_IMPORT_MAX_NAME);
		file_failed(imp, e->rel, NULL, false, 0, reason);
		entry_get(imp->names, name)->seen = true;
		free(name);
		return true;
	}
	struct entry *ent = entry_get(imp->names, name);
	if (ent->seen) {
		snprintf(reason, sizeof reason,
		         "name collision: another path was already stored as '%s' (non-UTF-8 bytes are "
		         "written as %%XX)", name);
		file_failed(imp, e->rel, name, false, 0, reason);
		free(name);
		return true;
	}
	ent->seen = true;
	struct job *j = gfs_xcalloc(1, sizeof *j);
	j->rel = gfs_xmalloc(e->rel_len + 1);
	memcpy(j->rel, e->rel, e->rel_len + 1);
	j->rel_len = e->rel_len;
	j->name = name;
	j->escaped = escaped;
	j->st = *e->st;
	j->replacing = ent->existing;
	bool checksum = imp->o.checksum || imp->content_decides;
	bool same_state = ent->existing && unchanged(ent, e->st);
	if (same_state && !ent->racy && !checksum) {
		skip_unchanged(imp, j);
		job_free(j);
		return true;
	}
	if (too_many_chunks(e->st, imp->chunk_size)) {
		file_failed(imp, j->rel, j->name, false, 0, TOO_MANY_CHUNKS);
		job_free(j);
		return true;
	}
	/* A racy state is not trusted: the content decides, and settles it when the same. */
	bool recheck = same_state && ent->racy;
	if (ent->existing && (checksum || recheck) && ent->sha[0] &&
	    ent->length == (int64_t)e->st->st_size)
		memcpy(j->old_sha, ent->sha, 65);
	if (recheck && ent->has_oid && !ent->mtime_ms_only) {
		j->settle = true;
		bson_oid_copy(&ent->oid, &j->old_id);
	}
	pthread_mutex_lock(&imp->mu);
	imp->st.queued_files++;
	imp->st.queued_bytes += (uint64_t)e->st->st_size;
	pthread_mutex_unlock(&imp->mu);
	if (imp->o.dry_run) {
		dry_run_file(imp, j);
		job_free(j);
		return true;
	}
	if (imp->o.known)
		gfs_known_names_add(imp->o.known, j->name);
	/* The queue closes only once the walk is over: a push cannot fail. */
	if (!gfs_workq_push(imp->q, j, 0))
		abort();
	return true;
}

/* ---- --delete -------------------------------------------------------- */

static int
cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool
delete_batch(gfs_import *imp, gfs_session *s, mongoc_collection_t *uploads, const char **names,
             size_t n, gfs_error *err)
{
	if (!imp->o.dry_run) {
		if (!lock_held(imp, err))
			return false;
		/* By filename equality, name by name: see gfs_trim_revisions(). */
		struct gfs_idlist ids = {0};
		bool ok = true;
		for (size_t i = 0; ok && i < n; i++)
			ok = gfs_find_old_revisions_into(s, names[i], 0, NULL, &ids, err);
		ok = ok && gfs_delete_many(s, ids.v, ids.n, imp->lock_name, NULL, err);
		gfs_idlist_free(&ids);
		if (!ok)
			return false;
	}
	pthread_mutex_lock(&imp->mu);
	for (size_t i = 0; i < n; i++) {
		imp->st.deleted++;
		emit_locked(imp, GFS_IMPORT_DELETED, NULL, names[i], NULL);
	}
	pthread_mutex_unlock(&imp->mu);
	return true;
}

/* Whether a directory above name is a symlink the walk did not follow. */
static bool
under_link(const gfs_import *imp, const char *name)
{
	for (const char *slash = strchr(name, '/'); slash; slash = strchr(slash + 1, '/')) {
		const struct entry *e = strmap_getn(imp->names, name, (size_t)(slash - name));
		if (e && e->link_dir)
			return true;
	}
	return false;
}

/* Stored names the walk would have taken and did not see, and how many it would have taken. */
struct missing {
	const gfs_import *imp;
	const char **names;
	size_t n, cap, managed;
};

static void
collect_missing(const char *name, void *value, void *ctx)
{
	struct missing *m = ctx;
	const struct entry *e = value;
	if (!e->existing || e->malformed)
		return;
	/* Names the walk would not have taken (excluded, hidden, temporary) are left alone. */
	const char *rel = gfs_prefix_strip(m->imp->prefix, name);
	if (!rel || !*rel || !gfs_walk_path_selected(&m->imp->o.walk, rel))
		return;
	m->managed++;
	if (e->seen || under_link(m->imp, name))
		return;
	GFS_GROW(m->names, m->n + 1, m->cap, 64);
	m->names[m->n++] = name;
}

static bool
delete_missing(gfs_import *imp, gfs_session *s, gfs_error *err)
{
	struct missing m = {.imp = imp};
	strmap_each(imp->names, collect_missing, &m);
	const char **names = m.names;
	size_t n = m.n, managed = m.managed;
	/*
	 * Nothing to import while names are stored is what an unmounted file
	 * system or a mistyped DIR look like, and --delete would empty the prefix.
	 */
	if (n > 0 && imp->st.scanned == 0 && !imp->o.allow_empty) {
		imp->st.delete_refused = n;
		free(names);
		return true;
	}
	if (!gfs_max_delete_check(&imp->o.max_delete, n, managed, "import --delete", err)) {
		free(names);
		return false;
	}
	if (n > 0)
		qsort(names, n, sizeof *names, cmp_str);
	mongoc_collection_t *uploads =
	    mongoc_client_get_collection(s->client, gfs_conn_db(imp->conn), imp->uploads_name);
	bool ok = true;
	for (size_t i = 0; ok && i < n && !atomic_load(&imp->cancel); i += IN_BATCH)
		ok = delete_batch(imp, s, uploads, names + i, n - i < IN_BATCH ? n - i : IN_BATCH, err);
	mongoc_collection_destroy(uploads);
	free(names);
	return ok;
}

/* ---- run ------------------------------------------------------------- */

/*
 * This thread, the lock's heartbeat and every worker hold a pooled client
 * at once: with fewer allowed by the URI's maxPoolSize, mongoc would block
 * forever in mongoc_client_pool_pop. Use fewer workers, or refuse.
 */
static bool
fit_pool(gfs_import *imp, gfs_session *s, gfs_error *err)
{
	const mongoc_uri_t *uri = mongoc_client_get_uri(s->client);
	int32_t max = mongoc_uri_get_option_as_int32(uri, MONGOC_URI_MAXPOOLSIZE, 100);
	if (imp->o.dry_run || max >= imp->o.jobs + 2)
		return true;
	if (max < 3) {
		gfs_error_set(err, GFS_EINVAL,
		              "maxPoolSize=%d in the connection string is too small: import needs at "
		              "least 3 connections (one per --jobs worker, plus 2)", (int)max);
		return false;
	}
	notice(imp, "maxPoolSize=%d in the connection string allows %d worker%s, not %d",
	       (int)max, (int)max - 2, max == 3 ? "" : "s", imp->o.jobs);
	imp->o.jobs = (int)max - 2;
	return true;
}

/* Descriptors open now, counted in /proc/self/fd (the count's own one included). */
static long
open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return 3;
	long n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/*
 * Each worker holds a connection and a file it reads; the walk holds a
 * directory per level, the driver's monitor two connections, this thread
 * and the lock's heartbeat one each. With too few descriptors a connection
 * fails as if the backend were down ("Too many open files"): use fewer
 * workers, after raising the soft limit as far as the hard one allows.
 */
#define FDS_PER_WORKER 2
#define FDS_RESERVED 8

static bool
fit_fds(gfs_import *imp, gfs_error *err)
{
	struct rlimit rl;
	if (imp->o.dry_run || getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
		return true;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			getrlimit(RLIMIT_NOFILE, &rl);
	}
	if (rl.rlim_cur == RLIM_INFINITY)
		return true;
	long limit = (long)rl.rlim_cur, needed = open_fds() + FDS_RESERVED;
	long fit = (limit - needed) / FDS_PER_WORKER;
	if (fit >= imp->o.jobs)
		return true;
	if (fit < 1) {
		gfs_error_set(err, GFS_ELOCAL,
		              "the limit of %ld open file descriptors (ulimit -n) is too small for "
		              "import: it needs at least %ld", limit, needed + FDS_PER_WORKER);
		return false;
	}
	notice(imp, "the limit of %ld open file descriptors (ulimit -n) allows %ld worker%s, "
	       "not %d", limit, fit, fit == 1 ? "" : "s", imp->o.jobs);
	imp->o.jobs = (int)fit;
	return true;
}

static void
know_existing(const char *name, void *value, void *ctx)
{
	const struct entry *e = value;
	if (e->existing)
		gfs_known_names_add(ctx, name);
}

/* Numbered, so that watch can tell whether another import wrote since its last batch. */
static bool
take_lock(gfs_import *imp, gfs_error *err)
{
	imp->lock = gfs_lock_acquire_numbered(imp->conn, imp->lock_name, imp->o.lock_ttl, err);
	if (gfs_lock_note(imp->lock))
		notice(imp, "%s", gfs_lock_note(imp->lock));
	return imp->lock != NULL;
}

static bool
prepare(gfs_import *imp, gfs_session *s, gfs_error *err)
{
	imp->root_fd = open(imp->o.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (imp->root_fd < 0) {
		gfs_error_set(err, GFS_ELOCAL, "%s: %s", imp->o.dir, strerror(errno));
		return false;
	}
	if (!imp->o.dry_run) {
		if (!gfs_ensure_indexes(s, err))
			return false;
		if (!take_lock(imp, err))
			return false;
		if (!recover(imp, s, false, err))
			return false;
	}
	if (!load_existing(imp, s, err))
		return false;
	if (imp->o.known && !imp->o.dry_run) {
		gfs_known_names_begin(imp->o.known, gfs_lock_generation(imp->lock));
		strmap_each(imp->names, know_existing, imp->o.known);
	}
	return true;
}

bool
gfs_import_run(gfs_import *imp, gfs_import_stats *stats, gfs_error *err)
{
	imp->started = gfs_mono_seconds();
	gfs_error_clear(err);
	gfs_session *s = gfs_session_pop(imp->conn);
	bool ok = fit_pool(imp, s, err) && fit_fds(imp, err) && prepare(imp, s, err);
	struct worker *ws = NULL;
	int nworkers = 0;
	if (ok && !imp->o.dry_run) {
		ws = gfs_xcalloc((size_t)imp->o.jobs, sizeof *ws);
		nworkers = imp->o.jobs;
		ok = workers_start(imp, ws, err);
		if (!ok)
			nworkers = 0;
	}
	if (ok) {
		gfs_error werr;
		if (!gfs_walk(imp->o.dir, &imp->o.walk, on_walk, imp, &werr) && werr.code != GFS_ECANCELED) {
			*err = werr;
			ok = false;
		}
		gfs_workq_close(imp->q);
		for (int i = 0; i < nworkers; i++)
			pthread_join(ws[i].thread, NULL);
	}
	if (ws)
		workers_free(ws, imp->o.jobs);
	if (ok && atomic_load(&imp->fatal)) {
		*err = imp->fatal_err;
		ok = false;
	}
	if (ok && imp->o.delete_missing && !atomic_load(&imp->cancel)) {
		if (imp->st.walk_errors)
			notice(imp, "not deleting anything: parts of the directory could not be read");
		else
			ok = delete_missing(imp, s, err);
	}
	/* Stopped by --max-delete: what was uploaded is still finished properly. */
	gfs_error limit = {0};
	if (!ok && err->code == GFS_ELIMIT) {
		limit = *err;
		ok = true;
	}
	if (ok && imp->lock)
		ok = recover(imp, s, true, err);
	if (ok && limit.code) {
		*err = limit;
		ok = false;
	}
	if (ok && atomic_load(&imp->cancel)) {
		gfs_error_set(err, GFS_ECANCELED, "interrupted; run again to finish");
		ok = false;
	}
	gfs_lock_release(imp->lock);
	imp->lock = NULL;
	gfs_session_push(s);
	imp->st.seconds = gfs_mono_seconds() - imp->started;
	*stats = imp->st;
	return ok;
}

/* ---- named paths, for watch ------------------------------------------ */

/* One path of gfs_import_paths, handed to on_walk as the walk would have. */
static void
queue_path(gfs_import *imp, const gfs_import_path *p)
{
	struct stat st;
	gfs_walk_entry e = {.kind = GFS_WALK_FILE, .rel = p->rel, .rel_len = strlen(p->rel), .st = &st};
	int flags = imp->o.walk.follow_symlinks ? 0 : AT_SYMLINK_NOFOLLOW;
	if (fstatat(imp->root_fd, p->rel, &st, flags) != 0) {
		if (errno == ENOENT || errno == ENOTDIR)
			return; /* gone: its removal is news of its own */
		char reason[300];
		snprintf(reason, sizeof reason, "cannot look at it: %s", strerror(errno));
		e.kind = GFS_WALK_ERROR;
		e.reason = reason;
		walk_failed(imp, &e, false);
		return;
	}
	if (!S_ISREG(st.st_mode))
		return; /* a directory, a symlink not followed, a FIFO: nothing to store */
	imp->content_decides = p->changed;
	on_walk(&e, imp);
	imp->content_decides = false;
}

static char **
path_names(const gfs_import *imp, const gfs_import_path *paths, size_t n)
{
	char **names = gfs_xcalloc(n + 1, sizeof *names);
	for (size_t i = 0; i < n; i++) {
		bool escaped;
		names[i] = gfs_stored_name(imp->prefix, paths[i].rel, strlen(paths[i].rel), &escaped);
	}
	return names;
}

bool
gfs_import_paths(gfs_import *imp, const gfs_import_path *paths, size_t n, gfs_import_stats *stats,
                 gfs_error *err)
{
	imp->started = gfs_mono_seconds();
	gfs_error_clear(err);
	/* A worker per file at most: one changed file needs neither threads nor sessions to spare. */
	if ((size_t)imp->o.jobs > n)
		imp->o.jobs = n ? (int)n : 1;
	imp->o.dry_run = false;
	gfs_session *s = gfs_session_pop(imp->conn);
	char **names = path_names(imp, paths, n);
	imp->root_fd = open(imp->o.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (imp->root_fd < 0)
		gfs_error_set(err, GFS_ELOCAL, "%s: %s", imp->o.dir, strerror(errno));
	bool ok = imp->root_fd >= 0 && fit_pool(imp, s, err) && fit_fds(imp, err) &&
	          gfs_ensure_indexes(s, err) && take_lock(imp, err);
	struct worker *ws = gfs_xcalloc((size_t)imp->o.jobs, sizeof *ws);
	if (ok && imp->o.known)
		gfs_known_names_follow(imp->o.known, gfs_lock_generation(imp->lock));
	if (ok && (ok = workers_start(imp, ws, err))) {
		for (size_t i = 0; ok && i < n && !stopping(imp); i++)
			if (gfs_known_names_absent(imp->o.known, names[i]) ||
			    (ok = load_name(imp, s, names[i], err)))
				queue_path(imp, &paths[i]);
		gfs_workq_close(imp->q);
		for (int i = 0; i < imp->o.jobs; i++)
			pthread_join(ws[i].thread, NULL);
	}
	workers_free(ws, imp->o.jobs);
	if (ok && atomic_load(&imp->fatal)) {
		*err = imp->fatal_err;
		ok = false;
	}
	gfs_lock_release(imp->lock);
	imp->lock = NULL;
	gfs_session_push(s);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	imp->st.seconds = gfs_mono_seconds() - imp->started;
	*stats = imp->st;
	return ok;
}
