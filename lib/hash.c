#include <openssl/evp.h>
#include <stdlib.h>

#include "gfs.h"

struct gfs_sha256 {
	EVP_MD_CTX *ctx;
};

gfs_sha256 *
gfs_sha256_new(void)
{
	gfs_sha256 *h = malloc(sizeof *h);
	if (!h)
		abort();
	h->ctx = EVP_MD_CTX_new();
	if (!h->ctx || EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1)
		abort();
	return h;
}

void
gfs_sha256_update(gfs_sha256 *h, const void *data, size_t len)
{
	if (len && EVP_DigestUpdate(h->ctx, data, len) != 1)
		abort();
}

void
gfs_sha256_final(gfs_sha256 *h, char hex[65])
{
	static const char digits[] = "0123456789abcdef";
	unsigned char md[32];
	unsigned int n = 0;
	if (EVP_DigestFinal_ex(h->ctx, md, &n) != 1 || n != 32)
		abort();
	for (int i = 0; i < 32; i++) {
		hex[2 * i] = digits[md[i] >> 4];
		hex[2 * i + 1] = digits[md[i] & 15];
	}
	hex[64] = '\0';
	EVP_MD_CTX_free(h->ctx);
	free(h);
}
