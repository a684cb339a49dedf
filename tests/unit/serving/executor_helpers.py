"""A DeviceExecutor on a real (mock) runtime with a clock the test moves by hand, and prefill jobs for it."""

from __future__ import annotations

from calctl.package.model import Model
from calctl.runtime import Runtime
from calctl.serving.config import DowngradePolicy, ExecutorMode
from calctl.serving.core.ids import JobId, LaneId, ModelGenerationId, RequestId
from calctl.serving.core.prefill import WorkKind
from calctl.serving.core.scheduler import PrefillJob
from calctl.serving.engine.device import DeviceExecutor, Inflight
from calctl.serving.engine.metrics import EngineMetrics
from calctl.serving.engine.monitor import ExecutorMonitor
from tests.unit.serving.serving_helpers import FakeClock


def executor(
    rt: Runtime, model: Model, clock: FakeClock, *, mode: ExecutorMode = ExecutorMode.ASYNC, job_timeout_s: float = 30.0
) -> DeviceExecutor:
    ex = DeviceExecutor(
        "model-a",
        model,
        EngineMetrics(),
        ExecutorMonitor(DowngradePolicy(), mode, chip_exclusive=True),
        post=lambda _msg: None,
        job_timeout_s=job_timeout_s,
        poll_s=0.01,
        fixed_engine=False,
        clock=lambda: clock.now,
    )
    ex.rt = rt
    return ex


def launch_prefill(ex: DeviceExecutor, model: Model, prompt: tuple[int, ...], n: int) -> Inflight:
    job = PrefillJob(
        JobId(n), ModelGenerationId(1), model.prefill.name, RequestId(f"r{n}"), LaneId(n), len(prompt),
        WorkKind.PREFILL_SHORT,
    )  # fmt: skip
    inf = ex.launch(job, prompt, pingpong=False)
    assert isinstance(inf, Inflight)
    return inf


def finish(ex: DeviceExecutor, inf: Inflight, clock: FakeClock, host_s: float) -> None:
    """Wait for ``inf`` on the device, move the clock by ``host_s`` (the time the host saw it take), finish it."""
    while not ex.wait_inline(inf, 1.0):
        pass
    clock.advance(host_s)
    assert ex.finish(inf) is not None
