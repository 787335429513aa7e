"""One integrity rule in every reader (issue 27, points 1-4 and 7): malformed
files documents, names just past a prefix, extra chunks, malformed hashes.
Everything is planted with pymongo and checked with pymongo, hashlib or the
file system, never with gridfsctl's own word."""
import datetime
import hashlib
import json
import os

import bson
import pytest

import jsonvocab
import planted

CS = planted.CHUNK
MAXCP = "\U0010ffff"

# Files documents no reader can use: each is a problem of its name.
MALFORMED = {
    "chunksize-negative": {"chunkSize": -5},
    "chunksize-zero": {"chunkSize": 0},
    "length-fraction": {"length": 1500.5},
    "length-string": {"length": "1500"},
}


def plant_bad(db, name, over, date=None):
    """A files document of name with the fields in over, and its chunks."""
    body = planted.data(1500, 3)
    fid = bson.ObjectId()
    doc = planted.file_doc(fid, name, body)
    doc.update(over)
    if date:
        doc["uploadDate"] = date
    db["fs.chunks"].insert_many([{"files_id": fid, "n": i, "data": bson.Binary(body[o:o + CS])}
                                 for i, o in enumerate(range(0, len(body), CS))])
    db["fs.files"].insert_one(doc)
    return fid


def plant_good(db, name, body, date=None, **extra):
    fid = planted.plant(db, bson.ObjectId(), name, body, **extra)
    if date:
        db["fs.files"].update_one({"_id": fid}, {"$set": {"uploadDate": date}})
    return fid


def old(days=2):
    return datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=days)


def read(path):
    with open(path, "rb") as f:
        return f.read()


# ---- 1. a malformed files document is a problem of its name ---------------


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_mirror_delete_keeps_local_copy_of_a_malformed_name(gfs, db, tmp_path, kind):
    plant_good(db, "p/good.bin", planted.data(1200, 1))
    plant_bad(db, "p/bad.bin", MALFORMED[kind])
    out = tmp_path / "out"
    out.mkdir()
    (out / "bad.bin").write_bytes(b"the local copy")
    r = gfs.run("mirror", out, "--prefix", "p", "--delete")
    assert r.rc == 1, r
    assert "p/bad.bin" in r.err, r
    assert read(out / "bad.bin") == b"the local copy"
    assert read(out / "good.bin") == planted.data(1200, 1)


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_mirror_never_writes_an_older_revision_than_a_malformed_newest(gfs, db, tmp_path, kind):
    plant_good(db, "p/rev.bin", planted.data(900, 2), date=old())
    plant_bad(db, "p/rev.bin", MALFORMED[kind])
    out = tmp_path / "out"
    out.mkdir()
    (out / "rev.bin").write_bytes(b"newer local copy")
    r = gfs.run("mirror", out, "--prefix", "p", "--delete")
    assert r.rc == 1, r
    assert "p/rev.bin" in r.err, r
    assert read(out / "rev.bin") == b"newer local copy"
    r = gfs.run("mirror", tmp_path / "fresh", "--prefix", "p")
    assert r.rc == 1, r
    assert not (tmp_path / "fresh" / "rev.bin").exists()


def test_ls_reports_a_malformed_newest_revision(gfs, db):
    plant_good(db, "p/a.bin", planted.data(100))
    plant_good(db, "p/rev.bin", planted.data(900, 2), date=old())
    plant_bad(db, "p/rev.bin", MALFORMED["length-string"])
    plant_bad(db, "p/only-bad.bin", MALFORMED["chunksize-zero"])
    for args in (["ls"], ["ls", "-l"], ["ls", "p/"]):
        r = gfs.run(*args)
        assert r.rc == 1, (args, r)
        assert "p/rev.bin" in r.err and "p/only-bad.bin" in r.err, r
        assert "900" not in r.text, r   # never the older revision's size
        assert "p/a.bin" in r.text, r
    r = gfs.run("ls", "--json")
    assert r.rc == 1, r
    objs = jsonvocab.parse(r.text, "ls")
    bad = {o["filename"]: o for o in objs if "error" in o}
    assert set(bad) == {"p/rev.bin", "p/only-bad.bin"}, objs
    assert all("length" not in o for o in bad.values())
    r = gfs.run("ls", "-a")
    assert r.rc == 1, r
    assert r.text.count("p/rev.bin") == 1, r   # the good old revision is listed, the bad one reported


def test_verify_prefix_reports_a_malformed_name(gfs, db):
    plant_good(db, "p/a.bin", planted.data(100))
    plant_bad(db, "p/bad.bin", MALFORMED["chunksize-negative"])
    r = gfs.run("verify", "--prefix", "p")
    assert r.rc == 1, r
    assert any(l.startswith("BAD-DOC") and "p/bad.bin" in l for l in r.text.splitlines()), r


def test_import_reports_a_malformed_name_and_deletes_nothing_for_it(gfs, db, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"aaa")
    bad = plant_bad(db, "p/bad.bin", MALFORMED["length-fraction"])
    rev = plant_bad(db, "p/a.bin", MALFORMED["chunksize-zero"], date=old())
    r = gfs.run("import", src, "--prefix", "p", "--delete")
    assert r.rc == 1, r
    assert "p/bad.bin" in r.err, r
    assert db["fs.files"].count_documents({"_id": bad}) == 1
    assert db["fs.chunks"].count_documents({"files_id": bad}) == 2
    # the name on disk gets its new revision; the malformed old one is left, reported
    assert db["fs.files"].count_documents({"_id": rev}) == 1
    newest = db["fs.files"].find_one({"filename": "p/a.bin"}, sort=[("uploadDate", -1)])
    assert newest["length"] == 3


# ---- 2. a prefix selects exactly the names that begin with it -------------

EDGE = "p/" + MAXCP            # sorts above "p/" + U+10FFFF's old upper bound
EDGE2 = "p/" + MAXCP + "x"


def test_mirror_prefix_keeps_names_just_past_the_old_bound(gfs, db, tmp_path):
    plant_good(db, "p/a.bin", planted.data(100))
    plant_good(db, EDGE, planted.data(200, 1))
    plant_good(db, EDGE2, planted.data(300, 2))
    plant_good(db, "p0", planted.data(50, 3))       # the least name past the prefix
    out = tmp_path / "out"
    out.mkdir()
    (out / MAXCP).write_bytes(b"old local copy")
    r = gfs.run("mirror", out, "--prefix", "p", "--delete")
    assert r.rc == 0, r
    assert read(out / MAXCP) == planted.data(200, 1)
    assert read(out / (MAXCP + "x")) == planted.data(300, 2)
    assert sorted(os.listdir(out)) == sorted(["a.bin", MAXCP, MAXCP + "x"])


def test_verify_prefix_checks_names_just_past_the_old_bound(gfs, db):
    fid = plant_good(db, EDGE, planted.data(2500, 1))
    db["fs.chunks"].update_one({"files_id": fid, "n": 0}, {"$set": {"data": bson.Binary(b"\0" * CS)}})
    r = gfs.run("verify", "--prefix", "p")
    assert r.rc == 1, r
    assert any(l.startswith("CHECKSUM") for l in r.text.splitlines()), r
    r = gfs.run("ls", "p/")
    assert r.text.splitlines() == [EDGE], r


def test_import_prefix_sees_names_just_past_the_old_bound(gfs, db, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / MAXCP).write_bytes(b"edge")
    (src / "a.bin").write_bytes(b"a")
    for _ in range(2):
        r = gfs.run("import", src, "--prefix", "p")
        assert r.rc == 0, r
    assert db["fs.files"].count_documents({"filename": EDGE}) == 1
    # a stored name past the old bound that disk no longer has goes with --delete
    plant_good(db, EDGE2, planted.data(10))
    r = gfs.run("import", src, "--prefix", "p", "--delete")
    assert r.rc == 0, r
    assert db["fs.files"].count_documents({"filename": EDGE2}) == 0
    assert db["fs.files"].count_documents({"filename": EDGE}) == 1
