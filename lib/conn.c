/* Connections: a client pool per process, a session per thread. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gfs.h"

struct gfs_conn {
	mongoc_uri_t *uri;
	mongoc_client_pool_t *pool;
	char *db;
	char *bucket;
	char *files_name;
	char *chunks_name;
	atomic_bool indexes_checked;
	bool primary_reads;      /* gfs_conn_read_primary */
	bool majority;           /* gfs_conn_read_majority */
};

/*
 * Every wait on the server is bounded: a CLI should report an unreachable
 * server in seconds, not after the driver's 30, and a server that stops
 * answering (frozen, or a network that drops packets) after a minute, not
 * after the driver's 300 s socket timeout. The URI's own settings win.
 */
#define DEFAULT_SERVER_SELECTION_MS 10000
#define DEFAULT_CONNECT_MS 10000
#define DEFAULT_SOCKET_MS GFS_REPLY_TIMEOUT_MS

static atomic_int timeout_override_ms;

void
gfs_conn_set_timeout(int ms)
{
	atomic_store(&timeout_override_ms, ms > 0 ? ms : 0);
}

static void
default_timeout(mongoc_uri_t *uri, const char *option, int32_t ms)
{
	int over = atomic_load(&timeout_override_ms);
	if (!mongoc_uri_has_option(uri, option))
		mongoc_uri_set_option_as_int32(uri, option, over ? over : ms);
}

gfs_conn *
gfs_conn_open(const char *uri_str, const char *db, const char *bucket, gfs_error *err)
{
	bson_error_t berr;
	/* Before parsing: the parser's own messages may quote the password. */
	gfs_secrets_from_uri(uri_str);
	mongoc_uri_t *uri = mongoc_uri_new_with_error(uri_str ? uri_str : GFS_DEFAULT_URI, &berr);
	if (!uri) {
		gfs_error_set(err, GFS_EINVAL, "invalid connection string: %s", berr.message);
		return NULL;
	}
	if (bucket && !*bucket) {
		mongoc_uri_destroy(uri);
		gfs_error_set(err, GFS_EINVAL, "the bucket name is empty");
		return NULL;
	}
	default_timeout(uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, DEFAULT_SERVER_SELECTION_MS);
	default_timeout(uri, MONGOC_URI_CONNECTTIMEOUTMS, DEFAULT_CONNECT_MS);
	default_timeout(uri, MONGOC_URI_SOCKETTIMEOUTMS, DEFAULT_SOCKET_MS);
	if (!mongoc_uri_has_option(uri, MONGOC_URI_APPNAME))
		mongoc_uri_set_appname(uri, "gridfsctl");

	mongoc_client_pool_t *pool = mongoc_client_pool_new_with_error(uri, &berr);
	if (!pool) {
		mongoc_uri_destroy(uri);
		gfs_error_set(err, GFS_EINVAL, "cannot use connection string: %s", berr.message);
		return NULL;
	}
	mongoc_client_pool_set_error_api(pool, MONGOC_ERROR_API_VERSION_2);

	gfs_conn *c = gfs_xcalloc(1, sizeof *c);
	c->uri = uri;
	c->pool = pool;
	const char *uri_db = mongoc_uri_get_database(uri);
	c->db = strdup(db && *db ? db : uri_db && *uri_db ? uri_db : GFS_DEFAULT_DB);
	c->bucket = strdup(bucket ? bucket : GFS_DEFAULT_BUCKET);
	c->files_name = bson_strdup_printf("%s.files", c->bucket);
	c->chunks_name = bson_strdup_printf("%s.chunks", c->bucket);
	return c;
}

void
gfs_conn_close(gfs_conn *c)
{
	if (!c)
		return;
	mongoc_client_pool_destroy(c->pool);
	mongoc_uri_destroy(c->uri);
	free(c->db);
	free(c->bucket);
	bson_free(c->files_name);
	bson_free(c->chunks_name);
	free(c);
}

const char *
gfs_conn_db(const gfs_conn *c)
{
	return c->db;
}

const char *
gfs_conn_bucket(const gfs_conn *c)
{
	return c->bucket;
}

bool
gfs_conn_indexes_checked(const gfs_conn *c)
{
	return atomic_load(&c->indexes_checked);
}

void
gfs_conn_set_indexes_checked(gfs_conn *c)
{
	atomic_store(&c->indexes_checked, true);
}

/* Chooses the server of s's reads (for_write: the primary); false with err set when none answers. */
static bool
pin(gfs_session *s, bool for_write, gfs_error *err)
{
	bson_error_t berr;
	const mongoc_read_prefs_t *prefs = for_write ? NULL : mongoc_client_get_read_prefs(s->client);
	mongoc_server_description_t *sd =
	    mongoc_client_select_server(s->client, for_write, prefs, &berr);
	if (!sd) {
		gfs_error_from_bson(err, &berr, "select a server");
		return false;
	}
	s->server_id = mongoc_server_description_id(sd);
	const char *type = mongoc_server_description_type(sd);
	s->replica_set = strncmp(type, "RS", 2) == 0;
	s->secondary = s->replica_set && strcmp(type, "RSPrimary") != 0;
	mongoc_server_description_destroy(sd);
	return true;
}

void
gfs_conn_read_primary(gfs_conn *c)
{
	c->primary_reads = true;
}

void
gfs_conn_read_majority(gfs_conn *c)
{
	c->majority = true;
}

gfs_session *
gfs_session_pop(gfs_conn *c)
{
	gfs_session *s = gfs_xcalloc(1, sizeof *s);
	s->conn = c;
	s->client = mongoc_client_pool_pop(c->pool);
	/* The pool hands out clients with the URI's read preference; ours, before the collections. */
	mongoc_read_prefs_t *primary = mongoc_read_prefs_new(MONGOC_READ_PRIMARY);
	mongoc_client_set_read_prefs(s->client,
	                             c->primary_reads ? primary : mongoc_uri_get_read_prefs_t(c->uri));
	mongoc_read_prefs_destroy(primary);
	s->files = mongoc_client_get_collection(s->client, c->db, c->files_name);
	s->chunks = mongoc_client_get_collection(s->client, c->db, c->chunks_name);
	/* Every read of the bucket, found through the session or not, then asks for majority. */
	gfs_error ignored;
	if (c->majority && pin(s, false, &ignored) && s->replica_set) {
		mongoc_read_concern_t *rc = mongoc_read_concern_new();
		mongoc_read_concern_set_level(rc, MONGOC_READ_CONCERN_LEVEL_MAJORITY);
		mongoc_collection_set_read_concern(s->files, rc);
		mongoc_collection_set_read_concern(s->chunks, rc);
		mongoc_read_concern_destroy(rc);
	}
	return s;
}

/*
 * Whether s's pinned server is still one the driver knows to answer: one
 * that went away (an outage, a failover) is selected again, or a session
 * popped before it would fail every read after it. No I/O.
 */
static bool
pin_alive(gfs_session *s)
{
	mongoc_server_description_t *sd = mongoc_client_get_server_description(s->client, s->server_id);
	if (!sd)
		return false;
	bool alive = strcmp(mongoc_server_description_type(sd), "Unknown") != 0;
	mongoc_server_description_destroy(sd);
	return alive;
}

/*
 * The read concern is the collections' (gfs_session_pop). Without a server
 * (none answers) the driver selects one itself and reports why not.
 */
void
gfs_session_read_opts(gfs_session *s, const bson_t *opts, bson_t *out)
{
	if (opts)
		bson_copy_to(opts, out);
	else
		bson_init(out);
	gfs_error ignored;
	/* When none answers, the old pin stays: the read fails on it, with its own reason. */
	if (s->server_id && !pin_alive(s))
		pin(s, false, &ignored);
	if (!s->server_id && !pin(s, false, &ignored))
		return;
	BSON_APPEND_INT32(out, "serverId", (int32_t)s->server_id);
}

mongoc_cursor_t *
gfs_session_find(gfs_session *s, mongoc_collection_t *coll, const bson_t *filter, const bson_t *opts)
{
	bson_t all;
	gfs_session_read_opts(s, opts, &all);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(coll, filter, &all, NULL);
	bson_destroy(&all);
	return cur;
}

mongoc_cursor_t *
gfs_session_aggregate(gfs_session *s, mongoc_collection_t *coll, const bson_t *pipeline,
                      const bson_t *opts)
{
	bson_t all;
	gfs_session_read_opts(s, opts, &all);
	mongoc_cursor_t *cur = mongoc_collection_aggregate(coll, MONGOC_QUERY_NONE, pipeline, &all, NULL);
	bson_destroy(&all);
	return cur;
}

bool
gfs_session_on_secondary(gfs_session *s)
{
	gfs_error ignored;
	if (!s->server_id)
		pin(s, false, &ignored);
	return s->secondary;
}

bool
gfs_session_to_primary(gfs_session *s, gfs_error *err)
{
	return pin(s, true, err);
}

gfs_session *
gfs_session_primary(gfs_session *s, gfs_error *err)
{
	gfs_session *p = gfs_session_pop(s->conn);
	if (pin(p, true, err))
		return p;
	gfs_session_push(p);
	return NULL;
}

bool
gfs_session_may_lag(gfs_session *s, const gfs_error *err)
{
	return err->code != GFS_EBACKEND && err->code != GFS_ECANCELED && gfs_session_on_secondary(s);
}

mongoc_cursor_t *
gfs_primary_find(mongoc_collection_t *coll, const bson_t *filter, const bson_t *opts)
{
	mongoc_read_prefs_t *primary = mongoc_read_prefs_new(MONGOC_READ_PRIMARY);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(coll, filter, opts, primary);
	mongoc_read_prefs_destroy(primary);
	return cur;
}

bool
gfs_cursor_done(mongoc_cursor_t *cur, const char *what, gfs_error *err)
{
	bson_error_t berr;
	bool ok = !mongoc_cursor_error(cur, &berr);
	if (!ok)
		gfs_error_from_bson(err, &berr, what);
	mongoc_cursor_destroy(cur);
	return ok;
}

mongoc_collection_t *
gfs_session_bucket_collection(gfs_session *s, const char *suffix)
{
	char *name = bson_strdup_printf("%s.%s", gfs_conn_bucket(s->conn), suffix);
	mongoc_collection_t *c = mongoc_client_get_collection(s->client, gfs_conn_db(s->conn), name);
	bson_free(name);
	/* Writers coordinate through these (locks, markers), whose writes only the primary has yet. */
	mongoc_read_prefs_t *primary = mongoc_read_prefs_new(MONGOC_READ_PRIMARY);
	mongoc_collection_set_read_prefs(c, primary);
	mongoc_read_prefs_destroy(primary);
	return c;
}

void
gfs_session_push(gfs_session *s)
{
	if (!s)
		return;
	mongoc_collection_destroy(s->files);
	mongoc_collection_destroy(s->chunks);
	mongoc_client_pool_push(s->conn->pool, s->client);
	free(s);
}

bool
gfs_conn_ping(gfs_conn *c, gfs_error *err)
{
	gfs_session *s = gfs_session_pop(c);
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t berr;
	BSON_APPEND_INT32(&cmd, "ping", 1);
	bool ok = mongoc_client_command_simple(s->client, "admin", &cmd, NULL, &reply, &berr);
	if (!ok)
		gfs_error_from_bson(err, &berr, "ping");
	bson_destroy(&cmd);
	bson_destroy(&reply);
	gfs_session_push(s);
	return ok;
}
