"""AdmissionController: budgets, per-tenant quotas, deadlines and the WFQ waiting queue (000 §5, 001 §9.2).

Admission is two-phase so a burst can never slip past a cap:

1. :meth:`AdmissionController.arrive` runs at arrival, *before* any expensive
   work (tokenisation): it checks availability and atomically takes a waiting
   slot (``max_waiting_requests``) and a QPS token. The slot is a reservation
   held by a :class:`Ticket`.
2. :meth:`AdmissionController.decide` runs once the prompt is counted: it
   validates, stamps WFQ tags and either admits (taking the KV lane from the
   :class:`~calctl.serving.core.kv.KvLaneManager`), queues, or rejects.

Every path that does not end in admission rolls the reservation back through
one function (``_release``): rejection in ``decide``, :meth:`abandon` (client
gone, tokenizer error), cancel while queued, deadline expiry, model drain. A
known failure elsewhere was a queue cap checked before an ``await`` and counted
after it; here check and count happen in the same call.

Results are the five of 000 §5.2 with reasons that state the numbers. Queued
requests wait in one FIFO per tenant; each tenant's head carries its WFQ tags
(000 §5.3, :mod:`.fairness`), computed when it becomes the head so that the
credit from an early finish applies to the very next request, and heads are
promoted in virtual-finish order. The chosen head waits for room rather than
being overtaken by smaller requests, so long requests cannot starve; a tenant
at its active-sequence cap steps aside without blocking the others.

Where a 429 comes from: here. Every ``REJECT_CAPACITY`` is decided in this
module (a tenant's QPS in ``arrive``, a full waiting queue or the long-prefill
quota in ``decide``, a deadline that expired while queued); :data:`END_OF_REFUSAL`
is the one table of what each refusal means. :mod:`calctl.serving.outcomes` only
gives it its number (``RejectCode.CAPACITY`` -> 429) and the engine's admission
front only delivers it.

This module does not release KV lanes (the scheduler does, after the device
drains), does not run timers (``now`` is an argument) and knows nothing of HTTP
beyond the status code each decision maps to.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from calctl.serving.core.enums import IdentityEnum
from calctl.serving.core.errors import InvariantViolation
from calctl.serving.core.fairness import FairTag, WeightedFairness
from calctl.serving.core.ids import LaneId, ModelGenerationId, RequestId, TenantId
from calctl.serving.core.kv import KvLaneManager
from calctl.serving.core.request import EndReason


class ModelState(IdentityEnum):
    """000 §10 ``ModelState`` of the generation an alias serves (001 §11.1)."""

    UNLOADED = "Unloaded"
    VALIDATING = "Validating"
    CONFIGURING = "Configuring"
    WARMING = "Warming"
    READY = "Ready"
    DRAINING = "Draining"
    UNLOADING = "Unloading"
    RECOVERING = "Recovering"
    FAILED = "Failed"


# Loading states: a request may wait for the model (WaitingModel) within its deadline.
LOADING_STATES = frozenset({ModelState.VALIDATING, ModelState.CONFIGURING, ModelState.WARMING})
# 000 §5.2 RejectUnavailable: "model draining/recovering/failed" (and nothing loaded at all).
UNAVAILABLE_STATES = frozenset(
    {ModelState.UNLOADED, ModelState.DRAINING, ModelState.UNLOADING, ModelState.RECOVERING, ModelState.FAILED}
)
# States in which waiting requests are withdrawn (000 §12: "cancel waiting requests").
# RECOVERING keeps them: the queue may still be served within its deadlines.
WITHDRAW_STATES = frozenset({ModelState.UNLOADED, ModelState.DRAINING, ModelState.UNLOADING, ModelState.FAILED})


class AdmissionDecision(enum.Enum):
    """000 §5.2 admission results."""

    ADMIT = "admit"  # -> PrefillReady
    QUEUE = "queue"  # keeps waiting; there is hope before the deadline
    REJECT_INVALID = "reject_invalid"  # RejectInvalid: prompt / total context out of range
    REJECT_CAPACITY = "reject_capacity"  # RejectCapacity: queue / token budget full
    REJECT_UNAVAILABLE = "reject_unavailable"  # RejectUnavailable: model draining / recovering / failed

    # The HTTP status of each is in calctl.serving.outcomes, not here: the core knows no protocol.

    @property
    def accepted(self) -> bool:
        return self in (AdmissionDecision.ADMIT, AdmissionDecision.QUEUE)


#: A refusing decision -> how the request ends (000 §5.2); calctl.serving.outcomes maps that ending to its HTTP
#: rejection, so this is the one table from a refusal to what the client hears.
END_OF_REFUSAL: dict[AdmissionDecision, EndReason] = {
    AdmissionDecision.REJECT_INVALID: EndReason.REJECTED_INVALID,
    AdmissionDecision.REJECT_CAPACITY: EndReason.REJECTED_CAPACITY,
    AdmissionDecision.REJECT_UNAVAILABLE: EndReason.REJECTED_UNAVAILABLE,
}


@dataclass(frozen=True, slots=True)
class AdmissionResult:
    """One admission decision; ``reason`` states the numbers that decided it."""

    decision: AdmissionDecision
    reason: str
    retry_after_s: float | None = None  # a hint for 429/503 (Retry-After)
    lane: LaneId | None = None  # ADMIT: the KV lane reserved for the request
    deadline: float | None = None  # ADMIT/QUEUE: absolute monotonic deadline
    virtual_finish: float | None = None  # ADMIT/QUEUE: the WFQ tag (000 §5.3)
    # REJECT_INVALID: the request input that is out of range: "prompt" (alone it leaves no room for one
    # output token), "max_tokens" (the prompt fits, the asked-for output does not) or "timeout".
    field: str | None = None


@dataclass(frozen=True, slots=True)
class CapacityBudget:
    """000 §5.1 ``CapacityBudget`` of one alias (its engine core)."""

    max_sequences: int
    max_kv_tokens: int
    max_waiting_requests: int
    max_waiting_prompt_tokens: int
    max_inflight_jobs: int

    def __post_init__(self) -> None:
        for name in (
            "max_sequences",
            "max_kv_tokens",
            "max_waiting_requests",
            "max_waiting_prompt_tokens",
            "max_inflight_jobs",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"CapacityBudget.{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """Per-tenant weight and quotas, from configuration only (000 §5.3)."""

    weight: float = 1.0
    max_active_sequences: int | None = None
    max_waiting_tokens: int | None = None
    qps: float | None = None
    burst: float | None = None  # token-bucket depth; defaults to max(1, qps)

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"tenant weight must be > 0, got {self.weight!r}")
        for name in ("max_active_sequences", "max_waiting_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"tenant {name} must be >= 1, got {value!r}")
        if self.qps is not None and not self.qps > 0:
            raise ValueError(f"tenant qps must be > 0, got {self.qps!r}")


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """Fixed admission parameters of one alias (000 §5, §15 ``admission``; 001 §9.2)."""

    context_limit: int  # prompt + max_tokens must fit (model context, graph max_seq, config)
    deadline_default_s: float  # the server default; a client may only lower it
    decode_weight: float = 1.0  # 000 §5.3 cost = prompt + decode_weight * output
    retry_after_s: float = 1.0  # Retry-After hint for a full queue
    unavailable_retry_after_s: float = 5.0  # Retry-After hint while draining / recovering
    tenants: Mapping[TenantId, TenantPolicy] = field(default_factory=dict)
    default_tenant: TenantPolicy = TenantPolicy()  # for a tenant the configuration does not name

    def __post_init__(self) -> None:
        if self.context_limit < 1:
            raise ValueError(f"context_limit must be >= 1, got {self.context_limit}")
        if not self.deadline_default_s > 0:
            raise ValueError(f"deadline_default_s must be > 0, got {self.deadline_default_s}")

    def tenant(self, tenant: TenantId) -> TenantPolicy:
        return self.tenants.get(tenant, self.default_tenant)


@dataclass(frozen=True, slots=True)
class Ticket:
    """Proof that :meth:`AdmissionController.arrive` reserved a waiting slot for this request."""

    request_id: RequestId
    tenant: TenantId
    arrived_at: float


@dataclass(frozen=True, slots=True)
class Admission:
    """A queued request promoted to PrefillReady."""

    request_id: RequestId
    lane: LaneId
    deadline: float
    virtual_finish: float


@dataclass(frozen=True, slots=True)
class AdmissionStats:
    """Gauges for 000 §16 "admission"."""

    waiting_requests: int
    queued_requests: int
    waiting_prompt_tokens: int
    admitted: int
    active_by_tenant: dict[TenantId, int]
    waiting_tokens_by_tenant: dict[TenantId, int]


class TokenBucket:
    """A token bucket driven by an explicit clock (per-tenant QPS, 000 §5.3)."""

    __slots__ = ("burst", "last", "rate", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.last = now

    def take(self, now: float) -> float:
        """Take one token. Returns 0.0 on success, else the seconds until one is available."""
        if now > self.last:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class _Phase(enum.Enum):
    ARRIVED = "arrived"  # holds a waiting slot, prompt not counted yet
    QUEUED = "queued"  # waiting in its tenant's FIFO; the tenant's head carries the WFQ tag
    ADMITTED = "admitted"  # holds a KV lane and a tenant active-sequence slot


class _Entry:
    __slots__ = ("arrived_at", "deadline", "max_tokens", "phase", "prompt", "request_id", "tag", "tenant")

    def __init__(self, request_id: RequestId, tenant: TenantId, arrived_at: float, deadline: float) -> None:
        self.request_id = request_id
        self.tenant = tenant
        self.arrived_at = arrived_at
        self.phase = _Phase.ARRIVED
        self.prompt = 0
        self.max_tokens = 0
        self.deadline = deadline
        self.tag: FairTag | None = None  # set when admitted directly or when it becomes its tenant's head


class _TenantState:
    __slots__ = ("active", "bucket", "fifo", "head", "head_token", "policy", "tenant", "waiting_tokens")

    def __init__(self, tenant: TenantId, policy: TenantPolicy) -> None:
        self.tenant = tenant
        self.policy = policy
        self.active = 0
        self.waiting_tokens = 0
        self.bucket: TokenBucket | None = None
        self.fifo: deque[_Entry] = deque()  # QUEUED entries in arrival order (dead ones skipped lazily)
        self.head: _Entry | None = None  # the tagged head of the FIFO, competing in the WFQ
        self.head_token = -1  # identifies the head's live item in the heads heap; -1 = not offered

    def capped(self) -> bool:
        cap = self.policy.max_active_sequences
        return cap is not None and self.active >= cap


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


class AdmissionController:
    """Admission for one alias: 000 §5.1 budget, §5.2 results, §5.3 fairness; 001 §9.2."""

    def __init__(
        self,
        budget: CapacityBudget,
        policy: AdmissionPolicy,
        kv: KvLaneManager,
        *,
        model_state: ModelState = ModelState.READY,
        generation: ModelGenerationId | None = ModelGenerationId(1),
    ) -> None:
        cap = kv.capacity
        if (cap.max_sequences, cap.max_kv_tokens) != (budget.max_sequences, budget.max_kv_tokens):
            raise ValueError(
                f"KV capacity ({cap.max_sequences} seqs, {cap.max_kv_tokens} tokens) disagrees with the budget "
                f"({budget.max_sequences} seqs, {budget.max_kv_tokens} tokens)"
            )
        self.budget = budget
        self.policy = policy
        self._kv = kv
        self._max_request_tokens = min(policy.context_limit, cap.max_seq, cap.max_kv_tokens)
        weights = {t: p.weight for t, p in policy.tenants.items()}
        self.fairness = WeightedFairness(
            weights, default_weight=policy.default_tenant.weight, decode_weight=policy.decode_weight
        )
        self._entries: dict[RequestId, _Entry] = {}
        self._tenants: dict[TenantId, _TenantState] = {}
        # One item per tenant whose tagged head may be admitted: (virtual_finish, token, tenant).
        self._heads: list[tuple[float, int, TenantId]] = []
        self._deadlines: list[tuple[float, int, RequestId]] = []  # (deadline, token, id) of non-admitted entries
        self._counter = 0
        self._waiting = 0  # ARRIVED + QUEUED: the max_waiting_requests count
        self._queued = 0  # QUEUED only
        self._waiting_tokens = 0  # prompt tokens of QUEUED entries
        self._admitted = 0
        self.model_state = model_state
        self.generation = generation
        if model_state is ModelState.READY and generation is None:
            raise ValueError("a READY model needs a generation")

    # -- model state ---------------------------------------------------------------------------

    def set_model_state(
        self, state: ModelState, generation: ModelGenerationId | None = None
    ) -> list[tuple[RequestId, AdmissionResult]]:
        """Follow the model's lifecycle (000 §10–§12). Returns the queued requests withdrawn with a 503."""
        if generation is not None:
            self.generation = generation
        if state is ModelState.READY and self.generation is None:
            raise InvariantViolation("cannot become READY without a generation")
        self.model_state = state
        withdrawn: list[tuple[RequestId, AdmissionResult]] = []
        if state in WITHDRAW_STATES:
            result = self._unavailable()
            for entry in [e for e in self._entries.values() if e.phase is _Phase.QUEUED]:
                self._release(entry, 0, 0)
                withdrawn.append((entry.request_id, result))
        return withdrawn

    # -- phase 1: arrival ----------------------------------------------------------------------

    def arrive(self, request_id: RequestId, tenant: TenantId, now: float) -> Ticket | AdmissionResult:
        """Atomically reserve a waiting slot and a QPS token, before any expensive work."""
        if request_id in self._entries:
            raise InvariantViolation(f"request {request_id!r} arrived twice")
        if self.model_state in UNAVAILABLE_STATES:
            return self._unavailable()
        if self._waiting >= self.budget.max_waiting_requests:
            return self._full(
                f"{self._waiting} requests already waiting (max_waiting_requests {self.budget.max_waiting_requests})"
            )
        ts = self._tenant(tenant)
        if ts.policy.qps is not None:
            if ts.bucket is None:
                burst = ts.policy.burst if ts.policy.burst is not None else max(1.0, ts.policy.qps)
                ts.bucket = TokenBucket(ts.policy.qps, burst, now)
            wait = ts.bucket.take(now)
            if wait > 0:
                return AdmissionResult(
                    AdmissionDecision.REJECT_CAPACITY,
                    f"tenant {tenant!r} exceeds its rate of {ts.policy.qps:g} requests/s",
                    retry_after_s=wait,
                )
        entry = _Entry(request_id, tenant, now, now + self.policy.deadline_default_s)
        self._entries[request_id] = entry
        self._waiting += 1
        self._push_deadline(entry)
        return Ticket(request_id, tenant, now)

    # -- phase 2: decision ---------------------------------------------------------------------

    def decide(
        self,
        ticket: Ticket,
        *,
        prompt_tokens: int,
        max_tokens: int,
        deadline_s: float | None,
        now: float,
        over_quota: str | None = None,
    ) -> AdmissionResult:
        """Admit, queue or reject a request whose prompt has been counted (000 §5.2).

        ``over_quota``: the reason a quota the caller keeps is full for this request (the scheduler's
        long-prefill quota); it refuses with RejectCapacity like a full budget here, after the request was
        found valid (400 first) and the model available (503 first)."""
        entry = self._entries.get(ticket.request_id)
        if entry is None or entry.phase is not _Phase.ARRIVED:
            # The ticket expired or was withdrawn while the prompt was being counted.
            return self._full("the arrival reservation expired or was withdrawn before the prompt was counted")
        result = self._validate(prompt_tokens, max_tokens, deadline_s)
        if result is None and self.model_state in UNAVAILABLE_STATES:
            result = self._unavailable()
        if result is None and over_quota is not None:
            result = self._full(over_quota)
        ticket_deadline = entry.deadline
        if result is None:
            entry.deadline = ticket.arrived_at + (
                self.policy.deadline_default_s
                if deadline_s is None
                else min(deadline_s, self.policy.deadline_default_s)
            )
            if now >= entry.deadline:
                result = self._full(
                    f"deadline of {_ms(entry.deadline - ticket.arrived_at)} expired before admission "
                    f"(request arrived {_ms(now - ticket.arrived_at)} ago)"
                )
        if result is not None:
            self._release(entry, 0, 0)
            return result
        entry.prompt = prompt_tokens
        entry.max_tokens = max_tokens
        ts = self._tenants[entry.tenant]
        # Direct admission only when nobody eligible is queued ahead (WFQ order holds) and the
        # tenant has nothing queued itself (FIFO within a tenant).
        if self.model_state is ModelState.READY and ts.head is None and not ts.capped() and not self._live_head():
            lane = self._kv.reserve(entry.request_id, self._gen(), prompt_tokens + max_tokens)
            if lane is not None:
                entry.tag = tag = self.fairness.stamp(entry.tenant, prompt_tokens, max_tokens)
                self._waiting -= 1
                self._admit(entry, ts)
                return AdmissionResult(
                    AdmissionDecision.ADMIT,
                    f"admitted to lane {lane}",
                    lane=lane,
                    deadline=entry.deadline,
                    virtual_finish=tag.finish,
                )
        # Queue: check and count the waiting-token budgets in one step.
        limit = ts.policy.max_waiting_tokens
        if limit is not None and ts.waiting_tokens + prompt_tokens > limit:
            self._release(entry, 0, 0)
            return self._full(
                f"tenant {entry.tenant!r} has {ts.waiting_tokens} waiting prompt tokens + {prompt_tokens} "
                f"exceeds its limit {limit}"
            )
        cap = self.budget.max_waiting_prompt_tokens
        if self._waiting_tokens + prompt_tokens > cap:
            self._release(entry, 0, 0)
            return self._full(
                f"{self._waiting_tokens} waiting prompt tokens + {prompt_tokens} exceeds "
                f"max_waiting_prompt_tokens {cap}"
            )
        entry.phase = _Phase.QUEUED
        self._queued += 1
        self._waiting_tokens += prompt_tokens
        ts.waiting_tokens += prompt_tokens
        ts.fifo.append(entry)
        if ts.head is None:
            self._advance_head(ts)
        if entry.deadline != ticket_deadline:
            self._push_deadline(entry)  # the ticket's heap item now carries a stale deadline
        return AdmissionResult(
            AdmissionDecision.QUEUE,
            self._queue_reason(ts),
            deadline=entry.deadline,
            virtual_finish=entry.tag.finish if entry.tag is not None else None,
        )

    def admit_now(
        self,
        request_id: RequestId,
        tenant: TenantId,
        *,
        prompt_tokens: int,
        max_tokens: int,
        deadline_s: float | None,
        now: float,
    ) -> AdmissionResult:
        """:meth:`arrive` and :meth:`decide` in one call, for callers that already know the prompt length."""
        ticket = self.arrive(request_id, tenant, now)
        if isinstance(ticket, AdmissionResult):
            return ticket
        return self.decide(ticket, prompt_tokens=prompt_tokens, max_tokens=max_tokens, deadline_s=deadline_s, now=now)

    # -- promotion and expiry ------------------------------------------------------------------

    def promote(self, now: float) -> list[Admission]:
        """Admit queued requests in WFQ order while lanes, KV tokens and tenant quotas allow (000 §5.3)."""
        out: list[Admission] = []
        if self.model_state is not ModelState.READY:
            return out
        heads = self._heads
        while heads:
            _, token, tenant = heads[0]
            ts = self._tenants[tenant]
            entry = ts.head
            if entry is None or ts.head_token != token:
                heapq.heappop(heads)  # stale item
                continue
            if entry.deadline <= now:
                break  # expire() owns it; do not spend a lane on a dead request
            if ts.capped():
                heapq.heappop(heads)  # behind its tenant's cap; others may pass (re-offered on release)
                ts.head_token = -1
                continue
            lane = self._kv.reserve(entry.request_id, self._gen(), entry.prompt + entry.max_tokens)
            if lane is None:
                break  # strict order: the head waits for room, smaller requests do not overtake it
            heapq.heappop(heads)
            ts.fifo.popleft()
            ts.head, ts.head_token = None, -1
            self._waiting -= 1
            self._queued -= 1
            self._waiting_tokens -= entry.prompt
            ts.waiting_tokens -= entry.prompt
            self._admit(entry, ts)
            assert entry.tag is not None
            out.append(Admission(entry.request_id, lane, entry.deadline, entry.tag.finish))
            self._advance_head(ts)
        return out

    def expire(self, now: float) -> list[tuple[RequestId, AdmissionResult]]:
        """Withdraw tickets and queued requests whose deadline has passed (rolled back, refused with a reason).

        The decision is what kept them from admission (000 §5.2): RejectCapacity (429) while the model is
        Ready (the budget or queue never freed up in time), RejectUnavailable (503) while it loads or
        recovers (they waited for the model, not for room)."""
        out: list[tuple[RequestId, AdmissionResult]] = []
        heap = self._deadlines
        decision = (
            AdmissionDecision.REJECT_CAPACITY
            if self.model_state is ModelState.READY
            else AdmissionDecision.REJECT_UNAVAILABLE
        )
        while heap and heap[0][0] <= now:
            deadline, _, rid = heapq.heappop(heap)
            entry = self._entries.get(rid)
            if entry is None or entry.phase is _Phase.ADMITTED or entry.deadline != deadline:
                continue
            what = "while queued for admission" if entry.phase is _Phase.QUEUED else "before its prompt was counted"
            self._release(entry, 0, 0)
            out.append(
                (
                    rid,
                    AdmissionResult(
                        decision,
                        f"deadline of {_ms(deadline - entry.arrived_at)} expired {what}"
                        + (
                            ""
                            if decision is AdmissionDecision.REJECT_CAPACITY
                            else f" (model {self.model_state.value})"
                        ),
                        retry_after_s=self.policy.retry_after_s,
                    ),
                )
            )
        return out

    def next_deadline(self) -> float | None:
        """Earliest deadline among non-admitted entries (a wake-up time for the engine), or None."""
        heap = self._deadlines
        while heap:
            deadline, _, rid = heap[0]
            entry = self._entries.get(rid)
            if entry is not None and entry.phase is not _Phase.ADMITTED and entry.deadline == deadline:
                return deadline
            heapq.heappop(heap)
        return None

    # -- rollback / release --------------------------------------------------------------------

    def abandon(self, request_id: RequestId) -> bool:
        """Roll back whatever a request holds here (ticket, queue place, or tenant slot). Idempotent."""
        entry = self._entries.get(request_id)
        if entry is None:
            return False
        self._release(entry, 0, 0)
        return True

    def release(self, request_id: RequestId, *, served_prompt_tokens: int, served_output_tokens: int) -> bool:
        """The request ended: free its slots and settle its WFQ cost to what was served. Idempotent."""
        entry = self._entries.get(request_id)
        if entry is None:
            return False
        self._release(entry, served_prompt_tokens, served_output_tokens)
        return True

    def is_tracked(self, request_id: RequestId) -> bool:
        return request_id in self._entries

    # -- reading -------------------------------------------------------------------------------

    def stats(self) -> AdmissionStats:
        return AdmissionStats(
            waiting_requests=self._waiting,
            queued_requests=self._queued,
            waiting_prompt_tokens=self._waiting_tokens,
            admitted=self._admitted,
            active_by_tenant={t: s.active for t, s in self._tenants.items() if s.active},
            waiting_tokens_by_tenant={t: s.waiting_tokens for t, s in self._tenants.items() if s.waiting_tokens},
        )

    def check_invariants(self) -> None:
        """Counters equal a recount of the entries and never exceed their caps."""
        waiting = queued = tokens = admitted = 0
        active: dict[TenantId, int] = {}
        wtokens: dict[TenantId, int] = {}
        for e in self._entries.values():
            if e.phase is _Phase.ADMITTED:
                admitted += 1
                active[e.tenant] = active.get(e.tenant, 0) + 1
                continue
            waiting += 1
            if e.phase is _Phase.QUEUED:
                queued += 1
                tokens += e.prompt
                wtokens[e.tenant] = wtokens.get(e.tenant, 0) + e.prompt
        got = (self._waiting, self._queued, self._waiting_tokens, self._admitted)
        if got != (waiting, queued, tokens, admitted):
            raise InvariantViolation(f"admission counters {got} != recount {(waiting, queued, tokens, admitted)}")
        if waiting > self.budget.max_waiting_requests or tokens > self.budget.max_waiting_prompt_tokens:
            raise InvariantViolation(f"waiting {waiting} requests / {tokens} tokens exceed the budget")
        for t, s in self._tenants.items():
            if s.active != active.get(t, 0) or s.waiting_tokens != wtokens.get(t, 0):
                raise InvariantViolation(f"tenant {t!r} counters disagree with its entries")
            cap = s.policy.max_active_sequences
            if cap is not None and s.active > cap:
                raise InvariantViolation(f"tenant {t!r} has {s.active} active sequences, cap {cap}")
            live = [e for e in s.fifo if self._entries.get(e.request_id) is e]
            if (s.head is None) != (not live) or (s.head is not None and (live[0] is not s.head or s.head.tag is None)):
                raise InvariantViolation(f"tenant {t!r}: the tagged head is not the oldest queued request")

    # -- internals -----------------------------------------------------------------------------

    def _validate(self, prompt_tokens: int, max_tokens: int, deadline_s: float | None) -> AdmissionResult | None:
        cap = self._kv.capacity
        total = prompt_tokens + max_tokens
        limits = (
            (self.policy.context_limit, "context limit"),
            (cap.max_seq, "max_seq"),
            (cap.max_kv_tokens, "the KV budget of"),
        )
        if prompt_tokens < 1:
            return AdmissionResult(
                AdmissionDecision.REJECT_INVALID, f"prompt is empty ({prompt_tokens} tokens)", field="prompt"
            )
        if max_tokens < 1:
            return AdmissionResult(
                AdmissionDecision.REJECT_INVALID, f"max_tokens must be at least 1, got {max_tokens}", field="max_tokens"
            )
        for limit, name in limits:
            if prompt_tokens + 1 > limit:  # the prompt alone leaves no room for one output token
                unit = " tokens" if name.startswith("the KV") else ""
                return AdmissionResult(
                    AdmissionDecision.REJECT_INVALID,
                    f"prompt has {prompt_tokens} tokens; with at least 1 output token it exceeds {name} {limit}{unit}",
                    field="prompt",
                )
        for limit, name in limits:
            if total > limit:
                unit = " tokens" if name.startswith("the KV") else ""
                return AdmissionResult(
                    AdmissionDecision.REJECT_INVALID,
                    f"prompt has {prompt_tokens} tokens + max_tokens {max_tokens} exceeds {name} {limit}{unit}",
                    field="max_tokens",
                )
        if deadline_s is not None and not (deadline_s > 0 and math.isfinite(deadline_s)):
            return AdmissionResult(
                AdmissionDecision.REJECT_INVALID,
                f"deadline must be a positive number of milliseconds, got {_ms(deadline_s)}",
                field="timeout",
            )
        return None

    def _full(self, reason: str) -> AdmissionResult:
        """RejectCapacity (000 §5.2): a queue or token budget is full; ``reason`` states the numbers."""
        return AdmissionResult(AdmissionDecision.REJECT_CAPACITY, reason, retry_after_s=self.policy.retry_after_s)

    def _unavailable(self) -> AdmissionResult:
        return AdmissionResult(
            AdmissionDecision.REJECT_UNAVAILABLE,
            f"model is {self.model_state.value.lower()}",
            retry_after_s=self.policy.unavailable_retry_after_s,
        )

    def _queue_reason(self, ts: _TenantState) -> str:
        if self.model_state is not ModelState.READY:
            return f"waiting for the model ({self.model_state.value.lower()})"
        cap = ts.policy.max_active_sequences
        if cap is not None and ts.active >= cap:
            return f"tenant has {ts.active} active sequences (limit {cap})"
        kv = self._kv
        ahead = f", {self._queued - 1} queued ahead in fair order" if self._queued > 1 else ""
        return (
            f"waiting for KV capacity: {kv.free_lanes} of {kv.capacity.max_sequences} lanes free, "
            f"{kv.reserved_tokens} of {kv.capacity.max_kv_tokens} tokens reserved{ahead}"
        )

    def _tenant(self, tenant: TenantId) -> _TenantState:
        ts = self._tenants.get(tenant)
        if ts is None:
            ts = self._tenants[tenant] = _TenantState(tenant, self.policy.tenant(tenant))
        return ts

    def _gen(self) -> ModelGenerationId:
        if self.generation is None:
            raise InvariantViolation("no generation to admit into")
        return self.generation

    def _live_head(self) -> bool:
        """Is any tenant's tagged head eligible for admission right now (so a newcomer must queue)?"""
        heads = self._heads
        while heads:
            _, token, tenant = heads[0]
            ts = self._tenants[tenant]
            if ts.head is not None and ts.head_token == token:
                if not ts.capped():
                    return True
                ts.head_token = -1  # park: re-offered when the tenant drops below its cap
            heapq.heappop(heads)
        return False

    def _advance_head(self, ts: _TenantState) -> None:
        """Tag the tenant's next live queued request with its WFQ tags and offer it (000 §5.3).

        Tagging at head-of-line time (not at arrival) keeps FIFO order within a tenant
        and lets credit from an early finish lower the very next tag.
        """
        ts.head, ts.head_token = None, -1
        fifo = ts.fifo
        while fifo:
            entry = fifo[0]
            if entry.phase is _Phase.QUEUED and self._entries.get(entry.request_id) is entry:
                break
            fifo.popleft()
        else:
            return
        entry.tag = self.fairness.stamp(entry.tenant, entry.prompt, entry.max_tokens)
        ts.head = entry
        self._offer(ts)

    def _offer(self, ts: _TenantState) -> None:
        if ts.head is None or ts.head_token != -1 or ts.capped():
            return
        assert ts.head.tag is not None
        self._counter += 1
        ts.head_token = self._counter
        heapq.heappush(self._heads, (ts.head.tag.finish, self._counter, ts.tenant))

    def _admit(self, entry: _Entry, ts: _TenantState) -> None:
        entry.phase = _Phase.ADMITTED
        self._admitted += 1
        ts.active += 1
        assert entry.tag is not None
        self.fairness.dispatched(entry.tag)

    def _push_deadline(self, entry: _Entry) -> None:
        self._counter += 1
        heapq.heappush(self._deadlines, (entry.deadline, self._counter, entry.request_id))

    def _release(self, entry: _Entry, served_prompt: int, served_output: int) -> None:
        """The one rollback/release path."""
        del self._entries[entry.request_id]
        ts = self._tenants[entry.tenant]
        if entry.phase is _Phase.ADMITTED:
            self._admitted -= 1
            ts.active -= 1
            if entry.tag is not None:
                self.fairness.settle(entry.tag, served_prompt, served_output)
            self._offer(ts)  # a slot opened under the tenant's cap: its head competes again
            return
        self._waiting -= 1
        if entry.phase is _Phase.QUEUED:
            self._queued -= 1
            self._waiting_tokens -= entry.prompt
            ts.waiting_tokens -= entry.prompt
        if entry.tag is not None:
            self.fairness.settle(entry.tag, served_prompt, served_output)  # never served: full credit
        if ts.head is entry:
            self._advance_head(ts)
