"""fs.chunks is read with no sort: one pass in natural order, or files_id
equality per file (docs/design.md, the query rule). Readers place chunks by
n whatever order the server sends them in; these tests insert chunks out of
order with pymongo and check the results with pymongo and hashlib, never
with gridfsctl's own word. What goes on the wire is checked against the rule
in test_queries.py."""
import hashlib
import os

import bson
import pytest

import jsonvocab
import planted
from test_serve import Server

CS = 1000


def body(size, seed):
    return (hashlib.sha256(str(seed).encode()).digest() * (size // 32 + 1))[:size]


def plant_shuffled(db, files=6, chunks=4):
    """Files of several chunks whose chunks go in interleaved and backwards
    (n=3 of every file, then n=2 of every file, ...): a scan meets every
    file's chunks out of turn. Returns {name: content}."""
    bodies, docs, order = {}, [], []
    for i in range(files):
        fid, name = bson.ObjectId(), f"s/{i}.bin"
        content = body(CS * chunks - 7 * i, i)
        bodies[name] = content
        docs.append(planted.file_doc(fid, name, content, chunk=CS))
        order.append((fid, content))
    db["fs.files"].insert_many(docs)
    for n in reversed(range(chunks)):
        for fid, content in order:
            db["fs.chunks"].insert_one({"files_id": fid, "n": n,
                                        "data": bson.Binary(content[n * CS:(n + 1) * CS])})
    return bodies


def plant_shuffled_damage(db):
    """Out-of-order chunks with faults a sorted read meets at a given n:
    a chunk missing in the middle, a duplicate that comes first, an extra
    chunk beyond the last, a short chunk."""
    chunks = db["fs.chunks"]
    ids = {}
    for label in ("missing", "dupfirst", "beyond", "short"):
        fid, content = bson.ObjectId(), body(3 * CS, label)
        ids[label] = fid
        db["fs.files"].insert_one(planted.file_doc(fid, f"d/{label}.bin", content, chunk=CS))
        parts = {n: content[n * CS:(n + 1) * CS] for n in range(3)}
        if label == "short":
            parts[1] = parts[1][:10]
        ns = [2, 0] if label == "missing" else [2, 1, 0]
        if label == "dupfirst":
            ns = [1] + ns
        if label == "beyond":
            ns = [3] + ns
            parts[3] = b"x"
        for n in ns:
            chunks.insert_one({"files_id": fid, "n": n, "data": bson.Binary(parts[n])})
    return ids


def findings(res):
    objs = jsonvocab.parse(res.text, "verify")
    probs = sorted((o["kind"], o["filename"] or "", o["id"] or "", o.get("n", -1),
                    o.get("count", -1), o["detail"]) for o in objs[:-1])
    return probs, objs[-1]["summary"]


def test_verify_places_chunks_by_n_whatever_the_bound(gfs, db):
    """Chunks that come before their turn: held, or (past a tiny --hold) read
    again by files_id at the end; the verdicts are the same either way, and
    the same as a query per file's."""
    plant_shuffled(db)
    ids = plant_shuffled_damage(db)
    planted.plant_damage(db, "dmg")
    total = db["fs.chunks"].count_documents({})
    held = gfs.run("verify", "--json")
    assert held.rc == 1, held
    base, s = findings(held)
    assert s["chunks"] == total and s["read"] == "scan", s
    got = {p[1]: p[0] for p in base}
    assert got["d/missing.bin"] == "MISSING-CHUNK" and got["d/short.bin"] == "WRONG-SIZE", base
    assert got["d/dupfirst.bin"] == "EXTRA-CHUNK" and got["d/beyond.bin"] == "EXTRA-CHUNK", base
    assert not any(p[1].startswith("s/") for p in base), base
    # as a read sorted by n meets them: n=1 missing, the extra counted once, at n=3
    assert ("MISSING-CHUNK", "d/missing.bin", str(ids["missing"]), 1) in [p[:4] for p in base], base
    assert any(p[1] == "d/beyond.bin" and p[4] == 1 and p[5].startswith("n=3 ") for p in base), base
    assert any(p[1] == "d/dupfirst.bin" and p[5].startswith("n=1 ") for p in base), base

    reread = gfs.run("verify", "--json", "--hold", "1")
    probs, s2 = findings(reread)
    assert reread.rc == 1 and probs == base, reread
    # every out-of-turn file was given up in the scan and read again: more chunks read
    assert s2["chunks"] > total and s2["checked"] == s["checked"], (s, s2)

    each = gfs.run("verify", "--json", "--strategy", "each")
    assert findings(each)[0] == base, each


def test_mirror_scan_and_get_deliver_exact_bytes(gfs, db, tmp_path):
    """Chunks inserted backwards: a scan (held or, past --hold, file by file), a
    per-file mirror and get all write exactly the stored content."""
    bodies = plant_shuffled(db)
    for args in (["--read", "scan"], ["--read", "scan", "--hold", "1"], ["--read", "each"]):
        dst = tmp_path / "-".join(a.strip("-") for a in args)
        r = gfs.run("mirror", dst, *args)
        assert r.rc == 0, (args, r)
        for name, content in bodies.items():
            assert hashlib.sha256((dst / name).read_bytes()).digest() == hashlib.sha256(content).digest(), (args, name)
    for name, content in bodies.items():
        r = gfs.run("get", name, "-o", "-")
        assert r.rc == 0 and r.out == content, r


def test_get_of_a_reversed_file_larger_than_the_hold(gfs, db, bucket):
    """A file whose chunks come backwards and weigh more than a reader holds
    (16 MiB): the rest is read chunk by chunk, by {files_id, n}."""
    cs = 255 * 1024
    content = os.urandom(cs * 80 + 5)
    fid = bson.ObjectId()
    db["fs.files"].insert_one(planted.file_doc(fid, "big/rev.bin", content, chunk=cs))
    for n in reversed(range(81)):
        db["fs.chunks"].insert_one({"files_id": fid, "n": n, "data": bson.Binary(content[n * cs:(n + 1) * cs])})
    r = gfs.run("get", "big/rev.bin", "-o", "-")
    assert r.rc == 0 and hashlib.sha256(r.out).digest() == hashlib.sha256(content).digest(), r.err
    db["fs.chunks"].delete_one({"files_id": fid, "n": 40})
    r = gfs.run("get", "big/rev.bin", "-o", "-")
    assert r.rc != 0 and "missing chunk n=40" in r.err, r.err


def test_serve_of_a_reversed_file(gfs, db, tmp_path):
    bodies = plant_shuffled(db, files=2, chunks=5)
    s = Server(gfs, tmp_path)
    try:
        for name, content in bodies.items():
            status, _, got = s.get("/" + name)
            assert status == 200 and got == content, name
            status, _, got = s.get("/" + name, {"Range": f"bytes={CS - 3}-{3 * CS + 2}"})
            assert status == 206 and got == content[CS - 3:3 * CS + 3], name
    finally:
        s.stop()
