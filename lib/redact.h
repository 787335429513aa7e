/*
 * Redaction (lib/redact.c): what a message may not show. The password of
 * the URI, as typed, percent-decoded and in the pieces the driver may print
 * as a host name, is replaced by "***" wherever a message quotes it.
 * Without the driver, so that lib/error.c can use it: below conn.c and error.c.
 */
#ifndef GFS_REDACT_H
#define GFS_REDACT_H

#include <stddef.h>

/* The URI with any password removed, safe to print or log. */
char *gfs_uri_redact(const char *uri);
/*
 * The password in a URL's authority[0..len) (what follows "scheme://"):
 * after the first ':' before the last '@'. NULL when there is none; else
 * its start, and its length (maybe 0) in pwlen.
 */
const char *gfs_uri_password(const char *authority, size_t len, size_t *pwlen);
/*
 * Remembers the password of uri for gfs_redact(): as written, percent-decoded,
 * and every run of the pieces an unescaped '@' cuts it into, since the driver
 * splits the authority at another '@' than we do and prints the rest as a
 * host name.
 * gfs_conn_open() calls it; safe from any thread.
 */
void gfs_secrets_from_uri(const char *uri);
/* Replaces every remembered secret in msg[0..size) (NUL-terminated) with "***". */
void gfs_redact(char *msg, size_t size);

#endif
