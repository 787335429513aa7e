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


/* Gathers the file's start for libmagic as gfs_put reads it (a short read is the last). */
struct typed_source {
	int fd;
	gfs_magic *magic;
	gfs_put_opts *po;
	char *type;
	gfs_sniff sniff;
};

static ssize_t
typed_read(uint8_t *buf, size_t len, void *ctx)
{
	struct typed_source *src = ctx;
	ssize_t r = gfs_source_fd(buf, len, &src->fd);
	const void *head;
	size_t head_len;
	if (r >= 0 && src->magic && !src->po->content_type &&
	    gfs_sniff_add(&src->sniff, buf, (size_t)r, (size_t)r < len, &head, &head_len) &&
	    head_len > 0) {
		src->type = strdup(gfs_magic_type(src->magic, head, head_len));
		src->po->content_type = src->type;
	}
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
		.keep_revisions = o->keep_revisions,
	};
	struct typed_source src = {.fd = fd, .magic = m, .po = &po};
	gfs_file stored;
	bool ok = gfs_put(s, &po, typed_read, &src, &stored, err);
	gfs_sniff_free(&src.sniff);
	free(src.type);
	bson_destroy(&meta);
	if (!ok)
		return false;
	/* Named, the new revision survives even when another writer's clock runs ahead. */
	ok = gfs_delete_old_revisions(s, name, o->keep_revisions, &stored.id, err) &&
	     gfs_put_trimmed(s, &stored.id, err);
	gfs_file_free(&stored);
	return ok;
}

/* True when the file's content hashes to hex (the stored sha256); the file is read from the start. */
static bool
same_content(int fd, const char *hex)
{
	if (strlen(hex) != 64)
		return false;
	uint8_t buf[64 * 1024];
	gfs_sha256 *h = gfs_sha256_new();
	ssize_t r;
	while ((r = gfs_source_fd(buf, sizeof buf, &fd)) > 0)
		gfs_sha256_update(h, buf, (size_t)r);
	char got[65];
	gfs_sha256_final(h, got);
	bool same = r == 0 && strcmp(got, hex) == 0;
	return lseek(fd, 0, SEEK_SET) == 0 && same;
}

/*
 * Whether the stored revision is what is on disk. Size and mtime say so for
 * a file merely found; for a file seen written or moved in they do not
 * (cp -p, rsync -t and tar set the old mtime), so its content decides.
 */
static bool
stored_is_current(const gfs_file *old, const struct stat *st, bool changed, int fd)
{
	if (old->length != st->st_size || old->mtime_ns != gfs_stat_mtime_ns(st))
		return false;
	return !changed || same_content(fd, old->sha256);
}

bool
gfs_watch_sync_file(gfs_session *s, gfs_magic *m, const gfs_watch_opts *o, const char *rel,
                    bool changed, enum gfs_watch_action *act, char **name_out, int64_t *bytes,
                    gfs_error *err)
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
	char *name = gfs_stored_name(o->prefix, rel, strlen(rel), &escaped);
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
	if (have_old && stored_is_current(&old, &st, changed, fd)) {
		*act = GFS_WATCH_UNCHANGED;
		/* an earlier attempt may have stored it and failed before trimming */
		ok = gfs_delete_old_revisions(s, name, o->keep_revisions, &old.id, err);
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
	GFS_GROW(ns->v, ns->n + 1, ns->cap, 16);
	ns->v[ns->n++] = gfs_xstrdup(f->filename);
	return true;
}

bool
gfs_watch_remove(gfs_session *s, const gfs_watch_opts *o, const char *rel, bool is_dir,
                 uint64_t *removed, gfs_error *err)
{
	*removed = 0;
	bool escaped;
	char *name = gfs_stored_name(o->prefix, rel, strlen(rel), &escaped);
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

/* A files document to be renamed: its id and its name. */
struct doc_ref {
	bson_value_t id;
	char *name;
};

struct doc_refs {
	struct doc_ref *v;
	size_t n, cap;
	const char *exact;   /* only this name, else every name listed */
	bool raw;            /* some document keeps raw name bytes, which a rename would not update */
};

static bool
collect_ref(const gfs_file *f, void *ctx)
{
	struct doc_refs *r = ctx;
	if (!f->filename || (r->exact && strcmp(f->filename, r->exact) != 0))
		return true;
	bson_iter_t it;
	if (bson_iter_init(&it, f->doc) && bson_iter_find_descendant(&it, "metadata." GFS_RAWNAME_FIELD, &it))
		r->raw = true;
	GFS_GROW(r->v, r->n + 1, r->cap, 16);
	bson_value_copy(&f->id, &r->v[r->n].id);
	r->v[r->n++].name = strdup(f->filename);
	return true;
}

static void
refs_free(struct doc_refs *r)
{
	for (size_t i = 0; i < r->n; i++) {
		bson_value_destroy(&r->v[i].id);
		free(r->v[i].name);
	}
	free(r->v);
}

/* The documents of name, or with is_dir of every name under the folder name. */
static bool
list_refs(gfs_session *s, const char *name, bool is_dir, struct doc_refs *r, gfs_error *err)
{
	if (!is_dir) {
		r->exact = name;
		return gfs_list(s, name, collect_ref, r, err);
	}
	char *folder = gfs_prefix_normalize(name);
	bool ok = gfs_list(s, folder, collect_ref, r, err);
	free(folder);
	return ok;
}

/*
 * The spec's rename, name by name: one update sets the filename of every
 * revision of a name. (One bulk command of many updates was measured far
 * slower than single updates on FerretDB, and no faster elsewhere.)
 */
static bool
rename_all(gfs_session *s, const struct doc_refs *r, size_t cut, const char *to, gfs_error *err)
{
	bool ok = true;
	for (size_t i = 0; ok && i < r->n; i++) {
		/* listed in filename order: a name's revisions are together */
		if (i && strcmp(r->v[i].name, r->v[i - 1].name) == 0)
			continue;
		bson_t sel = BSON_INITIALIZER, upd = BSON_INITIALIZER, set;
		BSON_APPEND_UTF8(&sel, "filename", r->v[i].name);
		char *name;
		name = gfs_xasprintf("%s%s", to, r->v[i].name + cut);
		BSON_APPEND_DOCUMENT_BEGIN(&upd, "$set", &set);
		BSON_APPEND_UTF8(&set, "filename", name);
		bson_append_document_end(&upd, &set);
		bson_error_t berr;
		ok = mongoc_collection_update_many(s->files, &sel, &upd, NULL, NULL, &berr);
		if (!ok)
			gfs_error_from_bson(err, &berr, "rename");
		free(name);
		bson_destroy(&sel);
		bson_destroy(&upd);
	}
	return ok;
}

static bool
renamed_onto(const struct doc_refs *moved, size_t cut, const char *to, const char *name)
{
	size_t n = strlen(to);
	if (strncmp(name, to, n) != 0)
		return false;
	for (size_t i = 0; i < moved->n; i++)
		if (strcmp(moved->v[i].name + cut, name + n) == 0)
			return true;
	return false;
}

bool
gfs_watch_move(gfs_session *s, const gfs_watch_opts *o, const char *from, const char *to,
               bool is_dir, uint64_t *moved, gfs_error *err)
{
	*moved = 0;
	bool esc_from, esc_to;
	char *old_name = gfs_stored_name(o->prefix, from, strlen(from), &esc_from),
	     *new_name = gfs_stored_name(o->prefix, to, strlen(to), &esc_to);
	struct doc_refs src = {0}, dst = {0};
	bool ok = !esc_from && !esc_to;
	if (!ok)
		gfs_error_set(err, GFS_EINVAL, "%s: a name that is not UTF-8 cannot be renamed", to);
	/* what the target held before: removed once the moved documents carry the name */
	ok = ok && list_refs(s, new_name, is_dir, &dst, err) && list_refs(s, old_name, is_dir, &src, err);
	if (ok && src.raw) {
		gfs_error_set(err, GFS_EINVAL, "%s: keeps raw name bytes that a rename would not update", from);
		ok = false;
	}
	size_t cut = strlen(old_name);
	ok = ok && rename_all(s, &src, cut, new_name, err);
	for (size_t i = 0; ok && i < dst.n; i++) {
		if (!renamed_onto(&src, cut, new_name, dst.v[i].name))
			continue;
		gfs_error derr;
		if (!gfs_delete(s, &dst.v[i].id, &derr) && derr.code != GFS_ENOTFOUND) {
			*err = derr;
			ok = false;
		}
	}
	if (ok)
		*moved = src.n;
	refs_free(&src);
	refs_free(&dst);
	free(old_name);
	free(new_name);
	return ok;
}
