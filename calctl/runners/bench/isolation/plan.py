"""G2 isolation, the plan: the replica package checked, its golden case, and the seeded workload (001 §12 Phase 2)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calctl.errors import UsageError
from calctl.model import decoder
from calctl.package import npy
from calctl.package.model import Package
from calctl.runners.traffic import ClientPlan
from calctl.serving.protocol import GenerationRequest, SamplingParams
from calctl.signing import seal

#: 001 §13.1: "at least 1000 requests" for the concurrency correctness row.
G2_MIN_REQUESTS = 1000
DEFAULT_REQUESTS = 1000
#: Default mock time scale: this scenario judges correctness, not latency, so jobs are short.
ISOLATION_TIME_SCALE = 0.1
PROMPT_TOKENS = (1, 48)  # uniform, inclusive
OUTPUT_TOKENS = (1, 24)
CANCEL_SHARE = 0.2  # of the requests, seeded
TIMER_CANCEL_S = 2.0  # a timer cancel fires uniformly within this many seconds after the submit

CANCEL_KINDS = ("after_submit", "mid_decode", "timer")


# ---------------------------------------------------------------------------
# The package: a replica, checked


@dataclass(frozen=True)
class Side:
    """One alias of the replica and where it runs."""

    alias: str
    chip: int
    graphs: tuple[str, ...]
    max_batch: int


@dataclass(frozen=True)
class Replica:
    sides: tuple[Side, Side]
    params_sha256: str
    tokenizer_sha256: str

    def side(self, alias: str) -> Side:
        return next(s for s in self.sides if s.alias == alias)

    def find(self, alias: object) -> Side | None:
        """The side serving ``alias``, None when it is neither (a record or trace naming a stranger)."""
        return next((s for s in self.sides if s.alias == alias), None)


def check_replica(pkg: Package, root: Path, source: Path) -> Replica:
    """The package is one model under two aliases on chips 0 and 1; else UsageError (exit 2) saying what is needed."""
    need = (
        "--scenario isolation needs a replica package: one model under two aliases, A0 on chip 0 and A1 on chip 1, "
        "identical weights and tokenizer (`calctl sample-package --kind replica`, or `calctl combine` of one "
        "single-model package with itself)"
    )
    if pkg.kind != "replica" or len(pkg.models) != 2:
        raise UsageError(
            f"{source}: package kind {pkg.kind!r} with {len(pkg.models)} model(s) ({', '.join(pkg.aliases)}); {need}"
        )
    a, b = pkg.models
    chips = [m.target_chips for m in pkg.models]
    if sorted(chips) != [(0,), (1,)]:
        raise UsageError(
            f"{source}: {a.alias} targets chip(s) {list(a.target_chips)}, {b.alias} chip(s) {list(b.target_chips)}; "
            f"{need}"
        )
    if a.architecture != b.architecture:
        raise UsageError(f"{source}: {a.alias} and {b.alias} have different architectures; {need}")
    pa, pb = (decoder.load_params(root, m.params, keep_dtype=True) for m in (a, b))
    if pa.keys() != pb.keys():
        raise UsageError(f"{source}: {a.alias} and {b.alias} have different parameter tensors; {need}")
    h = hashlib.sha256()
    for name in sorted(pa):
        if pa[name].dtype != pb[name].dtype or not np.array_equal(pa[name], pb[name]):
            raise UsageError(f"{source}: parameter {name!r} of {b.alias} differs from {a.alias}'s; {need}")
        h.update(name.encode() + b"\0" + np.ascontiguousarray(pa[name]).tobytes())
    toks = []
    for m in (a, b):
        files = [m.tokenizer.file] + ([m.tokenizer.config] if m.tokenizer.config else [])
        toks.append(tuple(seal.sha256_file(root / f) for f in files))
    if toks[0] != toks[1]:
        raise UsageError(f"{source}: {a.alias} and {b.alias} have different tokenizer files; {need}")
    sides = []
    for m in sorted(pkg.models, key=lambda m: m.target_chips[0]):
        sides.append(
            Side(
                m.alias,
                m.target_chips[0],
                tuple(g.name for g in m.graphs),
                max((p for g in m.graphs for p in g.batch_profiles), default=1),
            )
        )
    return Replica((sides[0], sides[1]), h.hexdigest(), toks[0][0])


# ---------------------------------------------------------------------------
# The workload


@dataclass(frozen=True)
class Planned:
    index: int
    request_id: str
    side: Side
    prompt: tuple[int, ...]
    max_tokens: int
    cancel: str  # "" | after_submit | mid_decode | timer
    cancel_after_tokens: int | None = None
    cancel_after_s: float | None = None

    def request(self) -> GenerationRequest:
        return GenerationRequest(
            self.request_id,
            self.side.alias,
            "isolation",
            self.prompt,
            self.max_tokens,
            SamplingParams(temperature=0.0),
            ignore_eos=True,
        )

    def plan(self) -> ClientPlan:
        return ClientPlan(
            f"isolation-{self.cancel or 'complete'}",
            cancel_after_tokens=self.cancel_after_tokens,
            cancel_after_s=self.cancel_after_s,
        )


#: Requests in flight per alias: its compiled decode batch times this (closed loop, 001 §13.1 still concurrent).
IN_FLIGHT_PER_LANE = 2


def in_flight(side: Side) -> int:
    """How many requests the closed loop keeps in flight on ``side`` (at least 4)."""
    return max(4, IN_FLIGHT_PER_LANE * side.max_batch)


def plan_workload(n: int, replica: Replica, *, vocab: int, context: int, seed: int) -> list[Planned]:
    """``n`` requests, half per alias, in a seeded interleaved order; unique prompts; seeded cancellations."""
    rng = np.random.default_rng(seed)
    sides = [replica.sides[i % 2] for i in range(n)]
    order = rng.permutation(n)
    seen: set[tuple[int, ...]] = set()
    out = []
    for k, i in enumerate(order):
        side = sides[int(i)]
        max_tokens = int(rng.integers(OUTPUT_TOKENS[0], OUTPUT_TOKENS[1] + 1))
        hi = max(PROMPT_TOKENS[0], min(PROMPT_TOKENS[1], context - max_tokens))
        while True:
            length = int(rng.integers(PROMPT_TOKENS[0], hi + 1))
            prompt = tuple(int(t) for t in rng.integers(3, vocab, size=length))
            if prompt not in seen:
                seen.add(prompt)
                break
        cancel, after_tokens, after_s = "", None, None
        if rng.random() < CANCEL_SHARE:
            cancel = CANCEL_KINDS[int(rng.integers(len(CANCEL_KINDS)))]
            if cancel == "mid_decode" and max_tokens < 2:
                cancel = "after_submit"
            if cancel == "after_submit":  # the next loop turn after the submit: queued or in its prefill
                after_s = 0.0
            elif cancel == "mid_decode":
                after_tokens = int(rng.integers(1, max_tokens))
            else:
                after_s = float(rng.uniform(0.0, TIMER_CANCEL_S))
        out.append(Planned(k, f"iso-{k:05d}", side, prompt, max_tokens, cancel, after_tokens, after_s))
    return out


# ---------------------------------------------------------------------------
# The load gate and the golden case


def load_gate_failure(message: str, replica: Replica) -> bool:
    """The supervisor's "golden + warm-up before Ready" refusal (001 §11.1) of one of the replica's aliases."""
    return any(
        message.startswith((f"{s.alias}: golden check failed", f"{s.alias}: warm-up had")) for s in replica.sides
    )


def golden_case(pkg: Package, root: Path, alias: str) -> tuple[tuple[int, ...], list[int]]:
    """The alias's golden prompt and its golden decode tokens, from the package."""
    g = pkg.model(alias).golden
    prompt = npy.load(root / g.prompt.file).reshape(-1)
    tokens = npy.load(root / g.decode_tokens.file).reshape(-1)
    return tuple(int(t) for t in prompt), [int(t) for t in tokens]
