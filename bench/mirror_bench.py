#!/usr/bin/env python3
"""Benchmark: `gridfsctl mirror` against a pymongo loop, on the same backend, into empty dirs.

The peer is what users write today: list the newest revision of every name
under the prefix, then GridFSBucket.download_to_stream() each into its file.
It sets no mtime or mode and never fsyncs, so gridfsctl is timed both with
--no-fsync (like for like) and with its default fsync (the real cost of
crash safety), and with each way of reading: the default (--read auto,
which picks one sorted pass over all chunks for a first mirror of the
whole bucket), a query per file (--read each) and the sorted pass forced
(--read scan). The two output trees are compared with diff -r afterwards.
bench/verify_bench_select.py measures mirror of a prefix.

    flock /tmp/gridfsctl-bench.lock bench/mirror_bench.py [--tree /tmp/posters-52k]

The tree is loaded once per backend datadir with `gridfsctl import`.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

from benchlib import BIN, posters_db, run_timed


def pymongo_loop(uri, db, prefix, out):
    """The peer, run in its own process so its RSS is its own."""
    import gridfs
    import pymongo
    client = pymongo.MongoClient(uri)
    bucket = gridfs.GridFSBucket(client[db])
    p = prefix.rstrip("/") + "/"
    newest = {}
    for doc in client[db].fs.files.find({"filename": {"$regex": "^" + p}},
                                        {"filename": 1}).sort([("filename", 1), ("uploadDate", 1)]):
        newest[doc["filename"]] = doc["_id"]
    for name, fid in newest.items():
        path = os.path.join(out, name[len(p):])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            bucket.download_to_stream(fid, f)


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", default="/tmp/posters-52k")
    ap.add_argument("--port", type=int, default=27310)
    ap.add_argument("--datadir", default="/tmp/h-mirror/bench")
    ap.add_argument("--storage", default="postgresql")
    ap.add_argument("--out", default="/tmp/h-mirror/bench-out")
    ap.add_argument("--bin", default=BIN)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--pymongo-loop", nargs=4, metavar=("URI", "DB", "PREFIX", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.pymongo_loop:
        pymongo_loop(*a.pymongo_loop)
        return

    uri, db, nfiles, env = posters_db(a.bin, a.port, a.datadir, a.storage, a.tree, "mirrorbench_")
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(a.tree) for f in fs)

    results = {}
    gout, pout = os.path.join(a.out, "gridfsctl"), os.path.join(a.out, "pymongo")
    mirror = [a.bin, "mirror", "--prefix", "posters", "--db", db, "--json", "--jobs", str(a.jobs)]

    def check_same():
        r = subprocess.run(["diff", "-r", "-q", gout, pout], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("trees differ:\n" + r.stdout[:2000])

    fresh(pout)
    results["pymongo loop"] = run_timed([sys.executable, __file__, "--pymongo-loop", uri, db, "posters", pout])
    fresh(gout)
    results["gridfsctl mirror --no-fsync (auto)"] = run_timed(mirror + [gout, "--no-fsync"], env)
    check_same()
    fresh(gout)
    results["gridfsctl mirror --no-fsync --read each"] = run_timed(mirror + [gout, "--no-fsync", "--read", "each"], env)
    check_same()
    fresh(gout)
    results["gridfsctl mirror --no-fsync --read scan"] = run_timed(mirror + [gout, "--no-fsync", "--read", "scan"], env)
    check_same()
    fresh(gout)
    results["gridfsctl mirror (default: fsync)"] = run_timed(mirror + [gout], env)
    results["gridfsctl mirror, unchanged re-run"] = run_timed(mirror + [gout], env)
    summary = json.loads(results["gridfsctl mirror, unchanged re-run"][2].splitlines()[-1])["summary"]
    assert summary["written"] == 0 and summary["skipped"] == nfiles, summary

    base = results["pymongo loop"][0]
    print(f"{nfiles} files, {total / 2**20:.0f} MiB, backend {a.storage}, --jobs {a.jobs}, "
          f"{os.cpu_count()} cores\n")
    print("| run | wall s | files/s | MB/s | peak RSS MiB | vs pymongo loop |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (secs, rss, _, _) in results.items():
        print(f"| {name} | {secs:.1f} | {nfiles / secs:,.0f} | {total / 1e6 / secs:.1f} | {rss:.0f} "
              f"| {base / secs:.2f}x |")
    shutil.rmtree(a.out, ignore_errors=True)


if __name__ == "__main__":
    main()
