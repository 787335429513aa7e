/*
 * gfs: a GridFS library on mongo-c-driver, written to the GridFS
 * specification. It knows nothing of argv, stdout or terminals: every
 * function reports failure through a gfs_error and leaves printing to
 * the caller.
 */
#ifndef GFS_H
#define GFS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mongoc/mongoc.h>

#include "error.h"
#include "redact.h"
#include "util.h"

#define GFS_DEFAULT_CHUNK_SIZE (255 * 1024)
#define GFS_DEFAULT_URI "mongodb://127.0.0.1:27017"
#define GFS_DEFAULT_DB "test"
#define GFS_DEFAULT_BUCKET "fs"

/* Copies a driver error into err with a short context prefix. */
void gfs_error_from_bson(gfs_error *err, const bson_error_t *berr, const char *context);

/* ---- connection ------------------------------------------------------ */

typedef struct gfs_conn gfs_conn;

/*
 * Opens a thread-safe client pool. db may be NULL (taken from the URI path,
 * else "test"); bucket may be NULL ("fs"). Does not contact the server:
 * call gfs_conn_ping() for that.
 */
gfs_conn *gfs_conn_open(const char *uri, const char *db, const char *bucket, gfs_error *err);
/* The longest wait for a reply, unless the URI or gfs_conn_set_timeout() says. */
#define GFS_REPLY_TIMEOUT_MS 60000
/*
 * The server selection, connect and socket timeouts of later gfs_conn_open()
 * calls where the URI sets none (0: the defaults, 10 s, 10 s and GFS_REPLY_TIMEOUT_MS).
 */
void gfs_conn_set_timeout(int ms);
void gfs_conn_close(gfs_conn *conn);
bool gfs_conn_ping(gfs_conn *conn, gfs_error *err);
const char *gfs_conn_db(const gfs_conn *conn);
const char *gfs_conn_bucket(const gfs_conn *conn);
/* Whether gfs_ensure_indexes() (lib/indexes.c) has the indexes of conn; then, that it has. */
bool gfs_conn_indexes_checked(const gfs_conn *conn);
void gfs_conn_set_indexes_checked(gfs_conn *conn);

/*
 * A client and the two bucket collections, for one thread at a time.
 * Pop one per worker thread; push it back when done.
 *
 * A session is one view of the data: its reads through gfs_session_find()
 * and gfs_session_aggregate() all go to one server, chosen by the read
 * preference at the first of them (the URI's readPreference; the primary on
 * a connection set to gfs_conn_read_primary), so that a files document and
 * its chunks never come from two members that lag differently. Pop one per
 * logical read (a file's document and its chunks, a verify or mirror pass).
 * On a replica set a secondary may be behind: what looks damaged there is
 * to be read again on the primary (gfs_session_to_primary) before it is
 * reported or acted on.
 */
typedef struct gfs_session {
	gfs_conn *conn;
	mongoc_client_t *client;
	mongoc_collection_t *files;
	mongoc_collection_t *chunks;
	uint32_t server_id;     /* the server its reads go to; 0 until the first */
	bool replica_set;       /* that server is a replica set member */
	bool secondary;         /* ...and not the primary: it may be behind */
} gfs_session;

gfs_session *gfs_session_pop(gfs_conn *conn);
void gfs_session_push(gfs_session *s);
/*
 * Reads of every session of conn go to the primary: for verbs that decide
 * writes from what they read (import, put, rm, watch, verify --repair).
 */
void gfs_conn_read_primary(gfs_conn *conn);
/* Reads of conn's sessions on a replica set ask readConcern "majority" (verify, mirror). */
void gfs_conn_read_majority(gfs_conn *conn);
/* A find on coll, one of s's collections, on s's server (see above). */
mongoc_cursor_t *gfs_session_find(gfs_session *s, mongoc_collection_t *coll, const bson_t *filter,
                                  const bson_t *opts);
/* An aggregate on coll, one of s's collections, on s's server. */
mongoc_cursor_t *gfs_session_aggregate(gfs_session *s, mongoc_collection_t *coll,
                                       const bson_t *pipeline, const bson_t *opts);
/*
 * Whether s's reads go to a secondary, whose copy may lag the primary's
 * (choosing the server now, before the first read; false when none answers).
 */
bool gfs_session_on_secondary(gfs_session *s);
/* Sends s's later reads to the primary (to read again what a secondary showed damaged). */
bool gfs_session_to_primary(gfs_session *s, gfs_error *err);
/*
 * Another session of s's connection, its reads pinned to the primary (to
 * read again what s, on a secondary, showed damaged or missing, while s
 * goes on where it is); NULL with err set when no primary answers. Push it.
 */
gfs_session *gfs_session_primary(gfs_session *s, gfs_error *err);
/*
 * Whether err, from a read through s, may be only a secondary's lag, worth
 * reading again on the primary: s reads a secondary, and err is neither the
 * backend failing (asking the primary would wait out its timeout again)
 * nor a stop.
 */
bool gfs_session_may_lag(gfs_session *s, const gfs_error *err);
/*
 * opts (may be NULL) and s's server, into out (the caller destroys it): for
 * the driver's reads that take opts but are not finds (counts).
 */
void gfs_session_read_opts(gfs_session *s, const bson_t *opts, bson_t *out);
/*
 * A find on the primary, whatever the read preference: for reads that
 * decide writes (which revisions to remove, what import need not upload,
 * what watch moves), which must see every write acknowledged so far.
 */
mongoc_cursor_t *gfs_primary_find(mongoc_collection_t *coll, const bson_t *filter,
                                  const bson_t *opts);
/*
 * The bucket's collection BUCKET.SUFFIX (gridfsctl's uploads, locks) on s's
 * client, read on the primary whatever the read preference: writers
 * coordinate through it.
 */
mongoc_collection_t *gfs_session_bucket_collection(gfs_session *s, const char *suffix);
/*
 * Ends a read through cur, wherever its loop stopped, and destroys it:
 * false with err (may be NULL) set, prefixed by what, when the cursor
 * failed. A loop that stopped on its own leaves no cursor error.
 */
bool gfs_cursor_done(mongoc_cursor_t *cur, const char *what, gfs_error *err);

/* ---- indexes (lib/indexes.c) ----------------------------------------- */

/* Whether two index key patterns are the same index (1, 1.0 and int64 1 alike). */
bool gfs_index_keys_equal(const bson_t *a, const bson_t *b);
/* Creates the spec's indexes if the files collection is empty and they are missing. */
bool gfs_ensure_indexes(gfs_session *s, gfs_error *err);

/* ---- files documents ------------------------------------------------- */

typedef struct gfs_file {
	bson_value_t id;        /* _id, any BSON type */
	char *filename;         /* NULL when absent */
	int64_t length;
	int32_t chunk_size;
	int64_t upload_date;    /* ms since the epoch */
	char *content_type;     /* top-level contentType, else metadata.contentType; may be NULL */
	char sha256[65];        /* metadata.sha256, "" when absent or malformed */
	char md5[33];           /* legacy md5, "" when absent or malformed */
	/*
	 * "sha256" or "md5": that digest is stored but is not 64 (32) hex
	 * digits, which the integrity rule counts as damage; "" when none is.
	 */
	char bad_hash[8];
	int64_t mtime_ns;       /* metadata.mtimeNs, else metadata.mtime in ns; -1 when absent */
	int32_t mode;           /* metadata.mode, -1 when absent */
	bson_t *doc;            /* the whole document */
} gfs_file;

/*
 * Parses a files document; tolerant of numeric types and extra fields.
 * A document without an _id, a whole length >= 0 or a whole chunkSize > 0
 * fails with GFS_EBADDOC, the message saying why (not naming the file).
 */
bool gfs_file_parse(const bson_t *doc, gfs_file *out, gfs_error *err);
/* The filename of a files document as stored (NULL when not a string), for one that does not parse. */
const char *gfs_doc_filename(const bson_t *doc);
/*
 * Whether gfs_file_parse() refuses doc (projected, it needs _id, length
 * and chunkSize), and why: a malformed document is a problem of its name,
 * never one to delete unseen.
 */
bool gfs_doc_malformed(const bson_t *doc, gfs_error *why);
void gfs_file_free(gfs_file *f);
/* Number of chunks a file of this length and chunk size must have. */
int64_t gfs_chunk_count(int64_t length, int32_t chunk_size);
/*
 * What chunk n is to a file of count chunks when a reader taking them in
 * n order wants next. The one rule for extra chunks, in every reader
 * (verify, get, mirror, serve), an empty file's included: a chunk numbered
 * outside 0..count-1, or a second copy of one, is damage (EXTRA-CHUNK in
 * verify; get, mirror and serve deliver nothing of the file), though the
 * GridFS spec lets readers ignore it: the bytes are someone's, and a
 * length that disowns them may be the damage.
 */
enum gfs_chunk_place {
	GFS_CHUNK_NEXT,         /* the next part of the content */
	GFS_CHUNK_OUTSIDE,      /* numbered outside the content: extra, damage */
	GFS_CHUNK_DUPLICATE,    /* a second copy of a chunk already read: damage */
	GFS_CHUNK_GAP,          /* chunks before it are missing: damage */
};
enum gfs_chunk_place gfs_chunk_place(int64_t n, int64_t next, int64_t count);
/* A chunk document's n: false when missing, not a number, or not a whole int64. */
bool gfs_chunk_n(const bson_t *doc, int64_t *n);
/*
 * Milliseconds to nanoseconds, held at the int64 limits: a stored date past
 * the year 2262 (or before 1677) has no nanosecond count.
 */
int64_t gfs_ms_to_ns(int64_t ms);
/* Expected length of chunk n. */
int32_t gfs_chunk_expected_len(int64_t length, int32_t chunk_size, int64_t n);
/*
 * Writes the id as text: 24 hex digits for an ObjectId, a string as it is,
 * else the value in relaxed JSON (5, 78.0, {"a": 1}).
 */
char *gfs_id_string(const bson_value_t *id);
/*
 * Equal as the server matches ids: numbers (int32, int64, double) by value
 * whatever their types; else same type and value, so a string _id never
 * equals the ObjectId it spells.
 */
bool gfs_id_equal(const bson_value_t *a, const bson_value_t *b);
/*
 * The form of id that equal ids share, for hashing and map keys: an
 * integral number becomes an int64; anything else is id itself. Shallow:
 * it points into id's storage and is never destroyed.
 */
bson_value_t gfs_id_canonical(const bson_value_t *id);
/* Appends {field: {$eq: id}}: an id that is a document never acts as an operator. */
void gfs_id_filter(bson_t *filter, const char *field, const bson_value_t *id);
/*
 * Appends to filter a condition that field (a dotted path) is as doc has
 * it: $eq its value, or $exists: false when doc has none. A compare-and-swap
 * on these fails once a writer has changed any of them.
 */
void gfs_same_filter(bson_t *filter, const bson_t *doc, const char *field);
/* Appends field: [values]. */
void gfs_append_values(bson_t *doc, const char *field, const bson_value_t *values, size_t n);
/* Appends {field: {$in: [values]}}. */
void gfs_in_filter(bson_t *filter, const char *field, const bson_value_t *values, size_t n);
/*
 * Removes the documents of coll whose field equals one of values (none: no
 * request), by one equality filter per value (never $in) in ordered bulk
 * writes, each filter holding also's conditions too (NULL: none); *deleted,
 * when not NULL, how many. what names the step in err.
 */
bool gfs_delete_each(mongoc_collection_t *coll, const bson_t *also, const char *field,
                     const bson_value_t *values, size_t n, int64_t *deleted, const char *what,
                     gfs_error *err);
/* A growing list of copied ids: gfs_idlist_add() copies v in, gfs_idlist_free() ends it. */
struct gfs_idlist {
	bson_value_t *v;
	size_t n, cap;
};
void gfs_idlist_add(struct gfs_idlist *l, const bson_value_t *v);
void gfs_idlist_free(struct gfs_idlist *l);
/*
 * 1 when coll (one of s's collections) has a document whose field equals
 * id (as the server matches), on s's server; 0 when none, -1 on error (err
 * set, may be NULL). One equality query.
 */
int gfs_exists(gfs_session *s, mongoc_collection_t *coll, const char *field, const bson_value_t *id,
               gfs_error *err);
/*
 * How many chunk documents name files_id, on s's server (one equality
 * count: extras and copies too); -1 on failure.
 */
int64_t gfs_chunk_docs(gfs_session *s, const bson_value_t *files_id);
/* Parses 24 hex digits into an ObjectId value. */
bool gfs_id_parse_oid(const char *s, bson_value_t *out);

/*
 * Finds by name. revision: -1 newest (default), -2 the one before, ...;
 * 0 the original, 1 the next, ... as the GridFS spec.
 */
bool gfs_find_by_name(gfs_session *s, const char *name, int revision, gfs_file *out, gfs_error *err);
bool gfs_find_by_id(gfs_session *s, const bson_value_t *id, gfs_file *out, gfs_error *err);
/*
 * The _id of name's oldest revision, the document unparsed: a malformed one
 * (no valid length or chunkSize) has an id to remove it by too. The caller
 * destroys out.
 */
bool gfs_find_first_id(gfs_session *s, const char *name, bson_value_t *out, gfs_error *err);

/*
 * Calls fn for each files document whose filename starts with prefix
 * (NULL or "" for all), in filename then uploadDate order, and bad for
 * each one that does not parse, in the same order: a malformed document
 * is a problem of its name, never the name's absence (filename is NULL
 * when it has none; why says what is wrong, without the name). Both are
 * required; either returns false to stop early. The gfs_file is freed
 * after fn returns.
 */
typedef bool (*gfs_file_fn)(const gfs_file *f, void *ctx);
typedef bool (*gfs_bad_file_fn)(const bson_t *doc, const char *filename, const gfs_error *why,
                                void *ctx);
bool gfs_list(gfs_session *s, const char *prefix, gfs_file_fn fn, gfs_bad_file_fn bad, void *ctx,
              gfs_error *err);

/*
 * A filter matching exactly the filenames that start with prefix, byte for
 * byte (all when NULL or ""): an index range from prefix to the least
 * string above every name it begins (gfs_prefix_upper).
 */
void gfs_prefix_filter(bson_t *filter, const char *prefix);
/*
 * The least UTF-8 string greater than every string that begins with
 * prefix (valid UTF-8, not ""): prefix with its last code point
 * incremented, skipping surrogates and carrying past U+10FFFF into the one
 * before; MongoDB compares strings by their UTF-8 bytes, where this order
 * is the code point order. NULL when there is none (every code point is
 * U+10FFFF): the range then has no upper bound. Caller frees.
 */
char *gfs_prefix_upper(const char *prefix);

/* ---- reading --------------------------------------------------------- */

/* Receives each chunk's data in order; return false to stop (GFS_ECANCELED). */
typedef bool (*gfs_data_fn)(const uint8_t *data, size_t len, void *ctx);

/*
 * Streams a file's content chunk by chunk, validating numbering and sizes.
 * The chunks are read by files_id with no sort and placed by n: those
 * that come before their turn are held up to a few MiB, past which they
 * are read again one by one by {files_id, n}. A fault is the one a read
 * sorted by n would meet first.
 * When verify_hash is set, content that fails gfs_integrity_check fails
 * with GFS_ECHECKSUM after the last chunk. An empty file's chunks are
 * looked for too (one equality find, limit 1): a chunk of it is extra
 * (GFS_EEXTRACHUNK), as for any file. sha256_out (65 bytes) may be NULL.
 */
bool gfs_read(gfs_session *s, const gfs_file *f, bool verify_hash, gfs_data_fn fn, void *ctx,
              char *sha256_out, gfs_error *err);
/* f read again, checked, on a session pinned to the primary (gfs_session_primary); as gfs_read. */
bool gfs_read_on_primary(gfs_session *s, const gfs_file *f, gfs_data_fn fn, void *ctx,
                         gfs_error *err);

/* A batchSize for chunk cursors that keeps each batch well under 16 MB. */
int32_t gfs_chunk_batch_size(int32_t chunk_size);

/*
 * Where a chunk's n sorts among its file's chunks (as the server sorts
 * BSON): GFS_N_BEFORE every number (no n, null), GFS_N_NUMBER (*n set), or
 * GFS_N_AFTER them (a string, a fraction...). No valid n but a number.
 */
enum gfs_n_place { GFS_N_BEFORE, GFS_N_NUMBER, GFS_N_AFTER };
enum gfs_n_place gfs_chunk_n_place(const bson_t *doc, int64_t *n);

/*
 * Chunks that came before their turn, kept sorted by n: readers read a
 * file's chunks with no sort (docs/design.md) and place them by n.
 */
typedef struct gfs_held {
	bson_t *doc;
	int64_t n;
	struct gfs_held *next;
} gfs_held;

/* Keeps a copy of doc (numbered n) in *list; returns the bytes it holds. */
size_t gfs_held_put(gfs_held **list, const bson_t *doc, int64_t n);
/* The first held chunk when its n is at most upto (the caller destroys it), else NULL. */
bson_t *gfs_held_take(gfs_held **list, int64_t upto);
/* Whether a chunk numbered n is held. */
bool gfs_held_has(const gfs_held *list, int64_t n);
/* Frees every held chunk; returns the bytes they held. */
size_t gfs_held_free(gfs_held **list);

/*
 * The data of chunk n of a file of this length and chunk size, checked as
 * every reader checks it: binary, and of the size n must have. False with
 * err (GFS_EBADDOC, GFS_EWRONGSIZE; name is the file's) otherwise.
 */
bool gfs_chunk_data(const bson_t *doc, int64_t length, int32_t chunk_size, int64_t n,
                    const char *name, const uint8_t **data, uint32_t *len, gfs_error *err);

/*
 * Chunk n of a file, by {files_id, n} equality: 1 with *doc (the caller
 * destroys it), 0 when there is none, -1 with err set when the query failed
 * or n has two copies (GFS_EEXTRACHUNK; name is the file's, for the message).
 */
int gfs_chunk_by_n(gfs_session *s, const bson_value_t *files_id, int64_t n, const char *name,
                   bson_t **doc, gfs_error *err);

/* ---- writing --------------------------------------------------------- */

typedef struct gfs_put_opts {
	const char *filename;
	const char *content_type;   /* NULL: none stored */
	const bson_t *metadata;     /* extra metadata fields; sha256 is added */
	int32_t chunk_size;         /* 0: default */
	const bson_value_t *id;     /* NULL: a new ObjectId (given: not remembered as recovered) */
	/*
	 * > 0: the caller then removes older revisions beyond this many
	 * (gfs_delete_old_revisions); the upload marker stays, naming it, until
	 * gfs_put_trimmed(), so that recovery does the trim of a caller killed first.
	 */
	int keep_revisions;
} gfs_put_opts;

/* Reads up to len bytes; returns bytes read, 0 at end, -1 on error (errno set). */
typedef ssize_t (*gfs_source_fn)(uint8_t *buf, size_t len, void *ctx);

/*
 * Uploads one file: chunks first, in bulk inserts, then the files document.
 * On failure the chunks already written are removed (best effort) when the
 * id is a new one and no files document of it can have landed. The new
 * files document is returned in out when out is not NULL. opts is read again
 * after the last chunk, so a source may fill in content_type as it reads.
 */
bool gfs_put(gfs_session *s, const gfs_put_opts *opts, gfs_source_fn src, void *src_ctx,
             gfs_file *out, gfs_error *err);
/* Removes the upload marker a gfs_put() with keep_revisions left, once the caller has trimmed. */
bool gfs_put_trimmed(gfs_session *s, const bson_value_t *id, gfs_error *err);
/* gfs_source_fn over a file descriptor. ctx is an int *. */
ssize_t gfs_source_fd(uint8_t *buf, size_t len, void *ctx);

/*
 * Batches chunk documents of many files into few bulk inserts. Files
 * documents must be inserted only after gfs_chunk_batch_flush() returns true
 * for every chunk of that file.
 */
typedef struct gfs_chunk_batch gfs_chunk_batch;
gfs_chunk_batch *gfs_chunk_batch_new(size_t max_bytes);
void gfs_chunk_batch_free(gfs_chunk_batch *b);
size_t gfs_chunk_batch_bytes(const gfs_chunk_batch *b);
size_t gfs_chunk_batch_count(const gfs_chunk_batch *b);
void gfs_chunk_batch_add(gfs_chunk_batch *b, const bson_value_t *files_id, int64_t n,
                         const uint8_t *data, size_t len);
/* Inserts what is batched (unordered) and empties the batch. */
bool gfs_chunk_batch_flush(gfs_chunk_batch *b, gfs_session *s, gfs_error *err);

/*
 * The metadata gridfsctl keeps for a file read from disk: mtime (date),
 * mtimeNs (exact, int64 ns), size and mode (permission bits).
 */
struct stat;
void gfs_metadata_from_stat(bson_t *meta, const struct stat *st);

/* Builds a files document as the spec lays it out. */
void gfs_files_doc(bson_t *doc, const bson_value_t *id, const char *filename, int64_t length,
                   int32_t chunk_size, int64_t upload_date_ms, const char *content_type,
                   const char *sha256_hex, const bson_t *metadata);

/* ---- deleting (lib/markers.c: a removal writes a deletion marker first), renaming */

/*
 * Removes the files ids[0..n): files documents first, then chunks, as the
 * spec orders, after recording the ids in a deletion marker, so that a
 * removal cut short (killed, backend gone) is completed by the next
 * gfs_finish_deletions() rather than leaving chunks no document names.
 * lock: a lock the caller holds that covers the removal (NULL: none).
 * *files (may be NULL) counts the files documents removed.
 */
bool gfs_delete_many(gfs_session *s, const bson_value_t *ids, size_t n, const char *lock,
                     int64_t *files, gfs_error *err);
/* gfs_delete_many() of one id; GFS_ENOTFOUND when it had no files document. */
bool gfs_delete(gfs_session *s, const bson_value_t *id, gfs_error *err);
/*
 * Removes the revisions of name older than keep_id (the one just written)
 * beyond keep - 1 of them: keep counts keep_id, which is never removed,
 * and revisions sorting before it by uploadDate stay too. keep_id NULL:
 * keeps the keep newest by uploadDate.
 */
bool gfs_delete_old_revisions(gfs_session *s, const char *name, int keep,
                              const bson_value_t *keep_id, gfs_error *err);
/*
 * (lib/file.c) The ids gfs_delete_old_revisions() would remove, into *out (*nout of
 * them; the caller destroys each and frees *out): one query by filename
 * equality. keep 0 with keep_id NULL: every revision of name.
 */
bool gfs_find_old_revisions(gfs_session *s, const char *name, int keep, const bson_value_t *keep_id,
                            bson_value_t **out, size_t *nout, gfs_error *err);
/* Adds to l the ids gfs_find_old_revisions() finds (keep 0, keep_id NULL: every revision). */
bool gfs_find_old_revisions_into(gfs_session *s, const char *name, int keep,
                                 const bson_value_t *keep_id, struct gfs_idlist *l, gfs_error *err);
/*
 * The spec's rename of one file by _id; metadata.rawName (the bytes of the
 * old name) goes with the old name. GFS_ENOTFOUND when there is no such file.
 */
bool gfs_rename(gfs_session *s, const bson_value_t *id, const char *new_name, gfs_error *err);

/* ---- hashing --------------------------------------------------------- */

typedef struct gfs_sha256 gfs_sha256;
gfs_sha256 *gfs_sha256_new(void);
void gfs_sha256_update(gfs_sha256 *h, const void *data, size_t len);
/* Writes 64 hex digits and a NUL into hex, and frees h. */
void gfs_sha256_final(gfs_sha256 *h, char hex[65]);

/*
 * The integrity rule, one for verify, get, mirror and serve: a file's
 * content is checked against metadata.sha256 when stored, else against the
 * legacy md5 that older drivers wrote (the GridFS spec deprecates md5 but
 * a stored one is still the only proof for such a file), else against
 * nothing. Hex digits compare in either case. A digest stored but
 * malformed (not a string of 64, or 32, hex digits: "", a number, too few
 * digits) is damage, never the absence of a digest: it would turn the
 * check off.
 */
enum gfs_check { GFS_CHECK_NONE, GFS_CHECK_SHA256, GFS_CHECK_MD5, GFS_CHECK_MALFORMED };
/*
 * Reads a stored digest of want hex digits into dst ("" when it is not
 * one); false when it is malformed. BSON null counts as not stored.
 */
bool gfs_hash_field(const bson_iter_t *it, char *dst, size_t want);
/* Which stored digest decides for f. */
enum gfs_check gfs_integrity_rule(const gfs_file *f);
/*
 * True when the content with these digests is what f stores, or f stores
 * none; else false with GFS_ECHECKSUM naming the file (also when the rule
 * is GFS_CHECK_MALFORMED). md5_hex is needed
 * only when the rule is GFS_CHECK_MD5 (NULL: a mismatch).
 */
bool gfs_integrity_check(const gfs_file *f, const char *sha256_hex, const char *md5_hex,
                         gfs_error *err);

/* The digests f's rule needs, over the content as it streams by. */
typedef struct gfs_digest gfs_digest;
gfs_digest *gfs_digest_new(const gfs_file *f);
void gfs_digest_update(gfs_digest *d, const void *data, size_t len);
/* Frees d; md5_hex is "" unless f's rule is md5. */
void gfs_digest_final(gfs_digest *d, char sha256_hex[65], char md5_hex[33]);
/* Frees d and applies gfs_integrity_check; sha256_out (65 bytes) may be NULL. */
bool gfs_digest_check(gfs_digest *d, const gfs_file *f, char *sha256_out, gfs_error *err);

#endif
