/*
 * Reading the chunks of many files with one query per file, on several
 * connections at once, and handing them to one consumer in file order.
 *
 * Each query is {files_id: {$eq: id}} with no sort, the read the GridFS
 * index {files_id: 1, n: 1} serves with one seek: the cost grows with the
 * files asked for, not with the bucket. A file's chunks come in the order
 * the server sends them (on MongoDB the index's, by n, but nothing
 * promises it): the consumer places them by n. Round trips overlap, since each
 * worker thread has its own connection from the pool. Workers run at most
 * a window of files ahead of the consumer and hold at most a few MiB per
 * file, so memory stays bounded whatever the files' sizes.
 */
#ifndef GFS_FETCH_H
#define GFS_FETCH_H

#include "gfs.h"

typedef struct gfs_fetch gfs_fetch;

/*
 * Starts jobs threads (at least one) reading the chunks of ids[0..n) with
 * batchSize batch. ids must stay valid until gfs_fetch_free().
 */
gfs_fetch *gfs_fetch_start(gfs_conn *conn, const bson_value_t *const *ids, size_t n, int jobs,
                           int32_t batch);
/*
 * The next chunk document (the caller destroys it), in the order of ids
 * and, within a file, as the server sent them; *file gets its index in ids. 1: a document;
 * 0: all files read; -1: a query failed (err says which).
 */
int gfs_fetch_next(gfs_fetch *f, bson_t **doc, size_t *file, gfs_error *err);
/* Stops the workers (a read in progress ends at its next batch) and frees everything. */
void gfs_fetch_free(gfs_fetch *f);

#endif
