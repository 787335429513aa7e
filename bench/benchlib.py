"""Helpers shared by the bench scripts."""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The binary every bench script runs unless told otherwise, as in tests/conftest.py.
BIN = os.environ.get("GRIDFSCTL_BIN", os.path.join(ROOT, "gridfsctl"))


def rss_kb(pid):
    """The resident memory of pid in KiB, 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_timed(argv, env=None):
    """Runs argv to the end; returns (wall seconds, peak RSS in MiB, stdout, CPU seconds).

    Peak RSS and CPU come from wait4, so they are that process's own. Exits
    the bench when argv fails.
    """
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    secs = time.monotonic() - t0
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        sys.exit(f"failed ({rc}): {' '.join(argv)}")
    return secs, ru.ru_maxrss / 1024, out, ru.ru_utime + ru.ru_stime


def small_tree(tree, count, size=2000):
    """count files of size random bytes under tree, a hundred a folder (d0/0.jpg, ...)."""
    for i in range(count):
        d = os.path.join(tree, f"d{i // 100}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{i}.jpg"), "wb") as f:
            f.write(os.urandom(size))


def posters_db(binary, port, datadir, storage, tree, db_prefix):
    """A backend on port (started in datadir with storage unless one answers
    there) and a database db_prefix + N holding the N files of tree under
    posters/, loaded with `binary import` unless it holds N files already, so a
    series of runs loads it once. Returns (uri, db, N, environment for gridfsctl)."""
    import pymongo
    uri = f"mongodb://127.0.0.1:{port}/"
    try:
        pymongo.MongoClient(uri, serverSelectionTimeoutMS=1000).admin.command("ping")
    except Exception:
        subprocess.run([os.path.join(ROOT, "scripts/backend"), "start", datadir, str(port), storage],
                       check=True, stdout=subprocess.DEVNULL)
    nfiles = sum(len(f) for _, _, f in os.walk(tree))
    db = f"{db_prefix}{nfiles}"
    env = dict(os.environ, GRIDFSCTL_URI=uri, GRIDFSCTL_CONFIG="/dev/null")
    client = pymongo.MongoClient(uri)
    if client[db].fs.files.count_documents({}) != nfiles:
        client.drop_database(db)
        secs = run_timed([binary, "import", tree, "--prefix", "posters", "--db", db], env)[0]
        print(f"loaded {nfiles} files with gridfsctl import in {secs:.1f} s", file=sys.stderr)
    client.close()
    return uri, db, nfiles, env
