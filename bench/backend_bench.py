#!/usr/bin/env python3
"""Embedded backend benchmark: one by-name lookup plus one full file read.

For each storage engine of the embedded FerretDB (scripts/backend), loads
1,000 and 52,000 files of 40 KB (two databases, loaded once per engine) and
times pymongo's GridFSBucket.open_download_stream_by_name(name).read() for
random names: median and p95 in ms.  PostgreSQL is measured three ways on the
same data: as FerretDB leaves it (no tuning), then with
backend/postgresql-tuning.sql applied (GIN expression indexes +
plan_cache_mode = force_custom_plan), then with the indexes but the default
plan_cache_mode (auto), to show what each half of the tuning is worth.
Also reports load time, on-disk size and the time of one full scan of the
files collection (what a listing does).

    flock /tmp/gridfsctl-bench.lock python3 bench/backend_bench.py [--sizes 1000,52000]

Prints a Markdown table; raw figures go to bench/out/backend.json.
"""
import argparse
import datetime
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

import bson
import gridfs
import pymongo
from bson.int64 import Int64

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND = os.path.join(ROOT, "scripts", "backend")
FILE_SIZE = 40 * 1024
CHUNK_SIZE = 255 * 1024


def sh(*argv, env=None):
    return subprocess.run(argv, check=True, capture_output=True, text=True,
                          env=dict(os.environ, **(env or {}))).stdout


def backend_start(datadir, port, storage, tuning=True):
    env = {} if tuning else {"GRIDFSCTL_PG_TUNING": "0"}
    t = time.perf_counter()
    uri = sh(BACKEND, "start", datadir, str(port), storage, env=env).strip()
    return uri, time.perf_counter() - t


def backend_stop(datadir):
    sh(BACKEND, "stop", datadir)


def psql(datadir, sql):
    return sh(BACKEND, "psql", datadir, "-tAc", sql).strip()


def name_of(i):
    h = "%08x" % (i * 2654435761 % 2**32)
    return f"posters/{h[:2]}/{h[2:4]}/poster-{i:06d}.jpg"


def load(db, first, count, batch=250):
    """Inserts files count files first..first+count-1 as GridFS lays them out:
    chunks first, then the files documents; 40 KB is one chunk."""
    files, chunks = db["fs.files"], db["fs.chunks"]
    if first == 0:
        files.create_index([("filename", 1), ("uploadDate", 1)])
        chunks.create_index([("files_id", 1), ("n", 1)], unique=True)
    t = time.perf_counter()
    for start in range(first, first + count, batch):
        fdocs, cdocs = [], []
        for i in range(start, min(start + batch, first + count)):
            oid = bson.ObjectId()
            cdocs.append({"_id": bson.ObjectId(), "files_id": oid, "n": 0,
                          "data": bson.Binary(os.urandom(FILE_SIZE))})
            fdocs.append({"_id": oid, "length": Int64(FILE_SIZE), "chunkSize": CHUNK_SIZE,
                          "uploadDate": datetime.datetime.now(datetime.timezone.utc),
                          "filename": name_of(i), "metadata": {"contentType": "image/jpeg"}})
        chunks.insert_many(cdocs)
        files.insert_many(fdocs)
    return time.perf_counter() - t


def measure(db, nfiles, samples, budget, rng):
    bucket = gridfs.GridFSBucket(db)
    # warm-up: connection, prepared statements, caches
    bucket.open_download_stream_by_name(name_of(rng.randrange(nfiles))).read()
    times = []
    deadline = time.monotonic() + budget
    while len(times) < samples and (len(times) < 3 or time.monotonic() < deadline):
        name = name_of(rng.randrange(nfiles))
        t = time.perf_counter()
        data = bucket.open_download_stream_by_name(name).read()
        times.append((time.perf_counter() - t) * 1000)
        assert len(data) == FILE_SIZE, name
    times.sort()
    p95 = times[min(len(times) - 1, int(round(0.95 * len(times))) - 1)]
    scan = []
    for _ in range(3):
        t = time.perf_counter()
        n = sum(1 for _ in db["fs.files"].find({}, batch_size=1000))
        scan.append((time.perf_counter() - t) * 1000)
        assert n == nfiles, (n, nfiles)
    return {"n": len(times), "median_ms": statistics.median(times), "p95_ms": p95,
            "scan_ms": statistics.median(scan)}


def du(path):
    return int(sh("du", "-sbL", path).split()[0])


def pg_schema_bytes(datadir, schema):
    return int(psql(datadir, "select coalesce(sum(pg_total_relation_size(c.oid)), 0) from pg_class c "
                    f"join pg_namespace n on n.oid = c.relnamespace where n.nspname = '{schema}' "
                    "and c.relkind = 'r'"))


def run_engine(storage, sizes, args, results, results_load):
    datadir = os.path.join(args.workdir, storage)
    shutil.rmtree(datadir, ignore_errors=True)
    os.makedirs(datadir)
    port = args.port + (0 if storage == "sqlite" else 10)
    uri, _ = backend_start(datadir, port, storage, tuning=False)
    client = pymongo.MongoClient(uri)
    rng = random.Random(args.seed)
    rows = []
    try:
        for n in sizes:
            db = client[f"b{n}"]
            secs = load(db, 0, n)
            if storage == "sqlite":
                disk = sum(os.path.getsize(os.path.join(datadir, "sqlite", f))
                           for f in os.listdir(os.path.join(datadir, "sqlite")) if f.startswith(f"b{n}."))
            else:
                psql(datadir, f"vacuum analyze")
                disk = pg_schema_bytes(datadir, f"b{n}")
            print(f"# {storage}: loaded {n} files in {secs:.1f}s, {disk / 2**20:.0f} MiB", file=sys.stderr)
            rows.append({"storage": storage, "files": n, "load_s": secs, "disk_bytes": disk})
        if storage == "postgresql":
            results_load["untuned"] = load(client["w_untuned"], 0, args.write_files)
        variant = "sqlite" if storage == "sqlite" else "postgresql, FerretDB defaults"
        for row in rows:
            m = measure(client[f"b{row['files']}"], row["files"], args.samples, args.budget, rng)
            results.append(dict(row, variant=variant, **m))
            print(f"# {variant} {row['files']}: {m}", file=sys.stderr)
        if storage != "postgresql":
            return
        client.close()
        backend_stop(datadir)
        uri, start_s = backend_start(datadir, port, storage, tuning=True)
        client = pymongo.MongoClient(uri)
        psql(datadir, "analyze")
        results_load["tuned"] = load(client["w_tuned"], 0, args.write_files)
        for row in rows:
            gin = row["gin_bytes"] = pg_schema_bytes(datadir, f"b{row['files']}")
            m = measure(client[f"b{row['files']}"], row["files"], args.samples, args.budget, rng)
            r = dict(row, variant="postgresql + GIN + force_custom_plan", disk_bytes=gin,
                     tuning_s=start_s, **m)
            results.append(r)
            print(f"# {r['variant']} {row['files']}: {m}", file=sys.stderr)
        # Same indexes, default plan cache: does the planner keep custom plans?
        psql(datadir, "alter database ferretdb reset plan_cache_mode")
        client.close()
        backend_stop(datadir)
        uri, _ = backend_start(datadir, port, storage, tuning=False)
        client = pymongo.MongoClient(uri)
        assert psql(datadir, "show plan_cache_mode") == "auto"
        for row in rows:
            m = measure(client[f"b{row['files']}"], row["files"], args.samples, args.budget, rng)
            results.append(dict(row, variant="postgresql + GIN, plan_cache_mode auto",
                                disk_bytes=row["gin_bytes"], **m))
            print(f"# GIN auto {row['files']}: {m}", file=sys.stderr)
    finally:
        client.close()
        backend_stop(datadir)
        if not args.keep:
            shutil.rmtree(datadir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,52000")
    ap.add_argument("--storage", default="postgresql,sqlite")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--budget", type=float, default=60.0,
                    help="seconds of sampling per configuration before stopping early (min 3 samples)")
    ap.add_argument("--workdir", default="/tmp/h-backend/bench")
    ap.add_argument("--port", type=int, default=27460)
    ap.add_argument("--write-files", type=int, default=5000,
                    help="files loaded into a fresh database with and without the PostgreSQL tuning")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the loaded data directories")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results, results_load = [], {}
    t0 = time.time()
    for storage in args.storage.split(","):
        run_engine(storage, sizes, args, results, results_load)
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "out", "backend.json"), "w") as f:
        json.dump({"argv": sys.argv, "results": results, "pg_write_s": results_load, "seconds": time.time() - t0}, f, indent=1)
    print("| storage | files | reads | median ms | p95 ms | full files scan ms | load s | disk MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['variant']} | {r['files']:,} | {r['n']} | {r['median_ms']:.1f} | {r['p95_ms']:.1f} "
              f"| {r['scan_ms']:.0f} | {r['load_s']:.1f} | {r['disk_bytes'] / 2**20:.0f} |")
    for k, v in results_load.items():
        print(f"\nPostgreSQL, {args.write_files:,} files into a new database, {k}: {v:.1f} s")
    if results and "tuning_s" in results[-1] or any("tuning_s" in r for r in results):
        t = next(r["tuning_s"] for r in results if "tuning_s" in r)
        print(f"\nPostgreSQL restart + tuning pass (indexes built on all loaded data): {t:.1f} s")


if __name__ == "__main__":
    main()
