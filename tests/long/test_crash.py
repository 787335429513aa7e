"""Crash safety: import, mirror, put, get and watch killed with SIGKILL at
random moments, then run again cleanly. After every clean re-run: verify
--against is clean, no orphan chunk, no leftover temporary file, no name
stored twice, every stored file complete.

The kill comes after a random delay drawn from the seeded stream (conftest):
this is fault injection, not synchronisation; the assertions are all on the
state after the clean re-run."""
import os
import subprocess
import time


from longsuite import LONG, count, rng, tally  # noqa: F401 (fixtures)
from state import duplicated_names, incomplete_files, orphan_chunks, stored, temp_files, tree_files
from test_watch import Watcher

pytestmark = LONG
KILLS = 20


def body(rng, size):
    return rng.randbytes(size)


def fill(root, rng, n=30):
    for i in range(n):
        p = root / f"d{i % 4}" / f"f{i:03d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(body(rng, rng.choice([10, 3000, 40_000, 150_000])))


def mutate(root, rng, n=6):
    """Rewrites n random files and adds one, so that every run has work to do."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    for p in rng.sample(files, min(n, len(files))):
        p.write_bytes(body(rng, rng.choice([10, 5000, 60_000, 200_000])))
    new = root / "new" / f"n{len(files):04d}.bin"
    new.parent.mkdir(exist_ok=True)
    new.write_bytes(body(rng, 30_000))


def kill_at_random(proc, rng, window):
    """SIGKILL after a random delay in [0, window] (or when it is done first)."""
    try:
        proc.wait(timeout=rng.uniform(0, window))
        return False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return True


def killed_run(gfs, rng, window, tally, *args):
    """Runs gridfsctl args and SIGKILLs it at a random moment; True when the kill met it running."""
    proc = gfs.popen(*args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    hit = kill_at_random(proc, rng, window)
    tally.injected += hit
    return hit


def rounds(tally):
    """Rounds until KILLS (scaled) kills have met a running process, at most three times as many."""
    n = count(KILLS)
    for _ in range(3 * n):
        if tally.injected >= n:
            return
        yield


def timed(fn):
    t = time.monotonic()
    fn()
    return time.monotonic() - t


def assert_clean(gfs, db, tree):
    res = gfs.run("verify", "--against", tree)
    assert res.rc == 0, res
    assert orphan_chunks(db) == []
    assert duplicated_names(db) == []
    assert incomplete_files(db) == []
    assert temp_files(tree) == []


def ok(res):
    assert res.rc == 0, res
    return res


def test_import_killed(gfs, db, tmp_path, rng, tally):
    src = tmp_path / "src"
    fill(src, rng)
    window = timed(lambda: ok(gfs.run("import", src))) * 1.5
    for _ in rounds(tally):
        mutate(src, rng)
        hit = killed_run(gfs, rng, window, tally, "import", src, "-j", "2", "--batch-size", "64K")
        ok(gfs.run("import", src))
        assert_clean(gfs, db, src)
        assert db["fs.gridfsctl_uploads"].count_documents({}) == 0
        tally.survived += hit


def test_mirror_killed(gfs, db, tmp_path, rng, tally):
    src, dst = tmp_path / "src", tmp_path / "dst"
    fill(src, rng)
    ok(gfs.run("import", src))
    window = timed(lambda: ok(gfs.run("mirror", dst))) * 1.5
    for _ in rounds(tally):
        mutate(src, rng)
        ok(gfs.run("import", src))
        # Half the local copies gone too, so that the run has as much to write as the window allows.
        for p in rng.sample(sorted(tree_files(dst)), len(tree_files(dst)) // 2):
            os.unlink(dst / p)
        hit = killed_run(gfs, rng, window, tally, "mirror", dst, "-j", "2")
        ok(gfs.run("mirror", dst))
        assert tree_files(dst) == tree_files(src)
        assert_clean(gfs, db, dst)
        tally.survived += hit


def test_put_killed(gfs, db, tmp_path, rng, tally):
    f = tmp_path / "big.bin"
    f.write_bytes(body(rng, 1_500_000))
    window = timed(lambda: ok(gfs.run("put", f, "--chunk-size", "16K"))) * 1.5
    for _ in rounds(tally):
        f.write_bytes(body(rng, 1_500_000))
        hit = killed_run(gfs, rng, window, tally, "put", f, "--chunk-size", "16K")
        ok(gfs.run("put", f, "--chunk-size", "16K"))
        assert stored(db) == {"big.bin": f.read_bytes()}
        assert duplicated_names(db) == []
        assert incomplete_files(db) == []
        assert orphan_chunks(db) == [], "a killed put left chunks the next put did not remove"
        tally.survived += hit


def test_get_killed(gfs, db, tmp_path, rng, tally):
    f = tmp_path / "big.bin"
    f.write_bytes(body(rng, 3_000_000))
    ok(gfs.run("put", f, "--chunk-size", "16K"))
    out = tmp_path / "out"
    out.mkdir()
    window = timed(lambda: ok(gfs.run("get", "big.bin", "-o", out / "big.bin"))) * 1.5
    for _ in rounds(tally):
        hit = killed_run(gfs, rng, window, tally, "get", "big.bin", "-o", out / "big.bin", "--force")
        if (out / "big.bin").exists():
            assert (out / "big.bin").read_bytes() == f.read_bytes(), "a partial file in place"
        ok(gfs.run("get", "big.bin", "-o", out / "big.bin", "--force"))
        assert tree_files(out) == {"big.bin": f.read_bytes()}, "leftover temporary file"
        tally.survived += hit


def test_watch_killed(gfs, db, tmp_path, rng, tally):
    src = tmp_path / "src"
    fill(src, rng, 12)
    for _ in rounds(tally):
        w = Watcher(gfs, src, "--delete")
        # A large file among the changes, so that some kills land inside an upload.
        (src / "new").mkdir(exist_ok=True)
        (src / "new" / "large.bin").write_bytes(body(rng, 1_000_000))
        for _ in range(rng.randint(1, 4)):
            mutate(src, rng, 2)
            time.sleep(rng.uniform(0, 0.4))  # pacing the changes, not waiting for anything
        hit = w.proc.poll() is None
        w.proc.kill()
        w.proc.wait()
        tally.injected += hit
        w = Watcher(gfs, src, "--delete")
        try:
            w.wait_for("ready")
        finally:
            assert w.stop() == 0
        assert_clean(gfs, db, src)
        tally.survived += hit
