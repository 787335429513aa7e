#!/usr/bin/env python3
"""gridfsctl supervise against supervisord, side by side, same child programs.

  flock /tmp/gridfsctl-bench.lock python3 bench/supervise_bench.py [GRIDFSCTL] [--rounds N] [--lines N]

Measures, for each supervisor:
  restart   time from SIGKILL of the child to the new child running its first
            instruction (the child reports itself on a unix datagram socket)
  logging   a child writes N lines of 64 bytes to stdout as fast as the pipe
            takes them: lines per second logged, and the supervisor's CPU
            seconds per million lines (utime+stime from /proc)
and for gridfsctl alone (supervisord has no such feature):
  pattern   time from a child printing a restart_on line to its
            replacement running (the path a "Too many open files" line takes)

Needs supervisord (Debian package 'supervisor'); skips it when absent.
"""
import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import BIN

PY = sys.executable
CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def reporter(path):
    """A child that announces its pid and start time on a datagram socket, then waits."""
    return (f"import socket,os,time\ns=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM)\n"
            f"s.sendto(('%d %.6f' % (os.getpid(), time.time())).encode(), {path!r})\n"
            f"time.sleep(100000)\n")


class Gridfsctl:
    name = "gridfsctl supervise"

    def __init__(self, binary, d):
        self.bin, self.d, self.proc = binary, d, None

    def start(self, name, argv, log=None, extra=""):
        cfg = os.path.join(self.d, "g.ini")
        cmd = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
        with open(cfg, "w") as f:
            f.write(f"[program:{name}]\ncommand = {cmd}\nbackoff_initial = 0\nmax_restarts = 100000\n"
                    f"fd_interval = 0\n{extra}")
            if log:
                f.write(f"log = {log}\nlog_max = 1G\n")
        self.proc = subprocess.Popen([self.bin, "supervise", "--control",
                                      os.path.join(self.d, "g.sock"), "-c", cfg],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self.proc.pid

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


class Supervisord:
    name = "supervisord 4"

    def __init__(self, d):
        self.d, self.proc = d, None

    def start(self, name, argv, log=None, extra=""):
        cfg = os.path.join(self.d, "s.conf")
        with open(cfg, "w") as f:
            f.write(f"[supervisord]\nnodaemon=true\nlogfile={self.d}/supervisord.log\n"
                    f"pidfile={self.d}/s.pid\n[unix_http_server]\nfile={self.d}/s.sock\n"
                    f"[program:{name}]\ncommand={' '.join(argv)}\nautorestart=true\nstartsecs=0\n"
                    f"startretries=100000\nstopsignal=TERM\n"
                    f"stdout_logfile={log or '/dev/null'}\nstdout_logfile_maxbytes=0\n"
                    f"redirect_stderr=true\n")
        self.proc = subprocess.Popen(["supervisord", "-c", cfg], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        return self.proc.pid

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def bench_restart(sup, d, rounds):
    sock_path = os.path.join(d, "r.sock")
    script = os.path.join(d, "reporter.py")
    with open(script, "w") as f:
        f.write(reporter(sock_path))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(sock_path)
    s.settimeout(30)
    sup.start("child", [PY, script])
    pid = int(s.recv(100).split()[0])
    times = []
    for _ in range(rounds):
        t0 = time.time()
        os.kill(pid, signal.SIGKILL)
        msg = s.recv(100).split()
        pid, t1 = int(msg[0]), float(msg[1])
        times.append(t1 - t0)
    sup.stop()
    s.close()
    os.unlink(sock_path)
    return statistics.median(times), max(times)


def bench_pattern(sup, d, rounds):
    sock_path = os.path.join(d, "p.sock")
    fifo = os.path.join(d, "go")
    os.mkfifo(fifo)
    script = os.path.join(d, "pattern.py")
    with open(script, "w") as f:
        f.write(f"import socket,os,time\ns=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM)\n"
                f"s.sendto(('%d %.6f' % (os.getpid(), time.time())).encode(), {sock_path!r})\n"
                f"open({fifo!r}).read(1)\n"
                f"s.sendto(('hit %.6f' % time.time()).encode(), {sock_path!r})\n"
                f"print('bench: restart me', flush=True)\ntime.sleep(100000)\n")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(sock_path)
    s.settimeout(30)
    # Not a descriptor-exhaustion line: those, repeated right after each
    # restart, would (rightly) be diagnosed as a limit too low and stop the loop.
    sup.start("child", [PY, script], extra="restart_on = bench: restart me\nrestart_window = 1\n")
    s.recv(100)
    times = []
    for _ in range(rounds):
        with open(fifo, "w") as w:
            w.write("x")
        hit = float(s.recv(100).split()[1])
        started = float(s.recv(100).split()[1])
        times.append(started - hit)
    sup.stop()
    s.close()
    os.unlink(sock_path)
    os.unlink(fifo)
    return statistics.median(times), max(times)


def bench_logging(sup, d, lines):
    log = os.path.join(d, "out.log")
    done = os.path.join(d, "done")
    for f in (log, done):
        if os.path.exists(f):
            os.unlink(f)
    line = "x" * 63
    script = os.path.join(d, "talk.py")
    with open(script, "w") as f:
        f.write(f"import os,sys,time\nb=({line!r}+'\\n').encode()*1000\nfd=sys.stdout.fileno()\n"
                f"for i in range({lines // 1000}):\n    v=memoryview(b)\n"
                f"    while v:\n        n=os.write(fd,v); v=v[n:]\n"
                f"open({done!r},'w').close()\ntime.sleep(100000)\n")
    spid = sup.start("talk", [PY, script], log=log)
    want = lines * 64
    t0 = time.time()
    c0 = None
    while time.time() - t0 < 600:
        if c0 is None:
            c0 = cpu_seconds(spid)
            t0 = time.time()
        if os.path.exists(log) and os.path.getsize(log) >= want:
            break
        time.sleep(0.01)
    elapsed = time.time() - t0
    cpu = cpu_seconds(spid) - c0
    size = os.path.getsize(log)
    sup.stop()
    return lines / elapsed, cpu / (lines / 1e6), size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gridfsctl", nargs="?", default=BIN)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--lines", type=int, default=2_000_000)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="svb-", dir="/tmp")
    sups = [Gridfsctl(a.gridfsctl, d)]
    if shutil.which("supervisord"):
        sups.append(Supervisord(d))
    res = {}
    for sup in sups:
        r = {"restart": bench_restart(sup, d, a.rounds), "logging": bench_logging(sup, d, a.lines)}
        if isinstance(sup, Gridfsctl):
            r["pattern"] = bench_pattern(sup, d, a.rounds)
        res[sup.name] = r
    shutil.rmtree(d, ignore_errors=True)
    print(f"rounds {a.rounds}, lines {a.lines}, {os.cpu_count()} cores")
    print(f"{'supervisor':22} {'restart median':>15} {'max':>8} {'lines/s':>10} {'CPU s/Mline':>12}")
    for name, r in res.items():
        print(f"{name:22} {r['restart'][0] * 1000:12.1f} ms {r['restart'][1] * 1000:6.1f} ms "
              f"{r['logging'][0]:10.0f} {r['logging'][1]:12.3f}")
    g = res.get("gridfsctl supervise")
    if g and "pattern" in g:
        print(f"gridfsctl: restart_on line -> replacement running: median "
              f"{g['pattern'][0] * 1000:.1f} ms, max {g['pattern'][1] * 1000:.1f} ms")
    if len(res) == 2:
        s = res["supervisord 4"]
        print(f"ratios (supervisord / gridfsctl): restart latency {s['restart'][0] / g['restart'][0]:.1f}x, "
              f"logging throughput {g['logging'][0] / s['logging'][0]:.2f}x, "
              f"CPU per line {s['logging'][1] / g['logging'][1]:.1f}x")


if __name__ == "__main__":
    main()
