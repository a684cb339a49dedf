"""Every compiled decode profile B > 1 against its B1 twins (000 §7.3 inactive lanes, 000 §9.2 KV, 000 §18).

A board that computes B1 right can still be wrong in a batch: a lane that reads another lane's KV, an inactive
lane (``lane_valid`` 0) that writes KV anyway, a logits row written to the wrong lane. The golden check
(:mod:`calctl.checks.golden`) runs B1 only, so :func:`run_batch_golden` runs, for each profile B > 1 of a
model's decode graph:

1. **Twins.** Two prompts, the package's golden prompt and a variant of it (every token + 1), each decoded
   greedily at B1 (:func:`~calctl.checks.steps.greedy_run`): the tokens every lane holding that prompt must
   produce.
2. **The batch.** B sequences, lanes alternating between the two prompts, each prefilled at B1; then decode
   jobs at profile B. The first job has every lane active; each later one runs an active-lane pattern **with
   gaps** (:func:`lane_patterns`, deterministic from a seed): alternate lanes, lanes 0 and 2, the last lane
   only, the first and the last, the lower half. An inactive lane (``lane_valid`` 0, ``kv`` None, a token and
   position that differ from the live ones) keeps its sequence allocated, as a request waiting for its next
   step leaves it, and decodes again in a later pattern. A board that packs the active lanes' logits into the
   first rows, or reads a lane's inputs from the wrong row, only shows with such gaps.
3. **Resumption.** Every lane decodes the tokens it still lacks at B1.

Every lane's tokens must equal its twin's. An inactive lane that wrote KV (into its own last sequence, or into
an active lane's) changes what a later step of that sequence computes; a crossed KV or logits row changes a
lane's tokens at once. The first mismatch is named by model, profile, lane, KV position, and the job, its
chips, graph and active lanes that produced it.

Only the active lanes' logits rows are read: with ``returns_logits`` false the inactive rows are unspecified
(000 §7.3). This module opens no device, configures nothing and prints nothing; the caller's package must be
configured on ``rt``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np

from calctl.checks.golden import first_mismatch
from calctl.checks.steps import GoldenData, GreedyProgress, StepTimedOut, abort_hung, free_quietly, greedy_run
from calctl.package.model import Graph, Model, Package
from calctl.runtime import GenerationId, HostBuffer, Job, KvSeqId, Runtime
from calctl.runtime.errors import RuntimeLayerError, Timeout


@dataclass(frozen=True)
class LaneTwinResult:
    """One lane of a batch profile's run: what it produced against its B1 twin."""

    lane: int
    prompt: str  # "golden" or "variant"
    batch_steps: int  # decode steps this lane ran inside the batch (the rest at B1 after the batch)
    expected_tokens: tuple[int, ...]
    got_tokens: tuple[int, ...]
    first_mismatch: int | None


@dataclass(frozen=True)
class BatchProfileResult:
    """One decode profile B > 1 of one model: every lane equal to its B1 twin, or the first lane that is not."""

    alias: str
    batch: int
    ok: bool
    reason: str | None
    lanes: tuple[LaneTwinResult, ...]
    jobs: int
    seconds: float


@dataclass(frozen=True)
class LaneTwins:
    """What a batch's lanes hold: lane ``i`` prefills ``prompts[names[i % len(names)]]`` and must produce that
    name's twin (``twins[name]``, its greedy tokens at B1)."""

    prompts: dict[str, tuple[int, ...]]
    twins: dict[str, tuple[int, ...]]
    names: tuple[str, ...]


def batch_profiles(model: Model) -> tuple[int, ...]:
    """The decode profiles above B1 that ``model`` compiles (what :func:`run_batch_golden` runs)."""
    return tuple(b for b in model.decode.batch_profiles if b > 1)


def lane_patterns(lanes: int, seed: int = 0) -> tuple[tuple[int, ...], ...]:
    """The active-lane patterns with gaps over ``lanes`` lanes (each has an active lane above an inactive one),
    in an order drawn from ``seed``; ``()`` below two lanes."""
    if lanes < 2:
        return ()
    every = range(lanes)
    candidates = [
        tuple(lane for lane in every if lane % 2 == 1),  # odd lanes
        tuple(lane for lane in every if lane % 2 == 0),  # even lanes (a gap from three lanes on)
        (0, 2),
        (lanes - 1,),  # the last lane only
        (0, lanes - 1),
        tuple(range((lanes + 1) // 2, lanes)),  # the upper half
    ]
    out: list[tuple[int, ...]] = []
    for pattern in candidates:
        gapped = any(lane - 1 not in pattern for lane in pattern if lane > 0)
        if pattern and max(pattern) < lanes and gapped and pattern not in out:
            out.append(pattern)
    random.Random(seed).shuffle(out)
    return tuple(out)


def variant_prompt(prompt: tuple[int, ...], vocab: int) -> tuple[int, ...]:
    """The second prompt: every golden token + 1 (mod the vocabulary), so no lane's prompt equals its neighbour's."""
    return tuple((t + 1) % vocab for t in prompt)


def run_batch_golden(
    rt: Runtime,
    pkg: Package,
    alias: str,
    *,
    generation: GenerationId = GenerationId(0),
    step_timeout_s: float = 30.0,
    seed: int = 0,
) -> tuple[BatchProfileResult, ...]:
    """Run every decode profile B > 1 of ``alias`` against its B1 twins; ``()`` when the model compiles B1 only.
    ``seed`` orders the gapped active-lane patterns (:func:`lane_patterns`).

    Raises :class:`~calctl.checks.steps.StepTimedOut` (exit 4) when a wait exceeds ``step_timeout_s``; any other
    device error propagates. Every KV sequence it allocated is freed on every path."""
    profiles = batch_profiles(pkg.model(alias))
    if not profiles:
        return ()
    golden = GoldenData.load(pkg, alias)
    model = pkg.model(alias)
    vocab = model.architecture.vocab_size
    n = len(golden.tokens)
    prompts = {"golden": golden.prompt, "variant": variant_prompt(golden.prompt, vocab)}
    twins = {
        name: tuple(
            greedy_run(
                rt, model, p, n, progress=GreedyProgress(alias), generation=generation, step_timeout_s=step_timeout_s
            ).tokens
        )
        for name, p in prompts.items()
    }
    lanes = LaneTwins(prompts, twins, ("golden", "variant"))
    return tuple(
        run_lane_patterns(rt, model, b, lanes, generation=generation, timeout_s=step_timeout_s, seed=seed)
        for b in profiles
    )


def run_lane_patterns(
    rt: Runtime,
    model: Model,
    batch: int,
    lanes: LaneTwins,
    *,
    generation: GenerationId,
    timeout_s: float,
    seed: int,
) -> BatchProfileResult:
    """Profile ``batch`` of ``model``'s decode graph, each lane held to its twin (:class:`LaneTwins`): one
    all-active job, then gapped patterns (:func:`lane_patterns`), then B1 for what is left. ``rt`` is
    configured and idle."""
    return _BatchRun(rt, model, batch, lanes).run(generation, timeout_s, seed)


class _BatchRun:
    """One profile's batch: its sequences, buffers and the tokens each lane produced."""

    def __init__(self, rt: Runtime, model: Model, batch: int, lanes: LaneTwins) -> None:
        self.rt, self.model, self.batch = rt, model, batch
        self.generation, self.timeout_s = GenerationId(0), 30.0  # set by run()
        self.names = [lanes.names[lane % len(lanes.names)] for lane in range(batch)]
        self.prompts, self.twins = lanes.prompts, lanes.twins
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.batch_steps = [0] * batch
        self.sources: list[list[str]] = [[] for _ in range(batch)]  # per lane, per token: the job that produced it
        self.jobs = 0
        self.lanes = batch  # lanes that hold a sequence (the rest stay inactive): set by run()

    def run(self, generation: GenerationId, timeout_s: float, seed: int) -> BatchProfileResult:
        t0 = time.perf_counter()
        self.generation, self.timeout_s = generation, timeout_s
        seqs: list[KvSeqId] = []
        # As many lanes hold a sequence as the model's KV capacity allows (an imported model may have fewer
        # sequences than its widest profile has lanes); the others are inactive throughout.
        self.lanes = _sequences_free(self.rt, self.model.alias, self.batch)
        want = [len(self.twins[self.names[lane]]) for lane in range(self.lanes)]
        try:
            for lane in range(self.lanes):
                seqs.append(self.rt.kv.allocate(self.model.alias))
                self._prefill(lane, seqs[lane])
            # One job with every lane active, then the gapped patterns in turn while any lane has tokens to go.
            patterns = (tuple(range(self.lanes)), *lane_patterns(self.lanes, seed))
            with self.rt.job_buffers(self.model.decode.name, self.batch) as (di, do):
                for step in range(max(want) - 1):
                    active = [lane for lane in patterns[step % len(patterns)] if len(self.tokens[lane]) < want[lane]]
                    if active:
                        self._decode_batch(di, do, seqs, active, step)
            with self.rt.job_buffers(self.model.decode.name, 1) as (di, do):
                for lane in range(self.lanes):
                    while len(self.tokens[lane]) < want[lane]:
                        self._decode_one(di, do, lane, seqs[lane])
        finally:
            for seq in seqs:
                free_quietly(self.rt, seq)
        return self._judge(time.perf_counter() - t0)

    # -- jobs ---------------------------------------------------------------------------------------------

    def _wait(self, job: Job, step: str) -> None:
        self.jobs += 1
        try:
            self.rt.wait(job, self.timeout_s)
        except Timeout:
            raise StepTimedOut(
                alias=self.model.alias,
                step=f"B{self.batch} {step}",
                job=job,
                timeout_s=self.timeout_s,
                recovery=abort_hung(self.rt, job),
            ) from None

    def _prefill(self, lane: int, seq: KvSeqId) -> None:
        prompt, graph = self.prompts[self.names[lane]], self.model.prefill
        with self.rt.job_buffers(graph.name, 1) as (pi, po):
            tokens = np.zeros(pi.layout.slot("tokens").shape, np.int32)
            tokens[0, : len(prompt)] = prompt
            pi.write("tokens", tokens)
            pi.write("n_tokens", np.array([len(prompt)], np.int32))
            self.rt.kv.append(seq, len(prompt))
            job = self.rt.submit(graph.name, pi, po, kv=[seq], generation=self.generation)
            self._wait(job, f"prefill of lane {lane}")
            self.rt.kv.commit(seq)
            self.tokens[lane].append(int(np.argmax(po.read("logits")[0])))
            self.sources[lane].append(f"its B1 prefill, job {job.id}")

    def _decode_batch(self, di: HostBuffer, do: HostBuffer, seqs: list[KvSeqId], active: list[int], step: int) -> None:
        """One decode job at profile B: the lanes in ``active`` live, the others inactive (000 §7.3)."""
        b, vocab = self.batch, self.model.architecture.vocab_size
        positions = np.zeros(b, np.int32)
        tokens = np.zeros((b, 1), np.int32)
        for lane in range(b):
            if lane in active:
                positions[lane] = self.rt.kv.append(seqs[lane], 1)
                tokens[lane, 0] = self.tokens[lane][-1]
            else:  # what a stale lane would carry: a token no live lane holds, a position inside every sequence
                tokens[lane, 0] = (self.tokens[lane][-1] + 7) % vocab if self.tokens[lane] else 0
        di.write("tokens", tokens)
        di.write("positions", positions)
        _write_mask(di, self.model.decode, [lane in active for lane in range(b)])
        kv: list[KvSeqId | None] = [seqs[lane] if lane in active else None for lane in range(b)]
        job = self.rt.submit(self.model.decode.name, di, do, kv=kv, generation=self.generation)
        lanes = ", ".join(str(lane) for lane in active)
        self._wait(job, f"decode[{step}] (lanes {lanes} of {b} active)")
        for lane in active:
            self.rt.kv.commit(seqs[lane])
        logits = do.read("logits")  # only the active lanes' rows are read: inactive rows are unspecified
        chips = ", ".join(str(c) for c in job.chips)
        for lane in active:
            self.tokens[lane].append(int(np.argmax(logits[lane])))
            self.batch_steps[lane] += 1
            self.sources[lane].append(f"job {job.id} on chip {chips}, {job.graph}, lanes {lanes} of B{b} active")

    def _decode_one(self, di: HostBuffer, do: HostBuffer, lane: int, seq: KvSeqId) -> None:
        position = self.rt.kv.append(seq, 1)
        di.write("tokens", np.array([[self.tokens[lane][-1]]], np.int32))
        di.write("positions", np.array([position], np.int32))
        _write_mask(di, self.model.decode, [True])
        job = self.rt.submit(self.model.decode.name, di, do, kv=[seq], generation=self.generation)
        self._wait(job, f"decode of lane {lane} at B1 after the batch")
        self.rt.kv.commit(seq)
        self.tokens[lane].append(int(np.argmax(do.read("logits")[0])))
        self.sources[lane].append(f"job {job.id} at B1 after the batch")

    # -- the verdict --------------------------------------------------------------------------------------

    def _judge(self, seconds: float) -> BatchProfileResult:
        alias = self.model.alias
        lanes: list[LaneTwinResult] = []
        reasons: list[str] = []
        prompt_len = {name: len(p) for name, p in self.prompts.items()}
        for lane in range(self.lanes):
            name = self.names[lane]
            want, got = self.twins[name], tuple(self.tokens[lane])
            at = first_mismatch(want, got)
            lanes.append(LaneTwinResult(lane, name, self.batch_steps[lane], want, got, at))
            if at is not None and not reasons:
                source = self.sources[lane][at] if at < len(self.sources[lane]) else "no job"
                reasons.append(
                    f"{alias}: B{self.batch} lane {lane} ({name} prompt): output token {at} (KV position "
                    f"{prompt_len[name] + at - 1}) from {source}: expected {want[at]} (its B1 twin's), got "
                    f"{got[at] if at < len(got) else 'nothing'}"
                )
        return BatchProfileResult(
            alias, self.batch, not reasons, reasons[0] if reasons else None, tuple(lanes), self.jobs, seconds
        )


def _sequences_free(rt: Runtime, alias: str, wanted: int) -> int:
    """How many of ``wanted`` sequences ``alias`` can allocate now (at least 1: the golden check just freed its)."""
    n = wanted
    try:
        while n > 1 and not rt.kv.can_allocate(alias, n):
            n -= 1
    except RuntimeLayerError:  # a runtime that cannot say: try the profile's width
        return wanted
    return n


def _write_mask(inputs: HostBuffer, graph: Graph, active: list[bool]) -> None:
    """The inactive-lane mask the manifest names (000 §7.3), wherever the layout has it."""
    pol = graph.inactive_lane_policy
    name = pol.mask_input if pol is not None else "lane_valid"
    if name in inputs.names:
        inputs.write(name, np.array(active, np.uint8))


__all__ = [
    "BatchProfileResult",
    "LaneTwinResult",
    "LaneTwins",
    "batch_profiles",
    "lane_patterns",
    "run_batch_golden",
    "run_lane_patterns",
    "variant_prompt",
]
