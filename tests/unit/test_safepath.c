/* Unit tests: stored names to safe local paths (lib/safepath, lib/mirror names). */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../lib/mirror/mirror.h"
#include "../../lib/safepath.h"

static bool
ok_name(const char *s)
{
	gfs_error err;
	return gfs_safepath_check(s, strlen(s), &err);
}

static void
test_check_accepts(void **state)
{
	(void)state;
	assert_true(ok_name("a"));
	assert_true(ok_name("a/b/c.jpg"));
	assert_true(ok_name(".hidden"));
	assert_true(ok_name("a/..b/c"));
	assert_true(ok_name("a/b.."));
	assert_true(ok_name("...")); /* only exactly ".." is the parent */
	assert_true(ok_name("a\\..\\b")); /* backslash is an ordinary byte on Linux */
	assert_true(ok_name("caf\xc3\xa9/\xff\xfe"));
}

static void
test_check_refuses(void **state)
{
	(void)state;
	assert_false(ok_name(""));
	assert_false(ok_name("/etc/x"));
	assert_false(ok_name("/"));
	assert_false(ok_name(".."));
	assert_false(ok_name("../x"));
	assert_false(ok_name("a/../../x"));
	assert_false(ok_name("a/.."));
	assert_false(ok_name("."));
	assert_false(ok_name("./a"));
	assert_false(ok_name("a/./b"));
	assert_false(ok_name("a//b"));
	assert_false(ok_name("a/"));
	assert_false(ok_name("a/b/"));
}

static void
test_check_nul_and_length(void **state)
{
	(void)state;
	gfs_error err;
	assert_false(gfs_safepath_check("a\0b", 3, &err));
	assert_int_equal(err.code, GFS_EINVAL);
	assert_non_null(strstr(err.msg, "NUL"));

	char seg[GFS_SAFEPATH_SEG_MAX + 2];
	memset(seg, 'x', sizeof seg);
	assert_true(gfs_safepath_check(seg, GFS_SAFEPATH_SEG_MAX, &err));
	assert_false(gfs_safepath_check(seg, GFS_SAFEPATH_SEG_MAX + 1, &err));

	char *big = malloc(GFS_SAFEPATH_MAX + 2);
	for (size_t i = 0; i < GFS_SAFEPATH_MAX + 1; i++)
		big[i] = i % 100 == 99 ? '/' : 'y';
	assert_false(gfs_safepath_check(big, GFS_SAFEPATH_MAX + 1, &err));
	assert_true(gfs_safepath_check(big, GFS_SAFEPATH_MAX - 1, &err));
	free(big);
}

static void
test_dirlen(void **state)
{
	(void)state;
	assert_int_equal(gfs_safepath_dirlen("a", 1), 0);
	assert_int_equal(gfs_safepath_dirlen("ab/c", 4), 2);
	assert_int_equal(gfs_safepath_dirlen("ab/cd/e", 7), 5);
}

static char *
local(const char *filename, const char *nprefix, const char *raw, size_t raw_len, size_t *len)
{
	char *out;
	gfs_error err;
	if (!gfs_mirror_local_path(filename, nprefix, raw, raw_len, &out, len, &err))
		return NULL;
	return out;
}

static void
test_local_path_plain(void **state)
{
	(void)state;
	size_t len;
	char *p = local("posters/ab/cd.jpg", "posters/", NULL, 0, &len);
	assert_string_equal(p, "ab/cd.jpg");
	assert_int_equal(len, 9);
	free(p);
	p = local("ab/cd.jpg", "", NULL, 0, &len);
	assert_string_equal(p, "ab/cd.jpg");
	free(p);
	/* Not under the prefix, or unsafe once stripped. */
	assert_null(local("other/x", "posters/", NULL, 0, &len));
	assert_null(local("posters//etc/x", "posters/", NULL, 0, &len));
	assert_null(local("posters/../x", "posters/", NULL, 0, &len));
	assert_null(local("posters/", "posters/", NULL, 0, &len));
	assert_null(local("../x", "", NULL, 0, &len));
	assert_null(local("/etc/passwd", "", NULL, 0, &len));
	assert_null(local("a/.gridfsctl-mirror-0123456789abcdef.tmp", "", NULL, 0, &len));
}

static void
test_local_path_raw(void **state)
{
	(void)state;
	size_t len;
	/* import of "d\xff/x\xfe.jpg" under prefix "p": filename "p/d%FF/x%FE.jpg" */
	const char raw[] = "d\xff/x\xfe.jpg";
	size_t rl = sizeof raw - 1;
	char *p = local("p/d%FF/x%FE.jpg", "p/", raw, rl, &len);
	assert_non_null(p);
	assert_int_equal(len, rl);
	assert_memory_equal(p, raw, rl);
	free(p);
	/* Mirror of the whole bucket keeps the import prefix as a folder. */
	p = local("p/d%FF/x%FE.jpg", "", raw, rl, &len);
	assert_non_null(p);
	assert_int_equal(len, rl + 2);
	assert_memory_equal(p, "p/d\xff/x\xfe.jpg", rl + 2);
	free(p);
	/* A mirror prefix reaching into the escaped folder drops its raw segment. */
	p = local("p/d%FF/x%FE.jpg", "p/d%FF/", raw, rl, &len);
	assert_non_null(p);
	assert_int_equal(len, 6);
	assert_memory_equal(p, "x\xfe.jpg", 6);
	free(p);
	/* rawName that does not belong to the filename is refused, not trusted. */
	assert_null(local("p/other.jpg", "p/", raw, rl, &len));
	assert_null(local("p/xd%FF/x%FE.jpg", "p/", raw, rl, &len));
	/* Raw bytes are checked like any name. */
	p = local("p/..%FF", "p/", "..\xff", 3, &len);
	assert_non_null(p); /* "..\xff" is a name, not the parent */
	free(p);
	const char evil[] = "../\xff";
	assert_null(local("p/../%FF", "p/", evil, 4, &len));
}

static void
test_temp_names(void **state)
{
	(void)state;
	char a[64], b[64];
	gfs_mirror_temp_name(a);
	gfs_mirror_temp_name(b);
	assert_string_not_equal(a, b);
	assert_true(gfs_mirror_is_temp_name(a, strlen(a)));
	const char *ok = ".gridfsctl-mirror-0123456789abcdef.tmp";
	assert_true(gfs_mirror_is_temp_name(ok, strlen(ok)));
	const char *bad[] = {".gridfsctl-mirror-0123456789ABCDEF.tmp", ".gridfsctl-mirror-0123.tmp",
	                     ".gridfsctl-mirror-0123456789abcdef.tmpx", "gridfsctl-mirror-0123456789abcdef.tmp",
	                     ".gridfsctl-mirror-0123456789abcdeg.tmp", "x.jpg"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		assert_false(gfs_mirror_is_temp_name(bad[i], strlen(bad[i])));
}

/* The walk on a real directory: symlinks inside are refused, never followed. */
static void
test_opendir_refuses_symlink(void **state)
{
	(void)state;
	char root[] = "/tmp/test_safepath.XXXXXX";
	char outside[] = "/tmp/test_safepath_out.XXXXXX";
	assert_non_null(mkdtemp(root));
	assert_non_null(mkdtemp(outside));
	int rfd = open(root, O_RDONLY | O_DIRECTORY);
	assert_true(rfd >= 0);
	assert_int_equal(symlinkat(outside, rfd, "link"), 0);
	assert_int_equal(mkdirat(rfd, "real", 0777), 0);
	assert_int_equal(symlinkat("../link", rfd, "real/inner"), 0);

	gfs_error err;
	assert_int_equal(gfs_safepath_opendir(rfd, "link", 4, GFS_SAFEPATH_CREATE, &err), -1);
	assert_non_null(strstr(err.msg, "symlink"));
	assert_int_equal(gfs_safepath_opendir(rfd, "link/sub", 8, GFS_SAFEPATH_CREATE, &err), -1);
	assert_int_equal(gfs_safepath_opendir(rfd, "real/inner/x", 12, GFS_SAFEPATH_CREATE, &err), -1);
	assert_non_null(strstr(err.msg, "real/inner"));

	/* Nothing appeared outside. */
	char probe[128];
	snprintf(probe, sizeof probe, "%s/sub", outside);
	struct stat st;
	assert_int_equal(stat(probe, &st), -1);

	/* Plain creation works, and an existing directory opens without create. */
	int fd = gfs_safepath_opendir(rfd, "n1/n2", 5, GFS_SAFEPATH_CREATE | GFS_SAFEPATH_SYNC, &err);
	assert_true(fd >= 0);
	close(fd);
	fd = gfs_safepath_opendir(rfd, "n1/n2", 5, 0, &err);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(gfs_safepath_opendir(rfd, "n1/missing", 10, 0, &err), -1);

	unlinkat(rfd, "real/inner", 0);
	unlinkat(rfd, "real", AT_REMOVEDIR);
	unlinkat(rfd, "link", 0);
	unlinkat(rfd, "n1/n2", AT_REMOVEDIR);
	unlinkat(rfd, "n1", AT_REMOVEDIR);
	close(rfd);
	rmdir(root);
	rmdir(outside);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_check_accepts),
		cmocka_unit_test(test_check_refuses),
		cmocka_unit_test(test_check_nul_and_length),
		cmocka_unit_test(test_dirlen),
		cmocka_unit_test(test_local_path_plain),
		cmocka_unit_test(test_local_path_raw),
		cmocka_unit_test(test_temp_names),
		cmocka_unit_test(test_opendir_refuses_symlink),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
