#!/usr/bin/env python3
"""Load a disk tree into a GridFS bucket with pymongo, storing the metadata
`gridfsctl import` stores (sha256, mtime, mtimeNs, size, mode), for the
verify benchmark when `gridfsctl import` is not available.

    bench/verify_load.py URI DB DIR [--prefix P] [--bucket fs]
"""
import argparse
import datetime
import hashlib
import os

import bson
import pymongo

CHUNK = 255 * 1024
BATCH_BYTES = 8 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("uri")
    ap.add_argument("db")
    ap.add_argument("dir")
    ap.add_argument("--prefix", default="")
    ap.add_argument("--bucket", default="fs")
    a = ap.parse_args()
    db = pymongo.MongoClient(a.uri)[a.db]
    files, chunks = db[a.bucket + ".files"], db[a.bucket + ".chunks"]
    files.create_index([("filename", 1), ("uploadDate", 1)])
    chunks.create_index([("files_id", 1), ("n", 1)], unique=True)
    prefix = a.prefix.rstrip("/") + "/" if a.prefix else ""
    cbatch, fbatch, nbytes, count = [], [], 0, 0

    def flush():
        nonlocal cbatch, fbatch, nbytes
        if cbatch:
            chunks.insert_many(cbatch, ordered=False)
        if fbatch:
            files.insert_many(fbatch, ordered=False)
        cbatch, fbatch, nbytes = [], [], 0

    for root, dirs, names in os.walk(a.dir):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            st = os.stat(path)
            with open(path, "rb") as f:
                data = f.read()
            fid = bson.ObjectId()
            for n in range(0, max(1, (len(data) + CHUNK - 1) // CHUNK) if data else 0):
                cbatch.append({"files_id": fid, "n": n, "data": bson.Binary(data[n * CHUNK:(n + 1) * CHUNK])})
            rel = os.path.relpath(path, a.dir)
            fbatch.append({
                "_id": fid, "length": len(data), "chunkSize": CHUNK,
                "uploadDate": datetime.datetime.now(datetime.timezone.utc),
                "filename": prefix + rel,
                "metadata": {
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "mtime": datetime.datetime.fromtimestamp(st.st_mtime_ns // 1_000_000 / 1000, datetime.timezone.utc),
                    "mtimeNs": bson.Int64(st.st_mtime_ns),
                    "size": bson.Int64(len(data)),
                    "mode": st.st_mode & 0o7777,
                },
            })
            nbytes += len(data)
            count += 1
            if nbytes >= BATCH_BYTES:
                flush()
    flush()
    print(f"{count} files loaded into {a.db}.{a.bucket}")


if __name__ == "__main__":
    main()
