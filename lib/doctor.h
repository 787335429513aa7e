/*
 * doctor: a health check of one bucket for monitoring (monit, cron), at a
 * bounded cost whatever the bucket's size: a ping, buildInfo, listIndexes
 * on the two collections, two counts the storage keeps ($collStats), the
 * import lock's document and, for orphan chunks, the first sample_size
 * chunks in natural order (no filter, no sort, a limit: sequential reads
 * on MongoDB, sample_size rows on FerretDB), each distinct files_id then
 * looked up by _id equality (an index seek on MongoDB and FerretDB alike).
 *
 * When the bucket holds no more chunks than that, every chunk was read and
 * the orphans are counted exactly. Else the fraction of orphans among those
 * read, scaled to the chunk count, is the estimate: one that sees orphans
 * among the oldest chunks only (natural order is about insertion order),
 * which the report says. A random sample ($sample) would see the others,
 * but FerretDB has no $sample, and verify finds every orphan in its pass.
 */
#ifndef GFS_DOCTOR_H
#define GFS_DOCTOR_H

#include "gfs.h"

#define GFS_DOCTOR_DEFAULT_SAMPLE 200

enum gfs_doctor_index {
	GFS_INDEX_OK,
	GFS_INDEX_MISSING,
	GFS_INDEX_NOT_UNIQUE,   /* chunks: the keys are right, uniqueness is not enforced */
	GFS_INDEX_NOT_NEEDED,   /* missing from an empty bucket: the first write creates it */
};

enum gfs_doctor_lock { GFS_LOCK_FREE, GFS_LOCK_HELD, GFS_LOCK_STALE };

enum gfs_doctor_sampling {
	GFS_SAMPLE_NONE,        /* not estimated (sample_size 0, or no chunks) */
	GFS_SAMPLE_ALL,         /* every chunk was looked at: an exact count */
	GFS_SAMPLE_FIRST,       /* the first chunks in natural order */
};

typedef struct gfs_doctor_report {
	bool reachable;            /* the ping was answered */
	char version[64];          /* the server's buildInfo version */
	char ferretdb[64];         /* FerretDB's own version (maybe "unknown"), "" on MongoDB */
	bool exists;               /* BUCKET.files or BUCKET.chunks exists: not a misspelt --bucket */
	int64_t files, chunks;     /* document counts the storage keeps (estimated) */
	enum gfs_doctor_index files_index, chunks_index;
	enum gfs_doctor_lock lock;
	char lock_owner[320];      /* host and pid of the holder, when the document exists */
	int64_t lock_expires;      /* ms since the epoch, when it exists; -1: it has no lease */
	char lock_malformed[96];   /* what is wrong with the lock's document (gfs_lock_state), or "" */
	int64_t prefix_locks_held; /* import locks of prefixes ("import:PREFIX"): of imports at work */
	int64_t prefix_locks_stale;/* ...and left by killed ones, which the next taker takes over */
	int64_t put_locks_held;    /* puts' own locks ("put-ID"): of puts at work */
	int64_t put_locks_stale;   /* ...and left by killed ones, which the next put removes */
	enum gfs_doctor_sampling sampling;
	int64_t sampled;           /* chunks looked at */
	int64_t sampled_orphans;   /* of those, with no files document and no writer at work */
	int64_t sampled_uploading; /* with no files document but the marker of a writer at work */
	int64_t sampled_left;      /* of the orphans, those a killed writer's marker names */
	char left_by[300];         /* what the first such marker says (gfs_marker_left_by) */
	int64_t orphan_estimate;   /* sampled_orphans scaled to the chunks count */
	int problems;              /* wrong or missing indexes, orphans */
} gfs_doctor_report;

/*
 * Runs every check. False (GFS_EBACKEND) when the backend cannot be reached
 * or a command fails; r holds what was learnt before that.
 */
bool gfs_doctor(gfs_conn *conn, int64_t sample_size, gfs_doctor_report *r, gfs_error *err);

const char *gfs_doctor_index_name(enum gfs_doctor_index s);   /* "ok", "missing", ... */
const char *gfs_doctor_lock_name(enum gfs_doctor_lock s);     /* "free", "held", "stale" */
const char *gfs_doctor_sampling_name(enum gfs_doctor_sampling s); /* "none", "all", "first" */

#endif
