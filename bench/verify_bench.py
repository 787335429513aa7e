#!/usr/bin/env python3
"""verify benchmark: `gridfsctl verify` against peers on the same backend.

    bench/verify_bench.py URI DB MODE [--bin ./gridfsctl] [--repeat 1]

MODE:
  raw         pymongo cursor over all of fs.chunks, natural order, driver's
              default batching: the backend's raw scan speed
  raw-sorted  the same sorted by {files_id: 1, n: 1}, batchSize 32 (what
              gridfsctl asks for with 255 KiB chunks)
  pyloop      pymongo GridFSBucket: open and read each file, sha256 it, and
              compare with metadata.sha256 (one query per file)
  verify      gridfsctl verify (extra arguments after --)
Prints one line: MODE seconds MB/s, plus the ferretdb peak RSS when --pid given.
"""
import argparse
import hashlib
import subprocess
import sys
import threading
import time

import gridfs
import pymongo

from benchlib import rss_kb


def raw(db, sort):
    kw = {"batch_size": 32, "sort": [("files_id", 1), ("n", 1)]} if sort else {}
    total = 0
    for c in db["fs.chunks"].find({}, **kw):
        total += len(c["data"])
    return total


def pyloop(db, limit):
    b = gridfs.GridFSBucket(db)
    total = bad = 0
    for f in db["fs.files"].find({}, batch_size=1000).limit(limit):
        h = hashlib.sha256()
        with b.open_download_stream(f["_id"]) as s:
            data = s.read()
        h.update(data)
        total += len(data)
        if h.hexdigest() != f.get("metadata", {}).get("sha256"):
            bad += 1
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("uri")
    ap.add_argument("db")
    ap.add_argument("mode", choices=["raw", "raw-sorted", "pyloop", "verify"])
    ap.add_argument("--bin", default="./gridfsctl")
    ap.add_argument("--pid", type=int, help="backend pid, to sample its peak RSS")
    ap.add_argument("--limit", type=int, default=0,
                    help="pyloop: only the first N files (when one query per file is too slow)")
    # gridfsctl verify arguments follow "--"
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    a.rest = rest
    db = pymongo.MongoClient(a.uri)[a.db]
    peak = [0]
    done = threading.Event()
    if a.pid:
        def sample():
            while not done.wait(0.2):
                peak[0] = max(peak[0], rss_kb(a.pid))
        threading.Thread(target=sample, daemon=True).start()
    t0 = time.monotonic()
    if a.mode == "raw":
        total = raw(db, False)
    elif a.mode == "raw-sorted":
        total = raw(db, True)
    elif a.mode == "pyloop":
        total = pyloop(db, a.limit)
    else:
        p = subprocess.run([a.bin, "verify", "--uri", a.uri, "--db", a.db, "--json"] + a.rest,
                           capture_output=True, text=True, env={"GRIDFSCTL_CONFIG": "/dev/null"})
        last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "{}"
        import json
        total = json.loads(last).get("summary", {}).get("bytes", 0)
        if p.returncode not in (0, 1):
            sys.exit(f"verify failed: {p.returncode} {p.stderr}")
    dt = time.monotonic() - t0
    done.set()
    extra = f" backend-peak-rss={peak[0] // 1024}MiB" if a.pid else ""
    if a.mode == "pyloop" and a.limit:
        n = db["fs.files"].estimated_document_count()
        print(f"pyloop {a.limit} files {dt:.1f}s, {dt / a.limit:.2f}s/file, "
              f"extrapolated to {n} files: {dt / a.limit * n:.0f}s", flush=True)
    print(f"{a.mode} {dt:.1f}s {total / dt / 1e6:.1f}MB/s bytes={total}{extra}", flush=True)


if __name__ == "__main__":
    main()
