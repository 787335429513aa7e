"""gridfsctl mirror against the real backend: round trips, incremental runs, hostile names, damage.

Files are put into GridFS with pymongo's GridFSBucket carrying the metadata
that import stores (sha256, size, mtime, mtimeNs, mode, contentType, and
rawName for names that are not UTF-8). When `gridfsctl import` works, a true
import -> mirror round trip runs too.
"""
import datetime
import fcntl
import hashlib
import os
import resource
import shutil
import signal
import stat as statmod
import subprocess

import pytest
from bson import Binary, Int64

import planted
from conftest import sha256, wait_for

import jsonvocab

CHUNK = 255 * 1024


def meta_for(data, mtime_ns, mode, raw=None):
    md = {
        "sha256": sha256(data),
        "size": len(data),
        "mtime": datetime.datetime.fromtimestamp(mtime_ns // 10**6 / 1000, tz=datetime.timezone.utc),
        "mtimeNs": mtime_ns,
        "mode": mode,
        "contentType": "application/octet-stream",
    }
    if raw is not None:
        md["rawName"] = Binary(raw)
    return md


def store(bucket, name, data, mtime_ns=1_600_000_000_123_456_789, mode=0o644, raw=None, meta=None):
    md = meta if meta is not None else meta_for(data, mtime_ns, mode, raw)
    return bucket.upload_from_stream(name, data, metadata=md)


def make_tree(root):
    """A small tree like the poster tree, with the awkward cases: empty, multi-chunk, UTF-8, modes, ns mtimes."""
    files = {
        "00/01/a.jpg": os.urandom(40_000),
        "00/01/b.jpg": os.urandom(1),
        "00/02/empty.jpg": b"",
        "ff/big.bin": os.urandom(3 * CHUNK + 17),
        "ff/exact.bin": os.urandom(CHUNK),
        "caf\u00e9/\u00fcber \u65e5\u672c.jpg": b"utf-8 name",
        "top.txt": b"top\n",
    }
    for i, (rel, data) in enumerate(sorted(files.items())):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        os.chmod(p, [0o644, 0o600, 0o640, 0o755][i % 4])
        ns = 1_500_000_000_000_000_000 + i * 1_000_000_007 + 123_457
        os.utime(p, ns=(ns, ns))
    return files


def load_tree(bucket, root, prefix=""):
    """Stores a tree the way import does, with pymongo."""
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            st = os.stat(p)
            data = open(p, "rb").read()
            name = (prefix.rstrip("/") + "/" + rel) if prefix else rel
            store(bucket, name, data, meta=meta_for(data, st.st_mtime_ns, statmod.S_IMODE(st.st_mode)))


def snapshot(root):
    """path -> (inode, ctime_ns, mtime_ns, mode, sha256) of every entry under root, symlinks not followed."""
    out = {}
    for dirpath, dirs, names in os.walk(root):
        for n in dirs + names:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            digest = None
            if statmod.S_ISREG(st.st_mode):
                digest = hashlib.sha256(open(p, "rb").read()).hexdigest()
            out[os.path.relpath(p, root)] = (st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_mode, digest)
    return out


def assert_same_tree(src, dst):
    r = subprocess.run(["diff", "-r", "--no-dereference", str(src), str(dst)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    a, b = snapshot(src), snapshot(dst)
    assert sorted(a) == sorted(b)
    for rel in a:
        _, _, mtime_a, mode_a, sha_a = a[rel]
        _, _, mtime_b, mode_b, sha_b = b[rel]
        assert sha_a == sha_b, rel
        if sha_a is not None:  # files: exact mtime and mode
            assert mtime_a == mtime_b, rel
            assert statmod.S_IMODE(mode_a) == statmod.S_IMODE(mode_b), rel


def summary(res):
    """The summary object, every line of the output checked against the vocabulary."""
    return jsonvocab.summary(res.text, "mirror")


def no_temp_files(root):
    for dirpath, _, names in os.walk(root):
        for n in names:
            assert not n.startswith(".gridfsctl-mirror-"), os.path.join(dirpath, n)


# ---- round trips ------------------------------------------------------------


# one sorted pass over all chunks, files_id $in batches, or a query per file
READS = ["scan", "batched", "each"]


@pytest.mark.parametrize("read", READS + ["auto"])
def test_round_trip_and_second_run_writes_nothing(gfs, bucket, tmp_path, read):
    src = tmp_path / "src"
    files = make_tree(src)
    load_tree(bucket, src, prefix="posters")
    store(bucket, "elsewhere/not-mirrored", os.urandom(CHUNK + 1))
    dst = tmp_path / "dst"
    r = gfs.run("mirror", dst, "--prefix", "posters/", "--json", "--read", read)
    assert r.rc == 0, r
    s = summary(r)
    assert s["written"] == len(files) and s["failed"] == 0
    assert s["bytes"] == sum(len(d) for d in files.values())
    assert_same_tree(src, dst)
    no_temp_files(dst)

    before = snapshot(dst)
    r = gfs.run("mirror", dst, "--prefix", "posters", "--json", "--jobs", "3")
    assert r.rc == 0, r
    s = summary(r)
    assert s["written"] == 0 and s["attrs"] == 0 and s["skipped"] == len(files)
    assert snapshot(dst) == before  # same inodes, ctimes and mtimes: nothing touched

    r = gfs.run("mirror", dst, "--prefix", "posters", "--json", "--checksum")
    assert r.rc == 0, r
    assert summary(r)["skipped"] == len(files)
    assert snapshot(dst) == before


def test_whole_bucket_keeps_prefix_as_folder(gfs, bucket, tmp_path):
    store(bucket, "p/x/one", b"1")
    store(bucket, "q/two", b"2")
    r = gfs.run("mirror", tmp_path / "d")
    assert r.rc == 0, r
    assert (tmp_path / "d/p/x/one").read_bytes() == b"1"
    assert (tmp_path / "d/q/two").read_bytes() == b"2"
    r = gfs.run("mirror", tmp_path / "e", "--prefix", "p/x")
    assert r.rc == 0, r
    assert os.listdir(tmp_path / "e") == ["one"]


def import_works(gfs):
    r = gfs.run("import", "--help", db=False)
    return r.rc == 0 and b"not implemented" not in r.out and "not implemented" not in r.err


def test_true_import_then_mirror(gfs, bucket, tmp_path):
    if not import_works(gfs):
        pytest.skip("gridfsctl import not implemented yet")
    src = tmp_path / "src"
    make_tree(src)
    raw = b"bad-\xff\xfe-name.jpg"
    (src / os.fsdecode(b"00")).mkdir(exist_ok=True)
    with open(os.path.join(os.fsencode(src), b"00", raw), "wb") as f:
        f.write(b"raw bytes")
    ns = 1_400_000_000_987_654_321
    os.utime(os.path.join(os.fsencode(src), b"00", raw), ns=(ns, ns))
    r = gfs.run("import", src, "--prefix", "imp")
    assert r.rc == 0, r
    dst = tmp_path / "dst"
    r = gfs.run("mirror", dst, "--prefix", "imp")
    assert r.rc == 0, r
    assert_same_tree(src, dst)
    before = snapshot(dst)
    r = gfs.run("mirror", dst, "--prefix", "imp", "--json")
    assert r.rc == 0 and summary(r)["written"] == 0, r
    assert snapshot(dst) == before


def test_newest_revision_wins(gfs, bucket, tmp_path):
    store(bucket, "r/f", b"old", mtime_ns=1_000_000_000_000_000_000)
    store(bucket, "r/f", b"newest", mtime_ns=1_100_000_000_000_000_000)
    store(bucket, "r/g", b"only")
    r = gfs.run("mirror", tmp_path / "d", "--prefix", "r")
    assert r.rc == 0, r
    assert (tmp_path / "d/f").read_bytes() == b"newest"
    assert os.stat(tmp_path / "d/f").st_mtime_ns == 1_100_000_000_000_000_000


def test_mtime_without_ns_and_upload_date_fallback(gfs, bucket, db, tmp_path):
    data = b"ms only"
    md = meta_for(data, 1_234_567_890_123_000_000, 0o600)
    del md["mtimeNs"]
    store(bucket, "m/ms", data, meta=md)
    fid = store(bucket, "m/nometa", b"plain", meta={})
    up = db.fs.files.find_one({"_id": fid})["uploadDate"]
    r = gfs.run("mirror", tmp_path / "d", "--prefix", "m")
    assert r.rc == 0, r
    st = os.stat(tmp_path / "d/ms")
    assert st.st_mtime_ns == 1_234_567_890_123_000_000
    assert statmod.S_IMODE(st.st_mode) == 0o600
    up_ms = int(up.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000 + 0.5)
    assert os.stat(tmp_path / "d/nometa").st_mtime_ns == up_ms * 10**6
    before = snapshot(tmp_path / "d")
    r = gfs.run("mirror", tmp_path / "d", "--prefix", "m", "--json")
    assert r.rc == 0 and summary(r)["written"] == 0, r
    assert snapshot(tmp_path / "d") == before


def test_dates_past_2262_do_not_overflow(gfs, bucket, db, tmp_path):
    """Nanosecond counts overflow int64 in 2262: an upload date, or a local mtime, beyond it still works."""
    fid = store(bucket, "far/f", b"future", meta={})
    db.fs.files.update_one({"_id": fid}, {"$set": {"uploadDate": datetime.datetime(3000, 1, 1)}})
    store(bucket, "far/g", b"normal", mtime_ns=1_400_000_000_000_000_001)
    dst = tmp_path / "d"
    r = gfs.run("mirror", dst, "--prefix", "far")
    assert r.rc == 0, r
    assert (dst / "f").read_bytes() == b"future"
    # A local mtime in 2400 differs from the stored one: g is written again, f stays.
    ns = 13_569_465_600 * 10**9
    os.utime(dst / "g", ns=(ns, ns))
    r = gfs.run("mirror", dst, "--prefix", "far", "--json")
    assert r.rc == 0, r
    s = summary(r)
    assert s["written"] == 1 and s["skipped"] == 1, s
    assert os.stat(dst / "g").st_mtime_ns == 1_400_000_000_000_000_001


def test_non_utf8_raw_name_restored(gfs, bucket, tmp_path):
    raw = b"d\xff/x\xfe y.jpg"
    store(bucket, "p/d%FF/x%FE y.jpg", b"raw content", raw=raw)
    store(bucket, "p/lit%FF", b"a literal percent name")
    r = gfs.run("mirror", tmp_path / "d", "--prefix", "p")
    assert r.rc == 0, r
    root = os.fsencode(tmp_path / "d")
    assert sorted(os.listdir(root)) == [b"d\xff", b"lit%FF"]
    assert open(os.path.join(root, raw), "rb").read() == b"raw content"
    # A rawName that does not belong to its filename is refused, not trusted.
    store(bucket, "p/innocent.jpg", b"x", raw=b"../../escape\xff")
    r = gfs.run("mirror", tmp_path / "d", "--prefix", "p")
    assert r.rc == 1, r
    assert "p/innocent.jpg" in r.err and "rawName" in r.err
    assert not (tmp_path / "escape").exists()


# ---- safety -----------------------------------------------------------------

HOSTILE = ["../x", "/etc/gridfsctl-mirror-test", "a/../../x", "a//b", ".", "./a", "a/./b", "..", "a/..", "b/"]


def test_hostile_names_write_nothing_outside(gfs, bucket, tmp_path):
    base = tmp_path / "base"
    dst = base / "mirror"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"precious")
    dst.mkdir(parents=True)
    os.symlink(outside, dst / "link")             # a directory symlink inside DIR
    os.symlink(outside / "keep", dst / "leaflink")  # a file symlink inside DIR
    for n in HOSTILE:
        store(bucket, n, b"evil")
    store(bucket, "link/pwned", b"evil")
    store(bucket, "link/deeper/pwned", b"evil")
    store(bucket, "leaflink", b"replaces the link, not its target")
    store(bucket, "good/file", b"fine")
    r = gfs.run("mirror", dst, "--json")
    assert r.rc == 1, r
    for n in HOSTILE + ["link/pwned", "link/deeper/pwned"]:
        assert n in r.err, (n, r.err)
    assert "symlink" in r.err
    # Nothing outside DIR changed.
    assert sorted(os.listdir(outside)) == ["keep"]
    assert (outside / "keep").read_bytes() == b"precious"
    assert sorted(os.listdir(base)) == ["mirror"]
    assert sorted(os.listdir(tmp_path)) == sorted(["base", "outside"])
    assert not os.path.exists("/etc/gridfsctl-mirror-test")
    # Inside, the good file is there and the leaf symlink became a plain file.
    assert (dst / "good/file").read_bytes() == b"fine"
    assert not os.path.islink(dst / "leaflink")
    assert (dst / "leaflink").read_bytes() == b"replaces the link, not its target"
    assert os.path.islink(dst / "link")
    s = summary(r)
    assert s["failed"] == len(HOSTILE) + 2
    no_temp_files(dst)


def test_file_and_folder_of_same_path_are_both_refused(gfs, bucket, tmp_path):
    """"a" and "a/b" cannot both be mirrored: each is refused with a clear message, the rest mirrors."""
    store(bucket, "col/a", b"file a")
    store(bucket, "col/a/b", b"file a/b")
    store(bucket, "col/a/b/c", b"deeper")
    store(bucket, "col/a.txt", b"sorts between a and a/b")
    store(bucket, "col/z/ok", b"fine")
    dst = tmp_path / "d"
    for _ in range(2):  # the same verdict on every run
        r = gfs.run("mirror", dst, "--prefix", "col", "--json", "--delete")
        assert r.rc == 1, r
        lines = [l for l in r.err.splitlines() if "refused" in l]
        assert len(lines) == 3, r.err
        assert any("col/a: refused: its local path is also the folder of 'col/a/b" in l for l in lines), r.err
        assert any("col/a/b: refused: a folder on its local path is also the file 'col/a'" in l for l in lines), r.err
        assert any("col/a/b/c: refused: a folder on its local path is also the file 'col/a'" in l for l in lines), r.err
        s = summary(r)
        assert (s["files"], s["refused"], s["failed"]) == (2, 3, 3), s
        assert sorted(os.listdir(dst)) == ["a.txt", "z"]
        assert (dst / "a.txt").read_bytes() == b"sorts between a and a/b"
        assert (dst / "z/ok").read_bytes() == b"fine"


def test_symlink_swapped_in_for_dir_is_not_followed(gfs, bucket, tmp_path):
    """A directory that a previous run made, replaced by a symlink before the next run."""
    store(bucket, "sub/a", b"1")
    dst = tmp_path / "d"
    assert gfs.run("mirror", dst).rc == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    (dst / "sub/a").unlink()
    (dst / "sub").rmdir()
    os.symlink(outside, dst / "sub")
    r = gfs.run("mirror", dst)
    assert r.rc == 1, r
    assert "sub/a" in r.err and "symlink" in r.err and "--delete" in r.err, r.err
    assert os.listdir(outside) == []
    assert os.path.islink(dst / "sub")
    # --delete removes the link itself (never what it points to) and makes the folder.
    r = gfs.run("mirror", dst, "--delete")
    assert r.rc == 0, r
    assert os.listdir(outside) == []
    assert not os.path.islink(dst / "sub") and (dst / "sub/a").read_bytes() == b"1"


@pytest.mark.parametrize("read", READS)
def test_file_and_folder_swapped_settle_with_delete(gfs, bucket, tmp_path, read):
    """A stale local file where the bucket now has a folder, and a stale folder where it has a file."""
    store(bucket, "tc/a/b", b"a is a folder now")
    store(bucket, "tc/d", b"d is a file now")
    store(bucket, "tc/ok", b"ok")
    dst = tmp_path / "d"
    dst.mkdir()
    (dst / "a").write_bytes(b"stale file")
    (dst / "d/x/y").mkdir(parents=True)
    (dst / "d/x/y/old").write_bytes(b"old")
    (dst / "d/top").write_bytes(b"old")
    for _ in range(2):  # without --delete: the same clear verdict every run, nothing removed
        r = gfs.run("mirror", dst, "--prefix", "tc", "--read", read)
        assert r.rc == 1, r
        assert "tc/a/b: 'a' is not a directory (--delete replaces it with a directory)" in r.err, r.err
        assert "tc/d: a directory is in the way (--delete replaces it)" in r.err, r.err
        assert (dst / "a").read_bytes() == b"stale file"
        assert (dst / "d/x/y/old").exists() and (dst / "d/top").exists()
        assert (dst / "ok").read_bytes() == b"ok"

    before = snapshot(dst)
    r = gfs.run("mirror", dst, "--prefix", "tc", "--delete", "--dry-run")
    assert r.rc == 0, r
    assert set(r.text.splitlines()) == {f"{a} (DRY RUN)" for a in (
        "write a/b", "write d", "delete a", "delete d/top", "delete d/x/y/old", "rmdir d/x/y",
        "rmdir d/x", "rmdir d")}, r.text
    assert snapshot(dst) == before

    r = gfs.run("mirror", dst, "--prefix", "tc", "--delete", "--json", "--read", read)
    assert r.rc == 0, r
    s = summary(r)
    assert (s["written"], s["deleted"], s["removedDirs"], s["failed"]) == (2, 3, 3, 0), s
    assert (dst / "a/b").read_bytes() == b"a is a folder now"
    assert (dst / "d").read_bytes() == b"d is a file now"
    assert sorted(os.listdir(dst)) == ["a", "d", "ok"]
    no_temp_files(dst)
    r = gfs.run("mirror", dst, "--prefix", "tc", "--delete", "--json")
    assert r.rc == 0 and summary(r)["skipped"] == 3, r


# ---- damage -----------------------------------------------------------------


def corrupt(db, fid, how):
    chunk = db.fs.chunks.find_one({"files_id": fid, "n": 1})
    if how == "missing":
        db.fs.chunks.delete_one({"_id": chunk["_id"]})
    elif how == "all-gone":
        db.fs.chunks.delete_many({"files_id": fid})
    elif how == "short":
        db.fs.chunks.update_one({"_id": chunk["_id"]}, {"$set": {"data": Binary(bytes(chunk["data"])[:-5])}})
    elif how == "flipped":
        data = bytearray(chunk["data"])
        data[100] ^= 0xFF
        db.fs.chunks.update_one({"_id": chunk["_id"]}, {"$set": {"data": Binary(bytes(data))}})
    elif how == "n-huge":  # converting -1e300 to an integer is undefined
        db.fs.chunks.update_one({"_id": chunk["_id"]}, {"$set": {"n": -1e300}})
    elif how == "length-max":  # the chunk count must not overflow
        db.fs.files.update_one({"_id": fid}, {"$set": {"length": Int64(2**63 - 1)}})


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("how", ["missing", "all-gone", "short", "flipped", "n-huge", "length-max"])
def test_damaged_file_keeps_old_local_copy(gfs, bucket, db, tmp_path, how, read):
    old = os.urandom(2 * CHUNK + 10)
    store(bucket, "dmg/f.bin", old, mtime_ns=1_300_000_000_000_000_000)
    store(bucket, "dmg/ok.txt", b"ok")
    dst = tmp_path / "d"
    assert gfs.run("mirror", dst, "--prefix", "dmg").rc == 0
    (dst / "stray").write_bytes(b"not in the bucket")
    new = os.urandom(2 * CHUNK + 10)
    fid = store(bucket, "dmg/f.bin", new, mtime_ns=1_310_000_000_000_000_000)
    store(bucket, "dmg/later.txt", b"written after the damaged one")
    corrupt(db, fid, how)
    r = gfs.run("mirror", dst, "--prefix", "dmg", "--delete", "--json", "--read", read)
    assert r.rc == 1, r
    assert "dmg/f.bin" in r.err
    assert (dst / "f.bin").read_bytes() == old
    assert os.stat(dst / "f.bin").st_mtime_ns == 1_300_000_000_000_000_000
    assert (dst / "later.txt").read_bytes() == b"written after the damaged one"
    assert (dst / "stray").exists()  # no deleting after an error
    assert "not deleting" in r.err
    s = summary(r)
    assert s["failed"] == 1 and s["deleted"] == 0
    no_temp_files(dst)


@pytest.mark.parametrize("read", READS)
def test_write_error_removes_temp_and_continues(gfs, bucket, tmp_path, read):
    """A file-size limit makes writes fail with EFBIG, as a full disk would fail them."""
    store(bucket, "w/big", os.urandom(300_000))
    store(bucket, "w/small", b"small")
    dst = tmp_path / "d"
    dst.mkdir()

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    p = gfs.run("mirror", dst, "--prefix", "w", "--jobs", "1", "--read", read, preexec_fn=limit)
    err = p.err
    assert p.rc == 1, err
    assert "w/big" in err and "write" in err
    assert not (dst / "big").exists()
    assert (dst / "small").read_bytes() == b"small"
    no_temp_files(dst)


# ---- incremental, delete, dry run --------------------------------------------


def test_checksum_catches_same_size_and_mtime(gfs, bucket, tmp_path):
    store(bucket, "c/f", b"original", mtime_ns=1_200_000_000_000_000_000)
    dst = tmp_path / "d"
    assert gfs.run("mirror", dst, "--prefix", "c").rc == 0
    (dst / "f").write_bytes(b"tampered")  # same length
    os.utime(dst / "f", ns=(1_200_000_000_000_000_000, 1_200_000_000_000_000_000))
    r = gfs.run("mirror", dst, "--prefix", "c", "--json")
    assert r.rc == 0 and summary(r)["skipped"] == 1
    assert (dst / "f").read_bytes() == b"tampered"
    r = gfs.run("mirror", dst, "--prefix", "c", "--checksum", "--json")
    assert r.rc == 0 and summary(r)["written"] == 1, r
    assert (dst / "f").read_bytes() == b"original"


def test_mode_change_fixed_in_place(gfs, bucket, tmp_path):
    store(bucket, "m/f", b"content", mode=0o640)
    dst = tmp_path / "d"
    assert gfs.run("mirror", dst, "--prefix", "m").rc == 0
    ino = os.stat(dst / "f").st_ino
    os.chmod(dst / "f", 0o777)
    r = gfs.run("mirror", dst, "--prefix", "m", "--json")
    assert r.rc == 0 and summary(r)["attrs"] == 1, r
    st = os.stat(dst / "f")
    assert statmod.S_IMODE(st.st_mode) == 0o640 and st.st_ino == ino


def test_hard_linked_file_is_replaced_not_chmoded(gfs, bucket, tmp_path):
    """A local file sharing its inode with a file outside DIR: fixing its mode must not touch the other name."""
    store(bucket, "h/f", b"content", mode=0o640)
    dst = tmp_path / "d"
    assert gfs.run("mirror", dst, "--prefix", "h").rc == 0
    outside = tmp_path / "outside"
    os.link(dst / "f", outside)
    os.chmod(outside, 0o604)
    r = gfs.run("mirror", dst, "--prefix", "h", "--json")
    assert r.rc == 0, r
    s = summary(r)
    assert s["written"] == 1 and s["attrs"] == 0, s
    after = os.stat(outside)
    assert statmod.S_IMODE(after.st_mode) == 0o604 and after.st_nlink == 1
    st = os.stat(dst / "f")
    assert st.st_ino != after.st_ino and statmod.S_IMODE(st.st_mode) == 0o640
    assert (dst / "f").read_bytes() == b"content" and outside.read_bytes() == b"content"
    # Linked but already right: left alone, the link kept.
    os.unlink(outside)
    os.link(dst / "f", outside)
    r = gfs.run("mirror", dst, "--prefix", "h", "--json")
    assert r.rc == 0 and summary(r)["skipped"] == 1, r
    assert os.stat(dst / "f").st_ino == os.stat(outside).st_ino


def test_setuid_bits_are_not_restored(gfs, bucket, tmp_path):
    store(bucket, "s/f", b"#!/bin/sh\n", mode=0o4755)
    assert gfs.run("mirror", tmp_path / "d", "--prefix", "s").rc == 0
    assert statmod.S_IMODE(os.stat(tmp_path / "d/f").st_mode) == 0o755


def test_dry_run_then_delete(gfs, bucket, tmp_path):
    store(bucket, "t/keep/a", b"a")
    store(bucket, "t/new", b"new")
    dst = tmp_path / "d"
    (dst / "keep").mkdir(parents=True)
    (dst / "keep/a").write_bytes(b"stale")
    (dst / "gone.txt").write_bytes(b"x")
    (dst / "olddir/deep").mkdir(parents=True)
    (dst / "olddir/deep/f").write_bytes(b"x")
    os.symlink("/nonexistent", dst / "dangling")
    stale_tmp = dst / "keep/.gridfsctl-mirror-00112233445566ff.tmp"
    stale_tmp.write_bytes(b"left by a killed run")
    before = snapshot(dst)

    r = gfs.run("mirror", dst, "--prefix", "t", "--delete", "--dry-run")
    assert r.rc == 0, r
    lines = set(r.text.splitlines())
    assert lines == {f"{a} (DRY RUN)" for a in (
        "write keep/a", "write new", "delete gone.txt", "delete dangling", "delete olddir/deep/f",
        "rmdir olddir/deep", "rmdir olddir", "clean keep/.gridfsctl-mirror-00112233445566ff.tmp")}, r.text
    assert snapshot(dst) == before

    r = gfs.run("mirror", dst, "--prefix", "t", "--delete", "--dry-run", "--json")
    assert r.rc == 0, r
    objs = jsonvocab.parse(r.text, "mirror")
    acts = {(o["event"], o["path"]) for o in objs if "event" in o}
    assert ("write", "new") in acts and ("rmdir", "olddir") in acts
    assert all(o["dryRun"] for o in objs if "event" in o)
    assert [o for o in objs if o.get("path") == "new"][0]["filename"] == "t/new"
    s = objs[-1]["summary"]
    assert s["dryRun"] is True and s["written"] == 2
    assert snapshot(dst) == before

    r = gfs.run("mirror", dst, "--prefix", "t", "--delete", "--json")
    assert r.rc == 0, r
    s = summary(r)
    assert (s["written"], s["deleted"], s["removedDirs"], s["cleaned"]) == (2, 3, 2, 1), s
    assert sorted(os.listdir(dst)) == ["keep", "new"]
    assert os.listdir(dst / "keep") == ["a"]
    assert (dst / "keep/a").read_bytes() == b"a"


def test_verbose_prints_what_was_done(gfs, bucket, tmp_path):
    store(bucket, "v/keep/a", b"a")
    store(bucket, "v/new", b"new")
    store(bucket, "v/same", b"same")
    dst = tmp_path / "d"
    assert gfs.run("mirror", dst, "--prefix", "v").rc == 0
    (dst / "keep/a").write_bytes(b"stale")
    (dst / "new").unlink()
    (dst / "gone.txt").write_bytes(b"x")
    (dst / "olddir").mkdir()

    r = gfs.run("mirror", dst, "--prefix", "v", "--delete", "-v")
    assert r.rc == 0, r
    assert set(r.text.splitlines()) == {"write keep/a", "write new", "delete gone.txt", "rmdir olddir"}, r.text
    assert sorted(os.listdir(dst)) == ["keep", "new", "same"]

    (dst / "new").write_bytes(b"changed")
    r = gfs.run("mirror", dst, "--prefix", "v", "-v", "--json")
    assert r.rc == 0, r
    objs = jsonvocab.parse(r.text, "mirror")
    assert [(o["event"], o["path"]) for o in objs if "event" in o] == [("write", "new")], r.text
    assert not any("dryRun" in o for o in objs if "event" in o)
    assert (dst / "new").read_bytes() == b"new"


def test_delete_with_nothing_stored_refuses(gfs, bucket, tmp_path):
    """A mistyped --prefix or an empty bucket must not turn --delete into wiping DIR."""
    store(bucket, "real/a", b"a")
    dst = tmp_path / "d"
    assert gfs.run("mirror", dst, "--prefix", "real").rc == 0
    (dst / "sub").mkdir()
    (dst / "sub/mine").write_bytes(b"local")
    before = snapshot(dst)
    for extra in ([], ["--dry-run"]):
        r = gfs.run("mirror", dst, "--prefix", "typo", "--delete", "--json", *extra)
        assert r.rc == 1, r
        assert len(r.err.splitlines()) == 1, r.err
        assert "no files under 'typo'" in r.err and "--allow-empty" in r.err, r.err
        s = summary(r)
        assert (s["files"], s["deleted"], s["removedDirs"]) == (0, 0, 0), s
        assert snapshot(dst) == before
    r = gfs.run("mirror", dst, "--delete", "--bucket", "never-used")
    assert r.rc == 1 and "the bucket has no files" in r.err, r
    assert snapshot(dst) == before
    # Nothing to lose: an empty DIR is no reason to fail.
    r = gfs.run("mirror", tmp_path / "empty", "--prefix", "typo", "--delete")
    assert r.rc == 0 and r.err == "", r
    # Said to be meant: everything goes.
    r = gfs.run("mirror", dst, "--prefix", "typo", "--delete", "--allow-empty", "--json")
    assert r.rc == 0, r
    s = summary(r)
    assert (s["deleted"], s["removedDirs"]) == (2, 1), s
    assert os.listdir(dst) == []


def test_control_characters_in_names_are_escaped_for_humans(gfs, bucket, tmp_path):
    """A newline or ESC in a stored name must not forge an output line or reach the terminal raw."""
    store(bucket, "esc/evil\nwrite forged", b"1")
    store(bucket, "esc/red\x1b[31m\u0085x", b"2")
    store(bucket, "esc/bad\n//name", b"refused: empty segment")
    dst = tmp_path / "d"
    r = gfs.run("mirror", dst, "--prefix", "esc", "--dry-run")
    assert r.rc == 1, r
    assert sorted(r.text.splitlines()) == ["write evil\\x0awrite forged (DRY RUN)",
                                           "write red\\x1b[31m\\xc2\\x85x (DRY RUN)"], r.text
    assert "esc/bad\\x0a//name: refused" in r.err and "\n//name" not in r.err, r.err
    assert "\x1b" not in r.text + r.err
    # JSON keeps the names exact, in its own escaping.
    r = gfs.run("mirror", dst, "--prefix", "esc", "--dry-run", "--json")
    names = {o.get("filename") for o in jsonvocab.parse(r.text, "mirror")}
    assert "esc/evil\nwrite forged" in names and "esc/red\x1b[31m\u0085x" in names
    # Written to disk with the exact bytes.
    r = gfs.run("mirror", dst, "--prefix", "esc")
    assert r.rc == 1, r
    assert sorted(os.listdir(dst)) == sorted(["evil\nwrite forged", "red\x1b[31m\u0085x"])


def test_without_delete_extras_stay(gfs, bucket, tmp_path):
    store(bucket, "u/a", b"a")
    dst = tmp_path / "d"
    dst.mkdir()
    (dst / "mine").write_bytes(b"mine")
    assert gfs.run("mirror", dst, "--prefix", "u").rc == 0
    assert sorted(os.listdir(dst)) == ["a", "mine"]


def local_files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


def test_delete_with_filters_keeps_what_they_leave_out(gfs, bucket, tmp_path):
    """rsync's rule: --delete removes only local files the filters take and the bucket lacks."""
    for name in ("f/a.jpg", "f/b.txt", "f/sub/c.jpg"):
        store(bucket, name, name.encode())
    dst = tmp_path / "d"
    for rel in ("a.jpg", "old.jpg", "notes.txt", "sub/gone.jpg", "sub/keep.txt", "cache/z.jpg",
                "emptied/y.jpg"):
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_bytes(b"local " + rel.encode())
    (dst / "cache/empty").mkdir()
    filters = ["-x", "*.txt", "-x", "cache"]
    before = snapshot(dst)

    r = gfs.run("mirror", dst, "--prefix", "f", "--delete", "--dry-run", *filters)
    assert r.rc == 0, r
    assert set(r.text.splitlines()) == {f"{a} (DRY RUN)" for a in (
        "write a.jpg", "write sub/c.jpg", "delete old.jpg", "delete sub/gone.jpg",
        "delete emptied/y.jpg", "rmdir emptied")}, r.text
    assert snapshot(dst) == before

    r = gfs.run("mirror", dst, "--prefix", "f", "--delete", "--max-delete", "2", *filters)
    assert r.rc == 7, r  # three to delete: nothing changes
    assert snapshot(dst) == before

    r = gfs.run("mirror", dst, "--prefix", "f", "--delete", "--json", *filters)
    assert r.rc == 0, r
    s = summary(r)
    assert (s["files"], s["written"], s["deleted"], s["removedDirs"]) == (2, 2, 3, 1), s
    assert local_files(dst) == ["a.jpg", "cache/z.jpg", "notes.txt", "sub/c.jpg", "sub/keep.txt"]
    assert (dst / "cache/empty").is_dir()  # an empty folder the filters leave out stays too
    assert (dst / "a.jpg").read_bytes() == b"f/a.jpg"
    assert (dst / "notes.txt").read_bytes() == b"local notes.txt"

    # --files-from: only the paths listed are the run's, to write or to delete.
    listed = tmp_path / "listed"
    listed.write_text("a.jpg\ngone.jpg\n")
    (dst / "gone.jpg").write_bytes(b"x")
    (dst / "other.jpg").write_bytes(b"x")
    r = gfs.run("mirror", dst, "--prefix", "f", "--delete", "-v", "--files-from", listed)
    assert r.rc == 0 and r.text.splitlines() == ["delete gone.jpg"], r
    assert (dst / "other.jpg").exists() and (dst / "sub/c.jpg").exists()


def test_delete_with_filters_guards(gfs, bucket, tmp_path):
    """An empty selection deletes nothing unasked; a file the filters leave out is never cleared away."""
    store(bucket, "g/a.jpg", b"a")
    store(bucket, "g/in/way.jpg", b"w")
    dst = tmp_path / "d"
    dst.mkdir()
    (dst / "in").write_bytes(b"a file where a folder must go")
    (dst / "x.png").write_bytes(b"mine")
    # The filters take no stored file and nothing local: nothing to delete, no refusal.
    r = gfs.run("mirror", dst, "--prefix", "g", "--delete", "--include", "*.gif")
    assert r.rc == 0 and r.err == "", r
    # They take no stored file but a local one: the mistyped-prefix refusal.
    r = gfs.run("mirror", dst, "--prefix", "g", "--delete", "--include", "*.png")
    assert r.rc == 1 and "the filters take no file under 'g'" in r.err and "--allow-empty" in r.err, r
    assert (dst / "x.png").read_bytes() == b"mine"
    # "in" is in the way of in/way.jpg, but --include '*.jpg' leaves it out: kept, the file fails.
    r = gfs.run("mirror", dst, "--prefix", "g", "--delete", "--include", "*.jpg")
    assert r.rc == 1 and "'in' is in the way, and the filters leave it out" in r.err, r
    assert (dst / "in").read_bytes() == b"a file where a folder must go"
    assert (dst / "a.jpg").read_bytes() == b"a" and (dst / "x.png").exists()


def test_dry_run_into_missing_dir_creates_nothing(gfs, bucket, tmp_path):
    store(bucket, "v/a", b"a")
    r = gfs.run("mirror", tmp_path / "nope", "--dry-run", "--prefix", "v")
    assert r.rc == 0 and r.text.splitlines() == ["write a (DRY RUN)"], r
    assert not (tmp_path / "nope").exists()


# ---- the command line ---------------------------------------------------------


def test_usage_and_busy(gfs, bucket, tmp_path):
    r = gfs.run("mirror", "--help", db=False)
    assert r.rc == 0 and b"--delete" in r.out and b"--checksum" in r.out
    assert gfs.run("mirror").rc == 2
    assert gfs.run("mirror", tmp_path / "a", tmp_path / "b").rc == 2
    assert gfs.run("mirror", tmp_path / "a", "--jobs", "0").rc == 2
    r = gfs.run("mirror", "")
    assert r.rc == 2 and "empty" in r.err, r
    r = gfs.run("_options", "mirror", db=False)
    assert r.rc == 0 and b"--dry-run" in r.out and b"--prefix=" in r.out and b"--allow-empty" in r.out
    store(bucket, "b/a", b"a")
    (tmp_path / "afile").write_bytes(b"")
    r = gfs.run("mirror", tmp_path / "afile", "--prefix", "b")
    assert r.rc == 5 and "afile" in r.err, r
    dst = tmp_path / "d"
    dst.mkdir()
    fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = gfs.run("mirror", dst, "--prefix", "b")
        assert r.rc == 6, r
        assert "another mirror" in r.err
    finally:
        os.close(fd)
    assert gfs.run("mirror", dst, "--prefix", "b").rc == 0


def test_unreachable_backend(gfs, tmp_path):
    r = gfs.run("mirror", tmp_path / "d", env={"GRIDFSCTL_URI": "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300"})
    assert r.rc == 3, r


@pytest.mark.parametrize("read", READS)
def test_interrupt_removes_partial_file(gfs, bucket, tmp_path, read):
    """SIGINT while a big file is being written: it is abandoned, its temp file removed, exit 130."""
    store(bucket, "i/a", b"small, written first")
    store(bucket, "i/zz-big", os.urandom(40 * 1024 * 1024))
    dst = tmp_path / "d"
    p = gfs.popen("mirror", dst, "--prefix", "i", "--jobs", "1", "--delete", "--read", read,
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    def big_temp_file():
        temps = [n for n in (os.listdir(dst) if dst.exists() else []) if n.startswith(".gridfsctl-mirror-")]
        return any(os.path.getsize(dst / n) > 1024 * 1024 for n in temps if (dst / n).exists())

    try:
        wait_for(lambda: p.poll() is not None or big_temp_file(), 60, "a temp file over 1 MiB", pace=0.005)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    if p.returncode == 0:
        pytest.skip("the mirror finished before the signal arrived")
    assert p.returncode == 130, err
    assert (dst / "a").exists() and not (dst / "zz-big").exists()
    no_temp_files(dst)


# ---- the sweep ---------------------------------------------------------------


def run_limited(gfs, *args, nofile=1024):
    """Runs gridfsctl with at most nofile descriptors, the usual soft limit."""
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return gfs.run(*args, preexec_fn=limit)


def test_deep_tree_is_swept_within_the_descriptor_limit(gfs, bucket, tmp_path):
    store(bucket, "deep/keep", b"k")
    dst = tmp_path / "d"
    levels = 510  # two descriptors a level would need more than 1024
    deep = dst.joinpath(*["x"] * levels)
    deep.mkdir(parents=True)
    (deep / "stale").write_bytes(b"not in the bucket")
    (deep / ".gridfsctl-mirror-0123456789abcdef.tmp").write_bytes(b"left by a killed run")
    p = run_limited(gfs, "mirror", dst, "--prefix", "deep", "--delete", "--json")
    assert p.rc == 0, p.err
    s = summary(p)
    assert (s["deleted"], s["cleaned"], s["removedDirs"]) == (1, 1, levels), s
    assert os.listdir(dst) == ["keep"]

    # Past the cap the sweep says so and leaves the tree alone.
    too_deep = dst.joinpath(*["y"] * 600)
    too_deep.mkdir(parents=True)
    (too_deep / "stale").write_bytes(b"x")
    p = run_limited(gfs, "mirror", dst, "--prefix", "deep", "--delete")
    assert p.rc == 1, p.err
    assert "not swept, more than 512 levels deep" in p.err, p.err[:200]
    assert (too_deep / "stale").exists()


@pytest.mark.parametrize("how", ["tmpfs", "bind"])
def test_sweep_stays_on_dirs_mount(gfs, bucket, tmp_path, how):
    """A file system, or a bind mount of a folder of the same one, mounted beneath DIR is not emptied by --delete."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) to mount in a private namespace")
    store(bucket, "mnt/a", b"a")
    dst = tmp_path / "d"
    (dst / "other").mkdir(parents=True)
    (dst / "stale").write_bytes(b"not in the bucket")
    (tmp_path / "elsewhere").mkdir()
    mount = {"tmpfs": 'mount -t tmpfs gridfsctl-test "$0/other"',
             "bind": 'mount --bind "$0/../elsewhere" "$0/other"'}[how]
    # The mount lives only in the namespace of this shell: checked there, gone after.
    script = (mount + ' || exit 99\n'
              'echo precious > "$0/other/keep"\n'
              '"$@"; rc=$?\n'
              'test -f "$0/other/keep" && echo KEPT >&2\n'
              'exit $rc\n')
    wrap = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, dst]
    p = gfs.run("mirror", dst, "--prefix", "mnt", "--delete", "--json", wrap=wrap)
    if p.rc == 99 or "unshare failed" in p.err:
        pytest.skip("cannot mount here: " + p.err.strip())
    assert p.rc == 0, p.err
    assert "KEPT" in p.err, p.err
    s = summary(p)
    assert s["deleted"] == 1 and s["removedDirs"] == 0, s
    assert sorted(os.listdir(dst)) == ["a", "other"]


# ---- truthful output ----------------------------------------------------------

import planted  # noqa: E402

UNREACHABLE = {"GRIDFSCTL_URI": "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200"}


def test_json_summary_says_why_the_run_failed(gfs, bucket, tmp_path):
    """Unreachable, or --delete refused: the summary is printed and carries an error."""
    dst = tmp_path / "d"
    r = gfs.run("mirror", dst, "--json", env=UNREACHABLE)
    assert r.rc == 3, r
    s = summary(r)
    assert "cannot reach the backend" in s["error"] and s["files"] == 0, s
    assert not dst.exists()
    r = gfs.run("mirror", dst, "--json", env={"GRIDFSCTL_URI": "mongodb://127.0.0.1:1/?tls=maybe"})
    assert r.rc == 2 and summary(r)["error"].startswith("invalid connection string"), r
    store(bucket, "real/a", b"a")
    assert gfs.run("mirror", dst, "--prefix", "real").rc == 0
    r = gfs.run("mirror", dst, "--prefix", "typo", "--delete", "--json")
    assert r.rc == 1, r
    s = summary(r)
    assert s["error"].startswith("not deleting anything: no files under 'typo'"), s
    assert s["error"] in r.err
    # Busy: the lock's holder is named in the summary too.
    fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = gfs.run("mirror", dst, "--prefix", "real", "--json")
    finally:
        os.close(fd)
    assert r.rc == 6 and "another mirror" in summary(r)["error"], r
    r = gfs.run("mirror", dst, "--prefix", "real", "--json")
    assert r.rc == 0 and "error" not in summary(r), r


def test_backend_lost_mid_run_is_in_the_summary(gfs, bucket, backend, tmp_path):
    """The backend goes away once the listing is done, at the first chunk read."""
    from test_core import RecordingProxy
    for i in range(3):
        store(bucket, f"mid/{i}", b"x" * 10)
    proxy = RecordingProxy(backend.port, cut_on=b"fs.chunks")
    try:
        uri = proxy.uri + "?serverSelectionTimeoutMS=300&connectTimeoutMS=300"
        r = gfs.run("mirror", tmp_path / "d", "--prefix", "mid", "--json", env={"GRIDFSCTL_URI": uri})
    finally:
        proxy.close()
    assert proxy.cut.is_set()
    assert r.rc == 3, r
    s = summary(r)
    assert s["files"] == 3 and s["written"] == 0 and s["failed"] >= 1, s
    assert s["error"] and s["error"] in r.err, s


def test_refusal_of_a_long_name_keeps_its_reason(gfs, db, tmp_path):
    planted.plant(db, 1, planted.LONG_NAME, b"x")
    r = gfs.run("mirror", tmp_path / "d", "--prefix", "long", "--json")
    assert r.rc == 1, r
    lines = r.err.splitlines()
    assert len(lines) == 1 and lines[0].endswith(": refused: name longer than 4000 bytes"), r.err[-300:]
    assert "nnn...(5005 bytes)...nnn" in lines[0] and len(lines[0]) < 600, lines[0][:100]
    assert summary(r)["error"].endswith("refused: name longer than 4000 bytes")


def test_names_deeper_than_the_sweep_are_refused_not_written(gfs, db, bucket, tmp_path):
    """What mirror writes it can sweep: a name 1,500 folders deep is refused, with its reason."""
    planted.plant(db, 1, planted.DEEP_NAME, b"deep")
    ok = "deep/" + "o/" * 511 + "leaf"  # 512 folders: as deep as the sweep goes
    planted.plant(db, 2, ok, b"ok")
    dst = tmp_path / "d"
    try:
        r = gfs.run("mirror", dst, "--prefix", "deep", "--delete", "--json")
        assert r.rc == 1, r
        assert "refused: more than 512 folders deep, deeper than the sweep goes" in r.err, r.err[-300:]
        assert "not swept" not in r.err
        assert sorted(os.listdir(dst)) == ["o"]
        assert (dst / ok[len("deep/"):]).read_bytes() == b"ok"
        db.fs.files.delete_one({"_id": 1})
        for _ in range(2):  # and again: nothing left that the sweep cannot reach
            r = gfs.run("mirror", dst, "--prefix", "deep", "--delete", "--json")
            assert r.rc == 0 and summary(r)["failed"] == 0, r
    finally:
        # A tree 1,500 deep (what a mirror without the limit writes) is too
        # deep for the recursion of pytest's own clean-up; rm(1) is not.
        subprocess.run(["rm", "-rf", str(dst)], check=True)


@pytest.mark.parametrize("read", READS + ["auto"])
def test_every_read_writes_the_same_files(gfs, db, tmp_path, read):
    """Planted damage: whichever way chunks are read, the same files are written and the same refused."""
    planted.plant_damage(db, "dmg")
    planted.plant_damage(db, "other")
    runs = {}
    for mode in ("each", read):
        dst = tmp_path / mode
        r = gfs.run("mirror", dst, "--prefix", "dmg", "--json", "--read", mode)
        assert r.rc == 1, r
        failed = sorted(l.split(":")[1].strip() for l in r.err.splitlines() if "dmg/" in l)
        runs[mode] = (sorted(os.listdir(dst)), failed, summary(r)["written"], summary(r)["failed"])
        no_temp_files(dst)
    assert runs[read] == runs["each"], runs
    # a reader refuses a duplicate chunk too, and an empty file's stray chunk (extra, as any)
    assert runs[read][0] == ["good.bin"], runs
    assert runs[read][1] == ["dmg/" + n + ".bin" for n in
                             ("corrupt", "dup", "extra", "incomplete", "missing", "short",
                              "stray-empty")], runs
