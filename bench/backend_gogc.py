#!/usr/bin/env python3
"""How the Go collector's setting (GOGC) changes the embedded FerretDB's reads.

Restarts the backend in DATADIR (which must hold database "bench" with a
poster bucket, as bench/serve_bench.py leaves it) once per GOGC value and,
for the same random files each time, times one chunks read (find by files_id,
sorted by n: what serve does on a cache miss) and one files lookup by name,
one at a time: median and p95 in ms, and FerretDB's peak RSS.

    flock /tmp/gridfsctl-bench.lock bench/backend_gogc.py \
        --datadir /tmp/h-serve/bench/posters-52k/backend [--values 100,200,400,800]
"""
import argparse
import os
import random
import statistics
import subprocess
import time

import pymongo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND = os.path.join(ROOT, "scripts", "backend")


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def timed(fn, items):
    out = []
    for it in items:
        t0 = time.perf_counter()
        fn(it)
        out.append((time.perf_counter() - t0) * 1000)
    out.sort()
    return statistics.median(out), out[int(len(out) * 0.95)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--datadir", required=True)
    ap.add_argument("--port", type=int, default=27351)
    ap.add_argument("--values", default="100,200,400,800")
    ap.add_argument("--samples", type=int, default=500)
    a = ap.parse_args()
    print("| GOGC | chunks read p50 ms | p95 ms | files by name p50 ms | p95 ms | FerretDB peak RSS MB |")
    print("|---:|---:|---:|---:|---:|---:|")
    picked = None
    for value in a.values.split(","):
        subprocess.run([BACKEND, "stop", a.datadir], check=True, capture_output=True)
        uri = subprocess.run([BACKEND, "start", a.datadir, str(a.port)], check=True, capture_output=True,
                             text=True, env=dict(os.environ, GOGC=value)).stdout.strip()
        db = pymongo.MongoClient(uri).bench
        if picked is None:
            docs = list(db.fs.files.find({}, {"_id": 1, "filename": 1}))
            picked = random.Random(1).sample(docs, min(a.samples, len(docs)))
        # A warm-up pass, so that PostgreSQL's buffers are the same for every value.
        for d in picked[:100]:
            list(db.fs.chunks.find({"files_id": d["_id"]}).sort("n", 1).batch_size(32))
        c50, c95 = timed(lambda d: list(db.fs.chunks.find({"files_id": d["_id"]}).sort("n", 1)
                                        .batch_size(32)), picked)
        f50, f95 = timed(lambda d: db.fs.files.find_one({"filename": d["filename"]}), picked)
        with open(os.path.join(a.datadir, "ferretdb.pid")) as f:
            rss = peak_rss_mb(int(f.read()))
        print(f"| {value} | {c50:.2f} | {c95:.2f} | {f50:.2f} | {f95:.2f} | {rss:.0f} |", flush=True)
    subprocess.run([BACKEND, "stop", a.datadir], check=True, capture_output=True)
    subprocess.run([BACKEND, "start", a.datadir, str(a.port)], check=True, capture_output=True)


if __name__ == "__main__":
    main()
