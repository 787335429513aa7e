/* The deployment behind a connection, for doctor: see topology.h. */
#include <stdio.h>
#include <string.h>

#include "topology.h"

static const char *
utf8_of(const bson_t *doc, const char *key)
{
	bson_iter_t it;
	if (doc && bson_iter_init_find(&it, doc, key) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

static bool
subdoc_of(const bson_t *doc, const char *key, bson_type_t type, bson_t *out)
{
	bson_iter_t it;
	uint32_t len;
	const uint8_t *data;
	if (!doc || !bson_iter_init_find(&it, doc, key) || bson_iter_type(&it) != type)
		return false;
	if (type == BSON_TYPE_ARRAY)
		bson_iter_array(&it, &len, &data);
	else
		bson_iter_document(&it, &len, &data);
	return bson_init_static(out, data, len);
}

static gfs_topo_member *
member_by_host(gfs_topology *t, const char *host)
{
	for (size_t i = 0; i < t->n_members; i++)
		if (strcmp(t->members[i].host, host) == 0)
			return &t->members[i];
	if (t->n_members == GFS_TOPO_MAX_MEMBERS)
		return NULL;
	gfs_topo_member *m = &t->members[t->n_members++];
	snprintf(m->host, sizeof m->host, "%s", host);
	m->health = -1;
	m->lag_ms = -1;
	return m;
}

/* hello's hosts, passives and arbiters: the members a client may see without any role. */
static void
members_from_hello(gfs_topology *t, const bson_t *hello)
{
	const char *lists[] = {"hosts", "passives", "arbiters"};
	for (size_t l = 0; l < sizeof lists / sizeof lists[0]; l++) {
		bson_t arr;
		bson_iter_t it;
		if (!subdoc_of(hello, lists[l], BSON_TYPE_ARRAY, &arr) || !bson_iter_init(&it, &arr))
			continue;
		while (bson_iter_next(&it)) {
			if (!BSON_ITER_HOLDS_UTF8(&it))
				continue;
			gfs_topo_member *m = member_by_host(t, bson_iter_utf8(&it, NULL));
			if (m && l == 2)
				snprintf(m->state, sizeof m->state, "ARBITER");
		}
	}
	const char *primary = utf8_of(hello, "primary");
	gfs_topo_member *m = primary ? member_by_host(t, primary) : NULL;
	if (m)
		snprintf(m->state, sizeof m->state, "PRIMARY");
}

/* A member's optimeDate in ms, or -1 (an arbiter has none). */
static int64_t
optime_ms(const bson_t *member)
{
	bson_iter_t it;
	if (bson_iter_init_find(&it, member, "optimeDate") && BSON_ITER_HOLDS_DATE_TIME(&it))
		return bson_iter_date_time(&it);
	return -1;
}

/*
 * replSetGetStatus's members: state, health, and lag as the manual's
 * "Replica Set Status Reference" derives it, the primary's optimeDate
 * less the member's (both come from heartbeats, so seconds at most stale).
 */
static void
members_from_status(gfs_topology *t, const bson_t *status)
{
	bson_t arr, mem;
	bson_iter_t it;
	if (!subdoc_of(status, "members", BSON_TYPE_ARRAY, &arr))
		return;
	int64_t primary_ms = -1;
	for (int pass = 0; pass < 2; pass++) {
		if (!bson_iter_init(&it, &arr))
			return;
		while (bson_iter_next(&it)) {
			uint32_t len;
			const uint8_t *data;
			if (!BSON_ITER_HOLDS_DOCUMENT(&it))
				continue;
			bson_iter_document(&it, &len, &data);
			if (!bson_init_static(&mem, data, len))
				continue;
			const char *state = utf8_of(&mem, "stateStr");
			if (pass == 0) {
				if (state && strcmp(state, "PRIMARY") == 0)
					primary_ms = optime_ms(&mem);
				continue;
			}
			const char *host = utf8_of(&mem, "name");
			gfs_topo_member *m = host ? member_by_host(t, host) : NULL;
			if (!m)
				continue;
			snprintf(m->state, sizeof m->state, "%s", state ? state : "");
			bson_iter_t h;
			if (bson_iter_init_find(&h, &mem, "health") && BSON_ITER_HOLDS_NUMBER(&h))
				m->health = bson_iter_as_int64(&h) ? 1 : 0;
			int64_t own = optime_ms(&mem);
			if (primary_ms >= 0 && own >= 0 && m->health != 0)
				m->lag_ms = primary_ms > own ? primary_ms - own : 0;
		}
	}
}

/* {files_id: 1, n: 1}: a key pattern as the manual and doctor's other lines write it. */
static void
key_text(const bson_t *key, char *buf, size_t size)
{
	bson_iter_t it;
	size_t n = (size_t)snprintf(buf, size, "{");
	bool first = true;
	if (bson_iter_init(&it, key)) {
		while (bson_iter_next(&it) && n < size) {
			const char *sep = first ? "" : ", ";
			first = false;
			if (BSON_ITER_HOLDS_UTF8(&it))
				n += (size_t)snprintf(buf + n, size - n, "%s%s: \"%s\"", sep, bson_iter_key(&it),
				                      bson_iter_utf8(&it, NULL));
			else if (BSON_ITER_HOLDS_NUMBER(&it))
				n += (size_t)snprintf(buf + n, size - n, "%s%s: %lld", sep, bson_iter_key(&it),
				                      (long long)bson_iter_as_int64(&it));
			else
				n += (size_t)snprintf(buf + n, size - n, "%s%s: ?", sep, bson_iter_key(&it));
		}
	}
	if (n < size)
		snprintf(buf + n, size - n, "}");
}

/* The manual's two supported keys for a chunks collection. */
static bool
chunks_key_supported(const bson_t *key)
{
	bson_t a = BSON_INITIALIZER, b = BSON_INITIALIZER;
	BSON_APPEND_INT32(&a, "files_id", 1);
	BSON_APPEND_INT32(&a, "n", 1);
	BSON_APPEND_INT32(&b, "files_id", 1);
	bool ok = gfs_index_keys_equal(key, &a) || gfs_index_keys_equal(key, &b);
	bson_destroy(&a);
	bson_destroy(&b);
	return ok;
}

/* A config.collections document: sharded unless the manual's "dropped: true" says it is gone. */
static void
coll_decide(const bson_t *doc, bool config_read, bool chunks, gfs_topo_coll *c)
{
	c->key_ok = true;
	if (!config_read) {
		c->sharded = GFS_SHARD_UNKNOWN;
		return;
	}
	bson_iter_t it;
	bson_t key;
	bool dropped = doc && bson_iter_init_find(&it, doc, "dropped") && bson_iter_as_bool(&it);
	if (!doc || dropped || !subdoc_of(doc, "key", BSON_TYPE_DOCUMENT, &key)) {
		c->sharded = GFS_SHARD_NO;
		return;
	}
	c->sharded = GFS_SHARD_YES;
	key_text(&key, c->key, sizeof c->key);
	if (chunks)
		c->key_ok = chunks_key_supported(&key);
}

void
gfs_topology_decide(const bson_t *hello, const bson_t *status, bool config_read,
                    const bson_t *files_coll, const bson_t *chunks_coll, gfs_topology *out)
{
	memset(out, 0, sizeof *out);
	const char *msg = utf8_of(hello, "msg");
	const char *set = utf8_of(hello, "setName");
	if (msg && strcmp(msg, "isdbgrid") == 0) {
		out->kind = GFS_TOPO_SHARDED;
		coll_decide(files_coll, config_read, false, &out->files);
		coll_decide(chunks_coll, config_read, true, &out->chunks);
		if (out->chunks.sharded == GFS_SHARD_YES && !out->chunks.key_ok)
			out->problems++;
		return;
	}
	if (!set) {
		out->kind = GFS_TOPO_STANDALONE;
		return;
	}
	out->kind = GFS_TOPO_REPLSET;
	snprintf(out->set_name, sizeof out->set_name, "%s", set);
	members_from_hello(out, hello);
	if (status) {
		out->status_read = true;
		members_from_status(out, status);
	}
}

const char *
gfs_topology_kind_name(enum gfs_topology_kind k)
{
	switch (k) {
	case GFS_TOPO_STANDALONE: return "standalone";
	case GFS_TOPO_REPLSET: return "replicaSet";
	case GFS_TOPO_SHARDED: return "sharded";
	}
	return "?";
}

/* ---- asking the server ---------------------------------------------- */

static bool
admin_command(gfs_session *s, const char *name, bson_t *reply, bson_error_t *berr)
{
	bson_t cmd = BSON_INITIALIZER;
	BSON_APPEND_INT32(&cmd, name, 1);
	bool ok = mongoc_client_command_simple(s->client, "admin", &cmd, NULL, reply, berr);
	bson_destroy(&cmd);
	return ok;
}

/* The config.collections document of DB.COLL by _id equality (caller destroys), or *out NULL: none. */
static bool
config_collection(gfs_session *s, mongoc_collection_t *of, bson_t **out, bson_error_t *berr)
{
	mongoc_collection_t *cfg = mongoc_client_get_collection(s->client, "config", "collections");
	char ns[512];
	bson_t filter = BSON_INITIALIZER;
	snprintf(ns, sizeof ns, "%s.%s", gfs_conn_db(s->conn), mongoc_collection_get_name(of));
	BSON_APPEND_UTF8(&filter, "_id", ns);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(cfg, &filter, NULL, NULL);
	const bson_t *doc;
	*out = mongoc_cursor_next(cur, &doc) ? bson_copy(doc) : NULL;
	bool ok = !mongoc_cursor_error(cur, berr);
	mongoc_cursor_destroy(cur);
	bson_destroy(&filter);
	mongoc_collection_destroy(cfg);
	return ok;
}

bool
gfs_topology_probe(gfs_conn *conn, gfs_topology *out, gfs_error *err)
{
	gfs_session *s = gfs_session_pop(conn);
	bson_t hello, status;
	bson_error_t berr;
	if (!admin_command(s, "hello", &hello, &berr)) {
		gfs_error_from_bson(err, &berr, "hello");
		bson_destroy(&hello);
		gfs_session_push(s);
		return false;
	}
	const char *msg = utf8_of(&hello, "msg");
	bool mongos = msg && strcmp(msg, "isdbgrid") == 0;
	bool have_status = false, config_read = false;
	bson_t *files = NULL, *chunks = NULL;
	char status_error[BSON_ERROR_BUFFER_SIZE] = "", config_error[BSON_ERROR_BUFFER_SIZE] = "";
	bson_init(&status);
	if (!mongos && utf8_of(&hello, "setName")) {
		bson_destroy(&status);
		have_status = admin_command(s, "replSetGetStatus", &status, &berr);
		if (!have_status)
			snprintf(status_error, sizeof status_error, "%s", berr.message);
	}
	if (mongos) {
		config_read = config_collection(s, s->files, &files, &berr) &&
		              config_collection(s, s->chunks, &chunks, &berr);
		if (!config_read)
			snprintf(config_error, sizeof config_error, "%s", berr.message);
	}
	gfs_topology_decide(&hello, have_status ? &status : NULL, config_read, files, chunks, out);
	snprintf(out->status_error, sizeof out->status_error, "%s", status_error);
	snprintf(out->config_error, sizeof out->config_error, "%s", config_error);
	bson_destroy(&hello);
	bson_destroy(&status);
	if (files)
		bson_destroy(files);
	if (chunks)
		bson_destroy(chunks);
	gfs_session_push(s);
	return true;
}
