"""watch: changes in a directory reach GridFS, checked with pymongo. Synchronisation is on the
JSON events the command prints (one per action), never on sleeps."""
import datetime
import hashlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import threading
import time

import gridfs
import pytest

import jsonvocab
from conftest import STORAGE, Backend, Gridfsctl, check_sanitizer_report, free_port, proc_state, wait_for
from test_serve import Server
from wireproxy import FreezingProxy

DEADLINE = 30
# The update command on fs.files, as the wire carries it: {update: "fs.files", ...}, a rename.
FILES_UPDATE = b"\x02update\x00\x09\x00\x00\x00fs.files\x00"


class Watcher:
    def __init__(self, gfs, directory, *args, env=None, wrap=(), human=False):
        """human: without --json; events are then the human lines, as text."""
        self.human = human
        self.proc = gfs.popen("watch", directory, *(() if human else ("--json",)), "--settle", "50",
                              *args, env=env, wrap=wrap, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
        self.events = queue.Queue()
        self.stderr = []
        self.readers = [threading.Thread(target=self._read, daemon=True),
                        threading.Thread(target=self._read_err, daemon=True)]
        for t in self.readers:
            t.start()

    def _read(self):
        for line in self.proc.stdout:
            if self.human:
                self.events.put(line.decode("utf-8", "replace").rstrip("\n"))
                continue
            ev = json.loads(line)
            jsonvocab.check_line(ev, "watch")
            self.events.put(ev)
        self.events.put(None)

    def _read_err(self):
        for line in self.proc.stderr:
            self.stderr.append(line.decode("utf-8", "replace"))

    def _wait(self, match, what):
        """The first event match accepts, and the events before it."""
        end = time.monotonic() + DEADLINE
        seen = []
        while time.monotonic() < end:
            try:
                ev = self.events.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            assert ev is not None, f"watch exited: {self.stderr}"
            if match(ev):
                return ev, seen
            seen.append(ev)
        raise AssertionError(f"no {what} in {seen}; stderr: {self.stderr}")

    def wait_for(self, event, name=None):
        def match(ev):
            return ev.get("event") == event and (name is None or ev.get("filename") == name)
        return self._wait(match, f"{event} {name}")[0]

    def wait_line(self, line):
        """Waits for a human line (human=True); returns the lines before it."""
        return self._wait(lambda got: got == line, f"line {line!r}")[1]

    def next_events(self, count):
        """The next count events, in whatever order they come."""
        out = []
        end = time.monotonic() + DEADLINE
        while len(out) < count and time.monotonic() < end:
            try:
                ev = self.events.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            assert ev is not None, f"watch exited: {self.stderr}"
            out.append(ev)
        assert len(out) == count, f"{out}; stderr: {self.stderr}"
        return out

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait_exit()

    def wait_exit(self):
        """The exit status, once watch has exited (on its own or after stop) and its output is read."""
        try:
            rc = self.proc.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"watch still running; stderr: {self.stderr}")
        for t in self.readers:
            t.join(timeout=DEADLINE)
        err = "".join(self.stderr)
        check_sanitizer_report(err)
        return rc


@pytest.fixture
def tree(tmp_path):
    d = tmp_path / "tree"
    (d / "ab").mkdir(parents=True)
    (d / "ab" / "old.jpg").write_bytes(b"old poster")
    return d


def test_initial_pass_then_changes(gfs, bucket, db, tree):
    w = Watcher(gfs, tree, "--prefix", "p", "--delete")
    try:
        w.wait_for("synced")
        w.wait_for("ready")
        assert bucket.open_download_stream_by_name("p/ab/old.jpg").read() == b"old poster"

        (tree / "ab" / "new.jpg").write_bytes(b"new poster")
        ev = w.wait_for("upload", "p/ab/new.jpg")
        assert ev["bytes"] == 10
        assert bucket.open_download_stream_by_name("p/ab/new.jpg").read() == b"new poster"

        (tree / "ab" / "new.jpg").write_bytes(b"changed poster")
        w.wait_for("replace", "p/ab/new.jpg")
        assert bucket.open_download_stream_by_name("p/ab/new.jpg").read() == b"changed poster"
        assert db.fs.files.count_documents({"filename": "p/ab/new.jpg"}) == 1

        (tree / "ab" / "old.jpg").unlink()
        w.wait_for("delete", "p/ab/old.jpg")
        assert db.fs.files.count_documents({"filename": "p/ab/old.jpg"}) == 0
    finally:
        assert w.stop() == 0


def test_human_lines_say_the_words_of_every_verb(gfs, bucket, db, tree):
    """One word per action (gridfsctl(1), JSON OUTPUT): watch's lines say uploaded, replaced,
    deleted and moved, as import's do, a folder's with "folder"; never the old "removed"."""
    (tree / "cd").mkdir()
    (tree / "cd" / "x.jpg").write_bytes(b"x")
    (tree / "ef").mkdir()
    (tree / "ef" / "y.jpg").write_bytes(b"y")
    w = Watcher(gfs, tree, "--prefix", "p", "--delete", human=True)
    try:
        lines = []
        for name in ("ab/old.jpg", "cd/x.jpg", "ef/y.jpg"):
            wait_for(lambda: db.fs.files.count_documents({"filename": f"p/{name}"}) == 1,
                     DEADLINE, f"p/{name} stored")
        (tree / "ab" / "new.jpg").write_bytes(b"new poster")
        lines += w.wait_line("uploaded p/ab/new.jpg")
        (tree / "ab" / "new.jpg").write_bytes(b"changed poster")
        lines += w.wait_line("replaced p/ab/new.jpg")
        (tree / "ab" / "new.jpg").unlink()
        lines += w.wait_line("deleted p/ab/new.jpg")
        os.rename(tree / "ef", tree / "gh")
        lines += w.wait_line("moved folder p/ef -> p/gh")
        shutil.rmtree(tree / "cd")
        lines += w.wait_line("deleted folder p/cd")
        assert not [ln for ln in lines if ln.split(" ")[0] in ("removed", "removed-folder",
                                                              "moved-folder")], lines
    finally:
        assert w.stop() == 0


def test_new_folders_renames_and_temp_files(gfs, bucket, db, tree, tmp_path):
    w = Watcher(gfs, tree, "--delete", "--exclude", "*.tmp")
    try:
        w.wait_for("ready")
        # a folder made elsewhere and moved in whole: its files were never seen being written
        staging = tmp_path / "staging" / "cd"
        staging.mkdir(parents=True)
        (staging / "x.jpg").write_bytes(b"x")
        (staging / "deep").mkdir()
        (staging / "deep" / "y.jpg").write_bytes(b"y")
        (tree / "skip.tmp").write_bytes(b"excluded")
        (tree / "notes.txt~").write_bytes(b"editor backup")
        shutil.move(str(staging), str(tree / "cd"))
        got = {(e["event"], e["filename"]) for e in w.next_events(2)}
        assert got == {("upload", "cd/x.jpg"), ("upload", "cd/deep/y.jpg")}
        # a file written in the new folder afterwards is watched too
        (tree / "cd" / "deep" / "z.jpg").write_bytes(b"z")
        w.wait_for("upload", "cd/deep/z.jpg")

        # a rename within the tree is a rename in GridFS
        os.rename(tree / "cd" / "x.jpg", tree / "cd" / "renamed.jpg")
        ev = w.wait_for("move", "cd/renamed.jpg")
        assert ev["from"] == "cd/x.jpg" and ev["files"] == 1
        assert db.fs.files.count_documents({"filename": "cd/x.jpg"}) == 0
        assert bucket.open_download_stream_by_name("cd/renamed.jpg").read() == b"x"

        shutil.rmtree(tree / "cd")
        w.wait_for("delete-folder", "cd")
        assert db.fs.files.count_documents({"filename": {"$regex": "^cd/"}}) == 0
        assert db.fs.files.count_documents({"filename": "skip.tmp"}) == 0
        assert db.fs.files.count_documents({"filename": "notes.txt~"}) == 0
    finally:
        assert w.stop() == 0


def test_without_delete_removals_are_kept(gfs, bucket, db, tree):
    w = Watcher(gfs, tree)
    try:
        w.wait_for("ready")
        (tree / "ab" / "old.jpg").unlink()
        (tree / "marker").write_bytes(b"m")
        w.wait_for("upload", "marker")  # events are handled in order of settling; removal came first
        assert db.fs.files.count_documents({"filename": "ab/old.jpg"}) == 1
    finally:
        assert w.stop(signal.SIGINT) == 130


@pytest.mark.parametrize("where", ["outside", "hidden"])
def test_directory_moved_away_is_no_longer_watched(gfs, bucket, db, tree, tmp_path, where):
    """Events in the moved-away copy must not be taken for the new directory of the same name."""
    away = tmp_path / "backup" / "ab" if where == "outside" else tree / ".ab"
    away.parent.mkdir(exist_ok=True)
    w = Watcher(gfs, tree, "--delete")
    try:
        w.wait_for("ready")
        os.rename(tree / "ab", away)
        w.wait_for("delete-folder", "ab")
        (tree / "ab").mkdir()
        (tree / "ab" / "old.jpg").write_bytes(b"new poster")
        w.wait_for("upload", "ab/old.jpg")

        shutil.rmtree(away)
        (tree / "marker").write_bytes(b"m")
        w.wait_for("upload", "marker")  # the removals inside the old copy settled first
        assert bucket.open_download_stream_by_name("ab/old.jpg").read() == b"new poster"
        assert db.fs.files.count_documents({"filename": "ab/old.jpg"}) == 1
    finally:
        assert w.stop() == 0


def test_folder_replaced_by_file_within_settle_time(gfs, bucket, db, tree):
    # a settle time long enough that both changes are pending together
    w = Watcher(gfs, tree, "--delete", "--settle", "1000")
    try:
        w.wait_for("ready")
        assert db.fs.files.count_documents({"filename": "ab/old.jpg"}) == 1
        shutil.rmtree(tree / "ab")
        (tree / "ab").write_bytes(b"now a file")
        w.wait_for("delete-folder", "ab")
        w.wait_for("upload", "ab")
        assert db.fs.files.count_documents({"filename": {"$regex": "^ab/"}}) == 0
        assert bucket.open_download_stream_by_name("ab").read() == b"now a file"
    finally:
        assert w.stop() == 0


def test_removal_then_folder_move_within_settle_time(gfs, bucket, db, tree):
    """A file removed, then its folder moved, both within the settle time: the removal is acted
    on under the old name before the rename, not lost with the folder's pending changes."""
    (tree / "h").mkdir()
    (tree / "h" / "f1.txt").write_bytes(b"one")
    (tree / "h" / "f2.txt").write_bytes(b"two")
    w = Watcher(gfs, tree, "--delete", "--settle", "1000")
    try:
        w.wait_for("ready")
        (tree / "h" / "f1.txt").unlink()
        os.rename(tree / "h", tree / "h2")
        w.wait_for("delete", "h/f1.txt")
        ev = w.wait_for("move-folder", "h2")
        assert ev["from"] == "h" and ev["files"] == 1
        assert db.fs.files.count_documents({"filename": {"$in": ["h/f1.txt", "h2/f1.txt"]}}) == 0
        assert bucket.open_download_stream_by_name("h2/f2.txt").read() == b"two"
        wait_exact(db, bucket, tree)
    finally:
        assert w.stop() == 0


def test_file_found_still_growing_is_taken_when_complete(gfs, bucket, tree, tmp_path):
    """A file in a directory moved in is found by listing; nothing says it is complete but its
    size and mtime staying the same for the settle time."""
    staging = tmp_path / "staging"
    staging.mkdir()
    w = Watcher(gfs, tree, "--settle", "1000")
    try:
        w.wait_for("ready")
        with open(staging / "big.bin", "wb") as f:
            f.write(b"a" * 1000)
            f.flush()
            os.rename(staging, tree / "new")
            # the writer's pace: a twentieth of the settle time, for longer than it (no synchronisation)
            for _ in range(30):
                time.sleep(0.05)
                f.write(b"a" * 1000)
                f.flush()
        ev = w.wait_for("upload", "new/big.bin")
        assert ev["bytes"] == 31000
        assert bucket.open_download_stream_by_name("new/big.bin").read() == b"a" * 31000
    finally:
        assert w.stop() == 0


def overflow(w, tree):
    """Once w is ready, stops it (SIGSTOP) and writes more events than its inotify queue
    holds: two files written in turn are never merged. The caller changes the tree, then
    sends SIGCONT."""
    with open("/proc/sys/fs/inotify/max_queued_events") as f:
        limit = int(f.read())
    w.wait_for("ready")
    w.proc.send_signal(signal.SIGSTOP)
    wait_for(lambda: proc_state(w.proc.pid) == "T", DEADLINE, "watch to stop")
    for i in range(limit + 100):
        (tree / f"{i % 2}.tmp").write_bytes(b"x")


def test_directories_made_while_events_were_lost_are_watched(gfs, bucket, db, tree):
    w = Watcher(gfs, tree, "--exclude", "*.tmp")
    try:
        overflow(w, tree)  # stopped, watch cannot drain its queue
        (tree / "new").mkdir()
        (tree / "new" / "f.jpg").write_bytes(b"f")
        w.proc.send_signal(signal.SIGCONT)
        w.wait_for("synced")
        assert bucket.open_download_stream_by_name("new/f.jpg").read() == b"f"
        (tree / "new" / "g.jpg").write_bytes(b"g")
        w.wait_for("upload", "new/g.jpg")
        assert any("lost events" in line for line in w.stderr)
        assert db.fs.files.count_documents({"filename": {"$regex": "\\.tmp$"}}) == 0
    finally:
        assert w.stop() == 0


def test_root_replaced_while_events_were_lost_is_watched(gfs, bucket, db, tree, tmp_path):
    """The old root's moving away was lost with the overflow: the pass after it watches the
    directory now at the path."""
    w = Watcher(gfs, tree, "--exclude", "*.tmp")
    try:
        overflow(w, tree)
        os.rename(tree, tmp_path / "old-root")
        (tree / "sub").mkdir(parents=True)
        (tree / "sub" / "f.jpg").write_bytes(b"f")
        w.proc.send_signal(signal.SIGCONT)
        w.wait_for("synced")
        assert bucket.open_download_stream_by_name("sub/f.jpg").read() == b"f"
        (tree / "sub" / "g.jpg").write_bytes(b"g")
        (tree / "top.jpg").write_bytes(b"t")
        got = {e["filename"] for e in w.next_events(2) if e["event"] == "upload"}
        assert got == {"sub/g.jpg", "top.jpg"}
    finally:
        assert w.stop() == 0


@pytest.mark.parametrize("how", ["deleted", "moved away"])
def test_watched_directory_gone_is_fatal(gfs, tree, tmp_path, how):
    w = Watcher(gfs, tree)
    try:
        w.wait_for("ready")
        if how == "deleted":
            shutil.rmtree(tree)
        else:
            os.rename(tree, tmp_path / "elsewhere")
        assert w.wait_exit() == 5
        assert f"the watched directory was {how}" in "".join(w.stderr)
    finally:
        w.stop()


def test_bad_directory_and_backend(gfs, tmp_path):
    r = gfs.run("watch", tmp_path / "nope")
    assert r.rc in (3, 5) and "nope" in r.err
    r = gfs.run("watch", tmp_path, env={"GRIDFSCTL_URI": "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200"})
    assert r.rc == 3 and "cannot reach the backend" in r.err
    r = gfs.run("watch")
    assert r.rc == 2


def disk_state(root):
    """{stored name: sha256} of every regular file under root."""
    out = {}
    for d, dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def stored_state(db, bucket):
    """{name: sha256 of its newest revision}, and the names with more than one revision."""
    out, dups = {}, set()
    for doc in db.fs.files.find({}, {"filename": 1}):
        name = doc["filename"]
        if name in out:
            dups.add(name)
            continue
        try:
            out[name] = hashlib.sha256(bucket.open_download_stream_by_name(name).read()).hexdigest()
        except gridfs.errors.NoFile:
            pass  # removed since the listing: absent, as the next poll will see
        except gridfs.errors.CorruptGridFile:
            # Removed while read (the document goes first, then the chunks):
            # not the tree yet; a file that stays damaged shows as wrong at the deadline.
            out[name] = None
    return out, dups


def wait_state(read_state, root, deadline, pace):
    """Polls read_state() until the bucket holds exactly the tree (names and
    content, one revision each); on time-out, says what differs."""
    want = disk_state(root)
    seen = {}

    def exact():
        seen["got"], seen["dups"] = read_state()
        return seen["got"] == want and not seen["dups"]

    try:
        wait_for(exact, deadline, "the bucket to hold the tree", pace)
    except AssertionError:
        got, dups = seen["got"], seen["dups"]
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))[:10]
        wrong = sorted(n for n in want if n in got and got[n] != want[n])[:10]
        raise AssertionError(f"missing {missing[:10]} ({len(missing)}) extra {extra} wrong {wrong} "
                             f"dups {sorted(dups)[:10]}") from None


def wait_exact(db, bucket, root, deadline=DEADLINE):
    wait_state(lambda: stored_state(db, bucket), root, deadline, 0.05)


def stored_state_bulk(db):
    """stored_state for large buckets: two reads (files, then chunks) instead of two per file."""
    docs, dups = {}, set()
    for doc in db.fs.files.find({}, {"filename": 1, "length": 1}):
        if doc["filename"] in docs:
            dups.add(doc["filename"])
        docs[doc["filename"]] = doc
    parts = {}
    for c in db.fs.chunks.find({}, {"files_id": 1, "n": 1, "data": 1}):
        parts.setdefault(c["files_id"], []).append((c["n"], c["data"]))
    out = {}
    for name, doc in docs.items():
        data = b"".join(d for _, d in sorted(parts.get(doc["_id"], [])))
        out[name] = hashlib.sha256(data).hexdigest() if len(data) == doc["length"] else None
    return out, dups


def wait_exact_bulk(db, root, deadline=DEADLINE):
    """wait_exact through stored_state_bulk: for trees of thousands of files."""
    wait_state(lambda: stored_state_bulk(db), root, deadline, 0.2)


def wait_stderr(w, text):
    wait_for(lambda: any(text in line for line in w.stderr), DEADLINE,
             lambda: f"'{text}' in {w.stderr}", proc=w.proc)


@pytest.fixture
def own_backend(tmp_path):
    """A backend of this test's own, to stop and start."""
    b = Backend(str(tmp_path / "backend"), free_port(), STORAGE)
    b.start()
    yield b
    b.purge()


def on_own_backend(own_backend, tmp_path, name):
    """gridfsctl, a client, the database name and its bucket on the test's own backend."""
    client = own_backend.client()
    return Gridfsctl(own_backend, name, tmp_path), client, client[name], gridfs.GridFSBucket(client[name])


def test_backend_outage_loses_nothing(own_backend, tmp_path, tree):
    gfs, client, db, bucket = on_own_backend(own_backend, tmp_path, "outage")
    env = {"GRIDFSCTL_URI": own_backend.uri + "?serverSelectionTimeoutMS=1000"}
    w = Watcher(gfs, tree, "--delete", env=env)
    try:
        w.wait_for("ready")
        own_backend.stop()
        for i in range(20):
            (tree / f"f{i}.bin").write_bytes(os.urandom(100 + i))
        (tree / "ab" / "old.jpg").unlink()
        (tree / "f0.bin").write_bytes(b"rewritten during the outage")
        down = w.wait_for("backend-down")
        w.proc.send_signal(signal.SIGUSR1)
        status = w.wait_for("status")
        assert status["backend"] is False and status["pending"] >= 1 and "since" in status
        own_backend.start()
        up = w.wait_for("backend-up")
        assert up["pending"] >= down["pending"]
        wait_exact(db, bucket, tree)
        downs = sum("backend unreachable:" in line for line in w.stderr)
        assert downs == 1, w.stderr  # once per outage, not once per file
    finally:
        assert w.stop() == 0
        client.close()


def test_backend_stopped_40_s_during_a_burst(own_backend, tmp_path, tree):
    """The issue's case: 40 s down, longer than the driver's own wait for a server, with changes
    written all along; exact within seconds of the backend's return."""
    gfs, client, db, bucket = on_own_backend(own_backend, tmp_path, "outage40")
    w = Watcher(gfs, tree, "--delete")
    try:
        w.wait_for("ready")
        own_backend.stop()
        stopped = time.monotonic()
        i = 0
        while time.monotonic() - stopped < 40:
            (tree / f"f{i}.bin").write_bytes(os.urandom(100 + i))
            if i % 5 == 4:
                (tree / f"f{i - 2}.bin").write_bytes(b"rewritten %d" % i)
                (tree / f"f{i - 4}.bin").unlink()
            i += 1
            time.sleep(0.5)  # the burst's pace over the outage, not synchronisation
        assert i >= 40
        (tree / "ab" / "old.jpg").unlink()
        own_backend.start()
        w.wait_for("backend-up")
        wait_exact(db, bucket, tree)
    finally:
        assert w.stop() == 0
        client.close()


def test_removal_then_folder_move_during_an_outage(own_backend, tmp_path, tree):
    """The same removal and folder move while the backend is down: both wait, in order."""
    gfs, client, db, bucket = on_own_backend(own_backend, tmp_path, "outagemove")
    (tree / "h").mkdir()
    (tree / "h" / "f1.txt").write_bytes(b"one")
    (tree / "h" / "f2.txt").write_bytes(b"two")
    env = {"GRIDFSCTL_URI": own_backend.uri + "?serverSelectionTimeoutMS=1000"}
    w = Watcher(gfs, tree, "--delete", env=env)
    try:
        w.wait_for("ready")
        own_backend.stop()
        (tree / "h" / "new.txt").write_bytes(b"new")  # something to try, so that the outage is seen
        w.wait_for("backend-down")
        (tree / "h" / "f1.txt").unlink()
        os.rename(tree / "h", tree / "h2")
        own_backend.start()
        w.wait_for("backend-up")
        w.wait_for("delete", "h/f1.txt")
        w.wait_for("move-folder", "h2")
        wait_exact(db, bucket, tree)
        assert db.fs.files.count_documents({"filename": "h2/f1.txt"}) == 0
    finally:
        assert w.stop() == 0
        client.close()


def renamed_queue(tree, count):
    """count files under tree/q, to be stored by a first pass; returns a function that renames
    them all at once, as a queue of single-file moves."""
    (tree / "q").mkdir()
    for i in range(count):
        (tree / "q" / f"{i}.txt").write_bytes(b"%d" % i)

    def rename():
        for i in range(count):
            os.rename(tree / "q" / f"{i}.txt", tree / "q" / f"{i}.moved")
    return rename


def test_status_is_answered_while_a_batch_waits_on_the_backend(gfs, backend, tree):
    """Renames in flight on a backend that stopped answering: SIGUSR1 is answered at once,
    counting them, not after the call gives up."""
    rename = renamed_queue(tree, 150)
    proxy = FreezingProxy(backend.port, FILES_UPDATE)
    env = {"GRIDFSCTL_URI": proxy.uri, "GRIDFSCTL_TIMEOUT": "3"}
    w = Watcher(gfs, tree, "--delete", env=env)
    try:
        w.wait_for("ready")
        rename()
        wait_for(proxy.frozen.is_set, DEADLINE, "the renames to reach the backend", proc=w.proc)
        asked = time.monotonic()
        w.proc.send_signal(signal.SIGUSR1)
        status = w.wait_for("status")
        assert time.monotonic() - asked < 1.0
        # the batch is what watch had read of the renames when its turn began (the rest wait in
        # inotify's queue, read between turns)
        assert 0 < status["inFlight"] <= status["pending"] <= 150, status
        assert status["backend"] is True and status["retrying"] == 0, status
    finally:
        proxy.close()
        assert w.stop() == 1  # the frozen backend left the renames not acted on, and said so
    assert "not acted on" in "".join(w.stderr)


def test_past_the_bound_a_full_pass_replaces_the_changes(own_backend, tmp_path, tree):
    """More changes wait than --max-pending allows while the backend is down: they give way to
    one full pass, owed until the backend is back, which ends exact (removals included)."""
    gfs, client, db, bucket = on_own_backend(own_backend, tmp_path, "bound")
    (tree / "keep").mkdir()
    (tree / "keep" / "moved.jpg").write_bytes(b"moved later")
    env = {"GRIDFSCTL_URI": own_backend.uri + "?serverSelectionTimeoutMS=1000"}
    w = Watcher(gfs, tree, "--delete", "--max-pending", "10", env=env)
    try:
        w.wait_for("ready")
        own_backend.stop()
        (tree / "first.bin").write_bytes(b"first")
        w.wait_for("backend-down")
        for i in range(40):
            (tree / f"d{i % 4}").mkdir(exist_ok=True)
            (tree / f"d{i % 4}" / f"{i}.bin").write_bytes(os.urandom(50 + i))
        (tree / "ab" / "old.jpg").unlink()
        os.rename(tree / "keep" / "moved.jpg", tree / "d0" / "moved.jpg")
        (tree / "first.bin").write_bytes(b"first, rewritten")
        wait_stderr(w, "more than 10 changes wait")
        w.proc.send_signal(signal.SIGUSR1)
        status = w.wait_for("status")
        assert status["backend"] is False and status["passOwed"] is True
        assert status["pending"] <= 10
        own_backend.start()
        w.wait_for("backend-up")
        w.wait_for("synced")
        wait_exact(db, bucket, tree)
    finally:
        assert w.stop() == 0
        client.close()


def test_file_moved_over_one_with_same_size_and_mtime(gfs, bucket, db, tree, tmp_path):
    w = Watcher(gfs, tree)
    try:
        w.wait_for("ready")
        old = tree / "ab" / "old.jpg"
        st = old.stat()
        new = tmp_path / "new.jpg"
        new.write_bytes(b"new poster")  # the same length as "old poster"
        os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))  # what cp -p, rsync -t and tar do
        os.rename(new, old)
        w.wait_for("replace", "ab/old.jpg")
        assert bucket.open_download_stream_by_name("ab/old.jpg").read() == b"new poster"
    finally:
        assert w.stop() == 0


def test_folder_rename_writes_no_chunk(gfs, bucket, db, tree, tmp_path):
    big = tree / "big"
    big.mkdir()
    for i in range(1000):
        (big / f"{i}.txt").write_bytes(b"%d" % i)
    w = Watcher(gfs, tree, "--delete")
    try:
        w.wait_for("ready")
        chunks = db.fs.chunks.count_documents({})
        os.rename(big, tree / "renamed")
        ev = w.wait_for("move-folder", "renamed")
        assert ev["from"] == "big" and ev["files"] == 1000
        assert db.fs.chunks.count_documents({}) == chunks
        assert db.fs.files.count_documents({"filename": {"$regex": "^big/"}}) == 0
        assert db.fs.files.count_documents({"filename": {"$regex": "^renamed/"}}) == 1000
        assert bucket.open_download_stream_by_name("renamed/999.txt").read() == b"999"
        server = Server(gfs, tmp_path)
        try:
            for i in (0, 500, 999):
                status, _, body = server.get(f"/renamed/{i}.txt")
                assert (status, body) == (200, b"%d" % i)
            assert server.get("/big/999.txt")[0] == 404
        finally:
            server.stop()
    finally:
        assert w.stop() == 0


def test_bursts_of_everyday_changes_end_exact(gfs, bucket, db, tree):
    w = Watcher(gfs, tree, "--delete")
    try:
        w.wait_for("ready")
        # an editor's save: a temporary file renamed over the real one
        (tree / "ab" / ".old.jpg.swp").write_bytes(b"saved by the editor")
        os.rename(tree / "ab" / ".old.jpg.swp", tree / "ab" / "old.jpg")
        # mkdir -p of a deep tree with files, in one burst
        deep = tree / "a" / "b" / "c" / "d" / "e"
        deep.mkdir(parents=True)
        for i in range(30):
            (deep.parent / f"{i}.txt").write_bytes(b"x" * i)
            (deep / f"{i}.txt").write_bytes(b"y" * i)
        # moved within, then the new name moved on before anything settled
        (tree / "m1").write_bytes(b"moving")
        os.rename(tree / "m1", tree / "m2")
        os.rename(tree / "m2", tree / "a" / "m3")
        wait_exact(db, bucket, tree)
        # rm -rf of a subtree
        shutil.rmtree(tree / "a" / "b")
        wait_exact(db, bucket, tree)
    finally:
        assert w.stop() == 0


def test_kill_9_mid_burst_then_restart_is_exact(gfs, bucket, db, tree):
    w = Watcher(gfs, tree, "--delete")
    w.wait_for("ready")
    for i in range(2000):
        (tree / f"d{i % 10}").mkdir(exist_ok=True)
        (tree / f"d{i % 10}" / f"{i}.bin").write_bytes(os.urandom(2000))
        if i == 1000:
            w.wait_for("upload")  # batches are being written: the kill lands mid-burst
            (tree / "ab" / "old.jpg").unlink()
    w.proc.kill()
    w.proc.wait()
    for i in range(2000, 2020):
        (tree / f"{i}.bin").write_bytes(os.urandom(2000))
    os.rename(tree / "d0" / "0.bin", tree / "zero.bin")
    w = Watcher(gfs, tree, "--delete")
    try:
        w.wait_for("ready")
        wait_exact_bulk(db, tree, deadline=1)  # exact when ready: the first pass made it so
    finally:
        assert w.stop() == 0


def hold_import_lock(db, name="import"):
    """The import lock name, held by a live process of another host for five minutes; its
    document."""
    held = {"_id": name, "owner": "elsewhere.example/boot/4242/1", "host": "elsewhere.example",
            "bootId": "boot", "pid": 4242, "startTime": 1,
            "expires": datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=5)}
    db["fs.gridfsctl_locks"].insert_one(held)
    return held


def test_burst_stored_while_another_import_holds_the_lock(gfs, bucket, db, tree):
    """A burst goes in batches through import's workers, which need the import lock: while
    another import holds it, the files go one by one and are stored all the same."""
    w = Watcher(gfs, tree)
    try:
        w.wait_for("ready")
        held = hold_import_lock(db)
        sizes = {f"b/{i}.bin": 10 + i for i in range(30)}
        (tree / "b").mkdir()
        for name, size in sizes.items():
            (tree / name).write_bytes(os.urandom(size))
        got = {e["filename"]: e["bytes"] for e in w.next_events(30) if e["event"] == "upload"}
        assert got == sizes
        wait_exact(db, bucket, tree)
        assert db["fs.gridfsctl_locks"].find_one({"_id": "import"})["owner"] == held["owner"]
    finally:
        assert w.stop() == 0


def revisions(db, names):
    return {n: db.fs.files.count_documents({"filename": n}) for n in names}


def wait_all(w, event, names):
    """Waits for event on every name, in whatever order they come."""
    left = set(names)
    while left:
        left.discard(w.wait_for(event)["filename"])


def store_sentinel(w, tree, name):
    """Waits until watch has stored a file written now: the batches before it are over."""
    (tree / name).write_bytes(os.urandom(64))
    w.wait_for("upload", name)


def test_names_another_import_stored_are_not_stored_twice(gfs, bucket, db, tree, tmp_path):
    """watch stores a burst of new names without asking the server for each, trusting what it
    knows of the bucket; an import that held the lock since watch last did ends that trust."""
    w = Watcher(gfs, tree)
    try:
        w.wait_for("ready")
        other = tmp_path / "other"
        (other / "b").mkdir(parents=True)
        same = {f"b/{i}.bin": os.urandom(100 + i) for i in range(10)}
        differ = {f"b/{i}.bin": os.urandom(100 + i) for i in range(10, 20)}
        for name, data in {**same, **differ}.items():
            (other / name).write_bytes(data)
        r = gfs.run("import", other)
        assert r.rc == 0, r
        (tree / "b").mkdir()
        for name, data in same.items():
            (tree / name).write_bytes(data)  # the bytes the import stored: nothing to do
        for name in differ:
            (tree / name).write_bytes(os.urandom(50))
        wait_all(w, "replace", differ)
        store_sentinel(w, tree, "sentinel.bin")
        assert revisions(db, [*same, *differ]) == {n: 1 for n in [*same, *differ]}
        wait_exact(db, bucket, tree)
    finally:
        assert w.stop() == 0


def test_a_name_another_import_stored_meanwhile_is_trimmed_once_it_is_done(gfs, bucket, db, tree):
    """watch stores a file one by one while an import holds the lock, and the import stores the
    same name after watch's trim: two revisions. Once the lock is free and its takes say another
    held it, watch trims the names it stored meanwhile, without waiting for its next start."""
    locks = db["fs.gridfsctl_locks"]
    w = Watcher(gfs, tree)
    try:
        w.wait_for("ready")
        hold_import_lock(db)
        data = os.urandom(300)
        (tree / "same.bin").write_bytes(data)
        w.wait_for("upload", "same.bin")
        # the import's own upload of the name, landing after watch's trim, then its release
        locks.update_one({"_id": "import.taken"}, {"$inc": {"n": 1}}, upsert=True)
        bucket.upload_from_stream("same.bin", data)
        assert revisions(db, ["same.bin"]) == {"same.bin": 2}
        locks.delete_one({"_id": "import"})
        wait_for(lambda: revisions(db, ["same.bin"]) == {"same.bin": 1}, DEADLINE,
                 "one revision of same.bin", proc=w.proc)
        assert bucket.open_download_stream_by_name("same.bin").read() == data
        wait_exact(db, bucket, tree)
    finally:
        assert w.stop() == 0


def test_under_a_prefix_the_lock_of_the_prefix_is_the_one_watched(gfs, bucket, db, tree):
    """The same with watch --prefix: another import of that prefix holds import:p/ (not the
    whole bucket's lock); watch waits for it and counts its takes, then trims."""
    locks = db["fs.gridfsctl_locks"]
    w = Watcher(gfs, tree, "--prefix", "p")
    try:
        w.wait_for("ready")
        hold_import_lock(db, "import:p/")
        data = os.urandom(300)
        (tree / "same.bin").write_bytes(data)
        w.wait_for("upload", "p/same.bin")
        locks.update_one({"_id": "import:p/.taken"}, {"$inc": {"n": 1}}, upsert=True)
        bucket.upload_from_stream("p/same.bin", data)
        assert revisions(db, ["p/same.bin"]) == {"p/same.bin": 2}
        locks.delete_one({"_id": "import:p/"})
        wait_for(lambda: revisions(db, ["p/same.bin"]) == {"p/same.bin": 1}, DEADLINE,
                 "one revision of p/same.bin", proc=w.proc)
        assert bucket.open_download_stream_by_name("p/same.bin").read() == data
    finally:
        assert w.stop() == 0


def test_names_moved_with_their_folder_are_still_known(gfs, bucket, db, tree):
    """After a folder rename, a change under the new name is a new revision of the moved file,
    not a second file of the same name."""
    (tree / "f").mkdir()
    names = [f"{i}.txt" for i in range(10)]
    for n in names:
        (tree / "f" / n).write_bytes(b"first " + n.encode())
    w = Watcher(gfs, tree, "--delete")
    try:
        w.wait_for("ready")
        os.rename(tree / "f", tree / "g")
        w.wait_for("move-folder", "g")
        for n in names:
            (tree / "g" / n).write_bytes(b"second " + n.encode())
        wait_all(w, "replace", [f"g/{n}" for n in names])
        assert revisions(db, [f"g/{n}" for n in names]) == {f"g/{n}": 1 for n in names}
        os.rename(tree / "g" / "0.txt", tree / "moved.txt")
        w.wait_for("move", "moved.txt")
        (tree / "moved.txt").write_bytes(b"third")
        w.wait_for("replace", "moved.txt")
        assert revisions(db, ["moved.txt", "g/0.txt"]) == {"moved.txt": 1, "g/0.txt": 0}
        wait_exact(db, bucket, tree)
    finally:
        assert w.stop() == 0


def test_ten_thousand_files_copied_in_at_once(gfs, db, tree, tmp_path):
    staging = tmp_path / "staging"
    for i in range(10000):
        d = staging / f"s{i // 1000}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i}.jpg").write_bytes(os.urandom(100 + i % 900))
    w = Watcher(gfs, tree, "--delete")
    try:
        w.wait_for("ready")
        subprocess.run(["cp", "-r", str(staging), str(tree / "burst")], check=True)
        wait_for(lambda: db.fs.files.count_documents({}) >= 10001, 600,
                 lambda: f"10001 files; {w.stderr[-5:]}", pace=0.2, proc=w.proc)
        wait_exact_bulk(db, tree)
    finally:
        assert w.stop() == 0


def test_unwatched_directories_are_named_and_rescanned(gfs, bucket, db, tree):
    for i in range(12):
        (tree / f"d{i}").mkdir()
    # a user namespace of the test's own: the limit reached is its own, not the machine's
    wrap = ["unshare", "-Ur", "sh", "-c", 'echo 5 > /proc/sys/user/max_inotify_watches && exec "$@"', "sh"]
    w = Watcher(gfs, tree, "--rescan-every", "1", wrap=wrap)
    try:
        ready = w.wait_for("ready")
        assert ready["directories"] == 5 and ready["unwatched"] == 9
        err = "".join(w.stderr)
        assert "fs.inotify.max_user_watches" in err
        assert sum("cannot watch" in line for line in w.stderr) == 9
        (tree / "d11" / "late.txt").write_bytes(b"late")
        (tree / "d0" / "late.txt").write_bytes(b"late")
        wait_for(lambda: db.fs.files.count_documents({"filename": {"$regex": "late"}}) >= 2,
                 DEADLINE, lambda: f"both late.txt stored; {w.stderr}", pace=0.05)
    finally:
        assert w.stop() == 0

    w = Watcher(gfs, tree, "--unwatched", "fail", wrap=wrap)
    assert w.wait_exit() == 5
    assert "cannot be watched" in "".join(w.stderr)


def test_ready_is_notified_after_the_first_pass(gfs, tree, tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(DEADLINE)
    w = Watcher(gfs, tree, env={"NOTIFY_SOCKET": str(tmp_path / "notify")})
    try:
        msg = sock.recv(4096).decode()
        assert msg.startswith("READY=1\n"), msg
        assert w.events.get(timeout=DEADLINE)["event"] == "synced"  # printed before READY was sent
        assert w.events.get(timeout=DEADLINE)["event"] == "ready"
    finally:
        assert w.stop() == 0
        assert sock.recv(4096) == b"STOPPING=1"
        sock.close()
