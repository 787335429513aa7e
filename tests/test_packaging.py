"""Every command ships with --help, a man page and completions; make install
lays them out with the contrib files, make uninstall takes them away, and the
systemd units and logrotate file in contrib/ are valid and do what they say."""
import getpass
import grp
import os
import re
import shutil
import subprocess

import pytest

from conftest import ROOT, SAN_ENV, Binary, free_port
from test_serve import HTTP_PORTS, serve, wait_for  # noqa: F401 (serve is a fixture)

CONTRIB = os.path.join(ROOT, "contrib")
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
    for sub in ("systemd", "logrotate"):
        for f in os.listdir(os.path.join(CONTRIB, sub)):
            assert (doc / "contrib" / sub / f).exists(), f
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
    assert "/var/log/gridfsctl/access.log {" in text and "su gridfsctl gridfsctl" in text
    text = text.replace("/var/log/gridfsctl/access.log", str(log))
    text = text.replace("su gridfsctl gridfsctl", f"su {getpass.getuser()} {grp.getgrgid(os.getgid()).gr_name}")
    text = re.sub(r"postrotate\n.*?endscript", f"postrotate\n\t\tkill -HUP {pid}\n\tendscript", text,
                  flags=re.S)
    conf = tmp_path / "logrotate.conf"
    conf.write_text(text)
    return conf


@pytest.mark.skipif(shutil.which("logrotate") is None, reason="logrotate not installed")
def test_logrotate_config_parses():
    r = subprocess.run(["logrotate", "-d", "-s", os.devnull, os.path.join(CONTRIB, "logrotate", "gridfsctl")],
                       capture_output=True, text=True, timeout=60)
    # The gridfsctl user exists only where the sysusers file was installed.
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:") and
              "unknown user 'gridfsctl'" not in ln and "found error in" not in ln]
    assert errors == [], r.stderr


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
