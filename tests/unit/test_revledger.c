/* Unit tests: the ledger serve's index uses to notice removals from one count (lib/serve/revledger). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../lib/serve/revledger.h"

/* Each document counts once, however often the poll's overlap returns it. */
static void
documents_count_once(void **state)
{
	(void)state;
	gfs_rev_ledger *l = gfs_rev_ledger_new();
	assert_true(gfs_rev_ledger_see(l, "a1", "a"));
	assert_true(gfs_rev_ledger_see(l, "a2", "a"));
	assert_true(gfs_rev_ledger_see(l, "x", NULL));
	assert_false(gfs_rev_ledger_see(l, "a1", "a"));
	assert_int_equal(gfs_rev_ledger_known(l), 3);
	assert_int_equal(gfs_rev_ledger_of_name(l, "a"), 2);
	assert_int_equal(gfs_rev_ledger_of_name(l, "b"), 0);
	gfs_rev_ledger_free(l);
	gfs_rev_ledger_free(NULL);
}

/*
 * A count taken before the query: fewer than known proves a removal; an
 * insert that only the count saw does not hide one from the next poll.
 */
static void
a_smaller_count_is_a_removal(void **state)
{
	(void)state;
	gfs_rev_ledger *l = gfs_rev_ledger_new();
	gfs_rev_ledger_see(l, "a1", "a");
	gfs_rev_ledger_see(l, "b1", "b");
	assert_false(gfs_rev_ledger_removed(l, 2));
	assert_false(gfs_rev_ledger_removed(l, 3)); /* an insert the query has not returned yet */
	assert_true(gfs_rev_ledger_removed(l, 1));
	/* b1 removed, c1 inserted before the count: 2 counted; the query then returns c1. */
	gfs_rev_ledger_see(l, "c1", "c");
	assert_true(gfs_rev_ledger_removed(l, 2));
	gfs_rev_ledger_free(l);
}

/* A replacement: its new revision seen, its old one removed; rereading the name explains the count. */
static void
rereading_a_name_explains_its_removed_revisions(void **state)
{
	(void)state;
	gfs_rev_ledger *l = gfs_rev_ledger_new();
	gfs_rev_ledger_see(l, "a1", "a");
	gfs_rev_ledger_see(l, "b1", "b");
	gfs_rev_ledger_see(l, "a2", "a"); /* the poll's new revision; a1 is gone: the count is 2 */
	assert_true(gfs_rev_ledger_removed(l, 2));
	gfs_rev_ledger_set_name(l, "a", 1);
	assert_false(gfs_rev_ledger_removed(l, 2));
	assert_int_equal(gfs_rev_ledger_known(l), 2);
	gfs_rev_ledger_set_name(l, "a", 0); /* all of a removed */
	assert_int_equal(gfs_rev_ledger_known(l), 1);
	gfs_rev_ledger_set_name(l, "new", 2); /* a name first met by a reread */
	assert_int_equal(gfs_rev_ledger_known(l), 3);
	gfs_rev_ledger_free(l);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(documents_count_once),
		cmocka_unit_test(a_smaller_count_is_a_removal),
		cmocka_unit_test(rereading_a_name_explains_its_removed_revisions),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
