/* Unit tests: the library's hash map and its FNV-1a (lib/strmap), as import, verify and serve use them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "../../lib/strmap.h"

static void
fnv1a_matches_the_reference_vectors(void **state)
{
	(void)state;
	/* The published 64-bit FNV-1a values. */
	assert_true(gfs_fnv1a("", 0, GFS_FNV1A_BASIS) == 0xcbf29ce484222325ULL);
	assert_true(gfs_fnv1a("a", 1, GFS_FNV1A_BASIS) == 0xaf63dc4c8601ec8cULL);
	assert_true(gfs_fnv1a("foobar", 6, GFS_FNV1A_BASIS) == 0x85944171f73967e8ULL);
	/* A seed changes the hash: verify --sample draws with it. */
	assert_true(gfs_fnv1a("foobar", 6, GFS_FNV1A_BASIS ^ 1) != 0x85944171f73967e8ULL);
}

/* Byte keys may hold NULs, and a key that is a prefix of another is a different key. */
static void
byte_keys_are_compared_by_length_and_bytes(void **state)
{
	(void)state;
	strmap *m = strmap_new(0);
	int a, b, c;
	void **s = strmap_slot(m, "ab\0c", 4);
	assert_null(*s);
	*s = &a;
	s = strmap_slot(m, "ab", 2);
	assert_null(*s);
	*s = &b;
	*strmap_slot(m, "ab\0d", 4) = &c;
	assert_int_equal(strmap_count(m), 3);
	assert_ptr_equal(strmap_getn(m, "ab\0c", 4), &a);
	assert_ptr_equal(strmap_getn(m, "ab\0d", 4), &c);
	assert_ptr_equal(strmap_getn(m, "ab", 2), &b);
	assert_ptr_equal(strmap_get(m, "ab"), &b);
	assert_null(strmap_getn(m, "ab\0", 3));
	assert_null(strmap_getn(m, "a", 1));
	/* A slot of a key already there is its value: find-or-add without a second lookup. */
	assert_ptr_equal(*strmap_slot(m, "ab\0c", 4), &a);
	assert_int_equal(strmap_count(m), 3);
	assert_ptr_equal(strmap_del(m, "ab"), &b);
	assert_ptr_equal(strmap_getn(m, "ab\0c", 4), &a);
	strmap_free(m);
}

struct seen {
	size_t n;
	size_t sum;
};

static void
count_entry(const char *key, void *value, void *ctx)
{
	struct seen *s = ctx;
	/* The key handed out is the map's copy, NUL-terminated, and belongs to its value. */
	assert_string_equal(key, (const char *)value);
	s->n++;
	s->sum += strlen(key);
}

/* Growing from the smallest table keeps every entry, and slots stay valid across growth. */
static void
grows_past_many_entries(void **state)
{
	(void)state;
	enum { N = 20000 };
	static char keys[N][12];
	strmap *m = strmap_new(1);
	void **first = NULL;
	size_t total = 0;
	for (int i = 0; i < N; i++) {
		snprintf(keys[i], sizeof keys[i], "dir/%d", i);
		total += strlen(keys[i]);
		void **s = strmap_slot(m, keys[i], strlen(keys[i]));
		assert_null(*s);
		*s = keys[i];
		if (i == 0)
			first = s;
	}
	assert_int_equal(strmap_count(m), N);
	assert_ptr_equal(*first, keys[0]);
	for (int i = 0; i < N; i++)
		assert_ptr_equal(strmap_getn(m, keys[i], strlen(keys[i])), keys[i]);
	assert_null(strmap_get(m, "dir/20000"));
	struct seen s = {0};
	strmap_each(m, count_entry, &s);
	assert_int_equal(s.n, N);
	assert_int_equal(s.sum, total);
	for (int i = 0; i < N; i += 2)
		assert_ptr_equal(strmap_del(m, keys[i]), keys[i]);
	assert_int_equal(strmap_count(m), N / 2);
	assert_null(strmap_get(m, "dir/0"));
	assert_ptr_equal(strmap_get(m, "dir/1"), keys[1]);
	strmap_free(m);
}

static void
put_replaces_and_returns_the_old_value(void **state)
{
	(void)state;
	strmap *m = strmap_new(64);
	int a, b;
	assert_null(strmap_put(m, "x", &a));
	assert_ptr_equal(strmap_put(m, "x", &b), &a);
	assert_int_equal(strmap_count(m), 1);
	assert_ptr_equal(strmap_get(m, "x"), &b);
	assert_null(strmap_del(m, "y"));
	assert_null(strmap_get(m, ""));
	assert_null(strmap_put(m, "", &a));
	assert_ptr_equal(strmap_get(m, ""), &a);
	strmap_free(m);
	strmap_free(NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(fnv1a_matches_the_reference_vectors),
		cmocka_unit_test(byte_keys_are_compared_by_length_and_bytes),
		cmocka_unit_test(grows_past_many_entries),
		cmocka_unit_test(put_replaces_and_returns_the_old_value),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
