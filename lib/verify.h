/*
 * verify: check every files document of a bucket (or of a prefix, or a
 * sample) against its chunks, hashing in parallel with reading.
 *
 * The chunks are streamed with no sort, as the query rule of
 * docs/design.md wants: the whole bucket in one pass in natural order, a
 * selection by a query per file (read_strategy.h). A file's chunks may come in
 * any order, interleaved with others': each is placed by its n, so that
 * the checks see what a pass sorted by {files_id: 1, n: 1} would show and
 * every way finds the same problems. Chunks that come before their turn
 * are held, up to a bound in bytes; past it their file is read again by
 * files_id at the end. A file's verdict waits for the end of the pass (a
 * duplicate may come last), its hash state does not. Problems are handed
 * to a callback on the calling thread, each once.
 *
 * Chunks without a files document are orphans unless an import is writing
 * them: import marks each upload (and each removal) in
 * <bucket>.gridfsctl_uploads before its first chunk and holds the bucket's
 * import lock while it works, so such chunks with a marker and a live lock
 * are reported as in progress instead. Markers are read only for the files_ids
 * that look orphaned, marker first, then the files document again (an upload
 * that completed during the pass removes its marker after its document is
 * in), so no order of events makes a finished upload look orphaned. A put
 * (put, watch, --repair's re-uploads) marks its upload the same way under a
 * lock of its own, which its marker names. Last, chunks seen in the pass
 * but gone by then were removed while verify ran (an old revision trimmed):
 * in progress too, never orphans.
 */
#ifndef GFS_VERIFY_H
#define GFS_VERIFY_H

#include <stdatomic.h>

#include "gfs.h"
#include "read_strategy.h"

enum gfs_verify_kind {
	GFS_VK_MISSING_CHUNK,   /* a chunk 0..count-1 is absent */
	GFS_VK_WRONG_SIZE,      /* a chunk is shorter or longer than it must be */
	GFS_VK_EXTRA_CHUNK,     /* a chunk numbered count or beyond, or a duplicate n */
	GFS_VK_CHECKSUM,        /* content differs from metadata.sha256 (or legacy md5) */
	GFS_VK_UNVERIFIABLE,    /* neither metadata.sha256 nor md5 to check against */
	GFS_VK_ORPHAN_CHUNKS,   /* chunks whose files_id has no files document */
	GFS_VK_INCOMPLETE,      /* a files document with length > 0 and no chunks at all */
	GFS_VK_BAD_DOC,         /* a malformed files document, or a chunk without n or data */
	/*
	 * Not a problem: chunks without a files document that an import at work
	 * has marked as its own (an upload or a removal in flight), or whose
	 * files document appeared while verify ran. Counted apart, never repaired.
	 */
	GFS_VK_IN_PROGRESS,
};

/* "MISSING-CHUNK", "WRONG-SIZE", ... as printed and documented. */
const char *gfs_verify_kind_name(enum gfs_verify_kind k);

/*
 * Duplicate chunks (a second copy of an n the file has) kept by _id per file
 * for a repair; chunks numbered count or beyond need no _id, a filter on n
 * finds them all.
 */
#define GFS_VERIFY_MAX_EXTRA_IDS 16

typedef struct gfs_verify_problem {
	enum gfs_verify_kind kind;
	const bson_value_t *id;     /* the files _id, or the orphans' files_id; NULL if none */
	const char *filename;       /* NULL for orphans and for documents without one */
	const gfs_file *file;       /* the parsed files document; NULL for orphans and BAD-DOC */
	int64_t n;                  /* the chunk concerned, -1 when none */
	int64_t count;              /* ORPHAN-CHUNKS, EXTRA-CHUNK: how many chunks */
	int64_t bytes;              /* ORPHAN-CHUNKS: their data bytes */
	char detail[512];           /* e.g. "n=3", "n=0 has 100 bytes, expected 200" */
	char actual[65];            /* CHECKSUM: the content's hash as found (sha256 or md5) */
	/* EXTRA-CHUNK: chunks 0..count-1 are whole and match the hash when one is stored */
	bool data_intact;
	bool verified;              /* EXTRA-CHUNK: a stored hash was compared and matched */
	int64_t chunk_count;        /* EXTRA-CHUNK: the chunks the file must have */
	int64_t dups;               /* EXTRA-CHUNK: of count, second copies of an n below chunk_count */
	/*
	 * EXTRA-CHUNK: _ids of the duplicates, at most GFS_VERIFY_MAX_EXTRA_IDS;
	 * the copies read and hashed are not among them. Only a verified hash
	 * shows that the copies read are the right ones.
	 */
	size_t n_extra_ids;
	const bson_value_t *extra_ids;
} gfs_verify_problem;

/* The verdict on one checked file, for comparisons with a disk tree. */
typedef struct gfs_verify_file {
	const gfs_file *file;
	bool intact;                /* all chunks present and sized, hash matches when stored */
	bool verified;              /* a stored hash was compared and matched */
	bool data_whole;            /* as intact, but extra chunks aside (a repair can drop them) */
	char sha256[65];            /* the content's sha256 when all chunks were read, else "" */
} gfs_verify_file;

typedef void (*gfs_verify_problem_fn)(const gfs_verify_problem *p, void *ctx);
typedef void (*gfs_verify_file_fn)(const gfs_verify_file *v, void *ctx);
typedef void (*gfs_verify_progress_fn)(uint64_t files, uint64_t bytes, void *ctx);

typedef struct gfs_verify_opts {
	const char *prefix;          /* NULL or "": the whole bucket */
	double sample;               /* fraction of files to check, (0, 1]; 0 means 1 */
	uint64_t seed;               /* for sampling */
	int threads;                 /* hashing threads; 0: chosen from the CPU count */
	/* GFS_READ_AUTO: chosen by gfs_read_choose() from what is selected and the server */
	enum gfs_read_strategy strategy;
	int jobs;                    /* GFS_READ_EACH: connections reading at once; 0: 4 */
	/* GFS_READ_SCAN: bytes of chunks held before their turn; 0: GFS_READ_HOLD_DEFAULT */
	size_t hold_bytes;
	gfs_verify_problem_fn on_problem;
	gfs_verify_file_fn on_file;  /* may be NULL */
	gfs_verify_progress_fn on_progress;  /* may be NULL; called now and then */
	void *ctx;
	const atomic_int *stop;      /* when it becomes non-zero the pass ends with GFS_ECANCELED */
	/*
	 * NULL, or what else a file must pass to be checked: its name below
	 * prefix (--include, --exclude, --files-from). A selection, as a
	 * prefix is: orphan chunks are then not looked for.
	 */
	bool (*select)(const char *rel, void *ctx);
	/*
	 * The caller holds the import lock, so no import is at work: chunks that
	 * upload markers name are an interrupted import's leftovers (orphans).
	 */
	bool own_import_lock;
} gfs_verify_opts;

typedef struct gfs_verify_stats {
	uint64_t files;              /* files documents selected */
	uint64_t files_checked;      /* files given a verdict */
	uint64_t bytes;              /* chunk data bytes read of selected files */
	uint64_t chunks;             /* chunk documents read */
	uint64_t total_bytes;        /* sum of the selected files' lengths */
	uint64_t problems;           /* every kind but GFS_VK_IN_PROGRESS */
	uint64_t in_progress;        /* GFS_VK_IN_PROGRESS groups */
	uint64_t by_kind[GFS_VK_IN_PROGRESS + 1];
	bool orphans_checked;        /* the whole bucket was read, so orphan chunks were looked for */
	enum gfs_read_strategy strategy;  /* the one used */
	bool sampled_by_server;      /* --sample drew its files with aggregate's $sample */
	int threads;
} gfs_verify_stats;

/*
 * Runs the check. Returns false only on a fatal error (backend, canceled);
 * problems found are not failures, they are counted in stats.
 */
bool gfs_verify(gfs_conn *conn, const gfs_verify_opts *opts, gfs_verify_stats *stats,
                gfs_error *err);

/* ---- repairs --------------------------------------------------------- */

/*
 * Deletes the chunks with this files_id whose ObjectId _id was made before
 * before_ms (ms since the epoch; 0: all chunks, whatever their _id); so that
 * chunks of an upload still in progress are spared. *deleted gets how many.
 */
bool gfs_verify_remove_chunks(gfs_session *s, const bson_value_t *files_id, int64_t before_ms,
                              int64_t *deleted, gfs_error *err);
/* Deletes the chunks with this files_id numbered count or beyond, or below 0. */
bool gfs_verify_remove_chunks_beyond(gfs_session *s, const bson_value_t *files_id, int64_t count,
                                     int64_t *deleted, gfs_error *err);
/*
 * Checks made again right before a repair deletes, since the pass's view
 * may be old: 1 when a files document with this _id exists (chunks: a
 * chunk with this files_id), matched as the server matches; 0 when none;
 * -1 on error.
 */
int gfs_verify_file_exists(gfs_session *s, const bson_value_t *id, gfs_error *err);
int gfs_verify_chunks_exist(gfs_session *s, const bson_value_t *files_id, gfs_error *err);
/* Deletes chunk documents of files_id by their own _id. */
bool gfs_verify_remove_chunk_ids(gfs_session *s, const bson_value_t *files_id,
                                 const bson_value_t *ids, size_t n, int64_t *deleted,
                                 gfs_error *err);
/* Sets metadata.sha256 of a files document (for a file found equal to its disk copy). */
bool gfs_verify_set_sha256(gfs_session *s, const bson_value_t *id, const char *sha256_hex,
                           gfs_error *err);

/* ---- sealing: verify --seal ------------------------------------------ */

/*
 * pymongo 4, the Node driver 7 and the Go driver 1.17 store no hash, so
 * nothing proves a file they wrote. A file that stores none (no
 * metadata.sha256, no md5) is unsealed; --seal gives each one the pass
 * found whole metadata.sha256 (what the pass computed) and
 * metadata.sealedAt, and touches nothing else of its document: from then on
 * every reader proves it as it proves a file gridfsctl wrote. The update is
 * a compare-and-swap on the document the pass read (same _id, length and
 * uploadDate, still no hash), so a file changed between the read and the
 * seal is left unsealed.
 */

/* Whether f stores no hash at all: no metadata.sha256 and no md5 field, of any type. */
bool gfs_verify_unsealed(const gfs_file *f);

/* What sealing a file needs, kept from the pass (f's document is gone by then). */
typedef struct gfs_seal {
	bson_value_t id;
	char *filename;            /* NULL when the document has none */
	char sha256[65];
	bson_t match;              /* the compare-and-swap filter */
	bool metadata_ok;          /* metadata absent or a document: a field can be added to it */
} gfs_seal;

void gfs_seal_init(gfs_seal *sl, const gfs_file *f, const char *sha256_hex);
void gfs_seal_free(gfs_seal *sl);
/*
 * Stores metadata.sha256 and metadata.sealedAt (now_ms). 1: sealed; 0: not,
 * with why in err (the document changed since the pass read it, or its
 * metadata is not a document); -1: error (err set).
 */
int gfs_verify_seal(gfs_session *s, const gfs_seal *sl, int64_t now_ms, gfs_error *err);

/* ---- pure helpers, exposed for unit tests ----------------------------- */

/* Parses "10%", "10", "0.5%" into a fraction in (0, 1]. */
bool gfs_verify_parse_percent(const char *s, double *out);
/* Whether a file with this id falls in a sample of the given fraction. */
bool gfs_verify_sampled(const bson_value_t *id, double fraction, uint64_t seed);

/* The per-file chunk checker, driven chunk by chunk. */
typedef struct gfs_chunk_check {
	int64_t length;
	int32_t chunk_size;
	int64_t expected;            /* chunk count */
	int64_t next;                /* the n wanted next */
	bool failed;
	enum gfs_verify_kind fail_kind;
	int64_t fail_n;
	char fail_detail[200];
	int64_t extras;
	int64_t first_extra_n;
	int64_t dups;                /* extras with 0 <= n < expected: a second copy of an n */
} gfs_chunk_check;

void gfs_chunk_check_init(gfs_chunk_check *c, int64_t length, int32_t chunk_size);
/*
 * Feeds one chunk (n, data length; has_n/has_data false when the chunk lacks
 * them). Returns 1 when its data is the next part of the content and must be
 * hashed, 0 when it is to be skipped (an extra chunk, or after a failure).
 */
int gfs_chunk_check_add(gfs_chunk_check *c, bool has_n, int64_t n, bool has_data, uint32_t len);
/* Called after the last chunk: notes chunks missing at the end. */
void gfs_chunk_check_end(gfs_chunk_check *c);

#endif
