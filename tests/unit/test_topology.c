/*
 * Unit tests: doctor's topology decision (lib/topology) on recorded
 * replies. Each reply is written from the shapes the MongoDB manual
 * documents: the hello command's output (standalone, replica set member,
 * mongos), replSetGetStatus's example output, and config.collections
 * documents of MongoDB 5.0 and later.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../../lib/topology.h"

static bson_t *
doc(const char *json)
{
	bson_error_t err;
	bson_t *b = bson_new_from_json((const uint8_t *)json, -1, &err);
	if (!b)
		fail_msg("bad recorded reply: %s", err.message);
	return b;
}

static const char *standalone_hello =
	"{\"isWritablePrimary\": true, \"topologyVersion\": {\"processId\": {\"$oid\": "
	"\"6763a1b2c3d4e5f601234567\"}, \"counter\": {\"$numberLong\": \"0\"}}, "
	"\"maxBsonObjectSize\": 16777216, \"maxMessageSizeBytes\": 48000000, "
	"\"maxWriteBatchSize\": 100000, \"localTime\": {\"$date\": \"2026-12-05T10:00:00Z\"}, "
	"\"logicalSessionTimeoutMinutes\": 30, \"connectionId\": 12, \"minWireVersion\": 0, "
	"\"maxWireVersion\": 21, \"readOnly\": false, \"ok\": 1.0}";

static const char *member_hello =
	"{\"topologyVersion\": {\"processId\": {\"$oid\": \"6763a1b2c3d4e5f601234567\"}, "
	"\"counter\": {\"$numberLong\": \"6\"}}, \"hosts\": [\"m1.example.net:27017\", "
	"\"m2.example.net:27017\", \"m3.example.net:27017\"], \"setName\": \"rs0\", "
	"\"setVersion\": 3, \"isWritablePrimary\": false, \"secondary\": true, "
	"\"primary\": \"m1.example.net:27017\", \"me\": \"m2.example.net:27017\", "
	"\"lastWrite\": {\"opTime\": {\"ts\": {\"$timestamp\": {\"t\": 1764928800, \"i\": 1}}, "
	"\"t\": {\"$numberLong\": \"4\"}}, \"lastWriteDate\": {\"$date\": \"2026-12-05T10:00:00Z\"}}, "
	"\"maxBsonObjectSize\": 16777216, \"maxWireVersion\": 21, \"ok\": 1.0}";

/* The manual's replSetGetStatus example, abridged to what the decision reads and a little more. */
static const char *status_reply =
	"{\"set\": \"rs0\", \"date\": {\"$date\": \"2026-12-05T10:00:02Z\"}, \"myState\": 2, "
	"\"term\": {\"$numberLong\": \"4\"}, \"heartbeatIntervalMillis\": {\"$numberLong\": \"2000\"}, "
	"\"members\": ["
	"{\"_id\": 0, \"name\": \"m1.example.net:27017\", \"health\": 1.0, \"state\": 1, "
	"\"stateStr\": \"PRIMARY\", \"uptime\": 2000, \"optime\": {\"ts\": {\"$timestamp\": "
	"{\"t\": 1764928800, \"i\": 1}}, \"t\": {\"$numberLong\": \"4\"}}, "
	"\"optimeDate\": {\"$date\": \"2026-12-05T10:00:00Z\"}},"
	"{\"_id\": 1, \"name\": \"m2.example.net:27017\", \"health\": 1.0, \"state\": 2, "
	"\"stateStr\": \"SECONDARY\", \"uptime\": 1990, \"optimeDate\": "
	"{\"$date\": \"2026-12-05T09:59:57.500Z\"}, \"syncSourceHost\": \"m1.example.net:27017\", "
	"\"self\": true},"
	"{\"_id\": 2, \"name\": \"m3.example.net:27017\", \"health\": 0.0, \"state\": 8, "
	"\"stateStr\": \"(not reachable/healthy)\", \"uptime\": 0, "
	"\"optimeDate\": {\"$date\": \"1970-01-01T00:00:00Z\"}}"
	"], \"ok\": 1.0}";

static const char *mongos_hello =
	"{\"isWritablePrimary\": true, \"msg\": \"isdbgrid\", \"maxBsonObjectSize\": 16777216, "
	"\"maxMessageSizeBytes\": 48000000, \"maxWriteBatchSize\": 100000, "
	"\"localTime\": {\"$date\": \"2026-12-05T10:00:00Z\"}, \"maxWireVersion\": 21, "
	"\"minWireVersion\": 0, \"ok\": 1.0}";

/* config.collections as MongoDB 5.0 and later write it. */
static bson_t *
config_doc(const char *ns, const char *key)
{
	char json[1024];
	snprintf(json, sizeof json,
	         "{\"_id\": \"%s\", \"lastmodEpoch\": {\"$oid\": \"60f989a2430bfdd95d8cfa20\"}, "
	         "\"lastmod\": {\"$date\": \"2026-07-22T15:07:14.301Z\"}, \"timestamp\": "
	         "{\"$timestamp\": {\"t\": 1626966434, \"i\": 13}}, \"uuid\": {\"$binary\": "
	         "{\"base64\": \"yI6SN66LRS6diby8qqdj2w==\", \"subType\": \"04\"}}, "
	         "\"key\": %s, \"unique\": false, \"noBalance\": false}", ns, key);
	return doc(json);
}

static void
standalone(void **state)
{
	(void)state;
	bson_t *h = doc(standalone_hello);
	gfs_topology t;
	gfs_topology_decide(h, NULL, false, NULL, NULL, &t);
	assert_int_equal(t.kind, GFS_TOPO_STANDALONE);
	assert_string_equal(gfs_topology_kind_name(t.kind), "standalone");
	assert_int_equal(t.n_members, 0);
	assert_int_equal(t.problems, 0);
	bson_destroy(h);
}

/* States from replSetGetStatus; lag is the primary's optimeDate less the member's. */
static void
replica_set_with_status(void **state)
{
	(void)state;
	bson_t *h = doc(member_hello), *s = doc(status_reply);
	gfs_topology t;
	gfs_topology_decide(h, s, false, NULL, NULL, &t);
	assert_int_equal(t.kind, GFS_TOPO_REPLSET);
	assert_string_equal(t.set_name, "rs0");
	assert_true(t.status_read);
	assert_int_equal(t.n_members, 3);
	assert_string_equal(t.members[0].host, "m1.example.net:27017");
	assert_string_equal(t.members[0].state, "PRIMARY");
	assert_int_equal(t.members[0].lag_ms, 0);
	assert_string_equal(t.members[1].state, "SECONDARY");
	assert_int_equal(t.members[1].health, 1);
	assert_int_equal(t.members[1].lag_ms, 2500);
	assert_int_equal(t.members[2].health, 0);
	assert_int_equal(t.members[2].lag_ms, -1); /* a member down has no lag worth reporting */
	assert_int_equal(t.problems, 0);
	bson_destroy(h);
	bson_destroy(s);
}

/* Without the clusterMonitor role: the members hello lists, the primary it names, nothing more. */
static void
replica_set_without_status(void **state)
{
	(void)state;
	bson_t *h = doc(member_hello);
	gfs_topology t;
	gfs_topology_decide(h, NULL, false, NULL, NULL, &t);
	assert_int_equal(t.kind, GFS_TOPO_REPLSET);
	assert_false(t.status_read);
	assert_int_equal(t.n_members, 3);
	assert_string_equal(t.members[0].state, "PRIMARY");
	assert_string_equal(t.members[1].state, "");
	assert_int_equal(t.members[1].lag_ms, -1);
	assert_int_equal(t.members[1].health, -1);
	bson_destroy(h);
}

/* A member listed by replSetGetStatus but not (yet) by hello is still a member. */
static void
status_adds_members_hello_lacks(void **state)
{
	(void)state;
	bson_t *h = doc("{\"setName\": \"rs0\", \"hosts\": [\"m1.example.net:27017\"], "
	                "\"arbiters\": [\"arb.example.net:27017\"], \"ok\": 1}");
	bson_t *s = doc(status_reply);
	gfs_topology t;
	gfs_topology_decide(h, s, false, NULL, NULL, &t);
	assert_int_equal(t.n_members, 4);
	assert_string_equal(t.members[1].host, "arb.example.net:27017");
	assert_string_equal(t.members[1].state, "ARBITER");
	assert_string_equal(t.members[3].host, "m3.example.net:27017");
	bson_destroy(h);
	bson_destroy(s);
}

static void
sharded_supported_keys(void **state)
{
	(void)state;
	const char *keys[] = {"{\"files_id\": 1, \"n\": 1}", "{\"files_id\": 1}",
	                      "{\"files_id\": 1.0, \"n\": {\"$numberLong\": \"1\"}}"};
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
		bson_t *h = doc(mongos_hello), *c = config_doc("media.fs.chunks", keys[i]);
		gfs_topology t;
		gfs_topology_decide(h, NULL, true, NULL, c, &t);
		assert_int_equal(t.kind, GFS_TOPO_SHARDED);
		assert_int_equal(t.files.sharded, GFS_SHARD_NO);
		assert_int_equal(t.chunks.sharded, GFS_SHARD_YES);
		assert_true(t.chunks.key_ok);
		assert_int_equal(t.problems, 0);
		bson_destroy(h);
		bson_destroy(c);
	}
	bson_t *h = doc(mongos_hello), *c = config_doc("media.fs.chunks", "{\"files_id\": 1, \"n\": 1}");
	gfs_topology t;
	gfs_topology_decide(h, NULL, true, NULL, c, &t);
	assert_string_equal(t.chunks.key, "{files_id: 1, n: 1}");
	bson_destroy(h);
	bson_destroy(c);
}

/* Any other chunks key is the one PROBLEM; the files collection may be sharded on anything. */
static void
sharded_other_keys_are_a_problem(void **state)
{
	(void)state;
	const char *keys[] = {"{\"_id\": 1}", "{\"files_id\": \"hashed\"}", "{\"n\": 1, \"files_id\": 1}",
	                      "{\"files_id\": 1, \"n\": 1, \"data\": 1}", "{\"files_id\": -1}"};
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
		bson_t *h = doc(mongos_hello), *c = config_doc("media.fs.chunks", keys[i]);
		bson_t *f = config_doc("media.fs.files", "{\"_id\": \"hashed\"}");
		gfs_topology t;
		gfs_topology_decide(h, NULL, true, f, c, &t);
		assert_int_equal(t.chunks.sharded, GFS_SHARD_YES);
		assert_false(t.chunks.key_ok);
		assert_int_equal(t.files.sharded, GFS_SHARD_YES);
		assert_true(t.files.key_ok);
		assert_string_equal(t.files.key, "{_id: \"hashed\"}");
		assert_int_equal(t.problems, 1);
		bson_destroy(h);
		bson_destroy(c);
		bson_destroy(f);
	}
}

/* Before 5.0 a dropped collection kept its document with dropped: true: not sharded. */
static void
sharded_dropped_and_unreadable(void **state)
{
	(void)state;
	bson_t *h = doc(mongos_hello);
	bson_t *c = doc("{\"_id\": \"media.fs.chunks\", \"lastmod\": {\"$date\": \"2019-01-01T00:00:00Z\"}, "
	                "\"dropped\": true, \"key\": {\"_id\": 1}, \"unique\": false}");
	gfs_topology t;
	gfs_topology_decide(h, NULL, true, NULL, c, &t);
	assert_int_equal(t.chunks.sharded, GFS_SHARD_NO);
	assert_int_equal(t.problems, 0);
	/* Not allowed to read config: not known, which is not "not sharded". */
	gfs_topology_decide(h, NULL, false, NULL, NULL, &t);
	assert_int_equal(t.files.sharded, GFS_SHARD_UNKNOWN);
	assert_int_equal(t.chunks.sharded, GFS_SHARD_UNKNOWN);
	assert_int_equal(t.problems, 0);
	bson_destroy(h);
	bson_destroy(c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(standalone),
		cmocka_unit_test(replica_set_with_status),
		cmocka_unit_test(replica_set_without_status),
		cmocka_unit_test(status_adds_members_hello_lacks),
		cmocka_unit_test(sharded_supported_keys),
		cmocka_unit_test(sharded_other_keys_are_a_problem),
		cmocka_unit_test(sharded_dropped_and_unreadable),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
