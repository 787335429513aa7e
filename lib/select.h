/*
 * Selecting stored files the way a user names them on the command line:
 * an _id of any type, a shell pattern, a regular expression, a folder.
 *
 * Ids are typed in one syntax everywhere (--id of get, put, rm, stat, mv):
 * 24 hex digits or oid:HEX an ObjectId, str:TEXT a string, int:N an int32,
 * long:N an int64.
 *
 * Patterns and regular expressions are matched here, on the client, never
 * with a server-side $regex: a server answers an unanchored or a
 * case-insensitive $regex by scanning every files document (FerretDB
 * answers every $regex that way), and PCRE on the server and POSIX here
 * would give one pattern two meanings. What the server gets is the literal
 * part a pattern begins with, as one prefix range (gfs_prefix_filter), an
 * index range on every server; the pattern then decides each name listed.
 */
#ifndef GFS_SELECT_H
#define GFS_SELECT_H

#include <regex.h>

#include "gfs.h"

/* Parses an id in the typed syntax above into out (caller destroys it); err says why not. */
bool gfs_id_parse_typed(const char *s, bson_value_t *out, gfs_error *err);

/* True when s has a shell wildcard (*, ? or [) that fnmatch would act on. */
bool gfs_has_glob(const char *s);

typedef struct gfs_match {
	char *prefix;    /* the literal part every match begins with ("" none) */
	char *glob;      /* a shell pattern, '*' not crossing '/' (FNM_PATHNAME); or NULL */
	regex_t re;      /* a POSIX extended regular expression, when has_re */
	bool has_re;
	bool folder;     /* a name matches when it is prefix or goes on with '/' after it */
} gfs_match;

/*
 * What ls PREFIX lists: the name text itself and every name under the
 * folder text (NULL or "": all), as --prefix reads a folder everywhere:
 * "posters" is not "posters-old/".
 */
void gfs_match_text(gfs_match *m, const char *text);
/* A match of every name under the folder prefix (NULL or "": all). */
void gfs_match_folder(gfs_match *m, const char *prefix);
/* A match of a shell pattern. */
void gfs_match_glob(gfs_match *m, const char *pattern);
/* A match of a POSIX extended regular expression; false (err says why) when it does not compile. */
bool gfs_match_regex(gfs_match *m, const char *re, gfs_error *err);
/* Whether name matches (the prefix is part of the test). */
bool gfs_match_name(const gfs_match *m, const char *name);
void gfs_match_free(gfs_match *m);
/*
 * The literal text every string matching the regular expression re begins
 * with: what follows a leading '^' up to its first special character (a
 * character a quantifier applies to is left out). "" when re is not
 * anchored or has an alternation. Caller frees.
 */
char *gfs_regex_prefix(const char *re);

/*
 * Calls fn for each files document whose name m matches, in filename then
 * uploadDate order, and bad for each malformed one (gfs_list over m's
 * prefix: one query).
 */
bool gfs_list_match(gfs_session *s, const gfs_match *m, gfs_file_fn fn, gfs_bad_file_fn bad,
                    void *ctx, gfs_error *err);
/*
 * The newest revision of each name m matches, in filename order, into
 * *out (*n of them; free each with gfs_file_free, then *out). A name whose
 * newest revision is malformed goes to bad instead (never an older one).
 */
bool gfs_newest_match(gfs_session *s, const gfs_match *m, gfs_file **out, size_t *n,
                      gfs_bad_file_fn bad, void *bad_ctx, gfs_error *err);

/*
 * The revisions a removal or a rename acts on: every files document the
 * filter selects, malformed ones too (by _id, filename and length alone),
 * by filename, then oldest first.
 */
typedef struct gfs_rev {
	bson_value_t id;
	char *filename;   /* NULL when it has none */
	int64_t length;   /* -1 when not a number */
} gfs_rev;
typedef struct gfs_revs {
	gfs_rev *v;
	size_t n, cap;
} gfs_revs;
/* Appends what filter selects to out (zeroed before the first call). One query. */
bool gfs_revs_find(gfs_session *s, const bson_t *filter, gfs_revs *out, gfs_error *err);
/* gfs_revs_find by filename equality. */
bool gfs_revs_of_name(gfs_session *s, const char *name, gfs_revs *out, gfs_error *err);
void gfs_revs_free(gfs_revs *r);

/*
 * The keys of metadata gridfsctl writes and reads itself (sha256, mtime,
 * mtimeNs, size, mode, contentType, rawName): a user's metadata may not
 * set them.
 */
bool gfs_metadata_key_reserved(const char *key);

#endif
