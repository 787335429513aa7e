"""One meaning per word (issue 30): an option letter or name means one thing in
every verb, and the old spellings keep working one release with a warning."""
import pytest

import planted
from conftest import Binary


def completion_rows(verb):
    r = Binary().run("_complete", verb)
    assert r.rc == 0, r
    return [line.split("\t") for line in r.text.splitlines() if line.startswith("--")]


# A letter another tool's habit gives a verb of its own: ls -h as ls(1), supervise -c
# as supervisord -c. Every other letter is one option wherever it is taken.
OWN_HABIT = {("ls", "-h"), ("supervise", "-c")}


def test_one_letter_one_option_across_verbs(gridfsctl):
    seen = {}
    for verb in gridfsctl.run("_options").text.split():
        for row in completion_rows(verb):
            if row[1] != "-" and (verb, row[1]) not in OWN_HABIT:
                seen.setdefault(row[1], {})[verb] = row[0]
    mixed = {letter: by_verb for letter, by_verb in seen.items() if len(set(by_verb.values())) > 1}
    assert not mixed, mixed
    assert set(seen["-n"].values()) == {"--dry-run"}


@pytest.mark.parametrize("verb,old,new", [("put", "-n", "--name"), ("get", "-r", "--rev"),
                                          ("stat", "-r", "--rev"), ("verify", "--strategy", "--read")])
def test_deprecated_spelling_listed_in_help_not_offered(gridfsctl, verb, old, new):
    helptext = gridfsctl.run(verb, "--help").text
    assert f"deprecated (they warn, and go in the next release): {old} for {new}" in helptext
    assert not [r for r in completion_rows(verb) if r[0] == old or r[1] == old]
    assert old not in gridfsctl.run("_options", verb).text.split()


def test_deprecated_spellings_still_work_with_one_warning(gfs, bucket, tmp_path):
    f = tmp_path / "f.txt"
    f.write_bytes(b"hello")
    r = gfs.run("put", f, "-n", "kept/name.txt")
    assert r.rc == 0, r
    assert r.err == ("gridfsctl put: warning: '-n' is deprecated and goes in the next release; "
                     "use '--name'\n"), r
    assert bucket.open_download_stream_by_name("kept/name.txt").read() == b"hello"
    r = gfs.run("get", "kept/name.txt", "-r", "0", "-o", "-")
    assert r.rc == 0 and r.out == b"hello", r
    assert r.err.count("\n") == 1 and "'-r' is deprecated" in r.err and "'--rev'" in r.err, r
    r = gfs.run("get", "kept/name.txt", "--rev", "0", "-o", "-")
    assert r.rc == 0 and r.out == b"hello" and r.err == "", r
    r = gfs.run("verify", "--strategy", "scan")
    assert r.rc == 0 and r.err.count("\n") == 1 and "'--strategy' is deprecated" in r.err, r
    assert gfs.run("verify", "--read", "each").rc == 0


def test_every_human_line_of_a_dry_run_says_so(gfs, bucket, db, tmp_path):
    """rsync's mark, the same in every verb: mirror -n is not mirror -v."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.txt").write_bytes(b"a")
    r = gfs.run("import", tree, "-n")
    assert r.rc == 0 and r.text == "would upload a.txt (DRY RUN)\n", r
    bucket.upload_from_stream("m/x.txt", b"x")
    out = tmp_path / "out"
    dry = gfs.run("mirror", out, "--prefix", "m", "-n")
    assert dry.rc == 0 and dry.text == "write x.txt (DRY RUN)\n", dry
    real = gfs.run("mirror", out, "--prefix", "m", "-v")
    assert real.rc == 0 and real.text == "write x.txt\n", real
    r = gfs.run("rm", "m/x.txt", "-n")
    assert r.rc == 0 and r.text.endswith(" (DRY RUN)\n") and r.text.startswith("would remove m/x.txt"), r
    planted.plant_dead_upload(db, "dead.bin")
    r = gfs.run("verify", "--repair", "-n", "--grace", "0")
    lines = [line for line in r.text.splitlines() if line.startswith("WOULD")]
    assert lines and all(line.endswith(" (DRY RUN)") for line in lines), r


def test_progress_forced_and_stats_lines(gfs, bucket, tmp_path):
    """--progress draws under a pipe (| tee); --stats logs plain lines; both are global."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(20):
        (tree / f"{i}.txt").write_bytes(b"x" * 1000)
    r = gfs.run("import", tree, env={"TERM": "dumb"})
    assert r.rc == 0 and r.err == "", r  # stderr a pipe: no bar
    r = gfs.run("import", tree, "--progress", "-c", env={"TERM": "dumb"})
    assert r.rc == 0 and r.err.startswith("\rimport ") and "20/20 files" in r.err, r
    r = gfs.run("--stats", "0.1s", "verify")
    assert r.rc == 0, r
    lines = r.err.splitlines()
    assert lines and all(line.startswith("gridfsctl: verify ") and " files, " in line for line in lines), r
    assert "\r" not in r.err and "20/20 files" in lines[-1], r
    r = gfs.run("verify", "--stats", "1m", "-q")
    assert r.rc == 0 and r.err == "", r  # -q: errors only
    for bad in (["--stats", "soon"], ["--stats", "1s", "--no-progress"]):
        r = gfs.run("verify", *bad)
        assert r.rc == 2 and "--stats" in r.err.splitlines()[0], r
