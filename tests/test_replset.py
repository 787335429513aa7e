"""Reads under readPreference=secondary on a replica set (issue 31): the
harness in tests/replset.py presents the session's backend as the primary
and a second one as a secondary whose copy of the bucket lags (the newest
file's chunks are missing, the very newest file is not there at all).
Whatever a verb reads on the secondary, it never reports damage the primary
does not have: it reads again on the primary, and the primary's word goes."""
import os

import bson
import gridfs
import pytest

from conftest import Backend, STORAGE, check_sanitizers, free_port, sha256
from replset import ReplicaSet

OLD, NEW, NEWEST = b"old poster " * 1000, b"new poster " * 3000, b"newest " * 10


@pytest.fixture(scope="module")
def second(tmp_path_factory):
    b = Backend(str(tmp_path_factory.mktemp("secondary")), free_port(), "sqlite")
    b.start()
    yield b
    b.purge()


@pytest.fixture
def lagging(backend, second, db):
    """The bucket on the primary (db) and its lagging copy on the secondary."""
    sdb = second.client()[db.name]
    ids = {}
    for name, data in (("posters/old.jpg", OLD), ("posters/new.jpg", NEW)):
        fid = bson.ObjectId()
        ids[name] = fid
        for d in (db, sdb):
            gridfs.GridFSBucket(d).upload_from_stream_with_id(fid, name, data)
    gridfs.GridFSBucket(db).upload_from_stream("posters/newest.jpg", NEWEST)
    sdb.fs.chunks.delete_many({"files_id": ids["posters/new.jpg"]})
    rs = ReplicaSet(backend.port, second.port)
    yield rs, db, sdb, ids
    rs.close()
    sdb.client.drop_database(db.name)


def run(gfs, rs, *args, pref="secondary"):
    return gfs.run(*args, env={"GRIDFSCTL_URI": rs.uri(pref)})


def test_get_reads_what_the_secondary_lacks_from_the_primary(gfs, lagging, tmp_path):
    rs, db, sdb, ids = lagging
    for name, data in (("posters/old.jpg", OLD), ("posters/new.jpg", NEW), ("posters/newest.jpg", NEWEST)):
        out = tmp_path / os.path.basename(name)
        res = run(gfs, rs, "get", name, "-o", out)
        check_sanitizers(res)
        assert res.rc == 0, res
        assert res.err == "", res
        assert sha256(out.read_bytes()) == sha256(data)
        res = run(gfs, rs, "get", name, "-o", "-")
        assert res.rc == 0 and res.out == data, res
    # The old file came from the secondary alone; the others from the primary after it.
    assert ("find", "fs.chunks", None) in rs.served("secondary")
    assert ("find", "fs.chunks", None) in rs.served("primary")


def test_get_reports_damage_the_primary_has(gfs, lagging, tmp_path):
    rs, db, sdb, ids = lagging
    db.fs.chunks.delete_many({"files_id": ids["posters/new.jpg"]})
    res = run(gfs, rs, "get", "posters/new.jpg", "-o", tmp_path / "x")
    assert res.rc == 1, res
    assert res.err.count("\n") == 1, res
    res = run(gfs, rs, "get", "posters/nothere.jpg", "-o", tmp_path / "y")
    assert res.rc == 4, res


def test_verify_reports_the_secondary_behind_not_damage(gfs, lagging):
    rs, db, sdb, ids = lagging
    res = run(gfs, rs, "verify")
    check_sanitizers(res)
    assert res.rc == 0, res
    assert "the secondary is behind (whole on the primary)" in res.text + res.err, res
    # The pass read the secondary, with the majority read concern of a replica set.
    assert ("find", "fs.files", "majority") in rs.served("secondary"), rs.served("secondary")
    # Damage the primary has too is damage.
    db.fs.chunks.delete_many({"files_id": ids["posters/new.jpg"]})
    res = run(gfs, rs, "verify")
    assert res.rc == 1, res


def test_verify_repair_decides_on_the_primary(gfs, lagging):
    rs, db, sdb, ids = lagging
    before = sorted((c["files_id"], c["n"]) for c in db.fs.chunks.find({}, {"files_id": 1, "n": 1}))
    res = run(gfs, rs, "verify", "--repair")
    check_sanitizers(res)
    assert res.rc == 0, res
    assert sorted((c["files_id"], c["n"]) for c in db.fs.chunks.find({}, {"files_id": 1, "n": 1})) == before
    assert db.fs.files.count_documents({}) == 3
    assert not [c for c in rs.served("secondary") if c[1] in ("fs.files", "fs.chunks")]


def test_mirror_writes_what_the_primary_has(gfs, lagging, tmp_path):
    rs, db, sdb, ids = lagging
    dest = tmp_path / "mirror"
    res = run(gfs, rs, "mirror", dest)
    check_sanitizers(res)
    assert res.rc == 0, res
    assert (dest / "posters/old.jpg").read_bytes() == OLD
    assert (dest / "posters/new.jpg").read_bytes() == NEW


def test_mirror_scan_rechecks_on_the_primary(gfs, lagging, tmp_path):
    """The one pass over all chunks reads the secondary, where a file still replicating lacks its
    last chunk: it is read again, from the primary, and written, not reported."""
    rs, db, sdb, ids = lagging
    big = os.urandom(3 * 255 * 1024 + 100)
    fid = bson.ObjectId()
    for d in (db, sdb):
        gridfs.GridFSBucket(d).upload_from_stream_with_id(fid, "posters/big.jpg", big)
    sdb.fs.chunks.delete_one({"files_id": fid, "n": 3})
    dest = tmp_path / "mirror"
    res = run(gfs, rs, "mirror", dest, "--read", "scan")
    check_sanitizers(res)
    assert res.rc == 0, res
    assert res.err == "", res
    assert sha256((dest / "posters/big.jpg").read_bytes()) == sha256(big)
    assert (dest / "posters/new.jpg").read_bytes() == NEW
    # The pass ran on the secondary; the file's chunks were read again on the primary.
    assert ("find", "fs.chunks", "majority") in rs.served("secondary"), rs.served("secondary")
    assert [c for c in rs.served("primary") if c[:2] == ("find", "fs.chunks")], rs.served("primary")
    # Damage the primary has too is reported, once, and the file is not written.
    db.fs.chunks.delete_one({"files_id": fid, "n": 3})
    dest2 = tmp_path / "mirror2"
    res = run(gfs, rs, "mirror", dest2, "--read", "scan")
    assert res.rc == 1, res
    assert res.err.count("posters/big.jpg") == 1 and "missing chunk" in res.err, res
    assert not (dest2 / "posters/big.jpg").exists()
