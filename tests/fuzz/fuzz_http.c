/*
 * libFuzzer harness over the pure parts of serve's request handling: the
 * path as libmicrohttpd decodes it and serve joins it to its prefix, Range,
 * If-None-Match, If-Range, If-Modified-Since, ?rev= and /id/ parsing, and the
 * safe-path check that get and mirror apply to stored names.
 *
 * Every input goes through every parser, so one corpus covers them all; the
 * first byte picks the representation length for Range and the prefix, the
 * rest is the header value. Besides the sanitizers, each parser's contract
 * is checked (a range inside the file, a date that survives a format/parse
 * round trip, a checked path with no way out), and a broken contract aborts
 * so libFuzzer keeps the input.
 *
 *   make fuzz                      build and run for FUZZ_SECONDS on the corpus
 *   build/fuzz/fuzz_http CRASHFILE reproduce one finding
 */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../lib/serve/httpparse.h"
#include "../../lib/filename.h"
#include "../../lib/safepath.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
broken(const char *what, const char *input)
{
	fprintf(stderr, "fuzz_http: contract broken: %s on input \"%s\"\n", what, input);
	abort();
}

static const int64_t lengths[] = {0, 1, 2, 10, 1000, 65536, (int64_t)1 << 40, INT64_MAX};
static const char *const prefixes[] = {"", "posters", "posters/", "a//", "/", ".."};

static void
check_range(const char *s, int64_t length)
{
	int64_t first = -7, last = -7;
	enum http_range r = http_range_parse(s, length, &first, &last);
	if (r == HTTP_RANGE_OK && (first < 0 || first > last || last >= length))
		broken("range outside the representation", s);
	if (r == HTTP_RANGE_UNSATISFIABLE && length < 0)
		broken("unsatisfiable for a negative length", s);
}

static void
check_date(const char *s)
{
	int64_t t = http_date_parse(s);
	if (t < -1)
		broken("date below -1", s);
	char buf[32];
	/* Every date the parser takes is one the formatter can write (F8). */
	if (t >= 0) {
		http_date_format(t, buf);
		if (http_date_parse(buf) != t)
			broken("date does not survive format and parse", s);
	}
	/* Any int64, even one gmtime refuses, must format into the buffer. */
	int64_t any = 0;
	memcpy(&any, s, strlen(s) < sizeof any ? strlen(s) : sizeof any);
	http_date_format(any, buf);
	if (!memchr(buf, '\0', sizeof buf))
		broken("formatted date not terminated", s);
}

static void
check_conditionals(const char *s)
{
	static const char *const tags[] = {"\"abc\"", "W/\"abc\"", "\"\"", "\"*\""};
	for (size_t i = 0; i < sizeof tags / sizeof *tags; i++) {
		(void)http_etag_list_match(s, tags[i]);
		(void)http_if_range_ok(s, tags[i], 784111777);
		(void)http_if_range_ok(s, tags[i], -1);
	}
	/* The header's own text as the tag: both sides hostile at once. */
	(void)http_etag_list_match(s, s);
	(void)http_if_range_ok(s, s, 0);
}

static void
check_query(const char *s)
{
	int rev = 12345678;
	if (http_parse_rev(s, &rev) && (rev < -1000000 || rev > 1000000))
		broken("rev outside its bounds", s);
	if (http_is_oid(s)) {
		if (strlen(s) != 24 || strspn(s, "0123456789abcdefABCDEF") != 24)
			broken("not 24 hex digits taken for an id", s);
	}
	if (!http_type_by_ext(s))
		broken("no media type", s);
}

/* What serve does with a URL: libmicrohttpd unescapes it, serve prefixes it. */
static void
check_path(const char *s, const char *prefix)
{
	char *url = strdup(s);
	if (!url)
		abort();
	size_t n = MHD_http_unescape(url);
	if (n > strlen(s) || url[n] != '\0')
		broken("unescape grew the URL or lost its end", s);
	char *norm = gfs_prefix_normalize(prefix);
	char *name = gfs_prefix_join(norm, url);
	const char *rel = gfs_prefix_strip(norm, name);
	if (!rel || strcmp(rel, url) != 0)
		broken("prefix join and strip do not round trip", s);
	free(name);
	free(norm);
	free(url);
}

static bool
has_bad_segment(const char *p, size_t len)
{
	if (len == 0 || p[0] == '/' || p[len - 1] == '/')
		return true;
	size_t start = 0;
	for (size_t i = 0; i <= len; i++) {
		if (i < len && p[i] != '/')
			continue;
		size_t seg = i - start;
		if (seg == 0 || (seg == 1 && p[start] == '.') ||
		    (seg == 2 && p[start] == '.' && p[start + 1] == '.'))
			return true;
		start = i + 1;
	}
	return memchr(p, '\0', len) != NULL;
}

/* A stored name that passes the check can never reach outside the target. */
static void
check_safepath(const uint8_t *data, size_t size, const char *s)
{
	gfs_error err;
	gfs_error_clear(&err);
	bool ok = gfs_safepath_check((const char *)data, size, &err);
	if (ok && has_bad_segment((const char *)data, size))
		broken("a path with a way out passed the check", s);
	if (!ok && !err.msg[0])
		broken("a refusal without a reason", s);
	if (ok && gfs_safepath_dirlen((const char *)data, size) >= size)
		broken("directory part as long as the path", s);
	bool escaped;
	char *name = gfs_name_from_bytes((const char *)data, size, &escaped);
	if (!gfs_utf8_valid(name, strlen(name)))
		broken("a name from bytes that is not UTF-8", s);
	free(name);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	uint8_t sel = data[0];
	char *s = malloc(size);
	if (!s)
		abort();
	memcpy(s, data + 1, size - 1);
	s[size - 1] = '\0';
	check_range(s, lengths[sel % (sizeof lengths / sizeof *lengths)]);
	check_date(s);
	check_conditionals(s);
	check_query(s);
	check_path(s, prefixes[(sel >> 3) % (sizeof prefixes / sizeof *prefixes)]);
	check_safepath(data + 1, size - 1, s);
	free(s);
	return 0;
}
