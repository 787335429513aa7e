/* Unit tests for import's selection logic: globs, hidden and temporary names, excludes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../lib/walk.h"

static void
test_glob_basics(void **state)
{
	(void)state;
	assert_true(gfs_glob_match("*.jpg", "a.jpg"));
	assert_true(gfs_glob_match("*.jpg", ".jpg"));
	assert_false(gfs_glob_match("*.jpg", "a.jpeg"));
	assert_false(gfs_glob_match("*.jpg", "d/a.jpg"));   /* '*' stops at '/' */
	assert_true(gfs_glob_match("a?c", "abc"));
	assert_false(gfs_glob_match("a?c", "a/c"));
	assert_false(gfs_glob_match("a?c", "ac"));
	assert_true(gfs_glob_match("", ""));
	assert_false(gfs_glob_match("", "a"));
	assert_true(gfs_glob_match("*", ""));
	assert_true(gfs_glob_match("a*b*c", "aXXbYYc"));
	assert_false(gfs_glob_match("a*b*c", "aXXbYY"));
}

static void
test_glob_classes_and_escapes(void **state)
{
	(void)state;
	assert_true(gfs_glob_match("[ab]x", "bx"));
	assert_false(gfs_glob_match("[ab]x", "cx"));
	assert_true(gfs_glob_match("[a-f0-9][a-f0-9]", "3e"));
	assert_false(gfs_glob_match("[a-f0-9]", "g"));
	assert_true(gfs_glob_match("[!a]", "b"));
	assert_false(gfs_glob_match("[!a]", "a"));
	assert_true(gfs_glob_match("[^a]", "b"));
	assert_true(gfs_glob_match("[]]", "]"));        /* ']' first is literal */
	assert_true(gfs_glob_match("[a-]", "-"));
	assert_false(gfs_glob_match("[!x]", "/"));      /* classes never match '/' */
	assert_true(gfs_glob_match("[abc", "[abc"));    /* unclosed: literal '[' */
	assert_true(gfs_glob_match("\\*", "*"));
	assert_false(gfs_glob_match("\\*", "a"));
	assert_true(gfs_glob_match("a\\?", "a?"));
	assert_true(gfs_glob_match("caf\xc3\xa9*", "caf\xc3\xa9.txt"));
}

static void
test_glob_double_star(void **state)
{
	(void)state;
	assert_true(gfs_glob_match("**", "a/b/c"));
	assert_true(gfs_glob_match("**/x.jpg", "x.jpg"));
	assert_true(gfs_glob_match("**/x.jpg", "a/b/x.jpg"));
	assert_false(gfs_glob_match("**/x.jpg", "a/bx.jpg"));
	assert_true(gfs_glob_match("a/**", "a/b/c"));
	assert_true(gfs_glob_match("a/**/z", "a/z"));
	assert_true(gfs_glob_match("a/**/z", "a/b/c/z"));
	assert_false(gfs_glob_match("a/**/z", "b/z"));
	assert_true(gfs_glob_match("**.jpg", "a/b.jpg"));
}

static void
test_hidden_and_temp(void **state)
{
	(void)state;
	assert_true(gfs_walk_is_hidden(".git"));
	assert_false(gfs_walk_is_hidden("a.b"));
	assert_true(gfs_walk_is_temp("x.part"));
	assert_true(gfs_walk_is_temp(".part"));
	assert_true(gfs_walk_is_temp("notes~"));
	assert_true(gfs_walk_is_temp(".#lock"));
	assert_false(gfs_walk_is_temp("part"));
	assert_false(gfs_walk_is_temp("x.partial"));
	assert_false(gfs_walk_is_temp("a#b"));
}

static void
test_selection(void **state)
{
	(void)state;
	const char *ex[] = {"*.tmp", "/cache", "a/b/skip"};
	const char *in[] = {"*.jpg", "docs/**"};
	gfs_walk_opts o = {.exclude = ex, .n_exclude = 3};

	assert_true(gfs_walk_file_selected(&o, "x.jpg", "x.jpg"));
	assert_false(gfs_walk_file_selected(&o, "d/x.tmp", "x.tmp"));
	assert_false(gfs_walk_dir_selected(&o, "cache", "cache"));
	assert_true(gfs_walk_dir_selected(&o, "a/cache", "cache"));   /* anchored at the top */
	assert_false(gfs_walk_dir_selected(&o, "a/b/skip", "skip"));
	assert_false(gfs_walk_dir_selected(&o, ".git", ".git"));
	assert_false(gfs_walk_file_selected(&o, "x~", "x~"));

	o.hidden = o.temp = true;
	assert_true(gfs_walk_dir_selected(&o, ".git", ".git"));
	assert_true(gfs_walk_file_selected(&o, "x~", "x~"));

	o.include = in;
	o.n_include = 2;
	assert_true(gfs_walk_file_selected(&o, "p/x.jpg", "x.jpg"));
	assert_true(gfs_walk_file_selected(&o, "docs/a/readme", "readme"));
	assert_false(gfs_walk_file_selected(&o, "p/readme", "readme"));
	assert_false(gfs_walk_file_selected(&o, "p/x.tmp", "x.tmp"));  /* exclusion wins */
	assert_true(gfs_walk_dir_selected(&o, "p", "p"));              /* includes never prune */
}

static void
test_path_selected(void **state)
{
	(void)state;
	const char *ex[] = {"cache", "*.log"};
	gfs_walk_opts o = {.exclude = ex, .n_exclude = 2};
	assert_true(gfs_walk_path_selected(&o, "a/b/c.jpg"));
	assert_false(gfs_walk_path_selected(&o, "a/cache/c.jpg"));
	assert_false(gfs_walk_path_selected(&o, "a/.hidden/c.jpg"));
	assert_false(gfs_walk_path_selected(&o, "a/b/x.log"));
	assert_false(gfs_walk_path_selected(&o, "a/b/x.part"));
	assert_true(gfs_walk_path_selected(&o, "top.jpg"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_glob_basics),
		cmocka_unit_test(test_glob_classes_and_escapes),
		cmocka_unit_test(test_glob_double_star),
		cmocka_unit_test(test_hidden_and_temp),
		cmocka_unit_test(test_selection),
		cmocka_unit_test(test_path_selected),
	};
	return cmocka_run_group_tests_name("walk", tests, NULL, NULL);
}
