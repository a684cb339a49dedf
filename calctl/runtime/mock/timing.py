"""The mock board's timing model: how long a job really takes (SPEC §5, 001 §9.3–§9.4).

Per graph (and optionally per chip) a prefill takes ``a + b * tokens`` and a
decode ``c + d * kv_tokens`` seconds, multiplied by ``time_scale``. Defaults are
a few milliseconds (prefill 4 ms + 0.05 ms/token, decode 3 ms + 0.005 ms per KV
token). The board sleeps that long, minus the numpy compute already spent, so
concurrency across chips is real wall-clock overlap.

These numbers are mock numbers. They say nothing about a board; measured
profiles from a bench can be loaded as ``per_graph`` overrides. This module
computes durations; it does not sleep.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from calctl.errors import ConfigError
from calctl.package.model import GraphKind


@dataclass(frozen=True)
class GraphTiming:
    prefill_base_s: float = 0.004
    prefill_per_token_s: float = 0.00005
    decode_base_s: float = 0.003
    decode_per_kv_token_s: float = 0.000005

    def __post_init__(self) -> None:
        for name in ("prefill_base_s", "prefill_per_token_s", "decode_base_s", "decode_per_kv_token_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"timing {name} must be a non-negative number, got {value!r}")


@dataclass(frozen=True)
class TimingModel:
    """``per_graph`` overrides by exact graph name; ``chip_factor`` slows (>1) or speeds up a chip."""

    default: GraphTiming = GraphTiming()
    per_graph: Mapping[str, GraphTiming] = field(default_factory=dict)
    chip_factor: Mapping[int, float] = field(default_factory=dict)

    def seconds(self, graph: str, kind: GraphKind, chip: int, *, tokens: int, kv_tokens: int) -> float:
        """Unscaled duration of one job. ``tokens``: prompt tokens (prefill); ``kv_tokens``: KV
        tokens read, summed over the active lanes (decode)."""
        t = self.per_graph.get(graph, self.default)
        if kind is GraphKind.PREFILL:
            base = t.prefill_base_s + t.prefill_per_token_s * tokens
        else:
            base = t.decode_base_s + t.decode_per_kv_token_s * kv_tokens
        return base * self.chip_factor.get(chip, 1.0)
