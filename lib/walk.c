/* Walking a directory tree for import: selection rules and the walk itself. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "walk.h"
#include "util.h"

/* ---- globs ----------------------------------------------------------- */

/*
 * Matches the class starting at p ('[') against c. Returns the position
 * after the closing ']' and sets *hit, or NULL when the class is not closed
 * (the '[' is then an ordinary character).
 */
static const char *
match_class(const char *p, unsigned char c, bool *hit)
{
	const char *q = p + 1;
	bool neg = false, found = false, first = true;
	if (*q == '!' || *q == '^') {
		neg = true;
		q++;
	}
	while (*q && (*q != ']' || first)) {
		unsigned char lo = (unsigned char)*q;
		if (*q == '\\' && q[1])
			lo = (unsigned char)*++q;
		q++;
		unsigned char hi = lo;
		if (q[0] == '-' && q[1] && q[1] != ']') {
			q++;
			if (*q == '\\' && q[1])
				q++;
			hi = (unsigned char)*q++;
		}
		if (c >= lo && c <= hi)
			found = true;
		first = false;
	}
	if (*q != ']')
		return NULL;
	*hit = found != neg && c != '/';
	return q + 1;
}

bool
gfs_glob_match(const char *p, const char *s)
{
	while (*p) {
		if (p[0] == '*' && p[1] == '*') {
			const char *q = p + 2;
			while (*q == '*')
				q++;
			/* "**" "/" also matches no directory at all. */
			if (*q == '/' && gfs_glob_match(q + 1, s))
				return true;
			for (const char *t = s;; t++) {
				if (gfs_glob_match(q, t))
					return true;
				if (!*t)
					return false;
			}
		}
		if (*p == '*') {
			for (const char *t = s;; t++) {
				if (gfs_glob_match(p + 1, t))
					return true;
				if (!*t || *t == '/')
					return false;
			}
		}
		if (*p == '?') {
			if (!*s || *s == '/')
				return false;
			p++;
			s++;
			continue;
		}
		if (*p == '[' && *s) {
			bool hit;
			const char *next = match_class(p, (unsigned char)*s, &hit);
			if (next) {
				if (!hit)
					return false;
				p = next;
				s++;
				continue;
			}
		}
		if (*p == '\\' && p[1])
			p++;
		if (*p != *s)
			return false;
		p++;
		s++;
	}
	return *s == '\0';
}

/* ---- selection ------------------------------------------------------- */

bool
gfs_walk_is_hidden(const char *name)
{
	return name[0] == '.';
}

bool
gfs_walk_is_temp(const char *name)
{
	size_t n = strlen(name);
	if (n > 0 && name[n - 1] == '~')
		return true;
	if (n >= 5 && strcmp(name + n - 5, ".part") == 0)
		return true;
	return strncmp(name, ".#", 2) == 0;
}

static bool
pattern_matches(const char *pat, const char *rel, const char *name)
{
	if (!strchr(pat, '/'))
		return gfs_glob_match(pat, name);
	return gfs_glob_match(pat[0] == '/' ? pat + 1 : pat, rel);
}

static bool
excluded(const gfs_walk_opts *o, const char *rel, const char *name)
{
	for (size_t i = 0; i < o->n_exclude; i++)
		if (pattern_matches(o->exclude[i], rel, name))
			return true;
	return false;
}

bool
gfs_walk_dir_selected(const gfs_walk_opts *o, const char *rel, const char *name)
{
	if (!o->hidden && gfs_walk_is_hidden(name))
		return false;
	return !excluded(o, rel, name);
}

bool
gfs_walk_file_selected(const gfs_walk_opts *o, const char *rel, const char *name)
{
	if (!o->hidden && gfs_walk_is_hidden(name))
		return false;
	if (!o->temp && gfs_walk_is_temp(name))
		return false;
	if (excluded(o, rel, name))
		return false;
	if (o->select && !o->select(rel, o->select_ctx))
		return false;
	if (o->n_include == 0)
		return true;
	for (size_t i = 0; i < o->n_include; i++)
		if (pattern_matches(o->include[i], rel, name))
			return true;
	return false;
}

bool
gfs_walk_path_selected(const gfs_walk_opts *o, const char *rel)
{
	char *copy = gfs_xstrdup(rel);
	bool ok = true;
	const char *name = copy;
	for (char *p = copy; ok && *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		ok = gfs_walk_dir_selected(o, copy, name);
		*p = '/';
		name = p + 1;
	}
	if (ok)
		ok = gfs_walk_file_selected(o, rel, name);
	free(copy);
	return ok;
}

/* ---- the walk -------------------------------------------------------- */

struct devino {
	dev_t dev;
	ino_t ino;
};

struct walker {
	const gfs_walk_opts *o;
	gfs_walk_fn fn;
	void *ctx;
	char *path;              /* the relative path being visited */
	size_t len, cap;
	struct devino *stack;    /* the directories enclosing the one being read */
	size_t depth, stack_cap;
	bool stopped;
};

static void
emit_entry(struct walker *w, const gfs_walk_entry *e)
{
	if (w->stopped)
		return;
	if (!w->fn(e, w->ctx))
		w->stopped = true;
}

static void
emit(struct walker *w, enum gfs_walk_kind kind, const struct stat *st, const char *reason)
{
	gfs_walk_entry e = {kind, w->path, w->len, st, reason, false};
	emit_entry(w, &e);
}

/* A symlink that leads nowhere, or back into the tree: reported, but it hides nothing. */
static void
emit_broken(struct walker *w, const char *reason)
{
	gfs_walk_entry e = {GFS_WALK_ERROR, w->path, w->len, NULL, reason, true};
	emit_entry(w, &e);
}

static void
path_push(struct walker *w, const char *name)
{
	size_t n = strlen(name);
	if (w->len + n + 2 > w->cap) {
		w->cap = (w->len + n + 2) * 2;
		w->path = gfs_xreallocarray(w->path, w->cap, 1);
	}
	if (w->len)
		w->path[w->len++] = '/';
	memcpy(w->path + w->len, name, n + 1);
	w->len += n;
}

static bool
is_enclosing(const struct walker *w, const struct stat *st)
{
	for (size_t i = 0; i < w->depth; i++)
		if (w->stack[i].dev == st->st_dev && w->stack[i].ino == st->st_ino)
			return true;
	return false;
}

static void
stack_push(struct walker *w, const struct stat *st)
{
	GFS_GROW(w->stack, w->depth + 1, w->stack_cap, 16);
	w->stack[w->depth].dev = st->st_dev;
	w->stack[w->depth].ino = st->st_ino;
	w->depth++;
}

static int
cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void walk_dir(struct walker *w, int dfd);

static const char *
special_kind(mode_t m)
{
	if (S_ISFIFO(m))
		return "not a regular file (FIFO)";
	if (S_ISSOCK(m))
		return "not a regular file (socket)";
	if (S_ISCHR(m) || S_ISBLK(m))
		return "not a regular file (device)";
	return "not a regular file";
}

static void
visit_dir(struct walker *w, int dfd, const char *name)
{
	char reason[300];
	int flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC | (w->o->follow_symlinks ? 0 : O_NOFOLLOW);
	int cfd = openat(dfd, name, flags);
	struct stat st;
	if (cfd < 0 || fstat(cfd, &st) != 0) {
		snprintf(reason, sizeof reason, "cannot open directory: %s", strerror(errno));
		if (cfd >= 0)
			close(cfd);
		emit(w, GFS_WALK_ERROR, NULL, reason);
		return;
	}
	if (is_enclosing(w, &st)) {
		close(cfd);
		emit_broken(w, "symlink loop: leads back to an enclosing directory");
		return;
	}
	stack_push(w, &st);
	walk_dir(w, cfd);
	w->depth--;
}

static void
visit(struct walker *w, int dfd, const char *name)
{
	char reason[300];
	struct stat st;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
		/* Vanished since readdir, most likely; report it unless it would be skipped anyway. */
		if (gfs_walk_file_selected(w->o, w->path, name)) {
			snprintf(reason, sizeof reason, "cannot stat: %s", strerror(errno));
			emit(w, GFS_WALK_ERROR, NULL, reason);
		}
		return;
	}
	if (S_ISLNK(st.st_mode) && !w->o->follow_symlinks) {
		if (gfs_walk_file_selected(w->o, w->path, name))
			emit(w, GFS_WALK_SYMLINK, &st, "symlink not followed");
		return;
	}
	/* Followed, a link is judged by what it leads to: directory rules or file rules. */
	if (S_ISLNK(st.st_mode) && fstatat(dfd, name, &st, 0) != 0) {
		int saved = errno;
		if (!gfs_walk_file_selected(w->o, w->path, name))
			return;
		if (saved == ELOOP)
			emit_broken(w, "symlink loop");
		else if (saved == ENOENT)
			emit_broken(w, "dangling symlink");
		else
			emit(w, GFS_WALK_ERROR, NULL, strerror(saved));
		return;
	}
	if (S_ISDIR(st.st_mode)) {
		if (gfs_walk_dir_selected(w->o, w->path, name))
			visit_dir(w, dfd, name);
		return;
	}
	if (!gfs_walk_file_selected(w->o, w->path, name))
		return;
	if (S_ISREG(st.st_mode))
		emit(w, GFS_WALK_FILE, &st, NULL);
	else
		emit(w, GFS_WALK_SPECIAL, &st, special_kind(st.st_mode));
}

/* Reads the directory dfd (and takes ownership of it), then visits its entries in order. */
static void
walk_dir(struct walker *w, int dfd)
{
	DIR *d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		emit(w, GFS_WALK_ERROR, NULL, "cannot read directory");
		return;
	}
	char **names = NULL;
	size_t count = 0, cap = 0;
	struct dirent *de;
	errno = 0;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		GFS_GROW(names, count + 1, cap, 64);
		names[count++] = gfs_xstrdup(de->d_name);
		errno = 0;
	}
	if (errno) {
		char reason[300];
		snprintf(reason, sizeof reason, "cannot read directory: %s", strerror(errno));
		emit(w, GFS_WALK_ERROR, NULL, reason);
	}
	if (count > 1)
		qsort(names, count, sizeof *names, cmp_names);
	size_t base = w->len;
	for (size_t i = 0; i < count; i++) {
		if (!w->stopped) {
			path_push(w, names[i]);
			visit(w, dirfd(d), names[i]);
			w->len = base;
			w->path[base] = '\0';
		}
		free(names[i]);
	}
	free(names);
	closedir(d);
}

bool
gfs_walk(const char *root, const gfs_walk_opts *o, gfs_walk_fn fn, void *ctx, gfs_error *err)
{
	int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		gfs_error_set(err, GFS_ELOCAL, "%s: %s", root, strerror(errno));
		if (fd >= 0)
			close(fd);
		return false;
	}
	struct walker w = {.o = o, .fn = fn, .ctx = ctx};
	w.cap = 256;
	w.path = gfs_xcalloc(1, w.cap);
	stack_push(&w, &st);
	walk_dir(&w, fd);
	free(w.path);
	free(w.stack);
	if (w.stopped) {
		gfs_error_set(err, GFS_ECANCELED, "walk stopped");
		return false;
	}
	return true;
}
