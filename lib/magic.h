/*
 * Content types from libmagic. A magic_t is not safe to share between
 * threads, so each worker opens its own gfs_magic.
 */
#ifndef GFS_MAGIC_H
#define GFS_MAGIC_H

#include <stddef.h>

#include "error.h"

typedef struct gfs_magic gfs_magic;

/* Loads the default magic database. */
gfs_magic *gfs_magic_open(gfs_error *err);
void gfs_magic_close(gfs_magic *m);
/*
 * The MIME type of a buffer holding the start of a file ("image/jpeg"), or
 * "application/octet-stream" when libmagic cannot tell. The string stays
 * valid until the next call on m.
 */
const char *gfs_magic_type(gfs_magic *m, const void *buf, size_t len);

#endif
