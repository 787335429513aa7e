/*
 * Names: how disk paths become GridFS filenames and back.
 *
 * A prefix names a folder: "posters" and "posters/" are the same, and the
 * file ab/cd.jpg under it is stored as "posters/ab/cd.jpg".
 *
 * BSON strings must be UTF-8, disk names need not be. A relative path that is
 * not valid UTF-8 is stored with each offending byte written as %XX (upper
 * case hex), and the original bytes are kept in metadata.rawName (binary,
 * subtype 0), from which mirror restores them exactly.
 */
#ifndef GFS_NAMES_H
#define GFS_NAMES_H

#include <stdbool.h>
#include <stddef.h>

#include "gfs.h"

#define GFS_RAWNAME_FIELD "rawName"

/* "a", "a/", "a//" -> "a/"; NULL or "" -> "" (caller frees). */
char *gfs_prefix_normalize(const char *prefix);
/* prefix (normalized or not) + rel; caller frees. */
char *gfs_prefix_join(const char *prefix, const char *rel);
/* The part of name after the normalized prefix, or NULL when name is not under it. */
const char *gfs_prefix_strip(const char *normalized_prefix, const char *name);

/* True when bytes[0..len) is valid UTF-8 without NUL. */
bool gfs_utf8_valid(const char *bytes, size_t len);
/*
 * A valid UTF-8 name for the path bytes; *escaped tells whether any byte had
 * to be written as %XX (the caller then stores metadata.rawName). Caller frees.
 */
char *gfs_name_from_bytes(const char *bytes, size_t len, bool *escaped);
/* The filename the path rel[0..len) is stored under below prefix (gfs_name_from_bytes). */
char *gfs_stored_name(const char *prefix, const char *rel, size_t len, bool *escaped);
/*
 * Reads metadata.rawName of a files document, if present: returns a malloc'd
 * NUL-terminated copy and its length, else NULL.
 */
char *gfs_raw_name(const bson_t *files_doc, size_t *len);

#endif
