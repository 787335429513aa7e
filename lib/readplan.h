/*
 * Choosing how to read the chunks of a selection of files, for verify and
 * mirror.
 *
 * There are three ways, and what each costs depends on the server:
 *
 *   scan     one find over the whole chunks collection sorted by
 *            {files_id: 1, n: 1}. On MongoDB a walk of the GridFS index:
 *            it reads every chunk of the bucket once, wanted or not.
 *   batched  finds with {files_id: {$in: [1000 ids]}}, sorted the same way.
 *            On MongoDB one index seek per id and few round trips. A server
 *            that cannot serve $in from an index reads the whole
 *            collection for every batch.
 *   each     one find {files_id: id} per file, on several connections at
 *            once. On MongoDB one index seek per file and a round trip each.
 *            A server that cannot serve even that equality from an index
 *            reads the whole collection for every file.
 *
 * What the server can serve from an index is asked, not assumed: its own
 * explain of the two filters (gfs_read_caps_probe). The choice itself
 * (gfs_read_choose) is a pure function of that answer and the sizes.
 */
#ifndef GFS_READPLAN_H
#define GFS_READPLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gfs.h"

enum gfs_read_strategy {
	GFS_READ_AUTO,
	GFS_READ_SCAN,
	GFS_READ_BATCHED,
	GFS_READ_EACH,
};

/* "auto", "scan", "batched", "each": the words the command line takes. */
const char *gfs_read_strategy_name(enum gfs_read_strategy s);
bool gfs_read_strategy_parse(const char *word, enum gfs_read_strategy *out);

typedef struct gfs_read_caps {
	bool eq_indexed;      /* {files_id: {$eq: id}} is served by an index */
	bool in_indexed;      /* {files_id: {$in: [...]}} is served by an index */
	/*
	 * find({}) sorted by {files_id: 1, n: 1} walks an index. When it does
	 * not, the server sorts the whole chunks collection before its first
	 * reply: memory of the bucket's size, and a wait that can pass a
	 * reply timeout.
	 */
	bool sort_indexed;
} gfs_read_caps;

/*
 * Asks the server (explain, with verbosity queryPlanner: nothing is
 * executed) whether an index serves the two chunk filters. An explain
 * that fails counts as indexed: the GridFS specification requires the
 * {files_id: 1, n: 1} index.
 */
void gfs_read_caps_probe(gfs_session *s, gfs_read_caps *caps);

/* Whether aggregate has the $sample stage (one $sample of size 1 on the files). */
bool gfs_read_has_sample(gfs_session *s);

/*
 * Up to this many selected files, the bucket's size is not needed to
 * choose (gfs_read_choose takes total -1): a query per file or a batch
 * of this many is never dearer than one scan of a bucket large enough for
 * the difference to matter. Counting files costs a pass over all files
 * documents on some servers.
 */
#define GFS_READ_FEW 1000

/* Ids in one $in query: a few index seeks each on an indexed server, one collection pass each otherwise. */
#define GFS_READ_BATCH_INDEXED 1000
#define GFS_READ_BATCH_UNINDEXED 4096

/*
 * The strategy for reading `selected` files out of `total` in the bucket
 * (-1: not counted, see GFS_READ_FEW). whole: every file is selected (and
 * orphan chunks are looked for), which only a scan does in one pass. A
 * large selection is one scan too; with bounded, not when the server
 * would sort the whole collection first (!sort_indexed) and can serve a
 * query per file instead: then each.
 */
enum gfs_read_strategy gfs_read_choose(const gfs_read_caps *caps, bool whole, uint64_t selected,
                                       int64_t total, bool bounded);

/* The ids per $in query for a batched read on a server with these caps. */
size_t gfs_read_batch_ids(const gfs_read_caps *caps);

#endif
