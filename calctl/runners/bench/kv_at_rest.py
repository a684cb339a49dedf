"""What the engine and the device hold for one alias when nothing should be held: read before and after a fault
(batch's KV fault phase) or a run (isolation's end-of-run check), and compared."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from calctl.runners.serving_stack import ServingStack
from calctl.runtime.errors import RuntimeLayerError
from calctl.serving.core.kv import KvState


@dataclass(frozen=True)
class KvAtRest:
    """What the engine and the device hold for one alias, read when nothing should be held (batch's KV fault
    phase, isolation's end-of-run check; isolation's report ``kv`` keys are these field names)."""

    kv_lanes: dict[str, int]
    kv_reserved_tokens: int
    kv_used_tokens: int
    inflight_jobs: int
    quarantined_jobs: int
    device_free_kv_sequences: int | None

    @classmethod
    def read(cls, stack: ServingStack, alias: str) -> KvAtRest:
        snap = stack.core(alias).snapshot()
        return cls(
            dict(snap.kv_lanes),
            int(snap.kv_reserved_tokens),
            int(snap.kv_used_tokens),
            int(snap.inflight_jobs),
            int(snap.quarantined_jobs),
            free_kv_sequences(stack.rt, alias),
        )

    def problems_against(self, before: KvAtRest, *, since: str, free_lanes: str = "free KV lanes") -> list[str]:
        """What is not back where it was ``before`` (``since``: "the fault", "the run")."""
        out = []
        free = KvState.FREE.value
        held = {k: v for k, v in self.kv_lanes.items() if k != free and v}
        if held:
            out.append(f"KV lanes not free: {held}")
        if self.kv_reserved_tokens or self.kv_used_tokens:
            out.append(f"{self.kv_reserved_tokens} reserved and {self.kv_used_tokens} used KV tokens left")
        if self.inflight_jobs or self.quarantined_jobs:
            out.append(f"{self.inflight_jobs} job(s) in flight, {self.quarantined_jobs} quarantined")
        if self.kv_lanes.get(free, 0) != before.kv_lanes.get(free, 0):
            out.append(f"{self.kv_lanes.get(free, 0)} {free_lanes}, {before.kv_lanes.get(free, 0)} before {since}")
        if self.device_free_kv_sequences != before.device_free_kv_sequences:
            out.append(
                f"the device allocates {self.device_free_kv_sequences} more KV sequences, "
                f"{before.device_free_kv_sequences} before {since}"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """The batch report's ``kv_before`` / ``kv_after`` (its own names for the fields, in their order)."""
        names = ("lanes", "reserved_tokens", "used_tokens", "inflight", "quarantined", "device_free_sequences")
        return dict(zip(names, dataclasses.astuple(self), strict=True))


def free_kv_sequences(rt: Any, alias: str, limit: int = 1 << 16) -> int | None:
    """How many more KV sequences the runtime would allocate for ``alias`` (None: it cannot tell): a binary search
    on ``rt.kv.can_allocate``, at most ``limit``. The KV-at-rest checks of batch and isolation compare it."""
    try:
        lo, hi = 0, 1
        if not rt.kv.can_allocate(alias, 1):
            return 0
        while hi <= limit and rt.kv.can_allocate(alias, hi):
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if rt.kv.can_allocate(alias, mid) else (lo, mid)
        return lo
    except (RuntimeLayerError, NotImplementedError):
        return None


__all__ = ["KvAtRest", "free_kv_sequences"]
