#!/usr/bin/env python3
"""Benchmark: two imports of disjoint folders of one bucket, one after the
other and at once (issue 31: the import lock is per prefix, so they no
longer exclude each other).

Generates two poster trees of N files each (bench/gen_posters.py, seeds 1
and 2), then per turn, into a fresh database each time:

  serial      import A --prefix posters/a, then import B --prefix posters/b
  concurrent  both started together, each in its own process

and prints the wall time of each (median over the turns) as JSON lines and a
Markdown row. Before the per-prefix lock the second of two concurrent imports
exited 6 at once (lock held), so "concurrent" was not possible at all.

    flock /tmp/gridfsctl-bench.lock bench/prefix_lock_bench.py --files 500 --turns 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchlib import BIN, ROOT


def tree(base, seed, n):
    d = os.path.join(base, f"seed{seed}-{n}")
    if not os.path.isdir(d):
        subprocess.run([sys.executable, os.path.join(ROOT, "bench/gen_posters.py"), d, str(n),
                        "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)
    return d


def start(binary, env, db, src, prefix):
    return subprocess.Popen([binary, "import", src, "--prefix", prefix, "--db", db],
                            env=env, stdout=subprocess.DEVNULL)


def finish(procs):
    for p in procs:
        if p.wait() != 0:
            sys.exit(f"an import failed ({p.returncode}): {p.args}")


def turn(binary, env, client, db, a, b, together):
    client.drop_database(db)
    t0 = time.monotonic()
    if together:
        finish([start(binary, env, db, a, "posters/a"), start(binary, env, db, b, "posters/b")])
    else:
        finish([start(binary, env, db, a, "posters/a")])
        finish([start(binary, env, db, b, "posters/b")])
    secs = time.monotonic() - t0
    stored = client[db].fs.files.count_documents({})
    client.drop_database(db)
    return secs, stored


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=500, help="files per folder")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--port", type=int, default=27117)
    ap.add_argument("--datadir", default="/tmp/gridfsctl-bench-prefix")
    ap.add_argument("--storage", default="sqlite")
    ap.add_argument("--trees", default="/tmp/gridfsctl-bench-prefix-trees")
    ap.add_argument("--binary", default=BIN)
    a = ap.parse_args()
    import pymongo
    uri = f"mongodb://127.0.0.1:{a.port}/"
    try:
        pymongo.MongoClient(uri, serverSelectionTimeoutMS=1000).admin.command("ping")
    except Exception:
        subprocess.run([os.path.join(ROOT, "scripts/backend"), "start", a.datadir, str(a.port),
                        a.storage], check=True, stdout=subprocess.DEVNULL)
    client = pymongo.MongoClient(uri)
    ta, tb = tree(a.trees, 1, a.files), tree(a.trees, 2, a.files)
    env = dict(os.environ, GRIDFSCTL_URI=uri, GRIDFSCTL_CONFIG="/dev/null")
    times = {"serial": [], "concurrent": []}
    for _ in range(a.turns):
        for mode in times:
            secs, stored = turn(a.binary, env, client, "bench_prefix_lock", ta, tb, mode == "concurrent")
            if stored != 2 * a.files:
                sys.exit(f"{mode}: {stored} files stored, not {2 * a.files}")
            times[mode].append(secs)
            print(json.dumps({"mode": mode, "files": 2 * a.files, "seconds": round(secs, 2)}))
    s, c = statistics.median(times["serial"]), statistics.median(times["concurrent"])
    print(f"| {2 * a.files} files, {a.storage} | {s:.2f} s | {c:.2f} s | {s / c:.2f}x |")


if __name__ == "__main__":
    main()
