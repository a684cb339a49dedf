"""Checks of jobs and buffers: ownership, states and timestamps, timeouts, wait_any, completion order, busy."""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import time
from typing import Any

import numpy as np

from calctl.runtime import Job, Runtime
from calctl.runtime.buffers import BufferState
from calctl.runtime.conformance.framework import (
    ExpectationFailed,
    Session,
    _returned,
    _unwrap,
    check,
    expect,
    expect_code,
    expect_raises,
    expect_status,
    expect_wait_error,
    golden_prompt,
    held_jobs,
    prefill_job,
    raw_call,
    raw_job_info,
    raw_submit,
    write_prefill,
)
from calctl.runtime.errors import (
    BufferInUse,
    DeviceBusy,
    InvalidCalbin,
    JobAborted,
    OutOfMemory,
    RuntimeStatus,
    Timeout,
)
from calctl.runtime.types import ChipCounters, Engine, GenerationId, Health, JobState, KvLength

_TERMINAL = list(JobState).index(JobState.SUCCEEDED)  # CALRT_JOB_SUCCEEDED and after: terminal (calrt.h order)


@check(
    "buffer_ownership",
    "a job in flight owns its buffers: release and a second submit of one are BUFFER_IN_USE until the job ends; "
    "a reset gives them back",
    clauses=("OWN-6", "RESET-1"),
)
def _buffers(s: Session) -> str:
    """Judged by what the shim answers: on a C library ``calrt_buffer_release`` of each buffer of a job in flight
    and ``calrt_job_submit`` of one in a second, otherwise valid job go straight in, past calctl's own buffer
    bookkeeping, which refuses both before the library is asked (calctl's own refusals -- a shared, released,
    mis-shaped or another graph's buffer -- are unit-tested in tests/unit/runtime/test_calctl_refusals.py)."""
    pkg = s.package
    a, _ = s.pair()
    pa = pkg.model(a).prefill.name
    prompt = golden_prompt(pkg, a)
    with s.configured() as rt:
        # the job stays in flight, owning its buffers, until a reset
        job, seq, ins, outs = s.armed_prefill(rt, "hang", a)
        detail = "in-flight buffers refused"
        if s.native:
            for what, buf in (("inputs", ins), ("outputs", outs)):
                expect_code(
                    raw_call(rt, "calrt_buffer_release", buf.native),
                    RuntimeStatus.BUFFER_IN_USE,
                    f"calrt_buffer_release of the {what} of job {job.id} in flight",
                    call="calrt_buffer_release",
                    arguments=f"<{what} of job {job.id} in flight>",
                )
            seq2 = rt.kv.allocate(a)  # a second job valid but for its buffers
            rt.kv.append(seq2, len(prompt))
            ins2, outs2 = rt.alloc_inputs(pa), rt.alloc_outputs(pa)
            write_prefill(ins2, prompt)
            for what, pair in (("inputs", (ins, outs2)), ("outputs", (ins2, outs))):
                status, _ = raw_submit(rt, pa, *pair, kv=seq2)
                expect_code(
                    status,
                    RuntimeStatus.BUFFER_IN_USE,
                    f"calrt_job_submit with the {what} of job {job.id} in flight",
                    call="calrt_job_submit",
                    arguments=f"graph={pa!r}, {what} of job {job.id}, kv=[{seq2}] reserved {len(prompt)}",
                )
            detail += " by the library (BUFFER_IN_USE 12: release and submit)"
        else:  # the mock: its bookkeeping is the runtime
            for buf in (ins, outs):
                expect_raises(BufferInUse, "rt.release_buffer (owned by a job in flight)", rt.release_buffer, buf)
            expect_raises(
                BufferInUse, "rt.submit (inputs of a job in flight)", rt.submit, pa, ins, rt.alloc_outputs(pa), kv=[seq]
            )
        scope = s.reset_chip_or_board(rt, s.chip_of(a))
        expect_raises(JobAborted, f"rt.wait (after a {scope} reset)", rt.wait, job, 10)
        rt.release_buffer(ins)  # given back by the reset: the library frees them (a FAIL names calrt_buffer_release)
        rt.release_buffer(outs)
    return detail + f"; given back by a {scope} reset"


@check(
    "job_states_timestamps",
    "job states end SUCCEEDED; submit <= start <= end on CLOCK_MONOTONIC; query and wait echo the submitted tags",
    clauses=("CONV-5", "JOB-1", "JOB-9", "OWN-9"),
)
def _timestamps(s: Session) -> str:
    """The tags are read from what the shim returns (``calrt_job_query`` and ``calrt_job_wait`` fill
    ``calrt_job_info``: generation, engine, chip mask), compared with what was submitted; never from calctl's own
    job record. Three jobs with different tags (one generation past 32 bits; PING, PONG and AUTO), on both chips
    where there are two."""
    pkg = s.package
    aliases = list(s.pair()) if len(pkg.models) > 1 else [pkg.models[0].alias]
    tags = [(GenerationId(7), Engine.PING), (GenerationId((1 << 40) + 3), Engine.PONG), (GenerationId(11), Engine.AUTO)]
    echoed = 0
    with s.configured() as rt:
        for alias, (generation, engine) in zip(aliases * 2, tags, strict=False):
            want_mask = sum(1 << c for c in pkg.model(alias).target_chips)
            want = (int(generation), engine.code, want_mask)
            t0 = time.monotonic_ns()
            job, seq, _, outputs = prefill_job(rt, pkg, alias, generation=generation, engine=engine)
            if s.native:
                for call, wait_ms in (("calrt_job_query", None), ("calrt_job_wait", 10_000)):
                    rc, info = raw_job_info(rt, job, wait_ms)
                    expect(rc == RuntimeStatus.OK, f"{call} of a fresh job answers OK", call=call, returned=rc)
                    got = (int(info.generation), int(info.engine), int(info.chip_mask))
                    expect(
                        got == want,
                        f"{call} must echo the submitted generation, engine and chip mask "
                        f"(submitted {want[0]}, {engine.value} ({want[1]}), chip mask {want_mask:#x})",
                        call=call,
                        arguments=f"job={job.id}",
                        returned=f"generation {got[0]}, engine {got[1]}, chip mask {got[2]:#x}",
                    )
                    expect(int(info.id) == job.id, f"{call} names the job it was asked for", returned=int(info.id))
                    echoed += 1
                _same_stamps(rt, job, info, t0)  # the wait's info (the job is terminal now)
            else:
                first = rt.query(job)
                expect(
                    first.state in (JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED),
                    "a fresh job is queued, running or done",
                    returned=first.state,
                )
            result = rt.wait(job, 10)
            t1 = time.monotonic_ns()
            expect(
                result.ok and result.status is RuntimeStatus.OK, "the job succeeded", call="rt.wait", returned=result
            )
            if s.native:  # calctl released the record once its wait saw the end (C ABI §5)
                rc, _ = raw_job_info(rt, job, 0)
                expect_code(
                    rc,
                    RuntimeStatus.INVALID_ARGUMENT,
                    f"OWN-9: calrt_job_wait of job {job.id}, released once its wait saw it end,",
                    call="calrt_job_wait",
                    arguments=f"job={job.id} (released), 0 ms",
                )
            start, end = result.start_ns, result.end_ns
            expect(
                start is not None and end is not None,
                "a finished job has start and end times",
                call="calrt_job_wait",
                returned=result,
            )
            assert start is not None and end is not None
            expect(
                t0 <= start <= end <= t1,
                f"times must be CLOCK_MONOTONIC ns within the call window: {t0} <= {start} <= {end} <= {t1}",
                call="calrt_job_wait",
                returned=result,
            )
            events = [e for e in rt.trace() if e.job == job.id]
            expect(bool(events), "the trace has the job", call="rt.trace")
            e = events[0]
            expect(t0 <= e.submit_ns <= start, "submit_ns precedes start_ns", call="calrt_job_wait", returned=e)
            if not s.native:  # the mock is its own runtime: its trace is what it returns
                expect(
                    (e.generation, e.engine) == (generation, engine),
                    "the trace echoes generation and engine",
                    returned=e,
                )
            expect(rt.query(job).state is JobState.SUCCEEDED, "query keeps the terminal state", returned=rt.query(job))
            n = len(golden_prompt(pkg, alias))
            expect(
                rt.kv.commit(seq) == KvLength(n, n),
                "commit after success",
                call="calrt_kv_commit",
                returned=rt.kv.length(seq),
            )
            logits = outputs.read("logits")
            expect(bool(np.isfinite(logits).all()), "logits are finite", returned=logits)
            rt.kv.free(seq)
        if s.native:
            _end_stamped_at_completion(rt, pkg, aliases[-1])
    how = f"; generation, engine and chip mask echoed by query and wait ({echoed} answers)" if s.native else ""
    return f"{len(tags)} jobs queued/running -> succeeded within their call windows" + how


def _end_stamped_at_completion(rt: Runtime, pkg: Any, alias: str) -> None:
    """CONV-5, TIME-1: ``end_ns`` is when the job ended, not when a wait saw it: a job whose end the query
    reports (polled, no wait) has its end stamp in the query's answer, before the query returned."""
    job, seq, inputs, outputs = prefill_job(rt, pkg, alias)
    give_up = time.monotonic() + 10.0
    while True:
        rc, info = raw_job_info(rt, job)
        seen = time.monotonic_ns()
        if rc != RuntimeStatus.OK or int(info.state) >= _TERMINAL or time.monotonic() > give_up:
            break
        time.sleep(0.005)
    expect(
        rc == RuntimeStatus.OK and int(info.state) >= _TERMINAL and 0 < int(info.start_ns) <= int(info.end_ns) <= seen,
        f"CONV-5: calrt_job_query of job {job.id}, polled until it ended, must report its end stamp (start <= end <= "
        f"{seen}, when the query returned), not one a later wait stamps",
        call="calrt_job_query",
        arguments=f"job={job.id} (terminal, not waited)",
        returned=f"status {rc}, state {int(info.state)}, start {int(info.start_ns)}, end {int(info.end_ns)}",
    )
    rt.wait(job, 10)
    rt.kv.free(seq)
    rt.release_buffer(inputs)
    rt.release_buffer(outputs)


def _same_stamps(rt: Runtime, job: Job, waited: Any, t0: int) -> None:
    """CONV-5, JOB-9: once a job is terminal, ``calrt_job_query`` reports the state, status and stamps
    ``calrt_job_wait`` did, inside the window since its submit, as often as it is asked (a shim whose query reads
    another job's slot, or whose wait consumed the completion the query reads, fails here)."""
    for ask in (1, 2):
        rc, info = raw_job_info(rt, job)
        expect(
            rc == RuntimeStatus.OK, "calrt_job_query of a terminal job answers OK", call="calrt_job_query", returned=rc
        )
        got_end, want_end = (int(info.state), int(info.status)), (int(waited.state), int(waited.status))
        expect(
            got_end == want_end,
            f"JOB-9: calrt_job_query of job {job.id} after its wait returned must report the state and status the "
            f"wait did (state {want_end[0]}, status {want_end[1]}), query {ask} of 2",
            call="calrt_job_query",
            arguments=f"job={job.id} (terminal, waited)",
            returned=f"state {got_end[0]}, status {got_end[1]}",
        )
    got = (int(info.submit_ns), int(info.start_ns), int(info.end_ns))
    want = (int(waited.submit_ns), int(waited.start_ns), int(waited.end_ns))
    expect(
        got == want and t0 <= got[0] <= got[1] <= got[2],
        f"calrt_job_query of terminal job {job.id} must report its own stamps, the ones calrt_job_wait returned "
        f"(submit, start, end {want}), all after its submit at {t0}",
        call="calrt_job_query",
        arguments=f"job={job.id} (terminal)",
        returned=f"submit, start, end {got}",
    )


@check(
    "wait_timeout",
    "a wait past its deadline is TIMEOUT; the job stays in flight with its buffers and KV",
    clauses=("JOB-3", "JOB-4", "JOB-8", "OWN-5", "OBS-1", "RESET-1", "CONV-5"),
)
def _wait_timeout(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    ca = s.chip_of(a)
    with s.configured() as rt:
        counted = rt.counters()[ca]
        job, seq, inputs, outputs = s.armed_prefill(rt, "hang", a)
        t0 = time.monotonic()
        expect_wait_error(rt, job, Timeout, RuntimeStatus.TIMEOUT, "0.2 s on a hung job", 0.2)
        waited = time.monotonic() - t0
        expect(
            waited >= 0.15,
            f"the wait must last its timeout (0.2 s), it returned after {waited:.3f} s",
            call="calrt_job_wait",
        )
        if s.native:  # before any query of the hung job: a query that blocks must fail here, not hang the check
            _zero_timeout_polls(s, rt, job, ca)
        expect(not rt.query(job).state.terminal, "the job is still in flight after the timeout", returned=rt.query(job))
        expect(rt.wait_any([job], 0.05) == [], "wait_any on the hung job times out empty", call="rt.wait_any")
        if s.native:
            _wait_any_lasts_its_timeout(rt, job)
        if s.native:  # the library's own ownership, past calctl's bookkeeping (C ABI §7: buffers unchanged)
            for what, buf in (("inputs", inputs), ("outputs", outputs)):
                expect_code(
                    raw_call(rt, "calrt_buffer_release", buf.native),
                    RuntimeStatus.BUFFER_IN_USE,
                    f"calrt_buffer_release of the {what} of job {job.id} after its wait timed out",
                    call="calrt_buffer_release",
                    arguments=f"<{what} of job {job.id}, still in flight>",
                )
        else:
            expect(inputs.state is BufferState.IN_FLIGHT, "the job keeps its buffers", returned=inputs.state)
        expect_raises(DeviceBusy, "rt.kv.commit (sequence being written)", rt.kv.commit, seq)
        expect_raises(DeviceBusy, "rt.reset_configuration (job in flight)", rt.reset_configuration)
        pending = rt.counters()[ca].pending
        expect(pending in (None, 1), "the chip counts one pending job", call="rt.counters", returned=pending)
        health = {h.chip: h.health for h in rt.health()}[ca]
        expect(
            health in (Health.HUNG, Health.UNKNOWN),
            "the chip reports HUNG (or unknown)",
            call="rt.health",
            returned=health,
        )
        if s.native:
            _long_timeout_not_truncated(rt, pkg, b)
        job_b, _, _, _ = prefill_job(rt, pkg, b)
        if s.native:
            _wait_any_names_the_terminal_job(rt, job, job_b)
            _poll_of_an_ended_job(rt, job_b)
        expect(rt.wait(job_b, 10).ok, "the other chip keeps working while one hangs", call="rt.wait")
        queued = prefill_job(rt, pkg, a)[0]  # behind the hung job on its chip
        queued_before = rt.query(queued).state
        scope = s.reset_chip_or_board(rt, ca)
        aborted = expect_raises(JobAborted, "rt.wait (hung job after a reset)", rt.wait, job, 5)
        expect_status(aborted, RuntimeStatus.JOB_ABORTED, "calrt_job_wait")
        expect(rt.query(job).state is JobState.ABORTED, "the hung job ends ABORTED", returned=rt.query(job))
        _aborted_job_stamped(rt, job)
        _queued_job_aborted(rt, queued, queued_before, job, scope, ca)
        health = {h.chip: h.health for h in rt.health()}[ca]
        expect(
            health in (Health.OK, Health.UNKNOWN),
            f"OBS-1: once the {scope} reset aborted hung job {job.id}, nothing hangs on chip {ca}: it must report OK "
            "again",
            call="calrt_chip_health",
            arguments=f"chip {ca}, after calrt_reset({scope.upper()})",
            returned=health,
        )
        if scope == "chip":  # a board reset may restart a shim's counters
            _aborted_counted_failed(counted, rt.counters()[ca], job, rt.query(queued).state is JobState.SUCCEEDED)
        if scope == "chip":
            expect(
                rt.kv.length(seq) == KvLength(0, 0),
                "a chip reset empties the chip's sequences",
                call="rt.kv.length",
                returned=rt.kv.length(seq),
            )
        job2, _, _, _ = prefill_job(rt, pkg, a)
        expect(rt.wait(job2, 10).ok, "the chip works again after the reset", call="rt.wait")
    return (
        f"TIMEOUT after {waited:.2f} s; job, buffers and KV kept; other chip unaffected; recovered by a {scope} reset"
    )


def _aborted_job_stamped(rt: Runtime, job: Job) -> None:
    """CONV-5: a job that ran (hung) and was aborted by a reset has ended: it reports an end stamp, submit <=
    start <= end (a shim that stamps the end in its completion path only leaves an aborted job's end at 0)."""
    r = rt.query(job)
    if r.start_ns is None:
        return  # it never ran: no run to stamp
    expect(
        r.end_ns is not None and job.submit_ns <= r.start_ns <= r.end_ns,
        f"CONV-5: job {job.id}, running (hung) when a reset aborted it, must report when it ended: submit <= start "
        "<= end",
        call="calrt_job_wait / calrt_job_query",
        arguments=f"job={job.id} (ABORTED)",
        returned=f"submit_ns {job.submit_ns}, start_ns {r.start_ns}, end_ns {r.end_ns}",
    )


def _queued_job_aborted(rt: Runtime, queued: Job, before: JobState, hung: Job, scope: str, chip: int) -> None:
    """RESET-1: a reset aborts every job of its chip, the queued ones too. A job still QUEUED behind the hung job
    when the reset was called must end ABORTED: a shim whose reset stops the running job only lets the queue run
    on, and the caller gets a success it had given up (judged only when the job was queued: a board whose other
    engine ran it past the hung job may have ended it first)."""
    if before is not JobState.QUEUED:
        return
    try:
        ended = rt.wait(queued, 10)
    except JobAborted:
        return
    raise ExpectationFailed(
        f"RESET-1: job {queued.id}, queued behind hung job {hung.id} on chip {chip} when calrt_reset({scope.upper()}) "
        f"was called, must end ABORTED: a reset aborts every job of its chips, queued ones too",
        call="calrt_reset",
        arguments=f"scope={scope}, chip={chip}",
        returned=f"job {queued.id} {ended.state.value}",
    )


def _aborted_counted_failed(before: ChipCounters, after: ChipCounters, job: Job, queued_ok: bool) -> None:
    """OBS-1: ``calrt_chip_counters`` counts a job that SUCCEEDED as finished and every other end (FAILED,
    ABORTED) as failed: the hung job a reset aborted is one more failed, no more finished, none pending; the job
    queued behind it counts by its own end."""
    if None in (before.finished, before.failed, after.pending, after.finished, after.failed):
        return  # not reported (C3): nothing to judge
    assert before.finished is not None and before.failed is not None
    ok = int(queued_ok)
    failed = 2 - ok
    expect(
        after.pending == 0 and after.finished == before.finished + ok and after.failed == before.failed + failed,
        f"OBS-1: after a reset aborted job {job.id}, chip {after.chip}'s counters must count it failed (finished "
        f"{before.finished + ok}, failed {before.failed + failed}, 0 pending)",
        call="calrt_chip_counters",
        arguments=f"chip {after.chip}",
        returned=f"pending {after.pending}, finished {after.finished}, failed {after.failed}",
    )


def _wait_any_lasts_its_timeout(rt: Runtime, hung: Job) -> None:
    """JOB-4: ``calrt_job_wait_any`` over a hung job returns TIMEOUT once its deadline passed, never before (a shim
    that hands the milliseconds to a runtime counting microseconds returns at once). A lower bound only: a loaded
    host makes the call later, never earlier."""
    raw = _unwrap(rt)
    ids, index = (ctypes.c_uint64 * 1)(hung.id), ctypes.c_uint32(7)
    t0 = time.monotonic()
    rc = int(raw._fn.calrt_job_wait_any(raw._dev, ids, 1, 200, ctypes.byref(index)))
    waited = time.monotonic() - t0
    expect(
        rc == RuntimeStatus.TIMEOUT and waited >= 0.15,
        f"JOB-4: calrt_job_wait_any over [job {hung.id} (hung)] with timeout 200 ms must return TIMEOUT after its "
        f"deadline, not before: it returned after {waited:.3f} s",
        call="calrt_job_wait_any",
        arguments=f"jobs=[{hung.id}], n=1, 200 ms",
        returned=f"status {rc}, after {waited:.3f} s",
    )


#: a wait's timeout whose deadline in ns, 4,295,000,000, does not fit 32 bits: a shim that multiplies in 32 bits
#: waits 32.7 us instead of 4.3 s (any timeout of 4,295 ms or more overflows; this one to almost nothing)
LONG_WAIT_MS = 4295


def _long_timeout_not_truncated(rt: Runtime, pkg: Any, alias: str) -> None:
    """JOB-3: a job that ends within a few ms, waited with ``LONG_WAIT_MS``: the wait returns OK once it ended.
    Evidence, not a duration: a TIMEOUT means the deadline passed before a job of milliseconds ended."""
    job, seq, _, _ = prefill_job(rt, pkg, alias)
    rc, info = raw_job_info(rt, job, LONG_WAIT_MS)
    if rc != RuntimeStatus.OK:
        rt.wait(job, 30)  # let it end before the FAIL
    expect(
        rc == RuntimeStatus.OK and int(info.state) >= _TERMINAL,
        f"JOB-3: calrt_job_wait of job {job.id} (one prefill) with timeout {LONG_WAIT_MS} ms must return OK once "
        f"the job ended, not TIMEOUT: a deadline of {LONG_WAIT_MS * 1_000_000:,} ns does not fit 32 bits",
        call="calrt_job_wait",
        arguments=f"job={job.id}, {LONG_WAIT_MS} ms",
        returned=f"status {rc}, state {int(info.state)}",
    )
    rt.wait(job, 30)
    rt.kv.free(seq)


def _wait_any_names_the_terminal_job(rt: Runtime, hung: Job, done: Job) -> None:
    """JOB-4: ``calrt_job_wait_any`` over [a hung job, a job that ends] answers index 1, the one that ended."""
    raw = _unwrap(rt)
    ids, index = (ctypes.c_uint64 * 2)(hung.id, done.id), ctypes.c_uint32(7)
    rc = int(raw._fn.calrt_job_wait_any(raw._dev, ids, 2, LONG_WAIT_MS, ctypes.byref(index)))
    expect(
        rc == RuntimeStatus.OK and index.value == 1,
        f"JOB-4: calrt_job_wait_any over [job {hung.id} (hung), job {done.id}] must answer the index of the job "
        f"that ended (1), within its {LONG_WAIT_MS} ms",
        call="calrt_job_wait_any",
        arguments=f"jobs=[{hung.id}, {done.id}], n=2, {LONG_WAIT_MS} ms",
        returned=f"status {rc}, index {index.value}",
    )


def _poll_of_an_ended_job(rt: Runtime, done: Job) -> None:
    """JOB-8: ``calrt_job_wait`` with timeout 0 is a poll: of a job that has ended it answers OK with the job's end
    (a shim that keeps CalRT's ``Wait(0)``, "no deadline", away by answering every poll TIMEOUT never lets a
    poller see a job end)."""
    rc, info = raw_job_info(rt, done, 0)
    expect(
        rc == RuntimeStatus.OK and int(info.state) >= _TERMINAL,
        f"JOB-8: calrt_job_wait with timeout 0 (a poll) of job {done.id}, which calrt_job_wait_any saw end, must "
        "answer OK with its end",
        call="calrt_job_wait",
        arguments=f"job={done.id} (ended), 0 ms",
        returned=f"status {rc}, state {int(info.state)}",
    )


#: how long a wait with timeout 0 may take before it counts as blocking (a poll returns in microseconds; the bound
#: leaves room for a loaded host's scheduler)
POLL_BOUND_S = 5.0


def _zero_timeout_polls(s: Session, rt: Runtime, job: Job, chip: int) -> None:
    """JOB-8: ``calrt_job_query`` of a job in flight answers at once, and ``calrt_job_wait`` and
    ``calrt_job_wait_any`` with timeout 0 are polls: TIMEOUT at once. A shim that passes CalRT's ``Wait(0)`` ("no
    deadline") through, or reads a query's state with it, blocks until the job ends; here that is never, so the
    calls run in a thread, and a reset releases a blocked one before the FAIL."""
    from calctl.runtime._native import lib as L

    raw = _unwrap(rt)
    got: dict[str, tuple[int, float]] = {}

    def poll() -> None:
        t = time.monotonic()
        info = L.CalrtJobInfo()
        got["calrt_job_query"] = (
            int(raw._fn.calrt_job_query(raw._dev, job.id, ctypes.byref(info))),
            time.monotonic() - t,
        )
        t = time.monotonic()
        got["calrt_job_wait"] = (
            int(raw._fn.calrt_job_wait(raw._dev, job.id, 0, ctypes.byref(info))),
            time.monotonic() - t,
        )
        ids, index = (ctypes.c_uint64 * 1)(job.id), ctypes.c_uint32()
        t = time.monotonic()
        got["calrt_job_wait_any"] = (
            int(raw._fn.calrt_job_wait_any(raw._dev, ids, 1, 0, ctypes.byref(index))),
            time.monotonic() - t,
        )

    thread = threading.Thread(target=poll, name="poll", daemon=True)
    thread.start()
    thread.join(POLL_BOUND_S)
    if thread.is_alive():  # blocked inside the library: end the job so the call returns, then report
        s.reset_chip_or_board(rt, chip)
        thread.join(POLL_BOUND_S)
    rc, took = got.get("calrt_job_query", (-1, POLL_BOUND_S))
    expect(
        rc == RuntimeStatus.OK and took < POLL_BOUND_S,
        f"JOB-8: calrt_job_query of job {job.id} in flight never blocks: it must answer OK at once",
        call="calrt_job_query",
        arguments=f"job={job.id} (hung)",
        returned=f"still blocked after {POLL_BOUND_S:g} s (returned only when a reset ended the job)"
        if rc == -1 or took >= POLL_BOUND_S
        else f"status {rc} after {took:.3f} s",
    )
    for call in ("calrt_job_wait", "calrt_job_wait_any"):
        rc, took = got.get(call, (-1, POLL_BOUND_S))
        expect(
            rc == RuntimeStatus.TIMEOUT and took < POLL_BOUND_S,
            f"JOB-8: {call} with timeout 0 on job {job.id} in flight is a poll: it must return TIMEOUT at once",
            call=call,
            arguments=f"job={job.id}, timeout_ms=0",
            returned=f"still blocked after {POLL_BOUND_S:g} s (returned only when a reset ended the job)"
            if rc == -1 or took >= POLL_BOUND_S
            else f"status {rc} after {took:.3f} s",
        )


@check("wait_any", "wait_any returns terminal jobs; concurrent waiters on two threads", clauses=("JOB-4",))
def _wait_any(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    with s.configured() as rt:
        job_a, _, _, _ = prefill_job(rt, pkg, a, generation=GenerationId(1))
        job_b, _, _, _ = prefill_job(rt, pkg, b, generation=GenerationId(2))
        done: set[int] = set()
        deadline = time.monotonic() + 20
        while len(done) < 2 and time.monotonic() < deadline:
            got = rt.wait_any([job_a, job_b], 10)
            expect(bool(got), "wait_any returned nothing within 10 s", call="rt.wait_any")
            expect(all(rt.query(j).state.terminal for j in got), "wait_any returns only terminal jobs", returned=got)
            done.update(j.id for j in got)
        expect(done == {job_a.id, job_b.id}, "both jobs came back", returned=done)
        results: dict[str, Any] = {}

        def worker(alias: str) -> None:
            try:
                job, _, _, _ = prefill_job(rt, pkg, alias)
                results[alias] = rt.wait(job, 10).ok
            except Exception as exc:  # reported below as the thread's outcome
                results[alias] = _returned(exc)

        threads = [threading.Thread(target=worker, args=(x,)) for x in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        expect(results == {a: True, b: True}, "two threads each submit and wait on their own chip", returned=results)
    return "wait_any over two chips; two concurrent waiter threads"


@check(
    "out_of_order_completion",
    "a later job on the other chip completes first; wait_any returns it alone",
    clauses=("JOB-4",),
)
def _out_of_order(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    with s.configured() as rt:
        first, _, _, _ = s.armed_prefill(rt, "hang", a)
        second, _, _, out_b = prefill_job(rt, pkg, b)
        got = rt.wait_any([first, second], 10)
        expect(
            [j.id for j in got] == [second.id],
            "only the later job is done",
            call="rt.wait_any",
            returned=[j.id for j in got],
        )
        expect(
            rt.wait(second, 10).ok and not rt.query(first).state.terminal,
            "the earlier job is still in flight",
            returned=rt.query(first),
        )
        expect(bool(np.isfinite(out_b.read("logits")).all()), "the later job's outputs are readable", returned=None)
        scope = s.reset_chip_or_board(rt, s.chip_of(a))
        expect_raises(JobAborted, "rt.wait (the earlier job after a reset)", rt.wait, first, 5)
    return f"job {second.id} completed before job {first.id}; the earlier one aborted by a {scope} reset"


@check(
    "busy_retry",
    "DEVICE_BUSY refuses a submit without taking the buffers; a retry succeeds; a full queue is DEVICE_BUSY",
    clauses=("JOB-7", "STATUS-1"),
)
def _busy(s: Session) -> str:
    pkg = s.package
    m = pkg.models[0]
    prompt = golden_prompt(pkg, m.alias)
    with s.configured() as rt:
        s.arm(rt, "busy")
        seq = rt.kv.allocate(m.alias)
        with rt.job_buffers(m.prefill.name) as (inputs, outputs):
            write_prefill(inputs, prompt)
            rt.kv.append(seq, len(prompt))
            exc = expect_raises(
                DeviceBusy, "rt.submit (armed busy)", rt.submit, m.prefill.name, inputs, outputs, kv=[seq]
            )
            expect_status(exc, RuntimeStatus.DEVICE_BUSY, "calrt_job_submit")
            expect(
                inputs.state is BufferState.OWNED_BY_CALLER,
                "a refused submit leaves the buffers with the caller",
                returned=inputs.state,
            )
            expect(
                rt.wait(rt.submit(m.prefill.name, inputs, outputs, kv=[seq]), 10).ok,
                "the retry succeeds",
                call="rt.wait",
            )
    done = "BUSY (1) left buffers with the caller; the retry succeeded"
    return done + ("; " + _queue_full(s) if s.native else "")


#: the most jobs ``busy_retry`` queues behind a hung job looking for the end of the chip's queue
QUEUE_PROBE_JOBS = 256


def _queue_full(s: Session) -> str:
    """JOB-7, STATUS-1 on the library's own queue, not the test hook: behind a hung job, prefills are queued on its
    chip straight into ``calrt_job_submit`` until the library refuses one. A full queue is DEVICE_BUSY (back off
    and retry), never another code: a shim that reports the queue entry it could not get as OUT_OF_MEMORY makes
    calctl fail the request instead of retrying it. The model gets enough KV sequences in the calbin descriptor to
    fill a queue (the sample packages hold 16); a queue deeper than ``QUEUE_PROBE_JOBS`` is not reached."""
    pkg = s.package
    a = pkg.models[0].alias
    m, chip = pkg.model(a), s.chip_of(a)
    deep = dataclasses.replace(
        pkg,
        models=tuple(
            dataclasses.replace(x, kv=dataclasses.replace(x.kv, max_sequences=QUEUE_PROBE_JOBS + 1))
            if x.alias == a
            else x
            for x in pkg.models
        ),
    )
    prompt = golden_prompt(pkg, a)
    with s.open() as rt:
        try:
            rt.configure(rt.create_calbin(deep))
        except (InvalidCalbin, OutOfMemory) as exc:  # a runtime that sizes its pools from its own calbin
            return f"queue depth not probed: a calbin descriptor giving {a} {QUEUE_PROBE_JOBS + 1} KV sequences refused ({exc})"
        hung = s.armed_prefill(rt, "hang", a)[0]
        status, queued = int(RuntimeStatus.OK), 0
        while queued < QUEUE_PROBE_JOBS:
            seq = rt.kv.allocate(a)
            inputs, outputs = rt.alloc_inputs(m.prefill.name), rt.alloc_outputs(m.prefill.name)
            write_prefill(inputs, prompt)
            rt.kv.append(seq, len(prompt))
            status, _ = raw_submit(rt, m.prefill.name, inputs, outputs, kv=seq)
            if status != RuntimeStatus.OK:
                break
            queued += 1
        s.reset_chip_or_board(rt, chip)
    if status == RuntimeStatus.OK:
        return f"{queued} jobs queued behind a hung job without a refusal (the queue's end not reached)"
    expect_code(
        status,
        RuntimeStatus.DEVICE_BUSY,
        f"JOB-7: calrt_job_submit of one more prefill on chip {chip}, whose queue holds hung job {hung.id} and "
        f"{queued} jobs behind it, is a full queue: it",
        call="calrt_job_submit",
        arguments=f"graph={m.prefill.name!r}, {queued + 1} jobs in flight on chip {chip}",
    )
    return f"a full queue on chip {chip} ({queued + 1} jobs in flight) refused with DEVICE_BUSY (1)"


#: how long the ``delay_ms`` test hook holds the job that ``query_while_computing`` asks about while it computes
COMPUTING_MS = 800
#: tries before a query that came back only when its job ended counts as blocking (a loaded host stalls one call for
#: most of a job's run now and then, not every try)
QUERY_TRIES = 2


@check(
    "query_while_computing",
    "calrt_job_query of a job that computes answers at once (RUNNING), not when the job ends",
    clauses=("JOB-8",),
    native_only=True,
)
def _query_while_computing(s: Session) -> str:
    """JOB-8 for a job that computes. ``wait_timeout`` polls a hung job, which never computes: a shim whose query
    waits for the chip's compute lock answers that one at once and blocks on every job that does work. Here a
    prefill is held ~0.8 s by the ``delay_ms`` hook and polled from its submit: a query that never blocks answers
    QUEUED, then RUNNING long before the job ends. One that answers a terminal state after most of the job's run,
    for a job that ended after the query was called, waited for it; that in every one of ``QUERY_TRIES`` tries is
    the FAIL."""
    pkg = s.package
    a, _ = s.pair()
    with s.configured() as rt:
        blocked: list[str] = []
        for _ in range(QUERY_TRIES):
            with held_jobs(rt, COMPUTING_MS):
                job, seq, _, _ = prefill_job(rt, pkg, a)
                deadline = time.monotonic() + 10
                while True:  # polls while queued; the first answer past QUEUED is the one judged
                    called = time.monotonic_ns()
                    seen = rt.query(job)
                    took = (time.monotonic_ns() - called) / 1e9
                    if seen.state is not JobState.QUEUED or time.monotonic() > deadline:
                        break
                    time.sleep(0.002)
            end = rt.wait(job, 30)
            expect(end.ok, f"the {a} prefill held {COMPUTING_MS} ms succeeds", call="rt.wait", returned=end.state)
            rt.kv.free(seq)
            ended = end.end_ns if end.end_ns is not None else 0
            if not (seen.state.terminal and ended > called and took > COMPUTING_MS / 4000):
                return (
                    f"job {job.id} computing ({COMPUTING_MS} ms held): the query answered {seen.state.name} "
                    f"in {took * 1000:.1f} ms"
                )
            blocked.append(
                f"{seen.state.name} after {took:.3f} s, the job ending {(ended - called) / 1e9:.3f} s after the call"
            )
    raise ExpectationFailed(
        f"JOB-8: calrt_job_query of a job that computes ({COMPUTING_MS} ms held by delay_ms) never blocks: it must "
        "answer RUNNING at once, not the job's end once it came",
        call="calrt_job_query",
        arguments=f"job={job.id} (computing)",
        returned=f"in each of {QUERY_TRIES} tries: " + "; ".join(blocked),
    )
