"""Job phases on the mock board (h2d, compute, d2h): what ping/pong can overlap is modelled, not assumed (000 §14).

Every job takes UNIT seconds; only the split changes. A job alone is 1 unit; ping and pong together take about
1.4 units with the 30/40/30 split (transfers hide behind the other's compute; one channel per direction) and 2
units when the job is all compute. Wall-time bounds are generous; the trace intervals carry the exact claims.
"""

from __future__ import annotations

import json
import time

import pytest

from calctl.errors import ConfigError
from calctl.package.model import GraphKind
from calctl.runners.trace import chrome_trace, trace_slices
from calctl.runtime import open_runtime
from calctl.runtime.mock import GraphTiming, TimingModel
from calctl.runtime.types import Engine, JobPhase, TraceEvent
from tests.unit.runtime.runtime_helpers import package, prefill_job

UNIT = 0.06


def fixed(h2d: float, d2h: float) -> TimingModel:
    return TimingModel(
        default=GraphTiming(
            prefill_base_s=UNIT,
            prefill_per_token_s=0.0,
            decode_base_s=UNIT,
            decode_per_kv_token_s=0.0,
            h2d_share=h2d,
            d2h_share=d2h,
        )
    )


def test_phases_split_the_same_total() -> None:
    t = TimingModel()
    for kind, kw in (
        (GraphKind.PREFILL, {"tokens": 22, "kv_tokens": 0}),
        (GraphKind.DECODE, {"tokens": 1, "kv_tokens": 40}),
    ):
        split = t.phases("g", kind, 0, **kw)
        assert split.total_s == pytest.approx(t.seconds("g", kind, 0, **kw))
        assert split.h2d_s == pytest.approx(0.3 * split.total_s) and split.compute_s == pytest.approx(
            0.4 * split.total_s
        )
    only = t.with_shares(0.0, 0.0).phases("g", GraphKind.DECODE, 0, tokens=1, kv_tokens=40)
    assert only.h2d_s == only.d2h_s == 0 and only.compute_s == pytest.approx(
        t.seconds("g", GraphKind.DECODE, 0, tokens=1, kv_tokens=40)
    )
    with pytest.raises(ConfigError, match="below 1"):
        GraphTiming(h2d_share=0.5, d2h_share=0.5)
    with pytest.raises(ConfigError, match="h2d_share"):
        GraphTiming(h2d_share=-0.1)


#: Pairs tried before giving up on one whose second submit came in time (a starved host between the two submits).
ATTEMPTS = 8
#: How long after the first job's start the second must have been submitted for the pair to show the overlap.
SUBMIT_GAP = 0.1 * UNIT


def _ping_pong(timing: TimingModel) -> tuple[float, list[TraceEvent]]:
    """A ping and a pong job submitted back to back: the span from the first start to the last end on the device's
    clock, and their trace events. The device's clock does not see the host's delays once both jobs are queued,
    but it starts a job at its submit: a host starved between the two submits (8 CPU burners beside the suite gave
    a 1 s gap once) leaves nothing to overlap, so such a pair is tried again."""
    pkg = package("single")
    gaps = []
    with open_runtime("mock", timing=timing) as rt:
        rt.configure(rt.create_calbin(pkg))
        rt.wait(prefill_job(rt, pkg, "model-a")[0], 10)  # warm numpy up outside the measurement
        for _ in range(ATTEMPTS):
            since = time.monotonic_ns()
            jobs = [prefill_job(rt, pkg, "model-a", engine=e)[0] for e in (Engine.PING, Engine.PONG)]
            for j in jobs:
                rt.wait(j, 10)
            events = sorted((e for e in rt.trace(since_ns=since) if e.job in {j.id for j in jobs}), key=lambda e: e.job)
            first_start = min(e.start_ns or 0 for e in events)
            gaps.append((events[-1].submit_ns - first_start) / 1e9)
            if gaps[-1] <= SUBMIT_GAP:
                span = max(e.end_ns or 0 for e in events) - first_start
                return span / 1e9, events
    pytest.fail(f"the second job was submitted {gaps} s after the first started in every pair (host starved)")


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> int:
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))


def _phase(e: TraceEvent, phase: JobPhase) -> tuple[int, int]:
    assert e.phases is not None
    (p,) = [p for p in e.phases if p.phase is phase]
    return p.start_ns, p.end_ns


def test_ping_pong_hide_transfers_behind_compute_but_never_compute_together() -> None:
    span, (a, b) = _ping_pong(fixed(0.3, 0.3))
    # on the device's clock: the second upload behind the first compute, 1.4 units for two 1-unit jobs
    assert span == pytest.approx(1.4 * UNIT, rel=0.02)
    assert _overlap(_phase(a, JobPhase.COMPUTE), _phase(b, JobPhase.COMPUTE)) == 0
    first, second = sorted((a, b), key=lambda e: _phase(e, JobPhase.COMPUTE)[0])
    # the second job's upload ran while the first computed, or the first's download while the second computed
    hidden = _overlap(_phase(second, JobPhase.H2D), _phase(first, JobPhase.COMPUTE)) + _overlap(
        _phase(first, JobPhase.D2H), _phase(second, JobPhase.COMPUTE)
    )
    assert hidden > 0.2 * UNIT * 1e9
    for e in (a, b):  # phases are in order and inside the job's interval
        assert e.phases is not None and [p.phase for p in e.phases] == [JobPhase.H2D, JobPhase.COMPUTE, JobPhase.D2H]
        assert e.start_ns is not None and e.end_ns is not None
        assert e.start_ns <= e.phases[0].start_ns and e.phases[-1].end_ns <= e.end_ns
        assert all(p.end_ns <= q.start_ns for p, q in zip(e.phases, e.phases[1:], strict=False))


def test_all_compute_jobs_gain_nothing_from_ping_pong() -> None:
    span, (a, b) = _ping_pong(fixed(0.0, 0.0))
    assert span == pytest.approx(2 * UNIT, rel=0.02)  # two in flight, one computing: two units
    assert [p.phase for p in a.phases or ()] == [JobPhase.COMPUTE]  # zero-length phases are not traced
    assert _overlap(_phase(a, JobPhase.COMPUTE), _phase(b, JobPhase.COMPUTE)) == 0
    assert a.start_ns is not None and b.start_ns is not None and a.end_ns is not None and b.end_ns is not None
    assert _overlap((a.start_ns, a.end_ns), (b.start_ns, b.end_ns)) > 0  # yet both were in flight together


def test_an_auto_job_takes_its_time_whatever_the_split() -> None:
    pkg = package("single")
    for shares in ((0.3, 0.3), (0.0, 0.0)):
        with open_runtime("mock", timing=fixed(*shares)) as rt:
            rt.configure(rt.create_calbin(pkg))
            rt.wait(prefill_job(rt, pkg, "model-a")[0], 10)
            job = prefill_job(rt, pkg, "model-a")[0]
            res = rt.wait(job, 10)
            # the device's clock is the modelled duration, exactly, at any host load
            assert res.device_seconds == pytest.approx(UNIT, rel=1e-3), (shares, res)


def test_chrome_trace_shows_phases_as_sub_slices_on_a_pong_track() -> None:
    _, events = _ping_pong(fixed(0.3, 0.3))
    slices = trace_slices(events, phases=True)
    assert len(slices) == 2 + 6
    assert len(trace_slices(events)) == 2  # phases only on request
    doc = json.loads(json.dumps(chrome_trace(slices, device="mock")))
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[1000] == "chip0 pong" and names[0] == "chip0"
    for tid in (0, 1000):
        track = [e for e in xs if e["tid"] == tid]
        jobs = [e for e in track if e["cat"] == "job"]
        phases = [e for e in track if e["cat"].startswith("job.")]
        assert len(jobs) == 1 and {e["cat"] for e in phases} == {"job.h2d", "job.compute", "job.d2h"}
        job = jobs[0]
        for p in phases:  # nested: a sub-slice lies inside its job's slice on the same track
            assert job["ts"] <= p["ts"] and p["ts"] + p["dur"] <= job["ts"] + job["dur"] + 0.01
        assert xs.index(job) < min(xs.index(p) for p in phases)


def test_a_starved_simulating_thread_moves_the_host_time_never_the_device_stamps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 26: a mock job's device interval is its modelled duration on its chip's timeline, whatever the host
    does to the thread that simulates it (here: its compute takes 3 units of host time instead of 0.4)."""
    from calctl.runtime.mock import compute

    real = compute.run_graph

    def slow(*args, **kwargs):
        time.sleep(3 * UNIT)
        return real(*args, **kwargs)

    pkg = package("single")
    with open_runtime("mock", timing=fixed(0.3, 0.3)) as rt:
        rt.configure(rt.create_calbin(pkg))
        rt.wait(prefill_job(rt, pkg, "model-a")[0], 10)
        monkeypatch.setattr(compute, "run_graph", slow)
        t0 = time.perf_counter()
        job = prefill_job(rt, pkg, "model-a")[0]
        res = rt.wait(job, 10)
        host = time.perf_counter() - t0
        second = rt.wait(prefill_job(rt, pkg, "model-a")[0], 10)
    assert host >= 3 * UNIT  # the host saw the starved thread
    assert res.device_seconds == pytest.approx(UNIT, rel=1e-3)  # the device did not
    assert res.start_ns is not None and res.start_ns >= job.submit_ns
    # the next job on the chip starts on the device's timeline, after the first one's device end
    assert second.start_ns is not None and res.end_ns is not None and second.start_ns >= res.end_ns
    assert second.device_seconds == pytest.approx(UNIT, rel=1e-3)
