/*
 * Messages and exit codes: the one way a verb says what went wrong on
 * stderr ("gridfsctl CMD: ..."), escaped like every human line, and the one
 * map from a library error's kind to an exit status (gridfsctl(1), EXIT
 * STATUS).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"

const char *progname = "gridfsctl";
const char *cmdname = NULL;

static char last_msg[1024];

const char *
last_message(void)
{
	return last_msg;
}

/* Messages name stored files and local paths: escaped like every human line. */
static void
vmessage(const char *fmt, va_list ap, const char *suffix)
{
	char *msg = bson_strdupv_printf(fmt, ap);
	char *safe = printable(msg, strlen(msg));
	flockfile(stderr);
	char *kept = suffix ? bson_strdup_printf("%s: %s", msg, suffix) : NULL;
	gfs_shorten(last_msg, sizeof last_msg, kept ? kept : msg, strlen(kept ? kept : msg));
	bson_free(kept);
	if (cmdname)
		fprintf(stderr, "%s %s: ", progname, cmdname);
	else
		fprintf(stderr, "%s: ", progname);
	fputs(safe, stderr);
	if (suffix)
		fprintf(stderr, ": %s", suffix);
	fputc('\n', stderr);
	funlockfile(stderr);
	free(safe);
	bson_free(msg);
}

void
warnx_(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmessage(fmt, ap, NULL);
	va_end(ap);
}

void
warn_(const char *fmt, ...)
{
	const char *e = strerror(errno);
	va_list ap;
	va_start(ap, fmt);
	vmessage(fmt, ap, e);
	va_end(ap);
}

void
usage_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmessage(fmt, ap, NULL);
	va_end(ap);
	if (cmdname)
		fprintf(stderr, "see '%s %s --help'\n", progname, cmdname);
}

int
exit_code_for(const gfs_error *err)
{
	switch (err->code) {
	case GFS_OK: return EXIT_OK;
	case GFS_ENOTFOUND:
	case GFS_ENOREVISION: return EXIT_NOTFOUND;
	case GFS_EBACKEND: return EXIT_BACKEND;
	case GFS_ELOCAL:
	case GFS_EEXISTS: return EXIT_LOCAL;
	case GFS_EINVAL: return EXIT_USAGE;
	case GFS_EBUSY: return EXIT_BUSY;
	case GFS_ECANCELED: return EXIT_INTERRUPTED;
	case GFS_ELIMIT: return EXIT_LIMIT;
	default: return EXIT_PARTIAL;
	}
}

int
fail(const gfs_error *err)
{
	warnx_("%s", err->msg);
	return exit_code_for(err);
}
