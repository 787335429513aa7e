"""Readers while writers write: import and watch store new versions while
serve and verify read. Every body a reader gets must be one of the known
versions of that name (checked by sha256): never a partial or mixed file.
verify, run over and over meanwhile, must find no damage."""
import hashlib
import os
import threading
import pytest

from longsuite import LONG, count, rng, tally  # noqa: F401 (fixtures)
from test_serve import Server
from test_watch import Watcher

pytestmark = LONG
NAMES = [f"d{i % 3}/f{i:02d}.bin" for i in range(9)]
SIZES = [100, 20_000, 300_000]


def version(name, v):
    seed = hashlib.sha256(f"{name}:{v}".encode()).digest()
    size = SIZES[(seed[0] + v) % len(SIZES)]
    return (seed * (size // len(seed) + 1))[:size]


def write_atomic(root, name, data):
    p = root / name
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.parent / f".{p.name}.writing"  # hidden: neither import nor watch takes it
    tmp.write_bytes(data)
    os.rename(tmp, p)


def workload(gfs, tmp_path, rng, tally, http_readers, verifiers):
    """Writes rounds of new versions through import (src) and watch (wdir,
    prefix w/) while http_readers threads read through serve and verifiers
    threads run verify. Returns (bad reads, verify outputs that were not clean)."""
    src, wdir = tmp_path / "src", tmp_path / "wdir"
    rounds = count(30)
    known = {}
    for name in NAMES:
        for v in range(rounds + 1):
            known.setdefault(name, set()).add(hashlib.sha256(version(name, v)).hexdigest())
            known.setdefault("w/" + name, set()).add(hashlib.sha256(version("w/" + name, v)).hexdigest())
        write_atomic(src, name, version(name, 0))
        write_atomic(wdir, name, version("w/" + name, 0))
    assert gfs.run("import", src).rc == 0
    srv = Server(gfs, tmp_path, "--negative-ttl", "0")
    watcher = Watcher(gfs, wdir, "--prefix", "w")
    watcher.wait_for("ready")
    stop = threading.Event()
    bad, seen, verify_runs, verify_bad = [], [0], [0], []

    def reader():
        while not stop.is_set():
            for name in list(known):
                try:
                    status, _, body = srv.get("/" + name)
                except OSError as e:
                    bad.append((name, repr(e)))
                    continue
                seen[0] += 1
                if status == 200 and hashlib.sha256(body).hexdigest() not in known[name]:
                    bad.append((name, len(body)))
                elif status not in (200, 404, 503):
                    bad.append((name, status))

    def verifier():
        while not stop.is_set():
            res = gfs.run("verify", timeout=300)
            verify_runs[0] += 1
            if res.rc != 0:
                verify_bad.append(res.text[-500:])

    threads = ([threading.Thread(target=reader) for _ in range(http_readers)] +
               [threading.Thread(target=verifier) for _ in range(verifiers)])
    for t in threads:
        t.start()
    try:
        for v in range(1, rounds + 1):
            for name in rng.sample(NAMES, 3):
                write_atomic(src, name, version(name, v))
                write_atomic(wdir, name, version("w/" + name, v))
            res = gfs.run("import", src, timeout=300)
            assert res.rc == 0, res.err
            tally.injected += 1
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)
        assert watcher.stop() == 0
        srv.stop()
    tally.notes.append(f"rounds={rounds} reads={seen[0]} verify_runs={verify_runs[0]} "
                       f"bad_reads={len(bad)} verify_problems={len(verify_bad)}")
    return bad, verify_bad


def test_readers_see_only_whole_versions(gfs, tmp_path, rng, tally):
    bad, _ = workload(gfs, tmp_path, rng, tally, http_readers=2, verifiers=0)
    assert bad == [], bad[:10]
    tally.survived = tally.injected


def test_verify_during_writes_finds_no_damage(gfs, tmp_path, rng, tally):
    bad, verify_bad = workload(gfs, tmp_path, rng, tally, http_readers=1, verifiers=1)
    assert bad == [], bad[:10]
    assert verify_bad == [], verify_bad[:3]
    tally.survived = tally.injected
