#!/usr/bin/env python3
"""Selective verify and mirror: does the cost follow what is selected?

Runs, side by side in one series on one backend, a full verify and a full
mirror (the peers) and the same commands on a 1/256 prefix (posters/00/,
one of the 256 two-hex-digit folders gen_posters.py makes) and a 1 % sample,
with the read strategy auto picks and with each one forced. Reports each run
as a ratio of the full run of its command.

    flock /tmp/gridfsctl-bench.lock bench/verify_bench_select.py --storage postgresql
    flock /tmp/gridfsctl-bench.lock bench/verify_bench_select.py --storage sqlite
    flock /tmp/gridfsctl-bench.lock bench/verify_bench_select.py --quick \
        --tree /tmp/posters-52k --files 52000 --port 27463 --datadir /tmp/h-selective/pg52k

The tree is generated (bench/gen_posters.py) and loaded with `gridfsctl
import` once per backend datadir.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

from benchlib import BIN, ROOT, posters_db, run_timed
PREFIX = "posters/00/"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", default="/tmp/posters-5k")
    ap.add_argument("--files", type=int, default=5000, help="files in a generated tree")
    ap.add_argument("--storage", default="postgresql", choices=["postgresql", "sqlite"])
    ap.add_argument("--port", type=int)
    ap.add_argument("--datadir")
    ap.add_argument("--out", default="/tmp/h-selective/bench-out")
    ap.add_argument("--bin", default=BIN)
    ap.add_argument("--before", metavar="BIN",
                    help="also time the prefix and sample runs with this (older) binary")
    ap.add_argument("--quick", action="store_true",
                    help="leave out the forced strategies that read the whole chunks collection")
    a = ap.parse_args()
    port = a.port or (27461 if a.storage == "postgresql" else 27462)
    datadir = a.datadir or f"/tmp/h-selective/{a.storage}"

    if not os.path.isdir(a.tree):
        subprocess.run([sys.executable, os.path.join(ROOT, "bench/gen_posters.py"), a.tree, str(a.files)],
                       check=True)
    _, db, nfiles, env = posters_db(a.bin, port, datadir, a.storage, a.tree, "sel")
    selected = sum(len(f) for _, _, f in os.walk(os.path.join(a.tree, PREFIX[len("posters/"):])))

    rows = []

    def verify(label, *args, binary=None):
        secs, rss, out, cpu = run_timed([binary or a.bin, "verify", "--db", db, "--json", *args], env)
        s = json.loads(out.decode().strip().splitlines()[-1])["summary"]
        assert s["problems"] == 0, s
        rows.append(("verify", label, secs, s["checked"], s["chunks"], s.get("read"), " ".join(args)))
        print(rows[-1], file=sys.stderr, flush=True)

    def mirror(label, *args, fresh=True, binary=None):
        dst = os.path.join(a.out, "m")
        if fresh:
            shutil.rmtree(dst, ignore_errors=True)
        secs, rss, out, cpu = run_timed([binary or a.bin, "mirror", dst, "--db", db, "--json", *args], env)
        s = json.loads(out.decode().strip().splitlines()[-1])["summary"]
        assert s["failed"] == 0, s
        rows.append(("mirror", label, secs, s["written"], None, None, " ".join(args)))
        print(rows[-1], file=sys.stderr, flush=True)

    # A query per file reads the whole chunks collection on SQLite storage
    # (FerretDB pushes down only _id there): minutes for 19 files, so not run.
    unindexed_each = a.storage == "sqlite"
    verify("full (auto)")
    verify("prefix 1/256 (auto)", "--prefix", PREFIX)
    verify("sample 1% (auto)", "--sample", "1%")
    for st in ("scan", "batched", "each"):
        if (st == "each" and unindexed_each) or (a.quick and st != "each"):
            continue
        verify(f"prefix 1/256, {st}", "--prefix", PREFIX, "--read", st)
    if a.before:
        verify("prefix 1/256, before", "--prefix", PREFIX, binary=a.before)
        verify("sample 1%, before", "--sample", "1%", binary=a.before)
    verify("full (auto), again")
    mirror("full (auto)", "--prefix", "posters")
    mirror("full, unchanged re-run", "--prefix", "posters", fresh=False)
    mirror("prefix 1/256 (auto)", "--prefix", PREFIX)
    for rd in ("scan", "batched", "each"):
        if (rd == "each" and unindexed_each) or (a.quick and rd != "each"):
            continue
        mirror(f"prefix 1/256, {rd}", "--prefix", PREFIX, "--read", rd)
    if not unindexed_each and not a.quick:
        mirror("full, each", "--prefix", "posters", "--read", "each")
    if a.before:
        mirror("prefix 1/256, before", "--prefix", PREFIX, binary=a.before)
    mirror("full (auto), again", "--prefix", "posters")
    shutil.rmtree(a.out, ignore_errors=True)

    base = {}
    for cmd, label, secs, *_ in rows:
        if label.startswith("full (auto)"):
            base.setdefault(cmd, []).append(secs)
    base = {k: sum(v) / len(v) for k, v in base.items()}
    print(f"{nfiles} files ({selected} under {PREFIX}), storage {a.storage}, {os.cpu_count()} cores\n")
    print("| command | run | wall s | files | chunks read | strategy | vs full run |")
    print("|---|---|---:|---:|---:|---|---:|")
    for cmd, label, secs, files, chunks, strategy, args in rows:
        print(f"| {cmd} | {label} | {secs:.2f} | {files} | {'' if chunks is None else chunks} "
              f"| {strategy or ''} | {secs / base[cmd]:.3f}x |")


if __name__ == "__main__":
    main()
