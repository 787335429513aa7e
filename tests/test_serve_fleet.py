"""A fleet of serve hosts over one bucket (issue 31; issue 30's removals):
three serve processes, each with its own memory cache and disk tier. pymongo
replaces and removes files while clients read from all three; every server
answers the new bytes, or 404 for a removed file, within the poll (never
waiting for --reload), and every body any of them sends is one whole
revision, checked with hashlib against pymongo's copies."""
import collections
import threading

import pytest

from test_serve import put, quote, serve, sha, wait_for  # noqa: F401 (serve: the fixture)
from wireproxy import CommandRecorder

# Far beyond the test's length: what the servers notice, the poll noticed.
RELOAD = "3600"
# The poll is 0.2 s; its interval stretches with the backend's answer time
# (gridfsctl-serve(1)), so a change must show well within this, not instantly.
WITHIN_S = 10


class Reader(threading.Thread):
    """Reads the names from one server until stopped; every answer is kept for the checks."""

    def __init__(self, server, names):
        super().__init__(daemon=True)
        self.server, self.names = server, names
        self.stop = threading.Event()
        self.seen = []  # (name, status, etag, body)
        self.error = None

    def run(self):
        conn = self.server.conn()
        try:
            while not self.stop.is_set():
                for name in self.names:
                    status, headers, body = self.server.get(quote(name), conn=conn)
                    self.seen.append((name, status, headers.get("etag"), body))
        except Exception as e:  # noqa: BLE001 (reported by the test)
            self.error = e
        finally:
            conn.close()


def fleet(serve, tmp_path, n=3):
    return [serve("--reload", RELOAD, "--cache-dir", str(tmp_path / f"tier{i}")) for i in range(n)]


def answers_everywhere(servers, name, want):
    """True when every server answers name with the bytes want (None: 404)."""
    for s in servers:
        status, _, body = s.get(quote(name))
        if want is None and status != 404:
            return False
        if want is not None and (status != 200 or body != want):
            return False
    return True


def test_three_servers_follow_replacements_and_removals(bucket, serve, tmp_path):
    names = [f"posters/p{i:02d}.jpg" for i in range(8)]
    revisions = collections.defaultdict(list)  # every body ever stored under each name

    def upload(name, data):
        revisions[name].append(data)
        return put(bucket, name, data)

    ids = {name: upload(name, f"{name} first ".encode() * 300) for name in names}
    upload("posters/two-revisions.jpg", b"older " * 500)
    servers = fleet(serve, tmp_path)
    for s in servers:  # every body in every server's memory cache and disk tier
        for name in names:
            assert s.get(quote(name))[2] == revisions[name][0]
    readers = [Reader(s, names + ["posters/two-revisions.jpg"]) for s in servers]
    for r in readers:
        r.start()
    try:
        # A replacement as gridfsctl put makes one: the new revision, then the old one removed.
        for name in names[:3]:
            new = f"{name} second ".encode() * 400
            new_id = upload(name, new)
            bucket.delete(ids[name])
            ids[name] = new_id
            wait_for(lambda: answers_everywhere(servers, name, new), WITHIN_S,
                     f"all three servers to serve the new {name}")
        # A removal, with nothing uploaded anywhere: only a count can tell.
        for name in names[3:6]:
            bucket.delete(ids[name])
            wait_for(lambda: answers_everywhere(servers, name, None), WITHIN_S,
                     f"all three servers to answer 404 for the removed {name}")
        # The newest revision removed: the one before it is the file again.
        newest = upload("posters/two-revisions.jpg", b"newer " * 500)
        wait_for(lambda: answers_everywhere(servers, "posters/two-revisions.jpg", b"newer " * 500),
                 WITHIN_S, "the newer revision")
        bucket.delete(newest)
        wait_for(lambda: answers_everywhere(servers, "posters/two-revisions.jpg", b"older " * 500),
                 WITHIN_S, "the older revision again")
        # A removal and an upload of another name in the same poll: the count alone stays put.
        bucket.delete(ids[names[6]])
        upload("posters/late.jpg", b"late " * 100)
        wait_for(lambda: answers_everywhere(servers, names[6], None), WITHIN_S,
                 f"404 for {names[6]} removed while another file arrived")
        wait_for(lambda: answers_everywhere(servers, "posters/late.jpg", b"late " * 100), WITHIN_S,
                 "the late file")
    finally:
        for r in readers:
            r.stop.set()
        for r in readers:
            r.join(60)
    for r in readers:
        assert r.error is None, r.error
        assert len(r.seen) > 50, len(r.seen)
        hashes = {name: {sha(b) for b in bodies} for name, bodies in revisions.items()}
        for name, status, etag, body in r.seen:
            assert status in (200, 404), (name, status, body[:200])
            if status == 200:
                # One whole revision, and the headers name the bytes sent.
                assert sha(body) in hashes[name], (name, len(body))
                assert etag == f'"{sha(body)}"', (name, etag)


def files_reads(cmds, db):
    """What a serve process asked of fs.files, by kind: the count before each
    poll, the poll's dated query, one name's reread, the whole index, and
    the rest (a request's lookup by _id)."""
    kinds = collections.Counter()
    for c in cmds:
        if c.db != db or c.target != "fs.files":
            continue
        if c.name in ("count", "aggregate"):
            kinds["count"] += 1
        elif c.name == "find":
            f = c.doc.get("filter") or {}
            if "uploadDate" in f:
                kinds["poll"] += 1
            elif isinstance(f.get("filename"), str):
                kinds["name"] += 1
            elif isinstance(f.get("filename"), dict) or not f:
                kinds["load"] += 1  # the prefix's range, or everything
            else:
                kinds["other"] += 1  # a request's own lookup (by _id)
    return kinds


def test_poll_cost_follows_the_work(bucket, backend, db, serve):
    """Read off the wire: an idle poll is a count and the dated query; a
    replacement rereads its one name; only a removal rereads the index."""
    rec = CommandRecorder(backend.port)
    try:
        for i in range(20):
            put(bucket, f"posters/{i:02d}.jpg", f"poster {i} ".encode() * 100)
        s = serve("--reload", RELOAD, "--prefix", "posters", env={"GRIDFSCTL_URI": rec.uri})
        rec.taken()
        seen = collections.Counter()

        def polls(n):
            """Waits for n more polls; what they asked, added up."""
            def enough():
                seen.update(files_reads(rec.taken(), db.name))
                return seen["poll"] >= n
            wait_for(enough, WITHIN_S, f"{n} polls")
            got = dict(seen)
            seen.clear()
            return got

        idle = polls(3)
        assert idle.get("load", 0) == 0 and idle.get("name", 0) == 0, idle
        assert idle["count"] >= 3, idle
        # A replacement: its old revision goes right after the new one arrives.
        old = bucket.find({"filename": "posters/03.jpg"}).next()._id
        put(bucket, "posters/03.jpg", b"replaced " * 100)
        bucket.delete(old)
        wait_for(lambda: s.get("/03.jpg")[2] == b"replaced " * 100, WITHIN_S, "the new revision")
        replaced = polls(3)
        assert replaced.get("load", 0) == 0, replaced
        assert replaced.get("name", 0) >= 1, replaced
        # A removal, with no new revision to explain it: the index is reread.
        bucket.delete(bucket.find({"filename": "posters/07.jpg"}).next()._id)
        wait_for(lambda: s.get("/07.jpg")[0] == 404, WITHIN_S, "404 for the removed file")
        removed = polls(2)
        assert removed.get("load", 0) >= 1, removed
    finally:
        rec.close()
