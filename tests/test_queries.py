"""What every verb asks of the server, read off the wire, against the query
rule of docs/design.md:

  1. fs.chunks is read or deleted only by files_id equality (with n or _id
     equality at most: one file's chunks, or fewer) or by one pass over the
     whole collection in natural order (no filter, no sort, hint $natural);
     never $in, never a range, never a sort;
  2. a known set of files is a set of equality queries, never one $in;
  3. a range on fs.files filename only where the user asked for a prefix,
     once per command.

Each test runs one verb through tests/wireproxy.py's CommandRecorder, which
decodes every OP_MSG (body and document sequences: each statement of a bulk
delete is checked), and fails on any command that breaks the rule. explain
is left out: it asks for a plan and runs nothing (lib/read_strategy.c's probe
explains the very queries the rule forbids, to learn what the server does),
and so is a count without a query (estimatedDocumentCount, which MongoDB
answers from the collection's metadata).

Cases marked xfail name the part of the code that still breaks the rule and
who changes it (issue 26): remove the mark when that lands.
"""
import os
import signal
import subprocess

import bson
import pytest

import planted
from test_serve import Server
from test_watch import Watcher
from wireproxy import CommandRecorder


# Commands that read or write nothing of a collection's documents.
NOT_QUERIES = {"explain", "getMore", "killCursors", "endSessions", "listIndexes", "createIndexes",
               "insert", "ping", "buildInfo", "hello", "isMaster", "ismaster", "saslStart",
               "saslContinue", "listCollections", "create", "drop", "dropIndexes"}
RANGE_OPS = {"$gt", "$gte", "$lt", "$lte", "$regex"}


def operators(value):
    """Every $operator in a filter value, at any depth."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k.startswith("$"):
                yield k
            yield from operators(v)
    elif isinstance(value, list):
        for v in value:
            yield from operators(v)


def equality(value):
    """A value a filter compares by equality: {$eq: x}, or x with no operator in it."""
    if isinstance(value, dict) and set(value) == {"$eq"}:
        return True
    return not any(True for _ in operators(value))


def chunk_filter(f):
    """'eq' for files_id equality (with n and _id equality at most), 'all'
    for no filter, None for anything else."""
    if not f:
        return "all"
    keys = set(f)
    if "files_id" in keys and keys <= {"files_id", "n", "_id"} and all(equality(f[k]) for k in keys):
        return "eq"
    return None


def filters(cmd):
    """(what, filter) of each statement of a command that selects documents."""
    d = cmd.doc
    if cmd.name == "find":
        yield "find", d.get("filter") or {}
    elif cmd.name in ("delete", "update"):
        key = "deletes" if cmd.name == "delete" else "updates"
        for st in d.get(key, []):
            yield cmd.name, st.get("q") or {}
    elif cmd.name in ("count", "distinct"):
        yield cmd.name, d.get("query") or {}
    elif cmd.name == "findAndModify":
        yield cmd.name, d.get("query") or {}
    elif cmd.name == "aggregate":
        stages = d.get("pipeline", [])
        if stages and all("$collStats" in s for s in stages):
            return  # counts from the storage's metadata
        first = stages[0] if stages else {}
        yield "aggregate", first.get("$match", {"(not $match)": 1}) if first else {}


def violations(cmds, db, prefix_ranges=0, only=None):
    """The commands to db that break the rule, as text. prefix_ranges: how
    many filename ranges on fs.files the user asked for (None: not checked,
    for a process that runs one per event). only: check just these commands."""
    out, ranges = [], 0
    for c in cmds:
        coll = c.target if isinstance(c.target, str) else ""
        if c.db != db or c.name in NOT_QUERIES or (only and c.name not in only):
            continue
        if coll.endswith(".chunks"):
            if c.doc.get("sort"):
                out.append(f"sorted: {c}")
            if c.name == "aggregate" and any("$sort" in s for s in c.doc.get("pipeline", [])):
                out.append(f"sorted: {c}")
            for what, f in filters(c):
                kind = chunk_filter(f)
                if kind is None:
                    out.append(f"not by files_id equality: {c}")
                elif kind == "all" and what == "count":
                    pass  # estimatedDocumentCount: MongoDB answers it from metadata
                elif kind == "all" and what != "find":
                    out.append(f"{what} of every chunk: {c}")
                elif kind == "all" and c.doc.get("hint") != {"$natural": 1}:
                    out.append(f"a pass over the chunks not in natural order: {c}")
        elif coll.endswith(".files"):
            for what, f in filters(c):
                ops = set(operators(f))
                if "$in" in ops:
                    out.append(f"$in on the files: {c}")
                if ops & RANGE_OPS and "filename" in f:
                    ranges += 1
    if prefix_ranges is not None and ranges > prefix_ranges:
        out.append(f"{ranges} filename ranges on the files for {prefix_ranges} prefix asked")
    return out


def check(rec, db, prefix_ranges=0, only=None):
    bad = violations(rec.taken(), db.name, prefix_ranges, only)
    assert not bad, "\n".join(bad)


@pytest.fixture
def rec(backend, gfs):
    """A recorder between gridfsctl and the backend; gfs runs through it."""
    r = CommandRecorder(backend.port)
    gfs.env["GRIDFSCTL_URI"] = r.uri
    yield r
    r.close()


@pytest.fixture
def stored(gfs, rec, tmp_path):
    """A small tree imported (p/a/..., p/b/...; one file of several chunks),
    the recorder emptied: what a test records is its own verb's."""
    src = tmp_path / "src"
    for rel, body in {"a/one.jpg": b"1" * 100, "a/two.jpg": b"2" * 100,
                      "b/big.bin": planted.data(10000)}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(body)
    r = gfs.run("import", src, "--prefix", "p", "--chunk-size", "4K", "--no-progress")
    assert r.rc == 0, r
    rec.taken()
    return src


def test_ls(gfs, db, rec, stored):
    r = gfs.run("ls")
    assert r.rc == 0 and len(r.text.split()) == 3, r
    check(rec, db)
    r = gfs.run("ls", "p/a/", "-l")
    assert r.rc == 0 and len(r.text.splitlines()) == 2, r
    cmds = rec.taken()
    # One query, whatever the number of files under the prefix.
    assert [c.name for c in cmds if c.db == db.name and c.target == "fs.files"] == ["find"], cmds
    assert not violations(cmds, db.name, prefix_ranges=1)


def test_stat(gfs, db, rec, stored):
    assert gfs.run("stat", "p/b/big.bin").rc == 0
    check(rec, db)


def test_get(gfs, db, rec, stored, tmp_path):
    r = gfs.run("get", "p/b/big.bin", "-o", tmp_path / "out")
    assert r.rc == 0 and (tmp_path / "out").read_bytes() == planted.data(10000), r
    check(rec, db)


def test_put_trims_old_revisions(gfs, db, rec, stored):
    for body in (b"v1", b"v2", b"v3"):
        r = gfs.run("put", "-", "--name", "p/a/one.jpg", "--keep-revisions", "1", input=body)
        assert r.rc == 0, r
    assert db.fs.files.count_documents({"filename": "p/a/one.jpg"}) == 1
    check(rec, db)


def test_rm(gfs, db, rec, stored, bucket):
    for i in range(2):
        bucket.upload_from_stream("p/b/big.bin", f"rev{i}".encode())
    r = gfs.run("rm", "p/b/big.bin")
    assert r.rc == 0, r
    assert db.fs.files.count_documents({"filename": "p/b/big.bin"}) == 0
    fid = db.fs.files.find_one({"filename": "p/a/two.jpg"})["_id"]
    assert gfs.run("rm", "--id", str(fid)).rc == 0
    assert db.fs.chunks.count_documents({"files_id": fid}) == 0
    check(rec, db)


def test_import_changes_and_delete(gfs, db, rec, stored):
    (stored / "a" / "one.jpg").write_bytes(b"changed")
    (stored / "a" / "two.jpg").unlink()
    (stored / "c").mkdir()
    (stored / "c" / "new.jpg").write_bytes(b"new")
    r = gfs.run("import", stored, "--prefix", "p", "--delete", "--keep-revisions", "1",
                "--no-progress")
    assert r.rc == 0, r
    assert sorted(d["filename"] for d in db.fs.files.find()) == ["p/a/one.jpg", "p/b/big.bin",
                                                                  "p/c/new.jpg"]
    check(rec, db, prefix_ranges=1)


def test_import_recovers_an_interrupted_run(gfs, db, rec, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "x.jpg").write_bytes(b"x")
    fid = planted.plant_dead_upload(db, "x.jpg")
    put_fid = planted.plant_dead_upload(db, "y.jpg", put=True)
    r = gfs.run("import", src, "--no-progress")
    assert r.rc == 0, r
    assert db.fs.chunks.count_documents({"files_id": {"$in": [fid, put_fid]}}) == 0
    check(rec, db)


def test_doctor(gfs, db, rec, stored, bucket):
    db.fs.chunks.insert_one({"files_id": bson.ObjectId(), "n": 0, "data": b"x"})
    r = gfs.run("doctor")
    assert r.rc == 1 and "PROBLEM" in r.text, r
    check(rec, db)


def test_verify(gfs, db, rec, stored):
    assert gfs.run("verify", "--no-progress").rc == 0
    check(rec, db)


def test_verify_prefix(gfs, db, rec, stored):
    assert gfs.run("verify", "--prefix", "p/a", "--no-progress").rc == 0
    check(rec, db, prefix_ranges=1)


@pytest.mark.parametrize("args", [[], ["--strategy", "each"], ["--strategy", "batched"],
                                  ["--hold", "1"]])
def test_verify_damage_every_way(gfs, db, rec, args):
    """Damage planted by updates and late inserts: chunks out of turn are held,
    or past --hold read again by files_id; each reads file by file."""
    planted.plant_damage(db)
    assert gfs.run("verify", "--no-progress", *args).rc == 1
    check(rec, db)


def repair(gfs, db):
    planted.plant_damage(db)
    r = gfs.run("verify", "--repair", "--json", "--no-progress")
    assert r.rc == 1, r  # what cannot be repaired (missing, short, corrupt chunks) stays
    # What the repairs remove is gone: extra and duplicate chunks, orphans, the incomplete upload.
    assert db.fs.files.count_documents({"filename": "dmg/incomplete.bin"}) == 0
    extra = db.fs.files.find_one({"filename": "dmg/extra.bin"})["_id"]
    assert db.fs.chunks.count_documents({"files_id": extra}) == 3
    dup = db.fs.files.find_one({"filename": "dmg/dup.bin"})["_id"]
    assert db.fs.chunks.count_documents({"files_id": dup}) == 3


def test_verify_repair_deletes_by_equality(gfs, db, rec):
    repair(gfs, db)
    check(rec, db, only={"delete", "update", "findAndModify"})


def test_verify_repair(gfs, db, rec):
    repair(gfs, db)
    check(rec, db)


def test_mirror(gfs, db, rec, stored, tmp_path):
    out = tmp_path / "mirror"
    assert gfs.run("mirror", out, "--prefix", "p", "--no-progress").rc == 0
    check(rec, db, prefix_ranges=1)


@pytest.mark.parametrize("read", ["scan", "each", "batched"])
def test_mirror_every_read(gfs, db, rec, stored, tmp_path, read):
    out = tmp_path / "mirror"
    assert gfs.run("mirror", out, "--read", read, "--no-progress").rc == 0
    assert (out / "p" / "b" / "big.bin").read_bytes() == planted.data(10000)
    check(rec, db)


def test_mirror_delete(gfs, db, rec, stored, tmp_path):
    out = tmp_path / "mirror"
    (out / "stale").mkdir(parents=True)
    (out / "stale" / "gone.jpg").write_bytes(b"gone")
    r = gfs.run("mirror", out, "--prefix", "p", "--delete", "--no-progress")
    assert r.rc == 0 and not (out / "stale" / "gone.jpg").exists(), r
    check(rec, db, prefix_ranges=1)


def test_serve(gfs, db, rec, stored, tmp_path):
    s = Server(gfs, tmp_path)
    try:
        status, _, body = s.get("/p/b/big.bin")
        assert status == 200 and body == planted.data(10000)
        status, _, body = s.get("/p/b/big.bin", {"Range": "bytes=5000-5099"})
        assert status == 206 and body == planted.data(10000)[5000:5100]
    finally:
        s.stop()
    check(rec, db, prefix_ranges=None)


def test_watch_one_removal(gfs, db, rec, tmp_path):
    tree = tmp_path / "tree"
    (tree / "ab").mkdir(parents=True)
    (tree / "ab" / "old.jpg").write_bytes(b"old")
    (tree / "ab" / "stays.jpg").write_bytes(b"stays")
    w = Watcher(gfs, tree, "--delete")
    try:
        w.wait_for("ready")
        rec.taken()  # the initial pass is import's
        os.unlink(tree / "ab" / "old.jpg")
        w.wait_for("delete", "ab/old.jpg")
    finally:
        assert w.stop() == 0
    check(rec, db, prefix_ranges=0)


def test_watch_one_move(gfs, db, rec, tmp_path):
    tree = tmp_path / "tree"
    (tree / "ab").mkdir(parents=True)
    (tree / "ab" / "old.jpg").write_bytes(b"old")
    w = Watcher(gfs, tree, "--delete")
    try:
        w.wait_for("ready")
        rec.taken()
        os.rename(tree / "ab" / "old.jpg", tree / "ab" / "new.jpg")
        w.wait_for("move", "ab/new.jpg")
    finally:
        assert w.stop() == 0
    check(rec, db, prefix_ranges=0)


# ---- issue 30: many files at once --------------------------------------------

def files_side(rec, db, prefix_ranges=0):
    """The rule on what a verb asks of fs.files and the markers; its chunk reads are
    test_get's (SCAN)."""
    cmds = [c for c in rec.taken() if not str(c.target).endswith(".chunks") or c.name != "find"]
    bad = violations(cmds, db.name, prefix_ranges)
    assert not bad, "\n".join(bad)
    return cmds


def test_rm_many_names_batched(gfs, db, rec, bucket):
    many = [f"m/{i:03d}" for i in range(60)]
    for n in many:
        bucket.upload_from_stream(n, n.encode())
    rec.taken()
    assert gfs.run("rm", *many).rc == 0
    cmds = rec.taken()
    assert not violations(cmds, db.name)
    mine = [c for c in cmds if c.db == db.name]
    # one equality lookup per name; the removal in one batch, not one round per name
    assert sum(1 for c in mine if c.name == "find" and c.target == "fs.files") == 60
    assert sum(1 for c in mine if c.name == "delete") <= 4, mine
    assert db.fs.files.count_documents({}) == 0 and db.fs.chunks.count_documents({}) == 0


def test_rm_folder(gfs, db, rec, stored):
    assert gfs.run("rm", "-r", "p/a").rc == 0
    check(rec, db, prefix_ranges=1)
    assert gfs.run("rm", "--prefix", "p", "--dry-run").rc == 0
    check(rec, db, prefix_ranges=1)


def test_ls_pattern_and_regex(gfs, db, rec, stored):
    r = gfs.run("ls", "p/*/one.jpg")
    assert r.rc == 0 and r.text == "p/a/one.jpg\n", r
    cmds = rec.taken()
    assert [c.name for c in cmds if c.db == db.name and c.target == "fs.files"] == ["find"], cmds
    assert not violations(cmds, db.name, prefix_ranges=1)
    assert gfs.run("ls", "--regex", "^p/b/.*\\.bin$").text == "p/b/big.bin\n"
    check(rec, db, prefix_ranges=1)
    assert gfs.run("ls", "--regex", "two").text == "p/a/two.jpg\n"
    check(rec, db, prefix_ranges=0)


def test_get_several_prefix_regex(gfs, db, rec, stored, tmp_path):
    assert gfs.run("get", "p/a/one.jpg", "p/a/two.jpg", "-o", tmp_path / "o1").rc == 0
    files_side(rec, db)
    assert gfs.run("get", "--prefix", "p/a", "-o", tmp_path / "o2").rc == 0
    files_side(rec, db, prefix_ranges=1)
    assert gfs.run("get", "--regex", "^p/.*o", "-o", tmp_path / "o3").rc == 0
    files_side(rec, db, prefix_ranges=1)


def test_put_several_with_id_and_mv(gfs, db, rec, stored, tmp_path):
    for n in ("x.jpg", "y.jpg"):
        (tmp_path / n).write_bytes(n.encode())
    assert gfs.run("put", tmp_path / "x.jpg", tmp_path / "y.jpg", "--name-prefix", "p/new").rc == 0
    check(rec, db)
    assert gfs.run("put", tmp_path / "x.jpg", "--name", "p/z.jpg", "--id", "str:z").rc == 0
    check(rec, db)
    assert gfs.run("mv", "p/a/one.jpg", "p/a/two.jpg", "--force").rc == 0
    check(rec, db)


def watch_ten_files(gfs, rec, tmp_path):
    """watch --delete over f/0.txt ... f/9.txt, ready, the recorder emptied: the tree and the Watcher."""
    tree = tmp_path / "tree"
    (tree / "f").mkdir(parents=True)
    for i in range(10):
        (tree / "f" / f"{i}.txt").write_bytes(b"%d" % i)
    w = Watcher(gfs, tree, "--delete")
    try:
        w.wait_for("ready")
    except BaseException:
        w.stop()
        raise
    rec.taken()
    return tree, w


def test_watch_a_queue_of_moves_and_removals(gfs, db, rec, tmp_path):
    """Single files' moves and removals go in batches: equality per name, no range."""
    tree, w = watch_ten_files(gfs, rec, tmp_path)
    try:
        for i in range(10):
            os.rename(tree / "f" / f"{i}.txt", tree / "f" / f"{i}.moved")
        moved = {f"f/{i}.moved" for i in range(10)}
        while moved:
            moved.discard(w.wait_for("move")["filename"])
        for i in range(5):
            (tree / "f" / f"{i}.moved").unlink()
        removed = {f"f/{i}.moved" for i in range(5)}
        while removed:
            removed.discard(w.wait_for("delete")["filename"])
    finally:
        assert w.stop() == 0
    check(rec, db, prefix_ranges=0)
    assert db.fs.files.count_documents({}) == 5


def test_watch_folder_move(gfs, db, rec, tmp_path):
    """A folder's move is one query for the names under both its ends, not one a file."""
    tree, w = watch_ten_files(gfs, rec, tmp_path)
    try:
        os.rename(tree / "f", tree / "g")
        w.wait_for("move-folder", "g")
    finally:
        assert w.stop() == 0
    cmds = rec.taken()
    finds = [c for c in cmds if c.name == "find" and c.target == "fs.files" and c.db == db.name]
    assert len([c for c in finds if set(operators(c.doc.get("filter") or {})) & RANGE_OPS]) == 1, finds
    assert not violations(cmds, db.name, prefix_ranges=1)
