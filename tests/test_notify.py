"""sd_notify (systemd Type=notify) from serve, supervise and watch.

The datagrams are received on a unix socket of our own named in
NOTIFY_SOCKET, as systemd would; every wait has a deadline.
"""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import DRIVER_SHM_WARNING, check_sanitizer_report, free_port, wait_for
from wireproxy import FreezingProxy

DEADLINE = 60


@pytest.fixture
def notify(tmp_path):
    path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(DEADLINE)
    yield s, path
    s.close()


def messages_until(sock, want):
    """Datagrams received until one contains want (raises socket.timeout at the deadline)."""
    got = []
    while True:
        msg = sock.recv(4096).decode()
        got.append(msg)
        if want in msg.split("\n"):
            return got


def finish(proc, sig=signal.SIGTERM):
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=DEADLINE)
    err = err.decode(errors="replace")
    check_sanitizer_report(err)
    return proc.returncode, err


def test_serve_ready_watchdog_stopping(gfs, notify):
    sock, path = notify
    port = free_port()
    p = gfs.popen("serve", "--listen", f"127.0.0.1:{port}",
                  env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"},
                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        first = messages_until(sock, "READY=1")
        assert "STATUS=serving" in first[-1].split("\n")
        # READY comes once the socket listens: a connection is accepted at once.
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        messages_until(sock, "WATCHDOG=1")
        messages_until(sock, "WATCHDOG=1")
    finally:
        rc, err = finish(p)
    assert messages_until(sock, "STOPPING=1")
    assert rc == 0, err


def test_serve_watchdog_for_another_pid_is_not_ours(gfs, notify):
    sock, path = notify
    p = gfs.popen("serve", "--listen", f"127.0.0.1:{free_port()}",
                  env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"},
                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        messages_until(sock, "READY=1")
    finally:
        rc, err = finish(p, signal.SIGINT)
    # The next datagram is STOPPING, with no WATCHDOG in between.
    assert sock.recv(4096).decode() == "STOPPING=1"
    assert rc == 130, err  # SIGINT is an interruption; SIGTERM a clean stop (above)


def test_serve_unusable_notify_socket_is_said_not_fatal(gfs, tmp_path):
    p = gfs.popen("serve", "--listen", f"127.0.0.1:{free_port()}",
                  env={"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")},
                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        lines = (ln.decode() for ln in p.stderr if not DRIVER_SHM_WARNING.match(ln.decode()))
        next(lines)  # "serving ..." comes before READY
        line = next(lines)
    finally:
        rc, err = finish(p)
    assert "NOTIFY_SOCKET" in line and "nobody-listens" in line, line
    assert rc == 0, err


def test_supervise_ready_watchdog_stopping_and_children_do_not_inherit(gridfsctl, notify, tmp_path):
    sock, path = notify
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}
    probe = tmp_path / "child-env"
    child = ("import os,sys,time\n"
             f"open({str(probe)!r},'w').write(repr([k for k in os.environ if k in ('NOTIFY_SOCKET','WATCHDOG_USEC')]))\n"
             "import signal; signal.pause()\n")
    p = gridfsctl.popen("supervise", "--control", tmp_path / "ctl.sock", "--", sys.executable, "-c", child,
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        env=env, cwd=tmp_path)
    try:
        messages_until(sock, "READY=1")
        messages_until(sock, "WATCHDOG=1")
        messages_until(sock, "WATCHDOG=1")
        wait_for(lambda: probe.exists() and probe.read_text(), DEADLINE, "the child's environment")
    finally:
        rc, err = finish(p)
    messages_until(sock, "STOPPING=1")
    assert rc == 0, err
    assert probe.read_text() == "[]"


def test_watch_still_notifies_through_the_library(gfs, notify, tmp_path):
    sock, path = notify
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.txt").write_bytes(b"a")
    p = gfs.popen("watch", str(tree), env={"NOTIFY_SOCKET": path},
                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        msgs = messages_until(sock, "READY=1")
        assert msgs[-1].startswith("READY=1\nSTATUS=watching")
    finally:
        rc, err = finish(p)
    messages_until(sock, "STOPPING=1")
    assert rc == 0, err


def test_watch_feeds_the_watchdog_while_idle(gfs, notify, tmp_path):
    # nothing changes in the tree: the pings come from watch's own timer, not from events
    sock, path = notify
    tree = tmp_path / "tree"
    tree.mkdir()
    p = gfs.popen("watch", str(tree), env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"},
                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        messages_until(sock, "READY=1")
        for _ in range(3):
            messages_until(sock, "WATCHDOG=1")
    finally:
        rc, err = finish(p)
    messages_until(sock, "STOPPING=1")
    assert rc == 0, err


def test_watch_feeds_the_watchdog_while_a_call_waits_and_bounds_the_call(gfs, backend, notify, tmp_path):
    """A queue of renames on a backend that stopped answering: the pings keep coming every half
    interval from watch's own timer, and the call gives up within the interval (not after the
    60 s reply timeout), so that a hung call is not pinged over for ever."""
    from test_watch import FILES_UPDATE, Watcher, renamed_queue  # here: test_watch imports us, through test_serve
    sock, path = notify
    tree = tmp_path / "tree"
    tree.mkdir()
    rename = renamed_queue(tree, 150)
    proxy = FreezingProxy(backend.port, FILES_UPDATE)
    env = {"GRIDFSCTL_URI": proxy.uri, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"}
    w = Watcher(gfs, tree, "--delete", env=env)
    try:
        messages_until(sock, "READY=1")
        rename()
        wait_for(proxy.frozen.is_set, DEADLINE, "the renames to reach the backend", proc=w.proc)
        sock.settimeout(2.0)  # the whole interval: a ping later than that is a kill
        last = time.monotonic()
        gaps = []
        while len(gaps) < 6:
            messages_until(sock, "WATCHDOG=1")
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        assert max(gaps) < 1.5, gaps
        w.wait_for("backend-down")  # the frozen call ended, bounded by the interval
    finally:
        proxy.close()
        w.stop()
