/* Database-held advisory locks with a heartbeat. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lock.h"

struct gfs_lock {
	gfs_session *s;
	mongoc_collection_t *coll;
	char *name;
	char owner[512];
	int ttl_s;
	/*
	 * When the last successful take or renewal was sent, on a clock that
	 * counts through suspend and ignores changes to the time of day: our
	 * lease ends ttl_s after it, whatever the heartbeat has noticed.
	 */
	_Atomic int64_t granted_ns;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cond;
	bool stop;
	atomic_bool lost;
	int64_t generation;
	char note[256];   /* what the take has to say (a malformed document taken over), or "" */
};

struct identity {
	char host[256];
	char boot[64];
	long pid;
	long long start;   /* process start time, clock ticks after boot */
};

/*
 * Whether the lease may have run out, as others would see it: another
 * process may take the lock over once the expiry passes, and hosts' clocks
 * differ, so stop a third of the ttl (at least a second) early.
 */
static bool
lease_over(gfs_lock *l)
{
	int64_t margin = (int64_t)(l->ttl_s / 3 > 0 ? l->ttl_s / 3 : 1) * 1000000000;
	int64_t until = atomic_load(&l->granted_ns) + (int64_t)l->ttl_s * 1000000000 - margin;
	return gfs_clock_ns(CLOCK_BOOTTIME) > until;
}

static void
read_line(const char *path, char *buf, size_t len)
{
	buf[0] = '\0';
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	if (fgets(buf, (int)len, f))
		buf[strcspn(buf, "\n")] = '\0';
	fclose(f);
}

/* Field 22 of /proc/PID/stat, or -1 when there is no such process. */
static long long
process_start(long pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%ld/stat", pid);
	read_line(path, buf, sizeof buf);
	char *p = strrchr(buf, ')');
	if (!p)
		return -1;
	/* After the command name: state is field 3, start time field 22. */
	for (int field = 2; field < 22 && p; field++)
		p = strchr(p + 1, ' ');
	return p ? strtoll(p + 1, NULL, 10) : -1;
}

static void
identity_self(struct identity *id)
{
	memset(id, 0, sizeof *id);
	if (gethostname(id->host, sizeof id->host - 1) != 0)
		strcpy(id->host, "unknown");
	read_line("/proc/sys/kernel/random/boot_id", id->boot, sizeof id->boot);
	id->pid = (long)getpid();
	id->start = process_start(id->pid);
}

static void
owner_string(char *buf, size_t len, const struct identity *id)
{
	snprintf(buf, len, "%s/%s/%ld/%lld", id->host, id->boot, id->pid, id->start);
}

/* The verb this process runs, named in what it records (set once, before any thread starts). */
static const char *own_verb;

void
gfs_owner_set_verb(const char *verb)
{
	own_verb = verb;
}

const char *
gfs_owner_verb(void)
{
	return own_verb;
}

static void
append_identity(bson_t *doc, const struct identity *id, const char *owner)
{
	BSON_APPEND_UTF8(doc, "owner", owner);
	if (own_verb)
		BSON_APPEND_UTF8(doc, "verb", own_verb);
	BSON_APPEND_UTF8(doc, "host", id->host);
	BSON_APPEND_UTF8(doc, "bootId", id->boot);
	BSON_APPEND_INT64(doc, "pid", id->pid);
	BSON_APPEND_INT64(doc, "startTime", id->start);
}

static void
lock_doc(bson_t *doc, const char *name, const struct identity *id, const char *owner,
         int64_t now, int64_t expires)
{
	BSON_APPEND_UTF8(doc, "_id", name);
	append_identity(doc, id, owner);
	BSON_APPEND_DATE_TIME(doc, "acquired", now);
	BSON_APPEND_DATE_TIME(doc, "expires", expires);
}

static const char *
doc_str(const bson_t *doc, const char *key)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, doc, key) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return "";
}

static int64_t
doc_int(const bson_t *doc, const char *key)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, doc, key))
		return -1;
	if (BSON_ITER_HOLDS_DATE_TIME(&it))
		return bson_iter_date_time(&it);
	if (BSON_ITER_HOLDS_NUMBER(&it))
		return bson_iter_as_int64(&it);
	return -1;
}

/* A holder on this host since this boot whose process is gone can be taken over at once. */
static bool
holder_gone(const bson_t *held, const struct identity *me)
{
	if (strcmp(doc_str(held, "host"), me->host) != 0 || !me->boot[0] ||
	    strcmp(doc_str(held, "bootId"), me->boot) != 0)
		return false;
	long pid = (long)doc_int(held, "pid");
	long long held_start = doc_int(held, "startTime");
	/* Without /proc we cannot tell a live holder from a dead one: wait for the expiry. */
	if (pid <= 0 || held_start < 0 || me->start < 0)
		return false;
	long long start = process_start(pid);
	return start < 0 || start != held_start;
}

/*
 * The one reading of a lock document (see lock.h). Only a date is a lease:
 * an expiry of another type, or none, ends at once, as does a lease whose
 * holder is known gone. A document without an owner is malformed but keeps
 * its lease: something may still be renewing it.
 */
static void
judge(const bson_t *doc, const struct identity *me, gfs_lock_state *st)
{
	memset(st, 0, sizeof *st);
	st->found = true;
	bson_iter_t it;
	bool has_owner = bson_iter_init_find(&it, doc, "owner") && BSON_ITER_HOLDS_UTF8(&it) &&
	                 bson_iter_utf8(&it, NULL)[0];
	bool has_expires = bson_iter_init_find(&it, doc, "expires");
	st->expires = has_expires && BSON_ITER_HOLDS_DATE_TIME(&it) ? bson_iter_date_time(&it) : -1;
	snprintf(st->malformed, sizeof st->malformed, "%s%s%s", has_owner ? "" : "no owner",
	         !has_owner && st->expires < 0 ? "; " : "",
	         st->expires >= 0 ? "" : has_expires ? "expires is not a date" : "no expires");
	const char *host = doc_str(doc, "host");
	long long pid = doc_int(doc, "pid");
	if (pid >= 0)
		snprintf(st->holder, sizeof st->holder, "%s pid %lld", host[0] ? host : "?", pid);
	else
		snprintf(st->holder, sizeof st->holder, "%s pid ?", host[0] ? host : "?");
	st->held = st->expires > gfs_now_ms() && !holder_gone(doc, me);
}

static void
busy_error(gfs_error *err, const char *name, const bson_t *held, const gfs_lock_state *st)
{
	char since[32], until[32];
	gfs_iso8601(doc_int(held, "acquired"), since);
	gfs_iso8601(st->expires, until);
	gfs_error_set(err, GFS_EBUSY,
	              "lock '%s' is held by pid %lld on %s since %s (expires %s unless renewed)%s%s",
	              name, (long long)doc_int(held, "pid"), doc_str(held, "host"), since, until,
	              st->malformed[0] ? "; its document is malformed: " : "", st->malformed);
}

/* 1: taken over, 0: still held by someone alive (err set), -1: error. */
static int
try_takeover(gfs_lock *l, const struct identity *me, const bson_t *held, const bson_t *mine,
             gfs_error *err)
{
	gfs_lock_state st;
	judge(held, me, &st);
	if (st.held) {
		busy_error(err, l->name, held, &st);
		return 0;
	}
	/*
	 * Compare-and-swap on the stale holder, so that two takers cannot both
	 * win: every take writes both fields, so the first changes what the
	 * second's filter names, whatever (if anything) the stale one held.
	 */
	bson_t filter = BSON_INITIALIZER, update = BSON_INITIALIZER, reply;
	BSON_APPEND_UTF8(&filter, "_id", l->name);
	gfs_same_filter(&filter, held, "owner");
	gfs_same_filter(&filter, held, "expires");
	BSON_APPEND_DOCUMENT(&update, "$set", mine);
	bson_error_t berr;
	int rc = -1;
	if (mongoc_collection_update_one(l->coll, &filter, &update, NULL, &reply, &berr)) {
		bson_iter_t it;
		rc = bson_iter_init_find(&it, &reply, "matchedCount") && bson_iter_as_int64(&it) == 1;
		if (!rc)
			busy_error(err, l->name, held, &st);
	} else {
		gfs_error_from_bson(err, &berr, "take over lock");
	}
	if (rc == 1 && st.malformed[0])
		snprintf(l->note, sizeof l->note,
		         "took over lock '%s' from a malformed lock document (%s)", l->name, st.malformed);
	bson_destroy(&filter);
	bson_destroy(&update);
	bson_destroy(&reply);
	return rc;
}

static bool
find_holder(mongoc_collection_t *coll, const char *name, bson_t *out, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&filter, "_id", name);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(coll, &filter, NULL, NULL);
	const bson_t *doc;
	bool found = mongoc_cursor_next(cur, &doc);
	if (found)
		bson_copy_to(doc, out);
	gfs_cursor_done(cur, "read lock", err);
	bson_destroy(&filter);
	return found;
}

static bool
take(gfs_lock *l, gfs_error *err)
{
	struct identity me;
	identity_self(&me);
	owner_string(l->owner, sizeof l->owner, &me);
	/* A few rounds: the holder may release or be taken over between our steps. */
	for (int round = 0; round < 3; round++) {
		int64_t sent = gfs_clock_ns(CLOCK_BOOTTIME);
		int64_t now = gfs_now_ms();
		bson_t mine = BSON_INITIALIZER, reply;
		lock_doc(&mine, l->name, &me, l->owner, now, now + (int64_t)l->ttl_s * 1000);
		atomic_store(&l->granted_ns, sent);
		bson_error_t berr;
		bool ok = mongoc_collection_insert_one(l->coll, &mine, NULL, &reply, &berr);
		bson_destroy(&reply);
		if (ok) {
			bson_destroy(&mine);
			return true;
		}
		if (berr.code != 11000) {
			bson_destroy(&mine);
			gfs_error_from_bson(err, &berr, "take lock");
			return false;
		}
		bson_t held;
		gfs_error ferr;
		gfs_error_clear(&ferr);
		if (!find_holder(l->coll, l->name, &held, &ferr)) {
			bson_destroy(&mine);
			if (ferr.code != GFS_OK) {
				*err = ferr;
				return false;
			}
			continue;
		}
		bson_t set = BSON_INITIALIZER;
		bson_iter_t it;
		/* $set may not name _id; copy the rest. */
		if (bson_iter_init(&it, &mine))
			while (bson_iter_next(&it))
				if (strcmp(bson_iter_key(&it), "_id") != 0)
					BSON_APPEND_VALUE(&set, bson_iter_key(&it), bson_iter_value(&it));
		int rc = try_takeover(l, &me, &held, &set, err);
		bson_destroy(&set);
		bson_destroy(&held);
		bson_destroy(&mine);
		return rc == 1;
	}
	gfs_error_set(err, GFS_EBUSY, "lock '%s' is changing hands; try again", l->name);
	return false;
}

static bool
renew(gfs_lock *l)
{
	int64_t sent = gfs_clock_ns(CLOCK_BOOTTIME);
	int64_t expires = gfs_now_ms() + (int64_t)l->ttl_s * 1000;
	bson_t filter = BSON_INITIALIZER, update = BSON_INITIALIZER, set, reply;
	BSON_APPEND_UTF8(&filter, "_id", l->name);
	BSON_APPEND_UTF8(&filter, "owner", l->owner);
	BSON_APPEND_DOCUMENT_BEGIN(&update, "$set", &set);
	BSON_APPEND_DATE_TIME(&set, "expires", expires);
	bson_append_document_end(&update, &set);
	bson_error_t berr;
	bool ok = mongoc_collection_update_one(l->coll, &filter, &update, NULL, &reply, &berr);
	bool still_ours = true;
	if (ok) {
		bson_iter_t it;
		still_ours = !(bson_iter_init_find(&it, &reply, "matchedCount") && bson_iter_as_int64(&it) == 0);
	}
	bson_destroy(&filter);
	bson_destroy(&update);
	bson_destroy(&reply);
	if (!still_ours)
		return false;
	/* Nobody took it over in between (the filter names us): the lease runs from the send. */
	if (ok) {
		atomic_store(&l->granted_ns, sent);
		return true;
	}
	/* A failed renewal is retried; the lock is lost only once it has run out. */
	return !lease_over(l);
}

static void *
heartbeat(void *arg)
{
	gfs_lock *l = arg;
	pthread_mutex_lock(&l->mu);
	while (!l->stop) {
		struct timespec ts;
		/* The condition variable waits on CLOCK_MONOTONIC: setting the date back must not stall us. */
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += l->ttl_s / 3 > 0 ? l->ttl_s / 3 : 1;
		pthread_cond_timedwait(&l->cond, &l->mu, &ts);
		if (l->stop)
			break;
		pthread_mutex_unlock(&l->mu);
		bool ok = renew(l);
		pthread_mutex_lock(&l->mu);
		if (!ok) {
			atomic_store(&l->lost, true);
			break;
		}
	}
	pthread_mutex_unlock(&l->mu);
	return NULL;
}

/* A filter on the lock documents whose names start with prefix: a range, the collection is small. */
static bool
names_from(bson_t *filter, const char *prefix, gfs_error *err)
{
	/* Names from prefix up to (not including) prefix with its last byte one higher. */
	char *upper = gfs_xstrdup(prefix);
	size_t n = strlen(upper);
	if (n == 0 || (unsigned char)upper[n - 1] == 0xff) {
		free(upper);
		gfs_error_set(err, GFS_EINVAL, "lock prefix '%s' cannot bound a range", prefix);
		return false;
	}
	upper[n - 1]++;
	bson_t range;
	BSON_APPEND_DOCUMENT_BEGIN(filter, "_id", &range);
	BSON_APPEND_UTF8(&range, "$gte", prefix);
	BSON_APPEND_UTF8(&range, "$lt", upper);
	bson_append_document_end(filter, &range);
	free(upper);
	return true;
}

/* A take counter ({_id: NAME GFS_LOCK_TAKEN_SUFFIX, n}), which is no lock. */
static bool
is_counter(const bson_t *doc)
{
	const char *id = doc_str(doc, "_id");
	size_t n = strlen(id), k = strlen(GFS_LOCK_TAKEN_SUFFIX);
	return n > k && strcmp(id + n - k, GFS_LOCK_TAKEN_SUFFIX) == 0 && !bson_has_field(doc, "owner");
}

/*
 * The length of name's family, and its scope: the prefix after the first
 * ':' of a scoped name (one that ends in '/'), "" (the whole bucket) else.
 */
static size_t
split_scope(const char *name, const char **scope)
{
	const char *colon = strchr(name, ':');
	size_t n = strlen(name);
	if (colon && name[n - 1] == '/') {
		*scope = colon + 1;
		return (size_t)(colon - name);
	}
	*scope = "";
	return n;
}

char *
gfs_lock_scoped_name(const char *family, const char *prefix)
{
	return prefix && *prefix ? gfs_xasprintf("%s:%s", family, prefix) : gfs_xstrdup(family);
}

bool
gfs_lock_of_family(const char *name, const char *family)
{
	const char *scope;
	size_t n = split_scope(name, &scope);
	return n == strlen(family) && strncmp(name, family, n) == 0;
}

bool
gfs_lock_excludes(const char *a, const char *b)
{
	if (strcmp(a, b) == 0)
		return true;
	const char *sa, *sb;
	size_t fa = split_scope(a, &sa), fb = split_scope(b, &sb);
	if (fa != fb || strncmp(a, b, fa) != 0)
		return false;
	size_t la = strlen(sa), lb = strlen(sb);
	return strncmp(sa, sb, la < lb ? la : lb) == 0;
}

/* A cursor over the documents of name's family (locks and counters); NULL with err set. */
static mongoc_cursor_t *
find_family(mongoc_collection_t *coll, const char *name, gfs_error *err)
{
	const char *scope;
	char *family = gfs_xstrndup(name, split_scope(name, &scope));
	bson_t filter = BSON_INITIALIZER;
	bool ok = names_from(&filter, family, err);
	free(family);
	mongoc_cursor_t *cur = ok ? mongoc_collection_find_with_opts(coll, &filter, NULL, NULL) : NULL;
	bson_destroy(&filter);
	return cur;
}

/*
 * After our take of a numbered lock: fails with GFS_EBUSY (err set) when
 * another lock of its family with an overlapping scope is held; else counts
 * one take on each overlapping scope's counter (see lock.h).
 */
static bool
check_overlaps(gfs_lock *l, gfs_error *err)
{
	mongoc_cursor_t *cur = find_family(l->coll, l->name, err);
	if (!cur)
		return false;
	struct identity me;
	identity_self(&me);
	char **counters = NULL;
	size_t n = 0, cap = 0;
	bool busy = false;
	bool ok;
	const bson_t *doc;
	while (!busy && mongoc_cursor_next(cur, &doc)) {
		const char *id = doc_str(doc, "_id");
		if (is_counter(doc)) {
			size_t k = strlen(id) - strlen(GFS_LOCK_TAKEN_SUFFIX);
			char *base = gfs_xstrndup(id, k);
			if (strcmp(base, l->name) != 0 && gfs_lock_excludes(l->name, base)) {
				GFS_GROW(counters, n + 1, cap, 8);
				counters[n++] = gfs_xstrdup(id);
			}
			free(base);
			continue;
		}
		if (strcmp(id, l->name) == 0 || !gfs_lock_excludes(l->name, id))
			continue;
		gfs_lock_state st;
		judge(doc, &me, &st);
		if (st.held) {
			busy_error(err, id, doc, &st);
			busy = true;
		}
	}
	ok = gfs_cursor_done(cur, "read the locks that could overlap", err) && !busy;
	for (size_t i = 0; i < n; i++) {
		bson_t q = BSON_INITIALIZER, update = BSON_INITIALIZER, inc;
		BSON_APPEND_UTF8(&q, "_id", counters[i]);
		BSON_APPEND_DOCUMENT_BEGIN(&update, "$inc", &inc);
		BSON_APPEND_INT64(&inc, "n", 1);
		bson_append_document_end(&update, &inc);
		bson_error_t berr;
		if (ok && !mongoc_collection_update_one(l->coll, &q, &update, NULL, NULL, &berr)) {
			gfs_error_from_bson(err, &berr, "count a take on an overlapping lock");
			ok = false;
		}
		bson_destroy(&q);
		bson_destroy(&update);
		free(counters[i]);
	}
	free(counters);
	return ok;
}

int
gfs_lock_overlap_held(gfs_session *s, const char *name, gfs_error *err)
{
	mongoc_collection_t *coll = gfs_session_bucket_collection(s, GFS_LOCKS_SUFFIX);
	mongoc_cursor_t *cur = find_family(coll, name, err);
	if (!cur) {
		mongoc_collection_destroy(coll);
		return -1;
	}
	struct identity me;
	identity_self(&me);
	int held = 0;
	const bson_t *doc;
	while (!held && mongoc_cursor_next(cur, &doc)) {
		if (is_counter(doc) || !gfs_lock_excludes(name, doc_str(doc, "_id")))
			continue;
		gfs_lock_state st;
		judge(doc, &me, &st);
		held = st.held;
	}
	if (!gfs_cursor_done(cur, "read the locks that could overlap", err))
		held = -1;
	mongoc_collection_destroy(coll);
	return held;
}

int
gfs_lock_read(gfs_session *s, const char *name, gfs_lock_state *st, gfs_error *err)
{
	memset(st, 0, sizeof *st);
	st->expires = -1;
	mongoc_collection_t *coll = gfs_session_bucket_collection(s, GFS_LOCKS_SUFFIX);
	bson_t held;
	gfs_error ferr;
	gfs_error_clear(&ferr);
	int rc = 0;
	if (find_holder(coll, name, &held, &ferr)) {
		struct identity me;
		identity_self(&me);
		judge(&held, &me, st);
		bson_destroy(&held);
		rc = 1;
	} else if (ferr.code != GFS_OK) {
		*err = ferr;
		rc = -1;
	}
	mongoc_collection_destroy(coll);
	return rc;
}

int
gfs_lock_held(gfs_session *s, const char *name, gfs_error *err)
{
	gfs_lock_state st;
	int rc = gfs_lock_read(s, name, &st, err);
	return rc < 0 ? -1 : rc && st.held;
}

const char *
gfs_lock_note(const gfs_lock *l)
{
	return l && l->note[0] ? l->note : NULL;
}

bool
gfs_lock_sweep(gfs_session *s, const char *prefix, bool remove, int64_t *held, int64_t *stale,
               gfs_error *err)
{
	*held = *stale = 0;
	bson_t filter = BSON_INITIALIZER;
	if (!names_from(&filter, prefix, err)) {
		bson_destroy(&filter);
		return false;
	}
	mongoc_collection_t *coll = gfs_session_bucket_collection(s, GFS_LOCKS_SUFFIX);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(coll, &filter, NULL, NULL);
	bson_destroy(&filter);
	struct identity me;
	identity_self(&me);
	/* Read them all first: removing while the cursor is open could make it skip some. */
	bson_t **gone = NULL;
	size_t ngone = 0, cap = 0;
	const bson_t *doc;
	while (mongoc_cursor_next(cur, &doc)) {
		if (is_counter(doc))
			continue;
		gfs_lock_state st;
		judge(doc, &me, &st);
		if (st.held) {
			(*held)++;
			continue;
		}
		(*stale)++;
		if (!remove)
			continue;
		/* As a take-over would: only if it is still the document judged stale. */
		bson_t *match = bson_new();
		bson_iter_t it;
		if (bson_iter_init_find(&it, doc, "_id"))
			BSON_APPEND_VALUE(match, "_id", bson_iter_value(&it));
		gfs_same_filter(match, doc, "owner");
		gfs_same_filter(match, doc, "expires");
		GFS_GROW(gone, ngone + 1, cap, 16);
		gone[ngone++] = match;
	}
	bool ok = gfs_cursor_done(cur, "read locks", err);
	for (size_t i = 0; i < ngone; i++) {
		bson_error_t berr;
		if (ok && !mongoc_collection_delete_one(coll, gone[i], NULL, NULL, &berr)) {
			gfs_error_from_bson(err, &berr, "remove a stale lock");
			ok = false;
		}
		bson_destroy(gone[i]);
	}
	free(gone);
	mongoc_collection_destroy(coll);
	return ok;
}

int64_t
gfs_lock_takes(gfs_session *s, const char *name, gfs_error *err)
{
	char *id = gfs_xasprintf("%s%s", name, GFS_LOCK_TAKEN_SUFFIX);
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&filter, "_id", id);
	BSON_APPEND_INT32(&opts, "limit", 1);
	mongoc_collection_t *coll = gfs_session_bucket_collection(s, GFS_LOCKS_SUFFIX);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(coll, &filter, &opts, NULL);
	const bson_t *doc;
	int64_t n = 0;
	bson_iter_t it;
	if (mongoc_cursor_next(cur, &doc) && bson_iter_init_find(&it, doc, "n") && BSON_ITER_HOLDS_NUMBER(&it))
		n = bson_iter_as_int64(&it);
	if (!gfs_cursor_done(cur, "read the lock's takes", err))
		n = -1;
	mongoc_collection_destroy(coll);
	bson_destroy(&opts);
	bson_destroy(&filter);
	free(id);
	return n;
}

void
gfs_owner_append(bson_t *doc)
{
	struct identity me;
	identity_self(&me);
	char owner[512];
	owner_string(owner, sizeof owner, &me);
	append_identity(doc, &me, owner);
}

bool
gfs_owner_gone(const bson_t *doc)
{
	struct identity me;
	identity_self(&me);
	return holder_gone(doc, &me);
}

/* Counts this take (see lock.h); 0 when the count cannot be had, which followers take as a gap. */
static int64_t
count_take(gfs_lock *l)
{
	char *id = gfs_xasprintf("%s%s", l->name, GFS_LOCK_TAKEN_SUFFIX);
	bson_t query = BSON_INITIALIZER, update = BSON_INITIALIZER, inc, reply;
	BSON_APPEND_UTF8(&query, "_id", id);
	BSON_APPEND_DOCUMENT_BEGIN(&update, "$inc", &inc);
	BSON_APPEND_INT64(&inc, "n", 1);
	bson_append_document_end(&update, &inc);
	mongoc_find_and_modify_opts_t *fam = mongoc_find_and_modify_opts_new();
	mongoc_find_and_modify_opts_set_update(fam, &update);
	mongoc_find_and_modify_opts_set_flags(
	    fam, MONGOC_FIND_AND_MODIFY_UPSERT | MONGOC_FIND_AND_MODIFY_RETURN_NEW);
	int64_t n = 0;
	bson_iter_t it, v;
	if (mongoc_collection_find_and_modify_with_opts(l->coll, &query, fam, &reply, NULL) &&
	    bson_iter_init(&it, &reply) && bson_iter_find_descendant(&it, "value.n", &v) &&
	    BSON_ITER_HOLDS_NUMBER(&v))
		n = bson_iter_as_int64(&v);
	bson_destroy(&reply);
	mongoc_find_and_modify_opts_destroy(fam);
	bson_destroy(&update);
	bson_destroy(&query);
	free(id);
	return n;
}

gfs_lock *
gfs_lock_acquire(gfs_conn *conn, const char *name, int ttl_s, gfs_error *err)
{
	gfs_lock *l = gfs_xcalloc(1, sizeof *l);
	l->name = gfs_xstrdup(name);
	l->ttl_s = ttl_s > 0 ? ttl_s : GFS_LOCK_DEFAULT_TTL;
	l->s = gfs_session_pop(conn);
	l->coll = gfs_session_bucket_collection(l->s, GFS_LOCKS_SUFFIX);
	pthread_mutex_init(&l->mu, NULL);
	pthread_condattr_t attr;
	pthread_condattr_init(&attr);
	if (pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) != 0)
		abort();
	pthread_cond_init(&l->cond, &attr);
	pthread_condattr_destroy(&attr);
	if (!take(l, err)) {
		mongoc_collection_destroy(l->coll);
		gfs_session_push(l->s);
		pthread_mutex_destroy(&l->mu);
		pthread_cond_destroy(&l->cond);
		free(l->name);
		free(l);
		return NULL;
	}
	/* The heartbeat must not take the signals the caller handles. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	if (pthread_create(&l->thread, NULL, heartbeat, l) != 0)
		abort();
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return l;
}

gfs_lock *
gfs_lock_acquire_numbered(gfs_conn *conn, const char *name, int ttl_s, gfs_error *err)
{
	gfs_lock *l = gfs_lock_acquire(conn, name, ttl_s, err);
	if (!l)
		return NULL;
	if (!check_overlaps(l, err)) {
		gfs_lock_release(l);
		return NULL;
	}
	l->generation = count_take(l);
	return l;
}

int64_t
gfs_lock_generation(const gfs_lock *l)
{
	return l ? l->generation : 0;
}

bool
gfs_lock_lost(gfs_lock *l)
{
	if (!l)
		return false;
	/* Once over, for good: someone may have taken over and cleaned up after us meanwhile. */
	if (!atomic_load(&l->lost) && lease_over(l))
		atomic_store(&l->lost, true);
	return atomic_load(&l->lost);
}

void
gfs_lock_release(gfs_lock *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	l->stop = true;
	pthread_cond_signal(&l->cond);
	pthread_mutex_unlock(&l->mu);
	pthread_join(l->thread, NULL);
	bson_t filter = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&filter, "_id", l->name);
	BSON_APPEND_UTF8(&filter, "owner", l->owner);
	mongoc_collection_delete_one(l->coll, &filter, NULL, NULL, NULL);
	bson_destroy(&filter);
	mongoc_collection_destroy(l->coll);
	gfs_session_push(l->s);
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->cond);
	free(l->name);
	free(l);
}
