/* Unit tests for serve's pure helpers: entity tags, HTTP dates, ranges, types, the map and the cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../lib/serve/memcache.h"
#include "../../lib/serve/httpparse.h"
#include "../../lib/strmap.h"

#define TAG "\"0123abcd\""

static void
test_etag_list(void **state)
{
	(void)state;
	assert_true(http_etag_list_match(TAG, TAG));
	assert_true(http_etag_list_match("*", TAG));
	assert_true(http_etag_list_match(" * ", TAG));
	assert_true(http_etag_list_match("\"x\", " TAG, TAG));
	assert_true(http_etag_list_match("\"x\",W/" TAG ",\"y\"", TAG)); /* weak comparison */
	assert_true(http_etag_list_match(TAG, "W/" TAG));
	assert_false(http_etag_list_match("\"x\", \"y\"", TAG));
	assert_false(http_etag_list_match("\"0123abc\"", TAG));
	assert_false(http_etag_list_match("0123abcd", TAG));     /* not quoted */
	assert_false(http_etag_list_match("\"unterminated", TAG));
	assert_false(http_etag_list_match("", TAG));
	assert_false(http_etag_list_match(NULL, TAG));
}

static void
test_if_range(void **state)
{
	(void)state;
	int64_t lm = 784111777; /* Sun, 06 Nov 1994 08:49:37 GMT */
	assert_true(http_if_range_ok(NULL, TAG, lm));
	assert_true(http_if_range_ok(TAG, TAG, lm));
	assert_false(http_if_range_ok("W/" TAG, TAG, lm)); /* strong comparison only */
	assert_false(http_if_range_ok("\"other\"", TAG, lm));
	assert_true(http_if_range_ok("Sun, 06 Nov 1994 08:49:37 GMT", TAG, lm));
	assert_false(http_if_range_ok("Sun, 06 Nov 1994 08:49:38 GMT", TAG, lm));
	assert_false(http_if_range_ok("garbage", TAG, lm));
}

static void
test_date_parse(void **state)
{
	(void)state;
	assert_int_equal(http_date_parse("Sun, 06 Nov 1994 08:49:37 GMT"), 784111777);
	assert_int_equal(http_date_parse("Sunday, 06-Nov-94 08:49:37 GMT"), 784111777);
	assert_int_equal(http_date_parse("Sun Nov  6 08:49:37 1994"), 784111777);
	assert_int_equal(http_date_parse("Thu, 01 Jan 1970 00:00:00 GMT"), 0);
	assert_int_equal(http_date_parse("Wed, 02 Dec 2026 14:21:03 GMT"), 1796221263);
	/* Only what http_date_format can write: a leap second would roll into year 10000. */
	assert_int_equal(http_date_parse("Fri, 31 Dec 9999 23:59:59 GMT"), 253402300799);
	assert_int_equal(http_date_parse("Fri, 31 Dec 9999 23:59:60 GMT"), -1);
	assert_int_equal(http_date_parse("Sun, 06 Nov 1994 08:49:37 UTC"), -1);
	assert_int_equal(http_date_parse("Sun, 06 Foo 1994 08:49:37 GMT"), -1);
	assert_int_equal(http_date_parse("Sun, 6 Nov 1994 08:49:37 GMT"), -1);
	assert_int_equal(http_date_parse("Sun, 06 Nov 1994 25:49:37 GMT"), -1);
	assert_int_equal(http_date_parse(""), -1);
	assert_int_equal(http_date_parse(NULL), -1);
}

static void
test_date_format(void **state)
{
	(void)state;
	char buf[32];
	http_date_format(784111777, buf);
	assert_string_equal(buf, "Sun, 06 Nov 1994 08:49:37 GMT");
	http_date_format(0, buf);
	assert_string_equal(buf, "Thu, 01 Jan 1970 00:00:00 GMT");
	for (int64_t t = 0; t < 4000000000LL; t += 123456789) {
		http_date_format(t, buf);
		assert_int_equal(http_date_parse(buf), t);
	}
}

static void
test_range(void **state)
{
	(void)state;
	int64_t a = -1, b = -1;
	assert_int_equal(http_range_parse(NULL, 100, &a, &b), HTTP_RANGE_NONE);
	assert_int_equal(http_range_parse("bytes=0-9", 100, &a, &b), HTTP_RANGE_OK);
	assert_int_equal(a, 0);
	assert_int_equal(b, 9);
	assert_int_equal(http_range_parse("bytes=90-", 100, &a, &b), HTTP_RANGE_OK);
	assert_int_equal(a, 90);
	assert_int_equal(b, 99);
	assert_int_equal(http_range_parse("bytes=-10", 100, &a, &b), HTTP_RANGE_OK);
	assert_int_equal(a, 90);
	assert_int_equal(b, 99);
	assert_int_equal(http_range_parse("bytes=-1000", 100, &a, &b), HTTP_RANGE_OK);
	assert_int_equal(a, 0);
	assert_int_equal(b, 99);
	assert_int_equal(http_range_parse("bytes=50-1000", 100, &a, &b), HTTP_RANGE_OK);
	assert_int_equal(b, 99);
	assert_int_equal(http_range_parse("bytes=99-99", 100, &a, &b), HTTP_RANGE_OK);
	assert_int_equal(http_range_parse("bytes=100-", 100, &a, &b), HTTP_RANGE_UNSATISFIABLE);
	assert_int_equal(http_range_parse("bytes=100-200", 100, &a, &b), HTTP_RANGE_UNSATISFIABLE);
	assert_int_equal(http_range_parse("bytes=-0", 100, &a, &b), HTTP_RANGE_UNSATISFIABLE);
	assert_int_equal(http_range_parse("bytes=0-", 0, &a, &b), HTTP_RANGE_UNSATISFIABLE);
	assert_int_equal(http_range_parse("bytes=5-2", 100, &a, &b), HTTP_RANGE_NONE);
	assert_int_equal(http_range_parse("bytes=0-1,5-6", 100, &a, &b), HTTP_RANGE_NONE);
	assert_int_equal(http_range_parse("items=0-1", 100, &a, &b), HTTP_RANGE_NONE);
	assert_int_equal(http_range_parse("bytes=x-1", 100, &a, &b), HTTP_RANGE_NONE);
	assert_int_equal(http_range_parse("bytes=-", 100, &a, &b), HTTP_RANGE_NONE);
	/* Positions past int64_t are past the end of any file: 416, or the end for a last one. */
	assert_int_equal(http_range_parse("bytes=99999999999999999999-", 100, &a, &b),
	                 HTTP_RANGE_UNSATISFIABLE);
	assert_int_equal(http_range_parse("bytes=9223372036854775807-", 100, &a, &b),
	                 HTTP_RANGE_UNSATISFIABLE);
	assert_int_equal(http_range_parse("bytes=5-99999999999999999999", 100, &a, &b), HTTP_RANGE_OK);
	assert_true(a == 5 && b == 99);
	assert_int_equal(http_range_parse("bytes=-99999999999999999999", 100, &a, &b), HTTP_RANGE_OK);
	assert_true(a == 0 && b == 99);
}

static void
test_request_checks(void **state)
{
	(void)state;
	assert_true(http_uri_has_nul("/a%00.jpg"));
	assert_true(http_uri_has_nul("/a?rev=%00"));
	assert_true(http_uri_has_nul("%00"));
	assert_false(http_uri_has_nul("/a%20b%0"));
	assert_false(http_uri_has_nul("/100%"));
	assert_true(http_header_value_ok("image/png"));
	assert_true(http_header_value_ok("text/plain;\tcharset=utf-8"));
	assert_false(http_header_value_ok("text/html\r\nX-Injected: 1"));
	assert_false(http_header_value_ok("image/\x01png"));
	assert_false(http_header_value_ok("caf\xc3\xa9"));
	assert_false(http_header_value_ok(""));
	assert_false(http_header_value_ok(NULL));
}

static void
test_types(void **state)
{
	(void)state;
	assert_string_equal(http_type_by_ext("a/b/poster.JPG"), "image/jpeg");
	assert_string_equal(http_type_by_ext("x.png"), "image/png");
	assert_string_equal(http_type_by_ext("notes.txt"), "text/plain; charset=utf-8");
	assert_string_equal(http_type_by_ext("dir.d/noext"), "application/octet-stream");
	assert_string_equal(http_type_by_ext(".hidden"), "application/octet-stream");
	assert_string_equal(http_type_by_ext(NULL), "application/octet-stream");
}

static void
test_rev_and_oid(void **state)
{
	(void)state;
	int rev = 0;
	assert_true(http_parse_rev("-1", &rev));
	assert_int_equal(rev, -1);
	assert_true(http_parse_rev("3", &rev));
	assert_int_equal(rev, 3);
	assert_false(http_parse_rev("", &rev));
	assert_false(http_parse_rev("1x", &rev));
	assert_false(http_parse_rev("99999999999", &rev));
	assert_true(http_is_oid("0123456789abcdefABCDEF01"));
	assert_false(http_is_oid("0123456789abcdefABCDEF0"));
	assert_false(http_is_oid("0123456789abcdefABCDEF012"));
	assert_false(http_is_oid("0123456789abcdefABCDEFzz"));
}

static void
test_strmap(void **state)
{
	(void)state;
	strmap *m = strmap_new(1);
	static char keys[5000][8];
	for (int i = 0; i < 5000; i++) {
		snprintf(keys[i], sizeof keys[i], "k%d", i);
		assert_null(strmap_put(m, keys[i], keys[i]));
	}
	assert_int_equal(strmap_count(m), 5000);
	assert_ptr_equal(strmap_get(m, "k4321"), keys[4321]);
	assert_ptr_equal(strmap_del(m, "k17"), keys[17]);
	assert_null(strmap_get(m, "k17"));
	assert_null(strmap_del(m, "k17"));
	assert_ptr_equal(strmap_put(m, "k18", keys[0]), keys[18]);
	assert_int_equal(strmap_count(m), 4999);
	strmap_free(m);
}

static int freed_users;

static void
count_free(void *u)
{
	(void)u;
	freed_users++;
}

static http_cache_entry *
put(http_cache *c, const char *key, size_t len)
{
	http_cache_body *b = http_cache_body_new(len);
	memset(b->data, 'x', len);
	http_cache_entry *e = http_cache_put(c, key, b, NULL, (void *)key);
	http_cache_body_unref(b);
	return e;
}

static void
test_cache_lru(void **state)
{
	(void)state;
	freed_users = 0;
	/* Room for three 1000-byte bodies with their overhead, not four. */
	http_cache *c = http_cache_new(3 * (1000 + 512) + 100, count_free);
	http_cache_entry_release(c, put(c, "a", 1000));
	http_cache_entry_release(c, put(c, "b", 1000));
	http_cache_entry_release(c, put(c, "c", 1000));
	http_cache_entry *a = http_cache_get(c, "a"); /* a is marked: it gets a second chance */
	assert_non_null(a);
	http_cache_entry_release(c, a);
	http_cache_entry_release(c, put(c, "d", 1000)); /* a goes round again, b (unmarked) goes */
	assert_null(http_cache_peek(c, "b"));
	http_cache_entry *held = http_cache_get(c, "c");
	assert_non_null(held);
	/* c marked goes round, a is unmarked now: evicts a */
	http_cache_entry_release(c, put(c, "e", 1000));
	assert_null(http_cache_peek(c, "a"));
	http_cache_entry_release(c, put(c, "f", 1000)); /* evicts d */
	assert_null(http_cache_peek(c, "d"));
	http_cache_entry_release(c, put(c, "g", 1000)); /* evicts c while we still hold it */
	assert_null(http_cache_peek(c, "c"));
	assert_int_equal(held->body->data[999], 'x'); /* still readable */
	http_cache_entry_release(c, held);
	struct http_cache_stats st;
	http_cache_stats(c, &st);
	assert_int_equal(st.entries, 3);
	assert_int_equal(st.evictions, 4);
	assert_int_equal(st.hits, 2);
	assert_true(st.bytes <= st.max_bytes);
	/* Too big for the whole cache: returned, never kept. */
	http_cache_entry *big = put(c, "big", 100000);
	assert_non_null(big);
	assert_null(http_cache_peek(c, "big"));
	http_cache_entry_release(c, big);
	/* A second put of the same key returns the first entry. */
	http_cache_entry *d1 = http_cache_peek(c, "f");
	http_cache_entry *d2 = put(c, "f", 10);
	assert_ptr_equal(d1, d2);
	http_cache_entry_release(c, d1);
	http_cache_entry_release(c, d2);
	http_cache_free(c);
	assert_int_equal(freed_users, 9); /* a b c d e f g, big, the second f */
}

static bool
named_b_or_c(void *user, void *ctx)
{
	(void)ctx;
	return strcmp(user, "b") == 0 || strcmp(user, "c") == 0;
}

static void
test_cache_drop_if(void **state)
{
	(void)state;
	freed_users = 0;
	http_cache *c = http_cache_new(1 << 20, count_free);
	http_cache_entry_release(c, put(c, "a", 100));
	http_cache_entry_release(c, put(c, "b", 100));
	http_cache_entry *held = put(c, "c", 100);
	assert_int_equal(http_cache_drop_if(c, named_b_or_c, NULL), 2);
	assert_null(http_cache_peek(c, "b"));
	assert_null(http_cache_peek(c, "c"));
	assert_int_equal(freed_users, 1);          /* b; c until its holder lets go */
	assert_int_equal(held->body->data[99], 'x');
	http_cache_entry_release(c, held);
	assert_int_equal(freed_users, 2);
	struct http_cache_stats st;
	http_cache_stats(c, &st);
	assert_int_equal(st.entries, 1);
	assert_int_equal(st.bytes, 100 + HTTP_CACHE_ENTRY_OVERHEAD);
	assert_int_equal(http_cache_drop_if(c, named_b_or_c, NULL), 0);
	http_cache_free(c);
	assert_int_equal(freed_users, 3);
}

static void
test_negative_cache(void **state)
{
	(void)state;
	http_cache *c = http_cache_new(1 << 20, NULL);
	http_cache_neg_put(c, "N:-1:missing", 1000);
	assert_true(http_cache_neg_has(c, "N:-1:missing", 999));
	assert_false(http_cache_neg_has(c, "N:-1:missing", 1000)); /* expired, and dropped */
	assert_false(http_cache_neg_has(c, "N:-1:missing", 0));
	assert_false(http_cache_neg_has(c, "other", 0));
	http_cache_free(c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_etag_list),
		cmocka_unit_test(test_if_range),
		cmocka_unit_test(test_date_parse),
		cmocka_unit_test(test_date_format),
		cmocka_unit_test(test_range),
		cmocka_unit_test(test_request_checks),
		cmocka_unit_test(test_types),
		cmocka_unit_test(test_rev_and_oid),
		cmocka_unit_test(test_strmap),
		cmocka_unit_test(test_cache_lru),
		cmocka_unit_test(test_cache_drop_if),
		cmocka_unit_test(test_negative_cache),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
