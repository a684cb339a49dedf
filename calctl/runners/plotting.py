"""What every runner picture shares (matplotlib, Agg): the backend, the device label, the atomic save.

Bench, isolation, batch, soak and accept draw their own figures; this module only makes sure that each of
them runs headless, says where its numbers come from (:func:`device_label`: a mock result is never shown as
hardware evidence) and is written whole or not at all (:func:`save`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from calctl.records import atomic_output


def device_label(device: str) -> str:
    """The line a picture carries about its device: the mock, a server's unstated device, or a named one."""
    if device == "mock":
        return "MOCK device: simulated board, not hardware evidence"
    if device == "unknown":
        return "device of the server: not stated (--target-device)"
    if device == "calrt":  # the reference board (a software model) or a board: the report's device_label says which
        return "CalRT device: a software model or a board, as report.json's device_label says"
    return f"device: {device}"


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, *, layout: bool = True) -> None:
    """Write ``fig`` to ``path`` as a PNG atomically (``tight_layout`` first unless ``layout`` is false), then close it."""
    import matplotlib.pyplot as plt

    if layout:
        fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)


__all__ = ["device_label", "pyplot", "save"]
