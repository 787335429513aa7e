"""Disk faults for mirror and get: a full file system (a small tmpfs) and a
read-only one. We run as root, so permission bits stop nothing: a read-only
mount stands in for them. Skipped with the reason when mount is refused.

A command must exit non-zero with a message naming the file, leave no
temporary file, and keep what was complete: nothing lost."""
import subprocess

import pytest

from longsuite import LONG
from state import temp_files, tree_files

pytestmark = LONG


def mount_tmpfs(path, size):
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mount -t tmpfs refused: {r.stderr.strip()}")


def remount_ro(path):
    r = subprocess.run(["mount", "-o", "remount,ro", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"remount read-only refused: {r.stderr.strip()}")


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "mnt"
    mount_tmpfs(mnt, "256k")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def store(gfs, tmp_path, files):
    src = tmp_path / "src"
    for name, size in files.items():
        p = src / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(bytes((i * 13) % 251 for i in range(size)))
    assert gfs.run("import", src).rc == 0
    return src


def test_mirror_into_full_fs(gfs, tmp_path, small_fs):
    src = store(gfs, tmp_path, {"a/small.bin": 20_000, "b/big1.bin": 150_000, "b/big2.bin": 150_000,
                                "c/small2.bin": 10_000})
    res = gfs.run("mirror", small_fs, "-j", "1")
    assert res.rc in (1, 5), res
    assert "big" in res.err and ("space" in res.err.lower() or "No space" in res.err), res
    assert temp_files(small_fs) == []
    want = tree_files(src)
    for name, data in tree_files(small_fs).items():
        assert data == want[name], f"{name} written incomplete"


def test_mirror_keeps_old_copy_when_full(gfs, tmp_path, small_fs):
    src = store(gfs, tmp_path, {"f.bin": 100_000})
    assert gfs.run("mirror", small_fs).rc == 0
    old = (small_fs / "f.bin").read_bytes()
    (src / "f.bin").write_bytes(b"n" * 200_000)  # the new copy cannot sit beside the old one
    assert gfs.run("import", src).rc == 0
    res = gfs.run("mirror", small_fs)
    assert res.rc in (1, 5), res
    assert "f.bin" in res.err, res
    assert (small_fs / "f.bin").read_bytes() == old, "the old copy was lost"
    assert temp_files(small_fs) == []


def test_get_into_full_fs(gfs, tmp_path, small_fs):
    store(gfs, tmp_path, {"big.bin": 400_000})
    res = gfs.run("get", "big.bin", "-o", small_fs / "big.bin")
    assert res.rc == 5, res
    assert "big.bin" in res.err, res
    assert list(small_fs.iterdir()) == [], "a partial output or temporary file was left"


def test_read_only_target(gfs, tmp_path, small_fs):
    store(gfs, tmp_path, {"x/a.bin": 1000})
    (small_fs / "keep.txt").write_bytes(b"keep")
    remount_ro(small_fs)
    res = gfs.run("mirror", small_fs)
    assert res.rc in (1, 5), res
    assert "Read-only" in res.err or "read-only" in res.err, res
    res = gfs.run("get", "x/a.bin", "-o", small_fs / "a.bin")
    assert res.rc == 5, res
    assert "a.bin" in res.err, res
    assert tree_files(small_fs) == {"keep.txt": b"keep"}
