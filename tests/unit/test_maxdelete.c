/* Unit tests: the --max-delete parser and check shared by import, mirror and watch (lib/maxdelete). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../../lib/maxdelete.h"

static void
parses_counts_and_percentages(void **state)
{
	(void)state;
	gfs_max_delete m;
	assert_true(gfs_max_delete_parse("0", &m));
	assert_true(m.set && !m.percent && m.limit == 0);
	assert_true(gfs_max_delete_parse("500", &m));
	assert_true(!m.percent && m.limit == 500);
	assert_true(gfs_max_delete_parse("5%", &m));
	assert_true(m.percent && m.limit == 5);
	assert_true(gfs_max_delete_parse("100%", &m));
	const char *bad[] = {"", "%", "-1", "+-1", "101%", "5%%", "1.5", "1e3", "10 ", " 10", "x",
	                     "5% ", "99999999999999999999", "+5", "-0"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		assert_false(gfs_max_delete_parse(bad[i], &m));
}

static void
checks_before_anything_is_deleted(void **state)
{
	(void)state;
	gfs_max_delete unset = {0}, n3, p10;
	gfs_error err = {0};
	assert_true(gfs_max_delete_check(&unset, 1000000, 1, "x", &err));
	assert_true(gfs_max_delete_check(NULL, 5, 5, "x", &err));
	assert_true(gfs_max_delete_parse("3", &n3) && gfs_max_delete_parse("10%", &p10));
	assert_true(gfs_max_delete_check(&n3, 3, 3, "x", &err));
	assert_false(gfs_max_delete_check(&n3, 4, 100, "import --delete", &err));
	assert_int_equal(err.code, GFS_ELIMIT);
	assert_non_null(strstr(err.msg, "import --delete would delete 4 files, more than --max-delete 3"));
	/* exactly 10% passes, one more does not; integers, no rounding */
	assert_true(gfs_max_delete_check(&p10, 10, 100, "x", &err));
	assert_false(gfs_max_delete_check(&p10, 11, 100, "x", &err));
	assert_non_null(strstr(err.msg, "11 of 100 files (11%)"));
	assert_false(gfs_max_delete_check(&p10, 1, 9, "x", &err));
	/* nothing to delete is never over, even of nothing managed */
	assert_true(gfs_max_delete_check(&p10, 0, 0, "x", &err));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(parses_counts_and_percentages),
		cmocka_unit_test(checks_before_anything_is_deleted),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
