"""PrefillScheduler: short/medium/long prefill queues and the service arbiter against decode (000 §6, 001 §9.2–§9.3).

Admitted requests wait in one of three queues by prompt length (thresholds
from configuration; 000 §6 defaults ``short <= 512 < medium <= 4096 < long``),
each ordered by WFQ virtual finish (000 §5.3). Whenever the device can take a
job, :class:`ServiceArbiter` picks decode or one of the prefill classes by
smooth weighted round robin over the kinds that have work (default
``decode:short:medium:long = 8:4:2:1``): work-conserving, and a backlogged
long queue gets at least ``1 / sum(weights)`` of the opportunities even under
continuous decode, so long prefills are never starved (000 §17.1).

A prompt is always submitted whole: nothing here can split it. 000 §6 allows
chunked prefill only when the compiler/runtime proves incremental prefill is
equivalent, and none of that is declared, so head-of-line blocking is bounded
by admission and the long-queue weight instead (001 §9.3).

This module does not touch KV lanes, the registry or a device; the scheduler
does. Time is passed in.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection
from dataclasses import dataclass

from calctl.serving.core.enums import IdentityEnum
from calctl.serving.core.errors import InvariantViolation
from calctl.serving.core.ids import ModelGenerationId
from calctl.serving.core.request import EndReason, RequestState, SequenceState


class WorkKind(IdentityEnum):
    """One service opportunity of the device (000 §6 weighted round robin)."""

    DECODE = "decode"
    PREFILL_SHORT = "short"
    PREFILL_MEDIUM = "medium"
    PREFILL_LONG = "long"


PREFILL_KINDS = (WorkKind.PREFILL_SHORT, WorkKind.PREFILL_MEDIUM, WorkKind.PREFILL_LONG)
_ARBITER_ORDER = (WorkKind.DECODE, *PREFILL_KINDS)


@dataclass(frozen=True, slots=True)
class ServiceWeights:
    """000 §15 ``queues.*_weight``: service opportunities per round."""

    decode: int = 8
    short: int = 4
    medium: int = 2
    long: int = 1

    def __post_init__(self) -> None:
        for name in ("decode", "short", "medium", "long"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServiceWeights.{name} must be >= 1 (0 would starve that queue)")

    def of(self, kind: WorkKind) -> int:
        return {
            WorkKind.DECODE: self.decode,
            WorkKind.PREFILL_SHORT: self.short,
            WorkKind.PREFILL_MEDIUM: self.medium,
            WorkKind.PREFILL_LONG: self.long,
        }[kind]


@dataclass(frozen=True, slots=True)
class PrefillThresholds:
    """000 §15 ``queues.short_prefill_max_tokens`` / ``medium_prefill_max_tokens``."""

    short_max_tokens: int = 512
    medium_max_tokens: int = 4096

    def __post_init__(self) -> None:
        if not 1 <= self.short_max_tokens < self.medium_max_tokens:
            raise ValueError(
                f"need 1 <= short_max_tokens ({self.short_max_tokens}) < medium_max_tokens ({self.medium_max_tokens})"
            )

    def classify(self, prompt_tokens: int) -> WorkKind:
        if prompt_tokens <= self.short_max_tokens:
            return WorkKind.PREFILL_SHORT
        if prompt_tokens <= self.medium_max_tokens:
            return WorkKind.PREFILL_MEDIUM
        return WorkKind.PREFILL_LONG


class ServiceArbiter:
    """Smooth weighted round robin over the kinds that have work.

    Each pick adds every eligible kind's weight to its credit, takes the kind
    with the most credit and charges it the eligible total. Over any window in
    which a set of kinds stays backlogged each gets its weight share, picks are
    interleaved rather than bunched, and a kind with work is picked at least
    once every ``sum(weights)`` picks. A kind without work has its credit reset,
    so an idle queue cannot bank turns.
    """

    def __init__(self, weights: ServiceWeights) -> None:
        self.weights = weights
        self._w = {k: weights.of(k) for k in _ARBITER_ORDER}
        self._credit = dict.fromkeys(_ARBITER_ORDER, 0)
        self.picks = dict.fromkeys(_ARBITER_ORDER, 0)

    def pick(self, eligible: Collection[WorkKind]) -> WorkKind | None:
        best: WorkKind | None = None
        total = 0
        credit = self._credit
        for kind in _ARBITER_ORDER:
            if kind not in eligible:
                credit[kind] = 0
                continue
            w = self._w[kind]
            credit[kind] += w
            total += w
            if best is None or credit[kind] > credit[best]:
                best = kind
        if best is not None:
            credit[best] -= total
            self.picks[best] += 1
        return best


@dataclass(frozen=True, slots=True)
class Dropped:
    """A queued request the scheduler refused to run (000 §7.2 rule 1); the caller finishes it."""

    seq: SequenceState
    reason: EndReason
    detail: str


class PrefillScheduler:
    """Three WFQ-ordered prefill queues plus the arbiter that interleaves them with decode (000 §6)."""

    def __init__(self, thresholds: PrefillThresholds, weights: ServiceWeights) -> None:
        self.thresholds = thresholds
        self.arbiter = ServiceArbiter(weights)
        self._queues: dict[WorkKind, list[tuple[float, int, SequenceState]]] = {k: [] for k in PREFILL_KINDS}
        self._depth = dict.fromkeys(PREFILL_KINDS, 0)
        self._counter = 0

    def depth(self, kind: WorkKind) -> int:
        """Live requests waiting in one prefill queue (000 §16 queue depth)."""
        return self._depth[kind]

    @property
    def total_depth(self) -> int:
        return sum(self._depth.values())

    def push(self, seq: SequenceState) -> WorkKind:
        """Queue a PrefillReady request; returns its class."""
        if seq.queue_token != -1:
            raise ValueError(f"{seq.request_id} is already queued")
        kind = self.thresholds.classify(seq.prompt_tokens)
        self._counter += 1
        seq.queue_token = self._counter
        heapq.heappush(self._queues[kind], (seq.virtual_finish, self._counter, seq))
        self._depth[kind] += 1
        return kind

    def discard(self, seq: SequenceState) -> None:
        """The request left PrefillReady without being popped (cancel, expiry); its heap item goes stale."""
        if seq.queue_token == -1:
            return
        seq.queue_token = -1
        self._depth[self.thresholds.classify(seq.prompt_tokens)] -= 1

    def next_kind(self, decode_ready: bool, *, long_ready: bool = True) -> WorkKind | None:
        """Who gets the next device opportunity (000 §6: decode:short:medium:long WRR). ``long_ready`` False:
        the long queue sits this one out (its in-flight quota is reached, 001 §9.3)."""
        eligible = [k for k in PREFILL_KINDS if self._depth[k] and (long_ready or k is not WorkKind.PREFILL_LONG)]
        if decode_ready:
            eligible.append(WorkKind.DECODE)
        return self.arbiter.pick(eligible)

    def pop(
        self, kind: WorkKind, now: float, generation: ModelGenerationId
    ) -> tuple[SequenceState | None, list[Dropped]]:
        """The next runnable request of one class, plus any it had to drop on the way (000 §7.2 rule 1)."""
        heap = self._queues[kind]
        dropped: list[Dropped] = []
        while heap:
            _, token, seq = heapq.heappop(heap)
            if seq.queue_token != token:
                continue  # stale: discarded earlier
            seq.queue_token = -1
            self._depth[kind] -= 1
            if seq.state is not RequestState.PREFILL_READY:
                raise InvariantViolation(f"{seq.request_id} is queued for prefill in state {seq.state.value}")
            if seq.deadline <= now:
                dropped.append(Dropped(seq, EndReason.DEADLINE, "deadline expired waiting for prefill"))
            elif seq.generation is not None and seq.generation != generation:
                dropped.append(
                    Dropped(seq, EndReason.GENERATION_RETIRED, f"generation {seq.generation} is not current")
                )
            else:
                return seq, dropped
        return None, dropped
