"""The JSON vocabulary of gridfsctl(1) (section JSON OUTPUT), as a small checker.

Every --json line is one of three kinds:
  a file line (ls, stat, put): the files document, its name in "filename";
  an event line: "time" (ISO 8601 UTC, milliseconds) and "event", a stored name in
    "filename", a local one in "path", "dryRun": true when nothing was done;
  a summary line, the last one of import, mirror, verify and watch (doctor's only one):
    {"time": ..., "summary": {"verb", counts..., "seconds", "dryRun"?, "error"?}}.
No line says "name" for a stored file, no duration has more than 3 decimals.

Meanings, not only fields: one action has one word in every verb. An event names
the action (ACTIONS' keys), a count of it is the participle (ACTIONS' values); the
words of earlier releases (RETIRED) are not used for anything. A duration is in
seconds (a key "seconds" or ending in "Seconds"), a local file is "path" (relative
to the command's DIR), never "detail".
"""
import json
import re

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
FILE_KEYS = {"id", "filename", "length", "chunkSize", "chunks", "uploadDate", "contentType"}
SUMMARY_VERBS = {"import", "mirror", "verify", "watch", "doctor"}
# The table of gridfsctl(1), JSON OUTPUT: action (event) -> its count (summary, rm's event)
ACTIONS = {"upload": "uploaded", "replace": "replaced", "delete": "deleted", "write": "written",
           "move": "moved", "delete-folder": "deleted", "move-folder": "moved"}
# Words earlier releases used for those actions and counts, by what they meant.
RETIRED = {"uploaded": "upload", "replaced": "replace", "removed": "delete",
           "removed-folder": "delete-folder", "moved-folder": "move-folder"}
RETIRED_COUNTS = {"removed": "deleted", "uptimeMs": "uptimeSeconds", "strategy": "read"}
# Problems about a file on disk: the file is "path".
DISK_KINDS = {"MISSING-IN-GRIDFS", "DIFFERS"}


def _no_noise(value, where):
    """Durations in milliseconds; no date as {"$date": ...}."""
    if isinstance(value, dict):
        assert "$date" not in value, where
        for k, v in value.items():
            if k == "seconds":
                assert isinstance(v, (int, float)) and v == round(v, 3), (where, value)
            _no_noise(v, where)
    elif isinstance(value, list):
        for v in value:
            _no_noise(v, where)


def _one_word(obj, where):
    """No count or duration under a word another verb means otherwise."""
    for k, v in obj.items():
        assert k not in RETIRED_COUNTS, f"{where}: {k!r} is {RETIRED_COUNTS[k]!r} now: {obj}"
        assert not k.endswith("Ms"), f"{where}: a duration in milliseconds: {k}"
        if k.endswith("Seconds"):
            assert isinstance(v, (int, float)) and v == round(v, 3), (where, obj)


def check_line(obj, verb):
    """Asserts one parsed line follows the vocabulary; returns its kind."""
    assert isinstance(obj, dict), obj
    assert "name" not in obj or verb == "supervise", f"{verb}: 'name' where 'filename' belongs: {obj}"
    _no_noise(obj, verb)
    _one_word(obj, verb)
    if "dryRun" in obj:
        assert obj["dryRun"] is True, obj
    if "error" in obj:
        assert isinstance(obj["error"], str) and obj["error"], obj
    if "summary" in obj:
        assert set(obj) == {"time", "summary"}, obj
        assert TIME.match(obj["time"]), obj
        s = obj["summary"]
        assert s["verb"] == verb and verb in SUMMARY_VERBS, obj
        assert isinstance(s["seconds"], (int, float)) and s["seconds"] == round(s["seconds"], 3), obj
        assert "name" not in s, obj
        _one_word(s, verb)
        assert isinstance(s.get("interrupted"), bool), f"{verb}: no interrupted in {obj}"
        if "dryRun" in s:
            assert s["dryRun"] is True, obj
        if "error" in s:
            assert isinstance(s["error"], str) and s["error"], obj
        for k, v in s.items():
            # durations are the only fractions: counts are whole numbers
            assert k == "seconds" or not isinstance(v, float), (k, obj)
        return "summary"
    if "event" in obj:
        assert TIME.match(obj["time"]), obj
        assert isinstance(obj["event"], str) and obj["event"], obj
        assert obj["event"] not in RETIRED, \
            f"{verb}: event {obj['event']!r} is {RETIRED[obj['event']]!r} in every verb: {obj}"
        if obj.get("kind") in DISK_KINDS:
            assert isinstance(obj.get("path"), str), f"{verb}: a disk file without path: {obj}"
        if "filename" in obj:
            assert obj["filename"] is None or isinstance(obj["filename"], str), obj
        return "event"
    assert verb in ("ls", "stat", "put", "supervise"), f"{verb}: neither event nor summary: {obj}"
    if verb != "supervise":
        assert "filename" in obj, obj
        if "id" in obj:  # a stored file (put that failed has only filename, source, error)
            assert FILE_KEYS <= set(obj), obj
            assert TIME.match(obj["uploadDate"]), obj
    return "file"


def parse(text, verb):
    """Every line of text checked; the parsed objects."""
    # "\n" alone ends a line: str.splitlines() would also split at U+0085 or U+2028 in a name
    objs = [json.loads(l) for l in text.split("\n") if l.strip()]
    for o in objs:
        check_line(o, verb)
    return objs


def summary(text, verb):
    """The checked summary object of a run's output (its last line)."""
    objs = parse(text, verb)
    assert objs and "summary" in objs[-1], text
    assert all("summary" not in o for o in objs[:-1]), text
    return objs[-1]["summary"]


def events(text, verb):
    return [o for o in parse(text, verb) if "event" in o]
