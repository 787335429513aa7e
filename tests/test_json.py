"""Every verb's --json lines against the one vocabulary of gridfsctl(1), JSON OUTPUT
(tests/jsonvocab.py): "filename" for stored names, a "summary" object in one shape,
"error" whenever the run failed, ISO 8601 times on events, milliseconds, one dry-run mark."""
import json
import re
import signal

import pytest

import jsonvocab
from test_watch import Watcher

UNREACHABLE = {"GRIDFSCTL_URI": "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200"}


@pytest.fixture
def tree(tmp_path):
    d = tmp_path / "tree"
    (d / "a").mkdir(parents=True)
    (d / "a" / "one.txt").write_bytes(b"one")
    (d / "two.txt").write_bytes(b"two")
    return d


def test_everyday_verbs(gfs, bucket, tmp_path):
    src = tmp_path / "f.txt"
    src.write_bytes(b"hello")
    r = gfs.run("put", src, "--name", "d/f.txt", "--json")
    assert r.rc == 0, r
    [doc] = jsonvocab.parse(r.text, "put")
    assert doc["filename"] == "d/f.txt" and doc["source"] == str(src) and "error" not in doc
    for args in (["ls", "--json"], ["ls", "d/", "--json"], ["stat", "d/f.txt", "--json"]):
        r = gfs.run(*args)
        assert r.rc == 0, r
        [doc] = jsonvocab.parse(r.text, args[0])
        assert doc["filename"] == "d/f.txt" and doc["length"] == 5
    r = gfs.run("rm", "d/f.txt", "nonesuch", "--json")
    assert r.rc == 1, r  # some of several failed
    done, missing = jsonvocab.events(r.text, "rm")
    assert (done["event"], done["filename"], done["deleted"]) == ("delete", "d/f.txt", 1)
    assert missing["filename"] == "nonesuch" and missing["deleted"] == 0 and missing["error"]


def test_import(gfs, bucket, tree):
    r = gfs.run("import", tree, "--json", "-v")
    assert r.rc == 0, r
    evs = jsonvocab.events(r.text, "import")
    assert sorted((e["event"], e["filename"]) for e in evs) == [("upload", "a/one.txt"),
                                                               ("upload", "two.txt")]
    assert all("dryRun" not in e for e in evs)
    s = jsonvocab.summary(r.text, "import")
    assert s["uploaded"] == 2 and "error" not in s and "dryRun" not in s
    (tree / "two.txt").unlink()
    r = gfs.run("import", tree, "--delete", "--dry-run", "--json")
    assert r.rc == 0, r
    [ev] = jsonvocab.events(r.text, "import")
    assert (ev["event"], ev["filename"], ev["dryRun"]) == ("delete", "two.txt", True)
    assert jsonvocab.summary(r.text, "import")["dryRun"] is True
    r = gfs.run("import", tree, "--json", env=UNREACHABLE)
    assert r.rc == 3 and "cannot reach" in jsonvocab.summary(r.text, "import")["error"], r


def test_mirror(gfs, bucket, tmp_path):
    bucket.upload_from_stream("m/a.txt", b"a")
    dst = tmp_path / "out"
    r = gfs.run("mirror", dst, "--prefix", "m", "--dry-run", "--json")
    assert r.rc == 0, r
    [ev] = jsonvocab.events(r.text, "mirror")
    assert (ev["event"], ev["path"], ev["filename"], ev["dryRun"]) == ("write", "a.txt", "m/a.txt", True)
    assert jsonvocab.summary(r.text, "mirror")["dryRun"] is True
    r = gfs.run("mirror", dst, "--prefix", "m", "--json")
    assert r.rc == 0, r
    s = jsonvocab.summary(r.text, "mirror")
    assert s["written"] == 1 and "error" not in s and "dryRun" not in s
    r = gfs.run("mirror", dst, "--json", env=UNREACHABLE)
    assert r.rc == 3 and jsonvocab.summary(r.text, "mirror")["error"], r


def test_verify(gfs, bucket, db, tmp_path):
    (tmp_path / "x").write_bytes(b"x" * 300000)
    assert gfs.run("put", tmp_path / "x", "--name", "v/x").rc == 0
    fid = db.fs.files.find_one({"filename": "v/x"})["_id"]
    r = gfs.run("verify", "--json")
    assert r.rc == 0, r
    s = jsonvocab.summary(r.text, "verify")
    assert s["files"] == 1 and s["problems"] == 0 and "error" not in s
    db["fs.chunks"].delete_one({"files_id": fid, "n": 1})
    r = gfs.run("verify", "--json")
    assert r.rc == 1, r
    [ev] = jsonvocab.events(r.text, "verify")
    assert (ev["event"], ev["kind"], ev["filename"]) == ("problem", "MISSING-CHUNK", "v/x")
    # exit 1 is a failed run: the summary says why
    assert jsonvocab.summary(r.text, "verify")["error"] == "1 problem found"
    r = gfs.run("verify", "--repair", "--dry-run", "--json")
    objs = jsonvocab.parse(r.text, "verify")
    reps = [o for o in objs if o.get("event") == "repair"]
    assert reps and all(o["dryRun"] is True and "repaired" not in o for o in reps), r
    assert objs[-1]["summary"]["dryRun"] is True


def test_watch(gfs, bucket, tmp_path):
    d = tmp_path / "w"
    d.mkdir()
    (d / "first.txt").write_bytes(b"stored by the first pass")
    w = Watcher(gfs, d, "--delete")
    try:
        ready = w.wait_for("ready")
        (d / "n.txt").write_bytes(b"new")
        ev = w.wait_for("upload", "n.txt")
        assert ev["bytes"] == 3 and ready["time"] <= ev["time"]
        (d / "first.txt").unlink()
        w.wait_for("delete", "first.txt")
    finally:
        rc = w.stop(signal.SIGTERM)
    assert rc == 0
    rest = []
    while not w.events.empty():
        e = w.events.get()
        if e is not None:
            rest.append(e)
    assert rest and rest[-1]["summary"]["verb"] == "watch" and "error" not in rest[-1]["summary"]
    # what it did, the first pass included
    assert {k: rest[-1]["summary"][k] for k in ("uploaded", "replaced", "deleted", "moved", "failed")} \
        == {"uploaded": 2, "replaced": 0, "deleted": 1, "moved": 0, "failed": 0}, rest[-1]


def test_one_word_per_action_in_every_verb(gfs, bucket, tmp_path):
    """Deleting a stored file, storing a new one, replacing one: the same event word and
    the same count in import, watch and rm; a local file on disk is "path" in verify as in
    mirror; every summary says whether it was interrupted."""
    d = tmp_path / "w"
    d.mkdir()
    for n in ("a.txt", "b.txt", "c.txt"):
        (d / n).write_bytes(n.encode())
    r = gfs.run("import", d, "--json", "-v")
    imp = {e["filename"]: e["event"] for e in jsonvocab.events(r.text, "import")}
    assert set(imp.values()) == {"upload"}, r
    (d / "a.txt").write_bytes(b"changed")
    (d / "b.txt").unlink()
    r = gfs.run("import", d, "--json", "-v", "--delete")
    imp = {e["filename"]: e["event"] for e in jsonvocab.events(r.text, "import")}
    s = jsonvocab.summary(r.text, "import")
    assert imp == {"a.txt": "replace", "b.txt": "delete"}, r
    assert (s["replaced"], s["deleted"], s["interrupted"]) == (1, 1, False), s
    [rm] = jsonvocab.events(gfs.run("rm", "c.txt", "--json").text, "rm")
    assert (rm["event"], rm["deleted"]) == ("delete", 1), rm
    (d / "c.txt").unlink()
    w = Watcher(gfs, d, "--delete")
    try:
        w.wait_for("ready")
        (d / "n.txt").write_bytes(b"new")
        assert w.wait_for("upload", "n.txt")["event"] == "upload"
        (d / "a.txt").write_bytes(b"changed again")
        w.wait_for("replace", "a.txt")
        (d / "n.txt").unlink()
        w.wait_for("delete", "n.txt")
    finally:
        assert w.stop(signal.SIGTERM) == 0
    rest = []
    while not w.events.empty():
        e = w.events.get()
        if e is not None:
            rest.append(e)
    s = rest[-1]["summary"]
    assert (s["uploaded"], s["replaced"], s["deleted"]) == (1, 1, 1), s
    (d / "only-on-disk.txt").write_bytes(b"x")
    r = gfs.run("verify", "--against", d, "--json")
    [missing] = [e for e in jsonvocab.events(r.text, "verify") if e["kind"] == "MISSING-IN-GRIDFS"]
    assert missing["path"] == "only-on-disk.txt", missing
    bucket.upload_from_stream("m/x.txt", b"x")
    r = gfs.run("mirror", tmp_path / "out", "--prefix", "m", "--json", "-v")
    [wrote] = jsonvocab.events(r.text, "mirror")
    assert (wrote["event"], wrote["path"]) == ("write", "x.txt"), wrote
    assert jsonvocab.summary(r.text, "mirror")["written"] == 1


def test_writer_keeps_durations_short_and_dates_iso(gfs, bucket, tmp_path, tree):
    """No 20-digit floats and no {"$date": ...}, read from the raw bytes."""
    r = gfs.run("import", tree, "--json")
    raw = r.text.strip().splitlines()[-1]
    m = re.search(r'"seconds":(-?[0-9.eE+-]+)', raw)
    assert m and len(m.group(1).split(".")[-1]) <= 3, raw
    assert re.match(r'^\{"time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z","summary":\{"verb":"import"', raw)
    r = gfs.run("stat", "two.txt", "--json")
    assert "$date" not in r.text and json.loads(r.text)["uploadDate"].endswith("Z"), r


def test_writer_keeps_stored_values_exact(gfs, bucket, db):
    """Doubles in stored metadata round-trip in their shortest form; line separators are escaped."""
    import datetime
    name = "sep\u2028line\u0085next"
    fid = bucket.upload_from_stream(name, b"x", metadata={
        "ratio": 0.1, "big": 1e300, "whole": 2.0, "when": datetime.datetime(2026, 1, 2, 3, 4, 5, 6000)})
    r = gfs.run("stat", "--id", str(fid), "--json")
    assert r.rc == 0, r
    assert r.out.count(b"\n") == 1 and b"\\u2028" in r.out and b"\\u0085" in r.out, r
    assert b'"ratio":0.1,' in r.out and b'"big":1e+300' in r.out and b'"whole":2.0' in r.out, r
    doc = json.loads(r.text)
    assert doc["filename"] == name
    assert doc["metadata"]["when"] == "2026-01-02T03:04:05.006Z"
