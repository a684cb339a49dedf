"""The supervisor's bounded logs (lifecycle history, recovery records): newest kept, by count and by bytes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from calctl.serving.engine.bounded_log import BoundedLog, estimated_bytes
from calctl.serving.engine.options import LifecycleEvent


@dataclass(frozen=True)
class _Entry:
    n: int
    text: str = ""


def test_the_newest_entries_stay_within_the_count_and_positions_stay_absolute() -> None:
    log: BoundedLog[_Entry] = BoundedLog(max_entries=5, max_bytes=10**9)
    for n in range(12):
        log.append(_Entry(n))
    assert len(log) == 12 and log.kept == 5
    assert [e.n for e in log] == [7, 8, 9, 10, 11]
    assert log[-1].n == 11 and log[7].n == 7
    assert [e.n for e in log[10:]] == [10, 11]  # what was appended since len() was 10
    assert [e.n for e in log[0:]] == [7, 8, 9, 10, 11]  # the forgotten oldest left out
    assert [e.n for e in log[-2:]] == [10, 11] and log[12:] == []
    with pytest.raises(IndexError, match="not kept"):
        log[3]


def test_the_bytes_bound_holds_and_the_newest_entry_always_stays() -> None:
    one = estimated_bytes(_Entry(0, "x" * 1000))
    log: BoundedLog[_Entry] = BoundedLog(max_entries=10**6, max_bytes=3 * one)
    for n in range(50):
        log.append(_Entry(n, "x" * 1000))
    assert log.kept == 3 and log.kept_bytes <= 3 * one
    log.append(_Entry(99, "y" * 100_000))  # bigger than the whole budget: kept alone
    assert [e.n for e in log] == [99]


def test_an_event_is_estimated_with_its_strings() -> None:
    small = estimated_bytes(LifecycleEvent(0.0, "model-a", "Ready"))
    big = estimated_bytes(LifecycleEvent(0.0, "model-a", "Failed", "x" * 10_000))
    assert 100 < small < 1000 and big - small >= 10_000


def test_a_log_without_room_is_refused() -> None:
    with pytest.raises(ValueError, match="needs room"):
        BoundedLog(0, 100)
