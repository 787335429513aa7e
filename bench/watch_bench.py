#!/usr/bin/env python3
"""watch: latency from close() to readable through pymongo, and a burst's throughput against import.

    python3 bench/watch_bench.py [--bin ./gridfsctl] [--stored 2200] [--samples 100] [--burst 10000]

Starts a backend of its own (scripts/backend, a free port, a temporary directory), stores --stored
files with a first pass, then writes --samples files one at a time, each once the previous one is
readable, and times close() to the first pymongo read that finds it. Then writes --burst files at
once and times until all are stored, and imports the same files into another database with
`gridfsctl import` for comparison. Prints one line per measure.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pymongo

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from conftest import Backend, free_port  # noqa: E402


def start_watch(binary, uri, db, tree):
    env = dict(os.environ, GRIDFSCTL_URI=uri, GRIDFSCTL_CONFIG="/dev/null")
    p = subprocess.Popen([binary, "watch", tree, "--json", "--db", db], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    for line in p.stdout:
        if json.loads(line)["event"] == "ready":
            return p
    sys.exit("watch exited before it was ready")


def poll(cond, deadline):
    end = time.monotonic() + deadline
    while not cond():
        if time.monotonic() > end:
            sys.exit("timed out")
        time.sleep(0.001)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="./gridfsctl")
    ap.add_argument("--stored", type=int, default=2200)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--burst", type=int, default=10000)
    a = ap.parse_args()
    top = tempfile.mkdtemp(prefix="watch_bench.")
    b = Backend(os.path.join(top, "backend"), free_port(), "postgresql")
    b.start()
    try:
        c = b.client()
        db = c.bench
        tree = os.path.join(top, "tree")
        for i in range(a.stored):
            d = os.path.join(tree, f"d{i // 100}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, f"{i}.jpg"), "wb") as f:
                f.write(os.urandom(2000))
        w = start_watch(a.bin, b.uri, "bench", tree)
        lat = []
        for i in range(a.samples):
            name = f"sample{i}.jpg"
            with open(os.path.join(tree, name), "wb") as f:
                f.write(os.urandom(2000))
            t0 = time.monotonic()
            poll(lambda: db.fs.files.find_one({"filename": name}, {"_id": 1}), 30)
            lat.append((time.monotonic() - t0) * 1000)
        lat.sort()
        print(f"latency close->readable, {a.stored} stored: p50 {lat[len(lat) // 2]:.1f} ms, "
              f"p99 {lat[min(len(lat) - 1, int(len(lat) * 0.99))]:.1f} ms ({a.samples} samples)")

        burst = os.path.join(tree, "burst")
        staging = os.path.join(top, "staging")
        os.makedirs(staging)
        for i in range(a.burst):
            with open(os.path.join(staging, f"{i}.jpg"), "wb") as f:
                f.write(os.urandom(2000))
        os.makedirs(burst)
        t0 = time.monotonic()
        for i in range(a.burst):
            shutil.copyfile(os.path.join(staging, f"{i}.jpg"), os.path.join(burst, f"{i}.jpg"))
        poll(lambda: db.fs.files.count_documents({"filename": {"$regex": "^burst/"}}) >= a.burst, 600)
        watch_s = time.monotonic() - t0
        w.terminate()
        w.wait()
        env = dict(os.environ, GRIDFSCTL_URI=b.uri, GRIDFSCTL_CONFIG="/dev/null")
        t0 = time.monotonic()
        subprocess.run([a.bin, "-q", "import", staging, "--prefix", "burst", "--db", "imp"], env=env,
                       check=True, stdout=subprocess.DEVNULL)
        import_s = time.monotonic() - t0
        print(f"burst of {a.burst} files: watch {a.burst / watch_s:.0f} files/s ({watch_s:.1f} s), "
              f"import {a.burst / import_s:.0f} files/s ({import_s:.1f} s), "
              f"ratio {import_s / watch_s:.2f}x")
        c.close()
    finally:
        b.purge()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
