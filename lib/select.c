/* Selecting stored files: typed ids, patterns, regular expressions, revisions (select.h). */
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "filename.h"
#include "select.h"

/* ---- ids ------------------------------------------------------------- */

static bool
parse_integer(const char *s, int64_t min, int64_t max, int64_t *out)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (!*s || *end || errno || v < min || v > max)
		return false;
	*out = v;
	return true;
}

bool
gfs_id_parse_typed(const char *s, bson_value_t *out, gfs_error *err)
{
	memset(out, 0, sizeof *out);
	int64_t v;
	if (gfs_id_parse_oid(s, out))
		return true;
	if (strncmp(s, "oid:", 4) == 0 && gfs_id_parse_oid(s + 4, out))
		return true;
	if (strncmp(s, "str:", 4) == 0) {
		if (!gfs_utf8_valid(s + 4, strlen(s + 4))) {
			gfs_error_set(err, GFS_EINVAL, "id '%s': a string id must be UTF-8", s);
			return false;
		}
		out->value_type = BSON_TYPE_UTF8;
		out->value.v_utf8.str = bson_strdup(s + 4);
		out->value.v_utf8.len = (uint32_t)strlen(s + 4);
		return true;
	}
	if (strncmp(s, "int:", 4) == 0 && parse_integer(s + 4, INT32_MIN, INT32_MAX, &v)) {
		out->value_type = BSON_TYPE_INT32;
		out->value.v_int32 = (int32_t)v;
		return true;
	}
	if (strncmp(s, "long:", 5) == 0 && parse_integer(s + 5, INT64_MIN, INT64_MAX, &v)) {
		out->value_type = BSON_TYPE_INT64;
		out->value.v_int64 = v;
		return true;
	}
	gfs_error_set(err, GFS_EINVAL, "id '%s' is none of: 24 hex digits (an ObjectId), oid:HEX, "
	              "str:TEXT, int:N (32 bits), long:N (64 bits)", s);
	return false;
}

/* ---- patterns -------------------------------------------------------- */

bool
gfs_has_glob(const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' && s[1]) {
			s++;
			continue;
		}
		if (*s == '*' || *s == '?' || *s == '[')
			return true;
	}
	return false;
}

/* The literal part of a shell pattern before its first wildcard, escapes undone. */
static char *
glob_prefix(const char *p)
{
	char *out = gfs_xmalloc(strlen(p) + 1);
	size_t n = 0;
	for (; *p && *p != '*' && *p != '?' && *p != '['; p++) {
		if (*p == '\\' && p[1])
			p++;
		out[n++] = *p;
	}
	out[n] = '\0';
	return out;
}

char *
gfs_regex_prefix(const char *re)
{
	char *out = gfs_xmalloc(strlen(re) + 1);
	size_t n = 0, before_last = 0;
	if (re[0] != '^' || strchr(re, '|')) {
		out[0] = '\0';
		return out;
	}
	const char *p = re + 1;
	for (; *p; p++) {
		char c = *p;
		if (c == '\\' && p[1] && strchr(".[]()*+?{}|^$\\/", p[1])) {
			before_last = n;
			out[n++] = *++p;
			continue;
		}
		if (strchr(".[]()*+?{}|^$\\", c))
			break;
		before_last = n;
		out[n++] = c;
	}
	/* "ab*", "ab?", "ab{0,1}": the quantifier makes the last character optional. */
	if (*p == '*' || *p == '?' || *p == '{')
		n = before_last;
	out[n] = '\0';
	return out;
}

void
gfs_match_text(gfs_match *m, const char *text)
{
	memset(m, 0, sizeof *m);
	size_t n = text ? strlen(text) : 0;
	while (n > 0 && text[n - 1] == '/')
		n--;
	/* The range on text covers the name and its folder (and text-old/, left out by name). */
	m->prefix = gfs_xstrndup(text ? text : "", n);
	m->folder = n > 0;
}

void
gfs_match_folder(gfs_match *m, const char *prefix)
{
	memset(m, 0, sizeof *m);
	m->prefix = gfs_prefix_normalize(prefix);
}

void
gfs_match_glob(gfs_match *m, const char *pattern)
{
	memset(m, 0, sizeof *m);
	m->glob = gfs_xstrdup(pattern);
	m->prefix = glob_prefix(pattern);
}

bool
gfs_match_regex(gfs_match *m, const char *re, gfs_error *err)
{
	memset(m, 0, sizeof *m);
	int rc = regcomp(&m->re, re, REG_EXTENDED | REG_NOSUB);
	if (rc != 0) {
		char why[256];
		regerror(rc, &m->re, why, sizeof why);
		gfs_error_set(err, GFS_EINVAL, "regular expression '%s': %s", re, why);
		return false;
	}
	m->has_re = true;
	m->prefix = gfs_regex_prefix(re);
	return true;
}

bool
gfs_match_name(const gfs_match *m, const char *name)
{
	size_t n = strlen(m->prefix);
	if (!name || strncmp(name, m->prefix, n) != 0)
		return false;
	if (m->folder && name[n] != '\0' && name[n] != '/')
		return false;
	if (m->glob && fnmatch(m->glob, name, FNM_PATHNAME) != 0)
		return false;
	return !m->has_re || regexec(&m->re, name, 0, NULL, 0) == 0;
}

void
gfs_match_free(gfs_match *m)
{
	if (m->has_re)
		regfree(&m->re);
	free(m->glob);
	free(m->prefix);
	memset(m, 0, sizeof *m);
}

struct match_walk {
	const gfs_match *m;
	gfs_file_fn fn;
	gfs_bad_file_fn bad;
	void *ctx;
};

static bool
match_one(const gfs_file *f, void *ctx)
{
	struct match_walk *w = ctx;
	return !gfs_match_name(w->m, f->filename) || w->fn(f, w->ctx);
}

static bool
match_bad(const bson_t *doc, const char *name, const gfs_error *why, void *ctx)
{
	struct match_walk *w = ctx;
	return !gfs_match_name(w->m, name) || w->bad(doc, name, why, w->ctx);
}

bool
gfs_list_match(gfs_session *s, const gfs_match *m, gfs_file_fn fn, gfs_bad_file_fn bad,
               void *ctx, gfs_error *err)
{
	struct match_walk w = {m, fn, bad, ctx};
	return gfs_list(s, m->prefix, match_one, match_bad, &w, err);
}

struct newest {
	gfs_file *v;
	size_t n, cap;
	/* The newest revision so far of the current name is malformed: its document and why. */
	bson_t *bad_doc;
	gfs_error bad_why;
	gfs_bad_file_fn bad;
	void *bad_ctx;
};

/* Hands on a malformed newest revision, once its name's run is over. */
static void
newest_bad_done(struct newest *nw)
{
	if (!nw->bad_doc)
		return;
	nw->bad(nw->bad_doc, gfs_doc_filename(nw->bad_doc), &nw->bad_why, nw->bad_ctx);
	bson_destroy(nw->bad_doc);
	nw->bad_doc = NULL;
}

/* Drops what is kept of name: a later revision of it replaces it. */
static void
newest_drop(struct newest *nw, const char *name)
{
	const char *bad_name = nw->bad_doc ? gfs_doc_filename(nw->bad_doc) : NULL;
	if (bad_name && strcmp(bad_name, name) == 0) {
		bson_destroy(nw->bad_doc);
		nw->bad_doc = NULL;
	}
	newest_bad_done(nw);
	if (nw->n > 0 && strcmp(nw->v[nw->n - 1].filename, name) == 0)
		gfs_file_free(&nw->v[--nw->n]);
}

/* Sorted by name then date: a later revision of the same name replaces the one kept. */
static bool
keep_newest(const gfs_file *f, void *ctx)
{
	struct newest *nw = ctx;
	gfs_error err;
	newest_drop(nw, f->filename);
	GFS_GROW(nw->v, nw->n + 1, nw->cap, 64);
	if (!gfs_file_parse(f->doc, &nw->v[nw->n], &err))
		abort(); /* f was parsed from the same document a moment ago */
	nw->n++;
	return true;
}

static bool
keep_newest_bad(const bson_t *doc, const char *name, const gfs_error *why, void *ctx)
{
	struct newest *nw = ctx;
	if (!name)
		return nw->bad(doc, name, why, nw->bad_ctx);
	newest_drop(nw, name);
	nw->bad_doc = bson_copy(doc);
	nw->bad_why = *why;
	return true;
}

bool
gfs_newest_match(gfs_session *s, const gfs_match *m, gfs_file **out, size_t *n,
                 gfs_bad_file_fn bad, void *bad_ctx, gfs_error *err)
{
	struct newest nw = {.bad = bad, .bad_ctx = bad_ctx};
	bool ok = gfs_list_match(s, m, keep_newest, keep_newest_bad, &nw, err);
	newest_bad_done(&nw);
	*out = nw.v;
	*n = nw.n;
	return ok;
}

/* ---- revisions ------------------------------------------------------- */

bool
gfs_revs_find(gfs_session *s, const bson_t *filter, gfs_revs *out, gfs_error *err)
{
	bson_t *opts = BCON_NEW("sort", "{", "filename", BCON_INT32(1), "uploadDate", BCON_INT32(1),
	                        "_id", BCON_INT32(1), "}", "projection", "{", "_id", BCON_INT32(1),
	                        "filename", BCON_INT32(1), "length", BCON_INT32(1), "}");
	mongoc_cursor_t *cur = gfs_session_find(s, s->files, filter, opts);
	bson_destroy(opts);
	const bson_t *doc;
	bson_iter_t it;
	while (mongoc_cursor_next(cur, &doc)) {
		if (!bson_iter_init_find(&it, doc, "_id"))
			continue;
		GFS_GROW(out->v, out->n + 1, out->cap, 16);
		gfs_rev *r = &out->v[out->n++];
		bson_value_copy(bson_iter_value(&it), &r->id);
		r->filename = bson_iter_init_find(&it, doc, "filename") && BSON_ITER_HOLDS_UTF8(&it)
		                  ? gfs_xstrdup(bson_iter_utf8(&it, NULL)) : NULL;
		r->length = bson_iter_init_find(&it, doc, "length") && BSON_ITER_HOLDS_NUMBER(&it)
		                ? bson_iter_as_int64(&it) : -1;
	}
	return gfs_cursor_done(cur, "find in files collection", err);
}

bool
gfs_revs_of_name(gfs_session *s, const char *name, gfs_revs *out, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&filter, "filename", name);
	bool ok = gfs_revs_find(s, &filter, out, err);
	bson_destroy(&filter);
	return ok;
}

void
gfs_revs_free(gfs_revs *r)
{
	for (size_t i = 0; i < r->n; i++) {
		bson_value_destroy(&r->v[i].id);
		free(r->v[i].filename);
	}
	free(r->v);
	memset(r, 0, sizeof *r);
}

bool
gfs_metadata_key_reserved(const char *key)
{
	static const char *const own[] = {"sha256", "mtime", "mtimeNs", "mtimeRacy", "size", "mode",
	                                  "contentType", GFS_RAWNAME_FIELD};
	for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
		if (strcmp(key, own[i]) == 0)
			return true;
	return false;
}
