"""The mock board's device memory for self-tests: ``write_mem``/``read_mem`` on a bounded window per chip.

What it models (docs/runtime.md §8):

* a window of each chip's DRAM above the firmware reserve (:data:`WINDOW_BYTES`, or less on a small chip)
  that a self-test may overwrite while no calbin is configured; the bytes really go there and come back
  (numpy arrays allocated on first use), so a pattern test checks real data;
* transfers on the device's clock, like jobs (docs/runtime.md "Job timestamps"): each chip has one DMA
  engine per direction; a transfer starts when it is asked for or when its engine is free on the simulated
  timeline, whichever is later, and lasts ``latency + bytes / rate``. The rate is the chip's
  (:attr:`TransferModel.chip_gbps`), shared with the other chips transferring at the same moment on the
  board's one host link (:attr:`TransferModel.link_gbps`). The thread sleeps until the transfer's end, so
  wall time follows, but a busy host moves only when the call returns, never the stamps;
* faults from the fault plan, decided per transfer: ``slow_link`` (the link at ``magnitude`` x its rate)
  and ``slow_chip_transfer`` (one chip's engines at ``magnitude`` x, half by default); on reads,
  ``stuck_bit`` (a bit of one byte always reads ``stuck_at``) and ``bit_flip`` (one bit of a read flipped).

The figures are a model's (PCIe-class defaults, not a Calculet measurement): mock results, never evidence
about a board. It does not grade anything (``calctl.runners.selftest`` does).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from calctl.errors import ConfigError
from calctl.runtime.errors import DeviceBusy, DeviceLost, InvalidArgument
from calctl.runtime.memory import MemTransfer, TransferDirection
from calctl.runtime.mock.faults import FaultDecision, FaultInjector, FaultKind
from calctl.runtime.types import Health

#: The most of one chip's DRAM a self-test may use (above the firmware reserve): bounded host memory too.
WINDOW_BYTES = 64 * 1024**2


@dataclass(frozen=True)
class TransferModel:
    """The modelled host link. GB/s are 1e9 bytes per second; the defaults are assumptions, not a board's."""

    # Slower than a host's own memcpy, as a PCIe link is: the mock really copies every byte, and a model faster
    # than the host's copy would leave its transfers spaced by the host's work instead of overlapping.
    chip_gbps: float = 3.0  # one chip's DMA engine, each direction
    link_gbps: float = 5.0  # the board's one host link, shared by the chips transferring at once
    latency_s: float = 5e-6  # per transfer (setup, doorbell, completion)

    def __post_init__(self) -> None:
        if not (self.chip_gbps > 0 and self.link_gbps > 0 and self.latency_s >= 0):
            raise ConfigError(f"mock board: transfer rates must be > 0 and latency >= 0, got {self}")


class MockDeviceMemory:
    """The windows and DMA engines of every chip. Called by the board under no lock of its own; it takes the
    board's lock for the timeline and the fault decision, never while it copies or sleeps."""

    def __init__(
        self,
        *,
        chips: int,
        base: int,
        window: int,
        model: TransferModel,
        lock: threading.RLock,
        faults: FaultInjector,
    ) -> None:
        self._base, self._window, self._model = base, window, model
        self._lock = lock
        self._faults = faults
        self._data: dict[int, np.ndarray] = {}
        self._free_ns = {(c, d): 0 for c in range(chips) for d in TransferDirection}
        self._chips = chips

    def test_window(self, chip: int) -> tuple[int, int]:
        self._check_chip(chip)
        return self._base, self._window

    def transfer(
        self, chip: int, address: int, buf: np.ndarray, direction: TransferDirection, health: Health
    ) -> MemTransfer:
        """Move ``buf`` to (H2D) or from (D2H) the chip's window at ``address``; stamps on the device clock."""
        self._check_chip(chip)
        if buf.dtype != np.uint8 or buf.ndim != 1:
            raise InvalidArgument(f"chip {chip}: a transfer buffer is a 1-D uint8 array, got {buf.dtype} {buf.shape}")
        offset = address - self._base
        if offset < 0 or offset + buf.size > self._window:
            raise InvalidArgument(
                f"chip {chip}: [{address:#x}, {address + buf.size:#x}) is outside the self-test window "
                f"[{self._base:#x}, {self._base + self._window:#x})"
            )
        if health is not Health.OK:
            raise DeviceLost(f"chip {chip} is {health.value}: no transfer until it is reset")
        with self._lock:
            start, end, decisions = self._schedule(chip, direction, buf.size)
            mem = self._data.get(chip)
            if mem is None:
                mem = self._data[chip] = np.zeros(self._window, np.uint8)
        if direction is TransferDirection.H2D:
            mem[offset : offset + buf.size] = buf
        else:
            buf[:] = mem[offset : offset + buf.size]
            for d in decisions:  # what the DRAM or the link did to this read
                _corrupt_read(buf, address, d)
        delay = (end - time.monotonic_ns()) / 1e9
        if delay > 0:
            time.sleep(delay)
        return MemTransfer(chip, direction, int(buf.size), start, end)

    def _schedule(self, chip: int, direction: TransferDirection, nbytes: int) -> tuple[int, int, list[FaultDecision]]:
        """Start and end of one transfer on the device timeline (under the board lock), and the read faults that
        fired for it (a write is never corrupted here: a stuck bit shows when it is read)."""
        now = time.monotonic_ns()
        start = max(now, self._free_ns[(chip, direction)])
        # Chips whose engines are busy at `start` share the link with this one (either direction).
        sharing = 1 + len({c for (c, _), free in self._free_ns.items() if c != chip and free > start})
        chip_rate, link_rate = self._model.chip_gbps, self._model.link_gbps
        reads: list[FaultDecision] = []
        for d in self._faults.on_transfer(chip=chip):
            if d.rule.kind is FaultKind.SLOW_LINK:
                link_rate *= d.rule.magnitude
            elif d.rule.kind is FaultKind.SLOW_CHIP_TRANSFER:
                chip_rate *= d.rule.magnitude
            elif direction is TransferDirection.D2H:
                reads.append(d)
            else:
                continue  # a memory fault on a write: nothing happened yet, nothing to record
            self._faults.record(d, job=None, graph=None, model="", chips=(chip,))
        rate = min(chip_rate, link_rate / sharing) * 1e9
        end = start + int((self._model.latency_s + nbytes / rate) * 1e9)
        self._free_ns[(chip, direction)] = end
        return start, end, reads

    def _check_chip(self, chip: int) -> None:
        if not 0 <= chip < self._chips:
            raise InvalidArgument(f"chip {chip}: the board has chips 0..{self._chips - 1}")

    def refuse_while_configured(self, configured: bool) -> None:
        if configured:
            raise DeviceBusy(
                "a calbin is configured: the self-test window is its memory; reset the configuration first"
            )


def _corrupt_read(buf: np.ndarray, address: int, d: FaultDecision) -> None:
    """Apply a read fault to ``buf``, the bytes read from ``address``: a stuck bit where the read covers it, or
    one flipped bit (at the rule's address when the read covers it, else at a seeded place of the read)."""
    rule = d.rule
    if rule.kind is FaultKind.STUCK_BIT:
        at = (rule.address or 0) - address
        if 0 <= at < buf.size:
            mask = np.uint8(1 << rule.bit)
            buf[at] = (buf[at] | mask) if rule.stuck_at else (buf[at] & ~mask)
    elif rule.kind is FaultKind.BIT_FLIP and buf.size:
        rng = d.rng()
        at = (rule.address - address) if rule.address is not None else int(rng.integers(buf.size))
        if 0 <= at < buf.size:
            buf[at] ^= np.uint8(1 << int(rng.integers(8)))


__all__ = ["WINDOW_BYTES", "MockDeviceMemory", "TransferModel"]
