/*
 * verify's comparison with a disk tree and its repairs (verify_disk.h).
 *
 * The pass hands over every problem and verdict; a problem comes just
 * before the verdict on its file, an orphan's with none, so the problems
 * kept since the last verdict are that file's. The disk tree is walked
 * as import walks it with its defaults, so that the two agree on what the
 * tree holds, and both sides are matched in sorted order.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "magic.h"
#include "filename.h"
#include "util.h"
#include "verify_disk.h"
#include "walk.h"

/* What the comparison with disk and the repairs need to know of a checked file. */
struct rec {
	char *name;
	int64_t upload_date;
	bson_value_t id;
	int64_t length;
	char sha256[65];          /* content hash, "" when not all chunks were read */
	char *content_type;
	bool intact, verified, data_whole;
	bool latest;              /* the newest revision of its name */
	bool replaced;            /* re-uploaded from disk: the damaged revision may go */
	bool removed;             /* ...and it has gone (a file may have several problems) */
	bool disk_same;           /* equal to the disk copy */
};

/* A problem kept for the repair pass. */
struct prob {
	enum gfs_verify_kind kind;
	bson_value_t id;
	bool has_id;
	char *name;
	int tie;                  /* 0 not yet tied to a verdict, 1 tied, -1 no file (orphan, bad doc) */
	struct rec *rec;          /* the file's record, when one was kept */
	bool data_intact;
	bool verified;            /* EXTRA-CHUNK: the stored hash matched */
	int64_t count;            /* ORPHAN-CHUNKS, EXTRA-CHUNK: how many */
	int64_t chunk_count;      /* EXTRA-CHUNK: the chunks the file must have */
	int64_t dups;             /* EXTRA-CHUNK: second copies of an n below chunk_count */
	size_t n_extra;           /* EXTRA-CHUNK: _ids of duplicates, at most GFS_VERIFY_MAX_EXTRA_IDS */
	bson_value_t *extra;
};

struct dfile {
	char *name;       /* the GridFS name it maps to */
	char *path;       /* on disk */
	bool escaped;
	char *rel;        /* relative path bytes, for metadata.rawName */
	size_t rel_len;
	struct stat st;
};

struct gfs_verify_disk {
	gfs_verify_disk_opts o;
	struct rec **recs;
	size_t nrecs, caprecs;
	struct prob *probs;
	size_t nprobs, capprobs, mark;   /* mark: first problem not yet tied to a file */
	struct dfile *files;             /* the disk tree */
	size_t nfiles, capfiles;
	gfs_verify_disk_stats st;
};

static bool
stopped(const gfs_verify_disk *r)
{
	return r->o.stop && atomic_load(r->o.stop) != 0;
}

/* A problem; d: the file on disk it is about, or NULL. */
static void
problem_at(gfs_verify_disk *r, const char *what, const char *name, const bson_value_t *id,
           const char *detail, const struct dfile *d)
{
	gfs_verify_disk_event ev = {.kind = GFS_VD_PROBLEM, .what = what, .name = name, .id = id,
	                            .detail = detail, .rel = d ? d->rel : NULL,
	                            .rel_len = d ? d->rel_len : 0};
	r->o.on_event(&ev, r->o.ctx);
}

static void
problem(gfs_verify_disk *r, const char *what, const char *name, const bson_value_t *id,
        const char *detail)
{
	problem_at(r, what, name, id, detail, NULL);
}

/* A repair event that is a step of another (reupload, before remove-damaged): not counted. */
static void
repair_step(gfs_verify_disk *r, const char *what, const char *name, const bson_value_t *id,
            const char *detail, bool ok)
{
	gfs_verify_disk_event ev = {.kind = GFS_VD_REPAIR, .what = what, .name = name, .id = id,
	                            .detail = detail, .ok = ok};
	r->o.on_event(&ev, r->o.ctx);
}

/* The outcome of one problem's repair: counted, so that repaired + unrepaired = problems. */
static void
repaired(gfs_verify_disk *r, const char *what, const char *name, const bson_value_t *id,
         const char *detail, bool ok)
{
	if (!r->o.dry_run) {
		if (ok)
			r->st.repaired++;
		else
			r->st.unrepaired++;
	}
	repair_step(r, what, name, id, detail, ok);
}

static void
compared(gfs_verify_disk *r, char mark, const char *name)
{
	gfs_verify_disk_event ev = {.kind = GFS_VD_COMPARED, .name = name, .mark = mark};
	r->o.on_event(&ev, r->o.ctx);
}

gfs_verify_disk *
gfs_verify_disk_new(const gfs_verify_disk_opts *o)
{
	gfs_verify_disk *r = gfs_xcalloc(1, sizeof *r);
	r->o = *o;
	return r;
}

const gfs_verify_disk_stats *
gfs_verify_disk_stats_of(const gfs_verify_disk *r)
{
	return &r->st;
}

void
gfs_verify_disk_problem(gfs_verify_disk *r, const gfs_verify_problem *p)
{
	if (p->kind == GFS_VK_IN_PROGRESS)
		return;   /* another process's work: nothing to repair */
	GFS_GROW(r->probs, r->nprobs + 1, r->capprobs, 16);
	struct prob *q = &r->probs[r->nprobs++];
	memset(q, 0, sizeof *q);
	q->kind = p->kind;
	if (p->id) {
		bson_value_copy(p->id, &q->id);
		q->has_id = true;
	}
	q->name = gfs_xstrdup(p->filename);
	q->data_intact = p->data_intact;
	q->verified = p->verified;
	q->count = p->count;
	q->chunk_count = p->chunk_count;
	q->dups = p->dups;
	if (p->n_extra_ids) {
		q->extra = gfs_xcalloc(p->n_extra_ids, sizeof *q->extra);
		for (size_t i = 0; i < p->n_extra_ids; i++)
			bson_value_copy(&p->extra_ids[i], &q->extra[i]);
		q->n_extra = p->n_extra_ids;
	}
	/* A file's problems come just before its verdict; an orphan's never do. */
	if (!p->file)
		q->tie = -1;
}

void
gfs_verify_disk_file(gfs_verify_disk *r, const gfs_verify_file *v)
{
	size_t first = r->mark;
	r->mark = r->nprobs;
	/* Only a disk comparison needs every file. */
	if (!r->o.dir || !v->file->filename)
		return;
	GFS_GROW(r->recs, r->nrecs + 1, r->caprecs, 1024);
	struct rec *rc = gfs_xcalloc(1, sizeof *rc);
	r->recs[r->nrecs++] = rc;
	for (size_t i = first; i < r->nprobs; i++)
		if (r->probs[i].tie == 0)
			r->probs[i].rec = rc;
	rc->name = gfs_xstrdup(v->file->filename);
	rc->upload_date = v->file->upload_date;
	bson_value_copy(&v->file->id, &rc->id);
	rc->length = v->file->length;
	memcpy(rc->sha256, v->sha256, sizeof rc->sha256);
	rc->content_type = gfs_xstrdup(v->file->content_type);
	rc->intact = v->intact;
	rc->verified = v->verified;
	rc->data_whole = v->data_whole;
}

struct walk_ctx {
	gfs_verify_disk *r;
	const char *root;
	const char *prefix;
};

/* The walk import does with its defaults, so that the two agree on what the tree holds. */
static bool
walk_one(const gfs_walk_entry *e, void *ctx)
{
	struct walk_ctx *w = ctx;
	gfs_verify_disk *r = w->r;
	if (e->kind == GFS_WALK_ERROR) {
		r->st.problems++;
		problem(r, "DISK-ERROR", e->rel, NULL, e->reason ? e->reason : "cannot read");
		/* Every problem gets a repair result, or one fix would make the whole run succeed. */
		if (r->o.repair)
			repaired(r, "none", e->rel, NULL, "cannot be read on disk; left as it is", false);
		return !stopped(r);
	}
	if (e->kind != GFS_WALK_FILE)
		return !stopped(r);
	if (r->o.select && !r->o.select(e->rel, r->o.ctx))
		return !stopped(r);
	GFS_GROW(r->files, r->nfiles + 1, r->capfiles, 1024);
	struct dfile *d = &r->files[r->nfiles++];
	d->rel_len = e->rel_len;
	d->rel = gfs_xmalloc(e->rel_len + 1);
	memcpy(d->rel, e->rel, e->rel_len + 1);
	d->name = gfs_stored_name(w->prefix, e->rel, e->rel_len, &d->escaped);
	d->path = bson_strdup_printf("%s/%s", w->root, e->rel);
	d->st = *e->st;
	return !stopped(r);
}

static int
cmp_dfile(const void *a, const void *b)
{
	return strcmp(((const struct dfile *)a)->name, ((const struct dfile *)b)->name);
}

/* Newest revision first within a name. */
static int
cmp_rec(const void *a, const void *b)
{
	const struct rec *x = *(struct rec *const *)a, *y = *(struct rec *const *)b;
	int c = strcmp(x->name, y->name);
	if (c)
		return c;
	return x->upload_date > y->upload_date ? -1 : x->upload_date < y->upload_date;
}

static bool
hash_disk(const char *path, char hex[65])
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	gfs_sha256 *h = gfs_sha256_new();
	static uint8_t buf[256 * 1024];
	ssize_t n;
	while ((n = read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
		if (n > 0)
			gfs_sha256_update(h, buf, (size_t)n);
	int saved = errno;
	close(fd);
	gfs_sha256_final(h, hex);
	errno = saved;
	return n == 0;
}

/* Uploads a disk file under its name with the metadata import stores. */
static bool
upload(gfs_session *s, const struct dfile *d, const char *content_type, gfs_error *err)
{
	int fd = open(d->path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		gfs_error_set(err, GFS_ELOCAL, "%s: %s", d->path, strerror(errno));
		return false;
	}
	/* A new file gets its type as import would give it; a replacement keeps the old one. */
	char *sniffed = NULL;
	if (!content_type) {
		uint8_t head[4096];
		ssize_t n = pread(fd, head, sizeof head, 0);
		gfs_error merr;
		gfs_magic *m = gfs_magic_open(&merr);
		if (m && n >= 0)
			sniffed = gfs_xstrdup(gfs_magic_type(m, head, (size_t)n));
		gfs_magic_close(m);
		content_type = sniffed;
	}
	struct stat st;
	if (fstat(fd, &st) != 0) {
		gfs_error_set(err, GFS_ELOCAL, "%s: %s", d->path, strerror(errno));
		close(fd);
		free(sniffed);
		return false;
	}
	bson_t meta = BSON_INITIALIZER;
	gfs_metadata_from_stat(&meta, &st);
	if (d->escaped)
		BSON_APPEND_BINARY(&meta, GFS_RAWNAME_FIELD, BSON_SUBTYPE_BINARY,
		                (const uint8_t *)d->rel, (uint32_t)d->rel_len);
	gfs_put_opts po = {.filename = d->name, .content_type = content_type, .metadata = &meta};
	bool ok = gfs_put(s, &po, gfs_source_fd, &fd, NULL, err);
	close(fd);
	bson_destroy(&meta);
	free(sniffed);
	return ok;
}

static void
disk_only(gfs_verify_disk *r, gfs_session *s, const struct dfile *d)
{
	r->st.only_disk++;
	r->st.problems++;
	compared(r, '-', d->name);
	problem_at(r, "MISSING-IN-GRIDFS", d->name, NULL, d->path, d);
	if (!r->o.repair)
		return;
	gfs_error err = {0};
	bool ok = r->o.dry_run || upload(s, d, NULL, &err);
	repaired(r, "upload", d->name, NULL, ok ? d->path : err.msg, ok);
}

static void
gridfs_only(gfs_verify_disk *r, const struct rec *rc)
{
	r->st.only_gridfs++;
	r->st.problems++;
	compared(r, '+', rc->name);
	problem(r, "MISSING-ON-DISK", rc->name, &rc->id, "");
	if (r->o.repair)
		repaired(r, "none", rc->name, &rc->id, "verify does not write to disk", false);
}

/* Both sides have the name: compare, and replace a damaged GridFS copy from disk. */
static void
both(gfs_verify_disk *r, gfs_session *s, struct rec *rc, const struct dfile *d)
{
	/* Extra chunks alone do not make the content differ; the repair drops them. */
	if (!rc->intact && !rc->data_whole) {
		r->st.damaged++;
		compared(r, '!', rc->name);
		if (!r->o.repair)
			return;
		gfs_error err = {0};
		bool ok = r->o.dry_run || upload(s, d, rc->content_type, &err);
		repair_step(r, "reupload", rc->name, &rc->id, ok ? d->path : err.msg, ok);
		rc->replaced = ok;
		return;
	}
	char detail[256];
	if ((int64_t)d->st.st_size != rc->length) {
		snprintf(detail, sizeof detail, "size gridfs=%lld disk=%lld", (long long)rc->length,
		         (long long)d->st.st_size);
	} else {
		char hex[65];
		if (!hash_disk(d->path, hex)) {
			int e = errno;
			compared(r, '!', rc->name);
			r->st.problems++;
			snprintf(detail, sizeof detail, "%s: %s", d->path, strerror(e));
			problem_at(r, "DISK-ERROR", rc->name, &rc->id, detail, d);
			if (r->o.repair)
				repaired(r, "none", rc->name, &rc->id, "the disk copy cannot be read; left as it is",
				            false);
			return;
		}
		if (strcmp(hex, rc->sha256) == 0) {
			r->st.same++;
			rc->disk_same = true;
			compared(r, '=', rc->name);
			return;
		}
		snprintf(detail, sizeof detail, "sha256 gridfs=%s disk=%s", rc->sha256, hex);
	}
	r->st.differ++;
	r->st.problems++;
	compared(r, '*', rc->name);
	problem_at(r, "DIFFERS", rc->name, &rc->id, detail, d);
	if (r->o.repair)
		repaired(r, "none", rc->name, &rc->id,
		         "both copies are whole; import or mirror decides which wins", false);
}

bool
gfs_verify_disk_compare(gfs_verify_disk *r, gfs_session *s, gfs_error *err)
{
	struct walk_ctx w = {.r = r, .root = r->o.dir, .prefix = r->o.prefix};
	gfs_walk_opts wo = {0};
	if (!gfs_walk(r->o.dir, &wo, walk_one, &w, err))
		return false;
	if (r->nfiles)
		qsort(r->files, r->nfiles, sizeof *r->files, cmp_dfile);
	if (r->nrecs)
		qsort(r->recs, r->nrecs, sizeof *r->recs, cmp_rec);
	for (size_t i = 0; i < r->nrecs; i++)
		r->recs[i]->latest = i == 0 || strcmp(r->recs[i - 1]->name, r->recs[i]->name) != 0;

	size_t i = 0, j = 0;
	while (i < r->nrecs || j < r->nfiles) {
		if (stopped(r)) {
			gfs_error_set(err, GFS_ECANCELED, "interrupted");
			return false;
		}
		if (i < r->nrecs && !r->recs[i]->latest) {
			i++;
			continue;
		}
		int c = i >= r->nrecs ? 1 : j >= r->nfiles ? -1 : strcmp(r->recs[i]->name, r->files[j].name);
		if (c < 0)
			gridfs_only(r, r->recs[i++]);
		else if (c > 0)
			disk_only(r, s, &r->files[j++]);
		else
			both(r, s, r->recs[i++], &r->files[j++]);
	}
	return true;
}

static void
free_walk(gfs_verify_disk *r)
{
	for (size_t i = 0; i < r->nfiles; i++) {
		free(r->files[i].name);
		free(r->files[i].path);
		free(r->files[i].rel);
	}
	free(r->files);
	r->files = NULL;
	r->nfiles = r->capfiles = 0;
}

/* ---- repairs of what the pass found ----------------------------------- */

/*
 * Extra chunks go only when a hash proved the content read without them
 * right (the stored hash, or equality with the disk copy). Chunks numbered
 * count or beyond are never read, but without that proof the length may be
 * what is wrong (cut short, or 0 beside a chunk holding bytes) and they the
 * rest of the data; of a duplicate n, the copy read may be the wrong one.
 * Drivers that store no hash (pymongo 4, Node, Go) make this the common case.
 */
static void
repair_extra(gfs_verify_disk *r, gfs_session *s, struct prob *q, struct rec *rc)
{
	gfs_error err = {0};
	int64_t beyond = q->count - q->dups, gone = 0, n = 0;
	bool proven = q->verified || (rc && rc->disk_same);
	char detail[300];
	if (!proven) {
		snprintf(detail, sizeof detail, "EXTRA-CHUNK: %lld chunk(s) numbered outside the file's "
		         "%lld, %lld duplicate(s), left as they are: without a stored hash (or an equal "
		         "disk copy, --against) nothing proves the file whole without them",
		         (long long)beyond, (long long)q->chunk_count, (long long)q->dups);
		repaired(r, "none", q->name, &q->id, detail, false);
		return;
	}
	if (r->o.dry_run) {
		snprintf(detail, sizeof detail, "%lld chunk(s) numbered outside the file's %lld; "
		         "%lld duplicate(s)", (long long)beyond, (long long)q->chunk_count,
		         (long long)q->dups);
		repaired(r, "remove-extra-chunks", q->name, &q->id, detail, true);
		return;
	}
	if (beyond > 0 && !gfs_verify_remove_chunks_beyond(s, &q->id, q->chunk_count, &gone, &err)) {
		repaired(r, "remove-extra-chunks", q->name, &q->id, err.msg, false);
		return;
	}
	if (q->n_extra && !gfs_verify_remove_chunk_ids(s, &q->id, q->extra, q->n_extra, &n, &err)) {
		repaired(r, "remove-extra-chunks", q->name, &q->id, err.msg, false);
		return;
	}
	gone += n;
	if ((int64_t)q->n_extra < q->dups) {
		snprintf(detail, sizeof detail, "removed %lld of %lld extra chunk(s); at most %d "
		         "duplicates are removed a run, run --repair again for the rest",
		         (long long)gone, (long long)q->count, GFS_VERIFY_MAX_EXTRA_IDS);
		repaired(r, "remove-extra-chunks", q->name, &q->id, detail, false);
		return;
	}
	snprintf(detail, sizeof detail, "removed %lld extra chunk(s); the file's data is whole "
	         "without them", (long long)gone);
	repaired(r, "remove-extra-chunks", q->name, &q->id, detail, true);
}

static void
repair_file(gfs_verify_disk *r, gfs_session *s, struct prob *q, struct rec *rc)
{
	gfs_error err = {0};
	const char *kind = gfs_verify_kind_name(q->kind);
	if (rc && rc->replaced) {
		/* The new revision is complete: only now does the damaged one go. */
		bool ok = r->o.dry_run || rc->removed || gfs_delete(s, &q->id, &err);
		/* Gone already, by another hand: the replacement is all that was needed. */
		if (!ok && err.code == GFS_ENOTFOUND)
			ok = true;
		rc->removed = ok && !r->o.dry_run;
		repaired(r, "remove-damaged", q->name, &q->id,
		         ok ? "replaced from disk" : err.msg, ok);
		return;
	}
	if (q->kind == GFS_VK_INCOMPLETE) {
		/* Never remove what a reader could read: its chunks may have come since. */
		int has = r->o.dry_run ? 0 : gfs_verify_chunks_exist(s, &q->id, &err);
		if (has != 0) {
			repaired(r, "remove-incomplete", q->name, &q->id,
			         has > 0 ? "left: chunks with its id exist now" : err.msg, false);
			return;
		}
		bool ok = r->o.dry_run || gfs_delete(s, &q->id, &err);
		repaired(r, "remove-incomplete", q->name, &q->id,
		         ok ? "files document of an interrupted upload (it had no data)" : err.msg, ok);
		return;
	}
	if (q->kind == GFS_VK_EXTRA_CHUNK && q->data_intact) {
		repair_extra(r, s, q, rc);
		return;
	}
	if (q->kind == GFS_VK_UNVERIFIABLE && rc && rc->disk_same && rc->sha256[0]) {
		bool ok = r->o.dry_run || gfs_verify_set_sha256(s, &q->id, rc->sha256, &err);
		repaired(r, "set-sha256", q->name, &q->id,
		         ok ? "content equals the disk copy; its sha256 is now stored" : err.msg, ok);
		return;
	}
	char detail[160];
	snprintf(detail, sizeof detail, "%s: %s", kind,
	         r->o.dir ? "no usable disk copy; left as it is"
	                    : "left as it is (with --against DIR it can be re-uploaded)");
	repaired(r, "none", q->name, q->has_id ? &q->id : NULL, detail, false);
}

static void
repair_orphans(gfs_verify_disk *r, gfs_session *s, struct prob *q)
{
	gfs_error err = {0};
	int64_t n = 0, before = r->o.grace_s ? gfs_now_ms() - r->o.grace_s * 1000 : 0;
	char detail[200];
	if (r->o.dry_run) {
		snprintf(detail, sizeof detail, "%lld chunk(s) of no file, those older than %lds; "
		         "their data would be gone", (long long)q->count, r->o.grace_s);
		repaired(r, "remove-orphans", NULL, &q->id, detail, true);
		return;
	}
	/* Never remove what a reader could read: a files document may have come since. */
	int has = gfs_verify_file_exists(s, &q->id, &err);
	if (has != 0) {
		repaired(r, "remove-orphans", NULL, &q->id,
		         has > 0 ? "left: a files document with this id exists now" : err.msg, false);
		return;
	}
	if (!gfs_verify_remove_chunks(s, &q->id, before, &n, &err)) {
		repaired(r, "remove-orphans", NULL, &q->id, err.msg, false);
		return;
	}
	if (n < q->count) {
		snprintf(detail, sizeof detail, "removed %lld of %lld chunk(s); the rest are younger than "
		         "%lds and may be an upload in progress (see --grace)", (long long)n,
		         (long long)q->count, r->o.grace_s);
		repaired(r, "remove-orphans", NULL, &q->id, detail, false);
		return;
	}
	snprintf(detail, sizeof detail, "removed %lld chunk(s) of no file; their data is gone "
	         "(it could not be read through GridFS)", (long long)n);
	repaired(r, "remove-orphans", NULL, &q->id, detail, true);
}

void
gfs_verify_disk_repair(gfs_verify_disk *r, gfs_session *s)
{
	for (size_t i = 0; i < r->nprobs && !stopped(r); i++) {
		struct prob *q = &r->probs[i];
		if (q->kind == GFS_VK_ORPHAN_CHUNKS && q->has_id) {
			repair_orphans(r, s, q);
			continue;
		}
		if (q->tie < 0 || !q->has_id) {
			repaired(r, "none", q->name, q->has_id ? &q->id : NULL,
			         q->kind != GFS_VK_BAD_DOC ? "a chunk without files_id is left as it is"
			         : "a malformed files document is left as it is: read it, then remove it "
			           "with 'gridfsctl rm NAME' (or 'rm --id ID')", false);
			continue;
		}
		repair_file(r, s, q, q->rec);
	}
}

void
gfs_verify_disk_free(gfs_verify_disk *r)
{
	if (!r)
		return;
	free_walk(r);
	for (size_t i = 0; i < r->nrecs; i++) {
		free(r->recs[i]->name);
		free(r->recs[i]->content_type);
		bson_value_destroy(&r->recs[i]->id);
		free(r->recs[i]);
	}
	free(r->recs);
	for (size_t i = 0; i < r->nprobs; i++) {
		struct prob *q = &r->probs[i];
		if (q->has_id)
			bson_value_destroy(&q->id);
		free(q->name);
		for (size_t k = 0; k < q->n_extra; k++)
			bson_value_destroy(&q->extra[k]);
		free(q->extra);
	}
	free(r->probs);
	free(r);
}
