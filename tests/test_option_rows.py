"""Option rows that carry their destination and range (cmd/cmd.h, struct
cmd_opt's kind; read in cmd/optvalue.c): a value out of range or malformed
is one line naming it and exit 2, the same line each verb gave before its
rows said it themselves; a bound itself is taken; and every option of every
verb is either taken or refused with a message, never silently.

No backend: each run ends at an unknown option after the one under test,
so a value that is taken shows as that error instead of its own."""
import pytest

UNKNOWN = "--zzzz"

# (verb, option, value, the message; None: the value is taken)
CASES = [
    ("serve", "--threads", "x", "invalid number 'x'"),
    ("serve", "--threads", "0", "invalid number '0'"),
    ("serve", "--threads", "1000001", "invalid number '1000001'"),
    ("serve", "--threads", "1000000", None),
    ("serve", "--max-per-ip", "x", "--max-per-ip: invalid number 'x'"),
    ("serve", "--max-per-ip", "0", None),
    ("serve", "--cache-size", "lots", "invalid size 'lots'"),
    ("serve", "--cache-size", "1G", None),
    ("serve", "--max-header-size", "4095", "invalid size '4095'"),
    ("serve", "--max-header-size", "4096", None),
    ("serve", "--max-header-size", "1M", None),
    ("serve", "--max-header-size", "1048577", "invalid size '1048577'"),
    ("serve", "--poll", "99ms", "invalid number of seconds '99ms' (at most 2147483)"),
    ("serve", "--poll", "0.05", "invalid number of seconds '0.05' (at most 2147483)"),
    ("serve", "--poll", "100ms", None),
    ("serve", "--poll", "-1", "invalid number of seconds '-1' (at most 2147483)"),
    ("serve", "--drain-timeout", "0", None),
    ("serve", "--drain-timeout", "2147483", None),
    ("serve", "--drain-timeout", "2147484", "invalid number of seconds '2147484' (at most 2147483)"),
    ("serve", "--cache-dir", "", "--cache-dir: empty directory name"),
    ("serve", "--cache-dir-size", "1048575", "--cache-dir-size: invalid size '1048575' (at least 1M)"),
    ("serve", "--cache-dir-size", "1M", None),
    ("import", "--jobs", "0", "--jobs takes a number from 1 to 64, not '0'"),
    ("import", "-j", "65", "--jobs takes a number from 1 to 64, not '65'"),
    ("import", "--jobs", "64", None),
    ("import", "--batch-size", "65535", "--batch-size takes a size from 64K to 256M, not '65535'"),
    ("import", "--batch-size", "64K", None),
    ("import", "--batch-size", "256M", None),
    ("import", "--batch-size", "268435457", "--batch-size takes a size from 64K to 256M, not '268435457'"),
    ("put", "--chunk-size", "0", "--chunk-size takes a size from 1 byte to 15M, not '0'"),
    ("put", "--chunk-size", "16M", "--chunk-size takes a size from 1 byte to 15M, not '16M'"),
    ("put", "--chunk-size", "15M", None),
    ("put", "-k", "-1", "--keep-revisions takes a count, not '-1'"),
    ("watch", "--unwatched", "Fail", "--unwatched takes rescan or fail, not 'Fail'"),
    ("watch", "--unwatched", "", "--unwatched takes rescan or fail, not ''"),
    ("watch", "--unwatched", "fail", None),
    ("watch", "--unwatched", "rescan", None),
    ("watch", "--settle", "600001", "--settle takes milliseconds, not '600001'"),
    ("verify", "--threads", "17", "--threads wants a number from 1 to 16, not '17'"),
    ("verify", "--threads", "16", None),
    ("doctor", "--sample", "100001", "--sample takes a number of chunks from 0 to 100000, not '100001'"),
    ("doctor", "--sample", "0", None),
]


@pytest.mark.parametrize("verb,option,value,message", CASES)
def test_a_row_refuses_what_is_out_of_range_in_one_line(gridfsctl, verb, option, value, message):
    r = gridfsctl.run(verb, option, value, UNKNOWN, db=False)
    want = message if message is not None else f"unknown option '{UNKNOWN}'"
    assert r.rc == 2, r
    assert r.err == f"gridfsctl {verb}: {want}\nsee 'gridfsctl {verb} --help'\n", r.err
    assert r.text == "", r


@pytest.mark.parametrize("verb", sorted({c[0] for c in CASES}))
def test_rows_with_a_destination_are_listed_and_completed(gridfsctl, verb):
    helptext = gridfsctl.run(verb, "--help", db=False).text
    offered = gridfsctl.run("_options", verb, db=False).text.split()
    described = [line.split("\t")[0] for line in
                 gridfsctl.run("_complete", verb, db=False).text.splitlines()]
    for option in {c[1] for c in CASES if c[0] == verb and c[1].startswith("--")}:
        assert f"  {option} " in helptext or f", {option} " in helptext, (verb, option)
        assert f"{option}=" in offered and option in described, (verb, option)


def test_every_option_is_taken_or_refused_with_a_message(gridfsctl):
    """A row with neither a destination nor a case in its verb's on_opt
    would be refused with no word, and a row whose field is not of its kind
    ends in an internal error: every option of every verb, with a value that
    is malformed for a number, is one of the two lines above."""
    for verb in gridfsctl.run("_options", db=False).text.split():
        for o in gridfsctl.run("_options", verb, db=False).text.split():
            arg = ["x"] if o.endswith("=") else []
            r = gridfsctl.run(verb, o.rstrip("="), *arg, UNKNOWN, db=False)
            lines = r.err.splitlines()
            assert r.rc == 2 and 1 <= len(lines) <= 2, (verb, o, r)
            assert lines[0].startswith(f"gridfsctl {verb}: ") and "internal error" not in r.err, \
                (verb, o, r)
