#!/usr/bin/env python3
"""watch: a queue of single-file uploads, renames and removals, side by side.

    flock /tmp/gridfsctl-bench.lock python3 bench/watch_queue_bench.py [--bin ./gridfsctl] \
        [--stored 2200] [--padding 0] [--files 150] [--workdir DIR]

Starts a backend of its own (scripts/backend, a free port, a temporary directory), stores --stored
files with a first pass, then, with watch --delete running: writes --files new files at once, renames
each of them at once (one rename a file, in the same folder), and removes them at once, timing each
queue from the first change to watch's last event for it. During each queue SIGUSR1 is sent every
0.2 s and the longest wait for a status line is printed, with the longest gap between watchdog pings
(WATCHDOG_USEC=4000000 unless --watchdog-usec says, and a notify socket of our own). --padding N inserts N more files documents
(empty files, under pad/, beside watch's prefix w/, with pymongo) before watch starts: a bucket of the seed's size in names
without its bytes, for what a query over the files collection costs there.
"""
import argparse
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from benchlib import small_tree  # noqa: E402
from conftest import Backend, free_port  # noqa: E402


class Watch:
    """watch --json --delete: its events, its status lines' latency and its watchdog pings."""

    def __init__(self, binary, uri, db, tree, top, watchdog_usec):
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(os.path.join(top, "notify"))
        self.pings = []
        env = dict(os.environ, GRIDFSCTL_URI=uri, GRIDFSCTL_CONFIG="/dev/null",
                   NOTIFY_SOCKET=os.path.join(top, "notify"), WATCHDOG_USEC=str(watchdog_usec))
        self.err = open(os.path.join(top, "watch.err"), "wb")
        self.proc = subprocess.Popen([binary, "watch", tree, "--json", "--delete", "--db", db,
                                      "--prefix", "w"],
                                     env=env, stdout=subprocess.PIPE, stderr=self.err)
        self.cond = threading.Condition()
        self.counts = {}
        self.last = {}        # event -> when the latest of its kind was read
        self.statuses = 0
        for line in self.proc.stdout:
            if json.loads(line).get("event") == "ready":
                break
        else:
            with open(os.path.join(top, "watch.err")) as f:
                sys.exit(f"watch exited before it was ready: {f.read()}")
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._pings, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            ev = json.loads(line).get("event", "summary")
            with self.cond:
                self.counts[ev] = self.counts.get(ev, 0) + 1
                self.last[ev] = time.monotonic()
                if ev == "status":
                    self.statuses += 1
                self.cond.notify_all()

    def _pings(self):
        while True:
            try:
                msg = self.notify.recv(4096).decode()
            except OSError:
                return
            if "WATCHDOG=1" in msg.split("\n"):
                self.pings.append(time.monotonic())

    def run(self, what, count, change):
        """Times change() until count more `what` events; the longest status wait and ping gap."""
        with self.cond:
            want = self.counts.get(what, 0) + count
        pings_before = len(self.pings)
        t0 = time.monotonic()
        change()
        worst_status = 0.0
        while True:
            with self.cond:
                if self.counts.get(what, 0) >= want:
                    break
                seen = self.statuses
            sent = time.monotonic()
            self.proc.send_signal(signal.SIGUSR1)
            with self.cond:
                self.cond.wait_for(lambda: self.statuses > seen or self.counts.get(what, 0) >= want, 600)
                if self.statuses > seen:
                    worst_status = max(worst_status, time.monotonic() - sent)
                if self.counts.get(what, 0) >= want:
                    break
            time.sleep(0.2)  # the pace of SIGUSR1, not synchronisation
        took = self.last[what] - t0
        pings = [t0] + self.pings[pings_before:] + [time.monotonic()]
        gap = max(b - a for a, b in zip(pings, pings[1:]))
        print(f"{count} {what}: {took:.2f} s ({count / took:.1f}/s); longest status wait "
              f"{worst_status:.2f} s; longest watchdog gap {gap:.2f} s")
        return took

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        self.err.close()
        self.notify.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="./gridfsctl")
    ap.add_argument("--stored", type=int, default=2200)
    ap.add_argument("--padding", type=int, default=0)
    ap.add_argument("--files", type=int, default=150)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--watchdog-usec", type=int, default=4000000,
                    help="each backend call is bounded by it: at 52,000 names a full pass's listing "
                         "needs more than 4 s on a loaded machine")
    a = ap.parse_args()
    top = tempfile.mkdtemp(prefix="watch_queue_bench.", dir=a.workdir)
    b = Backend(os.path.join(top, "backend"), free_port(), "postgresql")
    b.start()
    w = None
    try:
        tree = os.path.join(top, "tree")
        small_tree(tree, a.stored)
        if a.padding:
            files = b.client().bench.fs.files
            now = datetime.datetime.now(datetime.timezone.utc)
            for start in range(0, a.padding, 5000):
                files.insert_many([{"filename": f"pad/{i}.jpg", "length": 0, "chunkSize": 261120,
                                    "uploadDate": now} for i in range(start, min(a.padding, start + 5000))])
        q = os.path.join(tree, "q")
        os.makedirs(q)
        w = Watch(a.bin, b.uri, "bench", tree, top, a.watchdog_usec)
        names = [os.path.join(q, f"{i}.jpg") for i in range(a.files)]

        def write():
            for n in names:
                with open(n, "wb") as f:
                    f.write(os.urandom(2000))

        def rename():
            for n in names:
                os.rename(n, n + ".moved")

        def remove():
            for n in names:
                os.unlink(n + ".moved")

        up = w.run("uploaded", a.files, write)
        mv = w.run("moved", a.files, rename)
        w.run("removed", a.files, remove)
        print(f"renames / uploads: {mv / up:.2f}x")
        env = dict(os.environ, GRIDFSCTL_URI=b.uri, GRIDFSCTL_CONFIG="/dev/null")
        stats = []
        for _ in range(5):
            t0 = time.monotonic()
            subprocess.run([a.bin, "stat", "w/d0/0.jpg", "--db", "bench"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            stats.append(time.monotonic() - t0)
        one = w.run("moved", 1, lambda: os.rename(os.path.join(tree, "d0", "1.jpg"),
                                                  os.path.join(tree, "d0", "1.moved")))
        print(f"one rename / a stat of one name (median of 5, {sorted(stats)[2]:.3f} s): "
              f"{one / sorted(stats)[2]:.1f}x")
    finally:
        if w:
            w.stop()
        b.purge()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
