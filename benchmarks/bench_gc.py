"""Benchmark: garbage-collection pauses while serving, with and without ``gc.freeze`` after start-up.

Run on demand (not part of the test suite)::

    python benchmarks/bench_gc.py [--rounds 2] [--batches 60] [--streams 4] [--tokens 16]

Each arm starts the serving engine in this process as ``calctl serve`` wires it (the supervisor, its golden and
warm-up, the engine and its event loop; ``tests/integration/executor_harness.py``) on the bundled ``single``
fixture package, the mock at time scale 0, then serves ``--batches`` batches of ``--streams`` concurrent greedy
requests of ``--tokens`` tokens. The *frozen* arm calls :func:`calctl.serving.launch.freeze_startup_heap` after
start-up, as ``calctl serve`` does; the *unfrozen* arm does not (``gc.unfreeze`` first). ``gc.callbacks`` times
every collection, by generation, on whatever thread it ran. Arms alternate, ``--rounds`` of each, so a shared
host's drift lands on both; each arm runs in a process of its own (a closed mock runtime's objects outlived it
in the process, and a later arm's collections walked them too). The load average is printed with the figures.
It measures; it asserts nothing.

What a generation-2 collection walks is the start-up heap (what the freeze takes out) plus what serving keeps:
most of that is the runtime's job history (``TraceEvent``, ``JobResult``, ``Job``, ``PhaseInterval``: ~16
tracked objects a job, up to 65,536 jobs), which the freeze does not touch.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from calctl.serving.launch import freeze_startup_heap  # noqa: E402
from tests.integration.executor_harness import executor_engine  # noqa: E402


class PauseLog:
    """Every collection's generation and wall time (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = defaultdict(list)
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses[int(info["generation"])].append(time.perf_counter() - self._start)


def arm(frozen: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One arm, in this process: the figures as JSON-able values."""
    log = PauseLog()
    with executor_engine(time_scale=0.0, max_inflight=2) as h:
        if frozen:
            freeze_startup_heap()
        h.run(args.streams, args.tokens, tag="warm")
        frozen_objects = gc.get_freeze_count()
        tracked = len(gc.get_objects())
        gc.callbacks.append(log)
        t0 = time.perf_counter()
        try:
            for b in range(args.batches):
                outs = h.run(args.streams, args.tokens, tag=f"b{b}")
                assert all(o.ok for o in outs), outs
        finally:
            gc.callbacks.remove(log)
        wall = time.perf_counter() - t0
        tracked_end = len(gc.get_objects())  # what serving kept: the runtime's job history among it
    return {
        "pauses": {str(g): p for g, p in log.pauses.items()},
        "wall": wall,
        "frozen_objects": frozen_objects,
        "tracked": tracked,
        "tracked_end": tracked_end,
    }


def child(frozen: bool, args: argparse.Namespace) -> dict[str, Any]:
    """:func:`arm` in a fresh interpreter (``--child``)."""
    cmd = [sys.executable, __file__, "--child", "frozen" if frozen else "unfrozen"]
    cmd += ["--batches", str(args.batches), "--streams", str(args.streams), "--tokens", str(args.tokens)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO)
    line = next(x for x in res.stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT ") :]))


def summary(p: list[float]) -> str:
    if not p:
        return "0 collections"
    ms = sorted(x * 1e3 for x in p)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    med = statistics.median(ms)
    return f"{len(ms)} collections, total {sum(ms):.1f} ms, median {med:.3f}, p99 {p99:.3f}, max {ms[-1]:.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--child", choices=["frozen", "unfrozen"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(arm(args.child == "frozen", args)))
        return
    print(f"gc thresholds {gc.get_threshold()}, load {os.getloadavg()}")
    results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for r in range(args.rounds):
        for frozen in (False, True) if r % 2 == 0 else (True, False):
            res = child(frozen, args)
            results[frozen].append(res)
            name = "frozen  " if frozen else "unfrozen"
            print(
                f"round {r} {name}: {res['tracked']} tracked objects ({res['tracked_end']} at the end), "
                f"{res['frozen_objects']} frozen, {args.batches * args.streams} requests in {res['wall']:.1f} s"
            )
            for gen in (0, 1, 2):
                print(f"    gen {gen}: {summary(res['pauses'].get(str(gen), []))}")
    print(f"load after {os.getloadavg()}")
    gen2 = {f: [x for res in results[f] for x in res["pauses"].get("2", [])] for f in (False, True)}
    for label, fn in (("total", sum), ("max", max)):
        before, after = (fn(gen2[f]) if gen2[f] else 0.0 for f in (False, True))
        ratio = f"{after / before:.3f}x" if before else "n/a"
        print(f"gen-2 pause {label}: unfrozen {before * 1e3:.1f} ms, frozen {after * 1e3:.1f} ms ({ratio})")


if __name__ == "__main__":
    main()
