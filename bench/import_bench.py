#!/usr/bin/env python3
"""Benchmark: `gridfsctl import` beside its peers, on one backend, into fresh databases.

  gridfsctl   gridfsctl import TREE (default options), then again on the
              unchanged tree (the nightly cron case)
  pymongo     what users write today: walk the tree and call
              GridFSBucket.upload_from_stream() per file
  ceiling     no GridFS library at all: read every file, cut it into 255 KiB
              chunk documents and insert_many() them in 8 MiB batches, then
              insert_many() the files documents; no hashing, no type
              detection, no idempotence, one connection

Each runs in its own process (wall time, peak RSS from wait4) into its own
database, dropped afterwards. Results print as JSON lines and a Markdown
table with ratios.

    flock /tmp/gridfsctl-bench.lock bench/import_bench.py --tree /tmp/posters-5k
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

from benchlib import BIN, ROOT, run_timed
CHUNK = 255 * 1024
BATCH = 8 << 20


def walk(tree):
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        for fn in sorted(filenames):
            p = os.path.join(dirpath, fn)
            yield p, os.path.relpath(p, tree)


def pymongo_loop(uri, db, tree):
    import gridfs
    import pymongo
    bucket = gridfs.GridFSBucket(pymongo.MongoClient(uri)[db])
    for path, name in walk(tree):
        with open(path, "rb") as f:
            bucket.upload_from_stream(name, f)


def ceiling(uri, db, tree):
    import bson
    import pymongo
    d = pymongo.MongoClient(uri)[db]
    chunks, files, size = [], [], 0
    for path, name in walk(tree):
        data = open(path, "rb").read()
        fid = bson.ObjectId()
        for n in range(0, max(1, (len(data) + CHUNK - 1) // CHUNK) if data else 0):
            part = data[n * CHUNK:(n + 1) * CHUNK]
            chunks.append({"files_id": fid, "n": n, "data": bson.Binary(part)})
            size += len(part)
        files.append({"_id": fid, "length": len(data), "chunkSize": CHUNK, "filename": name,
                      "uploadDate": datetime.datetime.now(datetime.timezone.utc)})
        if size >= BATCH:
            d.fs.chunks.insert_many(chunks, ordered=False)
            chunks, size = [], 0
    if chunks:
        d.fs.chunks.insert_many(chunks, ordered=False)
    for i in range(0, len(files), 10000):
        d.fs.files.insert_many(files[i:i + 10000], ordered=False)


def tree_size(tree):
    n = b = 0
    for path, _ in walk(tree):
        n += 1
        b += os.path.getsize(path)
    return n, b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", default="/tmp/posters-5k")
    ap.add_argument("--port", type=int, default=27240)
    ap.add_argument("--datadir", default="/tmp/h-import/bench")
    ap.add_argument("--storage", default="sqlite")
    ap.add_argument("--bin", default=BIN)
    ap.add_argument("--skip", default="", help="comma-separated runs to leave out (pymongo,ceiling)")
    ap.add_argument("--peer", nargs=4, metavar=("KIND", "URI", "DB", "TREE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        {"pymongo": pymongo_loop, "ceiling": ceiling}[a.peer[0]](*a.peer[1:])
        return

    import pymongo
    backend = os.path.join(ROOT, "scripts", "backend")
    uri = subprocess.run([backend, "start", a.datadir, str(a.port), a.storage], check=True,
                         capture_output=True, text=True).stdout.strip()
    client = pymongo.MongoClient(uri)
    nfiles, nbytes = tree_size(a.tree)
    results = {}
    try:
        def fresh(db):
            client.drop_database(db)
            return db

        db = fresh("bench_import_gridfsctl")
        env_uri = ["--uri", uri, "--db", db]
        results["gridfsctl import"] = run_timed([a.bin, "import", a.tree, "--json"] + env_uri)
        results["gridfsctl re-run (unchanged)"] = run_timed([a.bin, "import", a.tree, "--json"] + env_uri)
        s = json.loads(results["gridfsctl re-run (unchanged)"][2].decode().splitlines()[-1])["summary"]
        assert s["skipped"] == nfiles, s
        client.drop_database(db)
        for kind in ("pymongo", "ceiling"):
            if kind in a.skip.split(","):
                continue
            db = fresh(f"bench_import_{kind}")
            results[kind] = run_timed([sys.executable, __file__, "--peer", kind, uri, db, a.tree])
            assert client[db].fs.files.count_documents({}) == nfiles
            client.drop_database(db)
    finally:
        subprocess.run([backend, "stop", a.datadir], check=True)

    base = results["gridfsctl import"][0]
    print(f"tree {a.tree}: {nfiles} files, {nbytes / 1e6:.1f} MB, storage {a.storage}")
    print("| run | wall s | files/s | MB/s | peak RSS MiB | client CPU s | time / gridfsctl import |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (secs, rss, _, cpu) in results.items():
        print(f"| {name} | {secs:.1f} | {nfiles / secs:.0f} | {nbytes / 1e6 / secs:.1f} | {rss:.0f} | "
              f"{cpu:.1f} | {secs / base:.2f}x |")
        print(json.dumps({"run": name, "tree": a.tree, "files": nfiles, "bytes": nbytes,
                          "seconds": round(secs, 2), "rss_mib": round(rss, 1), "cpu_s": round(cpu, 2)}),
              file=sys.stderr)


if __name__ == "__main__":
    main()
