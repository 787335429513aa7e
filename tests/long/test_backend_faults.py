"""Backend faults: the backend killed (SIGKILL), frozen (SIGSTOP) and
restarted during import, verify, mirror, watch and serve, on a backend of
this module's own (own datadir, own port).

Each command must either finish after reconnecting or exit non-zero within
BOUND seconds with a message; nothing half-written may be visible to a
reader at any point, and a clean re-run afterwards leaves the bucket
matching the tree. The timeouts are set in the URI, so that a frozen backend costs
seconds; test_frozen_backend_documented_bound checks GRIDFSCTL_TIMEOUT, the
documented bound when the URI sets none (docs/reliability.md, F4)."""
import os
import signal
import subprocess
import time

import gridfs
import pytest

from conftest import STORAGE, Backend, Gridfsctl, check_sanitizer_report, free_port, proc_gone, sha256
from longsuite import LONG, rng, tally  # noqa: F401 (fixtures)
from state import incomplete_files, orphan_chunks, stored, temp_files, tree_files
from test_crash import fill, mutate, timed
from test_serve import Server, wait_for
from test_watch import Watcher

pytestmark = LONG
BOUND = 60  # seconds from the fault to the command's exit, with the timeouts below
TIMEOUTS = "socketTimeoutMS=5000&serverSelectionTimeoutMS=5000&connectTimeoutMS=3000"
FAULTS = ["kill", "freeze", "restart"]


def dead(pid):
    return proc_gone(pid)


class FaultBackend(Backend):
    """A backend that can be killed, frozen and brought back."""

    def pid(self):
        with open(os.path.join(self.datadir, "ferretdb.pid")) as f:
            return int(f.read())

    def kill(self):
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: dead(pid), 30, "the backend to die")
        # Where nothing reaps orphans the dead server stays a zombie, which
        # scripts/backend's kill -0 would take for a running one.
        os.unlink(os.path.join(self.datadir, "ferretdb.pid"))

    def freeze(self):
        os.kill(self.pid(), signal.SIGSTOP)

    def thaw(self):
        try:
            os.kill(self.pid(), signal.SIGCONT)
        except (OSError, ValueError):
            pass

    def ensure_up(self):
        self.thaw()
        self.start()  # a no-op when it still answers


@pytest.fixture(scope="module")
def fault_backend(tmp_path_factory):
    b = FaultBackend(str(tmp_path_factory.mktemp("fault-backend")), free_port(), STORAGE)
    b.start()
    yield b
    b.thaw()
    b.purge()


@pytest.fixture
def fb(fault_backend):
    fault_backend.ensure_up()
    yield fault_backend
    fault_backend.ensure_up()


@pytest.fixture
def fdb(fb, request):
    c = fb.client()
    name = "f_" + request.node.name.replace("[", "_").replace("]", "").replace("-", "_")[:40]
    c.drop_database(name)
    yield c[name]
    c.close()
    # A fault leaves this client's pooled connection dead, and dropDatabase
    # is not a command pymongo retries: the clean-up gets a client of its own.
    fb.ensure_up()
    with fb.client() as fresh:
        fresh.drop_database(name)


@pytest.fixture
def fgfs(fb, fdb, tmp_path):
    g = Gridfsctl(fb, fdb.name, tmp_path)
    g.env["GRIDFSCTL_URI"] = fb.uri + "?" + TIMEOUTS
    return g


def inject(fb, fault):
    """Starts the fault; returns what ends it."""
    if fault == "freeze":
        fb.freeze()
        return fb.thaw
    fb.kill()
    if fault == "restart":
        fb.start()
        return lambda: None
    return fb.start


def finish(proc, t_fault, what):
    """Waits for a command that met a fault: it must exit within BOUND."""
    try:
        out, err = proc.communicate(timeout=max(1, BOUND - (time.monotonic() - t_fault)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"{what} still running {BOUND} s after the backend fault")
    err = err.decode("utf-8", "replace")
    check_sanitizer_report(err)
    if proc.returncode != 0:
        assert proc.returncode in (1, 3), (proc.returncode, err)
        assert err.strip(), f"{what} exited {proc.returncode} without a message"
    return proc.returncode, err


def assert_no_partial(fdb):
    assert incomplete_files(fdb) == [], "a reader can see a file that is not complete"


def run_with_fault(fgfs, fb, fault, rng, tally, args, window=1.0):
    proc = fgfs.popen(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(rng.uniform(0.05, window))  # a random moment: fault injection, not synchronisation
    t = time.monotonic()
    hit = proc.poll() is None
    end_fault = inject(fb, fault)
    tally.injected += hit
    # Killed or frozen, the backend stays away until the command gives up or finishes.
    rc, err = finish(proc, t, args[0])
    end_fault()
    fb.ensure_up()
    tally.notes.append(f"{args[0]}/{fault}:rc={rc}" + ("" if hit else "(done-before-fault)"))
    return rc, err


@pytest.mark.parametrize("fault", FAULTS)
def test_import(fgfs, fb, fdb, tmp_path, fault, rng, tally):
    src = tmp_path / "src"
    fill(src, rng, 40)
    # The same import once, timed and then emptied, so that the fault lands inside the real one.
    took = timed(lambda: fgfs.run("import", src, "-j", "2", "--batch-size", "64K"))
    # Emptied, not dropped: the faulted run then finds its collections and
    # indexes in place. FerretDB killed in the middle of creating a
    # collection keeps the table but not its own record of it, and answers
    # every later createIndexes with "relation already exists"; that is the
    # backend's own damage, not what this test is about.
    fdb["fs.files"].delete_many({})
    fdb["fs.chunks"].delete_many({})
    rc, err = run_with_fault(fgfs, fb, fault, rng, tally, ["import", src, "-j", "2", "--batch-size", "64K"],
                             window=took * 0.8)
    assert_no_partial(fdb)
    res = fgfs.run("import", src)
    assert res.rc == 0, res
    assert fgfs.run("verify", "--against", src).rc == 0
    assert orphan_chunks(fdb) == []
    tally.survived += 1


@pytest.mark.parametrize("fault", FAULTS)
def test_verify(fgfs, fb, fdb, tmp_path, fault, rng, tally):
    src = tmp_path / "src"
    fill(src, rng, 40)
    assert fgfs.run("import", src).rc == 0
    took = timed(lambda: fgfs.run("verify", "--against", src))
    rc, err = run_with_fault(fgfs, fb, fault, rng, tally, ["verify", "--against", src], window=took * 0.8)
    if rc != 0:
        assert "backend" in err or "server" in err or "connection" in err.lower() or "timed out" in err, err
    assert fgfs.run("verify", "--against", src).rc == 0
    tally.survived += 1


@pytest.mark.parametrize("fault", FAULTS)
def test_mirror(fgfs, fb, fdb, tmp_path, fault, rng, tally):
    src, dst = tmp_path / "src", tmp_path / "dst"
    fill(src, rng, 40)
    assert fgfs.run("import", src).rc == 0
    assert fgfs.run("mirror", dst).rc == 0
    before = tree_files(src)
    mutate(src, rng, 15)
    assert fgfs.run("import", src).rc == 0
    after = tree_files(src)
    took = timed(lambda: fgfs.run("mirror", tmp_path / "probe", "-j", "2"))
    rc, err = run_with_fault(fgfs, fb, fault, rng, tally, ["mirror", dst, "-j", "2"], window=took * 0.8)
    for name, data in tree_files(dst).items():
        if name.startswith(".") or "/." in name:
            continue
        assert data in (before.get(name), after.get(name)), f"{name}: neither the old nor the new content"
    res = fgfs.run("mirror", dst)
    assert res.rc == 0, res
    assert tree_files(dst) == after
    assert temp_files(dst) == []
    tally.survived += 1


@pytest.mark.parametrize("fault", FAULTS)
def test_watch(fgfs, fb, fdb, tmp_path, fault, rng, tally):
    src = tmp_path / "src"
    fill(src, rng, 10)
    w = Watcher(fgfs, src, "--delete")
    try:
        w.wait_for("ready")
        t = time.monotonic()
        end_fault = inject(fb, fault)
        tally.injected += 1
        (src / "during.bin").write_bytes(rng.randbytes(50_000))
        # The backend away for a moment: watch may wait for it or give up, not hang.
        time.sleep(rng.uniform(0.5, 3))  # how long the fault lasts
        end_fault()
        fb.ensure_up()
        (src / "after.bin").write_bytes(rng.randbytes(50_000))
        if w.proc.poll() is None:
            w.wait_for("upload", "after.bin")
            tally.notes.append(f"watch/{fault}:kept-going")
        else:
            assert w.proc.returncode in (1, 3), w.stderr
            assert "".join(w.stderr).strip(), "watch exited without a message"
            tally.notes.append(f"watch/{fault}:rc={w.proc.returncode}")
        assert time.monotonic() - t < BOUND
        assert_no_partial(fdb)
    finally:
        w.stop()
    assert fgfs.run("import", src, "--delete").rc == 0
    assert fgfs.run("verify", "--against", src).rc == 0
    tally.survived += 1


@pytest.mark.parametrize("fault", ["kill", "freeze", "restart"])
def test_serve(fgfs, fb, fdb, tmp_path, fault, rng, tally):
    src = tmp_path / "src"
    fill(src, rng, 20)
    assert fgfs.run("import", src).rc == 0
    files = tree_files(src)
    srv = Server(fgfs, tmp_path, "--cache-size", "1M", "--negative-ttl", "0")
    try:
        names = sorted(files)
        end_fault = inject(fb, fault)
        tally.injected += 1
        t = time.monotonic()
        answers = {}
        for name in rng.sample(names, 8):
            try:
                status, _, got = srv.get("/" + name)
            except OSError as e:  # a frozen backend may hold a request to its timeout
                answers[type(e).__name__] = answers.get(type(e).__name__, 0) + 1
                continue
            answers[status] = answers.get(status, 0) + 1
            assert status in (200, 503), status
            if status == 200:
                assert got == files[name], f"{name}: a body that is not the stored file"
        end_fault()
        fb.ensure_up()
        wait_for(lambda: srv.get("/_health")[0] == 200, BOUND, "serve to find the backend again")
        for name in names:
            status, _, got = srv.get("/" + name)
            assert (status, got) == (200, files[name]), name
        assert time.monotonic() - t < 2 * BOUND
        tally.notes.append(f"serve/{fault}:{answers}")
    finally:
        srv.stop()
    tally.survived += 1


def test_frozen_backend_documented_bound(fgfs, fb, fdb, rng, tally):
    """Frozen in the middle of a read, with no timeout in the URI: the
    documented bound is GRIDFSCTL_TIMEOUT (gridfsctl(1), TIMEOUTS), after
    which the command exits 3 naming the operation. On an idle machine a
    verify can finish before the random moment comes: such a try met no
    fault and is made again, earlier."""
    body = rng.randbytes(255 * 1024) * 80
    gridfs.GridFSBucket(fdb).upload_from_stream("big.bin", body, metadata={"sha256": sha256(body)})
    fgfs.env["GRIDFSCTL_URI"] = fb.uri
    for attempt in range(6):
        proc = fgfs.popen("verify", env={"GRIDFSCTL_TIMEOUT": "5"}, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.02, 0.4) / (attempt + 1))  # a random moment in the read
        fb.freeze()
        try:
            rc, err = finish(proc, time.monotonic() - BOUND + 40, "verify")
        finally:
            fb.thaw()
        if rc != 0:
            break
        tally.notes.append(f"verify/frozen: finished before the fault (try {attempt + 1})")
    tally.injected += 1
    tally.notes.append(f"verify/frozen-GRIDFSCTL_TIMEOUT=5:rc={rc}")
    assert rc == 3, err
    assert "timed out" in err or "cannot reach" in err, err
    tally.survived += 1
