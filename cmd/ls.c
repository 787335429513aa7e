/* gridfsctl ls: list the files of the bucket. */
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "../lib/select.h"

enum { OPT_JSON = 1, OPT_REGEX };

struct ls {
	bool lng, all, json, human;
	const char *regex;
	/* The newest revision seen so far of the current name: a file, or a malformed document. */
	gfs_file pending;
	bool have_pending;
	char *bad_name;        /* the pending document is malformed: its name ... */
	gfs_error bad_why;     /* ... and why */
	int64_t revisions;     /* of the pending name */
	uint64_t count;
	uint64_t malformed;    /* names reported for a malformed document */
};

#define TO(field) CMD_TO(struct ls, field)

static const struct cmd_opt ls_opts[] = {
	CMD_OPT('l', "long", NULL, "size, upload date, content type and name", .kind = CMD_SET,
	        .to = TO(lng)),
	CMD_OPT('h', "human-readable", NULL, "with -l, sizes as 40.0 KiB, 1.5 MiB (powers of 1024)",
	        .kind = CMD_SET, .to = TO(human)),
	CMD_OPT('a', "all-revisions", NULL, "every revision, not only the newest of each name",
	        .kind = CMD_SET, .to = TO(all)),
	CMD_OPT(0, "regex", "RE", "only names the POSIX extended regular expression RE matches "
	        "(anywhere, unless anchored with ^)", .id = OPT_REGEX, .kind = CMD_STRING,
	        .to = TO(regex)),
	CMD_OPT(0, "json", NULL, "one JSON object per file (JSON Lines)", .id = OPT_JSON,
	        .kind = CMD_SET, .to = TO(json)),
	CMD_OPT_END,
};

static void
print_file(struct ls *l, const gfs_file *f, int64_t revisions)
{
	const char *name = f->filename ? f->filename : "";
	if (l->json) {
		bson_t doc = BSON_INITIALIZER;
		file_to_json(f, &doc);
		if (!l->all)
			BSON_APPEND_INT64(&doc, "revisions", revisions);
		print_json(stdout, &doc);
		bson_destroy(&doc);
	} else if (l->lng) {
		char date[32];
		gfs_iso8601(f->upload_date, date);
		char size[32];
		if (l->human)
			human_bytes((double)f->length, size, sizeof size);
		else
			snprintf(size, sizeof size, "%lld", (long long)f->length);
		human_line(stdout, "%12s  %s  %-24s  %s", size, date,
		           f->content_type ? f->content_type : "-", name);
	} else {
		human_line(stdout, "%s", name);
	}
	l->count++;
}

/*
 * A malformed document is a problem of its name, never a line that looks
 * like the name is fine (nor an older revision shown in its place).
 */
static void
print_bad(struct ls *l, const char *name, const gfs_error *why)
{
	l->malformed++;
	if (l->json) {
		bson_t doc = BSON_INITIALIZER;
		json_filename(&doc, name);
		BSON_APPEND_UTF8(&doc, "error", why->msg);
		print_json(stdout, &doc);
		bson_destroy(&doc);
	}
	char shown[GFS_NAME_SHOWN_MAX];
	warnx_("%s: %s", shown_name(shown, name ? name : "(no filename)"), why->msg);
}

static void
copy_file(gfs_file *dst, const gfs_file *src)
{
	gfs_error err;
	if (!gfs_file_parse(src->doc, dst, &err))
		abort(); /* src was parsed from the same document a moment ago */
}

static void
drop_pending(struct ls *l)
{
	if (l->bad_name)
		free(l->bad_name);
	else if (l->have_pending)
		gfs_file_free(&l->pending);
	l->bad_name = NULL;
	l->have_pending = false;
}

static void
flush_pending(struct ls *l)
{
	if (!l->have_pending)
		return;
	if (l->bad_name)
		print_bad(l, l->bad_name, &l->bad_why);
	else
		print_file(l, &l->pending, l->revisions);
	drop_pending(l);
}

static const char *
pending_name(const struct ls *l)
{
	return l->bad_name ? l->bad_name : l->pending.filename;
}

/* Sorted by name then date: the last of a run of equal names is the newest. */
static void
next_revision(struct ls *l, const char *name)
{
	bool same = l->have_pending && name && pending_name(l) && strcmp(name, pending_name(l)) == 0;
	if (!same) {
		flush_pending(l);
		l->revisions = 0;
	} else {
		drop_pending(l);
	}
	l->have_pending = true;
	l->revisions++;
}

static bool
on_file(const gfs_file *f, void *ctx)
{
	struct ls *l = ctx;
	if (l->all) {
		print_file(l, f, 1);
		return true;
	}
	next_revision(l, f->filename);
	copy_file(&l->pending, f);
	return true;
}

static bool
on_bad(const bson_t *doc, const char *name, const gfs_error *why, void *ctx)
{
	(void)doc;
	struct ls *l = ctx;
	if (l->all || !name) {
		print_bad(l, name, why);
		return true;
	}
	next_revision(l, name);
	l->bad_name = gfs_xstrdup(name);
	l->bad_why = *why;
	return true;
}

static int
cmd_ls(int argc, char **argv)
{
	struct ls l = {0};
	int i = parse_options(argc, argv, &cmd_ls_entry, NULL, &l);
	if (i < 0)
		return EXIT_USAGE;
	if (argc - i > 1) {
		usage_error("at most one PREFIX or PATTERN");
		return EXIT_USAGE;
	}
	gfs_match m;
	if (select_operand(i < argc ? argv[i] : NULL, l.regex, &m) < 0)
		return EXIT_USAGE;
	gfs_conn *conn = connect_or_warn();
	if (!conn) {
		gfs_match_free(&m);
		return EXIT_USAGE;
	}
	gfs_session *s = gfs_session_pop(conn);
	gfs_error err;
	bool ok = gfs_list_match(s, &m, on_file, on_bad, &l, &err);
	flush_pending(&l);
	gfs_session_push(s);
	gfs_conn_close(conn);
	gfs_match_free(&m);
	if (!ok)
		return fail(&err);
	return l.malformed ? EXIT_PARTIAL : EXIT_OK;
}

static const struct cmd_exit ls_exits[] = {
	{0, "ok"}, {1, "a files document listed is malformed (each is reported)"}, {2, "usage"},
	{3, "backend"}, {5, "standard output could not be written"}, {-1, NULL},
};

const struct cmd_entry cmd_ls_entry = {
	.name = "ls",
	.summary = "list files in the bucket",
	.operands = "[PREFIX|PATTERN]",
	.opts = ls_opts,
	.exits = ls_exits,
	.run = cmd_ls,
};
