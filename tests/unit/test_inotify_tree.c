/* Unit tests for inotify_tree: which directories stay watched, and what is reported, on a real tree. */
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../lib/inotify_tree.h"

struct fixture {
	char top[64];     /* holds root and a place outside the tree */
	char root[96];
	char outside[96];
	gfs_inotree *t;
};

/* What the last reads reported, as "kind rel" lines (as many as fit), and the overflows. */
static char seen[8192];
static int overflows;

static void
record(const gfs_inotree_event *ev, void *ctx)
{
	(void)ctx;
	overflows += ev->kind == GFS_INO_OVERFLOW;
	static const char *names[] = {"changed", "found", "removed", "dir-removed", "overflow",
	                              "moved", "dir-moved"};
	size_t n = strlen(seen);
	if (ev->from)
		snprintf(seen + n, sizeof seen - n, "%s %s -> %s\n", names[ev->kind], ev->from, ev->rel);
	else
		snprintf(seen + n, sizeof seen - n, "%s %s\n", names[ev->kind], ev->rel);
}

static void
path(char *out, size_t size, const char *dir, const char *rel)
{
	snprintf(out, size, "%s/%s", dir, rel);
}

static void
make_dir(const char *dir, const char *rel)
{
	char p[256];
	path(p, sizeof p, dir, rel);
	assert_int_equal(mkdir(p, 0700), 0);
}

static void
write_file(const char *dir, const char *rel)
{
	char p[256];
	path(p, sizeof p, dir, rel);
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "x", 1), 1);
	close(fd);
}

static void
rename_in(const char *from_dir, const char *from, const char *to_dir, const char *to)
{
	char a[256], b[256];
	path(a, sizeof a, from_dir, from);
	path(b, sizeof b, to_dir, to);
	assert_int_equal(rename(a, b), 0);
}

static void
read_events(struct fixture *f)
{
	gfs_error err;
	seen[0] = '\0';
	assert_true(gfs_inotree_read(f->t, record, NULL, &err));
}

/*
 * Reads until count directories are watched: the kernel queues IN_IGNORED
 * when it lets go of a removed directory, which need not be at once.
 */
static void
read_until_count(struct fixture *f, size_t count)
{
	for (int i = 0; i < 100 && gfs_inotree_count(f->t) != count; i++) {
		struct pollfd pfd = {.fd = gfs_inotree_fd(f->t), .events = POLLIN};
		poll(&pfd, 1, 50);
		read_events(f);
	}
	assert_int_equal(gfs_inotree_count(f->t), count);
}

static int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof *f);
	assert_non_null(f);
	snprintf(f->top, sizeof f->top, "/tmp/test_inotify_tree.XXXXXX");
	assert_non_null(mkdtemp(f->top));
	path(f->root, sizeof f->root, f->top, "root");
	path(f->outside, sizeof f->outside, f->top, "outside");
	assert_int_equal(mkdir(f->root, 0700), 0);
	assert_int_equal(mkdir(f->outside, 0700), 0);
	*state = f;
	return 0;
}

static int
remove_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(p);
}

static int
teardown(void **state)
{
	struct fixture *f = *state;
	gfs_inotree_close(f->t);
	nftw(f->top, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
	free(f);
	return 0;
}

static void
open_tree(struct fixture *f)
{
	gfs_error err;
	f->t = gfs_inotree_open(f->root, NULL, NULL, NULL, &err);
	assert_non_null(f->t);
}

/* The table follows the directories there are now, through growth and shrinking. */
static void
test_count_follows_live_directories(void **state)
{
	struct fixture *f = *state;
	open_tree(f);
	assert_int_equal(gfs_inotree_count(f->t), 1);
	for (int round = 0; round < 2; round++) {
		char rel[32];
		for (int i = 0; i < 300; i++) {
			snprintf(rel, sizeof rel, "d%d", i);
			make_dir(f->root, rel);
		}
		read_until_count(f, 301);
		for (int i = 0; i < 300; i++) {
			char p[256];
			snprintf(rel, sizeof rel, "d%d", i);
			path(p, sizeof p, f->root, rel);
			assert_int_equal(rmdir(p), 0);
		}
		read_until_count(f, 1);
	}
	make_dir(f->root, "last");
	read_events(f);
	write_file(f->root, "last/x");
	read_events(f);
	assert_string_equal(seen, "changed last/x\n");
}

/* Events in a directory moved out must not be reported under its old name. */
static void
test_moved_out_directory_is_forgotten(void **state)
{
	struct fixture *f = *state;
	make_dir(f->root, "a");
	make_dir(f->root, "a/b");
	open_tree(f);
	assert_int_equal(gfs_inotree_count(f->t), 3);

	rename_in(f->root, "a", f->outside, "a");
	read_events(f);
	assert_string_equal(seen, "dir-removed a\n");
	assert_int_equal(gfs_inotree_count(f->t), 1);

	make_dir(f->root, "a");
	read_events(f);
	write_file(f->outside, "a/b/x");
	write_file(f->root, "a/y");
	read_events(f);
	assert_string_equal(seen, "changed a/y\n");
}

/* A directory moved within the tree keeps its watches under the new name. */
static void
test_moved_within_tree_is_renamed(void **state)
{
	struct fixture *f = *state;
	make_dir(f->root, "c");
	make_dir(f->root, "c/d");
	write_file(f->root, "c/d/old");
	open_tree(f);

	rename_in(f->root, "c", f->root, "e");
	read_events(f);
	assert_string_equal(seen, "dir-moved c -> e\n");
	assert_int_equal(gfs_inotree_count(f->t), 3);
	write_file(f->root, "e/d/new");
	read_events(f);
	assert_string_equal(seen, "changed e/d/new\n");

	/* a hidden name is not selected: like moving out */
	gfs_walk_opts sel = {0};
	gfs_inotree_close(f->t);
	gfs_error err;
	f->t = gfs_inotree_open(f->root, &sel, NULL, NULL, &err);
	assert_non_null(f->t);
	rename_in(f->root, "e", f->root, ".e");
	read_events(f);
	assert_string_equal(seen, "dir-removed e\n");
	assert_int_equal(gfs_inotree_count(f->t), 1);
}

/* A file renamed within the tree is one move; renamed to a name not selected, a removal. */
static void
test_file_renames(void **state)
{
	struct fixture *f = *state;
	make_dir(f->root, "a");
	write_file(f->root, "a/x");
	write_file(f->root, ".tmp");
	gfs_walk_opts sel = {0};
	gfs_error err;
	f->t = gfs_inotree_open(f->root, &sel, NULL, NULL, &err);
	assert_non_null(f->t);
	rename_in(f->root, "a/x", f->root, "y");
	read_events(f);
	assert_string_equal(seen, "moved a/x -> y\n");
	rename_in(f->root, "y", f->root, ".y");
	read_events(f);
	assert_string_equal(seen, "removed y\n");
	rename_in(f->root, ".tmp", f->root, "a/saved");
	read_events(f);
	assert_string_equal(seen, "changed a/saved\n");
	rename_in(f->root, "a/saved", f->outside, "saved");
	read_events(f);
	assert_string_equal(seen, "removed a/saved\n");
}

static size_t moves, other_events;

static void
count_kinds(const gfs_inotree_event *ev, void *ctx)
{
	(void)ctx;
	if (ev->kind == GFS_INO_MOVED)
		moves++;
	else
		other_events++;
}

/*
 * Renames read while they are being made: the kernel can let the queue be
 * read between the two halves of one, and it is still one move.
 */
static void
test_renames_read_while_made_stay_moves(void **state)
{
	struct fixture *f = *state;
	enum { N = 2000 };
	char name[32], moved[32];
	for (int i = 0; i < N; i++) {
		snprintf(name, sizeof name, "%d", i);
		write_file(f->root, name);
	}
	open_tree(f);
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		for (int i = 0; i < N; i++) {
			snprintf(name, sizeof name, "%d", i);
			snprintf(moved, sizeof moved, "%d.moved", i);
			rename_in(f->root, name, f->root, moved);
		}
		_exit(0);
	}
	moves = other_events = 0;
	gfs_error err;
	while (moves + other_events < N) {
		struct pollfd pfd = {.fd = gfs_inotree_fd(f->t), .events = POLLIN};
		assert_true(poll(&pfd, 1, 10000) > 0);
		assert_true(gfs_inotree_read(f->t, count_kinds, NULL, &err));
	}
	int status;
	assert_int_equal(waitpid(child, &status, 0), child);
	assert_int_equal(status, 0);
	assert_int_equal(other_events, 0);
	assert_int_equal(moves, N);
}

/* The root replaced while events were lost: the new directory is the one watched. */
static void
test_root_replaced_during_overflow(void **state)
{
	struct fixture *f = *state;
	open_tree(f);
	FILE *q = fopen("/proc/sys/fs/inotify/max_queued_events", "r");
	assert_non_null(q);
	int limit = 0;
	assert_int_equal(fscanf(q, "%d", &limit), 1);
	fclose(q);
	/* two names in turn: the kernel merges an event identical to the one before */
	for (int i = 0; i < limit + 10; i++)
		write_file(f->root, i % 2 ? "a" : "b");
	char away[128];
	path(away, sizeof away, f->outside, "old-root");
	assert_int_equal(rename(f->root, away), 0);
	assert_int_equal(mkdir(f->root, 0700), 0);
	make_dir(f->root, "sub");
	overflows = 0;
	read_events(f);
	assert_int_equal(overflows, 1);
	assert_int_equal(gfs_inotree_count(f->t), 2);
	write_file(f->root, "sub/new");
	write_file(away, "a");
	read_events(f);
	assert_string_equal(seen, "changed sub/new\n");
}

static void
test_root_removed_is_an_error(void **state)
{
	struct fixture *f = *state;
	open_tree(f);
	assert_int_equal(rmdir(f->root), 0);
	gfs_error err;
	seen[0] = '\0';
	assert_false(gfs_inotree_read(f->t, record, NULL, &err));
	assert_non_null(strstr(err.msg, "was deleted"));
	assert_false(gfs_inotree_read(f->t, record, NULL, &err));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_count_follows_live_directories, setup, teardown),
		cmocka_unit_test_setup_teardown(test_moved_out_directory_is_forgotten, setup, teardown),
		cmocka_unit_test_setup_teardown(test_moved_within_tree_is_renamed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_file_renames, setup, teardown),
		cmocka_unit_test_setup_teardown(test_renames_read_while_made_stay_moves, setup, teardown),
		cmocka_unit_test_setup_teardown(test_root_replaced_during_overflow, setup, teardown),
		cmocka_unit_test_setup_teardown(test_root_removed_is_an_error, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
