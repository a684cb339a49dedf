"""Bench workloads, metrics, the 001 §13.2 comparison and gates, the SSE client, the scenario registry."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import numpy as np
import pytest

from calctl.checks import host
from calctl.errors import UsageError
from calctl.loadgen.client import RequestRecord
from calctl.loadgen.http import HttpTarget, _stream
from calctl.loadgen.metrics import Slo, compare, refused_all, saturated, summarize, window_rates
from calctl.loadgen.workload import LengthDist, TokenRange, arrival_times, build_workload
from calctl.runners.bench import gates as G
from calctl.runners.bench.base import BenchOptions, ScenarioResult
from calctl.runners.bench.bench_report import scenario_report
from calctl.runners.bench.scenarios import DEFAULT_SCENARIO, SCENARIOS
from calctl.serving.outcomes import RequestOutcome


def test_length_distributions() -> None:
    rng = np.random.default_rng(0)
    assert (LengthDist.parse("16").sample(rng, 5) == 16).all()
    u = LengthDist.parse("uniform:4:8").sample(rng, 2000)
    assert u.min() == 4 and u.max() == 8
    n = LengthDist.parse("normal:20:5").sample(rng, 2000)
    assert n.min() >= 1 and abs(n.mean() - 20) < 1
    assert set(LengthDist.parse("choice:3,9").sample(rng, 200)) == {3, 9}
    for bad in ("0", "uniform:5:2", "uniform:a:b", "normal:-1:2", "gauss:1", ""):
        with pytest.raises(UsageError):
            LengthDist.parse(bad)
    # Numbers that are not what they look like: float()/int() took every one of them (nan passed `mean < 1`).
    for bad in (
        "normal:nan:1",
        "normal:inf:1",
        "normal:20:1e309",
        "uniform:1_0:20",
        "choice:\u0663",
        "\u0663\u0663",
        "uniform:1:99999999999999999999",
        "normal:1e300:1",
    ):
        with pytest.raises(UsageError, match="decimal numbers, 1 to 1000000000"):
            LengthDist.parse(bad)


def test_token_range_takes_decimal_integers_only() -> None:
    assert TokenRange.parse("3:256") == TokenRange(3, 256)
    for bad in ("3:2_56", "0x3:256", "3:\u0663\u0663\u0663", "3:1e3", "3:" + "9" * 30):
        with pytest.raises(UsageError, match="--token-range"):
            TokenRange.parse(bad)


def test_gamma_arrivals_rate_burstiness_and_bounds() -> None:
    rng = np.random.default_rng(1)
    t = arrival_times(20.0, 500.0, 1.0, rng, 100_000)
    gaps = np.diff(t)
    assert abs(gaps.mean() - 0.05) < 0.005  # mean 1/rate
    assert 0.9 < gaps.std() / gaps.mean() < 1.1  # Poisson: CV 1
    regular = np.diff(arrival_times(20.0, 500.0, 4.0, np.random.default_rng(1), 100_000))
    assert 0.4 < regular.std() / regular.mean() < 0.6  # gamma shape 4: CV 1/2
    assert len(arrival_times(20.0, 500.0, 1.0, np.random.default_rng(1), 37)) == 37
    assert arrival_times(20.0, 2.0, 1.0, np.random.default_rng(1), 1000).max() < 2.0


def test_workloads_replay_per_seed_and_stream() -> None:
    args: dict[str, Any] = dict(
        rate=5.0,
        duration_s=4.0,
        burstiness=1.0,
        prompt=LengthDist.parse("uniform:2:9"),
        output=LengthDist.parse("8"),
        tokens=TokenRange(3, 50),
        max_requests=100,
    )
    a1 = build_workload(seed=3, stream=0, **args)
    assert a1 == build_workload(seed=3, stream=0, **args)
    assert a1 != build_workload(seed=3, stream=1, **args)
    assert all(3 <= t < 50 for r in a1 for t in r.prompt_ids) and all(r.max_tokens == 8 for r in a1)


def _rec(alias: str, sent: float, first: float, end: float, tokens: int, *, ok: bool = True) -> RequestRecord:
    times = list(np.linspace(first, end, tokens)) if tokens else []
    return RequestRecord(
        alias,
        "load",
        sent,
        8,
        tokens,
        outcome=RequestOutcome.OK if ok else RequestOutcome.CAPACITY,
        first_token=first if tokens else None,
        end=end,
        tokens=tokens,
        token_times=times,
    )


def test_tpot_itl_and_summary_with_goodput() -> None:
    r = _rec("a", 0.0, 0.1, 1.0, 10)
    assert r.ttft == pytest.approx(0.1) and r.e2e == pytest.approx(1.0)
    assert r.tpot == pytest.approx((1.0 - 0.1) / 9)  # (latency - TTFT) / (tokens - 1)
    assert len(r.itls()) == 9 and sum(r.itls()) == pytest.approx(0.9)
    recs = [r, _rec("a", 0.0, 0.5, 2.0, 4), _rec("a", 0.0, 0.0, 0.0, 0, ok=False)]
    s = summarize("a", recs, t0=0.0, slo=Slo(ttft_s=0.2), duration_s=2.0, offered_tokens=14)
    assert s.requests == 3 and s.succeeded == 2 and s.success_rate == pytest.approx(2 / 3)
    assert s.completion_tokens == 14 and s.wall_s == pytest.approx(2.0) and s.tokens_per_s == pytest.approx(7.0)
    assert s.goodput_rps == pytest.approx(0.5) and s.slo_attainment == pytest.approx(1 / 3)  # only the first met TTFT
    assert s.outcomes == {"ok": 2, "capacity": 1} and saturated(s)  # a 429 means A was driven past capacity
    assert summarize("a", recs, t0=0.0, slo=Slo()).goodput_rps is None  # no SLO given: no goodput, never 0


def _steady(alias: str, rate_tokens: float, duration: float, *, stretch: float = 1.0) -> list[RequestRecord]:
    """Requests of 10 tokens arriving every 10/rate s; ``stretch`` > 1 delivers them that much slower."""
    out = []
    t = 0.0
    gap = 10.0 / rate_tokens
    while t < duration:
        start = t * stretch
        out.append(_rec(alias, t, start + 0.01, start + 0.01 + 0.2, 10))
        t += gap
    return out


def test_paired_windows_tell_parallel_from_serial() -> None:
    d, w = 10.0, 1.0

    def rates(recs: list[RequestRecord]) -> np.ndarray:
        return window_rates(recs, t0=0.0, duration_s=d, window_s=w)

    a, b = rates(_steady("a", 50, d)), rates(_steady("b", 50, d))
    assert len(a) == 9 and a.mean() == pytest.approx(50, rel=0.1)  # the first window is dropped as ramp-up
    parallel = compare(a, b, a.copy(), b.copy(), window_s=w)
    assert parallel.throughput_efficiency.mean == pytest.approx(1.0)
    assert parallel.overlap_ratio.mean == pytest.approx(0.5)
    serial = compare(a, b, rates(_steady("a", 50, d, stretch=2.0)), rates(_steady("b", 50, d, stretch=2.0)), window_s=w)
    assert serial.throughput_efficiency.mean == pytest.approx(0.5, abs=0.08)
    assert serial.overlap_ratio.mean is not None and abs(serial.overlap_ratio.mean) < 0.1
    gates = {g.name: g for g in G.concurrency_gates(serial)}
    assert gates["throughput_efficiency"].passed is False and "0.80" in gates["throughput_efficiency"].rule
    # overlap near 0 with an interval across 0: the decision rule leaves it NOT JUDGED, saying why
    assert gates["overlap_ratio"].passed is None and "straddles" in gates["overlap_ratio"].note
    busy = G.TraceEvidence(0.8, "mock", 40)
    assert {g.name: g.passed for g in G.concurrency_gates(parallel, busy)} == {
        "per_chip_trace_overlap": True,
        "throughput_efficiency": True,
        "overlap_ratio": True,
    }


def test_wall_clock_alone_never_passes_the_concurrency_gates() -> None:
    # 001 §1: per-chip trace, timeline and joint throughput together prove S2; wall clock alone is not enough.
    d, w = 10.0, 1.0
    a = window_rates(_steady("a", 50, d), t0=0.0, duration_s=d, window_s=w)
    b = window_rates(_steady("b", 50, d), t0=0.0, duration_s=d, window_s=w)
    parallel = compare(a, b, a.copy(), b.copy(), window_s=w)
    no_trace = G.concurrency_gates(parallel)
    assert G.verdict(no_trace) == G.NOT_JUDGED
    (gate,) = [g for g in no_trace if g.name == "per_chip_trace_overlap"]
    assert gate.passed is None and "S2 cannot be shown from wall clock alone" in gate.full
    refused = G.TraceEvidence(None, missing="GET /internal/trace answered 403")
    assert "403" in G.trace_gate(refused).full
    took_turns = G.concurrency_gates(parallel, G.TraceEvidence(0.02, "mock", 40))
    assert G.verdict(took_turns) == "FAIL"
    assert "2% of the less busy chip's busy time in the joint phase: the chips took turns" in (
        G.failing(took_turns)[0].full
    )


def test_a_p99_gate_on_17_samples_is_not_judged_and_says_what_would_be_enough() -> None:
    iso = summarize("model-b", [_rec("model-b", 0, 0.1, 1.0, 10) for _ in range(17)], t0=0, slo=Slo())
    worse = summarize("model-b", [_rec("model-b", 0, 0.35, 1.9, 10) for _ in range(17)], t0=0, slo=Slo())
    ttft, tpot = G.degradation_gates(iso, worse, G.Load(duration_s=5.0, rate=4.0))
    for g in (ttft, tpot):  # +250 % measured, but the "P99" of 17 requests is the slowest one: no verdict
        assert g.passed is None and g.verdict == "NOT JUDGED" and g.samples == 17 and g.min_samples == 100
        assert "n=17 isolated, n=17 joint" in g.full and ">= 100 samples" in g.full
        assert "--duration 30 (at --rate 4)" in g.full and "--rate 23.5 (at --duration 5" in g.full
    assert ttft.value == pytest.approx(2.5)
    assert G.verdict([ttft, tpot]) == "NOT JUDGED" and G.failing([ttft, tpot]) == []
    assert G.MIN_SAMPLES == {"p50": 2, "p90": 10, "p99": 100}
    ok_b = summarize("model-b", [_rec("model-b", 0, 0.1, 1, 10)] * 17, t0=0, slo=Slo())
    b = G.b_success_gate(iso, ok_b)
    assert b.passed is None and "needs >= 1000 requests" in b.full and b.value == 1.0
    assert b.document()["verdict"] == "NOT JUDGED" and b.document()["samples"] == 17


def test_degradation_and_b_success_gates() -> None:
    iso = summarize("model-a", [_rec("model-a", 0, 0.1, 1.0, 10) for _ in range(100)], t0=0, slo=Slo())
    worse = summarize("model-a", [_rec("model-a", 0, 0.2, 1.9, 10) for _ in range(100)], t0=0, slo=Slo())
    ttft, tpot = G.degradation_gates(iso, worse)
    assert ttft.name == "p99_ttft_degradation[model-a]" and ttft.passed is False and ttft.value == pytest.approx(1.0)
    assert "+100.0 %" in ttft.detail and tpot.passed is False
    assert all(g.passed for g in G.degradation_gates(iso, iso))
    b_bad = summarize(
        "model-b", [_rec("model-b", 0, 0.1, 1, 10)] * 999 + [_rec("model-b", 0, 0, 0, 0, ok=False)] * 2, t0=0, slo=Slo()
    )
    g = G.b_success_gate(iso, b_bad)
    assert g.passed is False and "997" not in g.detail and "999/1001" in g.detail and "not saturated" in g.detail
    assert G.verdict([g]) == "FAIL" and G.verdict([]) == "MEASURED" and G.failing([g]) == [g]


def _sse(*events: str, status: int = 200) -> httpx.MockTransport:
    body = "".join(events).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream_options"] == {"include_usage": True}
        return httpx.Response(status, content=body, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handler)


def _chunk(text: str = "", finish: str | None = None) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]}) + "\n\n"


def _run_stream(transport: httpx.MockTransport) -> RequestRecord:
    async def go() -> RequestRecord:
        rec = RequestRecord("m", "load", 0.0, 4, 8)
        async with httpx.AsyncClient(transport=transport) as c:
            body = {"model": "m", "stream_options": {"include_usage": True}}
            await _stream(c, HttpTarget("http://test"), "/v1/completions", body, rec)
        return rec

    return asyncio.run(go())


def test_sse_client_outcomes() -> None:
    usage = "data: " + json.dumps({"choices": [], "usage": {"completion_tokens": 3}}) + "\n\n"
    ok = _run_stream(_sse(_chunk("a"), _chunk("bc"), _chunk("", "length"), usage, "data: [DONE]\n\n"))
    assert ok.outcome is RequestOutcome.OK and ok.tokens == 3 and len(ok.token_times) == 2 and ok.finish == "length"
    err = _run_stream(_sse(_chunk("a"), "event: error\ndata: " + json.dumps({"error": {"message": "device"}}) + "\n\n"))
    assert err.outcome is RequestOutcome.DEVICE_ERROR and err.error == "device"
    cut = _run_stream(_sse(_chunk("a")))
    assert cut.outcome is RequestOutcome.TRANSPORT and "[DONE]" in (cut.error or "")
    busy = _run_stream(_sse(json.dumps({"error": {"code": "rate_limit_exceeded", "message": "full"}}), status=429))
    assert busy.outcome is RequestOutcome.CAPACITY and busy.status == 429 and busy.error == "full"
    late = _run_stream(_sse(json.dumps({"error": {"code": "deadline_exceeded", "message": "x"}}), status=503))
    assert late.outcome is RequestOutcome.DEADLINE


def test_scenario_registry_is_one_explicit_table() -> None:
    assert DEFAULT_SCENARIO == "ab" and list(SCENARIOS)[:3] == ["ab", "interference", "fault-isolation"]
    for name, s in SCENARIOS.items():
        assert s.name == name and callable(s.run) and s.summary
    assert not SCENARIOS["fault-isolation"].needs_url and SCENARIOS["ab"].needs_url
    # The contract a new scenario (e.g. issue 10's executor-modes) implements:
    res = ScenarioResult("x", "MEASURED")
    assert res.gates == () and res.tables == () and BenchOptions.__dataclass_fields__["out_dir"]
    # ... and its report: the exit code is the verdict's (calctl.report.exit_code_of), the result has none.
    assert not hasattr(res, "exit_code") and scenario_report("bench", res, {}).exit_code == 0
    assert scenario_report("bench", ScenarioResult("x", "F0"), {}).document()["exit_code"] == 1


def test_executor_modes_host_clock_checks_on_a_saturated_host_are_inconclusive() -> None:
    """Issue 26: M1/M2's E2E and throughput are on the host's clock; on a saturated host they judge nothing."""
    from calctl.checks.stats import Estimate
    from calctl.runners.bench.executor_modes import judge as em

    slow = em._at_most("p50_e2e_regression", Estimate(0.4, 0.3, 0.5, 6), 0.03, "async P50 E2E vs sync")
    assert slow.passed is False
    held = em._host_bound(slow, "host saturated: load average up to 26.5 on 2 CPUs")
    assert held.passed is None and "host saturated" in held.detail
    assert host.saturated([0.5, 1.0]) is False and host.saturated([1.0, 999.0]) is True and host.saturated([]) is False


def test_bench_host_clock_gates_on_a_saturated_host_are_not_judged_and_the_trace_still_decides() -> None:
    """Issue 26: on a saturated host the wall-clock gates say NOT JUDGED naming the load; the per-chip trace,
    on the device's clock, still fails a board whose chips took turns and passes one whose chips overlap."""
    d, w = 10.0, 1.0
    a = window_rates(_steady("a", 50, d), t0=0.0, duration_s=d, window_s=w)
    b = window_rates(_steady("b", 50, d), t0=0.0, duration_s=d, window_s=w)
    serial = compare(a, b, a * 0.5, b * 0.5, window_s=w)  # what a starved host and a global lock both look like
    note = host.saturation_note([3.0, 17.5], "the phases")
    assert "load average up to 17.5" in note and "host's clock" in note
    lock = G.host_bound(G.concurrency_gates(serial, G.TraceEvidence(0.0, "mock", 40)), note)
    by = {g.name: g for g in lock}
    assert by["per_chip_trace_overlap"].passed is False and G.verdict(lock) == "FAIL"
    assert by["throughput_efficiency"].passed is None and by["throughput_efficiency"].note == note
    healthy = G.host_bound(G.concurrency_gates(serial, G.TraceEvidence(0.8, "mock", 40)), note)
    assert G.verdict(healthy) != "FAIL" and not G.failing(healthy)
    named = G.Gate("A prefill + B decode: p99_tpot_degradation[model-b]", "x", 2.0, False)
    assert G.host_bound([named], note)[0].passed is None  # interference pairs prefix their gate names


def _refused(alias: str, n: int, outcome: RequestOutcome) -> list[RequestRecord]:
    return [RequestRecord(alias, "load", 0.0, 8, 16, outcome=outcome, end=0.01) for _ in range(n)]


@pytest.mark.parametrize(
    ("outcome", "text"),
    [
        (RequestOutcome.UNAVAILABLE, "every request refused: 9 x 503 (unavailable)"),
        (RequestOutcome.CAPACITY, "every request refused: 9 x 429 (capacity)"),
        (RequestOutcome.INVALID, "every request refused: 9 x 400 (invalid)"),
    ],
)
def test_a_phase_the_server_refused_outright_is_not_saturation(outcome: RequestOutcome, text: str) -> None:
    """A server that answers every request 400/429/503 served nothing: the bench says so and never calls the
    model saturated (the A/B bench used to print "saturated: yes" and "A was saturated")."""
    a = summarize("model-a", _refused("model-a", 9, outcome), t0=0, slo=Slo(), duration_s=2.0, offered_tokens=144)
    assert refused_all(a) == text and saturated(a) is False
    assert a.document()["refused_all"] == text and a.document()["saturated"] is False
    b = summarize("model-b", [_rec("model-b", 0, 0.1, 1.0, 10)] * 10, t0=0, slo=Slo())
    g = G.b_success_gate(a, b)
    assert "A (model-a) was not loaded, the server refused it: " + text in g.detail, g.detail
    assert "saturated" not in g.detail
    g = G.b_success_gate(b, summarize("model-b", _refused("model-b", 8, outcome), t0=0, slo=Slo()))
    assert g.passed is False and "0/8 succeeded" in g.detail and "every request refused: 8 x" in g.detail


def test_refusals_beside_served_requests_are_still_saturation() -> None:
    recs = [_rec("model-a", 0, 0.1, 1.0, 10)] * 5 + _refused("model-a", 3, RequestOutcome.UNAVAILABLE)
    s = summarize("model-a", recs, t0=0, slo=Slo())
    assert refused_all(s) is None and saturated(s) is True
    assert refused_all(summarize("model-a", [], t0=0, slo=Slo())) is None
    mixed = _refused("model-a", 3, RequestOutcome.UNAVAILABLE) + _refused("model-a", 1, RequestOutcome.TIMEOUT)
    assert refused_all(summarize("model-a", mixed, t0=0, slo=Slo())) is None  # a timeout is no refusal


def test_the_ab_tables_and_notes_name_a_refused_phase() -> None:
    from calctl.runners.bench.ab import _rate_rows, _refusal_notes

    a = summarize("model-a", _refused("model-a", 4, RequestOutcome.UNAVAILABLE), t0=0, slo=Slo())
    b = summarize("model-b", [_rec("model-b", 0, 0.1, 1.0, 10)] * 4, t0=0, slo=Slo())
    assert [row[-1] for row in _rate_rows("joint", [a, b])] == ["refused all", "no"]
    assert _refusal_notes({"joint": {"model-a": a, "model-b": b}}) == [
        "model-a joint: every request refused: 4 x 503 (unavailable): the server refused the load, so this phase "
        "measures nothing of serving"
    ]
