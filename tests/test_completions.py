"""Shell completions: they load in each shell and offer what the binary says it accepts."""
import os
import shutil
import subprocess

import pytest

from conftest import BIN, ROOT

COMP = os.path.join(ROOT, "completions")


def bash_complete(line, bindir):
    """Completes `line` the way bash does at the end of it, returns the candidates."""
    script = f"""
source /usr/share/bash-completion/bash_completion
source {COMP}/gridfsctl.bash
COMP_LINE={line!r}
read -ra COMP_WORDS <<< "$COMP_LINE"
[[ $COMP_LINE == *' ' ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
COMP_POINT=${{#COMP_LINE}}
_gridfsctl
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    env = dict(os.environ, PATH=bindir + ":" + os.environ["PATH"])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.fixture
def bindir(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    os.symlink(BIN, d / "gridfsctl")
    return str(d)


@pytest.mark.skipif(not os.path.exists("/usr/share/bash-completion/bash_completion"),
                    reason="bash-completion not installed (scripts/deps installs it)")
def test_bash_commands_and_options(bindir):
    assert {"import", "verify", "mirror", "serve", "supervise"} <= set(bash_complete("gridfsctl ", bindir))
    assert bash_complete("gridfsctl st", bindir) == ["stat"]
    opts = bash_complete("gridfsctl get --", bindir)
    assert "--output=" in opts and "--force" in opts and "--uri=" in opts


def test_binary_lists_options_for_every_command():
    names = subprocess.run([BIN, "_options"], capture_output=True, text=True).stdout.split()
    assert "import" in names and "ls" in names
    for name in names:
        out = subprocess.run([BIN, "_options", name], capture_output=True, text=True)
        assert out.returncode == 0
        assert all(o.startswith("--") for o in out.stdout.split()), name


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh not installed")
def test_zsh_file_parses():
    assert subprocess.run(["zsh", "-n", os.path.join(COMP, "_gridfsctl")]).returncode == 0


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish not installed")
def test_fish_file_loads(bindir):
    env = dict(os.environ, PATH=bindir + ":" + os.environ["PATH"])
    out = subprocess.run(["fish", "-c", f"source {COMP}/gridfsctl.fish; complete -C 'gridfsctl get --o'"],
                         capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "--output=" in out.stdout
