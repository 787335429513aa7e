/*
 * Advisory locks kept in the database, so that two processes on any hosts
 * do not run the same job on one bucket at once (two imports, or an import
 * and a repair that removes unfinished uploads).
 *
 * A lock is the document {_id: NAME} in the collection
 * <bucket>.gridfsctl_locks, holding its owner (host, boot id, pid, process
 * start time) and an expiry that a thread renews every ttl/3 seconds. A lock
 * is stale, and may be taken over, once its expiry has passed (hosts' clocks
 * must roughly agree), or at once when its owner ran on this host since the
 * same boot and that process is gone (a kill -9 leaves no wait behind).
 *
 * Every verb reads a lock document one way (gfs_lock_read): a document
 * without an owner, or whose expires is not a date or is missing, is
 * malformed. Only a date is a lease: a malformed document is stale once
 * its lease is over, or at once when it has none, and the next taker
 * takes it over and says so (gfs_lock_note).
 *
 * A lock taken again and again under one name (import's) can have its
 * takes numbered, in {_id: NAME GFS_LOCK_TAKEN_SUFFIX, n}: a holder that
 * finds its next take numbered one past its last knows that nobody held the
 * lock in between (watch trusts what it knows of the bucket on that
 * ground). Locks named once (put's) are not numbered: the count would be a
 * document left behind per lock.
 *
 * A numbered lock may be scoped to a folder prefix: NAME ":" PREFIX (a
 * normalized prefix, ending in '/') covers the stored names under PREFIX,
 * NAME alone the whole bucket. Two takes exclude each other when their
 * scopes overlap, byte for byte: one prefix starts the other, or either is
 * the whole bucket ("import:posters/" and "import:posters/ab/" do;
 * "import:posters/a/" and "import:posters/b/" do not). Every take writes
 * its own document first and then reads the family's; a taker that finds
 * an overlapping holder removes its own and fails, so of two overlapping
 * takers at least one sees the other (both may fail: try again). A take
 * also counts one take on every overlapping scope's counter, so that a
 * holder of posters/a/ sees a gap once the whole bucket was held between
 * its takes.
 */
#ifndef GFS_LOCK_H
#define GFS_LOCK_H

#include "gfs.h"

#define GFS_LOCKS_SUFFIX "gridfsctl_locks"
#define GFS_LOCK_DEFAULT_TTL 60
#define GFS_LOCK_TAKEN_SUFFIX ".taken"
/* A put's own lock, "put-" and its files_id (lib/markers.c). */
#define GFS_PUT_LOCK_PREFIX "put-"

typedef struct gfs_lock gfs_lock;

/* Takes the lock or fails with GFS_EBUSY naming the holder (or GFS_EBACKEND). */
gfs_lock *gfs_lock_acquire(gfs_conn *conn, const char *name, int ttl_s, gfs_error *err);
/*
 * The same, with this take numbered (gfs_lock_generation), and failing with
 * GFS_EBUSY while another lock of its family with an overlapping scope is
 * held; every taker of such a lock uses it.
 */
gfs_lock *gfs_lock_acquire_numbered(gfs_conn *conn, const char *name, int ttl_s, gfs_error *err);
/*
 * True once the lock was taken over by another process, or once our lease
 * may have run out (no renewal got through for ttl less a third of it, on
 * a clock that counts while the process is stopped or the host sleeps):
 * check it right before each write that others' clean-up must not race.
 */
bool gfs_lock_lost(gfs_lock *l);
/* The name of family's lock over the normalized prefix ("" or NULL: the whole bucket); free() it. */
char *gfs_lock_scoped_name(const char *family, const char *prefix);
/* Whether holders of locks a and b exclude each other: the same name, or overlapping scopes. */
bool gfs_lock_excludes(const char *a, const char *b);
/* Whether name is family's lock, over the whole bucket or a prefix. */
bool gfs_lock_of_family(const char *name, const char *family);
/* This take's number among the numbered takes of the lock's name, from 1; 0 when not counted. */
int64_t gfs_lock_generation(const gfs_lock *l);
/* A lock document as every verb reads it. */
typedef struct gfs_lock_state {
	bool found;
	bool held;            /* its lease is not over and its holder not known gone */
	char holder[300];     /* "HOST pid PID", "?" for what the document lacks */
	int64_t expires;      /* the lease's end, ms since the epoch; -1: none (not a date) */
	char malformed[96];   /* "" or what is wrong: "no owner", "expires is not a date", ... */
} gfs_lock_state;

/* Reads the lock document name: 1 found, 0 none (st zeroed), -1 error (err set). */
int gfs_lock_read(gfs_session *s, const char *name, gfs_lock_state *st, gfs_error *err);
/*
 * Whether someone holds the lock now (gfs_lock_read's held), without
 * taking it: 1 held, 0 free, -1 error (err set).
 */
int gfs_lock_held(gfs_session *s, const char *name, gfs_error *err);
/* 1 when name or a lock of its family whose scope overlaps it is held, 0 when none is, -1 on error. */
int gfs_lock_overlap_held(gfs_session *s, const char *name, gfs_error *err);
/*
 * Counts the lock documents whose names start with prefix, as
 * gfs_lock_read() judges them, into *held and *stale; with remove, the
 * stale ones go (each only if it is still the document judged). Locks named
 * once (put's "put-ID") are left by a process killed between taking and
 * releasing them, and nobody takes them again. Take counters are not locks:
 * they are not counted.
 */
bool gfs_lock_sweep(gfs_session *s, const char *prefix, bool remove, int64_t *held, int64_t *stale,
                    gfs_error *err);
/* A line the take has for the user (it took over a malformed document), or NULL. */
const char *gfs_lock_note(const gfs_lock *l);
/*
 * How many numbered takes the lock's name has had so far (0: none), without
 * taking it; -1 on error (err set).
 */
int64_t gfs_lock_takes(gfs_session *s, const char *name, gfs_error *err);
/* Stops renewing and removes the lock document if it is still ours. */
void gfs_lock_release(gfs_lock *l);

/*
 * The verb this process runs ("rm", "import", ...), which its locks and
 * markers name (field "verb") so that what a killed process left says who
 * left it. Set once at start, before any thread; NULL: named nowhere.
 */
void gfs_owner_set_verb(const char *verb);
const char *gfs_owner_verb(void);
/*
 * The owner fields of a lock (owner, verb, host, bootId, pid, startTime), for
 * other records of work under way that must tell a dead writer from a
 * live one: gfs_owner_gone() reads them back.
 */
void gfs_owner_append(bson_t *doc);
/* Whether the process doc's owner fields name ran on this host since this boot and is gone. */
bool gfs_owner_gone(const bson_t *doc);

#endif
