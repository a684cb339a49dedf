"""The mock board's timing model: how long a job really takes, and in which phases (docs/runtime.md, 001 §9.3–§9.4, §14).

Per graph (and optionally per chip) a prefill takes ``a + b * tokens`` and a
decode ``c + d * kv_tokens`` seconds, multiplied by ``time_scale``. Defaults are
a few milliseconds (prefill 4 ms + 0.05 ms/token, decode 3 ms + 0.005 ms per KV
token). The board sleeps that long, minus the numpy compute already spent, so
concurrency across chips is real wall-clock overlap.

A job runs in three phases (001 §14 ``h2d_ms, infer_ms, d2h_ms``): inputs to
the device, compute, outputs to the host. ``h2d_share`` and ``d2h_share`` say
which part of the job's time is each transfer; compute is the rest. The board
gives each chip one h2d channel, one compute unit and one d2h channel, so a
``ping`` and a ``pong`` job on one chip may overlap one's transfer with the
other's compute, but two computes on one chip never overlap (000 §14: two in
flight is not two computing). The split changes only *where* a job's time goes,
never how long a job takes alone, so ``auto`` timing is the same with any split.

The default split (30 % h2d, 40 % compute, 30 % d2h) is an assumption, not a
measurement: how much of a job a real board can overlap under ping/pong is one
of the vendor's open items (000 §20 "PING/PONG/parallel timing"). Benches that
judge ping/pong state the split they ran with (``docs/executor.md``).

These numbers are mock numbers. They say nothing about a board; measured
profiles from a bench can be loaded as ``per_graph`` overrides. This module
computes durations; it does not sleep.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from calctl.errors import ConfigError
from calctl.package.model import GraphKind


@dataclass(frozen=True)
class PhaseSplit:
    """Seconds of one job in each phase (unscaled)."""

    h2d_s: float
    compute_s: float
    d2h_s: float

    @property
    def total_s(self) -> float:
        return self.h2d_s + self.compute_s + self.d2h_s

    def scaled(self, factor: float) -> PhaseSplit:
        return PhaseSplit(self.h2d_s * factor, self.compute_s * factor, self.d2h_s * factor)


@dataclass(frozen=True)
class GraphTiming:
    prefill_base_s: float = 0.004
    prefill_per_token_s: float = 0.00005
    decode_base_s: float = 0.003
    decode_per_kv_token_s: float = 0.000005
    h2d_share: float = 0.3
    d2h_share: float = 0.3

    def __post_init__(self) -> None:
        for f in fields(self):  # every field is a duration or a share
            name, value = f.name, getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ConfigError(f"timing {name} must be a non-negative number, got {value!r}")
        if self.h2d_share + self.d2h_share >= 1:
            raise ConfigError(
                f"timing h2d_share + d2h_share must be below 1 (compute is the rest), got {self.h2d_share} + {self.d2h_share}"
            )


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

    def phases(self, graph: str, kind: GraphKind, chip: int, *, tokens: int, kv_tokens: int) -> PhaseSplit:
        """:meth:`seconds` split into h2d / compute / d2h by the graph's shares."""
        t = self.per_graph.get(graph, self.default)
        total = self.seconds(graph, kind, chip, tokens=tokens, kv_tokens=kv_tokens)
        h2d, d2h = total * t.h2d_share, total * t.d2h_share
        return PhaseSplit(h2d, total - h2d - d2h, d2h)

    def with_shares(self, h2d_share: float, d2h_share: float) -> TimingModel:
        """The same model with every graph's phase split replaced (benches compare splits)."""
        return TimingModel(
            default=replace(self.default, h2d_share=h2d_share, d2h_share=d2h_share),
            per_graph={g: replace(t, h2d_share=h2d_share, d2h_share=d2h_share) for g, t in self.per_graph.items()},
            chip_factor=dict(self.chip_factor),
        )
