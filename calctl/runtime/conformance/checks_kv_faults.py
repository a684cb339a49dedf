"""Checks of KV sequences, faults, memory and resets."""

from __future__ import annotations

import numpy as np

from calctl.runtime.buffers import BufferState
from calctl.runtime.conformance.framework import (
    Session,
    Unsupported,
    check,
    expect,
    expect_raises,
    expect_status,
    prefill_job,
    write_decode,
)
from calctl.runtime.errors import (
    BufferInUse,
    CcuException,
    DeviceLost,
    InvalidArgument,
    NotConfigured,
    NotSupported,
    RuntimeLayerError,
    RuntimeStatus,
    UnknownDmaState,
)
from calctl.runtime.types import Health, JobState, KvLength


@check("kv_lifecycle", "KV: capacity per model, allocate / append / commit / rollback / remove-tail / free")
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
        token = int(np.argmax(outputs.read("logits")[0]))
        decode = pkg.model(a).decode.name
        with rt.job_buffers(decode) as (inputs, outs):
            pos = rt.kv.append(seq, 1)
            expect(pos == n, "append reserves at the committed length", call="rt.kv.append", returned=pos)
            write_decode(inputs, token, n + 1)  # wrong: the position must be the committed length (000 §9.2)
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
            write_decode(inputs, token, n)
            rt.wait(rt.submit(decode, inputs, outs, kv=[seq]), 10)
            expect(
                rt.kv.commit(seq) == KvLength(n + 1, n + 1),
                "commit after the decode",
                call="rt.kv.commit",
                returned=rt.kv.length(seq),
            )
        expect(
            rt.kv.remove_tokens_at_end(seq, 1) == KvLength(n, n),
            "remove_tokens_at_end shortens",
            call="rt.kv.remove_tokens_at_end",
            returned=rt.kv.length(seq),
        )
        rt.kv.free(seq)
        expect_raises(InvalidArgument, "rt.kv.length (freed sequence)", rt.kv.length, seq)
    return f"capacity {cap}; namespaces per model; commit/rollback/remove-tail/free at position {n}"


@check("ccu_fault", "a CCU exception fails the job, halts only its chip (DEVICE_LOST) until a reset; KV rolls back")
def _ccu(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    ca = s.chip_of(a)
    with s.configured() as rt:
        s.arm(rt, "ccu")
        job, seq, inputs, _ = prefill_job(rt, pkg, a)
        exc = expect_raises(CcuException, "rt.wait (armed ccu)", rt.wait, job, 10)
        expect_status(exc, RuntimeStatus.CCU_EXCEPTION, "calrt_job_wait")
        expect(rt.query(job).state is JobState.FAILED, "the job ends FAILED", returned=rt.query(job))
        health = {h.chip: h.health for h in rt.health()}
        expect(
            health[ca] in (Health.FAULTED, Health.UNKNOWN),
            "its chip reports FAULTED",
            call="rt.health",
            returned=health,
        )
        expect_raises(InvalidArgument, "rt.kv.commit (the writing job failed)", rt.kv.commit, seq)
        rt.kv.rollback(seq)
        rt.release_buffer(inputs)
        expect_raises(DeviceLost, "rt.submit (on the halted chip)", prefill_job, rt, pkg, a)
        job_b, _, _, _ = prefill_job(rt, pkg, b)
        expect(rt.wait(job_b, 10).ok, "the other chip keeps working", call="rt.wait")
        scope = s.reset_chip_or_board(rt, ca)
        job2, _, _, _ = prefill_job(rt, pkg, a)
        expect(rt.wait(job2, 10).ok, "the chip works after the reset", call="rt.wait")
    return f"CCU_EXCEPTION (7); chip {ca} DEVICE_LOST until a {scope} reset; the other chip unaffected"


@check("dma_quarantine", "UNKNOWN_DMA_STATE keeps the buffers quarantined until a reset covering the chip")
def _dma(s: Session) -> str:
    pkg = s.package
    _, b = s.pair()
    with s.configured() as rt:
        s.arm(rt, "dma")
        job, _, inputs, outputs = prefill_job(rt, pkg, b)
        exc = expect_raises(UnknownDmaState, "rt.wait (armed dma)", rt.wait, job, 10)
        expect_status(exc, RuntimeStatus.UNKNOWN_DMA_STATE, "calrt_job_wait")
        expect(inputs.state is BufferState.QUARANTINED, "the buffers are quarantined", returned=inputs.state)
        expect_raises(BufferInUse, "rt.release_buffer (quarantined)", rt.release_buffer, inputs)
        scope = s.reset_chip_or_board(rt, s.chip_of(b))
        if scope == "chip":
            rt.release_buffer(inputs)
            rt.release_buffer(outputs)
    return f"UNKNOWN_DMA_STATE (8); buffers held until a {scope} reset"


@check("memory_counters", "per-chip memory and counters are reported (or null, never 0); memory returns to baseline")
def _memory(s: Session) -> str:
    pkg = s.package
    with s.open() as rt:
        baseline = rt.memory_usage()
        reported = [m.used_bytes is not None for m in baseline]
        for m in baseline:
            expect(
                m.used_bytes is None or m.used_bytes > 0,
                f"chip {m.chip}: used bytes 0 means unknown is reported as 0 (001 §14)",
                call="rt.memory_usage",
                returned=m,
            )
        rt.configure(rt.create_calbin(pkg))
        loaded = rt.memory_usage()
        for before, cfg in zip(baseline, loaded, strict=True):
            if before.used_bytes is not None and cfg.used_bytes is not None:
                expect(
                    cfg.used_bytes >= before.used_bytes,
                    f"chip {cfg.chip}: configuring must not lower memory use",
                    returned=(before.used_bytes, cfg.used_bytes),
                )
        counts_before = {c.chip: c for c in rt.counters()}
        for model in pkg.models:
            job, seq, _, _ = prefill_job(rt, pkg, model.alias)
            expect(rt.wait(job, 10).ok, f"a {model.alias} prefill succeeds", call="rt.wait")
            rt.kv.free(seq)
        counts = {c.chip: c for c in rt.counters()}
        for chip, c in counts.items():
            before_finished = counts_before[chip].finished
            if c.finished is None or before_finished is None:
                continue
            jobs = sum(1 for model in pkg.models if chip in model.target_chips)
            expect(
                c.pending == 0 and c.finished - before_finished == jobs,
                f"chip {chip}: counters close ({jobs} finished, 0 pending)",
                call="rt.counters",
                returned=c,
            )
        rt.reset_configuration()
        unloaded = rt.memory_usage()
        tolerance = [max(64 << 20, (m.total_bytes or 0) // 100) for m in baseline]
        for before, now, tol in zip(baseline, unloaded, tolerance, strict=True):
            if before.used_bytes is not None and now.used_bytes is not None:
                expect(
                    abs(now.used_bytes - before.used_bytes) <= tol,
                    f"chip {now.chip}: memory back to baseline after reset_configuration",
                    returned=(before.used_bytes, now.used_bytes),
                )
        s.evidence["memory"] = [
            {
                "chip": m.chip,
                "baseline_bytes": m.used_bytes,
                "loaded_bytes": lm.used_bytes,
                "total_bytes": m.total_bytes,
            }
            for m, lm in zip(baseline, loaded, strict=True)
        ]
        s.evidence["counters_reported"] = [c.finished is not None for c in counts.values()]
    if not any(reported):
        raise Unsupported(
            "calrt_memory_usage returned NOT_SUPPORTED on every chip (calctl reports null); counters checked"
        )
    return "per-chip memory " + ", ".join(
        f"chip {m['chip']}: {m['baseline_bytes']} -> {m['loaded_bytes']} B" for m in s.evidence["memory"]
    )


@check("chip_vs_board_reset", "a chip reset empties that chip's KV only; a board reset also drops the configuration")
def _resets(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    ca = s.chip_of(a)
    with s.configured() as rt:
        seqs = {}
        for alias in (a, b):
            job, seq, _, _ = prefill_job(rt, pkg, alias)
            rt.wait(job, 10)
            seqs[alias] = (seq, rt.kv.commit(seq))
        calbin = rt.current_calbin
        chip_scope = True
        try:
            rt.reset("chip", chip=ca)
        except NotSupported:
            chip_scope = False
        if chip_scope:
            expect(
                rt.kv.length(seqs[a][0]) == KvLength(0, 0),
                f"chip {ca} reset empties {a}'s sequence (kept allocated)",
                call="rt.kv.length",
                returned=rt.kv.length(seqs[a][0]),
            )
            expect(
                rt.kv.length(seqs[b][0]) == seqs[b][1],
                f"chip {ca} reset leaves {b}'s sequence on the other chip",
                call="rt.kv.length",
                returned=rt.kv.length(seqs[b][0]),
            )
            expect(rt.current_calbin is calbin, "a chip reset keeps the configuration", returned=rt.current_calbin)
            job, _, _, _ = prefill_job(rt, pkg, b)
            expect(rt.wait(job, 10).ok, "the other chip runs after a chip reset", call="rt.wait")
        rt.reset("board")
        expect(rt.current_calbin is None, "a board reset drops the configuration", returned=rt.current_calbin)
        expect_raises(
            NotConfigured, "rt.alloc_inputs (after a board reset)", rt.alloc_inputs, pkg.model(a).prefill.name
        )
        rt.configure(rt.create_calbin(pkg))
        job, _, _, _ = prefill_job(rt, pkg, a)
        expect(rt.wait(job, 10).ok, "configure works again after a board reset (no AlreadyConfigured)", call="rt.wait")
    s.evidence["chip_reset"] = chip_scope
    if not chip_scope:
        raise Unsupported(
            "calrt_reset(CHIP) returned NOT_SUPPORTED (board reset only; checked: it drops the configuration)"
        )
    return f"chip {ca} reset emptied {a}'s KV only and kept the configuration; board reset dropped it"
