/*
 * gfs_error: how every lib/ function reports a failure, a kind callers map
 * to exit codes and a one-line message. The whole of it, without the
 * driver: headers that need no more of lib/gfs.h include this one.
 * gfs_error_from_bson, which takes a driver error, stays in gfs.h.
 */
#ifndef GFS_ERROR_H
#define GFS_ERROR_H

#include <stddef.h>

/* Distinct failure kinds, so callers can map them to exit codes. */
enum gfs_errcode {
	GFS_OK = 0,
	GFS_ENOTFOUND,      /* no file of that name or id */
	GFS_ENOREVISION,    /* the name exists, the revision does not */
	GFS_EMISSINGCHUNK,  /* a chunk 0..n-1 is absent */
	GFS_EWRONGSIZE,     /* a chunk's data has the wrong length */
	GFS_EEXTRACHUNK,    /* a chunk numbered n or beyond, or a duplicate */
	GFS_EBADDOC,        /* a files or chunks document is malformed */
	GFS_ECHECKSUM,      /* content does not match metadata.sha256 */
	GFS_EBACKEND,       /* server unreachable or command failed */
	GFS_ELOCAL,         /* a local file could not be read or written */
	GFS_EINVAL,         /* bad argument */
	GFS_EEXISTS,        /* target exists */
	GFS_EBUSY,          /* a lock is held by someone else */
	GFS_ECANCELED,      /* stopped on request */
	GFS_ELIMIT,         /* a guard rail (--max-delete) stopped the run before it deleted */
};

typedef struct gfs_error {
	enum gfs_errcode code;
	char msg[512];
} gfs_error;

/* A message longer than msg keeps its start and its end (the reason), not its middle. */
void gfs_error_set(gfs_error *err, enum gfs_errcode code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* How much of one stored name a message shows, NUL included. */
#define GFS_NAME_SHOWN_MAX 256
/*
 * s[0..len) into dst[size] (size >= 8), NUL-terminated: when it does not fit,
 * its middle becomes "...", cut between UTF-8 characters. Returns dst.
 */
char *gfs_shorten(char *dst, size_t size, const char *s, size_t len);
/* gfs_shorten() with mark (shorter than size - 8) in place of "...". */
char *gfs_shorten_with(char *dst, size_t size, const char *s, size_t len, const char *mark);
void gfs_error_clear(gfs_error *err);
const char *gfs_errcode_name(enum gfs_errcode code);

#endif
