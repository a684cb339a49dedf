"""The one interface every board backend implements: :class:`Runtime` (docs/runtime.md).

Two backends: the mock board (:mod:`calctl.runtime.mock`, the default) and the
CalRT C ABI through ctypes (:mod:`calctl.runtime._native`). Both keep CalRT
0.7.6 semantics (001 §2.1–§2.5): one physical device per process, one current
calbin, ``submit`` without a chip argument (the chip comes from the graph's
target chips / section masks, 001 §6.4), ``wait`` with a timeout, a KV manager,
per-chip memory and counters.

Contract every implementation keeps:

* it raises only :class:`calctl.runtime.errors.RuntimeLayerError` subclasses
  (all :class:`calctl.errors.DeviceError`, exit 3);
* every method is thread-safe; ``wait``/``wait_any`` block without holding a lock
  so several threads (each model's engine core, its completion threads) can each wait for
  their own job;
* ``wait`` that times out raises :class:`Timeout` and changes nothing: the job
  stays in flight and keeps owning its buffers;
* a per-chip figure the runtime cannot provide is ``None``, never 0 (001 §14);
* every job carries the caller's ``generation`` so stale completions can be
  dropped upstream (000 §4).

This module declares; it implements nothing and imports no backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from calctl.package.model import Package
from calctl.runtime.buffers import HostBuffer
from calctl.runtime.calbin import Calbin
from calctl.runtime.types import (
    ChipCounters,
    ChipHealth,
    ChipMemory,
    ChipTelemetry,
    DeviceKind,
    Engine,
    GenerationId,
    Job,
    JobResult,
    KvLength,
    KvSeqId,
    ResetScope,
    Topology,
    TraceEvent,
    Versions,
)

if TYPE_CHECKING:  # the fault vocabulary is the simulated boards'; nothing is imported at run time
    from calctl.runtime.mock.faults import FaultRule, InjectedFault


@runtime_checkable
class KvManager(Protocol):
    """The runtime's KV manager (0.7.6 ``KvManager``; 000 §9). One namespace per model alias.

    A job writes K/V into tokens reserved with :meth:`append`; they count as
    committed only after :meth:`commit`, which the caller does once the device
    *and* the output succeeded (000 §9.2 rule 5). A sequence bound to a job in
    flight cannot be committed, rolled back, trimmed or freed (DeviceBusy).
    """

    def can_allocate(self, model: str, n: int = 1) -> bool:
        """True if ``n`` more sequences of ``model`` fit (0.7.6 ``canAllocate(seq_num)``)."""
        ...

    def allocate(self, model: str) -> KvSeqId:
        """A new empty sequence of ``model``. OutOfMemory when none is free."""
        ...

    def append(self, seq: KvSeqId, n: int) -> int:
        """Reserve ``n`` tokens at the end; return their first position (== committed length)."""
        ...

    def commit(self, seq: KvSeqId) -> KvLength:
        """Make the reserved tokens committed. InvalidArgument if the job that wrote them failed."""
        ...

    def rollback(self, seq: KvSeqId) -> KvLength:
        """Drop reserved, uncommitted tokens (after a failed job)."""
        ...

    def remove_tokens_at_end(self, seq: KvSeqId, n: int) -> KvLength:
        """0.7.6 ``RemoveTokensAtEnd``: drop ``n`` committed tokens (nothing may be reserved)."""
        ...

    def free(self, seq: KvSeqId) -> None:
        """Return the sequence to the pool."""
        ...

    def length(self, seq: KvSeqId) -> KvLength: ...


@runtime_checkable
class Runtime(Protocol):
    """An open board. Use as a context manager: the device is released on every path."""

    @property
    def kind(self) -> DeviceKind:
        """``mock`` or ``calrt``. Results from ``mock`` are mock results (docs/runtime.md §5)."""
        ...

    # -- device ---------------------------------------------------------------

    def close(self) -> None:
        """Abort what is in flight, drop the configuration, release every handle. Idempotent."""
        ...

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has run (a telemetry sampler stops on it)."""
        ...

    def __enter__(self) -> Runtime: ...

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None: ...

    def topology(self) -> Topology: ...

    def versions(self) -> Versions: ...

    # -- calbin / configuration (001 §2.4: one current calbin) -------------------

    def create_calbin(self, package: Package) -> Calbin:
        """Check names, chip targets and masks (001 §6.4) and create a calbin. InvalidCalbin on any problem."""
        ...

    def configure(self, calbin: Calbin) -> None:
        """Make ``calbin`` current. AlreadyConfigured if one is; OutOfMemory if a chip's plan does not fit."""
        ...

    def reset_configuration(self) -> None:
        """Drop the current calbin (0.7.6 ``ResetConfiguration``). DeviceBusy while jobs are in flight."""
        ...

    @property
    def current_calbin(self) -> Calbin | None: ...

    # -- buffers (per job, owned by the caller until the job completes) -----------

    def alloc_inputs(self, graph: str, batch: int = 1) -> HostBuffer: ...

    def alloc_outputs(self, graph: str, batch: int = 1) -> HostBuffer: ...

    def release_buffer(self, buffer: HostBuffer) -> None:
        """BufferInUse while a job (or an unknown DMA state) still owns it."""
        ...

    def job_buffers(self, graph: str, batch: int = 1) -> AbstractContextManager[tuple[HostBuffer, HostBuffer]]:
        """``(inputs, outputs)`` released on exit; a buffer still owned by a job is released when it is let go."""
        ...

    # -- jobs ---------------------------------------------------------------------

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
        """Submit one job of graph ``model_name`` (the EXACT graph name). No chip argument.

        ``kv`` names one KV sequence per batch lane (None for an inactive lane),
        mirroring the graph's CSR metadata; a graph that writes KV needs it.
        """
        ...

    def on_submit(self, listener: Callable[[Job], None]) -> None:
        """Call ``listener(job)`` after every submit this runtime accepted, from the submitting thread (a
        caller's own count of what it handed the device, e.g. soak's "job counters close"). It must not call
        back into the runtime."""
        ...

    def wait(self, job: Job, timeout: float) -> JobResult:
        """Block up to ``timeout`` seconds. Returns the result of a succeeded job; raises the
        job's typed error (CcuException, UnknownDmaState, JobAborted, ...) if it failed, and
        Timeout if it is still in flight (nothing changes then)."""
        ...

    def wait_any(self, jobs: Iterable[Job], timeout: float) -> list[Job]:
        """The subset of ``jobs`` that reached a terminal state, waiting up to ``timeout`` for
        at least one. Never raises for a job's own failure; ``[]`` when none finished."""
        ...

    def query(self, job: Job) -> JobResult:
        """Where the job is now, without blocking or raising for the job's own failure."""
        ...

    # -- KV ------------------------------------------------------------------------

    @property
    def kv(self) -> KvManager: ...

    # -- observation ---------------------------------------------------------------

    def memory_usage(self) -> tuple[ChipMemory, ...]: ...

    def counters(self) -> tuple[ChipCounters, ...]: ...

    def health(self) -> tuple[ChipHealth, ...]: ...

    def telemetry(self) -> tuple[ChipTelemetry, ...]:
        """001 §14 per-chip temperature, power, frequency, throttle, reset count and queue depth; None and a
        listed vendor gap for what the runtime cannot report (docs/runtime.md)."""
        ...

    def trace(self, *, since_ns: int = 0) -> tuple[TraceEvent, ...]:
        """Per-chip job intervals of completed jobs, oldest first (bounded history)."""
        ...

    # -- recovery ------------------------------------------------------------------

    def reset(self, scope: ResetScope | str = ResetScope.CHIP, chip: int | None = None) -> None:
        """Recover a faulted or hung chip (``chip``) or the whole board. Jobs on the reset chips
        are aborted and their KV sequences emptied; a board reset also drops the configuration.
        NotSupported when the runtime lacks the scope; DeviceLost when the fault needs a wider one."""
        ...


@runtime_checkable
class FaultInjecting(Protocol):
    """What only a simulated board can do: take a fault rule at run time and say which faults fired.

    Runners that inject faults (bench fault-isolation and batch, soak, isolation) check
    ``isinstance(rt, FaultInjecting)`` and refuse, or report the faults as unknown, on a board without it;
    they never reach for a backend's class or private attributes."""

    def arm_fault(self, rule: FaultRule) -> int:
        """Add a fault rule now; its ordinals count from this call. Returns its index."""
        ...

    def injected_faults(self) -> tuple[InjectedFault, ...]:
        """Every fault that fired so far, in the order it fired."""
        ...

    def fault_rules(self) -> tuple[FaultRule, ...]:
        """The rules of the board's own fault plan, as configured when it was opened."""
        ...
