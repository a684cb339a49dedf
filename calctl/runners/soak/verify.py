"""``calctl soak``: every answer the board gives is checked against a B1 twin (issue 50; 001 §13.1, 000 §18).

A soak that only counts outcomes passes a board that reports a job done before its logits are written, or one
whose batch lanes cross: the requests end "succeeded" with wrong tokens. So every request of the soak's traffic
(:mod:`calctl.runners.soak.mix`) but the ``invalid`` ones takes its prompt from a seeded reference pool and
decodes greedily, and :class:`OutputVerifier` holds, per alias, the **B1 twin** of every pooled prompt: the
greedy tokens the board itself produced for it at the first load, one B1 job at a time
(:func:`~calctl.checks.steps.greedy_run`, the path the golden check already proved right), before any traffic.

:meth:`OutputVerifier.check` then holds every finished request to its twin: the tokens the client received must
be a prefix of the twin's (a request may be cancelled, stopped, expired or end at an EOS, never differ). A
difference is an ``output_mismatch`` violation naming the request, the alias, its chip(s) and decode graph, the
output token and KV position, the job that produced it (the prefill, or the batch profile and lane of the decode
job, :class:`~calctl.runners.soak.batches.LaneLog`) and what was expected. Requests refused before the device (no token) are
counted, never judged here.

Serving binds a batch's requests to lanes 0..n-1 (:class:`~calctl.serving.core.decode.DecodeScheduler`), so
served traffic never leaves a gap below an active lane, and a board that packs the active lanes' logits into the
first rows answers it right. So after the twins, :meth:`OutputVerifier.compute` runs each usable profile B > 1
itself (:func:`~calctl.checks.batch_golden.run_lane_patterns`): pooled prompts on every lane, one all-active job,
then active-lane patterns **with gaps** (alternate lanes, lanes 0 and 2, the last lane only, ...) in an order
drawn from the soak's seed, each lane held to its twin's first :data:`LANE_PROBE_TOKENS` tokens. A failed
profile is an ``output_mismatch`` naming the model, profile, lane, job, chip and graph (``lane_failures``).

This module computes twins and compares token lists; it decides no verdict (``judge.py``) and sends no request.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from calctl.checks.batch_golden import BatchProfileResult, LaneTwins, run_lane_patterns
from calctl.checks.steps import GreedyProgress, greedy_run
from calctl.package.model import Package
from calctl.runners.soak.batches import LaneLog, usable_profiles
from calctl.runners.soak.mix import PoolPrompt
from calctl.runners.traffic import EngineResult
from calctl.runtime import GenerationId, Runtime
from calctl.serving.protocol import GenerationRequest

#: Output tokens each lane of the gapped-lane probe decodes (a prefix of its prompt's twin).
LANE_PROBE_TOKENS = 12


@dataclass(frozen=True)
class OutputMismatch:
    """The first token of a request that differs from its prompt's B1 twin."""

    request_id: str
    alias: str
    chips: tuple[int, ...]
    graph: str
    index: int  # output token index
    kv_position: int
    expected: int | None  # None: the request returned more tokens than the twin holds
    got: int
    generation: int | None  # the generation the differing token carried
    job: str | None = None  # the job that produced it: "prefill", or the decode job's profile and lane

    def message(self) -> str:
        chips = ", ".join(str(c) for c in self.chips)
        want = "no token (past its B1 twin)" if self.expected is None else str(self.expected)
        gen = f", generation {self.generation}" if self.generation is not None else ""
        job = f", from {self.job}" if self.job else ""
        return (
            f"request {self.request_id} ({self.alias} on chip {chips}, {self.graph}{gen}): output token {self.index} "
            f"(KV position {self.kv_position}{job}) was {self.got}, its prompt's B1 twin has {want}"
        )


@dataclass
class OutputVerifier:
    """The B1 twins of the reference pool, and the count of what was held to them (thread-safe)."""

    twins: dict[tuple[str, tuple[int, ...]], tuple[int, ...]] = field(default_factory=dict)
    places: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)  # alias -> (chips, decode graph)
    twin_seconds: dict[str, float] = field(default_factory=dict)
    checked_requests: int = 0
    checked_tokens: int = 0
    mismatched_requests: int = 0
    lanes: LaneLog = field(default_factory=LaneLog)  # where each request's decode jobs ran (the engine's launch tap)
    probes: dict[str, tuple[BatchProfileResult, ...]] = field(default_factory=dict)  # alias -> gapped-lane probes
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def compute(
        self,
        rt: Runtime,
        pkg: Package,
        alias: str,
        pool: Iterable[PoolPrompt],
        *,
        generation: int,
        step_timeout_s: float,
        seed: int = 0,
    ) -> None:
        """Decode every pooled prompt of ``alias`` greedily at B1 on ``rt`` (configured, idle): its twins; then
        every usable profile B > 1 with gapped active lanes against them (seeded by ``seed``)."""
        model = pkg.model(alias)
        pool = list(pool)
        t0 = time.monotonic()
        for entry in pool:
            progress = greedy_run(
                rt,
                model,
                entry.prompt,
                entry.max_tokens,
                progress=GreedyProgress(alias),
                generation=GenerationId(generation),
                step_timeout_s=step_timeout_s,
            )
            with self._lock:
                self.twins[(alias, entry.prompt)] = tuple(progress.tokens)
        with self._lock:
            self.places[alias] = (tuple(model.target_chips), model.decode.name)
            self.twin_seconds[alias] = round(time.monotonic() - t0, 4)
        self._probe_lanes(rt, pkg, alias, pool, GenerationId(generation), step_timeout_s, seed)

    def _probe_lanes(
        self,
        rt: Runtime,
        pkg: Package,
        alias: str,
        pool: list[PoolPrompt],
        generation: GenerationId,
        timeout_s: float,
        seed: int,
    ) -> None:
        """Every usable profile B > 1 of ``alias``, run by the soak itself with gapped active lanes."""
        with self._lock:
            twins = {f"pool {i}": self.twins.get((alias, e.prompt), ())[:LANE_PROBE_TOKENS] for i, e in enumerate(pool)}
        names = [name for name, twin in twins.items() if len(twin) > 1]
        if not names:
            return
        rng = random.Random(f"{seed}:{alias}")
        prompts = {f"pool {i}": e.prompt for i, e in enumerate(pool)}
        results = []
        for b in (b for b in usable_profiles(pkg, alias) if b > 1):
            lanes = LaneTwins(prompts, twins, tuple(rng.sample(names, min(b, len(names)))))
            run = run_lane_patterns(
                rt, pkg.model(alias), b, lanes, generation=generation, timeout_s=timeout_s, seed=rng.randrange(2**31)
            )
            results.append(run)
        with self._lock:
            self.probes[alias] = tuple(results)

    def lane_failures(self) -> list[BatchProfileResult]:
        """The gapped-lane probes that failed, in alias order."""
        with self._lock:
            return [r for alias in sorted(self.probes) for r in self.probes[alias] if not r.ok]

    def check(self, request: GenerationRequest, result: EngineResult) -> OutputMismatch | None:
        """Hold ``result``'s tokens to the twin of ``request``'s prompt; None when they agree (or no twin)."""
        with self._lock:
            twin = self.twins.get((request.alias, request.prompt_ids))
            chips, graph = self.places.get(request.alias, ((), "?"))
        got = result.token_ids
        places = self.lanes.pop(request.request_id)
        if twin is None or not got:
            return None
        at = next((i for i, t in enumerate(got) if i >= len(twin) or t != twin[i]), None)
        with self._lock:
            self.checked_requests += 1
            self.checked_tokens += len(got) if at is None else at
            if at is not None:
                self.mismatched_requests += 1
        if at is None:
            return None
        gens = result.token_generations
        if at == 0:
            job: str | None = "the prefill"
        elif at - 1 < len(places):  # token k > 0 comes from the request's k-th decode job
            job = f"its decode job {at}, {places[at - 1].text()}"
        else:
            job = None
        return OutputMismatch(
            request.request_id,
            request.alias,
            chips,
            graph,
            at,
            len(request.prompt_ids) + at - 1 if at else len(request.prompt_ids) - 1,
            twin[at] if at < len(twin) else None,
            got[at],
            gens[at] if at < len(gens) else None,
            job,
        )

    def document(self) -> dict[str, object]:
        """The report's ``output_verification`` block."""
        with self._lock:
            return {
                "reference": "B1 twins decoded on the board at the first load, before any traffic",
                "twins": {a: sum(1 for (x, _) in self.twins if x == a) for a in sorted(self.places)},
                "twin_seconds": dict(self.twin_seconds),
                "checked_requests": self.checked_requests,
                "checked_tokens": self.checked_tokens,
                "mismatched_requests": self.mismatched_requests,
                "decode_profiles": self.lanes.document(),
                "gapped_lane_probes": {
                    alias: {f"B{r.batch}": {"ok": r.ok, "jobs": r.jobs, "reason": r.reason} for r in results}
                    for alias, results in sorted(self.probes.items())
                },
            }


__all__ = ["OutputMismatch", "OutputVerifier"]
