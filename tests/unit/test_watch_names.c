/* Unit tests: the names watch knows stored (lib/watch_names), and when it stops trusting them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "../../lib/watch_names.h"

/* Nothing is trusted before a full pass, nor after one whose lock take could not be counted. */
static void
absence_needs_a_counted_pass(void **state)
{
	(void)state;
	gfs_known_names *k = gfs_known_names_new();
	assert_false(gfs_known_names_absent(k, "a"));
	gfs_known_names_begin(k, 0);
	assert_false(gfs_known_names_absent(k, "a"));
	gfs_known_names_begin(k, 7);
	assert_true(gfs_known_names_absent(k, "a"));
	gfs_known_names_add(k, "a");
	assert_false(gfs_known_names_absent(k, "a"));
	gfs_known_names_forget(k, "a");
	assert_true(gfs_known_names_absent(k, "a"));
	assert_false(gfs_known_names_absent(NULL, "a"));
	gfs_known_names_free(k);
	gfs_known_names_free(NULL);
}

/* Another take of the lock between two of ours is another writer: doubt until the next pass. */
static void
a_gap_in_the_takes_ends_trust(void **state)
{
	(void)state;
	gfs_known_names *k = gfs_known_names_new();
	gfs_known_names_begin(k, 3);
	gfs_known_names_follow(k, 4);
	gfs_known_names_follow(k, 5);
	assert_true(gfs_known_names_absent(k, "x"));
	gfs_known_names_follow(k, 7);
	assert_false(gfs_known_names_absent(k, "x"));
	gfs_known_names_follow(k, 8); /* consecutive again, but what the other wrote is unknown */
	assert_false(gfs_known_names_absent(k, "x"));
	gfs_known_names_begin(k, 9);
	assert_true(gfs_known_names_absent(k, "x"));
	gfs_known_names_follow(k, 0); /* a take that could not be counted */
	assert_false(gfs_known_names_absent(k, "x"));
	gfs_known_names_free(k);
}

/* A folder is the names under "folder/", not those that merely start with its name. */
static void
folders_copy_and_forget_the_names_under_them(void **state)
{
	(void)state;
	gfs_known_names *k = gfs_known_names_new();
	gfs_known_names_begin(k, 1);
	gfs_known_names_add(k, "p/a/1");
	gfs_known_names_add(k, "p/a/sub/2");
	gfs_known_names_add(k, "p/ab/3");
	gfs_known_names_add(k, "p/a");
	gfs_known_names_copy_folder(k, "p/a", "p/b");
	assert_false(gfs_known_names_absent(k, "p/b/1"));
	assert_false(gfs_known_names_absent(k, "p/b/sub/2"));
	assert_true(gfs_known_names_absent(k, "p/bb/3"));
	assert_true(gfs_known_names_absent(k, "p/b/3"));
	assert_true(gfs_known_names_absent(k, "p/b"));
	gfs_known_names_forget_folder(k, "p/a");
	assert_true(gfs_known_names_absent(k, "p/a/1"));
	assert_true(gfs_known_names_absent(k, "p/a/sub/2"));
	assert_false(gfs_known_names_absent(k, "p/ab/3"));
	assert_false(gfs_known_names_absent(k, "p/a"));
	assert_false(gfs_known_names_absent(k, "p/b/1"));
	gfs_known_names_free(k);
}

static size_t
settle(gfs_known_names *k, int64_t takes)
{
	char **names;
	size_t n = gfs_known_names_settle(k, takes, &names);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	assert_true(n == 0 || names != NULL);
	return n;
}

/*
 * Names stored without the lock are looked at again only when a take not
 * ours came in between: seen by our own next take, or by the count read
 * while nobody holds the lock.
 */
static void
unsure_names_are_rechecked_after_another_take(void **state)
{
	(void)state;
	gfs_known_names *k = gfs_known_names_new();
	gfs_known_names_begin(k, 3);
	assert_false(gfs_known_names_any_unsure(k));
	gfs_known_names_unsure(k, "a");
	gfs_known_names_unsure(k, "a");
	gfs_known_names_unsure(k, "b");
	assert_true(gfs_known_names_any_unsure(k));
	assert_int_equal(settle(k, 3), 0);            /* nobody took it */
	assert_false(gfs_known_names_any_unsure(k));
	assert_true(gfs_known_names_absent(k, "x"));

	gfs_known_names_unsure(k, "a");
	gfs_known_names_follow(k, 4);                 /* a batch of ours, consecutive */
	assert_int_equal(settle(k, 4), 0);
	gfs_known_names_unsure(k, "a");
	gfs_known_names_follow(k, 6);                 /* ours, after another's */
	assert_int_equal(settle(k, 6), 1);
	gfs_known_names_begin(k, 7);
	gfs_known_names_unsure(k, "a");
	gfs_known_names_unsure(k, "b");
	assert_int_equal(settle(k, 8), 2);            /* another's, seen by the count alone */
	assert_false(gfs_known_names_absent(k, "x"));
	assert_int_equal(settle(k, 8), 0);
	gfs_known_names_recheck(k, "c");              /* a look that failed */
	assert_int_equal(settle(k, 8), 1);
	gfs_known_names_free(k);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(absence_needs_a_counted_pass),
		cmocka_unit_test(a_gap_in_the_takes_ends_trust),
		cmocka_unit_test(folders_copy_and_forget_the_names_under_them),
		cmocka_unit_test(unsure_names_are_rechecked_after_another_take),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
