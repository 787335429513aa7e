/*
 * Mirror's names: what a stored name becomes on disk, and the names of the
 * temporary files a write goes through.
 *
 * A stored name below the mirror prefix is its local path, unless it has a
 * metadata.rawName (bytes an import could not store as UTF-8), whose raw
 * segments then take the place of their escaped ones. Every path is checked
 * by safepath (nothing absolute, no "..", no empty or over-long segment)
 * and must not look like a temporary file, which the sweep would remove,
 * nor lie deeper than the sweep goes. Writers check their names with the
 * same rule (put, mv), so nothing is stored that mirror refuses.
 *
 * A temporary file is ".gridfsctl-mirror-" 16 hex digits ".tmp" beside its
 * target: random, so that two writers never share one, and of a form the
 * sweep recognises as its own to remove (backup.c makes its copies under
 * such names too).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "../filename.h"
#include "../safepath.h"
#include "mirror.h"

bool
gfs_mirror_is_temp_name(const char *base, size_t len)
{
	size_t pl = strlen(GFS_MIRROR_TMP_PREFIX), sl = strlen(GFS_MIRROR_TMP_SUFFIX);
	if (len != pl + 16 + sl || memcmp(base, GFS_MIRROR_TMP_PREFIX, pl) != 0 ||
	    memcmp(base + pl + 16, GFS_MIRROR_TMP_SUFFIX, sl) != 0)
		return false;
	for (size_t i = pl; i < pl + 16; i++)
		if (!strchr("0123456789abcdef", base[i]) || base[i] == '\0')
			return false;
	return true;
}

void
gfs_mirror_temp_name(char buf[64])
{
	static atomic_uint_fast64_t counter;
	uint64_t r;
	if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		r = ((uint64_t)getpid() << 40) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
	}
	r ^= atomic_fetch_add(&counter, 1);
	snprintf(buf, 64, "%s%016llx%s", GFS_MIRROR_TMP_PREFIX, (unsigned long long)r,
	         GFS_MIRROR_TMP_SUFFIX);
}

static size_t
count_char(const char *s, size_t len, char c)
{
	size_t n = 0;
	for (size_t i = 0; i < len; i++)
		n += s[i] == c;
	return n;
}

/*
 * With rawName, the stored name is (import prefix) + escape(raw), and
 * escaping never touches '/', so segments match one to one: the last
 * segments of the filename must be exactly escape(raw). The local path is
 * then the filename below the mirror prefix with those segments swapped for
 * the raw bytes; when the mirror prefix reaches into them, their leading
 * raw segments are dropped instead.
 */
static bool
restore_raw(const char *filename, size_t tail_off, const char *raw, size_t raw_len, char **out,
            size_t *out_len, gfs_error *err)
{
	bool escaped;
	char *esc = gfs_name_from_bytes(raw, raw_len, &escaped);
	size_t fl = strlen(filename), el = strlen(esc);
	bool match = el <= fl && strcmp(filename + fl - el, esc) == 0 &&
	             (el == fl || filename[fl - el - 1] == '/');
	free(esc);
	if (!match) {
		gfs_error_set(err, GFS_EINVAL, "metadata.rawName does not match the filename");
		return false;
	}
	size_t raw_off = fl - el;
	char *buf = gfs_xmalloc(fl - tail_off + raw_len + 1);
	size_t n = 0;
	if (tail_off <= raw_off) {
		memcpy(buf, filename + tail_off, raw_off - tail_off);
		n = raw_off - tail_off;
		memcpy(buf + n, raw, raw_len);
		n += raw_len;
	} else {
		size_t skip = count_char(filename + raw_off, tail_off - raw_off, '/');
		size_t i = 0;
		while (skip > 0 && i < raw_len)
			skip -= raw[i++] == '/';
		memcpy(buf, raw + i, raw_len - i);
		n = raw_len - i;
	}
	buf[n] = '\0';
	*out = buf;
	*out_len = n;
	return true;
}

bool
gfs_mirror_name_check(const char *rel, size_t len, gfs_error *err)
{
	if (!gfs_safepath_check(rel, len, err))
		return false;
	size_t dl = gfs_safepath_dirlen(rel, len);
	size_t bo = dl ? dl + 1 : 0;
	if (gfs_mirror_is_temp_name(rel + bo, len - bo)) {
		gfs_error_set(err, GFS_EINVAL, "name has the form of a mirror temporary file");
		return false;
	}
	if (count_char(rel, len, '/') > GFS_MIRROR_DEPTH_MAX) {
		gfs_error_set(err, GFS_EINVAL, "more than %d folders deep, deeper than the sweep goes",
		              GFS_MIRROR_DEPTH_MAX);
		return false;
	}
	return true;
}

bool
gfs_mirror_local_path(const char *filename, const char *nprefix, const char *raw,
                      size_t raw_len, char **out, size_t *out_len, gfs_error *err)
{
	*out = NULL;
	const char *tail = gfs_prefix_strip(nprefix ? nprefix : "", filename);
	if (!tail) {
		gfs_error_set(err, GFS_EINVAL, "not under the prefix");
		return false;
	}
	/* "p//e" under the prefix "p/" is not an absolute name: the stored name has an empty segment. */
	if (nprefix && *nprefix && *tail == '/') {
		gfs_error_set(err, GFS_EINVAL, "empty path segment");
		return false;
	}
	char *rel;
	size_t len;
	if (raw) {
		if (!restore_raw(filename, (size_t)(tail - filename), raw, raw_len, &rel, &len, err))
			return false;
	} else {
		rel = gfs_xstrdup(tail);
		len = strlen(rel);
	}
	if (!gfs_mirror_name_check(rel, len, err)) {
		free(rel);
		return false;
	}
	*out = rel;
	*out_len = len;
	return true;
}

