#include <magic.h>
#include <stdlib.h>

#include "magic.h"
#include "util.h"

/* libmagic needs only the start of a file; more makes text checks slower for nothing. */
#define MAGIC_SNIFF_BYTES (64 * 1024)

struct gfs_magic {
	magic_t cookie;
};

gfs_magic *
gfs_magic_open(gfs_error *err)
{
	/* Compressed files are typed as such: looking inside them costs time and tells readers little. */
	magic_t cookie = magic_open(MAGIC_MIME_TYPE | MAGIC_NO_CHECK_COMPRESS);
	if (!cookie) {
		gfs_error_set(err, GFS_ELOCAL, "libmagic: cannot initialise");
		return NULL;
	}
	if (magic_load(cookie, NULL) != 0) {
		gfs_error_set(err, GFS_ELOCAL, "libmagic: %s", magic_error(cookie));
		magic_close(cookie);
		return NULL;
	}
	gfs_magic *m = gfs_xmalloc(sizeof *m);
	m->cookie = cookie;
	return m;
}

void
gfs_magic_close(gfs_magic *m)
{
	if (!m)
		return;
	magic_close(m->cookie);
	free(m);
}

const char *
gfs_magic_type(gfs_magic *m, const void *buf, size_t len)
{
	const char *t = magic_buffer(m->cookie, buf, len < MAGIC_SNIFF_BYTES ? len : MAGIC_SNIFF_BYTES);
	return t && *t ? t : "application/octet-stream";
}
