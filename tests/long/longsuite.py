"""The long reliability suite (make check-long; docs/reliability.md): what
its test modules share.

pytest.ini keeps tests/long out of `pytest tests` (norecursedirs), so the
suite runs only when named; every module also sets `pytestmark = LONG`, so
that `-m long` picks it out of a run of both. There is no conftest.py here:
a second module named conftest would shadow tests/conftest.py for
`from conftest import ...`.

Fault counts scale with GRIDFSCTL_LONG_SCALE (1 = the full counts of
docs/reliability.md; the default is a quick pass for development). Random
moments come from one seed per session, printed with every test and
settable with GRIDFSCTL_LONG_SEED, so a failing run can be replayed; each
test derives its own stream from the seed and its name.
"""
import os
import random
import time

import pytest

SCALE = float(os.environ.get("GRIDFSCTL_LONG_SCALE", "0.15"))
SEED = int(os.environ.get("GRIDFSCTL_LONG_SEED") or random.SystemRandom().randrange(1 << 32))


def count(full):
    """full scaled by GRIDFSCTL_LONG_SCALE, at least 1."""
    return max(1, round(full * SCALE))


LONG = pytest.mark.long


@pytest.fixture
def rng(request):
    r = random.Random(f"{SEED}:{request.node.name}")
    print(f"GRIDFSCTL_LONG_SEED={SEED} GRIDFSCTL_LONG_SCALE={SCALE} for {request.node.name}")
    return r


class Tally:
    """Faults injected and survived, printed at the end for docs/reliability.md."""

    def __init__(self, name):
        self.name, self.injected, self.survived, self.notes = name, 0, 0, []
        self.start = time.monotonic()

    def report(self):
        took = time.monotonic() - self.start
        line = (f"TALLY {self.name}: injected={self.injected} survived={self.survived} "
                f"seconds={took:.1f} {' '.join(self.notes)}")
        print(line)
        with open(os.path.join(os.environ.get("GRIDFSCTL_LONG_TALLY", "/tmp/gridfsctl-long-tally.txt")),
                  "a") as f:
            f.write(line + "\n")


@pytest.fixture
def tally(request):
    t = Tally(request.node.name)
    yield t
    t.report()
