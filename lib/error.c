#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "gfs.h"

void
gfs_error_set(gfs_error *err, enum gfs_errcode code, const char *fmt, ...)
{
	if (!err)
		return;
	err->code = code;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof err->msg, fmt, ap);
	va_end(ap);
}

void
gfs_error_clear(gfs_error *err)
{
	if (!err)
		return;
	err->code = GFS_OK;
	err->msg[0] = '\0';
}

void
gfs_error_from_bson(gfs_error *err, const bson_error_t *berr, const char *context)
{
	if (berr->domain == MONGOC_ERROR_SERVER_SELECTION || berr->domain == MONGOC_ERROR_STREAM)
		gfs_error_set(err, GFS_EBACKEND, "%s: cannot reach the backend: %s", context, berr->message);
	else
		gfs_error_set(err, GFS_EBACKEND, "%s: %s", context, berr->message);
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
	}
	return "unknown";
}
