"""Interval arithmetic over trace spans: ``(start, end)`` pairs of one clock (docs/runtime.md "Job timestamps").

One implementation of what the conformance checks (two jobs in flight together) and the runners (both chips
busy, the S2 joint share) compute from a runtime's trace: the union of a chip's spans, where two unions
overlap, and for how long. Pure functions of their arguments; nothing here reads a trace or a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

T = TypeVar("T", int, float)


def union(spans: Iterable[tuple[T, T]]) -> list[tuple[T, T]]:
    """``spans`` merged into sorted, disjoint intervals (touching ones join)."""
    out: list[tuple[T, T]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def intersections(a: Sequence[tuple[T, T]], b: Sequence[tuple[T, T]]) -> list[tuple[T, T]]:
    """Where two unions (sorted, disjoint: :func:`union`) both hold, as sorted intervals of positive length."""
    both: list[tuple[T, T]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            both.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return both


def overlap(a: Iterable[tuple[T, T]], b: Iterable[tuple[T, T]]) -> T:
    """Total time during which some span of ``a`` and some span of ``b`` both hold."""
    total: T = 0
    for s, e in intersections(union(a), union(b)):
        total += e - s
    return total
