"""KvLaneManager: KV lanes as a transactional state machine (000 §9, 001 §9.1, §10.3).

Every lane (a runtime KV sequence slot, 000 §9.1 ``hardware_lane``) is in one
of the six states of 000 §9.1::

    Free -> Reserved          reserve(): admission took the lane and its token budget
    Reserved|Active -> Updating   begin_update(): a job that writes KV was submitted
    Updating -> Active        commit(): device *and* output succeeded (000 §9.2 rule 5)
    Updating -> Reserved|Active   rollback(): the job failed cleanly, nothing was written
    * -> Unknown              mark_unknown(): timeout / CCU fault, the lane's contents are unknown
    Reserved|Active -> Releasing  release(): the owner is done; the runtime must free the sequence
    Releasing -> Free         confirm_released(): the runtime confirmed the free (000 §9.2 rule 2)
    Unknown -> Free           recover(): only after an explicit device/generation recovery

"No room" is answered with ``None`` (as vLLM v1's KV manager does); every
exception is a bug or a broken invariant. :meth:`KvLaneManager.check_invariants`
checks every 000 §9.2 rule plus the token accounting.

Capacity is plain integers (max_sequences, max_kv_tokens, max_seq) computed by
``calctl.budget``; this module does not compute it, touch a device, or know
the KV layout. Of the 000 §9.3 context operations only append (through
begin_update/commit) and, when the runtime's RemoveTokensAtEnd boundary has
passed, remove-tail are offered; copy/keep/shift/save are deliberately absent.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from calctl.serving.core.enums import IdentityEnum
from calctl.serving.core.errors import InvariantViolation
from calctl.serving.core.ids import JobId, LaneId, ModelGenerationId, RequestId


class KvState(IdentityEnum):
    """000 §9.1 ``KvSequenceState``."""

    FREE = "Free"
    RESERVED = "Reserved"
    ACTIVE = "Active"
    UPDATING = "Updating"
    UNKNOWN = "Unknown"
    RELEASING = "Releasing"


@dataclass(frozen=True, slots=True)
class KvCapacity:
    """What the capacity plan allows one alias (000 §5.1, 001 §8)."""

    max_sequences: int  # lanes (runtime canAllocate(seq_num))
    max_kv_tokens: int  # total tokens across lanes the KV region holds
    max_seq: int  # tokens one lane may hold (graph max_seq / context)
    remove_tail: bool = False  # 000 §9.3: only once RemoveTokensAtEnd passed its boundary tests

    def __post_init__(self) -> None:
        for name in ("max_sequences", "max_kv_tokens", "max_seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"KvCapacity.{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True, slots=True)
class KvLaneView:
    """A read-only snapshot of one lane (000 §9.1 ``KvSequence``)."""

    lane: LaneId
    state: KvState
    owner: RequestId | None
    generation: ModelGenerationId | None
    committed_len: int
    reserved_len: int
    pending_tokens: int
    job: JobId | None


@dataclass(frozen=True, slots=True)
class KvStats:
    """Lane counts by state and token usage (000 §16 "KV" metrics)."""

    by_state: dict[KvState, int]
    reserved_tokens: int
    committed_tokens: int

    @property
    def free(self) -> int:
        return self.by_state.get(KvState.FREE, 0)


class _Lane:
    __slots__ = ("committed", "generation", "job", "lane", "owner", "pending", "reserved", "state")

    def __init__(self, lane: LaneId) -> None:
        self.lane = lane
        self.state = KvState.FREE
        self.owner: RequestId | None = None
        self.generation: ModelGenerationId | None = None
        self.committed = 0
        self.reserved = 0
        self.pending = 0
        self.job: JobId | None = None

    def view(self) -> KvLaneView:
        return KvLaneView(
            self.lane, self.state, self.owner, self.generation, self.committed, self.reserved, self.pending, self.job
        )


_HELD_WRITABLE = (KvState.RESERVED, KvState.ACTIVE)


class KvLaneManager:
    """Lane allocation and KV transactions for one alias (000 §9, 001 §9.1)."""

    def __init__(self, capacity: KvCapacity) -> None:
        self._cap = capacity
        self._lanes = [_Lane(LaneId(i)) for i in range(capacity.max_sequences)]
        self._free: list[int] = list(range(capacity.max_sequences))  # a heap: lowest lane first
        self._by_owner: dict[tuple[ModelGenerationId, RequestId], LaneId] = {}
        self._reserved_tokens = 0

    # -- reading -----------------------------------------------------------------------------

    @property
    def capacity(self) -> KvCapacity:
        return self._cap

    @property
    def free_lanes(self) -> int:
        return len(self._free)

    @property
    def reserved_tokens(self) -> int:
        return self._reserved_tokens

    def can_reserve(self, tokens: int) -> bool:
        """Would :meth:`reserve` of ``tokens`` succeed now."""
        return bool(self._free) and self._reserved_tokens + tokens <= self._cap.max_kv_tokens

    def lane(self, lane: LaneId) -> KvLaneView:
        return self._get(lane).view()

    def state(self, lane: LaneId) -> KvState:
        return self._get(lane).state

    def committed_len(self, lane: LaneId) -> int:
        return self._get(lane).committed

    def lane_of(self, generation: ModelGenerationId, owner: RequestId) -> LaneId | None:
        return self._by_owner.get((generation, owner))

    def lanes_in(self, state: KvState) -> list[LaneId]:
        return [ln.lane for ln in self._lanes if ln.state is state]

    def stats(self) -> KvStats:
        by_state: dict[KvState, int] = {}
        committed = 0
        for ln in self._lanes:
            by_state[ln.state] = by_state.get(ln.state, 0) + 1
            committed += ln.committed
        return KvStats(by_state=by_state, reserved_tokens=self._reserved_tokens, committed_tokens=committed)

    # -- allocation --------------------------------------------------------------------------

    def reserve(self, owner: RequestId, generation: ModelGenerationId, tokens: int) -> LaneId | None:
        """Take a Free lane and ``tokens`` of KV budget for ``owner``; None when there is no room.

        ``tokens`` is the request's whole need (prompt + max new tokens): the core
        never grows a reservation mid-decode, so an admitted request cannot run out
        of KV later (there is no preemption or KV swap, 000 §9.3).
        """
        if tokens < 1 or tokens > self._cap.max_seq:
            raise InvariantViolation(f"reserve({owner}): {tokens} tokens outside 1..max_seq={self._cap.max_seq}")
        key = (generation, owner)
        if key in self._by_owner:  # 000 §9.2 rule 1
            raise InvariantViolation(
                f"reserve({owner}): already holds lane {self._by_owner[key]} in generation {generation}"
            )
        if not self._free or self._reserved_tokens + tokens > self._cap.max_kv_tokens:
            return None
        ln = self._lanes[heapq.heappop(self._free)]
        ln.state = KvState.RESERVED
        ln.owner = owner
        ln.generation = generation
        ln.reserved = tokens
        self._reserved_tokens += tokens
        self._by_owner[key] = ln.lane
        return ln.lane

    # -- KV transactions (reserve -> submit -> commit/rollback, 001 §9.1) ----------------------

    def begin_update(self, lane: LaneId, job: JobId, position: int, tokens: int) -> None:
        """A job writing ``tokens`` at ``position`` was submitted: the lane becomes Updating."""
        ln = self._get(lane)
        self._check_update(ln, job, position, tokens)
        ln.state = KvState.UPDATING
        ln.pending = tokens
        ln.job = job

    def begin_decode_batch(self, job: JobId, lanes: Sequence[LaneId]) -> list[int]:
        """All-or-nothing one-token update of every lane of a decode batch at its committed length (000 §7.1).

        Returns the positions (== committed lengths, 000 §9.2 rule 4) in lane order.
        """
        n = len(self._lanes)
        recs = []
        for lane in lanes:
            if not 0 <= lane < n:
                raise InvariantViolation(f"lane {lane} does not exist (max_sequences={n})")
            ln = self._lanes[lane]
            if ln.state is not KvState.ACTIVE and ln.state is not KvState.RESERVED:
                raise InvariantViolation(f"lane {lane}: cannot submit a KV write in state {ln.state.value}")
            if ln.committed + 1 > ln.reserved:
                raise InvariantViolation(f"lane {lane}: a decode step at {ln.committed} overruns {ln.reserved}")
            recs.append(ln)
        if len({id(r) for r in recs}) != len(recs):
            raise InvariantViolation(f"job {job}: a lane appears twice in one batch")
        positions = []
        updating = KvState.UPDATING
        for ln in recs:
            ln.state = updating
            ln.pending = 1
            ln.job = job
            positions.append(ln.committed)
        return positions

    def begin_batch(self, job: JobId, items: Sequence[tuple[LaneId, int, int]]) -> None:
        """All-or-nothing :meth:`begin_update` for every (lane, position, tokens) of one batch job (000 §7.1)."""
        lanes = [self._get(lane) for lane, _, _ in items]
        if len({ln.lane for ln in lanes}) != len(lanes):
            raise InvariantViolation(f"job {job}: a lane appears twice in one batch")
        for ln, (_, position, tokens) in zip(lanes, items, strict=True):
            self._check_update(ln, job, position, tokens)
        for ln, (_, _, tokens) in zip(lanes, items, strict=True):
            ln.state = KvState.UPDATING
            ln.pending = tokens
            ln.job = job

    def commit(self, lane: LaneId, job: JobId) -> int:
        """Device and output succeeded: the pending tokens become committed (000 §9.2 rule 5). Returns the new length."""
        ln = self._get(lane)
        self._check_job(ln, job, "commit")
        ln.committed += ln.pending
        ln.pending = 0
        ln.job = None
        ln.state = KvState.ACTIVE
        return ln.committed

    def rollback(self, lane: LaneId, job: JobId) -> None:
        """The job failed cleanly (rejected, nothing written): drop the pending update."""
        ln = self._get(lane)
        self._check_job(ln, job, "rollback")
        ln.pending = 0
        ln.job = None
        ln.state = KvState.ACTIVE if ln.committed else KvState.RESERVED

    def mark_unknown(self, lane: LaneId) -> None:
        """Timeout or CCU fault: the lane's contents are unknown; it is quarantined until :meth:`recover` (rule 6)."""
        ln = self._get(lane)
        if ln.state is KvState.FREE:
            raise InvariantViolation(f"lane {lane}: a Free lane cannot become Unknown")
        ln.state = KvState.UNKNOWN
        ln.pending = 0
        ln.job = None

    def release(self, lane: LaneId) -> KvState:
        """The owner is done. Reserved/Active -> Releasing; an Unknown lane stays Unknown. Returns the new state."""
        ln = self._get(lane)
        if ln.state in _HELD_WRITABLE:
            ln.state = KvState.RELEASING
        elif ln.state is KvState.UPDATING:
            raise InvariantViolation(f"lane {lane}: release while job {ln.job} may still write it (drain first)")
        elif ln.state is not KvState.UNKNOWN:  # FREE or RELEASING
            raise InvariantViolation(f"lane {lane}: double release (state {ln.state.value})")
        return ln.state

    def confirm_released(self, lane: LaneId) -> None:
        """The runtime confirmed the sequence is freed: Releasing -> Free (000 §9.2 rule 2)."""
        ln = self._get(lane)
        if ln.state is not KvState.RELEASING:
            raise InvariantViolation(f"lane {lane}: confirm_released in state {ln.state.value}")
        self._to_free(ln)

    def recover(self, lane: LaneId) -> None:
        """Explicit recovery of an Unknown lane after the device/generation was reset: Unknown -> Free."""
        ln = self._get(lane)
        if ln.state is not KvState.UNKNOWN:
            raise InvariantViolation(f"lane {lane}: recover in state {ln.state.value}")
        self._to_free(ln)

    def remove_tail(self, lane: LaneId, tokens: int) -> int:
        """RemoveTokensAtEnd (000 §9.3), only when the capacity says the runtime supports it. Returns the new length."""
        if not self._cap.remove_tail:
            raise InvariantViolation("remove_tail is disabled until RemoveTokensAtEnd passes its boundary tests")
        ln = self._get(lane)
        if ln.state is not KvState.ACTIVE or not 1 <= tokens <= ln.committed:
            raise InvariantViolation(
                f"lane {lane}: remove_tail({tokens}) in state {ln.state.value} with {ln.committed} committed"
            )
        ln.committed -= tokens
        if ln.committed == 0:
            ln.state = KvState.RESERVED
        return ln.committed

    # -- invariants (000 §9.2) ---------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise :class:`InvariantViolation` naming the first broken 000 §9.2 rule or accounting identity
        (the rules are the small checks at the end of this module, one per rule, run in table order)."""
        if len(set(self._free)) != len(self._free):
            raise InvariantViolation("a lane is on the free list twice")
        walk = _LaneWalk(self._cap, frozenset(self._free))
        for ln in self._lanes:
            rules = _FREE_LANE_RULES if ln.state is KvState.FREE else _HELD_LANE_RULES
            for rule in rules:
                broken = rule(ln, walk)
                if broken is not None:
                    raise InvariantViolation(f"lane {ln.lane} ({ln.state.value}): {broken}")
            if ln.state is not KvState.FREE:
                walk.count(ln)
        for ledger_rule in _LEDGER_RULES:
            broken = ledger_rule(self, walk)
            if broken is not None:
                raise InvariantViolation(broken)

    # -- internals ---------------------------------------------------------------------------

    def _get(self, lane: LaneId) -> _Lane:
        if not 0 <= lane < len(self._lanes):
            raise InvariantViolation(f"lane {lane} does not exist (max_sequences={len(self._lanes)})")
        return self._lanes[lane]

    def _check_update(self, ln: _Lane, job: JobId, position: int, tokens: int) -> None:
        if ln.state not in _HELD_WRITABLE:
            raise InvariantViolation(f"lane {ln.lane}: cannot submit a KV write in state {ln.state.value}")
        if position != ln.committed:  # 000 §9.2 rule 4
            raise InvariantViolation(f"lane {ln.lane}: position {position} != committed length {ln.committed}")
        if tokens < 1 or ln.committed + tokens > ln.reserved:
            raise InvariantViolation(
                f"lane {ln.lane}: writing {tokens} tokens at {ln.committed} overruns the reservation {ln.reserved}"
            )

    def _check_job(self, ln: _Lane, job: JobId, what: str) -> None:
        if ln.state is not KvState.UPDATING or ln.job != job:
            raise InvariantViolation(f"lane {ln.lane}: {what} for job {job} but lane is {ln.state.value}/{ln.job}")

    def _to_free(self, ln: _Lane) -> None:
        assert ln.owner is not None and ln.generation is not None
        del self._by_owner[(ln.generation, ln.owner)]
        self._reserved_tokens -= ln.reserved
        ln.state = KvState.FREE
        ln.owner = None
        ln.generation = None
        ln.committed = ln.reserved = ln.pending = 0
        ln.job = None
        heapq.heappush(self._free, ln.lane)

    def holders(self) -> Iterable[KvLaneView]:
        """Views of every non-Free lane."""
        return [ln.view() for ln in self._lanes if ln.state is not KvState.FREE]


# -- the invariants, one small check per rule (000 §9.1, §9.2) ---------------------------------------------
# Each says how the lane (or the manager) breaks its rule, or None; check_invariants runs the tables in order.


@dataclass
class _LaneWalk:
    """What :meth:`KvLaneManager.check_invariants` gathers over the held lanes, for the manager-wide rules."""

    cap: KvCapacity
    free: frozenset[int]  # the free list (lane numbers)
    owners: dict[tuple[ModelGenerationId, RequestId], LaneId] = field(default_factory=dict)
    reserved: int = 0

    def count(self, ln: _Lane) -> None:
        assert ln.owner is not None and ln.generation is not None  # _held_lane_has_an_owner ran first
        self.owners[(ln.generation, ln.owner)] = ln.lane
        self.reserved += ln.reserved


def _free_lane_is_free_listed(ln: _Lane, walk: _LaneWalk) -> str | None:
    """000 §9.2 rule 2: a Free lane is what the free list hands out."""
    return None if ln.lane in walk.free else "Free but not on the free list"


def _free_lane_is_blank(ln: _Lane, walk: _LaneWalk) -> str | None:
    """000 §9.2 rule 2: a lane is reused only once its old sequence is gone (no owner, no lengths)."""
    if ln.owner is not None or ln.generation is not None or ln.committed or ln.reserved or ln.pending:
        return "Free lane still carries an owner or lengths"
    return None


def _free_lane_is_untagged(ln: _Lane, walk: _LaneWalk) -> str | None:
    """000 §9.2 rule 5: only an Updating lane carries a job."""
    return None if ln.job is None else f"Free lane still tagged with job {ln.job}"


def _held_lane_is_not_free_listed(ln: _Lane, walk: _LaneWalk) -> str | None:
    """000 §9.2 rules 2 and 6: a held or Unknown lane is never handed out."""
    return "on the free list while held" if ln.lane in walk.free else None


def _held_lane_has_an_owner(ln: _Lane, walk: _LaneWalk) -> str | None:
    """000 §9.1: a held lane belongs to one request of one generation."""
    return "held lane without owner/generation" if ln.owner is None or ln.generation is None else None


def _lengths_are_ordered(ln: _Lane, walk: _LaneWalk) -> str | None:
    """000 §9.2 rule 3: committed_len <= reserved_len <= max_seq."""
    if 0 <= ln.committed <= ln.reserved <= walk.cap.max_seq:
        return None
    return f"committed {ln.committed} <= reserved {ln.reserved} <= max_seq {walk.cap.max_seq} broken"


def _pending_fits_the_reservation(ln: _Lane, walk: _LaneWalk) -> str | None:
    """000 §9.2 rules 3 and 5: the write in flight ends within the reservation."""
    return f"pending {ln.pending} would overrun the reservation" if ln.committed + ln.pending > ln.reserved else None


def _updating_iff_a_job_writes(ln: _Lane, walk: _LaneWalk) -> str | None:
    """000 §9.2 rule 5: Updating exactly while a submitted job has tokens pending."""
    if (ln.state is KvState.UPDATING) != (ln.job is not None and ln.pending > 0):
        return f"job={ln.job} pending={ln.pending} inconsistent with state"
    return None


def _reserved_lane_is_empty(ln: _Lane, walk: _LaneWalk) -> str | None:
    """000 §9.1 Reserved: the budget is taken, nothing is written yet."""
    if ln.state is KvState.RESERVED and ln.committed:
        return f"Reserved lane with {ln.committed} committed tokens"
    return None


def _active_lane_has_tokens(ln: _Lane, walk: _LaneWalk) -> str | None:
    """000 §9.1 Active (§9.2 rule 5): a lane is Active once a commit added tokens."""
    return "Active lane with nothing committed" if ln.state is KvState.ACTIVE and not ln.committed else None


def _one_lane_per_owner(ln: _Lane, walk: _LaneWalk) -> str | None:
    """000 §9.2 rule 1: one seq_id maps to one lane within a generation."""
    assert ln.owner is not None and ln.generation is not None  # _held_lane_has_an_owner ran first
    other = walk.owners.get((ln.generation, ln.owner))
    return None if other is None else f"{ln.owner} also holds lane {other} in one generation"


def _owner_index_agrees(kv: KvLaneManager, walk: _LaneWalk) -> str | None:
    """000 §9.2 rule 1: the owner index is exactly the held lanes' owners."""
    return None if walk.owners == kv._by_owner else "owner index disagrees with the lanes"


def _reserved_counter_agrees(kv: KvLaneManager, walk: _LaneWalk) -> str | None:
    """000 §5.1 ``max_kv_tokens`` accounting: the counter admission reads is the sum over the lanes."""
    if walk.reserved != kv._reserved_tokens:
        return f"reserved token counter {kv._reserved_tokens} != sum over lanes {walk.reserved}"
    return None


def _reserved_within_capacity(kv: KvLaneManager, walk: _LaneWalk) -> str | None:
    """000 §5.1: the lanes never reserve more tokens than ``max_kv_tokens``."""
    if walk.reserved > walk.cap.max_kv_tokens:
        return f"{walk.reserved} reserved tokens exceed max_kv_tokens {walk.cap.max_kv_tokens}"
    return None


#: Run in this order on each lane by its state; the first broken rule is the one reported.
_FREE_LANE_RULES = (_free_lane_is_free_listed, _free_lane_is_blank, _free_lane_is_untagged)
_HELD_LANE_RULES = (
    _held_lane_is_not_free_listed,
    _held_lane_has_an_owner,
    _lengths_are_ordered,
    _pending_fits_the_reservation,
    _updating_iff_a_job_writes,
    _reserved_lane_is_empty,
    _active_lane_has_tokens,
    _one_lane_per_owner,
)
#: Then over the whole manager, once every lane passed.
_LEDGER_RULES = (_owner_index_agrees, _reserved_counter_agrees, _reserved_within_capacity)
