"""Checks of batch jobs and of many jobs: every compiled decode profile against its B1 twin, and a long run.

``batch_lanes`` runs a decode job on every batch profile the package compiles, with inactive lanes between
active ones, and compares each active lane with the same lane run alone at B1 (its twin), then decodes every
sequence once more at B1: a shim whose inactive lane wrote a KV row of some sequence shows there, since the
job's own logits were computed before the row was overwritten. ``long_run`` runs mixed graphs on both chips
from several threads, hundreds to thousands of jobs by ``--level``, each output against its twin computed
alone first: a fault that shows once in N jobs has N jobs to show in.

What inactive lanes return is the package's contract (``inactive_lane_policy.returns_logits``); when it says
they return none, their rows are not judged.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calctl.package.model import Package
from calctl.runtime import Runtime
from calctl.runtime.buffers import HostBuffer
from calctl.runtime.conformance.checks_concurrency import crosstalk_prompt
from calctl.runtime.conformance.framework import (
    ConformanceLevel,
    ExpectationFailed,
    Session,
    Unsupported,
    _returned,
    check,
    decode_mask,
    expect,
    expect_code,
    expect_submit_refused,
    prefill_job,
    raw_call,
    raw_submit,
    write_decode_lanes,
)
from calctl.runtime.errors import InvalidArgument, RuntimeLayerError, RuntimeStatus
from calctl.runtime.types import Engine, KvLength, KvSeqId

_OUTSIDE = 1000  # the key of the bystander sequence, outside the batch job
#: jobs of the long run per level (half prefill, half decode over every profile)
LONG_RUN_JOBS = {ConformanceLevel.QUICK: 96, ConformanceLevel.STANDARD: 2000, ConformanceLevel.LONG: 10000}


@dataclass(frozen=True)
class Twin:
    """A prompt's outputs computed alone: prefill logits, the greedy token, the B1 decode logits after it."""

    prompt: np.ndarray
    prefill: np.ndarray
    token: int
    decode: np.ndarray


def _close(pkg: Package, alias: str, got: np.ndarray, want: np.ndarray) -> bool:
    tol = pkg.model(alias).golden.tolerance
    return bool(np.allclose(got, want, rtol=tol.rtol, atol=tol.atol))


def _decode_b1(rt: Runtime, pkg: Package, alias: str, seq: KvSeqId, token: int) -> np.ndarray:
    """One B1 decode step of ``seq`` (reserved, run, committed): its logits."""
    m = pkg.model(alias)
    with rt.job_buffers(m.decode.name) as (inputs, outputs):
        position = rt.kv.append(seq, 1)
        write_decode_lanes(inputs, [token], [position], [True], mask=decode_mask(pkg, alias))
        result = rt.wait(rt.submit(m.decode.name, inputs, outputs, kv=[seq]), 30)
        expect(result.ok, f"a B1 decode of {alias} succeeds", call="rt.wait", returned=result.state)
        rt.kv.commit(seq)
        return outputs.read("logits")[0].copy()


def _prefilled(rt: Runtime, pkg: Package, alias: str, prompt: np.ndarray) -> tuple[KvSeqId, np.ndarray]:
    job, seq, inputs, outputs = prefill_job(rt, pkg, alias, prompt)
    expect(rt.wait(job, 30).ok, f"a {alias} prefill succeeds", call="rt.wait")
    logits = outputs.read("logits")[0].copy()
    rt.kv.commit(seq)
    rt.release_buffer(inputs)
    rt.release_buffer(outputs)
    return seq, logits


def _twin(rt: Runtime, pkg: Package, alias: str, prompt: np.ndarray) -> Twin:
    seq, pre = _prefilled(rt, pkg, alias, prompt)
    token = int(np.argmax(pre))
    dec = _decode_b1(rt, pkg, alias, seq, token)
    rt.kv.free(seq)
    return Twin(prompt, pre, token, dec)


def _batched(pkg: Package) -> list[tuple[str, int]]:
    """(alias, B) for every decode profile above 1 the package compiles."""
    return [(m.alias, b) for m in pkg.models for b in m.decode.batch_profiles if b > 1]


@check(
    "batch_lanes",
    "every compiled decode profile: active lanes equal their B1 twins, inactive lanes write no KV of any sequence",
    clauses=("BATCH-1", "BATCH-2", "LAYOUT-1", "LAYOUT-2", "KV-1", "KV-2", "KV-3"),
)
def _batch_lanes(s: Session) -> str:
    """Per profile B: every other lane active (lane 0 first), the rest inactive (mask 0, no sequence); each active
    sequence and a bystander sequence outside the job have twins prefilled with the same prompts. The batch job's
    active rows must match the twins' B1 decode; every sequence then decodes once more at B1 and must match its
    twin again (an inactive lane that wrote a KV row changes what follows); lengths grow by one on active lanes
    only."""
    pkg = s.package
    work = _batched(pkg)
    if not work:
        raise Unsupported(
            f"package {pkg.name!r} compiles decode at B1 only: no batch profile to try (pass --package with one, "
            "e.g. from `calctl sample-package --profiles 1,4,8`)"
        )
    done = []
    with s.configured() as rt:
        for alias, batch in work:
            done.append(_one_profile(s, rt, alias, batch, every_other=True))
            done.append(_one_profile(s, rt, alias, batch, every_other=False))
        done.extend(_lanes_of_a_held_job(s, rt, *work[0], fault) for fault in ("hang", "ccu"))
    return "; ".join(done)


def _lanes_of_a_held_job(s: Session, rt: Runtime, alias: str, batch: int, fault: str) -> str:
    """Every lane's sequence, not only lane 0's, is the job's: a B``batch`` decode with lanes 0 and the last active
    is armed with the test hook's ``fault``. ``hang``: while it is in flight, ``calrt_kv_commit`` of the last
    lane's sequence must be DEVICE_BUSY (KV-3). ``ccu``: once it failed, that commit must be INVALID_ARGUMENT
    (KV-2). A shim that marks only the first lane's sequence, written for B1, lets the caller commit rows the job
    is writing or half wrote. A reset then recovers the chip."""
    pkg = s.package
    m = pkg.model(alias)
    vocab, max_tokens = int(m.decode.output("logits").shape[-1]), int(m.prefill.input("tokens").shape[-1])
    lanes = [0, batch - 1]
    seqs = {lane: _prefilled(rt, pkg, alias, crosstalk_prompt(vocab, max_tokens, batch, lane, 11))[0] for lane in lanes}
    last = seqs[lanes[-1]]
    want, clause = (RuntimeStatus.DEVICE_BUSY, "KV-3") if fault == "hang" else (RuntimeStatus.INVALID_ARGUMENT, "KV-2")
    with rt.job_buffers(m.decode.name, batch) as (inputs, outputs):
        positions = [rt.kv.append(seqs[lane], 1) if lane in seqs else 0 for lane in range(batch)]
        valid = [lane in seqs for lane in range(batch)]
        write_decode_lanes(inputs, [1 if v else 0 for v in valid], positions, valid, mask=decode_mask(pkg, alias))
        try:
            s.arm(rt, fault)
        except Unsupported:
            for q in seqs.values():
                rt.kv.rollback(q)
                rt.kv.free(q)
            return f"{alias} B{batch}: lanes of a {fault} job not tried (no test hook)"
        job = rt.submit(m.decode.name, inputs, outputs, kv=[seqs.get(lane) for lane in range(batch)])
        if fault != "hang":
            with contextlib.suppress(RuntimeLayerError):
                rt.wait(job, 30)
        status = raw_call(rt, "calrt_kv_commit", int(last)) if s.native else _commit_status(rt, last)
        scope = s.reset_chip_or_board(rt, s.chip_of(alias))
        with contextlib.suppress(RuntimeLayerError):
            rt.wait(job, 10)
    state = "in flight" if fault == "hang" else "that failed"
    expect_code(
        status,
        want,
        f"{clause}: calrt_kv_commit of sequence {last}, lane {lanes[-1]} of B{batch} decode job {job.id} {state},",
        call="calrt_kv_commit",
        arguments=f"seq={last} (lane {lanes[-1]} of job {job.id}, {fault})",
    )
    if scope == "chip":
        for q in seqs.values():
            rt.kv.free(q)
    return f"{alias} B{batch}: every active lane's sequence is the {fault} job's"


def _commit_status(rt: Runtime, seq: KvSeqId) -> int:
    try:
        rt.kv.commit(seq)
    except RuntimeLayerError as exc:
        return int(getattr(exc, "status", RuntimeStatus.INTERNAL))
    return RuntimeStatus.OK


def _one_profile(s: Session, rt: Runtime, alias: str, batch: int, *, every_other: bool) -> str:
    """One B``batch`` decode job: every other lane active (lane 0 first) or every lane active (a full batch, which
    a shim may run down another path), as many as the model's KV capacity holds beside a bystander and a twin at
    a time."""
    pkg = s.package
    m = pkg.model(alias)
    vocab = int(m.decode.output("logits").shape[-1])
    max_tokens = int(m.prefill.input("tokens").shape[-1])
    active = [lane for lane in range(batch) if lane % 2 == 0 or not every_other][: max(1, m.kv.max_sequences - 2)]
    seed = 7 if every_other else 13
    prompts = {lane: crosstalk_prompt(vocab, max_tokens, batch, lane, seed) for lane in [*active, _OUTSIDE]}
    twins = {lane: _twin(rt, pkg, alias, p) for lane, p in prompts.items()}
    seqs = {lane: _prefilled(rt, pkg, alias, p)[0] for lane, p in prompts.items()}
    lengths = {lane: rt.kv.length(q) for lane, q in seqs.items()}
    with rt.job_buffers(m.decode.name, batch) as (inputs, outputs):
        tokens, positions, valid, kv = [], [], [], []
        for lane in range(batch):
            on = lane in active
            positions.append(rt.kv.append(seqs[lane], 1) if on else 0)
            tokens.append(twins[lane].token if on else 0)
            valid.append(on)
            kv.append(seqs[lane] if on else None)
        if s.native and len(active) > 1:
            _lane_position_checked(rt, pkg, alias, (inputs, outputs), tokens, positions, valid, kv, active[-1])
            _one_sequence_one_lane(rt, pkg, alias, (inputs, outputs), tokens, positions, valid, kv, active)
            _outputs_of_one_lane_refused(rt, pkg, alias, (inputs, outputs), tokens, positions, valid, kv)
        write_decode_lanes(inputs, tokens, positions, valid, mask=decode_mask(pkg, alias))
        try:
            job = rt.submit(m.decode.name, inputs, outputs, kv=kv)
        except InvalidArgument as exc:
            raise ExpectationFailed(
                f"LAYOUT-2: a B{batch} decode of {alias}, a profile graph {m.decode.name!r} lists, with lanes {active} "
                "active at their committed lengths, must run",
                call="calrt_job_submit",
                arguments=f"graph={m.decode.name!r}, batch={batch}, positions {positions}",
                returned=_returned(exc),
            ) from None
        result = rt.wait(job, 30)
        expect(result.ok, f"the B{batch} decode job of {alias} succeeds", call="rt.wait", returned=result.state)
        rows = outputs.read("logits")
        for lane in active:
            if not _close(pkg, alias, rows[lane], twins[lane].decode):
                raise ExpectationFailed(
                    f"graph {m.decode.name!r} B{batch}, lane {lane} (active): logits differ from the same lane run "
                    f"alone at B1 (max |diff| {float(np.abs(rows[lane] - twins[lane].decode).max()):.3g})",
                    call="calrt_job_submit / calrt_job_wait",
                    arguments=f"graph={m.decode.name!r}, batch={batch}, active lanes {active}",
                    returned=f"lane {lane} logits",
                )
        for lane in active:
            rt.kv.commit(seqs[lane])
    for lane, q in seqs.items():
        want = KvLength(lengths[lane].committed + 1, lengths[lane].committed + 1) if lane in active else lengths[lane]
        expect(
            rt.kv.length(q) == want,
            f"B{batch}: sequence {q} ({'lane ' + str(lane) if lane != _OUTSIDE else 'outside the job'}) has length {want}",
            call="calrt_kv_length",
            returned=rt.kv.length(q),
        )
    _after_batch(s, rt, alias, batch, active, seqs, twins)
    for q in seqs.values():
        rt.kv.free(q)
    if len(active) == batch:
        return f"{alias} B{batch}: a full batch's {batch} lanes equal their B1 twins"
    return (
        f"{alias} B{batch}: {len(active)} active lanes equal their B1 twins, {batch - len(active)} inactive wrote no KV"
    )


def _lane_position_checked(
    rt: Runtime,
    pkg: Package,
    alias: str,
    buffers: tuple[HostBuffer, HostBuffer],
    tokens: list[int],
    positions: list[int],
    valid: list[bool],
    kv: list[KvSeqId | None],
    lane: int,
) -> None:
    """KV-1 per lane: the same batch job, but lane ``lane`` (not lane 0) names the position after its committed
    length, straight into ``calrt_job_submit``: INVALID_ARGUMENT (a shim that checks lane 0 only, written for
    B1, runs it and writes that lane's K/V row one position off)."""
    m = pkg.model(alias)
    wrong = list(positions)
    wrong[lane] += 1
    write_decode_lanes(buffers[0], tokens, wrong, valid, mask=decode_mask(pkg, alias))
    expect_submit_refused(
        rt,
        m.decode.name,
        buffers,
        kv,
        f"KV-1: calrt_job_submit of a B{len(positions)} decode of {alias} whose lane {lane} names position "
        f"{wrong[lane]} (its sequence {kv[lane]} holds {positions[lane]} tokens, 1 reserved)",
        arguments=f"graph={m.decode.name!r}, batch={len(positions)}, positions {wrong}",
    )


def _one_sequence_one_lane(
    rt: Runtime,
    pkg: Package,
    alias: str,
    buffers: tuple[HostBuffer, HostBuffer],
    tokens: list[int],
    positions: list[int],
    valid: list[bool],
    kv: list[KvSeqId | None],
    active: Sequence[int],
) -> None:
    """KV-1 across lanes: the same batch job, but the last active lane names the first active lane's sequence at
    its position, straight into ``calrt_job_submit``: INVALID_ARGUMENT (the job would write two tokens into a
    sequence that reserved one; a shim that checks each lane alone runs it, and both lanes write the same row)."""
    m = pkg.model(alias)
    first, last = active[0], active[-1]
    twice, where = list(kv), list(positions)
    twice[last], where[last] = kv[first], positions[first]
    write_decode_lanes(buffers[0], tokens, where, valid, mask=decode_mask(pkg, alias))
    expect_submit_refused(
        rt,
        m.decode.name,
        buffers,
        twice,
        f"KV-1: calrt_job_submit of a B{len(positions)} decode of {alias} whose lanes {first} and {last} both name "
        f"sequence {kv[first]} at position {positions[first]} (1 token reserved)",
        arguments=f"graph={m.decode.name!r}, batch={len(positions)}, kv {twice}",
    )


def _outputs_of_one_lane_refused(
    rt: Runtime,
    pkg: Package,
    alias: str,
    buffers: tuple[HostBuffer, HostBuffer],
    tokens: list[int],
    positions: list[int],
    valid: list[bool],
    kv: list[KvSeqId | None],
) -> None:
    """LAYOUT-1 at B>1: the same batch job with an outputs buffer of the B1 layout (one logits row), straight into
    ``calrt_job_submit``: INVALID_ARGUMENT (a shim that sizes the outputs from the manifest's ``[1, vocab]`` shape
    takes it, and its DMA writes B rows into one)."""
    m = pkg.model(alias)
    batch = len(positions)
    logits = buffers[1].layout.slot("logits")
    one_lane = buffers[1].layout.nbytes - (batch - 1) * (logits.nbytes // batch)
    handle = ctypes.c_void_p()
    expect_code(
        raw_call(rt, "calrt_buffer_create", one_lane, ctypes.byref(handle)),
        RuntimeStatus.OK,
        f"calrt_buffer_create of {one_lane} B",
        call="calrt_buffer_create",
    )
    write_decode_lanes(buffers[0], tokens, positions, valid, mask=decode_mask(pkg, alias))
    status, job = raw_submit(rt, m.decode.name, buffers[0], handle, kv=kv)
    if status == RuntimeStatus.OK:  # its writes land (or not) before the buffer goes back
        raw_call(rt, "calrt_job_wait", job, 30_000, None)
        raw_call(rt, "calrt_job_release", job)
    raw_call(rt, "calrt_buffer_release", handle)
    expect_code(
        status,
        RuntimeStatus.INVALID_ARGUMENT,
        f"LAYOUT-1: calrt_job_submit of a B{batch} decode of {alias} whose outputs buffer holds one lane's logits "
        f"({one_lane} B, the B{batch} layout needs {buffers[1].layout.nbytes} B)",
        call="calrt_job_submit",
        arguments=f"graph={m.decode.name!r}, batch={batch}, outputs {one_lane} B",
    )


def _after_batch(
    s: Session,
    rt: Runtime,
    alias: str,
    batch: int,
    active: Sequence[int],
    seqs: dict[int, KvSeqId],
    twins: dict[int, Twin],
) -> None:
    """Every sequence decodes once more at B1, as does a fresh twin: an overwritten KV row shows here."""
    pkg = s.package
    for lane, q in seqs.items():
        twin = twins[lane]
        ref_seq, _ = _prefilled(rt, pkg, alias, twin.prompt)
        if lane in active:
            _decode_b1(rt, pkg, alias, ref_seq, twin.token)
            nxt = int(np.argmax(twin.decode))
        else:
            nxt = twin.token
        want = _decode_b1(rt, pkg, alias, ref_seq, nxt)
        rt.kv.free(ref_seq)
        got = _decode_b1(rt, pkg, alias, q, nxt)
        if not _close(pkg, alias, got, want):
            where = f"active lane {lane}" if lane in active else "outside the job"
            raise ExpectationFailed(
                f"after a B{batch} decode of {alias} with inactive lanes "
                f"{[x for x in range(batch) if x not in active]}, sequence {q} ({where}) decodes differently from "
                f"its twin (max |diff| {float(np.abs(got - want).max()):.3g}): the job wrote a KV row it does not "
                "own (an inactive lane must write no KV, 000 §7.3)",
                call=f"calrt_job_submit (B{batch}) / calrt_kv_*",
                arguments=f"graph={pkg.model(alias).decode.name!r}, batch={batch}",
                returned=f"sequence {q}'s next logits",
            )


@check(
    "long_run",
    "many jobs on both chips from several threads, mixed prefill and decode over every profile (96 quick, 2000 "
    "standard, 10000 long): every output equals its twin computed alone",
    clauses=("JOB-5", "BATCH-2", "THREAD-1"),
    seconds={ConformanceLevel.STANDARD: 600.0, ConformanceLevel.LONG: 3000.0},
)
def _long_run(s: Session) -> str:
    """Each model gets a pool of prompts whose twins (prefill logits, greedy token, B1 decode logits) run alone
    first. Then one thread per model and bank (PING, PONG; every other iteration AUTO, which the serving core's
    sync mode uses) repeats: a prefill of the next prompt, then a decode of that
    sequence at the next profile of the model with the sequence in the next lane and every other lane inactive.
    Outputs are read the moment the wait returns (a job reported done before its outputs landed shows) and
    compared with the twin; a mismatch names the job, its chip, graph and lane."""
    pkg = s.package
    aliases = list(s.pair()) if len(pkg.models) > 1 else [pkg.models[0].alias]
    total = LONG_RUN_JOBS[s.level]
    with s.configured() as rt:
        twins: dict[str, list[Twin]] = {}
        for mi, alias in enumerate(aliases):
            m = pkg.model(alias)
            vocab, max_tokens = int(m.prefill.output("logits").shape[-1]), int(m.prefill.input("tokens").shape[-1])
            twins[alias] = [_twin(rt, pkg, alias, crosstalk_prompt(vocab, max_tokens, mi, 9, i)) for i in range(6)]
        workers = [(alias, engine) for alias in aliases for engine in (Engine.PING, Engine.PONG)]
        per_worker = max(1, total // (2 * len(workers)))
        bad: list[str] = []
        errors: list[str] = []
        counts = {"jobs": 0}
        lock = threading.Lock()

        def worker(alias: str, engine: Engine, wi: int) -> None:
            engines = (engine, Engine.AUTO)  # every other iteration on AUTO, the bank the serving core asks for
            try:
                for it in range(per_worker):
                    if bad or errors:
                        return
                    twin = twins[alias][(it + wi) % len(twins[alias])]
                    n = _iteration(rt, pkg, alias, engines[it % 2], twin, it, bad)
                    with lock:
                        counts["jobs"] += n
            except Exception as exc:  # a thread's failure is the finding
                errors.append(f"{alias}/{engine.value}: {_returned(exc)}")

        t0 = time.monotonic()
        threads = [threading.Thread(target=worker, args=(a, e, i), daemon=True) for i, (a, e) in enumerate(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.monotonic() - t0
    expect(
        not errors, f"{len(errors)} threads failed during the long run", call="rt.submit / rt.wait", returned=errors[:3]
    )
    expect(
        not bad,
        f"{len(bad)} of {counts['jobs']} jobs returned outputs that are not their twin's: {'; '.join(bad[:3])}",
        call="calrt_job_wait (outputs)",
        returned=bad[:3],
    )
    s.evidence.update(jobs=counts["jobs"], seconds=round(seconds, 2), level=s.level.value)
    return f"{counts['jobs']} jobs from {len(workers)} threads in {seconds:.1f} s, every output equal to its twin"


def _iteration(rt: Runtime, pkg: Package, alias: str, engine: Engine, twin: Twin, it: int, bad: list[str]) -> int:
    """One prefill and one decode at the iteration's profile and lane; mismatches appended to ``bad``. Jobs run."""
    m = pkg.model(alias)
    job, seq, inputs, outputs = prefill_job(rt, pkg, alias, twin.prompt, engine=engine)
    try:
        result = rt.wait(job, 30)
        got = outputs.read("logits")[0]
        chip = m.prefill.target_chips[0]
        if not result.ok or not _close(pkg, alias, got, twin.prefill):
            bad.append(f"job {job.id} chip {chip} graph {m.prefill.name!r} lane 0: {_diff(got, twin.prefill)}")
            return 1
        rt.kv.commit(seq)
        profiles = m.decode.batch_profiles
        batch = profiles[it % len(profiles)]
        lane = it % batch
        with rt.job_buffers(m.decode.name, batch) as (ins, outs):
            position = rt.kv.append(seq, 1)
            valid = [x == lane for x in range(batch)]
            write_decode_lanes(ins, [twin.token] * batch, [position] * batch, valid, mask=decode_mask(pkg, alias))
            djob = rt.submit(m.decode.name, ins, outs, engine=engine, kv=[seq if v else None for v in valid])
            dres = rt.wait(djob, 30)
            row = outs.read("logits")[lane]
            if not dres.ok or not _close(pkg, alias, row, twin.decode):
                bad.append(
                    f"job {djob.id} chip {chip} graph {m.decode.name!r} B{batch} lane {lane}: {_diff(row, twin.decode)}"
                )
        return 2
    finally:
        rt.release_buffer(inputs)
        rt.release_buffer(outputs)
        rt.kv.free(seq)


def _diff(got: np.ndarray, want: np.ndarray) -> str:
    if not np.any(got):
        return "all zeros (nothing written)"
    return f"max |diff| {float(np.abs(got - want).max()):.3g}"


#: a decode compared with a prefill of the same tokens every this many positions, and at the context's end
POSITION_STEP = {ConformanceLevel.QUICK: 16, ConformanceLevel.STANDARD: 8, ConformanceLevel.LONG: 4}
QUICK_DECODES = 32  # positions decoded at --level quick, the context's last


@check(
    "kv_positions",
    "one sequence decoded to the end of the context: the logits at every checked position equal a prefill of the "
    "same tokens",
    clauses=("KV-6", "COMPUTE-1"),
    seconds={ConformanceLevel.STANDARD: 120.0, ConformanceLevel.LONG: 240.0},
)
def _kv_positions(s: Session) -> str:
    """Per model: a prompt prefilled (4 tokens; all but the last 32 positions at ``quick``), then B1 decodes of
    seeded tokens one position at a time to the end of the context (the prefill graph's token count, at most the
    sequence's capacity). At every ``POSITION_STEP``-th position and the last, a fresh sequence prefills the same
    tokens at once: its logits are computed from K/V written in one job, the decode's from K/V written one row per
    job, so a shim that writes a row at the wrong position (past a cache page, on one chip) disagrees there."""
    pkg = s.package
    done = []
    with s.configured() as rt:
        for mi, m in enumerate(pkg.models):
            vocab, max_tokens = int(m.prefill.output("logits").shape[-1]), int(m.prefill.input("tokens").shape[-1])
            end = min(max_tokens, int(m.architecture.context_limit))
            tokens = np.random.default_rng([mi, 0x9051]).integers(0, vocab, size=end).astype(np.int32)
            checked = _decode_to_the_end(s, rt, m.alias, tokens)
            done.append(f"{m.alias}: decoded to position {end - 1}, {checked} positions compared with a prefill")
    return "; ".join(done)


def _decode_to_the_end(s: Session, rt: Runtime, alias: str, tokens: np.ndarray) -> int:
    pkg = s.package
    # quick: all but the last QUICK_DECODES positions prefilled at once, those decoded (a row misplaced from some
    # position on shows at the context's end wherever it starts); standard and long decode nearly the whole context
    start = max(4, len(tokens) - QUICK_DECODES) if s.level is ConformanceLevel.QUICK else 4
    step = POSITION_STEP[s.level]
    seq, _ = _prefilled(rt, pkg, alias, tokens[:start])
    checked = 0
    try:
        for position in range(start, len(tokens)):
            got = _decode_b1(rt, pkg, alias, seq, int(tokens[position]))
            if (position - start) % step and position != len(tokens) - 1:
                continue
            ref, want = _prefilled(rt, pkg, alias, tokens[: position + 1])
            rt.kv.free(ref)
            checked += 1
            if not _close(pkg, alias, got, want):
                raise ExpectationFailed(
                    f"KV-6: {alias}: the B1 decode at position {position} differs from a prefill of the same "
                    f"{position + 1} tokens (max |diff| {float(np.abs(got - want).max()):.3g}): a K/V row was "
                    "written at another position than the job named",
                    call="calrt_job_submit (decode) / calrt_kv_append",
                    arguments=f"graph={pkg.model(alias).decode.name!r}, batch=1, position {position}",
                    returned=f"logits at position {position}",
                )
    finally:
        rt.kv.free(seq)
    return checked
