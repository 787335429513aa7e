/*
 * Redaction: no credential in a message. gfs_conn_open() remembers the
 * password of its URI (gfs_secrets_from_uri), and every message that may
 * quote it (gfs_error_set, the driver's log) goes through gfs_redact().
 * Below the connection and the errors, which both use it: it needs only
 * lib/util.c and libbson.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <bson/bson.h>

#include "redact.h"
#include "util.h"

const char *
gfs_uri_password(const char *authority, size_t len, size_t *pwlen)
{
	const char *at = NULL;
	for (const char *p = authority; p < authority + len; p++)
		if (*p == '@')
			at = p;
	if (!at)
		return NULL;
	const char *colon = memchr(authority, ':', (size_t)(at - authority));
	if (!colon)
		return NULL;
	*pwlen = (size_t)(at - colon - 1);
	return colon + 1;
}

/* ---- secrets kept out of messages ------------------------------------ */

#define MAX_SECRETS 32

static pthread_mutex_t secrets_mu = PTHREAD_MUTEX_INITIALIZER;
static char *secrets[MAX_SECRETS];   /* longest first, so a whole password goes before its pieces */
static size_t nsecrets;

static void
secret_add(const char *s, size_t n)
{
	if (n == 0)
		return;
	pthread_mutex_lock(&secrets_mu);
	size_t i = 0;
	while (i < nsecrets && !(strlen(secrets[i]) == n && memcmp(secrets[i], s, n) == 0))
		i++;
	if (i == nsecrets && nsecrets < MAX_SECRETS) {
		char *copy = gfs_xstrndup(s, n);
		for (i = nsecrets++; i > 0 && strlen(secrets[i - 1]) < n; i--)
			secrets[i] = secrets[i - 1];
		secrets[i] = copy;
	}
	pthread_mutex_unlock(&secrets_mu);
}

/* The password and every run of it between '@'s (or its ends): each may be printed alone. */
static void
secret_add_pieces(const char *pw, size_t n)
{
	for (size_t from = 0; from <= n; from++) {
		if (from > 0 && pw[from - 1] != '@')
			continue;
		for (size_t to = from + 1; to <= n; to++)
			if (to == n || pw[to] == '@')
				secret_add(pw + from, to - from);
	}
}

static int
hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = (char)(c | 0x20);
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

void
gfs_secrets_from_uri(const char *uri)
{
	if (!uri)
		return;
	const char *scheme = strstr(uri, "://");
	const char *start = scheme ? scheme + 3 : uri;
	size_t n;
	/* As --uri scrubbing does: the userinfo ends at the last '@' before the options. */
	const char *pw = gfs_uri_password(start, strcspn(start, "?"), &n);
	if (!pw || n == 0)
		return;
	secret_add_pieces(pw, n);
	char *plain = gfs_xmalloc(n + 1);
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		if (pw[i] == '%' && i + 2 < n && hex_value(pw[i + 1]) >= 0 && hex_value(pw[i + 2]) >= 0) {
			plain[o++] = (char)(hex_value(pw[i + 1]) * 16 + hex_value(pw[i + 2]));
			i += 2;
		} else {
			plain[o++] = pw[i];
		}
	}
	secret_add_pieces(plain, o);
	free(plain);
}

/* Replaces the occurrences of one secret; out has room for size bytes. */
static void
redact_one(char *msg, size_t size, const char *secret)
{
	size_t sl = strlen(secret);
	char *hit = strstr(msg, secret);
	if (!hit)
		return;
	char *out = gfs_xmalloc(size);
	size_t o = 0;
	const char *p = msg;
	while (hit && o + 1 < size) {
		size_t keep = (size_t)(hit - p);
		o += (size_t)snprintf(out + o, size - o, "%.*s***", (int)keep, p);
		o = o < size ? o : size - 1;
		p = hit + sl;
		hit = strstr(p, secret);
	}
	if (o + 1 < size)
		snprintf(out + o, size - o, "%s", p);
	memcpy(msg, out, size);
	msg[size - 1] = '\0';
	free(out);
}

void
gfs_redact(char *msg, size_t size)
{
	if (!msg || size == 0)
		return;
	pthread_mutex_lock(&secrets_mu);
	for (size_t i = 0; i < nsecrets; i++)
		redact_one(msg, size, secrets[i]);
	pthread_mutex_unlock(&secrets_mu);
}

char *
gfs_uri_redact(const char *uri)
{
	const char *scheme = strstr(uri, "://");
	const char *start = scheme ? scheme + 3 : uri;
	size_t n;
	const char *pw = gfs_uri_password(start, strcspn(start, "/"), &n);
	if (!pw)
		return strdup(uri);
	return bson_strdup_printf("%.*s***%s", (int)(pw - uri), uri, pw + n);
}
