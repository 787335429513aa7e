/* Unit tests: the names watch knows stored (lib/knownnames), and when it stops trusting them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../lib/knownnames.h"

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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(absence_needs_a_counted_pass),
		cmocka_unit_test(a_gap_in_the_takes_ends_trust),
		cmocka_unit_test(folders_copy_and_forget_the_names_under_them),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
