"""What a recovery leaves behind (001 §11.3, §13.4): its policy, its record, its evidence document.

The DeviceSupervisor decides and acts; this module holds the values it records and builds the
``calctl-recovery-evidence/v1`` document: the runtime's trace window around the fault and the 001 §14
records of the affected aliases from the flight recorder.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calctl import records
from calctl.runtime.errors import RuntimeStatus
from calctl.serving.record_sink import job_phases

if TYPE_CHECKING:
    from calctl.serving.config import DualRecoveryConfig, SchedulerConfig
    from calctl.serving.engine.loop import RecoveryRequest
    from calctl.serving.engine.options import SupervisorOptions

log = logging.getLogger("calctl.serve")


@dataclass(frozen=True)
class RecoveryPolicy:
    allow_session_reset: bool
    restart_process_on_unknown_dma: bool
    max_resets_per_10min: int
    restart_on_unknown_dma: bool


@dataclass(frozen=True)
class RecoveryRecord:
    """One observed recovery: the evidence behind an F0/F1/F2 grade (001 §13.4)."""

    alias: str
    reason: str
    runtime_status: str | None
    scope: str
    affected_aliases: tuple[str, ...]
    ok: bool
    seconds: float
    at: float
    detail: str = ""
    evidence: str | None = None  # the evidence file (trace window + job records), when written
    generations: dict[str, int] = dataclasses.field(default_factory=dict)  # every alias's after the recovery


def trace_row(e: Any) -> dict[str, Any]:
    """One runtime trace event as JSON: the rows of /internal/trace and of a recovery's trace window."""
    return {
        "job": int(e.job),
        "chip": e.chip,
        "model": e.model,
        "graph": e.graph,
        "engine": e.engine.value,
        "generation": int(e.generation),
        "submit_ns": e.submit_ns,
        "start_ns": e.start_ns,
        "end_ns": e.end_ns,
        "state": e.state.value,
    }


def jobs_with_phases(kept: list[tuple[dict[str, Any], int | None]], trace: Any) -> list[dict[str, Any]]:
    """Kept-only job records carry no phases (the hot path does not scan the trace): fill them from the window."""
    out = []
    for doc, runtime_job in kept:
        if runtime_job is not None and doc["h2d_ms"] is None and doc["infer_ms"] is None and doc["d2h_ms"] is None:
            phases = job_phases(trace, runtime_job)
            if phases:
                doc = {
                    **doc,
                    "h2d_ms": phases.get("h2d"),
                    "infer_ms": phases.get("compute"),
                    "d2h_ms": phases.get("d2h"),
                }
        out.append(doc)
    return out


def status_name(status: RuntimeStatus | None) -> str | None:
    return status.name if status is not None else None


def effective_policy(
    o: SupervisorOptions, sched: SchedulerConfig | None, dual: DualRecoveryConfig | None
) -> RecoveryPolicy:
    """The effective ``recovery`` block for ``alias``: options override, else the configuration (000 §15,
    001 §10.4), else the safe defaults (board scope, 2 resets per 10 minutes)."""
    return RecoveryPolicy(
        allow_session_reset=(
            o.allow_session_reset if o.allow_session_reset is not None else bool(dual and dual.allow_session_reset)
        ),
        restart_process_on_unknown_dma=(
            o.restart_process_on_unknown_dma
            if o.restart_process_on_unknown_dma is not None
            else bool(dual and dual.restart_process_on_unknown_dma)
        ),
        max_resets_per_10min=(
            o.max_resets_per_10min
            if o.max_resets_per_10min is not None
            else (sched.recovery.max_resets_per_10min if sched else 2)
        ),
        restart_on_unknown_dma=(
            o.restart_on_unknown_dma
            if o.restart_on_unknown_dma is not None
            else (sched.recovery.restart_on_unknown_dma if sched else True)
        ),
    )


def evidence_document(
    *,
    device: str,
    alias: str,
    reason: str,
    runtime_status: RuntimeStatus | None,
    detail: str,
    scope: str,
    affected: list[str],
    generations: Mapping[str, int],
    window_s: float,
    trace: Any,
    jobs: Mapping[str, Any],
    kept_jobs: list[tuple[dict[str, Any], int | None]],
    kept_requests: list[dict[str, Any]],
    package_digest: str | None,
) -> dict[str, Any]:
    """001 §11.3 "保存 trace": the trace window and job records around the fault. The failing job is the
    last job record of the faulted alias."""
    return {
        "schema": "calctl-recovery-evidence/v1",
        "device": device,
        "alias": alias,
        "reason": reason,
        "runtime_status": status_name(runtime_status),
        "detail": detail,
        "scope_requested": scope,
        "affected_aliases": affected,
        "generations": dict(generations),
        "trace_window_s": window_s,
        "clock": "CLOCK_MONOTONIC",
        "trace": [trace_row(e) for e in trace],
        "jobs": dict(jobs),
        "records": {"jobs": jobs_with_phases(kept_jobs, trace), "requests": kept_requests},
        "package_digest": package_digest,
    }


def write_evidence(doc: dict[str, Any], base: Path | None, name: str) -> Path | None:
    """Write ``doc`` as ``base/name`` (``base`` None: $CALCTL_RECOVERY_DIR, else memory only)."""
    if base is None:
        env = os.environ.get("CALCTL_RECOVERY_DIR")
        base = Path(env) if env else None
    if base is None:
        return None
    try:
        base.mkdir(parents=True, exist_ok=True)
        path = base / name
        records.write_json(path, doc)
        return path
    except OSError as exc:
        log.error("recovery evidence not written to %s: %s", base, exc)
        return None


class RecoveryQueue:
    """Recovery requests from the engine cores, handled one at a time by the supervisor's own thread (a core only
    posts, it never waits for or starts a recovery); it counts those posted and not yet ended (:attr:`pending`)."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[RecoveryRequest | None] = queue.SimpleQueue()
        self._unfinished = 0
        self._lock = threading.Lock()

    def post(self, request: RecoveryRequest) -> None:
        with self._lock:
            self._unfinished += 1
        self._q.put(request)

    def get(self) -> RecoveryRequest | None:
        """The next request, or None once :meth:`stop` was called (blocks)."""
        return self._q.get()

    def done(self) -> None:
        with self._lock:
            self._unfinished -= 1

    def stop(self) -> None:
        self._q.put(None)

    @property
    def pending(self) -> bool:
        """A recovery was asked for and has not ended yet (queued or running)."""
        with self._lock:
            return self._unfinished > 0


__all__ = [
    "RecoveryPolicy",
    "RecoveryQueue",
    "RecoveryRecord",
    "effective_policy",
    "evidence_document",
    "jobs_with_phases",
    "status_name",
    "trace_row",
    "write_evidence",
]
