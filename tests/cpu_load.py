"""A loaded host for tests of verdicts that must not depend on it: busy-loop processes beside the test.

``busy_host()`` starts one CPU-bound process per core (at least two) and stops them, by their own process
objects, when the block ends. A verdict decided from outputs, records and the device's own job intervals must
come out the same with them running as without.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def busy_host(processes: int | None = None) -> Iterator[int]:
    n = processes or max(2, os.cpu_count() or 2)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end: pass"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]
    try:
        yield n
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(30)
