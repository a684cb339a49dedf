"""calctl's own refusals, on every backend: what calctl refuses before a runtime is asked.

The conformance checks ``buffer_ownership`` and ``configuration`` judge what the shim answers (straight
into the C ABI, past calctl's bookkeeping); calctl's own bookkeeping of buffers and of the current calbin is
tested here instead, on the mock, the bookkeeping stub and the reference board.
"""

from __future__ import annotations

import numpy as np
import pytest

from calctl.package.model import Package
from calctl.runtime import Runtime
from calctl.runtime.buffers import BufferState
from calctl.runtime.conformance import golden_prompt, prefill_job
from calctl.runtime.errors import BufferInUse, InvalidArgument, JobAborted, NotConfigured


def _hang_next_job(rt: Runtime) -> None:
    arm = getattr(rt, "arm_test_fault", None)
    if arm is not None:
        arm("hang")
        return
    from calctl.runtime.mock import FaultKind, FaultRule, MockRuntime

    assert isinstance(rt, MockRuntime), rt
    rt.arm_fault(FaultRule(kind=FaultKind.WAIT_TIMEOUT, at=(1,)))


def test_calctl_refuses_a_shared_foreign_misshaped_or_released_buffer(configured: Runtime, combined: Package) -> None:
    rt = configured
    pa, pb = combined.model("model-a").prefill.name, combined.model("model-b").prefill.name
    inputs, outputs = rt.alloc_inputs(pa), rt.alloc_outputs(pa)
    with pytest.raises(InvalidArgument, match="two different buffers"):
        rt.submit(pa, inputs, inputs, kv=[None])
    with pytest.raises(InvalidArgument, match="is not a input buffer of graph"):
        rt.submit(pa, rt.alloc_inputs(pb), outputs, kv=[None])
    with pytest.raises(InvalidArgument):
        inputs.write("tokens", np.zeros((1, 3), np.int32))
    rt.release_buffer(outputs)
    assert outputs.state is BufferState.RELEASED
    with pytest.raises(InvalidArgument, match="does not belong to this device or was released"):
        rt.release_buffer(outputs)
    with rt.job_buffers(combined.model("model-a").decode.name) as (i2, o2):
        assert i2.state is BufferState.OWNED_BY_CALLER
    assert i2.state is BufferState.RELEASED and o2.state is BufferState.RELEASED


def test_calctl_keeps_a_job_in_flights_buffers_from_the_caller(configured: Runtime, combined: Package) -> None:
    rt = configured
    pa = combined.model("model-a").prefill.name
    _hang_next_job(rt)
    job, seq, ins, outs = prefill_job(rt, combined, "model-a")
    for buf in (ins, outs):
        assert buf.state is BufferState.IN_FLIGHT
        with pytest.raises(BufferInUse):
            rt.release_buffer(buf)
    with pytest.raises(BufferInUse):
        outs.read("logits")
    with pytest.raises(BufferInUse):
        rt.submit(pa, ins, rt.alloc_outputs(pa), kv=[seq])
    rt.reset("board")
    with pytest.raises(JobAborted):
        rt.wait(job, 10)
    assert ins.state is BufferState.OWNED_BY_CALLER


def test_calctl_tracks_the_current_calbin(rt: Runtime, combined: Package) -> None:
    name = combined.model("model-a").prefill.name
    with pytest.raises(NotConfigured):
        rt.alloc_inputs(name)
    first, second = rt.create_calbin(combined), rt.create_calbin(combined)
    rt.configure(first)
    assert rt.current_calbin is first
    rt.reset_configuration()
    assert rt.current_calbin is None
    with pytest.raises(NotConfigured):
        rt.alloc_inputs(name)
    rt.configure(second)
    assert rt.current_calbin is second
    inputs = rt.alloc_inputs(name)
    prompt = golden_prompt(combined, "model-a")
    assert inputs.layout.slot("tokens").shape[1] >= len(prompt)


def test_on_submit_hears_every_accepted_submit_and_no_refused_one(configured: Runtime, combined: Package) -> None:
    """``Runtime.on_submit``: the host's own count of what it handed the device (soak's "job counters close")."""
    rt = configured
    heard: list[tuple[int, tuple[int, ...]]] = []
    rt.on_submit(lambda job: heard.append((int(job.id), job.chips)))
    pa = combined.model("model-a").prefill.name
    inputs = rt.alloc_inputs(pa)
    with pytest.raises(InvalidArgument):
        rt.submit(pa, inputs, inputs, kv=[None])  # refused before the device: not heard
    assert heard == []
    job, seq, _ins, _outs = prefill_job(rt, combined, "model-a")
    assert heard == [(int(job.id), job.chips)] and job.chips
    rt.wait(job, 30)
    rt.kv.free(seq)
