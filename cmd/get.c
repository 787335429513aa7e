/* gridfsctl get: write a stored file to disk or stdout. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd.h"
#include "../lib/safepath.h"

const char get_help[] =
    "      --id OID      the file with this _id instead of a NAME\n"
    "  -r, --rev N       revision: -1 newest (default), -2 the one before, 0 the first\n"
    "  -o, --output F    write to F ('-' for stdout); default: the stored name, under the\n"
    "                    current directory (parent directories are created)\n"
    "  -f, --force       replace an existing output file\n";

enum { OPT_ID = 1 };

const struct option get_options[] = {
	{"id", required_argument, NULL, OPT_ID},
	{"rev", required_argument, NULL, 'r'},
	{"output", required_argument, NULL, 'o'},
	{"force", no_argument, NULL, 'f'},
	{NULL, 0, NULL, 0},
};

struct get_opts {
	const char *id, *output;
	long rev;
	bool force;
};

static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct get_opts *o = ctx;
	switch (opt) {
	case OPT_ID: o->id = arg; return 0;
	case 'o': o->output = arg; return 0;
	case 'f': o->force = true; return 0;
	case 'r': return parse_rev_option(arg, &o->rev);
	}
	return -1;
}

static bool
write_all(int fd, const uint8_t *p, size_t len)
{
	while (len > 0) {
		ssize_t w = write(fd, p, len);
		if (w < 0 && errno == EINTR && !stop_signal)
			continue;
		if (w < 0)
			return false;
		p += w;
		len -= (size_t)w;
	}
	return true;
}

struct sink {
	int fd;
	int saved_errno;
	bool interrupted;
};

static bool
to_fd(const uint8_t *data, size_t len, void *ctx)
{
	struct sink *k = ctx;
	if (!stop_signal && write_all(k->fd, data, len))
		return true;
	k->interrupted = stop_signal != 0;
	k->saved_errno = errno;
	return false;
}

/* A stored name used as a local path must stay below the current directory. */
static bool
safe_relative(const char *name)
{
	gfs_error err;
	return gfs_safepath_check(name, strlen(name), &err);
}

static bool
make_parents(const char *path)
{
	char *copy = strdup(path);
	for (char *p = copy + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(copy, 0777) < 0 && errno != EEXIST) {
			free(copy);
			return false;
		}
		*p = '/';
	}
	free(copy);
	return true;
}

static int
read_into(gfs_session *s, const gfs_file *f, int fd, const char *what)
{
	struct sink k = {.fd = fd};
	gfs_error err;
	if (gfs_read(s, f, true, to_fd, &k, NULL, &err))
		return EXIT_OK;
	if (err.code == GFS_ECANCELED && k.interrupted) {
		warnx_("%s: interrupted", what);
		return EXIT_INTERRUPTED;
	}
	if (err.code == GFS_ECANCELED) {
		errno = k.saved_errno;
		warn_("%s", what);
		return EXIT_LOCAL;
	}
	return fail(&err);
}

/*
 * Writes into a temporary file beside the target and renames it into place,
 * so the target is either the old file or the complete new one. Without
 * --force, RENAME_NOREPLACE makes "never overwrite" hold even against a file
 * created while we were downloading.
 */
static int
get_to_path(gfs_session *s, const gfs_file *f, const char *path, bool force)
{
	struct stat st;
	if (!force && lstat(path, &st) == 0) {
		warnx_("%s: exists (use --force to replace it)", path);
		return EXIT_LOCAL;
	}
	if (!make_parents(path)) {
		warn_("%s", path);
		return EXIT_LOCAL;
	}
	char *dcopy = strdup(path), *bcopy = strdup(path);
	char *tmp = bson_strdup_printf("%s/.%s.gridfsctl-XXXXXX", dirname(dcopy), basename(bcopy));
	free(dcopy);
	free(bcopy);
	int fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		warn_("%s", path);
		bson_free(tmp);
		return EXIT_LOCAL;
	}
	int rc = read_into(s, f, fd, path);
	if (rc == EXIT_OK && (fsync(fd) < 0 || close(fd) < 0)) {
		warn_("%s", path);
		rc = EXIT_LOCAL;
	} else if (rc != EXIT_OK) {
		close(fd);
	}
	/* mkostemp creates 0600; a downloaded file gets the usual umask-based mode. */
	mode_t mask = umask(0);
	umask(mask);
	if (rc == EXIT_OK && chmod(tmp, 0666 & ~mask) < 0) {
		warn_("%s", path);
		rc = EXIT_LOCAL;
	}
	/* A signal after the last chunk still means: leave no new file behind. */
	if (rc == EXIT_OK && stop_signal) {
		warnx_("%s: interrupted", path);
		rc = EXIT_INTERRUPTED;
	}
	if (rc == EXIT_OK) {
		int r = force ? rename(tmp, path) : renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE);
		if (r < 0) {
			if (errno == EEXIST)
				warnx_("%s: exists (use --force to replace it)", path);
			else
				warn_("%s", path);
			rc = EXIT_LOCAL;
		}
	}
	if (rc != EXIT_OK)
		unlink(tmp);
	bson_free(tmp);
	return rc;
}

int
cmd_get(int argc, char **argv)
{
	struct get_opts o = {.rev = -1};
	int i = parse_options(argc, argv, "r:o:f", get_options, on_opt, &o);
	if (i < 0 || !one_target(argc - i, o.id))
		return EXIT_USAGE;
	gfs_conn *conn = connect_or_warn();
	if (!conn)
		return EXIT_USAGE;
	gfs_session *s = gfs_session_pop(conn);
	catch_stop_signals();
	gfs_file f;
	int rc = lookup_file(s, o.id ? NULL : argv[i], o.id, (int)o.rev, &f);
	if (rc == EXIT_OK) {
		const char *out = o.output ? o.output : f.filename;
		if (out && strcmp(out, "-") == 0) {
			rc = read_into(s, &f, STDOUT_FILENO, "stdout");
		} else if (!out || (!o.output && !safe_relative(out))) {
			warnx_("%s: stored name is not a safe local path; give -o FILE",
			       f.filename ? f.filename : "(no name)");
			rc = EXIT_USAGE;
		} else {
			rc = get_to_path(s, &f, out, o.force);
		}
		gfs_file_free(&f);
	}
	gfs_session_push(s);
	gfs_conn_close(conn);
	return rc;
}
