"""gridfsctl import against the real backend, checked through pymongo/gridfs."""
import datetime
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

import jsonvocab
import planted
from conftest import (LOCK_DOCS, check_sanitizer_report, check_sanitizers, free_port, proc_state,
                      Result, sha256, wait_for)
from wireproxy import FreezingProxy, Rule, WireProxy

CHUNK = 255 * 1024


def write(path, data, mtime_ns=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


def summary(res):
    """The last line of stdout: the JSON summary, every line checked against the vocabulary."""
    return jsonvocab.summary(res.text, "import")


def stored(db):
    """name -> newest files document."""
    out = {}
    for d in db.fs.files.find().sort([("uploadDate", 1), ("_id", 1)]):
        out[d["filename"]] = d
    return out


def orphan_chunks(db):
    ids = set(d["_id"] for d in db.fs.files.find({}, {"_id": 1}))
    return [c["files_id"] for c in db.fs.chunks.find({}, {"files_id": 1}) if c["files_id"] not in ids]


def assert_matches_tree(db, bucket, root, prefix=""):
    """Every regular file under root is stored once, complete, with its sha256.

    One pass over the chunks collection (a per-file GridFS read costs a scan
    on the embedded backend); one file is also read through GridFSBucket."""
    names = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for fn in filenames:
            p = os.path.join(dirpath, fn)
            names[prefix + os.path.relpath(p, root)] = p
    docs = stored(db)
    assert set(docs) == set(names)
    assert db.fs.files.count_documents({}) == len(names), "duplicate revisions"
    chunks = {}
    for c in db.fs.chunks.find({}, batch_size=40):
        assert (c["files_id"], c["n"]) not in chunks, "duplicate chunk"
        chunks[(c["files_id"], c["n"])] = c["data"]
    used = 0
    for name, p in names.items():
        data = open(p, "rb").read()
        d = docs[name]
        count = (d["length"] + d["chunkSize"] - 1) // d["chunkSize"]
        got = b"".join(chunks[(d["_id"], n)] for n in range(count))
        used += count
        assert got == data, name
        assert d["metadata"]["sha256"] == sha256(data)
    assert used == len(chunks), "orphan or extra chunks"
    name = max(names, key=lambda n: os.path.getsize(names[n]))
    assert bucket.open_download_stream_by_name(name).read() == open(names[name], "rb").read()
    assert db["fs.gridfsctl_uploads"].count_documents({}) == 0


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    root.mkdir()
    return root


def test_basic_tree_metadata(gfs, db, bucket, tree):
    big = os.urandom(3 * CHUNK + 1234)
    write(tree / "a" / "b" / "c" / "deep.txt", b"deep text\n", mtime_ns=1_600_000_000_123_456_789)
    write(tree / "a" / "big.bin", big)
    write(tree / "empty", b"")
    write(tree / "Amélie" / "affiche ü.jpg", bytes.fromhex("ffd8ffe000104a464946000101") + os.urandom(2000))
    write(tree / ".hidden" / "x", b"hidden dir")
    write(tree / ".dotfile", b"hidden file")
    write(tree / "download.part", b"temp")
    write(tree / "notes~", b"temp")
    write(tree / ".#lock", b"temp")
    os.makedirs(tree / "a" / "nothing-here")  # an empty directory: qsort(NULL, 0) in the walk
    os.chmod(tree / "a" / "big.bin", 0o640)

    res = gfs.run("import", tree, "--prefix", "posters", "--json")
    assert res.rc == 0, res
    s = summary(res)
    assert (s["scanned"], s["uploaded"], s["skipped"], s["failed"]) == (4, 4, 0, 0)
    assert s["bytes"] == len(big) + 10 + 2013 + 0
    assert "seconds" in s and s["replaced"] == 0 and s["deleted"] == 0

    docs = stored(db)
    assert set(docs) == {"posters/a/b/c/deep.txt", "posters/a/big.bin", "posters/empty",
                         "posters/Amélie/affiche ü.jpg"}
    assert bucket.open_download_stream_by_name("posters/a/big.bin").read() == big
    assert db.fs.chunks.count_documents({"files_id": docs["posters/a/big.bin"]["_id"]}) == 4
    assert bucket.open_download_stream_by_name("posters/empty").read() == b""
    assert db.fs.chunks.count_documents({"files_id": docs["posters/empty"]["_id"]}) == 0

    deep = docs["posters/a/b/c/deep.txt"]
    m = deep["metadata"]
    assert m["mtimeNs"] == 1_600_000_000_123_456_789
    assert int(m["mtime"].timestamp() * 1000) == 1_600_000_000_123
    assert m["size"] == 10 and m["sha256"] == sha256(b"deep text\n")
    assert m["mode"] == os.stat(tree / "a" / "b" / "c" / "deep.txt").st_mode & 0o7777
    assert deep["contentType"] == m["contentType"] == "text/plain"
    assert deep["chunkSize"] == CHUNK and deep["length"] == 10
    assert docs["posters/a/big.bin"]["metadata"]["mode"] == 0o640
    assert docs["posters/Amélie/affiche ü.jpg"]["contentType"] == "image/jpeg"
    assert "rawName" not in m


def test_hidden_and_temp_kept_on_request(gfs, db, tree):
    write(tree / ".hidden" / "x", b"1")
    write(tree / "f.part", b"2")
    write(tree / "plain", b"3")
    res = gfs.run("import", tree, "--hidden", "--keep-temp", "--type", "application/x-test", "--json")
    assert res.rc == 0, res
    docs = stored(db)
    assert set(docs) == {".hidden/x", "f.part", "plain"}
    assert all(d["contentType"] == d["metadata"]["contentType"] == "application/x-test"
               for d in docs.values())


def test_non_utf8_name_and_collision(gfs, db, bucket, tree):
    raw = os.fsencode(str(tree)) + b"/caf\xe9.txt"
    with open(raw, "wb") as f:
        f.write(b"latin-1 name")
    res = gfs.run("import", tree, "--json")
    assert res.rc == 0, res
    d = db.fs.files.find_one({"filename": "caf%E9.txt"})
    assert d is not None and d["metadata"]["rawName"] == b"caf\xe9.txt"
    assert bucket.open_download_stream_by_name("caf%E9.txt").read() == b"latin-1 name"

    # A UTF-8 name spelling the escaped form collides with it: reported, not stored over it.
    write(tree / "caf%E9.txt", b"other")
    res = gfs.run("import", tree, "--json")
    assert res.rc == 1, res
    assert "caf%E9.txt" in res.err and "collision" in res.err
    assert summary(res)["failed"] == 1
    assert db.fs.files.count_documents({"filename": "caf%E9.txt"}) == 1


def test_rerun_skips_everything(gfs, db, tree):
    for i in range(30):
        write(tree / f"d{i % 3}" / f"f{i}.bin", os.urandom(100 + i))
    assert gfs.run("import", tree).rc == 0
    before = sorted((d["_id"], d["uploadDate"]) for d in db.fs.files.find())
    res = gfs.run("import", tree, "--json")
    assert res.rc == 0, res
    s = summary(res)
    assert (s["scanned"], s["skipped"], s["uploaded"], s["replaced"], s["bytes"]) == (30, 30, 0, 0, 0)
    assert sorted((d["_id"], d["uploadDate"]) for d in db.fs.files.find()) == before
    # --checksum compares content: still nothing to do.
    s = summary(gfs.run("import", tree, "--checksum", "--json"))
    assert s["skipped"] == 30 and s["uploaded"] == 0


def test_modified_file_becomes_new_revision(gfs, db, bucket, tree):
    write(tree / "p.txt", b"version one", mtime_ns=1_500_000_000_000_000_000)
    write(tree / "q.txt", b"unchanged")
    assert gfs.run("import", tree).rc == 0
    old = db.fs.files.find_one({"filename": "p.txt"})

    write(tree / "p.txt", b"version two, longer", mtime_ns=1_500_000_001_000_000_000)
    res = gfs.run("import", tree, "--json", "-v")
    assert res.rc == 0, res
    s = summary(res)
    assert (s["replaced"], s["skipped"], s["uploaded"]) == (1, 1, 0)
    ev = json.loads(res.text.splitlines()[0])
    assert (ev["event"], ev["filename"], "dryRun" in ev) == ("replace", "p.txt", False)
    assert bucket.open_download_stream_by_name("p.txt").read() == b"version two, longer"
    # The old revision and its chunks are gone once the new one is complete.
    assert db.fs.files.count_documents({"filename": "p.txt"}) == 1
    assert db.fs.chunks.count_documents({"files_id": old["_id"]}) == 0

    # --keep-revisions 2 keeps history.
    write(tree / "p.txt", b"version three", mtime_ns=1_500_000_002_000_000_000)
    assert gfs.run("import", tree, "--keep-revisions", "2").rc == 0
    assert db.fs.files.count_documents({"filename": "p.txt"}) == 2
    assert bucket.open_download_stream_by_name("p.txt", revision=-2).read() == b"version two, longer"
    assert bucket.open_download_stream_by_name("p.txt").read() == b"version three"


def test_checksum_ignores_touch(gfs, db, tree):
    write(tree / "f", b"same content", mtime_ns=1_400_000_000_000_000_000)
    assert gfs.run("import", tree).rc == 0
    os.utime(tree / "f", ns=(1_400_000_005_000_000_000,) * 2)
    res = gfs.run("import", tree, "--checksum", "--dry-run")
    assert res.rc == 0 and res.text == "", res
    res = gfs.run("import", tree, "--dry-run")
    assert res.rc == 0 and res.text == "would replace f (DRY RUN)\n", res
    s = summary(gfs.run("import", tree, "--checksum", "--json"))
    assert (s["skipped"], s["replaced"]) == (1, 0)
    s = summary(gfs.run("import", tree, "--json"))
    assert (s["skipped"], s["replaced"]) == (0, 1)
    assert db.fs.files.find_one({"filename": "f"})["metadata"]["mtimeNs"] == 1_400_000_005_000_000_000


def test_mtime_before_1970_rounds_alike_in_import_put_and_verify(gfs, db, tree, tmp_path):
    """metadata.mtime is the ms floor of the mtime, before 1970 too, whichever verb stored it."""
    ns = -1_500_000_500  # 1969-12-31T23:59:58.4999995
    write(tree / "f", b"old", mtime_ns=ns)
    assert gfs.run("import", tree, "--prefix", "i").rc == 0
    assert gfs.run("put", tree / "f", "--name", "p").rc == 0
    disk = tmp_path / "disk"
    disk.mkdir()
    write(disk / "f", b"old", mtime_ns=ns)
    r = gfs.run("verify", "--prefix", "v", "--against", disk, "--repair")  # uploads v/f, only on disk
    assert r.rc == 0, r
    want = datetime.datetime(1969, 12, 31, 23, 59, 58, 499000)
    for name in ("i/f", "p", "v/f"):
        meta = db.fs.files.find_one({"filename": name})["metadata"]
        assert (meta["mtime"], meta["mtimeNs"]) == (want, ns), (name, meta)


def test_racily_clean_file_is_checked_again(gfs, db, bucket, tree):
    """A file modified as it is read (or just before) is not trusted by size
    and mtime: the next run compares its content, then trusts it again."""
    # An mtime 2 s ahead is "within 2 s of the read" for any first run that starts reading soon.
    when = time.time_ns() + 2_000_000_000
    write(tree / "racy.txt", b"version 1", mtime_ns=when)
    write(tree / "same.txt", b"unchanged", mtime_ns=when)
    write(tree / "old.txt", b"old", mtime_ns=1_500_000_000_000_000_000)
    assert gfs.run("import", tree).rc == 0
    docs = stored(db)
    assert docs["racy.txt"]["metadata"]["mtimeRacy"] is True
    assert docs["same.txt"]["metadata"]["mtimeRacy"] is True
    assert "mtimeRacy" not in docs["old.txt"]["metadata"]

    # Rewritten within the same tick: same size, same mtime, other content.
    write(tree / "racy.txt", b"version 2", mtime_ns=when)
    # The next run must start reading 2 s after the mtime, so that it may settle the state.
    wait_for(lambda: time.time_ns() > when + 2_500_000_000, deadline_s=30, what="the mtime to age")
    s = summary(gfs.run("import", tree, "--json"))
    assert (s["replaced"], s["skipped"], s["uploaded"]) == (1, 2, 0), s
    assert bucket.open_download_stream_by_name("racy.txt").read() == b"version 2"
    after = stored(db)
    assert "mtimeRacy" not in after["racy.txt"]["metadata"]
    # The same content is not stored again, and its state is now trusted.
    assert after["same.txt"]["_id"] == docs["same.txt"]["_id"]
    assert after["same.txt"]["uploadDate"] == docs["same.txt"]["uploadDate"]
    assert "mtimeRacy" not in after["same.txt"]["metadata"]
    assert after["same.txt"]["metadata"]["mtimeNs"] == when

    s = summary(gfs.run("import", tree, "--json"))
    assert (s["replaced"], s["skipped"], s["uploaded"]) == (0, 3, 0), s
    assert stored(db) == after


def test_special_file_and_symlink_loop(gfs, db, bucket, tree):
    write(tree / "ok" / "good.txt", b"good")
    write(tree / "target.txt", b"target")
    os.mkfifo(tree / "ok" / "pipe")
    os.symlink("..", tree / "ok" / "loop")
    os.symlink("target.txt", tree / "link.txt")
    os.symlink("self", tree / "self")

    # Not followed by default: symlinks are ignored, the FIFO is one error.
    res = gfs.run("import", tree, "--json")
    assert res.rc == 1, res
    assert "ok/pipe: not a regular file (FIFO)" in res.err
    assert summary(res)["failed"] == 1
    assert set(stored(db)) == {"ok/good.txt", "target.txt"}

    # A stored file whose path became a FIFO is reported, and not deleted by --delete.
    os.unlink(tree / "target.txt")
    os.mkfifo(tree / "target.txt")
    res = gfs.run("import", tree, "--delete", "--json")
    assert res.rc == 1, res
    assert "target.txt: not a regular file (FIFO)" in res.err
    assert summary(res)["deleted"] == 0
    assert set(stored(db)) == {"ok/good.txt", "target.txt"}
    os.unlink(tree / "target.txt")
    write(tree / "target.txt", b"target")

    # Followed: the file link is stored, the loops are reported, not walked.
    res = gfs.run("import", tree, "-L", "--json", timeout=60)
    assert res.rc == 1, res
    assert "ok/loop: symlink loop" in res.err
    assert "self: symlink loop" in res.err
    assert summary(res)["failed"] == 3
    assert set(stored(db)) == {"ok/good.txt", "target.txt", "link.txt"}
    assert bucket.open_download_stream_by_name("link.txt").read() == b"target"


def test_unreadable_file_and_directory(gfs, db, tree):
    """Root ignores permissions, so this runs gridfsctl as nobody (setpriv)."""
    if not shutil.which("setpriv") or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to drop privileges")
    base = tempfile.mkdtemp(prefix="gfs-import-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        root = os.path.join(base, "t")
        write(os.path.join(root, "readable.txt"), b"fine")
        write(os.path.join(root, "secret.txt"), b"no")
        write(os.path.join(root, "closed", "inside.txt"), b"no")
        for dirpath, dirnames, filenames in os.walk(root):
            os.chmod(dirpath, 0o755)
            for f in filenames:
                os.chmod(os.path.join(dirpath, f), 0o644)
        os.chmod(os.path.join(root, "secret.txt"), 0)
        os.chmod(os.path.join(root, "closed"), 0)
        # A stored name that is gone from disk: --delete must not act on an incomplete walk.
        db.fs.files.insert_one({"_id": 1, "filename": "gone.txt", "length": 0, "chunkSize": CHUNK,
                                "uploadDate": __import__("datetime").datetime.utcnow()})
        drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
        res = gfs.run("import", root, "--delete", "--json", wrap=drop, cwd=base)
        err = res.err
        assert res.rc == 1, err
        assert "secret.txt: cannot open: Permission denied" in err
        assert "closed: cannot open directory: Permission denied" in err
        assert "not deleting" in err
        s = summary(res)
        assert (s["uploaded"], s["failed"], s["deleted"]) == (1, 2, 0)
        assert set(stored(db)) == {"readable.txt", "gone.txt"}
    finally:
        for dirpath, dirnames, filenames in os.walk(base):
            for d in dirnames:
                os.chmod(os.path.join(dirpath, d), 0o755)
        shutil.rmtree(base)


def test_exclude_and_include(gfs, db, tree):
    write(tree / "keep.jpg", b"1")
    write(tree / "skip.tmp", b"2")
    write(tree / "cache" / "x.jpg", b"3")
    write(tree / "a" / "cache" / "y.jpg", b"4")
    write(tree / "a" / "notes.txt", b"5")
    res = gfs.run("import", tree, "--exclude", "*.tmp", "--exclude", "/cache", "--json")
    assert res.rc == 0, res
    assert set(stored(db)) == {"keep.jpg", "a/cache/y.jpg", "a/notes.txt"}

    db.fs.files.delete_many({})
    db.fs.chunks.delete_many({})
    res = gfs.run("import", tree, "--include", "*.jpg", "--exclude", "cache", "--json")
    assert res.rc == 0, res
    assert set(stored(db)) == {"keep.jpg"}


def test_delete_and_dry_run(gfs, db, tree):
    for n in ("a.txt", "b.txt", "sub/c.txt", "keep.log"):
        write(tree / n, n.encode())
    assert gfs.run("import", tree, "--prefix", "p").rc == 0
    db.fs.files.insert_one({"_id": 7, "filename": "other/outside.txt", "length": 0,
                            "chunkSize": CHUNK, "uploadDate": __import__("datetime").datetime.utcnow()})
    os.unlink(tree / "b.txt")
    os.unlink(tree / "keep.log")
    shutil.rmtree(tree / "sub")
    write(tree / "new.txt", b"new")
    write(tree / "a.txt", b"changed a", mtime_ns=1_000_000_000_000_000_000)
    before = sorted(str(d["_id"]) for d in db.fs.files.find())
    chunks_before = db.fs.chunks.count_documents({})

    res = gfs.run("import", tree, "--prefix", "p", "--delete", "--exclude", "*.log", "--dry-run")
    assert res.rc == 0, res
    assert res.text.splitlines() == [f"would {a} (DRY RUN)" for a in (
        "replace p/a.txt", "upload p/new.txt", "delete p/b.txt", "delete p/sub/c.txt")]
    assert sorted(str(d["_id"]) for d in db.fs.files.find()) == before
    assert db.fs.chunks.count_documents({}) == chunks_before
    assert db["fs.gridfsctl_locks"].count_documents(LOCK_DOCS) == 0

    res = gfs.run("import", tree, "--prefix", "p", "--delete", "--exclude", "*.log", "--json")
    assert res.rc == 0, res
    s = summary(res)
    assert (s["uploaded"], s["replaced"], s["deleted"]) == (1, 1, 2)
    # Excluded names are protected from --delete; names outside the prefix are untouched.
    assert set(stored(db)) == {"p/a.txt", "p/new.txt", "p/keep.log", "other/outside.txt"}
    assert orphan_chunks(db) == []


def test_lock_refuses_second_import(gfs, db, tree):
    write(tree / "f", b"x")
    locks = db["fs.gridfsctl_locks"]
    now = __import__("datetime").datetime.utcnow()
    later = now + __import__("datetime").timedelta(minutes=5)
    locks.insert_one({"_id": "import", "owner": "elsewhere/1", "host": "elsewhere", "pid": 4242,
                      "acquired": now, "expires": later})
    res = gfs.run("import", tree)
    assert res.rc == 6, res
    assert "held by pid 4242 on elsewhere" in res.err
    assert db.fs.files.count_documents({}) == 0

    # An expired lock is taken over.
    earlier = now - __import__("datetime").timedelta(minutes=5)
    locks.update_one({"_id": "import"}, {"$set": {"expires": earlier}})
    res = gfs.run("import", tree)
    assert res.rc == 0, res
    assert locks.count_documents(LOCK_DOCS) == 0


def test_lock_with_live_import(gfs, db, tree):
    """A real second import while the first holds the lock (stopped with SIGSTOP)."""
    for i in range(20):
        write(tree / f"f{i}", os.urandom(50_000))
    locks = db["fs.gridfsctl_locks"]
    first = gfs.popen("import", tree, "--batch-size", "64K", "-j", "1",
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: locks.count_documents(LOCK_DOCS) == 1 or first.poll() is not None, what="the lock")
        first.send_signal(signal.SIGSTOP)
        if locks.count_documents(LOCK_DOCS) == 1:
            res = gfs.run("import", tree)
            assert res.rc == 6, res
            assert "is held by pid %d" % first.pid in res.err
    finally:
        first.send_signal(signal.SIGCONT)
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert locks.count_documents(LOCK_DOCS) == 0


def assert_no_partial_files(db):
    """Every files document has all its chunks."""
    have = {}
    for c in db.fs.chunks.find({}, {"files_id": 1, "n": 1}, batch_size=1000):
        have.setdefault(c["files_id"], set()).add(c["n"])
    for f in db.fs.files.find({}, {"filename": 1, "length": 1, "chunkSize": 1}):
        count = (f["length"] + f["chunkSize"] - 1) // f["chunkSize"]
        assert have.get(f["_id"], set()) >= set(range(count)), f


def test_lease_run_out_while_stopped(gfs, db, bucket, tree):
    """Stopped past its lease, taken over and cleaned up after, an import
    writes no files document on resume and exits 6."""
    make_big_tree(tree)
    locks = db["fs.gridfsctl_locks"]
    first = gfs.popen("import", tree, "--batch-size", "64K", "-j", "1",
                      env={"GRIDFSCTL_IMPORT_LOCK_TTL": "3"},
                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: db.fs.chunks.estimated_document_count() > 0 or first.poll() is not None,
                 what="chunks in the database")
        first.send_signal(signal.SIGSTOP)
        assert first.poll() is None, "the import finished before it could be stopped"
        held = locks.find_one({"_id": "import"})
        assert held and held["pid"] == first.pid
        wait_for(lambda: locks.find_one({"_id": "import"})["expires"]
                 < __import__("datetime").datetime.utcnow(), what="the lease to run out")
        # The second import takes over, removes the first one's unfinished chunks, imports all.
        res = gfs.run("import", tree, "--json", timeout=300)
        assert res.rc == 0, res
    finally:
        first.send_signal(signal.SIGCONT)
        _, err = first.communicate(timeout=120)
    err = err.decode("utf-8", "replace")
    assert first.returncode == 6, err
    assert "lost the import lock" in err
    assert_no_partial_files(db)
    docs = stored(db)
    assert db.fs.files.count_documents({}) == len(docs) == 121
    for name, d in docs.items():
        assert d["metadata"]["sha256"] == sha256(open(tree / name, "rb").read()), name
    s = summary(gfs.run("import", tree, "--json"))
    assert s["skipped"] == s["scanned"] == 121


def make_big_tree(root, files=120, size=120_000):
    for i in range(files):
        write(os.path.join(root, f"{i % 7:02x}", f"{i:04d}.bin"), os.urandom(size + i))
    write(os.path.join(root, "multi.bin"), os.urandom(5 * CHUNK + 17))


def test_kill9_then_rerun_completes(gfs, db, bucket, tree):
    make_big_tree(tree)
    proc = gfs.popen("import", tree, "--batch-size", "64K", "-j", "2",
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: db.fs.chunks.estimated_document_count() > 0 or proc.poll() is not None,
                 what="chunks in the database")
        proc.kill()
    finally:
        proc.wait(timeout=60)
        proc.stderr.close()
    orphans = orphan_chunks(db)
    print("orphans after kill:", len(orphans), "markers:", db["fs.gridfsctl_uploads"].count_documents({}))
    res = gfs.run("import", tree, "--json", timeout=300)
    assert res.rc == 0, res
    s = summary(res)
    if orphans:
        assert s["recovered"] >= 1
        assert "unfinished upload" in res.err
    assert s["failed"] == 0
    assert orphan_chunks(db) == []
    # A chunk the killed import had in flight may have landed after the
    # rerun's recovery: the rerun removed it but kept its marker, flagged,
    # for the next run to look again.
    uploads = db["fs.gridfsctl_uploads"]
    assert uploads.count_documents({"recovered": {"$ne": True}}) == 0
    assert db["fs.gridfsctl_locks"].count_documents(LOCK_DOCS) == 0
    s = summary(gfs.run("import", tree, "--json"))
    assert s["skipped"] == s["scanned"] == 121
    assert_matches_tree(db, bucket, tree)


def finish(proc, input=None):
    """Waits for a popen'd gridfsctl; its Result, checked for sanitizer reports."""
    out, err = proc.communicate(input, timeout=120)
    res = Result(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    check_sanitizers(res)
    return res


def test_chunk_landing_after_recovery_is_removed(gfs, db, bucket, tree):
    """A chunk insert a killed import had in flight can be applied after the
    next import's recovery removed that upload's chunks. The late chunk is
    made to land explicitly, with the importer stopped between its recovery
    and the end of its run: the run removes it, and the marker stays until a
    run finds nothing more."""
    make_big_tree(tree, files=30)
    uploads = db["fs.gridfsctl_uploads"]
    for _ in range(3):
        dead = planted.plant_dead_upload(db, "dead.bin")
        proc = gfs.popen("import", tree, "--batch-size", "64K", "-j", "1", "--json",
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: db.fs.chunks.count_documents({"files_id": dead}) == 0
                     or proc.poll() is not None, what="the recovery of the dead upload")
            proc.send_signal(signal.SIGSTOP)
            wait_for(lambda: proc.poll() is not None or proc_state(proc.pid) == "T", what="the stop")
            # Its workers not done yet, so the end of its run is still to come.
            early = proc.poll() is None and db.fs.files.count_documents({}) < 31
            if early:
                planted.plant_late_chunk(db, dead)
        finally:
            proc.send_signal(signal.SIGCONT)
            res = finish(proc)
        assert res.rc == 0, res
        if early:
            break
        for c in ("files", "chunks", "gridfsctl_uploads"):   # too late to stop: again
            db["fs." + c].delete_many({})
    assert early, "the import finished every time before it could be stopped"
    assert summary(res)["recovered"] == 1
    assert "landed after their upload was recovered" in res.err, res
    assert orphan_chunks(db) == []
    assert uploads.count_documents({"_id": dead, "recovered": True}) == 1
    res = gfs.run("import", tree, "--json")
    assert res.rc == 0, res
    assert summary(res)["recovered"] == 0
    assert uploads.count_documents({}) == 0
    assert orphan_chunks(db) == []
    assert_matches_tree(db, bucket, tree)


def test_put_recovery_removes_a_chunk_landing_late(gfs, db):
    """The same for put's recovery of killed puts: a chunk landing after it
    (while this put waits on its stdin) is removed when the put ends."""
    uploads = db["fs.gridfsctl_uploads"]
    dead = planted.plant_dead_upload(db, "dead.bin", put=True)
    proc = gfs.popen("put", "-", "--name", "new.txt", stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: db.fs.chunks.count_documents({"files_id": dead}) == 0
                 or proc.poll() is not None, what="the put's recovery")
        planted.plant_late_chunk(db, dead)
    finally:
        res = finish(proc, b"new")
    assert res.rc == 0, res
    assert "removed 1 unfinished upload" in res.err, res
    assert orphan_chunks(db) == []
    assert uploads.count_documents({"_id": dead, "recovered": True}) == 1
    res = gfs.run("put", "-", "--name", "other.txt", input=b"other")
    assert res.rc == 0 and "unfinished" not in res.err, res
    assert uploads.count_documents({}) == 0
    assert orphan_chunks(db) == []
    assert sorted(d["filename"] for d in db.fs.files.find()) == ["new.txt", "other.txt"]


def test_rerun_finishes_a_deletion_cut_short(gfs, db, bucket, tree):
    # The state a crash leaves while removing files: the deletion marker is
    # written, one file has lost its files document but not its chunks, the
    # other has lost nothing yet. Recovery finishes both by id.
    half = bucket.upload_from_stream("old/half.txt", b"h" * (CHUNK + 1))
    whole = bucket.upload_from_stream("old/whole.txt", b"w")
    kept = bucket.upload_from_stream("old/kept.txt", b"k")
    db.fs.files.delete_one({"_id": half})
    marker = db["fs.gridfsctl_uploads"].insert_one(
        {"deleting": [half, whole], "owner": "gone/1",
         "started": __import__("datetime").datetime.utcnow()}).inserted_id
    write(tree / "a.txt", b"a")
    res = gfs.run("import", tree, "--json")
    assert res.rc == 0, res
    assert "finished deleting 2 files" in res.err
    assert summary(res)["recovered"] == 0
    assert db["fs.gridfsctl_uploads"].count_documents({"_id": marker}) == 0
    assert set(stored(db)) == {"a.txt", "old/kept.txt"}
    assert orphan_chunks(db) == []
    assert db.fs.chunks.count_documents({"files_id": kept}) == 1


def test_delete_and_trim_leave_no_markers(gfs, db, tree):
    for n in ("a.txt", "b.txt"):
        write(tree / n, n.encode())
    assert gfs.run("import", tree).rc == 0
    os.unlink(tree / "b.txt")
    write(tree / "a.txt", b"changed", mtime_ns=1_000_000_000_000_000_000)
    res = gfs.run("import", tree, "--delete", "--json")
    assert res.rc == 0, res
    s = summary(res)
    assert (s["replaced"], s["deleted"]) == (1, 1), s
    assert set(stored(db)) == {"a.txt"}
    assert db.fs.files.count_documents({}) == 1
    assert orphan_chunks(db) == []
    assert db["fs.gridfsctl_uploads"].count_documents({}) == 0


def test_sigint_stops_cleanly(gfs, db, bucket, tree):
    make_big_tree(tree)
    proc = gfs.popen("import", tree, "--batch-size", "64K", "-j", "2", "--json",
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: db.fs.files.estimated_document_count() > 0 or proc.poll() is not None,
             what="files in the database")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the import finished before the signal arrived")
    assert proc.returncode == 130, err
    assert b"interrupted" in err
    s = jsonvocab.summary(out.decode(), "import")
    assert s["uploaded"] == db.fs.files.count_documents({})
    # Files in flight were finished: nothing left half-written.
    assert orphan_chunks(db) == []
    assert db["fs.gridfsctl_uploads"].count_documents({}) == 0
    assert db["fs.gridfsctl_locks"].count_documents(LOCK_DOCS) == 0
    res = gfs.run("import", tree, "--json", timeout=300)
    assert res.rc == 0, res
    assert summary(res)["skipped"] == s["uploaded"]
    assert_matches_tree(db, bucket, tree)


def test_usage_and_errors(gfs, tree):
    res = gfs.run("import")
    assert res.rc == 2 and "a directory is required" in res.err
    res = gfs.run("import", tree, tree)
    assert res.rc == 2
    res = gfs.run("import", tree, "--jobs", "0")
    assert res.rc == 2 and "--jobs" in res.err
    res = gfs.run("import", tree / "missing")
    assert res.rc == 5 and "missing" in res.err
    res = gfs.run("import", "--help")
    assert res.rc == 0
    for opt in ("--prefix", "--exclude", "--include", "--checksum", "--delete", "--dry-run",
                "--jobs", "--keep-revisions", "--follow-symlinks", "--json"):
        assert opt in res.text
    res = gfs.run("_options", "import", db=False)
    assert "--exclude=" in res.text.split() and "--delete" in res.text.split()


def test_backend_down(gfs, tree):
    write(tree / "f", b"x")
    res = gfs.run("import", tree, "--uri", f"mongodb://127.0.0.1:{free_port()}/?serverSelectionTimeoutMS=300")
    assert res.rc == 3, res
    assert res.err.count("\n") == 1


def test_over_long_name(gfs, db, tree):
    deep = tree
    for i in range(5):
        deep = deep / (chr(ord("a") + i) * 250)
    write(deep / "f.txt", b"too deep for a name")
    write(tree / "short.txt", b"fine")
    res = gfs.run("import", tree, "--json")
    assert res.rc == 1, res
    assert "name too long (1260 bytes, at most 1024)" in res.err
    s = summary(res)
    assert (s["uploaded"], s["failed"]) == (1, 1)
    assert set(stored(db)) == {"short.txt"}


def test_readers_never_see_partial_files(gfs, db, tree):
    """While an import runs, every files document found has all its chunks already."""
    make_big_tree(tree)
    proc = gfs.popen("import", tree, "--batch-size", "64K", "-j", "2",
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    checks = 0
    try:
        while proc.poll() is None or checks == 0:
            files = list(db.fs.files.find({}, {"length": 1, "chunkSize": 1}))
            have = {}
            for c in db.fs.chunks.find({}, {"files_id": 1, "n": 1}, batch_size=1000):
                have.setdefault(c["files_id"], set()).add(c["n"])
            for f in files:
                count = (f["length"] + f["chunkSize"] - 1) // f["chunkSize"]
                assert have.get(f["_id"], set()) >= set(range(count)), f
            checks += 1
    finally:
        proc.wait(timeout=120)
        proc.stderr.close()
    assert proc.returncode == 0


def test_pre_1970_mtime_is_skipped_on_rerun(gfs, db, tree):
    # A negative mtimeNs is a real time, not "unknown": the rerun must not upload again.
    write(tree / "old.txt", b"from 1938", mtime_ns=-1_000_000_000_123_456_789)
    write(tree / "epoch.txt", b"just before 1970", mtime_ns=-1)
    assert gfs.run("import", tree).rc == 0
    before = sorted((d["_id"], d["uploadDate"]) for d in db.fs.files.find())
    assert db.fs.files.find_one({"filename": "old.txt"})["metadata"]["mtimeNs"] == -1_000_000_000_123_456_789
    res = gfs.run("import", tree, "--json")
    assert res.rc == 0, res
    s = summary(res)
    assert (s["skipped"], s["uploaded"], s["replaced"]) == (2, 0, 0), s
    assert sorted((d["_id"], d["uploadDate"]) for d in db.fs.files.find()) == before


def test_follow_symlinked_directory_with_include(gfs, db, tree, tmp_path):
    data = tmp_path / "data" / "photos"
    write(data / "a.jpg", b"a")
    write(data / "b.txt", b"b")
    write(data / "sub" / "c.jpg", b"c")
    write(tree / "top.jpg", b"top")
    os.symlink(data, tree / "photos")
    os.symlink(data / "b.txt", tree / "link.jpg")
    os.symlink(data / "a.jpg", tree / "link.png")
    # Include patterns never block directories, also when a symlink leads to one.
    res = gfs.run("import", tree, "-L", "-i", "*.jpg", "--json")
    assert res.rc == 0, res
    assert set(stored(db)) == {"top.jpg", "photos/a.jpg", "photos/sub/c.jpg", "link.jpg"}
    assert db.fs.files.count_documents({}) == 4
    # Exclusion still applies to the linked directory itself.
    db.fs.files.delete_many({})
    db.fs.chunks.delete_many({})
    res = gfs.run("import", tree, "-L", "-x", "photos", "--json")
    assert res.rc == 0, res
    assert set(stored(db)) == {"top.jpg", "link.jpg", "link.png"}


def test_dangling_symlink_does_not_block_delete(gfs, db, tree):
    write(tree / "a.txt", b"a")
    write(tree / "b.txt", b"b")
    write(tree / "d" / "c.txt", b"c")
    assert gfs.run("import", tree, "-L").rc == 0
    os.unlink(tree / "b.txt")
    os.symlink("nowhere", tree / "broken")
    os.symlink("..", tree / "d" / "up")
    res = gfs.run("import", tree, "-L", "--delete", "--json")
    assert res.rc == 1, res
    assert "broken: dangling symlink" in res.err
    assert "d/up: symlink loop" in res.err
    assert "not deleting" not in res.err
    s = summary(res)
    assert (s["failed"], s["deleted"], s["skipped"]) == (2, 1, 2), s
    assert set(stored(db)) == {"a.txt", "d/c.txt"}


def test_delete_keeps_what_unfollowed_symlinks_lead_to(gfs, db, tree, tmp_path):
    other = tmp_path / "other"
    write(other / "x.txt", b"x")
    write(other / "f.txt", b"f")
    for n in ("f.txt", "d/x.txt", "gone.txt", "dangling.txt", "keep.txt"):
        write(tree / n, n.encode())
    assert gfs.run("import", tree).rc == 0
    # A file and a directory replaced by symlinks to what is still there,
    # a file replaced by a dangling symlink, and one really gone.
    os.unlink(tree / "f.txt")
    os.symlink(other / "f.txt", tree / "f.txt")
    shutil.rmtree(tree / "d")
    os.symlink(other, tree / "d")
    os.unlink(tree / "dangling.txt")
    os.symlink("nowhere", tree / "dangling.txt")
    os.unlink(tree / "gone.txt")
    res = gfs.run("import", tree, "--delete", "--json")
    assert res.rc == 0, res
    assert summary(res)["deleted"] == 2
    assert set(stored(db)) == {"f.txt", "d/x.txt", "keep.txt"}
    assert orphan_chunks(db) == []


def test_delete_keeps_a_name_too_long(gfs, db, tree):
    deep = tree
    for i in range(5):
        deep = deep / (chr(ord("a") + i) * 250)
    name = os.path.relpath(deep / "f.txt", tree)
    db.fs.files.insert_one({"_id": 9, "filename": name, "length": 0, "chunkSize": CHUNK,
                            "uploadDate": __import__("datetime").datetime.utcnow()})
    write(deep / "f.txt", b"too deep for a name")
    res = gfs.run("import", tree, "--delete", "--json")
    assert res.rc == 1 and "name too long" in res.err, res
    assert summary(res)["deleted"] == 0
    assert set(stored(db)) == {name}


def test_chunk_numbers_stay_int32(gfs, db, bucket, tree):
    # 2**31 + 1 bytes in 1-byte chunks would need chunk n = 2**31: refused before reading.
    with open(tree / "huge.bin", "wb") as f:
        f.truncate(2**31 + 1)
    small = os.urandom(12_345)   # more chunks than one bulk insert takes
    write(tree / "small.bin", small)
    res = gfs.run("import", tree, "--chunk-size", "1", "--json")
    assert res.rc == 1, res
    assert "huge.bin: needs more than 2147483648 chunks" in res.err
    s = summary(res)
    assert (s["uploaded"], s["failed"]) == (1, 1), s
    assert set(stored(db)) == {"small.bin"}
    assert bucket.open_download_stream_by_name("small.bin").read() == small
    assert sorted(c["n"] for c in db.fs.chunks.find({}, {"n": 1})) == list(range(len(small)))
    assert db["fs.gridfsctl_uploads"].count_documents({}) == 0


def test_small_max_pool_size_does_not_hang(gfs, db, tree, backend):
    for i in range(5):
        write(tree / f"f{i}.txt", b"x" * i)
    sep = "&" if "?" in backend.uri else "?"
    # Too small for even one worker: a clear error, not a hang.
    res = gfs.run("import", tree, "--uri", backend.uri + sep + "maxPoolSize=1", timeout=60)
    assert res.rc == 2, res
    assert "maxPoolSize=1" in res.err
    assert db.fs.files.count_documents({}) == 0
    # A dry run needs one connection only.
    res = gfs.run("import", tree, "--uri", backend.uri + sep + "maxPoolSize=1", "-n", timeout=60)
    assert res.rc == 0 and len(res.text.splitlines()) == 5, res
    # Room for fewer workers than asked: runs with those.
    res = gfs.run("import", tree, "--uri", backend.uri + sep + "maxPoolSize=3", "-j", "8", "--json",
                  timeout=60)
    assert res.rc == 0, res
    assert "allows 1 worker, not 8" in res.err
    assert summary(res)["uploaded"] == 5
    assert set(stored(db)) == {f"f{i}.txt" for i in range(5)}


def test_file_longer_than_its_size_is_not_stored(gfs, db, tree):
    # /proc files claim size 0 but have content: like a file growing while read, it is
    # refused after reading one byte past its size.
    if not os.path.isfile("/proc/version") or os.stat("/proc/version").st_size != 0:
        pytest.skip("needs /proc/version with size 0")
    os.symlink("/proc/version", tree / "version")
    write(tree / "ok.txt", b"ok")
    res = gfs.run("import", tree, "-L", "--json")
    assert res.rc == 1, res
    assert "version: changed while being read; not stored" in res.err
    assert set(stored(db)) == {"ok.txt"}
    assert db.fs.chunks.count_documents({}) == 1
    assert db["fs.gridfsctl_uploads"].count_documents({}) == 0


def test_empty_directories_import_and_verify_against(gfs, db, tree):
    os.makedirs(tree / "void")
    os.makedirs(tree / "a" / "deeper" / "void")
    write(tree / "a" / "f.txt", b"f")
    res = gfs.run("import", tree, "--json")
    assert res.rc == 0, res
    assert summary(res)["uploaded"] == 1
    r = gfs.run("verify", "--against", tree)
    assert r.rc == 0, r


def test_delete_from_an_empty_dir_is_refused_unless_allow_empty(gfs, db, tmp_path, tree):
    write(tree / "a.txt", b"a")
    write(tree / "sub" / "b.txt", b"b")
    assert gfs.run("import", tree, "--prefix", "p").rc == 0
    empty = tmp_path / "mnt"
    empty.mkdir()  # what an unmounted mount point looks like
    for extra in ([], ["--dry-run"]):
        res = gfs.run("import", empty, "--prefix", "p", "--delete", "--json", *extra)
        assert res.rc == 1, res
        s = summary(res)
        assert s["deleted"] == 0 and "--allow-empty" in s["error"] and str(empty) in s["error"]
        assert "not deleting anything" in res.err and res.err.count("\n") == 1, res
        assert set(stored(db)) == {"p/a.txt", "p/sub/b.txt"}
    res = gfs.run("import", empty, "--prefix", "p", "--delete", "--allow-empty", "--json")
    assert res.rc == 0, res
    assert summary(res)["deleted"] == 2 and stored(db) == {}


def test_prefix_mirror_would_refuse_is_refused(gfs, db, tree):
    from planted import UNSAFE_PREFIXES
    write(tree / "f.txt", b"f")
    for prefix in UNSAFE_PREFIXES:
        res = gfs.run("import", tree, "--prefix", prefix)
        assert res.rc == 2 and f"--prefix {prefix}:" in res.err, (prefix, res)
        assert "--allow-unsafe-name" in res.err and res.err.count("\n") == 1, res
    assert db.fs.files.count_documents({}) == 0
    assert gfs.run("import", tree, "--prefix", "ok/").rc == 0
    res = gfs.run("import", tree, "--prefix", "../x", "--allow-unsafe-name")
    assert res.rc == 0, res
    assert set(stored(db)) == {"ok/f.txt", "../x/f.txt"}


# The insert command of chunks, as the wire carries it: {insert: "fs.chunks", ...}.
CHUNKS_INSERT = b"\x02insert\x00\x0a\x00\x00\x00fs.chunks\x00"


def test_frozen_backend_times_out_naming_the_operation(gfs, backend, db, tree):
    write(tree / "f.bin", os.urandom(3000))
    proxy = FreezingProxy(backend.port, CHUNKS_INSERT)
    try:
        res = gfs.run("import", tree, "--json", timeout=60,
                      env={"GRIDFSCTL_URI": proxy.uri, "GRIDFSCTL_TIMEOUT": "2"})
    finally:
        proxy.close()
    assert proxy.frozen.is_set()
    assert res.rc == 3, res
    assert "insert chunks: cannot reach the backend (timed out" in res.err, res
    assert "insert chunks" in summary(res)["error"]
    bad = gfs.run("import", tree, env={"GRIDFSCTL_TIMEOUT": "soon"})
    assert bad.rc == 2 and "GRIDFSCTL_TIMEOUT" in bad.err, bad


def test_jobs_are_sized_to_the_descriptor_limit(gfs, db, tree):
    import resource
    for i in range(40):
        write(tree / f"d{i % 4}" / f"f{i}.txt", f"file {i}\n".encode())

    def limited():
        resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))

    res = gfs.run("import", tree, "--jobs", "64", "--json", preexec_fn=limited)
    assert res.rc == 0, res
    assert "open file descriptors (ulimit -n) allows" in res.err, res
    assert summary(res)["uploaded"] == 40
    assert len(stored(db)) == 40


@pytest.mark.parametrize("doc, why", [
    ({"expires": "PAST"}, "no owner"),
    ({"owner": "elsewhere/1", "expires": 99999999999999}, "expires is not a date"),
    ({"owner": "elsewhere/1", "expires": "tomorrow"}, "expires is not a date"),
    ({"owner": "elsewhere/1"}, "no expires"),
    ({}, "no owner; no expires"),
], ids=["no-owner", "expires-int", "expires-string", "no-expires", "empty"])
def test_a_malformed_import_lock_is_taken_over_with_a_line(gfs, db, tree, doc, why):
    """Issue 27, 8-13 (8): import, verify --repair and doctor read a lock document one
    way; a malformed one is stale after its lease, or at once when it has none, and the
    taker says it took it over."""
    write(tree / "f", b"x")
    locks = db["fs.gridfsctl_locks"]
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    planted_doc = dict(doc, _id="import", host="elsewhere", pid=4242)
    if planted_doc.get("expires") == "PAST":
        planted_doc["expires"] = past
    for verb in (("import", tree), ("verify", "--repair")):
        locks.insert_one(planted_doc)
        d = jsonvocab.summary(gfs.run("doctor", "--json").text, "doctor")["importLock"]
        assert d["state"] == "stale" and d["malformed"] == why, d
        res = gfs.run(*verb)
        assert res.rc == 0, (verb, res)
        assert f"took over lock 'import' from a malformed lock document ({why})" in res.err, res
        assert locks.count_documents(LOCK_DOCS) == 0
    assert [f["filename"] for f in db.fs.files.find()] == ["f"]


def test_a_lock_without_owner_keeps_its_lease(gfs, db, tree):
    """A malformed document whose expires is a date in the future is held until then."""
    write(tree / "f", b"x")
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=5)
    db["fs.gridfsctl_locks"].insert_one({"_id": "import", "expires": later})
    d = jsonvocab.summary(gfs.run("doctor", "--json").text, "doctor")["importLock"]
    assert d["state"] == "held" and d["malformed"] == "no owner" and "expires" in d, d
    for verb in (("import", tree), ("verify", "--repair")):
        res = gfs.run(*verb)
        assert res.rc == 6 and "malformed: no owner" in res.err, res
    assert db.fs.files.count_documents({}) == 0


def two_folders(tmp_path, n=3):
    a, b = tmp_path / "a", tmp_path / "b"
    for i in range(n):
        write(a / f"a{i}", os.urandom(3000 + i))
        write(b / f"b{i}", os.urandom(3000 + i))
    return a, b


def test_imports_of_disjoint_prefixes_run_at_once(gfs, db, backend, tmp_path):
    """Issue 31: the import lock is per prefix. While one import holds
    posters/a (paused by the proxy at its first chunk insert, its upload
    marker written), an import of posters/b runs to the end and leaves the
    first one's marker alone; the parent folder, a folder under it, the whole
    bucket and verify --repair are refused naming the holder; doctor shows it."""
    a, b = two_folders(tmp_path)
    locks, uploads = db["fs.gridfsctl_locks"], db["fs.gridfsctl_uploads"]
    proxy = WireProxy(backend.port)
    try:
        rule = proxy.add(Rule("insert", "fs.chunks", "pause"))
        first = gfs.popen("import", a, "--prefix", "posters/a", "-j", "1", env={"GRIDFSCTL_URI": proxy.uri},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert rule.fired.wait(60), "the first import never sent chunks"
        held = locks.find_one({"_id": "import:posters/a/"})
        assert held and held["pid"] == first.pid
        # One worker: its batch's markers are all in, its chunks held back.
        marked = uploads.count_documents({"scope": "import:posters/a/"})
        assert marked == 3
        res = gfs.run("import", b, "--prefix", "posters/b")
        assert res.rc == 0, res
        for args in (("--prefix", "posters"), ("--prefix", "posters/a/x"), ()):
            res = gfs.run("import", b, *args)
            assert res.rc == 6, (args, res)
            assert f"lock 'import:posters/a/' is held by pid {first.pid}" in res.err, res
        res = gfs.run("verify", "--repair")
        assert res.rc == 6, res
        res = gfs.run("doctor", "--json", "--allow-empty")
        assert json.loads(res.text.splitlines()[-1])["summary"]["prefixLocks"] == {"held": 1, "stale": 0}
        # The second import's recovery left the first one's markers as they were.
        assert uploads.count_documents({"scope": "import:posters/a/",
                                        "recovered": {"$exists": False}}) == marked
    finally:
        rule.release_now.set()
        out, err = first.communicate(timeout=120)
        proxy.close()
    err = err.decode("utf-8", "replace")
    check_sanitizer_report(err, first.returncode)
    assert first.returncode == 0, err
    # A later import recovers nothing of the first one's: its files stay.
    res = gfs.run("import", b, "--prefix", "posters/b")
    assert res.rc == 0, res
    assert set(stored(db)) == {f"posters/a/a{i}" for i in range(3)} | {f"posters/b/b{i}" for i in range(3)}
    assert_no_partial_files(db)
    assert orphan_chunks(db) == []
    assert uploads.count_documents({}) == 0
    assert locks.count_documents(LOCK_DOCS) == 0


@pytest.mark.parametrize("planted_lock, prefix, rc", [
    ("import:posters/ab/", "posters", 6),    # a folder and one under it, both ways
    ("import:posters/", "posters/ab", 6),
    ("import:posters/ab/", "posters/a", 0),  # byte-exact: posters/a is not posters/ab
    ("import", "posters/b", 6),              # the whole bucket excludes every prefix
    ("import:posters/b/", None, 6),
])
def test_prefix_locks_overlap_byte_exact(gfs, db, tree, planted_lock, prefix, rc):
    """Issue 31: a lock document planted for one scope refuses the imports
    that overlap it and no other."""
    write(tree / "f", b"x")
    now = datetime.datetime.utcnow()
    db["fs.gridfsctl_locks"].insert_one({"_id": planted_lock, "owner": "elsewhere/1", "host": "elsewhere",
                                         "pid": 4242, "acquired": now,
                                         "expires": now + datetime.timedelta(minutes=5)})
    res = gfs.run("import", tree, *(("--prefix", prefix) if prefix else ()))
    assert res.rc == rc, res
    if rc:
        assert f"lock '{planted_lock}' is held by pid 4242 on elsewhere" in res.err, res
        assert db.fs.files.count_documents({}) == 0
        # The refused take left no document of its own.
        assert db["fs.gridfsctl_locks"].count_documents(LOCK_DOCS) == 1
    else:
        assert db.fs.files.count_documents({}) == 1


def test_a_whole_bucket_take_counts_on_prefix_counters(gfs, db, tree):
    """Issue 31: watch trusts a take numbered one past its last; an import of
    the whole bucket between two takes of posters/a/ leaves a gap."""
    write(tree / "f", b"x")
    counters = db["fs.gridfsctl_locks"]
    assert gfs.run("import", tree, "--prefix", "posters/a").rc == 0
    assert counters.find_one({"_id": "import:posters/a/.taken"})["n"] == 1
    assert gfs.run("import", tree, "--prefix", "posters/b").rc == 0
    assert counters.find_one({"_id": "import:posters/a/.taken"})["n"] == 1
    assert gfs.run("import", tree, "--prefix", "posters").rc == 0
    assert counters.find_one({"_id": "import:posters/a/.taken"})["n"] == 2
    assert gfs.run("import", tree, "--prefix", "posters/a").rc == 0
    assert counters.find_one({"_id": "import:posters/a/.taken"})["n"] == 3
    assert counters.find_one({"_id": "import:posters/b/.taken"})["n"] == 2
