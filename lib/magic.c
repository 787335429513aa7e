#include <magic.h>
#include <stdlib.h>
#include <string.h>

#include "magic.h"
#include "util.h"

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
	size_t n = len < GFS_MAGIC_SNIFF_BYTES ? len : GFS_MAGIC_SNIFF_BYTES;
	const char *t = magic_buffer(m->cookie, buf, n);
	return t && *t ? t : "application/octet-stream";
}

bool
gfs_sniff_add(gfs_sniff *sn, const void *data, size_t len, bool end, const void **head,
              size_t *head_len)
{
	if (sn->done)
		return false;
	/* The first read holds the whole start: typed from it, with no copy. */
	if (!sn->buf && (len >= GFS_MAGIC_SNIFF_BYTES || end)) {
		sn->done = true;
		*head = data;
		*head_len = len;
		return true;
	}
	if (!sn->buf)
		sn->buf = gfs_xmalloc(GFS_MAGIC_SNIFF_BYTES);
	size_t take = GFS_MAGIC_SNIFF_BYTES - sn->len;
	if (take > len)
		take = len;
	memcpy(sn->buf + sn->len, data, take);
	sn->len += take;
	if (sn->len < GFS_MAGIC_SNIFF_BYTES && !end)
		return false;
	sn->done = true;
	*head = sn->buf;
	*head_len = sn->len;
	return true;
}

void
gfs_sniff_free(gfs_sniff *sn)
{
	free(sn->buf);
	sn->buf = NULL;
}
