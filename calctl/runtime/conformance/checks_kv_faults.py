"""Checks of KV sequences, faults, memory and resets."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from calctl.package.model import Package
from calctl.runtime import Job, Runtime
from calctl.runtime.buffers import BufferState, HostBuffer
from calctl.runtime.conformance.framework import (
    ExpectationFailed,
    Session,
    Unsupported,
    _returned,
    _unwrap,
    check,
    decode_mask,
    expect,
    expect_code,
    expect_raises,
    expect_status,
    expect_submit_refused,
    expect_wait_error,
    golden_prompt,
    prefill_job,
    raw_call,
    raw_job_info,
    raw_submit,
    write_decode,
    write_prefill,
)
from calctl.runtime.errors import (
    AlreadyConfigured,
    BufferInUse,
    CcuException,
    DeviceLost,
    InvalidArgument,
    InvalidCalbin,
    NotSupported,
    RuntimeLayerError,
    RuntimeStatus,
    UnknownDmaState,
)
from calctl.runtime.types import ChipCounters, ChipMemory, Health, JobState, KvLength, KvSeqId, ResetScope


@check(
    "kv_lifecycle",
    "KV: capacity per model, allocate / append / commit / rollback / remove-tail / free",
    clauses=("KV-1", "KV-4", "KV-5", "KV-7", "KV-8", "KV-9", "CONV-2"),
)
def _kv(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    mb = pkg.model(b)
    cap = mb.kv.max_sequences
    with s.configured() as rt:
        expect(
            rt.kv.can_allocate(b, cap) and not rt.kv.can_allocate(b, cap + 1),
            f"can_allocate answers the capacity {cap}",
            call="rt.kv.can_allocate",
        )
        seqs = [rt.kv.allocate(b) for _ in range(cap)]
        expect(len(set(seqs)) == cap, "every sequence id is distinct", returned=seqs)
        expect(rt.kv.can_allocate(a, 1), "one namespace per model", call="rt.kv.can_allocate", arguments=repr(a))
        expect_raises(RuntimeLayerError, "rt.kv.allocate (beyond capacity)", rt.kv.allocate, b)
        rt.kv.free(seqs[0])
        expect(rt.kv.can_allocate(b, 1), "a freed sequence is capacity again", call="rt.kv.can_allocate")
        expect_raises(InvalidArgument, "rt.kv.allocate (unknown model)", rt.kv.allocate, a + "-no-such-model")
        for q in seqs[1:]:
            rt.kv.free(q)
        job, seq, _, outputs = prefill_job(rt, pkg, a)
        rt.wait(job, 10)
        n = rt.kv.commit(seq).committed
        _prefill_on_used_refused(s, rt, a, seq)
        if s.native:
            _prefill_short_of_reservation(rt, pkg, a)
        token = int(np.argmax(outputs.read("logits")[0]))
        decode = pkg.model(a).decode.name
        with rt.job_buffers(decode) as (inputs, outs):
            pos = rt.kv.append(seq, 1)
            expect(pos == n, "append reserves at the committed length", call="rt.kv.append", returned=pos)
            write_decode(
                inputs, token, n + 1, mask=decode_mask(pkg, a)
            )  # wrong: the position must be the committed length (000 §9.2)
            expect_raises(
                InvalidArgument,
                "rt.submit (decode position != committed length)",
                rt.submit,
                decode,
                inputs,
                outs,
                kv=[seq],
            )
            expect(
                rt.kv.rollback(seq) == KvLength(n, n),
                "rollback drops the reservation",
                call="rt.kv.rollback",
                returned=rt.kv.length(seq),
            )
            rt.kv.append(seq, 1)
            write_decode(inputs, token, n, mask=decode_mask(pkg, a))
            rt.wait(rt.submit(decode, inputs, outs, kv=[seq]), 10)
            expect(
                rt.kv.commit(seq) == KvLength(n + 1, n + 1),
                "commit after the decode",
                call="rt.kv.commit",
                returned=rt.kv.length(seq),
            )
        _remove_tail_refused_while_reserved(s, rt, seq)
        expect(
            rt.kv.remove_tokens_at_end(seq, 1) == KvLength(n, n),
            "remove_tokens_at_end shortens",
            call="rt.kv.remove_tokens_at_end",
            returned=rt.kv.length(seq),
        )
        rt.kv.free(seq)
        expect_raises(InvalidArgument, "rt.kv.length (freed sequence)", rt.kv.length, seq)
        _slots_back(rt, a, pkg.model(a).kv.max_sequences, n)
        _append_past_capacity(s, rt, b)
    return f"capacity {cap}; namespaces per model; commit/rollback/remove-tail/free at position {n}; slots given back"


def _prefill_on_used_refused(s: Session, rt: Runtime, alias: str, seq: KvSeqId) -> None:
    """KV-1: a prefill writes from position 0, so a sequence that holds tokens takes none (reserved for it or not):
    INVALID_ARGUMENT, and the reservation is rolled back."""
    m = s.package.model(alias)
    prompt = golden_prompt(s.package, alias)
    held = rt.kv.length(seq).committed
    status: int = RuntimeStatus.INVALID_ARGUMENT
    with rt.job_buffers(m.prefill.name) as (inputs, outputs):
        write_prefill(inputs, prompt)
        rt.kv.append(seq, len(prompt))
        if s.native:
            status, job = raw_submit(rt, m.prefill.name, inputs, outputs, kv=seq)
            if status == RuntimeStatus.OK:  # accepted: let it end before its buffers are released
                raw_call(rt, "calrt_job_wait", job, 30_000, None)
        else:
            expect_raises(
                InvalidArgument, "rt.submit (a prefill into a used sequence)", rt.submit, m.prefill.name, inputs,
                outputs, kv=[seq],
            )  # fmt: skip
    expect_code(
        status,
        RuntimeStatus.INVALID_ARGUMENT,
        f"KV-1: calrt_job_submit of a prefill into sequence {seq}, which holds {held} tokens,",
        call="calrt_job_submit",
        arguments=f"graph={m.prefill.name!r}, kv=[{seq}] (committed {held}, {len(prompt)} reserved)",
    )
    rt.kv.rollback(seq)


def _prefill_short_of_reservation(rt: Runtime, pkg: Any, alias: str) -> None:
    """KV-1: a job writes exactly the tokens reserved for it. A prefill of n tokens into a fresh sequence with
    n + 1 reserved, straight into ``calrt_job_submit``: INVALID_ARGUMENT (a shim that takes "no more than
    reserved" for "exactly" lets the commit then commit a row nothing wrote)."""
    m = pkg.model(alias)
    prompt = golden_prompt(pkg, alias)
    seq = rt.kv.allocate(alias)
    try:
        with rt.job_buffers(m.prefill.name) as buffers:
            write_prefill(buffers[0], prompt)
            rt.kv.append(seq, len(prompt) + 1)
            expect_submit_refused(
                rt,
                m.prefill.name,
                buffers,
                seq,
                f"KV-1: calrt_job_submit of a prefill of {len(prompt)} tokens into sequence {seq}, with "
                f"{len(prompt) + 1} reserved,",
                arguments=f"graph={m.prefill.name!r}, kv=[{seq}] (committed 0, {len(prompt) + 1} reserved), "
                f"n_tokens={len(prompt)}",
            )
        rt.kv.rollback(seq)
    finally:
        rt.kv.free(seq)


def _remove_tail_refused_while_reserved(s: Session, rt: Runtime, seq: KvSeqId) -> None:
    """KV-8: with a token reserved, calrt_kv_remove_tokens_at_end is INVALID_ARGUMENT and changes nothing (0.7.6
    RemoveTokensAtEnd: nothing may be reserved); straight into the library on a C shim."""
    before = rt.kv.length(seq)
    rt.kv.append(seq, 1)
    if s.native:
        raw = _unwrap(rt)
        status = int(raw._fn.calrt_kv_remove_tokens_at_end(raw._dev, int(seq), 1))
        expect(
            status == RuntimeStatus.INVALID_ARGUMENT,
            "KV-8: calrt_kv_remove_tokens_at_end with a token reserved must return INVALID_ARGUMENT (10)",
            call="calrt_kv_remove_tokens_at_end",
            arguments=f"seq={seq} (committed {before.committed}, 1 reserved), n=1",
            returned=f"status {status}",
        )
    else:
        expect_raises(
            InvalidArgument, "rt.kv.remove_tokens_at_end (a token reserved)", rt.kv.remove_tokens_at_end, seq, 1
        )
    after = rt.kv.length(seq)
    expect(
        after == KvLength(before.committed, before.committed + 1),
        "KV-8: the refused remove-tail leaves the sequence as it was (the reservation pending)",
        call="calrt_kv_length",
        returned=after,
    )
    rt.kv.rollback(seq)
    _remove_tail_past_length_refused(s, rt, seq)


def _remove_tail_past_length_refused(s: Session, rt: Runtime, seq: KvSeqId) -> None:
    """KV-8: calrt_kv_remove_tokens_at_end of more tokens than the sequence holds is INVALID_ARGUMENT and changes
    nothing (a shim that clamps empties the sequence and answers OK: the caller's count of its tokens is then
    wrong)."""
    before = rt.kv.length(seq)
    n = before.committed + 1
    if s.native:
        expect_code(
            raw_call(rt, "calrt_kv_remove_tokens_at_end", int(seq), n),
            RuntimeStatus.INVALID_ARGUMENT,
            f"KV-8: calrt_kv_remove_tokens_at_end of {n} tokens from a sequence holding {before.committed}",
            call="calrt_kv_remove_tokens_at_end",
            arguments=f"seq={seq} (committed {before.committed}, none reserved), n={n}",
        )
    else:
        expect_raises(
            InvalidArgument, "rt.kv.remove_tokens_at_end (past the length)", rt.kv.remove_tokens_at_end, seq, n
        )
    after = rt.kv.length(seq)
    expect(
        after == before,
        f"KV-8: the refused remove-tail of {n} tokens leaves the sequence as it was",
        call="calrt_kv_length",
        returned=after,
    )


def _append_past_capacity(s: Session, rt: Runtime, alias: str) -> None:
    """KV-9: a sequence holds at most the model's longest graph context (``calrt_model_desc.kv_max_seq``): a
    reservation up to it is granted, one token more is INVALID_ARGUMENT, reserves nothing and leaves the
    ``position`` out-parameter unwritten (CONV-2); a shim that lets it through writes that token past its cache, or
    over the last row. Then KV-7: the sequence is freed with its reservation still pending (no job runs on it):
    OK. Bookkeeping only: nothing computes."""
    capacity = max(g.max_seq for g in s.package.model(alias).graphs)
    seq = rt.kv.allocate(alias)
    rt.kv.append(seq, capacity)
    if not s.native:
        expect_raises(InvalidArgument, "rt.kv.append (past the capacity)", rt.kv.append, seq, 1)
        rt.kv.free(seq)
        return
    raw = _unwrap(rt)
    position = ctypes.c_uint32(0xFFFF_FFFF)
    status = int(raw._fn.calrt_kv_append(raw._dev, int(seq), 1, ctypes.byref(position)))
    length = rt.kv.length(seq)
    expect(
        status == RuntimeStatus.INVALID_ARGUMENT and length == KvLength(0, capacity) and position.value == 0xFFFF_FFFF,
        f"KV-9: calrt_kv_append of one token past the capacity of {alias}'s sequence {seq} ({capacity} tokens, "
        "all reserved) must return INVALID_ARGUMENT (10), reserve nothing and leave *position unwritten (CONV-2)",
        call="calrt_kv_append",
        arguments=f"seq={seq} (committed 0, {capacity} reserved), n=1, *position=0xffffffff",
        returned=f"status {status}; committed {length.committed}, reserved {length.reserved}; "
        f"*position={position.value:#x}",
    )
    expect_code(
        int(raw._fn.calrt_kv_free(raw._dev, int(seq))),
        RuntimeStatus.OK,
        f"KV-7: calrt_kv_free of sequence {seq}, {capacity} tokens reserved and no job in flight,",
        call="calrt_kv_free",
        arguments=f"seq={seq} (committed 0, {capacity} reserved)",
    )


def _slots_back(rt: Runtime, alias: str, cap: int, held: int) -> None:
    """KV-7: a freed sequence that held tokens gives its slot back, and the next sequence starts empty (a pool
    that keeps a slot, or hands it out again with its old length, fails here)."""
    expect(
        rt.kv.can_allocate(alias, cap),
        f"KV-7: with every sequence of {alias} freed (the last holding {held} tokens), calrt_kv_can_allocate must "
        f"grant the whole capacity {cap} again",
        call="calrt_kv_can_allocate",
        arguments=f"{alias!r}, {cap}",
        returned="no",
    )
    fresh = rt.kv.allocate(alias)
    length = rt.kv.length(fresh)
    rt.kv.free(fresh)
    expect(
        length == KvLength(0, 0),
        f"KV-7: a sequence allocated after one holding {held} tokens was freed must be empty",
        call="calrt_kv_length",
        arguments=f"sequence {fresh}",
        returned=f"committed {length.committed}, reserved {length.reserved}",
    )


@check(
    "ccu_fault",
    "a CCU exception fails the job, halts only its chip (DEVICE_LOST) until a reset; KV rolls back",
    clauses=("FAULT-1", "KV-2", "OBS-1", "JOB-3"),
)
def _ccu(s: Session) -> str:
    """The fault on each chip in turn (a shim that halts a fixed chip, or the lowest, shows on the other), then once
    more ended by a board reset (a shim that clears the fault latch on its chip-reset path only leaves the chip
    FAULTED after a board reset)."""
    a, b = s.pair()
    with s.configured() as rt:
        done = [_ccu_on(s, rt, a, b), _ccu_on(s, rt, b, a), _ccu_on(s, rt, a, b, board=True)]
    return f"CCU_EXCEPTION (7); {'; '.join(done)}; the other chip unaffected"


def _ccu_on(s: Session, rt: Runtime, a: str, b: str, *, board: bool = False) -> str:
    pkg = s.package
    ca = s.chip_of(a)
    job, seq, inputs, n = _armed_decode(s, rt, "ccu", a)
    if s.native:
        _wait_of_a_failed_job(rt, job)
    expect_wait_error(rt, job, CcuException, RuntimeStatus.CCU_EXCEPTION, "armed ccu")
    expect(rt.query(job).state is JobState.FAILED, "the job ends FAILED", returned=rt.query(job))
    health = {h.chip: h.health for h in rt.health()}
    expect(
        health[ca] in (Health.FAULTED, Health.UNKNOWN),
        f"FAULT-1: chip {ca}, whose job failed, reports FAULTED",
        call="rt.health",
        returned=health,
    )
    cb = s.chip_of(b)
    expect(
        health[cb] in (Health.OK, Health.UNKNOWN),
        f"FAULT-1: a CCU exception on chip {ca} halts only its chip: chip {cb} must still report OK",
        call="calrt_chip_health",
        arguments=f"chip {cb}, while chip {ca} is FAULTED",
        returned=health,
    )
    pending = rt.counters()[ca].pending
    expect(
        pending in (None, 0),
        f"OBS-1: job {job.id} ended FAILED and nothing else is in flight on chip {ca}: the chip counts no job pending",
        call="calrt_chip_counters",
        arguments=f"chip {ca}",
        returned=f"pending {pending}",
    )
    expect_raises(InvalidArgument, "rt.kv.commit (the writing job failed)", rt.kv.commit, seq)
    rolled = rt.kv.rollback(seq)
    expect(
        rolled == KvLength(n, n),
        f"KV-2: calrt_kv_rollback after the failed decode of sequence {seq} must drop only its reservation: the "
        f"{n} tokens committed before it stay",
        call="calrt_kv_rollback",
        arguments=f"seq={seq} (committed {n}, 1 reserved, its job FAILED)",
        returned=f"committed {rolled.committed}, reserved {rolled.reserved}",
    )
    rt.release_buffer(inputs)
    expect_raises(DeviceLost, "rt.submit (on the halted chip)", prefill_job, rt, pkg, a)
    job_b, _, _, _ = prefill_job(rt, pkg, b)
    expect(rt.wait(job_b, 10).ok, "the other chip keeps working", call="rt.wait")
    if board:  # the health first: calrt_configure refuses a faulted chip (DEVICE_LOST)
        rt.reset("board")
        scope = "board"
    else:
        _other_chip_reset_keeps_fault(rt, ca, cb)
        scope = s.reset_chip_or_board(rt, ca)
    health = {h.chip: h.health for h in rt.health()}
    expect(
        health[ca] in (Health.OK, Health.UNKNOWN),
        f"FAULT-1: a {scope} reset ends the fault: chip {ca} must report OK again (calrt_chip_health)",
        call="calrt_chip_health",
        arguments=f"chip {ca}, after calrt_reset({scope.upper()})",
        returned=health,
    )
    if board:
        rt.configure(rt.create_calbin(pkg))
    job2, _, _, _ = prefill_job(rt, pkg, a)
    expect(rt.wait(job2, 10).ok, "the chip works after the reset", call="rt.wait")
    return f"chip {ca} DEVICE_LOST until a {scope} reset"


def _wait_of_a_failed_job(rt: Runtime, job: Job) -> None:
    """JOB-3: ``calrt_job_wait`` returns OK once the job is terminal, and the info says how it ended: a job that
    failed is OK with state FAILED and status CCU_EXCEPTION (a shim that passes on the error CalRT's ``Wait``
    throws returns CCU_EXCEPTION as the call's own status, which reads as a wait that failed)."""
    rc, info = raw_job_info(rt, job, 10_000)
    expect(
        rc == RuntimeStatus.OK and int(info.status) == RuntimeStatus.CCU_EXCEPTION,
        f"JOB-3: calrt_job_wait of job {job.id}, which ended by a CCU exception, must return OK with status "
        "CCU_EXCEPTION (7) in its info",
        call="calrt_job_wait",
        arguments=f"job={job.id}, 10000 ms",
        returned=f"status {rc}, info.state {int(info.state)}, info.status {int(info.status)}",
    )


def _other_chip_reset_keeps_fault(rt: Runtime, faulted: int, other: int) -> None:
    """FAULT-1: a chip's fault lasts until a reset of that chip (or the board); a reset of another chip leaves it
    FAULTED (a shim with one board-wide fault latch clears it with any reset and reports a halted chip OK)."""
    try:
        rt.reset("chip", chip=other)
    except NotSupported:
        return  # board reset only: every reset covers the faulted chip
    health = {h.chip: h.health for h in rt.health()}
    expect(
        health[faulted] in (Health.FAULTED, Health.UNKNOWN),
        f"FAULT-1: a reset of chip {other} must leave chip {faulted}, halted by its CCU exception, FAULTED: only a reset "
        "covering the chip ends its fault",
        call="calrt_chip_health",
        arguments=f"chip {faulted}, after calrt_reset(CHIP, {other})",
        returned=health,
    )


def _armed_decode(s: Session, rt: Runtime, fault: str, alias: str) -> tuple[Job, KvSeqId, HostBuffer, int]:
    """A prefill that succeeds and is committed (n tokens), then ``fault`` armed and the decode at position n
    submitted on the same sequence: (the decode job, its sequence, its inputs, n)."""
    pkg = s.package
    job, seq, pre_in, pre_out = prefill_job(rt, pkg, alias)
    rt.wait(job, 10)
    n = rt.kv.commit(seq).committed
    token = int(np.argmax(pre_out.read("logits")[0]))
    rt.release_buffer(pre_in)
    rt.release_buffer(pre_out)
    decode = pkg.model(alias).decode.name
    inputs, outputs = rt.alloc_inputs(decode), rt.alloc_outputs(decode)
    write_decode(inputs, token, n, mask=decode_mask(pkg, alias))
    rt.kv.append(seq, 1)
    s.arm(rt, fault)
    return rt.submit(decode, inputs, outputs, kv=[seq]), seq, inputs, n


@check(
    "dma_quarantine",
    "UNKNOWN_DMA_STATE keeps the buffers quarantined until a reset covering the chip",
    clauses=("OWN-7",),
)
def _dma(s: Session) -> str:
    _, b = s.pair()
    with s.configured() as rt:
        job, _, inputs, outputs = s.armed_prefill(rt, "dma", b)
        expect_wait_error(rt, job, UnknownDmaState, RuntimeStatus.UNKNOWN_DMA_STATE, "armed dma")
        if s.native:  # what the library answers, past calctl's own bookkeeping
            raw = _unwrap(rt)
            status = int(raw._fn.calrt_buffer_release(raw._dev, inputs.native))
            expect(
                status == RuntimeStatus.BUFFER_IN_USE,
                "calrt_buffer_release of a quarantined buffer must return BUFFER_IN_USE (12) until a reset",
                call="calrt_buffer_release",
                arguments="<inputs of the job that ended UNKNOWN_DMA_STATE>",
                returned=f"status {status}",
            )
            status = int(raw._fn.calrt_buffer_release(raw._dev, outputs.native))
            expect(
                status == RuntimeStatus.BUFFER_IN_USE,
                "OWN-7: calrt_buffer_release of the outputs of a job that ended UNKNOWN_DMA_STATE must return "
                "BUFFER_IN_USE (12) until a reset: its DMA may still write them",
                call="calrt_buffer_release",
                arguments="<outputs of the job that ended UNKNOWN_DMA_STATE>",
                returned=f"status {status}",
            )
            _other_chip_keeps_quarantine(s, rt, inputs.native)
        else:
            expect(inputs.state is BufferState.QUARANTINED, "the buffers are quarantined", returned=inputs.state)
            expect_raises(BufferInUse, "rt.release_buffer (quarantined)", rt.release_buffer, inputs)
        scope = s.reset_chip_or_board(rt, s.chip_of(b))
        if scope == "chip":
            rt.release_buffer(inputs)  # the library frees them now (a FAIL names calrt_buffer_release)
            rt.release_buffer(outputs)
            _board_reset_lifts_quarantine(s, rt, b)
            scope = "chip reset, then once more until a board"
    return f"UNKNOWN_DMA_STATE (8); the library held the buffers (12) until a {scope} reset"


def _board_reset_lifts_quarantine(s: Session, rt: Runtime, alias: str) -> None:
    """OWN-7: a board reset covers every chip, so it lifts every quarantine as a reset of the job's chip does (a
    shim that lifts it on its chip-reset path only keeps the buffers for ever on a board without chip resets)."""
    chip = s.chip_of(alias)
    job, _, inputs, outputs = s.armed_prefill(rt, "dma", alias)
    expect_wait_error(rt, job, UnknownDmaState, RuntimeStatus.UNKNOWN_DMA_STATE, "armed dma")
    rt.reset("board")
    for what, buf in (("inputs", inputs), ("outputs", outputs)):
        try:
            rt.release_buffer(buf)
        except BufferInUse as exc:
            raise ExpectationFailed(
                f"OWN-7: a board reset covers chip {chip}: calrt_buffer_release of the {what} of job {job.id}, which "
                "ended UNKNOWN_DMA_STATE, must then succeed",
                call="calrt_buffer_release",
                arguments=f"<{what} of job {job.id}>, after calrt_reset(BOARD)",
                returned=_returned(exc),
            ) from None
    rt.configure(rt.create_calbin(s.package))


def _other_chip_keeps_quarantine(s: Session, rt: Runtime, buffer: object) -> None:
    """OWN-7: a reset of another chip leaves the quarantine alone (only a reset covering the job's chip lifts it)."""
    a, b = s.pair()
    try:
        rt.reset("chip", chip=s.chip_of(a))
    except NotSupported:
        return  # board reset only: every reset covers the job's chip
    raw = _unwrap(rt)
    status = int(raw._fn.calrt_buffer_release(raw._dev, buffer))
    expect(
        status == RuntimeStatus.BUFFER_IN_USE,
        f"OWN-7: after a reset of chip {s.chip_of(a)}, the buffers of {b}'s job on chip {s.chip_of(b)} that ended "
        "UNKNOWN_DMA_STATE stay quarantined: calrt_buffer_release must return BUFFER_IN_USE (12)",
        call="calrt_buffer_release",
        arguments=f"<inputs of the job that ended UNKNOWN_DMA_STATE>, after calrt_reset(CHIP, {s.chip_of(a)})",
        returned=f"status {status}",
    )


def _chip_past_the_board_refused(rt: Runtime) -> None:
    """OBS-2: the per-chip calls name a chip of the topology; one past the board is INVALID_ARGUMENT (a shim that
    clamps or wraps the index answers another chip's figures as if they were that chip's, and a chip reset of a
    chip that is not there must not answer OK). Asked before any configuration, so a lax reset changes nothing."""
    from calctl.runtime._native import lib as L

    chips = rt.topology().chips
    for name, out in (
        ("calrt_memory_usage", L.CalrtMemory()),
        ("calrt_chip_counters", L.CalrtCounters()),
        ("calrt_chip_health", ctypes.c_uint32()),
    ):
        expect_code(
            raw_call(rt, name, chips, ctypes.byref(out)),
            RuntimeStatus.INVALID_ARGUMENT,
            f"OBS-2: {name} of chip {chips} (the board has chips 0..{chips - 1})",
            call=name,
            arguments=f"chip {chips}",
        )
    status = raw_call(rt, "calrt_reset", ResetScope.CHIP.code, chips)
    expect(  # NOT_SUPPORTED: a runtime without chip scope refuses every chip reset (§7)
        status in (RuntimeStatus.INVALID_ARGUMENT, RuntimeStatus.NOT_SUPPORTED),
        f"OBS-2: calrt_reset(CHIP) of chip {chips} (the board has chips 0..{chips - 1}) must return INVALID_ARGUMENT "
        "(10), or NOT_SUPPORTED (13) without chip scope: a reset of no chip is no reset",
        call="calrt_reset",
        arguments=f"scope CHIP, chip {chips}",
        returned=f"status {status}",
    )


def _board_reset_frees_memory(rt: Runtime, pkg: Any, baseline: tuple[ChipMemory, ...]) -> None:
    """MEM-3: a board reset drops the configuration (RESET-2) and with it the memory the configuration took: each
    chip's usage comes back to its baseline, within half of what the load took (a shim whose reset path forgets
    the arena keeps the whole load)."""
    rt.configure(rt.create_calbin(pkg))
    loaded = rt.memory_usage()
    rt.reset("board")
    for before, cfg, m in zip(baseline, loaded, rt.memory_usage(), strict=True):
        if before.used_bytes is None or cfg.used_bytes is None or m.used_bytes is None:
            continue
        grown, took = m.used_bytes - before.used_bytes, cfg.used_bytes - before.used_bytes
        expect(
            grown <= max(1 << 20, took // 2),
            f"MEM-3: chip {m.chip}: memory not back to baseline after a board reset dropped the configuration: "
            f"{grown / 2**20:+.1f} MiB of the {took / 2**20:.1f} MiB the load took",
            call="calrt_memory_usage (after calrt_reset(BOARD))",
            returned=(before.used_bytes, cfg.used_bytes, m.used_bytes),
        )


LOAD_CYCLES = 6  # as `calctl soak --cycles 6`, which caught the 112.5 MiB-per-unload leak at cycle 2


@check(
    "memory_counters",
    f"per-chip memory and counters are reported (or null, never 0); {LOAD_CYCLES} load/unload cycles return to baseline",
    clauses=("MEM-3", "CONV-4", "OBS-1", "OBS-2"),
)
def _memory(s: Session) -> str:
    """Read by what the shim reports: ``calrt_memory_usage`` after every load and every unload of
    ``LOAD_CYCLES`` cycles, ``calrt_chip_counters`` around the jobs of each load."""
    pkg = s.package
    with s.open() as rt:
        if s.native:
            _chip_past_the_board_refused(rt)
        baseline = rt.memory_usage()
        reported = [m.used_bytes is not None for m in baseline]
        for m in baseline:
            expect(
                m.used_bytes is None or m.used_bytes > 0,
                f"chip {m.chip}: used bytes 0 means unknown is reported as 0 (001 §14)",
                call="calrt_memory_usage",
                returned=m,
            )
        # A leak shows as growth across cycles; one cycle's noise must not: allow 1 MiB per chip and cycle
        # beyond max(64 MiB, 1 % of DRAM) in total (a 112.5 MiB-per-unload leak is 675 MiB after 6 cycles).
        tolerance = [max(64 << 20, (m.total_bytes or 0) // 100) for m in baseline]
        loaded_first: tuple[ChipMemory, ...] = ()
        unloaded: list[tuple[ChipMemory, ...]] = []
        counters_seen = False
        for cycle in range(1, LOAD_CYCLES + 1):
            rt.configure(rt.create_calbin(pkg))
            loaded = rt.memory_usage()
            if cycle == 1:
                loaded_first = loaded
            for before, cfg in zip(baseline, loaded, strict=True):
                if before.used_bytes is not None and cfg.used_bytes is not None:
                    expect(
                        cfg.used_bytes >= before.used_bytes,
                        f"cycle {cycle}, chip {cfg.chip}: configuring must not lower memory use",
                        call="calrt_memory_usage",
                        returned=(before.used_bytes, cfg.used_bytes),
                    )
            counts_before = {c.chip: c for c in rt.counters()}
            for model in pkg.models:
                job, seq, _, _ = prefill_job(rt, pkg, model.alias)
                expect(rt.wait(job, 10).ok, f"cycle {cycle}: a {model.alias} prefill succeeds", call="rt.wait")
                rt.kv.free(seq)
            counts_after = rt.counters()
            _counters_not_cleared_by_reading(counts_after, rt.counters(), cycle)
            for c in counts_after:
                before_finished = counts_before[c.chip].finished
                if c.finished is None or before_finished is None:
                    continue
                counters_seen = True
                jobs = sum(1 for model in pkg.models if c.chip in model.target_chips)
                expect(
                    c.pending == 0 and c.finished - before_finished == jobs,
                    f"cycle {cycle}, chip {c.chip}: counters close ({jobs} finished, 0 pending)",
                    call="calrt_chip_counters",
                    returned=c,
                )
            rt.reset_configuration()
            now = rt.memory_usage()
            unloaded.append(now)
            for before, m, tol in zip(baseline, now, tolerance, strict=True):
                if before.used_bytes is None or m.used_bytes is None:
                    continue
                grown = m.used_bytes - before.used_bytes
                expect(
                    abs(grown) <= tol,
                    f"chip {m.chip}: memory not back to baseline after unload {cycle} of {LOAD_CYCLES}: "
                    f"{grown / 2**20:+.1f} MiB ({grown / cycle / 2**20:+.1f} MiB per cycle)",
                    call="calrt_memory_usage (after calrt_reset_configuration)",
                    returned=(before.used_bytes, m.used_bytes),
                )
        _board_reset_frees_memory(rt, pkg, baseline)
        for chip, before in enumerate(baseline):
            readings = [u[chip].used_bytes for u in unloaded]
            if before.used_bytes is None or any(v is None for v in readings):
                continue
            series = [int(v or 0) for v in readings]
            steps = [y - x for x, y in zip([before.used_bytes, *series], series, strict=False)]
            expect(
                not all(d > (1 << 20) for d in steps),
                f"chip {chip}: memory grows on every one of {LOAD_CYCLES} load/unload cycles "
                f"(by {min(steps) / 2**20:.1f}-{max(steps) / 2**20:.1f} MiB): a leak",
                call="calrt_memory_usage (after calrt_reset_configuration)",
                returned=[before.used_bytes, *series],
            )
        s.evidence["memory"] = [
            {
                "chip": m.chip,
                "baseline_bytes": m.used_bytes,
                "loaded_bytes": lm.used_bytes,
                "total_bytes": m.total_bytes,
                "after_unload_bytes": [u[m.chip].used_bytes for u in unloaded],
            }
            for m, lm in zip(baseline, loaded_first, strict=True)
        ]
        s.evidence["load_cycles"] = LOAD_CYCLES
        s.evidence["counters_reported"] = counters_seen
    if not any(reported):
        raise Unsupported(
            "calrt_memory_usage returned NOT_SUPPORTED on every chip (calctl reports null); "
            f"counters checked over {LOAD_CYCLES} load/unload cycles"
        )
    return f"{LOAD_CYCLES} load/unload cycles; per-chip memory " + ", ".join(
        f"chip {m['chip']}: {m['baseline_bytes']} -> {m['loaded_bytes']} -> {m['after_unload_bytes'][-1]} B"
        for m in s.evidence["memory"]
    )


def _counters_not_cleared_by_reading(first: Sequence[ChipCounters], again: Sequence[ChipCounters], cycle: int) -> None:
    """OBS-1: the counters count since the device opened; reading them changes nothing. Two reads with no job in
    between must agree (a shim that passes the hardware's read-to-clear registers through answers 0 the second
    time, and a caller's deltas between two reads still look right)."""
    for c1, c2 in zip(first, again, strict=True):
        expect(
            c1 == c2,
            f"OBS-1: cycle {cycle}, chip {c1.chip}: two calrt_chip_counters reads with no job in between must agree: "
            "counters count since the device opened, a read must not clear them",
            call="calrt_chip_counters",
            arguments=f"chip {c1.chip}, read twice",
            returned=f"pending/finished/failed {c1.pending}/{c1.finished}/{c1.failed}, then "
            f"{c2.pending}/{c2.finished}/{c2.failed}",
        )


def _reset_one_chip(rt: Runtime, seqs: dict[str, tuple[KvSeqId, KvLength]], emptied: str, kept: str, chip: int) -> None:
    """RESET-1, RESET-4: a reset of ``chip`` (where ``emptied``'s model sits) empties that model's sequence and
    keeps ``kept``'s, on the other chip. Tried on each chip in turn: a shim that resets chip 0 whatever chip it is
    asked for passes a reset of chip 0."""
    rt.reset("chip", chip=chip)
    for alias, want, what in (
        (
            emptied,
            KvLength(0, 0),
            f"RESET-1: chip {chip} reset empties {emptied}'s sequence (kept allocated, C ABI §7)",
        ),
        (kept, seqs[kept][1], f"RESET-4: chip {chip} reset leaves {kept}'s sequence on the other chip"),
    ):
        seq, before = seqs[alias]
        expect(
            rt.kv.length(seq) == want,
            what,
            call="calrt_reset / calrt_kv_length",
            arguments=f"CALRT_RESET_CHIP, chip {chip}; seq={seq} (committed {before.committed} before the reset)",
            returned=rt.kv.length(seq),
        )


@check(
    "chip_vs_board_reset",
    "a chip reset empties that chip's sequences only; after a board reset old sequences are not found, "
    "the board takes a new configuration and new sequences start empty",
    clauses=("RESET-1", "RESET-2", "RESET-4"),
)
def _resets(s: Session) -> str:
    """Judged by what the shim answers: ``calrt_kv_length`` of the old sequences (emptied after a chip reset,
    INVALID_ARGUMENT "not found" after a board reset, C ABI §5, §7), ``calrt_configure`` after a board reset
    (the board reset dropped the configuration: no ALREADY_CONFIGURED), new sequences and a job after each."""
    pkg = s.package
    a, b = s.pair()
    ca = s.chip_of(a)

    def prefilled(rt: Runtime) -> dict[str, tuple[KvSeqId, KvLength]]:
        seqs = {}
        for alias in (a, b):
            job, seq, _, _ = prefill_job(rt, pkg, alias)
            expect(rt.wait(job, 10).ok, f"a {alias} prefill succeeds", call="rt.wait")
            seqs[alias] = (seq, rt.kv.commit(seq))
            expect(seqs[alias][1].committed > 0, "a committed prefill has a length", returned=seqs[alias][1])
        return seqs

    def fresh(rt: Runtime, when: str) -> None:
        for alias in (a, b):
            seq = rt.kv.allocate(alias)
            expect(
                rt.kv.length(seq) == KvLength(0, 0),
                f"a new {alias} sequence after {when} starts empty",
                call="calrt_kv_length",
                returned=rt.kv.length(seq),
            )
            rt.kv.free(seq)
            job, seq, _, _ = prefill_job(rt, pkg, alias)
            expect(rt.wait(job, 10).ok, f"a {alias} job runs after {when}", call="rt.wait")
            rt.kv.free(seq)

    with s.configured() as rt:
        seqs = prefilled(rt)
        chip_scope = True
        try:
            _reset_one_chip(rt, seqs, a, b, ca)
        except NotSupported:
            chip_scope = False
        if chip_scope:
            fresh(rt, f"a chip {ca} reset")
            again = prefilled(rt)
            _reset_one_chip(rt, again, b, a, s.chip_of(b))
            for seq, _ in again.values():
                rt.kv.free(seq)
            rt.kv.free(seqs[a][0])
            rt.kv.free(seqs[b][0])
            seqs = prefilled(rt)
        rt.reset("board")
        for alias, (seq, before) in seqs.items():
            exc = expect_raises(
                InvalidArgument,
                f"calrt_kv_length of {alias}'s sequence {seq} (committed {before.committed}) after a board reset",
                rt.kv.length,
                seq,
            )
            expect_status(exc, RuntimeStatus.INVALID_ARGUMENT, "calrt_kv_length")
        calbin = rt.create_calbin(pkg)
        try:
            rt.configure(calbin)
        except AlreadyConfigured as exc:
            raise ExpectationFailed(
                "a board reset must drop the configuration (C ABI §7)",
                call="calrt_configure (after calrt_reset BOARD)",
                returned=f"AlreadyConfigured (status {int(exc.status)})",
            ) from None
        fresh(rt, "a board reset")
    s.evidence["chip_reset"] = chip_scope
    if not chip_scope:
        raise Unsupported(
            "calrt_reset(CHIP) returned NOT_SUPPORTED (board reset only; checked: old sequences not found, "
            "configuration dropped, new sequences empty)"
        )
    return (
        f"chip {ca} reset emptied {a}'s sequence only, chip {s.chip_of(b)} reset {b}'s only; board reset: old "
        "sequences not found, "
        "reconfigured, new sequences empty"
    )


def _capacity_cut(pkg: Package, alias: str) -> tuple[Package, int]:
    """``pkg`` with ``alias``'s KV pool cut to half its sequences (at least one fewer): the calbin descriptor then
    gives the models different capacities, which the sample packages never do."""
    m = pkg.model(alias)
    cut = max(1, min(m.kv.max_sequences // 2, m.kv.max_sequences - 1))
    model = dataclasses.replace(m, kv=dataclasses.replace(m.kv, max_sequences=cut))
    return dataclasses.replace(pkg, models=tuple(model if x.alias == alias else x for x in pkg.models)), cut


@check(
    "kv_capacity_per_model",
    "each model's KV pool and context are its own descriptor's: models given different capacities or contexts each "
    "get theirs",
    clauses=("KV-4", "KV-9"),
)
def _kv_capacity_per_model(s: Session) -> str:
    """KV-4 with capacities that differ. The packages' models usually share one capacity, so a shim that sizes
    every pool from the first (or last) model's descriptor passes ``kv_lifecycle``. Here each model of the pair in
    turn gets half its sequences in the calbin descriptor; every model must then answer ``calrt_kv_can_allocate``
    with its own capacity, allocate exactly that many sequences and refuse the next."""
    a, b = s.pair()
    seen: list[str] = []
    for cut_alias in (a, b):
        pkg, cut = _capacity_cut(s.package, cut_alias)
        with s.open() as rt:
            try:
                rt.configure(rt.create_calbin(pkg))
            except InvalidCalbin as exc:  # allowed: a runtime that sizes its pools from its own calbin only
                raise Unsupported(
                    f"the library refuses a calbin descriptor giving {cut_alias} {cut} KV sequences ({exc}): "
                    "capacities per model not tried"
                ) from None
            for alias in (a, b):
                cap = pkg.model(alias).kv.max_sequences
                given = f"{cut_alias} cut to {cut} sequences in the calbin descriptor, {alias}'s capacity {cap}"
                expect(
                    rt.kv.can_allocate(alias, cap) and not rt.kv.can_allocate(alias, cap + 1),
                    f"KV-4: with {given}, calrt_kv_can_allocate({alias!r}) must grant {cap} and refuse {cap + 1}",
                    call="calrt_kv_can_allocate",
                    arguments=f"model={alias!r}, n={cap} / {cap + 1}",
                    returned=f"{cap}: {rt.kv.can_allocate(alias, cap)}, {cap + 1}: {rt.kv.can_allocate(alias, cap + 1)}",
                )
                seqs = [rt.kv.allocate(alias) for _ in range(cap)]
                extra: KvSeqId | None = None
                with contextlib.suppress(RuntimeLayerError):
                    extra = rt.kv.allocate(alias)
                    rt.kv.free(extra)
                for q in seqs:
                    rt.kv.free(q)
                expect(
                    extra is None,
                    f"KV-4: with {given}, calrt_kv_allocate({alias!r}) after {cap} sequences must be refused",
                    call="calrt_kv_allocate",
                    arguments=f"model={alias!r}, {cap} sequences live",
                    returned=f"OK (sequence {extra})",
                )
            seen.append(f"{cut_alias} cut to {cut}")
    done = "; ".join(seen) + ": every model allocated its own capacity and was refused one more"
    if s.native:
        done += "; " + _context_per_model(s, a, b)
    return done


def _context_doubled(pkg: Package, alias: str) -> tuple[Package, int]:
    """``pkg`` with ``alias``'s graphs given twice the context (``max_seq``) in the calbin descriptor: the models'
    ``kv_max_seq`` then differ, which the sample packages never do (a shorter context would be shorter than the
    prefill graph's tokens)."""
    m = pkg.model(alias)
    grown = 2 * max(g.max_seq for g in m.graphs)
    model = dataclasses.replace(m, graphs=tuple(dataclasses.replace(g, max_seq=grown) for g in m.graphs))
    return dataclasses.replace(pkg, models=tuple(model if x.alias == alias else x for x in pkg.models)), grown


def _context_per_model(s: Session, a: str, b: str) -> str:
    """KV-9 with contexts that differ: each model of the pair in turn gets twice its context in the calbin
    descriptor; every model's sequence must then take a reservation of exactly its own ``kv_max_seq`` tokens and
    refuse one more, straight into ``calrt_kv_append`` (a shim that sizes every sequence from the first model's
    descriptor lets a sequence grow past its cache, or refuses a context the model has)."""
    seen = []
    for grown_alias in (a, b):
        pkg, grown = _context_doubled(s.package, grown_alias)
        with s.open() as rt:
            try:
                rt.configure(rt.create_calbin(pkg))
            except InvalidCalbin as exc:  # allowed: a runtime that takes the context from its own calbin only
                return f"contexts per model not tried: a descriptor giving {grown_alias} {grown} tokens refused ({exc})"
            for alias in (a, b):
                ctx = max(g.max_seq for g in pkg.model(alias).graphs)
                given = f"{grown_alias}'s context doubled to {grown} tokens in the calbin descriptor, {alias}'s {ctx}"
                seq = rt.kv.allocate(alias)
                position = ctypes.c_uint32()
                over = raw_call(rt, "calrt_kv_append", int(seq), ctx + 1, ctypes.byref(position))
                fits = raw_call(rt, "calrt_kv_append", int(seq), ctx, ctypes.byref(position))
                rt.kv.free(seq)
                expect_code(
                    over,
                    RuntimeStatus.INVALID_ARGUMENT,
                    f"KV-9: with {given}, calrt_kv_append of {ctx + 1} tokens to an empty {alias} sequence",
                    call="calrt_kv_append",
                    arguments=f"seq={seq} ({alias}, empty), n={ctx + 1}",
                )
                expect_code(
                    fits,
                    RuntimeStatus.OK,
                    f"KV-9: with {given}, calrt_kv_append of {ctx} tokens to an empty {alias} sequence",
                    call="calrt_kv_append",
                    arguments=f"seq={seq} ({alias}, empty), n={ctx}",
                )
        seen.append(f"{grown_alias}'s context doubled to {grown}")
    return "; ".join(seen) + ": every model's sequence took its own context and was refused one token more"
