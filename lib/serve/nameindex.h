/*
 * The serve command's in-memory name index (not a MongoDB index: those
 * are conn.c's): filename -> the newest revision's id, length, type,
 * entity tag and date, so that a request for a known name needs no files
 * query.
 *
 * It is loaded whole at start and kept fresh by polling: name_index_poll()
 * reads only files documents dated since the last poll began, less an
 * overlap for writers that lag (new files and new revisions), and notices
 * removals from one count taken before that query (revledger.h: names
 * with new revisions in this poll or the last are reread, and past that
 * the whole index);
 * name_index_load() rereads everything (renames, which no count shows).
 * Load and poll are called from one thread at a time. The caller decides
 * how often and how much overlap; serve documents the bounds.
 */
#ifndef GFS_NAMEINDEX_H
#define GFS_NAMEINDEX_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../gfs.h"

/* One revision's metadata. Immutable once built; shared by reference count. */
typedef struct gfs_meta {
	atomic_int refs;
	char *name;          /* filename; may be NULL */
	char *key;           /* the id as text (gfs_meta_key): unique per revision */
	char *cache_key;     /* key, length and entity tag: names the content */
	bson_value_t id;
	int64_t length;
	int32_t chunk_size;
	int64_t upload_ms;
	char sha256[65];     /* "" when not stored */
	char md5[33];        /* legacy md5, "" when not stored: the integrity rule may need it */
	char bad_hash[8];    /* as gfs_file's: a malformed digest, which the rule counts as damage */
	char *content_type;  /* stored type, else guessed from the name's extension */
	char etag[80];       /* quoted: sha256, else md5, else id and upload time */
	/*
	 * The revision's files document is malformed: why (a problem of its
	 * name, never a reason to answer with an older revision; only name,
	 * key, id and upload time are set then). NULL when it is not.
	 */
	char *bad;
	char last_modified[32];
} gfs_meta;

/*
 * The id as a key: an ObjectId is its 24 hex digits, as /id/ URLs carry it;
 * any other type gets a prefix no hex string has, so that a string _id that
 * spells another file's ObjectId never shares its key. Caller frees.
 */
char *gfs_meta_key(const bson_value_t *id);
gfs_meta *gfs_meta_from_file(const gfs_file *f);
gfs_meta *gfs_meta_ref(gfs_meta *m);
void gfs_meta_unref(gfs_meta *m);
/* A gfs_file view of m for gfs_read(); owns nothing, never pass to gfs_file_free(). */
void gfs_meta_file(const gfs_meta *m, gfs_file *out);

typedef struct name_index name_index;

/* prefix: only names under it (normalized, "" for all). */
name_index *name_index_new(const char *prefix);
void name_index_free(name_index *ix);

/* Rereads every files document under the prefix and swaps the result in. */
bool name_index_load(name_index *ix, gfs_session *s, gfs_error *err);
/* Reads files documents dated since the last poll began less overlap_ms; requires a prior load. */
bool name_index_poll(name_index *ix, gfs_session *s, int64_t overlap_ms, gfs_error *err);

/* The newest revision of name, referenced (gfs_meta_unref it), or NULL. */
gfs_meta *name_index_get(name_index *ix, const char *name);
/* By id text, among the newest revisions; referenced, or NULL. */
gfs_meta *name_index_get_id(name_index *ix, const char *key);

bool name_index_loaded(name_index *ix);
size_t name_index_count(name_index *ix);
/* Wall-clock ms of the last successful load or poll; 0 when never. */
int64_t name_index_fresh_ms(name_index *ix);
/* Calls fn for every entry (under the read lock; fn must be quick and not call back). */
void name_index_each(name_index *ix, void (*fn)(gfs_meta *m, void *ctx), void *ctx);

#endif
