/* Files documents: parsing, lookups by name, id and prefix. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gfs.h"
#include "filename.h"

static bool
iter_int64(const bson_iter_t *it, int64_t *out)
{
	switch (bson_iter_type(it)) {
	case BSON_TYPE_INT32: *out = bson_iter_int32(it); return true;
	case BSON_TYPE_INT64: *out = bson_iter_int64(it); return true;
	case BSON_TYPE_DOUBLE: {
		double d = bson_iter_double(it);
		if (d != d || d < -9.2e18 || d > 9.2e18 || d != (double)(int64_t)d)
			return false;
		*out = (int64_t)d;
		return true;
	}
	default: return false;
	}
}

int64_t
gfs_ms_to_ns(int64_t ms)
{
	if (ms > INT64_MAX / 1000000)
		return INT64_MAX;
	if (ms < INT64_MIN / 1000000)
		return INT64_MIN;
	return ms * 1000000;
}

/* A stored digest into dst; a malformed one is remembered as damage (gfs_integrity_rule). */
static void
read_hash(const bson_iter_t *it, char *dst, size_t want, const char *field, gfs_file *f)
{
	if (!gfs_hash_field(it, dst, want) && (!f->bad_hash[0] || strcmp(field, "sha256") == 0))
		snprintf(f->bad_hash, sizeof f->bad_hash, "%s", field);
}

static void
parse_metadata(bson_iter_t *meta, gfs_file *f)
{
	bson_iter_t it;
	if (!bson_iter_recurse(meta, &it))
		return;
	int64_t v;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "sha256") == 0)
			read_hash(&it, f->sha256, 64, "sha256", f);
		else if (strcmp(k, "contentType") == 0 && BSON_ITER_HOLDS_UTF8(&it) && !f->content_type)
			f->content_type = strdup(bson_iter_utf8(&it, NULL));
		else if (strcmp(k, "mtimeNs") == 0 && iter_int64(&it, &v))
			f->mtime_ns = v;
		else if (strcmp(k, "mtime") == 0 && f->mtime_ns < 0) {
			if (BSON_ITER_HOLDS_DATE_TIME(&it))
				f->mtime_ns = gfs_ms_to_ns(bson_iter_date_time(&it));
			else if (iter_int64(&it, &v))
				f->mtime_ns = gfs_ms_to_ns(v);
		} else if (strcmp(k, "mode") == 0 && iter_int64(&it, &v) && v >= 0 && v <= 07777)
			f->mode = (int32_t)v;
	}
}

bool
gfs_file_parse(const bson_t *doc, gfs_file *f, gfs_error *err)
{
	memset(f, 0, sizeof *f);
	f->mtime_ns = -1;
	f->mode = -1;
	f->length = -1;
	bson_iter_t it;
	bool have_id = false, have_length = false, have_size = false;
	int64_t v;
	if (!bson_iter_init(&it, doc)) {
		gfs_error_set(err, GFS_EBADDOC, "files document is not valid BSON");
		return false;
	}
	/* Top-level contentType wins over metadata.contentType, so read it first. */
	bson_iter_t ct;
	if (bson_iter_init_find(&ct, doc, "contentType") && BSON_ITER_HOLDS_UTF8(&ct))
		f->content_type = strdup(bson_iter_utf8(&ct, NULL));
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "_id") == 0) {
			bson_value_copy(bson_iter_value(&it), &f->id);
			have_id = true;
		} else if (strcmp(k, "filename") == 0 && BSON_ITER_HOLDS_UTF8(&it)) {
			f->filename = strdup(bson_iter_utf8(&it, NULL));
		} else if (strcmp(k, "length") == 0) {
			have_length = true;
			if (iter_int64(&it, &v))
				f->length = v;
		} else if (strcmp(k, "chunkSize") == 0) {
			have_size = true;
			if (iter_int64(&it, &v) && v > 0 && v <= INT32_MAX)
				f->chunk_size = (int32_t)v;
		} else if (strcmp(k, "uploadDate") == 0 && BSON_ITER_HOLDS_DATE_TIME(&it)) {
			f->upload_date = bson_iter_date_time(&it);
		} else if (strcmp(k, "md5") == 0) {
			read_hash(&it, f->md5, 32, "md5", f);
		} else if (strcmp(k, "metadata") == 0 && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			parse_metadata(&it, f);
		}
	}
	f->doc = bson_copy(doc);
	const char *why = !have_id ? "files document has no _id"
	                  : !have_length ? "files document has no length"
	                  : f->length < 0 ? "length is not a whole number of bytes"
	                  : !have_size ? "files document has no chunkSize"
	                  : f->chunk_size <= 0 ? "chunkSize is not a whole number above 0" : NULL;
	if (why) {
		gfs_error_set(err, GFS_EBADDOC, "%s", why);
		gfs_file_free(f);
		return false;
	}
	return true;
}

bool
gfs_doc_malformed(const bson_t *doc, gfs_error *why)
{
	gfs_file f;
	if (!gfs_file_parse(doc, &f, why))
		return true;
	gfs_file_free(&f);
	return false;
}

const char *
gfs_doc_filename(const bson_t *doc)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, doc, "filename") && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

void
gfs_file_free(gfs_file *f)
{
	if (!f)
		return;
	if (f->doc)
		bson_value_destroy(&f->id);
	free(f->filename);
	free(f->content_type);
	if (f->doc)
		bson_destroy(f->doc);
	memset(f, 0, sizeof *f);
}

/*
 * A chunk's n as an integer. A double is accepted only when integral and
 * within int64 range: converting NaN or a huge value is undefined.
 */
bool
gfs_chunk_n(const bson_t *doc, int64_t *n)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, doc, "n") && iter_int64(&it, n);
}

int64_t
gfs_chunk_count(int64_t length, int32_t chunk_size)
{
	if (length <= 0 || chunk_size <= 0)
		return 0;
	/* Not (length + chunk_size - 1) / chunk_size: that overflows near INT64_MAX. */
	return length / chunk_size + (length % chunk_size != 0);
}

enum gfs_chunk_place
gfs_chunk_place(int64_t n, int64_t next, int64_t count)
{
	if (n < 0 || n >= count)
		return GFS_CHUNK_OUTSIDE;
	if (n < next)
		return GFS_CHUNK_DUPLICATE;
	return n > next ? GFS_CHUNK_GAP : GFS_CHUNK_NEXT;
}

int32_t
gfs_chunk_expected_len(int64_t length, int32_t chunk_size, int64_t n)
{
	int64_t count = gfs_chunk_count(length, chunk_size);
	if (n < 0 || n >= count)
		return 0;
	if (n < count - 1)
		return chunk_size;
	return (int32_t)(length - (count - 1) * (int64_t)chunk_size);
}

/*
 * The BSON bytes of a value in hex: for ids that have no faithful text (a
 * string with a NUL or invalid UTF-8 inside). Distinct ids stay distinct,
 * which matters where the text is a map key.
 */
static char *
id_hex(const bson_t *wrapped)
{
	const uint8_t *p = bson_get_data(wrapped);
	static const char prefix[] = "(bson ";
	size_t n = wrapped->len, plen = sizeof prefix - 1;
	char *out = gfs_xmalloc(plen + 2 * n + 2);
	memcpy(out, prefix, plen);
	for (size_t i = 0; i < n; i++) {
		out[plen + 2 * i] = "0123456789abcdef"[p[i] >> 4];
		out[plen + 2 * i + 1] = "0123456789abcdef"[p[i] & 15];
	}
	out[plen + 2 * n] = ')';
	out[plen + 2 * n + 1] = '\0';
	return out;
}

/* The value of the relaxed JSON { "id" : VALUE }: 5, not { "id" : 5 }. */
static char *
json_value(const char *json)
{
	static const char head[] = "{ \"id\" : ", tail[] = " }";
	size_t n = strlen(json), hl = sizeof head - 1, tl = sizeof tail - 1;
	if (n < hl + tl || strncmp(json, head, hl) != 0 || strcmp(json + n - tl, tail) != 0)
		return gfs_xstrdup(json);
	char *out = gfs_xmalloc(n - hl - tl + 1);
	memcpy(out, json + hl, n - hl - tl);
	out[n - hl - tl] = '\0';
	return out;
}

char *
gfs_id_string(const bson_value_t *id)
{
	if (id->value_type == BSON_TYPE_OID) {
		char hex[25];
		bson_oid_to_string(&id->value.v_oid, hex);
		return strdup(hex);
	}
	if (id->value_type == BSON_TYPE_UTF8 &&
	    strlen(id->value.v_utf8.str) == id->value.v_utf8.len &&
	    bson_utf8_validate(id->value.v_utf8.str, id->value.v_utf8.len, false))
		return strdup(id->value.v_utf8.str);
	bson_t tmp = BSON_INITIALIZER;
	BSON_APPEND_VALUE(&tmp, "id", id);
	char *json = NULL;
	if (id->value_type != BSON_TYPE_UTF8)
		json = bson_as_relaxed_extended_json(&tmp, NULL);
	/* NULL when a string inside is not valid UTF-8. */
	char *out = json ? json_value(json) : id_hex(&tmp);
	bson_free(json);
	bson_destroy(&tmp);
	return out;
}

/*
 * The server compares numbers by value whatever their type, so an Int64 77
 * _id and an Int32 77 files_id are one file to every reader. An int64 holds
 * every integral double in its range exactly, so that is the common form.
 */
bson_value_t
gfs_id_canonical(const bson_value_t *id)
{
	bson_value_t out = *id;
	if (id->value_type == BSON_TYPE_INT32) {
		out.value_type = BSON_TYPE_INT64;
		out.value.v_int64 = id->value.v_int32;
	} else if (id->value_type == BSON_TYPE_DOUBLE) {
		double d = id->value.v_double;
		/* -2^63 <= d < 2^63, both exact as doubles; NaN fails both tests. */
		if (d >= -9223372036854775808.0 && d < 9223372036854775808.0 && d == (double)(int64_t)d) {
			out.value_type = BSON_TYPE_INT64;
			out.value.v_int64 = (int64_t)d;
		}
	}
	return out;
}

bool
gfs_id_equal(const bson_value_t *a, const bson_value_t *b)
{
	bson_value_t x = gfs_id_canonical(a), y = gfs_id_canonical(b);
	if (x.value_type != y.value_type)
		return false;
	if (x.value_type == BSON_TYPE_INT64)
		return x.value.v_int64 == y.value.v_int64;
	if (x.value_type == BSON_TYPE_DOUBLE)
		return x.value.v_double == y.value.v_double;
	if (x.value_type == BSON_TYPE_OID)
		return bson_oid_equal(&x.value.v_oid, &y.value.v_oid);
	char *xs = gfs_id_string(&x), *ys = gfs_id_string(&y);
	bool same = strcmp(xs, ys) == 0;
	free(xs);
	free(ys);
	return same;
}

void
gfs_id_filter(bson_t *filter, const char *field, const bson_value_t *id)
{
	bson_t eq;
	BSON_APPEND_DOCUMENT_BEGIN(filter, field, &eq);
	BSON_APPEND_VALUE(&eq, "$eq", id);
	bson_append_document_end(filter, &eq);
}

void
gfs_same_filter(bson_t *filter, const bson_t *doc, const char *field)
{
	bson_iter_t it, found;
	if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, field, &found)) {
		gfs_id_filter(filter, field, bson_iter_value(&found));
		return;
	}
	bson_t ex;
	BSON_APPEND_DOCUMENT_BEGIN(filter, field, &ex);
	BSON_APPEND_BOOL(&ex, "$exists", false);
	bson_append_document_end(filter, &ex);
}

void
gfs_append_values(bson_t *doc, const char *field, const bson_value_t *values, size_t n)
{
	bson_t arr;
	BSON_APPEND_ARRAY_BEGIN(doc, field, &arr);
	for (size_t i = 0; i < n; i++) {
		char buf[16];
		const char *key;
		bson_uint32_to_string((uint32_t)i, &key, buf, sizeof buf);
		BSON_APPEND_VALUE(&arr, key, &values[i]);
	}
	bson_append_array_end(doc, &arr);
}

void
gfs_in_filter(bson_t *filter, const char *field, const bson_value_t *values, size_t n)
{
	bson_t in;
	BSON_APPEND_DOCUMENT_BEGIN(filter, field, &in);
	gfs_append_values(&in, "$in", values, n);
	bson_append_document_end(filter, &in);
}

bool
gfs_id_parse_oid(const char *s, bson_value_t *out)
{
	if (!s || strlen(s) != 24 || !bson_oid_is_valid(s, 24))
		return false;
	memset(out, 0, sizeof *out);
	out->value_type = BSON_TYPE_OID;
	bson_oid_init_from_string(&out->value.v_oid, s);
	return true;
}

/* ---- lookups --------------------------------------------------------- */

static int
find_one(gfs_session *s, const bson_t *filter, const bson_t *opts, gfs_file *out, gfs_error *err)
{
	mongoc_cursor_t *cur = gfs_session_find(s, s->files, filter, opts);
	const bson_t *doc;
	int rc = 0;
	gfs_error why;
	if (mongoc_cursor_next(cur, &doc)) {
		rc = gfs_file_parse(doc, out, &why) ? 1 : -1;
		const char *name = gfs_doc_filename(doc);
		if (rc < 0)
			gfs_error_set(err, why.code, "%s: %s", name ? name : "(no filename)", why.msg);
	}
	if (!gfs_cursor_done(cur, "find in files collection", err))
		rc = -1;
	return rc;
}

/*
 * One equality statement per value, not one {field: {$in: values}}: a
 * server that cannot serve $in from an index (FerretDB) reads the whole
 * collection for it, every chunk of the bucket for a removal of one file,
 * while an equality is an index seek on every server. Ordered, so that the
 * first failure stops the rest; the driver sends the statements in as few
 * delete commands as the server's batch limits allow.
 */
bool
gfs_delete_each(mongoc_collection_t *coll, const bson_t *also, const char *field,
                const bson_value_t *values, size_t n, int64_t *deleted, const char *what,
                gfs_error *err)
{
	if (deleted)
		*deleted = 0;
	if (n == 0)
		return true;
	bson_t opts = BSON_INITIALIZER, reply;
	BSON_APPEND_BOOL(&opts, "ordered", true);
	mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts(coll, &opts);
	bson_destroy(&opts);
	bson_error_t berr;
	bool ok = true;
	for (size_t i = 0; ok && i < n; i++) {
		bson_t filter = BSON_INITIALIZER;
		if (also)
			bson_concat(&filter, also);
		gfs_id_filter(&filter, field, &values[i]);
		ok = mongoc_bulk_operation_remove_many_with_opts(bulk, &filter, NULL, &berr);
		bson_destroy(&filter);
	}
	if (ok) {
		/* Sets reply whatever happens; what was removed before a failure is counted too. */
		ok = mongoc_bulk_operation_execute(bulk, &reply, &berr) != 0;
		bson_iter_t it;
		if (deleted && bson_iter_init_find(&it, &reply, "nRemoved"))
			*deleted = bson_iter_as_int64(&it);
		bson_destroy(&reply);
	}
	if (!ok)
		gfs_error_from_bson(err, &berr, what);
	mongoc_bulk_operation_destroy(bulk);
	return ok;
}

int
gfs_exists(gfs_session *s, mongoc_collection_t *coll, const char *field, const bson_value_t *id,
           gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, proj;
	gfs_id_filter(&filter, field, id);
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "projection", &proj);
	BSON_APPEND_INT32(&proj, "_id", 1);
	bson_append_document_end(&opts, &proj);
	BSON_APPEND_INT64(&opts, "limit", 1);
	mongoc_cursor_t *cur = gfs_session_find(s, coll, &filter, &opts);
	bson_destroy(&filter);
	bson_destroy(&opts);
	const bson_t *doc;
	int rc = mongoc_cursor_next(cur, &doc) ? 1 : 0;
	char what[200];
	snprintf(what, sizeof what, "look up %s in %s", field, mongoc_collection_get_name(coll));
	return gfs_cursor_done(cur, what, err) ? rc : -1;
}

int64_t
gfs_chunk_docs(gfs_session *s, const bson_value_t *files_id)
{
	bson_t filter = BSON_INITIALIZER;
	gfs_id_filter(&filter, "files_id", files_id);
	bson_error_t berr;
	bson_t opts;
	gfs_session_read_opts(s, NULL, &opts);
	int64_t n = mongoc_collection_count_documents(s->chunks, &filter, &opts, NULL, NULL, &berr);
	bson_destroy(&filter);
	bson_destroy(&opts);
	return n;
}

bool
gfs_find_by_name(gfs_session *s, const char *name, int revision, gfs_file *out, gfs_error *err)
{
	int dir = revision >= 0 ? 1 : -1;
	int64_t skip = revision >= 0 ? revision : -(int64_t)revision - 1;
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, sort;
	BSON_APPEND_UTF8(&filter, "filename", name);
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &sort);
	BSON_APPEND_INT32(&sort, "uploadDate", dir);
	BSON_APPEND_INT32(&sort, "_id", dir);
	bson_append_document_end(&opts, &sort);
	BSON_APPEND_INT64(&opts, "skip", skip);
	BSON_APPEND_INT64(&opts, "limit", 1);
	int rc = find_one(s, &filter, &opts, out, err);
	bson_destroy(&opts);
	if (rc == 0 && skip > 0) {
		bson_t any = BSON_INITIALIZER;
		BSON_APPEND_INT64(&any, "limit", 1);
		gfs_file probe;
		int exists = find_one(s, &filter, &any, &probe, err);
		bson_destroy(&any);
		if (exists > 0) {
			gfs_file_free(&probe);
			gfs_error_set(err, GFS_ENOREVISION, "%s: no revision %d", name, revision);
		} else if (exists == 0) {
			gfs_error_set(err, GFS_ENOTFOUND, "%s: no such file", name);
		}
	} else if (rc == 0) {
		gfs_error_set(err, GFS_ENOTFOUND, "%s: no such file", name);
	}
	bson_destroy(&filter);
	return rc > 0;
}

bool
gfs_find_by_id(gfs_session *s, const bson_value_t *id, gfs_file *out, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER;
	gfs_id_filter(&filter, "_id", id);
	int rc = find_one(s, &filter, NULL, out, err);
	bson_destroy(&filter);
	if (rc == 0) {
		char *ids = gfs_id_string(id);
		gfs_error_set(err, GFS_ENOTFOUND, "id %s: no such file", ids);
		free(ids);
	}
	return rc > 0;
}

bool
gfs_find_first_id(gfs_session *s, const char *name, bson_value_t *out, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, sort, proj;
	BSON_APPEND_UTF8(&filter, "filename", name);
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &sort);
	BSON_APPEND_INT32(&sort, "uploadDate", 1);
	BSON_APPEND_INT32(&sort, "_id", 1);
	bson_append_document_end(&opts, &sort);
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "projection", &proj);
	BSON_APPEND_INT32(&proj, "_id", 1);
	bson_append_document_end(&opts, &proj);
	BSON_APPEND_INT64(&opts, "limit", 1);
	mongoc_cursor_t *cur = gfs_session_find(s, s->files, &filter, &opts);
	bson_destroy(&filter);
	bson_destroy(&opts);
	const bson_t *doc;
	bson_iter_t it;
	bool found = mongoc_cursor_next(cur, &doc) && bson_iter_init_find(&it, doc, "_id");
	if (found)
		bson_value_copy(bson_iter_value(&it), out);
	if (gfs_cursor_done(cur, "find in files collection", err) && !found)
		gfs_error_set(err, GFS_ENOTFOUND, "%s: no such file", name);
	return found;
}

/* Bytes of the UTF-8 sequence that starts with lead. */
static size_t
utf8_len(unsigned char lead)
{
	return lead < 0x80 ? 1 : lead < 0xe0 ? 2 : lead < 0xf0 ? 3 : 4;
}

static size_t
utf8_put(char *out, uint32_t cp)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | cp >> 6);
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xe0 | cp >> 12);
		out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | cp >> 18);
	out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
	out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
	out[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

static uint32_t
utf8_get(const unsigned char *s, size_t len)
{
	static const unsigned char lead_mask[] = {0, 0x7f, 0x1f, 0x0f, 0x07};
	uint32_t cp = s[0] & lead_mask[len];
	for (size_t i = 1; i < len; i++)
		cp = cp << 6 | (s[i] & 0x3f);
	return cp;
}

char *
gfs_prefix_upper(const char *prefix)
{
	size_t n = strlen(prefix);
	/* Past bytes that are not UTF-8 (no stored name has them) only the valid head counts. */
	while (n > 0 && !gfs_utf8_valid(prefix, n))
		n--;
	/* The start of each code point, so that the last can be taken off. */
	size_t *starts = gfs_xcalloc(n + 1, sizeof *starts), count = 0;
	for (size_t i = 0; i < n; i += utf8_len((unsigned char)prefix[i]))
		starts[count++] = i;
	char *out = NULL;
	while (count > 0) {
		size_t at = starts[--count];
		const unsigned char *p = (const unsigned char *)prefix + at;
		uint32_t cp = utf8_get(p, utf8_len(*p));
		if (cp >= 0x10ffff)
			continue;   /* nothing above it: carry into the code point before */
		cp = cp == 0xd7ff ? 0xe000 : cp + 1;
		out = gfs_xmalloc(at + 5);
		memcpy(out, prefix, at);
		out[at + utf8_put(out + at, cp)] = '\0';
		break;
	}
	free(starts);
	return out;
}

/*
 * A range rather than an anchored $regex: both use the filename index on
 * MongoDB, and a range needs no escaping of the prefix.
 */
void
gfs_prefix_filter(bson_t *filter, const char *prefix)
{
	if (!prefix || !*prefix)
		return;
	bson_t range;
	char *upper = gfs_prefix_upper(prefix);
	BSON_APPEND_DOCUMENT_BEGIN(filter, "filename", &range);
	BSON_APPEND_UTF8(&range, "$gte", prefix);
	if (upper)
		BSON_APPEND_UTF8(&range, "$lt", upper);
	bson_append_document_end(filter, &range);
	free(upper);
}

bool
gfs_list(gfs_session *s, const char *prefix, gfs_file_fn fn, gfs_bad_file_fn bad, void *ctx,
         gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, sort;
	gfs_prefix_filter(&filter, prefix);
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &sort);
	BSON_APPEND_INT32(&sort, "filename", 1);
	BSON_APPEND_INT32(&sort, "uploadDate", 1);
	BSON_APPEND_INT32(&sort, "_id", 1);
	bson_append_document_end(&opts, &sort);
	BSON_APPEND_INT32(&opts, "batchSize", 1000);
	mongoc_cursor_t *cur = gfs_session_find(s, s->files, &filter, &opts);
	const bson_t *doc;
	bool more = true;
	while (more && mongoc_cursor_next(cur, &doc)) {
		gfs_file f;
		gfs_error why;
		if (!gfs_file_parse(doc, &f, &why)) {
			more = bad(doc, gfs_doc_filename(doc), &why, ctx);
			continue;
		}
		more = fn(&f, ctx);
		gfs_file_free(&f);
	}
	bool ok = gfs_cursor_done(cur, "list files", err);
	bson_destroy(&filter);
	bson_destroy(&opts);
	return ok;
}

void
gfs_idlist_add(struct gfs_idlist *l, const bson_value_t *v)
{
	GFS_GROW(l->v, l->n + 1, l->cap, 64);
	bson_value_copy(v, &l->v[l->n++]);
}

void
gfs_idlist_free(struct gfs_idlist *l)
{
	for (size_t i = 0; i < l->n; i++)
		bson_value_destroy(&l->v[i]);
	free(l->v);
	memset(l, 0, sizeof *l);
}

/*
 * Which revisions go, newest first: ranks alone cannot be trusted, since
 * another writer's clock may be ahead of ours or tie to the millisecond.
 * So keep_id is never among them, counts as one of the keep, and what
 * sorts before it (a later write, or a later date) is not ours to remove.
 * A trim (keep > 0) passes over malformed revisions: they are problems to
 * report (ls, verify), neither kept as a revision nor removed unseen.
 */
bool
gfs_find_old_revisions(gfs_session *s, const char *name, int keep, const bson_value_t *keep_id,
                       bson_value_t **out, size_t *nout, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, sort, proj;
	BSON_APPEND_UTF8(&filter, "filename", name);
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &sort);
	BSON_APPEND_INT32(&sort, "uploadDate", -1);
	BSON_APPEND_INT32(&sort, "_id", -1);
	bson_append_document_end(&opts, &sort);
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "projection", &proj);
	BSON_APPEND_INT32(&proj, "_id", 1);
	BSON_APPEND_INT32(&proj, "length", 1);
	BSON_APPEND_INT32(&proj, "chunkSize", 1);
	bson_append_document_end(&opts, &proj);
	/* What is removed is decided from the primary: a lagging member would hide a revision. */
	mongoc_cursor_t *cur = gfs_primary_find(s->files, &filter, &opts);
	bson_destroy(&filter);
	bson_destroy(&opts);

	bson_value_t *ids = NULL;
	size_t count = 0, cap = 0;
	int kept = 0;
	bool passed = keep_id == NULL;
	const bson_t *doc;
	while (mongoc_cursor_next(cur, &doc)) {
		bson_iter_t it;
		gfs_error why;
		if (!bson_iter_init_find(&it, doc, "_id") || (keep > 0 && gfs_doc_malformed(doc, &why)))
			continue;
		if (keep_id && gfs_id_equal(bson_iter_value(&it), keep_id)) {
			passed = true;
			kept++;
			continue;
		}
		if (!passed)
			continue;
		if (kept < keep) {
			kept++;
			continue;
		}
		GFS_GROW(ids, count + 1, cap, 8);
		bson_value_copy(bson_iter_value(&it), &ids[count++]);
	}
	bool ok = gfs_cursor_done(cur, "find old revisions", err);
	*out = ids;
	*nout = count;
	return ok;
}

bool
gfs_find_old_revisions_into(gfs_session *s, const char *name, int keep,
                            const bson_value_t *keep_id, struct gfs_idlist *l, gfs_error *err)
{
	bson_value_t *ids = NULL;
	size_t count = 0;
	bool ok = gfs_find_old_revisions(s, name, keep, keep_id, &ids, &count, err);
	for (size_t i = 0; i < count; i++) {
		gfs_idlist_add(l, &ids[i]);
		bson_value_destroy(&ids[i]);
	}
	free(ids);
	return ok;
}
