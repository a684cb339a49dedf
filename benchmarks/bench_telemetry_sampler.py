"""Benchmark: what sampling the telemetry costs a device run (docs/runtime.md §9).

Run on demand (not part of the test suite)::

    python benchmarks/bench_telemetry_sampler.py [--runs 5] [--calrt-lib PATH]

Every device a runner opens through ``DeviceSpec.open()`` is sampled every 0.5 s by a thread. This times, in
the same process and interleaved so machine load hits both alike, ``--runs`` in-process ``run-golden`` runs of
the bundled combined sample on the mock with the sampler and with it switched off, and prints the medians and
their ratio; then one ``rt.telemetry()`` call's cost on the mock and on the reference board (built into a
temporary directory unless ``--calrt-lib`` names one), over 2,000 calls, and the load average.

This script measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--calrt-lib", type=Path)
    args = ap.parse_args()

    from calctl.runners import device as device_mod
    from calctl.runners.board_check import known_answer_package
    from calctl.runners.device import DeviceSpec
    from calctl.runners.golden import run_golden
    from calctl.runtime import open_runtime
    from calctl.signing.policy import make_policy

    pkg = known_answer_package()
    trust = make_policy(None, False, trust_test_key=True)
    real_attach = device_mod.attach_sampler
    times: dict[str, list[float]] = {"sampled": [], "not sampled": []}
    print(f"load average at start: {os.getloadavg()}")
    for _ in range(args.runs):
        for mode in times:
            device_mod.attach_sampler = real_attach if mode == "sampled" else (lambda rt, **kw: None)  # type: ignore[assignment]
            t0 = time.perf_counter()
            report = run_golden(pkg, trust=trust, device=DeviceSpec())
            times[mode].append(time.perf_counter() - t0)
            assert report.exit_code == 0, report.error
    device_mod.attach_sampler = real_attach
    med = {m: statistics.median(v) for m, v in times.items()}
    for m, v in med.items():
        print(f"run-golden {m}: median {v:.3f} s over {args.runs} runs")
    print(f"ratio sampled / not sampled: {med['sampled'] / med['not sampled']:.3f}")

    lib = args.calrt_lib
    if lib is None:
        from calctl.runtime._native.build import build_reference

        lib = build_reference(Path(tempfile.mkdtemp())).library
    for kind, opts in (("mock", {}), ("calrt", {"calrt_lib": lib})):
        with open_runtime(kind, **opts) as rt:
            t0 = time.perf_counter()
            for _ in range(2000):
                rt.telemetry()
            per = (time.perf_counter() - t0) / 2000
            print(f"{kind}: rt.telemetry() {per * 1e6:.1f} us a call ({per / 0.5:.4%} of a core at one call per 0.5 s)")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
