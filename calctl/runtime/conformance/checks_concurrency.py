"""Checks of concurrency: two chips at once, two jobs in flight on a chip, waits that hold no lock, close."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from calctl.errors import CalctlError
from calctl.package.model import Package
from calctl.runtime import Runtime, intervals
from calctl.runtime.conformance.framework import (
    Abandoned,
    Session,
    _returned,
    _unwrap,
    check,
    expect,
    golden_prompt,
    held_jobs,
    prefill_job,
    write_prefill,
)
from calctl.runtime.errors import (
    DeviceBusy,
    JobAborted,
)
from calctl.runtime.types import Engine, Job, JobResult, JobState

JOBS_PER_MODEL = 64  # enough to meet a fault every 64th job (and every 16th, 32nd) at least once per model
ENGINES = (Engine.PING, Engine.PONG)  # one submitting thread per engine and model
STUCK_AFTER = 10.0  # seconds with no job finished by any thread, threads still running: a deadlock
# Whether two threads are ever inside the library at once depends on the host's scheduler as much as on calctl: on a
# loaded host a fast shim can finish every call before another thread gets a core. Passes of the rounds go on, up to
# these budgets, until two calls overlap; a layer that serialises the calls never overlaps and still FAILs.
OVERLAP_PASSES = 12
OVERLAP_BUDGET_S = 30.0
# Host-observed evidence for the vendor rows "chips in parallel" and "N in flight" (never graded from the shim's
# own time stamps alone, which a shim can stamp before taking a global lock): bursts of jobs submitted at once,
# timed by the host from the first submit until the last job of each chip and engine is seen done. A board that
# serialises completes two bursts together at the rate of one (speedup ~1); one that overlaps, faster (~2 for two
# chips). The median of BURST_ROUNDS rounds, each round timing its bursts back to back: a loaded host makes single
# rounds swing both ways (0.6-1.8 for a serialising board beside 8 busy processes on 2 cores), the median does not.
BURST_JOBS = 16
BURST_ROUNDS = 7
PARALLEL_SPEEDUP = 1.3  # two chips: at least this median speedup, the host saw them overlap (~2 ideal, 1.6 loaded)
# one chip, PING/PONG alternating against AUTO: two in flight overlap transfers with compute only (~1.6 ideal on the
# reference board); a board that serialises stays at ~1 (0.8-1.1 measured beside 8 busy processes on 2 cores)
IN_FLIGHT_SPEEDUP = 1.15


def crosstalk_prompt(vocab: int, max_tokens: int, model: int, engine: int, round_: int) -> np.ndarray:
    """A prompt of its own for every (model, engine, round): 3-12 tokens below ``vocab``, seeded by the triple."""
    rng = np.random.default_rng([model, engine, round_, 0x5EED])
    n = int(rng.integers(3, max(3, min(max_tokens, 12)) + 1))
    return rng.integers(0, vocab, size=n).astype(np.int32)


def _shape(pkg: Package, alias: str) -> tuple[int, int]:
    g = pkg.model(alias).prefill
    vocab = int(next(t for t in g.outputs if t.name == "logits").shape[-1])
    max_tokens = int(next(t for t in g.inputs if t.name == "tokens").shape[-1])
    return vocab, max_tokens


@check(
    "concurrent_submit_two_chips",
    f"{len(ENGINES)} threads per model submit and wait at once ({JOBS_PER_MODEL} jobs per model, a prompt per job): "
    "every output equals its prompt's own reference; the calls reach the shim concurrently",
    clauses=("THREAD-1", "JOB-5", "TIME-1"),
)
def _concurrent(s: Session) -> str:
    """First every prompt runs alone, one job at a time: its reference (distinct prompts must give distinct
    logits, or a job got another's output). Then one thread per model and engine submits its round's prompt,
    all threads released together each round, and waits; every output is compared with its own reference.
    The call log counts how many threads were inside the library at once (calctl must not serialise them,
    C ABI §8); a thread that stays inside one call for ``STUCK_AFTER`` s is a deadlock, named by its call."""
    pkg = s.package
    a, b = s.pair()
    aliases = (a, b)
    rounds = JOBS_PER_MODEL // len(ENGINES)
    rt = s.open()
    stuck = False
    try:
        rt.configure(rt.create_calbin(pkg))
        prompts = _crosstalk_prompts(pkg, aliases, rounds)
        reference = _references(rt, pkg, prompts)
        log = s.calls() if s.native else None
        if log is not None:
            log.reset_counts()
        t0 = time.monotonic_ns()
        run = _JobRounds(rt, pkg, aliases, rounds, prompts, reference)
        passes = run.passes_until_overlap(log)
        if run.alive:
            stuck = True
            raise run.deadlock(log)
        concurrency = run.judge(log, passes)
        ca, cb = s.chip_of(a), s.chip_of(b)
        overlap, busy_a = _stamped_overlap(rt, t0, ca, cb)
        n = min(_burst_size(pkg, a), _burst_size(pkg, b))
        speedup = host_speedup(rt, pkg, [(a, Engine.AUTO)] * n, [(b, Engine.AUTO)] * n)
        s.evidence.update(
            rounds=rounds,
            passes=passes,
            jobs=sum(run.jobs_done.values()),
            reference_jobs=len(prompts),
            jobs_per_model=dict(run.jobs_done),
            overlap_ms=overlap / 1e6,
            chip_a_busy_ms=busy_a / 1e6,
            chips=[ca, cb],
            host_speedup=round(speedup, 3),
            **concurrency,
        )
    finally:
        if not stuck:
            rt.close()
    at_once = (
        f"; up to {concurrency['inside_at_once']} threads inside the library at once "
        f"({concurrency['submit_at_once']} in submit, {concurrency['wait_at_once']} in wait)"
        if concurrency
        else ""
    )
    return (
        f"{sum(run.jobs_done.values())} jobs from {len(run.threads)} threads, each against its own prompt's reference "
        f"({len(prompts)} reference jobs); chips {ca}/{cb} overlapped {overlap / 1e6:.1f} ms by the shim's time "
        f"stamps; {_speedup_text(speedup, 'both chips', 'one')}" + at_once
    )


_Key = tuple[str, int, int]  # (alias, engine index, round)


def _crosstalk_prompts(pkg: Package, aliases: tuple[str, str], rounds: int) -> dict[_Key, np.ndarray]:
    prompts: dict[_Key, np.ndarray] = {}
    for mi, alias in enumerate(aliases):
        vocab, max_tokens = _shape(pkg, alias)
        for ei in range(len(ENGINES)):
            for r in range(rounds):
                prompts[alias, ei, r] = crosstalk_prompt(vocab, max_tokens, mi, ei, r)
    return prompts


def _references(rt: Runtime, pkg: Package, prompts: dict[_Key, np.ndarray]) -> dict[_Key, np.ndarray]:
    """Every prompt alone on the board, one job in flight at a time: its logits, each distinct from the others'."""
    reference: dict[_Key, np.ndarray] = {}
    seen: dict[tuple[str, bytes], _Key] = {}
    for key, prompt in prompts.items():
        job, seq, ins, out = prefill_job(rt, pkg, key[0], prompt)
        expect(rt.wait(job, 10).ok, f"reference job {job.id} ({key[0]}) succeeds", call="calrt_job_wait")
        logits = out.read("logits").copy()
        rt.release_buffer(ins)
        rt.release_buffer(out)
        rt.kv.free(seq)
        other = seen.get((key[0], logits.tobytes()))
        expect(
            other is None,
            f"{key[0]}: two different prompts gave identical logits when run alone (job {job.id}, "
            f"engine/round {key[1:]} and {other[1:] if other else None}): a job got another job's output",
            call="calrt_job_submit / calrt_job_wait",
            arguments=f"graph={pkg.model(key[0]).prefill.name!r}, job {job.id}",
            returned="the logits of an earlier job",
        )
        seen[key[0], logits.tobytes()] = key
        reference[key] = logits
    return reference


class _JobRounds:
    """One thread per model and engine, released together each round, each output against its reference."""

    def __init__(
        self,
        rt: Runtime,
        pkg: Package,
        aliases: tuple[str, str],
        rounds: int,
        prompts: dict[_Key, np.ndarray],
        reference: dict[_Key, np.ndarray],
    ) -> None:
        self.rt, self.pkg, self.aliases, self.rounds = rt, pkg, aliases, rounds
        self.prompts, self.reference = prompts, reference
        self.errors: list[str] = []
        self.mismatches: list[str] = []
        self.idents: dict[int, str] = {}
        self.jobs_done = {alias: 0 for alias in aliases}
        self.barrier = threading.Barrier(len(aliases) * len(ENGINES))
        self.threads: list[threading.Thread] = []
        self.alive: list[threading.Thread] = []

    def worker(self, alias: str, ei: int) -> None:
        self.idents[threading.get_ident()] = f"{alias}/{ENGINES[ei].value}"
        try:
            for r in range(self.rounds):
                self.barrier.wait(2 * STUCK_AFTER)
                self._one_job(alias, ei, r)
        except threading.BrokenBarrierError:
            self.errors.append(f"{alias}/{ENGINES[ei].value}: another thread never reached the next round")
        except Exception as exc:  # a thread-safety failure is the finding
            self.errors.append(f"{alias}/{ENGINES[ei].value}: {_returned(exc)}")
            self.barrier.abort()

    def _one_job(self, alias: str, ei: int, r: int) -> None:
        rt = self.rt
        job, seq, inputs, out = prefill_job(rt, self.pkg, alias, self.prompts[alias, ei, r], engine=ENGINES[ei])
        result = rt.wait(job, STUCK_AFTER)
        if not result.ok:
            self.errors.append(f"{alias}: job {job.id} {result.state.value}")
        got, want = out.read("logits"), self.reference[alias, ei, r]
        if not np.array_equal(got, want):
            self.mismatches.append(
                f"{alias} {ENGINES[ei].value} round {r}: job {job.id}'s logits are not its prompt's "
                f"(max |diff| {float(np.abs(got - want).max()):.3g})"
            )
        rt.release_buffer(inputs)
        rt.release_buffer(out)
        rt.kv.free(seq)
        self.jobs_done[alias] += 1

    def passes_until_overlap(self, log: Any) -> int:
        """Passes of the rounds until two calls overlapped inside the library (or the budgets end, or a thread
        failed or stuck); the number of passes."""
        passes, budget_end = 0, time.monotonic() + OVERLAP_BUDGET_S
        while True:
            self.threads, self.alive = _one_pass(self.worker, self.aliases, self.jobs_done)
            passes += 1
            if self.alive or self.errors or self.mismatches or log is None or log.most_at_once >= 2:
                return passes
            if passes >= OVERLAP_PASSES or time.monotonic() >= budget_end:
                return passes

    def deadlock(self, log: Any) -> Abandoned:
        inside = log.inside() if log is not None else {}
        where = sorted(
            {
                f"{self.idents.get(t.ident or 0, t.name)} in {inside.get(t.ident or 0, 'no CalRT call')}"
                for t in self.alive
            }
        )
        calls = sorted({inside[t.ident] for t in self.alive if t.ident in inside})
        return Abandoned(
            f"{len(self.alive)} of {len(self.threads)} threads made no progress for {STUCK_AFTER:g} s while submitting "
            f"and waiting concurrently: {', '.join(where)} (a deadlock in the shim; the check's process is "
            "abandoned, the remaining checks run in a fresh one)",
            call=" / ".join(calls) or "rt.submit / rt.wait from several threads",
            arguments=f"{len(self.threads)} threads, one per model and engine",
            returned="never returned",
        )

    def judge(self, log: Any, passes: int) -> dict[str, int]:
        """The rounds' FAILs (errors, outputs not their prompt's, calls never concurrent); the concurrency seen."""
        expect(
            not self.errors,
            f"{len(self.errors)} failures under concurrent submit and wait",
            call="calrt_job_submit / calrt_job_wait from several threads",
            returned=self.errors[:3],
        )
        expect(
            not self.mismatches,
            f"{len(self.mismatches)} of {2 * JOBS_PER_MODEL} jobs run concurrently returned logits that are not their "
            f"own prompt's (stale output or crosstalk): {'; '.join(self.mismatches[:3])}",
            call="calrt_job_wait (outputs)",
            returned=self.mismatches[:3],
        )
        if log is None:
            return {}
        concurrency = {
            "inside_at_once": log.most_at_once,
            "submit_at_once": log.most.get("calrt_job_submit", 0),
            "wait_at_once": log.most.get("calrt_job_wait", 0),
        }
        expect(
            log.most_at_once >= 2,
            f"the threads' calls never overlapped inside the library in {passes} pass(es) of {self.rounds} rounds: "
            "they were serialised before the shim",
            call="calrt_job_submit / calrt_job_wait",
            returned=concurrency,
        )
        return concurrency


def _stamped_overlap(rt: Runtime, t0: int, ca: int, cb: int) -> tuple[int, int]:
    """By the shim's own stamps since ``t0``: ns the two chips' jobs overlapped, and ns chip ``ca`` was busy."""
    events = [e for e in rt.trace(since_ns=t0) if e.start_ns and e.end_ns]
    ia = [(int(e.start_ns or 0), int(e.end_ns or 0)) for e in events if e.chip == ca]
    ib = [(int(e.start_ns or 0), int(e.end_ns or 0)) for e in events if e.chip == cb]
    return intervals.overlap(ia, ib), sum(e - s_ for s_, e in ia)


def _speedup_text(speedup: float, what: str, base: str) -> str:
    return f"{what} completed {speedup:.2f}x the jobs per second of {base} (host clock)"


def burst_rate(rt: Runtime, pkg: Package, jobs: list[tuple[str, Engine]]) -> float:
    """Jobs per second the host saw: ``jobs`` (prepared beforehand: sequences, buffers, reservations) submitted
    at once, from the first submit until the last job of each (model, engine) is seen done. Jobs of one model and
    engine run in submit order (C ABI §12), so waiting on those last jobs first times the burst without a wait
    per job adding the host's own overhead."""
    prepared = []
    for alias, engine in jobs:
        m = pkg.model(alias)
        seq = rt.kv.allocate(alias)
        inputs, outputs = rt.alloc_inputs(m.prefill.name), rt.alloc_outputs(m.prefill.name)
        prompt = golden_prompt(pkg, alias)
        write_prefill(inputs, prompt)
        rt.kv.append(seq, len(prompt))
        prepared.append((m.prefill.name, engine, seq, inputs, outputs, alias))
    t0 = time.monotonic()
    submitted = [(rt.submit(g, i, o, engine, kv=[q]), (alias, engine)) for g, engine, q, i, o, alias in prepared]
    last = {group: job for job, group in submitted}
    for job in last.values():
        expect(rt.wait(job, 30).ok, f"burst job {job.id} succeeds", call="rt.wait")
    seconds = time.monotonic() - t0
    for job, _ in submitted:
        expect(rt.wait(job, 30).ok, f"burst job {job.id} succeeds", call="rt.wait")
    for _, _, q, i, o, _ in prepared:
        rt.release_buffer(i)
        rt.release_buffer(o)
        rt.kv.free(q)
    return len(jobs) / max(seconds, 1e-9)


def _burst_size(pkg: Package, alias: str) -> int:
    """Jobs in a burst of ``alias``: each holds a KV sequence, so at most the model's capacity."""
    return min(BURST_JOBS, pkg.model(alias).kv.max_sequences)


def host_speedup(
    rt: Runtime,
    pkg: Package,
    first: list[tuple[str, Engine]],
    second: list[tuple[str, Engine]],
    *,
    together: list[tuple[str, Engine]] | None = None,
) -> float:
    """The median over ``BURST_ROUNDS`` of: the rate of ``together`` (default: ``first`` and ``second``
    interleaved) over the mean rate of ``first`` and ``second`` alone."""
    mixed = together if together is not None else [job for pair in zip(first, second, strict=True) for job in pair]
    speedups = []
    for _ in range(BURST_ROUNDS):
        alone = (burst_rate(rt, pkg, first) + burst_rate(rt, pkg, second)) / 2
        speedups.append(burst_rate(rt, pkg, mixed) / alone)
    return float(np.median(speedups))


def _one_pass(
    worker: Callable[[str, int], None], aliases: tuple[str, str], jobs_done: dict[str, int]
) -> tuple[list[threading.Thread], list[threading.Thread]]:
    """Every model's threads run their rounds once; returns the threads and those still alive after
    ``STUCK_AFTER`` s without any thread finishing a job (a deadlock)."""
    threads = [
        threading.Thread(target=worker, args=(x, ei), daemon=True) for x in aliases for ei in range(len(ENGINES))
    ]
    for t in threads:
        t.start()
    last, since = -1, time.monotonic()
    while any(t.is_alive() for t in threads) and time.monotonic() - since < STUCK_AFTER:
        threads[0].join(0.1)
        done = sum(jobs_done.values())
        if done != last:  # progress: some thread finished a job
            last, since = done, time.monotonic()
    return threads, [t for t in threads if t.is_alive()]


@check(
    "two_in_flight_one_chip",
    "a PING and a PONG job are both accepted on one chip and complete in order",
    clauses=("TIME-1",),
)
def _two_in_flight(s: Session) -> str:
    pkg = s.package
    m = pkg.models[0]
    # Up to twelve PING/PONG pairs, until one overlaps: whether the second submit lands before the first job
    # ends is the host's doing (a starved submitting thread), so a loaded host must not turn "two in flight"
    # into "serialised"; a board that serialises shows no overlap in any of them.
    pairs, best = 0, 0
    with s.configured() as rt:
        while pairs < 12 and best == 0:
            pairs += 1
            first, s1, _, o1 = prefill_job(rt, pkg, m.alias, engine=Engine.PING)
            try:
                second, s2, _, o2 = prefill_job(rt, pkg, m.alias, engine=Engine.PONG)
            except DeviceBusy:
                rt.wait(first, 10)
                s.evidence.update(max_in_flight=1, refused="DEVICE_BUSY")
                return "a second job on the chip was refused with DEVICE_BUSY: one in flight"
            r1, r2 = rt.wait(first, 10), rt.wait(second, 10)
            expect(r1.ok and r2.ok, "both jobs succeed", call="rt.wait", returned=(r1.state, r2.state))
            assert r1.start_ns and r2.start_ns and r1.end_ns and r2.end_ns
            expect(
                r1.start_ns <= r2.start_ns,
                "jobs on one chip start in submit order",
                returned=(r1.start_ns, r2.start_ns),
            )
            expect(
                bool(np.array_equal(o1.read("logits"), o2.read("logits"))),
                "both lanes computed the same prompt alike",
                returned=None,
            )
            best = max(best, min(r1.end_ns, r2.end_ns) - max(r1.start_ns, r2.start_ns))
            rt.kv.free(s1)
            rt.kv.free(s2)
        n = _burst_size(pkg, m.alias)
        auto = [(m.alias, Engine.AUTO)] * n
        alternating = [(m.alias, (Engine.PING, Engine.PONG)[i % 2]) for i in range(n)]
        speedup = host_speedup(rt, pkg, auto, auto, together=alternating)
        s.evidence.update(
            max_in_flight=2 if best > 0 else 1,
            overlap_ms=best / 1e6,
            chip=m.target_chips[0],
            host_speedup=round(speedup, 3),
        )
    mode = "two in flight" if best > 0 else "serialised"
    return (
        f"{pairs} pairs accepted and completed in order; largest overlap {best / 1e6:.2f} ms by the shim's time "
        f"stamps ({mode}); {_speedup_text(speedup, 'PING/PONG alternating', 'AUTO')}"
    )


#: how long the other chip's job computes in ``stamps_are_run_time`` (the test hook's delay), and the share of it a
#: job's stamps may claim beyond its run alone before they count waiting as running
LONG_JOB_MS = 1500
STAMP_SLACK_S = 0.5


@check(
    "stamps_are_run_time",
    "a job on one chip while the other chip computes a long job is stamped with when it ran, not with the time it "
    "spent waiting (chips that share a core behind the stamps)",
    clauses=("TIME-1",),
    native_only=True,
)
def _stamps_are_run_time(s: Session) -> str:
    """A's job computes ~1.5 s (the ``delay_ms`` test hook, set while it starts, cleared before B's job). B's job,
    on the other chip, then runs: on chips that really run apart it ends long before A's; on a board that
    serialises the chips honestly it starts after A's end. Its stamps must not claim both: a start inside A's run
    and a run that outlasts A's end by its own length, many times its run alone (a shim that stamps start_ns when
    it picks a job and then waits for a shared core or a global lock: the vendor rows would read its waiting as
    parallel running, 001 §15.2 item 2)."""
    pkg = s.package
    a, b = s.pair()
    with s.configured() as rt:
        job, seq, _, _ = prefill_job(rt, pkg, b)
        alone = rt.wait(job, 30)
        expect(alone.ok, f"a {b} prefill succeeds", call="rt.wait", returned=alone.state)
        rt.kv.free(seq)
        assert alone.start_ns is not None and alone.end_ns is not None
        alone_s = (alone.end_ns - alone.start_ns) / 1e9
        with held_jobs(rt, LONG_JOB_MS):  # cleared once A's job runs: B's job runs at its own speed
            long_job, long_seq, _, _ = prefill_job(rt, pkg, a)
            t0 = time.monotonic()
            while rt.query(long_job).state is JobState.QUEUED and time.monotonic() - t0 < 10:
                time.sleep(0.002)
        behind, behind_seq, _, _ = prefill_job(rt, pkg, a)  # on A's chip, behind its long job
        asked = time.monotonic_ns()
        was_queued = rt.query(behind).state is JobState.QUEUED
        job, seq, _, _ = prefill_job(rt, pkg, b)
        short = rt.wait(job, 30)
        long = rt.wait(long_job, 30)
        expect(short.ok and long.ok, "both jobs succeed", call="rt.wait", returned=(short.state, long.state))
        queued = rt.wait(behind, 30)
        expect(queued.ok, f"a {a} prefill queued behind job {long_job.id} succeeds", call="rt.wait")
        rt.kv.free(seq)
        rt.kv.free(long_seq)
        rt.kv.free(behind_seq)
    assert short.start_ns and short.end_ns and long.start_ns and long.end_ns
    ran_s = (short.end_ns - short.start_ns) / 1e9
    claims_inside = short.start_ns < long.end_ns - STAMP_SLACK_S * 1e9
    outlasts = short.end_ns >= long.end_ns and ran_s > alone_s + STAMP_SLACK_S
    s.evidence.update(alone_s=round(alone_s, 4), stamped_s=round(ran_s, 4), other_chip_job_s=LONG_JOB_MS / 1000)
    expect(
        not (claims_inside and outlasts),
        f"job {job.id} ({b}, chip {s.chip_of(b)}) is stamped running {ran_s:.3f} s from inside job {long_job.id}'s "
        f"run on chip {s.chip_of(a)} until after its end, where it runs {alone_s:.3f} s alone: start_ns was stamped "
        "before the job could run (it waited for the other chip's job: a shared core or a global lock), so the stamps "
        "show the chips overlapping where they did not",
        call="calrt_job_wait (start_ns, end_ns)",
        arguments=f"job {job.id} on chip {s.chip_of(b)} while job {long_job.id} computes {LONG_JOB_MS} ms on chip "
        f"{s.chip_of(a)}",
        returned=f"start_ns {short.start_ns}, end_ns {short.end_ns}; job {long_job.id} ended {long.end_ns}",
    )
    if was_queued:
        _started_after_queued(behind, queued, long_job, asked, s.chip_of(a))
    return (
        f"{b} on chip {s.chip_of(b)} stamped {ran_s * 1000:.1f} ms ({alone_s * 1000:.1f} ms alone) while {a} computed "
        f"{LONG_JOB_MS} ms on chip {s.chip_of(a)}"
    )


def _started_after_queued(job: Job, result: JobResult, ahead: Job, asked: int, chip: int) -> None:
    """TIME-1 on one chip: a job that ``calrt_job_query`` answered QUEUED, asked at host time ``asked``, started
    after it, so its ``start_ns`` is not before ``asked`` (a shim that reports the runtime's enqueue stamp as the
    start shows a queued job running from its submit). Judged only when the query saw it queued, however late the
    host ran the query."""
    expect(
        result.start_ns is not None and result.start_ns >= asked,
        f"TIME-1: job {job.id} was still QUEUED behind job {ahead.id} on chip {chip} when asked at {asked} ns, yet "
        f"reports start_ns {result.start_ns}: start_ns is when the job started on its chip, not when it was submitted",
        call="calrt_job_wait (start_ns)",
        arguments=f"job {job.id}, queued behind job {ahead.id} (held {LONG_JOB_MS} ms)",
        returned=f"submit_ns {job.submit_ns}, start_ns {result.start_ns}, end_ns {result.end_ns}",
    )


@check(
    "blocked_wait_holds_no_lock",
    "while one thread is blocked in wait, other threads submit, wait, query and use KV (C ABI §8, GIL released)",
    clauses=("THREAD-2",),
)
def _blocked_wait(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    with s.configured() as rt:
        hung, _, _, _ = s.armed_prefill(rt, "hang", a)
        outcome: list[BaseException] = []

        def waiter() -> None:
            try:
                rt.wait(hung, 60)
            except CalctlError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        raw = _unwrap(rt)
        deadline = time.monotonic() + 10
        while s.native and raw._blocked == 0 and time.monotonic() < deadline:  # inside calrt_job_wait
            time.sleep(0.005)
        done = 0
        for _ in range(4):  # all of this runs while the waiter sits in the C call
            job, seq, _, _ = prefill_job(rt, pkg, b)
            expect(
                rt.wait(job, 10).ok,
                "a job on the other chip completes while a thread is blocked in wait",
                call="rt.wait",
            )
            rt.kv.commit(seq)
            rt.kv.free(seq)
            expect(not rt.query(hung).state.terminal, "the hung job is still in flight", returned=rt.query(hung))
            done += 1
        expect(
            thread.is_alive(),
            "the waiter is still blocked (it must not have returned early)",
            call="rt.wait",
            returned=outcome,
        )
        scope = s.reset_chip_or_board(rt, s.chip_of(a))
        thread.join(10)
        expect(
            not thread.is_alive() and [type(e) for e in outcome] == [JobAborted],
            "the waiter returns JobAborted after the reset",
            returned=[_returned(e) for e in outcome],
        )
    return f"{done} submit/wait/KV rounds on chip {s.chip_of(b)} while a thread was blocked in wait; released by a {scope} reset"


@check(
    "close_aborts_waiters",
    "closing the device with a thread blocked in wait aborts its job and lets it return",
    clauses=("OWN-2",),
)
def _close(s: Session) -> str:
    pkg = s.package
    outcome: list[BaseException] = []
    with s.open() as rt:
        rt.configure(rt.create_calbin(pkg))
        job, _, _, _ = s.armed_prefill(rt, "hang", pkg.models[0].alias)

        def waiter() -> None:
            try:
                rt.wait(job, 30)
            except CalctlError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.1)  # let the waiter block in wait; close must abort it whether or not it got there
    thread.join(10)
    expect(not thread.is_alive(), "the waiter returned after close", call="rt.close")
    expect(
        [type(e) for e in outcome] == [JobAborted],
        "the waiter got JobAborted",
        returned=[_returned(e) for e in outcome],
    )
    with s.open():
        pass
    return "the blocked waiter got JobAborted; the device reopened"
