"""000 §16 batch metrics from the device executor: compiled batch, active lanes and lane waste of a decode job.

A real B4 decode on the mock board (the single sample's decode graph with a B4 profile and a lane mask, as in
the mock board's own batch test), driven through :class:`DeviceExecutor` with two active lanes."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from calctl.runtime import open_runtime
from calctl.serving.config import DowngradePolicy, ExecutorMode
from calctl.serving.core.decode import BatchProfile, DecodeBatch, InactiveLaneContract
from calctl.serving.core.ids import JobId, LaneId, ModelGenerationId, RequestId
from calctl.serving.core.prefill import WorkKind
from calctl.serving.core.scheduler import DecodeJob, JobStatus, PrefillJob
from calctl.serving.engine.device import DeviceExecutor, Inflight
from calctl.serving.engine.metrics import EngineMetrics
from calctl.serving.engine.monitor import ExecutorMonitor
from tests.unit.runtime.runtime_helpers import b4_package, golden_prompt, package

G = ModelGenerationId(1)


def test_a_b4_decode_with_two_lanes_reports_fill_and_waste() -> None:
    pkg = package("single")
    pkg4, dec = b4_package(pkg)
    m4 = pkg4.model("model-a")
    metrics = EngineMetrics()
    with open_runtime("mock") as rt:
        rt.configure(rt.create_calbin(pkg4))
        ex = DeviceExecutor(
            "model-a",
            m4,
            metrics,
            ExecutorMonitor(DowngradePolicy(), ExecutorMode.SYNC, chip_exclusive=True),
            post=lambda _msg: None,
            job_timeout_s=10.0,
            poll_s=0.01,
            fixed_engine=False,
        )
        ex.rt = rt
        prompt = tuple(int(t) for t in golden_prompt(pkg, "model-a"))
        for i in range(2):
            job = PrefillJob(
                JobId(i + 1), G, m4.prefill.name, RequestId(f"r{i}"), LaneId(i), len(prompt), WorkKind.PREFILL_SHORT
            )
            inf = ex.launch(job, prompt, pingpong=False)
            assert isinstance(inf, Inflight) and ex.wait_inline(inf, 10.0)
            fin = ex.finish(inf)
            assert fin is not None and fin.outcome.status is JobStatus.OK
        profile = BatchProfile(dec.name, 4, 4096, InactiveLaneContract("lane_valid"))
        batch = DecodeBatch.build(
            JobId(3), G, profile, [RequestId("r0"), RequestId("r1")], [LaneId(0), LaneId(1)], [5, 6], [len(prompt)] * 2
        )
        inf = ex.launch(DecodeJob(JobId(3), G, batch), None, pingpong=False)
        assert isinstance(inf, Inflight) and ex.wait_inline(inf, 10.0)
        assert ex.finish(inf) is not None
        ex.bookkeeping()  # the metering the core runs once a step's jobs are submitted
    fam = {
        s.name: s.value
        for f in text_string_to_metric_families(metrics.text().decode())
        for s in f.samples
        if s.labels.get("model") == "model-a"
    }
    assert fam["calctl_decode_compiled_batch"] == 4.0
    assert fam["calctl_decode_active_lanes"] == 2.0
    assert fam["calctl_decode_lane_waste_total"] == 2.0
