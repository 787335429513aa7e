/* Unit tests for verify's pure logic: the per-file chunk checker, --sample parsing and selection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../lib/verify.h"

/* 2500 bytes in chunks of 1000: 1000, 1000, 500. */
static void
test_check_whole_file(void **state)
{
	(void)state;
	gfs_chunk_check c;
	gfs_chunk_check_init(&c, 2500, 1000);
	assert_int_equal(c.expected, 3);
	assert_int_equal(gfs_chunk_check_add(&c, true, 0, true, 1000), 1);
	assert_int_equal(gfs_chunk_check_add(&c, true, 1, true, 1000), 1);
	assert_int_equal(gfs_chunk_check_add(&c, true, 2, true, 500), 1);
	gfs_chunk_check_end(&c);
	assert_false(c.failed);
	assert_int_equal(c.extras, 0);
}

static void
test_check_missing_middle_and_end(void **state)
{
	(void)state;
	gfs_chunk_check c;
	gfs_chunk_check_init(&c, 2500, 1000);
	assert_int_equal(gfs_chunk_check_add(&c, true, 0, true, 1000), 1);
	assert_int_equal(gfs_chunk_check_add(&c, true, 2, true, 500), 0);
	assert_true(c.failed);
	assert_int_equal(c.fail_kind, GFS_VK_MISSING_CHUNK);
	assert_int_equal(c.fail_n, 1);
	assert_string_equal(c.fail_detail, "n=1");
	gfs_chunk_check_end(&c);
	assert_int_equal(c.fail_n, 1); /* the first fault stays the one reported */

	gfs_chunk_check_init(&c, 2500, 1000);
	gfs_chunk_check_add(&c, true, 0, true, 1000);
	gfs_chunk_check_add(&c, true, 1, true, 1000);
	gfs_chunk_check_end(&c);
	assert_true(c.failed);
	assert_int_equal(c.fail_kind, GFS_VK_MISSING_CHUNK);
	assert_int_equal(c.fail_n, 2);

	/* no chunk at all reaches the checker only for a file with chunks expected */
	gfs_chunk_check_init(&c, 1, 1000);
	gfs_chunk_check_end(&c);
	assert_int_equal(c.fail_n, 0);
}

static void
test_check_sizes(void **state)
{
	(void)state;
	gfs_chunk_check c;
	gfs_chunk_check_init(&c, 2500, 1000);
	assert_int_equal(gfs_chunk_check_add(&c, true, 0, true, 999), 0);
	assert_int_equal(c.fail_kind, GFS_VK_WRONG_SIZE);
	assert_string_equal(c.fail_detail, "n=0 has 999 bytes, expected 1000");

	gfs_chunk_check_init(&c, 2500, 1000);
	gfs_chunk_check_add(&c, true, 0, true, 1000);
	gfs_chunk_check_add(&c, true, 1, true, 1000);
	assert_int_equal(gfs_chunk_check_add(&c, true, 2, true, 501), 0);
	assert_int_equal(c.fail_kind, GFS_VK_WRONG_SIZE);
	assert_int_equal(c.fail_n, 2);

	gfs_chunk_check_init(&c, 2500, 1000);
	assert_int_equal(gfs_chunk_check_add(&c, true, 0, false, 0), 0);
	assert_int_equal(c.fail_kind, GFS_VK_BAD_DOC);
	gfs_chunk_check_init(&c, 2500, 1000);
	assert_int_equal(gfs_chunk_check_add(&c, false, 0, true, 1000), 0);
	assert_int_equal(c.fail_kind, GFS_VK_BAD_DOC);
}

/* Extra and duplicate chunks are counted but leave the rest of the file checkable. */
static void
test_check_extras(void **state)
{
	(void)state;
	gfs_chunk_check c;
	gfs_chunk_check_init(&c, 2500, 1000);
	assert_int_equal(gfs_chunk_check_add(&c, true, 0, true, 1000), 1);
	assert_int_equal(gfs_chunk_check_add(&c, true, 0, true, 1000), 0);   /* duplicate */
	assert_int_equal(gfs_chunk_check_add(&c, true, 1, true, 1000), 1);
	assert_int_equal(gfs_chunk_check_add(&c, true, 2, true, 500), 1);
	assert_int_equal(gfs_chunk_check_add(&c, true, 3, true, 7), 0);      /* beyond the count */
	assert_int_equal(gfs_chunk_check_add(&c, true, 9, true, 7), 0);
	gfs_chunk_check_end(&c);
	assert_false(c.failed);
	assert_int_equal(c.extras, 3);
	assert_int_equal(c.first_extra_n, 0);
	/* only the second copy of n=0 is a duplicate; 3 and 9 are never read */
	assert_int_equal(c.dups, 1);

	/* an empty file owns no chunk */
	gfs_chunk_check_init(&c, 0, 1000);
	assert_int_equal(gfs_chunk_check_add(&c, true, 0, true, 0), 0);
	gfs_chunk_check_end(&c);
	assert_false(c.failed);
	assert_int_equal(c.extras, 1);
	assert_int_equal(c.dups, 0);

	/* negative n: never read, not a duplicate */
	gfs_chunk_check_init(&c, 10, 1000);
	assert_int_equal(gfs_chunk_check_add(&c, true, -1, true, 10), 0);
	assert_int_equal(c.extras, 1);
	assert_int_equal(c.dups, 0);
}

static void
test_parse_percent(void **state)
{
	(void)state;
	double f;
	assert_true(gfs_verify_parse_percent("10%", &f));
	assert_true(f > 0.0999 && f < 0.1001);
	assert_true(gfs_verify_parse_percent("0.5", &f));
	assert_true(f > 0.00499 && f < 0.00501);
	assert_true(gfs_verify_parse_percent("100%", &f));
	assert_true(f == 1.0);
	assert_false(gfs_verify_parse_percent("0", &f));
	assert_false(gfs_verify_parse_percent("0%", &f));
	assert_false(gfs_verify_parse_percent("101%", &f));
	assert_false(gfs_verify_parse_percent("-5%", &f));
	assert_false(gfs_verify_parse_percent("5%%", &f));
	assert_false(gfs_verify_parse_percent("five", &f));
	assert_false(gfs_verify_parse_percent("", &f));
	assert_false(gfs_verify_parse_percent("nan", &f));
}

static void
test_sampled(void **state)
{
	(void)state;
	int hits = 0;
	for (int i = 0; i < 10000; i++) {
		bson_value_t id = {.value_type = BSON_TYPE_OID};
		bson_oid_init(&id.value.v_oid, NULL);
		if (gfs_verify_sampled(&id, 0.1, 42))
			hits++;
		assert_true(gfs_verify_sampled(&id, 1.0, 42));
		/* the same id and seed always give the same answer */
		assert_int_equal(gfs_verify_sampled(&id, 0.3, 7), gfs_verify_sampled(&id, 0.3, 7));
	}
	assert_in_range(hits, 800, 1200);
}

static void
test_kind_names(void **state)
{
	(void)state;
	assert_string_equal(gfs_verify_kind_name(GFS_VK_MISSING_CHUNK), "MISSING-CHUNK");
	assert_string_equal(gfs_verify_kind_name(GFS_VK_WRONG_SIZE), "WRONG-SIZE");
	assert_string_equal(gfs_verify_kind_name(GFS_VK_EXTRA_CHUNK), "EXTRA-CHUNK");
	assert_string_equal(gfs_verify_kind_name(GFS_VK_CHECKSUM), "CHECKSUM");
	assert_string_equal(gfs_verify_kind_name(GFS_VK_UNVERIFIABLE), "UNVERIFIABLE");
	assert_string_equal(gfs_verify_kind_name(GFS_VK_ORPHAN_CHUNKS), "ORPHAN-CHUNKS");
	assert_string_equal(gfs_verify_kind_name(GFS_VK_INCOMPLETE), "INCOMPLETE");
	assert_string_equal(gfs_verify_kind_name(GFS_VK_BAD_DOC), "BAD-DOC");
}

static bson_value_t
num(bson_type_t t, double d)
{
	bson_value_t v = {.value_type = t};
	if (t == BSON_TYPE_INT32)
		v.value.v_int32 = (int32_t)d;
	else if (t == BSON_TYPE_INT64)
		v.value.v_int64 = (int64_t)d;
	else
		v.value.v_double = d;
	return v;
}

/* The server matches ids by value across number types: so must every table and filter. */
static void
test_numeric_ids_match_by_value(void **state)
{
	(void)state;
	bson_value_t i32 = num(BSON_TYPE_INT32, 77), i64 = num(BSON_TYPE_INT64, 77);
	bson_value_t dbl = num(BSON_TYPE_DOUBLE, 77.0), half = num(BSON_TYPE_DOUBLE, 77.5);
	assert_true(gfs_id_equal(&i32, &i64));
	assert_true(gfs_id_equal(&i64, &dbl));
	assert_true(gfs_id_equal(&dbl, &i32));
	assert_false(gfs_id_equal(&half, &i64));
	assert_true(gfs_id_equal(&half, &half));
	/* 2^53 + 1 has no double: the nearest double is another number */
	bson_value_t big = num(BSON_TYPE_INT64, 0), bigd = num(BSON_TYPE_DOUBLE, 9007199254740992.0);
	big.value.v_int64 = 9007199254740993LL;
	assert_false(gfs_id_equal(&big, &bigd));
	big.value.v_int64 = 9007199254740992LL;
	assert_true(gfs_id_equal(&big, &bigd));
	/* beyond int64: stays a double, equal to no int64 */
	bson_value_t huge = num(BSON_TYPE_DOUBLE, 9223372036854775808.0);
	assert_int_equal(gfs_id_canonical(&huge).value_type, BSON_TYPE_DOUBLE);
	bson_value_t str = {.value_type = BSON_TYPE_UTF8};
	str.value.v_utf8.str = (char *)"77";
	str.value.v_utf8.len = 2;
	assert_false(gfs_id_equal(&str, &i32));
	/* the sample draws equal ids alike, whatever their type */
	for (uint64_t seed = 0; seed < 64; seed++)
		assert_int_equal(gfs_verify_sampled(&i32, 0.5, seed), gfs_verify_sampled(&dbl, 0.5, seed));
}

/* One rule for verify, get, mirror and serve: sha256, else md5, hex in any case. */
static void
test_integrity_rule(void **state)
{
	(void)state;
	gfs_file f;
	memset(&f, 0, sizeof f);
	f.filename = (char *)"x";
	gfs_error err;
	assert_int_equal(gfs_integrity_rule(&f), GFS_CHECK_NONE);
	assert_true(gfs_integrity_check(&f, "00", NULL, &err));

	gfs_digest *d = gfs_digest_new(&f);
	gfs_digest_update(d, "abc", 3);
	char sha[65], md5[33];
	gfs_digest_final(d, sha, md5);
	assert_string_equal(sha, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	assert_string_equal(md5, "");

	strcpy(f.md5, "900150983CD24FB0D6963F7D28E17F72");   /* md5("abc"), upper case */
	assert_int_equal(gfs_integrity_rule(&f), GFS_CHECK_MD5);
	d = gfs_digest_new(&f);
	gfs_digest_update(d, "abc", 3);
	assert_true(gfs_digest_check(d, &f, sha, &err));
	d = gfs_digest_new(&f);
	gfs_digest_update(d, "abd", 3);
	assert_false(gfs_digest_check(d, &f, NULL, &err));
	assert_int_equal(err.code, GFS_ECHECKSUM);
	assert_non_null(strstr(err.msg, "md5"));

	/* sha256 stored: it decides, and md5 is not consulted */
	strcpy(f.sha256, "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD");
	strcpy(f.md5, "00000000000000000000000000000000");
	assert_int_equal(gfs_integrity_rule(&f), GFS_CHECK_SHA256);
	assert_true(gfs_integrity_check(&f, sha, NULL, &err));
	f.sha256[0] = 'C';
	assert_false(gfs_integrity_check(&f, sha, NULL, &err));
}

/* The spec's filters: {files_id: {$eq: id}}, so an id that is a document is never an operator. */
static void
test_id_filter_uses_eq(void **state)
{
	(void)state;
	bson_t *inner = BCON_NEW("$ne", BCON_INT32(0));
	bson_value_t id = {.value_type = BSON_TYPE_DOCUMENT};
	id.value.v_doc.data = (uint8_t *)bson_get_data(inner);
	id.value.v_doc.data_len = inner->len;
	bson_t filter = BSON_INITIALIZER;
	gfs_id_filter(&filter, "files_id", &id);
	char *json = bson_as_canonical_extended_json(&filter, NULL);
	assert_string_equal(json, "{ \"files_id\" : { \"$eq\" : { \"$ne\" : { \"$numberInt\" : \"0\" } } } }");
	bson_free(json);
	bson_destroy(&filter);
	bson_destroy(inner);
}

/* The whole bucket is one scan, whatever the server. */
static void
test_choose_whole_bucket_scans(void **state)
{
	(void)state;
	gfs_read_caps none = {0}, all = {.eq_indexed = true};
	assert_int_equal(gfs_read_choose(&all, true, 10, 10), GFS_READ_SCAN);
	assert_int_equal(gfs_read_choose(&none, true, 10, -1), GFS_READ_SCAN);
}

/*
 * A selection: a query per file where the equality is indexed; one scan
 * where it is not (every query would read the whole collection).
 */
static void
test_choose_selection_by_server(void **state)
{
	(void)state;
	gfs_read_caps eq = {.eq_indexed = true};
	gfs_read_caps none = {0};
	assert_int_equal(gfs_read_choose(&eq, false, 200, -1), GFS_READ_EACH);
	assert_int_equal(gfs_read_choose(&none, false, 1, -1), GFS_READ_SCAN);
	assert_int_equal(gfs_read_choose(&none, false, 200, 52000), GFS_READ_SCAN);
}

/* A quarter of the bucket or more is one scan; more than GFS_READ_FEW uncounted is too. */
static void
test_choose_large_selection_scans(void **state)
{
	(void)state;
	gfs_read_caps eq = {.eq_indexed = true};
	assert_int_equal(gfs_read_choose(&eq, false, 1299, 5200), GFS_READ_EACH);
	assert_int_equal(gfs_read_choose(&eq, false, 1300, 5200), GFS_READ_SCAN);
	assert_int_equal(gfs_read_choose(&eq, false, 3, 10), GFS_READ_SCAN);
	assert_int_equal(gfs_read_choose(&eq, false, GFS_READ_FEW, -1), GFS_READ_EACH);
	assert_int_equal(gfs_read_choose(&eq, false, GFS_READ_FEW + 1, -1), GFS_READ_SCAN);
}

/* batched, the $in of old, is still a word: it reads as each. */
static void
test_batched_reads_as_each(void **state)
{
	(void)state;
	assert_int_equal(gfs_read_resolve(GFS_READ_BATCHED), GFS_READ_EACH);
	assert_int_equal(gfs_read_resolve(GFS_READ_SCAN), GFS_READ_SCAN);
	assert_int_equal(gfs_read_resolve(GFS_READ_AUTO), GFS_READ_AUTO);
}

static void
test_strategy_words(void **state)
{
	(void)state;
	const char *words[] = {"auto", "scan", "batched", "each"};
	for (size_t i = 0; i < 4; i++) {
		enum gfs_read_strategy st;
		assert_true(gfs_read_strategy_parse(words[i], &st));
		assert_string_equal(gfs_read_strategy_name(st), words[i]);
	}
	enum gfs_read_strategy st = GFS_READ_SCAN;
	assert_false(gfs_read_strategy_parse("fast", &st));
	assert_false(gfs_read_strategy_parse("", &st));
	assert_int_equal(st, GFS_READ_SCAN);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_check_whole_file),
		cmocka_unit_test(test_check_missing_middle_and_end),
		cmocka_unit_test(test_check_sizes),
		cmocka_unit_test(test_check_extras),
		cmocka_unit_test(test_parse_percent),
		cmocka_unit_test(test_sampled),
		cmocka_unit_test(test_kind_names),
		cmocka_unit_test(test_numeric_ids_match_by_value),
		cmocka_unit_test(test_integrity_rule),
		cmocka_unit_test(test_id_filter_uses_eq),
		cmocka_unit_test(test_choose_whole_bucket_scans),
		cmocka_unit_test(test_choose_selection_by_server),
		cmocka_unit_test(test_choose_large_selection_scans),
		cmocka_unit_test(test_batched_reads_as_each),
		cmocka_unit_test(test_strategy_words),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
