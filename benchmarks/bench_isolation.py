"""Benchmark: how long gate G2 (``bench --scenario isolation``) takes on the mock, and where the time goes.

Run on demand (not part of the test suite)::

    python benchmarks/bench_isolation.py [--requests 1000] [--time-scale 0.1] [--seed 0]

Runs the scenario once on the bundled replica sample and prints the seconds of
each part (load + golden + warm-up, serial golden, the concurrent serve, the
reference check and evidence files) against two baselines measured in the same
run: the device time the per-chip trace holds (the serve's lower bound if the
host cost nothing; a ratio well above 1 is host overhead) and the acceptance
report's quick-level budget of 5 minutes (issue 20: the whole quick level must
finish within it, so this one gate should take a small share).

This script measures; it asserts nothing. Mock figures: they say nothing about a board.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from calctl.compiler.bundled import bundled_package
from calctl.runners.bench.base import BenchOptions
from calctl.runners.bench.scenarios import SCENARIOS
from calctl.runners.device import DeviceSpec
from calctl.signing.policy import make_policy

QUICK_LEVEL_BUDGET_S = 300.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--time-scale", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    pkg = bundled_package("replica")
    with tempfile.TemporaryDirectory(prefix="calctl-bench-isolation-") as tmp:
        t0 = time.perf_counter()
        res = SCENARIOS["isolation"].run(
            BenchOptions(
                out_dir=Path(tmp),
                package=pkg,
                trust=make_policy(None, False, trust_test_key=True),
                device=DeviceSpec(time_scale=args.time_scale),
                seed=args.seed,
                requests=args.requests,
            ),
            lambda _line: None,
        )
        total = time.perf_counter() - t0
        trace = json.loads(Path(res.body["files"]["trace"]).read_text(encoding="utf-8"))
    device_s = {0: 0.0, 1: 0.0}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("tid") in device_s and "phase" not in e.get("args", {}):
            device_s[e["tid"]] += e["dur"] / 1e6
    busiest = max(device_s.values())
    parts = res.body["seconds"]
    print(
        f"verdict {res.verdict}: {res.body['requests']['sent']} requests, {res.body['requests']['output_tokens']} tokens"
    )
    print(f"{'part':<22}{'seconds':>10}")
    for name, sec in parts.items():
        print(f"{name:<22}{sec:>10.2f}")
    print(f"{'total':<22}{total:>10.2f}")
    print(f"device time in the trace: chip0 {device_s[0]:.2f} s, chip1 {device_s[1]:.2f} s")
    if busiest > 0:
        print(f"serve / busiest chip's device time: {parts['serve'] / busiest:.2f} (host overhead factor)")
    print(f"total / quick-level budget ({QUICK_LEVEL_BUDGET_S:g} s): {total / QUICK_LEVEL_BUDGET_S:.3f}")


if __name__ == "__main__":
    main()
