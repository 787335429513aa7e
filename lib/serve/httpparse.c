/* HTTP helpers: entity tags, dates, ranges, types. Pure functions only. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "httpparse.h"

/* ---- entity tags ----------------------------------------------------- */

static const char *
skip_list_space(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == ',')
		p++;
	return p;
}

/*
 * Reads one entity tag at p: optional W/, then a quoted string. Sets the
 * opaque part (quotes included) in *tag and *len. Returns the position after
 * it, or NULL when p does not hold a well-formed tag.
 */
static const char *
next_etag(const char *p, bool *weak, const char **tag, size_t *len)
{
	*weak = false;
	if (p[0] == 'W' && p[1] == '/') {
		*weak = true;
		p += 2;
	}
	if (*p != '"')
		return NULL;
	const char *end = strchr(p + 1, '"');
	if (!end)
		return NULL;
	*tag = p;
	*len = (size_t)(end - p + 1);
	return end + 1;
}

static const char *
strip_weak(const char *etag, bool *weak)
{
	*weak = etag[0] == 'W' && etag[1] == '/';
	return *weak ? etag + 2 : etag;
}

bool
http_etag_list_match(const char *header, const char *etag)
{
	if (!header || !etag)
		return false;
	bool ours_weak;
	const char *ours = strip_weak(etag, &ours_weak);
	size_t ours_len = strlen(ours);
	const char *p = skip_list_space(header);
	if (*p == '*')
		return true;
	while (*p) {
		bool weak;
		const char *tag;
		size_t len;
		p = next_etag(p, &weak, &tag, &len);
		if (!p)
			return false; /* a malformed list matches nothing */
		if (len == ours_len && memcmp(tag, ours, len) == 0)
			return true;
		p = skip_list_space(p);
	}
	return false;
}

bool
http_if_range_ok(const char *header, const char *etag, int64_t last_modified)
{
	if (!header)
		return true;
	while (*header == ' ' || *header == '\t')
		header++;
	if (header[0] == '"' || (header[0] == 'W' && header[1] == '/')) {
		bool weak, ours_weak;
		const char *tag;
		size_t len;
		const char *ours = strip_weak(etag, &ours_weak);
		const char *end = next_etag(header, &weak, &tag, &len);
		if (!end || weak || ours_weak)
			return false;
		return len == strlen(ours) && memcmp(tag, ours, len) == 0;
	}
	int64_t t = http_date_parse(header);
	return t >= 0 && t == last_modified;
}

/* ---- dates ----------------------------------------------------------- */

#define HTTP_DATE_MAX 253402300799 /* 9999-12-31T23:59:59Z */

static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
static const char wdays[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};

static int
month_index(const char *s)
{
	for (int i = 0; i < 12; i++)
		if (strncmp(s, months[i], 3) == 0)
			return i;
	return -1;
}

/* Reads exactly n digits. */
static bool
digits(const char **p, int n, int *out)
{
	int v = 0;
	for (int i = 0; i < n; i++) {
		if (!isdigit((unsigned char)(*p)[i]))
			return false;
		v = v * 10 + ((*p)[i] - '0');
	}
	*p += n;
	*out = v;
	return true;
}

static bool
expect(const char **p, char c)
{
	if (**p != c)
		return false;
	(*p)++;
	return true;
}

static bool
parse_clock(const char **p, struct tm *tm)
{
	return digits(p, 2, &tm->tm_hour) && expect(p, ':') && digits(p, 2, &tm->tm_min) &&
	       expect(p, ':') && digits(p, 2, &tm->tm_sec);
}

static bool
parse_month(const char **p, struct tm *tm)
{
	tm->tm_mon = month_index(*p);
	if (tm->tm_mon < 0)
		return false;
	*p += 3;
	return true;
}

/* "06 Nov 1994 08:49:37 GMT" after "Sun, " */
static bool
parse_imf(const char *p, struct tm *tm)
{
	return digits(&p, 2, &tm->tm_mday) && expect(&p, ' ') && parse_month(&p, tm) &&
	       expect(&p, ' ') && digits(&p, 4, &tm->tm_year) && expect(&p, ' ') &&
	       parse_clock(&p, tm) && strcmp(p, " GMT") == 0;
}

/* "06-Nov-94 08:49:37 GMT" after "Sunday, " */
static bool
parse_rfc850(const char *p, struct tm *tm)
{
	if (!(digits(&p, 2, &tm->tm_mday) && expect(&p, '-') && parse_month(&p, tm) &&
	      expect(&p, '-') && digits(&p, 2, &tm->tm_year) && expect(&p, ' ') &&
	      parse_clock(&p, tm) && strcmp(p, " GMT") == 0))
		return false;
	/* RFC 9110: a two-digit year more than 50 years ahead is in the past century. */
	tm->tm_year += tm->tm_year < 70 ? 2000 : 1900;
	return true;
}

/* "Nov  6 08:49:37 1994" after "Sun " */
static bool
parse_asctime(const char *p, struct tm *tm)
{
	if (!parse_month(&p, tm) || !expect(&p, ' '))
		return false;
	if (*p == ' ') {
		p++;
		if (!digits(&p, 1, &tm->tm_mday))
			return false;
	} else if (!digits(&p, 2, &tm->tm_mday)) {
		return false;
	}
	return expect(&p, ' ') && parse_clock(&p, tm) && expect(&p, ' ') &&
	       digits(&p, 4, &tm->tm_year) && *p == '\0';
}

int64_t
http_date_parse(const char *s)
{
	if (!s)
		return -1;
	while (*s == ' ')
		s++;
	struct tm tm;
	memset(&tm, 0, sizeof tm);
	const char *comma = strchr(s, ',');
	bool ok;
	if (comma && comma - s == 3)
		ok = comma[1] == ' ' && parse_imf(comma + 2, &tm);
	else if (comma)
		ok = comma[1] == ' ' && parse_rfc850(comma + 2, &tm);
	else
		ok = strlen(s) > 4 && s[3] == ' ' && parse_asctime(s + 4, &tm);
	if (!ok || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 || tm.tm_min > 59 ||
	    tm.tm_sec > 60)
		return -1;
	tm.tm_year -= 1900;
	time_t t = timegm(&tm);
	/*
	 * A leap second on the last day of 9999 normalises into year 10000,
	 * which no HTTP-date can write: accept only what http_date_format can.
	 */
	return t < 0 || t > HTTP_DATE_MAX ? -1 : (int64_t)t;
}

void
http_date_format(int64_t t, char buf[32])
{
	/*
	 * An HTTP-date writes the years 1970 to 9999; gmtime of a larger t
	 * gives a tm_year that overflows when 1900 is added.
	 */
	if (t < 0)
		t = 0;
	if (t > HTTP_DATE_MAX)
		t = HTTP_DATE_MAX;
	time_t tt = (time_t)t;
	struct tm tm;
	if (!gmtime_r(&tt, &tm)) {
		snprintf(buf, 32, "Thu, 01 Jan 1970 00:00:00 GMT");
		return;
	}
	snprintf(buf, 32, "%s, %02d %s %04d %02d:%02d:%02d GMT", wdays[tm.tm_wday], tm.tm_mday,
	         months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

/* ---- ranges ---------------------------------------------------------- */

/*
 * Reads a non-negative decimal; -1 when there is none. A position too
 * large for int64_t saturates at INT64_MAX: it is past the end of any file,
 * which makes a first position unsatisfiable (416) and a last one the end,
 * where refusing to parse it would send the whole file instead.
 */
static int64_t
read_pos(const char **p)
{
	if (!isdigit((unsigned char)**p))
		return -1;
	int64_t v = 0;
	for (; isdigit((unsigned char)**p); (*p)++) {
		int d = **p - '0';
		v = v > (INT64_MAX - d) / 10 ? INT64_MAX : v * 10 + d;
	}
	return v;
}

enum http_range
http_range_parse(const char *h, int64_t length, int64_t *first, int64_t *last)
{
	if (!h)
		return HTTP_RANGE_NONE;
	while (*h == ' ')
		h++;
	if (strncasecmp(h, "bytes=", 6) != 0)
		return HTTP_RANGE_NONE;
	const char *p = h + 6;
	while (*p == ' ')
		p++;
	int64_t a = -1, b = -1;
	if (*p == '-') {
		p++;
		b = read_pos(&p); /* suffix: the last b bytes */
		if (b < 0)
			return HTTP_RANGE_NONE;
	} else {
		a = read_pos(&p);
		if (a < 0 || *p != '-')
			return HTTP_RANGE_NONE;
		p++;
		if (isdigit((unsigned char)*p)) {
			b = read_pos(&p);
			if (b < 0 || b < a)
				return HTTP_RANGE_NONE;
		}
	}
	while (*p == ' ')
		p++;
	/* Several ranges: RFC 9110 lets a server ignore Range and send it all. */
	if (*p != '\0')
		return HTTP_RANGE_NONE;
	if (a < 0) {
		if (b == 0 || length == 0)
			return HTTP_RANGE_UNSATISFIABLE;
		*first = b >= length ? 0 : length - b;
		*last = length - 1;
		return HTTP_RANGE_OK;
	}
	if (a >= length)
		return HTTP_RANGE_UNSATISFIABLE;
	*first = a;
	*last = b < 0 || b >= length ? length - 1 : b;
	return HTTP_RANGE_OK;
}

/* ---- types ----------------------------------------------------------- */

static const struct {
	const char *ext;
	const char *type;
} types[] = {
	{"jpg", "image/jpeg"}, {"jpeg", "image/jpeg"}, {"png", "image/png"},
	{"gif", "image/gif"}, {"webp", "image/webp"}, {"avif", "image/avif"},
	{"svg", "image/svg+xml"}, {"ico", "image/vnd.microsoft.icon"}, {"bmp", "image/bmp"},
	{"tif", "image/tiff"}, {"tiff", "image/tiff"},
	{"html", "text/html; charset=utf-8"}, {"htm", "text/html; charset=utf-8"},
	{"css", "text/css; charset=utf-8"}, {"js", "text/javascript; charset=utf-8"},
	{"mjs", "text/javascript; charset=utf-8"}, {"json", "application/json"},
	{"txt", "text/plain; charset=utf-8"}, {"csv", "text/csv; charset=utf-8"},
	{"md", "text/markdown; charset=utf-8"}, {"xml", "application/xml"},
	{"pdf", "application/pdf"}, {"zip", "application/zip"}, {"gz", "application/gzip"},
	{"tar", "application/x-tar"}, {"wasm", "application/wasm"},
	{"mp4", "video/mp4"}, {"webm", "video/webm"}, {"mp3", "audio/mpeg"},
	{"ogg", "audio/ogg"}, {"wav", "audio/wav"},
	{"woff", "font/woff"}, {"woff2", "font/woff2"}, {"ttf", "font/ttf"}, {"otf", "font/otf"},
};

const char *
http_type_by_ext(const char *name)
{
	const char *slash = name ? strrchr(name, '/') : NULL;
	const char *base = slash ? slash + 1 : name;
	const char *dot = base ? strrchr(base, '.') : NULL;
	if (!dot || dot == base)
		return "application/octet-stream";
	for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
		if (strcasecmp(dot + 1, types[i].ext) == 0)
			return types[i].type;
	return "application/octet-stream";
}

bool
http_parse_rev(const char *s, int *out)
{
	if (!s || !*s)
		return false;
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || *end || v < -1000000 || v > 1000000)
		return false;
	*out = (int)v;
	return true;
}

bool
http_uri_has_nul(const char *raw)
{
	for (const char *p = strchr(raw, '%'); p; p = strchr(p + 1, '%'))
		if (p[1] == '0' && p[2] == '0')
			return true;
	return false;
}

bool
http_header_value_ok(const char *s)
{
	if (!s || !*s)
		return false;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		if ((*p < ' ' && *p != '\t') || *p > '~')
			return false;
	return true;
}

bool
http_is_oid(const char *s)
{
	size_t n = 0;
	for (; s[n]; n++)
		if (!isxdigit((unsigned char)s[n]))
			return false;
	return n == 24;
}
