/* Choosing a way to read chunks: see read_strategy.h. */
#include <string.h>

#include "read_strategy.h"

/* A selection of under 1/SELECTIVE of the bucket is read file by file. */
#define SELECTIVE 4

static const char *const names[] = {
	[GFS_READ_AUTO] = "auto",
	[GFS_READ_SCAN] = "scan",
	[GFS_READ_BATCHED] = "batched",
	[GFS_READ_EACH] = "each",
};

const char *
gfs_read_strategy_name(enum gfs_read_strategy s)
{
	return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "?";
}

bool
gfs_read_strategy_parse(const char *word, enum gfs_read_strategy *out)
{
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		if (strcmp(word, names[i]) == 0) {
			*out = (enum gfs_read_strategy)i;
			return true;
		}
	}
	return false;
}

/* True when a string anywhere in the document names an index access. */
static bool
mentions_index(bson_iter_t *it, int depth)
{
	while (bson_iter_next(it)) {
		if (BSON_ITER_HOLDS_UTF8(it)) {
			const char *s = bson_iter_utf8(it, NULL);
			/* MongoDB's IXSCAN (and EXPRESS_IXSCAN); PostgreSQL's and SQLite's plans. */
			if (strstr(s, "IXSCAN") || strstr(s, "Index Scan") || strstr(s, "USING INDEX") ||
			    strstr(s, "USING COVERING INDEX"))
				return true;
		} else if ((BSON_ITER_HOLDS_DOCUMENT(it) || BSON_ITER_HOLDS_ARRAY(it)) && depth < 32) {
			bson_iter_t child;
			if (bson_iter_recurse(it, &child) && mentions_index(&child, depth + 1))
				return true;
		}
	}
	return false;
}

/*
 * 1 when the server's plan for a find with this filter reads an index, 0
 * when it reads the whole collection, -1 when it did not say.
 */
static int
explain_indexed(gfs_session *s, const bson_t *filter)
{
	bson_t cmd = BSON_INITIALIZER, find, reply;
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "explain", &find);
	BSON_APPEND_UTF8(&find, "find", mongoc_collection_get_name(s->chunks));
	BSON_APPEND_DOCUMENT(&find, "filter", filter);
	bson_append_document_end(&cmd, &find);
	BSON_APPEND_UTF8(&cmd, "verbosity", "queryPlanner");
	bson_error_t berr;
	bool ok = mongoc_collection_command_simple(s->chunks, &cmd, NULL, &reply, &berr);
	bson_destroy(&cmd);
	int rc = -1;
	bson_iter_t it, qp;
	if (ok) {
		/*
		 * A server that filters above its storage says so (FerretDB's
		 * filterPushdown): then no index of the storage serves the query.
		 */
		bool pushed = !bson_iter_init_find(&it, &reply, "filterPushdown") ||
		              !BSON_ITER_HOLDS_BOOL(&it) || bson_iter_bool(&it);
		if (!pushed)
			rc = 0;
		else if (bson_iter_init_find(&it, &reply, "queryPlanner") && bson_iter_recurse(&it, &qp))
			rc = mentions_index(&qp, 0) ? 1 : 0;
	}
	bson_destroy(&reply);
	return rc;
}

bool
gfs_read_has_sample(gfs_session *s)
{
	bson_t pipeline = BSON_INITIALIZER, stage, spec;
	BSON_APPEND_DOCUMENT_BEGIN(&pipeline, "0", &stage);
	BSON_APPEND_DOCUMENT_BEGIN(&stage, "$sample", &spec);
	BSON_APPEND_INT32(&spec, "size", 1);
	bson_append_document_end(&stage, &spec);
	bson_append_document_end(&pipeline, &stage);
	mongoc_cursor_t *cur =
	    gfs_session_aggregate(s, s->files, &pipeline, NULL);
	bson_destroy(&pipeline);
	const bson_t *doc;
	while (mongoc_cursor_next(cur, &doc))
		;
	return gfs_cursor_done(cur, "$sample", NULL);
}

void
gfs_read_caps_probe(gfs_session *s, gfs_read_caps *caps)
{
	bson_oid_t a;
	bson_oid_init(&a, NULL);
	bson_t eq = BSON_INITIALIZER, op;
	BSON_APPEND_DOCUMENT_BEGIN(&eq, "files_id", &op);
	BSON_APPEND_OID(&op, "$eq", &a);
	bson_append_document_end(&eq, &op);
	caps->eq_indexed = explain_indexed(s, &eq) != 0;
	bson_destroy(&eq);
}

enum gfs_read_strategy
gfs_read_choose(const gfs_read_caps *caps, bool whole, uint64_t selected, int64_t total)
{
	if (whole || !caps->eq_indexed)
		return GFS_READ_SCAN;
	bool few = total < 0 ? selected <= GFS_READ_FEW : selected * SELECTIVE < (uint64_t)total;
	return few ? GFS_READ_EACH : GFS_READ_SCAN;
}

enum gfs_read_strategy
gfs_read_resolve(enum gfs_read_strategy asked)
{
	return asked == GFS_READ_BATCHED ? GFS_READ_EACH : asked;
}

void
gfs_read_scan_opts(bson_t *opts, int32_t batch)
{
	bson_t hint;
	BSON_APPEND_DOCUMENT_BEGIN(opts, "hint", &hint);
	BSON_APPEND_INT32(&hint, "$natural", 1);
	bson_append_document_end(opts, &hint);
	BSON_APPEND_INT32(opts, "batchSize", batch);
}
