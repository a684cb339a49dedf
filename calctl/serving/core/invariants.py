"""The scheduler's cross-component invariants (000 §4, §9.2): registry vs KV vs queues vs admission.

Checked by the tests (and the stateful machines) after every step; never on the serving path. Each rule is
one small check below that says how it is broken (or None), cited to the 000 section it comes from; the
tables at the end say which rules run on which request and in what order. The KV lanes' own rules are
:meth:`calctl.serving.core.kv.KvLaneManager.check_invariants`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from calctl.serving.core.errors import InvariantViolation
from calctl.serving.core.ids import JobId, RequestId
from calctl.serving.core.kv import KvLaneView, KvState
from calctl.serving.core.request import RUNNING_STATES, RequestState, SequenceState

if TYPE_CHECKING:
    from calctl.serving.core.scheduler import Scheduler

_S = RequestState
#: Not admitted yet: no lane, not counted by admission (000 §5.2).
_WAITING = frozenset({_S.NEW, _S.WAITING_MODEL, _S.WAITING_ADMISSION})
#: Where a long prefill the scheduler counts as waiting may be (000 §6).
_LONG_WAITING = (_S.WAITING_MODEL, _S.WAITING_ADMISSION, _S.PREFILL_READY)


@dataclass(frozen=True)
class _Step:
    """What every rule may read: the scheduler after a step and the jobs in flight."""

    sched: Scheduler
    inflight: Mapping[JobId, Any]

    def lane(self, seq: SequenceState) -> KvLaneView:
        assert seq.kv_lane is not None  # _admitted_holds_a_lane ran first
        return self.sched.kv.lane(seq.kv_lane)


def check_scheduler(sched: Scheduler, long_waiting: Iterable[RequestId], inflight: Mapping[JobId, Any]) -> None:
    """Cross-component invariants: registry vs KV vs queues vs admission (000 §4, §9.2)."""
    sched.kv.check_invariants()
    sched.admission.check_invariants()
    for rid in long_waiting:
        _raise(_long_prefill_is_waiting(sched, rid))
    step = _Step(sched, inflight)
    states: Counter[RequestState] = Counter()
    for seq in sched.registry:
        states[seq.state] += 1
        for rule in _WAITING_RULES if seq.state in _WAITING else _ADMITTED_RULES:
            _raise(rule(step, seq))
    for count_rule in _COUNT_RULES:
        _raise(count_rule(step, states))


def _raise(broken: str | None) -> None:
    if broken is not None:
        raise InvariantViolation(broken)


def _long_prefill_is_waiting(sched: Scheduler, rid: RequestId) -> str | None:
    """000 §6: a long prefill counted as waiting (the long-prefill quota) is one that has not started."""
    seq = sched.registry.get(rid)
    if seq is None or seq.state not in _LONG_WAITING:
        return f"{rid} counts as a waiting long prefill in {seq.state.value if seq else 'no'} state"
    return None


# -- one request -----------------------------------------------------------------------------------------


def _waiting_holds_no_lane(step: _Step, seq: SequenceState) -> str | None:
    """000 §5.2: a request not admitted yet holds no KV lane."""
    return None if seq.kv_lane is None else f"{seq.request_id}: {seq.state.value} but holds lane {seq.kv_lane}"


def _admitted_holds_a_lane(step: _Step, seq: SequenceState) -> str | None:
    """000 §5.2 Admit: an admitted request holds the KV lane admission reserved for it."""
    return None if seq.kv_lane is not None else f"{seq.request_id}: {seq.state.value} without a KV lane"


def _lane_is_its_own(step: _Step, seq: SequenceState) -> str | None:
    """000 §9.2 rule 1: the lane belongs to this request, in this request's generation."""
    view = step.lane(seq)
    if view.owner != seq.request_id or view.generation != seq.generation:
        return f"{seq.request_id}: lane {seq.kv_lane} belongs to {view.owner}"
    return None


def _running_job_is_in_flight(step: _Step, seq: SequenceState) -> str | None:
    """000 §4: every callback carries its job id; a Running request's job is in flight and holds it."""
    if seq.state not in RUNNING_STATES:
        return None
    inf = step.inflight.get(seq.current_job) if seq.current_job is not None else None
    if inf is None or seq not in inf.seqs:
        return f"{seq.request_id}: {seq.state.value} but job {seq.current_job} is not in flight"
    return None


def _lane_updates_only_while_running(step: _Step, seq: SequenceState) -> str | None:
    """000 §9.2 rule 5: the lane is Updating for the request's job exactly while the request runs."""
    view = step.lane(seq)
    if seq.state in RUNNING_STATES:
        if view.state is not KvState.UPDATING or view.job != seq.current_job:
            return f"{seq.request_id}: running but lane is {view.state.value}/{view.job}"
    elif view.state is KvState.UPDATING:
        return f"{seq.request_id}: {seq.state.value} but its lane is Updating"
    return None


def _ready_is_queued(step: _Step, seq: SequenceState) -> str | None:
    """000 §6, §7.1: a PrefillReady or DecodeReady request waits in its queue."""
    if seq.state in (_S.PREFILL_READY, _S.DECODE_READY) and seq.queue_token == -1:
        return f"{seq.request_id}: {seq.state.value} but not queued"
    return None


# -- the counts ------------------------------------------------------------------------------------------


def _prefill_queues_hold_the_ready(step: _Step, states: Counter[RequestState]) -> str | None:
    """000 §6: the prefill queues hold every PrefillReady request, and only those."""
    n, depth = states[_S.PREFILL_READY], step.sched.prefill.total_depth
    return None if n == depth else f"{n} PrefillReady requests, queues hold {depth}"


def _decode_queue_holds_the_ready(step: _Step, states: Counter[RequestState]) -> str | None:
    """000 §7.1: the decode queue holds every DecodeReady request, and only those."""
    n, ready = states[_S.DECODE_READY], step.sched.decode.ready_count
    return None if n == ready else f"{n} DecodeReady requests, decode queue holds {ready}"


def _admission_counts_the_admitted(step: _Step, states: Counter[RequestState]) -> str | None:
    """000 §5.1: admission's count of admitted requests is the registry's."""
    admitted = sum(n for state, n in states.items() if state not in _WAITING)
    counted = step.sched.admission.stats().admitted
    return None if admitted == counted else f"{admitted} admitted requests, admission counts {counted}"


def _inflight_within_budget(step: _Step, states: Counter[RequestState]) -> str | None:
    """000 §5.1 ``max_inflight_jobs``."""
    if len(step.inflight) > step.sched.settings.budget.max_inflight_jobs:
        return f"{len(step.inflight)} jobs in flight > max_inflight_jobs"
    return None


_SeqRule = Callable[[_Step, SequenceState], "str | None"]
#: Run in this order on each request by whether it is admitted; the first broken rule is reported.
_WAITING_RULES: tuple[_SeqRule, ...] = (_waiting_holds_no_lane,)
_ADMITTED_RULES: tuple[_SeqRule, ...] = (
    _admitted_holds_a_lane,
    _lane_is_its_own,
    _running_job_is_in_flight,
    _lane_updates_only_while_running,
    _ready_is_queued,
)
#: Then over the whole registry, once every request passed.
_COUNT_RULES: tuple[Callable[[_Step, Counter[RequestState]], str | None], ...] = (
    _prefill_queues_hold_the_ready,
    _decode_queue_holds_the_ready,
    _admission_counts_the_admitted,
    _inflight_within_budget,
)


__all__ = ["check_scheduler"]
