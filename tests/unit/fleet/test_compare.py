"""``report compare``: figures matched by name, the difference, and whether it exceeds the runs' own intervals
(calctl.fleet.compare)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from calctl.errors import UsageError
from calctl.fleet.compare import compare, figures

DIGEST = "cd" * 32


def _doc(overlap: tuple[float, float, float], decode: tuple[float, float, float], gbps: float, **extra: Any) -> dict:
    return {
        "command": "bringup",
        "verdict": "PASS",
        "device": "mock",
        "device_label": "mock",
        "package": {"digest": DIGEST},
        "step_reports": {
            "poc": {
                "overlap_ratio": {"mean": overlap[0], "ci_low": overlap[1], "ci_high": overlap[2], "n": 4},
                "decisions": {"overlap_ratio": {"mean": 9, "ci_low": 9, "ci_high": 9, "limit": 0.0}},
            },
            "warmup": {
                "models": [
                    {
                        "alias": "model-a",
                        "graphs": {"decode": {"count": 32, "p50": decode[0], "min": decode[1], "max": decode[2]}},
                        "host_graphs": {"decode": {"count": 32, "p50": 9.0, "min": 8.0, "max": 10.0}},
                    }
                ]
            },
        },
        "rows": [{"name": "h2d chip 1", "figure_gbps": gbps}, {"name": "host memcpy", "figure_gbps": gbps * 3}],
        **extra,
    }


def _write(tmp_path: Path, name: str, doc: dict) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "report.json").write_text(json.dumps(doc))
    return d


def test_figures_are_named_by_step_and_item_and_a_decision_is_not_a_second_figure() -> None:
    names = {f.name: f for f in figures(_doc((0.5, 0.49, 0.51), (3.1, 3.0, 3.2), 3.0))}
    assert set(names) == {
        "step_reports/poc/overlap_ratio",
        "step_reports/warmup/models/model-a/graphs/decode",
        "step_reports/warmup/models/model-a/host_graphs/decode",
        "rows/h2d chip 1/figure_gbps",
        "rows/host memcpy/figure_gbps",
    }
    assert names["step_reports/poc/overlap_ratio"].kind == "ci"
    assert names["step_reports/warmup/models/model-a/graphs/decode"].kind == "range"
    assert names["rows/host memcpy/figure_gbps"].clock == "host"


def test_the_same_figures_differ_within_their_intervals(tmp_path: Path) -> None:
    a = _write(tmp_path, "a", _doc((0.50, 0.49, 0.51), (3.10, 3.00, 3.20), 3.0))
    b = _write(tmp_path, "b", _doc((0.505, 0.495, 0.515), (3.15, 3.05, 3.25), 3.1))
    result = compare(a, b)
    assert result.exit_code == 0 and result.beyond == []
    judged = {r.name: r.judgement for r in result.rows}
    assert judged["step_reports/poc/overlap_ratio"] == "within"
    assert judged["rows/h2d chip 1/figure_gbps"] == "no interval"
    assert judged["step_reports/warmup/models/model-a/host_graphs/decode"].startswith("host clock")


def test_a_figure_whose_intervals_are_apart_is_named_and_exits_1(tmp_path: Path) -> None:
    a = _write(tmp_path, "a", _doc((0.50, 0.49, 0.51), (3.10, 3.00, 3.20), 3.0))
    b = _write(tmp_path, "b", _doc((0.50, 0.49, 0.51), (6.20, 6.00, 6.40), 1.5))
    result = compare(a, b)
    assert result.exit_code == 1
    assert [r.name for r in result.beyond] == ["step_reports/warmup/models/model-a/graphs/decode"]
    row = result.beyond[0]
    assert row.difference == pytest.approx(3.1) and row.relative == pytest.approx(1.0)
    assert result.document()["beyond_interval"] == ["step_reports/warmup/models/model-a/graphs/decode"]


def test_equal_degenerate_intervals_are_not_a_difference(tmp_path: Path) -> None:
    a = _write(tmp_path, "a", _doc((0.4976, 0.4976, 0.4976), (3.1, 3.1, 3.1), 3.0))
    b = _write(tmp_path, "b", _doc((0.4976 * (1 + 1e-12), 0.4976, 0.4976 * (1 + 1e-12)), (3.1, 3.1, 3.1), 3.0))
    assert compare(a, b).exit_code == 0


def test_different_packages_are_refused_unless_allowed(tmp_path: Path) -> None:
    a = _write(tmp_path, "a", _doc((0.5, 0.49, 0.51), (3.1, 3.0, 3.2), 3.0))
    other = _doc((0.5, 0.49, 0.51), (3.1, 3.0, 3.2), 3.0, package={"digest": "ee" * 32})
    b = _write(tmp_path, "b", other)
    with pytest.raises(UsageError, match="different packages") as err:
        compare(a, b)
    assert err.value.exit_code == 2
    result = compare(a, b, allow_different_package=True)
    assert result.exit_code == 0 and any("different packages" in n for n in result.notes)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [("not json", "not a JSON document"), ("[1, 2]", "not a calctl report"), ("[" * 200, "nested")],
)
def test_bad_input_is_a_usage_error_naming_the_file(tmp_path: Path, content: str, fragment: str) -> None:
    a = _write(tmp_path, "a", _doc((0.5, 0.49, 0.51), (3.1, 3.0, 3.2), 3.0))
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(UsageError, match=fragment):
        compare(a, bad)
    with pytest.raises(UsageError, match=r"without report\.json"):
        compare(a, tmp_path)
