"""Issue 10 acceptance: executor modes on the mock board (000 §14, §15, §19 M1/M2; 001 §9.3).

* the ``executor-modes`` bench measures sync, async(1) and ping/pong on one engine: ping/pong meets M2 where
  the mock's phases allow overlap, and the trace shows two jobs in flight, transfers hidden behind compute,
  and never two computes at once; async(1) is equivalent to sync (M1);
* a corrupted output or repeated DeviceBusy while in ping/pong downgrades the worker: the jobs in flight
  drain (none dropped, none delivered wrong) and the reason is in the metrics and the log;
* going back to ping/pong is an operator action over the admin API.

Timing checks use the bench's own confidence intervals, or generous bounds; device time dominates (mock time
scale 8 for the bench). M2 is judged on the device's clock, so it holds at any host load; where the scenario
found the host saturated, M1's host-clock checks are inconclusive and say so, and the test holds it to that; the
trace evidence (device clock) is checked always.
The M1 limits (3 % / 5 %) are tighter than a shared CI machine's noise can always
resolve, so the M1 test accepts an *inconclusive* interval but never a *not met* one, and checks the point
estimates against generous bounds; the measured intervals are in docs/executor.md.
"""

from __future__ import annotations

import json
import logging
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from calctl.runners.bench.executor_modes import (
    TRANSFER_HEAVY,
    ExecutorModesOptions,
    ExecutorModesResult,
    run_executor_modes,
)
from calctl.runners.device import DeviceSpec
from calctl.runtime.mock.faults import FaultKind, FaultRule
from calctl.runtime.types import Engine, JobId, JobState
from calctl.serving.config import ExecutorMode
from calctl.signing.policy import make_policy
from tests.conftest import TEST_PUB
from tests.integration.executor_harness import GOLDEN, SINGLE, executor_engine
from tests.integration.serve_harness import COMBINED, serving
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

DECODE = "model_a_decode"


def _host_saturated(report: ExecutorModesResult) -> bool:
    """The scenario's own reading of the host (its load samples over the CPU count), as its verdicts use it."""
    return any("host saturated" in c.detail for c in report.m1.checks)


def test_executor_modes_bench_m1_m2_and_the_overlap_in_the_trace(tmp_path: Path) -> None:
    trace = tmp_path / "pp.trace.json"
    report = run_executor_modes(
        ExecutorModesOptions(
            SINGLE,
            make_policy([TEST_PUB]),
            device=DeviceSpec(time_scale=8.0),
            profile=TRANSFER_HEAVY,
            rounds=6,
            warmup_rounds=1,
            concurrency=5,
            output_tokens=5,
            trace_path=trace,
        )
    )
    doc = json.loads(json.dumps(report.document()))
    assert doc["mock_result"] is True and any("MOCK RESULT" in n for n in doc["notes"])
    assert report.outputs_identical and report.automatic_downgrades == []
    assert all(m["errors"] == 0 for m in doc["modes"].values())

    # M2's throughput and latency are on the device's clock (the mock stamps every job): met at any host load,
    # never "inconclusive: host saturated" (#53 item 3). M1's regression is host time: on a saturated host it is
    # inconclusive and says why.
    gain = report.m2.checks[0]
    assert gain.name == "throughput_gain" and gain.estimate.ci_low is not None
    assert doc["workload"]["clock"] == {"M1": "host", "M2": "device"}
    assert report.m2.verdict == "met" and gain.estimate.ci_low >= 0.10, doc["M2"]
    assert "device clock" in gain.detail and "host saturated" not in gain.detail
    if _host_saturated(report):
        assert report.m1.verdict == "inconclusive" and "only the host's clock measures it" in report.m1.checks[0].detail

    assert report.m1.verdict != "not met", doc["M1"]
    p50, p99 = report.m1.checks[0].estimate.mean, report.m1.checks[1].estimate.mean
    # M1 bounds regression only (000 §19) and the verdict above already refuses "not met". These are sanity
    # bounds on the point estimates: a P99 over ~30 requests is one slow request, so it gets a wide one.
    assert p50 is not None and p99 is not None, doc["M1"]
    if not _host_saturated(report):
        assert -0.5 < p50 < 0.10 and -0.5 < p99 < 0.50, doc["M1"]

    ev = report.evidence
    assert ev.jobs > 0 and ev.two_in_flight_s > 0.3 * ev.busy_s  # two in flight most of the time ...
    assert ev.compute_overlap_s == 0.0  # ... never two computing ...
    assert (
        ev.transfer_compute_overlap_s is not None and ev.transfer_compute_overlap_s > 0.1 * ev.busy_s
    )  # ... transfers hidden

    chrome = json.loads(trace.read_text())
    tracks = {
        e["tid"]: e["args"]["name"] for e in chrome["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert "chip0 pong" in tracks.values()
    cats = {e["cat"] for e in chrome["traceEvents"] if e["ph"] == "X"}
    assert {"job", "job.h2d", "job.compute", "job.d2h"} <= cats
    assert chrome["otherData"]["mock_result"] is True


def test_corrupted_output_in_pingpong_downgrades_and_drains(caplog: pytest.LogCaptureFixture) -> None:
    """The scenario needs a job in flight beside the corrupted one. Whether the engine thread had submitted the
    next job by then is the host's doing (a starved thread leaves the chip one job deep), so a run where it had
    not is not evidence either way: a fresh engine tries again, up to three."""
    caplog.set_level(logging.INFO, logger="calctl.serve")
    for _ in range(3):
        caplog.clear()
        if _corrupt_one_job_in_pingpong(caplog):
            return
    pytest.fail("in 3 engines the corrupted job never had a job in flight beside it: the host starved the engine")


def _corrupt_one_job_in_pingpong(caplog: pytest.LogCaptureFixture) -> bool:
    """False when no job was in flight beside the corrupted one (nothing asserted then); else every check."""
    with executor_engine(time_scale=5.0) as h:
        assert all(o.ok and o.tokens == GOLDEN for o in h.run(4, tag="warm"))
        since = time.monotonic_ns()
        h.rt.arm_fault(FaultRule(FaultKind.CORRUPT_OUTPUT, at=(10,), graph=DECODE, magnitude=float("inf")))
        outs = h.run(4, tag="fault")
        _wait_ready(h)  # the recovery (a chip reset) is over: any job it aborted is in the trace now

        (fault,) = h.rt.injected_faults()
        jobs = {e.job: e for e in h.rt.trace(since_ns=since) if e.model == "model-a"}
        assert fault.job is not None, fault
        bad = jobs[JobId(fault.job)]
        assert bad.start_ns is not None and bad.end_ns is not None
        beside = [e for e in jobs.values() if e is not bad and e.start_ns and e.start_ns < bad.end_ns < (e.end_ns or 0)]
        if not beside:
            return False
        # None dropped: the reset that followed found nothing running; the job beside it completed.
        assert all(e.state is JobState.SUCCEEDED for e in beside)
        assert [e.job for e in jobs.values() if e.state is JobState.ABORTED] == []
        # None delivered wrong: every token any request received is the golden token at its position;
        # the corrupted job's request ended with an error instead of a token.
        assert all(o.delivered_right() for o in outs)
        assert any(o.error and "non-finite logits" in o.error for o in outs)

        (d,) = h.worker.downgrades()
        assert d.reason.value == "output_crosstalk" and d.draining_jobs >= 1 and d.to_mode is ExecutorMode.ASYNC
        assert h.metric("calctl_executor_downgrades_total", model="model-a", reason="output_crosstalk") == 1.0
        logged = [r.getMessage() for r in caplog.records if "executor downgrade" in r.getMessage()]
        assert len(logged) == 1 and "reason=output_crosstalk" in logged[0] and "from=pingpong to=async" in logged[0]

        assert h.worker.executor_mode is ExecutorMode.ASYNC  # never automatically back to ping/pong
        assert h.metric("calctl_executor_mode", model="model-a", mode="async") == 1.0
        assert h.metric("calctl_executor_mode", model="model-a", mode="pingpong") == 0.0
        assert all(o.ok and o.tokens == GOLDEN for o in h.run(4, tag="after"))
    return True


def test_repeated_device_busy_in_pingpong_downgrades_without_dropping(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="calctl.serve")
    with executor_engine(time_scale=8.0) as h:
        h.run(2, 4, tag="warm")
        since = time.monotonic_ns()
        h.rt.arm_fault(FaultRule(FaultKind.DEVICE_BUSY, at=(10, 11, 12), graph=DECODE))  # three refusals in a row
        outs = h.run(4, 12)
        assert all(o.ok and o.tokens == GOLDEN[:12] for o in outs)  # none dropped, none wrong

        (d,) = h.worker.downgrades()
        assert d.reason.value == "consecutive_busy" and d.draining_jobs >= 1
        assert h.metric("calctl_executor_downgrades_total", model="model-a", reason="consecutive_busy") == 1.0
        assert any("reason=consecutive_busy" in r.getMessage() for r in caplog.records)

        jobs = sorted((e for e in h.rt.trace(since_ns=since) if e.model == "model-a"), key=lambda e: e.submit_ns)
        assert all(e.state is JobState.SUCCEEDED for e in jobs)
        banked = [e for e in jobs if e.engine in (Engine.PING, Engine.PONG)]
        auto = [e for e in jobs if e.engine is Engine.AUTO]
        assert banked and auto
        # Only new jobs see the downgrade: the first one-in-flight job starts after every ping/pong job ended.
        assert min(e.start_ns or 0 for e in auto) >= max(e.end_ns or 0 for e in banked)


def test_operator_switches_the_executor_over_the_admin_api(tmp_path: Path) -> None:
    cfg = tmp_path / "dual.yaml"
    cfg.write_text(
        textwrap.dedent(f"""\
        schema: calculet-dual-model/v1
        device: {{type: pcie, expected_chips: 2, combined_calbin: {COMBINED}}}
        models:
          - alias: model-a
            chip_id: 0
            prefill_graph: model_a_prefill
            decode_graph: model_a_decode
            context_limit: 256
            max_inflight: 2
            max_waiting_requests: 64
            scheduler:
              admission: {{max_waiting_requests: 64, max_waiting_prompt_tokens: 262144, deadline_default_ms: 120000}}
              queues: {{decode_weight: 8, short_prefill_weight: 4, medium_prefill_weight: 2, long_prefill_weight: 1,
                        short_prefill_max_tokens: 512, medium_prefill_max_tokens: 4096}}
              batch: {{profiles: [1], batching_window_us: 0}}
              executor: {{max_inflight: 2, fixed_engine: false, mode: async, downgrade: {{consecutive_busy: 2}}}}
              recovery: {{max_resets_per_10min: 2, restart_on_unknown_dma: true}}
          - {{alias: model-b, chip_id: 1, prefill_graph: model_b_prefill, decode_graph: model_b_decode,
              context_limit: 256, max_inflight: 1, max_waiting_requests: 64}}
        recovery: {{allow_session_reset: false, restart_process_on_unknown_dma: true}}
        """)
    )
    with serving(config=cfg, time_scale=0.5) as s:
        url = f"{s.url}/internal/models"
        st = httpx.get(f"{url}/model-a/executor").json()
        assert (
            st["mode"] == "async"
            and st["configured_max_inflight"] == 2
            and st["monitor"]["thresholds"]["consecutive_busy"] == 2
        )
        assert httpx.get(f"{url}/model-b/executor").json()["mode"] == "sync"  # 000 §15 default for max_inflight 1

        r = httpx.post(f"{url}/model-a/executor", json={"mode": "pingpong"})
        assert r.status_code == 200 and r.json()["mode"] == "pingpong" and r.json()["previous_mode"] == "async"
        r = httpx.post(f"{url}/model-b/executor", json={"mode": "pingpong"})
        assert r.status_code == 409 and "max_inflight" in r.json()["detail"]
        assert httpx.post(f"{url}/model-a/executor", json={"mode": "turbo"}).status_code == 400
        assert httpx.post(f"{url}/model-x/executor", json={"mode": "sync"}).status_code == 404

        since = time.monotonic_ns()
        body = {"model": "model-a", "prompt": "The board has two chips", "max_tokens": 8, "temperature": 0}
        with httpx.Client(timeout=30) as c:
            results = [c.post(f"{s.v1}/completions", json=body) for _ in range(2)]
        assert all(r.status_code == 200 for r in results)
        assert {e.engine for e in s.rt.trace(since_ns=since) if e.model == "model-a"} <= {Engine.PING, Engine.PONG}
        metrics = httpx.get(f"{s.url}/metrics").text
        assert 'calctl_executor_mode{mode="pingpong",model="model-a"} 1.0' in metrics
        assert 'calctl_executor_mode{mode="async",model="model-a"} 0.0' in metrics


def _wait_ready(h, timeout_s: float = 10.0) -> None:
    wait_until(h.worker.is_ready, what="the worker to be ready", timeout=timeout_s, interval=0.02)
