#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "gfs.h"

/* Bytes of s[0..len) that may end a cut: never inside a UTF-8 sequence. */
static size_t
char_boundary_before(const char *s, size_t len, size_t at)
{
	while (at > 0 && at < len && ((unsigned char)s[at] & 0xc0) == 0x80)
		at--;
	return at;
}

static size_t
char_boundary_after(const char *s, size_t len, size_t at)
{
	while (at < len && ((unsigned char)s[at] & 0xc0) == 0x80)
		at++;
	return at;
}

char *
gfs_shorten_with(char *dst, size_t size, const char *s, size_t len, const char *mark)
{
	if (len < size) {
		memcpy(dst, s, len);
		dst[len] = '\0';
		return dst;
	}
	size_t ml = strlen(mark);
	size_t room = size - ml - 1; /* the bytes kept, ends together */
	size_t head = char_boundary_before(s, len, room / 2);
	size_t tail_at = char_boundary_after(s, len, len - (room - room / 2));
	memcpy(dst, s, head);
	memcpy(dst + head, mark, ml);
	memcpy(dst + head + ml, s + tail_at, len - tail_at);
	dst[head + ml + len - tail_at] = '\0';
	return dst;
}

char *
gfs_shorten(char *dst, size_t size, const char *s, size_t len)
{
	return gfs_shorten_with(dst, size, s, len, "...");
}

/*
 * A message too long for msg loses its middle, not its end: names come
 * first ("NAME: reason") and may be thousands of bytes, the reason never.
 */
void
gfs_error_set(gfs_error *err, enum gfs_errcode code, const char *fmt, ...)
{
	if (!err)
		return;
	err->code = code;
	va_list ap;
	va_start(ap, fmt);
	char *full = bson_strdupv_printf(fmt, ap);
	va_end(ap);
	/*
	 * Driver messages can quote a piece of the URI's password as a host
	 * name: redact the whole message before shortening it, so that no cut
	 * can split a piece past recognition. "***" may stand for one byte.
	 */
	size_t room = strlen(full) * 3 + 1;
	char *safe = bson_malloc(room);
	memcpy(safe, full, strlen(full) + 1);
	bson_free(full);
	gfs_redact(safe, room);
	gfs_shorten(err->msg, sizeof err->msg, safe, strlen(safe));
	bson_free(safe);
}

void
gfs_error_clear(gfs_error *err)
{
	if (!err)
		return;
	err->code = GFS_OK;
	err->msg[0] = '\0';
}

/*
 * A server's message may go on with lines of advice ("\nSee https://...
 * for more details"): a message of ours is one line, so its first line is
 * what is kept.
 */
static void
first_line(char *dst, size_t size, const char *msg)
{
	snprintf(dst, size, "%.*s", (int)strcspn(msg, "\r\n"), msg);
}

void
gfs_error_from_bson(gfs_error *err, const bson_error_t *berr, const char *context)
{
	char msg[sizeof berr->message];
	first_line(msg, sizeof msg, berr->message);
	/* Reached, and refused: a wrong user, password, mechanism or authSource. */
	if (berr->domain == MONGOC_ERROR_CLIENT && berr->code == MONGOC_ERROR_CLIENT_AUTHENTICATE)
		gfs_error_set(err, GFS_EBACKEND, "%s: authentication failed (check the URI's user, "
		              "password and authSource): %s", context, msg);
	/* The driver's "socket error or timeout": say which wait it may have been. */
	else if (berr->domain == MONGOC_ERROR_STREAM && berr->code == MONGOC_ERROR_STREAM_SOCKET)
		gfs_error_set(err, GFS_EBACKEND, "%s: cannot reach the backend (timed out, or the "
		              "connection broke): %s", context, msg);
	else if (berr->domain == MONGOC_ERROR_SERVER_SELECTION || berr->domain == MONGOC_ERROR_STREAM)
		gfs_error_set(err, GFS_EBACKEND, "%s: cannot reach the backend: %s", context, msg);
	else
		gfs_error_set(err, GFS_EBACKEND, "%s: %s", context, msg);
}

const char *
gfs_errcode_name(enum gfs_errcode code)
{
	switch (code) {
	case GFS_OK: return "ok";
	case GFS_ENOTFOUND: return "not-found";
	case GFS_ENOREVISION: return "no-revision";
	case GFS_EMISSINGCHUNK: return "missing-chunk";
	case GFS_EWRONGSIZE: return "wrong-size-chunk";
	case GFS_EEXTRACHUNK: return "extra-chunk";
	case GFS_EBADDOC: return "bad-document";
	case GFS_ECHECKSUM: return "checksum-mismatch";
	case GFS_EBACKEND: return "backend";
	case GFS_ELOCAL: return "local-io";
	case GFS_EINVAL: return "invalid";
	case GFS_EEXISTS: return "exists";
	case GFS_EBUSY: return "busy";
	case GFS_ECANCELED: return "canceled";
	case GFS_ELIMIT: return "limit";
	}
	return "unknown";
}
