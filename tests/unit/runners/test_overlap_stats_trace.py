"""S1/S2 judgement (001 §1, §13.2), bootstrap statistics and trace export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calctl.checks.stats import Estimate, bootstrap, percentiles
from calctl.runners.overlap import Interval, OverlapRound, joint_share_in, judge
from calctl.runners.trace import TraceSlice, chrome_trace, plot_timeline


def _low(e: Estimate) -> float:
    assert e.ci_low is not None, e
    return e.ci_low


def _high(e: Estimate) -> float:
    assert e.ci_high is not None, e
    return e.ci_high


def _mean(e: Estimate) -> float:
    assert e.mean is not None, e
    return e.mean


def _rounds(t_joint: list[float], t_iso: float = 1.0, tokens: int = 100) -> list[OverlapRound]:
    return [OverlapRound(t_iso, t_iso, tj, tokens, tokens, 2 * tokens) for tj in t_joint]


def test_parallel_chips_are_s2() -> None:
    v = judge(_rounds([1.02, 1.04, 1.01, 1.05, 1.03, 1.02]), shares=[0.9, 0.85, 0.92, 0.88, 0.9, 0.91])
    assert v.verdict == "S2"
    assert _low(v.overlap_ratio) > 0.4 and _mean(v.throughput_efficiency) > 0.9
    assert "per-chip trace share CI" in v.reasons[0] and "lies above 0.250" in v.reasons[0]


def test_wall_clock_alone_never_makes_s2() -> None:
    # 001 §1: only the per-chip trace, the timeline and the joint throughput together prove S2. Without job
    # timestamps the device's time is unknown: not judged, never S2.
    parallel = _rounds([1.02, 1.04, 1.01, 1.05, 1.03, 1.02])
    no_trace = judge(parallel)
    assert no_trace.verdict == "NOT JUDGED"
    assert "no per-chip job timestamps" in no_trace.reasons[0]
    took_turns = judge(parallel, shares=[0.0, 0.02, 0.01, 0.0, 0.03, 0.0])
    assert took_turns.verdict == "S1"
    assert len(took_turns.reasons) == 1 and "the chips took turns" in took_turns.reasons[0]


def test_serialised_chips_are_s1_with_reasons() -> None:
    v = judge(_rounds([2.02, 2.04, 2.03, 2.05, 2.01, 2.03]), shares=[0.0] * 6)
    assert v.verdict == "S1"
    assert any("global lock" in r for r in v.reasons)
    assert any("lies below 0.800" in r for r in v.reasons)
    assert any("took turns" in r for r in v.reasons)


def test_overlap_without_enough_efficiency_is_s1() -> None:
    # Some overlap (joint 1.7 vs serial 2.0) but efficiency 2/1.7/2 ~ 0.59.
    v = judge(_rounds([1.7, 1.71, 1.69, 1.7]), shares=[0.6] * 4)
    assert v.verdict == "S1" and _low(v.overlap_ratio) > 0
    assert len(v.reasons) == 1 and "efficiency" in v.reasons[0]


def test_one_round_cannot_decide() -> None:
    v = judge(_rounds([1.0]), shares=[0.9])
    assert v.verdict == "NOT JUDGED" and v.overlap_ratio.ci_low is None


def test_an_interval_across_the_gate_is_not_judged_not_s1() -> None:
    # The issue-26 case: a 4-round overlap CI of about [-0.16, 0.46] judged S1 although the trace showed both
    # chips busy. Straddling 0 decides nothing.
    v = judge(_rounds([2.6, 1.1, 1.6, 1.0]), shares=[0.75, 0.8, 0.7, 0.78])
    assert _low(v.overlap_ratio) < 0 < _high(v.overlap_ratio)
    assert v.verdict == "NOT JUDGED"
    assert any("straddles" in r for r in v.reasons)


def test_decide_pass_fail_and_straddle() -> None:
    from calctl.checks.stats import decide

    above = decide(bootstrap([0.5, 0.6, 0.55]), 0.25, above=True)
    below = decide(bootstrap([0.1, 0.12, 0.11]), 0.25, above=True)
    across = decide(bootstrap([0.1, 0.4, 0.2, 0.35]), 0.25, above=True)
    few = decide(bootstrap([0.9] * 50), 0.25, above=True, min_samples=100)
    assert (above.passed, below.passed, across.passed, few.passed) == (True, False, None, None)
    assert "straddles" in across.why and "n=4" in across.why
    assert "at least 100" in few.why
    # strict: an interval sitting on the limit is not above it
    assert decide(bootstrap([0.0, 0.0, 0.0]), 0.0, above=True, strict=True).passed is False
    assert decide(bootstrap([0.2, 0.22, 0.21]), 0.25, above=False).passed is True


def test_until_decided_stops_early_and_at_the_budget() -> None:
    from calctl.checks.stats import until_decided

    calls: list[int] = []
    assert until_decided(lambda: calls.append(1), lambda: True, first=3, budget=10) == 3
    assert until_decided(lambda: calls.append(1), lambda: False, first=3, budget=10) == 10
    assert until_decided(lambda: calls.append(1), lambda: len(calls) >= 18, first=2, budget=10) == 5


def test_device_seconds_leave_out_host_gaps_and_keep_device_waits() -> None:
    from calctl.runners.overlap import JobSpan, device_seconds, joint_share

    # chip 0: two 1 s jobs with a 5 s host gap between them; chip 1: one job that waited 1 s on the device
    jobs = [JobSpan(0, 0.0, 0.0, 1.0), JobSpan(0, 6.0, 6.0, 7.0), JobSpan(1, 0.0, 1.0, 2.0)]
    assert device_seconds(jobs) == {0: pytest.approx(2.0), 1: pytest.approx(2.0)}
    # chip 1 computed [1, 2] while chip 0 computed [0, 1] and [6, 7]: never together
    assert joint_share(jobs) == 0.0
    assert joint_share([JobSpan(0, 0, 0, 2), JobSpan(1, 0, 1, 2)]) == pytest.approx(1.0)
    assert joint_share([JobSpan(0, 0, 0, 2)]) is None


def test_joint_share_in_a_window_is_the_less_busy_chips_share() -> None:
    ivs = [Interval(0, 0.0, 1.0), Interval(1, 0.5, 1.5), Interval(1, 1.6, 2.0)]
    # chip 0 busy 1.0 s, chip 1 busy 1.4 s, both 0.5 s: half of the less busy chip's time
    assert joint_share_in(ivs, (0.0, 2.0)) == pytest.approx(0.5)
    # the same overlap with the chips fed half as often (a slow host): the share does not fall
    sparse = [*ivs, Interval(0, 10.0, 11.0), Interval(1, 10.5, 11.5)]
    assert joint_share_in(sparse, (0.0, 20.0)) == pytest.approx(1.0 / 2.0)
    # a global lock: the chips take turns, 0 whatever the load
    assert joint_share_in([Interval(0, 0, 1), Interval(1, 1, 2), Interval(0, 2, 3)], (0, 3)) == 0.0
    assert joint_share_in([Interval(0, 0, 1)], (0, 1)) == 0.0
    assert joint_share_in([], (1, 1)) is None
    assert joint_share_in(ivs, (0.0, 0.75)) == pytest.approx(0.25 / 0.25)  # clipped to the window


def test_bootstrap_is_seeded_and_brackets_the_mean() -> None:
    data = [0.9, 1.1, 1.0, 0.95, 1.05, 1.02, 0.98]
    a, b = bootstrap(data, seed=3), bootstrap(data, seed=3)
    assert a == b
    assert _low(a) < _mean(a) < _high(a)
    assert bootstrap([]).mean is None and bootstrap([1.0]).ci_low is None


def test_percentiles() -> None:
    p = percentiles([float(i) for i in range(1, 101)])
    assert p.count == 100 and p.p50 == pytest.approx(50.5) and p.p99 == pytest.approx(99.01)
    assert percentiles([]).p50 is None


def _slices() -> list[TraceSlice]:
    return [
        TraceSlice(0, 10.0, 10.1, "model-a", "model_a_prefill", "auto", 1, 1),
        TraceSlice(1, 10.02, 10.12, "model-b", "model_b_prefill", "auto", 2, 1),
        TraceSlice(0, 10.1, 10.15, "model-a", "model_a_decode", "ping", 3, 1, ok=False),
    ]


def test_chrome_trace_structure() -> None:
    doc = chrome_trace(_slices(), device="mock", metadata={"package_digest": "ab"})
    json.dumps(doc)
    complete = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == 3
    assert {e["tid"] for e in complete} == {0, 1}
    assert complete[0]["ts"] == 0.0 and complete[0]["dur"] == pytest.approx(100000.0)
    assert set(complete[0]["args"]) >= {"model", "graph", "engine", "generation", "job_id"}
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"chip0", "chip1"}
    assert doc["otherData"]["device"] == "mock"


def test_timeline_png(tmp_path: Path) -> None:
    out = tmp_path / "t.png"
    plot_timeline(out, _slices(), title="PoC", device="mock")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _figure_texts(monkeypatch: pytest.MonkeyPatch, draw) -> list[str]:
    """Every text a picture shows: the figure is caught as it is saved."""
    from matplotlib.figure import Figure

    seen: list[str] = []
    real = Figure.savefig

    def catch(fig, *a, **k):
        for ax in fig.axes:
            seen.extend(t.get_text() for t in ax.texts)
            seen.extend(t.get_text() for t in ax.get_yticklabels())
            seen.append(ax.get_xlabel())
        return real(fig, *a, **k)

    monkeypatch.setattr(Figure, "savefig", catch)
    draw()
    return seen


def test_the_warmup_picture_shows_the_figures_its_verdict_rests_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    decode = [
        TraceSlice(0, 1.0 + i * 0.01, 1.0 + i * 0.01 + 0.003 + 0.001 * (i % 2), "model-a", "a_decode", "auto", i, 1)
        for i in range(10)
    ]
    texts = _figure_texts(
        monkeypatch, lambda: plot_timeline(tmp_path / "w.png", decode, title="w", device="mock", latency=True)
    )
    row = [t for t in texts if t.startswith("P50 ")]
    assert row == ["P50 3.50 ms  max 4.00 ms  CV 0.151  n=10"]  # 10 jobs: no P99 (#53 item 10)
    assert "a_decode" in texts


def test_an_empty_both_chips_busy_lane_says_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    apart = [
        TraceSlice(0, 1.0, 1.1, "model-a", "a", "auto", 1, 1),
        TraceSlice(1, 2.0, 2.1, "model-b", "b", "auto", 2, 1),
    ]
    texts = _figure_texts(monkeypatch, lambda: plot_timeline(tmp_path / "t.png", apart, title="t", device="mock"))
    assert "none: the chips never computed at the same time" in texts
    texts = _figure_texts(monkeypatch, lambda: plot_timeline(tmp_path / "t.png", _slices(), title="t", device="mock"))
    assert not [t for t in texts if t.startswith("none:")]


def test_a_statistic_that_is_not_a_number_is_not_measured_and_its_gate_not_judged() -> None:
    """0/0 (windows with no isolated tokens) is no figure: the estimate has no mean, the report never prints
    "= nan", and the efficiency gate is NOT JUDGED saying why."""
    import numpy as np

    from calctl.loadgen.metrics import compare
    from calctl.runners.bench.gates import concurrency_gates

    zero = np.zeros(3)
    est = bootstrap([[0.0, 0.0], [0.0, 0.0]], lambda m: float("nan") if m[:, 1].sum() == 0 else 1.0)
    assert (est.mean, est.ci_low, est.ci_high, est.n) == (None, None, None, 2)
    cmp = compare(zero, zero, np.ones(3), np.ones(3), window_s=1.0)
    assert cmp.throughput_efficiency.mean is None
    (eff,) = [g for g in concurrency_gates(cmp) if g.name == "throughput_efficiency"]
    assert eff.passed is None and "not measured" in eff.detail and "nan" not in eff.detail
