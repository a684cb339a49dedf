"""One conformance suite, run on every backend: the mock board and the CalRT C-ABI stub (SPEC §5).

Whatever a runner or the serving engine relies on is asserted here, identically
for both: lifecycle, one device per process, one current calbin, exact graph
names, submit/wait, typed errors with the runtime's status code, timeout
semantics, busy, buffer ownership and release, KV bookkeeping, resets.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from calctl.errors import DeviceError, ExitCode
from calctl.package.model import Package
from calctl.runtime import KvManager, Runtime
from calctl.runtime.buffers import BufferState
from calctl.runtime.errors import (
    AlreadyConfigured,
    BufferInUse,
    CcuException,
    DeviceBusy,
    DeviceInUse,
    DeviceLost,
    InvalidArgument,
    JobAborted,
    NotConfigured,
    RuntimeStatus,
    Timeout,
    UnknownDmaState,
)
from calctl.runtime.types import Engine, GenerationId, Health, JobState, KvLength
from tests.unit.runtime.runtime_helpers import Backend, golden_prompt, package, prefill_job, write_decode, write_prefill


def test_backend_implements_the_protocols(rt: Runtime) -> None:
    assert isinstance(rt, Runtime) and isinstance(rt.kv, KvManager)
    assert rt.kind.value in ("mock", "calrt")


def test_lifecycle_and_memory_back_to_baseline(rt: Runtime, combined: Package) -> None:
    topo = rt.topology()
    assert (topo.chips, topo.calcores_per_chip) == (2, 2)
    assert rt.versions().runtime.startswith("0.7.6")
    baseline = rt.memory_usage()
    assert all(m.used_bytes is not None and m.used_bytes > 0 for m in baseline)
    assert rt.current_calbin is None
    with rt.create_calbin(combined) as calbin:
        assert set(calbin.graph_names) == {"model_a_prefill", "model_a_decode", "model_b_prefill", "model_b_decode"}
        assert calbin.chips_of("model_a_decode") == (0,) and calbin.chips_of("model_b_prefill") == (1,)
        rt.configure(calbin)
        assert rt.current_calbin is calbin
        loaded = rt.memory_usage()
        for chip, (before, after) in enumerate(zip(baseline, loaded, strict=True)):
            assert after.used_bytes - before.used_bytes == sum(r.size for r in combined.regions_on(chip))
        rt.reset_configuration()
    assert rt.current_calbin is None
    assert rt.memory_usage() == baseline


def test_one_physical_device_per_process(backend: Backend) -> None:
    with backend.open():
        with pytest.raises(DeviceInUse) as exc:
            backend.open()
        assert exc.value.status == RuntimeStatus.DEVICE_IN_USE
    with backend.open():  # released on close: opening again works
        pass


def test_device_released_when_the_block_raises(backend: Backend) -> None:
    with pytest.raises(RuntimeError, match="boom"), backend.open() as rt:
        rt.configure(rt.create_calbin(package("combined")))
        raise RuntimeError("boom")
    with backend.open() as rt:
        assert rt.current_calbin is None


def test_configure_twice_is_already_configured(rt: Runtime, combined: Package) -> None:
    first, second = rt.create_calbin(combined), rt.create_calbin(combined)
    rt.configure(first)
    for calbin in (first, second):
        with pytest.raises(AlreadyConfigured) as exc:
            rt.configure(calbin)
        assert exc.value.status == RuntimeStatus.ALREADY_CONFIGURED == 3
        assert isinstance(exc.value, DeviceError) and exc.value.exit_code == ExitCode.DEVICE
    rt.reset_configuration()
    rt.configure(second)
    assert rt.current_calbin is second


def test_not_configured(rt: Runtime) -> None:
    with pytest.raises(NotConfigured):
        rt.alloc_inputs("model_a_prefill")
    with pytest.raises(NotConfigured):
        rt.reset_configuration()
    with pytest.raises(NotConfigured):
        rt.kv.allocate("model-a")


def test_submit_and_wait_chip_comes_from_the_graph(configured: Runtime, combined: Package) -> None:
    rt = configured
    results = {}
    for alias in ("model-a", "model-b"):
        job, seq, _inputs, outputs = prefill_job(rt, combined, alias, generation=GenerationId(7))
        result = rt.wait(job, 10)
        assert result.ok and result.state is JobState.SUCCEEDED and result.status is RuntimeStatus.OK
        assert result.start_ns is not None and result.end_ns is not None and result.end_ns >= result.start_ns
        assert job.chips == combined.model(alias).target_chips and job.model == alias and job.generation == 7
        logits = outputs.read("logits")
        assert logits.shape == (1, combined.model(alias).architecture.vocab_size)
        assert np.isfinite(logits).all() and np.abs(logits).max() > 0
        assert rt.kv.commit(seq) == KvLength(
            committed=len(golden_prompt(combined, alias)), reserved=len(golden_prompt(combined, alias))
        )
        results[alias] = logits
    counters = {c.chip: c for c in rt.counters()}
    assert (counters[0].pending, counters[0].finished, counters[0].failed) == (0, 1, 0)
    assert (counters[1].pending, counters[1].finished, counters[1].failed) == (0, 1, 0)
    trace = rt.trace()
    assert sorted((e.chip, e.graph, e.generation, e.engine) for e in trace) == [
        (0, "model_a_prefill", 7, Engine.AUTO),
        (1, "model_b_prefill", 7, Engine.AUTO),
    ]


def test_outputs_are_a_deterministic_function_of_inputs(configured: Runtime, combined: Package) -> None:
    rt = configured
    prompt = golden_prompt(combined, "model-a")
    outs = []
    for p in (prompt, prompt, prompt[::-1].copy()):
        job, seq, _, outputs = prefill_job(rt, combined, "model-a", p)
        rt.wait(job, 10)
        outs.append(outputs.read("logits"))
        rt.kv.free(seq)
    assert np.array_equal(outs[0], outs[1])
    assert not np.allclose(outs[0], outs[2])


def test_graph_names_are_exact(configured: Runtime, combined: Package) -> None:
    rt = configured
    inputs, outputs = rt.alloc_inputs("model_a_prefill"), rt.alloc_outputs("model_a_prefill")
    for wrong in ("model_a", "MODEL_A_PREFILL", "model_a_prefil", "model-a"):
        with pytest.raises(InvalidArgument, match="exactly"):
            rt.submit(wrong, inputs, outputs, kv=[None])


def test_decode_follows_committed_kv_length(configured: Runtime, combined: Package) -> None:
    rt = configured
    job, seq, _, outputs = prefill_job(rt, combined, "model-a")
    rt.wait(job, 10)
    n = rt.kv.commit(seq).committed
    token = int(np.argmax(outputs.read("logits")[0]))
    with rt.job_buffers("model_a_decode") as (inputs, outs):
        assert rt.kv.append(seq, 1) == n
        write_decode(inputs, token, n + 1)  # wrong position: must be the committed length (000 §9.2)
        with pytest.raises(InvalidArgument):
            rt.submit("model_a_decode", inputs, outs, kv=[seq])
        write_decode(inputs, token, n)
        rt.wait(rt.submit("model_a_decode", inputs, outs, kv=[seq]), 10)
        assert rt.kv.commit(seq) == KvLength(n + 1, n + 1)
    assert rt.kv.remove_tokens_at_end(seq, 1) == KvLength(n, n)
    rt.kv.free(seq)
    with pytest.raises(InvalidArgument):
        rt.kv.length(seq)


def test_kv_capacity(configured: Runtime, combined: Package) -> None:
    rt = configured
    cap = combined.model("model-b").kv.max_sequences
    assert rt.kv.can_allocate("model-b", cap) and not rt.kv.can_allocate("model-b", cap + 1)
    seqs = [rt.kv.allocate("model-b") for _ in range(cap)]
    assert len(set(seqs)) == cap and not rt.kv.can_allocate("model-b", 1)
    assert rt.kv.can_allocate("model-a", 1)  # one namespace per model
    with pytest.raises(DeviceError):
        rt.kv.allocate("model-b")
    rt.kv.free(seqs[0])
    assert rt.kv.can_allocate("model-b", 1)
    with pytest.raises(InvalidArgument):
        rt.kv.allocate("model-c")


def test_timeout_leaves_the_job_in_flight_and_its_buffers_owned(
    backend: Backend, configured: Runtime, combined: Package
) -> None:
    rt = configured
    backend.arm(rt, "hang")
    job, seq, inputs, outputs = prefill_job(rt, combined, "model-a")
    with pytest.raises(Timeout) as exc:
        rt.wait(job, 0.2)
    assert exc.value.status == RuntimeStatus.TIMEOUT and exc.value.job == job.id
    assert not rt.query(job).state.terminal
    assert rt.wait_any([job], 0.05) == []
    # The job still owns its buffers and its KV sequence.
    for buf in (inputs, outputs):
        assert buf.state is BufferState.IN_FLIGHT
        with pytest.raises(BufferInUse):
            rt.release_buffer(buf)
    with pytest.raises(BufferInUse):
        outputs.read("logits")
    with pytest.raises(BufferInUse):
        rt.submit("model_a_prefill", inputs, rt.alloc_outputs("model_a_prefill"), kv=[seq])
    with pytest.raises(DeviceBusy):
        rt.kv.commit(seq)
    with pytest.raises(DeviceBusy):
        rt.reset_configuration()  # never drop a calbin under a job in flight (000 §12)
    assert rt.counters()[0].pending == 1
    assert {h.chip: h.health for h in rt.health()}[0] is Health.HUNG
    # The other chip keeps working while chip 0 hangs.
    job_b, _, _, _ = prefill_job(rt, combined, "model-b")
    assert rt.wait(job_b, 10).ok

    rt.reset("chip", chip=0)
    with pytest.raises(JobAborted) as aborted:
        rt.wait(job, 5)
    assert aborted.value.status == RuntimeStatus.JOB_ABORTED
    assert rt.query(job).state is JobState.ABORTED
    assert {h.chip: h.health for h in rt.health()}[0] is Health.OK
    rt.release_buffer(inputs)
    rt.release_buffer(outputs)
    assert rt.kv.length(seq) == KvLength(0, 0)  # a chip reset empties that chip's sequences
    counters = rt.counters()[0]
    assert (counters.pending, counters.failed) == (0, 1)
    job2, _, _, _ = prefill_job(rt, combined, "model-a")
    assert rt.wait(job2, 10).ok


def test_busy_refuses_the_submit_and_a_retry_succeeds(backend: Backend, configured: Runtime, combined: Package) -> None:
    rt = configured
    backend.arm(rt, "busy")
    prompt = golden_prompt(combined, "model-a")
    seq = rt.kv.allocate("model-a")
    with rt.job_buffers("model_a_prefill") as (inputs, outputs):
        write_prefill(inputs, prompt)
        rt.kv.append(seq, len(prompt))
        with pytest.raises(DeviceBusy) as exc:
            rt.submit("model_a_prefill", inputs, outputs, kv=[seq])
        assert exc.value.status == RuntimeStatus.DEVICE_BUSY
        assert inputs.state is BufferState.OWNED_BY_CALLER and outputs.state is BufferState.OWNED_BY_CALLER
        assert rt.counters()[0].pending == 0
        assert rt.wait(rt.submit("model_a_prefill", inputs, outputs, kv=[seq]), 10).ok


def test_buffer_ownership_and_release(configured: Runtime, combined: Package) -> None:
    rt = configured
    inputs, outputs = rt.alloc_inputs("model_a_prefill"), rt.alloc_outputs("model_a_prefill")
    with pytest.raises(InvalidArgument):
        rt.submit("model_a_prefill", inputs, inputs, kv=[None])  # never shared, not even with itself
    with pytest.raises(InvalidArgument):
        rt.submit("model_a_prefill", rt.alloc_inputs("model_b_prefill"), outputs, kv=[None])  # another graph's buffer
    with pytest.raises(InvalidArgument):
        inputs.write("tokens", np.zeros((1, 3), np.int32))  # exact shape
    with pytest.raises(InvalidArgument):
        inputs.write("nope", np.zeros(1))
    rt.release_buffer(outputs)
    assert outputs.state is BufferState.RELEASED
    with pytest.raises(InvalidArgument):
        outputs.read("logits")
    with pytest.raises(InvalidArgument):
        rt.release_buffer(outputs)
    with pytest.raises(InvalidArgument):
        rt.submit("model_a_prefill", inputs, outputs, kv=[None])
    with rt.job_buffers("model_a_decode") as (i2, o2):
        assert (i2.state, o2.state) == (BufferState.OWNED_BY_CALLER,) * 2
        i2.write("positions", np.array([5], np.int32))
        i2.clear()
        assert i2.read("positions").tolist() == [0]
    assert (i2.state, o2.state) == (BufferState.RELEASED,) * 2


def test_job_buffers_released_when_a_hung_job_lets_go(backend: Backend, configured: Runtime, combined: Package) -> None:
    rt = configured
    backend.arm(rt, "hang")
    prompt = golden_prompt(combined, "model-a")
    seq = rt.kv.allocate("model-a")
    with rt.job_buffers("model_a_prefill") as (inputs, outputs):
        write_prefill(inputs, prompt)
        rt.kv.append(seq, len(prompt))
        job = rt.submit("model_a_prefill", inputs, outputs, kv=[seq])
    assert inputs.state is BufferState.IN_FLIGHT  # not freed under a job in flight
    rt.reset("chip", chip=0)
    with pytest.raises(JobAborted):
        rt.wait(job, 5)
    assert (inputs.state, outputs.state) == (BufferState.RELEASED,) * 2


def test_ccu_exception_halts_only_its_chip_until_reset(
    backend: Backend, configured: Runtime, combined: Package
) -> None:
    rt = configured
    backend.arm(rt, "ccu")
    job, seq, inputs, _outputs = prefill_job(rt, combined, "model-a")
    with pytest.raises(CcuException) as exc:
        rt.wait(job, 10)
    assert exc.value.status == RuntimeStatus.CCU_EXCEPTION and exc.value.job == job.id
    assert rt.query(job).state is JobState.FAILED
    assert {h.chip: h.health for h in rt.health()} == {0: Health.FAULTED, 1: Health.OK}
    with pytest.raises(InvalidArgument):
        rt.kv.commit(seq)  # the writing job failed: roll back, never commit (000 §9.2)
    rt.kv.rollback(seq)
    rt.release_buffer(inputs)  # a CCU failure returns the buffers
    with pytest.raises(DeviceLost):
        prefill_job(rt, combined, "model-a")
    job_b, _, _, _ = prefill_job(rt, combined, "model-b")
    assert rt.wait(job_b, 10).ok
    rt.reset("chip", chip=0)
    job2, _, _, _ = prefill_job(rt, combined, "model-a")
    assert rt.wait(job2, 10).ok


def test_unknown_dma_state_holds_buffers_until_reset(backend: Backend, configured: Runtime, combined: Package) -> None:
    rt = configured
    backend.arm(rt, "dma")
    job, _, inputs, outputs = prefill_job(rt, combined, "model-b")
    with pytest.raises(UnknownDmaState):
        rt.wait(job, 10)
    assert inputs.state is BufferState.QUARANTINED
    with pytest.raises(BufferInUse):
        rt.release_buffer(inputs)
    rt.reset("chip", chip=1)
    rt.release_buffer(inputs)
    rt.release_buffer(outputs)


def test_board_reset_drops_the_configuration(configured: Runtime, combined: Package) -> None:
    rt = configured
    job, _, _, _ = prefill_job(rt, combined, "model-a")
    rt.wait(job, 10)
    rt.reset("board")
    assert rt.current_calbin is None
    with pytest.raises(NotConfigured):
        rt.alloc_inputs("model_a_prefill")
    rt.configure(rt.create_calbin(combined))  # no AlreadyConfigured after a board reset


def test_wait_any_and_concurrent_waiters(configured: Runtime, combined: Package) -> None:
    rt = configured
    job_a, _, _, _ = prefill_job(rt, combined, "model-a", generation=GenerationId(1))
    job_b, _, _, _ = prefill_job(rt, combined, "model-b", generation=GenerationId(2))
    done: set[int] = set()
    while len(done) < 2:
        got = rt.wait_any([job_a, job_b], 10)
        assert got, "wait_any returned nothing within 10 s"
        done.update(j.id for j in got)
    assert done == {job_a.id, job_b.id}

    results: dict[str, object] = {}

    def worker(alias: str) -> None:
        job, _, _, _ = prefill_job(rt, combined, alias)
        results[alias] = rt.wait(job, 10)

    threads = [threading.Thread(target=worker, args=(a,)) for a in ("model-a", "model-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert {a: r.ok for a, r in results.items()} == {"model-a": True, "model-b": True}  # type: ignore[attr-defined]


def test_close_while_a_thread_waits_on_a_hung_job(backend: Backend, combined: Package) -> None:
    outcome: list[BaseException] = []
    with backend.open() as rt:
        rt.configure(rt.create_calbin(combined))
        backend.arm(rt, "hang")
        job, _, _, _ = prefill_job(rt, combined, "model-a")

        def waiter() -> None:
            try:
                rt.wait(job, 30)
            except DeviceError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.1)
    thread.join(10)  # close() aborted the job and let the waiter leave before freeing the device
    assert not thread.is_alive()
    assert [type(e) for e in outcome] == [JobAborted]
    with backend.open():
        pass
