/* gridfsctl get: write a stored file to disk or stdout. */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd.h"
#include "../lib/mirror/mirror.h"
#include "../lib/filename.h"
#include "../lib/safepath.h"
#include "../lib/select.h"

enum { OPT_ID = 1, OPT_REGEX, OPT_JSON };

struct get_opts {
	const char *id, *output, *prefix, *regex;
	long rev;
	bool force;
};

#define TO(field) CMD_TO(struct get_opts, field)

static const struct cmd_opt get_opts[] = {
	CMD_OPT(0, "id", "ID", "the file with this _id instead of a NAME: " ID_SYNTAX, .id = OPT_ID,
	        .kind = CMD_STRING, .to = TO(id)),
	REV_OPTS,
	PREFIX_OPT("every file under the folder P (newest revisions), into -o DIR, named as "
	           "below P", .kind = CMD_STRING, .to = TO(prefix)),
	CMD_OPT(0, "regex", "RE", "every file whose name the POSIX extended regular expression RE "
	        "matches (newest revisions), into -o DIR", .id = OPT_REGEX, .kind = CMD_STRING,
	        .to = TO(regex)),
	CMD_OPT('o', "output", "F", "write to F ('-' for stdout); default: the stored name, under the "
	        "current directory (parent directories are created). With several NAMEs, --prefix "
	        "or --regex, the directory the files go into", .kind = CMD_STRING, .to = TO(output)),
	CMD_OPT('f', "force", NULL, "replace an existing output file", .kind = CMD_SET, .to = TO(force)),
	CMD_OPT(0, "json", NULL, "one JSON event per file: {event: write, filename, path, bytes, "
	        "error?}", .id = OPT_JSON),
	CMD_OPT_END,
};

static bool json;   /* --json: a "write" event for each file written, or not */

/*
 * With --json, what became of one file: written to path (as the user gave
 * it, or below -o DIR), or not, with the message said on stderr.
 */
static void
report(const char *name, const char *path, int64_t bytes, int rc)
{
	if (!json)
		return;
	bson_t doc;
	json_event(&doc, "write");
	json_filename(&doc, name);
	if (path)
		json_path(&doc, path, strlen(path));
	if (rc == EXIT_OK)
		BSON_APPEND_INT64(&doc, "bytes", bytes);
	else
		BSON_APPEND_UTF8(&doc, "error", last_message());
	print_json(stdout, &doc);
	bson_destroy(&doc);
}

/* --rev, and --json, which report() reads. */
static int
on_opt(int opt, const char *arg, void *ctx)
{
	struct get_opts *o = ctx;
	if (opt == OPT_JSON) {
		json = true;
		return 0;
	}
	return opt == 'R' ? parse_rev_option(arg, &o->rev) : -1;
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
	bool wrote;          /* some bytes went out */
};

static bool
to_fd(const uint8_t *data, size_t len, void *ctx)
{
	struct sink *k = ctx;
	k->wrote = true;
	if (!stop_signal && write_all(k->fd, data, len))
		return true;
	k->interrupted = stop_signal != 0;
	k->saved_errno = errno;
	return false;
}

/*
 * Read from a secondary, a file that looks damaged or missing may only be
 * behind: its failure is held (not reported) while nothing reached stdout,
 * and the get runs again on the primary, whose word is reported. Of several
 * files, each one is read again on the primary (again_on_primary).
 */
#define EXIT_AGAIN (-1)
static bool hold;

/*
 * f's content into fd (a temporary file, emptied first) from the primary,
 * when s reads a secondary and its failure err may be lag; false (err the
 * primary's, or left as it was) otherwise.
 */
static bool
again_on_primary(gfs_session *s, const gfs_file *f, struct sink *k, const char *what,
                 gfs_error *err)
{
	if (k->fd == STDOUT_FILENO || !gfs_session_may_lag(s, err))
		return false;
	if (ftruncate(k->fd, 0) < 0 || lseek(k->fd, 0, SEEK_SET) < 0) {
		gfs_error_set(err, GFS_ELOCAL, "%s: %s", what, strerror(errno));
		return false;
	}
	return gfs_read_on_primary(s, f, to_fd, k, err);
}

static int
read_into(gfs_session *s, const gfs_file *f, int fd, const char *what)
{
	struct sink k = {.fd = fd};
	gfs_error err;
	if (gfs_read(s, f, true, to_fd, &k, NULL, &err))
		return EXIT_OK;
	if (hold && err.code != GFS_ECANCELED && (fd != STDOUT_FILENO || !k.wrote))
		return EXIT_AGAIN;
	if (!hold && again_on_primary(s, f, &k, what, &err))
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

/* Where the output goes: a file name in an open directory. */
struct target {
	int dirfd;
	const char *base;    /* points into shown */
	const char *shown;   /* the path as the user knows it, for messages */
};

/*
 * Writes into a temporary file beside the target and renames it into place,
 * so the target is either the old file or the complete new one. Without
 * --force, RENAME_NOREPLACE makes "never overwrite" hold even against a file
 * created while we were downloading.
 *
 * The temporary file is .BASE.gridfsctl-PID-RANDOM, held under flock(2)
 * while it is written. A get killed with SIGKILL cannot remove it, so the
 * next get of the same target removes those whose owner is gone: the pid
 * no longer exists here and no process holds the lock. Both must agree,
 * since a pid means nothing in another pid namespace and the lock is only
 * taken just after the file is made.
 */
#define TEMP_TAG ".gridfsctl-"

/* The pid in a temporary name of ours for base, or 0 when d_name is not one. */
static long
temp_owner(const char *d_name, const char *base)
{
	size_t bl = strlen(base), tl = strlen(TEMP_TAG);
	if (d_name[0] != '.' || strncmp(d_name + 1, base, bl) != 0 ||
	    strncmp(d_name + 1 + bl, TEMP_TAG, tl) != 0)
		return 0;
	const char *p = d_name + 1 + bl + tl;
	char *end;
	long pid = strtol(p, &end, 10);
	if (end == p || *end != '-' || pid <= 0 || strlen(end + 1) != 6)
		return 0;
	return pid;
}

static bool
owner_gone(int dirfd, const char *name, long pid)
{
	if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
		return false;
	int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return false;
	struct stat a, b;
	bool gone = flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &a) == 0 && S_ISREG(a.st_mode) &&
	            fstatat(dirfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_ino == b.st_ino &&
	            a.st_dev == b.st_dev;
	close(fd);
	return gone;
}

/* Removes what killed gets of this same target left beside it. */
static void
remove_stale_temps(int dirfd, const char *base)
{
	int fd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		long pid = temp_owner(e->d_name, base);
		if (pid && owner_gone(dirfd, e->d_name, pid) && unlinkat(dirfd, e->d_name, 0) == 0 &&
		    !G.quiet)
			warnx_("removed %s, left by an interrupted get", e->d_name);
	}
	closedir(d);
}

/* Makes the locked temporary file for base in dirfd; *tmp names it (caller frees). */
static int
create_temp(int dirfd, const char *base, char **tmp)
{
	for (int tries = 0; tries < 100; tries++) {
		uint32_t r;
		if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
			r = (uint32_t)rand();
		*tmp = bson_strdup_printf(".%s" TEMP_TAG "%ld-%06u", base, (long)getpid(),
		                          (unsigned)(r % 1000000));
		int fd = openat(dirfd, *tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd >= 0 && flock(fd, LOCK_EX) == 0)
			return fd;
		int e = errno;
		if (fd >= 0) {
			unlinkat(dirfd, *tmp, 0);
			close(fd);
		}
		bson_free(*tmp);
		*tmp = NULL;
		errno = e;
		if (e != EEXIST)
			return -1;
	}
	return -1;
}

/* A signal after the last chunk still means: leave no new file behind. */
static int
finish_temp(int fd, const char *what, int rc)
{
	mode_t mask = umask(0);
	umask(mask);
	/* The file was made 0600; a downloaded file gets the usual umask-based mode. */
	if (rc == EXIT_OK && (fchmod(fd, 0666 & ~mask) < 0 || fsync(fd) < 0)) {
		warn_("%s", what);
		rc = EXIT_LOCAL;
	}
	if (close(fd) < 0 && rc == EXIT_OK) {
		warn_("%s", what);
		rc = EXIT_LOCAL;
	}
	if (rc == EXIT_OK && stop_signal) {
		warnx_("%s: interrupted", what);
		rc = EXIT_INTERRUPTED;
	}
	return rc;
}

static int
write_target(gfs_session *s, const gfs_file *f, const struct target *t, bool force)
{
	struct stat st;
	if (!force && fstatat(t->dirfd, t->base, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		warnx_("%s: exists (use --force to replace it)", t->shown);
		return EXIT_LOCAL;
	}
	remove_stale_temps(t->dirfd, t->base);
	char *tmp;
	int fd = create_temp(t->dirfd, t->base, &tmp);
	if (fd < 0) {
		warn_("%s", t->shown);
		return EXIT_LOCAL;
	}
	int rc = finish_temp(fd, t->shown, read_into(s, f, fd, t->shown));
	if (rc == EXIT_OK &&
	    renameat2(t->dirfd, tmp, t->dirfd, t->base, force ? 0 : RENAME_NOREPLACE) < 0) {
		if (errno == EEXIST)
			warnx_("%s: exists (use --force to replace it)", t->shown);
		else
			warn_("%s", t->shown);
		rc = EXIT_LOCAL;
	}
	if (rc != EXIT_OK)
		unlinkat(t->dirfd, tmp, 0);
	bson_free(tmp);
	return rc;
}

static int
get_to_path(gfs_session *s, const gfs_file *f, const struct target *t, bool force)
{
	int rc = write_target(s, f, t, force);
	report(f->filename, t->shown, f->length, rc);
	return rc;
}

/* Creates the directories above a path the user gave; they may go through symlinks. */
static bool
make_parents(const char *path)
{
	char *copy = gfs_xstrdup(path);
	for (char *p = copy; *p; p++) {
		if (*p != '/' || p == copy)
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

/*
 * -o PATH is the user's own path: resolved as any command resolves its
 * arguments, symlinks included.
 */
static int
open_user_target(const char *path, struct target *t)
{
	const char *slash = strrchr(path, '/');
	t->base = slash ? slash + 1 : path;
	t->shown = path;
	if (!*t->base || strcmp(t->base, ".") == 0 || strcmp(t->base, "..") == 0) {
		usage_error("-o %s: names a directory; give the file's path", path);
		return EXIT_USAGE;
	}
	if (!make_parents(path)) {
		warn_("%s", path);
		return EXIT_LOCAL;
	}
	char *dir = slash == path ? gfs_xstrdup("/") : slash ? gfs_xstrndup(path, (size_t)(slash - path)) : gfs_xstrdup(".");
	t->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	free(dir);
	if (t->dirfd < 0) {
		warn_("%s", path);
		return EXIT_LOCAL;
	}
	return EXIT_OK;
}

/*
 * A stored name came from whoever could write to the bucket: it must stay
 * beneath the current directory, so no segment of it is resolved through a
 * symlink (lib/safepath.c, as mirror does).
 */
static int
open_stored_target(const char *name, struct target *t)
{
	gfs_error err;
	size_t len = strlen(name);
	char shown[GFS_NAME_SHOWN_MAX];
	if (!gfs_safepath_check(name, len, &err)) {
		warnx_("%s: stored name is not a safe local path (%s); give -o FILE",
		       shown_name(shown, name), err.msg);
		return EXIT_USAGE;
	}
	size_t dl = gfs_safepath_dirlen(name, len);
	t->shown = name;
	t->base = dl ? name + dl + 1 : name;
	int root = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root < 0) {
		warn_("current directory");
		return EXIT_LOCAL;
	}
	t->dirfd = gfs_safepath_opendir(root, name, dl, GFS_SAFEPATH_CREATE, &err);
	close(root);
	if (t->dirfd < 0) {
		warnx_("%s: %s", shown_name(shown, name), err.msg);
		return EXIT_LOCAL;
	}
	return EXIT_OK;
}

static int
get_to_file(gfs_session *s, const gfs_file *f, const char *output, bool force)
{
	if (!output && !f->filename) {
		warnx_("(no name): stored file has no name; give -o FILE");
		return EXIT_USAGE;
	}
	struct target t;
	int rc = output ? open_user_target(output, &t) : open_stored_target(f->filename, &t);
	if (rc != EXIT_OK)
		return rc;
	rc = get_to_path(s, f, &t, force);
	close(t.dirfd);
	return rc;
}

/*
 * Several files into one directory: each at the path its stored name makes
 * beneath root (below the folder nprefix), held to mirror's rules
 * (lib/safepath.c: never outside root, never through a symlink there).
 */
static int
get_beneath(gfs_session *s, int root, const gfs_file *f, const char *nprefix, bool force)
{
	gfs_error err;
	size_t raw_len = 0, len;
	char *raw = gfs_raw_name(f->doc, &raw_len), *rel;
	bool ok = f->filename && gfs_mirror_local_path(f->filename, nprefix, raw, raw_len, &rel, &len,
	                                               &err);
	free(raw);
	if (!ok) {
		warnx_("%s: stored name is not a safe local path (%s)",
		       f->filename ? f->filename : "(no name)", f->filename ? err.msg : "none");
		report(f->filename, NULL, 0, EXIT_LOCAL);
		return EXIT_LOCAL;
	}
	size_t dl = gfs_safepath_dirlen(rel, len);
	struct target t = {.shown = rel, .base = dl ? rel + dl + 1 : rel};
	t.dirfd = gfs_safepath_opendir(root, rel, dl, GFS_SAFEPATH_CREATE, &err);
	int rc = EXIT_LOCAL;
	if (t.dirfd < 0) {
		warnx_("%s: %s", rel, err.msg);
	} else {
		rc = get_to_path(s, f, &t, force);
		close(t.dirfd);
	}
	free(rel);
	return rc;
}

static int lookup(gfs_session *s, const struct get_opts *o, const char *name, bool held, gfs_file *f);

/*
 * The names given, each to its stored name beneath root (the newest, or
 * --rev); a name a secondary lacks is looked up, and got, on the primary.
 */
static int
get_names(gfs_session *s, const struct get_opts *o, int root, char **names, int n)
{
	struct tally t = {0};
	bool secondary = gfs_session_on_secondary(s);
	for (int i = 0; i < n; i++) {
		gfs_file f;
		gfs_session *on = s;
		int rc = lookup(s, o, names[i], secondary, &f);
		if (rc == EXIT_AGAIN) {
			gfs_error err;
			on = gfs_session_primary(s, &err);
			rc = on ? lookup(on, o, names[i], false, &f) : fail(&err);
		}
		if (rc == EXIT_OK) {
			rc = get_beneath(on, root, &f, "", o->force);
			gfs_file_free(&f);
		} else {
			report(names[i], NULL, 0, rc);
		}
		if (on != s)
			gfs_session_push(on);
		if (!tally_add(&t, rc))
			break;
	}
	return tally_status(&t);
}

/* A name whose newest revision is malformed: damage, said, never an older revision got. */
static bool
on_malformed(const bson_t *doc, const char *name, const gfs_error *why, void *ctx)
{
	(void)doc;
	char shown[GFS_NAME_SHOWN_MAX];
	warnx_("%s: %s", shown_name(shown, name ? name : "(no filename)"), why->msg);
	tally_add(ctx, EXIT_PARTIAL);
	return true;
}

/* The newest revision of every name --prefix or --regex selects: one query. */
static int
get_matching(gfs_session *s, const struct get_opts *o, int root)
{
	gfs_match m;
	gfs_error err;
	if (o->prefix)
		gfs_match_folder(&m, o->prefix);
	else if (select_operand(NULL, o->regex, &m) < 0)
		return EXIT_USAGE;
	gfs_file *files;
	size_t n;
	struct tally t = {0};
	bool go = gfs_newest_match(s, &m, &files, &n, on_malformed, &t, &err);
	if (!go) {
		tally_add(&t, fail(&err));
	} else if (n == 0 && t.n == 0) {
		gfs_error_set(&err, GFS_ENOTFOUND, o->prefix ? "%s: nothing stored under it"
		              : "--regex %s: no name matches", o->prefix ? m.prefix : o->regex);
		tally_add(&t, fail(&err));
	}
	/* Named as below the folder; a regex's names whole. */
	const char *below = o->prefix ? m.prefix : "";
	for (size_t i = 0; i < n; i++) {
		if (go && stop_signal) {
			warnx_("interrupted");
			go = tally_add(&t, EXIT_INTERRUPTED);
		} else if (go) {
			go = tally_add(&t, get_beneath(s, root, &files[i], below, o->force));
		}
		gfs_file_free(&files[i]);
	}
	free(files);
	gfs_match_free(&m);
	return tally_status(&t);
}

/* -o DIR for several files: the user's own path, made when missing. */
static int
open_output_dir(const char *dir)
{
	char *path = bson_strdup_printf("%s/", dir);
	bool made = make_parents(path);
	bson_free(path);
	int fd = made ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	if (fd < 0)
		warn_("-o %s", dir);
	return fd;
}

static int
get_several(gfs_session *s, const struct get_opts *o, char **names, int n)
{
	if (o->output && strcmp(o->output, "-") == 0) {
		usage_error("several files cannot go to standard output: -o names a directory");
		return EXIT_USAGE;
	}
	int root = open_output_dir(o->output ? o->output : ".");
	if (root < 0)
		return EXIT_LOCAL;
	int rc = n > 0 ? get_names(s, o, root, names, n) : get_matching(s, o, root);
	close(root);
	return rc;
}

static int
check_operands(const struct get_opts *o, int nargs)
{
	int modes = (nargs > 0) + (o->id != NULL) + (o->prefix != NULL) + (o->regex != NULL);
	if (modes != 1) {
		usage_error(modes ? "give NAMEs, --id, --prefix or --regex: one of them"
		                  : "a NAME, --id, --prefix or --regex is required");
		return -1;
	}
	if ((o->prefix || o->regex) && !o->output) {
		usage_error("--%s needs -o DIR, the directory the files go into",
		            o->prefix ? "prefix" : "regex");
		return -1;
	}
	if (o->output && !*o->output) {
		usage_error("-o needs a file name ('-' for stdout), not an empty string");
		return -1;
	}
	if (json && o->output && strcmp(o->output, "-") == 0) {
		usage_error("--json goes to standard output: -o - cannot share it");
		return -1;
	}
	return 0;
}

/* NAME or --id as lookup_file(), but when held, a file a secondary lacks is EXIT_AGAIN, unsaid. */
static int
lookup(gfs_session *s, const struct get_opts *o, const char *name, bool held, gfs_file *f)
{
	if (!held)
		return lookup_file(s, o->id ? NULL : name, o->id, (int)o->rev, f);
	bson_value_t id;
	if (o->id && !parse_id_option(o->id, &id))
		return EXIT_USAGE;
	gfs_error err;
	bool ok = o->id ? gfs_find_by_id(s, &id, f, &err) : gfs_find_by_name(s, name, (int)o->rev, f, &err);
	if (o->id)
		bson_value_destroy(&id);
	if (ok)
		return EXIT_OK;
	return err.code == GFS_ENOTFOUND || err.code == GFS_ENOREVISION ? EXIT_AGAIN : fail(&err);
}

static int
get_once(gfs_session *s, const struct get_opts *o, const char *name)
{
	gfs_file f;
	int rc = lookup(s, o, name, hold, &f);
	if (rc != EXIT_OK) {
		if (rc != EXIT_AGAIN)
			report(o->id ? NULL : name, NULL, 0, rc);
		return rc;
	}
	if (o->output && strcmp(o->output, "-") == 0)
		rc = read_into(s, &f, STDOUT_FILENO, "stdout");
	else
		rc = get_to_file(s, &f, o->output, o->force);
	gfs_file_free(&f);
	return rc;
}

static int
cmd_get(int argc, char **argv)
{
	struct get_opts o = {.rev = -1};
	int i = parse_options(argc, argv, &cmd_get_entry, on_opt, &o);
	if (i < 0 || check_operands(&o, argc - i) < 0)
		return EXIT_USAGE;
	gfs_conn *conn = connect_or_warn();
	if (!conn)
		return EXIT_USAGE;
	gfs_session *s = gfs_session_pop(conn);
	catch_interrupts(0, NULL);
	int rc;
	if (argc - i > 1 || o.prefix || o.regex) {
		rc = get_several(s, &o, argv + i, argc - i);
	} else {
		hold = gfs_session_on_secondary(s);
		rc = get_once(s, &o, argv[i]);
	}
	if (rc == EXIT_AGAIN) {
		gfs_error err;
		hold = false;
		rc = gfs_session_to_primary(s, &err) ? get_once(s, &o, argv[i]) : fail(&err);
	}
	gfs_session_push(s);
	gfs_conn_close(conn);
	return rc;
}

static const struct cmd_exit get_exits[] = {
	{0, "ok"}, {1, "the stored file is damaged, or some of several failed"}, {2, "usage"},
	{3, "backend"},
	{4, "no such name, id or revision"}, {5, "the output exists or cannot be written"},
	{130, "interrupted"}, {-1, NULL},
};

const struct cmd_entry cmd_get_entry = {
	.name = "get",
	.summary = "write a stored file to disk or stdout",
	.operands = "NAME|--id ID",
	.opts = get_opts,
	.exits = get_exits,
	.run = cmd_get,
};
