"""The ping/pong banks share nothing (000 §14: own InputBuf/OutputBuf/backing storage and KV transaction)."""

from __future__ import annotations

import numpy as np
import pytest

from calctl.runtime.buffers import BufferLayout, Direction, HostBuffer, TensorSlot
from calctl.runtime.types import Engine, KvSeqId
from calctl.serving.core.ids import JobId, RequestId
from calctl.serving.engine.modes import BankSlots, SlotConflict

_ids = iter(range(1, 10_000))


def buf(direction: Direction = Direction.INPUT, storage: np.ndarray | None = None) -> HostBuffer:
    layout = BufferLayout("g", direction, 1, (TensorSlot("x", "float32", (1, 4), 0, 16),), 16)
    return HostBuffer(next(_ids), layout, storage if storage is not None else np.zeros(16, np.uint8))


def pair() -> tuple[HostBuffer, HostBuffer]:
    return buf(Direction.INPUT), buf(Direction.OUTPUT)


def claim(
    slots: BankSlots,
    job: int,
    *,
    io: tuple[HostBuffer, HostBuffer] | None = None,
    seqs: tuple[int, ...] = (),
    rids: tuple[str, ...] = (),
) -> Engine | None:
    i, o = io or pair()
    return slots.claim(JobId(job), i, o, tuple(KvSeqId(s) for s in seqs), tuple(RequestId(r) for r in rids))


def test_banks_alternate_and_hold_one_job_each() -> None:
    s = BankSlots()
    assert claim(s, 1, seqs=(1,), rids=("a",)) is Engine.PING
    assert claim(s, 2, seqs=(2,), rids=("b",)) is Engine.PONG
    assert claim(s, 3, seqs=(3,), rids=("c",)) is None  # both banks busy
    assert s.release(JobId(1)) is Engine.PING
    assert claim(s, 3, seqs=(3,), rids=("c",)) is Engine.PING
    assert s.holders() == {"ping": 3, "pong": 2}
    s.release(JobId(2))
    s.release(JobId(3))
    assert claim(s, 4) is Engine.PONG  # alternates even when both are free
    assert claim(s, 5) is Engine.PING


def test_shared_buffer_storage_is_refused() -> None:
    s = BankSlots()
    backing = np.zeros(64, np.uint8)
    first = (buf(Direction.INPUT, backing[:16]), buf(Direction.OUTPUT, backing[16:32]))
    claim(s, 1, io=first)
    overlapping = (
        buf(Direction.INPUT, backing[24:40]),
        buf(Direction.OUTPUT, backing[48:64]),
    )  # overlaps first's outputs
    with pytest.raises(SlotConflict, match="buffer storage"):
        claim(s, 2, io=overlapping)
    with pytest.raises(SlotConflict, match="buffer storage"):
        claim(s, 2, io=(first[0], buf(Direction.OUTPUT)))  # the very same input buffer
    assert claim(s, 2, io=(buf(Direction.INPUT, backing[32:48]), buf(Direction.OUTPUT, backing[48:64]))) is Engine.PONG


def test_inputs_and_outputs_of_one_job_may_not_share_storage() -> None:
    backing = np.zeros(32, np.uint8)
    with pytest.raises(SlotConflict, match="input and output"):
        claim(BankSlots(), 1, io=(buf(Direction.INPUT, backing[:16]), buf(Direction.OUTPUT, backing[8:24])))


def test_shared_kv_sequence_or_request_is_refused() -> None:
    s = BankSlots()
    claim(s, 1, seqs=(7,), rids=("a",))
    with pytest.raises(SlotConflict, match=r"KV sequence\(s\) \[7\]"):
        claim(s, 2, seqs=(7,), rids=("b",))
    with pytest.raises(SlotConflict, match="request"):
        claim(s, 2, seqs=(8,), rids=("a",))
    assert s.holders() == {"ping": 1, "pong": None}  # a refused claim leaves nothing behind


def test_completion_checks_bank_identity_and_lane_results() -> None:
    s = BankSlots()
    claim(s, 1, seqs=(1,), rids=("a",))
    claim(s, 2, seqs=(2,), rids=("b",))
    assert s.check_completion(JobId(1), Engine.PING, (RequestId("a"),)) is None
    assert "holds job 2" in (s.check_completion(JobId(1), Engine.PONG, (RequestId("a"),)) or "")
    assert "not in the job" in (s.check_completion(JobId(1), Engine.PING, (RequestId("b"),)) or "")
    s.release(JobId(1))
    assert "holds nothing" in (s.check_completion(JobId(1), Engine.PING, ()) or "")
