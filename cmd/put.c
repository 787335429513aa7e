/* gridfsctl put: store one file; older revisions go only once the new one is complete. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd.h"
#include "../lib/magic.h"
#include "../lib/markers.h"
#include "../lib/mirror/mirror.h"
#include "../lib/filename.h"
#include "../lib/select.h"

enum { OPT_CHUNK = 1, OPT_JSON, OPT_UNSAFE, OPT_ID, OPT_META, OPT_NAMEPREFIX };

struct put_opts {
	const char *name, *type, *name_prefix, *id_arg;
	bson_value_t id;
	bson_t *metadata;
	long keep;
	uint64_t chunk_size;
	bool json, allow_unsafe;
};

#define TO(field) CMD_TO(struct put_opts, field)

static const struct cmd_opt put_opts[] = {
	CMD_OPT(0, "name", "NAME", "stored name (default: the file's base name; required for '-')",
	        .id = 'N', .kind = CMD_STRING, .to = TO(name)),
	CMD_OPT_ALIAS('n', NULL, "NAME", "name"),
	CMD_OPT(0, "name-prefix", "P", "store each FILE as P/ and its base name", .id = OPT_NAMEPREFIX,
	        .kind = CMD_STRING, .to = TO(name_prefix)),
	CMD_OPT(0, "id", "ID", "the new file's _id: " ID_SYNTAX "; refused when taken", .id = OPT_ID),
	CMD_OPT(0, "metadata", "JSON", "a JSON object stored in metadata beside gridfsctl's own "
	        "fields (a key of theirs is refused)", .id = OPT_META),
	CMD_OPT('t', "type", "MIME", "content type (default: detected by libmagic)", .kind = CMD_STRING,
	        .to = TO(type)),
	CMD_OPT('k', "keep-revisions", "N", "keep the N newest revisions of the name in all "
	        "(default 1; 0 keeps every revision)", .kind = CMD_COUNT, .to = TO(keep), .max = 1000000,
	        .bad = "--keep-revisions takes a count, not '%s'"),
	CMD_OPT(0, "chunk-size", "SIZE", "chunk size (default 255K)", .id = OPT_CHUNK, .kind = CMD_BYTES,
	        .to = TO(chunk_size), .min = 1, .max = 15u << 20,
	        .bad = "--chunk-size takes a size from 1 byte to 15M, not '%s'"),
	CMD_OPT(0, "allow-unsafe-name", NULL, "store a NAME that mirror and get would refuse as a path",
	        .id = OPT_UNSAFE, .kind = CMD_SET, .to = TO(allow_unsafe)),
	CMD_OPT(0, "json", NULL, "print the stored file as one JSON object", .id = OPT_JSON,
	        .kind = CMD_SET, .to = TO(json)),
	CMD_OPT_END,
};

/* --metadata: a JSON object (libbson's parser) none of whose keys is one gridfsctl keeps itself. */
static int
metadata_option(const char *arg, struct put_opts *o)
{
	bson_error_t berr;
	bson_t *doc = bson_new_from_json((const uint8_t *)arg, -1, &berr);
	if (!doc) {
		warnx_("--metadata takes a JSON object: %s", berr.message);
		return -1;
	}
	bson_iter_t it;
	if (bson_iter_init(&it, doc)) {
		while (bson_iter_next(&it)) {
			if (!gfs_metadata_key_reserved(bson_iter_key(&it)))
				continue;
			warnx_("--metadata: '%s' is a field gridfsctl keeps itself; use another key",
			       bson_iter_key(&it));
			bson_destroy(doc);
			return -1;
		}
	}
	if (o->metadata)
		bson_destroy(o->metadata);
	o->metadata = doc;
	return 0;
}

/* --id and --metadata, read into values of their own. */
static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct put_opts *o = ctx;
	switch (opt) {
	case OPT_ID:
		o->id_arg = arg;
		bson_value_destroy(&o->id);
		return parse_id_option(arg, &o->id) ? 0 : -1;
	case OPT_META: return metadata_option(arg, o);
	}
	return -1;
}

/*
 * The source gathers the file's start for libmagic as it hands the reads on,
 * so content detection costs no second read of the file (stdin cannot be
 * reread), whatever the chunk size.
 */
struct sniff_source {
	int fd;
	gfs_put_opts *po;       /* receives the detected type */
	char *type;             /* detected MIME type, or NULL */
	const struct stat *st;  /* at open, for a named file; NULL for stdin */
	int64_t total;          /* bytes read so far */
	bool detect;
	gfs_sniff sniff;        /* the start gathered so far */
	bool changed;           /* the file changed while it was read */
	bool interrupted;       /* a stop signal came */
};

/* Fills buf unless the end comes first; gives up at a stop signal. */
static ssize_t
read_full(struct sniff_source *src, uint8_t *buf, size_t len)
{
	size_t got = 0;
	while (got < len) {
		if (stop_signal) {
			src->interrupted = true;
			errno = EINTR;
			return -1;
		}
		ssize_t r = read(src->fd, buf + got, len - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

/* A file rewritten while we read it would be stored as a mix of old and new bytes. */
static bool
unchanged(const struct sniff_source *src)
{
	const struct stat *then = src->st;
	struct stat now;
	if (fstat(src->fd, &now) < 0)
		return false;
	return src->total == then->st_size && now.st_size == then->st_size &&
	       now.st_mtim.tv_sec == then->st_mtim.tv_sec &&
	       now.st_mtim.tv_nsec == then->st_mtim.tv_nsec &&
	       now.st_ctim.tv_sec == then->st_ctim.tv_sec &&
	       now.st_ctim.tv_nsec == then->st_ctim.tv_nsec;
}

static void
sniff(struct sniff_source *src, const void *buf, size_t len)
{
	gfs_error err;
	gfs_magic *m = gfs_magic_open(&err);
	if (!m)
		return;
	src->type = strdup(gfs_magic_type(m, buf, len));
	src->po->content_type = src->type;
	gfs_magic_close(m);
}

static ssize_t
sniff_read(uint8_t *buf, size_t len, void *ctx)
{
	struct sniff_source *src = ctx;
	ssize_t r = read_full(src, buf, len);
	if (r < 0)
		return r;
	src->total += r;
	/* A short read means the end: gfs_put asks no more after it. */
	if ((size_t)r < len && src->st && !unchanged(src)) {
		src->changed = true;
		errno = EIO;
		return -1;
	}
	const void *head;
	size_t head_len;
	/* gfs_put asks no more after a short read: it is the last. */
	if (src->detect && gfs_sniff_add(&src->sniff, buf, (size_t)r, (size_t)r < len, &head, &head_len) &&
	    head_len > 0)
		sniff(src, head, head_len);
	return r;
}

static int
open_source(const char *path, struct stat *st)
{
	if (strcmp(path, "-") == 0) {
		if (fstat(STDIN_FILENO, st) < 0)
			memset(st, 0, sizeof *st);
		return STDIN_FILENO;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		warn_("%s", path);
		return -1;
	}
	if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode)) {
		if (S_ISDIR(st->st_mode))
			warnx_("%s: is a directory (use 'gridfsctl import')", path);
		else
			warnx_("%s: not a regular file", path);
		close(fd);
		return -1;
	}
	return fd;
}

/* What one put stores: where from, under which name. */
struct put_job {
	const char *path;       /* as given, for messages and --json */
	const char *name;       /* stored name, valid UTF-8 */
	const char *raw;        /* the name as given when it had to be escaped, else NULL */
	int fd;
	const struct stat *st;
};

/*
 * Readers get the revision that sorts first by uploadDate. The trim keeps
 * one dated later than ours (another writer's clock ahead, or a put that
 * finished after ours), and then what we stored is not what is read:
 * worth a warning, not a guard, so a race here harms nothing.
 */
static bool
newest_is(gfs_session *s, const char *name, const bson_value_t *id, gfs_error *err)
{
	gfs_file newest;
	if (!gfs_find_by_name(s, name, -1, &newest, err))
		return false;
	bool same = gfs_id_equal(&newest.id, id);
	gfs_file_free(&newest);
	if (!same)
		gfs_error_set(err, GFS_EINVAL, "a revision dated later than ours is kept, and readers "
		              "get that one (another writer's clock ahead of ours?)");
	return same;
}

static int
trim_revisions(gfs_session *s, const struct put_opts *o, const char *name, const gfs_file *f)
{
	if (o->keep == 0)
		return EXIT_OK;
	if (stop_signal) {
		warnx_("%s: stored, but interrupted before older revisions were removed (the next "
		       "put or import removes them)", name);
		return EXIT_INTERRUPTED;
	}
	gfs_error err;
	/* On failure the upload marker stays: the next put or import removes them. */
	if (!gfs_delete_old_revisions(s, name, (int)o->keep, &f->id, &err)) {
		warnx_("%s: stored, but older revisions were not removed: %s", name, err.msg);
		return EXIT_PARTIAL;
	}
	if (!gfs_put_trimmed(s, &f->id, &err)) {
		warnx_("%s: stored, but its upload marker was not removed (the next put or import "
		       "does): %s", name, err.msg);
		return EXIT_PARTIAL;
	}
	if (!newest_is(s, name, &f->id, &err)) {
		warnx_("%s: stored, but %s", name, err.msg);
		return EXIT_PARTIAL;
	}
	return EXIT_OK;
}

static int
put_failed(const struct put_job *j, const struct sniff_source *src, const gfs_error *err)
{
	if (src->interrupted) {
		warnx_("%s: interrupted; nothing stored", j->path);
		return EXIT_INTERRUPTED;
	}
	if (src->changed) {
		warnx_("%s: changed while it was read; nothing stored, older revisions kept", j->path);
		return EXIT_LOCAL;
	}
	if (err->code == GFS_ELOCAL) {
		warnx_("%s", err->msg);
		return EXIT_LOCAL;
	}
	return fail(err);
}

/* --json: the stored file (if any) and, when the put failed, the message that said why. */
static void
print_result(const struct put_job *j, const gfs_file *f, bool failed)
{
	bson_t doc = BSON_INITIALIZER;
	if (f)
		file_to_json(f, &doc);
	else
		BSON_APPEND_UTF8(&doc, "filename", j->name);
	BSON_APPEND_UTF8(&doc, "source", j->path);
	if (failed)
		BSON_APPEND_UTF8(&doc, "error", last_message());
	print_json(stdout, &doc);
	bson_destroy(&doc);
}

static int
upload(gfs_session *s, const struct put_opts *o, const struct put_job *j)
{
	struct sniff_source src = {
		.fd = j->fd,
		.detect = o->type == NULL,
		.st = j->fd == STDIN_FILENO ? NULL : j->st,
	};
	bson_t meta = BSON_INITIALIZER;
	if (o->metadata)
		bson_concat(&meta, o->metadata);
	if (S_ISREG(j->st->st_mode))
		gfs_metadata_from_stat(&meta, j->st);
	/* As import does: mirror and verify find the original bytes here. */
	if (j->raw)
		BSON_APPEND_BINARY(&meta, GFS_RAWNAME_FIELD, BSON_SUBTYPE_BINARY,
		                   (const uint8_t *)j->raw, (uint32_t)strlen(j->raw));
	gfs_put_opts po = {
		.filename = j->name,
		.content_type = o->type,
		.metadata = &meta,
		.chunk_size = (int32_t)o->chunk_size,
		.keep_revisions = (int)o->keep,
		.id = o->id_arg ? &o->id : NULL,
	};
	gfs_file f;
	gfs_error err;
	src.po = &po;
	bool ok = gfs_put(s, &po, sniff_read, &src, &f, &err);
	bson_destroy(&meta);
	gfs_sniff_free(&src.sniff);
	free(src.type);
	if (!ok) {
		int rc = put_failed(j, &src, &err);
		if (o->json)
			print_result(j, NULL, true);
		return rc;
	}
	int rc = trim_revisions(s, o, j->name, &f);
	if (o->json)
		print_result(j, &f, rc != EXIT_OK);
	gfs_file_free(&f);
	return rc;
}

/*
 * Looks again at the uploads recover_interrupted() took over: a chunk a
 * dead put had in flight may have landed since. The file is stored, so a
 * failure here is a warning: their markers stay for the next put or import.
 */
static void
settle_killed_puts(gfs_session *s)
{
	size_t removed;
	gfs_error err;
	if (!gfs_put_recover(s, &removed, &err))
		warnx_("stored, but could not look again at interrupted puts' uploads: %s", err.msg);
}

/*
 * The stored name: --name, else the base name (under --name-prefix), bytes
 * that are not UTF-8 as %XX.
 */
static char *
stored_name(const struct put_opts *o, const char *path, char **raw)
{
	char *pcopy = strdup(path);
	char *given = strdup(o->name ? o->name : basename(pcopy));
	free(pcopy);
	bool escaped;
	char *name = o->name_prefix ? gfs_stored_name(o->name_prefix, given, strlen(given), &escaped)
	                            : gfs_name_from_bytes(given, strlen(given), &escaped);
	if (escaped)
		*raw = given;
	else
		free(given);
	return name;
}

/* What one FILE is stored as; a usage error (2) when that name cannot be. */
static int
name_job(const struct put_opts *o, const char *path, struct put_job *j)
{
	*j = (struct put_job){.path = path, .fd = -1};
	char *raw = NULL;
	char *name = stored_name(o, path, &raw);
	gfs_error nerr;
	j->name = name;
	j->raw = raw;
	if (!*name) {
		usage_error("the stored name is empty");
		return EXIT_USAGE;
	}
	bool safe = gfs_mirror_name_check(name, strlen(name), &nerr) &&
	            (!raw || gfs_mirror_name_check(raw, strlen(raw), &nerr));
	if (!o->allow_unsafe && !safe) {
		char shown[GFS_NAME_SHOWN_MAX];
		warnx_("--name %s: %s, so mirror and get would refuse it as a path; "
		       "--allow-unsafe-name to store it anyway", shown_name(shown, name), nerr.msg);
		return EXIT_USAGE;
	}
	return EXIT_OK;
}

static void
free_job(struct put_job *j)
{
	free((char *)j->name);
	free((char *)j->raw);
}

/*
 * --id names a file that must not exist yet: chunks sent under an id that
 * has some would mix with them. Checked by equality on both collections
 * before the first chunk (a writer racing us to the same id still makes
 * the upload fail on the unique index, and then its chunks are not ours).
 */
static int
id_free(gfs_session *s, const struct put_opts *o)
{
	gfs_error err;
	int f = gfs_exists(s, s->files, "_id", &o->id, &err);
	int c = f == 0 ? gfs_exists(s, s->chunks, "files_id", &o->id, &err) : f;
	if (f < 0 || c < 0)
		return fail(&err);
	if (f == 0 && c == 0)
		return EXIT_OK;
	warnx_("--id %s: %s; nothing stored", o->id_arg, f ? "a file has this _id already"
	       : "chunks with this files_id are stored (an orphan: gridfsctl verify --repair)");
	return EXIT_USAGE;
}

static int
put_one(gfs_session *s, const struct put_opts *o, struct put_job *j, int rc)
{
	struct stat st;
	if (rc == EXIT_OK && stop_signal) {
		warnx_("%s: interrupted; nothing stored", j->path);
		rc = EXIT_INTERRUPTED;
	}
	if (rc == EXIT_OK && o->id_arg)
		rc = id_free(s, o);
	if (rc == EXIT_OK && (j->fd = open_source(j->path, &st)) < 0)
		rc = EXIT_LOCAL;
	if (rc != EXIT_OK) {
		if (o->json)
			print_result(j, NULL, true);
		return rc;
	}
	j->st = &st;
	rc = upload(s, o, j);
	if (j->fd != STDIN_FILENO)
		close(j->fd);
	return rc;
}

static int
by_name(const void *a, const void *b)
{
	return strcmp(((const struct put_job *)a)->name, ((const struct put_job *)b)->name);
}

/* Several FILEs: one name each, and no two the same (the second would replace the first). */
static int
check_jobs(const struct put_opts *o, struct put_job *jobs, size_t n)
{
	if (n > 1 && (o->name || o->id_arg)) {
		usage_error("--%s names one file: give one FILE, or --name-prefix",
		            o->name ? "name" : "id");
		return EXIT_USAGE;
	}
	for (size_t i = 0; i < n; i++)
		if (strcmp(jobs[i].path, "-") == 0 && (n > 1 || !o->name)) {
			usage_error(n > 1 ? "'-' (stdin) only alone" : "reading stdin needs --name");
			return EXIT_USAGE;
		}
	if (o->name && o->name_prefix) {
		usage_error("give --name or --name-prefix, not both");
		return EXIT_USAGE;
	}
	struct put_job *sorted = gfs_xcalloc(n, sizeof *sorted);
	memcpy(sorted, jobs, n * sizeof *sorted);
	qsort(sorted, n, sizeof *sorted, by_name);
	int rc = EXIT_OK;
	for (size_t i = 1; i < n && rc == EXIT_OK; i++)
		if (strcmp(sorted[i - 1].name, sorted[i].name) == 0) {
			usage_error("%s and %s would both be stored as %s", sorted[i - 1].path,
			            sorted[i].path, sorted[i].name);
			rc = EXIT_USAGE;
		}
	free(sorted);
	return rc;
}

static int
put_all(const struct put_opts *o, struct put_job *jobs, int n)
{
	gfs_conn *conn = connect_for_writes();
	if (!conn)
		return EXIT_USAGE;
	gfs_session *s = gfs_session_pop(conn);
	catch_interrupts(0, NULL);
	int first = recover_interrupted(s, NULL);
	struct tally all = {0};
	for (int i = 0; i < n; i++) {
		int r = put_one(s, o, &jobs[i], first);
		/* After the backend or a signal failed one, the rest only say they were not stored. */
		if (!tally_add(&all, r) && first == EXIT_OK)
			first = r;
	}
	if (all.nfail < n)
		settle_killed_puts(s);
	gfs_session_push(s);
	gfs_conn_close(conn);
	int rc = tally_status(&all);
	return rc;
}

static int
cmd_put(int argc, char **argv)
{
	struct put_opts o = {.keep = 1};
	int i = parse_options(argc, argv, &cmd_put_entry, on_opt, &o);
	int n = i < 0 ? 0 : argc - i, rc = i < 0 ? EXIT_USAGE : EXIT_OK;
	struct put_job *jobs = gfs_xcalloc(n > 0 ? (size_t)n : 1, sizeof *jobs);
	if (rc == EXIT_OK && n == 0) {
		usage_error("a FILE is required");
		rc = EXIT_USAGE;
	}
	for (int k = 0; rc == EXIT_OK && k < n; k++)
		rc = name_job(&o, argv[i + k], &jobs[k]);
	if (rc == EXIT_OK)
		rc = check_jobs(&o, jobs, (size_t)n);
	if (rc == EXIT_OK)
		rc = put_all(&o, jobs, n);
	for (int k = 0; k < n; k++)
		free_job(&jobs[k]);
	free(jobs);
	bson_value_destroy(&o.id);
	if (o.metadata)
		bson_destroy(o.metadata);
	return rc;
}

static const struct cmd_exit put_exits[] = {
	{0, "ok"}, {1, "stored but older revisions not removed"}, {2, "usage"}, {3, "backend"},
	{5, "FILE cannot be read or changed while read"}, {130, "interrupted"}, {-1, NULL},
};

const struct cmd_entry cmd_put_entry = {
	.name = "put",
	.summary = "store files, replacing older revisions when complete",
	.operands = "FILE...|-",
	.opts = put_opts,
	.exits = put_exits,
	.run = cmd_put,
};
