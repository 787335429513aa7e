#!/usr/bin/env python3
"""What the whole-bucket and one-file verbs cost at the seed's scale (issue: no
verb reads or sorts the whole bucket for less than the whole bucket).

    bench/scale_bench.py TREE [--port 27290] [--datadir DIR] [--repeat 3] [--load 0]

TREE is a poster tree (bench/gen_posters.py); it is loaded once under posters/
into database `scaleN` (N its file count) on the embedded backend (PostgreSQL
storage) started on --port in --datadir unless one answers there. Then, turn
by turn, side by side:

  raw     a pymongo pass over fs.chunks in natural order, no sort, that
          sha256-hashes every chunk: the peer whole-bucket verify is held to
  verify  gridfsctl verify (whole bucket, default strategy)

each with its wall time, its own peak RSS (wait4) and the backend's peak RSS
(FerretDB's process, sampled every 0.1 s; PostgreSQL's largest process
separately), and the ratio verify/raw per turn. Then the one-file verbs on one
stored name: stat, rm (put back with gridfsctl put after each turn, untimed),
and doctor. --load N runs N busy processes during every turn (verify must give
the same verdict at load 10).
"""
import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import pymongo

from benchlib import BIN, posters_db, rss_kb


def ferretdb_pid(datadir):
    with open(os.path.join(datadir, "ferretdb.pid")) as f:
        return int(f.read())


def postmaster_pid(datadir):
    """The PostgreSQL cluster's main process: the one started with -D inside datadir."""
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"/postgres") and any(x.startswith(datadir.encode()) for x in argv):
            return int(p)
    return None


def children(ppid):
    """Processes whose parent is ppid (PostgreSQL's backends come and go with connections)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == ppid:
                    out.append(int(p))
        except (OSError, ValueError, IndexError):
            continue
    return out


class PeakSampler:
    """Samples the backend's RSS while a turn runs: FerretDB's, and the largest
    PostgreSQL process's (their shared buffers count in each, so no sum)."""

    def __init__(self, datadir):
        self.fdb, self.pm = ferretdb_pid(datadir), postmaster_pid(datadir)
        self.peak_fdb = self.peak_pg = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.done.wait(0.1):
            self.peak_fdb = max(self.peak_fdb, rss_kb(self.fdb))
            if self.pm:
                self.peak_pg = max([self.peak_pg] + [rss_kb(p) for p in children(self.pm)])

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def raw_hash_pass(uri, db):
    """The peer: every chunk in natural order, each sha256-hashed."""
    import hashlib
    c = pymongo.MongoClient(uri)
    total = 0
    for doc in c[db]["fs.chunks"].find({}, hint=[("$natural", 1)]):
        hashlib.sha256(doc["data"]).digest()
        total += len(doc["data"])
    c.close()
    return total


def timed_child(argv, env):
    """Wall seconds, peak RSS MiB and exit status of argv, output thrown away."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    return time.monotonic() - t0, ru.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), err


def spinners(n, seconds):
    """n busy processes that stop by themselves after seconds."""
    code = f"import time\nt=time.monotonic()+{seconds}\nwhile time.monotonic()<t: pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def whole_bucket(a, uri, db, env):
    rows = []
    for turn in range(a.repeat):
        load = spinners(a.load, 900) if a.load else []
        try:
            with PeakSampler(a.datadir) as ps:
                t0 = time.monotonic()
                nbytes = raw_hash_pass(uri, db)
                raw_s = time.monotonic() - t0
            raw = (raw_s, ps.peak_fdb / 1024, ps.peak_pg / 1024)
            with PeakSampler(a.datadir) as ps:
                v_s, v_rss, rc, err = timed_child([BIN, "verify", "--db", db, "-q"], env)
            if rc != 0:
                sys.exit(f"verify exited {rc}: {err.decode(errors='replace')[-400:]}")
            ver = (v_s, ps.peak_fdb / 1024, ps.peak_pg / 1024, v_rss)
        finally:
            for p in load:
                p.kill()
                p.wait()
        rows.append((raw, ver))
        print(f"turn {turn + 1}: raw {raw[0]:.1f} s (FerretDB peak {raw[1]:.0f} MiB, PG {raw[2]:.0f}); "
              f"verify {ver[0]:.1f} s (FerretDB peak {ver[1]:.0f} MiB, PG {ver[2]:.0f}, "
              f"gridfsctl {ver[3]:.0f} MiB); speed verify/raw {raw[0] / ver[0]:.2f}x, "
              f"backend peak verify/raw {ver[1] / max(raw[1], 1):.2f}x; {nbytes / 1e6:.0f} MB",
              flush=True)
    print(f"median: raw {med([r[0][0] for r in rows]):.1f} s, verify {med([r[1][0] for r in rows]):.1f} s, "
          f"speed {med([r[0][0] / r[1][0] for r in rows]):.2f}x, "
          f"FerretDB peak raw {med([r[0][1] for r in rows]):.0f} / verify {med([r[1][1] for r in rows]):.0f} MiB, "
          f"gridfsctl peak {med([r[1][3] for r in rows]):.0f} MiB", flush=True)


def one_file(a, uri, db, env):
    client = pymongo.MongoClient(uri)
    name = client[db]["fs.files"].find_one({}, {"filename": 1})["filename"]
    client.close()
    local = os.path.join(a.tree, name[len("posters/"):])
    stat_s, rm_s, doctor_s = [], [], []
    for _ in range(a.repeat):
        s, _, rc, err = timed_child([BIN, "stat", name, "--db", db], env)
        assert rc == 0, err
        stat_s.append(s)
        s, _, rc, err = timed_child([BIN, "rm", name, "--db", db], env)
        rm_s.append(s)
        if rc != 0:
            print(f"rm exited {rc} after {s:.1f} s: {err.decode(errors='replace').strip()}", flush=True)
        _, _, rc, err = timed_child([BIN, "put", local, "--name", name, "--db", db], env)
        assert rc == 0, err
        s, _, rc, err = timed_child([BIN, "doctor", "-q", "--db", db], env)
        doctor_s.append(s)
        if rc not in (0, 1):
            sys.exit(f"doctor exited {rc}: {err.decode(errors='replace')}")
    print(f"one file ({name}): stat {med(stat_s) * 1000:.0f} ms, rm {med(rm_s) * 1000:.0f} ms "
          f"({med(rm_s) / med(stat_s):.1f}x stat); doctor {med(doctor_s):.2f} s "
          f"(medians of {a.repeat})", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("--port", type=int, default=27290)
    ap.add_argument("--datadir", default="/var/tmp/gridfsctl-scale-bench")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--load", type=int, default=0, help="busy processes during each turn")
    ap.add_argument("--only", choices=["whole", "one"], help="run one half only")
    a = ap.parse_args()
    a.tree = os.path.abspath(a.tree)
    uri, db, n, env = posters_db(BIN, a.port, a.datadir, "postgresql", a.tree, "scale")
    print(f"{n} files in {db}, {BIN}, load {a.load}", flush=True)
    if a.only != "one":
        whole_bucket(a, uri, db, env)
    if a.only != "whole":
        one_file(a, uri, db, env)


if __name__ == "__main__":
    main()
