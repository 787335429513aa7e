#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "inotify_tree.h"
#include "util.h"

#define DIR_MASK (IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CREATE | \
                  IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)

/* One watched directory. */
struct watch {
	int wd;
	char *rel;            /* "" for the root */
	unsigned gen;         /* the last walk that found it */
	struct watch *next;   /* in the same bucket */
};

struct gfs_inotree {
	int fd;
	char *root;
	int root_wd;
	gfs_walk_opts sel;
	bool have_sel;
	/*
	 * The kernel never reuses a watch descriptor number, so a table indexed
	 * by it would grow with every directory ever made: a hash of the live ones.
	 */
	struct watch **bucket;
	size_t nbucket;       /* a power of two */
	size_t n;             /* directories watched */
	unsigned gen;
	/* A path moved away, until the next event tells whether it stayed in the tree. */
	char *moved_rel;
	uint32_t moved_cookie;
	bool moved_is_dir;
	size_t unwatched;     /* directories that could not be watched since the last full walk */
	const char *fatal;    /* why watching cannot go on; NULL while it can */
	gfs_inotree_warn_fn warn;
	void *warn_ctx;
	/* set while reading, for reporting files found in new directories */
	gfs_inotree_fn fn;
	void *fn_ctx;
};

enum { MIN_BUCKETS = 64 };

/*
 * The kernel queues the two halves of a rename one after the other but not
 * atomically: a reader can empty the queue between them (inotify(7)). How
 * long an IN_MOVED_FROM that ends the queue waits for its IN_MOVED_TO before
 * it is taken as a move out of the tree; the halves are queued by one
 * rename(2), so this is only ever waited out for a real move away.
 */
enum { MOVE_PAIR_WAIT_MS = 100 };

static void
warn(gfs_inotree *t, const char *rel, const char *reason)
{
	if (t->warn)
		t->warn(rel, reason, t->warn_ctx);
}

/* ENOSPC from inotify_add_watch is not about disk space: say which limit it is. */
static void
warn_unwatched(gfs_inotree *t, const char *rel, int errnum)
{
	t->unwatched++;
	warn(t, rel, errnum == ENOSPC ? "the limit of inotify watches is reached "
	                                "(sysctl fs.inotify.max_user_watches)"
	                              : strerror(errnum));
}

static size_t
slot(int wd, size_t nbucket)
{
	return ((uint32_t)wd * 2654435761u) & (nbucket - 1);
}

static struct watch *
find_wd(const gfs_inotree *t, int wd)
{
	for (struct watch *w = t->bucket[slot(wd, t->nbucket)]; w; w = w->next)
		if (w->wd == wd)
			return w;
	return NULL;
}

static const char *
rel_of(const gfs_inotree *t, int wd)
{
	struct watch *w = find_wd(t, wd);
	return w ? w->rel : NULL;
}

static void
rehash(gfs_inotree *t, size_t nbucket)
{
	struct watch **b = gfs_xcalloc(nbucket, sizeof *b);
	for (size_t i = 0; i < t->nbucket; i++) {
		struct watch *w, *next;
		for (w = t->bucket[i]; w; w = next) {
			next = w->next;
			size_t k = slot(w->wd, nbucket);
			w->next = b[k];
			b[k] = w;
		}
	}
	free(t->bucket);
	t->bucket = b;
	t->nbucket = nbucket;
}

static void
remember_wd(gfs_inotree *t, int wd, const char *rel)
{
	struct watch *w = find_wd(t, wd);
	if (w) {
		/* the same directory reached under another name: it was moved */
		free(w->rel);
		w->rel = strdup(rel);
		w->gen = t->gen;
		return;
	}
	w = gfs_xcalloc(1, sizeof *w);
	w->wd = wd;
	w->rel = strdup(rel);
	w->gen = t->gen;
	size_t k = slot(wd, t->nbucket);
	w->next = t->bucket[k];
	t->bucket[k] = w;
	if (++t->n > t->nbucket)
		rehash(t, t->nbucket * 2);
}

static void
forget_wd(gfs_inotree *t, int wd)
{
	struct watch **pp = &t->bucket[slot(wd, t->nbucket)];
	while (*pp && (*pp)->wd != wd)
		pp = &(*pp)->next;
	struct watch *w = *pp;
	if (!w)
		return;
	*pp = w->next;
	free(w->rel);
	free(w);
	t->n--;
	/* memory follows the directories watched now, not the most ever watched */
	if (t->nbucket > MIN_BUCKETS && t->n < t->nbucket / 4)
		rehash(t, t->nbucket / 2);
}

/* Whether rel is top or below it. */
static bool
is_under(const char *rel, const char *top)
{
	size_t n = strlen(top);
	return strncmp(rel, top, n) == 0 && (rel[n] == '\0' || rel[n] == '/');
}

struct wd_list {
	int *v;
	size_t n;
};

/* The watches rel and below, or with top NULL those the last walk did not find. */
static struct wd_list
select_wds(const gfs_inotree *t, const char *top)
{
	struct wd_list l = {.v = gfs_xmalloc((t->n + 1) * sizeof *l.v)};
	for (size_t i = 0; i < t->nbucket; i++) {
		for (struct watch *w = t->bucket[i]; w; w = w->next) {
			if (w->wd == t->root_wd)
				continue;
			if (top ? is_under(w->rel, top) : w->gen != t->gen)
				l.v[l.n++] = w->wd;
		}
	}
	return l;
}

/* Removes the watches (collected first: forgetting may rehash). */
static void
drop_wds(gfs_inotree *t, struct wd_list l)
{
	for (size_t i = 0; i < l.n; i++) {
		/* EINVAL when the kernel dropped it already; the table must forget it all the same */
		inotify_rm_watch(t->fd, l.v[i]);
		forget_wd(t, l.v[i]);
	}
	free(l.v);
}

/*
 * A directory that left the tree keeps its watches, and events inside it
 * would be reported under its old name, where a new directory may be now.
 */
static void
drop_tree(gfs_inotree *t, const char *rel)
{
	drop_wds(t, select_wds(t, rel));
}

static char *
join(const char *dir, const char *name)
{
	size_t a = strlen(dir), b = strlen(name);
	char *out = gfs_xmalloc(a + b + 2);
	if (a) {
		memcpy(out, dir, a);
		out[a++] = '/';
	}
	memcpy(out + a, name, b + 1);
	return out;
}

static const char *
base_name(const char *rel)
{
	const char *s = strrchr(rel, '/');
	return s ? s + 1 : rel;
}

static bool
dir_selected(const gfs_inotree *t, const char *rel)
{
	return !t->have_sel || !*rel || gfs_walk_dir_selected(&t->sel, rel, base_name(rel));
}

static bool
file_selected(const gfs_inotree *t, const char *rel)
{
	return !t->have_sel || gfs_walk_file_selected(&t->sel, rel, base_name(rel));
}

static void
emit_move(gfs_inotree *t, enum gfs_inotree_kind kind, const char *from, const char *rel)
{
	if (!t->fn)
		return;
	gfs_inotree_event ev = {.kind = kind, .rel = rel, .from = from};
	t->fn(&ev, t->fn_ctx);
}

static void
emit(gfs_inotree *t, enum gfs_inotree_kind kind, const char *rel)
{
	emit_move(t, kind, NULL, rel);
}

/* Some filesystems (XFS without ftype, network filesystems) leave d_type unknown. */
static unsigned char
type_at(DIR *d, const char *name)
{
	struct stat st;
	if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return DT_UNKNOWN;
	return S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_UNKNOWN;
}

/* Adds a watch on rel and below; reports files found when report is set. */
static void
add_tree(gfs_inotree *t, const char *rel, bool report)
{
	char *path = *rel ? join(t->root, rel) : strdup(t->root);
	int wd = inotify_add_watch(t->fd, path, DIR_MASK);
	if (wd < 0) {
		warn_unwatched(t, rel, errno);
		free(path);
		return;
	}
	remember_wd(t, wd, rel);
	/* Listing after the watch exists: nothing created in between is missed. */
	DIR *d = opendir(path);
	free(path);
	if (!d) {
		warn(t, rel, strerror(errno));
		return;
	}
	struct dirent *de;
	while ((de = readdir(d))) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		char *child = join(rel, de->d_name);
		unsigned char type = de->d_type;
		if (type == DT_UNKNOWN)
			type = type_at(d, de->d_name);
		if (type == DT_DIR) {
			if (dir_selected(t, child))
				add_tree(t, child, report);
		} else if (type == DT_REG && report && file_selected(t, child)) {
			emit(t, GFS_INO_FOUND, child);
		}
		free(child);
	}
	closedir(d);
}

gfs_inotree *
gfs_inotree_open(const char *root, const gfs_walk_opts *sel, gfs_inotree_warn_fn warn_fn,
                 void *warn_ctx, gfs_error *err)
{
	gfs_inotree *t = gfs_xcalloc(1, sizeof *t);
	t->nbucket = MIN_BUCKETS;
	t->bucket = gfs_xcalloc(t->nbucket, sizeof *t->bucket);
	t->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (t->fd < 0) {
		gfs_error_set(err, GFS_ELOCAL, "inotify: %s", strerror(errno));
		free(t->bucket);
		free(t);
		return NULL;
	}
	t->root = strdup(root);
	t->warn = warn_fn;
	t->warn_ctx = warn_ctx;
	if (sel) {
		t->sel = *sel;
		t->have_sel = true;
	}
	/* The root is added here so that failing is an error; add_tree gets the same descriptor back. */
	t->root_wd = inotify_add_watch(t->fd, root, DIR_MASK);
	if (t->root_wd < 0) {
		gfs_error_set(err, GFS_ELOCAL, "%s: %s", root, strerror(errno));
		gfs_inotree_close(t);
		return NULL;
	}
	add_tree(t, "", false);
	return t;
}

void
gfs_inotree_close(gfs_inotree *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->nbucket; i++) {
		struct watch *w, *next;
		for (w = t->bucket[i]; w; w = next) {
			next = w->next;
			free(w->rel);
			free(w);
		}
	}
	free(t->bucket);
	free(t->moved_rel);
	free(t->root);
	close(t->fd);
	free(t);
}

int
gfs_inotree_fd(const gfs_inotree *t)
{
	return t->fd;
}

size_t
gfs_inotree_count(const gfs_inotree *t)
{
	return t->n;
}

size_t
gfs_inotree_unwatched(const gfs_inotree *t)
{
	return t->unwatched;
}

static void
forget_move(gfs_inotree *t)
{
	free(t->moved_rel);
	t->moved_rel = NULL;
	t->moved_cookie = 0;
}

/* No IN_MOVED_TO followed an IN_MOVED_FROM: the path went out of the tree. */
static void
settle_move(gfs_inotree *t)
{
	if (!t->moved_rel)
		return;
	if (t->moved_is_dir) {
		emit(t, GFS_INO_DIR_REMOVED, t->moved_rel);
		drop_tree(t, t->moved_rel);
	} else {
		emit(t, GFS_INO_REMOVED, t->moved_rel);
	}
	forget_move(t);
}

/*
 * Watch the directories there are now (adding a watch twice gives the
 * same descriptor), and stop watching those gone. The root may have been
 * replaced while events were lost: a new directory under the same path
 * gets a new descriptor, and it is the one to watch.
 */
static const char *
rewalk(gfs_inotree *t)
{
	settle_move(t);
	int wd = inotify_add_watch(t->fd, t->root, DIR_MASK);
	if (wd < 0)
		return errno == ENOENT ? "the watched directory was deleted" : strerror(errno);
	if (wd != t->root_wd) {
		inotify_rm_watch(t->fd, t->root_wd);
		forget_wd(t, t->root_wd);
		t->root_wd = wd;
	}
	t->gen++;
	t->unwatched = 0;
	add_tree(t, "", false);
	drop_wds(t, select_wds(t, NULL));
	return NULL;
}

bool
gfs_inotree_rewalk(gfs_inotree *t, gfs_error *err)
{
	const char *why = t->fatal ? t->fatal : rewalk(t);
	if (why) {
		gfs_error_set(err, GFS_ELOCAL, "%s: %s", t->root, why);
		return false;
	}
	return true;
}

void
gfs_inotree_list(gfs_inotree *t, const char *rel, gfs_inotree_fn fn, void *ctx)
{
	/* may be called from within fn, during a read */
	gfs_inotree_fn saved_fn = t->fn;
	void *saved_ctx = t->fn_ctx;
	t->fn = fn;
	t->fn_ctx = ctx;
	add_tree(t, rel, true);
	t->fn = saved_fn;
	t->fn_ctx = saved_ctx;
}

/* Events on the root itself: without it there is nothing left to watch. */
static void
handle_root(gfs_inotree *t, uint32_t mask)
{
	if (mask & IN_DELETE_SELF)
		t->fatal = "the watched directory was deleted";
	else if (mask & IN_MOVE_SELF)
		t->fatal = "the watched directory was moved away";
	else if (mask & IN_UNMOUNT)
		t->fatal = "the watched directory was unmounted";
	else if (mask & IN_IGNORED)
		t->fatal = "the watched directory can no longer be watched";
}

static bool
pairs_move(const gfs_inotree *t, const struct inotify_event *ev, bool is_dir)
{
	return ev->mask & IN_MOVED_TO && t->moved_rel && ev->cookie == t->moved_cookie &&
	       t->moved_is_dir == is_dir;
}

static void
hold_move(gfs_inotree *t, const struct inotify_event *ev, const char *rel, bool is_dir)
{
	t->moved_rel = strdup(rel);
	t->moved_cookie = ev->cookie;
	t->moved_is_dir = is_dir;
}

static void
handle_dir(gfs_inotree *t, const struct inotify_event *ev, const char *rel)
{
	if (pairs_move(t, ev, true)) {
		if (!dir_selected(t, rel)) {
			settle_move(t);
			return;
		}
		/* the watches below keep their descriptors: add_tree renames them, drop_tree the rest */
		add_tree(t, rel, false);
		drop_tree(t, t->moved_rel);
		emit_move(t, GFS_INO_DIR_MOVED, t->moved_rel, rel);
		forget_move(t);
		return;
	}
	if ((ev->mask & (IN_CREATE | IN_MOVED_TO)) && dir_selected(t, rel))
		add_tree(t, rel, true);
	else if (ev->mask & IN_DELETE)
		emit(t, GFS_INO_DIR_REMOVED, rel);
	else if (ev->mask & IN_MOVED_FROM && dir_selected(t, rel))
		hold_move(t, ev, rel, true);
}

static void
handle_file(gfs_inotree *t, const struct inotify_event *ev, const char *rel)
{
	bool selected = file_selected(t, rel);
	if (pairs_move(t, ev, false)) {
		if (!selected) {
			settle_move(t);
			return;
		}
		emit_move(t, GFS_INO_MOVED, t->moved_rel, rel);
		forget_move(t);
		return;
	}
	if (!selected)
		return;
	if (ev->mask & IN_MOVED_FROM)
		hold_move(t, ev, rel, false);
	else if (ev->mask & (IN_CLOSE_WRITE | IN_MOVED_TO))
		emit(t, GFS_INO_CHANGED, rel);
	else if (ev->mask & IN_DELETE)
		emit(t, GFS_INO_REMOVED, rel);
}

static void
handle(gfs_inotree *t, const struct inotify_event *ev)
{
	/* The two halves of a rename are queued one after the other. */
	if (!(ev->mask & IN_MOVED_TO && t->moved_rel && ev->cookie == t->moved_cookie))
		settle_move(t);
	if (ev->mask & IN_Q_OVERFLOW) {
		t->fatal = rewalk(t);
		if (!t->fatal)
			emit(t, GFS_INO_OVERFLOW, "");
		return;
	}
	if (ev->wd == t->root_wd && !ev->len) {
		handle_root(t, ev->mask);
		return;
	}
	if (ev->mask & IN_IGNORED) {
		forget_wd(t, ev->wd);
		return;
	}
	const char *dir = rel_of(t, ev->wd);
	if (!dir || !ev->len)
		return; /* events on the directory itself: its parent reports them */
	char *rel = join(dir, ev->name);
	if (ev->mask & IN_ISDIR)
		handle_dir(t, ev, rel);
	else
		handle_file(t, ev, rel);
	free(rel);
}

/* A move's first half ended the queue: whether more came within the wait. */
static bool
other_half_queued(const gfs_inotree *t)
{
	struct pollfd p = { .fd = t->fd, .events = POLLIN };
	int n;
	do
		n = poll(&p, 1, MOVE_PAIR_WAIT_MS);
	while (n < 0 && errno == EINTR);
	return n > 0;
}

bool
gfs_inotree_read(gfs_inotree *t, gfs_inotree_fn fn, void *ctx, gfs_error *err)
{
	char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
	t->fn = fn;
	t->fn_ctx = ctx;
	bool ok = true;
	while (!t->fatal) {
		ssize_t len = read(t->fd, buf, sizeof buf);
		if (len < 0 && errno == EINTR)
			continue;
		if (len < 0 && errno == EAGAIN) {
			if (t->moved_rel && other_half_queued(t))
				continue;
			break;
		}
		if (len <= 0) {
			gfs_error_set(err, GFS_ELOCAL, "inotify read: %s", len < 0 ? strerror(errno) : "end of file");
			ok = false;
			break;
		}
		for (char *p = buf; p < buf + len && !t->fatal;) {
			const struct inotify_event *ev = (const struct inotify_event *)p;
			handle(t, ev);
			p += sizeof *ev + ev->len;
		}
	}
	/* The queue stayed empty past the wait: a move's first half had no second in the tree. */
	settle_move(t);
	if (ok && t->fatal) {
		gfs_error_set(err, GFS_ELOCAL, "%s: %s", t->root, t->fatal);
		ok = false;
	}
	t->fn = NULL;
	t->fn_ctx = NULL;
	return ok;
}
