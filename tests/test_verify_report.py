"""What verify's report says (issue 30): an interrupted run says what it did not
check, and stops within half a second even while the backend keeps it waiting;
-q prints the problems alone; the summary's numbers count one thing."""
import signal
import subprocess
import time

import bson

import jsonvocab
import planted
from conftest import LOCK_DOCS
from wireproxy import Rule, WireProxy


def test_interrupt_while_the_backend_keeps_the_pass_waiting(gfs, db, backend):
    for i in range(3):
        planted.plant(db, bson.ObjectId(), f"w/{i}", planted.data(300, i))
    proxy = WireProxy(backend.port)
    rule = proxy.add(Rule("find", "fs.chunks", "pause"))   # a backend slow to answer the pass
    try:
        for json_out in (False, True):
            rule.fired.clear()
            args = ["verify", "--read", "scan"] + (["--json"] if json_out else [])
            proc = gfs.popen(*args, env={"GRIDFSCTL_URI": proxy.uri}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
            assert rule.fired.wait(60), "the pass never asked for chunks"
            asked = time.monotonic()
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
            took = time.monotonic() - asked
            assert proc.returncode == 130, (out, err)
            assert took < 0.5, f"{took:.2f} s to stop"
            text = out.decode()
            assert "no problems" not in text, text
            if json_out:
                s = jsonvocab.summary(text, "verify")
                assert (s["interrupted"], s["files"], s["checked"], s["notChecked"]) == (True, 3, 0, 3), s
                assert s["error"] == "interrupted: 3 files not checked", s
            else:
                assert text.startswith("verify: interrupted after ") and text.endswith(
                    ": 3 files not checked (0 of 3 checked, 0 B); 0 problems found in those\n"), text
    finally:
        rule.release_now.set()
        proxy.close()


def test_interrupt_after_the_pass_says_what_was_not_checked(gfs, db):
    """The pass itself polls the stop flag: its summary, too, never says 'no problems'."""
    planted.plant_long_report(db)
    proc = gfs.popen("verify", "--threads", "1", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     bufsize=0)
    assert proc.stdout.readline().startswith(b"EXTRA-CHUNK ")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    last = out.decode().splitlines()[-1]
    assert last.startswith("verify: interrupted after ") and " files not checked (" in last, last
    assert "no problems" not in last


def test_quiet_prints_the_problems_alone(gfs, db):
    planted.plant(db, bson.ObjectId(), "good", planted.data(300, 1))
    fid = planted.plant(db, bson.ObjectId(), "bad", planted.data(300, 2), chunk=100)
    db["fs.chunks"].delete_one({"files_id": fid, "n": 1})
    r = gfs.run("verify", "-q")
    assert r.rc == 1, r
    lines = r.text.splitlines()
    assert lines and all(line.startswith("MISSING-CHUNK bad ") for line in lines), r
    db["fs.files"].delete_one({"_id": fid})
    db["fs.chunks"].delete_many({"files_id": fid})
    r = gfs.run("verify", "-q")
    assert r.rc == 0 and r.text == "" and r.err == "", r


def test_repaired_counts_problems_not_steps(gfs, db, tmp_path):
    """A damaged file with a disk copy is one problem, repaired in two steps."""
    disk = tmp_path / "disk"
    disk.mkdir()
    for i, name in enumerate(("a.bin", "b.bin")):
        body = planted.data(300, i)
        (disk / name).write_bytes(body)
        fid = planted.plant(db, bson.ObjectId(), name, body, chunk=100)
        db["fs.chunks"].update_one({"files_id": fid, "n": 1}, {"$set": {"data": bson.Binary(b"x" * 100)}})
    r = gfs.run("verify", "--against", disk, "--repair")
    assert r.rc == 0, r
    assert r.text.splitlines()[-1].endswith(": 2 problems: 2 repaired, 0 not"), r
    assert db["gridfsctl_locks"].count_documents(LOCK_DOCS) == 0
    for name in ("a.bin", "b.bin"):  # the new revisions are one chunk each
        [new] = db["fs.files"].find({"filename": name})
        db["fs.chunks"].update_one({"files_id": new["_id"], "n": 0},
                                   {"$set": {"data": bson.Binary(b"y" * 300)}})
    s = jsonvocab.summary(gfs.run("verify", "--against", disk, "--repair", "--json").text, "verify")
    assert (s["problems"], s["repaired"], s["unrepaired"]) == (2, 2, 0), s


def test_against_without_prefix_names_the_folder_once(gfs, db, tmp_path):
    """Every stored name under posters/, the tree holding what is under it: one hint."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(5):
        body = planted.data(100, i)
        (tree / f"{i}.jpg").write_bytes(body)
        planted.plant(db, bson.ObjectId(), f"posters/{i}.jpg", body)
    r = gfs.run("verify", "--against", tree)
    assert r.rc == 1, r
    assert r.err == (f"gridfsctl verify: every stored name is under 'posters/', and {tree} has no "
                     "'posters': did you mean '--prefix posters'?\n"), r
    r = gfs.run("verify", "--against", tree, "--prefix", "posters")
    assert r.rc == 0 and r.err == "", r
    (tree / "posters").mkdir()  # a tree that has the folder: the comparison as asked, no hint
    r = gfs.run("verify", "--against", tree)
    assert r.rc == 1 and r.err == "", r
