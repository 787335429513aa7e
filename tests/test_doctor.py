"""gridfsctl doctor against the real backend: a healthy bucket, missing and
wrong indexes, orphan chunks, the import lock, a backend that is down.
Every state is made, and checked, through pymongo."""
import datetime
import os
import socket

import bson
import pytest

import jsonvocab
from conftest import free_port
from wireproxy import HelloRewriter


def doctor(gfs, *args, **kw):
    r = gfs.run("doctor", "--json", *args, **kw)
    assert len(r.text.strip().splitlines()) == 1, r
    return r, jsonvocab.summary(r.text, "doctor")


def put_files(bucket, n, size=10):
    for i in range(n):
        bucket.upload_from_stream(f"f{i}.txt", os.urandom(size), chunk_size_bytes=4)


def test_healthy_bucket_exits_0(gfs, bucket, db):
    put_files(bucket, 3)
    gfs.run("put", "-", "--name", "by-gridfsctl.txt", input=b"hello")
    r, d = doctor(gfs)
    assert r.rc == 0, r
    assert d["reachable"] is True and d["serverVersion"]
    assert d["db"] == db.name and d["bucket"] == "fs"
    assert d["files"] == db.fs.files.count_documents({})
    assert d["chunks"] == db.fs.chunks.count_documents({})
    assert d["indexes"] == {"files": "ok", "chunks": "ok"}
    assert d["importLock"] == {"state": "free"}
    assert d["orphans"]["method"] == "all" and d["orphans"]["estimate"] == 0
    assert d["orphans"]["sampled"] == d["chunks"]
    assert d["problems"] == 0 and "error" not in d
    # The human report says the same, one line per check, on stdout only.
    h = gfs.run("doctor")
    assert h.rc == 0 and h.err == "", h
    lines = dict(l.split(":", 1) for l in h.text.splitlines())
    assert lines["files index"].strip().startswith("ok")
    assert lines["chunks index"].strip().startswith("ok (unique")
    assert lines["import lock"].strip() == "free"
    assert lines["orphans"].strip().startswith("0 chunks")
    assert gfs.run("doctor", "-q").out == b""


def test_empty_bucket_needs_no_index_yet(gfs, db):
    db.create_collection("fs.files")  # an empty bucket: what a write leaves once all is removed
    r, d = doctor(gfs)
    assert r.rc == 0, r
    assert d["exists"] is True and d["files"] == 0 and d["chunks"] == 0
    assert d["indexes"] == {"files": "not-needed", "chunks": "not-needed"}
    assert d["orphans"]["method"] == "none"


def test_a_bucket_that_does_not_exist_is_a_problem(gfs, bucket, db):
    """A typo in a monitoring check's --bucket must not pass: no BUCKET.files and no
    BUCKET.chunks is a problem unless --allow-empty says none is expected yet."""
    put_files(bucket, 1)
    r, d = doctor(gfs, "--bucket", "nosuch")
    assert r.rc == 1, r
    assert d["bucket"] == "nosuch" and d["exists"] is False
    assert d["problems"] == 1 and d["error"] == "problems found"
    h = gfs.run("doctor", "--bucket", "nosuch", "-q")
    assert h.rc == 1 and h.text.splitlines() == [
        f"bucket:       PROBLEM: does not exist: no nosuch.files or nosuch.chunks in database "
        f"{db.name} (a misspelt --bucket or --db? --allow-empty if nothing was written yet)"], h
    r, d = doctor(gfs, "--bucket", "nosuch", "--allow-empty")
    assert r.rc == 0 and d["exists"] is False and d["problems"] == 0, r
    assert "nosuch.files" not in db.list_collection_names()  # doctor created nothing
    assert doctor(gfs)[1]["exists"] is True


def test_the_server_is_named_as_it_names_itself(gfs, bucket, db):
    put_files(bucket, 1)
    info = db.client.admin.command("buildInfo")
    r, d = doctor(gfs)
    backend = dict(ln.split(":", 1) for ln in gfs.run("doctor").text.splitlines())["backend"]
    assert d["serverVersion"] == info["version"]
    if "ferretdbVersion" in info:
        assert d["server"] == "FerretDB" and d["ferretdbVersion"] == info["ferretdbVersion"]
        assert backend.strip().startswith("reachable, FerretDB"), backend
        assert f"compatible with MongoDB {info['version']}" in backend
        assert "FerretDB unknown" not in backend and "MongoDB 7" not in backend.split(",")[1]
    else:
        assert d["server"] == "MongoDB" and "ferretdbVersion" not in d
        assert backend.strip() == f"reachable, MongoDB {info['version']}"


@pytest.mark.parametrize("which", ["files", "chunks"])
def test_missing_index_exits_1(gfs, bucket, db, which):
    put_files(bucket, 2)
    coll = db.fs.files if which == "files" else db.fs.chunks
    for name, info in coll.index_information().items():
        if name != "_id_":
            coll.drop_index(name)
    r, d = doctor(gfs)
    assert r.rc == 1, r
    assert d["indexes"][which] == "missing"
    assert d["indexes"]["chunks" if which == "files" else "files"] == "ok"
    assert d["problems"] == 1 and d["error"] == "problems found"
    h = gfs.run("doctor")
    assert h.rc == 1 and h.err == "", h
    assert f"{which} index:".ljust(14) + "PROBLEM: missing" in h.text
    q = gfs.run("doctor", "-q")  # only the problem
    assert q.rc == 1 and q.text.startswith(f"{which} index:") and len(q.text.splitlines()) == 1, q


def test_chunks_index_that_is_not_unique_exits_1(gfs, bucket, db):
    put_files(bucket, 1)
    db.fs.chunks.drop_index("files_id_1_n_1")
    db.fs.chunks.create_index([("files_id", 1), ("n", 1)], name="not_unique")
    r, d = doctor(gfs)
    assert r.rc == 1, r
    assert d["indexes"]["chunks"] == "not-unique"


def test_an_equivalent_index_under_another_name_is_right(gfs, bucket, db):
    put_files(bucket, 1)
    db.fs.files.drop_index("filename_1_uploadDate_1")
    # 1.0 and 1 are the same direction (the GridFS spec); pymongo only sends ints.
    db.command({"createIndexes": "fs.files",
                "indexes": [{"key": bson.SON([("filename", 1.0), ("uploadDate", 1)]), "name": "mine"}]})
    r, d = doctor(gfs)
    assert r.rc == 0 and d["indexes"]["files"] == "ok", r


def test_orphan_chunks_are_counted_exactly_in_a_small_bucket(gfs, bucket, db):
    put_files(bucket, 4, size=10)  # 3 chunks each
    victim = db.fs.files.find_one({"filename": "f0.txt"})
    db.fs.files.delete_one({"_id": victim["_id"]})
    orphan_id = bson.ObjectId()
    db.fs.chunks.insert_one({"files_id": orphan_id, "n": 0, "data": b"x"})
    r, d = doctor(gfs)
    assert r.rc == 1, r
    assert d["orphans"] == {"method": "all", "sampled": 13, "found": 4, "uploading": 0,
                            "interrupted": 0, "estimate": 4}
    h = gfs.run("doctor")
    assert "orphans:      PROBLEM: 4 chunks (4 of 13 looked at" in h.text and "verify --repair" in h.text
    # verify agrees on what they are.
    v = gfs.run("verify", "--json")
    assert v.rc == 1
    assert sum(e.get("count", 0) for e in jsonvocab.events(v.text, "verify")
               if e.get("kind") == "ORPHAN-CHUNKS") == 4


def test_orphan_estimate_from_a_bounded_sample(gfs, bucket, db):
    put_files(bucket, 30, size=8)  # 60 chunks
    for f in db.fs.files.find({"filename": {"$in": [f"f{i}.txt" for i in range(10)]}}):
        db.fs.files.delete_one({"_id": f["_id"]})  # 20 of 60 chunks orphaned
    r, d = doctor(gfs, "--sample", "2")  # 60 > 2: a sample, not a count
    assert r.rc in (0, 1), r
    o = d["orphans"]
    assert o["method"] == "first"
    assert o["sampled"] == 2
    assert o["estimate"] == round(o["found"] / 2 * d["chunks"])
    # Looking at all of them counts exactly.
    r, d = doctor(gfs, "--sample", "60")
    assert d["orphans"]["method"] == "all" and d["orphans"]["estimate"] == 20 and r.rc == 1


def test_chunks_of_an_upload_with_a_marker_are_not_orphans(gfs, bucket, db):
    """...while its writer is at work (an import holds the import lock); once it is gone,
    they are orphans that an interrupted import left, as verify says."""
    put_files(bucket, 1)
    fid = bson.ObjectId()
    now = datetime.datetime.now(datetime.timezone.utc)
    db["fs.gridfsctl_locks"].insert_one({"_id": "import", "owner": "x", "host": "elsewhere.example",
                                         "pid": 4242, "expires": now + datetime.timedelta(minutes=5)})
    db["fs.gridfsctl_uploads"].insert_one({"_id": fid, "filename": "coming.txt"})
    db.fs.chunks.insert_one({"files_id": fid, "n": 0, "data": b"x"})
    r, d = doctor(gfs)
    assert r.rc == 0, r
    assert d["orphans"]["uploading"] == 1 and d["orphans"]["found"] == 0
    db["fs.gridfsctl_locks"].delete_one({"_id": "import"})
    r, d = doctor(gfs)
    assert r.rc == 1 and (d["orphans"]["found"], d["orphans"]["interrupted"]) == (1, 1), r
    assert "left by an interrupted import (the next import removes them)" in gfs.run("doctor").text


def test_skip_the_orphan_estimate(gfs, bucket, db):
    put_files(bucket, 1)
    db.fs.chunks.insert_one({"files_id": bson.ObjectId(), "n": 0, "data": b"x"})
    r, d = doctor(gfs, "--sample", "0")
    assert r.rc == 0 and d["orphans"]["method"] == "none", r


def test_import_lock_held_and_stale(gfs, bucket, db):
    put_files(bucket, 1)
    locks = db["fs.gridfsctl_locks"]
    now = datetime.datetime.now(datetime.timezone.utc)
    locks.insert_one({"_id": "import", "owner": "x", "host": "elsewhere.example", "pid": 4242,
                      "bootId": "b", "startTime": 1, "acquired": now,
                      "expires": now + datetime.timedelta(minutes=5)})
    r, d = doctor(gfs)
    assert r.rc == 0, r  # a running import is not a problem
    assert d["importLock"]["state"] == "held"
    assert d["importLock"]["owner"] == "elsewhere.example pid 4242"
    assert "held by elsewhere.example pid 4242" in gfs.run("doctor").text
    locks.update_one({"_id": "import"}, {"$set": {"expires": now - datetime.timedelta(minutes=5)}})
    r, d = doctor(gfs)
    assert r.rc == 0 and d["importLock"]["state"] == "stale", r
    # and an import takes a stale lock over
    (gfs.tmp_path / "empty").mkdir()
    assert gfs.run("import", gfs.tmp_path / "empty").rc == 0
    assert doctor(gfs)[1]["importLock"] == {"state": "free"}


def test_backend_down_exits_3(gfs):
    uri = f"mongodb://127.0.0.1:{free_port()}/?serverSelectionTimeoutMS=300"
    r, d = doctor(gfs, env={"GRIDFSCTL_URI": uri})
    assert r.rc == 3, r
    assert d["reachable"] is False and "cannot reach the backend" in d["error"]
    assert "files" not in d
    h = gfs.run("doctor", env={"GRIDFSCTL_URI": uri})
    assert h.rc == 3 and h.out == b"" and len(h.err.strip().splitlines()) == 1, h


def test_usage_errors_exit_2(gfs):
    assert gfs.run("doctor", "--sample", "x").rc == 2
    assert gfs.run("doctor", "extra").rc == 2
    h = gfs.run("doctor", "--help", db=False)
    assert h.rc == 0 and h.text.startswith("usage: gridfsctl doctor")


def test_topology_standalone(gfs, bucket, mongo):
    """The embedded backend is one server: pymongo's hello names no set and no mongos."""
    hello = mongo.admin.command("hello")
    assert "setName" not in hello and hello.get("msg") != "isdbgrid"
    put_files(bucket, 1)
    r, d = doctor(gfs)
    assert r.rc == 0, r
    assert d["topology"] == {"kind": "standalone"}
    h = gfs.run("doctor")
    lines = dict(l.split(":", 1) for l in h.text.splitlines())
    assert lines["topology"].strip() == "standalone (one server, no replica set)"
    assert gfs.run("doctor", "-q").out == b""  # a topology is not a problem


MEMBERS = ["db1.example.net:27017", "db2.example.net:27017", "db3.example.net:27017"]


def test_topology_replica_set_without_status(gfs, bucket, backend):
    """hello says replica set (through a proxy rewriting hello, the only
    answer it changes); the backend refuses replSetGetStatus, as a mongod
    does to a user without clusterMonitor: the members hello names, the
    primary marked, and a line saying states and lag could not be read."""
    put_files(bucket, 1)
    proxy = HelloRewriter(backend.port, {"setName": "rs0", "hosts": MEMBERS, "primary": MEMBERS[0],
                                          "me": MEMBERS[0], "isWritablePrimary": True,
                                          "secondary": False})
    try:
        env = {"GRIDFSCTL_URI": proxy.uri}
        r, d = doctor(gfs, env=env)
        assert r.rc == 0, r  # not knowing the states is said, and not a problem
        t = d["topology"]
        assert t["kind"] == "replicaSet" and t["setName"] == "rs0", t
        assert [m["host"] for m in t["members"]] == MEMBERS, t
        assert t["members"][0]["state"] == "PRIMARY", t
        assert "state" not in t["members"][1] and "lagSeconds" not in t["members"][1], t
        assert t["statusError"], t
        h = gfs.run("doctor", env=env)
        lines = h.text.splitlines()
        top = [l for l in lines if l.startswith("topology:")]
        assert len(top) == 1 and "replica set rs0, 3 members (states and lag not readable" in top[0], h
        members = [l.split(":", 1)[1].strip() for l in lines if l.startswith("member:")]
        assert members == [f"{MEMBERS[0]} PRIMARY"] + [f"{m} (state not readable)" for m in MEMBERS[1:]], h
    finally:
        proxy.close()


@pytest.fixture
def config_collections(mongo, db):
    """config.collections on the backend, as mongos reads it: a test writes
    its bucket's documents there (under its own database's name), and they
    are removed afterwards."""
    coll = mongo["config"]["collections"]
    yield coll
    coll.delete_many({"_id": {"$in": [f"{db.name}.fs.files", f"{db.name}.fs.chunks"]}})


def shard_doc(ns, key):
    """A config.collections document as MongoDB 5.0 and later write it."""
    return {"_id": ns, "lastmodEpoch": bson.ObjectId(), "lastmod": datetime.datetime.now(datetime.timezone.utc),
            "timestamp": bson.Timestamp(1764928800, 1), "uuid": bson.Binary(os.urandom(16), 4),
            "key": key, "unique": False, "noBalance": False}


@pytest.mark.parametrize("key, supported", [({"files_id": 1, "n": 1}, True), ({"files_id": 1}, True),
                                            ({"_id": 1}, False), ({"files_id": "hashed"}, False)])
def test_topology_sharded_chunks_key(gfs, bucket, backend, db, config_collections, key, supported):
    """hello says mongos (the proxy's one change); config.collections holds
    the bucket's documents as mongos would read them: fs.chunks on a key
    other than the manual's two is a PROBLEM, exit 1."""
    put_files(bucket, 1)
    config_collections.insert_one(shard_doc(f"{db.name}.fs.chunks", key))
    proxy = HelloRewriter(backend.port, {"msg": "isdbgrid"})
    try:
        env = {"GRIDFSCTL_URI": proxy.uri}
        r, d = doctor(gfs, env=env)
        assert r.rc == (0 if supported else 1), r
        t = d["topology"]
        assert t["kind"] == "sharded", t
        assert t["files"] == {"sharded": False}, t
        assert t["chunks"]["sharded"] is True and t["chunks"]["supported"] is supported, t
        assert d["problems"] == (0 if supported else 1), d
        q = gfs.run("doctor", "-q", env=env)
        if supported:
            assert q.out == b"", q
        else:
            assert q.text.startswith("sharding:     PROBLEM: fs.chunks sharded on {"), q
            assert len(q.text.splitlines()) == 1, q
    finally:
        proxy.close()
