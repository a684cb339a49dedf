"""``calctl device selftest``: a chips-at-once row measures again while the host did not issue the transfers together.

The both-chips figure is the link under every chip at once, so it needs their transfers overlapping. On a loaded
host one chip's thread can run all its transfers before the other's gets a core: no figure, and the row was NOT
JUDGED on a healthy board (twice in a README suite run beside 8 CPU burners). The row measures the largest size
again, up to ``OVERLAP_TRIES`` times, and is NOT JUDGED only when no try overlapped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from calctl.runners import selftest
from calctl.runners.device import DeviceSpec

PROFILE = (
    "schema: calculet-board-profile/v1\nboard: mock\ntransfer:\n  h2d_gbps_min: 0.01\n  d2h_gbps_min: 0.01\n"
    "  both_h2d_gbps_min: 0.01\n  both_d2h_gbps_min: 0.01\n  d2h_cv_max: 0.5\n"
)


def _host_that_serialises(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[int]:
    """The first ``failures`` chips-at-once measurements of the largest size come back as if the host ran the
    chips one after the other (no figure, 40 % of the time together), every later one as if it issued them together
    (what this host really did is not the question: a loaded one misses some tries of its own); returns the count
    of such measurements."""
    real = selftest._measure
    calls = [0]

    def measure(rt: Any, chips: tuple[int, ...], direction: Any, data: Any, repeats: int) -> Any:
        got = real(rt, chips, direction, data, repeats)
        if len(chips) > 1 and data.size == selftest.SIZES[-1]:
            calls[0] += 1
            if calls[0] <= failures:
                return selftest.Measured(got.bytes, None, got.host_gbps, got.data_ok, 0.4, ())
            if got.device_gbps is None:  # this host missed on its own: the try overlapped, as planned
                return selftest.Measured(got.bytes, got.host_gbps, got.host_gbps, got.data_ok, 1.0, got.rates)
        return got

    monkeypatch.setattr(selftest, "_measure", measure)
    return calls


def _rows(tmp_path: Path) -> dict[str, dict[str, Any]]:
    profile = tmp_path / "board.yaml"
    profile.write_text(PROFILE, encoding="utf-8")
    report = selftest.run_selftest(DeviceSpec(), profile=selftest.BoardProfile.load(profile))
    return {r["name"]: r for r in report.document()["rows"]}


def test_a_host_that_did_not_issue_the_chips_together_is_measured_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _host_that_serialises(monkeypatch, failures=3)  # the first three tries of "h2d both chips" miss
    rows = _rows(tmp_path)
    for name in ("h2d both chips", "d2h both chips"):
        assert rows[name]["status"] == "PASS" and rows[name]["figure_gbps"] is not None, rows[name]
    assert calls[0] == 4 + 1  # h2d: three misses, then its figure; d2h: at once


def test_no_try_overlapping_is_not_judged_saying_how_often_it_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _host_that_serialises(monkeypatch, failures=10**6)
    rows = _rows(tmp_path)
    both = rows["d2h both chips"]
    assert both["status"] == "NOT JUDGED" and both["figure_gbps"] is None, both
    assert (
        f"in each of {selftest.OVERLAP_TRIES} tries" in both["detail"]
        and "its doing, not the board's" in both["detail"]
    )
    assert rows["d2h chip 0"]["status"] == "PASS"  # one chip at a time needs no overlap
