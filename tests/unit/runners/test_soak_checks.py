"""The soak's invariants and evidence files, as pure functions (001 §13.1, §13.3)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from calctl.records import write_json
from calctl.runners.soak import checks, host_memory
from calctl.runners.soak.evidence import EventLog, Series
from calctl.runners.soak.mix import KINDS, MixedTraffic, ModelLimits
from calctl.runners.traffic import EngineResult, RequestOutcome, RequestRecord
from calctl.runtime.types import ChipCounters, ChipMemory

MIB = 1024**2
GIB = 1024**3


def test_drift_limit_is_max_of_64_mib_and_one_percent() -> None:
    assert checks.drift_limit_bytes(16 * GIB) == int(16 * GIB * 0.01)  # 163.84 MiB
    assert checks.drift_limit_bytes(4 * GIB) == 64 * MIB


def test_a_short_runs_host_rss_growth_beyond_max_64_mib_or_10_percent_is_a_named_violation() -> None:
    assert checks.host_rss_limit_bytes(300 * MIB) == 64 * MIB
    assert checks.host_rss_limit_bytes(2 * GIB) == int(2 * GIB * 0.10)
    ref = 300 * MIB
    fine = host_memory.judge([(1, ref), (2, ref + 64 * MIB), (3, ref - 50 * MIB)], None)  # at the limit, shrinking
    assert fine.method == "fixed limit" and fine.ok and fine.over_limit == ()
    assert host_memory.judge([(1, None), (2, None)], None).method == "not measured"  # no /proc: not checked
    v = host_memory.judge([(1, ref), (2, ref + 10 * MIB), (3, ref + 89 * MIB)], None)
    assert not v.ok and v.over_limit == ((3, 89 * MIB),)
    w = checks.host_rss_violation(ref, 89 * MIB, v.limit_bytes or 0, cycle=3, at_s=2.0)
    assert w.kind == "host_memory_growth" and w.cycle == 3 and w.subject == "host_rss"
    assert w.message.startswith("serving process: resident memory (VmRSS) +89.0 MiB after the unload of cycle 3")
    assert "from 300.0 MiB" in w.message and "limit 64.0 MiB" in w.message and "too short for a trend" in w.message
    assert w.detail["growth_bytes"] == 89 * MIB and w.detail["limit_bytes"] == 64 * MIB


def test_memory_drift_names_the_chip_and_the_drift() -> None:
    base = [ChipMemory(0, 64 * MIB, 16 * GIB), ChipMemory(1, 64 * MIB, 16 * GIB)]
    now = [ChipMemory(0, 64 * MIB + 256 * MIB, 16 * GIB), ChipMemory(1, 64 * MIB + 100 * MIB, 16 * GIB)]
    drifts, violations = checks.check_memory(base, now, cycle=4, at_s=1.0)
    assert [d.ok for d in drifts] == [False, True]
    (v,) = violations
    assert v.kind == "memory_drift" and v.subject == "chip0"
    assert "chip 0" in v.message and "+256.0 MiB" in v.message and "cycle 4" in v.message and "163.8 MiB" in v.message


def test_memory_not_reported_is_not_a_pass_or_a_failure() -> None:
    drifts, violations = checks.check_memory([ChipMemory(0, None, None)], [ChipMemory(0, None, None)], cycle=0, at_s=0)
    assert drifts[0].ok is None and drifts[0].document()["drift_bytes"] is None and not violations


def test_counters_must_close_and_match_what_the_host_submitted() -> None:
    before = [ChipCounters(0, 0, 10, 1), ChipCounters(1, 0, 5, 0)]
    assert (
        checks.check_counters(
            before, [ChipCounters(0, 0, 18, 3), ChipCounters(1, 0, 9, 0)], {0: 10, 1: 4}, cycle=1, at_s=0
        )
        == []
    )
    found = checks.check_counters(
        before, [ChipCounters(0, 2, 18, 1), ChipCounters(1, 0, 9, 0)], {0: 10, 1: 5}, cycle=1, at_s=0
    )
    kinds = sorted(v.kind for v in found)
    assert kinds == ["counters_mismatch", "counters_mismatch", "counters_open"]
    assert any("chip 0: 2 job(s) still pending" in v.message for v in found)
    assert any(
        "chip 1: the host submitted 5 job(s) in cycle 1, the device reports 4 finished + 0 failed = 4" in v.message
        for v in found
    )
    # A runtime that cannot count is not checked (never a made-up failure).
    assert (
        checks.check_counters(
            [ChipCounters(0, None, None, None)], [ChipCounters(0, None, None, None)], {0: 3}, cycle=0, at_s=0
        )
        == []
    )


def _result(
    gens: list[int | None],
    served: int | None,
    *,
    reported: int | None = None,
    outcome: RequestOutcome = RequestOutcome.OK,
) -> EngineResult:
    rec = RequestRecord("model-a", "stream", 0.0, 4, 8, outcome=outcome)
    return EngineResult(rec, "r1", served, list(gens), 1, len(gens) if reported is None else reported)


def test_generation_rule() -> None:
    assert checks.check_generations(_result([3, 3, 3], 3), 3, cycle=2, at_s=0) == []
    # Queued while the model was away: served by the next generation, which is allowed.
    assert checks.check_generations(_result([4, 4], 3), 4, cycle=2, at_s=0) == []
    (v,) = checks.check_generations(_result([4, 3, 4], 4), 4, cycle=2, at_s=0)
    assert v.kind == "stale_generation"
    assert "admitted under generation 4" in v.message and "from generation 3" in v.message and "token #1" in v.message
    (v,) = checks.check_generations(_result([2, 2], 3), 3, cycle=2, at_s=0)
    assert v.kind == "stale_generation" and "older than generation 3" in v.message
    (v,) = checks.check_generations(_result([9], 3), 4, cycle=2, at_s=0)
    assert v.kind == "unknown_generation"
    (v,) = checks.check_generations(_result([None, 3], 3), 3, cycle=2, at_s=0)
    assert v.kind == "untagged_token"
    assert checks.check_generations(_result([], 3), 3, cycle=0, at_s=0) == []


def test_request_checks() -> None:
    assert checks.check_request(_result([1, 1], 1), cycle=0, at_s=0) == []
    (v,) = checks.check_request(_result([1, 1, 1], 1, reported=2), cycle=0, at_s=0)
    assert v.kind == "token_count" and "received 3 token event(s), the engine reports 2" in v.message
    (v,) = checks.check_request(_result([1], 1, outcome=RequestOutcome.TIMEOUT), cycle=0, at_s=0)
    assert v.kind == "request_hung"


def test_violation_book_merges_repeats() -> None:
    book = checks.ViolationBook()
    assert book.add(checks.Violation("memory_drift", "chip 0: +256 after cycle 2", 2, 1.0, subject="chip0"))
    assert not book.add(checks.Violation("memory_drift", "chip 0: +256 after cycle 3", 3, 2.0, subject="chip0"))
    assert book.add(checks.Violation("memory_drift", "chip 1: +99", 3, 2.0, subject="chip1"))
    docs = book.documents()
    assert len(book) == 2 and docs[0]["occurrences"] == 2 and docs[0]["last_cycle"] == 3 and docs[0]["cycle"] == 2


def test_series_stays_bounded() -> None:
    s = Series(max_points=100)
    for i in range(10_000):
        s.add(float(i), float(i))
    pts = s.points()
    assert 50 <= len(pts) <= 100
    assert pts[0] == (0.0, 0.0) and pts[-1][0] > 9000  # covers the whole run


def test_event_log_and_atomic_report(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.ndjson", t0=0.0)
    log.write("loaded", cycle=1, generations={"model-a": 2}, drift=float("nan"))
    log.write("unloaded", cycle=1)
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "events.ndjson").read_text().splitlines()]
    assert [x["event"] for x in lines] == ["loaded", "unloaded"] and lines[0]["drift"] is None
    write_json(tmp_path / "r.json", {"status": "running", "cycles": 3})
    text = (tmp_path / "r.json").read_text()
    assert text.lstrip().startswith('{\n  "schema_version"') and json.loads(text)["cycles"] == 3
    assert sorted(os.listdir(tmp_path)) == ["events.ndjson", "r.json"]  # no temporary file left behind


def test_mixed_traffic_is_seeded_and_respects_the_context() -> None:
    assert sum(k.weight for k in KINDS) == pytest.approx(1.0)
    lim = ModelLimits(context_limit=256, vocab_size=384)
    a = [MixedTraffic("model-a", lim, seed=7, client=0).next() for _ in range(1)]
    draws = MixedTraffic("model-a", lim, seed=7, client=0)
    again = MixedTraffic("model-a", lim, seed=7, client=0)
    seen = set()
    for _ in range(400):
        (r1, p1), (r2, p2) = draws.next(), again.next()
        assert r1 == r2 and p1 == p2
        seen.add(p1.kind)
        assert all(3 <= t < 384 for t in r1.prompt_ids)
        if p1.kind == "invalid":
            assert len(r1.prompt_ids) > 256
        else:
            assert len(r1.prompt_ids) >= 1 and len(r1.prompt_ids) + r1.max_tokens <= 256
    assert seen == {k.name for k in KINDS}
    assert a[0][0] != MixedTraffic("model-a", lim, seed=8, client=0).next()[0]


def test_a_signal_while_loading_records_no_requests_open_violation(tmp_path: Path) -> None:
    """Issue 29 item 11: SIGTERM while a cycle loads cancels the clients; the requests the engine still holds
    are what the interrupt left, not a `requests_open` violation beside `requests.open: 0`."""
    from types import SimpleNamespace

    from calctl.runners.context import DeviceSpec
    from calctl.runners.soak import judge
    from calctl.runners.soak.run import SoakConfig, _Soak
    from calctl.runners.soak.state import Interruption
    from calctl.signing.policy import TrustPolicy

    cfg = SoakConfig(package=tmp_path, trust=TrustPolicy(), device=DeviceSpec(), out_dir=tmp_path / "s", cycles=2)
    soak = _Soak(cfg, None)
    worker = SimpleNamespace(live_requests=lambda: 2)
    sup = SimpleNamespace(cores={"model-b": worker}, metrics=SimpleNamespace(registry=SimpleNamespace(collect=list)))
    soak.interrupted = Interruption(signal="SIGTERM", phase="loading", cycle=2, at_s=3.0)
    judge.final_checks(soak, sup)  # type: ignore[arg-type]
    assert soak.requests.outstanding == 0
    assert soak.violations.documents() == []
    assert soak.interrupted.document()["engine_requests_left"] == {"model-b": 2}
    # Without a signal the same engine state is a violation (the final drain left requests behind).
    cfg2 = SoakConfig(package=tmp_path, trust=TrustPolicy(), device=DeviceSpec(), out_dir=tmp_path / "t", cycles=2)
    soak2 = _Soak(cfg2, None)
    judge.final_checks(soak2, sup)  # type: ignore[arg-type]
    assert [v["kind"] for v in soak2.violations.documents()] == ["requests_open"]
    soak.events.close()
    soak2.events.close()
