/*
 * What kind of deployment the bucket lives on, for doctor: a standalone
 * server, a replica set (its name, members, their state and how far each
 * lags behind the primary) or a sharded cluster behind mongos (whether
 * BUCKET.files and BUCKET.chunks are sharded, and on what key).
 *
 * gfs_topology_decide() is the whole decision and is pure: it reads the
 * replies of `hello`, `replSetGetStatus` (admin) and the two documents of
 * `config.collections` (read through mongos) as the MongoDB manual lays
 * them out, so that tests/unit/test_topology.c can hold recorded replies.
 * gfs_topology_probe() only asks the server for them. A reply the server
 * refused (replSetGetStatus needs the clusterMonitor role; config needs
 * read access to it) leaves that part unknown and says so: it is never
 * taken for "nothing to report".
 *
 * The one PROBLEM is a chunks collection sharded on a key other than
 * {files_id: 1, n: 1} or {files_id: 1}, the two keys the manual's "Shard
 * GridFS Data Store" supports: only those keep a file's chunks on one
 * shard for readers' files_id equality queries, and only a shard key that
 * prefixes {files_id: 1, n: 1} lets the cluster enforce that index's
 * uniqueness (a hashed key cannot).
 */
#ifndef GFS_TOPOLOGY_H
#define GFS_TOPOLOGY_H

#include <stdbool.h>
#include <stdint.h>

#include "gfs.h"

enum gfs_topology_kind {
	GFS_TOPO_STANDALONE,
	GFS_TOPO_REPLSET,
	GFS_TOPO_SHARDED,   /* hello came from mongos ("msg": "isdbgrid") */
};

typedef struct gfs_topo_member {
	char host[256];     /* HOST:PORT as the set names it */
	char state[24];     /* stateStr (PRIMARY, SECONDARY, ...), "" when not known */
	int health;         /* 1 up, 0 down, -1 not known */
	int64_t lag_ms;     /* behind the primary's optimeDate; -1 when not known */
} gfs_topo_member;

enum gfs_topo_sharding {
	GFS_SHARD_UNKNOWN,  /* config.collections could not be read */
	GFS_SHARD_NO,
	GFS_SHARD_YES,
};

typedef struct gfs_topo_coll {
	enum gfs_topo_sharding sharded;
	char key[256];      /* the shard key, as {files_id: 1, n: 1}; "" unless sharded */
	bool key_ok;        /* chunks: one of the two supported keys (files: always true) */
} gfs_topo_coll;

#define GFS_TOPO_MAX_MEMBERS 50 /* a replica set has at most 50 members */

typedef struct gfs_topology {
	enum gfs_topology_kind kind;
	char set_name[128];                 /* replica set name, "" otherwise */
	gfs_topo_member members[GFS_TOPO_MAX_MEMBERS];
	size_t n_members;
	bool status_read;                   /* replSetGetStatus answered: states and lags are known */
	char status_error[BSON_ERROR_BUFFER_SIZE];             /* why not, when a replica set and not read */
	gfs_topo_coll files, chunks;        /* sharded clusters only */
	char config_error[BSON_ERROR_BUFFER_SIZE];             /* why config.collections could not be read */
	int problems;
} gfs_topology;

/*
 * Decides the report from the replies: hello (required), status (the
 * replSetGetStatus reply or NULL when refused), files_coll and chunks_coll
 * (the config.collections documents of BUCKET.files and BUCKET.chunks, NULL
 * when there is none: not sharded); config_read says whether
 * config.collections could be read at all. Never fails; fills out.
 */
void gfs_topology_decide(const bson_t *hello, const bson_t *status, bool config_read,
                         const bson_t *files_coll, const bson_t *chunks_coll, gfs_topology *out);

/*
 * Asks conn's server for the replies and decides. False (GFS_EBACKEND) only
 * when hello fails; refusals of the other two are recorded in out.
 */
bool gfs_topology_probe(gfs_conn *conn, gfs_topology *out, gfs_error *err);

const char *gfs_topology_kind_name(enum gfs_topology_kind k);  /* "standalone", "replicaSet", "sharded" */

#endif
