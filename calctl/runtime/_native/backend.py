"""The CalRT backend: :class:`Runtime` over the C ABI shim through ctypes (docs/runtime.md).

Every C call goes through :meth:`CalrtRuntime._check`, the one place where a
``calrt_status`` becomes a typed :class:`RuntimeLayerError` (python-tuf's
"one choke point" pattern, STYLE.md). The two statuses a caller expects as an
answer rather than an error are handled before it: TIMEOUT from a wait, and
NOT_SUPPORTED from a per-chip query (which becomes ``None``, never 0, 001 §14).

Handles never leak: the device is closed by ``close()``/``with``, or by a
finalizer if the object is dropped; buffers and calbins are released through
their owner, and a job record is released in C as soon as its terminal state
has been observed (the Python side keeps the result).

This module holds no lock while blocked in ``calrt_job_wait``; ctypes releases
the GIL for the call, so several threads (each model's engine core, its
completion threads) can wait on their own jobs concurrently. It does not
validate packages beyond the calbin plan
(:func:`calctl.runtime.calbin.plan_calbin`), build the ctypes descriptors it
hands the shim (:mod:`.descriptors`), keep KV state (:mod:`.kv`: every KV call
goes to the shim) or keep the host-side buffer, calbin and trace bookkeeping it
shares with the mock (:mod:`calctl.runtime.bookkeeping`).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from ctypes import byref, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from calctl.package.model import Package
from calctl.runtime import board_lock
from calctl.runtime._native import ext
from calctl.runtime._native import lib as L
from calctl.runtime._native.descriptors import calbin_desc, job_desc
from calctl.runtime._native.kv import CalrtKvManager
from calctl.runtime._native.memory import NativeMemory  # the optional device memory calls (C ABI §14)
from calctl.runtime._native.telemetry import chip_telemetry
from calctl.runtime._native.telemetry import new_struct as new_telemetry
from calctl.runtime.bookkeeping import DeviceBookkeeping
from calctl.runtime.buffers import Direction, HostBuffer, buffer_layout
from calctl.runtime.calbin import Calbin, ModelPlan, plan_calbin
from calctl.runtime.errors import InternalRuntimeError, InvalidArgument, RuntimeStatus, error_class, error_for_status
from calctl.runtime.history import history_bytes_from_env
from calctl.runtime.types import (
    ChipCounters,
    ChipHealth,
    ChipMemory,
    ChipTelemetry,
    DeviceKind,
    Engine,
    GenerationId,
    Health,
    Job,
    JobId,
    JobResult,
    JobState,
    KvSeqId,
    ResetScope,
    Topology,
    Versions,
    telemetry_gaps,
)

HISTORY = 65536

_Out = TypeVar("_Out", bound="ctypes._CData")


def _close_device(fn: ctypes.CDLL, dev: c_void_p) -> None:
    fn.calrt_device_close(dev)


@dataclass(frozen=True)
class DeviceIdentity:
    """What the shim says the open device is (calrt_ext.h): a board id (PCI address, serial) and a kind."""

    board: str | None
    kind: int  # L.EXT_DEVICE_UNKNOWN / _HARDWARE / _SOFTWARE_MODEL

    @property
    def software_model(self) -> bool:
        return self.kind == L.EXT_DEVICE_SOFTWARE_MODEL


@dataclass
class _NativeJob:
    job: Job
    inputs: HostBuffer
    outputs: HostBuffer
    result: JobResult | None = None


class CalrtRuntime(NativeMemory, DeviceBookkeeping[_NativeJob, c_void_p]):
    """An open CalRT device; implements :class:`calctl.runtime.interface.Runtime`."""

    kind = DeviceKind.CALRT

    def __init__(self, library: L.CalrtLibrary) -> None:
        self.library = library
        self._fn = library.fn
        self._board_locks: list[board_lock.BoardLock] = []  # set by open_calrt (one process per board)
        # Python-side bookkeeping under an RLock, never held while blocked in a wait
        self._init_bookkeeping(threading.RLock(), HISTORY, history_bytes_from_env())
        self._waiters = threading.Condition()  # counts threads inside calls made without _lock
        self._blocked = 0  # ... blocked inside calrt_job_wait[_any]
        self._inside = 0  # ... inside any call made without _lock (job, KV and per-chip query calls)
        self._identity: DeviceIdentity | None = None
        dev = c_void_p()
        self._check(self._fn.calrt_device_open(byref(dev)), "open the device")
        self._dev = dev
        self._finalizer = weakref.finalize(self, _close_device, self._fn, dev)
        self._jobs: OrderedDict[JobId, _NativeJob] = OrderedDict()
        self._kv = CalrtKvManager(self)
        topo = L.CalrtTopology()
        with contextlib.ExitStack() as failed:  # no topology: the device is closed again
            failed.callback(self.close)
            self._check(self._fn.calrt_topology_get(self._dev, byref(topo)), "query the topology")
            failed.pop_all()
        chips = min(int(topo.chips), L.MAX_CHIPS)
        self._topology = Topology(
            chips=chips,
            calcores_per_chip=int(topo.calcores_per_chip),
            dram_bytes=tuple(
                None if topo.dram_bytes[c] == L.UNKNOWN_U64 else int(topo.dram_bytes[c]) for c in range(chips)
            ),
        )

    # -- the choke point ---------------------------------------------------------------

    def _check(self, status: int, what: str, *, job: int | None = None) -> None:
        """Turn a non-OK ``calrt_status`` into its typed error; the only place that does."""
        if status == RuntimeStatus.OK:
            return
        raise error_for_status(status, f"CalRT {what}: {self.library.status_string(status)}", job=job)

    # -- device ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            with self._waiters:
                if self._closed:
                    return
                self._closed = True
                blocked = self._blocked
            if blocked:
                # Threads are inside calrt_job_wait: abort their jobs so they return, then let them leave
                # before the device is freed under them (C ABI §8).
                self._fn.calrt_reset(self._dev, ResetScope.BOARD.code, 0)
            with self._waiters:  # every call made without _lock has left the library
                self._waiters.wait_for(lambda: self._inside == 0)
            # calrt_device_close aborts what is in flight and frees every handle of the device (C ABI §5).
            for buf in self._buffers.values():
                buf.mark_released()
            self._buffers.clear()
            self._calbins.clear()
            self._current = None
            self._finalizer()
            for lock in self._board_locks:
                lock.release()

    def topology(self) -> Topology:
        return self._topology

    def versions(self) -> Versions:
        v = L.CalrtVersions()
        with self._lock:
            self._check_open()
            self._check(self._fn.calrt_versions_get(self._dev, byref(v)), "query versions")
        major, minor = self.library.abi
        firmware = _text(v.firmware)
        identity = self.identity()
        software = identity.software_model if identity.kind != L.EXT_DEVICE_UNKNOWN else None
        if software is None:
            software = "software model" in firmware.lower()
        return Versions(
            runtime=_text(v.runtime),
            driver=_text(v.driver),
            firmware=firmware,
            abi=f"{major}.{minor}",
            software_model=software,
        )

    def identity(self) -> DeviceIdentity:
        """Which board is open, as the shim reports it (``calrt_ext_device_identity``); kind unknown without it."""
        if self._identity is None:
            if not self.library.has("calrt_ext_device_identity"):
                self._identity = DeviceIdentity(None, L.EXT_DEVICE_UNKNOWN)
            else:
                out = L.CalrtExtIdentity()
                with self._lock:
                    self._check_open()
                    self._check(self._fn.calrt_ext_device_identity(self._dev, byref(out)), "query the device identity")
                board = _text(out.id).strip() or None
                kind = int(out.kind) if int(out.kind) in (L.EXT_DEVICE_HARDWARE, L.EXT_DEVICE_SOFTWARE_MODEL) else 0
                self._identity = DeviceIdentity(board, kind)
        return self._identity

    # -- calbin / configuration ----------------------------------------------------------

    def create_calbin(self, package: Package) -> Calbin:
        plan = plan_calbin(package, self._topology)
        keep: list[object] = []  # ctypes objects that must outlive the call
        desc = calbin_desc(plan, keep)
        handle = c_void_p()
        with self._lock:
            self._check_open()
            self._check(
                self._fn.calrt_calbin_create(self._dev, byref(desc), byref(handle)),
                f"create a calbin from {package.name!r}",
            )
            with contextlib.ExitStack() as failed:  # models not described: the calbin is released again
                failed.callback(self._fn.calrt_calbin_release, self._dev, handle)
                self._describe_models(plan.models.values(), handle)
                failed.pop_all()
            calbin = Calbin(plan, next(self._calbin_ids), self._release_calbin)
            self._calbins[calbin.id] = (calbin, handle)
            return calbin

    def _describe_models(self, models: Iterable[ModelPlan], handle: c_void_p) -> None:
        """Optional C ABI extension (§11): hand a computing board each model's architecture and tensors."""
        if not self.library.has("calrt_ext_model_set"):
            return
        for mp in models:
            keep: list[object] = []
            desc = ext.model_desc(mp.model, keep)
            rc = self._fn.calrt_ext_model_set(self._dev, handle, byref(desc))
            if rc == RuntimeStatus.NOT_SUPPORTED:  # the shim does not know model v1: it computes on its own
                return
            self._check(rc, f"describe model {mp.alias!r} (C ABI extension model v{L.EXT_MODEL_VERSION})")

    def _forget(self, job: JobId) -> None:
        rec = self._jobs.get(job)
        if rec is not None and rec.result is not None:  # the history let it go: wait/query no longer know it
            del self._jobs[job]

    def _free_calbin(self, calbin: Calbin, handle: c_void_p) -> None:
        self._check(self._fn.calrt_calbin_release(self._dev, handle), f"release calbin {calbin.id}")

    def configure(self, calbin: Calbin) -> None:
        with self._lock:
            self._check_open()
            handle = self._calbin_entry(calbin)
            self._check(
                self._fn.calrt_configure(self._dev, handle), f"configure calbin {calbin.id} ({calbin.package.name!r})"
            )
            self._current = calbin

    def reset_configuration(self) -> None:
        with self._lock:
            self._check_open()
            self._check(self._fn.calrt_reset_configuration(self._dev), "reset the configuration")
            self._unconfigured()

    # -- buffers ---------------------------------------------------------------------------

    def _alloc(self, graph: str, direction: Direction, batch: int) -> HostBuffer:
        with self._lock:
            self._check_open()
            layout = buffer_layout(self._graph(graph).graph, direction, batch)
            handle, data = c_void_p(), c_void_p()
            self._check(
                self._fn.calrt_buffer_create(self._dev, layout.nbytes, byref(handle)),
                f"create a {direction.value} buffer",
            )
            with contextlib.ExitStack() as failed:  # not mapped: the buffer is released again
                failed.callback(self._fn.calrt_buffer_release, self._dev, handle)
                self._check(self._fn.calrt_buffer_data(self._dev, handle, byref(data)), "map a buffer")
                failed.pop_all()
            assert data.value is not None
            storage = np.ctypeslib.as_array(ctypes.cast(data, ctypes.POINTER(ctypes.c_uint8)), shape=(layout.nbytes,))
            buf = HostBuffer(next(self._buffer_ids), layout, storage, native=handle)
            self._buffers[buf.id] = buf
            return buf

    def _free_storage(self, buffer: HostBuffer) -> None:
        self._check(self._fn.calrt_buffer_release(self._dev, buffer.native), f"release buffer {buffer.id}")

    # -- jobs ----------------------------------------------------------------------------------

    def _submit(
        self,
        model_name: str,
        inputs: HostBuffer,
        outputs: HostBuffer,
        engine: Engine,
        lanes: tuple[KvSeqId | None, ...],
        generation: GenerationId,
    ) -> Job:
        with self._lock:
            plan = self._submit_plan(model_name, inputs, outputs, lanes)
            desc = job_desc(plan.name, inputs, outputs, engine, lanes, generation)
        job_id = c_uint64()
        submit_ns = time.monotonic_ns()
        with self._unlocked_call():  # C ABI §8: submit is thread-safe; calctl does not serialise it
            rc = self._fn.calrt_job_submit(self._dev, byref(desc), byref(job_id))
        self._check(rc, f"submit {plan.name!r}")
        with self._lock:
            job = self._job(job_id.value, plan, inputs, engine, lanes, generation=generation, submit_ns=submit_ns)
            inputs.lend(job.id)
            outputs.lend(job.id)
            self._jobs[job.id] = _NativeJob(job, inputs, outputs)
            while len(self._jobs) > HISTORY:
                old_id, old = next(iter(self._jobs.items()))
                if old.result is None:
                    break
                del self._jobs[old_id]
        return job

    def wait(self, job: Job, timeout: float) -> JobResult:
        rec = self._record(job)
        if rec.result is None:
            info = L.CalrtJobInfo()
            with self._unlocked_call(blocking=True):
                rc = self._fn.calrt_job_wait(self._dev, job.id, _ms(timeout), byref(info))  # GIL released
            if rc == RuntimeStatus.TIMEOUT:
                raise self._wait_timeout(job, timeout)
            if rc != RuntimeStatus.OK and rec.result is None:
                self._check(rc, f"wait for job {job.id}", job=job.id)
            if rc == RuntimeStatus.OK:
                self._retire(rec, info)
        assert rec.result is not None
        return self._result_or_raise(rec.result)

    def wait_any(self, jobs: Iterable[Job], timeout: float) -> list[Job]:
        records = [self._record(j) for j in jobs]
        pending = [r for r in records if r.result is None]
        if records and len(pending) == len(records):
            ids = (c_uint64 * len(pending))(*[r.job.id for r in pending])
            index = c_uint32()
            with self._unlocked_call(blocking=True):
                rc = self._fn.calrt_job_wait_any(self._dev, ids, len(pending), _ms(timeout), byref(index))
            if rc == RuntimeStatus.TIMEOUT:
                return []
            if rc != RuntimeStatus.OK and all(r.result is None for r in pending):
                self._check(rc, "wait for any job")
        for r in records:
            if r.result is None:
                self._observe(r)
        return [r.job for r in records if r.result is not None and r.result.state.terminal]

    def query(self, job: Job) -> JobResult:
        rec = self._record(job)
        return rec.result if rec.result is not None else self._observe(rec)

    def _observe(self, rec: _NativeJob) -> JobResult:
        info = L.CalrtJobInfo()
        with self._unlocked_call():
            rc = self._fn.calrt_job_query(self._dev, rec.job.id, byref(info))
        if rec.result is not None:  # another thread retired it meanwhile
            return rec.result
        self._check(rc, f"query job {rec.job.id}", job=rec.job.id)
        state = _state(int(info.state), rec.job.id)
        if state.terminal:
            return self._retire(rec, info)
        return JobResult(job=rec.job, state=state, status=RuntimeStatus.OK, start_ns=_ns(info.start_ns), end_ns=None)

    def _retire(self, rec: _NativeJob, info: L.CalrtJobInfo) -> JobResult:
        """First observation of a terminal state: keep the result, free buffers, trace, release the C record."""
        with self._lock:
            if rec.result is not None:
                return rec.result
            status = (
                RuntimeStatus(info.status)
                if info.status in RuntimeStatus._value2member_map_
                else RuntimeStatus.INTERNAL
            )
            state = _state(int(info.state), rec.job.id)
            result = JobResult(
                job=rec.job,
                state=state,
                status=status,
                start_ns=_ns(info.start_ns),
                end_ns=_ns(info.end_ns),
                detail=None if state is JobState.SUCCEEDED else self.library.status_string(int(info.status)),
            )
            rec.result = result
            self._settle(rec, quarantine=status is RuntimeStatus.UNKNOWN_DMA_STATE)
            self._trace_job(rec.job, result, submit_ns=int(info.submit_ns))
        # The C record goes as soon as the terminal state is seen (C ABI §5); the call is not serialised.
        with self._waiters:
            release = not self._closed
            if release:
                self._inside += 1
        if release:
            try:
                rc = self._fn.calrt_job_release(self._dev, rec.job.id)
            finally:
                with self._waiters:
                    self._inside -= 1
                    self._waiters.notify_all()
            self._check(rc, f"release job {rec.job.id}", job=rec.job.id)
        return result

    def _record(self, job: Job) -> _NativeJob:
        with self._lock:
            self._check_open()
            rec = self._jobs.get(job.id)
            if rec is None or rec.job != job:
                raise self._unknown_job(job)
            return rec

    # -- KV / observation -------------------------------------------------------------------------

    @property
    def kv(self) -> CalrtKvManager:
        return self._kv

    def _chip_query(self, fn_name: str, out: _Out, what: str, chip: int) -> _Out | None:
        """One per-chip query into ``out``; None when the runtime answers NOT_SUPPORTED (a vendor gap: the figure
        is unknown, never 0). Per-chip queries are thread-safe (C ABI §8): not serialised."""
        with self._unlocked_call():
            rc = getattr(self._fn, fn_name)(self._dev, chip, byref(out))
        if rc == RuntimeStatus.NOT_SUPPORTED:
            return None
        self._check(rc, f"query chip {chip} {what}")
        return out

    def memory_usage(self) -> tuple[ChipMemory, ...]:
        out = []
        for c in range(self._topology.chips):
            mem = self._chip_query("calrt_memory_usage", L.CalrtMemory(), "memory", c)
            if mem is None:
                out.append(ChipMemory(chip=c, used_bytes=None, total_bytes=self._topology.dram_bytes[c]))
            else:
                out.append(ChipMemory(chip=c, used_bytes=_u64(mem.used_bytes), total_bytes=_u64(mem.total_bytes)))
        return tuple(out)

    def counters(self) -> tuple[ChipCounters, ...]:
        out = []
        for c in range(self._topology.chips):
            cnt = self._chip_query("calrt_chip_counters", L.CalrtCounters(), "counters", c)
            if cnt is None:
                out.append(ChipCounters(chip=c, pending=None, finished=None, failed=None))
            else:
                pending, finished, failed = _u64(cnt.pending), _u64(cnt.finished), _u64(cnt.failed)
                out.append(ChipCounters(chip=c, pending=pending, finished=finished, failed=failed))
        return tuple(out)

    def health(self) -> tuple[ChipHealth, ...]:
        out = []
        for c in range(self._topology.chips):
            h = self._chip_query("calrt_chip_health", c_uint32(), "health", c)
            if h is None:
                out.append(ChipHealth(chip=c, health=Health.UNKNOWN, detail="not reported by the runtime"))
            else:
                out.append(ChipHealth(chip=c, health=Health.from_code(int(h.value))))
        return tuple(out)

    def telemetry(self) -> tuple[ChipTelemetry, ...]:
        """Through the optional ``calrt_chip_telemetry`` (docs/calrt-c-abi.md §15) where the shim exports it; a
        shim without it (or answering NOT_SUPPORTED) reports no temperature, power, frequency, throttle, ECC or
        reset count: those are null and listed as vendor gaps. Queue depth is the chip's pending counter."""
        pending = {c.chip: c.pending for c in self.counters()}
        if self.library.has(L.TELEMETRY_CALL):  # the optional call (docs/calrt-c-abi.md §15)
            got = [
                (c, self._chip_query(L.TELEMETRY_CALL, new_telemetry(), "telemetry", c))
                for c in range(self._topology.chips)
            ]
            if all(t is not None for _, t in got):
                return tuple(chip_telemetry(c, t, pending.get(c)) for c, t in got if t is not None)
        return tuple(
            telemetry_gaps(
                ChipTelemetry(chip=c, queue_depth=pending.get(c)),
                "libcalrt has no per-chip query for it (calrt_chip_telemetry not exported; vendor gap, 001 §15)",
            )
            for c in range(self._topology.chips)
        )

    def arm_test_fault(self, fault: str, value: int = 1) -> None:
        """Arm a fault switch through the optional ``calrt_ext_fault_set`` test hook (calrt_ext.h).

        NotSupported when the library does not export the hook (a production shim must not)."""
        if fault not in L.EXT_FAULTS:
            raise InvalidArgument(f"fault {fault!r}: expected one of {', '.join(L.EXT_FAULTS)}")
        if not self.library.has("calrt_ext_fault_set"):
            raise error_class(RuntimeStatus.NOT_SUPPORTED)(
                f"CalRT library {self.library.path} does not export the calrt_ext_fault_set test hook"
            )
        with self._lock:
            self._check_open()
            self._check(self._fn.calrt_ext_fault_set(self._dev, L.EXT_FAULTS[fault], value), f"arm fault {fault}")

    # -- recovery ---------------------------------------------------------------------------------

    def reset(self, scope: ResetScope | str = ResetScope.CHIP, chip: int | None = None) -> None:
        sc = self._reset_scope(scope)
        target = self._reset_chip(chip, self._topology.chips) if sc is ResetScope.CHIP else 0
        with self._lock:
            self._check_open()
            self._check(self._fn.calrt_reset(self._dev, sc.code, chip or 0), f"{sc.value} reset")
            affected = set(range(self._topology.chips)) if sc is ResetScope.BOARD else {target}
            self._release_quarantined(affected)
            for rec in list(self._jobs.values()):
                if rec.result is None and affected.intersection(rec.job.chips):
                    self._observe(rec)  # the reset aborted it: retire it now so its buffers come back
            if sc is ResetScope.BOARD:
                self._unconfigured()

    # -- internals ----------------------------------------------------------------------------------

    @contextmanager
    def _unlocked_call(self, *, blocking: bool = False) -> Iterator[None]:
        """Bracket a C call made without ``_lock`` (C ABI §8: the shim is thread-safe), so ``close`` never frees
        the device under it; ``blocking``: a wait, which ``close`` aborts with a board reset first."""
        with self._waiters:
            self._check_open()
            self._inside += 1
            self._blocked += blocking
        try:
            yield
        finally:
            with self._waiters:
                self._inside -= 1
                self._blocked -= blocking
                self._waiters.notify_all()


def _state(code: int, job: int) -> JobState:
    try:
        return JobState.from_code(code)
    except ValueError:
        raise InternalRuntimeError(f"CalRT reported undefined job state {code} for job {job}", job=job) from None


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _ms(timeout: float) -> int:
    if not timeout > 0:
        return 0
    return min(math.ceil(timeout * 1000), L.WAIT_MAX_MS)


def _ns(value: int) -> int | None:
    return int(value) or None


def _u64(value: int) -> int | None:
    return None if value == L.UNKNOWN_U64 else int(value)


def open_calrt(path: str | Path | None) -> CalrtRuntime:
    """Lock the board for this process (board_lock), load and check the shim at ``path``, open its device.

    ``CALRT_DEVICE`` set: that board is locked before the library is loaded. Then the lock follows the board
    the shim reports (``calrt_ext_device_identity``): a PCI address or serial for a real board is locked too, so
    two processes on one board collide whatever spelling they asked for; a software model has no board to
    share and gets a lock of its own process (the ``CALRT_DEVICE`` lock is let go), so parallel processes never
    collide. A shim that reports nothing is locked on ``CALRT_DEVICE``, ``default`` when unset
    (docs/calrt-c-abi.md §10)."""
    locks: list[board_lock.BoardLock] = []
    with contextlib.ExitStack() as failed:  # any way out but the return: the device closed, then every lock let go
        failed.callback(_release_all, locks)
        if board_lock.board_key() != "default":
            locks.append(board_lock.acquire())
        rt = CalrtRuntime(L.load_library(path))
        failed.callback(rt.close)
        identity = rt.identity()
        if identity.software_model:
            _release_all(locks)
            locks.append(board_lock.process_local())
        elif identity.board is not None:
            if board_lock.canonical_board(identity.board) not in {lock.board for lock in locks}:
                locks.append(board_lock.acquire(identity.board))
        elif not locks:
            locks.append(board_lock.acquire())
        failed.pop_all()
    rt._board_locks = locks  # released by close()
    return rt


def _release_all(locks: list[board_lock.BoardLock]) -> None:
    """Let go of every lock in ``locks`` (in order) and empty the list, so none is released twice."""
    for lock in locks:
        lock.release()
    locks.clear()
