"""Helpers shared by the bench scripts."""
import os
import subprocess
import sys
import time


def run_timed(argv, env=None):
    """Runs argv to the end; returns (wall seconds, peak RSS in MiB, stdout, CPU seconds).

    Peak RSS and CPU come from wait4, so they are that process's own. Exits
    the bench when argv fails.
    """
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    secs = time.monotonic() - t0
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        sys.exit(f"failed ({rc}): {' '.join(argv)}")
    return secs, ru.ru_maxrss / 1024, out, ru.ru_utime + ru.ru_stime
