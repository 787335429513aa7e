#!/usr/bin/env python3
"""watch: latency from close() to readable through pymongo, and a burst's throughput against import.

    flock /tmp/gridfsctl-bench.lock python3 bench/watch_bench.py [--bin ./gridfsctl] [--stored 2200] \
        [--samples 100] [--burst 10000] [--workdir DIR]

Starts a backend of its own (scripts/backend, a free port, a temporary directory), stores --stored
files with a first pass, then writes --samples files one at a time, each once the previous one is
readable, and times close() to the first pymongo read that finds it. Then writes --burst files at
once and times until all are stored, and imports the same files into another database with
`gridfsctl import` for comparison. Prints one line per measure, and how watch stored the burst
(events one file each, full passes, and whether inotify's queue overflowed, which makes a full pass).

The trees go in a new directory under --workdir (default: the system's temporary directory). On
ext4, creating files within minutes of a mass removal on the same file system is slow (the inode
allocator passes over recently freed inodes: `recently_deleted` in a profile of cp), so the copy
itself can take seconds after another benchmark or test run cleaned up; the line "the copy took"
shows it. A tmpfs workdir (/dev/shm) measures watch without that.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pymongo

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from benchlib import small_tree  # noqa: E402
from conftest import Backend, free_port  # noqa: E402


class Watch:
    """watch --json, its events counted by kind as they come (a full pipe would stop it)."""

    def __init__(self, binary, uri, db, tree, errpath):
        env = dict(os.environ, GRIDFSCTL_URI=uri, GRIDFSCTL_CONFIG="/dev/null")
        self.err = open(errpath, "wb")
        self.proc = subprocess.Popen([binary, "watch", tree, "--json", "--db", db], env=env,
                                     stdout=subprocess.PIPE, stderr=self.err)
        self.counts = {}
        self.burst_stored = 0
        self.burst_target = None
        self.burst_done = threading.Event()
        for line in self.proc.stdout:
            if json.loads(line)["event"] == "ready":
                break
        else:
            sys.exit("watch exited before it was ready")
        self.reader = threading.Thread(target=self._count, daemon=True)
        self.reader.start()

    def _count(self):
        for line in self.proc.stdout:
            doc = json.loads(line)
            ev = doc.get("event", "summary")  # the last line, at exit, is the summary
            self.counts[ev] = self.counts.get(ev, 0) + 1
            if self.burst_target is None:
                continue
            if ev in ("uploaded", "replaced") and doc["filename"].startswith("burst/"):
                self.burst_stored += 1
            # each file's event comes once it is readable; a full pass stores them all at once
            if self.burst_stored >= self.burst_target or ev == "synced":
                self.burst_done.set()
        self.burst_done.set()

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        self.reader.join()
        self.err.close()


def poll(cond, deadline, pace=0.001):
    end = time.monotonic() + deadline
    while not cond():
        if time.monotonic() > end:
            sys.exit("timed out")
        time.sleep(pace)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="./gridfsctl")
    ap.add_argument("--stored", type=int, default=2200)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--burst", type=int, default=10000)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    top = tempfile.mkdtemp(prefix="watch_bench.", dir=a.workdir)
    b = Backend(os.path.join(top, "backend"), free_port(), "postgresql")
    b.start()
    w = None
    try:
        c = b.client()
        db = c.bench
        tree = os.path.join(top, "tree")
        small_tree(tree, a.stored)
        errpath = os.path.join(top, "watch.err")
        w = Watch(a.bin, b.uri, "bench", tree, errpath)
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
        before = dict(w.counts)
        w.burst_target = a.burst
        t0 = time.monotonic()
        # copied in at once, as cp -r does: a folder made, then its files written into it
        subprocess.run(["cp", "-r", staging, burst], check=True)
        copy_s = time.monotonic() - t0
        # watch's events say when; a poll of counts would read the whole files collection on
        # FerretDB again and again, competing with what it measures
        w.burst_done.wait(600)
        poll(lambda: db.fs.files.count_documents({"filename": {"$regex": "^burst/"}}) >= a.burst, 600,
             0.1)
        watch_s = time.monotonic() - t0
        counts = {k: v - before.get(k, 0) for k, v in w.counts.items()}
        w.stop()
        with open(errpath, errors="replace") as f:
            lost = "lost events" in f.read()
        env = dict(os.environ, GRIDFSCTL_URI=b.uri, GRIDFSCTL_CONFIG="/dev/null")
        t0 = time.monotonic()
        subprocess.run([a.bin, "-q", "import", staging, "--prefix", "burst", "--db", "imp"], env=env,
                       check=True, stdout=subprocess.DEVNULL)
        import_s = time.monotonic() - t0
        print(f"burst of {a.burst} files: watch {a.burst / watch_s:.0f} files/s ({watch_s:.1f} s), "
              f"import {a.burst / import_s:.0f} files/s ({import_s:.1f} s), "
              f"ratio {import_s / watch_s:.2f}x")
        print(f"the copy (cp -r) took {copy_s:.1f} s of watch's {watch_s:.1f} s")
        print(f"watch during the burst: {counts.get('uploaded', 0)} files stored one event each, "
              f"{counts.get('synced', 0)} full passes, inotify overflow: {'yes' if lost else 'no'}")
        c.close()
    finally:
        if w and w.proc.poll() is None:
            w.proc.kill()
        b.purge()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
