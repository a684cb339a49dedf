"""KvLaneManager: 000 §9 states, transactions and every §9.2 invariant."""

from __future__ import annotations

import pytest

from calctl.serving.core import (
    InvariantViolation,
    JobId,
    KvCapacity,
    KvLaneManager,
    KvState,
    LaneId,
    ModelGenerationId,
    RequestId,
)

G = ModelGenerationId(1)
R = RequestId


def _kv(seqs: int = 2, tokens: int = 100, max_seq: int = 64, **kw) -> KvLaneManager:
    return KvLaneManager(KvCapacity(seqs, tokens, max_seq, **kw))


def _lanes(kv: KvLaneManager, n: int, tokens: int) -> list[LaneId]:
    """Reserve ``n`` lanes (owners r0, r1, ...) that must fit."""
    lanes = [kv.reserve(R(f"r{i}"), G, tokens) for i in range(n)]
    assert None not in lanes, lanes
    return [lane for lane in lanes if lane is not None]


def test_reserve_returns_none_when_there_is_no_room() -> None:
    """vLLM-v1 style: "no room" is None, not an exception (lanes and tokens both count)."""
    kv = _kv(seqs=2, tokens=100)
    assert kv.reserve(R("a"), G, 60) == 0
    assert kv.reserve(R("b"), G, 50) is None  # tokens
    assert kv.reserve(R("b"), G, 40) == 1
    assert kv.reserve(R("c"), G, 1) is None  # lanes
    kv.check_invariants()


def test_reserve_update_commit_rollback_cycle() -> None:
    """000 §9.1/§9.2 rule 5: Reserved -> Updating (submit) -> Active only on commit; rollback restores."""
    kv = _kv()
    lane = kv.reserve(R("a"), G, 20)
    assert lane is not None and kv.state(lane) is KvState.RESERVED
    kv.begin_update(lane, JobId(1), 0, 10)
    assert kv.state(lane) is KvState.UPDATING and kv.committed_len(lane) == 0
    kv.rollback(lane, JobId(1))
    assert kv.state(lane) is KvState.RESERVED and kv.committed_len(lane) == 0
    kv.begin_update(lane, JobId(2), 0, 10)
    assert kv.commit(lane, JobId(2)) == 10 and kv.state(lane) is KvState.ACTIVE
    kv.begin_update(lane, JobId(3), 10, 1)
    kv.rollback(lane, JobId(3))
    assert kv.state(lane) is KvState.ACTIVE and kv.committed_len(lane) == 10
    kv.check_invariants()


def test_position_must_equal_committed_length() -> None:
    """000 §9.2 rule 4: a batch position different from the committed length is refused before submit."""
    kv = _kv()
    lane = kv.reserve(R("a"), G, 20)
    assert lane is not None
    kv.begin_update(lane, JobId(1), 0, 5)
    kv.commit(lane, JobId(1))
    with pytest.raises(InvariantViolation, match="position 4 != committed length 5"):
        kv.begin_update(lane, JobId(2), 4, 1)


def test_writes_cannot_overrun_the_reservation_or_max_seq() -> None:
    """000 §9.2 rule 3: committed <= reserved <= max_seq."""
    kv = _kv(max_seq=64)
    with pytest.raises(InvariantViolation):
        kv.reserve(R("a"), G, 65)
    lane = kv.reserve(R("a"), G, 3)
    assert lane is not None
    with pytest.raises(InvariantViolation):
        kv.begin_update(lane, JobId(1), 0, 4)


def test_commit_needs_the_submitting_job() -> None:
    """000 §9.2 rule 5: only the job that made the lane Updating can commit or roll it back."""
    kv = _kv()
    lane = kv.reserve(R("a"), G, 10)
    assert lane is not None
    with pytest.raises(InvariantViolation):
        kv.commit(lane, JobId(1))  # never submitted
    kv.begin_update(lane, JobId(1), 0, 2)
    with pytest.raises(InvariantViolation):
        kv.commit(lane, JobId(2))


def test_one_lane_per_sequence_per_generation() -> None:
    """000 §9.2 rule 1: the same seq cannot hold two lanes in one generation."""
    kv = _kv()
    kv.reserve(R("a"), G, 10)
    with pytest.raises(InvariantViolation):
        kv.reserve(R("a"), G, 10)
    assert kv.reserve(R("a"), ModelGenerationId(2), 10) == 1  # another generation is another sequence


def test_release_needs_runtime_confirmation_before_reuse() -> None:
    """000 §9.2 rule 2: a lane is reused only after it is Free and the runtime confirmed the release."""
    kv = _kv(seqs=1)
    lane = kv.reserve(R("a"), G, 10)
    assert lane is not None
    assert kv.release(lane) is KvState.RELEASING
    assert kv.reserve(R("b"), G, 10) is None  # still Releasing
    kv.confirm_released(lane)
    assert kv.reserve(R("b"), G, 10) == lane
    kv.check_invariants()


def test_release_while_updating_is_a_bug() -> None:
    """000 §4 / 001 §9.1: a lane the device may still write is never released."""
    kv = _kv()
    lane = kv.reserve(R("a"), G, 10)
    assert lane is not None
    kv.begin_update(lane, JobId(1), 0, 2)
    with pytest.raises(InvariantViolation):
        kv.release(lane)


def test_unknown_lane_is_never_reused_until_recovered() -> None:
    """000 §9.2 rule 6: after a timeout/CCU fault the lane is Unknown and not handed out; recover() frees it."""
    kv = _kv(seqs=1)
    lane = kv.reserve(R("a"), G, 10)
    assert lane is not None
    kv.begin_update(lane, JobId(1), 0, 5)
    kv.mark_unknown(lane)
    assert kv.state(lane) is KvState.UNKNOWN
    assert kv.release(lane) is KvState.UNKNOWN  # the owner finishing does not free it
    assert kv.reserve(R("b"), G, 10) is None
    kv.check_invariants()
    with pytest.raises(InvariantViolation):
        kv.confirm_released(lane)
    kv.recover(lane)
    assert kv.reserve(R("b"), G, 10) == lane
    kv.check_invariants()


def test_batch_update_is_all_or_nothing() -> None:
    """000 §7.1 reserve_batch: one bad lane leaves every lane of the batch untouched."""
    kv = _kv(seqs=3)
    lanes = _lanes(kv, 3, 10)
    for i, lane in enumerate(lanes):
        kv.begin_update(lane, JobId(i + 1), 0, 2)
        kv.commit(lane, JobId(i + 1))
    with pytest.raises(InvariantViolation):
        kv.begin_batch(JobId(9), [(lanes[0], 2, 1), (lanes[1], 2, 1), (lanes[2], 7, 1)])
    assert all(kv.state(lane) is KvState.ACTIVE for lane in lanes)
    kv.begin_batch(JobId(9), [(lane, 2, 1) for lane in lanes])
    assert all(kv.state(lane) is KvState.UPDATING for lane in lanes)
    kv.check_invariants()


def test_remove_tail_only_when_enabled() -> None:
    """000 §9.3: RemoveTokensAtEnd is disabled until its boundary tests pass."""
    kv = _kv()
    lane = kv.reserve(R("a"), G, 10)
    assert lane is not None
    kv.begin_update(lane, JobId(1), 0, 4)
    kv.commit(lane, JobId(1))
    with pytest.raises(InvariantViolation, match="disabled"):
        kv.remove_tail(lane, 1)
    kv2 = _kv(remove_tail=True)
    lane2 = kv2.reserve(R("a"), G, 10)
    assert lane2 is not None
    kv2.begin_update(lane2, JobId(1), 0, 4)
    kv2.commit(lane2, JobId(1))
    assert kv2.remove_tail(lane2, 3) == 1
    assert kv2.remove_tail(lane2, 1) == 0 and kv2.state(lane2) is KvState.RESERVED
    kv2.check_invariants()


def test_check_invariants_detects_corruption() -> None:
    """check_invariants() names a broken accounting identity (guards the guards)."""
    kv = _kv()
    kv.reserve(R("a"), G, 10)
    kv._reserved_tokens += 1  # simulate a bookkeeping bug
    with pytest.raises(InvariantViolation, match="reserved token counter"):
        kv.check_invariants()


def test_capacity_is_validated() -> None:
    with pytest.raises(ValueError):
        KvCapacity(0, 10, 10)


def test_decode_batch_update_is_all_or_nothing_and_returns_positions() -> None:
    """000 §7.1 / §9.2 rule 4: one-token updates at each lane's committed length, or nothing at all."""
    kv = _kv(seqs=3)
    lanes = _lanes(kv, 3, 4)
    for i, lane in enumerate(lanes):
        kv.begin_update(lane, JobId(i + 1), 0, 2 + i)
        kv.commit(lane, JobId(i + 1))
    with pytest.raises(InvariantViolation, match="overruns"):
        kv.begin_decode_batch(JobId(9), lanes)  # lane 2 is full (4 of 4)
    assert [kv.state(lane) for lane in lanes] == [KvState.ACTIVE] * 3
    with pytest.raises(InvariantViolation, match="twice"):
        kv.begin_decode_batch(JobId(10), [lanes[0], lanes[0]])
    assert kv.begin_decode_batch(JobId(9), lanes[:2]) == [2, 3]
    kv.check_invariants()
