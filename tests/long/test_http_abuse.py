"""serve under abuse over real sockets to 127.0.0.1: malformed requests,
slowloris, 10,000 connections. After each, the server still answers and
exits 0 on SIGTERM with no sanitizer report (Server.stop)."""
import http.client
import resource
import socket
import threading
import time

import pytest

from longsuite import LONG, count, tally  # noqa: F401 (fixture)
from test_serve import Server, wait_for

pytestmark = LONG

MALFORMED = [
    b"\r\n\r\n",
    b"GET\r\n\r\n",
    b"GET / HTTP/1.1\r\n\r\n",                       # no Host
    b"GET /a.bin HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET a.bin HTTP/1.1\r\nHost: x\r\n\r\n",        # not an absolute path
    b"GET /%zz%4 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /%00 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /id/zzzzzzzzzzzzzzzzzzzzzzzz HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /a.bin?rev=99999999999999999999 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /a.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=99999999999999999999-\r\n\r\n",
    b"GET /a.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=-0\r\n\r\n",
    b"GET /a.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=5-1,0-0,-1\r\n\r\n",
    b"GET /a.bin HTTP/1.1\r\nHost: x\r\nIf-None-Match: W/\r\n\r\n",
    b"GET /a.bin HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"" + b"a" * 8000 + b"\r\n\r\n",
    b"GET /a.bin HTTP/1.1\r\nHost: x\r\nIf-Modified-Since: Sun, 99 Nov 1994 99:99:99 GMT\r\n\r\n",
    b"GET /a.bin HTTP/1.1\r\nHost: x\r\nIf-Range: Sun, 06 Nov 1994\r\nRange: bytes=0-1\r\n\r\n",
    b"GET /a.bin HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 40_000 + b"\r\n\r\n",   # beyond the header cap
    b"GET /" + b"p" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /a.bin HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
    b"GET /a.bin HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n",
    b"GET /a.bin HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /a.bin HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
    b"GET /a.bin HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 3000 + b"\r\n",
    b"GET /a.bin HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"GET /a.bin HTTP/1.1\nHost: x\n\n",                 # bare LF
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)),  # a TLS hello
    bytes(range(256)) * 4,
]


def exchange(port, payload, timeout=10, half_close=True):
    """Sends payload and returns what comes back until the server closes or goes quiet.
    half_close shuts our side after the payload, so that a server waiting for more
    of a malformed request sees its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(payload)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may close first on a request it refuses
        got = b""
        try:
            while True:
                part = s.recv(65536)
                if not part:
                    break
                got += part
        except (socket.timeout, ConnectionResetError):
            pass
        return got


@pytest.fixture
def served(gfs, bucket, tmp_path):
    bucket.upload_from_stream("a.bin", b"A" * 5000)
    srv = Server(gfs, tmp_path, "--timeout", "3", "--max-header-size", "16K")
    yield srv
    srv.stop()


def test_malformed_requests(served, tally):
    for payload in MALFORMED:
        got = exchange(served.port, payload)
        tally.injected += 1
        if got:
            status = got.split(b"\r\n", 1)[0]
            assert status.startswith(b"HTTP/1."), (payload[:60], got[:200])
            code = int(status.split()[1])
            assert code in (200, 206, 304, 400, 404, 405, 413, 414, 416, 431, 505), (payload[:60], status)
            if b"passwd" in payload:
                assert code in (400, 404), status
        assert served.get("/_health")[0] == 200, payload[:60]
        tally.survived += 1
    assert served.get("/a.bin")[2] == b"A" * 5000


def still_open(s):
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def test_slowloris(gfs, bucket, tmp_path, tally):
    """200 connections from 127.0.0.1 trickle their headers: the server keeps
    at most --max-per-ip of them, closes the rest within --header-timeout,
    and a client from another address (127.0.0.2) is served meanwhile."""
    bucket.upload_from_stream("a.bin", b"A" * 5000)
    srv = Server(gfs, tmp_path, "--timeout", "30", "--header-timeout", "2", "--max-per-ip", "50")
    n, slow = 200, []
    stop = threading.Event()
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            try:
                s.sendall(b"GET /a.bin HTTP/1.1\r\nHost: x\r\n")
            except OSError:
                pass  # refused over the per-address cap
            slow.append(s)
        tally.injected += n

        def trickle():
            while not stop.is_set():
                for s in slow:
                    try:
                        s.send(b"X-a: b\r\n")
                    except OSError:
                        pass
                stop.wait(0.5)  # the attack's own pace

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        fresh = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10,
                                           source_address=("127.0.0.2", 0))
        assert srv.get("/a.bin", conn=fresh)[2] == b"A" * 5000, "a client from another address was not served"
        fresh.close()
        try:
            wait_for(lambda: sum(map(still_open, slow)) == 0, 20,
                     "the server to close the trickling connections")
        finally:
            tally.notes.append(f"slow={n} still_open={sum(map(still_open, slow))}")
        m = srv.metrics()
        assert m["gridfsctl_serve_header_timeouts_total"] > 0, m
        assert m["gridfsctl_serve_per_address_refused_total"] > 0, m
        tally.survived += n
    finally:
        stop.set()
        for s in slow:
            s.close()
        srv.stop()


def test_ten_thousand_connections(served, tally):
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 256:
        pytest.skip(f"RLIMIT_NOFILE {soft}")
    total = count(10_000)
    req = b"GET /a.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    failed = []
    lock = threading.Lock()
    per = total // 4

    def client(k):
        for i in range(per):
            try:
                got = exchange(served.port, req, timeout=30, half_close=False)
                ok = got.startswith(b"HTTP/1.1 200") and got.endswith(b"A" * 5000)
            except OSError as e:
                ok, got = False, repr(e).encode()
            if not ok:
                with lock:
                    failed.append(got[:80])

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tally.injected += per * 4
    tally.survived += per * 4 - len(failed)
    tally.notes.append(f"requests={per * 4} failed={len(failed)} seconds={time.monotonic() - t0:.1f}")
    assert failed == []
    assert served.get("/_health")[0] == 200
