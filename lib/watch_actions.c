#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "filename.h"
#include "watch_actions.h"

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

/*
 * Removals and renames cost what the user asked for: a single file is
 * found by filename equality (its revisions), removed by _id and files_id
 * equality; a folder is one range query on fs.files per event. Renames
 * are the spec's (filename updated, no chunk written), one update per
 * name in one ordered bulk write.
 */

/* A files document to be renamed or removed: its id and its name. */
struct doc_ref {
	bson_value_t id;
	char *name;
	bool raw;            /* keeps raw name bytes, which a rename would not update */
};

struct doc_refs {
	struct doc_ref *v;
	size_t n, cap;
	bool raw;            /* one of them keeps raw name bytes */
};

static void
refs_add(struct doc_refs *r, const bson_t *doc)
{
	bson_iter_t it, nit;
	if (!bson_iter_init_find(&it, doc, "_id") || !bson_iter_init_find(&nit, doc, "filename") ||
	    !BSON_ITER_HOLDS_UTF8(&nit))
		return;
	GFS_GROW(r->v, r->n + 1, r->cap, 16);
	bson_value_copy(bson_iter_value(&it), &r->v[r->n].id);
	r->v[r->n].name = gfs_xstrdup(bson_iter_utf8(&nit, NULL));
	r->v[r->n].raw = bson_iter_init(&it, doc) &&
	                 bson_iter_find_descendant(&it, "metadata." GFS_RAWNAME_FIELD, &it);
	r->raw |= r->v[r->n++].raw;
}

static void
refs_free(struct doc_refs *r)
{
	for (size_t i = 0; i < r->n; i++) {
		bson_value_destroy(&r->v[i].id);
		free(r->v[i].name);
	}
	free(r->v);
	*r = (struct doc_refs){0};
}

/* Adds the documents matching filter, in filename then uploadDate order. */
static bool
find_refs(gfs_session *s, const bson_t *filter, struct doc_refs *r, gfs_error *err)
{
	bson_t opts = BSON_INITIALIZER, sort, proj;
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &sort);
	BSON_APPEND_INT32(&sort, "filename", 1);
	BSON_APPEND_INT32(&sort, "uploadDate", 1);
	BSON_APPEND_INT32(&sort, "_id", 1);
	bson_append_document_end(&opts, &sort);
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "projection", &proj);
	BSON_APPEND_INT32(&proj, "filename", 1);
	BSON_APPEND_INT32(&proj, "metadata." GFS_RAWNAME_FIELD, 1);
	bson_append_document_end(&opts, &proj);
	/* What watch renames and removes: decided from the primary, where its writes go. */
	mongoc_cursor_t *cur = gfs_primary_find(s->files, filter, &opts);
	bson_destroy(&opts);
	const bson_t *doc;
	while (mongoc_cursor_next(cur, &doc))
		refs_add(r, doc);
	return gfs_cursor_done(cur, "find files by name", err);
}

/* Every revision of name, by filename equality. */
static bool
name_refs(gfs_session *s, const char *name, struct doc_refs *r, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&filter, "filename", name);
	bool ok = find_refs(s, &filter, r, err);
	bson_destroy(&filter);
	return ok;
}

/* Every document under the folders a and (unless NULL) b, in one range query. */
static bool
folder_refs(gfs_session *s, const char *a, const char *b, struct doc_refs *r, gfs_error *err)
{
	bson_t filter = BSON_INITIALIZER, or, one;
	const char *folders[] = {a, b};
	BSON_APPEND_ARRAY_BEGIN(&filter, "$or", &or);
	for (size_t i = 0; i < 2 && folders[i]; i++) {
		char key[16];
		snprintf(key, sizeof key, "%zu", i);
		char *folder = gfs_prefix_normalize(folders[i]);
		BSON_APPEND_DOCUMENT_BEGIN(&or, key, &one);
		gfs_prefix_filter(&one, folder);
		bson_append_document_end(&or, &one);
		free(folder);
	}
	bson_append_array_end(&filter, &or);
	bool ok = find_refs(s, &filter, r, err);
	bson_destroy(&filter);
	return ok;
}

/* Removes the documents of r (all of them, or those named under the folder `under`). */
static bool
remove_refs(gfs_session *s, const struct doc_refs *r, const char *under, uint64_t *removed,
            gfs_error *err)
{
	bson_value_t *ids = gfs_xreallocarray(NULL, r->n + 1, sizeof *ids);
	size_t n = 0, cut = under ? strlen(under) : 0;
	for (size_t i = 0; i < r->n; i++)
		if (!under || strncmp(r->v[i].name, under, cut) == 0)
			ids[n++] = r->v[i].id;
	int64_t files = 0;
	bool ok = gfs_delete_many(s, ids, n, NULL, &files, err);
	free(ids);
	if (removed)
		*removed += (uint64_t)files;
	return ok;
}

bool
gfs_watch_remove(gfs_session *s, const gfs_watch_opts *o, const char *rel, bool is_dir,
                 uint64_t *removed, gfs_error *err)
{
	*removed = 0;
	if (!is_dir) {
		gfs_watch_op op = {.rel = rel};
		bool ok = gfs_watch_apply(s, o, &op, 1, err);
		*removed = op.files;
		return ok;
	}
	bool escaped;
	char *name = gfs_stored_name(o->prefix, rel, strlen(rel), &escaped);
	struct doc_refs r = {0};
	bool ok = folder_refs(s, name, NULL, &r, err) && remove_refs(s, &r, NULL, removed, err);
	refs_free(&r);
	free(name);
	return ok;
}

/* Queues the rename of every revision of from to to (one update by filename equality). */
static bool
bulk_rename(mongoc_bulk_operation_t *bulk, const char *from, const char *to, gfs_error *err)
{
	bson_t sel = BSON_INITIALIZER, upd = BSON_INITIALIZER, set;
	BSON_APPEND_UTF8(&sel, "filename", from);
	BSON_APPEND_DOCUMENT_BEGIN(&upd, "$set", &set);
	BSON_APPEND_UTF8(&set, "filename", to);
	bson_append_document_end(&upd, &set);
	bson_error_t berr;
	bool ok = mongoc_bulk_operation_update_many_with_opts(bulk, &sel, &upd, NULL, &berr);
	if (!ok)
		gfs_error_from_bson(err, &berr, "rename");
	bson_destroy(&sel);
	bson_destroy(&upd);
	return ok;
}

static mongoc_bulk_operation_t *
new_bulk(gfs_session *s)
{
	bson_t opts = BSON_INITIALIZER;
	BSON_APPEND_BOOL(&opts, "ordered", true);
	mongoc_bulk_operation_t *bulk = mongoc_collection_create_bulk_operation_with_opts(s->files, &opts);
	bson_destroy(&opts);
	return bulk;
}

static bool
run_bulk(mongoc_bulk_operation_t *bulk, size_t n, gfs_error *err)
{
	if (n == 0) {
		mongoc_bulk_operation_destroy(bulk);
		return true;
	}
	bson_t reply;
	bson_error_t berr;
	bool ok = mongoc_bulk_operation_execute(bulk, &reply, &berr) != 0;
	if (!ok)
		gfs_error_from_bson(err, &berr, "rename");
	bson_destroy(&reply);
	mongoc_bulk_operation_destroy(bulk);
	return ok;
}

/*
 * One op of a batch: its documents found by equality, its rename queued
 * in bulk; gone gathers what the batch removes once the renames are done.
 */
static bool
plan_op(gfs_session *s, const gfs_watch_opts *o, gfs_watch_op *op, mongoc_bulk_operation_t *bulk,
        size_t *nupdates, struct doc_refs *gone, gfs_error *err)
{
	bool escaped;
	char *to = gfs_stored_name(o->prefix, op->rel, strlen(op->rel), &escaped);
	bool ok = true;
	if (!op->from) {
		size_t before = gone->n;
		ok = name_refs(s, to, gone, err);
		op->files = gone->n - before;
		free(to);
		return ok;
	}
	bool esc_from;
	char *from = gfs_stored_name(o->prefix, op->from, strlen(op->from), &esc_from);
	struct doc_refs src = {0};
	op->by_copy = escaped || esc_from;
	if (!op->by_copy && (ok = name_refs(s, from, &src, err)))
		op->by_copy = src.raw || src.n == 0;
	if (ok && !op->by_copy) {
		/* what the target held goes once the moved documents carry its name */
		ok = name_refs(s, to, gone, err) && bulk_rename(bulk, from, to, err);
		op->files = src.n;
		(*nupdates)++;
	}
	refs_free(&src);
	free(from);
	free(to);
	return ok;
}

bool
gfs_watch_apply(gfs_session *s, const gfs_watch_opts *o, gfs_watch_op *ops, size_t n, gfs_error *err)
{
	mongoc_bulk_operation_t *bulk = new_bulk(s);
	struct doc_refs gone = {0};
	size_t nupdates = 0;
	bool ok = true;
	for (size_t i = 0; ok && i < n; i++) {
		ops[i].files = 0;
		ops[i].by_copy = false;
		ok = plan_op(s, o, &ops[i], bulk, &nupdates, &gone, err);
	}
	if (ok)
		ok = run_bulk(bulk, nupdates, err);
	else
		mongoc_bulk_operation_destroy(bulk);
	ok = ok && remove_refs(s, &gone, NULL, NULL, err);
	refs_free(&gone);
	return ok;
}

/* The renames of a folder move, by name, in one ordered bulk write. */
static bool
rename_folder(gfs_session *s, const struct doc_refs *src, size_t cut, const char *to, gfs_error *err)
{
	mongoc_bulk_operation_t *bulk = new_bulk(s);
	size_t n = 0;
	bool ok = true;
	for (size_t i = 0; ok && i < src->n; i++) {
		/* listed in filename order: a name's revisions are together */
		if (i && strcmp(src->v[i].name, src->v[i - 1].name) == 0)
			continue;
		char *name = gfs_xasprintf("%s%s", to, src->v[i].name + cut);
		ok = bulk_rename(bulk, src->v[i].name, name, err);
		free(name);
		n++;
	}
	if (!ok) {
		mongoc_bulk_operation_destroy(bulk);
		return false;
	}
	return run_bulk(bulk, n, err);
}

/* Whether name (under the folder to) is where one of src's names lands. */
static bool
renamed_onto(const struct doc_refs *src, size_t cut, const char *to, const char *name)
{
	size_t n = strlen(to);
	if (strncmp(name, to, n) != 0)
		return false;
	for (size_t i = 0; i < src->n; i++)
		if (strcmp(src->v[i].name + cut, name + n) == 0)
			return true;
	return false;
}

/* A folder move: one range query over both folders, one bulk of renames, one removal. */
static bool
move_folder(gfs_session *s, const char *old_name, const char *new_name, uint64_t *moved, gfs_error *err)
{
	char *from = gfs_prefix_normalize(old_name), *to = gfs_prefix_normalize(new_name);
	struct doc_refs all = {0}, src = {0}, gone = {0};
	bool ok = folder_refs(s, old_name, new_name, &all, err);
	size_t cut = strlen(from);
	/* split: what moves, and what the target held that a moved name lands on */
	for (size_t i = 0; ok && i < all.n; i++) {
		struct doc_refs *into = strncmp(all.v[i].name, from, cut) == 0 ? &src : &gone;
		GFS_GROW(into->v, into->n + 1, into->cap, 16);
		into->raw |= all.v[i].raw;
		into->v[into->n++] = all.v[i];
	}
	free(all.v);
	size_t keep = 0;
	for (size_t i = 0; i < gone.n; i++) {
		if (renamed_onto(&src, cut, to, gone.v[i].name)) {
			gone.v[keep++] = gone.v[i];
			continue;
		}
		bson_value_destroy(&gone.v[i].id);
		free(gone.v[i].name);
	}
	gone.n = keep;
	if (ok && src.raw) {
		gfs_error_set(err, GFS_EINVAL, "%s: keeps raw name bytes that a rename would not update", old_name);
		ok = false;
	}
	ok = ok && rename_folder(s, &src, cut, to, err) && remove_refs(s, &gone, NULL, NULL, err);
	if (ok)
		*moved = src.n;
	refs_free(&src);
	refs_free(&gone);
	free(from);
	free(to);
	return ok;
}

bool
gfs_watch_move(gfs_session *s, const gfs_watch_opts *o, const char *from, const char *to,
               bool is_dir, uint64_t *moved, gfs_error *err)
{
	*moved = 0;
	if (!is_dir) {
		gfs_watch_op op = {.from = from, .rel = to};
		bool ok = gfs_watch_apply(s, o, &op, 1, err);
		*moved = op.files;   /* 0 with by_copy */
		return ok;
	}
	bool esc_from, esc_to;
	char *old_name = gfs_stored_name(o->prefix, from, strlen(from), &esc_from),
	     *new_name = gfs_stored_name(o->prefix, to, strlen(to), &esc_to);
	bool ok = !esc_from && !esc_to;
	if (!ok)
		gfs_error_set(err, GFS_EINVAL, "%s: a name that is not UTF-8 cannot be renamed", to);
	ok = ok && move_folder(s, old_name, new_name, moved, err);
	free(old_name);
	free(new_name);
	return ok;
}
