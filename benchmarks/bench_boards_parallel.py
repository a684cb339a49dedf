"""Benchmark: ``--boards all`` over N mock boards against the same boards one at a time.

Run on demand (not part of the test suite)::

    python benchmarks/bench_boards_parallel.py [--boards 4] [--runs 1] [--command "run-golden --time-scale 200"]

Writes a boards file of ``--boards`` mock boards (seeds 1..N), then, interleaved ``--runs`` times so machine
load hits both alike:

* each board alone: ``calctl <command> --boards <id>`` (one child, as the fan-out runs it), timed one by one;
* all of them: ``calctl <command> --boards all`` (one child per board, concurrently).

It prints every wall time, the slowest single board, the sum of the singles, and the ratios
``all / slowest`` (1.0 is perfect overlap; the goal of issue 52: close to it, not to N) and ``all / sum``.
The default command is ``run-golden`` with the mock's device time scaled up (``--time-scale``), so each board
spends most of its run waiting on its device, as a run on a real board does; a CPU-bound command
(``device check``) on a host with fewer cores than boards overlaps only as far as the cores allow.
The load average is printed beside the figures.

This script measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _time(argv: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--boards", type=int, default=4)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--command", default="run-golden --time-scale 200")
    args = ap.parse_args()
    command = shlex.split(args.command)
    with tempfile.TemporaryDirectory(prefix="bench-boards-") as tmp:
        root = Path(tmp)
        boards_file = root / "boards.yaml"
        ids = [f"bench-b{i}" for i in range(args.boards)]
        boards_file.write_text(
            "boards:\n" + "".join(f"  - {{id: {b}, kind: mock, seed: {i + 1}}}\n" for i, b in enumerate(ids))
        )
        calctl = [sys.executable, "-m", "calctl", *command, "--boards-file", str(boards_file)]
        singles: dict[str, list[float]] = {b: [] for b in ids}
        fleet: list[float] = []
        for run in range(args.runs):
            for b in ids:
                seconds, rc = _time([*calctl, "--boards", b, "--report", str(root / f"single-{run}-{b}")])
                singles[b].append(seconds)
                print(f"run {run}: {b} alone {seconds:.2f} s (exit {rc})")
            seconds, rc = _time([*calctl, "--boards", "all", "--report", str(root / f"all-{run}")])
            fleet.append(seconds)
            print(f"run {run}: all {len(ids)} boards {seconds:.2f} s (exit {rc})")
        single = {b: statistics.median(v) for b, v in singles.items()}
        slowest, total, together = max(single.values()), sum(single.values()), statistics.median(fleet)
        print(f"\ncommand: calctl {args.command}; {len(ids)} mock boards; {args.runs} run(s); {os.cpu_count()} cores")
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"slowest single board {slowest:.2f} s, sum of singles {total:.2f} s, --boards all {together:.2f} s")
        print(f"ratio all / slowest single: {together / slowest:.2f}   (1.0: every board overlapped)")
        print(f"ratio all / sum of singles: {together / total:.2f}   (1.0: no overlap at all)")


if __name__ == "__main__":
    main()
