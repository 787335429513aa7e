"""Every command ships with --help, a man page and completions, and make install lays them out."""
import os
import subprocess

import pytest

from conftest import BIN, ROOT


def commands():
    out = subprocess.run([BIN, "_options"], capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.parametrize("cmd", commands())
def test_help_man_and_completions(cmd):
    r = subprocess.run([BIN, cmd, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith(f"usage: gridfsctl {cmd}"), r
    assert "exit status" in r.stdout
    assert os.path.exists(os.path.join(ROOT, "man", f"gridfsctl-{cmd}.1.scd")), cmd
    for comp in ("gridfsctl.bash", "_gridfsctl", "gridfsctl.fish"):
        with open(os.path.join(ROOT, "completions", comp)) as f:
            assert cmd in f.read(), (cmd, comp)


def test_make_install_layout(tmp_path):
    subprocess.run(["make", "-s", "-C", ROOT, "install", f"DESTDIR={tmp_path}", "PREFIX=/usr"],
                   check=True, capture_output=True)
    usr = tmp_path / "usr"
    assert os.access(usr / "bin" / "gridfsctl", os.X_OK)
    assert (usr / "share" / "man" / "man1" / "gridfsctl.1").exists()
    for cmd in commands():
        assert (usr / "share" / "man" / "man1" / f"gridfsctl-{cmd}.1").exists(), cmd
    assert (usr / "share" / "bash-completion" / "completions" / "gridfsctl").exists()
    assert (usr / "share" / "zsh" / "site-functions" / "_gridfsctl").exists()
    assert (usr / "share" / "fish" / "vendor_completions.d" / "gridfsctl.fish").exists()
