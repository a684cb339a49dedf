"""Interval arithmetic over trace spans (calctl/runtime/intervals.py): one implementation for conformance and runners."""

from __future__ import annotations

from calctl.runtime.intervals import intersections, overlap, union


def test_union_sorts_and_merges_overlapping_and_touching_spans() -> None:
    assert union([(5, 7), (0, 2), (1, 3), (3, 4), (9, 9)]) == [(0, 4), (5, 7), (9, 9)]
    assert union([]) == []


def test_intersections_of_two_unions_keep_only_positive_lengths() -> None:
    a = union([(0.0, 2.0), (4.0, 6.0)])
    b = union([(1.0, 5.0), (6.0, 8.0)])  # touches a at 6.0: no overlap there
    assert intersections(a, b) == [(1.0, 2.0), (4.0, 5.0)]


def test_overlap_counts_time_both_sides_hold_once_even_when_a_side_overlaps_itself() -> None:
    # a's two spans overlap each other on 2..3: that time counts once
    assert overlap([(0, 3), (2, 5)], [(1, 4)]) == 3
    assert overlap([(0, 1)], [(1, 2)]) == 0
    assert isinstance(overlap([(0, 10)], [(5, 20)]), int)  # device ns stay integers
    assert overlap([(0.0, 1.5)], [(0.5, 3.0)]) == 1.0
