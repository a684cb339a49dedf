"""Does a package's memory plan fit the device it is about to be configured on?

Validation checks a package against itself: its manifest says ``chip_dram_bytes``
and its regions fit that. Nothing in the package proves the number is the
board's, so before ``configure`` the runners and the server compare the package
with the device's own topology (001 §8.2: "confirmed local DRAM"; 001 §6.4:
exit before configure): chip count, CalCores per chip, and per chip the DRAM
the manifest assumes and the bytes the memory plan reserves.

:func:`device_fit` is pure: it takes the package and the three topology facts
(``Runtime.topology()`` provides them), does no I/O and raises nothing; the
caller refuses the package when :attr:`DeviceFit.ok` is false. A chip whose DRAM
the runtime does not report cannot be checked; that is a note, never a pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from calctl.package.model import Package


class TopologyFacts(Protocol):
    """What :func:`device_fit` needs of ``calctl.runtime.Topology``."""

    @property
    def chips(self) -> int: ...

    @property
    def calcores_per_chip(self) -> int: ...

    @property
    def dram_bytes(self) -> Sequence[int | None]: ...


@dataclass(frozen=True)
class DeviceFit:
    problems: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        if self.problems:
            return "; ".join(self.problems)
        return "; ".join(self.notes) if self.notes else "the package's chips, CalCores and memory plan fit the device"


def device_fit(pkg: Package, topology: TopologyFacts) -> DeviceFit:
    """Compare ``pkg`` with the device: every problem that must stop it before configure, and what went unchecked."""
    problems: list[str] = []
    notes: list[str] = []
    cfg = pkg.device_cfg
    if cfg.chip_nums > topology.chips:
        problems.append(f"the package is built for {cfg.chip_nums} chips, the device has {topology.chips}")
    if cfg.calcore_num != topology.calcores_per_chip:
        problems.append(
            f"the package has programs for {cfg.calcore_num} CalCores per chip, "
            f"the device has {topology.calcores_per_chip}"
        )
    used = sorted({c for m in pkg.models for c in m.target_chips} | {r.chip for r in pkg.memory_plan})
    for chip in used:
        if chip >= topology.chips:
            problems.append(f"chip {chip} is used by the package but the device has chips 0..{topology.chips - 1}")
            continue
        dram = topology.dram_bytes[chip] if chip < len(topology.dram_bytes) else None
        reserved = sum(r.size for r in pkg.regions_on(chip))
        if dram is None:
            notes.append(
                f"chip {chip}: the runtime does not report its DRAM, so the package's {cfg.chip_dram_bytes:,} bytes "
                f"per chip and {reserved:,} reserved bytes are unchecked against the device"
            )
            continue
        if cfg.chip_dram_bytes > dram:
            problems.append(
                f"chip {chip}: the manifest assumes {cfg.chip_dram_bytes:,} bytes of DRAM "
                f"(device_cfg.chip_dram_bytes), the device reports {dram:,}"
            )
        if reserved > dram:
            problems.append(f"chip {chip}: the memory plan reserves {reserved:,} bytes, the device has {dram:,}")
    return DeviceFit(tuple(problems), tuple(notes))


__all__ = ["DeviceFit", "TopologyFacts", "device_fit"]
