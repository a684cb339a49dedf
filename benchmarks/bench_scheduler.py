"""CPU cost of the serving core's hot paths (issue 7): one decode tick and one admission decision.

Run on demand::

    python benchmarks/bench_scheduler.py [--repeat N]

Measures, in one process and one run:

* a trivial baseline (one dict insert + one heap push), so results from
  different machines can be compared as ratios;
* one decode tick -- ``Scheduler.schedule(now)`` building a B1 or a B16 batch
  while 1,000 requests are DecodeReady across 8 tenants (selection, tenant
  cap, KV ``begin_batch``, state transitions, batch tensors); the completion
  that puts the lanes back is done outside the timed region and reported
  separately as ``update_from_output``;
* one admission decision -- ``AdmissionController.arrive`` + ``decide`` for a
  request that is admitted (KV lane reserved, WFQ tags stamped), and the same
  through ``Scheduler.arrive`` + ``submit`` (registry record, prefill queue).

Targets (issue 7): B16 tick < 100 µs, admission < 20 µs. Pure Python, no
device: this measures scheduling overhead only, not device capability.
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calctl.serving.core import (
    AdmissionController,
    AdmissionPolicy,
    BatchProfile,
    CapacityBudget,
    DecodeJob,
    InactiveLaneContract,
    JobOutcome,
    JobStatus,
    KvCapacity,
    KvLaneManager,
    LaneReleased,
    LaneResult,
    ModelGenerationId,
    PrefillJob,
    RequestId,
    Scheduler,
    SchedulerSettings,
    ServiceWeights,
    TenantId,
    Ticket,
)

WAITING = 1000
TENANTS = [TenantId(f"tenant{i}") for i in range(8)]


def _timed(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    clock = time.perf_counter_ns
    for _ in range(repeat):
        t0 = clock()
        fn()
        out.append((clock() - t0) / 1000.0)
    return out


def baseline(repeat: int) -> float:
    d: dict[int, int] = {}
    h: list[tuple[float, int]] = []
    counter = iter(range(10**9))

    def op() -> None:
        i = next(counter)
        d[i] = i
        heapq.heappush(h, (float(i % 977), i))

    # time many ops per sample: a single op is below the timer's resolution
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(100):
            op()
        samples.append((time.perf_counter_ns() - t0) / 100 / 1000.0)
    return statistics.median(samples)


def _scheduler(batch: int) -> Scheduler:
    profile = (
        BatchProfile("decode", 1, 1 << 20)
        if batch == 1
        else BatchProfile("decode", batch, 1 << 20, InactiveLaneContract("lane_valid"))
    )
    settings = SchedulerSettings(
        budget=CapacityBudget(WAITING + 64, 1 << 40, 2 * WAITING, 10_000_000, 1),
        max_seq=1 << 20,  # long enough that no request finishes during the run: a steady state
        admission=AdmissionPolicy(context_limit=1 << 20, deadline_default_s=1e9),
        prefill_graph="prefill",
        profiles=(profile,),
        # Warm-up should prefill everything before decoding; once the prefill queues are
        # empty, decode is the only eligible kind, so the weights do not affect the ticks.
        service_weights=ServiceWeights(decode=1, short=100_000, medium=1, long=1),
    )
    return Scheduler(settings, generation=ModelGenerationId(1))


def _complete(sched: Scheduler, job: object, now: float) -> None:
    if isinstance(job, PrefillJob):
        results: tuple[LaneResult, ...] = (LaneResult(job.request_id, 1),)
    else:
        assert isinstance(job, DecodeJob)
        results = tuple(LaneResult(lane.request_id, 1) for lane in job.batch.lanes)
    sched.update_from_output(JobOutcome(job.job_id, job.generation, JobStatus.OK, results), now)
    for ev in sched.drain_events():
        if isinstance(ev, LaneReleased):
            sched.confirm_kv_released(ev.lane)


def decode_tick(batch: int, repeat: int) -> tuple[list[float], list[float], int]:
    sched = _scheduler(batch)
    now = 0.0
    for i in range(WAITING):
        t = sched.arrive(RequestId(f"r{i}"), TENANTS[i % len(TENANTS)], now)
        assert isinstance(t, Ticket)
        sched.submit(t, prompt_tokens=64, max_tokens=500_000, now=now)
    while sched.decode.ready_count < WAITING:  # prefill everything first
        for job in sched.schedule(now).jobs:
            _complete(sched, job, now)
    ticks: list[float] = []
    updates: list[float] = []
    clock = time.perf_counter_ns
    lanes = 0
    for _ in range(repeat):
        now += 0.001
        t0 = clock()
        out = sched.schedule(now)
        t1 = clock()
        (job,) = out.jobs
        assert isinstance(job, DecodeJob)
        lanes = len(job.batch.lanes)
        t2 = clock()
        _complete(sched, job, now)
        t3 = clock()
        ticks.append((t1 - t0) / 1000.0)
        updates.append((t3 - t2) / 1000.0)
    assert sched.decode.ready_count == WAITING
    sched.check_invariants()
    return ticks, updates, lanes


def admission(repeat: int) -> tuple[list[float], list[float]]:
    kv = KvLaneManager(KvCapacity(64, 1_000_000, 4096))
    ctl = AdmissionController(
        CapacityBudget(64, 1_000_000, 1024, 10_000_000, 1),
        AdmissionPolicy(context_limit=4096, deadline_default_s=60.0),
        kv,
        generation=ModelGenerationId(1),
    )
    sched = _scheduler(1)
    ctl_samples: list[float] = []
    sched_samples: list[float] = []
    clock = time.perf_counter_ns
    for i in range(repeat):
        rid = RequestId(f"a{i}")
        tenant = TENANTS[i % len(TENANTS)]
        t0 = clock()
        ticket = ctl.arrive(rid, tenant, 0.0)
        result = ctl.decide(ticket, prompt_tokens=128, max_tokens=256, deadline_s=None, now=0.0)  # type: ignore[arg-type]
        t1 = clock()
        assert result.lane is not None
        ctl.release(rid, served_prompt_tokens=0, served_output_tokens=0)
        kv.release(result.lane)
        kv.confirm_released(result.lane)
        ctl_samples.append((t1 - t0) / 1000.0)

        t0 = clock()
        ticket2 = sched.arrive(rid, tenant, 0.0)
        result2 = sched.submit(ticket2, prompt_tokens=128, max_tokens=256, now=0.0)  # type: ignore[arg-type]
        t1 = clock()
        assert result2.lane is not None
        sched.cancel(rid, 0.0)
        for ev in sched.drain_events():
            if isinstance(ev, LaneReleased):
                sched.confirm_kv_released(ev.lane)
        sched_samples.append((t1 - t0) / 1000.0)
    return ctl_samples, sched_samples


def _row(name: str, samples: list[float], base: float, target: float | None = None) -> str:
    med = statistics.median(samples)
    p99 = sorted(samples)[int(len(samples) * 0.99) - 1]
    verdict = "" if target is None else ("  OK" if med < target else f"  OVER TARGET ({target:g} µs)")
    return f"{name:<44} {med:9.2f} µs  p99 {p99:9.2f} µs  {med / base:7.1f}x baseline{verdict}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000, help="samples per measurement (default 2000)")
    args = parser.parse_args()
    base = baseline(args.repeat)
    b1_ticks, b1_updates, b1_lanes = decode_tick(1, args.repeat)
    b16_ticks, b16_updates, b16_lanes = decode_tick(16, args.repeat)
    ctl, sched = admission(args.repeat)
    print(f"calctl serving-core benchmark (Python {sys.version.split()[0]}, {args.repeat} samples, median)")
    print(f"{'baseline: dict insert + heap push':<44} {base:9.3f} µs")
    print(_row(f"decode tick B1  ({WAITING} ready, {b1_lanes} lane)", b1_ticks, base))
    print(_row(f"decode tick B16 ({WAITING} ready, {b16_lanes} lanes)", b16_ticks, base, 100.0))
    print(_row("  update_from_output B1", b1_updates, base))
    print(_row("  update_from_output B16", b16_updates, base))
    print(_row("admission decision (controller)", ctl, base, 20.0))
    print(_row("admission decision (Scheduler.arrive+submit)", sched, base, 20.0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
