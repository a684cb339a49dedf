"""Which board this process owns, from its environment (000 §3; 001 §2.1, §5 path C).

CalRT 0.7.6 opens one physical device per process, so a host with several
boards runs one ``calctl serve`` per board behind a load balancer. Each process
learns its board from the environment:

* mock: ``CALCTL_BOARD_ID`` names the simulated board (default ``mock0``) and
  ``CALCTL_MOCK_SEED`` seeds its fault injection (unset: the fault plan's own
  seed, 0 without a plan);
* calrt: ``CALRT_DEVICE`` is handed to the vendor shim through the process
  environment (the shim reads it in ``calrt_device_open``; docs/calrt-c-abi.md
  §10). The 0.7.6 C ABI has no call that reports which board was opened, so the
  selection is *requested*, never *confirmed* (a vendor gap, 000 §3).
  ``CALCTL_BOARD_ID`` optionally gives the board a readable label; otherwise the
  label is the ``CALRT_DEVICE`` value, or ``default`` when it is unset.

The board label appears in ``calctl device info`` and in the internal
``calctl_board_info`` metric only, never on public endpoints (001 §10.1). This
module reads the environment and validates; it opens no device.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from calctl.errors import UsageError
from calctl.runtime.types import DeviceKind

BOARD_ID_ENV = "CALCTL_BOARD_ID"
MOCK_SEED_ENV = "CALCTL_MOCK_SEED"
CALRT_DEVICE_ENV = "CALRT_DEVICE"

DEFAULT_MOCK_BOARD = "mock0"
DEFAULT_CALRT_BOARD = "default"

# A board label becomes a Prometheus label value and a log field: short, printable, no spaces or quotes.
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}")


@dataclass(frozen=True)
class BoardSelection:
    """The board a process owns. ``confirmed``: the runtime itself vouches for it (mock: yes; CalRT 0.7.6: no)."""

    device: DeviceKind
    board: str
    source: str  # which variable named the board, or "default"
    seed: int = 0  # mock only: the fault-injection seed
    seed_from_env: bool = False  # False: a fault plan's own seed still applies (0 without a plan)
    selector: str | None = None  # calrt only: the CALRT_DEVICE value handed to the shim; None = the shim's default
    confirmed: bool = True

    def mock_options(self) -> dict[str, Any]:
        """Options for ``open_runtime("mock", ...)`` implied by the selection."""
        return {"seed": self.seed} if self.seed_from_env else {}

    def describe(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"id": self.board, "source": self.source, "confirmed": self.confirmed}
        if self.device is DeviceKind.MOCK:
            doc["seed"] = self.seed
            doc["seed_source"] = MOCK_SEED_ENV if self.seed_from_env else "default"
        else:
            doc["selector"] = self.selector
            doc["note"] = (
                f"{CALRT_DEVICE_ENV} is passed to the CalRT shim through the environment; the 0.7.6 C ABI "
                "cannot report which board it opened (vendor gap, 000 §3)"
            )
        return doc


def select_board(kind: DeviceKind | str, environ: Mapping[str, str] | None = None) -> BoardSelection:
    """The board named by the environment for a ``kind`` device. UsageError (exit 2) for a malformed value."""
    env = os.environ if environ is None else environ
    device = DeviceKind(kind)
    label = env.get(BOARD_ID_ENV, "").strip() or None
    if label is not None:
        _check_label(label, BOARD_ID_ENV)
    if device is DeviceKind.MOCK:
        raw_seed = env.get(MOCK_SEED_ENV, "").strip()
        if raw_seed and not raw_seed.isdigit():
            raise UsageError(f"{MOCK_SEED_ENV}={raw_seed!r}: expected a non-negative integer")
        return BoardSelection(
            device,
            label or DEFAULT_MOCK_BOARD,
            BOARD_ID_ENV if label else "default",
            seed=int(raw_seed) if raw_seed else 0,
            seed_from_env=bool(raw_seed),
        )
    selector = env.get(CALRT_DEVICE_ENV, "").strip() or None
    if label is None and selector is not None:
        _check_label(selector, CALRT_DEVICE_ENV, hint=f"or set {BOARD_ID_ENV} to a label for this board")
    board = label or selector or DEFAULT_CALRT_BOARD
    source = BOARD_ID_ENV if label else (CALRT_DEVICE_ENV if selector else "default")
    return BoardSelection(device, board, source, selector=selector, confirmed=False)


def _check_label(value: str, variable: str, *, hint: str | None = None) -> None:
    if not _LABEL.fullmatch(value):
        raise UsageError(
            f"{variable}={value!r}: a board label is 1-64 characters of letters, digits and . _ : / - "
            "(it becomes a metric label)",
            hint=hint,
        )


__all__ = ["BOARD_ID_ENV", "CALRT_DEVICE_ENV", "MOCK_SEED_ENV", "BoardSelection", "select_board"]
