"""Checks of ABI promises a shim under deadline gets subtly wrong, and that calctl never provokes by itself.

Memory figures against the topology and the chip a model sits on (MEM-1, MEM-2), and raw calls calctl refuses
before the library would see them (chip masks, short buffers, descriptors of the wrong size, out-parameters on a
refusal, descriptor arrays reused after the call). Each judges what the library answers, straight through the C ABI
where calctl's own bookkeeping would refuse first. A board under stress (sequences in flight, hung jobs, resets
while jobs compute) is ``checks_recovery``.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any

import numpy as np

from calctl.errors import CalctlError
from calctl.package.model import Package, SectionKind
from calctl.runtime import Runtime
from calctl.runtime.conformance.framework import (
    ExpectationFailed,
    Session,
    Unsupported,
    _unwrap,
    check,
    decode_mask,
    expect,
    expect_code,
    golden_prompt,
    prefill_job,
    raw_call,
    raw_job_info,
    write_decode,
    write_prefill,
)
from calctl.runtime.errors import RuntimeStatus
from calctl.runtime.memory_figures import memory_findings
from calctl.runtime.types import JobState, KvSeqId

_SUCCEEDED = list(JobState).index(JobState.SUCCEEDED)  # CALRT_JOB_SUCCEEDED (declaration order, calrt.h)


def _committed_prefill(rt: Runtime, pkg: Package, alias: str, prompt: np.ndarray) -> tuple[KvSeqId, np.ndarray]:
    job, seq, _, outputs = prefill_job(rt, pkg, alias, prompt)
    expect(rt.wait(job, 10).ok, f"a {alias} prefill succeeds", call="rt.wait")
    rt.kv.commit(seq)
    return seq, outputs.read("logits")


def _decode_once(rt: Runtime, pkg: Package, alias: str, seq: KvSeqId, token: int) -> np.ndarray:
    """One B1 decode step of ``seq`` (reserved, run, committed): its logits."""
    m = pkg.model(alias)
    with rt.job_buffers(m.decode.name) as (inputs, outputs):
        position = rt.kv.append(seq, 1)
        write_decode(inputs, token, position, mask=decode_mask(pkg, alias))
        expect(rt.wait(rt.submit(m.decode.name, inputs, outputs, kv=[seq]), 10).ok, "a decode succeeds", call="rt.wait")
        rt.kv.commit(seq)
        return outputs.read("logits").copy()


def _weights_on(pkg: Package, chip: int) -> int:
    """Bytes of the package's parameter sections on ``chip``: what its DRAM must hold once loaded."""
    return sum(
        int(sec.size)
        for m in pkg.models
        for sec in m.sections
        if sec.kind is SectionKind.PARAMS and (int(sec.chip_mask) >> chip) & 1
    )


def _alone(pkg: Package, alias: str) -> Package:
    """``pkg`` cut to one model and its memory plan: a load whose chip is known."""
    others = {m.alias for m in pkg.models} - {alias}
    return dataclasses.replace(
        pkg,
        models=(pkg.model(alias),),
        memory_plan=tuple(r for r in pkg.memory_plan if r.owner not in others),
    )


def _figures(rt: Runtime, topo: Any, when: str) -> list[tuple[int | None, int | None]]:
    """(used, total) per chip, each checked as bytes of its chip against the topology's DRAM (MEM-1)."""
    readings = rt.memory_usage()
    for finding in memory_findings(topo, readings):
        raise ExpectationFailed(
            f"{when}, {finding.text()}",
            call=finding.call,
            arguments=f"chip={finding.chip}",
            returned=next(f"used {m.used_bytes}, total {m.total_bytes}" for m in readings if m.chip == finding.chip),
        )
    return [(m.used_bytes, m.total_bytes) for m in readings]


@check(
    "memory_figures",
    "calrt_memory_usage is bytes of the chip asked for: total = the topology's DRAM, a model's load shows on its "
    "own chip by at least its weights, before, during and after a load",
    clauses=("MEM-1", "MEM-2"),
)
def _memory_figures(s: Session) -> str:
    """Each model is loaded alone (the package cut to that model), so its chip is known: that chip's usage must
    grow by at least the model's weights (a figure that grows less cannot be bytes) and every other chip's by
    less than half as much (figures of the two chips swapped). Read before the load, while a job runs, and after
    the unload (back to the baseline)."""
    pkg = s.package
    notes = []
    with s.open() as rt:
        topo = rt.topology()
        base = _figures(rt, topo, "before a load")
        if all(u is None for u, _ in base):
            raise Unsupported("calrt_memory_usage returned NOT_SUPPORTED on every chip (calctl reports null)")
        for m in pkg.models:
            alone = _alone(pkg, m.alias)
            rt.configure(rt.create_calbin(alone))
            job, seq, _, _ = prefill_job(rt, alone, m.alias)
            during = _figures(rt, topo, f"{m.alias} loaded, a job in flight")
            rt.wait(job, 30)
            rt.kv.free(seq)
            for chip, ((b, _), (d, _)) in enumerate(zip(base, during, strict=True)):
                if b is None or d is None:
                    continue
                grown, weights = d - b, _weights_on(alone, chip)
                if chip in m.target_chips:
                    expect(
                        grown >= weights,
                        f"chip {chip}: loading {m.alias} (weights {weights} B on chip {chip}) raised "
                        f"calrt_memory_usage by {grown} B: fewer than the weights, so the figure is not bytes of "
                        f"chip {chip} (KiB, or another chip's figure)",
                        call="calrt_memory_usage",
                        arguments=f"chip={chip}",
                        returned=f"{b} B before, {d} B loaded",
                    )
                    notes.append(f"{m.alias}: chip {chip} +{grown / 2**20:.1f} MiB")
            own = max(
                (d - b for chip, ((b, _), (d, _)) in enumerate(zip(base, during, strict=True))
                 if chip in m.target_chips and b is not None and d is not None),
                default=0,
            )  # fmt: skip
            for chip, ((b, _), (d, _)) in enumerate(zip(base, during, strict=True)):
                if chip in m.target_chips or b is None or d is None:
                    continue
                expect(
                    d - b <= max(1 << 20, own // 2),
                    f"chip {chip}: loading {m.alias}, which sits on chip(s) {list(m.target_chips)}, raised chip "
                    f"{chip}'s calrt_memory_usage by {d - b} B (its own chip's by {own} B): the figures are "
                    "attributed to the wrong chip",
                    call="calrt_memory_usage",
                    arguments=f"chip={chip}",
                    returned=f"{b} B before, {d} B loaded",
                )
            rt.reset_configuration()
            _figures(rt, topo, f"after unloading {m.alias}")
    s.evidence["memory_figures"] = notes
    return "; ".join(notes) + "; totals equal the topology's DRAM"


def _raw_desc(rt: Runtime, pkg: Package, keep: list[object]) -> Any:
    """The ``calrt_calbin_desc`` calctl would hand the library for ``pkg`` (changed by the caller before the call)."""
    from calctl.runtime._native.descriptors import calbin_desc
    from calctl.runtime.calbin import plan_calbin

    return calbin_desc(plan_calbin(pkg, rt.topology()), keep)


def _create_raw(rt: Runtime, desc: Any) -> int:
    """``calrt_calbin_create`` straight into the library; a calbin it accepts is released again."""
    handle = ctypes.c_void_p()
    rc = raw_call(rt, "calrt_calbin_create", ctypes.byref(desc), ctypes.byref(handle))
    if rc == RuntimeStatus.OK:
        raw_call(rt, "calrt_calbin_release", handle)
    return rc


def _bad_masks(s: Session, rt: Runtime, chips: int) -> list[str]:
    """Graph and model chip masks of 0 and of a chip past the board, and a graph on a chip its model is not on:
    INVALID_CALBIN (CALBIN-1)."""
    tried = []
    for where in ("graph", "model"):
        for mask in (0, 1 << chips):
            keep: list[object] = []
            desc = _raw_desc(rt, s.package, keep)
            if where == "graph":
                desc.graphs[0].chip_mask = mask
            else:
                desc.models[0].chip_mask = mask
            expect_code(
                _create_raw(rt, desc),
                RuntimeStatus.INVALID_CALBIN,
                f"calrt_calbin_create with {where} chip mask {mask:#x} on a {chips}-chip board",
                call="calrt_calbin_create",
                arguments=f"{where}s[0].chip_mask={mask:#x}",
            )
            tried.append(f"{where} {mask:#x}")
    keep.clear()
    desc = _raw_desc(rt, s.package, keep)
    owner = next(m for m in desc.models[: len(s.package.models)] if m.alias == desc.graphs[0].model)
    others = [1 << c for c in range(chips) if not owner.chip_mask >> c & 1]
    if others:  # a graph on a chip of the board its model is not on (calctl refuses that overreach itself)
        desc.graphs[0].chip_mask = others[0]
        expect_code(
            _create_raw(rt, desc),
            RuntimeStatus.INVALID_CALBIN,
            f"CALBIN-1: calrt_calbin_create with graph {desc.graphs[0].name.decode()!r} on chip mask {others[0]:#x}, "
            f"outside its model's chips ({owner.chip_mask:#x})",
            call="calrt_calbin_create",
            arguments=f"graphs[0].chip_mask={others[0]:#x}, its model's {owner.chip_mask:#x}",
        )
        tried.append(f"graph {others[0]:#x} outside its model's {owner.chip_mask:#x}")
    return tried


def _submit_raw(rt: Runtime, graph: bytes, ins: Any, outs: Any, batch: int, lanes: list[int], engine: int = 0) -> int:
    """``calrt_job_submit`` with a descriptor as given (batch, n_kv = len(lanes)); a job it accepts is waited for
    and released, so a lax shim's acceptance does not leave work behind. Its status."""
    from calctl.runtime._native import lib as L

    arr = (ctypes.c_uint64 * max(len(lanes), 1))(*lanes)
    desc = L.CalrtJobDesc(graph, ins, outs, engine, batch, len(lanes), arr, 0)
    job = ctypes.c_uint64()
    rc = raw_call(rt, "calrt_job_submit", ctypes.byref(desc), ctypes.byref(job))
    if rc == RuntimeStatus.OK:
        raw_call(rt, "calrt_job_wait", job.value, 10_000, ctypes.byref(L.CalrtJobInfo()))
        raw_call(rt, "calrt_job_release", job.value)
    return rc


def _buffer(rt: Runtime, size: int) -> ctypes.c_void_p:
    handle = ctypes.c_void_p()
    expect_code(
        raw_call(rt, "calrt_buffer_create", size, ctypes.byref(handle)),
        RuntimeStatus.OK,
        f"calrt_buffer_create of {size} B",
        call="calrt_buffer_create",
    )
    return handle


@check(
    "raw_refusals",
    "calls calctl never makes are refused with the documented status: chip masks 0 and past the board, short or "
    "unaligned buffers, descriptors of the wrong size, one buffer as inputs and outputs, releasing a job in flight",
    clauses=(
        "CALBIN-1",
        "LAYOUT-1",
        "LAYOUT-2",
        "OWN-3",
        "OWN-8",
        "OWN-9",
        "STATUS-1",
        "CONV-2",
        "KV-1",
        "KV-4",
    ),
    native_only=True,
)
def _raw_refusals(s: Session) -> str:
    """Every call goes straight into the library with one thing wrong and everything else valid (a reserved
    sequence, the golden prompt): calctl refuses each before the library would see it, so only this check tells
    whether the shim does. Out-parameters of refused calls are preset and must come back untouched."""
    pkg = s.package
    m = pkg.models[0]
    name = m.prefill.name
    prompt = golden_prompt(pkg, m.alias)
    with s.configured() as rt:
        chips = rt.topology().chips
        tried = _bad_masks(s, rt, chips)
        ins, outs = rt.alloc_inputs(name), rt.alloc_outputs(name)
        write_prefill(ins, prompt)
        allocated = rt.kv.allocate(m.alias)
        rt.kv.append(allocated, len(prompt))
        seq = int(allocated)
        need_out = outs.layout.nbytes
        short = _buffer(rt, need_out - outs.layout.slot("logits").np_dtype.itemsize)
        short_in = _buffer(rt, ins.layout.nbytes - 4)  # one int32 token short of the layout
        cases: list[tuple[str, Any, Any, int, list[int], int, RuntimeStatus]] = [
            ("an output buffer one element short", ins.native, short, 1, [seq], 0, RuntimeStatus.INVALID_ARGUMENT),
            ("an input buffer one element short", short_in, outs.native, 1, [seq], 0, RuntimeStatus.INVALID_ARGUMENT),
            ("the inputs buffer as its outputs too", ins.native, ins.native, 1, [seq], 0, RuntimeStatus.INVALID_ARGUMENT),
            ("n_kv 2 at batch 1", ins.native, outs.native, 1, [seq, seq], 0, RuntimeStatus.INVALID_ARGUMENT),
            ("n_kv 0 at batch 1", ins.native, outs.native, 1, [], 0, RuntimeStatus.INVALID_ARGUMENT),
            ("batch 3, not a profile of the graph", ins.native, outs.native, 3, [seq, 0, 0], 0,
             RuntimeStatus.INVALID_ARGUMENT),
            ("engine 7, not an engine", ins.native, outs.native, 1, [seq], 7, RuntimeStatus.INVALID_ARGUMENT),
        ]  # fmt: skip
        for what, i_buf, o_buf, batch, lanes, engine, want in cases:
            expect_code(
                _submit_raw(rt, name.encode(), i_buf, o_buf, batch, lanes, engine),
                want,
                f"calrt_job_submit with {what}",
                call="calrt_job_submit",
                arguments=f"graph={name!r}, {what}",
            )
        tried += [c[0] for c in cases]
        tried.append(_packed_inputs(s, rt))
        tried.append(_out_params_untouched(rt))
        tried.append(_release_in_flight(s, rt))
        tried += _kv_of_another_model(s, rt)
        tried.append(_release_current(rt))
    return f"{len(tried)} refusals: " + "; ".join(tried)


@check(
    "token_refusals",
    "a prefill naming a token outside the model's vocabulary, or no token at all, is refused with INVALID_ARGUMENT",
    clauses=("LAYOUT-3",),
    native_only=True,
)
def _token_refusals(s: Session) -> str:
    """Straight into the library (calctl never writes such inputs): the golden prompt with one token changed, or
    its valid length 0, on a sequence reserved for the prompt. The bookkeeping stub computes nothing and checks
    no token: it fails here by design."""
    pkg = s.package
    m = pkg.models[0]
    prompt = golden_prompt(pkg, m.alias)
    with s.configured() as rt:
        seq = rt.kv.allocate(m.alias)
        rt.kv.append(seq, len(prompt))
        tried = _bad_prefill_inputs(rt, m.prefill, int(seq), prompt)
        rt.kv.rollback(seq)
        rt.kv.free(seq)
        tried.append(_bad_decode_token(rt, pkg, m.alias))
    return f"{len(tried)} refusals: " + "; ".join(tried)


def _bad_decode_token(rt: Runtime, pkg: Package, alias: str) -> str:
    """LAYOUT-3 for a decode: a committed sequence, one token reserved, and a decode naming token ``vocab``: refused
    (a shim that range-checks its prefill path only lets a decode read past the embedding)."""
    m = pkg.model(alias)
    vocab = int(m.decode.output("logits").shape[-1])
    seq, _ = _committed_prefill(rt, pkg, alias, golden_prompt(pkg, alias))
    ins, outs = rt.alloc_inputs(m.decode.name), rt.alloc_outputs(m.decode.name)
    position = rt.kv.append(seq, 1)
    write_decode(ins, vocab, position, mask=decode_mask(pkg, alias))
    status = _submit_raw(rt, m.decode.name.encode(), ins.native, outs.native, 1, [int(seq)])
    rt.release_buffer(ins)
    rt.release_buffer(outs)
    rt.kv.rollback(seq)
    rt.kv.free(seq)
    expect_code(
        status,
        RuntimeStatus.INVALID_ARGUMENT,
        f"LAYOUT-3: calrt_job_submit of a decode with token {vocab} (the vocabulary is 0..{vocab - 1})",
        call="calrt_job_submit",
        arguments=f"graph={m.decode.name!r}, token {vocab}, position {position}, kv=[{seq}] (1 reserved)",
    )
    return f"a decode with token {vocab}"


def _bad_prefill_inputs(rt: Runtime, graph: Any, seq: int, prompt: np.ndarray) -> list[str]:
    """LAYOUT-3: a prefill (its sequence reserved for the prompt) whose inputs name a token past the vocabulary, a
    negative token, or a valid length of 0: refused, never computed (a kernel that wraps or reads past the
    embedding computes garbage, or crashes)."""
    vocab = int(graph.output("logits").shape[-1])
    tried = []
    last = len(prompt) - 1
    # (what, the token index to overwrite, its value, n_tokens)
    cases = (
        (f"token {vocab} (the vocabulary is 0..{vocab - 1})", last, vocab, len(prompt)),
        ("token -1", 0, -1, len(prompt)),
        ("n_tokens 0", 0, int(prompt[0]), 0),
    )
    for what, at, token, n in cases:
        ins, outs = rt.alloc_inputs(graph.name), rt.alloc_outputs(graph.name)
        tokens = np.zeros(ins.layout.slot("tokens").shape, np.int32)
        tokens[0, : len(prompt)] = prompt
        tokens[0, at] = token
        ins.write("tokens", tokens)
        ins.write("n_tokens", np.array([n], np.int32))
        expect_code(
            _submit_raw(rt, graph.name.encode(), ins.native, outs.native, 1, [seq]),
            RuntimeStatus.INVALID_ARGUMENT,
            f"LAYOUT-3: calrt_job_submit of a prefill with {what}",
            call="calrt_job_submit",
            arguments=f"graph={graph.name!r}, {what}, kv=[{seq}] reserved {len(prompt)}",
        )
        rt.release_buffer(ins)
        rt.release_buffer(outs)
        tried.append(f"a prefill with {what}")
    return tried


def _packed_inputs(s: Session, rt: Runtime) -> str:
    """LAYOUT-1: a decode job (a committed sequence, one token reserved) whose inputs buffer holds its tensors
    packed without the 64-byte alignment: shorter than the layout, so refused."""
    pkg = s.package
    m = pkg.models[0]
    job, seq, _, _ = prefill_job(rt, pkg, m.alias)
    expect(rt.wait(job, 10).ok, "a prefill succeeds", call="rt.wait")
    rt.kv.commit(seq)
    rt.kv.append(seq, 1)
    layout = rt.alloc_inputs(m.decode.name).layout
    packed = sum(slot.nbytes for slot in layout.slots)
    what = f"a decode inputs buffer of {packed} B, its tensors packed without the 64-byte alignment ({layout.nbytes} B)"
    if packed < layout.nbytes:
        outs = rt.alloc_outputs(m.decode.name)
        expect_code(
            _submit_raw(rt, m.decode.name.encode(), _buffer(rt, packed), outs.native, 1, [int(seq)]),
            RuntimeStatus.INVALID_ARGUMENT,
            f"calrt_job_submit with {what}",
            call="calrt_job_submit",
            arguments=f"graph={m.decode.name!r}, {what}",
        )
    rt.kv.rollback(seq)
    rt.kv.free(seq)
    return what


def _out_params_untouched(rt: Runtime) -> str:
    """CONV-2: a refused call leaves its out-parameters as they were."""
    from calctl.runtime._native import lib as L

    committed, reserved = ctypes.c_uint32(0xDEAD), ctypes.c_uint32(0xBEEF)
    rc = raw_call(rt, "calrt_kv_length", 0xFFFF_FFF0, ctypes.byref(committed), ctypes.byref(reserved))
    expect_code(rc, RuntimeStatus.INVALID_ARGUMENT, "calrt_kv_length of an unknown sequence", call="calrt_kv_length")
    info = L.CalrtJobInfo()
    info.id, info.generation = 0xDEAD, 0xBEEF
    rc2 = raw_call(rt, "calrt_job_query", 0xFFFF_FFF0, ctypes.byref(info))
    expect_code(rc2, RuntimeStatus.INVALID_ARGUMENT, "calrt_job_query of an unknown job", call="calrt_job_query")
    expect(
        (committed.value, reserved.value, info.id, info.generation) == (0xDEAD, 0xBEEF, 0xDEAD, 0xBEEF),
        "a refused call must leave its out-parameters unwritten (C ABI §3)",
        call="calrt_kv_length / calrt_job_query",
        arguments="unknown sequence / job",
        returned=f"out-parameters {committed.value:#x} {reserved.value:#x} {info.id:#x} {info.generation:#x}",
    )
    return "out-parameters of refused calls untouched"


def _release_in_flight(s: Session, rt: Runtime) -> str:
    """OWN-9: a job not terminal cannot be released; a released job is not found."""
    a = s.package.models[0].alias
    job, _, _, _ = s.armed_prefill(rt, "hang", a)
    expect_code(
        raw_call(rt, "calrt_job_release", job.id),
        RuntimeStatus.DEVICE_BUSY,
        f"calrt_job_release of job {job.id} in flight",
        call="calrt_job_release",
        arguments=f"job={job.id} (hung, in flight)",
    )
    s.reset_chip_or_board(rt, s.chip_of(a))  # calctl sees it aborted and releases the record itself
    rc, _ = raw_job_info(rt, job)
    expect_code(rc, RuntimeStatus.INVALID_ARGUMENT, f"calrt_job_query of released job {job.id}", call="calrt_job_query")
    expect_code(
        raw_call(rt, "calrt_job_release", job.id),
        RuntimeStatus.INVALID_ARGUMENT,
        f"a second calrt_job_release of job {job.id}",
        call="calrt_job_release",
        arguments=f"job={job.id} (released)",
    )
    nxt, seq, _, _ = prefill_job(rt, s.package, a)  # the next job must not get the released job's id
    expect(
        nxt.id != job.id,
        f"a released job's id is never given to another job: job {job.id} was released, and the next submit "
        f"returned id {nxt.id} (a caller still holding {job.id} would read another job's state)",
        call="calrt_job_submit",
        returned=f"job id {nxt.id}",
    )
    rc, _ = raw_job_info(rt, job)
    expect_code(
        rc, RuntimeStatus.INVALID_ARGUMENT, f"calrt_job_query of released job {job.id} after another submit",
        call="calrt_job_query", arguments=f"job={job.id} (released; job {nxt.id} submitted since)",
    )  # fmt: skip
    rt.wait(nxt, 30)
    rt.kv.free(seq)
    return (
        "release of a job in flight DEVICE_BUSY, a released job not found (also after another submit, whose id is "
        "new), released twice INVALID_ARGUMENT"
    )


def _kv_of_another_model(s: Session, rt: Runtime) -> list[str]:
    """KV-4, KV-1: a prefill naming a sequence of another model, and one whose reservation is a token short, are
    INVALID_ARGUMENT (one KvManager for both models must still keep the namespaces apart, 001 §7.1)."""
    pkg = s.package
    if len(pkg.models) < 2:  # one model: no other namespace to try, only the short reservation
        a = b = pkg.models[0].alias
    else:
        a, b = pkg.models[0].alias, pkg.models[1].alias
    mb = pkg.model(b)
    prompt = golden_prompt(pkg, b)
    ins, outs = rt.alloc_inputs(mb.prefill.name), rt.alloc_outputs(mb.prefill.name)
    write_prefill(ins, prompt)
    tried = []
    foreign = rt.kv.allocate(a)
    rt.kv.append(foreign, len(prompt))
    short = rt.kv.allocate(b)
    rt.kv.append(short, len(prompt) - 1)
    cases = [(f"a sequence reserved {len(prompt) - 1} of {len(prompt)}", short)]
    if a != b:
        cases.insert(0, (f"a sequence of {a}", foreign))
    for what, seq in cases:
        expect_code(
            _submit_raw(rt, mb.prefill.name.encode(), ins.native, outs.native, 1, [int(seq)]),
            RuntimeStatus.INVALID_ARGUMENT,
            f"calrt_job_submit of {b}'s prefill with {what}",
            call="calrt_job_submit",
            arguments=f"graph={mb.prefill.name!r}, kv=[{seq}] ({what})",
        )
        tried.append(f"{b}'s prefill with {what}")
    for seq in (foreign, short):
        rt.kv.rollback(seq)
        rt.kv.free(seq)
    return tried


def _release_current(rt: Runtime) -> str:
    """OWN-3: the current calbin cannot be released."""
    raw = _unwrap(rt)
    current = raw._current
    if current is not None:
        handle = raw._calbins[current.id][1]
        expect_code(
            raw_call(rt, "calrt_calbin_release", handle),
            RuntimeStatus.DEVICE_BUSY,
            "calrt_calbin_release of the current calbin",
            call="calrt_calbin_release",
        )
    return "release of the current calbin DEVICE_BUSY"


@check(
    "descriptor_copies",
    "the library copies the job descriptor's graph name and KV array at submit: the caller reuses them at once",
    clauses=("CONV-3",),
    native_only=True,
)
def _descriptor_copies(s: Session) -> str:
    """A job is submitted with its graph name and KV lane array in caller memory that is overwritten the moment
    the call returns (another graph's name, another sequence): a shim that keeps the pointers instead of copying
    runs another graph, writes another sequence, or refuses at run time. The job must succeed with the logits of
    its own prompt, and commit on its own sequence."""
    from calctl.runtime._native import lib as L

    pkg = s.package
    m = pkg.models[0]
    prompt = golden_prompt(pkg, m.alias)
    with s.configured() as rt:
        job0, seq0, _, out0 = prefill_job(rt, pkg, m.alias, prompt)
        expect(rt.wait(job0, 10).ok, "the reference job succeeds", call="rt.wait")
        want = out0.read("logits").copy()
        rt.kv.free(seq0)
        decoy = int(rt.kv.allocate(m.alias))
        ins, outs = rt.alloc_inputs(m.prefill.name), rt.alloc_outputs(m.prefill.name)
        write_prefill(ins, prompt)
        allocated = rt.kv.allocate(m.alias)
        rt.kv.append(allocated, len(prompt))
        seq = int(allocated)
        name = ctypes.create_string_buffer(m.prefill.name.encode(), 256)
        lanes = (ctypes.c_uint64 * 1)(seq)
        desc = L.CalrtJobDesc(ctypes.cast(name, ctypes.c_char_p), ins.native, outs.native, 0, 1, 1, lanes, 0)
        job = ctypes.c_uint64()
        # Jobs ahead of it on its chip: it cannot start before the caller reuses the memory below, so a shim that
        # reads the descriptor when the job runs shows it however fast the host is (on an idle host the job used
        # to run before the memset and the check passed such a shim).
        blockers = [prefill_job(rt, pkg, m.alias, prompt) for _ in range(2)]
        rc = raw_call(rt, "calrt_job_submit", ctypes.byref(desc), ctypes.byref(job))
        other = pkg.models[-1].decode.name if len(pkg.models) > 1 else m.decode.name
        ctypes.memset(name, 0, 256)
        name.value = other.encode()  # the caller's memory, reused at once
        lanes[0] = decoy
        expect_code(rc, RuntimeStatus.OK, "calrt_job_submit of a valid prefill", call="calrt_job_submit")
        info = L.CalrtJobInfo()
        wrc = raw_call(rt, "calrt_job_wait", job.value, 10_000, ctypes.byref(info))
        raw_call(rt, "calrt_job_release", job.value)
        for bjob, bseq, bins, bouts in blockers:
            rt.wait(bjob, 10)
            rt.kv.free(bseq)
            rt.release_buffer(bins)
            rt.release_buffer(bouts)
        expect(
            wrc == RuntimeStatus.OK and int(info.state) == _SUCCEEDED,
            "a job whose descriptor memory the caller reused after submit must still succeed",
            call="calrt_job_wait",
            returned=f"status {wrc}, state {int(info.state)}, job status {int(info.status)}",
        )
        got = outs.read("logits")
        expect(
            bool(np.array_equal(got, want)),
            "the job's logits are not its prompt's once the caller reused the descriptor's name and KV array: the "
            "library read them after calrt_job_submit returned",
            call="calrt_job_submit",
            returned=f"max |diff| {float(np.abs(got - want).max()):.3g}",
        )
        committed, reserved = ctypes.c_uint32(), ctypes.c_uint32()
        raw_call(rt, "calrt_kv_commit", seq)
        raw_call(rt, "calrt_kv_length", seq, ctypes.byref(committed), ctypes.byref(reserved))
        expect(
            committed.value == len(prompt),
            f"the job's own sequence {seq} holds its {len(prompt)} tokens",
            call="calrt_kv_length",
            returned=committed.value,
        )
        token = int(np.argmax(want[0]))
        twin, _ = _committed_prefill(rt, pkg, m.alias, prompt)
        expect(
            bool(
                np.allclose(
                    _decode_once(rt, pkg, m.alias, KvSeqId(seq), token), _decode_once(rt, pkg, m.alias, twin, token)
                )
            ),
            f"sequence {seq} decodes differently from a twin prefilled the ordinary way: the job wrote its K/V "
            "somewhere else (a KV array read after calrt_job_submit returned)",
            call="calrt_job_submit",
            arguments=f"kv=[{seq}], the caller's array changed to [{decoy}] after the call",
            returned="another sequence's next logits",
        )
        rt.kv.free(twin)
        raw_call(rt, "calrt_kv_length", decoy, ctypes.byref(committed), ctypes.byref(reserved))
        expect(
            committed.value == 0 and reserved.value == 0,
            f"sequence {decoy}, written into the caller's KV array after submit, must stay empty",
            call="calrt_kv_length",
            returned=(committed.value, reserved.value),
        )
    return "graph name and KV array reused by the caller after submit: the job ran on its own, logits exact"


class _Scribble:
    """The caller's side of ``calbin_descriptor_copies``: before ``calrt_calbin_create`` every string of the
    descriptor (path, graph names, model aliases, tensor and CSR input names) and every batch-profile table is moved
    into memory the check owns; the moment the call returns, that memory is overwritten with decoys (another
    graph's name, another model's alias, reversed tensor names, a path that does not exist, zero profiles)."""

    def __init__(self) -> None:
        self.strings: list[tuple[ctypes.Array[ctypes.c_char], bytes]] = []
        self.tables: list[ctypes.Array[ctypes.c_uint32]] = []
        self.called = False

    @property
    def overwritten(self) -> str:
        return f"{len(self.strings)} strings and {len(self.tables)} batch-profile tables overwritten"

    def _own(self, value: bytes | None, decoy: bytes) -> bytes | None:
        if value is None:
            return None
        buf = ctypes.create_string_buffer(value, max(len(value), len(decoy)) + 1)
        self.strings.append((buf, decoy))
        return ctypes.cast(buf, ctypes.c_char_p)  # type: ignore[return-value]  # a field takes the pointer

    def before(self, desc: Any) -> None:
        names = [desc.graphs[i].name for i in range(desc.n_graphs)]
        aliases = [desc.models[i].alias for i in range(desc.n_models)]

        def other(items: list[bytes], value: bytes) -> bytes:
            at = items.index(value) if value in items else -1
            return items[(at + 1) % len(items)] if at >= 0 and len(items) > 1 else b"~" + value[::-1]

        desc.path = self._own(desc.path, b"/nonexistent/calctl-conformance-overwritten")
        for i in range(desc.n_graphs):
            g = desc.graphs[i]
            g.name = self._own(g.name, other(names, g.name))
            g.model = self._own(g.model, other(aliases, g.model))
            for field in ("valid_length_input", "positions_input", "lane_valid_input"):
                value = getattr(g, field)
                setattr(g, field, self._own(value, b"~" + value[::-1] if value else b""))
            for tensors, n in ((g.inputs, g.n_inputs), (g.outputs, g.n_outputs)):
                for k in range(n):
                    tensors[k].name = self._own(tensors[k].name, b"~" + tensors[k].name[::-1])
            table = (ctypes.c_uint32 * max(g.n_batch_profiles, 1))(*g.batch_profiles[: g.n_batch_profiles])
            self.tables.append(table)
            g.batch_profiles = ctypes.cast(table, ctypes.POINTER(ctypes.c_uint32))
        for i in range(desc.n_models):
            desc.models[i].alias = self._own(desc.models[i].alias, other(aliases, desc.models[i].alias))

    def after(self) -> None:
        for buf, decoy in self.strings:
            ctypes.memset(buf, 0, len(buf))
            buf.value = decoy
        for table in self.tables:
            ctypes.memset(table, 0, ctypes.sizeof(table))


class _DescriptorCalls:
    """The library's functions, with ``calrt_calbin_create`` between the two halves of a :class:`_Scribble` (or,
    without one, with every descriptor it was given held until this object goes: a calbin the check trusts)."""

    def __init__(self, fn: Any, scribble: _Scribble | None) -> None:
        self._fn, self._scribble = fn, scribble
        self.held: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)

    def calrt_calbin_create(self, dev: Any, desc: Any, out: Any) -> int:
        self.held.append(desc)
        if self._scribble is None:
            return int(self._fn.calrt_calbin_create(dev, desc, out))
        self._scribble.before(desc._obj)
        try:
            return int(self._fn.calrt_calbin_create(dev, desc, out))
        finally:
            self._scribble.called = True
            self._scribble.after()


def _created(rt: Runtime, pkg: Package, scribble: _Scribble | None) -> tuple[Any, _DescriptorCalls]:
    """``pkg``'s calbin created through a :class:`_DescriptorCalls` (returned too: it holds the descriptors)."""
    raw = _unwrap(rt)
    calls = _DescriptorCalls(raw._fn, scribble)
    library, raw._fn = raw._fn, calls
    try:
        return rt.create_calbin(pkg), calls
    finally:
        raw._fn = library


def _prefill_and_decode(rt: Runtime, pkg: Package, alias: str) -> tuple[np.ndarray, np.ndarray]:
    """The golden prompt's prefill logits and one B1 decode's after it; the sequence is freed again."""
    seq, logits = _committed_prefill(rt, pkg, alias, golden_prompt(pkg, alias))
    logits = logits.copy()
    decoded = _decode_once(rt, pkg, alias, seq, int(np.argmax(logits[0])))
    rt.kv.free(seq)
    return logits, decoded


@check(
    "calbin_descriptor_copies",
    "calrt_calbin_create copies its descriptor's strings and arrays: the caller overwrites them the moment it returns",
    clauses=("CONV-3",),
    native_only=True,
)
def _calbin_descriptor_copies(s: Session) -> str:
    """CONV-3 for the calbin descriptor (``descriptor_copies`` tries the job descriptor). calctl's own descriptor
    memory is freed after ``calrt_calbin_create`` returns, and freed memory often still reads the same: a shim
    that kept the pointers works by luck. Here the memory is overwritten at once; the board is then configured
    and each model's golden prompt prefilled and decoded one step by its graph names and alias, and must give the
    logits a normally created calbin gives."""
    pkg = s.package
    with s.open() as rt:
        calbin, held = _created(rt, pkg, None)  # its descriptor memory intact while the twin outputs are taken
        rt.configure(calbin)
        want = {m.alias: _prefill_and_decode(rt, pkg, m.alias) for m in pkg.models}
        del held
    scribble = _Scribble()
    step = "a calbin whose descriptor the caller overwrote the moment calrt_calbin_create returned"
    with s.open() as rt:
        try:
            calbin, _ = _created(rt, pkg, scribble)
            step += f" ({scribble.overwritten})"
            rt.configure(calbin)
            for m in pkg.models:
                got = _prefill_and_decode(rt, pkg, m.alias)
                for what, a, b in (("prefill", got[0], want[m.alias][0]), ("decode", got[1], want[m.alias][1])):
                    expect(
                        bool(np.array_equal(a, b)),
                        f"CONV-3: with {step}, {m.alias!r}'s {what} logits differ from a calbin whose descriptor "
                        "stayed intact: the library reads the caller's strings or tables after calrt_calbin_create",
                        call="calrt_calbin_create",
                        returned=f"max |diff| {float(np.abs(a - b).max()):.3g}" if a.shape == b.shape else a.shape,
                    )
        except CalctlError as exc:
            if not scribble.called:  # refused before the library saw the descriptor: not this clause's finding
                raise
            raise ExpectationFailed(
                f"CONV-3: with {step}, configuring the board and running each model's golden prompt by its own "
                "graph names and alias failed, as it did not with the descriptor intact: the library reads the "
                "caller's descriptor after calrt_calbin_create returned",
                call="calrt_calbin_create",
                returned=f"{type(exc).__name__}: {exc}",
            ) from None
    return f"{scribble.overwritten} after calrt_calbin_create returned: {len(pkg.models)} models prefilled and decoded exactly"
