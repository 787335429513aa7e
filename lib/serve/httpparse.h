/*
 * Small pure helpers for the HTTP server: entity-tag lists, HTTP dates,
 * byte ranges, content types by extension. No I/O, no state, so they can
 * be tested on their own (tests/unit/test_http.c).
 */
#ifndef GFS_SERVE_HTTPPARSE_H
#define GFS_SERVE_HTTPPARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * If-None-Match: true when the header ("*", or a comma-separated list of
 * entity tags, weak or strong) matches etag under the weak comparison of
 * RFC 9110 13.1.2. etag is a quoted entity tag such as "\"abc\"".
 */
bool http_etag_list_match(const char *header, const char *etag);

/*
 * If-Range: true when the header validates the representation, so that the
 * Range applies. An entity tag must match strongly (a weak one never does);
 * an HTTP-date must equal last_modified exactly.
 */
bool http_if_range_ok(const char *header, const char *etag, int64_t last_modified);

/* Parses IMF-fixdate, RFC 850 and asctime dates; seconds since the epoch, or -1. */
int64_t http_date_parse(const char *s);
/* Formats seconds since the epoch (clamped to 1970-9999) as IMF-fixdate: "Sun, 06 Nov 1994 ...". */
void http_date_format(int64_t t, char buf[32]);

enum http_range {
	HTTP_RANGE_NONE,          /* absent, malformed or several ranges: send the whole file */
	HTTP_RANGE_OK,            /* one satisfiable range: [*first, *last] inclusive */
	HTTP_RANGE_UNSATISFIABLE, /* 416 */
};

/* Parses a Range header against a representation of length bytes. */
enum http_range http_range_parse(const char *header, int64_t length, int64_t *first, int64_t *last);

/* A media type guessed from the name's extension; never NULL. */
const char *http_type_by_ext(const char *name);

/* Parses a ?rev= value: an integer in [-1000000, 1000000]. */
bool http_parse_rev(const char *s, int *out);

/*
 * True when a raw (still percent-encoded) request target holds %00, which
 * decodes to a NUL that would cut the name short: such a request is a 400.
 */
bool http_uri_has_nul(const char *raw);

/* True when s is non-empty printable ASCII (tabs allowed): safe as a header value. */
bool http_header_value_ok(const char *s);

/* True when s is exactly 24 hex digits. */
bool http_is_oid(const char *s);

#endif
