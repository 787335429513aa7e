"""Shell completions, driven for real: bash's completion function with
COMP_WORDS set, fish's `complete -C`, zsh in tmux. What they offer comes from
the binary (`gridfsctl _complete`, `gridfsctl _names`)."""
import os
import re
import shlex
import shutil
import subprocess

import pytest

import planted
from conftest import BIN, ROOT, Binary, free_port, wait_for
from test_core import help_exit_codes, man_exit_codes

COMP = os.path.join(ROOT, "completions")
BASH_COMPLETION = "/usr/share/bash-completion/bash_completion"
needs_bash_completion = pytest.mark.skipif(not os.path.exists(BASH_COMPLETION),
                                           reason="bash-completion not installed (scripts/deps installs it)")


@pytest.fixture
def bindir(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    os.symlink(BIN, d / "gridfsctl")
    return str(d)


@pytest.fixture
def cwd(tmp_path):
    """A working directory with a file and a directory that file completion would offer."""
    d = tmp_path / "cwd"
    (d / "subdir").mkdir(parents=True)
    (d / "local.log").write_text("x")
    return str(d)


def shell_env(gfs, bindir):
    return dict(gfs.env, PATH=bindir + ":" + os.environ["PATH"])


def bash_complete(words, env, cwd):
    """Runs _gridfsctl as bash would with the cursor at the end of the last of
    words (as typed, quoting included); returns COMPREPLY."""
    line = " ".join(words)
    script = f"""
source {BASH_COMPLETION}
source {COMP}/gridfsctl.bash
COMP_WORDS=({" ".join(shlex.quote(w) for w in words)})
COMP_CWORD={len(words) - 1}
COMP_LINE={shlex.quote(line)}
COMP_POINT=${{#COMP_LINE}}
_gridfsctl
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=cwd,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    return [w for w in out.stdout.split("\n") if w]


@pytest.fixture
def bash(gfs, bindir, cwd):
    env = shell_env(gfs, bindir)
    return lambda *words: bash_complete(["gridfsctl", *words], env, cwd)


@needs_bash_completion
def test_bash_commands_and_options(bash, gridfsctl):
    assert {"import", "verify", "mirror", "serve", "supervise", "help"} <= set(bash(""))
    assert bash("st") == ["stat"]
    opts = bash("get", "--")
    assert "--output=" in opts and "--force" in opts and "--uri=" in opts
    assert bash("verify", "--rep") == ["--repair"]
    every = gridfsctl.run("_options", "verify").text.split()
    assert set(every) <= set(bash("verify", "--")), "every option of the binary is offered"
    assert not [o for o in bash("verify", "--") if o.startswith("--to")]


@needs_bash_completion
def test_bash_option_arguments_by_kind(bash):
    # -c is import's --checksum, a flag: what follows is the DIR operand.
    assert bash("import", "-c", "") == ["subdir"]
    assert bash("import", "--jobs", "") == []
    assert bash("import", "-j", "") == []
    assert sorted(bash("mirror", "--read", "")) == ["auto", "batched", "each", "scan"]
    assert bash("mirror", "--read=s") == ["scan"]
    assert bash("verify", "--read", "b") == ["batched"]
    assert not [o for o in bash("verify", "--") if o.startswith("--strat")], "a deprecated spelling"
    assert bash("verify", "--against", "") == ["subdir"]
    assert set(bash("supervise", "--log", "")) == {"local.log", "subdir"}
    assert set(bash("get", "-o", "")) == {"local.log", "subdir"}
    assert set(bash("supervise", "")) == {"status", "restart", "reload", "stop"}


@needs_bash_completion
def test_bash_guard_rail_options(bash):
    """--backup-dir takes a directory; --max-delete a count, so nothing is offered."""
    for verb in ("import", "mirror", "watch"):
        assert bash(verb, "--max-d") == ["--max-delete="], verb
        assert bash(verb, "--max-delete", "") == [], verb
    assert bash("mirror", "--backup-dir", "") == ["subdir"]
    assert bash("import", "--back") == []


@needs_bash_completion
def test_bash_stored_names_stay_one_word(bash, gfs, db):
    planted.plant_names(db, planted.SHELL_NAMES + ["six.txt"])
    got = bash("--db", gfs.dbname, "get", "five")
    assert sorted(got) == sorted(_bash_q(n) for n in planted.SHELL_NAMES)
    assert sorted(bash("--db", gfs.dbname, "rm", "five\\ f")) == ["five\\ five.txt", "five\\ four.txt"]
    assert bash("get", "--db", gfs.dbname, "si") == ["six.txt"]


def _bash_q(name):
    return subprocess.run(["bash", "-c", 'printf %q "$1"', "_", name], capture_output=True,
                          text=True, check=True).stdout


def test_names_verb_is_bounded_and_skips_unprintable(gfs, db):
    planted.plant_names(db, [f"many/{i:03}" for i in range(205)] + ["many/x\nforged", "many/x\x1b[0m"])
    planted.plant_names(db, ["many/000"])  # a second revision is one name
    r = gfs.run("_names", "many/")
    assert r.rc == 0, r
    names = r.text.split("\n")[:-1]
    assert names == [f"many/{i:03}" for i in range(200)]
    planted.plant_names(db, ["-dash.txt"])
    r = gfs.run("_names", "--", "-d")
    assert r.rc == 0 and r.text == "-dash.txt\n", r


def test_names_verb_gives_up_quickly_on_a_dead_backend(gfs, bindir, cwd):
    dead = f"mongodb://127.0.0.1:{free_port()}"
    # The driver's default wait is 10 s; the completion's must be far shorter.
    r = gfs.run("--uri", dead, "_names", "", timeout=8, db=False)
    assert r.rc == 3 and r.text == "" and "cannot reach the backend" in r.err, r
    if os.path.exists(BASH_COMPLETION):
        env = shell_env(gfs, bindir)
        assert bash_complete(["gridfsctl", "--uri", dead, "get", ""], env, cwd) == []


def test_complete_verb_describes_every_option(gridfsctl):
    for cmd in gridfsctl.run("_options").text.split():
        out = gridfsctl.run("_complete", cmd)
        assert out.rc == 0, out.err
        rows = [line.split("\t") for line in out.text.splitlines()]
        assert all(len(r) == 5 and all(r) for r in rows), (cmd, rows)
        words = {r[0]: r for r in rows}
        for o in gridfsctl.run("_options", cmd).text.split():
            row = words[o.rstrip("=")]
            assert row[4] != "-", f"{cmd} {o} has no line in --help"
            assert len(row[4]) <= 72, row
            assert (row[2] == "flag") == (not o.endswith("=")), row
        assert "@args" in words, cmd


def test_no_short_option_is_offered_for_two_options(gridfsctl):
    """ls takes -h for --human-readable: --help is then offered without it."""
    for cmd in gridfsctl.run("_options").text.split():
        out = gridfsctl.run("_complete", cmd).text
        shorts = [line.split("\t")[1] for line in out.splitlines() if line.split("\t")[1] != "-"]
        assert len(shorts) == len(set(shorts)), (cmd, shorts)
    ls = dict(line.split("\t")[:2] for line in gridfsctl.run("_complete", "ls").text.splitlines())
    assert ls["--human-readable"] == "-h" and ls["--help"] == "-"


@pytest.mark.parametrize("cmd,option", [("mirror", "read"), ("verify", "read")])
def test_enum_values_are_what_the_verb_accepts(gfs, gridfsctl, cmd, option, tmp_path):
    rows = gridfsctl.run("_complete", cmd).text.splitlines()
    values = next(r.split("\t")[3] for r in rows if r.startswith(f"--{option}\t")).split()
    assert len(values) >= 2
    helptext = gridfsctl.run(cmd, "--help").text
    for v in values:
        assert v in helptext
        args = [cmd, f"--{option}={v}"] + ([str(tmp_path / "out")] if cmd == "mirror" else [])
        r = gfs.run(*args)
        assert r.rc == 0, (v, r)
    bad = gfs.run(cmd, f"--{option}=bogus", *([str(tmp_path / "out")] if cmd == "mirror" else []))
    assert bad.rc == 2, bad


def fish_complete(lines, env, cwd):
    """Loads the fish completion once and runs `complete -C` on each line;
    returns, for each, {candidate: description}."""
    script = f"source {COMP}/gridfsctl.fish\n" + "".join(
        f"complete -C {shlex.quote(line)}; echo @@\n" for line in lines)
    out = subprocess.run(["fish", "--no-config", "-c", script], capture_output=True, text=True,
                         env=env, cwd=cwd, timeout=60)
    assert out.returncode == 0 and not out.stderr, out.stderr
    blocks = out.stdout.split("@@\n")[:-1]
    return [dict((row.split("\t") + [""])[:2] for row in b.splitlines()) for b in blocks]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish not installed (scripts/deps installs it)")
def test_fish(gfs, bindir, cwd, db):
    planted.plant_names(db, planted.SHELL_NAMES)
    rep, out, against, read, sup, sup2, imp, names = fish_complete([
        "gridfsctl verify --rep", "gridfsctl get --o", "gridfsctl verify --against ",
        "gridfsctl mirror --read ", "gridfsctl supervise ", "gridfsctl supervise -c x.ini ",
        "gridfsctl import -c ", f"gridfsctl --db {gfs.dbname} get five"], shell_env(gfs, bindir), cwd)
    assert list(rep) == ["--repair"] and "orphan chunks" in rep["--repair"]
    assert "--output" in out and out["--output"] == "write to F"
    assert set(against) == {"subdir/"}
    assert set(read) == {"auto", "batched", "each", "scan"}
    assert set(sup) == {"status", "restart", "reload", "stop"} == set(sup2)
    assert set(imp) == {"subdir/"}
    assert set(names) == set(planted.SHELL_NAMES)


def tmux_screen(session, env, want, what, deadline_s=20):
    """Polls the tmux pane until want(lines) holds; returns the lines."""
    lines = []

    def shown():
        out = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                             text=True, env=env).stdout
        lines[:] = [line.rstrip() for line in out.splitlines()]
        return want(lines) and lines

    return wait_for(shown, deadline_s, lambda: f"zsh to show {what}:\n" + "\n".join(lines), pace=0.05)


def prompt_line(lines):
    """The line being edited: the last one that starts with the prompt."""
    return next((line for line in reversed(lines) if line.startswith("READY> ")), "")


def below_prompt(lines):
    """The completion listing: the lines after the one being edited."""
    last = max((i for i, line in enumerate(lines) if line.startswith("READY> ")), default=len(lines))
    return lines[last + 1:]


@pytest.fixture
def zsh(gfs, bindir, cwd, tmp_path):
    """Returns type_tab(text): types text at an empty zsh prompt in tmux and presses TAB."""
    if shutil.which("zsh") is None or shutil.which("tmux") is None:
        pytest.skip("zsh or tmux not installed (scripts/deps installs them)")
    zdot = tmp_path / "zdot"
    zdot.mkdir()
    (zdot / ".zshrc").write_text(
        f"fpath=({COMP} $fpath)\nautoload -Uz compinit && compinit -u -D\n"
        "zstyle ':completion:*' list-prompt ''\nPROMPT='READY> '\n")
    env = dict(shell_env(gfs, bindir), ZDOTDIR=str(zdot), TMUX_TMPDIR=str(tmp_path), TERM="xterm")
    env.pop("TMUX", None)
    session = "gfs"
    subprocess.run(["tmux", "-f", "/dev/null", "new-session", "-d", "-s", session, "-x", "200",
                    "-y", "50", "-c", cwd, "zsh"], check=True, env=env)
    try:
        tmux_screen(session, env, lambda lines: "READY>" in "".join(lines), "a prompt")

        def type_tab(text):
            subprocess.run(["tmux", "send-keys", "-t", session, "C-u", text, "Tab"], check=True, env=env)
            return lambda want, what: tmux_screen(session, env, want, what)
        yield type_tab
    finally:
        subprocess.run(["tmux", "kill-server"], env=env, capture_output=True)


def test_zsh(zsh, gfs, db):
    planted.plant_names(db, ["five four.txt", "six.txt"])

    def completes_to(text, line):
        zsh(text)(lambda lines: prompt_line(lines) == "READY> " + line, repr(line))
    completes_to("gridfsctl verify --rep", "gridfsctl verify --repair")
    completes_to("gridfsctl get -o loc", "gridfsctl get -o local.log")
    completes_to(f"gridfsctl --db {gfs.dbname} get fi", f"gridfsctl --db {gfs.dbname} get five\\ four.txt")
    completes_to("gridfsctl supervise rel", "gridfsctl supervise reload")
    completes_to("gridfsctl verify --against ", "gridfsctl verify --against subdir/")
    zsh("gridfsctl mirror --read=")(
        lambda lines: set(" ".join(below_prompt(lines)).split()) == {"auto", "batched", "each", "scan"},
        "the --read values")


# ---- every verb's row: --help, usage, _options, man page, bash, zsh, fish, exit codes ----

def run_ok(*args):
    """The output of a run of the binary outside any test (collection, helpers)."""
    r = Binary().run(*args)
    assert r.rc == 0, r
    return r.text


def verbs():
    return run_ok("_options").split()


HELP_OPTION = re.compile(r"^  (?:-(\w), |    )--([\w-]+)(?: (\S+))?(?:  |$)")


def help_options(verb):
    """{long: (short or None, argument name or None)} from the options part of --help."""
    text = run_ok(verb, "--help")
    usage, rest = text.split("\n\n", 1)
    section = rest.split("options:\n", 1)[1].split("\n\n", 1)[0] if "options:\n" in rest else ""
    found = {}
    for line in section.splitlines():
        m = HELP_OPTION.match(line)
        if m:
            found[m.group(2)] = (m.group(1), m.group(3))
    return usage, found


def binary_options(verb):
    """{long: takes an argument} from _options, which the completions are built on."""
    out = run_ok("_options", verb)
    return {o[2:].rstrip("="): o.endswith("=") for o in out.split()}


@pytest.mark.parametrize("verb", verbs())
def test_verb_row_help_usage_options_and_man_page_agree(gridfsctl, verb):
    """One table of rows per verb: --help, the usage line, _options, _complete
    and the man page name the same options, and the man page the same exit
    statuses as --help."""
    usage, shown = help_options(verb)
    helptext = gridfsctl.run(verb, "--help").text
    offered = binary_options(verb)
    assert set(shown) == set(offered), verb
    rows = {r.split("\t")[0][2:]: r.split("\t") for r in run_ok("_complete", verb).splitlines()}
    with open(os.path.join(ROOT, "man", f"gridfsctl-{verb}.1.scd")) as f:
        man = f.read()
    for name, (short, arg) in shown.items():
        assert (arg is not None) == offered[name], (verb, name)
        assert rows[name][1] == (f"-{short}" if short else "-"), (verb, name, rows[name])
        if rows[name][2] == "enum":  # the words completed are the words --help explains
            assert all(re.search(rf"\b{v}\b", helptext) for v in rows[name][3].split()), rows[name]
        assert re.search(rf"[\[ |]{re.escape(f'-{short}' if short else f'--{name}')}\b", usage), \
            (verb, name, usage)
        assert f"*--{name}*" in man, f"man/gridfsctl-{verb}.1.scd does not describe --{name}"
        if short:
            assert f"*-{short}*" in man, f"man/gridfsctl-{verb}.1.scd does not give -{short}"
    codes = help_exit_codes(gridfsctl, verb)
    assert codes == man_exit_codes(verb), verb


@needs_bash_completion
def test_bash_offers_every_option_of_every_verb(bash):
    for verb in verbs():
        want = {f"--{o}" + ("=" if arg else "") for o, arg in binary_options(verb).items()}
        assert want <= set(bash(verb, "--")), verb


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish not installed (scripts/deps installs it)")
def test_fish_offers_every_option_of_every_verb(gfs, bindir, cwd):
    names = verbs()
    got = fish_complete([f"gridfsctl {v} --" for v in names], shell_env(gfs, bindir), cwd)
    for verb, offered in zip(names, got):
        want = {f"--{o}" for o in binary_options(verb)}
        assert want <= set(offered), (verb, want - set(offered))
        assert all(offered[o] for o in want), (verb, "an option without a description")


def test_zsh_offers_every_option_of_every_verb(zsh):
    for verb in verbs():
        want = {f"--{o}" for o in binary_options(verb)}

        def listed(lines):
            return want <= set(re.findall(r"--[\w-]+", " ".join(below_prompt(lines))))
        zsh(f"gridfsctl {verb} --")(listed, f"every option of {verb}")
