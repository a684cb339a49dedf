"""The serving core's invariants are tables of small named checks, each citing the 000 section it comes from,
and each rule fires on the corruption it names (guards the guards; docs/serving-core.md "KV lanes")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from calctl.serving.core import invariants, kv
from calctl.serving.core.errors import InvariantViolation
from calctl.serving.core.ids import JobId, ModelGenerationId, RequestId
from calctl.serving.core.kv import KvCapacity, KvLaneManager, KvState

TABLES: dict[str, tuple[Callable[..., object], ...]] = {
    "kv free lanes": kv._FREE_LANE_RULES,
    "kv held lanes": kv._HELD_LANE_RULES,
    "kv ledger": kv._LEDGER_RULES,
    "scheduler waiting": invariants._WAITING_RULES,
    "scheduler admitted": invariants._ADMITTED_RULES,
    "scheduler counts": invariants._COUNT_RULES,
}
G = ModelGenerationId(1)


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_rule_is_a_small_named_check_citing_000(table: str) -> None:
    rules = TABLES[table]
    assert rules, table
    for rule in rules:
        doc = rule.__doc__ or ""
        assert doc.startswith("000 §"), f"{rule.__name__}: cite the 000 section first, got {doc!r}"
        assert len(rule.__code__.co_code) < 400, f"{rule.__name__} is not a small check"


def _held() -> tuple[KvLaneManager, Any]:
    """A manager with lane 0 Active (4 of 10 tokens committed) and lane 1 Free."""
    m = KvLaneManager(KvCapacity(2, 100, 64))
    lane = m.reserve(RequestId("a"), G, 10)
    assert lane is not None
    m.begin_update(lane, JobId(1), 0, 4)
    m.commit(lane, JobId(1))
    m.check_invariants()
    return m, m._lanes[lane]


def _free_lane(m: KvLaneManager) -> Any:
    return next(ln for ln in m._lanes if ln.state is KvState.FREE)


def _write_outside_a_job(ln: Any) -> None:
    """An Active lane with tokens pending for a job: it should be Updating."""
    ln.job, ln.pending = JobId(3), 2


CORRUPTIONS: list[tuple[str, Callable[[KvLaneManager, Any], None]]] = [
    ("a lane is on the free list twice", lambda m, ln: m._free.append(m._free[0])),
    ("Free but not on the free list", lambda m, ln: m._free.clear()),
    ("Free lane still carries an owner or lengths", lambda m, ln: setattr(_free_lane(m), "reserved", 3)),
    ("Free lane still tagged with job 7", lambda m, ln: setattr(_free_lane(m), "job", JobId(7))),
    ("on the free list while held", lambda m, ln: m._free.append(ln.lane)),
    ("held lane without owner/generation", lambda m, ln: setattr(ln, "owner", None)),
    ("committed 11 <= reserved 10 <= max_seq 64 broken", lambda m, ln: setattr(ln, "committed", 11)),
    ("pending 7 would overrun the reservation", lambda m, ln: setattr(ln, "pending", 7)),
    ("job=3 pending=2 inconsistent with state", lambda m, ln: _write_outside_a_job(ln)),
    ("Reserved lane with 4 committed tokens", lambda m, ln: setattr(ln, "state", KvState.RESERVED)),
    ("Active lane with nothing committed", lambda m, ln: setattr(ln, "committed", 0)),
    ("owner index disagrees with the lanes", lambda m, ln: m._by_owner.clear()),
    ("reserved token counter 11 != sum over lanes 10", lambda m, ln: setattr(m, "_reserved_tokens", 11)),
]


@pytest.mark.parametrize(("message", "corrupt"), CORRUPTIONS, ids=[m for m, _ in CORRUPTIONS])
def test_each_kv_rule_names_its_corruption(message: str, corrupt: Callable[[KvLaneManager, Any], None]) -> None:
    m, ln = _held()
    corrupt(m, ln)
    with pytest.raises(InvariantViolation) as err:
        m.check_invariants()
    assert message in str(err.value)


def test_two_lanes_of_one_owner_in_one_generation_break_rule_1() -> None:
    m = KvLaneManager(KvCapacity(2, 100, 64))
    a, b = m.reserve(RequestId("a"), G, 10), m.reserve(RequestId("b"), G, 10)
    assert a is not None and b is not None
    m._lanes[b].owner = RequestId("a")
    with pytest.raises(InvariantViolation, match="a also holds lane 0 in one generation"):
        m.check_invariants()


def test_reservations_over_max_kv_tokens_break_the_ledger() -> None:
    m = KvLaneManager(KvCapacity(2, 30, 64))
    lane = m.reserve(RequestId("a"), G, 20)
    assert lane is not None
    m._lanes[lane].reserved = 40
    m._reserved_tokens = 40
    with pytest.raises(InvariantViolation, match="40 reserved tokens exceed max_kv_tokens 30"):
        m.check_invariants()
