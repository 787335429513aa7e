"""Many files at once (issue 30): get NAME..., --prefix, --regex; put FILE..., --id, --metadata;
rm in batches, -r/--prefix, --max-delete; ls PATTERN and --regex; mv. Checked with pymongo."""
import json
import os

import bson
import pytest
from bson import ObjectId
from bson.int64 import Int64

import jsonvocab
from conftest import sha256


def names(db):
    return sorted(d["filename"] for d in db.fs.files.find())


def store(bucket, *names_, body=b"x"):
    return [bucket.upload_from_stream(n, body + n.encode()) for n in names_]


# ---- ls: shell patterns and --regex --------------------------------------

TREE = ["posters/b1/aa/b9x.jpg", "posters/b1/aa/c9.jpg", "posters/b1/bb/b9y.jpg",
        "posters/b1/bb/deep/b9z.jpg", "posters/b2/aa/b9.jpg", "other/b9.jpg"]


def test_ls_pattern_star_does_not_cross_slash(gfs, bucket):
    store(bucket, *TREE)
    r = gfs.run("ls", "posters/b1/*/b9*")
    assert r.rc == 0, r
    assert r.text.splitlines() == ["posters/b1/aa/b9x.jpg", "posters/b1/bb/b9y.jpg"]
    r = gfs.run("ls", "posters/b?/aa/*")
    assert r.text.splitlines() == ["posters/b1/aa/b9x.jpg", "posters/b1/aa/c9.jpg",
                                   "posters/b2/aa/b9.jpg"], r
    # in a pattern, an escaped wildcard is a literal character
    bucket.upload_from_stream("lit/a*b", b"1")
    bucket.upload_from_stream("lit/axb", b"2")
    assert gfs.run("ls", "lit/a\\*?").text.splitlines() == ["lit/a*b"]
    assert gfs.run("ls", "lit/a[*]b").text.splitlines() == ["lit/a*b"]
    # a plain operand is still a prefix
    assert len(gfs.run("ls", "posters/b1").text.splitlines()) == 4


def test_ls_regex(gfs, bucket):
    store(bucket, *TREE)
    r = gfs.run("ls", "--regex", "^posters/b1/.*/b9[a-z]\\.jpg$", "--json")
    assert r.rc == 0, r
    got = [d["filename"] for d in jsonvocab.parse(r.text, "ls")]
    assert got == ["posters/b1/aa/b9x.jpg", "posters/b1/bb/b9y.jpg", "posters/b1/bb/deep/b9z.jpg"]
    # unanchored: anywhere in the name
    assert gfs.run("ls", "--regex", "b9\\.jpg").text.splitlines() == ["other/b9.jpg",
                                                                       "posters/b2/aa/b9.jpg"]
    r = gfs.run("ls", "--regex", "(")
    assert r.rc == 2 and "--regex" in r.err, r
    assert gfs.run("ls", "--regex", "x", "posters").rc == 2


# ---- get: several names, a folder, a regex ---------------------------------

def test_get_several_names_into_dir(gfs, bucket, tmp_path):
    store(bucket, "a/one.txt", "a/two.txt", "b/three.txt")
    out = tmp_path / "out"
    r = gfs.run("get", "a/one.txt", "b/three.txt", "-o", out)
    assert r.rc == 0, r
    assert (out / "a/one.txt").read_bytes() == b"xa/one.txt"
    assert (out / "b/three.txt").read_bytes() == b"xb/three.txt"
    assert not (out / "a/two.txt").exists()
    # one missing among several: the others are written, exit 1
    r = gfs.run("get", "a/two.txt", "nonesuch", "-o", out)
    assert r.rc == 1 and "nonesuch: no such file" in r.err, r
    assert (out / "a/two.txt").exists()
    # existing outputs are not replaced without --force
    r = gfs.run("get", "a/one.txt", "a/two.txt", "-o", out)
    assert r.rc == 5 and "exists" in r.err, r
    assert gfs.run("get", "a/one.txt", "a/two.txt", "-o", out, "--force").rc == 0
    assert gfs.run("get", "a/one.txt", "a/two.txt", "-o", "-").rc == 2


def test_get_prefix_newest_revisions_never_outside(gfs, bucket, db, tmp_path):
    bucket.upload_from_stream("posters/ab/1.jpg", b"old")
    bucket.upload_from_stream("posters/ab/1.jpg", b"new")
    bucket.upload_from_stream("posters/cd/2.jpg", b"two")
    bucket.upload_from_stream("posters-old/3.jpg", b"not under the folder")
    bucket.upload_from_stream("posters/../escape.jpg", b"evil")
    out = tmp_path / "out"
    r = gfs.run("get", "--prefix", "posters", "-o", out)
    assert r.rc == 1 and "posters/../escape.jpg" in r.err, r  # refused, the others written
    assert (out / "ab/1.jpg").read_bytes() == b"new"
    assert (out / "cd/2.jpg").read_bytes() == b"two"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "ab/1.jpg", "cd/2.jpg"]
    assert not (tmp_path / "escape.jpg").exists()
    # a symlink on the way is refused, never followed
    db.fs.files.delete_many({"filename": "posters/../escape.jpg"})
    out2 = tmp_path / "out2"
    out2.mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", out2 / "ab")
    r = gfs.run("get", "--prefix", "posters/", "-o", out2)
    assert r.rc == 1 and not os.listdir(tmp_path / "elsewhere"), r
    assert (out2 / "cd/2.jpg").read_bytes() == b"two"
    r = gfs.run("get", "--prefix", "nothing", "-o", tmp_path / "o3")
    assert r.rc == 4 and "nothing stored under it" in r.err, r
    assert gfs.run("get", "--prefix", "posters").rc == 2  # needs -o DIR


def test_get_regex(gfs, bucket, tmp_path):
    store(bucket, *TREE)
    out = tmp_path / "out"
    r = gfs.run("get", "--regex", "^posters/b1/.*/b9", "-o", out)
    assert r.rc == 0, r
    got = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert got == ["posters/b1/aa/b9x.jpg", "posters/b1/bb/b9y.jpg", "posters/b1/bb/deep/b9z.jpg"]
    assert (out / "posters/b1/aa/b9x.jpg").read_bytes() == b"xposters/b1/aa/b9x.jpg"
    r = gfs.run("get", "--regex", "^zzz", "-o", out)
    assert r.rc == 4, r


# ---- put: several files, --id, --metadata ----------------------------------

def test_put_several_files_under_a_name_prefix(gfs, bucket, db, tmp_path):
    for n in ("a.jpg", "b.jpg"):
        (tmp_path / n).write_bytes(n.encode())
    r = gfs.run("put", tmp_path / "a.jpg", tmp_path / "b.jpg", "--name-prefix", "posters/x", "--json")
    assert r.rc == 0, r
    assert [d["filename"] for d in jsonvocab.parse(r.text, "put")] == ["posters/x/a.jpg",
                                                                       "posters/x/b.jpg"]
    assert bucket.open_download_stream_by_name("posters/x/b.jpg").read() == b"b.jpg"
    r = gfs.run("put", tmp_path / "a.jpg", tmp_path / "b.jpg")
    assert r.rc == 0 and "a.jpg" in names(db), r
    # one unreadable among several: the rest stored, exit 1
    r = gfs.run("put", tmp_path / "a.jpg", tmp_path / "missing.jpg", "--name-prefix", "y")
    assert r.rc == 1 and "missing.jpg" in r.err and "y/a.jpg" in names(db), r
    # two with one name: refused before anything is stored
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.jpg").write_bytes(b"other")
    r = gfs.run("put", tmp_path / "a.jpg", tmp_path / "sub" / "a.jpg", "--name-prefix", "z")
    assert r.rc == 2 and "z/a.jpg" not in names(db), r
    assert gfs.run("put", tmp_path / "a.jpg", tmp_path / "b.jpg", "--name", "n").rc == 2


@pytest.mark.parametrize("typed,value", [
    ("6b10259227fecc59ffca5581", ObjectId("6b10259227fecc59ffca5581")),
    ("oid:6b10259227fecc59ffca5582", ObjectId("6b10259227fecc59ffca5582")),
    ("str:legacy-17", "legacy-17"),
    ("int:42", 42),
    ("long:9000000000", Int64(9000000000)),
])
def test_put_id_typed_and_the_same_syntax_everywhere(gfs, bucket, db, tmp_path, typed, value):
    src = tmp_path / "f"
    src.write_bytes(b"content")
    r = gfs.run("put", src, "--name", "f", "--id", typed)
    assert r.rc == 0, r
    doc = db.fs.files.find_one({"_id": value})
    assert doc and doc["filename"] == "f" and type(doc["_id"]) is type(value)
    assert bucket.open_download_stream(value).read() == b"content"
    r = gfs.run("stat", "--id", typed, "--json")
    assert r.rc == 0 and json.loads(r.text)["filename"] == "f", r
    r = gfs.run("get", "--id", typed, "-o", "-")
    assert r.rc == 0 and r.out == b"content", r
    # taken: refused, nothing mixed into the stored file
    r = gfs.run("put", src, "--name", "g", "--id", typed)
    assert r.rc == 2 and "already" in r.err and names(db) == ["f"], r
    assert gfs.run("rm", "--id", typed).rc == 0
    assert db.fs.files.count_documents({}) == 0 and db.fs.chunks.count_documents({}) == 0


def test_id_syntax_errors(gfs):
    for bad in ("nothex", "int:x", "int:4294967296", "oid:123", "float:1"):
        r = gfs.run("stat", "--id", bad)
        assert r.rc == 2 and "str:TEXT" in r.err, (bad, r)


def test_put_metadata(gfs, db, tmp_path):
    src = tmp_path / "f"
    src.write_bytes(b"content")
    r = gfs.run("put", src, "--metadata", '{"owner": "ops", "tags": ["a", 1], "n": {"x": 2}}')
    assert r.rc == 0, r
    meta = db.fs.files.find_one({"filename": "f"})["metadata"]
    assert meta["owner"] == "ops" and meta["tags"] == ["a", 1] and meta["n"] == {"x": 2}
    assert meta["sha256"] == sha256(b"content") and meta["size"] == 7
    for key in ("sha256", "mtimeNs", "contentType", "mode"):
        r = gfs.run("put", src, "--name", "g", "--metadata", json.dumps({key: "mine"}))
        assert r.rc == 2 and len(r.err.splitlines()) == 1 and f"'{key}'" in r.err, r
    r = gfs.run("put", src, "--name", "g", "--metadata", "{not json")
    assert r.rc == 2 and len(r.err.splitlines()) == 1, r
    assert names(db) == ["f"]


# ---- rm: batches, folders, --max-delete ------------------------------------

def test_rm_many_names_in_batches(gfs, bucket, db):
    many = [f"n/{i:04d}" for i in range(1200)]
    db.fs.files.insert_many([{"_id": i, "filename": n, "length": 0, "chunkSize": 255 * 1024,
                              "uploadDate": bson.datetime.datetime.now()}
                             for i, n in enumerate(many)])
    bucket.upload_from_stream("n/0005", b"second revision")
    bucket.upload_from_stream("keep", b"k")
    r = gfs.run("rm", *many, "--json")
    assert r.rc == 0, r
    events = jsonvocab.parse(r.text, "rm")
    assert len(events) == 1200 and events[5] == {**events[5], "filename": "n/0005", "deleted": 2}
    assert names(db) == ["keep"]
    assert db.fs.chunks.count_documents({}) == 1


def test_rm_folder_dry_run_and_max_delete(gfs, bucket, db):
    store(bucket, "p/a", "p/b/c", "p-old/d", "q/e")
    bucket.upload_from_stream("p/a", b"rev2")
    before = names(db)
    r = gfs.run("rm", "-r", "p", "--dry-run")
    assert r.rc == 0 and len(r.text.splitlines()) == 3, r
    assert all(l.startswith("would delete p/") for l in r.text.splitlines())
    r = gfs.run("rm", "--prefix", "p", "--max-delete", "2")
    assert r.rc == 7 and names(db) == before, r
    r = gfs.run("rm", "--prefix", "p", "--max-delete", "2", "--dry-run")
    assert r.rc == 7, r
    assert gfs.run("rm", "--prefix", "p", "--max-delete", "5%").rc == 2
    r = gfs.run("rm", "-r", "p/", "--max-delete", "3", "--json")
    assert r.rc == 0, r
    assert [(e["filename"], e["deleted"]) for e in jsonvocab.parse(r.text, "rm")] == [("p/a", 2),
                                                                                    ("p/b/c", 1)]
    assert names(db) == ["p-old/d", "q/e"]
    r = gfs.run("rm", "-r", "p", "--json")
    assert r.rc == 4 and json.loads(r.text)["prefix"] == "p", r
    assert gfs.run("rm", "-r", "-f", "p").rc == 0


# ---- mv ---------------------------------------------------------------------

def test_mv_renames_every_revision(gfs, bucket, db):
    old = [bucket.upload_from_stream("a.jpg", f"v{i}".encode()) for i in range(2)]
    raw = bucket.upload_from_stream("a.jpg", b"v2", metadata={"rawName": b"a.jpg"})
    chunks = sorted(c["_id"] for c in db.fs.chunks.find())
    r = gfs.run("mv", "a.jpg", "b/c.jpg", "--json")
    assert r.rc == 0, r
    ev = jsonvocab.parse(r.text, "mv")[0]
    assert (ev["event"], ev["filename"], ev["from"], ev["moved"], ev["deleted"]) == (
        "move", "b/c.jpg", "a.jpg", 3, 0)
    assert names(db) == ["b/c.jpg"] * 3
    assert sorted(d["_id"] for d in db.fs.files.find()) == sorted(old + [raw])
    assert sorted(c["_id"] for c in db.fs.chunks.find()) == chunks  # no chunk rewritten
    assert "rawName" not in db.fs.files.find_one({"_id": raw})["metadata"]
    assert bucket.open_download_stream_by_name("b/c.jpg").read() == b"v2"
    r = gfs.run("mv", "a.jpg", "x")
    assert r.rc == 4 and "a.jpg: no such file" in r.err, r
    assert gfs.run("mv", "b/c.jpg", "../up").rc == 2
    assert gfs.run("mv", "b/c.jpg", "b/c.jpg").rc == 2


def test_mv_onto_an_existing_name_needs_force(gfs, bucket, db):
    src = bucket.upload_from_stream("new", b"moved")
    dst = [bucket.upload_from_stream("dst", b"old%d" % i) for i in range(2)]
    r = gfs.run("mv", "new", "dst")
    assert r.rc == 2 and "dst: exists (2 revisions)" in r.err, r
    r = gfs.run("mv", "new", "dst", "-f", "--dry-run")
    assert r.rc == 0 and "(DRY RUN)" in r.text and "would remove 2" in r.text, r
    assert names(db) == ["dst", "dst", "new"]
    r = gfs.run("mv", "new", "dst", "--force")
    assert r.rc == 0, r
    assert [d["_id"] for d in db.fs.files.find()] == [src]
    assert db.fs.chunks.count_documents({"files_id": {"$in": dst}}) == 0
    assert bucket.open_download_stream_by_name("dst").read() == b"moved"


def test_mv_order_keeps_a_name_resolving(gfs, bucket, db, backend):
    """Renames by _id, oldest first, and removes what NEW held only after the last rename:
    OLD resolves until its newest moves, NEW from the first rename on."""
    from wireproxy import CommandRecorder
    revs = [bucket.upload_from_stream("old", b"r%d" % i) for i in range(3)]
    held = bucket.upload_from_stream("new", b"held")
    rec = CommandRecorder(backend.port)
    try:
        r = gfs.run("mv", "old", "new", "-f", env={"GRIDFSCTL_URI": rec.uri})
        assert r.rc == 0, r
        cmds = [c for c in rec.taken() if c.db == db.name and c.name in ("update", "delete")]
    finally:
        rec.close()
    steps = []
    for c in cmds:
        for st in c.doc.get("updates" if c.name == "update" else "deletes", []):
            steps.append((c.name, c.target, st["q"]))
    renames = [q["_id"]["$eq"] for name, _, q in steps if name == "update"]
    assert renames == revs, steps  # one update by _id each, oldest first
    first_delete = next(i for i, s in enumerate(steps) if s[0] == "delete")
    assert all(s[0] == "delete" for s in steps[first_delete:]), steps
    assert [s[2] for s in steps if s[1] == "fs.files"] [-1] == {"_id": {"$eq": held}}
    assert bucket.open_download_stream_by_name("new").read() == b"r2"
