"""What a writer killed between two of its requests leaves, planted exactly
with a wire proxy (tests/wireproxy.py) rather than hoped for with a random
kill (tests/long/test_crash.py), and what the next run must make of it:
no orphan chunk, no name stored twice, every stored file complete.

GridFS removes a file in two writes, its files document and then its
chunks: a writer killed between the two leaves chunks that no files
document names (F2 and F3 in docs/reliability.md)."""
import datetime
import os
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "long"))

import jsonvocab
import planted
from conftest import proc_stat
from state import duplicated_names, incomplete_files, orphan_chunks, stored
from test_watch import Watcher
from wireproxy import Rule, WireProxy

DEADLINE = 60


def ok(res):
    assert res.rc == 0, res
    return res


class Victim:
    """The process a rule's action SIGKILLs; set before the rule can fire."""

    def __init__(self):
        self.proc = None

    def kill(self):
        self.proc.kill()


def killed_at(gfs, backend, op, collection, *args):
    """Runs gridfsctl args through a proxy that SIGKILLs it right after the reply to
    its first op on collection; asserts that it did."""
    proxy, victim = WireProxy(backend.port), Victim()
    try:
        rule = proxy.add(Rule(op, collection, "kill_after_reply", victim.kill))
        victim.proc = gfs.popen(*args, env={"GRIDFSCTL_URI": proxy.uri},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert victim.proc.wait(timeout=DEADLINE) == -9, "the rule never met the request"
        assert rule.done.wait(DEADLINE)  # set just after the kill
    finally:
        proxy.close()


def watch_killed_at(gfs, backend, tmp_path, op, collection):
    """Imports a tree of one file, a.bin, then runs watch on it through a proxy and,
    once it is idle, rewrites a.bin with a rule armed that SIGKILLs watch right after
    the reply to its first op on collection; asserts that it did. Returns the tree."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(100_000))
    ok(gfs.run("import", src))
    proxy, victim = WireProxy(backend.port), Victim()
    try:
        w = Watcher(gfs, src, env={"GRIDFSCTL_URI": proxy.uri})
        victim.proc = w.proc
        w.wait_for("ready")
        rule = proxy.add(Rule(op, collection, "kill_after_reply", victim.kill))
        (src / "a.bin").write_bytes(os.urandom(100_000))
        assert w.proc.wait(timeout=DEADLINE) == -9, "the rule never met the request"
        w.wait_exit()
        assert rule.done.wait(DEADLINE)  # set just after the kill
    finally:
        proxy.close()
    return src


def watch_recovers(gfs, db, src):
    """A watch of src started after the kill: once ready, the bucket holds src exactly."""
    w = Watcher(gfs, src)
    try:
        w.wait_for("ready")
    finally:
        assert w.stop() == 0
    assert_clean(db, {"a.bin": (src / "a.bin").read_bytes()})


def assert_clean(db, want):
    assert orphan_chunks(db) == []
    assert duplicated_names(db) == []
    assert incomplete_files(db) == []
    assert stored(db) == want


def test_put_killed_between_removing_files_doc_and_chunks(gfs, db, backend, tmp_path):
    f = tmp_path / "big.bin"
    f.write_bytes(os.urandom(300_000))
    ok(gfs.run("put", f, "--chunk-size", "16K"))
    old = db["fs.files"].find_one()["_id"]
    f.write_bytes(os.urandom(300_000))
    killed_at(gfs, backend, "delete", "fs.files", "put", f, "--chunk-size", "16K")
    # Planted: the old revision's files document is gone, its 19 chunks are not.
    assert orphan_chunks(db) == [old] * 19
    ok(gfs.run("put", f, "--chunk-size", "16K"))
    assert_clean(db, {"big.bin": f.read_bytes()})
    assert db["fs.gridfsctl_uploads"].count_documents({}) == 0


def test_rm_killed_between_removing_files_doc_and_chunks(gfs, db, backend, tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(os.urandom(100_000))
    ok(gfs.run("put", f, "--chunk-size", "16K"))
    killed_at(gfs, backend, "delete", "fs.files", "rm", "a.bin")
    assert len(orphan_chunks(db)) == 7
    # Any later writer finishes the removal: here an unrelated put.
    g = tmp_path / "b.bin"
    g.write_bytes(b"b")
    ok(gfs.run("put", g))
    assert_clean(db, {"b.bin": b"b"})


def test_watch_killed_between_removing_files_doc_and_chunks(gfs, db, backend, tmp_path):
    # Armed once watch is idle: the first removal now is the old revision's, after the upload.
    src = watch_killed_at(gfs, backend, tmp_path, "delete", "fs.files")
    assert len(orphan_chunks(db)) == 1
    watch_recovers(gfs, db, src)
    assert ok(gfs.run("verify", "--against", src))


def identity(pid):
    """The owner fields lib/lock.c records for process pid on this host."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    start = int(proc_stat(pid)[19])
    host = socket.gethostname()
    return {"owner": f"{host}/{boot}/{pid}/{start}", "host": host, "bootId": boot, "pid": pid,
            "startTime": start}


def plant_removal(db, bucket, name, started, **owner):
    """A removal cut short: the marker, the files document gone, the chunks not."""
    fid = bucket.upload_from_stream(name, b"x" * 300_000)
    db["fs.gridfsctl_uploads"].insert_one({"deleting": [fid], "started": started, **owner})
    db.fs.files.delete_one({"_id": fid})
    return fid


def test_put_finishes_only_removals_whose_writer_is_gone(gfs, db, bucket, tmp_path):
    now = datetime.datetime.now(datetime.timezone.utc)
    gone = subprocess.Popen(["true"])
    dead = identity(gone.pid)
    gone.wait()
    dead_here = plant_removal(db, bucket, "dead", now, **dead)
    live_here = plant_removal(db, bucket, "live", now, **identity(os.getpid()))
    elsewhere = dict(identity(os.getpid()), host="elsewhere.example", bootId="b")
    recent_elsewhere = plant_removal(db, bucket, "recent", now, **elsewhere)
    old_elsewhere = plant_removal(db, bucket, "old", now - datetime.timedelta(minutes=2),
                                  **elsewhere)
    # An import's, from before markers named their writer: the next import's, under its lock.
    legacy = plant_removal(db, bucket, "legacy", now, owner="gone/1")
    f = tmp_path / "f.bin"
    f.write_bytes(b"f")
    res = ok(gfs.run("put", f))
    assert "finished removing 2 files" in res.err
    assert sorted(orphan_chunks(db), key=str) == sorted(
        [live_here] * 2 + [recent_elsewhere] * 2 + [legacy] * 2, key=str)
    for fid in (dead_here, old_elsewhere):
        assert db["fs.gridfsctl_uploads"].count_documents({"deleting": fid}) == 0
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a")
    res = ok(gfs.run("import", src))
    assert "finished deleting 1 file" in res.err
    assert sorted(orphan_chunks(db), key=str) == sorted([live_here] * 2 + [recent_elsewhere] * 2,
                                                        key=str)


def test_import_finishes_another_hosts_import_removal_at_once(gfs, db, bucket, tmp_path):
    # An import elsewhere died removing a file: the import lock it held is ours now, so at once.
    now = datetime.datetime.now(datetime.timezone.utc)
    elsewhere = dict(identity(os.getpid()), host="elsewhere.example", bootId="b")
    plant_removal(db, bucket, "gone", now, lock="import", **elsewhere)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a")
    res = ok(gfs.run("import", src))
    assert "finished deleting 1 file" in res.err
    assert_clean(db, {"a": b"a"})
    assert db["fs.gridfsctl_uploads"].count_documents({}) == 0


def held_put(gfs, backend, tmp_path, collection):
    """A put whose write to collection is held at the proxy while it is killed and a put of
    another name runs (it recovers the dead upload); the write is then released and lands."""
    f, other = tmp_path / "big.bin", tmp_path / "other.bin"
    f.write_bytes(os.urandom(300_000))
    other.write_bytes(b"o")
    proxy, victim = WireProxy(backend.port), Victim()
    try:
        rule = proxy.add(Rule("insert", collection, "hold", victim.kill))
        victim.proc = gfs.popen("put", f, "--chunk-size", "16K", env={"GRIDFSCTL_URI": proxy.uri},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert victim.proc.wait(timeout=DEADLINE) == -9, "the rule never met the request"
        ok(gfs.run("put", other))
        rule.release()
    finally:
        proxy.close()
    return other


def test_chunks_landing_after_recovery_are_removed_by_the_next_run(gfs, db, backend, tmp_path):
    other = held_put(gfs, backend, tmp_path, "fs.chunks")
    assert len(orphan_chunks(db)) == 19        # the dead put's whole batch, landed late
    ok(gfs.run("put", other))
    assert_clean(db, {"other.bin": b"o"})
    assert db["fs.gridfsctl_uploads"].count_documents({}) == 0


def test_files_doc_landing_after_recovery_is_removed_by_the_next_run(gfs, db, backend, tmp_path):
    # The dead put's chunks were all in and removed by the recovery; its files document came last.
    other = held_put(gfs, backend, tmp_path, "fs.files")
    assert incomplete_files(db) == ["big.bin"]
    ok(gfs.run("put", other))
    assert_clean(db, {"other.bin": b"o"})


def test_watch_killed_after_storing_before_trimming(gfs, db, backend, tmp_path):
    # The new revision is stored; the old one not yet removed.
    src = watch_killed_at(gfs, backend, tmp_path, "insert", "fs.files")
    assert duplicated_names(db) == ["a.bin"]
    watch_recovers(gfs, db, src)


def test_put_killed_after_storing_before_trimming(gfs, db, backend, tmp_path):
    f, other = tmp_path / "big.bin", tmp_path / "other.bin"
    f.write_bytes(os.urandom(300_000))
    other.write_bytes(b"o")
    ok(gfs.run("put", f, "--chunk-size", "16K"))
    f.write_bytes(os.urandom(300_000))
    killed_at(gfs, backend, "insert", "fs.files", "put", f, "--chunk-size", "16K")
    assert duplicated_names(db) == ["big.bin"]
    # Another name: no trim of big.bin of its own, only the recovery's.
    ok(gfs.run("put", other))
    assert_clean(db, {"big.bin": f.read_bytes(), "other.bin": b"o"})
    assert db["fs.gridfsctl_uploads"].count_documents({}) == 0


def rm_killed_between_its_writes(gfs, db, backend, tmp_path, name):
    """An rm SIGKILLed right after its files document went, its chunks not yet."""
    f = tmp_path / name
    f.write_bytes(os.urandom(100_000))
    ok(gfs.run("put", f, "--chunk-size", "16K"))
    killed_at(gfs, backend, "delete", "fs.files", "rm", name)
    assert len(orphan_chunks(db)) == 7
    marker = db["fs.gridfsctl_uploads"].find_one({"deleting": {"$exists": True}})
    assert marker["verb"] == "rm", marker


def test_rm_killed_between_its_writes_is_named_and_finished_by_rm(gfs, db, backend, tmp_path):
    """Issue 27, 8-13 (9): the marker says rm left it; doctor counts the chunks as
    orphans left by an interrupted rm (not uploads in progress), verify names rm, and
    the next rm finishes the removal."""
    rm_killed_between_its_writes(gfs, db, backend, tmp_path, "gone.bin")
    r = gfs.run("doctor", "--json")
    o = jsonvocab.summary(r.text, "doctor")["orphans"]
    assert r.rc == 1 and (o["found"], o["interrupted"], o["uploading"]) == (7, 7, 0), r
    why = ("left by an interrupted rm (the next rm, put, import or verify --repair finishes "
           "its removal)")
    assert why in gfs.run("doctor").text
    r = gfs.run("verify")
    assert r.rc == 1 and r.text.startswith("ORPHAN-CHUNKS ") and why in r.text, r
    res = ok(gfs.run("rm", "-f", "nonesuch"))
    assert "finished removing 1 file an interrupted command had begun to remove" in res.err, res
    assert db["fs.gridfsctl_uploads"].count_documents({}) == 0
    assert_clean(db, {})


def test_verify_repair_finishes_a_killed_rm(gfs, db, backend, tmp_path):
    rm_killed_between_its_writes(gfs, db, backend, tmp_path, "gone.bin")
    res = ok(gfs.run("verify", "--repair"))
    assert "finished removing 1 file an interrupted command had begun to remove" in res.err, res
    assert "ORPHAN" not in res.text, res
    assert db["fs.gridfsctl_uploads"].count_documents({}) == 0
    assert_clean(db, {})


def test_a_killed_puts_lock_is_reported_and_removed(gfs, db, backend, tmp_path):
    """Issue 27, 8-13 (10): a put killed after taking its own lock, before its upload's
    marker named it, left "put-ID" for good. doctor reports such locks; the next put (or
    rm, import, verify --repair) removes the stale ones and leaves those of puts at work."""
    f = tmp_path / "f.bin"
    f.write_bytes(os.urandom(50_000))
    killed_at(gfs, backend, "insert", "fs.gridfsctl_locks", "put", f)
    locks = db["fs.gridfsctl_locks"]
    put_locks = lambda: sorted(d["_id"] for d in locks.find({"_id": {"$regex": "^put-"}}))
    [dead] = put_locks()
    assert db["fs.gridfsctl_uploads"].count_documents({}) == 0
    live = planted.plant_put_in_flight(db)
    assert put_locks() == sorted([dead, f"put-{live}"])
    r = gfs.run("doctor", "--json")
    assert jsonvocab.summary(r.text, "doctor")["putLocks"] == {"held": 1, "stale": 1}, r
    assert "put locks:    1 held by puts at work, 1 stale" in gfs.run("doctor").text
    (tmp_path / "g").write_bytes(b"g")
    ok(gfs.run("put", tmp_path / "g"))
    assert put_locks() == [f"put-{live}"]
