/*
 * Markers: the uploads collection's records of work a killed writer could
 * leave half done, their writing and their recovery (the design is in
 * markers.h).
 */
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "lock.h"
#include "markers.h"

/* Import markers handled per batch (lookups, then one removal). */
#define MARKER_BATCH 500

/* Files documents first, then chunks, as the spec orders a removal. */
static bool
remove_files(gfs_session *s, const bson_value_t *ids, size_t n, int64_t *files, gfs_error *err)
{
	return gfs_delete_each(s->files, NULL, "_id", ids, n, files, "delete files documents", err) &&
	       gfs_delete_each(s->chunks, NULL, "files_id", ids, n, NULL, "delete chunks", err);
}

/* ---- upload markers of put --------------------------------------------- */

bool
gfs_put_marker_begin(gfs_session *s, const bson_value_t *id, const gfs_put_opts *o,
                     struct gfs_put_marker *m, gfs_error *err)
{
	char *ids = gfs_id_string(id);
	m->lock_name = bson_strdup_printf(GFS_PUT_LOCK_PREFIX "%s", ids);
	free(ids);
	m->lock = gfs_lock_acquire(s->conn, m->lock_name, 0, err);
	if (!m->lock)
		return false;
	bson_t doc = BSON_INITIALIZER;
	BSON_APPEND_VALUE(&doc, "_id", id);
	BSON_APPEND_UTF8(&doc, "filename", o->filename);
	BSON_APPEND_UTF8(&doc, "lock", m->lock_name);
	if (gfs_owner_verb())
		BSON_APPEND_UTF8(&doc, "verb", gfs_owner_verb());
	if (o->keep_revisions > 0)
		BSON_APPEND_INT32(&doc, "keep", o->keep_revisions);
	/* The caller's id may be used again soon: late writes of it are not told from a new file's. */
	if (o->id)
		BSON_APPEND_BOOL(&doc, "givenId", true);
	mongoc_collection_t *uploads = gfs_session_bucket_collection(s, GFS_UPLOADS_SUFFIX);
	bson_error_t berr;
	bool ok = mongoc_collection_insert_one(uploads, &doc, NULL, NULL, &berr);
	if (!ok)
		gfs_error_from_bson(err, &berr, "insert upload marker");
	mongoc_collection_destroy(uploads);
	bson_destroy(&doc);
	if (!ok) {
		gfs_lock_release(m->lock);
		m->lock = NULL;
	}
	return ok;
}

/* Removes a marker (ours, or a dead put's whose lock we hold). */
static bool
marker_remove(gfs_session *s, const bson_value_t *id, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER;
	gfs_id_filter(&filter, "_id", id);
	mongoc_collection_t *uploads = gfs_session_bucket_collection(s, GFS_UPLOADS_SUFFIX);
	bson_error_t berr;
	bool ok = mongoc_collection_delete_one(uploads, &filter, NULL, NULL, &berr);
	if (!ok && err)
		gfs_error_from_bson(err, &berr, "remove upload marker");
	mongoc_collection_destroy(uploads);
	bson_destroy(&filter);
	return ok;
}

void
gfs_put_marker_end(gfs_session *s, const bson_value_t *id, struct gfs_put_marker *m, bool settled)
{
	if (m->lock) {
		if (settled)
			marker_remove(s, id, NULL);
		gfs_lock_release(m->lock);
	}
	bson_free(m->lock_name);
}

/* Chunks of id removed; *n how many, so that a recovery knows whether any had landed late. */
static bool
remove_dead_chunks(gfs_session *s, const bson_value_t *id, int64_t *n, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, reply;
	gfs_id_filter(&filter, "files_id", id);
	bson_error_t berr;
	bool ok = mongoc_collection_delete_many(s->chunks, &filter, NULL, &reply, &berr);
	bson_iter_t it;
	*n = ok && bson_iter_init_find(&it, &reply, "deletedCount") ? bson_iter_as_int64(&it) : 0;
	if (!ok)
		gfs_error_from_bson(err, &berr, "remove orphan chunks");
	bson_destroy(&reply);
	bson_destroy(&filter);
	return ok;
}

/* Flags a dead put's marker as recovered: its process is known gone, its lock no longer asked. */
static bool
marker_flag(gfs_session *s, const bson_value_t *id, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, update = BSON_INITIALIZER, set;
	gfs_id_filter(&filter, "_id", id);
	BSON_APPEND_DOCUMENT_BEGIN(&update, "$set", &set);
	BSON_APPEND_BOOL(&set, GFS_RECOVERED_FIELD, true);
	bson_append_document_end(&update, &set);
	mongoc_collection_t *uploads = gfs_session_bucket_collection(s, GFS_UPLOADS_SUFFIX);
	bson_error_t berr;
	bool ok = mongoc_collection_update_one(uploads, &filter, &update, NULL, NULL, &berr);
	if (!ok)
		gfs_error_from_bson(err, &berr, "flag upload marker recovered");
	mongoc_collection_destroy(uploads);
	bson_destroy(&filter);
	bson_destroy(&update);
	return ok;
}

#define RECOVER_MAX 1000

/*
 * A write that a dead process had sent can still be applied after its
 * upload was recovered: the server runs what it received, its sender gone
 * or not, and the sender's kernel goes on sending what its socket held for
 * a while after the process died. A chunk batch leaves orphans then, a
 * files document a file with no chunks. So an upload whose marker goes
 * after recovery is remembered in BUCKET.gridfsctl_recovered as
 * {_id: files_id, until} for RECOVERED_KEEP_S, far longer than any such
 * write takes, and every recovery removes what of it has landed since.
 */
#define RECOVERED_KEEP_S 600

static bool
recovered_add(gfs_session *s, const bson_value_t *id, gfs_error *err)
{
	bson_t doc = BSON_INITIALIZER;
	BSON_APPEND_VALUE(&doc, "_id", id);
	BSON_APPEND_DATE_TIME(&doc, "until", gfs_now_ms() + (int64_t)RECOVERED_KEEP_S * 1000);
	mongoc_collection_t *rec = gfs_session_bucket_collection(s, GFS_RECOVERED_SUFFIX);
	bson_error_t berr;
	/* Already there: a pass before ours remembered it. */
	bool ok = mongoc_collection_insert_one(rec, &doc, NULL, NULL, &berr) || berr.code == 11000;
	if (!ok)
		gfs_error_from_bson(err, &berr, "remember a recovered upload");
	mongoc_collection_destroy(rec);
	bson_destroy(&doc);
	return ok;
}

bool
gfs_recovered_add(gfs_session *s, const bson_value_t *ids, size_t n, gfs_error *err)
{
	bool ok = true;
	for (size_t i = 0; ok && i < n; i++)
		ok = recovered_add(s, &ids[i], err);
	return ok;
}

/* Removes what landed of recovered uploads since, and forgets those past their time. */
static bool
sweep_recovered(gfs_session *s, gfs_error *err)
{
	bson_t opts = BSON_INITIALIZER;
	BSON_APPEND_INT64(&opts, "limit", RECOVER_MAX);
	mongoc_collection_t *rec = gfs_session_bucket_collection(s, GFS_RECOVERED_SUFFIX);
	bson_t all = BSON_INITIALIZER;
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(rec, &all, &opts, NULL);
	bson_value_t *ids = gfs_xcalloc(RECOVER_MAX, sizeof *ids), *old = gfs_xcalloc(RECOVER_MAX, sizeof *old);
	size_t n = 0, nold = 0;
	int64_t now = gfs_now_ms();
	const bson_t *doc;
	while (n < RECOVER_MAX && mongoc_cursor_next(cur, &doc)) {
		bson_iter_t id, until;
		if (!bson_iter_init_find(&id, doc, "_id"))
			continue;
		bson_value_copy(bson_iter_value(&id), &ids[n++]);
		if (!bson_iter_init_find(&until, doc, "until") || !BSON_ITER_HOLDS_DATE_TIME(&until) ||
		    bson_iter_date_time(&until) < now)
			old[nold++] = ids[n - 1];
	}
	bool ok = gfs_cursor_done(cur, "read recovered uploads", err);
	bson_destroy(&opts);
	bson_destroy(&all);
	/* Those past their time are looked at once more, then forgotten. */
	ok = ok && (n == 0 || remove_files(s, ids, n, NULL, err)) &&
	     (nold == 0 || gfs_delete_each(rec, NULL, "_id", old, nold, NULL, "forget recovered uploads", err));
	for (size_t i = 0; i < n; i++)
		bson_value_destroy(&ids[i]);
	free(ids);
	free(old);
	mongoc_collection_destroy(rec);
	return ok;
}

/*
 * Finishes one marker whose put is gone; false only on a backend error.
 * A chunk insert the dead put had in flight can still land after its
 * chunks were removed, so the marker stays, flagged, until a later pass
 * (at the end of the recovering command, or the next one) finds no chunk;
 * then the upload is remembered as recovered for what lands even later.
 * A files document found on that later pass was written over chunks that
 * are gone: it goes too.
 */
static bool
recover_marker(gfs_session *s, const bson_t *doc, size_t *removed, gfs_error *err)
{
	bson_iter_t it, lk;
	if (!bson_iter_init_find(&it, doc, "_id") || !bson_iter_init_find(&lk, doc, "lock") ||
	    !BSON_ITER_HOLDS_UTF8(&lk))
		return true;
	const bson_value_t *id = bson_iter_value(&it);
	bool flagged = bson_iter_init_find(&it, doc, GFS_RECOVERED_FIELD) && bson_iter_as_bool(&it);
	int keep = bson_iter_init_find(&it, doc, "keep") && BSON_ITER_HOLDS_NUMBER(&it)
	               ? (int)bson_iter_as_int64(&it)
	               : 0;
	const char *name = bson_iter_init_find(&it, doc, "filename") && BSON_ITER_HOLDS_UTF8(&it)
	                       ? bson_iter_utf8(&it, NULL)
	                       : NULL;
	bool given = bson_iter_init_find(&it, doc, "givenId") && bson_iter_as_bool(&it);
	gfs_lock *l = NULL;
	if (!flagged) {
		gfs_error lerr;
		l = gfs_lock_acquire(s->conn, bson_iter_utf8(&lk, NULL), 0, &lerr);
		if (!l && lerr.code == GFS_EBUSY)
			return true; /* still running */
		if (!l) {
			*err = lerr;
			return false;
		}
	}
	int64_t late = 0, files = 0;
	int has = gfs_exists(s, s->files, "_id", id, err);
	bool ok = has >= 0, exists = has > 0;
	if (ok && exists && !flagged) {
		/* Complete; its writer died before removing older revisions, if it was to. */
		ok = (keep <= 0 || !name || gfs_delete_old_revisions(s, name, keep, id, err)) &&
		     marker_remove(s, id, err);
	} else if (ok && !flagged) {
		ok = remove_dead_chunks(s, id, &late, err) && marker_flag(s, id, err);
		*removed += ok;
	} else if (ok) {
		ok = (!exists || gfs_delete_each(s->files, NULL, "_id", id, 1, &files,
		                                 "remove a late files document", err)) &&
		     remove_dead_chunks(s, id, &late, err);
		/* Something landed: writes of the dead may be landing still, so the next pass looks again. */
		if (ok && late + files == 0)
			ok = (given || recovered_add(s, id, err)) && marker_remove(s, id, err);
	}
	if (l)
		gfs_lock_release(l);
	return ok;
}

bool
gfs_put_recover(gfs_session *s, size_t *removed, gfs_error *err)
{
	*removed = 0;
	bson_t filter = BSON_INITIALIZER, exists, opts = BSON_INITIALIZER;
	BSON_APPEND_DOCUMENT_BEGIN(&filter, "lock", &exists);
	BSON_APPEND_BOOL(&exists, "$exists", true);
	bson_append_document_end(&filter, &exists);
	/* A deletion marker names the lock that covers it too: gfs_finish_deletions() has those. */
	BSON_APPEND_DOCUMENT_BEGIN(&filter, "deleting", &exists);
	BSON_APPEND_BOOL(&exists, "$exists", false);
	bson_append_document_end(&filter, &exists);
	BSON_APPEND_INT64(&opts, "limit", RECOVER_MAX);
	mongoc_collection_t *uploads = gfs_session_bucket_collection(s, GFS_UPLOADS_SUFFIX);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(uploads, &filter, &opts, NULL);
	/* Read them all first: recovering removes markers, and the cursor could skip some. */
	bson_t **docs = gfs_xcalloc(RECOVER_MAX, sizeof *docs);
	size_t n = 0;
	const bson_t *doc;
	while (n < RECOVER_MAX && mongoc_cursor_next(cur, &doc))
		docs[n++] = bson_copy(doc);
	bool ok = gfs_cursor_done(cur, "read upload markers", err);
	mongoc_collection_destroy(uploads);
	bson_destroy(&filter);
	bson_destroy(&opts);
	ok = ok && sweep_recovered(s, err);
	for (size_t i = 0; i < n; i++) {
		ok = ok && recover_marker(s, docs[i], removed, err);
		bson_destroy(docs[i]);
	}
	free(docs);
	/* A put killed between taking its lock and releasing it leaves a lock nobody takes again. */
	int64_t held, stale;
	return ok && gfs_lock_sweep(s, GFS_PUT_LOCK_PREFIX, true, &held, &stale, err);
}

bool
gfs_put_trimmed(gfs_session *s, const bson_value_t *id, gfs_error *err)
{
	return marker_remove(s, id, err);
}

/* ---- upload markers of import ------------------------------------------ */

bson_t *
gfs_import_marker_new(const bson_value_t *id, const char *name, int keep, const char *owner,
                      const char *scope, int64_t started)
{
	bson_t *d = bson_new();
	BSON_APPEND_VALUE(d, "_id", id);
	BSON_APPEND_UTF8(d, "filename", name);
	BSON_APPEND_INT32(d, "keep", keep);
	BSON_APPEND_UTF8(d, "owner", owner);
	if (scope)
		BSON_APPEND_UTF8(d, GFS_SCOPE_FIELD, scope);
	if (gfs_owner_verb())
		BSON_APPEND_UTF8(d, "verb", gfs_owner_verb());
	BSON_APPEND_DATE_TIME(d, "started", started);
	return d;
}

/* An import's upload marker, as recovery reads it. */
struct marker {
	bson_value_t id;
	char *name;
	int keep;
	bool flagged;   /* recovered before: its chunks were removed once */
};

/*
 * Whether the marker's writer may be at work: an import of a prefix ours
 * does not overlap, whose lock is held. Asks the lock once per scope in a
 * row (markers of one writer come together).
 */
static int
marker_busy(gfs_session *s, const char *held, const bson_t *doc, char **last, int *last_rc,
            gfs_error *err)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, doc, GFS_SCOPE_FIELD) || !BSON_ITER_HOLDS_UTF8(&it))
		return 0;
	const char *scope = bson_iter_utf8(&it, NULL);
	if (*last && strcmp(*last, scope) == 0)
		return *last_rc;
	free(*last);
	*last = gfs_xstrdup(scope);
	return *last_rc = gfs_marker_live(s, doc, held, err);
}

/*
 * Upload markers of import (only_flagged: those recovered before) whose
 * writers are gone, into *out.
 */
static bool
load_markers(gfs_session *s, const char *held, mongoc_collection_t *uploads, bool only_flagged,
             struct marker **out, size_t *count, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, exists, put;
	if (only_flagged)
		BSON_APPEND_BOOL(&filter, GFS_RECOVERED_FIELD, true);
	BSON_APPEND_DOCUMENT_BEGIN(&filter, "deleting", &exists);
	BSON_APPEND_BOOL(&exists, "$exists", false);
	bson_append_document_end(&filter, &exists);
	/* A put's marker, which gfs_put_recover() settles: that put may be running still. */
	BSON_APPEND_DOCUMENT_BEGIN(&filter, "lock", &put);
	BSON_APPEND_BOOL(&put, "$exists", false);
	bson_append_document_end(&filter, &put);
	BSON_APPEND_INT32(&opts, "batchSize", 1000);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(uploads, &filter, &opts, NULL);
	struct marker *m = NULL;
	size_t n = 0, cap = 0;
	const bson_t *doc;
	char *last = NULL;
	int last_rc = 0, busy = 0;
	while (busy >= 0 && mongoc_cursor_next(cur, &doc)) {
		bson_iter_t it;
		if (!bson_iter_init_find(&it, doc, "_id"))
			continue;
		if ((busy = marker_busy(s, held, doc, &last, &last_rc, err)) != 0)
			continue;
		GFS_GROW(m, n + 1, cap, 64);
		bson_value_copy(bson_iter_value(&it), &m[n].id);
		m[n].name = NULL;
		m[n].keep = 1;   /* markers without keep: trim as the default would */
		if (bson_iter_init_find(&it, doc, "filename") && BSON_ITER_HOLDS_UTF8(&it))
			m[n].name = gfs_xstrdup(bson_iter_utf8(&it, NULL));
		if (bson_iter_init_find(&it, doc, "keep") && BSON_ITER_HOLDS_NUMBER(&it))
			m[n].keep = (int)bson_iter_as_int64(&it);
		m[n].flagged = bson_iter_init_find(&it, doc, GFS_RECOVERED_FIELD) && bson_iter_as_bool(&it);
		n++;
	}
	free(last);
	bool ok = gfs_cursor_done(cur, "read upload markers", err) && busy >= 0;
	bson_destroy(&filter);
	bson_destroy(&opts);
	*out = m;
	*count = n;
	return ok;
}

/*
 * Which of the markers' uploads have a files document: complete[i] set for
 * those. One lookup by _id equality each, not one $in: a server that cannot
 * serve $in from an index reads every files document for it.
 */
static bool
find_complete(gfs_session *s, const struct marker *m, size_t n, bool *complete, gfs_error *err)
{
	for (size_t i = 0; i < n; i++) {
		int has = gfs_exists(s, s->files, "_id", &m[i].id, err);
		if (has < 0)
			return false;
		complete[i] = has > 0;
	}
	return true;
}

/*
 * Flags the markers of ids recovered, so that a later pass removes them once
 * it finds no chunk. One $in: the uploads collection holds only the markers
 * of uploads in flight or interrupted, so even a server that reads all of it
 * for the $in reads little.
 */
static bool
flag_recovered(mongoc_collection_t *uploads, const struct gfs_idlist *ids, gfs_error *err)
{
	if (ids->n == 0)
		return true;
	bson_t filter = BSON_INITIALIZER, update = BSON_INITIALIZER, set;
	gfs_in_filter(&filter, "_id", ids->v, ids->n);
	BSON_APPEND_DOCUMENT_BEGIN(&update, "$set", &set);
	BSON_APPEND_BOOL(&set, GFS_RECOVERED_FIELD, true);
	bson_append_document_end(&update, &set);
	bson_error_t berr;
	bool ok = mongoc_collection_update_many(uploads, &filter, &update, NULL, NULL, &berr);
	if (!ok)
		gfs_error_from_bson(err, &berr, "flag upload markers recovered");
	bson_destroy(&filter);
	bson_destroy(&update);
	return ok;
}

/*
 * Completed uploads get their old revisions trimmed and lose their markers.
 * Unfinished ones lose their chunks; their markers are flagged, not removed,
 * since a chunk the dead process had in flight may land still: a flagged
 * marker goes once a later pass over the batch finds no chunk to remove.
 * *late counts chunks that pass found (landed after the first removal).
 */
static bool
recover_batch(gfs_session *s, const char *held, mongoc_collection_t *uploads, struct marker *m,
              size_t n, uint64_t *recovered, int64_t *late, gfs_error *err)
{
	bool *complete = gfs_xcalloc(n, sizeof *complete);
	struct gfs_newrev *revs = gfs_xcalloc(n, sizeof *revs);
	struct gfs_idlist orphans = {0}, done = {0}, flagged = {0}, fresh = {0}, latedocs = {0};
	bool ok = find_complete(s, m, n, complete, err);
	size_t nrevs = 0;
	for (size_t i = 0; ok && i < n; i++) {
		/* Recovered before: a files document now was written over chunks that are gone. */
		if (m[i].flagged && complete[i])
			gfs_idlist_add(&latedocs, &m[i].id);
		if (!complete[i] || m[i].flagged) {
			gfs_idlist_add(&orphans, &m[i].id);
			gfs_idlist_add(m[i].flagged ? &flagged : &fresh, &m[i].id);
			continue;
		}
		gfs_idlist_add(&done, &m[i].id);
		if (m[i].name && m[i].keep > 0 && m[i].id.value_type == BSON_TYPE_OID) {
			revs[nrevs].name = m[i].name;
			bson_oid_copy(&m[i].id.value.v_oid, &revs[nrevs].id);
			revs[nrevs++].keep = m[i].keep;
		}
	}
	int64_t removed = 0, docs = 0;
	ok = ok && gfs_delete_each(s->files, NULL, "_id", latedocs.v, latedocs.n, &docs,
	                           "remove late files documents", err) &&
	     gfs_delete_each(s->chunks, NULL, "files_id", orphans.v, orphans.n, &removed,
	                     "remove orphan chunks", err) &&
	     gfs_trim_revisions(s, held, revs, nrevs, err) && flag_recovered(uploads, &fresh, err) &&
	     gfs_delete_each(uploads, NULL, "_id", done.v, done.n, NULL, "remove upload markers", err);
	/*
	 * A chunk found means writes of the dead may be landing still: the next
	 * pass looks again. Else the markers go, and the uploads are remembered
	 * as recovered for what lands even later (gfs_recovered_add).
	 */
	if (ok && removed + docs == 0)
		ok = gfs_recovered_add(s, flagged.v, flagged.n, err) &&
		     gfs_delete_each(uploads, NULL, "_id", flagged.v, flagged.n, NULL, "remove upload markers",
		                     err);
	if (ok) {
		*recovered += fresh.n;
		if (fresh.n == 0)
			*late += removed;
	}
	gfs_idlist_free(&orphans);
	gfs_idlist_free(&done);
	gfs_idlist_free(&flagged);
	gfs_idlist_free(&fresh);
	gfs_idlist_free(&latedocs);
	free(complete);
	free(revs);
	return ok;
}

bool
gfs_import_markers_recover(gfs_session *s, mongoc_collection_t *uploads, const char *held,
                           bool only_flagged, uint64_t *recovered, int64_t *late, gfs_error *err)
{
	struct marker *m = NULL;
	size_t n = 0;
	bool ok = load_markers(s, held, uploads, only_flagged, &m, &n, err);
	for (size_t i = 0; ok && i < n; i += MARKER_BATCH)
		ok = recover_batch(s, held, uploads, m + i, n - i < MARKER_BATCH ? n - i : MARKER_BATCH,
		                   recovered, late, err);
	for (size_t i = 0; i < n; i++) {
		bson_value_destroy(&m[i].id);
		free(m[i].name);
	}
	free(m);
	return ok;
}

/* ---- deletion markers: removals ----------------------------------------- */

/* Ids per deletion marker, at most. */
#define DELETE_BATCH 500

static bool
delete_batch(gfs_session *s, mongoc_collection_t *uploads, const bson_value_t *ids, size_t n,
             const char *lock, int64_t *files, gfs_error *err)
{
	bson_t doc = BSON_INITIALIZER;
	bson_value_t mid = {.value_type = BSON_TYPE_OID};
	bson_oid_init(&mid.value.v_oid, NULL);
	BSON_APPEND_VALUE(&doc, "_id", &mid);
	gfs_append_values(&doc, "deleting", ids, n);
	BSON_APPEND_DATE_TIME(&doc, "started", gfs_now_ms());
	gfs_owner_append(&doc);
	if (lock)
		BSON_APPEND_UTF8(&doc, "lock", lock);
	bson_error_t berr;
	bool ok = mongoc_collection_insert_one(uploads, &doc, NULL, NULL, &berr);
	bson_destroy(&doc);
	if (!ok) {
		gfs_error_from_bson(err, &berr, "insert deletion marker");
		return false;
	}
	/* On a failure the marker stays: the removal was decided, and recovery completes it. */
	return remove_files(s, ids, n, files, err) &&
	       gfs_delete_each(uploads, NULL, "_id", &mid, 1, NULL, "remove deletion marker", err);
}

bool
gfs_delete_many(gfs_session *s, const bson_value_t *ids, size_t n, const char *lock,
                int64_t *files, gfs_error *err)
{
	mongoc_collection_t *uploads = gfs_session_bucket_collection(s, GFS_UPLOADS_SUFFIX);
	int64_t total = 0;
	bool ok = true;
	for (size_t i = 0; ok && i < n; i += DELETE_BATCH) {
		int64_t got = 0;
		ok = delete_batch(s, uploads, ids + i, n - i < DELETE_BATCH ? n - i : DELETE_BATCH, lock,
		                  &got, err);
		total += got;
	}
	mongoc_collection_destroy(uploads);
	if (files)
		*files = total;
	return ok;
}

bool
gfs_delete(gfs_session *s, const bson_value_t *id, gfs_error *err)
{
	int64_t files = 0;
	if (!gfs_delete_many(s, id, 1, NULL, &files, err))
		return false;
	if (files == 0) {
		char *ids = gfs_id_string(id);
		gfs_error_set(err, GFS_ENOTFOUND, "id %s: no such file", ids);
		free(ids);
		return false;
	}
	return true;
}

/*
 * A marker whose writer is gone, or older than any live writer's could be,
 * or one covered by the lock we hold (held, may be NULL), whose writer
 * would hold it if it were alive.
 */
static bool
deletion_abandoned(const bson_t *doc, const char *held)
{
	bson_iter_t it;
	if (held && bson_iter_init_find(&it, doc, "lock") && BSON_ITER_HOLDS_UTF8(&it) &&
	    gfs_lock_excludes(held, bson_iter_utf8(&it, NULL)))
		return true;
	/* Before markers named their writer, only imports wrote them. */
	if (!bson_iter_init_find(&it, doc, "pid"))
		return held && strcmp(held, GFS_IMPORT_LOCK) == 0;
	if (gfs_owner_gone(doc))
		return true;
	int64_t started = bson_iter_init_find(&it, doc, "started") && BSON_ITER_HOLDS_DATE_TIME(&it)
	                      ? bson_iter_date_time(&it)
	                      : 0;
	return started < gfs_now_ms() - (int64_t)GFS_LOCK_DEFAULT_TTL * 1000;
}

/* Completes the removal one deletion marker records, then removes the marker. */
static bool
finish_deletion(gfs_session *s, mongoc_collection_t *uploads, const bson_t *doc, size_t *files,
                gfs_error *err)
{
	bson_iter_t it, arr;
	if (!bson_iter_init_find(&it, doc, "_id"))
		return true;
	bson_value_t mid;
	bson_value_copy(bson_iter_value(&it), &mid);
	bson_value_t *ids = NULL;
	size_t n = 0, cap = 0;
	if (bson_iter_init_find(&it, doc, "deleting") && BSON_ITER_HOLDS_ARRAY(&it) &&
	    bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			GFS_GROW(ids, n + 1, cap, 16);
			bson_value_copy(bson_iter_value(&arr), &ids[n++]);
		}
	}
	bool ok = true;
	for (size_t i = 0; ok && i < n; i += DELETE_BATCH)
		ok = remove_files(s, ids + i, n - i < DELETE_BATCH ? n - i : DELETE_BATCH, NULL, err);
	ok = ok && gfs_delete_each(uploads, NULL, "_id", &mid, 1, NULL, "remove deletion marker", err);
	if (ok)
		*files += n;
	for (size_t i = 0; i < n; i++)
		bson_value_destroy(&ids[i]);
	free(ids);
	bson_value_destroy(&mid);
	return ok;
}

bool
gfs_finish_deletions(gfs_session *s, const char *held, size_t *files, gfs_error *err)
{
	*files = 0;
	bson_t filter = BSON_INITIALIZER, exists;
	BSON_APPEND_DOCUMENT_BEGIN(&filter, "deleting", &exists);
	BSON_APPEND_BOOL(&exists, "$exists", true);
	bson_append_document_end(&filter, &exists);
	mongoc_collection_t *uploads = gfs_session_bucket_collection(s, GFS_UPLOADS_SUFFIX);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(uploads, &filter, NULL, NULL);
	bson_destroy(&filter);
	/* Few (one per writer at most): read them all before removing any. */
	bson_t **docs = NULL;
	size_t n = 0, cap = 0;
	const bson_t *doc;
	while (mongoc_cursor_next(cur, &doc)) {
		if (!deletion_abandoned(doc, held))
			continue;
		GFS_GROW(docs, n + 1, cap, 8);
		docs[n++] = bson_copy(doc);
	}
	bool ok = gfs_cursor_done(cur, "read deletion markers", err);
	for (size_t i = 0; i < n; i++) {
		ok = ok && finish_deletion(s, uploads, docs[i], files, err);
		bson_destroy(docs[i]);
	}
	free(docs);
	mongoc_collection_destroy(uploads);
	return ok;
}

/* ---- what markers say, for reports ---------------------------------- */

int
gfs_marker_find(gfs_session *s, const bson_value_t *fid, bson_t *out, gfs_error *err)
{
	static const char *const fields[] = {"_id", "deleting"};
	mongoc_collection_t *uploads = gfs_session_bucket_collection(s, GFS_UPLOADS_SUFFIX);
	int rc = 0;
	for (size_t i = 0; rc == 0 && i < sizeof fields / sizeof fields[0]; i++) {
		bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER;
		gfs_id_filter(&filter, fields[i], fid);
		BSON_APPEND_INT64(&opts, "limit", 1);
		mongoc_cursor_t *cur = mongoc_collection_find_with_opts(uploads, &filter, &opts, NULL);
		const bson_t *doc;
		if (mongoc_cursor_next(cur, &doc)) {
			bson_copy_to(doc, out);
			rc = 1;
		}
		if (!gfs_cursor_done(cur, "look up a marker", err)) {
			if (rc > 0)
				bson_destroy(out);
			rc = -1;
		}
		bson_destroy(&filter);
		bson_destroy(&opts);
	}
	mongoc_collection_destroy(uploads);
	return rc;
}

static const char *
marker_lock(const bson_t *m)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, m, "lock") && BSON_ITER_HOLDS_UTF8(&it) ? bson_iter_utf8(&it, NULL)
	                                                                       : NULL;
}

/*
 * Under the import lock: an import's upload, or its removal (named so, or
 * from before markers named their writer).
 */
static bool
import_marker(const bson_t *m)
{
	const char *lock = marker_lock(m);
	if (!bson_has_field(m, "deleting"))
		return !lock;
	return lock ? gfs_lock_of_family(lock, GFS_IMPORT_LOCK) : !bson_has_field(m, "pid");
}

int
gfs_marker_live(gfs_session *s, const bson_t *m, const char *held, gfs_error *err)
{
	/* A removal whose writer named itself: finished by the rule gfs_finish_deletions() applies. */
	if (bson_has_field(m, "deleting") && bson_has_field(m, "pid"))
		return !deletion_abandoned(m, held);
	/* An import's upload names the lock of its prefix in "scope"; before prefixes, none. */
	const char *lock = marker_lock(m);
	bson_iter_t it;
	if (!lock && bson_iter_init_find(&it, m, GFS_SCOPE_FIELD) && BSON_ITER_HOLDS_UTF8(&it))
		lock = bson_iter_utf8(&it, NULL);
	if (!lock)
		lock = GFS_IMPORT_LOCK;
	if (held && gfs_lock_excludes(held, lock))
		return 0;
	return gfs_lock_held(s, lock, err);
}

const char *
gfs_marker_verb(const bson_t *m)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, m, "verb") && BSON_ITER_HOLDS_UTF8(&it) && *bson_iter_utf8(&it, NULL))
		return bson_iter_utf8(&it, NULL);
	if (import_marker(m))
		return "import";
	return bson_has_field(m, "deleting") ? "command" : "put";
}

void
gfs_marker_left_by(const bson_t *m, char *buf, size_t len)
{
	bool removal = bson_has_field(m, "deleting"), import = import_marker(m);
	const char *next = removal ? import ? "import or verify --repair finishes its removal"
	                                    : "rm, put, import or verify --repair finishes its removal"
	                           : import ? "import removes them"
	                                    : "put, rm, import or verify --repair removes them";
	snprintf(buf, len, "left by an interrupted %s (the next %s)", gfs_marker_verb(m), next);
}

/* ---- old revisions: a removal too ---------------------------------------- */

bool
gfs_delete_old_revisions(gfs_session *s, const char *name, int keep, const bson_value_t *keep_id,
                         gfs_error *err)
{
	bson_value_t *ids;
	size_t count;
	/* Collect first: deleting while the cursor is open could make it skip or repeat. */
	bool ok = gfs_find_old_revisions(s, name, keep < 1 ? 1 : keep, keep_id, &ids, &count, err);
	ok = ok && gfs_delete_many(s, ids, count, NULL, NULL, err);
	for (size_t i = 0; i < count; i++)
		bson_value_destroy(&ids[i]);
	free(ids);
	return ok;
}

/*
 * One query by filename equality per name, not one {filename: {$in:
 * names}}: a server that cannot serve $in from an index (FerretDB) reads
 * every files document for it, once per batch, while an equality is an
 * index seek on every server (rule 2 of docs/design.md).
 */
bool
gfs_trim_revisions(gfs_session *s, const char *lock, const struct gfs_newrev *revs, size_t n,
                   gfs_error *err)
{
	struct gfs_idlist old = {0};
	bool ok = true;
	for (size_t i = 0; ok && i < n; i++) {
		bson_value_t id = {.value_type = BSON_TYPE_OID};
		bson_oid_copy(&revs[i].id, &id.value.v_oid);
		ok = gfs_find_old_revisions_into(s, revs[i].name, revs[i].keep, &id, &old, err);
	}
	ok = ok && gfs_delete_many(s, old.v, old.n, lock, NULL, err);
	gfs_idlist_free(&old);
	return ok;
}
