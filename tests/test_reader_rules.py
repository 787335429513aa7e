"""One integrity rule in every reader (issue 27, points 1-4 and 7): malformed
files documents, names just past a prefix, extra chunks, malformed hashes.
Everything is planted with pymongo and checked with pymongo, hashlib or the
file system, never with gridfsctl's own word."""
import datetime
import hashlib
import json
import os
import re

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


def test_get_prefix_never_gets_an_older_revision_than_a_malformed_newest(gfs, db, tmp_path):
    plant_good(db, "p/a.bin", planted.data(100))
    plant_good(db, "p/rev.bin", planted.data(900, 2), date=old())
    plant_bad(db, "p/rev.bin", MALFORMED["chunksize-negative"])
    out = tmp_path / "out"
    r = gfs.run("get", "--prefix", "p", "-o", out)
    assert r.rc == 1 and "p/rev.bin: chunkSize is not a whole number above 0" in r.err, r
    assert read(out / "a.bin") == planted.data(100)
    assert not (out / "rev.bin").exists()


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


def test_serve_never_answers_an_older_revision_than_a_malformed_newest(gfs, db, tmp_path):
    from test_serve import Server, quote
    plant_good(db, "p/rev.bin", planted.data(900, 2), date=old())
    plant_bad(db, "p/rev.bin", MALFORMED["length-string"])
    plant_bad(db, "p/only-bad.bin", MALFORMED["chunksize-zero"])
    s = Server(gfs, tmp_path)
    try:
        for name in ("p/rev.bin", "p/only-bad.bin"):
            status, _, body = s.get(quote(name))
            assert status == 500 and body != planted.data(900, 2), (name, status)
    finally:
        err = s.stop()
    assert "p/rev.bin: malformed files document: length is not a whole number" in err, err


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


# ---- 3. verify --repair removes nothing it cannot prove extra -------------


def chunk_ns(db, fid):
    return sorted(c["n"] for c in db["fs.chunks"].find({"files_id": fid}))


@pytest.mark.parametrize("sha", [False, True])
def test_repair_keeps_extra_chunks_of_a_file_without_hash(gfs, db, sha):
    body = b"0123456789" * 2
    # length cut short: 10, with two 10-byte chunks; and length 0 beside a chunk with bytes
    short = planted.plant(db, bson.ObjectId(), "short.bin", body, chunk=10, sha=False, length=10)
    empty = bson.ObjectId()
    db["fs.files"].insert_one(planted.file_doc(empty, "empty.bin", b"", sha=False))
    db["fs.chunks"].insert_one({"files_id": empty, "n": 0, "data": bson.Binary(b"bytes")})
    if sha:   # with a hash of what the length says, the rest is proven extra
        db["fs.files"].update_one({"_id": short}, {"$set": {"metadata.sha256": hashlib.sha256(body[:10]).hexdigest()}})
        db["fs.files"].update_one({"_id": empty}, {"$set": {"metadata.sha256": hashlib.sha256(b"").hexdigest()}})
    r = gfs.run("verify", "--repair")
    if sha:
        assert "REPAIRED remove-extra-chunks short.bin" in r.text, r
        assert chunk_ns(db, short) == [0] and chunk_ns(db, empty) == []
        return
    assert r.rc == 1, r
    assert "NOT-REPAIRED none short.bin" in r.text and "NOT-REPAIRED none empty.bin" in r.text, r
    assert chunk_ns(db, short) == [0, 1] and chunk_ns(db, empty) == [0]
    r = gfs.run("verify", "--repair", "--dry-run")
    assert "WOULD remove-extra-chunks" not in r.text, r
    assert chunk_ns(db, short) == [0, 1]


# ---- 7. one rule for extra chunks -------------------------------------------


EXTRA = r": extra chunk n=-?\d+ \(expected \d+ chunks\)"


def plant_extra(db):
    """A non-empty file with chunks numbered past and before its content, and
    an empty one with a stray chunk: {name: the content its length claims}."""
    body = planted.data(2500, 5)
    fid = planted.plant(db, bson.ObjectId(), "d/beyond.bin", body)
    db["fs.chunks"].insert_many([{"files_id": fid, "n": 3, "data": bson.Binary(b"x" * 10)},
                                 {"files_id": fid, "n": -1, "data": bson.Binary(b"y")}])
    planted.plant_empty_with_stray_chunk(db, "d/empty.bin")
    return {"d/beyond.bin": body, "d/empty.bin": b""}


def assert_extra(err, name):
    """One line of err says name has an extra chunk, in the words of every reader."""
    assert re.search(re.escape(name) + EXTRA, err), (name, err)


@pytest.mark.parametrize("read", ["each", "scan", "batched"])
def test_extra_chunks_are_damage_to_every_reader(gfs, db, tmp_path, read):
    """The one rule (issue 27.7): a chunk numbered outside 0..count-1 is extra,
    an empty file's stray chunk included. get and mirror deliver nothing of the
    file and exit 1 with the same line; verify reports EXTRA-CHUNK."""
    files = plant_extra(db)
    for name in files:
        r = gfs.run("get", name, "-o", tmp_path / "o")
        assert r.rc == 1, r
        assert_extra(r.err, name)
        assert not (tmp_path / "o").exists()
    out = tmp_path / "m"
    r = gfs.run("mirror", out, "--prefix", "d", "--read", read)
    assert r.rc == 1, r
    for name in files:
        assert_extra(r.err, name)
    assert not out.exists() or os.listdir(out) == [], os.listdir(out)
    r = gfs.run("verify", "--prefix", "d")
    assert r.rc == 1, r
    assert sorted(l.split()[0:2] for l in r.text.splitlines() if not l.startswith("verify:")) == \
        [["EXTRA-CHUNK", "d/beyond.bin"], ["EXTRA-CHUNK", "d/empty.bin"]], r
    # the stored documents are as planted: no reader repaired or removed anything
    assert db["fs.chunks"].count_documents({}) == 3 + 2 + 1


@pytest.mark.parametrize("read", ["each", "scan", "batched"])
def test_a_second_copy_of_a_chunk_is_damage_to_every_reader(gfs, db, tmp_path, read):
    body = planted.data(2500, 6)
    fid = planted.plant(db, bson.ObjectId(), "d/dup.bin", body)
    db["fs.chunks"].drop_indexes()
    db["fs.chunks"].insert_one({"files_id": fid, "n": 1, "data": bson.Binary(body[CS:2 * CS])})
    r = gfs.run("get", "d/dup.bin", "-o", tmp_path / "o")
    assert r.rc == 1 and "n=1" in r.err, r
    assert not (tmp_path / "o").exists()
    out = tmp_path / "m"
    r = gfs.run("mirror", out, "--prefix", "d", "--read", read)
    assert r.rc == 1, r
    assert not (out / "dup.bin").exists()
    r = gfs.run("verify", "--prefix", "d")
    assert r.rc == 1 and r.text.startswith("EXTRA-CHUNK d/dup.bin"), r


def read_bytes(path):
    return read(path)


# ---- 4. a malformed hash is damage ------------------------------------------

BAD_HASHES = {
    "sha-10-hex": {"metadata": {"sha256": "0123456789"}},
    "sha-int": {"metadata": {"sha256": 5}},
    "sha-empty": {"metadata": {"sha256": ""}},
    "md5-short": {"md5": "abc123"},
    "md5-int": {"md5": 5},
    "md5-empty": {"md5": ""},
}


@pytest.mark.parametrize("kind", sorted(BAD_HASHES))
def test_a_malformed_hash_is_damage_to_every_reader(gfs, db, tmp_path, kind):
    body = planted.data(2500, 7)
    planted.plant(db, bson.ObjectId(), "h/f.bin", body, sha=False, **BAD_HASHES[kind])
    r = gfs.run("get", "h/f.bin", "-o", tmp_path / "o")
    assert r.rc == 1 and "malformed" in r.err, r
    assert not (tmp_path / "o").exists()
    for read in ("each", "scan"):
        out = tmp_path / read
        r = gfs.run("mirror", out, "--prefix", "h", "--read", read)
        assert r.rc == 1 and "malformed" in r.err, r
        assert not (out / "f.bin").exists()
    r = gfs.run("verify", "--prefix", "h")
    assert r.rc == 1 and r.text.startswith("CHECKSUM h/f.bin") and "malformed" in r.text, r


@pytest.mark.parametrize("args", [[], ["--preload"]])
def test_serve_refuses_a_malformed_hash_and_extra_chunks(gfs, db, tmp_path, args):
    from test_serve import Server, quote
    body = planted.data(2500, 8)
    planted.plant(db, bson.ObjectId(), "h/bad.bin", body, sha=False, metadata={"sha256": "0123456789"})
    fid = planted.plant(db, bson.ObjectId(), "h/beyond.bin", body)
    db["fs.chunks"].insert_one({"files_id": fid, "n": 3, "data": bson.Binary(b"x" * 10)})
    planted.plant_empty_with_stray_chunk(db, "h/empty.bin")
    good = planted.data(900, 9)
    planted.plant(db, bson.ObjectId(), "h/good.bin", good)
    s = Server(gfs, tmp_path, *args)
    try:
        if args:
            s.preloaded()
        for name in ("h/beyond.bin", "h/empty.bin"):
            status, _, got = s.get(quote(name))
            assert status == 500 and got != body, (name, status)
        status, _, got = s.get(quote("h/bad.bin"))
        assert status != 200 and got != body
        status, _, got = s.get(quote("h/good.bin"))
        assert status == 200 and hashlib.sha256(got).digest() == hashlib.sha256(good).digest()
    finally:
        err = s.stop()
    for name in ("h/beyond.bin", "h/empty.bin"):
        assert_extra(err, name)


# ---- small ones ---------------------------------------------------------------


def test_an_empty_segment_below_the_prefix_is_refused_for_what_it_is(gfs, db, tmp_path):
    plant_good(db, "p//e", b"x")
    r = gfs.run("mirror", tmp_path / "m", "--prefix", "p")
    assert r.rc == 1 and "p//e: refused: empty path segment" in r.err and "absolute" not in r.err, r


def test_an_unreachable_backend_is_said_once(gfs, tmp_path):
    for args in (["doctor"], ["watch", tmp_path]):
        r = gfs.run(*args, env={"GRIDFSCTL_URI": "mongodb://127.0.0.1:1/", "GRIDFSCTL_TIMEOUT": "1"})
        assert r.rc == 3, r
        assert (r.err + r.text).count("cannot reach the backend") == 1, r


def test_rm_dry_run_prints_a_number_id_as_the_number(gfs, db):
    planted.plant(db, 5, "five", b"12345")
    r = gfs.run("rm", "-n", "five")
    assert r.rc == 0 and r.text == "would delete five (id 5, 5 bytes) (DRY RUN)\n", r


def test_a_long_name_in_a_refusal_is_shortened_with_its_length(gfs, db, tmp_path):
    src = tmp_path / "f"
    src.write_bytes(b"x")
    name = planted.LONG_NAME + "/x"
    r = gfs.run("put", src, "--name", name)
    assert r.rc == 2, r
    assert len(r.err) < 600 and f"...({len(name)} bytes)..." in r.err, r
    assert r.err.rstrip().endswith("--allow-unsafe-name to store it anyway"), r
    planted.plant(db, 1, planted.LONG_NAME, b"x")
    r = gfs.run("get", planted.LONG_NAME, cwd=tmp_path)
    assert r.rc == 2 and len(r.err) < 600 and f"...({len(planted.LONG_NAME)} bytes)..." in r.err, r
