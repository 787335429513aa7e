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
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
