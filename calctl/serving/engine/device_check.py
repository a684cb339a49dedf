"""The device checks the supervisor reads from the runtime: 000 §12 after an unload, halted chips before a
configure (no lifecycle here)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from calctl.runtime.errors import NotSupported, RuntimeLayerError
from calctl.runtime.interface import Runtime
from calctl.runtime.types import Health

log = logging.getLogger("calctl.serve")


@dataclass(frozen=True)
class ChipCheck:
    """One chip after an unload: its memory now and before the first configure, its pending jobs, its health
    (each None when the runtime does not report it)."""

    chip: int
    used_bytes: int | None
    idle_bytes: int | None
    pending_jobs: int | None
    health: str | None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # the fields are the JSON keys, in order


@dataclass(frozen=True)
class DeviceCheck:
    """000 §12 "verify device memory/health": ``problems`` fail it; ``not_reported`` are gaps, never a pass
    and never a failure."""

    chips: tuple[ChipCheck, ...]
    problems: tuple[str, ...]
    not_reported: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "chips": [c.to_json() for c in self.chips],
            "problems": list(self.problems),
            "not_reported": list(self.not_reported),
        }


def memory_by_chip(rt: Runtime) -> dict[int, int | None]:
    """Memory in use per chip; empty when the runtime does not report it."""
    try:
        return {m.chip: m.used_bytes for m in rt.memory_usage()}
    except (NotSupported, RuntimeLayerError):
        return {}


def halted_chips(rt: Runtime) -> list[str]:
    """The chips the runtime reports faulted or hung, with why; a runtime that cannot say is not halted."""
    try:
        health = rt.health()
    except RuntimeLayerError as exc:
        log.warning("chip health not readable (%s)", exc)
        return []
    return [
        f"chip {h.chip} {h.health.value}" + (f": {h.detail}" if h.detail else "")
        for h in health
        if h.health in (Health.FAULTED, Health.HUNG)
    ]


def verify_device(rt: Runtime, idle_memory: dict[int, int | None]) -> DeviceCheck:
    """000 §12 after an unload: every chip back to the memory it used before the first configure, no job
    pending, healthy. A figure the runtime does not report is null and listed under ``not_reported``; it
    is a gap, never a pass and never a failure."""
    problems: list[str] = []
    gaps: list[str] = []
    used = memory_by_chip(rt)
    try:
        health = {h.chip: h for h in rt.health()}
    except (NotSupported, RuntimeLayerError):
        health = {}
    try:
        pending = {c.chip: c.pending for c in rt.counters()}
    except (NotSupported, RuntimeLayerError):
        pending = {}
    chips: list[ChipCheck] = []
    for chip in sorted(set(used) | set(health) | set(pending) | set(idle_memory)):
        now_b, idle_b = used.get(chip), idle_memory.get(chip)
        h = health.get(chip)
        chips.append(ChipCheck(chip, now_b, idle_b, pending.get(chip), h.health.value if h is not None else None))
        if now_b is None or idle_b is None:
            gaps.append(f"chip {chip}: memory in use")
        elif now_b > idle_b:
            problems.append(f"chip {chip}: {now_b - idle_b} bytes still in use ({now_b} used, {idle_b} idle)")
        if pending.get(chip) is None:
            gaps.append(f"chip {chip}: pending jobs")
        elif pending[chip]:
            problems.append(f"chip {chip}: {pending[chip]} job(s) still pending")
        if h is None or h.health is Health.UNKNOWN:
            gaps.append(f"chip {chip}: health")
        elif h.health is not Health.OK:
            problems.append(f"chip {chip}: health {h.health.value}" + (f" ({h.detail})" if h.detail else ""))
    return DeviceCheck(tuple(chips), tuple(problems), tuple(gaps))


__all__ = ["ChipCheck", "DeviceCheck", "halted_chips", "memory_by_chip", "verify_device"]
