"""Open-loop workloads for ``calctl bench``: arrival times and request lengths, seeded.

* **Arrivals** (:func:`arrival_times`): inter-arrival gaps drawn from a gamma
  distribution with shape ``burstiness`` and mean ``1/rate`` (scale
  ``1 / (rate * burstiness)``). ``burstiness = 1`` is a Poisson process; below 1
  arrivals bunch up, above 1 they are more regular. Requests are sent at their
  arrival time whatever the server is doing (open loop): a slow server does not
  slow the offered load down, it builds queues, as real traffic does.
* **Lengths** (:class:`LengthDist`): ``N`` (fixed), ``uniform:LO:HI``,
  ``normal:MEAN:STD`` (rounded, clipped to >= 1), ``choice:a,b,c``.
* **A workload** (:func:`build_workload`) is the list of requests one model gets
  in one phase: arrival offset, prompt token ids, ``max_tokens``. It depends only
  on the seed and the model's index, so the *same* workload is replayed for a
  model in isolation and in the joint phase (a paired comparison, docs/bench.md).

Bounded in count (``max_requests``) and in time (arrivals only within the
duration). Nothing here sends anything.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calctl.errors import UsageError
from calctl.textsafe import decimal_float, decimal_int

#: The longest prompt or output length a distribution may name (a length past any context is refused by the server).
MAX_LENGTH = 10**9


@dataclass(frozen=True)
class LengthDist:
    kind: str  # fixed | uniform | normal | choice
    params: tuple[float, ...]
    spec: str

    @classmethod
    def parse(cls, spec: str, *, name: str = "length") -> LengthDist:
        s = spec.strip().lower()
        try:
            if re.fullmatch(r"[0-9]+", s):
                n = int(s)
                if not 1 <= n <= MAX_LENGTH:
                    raise ValueError
                return cls("fixed", (n,), spec)
            kind, _, rest = s.partition(":")
            if kind == "uniform":
                lo, hi = (decimal_int(x) for x in rest.split(":"))
                if not 1 <= lo <= hi <= MAX_LENGTH:
                    raise ValueError
                return cls("uniform", (lo, hi), spec)
            if kind == "normal":
                mean, std = (decimal_float(x) for x in rest.split(":"))
                if not (1 <= mean <= MAX_LENGTH and 0 <= std <= MAX_LENGTH):
                    raise ValueError
                return cls("normal", (mean, std), spec)
            if kind == "choice":
                values = tuple(decimal_int(x) for x in rest.split(","))
                if not values or min(values) < 1 or max(values) > MAX_LENGTH:
                    raise ValueError
                return cls("choice", values, spec)
        except ValueError:
            pass
        raise UsageError(
            f"--{name} {spec!r}: expected N, uniform:LO:HI, normal:MEAN:STD or choice:a,b,c (decimal numbers, "
            f"1 to {MAX_LENGTH})"
        )

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, int(self.params[0]), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(int(self.params[0]), int(self.params[1]) + 1, size=n)
        if self.kind == "normal":
            return np.maximum(1, np.rint(rng.normal(self.params[0], self.params[1], size=n))).astype(np.int64)
        return rng.choice(np.asarray(self.params, dtype=np.int64), size=n)

    @property
    def maximum(self) -> int | None:
        """The largest value it can draw, or None (unbounded normal)."""
        if self.kind == "normal":
            return None
        return int(max(self.params))


def arrival_times(
    rate: float, duration_s: float, burstiness: float, rng: np.random.Generator, max_requests: int
) -> np.ndarray:
    """Arrival offsets (seconds from the phase start) of a gamma renewal process, within ``duration_s``."""
    if rate <= 0 or burstiness <= 0:
        raise UsageError("--rate and --burstiness must be positive")
    theta = 1.0 / (rate * burstiness)
    expected = int(rate * duration_s * 1.5) + 16
    out: list[float] = []
    t = 0.0
    while len(out) < max_requests:
        gaps = rng.gamma(shape=burstiness, scale=theta, size=expected)
        for g in gaps:
            t += float(g)
            if t >= duration_s or len(out) >= max_requests:
                return np.asarray(out)
            out.append(t)
    return np.asarray(out)


@dataclass(frozen=True)
class PlannedRequest:
    """One request of a phase: when it is sent and what it asks. A synthetic workload's prompt is token ids; a
    dataset's (``calctl bench --dataset``) is text or a chat (``messages``: role, content), ids empty."""

    offset_s: float
    prompt_ids: tuple[int, ...]
    max_tokens: int
    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None


@dataclass(frozen=True)
class TokenRange:
    """Prompt token ids are drawn uniformly from [low, high): ids every tokenizer of the target accepts."""

    low: int = 3
    high: int = 256

    @classmethod
    def parse(cls, spec: str) -> TokenRange:
        try:
            lo, hi = (decimal_int(x) for x in spec.split(":"))
        except ValueError:
            raise UsageError(f"--token-range {spec!r}: expected LOW:HIGH (decimal integers)") from None
        if not 0 <= lo < hi <= 2**31:
            raise UsageError(f"--token-range {spec!r}: expected 0 <= LOW < HIGH <= {2**31}")
        return cls(lo, hi)


def build_workload(
    *,
    seed: int,
    stream: int,
    rate: float,
    duration_s: float,
    burstiness: float,
    prompt: LengthDist,
    output: LengthDist,
    tokens: TokenRange,
    max_requests: int,
) -> list[PlannedRequest]:
    """The requests of one model in one phase. ``stream`` (the model's index) decorrelates models."""
    rng = np.random.default_rng([seed, stream])
    times = arrival_times(rate, duration_s, burstiness, rng, max_requests)
    n = len(times)
    plens = prompt.sample(rng, n)
    olens = output.sample(rng, n)
    out = []
    for t, p, o in zip(times, plens, olens, strict=True):
        ids = rng.integers(tokens.low, tokens.high, size=int(p))
        out.append(PlannedRequest(float(t), tuple(int(x) for x in ids), int(o)))
    return out


def offered_tokens(workload: Sequence[PlannedRequest]) -> int:
    return sum(r.max_tokens for r in workload)


__all__ = ["LengthDist", "PlannedRequest", "TokenRange", "arrival_times", "build_workload", "offered_tokens"]
