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

from calctl.runners.acceptance.rows import RowResult, Verdict
from calctl.runners.bench.plot import _device_label, _pyplot, _save

COLOURS = {Verdict.GO: "#2e7d32", Verdict.NO_GO: "#c62828", Verdict.NOT_MEASURED: "#9e9e9e"}


def plot_rows(path: Path, rows: Sequence[RowResult], *, title: str, device: str) -> Path:
    plt = _pyplot()
    gates = [r for r in rows if r.id.startswith("G")]
    milestones = [r for r in rows if r.id.startswith("M")]
    cols = max(len(gates), len(milestones), 1)
    fig, ax = plt.subplots(figsize=(2.6 * cols, 5.4))
    ax.set_xlim(0, cols)
    ax.set_ylim(0, 2)
    ax.axis("off")
    for line, group in ((1, gates), (0, milestones)):
        for i, r in enumerate(group):
            ax.add_patch(
                plt.Rectangle((i + 0.04, line + 0.05), 0.92, 0.9, color=COLOURS[r.verdict], alpha=0.9, linewidth=0)
            )
            ax.text(i + 0.5, line + 0.82, r.id, ha="center", va="center", fontsize=15, color="white", weight="bold")
            ax.text(i + 0.5, line + 0.68, r.title, ha="center", va="center", fontsize=8.5, color="white")
            ax.text(
                i + 0.5,
                line + 0.54,
                r.verdict.value,
                ha="center",
                va="center",
                fontsize=11,
                color="white",
                weight="bold",
            )
            figure = "\n".join(textwrap.wrap(r.key_figure, 30)[:4])
            ax.text(i + 0.5, line + 0.28, figure, ha="center", va="center", fontsize=6.5, color="white")
    counts = {v: sum(1 for r in rows if r.verdict is v) for v in Verdict}
    legend = ", ".join(f"{v.value} {n}" for v, n in counts.items())
    fig.suptitle(f"{title}\n{legend}; {_device_label(device)}", fontsize=10)
    _save(fig, path)
    return path


__all__ = ["plot_rows"]
