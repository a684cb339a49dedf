"""Benchmark: what calctl's own lock around the CalRT shim costs, on the reference board.

Run on demand (not part of the test suite)::

    python benchmarks/bench_shim_lock.py [--threads 4] [--jobs 200] [--repeats 3]

calctl used to hold one Python lock around every shim call except the waits (submit, query, job release,
every KV call, the per-chip queries). It no longer serialises those calls (docs/calrt-c-abi.md §8). This
script measures both ways in the same run, interleaved so machine load hits them alike:

* **unserialised** (calctl today): ``--threads`` threads, each with its own sequence, loop
  kv.append -> submit -> wait -> kv.commit -> kv.rollback-free cycle on the reference board;
* **serialised** (calctl before): the same, with one shared lock held around each of those calls, as the
  old runtime held it.

Jobs run with ``CALRT_REF_TIME_SCALE=0`` (the board's timing model off, only its real compute), so the
figures are the host-side cost of a job, where a lock shows. It prints jobs/s for both, the ratio, and
the most threads the call log saw inside the library at once in each mode.

This script measures; it asserts nothing. The reference board is a software model: the figures describe
calctl's host side over that library, not a Calculet board.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("CALRT_REF_TIME_SCALE", "0")

from calctl.package.reader import load_manifest
from calctl.runtime import open_runtime
from calctl.runtime._native import lib as L
from calctl.runtime._native.build import build_reference
from calctl.runtime.conformance import golden_prompt, write_prefill

PACKAGE = Path(__file__).resolve().parent.parent / "fixtures" / "packages" / "combined"


def _run(library: Path, threads: int, jobs: int, serialise: bool) -> tuple[float, int]:
    log = L.CallLog()
    L.install_call_log(log)
    pkg = load_manifest(PACKAGE)
    lock = threading.Lock()

    @contextlib.contextmanager
    def held() -> Iterator[None]:
        if serialise:
            with lock:
                yield
        else:
            yield

    with open_runtime("calrt", calrt_lib=library) as rt:
        rt.configure(rt.create_calbin(pkg))
        models = [m for m in pkg.models]
        barrier = threading.Barrier(threads + 1)

        def worker(i: int) -> None:
            m = models[i % len(models)]
            prompt = golden_prompt(pkg, m.alias)[:4]
            inputs, outputs = rt.alloc_inputs(m.prefill.name), rt.alloc_outputs(m.prefill.name)
            write_prefill(inputs, prompt)
            barrier.wait()
            for _ in range(jobs):
                with held():
                    seq = rt.kv.allocate(m.alias)
                with held():
                    rt.kv.append(seq, len(prompt))
                with held():
                    job = rt.submit(m.prefill.name, inputs, outputs, kv=[seq])
                rt.wait(job, 30)  # the waits were never serialised
                with held():
                    rt.kv.commit(seq)
                with held():
                    rt.kv.free(seq)

        pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in pool:
            t.join()
        seconds = time.perf_counter() - t0
    L.install_call_log(None)
    return threads * jobs / seconds, log.most_at_once


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=200, help="jobs per thread")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    library = build_reference().library
    rates: dict[bool, list[float]] = {False: [], True: []}
    at_once: dict[bool, int] = {False: 0, True: 0}
    for _ in range(args.repeats):
        for serialise in (True, False):
            rate, most = _run(library, args.threads, args.jobs, serialise)
            rates[serialise].append(rate)
            at_once[serialise] = max(at_once[serialise], most)
    before, after = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"reference board, {args.threads} threads x {args.jobs} jobs, {args.repeats} repeats, load {os.getloadavg()}")
    print(f"serialised (before):   {before:8.1f} jobs/s  (most threads inside the library at once: {at_once[True]})")
    print(f"unserialised (after):  {after:8.1f} jobs/s  (most threads inside the library at once: {at_once[False]})")
    print(f"after / before: {after / before:.3f}  (the lock cost {100 * (1 - before / after):+.1f} % of throughput)")


if __name__ == "__main__":
    main()
