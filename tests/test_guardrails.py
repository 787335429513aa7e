"""Guard rails for cron: --max-delete (import, mirror, watch) and mirror --backup-dir,
against the real backend, checked with pymongo and on disk."""
import os
import signal

import pytest

import jsonvocab
from test_watch import Watcher

EXIT_LIMIT = 7


def stored(db):
    return sorted(d["filename"] for d in db.fs.files.find({}, {"filename": 1}))


def make_tree(root, n):
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / f"f{i}.txt").write_bytes(b"x%d" % i)


# ---- parsing ------------------------------------------------------------------

@pytest.mark.parametrize("verb", ["import", "mirror", "watch"])
@pytest.mark.parametrize("bad", ["", "-1", "x", "5%%", "101%", "%", "1.5", "10 "])
def test_max_delete_takes_a_count_or_a_percentage(gfs, tmp_path, verb, bad):
    r = gfs.run(verb, tmp_path, "--delete", "--max-delete", bad)
    assert r.rc == 2 and "--max-delete" in r.err, r


@pytest.mark.parametrize("verb", ["import", "mirror", "watch"])
def test_max_delete_without_delete_is_a_usage_error(gfs, db, tmp_path, verb):
    """A bound on deletions that cannot happen is a mistake in the command line, said before any work."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_bytes(b"a")
    r = gfs.run(verb, tmp_path / "src", "--max-delete", "3")
    assert r.rc == 2 and "--max-delete bounds --delete" in r.err, r
    assert db.fs.files.count_documents({}) == 0


# ---- import -------------------------------------------------------------------

def test_import_over_the_limit_deletes_nothing(gfs, db, tmp_path):
    tree = tmp_path / "t"
    make_tree(tree, 10)
    assert gfs.run("import", tree).rc == 0
    for i in range(4):
        (tree / f"f{i}.txt").unlink()
    (tree / "new.txt").write_bytes(b"new")
    before = set(stored(db))
    r = gfs.run("import", tree, "--delete", "--max-delete", "3", "--json")
    assert r.rc == EXIT_LIMIT, r
    assert "would delete 4 files, more than --max-delete 3" in r.err, r
    s = jsonvocab.summary(r.text, "import")
    assert s["deleted"] == 0 and "--max-delete" in s["error"], s
    # nothing deleted; the upload before the check stays
    assert set(stored(db)) == before | {"new.txt"}
    assert db["fs.gridfsctl_uploads"].count_documents({}) == 0
    # a dry run says the same, and the same code
    r = gfs.run("import", tree, "--delete", "--max-delete", "3", "--dry-run")
    assert r.rc == EXIT_LIMIT and "would delete 4 files" in r.err, r
    # within the limit: deleted
    r = gfs.run("import", tree, "--delete", "--max-delete", "4", "--json")
    assert r.rc == 0 and jsonvocab.summary(r.text, "import")["deleted"] == 4, r
    assert len(stored(db)) == 7


def test_import_percentage_is_of_the_files_under_the_prefix(gfs, db, tmp_path):
    tree = tmp_path / "t"
    make_tree(tree, 10)
    assert gfs.run("import", tree, "--prefix", "p").rc == 0
    db.fs.files.insert_one({"filename": "elsewhere", "length": 0, "chunkSize": 1})
    for i in range(3):
        (tree / f"f{i}.txt").unlink()
    r = gfs.run("import", tree, "--prefix", "p", "--delete", "--max-delete", "29%")
    assert r.rc == EXIT_LIMIT and "3 of 10 files (30%)" in r.err, r
    assert len(stored(db)) == 11
    r = gfs.run("import", tree, "--prefix", "p", "--delete", "--max-delete", "30%")
    assert r.rc == 0, r
    assert len(stored(db)) == 8


def test_import_max_delete_zero_forbids_any_deletion(gfs, db, tmp_path):
    tree = tmp_path / "t"
    make_tree(tree, 2)
    assert gfs.run("import", tree).rc == 0
    (tree / "f0.txt").unlink()
    r = gfs.run("import", tree, "--delete", "--max-delete", "0")
    assert r.rc == EXIT_LIMIT, r
    assert len(stored(db)) == 2
    # nothing to delete is never over the limit
    (tree / "f0.txt").write_bytes(b"x0")
    assert gfs.run("import", tree, "--delete", "--max-delete", "0").rc == 0


# ---- mirror -------------------------------------------------------------------

def test_mirror_over_the_limit_changes_nothing(gfs, bucket, tmp_path):
    for i in range(3):
        bucket.upload_from_stream(f"m/k{i}", b"keep")
    bucket.upload_from_stream("m/changed", b"new content")
    dst = tmp_path / "d"
    dst.mkdir()
    for i in range(5):
        (dst / f"stale{i}").write_bytes(b"stale")
    (dst / "changed").write_bytes(b"old")
    r = gfs.run("mirror", dst, "--prefix", "m", "--delete", "--max-delete", "4", "--json")
    assert r.rc == EXIT_LIMIT, r
    assert "mirror --delete would delete 5 files, more than --max-delete 4" in r.err, r
    s = jsonvocab.summary(r.text, "mirror")
    assert s["deleted"] == 0 and s["written"] == 0 and "--max-delete" in s["error"], s
    # stopped before anything: no deletion and no overwrite either
    assert sorted(os.listdir(dst)) == ["changed"] + [f"stale{i}" for i in range(5)]
    assert (dst / "changed").read_bytes() == b"old"
    # 5 of 6 files in DIR (83%) against 80%
    r = gfs.run("mirror", dst, "--prefix", "m", "--delete", "--max-delete", "80%")
    assert r.rc == EXIT_LIMIT and "5 of 6 files (83%)" in r.err, r
    r = gfs.run("mirror", dst, "--prefix", "m", "--delete", "--max-delete", "5", "--json")
    assert r.rc == 0 and jsonvocab.summary(r.text, "mirror")["deleted"] == 5, r
    assert sorted(os.listdir(dst)) == ["changed", "k0", "k1", "k2"]


# ---- mirror --backup-dir ------------------------------------------------------

@pytest.mark.parametrize("read", ["each", "scan"])
def test_backup_dir_keeps_deleted_and_overwritten_files(gfs, bucket, tmp_path, read):
    bucket.upload_from_stream("b/a/x.txt", b"new x")
    bucket.upload_from_stream("b/same.txt", b"same")
    dst, bak = tmp_path / "d", tmp_path / "bak"
    (dst / "a").mkdir(parents=True)
    (dst / "a" / "x.txt").write_bytes(b"old x")
    (dst / "gone" / "deep").mkdir(parents=True)
    (dst / "gone" / "deep" / "y.txt").write_bytes(b"old y")
    os.chmod(dst / "gone" / "deep" / "y.txt", 0o640)
    (dst / "link").symlink_to("/etc/passwd")
    r = gfs.run("mirror", dst, "--prefix", "b", "--delete", "--backup-dir", bak, "--json", "--read", read)
    assert r.rc == 0, r
    s = jsonvocab.summary(r.text, "mirror")
    assert (s["written"], s["deleted"], s["backedUp"]) == (2, 2, 3), s
    assert (dst / "a" / "x.txt").read_bytes() == b"new x"
    assert not (dst / "gone").exists() and not os.path.lexists(dst / "link")
    # kept at the same relative path, content and mode intact; the symlink as a symlink
    assert (bak / "a" / "x.txt").read_bytes() == b"old x"
    assert (bak / "gone" / "deep" / "y.txt").read_bytes() == b"old y"
    assert os.stat(bak / "gone" / "deep" / "y.txt").st_mode & 0o777 == 0o640
    assert os.readlink(bak / "link") == "/etc/passwd"
    # an unchanged file is not copied; a second run keeps the newest old version
    assert not (bak / "same.txt").exists()
    bucket.upload_from_stream("b/a/x.txt", b"newer x")
    assert gfs.run("mirror", dst, "--prefix", "b", "--backup-dir", bak).rc == 0
    assert (bak / "a" / "x.txt").read_bytes() == b"new x"


def test_a_file_that_cannot_be_kept_is_not_overwritten(gfs, bucket, tmp_path):
    bucket.upload_from_stream("k/x", b"new")
    bucket.upload_from_stream("k/y", b"new y")
    dst, bak = tmp_path / "d", tmp_path / "bak"
    dst.mkdir()
    (dst / "x").write_bytes(b"old")
    (dst / "y").write_bytes(b"old y")
    # y's size is the stored one's: a local time in the millisecond of the
    # upload would make mirror's quick check take it as the same file.
    for f in ("x", "y"):
        os.utime(dst / f, (1_000_000_000, 1_000_000_000))
    (bak / "x" / "busy").mkdir(parents=True)  # a directory where x's backup must go
    r = gfs.run("mirror", dst, "--prefix", "k", "--backup-dir", bak, "--json")
    assert r.rc == 1 and "x: --backup-dir" in r.err, r
    s = jsonvocab.summary(r.text, "mirror")
    assert (s["written"], s["failed"], s["backedUp"]) == (1, 1, 1) and s["error"], s
    assert (dst / "x").read_bytes() == b"old" and (dst / "y").read_bytes() == b"new y"
    assert (bak / "y").read_bytes() == b"old y"


def test_backup_dir_with_dry_run_changes_nothing(gfs, bucket, tmp_path):
    bucket.upload_from_stream("n/f", b"new")
    dst, bak = tmp_path / "d", tmp_path / "bak"
    dst.mkdir()
    (dst / "f").write_bytes(b"old")
    (dst / "extra").write_bytes(b"extra")
    r = gfs.run("mirror", dst, "--prefix", "n", "--delete", "--backup-dir", bak, "--dry-run")
    assert r.rc == 0, r
    assert not bak.exists() and (dst / "f").read_bytes() == b"old" and (dst / "extra").exists()


def test_backup_dir_across_file_systems_copies(gfs, bucket, tmp_path):
    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system to copy across")
    import tempfile
    bak = tempfile.mkdtemp(dir=shm)
    try:
        bucket.upload_from_stream("c/f", b"new")
        dst = tmp_path / "d"
        dst.mkdir()
        (dst / "f").write_bytes(b"old f")
        (dst / "extra").write_bytes(b"old extra")
        r = gfs.run("mirror", dst, "--prefix", "c", "--delete", "--backup-dir", bak)
        assert r.rc == 0, r
        assert open(os.path.join(bak, "f"), "rb").read() == b"old f"
        assert open(os.path.join(bak, "extra"), "rb").read() == b"old extra"
        assert sorted(os.listdir(dst)) == ["f"] and (dst / "f").read_bytes() == b"new"
    finally:
        import shutil
        shutil.rmtree(bak)


def test_backup_dir_inside_the_target_is_refused(gfs, bucket, tmp_path):
    bucket.upload_from_stream("r/f", b"f")
    dst = tmp_path / "d"
    (dst / "keep").mkdir(parents=True)
    (dst / "stale").write_bytes(b"stale")
    for bak, why in ((dst / "keep", "inside"), (dst, "inside"), (tmp_path, "holds")):
        r = gfs.run("mirror", dst, "--prefix", "r", "--delete", "--backup-dir", bak, "--json")
        assert r.rc == 2 and why in r.err, (bak, r)
        assert why in jsonvocab.summary(r.text, "mirror")["error"]
        assert (dst / "stale").exists() and not (dst / "f").exists()


def test_backup_dir_never_writes_through_a_symlink(gfs, bucket, tmp_path):
    """A symlink planted in the backup directory is not followed out of it."""
    dst, bak, outside = tmp_path / "d", tmp_path / "bak", tmp_path / "outside"
    (dst / "a").mkdir(parents=True)
    (dst / "a" / "x").write_bytes(b"old")
    bak.mkdir()
    outside.mkdir()
    (bak / "a").symlink_to(outside)
    r = gfs.run("mirror", dst, "--prefix", "s", "--delete", "--allow-empty", "--backup-dir", bak)
    assert r.rc == 1 and "--backup-dir" in r.err, r
    assert os.listdir(outside) == []
    # what could not be kept is not destroyed
    assert (dst / "a" / "x").read_bytes() == b"old"


# ---- watch --------------------------------------------------------------------

def test_watch_batch_over_the_limit_removes_nothing(gfs, db, tmp_path):
    tree = tmp_path / "w"
    make_tree(tree, 6)
    w = Watcher(gfs, tree, "--delete", "--max-delete", "2", "--settle", "500")
    try:
        w.wait_for("ready")
        assert len(stored(db)) == 6
        for i in range(3):
            (tree / f"f{i}.txt").unlink()
        rc = w.wait_exit()
    finally:
        w.stop()
    assert rc == EXIT_LIMIT, w.stderr
    assert any("watch --delete would delete 3 files, more than --max-delete 2" in l
               for l in w.stderr), w.stderr
    assert len(stored(db)) == 6


def test_watch_within_the_limit_removes(gfs, db, tmp_path):
    tree = tmp_path / "w"
    make_tree(tree, 4)
    w = Watcher(gfs, tree, "--delete", "--max-delete", "50%")
    try:
        w.wait_for("ready")
        (tree / "f0.txt").unlink()
        w.wait_for("delete", "f0.txt")
    finally:
        rc = w.stop(signal.SIGTERM)
    assert rc == 0
    assert stored(db) == ["f1.txt", "f2.txt", "f3.txt"]


def test_watch_first_pass_over_the_limit(gfs, db, tmp_path):
    tree = tmp_path / "w"
    make_tree(tree, 2)
    assert gfs.run("import", tree).rc == 0
    for i in range(2):
        (tree / f"f{i}.txt").unlink()
    (tree / "other.txt").write_bytes(b"o")
    w = Watcher(gfs, tree, "--delete", "--max-delete", "1")
    rc = w.wait_exit()
    assert rc == EXIT_LIMIT, w.stderr
    assert sorted(stored(db)) == ["f0.txt", "f1.txt", "other.txt"]


def test_a_refused_backup_dir_is_not_created(gfs, bucket, tmp_path):
    """Issue 27, 8-13 (11): a --backup-dir still to be made inside DIR is refused
    before mkdir -p runs, so nothing is left in DIR; a dry run refuses it too."""
    bucket.upload_from_stream("r/f", b"f")
    dst = tmp_path / "d"
    dst.mkdir()
    (dst / "stale").write_bytes(b"stale")
    for bak in (dst / "new" / "deeper", dst / "gone" / ".." / "back", tmp_path / "link" / "b"):
        if bak.parent.name == "link":
            os.symlink(dst, bak.parent)
        for dry in ((), ("--dry-run",)):
            r = gfs.run("mirror", dst, "--prefix", "r", "--delete", "--backup-dir", bak, *dry)
            assert r.rc == 2 and "inside the mirror's directory" in r.err, (bak, r)
            assert sorted(os.listdir(dst)) == ["stale"], (bak, os.listdir(dst))
    # Beside DIR it is made, as before.
    r = gfs.run("mirror", dst, "--prefix", "r", "--delete", "--backup-dir", tmp_path / "b" / "c")
    assert r.rc == 0 and (tmp_path / "b" / "c" / "stale").read_bytes() == b"stale", r
