"""DecodeScheduler: 000 §7.1–§7.3 batch building and selection, §8 profile choice, §17.1 unit cases."""

from __future__ import annotations

import pytest

from calctl.serving.core import (
    BatchProfile,
    DecodeBatch,
    DecodeScheduler,
    InactiveLaneContract,
    JobId,
    LaneId,
    ModelGenerationId,
    ProfileRefused,
    RequestId,
    RequestState,
    SequenceState,
    TenantId,
)
from calctl.serving.core.request import EndReason
from tests.unit.serving.serving_helpers import B1, bprofile

G = ModelGenerationId(1)


def _seq(rid: str, *, tenant: str = "t", deadline: float = 100.0, vf: float = 0.0, gen: int = 1) -> SequenceState:
    return SequenceState(
        RequestId(rid),
        TenantId(tenant),
        0.0,
        state=RequestState.DECODE_READY,
        deadline=deadline,
        virtual_finish=vf,
        generation=ModelGenerationId(gen),
        last_token=42,
    )


def _ds(*profiles: BatchProfile, **kw) -> DecodeScheduler:
    return DecodeScheduler(profiles or (B1,), **kw)


@pytest.mark.parametrize("ready", range(0, 6))
def test_lane_selection_for_ready_0_to_b_plus_1(ready: int) -> None:
    """000 §17.1: ready queue of 0..B+1 (B=4): min(ready, B) lanes, in deadline order, never more than B."""
    ds = _ds(bprofile(4), max_tenant_lane_share=1.0)
    seqs = [_seq(f"r{i}", deadline=10.0 + i) for i in range(ready)]
    for s in seqs:
        ds.push(s, 0.0)
    poll = ds.poll(0.0)
    if ready == 0:
        assert poll.profile is None and poll.wake_at is None
        return
    assert poll.profile is not None and poll.profile.compiled_batch == 4
    sel = ds.take(poll.profile, 0.0, G)
    assert [s.request_id for s in sel.selected] == [f"r{i}" for i in range(min(ready, 4))]
    assert ds.ready_count == max(0, ready - 4)


def test_deadline_cancel_and_generation_mismatch_are_skipped() -> None:
    """000 §7.2 rule 1 / §17.1: expired, cancelled (discarded) and wrong-generation requests never get a lane."""
    ds = _ds()
    expired, cancelled, stale, ok = (
        _seq("exp", deadline=1.0),
        _seq("cxl", deadline=2.0),
        _seq("old", deadline=3.0, gen=0),
        _seq("ok", deadline=4.0),
    )
    for s in (expired, cancelled, stale, ok):
        ds.push(s, 0.0)
    cancelled.state = RequestState.CANCELLED  # the registry cancelled it; the scheduler discards it
    ds.discard(cancelled)
    sel = ds.take(B1, 1.5, G)
    assert [s.request_id for s in sel.selected] == ["ok"]
    assert [(d.seq.request_id, d.reason) for d in sel.dropped] == [
        ("exp", EndReason.DEADLINE),
        ("old", EndReason.GENERATION_RETIRED),
    ]
    assert ds.ready_count == 0


def test_earliest_deadline_first_then_virtual_finish() -> None:
    """000 §7.2 rule 2: earliest deadline wins; equal deadlines (within the granularity) go by virtual finish."""
    ds = _ds(bprofile(4), max_tenant_lane_share=1.0, deadline_granularity_s=1.0)
    ds.push(_seq("late", deadline=50.0, vf=1.0), 0.0)
    ds.push(_seq("same-a", deadline=10.2, vf=9.0), 0.0)
    ds.push(_seq("same-b", deadline=10.7, vf=3.0), 0.0)
    ds.push(_seq("first", deadline=5.0, vf=99.0), 0.0)
    sel = ds.take(bprofile(4), 0.0, G)
    assert [s.request_id for s in sel.selected] == ["first", "same-b", "same-a", "late"]


def test_tenant_lane_cap_unless_no_other_candidate() -> None:
    """000 §7.2 rule 3 / §17.1: one tenant holds at most share*B lanes while others wait; the cap lifts otherwise."""
    ds = _ds(bprofile(4), max_tenant_lane_share=0.5)
    for i in range(6):
        ds.push(_seq(f"a{i}", tenant="a", deadline=1.0 + i), 0.0)
    ds.push(_seq("b0", tenant="b", deadline=50.0), 0.0)
    sel = ds.take(bprofile(4), 0.0, G)
    assert [s.request_id for s in sel.selected] == ["a0", "a1", "b0", "a2"]  # a capped at 2, then cap lifted
    sel2 = ds.take(bprofile(4), 0.0, G)
    assert [s.request_id for s in sel2.selected] == ["a3", "a4", "a5"]  # only a left: partial batch, no cap


def test_tenant_cap_keeps_room_for_two_tenants() -> None:
    """000 §7.2 rule 3: with two busy tenants a B4 batch is split 2/2 even if one has all earlier deadlines."""
    ds = _ds(bprofile(4), max_tenant_lane_share=0.5)
    for i in range(4):
        ds.push(_seq(f"a{i}", tenant="a", deadline=1.0 + i), 0.0)
        ds.push(_seq(f"b{i}", tenant="b", deadline=10.0 + i), 0.0)
    sel = ds.take(bprofile(4), 0.0, G)
    assert sorted(s.tenant for s in sel.selected) == ["a", "a", "b", "b"]


def test_batching_window_always_fires() -> None:
    """000 §7.2 rule 4 / §17.1: a partial batch waits at most batching_window, then fires (never starves)."""
    ds = _ds(bprofile(4), batching_window_s=0.002, step_estimate_s=0.001)
    ds.push(_seq("a"), 10.0)
    hold = ds.poll(10.0)
    assert hold.profile is None and hold.wake_at == pytest.approx(10.002)
    assert ds.poll(10.001).profile is None
    fire = ds.poll(10.002)
    assert fire.profile is not None and fire.profile.compiled_batch == 4  # partial B4 (rule 5)
    sel = ds.take(fire.profile, 10.002, G)
    assert len(sel.selected) == 1


def test_batching_window_never_holds_past_the_earliest_deadline() -> None:
    """000 §7.2 rule 4: waiting for fill must not make the earliest deadline miss."""
    ds = _ds(bprofile(4), batching_window_s=1.0, step_estimate_s=0.01)
    ds.push(_seq("urgent", deadline=0.05), 0.0)
    hold = ds.poll(0.0)
    assert hold.wake_at == pytest.approx(0.04)
    assert ds.poll(0.04).profile is not None


def test_full_batch_fires_without_waiting() -> None:
    """000 §7.2 rule 4: the window is only for filling; a full batch goes at once."""
    ds = _ds(bprofile(4), batching_window_s=1.0, max_tenant_lane_share=1.0)
    for i in range(4):
        ds.push(_seq(f"r{i}"), 0.0)
    assert ds.poll(0.0).profile is not None


def test_low_traffic_sends_partial_batches() -> None:
    """000 §7.2 rule 5: with no window, one ready request is sent alone rather than waiting for B16."""
    ds = _ds(bprofile(16))
    ds.push(_seq("only"), 0.0)
    poll = ds.poll(0.0)
    assert poll.profile is not None
    assert len(ds.take(poll.profile, 0.0, G).selected) == 1


@pytest.mark.parametrize(("ready", "expected"), [(1, 1), (2, 1), (3, 4), (5, 4), (6, 8), (11, 8), (12, 16), (40, 16)])
def test_profile_choice_from_ready_count(ready: int, expected: int) -> None:
    """000 §8: B16 at >=12 ready, B8 at >=6, B4 at >=3, else B1 (default thresholds)."""
    ds = _ds(B1, bprofile(4), bprofile(8), bprofile(16))
    assert ds.select_profile(ready).compiled_batch == expected


def test_profile_choice_only_among_declared_profiles() -> None:
    """000 §8: `profiles.has(8)` -- an undeclared profile is never chosen; configured thresholds apply."""
    ds = _ds(B1, bprofile(4), thresholds={4: 2})
    assert ds.select_profile(100).compiled_batch == 4
    assert ds.select_profile(2).compiled_batch == 4
    assert ds.select_profile(1).compiled_batch == 1


def test_missing_profile_fails_fast() -> None:
    """000 §17.1 / §15: a threshold (configuration) for a profile the package lacks fails at construction."""
    with pytest.raises(ProfileRefused, match="B8"):
        _ds(B1, thresholds={8: 6})
    with pytest.raises(ProfileRefused):
        DecodeScheduler([])


def test_b_gt_1_without_mask_contract_is_refused() -> None:
    """000 §7.3: a B>1 profile without an inactive-lane mask contract cannot become Ready."""
    with pytest.raises(ProfileRefused, match="no inactive-lane mask contract"):
        _ds(BatchProfile("g", 4, 4096))
    with pytest.raises(ProfileRefused, match="write KV"):
        _ds(BatchProfile("g", 4, 4096, InactiveLaneContract("mask", writes_kv=True)))


def test_inactive_lanes_are_never_padded_with_token_0_by_default() -> None:
    """000 §7.3: inactive lanes follow the contract (declared pad, or mirror lane 0), masked invalid."""
    lanes = ([RequestId("a"), RequestId("b")], [LaneId(3), LaneId(5)], [777, 888], [12, 40])
    batch = DecodeBatch.build(JobId(1), G, bprofile(4), *lanes)
    assert batch.token_ids == (777, 888, 777, 777) and 0 not in batch.token_ids
    assert batch.positions == (12, 40, 12, 12)
    assert batch.lane_valid == (True, True, False, False) and batch.fill_ratio == 0.5
    assert [(lane.index, lane.request_id, lane.kv_lane) for lane in batch.lanes] == [(0, "a", 3), (1, "b", 5)]
    declared = DecodeBatch.build(JobId(2), G, bprofile(4, pad_token_id=151643, pad_position=0), *lanes)
    assert declared.token_ids[2:] == (151643, 151643) and declared.positions[2:] == (0, 0)


def test_batch_rejects_a_position_past_max_seq() -> None:
    """000 §7.1 validate_generation_and_length / §7.4: a bad lane is refused before submit."""
    from calctl.serving.core import InvariantViolation

    with pytest.raises(InvariantViolation):
        DecodeBatch.build(JobId(1), G, BatchProfile("g", 1, 16), [RequestId("a")], [LaneId(0)], [1], [16])


def test_window_does_not_hold_a_deadline_before_any_step_is_known() -> None:
    """000 §7.2 rule 4 (issue 19): with no measured step and no configured floor the window cannot know how
    long the step takes, so it does not hold a request with a deadline (it used to hold until the deadline)."""
    ds = _ds(bprofile(4), batching_window_s=1.0)
    ds.push(_seq("urgent", deadline=0.05), 0.0)
    assert ds.step_estimate is None
    assert ds.poll(0.0).profile is not None


def test_window_reserves_the_slowest_measured_step_above_the_floor() -> None:
    """000 §7.2 rule 4: the measured decode step time (the slowest recent one) is reserved, never less
    than the configured floor."""
    ds = _ds(bprofile(4), batching_window_s=1.0, step_estimate_s=0.005)
    assert ds.step_estimate == pytest.approx(0.005)
    ds.observe_step(0.02)
    ds.observe_step(0.01)
    assert ds.measured_step_s == pytest.approx(0.02) and ds.step_estimate == pytest.approx(0.02)
    ds.push(_seq("urgent", deadline=0.05), 0.0)
    assert ds.poll(0.0).wake_at == pytest.approx(0.03)
    assert ds.poll(0.0300001).profile is not None
    floor = _ds(bprofile(4), batching_window_s=1.0, step_estimate_s=0.04)
    floor.observe_step(0.001)
    assert floor.step_estimate == pytest.approx(0.04)
