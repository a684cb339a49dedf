"""How busy the host was while a host-clock figure was measured.

A figure measured on the host's clock (a client's E2E latency, tokens per second over wall time) describes
the host as much as the device. When the host's 1-minute load average exceeded its CPU count during the
measurement, such a figure is not judged: the gate that reads it says NOT JUDGED naming the load, and only
the figures on the device's clock (job start/end stamps) decide (issue "Verdicts about the device, not the
host"; docs/bench.md "Host load").
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def load_now() -> float:
    """The 1-minute load average (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def cpus() -> int:
    return os.cpu_count() or 1


def saturated(samples: Sequence[float]) -> bool:
    """Did any load sample exceed the CPU count?"""
    return bool(samples) and max(samples) > cpus()


def saturation_note(samples: Sequence[float], what: str = "the measurement") -> str:
    """The sentence a not-judged host-clock figure carries."""
    return (
        f"host saturated: load average up to {max(samples):.1f} on {cpus()} CPUs during {what}; "
        "this figure is on the host's clock and describes the host, not the chips"
    )


__all__ = ["cpus", "load_now", "saturated", "saturation_note"]
