"""The pictures carry what their verdict rests on, tested through what was drawn (artists, texts, counts), not
pixels (issue 31 item 2): soak.png shows every request (failed and refused too) and a failed soak's error;
accept.png's tiles are readable and their text stays inside the tile; the fault-isolation strip has a count
scale; bench's ``n=`` labels never overlap."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from calctl.runners.acceptance import plot as accept_plot
from calctl.runners.acceptance.rows import GateDecision, RowResult
from calctl.runners.bench import plot as bench_plot
from calctl.runners.soak.evidence import Series, soak_figure


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The figures the bench and accept plotters would save, kept open (drawn) instead of written."""
    figures: list[Any] = []

    def keep(fig: Any, path: Path, *, layout: bool = True) -> None:
        if layout:
            fig.tight_layout()
        fig.canvas.draw()
        figures.append(fig)

    monkeypatch.setattr(bench_plot, "save", keep)
    monkeypatch.setattr(accept_plot, "_save", keep)
    yield figures
    import matplotlib.pyplot as plt

    for fig in figures:
        plt.close(fig)


def _texts(fig: Any) -> list[str]:
    return [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_fontsize"))]


def _series(points: list[tuple[float, float]]) -> Series:
    s = Series()
    for t, v in points:
        s.add(t, v)
    return s


# ---------------------------------------------------------------------------
# soak.png


def _soak(**extra: Any) -> Any:
    memory = {0: _series([(0.0, 100 << 20), (1.0, 140 << 20), (2.0, 100 << 20)])}
    return soak_figure(
        memory=memory,
        baseline={0: 100 << 20},
        limits={0: 64 << 20},
        latency={"model-a": _series([(0.5, 0.02), (0.7, 0.03)])},
        cycles=[(0.2, 1.5)],
        title="calctl soak: 1 complete load/unload cycle(s)",
        device="mock",
        **extra,
    )


def test_soak_picture_draws_refused_and_failed_requests_with_their_counts() -> None:
    import matplotlib.pyplot as plt

    ended = {
        "unavailable": _series([(1.6, 0.001), (1.7, 0.001), (1.8, 0.002)]),
        "device_error": _series([(0.9, 0.05)]),
        "deadline": _series([(0.6, 0.1)]),
    }
    counts = {"ok": 2, "unavailable": 189, "device_error": 1, "deadline": 1}
    fig = _soak(ended=ended, counts=counts, sent=193)
    try:
        ax_lat = fig.axes[-1]
        labels = ax_lat.get_legend_handles_labels()[1]
        assert "refused: unavailable 189" in labels  # the exact count, not the drawn points
        assert "failed: device_error 1" in labels
        assert "ended as the mix intends: deadline 1" in labels
        drawn = {c.get_label(): len(c.get_offsets()) for c in ax_lat.collections if c.get_label() in labels}
        assert drawn["refused: unavailable 189"] == 3 and drawn["failed: device_error 1"] == 1
        assert sum(drawn.values()) == 2 + 3 + 1 + 1  # every recorded request is a point
        assert ax_lat.get_title(loc="left").startswith("requests: 193 sent: 2 succeeded")
    finally:
        plt.close(fig)


def test_a_failed_soak_draws_its_error_not_empty_axes() -> None:
    import matplotlib.pyplot as plt

    error = "RuntimeLayerError: chip 1 did not answer ConfigureCalbin within 5 s"
    fig = soak_figure(
        memory={},
        baseline={},
        limits={},
        latency={},
        cycles=[],
        title="calctl soak: 0 complete load/unload cycle(s) of 3 planned",
        device="mock",
        counts={},
        sent=0,
        error=error,
    )
    try:
        texts = " ".join(" ".join(t.split()) for t in _texts(fig))
        assert "no request ended:" in texts and "no memory sample:" in texts
        assert texts.count("chip 1 did not answer ConfigureCalbin within 5 s") >= 3  # title and both panels
        assert "ERROR: RuntimeLayerError" in fig.axes[0].get_title()
    finally:
        plt.close(fig)


def test_a_clean_soak_has_no_error_text() -> None:
    import matplotlib.pyplot as plt

    fig = _soak(ended={}, counts={"ok": 2}, sent=2)
    try:
        assert not any("ERROR" in t or "no request ended" in t for t in _texts(fig))
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------
# accept.png


def _row(rid: str, verdict: GateDecision, figure: str) -> RowResult:
    return RowResult(rid, f"{rid} per-chip correctness", "c", "s", verdict, figure)


def test_accept_tiles_are_readable_and_their_text_stays_inside(drawn: list[Any], tmp_path: Path) -> None:
    long = "soak 0.00/24 h, 3 cycles, requests 301 sent: 85 succeeded, 27 ended as the mix intends, 189 refused " * 2
    rows = [_row(f"G{i}", GateDecision.GO, "chip 0 0.172 GiB, chip 1 0.172 GiB (limit 12.800 GiB)") for i in range(6)]
    rows += [_row(f"M{i}", GateDecision.NOT_MEASURED, long) for i in range(5)]
    accept_plot.plot_rows(tmp_path / "accept.png", rows, title="calctl accept (quick)", device="mock")
    (fig,) = drawn
    ax = fig.axes[0]
    tiles = [p.get_window_extent() for p in ax.patches]
    assert len(tiles) == 11
    texts = [t for t in ax.texts if t.get_text()]
    assert min(t.get_fontsize() for t in texts) >= 10  # the key figure was 6.5 pt
    renderer = fig.canvas.get_renderer()
    for t in texts:
        box = t.get_window_extent(renderer)
        assert any(
            tile.x0 <= box.x0 and box.x1 <= tile.x1 and tile.y0 <= box.y0 and box.y1 <= tile.y1 for tile in tiles
        ), t.get_text()
    figures = [t.get_text() for t in texts if "requests" in t.get_text()]
    assert figures and all(f.endswith("…") for f in figures)  # cut with an ellipsis, never silently


# ---------------------------------------------------------------------------
# bench pictures


def test_fault_isolation_strip_counts_failures_on_a_scale(drawn: list[Any], tmp_path: Path) -> None:
    points = [(t / 10, 0.05, True) for t in range(100)] + [(5.0 + t / 100, None, False) for t in range(40)]
    bench_plot.plot_timeline(
        tmp_path / "bench.png",
        points=points,
        phases=[("baseline", 0.0, 4.0), ("drain-deadline", 4.0, 10.0)],
        gate_s=0.06,
        title="calctl bench fault-isolation",
        device="mock",
    )
    (fig,) = drawn
    strip = fig.axes[1]
    (hist,) = strip.containers  # the histogram's bars (the phase shading is patches too, not a container)
    bars = [p for p in hist if p.get_height() > 0]
    assert sum(p.get_height() for p in bars) == 40  # every failed/refused request counted once
    assert max(p.get_height() for p in bars) > 1  # a count per bin, not one tick per request
    ticks = [label.get_text() for label in strip.get_yticklabels() if label.get_text()]
    assert len(ticks) >= 2  # a scale
    assert "40 in all" in strip.get_ylabel() and "per 0.2 s" in strip.get_ylabel()


def test_fault_isolation_strip_says_when_nothing_failed(drawn: list[Any], tmp_path: Path) -> None:
    bench_plot.plot_timeline(
        tmp_path / "bench.png",
        points=[(0.1, 0.05, True)],
        phases=[("baseline", 0.0, 1.0)],
        gate_s=None,
        title="t",
        device="mock",
    )
    assert "none failed or refused" in [t.get_text() for t in drawn[0].axes[1].texts]


def test_bench_sample_counts_never_overlap_on_small_bars(drawn: list[Any], tmp_path: Path) -> None:
    bars = [
        bench_plot.BarGroup("model-a TTFT", 0.0010, 0.0011, 12345, 23456, "PASS", "model-a"),
        bench_plot.BarGroup("model-a TPOT", 0.0009, 0.0010, 99999, 88888, "PASS", "model-a"),
        bench_plot.BarGroup("model-b TTFT", 0.2000, 0.2100, 1000, 1001, "FAIL", "model-b"),
        bench_plot.BarGroup("model-b TPOT", 0.0012, 0.0009, 100000, 100001, "NOT JUDGED", "model-b"),
    ]
    bench_plot.plot_ab(tmp_path / "bench.png", rates=None, window_s=None, bars=bars, title="ab", device="mock")
    (fig,) = drawn
    ax = fig.axes[1]
    renderer = fig.canvas.get_renderer()
    labels = [t for t in ax.texts if t.get_text().startswith("n=")]
    assert len(labels) == 8
    boxes = [t.get_window_extent(renderer) for t in labels]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), [t.get_text() for t in labels]
    top = ax.get_window_extent(renderer).y1
    assert all(b.y1 <= top for b in boxes)  # inside the axes: clear of the verdict above the pair


def test_interference_panels_sample_counts_never_overlap(drawn: list[Any], tmp_path: Path) -> None:
    """Four narrow panels of three pairs each: horizontal counts of neighbouring bars overlapped there."""
    groups = [
        bench_plot.BarGroup("model-a TTFT", 0.0010, 0.0011, 12345, 23456, "PASS", "model-a"),
        bench_plot.BarGroup("model-a TPOT", 0.0009, 0.0010, 99999, 88888, "PASS", "model-a"),
        bench_plot.BarGroup("model-b TTFT", 0.2000, 0.2100, 1000, 1001, "FAIL", "model-b"),
    ]
    pairs = [(f"prefill A + decode B #{k}", groups) for k in range(4)]
    bench_plot.plot_pairs(tmp_path / "bench.png", pairs, title="interference", device="mock")
    (fig,) = drawn
    renderer = fig.canvas.get_renderer()
    panels = [ax for ax in fig.axes if any(t.get_text().startswith("n=") for t in ax.texts)]
    assert len(panels) == 4
    for ax in panels:
        boxes = [t.get_window_extent(renderer) for t in ax.texts if t.get_text().startswith("n=")]
        assert len(boxes) == 6
        assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
