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


def test_get_of_several_files_reads_what_the_secondary_lacks_from_the_primary(gfs, lagging, tmp_path):
    """NAMEs, --prefix and --regex: each file the secondary lacks (its chunks, or the name
    itself for NAMEs) is read again on the primary, as one file's get is."""
    rs, db, sdb, ids = lagging
    want = {"posters/old.jpg": OLD, "posters/new.jpg": NEW, "posters/newest.jpg": NEWEST}
    res = run(gfs, rs, "get", *want, "-o", tmp_path / "names")
    assert res.rc == 0 and res.err == "", res
    for name, data in want.items():
        assert (tmp_path / "names" / name).read_bytes() == data, name
    # A listing is the secondary's (the newest file has not reached it); what it lists is got whole.
    for how in (("--prefix", "posters"), ("--regex", "^posters/")):
        out = tmp_path / how[0].strip("-")
        res = run(gfs, rs, "get", *how, "-o", out)
        assert res.rc == 0 and res.err == "", res
        base = out if how[0] == "--prefix" else out / "posters"
        assert (base / "old.jpg").read_bytes() == OLD
        assert (base / "new.jpg").read_bytes() == NEW
        assert sorted(p.name for p in base.iterdir()) == ["new.jpg", "old.jpg"], how
    assert ("find", "fs.chunks", None) in rs.served("secondary")
    assert ("find", "fs.chunks", None) in rs.served("primary")
    # Damage the primary has too is damage, said once, and the others are still got.
    db.fs.chunks.delete_many({"files_id": ids["posters/new.jpg"]})
    res = run(gfs, rs, "get", "posters/old.jpg", "posters/new.jpg", "-o", tmp_path / "again")
    assert res.rc == 1 and res.err.count("\n") == 1 and "posters/new.jpg" in res.err, res
    assert (tmp_path / "again/posters/old.jpg").read_bytes() == OLD
    assert not (tmp_path / "again/posters/new.jpg").exists()


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


def upload_both(db, sdb, name, data, **kw):
    """One file on both members, with its sha256 (so serve checks its bytes), by one id."""
    fid = bson.ObjectId()
    for d in (db, sdb):
        gridfs.GridFSBucket(d).upload_from_stream_with_id(fid, name, data, metadata={"sha256": sha256(data)}, **kw)
    return fid


def test_serve_reads_what_the_secondary_lacks_from_the_primary(gfs, lagging, tmp_path):
    """serve reads its index and the chunks on the secondary; a file whose chunks have not
    reached it is read again on the primary (a streamed one from the chunk it lacks on),
    answered 200 with the primary's bytes, checked against the sha256, and counted."""
    from test_serve import Server
    rs, db, sdb, ids = lagging
    chunk = 64 * 1024
    big = os.urandom(10 * chunk + 99)  # streamed: 11 chunks, all in the first window
    big_id = upload_both(db, sdb, "posters/big.tif", big, chunk_size_bytes=chunk)
    sdb.fs.chunks.delete_many({"files_id": big_id, "n": {"$gte": 6}})
    late = os.urandom(2 * 1024 * 1024 + 5)  # 3 chunks: the first window holds one
    late_id = upload_both(db, sdb, "posters/late.tif", late, chunk_size_bytes=1024 * 1024)
    sdb.fs.chunks.delete_many({"files_id": late_id, "n": {"$gte": 2}})
    gone = b"damaged on both " * 100
    gone_id = upload_both(db, sdb, "posters/gone.jpg", gone)
    for d in (db, sdb):
        d.fs.chunks.delete_many({"files_id": gone_id})

    srv = Server(gfs, tmp_path, "--stream-threshold", "512K", env={"GRIDFSCTL_URI": rs.uri()})
    try:
        for name, data in (("posters/old.jpg", OLD), ("posters/new.jpg", NEW),
                           ("posters/big.tif", big), ("posters/late.tif", late)):
            status, headers, body = srv.get("/" + name)
            assert status == 200, (name, status, srv.stderr())
            assert sha256(body) == sha256(data), name
        status, _, body = srv.get("/posters/big.tif", {"Range": "bytes=400000-"})
        assert status == 206 and body == big[400000:], status
        # Damage the primary has too is damage: 500, as on one server.
        status, _, _ = srv.get("/posters/gone.jpg")
        assert status == 500, status
        # new.jpg, big.tif twice (whole, a range), late.tif, gone.jpg
        assert srv.metrics()["gridfsctl_serve_primary_rereads_total"] == 5
        for name in ("new.jpg", "big.tif", "late.tif"):
            assert name not in srv.stderr(), srv.stderr()
    finally:
        srv.stop()
    # The index and the chunks were read on the secondary, the lacking chunks on the primary.
    assert ("find", "fs.files", None) in rs.served("secondary")
    assert ("find", "fs.chunks", None) in rs.served("primary")


def test_import_decides_from_the_primary_not_a_lagging_secondary(gfs, lagging, tmp_path):
    """import's idempotence check reads the primary: a secondary that lacks a stored file (or
    shows an older revision) must not make it store the file again, nor miss a change."""
    rs, db, sdb, ids = lagging
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.jpg").write_bytes(b"a" * 5000)
    (tree / "b.jpg").write_bytes(b"b" * 7000)
    res = gfs.run("import", tree, "--prefix", "imp")
    assert res.rc == 0, res
    # The secondary has a.jpg's documents only: b.jpg has not reached it.
    a = db.fs.files.find_one({"filename": "imp/a.jpg"})
    sdb.fs.files.insert_one(a)
    sdb.fs.chunks.insert_many(db.fs.chunks.find({"files_id": a["_id"]}))
    before = sorted((f["filename"], f["_id"]) for f in db.fs.files.find({"filename": {"$regex": "^imp/"}}))
    res = run(gfs, rs, "import", tree, "--prefix", "imp", "--delete", "--json")
    assert res.rc == 0, res
    after = sorted((f["filename"], f["_id"]) for f in db.fs.files.find({"filename": {"$regex": "^imp/"}}))
    assert after == before, res
    # A change the secondary has not seen the old revision of is still a change.
    (tree / "b.jpg").write_bytes(b"B" * 7001)
    res = run(gfs, rs, "import", tree, "--prefix", "imp", "--json")
    assert res.rc == 0, res
    assert [f["length"] for f in db.fs.files.find({"filename": "imp/b.jpg"})] == [7001], res
    assert not [c for c in rs.served("secondary") if c[1] in ("fs.files", "fs.chunks")]
