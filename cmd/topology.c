/* doctor's topology lines and JSON (gridfsctl-doctor(1), TOPOLOGY). */
#include <stdio.h>
#include <string.h>

#include "../lib/topology.h"
#include "cmd.h"

static void
member_words(const gfs_topo_member *m, bool status_read, char *buf, size_t size)
{
	if (!status_read) {
		snprintf(buf, size, "%s %s", m->host, m->state[0] ? m->state : "(state not readable)");
		return;
	}
	if (m->health == 0) {
		snprintf(buf, size, "%s %s, not reachable from the member asked", m->host,
		         m->state[0] ? m->state : "?");
		return;
	}
	if (m->lag_ms >= 0 && m->state[0] && strcmp(m->state, "PRIMARY") != 0)
		snprintf(buf, size, "%s %s, %.1f s behind the primary", m->host, m->state,
		         (double)m->lag_ms / 1e3);
	else
		snprintf(buf, size, "%s %s", m->host, m->state[0] ? m->state : "?");
}

static void
coll_line(topology_line_fn line, const char *bucket, const char *suffix, const gfs_topo_coll *c,
          const char *config_error)
{
	char buf[1200];
	if (c->sharded == GFS_SHARD_UNKNOWN)
		snprintf(buf, sizeof buf, "%s.%s: not known, config.collections could not be read (%s)",
		         bucket, suffix, config_error);
	else if (c->sharded == GFS_SHARD_NO)
		snprintf(buf, sizeof buf, "%s.%s not sharded", bucket, suffix);
	else if (c->key_ok)
		snprintf(buf, sizeof buf, "%s.%s sharded on %s", bucket, suffix, c->key);
	else
		snprintf(buf, sizeof buf, "%s.%s sharded on %s: only {files_id: 1, n: 1} or {files_id: 1} "
		         "keep a file's chunks on one shard and its unique index enforced", bucket, suffix,
		         c->key);
	line(!c->key_ok, "sharding:", buf);
}

void
topology_print(const gfs_topology *t, const char *bucket, topology_line_fn line)
{
	char buf[1200];
	switch (t->kind) {
	case GFS_TOPO_STANDALONE:
		line(false, "topology:", "standalone (one server, no replica set)");
		return;
	case GFS_TOPO_SHARDED:
		line(false, "topology:", "sharded cluster (through mongos)");
		coll_line(line, bucket, "files", &t->files, t->config_error);
		coll_line(line, bucket, "chunks", &t->chunks, t->config_error);
		return;
	case GFS_TOPO_REPLSET:
		break;
	}
	if (t->status_read)
		snprintf(buf, sizeof buf, "replica set %s, %zu members", t->set_name, t->n_members);
	else
		snprintf(buf, sizeof buf, "replica set %s, %zu members (states and lag not readable: "
		         "replSetGetStatus: %s)", t->set_name, t->n_members, t->status_error);
	line(false, "topology:", buf);
	for (size_t i = 0; i < t->n_members; i++) {
		member_words(&t->members[i], t->status_read, buf, sizeof buf);
		line(false, "member:", buf);
	}
}

static void
coll_json(bson_t *doc, const char *key, const gfs_topo_coll *c)
{
	bson_t sub;
	BSON_APPEND_DOCUMENT_BEGIN(doc, key, &sub);
	if (c->sharded != GFS_SHARD_UNKNOWN)
		BSON_APPEND_BOOL(&sub, "sharded", c->sharded == GFS_SHARD_YES);
	if (c->sharded == GFS_SHARD_YES) {
		BSON_APPEND_UTF8(&sub, "key", c->key);
		BSON_APPEND_BOOL(&sub, "supported", c->key_ok);
	}
	bson_append_document_end(doc, &sub);
}

void
topology_json(bson_t *doc, const gfs_topology *t)
{
	bson_t top, arr, mem;
	BSON_APPEND_DOCUMENT_BEGIN(doc, "topology", &top);
	BSON_APPEND_UTF8(&top, "kind", gfs_topology_kind_name(t->kind));
	if (t->kind == GFS_TOPO_REPLSET) {
		BSON_APPEND_UTF8(&top, "setName", t->set_name);
		if (!t->status_read)
			BSON_APPEND_UTF8(&top, "statusError", t->status_error);
		BSON_APPEND_ARRAY_BEGIN(&top, "members", &arr);
		for (size_t i = 0; i < t->n_members; i++) {
			const gfs_topo_member *m = &t->members[i];
			char idx[16];
			const char *k;
			bson_uint32_to_string((uint32_t)i, &k, idx, sizeof idx);
			BSON_APPEND_DOCUMENT_BEGIN(&arr, k, &mem);
			BSON_APPEND_UTF8(&mem, "host", m->host);
			if (m->state[0])
				BSON_APPEND_UTF8(&mem, "state", m->state);
			if (m->health >= 0)
				BSON_APPEND_BOOL(&mem, "healthy", m->health == 1);
			if (m->lag_ms >= 0)
				json_seconds(&mem, "lagSeconds", (double)m->lag_ms / 1e3);
			bson_append_document_end(&arr, &mem);
		}
		bson_append_array_end(&top, &arr);
	}
	if (t->kind == GFS_TOPO_SHARDED) {
		if (t->config_error[0])
			BSON_APPEND_UTF8(&top, "configError", t->config_error);
		coll_json(&top, "files", &t->files);
		coll_json(&top, "chunks", &t->chunks);
	}
	bson_append_document_end(doc, &top);
}
