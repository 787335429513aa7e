"""The GridFS core and the everyday verbs against the real backend, checked with pymongo's gridfs."""
import datetime
import io
import json
import os
import re
import signal
import socket
import stat as statmod
import subprocess
import threading
import time

import gridfs
import pytest
from bson import ObjectId

import conftest
import jsonvocab

import planted
from conftest import ROOT, proc_file, sha256, wait_for
from wireproxy import TcpProxy

CHUNK = 255 * 1024
SIZES = {
    "empty": 0,
    "one-byte": 1,
    "exact-chunk": CHUNK,
    "chunk-plus-one": CHUNK + 1,
    "five-mb": 5 * 1024 * 1024 + 3,
}
NAMES = ["plain.txt", "dir/sub/file.bin", "caf\u00e9/\u00fcber \u65e5\u672c.jpg", "emoji-\U0001F3AC.png"]


def rm_result(r):
    """rm --json's one event line, without its time."""
    docs = jsonvocab.parse(r.text, "rm")
    assert len(docs) == 1 and docs[0]["event"] == "delete", r
    return {k: v for k, v in docs[0].items() if k not in ("time", "event")}


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


@pytest.mark.parametrize("chunk", ["1", "7", "100K"])
def test_content_type_is_sniffed_from_the_file_start_whatever_the_chunk_size(gfs, db, tmp_path,
                                                                             chunk):
    """Issue 27, 8-13 (13): libmagic sees the file's first bytes (64 KiB), not its first
    chunk; from a file and from standard input, by put and by import."""
    page = "<!DOCTYPE html><html><body>" + "hi " * 600 + "</body></html>\n"
    src = tmp_path / "tree" / "page.html"
    src.parent.mkdir()
    src.write_text(page)
    assert gfs.run("put", src, "--chunk-size", chunk).rc == 0
    assert gfs.run("put", "-", "--name", "piped", "--chunk-size", chunk, input=page.encode()).rc == 0
    assert gfs.run("import", src.parent, "--prefix", "imp", "--chunk-size", chunk).rc == 0
    for name in ("page.html", "piped", "imp/page.html"):
        doc = db.fs.files.find_one({"filename": name})
        assert doc["contentType"] == doc["metadata"]["contentType"] == "text/html", (name, doc)
        assert doc["chunkSize"] == {"1": 1, "7": 7, "100K": 102400}[chunk]


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
    assert r.rc == 0 and rm_result(r) == {"filename": "gone", "deleted": 2}
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


def test_authentication_failure_is_said_in_one_line_by_every_verb(gfs, bucket, tmp_path):
    """A password the server refuses (here a server without authentication, which refuses
    every mechanism) is an authentication failure, exit 3, in one line without the server's
    advice lines or the password, whatever the verb."""
    bucket.upload_from_stream("a.txt", b"abc")
    (tmp_path / "tree").mkdir()
    (tmp_path / "f.txt").write_bytes(b"x")
    uri = gfs.backend.uri.replace("mongodb://", "mongodb://someone:Wr0ngPassw0rd@")
    for args in (["ls"], ["get", "a.txt", "-o", tmp_path / "out"], ["put", tmp_path / "f.txt"],
                 ["rm", "a.txt"], ["stat", "a.txt"], ["import", tmp_path / "tree"], ["verify"],
                 ["mirror", tmp_path / "mirror"], ["doctor"]):
        r = gfs.run(*args, env={"GRIDFSCTL_URI": uri})
        assert r.rc == 3, (args, r)
        lines = r.err.strip().splitlines()
        assert lines and all(ln.startswith(f"gridfsctl {args[0]}: ") for ln in lines), (args, r)
        assert "authentication failed" in lines[0], (args, r)
        assert "cannot reach" not in r.err and "\\x0a" not in r.err, (args, r)
        assert "Wr0ngPassw0rd" not in r.err + r.text, (args, r)
    assert sorted(f.filename for f in bucket.find()) == ["a.txt"]


def test_usage_errors_exit_2(gfs, tmp_path):
    for args in (["nonesuch"], ["get"], ["get", "a", "--id", "x"], ["ls", "--bogus"],
                 ["put"], ["put", tmp_path], ["get", "a", "--rev"]):
        r = gfs.run(*args)
        assert r.rc in (2, 5), (args, r)
        assert r.err.strip(), args
    assert gfs.run("put", tmp_path / "missing").rc == 5


def one_line_usage_error(r):
    assert r.rc == 2 and r.text == "", r
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r
    return lines[0]


@pytest.mark.parametrize("args, said", [
    (["improt", "/srv/x"], "gridfsctl: unknown command 'improt'; did you mean 'import'?"),
    (["help", "verfiy"], "gridfsctl: unknown command 'verfiy'; did you mean 'verify'?"),
    (["import", "--prefx", "p", "/srv/x"],
     "gridfsctl import: unknown option '--prefx'; did you mean '--prefix'?"),
    (["mirror", "--prefx=p", "/srv/x"],
     "gridfsctl mirror: unknown option '--prefx=p'; did you mean '--prefix'?"),
    (["ls", "--bukcet", "b"], "gridfsctl ls: unknown option '--bukcet'; did you mean '--bucket'?"),
    (["--bukcet", "b", "ls"], "gridfsctl: unknown option '--bukcet'; did you mean '--bucket'?"),
    # The verb's own rows: --max-delete is import's, not get's.
    (["import", "--max-delte", "5", "/srv/x"],
     "gridfsctl import: unknown option '--max-delte'; did you mean '--max-delete'?"),
])
def test_typos_get_did_you_mean(gridfsctl, args, said):
    assert one_line_usage_error(gridfsctl.run(*args)) == said


def test_far_typos_get_no_guess(gridfsctl):
    r = gridfsctl.run("frobnicate")
    assert r.rc == 2 and "did you mean" not in r.err and "gridfsctl --help" in r.err
    r = gridfsctl.run("get", "--max-delete", "5", "x")
    assert r.rc == 2 and "did you mean" not in r.err


MONGOFILES_ANSWERS = {
    "list": "use gridfsctl ls [PREFIX|'PATTERN']",
    "search": "use gridfsctl ls --regex RE",
    "delete": "use gridfsctl rm NAME",
    "delete_id": "use gridfsctl rm --id ID",
    "get_id": "use gridfsctl get --id ID",
    "put_id": "use gridfsctl put FILE --name NAME --id ID",
    "get_regex": "use gridfsctl get --regex RE -o DIR",
}


@pytest.mark.parametrize("verb", sorted(MONGOFILES_ANSWERS))
def test_mongofiles_verbs_answer_with_our_command(gridfsctl, verb):
    line = one_line_usage_error(gridfsctl.run(verb, "posters/a.jpg"))
    assert line.startswith(f"gridfsctl: '{verb}' is mongofiles' verb: "), line
    assert MONGOFILES_ANSWERS[verb] in line, line


def test_man_page_says_prefix_is_a_folder_and_bucket_is_mongofiles_prefix():
    with open(os.path.join(ROOT, "man/gridfsctl.1.scd")) as f:
        page = f.read()
    section = page.split("# FOR MONGOFILES USERS", 1)[1].split("\n# ", 1)[0]
    assert "*--prefix* is a folder everywhere" in section
    assert "which is\n*gridfsctl*'s *--bucket*" in section
    for verb in MONGOFILES_ANSWERS:
        assert re.search(rf"^\|  (.*, )?{verb}\b", section, re.M), verb


def test_help_and_version(gfs):
    r = gfs.run("--help", db=False)
    assert r.rc == 0 and "import" in r.text
    for verb in ("ls", "get", "put", "rm", "stat"):
        r = gfs.run(verb, "--help", db=False)
        assert r.rc == 0 and r.text.startswith(f"usage: gridfsctl {verb}"), verb
    r = gfs.run("--version", db=False)
    assert r.rc == 0 and r.text.startswith("gridfsctl ")


# ---- review fixes: rm order, odd names, signals, option parsing -------------

class RecordingProxy(TcpProxy):
    """Forwards TCP to the backend and keeps what each client connection sent, in order.

    With cut_on, the first client message holding those bytes is not
    forwarded: every connection is closed and no new one accepted, as when
    the backend dies mid-run."""

    def __init__(self, backend_port, cut_on=None):
        self.sent = []
        self.cut_on, self.cut, self.socks = cut_on, threading.Event(), []
        super().__init__(backend_port)

    def serve(self, client):
        server = socket.create_connection(self.upstream)
        self.socks += [client, server]
        buf = bytearray()
        self.sent.append(buf)
        self.pump(self._pump, client, server, buf)
        self.pump(self._pump, server, client, None)

    def _pump(self, src, dst, buf):
        # Bytes are recorded before they are forwarded, so all a command sent is
        # here by the time its reply reaches the client.
        try:
            while data := src.recv(65536):
                if buf is not None:
                    buf += data
                if buf is not None and self.cut_on and self.cut_on in buf:
                    self._cut()
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _cut(self):
        self.cut.set()
        self.listener.close()
        for s in list(self.socks):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def test_rm_deletes_oldest_revision_first(gfs, bucket, backend, db):
    ids = [bucket.upload_from_stream("rev", f"v{i}".encode()) for i in range(3)]
    proxy = RecordingProxy(backend.port)
    try:
        r = gfs.run("rm", "rev", "--json", env={"GRIDFSCTL_URI": proxy.uri})
    finally:
        proxy.close()
    assert r.rc == 0 and rm_result(r) == {"filename": "rev", "deleted": 3}, r
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
    wait_for_entries(out, p)
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

    def blocked():
        fields = (proc_file(p.pid, "syscall") or "").split()
        # write(2, ...) on x86_64 (1) or aarch64 (64)
        return len(fields) > 1 and fields[0] in ("1", "64") and fields[1] == "0x2"

    try:
        wait_for(blocked, 30, "gridfsctl to block writing to stderr", pace=0.001, proc=p)
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


# ---- truthful output: escaping, stdout errors, JSON errors -------------------

import planted  # noqa: E402

UNREACHABLE = {"GRIDFSCTL_URI": "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200"}


def assert_inert(text, forged=("FAKE",)):
    """No control byte reaches the terminal, and no stored name starts a line of its own."""
    assert not any(c in text for c in "\x1b\x07\r\x85"), repr(text)
    for line in text.splitlines():
        assert not line.startswith(forged), (line, text)


def test_hostile_names_are_escaped_in_every_human_line(gfs, db, tmp_path):
    ids = planted.plant_hostile(db, planted.HOSTILE_NAMES + [planted.UNSAFE_TITLE_NAME])
    forging = planted.FORGING_NAME
    shown = "dmg\\x1b[31m\\x0aFAKE"
    for args in (["ls"], ["ls", "-l"], ["ls", "-a"]):
        r = gfs.run(*args)
        assert r.rc == 0, r
        assert_inert(r.text)
        assert len(r.text.splitlines()) == len(ids), r.text
        assert any(line.endswith(shown) for line in r.text.splitlines()), r.text
    r = gfs.run("stat", forging)
    assert r.rc == 0 and f"name:        {shown}\n" in r.text, r
    assert_inert(r.text)
    # The refusal names the file, escaped: no terminal title is set.
    r = gfs.run("get", planted.UNSAFE_TITLE_NAME)
    assert r.rc == 2 and "../title\\x1b]0;owned\\x07: stored name is not a safe" in r.err, r
    assert_inert(r.err)
    # Damage reports name the file on one line.
    db.fs.chunks.delete_one({"files_id": ids[forging], "n": 1})
    r = gfs.run("verify")
    assert r.rc == 1 and shown in r.text, r
    assert_inert(r.text + r.err)
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "only-on-disk\x1b[2J\nFAKE").write_bytes(b"x")
    r = gfs.run("verify", "--against", disk, "--combined", tmp_path / "combined")
    assert r.rc == 1, r
    assert_inert(r.text + r.err + (tmp_path / "combined").read_text())
    assert "only-on-disk\\x1b[2J\\x0aFAKE" in (tmp_path / "combined").read_text()
    # import -v prints what it stored the same way.
    src = tmp_path / "src"
    src.mkdir()
    (src / "imp\x1b[31m\nFAKE").write_bytes(b"y")
    r = gfs.run("import", src, "--prefix", "in", "-v")
    assert r.rc == 0 and "uploaded in/imp\\x1b[31m\\x0aFAKE\n" in r.text, r
    assert_inert(r.text + r.err)
    # JSON keeps every name exact.
    r = gfs.run("ls", "--json")
    names = {json.loads(line)["filename"] for line in r.text.splitlines()}
    assert set(ids) | {"in/imp\x1b[31m\nFAKE"} == names
    assert json.loads(gfs.run("stat", forging, "--json").text)["filename"] == forging


def run_to_full(gfs, *args, db=True):
    """Runs gridfsctl with stdout on /dev/full, where every write fails with ENOSPC."""
    with open("/dev/full", "wb") as full:
        p = gfs.popen(*args, stdout=full, stderr=subprocess.PIPE, cwd=gfs.tmp_path, db=db)
        _, err = p.communicate(timeout=120)
    assert b"AddressSanitizer" not in err and b"runtime error" not in err, err
    return p.returncode, err.decode()


def test_write_error_on_stdout_exits_5(gfs, bucket, tmp_path):
    """Output that could not be written is a failure, whatever the verb."""
    (tmp_path / "f").write_bytes(b"put me")
    assert gfs.run("put", tmp_path / "f", "--name", "a.txt").rc == 0
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "t.txt").write_bytes(b"t")
    cases = [
        ["ls"], ["ls", "-l"], ["ls", "--json"], ["stat", "a.txt"], ["stat", "a.txt", "--json"],
        ["put", tmp_path / "f", "--json"], ["rm", "f", "--json"],
        ["import", tmp_path / "tree", "--json"], ["import", tmp_path / "tree", "-v", "--prefix", "v"],
        ["verify"], ["verify", "--json"],
        ["mirror", tmp_path / "m", "--json"], ["mirror", tmp_path / "m2", "--dry-run"],
        ["ls", "--help"], ["help"], ["_options", "ls"], ["--version"],
    ]
    for args in cases:
        verb = args[0] not in ("help", "_options", "--version")  # the others run before any verb
        rc, err = run_to_full(gfs, *args, db=verb)
        who = f"gridfsctl {args[0]}" if verb else "gridfsctl"
        assert rc == 5, (args, rc, err)
        assert conftest.DRIVER_SHM_WARNING.sub("", err).splitlines() == \
            [f"{who}: cannot write to standard output: No space left on device"], (args, err)
    rc, err = run_to_full(gfs, "get", "a.txt", "-o", "-")
    assert rc == 5 and "stdout: No space left on device" in err, err
    # A verb that failed keeps its own exit status, and still says stdout failed.
    rc, err = run_to_full(gfs, "rm", "nonesuch", "--json")
    assert rc == 4 and "cannot write to standard output" in err, err
    bucket.upload_from_stream("no-sha", b"x")
    rc, err = run_to_full(gfs, "verify", "--strict")  # a file with no hash: a problem then
    assert rc == 1 and "cannot write to standard output" in err, err


def test_json_errors_with_the_backend_unreachable(gfs, tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "t").write_bytes(b"t")
    r = gfs.run("put", tmp_path / "f", "--json", env=UNREACHABLE)
    doc = json.loads(r.text)
    assert r.rc == 3 and "cannot reach the backend" in doc["error"], r
    assert doc["source"] == str(tmp_path / "f") and doc["filename"] == "f"
    r = gfs.run("rm", "a", "b", "--json", env=UNREACHABLE)
    docs = jsonvocab.parse(r.text, "rm")
    assert r.rc == 3 and len(docs) == 1 and docs[0]["filename"] == "a", r
    assert "cannot reach the backend" in docs[0]["error"] and docs[0]["deleted"] == 0
    r = gfs.run("import", tmp_path / "tree", "--json", env=UNREACHABLE)
    assert r.rc == 3 and "cannot reach the backend" in jsonvocab.summary(r.text, "import")["error"], r
    r = gfs.run("import", tmp_path / "tree", "--json", env={"GRIDFSCTL_URI": "mongodb://127.0.0.1:1/?tls=maybe"})
    assert r.rc == 2 and jsonvocab.summary(r.text, "import")["error"].startswith("invalid connection string"), r
    # Verbs that print files, not a summary, print none and say why on stderr.
    for args in (["ls", "--json"], ["stat", "a", "--json"], ["get", "a", "-o", "-"]):
        r = gfs.run(*args, env=UNREACHABLE)
        assert r.rc == 3 and r.out == b"" and "cannot reach the backend" in r.err, (args, r)


def test_json_errors_of_refused_runs(gfs, bucket, tmp_path):
    r = gfs.run("rm", "nonesuch", "--json")
    doc = rm_result(r)
    assert r.rc == 4 and doc == {"filename": "nonesuch", "deleted": 0, "error": r.err.strip().split(": ", 1)[1]}, r
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "ok").write_bytes(b"ok")
    os.mkfifo(tree / "pipe")
    r = gfs.run("import", tree, "--json")
    s = jsonvocab.summary(r.text, "import")
    assert r.rc == 1 and s["failed"] == 1, r
    assert s["error"].startswith("1 file failed, the first: ") and "pipe: not a regular file" in s["error"], s
    r = gfs.run("import", tree, "--json", "--exclude", "pipe")
    assert r.rc == 0 and "error" not in jsonvocab.summary(r.text, "import"), r

def test_get_stored_name_never_follows_a_symlink(gfs, bucket, tmp_path):
    work, outside = tmp_path / "w", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    os.symlink("../outside", work / "lnk")
    bucket.upload_from_stream("lnk/pwn", b"x")
    r = gfs.run("get", "lnk/pwn", cwd=work)
    assert r.rc == 5 and "lnk" in r.err and "symlink" in r.err, r
    assert os.listdir(outside) == []
    # The user's own -o path may go through the symlink: that is their choice.
    r = gfs.run("get", "lnk/pwn", "-o", "lnk/mine", cwd=work)
    assert r.rc == 0, r
    assert (outside / "mine").read_bytes() == b"x"


def test_get_empty_output_is_a_usage_error(gfs, bucket, tmp_path):
    bucket.upload_from_stream("e.txt", b"x")
    r = gfs.run("get", "e.txt", "-o", "")
    assert r.rc == 2 and "-o" in r.err, r
    r = gfs.run("get", "e.txt", "-o", "sub/")
    assert r.rc == 2 and "sub/" in r.err, r
    assert os.listdir(tmp_path) == []


def wait_for_entries(path, proc, deadline_s=60, n=1):
    """Waits until path holds n entries (a temp file) or proc has exited; the entries."""
    wait_for(lambda: len(os.listdir(path)) >= n or proc.poll() is not None, deadline_s,
             f"{n} entries in {path}", pace=0.001)
    return os.listdir(path)


def test_get_removes_temp_files_of_killed_gets_only(gfs, bucket, tmp_path):
    body = os.urandom(24 * 1024 * 1024)
    bucket.upload_from_stream("large", body)
    out = tmp_path / "out"
    out.mkdir()
    # A get that is still running (stopped here) must keep its temp file...
    running = gfs.popen("get", "large", "-o", out / "large", stderr=subprocess.DEVNULL)
    killed = None
    try:
        mine = wait_for_entries(out, running)
        os.kill(running.pid, signal.SIGSTOP)
        assert len(mine) == 1 and mine[0].startswith(".large.gridfsctl-"), mine
        # ...while one killed with SIGKILL leaves its own behind.
        killed = gfs.popen("get", "large", "-o", out / "large", stderr=subprocess.DEVNULL)
        wait_for_entries(out, killed, n=2)
        killed.kill()
        killed.wait()
        assert len(os.listdir(out)) == 2, os.listdir(out)
        r = gfs.run("get", "large", "-o", out / "large")
        assert r.rc == 0, r
        assert "interrupted get" in r.err
        assert sorted(os.listdir(out)) == sorted(["large"] + mine)
        assert (out / "large").read_bytes() == body
    finally:
        running.kill()
        running.wait()


def test_put_refuses_names_mirror_would_refuse(gfs, db, tmp_path):
    from planted import UNSAFE_PATH_NAMES
    src = tmp_path / "f.txt"
    src.write_bytes(b"x")
    for name in UNSAFE_PATH_NAMES:
        r = gfs.run("put", src, "--name", name)
        assert r.rc == 2 and name in r.err and "--allow-unsafe-name" in r.err, (name, r)
        assert r.err.count("\n") == 1, r
    assert db.fs.files.count_documents({}) == 0 and db.fs.chunks.count_documents({}) == 0
    r = gfs.run("put", src, "--name", "../../x", "--allow-unsafe-name")
    assert r.rc == 0, r
    assert db.fs.files.find_one()["filename"] == "../../x"


def test_no_piece_of_a_password_with_an_unescaped_at_is_printed(gfs, tmp_path):
    # The driver splits the authority at the first '@', we at the last: it
    # then takes the rest of the password for a host name and prints it.
    pieces = ["s3cr", "t-tail", "more-tail"]
    uri = f"mongodb://user:{'@'.join(pieces)}@127.0.0.1:1/?serverSelectionTimeoutMS=200"
    env = {"GRIDFSCTL_URI": uri, "GRIDFSCTL_DEBUG": "1"}
    (tmp_path / "tree").mkdir()
    (tmp_path / "f.txt").write_bytes(b"x")
    for args in (["ls"], ["get", "f.txt", "-o", "-"], ["put", tmp_path / "f.txt"],
                 ["import", tmp_path / "tree", "--json"]):
        r = gfs.run(*args, env=env)
        assert r.rc == 3 and "cannot reach the backend" in r.err, (args, r)
        for piece in pieces:
            assert piece not in r.err and piece not in r.text, (args, piece, r)
    assert "error" in jsonvocab.summary(r.text, "import")


def test_put_killed_leaves_chunks_the_next_put_removes(gfs, db, tmp_path):
    def start_put(name):
        p = gfs.popen("put", "-", "--name", name, stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
        # More than one bulk insert (8M): the first is on the server while put waits on stdin.
        p.stdin.write(os.urandom(9 * 1024 * 1024))
        p.stdin.flush()
        fid = wait_for(lambda: db.fs.gridfsctl_uploads.find_one({"filename": name}), 60,
                       "an upload marker", pace=0.01, proc=p)["_id"]
        wait_for(lambda: db.fs.chunks.count_documents({"files_id": fid}), 60, "chunks",
                 pace=0.01, proc=p)
        return p, fid

    small = tmp_path / "small.txt"
    small.write_bytes(b"small")
    running, live = start_put("running")
    killed, dead = start_put("killed")
    try:
        os.kill(running.pid, signal.SIGSTOP)  # alive, but not renewing anything
        killed.kill()
        killed.wait()
        r = gfs.run("put", small, "--name", "one")
        assert r.rc == 0 and "removed 1 unfinished upload" in r.err, r
        assert db.fs.chunks.count_documents({"files_id": dead}) == 0
        assert db.fs.gridfsctl_uploads.count_documents({"_id": dead}) == 0
        # Neither put nor import touches the upload of a put still running.
        assert db.fs.chunks.count_documents({"files_id": live}) > 0
        (tmp_path / "tree").mkdir()
        assert gfs.run("import", tmp_path / "tree").rc == 0
        assert db.fs.chunks.count_documents({"files_id": live}) > 0
        assert db.fs.gridfsctl_uploads.count_documents({"_id": live}) == 1
    finally:
        running.kill()
        running.wait()
    r = gfs.run("import", tmp_path / "tree", "--json")
    assert r.rc == 0 and jsonvocab.summary(r.text, "import")["recovered"] == 1, r
    assert db.fs.chunks.count_documents({"files_id": live}) == 0
    assert db.fs.gridfsctl_uploads.count_documents({}) == 0
    assert db.fs.gridfsctl_locks.count_documents(conftest.LOCK_DOCS) == 0
    assert [d["filename"] for d in db.fs.files.find()] == ["one"]

def test_rm_name_removes_malformed_revisions(gfs, bucket, db):
    """A files document no reader can parse still has a name: rm NAME removes it and its chunks."""
    bad = planted.plant_bad_docs(db, "broken")
    good = bucket.upload_from_stream("broken", b"newest")
    r = gfs.run("rm", "broken", "--json")
    assert r.rc == 0 and rm_result(r) == {"filename": "broken", "deleted": 3}, r
    assert db.fs.files.count_documents({}) == 0
    assert db.fs.chunks.count_documents({"files_id": {"$in": bad + [good]}}) == 0


def test_get_empty_file_with_a_stray_chunk_is_damage(gfs, db, tmp_path):
    """An empty file's chunk is extra, as any file's (issue 27.7): exit 1, no file written."""
    planted.plant_empty_with_stray_chunk(db, "empty")
    r = gfs.run("get", "empty", "-o", tmp_path / "e")
    assert r.rc == 1 and "empty: extra chunk n=0 (expected 0 chunks)" in r.err, r
    assert not (tmp_path / "e").exists()
    db.fs.chunks.delete_many({"files_id": db.fs.files.find_one({"filename": "empty"})["_id"]})
    r = gfs.run("get", "empty", "-o", tmp_path / "e")
    assert r.rc == 0 and (tmp_path / "e").read_bytes() == b"", r



def test_rm_dry_run_says_what_it_would_remove_and_removes_nothing(gfs, bucket, db):
    old = bucket.upload_from_stream("gone", b"1")
    new = bucket.upload_from_stream("gone", b"22")
    db.fs.files.insert_one({"filename": "gone", "uploadDate": 5})  # malformed: rm takes it too
    other = bucket.upload_from_stream("kept", b"3")
    before = (db.fs.files.count_documents({}), db.fs.chunks.count_documents({}))
    r = gfs.run("rm", "--dry-run", "gone")
    assert r.rc == 0, r
    lines = r.text.splitlines()
    assert len(lines) == 3 and all(l.startswith("would delete gone (id ") for l in lines)
    assert f"id {old}, 1 bytes" in r.text and f"id {new}, 2 bytes" in r.text
    j = gfs.run("rm", "-n", "gone", "--json")
    d = rm_result(j)
    assert j.rc == 0 and d["filename"] == "gone" and d["dryRun"] is True
    assert d["deleted"] == 3  # what a real rm would remove: the same line, marked
    assert str(old) in d["ids"] and str(new) in d["ids"]
    # by id, and a missing name: the status a real rm would give
    r = gfs.run("rm", "-n", "--id", str(other), "--json")
    assert r.rc == 0 and json.loads(r.text)["ids"] == [str(other)]
    r = gfs.run("rm", "-n", "nonesuch", "--json")
    assert r.rc == 4 and json.loads(r.text)["error"] == "nonesuch: no such file"
    assert gfs.run("rm", "-n", "-f", "nonesuch").rc == 0
    assert gfs.run("rm", "-n", "gone", "nonesuch").rc == 1
    assert (db.fs.files.count_documents({}), db.fs.chunks.count_documents({})) == before
    # and the real rm removes exactly what the dry run listed
    r = gfs.run("rm", "gone", "--json")
    assert r.rc == 0 and json.loads(r.text)["deleted"] == 3
    assert db.fs.files.count_documents({"filename": "gone"}) == 0


def test_ls_long_human_sizes(gfs, bucket):
    bucket.upload_from_stream("big", b"x" * (3 * 1024 * 1024 + 512 * 1024))
    bucket.upload_from_stream("kb", b"x" * 40960)
    bucket.upload_from_stream("small", b"x" * 7)
    rows = {l.split()[-1]: l for l in gfs.run("ls", "-l", "-h").text.splitlines()}
    assert rows["big"].split()[:2] == ["3.5", "MiB"]
    assert rows["kb"].split()[:2] == ["40.0", "KiB"]
    assert rows["small"].split()[:2] == ["7", "B"]
    assert gfs.run("ls", "-lh").text == gfs.run("ls", "-l", "--human-readable").text
    assert gfs.run("ls", "-l").text.split()[0] == str(3 * 1024 * 1024 + 512 * 1024)
    # -h is ls's own; --help still helps
    assert gfs.run("ls", "--help", db=False).text.startswith("usage: gridfsctl ls")


def test_stat_prints_the_mode_in_octal(gfs, tmp_path):
    f = tmp_path / "m.txt"
    f.write_bytes(b"m")
    f.chmod(0o640)
    assert gfs.run("put", f, "--name", "m.txt").rc == 0
    r = gfs.run("stat", "m.txt")
    assert "mode:        0640\n" in r.text, r
    assert json.loads(gfs.run("stat", "m.txt", "--json").text)["metadata"]["mode"] == 0o640


@pytest.mark.parametrize("text,line,what", [
    ("[connection]\nuri = mongodb://x\nbukcet = b\n", 3, "unknown key 'bukcet' in [connection]"),
    ("# comment\n[conection]\nuri = mongodb://x\n", 3, "unknown section [conection]"),
    ("uri = mongodb://x\n", 1, "unknown section []"),
])
def test_config_file_misspelling_is_an_error_with_file_and_line(gfs, tmp_path, text, line, what):
    cfg = tmp_path / "config"
    cfg.write_text(text)
    cfg.chmod(0o600)
    r = gfs.run("ls", env={"GRIDFSCTL_CONFIG": str(cfg)}, db=False)
    assert r.rc == 2, r
    assert r.err.startswith(f"gridfsctl: {cfg}:{line}: {what}"), r.err


def help_exit_codes(gridfsctl, verb):
    text = gridfsctl.run(verb, "--help").text
    last = text.rstrip("\n").splitlines()[-1]
    assert last.startswith("exit status: ") and last.endswith(f"; see gridfsctl-{verb}(1)"), last
    return {int(n) for n in re.findall(r"(?:^exit status: |, |; )(\d+) ", last)}


def man_exit_codes(verb):
    with open(os.path.join(ROOT, "man", f"gridfsctl-{verb}.1.scd")) as f:
        text = f.read()
    section = text.split("# EXIT STATUS", 1)[1].split("\n# ", 1)[0]
    return {int(n) for n in re.findall(r"(?:^|[\s;*|,])(\d+)(?=[\s*]|$)", section, re.M)
            if int(n) in (0, 1, 2, 3, 4, 5, 6, 7, 130)}


@pytest.mark.parametrize("verb", ["ls", "get", "put", "rm", "stat", "import", "verify", "mirror",
                                  "watch", "serve", "supervise", "doctor"])
def test_help_ends_with_the_exit_statuses_the_man_page_gives(gridfsctl, verb):
    codes = help_exit_codes(gridfsctl, verb)
    assert codes == man_exit_codes(verb), verb
    assert 0 in codes and 2 in codes
    # the verbs that catch SIGINT say 130; supervise stops its programs and exits 0
    assert (130 in codes) == (verb in ("get", "put", "rm", "import", "verify", "mirror", "watch",
                                       "serve")), verb


def test_usage_lines_name_the_options(gfs):
    for verb, opts in (("get", ["--id", "--rev", "-o", "-f"]), ("put", ["--name", "-t", "-k", "--json"]),
                       ("rm", ["-f", "-n", "--json"]), ("stat", ["--rev", "--json"]),
                       ("ls", ["-l", "-h", "-a", "--json"]), ("doctor", ["--sample", "--json"])):
        # The usage line, wrapped: up to the blank line after it.
        usage = gfs.run(verb, "--help", db=False).text.split("\n\n", 1)[0]
        for o in opts:
            assert re.search(rf"[\[ |]{re.escape(o)}\b", usage), (verb, o, usage)


def run_on_pty(argv, env, cols):
    """Runs argv with stderr on a pseudo-terminal cols wide; returns what it wrote there."""
    import fcntl
    import struct
    import termios
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
    started = time.monotonic()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave,
                         env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not chunk:
            break
        out += chunk
    assert p.wait(timeout=120) == 0, out
    os.close(master)
    return out.decode(), time.monotonic() - started


@pytest.mark.parametrize("term", ["xterm", "dumb"])
def test_progress_bar_fits_the_terminal_and_speaks_one_unit(gfs, bucket, tmp_path, term):
    for i in range(60):
        bucket.upload_from_stream(f"p/{i:03d}", os.urandom(3000 + i))
    env = dict(gfs.env, TERM=term, COLUMNS="200")  # the window size wins over COLUMNS
    out, secs = run_on_pty(gfs.argv("mirror", tmp_path / "m"), env, 42)
    assert out.endswith("\r\n"), repr(out)  # the pty turns the final \n into \r\n
    assert ("\x1b" in out) == (term != "dumb"), repr(out)
    draws = [d.replace("\x1b[K", "") for d in re.split(r"[\r\n]+", out) if d.strip()]
    assert draws and all(len(d) <= 41 for d in draws), draws
    final = draws[-1].rstrip()
    assert final.startswith("mirror ") and "60/60 files" in final, final
    for size in re.findall(r"(\d[\d.]*) ?([A-Za-z]+)(?:/s)?(?=[,/ ]|$)", final.split("files, ", 1)[1]):
        assert size[1] in ("B", "KiB", "MiB", "GiB"), final
    if secs < 3:
        assert "ETA" not in out  # a rate over a fraction of a second is no base for one
    # wide enough, the bar is drawn
    out, _ = run_on_pty(gfs.argv("mirror", tmp_path / "m2"), env, 120)
    assert re.search(r"mirror \[#{10,30}\] 60/60 files, ", out), repr(out)


def test_rm_verbose_lists_each_revision_removed(gfs, bucket, db):
    a = bucket.upload_from_stream("v", b"1")
    b = bucket.upload_from_stream("v", b"2")
    r = gfs.run("rm", "-v", "v")
    assert r.rc == 0 and r.text == f"deleted v (id {a})\ndeleted v (id {b})\n", r
    c = bucket.upload_from_stream("w", b"3")
    r = gfs.run("rm", "--verbose", "--id", str(c))
    assert r.rc == 0 and r.text == f"deleted id {c}\n"
    assert gfs.run("rm", "-f", "v").text == ""
    assert db.fs.files.count_documents({}) == 0


def run_with_stale_driver_segment(argv, env):
    """Runs argv as a process whose pid already names a /dev/shm/mongoc-PID segment,
    as one left by a process killed with SIGKILL would; returns (status, stderr)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(w, 2)
            open(f"/dev/shm/mongoc-{os.getpid()}", "w").close()
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        err = f.read()
    _, status = os.waitpid(pid, 0)
    os.unlink(f"/dev/shm/mongoc-{pid}")
    return os.waitstatus_to_exitcode(status), err.decode()


def test_stale_driver_segment_makes_no_noise_with_shm_disabled(gfs):
    argv = gfs.argv("--version", db=False)
    loud = {k: v for k, v in gfs.env.items() if k != "MONGOC_DISABLE_SHM"}
    status, err = run_with_stale_driver_segment(argv, loud)
    assert status == 0 and "Falling back to malloc for counters" in err, err
    assert run_with_stale_driver_segment(argv, gfs.env) == (0, "")
