"""The telemetry picture: per chip, temperature, power and clock over the run, with the limits as lines.

``calctl burn-in`` draws it (``burnin.png``); any run's :class:`~calctl.runners.telemetry.TelemetrySampler`
series can be drawn the same way. Fields the runtime did not report are left out of their panel and the panel
says so (never drawn as 0). The picture carries the device label (mock numbers are not a board's). This module
draws; it judges nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from calctl.runners.plotting import device_label, pyplot, save
from calctl.runtime.types import ChipTelemetry

PANELS = (
    ("temperature_c", "temperature (°C)", "temperature"),
    ("power_w", "power (W)", "power"),
    ("frequency_mhz", "clock (MHz)", None),
)


def plot_telemetry(
    path: Path,
    series: Sequence[tuple[float, tuple[ChipTelemetry, ...]]],
    *,
    device: str,
    title: str,
    limits: Mapping[int, Mapping[str, float | None]] | None = None,
) -> Path:
    """Draw ``series`` (seconds, every chip's reading) into ``path``; ``limits[chip][figure]`` as dashed lines."""
    plt = pyplot()
    chips = sorted({t.chip for _, tel in series for t in tel}) or [0]
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(10, 7.5), sharex=True)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for ax, (field, label, figure) in zip(axes, PANELS, strict=True):
        drawn = False
        for i, chip in enumerate(chips):
            pts = [
                (t_s, float(v))
                for t_s, tel in series
                for t in tel
                if t.chip == chip and (v := getattr(t, field)) is not None
            ]
            color = colors[i % len(colors)]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, label=f"chip {chip}")
                drawn = True
            limit = (limits or {}).get(chip, {}).get(figure) if figure else None
            if limit is not None:
                ax.axhline(limit, color=color, linestyle="--", linewidth=1, label=f"chip {chip} limit {limit:g}")
        if field == "frequency_mhz":
            for i, chip in enumerate(chips):  # shade where a chip was throttled
                spans = [t_s for t_s, tel in series for t in tel if t.chip == chip and t.throttled]
                if spans:
                    ax.plot(spans, [0] * len(spans), "|", color=colors[i % len(colors)], label=f"chip {chip} throttled")
        ax.set_ylabel(label)
        if drawn:
            ax.legend(loc="upper left", fontsize="small")
        else:
            ax.text(0.5, 0.5, "not reported by the runtime", ha="center", va="center", transform=ax.transAxes)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("seconds since the run started")
    fig.suptitle(f"{title} — {device_label(device)}")
    save(fig, path)
    return path


__all__ = ["plot_telemetry"]
