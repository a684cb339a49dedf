"""The gates at a glance: one PNG, a grid of G0–G5 over M0–M4, each cell coloured by its verdict.

Each cell shows the row id, its title, the verdict and the key figure; the
figure's title names the package, the level and the device (a mock run is
labelled as such). Written atomically (:func:`calctl.records.atomic_output`).
This module draws what it is given and judges nothing.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

from calctl.runners.acceptance.rows import GateDecision, RowResult
from calctl.runners.plotting import device_label as _device_label
from calctl.runners.plotting import pyplot as _pyplot
from calctl.runners.plotting import save as _save

COLOURS = {GateDecision.GO: "#2e7d32", GateDecision.NO_GO: "#c62828", GateDecision.NOT_MEASURED: "#9e9e9e"}
#: Point sizes of a tile's texts (they were 15 / 8.5 / 11 / 6.5: the key figure could not be read).
TILE_FONTS = {"id": 18, "title": 11, "verdict": 13, "figure": 10}
#: A key figure's lines in a tile: characters per line and lines (the last line ends with "…" if cut).
FIGURE_WIDTH, FIGURE_LINES = 27, 5


def _figure_lines(text: str) -> list[str]:
    lines = textwrap.wrap(text, FIGURE_WIDTH, break_on_hyphens=False) or [""]
    if len(lines) > FIGURE_LINES:
        lines = [
            *lines[: FIGURE_LINES - 1],
            textwrap.shorten(" ".join(lines[FIGURE_LINES - 1 :]), FIGURE_WIDTH, placeholder=" …"),
        ]
    return lines


def plot_rows(path: Path, rows: Sequence[RowResult], *, title: str, device: str) -> Path:
    plt = _pyplot()
    gates = [r for r in rows if r.id.startswith("G")]
    milestones = [r for r in rows if r.id.startswith("M")]
    cols = max(len(gates), len(milestones), 1)
    # Tiles large enough to read when the picture is shown at a page's width: the id at 18 pt, the title,
    # verdict and key figure at 10-13 pt (the figure's lines wrapped to the tile).
    fig, ax = plt.subplots(figsize=(3.3 * cols, 8.4))
    ax.set_xlim(0, cols)
    ax.set_ylim(0, 2)
    ax.axis("off")
    for line, group in ((1, gates), (0, milestones)):
        for i, r in enumerate(group):
            ax.add_patch(
                plt.Rectangle((i + 0.03, line + 0.03), 0.94, 0.94, color=COLOURS[r.verdict], alpha=0.9, linewidth=0)
            )
            ax.text(
                i + 0.5,
                line + 0.87,
                r.id,
                ha="center",
                va="center",
                fontsize=TILE_FONTS["id"],
                color="white",
                weight="bold",
            )
            title_text = "\n".join(textwrap.wrap(r.title, 24)[:2])
            ax.text(
                i + 0.5, line + 0.73, title_text, ha="center", va="center", fontsize=TILE_FONTS["title"], color="white"
            )
            ax.text(
                i + 0.5,
                line + 0.59,
                r.verdict.value,
                ha="center",
                va="center",
                fontsize=TILE_FONTS["verdict"],
                color="white",
                weight="bold",
            )
            figure = "\n".join(_figure_lines(r.key_figure))
            ax.text(
                i + 0.5, line + 0.29, figure, ha="center", va="center", fontsize=TILE_FONTS["figure"], color="white"
            )
    counts = {v: sum(1 for r in rows if r.verdict is v) for v in GateDecision}
    legend = ", ".join(f"{v.value} {n}" for v, n in counts.items())
    fig.suptitle(f"{title}\n{legend}; {_device_label(device)}", fontsize=12)
    _save(fig, path)
    return path


__all__ = ["plot_rows"]
