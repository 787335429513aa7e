/* Unit tests for the pure parts of the GridFS core: chunk arithmetic, document parsing, names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "../../lib/gfs.h"
#include "../../lib/magic.h"
#include "../../lib/filename.h"

static void
test_chunk_count(void **state)
{
	(void)state;
	assert_int_equal(gfs_chunk_count(0, 261120), 0);
	assert_int_equal(gfs_chunk_count(1, 261120), 1);
	assert_int_equal(gfs_chunk_count(261120, 261120), 1);
	assert_int_equal(gfs_chunk_count(261121, 261120), 2);
	assert_int_equal(gfs_chunk_count(5LL << 30, 261120), ((5LL << 30) + 261119) / 261120);
}

static void
test_chunk_expected_len(void **state)
{
	(void)state;
	assert_int_equal(gfs_chunk_expected_len(261121, 261120, 0), 261120);
	assert_int_equal(gfs_chunk_expected_len(261121, 261120, 1), 1);
	assert_int_equal(gfs_chunk_expected_len(261121, 261120, 2), 0);
	assert_int_equal(gfs_chunk_expected_len(261120, 261120, 0), 261120);
	assert_int_equal(gfs_chunk_expected_len(10, 4, 2), 2);
	assert_int_equal(gfs_chunk_expected_len(10, 4, -1), 0);
}

static void
test_parse_tolerates_numeric_types(void **state)
{
	(void)state;
	bson_t *doc = BCON_NEW("_id", BCON_INT32(7), "length", BCON_DOUBLE(300.0), "chunkSize",
	                       BCON_INT64(256), "uploadDate", BCON_DATE_TIME(1000), "filename",
	                       BCON_UTF8("a/b"), "extra", BCON_UTF8("ignored"), "metadata", "{",
	                       "sha256", BCON_UTF8("aa" "bbccddeeff00112233445566778899aabbccddeeff00112233445566778899"),
	                       "contentType", BCON_UTF8("image/png"), "mtimeNs", BCON_INT64(5), "mode",
	                       BCON_INT32(0644), "}");
	gfs_file f;
	gfs_error err;
	assert_true(gfs_file_parse(doc, &f, &err));
	assert_int_equal(f.length, 300);
	assert_int_equal(f.chunk_size, 256);
	assert_int_equal(f.upload_date, 1000);
	assert_string_equal(f.filename, "a/b");
	assert_string_equal(f.content_type, "image/png");
	assert_int_equal(strlen(f.sha256), 64);
	assert_int_equal(f.mtime_ns, 5);
	assert_int_equal(f.mode, 0644);
	assert_int_equal(f.id.value_type, BSON_TYPE_INT32);
	gfs_file_free(&f);
	bson_destroy(doc);
}

static void
test_parse_prefers_top_level_content_type(void **state)
{
	(void)state;
	bson_t *doc = BCON_NEW("_id", BCON_INT32(1), "length", BCON_INT32(0), "chunkSize",
	                       BCON_INT32(10), "metadata", "{", "contentType", BCON_UTF8("b/b"), "mtime",
	                       BCON_DATE_TIME(2), "}", "contentType", BCON_UTF8("a/a"));
	gfs_file f;
	gfs_error err;
	assert_true(gfs_file_parse(doc, &f, &err));
	assert_string_equal(f.content_type, "a/a");
	assert_int_equal(f.mtime_ns, 2000000);
	assert_int_equal(f.sha256[0], '\0');
	gfs_file_free(&f);
	bson_destroy(doc);
}

static void
test_parse_rejects_missing_fields(void **state)
{
	(void)state;
	bson_t *no_len = BCON_NEW("_id", BCON_INT32(1), "chunkSize", BCON_INT32(10));
	bson_t *bad_cs = BCON_NEW("_id", BCON_INT32(1), "length", BCON_INT32(1), "chunkSize", BCON_INT32(0));
	bson_t *frac = BCON_NEW("_id", BCON_INT32(1), "length", BCON_DOUBLE(1.5), "chunkSize", BCON_INT32(4));
	gfs_file f;
	gfs_error err;
	assert_false(gfs_file_parse(no_len, &f, &err));
	assert_int_equal(err.code, GFS_EBADDOC);
	assert_false(gfs_file_parse(bad_cs, &f, &err));
	assert_false(gfs_file_parse(frac, &f, &err));
	bson_destroy(no_len);
	bson_destroy(bad_cs);
	bson_destroy(frac);
}

static void
test_batch_size_bounds(void **state)
{
	(void)state;
	assert_int_equal(gfs_chunk_batch_size(261120), 32);
	assert_int_equal(gfs_chunk_batch_size(16 << 20), 1);
	assert_int_equal(gfs_chunk_batch_size(1), 1000);
	assert_true((int64_t)gfs_chunk_batch_size(261120) * 261120 < 16 * 1024 * 1024);
}

static void
test_prefixes(void **state)
{
	(void)state;
	char *p = gfs_prefix_normalize("posters//");
	assert_string_equal(p, "posters/");
	free(p);
	p = gfs_prefix_normalize(NULL);
	assert_string_equal(p, "");
	free(p);
	p = gfs_prefix_join("posters", "ab/cd.jpg");
	assert_string_equal(p, "posters/ab/cd.jpg");
	free(p);
	p = gfs_prefix_join("", "x");
	assert_string_equal(p, "x");
	free(p);
	assert_string_equal(gfs_prefix_strip("posters/", "posters/a"), "a");
	assert_null(gfs_prefix_strip("posters/", "postersa"));
}

static void
test_utf8_names(void **state)
{
	(void)state;
	bool esc;
	assert_true(gfs_utf8_valid("caf\xc3\xa9", 5));
	assert_false(gfs_utf8_valid("\xc0\xaf", 2));         /* overlong '/' */
	assert_false(gfs_utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
	assert_false(gfs_utf8_valid("a\0b", 3));
	char *n = gfs_name_from_bytes("caf\xc3\xa9", 5, &esc);
	assert_string_equal(n, "caf\xc3\xa9");
	assert_false(esc);
	free(n);
	n = gfs_name_from_bytes("a\xff/b\xe9", 5, &esc);
	assert_string_equal(n, "a%FF/b%E9");
	assert_true(esc);
	free(n);
}

static void
test_raw_name(void **state)
{
	(void)state;
	bson_t *doc = BCON_NEW("metadata", "{", "rawName", BCON_BIN(BSON_SUBTYPE_BINARY, (const uint8_t *)"a\xff", 2), "}");
	size_t len = 0;
	char *raw = gfs_raw_name(doc, &len);
	assert_non_null(raw);
	assert_int_equal(len, 2);
	assert_memory_equal(raw, "a\xff", 2);
	free(raw);
	bson_destroy(doc);
}

static void
test_redact(void **state)
{
	(void)state;
	char *r = gfs_uri_redact("mongodb://user:s3cret@db1:27017,db2/x?replicaSet=rs");
	assert_null(strstr(r, "s3cret"));
	assert_string_equal(r, "mongodb://user:***@db1:27017,db2/x?replicaSet=rs");
	free(r);
	r = gfs_uri_redact("mongodb://db1/x");
	assert_string_equal(r, "mongodb://db1/x");
	free(r);
}

/* Each side of an unescaped '@' in a password, and its percent-decoded form, is blanked. */
static void
test_redact_messages(void **state)
{
	(void)state;
	gfs_secrets_from_uri("mongodb://user:ab%21cd@ef-gh@ij@db1/x?appname=a@b");
	char msg[128] = "Failed to resolve ef-gh@ij@db1; auth ab!cd@ef-gh@ij; raw ab%21cd";
	gfs_redact(msg, sizeof msg);
	assert_string_equal(msg, "Failed to resolve ***@db1; auth ***; raw ***");
	char small[12] = "ef-gh ef-gh";
	gfs_redact(small, sizeof small);
	assert_string_equal(small, "*** ***");
}

static void
test_sha256_vectors(void **state)
{
	(void)state;
	char hex[65];
	gfs_sha256 *h = gfs_sha256_new();
	gfs_sha256_final(h, hex);
	assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	h = gfs_sha256_new();
	gfs_sha256_update(h, "ab", 2);
	gfs_sha256_update(h, "c", 1);
	gfs_sha256_final(h, hex);
	assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

static void
test_ids_and_dates(void **state)
{
	(void)state;
	bson_value_t v;
	assert_false(gfs_id_parse_oid("xyz", &v));
	assert_false(gfs_id_parse_oid("6b10259227fecc59ffca558g", &v));
	assert_true(gfs_id_parse_oid("6b10259227fecc59ffca5581", &v));
	char *s = gfs_id_string(&v);
	assert_string_equal(s, "6b10259227fecc59ffca5581");
	free(s);
	char buf[32];
	gfs_iso8601(1600000000123, buf);
	assert_string_equal(buf, "2020-09-13T12:26:40.123Z");
}

static void
test_files_doc_layout(void **state)
{
	(void)state;
	bson_value_t id = {.value_type = BSON_TYPE_INT32, .value.v_int32 = 3};
	bson_t *meta = BCON_NEW("sha256", BCON_UTF8("stale"), "k", BCON_INT32(1));
	bson_t doc = BSON_INITIALIZER;
	gfs_files_doc(&doc, &id, "n", 5, 4, 99, "text/plain", "ab", meta);
	gfs_file f;
	gfs_error err;
	assert_true(gfs_file_parse(&doc, &f, &err));
	assert_int_equal(f.length, 5);
	assert_int_equal(f.chunk_size, 4);
	assert_string_equal(f.content_type, "text/plain");
	bson_iter_t it;
	assert_true(bson_iter_init_find(&it, &doc, "length"));
	assert_int_equal(bson_iter_type(&it), BSON_TYPE_INT64);
	assert_true(bson_iter_init_find(&it, &doc, "chunkSize"));
	assert_int_equal(bson_iter_type(&it), BSON_TYPE_INT32);
	/* the caller's stale sha256 never survives next to the real one */
	assert_true(bson_iter_init(&it, &doc) && bson_iter_find_descendant(&it, "metadata.sha256", &it));
	assert_string_equal(bson_iter_utf8(&it, NULL), "ab");
	gfs_file_free(&f);
	bson_destroy(&doc);
	bson_destroy(meta);
}

static void
test_shorten_keeps_both_ends(void **state)
{
	(void)state;
	char buf[12];
	assert_string_equal(gfs_shorten(buf, sizeof buf, "short", 5), "short");
	assert_string_equal(gfs_shorten(buf, sizeof buf, "exactly-11c", 11), "exactly-11c");
	assert_string_equal(gfs_shorten(buf, sizeof buf, "abcdefghijklmnop", 16), "abcd...mnop");
	/* Never inside a UTF-8 character: "\u00e9" is two bytes, kept whole or not at all. */
	const char *s = "ab\xc3\xa9" "cdefgh\xc3\xa9z";
	gfs_shorten(buf, sizeof buf, s, strlen(s));
	assert_true(gfs_utf8_valid(buf, strlen(buf)));
	assert_true(strlen(buf) < sizeof buf);
	assert_non_null(strstr(buf, "..."));
}

static void
test_error_set_keeps_the_reason(void **state)
{
	(void)state;
	char name[5000];
	memset(name, 'n', sizeof name - 1);
	name[sizeof name - 1] = '\0';
	gfs_error err;
	gfs_error_set(&err, GFS_EINVAL, "%s: refused: name longer than 4000 bytes", name);
	assert_int_equal(err.code, GFS_EINVAL);
	assert_true(strlen(err.msg) < sizeof err.msg);
	assert_non_null(strstr(err.msg, "nnn...nnn"));
	const char *end = ": refused: name longer than 4000 bytes";
	assert_string_equal(err.msg + strlen(err.msg) - strlen(end), end);
}

static void
test_grow_doubles_from_first(void **state)
{
	(void)state;
	int *v = NULL;
	size_t n = 0, cap = 0;
	for (int i = 0; i < 100; i++) {
		GFS_GROW(v, n + 1, cap, 8);
		v[n++] = i;
	}
	assert_int_equal(cap, 128);
	assert_int_equal(v[99], 99);
	GFS_GROW(v, 1000, cap, 8); /* more than double: exactly what is asked */
	assert_int_equal(cap, 1000);
	GFS_GROW(v, 10, cap, 8); /* room already: nothing changes */
	assert_int_equal(cap, 1000);
	assert_int_equal(v[99], 99);
	free(v);
}

static void
test_time_conversions(void **state)
{
	(void)state;
	struct timespec ts = {.tv_sec = 1700000000, .tv_nsec = 123456789};
	assert_true(gfs_timespec_ns(&ts) == 1700000000123456789LL);
	assert_true(gfs_timespec_ms(&ts) == 1700000000123LL);
	struct stat st = {0};
	st.st_mtim = ts;
	assert_true(gfs_stat_mtime_ns(&st) == 1700000000123456789LL);
	int64_t a = gfs_clock_ns(CLOCK_MONOTONIC), b = gfs_clock_ns(CLOCK_MONOTONIC);
	assert_true(a > 0 && b >= a);
}

/* The start of a file is the same whatever the size of the reads that deliver it. */
static void
test_sniff_gathers_small_reads(void **state)
{
	(void)state;
	static uint8_t file[GFS_MAGIC_SNIFF_BYTES + 10];
	for (size_t i = 0; i < sizeof file; i++)
		file[i] = (uint8_t)(i * 7);
	const void *head;
	size_t len;
	gfs_sniff sn = {0};
	size_t off = 0;
	while (!gfs_sniff_add(&sn, file + off, 3, false, &head, &len))
		off += 3;
	assert_int_equal(len, GFS_MAGIC_SNIFF_BYTES);
	assert_memory_equal(head, file, GFS_MAGIC_SNIFF_BYTES);
	assert_false(gfs_sniff_add(&sn, file, 3, true, &head, &len));   /* once only */
	gfs_sniff_free(&sn);

	/* A short file ends the start early; a first read holding it all is not copied. */
	gfs_sniff short_sn = {0};
	assert_false(gfs_sniff_add(&short_sn, "<ht", 3, false, &head, &len));
	assert_true(gfs_sniff_add(&short_sn, "ml>", 3, true, &head, &len));
	assert_int_equal(len, 6);
	assert_memory_equal(head, "<html>", 6);
	gfs_sniff_free(&short_sn);
	gfs_sniff whole = {0};
	assert_true(gfs_sniff_add(&whole, file, sizeof file, false, &head, &len));
	assert_ptr_equal(head, file);
	assert_int_equal(len, sizeof file);
	gfs_sniff_free(&whole);
}

static void
expect_upper(const char *prefix, const char *want)
{
	char *got = gfs_prefix_upper(prefix);
	if (!want) {
		assert_null(got);
		return;
	}
	assert_non_null(got);
	assert_string_equal(got, want);
	free(got);
}

/* The bound of a prefix range: exact, so nothing that begins with the prefix falls past it. */
static void
test_prefix_upper_bound(void **state)
{
	(void)state;
	expect_upper("p/", "p0");
	expect_upper("a", "b");
	expect_upper("\x7f", "\xc2\x80");                  /* U+007F -> U+0080 */
	expect_upper("x\xdf\xbf", "x\xe0\xa0\x80");         /* U+07FF -> U+0800 */
	expect_upper("\xed\x9f\xbf", "\xee\x80\x80");       /* U+D7FF -> U+E000, past the surrogates */
	expect_upper("\xef\xbf\xbf", "\xf0\x90\x80\x80");   /* U+FFFF -> U+10000 */
	expect_upper("p/\xf4\x8f\xbf\xbf", "p0");            /* carried past U+10FFFF */
	expect_upper("\xf4\x8f\xbf\xbf\xf4\x8f\xbf\xbf", NULL);
	expect_upper("p\xff", "q");                          /* past bytes no name holds */
	/* What lies between: "p/" + U+10FFFF and anything after it sorts below "p0" by bytes. */
	const char *inside = "p/\xf4\x8f\xbf\xbf\xf4\x8f\xbf\xbfz";
	char *upper = gfs_prefix_upper("p/");
	assert_true(strcmp(inside, upper) < 0 && strcmp("p/", inside) < 0);
	assert_true(strcmp("p0", upper) >= 0);
	free(upper);
}

/* The one rule for extra chunks: outside the content passed over, a second copy damage. */
static void
test_chunk_place(void **state)
{
	(void)state;
	assert_int_equal(gfs_chunk_place(0, 0, 3), GFS_CHUNK_NEXT);
	assert_int_equal(gfs_chunk_place(3, 3, 3), GFS_CHUNK_OUTSIDE);
	assert_int_equal(gfs_chunk_place(0, 0, 0), GFS_CHUNK_OUTSIDE);   /* an empty file has none */
	assert_int_equal(gfs_chunk_place(-1, 0, 3), GFS_CHUNK_OUTSIDE);
	assert_int_equal(gfs_chunk_place(1, 2, 3), GFS_CHUNK_DUPLICATE);
	assert_int_equal(gfs_chunk_place(2, 1, 3), GFS_CHUNK_GAP);
}

static enum gfs_check
rule_of(const char *json)
{
	bson_error_t berr;
	bson_t *doc = bson_new_from_json((const uint8_t *)json, -1, &berr);
	assert_non_null(doc);
	gfs_file f;
	gfs_error err;
	assert_true(gfs_file_parse(doc, &f, &err));
	enum gfs_check c = gfs_integrity_rule(&f);
	gfs_file_free(&f);
	bson_destroy(doc);
	return c;
}

#define DOC(extra) "{\"_id\": 1, \"length\": 0, \"chunkSize\": 10" extra "}"
#define SHA "0123456789abcdef0123456789abcdef0123456789abcdef0123456789ABCDEF"
#define MD5 "0123456789abcdef0123456789abcdef"

/* A malformed digest is damage, never the absence of one. */
static void
test_malformed_hash_is_damage(void **state)
{
	(void)state;
	assert_int_equal(rule_of(DOC("")), GFS_CHECK_NONE);
	assert_int_equal(rule_of(DOC(", \"metadata\": {\"sha256\": \"" SHA "\"}")), GFS_CHECK_SHA256);
	assert_int_equal(rule_of(DOC(", \"md5\": \"" MD5 "\"")), GFS_CHECK_MD5);
	assert_int_equal(rule_of(DOC(", \"md5\": null")), GFS_CHECK_NONE);
	assert_int_equal(rule_of(DOC(", \"metadata\": {\"sha256\": \"0123456789\"}")), GFS_CHECK_MALFORMED);
	assert_int_equal(rule_of(DOC(", \"metadata\": {\"sha256\": 5}")), GFS_CHECK_MALFORMED);
	assert_int_equal(rule_of(DOC(", \"metadata\": {\"sha256\": \"\"}")), GFS_CHECK_MALFORMED);
	assert_int_equal(rule_of(DOC(", \"metadata\": {\"sha256\": \"" MD5 MD5 "\"}, \"md5\": \"zz\"")),
	                 GFS_CHECK_SHA256);
	assert_int_equal(rule_of(DOC(", \"metadata\": {\"sha256\": \"x\"}, \"md5\": \"" MD5 "\"")),
	                 GFS_CHECK_MALFORMED);
	assert_int_equal(rule_of(DOC(", \"md5\": \"\"")), GFS_CHECK_MALFORMED);
	assert_int_equal(rule_of(DOC(", \"md5\": 5")), GFS_CHECK_MALFORMED);
	/* sha256 of 64 characters that are not all hex digits */
	assert_int_equal(rule_of(DOC(", \"metadata\": {\"sha256\": \"" MD5 "0123456789abcdef0123456789abcdeg\"}")),
	                 GFS_CHECK_MALFORMED);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chunk_count),
		cmocka_unit_test(test_sniff_gathers_small_reads),
		cmocka_unit_test(test_chunk_expected_len),
		cmocka_unit_test(test_parse_tolerates_numeric_types),
		cmocka_unit_test(test_parse_prefers_top_level_content_type),
		cmocka_unit_test(test_parse_rejects_missing_fields),
		cmocka_unit_test(test_batch_size_bounds),
		cmocka_unit_test(test_prefixes),
		cmocka_unit_test(test_utf8_names),
		cmocka_unit_test(test_raw_name),
		cmocka_unit_test(test_redact),
		cmocka_unit_test(test_redact_messages),
		cmocka_unit_test(test_sha256_vectors),
		cmocka_unit_test(test_ids_and_dates),
		cmocka_unit_test(test_files_doc_layout),
		cmocka_unit_test(test_shorten_keeps_both_ends),
		cmocka_unit_test(test_error_set_keeps_the_reason),
		cmocka_unit_test(test_grow_doubles_from_first),
		cmocka_unit_test(test_time_conversions),
		cmocka_unit_test(test_prefix_upper_bound),
		cmocka_unit_test(test_chunk_place),
		cmocka_unit_test(test_malformed_hash_is_damage),
	};
	return cmocka_run_group_tests_name("core", tests, NULL, NULL);
}
