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

const char put_help[] =
    "  -n, --name NAME         stored name (default: the file's base name; required for '-')\n"
    "  -t, --type MIME         content type (default: detected by libmagic)\n"
    "  -k, --keep-revisions N  keep the N newest revisions of the name in all (default 1;\n"
    "                          0 keeps every revision)\n"
    "      --chunk-size SIZE   chunk size (default 255K)\n"
    "      --json              print the stored file as one JSON object\n";

enum { OPT_CHUNK = 1, OPT_JSON };

const struct option put_options[] = {
	{"name", required_argument, NULL, 'n'},
	{"type", required_argument, NULL, 't'},
	{"keep-revisions", required_argument, NULL, 'k'},
	{"chunk-size", required_argument, NULL, OPT_CHUNK},
	{"json", no_argument, NULL, OPT_JSON},
	{NULL, 0, NULL, 0},
};

struct put_opts {
	const char *name, *type;
	long keep;
	uint64_t chunk_size;
	bool json;
};

static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct put_opts *o = ctx;
	switch (opt) {
	case 'n': o->name = arg; return 0;
	case 't': o->type = arg; return 0;
	case OPT_JSON: o->json = true; return 0;
	case 'k':
		if (parse_int(arg, 0, 1000000, &o->keep))
			return 0;
		usage_error("--keep-revisions takes a count, not '%s'", arg);
		return -1;
	case OPT_CHUNK:
		if (parse_size(arg, &o->chunk_size) && o->chunk_size > 0 && o->chunk_size <= 15u << 20)
			return 0;
		usage_error("--chunk-size takes a size from 1 byte to 15M, not '%s'", arg);
		return -1;
	}
	return -1;
}

/*
 * The source sniffs the first block for libmagic before handing it on, so
 * content detection costs no second read of the file (stdin cannot be reread).
 */
struct sniff_source {
	int fd;
	gfs_put_opts *po;  /* receives the detected type */
	char *type;        /* detected MIME type, or NULL */
	bool detect, sniffed;
};

static ssize_t
sniff_read(uint8_t *buf, size_t len, void *ctx)
{
	struct sniff_source *src = ctx;
	ssize_t r = gfs_source_fd(buf, len, &src->fd);
	if (r > 0 && src->detect && !src->sniffed) {
		gfs_error err;
		gfs_magic *m = gfs_magic_open(&err);
		if (m) {
			src->type = strdup(gfs_magic_type(m, buf, (size_t)r));
			src->po->content_type = src->type;
			gfs_magic_close(m);
		}
	}
	src->sniffed = true;
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

static int
upload(gfs_session *s, const struct put_opts *o, const char *path, const char *name, int fd,
       const struct stat *st)
{
	struct sniff_source src = {.fd = fd, .detect = o->type == NULL};
	bson_t meta = BSON_INITIALIZER;
	if (S_ISREG(st->st_mode))
		gfs_metadata_from_stat(&meta, st);
	gfs_put_opts po = {
		.filename = name,
		.content_type = o->type,
		.metadata = &meta,
		.chunk_size = (int32_t)o->chunk_size,
	};
	gfs_file f;
	gfs_error err;
	src.po = &po;
	bool ok = gfs_put(s, &po, sniff_read, &src, &f, &err);
	bson_destroy(&meta);
	free(src.type);
	if (!ok)
		return err.code == GFS_ELOCAL ? (warnx_("%s", err.msg), EXIT_LOCAL) : fail(&err);
	int rc = EXIT_OK;
	if (o->keep > 0 && !gfs_delete_old_revisions(s, name, (int)o->keep, &err)) {
		warnx_("%s: stored, but older revisions were not removed: %s", name, err.msg);
		rc = EXIT_PARTIAL;
	}
	if (o->json) {
		bson_t doc = BSON_INITIALIZER;
		file_to_json(&f, &doc);
		BSON_APPEND_UTF8(&doc, "source", path);
		print_json(stdout, &doc);
		bson_destroy(&doc);
	}
	gfs_file_free(&f);
	return rc;
}

int
cmd_put(int argc, char **argv)
{
	struct put_opts o = {.keep = 1};
	int i = parse_options(argc, argv, "n:t:k:", put_options, on_opt, &o);
	if (i < 0)
		return EXIT_USAGE;
	if (argc - i != 1) {
		usage_error(argc - i ? "one FILE at a time (use 'gridfsctl import' for trees)" : "a FILE is required");
		return EXIT_USAGE;
	}
	const char *path = argv[i];
	if (strcmp(path, "-") == 0 && !o.name) {
		usage_error("reading stdin needs --name");
		return EXIT_USAGE;
	}
	char *pcopy = strdup(path);
	char *name = strdup(o.name ? o.name : basename(pcopy));
	free(pcopy);
	if (!*name) {
		usage_error("the stored name is empty");
		free(name);
		return EXIT_USAGE;
	}
	struct stat st;
	int fd = open_source(path, &st);
	if (fd < 0) {
		free(name);
		return EXIT_LOCAL;
	}
	gfs_conn *conn = connect_or_warn();
	int rc = EXIT_USAGE;
	if (conn) {
		gfs_session *s = gfs_session_pop(conn);
		rc = upload(s, &o, path, name, fd, &st);
		gfs_session_push(s);
		gfs_conn_close(conn);
	}
	if (fd != STDIN_FILENO)
		close(fd);
	free(name);
	return rc;
}
