/* The disk tier on its own: naming, proofs, torn entries, LRU by bytes, restart, leftovers. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../lib/serve/disktier.h"

static const char SHA_A[] = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
/* sha256("tesT"), the same size as "test" */
static const char SHA_B[] = "db60c4e56ed9727f556307e104a2a47b33b9aaed36e87ac5090b5dfc1bf914f2";

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

/*
 * The path of d's entry whose body is data[0..len): the file holds the
 * body and then its sha256 in hex (checked here with the tier's hashing,
 * which test_core checks against known digests). "" when there is none.
 */
static void
entry_path(const char *d, const void *data, size_t len, char out[1024])
{
	out[0] = '\0';
	DIR *dir = opendir(d);
	assert_non_null(dir);
	struct dirent *de;
	while ((de = readdir(dir))) {
		if (strncmp(de->d_name, "r-", 2) != 0)
			continue;
		char p[1024], *buf = malloc(len + 65);
		snprintf(p, sizeof p, "%s/%s", d, de->d_name);
		FILE *f = fopen(p, "rb");
		size_t n = f ? fread(buf, 1, len + 65, f) : 0;
		if (f)
			fclose(f);
		char hex[65];
		gfs_sha256 *h = gfs_sha256_new();
		gfs_sha256_update(h, data, len);
		gfs_sha256_final(h, hex);
		if (n == len + 64 && memcmp(buf, data, len) == 0 && memcmp(buf + len, hex, 64) == 0)
			snprintf(out, 1024, "%s", p);
		free(buf);
	}
	closedir(dir);
}

static void
write_at(const char *path, const void *data, size_t len, off_t off)
{
	int fd = open(path, O_WRONLY);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, data, len, off), (ssize_t)len);
	close(fd);
}

/* Waits up to 10 s for the writer to prove every entry found at start. */
static void
wait_proven(disktier *t)
{
	struct disktier_stats s;
	for (int i = 0; i < 10000; i++) {
		disktier_stats(t, &s);
		if (s.unproven == 0)
			return;
		nanosleep(&(struct timespec){0, 1000000}, NULL);
	}
	fail_msg("%llu entries still unproven", (unsigned long long)s.unproven);
}

/* A tier in d holding "test" as a's entry (named SHA_A), whose path goes to p. */
static disktier *
tier_with_test(const char *d, gfs_meta **a, char p[1024])
{
	gfs_error err;
	disktier *t = disktier_open(d, 1 << 20, NULL, &err);
	assert_non_null(t);
	*a = meta("a", 4, SHA_A, 1);
	disktier_put(t, *a, "test", 4);
	entry_path(d, "test", 4, p);
	assert_string_not_equal(p, "");
	return t;
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
	char upper[65], p[1024];
	for (int i = 0; i < 65; i++)
		upper[i] = (char)(SHA_A[i] >= 'a' && SHA_A[i] <= 'f' ? SHA_A[i] - 'a' + 'A' : SHA_A[i]);
	gfs_meta *a = meta("one", 4, upper, 1), *b = meta("two", 4, SHA_A, 2);
	disktier_put(t, a, "test", 4);
	entry_path(d, "test", 4, p);
	assert_string_not_equal(p, "");                  /* the body, then its sha256 */
	int fd = disktier_get(t, a, NULL);                /* upper-case hex names the same digest */
	assert_true(fd >= 0);
	close(fd);
	/* Same content, another file: never answered from the first one's entry. */
	assert_false(disktier_has(t, b));
	assert_int_equal(disktier_get(t, b, NULL), -1);
	gfs_meta *bad = meta("../../etc/passwd", 3, "zz", 1);   /* not a sha256: named by identity */
	gfs_meta *again = meta("../../etc/passwd", 3, "zz", 2); /* a new upload of the same id */
	disktier_put(t, bad, "abc", 3);
	assert_true(disktier_has(t, bad));
	assert_false(disktier_has(t, again));
	struct disktier_stats s;
	disktier_stats(t, &s);
	assert_int_equal(s.entries, 2);
	assert_int_equal(s.bytes, 7 + 2 * 64);
	assert_int_equal(s.hits, 1);
	assert_int_equal(s.unproven, 0);                  /* proven as they were written */
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
	char *d = tmpdir(), p[1024];
	gfs_meta *a;
	disktier *t = tier_with_test(d, &a, p);
	assert_int_equal(truncate(p, 2), 0);
	assert_int_equal(disktier_get(t, a, NULL), -1);
	assert_int_equal(access(p, F_OK), -1);            /* discarded */
	assert_false(disktier_has(t, a));
	/* A short fill is never committed. */
	disktier_fill *f = disktier_fill_begin(t, a);
	assert_non_null(f);
	assert_true(disktier_fill_write(f, "te", 2));
	disktier_fill_commit(f);
	assert_int_equal(access(p, F_OK), -1);
	struct disktier_stats s;
	disktier_stats(t, &s);
	assert_int_equal(s.misses, 1);
	assert_int_equal(s.entries, 0);
	gfs_meta_unref(a);
	disktier_close(t);
	rm_rf(d);
	free(d);
}

/*
 * An entry changed on disk, keeping its size, is never served: written to
 * in place (seen by the descriptor a caller keeps too) or replaced by a
 * rename; one replaced by an intact copy is proven again and served.
 */
static void
test_changed_entry_is_proven_again(void **state)
{
	(void)state;
	char *d = tmpdir(), p[1024], copy[1100];
	gfs_meta *a;
	disktier *t = tier_with_test(d, &a, p);
	snprintf(copy, sizeof copy, "%s.copy", p);
	char cmd[2400];
	snprintf(cmd, sizeof cmd, "cp '%s' '%s'", p, copy);
	assert_int_equal(system(cmd), 0);
	char name[DISKTIER_NAME_MAX];
	int kept = disktier_get(t, a, name);
	assert_true(kept >= 0);
	assert_true(disktier_touch(t, name, kept));
	write_at(p, "T", 1, 3);                           /* "tesT": same size, old trailer */
	assert_false(disktier_touch(t, name, kept));
	close(kept);
	assert_int_equal(disktier_get(t, a, NULL), -1);
	assert_int_equal(access(p, F_OK), -1);
	struct disktier_stats s;
	disktier_stats(t, &s);
	assert_int_equal(s.proof_failures, 1);
	/* An intact copy renamed over it: another file, proven before it is served. */
	disktier_put(t, a, "test", 4);
	assert_int_equal(rename(copy, p), 0);
	int fd = disktier_get(t, a, NULL);
	assert_true(fd >= 0);
	/* Written anew while that one is held: the held one is stale, the new one stays proven. */
	disktier_put(t, a, "test", 4);
	assert_false(disktier_touch(t, name, fd));
	close(fd);
	fd = disktier_get(t, a, NULL);
	assert_true(fd >= 0);
	close(fd);
	/* A wrong one renamed over it, its trailer matching what it now holds. */
	FILE *f = fopen(copy, "wb");
	fprintf(f, "tesT%s", SHA_B);
	fclose(f);
	assert_int_equal(rename(copy, p), 0);
	assert_int_equal(disktier_get(t, a, NULL), -1);
	disktier_stats(t, &s);
	assert_int_equal(s.proof_failures, 2);
	assert_int_equal(s.proofs, 3);
	gfs_meta_unref(a);
	disktier_close(t);
	rm_rf(d);
	free(d);
}

/*
 * After a restart every entry is proven before it is served: the writer
 * proves them when idle, a hit on a small one proves it first, a large one
 * is a miss until then. A file whose hash names another content is never
 * answered with that content, even from its own entry.
 */
static void
test_restart_proves_entries(void **state)
{
	(void)state;
	char *d = tmpdir();
	gfs_error err;
	disktier *t = disktier_open(d, 4 << 20, NULL, &err);
	static char big[300 << 10];
	memset(big, 'b', sizeof big);
	gfs_meta *a = meta("a", 4, SHA_A, 1), *c = meta("c", 4, SHA_A, 1), *l = meta("l", sizeof big, NULL, 1);
	gfs_meta *liar = meta("liar", 4, SHA_B, 1);       /* its stored hash is not its content's */
	disktier_put(t, a, "test", 4);
	disktier_put(t, c, "test", 4);
	disktier_put(t, l, big, sizeof big);
	disktier_put(t, liar, "test", 4);
	assert_int_equal(disktier_get(t, liar, NULL), -1);      /* its entry is the other content */
	disktier_close(t);

	char p[1024];
	entry_path(d, big, sizeof big, p);
	write_at(p, "x", 1, 1000);                        /* changed while no server ran */
	t = disktier_open(d, 4 << 20, NULL, &err);
	int fd = disktier_get(t, a, NULL);                /* proven by the hit itself, or the writer */
	assert_true(fd >= 0);
	close(fd);
	wait_proven(t);
	fd = disktier_get(t, c, NULL);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(disktier_get(t, l, NULL), -1);         /* failed its proof: removed */
	assert_int_equal(access(p, F_OK), -1);
	struct disktier_stats s;
	disktier_stats(t, &s);
	assert_int_equal(s.proof_failures, 1);
	assert_int_equal(s.entries, 2);
	/* Written again and reopened: a large entry is a miss until the writer proved it. */
	disktier_put(t, l, big, sizeof big);
	disktier_close(t);
	t = disktier_open(d, 4 << 20, NULL, &err);
	wait_proven(t);
	fd = disktier_get(t, l, NULL);
	assert_true(fd >= 0);
	close(fd);
	gfs_meta_unref(a);
	gfs_meta_unref(c);
	gfs_meta_unref(l);
	gfs_meta_unref(liar);
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
	int fd = disktier_get(t, m[0], NULL);             /* m[0] used: m[1] is the coldest */
	close(fd);
	disktier_put(t, m[2], body, sizeof body);         /* 1.2M > 1M: one must go */
	assert_true(disktier_has(t, m[0]));
	assert_false(disktier_has(t, m[1]));
	assert_true(disktier_has(t, m[2]));
	struct disktier_stats s;
	disktier_stats(t, &s);
	assert_int_equal(s.evictions, 1);
	assert_int_equal(s.bytes, 2 * (sizeof body + 64));
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
	assert_int_equal(s.bytes, 2 * (sizeof body + 64));
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
	t = disktier_open(d, sizeof body + 64, NULL, &err);
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
	char p[1024];
	entry_path(d, "test", 4, p);
	assert_string_not_equal(p, "");
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
	char *d = tmpdir(), p[1024];
	gfs_meta *a;
	disktier *t = tier_with_test(d, &a, p);
	/* An atime older than mtime: relatime would update it on the next read. */
	struct timespec ts[2] = {{.tv_sec = 1000000000, .tv_nsec = 0}, {.tv_nsec = UTIME_OMIT}};
	assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
	int fd = disktier_get(t, a, NULL);
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
		cmocka_unit_test(test_changed_entry_is_proven_again),
		cmocka_unit_test(test_restart_proves_entries),
		cmocka_unit_test(test_lru_by_bytes_and_restart),
		cmocka_unit_test(test_async_fills_are_written_by_close),
		cmocka_unit_test(test_open_fails_on_a_file),
		cmocka_unit_test(test_hits_leave_atime_alone),
	};
	return cmocka_run_group_tests_name("disktier", tests, NULL, NULL);
}
