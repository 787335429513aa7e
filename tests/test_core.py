"""The GridFS core and the everyday verbs against the real backend, checked with pymongo's gridfs."""
import datetime
import io
import json
import os
import signal
import socket
import stat as statmod
import subprocess
import threading
import time

import gridfs
import pytest
from bson import ObjectId

from conftest import sha256

CHUNK = 255 * 1024
SIZES = {
    "empty": 0,
    "one-byte": 1,
    "exact-chunk": CHUNK,
    "chunk-plus-one": CHUNK + 1,
    "five-mb": 5 * 1024 * 1024 + 3,
}
NAMES = ["plain.txt", "dir/sub/file.bin", "caf\u00e9/\u00fcber \u65e5\u672c.jpg", "emoji-\U0001F3AC.png"]


def payload(size, seed=1):
    return bytes((i * 31 + seed) % 251 for i in range(size)) if size < 4096 else os.urandom(size)


@pytest.mark.parametrize("label", SIZES)
def test_put_then_pymongo_reads_identical(gfs, bucket, db, tmp_path, label):
    data = payload(SIZES[label])
    src = tmp_path / f"{label}.bin"
    src.write_bytes(data)
    r = gfs.run("put", src, "--name", f"x/{label}")
    assert r.rc == 0, r
    assert bucket.open_download_stream_by_name(f"x/{label}").read() == data
    doc = db.fs.files.find_one({"filename": f"x/{label}"})
    assert doc["length"] == len(data)
    assert doc["chunkSize"] == CHUNK
    assert doc["metadata"]["sha256"] == sha256(data)
    assert db.fs.chunks.count_documents({"files_id": doc["_id"]}) == -(-len(data) // CHUNK)
    for ch in db.fs.chunks.find({"files_id": doc["_id"]}):
        assert ch["data"].subtype == 0 if hasattr(ch["data"], "subtype") else True


@pytest.mark.parametrize("label", SIZES)
def test_pymongo_write_then_get_identical(gfs, bucket, tmp_path, label):
    data = payload(SIZES[label], seed=7)
    bucket.upload_from_stream(f"y/{label}", data)
    r = gfs.run("get", f"y/{label}", "-o", tmp_path / "out.bin")
    assert r.rc == 0, r
    assert (tmp_path / "out.bin").read_bytes() == data
    r = gfs.run("get", f"y/{label}", "-o", "-")
    assert r.rc == 0 and r.out == data


@pytest.mark.parametrize("name", NAMES)
def test_utf8_names_round_trip(gfs, bucket, tmp_path, name):
    data = name.encode() * 3
    src = tmp_path / "src"
    src.write_bytes(data)
    assert gfs.run("put", src, "--name", name).rc == 0
    assert bucket.open_download_stream_by_name(name).read() == data
    r = gfs.run("ls", "--json")
    assert [json.loads(line)["filename"] for line in r.text.splitlines()] == [name]
    out = tmp_path / "w"
    out.mkdir()
    r = gfs.run("get", name, cwd=out)
    assert r.rc == 0, r
    assert (out / name).read_bytes() == data


def test_spec_indexes_are_created(gfs, db, tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    assert gfs.run("put", tmp_path / "f").rc == 0
    files_keys = [list(v["key"]) for v in db.fs.files.index_information().values()]
    chunk_idx = [v for v in db.fs.chunks.index_information().values()
                 if [k for k, _ in v["key"]] == ["files_id", "n"]]
    assert [("filename", 1), ("uploadDate", 1)] in files_keys
    assert len(chunk_idx) == 1 and chunk_idx[0].get("unique") is True


def test_put_replaces_only_after_new_revision_is_complete(gfs, bucket, db, tmp_path):
    src = tmp_path / "poster.jpg"
    src.write_bytes(b"old" * 1000)
    assert gfs.run("put", src).rc == 0
    old_id = db.fs.files.find_one({"filename": "poster.jpg"})["_id"]
    src.write_bytes(b"new" * 2000)
    assert gfs.run("put", src).rc == 0
    docs = list(db.fs.files.find({"filename": "poster.jpg"}))
    assert len(docs) == 1 and docs[0]["_id"] != old_id
    assert db.fs.chunks.count_documents({"files_id": old_id}) == 0
    assert bucket.open_download_stream_by_name("poster.jpg").read() == b"new" * 2000


def test_put_keep_revisions_and_get_rev(gfs, bucket, tmp_path):
    src = tmp_path / "f"
    for i in range(3):
        src.write_bytes(f"v{i}".encode())
        assert gfs.run("put", src, "--keep-revisions", "2").rc == 0
    r = gfs.run("ls", "-a", "--json")
    assert len(r.text.splitlines()) == 2
    assert gfs.run("get", "f", "-o", "-").out == b"v2"
    assert gfs.run("get", "f", "--rev", "-2", "-o", "-").out == b"v1"
    assert gfs.run("get", "f", "--rev", "0", "-o", "-").out == b"v1"
    r = gfs.run("get", "f", "--rev", "5", "-o", "-")
    assert r.rc == 4 and "no revision" in r.err


def test_put_metadata_and_content_type(gfs, db, tmp_path):
    src = tmp_path / "page.html"
    src.write_text("<!DOCTYPE html><html><body>hi</body></html>\n")
    os.utime(src, ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    os.chmod(src, 0o640)
    assert gfs.run("put", src).rc == 0
    doc = db.fs.files.find_one({"filename": "page.html"})
    assert doc["contentType"] == "text/html"
    assert doc["metadata"]["contentType"] == "text/html"
    assert doc["metadata"]["mtimeNs"] == 1_600_000_000_123_456_789
    assert doc["metadata"]["mode"] == 0o640
    assert doc["metadata"]["size"] == src.stat().st_size
    assert gfs.run("put", src, "--name", "typed", "--type", "application/x-mine").rc == 0
    assert db.fs.files.find_one({"filename": "typed"})["contentType"] == "application/x-mine"


def test_put_from_stdin(gfs, bucket):
    r = gfs.run("put", "-", "--name", "from/stdin", input=b"piped data")
    assert r.rc == 0, r
    assert bucket.open_download_stream_by_name("from/stdin").read() == b"piped data"
    r = gfs.run("put", "-", input=b"x")
    assert r.rc == 2 and "--name" in r.err


def test_get_never_overwrites_without_force(gfs, bucket, tmp_path):
    bucket.upload_from_stream("a/b.txt", b"stored")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b.txt").write_bytes(b"local")
    r = gfs.run("get", "a/b.txt")
    assert r.rc == 5 and "exists" in r.err and "a/b.txt" in r.err
    assert (tmp_path / "a" / "b.txt").read_bytes() == b"local"
    assert gfs.run("get", "a/b.txt", "--force").rc == 0
    assert (tmp_path / "a" / "b.txt").read_bytes() == b"stored"
    assert sorted(os.listdir(tmp_path / "a")) == ["b.txt"]  # no temporary left behind


def test_get_refuses_unsafe_stored_names(gfs, bucket, tmp_path):
    bucket.upload_from_stream("../escape.txt", b"x")
    bucket.upload_from_stream("/etc/abs.txt", b"x")
    work = tmp_path / "w"
    work.mkdir()
    for name in ("../escape.txt", "/etc/abs.txt"):
        r = gfs.run("get", name, cwd=work)
        assert r.rc == 2 and name in r.err
    assert not (tmp_path / "escape.txt").exists()
    assert gfs.run("get", "../escape.txt", "-o", work / "ok.txt").rc == 0


def test_get_by_id_and_stat(gfs, bucket, tmp_path):
    fid = bucket.upload_from_stream("s.bin", b"12345", metadata={"sha256": sha256(b"12345")})
    r = gfs.run("get", "--id", str(fid), "-o", "-")
    assert r.rc == 0 and r.out == b"12345"
    r = gfs.run("stat", "s.bin", "--json")
    info = json.loads(r.text)
    assert info["id"] == str(fid) and info["length"] == 5 and info["chunks"] == 1
    assert info["sha256"] == sha256(b"12345")
    r = gfs.run("stat", "--id", "zz")
    assert r.rc == 2
    r = gfs.run("stat", "--id", str(ObjectId()))
    assert r.rc == 4 and "no such file" in r.err
    r = gfs.run("stat", "s.bin")
    assert r.rc == 0 and "length:      5" in r.text


def test_missing_chunk_is_reported(gfs, bucket, db, tmp_path):
    data = os.urandom(CHUNK * 3 + 10)
    fid = bucket.upload_from_stream("broken", data)
    db.fs.chunks.delete_one({"files_id": fid, "n": 1})
    r = gfs.run("get", "broken", "-o", tmp_path / "out")
    assert r.rc == 1 and "missing chunk n=1" in r.err and "broken" in r.err
    assert not (tmp_path / "out").exists()


def test_truncated_chunk_is_reported(gfs, bucket, db, tmp_path):
    data = os.urandom(CHUNK + 100)
    fid = bucket.upload_from_stream("short", data)
    db.fs.chunks.update_one({"files_id": fid, "n": 0}, {"$set": {"data": data[:CHUNK - 1]}})
    r = gfs.run("get", "short", "-o", tmp_path / "out")
    assert r.rc == 1 and "n=0" in r.err and "expected 261120" in r.err
    assert not (tmp_path / "out").exists()


def test_extra_chunk_and_checksum_are_reported(gfs, bucket, db, tmp_path):
    fid = bucket.upload_from_stream("extra", b"abc")
    db.fs.chunks.insert_one({"files_id": fid, "n": 1, "data": b"zzz"})
    r = gfs.run("get", "extra", "-o", tmp_path / "o1")
    assert r.rc == 1 and "extra chunk n=1" in r.err
    fid = bucket.upload_from_stream("bad-sum", b"abc", metadata={"sha256": sha256(b"abd")})
    r = gfs.run("get", "bad-sum", "-o", tmp_path / "o2")
    assert r.rc == 1 and "does not match" in r.err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_ls_newest_revision_prefix_and_long(gfs, bucket):
    for name in ("p/a", "p/b", "q/c"):
        bucket.upload_from_stream(name, b"1")
    bucket.upload_from_stream("p/a", b"22")
    assert gfs.run("ls").text.splitlines() == ["p/a", "p/b", "q/c"]
    assert gfs.run("ls", "p/").text.splitlines() == ["p/a", "p/b"]
    rows = [json.loads(line) for line in gfs.run("ls", "p/", "--json").text.splitlines()]
    assert rows[0]["filename"] == "p/a" and rows[0]["length"] == 2 and rows[0]["revisions"] == 2
    assert len(gfs.run("ls", "-a").text.splitlines()) == 4
    long = gfs.run("ls", "-l", "q").text
    assert long.split()[0] == "1" and long.split()[-1] == "q/c"


def test_rm_all_revisions_then_chunks(gfs, bucket, db):
    for data in (b"1", b"2"):
        bucket.upload_from_stream("gone", data)
    keep = bucket.upload_from_stream("kept", b"3")
    r = gfs.run("rm", "gone", "--json")
    assert r.rc == 0 and json.loads(r.text) == {"name": "gone", "removed": 2}
    assert db.fs.files.count_documents({}) == 1
    assert db.fs.chunks.count_documents({}) == 1
    assert db.fs.chunks.count_documents({"files_id": keep}) == 1
    r = gfs.run("rm", "gone")
    assert r.rc == 4 and "gone: no such file" in r.err
    assert gfs.run("rm", "-f", "gone").rc == 0
    r = gfs.run("rm", "kept", "nonesuch")
    assert r.rc == 1
    assert db.fs.files.count_documents({}) == 0


def test_rm_by_id(gfs, bucket, db):
    fid = bucket.upload_from_stream("one", b"1")
    bucket.upload_from_stream("one", b"2")
    assert gfs.run("rm", "--id", str(fid)).rc == 0
    assert db.fs.files.count_documents({"filename": "one"}) == 1
    assert db.fs.chunks.count_documents({"files_id": fid}) == 0


def test_custom_bucket_and_db_from_uri(gfs, mongo, backend, tmp_path):
    (tmp_path / "f").write_bytes(b"data")
    dbname = gfs.dbname + "_u"
    r = gfs.run("put", tmp_path / "f", "--bucket", "images",
                env={"GRIDFSCTL_URI": backend.uri + dbname}, db=False)
    assert r.rc == 0, r
    assert gridfs.GridFSBucket(mongo[dbname], "images").open_download_stream_by_name("f").read() == b"data"
    mongo.drop_database(dbname)


def test_config_file(gfs, backend, bucket, tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text(f"[connection]\nuri = {backend.uri}\ndb = {gfs.dbname}\n")
    cfg.chmod(0o600)
    bucket.upload_from_stream("cfg", b"x")
    env = {"GRIDFSCTL_URI": "", "GRIDFSCTL_CONFIG": str(cfg)}
    r = gfs.run("ls", env=env, db=False)
    assert r.rc == 0 and r.text == "cfg\n"
    r = gfs.run("ls", env={"GRIDFSCTL_CONFIG": str(tmp_path / "nope")}, db=False)
    assert r.rc == 2 and "nope" in r.err


def test_unreachable_backend_exit_3(gfs):
    r = gfs.run("ls", env={"GRIDFSCTL_URI": "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200"})
    assert r.rc == 3 and "cannot reach the backend" in r.err
    assert len(r.err.strip().splitlines()) == 1


def test_password_in_argv_is_warned_and_never_printed(gfs):
    uri = "mongodb://user:hunter2@127.0.0.1:1/?serverSelectionTimeoutMS=200"
    r = gfs.run("ls", "--uri", uri)
    assert r.rc == 3
    assert "visible to other users" in r.err
    assert "hunter2" not in r.err and "hunter2" not in r.text


def test_usage_errors_exit_2(gfs, tmp_path):
    for args in (["nonesuch"], ["get"], ["get", "a", "--id", "x"], ["ls", "--bogus"],
                 ["put"], ["put", tmp_path], ["get", "a", "--rev"]):
        r = gfs.run(*args)
        assert r.rc in (2, 5), (args, r)
        assert r.err.strip(), args
    assert gfs.run("put", tmp_path / "missing").rc == 5


def test_help_and_version(gfs):
    r = gfs.run("--help", db=False)
    assert r.rc == 0 and "import" in r.text
    for verb in ("ls", "get", "put", "rm", "stat"):
        r = gfs.run(verb, "--help", db=False)
        assert r.rc == 0 and r.text.startswith(f"usage: gridfsctl {verb}"), verb
    r = gfs.run("--version", db=False)
    assert r.rc == 0 and r.text.startswith("gridfsctl ")


# ---- review fixes: rm order, odd names, signals, option parsing -------------

class RecordingProxy:
    """Forwards TCP to the backend and keeps what each client connection sent, in order."""

    def __init__(self, backend_port):
        self.target = ("127.0.0.1", backend_port)
        self.sent = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.uri = f"mongodb://127.0.0.1:{self.sock.getsockname()[1]}/"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            buf = bytearray()
            self.sent.append(buf)
            threading.Thread(target=self._pump, args=(client, server, buf), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, None), daemon=True).start()

    @staticmethod
    def _pump(src, dst, buf):
        # Bytes are recorded before they are forwarded, so all a command sent is
        # here by the time its reply reaches the client.
        try:
            while data := src.recv(65536):
                if buf is not None:
                    buf += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.sock.close()


def test_rm_deletes_oldest_revision_first(gfs, bucket, backend, db):
    ids = [bucket.upload_from_stream("rev", f"v{i}".encode()) for i in range(3)]
    proxy = RecordingProxy(backend.port)
    try:
        r = gfs.run("rm", "rev", "--json", env={"GRIDFSCTL_URI": proxy.uri})
    finally:
        proxy.close()
    assert r.rc == 0 and json.loads(r.text) == {"name": "rev", "removed": 3}, r
    # The delete commands name the ids; the first mention of each is its files delete.
    conn = [bytes(b) for b in proxy.sent if all(i.binary in b for i in ids)]
    assert len(conn) == 1
    order = [conn[0].find(i.binary) for i in ids]
    assert order == sorted(order), "newest must be deleted last"
    assert db.fs.files.count_documents({}) == 0 and db.fs.chunks.count_documents({}) == 0


NON_UTF8 = b"caf\xe9-\xff.txt"


def test_put_non_utf8_name_is_escaped_with_raw_name(gfs, db, tmp_path):
    src = tmp_path / os.fsdecode(NON_UTF8)
    src.write_bytes(b"bytes")
    r = gfs.run("put", src, "--json")
    assert r.rc == 0, r
    info = json.loads(r.text)
    assert info["filename"] == "caf%E9-%FF.txt"
    assert info["source"].endswith("/caf%E9-%FF.txt")
    doc = db.fs.files.find_one({"filename": "caf%E9-%FF.txt"})
    assert doc["metadata"]["rawName"] == NON_UTF8
    r = gfs.run("put", tmp_path / os.fsdecode(NON_UTF8), "--name", os.fsdecode(b"d/\xe9"))
    assert r.rc == 0, r
    assert db.fs.files.find_one({"filename": "d/%E9"})["metadata"]["rawName"] == b"d/\xe9"
    r = gfs.run("ls", "--json")
    rows = [json.loads(line) for line in r.text.splitlines()]
    assert sorted(row["filename"] for row in rows) == ["caf%E9-%FF.txt", "d/%E9"]
    r = gfs.run("stat", "d/%E9", "--json")
    assert r.rc == 0 and json.loads(r.text)["metadata"]["rawName"], r


def test_put_refuses_a_file_that_changes_while_read(gfs, bucket, db):
    # /proc files claim size 0 and then read as more: the same as a file growing under us.
    old = bucket.upload_from_stream("version", b"old")
    r = gfs.run("put", "/proc/version", "--name", "version")
    assert r.rc == 5 and "changed while it was read" in r.err, r
    assert [d["_id"] for d in db.fs.files.find({"filename": "version"})] == [old]
    assert db.fs.chunks.count_documents({"files_id": {"$ne": old}}) == 0


def test_put_keep_never_deletes_the_new_revision(gfs, bucket, db, tmp_path):
    # The trim anchors on the new revision's id, not its rank: the one dated
    # later stays (readers get it, hence the warning), the older one goes.
    future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    old = bucket.upload_from_stream("skew2", b"old")
    fid = ObjectId()
    db.fs.files.insert_one({"_id": fid, "filename": "skew2", "length": 0, "chunkSize": CHUNK,
                            "uploadDate": future})
    (tmp_path / "skew2").write_bytes(b"new")
    r = gfs.run("put", tmp_path / "skew2", "--keep-revisions", "1", "--json")
    assert r.rc == 1 and "dated later" in r.err, r
    new = ObjectId(json.loads(r.text)["id"])
    assert {d["_id"] for d in db.fs.files.find({"filename": "skew2"})} == {fid, new}
    assert db.fs.chunks.count_documents({"files_id": old}) == 0
    assert db.fs.chunks.count_documents({"files_id": new}) == 1


def test_put_interrupted_leaves_nothing(gfs, db):
    p = gfs.popen("put", "-", "--name", "big", stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    # More than one bulk insert (8M), so chunks are on the server when the signal comes;
    # the write returns only once put has read most of it, and put then waits on stdin.
    p.stdin.write(os.urandom(9 * 1024 * 1024))
    p.stdin.flush()
    p.send_signal(signal.SIGINT)
    err = p.stderr.read().decode()
    p.stdin.close()
    assert p.wait() == 130, err
    assert "interrupted" in err
    assert db.fs.files.count_documents({}) == 0 and db.fs.chunks.count_documents({}) == 0


def test_get_interrupted_leaves_no_temp_file(gfs, bucket, tmp_path):
    bucket.upload_from_stream("large", os.urandom(24 * 1024 * 1024))
    out = tmp_path / "out"
    out.mkdir()
    p = gfs.popen("get", "large", "-o", out / "large", stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not os.listdir(out) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)  # waiting for the temp file to exist, not for time to pass
    p.send_signal(signal.SIGINT)
    err = p.stderr.read().decode()
    assert p.wait() == 130, err
    assert os.listdir(out) == []


def test_serve_rejects_nan_and_overflowing_seconds(gfs):
    for value in ("nan", "inf", "-nan", "3000000"):
        r = gfs.run("serve", "--poll", value, timeout=30)
        assert r.rc == 2 and "seconds" in r.err, (value, r)


def test_chunk_size_with_leading_blank_is_a_usage_error(gfs, tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    for value in (" 5", " -5", "-5"):
        r = gfs.run("put", tmp_path / "f", "--chunk-size", value)
        assert r.rc == 2, (value, r)


def test_password_scrubbed_even_from_a_uri_the_driver_refuses(gfs):
    uri = "mongodb://user:hunter2@127.0.0.1:1/?tls=maybe"
    rd, wr = os.pipe()
    # Fill stderr's pipe: the first thing gridfsctl writes there (after it
    # scrubbed argv) blocks, and keeps the process alive to be inspected.
    os.set_blocking(wr, False)
    filler = 0
    try:
        while True:
            filler += os.write(wr, b"." * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(wr, True)
    p = gfs.popen("ls", "--uri", uri, stderr=wr, stdout=subprocess.DEVNULL)
    os.close(wr)
    try:
        deadline = time.monotonic() + 30
        blocked = False
        while not blocked and p.poll() is None and time.monotonic() < deadline:
            with open(f"/proc/{p.pid}/syscall") as f:
                fields = f.read().split()
            # write(2, ...) on x86_64 (1) or aarch64 (64)
            blocked = len(fields) > 1 and fields[0] in ("1", "64") and fields[1] == "0x2"
            time.sleep(0.001)
        assert blocked, "gridfsctl did not block writing to stderr"
        with open(f"/proc/{p.pid}/cmdline", "rb") as f:
            cmdline = f.read()
        assert b"hunter2" not in cmdline and b"user:xxxxxxx@" in cmdline
    finally:
        data = b""
        while chunk := os.read(rd, 65536):
            data += chunk
        os.close(rd)
        rc = p.wait()
    err = data[filler:].decode()
    assert rc == 2 and "visible to other users" in err and "hunter2" not in err
