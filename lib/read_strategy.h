/*
 * Choosing how to read the chunks of a selection of files, for verify and
 * mirror.
 *
 * fs.chunks is read in only two ways (docs/design.md, the query rule):
 *
 *   scan     one find over the whole chunks collection in natural order:
 *            no filter, no sort, hint {$natural: 1}. Every server reads it
 *            sequentially from its storage and answers at once; it reads
 *            every chunk of the bucket once, wanted or not. A file's chunks
 *            may come in any order and interleaved with other files'.
 *   each     one find {files_id: id} per file, no sort, on several
 *            connections at once. On MongoDB one index seek per file and a
 *            round trip each. A server that cannot serve even that equality
 *            from an index reads the whole collection for every file.
 *
 * "batched" (an $in over many ids, which a server without an index for it
 * answers by reading the whole collection per batch) is gone: the word is
 * still taken, and reads as each.
 *
 * What the server can serve from an index is asked, not assumed: its own
 * explain of the equality (gfs_read_caps_probe). The choice itself
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

/* "auto", "scan", "batched", "each": the words the command line takes (batched reads as each). */
const char *gfs_read_strategy_name(enum gfs_read_strategy s);
bool gfs_read_strategy_parse(const char *word, enum gfs_read_strategy *out);

typedef struct gfs_read_caps {
	bool eq_indexed;      /* {files_id: {$eq: id}} is served by an index */
} gfs_read_caps;

/*
 * Asks the server (explain, with verbosity queryPlanner: nothing is
 * executed) whether an index serves the equality on files_id. An explain
 * that fails counts as indexed: the GridFS specification requires the
 * {files_id: 1, n: 1} index.
 */
void gfs_read_caps_probe(gfs_session *s, gfs_read_caps *caps);

/* Whether aggregate has the $sample stage (one $sample of size 1 on the files). */
bool gfs_read_has_sample(gfs_session *s);

/*
 * Up to this many selected files, the bucket's size is not needed to
 * choose (gfs_read_choose takes total -1): a query per file is never
 * dearer than one scan of a bucket large enough for the difference to
 * matter. Counting files costs a pass over all files documents on some
 * servers.
 */
#define GFS_READ_FEW 1000

/*
 * The strategy for reading `selected` files out of `total` in the bucket
 * (-1: not counted, see GFS_READ_FEW). whole: every file is selected (and
 * orphan chunks are looked for), which only a scan does in one pass. A
 * large selection is one scan too, and so is any selection on a server
 * that cannot serve the equality from an index.
 */
enum gfs_read_strategy gfs_read_choose(const gfs_read_caps *caps, bool whole, uint64_t selected,
                                       int64_t total);

/*
 * A scan holds the chunks that come before their turn (chunk 3 of a file
 * before its chunk 2) up to this many bytes in all, by default; past it
 * their files are read again by files_id at the end.
 */
#define GFS_READ_HOLD_DEFAULT (64 * 1024 * 1024)

/* The strategy a word asked for comes to: batched reads as each. */
enum gfs_read_strategy gfs_read_resolve(enum gfs_read_strategy asked);

/* The options of a scan's find: batchSize batch and hint {$natural: 1}; no sort. */
void gfs_read_scan_opts(bson_t *opts, int32_t batch);

#endif
