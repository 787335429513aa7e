#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "names.h"
#include "watch.h"

const char *
gfs_watch_action_name(enum gfs_watch_action a)
{
	switch (a) {
	case GFS_WATCH_NOTHING: return "ignored";
	case GFS_WATCH_UNCHANGED: return "unchanged";
	case GFS_WATCH_UPLOADED: return "uploaded";
	case GFS_WATCH_REPLACED: return "replaced";
	case GFS_WATCH_VANISHED: return "vanished";
	}
	return "unknown";
}

/* The stored name of rel, and whether its bytes had to be escaped. */
static char *
stored_name(const gfs_watch_opts *o, const char *rel, bool *escaped)
{
	char *utf8 = gfs_name_from_bytes(rel, strlen(rel), escaped);
	char *name = gfs_prefix_join(o->prefix, utf8);
	free(utf8);
	return name;
}

static int64_t
mtime_ns(const struct stat *st)
{
	return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

/* Reads the first block for libmagic, then hands the data on to gfs_put. */
struct typed_source {
	int fd;
	gfs_magic *magic;
	gfs_put_opts *po;
	char *type;
	bool sniffed;
};

static ssize_t
typed_read(uint8_t *buf, size_t len, void *ctx)
{
	struct typed_source *src = ctx;
	ssize_t r = gfs_source_fd(buf, len, &src->fd);
	if (r > 0 && !src->sniffed && src->magic && !src->po->content_type) {
		src->type = strdup(gfs_magic_type(src->magic, buf, (size_t)r));
		src->po->content_type = src->type;
	}
	src->sniffed = true;
	return r;
}

static int
open_selected(const gfs_watch_opts *o, const char *rel, struct stat *st)
{
	int dfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -1;
	int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (o->walk.follow_symlinks ? 0 : O_NOFOLLOW);
	int fd = openat(dfd, rel, flags);
	int saved = errno;
	close(dfd);
	errno = saved;
	if (fd < 0)
		return -1;
	if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode)) {
		close(fd);
		errno = EINVAL;
		return -1;
	}
	return fd;
}

static bool
upload(gfs_session *s, gfs_magic *m, const gfs_watch_opts *o, const char *rel, const char *name,
       bool escaped, int fd, const struct stat *st, gfs_error *err)
{
	bson_t meta = BSON_INITIALIZER;
	gfs_metadata_from_stat(&meta, st);
	if (escaped)
		BSON_APPEND_BINARY(&meta, GFS_RAWNAME_FIELD, BSON_SUBTYPE_BINARY, (const uint8_t *)rel,
		                   (uint32_t)strlen(rel));
	gfs_put_opts po = {
		.filename = name,
		.content_type = o->content_type,
		.metadata = &meta,
		.chunk_size = o->chunk_size,
	};
	struct typed_source src = {.fd = fd, .magic = m, .po = &po};
	gfs_file stored;
	bool ok = gfs_put(s, &po, typed_read, &src, &stored, err);
	free(src.type);
	bson_destroy(&meta);
	if (!ok)
		return false;
	/* Named, the new revision survives even when another writer's clock runs ahead. */
	ok = gfs_delete_old_revisions(s, name, o->keep_revisions, &stored.id, err);
	gfs_file_free(&stored);
	return ok;
}

bool
gfs_watch_sync_file(gfs_session *s, gfs_magic *m, const gfs_watch_opts *o, const char *rel,
                    enum gfs_watch_action *act, char **name_out, int64_t *bytes, gfs_error *err)
{
	*act = GFS_WATCH_NOTHING;
	*name_out = NULL;
	*bytes = 0;
	struct stat st;
	int fd = open_selected(o, rel, &st);
	if (fd < 0) {
		if (errno == ENOENT)
			*act = GFS_WATCH_VANISHED;
		else if (errno != EINVAL && errno != ELOOP) {
			gfs_error_set(err, GFS_ELOCAL, "%s: %s", rel, strerror(errno));
			return false;
		}
		return true;
	}
	/* Reads must block; O_NONBLOCK was only there so that opening a FIFO cannot hang. */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);

	bool escaped;
	char *name = stored_name(o, rel, &escaped);
	gfs_file old;
	gfs_error ferr;
	bool have_old = gfs_find_by_name(s, name, -1, &old, &ferr);
	if (!have_old && ferr.code != GFS_ENOTFOUND) {
		*err = ferr;
		free(name);
		close(fd);
		return false;
	}
	bool ok = true;
	if (have_old && old.length == st.st_size && old.mtime_ns == mtime_ns(&st)) {
		*act = GFS_WATCH_UNCHANGED;
	} else {
		ok = upload(s, m, o, rel, name, escaped, fd, &st, err);
		*act = have_old ? GFS_WATCH_REPLACED : GFS_WATCH_UPLOADED;
		*bytes = st.st_size;
	}
	if (have_old)
		gfs_file_free(&old);
	close(fd);
	*name_out = name;
	return ok;
}

static bool
remove_name(gfs_session *s, const char *name, uint64_t *removed, gfs_error *err)
{
	gfs_file f;
	while (gfs_find_by_name(s, name, -1, &f, err)) {
		bool ok = gfs_delete(s, &f.id, err);
		gfs_file_free(&f);
		if (!ok && err->code != GFS_ENOTFOUND)
			return false;
		(*removed)++;
	}
	return err->code == GFS_ENOTFOUND;
}

struct names {
	char **v;
	size_t n, cap;
};

static bool
collect_name(const gfs_file *f, void *ctx)
{
	struct names *ns = ctx;
	if (!f->filename)
		return true;
	if (ns->n && strcmp(ns->v[ns->n - 1], f->filename) == 0)
		return true;
	if (ns->n == ns->cap) {
		ns->cap = ns->cap ? ns->cap * 2 : 16;
		ns->v = realloc(ns->v, ns->cap * sizeof *ns->v);
		if (!ns->v)
			abort();
	}
	ns->v[ns->n++] = strdup(f->filename);
	return true;
}

bool
gfs_watch_remove(gfs_session *s, const gfs_watch_opts *o, const char *rel, bool is_dir,
                 uint64_t *removed, gfs_error *err)
{
	*removed = 0;
	bool escaped;
	char *name = stored_name(o, rel, &escaped);
	if (!is_dir) {
		bool ok = remove_name(s, name, removed, err);
		free(name);
		return ok;
	}
	char *folder = gfs_prefix_normalize(name);
	free(name);
	struct names ns = {0};
	bool ok = gfs_list(s, folder, collect_name, &ns, err);
	free(folder);
	for (size_t i = 0; i < ns.n; i++) {
		if (ok)
			ok = remove_name(s, ns.v[i], removed, err);
		free(ns.v[i]);
	}
	free(ns.v);
	return ok;
}
