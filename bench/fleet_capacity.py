#!/usr/bin/env python3
"""Capacity arithmetic for a fleet of serve hosts and for 1x, 10x and 100x the
seed's tree (issue 31). Nothing is run: every input is a rate measured in
docs/benchmarks.md (named next to it) or a property of the request path
(what the backend sees per cache miss). docs/scale-out.md prints the result.

    bench/fleet_capacity.py [--rate 20000] [--hit 0.99] [--nic-gbit 10]
"""
import argparse
import math

# The seed's tree (README, docs/benchmarks.md "52,000 posters (2,132 MB)").
SEED_FILES = 52_000
SEED_BYTES = 2_132e6
AVG_BYTES = SEED_BYTES / SEED_FILES          # about 41 KB: one chunk at the default 255 KiB
CHUNK = 255 * 1024

# docs/benchmarks.md, import: gridfsctl import of 52k posters, FerretDB.
IMPORT_FILES_S = {"FerretDB/PostgreSQL": 1141, "FerretDB/SQLite": 650}
# docs/benchmarks.md, serve 52k: serve hot (every body in memory), req/s per
# 2-core host shared with wrk, and the server's CPU per request.
HOT_REQ_S = 51_000                            # the c=2 / c=1000 medians; 69k at c=100
HOT_CPU_MS = 0.018
# serve cold (every request a miss): the server's and the backend's CPU per miss.
COLD_SERVER_CPU_MS = 0.16
COLD_BACKEND_CPU_MS = 1.12                    # FerretDB: one chunks query by files_id


def human(n):
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.3g} {unit}".rstrip()
        n /= 1000
    return f"{n:.3g} P"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=20_000, help="requests per second to serve")
    ap.add_argument("--hit", type=float, default=0.99, help="fraction answered from a host's caches")
    ap.add_argument("--nic-gbit", type=float, default=10, help="each host's network link")
    ap.add_argument("--poll", type=float, default=2, help="serve --poll seconds")
    a = ap.parse_args()

    chunks_per_file = math.ceil(AVG_BYTES / CHUNK)
    print(f"average file {AVG_BYTES / 1e3:.0f} KB = {chunks_per_file} chunk(s) of {CHUNK // 1024} KiB")
    print()
    print("| tree | files | bytes | chunks | import at " +
          " | import at ".join(IMPORT_FILES_S) + " | disk tier per host (whole tree) |")
    print("|---|---:|---:|---:|" + "---:|" * len(IMPORT_FILES_S) + "---:|")
    for x in (1, 10, 100):
        files, size = SEED_FILES * x, SEED_BYTES * x
        times = [files / r for r in IMPORT_FILES_S.values()]
        print(f"| {x}x | {files:,} | {human(size)}B | {files * chunks_per_file:,} | " +
              " | ".join(f"{t / 60:.1f} min" if t < 3600 else f"{t / 3600:.1f} h" for t in times) +
              f" | {human(size)}B |")
    print()
    # One host: the hot rate, unless its link fills first.
    nic_req_s = a.nic_gbit * 1e9 / 8 / AVG_BYTES
    per_host = min(HOT_REQ_S, nic_req_s)
    hosts = math.ceil(a.rate / per_host)
    misses = a.rate * (1 - a.hit)
    backend_cores = misses * COLD_BACKEND_CPU_MS / 1e3
    print(f"{a.rate:,.0f} req/s at a {a.hit:.0%} cache hit ratio:")
    print(f"- one host: {HOT_REQ_S:,} req/s from its caches ({HOT_CPU_MS} ms CPU each), "
          f"{nic_req_s:,.0f} req/s fill a {a.nic_gbit:g} Gbit/s link: {per_host:,.0f} per host")
    print(f"- hosts: {hosts} for the rate, {hosts + 1} to lose one (N+1)")
    print(f"- misses reaching the backend: {misses:,.0f}/s, each one chunks query by files_id "
          f"({chunks_per_file} chunk), no files query (the name index answers)")
    print(f"- backend CPU for them at FerretDB's {COLD_BACKEND_CPU_MS} ms a miss: "
          f"{backend_cores:.1f} cores; serve's own {COLD_SERVER_CPU_MS} ms a miss: "
          f"{misses * COLD_SERVER_CPU_MS / 1e3:.2f} cores over the fleet")
    print(f"- index upkeep: {hosts + 1} hosts x 1 count + 1 dated query every {a.poll:g} s = "
          f"{2 * (hosts + 1) / a.poll:.1f} queries/s; a removal adds one reread per host")


if __name__ == "__main__":
    main()
