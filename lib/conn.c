/* Connections: a client pool per process, a session per thread. */
#include <pthread.h>
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
 * opts and the server every read of s goes to (the read concern is the
 * collections', gfs_session_pop). Without a server (none answers) the
 * driver selects one itself and reports why not.
 */
static void
read_opts(gfs_session *s, const bson_t *opts, bson_t *out)
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
	read_opts(s, opts, &all);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(coll, filter, &all, NULL);
	bson_destroy(&all);
	return cur;
}

mongoc_cursor_t *
gfs_session_aggregate(gfs_session *s, mongoc_collection_t *coll, const bson_t *pipeline,
                      const bson_t *opts)
{
	bson_t all;
	read_opts(s, opts, &all);
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

mongoc_collection_t *
gfs_session_bucket_collection(gfs_session *s, const char *suffix)
{
	char *name = bson_strdup_printf("%s.%s", gfs_conn_bucket(s->conn), suffix);
	mongoc_collection_t *c = mongoc_client_get_collection(s->client, gfs_conn_db(s->conn), name);
	bson_free(name);
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

const char *
gfs_uri_password(const char *authority, size_t len, size_t *pwlen)
{
	const char *at = NULL;
	for (const char *p = authority; p < authority + len; p++)
		if (*p == '@')
			at = p;
	if (!at)
		return NULL;
	const char *colon = memchr(authority, ':', (size_t)(at - authority));
	if (!colon)
		return NULL;
	*pwlen = (size_t)(at - colon - 1);
	return colon + 1;
}

/* ---- secrets kept out of messages ------------------------------------ */

#define MAX_SECRETS 32

static pthread_mutex_t secrets_mu = PTHREAD_MUTEX_INITIALIZER;
static char *secrets[MAX_SECRETS];   /* longest first, so a whole password goes before its pieces */
static size_t nsecrets;

static void
secret_add(const char *s, size_t n)
{
	if (n == 0)
		return;
	pthread_mutex_lock(&secrets_mu);
	size_t i = 0;
	while (i < nsecrets && !(strlen(secrets[i]) == n && memcmp(secrets[i], s, n) == 0))
		i++;
	if (i == nsecrets && nsecrets < MAX_SECRETS) {
		char *copy = gfs_xstrndup(s, n);
		for (i = nsecrets++; i > 0 && strlen(secrets[i - 1]) < n; i--)
			secrets[i] = secrets[i - 1];
		secrets[i] = copy;
	}
	pthread_mutex_unlock(&secrets_mu);
}

/* The password and every run of it between '@'s (or its ends): each may be printed alone. */
static void
secret_add_pieces(const char *pw, size_t n)
{
	for (size_t from = 0; from <= n; from++) {
		if (from > 0 && pw[from - 1] != '@')
			continue;
		for (size_t to = from + 1; to <= n; to++)
			if (to == n || pw[to] == '@')
				secret_add(pw + from, to - from);
	}
}

static int
hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = (char)(c | 0x20);
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

void
gfs_secrets_from_uri(const char *uri)
{
	if (!uri)
		return;
	const char *scheme = strstr(uri, "://");
	const char *start = scheme ? scheme + 3 : uri;
	size_t n;
	/* As --uri scrubbing does: the userinfo ends at the last '@' before the options. */
	const char *pw = gfs_uri_password(start, strcspn(start, "?"), &n);
	if (!pw || n == 0)
		return;
	secret_add_pieces(pw, n);
	char *plain = gfs_xmalloc(n + 1);
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		if (pw[i] == '%' && i + 2 < n && hex_value(pw[i + 1]) >= 0 && hex_value(pw[i + 2]) >= 0) {
			plain[o++] = (char)(hex_value(pw[i + 1]) * 16 + hex_value(pw[i + 2]));
			i += 2;
		} else {
			plain[o++] = pw[i];
		}
	}
	secret_add_pieces(plain, o);
	free(plain);
}

/* Replaces the occurrences of one secret; out has room for size bytes. */
static void
redact_one(char *msg, size_t size, const char *secret)
{
	size_t sl = strlen(secret);
	char *hit = strstr(msg, secret);
	if (!hit)
		return;
	char *out = gfs_xmalloc(size);
	size_t o = 0;
	const char *p = msg;
	while (hit && o + 1 < size) {
		size_t keep = (size_t)(hit - p);
		o += (size_t)snprintf(out + o, size - o, "%.*s***", (int)keep, p);
		o = o < size ? o : size - 1;
		p = hit + sl;
		hit = strstr(p, secret);
	}
	if (o + 1 < size)
		snprintf(out + o, size - o, "%s", p);
	memcpy(msg, out, size);
	msg[size - 1] = '\0';
	free(out);
}

void
gfs_redact(char *msg, size_t size)
{
	if (!msg || size == 0)
		return;
	pthread_mutex_lock(&secrets_mu);
	for (size_t i = 0; i < nsecrets; i++)
		redact_one(msg, size, secrets[i]);
	pthread_mutex_unlock(&secrets_mu);
}

char *
gfs_uri_redact(const char *uri)
{
	const char *scheme = strstr(uri, "://");
	const char *start = scheme ? scheme + 3 : uri;
	size_t n;
	const char *pw = gfs_uri_password(start, strcspn(start, "/"), &n);
	if (!pw)
		return strdup(uri);
	return bson_strdup_printf("%.*s***%s", (int)(pw - uri), uri, pw + n);
}

/* ---- indexes --------------------------------------------------------- */

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
	mongoc_database_t *db = mongoc_client_get_database(s->client, s->conn->db);
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
	if (atomic_load(&s->conn->indexes_checked))
		return true;

	/* The spec: only when the files collection is empty, read from the primary. */
	bson_t filter = BSON_INITIALIZER, opts = BSON_INITIALIZER, proj;
	BSON_APPEND_DOCUMENT_BEGIN(&opts, "projection", &proj);
	BSON_APPEND_INT32(&proj, "_id", 1);
	bson_append_document_end(&opts, &proj);
	BSON_APPEND_INT64(&opts, "limit", 1);
	mongoc_read_prefs_t *primary = mongoc_read_prefs_new(MONGOC_READ_PRIMARY);
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(s->files, &filter, &opts, primary);
	const bson_t *doc;
	bool empty = !mongoc_cursor_next(cur, &doc);
	bool ok = gfs_cursor_done(cur, "cannot read the files collection", err);
	mongoc_read_prefs_destroy(primary);
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
		atomic_store(&s->conn->indexes_checked, true);
	return ok;
}
