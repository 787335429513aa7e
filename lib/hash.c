/* Hashing, and the one rule that says whether stored content is intact. */
#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gfs.h"

struct gfs_sha256 {
	EVP_MD_CTX *ctx;
};

/*
 * OpenSSL 3 looks EVP_sha256() up in its providers at every init unless the
 * algorithm is fetched once: that lookup was half of hashing a short string
 * (1.0 us against 0.5), which the disk tier does to name an entry per hit.
 */
static const EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void
fetch_sha256(void)
{
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
	sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
#endif
	if (!sha256_md)
		sha256_md = EVP_sha256();
}

gfs_sha256 *
gfs_sha256_new(void)
{
	pthread_once(&sha256_once, fetch_sha256);
	gfs_sha256 *h = gfs_xmalloc(sizeof *h);
	h->ctx = EVP_MD_CTX_new();
	if (!h->ctx || EVP_DigestInit_ex(h->ctx, sha256_md, NULL) != 1)
		abort();
	return h;
}

void
gfs_sha256_update(gfs_sha256 *h, const void *data, size_t len)
{
	if (len && EVP_DigestUpdate(h->ctx, data, len) != 1)
		abort();
}

/* Finishes ctx, a digest of want bytes, into 2 * want lower-case hex digits and a NUL. */
static void
final_hex(EVP_MD_CTX *ctx, unsigned int want, char *hex)
{
	static const char digits[] = "0123456789abcdef";
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int n = 0;
	if (EVP_DigestFinal_ex(ctx, md, &n) != 1 || n != want)
		abort();
	for (unsigned int i = 0; i < n; i++) {
		hex[2 * i] = digits[md[i] >> 4];
		hex[2 * i + 1] = digits[md[i] & 15];
	}
	hex[2 * n] = '\0';
}

void
gfs_sha256_final(gfs_sha256 *h, char hex[65])
{
	final_hex(h->ctx, 32, hex);
	EVP_MD_CTX_free(h->ctx);
	free(h);
}

/* ---- the integrity rule ---------------------------------------------- */

bool
gfs_hash_field(const bson_iter_t *it, char *dst, size_t want)
{
	dst[0] = '\0';
	if (BSON_ITER_HOLDS_NULL(it))
		return true;
	if (!BSON_ITER_HOLDS_UTF8(it))
		return false;
	uint32_t len;
	const char *s = bson_iter_utf8(it, &len);
	if (len != want || strspn(s, "0123456789abcdefABCDEF") != want)
		return false;
	memcpy(dst, s, want);
	dst[want] = '\0';
	return true;
}

/* A malformed sha256 decides even beside a good md5: whoever stored it meant it to. */
enum gfs_check
gfs_integrity_rule(const gfs_file *f)
{
	if (strcmp(f->bad_hash, "sha256") == 0)
		return GFS_CHECK_MALFORMED;
	if (f->sha256[0])
		return GFS_CHECK_SHA256;
	if (f->bad_hash[0])
		return GFS_CHECK_MALFORMED;
	return f->md5[0] ? GFS_CHECK_MD5 : GFS_CHECK_NONE;
}

bool
gfs_integrity_check(const gfs_file *f, const char *sha256_hex, const char *md5_hex, gfs_error *err)
{
	enum gfs_check c = gfs_integrity_rule(f);
	const char *name = f->filename ? f->filename : "(unnamed)";
	if (c == GFS_CHECK_NONE)
		return true;
	if (c == GFS_CHECK_MALFORMED) {
		gfs_error_set(err, GFS_ECHECKSUM, "%s: stored %s is malformed (not %d hex digits): "
		              "nothing proves the content", name, f->bad_hash,
		              strcmp(f->bad_hash, "md5") == 0 ? 32 : 64);
		return false;
	}
	const char *algo = c == GFS_CHECK_SHA256 ? "sha256" : "md5";
	const char *want = c == GFS_CHECK_SHA256 ? f->sha256 : f->md5;
	const char *got = c == GFS_CHECK_SHA256 ? sha256_hex : md5_hex;
	/* Other tools store the hex in upper case; it names the same digest. */
	if (got && strcasecmp(got, want) == 0)
		return true;
	gfs_error_set(err, GFS_ECHECKSUM, "%s: content %s %s does not match stored %s", name, algo,
	              got ? got : "(not computed)", want);
	return false;
}

struct gfs_digest {
	gfs_sha256 *sha;
	EVP_MD_CTX *md5;
};

gfs_digest *
gfs_digest_new(const gfs_file *f)
{
	gfs_digest *d = gfs_xcalloc(1, sizeof *d);
	d->sha = gfs_sha256_new();
	if (gfs_integrity_rule(f) == GFS_CHECK_MD5) {
		d->md5 = EVP_MD_CTX_new();
		if (!d->md5 || EVP_DigestInit_ex(d->md5, EVP_md5(), NULL) != 1)
			abort();
	}
	return d;
}

void
gfs_digest_update(gfs_digest *d, const void *data, size_t len)
{
	gfs_sha256_update(d->sha, data, len);
	if (d->md5 && len && EVP_DigestUpdate(d->md5, data, len) != 1)
		abort();
}

void
gfs_digest_final(gfs_digest *d, char sha256_hex[65], char md5_hex[33])
{
	gfs_sha256_final(d->sha, sha256_hex);
	md5_hex[0] = '\0';
	if (d->md5) {
		final_hex(d->md5, 16, md5_hex);
		EVP_MD_CTX_free(d->md5);
	}
	free(d);
}

bool
gfs_digest_check(gfs_digest *d, const gfs_file *f, char *sha256_out, gfs_error *err)
{
	char sha[65], md5[33];
	gfs_digest_final(d, sha, md5);
	if (sha256_out)
		memcpy(sha256_out, sha, sizeof sha);
	return gfs_integrity_check(f, sha, md5, err);
}
