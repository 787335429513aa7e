/* gridfsctl stat: show one file's document. */
#include <stdlib.h>

#include "cmd.h"

enum { OPT_ID = 1, OPT_JSON };

struct stat_opts {
	const char *id;
	long rev;
	bool json;
};

#define TO(field) CMD_TO(struct stat_opts, field)

static const struct cmd_opt stat_opts[] = {
	CMD_OPT(0, "id", "ID", "the file with this _id instead of a NAME: " ID_SYNTAX, .id = OPT_ID,
	        .kind = CMD_STRING, .to = TO(id)),
	REV_OPTS,
	CMD_OPT(0, "json", NULL, "print one JSON object", .id = OPT_JSON, .kind = CMD_SET,
	        .to = TO(json)),
	CMD_OPT_END,
};

/* The one row that is stat's own: --rev. */
static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct stat_opts *o = ctx;
	return opt == 'R' ? parse_rev_option(arg, &o->rev) : -1;
}

static void
print_metadata(const gfs_file *f)
{
	bson_iter_t it;
	if (!bson_iter_init_find(&it, f->doc, "metadata") || !BSON_ITER_HOLDS_DOCUMENT(&it))
		return;
	uint32_t len;
	const uint8_t *data;
	bson_iter_document(&it, &len, &data);
	bson_t meta;
	if (!bson_init_static(&meta, data, len))
		return;
	/* Another client may have stored strings that are not UTF-8; print_json escapes them. */
	printf("metadata:    ");
	print_json(stdout, &meta);
}

static void
print_text(const gfs_file *f)
{
	char *id = gfs_id_string(&f->id);
	char date[32];
	gfs_iso8601(f->upload_date, date);
	human_line(stdout, "name:        %s", f->filename ? f->filename : "");
	human_line(stdout, "id:          %s", id);
	printf("length:      %lld\n", (long long)f->length);
	printf("chunkSize:   %d\n", f->chunk_size);
	printf("chunks:      %lld\n", (long long)gfs_chunk_count(f->length, f->chunk_size));
	printf("uploadDate:  %s\n", date);
	human_line(stdout, "contentType: %s", f->content_type ? f->content_type : "-");
	human_line(stdout, "sha256:      %s", f->sha256[0] ? f->sha256 : "-");
	if (f->md5[0])
		human_line(stdout, "md5:         %s", f->md5);
	/* Permission bits read as chmod writes them; metadata below keeps the stored number. */
	if (f->mode >= 0)
		printf("mode:        %04o\n", (unsigned)f->mode & 07777);
	print_metadata(f);
	free(id);
}

static void
print_as_json(const gfs_file *f)
{
	bson_t doc = BSON_INITIALIZER;
	file_to_json(f, &doc);
	bson_iter_t it;
	if (bson_iter_init_find(&it, f->doc, "metadata"))
		BSON_APPEND_VALUE(&doc, "metadata", bson_iter_value(&it));
	print_json(stdout, &doc);
	bson_destroy(&doc);
}

static int
cmd_stat(int argc, char **argv)
{
	struct stat_opts o = {.rev = -1};
	int i = parse_options(argc, argv, &cmd_stat_entry, on_opt, &o);
	if (i < 0 || !one_target(argc - i, o.id))
		return EXIT_USAGE;
	gfs_conn *conn = connect_or_warn();
	if (!conn)
		return EXIT_USAGE;
	gfs_session *s = gfs_session_pop(conn);
	gfs_file f;
	int rc = lookup_file(s, o.id ? NULL : argv[i], o.id, (int)o.rev, &f);
	if (rc == EXIT_OK) {
		if (o.json)
			print_as_json(&f);
		else
			print_text(&f);
		gfs_file_free(&f);
	}
	gfs_session_push(s);
	gfs_conn_close(conn);
	return rc;
}

static const struct cmd_exit stat_exits[] = {
	{0, "ok"}, {2, "usage"}, {3, "backend"}, {4, "no such name, id or revision"}, {-1, NULL},
};

const struct cmd_entry cmd_stat_entry = {
	.name = "stat",
	.summary = "show one file's document",
	.operands = "NAME|--id ID",
	.opts = stat_opts,
	.exits = stat_exits,
	.run = cmd_stat,
};
