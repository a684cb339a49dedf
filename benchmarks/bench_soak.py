"""Benchmark: ``calctl soak`` on the mock board, 100 load/unload cycles with mixed traffic (issue 9).

Run on demand (not part of the test suite)::

    python benchmarks/bench_soak.py [--cycles 100] [--traffic-seconds 2] [--time-scale 1] [--keep]

Runs ``calctl soak --cycles N --format json`` on the bundled combined sample in
a child process with a temporary report directory, and prints the wall time,
the verdict, the violations, the request counts by outcome and the largest
per-chip memory drift. Target (issue 9): 100 cycles, zero violations, under
10 minutes on two cores. These are mock numbers: they time the tool and the
engine's lifecycle, not a board (SPEC §8).

This script measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--traffic-seconds", type=float, default=2.0)
    ap.add_argument("--time-scale", type=float, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the report directory and print its path")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="calctl-bench-soak-"))
    cmd = [
        sys.executable,
        "-m",
        "calctl",
        "soak",
        "--cycles",
        str(args.cycles),
        "--traffic-seconds",
        str(args.traffic_seconds),
        "--report",
        str(out / "soak"),
        "--format",
        "json",
    ]
    if args.time_scale is not None:
        cmd += ["--time-scale", str(args.time_scale)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        print(proc.stderr[-4000:])
        print(f"calctl soak exited {proc.returncode} without a JSON report")
        return 1
    drift = {k: (None if v is None else round(v / 2**20, 3)) for k, v in doc["memory"]["max_drift_bytes"].items()}
    print(
        f"calctl soak --cycles {args.cycles} --traffic-seconds {args.traffic_seconds:g}: exit {proc.returncode}, "
        f"{seconds:.1f} s wall ({seconds / max(1, doc['cycles']):.2f} s per cycle)"
    )
    print(f"  cycles {doc['cycles']}, ok {doc['ok']}, violations {len(doc['violations'])}")
    for v in doc["violations"]:
        print(f"    {v['kind']}: {v['message']} (x{v['occurrences']})")
    print(f"  requests {doc['requests']['sent']}: {json.dumps(doc['requests']['by_outcome'], sort_keys=True)}")
    print(
        f"  max drift MiB per chip: {drift}; AlreadyConfigured {doc['errors']['already_configured']}; "
        f"stale delivered {doc['errors']['stale_completions_delivered']}"
    )
    if args.keep:
        print(f"  report: {out / 'soak'}")
    else:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
