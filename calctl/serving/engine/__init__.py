"""The serving engine: DeviceSupervisor + one EngineCore per alias + a Router by ``model`` (001 §4).

:class:`ServingEngine` implements :class:`calctl.serving.protocol.EngineClient` for the
HTTP layer; soak and bench tools drive the same object without HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from calctl.errors import ConfigError
from calctl.serving.config import ExecutorMode
from calctl.serving.core.admission import ModelState
from calctl.serving.engine.loop import EngineCore
from calctl.serving.engine.metrics import ChipSnapshot, EngineSnapshot, SnapshotCollector
from calctl.serving.engine.options import CoreOptions, SupervisorOptions
from calctl.serving.engine.output import record_refusal
from calctl.serving.engine.recovery import trace_row
from calctl.serving.engine.results import (
    LifecycleResult,
    LoadResult,
    ReloadResult,
    RollbackResult,
    UnloadResult,
)
from calctl.serving.engine.streams import EngineStream
from calctl.serving.engine.supervisor import DeviceSupervisor
from calctl.serving.protocol import EngineRejection, GenerationRequest, ModelInfo, Refusal, RejectCode
from calctl.serving.text import TextCodec

log = logging.getLogger("calctl.serve")


class ServingEngine:
    """Router by exact alias (001 §10.1) over the supervisor's engine cores."""

    def __init__(self, supervisor: DeviceSupervisor) -> None:
        self.supervisor = supervisor
        self._draining = False
        self._created = int(time.time())
        supervisor.metrics.add_collector(SnapshotCollector(self.snapshot))

    # -- routing -------------------------------------------------------------------------

    def _core(self, alias: str) -> EngineCore:
        w = self.supervisor.cores.get(alias)  # exact match only: no case folding, no prefixes
        if w is None:
            known = ", ".join(sorted(self.supervisor.cores)) or "none"
            raise EngineRejection(
                RejectCode.MODEL_NOT_FOUND, f"model {alias!r} does not exist (served models: {known})", param="model"
            )
        return w

    def codec(self, alias: str) -> TextCodec:
        return self._core(alias).codec

    def context_limit(self, alias: str) -> int:
        """What admission enforces: the dual-model config's ``context_limit`` when it lowers the package's (001 §10.4)."""
        return self._core(alias).context_limit

    def models(self) -> list[ModelInfo]:
        return [
            ModelInfo(
                alias, w.state.value, w.generation if w.is_ready() else None, self.context_limit(alias), self._created
            )
            for alias, w in self.supervisor.cores.items()
        ]

    def submit(self, request: GenerationRequest) -> EngineStream:
        w = self._core(request.alias)
        if self._draining:
            rejection = EngineRejection(RejectCode.UNAVAILABLE, "the server is shutting down", retry_after_s=1.0)
            self.refused(Refusal(request.request_id, w.alias, request.tenant, len(request.prompt_ids), rejection))
            raise rejection
        return self._open(w, request, asyncio.get_running_loop())

    def refused(self, refusal: Refusal) -> None:
        w = self.supervisor.cores.get(refusal.alias)
        if w is None:  # a name the client chose (a 404): its record, but never a metric label
            record_refusal(self.supervisor.metrics, refusal.alias, (), None, refusal, 0.0, count=False)
        else:
            record_refusal(self.supervisor.metrics, w.alias, w.chips, w.generation, refusal, 0.0)

    def submit_threadsafe(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> EngineStream:
        """For tools driving the engine from their own loop thread (soak, bench)."""
        return self._open(self._core(request.alias), request, loop)

    @staticmethod
    def _open(core: EngineCore, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> EngineStream:
        stream = EngineStream(
            request.request_id,
            loop,
            on_cancel=lambda rid, reason: core.cancel(rid, reason),
            on_finish=lambda rid, reason: core.stop(rid),
        )
        core.submit(request, stream)
        return stream

    def cancel(self, request_id: str) -> bool:
        return any(w.cancel(request_id, "operator cancel") for w in self.supervisor.cores.values())

    # -- health --------------------------------------------------------------------------

    def is_ready(self, alias: str | None = None) -> bool:
        if alias is not None:
            w = self.supervisor.cores.get(alias)
            return w is not None and w.is_ready()
        cores = self.supervisor.cores.values()
        return bool(cores) and all(c.is_ready() for c in cores)

    def failures(self) -> dict[str, str]:
        """alias -> why it is Failed (a failed recovery, an exhausted reset budget, 001 §11.3)."""
        return dict(self.supervisor.failures)

    def is_draining(self) -> bool:
        return self._draining

    def start_draining(self) -> None:
        self._draining = True

    def drained(self) -> bool:
        """No request is live in any engine core: every admitted request reached its terminal event."""
        return all(w.drained() for w in self.supervisor.cores.values())

    async def admin(self, alias: str, action: str, package: str | None = None) -> Mapping[str, Any]:
        self._core(alias)
        sup = self.supervisor
        source = None
        if package is not None:
            if action not in ("load", "reload"):
                raise EngineRejection(RejectCode.INVALID, f"{action} takes no package", param="package")
            try:
                source = sup.resolve_admin_package(package)
            except ConfigError as exc:
                raise EngineRejection(RejectCode.INVALID, str(exc), param="package") from None
        actions: dict[str, Callable[[], LifecycleResult]] = {
            "load": lambda: sup.load(source),
            "unload": sup.unload,
            "reload": lambda: sup.reload(source),
            "rollback": sup.rollback,
        }
        fn = actions[action]
        try:
            return (await asyncio.to_thread(fn)).to_json()  # the documented response (docs/serve.md)
        except Exception as exc:  # report, never crash the server on an admin action; logged where caught
            log.exception("admin %s of %s failed", action, alias)
            return {"ok": False, "action": action, "detail": f"{type(exc).__name__}: {exc}"}

    async def executor(self, alias: str, mode: str | None = None) -> Mapping[str, Any]:
        """Report the alias's executor; with ``mode``, set it for new jobs first (operator action, 000 §14)."""
        w = self._core(alias)
        if mode is None:
            return {"ok": True, **w.executor_status()}
        try:
            wanted = ExecutorMode(mode)
        except ValueError:
            raise EngineRejection(
                RejectCode.INVALID, f"executor mode {mode!r}: expected sync, async or pingpong", param="mode"
            ) from None
        return w.set_executor_mode(wanted)

    # -- observation ----------------------------------------------------------------------

    def snapshot(self) -> EngineSnapshot:
        chips = []
        try:
            rt = self.supervisor.rt
            telemetry = {t.chip: t for t in rt.telemetry()}
            for m in rt.memory_usage():
                chips.append(ChipSnapshot(m.chip, m.used_bytes, m.total_bytes, telemetry.get(m.chip)))
        except Exception:
            chips = []
        return EngineSnapshot([w.snapshot() for w in self.supervisor.cores.values()], chips)

    def metrics_text(self) -> bytes:
        return self.supervisor.metrics.text()

    def trace(self, since_ns: int = 0) -> dict[str, Any]:
        """The device's own per-chip job intervals since ``since_ns`` (CLOCK_MONOTONIC), for /internal/trace.

        Internal only: it names chips. ``device`` says which runtime measured them (mock results are mock)."""
        rt = self.supervisor.rt
        events = [trace_row(e) for e in rt.trace(since_ns=since_ns)]
        return {"device": rt.kind.value, "clock": "CLOCK_MONOTONIC", "events": events}

    def status(self) -> dict[str, Any]:
        """``GET /internal/status`` (admin key; it names chips and paths): states, generations, why an alias
        is Failed, every recovery with its scope, the aliases it touched and its evidence file, and how many
        001 §14 records the destination dropped."""
        sup = self.supervisor
        sink = sup.metrics.records
        return {
            "device": sup.rt.kind.value,
            "failures": self.failures(),
            "records": {"where": sink.where, "dropped": sink.dropped},
            "models": {
                a: {"state": w.state.value, "generation": w.generation, "live_requests": w.live_requests()}
                for a, w in sup.cores.items()
            },
            "executor": {a: w.executor_status() for a, w in sup.cores.items()},
            "package_digest": sup.loaded.digest if sup.loaded else None,
            "recoveries": sup.isolation_evidence(),
        }


__all__ = [
    "CoreOptions",
    "DeviceSupervisor",
    "LifecycleResult",
    "LoadResult",
    "ModelState",
    "ReloadResult",
    "RollbackResult",
    "ServingEngine",
    "SupervisorOptions",
    "UnloadResult",
]
