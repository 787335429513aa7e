/* Output helpers shared by the everyday verbs. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"

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

/* Resolves NAME (with revision) or --id OID to a files document. */
int
lookup_file(gfs_session *s, const char *name, const char *id_hex, int revision, gfs_file *out)
{
	gfs_error err;
	bool ok;
	if (id_hex) {
		bson_value_t id;
		if (!gfs_id_parse_oid(id_hex, &id)) {
			usage_error("'%s' is not an ObjectId (24 hex digits)", id_hex);
			return EXIT_USAGE;
		}
		ok = gfs_find_by_id(s, &id, out, &err);
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
	*list = realloc(*list, (*n + 1) * sizeof **list);
	if (!*list)
		abort();
	(*list)[(*n)++] = arg;
}

volatile sig_atomic_t stop_signal;

static void
on_stop_signal(int sig)
{
	stop_signal = sig;
}

void
catch_stop_signals(void)
{
	struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESETHAND};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}
