"""Benchmark: how long ``calctl accept --level quick`` takes on the mock, against ``calctl bringup --level quick``.

Run on demand (not part of the test suite)::

    python benchmarks/bench_accept.py [--runs 1]

Runs, in the same process start-up conditions and interleaved so machine load
hits both alike, ``--runs`` times each of:

* ``calctl bringup --level quick`` on the bundled combined sample (the baseline:
  validate, budget, golden, warm-up, PoC, a 3-cycle soak);
* ``calctl accept --level quick`` on the bundled combined + replica samples
  (everything bringup does, plus the isolation, fault-isolation,
  executor-modes and batch scenarios and the rollback).

It prints each wall time, the ratio accept / bringup, and each accept step's own
seconds from its report.json, so a regression names the step. Target (issue 20):
the quick level under 300 s on a 2-core machine.

This script measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 300.0


def _time(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    base: list[float] = []
    accept: list[float] = []
    steps: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-accept-") as tmp:
        for i in range(args.runs):
            out = Path(tmp) / f"bringup-{i}"
            base.append(_time([sys.executable, "-m", "calctl", "bringup", "--level", "quick", "--report", str(out)]))
            out = Path(tmp) / f"accept-{i}"
            accept.append(_time([sys.executable, "-m", "calctl", "accept", "--level", "quick", "--report", str(out)]))
            doc = json.loads((out / "report.json").read_text())
            for s in doc["steps"]:
                steps.setdefault(s["name"], []).append(s["seconds"])
    b, a = statistics.median(base), statistics.median(accept)
    print(f"bringup --level quick: median {b:.1f} s over {len(base)} run(s)")
    print(f"accept  --level quick: median {a:.1f} s over {len(accept)} run(s) (target < {TARGET_S:.0f} s)")
    print(f"ratio accept / bringup: {a / b:.2f}")
    for name, secs in steps.items():
        print(f"  {name:<16} {statistics.median(secs):7.1f} s")


if __name__ == "__main__":
    main()
