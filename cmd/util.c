/* Helpers the verbs share: argument parsers, lookups, tallies, stdout's close. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "../lib/markers.h"
#include "../lib/maxdelete.h"
#include "../lib/filename.h"
#include "../lib/sdnotify.h"
#include "../lib/select.h"

/*
 * What a verb printed is only written when stdout is flushed and closed: a
 * full disk or a closed pipe then is an error like any other write error.
 * A verb that already failed keeps its own, more specific, exit status.
 */
int
close_stdout(int rc)
{
	errno = 0;
	bool failed = fflush(stdout) != 0;
	int e = errno;
	failed |= ferror(stdout) != 0;
	if (fclose(stdout) != 0 && !failed) {
		failed = true;
		e = errno;
	}
	if (!failed)
		return rc;
	if (e)
		warnx_("cannot write to standard output: %s", strerror(e));
	else
		warnx_("cannot write to standard output");
	return rc == EXIT_OK ? EXIT_LOCAL : rc;
}

void
file_to_json(const gfs_file *f, bson_t *out)
{
	char *id = gfs_id_string(&f->id);
	char date[32];
	gfs_iso8601(f->upload_date, date);
	BSON_APPEND_UTF8(out, "id", id);
	BSON_APPEND_UTF8(out, "filename", f->filename ? f->filename : "");
	BSON_APPEND_INT64(out, "length", f->length);
	BSON_APPEND_INT32(out, "chunkSize", f->chunk_size);
	BSON_APPEND_INT64(out, "chunks", gfs_chunk_count(f->length, f->chunk_size));
	BSON_APPEND_UTF8(out, "uploadDate", date);
	if (f->content_type)
		BSON_APPEND_UTF8(out, "contentType", f->content_type);
	else
		BSON_APPEND_NULL(out, "contentType");
	if (f->sha256[0])
		BSON_APPEND_UTF8(out, "sha256", f->sha256);
	if (f->md5[0])
		BSON_APPEND_UTF8(out, "md5", f->md5);
	free(id);
}

bool
parse_id_option(const char *arg, bson_value_t *out)
{
	gfs_error err;
	if (gfs_id_parse_typed(arg, out, &err))
		return true;
	usage_error("--id: %s", err.msg);
	return false;
}

bool
tally_add(struct tally *t, int rc)
{
	t->n++;
	if (rc != EXIT_OK) {
		t->nfail++;
		/* The first grave failure is the one to report: what came after followed from it. */
		if (!tally_grave(t->last))
			t->last = rc;
	}
	return !tally_grave(rc);
}

bool
tally_grave(int rc)
{
	return rc == EXIT_BACKEND || rc == EXIT_INTERRUPTED || rc == EXIT_USAGE || rc == EXIT_LIMIT;
}

int
tally_status(const struct tally *t)
{
	if (t->nfail == 0)
		return EXIT_OK;
	return tally_grave(t->last) || t->nfail == t->n ? t->last : EXIT_PARTIAL;
}

int
select_operand(const char *operand, const char *regex, gfs_match *m)
{
	gfs_error err;
	if (regex && operand) {
		usage_error("give a PREFIX, a PATTERN or --regex, not two of them");
		return -1;
	}
	if (regex && !gfs_match_regex(m, regex, &err)) {
		usage_error("--regex: %s", err.msg);
		return -1;
	}
	if (!regex && operand && gfs_has_glob(operand))
		gfs_match_glob(m, operand);
	else if (!regex)
		gfs_match_text(m, operand);
	return 0;
}

/* Resolves NAME (with revision) or --id ID to a files document. */
int
lookup_file(gfs_session *s, const char *name, const char *id_hex, int revision, gfs_file *out)
{
	gfs_error err;
	bool ok;
	if (id_hex) {
		bson_value_t id;
		if (!parse_id_option(id_hex, &id))
			return EXIT_USAGE;
		ok = gfs_find_by_id(s, &id, out, &err);
		bson_value_destroy(&id);
	} else {
		ok = gfs_find_by_name(s, name, revision, out, &err);
	}
	return ok ? EXIT_OK : fail(&err);
}

/* Validates the NAME | --id choice common to get, stat and rm. */
bool
one_target(int nargs, const char *id_hex)
{
	if (id_hex && nargs > 0) {
		usage_error("give a NAME or --id, not both");
		return false;
	}
	if (!id_hex && nargs != 1) {
		usage_error(nargs ? "too many arguments" : "a NAME or --id is required");
		return false;
	}
	return true;
}

/* The --rev argument of get and stat: -1 newest, -2 the one before, 0 the original, ... */
int
parse_rev_option(const char *arg, long *rev)
{
	if (parse_int(arg, -1000000, 1000000, rev))
		return 0;
	usage_error("--rev takes an integer, not '%s'", arg);
	return -1;
}

/* Appends a repeatable option's argument (--include, --exclude) to its list. */
void
add_glob(const char ***list, size_t *n, const char *arg)
{
	*list = gfs_xreallocarray(*list, *n + 1, sizeof **list);
	(*list)[(*n)++] = arg;
}

char *
uri_with_option(const char *uri, const char *name, long value)
{
	char key[64];
	snprintf(key, sizeof key, "%s=", name);
	if (strcasestr(uri, key))
		return strdup(uri);
	const char *sep = "&";
	if (!strchr(uri, '?')) {
		const char *hosts = strstr(uri, "://");
		hosts = hosts ? hosts + 3 : uri;
		sep = strchr(hosts, '/') ? "?" : "/?";
	}
	size_t n = strlen(uri) + strlen(key) + 32;
	char *s = malloc(n);
	if (s)
		snprintf(s, n, "%s%s%s%ld", uri, sep, key, value);
	return s;
}

int
max_delete_option(const char *arg, gfs_max_delete *out)
{
	if (gfs_max_delete_parse(arg, out))
		return 0;
	usage_error("--max-delete takes a count of files or a percentage (N or P%%), not '%s'", arg);
	return -1;
}

int
hold_option(const char *arg, size_t *out)
{
	uint64_t v;
	if (parse_size(arg, &v) && v > 0 && v <= SIZE_MAX / 2) {
		*out = (size_t)v;
		return 0;
	}
	usage_error("--hold takes a size above 0, such as 64M, not '%s'", arg);
	return -1;
}

int
read_option(const char *opt, const char *arg, enum gfs_read_strategy *out)
{
	enum gfs_read_strategy s;
	if (!gfs_read_strategy_parse(arg, &s)) {
		usage_error("--%s is auto, scan, batched or each, not '%s'", opt, arg);
		return -1;
	}
	if (s == GFS_READ_BATCHED)
		warnx_("--%s batched is read as each now: a query per file", opt);
	*out = s;
	return 0;
}

bool
max_delete_fits(const struct gfs_max_delete *md, bool deleting)
{
	if (!md->set || deleting)
		return true;
	usage_error("--max-delete bounds --delete, which is not given");
	return false;
}

void
notify_systemd(const char *state)
{
	if (gfs_sd_notify(state) < 0)
		warn_("NOTIFY_SOCKET %s", gfs_sd_notify_socket());
}

/*
 * Chunks that a writer killed midway left behind, no reader finds: those of
 * a put's unfinished upload, and those of files whose removal (an old
 * revision's, an rm's) was cut short. put, rm and verify --repair take them
 * first; held is a lock the caller holds (its markers are left over).
 */
int
recover_interrupted(gfs_session *s, const char *held)
{
	size_t removed, files;
	gfs_error err;
	if (!gfs_finish_deletions(s, held, &files, &err) || !gfs_put_recover(s, &removed, &err))
		return fail(&err);
	if (files && !G.quiet)
		warnx_("finished removing %zu file%s an interrupted command had begun to remove", files,
		       files == 1 ? "" : "s");
	if (removed && !G.quiet)
		warnx_("removed %zu unfinished upload%s left by an interrupted put", removed,
		       removed == 1 ? "" : "s");
	return EXIT_OK;
}

bool
parse_int(const char *s, long min, long max, long *out)
{
	return gfs_parse_long(s, min, max, out);
}

bool
parse_size(const char *s, uint64_t *out)
{
	return gfs_parse_size(s, out);
}
