#!/usr/bin/env python3
"""Generate a poster-like tree: N files in two-level hex folders (ab/cd/<id>.jpg),
sizes log-normal around 40 KB, JPEG headers so libmagic sees image/jpeg.
The same seed always gives the same tree, byte for byte.

    bench/gen_posters.py DIR N [--seed S]
"""
import argparse
import hashlib
import math
import os
import random

JPEG_HEAD = bytes.fromhex("ffd8ffe000104a46494600010100000100010000")
JPEG_TAIL = bytes.fromhex("ffd9")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("count", type=int)
    ap.add_argument("--seed", type=int, default=52000)
    ap.add_argument("--mean-kb", type=float, default=40.0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    sigma = 0.5
    mu = math.log(a.mean_kb * 1024) - sigma * sigma / 2  # mean of the log-normal is mean_kb
    total = 0
    for i in range(a.count):
        h = hashlib.sha1(f"{a.seed}:{i}".encode()).hexdigest()
        d = os.path.join(a.dir, h[:2], h[2:4])
        os.makedirs(d, exist_ok=True)
        size = max(len(JPEG_HEAD) + 2, min(int(rng.lognormvariate(mu, sigma)), 4 << 20))
        body = rng.randbytes(size - len(JPEG_HEAD) - len(JPEG_TAIL))
        path = os.path.join(d, f"{h[4:16]}.jpg")
        with open(path, "wb") as f:
            f.write(JPEG_HEAD + body + JPEG_TAIL)
        os.utime(path, ns=(1_600_000_000_000_000_000 + i * 1_000_000_007,) * 2)
        total += size
    print(f"{a.count} files, {total / 1e6:.1f} MB in {a.dir}")


if __name__ == "__main__":
    main()
