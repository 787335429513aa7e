"""Checks on the state a run leaves behind, read with pymongo and os only."""
import hashlib
import os
import re

# get's temporary (.NAME.gridfsctl-XXXXXX, cmd/get.c) and mirror's (.gridfsctl-mirror-*).
TEMP_NAME = re.compile(r"^\..*\.gridfsctl-[A-Za-z0-9]{6}$|^\.gridfsctl-mirror-")


def tree_files(root):
    """relative path -> bytes of every regular file under root."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


def temp_files(root):
    return [os.path.join(d, n) for d, _, names in os.walk(root) for n in names if TEMP_NAME.match(n)]


def orphan_chunks(db, bucket="fs"):
    ids = {d["_id"] for d in db[bucket + ".files"].find({}, {"_id": 1})}
    return [c["files_id"] for c in db[bucket + ".chunks"].find({}, {"files_id": 1})
            if c["files_id"] not in ids]


def duplicated_names(db, bucket="fs"):
    seen, dup = set(), set()
    for d in db[bucket + ".files"].find({}, {"filename": 1}):
        (dup if d["filename"] in seen else seen).add(d["filename"])
    return sorted(dup)


def incomplete_files(db, bucket="fs"):
    """Names of files documents whose chunks do not add up to their length and sha256:
    what a reader must never be shown."""
    chunks = {}
    for c in db[bucket + ".chunks"].find({}, batch_size=100):
        chunks.setdefault(c["files_id"], {})[c["n"]] = bytes(c["data"])
    bad = []
    for d in db[bucket + ".files"].find():
        have = chunks.get(d["_id"], {})
        count = (d["length"] + d["chunkSize"] - 1) // d["chunkSize"]
        body = b"".join(have.get(n, b"") for n in range(count))
        want = (d.get("metadata") or {}).get("sha256")
        if len(body) != d["length"] or (want and hashlib.sha256(body).hexdigest() != want):
            bad.append(d["filename"])
    return bad


def stored(db, bucket="fs"):
    """name -> body of the newest revision, read chunk by chunk."""
    newest = {}
    for d in db[bucket + ".files"].find().sort([("uploadDate", 1), ("_id", 1)]):
        newest[d["filename"]] = d
    out = {}
    for name, d in newest.items():
        cs = db[bucket + ".chunks"].find({"files_id": d["_id"]}).sort("n", 1)
        out[name] = b"".join(bytes(c["data"]) for c in cs)
    return out
