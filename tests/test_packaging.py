"""Every command ships with --help, a man page and completions; make install
lays them out with the contrib files, make uninstall takes them away, and the
systemd units and logrotate file in contrib/ are valid and do what they say."""
import os
import re
import shutil
import subprocess

import pytest

from conftest import ROOT, SAN_ENV, Binary, free_port
from test_serve import HTTP_PORTS, serve, wait_for  # noqa: F401 (serve is a fixture)

CONTRIB = os.path.join(ROOT, "contrib")
EXAMPLES = os.path.join(ROOT, "examples")
UNITS = sorted(f for f in os.listdir(os.path.join(CONTRIB, "systemd"))
               if f.endswith((".service", ".socket", ".timer")))


def commands():
    out = Binary().run("_options")
    assert out.rc == 0, out
    return out.text.split()


@pytest.mark.parametrize("cmd", commands())
def test_help_man_and_completions(gridfsctl, cmd):
    r = gridfsctl.run(cmd, "--help")
    assert r.rc == 0 and r.text.startswith(f"usage: gridfsctl {cmd}"), r
    assert "exit status" in r.text
    assert os.path.exists(os.path.join(ROOT, "man", f"gridfsctl-{cmd}.1.scd")), cmd
    # The completions offer what 'gridfsctl _complete' lists (driven in test_completions.py).
    listed = gridfsctl.run("_complete")
    assert listed.rc == 0, listed
    listed = listed.text
    assert f"{cmd}\t-\tcommand\t" in listed, cmd


def make(*args):
    r = subprocess.run(["make", "-s", "-C", ROOT, *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


@pytest.fixture
def installed(tmp_path):
    """make install into a DESTDIR with PREFIX=/usr; returns DESTDIR."""
    dest = tmp_path / "dest"
    make("install", f"DESTDIR={dest}", "PREFIX=/usr")
    return dest


def test_make_install_layout(installed):
    usr = installed / "usr"
    assert os.access(usr / "bin" / "gridfsctl", os.X_OK)
    assert (usr / "share" / "man" / "man1" / "gridfsctl.1").exists()
    for cmd in commands():
        assert (usr / "share" / "man" / "man1" / f"gridfsctl-{cmd}.1").exists(), cmd
    assert (usr / "share" / "bash-completion" / "completions" / "gridfsctl").exists()
    assert (usr / "share" / "zsh" / "site-functions" / "_gridfsctl").exists()
    assert (usr / "share" / "fish" / "vendor_completions.d" / "gridfsctl.fish").exists()
    doc = usr / "share" / "doc" / "gridfsctl"
    assert (doc / "cron.md").exists()
    assert (doc / "scale-out.md").exists()
    for sub in ("systemd", "logrotate"):
        for f in os.listdir(os.path.join(CONTRIB, sub)):
            assert (doc / "contrib" / sub / f).exists(), f
    for f in os.listdir(EXAMPLES):
        assert (doc / "examples" / f).exists(), f
        assert "/usr/local/bin/gridfsctl" not in (doc / "examples" / f).read_text(), f
    # The units name the binary where this install put it.
    for unit in UNITS:
        text = (doc / "contrib" / "systemd" / unit).read_text()
        for line in re.findall(r"^Exec\w+=(\S+)", text, re.M):
            assert line in ("/usr/bin/gridfsctl", "/bin/kill"), (unit, line)


def test_make_uninstall_removes_what_install_put(installed):
    make("uninstall", f"DESTDIR={installed}", "PREFIX=/usr")
    left = [os.path.join(d, f) for d, _, files in os.walk(installed) for f in files]
    assert left == []
    assert not (installed / "usr" / "share" / "doc" / "gridfsctl").exists()
    # A second uninstall, with nothing left to remove, is not an error.
    make("uninstall", f"DESTDIR={installed}", "PREFIX=/usr")


def unit_settings(unit):
    """{key: [values]} of a unit file (keys may repeat, as SystemCallFilter= does)."""
    out = {}
    with open(os.path.join(CONTRIB, "systemd", unit)) as f:
        for line in f:
            m = re.match(r"^(\w+)=(.*)$", line.strip())
            if m:
                out.setdefault(m.group(1), []).append(m.group(2))
    return out


@pytest.mark.parametrize("unit", [u for u in UNITS if u.endswith(".service")])
def test_services_are_hardened_and_keep_credentials_out_of_argv(unit):
    s = unit_settings(unit)
    assert s["EnvironmentFile"] == ["/etc/gridfsctl/gridfsctl.env"]
    assert not any(k.startswith("Environment") and "URI" in "".join(v) for k, v in s.items()
                   if k != "EnvironmentFile")
    assert "--uri" not in s["ExecStart"][0] and "mongodb://" not in s["ExecStart"][0]
    assert s["User"] == ["gridfsctl"]
    for key, want in (("ProtectSystem", "strict"), ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
                      ("NoNewPrivileges", "yes")):
        assert s.get(key) == [want], (unit, key)
    assert "AF_INET" in s["RestrictAddressFamilies"][0]
    assert int(s["LimitNOFILE"][0]) >= 16384
    if unit.replace(".service", ".timer") in UNITS:
        assert s["Type"] == ["oneshot"], unit


def test_env_file_holds_only_the_uri():
    with open(os.path.join(CONTRIB, "systemd", "gridfsctl.env")) as f:
        settings = [line for line in f if line.strip() and not line.startswith("#")]
    assert len(settings) == 1 and settings[0].startswith("GRIDFSCTL_URI=mongodb://")


def test_serve_socket_is_loopback():
    sock = unit_settings("gridfsctl-serve.socket")
    assert sock["ListenStream"] == ["127.0.0.1:8080"] and sock["Accept"] == ["no"]
    assert unit_settings("gridfsctl-serve.service")["Requires"] == ["gridfsctl-serve.socket"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(installed, tmp_path):
    # verify wants ExecStart's binary to exist and Documentation= man pages to be found:
    # point both at the DESTDIR install.
    units = tmp_path / "units"
    units.mkdir()
    src = installed / "usr" / "share" / "doc" / "gridfsctl" / "contrib" / "systemd"
    for unit in UNITS:
        text = (src / unit).read_text().replace("/usr/bin/gridfsctl", str(installed / "usr/bin/gridfsctl"))
        (units / unit).write_text(text)
    env = dict(os.environ, MANPATH=str(installed / "usr" / "share" / "man"))
    r = subprocess.run(["systemd-analyze", "verify", *[str(units / u) for u in UNITS]],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None,
                    reason="systemd-socket-activate not installed")
def test_serve_unit_command_under_socket_activation(gfs, bucket, tmp_path, serve):
    """The serve unit's ExecStart, given a socket the way systemd passes it."""
    argv = unit_settings("gridfsctl-serve.service")["ExecStart"][0].split()
    log = tmp_path / "access.log"
    argv = gfs.argv(*[log if a == "/var/log/gridfsctl/access.log" else a for a in argv[1:]], db=False)
    bucket.upload_from_stream("posters/a.txt", b"abc")
    port = free_port(HTTP_PORTS)
    # systemd-socket-activate passes on only the environment named with -E, as
    # a unit passes on only its EnvironmentFile=.
    keep = [a for k in ("GRIDFSCTL_URI", "GRIDFSCTL_CONFIG", *SAN_ENV) for a in ("-E", k)]
    s = serve(port=port, argv=["systemd-socket-activate", "-l", f"127.0.0.1:{port}", *keep, *argv,
                               "--db", gfs.dbname])
    status, _, body = s.get("/a.txt")
    assert (status, body) == (200, b"abc"), s.stderr()
    assert "inherited socket" in s.stderr()
    wait_for(lambda: log.exists() and "/a.txt" in log.read_text(), 10, "the access log line")


def logrotate_config(tmp_path, log, pid):
    """contrib/logrotate/gridfsctl for a test: the log under tmp_path, su to us, HUP to pid."""
    with open(os.path.join(CONTRIB, "logrotate", "gridfsctl")) as f:
        text = f.read()
    assert "/var/log/gridfsctl/access.log {" in text
    text = text.replace("/var/log/gridfsctl/access.log", str(log))
    text = re.sub(r"postrotate\n.*?endscript", f"postrotate\n\t\tkill -HUP {pid}\n\tendscript", text,
                  flags=re.S)
    conf = tmp_path / "logrotate.conf"
    conf.write_text(text)
    return conf


@pytest.mark.skipif(shutil.which("logrotate") is None, reason="logrotate not installed")
def test_logrotate_config_parses_before_the_user_exists():
    """Where systemd-sysusers has not made the gridfsctl user yet (here it has not), logrotate
    must still take the file: one that names an unknown user is skipped whole."""
    r = subprocess.run(["logrotate", "-d", "-s", os.devnull, os.path.join(CONTRIB, "logrotate", "gridfsctl")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error:")] == [], r.stderr
    assert "rotating pattern: /var/log/gridfsctl/access.log" in r.stderr, r.stderr


def example_settings(name):
    """[(section, key, value)] of an example supervisor configuration (continuation lines joined)."""
    out, section = [], None
    with open(os.path.join(EXAMPLES, name)) as f:
        for line in f:
            if line.startswith(";") or not line.strip():
                continue
            if line.startswith("["):
                section = line.strip()[1:-1]
            elif line[0] in " \t":
                out[-1] = (out[-1][0], out[-1][1], out[-1][2] + " " + line.strip())
            else:
                key, _, value = line.partition("=")
                out.append((section, key.strip(), value.strip()))
    return out


def test_one_supervise_unit_and_the_examples_run_under_it():
    """contrib/systemd/gridfsctl-supervise.service is the one supervise unit: it runs as the
    gridfsctl user with no capabilities, so no example switches users, and each writes only
    where the unit lets it (its Runtime-, Logs- and StateDirectory, its private /tmp)."""
    assert not [f for f in os.listdir(EXAMPLES) if f.endswith((".service", ".socket", ".timer"))]
    unit = unit_settings("gridfsctl-supervise.service")
    assert unit["User"] == ["gridfsctl"] and unit["CapabilityBoundingSet"] == [""]
    writable = ["/run/" + unit["RuntimeDirectory"][0] + "/", "/var/log/" + unit["LogsDirectory"][0] + "/",
                "/var/lib/" + unit["StateDirectory"][0] + "/"]
    if unit.get("PrivateTmp") == ["yes"]:
        writable.append("/tmp/")
    examples = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".ini"))
    assert examples
    for name in examples:
        settings = example_settings(name)
        assert not [s for s in settings if s[1] in ("user", "group")], name
        for section, key, value in settings:
            if key in ("control", "logdir", "log", "directory"):
                assert any((value + "/").startswith(w) for w in writable), (name, key, value)
    text = open(os.path.join(EXAMPLES, "supervise-mongod.ini")).read()
    assert "contrib/systemd" in text and "gridfsctl-supervise.service" in text


def crontab_lines(block):
    return [ln for ln in block.splitlines() if ln.strip() and not ln.startswith(("#", "MAILTO", "SHELL",
                                                                                     "PATH"))]


def test_cron_doc_crontabs_agree():
    """docs/cron.md's plain crontab and the one through the alerting wrapper run the same jobs
    with the same options (--max-delete and --backup-dir in both)."""
    with open(os.path.join(ROOT, "docs", "cron.md")) as f:
        blocks = re.findall(r"^```\w*\n(.*?)^```$", f.read(), re.M | re.S)
    plain = [b for b in blocks if "gridfsctl import" in b and "gridfsctl-job" not in b]
    wrapped = [b for b in blocks if "gridfsctl-job import" in b]
    assert len(plain) == 1 and len(wrapped) == 1
    unwrapped = [re.sub(r"gridfsctl-job \w+ ", "", ln) for ln in crontab_lines(wrapped[0])]
    assert crontab_lines(plain[0]) == unwrapped
    assert any("--max-delete" in ln and "--backup-dir" in ln for ln in unwrapped)


@pytest.mark.skipif(shutil.which("logrotate") is None, reason="logrotate not installed")
def test_logrotate_rotates_serve_access_log(bucket, tmp_path, serve):
    """Rotation with the shipped directives: serve keeps logging, old lines stay in .1."""
    bucket.upload_from_stream("a.txt", b"abc")
    logdir = tmp_path / "log"
    logdir.mkdir(mode=0o700)
    log = logdir / "access.log"
    s = serve("--access-log", str(log))
    s.get("/a.txt?before")
    wait_for(lambda: log.exists() and "before" in log.read_text(), 10, "the first line")
    conf = logrotate_config(tmp_path, log, s.proc.pid)
    r = subprocess.run(["logrotate", "-f", "-s", str(tmp_path / "state"), str(conf)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rotated = logdir / "access.log.1"  # delaycompress: the newest stays plain
    assert "before" in rotated.read_text()
    wait_for(lambda: log.exists(), 10, "serve to reopen its log")
    s.get("/a.txt?after")
    wait_for(lambda: "after" in log.read_text(), 10, "a line in the new log")
    assert "after" not in rotated.read_text()


@pytest.mark.parametrize("unit", ["gridfsctl-serve.service", "gridfsctl-watch.service",
                                  "gridfsctl-supervise.service"])
def test_daemons_are_type_notify(unit):
    """serve, watch and supervise send READY=1 and WATCHDOG=1 (tests/test_notify.py), so systemd
    can wait for them and restart one that hangs."""
    s = unit_settings(unit)
    assert s["Type"] == ["notify"], unit
    assert "WatchdogSec" in s, unit
