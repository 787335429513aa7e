"""Planted data: what a hostile client or an old tool could leave in a bucket.

Written with pymongo only, so gridfsctl never vouches for its own fixtures.
Every suite that needs mixed numeric ids, hostile names or bogus documents
takes them from here; add new kinds here rather than in a test file.
"""
import datetime
import hashlib

import bson
from bson.int64 import Int64

CHUNK = 1000  # small chunks, so that files have several


def data(n, seed=0):
    return bytes((i * 7 + seed) % 251 for i in range(n))


def file_doc(fid, name, body, chunk=CHUNK, sha=True, **extra):
    """A files document for body as the spec lays it out."""
    doc = {"_id": fid, "filename": name, "length": len(body), "chunkSize": chunk,
           "uploadDate": datetime.datetime.now(datetime.timezone.utc)}
    if sha:
        doc["metadata"] = {"sha256": hashlib.sha256(body).hexdigest()}
    doc.update(extra)
    return doc


def plant(db, fid, name, body, chunk=CHUNK, chunk_id=None, bucket="fs", **extra):
    """Inserts a files document with _id fid and chunks whose files_id is
    chunk_id (default: fid itself). Returns fid."""
    cid = fid if chunk_id is None else chunk_id
    chunks = [{"files_id": cid, "n": i, "data": bson.Binary(body[o:o + chunk])}
              for i, o in enumerate(range(0, len(body), chunk))]
    if chunks:
        db[bucket + ".chunks"].insert_many(chunks)
    db[bucket + ".files"].insert_one(file_doc(fid, name, body, chunk, **extra))
    return fid


# Ids of different BSON types that the server compares equal by value: the
# files _id first, the chunks' files_id second.
MIXED_NUMERIC_IDS = [
    (Int64(77), 77),      # Int64 files, Int32 chunks
    (78.0, 78),           # Double files, Int32 chunks
    (79, Int64(79)),      # Int32 files, Int64 chunks
]


def plant_mixed_numeric(db, bucket="fs"):
    """One readable file per pair of MIXED_NUMERIC_IDS; returns {name: body}."""
    out = {}
    for i, (fid, cid) in enumerate(MIXED_NUMERIC_IDS):
        name, body = f"mixed{i}.bin", data(2500, i)
        plant(db, fid, name, body, chunk_id=cid, bucket=bucket)
        out[name] = body
    return out


# Names a hostile writer can store: terminal escapes, forged lines, path
# escapes, empty components, bytes that are not UTF-8 in the raw name.
HOSTILE_NAMES = [
    "dmg\x1b[31m\nFAKE",
    "title\x1b]0;owned\x07.txt",
    "cr\rreturn.txt",
    "tab\tname.txt",
    "../escape.txt",
    "/abs/path.txt",
    "a//b.txt",
    "dot/./seg.txt",
]
FORGING_NAME = HOSTILE_NAMES[0]


# Requests a hostile HTTP client can send to put a supervisor's restart_on
# phrases (its defaults) into a server's access log: (path, User-Agent).
RESTART_BAIT_REQUESTS = [
    ("/please-restart-EMFILE", "curl/8.5.0"),
    ("/ok.txt", "Too many open files"),
    ("/errno=24", "Out of file descriptors; can not open file"),
]

# Refused by get (not a safe local path) and, printed raw, would set the
# terminal's title from the refusal message.
UNSAFE_TITLE_NAME = "../title\x1b]0;owned\x07"

# Longer than any local path mirror writes (4,000 bytes): its refusal
# message must keep the reason, however much of the name it shows.
LONG_NAME = "long/" + "n" * 5000

# A short path (about 3,000 bytes) 1,500 folders deep: deeper than mirror's
# sweep goes with one descriptor per level.
DEEP_NAME = "deep/" + "d/" * 1500 + "leaf"


def plant_hostile(db, names=HOSTILE_NAMES, bucket="fs"):
    """One small readable file per name, with ObjectIds; returns {name: _id}."""
    return {name: plant(db, bson.ObjectId(), name, data(1500, i), bucket=bucket)
            for i, name in enumerate(names)}
# Names a shell completion must insert as one word, quoted: spaces, a quote,
# glob characters. They share the prefix "five" so one TAB offers them all.
SHELL_NAMES = ["five four.txt", "five five.txt", "five's quote.txt", "five*[1].txt"]


def plant_names(db, names, bucket="fs"):
    """An empty file for each name (listing needs no chunks)."""
    for i, name in enumerate(names):
        plant(db, bson.ObjectId(), name, b"", bucket=bucket)
# Names and prefixes that would make a path outside the target, or one that
# mirror and get refuse, if a writer stored them: the path-escape entries of
# HOSTILE_NAMES, and import prefixes of the same kinds.
UNSAFE_PATH_NAMES = ["../escape.txt", "/abs/path.txt", "a//b.txt", "dot/./seg.txt", "../../x"]
UNSAFE_PREFIXES = ["../x", "/abs", "a//b", "./p", "/", "p/../q"]
# Stored contentType values that must never reach a response header as they
# are: a CR/LF that would forge a header, a control byte, a byte beyond ASCII.
HOSTILE_CONTENT_TYPES = [
    "text/html\r\nX-Injected: 1",
    "image/\x01png",
    "text/plain\x7f",
    "caf\u00e9/type",
]
def plant_hash_variants(db, bucket="fs"):
    """Digests as other tools store them: {name: (body, intact)}. An upper-case
    sha256 and an upper-case md5 name the content's own digest; a wrong legacy
    md5 (no sha256) does not."""
    out = {}
    body = data(2500, 11)
    plant(db, bson.ObjectId(), "upper-sha.bin", body, bucket=bucket, sha=False,
          metadata={"sha256": hashlib.sha256(body).hexdigest().upper()})
    out["upper-sha.bin"] = (body, True)
    body = data(1500, 12)
    plant(db, bson.ObjectId(), "upper-md5.bin", body, bucket=bucket, sha=False,
          md5=hashlib.md5(body).hexdigest().upper())
    out["upper-md5.bin"] = (body, True)
    body = data(1500, 13)
    plant(db, bson.ObjectId(), "wrong-md5.bin", body, bucket=bucket, sha=False,
          md5=hashlib.md5(b"something else").hexdigest())
    out["wrong-md5.bin"] = (body, False)
    return out


def plant_bad_docs(db, name, bucket="fs"):
    """Files documents of one name that no reader can parse (a length that is
    not a number, a zero chunkSize), each with a chunk; returns their _ids."""
    ids = []
    for i, bad in enumerate([{"length": "huge", "chunkSize": CHUNK},
                             {"length": 5, "chunkSize": 0}]):
        fid = bson.ObjectId()
        doc = {"_id": fid, "filename": name, "uploadDate": datetime.datetime(2020, 1, 1 + i)}
        doc.update(bad)
        db[bucket + ".files"].insert_one(doc)
        db[bucket + ".chunks"].insert_one({"files_id": fid, "n": 0, "data": bson.Binary(b"bad")})
        ids.append(fid)
    return ids


def plant_empty_with_stray_chunk(db, name, bucket="fs"):
    """A zero-length file and a chunk that claims it: a reader that queries
    the chunks of an empty file (the spec says it MUST NOT) sees an extra
    chunk. Returns the _id."""
    fid = bson.ObjectId()
    db[bucket + ".files"].insert_one(file_doc(fid, name, b""))
    db[bucket + ".chunks"].insert_one({"files_id": fid, "n": 0, "data": bson.Binary(b"stray")})
    return fid



def plant_import_in_flight(db, bucket="fs", live=True):
    """What a running import has written at some instant, as lib/import.c
    writes it: the bucket's import lock (held by a host elsewhere, valid for
    minutes unless live is False), an upload marker with the chunks of its
    file but no files document yet, and a removal marker naming a file whose
    document is gone and whose chunks are not yet. Returns (uploading, removing)
    files_ids."""
    now = datetime.datetime.now(datetime.timezone.utc)
    expires = now + datetime.timedelta(minutes=5 if live else -5)
    db[bucket + ".gridfsctl_locks"].insert_one({
        "_id": "import", "owner": "elsewhere.example/boot/4242/1", "host": "elsewhere.example",
        "bootId": "boot", "pid": 4242, "startTime": 1, "acquired": now, "expires": expires})
    up, gone = bson.ObjectId(), bson.ObjectId()
    db[bucket + ".gridfsctl_uploads"].insert_one({"_id": up, "filename": "new.bin", "keep": 1,
                                                  "owner": "elsewhere.example/boot/4242/1",
                                                  "started": now})
    db[bucket + ".gridfsctl_uploads"].insert_one({"_id": bson.ObjectId(), "deleting": [gone]})
    for fid in (up, gone):
        db[bucket + ".chunks"].insert_many([{"files_id": fid, "n": i, "data": bson.Binary(b"x" * 10)}
                                            for i in range(2)])
    return up, gone


def plant_long_report(db, files=300, bucket="fs"):
    """Files of 8 ten-byte chunks, each with one extra chunk and a name of
    about 1 KB: verify's report on them is far larger than a pipe holds, so a
    reader that stops reading holds verify in the middle of its scan."""
    cs, per = 10, 8
    docs, chunks = [], []
    for i in range(files):
        fid = bson.ObjectId()
        content = data(cs * per, i)
        docs.append(file_doc(fid, f"{i:04d}-" + "x" * 1000, content, chunk=cs))
        chunks += [{"files_id": fid, "n": n, "data": bson.Binary(content[n * cs:(n + 1) * cs])}
                   for n in range(per)]
        chunks.append({"files_id": fid, "n": per, "data": bson.Binary(b"e")})
    db[bucket + ".files"].insert_many(docs)
    db[bucket + ".chunks"].insert_many(chunks)


def plant_dead_upload(db, name, put=False, chunks=2, bucket="fs"):
    """What an import (or, put=True, a put) SIGKILLed mid-upload leaves: its
    upload marker and some chunks, no files document; a put's lock is free,
    as its process is gone. Returns the files_id."""
    fid = bson.ObjectId()
    marker = {"_id": fid, "filename": name}
    if put:
        marker["lock"] = "put-" + str(fid)
    else:
        marker.update(keep=1, owner="gone.example/boot/4343/1",
                      started=datetime.datetime.now(datetime.timezone.utc))
    db[bucket + ".gridfsctl_uploads"].insert_one(marker)
    plant_late_chunk(db, fid, chunks, bucket)
    return fid


def plant_late_chunk(db, fid, n=1, bucket="fs"):
    """Chunks a dead upload had in flight, applied by the server only after
    a recovery had removed that upload's chunks."""
    db[bucket + ".chunks"].insert_many([{"files_id": fid, "n": i, "data": bson.Binary(b"l" * 10)}
                                        for i in range(n)])
# Documents no conforming writer makes: wrong types, impossible numbers,
# missing fields, chunks that do not add up. Each entry is (label, files
# document or None, chunks); the files _id is given so chunks can point at it.
def bogus_documents():
    body = data(3000, 9)
    c = [{"n": i, "data": bson.Binary(body[o:o + CHUNK])} for i, o in enumerate(range(0, 3000, CHUNK))]

    def doc(fid, name, **over):
        d = file_doc(fid, name, body)
        d.update(over)
        return {k: v for k, v in d.items() if v is not _DROP}

    return [
        ("length-string", doc(9001, "bogus/length-string.bin", length="3000"), c),
        ("length-negative", doc(9002, "bogus/length-negative.bin", length=-5), c),
        ("length-huge", doc(9003, "bogus/length-huge.bin", length=Int64(1 << 62)), c),
        ("chunksize-zero", doc(9004, "bogus/chunksize-zero.bin", chunkSize=0), c),
        ("chunksize-negative", doc(9005, "bogus/chunksize-negative.bin", chunkSize=-1000), c),
        ("no-filename", doc(9006, _DROP, filename=_DROP), c),
        ("filename-int", doc(9007, 42, filename=42), c),
        ("metadata-string", doc(9008, "bogus/metadata-string.bin", metadata="x"), c),
        ("sha-int", doc(9009, "bogus/sha-int.bin", metadata={"sha256": 5}), c),
        ("upload-date-string", doc(9010, "bogus/upload-date-string.bin", uploadDate="yesterday"), c),
        ("chunk-no-n", doc(9011, "bogus/chunk-no-n.bin"), [{"data": ch["data"]} for ch in c]),
        ("chunk-data-string", doc(9012, "bogus/chunk-data-string.bin"),
         [{"n": ch["n"], "data": "not binary"} for ch in c]),
        ("chunk-n-double", doc(9013, "bogus/chunk-n-double.bin"), c + [dict(c[0])]),
        ("chunk-n-beyond", doc(9014, "bogus/chunk-n-beyond.bin"), c + [{"n": 99, "data": bson.Binary(b"x")}]),
        ("chunk-n-string", doc(9015, "bogus/chunk-n-string.bin"), [{"n": str(ch["n"]), "data": ch["data"]} for ch in c]),
        ("chunk-oversize", doc(9016, "bogus/chunk-oversize.bin", length=3000, chunkSize=10), c),
        ("mtime-huge", doc(9017, "bogus/mtime-huge.bin", metadata={"mtime": Int64((1 << 63) - 1),
                                                                   "mtimeNs": Int64(-1), "mode": -1}), c),
        ("rawname-string", doc(9018, "bogus/rawname-string.bin", metadata={"rawName": "abc"}), c),
    ]


_DROP = object()


def plant_bogus(db, bucket="fs"):
    """Inserts every bogus_documents() entry; returns the labels."""
    labels = []
    for label, files, chunks in bogus_documents():
        if chunks:
            db[bucket + ".chunks"].insert_many([dict(ch, files_id=files["_id"]) for ch in chunks])
        db[bucket + ".files"].insert_one(files)
        labels.append(label)
    return labels


def plant_put_in_flight(db, bucket="fs", live=True):
    """What a running put (or watch, or verify --repair's re-upload) has
    written at some instant, as gfs_put writes it (lib/markers.h): its own lock
    "put-ID" (held by a host elsewhere unless live is False), an upload
    marker naming that lock, and two chunks but no files document yet.
    Returns the files_id."""
    now = datetime.datetime.now(datetime.timezone.utc)
    expires = now + datetime.timedelta(minutes=5 if live else -5)
    fid = bson.ObjectId()
    lock = f"put-{fid}"
    db[bucket + ".gridfsctl_locks"].insert_one({
        "_id": lock, "owner": "elsewhere.example/boot/4343/1", "host": "elsewhere.example",
        "bootId": "boot", "pid": 4343, "startTime": 1, "acquired": now, "expires": expires})
    db[bucket + ".gridfsctl_uploads"].insert_one({"_id": fid, "filename": "put.bin", "lock": lock})
    db[bucket + ".chunks"].insert_many([{"files_id": fid, "n": i, "data": bson.Binary(b"p" * 10)}
                                        for i in range(2)])
    return fid


def plant_damage(db, folder="dmg", bucket="fs"):
    """One file per kind of damage a chunk read can meet, under folder/, plus
    orphan chunks (old _ids, past verify's --grace) and a chunk without
    files_id. Returns {label: files _id}; "good" and "empty" are intact."""
    old = lambda: bson.ObjectId(int(datetime.datetime(2020, 1, 1).timestamp()).to_bytes(4, "big")
                                + bson.ObjectId().binary[4:])
    chunks, ids = db[bucket + ".chunks"], {}
    for i, label in enumerate(["good", "missing", "short", "extra", "dup", "corrupt", "stray-empty"]):
        body = b"" if label == "stray-empty" else data(2500, 40 + i)
        ids[label] = plant(db, bson.ObjectId(), f"{folder}/{label}.bin", body, bucket=bucket)
    fid = ids["missing"]
    chunks.delete_one({"files_id": fid, "n": 1})
    chunks.update_one({"files_id": ids["short"], "n": 2}, {"$set": {"data": bson.Binary(b"s" * 10)}})
    chunks.insert_one({"files_id": ids["extra"], "n": 3, "data": bson.Binary(b"e" * 10)})
    copy = chunks.find_one({"files_id": ids["dup"], "n": 1}, {"_id": 0})
    chunks.insert_one(copy)
    chunks.update_one({"files_id": ids["corrupt"], "n": 0}, {"$set": {"data": bson.Binary(b"\0" * CHUNK)}})
    chunks.insert_one({"files_id": ids["stray-empty"], "n": 0, "data": bson.Binary(b"stray")})
    ids["incomplete"] = bson.ObjectId()
    db[bucket + ".files"].insert_one(file_doc(ids["incomplete"], f"{folder}/incomplete.bin", data(1500)))
    ids["orphan"] = bson.ObjectId()
    chunks.insert_many([{"_id": old(), "files_id": ids["orphan"], "n": i, "data": bson.Binary(b"o" * 10)}
                        for i in range(2)])
    chunks.insert_one({"_id": old(), "n": 0, "data": bson.Binary(b"nofid")})
    return ids
