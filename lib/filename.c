#include <stdlib.h>
#include <string.h>

#include "filename.h"

char *
gfs_prefix_normalize(const char *prefix)
{
	if (!prefix || !*prefix)
		return strdup("");
	size_t n = strlen(prefix);
	while (n > 0 && prefix[n - 1] == '/')
		n--;
	if (n == 0)
		return strdup("");
	char *out = gfs_xmalloc(n + 2);
	memcpy(out, prefix, n);
	out[n] = '/';
	out[n + 1] = '\0';
	return out;
}

char *
gfs_prefix_join(const char *prefix, const char *rel)
{
	char *p = gfs_prefix_normalize(prefix);
	char *out = gfs_xasprintf("%s%s", p, rel);
	free(p);
	return out;
}

char *
gfs_stored_name(const char *prefix, const char *rel, size_t len, bool *escaped)
{
	char *utf8 = gfs_name_from_bytes(rel, len, escaped);
	char *name = gfs_prefix_join(prefix, utf8);
	free(utf8);
	return name;
}

const char *
gfs_prefix_strip(const char *normalized_prefix, const char *name)
{
	size_t n = strlen(normalized_prefix);
	if (strncmp(name, normalized_prefix, n) != 0)
		return NULL;
	return name + n;
}

/* Length of the valid UTF-8 sequence at s (at most len bytes), or 0 if none. */
static size_t
utf8_seq_len(const unsigned char *s, size_t len)
{
	unsigned char c = s[0];
	size_t need;
	unsigned int cp;
	if (c == 0)
		return 0;
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf) {
		need = 2;
		cp = c & 0x1f;
	} else if (c >= 0xe0 && c <= 0xef) {
		need = 3;
		cp = c & 0x0f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		need = 4;
		cp = c & 0x07;
	} else {
		return 0;
	}
	if (len < need)
		return 0;
	for (size_t i = 1; i < need; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	/* Overlong forms, surrogates and code points past U+10FFFF are not UTF-8. */
	if ((need == 3 && cp < 0x800) || (need == 4 && cp < 0x10000) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return 0;
	return need;
}

bool
gfs_utf8_valid(const char *bytes, size_t len)
{
	const unsigned char *s = (const unsigned char *)bytes;
	size_t i = 0;
	while (i < len) {
		size_t n = utf8_seq_len(s + i, len - i);
		if (n == 0)
			return false;
		i += n;
	}
	return true;
}

char *
gfs_name_from_bytes(const char *bytes, size_t len, bool *escaped)
{
	const unsigned char *s = (const unsigned char *)bytes;
	char *out = gfs_xmalloc(len * 3 + 1);
	size_t i = 0, o = 0;
	*escaped = false;
	while (i < len) {
		size_t n = utf8_seq_len(s + i, len - i);
		if (n > 0) {
			memcpy(out + o, s + i, n);
			o += n;
			i += n;
			continue;
		}
		static const char hex[] = "0123456789ABCDEF";
		out[o++] = '%';
		out[o++] = hex[s[i] >> 4];
		out[o++] = hex[s[i] & 15];
		i++;
		*escaped = true;
	}
	out[o] = '\0';
	return out;
}

char *
gfs_raw_name(const bson_t *files_doc, size_t *len)
{
	bson_iter_t it, meta;
	if (!bson_iter_init_find(&it, files_doc, "metadata") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
	    !bson_iter_recurse(&it, &meta) || !bson_iter_find(&meta, GFS_RAWNAME_FIELD) ||
	    !BSON_ITER_HOLDS_BINARY(&meta))
		return NULL;
	bson_subtype_t sub;
	uint32_t n;
	const uint8_t *data;
	bson_iter_binary(&meta, &sub, &n, &data);
	if (memchr(data, 0, n))
		return NULL;
	char *out = gfs_xmalloc(n + 1);
	memcpy(out, data, n);
	out[n] = '\0';
	*len = n;
	return out;
}
