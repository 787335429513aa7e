/* The disk tier on its own: naming, torn entries, LRU by bytes, restart, leftovers. */
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

#include "../../lib/disktier.h"

static const char SHA_A[] = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

static gfs_meta *
meta(const char *id, int64_t length, const char *sha, int64_t upload_ms)
{
	gfs_file f;
	memset(&f, 0, sizeof f);
	f.id.value_type = BSON_TYPE_UTF8;
	f.id.value.v_utf8.str = (char *)id;
	f.id.value.v_utf8.len = (uint32_t)strlen(id);
	f.filename = (char *)id;
	f.length = length;
	f.chunk_size = 255 * 1024;
	f.upload_date = upload_ms;
	snprintf(f.sha256, sizeof f.sha256, "%s", sha ? sha : "");
	return gfs_meta_from_file(&f);
}

static char *
tmpdir(void)
{
	char *d = strdup("/tmp/disktier-test-XXXXXX");
	assert_non_null(mkdtemp(d));
	return d;
}

static void
rm_rf(const char *d)
{
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
	assert_int_equal(system(cmd), 0);
}

static off_t
size_of(const char *dir, const char *name)
{
	char p[1024];
	assert_true(snprintf(p, sizeof p, "%s/%s", dir, name) < (int)sizeof p);
	struct stat st;
	return stat(p, &st) == 0 ? st.st_size : -1;
}

static void
test_names(void **state)
{
	(void)state;
	char *d = tmpdir();
	gfs_error err;
	disktier *t = disktier_open(d, 1 << 20, NULL, &err);
	assert_non_null(t);
	char upper[65];
	for (int i = 0; i < 65; i++)
		upper[i] = (char)(SHA_A[i] >= 'a' && SHA_A[i] <= 'f' ? SHA_A[i] - 'a' + 'A' : SHA_A[i]);
	gfs_meta *a = meta("one", 4, upper, 1), *b = meta("two", 4, SHA_A, 2);
	disktier_put(t, a, "test", 4);
	assert_int_equal(size_of(d, SHA_A), 4);          /* lower-case hex, whatever was stored */
	assert_true(disktier_has(t, b));                  /* same content, one entry */
	int fd = disktier_get(t, b);
	assert_true(fd >= 0);
	close(fd);
	gfs_meta *bad = meta("../../etc/passwd", 3, "zz", 1);   /* not a sha256: named by identity */
	gfs_meta *again = meta("../../etc/passwd", 3, "zz", 2); /* a new upload of the same id */
	disktier_put(t, bad, "abc", 3);
	assert_true(disktier_has(t, bad));
	assert_false(disktier_has(t, again));
	struct disktier_stats s;
	disktier_stats(t, &s);
	assert_int_equal(s.entries, 2);
	assert_int_equal(s.bytes, 7);
	assert_int_equal(s.hits, 1);
	gfs_meta_unref(a);
	gfs_meta_unref(b);
	gfs_meta_unref(bad);
	gfs_meta_unref(again);
	disktier_close(t);
	rm_rf(d);
	free(d);
}

static void
test_torn_entry_is_never_served(void **state)
{
	(void)state;
	char *d = tmpdir();
	gfs_error err;
	disktier *t = disktier_open(d, 1 << 20, NULL, &err);
	gfs_meta *a = meta("a", 4, SHA_A, 1);
	disktier_put(t, a, "test", 4);
	char p[1024];
	snprintf(p, sizeof p, "%s/%s", d, SHA_A);
	assert_int_equal(truncate(p, 2), 0);
	assert_int_equal(disktier_get(t, a), -1);
	assert_int_equal(size_of(d, SHA_A), -1);         /* discarded */
	assert_false(disktier_has(t, a));
	/* A short fill is never committed. */
	disktier_fill *f = disktier_fill_begin(t, a);
	assert_non_null(f);
	assert_true(disktier_fill_write(f, "te", 2));
	disktier_fill_commit(f);
	assert_int_equal(size_of(d, SHA_A), -1);
	struct disktier_stats s;
	disktier_stats(t, &s);
	assert_int_equal(s.misses, 1);
	assert_int_equal(s.entries, 0);
	gfs_meta_unref(a);
	disktier_close(t);
	rm_rf(d);
	free(d);
}

static void
test_lru_by_bytes_and_restart(void **state)
{
	(void)state;
	char *d = tmpdir();
	gfs_error err;
	disktier *t = disktier_open(d, 1 << 20, NULL, &err);
	static char body[400 << 10];
	memset(body, 'x', sizeof body);
	gfs_meta *m[4];
	for (int i = 0; i < 4; i++) {
		char id[8];
		snprintf(id, sizeof id, "f%d", i);
		m[i] = meta(id, sizeof body, NULL, i);
	}
	disktier_put(t, m[0], body, sizeof body);
	disktier_put(t, m[1], body, sizeof body);
	int fd = disktier_get(t, m[0]);                   /* m[0] used: m[1] is the coldest */
	close(fd);
	disktier_put(t, m[2], body, sizeof body);         /* 1.2M > 1M: one must go */
	assert_true(disktier_has(t, m[0]));
	assert_false(disktier_has(t, m[1]));
	assert_true(disktier_has(t, m[2]));
	struct disktier_stats s;
	disktier_stats(t, &s);
	assert_int_equal(s.evictions, 1);
	assert_int_equal(s.bytes, 2 * sizeof body);
	disktier_close(t);

	/* Restart: indexed from the directory; a dead writer's temporary file goes, a stranger stays. */
	char p[1024];
	snprintf(p, sizeof p, "%s/tmp/%s.999999999.0", d, SHA_A);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fclose(f);
	snprintf(p, sizeof p, "%s/README", d);
	f = fopen(p, "w");
	assert_non_null(f);
	fclose(f);
	t = disktier_open(d, 1 << 20, NULL, &err);
	assert_non_null(t);
	disktier_stats(t, &s);
	assert_int_equal(s.entries, 2);
	assert_int_equal(s.bytes, 2 * sizeof body);
	assert_true(disktier_has(t, m[0]) && disktier_has(t, m[2]));
	snprintf(p, sizeof p, "tmp/%s.999999999.0", SHA_A);
	assert_int_equal(size_of(d, p), -1);
	assert_int_equal(size_of(d, "README"), 0);
	/* Larger than the whole tier: not kept. */
	gfs_meta *huge = meta("huge", 2 << 20, NULL, 9);
	assert_null(disktier_fill_begin(t, huge));
	gfs_meta_unref(huge);
	disktier_close(t);
	/* Reopened smaller: shrinks to fit at once. */
	t = disktier_open(d, sizeof body + 1, NULL, &err);
	disktier_stats(t, &s);
	assert_int_equal(s.entries, 1);
	disktier_close(t);
	for (int i = 0; i < 4; i++)
		gfs_meta_unref(m[i]);
	rm_rf(d);
	free(d);
}

static void
count_done(void *ctx)
{
	(*(int *)ctx)++;
}

static void
test_async_fills_are_written_by_close(void **state)
{
	(void)state;
	char *d = tmpdir();
	gfs_error err;
	disktier *t = disktier_open(d, 1 << 20, NULL, &err);
	gfs_meta *a = meta("a", 4, SHA_A, 1), *b = meta("b", 3, NULL, 1);
	int done = 0;
	disktier_put_async(t, a, "test", 4, count_done, &done);
	disktier_put_async(t, b, "xyz", 3, count_done, &done);
	disktier_put_async(t, b, "xy", 2, count_done, &done);   /* not its length: refused */
	disktier_close(t);                                      /* waits for the writer */
	assert_int_equal(done, 3);
	assert_int_equal(size_of(d, SHA_A), 4);
	t = disktier_open(d, 1 << 20, NULL, &err);
	assert_true(disktier_has(t, a) && disktier_has(t, b));
	disktier_put_async(t, a, "test", 4, count_done, &done); /* there already: nothing to do */
	assert_int_equal(done, 4);
	disktier_close(t);
	gfs_meta_unref(a);
	gfs_meta_unref(b);
	rm_rf(d);
	free(d);
}

static void
test_open_fails_on_a_file(void **state)
{
	(void)state;
	char *d = tmpdir();
	char p[1024];
	snprintf(p, sizeof p, "%s/plain", d);
	FILE *f = fopen(p, "w");
	fclose(f);
	gfs_error err;
	gfs_error_clear(&err);
	assert_null(disktier_open(p, 1 << 20, NULL, &err));
	assert_int_equal(err.code, GFS_ELOCAL);
	assert_non_null(strstr(err.msg, p));
	snprintf(p, sizeof p, "%s/new", d);
	disktier *t = disktier_open(p, 0, NULL, &err);   /* created 0700, default size */
	assert_non_null(t);
	struct stat st;
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0700);
	struct disktier_stats s;
	disktier_stats(t, &s);
	assert_true(s.max_bytes > 0 && s.max_bytes <= DISKTIER_DEFAULT_CAP);
	disktier_close(t);
	rm_rf(d);
	free(d);
}

/* Sending an entry leaves its inode alone: no atime update, so no inode write per fill. */
static void
test_hits_leave_atime_alone(void **state)
{
	(void)state;
	char *d = tmpdir();
	gfs_error err;
	disktier *t = disktier_open(d, 1 << 20, NULL, &err);
	gfs_meta *a = meta("a", 4, SHA_A, 1);
	disktier_put(t, a, "test", 4);
	char p[1024];
	snprintf(p, sizeof p, "%s/%s", d, SHA_A);
	/* An atime older than mtime: relatime would update it on the next read. */
	struct timespec ts[2] = {{.tv_sec = 1000000000, .tv_nsec = 0}, {.tv_nsec = UTIME_OMIT}};
	assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
	int fd = disktier_get(t, a);
	assert_true(fd >= 0);
	char buf[4];
	assert_int_equal(pread(fd, buf, sizeof buf, 0), 4);
	assert_memory_equal(buf, "test", 4);
	close(fd);
	struct stat st;
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_atim.tv_sec, 1000000000);
	gfs_meta_unref(a);
	disktier_close(t);
	rm_rf(d);
	free(d);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_torn_entry_is_never_served),
		cmocka_unit_test(test_lru_by_bytes_and_restart),
		cmocka_unit_test(test_async_fills_are_written_by_close),
		cmocka_unit_test(test_open_fails_on_a_file),
		cmocka_unit_test(test_hits_leave_atime_alone),
	};
	return cmocka_run_group_tests_name("disktier", tests, NULL, NULL);
}
