"""PrefillScheduler and the decode/short/medium/long arbiter (000 §6, 001 §9.2–§9.3)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from calctl.serving.core import (
    ModelGenerationId,
    PrefillScheduler,
    PrefillThresholds,
    RequestId,
    RequestState,
    SequenceState,
    ServiceArbiter,
    ServiceWeights,
    TenantId,
    WorkKind,
)
from calctl.serving.core.request import EndReason

G = ModelGenerationId(1)
ALL = (WorkKind.DECODE, WorkKind.PREFILL_SHORT, WorkKind.PREFILL_MEDIUM, WorkKind.PREFILL_LONG)


def _seq(rid: str, prompt: int, vf: float = 0.0, deadline: float = 100.0) -> SequenceState:
    return SequenceState(
        RequestId(rid),
        TenantId("t"),
        0.0,
        state=RequestState.PREFILL_READY,
        prompt_tokens=prompt,
        virtual_finish=vf,
        deadline=deadline,
        generation=G,
    )


def test_classification_uses_configured_thresholds() -> None:
    """000 §6 / §15: short <= 512 < medium <= 4096 < long by default; thresholds are configuration."""
    t = PrefillThresholds()
    assert [t.classify(n) for n in (1, 512, 513, 4096, 4097)] == [
        WorkKind.PREFILL_SHORT,
        WorkKind.PREFILL_SHORT,
        WorkKind.PREFILL_MEDIUM,
        WorkKind.PREFILL_MEDIUM,
        WorkKind.PREFILL_LONG,
    ]
    custom = PrefillThresholds(16, 64)
    assert custom.classify(17) is WorkKind.PREFILL_MEDIUM and custom.classify(65) is WorkKind.PREFILL_LONG
    with pytest.raises(ValueError):
        PrefillThresholds(512, 512)


def test_arbiter_gives_8_4_2_1_shares_when_all_backlogged() -> None:
    """000 §6: decode:short:medium:long = 8:4:2:1 service opportunities, interleaved."""
    arb = ServiceArbiter(ServiceWeights())
    picks = [arb.pick(ALL) for _ in range(150)]
    assert Counter(picks) == {
        WorkKind.DECODE: 80,
        WorkKind.PREFILL_SHORT: 40,
        WorkKind.PREFILL_MEDIUM: 20,
        WorkKind.PREFILL_LONG: 10,
    }
    # smooth: decode never takes more than 2 opportunities in a row
    run = longest = 0
    for p in picks:
        run = run + 1 if p is WorkKind.DECODE else 0
        longest = max(longest, run)
    assert longest <= 2


def test_long_prefill_gets_its_minimum_share_under_continuous_decode() -> None:
    """000 §17.1: long prefill still gets its share while decode and short prefills never stop."""
    arb = ServiceArbiter(ServiceWeights())
    eligible = (WorkKind.DECODE, WorkKind.PREFILL_SHORT, WorkKind.PREFILL_LONG)
    picks = [arb.pick(eligible) for _ in range(130)]
    gaps = [i for i, p in enumerate(picks) if p is WorkKind.PREFILL_LONG]
    assert len(gaps) == 10  # 1 / (8 + 4 + 1) of 130
    assert max(b - a for a, b in itertools.pairwise(gaps)) <= 13


def test_idle_kind_cannot_bank_turns_and_arbiter_is_work_conserving() -> None:
    """An empty queue is skipped (work-conserving) and does not accumulate credit while idle."""
    arb = ServiceArbiter(ServiceWeights())
    for _ in range(100):
        assert arb.pick([WorkKind.DECODE]) is WorkKind.DECODE
    picks = [arb.pick(ALL) for _ in range(15)]
    assert Counter(picks)[WorkKind.PREFILL_LONG] == 1  # no burst of banked long turns
    assert arb.pick([]) is None


def test_queues_are_wfq_ordered_and_whole_prompts() -> None:
    """000 §5.3 order within a class; 000 §6 a prompt is never split (the popped request carries it whole)."""
    ps = PrefillScheduler(PrefillThresholds(), ServiceWeights())
    a, b, c = _seq("a", 100, vf=30), _seq("b", 200, vf=10), _seq("c", 9000, vf=1)
    for s in (a, b, c):
        ps.push(s)
    assert ps.depth(WorkKind.PREFILL_SHORT) == 2 and ps.depth(WorkKind.PREFILL_LONG) == 1
    got, dropped = ps.pop(WorkKind.PREFILL_SHORT, 0.0, G)
    assert got is b and not dropped and got.prompt_tokens == 200
    assert ps.next_kind(decode_ready=False) in (WorkKind.PREFILL_SHORT, WorkKind.PREFILL_LONG)


def test_pop_skips_expired_wrong_generation_and_discarded() -> None:
    """000 §7.2 rule 1 applies to prefill too: expired and stale-generation requests are dropped, not run."""
    ps = PrefillScheduler(PrefillThresholds(), ServiceWeights())
    gone, late, old, ok = (
        _seq("gone", 5, vf=1),
        _seq("late", 5, vf=2, deadline=1.0),
        _seq("old", 5, vf=3),
        _seq("ok", 5, vf=4),
    )
    old.generation = ModelGenerationId(0)
    for s in (gone, late, old, ok):
        ps.push(s)
    ps.discard(gone)
    got, dropped = ps.pop(WorkKind.PREFILL_SHORT, 2.0, G)
    assert got is ok
    assert [(d.seq.request_id, d.reason) for d in dropped] == [
        ("late", EndReason.DEADLINE),
        ("old", EndReason.GENERATION_RETIRED),
    ]
    assert ps.total_depth == 0
