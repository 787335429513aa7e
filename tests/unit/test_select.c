/* Unit tests for lib/select.c: the typed --id syntax, pattern and regex prefixes, matching. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../lib/select.h"

static void
test_typed_ids(void **state)
{
	(void)state;
	bson_value_t v;
	gfs_error err;
	assert_true(gfs_id_parse_typed("6b10259227fecc59ffca5581", &v, &err));
	assert_int_equal(v.value_type, BSON_TYPE_OID);
	assert_true(gfs_id_parse_typed("oid:6b10259227fecc59ffca5581", &v, &err));
	assert_int_equal(v.value_type, BSON_TYPE_OID);
	assert_true(gfs_id_parse_typed("str:6b10259227fecc59ffca5581", &v, &err));
	assert_int_equal(v.value_type, BSON_TYPE_UTF8);
	assert_string_equal(v.value.v_utf8.str, "6b10259227fecc59ffca5581");
	bson_value_destroy(&v);
	assert_true(gfs_id_parse_typed("str:", &v, &err));
	assert_int_equal(v.value.v_utf8.len, 0);
	bson_value_destroy(&v);
	assert_true(gfs_id_parse_typed("int:-2147483648", &v, &err));
	assert_int_equal(v.value_type, BSON_TYPE_INT32);
	assert_int_equal(v.value.v_int32, INT32_MIN);
	assert_true(gfs_id_parse_typed("long:9223372036854775807", &v, &err));
	assert_int_equal(v.value_type, BSON_TYPE_INT64);
	assert_true(v.value.v_int64 == INT64_MAX);
	const char *bad[] = {"", "6b10259227fecc59ffca558", "oid:zz", "int:", "int:1x", "int:2147483648",
	                     "long:9223372036854775808", "float:1", "str:\xff"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		assert_false(gfs_id_parse_typed(bad[i], &v, &err));
}

static void
expect_regex_prefix(const char *re, const char *want)
{
	char *got = gfs_regex_prefix(re);
	assert_string_equal(got, want);
	free(got);
}

static void
test_regex_prefix(void **state)
{
	(void)state;
	expect_regex_prefix("^posters/b1/.*\\.jpg$", "posters/b1/");
	expect_regex_prefix("posters/b1", "");          /* not anchored: anywhere */
	expect_regex_prefix("^a|^b", "");               /* an alternation */
	expect_regex_prefix("^abc*", "ab");             /* c is optional */
	expect_regex_prefix("^abc?d", "ab");
	expect_regex_prefix("^abc{0,2}", "ab");
	expect_regex_prefix("^abc+", "abc");
	expect_regex_prefix("^a\\.b\\*", "a.b*");      /* escaped specials are literal */
	expect_regex_prefix("^a\\.*", "a");            /* ... and a quantifier takes them */
	expect_regex_prefix("^a\\w", "a");              /* an escape class stops */
	expect_regex_prefix("^(ab)", "");
	expect_regex_prefix("^[ab]c", "");
}

static void
test_glob_match(void **state)
{
	(void)state;
	gfs_match m;
	gfs_match_glob(&m, "posters/b1/*/b9*");
	assert_string_equal(m.prefix, "posters/b1/");
	assert_true(gfs_match_name(&m, "posters/b1/aa/b9x.jpg"));
	assert_false(gfs_match_name(&m, "posters/b1/aa/deep/b9x.jpg")); /* '*' stays in a folder */
	assert_false(gfs_match_name(&m, "posters/b2/aa/b9x.jpg"));
	gfs_match_free(&m);
	gfs_match_glob(&m, "a\\*b?");
	assert_string_equal(m.prefix, "a*b");
	assert_true(gfs_match_name(&m, "a*bc"));
	assert_false(gfs_match_name(&m, "axbc"));
	gfs_match_free(&m);
	assert_true(gfs_has_glob("a/[bc]"));
	assert_false(gfs_has_glob("a\\*b"));
	assert_false(gfs_has_glob("plain/name"));
}

static void
test_regex_and_folder_match(void **state)
{
	(void)state;
	gfs_match m;
	gfs_error err;
	assert_false(gfs_match_regex(&m, "(", &err));
	assert_true(gfs_match_regex(&m, "b9\\.jpg$", &err));
	assert_string_equal(m.prefix, "");
	assert_true(gfs_match_name(&m, "other/b9.jpg"));
	assert_false(gfs_match_name(&m, "other/b9.jpeg"));
	gfs_match_free(&m);
	gfs_match_folder(&m, "posters");
	assert_true(gfs_match_name(&m, "posters/a"));
	assert_false(gfs_match_name(&m, "posters-old/a"));
	gfs_match_free(&m);
	/* ls PREFIX: the folder, or the name itself */
	gfs_match_text(&m, "posters/");
	assert_string_equal(m.prefix, "posters");
	assert_true(gfs_match_name(&m, "posters"));
	assert_true(gfs_match_name(&m, "posters/a"));
	assert_false(gfs_match_name(&m, "posters-old/a"));
	assert_false(gfs_match_name(&m, "postersX"));
	gfs_match_free(&m);
	gfs_match_text(&m, NULL);
	assert_true(gfs_match_name(&m, "anything"));
	gfs_match_free(&m);
}

static void
test_reserved_metadata(void **state)
{
	(void)state;
	assert_true(gfs_metadata_key_reserved("sha256"));
	assert_true(gfs_metadata_key_reserved("rawName"));
	assert_false(gfs_metadata_key_reserved("owner"));
	assert_false(gfs_metadata_key_reserved("SHA256"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_typed_ids),
		cmocka_unit_test(test_regex_prefix),
		cmocka_unit_test(test_glob_match),
		cmocka_unit_test(test_regex_and_folder_match),
		cmocka_unit_test(test_reserved_metadata),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
