"""Benchmark: how long ``calctl device conformance`` takes per ``--level`` on the reference board.

Run on demand (not part of the test suite)::

    python benchmarks/bench_conformance_levels.py [--levels quick,standard] [--batch]

The suite runs as a vendor runs it (child processes, ``run_suite``) on the bundled combined sample, or with
``--batch`` on a sample with decode profiles 1, 4 and 8 (written to a temporary directory). For each level it
prints the wall time, the slowest checks, the host's 1-minute load average before and after, and the ratio to
two figures measured in the same run: the 30 s budget of ``quick`` (docs/calrt-c-abi.md §13), and ``quick``
itself (how much a level adds over it). This script measures; it asserts nothing. The reference board is a
software model: the figures describe calctl's suite over that library, not a Calculet board.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from calctl.runtime import DeviceKind
from calctl.runtime._native.build import build_reference
from calctl.runtime.conformance import ConformanceLevel, ConformanceTarget, run_suite

PACKAGE = Path(__file__).resolve().parent.parent / "fixtures" / "packages" / "combined"
KEY = Path(__file__).resolve().parent.parent / "fixtures" / "keys" / "calctl-test-only-DO-NOT-TRUST.key"
QUICK_BUDGET_S = 30.0


def _batch_sample(out: Path) -> Path:
    from calctl.compiler.sample import build_sample
    from calctl.signing.keys import load_private

    return build_sample(out / "p", kind="combined", key=load_private(KEY), decode_profiles=(1, 4, 8))


def _one(
    library: Path, package: Path, level: ConformanceLevel
) -> tuple[float, list[tuple[str, float]], str, float, float]:
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    suite = run_suite(ConformanceTarget(DeviceKind.CALRT, package, library, level))
    seconds = time.monotonic() - t0
    for r in suite.results:
        if r.verdict.value not in ("PASS", "UNSUPPORTED"):  # the board is healthy: this is a finding to look at
            print(f"  {r.name} {r.verdict.value}: {r.detail} (call {r.call}, returned {r.returned})")
    slowest = sorted(((r.name, r.seconds) for r in suite.results), key=lambda x: -x[1])[:4]
    counts = ", ".join(f"{n} {k}" for k, n in suite.counts().items() if n)
    return seconds, slowest, counts, load0, os.getloadavg()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="quick,standard", help="comma-separated: quick, standard, long")
    ap.add_argument("--batch", action="store_true", help="a sample with decode profiles 1,4,8 (batch_lanes runs)")
    args = ap.parse_args()
    levels = [ConformanceLevel(x.strip()) for x in args.levels.split(",") if x.strip()]
    if ConformanceLevel.QUICK not in levels:
        levels.insert(0, ConformanceLevel.QUICK)  # the baseline the other levels are compared with
    with tempfile.TemporaryDirectory(prefix="calctl-bench-conformance-") as tmp:
        library = build_reference(Path(tmp) / "ref").library
        package = _batch_sample(Path(tmp)) if args.batch else PACKAGE
        print(f"reference board {library}; package {package}; {os.cpu_count()} CPUs")
        quick = None
        for level in levels:
            seconds, slowest, counts, load0, load1 = _one(library, package, level)
            quick = seconds if level is ConformanceLevel.QUICK else quick
            over = f"{seconds / quick:.1f}x quick" if quick else ""
            print(
                f"{level.value:8s} {seconds:7.1f} s  {seconds / QUICK_BUDGET_S:5.2f} of the 30 s quick budget  {over:12s}"
                f"  load {load0:.1f} -> {load1:.1f}  ({counts})"
            )
            print("         slowest: " + ", ".join(f"{n} {s:.1f} s" for n, s in slowest))


if __name__ == "__main__":
    main()
