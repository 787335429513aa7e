/*
 * The GridFS indexes: the spec's two ({filename, uploadDate} on files,
 * unique {files_id, n} on chunks), created before the first write when the
 * files collection is empty and they are missing, once per connection.
 */
#include <string.h>

#include "gfs.h"

bool
gfs_index_keys_equal(const bson_t *a, const bson_t *b)
{
	bson_iter_t ia, ib;
	if (!bson_iter_init(&ia, a) || !bson_iter_init(&ib, b))
		return false;
	for (;;) {
		bool na = bson_iter_next(&ia), nb = bson_iter_next(&ib);
		if (!na || !nb)
			return na == nb;
		if (strcmp(bson_iter_key(&ia), bson_iter_key(&ib)) != 0)
			return false;
		/* The spec: 1 and 1.0 (and int64 1) name the same index direction. */
		if (!BSON_ITER_HOLDS_NUMBER(&ia) || !BSON_ITER_HOLDS_NUMBER(&ib) ||
		    bson_iter_as_double(&ia) != bson_iter_as_double(&ib))
			return false;
	}
}

static bool
has_index(mongoc_collection_t *coll, const bson_t *keys, bool *found, gfs_error *err)
{
	*found = false;
	mongoc_cursor_t *cur = mongoc_collection_find_indexes_with_opts(coll, NULL);
	const bson_t *doc;
	while (!*found && mongoc_cursor_next(cur, &doc)) {
		bson_iter_t it;
		uint32_t len;
		const uint8_t *data;
		if (!bson_iter_init_find(&it, doc, "key") || !BSON_ITER_HOLDS_DOCUMENT(&it))
			continue;
		bson_iter_document(&it, &len, &data);
		bson_t key;
		if (bson_init_static(&key, data, len) && gfs_index_keys_equal(&key, keys))
			*found = true;
	}
	return gfs_cursor_done(cur, "listIndexes", err);
}

static bool
create_index(gfs_session *s, mongoc_collection_t *coll, const bson_t *keys, const char *name,
             bool unique, gfs_error *err)
{
	bool found;
	if (!has_index(coll, keys, &found, err))
		return false;
	if (found)
		return true;
	bson_t cmd = BSON_INITIALIZER, indexes, index, reply;
	BSON_APPEND_UTF8(&cmd, "createIndexes", mongoc_collection_get_name(coll));
	BSON_APPEND_ARRAY_BEGIN(&cmd, "indexes", &indexes);
	BSON_APPEND_DOCUMENT_BEGIN(&indexes, "0", &index);
	BSON_APPEND_DOCUMENT(&index, "key", keys);
	BSON_APPEND_UTF8(&index, "name", name);
	if (unique)
		BSON_APPEND_BOOL(&index, "unique", true);
	bson_append_document_end(&indexes, &index);
	bson_append_array_end(&cmd, &indexes);
	mongoc_database_t *db = mongoc_client_get_database(s->client, gfs_conn_db(s->conn));
	bson_error_t berr;
	bool ok = mongoc_database_write_command_with_opts(db, &cmd, NULL, &reply, &berr);
	if (!ok)
		gfs_error_from_bson(err, &berr, "createIndexes");
	mongoc_database_destroy(db);
	bson_destroy(&cmd);
	bson_destroy(&reply);
	return ok;
}

bool
gfs_ensure_indexes(gfs_session *s, gfs_error *err)
{
	if (gfs_conn_indexes_checked(s->conn))
		return true;

	/* The spec: only when the files collection is empty, read from the primary. */
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, proj;
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "projection", &proj);
	BSON_APPEND_INT32(&proj, "_id", 1);
	bson_append_document_end(&opts, &proj);
	BSON_APPEND_INT64(&opts, "limit", 1);
	mongoc_cursor_t *cur = gfs_primary_find(s->files, &filter, &opts);
	const bson_t *doc;
	bool empty = !mongoc_cursor_next(cur, &doc);
	bool ok = gfs_cursor_done(cur, "cannot read the files collection", err);
	bson_destroy(&filter);
	bson_destroy(&opts);
	if (!ok)
		return false;
	if (empty) {
		bson_t files_keys = BSON_INITIALIZER, chunk_keys = BSON_INITIALIZER;
		BSON_APPEND_INT32(&files_keys, "filename", 1);
		BSON_APPEND_INT32(&files_keys, "uploadDate", 1);
		BSON_APPEND_INT32(&chunk_keys, "files_id", 1);
		BSON_APPEND_INT32(&chunk_keys, "n", 1);
		ok = create_index(s, s->files, &files_keys, "filename_1_uploadDate_1", false, err) &&
		     create_index(s, s->chunks, &chunk_keys, "files_id_1_n_1", true, err);
		bson_destroy(&files_keys);
		bson_destroy(&chunk_keys);
	}
	if (ok)
		gfs_conn_set_indexes_checked(s->conn);
	return ok;
}
