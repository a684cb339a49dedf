"""The host-side bookkeeping both backends keep alike, in one place so the mock and CalRT cannot drift.

:class:`DeviceBookkeeping` is the base of :class:`calctl.runtime.mock.MockRuntime` and
:class:`calctl.runtime._native.backend.CalrtRuntime`. It keeps what the Python side owns whatever the device:

* buffer ownership: ``job_buffers``, ``release_buffer``, and a buffer let go while its job still owns it
  released as soon as the job (or the reset that frees a quarantined one) gives it back;
* the current calbin, and a calbin released while configured let go when the configuration is dropped;
* ``submit``'s argument checks and its listeners (:meth:`Runtime.on_submit`);
* the history of finished jobs (their trace events, and through :meth:`DeviceBookkeeping._forget` the backend's
  kept result), bounded by count (``history`` trace events) **and** by its estimated host memory
  (``history_bytes``, :mod:`calctl.runtime.history`), and the messages both backends give for an unknown job or
  a wait that timed out.

A backend supplies the device's side: ``_alloc`` (a buffer of a graph's layout), ``_free_storage`` and
``_free_calbin`` (give a handle back to the device), ``_submit`` (hand a checked job to the device) and
``close``. This module makes no device call and holds no lock of its own: it takes the backend's
``_lock`` (re-entrant), under which every method here runs.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, Generic, Protocol, TypeVar

from calctl.closing import Closes
from calctl.runtime.buffers import BufferState, Direction, HostBuffer
from calctl.runtime.calbin import Calbin, GraphPlan, check_job_buffers, resolve_graph
from calctl.runtime.errors import InvalidArgument, Timeout, error_class
from calctl.runtime.history import DEFAULT_HISTORY_BYTES, JobHistoryUsage, KeptJobs
from calctl.runtime.types import (
    Engine,
    GenerationId,
    Job,
    JobId,
    JobResult,
    JobState,
    KvSeqId,
    PhaseInterval,
    ResetScope,
    TraceEvent,
)


class JobRecord(Protocol):
    """What a backend keeps of a job in flight: the job and the two buffers it owns until it ends."""

    job: Job
    inputs: HostBuffer
    outputs: HostBuffer


RecordT = TypeVar("RecordT", bound=JobRecord)
HandleT = TypeVar("HandleT")  # what a backend keeps beside a calbin (the mock's models, a C handle)


class DeviceBookkeeping(Closes, Generic[RecordT, HandleT]):
    """Host-side state of an open device; see the module docstring for what a backend adds."""

    _lock: AbstractContextManager[Any]  # re-entrant: an RLock, or a Condition over one

    def _init_bookkeeping(
        self, lock: AbstractContextManager[Any], history: int, history_bytes: int = DEFAULT_HISTORY_BYTES
    ) -> None:
        self._lock = lock
        self._closed = False
        self._submit_listeners: list[Callable[[Job], None]] = []
        self._buffer_ids = itertools.count(1)
        self._calbin_ids = itertools.count(1)
        self._buffers: dict[int, HostBuffer] = {}
        self._release_when_free: set[int] = set()
        self._calbins: dict[int, tuple[Calbin, HandleT]] = {}
        self._release_when_unconfigured: set[int] = set()
        self._current: Calbin | None = None
        self._quarantined: dict[JobId, RecordT] = {}
        self._history = history
        self._trace: deque[TraceEvent] = deque()
        # Beside each trace event, the largest submit_ns of it and every event appended before it. Events are
        # appended as jobs finish, so submit times are only nearly in order; this running maximum lets trace()
        # walk back from the newest event and stop at the first one that no earlier event can pass (a job's
        # record asks for its own events: a few steps, not the whole history).
        self._trace_high: deque[int] = deque()
        self._trace_top = 0
        # The finished jobs kept, oldest first: what evicting one drops (its trace events, the backend's result).
        self._kept = KeptJobs(history, history_bytes)

    # -- what a backend provides ---------------------------------------------------------------

    def close(self) -> None:
        raise NotImplementedError

    def _alloc(self, graph: str, direction: Direction, batch: int) -> HostBuffer:
        raise NotImplementedError

    def _free_storage(self, buffer: HostBuffer) -> None:
        """Give ``buffer``'s storage back to the device (under the lock). Nothing for host-only storage."""

    def _free_calbin(self, calbin: Calbin, handle: HandleT) -> None:
        """Give a released, unconfigured calbin's device handle back (under the lock)."""

    def _forget(self, job: JobId) -> None:
        """Drop what the backend keeps of finished ``job`` (its result for wait/query): the history let it go."""

    #: Hand one job to the device: ``(graph name, inputs, outputs, engine, KV lanes, generation)``; the backend
    #: checks it with :meth:`_submit_plan` under its lock and lends it the buffers.
    _submit: Callable[[str, HostBuffer, HostBuffer, Engine, tuple[KvSeqId | None, ...], GenerationId], Job]

    # -- device ------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("the device is closed")

    # -- calbin / configuration ----------------------------------------------------------------------

    @property
    def current_calbin(self) -> Calbin | None:
        return self._current

    def _calbin_entry(self, calbin: Calbin, *, refuse_released: bool = False) -> HandleT:
        """What the device keeps for ``calbin``; InvalidArgument when it is not this device's (or released)."""
        entry = self._calbins.get(calbin.id)
        if entry is None or entry[0] is not calbin or (refuse_released and calbin.released):
            raise InvalidArgument(f"{calbin!r} was not created on this device or was released")
        return entry[1]

    def _release_calbin(self, calbin: Calbin) -> None:
        with self._lock:
            if self._closed or calbin.id not in self._calbins:
                return
            if self._current is calbin:
                # Released while configured: let go when the configuration is reset (release on every path).
                self._release_when_unconfigured.add(calbin.id)
                return
            _, handle = self._calbins.pop(calbin.id)
            self._free_calbin(calbin, handle)

    def _unconfigured(self) -> None:
        """The device dropped its configuration: no current calbin; release one that waited for it."""
        calbin, self._current = self._current, None
        if calbin is not None and calbin.id in self._release_when_unconfigured:
            self._release_when_unconfigured.discard(calbin.id)
            self._release_calbin(calbin)

    def _graph(self, name: str) -> GraphPlan:
        return resolve_graph(self._current, name)

    # -- buffers ---------------------------------------------------------------------------------------

    def alloc_inputs(self, graph: str, batch: int = 1) -> HostBuffer:
        return self._alloc(graph, Direction.INPUT, batch)

    def alloc_outputs(self, graph: str, batch: int = 1) -> HostBuffer:
        return self._alloc(graph, Direction.OUTPUT, batch)

    @contextmanager
    def job_buffers(self, graph: str, batch: int = 1) -> Iterator[tuple[HostBuffer, HostBuffer]]:
        """``(inputs, outputs)`` released on exit, or as soon as the job that owns one lets go of it."""
        with ExitStack() as release:  # last in, first out: outputs, then inputs
            inputs = self.alloc_inputs(graph, batch)
            release.callback(self._let_go, inputs)
            outputs = self.alloc_outputs(graph, batch)
            release.callback(self._let_go, outputs)
            yield inputs, outputs

    def release_buffer(self, buffer: HostBuffer) -> None:
        with self._lock:
            if self._buffers.get(buffer.id) is not buffer:
                raise InvalidArgument(f"{buffer!r} does not belong to this device or was released")
            buffer.check_releasable()
            self._free_storage(buffer)
            buffer.mark_released()
            del self._buffers[buffer.id]

    def _let_go(self, buffer: HostBuffer) -> None:
        """Release now, or as soon as the job (or reset) that owns the buffer lets go of it."""
        with self._lock:
            if self._closed or self._buffers.get(buffer.id) is not buffer:
                return
            if buffer.state in (BufferState.IN_FLIGHT, BufferState.QUARANTINED):
                self._release_when_free.add(buffer.id)
                return
            self.release_buffer(buffer)

    def _give_back(self, buffer: HostBuffer) -> None:
        """A job let go of ``buffer``: the caller owns it again, or it is released if it was let go meanwhile."""
        buffer.give_back()
        if buffer.id in self._release_when_free and not self._closed:
            self._release_when_free.discard(buffer.id)
            self.release_buffer(buffer)

    def _settle(self, rec: RecordT, *, quarantine: bool) -> None:
        """A job ended: its buffers come back, or stay quarantined until a reset (UNKNOWN_DMA_STATE, 001 §9.1)."""
        if quarantine:
            rec.inputs.quarantine()
            rec.outputs.quarantine()
            self._quarantined[rec.job.id] = rec
        else:
            self._give_back(rec.inputs)
            self._give_back(rec.outputs)

    def _release_quarantined(self, chips: set[int]) -> None:
        """A reset of ``chips`` ends every unknown DMA state on them: their quarantined buffers come back."""
        for job_id, rec in list(self._quarantined.items()):
            if chips.intersection(rec.job.chips):
                del self._quarantined[job_id]
                self._give_back(rec.inputs)
                self._give_back(rec.outputs)

    # -- jobs --------------------------------------------------------------------------------------------

    def submit(
        self,
        model_name: str,
        inputs: HostBuffer,
        outputs: HostBuffer,
        engine: Engine | str = Engine.AUTO,
        *,
        kv: Sequence[KvSeqId | None] = (),
        generation: GenerationId = GenerationId(0),
    ) -> Job:
        try:
            eng = Engine(engine)
        except ValueError:
            raise InvalidArgument(f"engine {engine!r}: expected auto, ping or pong") from None
        job = self._submit(model_name, inputs, outputs, eng, tuple(kv), generation)
        for listener in self._submit_listeners:
            listener(job)
        return job

    def _submit_plan(
        self, model_name: str, inputs: HostBuffer, outputs: HostBuffer, lanes: tuple[KvSeqId | None, ...]
    ) -> GraphPlan:
        """The checks every submit makes first (under the lock): the device is open, the graph configured, the
        buffers the caller's and the graph's, one KV entry per lane. Returns the graph's plan."""
        self._check_open()
        plan = self._graph(model_name)
        check_job_buffers(self._buffers, plan, inputs, outputs)
        if len(lanes) != inputs.batch:
            raise InvalidArgument(
                f"graph {plan.name!r} at B{inputs.batch} needs kv= with {inputs.batch} "
                f"entries (a KvSeqId per lane, None for an inactive lane), got {len(lanes)}"
            )
        return plan

    @staticmethod
    def _job(
        job_id: int,
        plan: GraphPlan,
        inputs: HostBuffer,
        engine: Engine,
        lanes: tuple[KvSeqId | None, ...],
        *,
        generation: GenerationId,
        submit_ns: int,
    ) -> Job:
        """The handle of an accepted submit: what it runs, where, and with which buffers' batch and KV lanes."""
        return Job(
            id=JobId(job_id),
            graph=plan.name,
            model=plan.model,
            chips=plan.chips,
            engine=engine,
            generation=generation,
            batch=inputs.batch,
            kv=lanes,
            submit_ns=submit_ns,
        )

    def on_submit(self, listener: Callable[[Job], None]) -> None:
        self._submit_listeners.append(listener)

    def job_history(self) -> JobHistoryUsage:
        """How much of the bounded history of finished jobs is in use (:class:`calctl.runtime.history.KeptJobs`)."""
        with self._lock:
            return self._kept.usage()

    def trace(self, *, since_ns: int = 0) -> tuple[TraceEvent, ...]:
        with self._lock:
            if since_ns <= 0:
                return tuple(self._trace)
            newest_first = []
            for e, high in zip(reversed(self._trace), reversed(self._trace_high), strict=True):
                if high < since_ns:
                    break
                if e.submit_ns >= since_ns:
                    newest_first.append(e)
            return tuple(reversed(newest_first))

    def _trace_job(
        self,
        job: Job,
        result: JobResult,
        *,
        submit_ns: int | None = None,
        phases: tuple[PhaseInterval, ...] | None = None,
    ) -> None:
        """One trace event per chip of a finished job; ``phases`` go on its first chip (None: not reported).
        The job joins the kept history; the oldest jobs leave it while it is over its count or its bytes."""
        events = tuple(
            TraceEvent(
                job=job.id,
                chip=chip,
                model=job.model,
                graph=job.graph,
                engine=job.engine,
                generation=job.generation,
                submit_ns=submit_ns or job.submit_ns,
                start_ns=result.start_ns,
                end_ns=result.end_ns,
                state=result.state,
                status=result.status,
                phases=phases if phases is None or chip == job.chips[0] else (),
            )
            for chip in job.chips
        )
        for event in events:
            self._trace_top = max(self._trace_top, event.submit_ns)
            self._trace_high.append(self._trace_top)
            self._trace.append(event)
        for old in self._kept.add(job.id, result, events):
            for _ in range(old.events):
                self._trace.popleft()
                self._trace_high.popleft()
            self._forget(old.job)

    # -- the answers both backends give alike -----------------------------------------------------

    @staticmethod
    def _result_or_raise(result: JobResult) -> JobResult:
        """A succeeded job's result; the job's own typed error (CcuException, JobAborted, ...) otherwise."""
        if result.state is JobState.SUCCEEDED:
            return result
        raise error_class(result.status)(
            f"job {result.job.id} ({result.job.graph}) {result.state.value}: {result.detail}", job=result.job.id
        )

    def _unknown_job(self, job: Job) -> InvalidArgument:
        return InvalidArgument(
            f"job {job.id} is not known to this device (never submitted here, or older than the history of "
            f"finished jobs it keeps: {self._kept.usage().describe()})"
        )

    @staticmethod
    def _wait_timeout(job: Job, timeout: float) -> Timeout:
        return Timeout(
            f"job {job.id} ({job.graph}) not finished after {timeout:g} s; it stays in flight and keeps its buffers",
            job=job.id,
        )

    @staticmethod
    def _reset_scope(scope: ResetScope | str) -> ResetScope:
        try:
            return ResetScope(scope)
        except ValueError:
            raise InvalidArgument(f"reset scope {scope!r}: expected chip or board") from None

    @staticmethod
    def _reset_chip(chip: int | None, chips: int) -> int:
        """The chip a chip reset names, one of the board's ``chips``."""
        if chip is None or not 0 <= chip < chips:
            raise InvalidArgument(f"a chip reset needs chip=0..{chips - 1}, got {chip!r}")
        return chip
