"""The scheduler's cross-component invariants (000 §4, §9.2): registry vs KV vs queues vs admission.

Checked by the tests (and the stateful machines) after every step; never on the serving path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from calctl.serving.core.errors import InvariantViolation
from calctl.serving.core.ids import JobId, RequestId
from calctl.serving.core.kv import KvState
from calctl.serving.core.request import RUNNING_STATES, RequestState

if TYPE_CHECKING:
    from calctl.serving.core.scheduler import Scheduler

_S = RequestState


def check_scheduler(sched: Scheduler, long_waiting: Iterable[RequestId], inflight: Mapping[JobId, Any]) -> None:
    """Cross-component invariants: registry vs KV vs queues vs admission (000 §4, §9.2)."""
    sched.kv.check_invariants()
    sched.admission.check_invariants()
    for rid in long_waiting:
        seq = sched.registry.get(rid)
        if seq is None or seq.state not in (_S.WAITING_MODEL, _S.WAITING_ADMISSION, _S.PREFILL_READY):
            raise InvariantViolation(
                f"{rid} counts as a waiting long prefill in {seq.state.value if seq else 'no'} state"
            )
    prefill_ready = decode_ready = admitted = 0
    for seq in sched.registry:
        st = seq.state
        if st in (_S.NEW, _S.WAITING_MODEL, _S.WAITING_ADMISSION):
            if seq.kv_lane is not None:
                raise InvariantViolation(f"{seq.request_id}: {st.value} but holds lane {seq.kv_lane}")
            continue
        admitted += 1
        if seq.kv_lane is None:
            raise InvariantViolation(f"{seq.request_id}: {st.value} without a KV lane")
        view = sched.kv.lane(seq.kv_lane)
        if view.owner != seq.request_id or view.generation != seq.generation:
            raise InvariantViolation(f"{seq.request_id}: lane {seq.kv_lane} belongs to {view.owner}")
        if st in RUNNING_STATES:
            inf = inflight.get(seq.current_job) if seq.current_job is not None else None
            if inf is None or seq not in inf.seqs:
                raise InvariantViolation(f"{seq.request_id}: {st.value} but job {seq.current_job} is not in flight")
            if view.state is not KvState.UPDATING or view.job != seq.current_job:
                raise InvariantViolation(f"{seq.request_id}: running but lane is {view.state.value}/{view.job}")
        elif view.state is KvState.UPDATING:
            raise InvariantViolation(f"{seq.request_id}: {st.value} but its lane is Updating")
        if st is _S.PREFILL_READY:
            prefill_ready += 1
            if seq.queue_token == -1:
                raise InvariantViolation(f"{seq.request_id}: PrefillReady but not queued")
        elif st is _S.DECODE_READY:
            decode_ready += 1
            if seq.queue_token == -1:
                raise InvariantViolation(f"{seq.request_id}: DecodeReady but not queued")
    if prefill_ready != sched.prefill.total_depth:
        raise InvariantViolation(f"{prefill_ready} PrefillReady requests, queues hold {sched.prefill.total_depth}")
    if decode_ready != sched.decode.ready_count:
        raise InvariantViolation(f"{decode_ready} DecodeReady requests, decode queue holds {sched.decode.ready_count}")
    if admitted != sched.admission.stats().admitted:
        raise InvariantViolation(f"{admitted} admitted requests, admission counts {sched.admission.stats().admitted}")
    if len(inflight) > sched.settings.budget.max_inflight_jobs:
        raise InvariantViolation(f"{len(inflight)} jobs in flight > max_inflight_jobs")


__all__ = ["check_scheduler"]
