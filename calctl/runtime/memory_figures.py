"""Whether a runtime's per-chip memory figures can be bytes of the chip asked (C ABI clause MEM-1).

A shim that reports ``calrt_memory_usage`` in KiB, or another chip's figures, gives numbers that look
plausible on their own: soak's drift limit, the vendor row "DRAM per chip" and ``calctl device info`` would
believe them (#50). What can be checked without loading anything: the total a chip reports is the DRAM the
topology gives it, and the used figure is above 0 and within the total. A figure the runtime cannot tell
(``None``) is not judged. This module judges figures; it reads nothing from a device itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from calctl.runtime.types import ChipMemory, Topology


@dataclass(frozen=True)
class MemoryFinding:
    """One figure that cannot be bytes of its chip: the chip, the call that reported it, and why."""

    chip: int
    call: str
    detail: str

    def text(self) -> str:
        return f"chip {self.chip}: {self.call} {self.detail}"


def memory_findings(topology: Topology, memory: Sequence[ChipMemory]) -> list[MemoryFinding]:
    """Every chip whose figures disagree with the topology or with themselves (MEM-1); empty when all hold."""
    out = []
    for m in memory:
        dram = topology.dram_bytes[m.chip] if m.chip < len(topology.dram_bytes) else None
        if m.total_bytes is not None and dram is not None and m.total_bytes != dram:
            out.append(
                MemoryFinding(
                    m.chip,
                    "calrt_memory_usage",
                    f"reports {m.total_bytes} B in total, the topology {dram} B of DRAM: the figures are not "
                    "bytes of this chip (KiB? another chip's?)",
                )
            )
        if m.used_bytes is not None and m.total_bytes is not None and not 0 < m.used_bytes <= m.total_bytes:
            out.append(
                MemoryFinding(
                    m.chip,
                    "calrt_memory_usage",
                    f"reports {m.used_bytes} B used of {m.total_bytes} B: used must be above 0 and within the total",
                )
            )
    return out
