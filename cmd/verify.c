/*
 * gridfsctl verify: prove that what the bucket holds is intact, compare it
 * with a disk tree, and repair what can be repaired without losing data.
 *
 * The pass itself is lib/verify.c. This file prints problems as they come,
 * remembers what a repair or a disk comparison needs, and acts afterwards.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../lib/import.h"
#include "../lib/lock.h"
#include "../lib/magic.h"
#include "../lib/names.h"
#include "../lib/verify.h"
#include "../lib/walk.h"
#include "cmd.h"

enum {
	OPT_PREFIX = 'p',
	OPT_AGAINST = 0x2000,
	OPT_COMBINED,
	OPT_REPAIR,
	OPT_DRY_RUN,
	OPT_JSON,
	OPT_SAMPLE,
	OPT_THREADS,
	OPT_STRATEGY,
	OPT_GRACE,
	OPT_JOBS = 'j',
};

/* Orphan chunks younger than this may belong to an upload in progress. */
#define DEFAULT_GRACE_S 3600

static const struct cmd_opt verify_opts[] = {
	PREFIX_OPT("check only files whose names start with P (orphan chunks are looked for only "
	           "without --prefix and --sample)"),
	CMD_OPT(0, "against", "DIR", "also compare with a disk tree: missing in GridFS, missing on "
	        "disk, content differs (size, then sha256)", .id = OPT_AGAINST),
	CMD_OPT(0, "combined", "FILE", "with --against, write an rclone-style report to FILE ('-' for "
	        "stdout): '= path' same, '- path' only on disk, '+ path' only in GridFS, '* path' "
	        "differs, '! path' damaged in GridFS", .id = OPT_COMBINED),
	CMD_OPT(0, "repair", NULL, "remove orphan chunks, incomplete uploads and extra chunks; with "
	        "--against re-upload missing or damaged files from disk", .id = OPT_REPAIR),
	CMD_OPT(0, "grace", "SECONDS", "with --repair, leave orphan chunks younger than this (default "
	        "3600: they may be an upload in progress)", .id = OPT_GRACE),
	CMD_OPT('n', "dry-run", NULL, "with --repair, show what would be done and do nothing"),
	CMD_OPT(0, "json", NULL, "one JSON object per problem and repair, then a summary object",
	        .id = OPT_JSON),
	CMD_OPT(0, "sample", "N%", "check a random N percent of the files", .id = OPT_SAMPLE),
	CMD_OPT(0, "threads", "N", "hashing threads (default: from the CPU count)", .id = OPT_THREADS),
	CMD_OPT(0, "strategy", "S", "how chunks are read: auto (default: scan for the whole bucket, "
	        "else what the server serves from an index), scan (one sorted pass over all chunks), "
	        "batched (files_id $in batches) or each (a query per file, --jobs at once)",
	        .id = OPT_STRATEGY, .values = "auto scan batched each"),
	CMD_OPT('j', "jobs", "N", "connections reading at once with the each strategy (default 4)"),
	CMD_OPT_END,
};

struct vopts {
	const char *prefix;
	char *norm_prefix;
	const char *against;
	const char *combined;
	bool repair, dry_run, json;
	double sample;
	long threads;
	long grace;
	long jobs;
	enum gfs_read_strategy strategy;
};

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

struct run {
	struct vopts *o;
	FILE *pout;               /* where problem lines go */
	FILE *combined;
	struct rec **recs;
	size_t nrecs, caprecs;
	struct prob *probs;
	size_t nprobs, capprobs, mark;   /* mark: first problem not yet tied to a file */
	gfs_verify_stats st;
	struct progress *prog;
	uint64_t extra_problems;  /* from the disk comparison */
	uint64_t repaired, unrepaired;
	uint64_t same, differ, only_disk, only_gridfs, damaged;
	char failure[600];        /* why the run could not finish; "" when it did */
};

static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct vopts *o = ctx;
	switch (opt) {
	case OPT_PREFIX: o->prefix = arg; return 0;
	case OPT_AGAINST: o->against = arg; return 0;
	case OPT_COMBINED: o->combined = arg; return 0;
	case OPT_REPAIR: o->repair = true; return 0;
	case 'n': o->dry_run = true; return 0;
	case OPT_JSON: o->json = true; return 0;
	case OPT_SAMPLE:
		if (!gfs_verify_parse_percent(arg, &o->sample)) {
			usage_error("--sample wants a percentage in (0, 100], like 5%%, not '%s'", arg);
			return -1;
		}
		return 0;
	case OPT_THREADS:
		if (!parse_int(arg, 1, 16, &o->threads)) {
			usage_error("--threads wants a number from 1 to 16, not '%s'", arg);
			return -1;
		}
		return 0;
	case OPT_GRACE:
		if (!parse_int(arg, 0, 100L * 365 * 86400, &o->grace)) {
			usage_error("--grace wants seconds (0 or more), not '%s'", arg);
			return -1;
		}
		return 0;
	case OPT_STRATEGY:
		if (!gfs_read_strategy_parse(arg, &o->strategy)) {
			usage_error("--strategy is auto, scan, batched or each, not '%s'", arg);
			return -1;
		}
		return 0;
	case OPT_JOBS:
		if (!parse_int(arg, 1, 32, &o->jobs)) {
			usage_error("--jobs wants a number from 1 to 32, not '%s'", arg);
			return -1;
		}
		return 0;
	}
	return -1;
}

/* ---- output ---------------------------------------------------------- */

static void
append_id(bson_t *doc, const char *key, const bson_value_t *id)
{
	if (!id) {
		BSON_APPEND_NULL(doc, key);
		return;
	}
	char *s = gfs_id_string(id);
	BSON_APPEND_UTF8(doc, key, s);
	free(s);
}

static void
print_problem_line(struct run *r, const char *kind, const char *name, const bson_value_t *id,
                   const char *detail)
{
	char *ids = id ? gfs_id_string(id) : NULL;
	human_line(r->pout, "%s %s %s%s%s", kind, name ? name : ids ? ids : "-", detail,
	           ids && name ? " id=" : "", ids && name ? ids : "");
	free(ids);
}

static void
emit_problem(struct run *r, const char *kind, const char *name, const bson_value_t *id,
             const char *detail, const gfs_verify_problem *p)
{
	if (!r->o->json) {
		print_problem_line(r, kind, name, id, detail);
		return;
	}
	bson_t doc;
	bool note = p && p->kind == GFS_VK_IN_PROGRESS;   /* not a problem */
	json_event(&doc, note ? "note" : "problem");
	BSON_APPEND_UTF8(&doc, "kind", kind);
	json_filename(&doc, name);
	append_id(&doc, "id", id);
	if (p && p->n >= 0)
		BSON_APPEND_INT64(&doc, "n", p->n);
	bool orphans = p && (p->kind == GFS_VK_ORPHAN_CHUNKS || note);
	if (p && (orphans || p->kind == GFS_VK_EXTRA_CHUNK))
		BSON_APPEND_INT64(&doc, "count", p->count);
	if (orphans)
		BSON_APPEND_INT64(&doc, "bytes", p->bytes);
	if (p && p->kind == GFS_VK_CHECKSUM)
		BSON_APPEND_UTF8(&doc, "actual", p->actual);
	BSON_APPEND_UTF8(&doc, "detail", detail);
	print_json(r->pout, &doc);
	bson_destroy(&doc);
}

/* How to remove a malformed files document, which no repair touches: "" when there is no way. */
static const char *
bad_doc_hint(const gfs_verify_problem *p)
{
	if (p->kind != GFS_VK_BAD_DOC || p->file || !p->id)
		return "";
	if (p->filename)
		return "; 'gridfsctl rm NAME' removes it and its chunks";
	return p->id->value_type == BSON_TYPE_OID ? "; 'gridfsctl rm --id ID' removes it and its chunks"
	                                          : "";
}

static void
on_problem(const gfs_verify_problem *p, void *ctx)
{
	struct run *r = ctx;
	if (r->prog)
		fputs("\r\033[K", stderr);
	char detail[sizeof p->detail + 64];
	snprintf(detail, sizeof detail, "%s%s", p->detail, bad_doc_hint(p));
	emit_problem(r, gfs_verify_kind_name(p->kind), p->filename, p->id, detail, p);
	fflush(r->pout);
	if (p->kind == GFS_VK_IN_PROGRESS)
		return;   /* another process's work: nothing to repair */
	if (r->nprobs == r->capprobs) {
		r->capprobs = r->capprobs ? r->capprobs * 2 : 16;
		r->probs = realloc(r->probs, r->capprobs * sizeof *r->probs);
		if (!r->probs)
			abort();
	}
	struct prob *q = &r->probs[r->nprobs++];
	memset(q, 0, sizeof *q);
	q->kind = p->kind;
	if (p->id) {
		bson_value_copy(p->id, &q->id);
		q->has_id = true;
	}
	q->name = p->filename ? strdup(p->filename) : NULL;
	q->data_intact = p->data_intact;
	q->verified = p->verified;
	q->count = p->count;
	q->chunk_count = p->chunk_count;
	q->dups = p->dups;
	if (p->n_extra_ids) {
		q->extra = calloc(p->n_extra_ids, sizeof *q->extra);
		if (!q->extra)
			abort();
		for (size_t i = 0; i < p->n_extra_ids; i++)
			bson_value_copy(&p->extra_ids[i], &q->extra[i]);
		q->n_extra = p->n_extra_ids;
	}
	/* A file's problems come just before its verdict; an orphan's never do. */
	if (!p->file)
		q->tie = -1;
}

static void
on_file(const gfs_verify_file *v, void *ctx)
{
	struct run *r = ctx;
	size_t first = r->mark;
	r->mark = r->nprobs;
	/* Only a disk comparison needs every file. */
	if (!r->o->against || !v->file->filename)
		return;
	if (r->nrecs == r->caprecs) {
		r->caprecs = r->caprecs ? r->caprecs * 2 : 1024;
		r->recs = realloc(r->recs, r->caprecs * sizeof *r->recs);
		if (!r->recs)
			abort();
	}
	struct rec *rc = calloc(1, sizeof *rc);
	if (!rc)
		abort();
	r->recs[r->nrecs++] = rc;
	for (size_t i = first; i < r->nprobs; i++)
		if (r->probs[i].tie == 0)
			r->probs[i].rec = rc;
	rc->name = strdup(v->file->filename);
	rc->upload_date = v->file->upload_date;
	bson_value_copy(&v->file->id, &rc->id);
	rc->length = v->file->length;
	memcpy(rc->sha256, v->sha256, sizeof rc->sha256);
	rc->content_type = v->file->content_type ? strdup(v->file->content_type) : NULL;
	rc->intact = v->intact;
	rc->verified = v->verified;
	rc->data_whole = v->data_whole;
}

static void
on_progress(uint64_t files, uint64_t bytes, void *ctx)
{
	struct run *r = ctx;
	if (!G.progress)
		return;
	if (!r->prog)
		r->prog = progress_start("verify", r->st.files, r->st.total_bytes);
	progress_update(r->prog, files, bytes);
}

static void
emit_repair(struct run *r, const char *action, const char *name, const bson_value_t *id,
            const char *detail, bool ok)
{
	const char *state = r->o->dry_run ? "WOULD" : ok ? "REPAIRED" : "NOT-REPAIRED";
	if (!r->o->dry_run) {
		if (ok)
			r->repaired++;
		else
			r->unrepaired++;
	}
	if (!r->o->json) {
		char *ids = id ? gfs_id_string(id) : NULL;
		human_line(r->pout, "%s %s %s: %s", state, action, name ? name : ids ? ids : "-", detail);
		free(ids);
		return;
	}
	bson_t doc;
	json_event(&doc, "repair");
	BSON_APPEND_UTF8(&doc, "repair", action);
	json_filename(&doc, name);
	append_id(&doc, "id", id);
	BSON_APPEND_UTF8(&doc, "detail", detail);
	if (r->o->dry_run)
		BSON_APPEND_BOOL(&doc, "dryRun", true);
	else
		BSON_APPEND_BOOL(&doc, "repaired", ok);
	print_json(r->pout, &doc);
	bson_destroy(&doc);
}

/* ---- the disk tree --------------------------------------------------- */

struct dfile {
	char *name;       /* the GridFS name it maps to */
	char *path;       /* on disk */
	bool escaped;
	char *rel;        /* relative path bytes, for metadata.rawName */
	size_t rel_len;
	struct stat st;
};

static struct dfile *walk_files;
static size_t walk_n, walk_cap;

struct walk_ctx {
	struct run *r;
	const char *root;
	const char *prefix;
};

/* The walk import does with its defaults, so that the two agree on what the tree holds. */
static bool
walk_one(const gfs_walk_entry *e, void *ctx)
{
	struct walk_ctx *w = ctx;
	if (e->kind == GFS_WALK_ERROR) {
		w->r->extra_problems++;
		emit_problem(w->r, "DISK-ERROR", e->rel, NULL, e->reason ? e->reason : "cannot read", NULL);
		/* Every problem gets a repair result, or one fix would make the whole run succeed. */
		if (w->r->o->repair)
			emit_repair(w->r, "none", e->rel, NULL, "cannot be read on disk; left as it is", false);
		return !stop_signal;
	}
	if (e->kind != GFS_WALK_FILE)
		return !stop_signal;
	if (walk_n == walk_cap) {
		walk_cap = walk_cap ? walk_cap * 2 : 1024;
		walk_files = realloc(walk_files, walk_cap * sizeof *walk_files);
		if (!walk_files)
			abort();
	}
	struct dfile *d = &walk_files[walk_n++];
	d->rel_len = e->rel_len;
	d->rel = malloc(e->rel_len + 1);
	if (!d->rel)
		abort();
	memcpy(d->rel, e->rel, e->rel_len + 1);
	char *uname = gfs_name_from_bytes(e->rel, e->rel_len, &d->escaped);
	d->name = gfs_prefix_join(w->prefix, uname);
	free(uname);
	d->path = bson_strdup_printf("%s/%s", w->root, e->rel);
	d->st = *e->st;
	return !stop_signal;
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

static void
combined_line(struct run *r, char mark, const char *name)
{
	if (r->combined)
		human_line(r->combined, "%c %s", mark, name);
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
			sniffed = strdup(gfs_magic_type(m, head, (size_t)n));
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
	int64_t mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
	int64_t mtime_ms = mtime_ns >= 0 ? mtime_ns / 1000000 : -((-mtime_ns + 999999) / 1000000);
	bson_t meta = BSON_INITIALIZER;
	BSON_APPEND_DATE_TIME(&meta, "mtime", mtime_ms);
	BSON_APPEND_INT64(&meta, "mtimeNs", mtime_ns);
	BSON_APPEND_INT64(&meta, "size", (int64_t)st.st_size);
	BSON_APPEND_INT32(&meta, "mode", (int32_t)(st.st_mode & 07777));
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
disk_only(struct run *r, gfs_session *s, const struct dfile *d)
{
	r->only_disk++;
	r->extra_problems++;
	combined_line(r, '-', d->name);
	emit_problem(r, "MISSING-IN-GRIDFS", d->name, NULL, d->path, NULL);
	if (!r->o->repair)
		return;
	gfs_error err = {0};
	bool ok = r->o->dry_run || upload(s, d, NULL, &err);
	emit_repair(r, "upload", d->name, NULL, ok ? d->path : err.msg, ok);
}

static void
gridfs_only(struct run *r, const struct rec *rc)
{
	r->only_gridfs++;
	r->extra_problems++;
	combined_line(r, '+', rc->name);
	emit_problem(r, "MISSING-ON-DISK", rc->name, &rc->id, "", NULL);
	if (r->o->repair)
		emit_repair(r, "none", rc->name, &rc->id, "verify does not write to disk", false);
}

/* Both sides have the name: compare, and replace a damaged GridFS copy from disk. */
static void
both(struct run *r, gfs_session *s, struct rec *rc, const struct dfile *d)
{
	/* Extra chunks alone do not make the content differ; the repair drops them. */
	if (!rc->intact && !rc->data_whole) {
		r->damaged++;
		combined_line(r, '!', rc->name);
		if (!r->o->repair)
			return;
		gfs_error err = {0};
		bool ok = r->o->dry_run || upload(s, d, rc->content_type, &err);
		emit_repair(r, "reupload", rc->name, &rc->id, ok ? d->path : err.msg, ok);
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
			combined_line(r, '!', rc->name);
			r->extra_problems++;
			snprintf(detail, sizeof detail, "%s: %s", d->path, strerror(e));
			emit_problem(r, "DISK-ERROR", rc->name, &rc->id, detail, NULL);
			if (r->o->repair)
				emit_repair(r, "none", rc->name, &rc->id, "the disk copy cannot be read; left as it is",
				            false);
			return;
		}
		if (strcmp(hex, rc->sha256) == 0) {
			r->same++;
			rc->disk_same = true;
			combined_line(r, '=', rc->name);
			return;
		}
		snprintf(detail, sizeof detail, "sha256 gridfs=%s disk=%s", rc->sha256, hex);
	}
	r->differ++;
	r->extra_problems++;
	combined_line(r, '*', rc->name);
	emit_problem(r, "DIFFERS", rc->name, &rc->id, detail, NULL);
	if (r->o->repair)
		emit_repair(r, "none", rc->name, &rc->id,
		            "both copies are whole; import or mirror decides which wins", false);
}

static int
compare_disk(struct run *r, gfs_session *s)
{
	struct walk_ctx w = {.r = r, .root = r->o->against, .prefix = r->o->norm_prefix};
	gfs_walk_opts wo = {0};
	gfs_error err = {0};
	if (!gfs_walk(r->o->against, &wo, walk_one, &w, &err)) {
		if (err.code == GFS_ECANCELED)
			return EXIT_INTERRUPTED;
		warnx_("%s", err.msg);
		snprintf(r->failure, sizeof r->failure, "%s", err.msg);
		return EXIT_LOCAL;
	}
	if (walk_n)
		qsort(walk_files, walk_n, sizeof *walk_files, cmp_dfile);
	if (r->nrecs)
		qsort(r->recs, r->nrecs, sizeof *r->recs, cmp_rec);
	for (size_t i = 0; i < r->nrecs; i++)
		r->recs[i]->latest = i == 0 || strcmp(r->recs[i - 1]->name, r->recs[i]->name) != 0;

	size_t i = 0, j = 0;
	while (i < r->nrecs || j < walk_n) {
		if (stop_signal)
			return EXIT_INTERRUPTED;
		if (i < r->nrecs && !r->recs[i]->latest) {
			i++;
			continue;
		}
		int c = i >= r->nrecs ? 1 : j >= walk_n ? -1 : strcmp(r->recs[i]->name, walk_files[j].name);
		if (c < 0)
			gridfs_only(r, r->recs[i++]);
		else if (c > 0)
			disk_only(r, s, &walk_files[j++]);
		else
			both(r, s, r->recs[i++], &walk_files[j++]);
	}
	return EXIT_OK;
}

static void
free_walk(void)
{
	for (size_t i = 0; i < walk_n; i++) {
		free(walk_files[i].name);
		free(walk_files[i].path);
		free(walk_files[i].rel);
	}
	free(walk_files);
	walk_files = NULL;
	walk_n = walk_cap = 0;
}

/* ---- repairs of what the pass found ----------------------------------- */

/*
 * Chunks numbered count or beyond are never read, so they go whenever the
 * file is whole without them. A duplicate n is different: the copy read may
 * be the wrong one, so duplicates go only when a hash proved the copies read
 * right (the stored hash, or equality with the disk copy).
 */
static void
repair_extra(struct run *r, gfs_session *s, struct prob *q, struct rec *rc)
{
	gfs_error err = {0};
	int64_t beyond = q->count - q->dups, gone = 0, n = 0;
	bool proven = q->verified || (rc && rc->disk_same);
	char detail[300];
	if (r->o->dry_run) {
		snprintf(detail, sizeof detail, "%lld chunk(s) numbered %lld or beyond; %lld duplicate(s)%s",
		         (long long)beyond, (long long)q->chunk_count, (long long)q->dups,
		         q->dups && !proven ? " kept: no hash proves which copy is right" : "");
		emit_repair(r, "remove-extra-chunks", q->name, &q->id, detail, true);
		return;
	}
	if (beyond > 0 && !gfs_verify_remove_chunks_beyond(s, &q->id, q->chunk_count, &gone, &err)) {
		emit_repair(r, "remove-extra-chunks", q->name, &q->id, err.msg, false);
		return;
	}
	if (q->dups && !proven) {
		snprintf(detail, sizeof detail, "removed %lld chunk(s) numbered %lld or beyond; %lld "
		         "duplicate chunk(s) kept: without a stored hash it cannot be told which copy is right",
		         (long long)gone, (long long)q->chunk_count, (long long)q->dups);
		emit_repair(r, "remove-extra-chunks", q->name, &q->id, detail, false);
		return;
	}
	if (q->n_extra && !gfs_verify_remove_chunk_ids(s, q->extra, q->n_extra, &n, &err)) {
		emit_repair(r, "remove-extra-chunks", q->name, &q->id, err.msg, false);
		return;
	}
	gone += n;
	if ((int64_t)q->n_extra < q->dups) {
		snprintf(detail, sizeof detail, "removed %lld of %lld extra chunk(s); at most %d "
		         "duplicates are removed a run, run --repair again for the rest",
		         (long long)gone, (long long)q->count, GFS_VERIFY_MAX_EXTRA_IDS);
		emit_repair(r, "remove-extra-chunks", q->name, &q->id, detail, false);
		return;
	}
	snprintf(detail, sizeof detail, "removed %lld extra chunk(s); the file's data is whole "
	         "without them", (long long)gone);
	emit_repair(r, "remove-extra-chunks", q->name, &q->id, detail, true);
}

static void
repair_file(struct run *r, gfs_session *s, struct prob *q, struct rec *rc)
{
	gfs_error err = {0};
	const char *kind = gfs_verify_kind_name(q->kind);
	if (rc && rc->replaced) {
		/* The new revision is complete: only now does the damaged one go. */
		bool ok = r->o->dry_run || rc->removed || gfs_delete(s, &q->id, &err);
		/* Gone already, by another hand: the replacement is all that was needed. */
		if (!ok && err.code == GFS_ENOTFOUND)
			ok = true;
		rc->removed = ok && !r->o->dry_run;
		emit_repair(r, "remove-damaged", q->name, &q->id,
		            ok ? "replaced from disk" : err.msg, ok);
		return;
	}
	if (q->kind == GFS_VK_INCOMPLETE) {
		/* Never remove what a reader could read: its chunks may have come since. */
		int has = r->o->dry_run ? 0 : gfs_verify_chunks_exist(s, &q->id, &err);
		if (has != 0) {
			emit_repair(r, "remove-incomplete", q->name, &q->id,
			            has > 0 ? "left: chunks with its id exist now" : err.msg, false);
			return;
		}
		bool ok = r->o->dry_run || gfs_delete(s, &q->id, &err);
		emit_repair(r, "remove-incomplete", q->name, &q->id,
		            ok ? "files document of an interrupted upload (it had no data)" : err.msg, ok);
		return;
	}
	if (q->kind == GFS_VK_EXTRA_CHUNK && q->data_intact) {
		repair_extra(r, s, q, rc);
		return;
	}
	if (q->kind == GFS_VK_UNVERIFIABLE && rc && rc->disk_same && rc->sha256[0]) {
		bool ok = r->o->dry_run || gfs_verify_set_sha256(s, &q->id, rc->sha256, &err);
		emit_repair(r, "set-sha256", q->name, &q->id,
		            ok ? "content equals the disk copy; its sha256 is now stored" : err.msg, ok);
		return;
	}
	char detail[160];
	snprintf(detail, sizeof detail, "%s: %s", kind,
	         r->o->against ? "no usable disk copy; left as it is"
	                       : "left as it is (with --against DIR it can be re-uploaded)");
	emit_repair(r, "none", q->name, q->has_id ? &q->id : NULL, detail, false);
}

static void
repair_orphans(struct run *r, gfs_session *s, struct prob *q)
{
	gfs_error err = {0};
	int64_t n = 0, before = r->o->grace ? gfs_now_ms() - r->o->grace * 1000 : 0;
	char detail[200];
	if (r->o->dry_run) {
		snprintf(detail, sizeof detail, "%lld chunk(s) of no file, those older than %lds; "
		         "their data would be gone", (long long)q->count, r->o->grace);
		emit_repair(r, "remove-orphans", NULL, &q->id, detail, true);
		return;
	}
	/* Never remove what a reader could read: a files document may have come since. */
	int has = gfs_verify_file_exists(s, &q->id, &err);
	if (has != 0) {
		emit_repair(r, "remove-orphans", NULL, &q->id,
		            has > 0 ? "left: a files document with this id exists now" : err.msg, false);
		return;
	}
	if (!gfs_verify_remove_chunks(s, &q->id, before, &n, &err)) {
		emit_repair(r, "remove-orphans", NULL, &q->id, err.msg, false);
		return;
	}
	if (n < q->count) {
		snprintf(detail, sizeof detail, "removed %lld of %lld chunk(s); the rest are younger than "
		         "%lds and may be an upload in progress (see --grace)", (long long)n,
		         (long long)q->count, r->o->grace);
		emit_repair(r, "remove-orphans", NULL, &q->id, detail, false);
		return;
	}
	snprintf(detail, sizeof detail, "removed %lld chunk(s) of no file; their data is gone "
	         "(it could not be read through GridFS)", (long long)n);
	emit_repair(r, "remove-orphans", NULL, &q->id, detail, true);
}

static void
repair(struct run *r, gfs_session *s)
{
	for (size_t i = 0; i < r->nprobs && !stop_signal; i++) {
		struct prob *q = &r->probs[i];
		if (q->kind == GFS_VK_ORPHAN_CHUNKS && q->has_id) {
			repair_orphans(r, s, q);
			continue;
		}
		if (q->tie < 0 || !q->has_id) {
			emit_repair(r, "none", q->name, q->has_id ? &q->id : NULL,
			            q->kind != GFS_VK_BAD_DOC ? "a chunk without files_id is left as it is"
			            : "a malformed files document is left as it is: read it, then remove it "
			              "with 'gridfsctl rm NAME' (or 'rm --id ID')", false);
			continue;
		}
		repair_file(r, s, q, q->rec);
	}
}

/* ---- summary --------------------------------------------------------- */

static void
summary(struct run *r, double secs, bool interrupted)
{
	uint64_t problems = r->st.problems + r->extra_problems;
	if (r->o->json) {
		struct json_summary sum;
		json_summary_begin(&sum, "verify", r->o->repair && r->o->dry_run);
		bson_t *doc = &sum.body, kinds;
		BSON_APPEND_INT64(doc, "files", (int64_t)r->st.files);
		BSON_APPEND_INT64(doc, "checked", (int64_t)r->st.files_checked);
		BSON_APPEND_INT64(doc, "chunks", (int64_t)r->st.chunks);
		BSON_APPEND_INT64(doc, "bytes", (int64_t)r->st.bytes);
		BSON_APPEND_INT64(doc, "problems", (int64_t)problems);
		BSON_APPEND_DOCUMENT_BEGIN(doc, "counts", &kinds);
		for (int k = 0; k <= GFS_VK_BAD_DOC; k++)
			if (r->st.by_kind[k])
				BSON_APPEND_INT64(&kinds, gfs_verify_kind_name(k), (int64_t)r->st.by_kind[k]);
		if (r->only_disk)
			BSON_APPEND_INT64(&kinds, "MISSING-IN-GRIDFS", (int64_t)r->only_disk);
		if (r->only_gridfs)
			BSON_APPEND_INT64(&kinds, "MISSING-ON-DISK", (int64_t)r->only_gridfs);
		if (r->differ)
			BSON_APPEND_INT64(&kinds, "DIFFERS", (int64_t)r->differ);
		bson_append_document_end(doc, &kinds);
		BSON_APPEND_BOOL(doc, "orphansChecked", r->st.orphans_checked);
		BSON_APPEND_UTF8(doc, "strategy", gfs_read_strategy_name(r->st.strategy));
		BSON_APPEND_INT64(doc, "inProgress", (int64_t)r->st.in_progress);
		if (r->o->against) {
			BSON_APPEND_INT64(doc, "same", (int64_t)r->same);
			BSON_APPEND_INT64(doc, "damaged", (int64_t)r->damaged);
		}
		if (r->o->repair) {
			BSON_APPEND_INT64(doc, "repaired", (int64_t)r->repaired);
			BSON_APPEND_INT64(doc, "unrepaired", (int64_t)r->unrepaired);
		}
		BSON_APPEND_BOOL(doc, "interrupted", interrupted);
		/* Exit 1 or 130 is a failed run, and says why. */
		char why[64] = "";
		bool fixed = r->o->repair && !r->o->dry_run && r->unrepaired == 0 && r->repaired > 0;
		if (problems && !fixed)
			snprintf(why, sizeof why, "%llu problem%s found", (unsigned long long)problems,
			         problems == 1 ? "" : "s");
		else if (interrupted)
			snprintf(why, sizeof why, "interrupted");
		/* With --combined - stdout carries the report alone. */
		json_summary_end(r->pout, &sum, secs, r->failure[0] ? r->failure : why);
		return;
	}
	FILE *out = r->pout;
	/* "No problems" would vouch for work that was never done. */
	if (r->failure[0]) {
		fprintf(out, "verify: FAILED after %llu files, %llu bytes in %.1f s, %llu problem%s found: %s\n",
		        (unsigned long long)r->st.files_checked, (unsigned long long)r->st.bytes, secs,
		        (unsigned long long)problems, problems == 1 ? "" : "s", r->failure);
		return;
	}
	fprintf(out, "verify: %llu files, %llu bytes in %.1f s: ", (unsigned long long)r->st.files_checked,
	        (unsigned long long)r->st.bytes, secs);
	if (!problems)
		fprintf(out, "no problems");
	else
		fprintf(out, "%llu problem%s", (unsigned long long)problems, problems == 1 ? "" : "s");
	if (r->o->repair && !r->o->dry_run)
		fprintf(out, ", %llu repaired, %llu not", (unsigned long long)r->repaired,
		        (unsigned long long)r->unrepaired);
	if (r->st.in_progress)
		fprintf(out, " (%llu upload%s in progress left alone)", (unsigned long long)r->st.in_progress,
		        r->st.in_progress == 1 ? "" : "s");
	if (!r->st.orphans_checked && !interrupted)
		fprintf(out, " (orphan chunks not checked: only without --prefix and --sample)");
	if (interrupted)
		fprintf(out, " (interrupted)");
	fputc('\n', out);
}

static void
free_run(struct run *r)
{
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
}

static int
cmd_verify(int argc, char **argv)
{
	struct vopts o = {.strategy = GFS_READ_AUTO, .grace = DEFAULT_GRACE_S};
	int first = parse_options(argc, argv, &cmd_verify_entry, on_opt, &o);
	if (first < 0)
		return EXIT_USAGE;
	if (first < argc) {
		usage_error("unexpected argument '%s'", argv[first]);
		return EXIT_USAGE;
	}
	if (o.combined && !o.against) {
		usage_error("--combined needs --against DIR");
		return EXIT_USAGE;
	}
	if (o.dry_run && !o.repair) {
		usage_error("--dry-run goes with --repair");
		return EXIT_USAGE;
	}
	if (o.against && o.sample > 0 && o.sample < 1) {
		usage_error("--sample cannot be combined with --against (a sample cannot tell what is missing)");
		return EXIT_USAGE;
	}
	struct stat st;
	if (o.against && stat(o.against, &st) != 0) {
		warn_("%s", o.against);
		return EXIT_LOCAL;
	}
	/* stat() succeeded, so errno says nothing here. */
	if (o.against && !S_ISDIR(st.st_mode)) {
		warnx_("%s: %s", o.against, strerror(ENOTDIR));
		return EXIT_LOCAL;
	}
	struct run r = {.o = &o, .pout = stdout};
	if (o.combined && strcmp(o.combined, "-") == 0) {
		r.combined = stdout;
		r.pout = stderr;     /* stdout carries the report alone */
	} else if (o.combined && !(r.combined = fopen(o.combined, "w"))) {
		warn_("%s", o.combined);
		return EXIT_LOCAL;
	}
	o.norm_prefix = gfs_prefix_normalize(o.prefix);

	gfs_conn *conn = connect_or_warn();
	if (!conn) {
		if (r.combined && r.combined != stdout)
			fclose(r.combined);
		free(o.norm_prefix);
		return EXIT_USAGE;
	}
	/*
	 * A repair must not race an import: what looks orphaned or incomplete
	 * may be its work in progress. Import holds this lock while it writes.
	 */
	gfs_lock *lock = NULL;
	if (o.repair && !o.dry_run) {
		gfs_error lerr = {0};
		if (!(lock = gfs_lock_acquire(conn, GFS_IMPORT_LOCK, GFS_LOCK_DEFAULT_TTL, &lerr))) {
			snprintf(r.failure, sizeof r.failure, "%s", lerr.msg);
			if (o.json)
				summary(&r, 0, false);
			if (r.combined && r.combined != stdout)
				fclose(r.combined);
			free(o.norm_prefix);
			gfs_conn_close(conn);
			return fail(&lerr);
		}
	}
	/* A second ^C kills at once, even while the driver waits on the backend. */
	catch_interrupts(0, NULL);

	gfs_verify_opts vo = {
		.prefix = o.norm_prefix,
		.sample = o.sample,
		.seed = (uint64_t)time(NULL) ^ (uint64_t)getpid(),
		.threads = (int)o.threads,
		.strategy = o.strategy,
		.jobs = (int)o.jobs,
		.on_problem = on_problem,
		.on_file = on_file,
		.on_progress = on_progress,
		.ctx = &r,
		.stop = &stop_signal,
		.own_import_lock = lock != NULL,
	};
	double t0 = gfs_mono_seconds();
	gfs_error err = {0};
	bool ok = gfs_verify(conn, &vo, &r.st, &err);
	progress_done(r.prog);
	r.prog = NULL;
	int rc = EXIT_OK;
	if (!ok) {
		rc = fail(&err);
		if (err.code != GFS_ECANCELED)
			snprintf(r.failure, sizeof r.failure, "%s", err.msg);
	} else {
		gfs_session *s = gfs_session_pop(conn);
		if (o.against)
			rc = compare_disk(&r, s);
		if (rc == EXIT_OK && o.repair)
			repair(&r, s);
		gfs_session_push(s);
	}
	bool interrupted = stop_signal || rc == EXIT_INTERRUPTED;
	double secs = gfs_mono_seconds() - t0;
	uint64_t problems = r.st.problems + r.extra_problems;
	if (problems || !G.quiet || o.json)
		summary(&r, secs, interrupted);
	if (rc == EXIT_OK && interrupted)
		rc = EXIT_INTERRUPTED;
	if (rc == EXIT_OK && problems) {
		/* With --repair, success means every problem found is now gone. */
		bool all_fixed = o.repair && !o.dry_run && r.unrepaired == 0 && r.repaired > 0;
		rc = all_fixed ? EXIT_OK : EXIT_PARTIAL;
	}
	if (r.combined && r.combined != stdout && fclose(r.combined) != 0 && rc == EXIT_OK) {
		warn_("%s", o.combined);
		rc = EXIT_LOCAL;
	}
	if (lock)
		gfs_lock_release(lock);
	free_walk();
	free_run(&r);
	free(o.norm_prefix);
	gfs_conn_close(conn);
	return rc;
}

static const struct cmd_exit verify_exits[] = {
	{0, "no problem (or all repaired)"}, {1, "problems found"}, {2, "usage"}, {3, "backend"},
	{5, "DIR or the --combined file I/O"}, {6, "--repair while an import runs"},
	{130, "interrupted"}, {-1, NULL},
};

const struct cmd_entry cmd_verify_entry = {
	"verify", "check stored files for damage", NULL, verify_opts, verify_exits, cmd_verify,
};
