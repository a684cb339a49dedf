"""Mock-board semantics beyond the shared conformance suite: DRAM accounting, engines, MCHIP,
fault kinds and their reset scopes, memory baseline and leaks, KV corruption."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from calctl.errors import ConfigError
from calctl.package.model import ChipMode, Package
from calctl.runtime import open_runtime
from calctl.runtime.errors import (
    CcuException,
    DeviceLost,
    InvalidArgument,
    InvalidCalbin,
    NotSupported,
    OutOfMemory,
    RuntimeLayerError,
    RuntimeStatus,
)
from calctl.runtime.mock import FaultKind, FaultPlan, FaultRule, GraphTiming, MockRuntime, TimingModel, open_mock
from calctl.runtime.types import Engine, Health, Job, JobResult, JobState, KvSeqId, ResetScope
from tests.unit.runtime.runtime_helpers import b4_package, golden_prompt, package, prefill_job, write_decode
from tests.waiting import wait_until

MIB = 1024 * 1024
#: Every job takes exactly this long (no per-token term): timing tests compare multiples of it.
FIXED = TimingModel(
    default=GraphTiming(prefill_base_s=0.05, prefill_per_token_s=0.0, decode_base_s=0.05, decode_per_kv_token_s=0.0)
)


def test_configure_fails_with_out_of_memory_when_a_chip_plan_does_not_fit() -> None:
    pkg = package("combined")
    plan0 = sum(r.size for r in pkg.regions_on(0))
    with open_mock(chip_dram_bytes=64 * MIB + plan0 - 1) as rt:
        with pytest.raises(OutOfMemory, match="chip 0") as exc:
            rt.configure(rt.create_calbin(pkg))
        assert exc.value.status == RuntimeStatus.OUT_OF_MEMORY
        assert rt.current_calbin is None
    with open_mock(chip_dram_bytes=64 * MIB + plan0 + 1024 * MIB) as rt:
        rt.configure(rt.create_calbin(pkg))


def test_ping_and_pong_run_two_deep_auto_runs_alone() -> None:
    pkg = package("single")
    with open_mock(timing=FIXED) as rt:
        rt.configure(rt.create_calbin(pkg))
        for engines, overlapping in (
            ((Engine.PING, Engine.PONG), True),
            ((Engine.AUTO, Engine.PING), False),
            ((Engine.PING, Engine.PING), False),
        ):
            jobs = [prefill_job(rt, pkg, "model-a", engine=e)[0] for e in engines]
            results = [rt.wait(j, 10) for j in jobs]
            a, b = sorted(_span(r) for r in results)
            assert (b[0] < a[1]) is overlapping, (engines, results)
            assert {e.engine for e in rt.trace() if e.job in {j.id for j in jobs}} == set(engines)


def _span(result: JobResult) -> tuple[int, int]:
    """A finished job's (start_ns, end_ns)."""
    assert result.start_ns is not None and result.end_ns is not None, result
    return result.start_ns, result.end_ns


def _used_bytes(rt: MockRuntime) -> list[int]:
    """Every chip's DRAM in use (the mock always knows it)."""
    used = [m.used_bytes for m in rt.memory_usage()]
    assert None not in used, used
    return [u for u in used if u is not None]


def _mchip_combined() -> Package:
    """The combined package with model-a made an MCHIP model over both chips (chip 1 shared with model-b)."""
    pkg = package("combined")
    a = pkg.model("model-a")
    graphs = tuple(
        dataclasses.replace(
            g,
            chip_mode=ChipMode.MCHIP,
            target_chips=(0, 1),
            sections=tuple(dataclasses.replace(s, chip_mask=3) for s in g.sections),
        )
        for g in a.graphs
    )
    a2 = dataclasses.replace(a, chip_mode=ChipMode.MCHIP, target_chips=(0, 1), graphs=graphs)
    return dataclasses.replace(pkg, models=(a2, pkg.model("model-b")))


def _holds_acquired(rt: MockRuntime, job: Job) -> bool:
    """The mock's own view: every secondary chip of an MCHIP job is held for it (no public API shows this)."""
    return all(h.acquired.is_set() for h in rt._jobs[job.id].holds)


def _primary_picked_up(rt: MockRuntime, job: Job) -> bool:
    """The job's primary chip has taken it off its queue (it now waits there for its other chips)."""
    return all(_item is not rt._jobs[job.id] for _item in rt._chips[job.chips[0]].queue)


def test_an_mchip_job_holds_all_its_chips() -> None:
    pkg = _mchip_combined()
    with open_mock(timing=FIXED) as rt:
        rt.configure(rt.create_calbin(pkg))
        job_a = prefill_job(rt, pkg, "model-a")[0]
        job_b = prefill_job(rt, pkg, "model-b")[0]
        assert job_a.chips == (0, 1)
        ra, rb = rt.wait(job_a, 10), rt.wait(job_b, 10)
        assert _span(rb)[0] >= _span(ra)[1]  # model-b waited for chip 1
        assert sorted(e.chip for e in rt.trace() if e.job == job_a.id) == [0, 1]
        counters = rt.counters()
        assert (counters[0].finished, counters[1].finished) == (1, 2)


def test_chip_reset_aborts_an_mchip_job_waiting_for_its_second_chip() -> None:
    pkg = _mchip_combined()
    with open_mock(timing=FIXED) as rt:
        rt.configure(rt.create_calbin(pkg))
        rt.arm_fault(FaultRule(kind=FaultKind.WAIT_TIMEOUT, at=(1,), graph="model_b_prefill"))
        hung = prefill_job(rt, pkg, "model-b")[0]
        job_a = prefill_job(rt, pkg, "model-a")[0]
        wait_until(lambda: rt.query(hung).state is JobState.RUNNING, what="the hung job to occupy chip 1")
        wait_until(lambda: _primary_picked_up(rt, job_a), what="chip 0 to pick up the MCHIP job")
        assert rt.query(job_a).state is JobState.QUEUED  # chip 0 is free, chip 1 hangs
        rt.reset("chip", chip=1)
        for job in (hung, job_a):
            assert rt.query(job).state is JobState.ABORTED
        assert rt.counters()[0].pending == 0 and rt.counters()[1].pending == 0


def test_chip_reset_aborts_an_mchip_job_holding_it_while_its_primary_queues() -> None:
    """model-a1 spans chips 0+1: it holds idle chip 1 while queued on chip 0 behind a hung model-a0 job."""
    pkg = package("replica")
    a1 = pkg.model("model-a1")
    graphs = tuple(
        dataclasses.replace(
            g,
            chip_mode=ChipMode.MCHIP,
            target_chips=(0, 1),
            sections=tuple(dataclasses.replace(s, chip_mask=3) for s in g.sections),
        )
        for g in a1.graphs
    )
    pkg = dataclasses.replace(
        pkg, models=(pkg.model("model-a0"), dataclasses.replace(a1, target_chips=(0, 1), graphs=graphs))
    )
    with open_mock(timing=FIXED) as rt:
        rt.configure(rt.create_calbin(pkg))
        rt.arm_fault(FaultRule(kind=FaultKind.WAIT_TIMEOUT, at=(1,), graph="model_a0_prefill"))
        hung = prefill_job(rt, pkg, "model-a0")[0]
        mchip = prefill_job(rt, pkg, "model-a1")[0]
        wait_until(lambda: rt.query(hung).state is JobState.RUNNING, what="the hung job to occupy chip 0")
        wait_until(lambda: _holds_acquired(rt, mchip), what="the MCHIP job to hold idle chip 1")
        assert rt.query(mchip).state is JobState.QUEUED
        rt.reset("chip", chip=1)  # must not wait for chip 0's hang
        assert rt.query(mchip).state is JobState.ABORTED and not rt.query(hung).state.terminal
        rt.reset("chip", chip=0)
        assert rt.query(hung).state is JobState.ABORTED
        assert rt.wait(prefill_job(rt, pkg, "model-a1")[0], 10).ok


def test_board_scope_fault_halts_both_chips_and_refuses_a_chip_reset() -> None:
    pkg = package("combined")
    plan = FaultPlan(
        rules=(FaultRule(kind=FaultKind.CCU_EXCEPTION, at=(1,), model="model-a", reset_scope=ResetScope.BOARD),)
    )
    with open_mock(fault_plan=plan) as rt:
        baseline = rt.memory_usage()
        rt.configure(rt.create_calbin(pkg))
        job = prefill_job(rt, pkg, "model-a")[0]
        with pytest.raises(RuntimeLayerError) as exc:
            rt.wait(job, 10)
        assert exc.value.status == RuntimeStatus.CCU_EXCEPTION
        assert {h.health for h in rt.health()} == {Health.FAULTED}
        assert "board reset" in (rt.health()[1].detail or "")
        with pytest.raises(DeviceLost):
            prefill_job(rt, pkg, "model-b")
        for chip in (0, 1):
            with pytest.raises(DeviceLost, match="chip reset cannot recover"):
                rt.reset("chip", chip=chip)
        rt.reset("board")
        assert {h.health for h in rt.health()} == {Health.OK}
        assert rt.current_calbin is None and rt.memory_usage() == baseline
        [fault] = rt.injected_faults()
        assert (fault.kind, fault.job, fault.reset_scope) == (FaultKind.CCU_EXCEPTION, job.id, ResetScope.BOARD)


def test_a_reset_failure_fault_fails_the_reset_and_resets_nothing(tmp_path: Path) -> None:
    """docs/runtime.md §4 ``reset_failure`` (issue 29 item 3): the chosen resets raise DeviceLost and leave the
    board as it was (the chip still faulted, the job not aborted); the next reset works; the log names it."""
    pkg = package("combined")
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "schema: calctl-fault-plan/v1\nfaults:\n"
        "  - {kind: ccu_exception, job: 1, model: model-a}\n"
        "  - {kind: reset_failure, reset: [1, 2], chip: 0}\n"
    )
    with open_mock(fault_plan=plan) as rt:
        rt.configure(rt.create_calbin(pkg))
        with pytest.raises(CcuException):
            rt.wait(prefill_job(rt, pkg, "model-a")[0], 10)
        rt.reset("chip", chip=1)  # chip 1 only: the rule filters chip 0, so this reset is no event of it
        for scope, chip in (("chip", 0), ("board", None)):
            with pytest.raises(DeviceLost, match=r"reset failed.*injected reset_failure"):
                rt.reset(scope, chip)
            assert rt.health()[0].health is Health.FAULTED and rt.current_calbin is not None
        rt.reset("board")  # the third reset touching chip 0: not in the rule's ordinals
        assert {h.health for h in rt.health()} == {Health.OK} and rt.current_calbin is None
        kinds = [(f.kind, f.ordinal, f.chips) for f in rt.injected_faults()]
    assert kinds[1:] == [(FaultKind.RESET_FAILURE, 1, (0,)), (FaultKind.RESET_FAILURE, 2, (0, 1))], kinds


def test_a_board_granting_only_board_resets_refuses_chip_resets() -> None:
    with open_mock(reset_scopes=(ResetScope.BOARD,)) as rt:
        with pytest.raises(NotSupported) as exc:
            rt.reset("chip", chip=0)
        assert exc.value.status == RuntimeStatus.NOT_SUPPORTED
        rt.reset("board")
        with pytest.raises(InvalidArgument):
            rt.reset("cluster")


def test_memory_returns_to_baseline_unless_the_leak_fault_fires() -> None:
    pkg = package("combined")
    plan_a = sum(r.size for r in pkg.memory_plan if r.owner == "model-a")
    plan = FaultPlan(
        rules=(
            FaultRule(kind=FaultKind.MEMORY_LEAK, at=(3,), model="model-a"),
            FaultRule(kind=FaultKind.MEMORY_LEAK, at=(4,), model="model-b", leak_bytes=4096),
        )
    )
    with open_mock(fault_plan=plan) as rt:
        baseline = _used_bytes(rt)
        calbin = rt.create_calbin(pkg)
        for _ in range(2):  # load/unload cycles with traffic: back to baseline every time (001 §13.3)
            rt.configure(calbin)
            rt.wait(prefill_job(rt, pkg, "model-a")[0], 10)
            rt.reset_configuration()
            assert _used_bytes(rt) == baseline
        rt.configure(calbin)
        rt.reset_configuration()  # 3rd unload of model-a leaks its whole plan on chip 0
        assert _used_bytes(rt) == [baseline[0] + plan_a, baseline[1]]
        rt.configure(calbin)
        rt.reset_configuration()  # 4th unload of model-b leaks 4096 bytes on chip 1
        assert _used_bytes(rt) == [baseline[0] + plan_a, baseline[1] + 4096]
        assert [(f.kind, f.model, f.ordinal) for f in rt.injected_faults()] == [
            (FaultKind.MEMORY_LEAK, "model-a", 3),
            (FaultKind.MEMORY_LEAK, "model-b", 4),
        ]
        rt.reset("board")  # a device re-init reclaims leaks too
        assert _used_bytes(rt) == baseline


def test_leaks_accumulate_until_configure_runs_out_of_memory() -> None:
    pkg = package("single")
    plan0 = sum(r.size for r in pkg.regions_on(0))
    rule = FaultRule(kind=FaultKind.MEMORY_LEAK, probability=1.0)
    with open_mock(chip_dram_bytes=64 * MIB + 2 * plan0 + MIB, fault_plan=FaultPlan(rules=(rule,))) as rt:
        calbin = rt.create_calbin(pkg)
        rt.configure(calbin)
        rt.reset_configuration()
        rt.configure(calbin)
        rt.reset_configuration()
        with pytest.raises(OutOfMemory, match="leaked"):
            rt.configure(calbin)


def test_corrupted_output_breaks_golden_logits() -> None:
    pkg = package("single")
    golden = np.load(pkg.root / pkg.model("model-a").golden.prefill_logits.file)
    tol = pkg.model("model-a").golden.tolerance
    with open_mock() as rt:
        rt.configure(rt.create_calbin(pkg))
        job, _, _, clean = prefill_job(rt, pkg, "model-a")
        rt.wait(job, 10)
        assert np.allclose(clean.read("logits"), golden, rtol=tol.rtol, atol=tol.atol)
        rt.arm_fault(FaultRule(kind=FaultKind.CORRUPT_OUTPUT, at=(1,)))
        job, _, _, bad = prefill_job(rt, pkg, "model-a")
        assert rt.wait(job, 10).ok  # the device says success: only golden checks catch it
        assert not np.allclose(bad.read("logits"), golden, rtol=tol.rtol, atol=tol.atol)


def test_kv_corruption_shows_in_the_next_decode_step() -> None:
    pkg = package("single")
    m = pkg.model("model-a")
    tol = m.golden.tolerance

    def first_decode(rt: MockRuntime) -> tuple[np.ndarray, np.ndarray]:
        job, seq, _, prefill_out = prefill_job(rt, pkg, "model-a")
        rt.wait(job, 10)
        rt.kv.commit(seq)
        prefill_logits = prefill_out.read("logits")
        with rt.job_buffers(m.decode.name) as (inputs, outputs):
            write_decode(inputs, int(np.argmax(prefill_logits[0])), rt.kv.append(seq, 1))
            rt.wait(rt.submit(m.decode.name, inputs, outputs, kv=[seq]), 10)
            return prefill_logits, outputs.read("logits")

    with open_mock() as rt:
        rt.configure(rt.create_calbin(pkg))
        clean_prefill, clean_decode = first_decode(rt)
        rt.arm_fault(FaultRule(kind=FaultKind.KV_CORRUPTION, at=(1,), graph=m.prefill.name))
        bad_prefill, bad_decode = first_decode(rt)
    assert np.array_equal(clean_prefill, bad_prefill)  # the corrupting job's own output is fine
    assert not np.allclose(clean_decode, bad_decode, rtol=tol.rtol, atol=tol.atol)


def test_the_mock_refuses_what_it_cannot_execute() -> None:
    pkg = package("single")
    other = dataclasses.replace(
        pkg,
        models=(
            dataclasses.replace(
                pkg.model("model-a"),
                architecture=dataclasses.replace(pkg.model("model-a").architecture, family="qwen3-moe"),
            ),
        ),
    )
    with open_mock() as rt, pytest.raises(InvalidCalbin, match="qwen3-moe"):
        rt.create_calbin(other)


def test_mock_options_are_checked() -> None:
    with pytest.raises(ConfigError):
        open_runtime("mock", chips=0)
    with pytest.raises(ConfigError, match="unexpected keyword"):
        open_runtime("mock", colour="blue")
    with open_mock(chips=4, calcores_per_chip=2) as rt:  # nothing leaked by the refusals above
        assert rt.topology().chips == 4


def _two_prefilled(rt: MockRuntime, pkg: Package) -> tuple[list[KvSeqId], list[int]]:
    """Two committed prefills of model-a (its golden prompt and that prompt's first 10 tokens): their sequences and
    greedy next tokens."""
    seqs, tokens = [], []
    for prompt in (golden_prompt(pkg, "model-a"), golden_prompt(pkg, "model-a")[:10].copy()):
        job, seq, _, out = prefill_job(rt, pkg, "model-a", prompt)
        rt.wait(job, 10)
        rt.kv.commit(seq)
        seqs.append(seq)
        tokens.append(int(np.argmax(out.read("logits")[0])))
    return seqs, tokens


def test_decode_batch_lanes_and_inactive_lane_policy() -> None:
    """A B4 decode: active lanes must match their sequences; an inactive lane writes no KV and returns zeros."""
    pkg = package("single")
    pkg4, dec = b4_package(pkg)
    with open_mock() as rt:
        rt.configure(rt.create_calbin(pkg4))
        seqs, tokens = _two_prefilled(rt, pkg4)
        with rt.job_buffers(dec.name, batch=4) as (inputs, outputs):
            positions = [rt.kv.append(s, 1) for s in seqs]
            inputs.write("tokens", np.array([[tokens[0]], [0], [tokens[1]], [0]], np.int32))
            inputs.write("positions", np.array([positions[0], 0, positions[1], 0], np.int32))
            inputs.write("lane_valid", np.array([1, 0, 1, 0], np.uint8))
            with pytest.raises(InvalidArgument, match="inactive"):
                rt.submit(dec.name, inputs, outputs, kv=[seqs[0], seqs[1], None, None])
            rt.wait(rt.submit(dec.name, inputs, outputs, kv=[seqs[0], None, seqs[1], None]), 10)
            logits = outputs.read("logits")
        assert np.abs(logits[[1, 3]]).max() == 0 and np.abs(logits[0]).max() > 0 and np.abs(logits[2]).max() > 0
        # Lane 0 equals the same step run alone at B1.
        for s in seqs:
            rt.kv.commit(s)
        rt.kv.remove_tokens_at_end(seqs[0], 1)
        with rt.job_buffers(dec.name) as (inputs, outputs):
            write_decode(inputs, tokens[0], rt.kv.append(seqs[0], 1))
            inputs.write("lane_valid", np.array([1], np.uint8))
            rt.wait(rt.submit(dec.name, inputs, outputs, kv=[seqs[0]]), 10)
            assert np.allclose(outputs.read("logits")[0], logits[0], rtol=1e-5, atol=1e-5)


def test_leading_lanes_compute_into_the_output_and_every_other_row_is_zeroed() -> None:
    """Lanes 0..n-1 active (the usual batch): the logits are computed straight into the output buffer. What the
    buffer held before (a caller that did not clear it) is overwritten: the inactive lanes read zero, the active
    ones what a B1 step of the same lane gives."""
    pkg4, dec = b4_package(package("single"))
    vocab = pkg4.model("model-a").architecture.vocab_size
    with open_mock() as rt:
        rt.configure(rt.create_calbin(pkg4))
        seqs, tokens = _two_prefilled(rt, pkg4)
        with rt.job_buffers(dec.name, batch=4) as (inputs, outputs):
            positions = [rt.kv.append(s, 1) for s in seqs]
            inputs.write("tokens", np.array([[tokens[0]], [tokens[1]], [0], [0]], np.int32))
            inputs.write("positions", np.array([positions[0], positions[1], 0, 0], np.int32))
            inputs.write("lane_valid", np.array([1, 1, 0, 0], np.uint8))
            outputs.write("logits", np.full((4, vocab), 7.0, np.float32))  # stale rows a job must not leave
            rt.wait(rt.submit(dec.name, inputs, outputs, kv=[seqs[0], seqs[1], None, None]), 10)
            batched = outputs.read("logits")
        assert np.abs(batched[2:]).max() == 0
        for s in seqs:
            rt.kv.commit(s)
        for lane, s in enumerate(seqs):
            rt.kv.remove_tokens_at_end(s, 1)
            with rt.job_buffers(dec.name) as (inputs, outputs):
                write_decode(inputs, tokens[lane], rt.kv.append(s, 1))
                inputs.write("lane_valid", np.array([1], np.uint8))
                rt.wait(rt.submit(dec.name, inputs, outputs, kv=[s]), 10)
                np.testing.assert_allclose(outputs.read("logits")[0], batched[lane], rtol=1e-5, atol=1e-5)


def test_a_finished_job_keeps_no_kv_cache_buffers_or_weights() -> None:
    """Issue 32: the board kept each finished job's record, KV cache included, for its last 65,536 jobs."""
    import gc
    import weakref

    pkg = package("single")
    with open_mock() as rt:
        rt.configure(rt.create_calbin(pkg))
        caches, buffers, jobs = [], [], []
        for _ in range(12):
            job, seq, inputs, outputs = prefill_job(rt, pkg, "model-a")
            assert rt.wait(job, 10).ok
            rt.kv.commit(seq)
            caches.append(weakref.ref(rt.kv._seqs[seq].cache))
            rt.kv.free(seq)
            for buf in (inputs, outputs):
                buffers.append(weakref.ref(buf))
                rt.release_buffer(buf)
            jobs.append(job)
            del job, inputs, outputs, buf
        gc.collect()
        assert [c for c in caches if c() is not None] == []  # the freed sequences' K/V are gone
        assert [b for b in buffers if b() is not None] == []  # and the released buffers
        assert rt._jobs == {}  # nothing in flight is kept
        # A finished job is still known to wait/query (its result, not its record).
        assert all(rt.query(j).state is JobState.SUCCEEDED for j in jobs)
        assert rt.wait(jobs[0], 0).ok
        assert {e.job for e in rt.trace()} >= {j.id for j in jobs}


def test_a_buffer_reads_and_clears_the_first_lanes_rows_of_its_per_lane_tensors() -> None:
    """``read(lanes=n)`` copies the first n rows of a tensor whose manifest shape starts with B, and ``clear(lanes=n)``
    zeroes those rows and every other tensor whole: the engine's view of a job with n active lanes."""
    pkg4, dec = b4_package(package("single"))
    vocab = pkg4.model("model-a").architecture.vocab_size
    with open_mock() as rt:
        rt.configure(rt.create_calbin(pkg4))
        inputs, outputs = rt.alloc_inputs(dec.name, 4), rt.alloc_outputs(dec.name, 4)
        full = np.arange(4 * vocab, dtype=np.float32).reshape(4, vocab)
        outputs.write("logits", full)
        assert np.array_equal(outputs.read("logits", lanes=2), full[:2])
        assert outputs.read("logits", lanes=0).shape == (0, vocab)
        outputs.clear(lanes=3)
        assert np.abs(outputs.read("logits")[:3]).max() == 0 and np.array_equal(outputs.read("logits")[3], full[3])
        inputs.write("tokens", np.full((4, 1), 9, np.int32))
        inputs.write("lane_valid", np.ones(4, np.uint8))
        inputs.clear(lanes=1)
        assert inputs.read("tokens").ravel().tolist() == [0, 9, 9, 9]
        assert inputs.read("lane_valid").tolist() == [0, 1, 1, 1]
        for bad in (-1, 5, True, 2.0, "2"):
            with pytest.raises(InvalidArgument, match=r"lanes asked for, the batch has 4"):
                outputs.read("logits", lanes=bad)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgument, match=r"lanes asked for, the batch has 4"):
                outputs.clear(lanes=bad)  # type: ignore[arg-type]
        assert np.array_equal(outputs.read("logits")[3], full[3])  # a refused clear zeroed nothing
