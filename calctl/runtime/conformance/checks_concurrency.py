"""Checks of concurrency: two chips at once, two jobs in flight on a chip, waits that hold no lock, close."""

from __future__ import annotations

import threading
import time

import numpy as np

from calctl.errors import CalctlError
from calctl.runtime.conformance.framework import (
    Session,
    _overlap_ns,
    _returned,
    _unwrap,
    check,
    expect,
    prefill_job,
)
from calctl.runtime.errors import (
    DeviceBusy,
    JobAborted,
)
from calctl.runtime.types import Engine


@check(
    "concurrent_submit_two_chips",
    "two threads submit and wait on two chips at once: all succeed, no crosstalk, overlap measured",
)
def _concurrent(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    rounds = 12
    with s.configured() as rt:
        errors: list[str] = []
        outputs: dict[str, list[np.ndarray]] = {a: [], b: []}
        barrier = threading.Barrier(2)

        def worker(alias: str) -> None:
            try:
                barrier.wait(10)
                for _ in range(rounds):
                    job, seq, _, out = prefill_job(rt, pkg, alias)
                    result = rt.wait(job, 10)
                    if not result.ok:
                        errors.append(f"{alias}: job {job.id} {result.state.value}")
                    outputs[alias].append(out.read("logits").copy())
                    rt.kv.free(seq)
            except Exception as exc:  # a thread-safety failure is the finding
                errors.append(f"{alias}: {_returned(exc)}")

        t0 = time.monotonic_ns()
        threads = [threading.Thread(target=worker, args=(x,)) for x in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        expect(
            not errors,
            f"{len(errors)} failures under concurrent submit",
            call="rt.submit / rt.wait from two threads",
            returned=errors[:3],
        )
        for alias, outs in outputs.items():
            expect(
                len(outs) == rounds and all(np.array_equal(outs[0], o) for o in outs),
                f"{alias}: every round gives the same logits (no crosstalk)",
                returned=len(outs),
            )
        events = [e for e in rt.trace(since_ns=t0) if e.start_ns and e.end_ns]
        ca, cb = s.chip_of(a), s.chip_of(b)
        ia = [(int(e.start_ns or 0), int(e.end_ns or 0)) for e in events if e.chip == ca]
        ib = [(int(e.start_ns or 0), int(e.end_ns or 0)) for e in events if e.chip == cb]
        busy_a = sum(e - s_ for s_, e in ia)
        overlap = _overlap_ns(ia, ib)
        s.evidence.update(
            rounds=rounds, jobs=2 * rounds, overlap_ms=overlap / 1e6, chip_a_busy_ms=busy_a / 1e6, chips=[ca, cb]
        )
    return f"{2 * rounds} jobs from two threads, no error; chips {ca}/{cb} overlapped {overlap / 1e6:.1f} ms"


@check("two_in_flight_one_chip", "a PING and a PONG job are both accepted on one chip and complete in order")
def _two_in_flight(s: Session) -> str:
    pkg = s.package
    m = pkg.models[0]
    pairs, best = 3, 0  # the largest overlap of three PING/PONG pairs: one late thread wake must not decide
    with s.configured() as rt:
        for _ in range(pairs):
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
        s.evidence.update(max_in_flight=2 if best > 0 else 1, overlap_ms=best / 1e6, chip=m.target_chips[0])
    mode = "two in flight" if best > 0 else "serialised"
    return f"{pairs} pairs accepted and completed in order; largest overlap {best / 1e6:.2f} ms ({mode})"


@check(
    "blocked_wait_holds_no_lock",
    "while one thread is blocked in wait, other threads submit, wait, query and use KV (C ABI §8, GIL released)",
)
def _blocked_wait(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    with s.configured() as rt:
        s.arm(rt, "hang")
        hung, _, _, _ = prefill_job(rt, pkg, a)
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


@check("close_aborts_waiters", "closing the device with a thread blocked in wait aborts its job and lets it return")
def _close(s: Session) -> str:
    pkg = s.package
    outcome: list[BaseException] = []
    with s.open() as rt:
        rt.configure(rt.create_calbin(pkg))
        s.arm(rt, "hang")
        job, _, _, _ = prefill_job(rt, pkg, pkg.models[0].alias)

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
