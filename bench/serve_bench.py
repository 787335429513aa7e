#!/usr/bin/env python3
"""Benchmark `gridfsctl serve` side by side with nginx (static files from
disk) and a threaded Python peer reading GridFS through pymongo, in one run,
on the same poster tree and the same backend.

    flock /tmp/gridfsctl-bench.lock bench/serve_bench.py [--tree /tmp/posters-5k]
          [--conns 2,10,100,1000] [--duration 10] [--repeat 3] [--out bench/out/serve.json]
          [--touch-conns 10,100] [--servers LIST] [--backend-cpus LIST] [--tier-parent DIR]

Needs wrk, nginx and ab (apt-get install wrk nginx apache2-utils).
wrk runs a Lua script (bench/random_urls.lua) asking for random files of the
tree over keep-alive connections. For every server and concurrency it
reports requests/s, p50/p99 latency, errors (socket errors, timeouts and
non-2xx answers, summed over repeats), the server's resident memory after
the run, and CPU time per request of the server, of the backend (FerretDB
and PostgreSQL, from /proc) and of wrk. With --repeat N each point runs N
times, the servers taking turns, and the run with the median rate is
reported; then `ab -n 10000 -c 25` on one file. "serve hot" runs with
--preload and a cache holding the whole tree; "serve cold" with a 1 MB
cache, so nearly every request is a backend read; "serve disk" with a 64 MB
memory cache and a --cache-dir that a first pass filled, restarted so that
only the disk tier is warm (the cache serve has after a restart).

Before the wrk runs, the first touch: every file once, in random order, by
--touch-conns clients on keep-alive connections, against a fresh server with
an empty --cache-dir and against one without (today's miss path), taking
turns (in alternating order); the ratio is tier / no tier. Earlier tiers are
moved aside and removed only after the pass (see tier_aside()). `--servers ""`
runs the first touch alone. The tier's pass is what fills it for
"serve disk". It also reports the CPU per request of the server and of the
backend, which say what a fill costs more steadily than the rates do.

--backend-cpus 0 gives the backend CPU 0 alone and everything else the
other CPUs: the shape of a deployment whose backend has a host of its own,
where a fill's CPU is not taken from the backend. (The cold-vs-peer
ceiling assumes shared cores and is not printed then.)

Then the ratios serve hot / nginx and serve cold / peer, taken turn by turn
(the two ran seconds apart) with their median, and the ceiling of cold vs
peer on this machine: the rate the cores allow if serve itself cost nothing
(the cores over what the backend and wrk spend per cold request), divided
by the peer's rate.
"""
import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
from statistics import median
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from benchlib import BIN, ROOT

BACKEND_PORT = 27351
PORTS = {"serve": 18310, "nginx": 18311, "peer": 18312, "cold": 18313, "disk": 18314,
         "touch": 18315}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def wait_http(url, proc, deadline_s=600, until=None):
    """Until url answers (with until in its body, given one)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if until is None or until in r.read():
                    return
        except OSError:
            pass
        time.sleep(0.2)  # polling a port: there is no event to wait on
    raise SystemExit(f"{url} did not answer in {deadline_s}s")


def rss_kb(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def children(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ms(pids):
    """User+system CPU time of pids, in ms; a process gone meanwhile counts 0."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return ticks * 1000 / CLOCK_TICKS


def backend_pids(datadir):
    """FerretDB and every PostgreSQL process of the bench backend."""
    pids = []
    for pidfile in ("ferretdb.pid", os.path.join("pg", "postmaster.pid")):
        try:
            with open(os.path.join(datadir, pidfile)) as f:
                pid = int(f.readline())
        except (OSError, ValueError):
            continue
        pids += [pid] + children(pid)
    return pids


def tree_files(tree):
    paths, total = [], 0
    for d, _, files in os.walk(tree):
        for f in files:
            p = os.path.join(d, f)
            paths.append(os.path.relpath(p, tree))
            total += os.path.getsize(p)
    paths.sort()
    return paths, total


def ensure_backend(workdir, tree, nfiles, env):
    datadir = os.path.join(workdir, "backend")
    os.makedirs(datadir, exist_ok=True)
    subprocess.run([os.path.join(ROOT, "scripts", "backend"), "stop", datadir],
                   capture_output=True)
    out = subprocess.run([os.path.join(ROOT, "scripts", "backend"), "start", datadir,
                          str(BACKEND_PORT)], check=True, capture_output=True, text=True)
    uri = out.stdout.strip()
    import pymongo
    client = pymongo.MongoClient(uri)
    have = client.bench.fs.files.count_documents({"filename": {"$regex": "^posters/"}})
    if have != nfiles:
        log(f"bench: importing {nfiles} files into the backend (have {have})")
        client.drop_database("bench")
        t0 = time.monotonic()
        subprocess.run([BIN, "import", tree, "--prefix", "posters", "--uri", uri, "--db", "bench",
                        "--no-progress", "-q"], check=True, env=env)
        log(f"bench: import took {time.monotonic() - t0:.1f}s")
    client.close()
    return datadir, uri


def nginx_conf(workdir, tree, port):
    d = os.path.join(workdir, "nginx")
    os.makedirs(d, exist_ok=True)
    conf = os.path.join(d, "nginx.conf")
    # Descriptors: cached open files plus connections must fit the hard limit.
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    cached = max(1000, min(60000, nofile - 3000))
    with open(conf, "w") as f:
        f.write(f"""worker_processes 2;
pid {d}/nginx.pid;
error_log {d}/error.log;
worker_rlimit_nofile {nofile};
events {{ worker_connections 8192; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    keepalive_timeout 65;
    open_file_cache max={cached} inactive=60s;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    types {{ image/jpeg jpg; }}
    server {{
        listen 127.0.0.1:{port} reuseport backlog=4096;
        root {tree};
    }}
}}
""")
    return conf


def run_wrk(port, conns, duration, urls_file):
    threads = min(2, conns)
    argv = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{duration}s", "--timeout", "10s",
            "-s", os.path.join(ROOT, "bench", "random_urls.lua"), f"http://127.0.0.1:{port}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, URLS=urls_file),
                         preexec_fn=raise_nofile)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    client_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    m = re.search(r"WRKJSON (\{.*\})", out.stdout)
    if not m:
        raise SystemExit(f"wrk failed: {out.stdout}\n{out.stderr}")
    r = json.loads(m.group(1))
    secs = r["duration_us"] / 1e6
    return {
        "requests": r["requests"],
        "client_cpu_ms": client_s * 1000 / max(1, r["requests"]),
        "rps": r["requests"] / secs,
        "p50_ms": r["p50_us"] / 1000,
        "p99_ms": r["p99_us"] / 1000,
        "errors": r["connect"] + r["read"] + r["write"] + r["timeout"] + r["status"],
        "non2xx": r["status"],
        "mb_s": r["bytes"] / secs / 1e6,
        "cmd": " ".join(argv),
    }


def busy_procs(pids, before):
    """How many of pids did a real share of the work since before (their CPU ms then).

    nginx's workers each listen on a SO_REUSEPORT socket of their own, and the
    kernel picks one by a hash of the connection's addresses: at c=2 both of
    wrk's connections land on one worker in about half the runs, and that
    worker then runs at half the rate (12,000-18,000 req/s against
    29,000-38,000 on two). The table says which runs those were."""
    used = [cpu_ms([p]) - b for p, b in zip(pids, before)]
    top = max(used, default=0)
    return sum(1 for u in used if top and u >= top / 4)


def first_touch(cmd, env, port, paths, conns, logpath, datadir=None):
    """Starts cmd, asks for every path once over conns keep-alive clients, stops it.
    With datadir, also the CPU per request of the server and of the backend there."""
    import concurrent.futures
    import http.client
    import random
    logf = open(logpath, "ab")
    proc = subprocess.Popen(cmd, env=env, preexec_fn=raise_nofile, stdout=logf, stderr=logf)
    try:
        wait_http(f"http://127.0.0.1:{port}/_health", proc)
        order = ["/" + urllib.parse.quote(p) for p in paths]
        random.Random(conns).shuffle(order)
        shares = [order[i::conns] for i in range(conns)]

        def client(share):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            errors = 0
            for u in share:
                try:
                    c.request("GET", u)
                    r = c.getresponse()
                    r.read()
                    errors += r.status != 200
                except OSError:
                    errors += 1
                    c.close()
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.close()
            return errors

        bpids = backend_pids(datadir) if datadir else []
        before = cpu_ms([proc.pid]), cpu_ms(bpids)
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(conns) as ex:
            errors = sum(ex.map(client, shares))
        secs = time.monotonic() - t0
        # Before SIGTERM: the tier's writer may still hold fills, whose CPU counts too.
        server_ms = (cpu_ms([proc.pid]) - before[0]) / len(order)
        # From the start: a restarted tier's writer proves entries before the first request too.
        server_all_ms = cpu_ms([proc.pid]) / len(order)
        backend_ms = (cpu_ms(bpids) - before[1]) / len(order)
        rss = rss_kb([proc.pid]) / 1024
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_metrics", timeout=10) as r:
            metrics = dict(l.split()[:2] for l in r.read().decode().splitlines()
                           if l.startswith("gridfsctl_serve_disk_"))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        logf.close()
    return {"rps": len(order) / secs, "errors": errors, "rss_mb": rss, "conns": conns,
            "server_cpu_ms": server_ms, "backend_cpu_ms": backend_ms, "server_cpu_all_ms": server_all_ms,
            "fills_dropped": int(metrics.get("gridfsctl_serve_disk_fills_dropped_total", 0)),
            "disk_hits": int(metrics.get("gridfsctl_serve_disk_hits_total", 0)),
            "disk_proofs": int(metrics.get("gridfsctl_serve_disk_proofs_total", 0))}


def tier_aside(tierdir):
    """Moves an earlier tier out of the way, to be removed by clear_tiers() later.

    Not removed here: on an ext4 without a journal (this machine's), a file
    created within a minute or more of many deletions in its block group
    makes the kernel skip every recently deleted inode while allocating one
    (find_inode_bit, recently_deleted), so a tier filled right after
    removing the last one costs several times the CPU per fill that a fresh
    tier does. Deleting the old tier first would measure that, not the fill.
    """
    if os.path.exists(tierdir):
        n = 0
        while os.path.exists(f"{tierdir}.old{n}"):
            n += 1
        os.rename(tierdir, f"{tierdir}.old{n}")


def split_cpus(datadir, spec):
    """Pins the backend to the CPUs in spec, and this process, with all it starts
    from now on (servers, wrk, the first touch's clients), to the others."""
    mine = {int(c) for c in spec.split(",")}
    rest = set(range(os.cpu_count())) - mine
    if not mine or not rest or not mine <= set(range(os.cpu_count())):
        raise SystemExit(f"--backend-cpus {spec}: name some of CPUs 0-{os.cpu_count() - 1}, not all")
    # Every thread now; PostgreSQL's later connection processes inherit the postmaster's.
    for pid in backend_pids(datadir):
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(tid), mine)
    os.sched_setaffinity(0, rest)


def clear_tiers(tierdir):
    d, base = os.path.split(tierdir)
    for name in os.listdir(d):
        if name.startswith(base + ".old"):
            shutil.rmtree(os.path.join(d, name), ignore_errors=True)


def touch_pass(a, cmds, env, workdir, tierdir, paths, results):
    """First touch with and without the tier, taking turns, and after each tier pass the
    first touch of a server restarted on the tier it filled ("touch-restart": every entry
    proven once, by the writer or the hit); leaves tierdir filled."""
    for conns in [int(c) for c in a.touch_conns.split(",")]:
        for turn in range(a.repeat):
            # Alternating, so that neither always finds the backend's caches warmed by the other.
            order = ("touch-tier", "touch-none") if turn % 2 == 0 else ("touch-none", "touch-tier")
            for name in order:
                if name == "touch-tier":
                    tier_aside(tierdir)
                for run in ((name, "touch-restart") if name == "touch-tier" else (name,)):
                    r = first_touch(cmds[name], env, PORTS["touch"], paths, conns,
                                    os.path.join(workdir, f"{run}.log"),
                                    os.path.join(workdir, "backend"))
                    results["touch"].setdefault(run, {}).setdefault(conns, []).append(r)
                    log(f"bench: first touch {run:13} c={conns:<4} {r['rps']:7.0f} rps  "
                        f"errors {r['errors']}  rss {r['rss_mb']:.0f} MB  cpu/req "
                        f"{r['server_cpu_ms']:.3f}+{r['backend_cpu_ms']:.3f} ms  "
                        f"fills dropped {r['fills_dropped']}")
    clear_tiers(tierdir)
    results["commands"]["touch-tier"] = " ".join(cmds["touch-tier"])
    results["commands"]["touch-none"] = " ".join(cmds["touch-none"])


def run_ab(port, path):
    argv = ["ab", "-q", "-n", "10000", "-c", "25", f"http://127.0.0.1:{port}/{path}"]
    out = subprocess.run(argv, capture_output=True, text=True)
    failed = re.search(r"Failed requests:\s+(\d+)", out.stdout)
    rps = re.search(r"Requests per second:\s+([\d.]+)", out.stdout)
    non2xx = re.search(r"Non-2xx responses:\s+(\d+)", out.stdout)
    return {"failed": int(failed.group(1)) if failed else -1,
            "non2xx": int(non2xx.group(1)) if non2xx else 0,
            "rps": float(rps.group(1)) if rps else 0.0, "cmd": " ".join(argv)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", default="/tmp/posters-5k")
    ap.add_argument("--conns", default="2,10,100,1000")
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--workdir", default="/tmp/h-serve/bench")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "serve.json"))
    ap.add_argument("--servers", default="serve,nginx,peer,cold,disk")
    ap.add_argument("--touch-conns", default="10,100",
                    help="first-touch concurrencies (empty: skip the first touch)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per point, servers taking turns; the median run is reported")
    ap.add_argument("--tier-parent", default="",
                    help="the directory to make the disk tiers in (default: the workdir), e.g. "
                         "on another file system")
    ap.add_argument("--backend-cpus", default="",
                    help="CPUs for the backend alone (e.g. 0), the others for the rest, as when "
                         "the backend has a host of its own; default: everything shares them")
    a = ap.parse_args()
    for tool in ("wrk", "nginx", "ab"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found: apt-get install wrk nginx apache2-utils")
    raise_nofile()
    tree = os.path.abspath(a.tree)
    workdir = os.path.join(a.workdir, os.path.basename(tree))
    os.makedirs(workdir, exist_ok=True)
    paths, total = tree_files(tree)
    urls_file = os.path.join(workdir, "urls.txt")
    with open(urls_file, "w") as f:
        for p in paths:
            f.write("/" + urllib.parse.quote(p) + "\n")
    env = dict(os.environ, GRIDFSCTL_CONFIG="/dev/null")
    datadir, uri = ensure_backend(workdir, tree, len(paths), env)
    if a.backend_cpus:
        split_cpus(datadir, a.backend_cpus)

    cache = total + total // 4 + (64 << 20)
    if a.tier_parent:
        os.makedirs(a.tier_parent, exist_ok=True)
    tierdir = os.path.join(a.tier_parent or workdir, "tier")
    # wrk's connections all come from 127.0.0.1, as a reverse proxy's do: no per-address cap.
    common = [BIN, "serve", "--uri", uri, "--db", "bench", "--prefix", "posters", "--poll", "600",
              "--reload", "3600", "--max-per-ip", "0", "-q"]
    cmds = {
        # Polling out of the way (--poll 600 --reload 3600): on FerretDB every poll reads
        # the whole files collection (2.5 s of backend CPU at 52,000 files), which would
        # land in random runs of all four servers. Its cost is in gridfsctl-serve(1).
        "serve": [BIN, "serve", "--uri", uri, "--db", "bench", "--prefix", "posters", "--preload",
                  "--cache-size", str(cache), "--poll", "600", "--reload", "3600", "--max-per-ip", "0",
                  "--listen",
                  f"127.0.0.1:{PORTS['serve']}", "-q"],
        "cold": [BIN, "serve", "--uri", uri, "--db", "bench", "--prefix", "posters",
                 "--cache-size", "1M", "--poll", "600", "--reload", "3600", "--max-per-ip", "0",
                 "--listen", f"127.0.0.1:{PORTS['cold']}", "-q"],
        "disk": common + ["--cache-size", "64M", "--cache-dir", tierdir,
                          "--listen", f"127.0.0.1:{PORTS['disk']}"],
        "touch-tier": common + ["--cache-size", "64M", "--cache-dir", tierdir,
                                "--listen", f"127.0.0.1:{PORTS['touch']}"],
        "touch-none": common + ["--cache-size", "64M", "--listen", f"127.0.0.1:{PORTS['touch']}"],
        "nginx": ["nginx", "-c", nginx_conf(workdir, tree, PORTS["nginx"]), "-g", "daemon off;"],
        "peer": [sys.executable, os.path.join(ROOT, "bench", "peer_server.py"), "--uri", uri,
                 "--db", "bench", "--port", str(PORTS["peer"]), "--prefix", "posters"],
    }
    # nginx is measured from a warm page cache, as serve hot is from a preloaded cache.
    for p in paths:
        with open(os.path.join(tree, p), "rb") as f:
            while f.read(1 << 20):
                pass
    servers = [x for x in a.servers.split(",") if x]
    results = {"tree": tree, "files": len(paths), "bytes": total, "cpus": os.cpu_count(),
               "backend_cpus": a.backend_cpus, "tier_parent": a.tier_parent,
               "commands": {}, "wrk": {}, "ab": {}, "touch": {}}
    procs = {}
    try:
        if a.touch_conns:
            touch_pass(a, cmds, env, workdir, tierdir, paths, results)
        elif "disk" in servers:
            tier_aside(tierdir)
            first_touch(cmds["touch-tier"], env, PORTS["touch"], paths, 10,
                        os.path.join(workdir, "touch-tier.log"))
            clear_tiers(tierdir)
        for name in servers:
            t0 = time.monotonic()
            logf = open(os.path.join(workdir, f"{name}.log"), "wb")
            procs[name] = subprocess.Popen(cmds[name], env=env, preexec_fn=raise_nofile,
                                           stdout=logf, stderr=logf)
            wait_http(f"http://127.0.0.1:{PORTS[name]}/{urllib.parse.quote(paths[0])}", procs[name])
            if "--preload" in cmds[name]:  # hot means after the pass, which runs while serving
                wait_http(f"http://127.0.0.1:{PORTS[name]}/_health", procs[name], until=b"preload: done")
            results["commands"][name] = " ".join(cmds[name])
            log(f"bench: {name} ready in {time.monotonic() - t0:.1f}s")
        for conns in [int(c) for c in a.conns.split(",") if c and servers]:
            runs = {name: [] for name in servers}
            for _ in range(a.repeat):
                for name in servers:
                    pids = [procs[name].pid] + children(procs[name].pid)
                    bpids = backend_pids(datadir)
                    each = [cpu_ms([p]) for p in pids]
                    before = sum(each), cpu_ms(bpids)
                    r = run_wrk(PORTS[name], conns, a.duration, urls_file)
                    done = max(1, r["requests"])
                    r["server_cpu_ms"] = (cpu_ms(pids) - before[0]) / done
                    r["busy_procs"] = busy_procs(pids, each)
                    r["backend_cpu_ms"] = (cpu_ms(bpids) - before[1]) / done
                    r["rss_mb"] = rss_kb(pids) / 1024
                    runs[name].append(r)
                    log(f"bench: {name:5} c={conns:<5} {r['rps']:9.0f} rps  p50 {r['p50_ms']:7.2f} ms  "
                        f"p99 {r['p99_ms']:8.2f} ms  errors {r['errors']}  rss {r['rss_mb']:.0f} MB  "
                        f"cpu/req {r['server_cpu_ms']:.3f}+{r['backend_cpu_ms']:.3f}+{r['client_cpu_ms']:.3f} ms")
            for name in servers:
                ordered = sorted(runs[name], key=lambda r: r["rps"])
                best = dict(ordered[len(ordered) // 2])
                best["all_rps"] = [r["rps"] for r in runs[name]]
                best["runs"] = runs[name]
                best["errors"] = sum(r["errors"] for r in runs[name])
                results["wrk"].setdefault(name, {})[conns] = best
        for name in servers:
            results["ab"][name] = run_ab(PORTS[name], urllib.parse.quote(paths[len(paths) // 2]))
            log(f"bench: ab {name}: {results['ab'][name]}")
    finally:
        for name, p in procs.items():
            p.send_signal(signal.SIGTERM if name != "nginx" else signal.SIGQUIT)
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run([os.path.join(ROOT, "scripts", "backend"), "stop", datadir], capture_output=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
    print_table(results, servers)


def print_table(res, servers):
    print(f"\n{res['files']} files, {res['bytes'] / 1e6:.0f} MB ({res['tree']})\n")
    print("| server | conns | req/s | vs nginx | p50 ms | p99 ms | errors | RSS MB "
          "| CPU ms/req: server | backend | wrk |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in servers:
        for conns, r in res["wrk"][name].items():
            ng = res["wrk"].get("nginx", {}).get(conns)
            ratio = f"{r['rps'] / ng['rps']:.2f}x" if ng else "-"
            print(f"| {name} | {conns} | {r['rps']:.0f} | {ratio} | {r['p50_ms']:.2f} | "
                  f"{r['p99_ms']:.2f} | {r['errors']} | {r['rss_mb']:.0f} | "
                  f"{r['server_cpu_ms']:.3f} | {r['backend_cpu_ms']:.3f} | {r['client_cpu_ms']:.3f} |")
    # Ratios are taken turn by turn (the two servers ran a few seconds apart),
    # then the median, so that the machine's drift between turns cancels out.
    nginx = res["wrk"].get("nginx")
    for name, label in (("serve", "serve hot"), ("disk", "serve disk (tier warm)")):
        hot = res["wrk"].get(name)
        if not hot or not nginx:
            continue
        print(f"\n| conns | {label} vs nginx, per turn (* nginx on one worker) | median "
              f"| median of the turns nginx ran on all its workers |\n|---:|---|---:|---:|")
        for conns in hot:
            if conns not in nginx:
                continue
            pairs = list(zip(hot[conns]["runs"], nginx[conns]["runs"]))
            ratios = [h["rps"] / n["rps"] for h, n in pairs]
            one = [n.get("busy_procs", 2) < 2 for _, n in pairs]
            spread = [x for x, single in zip(ratios, one) if not single]
            print(f"| {conns} | {', '.join(f'{x:.2f}x' + ('*' if single else '') for x, single in zip(ratios, one))} "
                  f"| {median(ratios):.2f}x | {f'{median(spread):.2f}x' if spread else '-'} |")
    tier, none = res.get("touch", {}).get("touch-tier"), res.get("touch", {}).get("touch-none")
    if tier and none:
        if res.get("tier_parent"):
            print(f"\nThe tiers in {res['tier_parent']}.")
        if res.get("backend_cpus"):
            print(f"\nThe backend on CPUs {res['backend_cpus']}, everything else on the others.")
        print("\n| first touch, conns | tier empty req/s | no tier req/s | tier / no tier, per turn "
              "| median | errors | RSS MB tier, no tier | CPU ms/req, median: serve tier, no tier "
              "| backend tier, no tier | fills dropped |\n|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
        for conns in tier:
            t, n = tier[conns], none[conns]
            ratios = [x["rps"] / y["rps"] for x, y in zip(t, n)]
            cpu = [median(x.get(k, 0) for x in runs) for k in ("server_cpu_ms", "backend_cpu_ms")
                   for runs in (t, n)]
            print(f"| {conns} | {median(x['rps'] for x in t):.0f} | {median(y['rps'] for y in n):.0f} | "
                  f"{', '.join(f'{x:.2f}x' for x in ratios)} | {median(ratios):.2f}x | "
                  f"{sum(x['errors'] for x in t)}, {sum(y['errors'] for y in n)} | "
                  f"{max(x['rss_mb'] for x in t):.0f}, {max(y['rss_mb'] for y in n):.0f} | "
                  f"{cpu[0]:.3f}, {cpu[1]:.3f} | {cpu[2]:.3f}, {cpu[3]:.3f} | "
                  f"{sum(x['fills_dropped'] for x in t) if 'fills_dropped' in t[0] else '-'} |")
    again = res.get("touch", {}).get("touch-restart")
    if again:
        print("\n| first touch after a restart on the filled tier, conns | req/s | errors "
              "| CPU ms/req, median: serve | serve since its start | backend | tier hits | proofs "
              "|\n|---:|---:|---:|---:|---:|---:|---:|---:|")
        for conns, runs in again.items():
            print(f"| {conns} | {median(x['rps'] for x in runs):.0f} | {sum(x['errors'] for x in runs)} | "
                  f"{median(x['server_cpu_ms'] for x in runs):.3f} | "
                  f"{median(x['server_cpu_all_ms'] for x in runs):.3f} | "
                  f"{median(x['backend_cpu_ms'] for x in runs):.3f} | "
                  f"{median(x['disk_hits'] for x in runs)} | {median(x['disk_proofs'] for x in runs)} |")
    cold, peer = res["wrk"].get("cold"), res["wrk"].get("peer")
    if cold and peer and not res.get("backend_cpus"):
        # wrk, serve and the backend share the cores, so even a server costing
        # nothing could answer no more than the cores over what the backend
        # and wrk spend per cold request.
        print(f"\n| conns | serve cold vs peer, per turn | median | ceiling on {res['cpus']} cores "
              "(serve costing nothing), median |\n|---:|---|---:|---:|")
        for conns in cold:
            if conns not in peer:
                continue
            pairs = list(zip(cold[conns]["runs"], peer[conns]["runs"]))
            ratios = [c["rps"] / p["rps"] for c, p in pairs]
            ceilings = [res["cpus"] * 1000 / max(c["backend_cpu_ms"] + c["client_cpu_ms"], 1e-9)
                        / p["rps"] for c, p in pairs]
            print(f"| {conns} | {', '.join(f'{x:.2f}x' for x in ratios)} | "
                  f"{median(ratios):.2f}x | {median(ceilings):.2f}x |")
    print("\n| ab -n 10000 -c 25 | req/s | failed | non-2xx |\n|---|---:|---:|---:|")
    for name in servers:
        r = res["ab"][name]
        print(f"| {name} | {r['rps']:.0f} | {r['failed']} | {r['non2xx']} |")


if __name__ == "__main__":
    main()
