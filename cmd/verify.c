/*
 * gridfsctl verify: prove that what the bucket holds is intact, compare it
 * with a disk tree, and repair what can be repaired without losing data.
 *
 * The pass is lib/verify.c, the comparison with disk and the repairs
 * lib/verify_disk.c. This file parses options and prints what they report,
 * problems as they come, then repairs and a summary.
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
#include "../lib/filename.h"
#include "../lib/stoppable.h"
#include "../lib/verify.h"
#include "../lib/verify_disk.h"
#include "cmd.h"

enum {
	OPT_AGAINST = 0x2000,
	OPT_COMBINED,
	OPT_REPAIR,
	OPT_JSON,
	OPT_SAMPLE,
	OPT_THREADS,
	OPT_STRATEGY,
	OPT_STRATEGY_OLD,
	OPT_GRACE,
	OPT_SEAL,
	OPT_STRICT,
	OPT_HOLD,
};

/* Orphan chunks younger than this may belong to an upload in progress. */
#define DEFAULT_GRACE_S 3600

struct vopts {
	const char *prefix;
	char *norm_prefix;
	const char *against;
	const char *combined;
	bool repair, dry_run, json, seal, strict;
	double sample;
	long threads;
	long grace;
	long jobs;
	size_t hold;
	enum gfs_read_strategy strategy;
	struct name_filter filter;
};

#define TO(field) CMD_TO(struct vopts, field)

static const struct cmd_opt verify_opts[] = {
	PREFIX_OPT("check only files whose names start with P (orphan chunks are looked for only "
	           "without --prefix and --sample)", .kind = CMD_STRING, .to = TO(prefix)),
	CMD_OPT_GROUP(filter_opts),
	CMD_OPT(0, "against", "DIR", "also compare with a disk tree: missing in GridFS, missing on "
	        "disk, content differs (size, then sha256)", .id = OPT_AGAINST, .kind = CMD_STRING,
	        .to = TO(against)),
	CMD_OPT(0, "combined", "FILE", "with --against, write an rclone-style report to FILE ('-' for "
	        "stdout): '= path' same, '- path' only on disk, '+ path' only in GridFS, '* path' "
	        "differs, '! path' damaged in GridFS", .id = OPT_COMBINED, .kind = CMD_STRING,
	        .to = TO(combined)),
	CMD_OPT(0, "repair", NULL, "remove orphan chunks, incomplete uploads and extra chunks; with "
	        "--against re-upload missing or damaged files from disk", .id = OPT_REPAIR,
	        .kind = CMD_SET, .to = TO(repair)),
	CMD_OPT(0, "grace", "SECONDS", "with --repair, leave orphan chunks younger than this (default "
	        "3600: they may be an upload in progress)", .id = OPT_GRACE, .kind = CMD_COUNT,
	        .to = TO(grace), .max = 100L * 365 * 86400,
	        .bad = "--grace wants seconds (0 or more), not '%s'"),
	CMD_OPT(0, "seal", NULL, "store the sha256 of each whole file that has no hash (as other "
	        "drivers write them) in metadata.sha256 and metadata.sealedAt", .id = OPT_SEAL,
	        .kind = CMD_SET, .to = TO(seal)),
	CMD_OPT(0, "strict", NULL, "a file with no hash (unsealed) is a problem (UNVERIFIABLE, exit 1)",
	        .id = OPT_STRICT, .kind = CMD_SET, .to = TO(strict)),
	CMD_OPT('n', "dry-run", NULL, "with --repair or --seal, show what would be done and do nothing",
	        .kind = CMD_SET, .to = TO(dry_run)),
	CMD_OPT(0, "json", NULL, "one JSON object per problem and repair, then a summary object",
	        .id = OPT_JSON, .kind = CMD_SET, .to = TO(json)),
	CMD_OPT(0, "sample", "N%", "check a random N percent of the files", .id = OPT_SAMPLE),
	CMD_OPT(0, "threads", "N", "hashing threads (default: from the CPU count)", .id = OPT_THREADS,
	        .kind = CMD_COUNT, .to = TO(threads), .min = 1, .max = 16,
	        .bad = "--threads wants a number from 1 to 16, not '%s'"),
	CMD_OPT(0, "read", "MODE", "how chunks are read: auto (default: scan for the whole bucket, "
	        "else what the server serves from an index), scan (one pass over all chunks in "
	        "natural order) or each (a query per file, --jobs at once; batched is the same)",
	        .id = OPT_STRATEGY, .values = "auto scan batched each"),
	CMD_OPT_ALIAS(0, "strategy", "MODE", "read", .id = OPT_STRATEGY_OLD),
	CMD_OPT(0, "hold", "SIZE", "scan: chunks kept while they wait for their turn (default 64M); "
	        "past it their files are read again one by one", .id = OPT_HOLD),
	CMD_OPT('j', "jobs", "N", "connections reading at once with the each strategy (default 4)",
	        .kind = CMD_COUNT, .to = TO(jobs), .min = 1, .max = 32,
	        .bad = "--jobs wants a number from 1 to 32, not '%s'"),
	CMD_OPT_END,
};


struct run {
	struct vopts *o;
	FILE *pout;               /* where problem lines go */
	FILE *combined;
	gfs_verify_stats st;
	gfs_verify_disk *disk;    /* what the comparison and the repairs need */
	const gfs_verify_disk_stats *dst;
	struct progress *prog;
	char failure[600];        /* why the run could not finish; "" when it did */
	uint64_t unverifiable;    /* files the pass found with no hash (UNVERIFIABLE) */
	uint64_t sealed;          /* of those, sealed by --seal */
	gfs_seal *seals;          /* --seal: the whole ones, sealed after the pass */
	size_t nseals, capseals;
	char *folder;             /* the first folder of every stored name, while they share one */
	bool folders;             /* stored names in more than one folder, or at the top */
	/* What the pass has done so far, for a summary while it still runs (gfs_run_stoppable). */
	atomic_uint_fast64_t seen_files, seen_bytes, total_files, shown_problems;
};

/* --sample, --read, --hold and the name filters. */
static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct vopts *o = ctx;
	switch (opt) {
	case OPT_SAMPLE:
		if (!gfs_verify_parse_percent(arg, &o->sample)) {
			usage_error("--sample wants a percentage in (0, 100], like 5%%, not '%s'", arg);
			return -1;
		}
		return 0;
	case OPT_STRATEGY: return read_option("read", arg, &o->strategy);
	case OPT_HOLD: return hold_option(arg, &o->hold);
	}
	return filter_option(opt, arg, &o->filter) == 0 ? 0 : -1;
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
             const char *detail, const gfs_verify_problem *p, const gfs_verify_disk_event *ev)
{
	if (!(p && p->kind == GFS_VK_IN_PROGRESS))
		atomic_fetch_add(&r->shown_problems, 1);
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
	if (ev && ev->rel)
		json_path(&doc, ev->rel, ev->rel_len);
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
	/*
	 * A file with no hash (other drivers write none) is counted as unsealed,
	 * a problem only with --strict; a disk copy can still prove it.
	 */
	if (p->kind == GFS_VK_UNVERIFIABLE) {
		r->unverifiable++;
		if (!r->o->strict) {
			if (r->o->against)
				gfs_verify_disk_problem(r->disk, p);
			return;
		}
	}
	if (r->prog)
		fputs("\r\033[K", stderr);
	char detail[sizeof p->detail + 64];
	snprintf(detail, sizeof detail, "%s%s", p->detail, bad_doc_hint(p));
	emit_problem(r, gfs_verify_kind_name(p->kind), p->filename, p->id, detail, p, NULL);
	fflush(r->pout);
	gfs_verify_disk_problem(r->disk, p);
}

/* Keeps the first folder all stored names share, for the hint of compare_disk(). */
static void
note_folder(struct run *r, const char *name)
{
	if (r->folders || !name)
		return;
	const char *slash = strchr(name, '/');
	size_t len = slash ? (size_t)(slash - name) : 0;
	if (len == 0 || (r->folder && (strlen(r->folder) != len || strncmp(r->folder, name, len) != 0))) {
		r->folders = true;
		return;
	}
	if (!r->folder)
		r->folder = gfs_xstrndup(name, len);
}

static void
on_file(const gfs_verify_file *v, void *ctx)
{
	struct run *r = ctx;
	if (r->o->against && !r->o->norm_prefix[0])
		note_folder(r, v->file->filename);
	gfs_verify_disk_file(r->disk, v);
	/* Exactly the files counted unsealed, when their chunks are whole. */
	if (r->o->seal && v->intact && v->sha256[0] && v->file->length > 0 &&
	    gfs_verify_unsealed(v->file)) {
		GFS_GROW(r->seals, r->nseals + 1, r->capseals, 64);
		gfs_seal_init(&r->seals[r->nseals++], v->file, v->sha256);
	}
}

static void
on_progress(uint64_t files, uint64_t bytes, void *ctx)
{
	struct run *r = ctx;
	atomic_store(&r->seen_files, files);
	atomic_store(&r->seen_bytes, bytes);
	atomic_store(&r->total_files, r->st.files);
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
	if (!r->o->json) {
		char *ids = id ? gfs_id_string(id) : NULL;
		action_line(r->pout, r->o->dry_run, "%s %s %s: %s", state, action,
		            name ? name : ids ? ids : "-", detail);
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

static void
on_disk_event(const gfs_verify_disk_event *ev, void *ctx)
{
	struct run *r = ctx;
	if (ev->kind == GFS_VD_PROBLEM)
		emit_problem(r, ev->what, ev->name, ev->id, ev->detail, NULL, ev);
	else if (ev->kind == GFS_VD_REPAIR)
		emit_repair(r, ev->what, ev->name, ev->id, ev->detail, ev->ok);
	else if (r->combined)
		human_line(r->combined, "%c %s", ev->mark, ev->name);
}

/* One line per file --seal sealed, would seal, or could not. */
static void
emit_seal(struct run *r, const gfs_seal *sl, const char *why)
{
	const char *state = r->o->dry_run ? "WOULD seal" : why ? "NOT-SEALED" : "SEALED";
	if (!r->o->json) {
		char *ids = gfs_id_string(&sl->id);
		if (why)
			action_line(r->pout, r->o->dry_run, "%s %s: %s", state,
			            sl->filename ? sl->filename : ids, why);
		else
			action_line(r->pout, r->o->dry_run, "%s %s: sha256 %s%s", state,
			            sl->filename ? sl->filename : ids, sl->sha256, r->o->dry_run ? "" : " stored");
		free(ids);
		return;
	}
	bson_t doc;
	json_event(&doc, "seal");
	json_filename(&doc, sl->filename);
	append_id(&doc, "id", &sl->id);
	BSON_APPEND_UTF8(&doc, "sha256", sl->sha256);
	if (why)
		BSON_APPEND_UTF8(&doc, "detail", why);
	if (r->o->dry_run)
		BSON_APPEND_BOOL(&doc, "dryRun", true);
	else
		BSON_APPEND_BOOL(&doc, "sealed", why == NULL);
	print_json(r->pout, &doc);
	bson_destroy(&doc);
}

/* --seal, after the pass: each whole file without a hash gets one; an exit status. */
static int
seal_files(struct run *r, gfs_session *s)
{
	int64_t now = gfs_now_ms();
	for (size_t i = 0; i < r->nseals; i++) {
		if (stop_signal)
			return EXIT_INTERRUPTED;
		gfs_error err = {0};
		int rc = r->o->dry_run ? 1 : gfs_verify_seal(s, &r->seals[i], now, &err);
		if (rc < 0) {
			snprintf(r->failure, sizeof r->failure, "%s", err.msg);
			return fail(&err);
		}
		emit_seal(r, &r->seals[i], rc ? NULL : err.msg);
		r->sealed += rc && !r->o->dry_run;
	}
	return EXIT_OK;
}

/* The comparison with --against DIR; an exit status. */
static int
compare_disk(struct run *r, gfs_session *s)
{
	/* Every stored name under one folder that DIR does not have: each would be MISSING. */
	char *there = r->folder && !r->folders ? gfs_xasprintf("%s/%s", r->o->against, r->folder) : NULL;
	struct stat st;
	if (there && lstat(there, &st) != 0)
		warnx_("every stored name is under '%s/', and %s has no '%s': did you mean "
		       "'--prefix %s'?", r->folder, r->o->against, r->folder, r->folder);
	free(there);
	gfs_error err = {0};
	if (gfs_verify_disk_compare(r->disk, s, &err))
		return EXIT_OK;
	if (err.code == GFS_ECANCELED)
		return EXIT_INTERRUPTED;
	warnx_("%s", err.msg);
	snprintf(r->failure, sizeof r->failure, "%s", err.msg);
	return EXIT_LOCAL;
}

/* ---- summary --------------------------------------------------------- */

/* Files still without a hash after the run. */
static uint64_t
unsealed(const struct run *r)
{
	return r->unverifiable - r->sealed;
}

/* Problems of the pass and of the disk comparison; unsealed files are some only with --strict. */
static uint64_t
problem_count(const struct run *r)
{
	return r->st.problems - r->unverifiable + (r->o->strict ? unsealed(r) : 0) + r->dst->problems;
}

/*
 * The summary of a run stopped before its end says what it did not
 * check: "no problems" would vouch for files never read. total is 0 when
 * the stop came before the files were listed.
 */
static void
interrupted_line(const struct run *r, double secs, uint64_t checked, uint64_t total,
                 uint64_t bytes, uint64_t problems)
{
	if (total == 0) {
		action_line(r->pout, r->o->dry_run, "verify: interrupted after %.1f s, before the files "
		            "were listed: nothing was checked", secs);
		return;
	}
	char size[32];
	human_bytes((double)bytes, size, sizeof size);
	action_line(r->pout, r->o->dry_run, "verify: interrupted after %.1f s: %llu files not checked "
	            "(%llu of %llu checked, %s); %llu problem%s found in those", secs,
	            (unsigned long long)(total - (checked < total ? checked : total)),
	            (unsigned long long)checked, (unsigned long long)total, size,
	            (unsigned long long)problems, problems == 1 ? "" : "s");
}

static void
summary(struct run *r, double secs, bool interrupted)
{
	uint64_t problems = problem_count(r);
	if (r->o->json) {
		struct json_summary sum;
		json_summary_begin(&sum, "verify", r->o->dry_run);
		bson_t *doc = &sum.body, kinds;
		BSON_APPEND_INT64(doc, "files", (int64_t)r->st.files);
		BSON_APPEND_INT64(doc, "checked", (int64_t)r->st.files_checked);
		BSON_APPEND_INT64(doc, "chunks", (int64_t)r->st.chunks);
		BSON_APPEND_INT64(doc, "bytes", (int64_t)r->st.bytes);
		BSON_APPEND_INT64(doc, "problems", (int64_t)problems);
		BSON_APPEND_DOCUMENT_BEGIN(doc, "counts", &kinds);
		for (int k = 0; k <= GFS_VK_BAD_DOC; k++)
			if (r->st.by_kind[k] && (k != GFS_VK_UNVERIFIABLE || r->o->strict))
				BSON_APPEND_INT64(&kinds, gfs_verify_kind_name(k), (int64_t)r->st.by_kind[k]);
		if (r->dst->only_disk)
			BSON_APPEND_INT64(&kinds, "MISSING-IN-GRIDFS", (int64_t)r->dst->only_disk);
		if (r->dst->only_gridfs)
			BSON_APPEND_INT64(&kinds, "MISSING-ON-DISK", (int64_t)r->dst->only_gridfs);
		if (r->dst->differ)
			BSON_APPEND_INT64(&kinds, "DIFFERS", (int64_t)r->dst->differ);
		bson_append_document_end(doc, &kinds);
		BSON_APPEND_BOOL(doc, "orphansChecked", r->st.orphans_checked);
		BSON_APPEND_UTF8(doc, "read", gfs_read_strategy_name(r->st.strategy));
		BSON_APPEND_INT64(doc, "inProgress", (int64_t)r->st.in_progress);
		BSON_APPEND_INT64(doc, "unsealed", (int64_t)unsealed(r));
		if (r->o->seal)
			BSON_APPEND_INT64(doc, "sealed", (int64_t)r->sealed);
		if (r->o->against) {
			BSON_APPEND_INT64(doc, "same", (int64_t)r->dst->same);
			BSON_APPEND_INT64(doc, "damaged", (int64_t)r->dst->damaged);
		}
		if (r->o->repair) {
			BSON_APPEND_INT64(doc, "repaired", (int64_t)r->dst->repaired);
			BSON_APPEND_INT64(doc, "unrepaired", (int64_t)r->dst->unrepaired);
		}
		sum.interrupted = interrupted;
		/* Exit 1 or 130 is a failed run, and says why. */
		char why[64] = "";
		bool fixed = r->o->repair && !r->o->dry_run && r->dst->unrepaired == 0 && r->dst->repaired > 0;
		uint64_t left = r->st.files > r->st.files_checked ? r->st.files - r->st.files_checked : 0;
		if (interrupted)
			BSON_APPEND_INT64(doc, "notChecked", (int64_t)left);
		if (problems && !fixed)
			snprintf(why, sizeof why, "%llu problem%s found", (unsigned long long)problems,
			         problems == 1 ? "" : "s");
		else if (interrupted)
			snprintf(why, sizeof why, "interrupted: %llu files not checked",
			         (unsigned long long)left);
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
	if (interrupted) {
		interrupted_line(r, secs, r->st.files_checked, r->st.files, r->st.bytes, problems);
		return;
	}
	fprintf(out, "verify: %llu files, %llu bytes in %.1f s: ", (unsigned long long)r->st.files_checked,
	        (unsigned long long)r->st.bytes, secs);
	if (!problems)
		fprintf(out, "no problems");
	else
		fprintf(out, "%llu problem%s", (unsigned long long)problems, problems == 1 ? "" : "s");
	/* Both count problems: a repair in two steps (reupload, then remove) is one. */
	if (r->o->repair && !r->o->dry_run)
		fprintf(out, "%s %llu repaired, %llu not", problems ? ":" : ",",
		        (unsigned long long)r->dst->repaired, (unsigned long long)r->dst->unrepaired);
	if (r->sealed)
		fprintf(out, ", %llu sealed", (unsigned long long)r->sealed);
	if (unsealed(r))
		fprintf(out, " (%llu unsealed: no hash stored%s)", (unsigned long long)unsealed(r),
		        r->o->seal ? "" : "; 'verify --seal' stores one");
	if (r->st.in_progress)
		fprintf(out, " (%llu upload%s in progress left alone)", (unsigned long long)r->st.in_progress,
		        r->st.in_progress == 1 ? "" : "s");
	if (!r->st.orphans_checked)
		fprintf(out, " (orphan chunks not checked: only without --prefix and --sample)");
	if (r->o->dry_run)
		fprintf(out, " %s", DRY_RUN_MARK);
	fputc('\n', out);
}

/* A file (its name below --prefix, or its path below DIR) the name filters take. */
static bool
filtered_in(const char *rel, void *ctx)
{
	const struct run *r = ctx;
	return filter_selects(&r->o->filter, rel);
}

/* The pass, then the comparison and the repairs; an exit status. */
static int
check(struct run *r, gfs_conn *conn, bool own_lock)
{
	struct vopts *o = r->o;
	gfs_verify_opts vo = {
		.prefix = o->norm_prefix,
		.sample = o->sample,
		.seed = (uint64_t)time(NULL) ^ (uint64_t)getpid(),
		.threads = (int)o->threads,
		.strategy = o->strategy,
		.jobs = (int)o->jobs,
		.hold_bytes = o->hold,
		.on_problem = on_problem,
		.on_file = on_file,
		.on_progress = on_progress,
		.select = filter_active(&o->filter) ? filtered_in : NULL,
		.ctx = r,
		.stop = &stop_signal,
		.own_import_lock = own_lock,
	};
	gfs_error err = {0};
	bool ok = gfs_verify(conn, &vo, &r->st, &err);
	progress_done(r->prog);
	r->prog = NULL;
	if (!ok) {
		if (err.code != GFS_ECANCELED)
			snprintf(r->failure, sizeof r->failure, "%s", err.msg);
		return fail(&err);
	}
	int rc = EXIT_OK;
	gfs_session *s = gfs_session_pop(conn);
	if (o->seal)
		rc = seal_files(r, s);
	if (rc == EXIT_OK && o->against)
		rc = compare_disk(r, s);
	if (rc == EXIT_OK && o->repair)
		gfs_verify_disk_repair(r->disk, s);
	gfs_session_push(s);
	return rc;
}

/*
 * Asked to stop while the pass waits on the backend: say what was not
 * checked, from what the pass reported so far, and leave the pass where it
 * is. The import lock, if held, is released; the rest goes with the process.
 */
static _Noreturn void
abandon(struct run *r, gfs_lock *lock, double secs)
{
	uint64_t checked = atomic_load(&r->seen_files), total = atomic_load(&r->total_files);
	uint64_t bytes = atomic_load(&r->seen_bytes), problems = atomic_load(&r->shown_problems);
	if (r->o->json) {
		struct json_summary sum;
		json_summary_begin(&sum, "verify", r->o->dry_run);
		BSON_APPEND_INT64(&sum.body, "files", (int64_t)total);
		BSON_APPEND_INT64(&sum.body, "checked", (int64_t)checked);
		BSON_APPEND_INT64(&sum.body, "bytes", (int64_t)bytes);
		BSON_APPEND_INT64(&sum.body, "problems", (int64_t)problems);
		BSON_APPEND_INT64(&sum.body, "notChecked", (int64_t)(total > checked ? total - checked : 0));
		sum.interrupted = true;
		char why[80];
		snprintf(why, sizeof why, "interrupted: %llu files not checked",
		         (unsigned long long)(total > checked ? total - checked : 0));
		json_summary_end(r->pout, &sum, secs, total ? why : "interrupted before the files were listed");
	} else {
		interrupted_line(r, secs, checked, total, bytes, problems);
	}
	fflush(r->pout);
	if (lock)
		gfs_lock_release(lock);
	fflush(NULL);
	_exit(EXIT_INTERRUPTED);
}

struct check_job {
	struct run *r;
	gfs_conn *conn;
	bool own_lock;
	int rc;
};

static void
run_check(void *p)
{
	struct check_job *j = p;
	j->rc = check(j->r, j->conn, j->own_lock);
}

/* How long a pass asked to stop may take to come back before it is left behind. */
#define STOP_GRACE_MS 300

/* The exit status of a run that went to its end: interrupted, problems left, or written out. */
static int
conclude(struct run *r, int rc, double secs)
{
	struct vopts *o = r->o;
	bool interrupted = stop_signal || rc == EXIT_INTERRUPTED;
	uint64_t problems = problem_count(r);
	/* -q: the problem lines alone, unless the run could not say all it should. */
	if (!G.quiet || o->json || interrupted || r->failure[0])
		summary(r, secs, interrupted);
	if (rc == EXIT_OK && interrupted)
		rc = EXIT_INTERRUPTED;
	if (rc == EXIT_OK && problems) {
		/* With --repair, success means every problem found is now gone. */
		bool all_fixed = o->repair && !o->dry_run && r->dst->unrepaired == 0 && r->dst->repaired > 0;
		rc = all_fixed ? EXIT_OK : EXIT_PARTIAL;
	}
	if (r->combined && r->combined != stdout && fclose(r->combined) != 0 && rc == EXIT_OK) {
		warn_("%s", o->combined);
		rc = EXIT_LOCAL;
	}
	r->combined = NULL;
	return rc;
}

static void
end_run(struct run *r)
{
	if (r->combined && r->combined != stdout)
		fclose(r->combined);
	gfs_verify_disk_free(r->disk);
	for (size_t i = 0; i < r->nseals; i++)
		gfs_seal_free(&r->seals[i]);
	free(r->seals);
	free(r->o->norm_prefix);
	free(r->folder);
}

static int
run_verify(struct vopts *o)
{
	struct run r = {.o = o, .pout = stdout};
	if (o->combined && strcmp(o->combined, "-") == 0) {
		r.combined = stdout;
		r.pout = stderr;     /* stdout carries the report alone */
	} else if (o->combined && !(r.combined = fopen(o->combined, "w"))) {
		warn_("%s", o->combined);
		return EXIT_LOCAL;
	}
	o->norm_prefix = gfs_prefix_normalize(o->prefix);
	gfs_verify_disk_opts dopts = {
		.dir = o->against,
		.prefix = o->norm_prefix,
		.repair = o->repair,
		.dry_run = o->dry_run,
		.grace_s = o->grace,
		.on_event = on_disk_event,
		.select = filter_active(&o->filter) ? filtered_in : NULL,
		.ctx = &r,
		.stop = &stop_signal,
	};
	r.disk = gfs_verify_disk_new(&dopts);
	r.dst = gfs_verify_disk_stats_of(r.disk);

	gfs_conn *conn = connect_or_warn();
	if (!conn) {
		end_run(&r);
		return EXIT_USAGE;
	}
	/* A repair is decided from what the primary says; a report from what a rollback keeps. */
	if (o->repair && !o->dry_run)
		gfs_conn_read_primary(conn);
	gfs_conn_read_majority(conn);
	/*
	 * A repair must not race an import: what looks orphaned or incomplete
	 * may be its work in progress. Import holds this lock while it writes.
	 */
	gfs_lock *lock = NULL;
	char *lock_name = gfs_lock_scoped_name(GFS_IMPORT_LOCK, o->norm_prefix);
	if (o->repair && !o->dry_run) {
		gfs_error lerr = {0};
		if (!(lock = gfs_lock_acquire_numbered(conn, lock_name, GFS_LOCK_DEFAULT_TTL, &lerr))) {
			free(lock_name);
			snprintf(r.failure, sizeof r.failure, "%s", lerr.msg);
			if (o->json)
				summary(&r, 0, false);
			end_run(&r);
			gfs_conn_close(conn);
			return fail(&lerr);
		}
		if (gfs_lock_note(lock))
			warnx_("%s", gfs_lock_note(lock));
		/* What killed writers left is finished before the pass, which then finds it gone. */
		gfs_session *s = gfs_session_pop(conn);
		int rc = recover_interrupted(s, lock_name);
		gfs_session_push(s);
		if (rc != EXIT_OK) {
			free(lock_name);
			snprintf(r.failure, sizeof r.failure, "%s", last_message());
			if (o->json)
				summary(&r, 0, false);
			gfs_lock_release(lock);
			end_run(&r);
			gfs_conn_close(conn);
			return rc;
		}
	}
	/* A second ^C kills at once, even while the driver waits on the backend. */
	free(lock_name);
	catch_interrupts(0, NULL);
	double t0 = gfs_mono_seconds();
	struct check_job job = {.r = &r, .conn = conn, .own_lock = lock != NULL};
	if (!gfs_run_stoppable(run_check, &job, &stop_signal, STOP_GRACE_MS))
		abandon(&r, lock, gfs_mono_seconds() - t0);
	int rc = conclude(&r, job.rc, gfs_mono_seconds() - t0);
	if (lock)
		gfs_lock_release(lock);
	end_run(&r);
	gfs_conn_close(conn);
	return rc;
}

/* Parses and checks the command line into *o (whose filter the caller frees), then runs. */
static int
verify_main(int argc, char **argv, struct vopts *o)
{
	int first = parse_options(argc, argv, &cmd_verify_entry, on_opt, o);
	if (first < 0)
		return EXIT_USAGE;
	if (first < argc) {
		usage_error("unexpected argument '%s'", argv[first]);
		return EXIT_USAGE;
	}
	if (o->combined && !o->against) {
		usage_error("--combined needs --against DIR");
		return EXIT_USAGE;
	}
	if (o->dry_run && !o->repair && !o->seal) {
		usage_error("--dry-run goes with --repair or --seal");
		return EXIT_USAGE;
	}
	if (o->against && o->sample > 0 && o->sample < 1) {
		usage_error("--sample cannot be combined with --against (a sample cannot tell what is missing)");
		return EXIT_USAGE;
	}
	struct stat st;
	if (o->against && stat(o->against, &st) != 0) {
		warn_("%s", o->against);
		return EXIT_LOCAL;
	}
	/* stat() succeeded, so errno says nothing here. */
	if (o->against && !S_ISDIR(st.st_mode)) {
		warnx_("%s: %s", o->against, strerror(ENOTDIR));
		return EXIT_LOCAL;
	}
	return run_verify(o);
}

static int
cmd_verify(int argc, char **argv)
{
	struct vopts o = {.strategy = GFS_READ_AUTO, .grace = DEFAULT_GRACE_S};
	int rc = verify_main(argc, argv, &o);
	free_name_filter(&o.filter);
	return rc;
}

static const struct cmd_exit verify_exits[] = {
	{0, "no problem (or all repaired)"}, {1, "problems found"}, {2, "usage"}, {3, "backend"},
	{5, "DIR or the --combined file I/O"}, {6, "--repair while an import runs"},
	{130, "interrupted"}, {-1, NULL},
};

const struct cmd_entry cmd_verify_entry = {
	.name = "verify",
	.summary = "check stored files for damage",
	.opts = verify_opts,
	.exits = verify_exits,
	.run = cmd_verify,
};
