/*
 * Content types from libmagic. A magic_t is not safe to share between
 * threads, so each worker opens its own gfs_magic.
 *
 * Every writer types a file by the same first GFS_MAGIC_SNIFF_BYTES,
 * whatever the size of its reads: a gfs_sniff gathers them when the reads
 * are chunks smaller than that (a chunk size of 1 would otherwise type a
 * text file by its first byte).
 */
#ifndef GFS_MAGIC_H
#define GFS_MAGIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* libmagic needs only the start of a file; more makes text checks slower for nothing. */
#define GFS_MAGIC_SNIFF_BYTES (64 * 1024)

typedef struct gfs_magic gfs_magic;

/* The start of a file being read; zero it to begin. */
typedef struct gfs_sniff {
	uint8_t *buf;   /* what was gathered, when the first read was short of the whole start */
	size_t len;
	bool done;
} gfs_sniff;

/* Loads the default magic database. */
gfs_magic *gfs_magic_open(gfs_error *err);
void gfs_magic_close(gfs_magic *m);
/*
 * The MIME type of a buffer holding the start of a file ("image/jpeg"), or
 * "application/octet-stream" when libmagic cannot tell. The string stays
 * valid until the next call on m.
 */
const char *gfs_magic_type(gfs_magic *m, const void *buf, size_t len);

/*
 * Adds the next read of the file (end: it was the last). True once, when
 * the start is complete: *head and *head_len are then what to type, valid
 * until gfs_sniff_free() and while data is.
 */
bool gfs_sniff_add(gfs_sniff *sn, const void *data, size_t len, bool end, const void **head,
                   size_t *head_len);
void gfs_sniff_free(gfs_sniff *sn);

#endif
