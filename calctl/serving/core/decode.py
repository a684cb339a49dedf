"""DecodeScheduler: batch profiles, lane selection, batching window, inactive lanes (000 §7–§8).

* :class:`BatchProfile` is 000 §2's struct of the same name, reduced to what
  scheduling needs: the exact decode graph, its compiled batch B, its max_seq
  and its inactive-lane contract. ``compiled_batch`` comes from the validated
  package, never from configuration (000 §2).
* A B>1 profile is refused (:class:`ProfileRefused`) unless it carries an
  explicit :class:`InactiveLaneContract` whose inactive lanes do not write KV:
  unused lanes are never padded with token 0 by default (000 §7.3).
* Selection follows 000 §7.2: (1) skip cancelled, expired and wrong-generation
  requests; (2) earliest deadline first, equal deadlines by WFQ virtual finish;
  (3) at most ``max_tenant_lane_share`` of the lanes per tenant unless no other
  candidate exists; (4) an optional batching window that always fires and
  never holds past the earliest deadline; (5) partial batches at low load.
* The profile is chosen from the ready count and per-profile thresholds, only
  among the profiles given (the package's, intersected with configuration, 000
  §8). Default thresholds are the 000 §8 example: B16 at 12 ready, B8 at 6, B4
  at 3 (``ceil(0.75 * B)``), B1 always.

Ready requests live in one heap per tenant; a tick merges the tenant heads, so
it costs O(B log T + T) for T tenants with ready work, not a sort of the queue.

This module does not reserve KV or move request states; the scheduler does
both after :meth:`DecodeScheduler.take`. Hardware capability for B4/B8/B16 is
C3 (000 §1): this is scheduling logic, not evidence that such profiles work.
"""

from __future__ import annotations

import collections
import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from calctl.serving.core.errors import InvariantViolation, ProfileRefused
from calctl.serving.core.ids import JobId, LaneId, ModelGenerationId, RequestId, TenantId
from calctl.serving.core.prefill import Dropped
from calctl.serving.core.request import EndReason, RequestState, SequenceState


@dataclass(frozen=True, slots=True)
class InactiveLaneContract:
    """What the vendor profile says about lanes with no sequence (000 §7.3, §20).

    ``valid_mask_input`` names the valid-mask tensor / CSR field the graph reads
    (the package's ``inactive_lane_policy.mask_input``). ``writes_kv`` must be
    False for the profile to be usable; ``returns_logits`` says whether inactive
    lanes produce logits (discarded either way); ``kv_mode`` is the KV manager
    mode the contract names. The token and position written into an inactive
    lane are ``pad_token_id`` / ``pad_position`` when the contract declares them;
    otherwise the lane mirrors lane 0's token and position, which is always an
    in-vocabulary value and never an implicit token 0.
    """

    valid_mask_input: str
    writes_kv: bool = False
    returns_logits: bool = True
    kv_mode: str | None = None
    pad_token_id: int | None = None
    pad_position: int | None = None


@dataclass(frozen=True, slots=True)
class BatchProfile:
    """One compiled decode profile (000 §2 ``BatchProfile``)."""

    graph: str  # exact decode graph name in the package (no fuzzy matching, 001 §10.4)
    compiled_batch: int
    max_seq: int
    inactive_lanes: InactiveLaneContract | None = None

    @property
    def name(self) -> str:
        return f"B{self.compiled_batch}"


def check_profile(profile: BatchProfile) -> None:
    """Refuse a profile the core cannot drive safely (000 §7.3)."""
    if profile.compiled_batch < 1 or profile.max_seq < 2:
        raise ProfileRefused(
            f"{profile.graph}: compiled batch {profile.compiled_batch} / max_seq {profile.max_seq} out of range"
        )
    if profile.compiled_batch == 1:
        return
    contract = profile.inactive_lanes
    if contract is None:
        raise ProfileRefused(
            f"{profile.graph}: profile {profile.name} declares no inactive-lane mask contract; "
            "a B>1 profile without one cannot become Ready (000 §7.3)"
        )
    if contract.writes_kv:
        raise ProfileRefused(
            f"{profile.graph}: profile {profile.name} says inactive lanes write KV; they would corrupt live "
            "sequences (000 §7.3, §18)"
        )
    if not contract.valid_mask_input:
        raise ProfileRefused(f"{profile.graph}: profile {profile.name} names no valid-mask input (000 §7.3)")


@dataclass(frozen=True, slots=True)
class BatchLane:
    """One active lane of a decode batch."""

    index: int  # lane index inside the batch, 0..B-1
    request_id: RequestId
    kv_lane: LaneId
    token_id: int
    position: int  # == the KV lane's committed length (000 §9.2 rule 4)


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """One decode job's host-side inputs (000 §2 ``DecodeBatch``), laid out like the device tensors.

    ``request_ids``/``kv_lanes`` describe the active lanes 0..n-1; ``token_ids``,
    ``positions`` and ``lane_valid`` have one entry per compiled lane (length B).
    """

    job_id: JobId
    generation: ModelGenerationId
    profile: BatchProfile
    request_ids: tuple[RequestId, ...]
    kv_lanes: tuple[LaneId, ...]
    token_ids: tuple[int, ...]
    positions: tuple[int, ...]
    lane_valid: tuple[bool, ...]

    @property
    def fill_ratio(self) -> float:
        return len(self.request_ids) / self.profile.compiled_batch

    @property
    def lanes(self) -> tuple[BatchLane, ...]:
        """The active lanes as records (built on demand; the hot path uses the tuples)."""
        return tuple(
            BatchLane(i, rid, kv, self.token_ids[i], self.positions[i])
            for i, (rid, kv) in enumerate(zip(self.request_ids, self.kv_lanes, strict=True))
        )

    @classmethod
    def build(
        cls,
        job_id: JobId,
        generation: ModelGenerationId,
        profile: BatchProfile,
        request_ids: Sequence[RequestId],
        kv_lanes: Sequence[LaneId],
        token_ids: Sequence[int],
        positions: Sequence[int],
    ) -> DecodeBatch:
        """Bind requests to lanes 0..n-1 and apply the inactive-lane contract (000 §7.1)."""
        b = profile.compiled_batch
        n = len(request_ids)
        if not 1 <= n <= b or not n == len(kv_lanes) == len(token_ids) == len(positions):
            raise InvariantViolation(f"{profile.name}: {n} active lanes / inconsistent lane arrays")
        limit = profile.max_seq - 1
        for rid, position in zip(request_ids, positions, strict=True):
            if position > limit:  # 000 §7.1 validate_generation_and_length
                raise InvariantViolation(f"{rid}: position {position} is past {profile.name} max_seq {profile.max_seq}")
        tokens = list(token_ids)
        pos = list(positions)
        valid = [True] * n
        if n < b:
            contract = profile.inactive_lanes
            if contract is None:  # check_profile makes this unreachable for B>1
                raise InvariantViolation(f"{profile.name}: inactive lanes without a contract")
            pad = b - n
            tokens.extend([tokens[0] if contract.pad_token_id is None else contract.pad_token_id] * pad)
            pos.extend([pos[0] if contract.pad_position is None else contract.pad_position] * pad)
            valid.extend([False] * pad)
        return cls(
            job_id, generation, profile, tuple(request_ids), tuple(kv_lanes), tuple(tokens), tuple(pos), tuple(valid)
        )


@dataclass(frozen=True, slots=True)
class DecodePoll:
    """Whether to run a decode batch now: ``profile`` set = fire; else ``wake_at`` set = hold until then."""

    profile: BatchProfile | None
    wake_at: float | None = None


@dataclass(frozen=True, slots=True)
class DecodeSelection:
    """The outcome of one tick's selection."""

    profile: BatchProfile
    selected: tuple[SequenceState, ...]
    dropped: tuple[Dropped, ...]


def default_threshold(compiled_batch: int) -> int:
    """000 §8 example thresholds: 12 for B16, 6 for B8, 3 for B4, 1 for B1."""
    return 1 if compiled_batch == 1 else math.ceil(0.75 * compiled_batch)


#: How many recent decode steps the window's step estimate looks at (it takes the slowest of them).
_STEP_WINDOW = 32

_Item = tuple[float, float, int, SequenceState]  # (deadline key, virtual finish, token, seq)


#: 000 §8 rule 3: the share of a profile's lanes one tenant may hold while another waits. The one default: the
#: scheduler, its settings and the config (``batch.max_tenant_lane_share``) all take it from here.
DEFAULT_MAX_TENANT_LANE_SHARE = 0.5


class DecodeScheduler:
    """The DecodeReady queue and batch selection for one alias (000 §7–§8)."""

    def __init__(
        self,
        profiles: Sequence[BatchProfile],
        *,
        thresholds: Mapping[int, int] | None = None,
        batching_window_s: float = 0.0,
        max_tenant_lane_share: float = DEFAULT_MAX_TENANT_LANE_SHARE,
        deadline_granularity_s: float = 0.0,
        step_estimate_s: float = 0.0,
    ) -> None:
        if not profiles:
            raise ProfileRefused("no decode batch profile to serve with (000 §8)")
        by_batch: dict[int, BatchProfile] = {}
        for p in profiles:
            check_profile(p)
            if p.compiled_batch in by_batch:
                raise ProfileRefused(
                    f"profile {p.name} is declared by two graphs ({by_batch[p.compiled_batch].graph}, {p.graph})"
                )
            by_batch[p.compiled_batch] = p
        for b, th in (thresholds or {}).items():
            if b not in by_batch:
                raise ProfileRefused(
                    f"a threshold is configured for profile B{b}, which the package does not provide "
                    f"(available: {sorted(by_batch)})"
                )
            if th < 1:
                raise ProfileRefused(f"threshold for B{b} must be >= 1, got {th}")
        if batching_window_s < 0 or step_estimate_s < 0 or deadline_granularity_s < 0:
            raise ValueError("batching window, step estimate and deadline granularity must be >= 0")
        if not 0 < max_tenant_lane_share <= 1:
            raise ValueError(f"max_tenant_lane_share must be in (0, 1], got {max_tenant_lane_share}")
        self.profiles: tuple[BatchProfile, ...] = tuple(sorted(by_batch.values(), key=lambda p: p.compiled_batch))
        self._by_desc = tuple(
            (p, (thresholds or {}).get(p.compiled_batch, default_threshold(p.compiled_batch)))
            for p in reversed(self.profiles)
        )
        self.batching_window_s = batching_window_s
        self.max_tenant_lane_share = max_tenant_lane_share
        self.deadline_granularity_s = deadline_granularity_s
        self.step_estimate_s = step_estimate_s  # the configured floor (batch.step_estimate_floor_us)
        self._steps: collections.deque[float] = collections.deque(maxlen=_STEP_WINDOW)
        self._caps = {p.compiled_batch: max(1, int(max_tenant_lane_share * p.compiled_batch)) for p in self.profiles}
        self._heaps: dict[TenantId, list[_Item]] = {}
        self._ready = 0
        self._counter = 0
        self._window_open: float | None = None

    # -- queue ---------------------------------------------------------------------------------

    @property
    def ready_count(self) -> int:
        return self._ready

    @property
    def window_opened_at(self) -> float | None:
        """When the oldest ready lane started waiting for a batch (None: nothing ready), 000 §16 batch wait."""
        return self._window_open

    def push(self, seq: SequenceState, now: float) -> None:
        """Queue a request that just entered DecodeReady."""
        if seq.queue_token != -1:
            raise InvariantViolation(f"{seq.request_id} is already queued")
        g = self.deadline_granularity_s
        key = math.floor(seq.deadline / g) if g > 0 and math.isfinite(seq.deadline) else seq.deadline
        self._counter += 1
        seq.queue_token = self._counter
        heap = self._heaps.get(seq.tenant)
        if heap is None:
            heap = self._heaps[seq.tenant] = []
        heapq.heappush(heap, (key, seq.virtual_finish, self._counter, seq))
        if self._ready == 0:
            self._window_open = now
        self._ready += 1

    def discard(self, seq: SequenceState) -> None:
        """The request left DecodeReady without being taken (cancel, expiry, failure)."""
        if seq.queue_token == -1:
            return
        seq.queue_token = -1
        self._ready -= 1
        if self._ready == 0:
            self._window_open = None

    # -- profile and window (000 §7.2 rules 4–5, §8) --------------------------------------------

    def observe_step(self, seconds: float) -> None:
        """One decode job's measured submit-to-completion time (the window's step estimate, rule 4)."""
        if seconds >= 0 and math.isfinite(seconds):
            self._steps.append(seconds)

    @property
    def measured_step_s(self) -> float | None:
        """The slowest of the last :data:`_STEP_WINDOW` measured decode steps, or None before the first."""
        return max(self._steps) if self._steps else None

    @property
    def step_estimate(self) -> float | None:
        """What the window reserves for the step that serves the earliest deadline: the measured step time,
        never below the configured floor; None when neither is known (then the window does not hold)."""
        measured = self.measured_step_s
        if measured is None:
            return self.step_estimate_s if self.step_estimate_s > 0 else None
        return max(measured, self.step_estimate_s)

    def select_profile(self, ready: int) -> BatchProfile:
        """The largest profile whose threshold the ready count meets; else the smallest (partial batch)."""
        for profile, threshold in self._by_desc:
            if ready >= threshold:
                return profile
        return self.profiles[0]

    def poll(self, now: float) -> DecodePoll:
        """Fire now, hold until ``wake_at``, or nothing ready (both fields None)."""
        if self._ready == 0:
            return DecodePoll(None)
        profile = self.select_profile(self._ready)
        if self._ready >= profile.compiled_batch or self.batching_window_s <= 0:
            return DecodePoll(profile)
        opened = self._window_open if self._window_open is not None else now
        fire_at = opened + self.batching_window_s  # rule 4: the window always fires
        earliest = self._earliest_deadline()
        if earliest is not None:  # ... and never holds the earliest deadline past its point of no return
            step = self.step_estimate
            if step is None:  # no step measured and no floor configured: holding could cost the deadline
                return DecodePoll(profile)
            fire_at = min(fire_at, earliest - self.deadline_granularity_s - step)
        if now >= fire_at:
            return DecodePoll(profile)
        return DecodePoll(None, fire_at)

    # -- selection (000 §7.2 rules 1–3) ---------------------------------------------------------

    def take(self, profile: BatchProfile, now: float, generation: ModelGenerationId) -> DecodeSelection:
        """Remove up to B runnable requests from the queue, in 000 §7.2 order."""
        b = profile.compiled_batch
        cap = self._caps[b]
        selected: list[SequenceState] = []
        dropped: list[Dropped] = []
        per_tenant: dict[TenantId, int] = {}
        capped: list[TenantId] = []
        heaps = self._heaps
        pop, push = heapq.heappop, heapq.heappush
        ready = RequestState.DECODE_READY
        heads = [(h[0][0], h[0][1], h[0][2], t) for t, h in heaps.items() if h]
        heapq.heapify(heads)
        relaxed = False
        taken = 0
        while len(selected) < b:
            if not heads:
                if relaxed or not capped:
                    break
                # Rule 3 "unless no other candidate": only capped tenants remain, lift the cap.
                relaxed = True
                heads = [(heaps[t][0][0], heaps[t][0][1], heaps[t][0][2], t) for t in capped if heaps.get(t)]
                heapq.heapify(heads)
                continue
            t = pop(heads)[3]
            heap = heaps[t]
            _, _, token, seq = pop(heap)
            if seq.queue_token == token:
                seq.queue_token = -1
                taken += 1
                if seq.state is not ready:
                    raise InvariantViolation(f"{seq.request_id} is queued for decode in state {seq.state.value}")
                if seq.deadline <= now:  # rule 1
                    dropped.append(Dropped(seq, EndReason.DEADLINE, "deadline expired waiting for decode"))
                elif seq.generation != generation:  # rule 1
                    dropped.append(
                        Dropped(seq, EndReason.GENERATION_RETIRED, f"generation {seq.generation} is not current")
                    )
                else:
                    selected.append(seq)
                    per_tenant[t] = per_tenant.get(t, 0) + 1
            if heap:
                if not relaxed and per_tenant.get(t, 0) >= cap:
                    capped.append(t)
                else:
                    item = heap[0]
                    push(heads, (item[0], item[1], item[2], t))
            else:
                del heaps[t]
        self._ready -= taken
        self._window_open = now if self._ready else None
        return DecodeSelection(profile, tuple(selected), tuple(dropped))

    def _earliest_deadline(self) -> float | None:
        best: float | None = None
        for heap in self._heaps.values():
            # The head holds the tenant's earliest deadline (up to the granularity); a stale
            # head can only make the hold shorter, never longer.
            if heap:
                d = heap[0][3].deadline
                if best is None or d < best:
                    best = d
        return best
