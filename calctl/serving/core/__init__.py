"""The pure serving core: request states, admission, fairness, prefill/decode scheduling, KV lanes.

Everything here is single-threaded, deterministic logic with ``now`` (float
seconds on a monotonic clock) passed in; the engine serialises all calls. It
imports no asyncio, FastAPI, threading or ``calctl.runtime``, owns no device,
and never sleeps -- which is what lets 000 §17.1/§17.2 test it with a fake
clock and against reference state machines.

Entry point for the engine: :class:`Scheduler` (``schedule`` ->
execute -> ``update_from_output``, vLLM v1 style). The components it composes
are usable and tested on their own.

Capability note: B4/B8/B16 decode profiles and continuous batching are C3 in
000 §1; this package is scheduling logic tested against fakes, not evidence of
device support.
"""

from calctl.serving.core.admission import (
    Admission,
    AdmissionController,
    AdmissionDecision,
    AdmissionPolicy,
    AdmissionResult,
    CapacityBudget,
    ModelState,
    TenantPolicy,
    Ticket,
    TokenBucket,
)
from calctl.serving.core.decode import (
    BatchLane,
    BatchProfile,
    DecodeBatch,
    DecodePoll,
    DecodeScheduler,
    DecodeSelection,
    InactiveLaneContract,
)
from calctl.serving.core.errors import IllegalTransition, InvariantViolation, ProfileRefused
from calctl.serving.core.fairness import FairTag, WeightedFairness
from calctl.serving.core.ids import JobId, LaneId, ModelGenerationId, RequestId, TenantId
from calctl.serving.core.kv import KvCapacity, KvLaneManager, KvLaneView, KvState, KvStats
from calctl.serving.core.prefill import (
    Dropped,
    PrefillScheduler,
    PrefillThresholds,
    ServiceArbiter,
    ServiceWeights,
    WorkKind,
)
from calctl.serving.core.registry import RequestRegistry
from calctl.serving.core.request import (
    CallbackDisposition,
    CancelOutcome,
    EndReason,
    RequestState,
    SequenceState,
    TerminalEvent,
)
from calctl.serving.core.scheduler import (
    DecodeJob,
    Event,
    Job,
    JobOutcome,
    JobStatus,
    LaneReleased,
    LaneResult,
    PrefillJob,
    RecoveryNeeded,
    Scheduler,
    SchedulerOutput,
    SchedulerStats,
    StaleCompletion,
    TokenEmitted,
)
from calctl.serving.core.settings import DecodeOptions, LongPrefillQuota, SchedulerSettings

__all__ = [
    "Admission",
    "AdmissionController",
    "AdmissionDecision",
    "AdmissionPolicy",
    "AdmissionResult",
    "BatchLane",
    "BatchProfile",
    "CallbackDisposition",
    "CancelOutcome",
    "CapacityBudget",
    "DecodeBatch",
    "DecodeJob",
    "DecodeOptions",
    "DecodePoll",
    "DecodeScheduler",
    "DecodeSelection",
    "Dropped",
    "EndReason",
    "Event",
    "FairTag",
    "IllegalTransition",
    "InactiveLaneContract",
    "InvariantViolation",
    "Job",
    "JobId",
    "JobOutcome",
    "JobStatus",
    "KvCapacity",
    "KvLaneManager",
    "KvLaneView",
    "KvState",
    "KvStats",
    "LaneId",
    "LaneReleased",
    "LaneResult",
    "LongPrefillQuota",
    "ModelGenerationId",
    "ModelState",
    "PrefillJob",
    "PrefillScheduler",
    "PrefillThresholds",
    "ProfileRefused",
    "RecoveryNeeded",
    "RequestId",
    "RequestRegistry",
    "RequestState",
    "Scheduler",
    "SchedulerOutput",
    "SchedulerSettings",
    "SchedulerStats",
    "SequenceState",
    "ServiceArbiter",
    "ServiceWeights",
    "StaleCompletion",
    "TenantId",
    "TenantPolicy",
    "TerminalEvent",
    "Ticket",
    "TokenBucket",
    "TokenEmitted",
    "WeightedFairness",
    "WorkKind",
]
