"""One meaning per word (issue 30): an option letter or name means one thing in
every verb, and the old spellings keep working one release with a warning."""
import pytest

import jsonvocab
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
    assert r.rc == 0 and r.text.endswith(" (DRY RUN)\n") and r.text.startswith("would delete m/x.txt"), r
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


def test_filters_on_mirror_verify_and_import(gfs, bucket, db, tmp_path):
    """rsync's and rclone's filters, one set of rows: on stored names below --prefix for
    mirror and verify, on the tree for import."""
    for name in ("p/a.jpg", "p/b.txt", "p/old/c.jpg", "p/keep/d.jpg"):
        bucket.upload_from_stream(name, name.encode())
    excl = tmp_path / "excl"
    excl.write_text("# old stuff\n\nold\n")
    listed = tmp_path / "listed"
    listed.write_text("./a.jpg\nkeep/d.jpg\n")
    out = tmp_path / "out"
    r = gfs.run("mirror", out, "--prefix", "p", "--include", "*.jpg", "--exclude-from", excl)
    assert r.rc == 0, r
    got = sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file())
    assert got == ["a.jpg", "keep/d.jpg"], got
    out2 = tmp_path / "out2"
    r = gfs.run("mirror", out2, "--prefix", "p", "--files-from", listed, "-x", "keep")
    assert r.rc == 0 and sorted(str(f.relative_to(out2)) for f in out2.rglob("*") if f.is_file()) == \
        ["a.jpg"], r
    (out2 / "mine.txt").write_bytes(b"local")
    r = gfs.run("mirror", out2, "--prefix", "p", "-x", "*.txt", "--delete")
    assert r.rc == 0 and (out2 / "mine.txt").read_bytes() == b"local", r  # left out, so kept
    # verify: a damaged file the filters leave out is not checked
    bad = db["fs.files"].find_one({"filename": "p/b.txt"})["_id"]
    db["fs.chunks"].delete_many({"files_id": bad})
    assert gfs.run("verify", "--prefix", "p").rc == 1
    s = jsonvocab.summary(gfs.run("verify", "--prefix", "p", "-x", "*.txt", "--json").text, "verify")
    assert (s["files"], s["problems"], s["orphansChecked"]) == (3, 0, False), s
    r = gfs.run("verify", "--files-from", listed, "--prefix", "p", "--against", out, "--json")
    s = jsonvocab.summary(r.text, "verify")
    assert r.rc == 0 and (s["files"], s["same"], s["problems"]) == (2, 2, 0), r
    # import: the same rows on the tree
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    for rel in ("a.jpg", "b.txt", "sub/c.jpg"):
        (tree / rel).write_bytes(rel.encode())
    (tmp_path / "only").write_text("sub/c.jpg\nb.txt\n")
    r = gfs.run("import", tree, "--prefix", "imp", "--files-from", tmp_path / "only", "-x", "*.txt")
    assert r.rc == 0, r
    assert sorted(d["filename"] for d in db["fs.files"].find({"filename": {"$regex": "^imp/"}})) == \
        ["imp/sub/c.jpg"]
    r = gfs.run("import", tree, "--exclude-from", tmp_path / "nonesuch")
    assert r.rc == 2 and "nonesuch" in r.err, r


def test_mirror_size_only_and_ignore_existing(gfs, bucket, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    bucket.upload_from_stream("same-size.txt", b"stored")
    bucket.upload_from_stream("other.txt", b"stored too")
    bucket.upload_from_stream("new.txt", b"new")
    (out / "same-size.txt").write_bytes(b"local!")   # 6 bytes, as stored, different content
    (out / "other.txt").write_bytes(b"local")        # another size
    r = gfs.run("mirror", out, "--size-only")
    assert r.rc == 0, r
    assert (out / "same-size.txt").read_bytes() == b"local!" and (out / "other.txt").read_bytes() == b"stored too"
    (out / "other.txt").write_bytes(b"changed locally, kept")
    (out / "new.txt").unlink()
    r = gfs.run("mirror", out, "--ignore-existing", "--json")
    s = jsonvocab.summary(r.text, "mirror")
    assert r.rc == 0 and (s["written"], s["skipped"]) == (1, 2), s
    assert (out / "other.txt").read_bytes() == b"changed locally, kept" and (out / "new.txt").read_bytes() == b"new"
    assert gfs.run("mirror", out, "--size-only", "-c").rc == 2


def test_ls_prefix_is_a_folder_or_the_name(gfs, bucket):
    for name in ("posters/a.jpg", "posters/b/c.jpg", "posters-old/a.jpg", "posters", "postersX"):
        bucket.upload_from_stream(name, b"x")
    for operand in ("posters", "posters/"):
        r = gfs.run("ls", operand)
        assert r.rc == 0 and r.text.split() == ["posters", "posters/a.jpg", "posters/b/c.jpg"], r
    r = gfs.run("ls", "posters/a.jpg")
    assert r.rc == 0 and r.text.split() == ["posters/a.jpg"], r
    r = gfs.run("ls", "posters*")
    assert r.rc == 0 and r.text.split() == ["posters", "postersX"], r


def test_get_json_says_what_was_written(gfs, bucket, tmp_path):
    bucket.upload_from_stream("d/a.txt", b"hello")
    out = tmp_path / "a.txt"
    r = gfs.run("get", "d/a.txt", "-o", out, "--json")
    [ev] = jsonvocab.events(r.text, "get")
    assert r.rc == 0 and (ev["event"], ev["filename"], ev["path"], ev["bytes"]) == (
        "write", "d/a.txt", str(out), 5), r
    r = gfs.run("get", "d/a.txt", "nonesuch", "-o", tmp_path / "dir", "--json")
    evs = jsonvocab.events(r.text, "get")
    assert r.rc != 0 and [(e["filename"], "error" in e) for e in evs] == [("d/a.txt", False),
                                                                       ("nonesuch", True)], r
    assert evs[0]["path"] == "d/a.txt" and (tmp_path / "dir" / "d" / "a.txt").read_bytes() == b"hello"
    assert gfs.run("get", "d/a.txt", "-o", "-", "--json").rc == 2
