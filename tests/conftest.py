"""Fixtures shared by every integration test.

The tests run the built gridfsctl binary against a real backend process (the
embedded FerretDB server, started once per test session) and check what it
did with an independent client: pymongo and its gridfs module.
"""
import hashlib
import os
import random
import re
import socket
import subprocess
import tempfile
import time
import uuid

import bson.regex
import gridfs
import pymongo
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("GRIDFSCTL_BIN", os.path.join(ROOT, "gridfsctl"))
STORAGE = os.environ.get("GRIDFSCTL_TEST_STORAGE", "postgresql")

# Sanitizer failures get exit codes of their own, so they can never pass for
# one of gridfsctl's documented exit statuses.
SAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:exitcode=86:abort_on_error=0:detect_stack_use_after_return=1",
    "UBSAN_OPTIONS": "halt_on_error=1:exitcode=87:print_stacktrace=1",
    "LSAN_OPTIONS": "suppressions=" + os.path.join(ROOT, "tests", "lsan.supp") + ":print_suppressions=0",
}
SAN_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


def wait_for(cond, deadline_s=60, what="condition", pace=0.02, proc=None):
    """Polls cond() until it returns something truthy, which it returns; a
    deadline, not a sleep (pace only spaces the polls: a costly cond wants more).
    With proc, fails as soon as that process has exited. what names the
    condition in the failure; a callable what is called then, so the message
    can show the state it failed in."""
    end = time.monotonic() + deadline_s
    while True:
        v = cond()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited ({proc.returncode}) while waiting for "
                                 f"{what() if callable(what) else what}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(pace)


def port_is_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port(ports=None):
    """A loopback port nothing listens on now. Without ports, one the kernel
    hands out: right where nothing is to listen (a dead backend's address).
    A server started next takes one of a test file's private range instead:
    it lies below the ephemeral range, so no outgoing connection takes it in
    the meantime, and the random order keeps concurrent sessions apart."""
    if ports is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    for port in random.sample(list(ports), len(ports)):
        if port_is_free(port):
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


def proc_file(pid, name):
    """The text of /proc/PID/NAME, or None once the process is gone. A process
    that exits while it is read gives ENOENT at the open or ESRCH at the read:
    either way it is gone, never an error of the test. Every test that reads
    a process's /proc files reads them here."""
    try:
        with open(f"/proc/{pid}/{name}") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None


def proc_stat(pid, tid=None):
    """The fields of /proc/PID/stat (of thread tid with one) after the command
    name, field 3 of proc(5) first; None once the process (thread) is gone."""
    text = proc_file(pid, "stat" if tid is None else f"task/{tid}/stat")
    return text.rsplit(")", 1)[1].split() if text else None


def proc_state(pid):
    """The state letter of process pid (R, S, T for stopped, Z for a zombie,
    ...), or None once it is gone: a vanished process is a gone process."""
    fields = proc_stat(pid)
    return fields[0] if fields else None


def proc_gone(pid):
    """Has process pid exited (gone, or a zombie nobody reaped yet)?"""
    return proc_state(pid) in (None, "Z")


class Backend:
    def __init__(self, datadir, port, storage):
        self.datadir, self.port, self.storage = datadir, port, storage
        self.uri = f"mongodb://127.0.0.1:{port}/"

    def start(self):
        out = subprocess.run([os.path.join(ROOT, "scripts", "backend"), "start", self.datadir,
                              str(self.port), self.storage],
                             check=True, capture_output=True, text=True)
        assert out.stdout.strip() == self.uri

    def stop(self):
        subprocess.run([os.path.join(ROOT, "scripts", "backend"), "stop", self.datadir], check=True)

    def purge(self):
        """Stops the backend and removes its data (a PostgreSQL cluster may live outside datadir)."""
        subprocess.run([os.path.join(ROOT, "scripts", "backend"), "purge", self.datadir], check=True)

    def client(self):
        return pymongo.MongoClient(self.uri, serverSelectionTimeoutMS=5000)


@pytest.fixture(scope="session")
def backend(tmp_path_factory):
    datadir = str(tmp_path_factory.mktemp("backend"))
    b = Backend(datadir, free_port(), STORAGE)
    b.start()
    yield b
    b.purge()


@pytest.fixture
def mongo(backend):
    c = backend.client()
    yield c
    c.close()


@pytest.fixture
def db(mongo, request):
    """A database of its own for each test, dropped afterwards."""
    name = "t_" + re.sub(r"[^A-Za-z0-9]", "_", request.node.name)[:40] + "_" + uuid.uuid4().hex[:6]
    yield mongo[name]
    mongo.drop_database(name)


@pytest.fixture
def bucket(db):
    return gridfs.GridFSBucket(db)


# libmongoc sets up its shared-memory counters in a library constructor, before
# main, and warns on stderr when /dev/shm still holds the counters file of a
# killed process that had the same pid (pid_max is 32768 on some machines, and
# tests kill processes). gridfsctl cannot silence a warning printed before it
# runs, so tests that count stderr lines leave that one out.
# Every document of a bucket's gridfsctl_locks but the counts of numbered takes
# ("import.taken", "import:P/.taken"), which stay (lib/lock.h): a run that released
# its locks leaves none of these.
LOCK_DOCS = {"_id": {"$not": bson.regex.Regex(r"\.taken$")}}

DRIVER_SHM_WARNING = re.compile(r"^.*mongoc: Falling back to malloc for counters\.\n", re.M)


class Result:
    def __init__(self, proc):
        self.rc = proc.returncode
        self.out = proc.stdout
        err = proc.stderr.decode("utf-8", "replace") if isinstance(proc.stderr, bytes) else proc.stderr
        self.err = DRIVER_SHM_WARNING.sub("", err) if err else err

    @property
    def text(self):
        return self.out.decode("utf-8", "replace") if isinstance(self.out, bytes) else self.out

    def __repr__(self):
        return f"Result(rc={self.rc}, out={self.text[:400]!r}, err={self.err[:800]!r})"


def check_sanitizer_report(err, rc=None):
    """Fails on a sanitizer report in err (a run's standard error) or, given
    its exit status rc, on a sanitizer's own (see SAN_ENV)."""
    for marker in SAN_MARKERS:
        assert marker not in err, f"sanitizer report:\n{err}"
    assert rc not in (86, 87), f"sanitizer exit:\n{err}"


def check_sanitizers(res):
    check_sanitizer_report(res.err, res.rc)


class Binary:
    """The gridfsctl under test (BIN, the one place tests find it), run with
    the sanitizer settings and no configuration file; every run's standard
    error is checked for sanitizer reports. wrap is a command that execs it
    (setpriv, unshare, ...); db=False leaves out the test database."""

    dbname = cwd = None

    def __init__(self):
        self.env = dict(os.environ, **SAN_ENV)
        self.env["GRIDFSCTL_CONFIG"] = "/dev/null"
        # Tests kill servers with SIGKILL; each would leave /dev/shm/mongoc-PID,
        # and a later run given that pid would print a driver warning on its
        # standard error (see MONGOC_DISABLE_SHM in gridfsctl(1)).
        self.env["MONGOC_DISABLE_SHM"] = "1"

    def argv(self, *args, wrap=(), db=True):
        tail = ["--db", self.dbname] if db and self.dbname else []
        return [str(w) for w in wrap] + [BIN] + [str(a) for a in args] + tail

    def run(self, *args, input=None, cwd=None, env=None, timeout=120, wrap=(), db=True, **kw):
        proc = subprocess.run(self.argv(*args, wrap=wrap, db=db), input=input, capture_output=True,
                              cwd=cwd or self.cwd, env=dict(self.env, **(env or {})),
                              timeout=timeout, **kw)
        res = Result(proc)
        check_sanitizers(res)
        return res

    def popen(self, *args, env=None, wrap=(), db=True, **kw):
        return subprocess.Popen(self.argv(*args, wrap=wrap, db=db),
                                env=dict(self.env, **(env or {})), **kw)


class Gridfsctl(Binary):
    """Runs the gridfsctl binary against the test database."""

    def __init__(self, backend, dbname, tmp_path):
        super().__init__()
        self.backend, self.dbname, self.tmp_path = backend, dbname, tmp_path
        self.cwd = tmp_path
        self.env["GRIDFSCTL_URI"] = backend.uri
        self.env.pop("GRIDFSCTL_BUCKET", None)


@pytest.fixture(scope="session")
def gridfsctl():
    """The binary alone, for what needs no backend (--help, _complete, supervise)."""
    return Binary()


@pytest.fixture
def gfs(backend, db, tmp_path):
    return Gridfsctl(backend, db.name, tmp_path)


def sha256(data):
    return hashlib.sha256(data).hexdigest()
