"""gridfsctl verify: faults injected with pymongo into a real backend must be
reported exactly once, with the right exit status, and repaired."""
import datetime
import hashlib
import os
import signal
import subprocess

import bson
import pytest

import jsonvocab
import planted
from conftest import Backend, check_sanitizer_report, free_port

CS = 1000  # small chunks, so that files have several


def put(bucket, name, data, sha=True, **meta):
    md = dict(meta)
    if sha:
        md["sha256"] = hashlib.sha256(data).hexdigest()
    return bucket.upload_from_stream(name, data, chunk_size_bytes=CS, metadata=md)


def old_oid():
    """An ObjectId made two days ago: chunks past verify's --grace."""
    ts = int(datetime.datetime.now().timestamp()) - 2 * 86400
    return bson.ObjectId(ts.to_bytes(4, "big") + os.urandom(8))


def errlines(res):
    return [l for l in res.err.splitlines() if "mongoc:" not in l]


def lines(res):
    return [l for l in res.text.splitlines() if l]


def problems(res):
    """Problem lines (KIND name detail), without the summary line."""
    return [l for l in lines(res) if not l.startswith("verify:")]


def kinds(res):
    return sorted(l.split(" ", 1)[0] for l in problems(res))


def json_lines(res, text=None):
    """Event lines, then the summary's object; every line checked against the vocabulary."""
    objs = jsonvocab.parse(res.text if text is None else text, "verify")
    if objs and "summary" in objs[-1]:
        objs[-1] = objs[-1]["summary"]
    return objs


def data(n, seed=0):
    return bytes((i * 7 + seed) % 251 for i in range(n))


def test_clean_bucket_is_quiet_with_q(gfs, bucket):
    put(bucket, "a.jpg", data(3500))
    put(bucket, "b.jpg", data(999, 1))
    put(bucket, "empty", b"")
    r = gfs.run("verify")
    assert r.rc == 0, r
    assert "no problems" in r.text and "3 files" in r.text
    r = gfs.run("verify", "-q")
    assert r.rc == 0 and r.text == "", r


@pytest.fixture
def faulty(db, bucket):
    """One file per fault; returns {fault: files _id}."""
    ids = {}
    ids["good"] = put(bucket, "good", data(2500))
    ids["missing"] = put(bucket, "missing", data(3500, 1))
    db["fs.chunks"].delete_one({"files_id": ids["missing"], "n": 1})
    ids["short"] = put(bucket, "short", data(3500, 2))
    db["fs.chunks"].update_one({"files_id": ids["short"], "n": 3},
                               {"$set": {"data": bson.Binary(b"x" * 10)}})
    ids["extra"] = put(bucket, "extra", data(2500, 3))
    db["fs.chunks"].insert_one({"files_id": ids["extra"], "n": 3, "data": bson.Binary(b"zz")})
    ids["corrupt"] = put(bucket, "corrupt", data(2500, 4))
    db["fs.chunks"].update_one({"files_id": ids["corrupt"], "n": 1},
                               {"$set": {"data": bson.Binary(b"\0" * CS)}})
    orphan = bson.ObjectId()
    db["fs.chunks"].insert_many([{"_id": old_oid(), "files_id": orphan, "n": i,
                                  "data": bson.Binary(b"o" * 10)} for i in range(2)])
    ids["orphan"] = orphan
    ids["incomplete"] = bson.ObjectId()
    db["fs.files"].insert_one({"_id": ids["incomplete"], "filename": "incomplete", "length": 5000,
                               "chunkSize": CS, "uploadDate": datetime.datetime.now(),
                               "metadata": {"sha256": "0" * 64}})
    ids["nosha"] = put(bucket, "nosha", data(1500, 5), sha=False)
    ids["bad"] = bson.ObjectId()
    db["fs.files"].insert_one({"_id": ids["bad"], "filename": "bad", "length": "huge",
                               "chunkSize": CS, "uploadDate": datetime.datetime.now()})
    db["fs.chunks"].insert_one({"files_id": ids["bad"], "n": 0, "data": bson.Binary(b"b")})
    # legacy md5 only: one right, one wrong
    md5 = bson.ObjectId()
    db["fs.files"].insert_one({"_id": md5, "filename": "md5-good", "length": 5, "chunkSize": CS,
                               "uploadDate": datetime.datetime.now(),
                               "md5": hashlib.md5(b"hello").hexdigest()})
    db["fs.chunks"].insert_one({"files_id": md5, "n": 0, "data": bson.Binary(b"hello")})
    ids["md5bad"] = bson.ObjectId()
    db["fs.files"].insert_one({"_id": ids["md5bad"], "filename": "md5-bad", "length": 5,
                               "chunkSize": CS, "uploadDate": datetime.datetime.now(),
                               "md5": hashlib.md5(b"world").hexdigest()})
    db["fs.chunks"].insert_one({"files_id": ids["md5bad"], "n": 0, "data": bson.Binary(b"hello")})
    return ids


EXPECTED = {
    "MISSING-CHUNK": "missing", "WRONG-SIZE": "short", "EXTRA-CHUNK": "extra",
    "INCOMPLETE": "incomplete", "UNVERIFIABLE": "nosha", "BAD-DOC": "bad",
}


def test_each_fault_reported_once(gfs, faulty):
    r = gfs.run("verify", "--strict")  # a file with no hash is a problem only then
    assert r.rc == 1, r
    assert kinds(r) == sorted(["MISSING-CHUNK", "WRONG-SIZE", "EXTRA-CHUNK", "CHECKSUM", "CHECKSUM",
                               "ORPHAN-CHUNKS", "INCOMPLETE", "UNVERIFIABLE", "BAD-DOC"]), r
    by = {}
    for l in problems(r):
        k, name, _ = l.split(" ", 2)
        by.setdefault(k, []).append((name, l))
    for kind, name in EXPECTED.items():
        assert [n for n, _ in by[kind]] == [name], by[kind]
    assert sorted(n for n, _ in by["CHECKSUM"]) == ["corrupt", "md5-bad"]
    assert by["MISSING-CHUNK"][0][1].startswith("MISSING-CHUNK missing n=1 ")
    assert "n=3 has 10 bytes, expected 500" in by["WRONG-SIZE"][0][1]
    assert by["ORPHAN-CHUNKS"][0][0] == str(faulty["orphan"])
    assert "count=2" in by["ORPHAN-CHUNKS"][0][1]
    assert "md5-good" not in r.text and " good " not in r.text
    assert "10 problems" not in r.text and "9 problems" in r.text


def test_json_shape(gfs, faulty):
    r = gfs.run("verify", "--json", "--strict")
    assert r.rc == 1, r
    objs = json_lines(r)
    summary = objs[-1]
    assert summary["verb"] == "verify"
    assert summary["problems"] == 9 and summary["orphansChecked"] is True
    assert summary["counts"]["CHECKSUM"] == 2 and summary["counts"]["ORPHAN-CHUNKS"] == 1
    probs = objs[:-1]
    assert len(probs) == 9 and all(set(p) >= {"time", "event", "kind", "filename", "id", "detail"} for p in probs)
    miss = next(p for p in probs if p["kind"] == "MISSING-CHUNK")
    assert miss["n"] == 1 and miss["id"] == str(faulty["missing"]) and miss["filename"] == "missing"
    orph = next(p for p in probs if p["kind"] == "ORPHAN-CHUNKS")
    assert orph["filename"] is None and orph["count"] == 2 and orph["bytes"] == 20
    cs = next(p for p in probs if p["kind"] == "CHECKSUM" and p["filename"] == "corrupt")
    assert len(cs["actual"]) == 64


def test_repair(gfs, db, faulty):
    before = (db["fs.files"].count_documents({}), db["fs.chunks"].count_documents({}))
    r = gfs.run("verify", "--repair", "--dry-run")
    assert r.rc == 1, r
    assert (db["fs.files"].count_documents({}), db["fs.chunks"].count_documents({})) == before
    assert "WOULD remove-orphans" in r.text and "WOULD remove-incomplete incomplete" in r.text

    r = gfs.run("verify", "--repair")
    assert r.rc == 1, r  # damaged files without a disk copy stay
    assert db["fs.chunks"].count_documents({"files_id": faulty["orphan"]}) == 0
    assert db["fs.files"].count_documents({"_id": faulty["incomplete"]}) == 0
    assert db["fs.chunks"].count_documents({"files_id": faulty["extra"]}) == 3
    # damaged data is never deleted without a replacement
    assert db["fs.files"].count_documents({"_id": faulty["corrupt"]}) == 1
    assert "NOT-REPAIRED none corrupt" in r.text
    r = gfs.run("verify", "--strict")
    assert kinds(r) == sorted(["MISSING-CHUNK", "WRONG-SIZE", "CHECKSUM", "CHECKSUM",
                               "UNVERIFIABLE", "BAD-DOC"]), r


def test_repair_only_fixable_exits_zero(gfs, db, bucket):
    fid = put(bucket, "a", data(2500))
    db["fs.chunks"].insert_one({"_id": old_oid(), "files_id": bson.ObjectId(), "n": 0,
                                "data": bson.Binary(b"o")})
    db["fs.chunks"].insert_one({"files_id": fid, "n": 7, "data": bson.Binary(b"x")})
    r = gfs.run("verify", "--repair", "--json")
    assert r.rc == 0, r
    objs = json_lines(r)
    reps = [o for o in objs if "repair" in o]
    assert sorted(o["repair"] for o in reps) == ["remove-extra-chunks", "remove-orphans"]
    assert all(o["repaired"] is True for o in reps)
    assert objs[-1]["repaired"] == 2 and objs[-1]["unrepaired"] == 0
    r = gfs.run("verify", "-q")
    assert r.rc == 0 and r.text == "", r


def test_duplicate_chunk(gfs, db, bucket):
    fid = put(bucket, "dup", data(2500))
    db["fs.chunks"].drop_indexes()
    db["fs.chunks"].insert_one({"files_id": fid, "n": 1, "data": bson.Binary(data(2500)[CS:2 * CS])})
    r = gfs.run("verify")
    assert r.rc == 1 and kinds(r) == ["EXTRA-CHUNK"], r
    assert "EXTRA-CHUNK dup n=1" in r.text


def write_tree(root, files):
    for rel, content in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(content)


def test_against(gfs, db, bucket, tmp_path):
    tree = tmp_path / "tree"
    files = {"same.jpg": data(2100), "sub/damaged.jpg": data(2200, 1), "differs.jpg": data(2300, 2),
             "sizediff.jpg": data(100, 3), "onlydisk.jpg": data(1200, 4), "nosha.jpg": data(900, 5),
             ".hidden": b"skip me"}
    write_tree(str(tree), files)
    put(bucket, "p/same.jpg", files["same.jpg"])
    dmg = put(bucket, "p/sub/damaged.jpg", files["sub/damaged.jpg"])
    db["fs.chunks"].update_one({"files_id": dmg, "n": 0}, {"$set": {"data": bson.Binary(b"\1" * CS)}})
    put(bucket, "p/differs.jpg", data(2300, 9))
    put(bucket, "p/sizediff.jpg", data(101, 3))
    put(bucket, "p/onlygridfs.jpg", data(10))
    put(bucket, "p/nosha.jpg", files["nosha.jpg"], sha=False)
    put(bucket, "q/outside.jpg", data(10))  # not under the prefix: not compared

    combined = tmp_path / "combined.txt"
    r = gfs.run("verify", "--prefix", "p", "--against", tree, "--combined", combined, "--strict")
    assert r.rc == 1, r
    assert kinds(r) == sorted(["CHECKSUM", "UNVERIFIABLE", "DIFFERS", "DIFFERS", "MISSING-IN-GRIDFS",
                               "MISSING-ON-DISK"]), r
    assert "DIFFERS p/sizediff.jpg size gridfs=101 disk=100" in r.text
    assert "DIFFERS p/differs.jpg sha256 " in r.text
    rep = sorted(combined.read_text().splitlines())
    assert rep == sorted(["= p/same.jpg", "! p/sub/damaged.jpg", "* p/differs.jpg", "* p/sizediff.jpg",
                          "- p/onlydisk.jpg", "+ p/onlygridfs.jpg", "= p/nosha.jpg"]), rep

    r = gfs.run("verify", "--prefix", "p", "--against", tree, "--combined", "-")
    assert sorted(r.text.splitlines()) == rep and "DIFFERS" in r.err, r

    r = gfs.run("verify", "--prefix", "p", "--against", tree, "--repair")
    assert r.rc == 1, r   # DIFFERS and MISSING-ON-DISK are not verify's to settle
    assert "REPAIRED reupload p/sub/damaged.jpg" in r.text
    assert "REPAIRED remove-damaged p/sub/damaged.jpg" in r.text
    assert "REPAIRED upload p/onlydisk.jpg" in r.text
    assert "REPAIRED set-sha256 p/nosha.jpg" in r.text
    assert db["fs.files"].count_documents({"_id": dmg}) == 0
    assert db["fs.chunks"].count_documents({"files_id": dmg}) == 0
    new = db["fs.files"].find_one({"filename": "p/sub/damaged.jpg"})
    st = os.stat(tree / "sub/damaged.jpg")
    assert new["metadata"]["sha256"] == hashlib.sha256(files["sub/damaged.jpg"]).hexdigest()
    assert new["metadata"]["mtimeNs"] == st.st_mtime_ns and new["metadata"]["size"] == 2200
    assert new["metadata"]["mode"] == st.st_mode & 0o7777
    assert bucket.open_download_stream_by_name("p/onlydisk.jpg").read() == files["onlydisk.jpg"]

    r = gfs.run("verify", "--prefix", "p", "--against", tree, "--json")
    assert r.rc == 1, r
    objs = json_lines(r)
    assert sorted(o["kind"] for o in objs[:-1]) == ["DIFFERS", "DIFFERS", "MISSING-ON-DISK"]
    assert objs[-1]["same"] == 4


def test_prefix_reads_only_its_files(gfs, db, bucket):
    put(bucket, "p/a", data(1500))
    bad = put(bucket, "q/b", data(1500, 1))
    db["fs.chunks"].delete_one({"files_id": bad, "n": 0})
    db["fs.chunks"].insert_one({"files_id": bson.ObjectId(), "n": 0, "data": bson.Binary(b"o")})
    for strategy in ("batched", "scan"):
        r = gfs.run("verify", "--prefix", "p/", "--read", strategy)
        assert r.rc == 0, r
        assert "1 files" in r.text and "orphan chunks not checked" in r.text
    r = gfs.run("verify", "--prefix", "q", "--json")
    objs = json_lines(r)
    assert r.rc == 1 and [o["kind"] for o in objs[:-1]] == ["MISSING-CHUNK"], r
    assert objs[-1]["orphansChecked"] is False


def test_sample(gfs, bucket):
    for i in range(40):
        put(bucket, f"f{i}", data(300, i))
    r = gfs.run("verify", "--sample", "50%", "--json")
    assert r.rc == 0, r
    s = json_lines(r)[-1]
    assert 5 < s["checked"] < 35 and s["files"] == s["checked"]
    r = gfs.run("verify", "--sample", "100%", "--json", "--threads", "3")
    assert json_lines(r)[-1]["checked"] == 40


@pytest.mark.parametrize("args", [["--dry-run"], ["--combined", "x"], ["--sample", "0"],
                                  ["--sample", "150%"], ["--read", "fast"], ["extra-arg"],
                                  ["--against", "d", "--sample", "5%"]])
def test_usage_errors(gfs, args, tmp_path):
    (tmp_path / "d").mkdir(exist_ok=True)
    r = gfs.run("verify", *args)
    assert r.rc == 2, r
    assert len(errlines(r)) <= 2


def test_against_missing_dir(gfs, tmp_path):
    r = gfs.run("verify", "--against", tmp_path / "nope")
    assert r.rc == 5 and "nope" in r.err, r


def test_backend_down(gfs, tmp_path):
    r = gfs.run("verify", "--uri", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300", db=False)
    assert r.rc == 3, r
    assert len(errlines(r)) == 1


def test_help_and_options(gfs):
    r = gfs.run("verify", "--help", db=False)
    assert r.rc == 0 and b"--against" in r.out
    r = gfs.run("_options", "verify", db=False)
    assert {"--prefix=", "--against=", "--repair", "--dry-run", "--json", "--sample=",
            "--combined="} <= set(r.text.split())


def test_against_extra_chunk_is_not_a_difference(gfs, db, bucket, tmp_path):
    tree = tmp_path / "t"
    write_tree(str(tree), {"x.jpg": data(1500)})
    fid = put(bucket, "x.jpg", data(1500))
    db["fs.chunks"].insert_one({"files_id": fid, "n": 2, "data": bson.Binary(b"e")})
    comb = tmp_path / "c.txt"
    r = gfs.run("verify", "--against", tree, "--combined", comb)
    assert r.rc == 1 and kinds(r) == ["EXTRA-CHUNK"], r
    assert comb.read_text() == "= x.jpg\n"
    r = gfs.run("verify", "--against", tree, "--repair")
    assert r.rc == 0 and "REPAIRED remove-extra-chunks x.jpg" in r.text, r
    assert db["fs.files"].count_documents({"_id": fid}) == 1
    assert db["fs.chunks"].count_documents({"files_id": fid}) == 2


def test_against_upload_like_import(gfs, db, bucket, tmp_path):
    tree = tmp_path / "t"
    tree.mkdir()
    jpeg = bytes.fromhex("ffd8ffe000104a46494600010100000100010000") + data(3000) + b"\xff\xd9"
    raw = b"caf\xe9.jpg"
    with open(os.path.join(bytes(tree), raw), "wb") as f:
        f.write(jpeg)
    (tree / ".hidden.jpg").write_bytes(b"not imported by default")
    r = gfs.run("verify", "--prefix", "p", "--against", tree, "--repair")
    assert r.rc == 0, r
    assert "MISSING-IN-GRIDFS p/caf%E9.jpg" in r.text and "hidden" not in r.text
    doc = db["fs.files"].find_one({"filename": "p/caf%E9.jpg"})
    assert doc["metadata"]["rawName"] == raw
    assert doc["contentType"] == "image/jpeg"
    assert doc["metadata"]["sha256"] == hashlib.sha256(jpeg).hexdigest()
    r = gfs.run("verify", "--prefix", "p", "--against", tree, "-q")
    assert r.rc == 0 and r.text == "", r


def test_recent_orphans_are_spared(gfs, db, bucket):
    """Chunks of an upload in progress look orphaned: --repair leaves them for --grace seconds."""
    fresh = bson.ObjectId()
    db["fs.chunks"].insert_one({"files_id": fresh, "n": 0, "data": bson.Binary(b"in flight")})
    r = gfs.run("verify", "--repair")
    assert r.rc == 1 and "NOT-REPAIRED remove-orphans" in r.text and "--grace" in r.text, r
    assert db["fs.chunks"].count_documents({"files_id": fresh}) == 1
    r = gfs.run("verify", "--repair", "--grace", "0")
    assert r.rc == 0 and "REPAIRED remove-orphans" in r.text, r
    assert db["fs.chunks"].count_documents({"files_id": fresh}) == 0


def test_repair_waits_for_no_import(gfs, db, bucket):
    """A repair takes import's lock: while an import holds it, --repair refuses (exit 6)."""
    far = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=5)
    db["fs.gridfsctl_locks"].insert_one({"_id": "import", "host": "elsewhere.example", "pid": 1,
                                         "expires": far})
    put(bucket, "a", data(10))
    r = gfs.run("verify", "--repair")
    assert r.rc == 6, r
    r = gfs.run("verify", "--repair", "--dry-run")
    assert r.rc == 0, r


def test_upper_case_sha256_verifies(gfs, db, bucket):
    """Another tool may store the hex digest in upper case: it is the same hash."""
    content = data(2500)
    fid = bucket.upload_from_stream("upper", content, chunk_size_bytes=CS,
                                    metadata={"sha256": hashlib.sha256(content).hexdigest().upper()})
    r = gfs.run("verify")
    assert r.rc == 0 and "no problems" in r.text, r
    db["fs.chunks"].update_one({"files_id": fid, "n": 0}, {"$set": {"data": bson.Binary(b"\0" * CS)}})
    r = gfs.run("verify")
    assert r.rc == 1 and kinds(r) == ["CHECKSUM"], r


def test_repair_more_extra_chunks_than_ids_kept(gfs, db, bucket):
    """Chunks past the file's count are removed all at once, however many there are."""
    content = data(2500)
    fid = put(bucket, "many", content)
    db["fs.chunks"].insert_many([{"files_id": fid, "n": n, "data": bson.Binary(b"x")}
                                 for n in range(3, 43)])
    r = gfs.run("verify", "--repair", "--json")
    assert r.rc == 0, r
    reps = [o for o in json_lines(r) if "repair" in o]
    assert [(o["repair"], o["repaired"]) for o in reps] == [("remove-extra-chunks", True)], r
    assert "removed 40 " in reps[0]["detail"]
    assert sorted(c["n"] for c in db["fs.chunks"].find({"files_id": fid})) == [0, 1, 2]
    assert bucket.open_download_stream(fid).read() == content


def test_repair_many_duplicates_is_honest(gfs, db, bucket):
    """More duplicate chunks than verify keeps ids of: the repair says it is not done."""
    content = data(2500)
    fid = put(bucket, "dups", content)
    db["fs.chunks"].drop_indexes()
    db["fs.chunks"].insert_many([{"files_id": fid, "n": 1, "data": bson.Binary(content[CS:2 * CS])}
                                 for _ in range(20)])
    r = gfs.run("verify", "--repair")
    assert r.rc == 1 and "NOT-REPAIRED remove-extra-chunks dups" in r.text, r
    assert "run --repair again" in r.text
    assert db["fs.chunks"].count_documents({"files_id": fid}) == 3 + 20 - 16
    r = gfs.run("verify", "--repair")
    assert r.rc == 0 and "REPAIRED remove-extra-chunks dups" in r.text, r
    assert sorted(c["n"] for c in db["fs.chunks"].find({"files_id": fid})) == [0, 1, 2]
    assert bucket.open_download_stream(fid).read() == content


def test_repair_keeps_duplicates_without_hash(gfs, db, bucket):
    """Without a stored hash either copy of a duplicate n may be the good one: both stay,
    and so does a chunk numbered past the content (the length may be what is wrong)."""
    content = data(2500)
    fid = put(bucket, "nohash", content, sha=False)
    db["fs.chunks"].drop_indexes()
    db["fs.chunks"].insert_one({"files_id": fid, "n": 1, "data": bson.Binary(b"\1" * CS)})
    db["fs.chunks"].insert_one({"files_id": fid, "n": 5, "data": bson.Binary(b"x")})
    r = gfs.run("verify", "--repair")
    assert r.rc == 1, r
    assert "NOT-REPAIRED none nohash" in r.text and "1 duplicate" in r.text, r
    assert sorted(c["n"] for c in db["fs.chunks"].find({"files_id": fid})) == [0, 1, 1, 2, 5]
    copies = {bytes(c["data"]) for c in db["fs.chunks"].find({"files_id": fid, "n": 1})}
    assert copies == {content[CS:2 * CS], b"\1" * CS}


def test_reupload_of_file_with_two_problems_exits_zero(gfs, db, bucket, tmp_path):
    """A damaged file with two problems is replaced once; its second problem is not a failure."""
    tree = tmp_path / "t"
    content = data(2500, 6)
    write_tree(str(tree), {"two.jpg": content})
    fid = put(bucket, "two.jpg", content)
    db["fs.chunks"].update_one({"files_id": fid, "n": 0}, {"$set": {"data": bson.Binary(b"\2" * CS)}})
    db["fs.chunks"].insert_one({"files_id": fid, "n": 9, "data": bson.Binary(b"x")})
    r = gfs.run("verify", "--against", tree, "--repair", "--json")
    assert r.rc == 0, r
    objs = json_lines(r)
    assert sorted(o["kind"] for o in objs if o.get("event") == "problem") == ["CHECKSUM", "EXTRA-CHUNK"], r
    reps = [(o["repair"], o["repaired"]) for o in objs if "repair" in o]
    assert sorted(reps) == [("remove-damaged", True)] * 2 + [("reupload", True)], r
    s = objs[-1]
    assert (s["problems"], s["repaired"], s["unrepaired"]) == (2, 2, 0), s  # problems, not steps
    assert db["fs.files"].count_documents({"_id": fid}) == 0
    assert db["fs.chunks"].count_documents({"files_id": fid}) == 0
    assert bucket.open_download_stream_by_name("two.jpg").read() == content


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_unreadable_disk_file_keeps_repair_partial(gfs, bucket, tmp_path):
    """One successful repair must not hide a disk file that could not be compared."""
    tree = tmp_path / "t"
    write_tree(str(tree), {"new.jpg": data(1500), "locked.jpg": data(1600, 1)})
    put(bucket, "locked.jpg", data(1600, 1))
    os.chmod(tree / "locked.jpg", 0)
    try:
        r = gfs.run("verify", "--against", tree, "--repair")
    finally:
        os.chmod(tree / "locked.jpg", 0o644)
    assert r.rc == 1, r
    assert "REPAIRED upload new.jpg" in r.text and "DISK-ERROR locked.jpg" in r.text, r
    assert "NOT-REPAIRED none locked.jpg" in r.text, r
    assert bucket.open_download_stream_by_name("new.jpg").read() == data(1500)


def test_combined_stdout_keeps_json_off_it(gfs, bucket, tmp_path):
    """With --combined - stdout is the report alone; the JSON summary goes with the problems."""
    tree = tmp_path / "t"
    write_tree(str(tree), {"a.jpg": data(1200), "b.jpg": data(1300, 1)})
    put(bucket, "a.jpg", data(1200))
    r = gfs.run("verify", "--against", tree, "--combined", "-", "--json")
    assert r.rc == 1, r
    assert sorted(r.text.splitlines()) == ["- b.jpg", "= a.jpg"], r
    objs = json_lines(r, "\n".join(l for l in errlines(r) if l.startswith("{")))
    assert [o["kind"] for o in objs[:-1]] == ["MISSING-IN-GRIDFS"], r
    assert objs[-1]["verb"] == "verify" and objs[-1]["same"] == 1


def test_against_regular_file(gfs, tmp_path):
    f = tmp_path / "plain"
    f.write_bytes(b"not a directory")
    r = gfs.run("verify", "--against", f)
    assert r.rc == 5, r
    el = errlines(r)
    assert len(el) == 1 and "plain" in el[0] and el[0].endswith("Not a directory"), r


def test_interrupt_does_not_judge_the_file_being_read(gfs, db):
    """SIGINT mid-scan: the file whose chunks were being read is not reported MISSING-CHUNK.

    Every file has an extra chunk, and long names make each EXTRA-CHUNK line
    about 1 KB: the whole report is far larger than a pipe holds. Once the
    first line is read the scan cannot have ended, since verify blocks on the
    full pipe, so the signal always lands while a file is half read.
    """
    cs, per = 10, 8
    files, chunks = [], []
    for i in range(300):
        fid = bson.ObjectId()
        content = data(cs * per, i)
        files.append({"_id": fid, "filename": f"{i:04d}-" + "x" * 1000, "length": len(content),
                      "chunkSize": cs, "uploadDate": datetime.datetime.now(),
                      "metadata": {"sha256": hashlib.sha256(content).hexdigest()}})
        chunks += [{"files_id": fid, "n": n, "data": bson.Binary(content[n * cs:(n + 1) * cs])}
                   for n in range(per)]
        chunks.append({"files_id": fid, "n": per, "data": bson.Binary(b"e")})
    db["fs.files"].insert_many(files)
    db["fs.chunks"].insert_many(chunks)
    # Unbuffered: communicate() reads the descriptor, not what readline() buffered past the line.
    proc = gfs.popen("verify", "--threads", "1", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     bufsize=0)
    first = proc.stdout.readline()
    assert first.startswith(b"EXTRA-CHUNK "), first
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert b"MISSING-CHUNK" not in first + out, out[-2000:]
    assert b"verify: interrupted after " in out and b" files not checked (" in out


def counts(db):
    return db["fs.files"].count_documents({}), db["fs.chunks"].count_documents({})


def test_mixed_numeric_ids_are_one_file(gfs, db, tmp_path):
    """Int64 77 and Int32 77 are one id to the server: verify and --repair agree with get."""
    bodies = planted.plant_mixed_numeric(db)
    before = counts(db)
    r = gfs.run("verify")
    assert r.rc == 0 and "no problems" in r.text and "3 files" in r.text, r
    r = gfs.run("verify", "--read", "batched")
    assert r.rc == 0 and "no problems" in r.text, r
    r = gfs.run("verify", "--repair", "--grace", "0")
    assert r.rc == 0 and "REPAIRED" not in r.text, r
    assert counts(db) == before
    for name, body in bodies.items():
        r = gfs.run("get", name, "-o", "-")
        assert r.rc == 0 and r.out == body, r
    for read in ("each", "scan"):
        dst = tmp_path / read
        r = gfs.run("mirror", dst, "--read", read)
        assert r.rc == 0, r
        assert {n: (dst / n).read_bytes() for n in os.listdir(dst)} == bodies, read


def test_one_integrity_rule_for_verify_get_and_mirror(gfs, db, tmp_path):
    """Upper-case hex is the same digest; a wrong legacy md5 is damage to every reader."""
    planted_ = planted.plant_hash_variants(db)
    r = gfs.run("verify")
    assert r.rc == 1 and kinds(r) == ["CHECKSUM"] and "CHECKSUM wrong-md5.bin md5 " in r.text, r
    for name, (body, intact) in planted_.items():
        r = gfs.run("get", name, "-o", "-")
        if intact:
            assert r.rc == 0 and r.out == body, r
        else:
            # stdout has had the chunks already: the exit status and message tell
            assert r.rc == 1 and "md5" in r.err and name in r.err, r
            r = gfs.run("get", name, "-o", tmp_path / name)
            assert r.rc == 1 and not (tmp_path / name).exists(), r
    for read in ("each", "scan"):
        dst = tmp_path / read
        r = gfs.run("mirror", dst, "--read", read)
        assert r.rc != 0 and "wrong-md5.bin" in r.err, r
        assert sorted(os.listdir(dst)) == ["upper-md5.bin", "upper-sha.bin"], r


def test_backend_down_is_never_no_problems(gfs):
    """A pass that could not run says so: an error in the summary, never "no problems"."""
    env = {"GRIDFSCTL_URI": "mongodb://127.0.0.1:1/x?serverSelectionTimeoutMS=300"}
    r = gfs.run("verify", "--json", env=env, db=False)
    assert r.rc == 3, r
    summary = json_lines(r)[-1]
    assert summary["verb"] == "verify" and summary["error"], r
    assert summary["orphansChecked"] is False, r
    r = gfs.run("verify", env=env, db=False)
    assert r.rc == 3 and "no problems" not in r.text and "FAILED" in r.text, r
    assert len(errlines(r)) == 1, r


def test_lock_held_json_summary_has_error(gfs, db, bucket):
    far = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=5)
    db["fs.gridfsctl_locks"].insert_one({"_id": "import", "host": "elsewhere.example", "pid": 1,
                                         "expires": far})
    r = gfs.run("verify", "--repair", "--json")
    assert r.rc == 6 and "lock" in json_lines(r)[-1]["error"], r


def test_bad_doc_says_how_to_remove_it(gfs, db):
    """No repair touches a malformed files document; the report names the command that does."""
    planted.plant_bad_docs(db, "broken")
    r = gfs.run("verify")
    assert r.rc == 1 and kinds(r) == ["BAD-DOC", "BAD-DOC"], r
    assert all("'gridfsctl rm NAME' removes it" in l for l in problems(r)), r
    r = gfs.run("verify", "--repair")
    assert "NOT-REPAIRED none broken: a malformed files document is left as it is" in r.text, r
    assert db["fs.files"].count_documents({"filename": "broken"}) == 2
    r = gfs.run("rm", "broken")
    assert r.rc == 0, r
    r = gfs.run("verify")
    assert r.rc == 0 and "no problems" in r.text, r


def test_import_in_flight_is_not_orphans(gfs, db, bucket):
    """Chunks an import at work has marked are reported IN-PROGRESS: no problem, never repaired."""
    put(bucket, "a", data(10))
    up, gone = planted.plant_import_in_flight(db)
    r = gfs.run("verify")
    assert r.rc == 0 and "no problems" in r.text and "2 uploads in progress" in r.text, r
    assert sorted(l.split(" ", 2)[:2] for l in problems(r)) == sorted(
        [["IN-PROGRESS", str(up)], ["IN-PROGRESS", str(gone)]]), r
    assert "an import is uploading it" in r.text and "an import is removing it" in r.text, r
    r = gfs.run("verify", "--json")
    assert r.rc == 0, r
    objs = json_lines(r)
    assert sorted((o["event"], o["kind"]) for o in objs[:-1]) == [("note", "IN-PROGRESS")] * 2, r
    assert objs[-1]["problems"] == 0 and objs[-1]["inProgress"] == 2, r
    assert all(o["count"] == 2 and o["bytes"] == 20 for o in objs[:-1]), r


def test_interrupted_import_leftovers_are_orphans(gfs, db, bucket):
    """Markers whose import is gone (its lock expired) name leftovers: orphans, which --repair removes."""
    up, gone = planted.plant_import_in_flight(db, live=False)
    r = gfs.run("verify")
    assert r.rc == 1 and kinds(r) == ["ORPHAN-CHUNKS", "ORPHAN-CHUNKS"], r
    assert r.text.count("left by an interrupted import") == 2, r
    r = gfs.run("verify", "--repair", "--grace", "0")
    # The removal is finished before the pass (its marker goes too); the upload's chunks are orphans.
    assert "finished removing 1 file an interrupted command had begun to remove" in r.err, r
    assert r.rc == 0 and r.text.count("REPAIRED remove-orphans") == 1, r
    assert db["fs.chunks"].count_documents({}) == 0
    assert db["fs.gridfsctl_uploads"].count_documents({"deleting": gone}) == 0


@pytest.mark.parametrize("strategy", ["scan", "each"])
def test_backend_lost_mid_run_is_a_failure(gfs, tmp_path, strategy):
    """The backend dies while verify is blocked on a full pipe mid-pass: exit 3, an error, no verdict."""
    b = Backend(str(tmp_path / "own-backend"), free_port(), "sqlite")
    os.makedirs(b.datadir)
    b.start()
    try:
        client = b.client()
        planted.plant_long_report(client["lost"])
        client.close()
        env = {"GRIDFSCTL_URI": b.uri + "?serverSelectionTimeoutMS=1000"}
        proc = gfs.popen("verify", "--json", "--threads", "1", "--db", "lost", "--read", strategy,
                         db=False, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        first = proc.stdout.readline()  # unbuffered: see the interrupt test above
        assert b'"EXTRA-CHUNK"' in first, first
    finally:
        b.stop()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    check_sanitizer_report(err.decode("utf-8", "replace"))
    summary = jsonvocab.summary(out.decode(), "verify")
    assert summary["verb"] == "verify" and summary["error"], summary
    assert summary["orphansChecked"] is False and summary["checked"] < 300, summary


def test_config_warning_is_printed_once(gfs, backend, tmp_path):
    """main() reads the settings for every verb; verify used to read them a second time."""
    conf = tmp_path / "gridfsctl.conf"
    conf.write_text(f"[connection]\nuri = mongodb://user:secret@127.0.0.1:{backend.port}/\n")
    conf.chmod(0o644)
    r = gfs.run("verify", "--prefix", "none/", env={"GRIDFSCTL_CONFIG": str(conf), "GRIDFSCTL_URI": ""})
    warnings = [l for l in r.err.splitlines() if "others can read it" in l]
    assert len(warnings) == 1, r
    assert "secret" not in r.err + r.text, r


def test_put_in_flight_is_not_orphans(gfs, db, bucket):
    """A put's marker names a lock of its own: while it is held the chunks are in progress,
    whether or not an import holds the import lock."""
    put(bucket, "a", data(10))
    fid = planted.plant_put_in_flight(db)
    r = gfs.run("verify")
    assert r.rc == 0 and "no problems" in r.text, r
    assert [l.split(" ", 2)[:2] for l in problems(r)] == [["IN-PROGRESS", str(fid)]], r
    assert "a put is uploading it" in r.text, r


def test_interrupted_put_leftovers_are_orphans(gfs, db):
    fid = planted.plant_put_in_flight(db, live=False)
    r = gfs.run("verify")
    assert r.rc == 1 and kinds(r) == ["ORPHAN-CHUNKS"] and str(fid) in r.text, r
    assert "left by an interrupted put" in r.text, r


STRATEGIES = ["scan", "batched", "each", "auto"]


def findings(res):
    """The problems a JSON run reported, in an order of their own, and its summary."""
    objs = json_lines(res)
    probs = sorted((o["kind"], o["filename"] or "", o["id"] or "", o.get("n", -1),
                    o.get("count", -1), o["detail"]) for o in objs[:-1])
    return probs, objs[-1]


@pytest.fixture
def damaged(db):
    """Planted damage in two folders, mixed numeric ids and malformed documents."""
    ids = planted.plant_damage(db, "dmg")
    planted.plant_damage(db, "other")
    planted.plant_mixed_numeric(db)
    planted.plant_bad_docs(db, "dmg/bad.bin")
    return ids


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_finds_the_same_damage(gfs, damaged, strategy):
    """Whichever way the chunks are read, the same problems are found, orphans included."""
    base, base_sum = findings(gfs.run("verify", "--json", "--read", "scan"))
    r = gfs.run("verify", "--json", "--read", strategy, "--jobs", "3")
    assert r.rc == 1, r
    probs, summary = findings(r)
    assert probs == base, r
    assert summary["orphansChecked"] is True and summary["checked"] == base_sum["checked"]
    assert summary["read"] == ("scan" if strategy == "auto" else strategy)
    kinds_found = {p[0] for p in probs}
    assert {"MISSING-CHUNK", "WRONG-SIZE", "EXTRA-CHUNK", "CHECKSUM", "INCOMPLETE", "ORPHAN-CHUNKS",
            "BAD-DOC"} <= kinds_found, probs
    orphans = [p for p in probs if p[0] == "ORPHAN-CHUNKS"]
    # two planted groups and two chunks without files_id, one of each per plant_damage()
    assert len(orphans) == 4 and any(p[2] == str(damaged["orphan"]) for p in orphans), orphans


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_reads_the_same_prefix(gfs, damaged, strategy):
    """Under a prefix only its files are judged, the same way by every strategy."""
    base, _ = findings(gfs.run("verify", "--json", "--prefix", "dmg", "--read", "scan"))
    r = gfs.run("verify", "--json", "--prefix", "dmg", "--read", strategy)
    assert r.rc == 1, r
    probs, summary = findings(r)
    assert probs == base, r
    assert all(p[1].startswith("dmg/") for p in probs), probs
    assert summary["orphansChecked"] is False
    if strategy != "scan":
        # only the selected files' chunks were read (scan reads them all)
        assert summary["chunks"] < 40, summary
    if strategy == "auto":
        assert summary["read"] in ("batched", "each"), summary


def test_sample_reads_only_the_sampled_files(gfs, db, bucket):
    for i in range(100):
        put(bucket, f"s/{i:03d}", data(2500, i))     # 3 chunks each
    r = gfs.run("verify", "--sample", "10%", "--json")
    assert r.rc == 0, r
    s = json_lines(r)[-1]
    assert 0 < s["checked"] < 40 and s["files"] == s["checked"], s
    assert s["chunks"] == 3 * s["checked"] and s["read"] != "scan", s



def test_chunks_a_live_writer_is_removing_are_in_progress(gfs, db):
    """A put, rm or watch trim removes the files document, then the chunks: between
    the two its deletion marker (no lock, its owner named, not known gone) says so."""
    fid = bson.ObjectId()
    db["fs.gridfsctl_uploads"].insert_one({
        "_id": bson.ObjectId(), "deleting": [fid], "owner": "elsewhere.example/boot/4545/1",
        "host": "elsewhere.example", "bootId": "boot", "pid": 4545, "startTime": 1,
        "started": datetime.datetime.now(datetime.timezone.utc)})
    db["fs.chunks"].insert_one({"files_id": fid, "n": 0, "data": bson.Binary(b"old" * 10)})
    r = gfs.run("verify")
    assert r.rc == 0 and kinds(r) == ["IN-PROGRESS"] and "live writer is removing it" in r.text, r


# ---- files other drivers wrote: unsealed, and verify --seal ------------------------------

def driver_files(bucket, db):
    """Files as pymongo 4's gridfs writes them (no md5, no sha256): two whole ones (one
    with the driver's own metadata), an empty one, and one missing a chunk."""
    bodies = {"a.txt": b"hello world\n" * 300, "b.bin": data(5000, 7), "empty": b"",
              "broken": data(3000, 8)}
    ids = {}
    for name, body in bodies.items():
        meta = {"owner": "app", "tags": ["x"]} if name == "a.txt" else None
        ids[name] = bucket.upload_from_stream(name, body, chunk_size_bytes=CS, metadata=meta)
    db.fs.chunks.delete_one({"files_id": ids["broken"], "n": 1})
    for d in db.fs.files.find():
        assert "md5" not in d and "sha256" not in (d.get("metadata") or {}), d
    return bodies, ids


def test_files_without_a_hash_are_counted_unsealed_not_problems(gfs, db, bucket):
    """Issue 27, 8-13 (12): what pymongo 4 (and the Node and Go drivers) write stores no
    hash; verify counts such files as unsealed and exits 0, unless --strict."""
    driver_files(bucket, db)
    db.fs.chunks.insert_one({"files_id": db.fs.files.find_one({"filename": "broken"})["_id"],
                             "n": 1, "data": bson.Binary(data(3000, 8)[CS:2 * CS])})
    r = gfs.run("verify", "--json")
    assert r.rc == 0, r
    s = jsonvocab.summary(r.text, "verify")
    assert s["unsealed"] == 3 and s["problems"] == 0 and "UNVERIFIABLE" not in s["counts"], s
    assert jsonvocab.events(r.text, "verify") == []
    h = gfs.run("verify")
    assert h.rc == 0 and "no problems (3 unsealed: no hash stored; 'verify --seal' stores one)" in h.text, h
    r = gfs.run("verify", "--strict", "--json")
    assert r.rc == 1, r
    s = jsonvocab.summary(r.text, "verify")
    assert s["problems"] == 3 and s["counts"] == {"UNVERIFIABLE": 3} and s["unsealed"] == 3, s


def test_seal_stores_sha256_and_sealed_at_only(gfs, db, bucket):
    bodies, ids = driver_files(bucket, db)
    before = {d["_id"]: d for d in db.fs.files.find()}
    r = gfs.run("verify", "--seal", "--dry-run", "--json")
    assert r.rc == 1, r  # the missing chunk
    assert sorted((e["filename"], e["dryRun"]) for e in jsonvocab.events(r.text, "verify")
                  if e["event"] == "seal") == [("a.txt", True), ("b.bin", True)]
    assert {d["_id"]: d for d in db.fs.files.find()} == before
    r = gfs.run("verify", "--seal", "--json")
    assert r.rc == 1, r
    seals = [e for e in jsonvocab.events(r.text, "verify") if e["event"] == "seal"]
    assert sorted((e["filename"], e["sealed"], e["sha256"]) for e in seals) == [
        (n, True, hashlib.sha256(bodies[n]).hexdigest()) for n in ("a.txt", "b.bin")]
    s = jsonvocab.summary(r.text, "verify")
    assert s["sealed"] == 2 and s["unsealed"] == 0 and s["problems"] == 1, s  # broken: MISSING-CHUNK
    for name in ("a.txt", "b.bin"):
        now, was = db.fs.files.find_one({"_id": ids[name]}), before[ids[name]]
        meta = dict(now["metadata"])
        assert meta.pop("sha256") == hashlib.sha256(bodies[name]).hexdigest()
        assert isinstance(meta.pop("sealedAt"), datetime.datetime)
        assert meta == (was.get("metadata") or {}), now
        assert {k: v for k, v in now.items() if k != "metadata"} == \
               {k: v for k, v in was.items() if k != "metadata"}
    for name in ("empty", "broken"):
        assert db.fs.files.find_one({"_id": ids[name]}) == before[ids[name]]
    # From now on they are proven: damage is found, and --strict has nothing to say of them.
    db.fs.files.delete_one({"_id": ids["broken"]})
    db.fs.chunks.delete_many({"files_id": ids["broken"]})
    assert gfs.run("verify", "--strict").rc == 0
    db.fs.chunks.update_one({"files_id": ids["b.bin"], "n": 2},
                            {"$set": {"data": bson.Binary(b"\0" * CS)}})
    r = gfs.run("verify")
    assert r.rc == 1 and kinds(r) == ["CHECKSUM"] and "CHECKSUM b.bin" in r.text, r
    assert gfs.run("get", "b.bin", "-o", "-").rc == 1


def test_seal_leaves_a_file_changed_since_the_pass(gfs, db, bucket, backend):
    """The seal is a compare-and-swap on the document the pass read: a file whose
    document changed in between is left unsealed (NOT-SEALED), whatever changed."""
    from wireproxy import Rule, WireProxy
    fid = bucket.upload_from_stream("f", data(2500, 3), chunk_size_bytes=CS)
    proxy = WireProxy(backend.port)
    try:
        rule = proxy.add(Rule("update", "fs.files", "pause"))
        proc = gfs.popen("verify", "--seal", env={"GRIDFSCTL_URI": proxy.uri},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert rule.fired.wait(60), "verify never sealed"
        when = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
        db.fs.files.update_one({"_id": fid}, {"$set": {"uploadDate": when}})
        rule.release()
        out, err = proc.communicate(timeout=60)
    finally:
        proxy.close()
    text = out.decode()
    check_sanitizer_report(err.decode(), proc.returncode)
    assert proc.returncode == 0, (text, err)
    assert "NOT-SEALED f: its files document changed since it was read" in text, text
    assert "1 unsealed" in text, text
    assert "sha256" not in (db.fs.files.find_one({"_id": fid}).get("metadata") or {})
