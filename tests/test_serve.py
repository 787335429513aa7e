"""gridfsctl serve: a real server process, real HTTP clients (http.client and
curl), bodies checked against pymongo's gridfs."""
import hashlib
import http.client
import os
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.parse

import pytest
from bson import ObjectId

import planted
from test_notify import messages_until
from wireproxy import Rule, WireProxy
from conftest import Backend, check_sanitizer_report, free_port, proc_stat, wait_for  # noqa: F401 (wait_for: other suites take it from here)

HTTP_PORTS = range(18300, 18400)
BACKEND_PORTS = range(27360, 27400)


def sha(data):
    return hashlib.sha256(data).hexdigest()


class Server:
    def __init__(self, gfs, tmp_path, *args, env=None, preexec_fn=None, port=None, argv=None,
                 pass_fds=()):
        self.port = port or free_port(HTTP_PORTS)
        # Several servers may share a port (SO_REUSEPORT): each needs a log of its own.
        self.errfile = tmp_path / f"serve-{self.port}-{len(list(tmp_path.glob(f'serve-{self.port}-*.err')))}.err"
        self.err = open(self.errfile, "wb")
        if argv is None:
            argv = ["serve", "--listen", f"127.0.0.1:{self.port}", "--poll", "0.2", *args]
            self.proc = gfs.popen(*argv, env=env, stdout=subprocess.DEVNULL, stderr=self.err,
                                  preexec_fn=preexec_fn)
        else:
            self.proc = subprocess.Popen(argv, env=dict(gfs.env, **(env or {})),
                                         stdout=subprocess.DEVNULL, stderr=self.err,
                                         pass_fds=pass_fds)
        wait_for(self.answers, 60, "the server to answer")
        # On a shared port another server may have answered: wait for this one to say it serves.
        wait_for(lambda: "serving" in self.stderr(), 60, "the server to start serving")

    def answers(self):
        assert self.proc.poll() is None, f"server exited: {self.stderr()}"
        try:
            self.get("/_health")
            return True
        except OSError:
            return False

    def conn(self, timeout=30):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, headers=None, conn=None):
        c = conn or self.conn()
        c.request(method, path, headers=headers or {})
        r = c.getresponse()
        body = r.read()
        if not conn:
            c.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, body

    def get(self, path, headers=None, conn=None):
        return self.request("GET", path, headers, conn)

    def stderr(self):
        return self.errfile.read_text(errors="replace")

    def health(self):
        """/_health's status and lines."""
        status, _, body = self.get("/_health")
        return status, body.decode().splitlines()

    def preloaded(self, deadline_s=60):
        """Waits until /_health says the --preload pass is over (serve answers during it)."""
        wait_for(lambda: "preload: done" in self.health()[1], deadline_s,
                 lambda: f"the preload to be done: {self.health()}", proc=self.proc)

    def metrics(self):
        _, _, body = self.get("/_metrics")
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            rc = self.proc.wait(timeout=60)
        else:
            rc = self.proc.returncode
        self.err.close()
        err = self.stderr()
        check_sanitizer_report(err)
        assert rc == 0, f"rc={rc}: {err}"
        return err


@pytest.fixture
def serve(gfs, tmp_path):
    servers = []

    def start(*args, **kw):
        s = Server(gfs, tmp_path, *args, **kw)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def put(bucket, name, data, sha256=True, **kw):
    meta = {"sha256": sha(data)} if sha256 else None
    return bucket.upload_from_stream(name, data, metadata=meta, **kw)


def quote(name):
    return "/" + urllib.parse.quote(name)


# ---- bodies and headers ---------------------------------------------------

def test_bodies_identical_to_gridfs(bucket, serve):
    rng = random.Random(6)
    files = {f"posters/{i:02x}/{i}.jpg": bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 90000)))
             for i in range(20)}
    files["empty.txt"] = b""
    files["chunk-edge.bin"] = os.urandom(255 * 1024)
    for name, data in files.items():
        put(bucket, name, data)
    s = serve()
    c = s.conn()
    for _ in range(2):  # second pass: from the cache, on the same keep-alive connection
        for name, data in files.items():
            status, h, body = s.get(quote(name), conn=c)
            assert status == 200, name
            assert body == bucket.open_download_stream_by_name(name).read()
            assert int(h["content-length"]) == len(data)
            assert h["etag"] == f'"{sha(data)}"'
            assert h["accept-ranges"] == "bytes"
            assert "last-modified" in h and "cache-control" in h
    c.close()
    assert s.get("/posters/00/0.jpg")[1]["content-type"] == "image/jpeg"
    m = s.metrics()
    assert m["gridfsctl_serve_cache_hits_total"] >= len(files)
    assert m['gridfsctl_serve_requests_total{code="200"}'] >= 2 * len(files)


def test_content_type_and_etag_fallbacks(bucket, db, serve):
    put(bucket, "typed.dat", b"x", sha256=False, )
    db.fs.files.update_one({"filename": "typed.dat"}, {"$set": {"contentType": "application/x-special"}})
    put(bucket, "page.html", b"<p>hi</p>", sha256=False)
    s = serve()
    _, h, _ = s.get("/typed.dat")
    assert h["content-type"] == "application/x-special"
    doc = db.fs.files.find_one({"filename": "typed.dat"})
    assert h["etag"].startswith(f'"{doc["_id"]}-')  # no sha256 or md5: id and upload time
    _, h, _ = s.get("/page.html")
    assert h["content-type"].startswith("text/html")


def test_head(bucket, serve):
    data = os.urandom(5000)
    put(bucket, "h.bin", data)
    s = serve()
    for _ in range(2):  # not cached yet, then cached after a GET
        status, h, body = s.request("HEAD", "/h.bin")
        assert status == 200 and body == b""
        assert int(h["content-length"]) == 5000
        assert h["etag"] == f'"{sha(data)}"'
        s.get("/h.bin")
    out = subprocess.run(["curl", "-sI", f"http://127.0.0.1:{s.port}/h.bin"], capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith("HTTP/1.1 200") and "Content-Length: 5000" in out


# ---- conditional requests -------------------------------------------------

def test_conditional_requests(bucket, serve):
    data = b"conditional body\n"
    put(bucket, "c.txt", data)
    s = serve()
    status, h, _ = s.get("/c.txt")
    etag, lm = h["etag"], h["last-modified"]
    for hdrs in ({"If-None-Match": etag}, {"If-None-Match": f'"nope", {etag}'},
                 {"If-None-Match": "*"}, {"If-None-Match": "W/" + etag},
                 {"If-Modified-Since": lm}, {"If-Modified-Since": "Fri, 01 Jan 2100 00:00:00 GMT"}):
        status, h304, body = s.get("/c.txt", hdrs)
        assert status == 304, hdrs
        assert body == b"" and h304["etag"] == etag
    # If-None-Match wins over If-Modified-Since.
    status, _, body = s.get("/c.txt", {"If-None-Match": '"other"', "If-Modified-Since": lm})
    assert status == 200 and body == data
    status, _, body = s.get("/c.txt", {"If-Modified-Since": "Sat, 01 Jan 2000 00:00:00 GMT"})
    assert status == 200 and body == data
    status, _, body = s.get("/c.txt", {"If-Modified-Since": "not a date"})
    assert status == 200
    out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H",
                          f"If-None-Match: {etag}", f"http://127.0.0.1:{s.port}/c.txt"],
                         capture_output=True, text=True, check=True).stdout
    assert out == "304"


# ---- ranges ---------------------------------------------------------------

def test_ranges(bucket, serve):
    data = bytes(range(256)) * 40
    put(bucket, "r.bin", data)
    s = serve()
    n = len(data)
    for first_pass in (True, False):  # not cached, then cached
        for rng, (a, b) in (("bytes=0-9", (0, 9)), ("bytes=100-", (100, n - 1)),
                            ("bytes=-5", (n - 5, n - 1)), ("bytes=10-999999", (10, n - 1))):
            status, h, body = s.get("/r.bin", {"Range": rng})
            assert status == 206, rng
            assert body == data[a:b + 1]
            assert h["content-range"] == f"bytes {a}-{b}/{n}"
            assert int(h["content-length"]) == b - a + 1
    status, h, body = s.get("/r.bin", {"Range": f"bytes={n}-"})
    assert status == 416 and h["content-range"] == f"bytes */{n}"
    # Several ranges, or a bad unit: the whole file.
    assert s.get("/r.bin", {"Range": "bytes=0-1,5-6"})[0] == 200
    assert s.get("/r.bin", {"Range": "lines=1-2"})[0] == 200
    etag = s.get("/r.bin")[1]["etag"]
    status, _, body = s.get("/r.bin", {"Range": "bytes=0-3", "If-Range": etag})
    assert status == 206 and body == data[:4]
    status, _, body = s.get("/r.bin", {"Range": "bytes=0-3", "If-Range": '"stale"'})
    assert status == 200 and body == data
    out = subprocess.run(["curl", "-s", "-r", "3-7", f"http://127.0.0.1:{s.port}/r.bin"],
                         capture_output=True, check=True).stdout
    assert out == data[3:8]


def test_large_file_streamed(bucket, serve, tmp_path):
    data = os.urandom(20 * 1024 * 1024 + 12345)
    put(bucket, "big/video.bin", data)
    s = serve("--cache-size", "64M")
    out = tmp_path / "big.out"
    res = subprocess.run(["curl", "-s", "-o", str(out), "-w", "%{http_code}",
                          f"http://127.0.0.1:{s.port}/big/video.bin"], capture_output=True, text=True)
    assert res.stdout == "200"
    assert sha(out.read_bytes()) == sha(data)
    # A range deep inside, across a chunk boundary.
    a = 255 * 1024 * 30 - 10
    status, _, body = s.get("/big/video.bin", {"Range": f"bytes={a}-{a + 99}"})
    assert status == 206 and body == data[a:a + 100]
    m = s.metrics()
    assert m["gridfsctl_serve_cache_bytes"] < 1024 * 1024  # streamed, never cached


# ---- errors ---------------------------------------------------------------

def test_errors(bucket, serve):
    oid = put(bucket, "e.txt", b"e")
    s = serve()
    assert s.get("/missing.txt")[0] == 404
    assert s.get("/")[0] == 404
    assert s.get("/id/not-an-oid")[0] == 400
    assert s.get("/id/0123456789abcdef0123456")[0] == 400
    assert s.get("/id/0123456789abcdef01234567")[0] == 404
    assert s.get("/e.txt?rev=x")[0] == 400
    assert s.get("/e.txt?rev=3")[0] == 404
    for method in ("POST", "PUT", "DELETE", "OPTIONS"):
        status, h, _ = s.request(method, "/e.txt")
        assert status == 405 and h["allow"] == "GET, HEAD"
    status, _, body = s.get(f"/id/{oid}")
    assert status == 200 and body == b"e"
    status, _, body = s.get(f"/id/{str(oid).upper()}")
    assert status == 200 and body == b"e"
    # A flood of misses for names never answers from the backend twice.
    for _ in range(50):
        assert s.get("/id/0123456789abcdef01234567")[0] == 404
    assert s.metrics()["gridfsctl_serve_negative_cache_hits_total"] >= 50


def test_names_and_prefix(bucket, serve):
    names = ["dir/sub/file.txt", "with space.txt", "ünïcødé/名前.txt", "per%cent.txt",
             "question?.txt", "hash#.txt", "plus+sign.txt"]
    for i, name in enumerate(names):
        put(bucket, "site/" + name, f"content {i}".encode())
    put(bucket, "outside.txt", b"outside")
    s = serve()
    for i, name in enumerate(names):
        status, _, body = s.get(quote("site/" + name))
        assert status == 200, name
        assert body == f"content {i}".encode()
    p = serve("--prefix", "site")
    for i, name in enumerate(names):
        status, _, body = p.get(quote(name))
        assert status == 200, name
        assert body == f"content {i}".encode()
    assert p.get("/outside.txt")[0] == 404
    assert p.get("/../outside.txt")[0] in (400, 404)
    oid = bucket.find({"filename": "outside.txt"}).next()._id
    assert p.get(f"/id/{oid}")[0] == 404  # not under the prefix
    out = subprocess.run(["curl", "-s", f"http://127.0.0.1:{p.port}/%C3%BCn%C3%AFc%C3%B8d%C3%A9/%E5%90%8D%E5%89%8D.txt"],
                         capture_output=True, check=True).stdout
    assert out == b"content 2"


def test_revisions_and_new_uploads(bucket, serve):
    put(bucket, "v.txt", b"one")
    s = serve()
    assert s.get("/v.txt")[2] == b"one"
    put(bucket, "v.txt", b"two")
    # New revisions show within the poll interval (0.2 s here).
    wait_for(lambda: s.get("/v.txt")[2] == b"two", 15, "the new revision")
    assert s.get("/v.txt?rev=0")[2] == b"one"
    assert s.get("/v.txt?rev=-2")[2] == b"one"
    assert s.get("/v.txt?rev=1")[2] == b"two"
    assert s.get("/v.txt?rev=-1")[2] == b"two"
    put(bucket, "brand-new.txt", b"new")
    wait_for(lambda: s.get("/brand-new.txt")[0] == 200, 15, "the new file")


def test_reused_id_and_string_ids_never_serve_other_content(bucket, serve):
    oid = ObjectId()
    bucket.upload_from_stream_with_id(oid, "reused.bin", b"a" * 100)  # no sha256: the date names it
    # A string _id spelling an ObjectId is not that ObjectId. (FerretDB refuses to store
    # both at once, its unique indexes take them for equal; MongoDB stores both.)
    hex_id = str(ObjectId())
    bucket.upload_from_stream_with_id(hex_id, "string-id.txt", b"string id")
    s = serve()
    assert s.get("/reused.bin")[2] == b"a" * 100  # now in the cache
    assert s.get("/string-id.txt")[2] == b"string id"
    assert s.get(f"/id/{hex_id}")[0] == 404  # /id/ names ObjectIds only
    # Deleted, then uploaded again under the same _id, longer: the cached body must not be reused.
    bucket.delete(oid)
    new = bytes(range(256)) * 20
    bucket.upload_from_stream_with_id(oid, "reused.bin", new)
    wait_for(lambda: s.get("/reused.bin")[2] == new, 15, "the content uploaded again")
    status, h, body = s.get("/reused.bin", headers={"Range": "bytes=4000-4099"})
    assert status == 206 and body == new[4000:4100]
    assert h["content-range"] == f"bytes 4000-4099/{len(new)}"


# ---- operations -----------------------------------------------------------

def test_health_metrics_access_log(bucket, serve, tmp_path):
    put(bucket, "a.txt", b"abc")
    log = tmp_path / "access.log"
    s = serve("--access-log", str(log), "--cache-control", "max-age=5")
    status, _, body = s.get("/_health")
    assert status == 200 and body == b"ok\n"
    c = s.conn()
    c.request("GET", "/a.txt?x=1", headers={"User-Agent": "probe/1", "Referer": "http://r/"})
    r = c.getresponse()
    assert r.read() == b"abc" and r.getheader("Cache-Control") == "max-age=5"
    c.close()
    s.get("/nope")
    # A request is counted when libmicrohttpd reports it complete, which may
    # come after the client has read the response.
    def counted():
        m = s.metrics()
        return 'gridfsctl_serve_requests_total{code="404"}' in m and m

    m = wait_for(counted, 10, "the 404 counted")
    for key in ("gridfsctl_serve_cache_misses_total", "gridfsctl_serve_cache_evictions_total",
                'gridfsctl_serve_backend_seconds_bucket{le="+Inf"}', "gridfsctl_serve_open_connections",
                "gridfsctl_serve_open_fds", "gridfsctl_serve_max_fds", "gridfsctl_serve_response_bytes_total",
                'gridfsctl_serve_requests_total{code="404"}'):
        assert key in m, key
    lines = wait_for(lambda: len(log.read_text().splitlines()) >= 3 and log.read_text().splitlines(),
                     10, "access log lines")
    hit = [ln for ln in lines if "/a.txt?x=1" in ln][0]
    assert hit.startswith("127.0.0.1 - - [")
    assert '"GET /a.txt?x=1 HTTP/1.1" 200 3 "http://r/" "probe/1"' in hit
    assert any('"GET /nope HTTP/1.1" 404 ' in ln for ln in lines)
    # Log rotation: rename, SIGHUP, and new lines go to a new file of the old name.
    os.rename(log, tmp_path / "access.log.1")
    s.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: log.exists(), 10, "the reopened log")
    s.get("/a.txt?after=rotation")
    wait_for(lambda: "after=rotation" in log.read_text(), 10, "a line in the new log")
    assert "after=rotation" not in (tmp_path / "access.log.1").read_text()


def test_backend_down_then_recovery(gfs, tmp_path, serve, db):
    b = Backend(str(tmp_path / "private-backend"), free_port(BACKEND_PORTS), "sqlite")
    os.makedirs(b.datadir)
    b.start()
    try:
        client = b.client()
        import gridfs
        bk = gridfs.GridFSBucket(client[db.name])
        put(bk, "cached.txt", b"cached")
        put(bk, "uncached.txt", b"uncached")
        client.close()
        s = serve(env={"GRIDFSCTL_URI": b.uri})
        assert s.get("/cached.txt")[2] == b"cached"
        b.stop()
        status, h, _ = wait_for(lambda: (lambda r: r[0] == 503 and r)(s.get("/uncached.txt")), 60,
                                "503 for a file not in the cache")
        assert h["retry-after"] == "1"
        assert s.get("/cached.txt") [0:3:2] == (200, b"cached")  # cached files still served
        assert s.get("/_health")[0] == 503
        b.start()
        wait_for(lambda: s.get("/uncached.txt")[0] == 200, 60, "recovery")
        assert s.get("/uncached.txt")[2] == b"uncached"
        assert s.get("/_health")[0] == 200
        assert "backend unreachable" in s.stderr() and "reachable again" in s.stderr()
    finally:
        b.stop()


def cpu_seconds(pid):
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def low_limit():
    """preexec_fn: 64 descriptors, soft and hard, so serve cannot raise them."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


def connecting(port, n):
    """n non-blocking client sockets connecting to port, for the caller to close."""
    socks = []
    for _ in range(n):
        sk = socket.socket()
        sk.setblocking(False)
        sk.connect_ex(("127.0.0.1", port))
        socks.append(sk)
    return socks


def test_out_of_descriptors(bucket, serve):
    for i in range(5):
        put(bucket, f"f{i}.txt", f"file {i}".encode())

    s = serve("--preload", "--workers", "2", "--threads", "2", preexec_fn=low_limit)
    socks = []
    try:
        socks = connecting(s.port, 500)
        for sk in socks:
            try:
                sk.send(b"GET /f1.txt HTTP/1.1\r\nHost: x\r\n\r\n")
            except OSError:
                pass
        wait_for(lambda: "Too many open files" in s.stderr(), 30, "the EMFILE line")
        assert s.proc.poll() is None
        # Out of descriptors with every connection held open: it must idle, not spin.
        t0, c0 = time.monotonic(), cpu_seconds(s.proc.pid)
        time.sleep(2)  # measuring CPU use over an interval, not waiting for an event
        used = cpu_seconds(s.proc.pid) - c0
        assert used < 0.5 * (time.monotonic() - t0), f"{used:.2f}s of CPU while at the limit"
    finally:
        for sk in socks:
            sk.close()
    # Once the clients are gone it serves again.
    wait_for(lambda: s.get("/f2.txt")[2] == b"file 2", 60, "serving again")
    err = s.stderr()
    assert err.count("Too many open files") == 1, err
    assert s.metrics()["gridfsctl_serve_accept_emfile_total"] >= 1


def test_out_of_descriptors_says_how_many_connections_are_open(bucket, serve):
    # 150 clients against 64 descriptors: the accepting thread takes a burst
    # before any event thread starts one, and the line must count them all.
    put(bucket, "f.txt", b"f")

    s = serve("--workers", "2", "--threads", "2", preexec_fn=low_limit)
    idle = s.metrics()["gridfsctl_serve_open_fds"]  # this request's connection among them
    socks = []
    try:
        socks = connecting(s.port, 150)
        line = wait_for(lambda: re.search(r"accept: Too many open files \(limit 64, (\d+) "
                                          r"connections open\)", s.stderr()), 30, "the EMFILE line")
        assert 64 - idle - 4 <= int(line.group(1)) <= 64, line.group(0)
    finally:
        for sk in socks:
            sk.close()
    wait_for(lambda: s.metrics()["gridfsctl_serve_open_connections"] == 1, 30,
             "the connections to be counted closed")


def test_sigterm_drains_and_exits(bucket, serve):
    put(bucket, "d.txt", b"d")
    s = serve()
    c = s.conn()
    assert s.get("/d.txt", conn=c)[2] == b"d"  # an idle keep-alive connection does not hold it up
    t0 = time.monotonic()
    err = s.stop()
    assert time.monotonic() - t0 < 10
    assert "draining" in err
    c.close()


def test_inherited_socket_and_reuseport(bucket, gfs, tmp_path, serve):
    put(bucket, "s.txt", b"socket")
    port = free_port(HTTP_PORTS)
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", port))
    lsock.listen(64)
    fd = lsock.fileno()
    # Like systemd: the socket at fd 3, LISTEN_PID naming the process that execs gridfsctl.
    script = ("import os, sys\n"
              "os.dup2(int(sys.argv[1]), 3)\n"
              "os.close(int(sys.argv[1]))\n"
              "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1')\n"
              "os.execv(sys.argv[2], sys.argv[2:])\n")
    s = serve(argv=gfs.argv("serve", "--listen", "127.0.0.1:1", wrap=[sys.executable, "-c", script, fd]),
              port=port, pass_fds=(fd,))
    lsock.close()  # the server holds its own copy now
    assert s.get("/s.txt")[2] == b"socket"
    assert "inherited socket" in s.stderr()
    # Two servers on one port with SO_REUSEPORT.
    a = serve()
    b = serve(port=a.port)
    assert a.get("/s.txt")[2] == b"socket" and b.get("/s.txt")[2] == b"socket"


def test_connections_spread_over_event_threads(bucket, serve):
    # Three keep-alive clients and three event threads: one each, never two on one thread.
    put(bucket, "k.txt", b"keep")
    s = serve("--threads", "3")
    held = [s.conn() for _ in range(3)]
    for c in held:
        assert s.get("/k.txt", conn=c)[2] == b"keep"
    m = s.metrics()  # on a fourth connection, which joins one of the threads
    per_thread = sorted(v for k, v in m.items() if k.startswith("gridfsctl_serve_thread_connections"))
    assert per_thread == [1, 1, 2], m
    for c in held:
        c.close()


def test_usage_errors(gfs):
    for args in (["--listen", "nonsense"], ["--cache-size", "lots"], ["--threads", "0"],
                 ["extra-arg"], ["--poll", "-1"]):
        r = gfs.run("serve", *args)
        assert r.rc == 2, (args, r)
    r = gfs.run("serve", "--help")
    assert r.rc == 0 and "--cache-size" in r.text
    r = gfs.run("_options", "serve", db=False)
    assert "--listen=" in r.text and "--preload" in r.text


def test_one_fetch_per_file_and_bounded_queue(bucket, serve):
    import concurrent.futures
    data = os.urandom(200000)
    put(bucket, "hot.bin", data)
    for i in range(40):
        put(bucket, f"many/{i}.bin", os.urandom(1000 + i))
    s = serve("--workers", "2")
    with concurrent.futures.ThreadPoolExecutor(50) as ex:
        results = list(ex.map(lambda _: s.get("/hot.bin"), range(50)))
    assert all(r[0] == 200 and r[2] == data for r in results)
    m = s.metrics()
    # However many asked at once, the file was read from the backend once.
    assert m["gridfsctl_serve_backend_seconds_count"] == 1
    assert m["gridfsctl_serve_cache_entries"] == 1

    q = serve("--workers", "1", "--queue", "1")
    with concurrent.futures.ThreadPoolExecutor(40) as ex:
        results = list(ex.map(lambda i: q.get(f"/many/{i}.bin"), range(40)))
    busy = [r for r in results if r[0] == 503]
    assert all(r[0] in (200, 503) for r in results)
    assert busy, "a one-slot queue should have refused some of 40 concurrent misses"
    assert all(r[1]["retry-after"] == "1" for r in busy)
    assert q.metrics()["gridfsctl_serve_queue_full_total"] == len(busy)
    for i in range(40):  # and each is served once asked again
        assert wait_for(lambda: q.get(f"/many/{i}.bin")[0] == 200, 10, "a retry")


def test_damaged_file_is_500_not_wrong_bytes(bucket, db, serve):
    oid = put(bucket, "bad.bin", b"A" * 1000)
    put(bucket, "short.bin", b"B" * 1000)
    db.fs.chunks.update_one({"files_id": oid, "n": 0}, {"$set": {"data": b"C" * 1000}})
    short = db.fs.files.find_one({"filename": "short.bin"})["_id"]
    db.fs.chunks.delete_many({"files_id": short})
    s = serve()
    assert s.get("/bad.bin")[0] == 500      # sha256 mismatch: never sent as if good
    assert s.get("/short.bin")[0] == 500    # missing chunk
    err = s.stderr()
    assert "bad.bin" in err and "short.bin" in err


def test_preload_caches_every_sound_file(bucket, db, serve):
    files = {"a.txt": b"a" * 10, "empty.txt": b"", "two-chunks.bin": os.urandom(300 * 1024)}
    for name, data in files.items():
        put(bucket, name, data)
    bad = put(bucket, "bad.bin", b"A" * 1000)
    db.fs.chunks.update_one({"files_id": bad, "n": 0}, {"$set": {"data": b"C" * 1000}})
    s = serve("--preload")
    s.preloaded()
    m = s.metrics()
    assert m["gridfsctl_serve_preloaded_files_total"] == len(files)
    for name, data in files.items():
        assert s.get(quote(name))[2] == data
    assert s.metrics()["gridfsctl_serve_cache_misses_total"] == 0
    assert s.get("/bad.bin")[0] == 500  # never cached, read again and refused


class FirstGetMore(Rule):
    """The first getMore, paused: with one-chunk files and fewer files than a
    batch of files documents, only --preload's pass over fs.chunks has one."""

    def __init__(self):
        super().__init__("getMore", None, "pause")

    def matches(self, cmd, value):
        return not self.fired.is_set() and cmd == "getMore"


def preload_paused(bucket, backend, serve, n=40, env=None):
    """A --preload server whose pass is held in its second batch of chunks
    (a batch is 32 chunks): the first batch is cached, the rest is not."""
    files = {f"p/{i:02}.txt": f"poster {i}".encode() * 50 for i in range(n)}
    for name, data in files.items():
        put(bucket, name, data)
    proxy = WireProxy(backend.port)
    rule = proxy.add(FirstGetMore())
    s = serve("--preload", env=dict(env or {}, GRIDFSCTL_URI=proxy.uri))
    assert rule.fired.wait(30), "the preload never asked for its second batch"
    return s, rule, files, proxy


def test_preload_runs_while_serving(bucket, backend, serve, tmp_path):
    # The pass used to come before listening: 35 s of refused connections at 52,000 files.
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(60)
    s, rule, files, proxy = preload_paused(bucket, backend, serve,
                                           env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    try:
        ready = messages_until(notify, "READY=1")[-1].split("\n")
        assert "STATUS=serving; preload running" in ready, ready
        assert s.health() == (200, ["ok", "preload: running"])
        assert 0 < s.metrics()["gridfsctl_serve_preloaded_files_total"] < len(files)
        for name, data in files.items():  # the rest from the backend, meanwhile
            assert s.get(quote(name))[:3:2] == (200, data), name
        rule.release()
        messages_until(notify, "STATUS=serving; preload done")
        assert s.health() == (200, ["ok", "preload: done"])
        m = s.metrics()
        assert m["gridfsctl_serve_preloaded_files_total"] == len(files)
        assert "preload done: 40 files cached" in s.stderr()
    finally:
        rule.release_now.set()
        proxy.close()
        notify.close()


def test_sigterm_in_the_middle_of_the_preload_stops_cleanly(bucket, backend, serve):
    s, rule, files, proxy = preload_paused(bucket, backend, serve)
    try:
        cached = s.metrics()["gridfsctl_serve_preloaded_files_total"]
        s.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "terminated: draining" in s.stderr(), 30, "the drain", proc=s.proc)
        rule.release()  # the batch arrives after the stop: the pass must end there
        err = s.stop()  # exit 0, and the sanitizers' word on what the pass held
        assert "preload done" not in err and "preload stopped early" not in err, err
        assert 0 < cached < len(files)
    finally:
        rule.release_now.set()
        proxy.close()


def test_preload_waits_for_a_backend_down_at_start(tmp_path, serve, db):
    b = Backend(str(tmp_path / "late-backend"), free_port(BACKEND_PORTS), "sqlite")
    os.makedirs(b.datadir)
    b.start()
    client = b.client()
    import gridfs
    put(gridfs.GridFSBucket(client[db.name]), "late.txt", b"late")
    client.close()
    b.stop()
    s = serve("--preload", env={"GRIDFSCTL_URI": b.uri})  # nothing listens there now
    assert s.health() == (503, ["backend unavailable", "preload: running"])
    b.start()
    try:
        s.preloaded()
        assert s.metrics()["gridfsctl_serve_preloaded_files_total"] == 1
        assert s.get("/late.txt")[2] == b"late"
    finally:
        b.stop()


def test_starts_without_backend(tmp_path, serve, db):
    b = Backend(str(tmp_path / "late-backend"), free_port(BACKEND_PORTS), "sqlite")
    os.makedirs(b.datadir)
    s = serve(env={"GRIDFSCTL_URI": b.uri})  # nothing listens there yet
    assert s.get("/_health")[0] == 503
    assert s.get("/late.txt")[0] == 503
    b.start()
    try:
        client = b.client()
        import gridfs
        put(gridfs.GridFSBucket(client[db.name]), "late.txt", b"late")
        client.close()
        wait_for(lambda: s.get("/late.txt")[0] == 200, 60, "the index to load")
        assert s.get("/late.txt")[2] == b"late" and s.get("/_health")[0] == 200
    finally:
        b.stop()


# ---- hostile requests -----------------------------------------------------

def raw_request(port, data, timeout=10):
    """Sends data as is on a new connection; returns all the server sent until it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sk:
        sk.sendall(data)
        sk.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            part = sk.recv(65536)
            if not part:
                return out
            out += part


def status_of(reply):
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/") else None


def test_nul_in_the_request_is_400(bucket, serve):
    put(bucket, "name", b"the body of name")
    put(bucket, "secret", b"secret")
    s = serve()
    assert s.get("/name")[2] == b"the body of name"
    for path in ("/name%00.jpg", "/name%00/../../secret", "/id/%00", "/name?rev=%00"):
        reply = raw_request(s.port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert status_of(reply) == 400, (path, reply[:200])
        assert b"the body of name" not in reply
    reply = raw_request(s.port, b"GET /name\x00.jpg HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(reply) == 400 and b"the body of name" not in reply, reply[:200]
    assert s.get("/name")[0] == 200  # the server is still fine


def test_http_nits(bucket, db, serve):
    from planted import HOSTILE_CONTENT_TYPES
    data = b"0123456789"
    put(bucket, "r.txt", data)
    for i, ctype in enumerate(HOSTILE_CONTENT_TYPES):
        put(bucket, f"typed{i}.png", b"png")
        db.fs.files.update_one({"filename": f"typed{i}.png"}, {"$set": {"contentType": ctype}})
    s = serve()
    # HTTP/1.1 requires Host; HTTP/1.0 does not.
    assert status_of(raw_request(s.port, b"GET /r.txt HTTP/1.1\r\nConnection: close\r\n\r\n")) == 400
    assert status_of(raw_request(s.port, b"GET /r.txt HTTP/1.0\r\n\r\n")) == 200
    for first in ("9223372036854775807", "9223372036854775808", "99999999999999999999999"):
        status, h, _ = s.get("/r.txt", {"Range": f"bytes={first}-"})
        assert status == 416 and h["content-range"] == f"bytes */{len(data)}", first
    status, h, body = s.get("/r.txt", {"Range": "bytes=2-99999999999999999999999"})
    assert status == 206 and body == data[2:] and h["content-range"] == "bytes 2-9/10"
    status, _, body = s.get("/r.txt", {"Range": "bytes=-99999999999999999999999"})
    assert status == 206 and body == data
    for i in range(len(HOSTILE_CONTENT_TYPES)):  # the guess from the name instead
        status, h, body = s.get(f"/typed{i}.png")
        assert status == 200 and body == b"png"
        assert h["content-type"] == "image/png" and "x-injected" not in h, i


def test_poll_finds_files_dated_before_the_newest_seen(bucket, db, serve):
    import datetime
    from planted import plant
    put(bucket, "fresh.txt", b"fresh")
    s = serve()  # --poll 0.2; the full reload (60 s) is far beyond the bound below
    assert s.get("/fresh.txt")[0] == 200
    # A writer whose clock is 20 s behind inserts after the server has seen newer files.
    late = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=20)
    plant(db, ObjectId(), "late.txt", b"late writer", uploadDate=late)
    wait_for(lambda: s.get("/late.txt")[0] == 200, 10, "the late-dated file within a few polls")
    assert s.get("/late.txt")[2] == b"late writer"


def connect_from(addr, port):
    """A connection from another loopback address, so the per-address count is its own."""
    sk = socket.socket()
    sk.bind((addr, 0))
    sk.settimeout(10)
    sk.connect(("127.0.0.1", port))
    return sk


def closed_by_server(sk):
    """True once the server has ended the connection (EOF or reset), without blocking."""
    import select
    if not select.select([sk], [], [], 0)[0]:
        return False
    try:
        return sk.recv(4096) == b""
    except OSError:
        return True


def test_slow_headers_are_cut_off(bucket, serve):
    import threading
    put(bucket, "ok.txt", b"ok")
    s = serve("--header-timeout", "1", "--timeout", "60")
    slow = [connect_from("127.0.0.2", s.port) for _ in range(5)]
    for sk in slow:
        sk.sendall(b"GET /ok.txt HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    stop = threading.Event()

    def trickle():  # one byte each 0.2 s: the idle timeout (60 s) never fires
        while not stop.wait(0.2):
            for sk in slow:
                try:
                    sk.send(b"a")
                except OSError:
                    pass

    t = threading.Thread(target=trickle)
    t.start()
    try:
        wait_for(lambda: all(closed_by_server(sk) for sk in slow), 20,
                 "the server to close connections whose headers trickle in")
    finally:
        stop.set()
        t.join()
        for sk in slow:
            sk.close()
    assert s.metrics()["gridfsctl_serve_header_timeouts_total"] >= 5
    assert s.get("/ok.txt")[2] == b"ok"  # prompt clients are served as before


def test_connections_per_address_are_capped(bucket, serve):
    put(bucket, "ok.txt", b"ok")
    s = serve("--max-per-ip", "3", "--header-timeout", "60")
    held = [connect_from("127.0.0.2", s.port) for _ in range(3)]
    try:
        request = b"GET /ok.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        extra = connect_from("127.0.0.2", s.port)
        try:
            extra.sendall(request)
        except OSError:
            pass
        reply = b""
        try:
            while part := extra.recv(4096):
                reply += part
        except OSError:
            pass
        extra.close()
        assert reply == b"", reply  # closed unanswered: that address has its three
        assert s.get("/ok.txt")[2] == b"ok"  # another address is served
        assert s.metrics()["gridfsctl_serve_per_address_refused_total"] >= 1
        held.pop().close()

        def served_again():
            sk = connect_from("127.0.0.2", s.port)
            try:
                sk.sendall(request)
                return b"\r\n\r\nok" in sk.recv(4096)
            except OSError:
                return False
            finally:
                sk.close()

        wait_for(served_again, 15, "a slot for that address once one of its connections closed")
    finally:
        for sk in held:
            sk.close()
    assert "refused" in s.stderr()


def read_head(sk):
    """Reads a response's status and headers; returns (status, headers, the body bytes read past them)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        part = sk.recv(65536)
        assert part, buf
        buf += part
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    hdrs = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    return int(lines[0].split()[1]), hdrs, rest


def test_stream_replaced_mid_way_never_ends_as_if_complete(bucket, serve):
    data = os.urandom(20 * 1024 * 1024)
    old = put(bucket, "movie.bin", data)
    s = serve("--cache-size", "16M")  # streams anything above 2M
    sk = socket.socket()
    sk.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # the server cannot run far ahead
    sk.settimeout(30)
    sk.connect(("127.0.0.1", s.port))
    sk.sendall(b"GET /movie.bin HTTP/1.1\r\nHost: x\r\n\r\n")
    status, h, body = read_head(sk)
    assert status == 200 and int(h["content-length"]) == len(data)
    while len(body) < 256 * 1024:
        body += sk.recv(65536)
    # A new revision replaces it, and the old one is removed, as put does.
    put(bucket, "movie.bin", b"the new revision")
    bucket.delete(old)
    try:
        while part := sk.recv(1 << 20):
            body += part
            if len(body) >= len(data):
                break
    except ConnectionResetError:
        pass
    sk.close()
    # The old chunks are gone: the connection ends short of Content-Length, never padded or
    # completed with other bytes, and the log says why.
    assert len(body) < len(data) and data.startswith(body)
    wait_for(lambda: "movie.bin: revision removed while streaming" in s.stderr(), 10, "the log line")


def test_sigterm_serves_connections_already_queued(bucket, serve):
    # Connections the kernel has queued but the server not yet accepted die with the
    # listening socket (with SO_REUSEPORT no other server can take them): a stopped
    # server holds a queue of them for certain, and they must all be answered.
    put(bucket, "q.txt", b"queued")
    s = serve("--max-per-ip", "0")
    socks = []
    s.proc.send_signal(signal.SIGSTOP)
    try:
        for _ in range(300):
            sk = socket.create_connection(("127.0.0.1", s.port), timeout=30)
            sk.sendall(b"GET /q.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            socks.append(sk)
    finally:
        s.proc.send_signal(signal.SIGTERM)
        s.proc.send_signal(signal.SIGCONT)
    answered = reset = 0
    for sk in socks:
        try:
            reply = b""
            while part := sk.recv(4096):
                reply += part
            answered += reply.endswith(b"\r\n\r\nqueued")
        except ConnectionResetError:
            reset += 1
        sk.close()
    assert (answered, reset) == (len(socks), 0)
    assert s.proc.wait(60) == 0

def test_serve_applies_the_integrity_rule(db, serve):
    """The rule of verify: upper-case hex is the same digest; a wrong legacy md5 is damage."""
    files = planted.plant_hash_variants(db)
    for args in ((), ("--preload",)):
        s = serve(*args)
        if args:
            s.preloaded()
        for name, (body, intact) in files.items():
            status, _, got = s.get("/" + name)
            want = (200, body) if intact else (500, got)
            assert (status, got) == want, (args, name, status)
    assert s.metrics()["gridfsctl_serve_preloaded_files_total"] == 2


def test_streamed_file_is_503_while_the_backend_is_down(tmp_path, serve, db):
    """F5: a streamed file got 200 and its whole Content-Length, then a cut with no body."""
    b = Backend(str(tmp_path / "stream-backend"), free_port(BACKEND_PORTS), "sqlite")
    os.makedirs(b.datadir)
    b.start()
    try:
        client = b.client()
        import gridfs
        data = os.urandom(150_000)
        put(gridfs.GridFSBucket(client[db.name]), "a.bin", data)
        client.close()
        # Above an eighth of the cache: streamed. No poll in the test's time, so that the first
        # request, not the poll, is what finds the backend gone; a short selection timeout keeps
        # its read brief.
        s = serve("--cache-size", "1M", "--negative-ttl", "0", "--poll", "3600",
                  env={"GRIDFSCTL_URI": b.uri + "?serverSelectionTimeoutMS=2000"})
        assert s.get("/a.bin")[0:3:2] == (200, data)
        assert s.metrics()["gridfsctl_serve_cache_bytes"] < len(data)
        b.stop()
        assert s.get("/_health")[0] == 200  # the server has not noticed yet
        # The first read finds the backend down, the second is refused without trying.
        for headers in ({}, {"Range": "bytes=1000-1999"}):
            status, h, _ = s.get("/a.bin", headers)
            assert (status, h.get("retry-after")) == (503, "1"), headers
        assert s.get("/_health")[0] == 503
    finally:
        b.stop()


def test_streamed_file_damaged_or_removed_gets_a_status_not_a_cut(bucket, db, serve):
    data = os.urandom(300_000)  # two chunks: both in the first window
    damaged = put(bucket, "damaged.bin", data)
    gone = put(bucket, "gone.bin", data)
    db.fs.chunks.delete_one({"files_id": damaged, "n": 1})
    s = serve("--cache-size", "1M")  # streams anything above 128K
    db.fs.files.delete_one({"_id": gone})  # as rm does: the files document first
    db.fs.chunks.delete_many({"files_id": gone})
    assert s.get("/damaged.bin")[0] == 500
    assert s.get("/gone.bin")[0] == 404
    assert "damaged.bin: missing chunk n=1" in s.stderr()


def raw_get(port, path, headers=""):
    """GET on a connection of its own, read to its close: (status, headers, every body byte received)."""
    sk = socket.create_connection(("127.0.0.1", port), timeout=30)
    sk.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n".encode())
    status, h, body = read_head(sk)
    try:
        while part := sk.recv(1 << 20):
            body += part
    except ConnectionResetError:
        pass
    sk.close()
    return status, h, body


def test_streamed_file_that_fails_its_hash_is_cut_before_its_end(bucket, db, serve, tmp_path):
    """Issue 27, 5: a streamed body that fails metadata.sha256 was sent whole with 200 and nothing
    logged. Its last chunk is held back until the digest checks: the client gets fewer bytes than
    Content-Length, and the access log, the error log and /_metrics say so."""
    data = os.urandom(6 * 1024 * 1024)  # above the 4M stream threshold
    oid = put(bucket, "big.bin", data)
    damaged = bytearray(data)
    damaged[5 * 261120:5 * 261120 + 10] = b"0123456789"
    db.fs.chunks.update_one({"files_id": oid, "n": 5},
                            {"$set": {"data": bytes(damaged[5 * 261120:6 * 261120])}})
    sound = os.urandom(6 * 1024 * 1024 + 1000)
    put(bucket, "sound.bin", sound)
    small = os.urandom(300_000)  # fits the first window of a 1M cache's stream: a status, not a cut
    small_id = put(bucket, "small.bin", small)
    db.fs.chunks.update_one({"files_id": small_id, "n": 0}, {"$set": {"data": os.urandom(261120)}})
    log = tmp_path / "access.log"
    s = serve("--access-log", str(log))
    status, h, body = raw_get(s.port, "/big.bin")
    assert status == 200 and int(h["content-length"]) == len(data)
    assert len(body) < len(data) and bytes(damaged).startswith(body)
    assert hashlib.sha256(body).hexdigest() != sha(data)
    wait_for(lambda: "GET /big.bin: big.bin: content sha256" in s.stderr(), 10, "the error log line")
    line = [ln for ln in s.stderr().splitlines() if "GET /big.bin" in ln][0]
    assert f"connection cut off after {len(body)} of {len(data)} bytes" in line, line
    wait_for(lambda: '"GET /big.bin HTTP/1.1" 500 ' in log.read_text(), 10, "the access log line")
    m = s.metrics()
    assert m["gridfsctl_serve_integrity_failures_total"] == 1
    assert m['gridfsctl_serve_requests_total{code="500"}'] == 1
    # A range covering all of it is checked the same way; the sound file streams whole.
    status, _, body = raw_get(s.port, "/big.bin", "Range: bytes=0-\r\n")
    assert status == 206 and len(body) < len(data)
    status, _, body = raw_get(s.port, "/sound.bin")
    assert status == 200 and body == sound
    # A range of part of a streamed file cannot be checked against the hash: the response says so.
    status, h, body = s.get("/sound.bin", {"Range": "bytes=1000-1999"})
    assert status == 206 and body == sound[1000:2000] and h["gridfsctl-checked"] == "chunks"
    assert "gridfsctl-checked" not in s.get("/sound.bin")[1]
    s2 = serve("--cache-size", "1M")  # streams anything above 128K
    status, _, _ = s2.get("/small.bin")
    assert status == 500
    assert s2.metrics()["gridfsctl_serve_integrity_failures_total"] == 1
    small_range = s2.get("/small.bin", {"Range": "bytes=0-99"})
    assert small_range[0] == 206 and small_range[1]["gridfsctl-checked"] == "chunks"
