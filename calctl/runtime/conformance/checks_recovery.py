"""Checks of a board under stress a shim under deadline gets subtly wrong: sequences a job in flight is writing
(KV-3), a hung job held past any plausible shim watchdog (JOB-6), and a reset while a job computes and moves data,
on each chip in turn (RESET-3). Each judges what the library answers, straight through the C ABI where calctl's own
bookkeeping would refuse first.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from typing import Any

import numpy as np

from calctl.runtime import Job, Runtime
from calctl.runtime.conformance.framework import (
    ConformanceLevel,
    ExpectationFailed,
    Session,
    Unsupported,
    _unwrap,
    check,
    decode_mask,
    expect,
    expect_code,
    expect_raises,
    golden_prompt,
    prefill_job,
    raw_call,
    raw_job_info,
    raw_submit,
    write_decode,
    write_prefill,
)
from calctl.runtime.errors import DeviceBusy, InvalidArgument, JobAborted, NotSupported, RuntimeStatus, Timeout
from calctl.runtime.types import Engine, JobState, KvSeqId

# 001 §11.1: a watchdog that ends a hung job is the runtime's to report as a failure; a shim's own watchdog of a
# few seconds is the plausible bug, so standard/long hold the job well past it.
HUNG_HOLD_S = {ConformanceLevel.QUICK: 1.0, ConformanceLevel.STANDARD: 10.0, ConformanceLevel.LONG: 60.0}
_SUCCEEDED = list(JobState).index(JobState.SUCCEEDED)  # CALRT_JOB_SUCCEEDED (declaration order, calrt.h)
_KV_CALLS = (
    "calrt_kv_free",
    "calrt_kv_append",
    "calrt_kv_commit",
    "calrt_kv_rollback",
    "calrt_kv_remove_tokens_at_end",
)


def _kv_call(rt: Runtime, name: str, seq: int) -> int:
    """One KV call straight into the library with the arguments it takes (its status)."""
    if name == "calrt_kv_append":
        return raw_call(rt, name, seq, 1, ctypes.byref(ctypes.c_uint32()))
    if name == "calrt_kv_remove_tokens_at_end":
        return raw_call(rt, name, seq, 1)
    return raw_call(rt, name, seq)


@check(
    "kv_busy_in_flight",
    "every KV call on a sequence a job in flight is writing is DEVICE_BUSY; a freed sequence is not found",
    clauses=("KV-3", "KV-5", "STATUS-1"),
)
def _kv_busy(s: Session) -> str:
    """A hung prefill keeps its sequence written; free, append, commit, rollback and remove-tail on it go straight
    into the library (calctl refuses them itself) and must be DEVICE_BUSY, never OK: a shim that frees a sequence
    its job is writing lets the job's DMA write KV memory another sequence gets next. A second job naming the
    sequence is refused too. After the reset the sequence frees, and a second free is INVALID_ARGUMENT."""
    pkg = s.package
    a, b = s.pair()
    with s.configured() as rt:
        job, seq, _, _ = s.armed_prefill(rt, "hang", a)
        if s.native:
            for name in _KV_CALLS:
                expect_code(
                    _kv_call(rt, name, int(seq)),
                    RuntimeStatus.DEVICE_BUSY,
                    f"{name} of sequence {seq} while job {job.id} in flight writes it",
                    call=name,
                    arguments=f"seq={seq} (written by job {job.id}, in flight)",
                )
            inputs, outputs = rt.alloc_inputs(pkg.model(a).prefill.name), rt.alloc_outputs(pkg.model(a).prefill.name)
            write_prefill(inputs, golden_prompt(pkg, a))
            status, second = raw_submit(rt, pkg.model(a).prefill.name, inputs, outputs, kv=seq)
            # C ABI §4: an object still in use is DEVICE_BUSY ("back off"); INVALID_ARGUMENT tells the caller its
            # request is wrong, and calctl's engine fails the request instead of retrying it (STATUS-1)
            expect(
                status == RuntimeStatus.DEVICE_BUSY,
                f"calrt_job_submit of a second job on sequence {seq}, which job {job.id} in flight writes, must be "
                "refused with DEVICE_BUSY (1)",
                call="calrt_job_submit",
                arguments=f"kv=[{seq}] (written by job {job.id})",
                returned=f"status {status}" + (f", job {second} accepted" if second else ""),
            )
            queued, queued_seq, _, _ = prefill_job(rt, pkg, a)
            _queued_job_sequence_busy(rt, job, queued, int(queued_seq))
        else:
            for name, fn in (("free", rt.kv.free), ("commit", rt.kv.commit), ("rollback", rt.kv.rollback)):
                expect_raises(DeviceBusy, f"rt.kv.{name} (sequence written by a job in flight)", fn, seq)
        s.reset_chip_or_board(rt, s.chip_of(a))
        expect_raises(JobAborted, "rt.wait (after the reset)", rt.wait, job, 10)
        if s.native:
            expect_code(
                _kv_call(rt, "calrt_kv_free", int(seq)), RuntimeStatus.OK, "calrt_kv_free after the reset",
                call="calrt_kv_free", arguments=f"seq={seq}",
            )  # fmt: skip
            expect_code(
                _kv_call(rt, "calrt_kv_free", int(seq)),
                RuntimeStatus.INVALID_ARGUMENT,
                f"a second calrt_kv_free of sequence {seq}",
                call="calrt_kv_free",
                arguments=f"seq={seq} (freed)",
            )
        else:
            rt.kv.free(seq)
            expect_raises(InvalidArgument, "rt.kv.free (freed twice)", rt.kv.free, seq)
        if s.native:
            _decode_sequence_busy(s, rt, b)
    return f"{len(_KV_CALLS)} KV calls on a sequence being written: DEVICE_BUSY (1); freed twice: INVALID_ARGUMENT (10)"


def _hung_decode(s: Session, rt: Runtime, alias: str) -> tuple[Job, KvSeqId]:
    """A decode step of a committed ``alias`` sequence, held by the hang hook: (the job, its sequence). Its buffers
    stay the job's until a reset ends it (the session's close gives them back)."""
    pkg = s.package
    m = pkg.model(alias)
    job, seq, _, outputs = prefill_job(rt, pkg, alias)
    expect(rt.wait(job, 10).ok, f"a {alias} prefill succeeds", call="rt.wait")
    rt.kv.commit(seq)
    token = int(np.argmax(outputs.read("logits")[0]))
    inputs, outs = rt.alloc_inputs(m.decode.name), rt.alloc_outputs(m.decode.name)
    write_decode(inputs, token, rt.kv.append(seq, 1), mask=decode_mask(pkg, alias))
    s.arm(rt, "hang")
    return rt.submit(m.decode.name, inputs, outs, kv=[seq]), seq


def _decode_sequence_busy(s: Session, rt: Runtime, alias: str) -> None:
    """KV-3 for a decode: a committed sequence's decode step is held by the hang hook; the five KV calls on its
    sequence must be DEVICE_BUSY (a shim that marks sequences on its prefill path only lets the caller free or
    shorten the sequence a decode is writing). A reset of the chip then aborts the decode."""
    decode, seq = _hung_decode(s, rt, alias)
    statuses = {name: _kv_call(rt, name, int(seq)) for name in _KV_CALLS}
    s.reset_chip_or_board(rt, s.chip_of(alias))
    with contextlib.suppress(JobAborted):
        rt.wait(decode, 10)
    for name, status in statuses.items():
        expect_code(
            status,
            RuntimeStatus.DEVICE_BUSY,
            f"{name} of sequence {seq} while decode job {decode.id} in flight writes it",
            call=name,
            arguments=f"seq={seq} (written by decode job {decode.id}, in flight)",
        )


def _queued_job_sequence_busy(rt: Runtime, hung: Job, queued: Job, seq: int) -> None:
    """KV-3 for a job that waits: a prefill submitted behind the hung job on its chip is in flight from its submit,
    queued, and its sequence is the job's from then on. A shim that marks a sequence when a worker starts the job
    lets the caller free it, append to it or shorten it before the job writes it. Judged only while the queued job
    is still in flight (a board whose other engine ran it at once ended it, and then the calls are the caller's)."""
    statuses = {name: _kv_call(rt, name, seq) for name in _KV_CALLS}
    if rt.query(queued).state.terminal:
        return
    for name, status in statuses.items():
        expect_code(
            status,
            RuntimeStatus.DEVICE_BUSY,
            f"{name} of sequence {seq} while job {queued.id}, queued behind hung job {hung.id} on its chip, is to "
            "write it",
            call=name,
            arguments=f"seq={seq} (job {queued.id} queued)",
        )


@check(
    "hung_job_held",
    "a hung job held past any shim watchdog (10 s at --level standard, 60 s at long) never ends SUCCEEDED",
    clauses=("JOB-6", "CONV-2"),
    seconds={ConformanceLevel.STANDARD: 60.0, ConformanceLevel.LONG: 120.0},
)
def _hung_held(s: Session) -> str:
    """A prefill on one chip and (C shims) a decode on the other hang (the test hook); each wait is asked every
    0.5 s for ``HUNG_HOLD_S`` s. A job may stay in flight (TIMEOUT) or end FAILED/ABORTED with a status; ending
    SUCCEEDED means the shim reported a job done that wrote nothing (a watchdog that ends hung jobs as successes,
    001 §11.1; one tuned for short decode steps shows on the decode only). A reset then aborts them."""
    a, b = s.pair()
    hold = HUNG_HOLD_S[s.level]
    with s.configured() as rt:
        held_jobs = [(s.armed_prefill(rt, "hang", a)[0], a, "prefill")]
        if s.native:
            held_jobs.append((_hung_decode(s, rt, b)[0], b, "decode"))
        t0 = time.monotonic()
        ended: dict[int, str] = {}
        while time.monotonic() - t0 < hold and len(ended) < len(held_jobs):
            for job, _, kind in held_jobs:
                if job.id not in ended:
                    if s.native:
                        _wait_hung_native(rt, job, kind, t0, ended, 500 // len(held_jobs))
                    else:
                        _wait_hung_mock(rt, job)
        held = time.monotonic() - t0
        for chip in sorted({s.chip_of(alias) for _, alias, _ in held_jobs}):
            s.reset_chip_or_board(rt, chip)
        for job, _, kind in held_jobs:
            if job.id not in ended:
                expect_raises(JobAborted, f"rt.wait (the hung {kind} after a reset)", rt.wait, job, 10)
    s.evidence["held_s"] = round(held, 2)
    said = [f"{kind} job {job.id}: {ended.get(job.id, 'in flight (TIMEOUT), then ABORTED by the reset')}"
            for job, _, kind in held_jobs]  # fmt: skip
    return f"held {held:.1f} s: " + "; ".join(said)


def _wait_hung_native(rt: Runtime, job: Job, kind: str, t0: float, ended: dict[int, str], wait_ms: int) -> None:
    """One bounded wait on a hung job through the C ABI: TIMEOUT with its info filled (CONV-2), or an end that is
    not SUCCEEDED (recorded in ``ended``)."""
    rc, info = raw_job_info(rt, job, wait_ms)
    if rc == RuntimeStatus.OK:
        expect(
            int(info.state) != _SUCCEEDED,
            f"a hung {kind} job (job {job.id}) ended SUCCEEDED after {time.monotonic() - t0:.1f} s with nothing "
            "written: a watchdog must end it FAILED/ABORTED with a status, or leave it to a reset",
            call="calrt_job_wait",
            arguments=f"job={job.id}, {wait_ms} ms",
            returned=f"state {int(info.state)} status {int(info.status)}",
        )
        ended[job.id] = f"ended state {int(info.state)} status {int(info.status)}"
        return
    expect_code(rc, RuntimeStatus.TIMEOUT, "calrt_job_wait on a hung job", call="calrt_job_wait")
    expect(  # C ABI §3: calrt_job_wait fills calrt_job_info on TIMEOUT too
        int(info.id) == job.id and int(info.state) < _SUCCEEDED,
        f"CONV-2: calrt_job_wait that timed out must fill calrt_job_info with job {job.id} still in flight",
        call="calrt_job_wait",
        arguments=f"job={job.id}, {wait_ms} ms",
        returned=f"id {int(info.id)}, state {int(info.state)}",
    )


def _wait_hung_mock(rt: Runtime, job: Job) -> None:
    try:
        rt.wait(job, 0.5)
    except Timeout:
        return
    raise ExpectationFailed("a hung job ended SUCCEEDED", call="rt.wait", returned=repr(rt.query(job)))


@check(
    "reset_drains_jobs",
    "a reset while jobs compute returns with its chip idle; the aborted jobs' buffers are never written afterwards",
    clauses=("RESET-3", "RESET-1", "RESET-4", "RESET-5", "OBS-1", "CONV-5"),
)
def _reset_drains(s: Session) -> str:
    """Jobs are queued on one chip (each slowed to 200 ms by the test hook where the library has it) and a reset
    is issued while the first computes. When it returns, every job must be terminal and the chip's pending count
    0; the aborted jobs' outputs are then overwritten with a sentinel and read again after the jobs' own time has
    passed: a shim whose reset returns early lets the aborted job's DMA write memory the caller owns again. On each
    chip in turn (a drain that waits on one chip's workers only shows on the other), then with a board reset (a
    board reset that only flags its chips shows there).

    Before each reset the chip's pending count must cover every job still in flight after it was read, the queued
    ones too (OBS-1); after it, a job of the chip must compute exactly what the same job computed before the reset
    (a chip reset keeps the configuration, RESET-5) and be stamped on CLOCK_MONOTONIC inside its calls (CONV-5: a
    shim whose device clock restarts at a reset reports times from before the job was submitted)."""
    a, b = s.pair()
    runs = [(a, b, False), (b, a, False), (a, b, True)]  # and a board reset (its drain may be another path)
    return "; ".join(_reset_drains_on(s, x, y, board=board) for x, y, board in runs)


def _reset_drains_on(s: Session, a: str, b: str, *, board: bool) -> str:
    pkg = s.package
    ca = s.chip_of(a)
    with s.configured() as rt:
        before = _prefill_logits(rt, pkg, a)  # what the chip computes before the reset
        slowed = _slow_jobs(s, rt, 200)
        # without the hook, a queue of jobs at the board's own speed, so that some are still in flight at the reset
        n = 4 if slowed else max(4, min(16, pkg.model(a).kv.max_sequences - 1))
        jobs = [prefill_job(rt, pkg, a, engine=(Engine.PING, Engine.PONG)[i % 2]) for i in range(n)]
        bystander = prefill_job(rt, pkg, b)  # on the other chip: a chip reset must leave it running
        if slowed:  # into the first job's transfers and compute
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and rt.query(jobs[0][0]).state is JobState.QUEUED:
                time.sleep(0.001)
            time.sleep(0.02)
        _pending_covers_in_flight(rt, ca, [j for j, _, _, _ in jobs])
        if board:
            rt.reset("board")
            rt.configure(rt.create_calbin(pkg))
            scope = "board"
        else:
            scope = s.reset_chip_or_board(rt, ca)
        states = [rt.query(j).state for j, _, _, _ in jobs]
        expect(
            all(st.terminal for st in states),
            f"every job of chip {ca} is terminal when the {scope} reset returns",
            call="calrt_reset",
            returned=[st.value for st in states],
        )
        pending = {c.chip: c.pending for c in rt.counters()}.get(ca)
        expect(pending in (None, 0), f"chip {ca} has no job pending after the reset", call="calrt_chip_counters",
               returned=pending)  # fmt: skip
        aborted = [(j, out) for (j, _, _, out), st in zip(jobs, states, strict=True) if st is JobState.ABORTED]
        vocab = int(np.prod(aborted[0][1].layout.slot("logits").shape)) if aborted else 0
        sentinel = np.full(aborted[0][1].layout.slot("logits").shape, 12345.0, np.float32) if aborted else None
        for _, out in aborted:
            out.write("logits", sentinel)
        time.sleep(0.5 if slowed else 0.1)  # past the slowed jobs' own time
        if slowed:
            _slow_jobs(s, rt, 0)
        for j, out in aborted:
            got = out.read("logits")
            written = int((got != sentinel).sum())
            expect(
                written == 0,
                f"job {j.id} was aborted by a {scope} reset of chip {ca}, yet {written} of {vocab} logits of its "
                "outputs were written after calrt_reset returned: the reset returned while the job still ran",
                call="calrt_reset",
                arguments=f"scope={scope}, chip={ca}",
                returned=f"{written} values written after the reset",
            )
        if scope == "chip":  # 001 §11.3: a chip reset is the chip's; the other chip's job runs on to success
            try:
                survived = rt.wait(bystander[0], 10)
            except JobAborted as exc:
                raise ExpectationFailed(
                    f"a reset of chip {ca} aborted job {bystander[0].id} on chip {s.chip_of(b)}: a chip reset must "
                    "leave the other chips' jobs running (or the library must refuse CALRT_RESET_CHIP as NOT_SUPPORTED)",
                    call="calrt_reset",
                    arguments=f"scope=chip, chip={ca}",
                    returned=f"job {bystander[0].id} on chip {s.chip_of(b)}: {exc}",
                ) from None
            expect(survived.ok, f"the job on chip {s.chip_of(b)} succeeds", call="rt.wait", returned=survived.state)
        else:
            with contextlib.suppress(JobAborted):  # a board reset aborts it: either end is right
                rt.wait(bystander[0], 10)
        _same_after_reset(rt, pkg, a, before, f"a {scope} reset of chip {ca}")
    how = "slowed to 200 ms each" if slowed else "at the board's own speed"
    if not aborted:  # the clause was not tried: every job had ended before the reset
        raise Unsupported(
            f"all {len(jobs)} jobs ({how}) had ended before the {scope} reset: nothing to abort (the library lacks "
            "the calrt_ext_fault_set delay hook that keeps a job running)"
        )
    return (
        f"chip {ca}: {len(aborted)} of {len(jobs)} jobs ({how}) aborted by a {scope} reset, buffers untouched after it"
    )


def _prefill_logits(rt: Runtime, pkg: Any, alias: str) -> np.ndarray:
    """The logits of ``alias``'s golden prefill, its sequence and buffers given back."""
    job, seq, inputs, outputs = prefill_job(rt, pkg, alias)
    expect(rt.wait(job, 10).ok, f"a {alias} prefill succeeds", call="rt.wait")
    logits = outputs.read("logits").copy()
    rt.kv.free(seq)
    rt.release_buffer(inputs)
    rt.release_buffer(outputs)
    return logits


def _pending_covers_in_flight(rt: Runtime, chip: int, jobs: list[Job]) -> None:
    """OBS-1: ``calrt_chip_counters`` counts every job in flight on the chip as pending, queued ones too. Read
    first, then the jobs' states: a job still in flight at the later query was in flight at the count, so the
    count is at least that many, however the host schedules the two calls (a shim that counts the busy engines
    only reports fewer)."""
    pending = {c.chip: c.pending for c in rt.counters()}.get(chip)
    in_flight = sum(not rt.query(j).state.terminal for j in jobs)
    expect(
        pending is None or pending >= in_flight,
        f"OBS-1: chip {chip}'s counters must count every job in flight pending, queued ones too: {in_flight} of "
        f"its jobs were still in flight after calrt_chip_counters reported {pending} pending",
        call="calrt_chip_counters",
        arguments=f"chip {chip}",
        returned=f"pending {pending}",
    )


def _same_after_reset(rt: Runtime, pkg: Any, alias: str, before: np.ndarray, what: str) -> None:
    """After ``what``: ``alias``'s golden prefill computes exactly what it computed before (RESET-5: a chip reset
    keeps the configuration; a shim whose reset clears the chip's memory loads the weights again) and is stamped on
    CLOCK_MONOTONIC inside its calls, submit <= start <= end (CONV-5: a device clock that restarts at a reset,
    converted with the offset taken at open, stamps the job before it was submitted)."""
    t0 = time.monotonic_ns()
    job, seq, inputs, outputs = prefill_job(rt, pkg, alias)
    result = rt.wait(job, 10)
    t1 = time.monotonic_ns()
    expect(result.ok, f"the chip works after {what}", call="rt.wait", returned=result.state)
    after = outputs.read("logits")
    if not np.array_equal(after, before):
        raise ExpectationFailed(
            f"RESET-5: after {what}, {alias}'s golden prefill computes other logits than before it (max |diff| "
            f"{float(np.abs(after - before).max()):.3g}): a chip reset must keep the configuration, weights included",
            call="calrt_job_submit / calrt_job_wait (after calrt_reset)",
            arguments=f"graph={pkg.model(alias).prefill.name!r}, the golden prompt",
            returned=f"logits {_first_values(after)} (before the reset {_first_values(before)})",
        )
    start, end = result.start_ns, result.end_ns
    expect(
        start is not None and end is not None and t0 <= job.submit_ns <= start <= end <= t1,
        f"CONV-5: after {what}, job {job.id}'s times must be CLOCK_MONOTONIC ns within its calls: "
        f"{t0} <= submit {job.submit_ns} <= start {start} <= end {end} <= {t1}",
        call="calrt_job_wait (after calrt_reset)",
        arguments=f"job={job.id}",
        returned=f"submit_ns {job.submit_ns}, start_ns {start}, end_ns {end}",
    )
    rt.kv.free(seq)
    rt.release_buffer(inputs)
    rt.release_buffer(outputs)


def _first_values(logits: np.ndarray) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in logits.reshape(-1)[:4]) + ", ...]"


def _slow_jobs(s: Session, rt: Runtime, delay_ms: int) -> bool:
    """Every job takes ``delay_ms`` more (the test hook's ``delay_ms``); False where the library lacks the hook."""
    if not s.native:
        return False
    try:
        _unwrap(rt).arm_test_fault("delay_ms", delay_ms)
    except NotSupported:
        return False
    return True
