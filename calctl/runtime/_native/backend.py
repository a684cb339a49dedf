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
the GIL for the call, so worker threads can wait on their own jobs
concurrently. It does not validate packages beyond the calbin plan
(:func:`calctl.runtime.calbin.plan_calbin`).
"""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from ctypes import byref, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np

from calctl.package.model import GraphKind, Package, TensorSpec
from calctl.runtime import board_lock
from calctl.runtime._native import ext
from calctl.runtime._native import lib as L
from calctl.runtime.buffers import BufferState, Direction, HostBuffer, JobBuffersMixin, buffer_layout
from calctl.runtime.calbin import Calbin, GraphPlan, ModelPlan, check_job_buffers, plan_calbin, resolve_graph
from calctl.runtime.errors import (
    InternalRuntimeError,
    InvalidArgument,
    InvalidCalbin,
    RuntimeStatus,
    Timeout,
    error_class,
    error_for_status,
)
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
    KvLength,
    KvSeqId,
    ResetScope,
    Topology,
    TraceEvent,
    Versions,
    telemetry_gaps,
)

HISTORY = 65536


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


class CalrtRuntime(JobBuffersMixin):
    """An open CalRT device; implements :class:`calctl.runtime.interface.Runtime`."""

    kind = DeviceKind.CALRT

    def __init__(self, library: L.CalrtLibrary) -> None:
        self.library = library
        self._submit_listeners: list[Callable[[Job], None]] = []
        self._fn = library.fn
        self._board_locks: list[board_lock.BoardLock] = []  # set by open_calrt (one process per board)
        self._lock = threading.RLock()  # Python-side bookkeeping; never held while blocked in a wait
        self._waiters = threading.Condition()  # counts threads inside calls made without _lock
        self._blocked = 0  # ... blocked inside calrt_job_wait[_any]
        self._inside = 0  # ... inside any call made without _lock (job, KV and per-chip query calls)
        self._identity: DeviceIdentity | None = None
        dev = c_void_p()
        self._check(self._fn.calrt_device_open(byref(dev)), "open the device")
        self._dev = dev
        self._finalizer = weakref.finalize(self, _close_device, self._fn, dev)
        self._closed = False
        self._buffer_ids = itertools.count(1)
        self._calbin_ids = itertools.count(1)
        self._buffers: dict[int, HostBuffer] = {}
        self._release_when_free: set[int] = set()
        self._calbins: dict[int, tuple[Calbin, c_void_p]] = {}
        self._release_when_unconfigured: set[int] = set()
        self._current: Calbin | None = None
        self._jobs: OrderedDict[JobId, _NativeJob] = OrderedDict()
        self._quarantined: dict[JobId, _NativeJob] = {}
        self._trace: deque[TraceEvent] = deque(maxlen=HISTORY)
        self._kv = CalrtKvManager(self)
        topo = L.CalrtTopology()
        try:
            self._check(self._fn.calrt_topology_get(self._dev, byref(topo)), "query the topology")
        except BaseException:
            self.close()
            raise
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

    def __enter__(self) -> CalrtRuntime:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

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

        def tensors(specs: Sequence[TensorSpec]) -> tuple[int, ctypes.Array[L.CalrtTensorDesc]]:
            if any(len(t.shape) > L.MAX_DIMS or t.dtype not in L.DTYPE_CODES for t in specs):
                raise InvalidCalbin(
                    f"package {package.name!r}: a tensor has more than {L.MAX_DIMS} dims or a dtype the C ABI lacks"
                )
            arr = (L.CalrtTensorDesc * max(len(specs), 1))()
            for i, t in enumerate(specs):
                dims = (ctypes.c_int64 * L.MAX_DIMS)(*[L.DIM_BATCH if d == "B" else int(d) for d in t.shape])
                arr[i] = L.CalrtTensorDesc(t.name.encode(), L.DTYPE_CODES[t.dtype], len(t.shape), dims)
            keep.append(arr)
            return len(specs), arr

        graphs = (L.CalrtGraphDesc * len(plan.graphs))()
        for i, gp in enumerate(plan.graphs.values()):
            g = gp.graph
            profiles = (c_uint32 * len(g.batch_profiles))(*g.batch_profiles)
            n_in, ins = tensors(g.inputs)
            n_out, outs = tensors(g.outputs)
            lane_valid = g.inactive_lane_policy.mask_input if g.inactive_lane_policy else None
            positions = (
                "positions" if g.kind is GraphKind.DECODE and any(t.name == "positions" for t in g.inputs) else None
            )
            keep.append(profiles)
            graphs[i] = L.CalrtGraphDesc(
                g.name.encode(),
                gp.model.encode(),
                L.GRAPH_PREFILL if g.kind is GraphKind.PREFILL else L.GRAPH_DECODE,
                gp.chip_mask,
                g.max_seq,
                len(g.batch_profiles),
                profiles,
                n_in,
                ins,
                n_out,
                outs,
                g.valid_length_input.encode() if g.valid_length_input else None,
                positions.encode() if positions else None,
                lane_valid.encode() if lane_valid else None,
            )
        models = (L.CalrtModelDesc * len(plan.models))()
        for i, mp in enumerate(plan.models.values()):
            models[i] = L.CalrtModelDesc(
                mp.alias.encode(),
                sum(1 << c for c in mp.chips),
                mp.model.kv.max_sequences,
                max(g.max_seq for g in mp.model.graphs),
            )
        plan_bytes = (c_uint64 * len(plan.chip_plan_bytes))(*plan.chip_plan_bytes)
        desc = L.CalrtCalbinDesc(
            str(Path(package.root).resolve()).encode(),
            len(plan.graphs),
            graphs,
            len(plan.models),
            models,
            len(plan.chip_plan_bytes),
            plan_bytes,
        )
        handle = c_void_p()
        with self._lock:
            self._check_open()
            self._check(
                self._fn.calrt_calbin_create(self._dev, byref(desc), byref(handle)),
                f"create a calbin from {package.name!r}",
            )
            try:
                self._describe_models(plan.models.values(), handle)
            except BaseException:
                self._fn.calrt_calbin_release(self._dev, handle)
                raise
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

    def _release_calbin(self, calbin: Calbin) -> None:
        with self._lock:
            if self._closed or calbin.id not in self._calbins:
                return
            if self._current is calbin:
                self._release_when_unconfigured.add(calbin.id)
                return
            _, handle = self._calbins.pop(calbin.id)
            self._check(self._fn.calrt_calbin_release(self._dev, handle), f"release calbin {calbin.id}")

    def configure(self, calbin: Calbin) -> None:
        with self._lock:
            self._check_open()
            entry = self._calbins.get(calbin.id)
            if entry is None or entry[0] is not calbin:
                raise InvalidArgument(f"{calbin!r} was not created on this device or was released")
            self._check(
                self._fn.calrt_configure(self._dev, entry[1]), f"configure calbin {calbin.id} ({calbin.package.name!r})"
            )
            self._current = calbin

    def reset_configuration(self) -> None:
        with self._lock:
            self._check_open()
            self._check(self._fn.calrt_reset_configuration(self._dev), "reset the configuration")
            self._unconfigured()

    def _unconfigured(self) -> None:
        calbin, self._current = self._current, None
        if calbin is not None and calbin.id in self._release_when_unconfigured:
            self._release_when_unconfigured.discard(calbin.id)
            self._release_calbin(calbin)

    @property
    def current_calbin(self) -> Calbin | None:
        return self._current

    # -- buffers ---------------------------------------------------------------------------

    def alloc_inputs(self, graph: str, batch: int = 1) -> HostBuffer:
        return self._alloc(graph, Direction.INPUT, batch)

    def alloc_outputs(self, graph: str, batch: int = 1) -> HostBuffer:
        return self._alloc(graph, Direction.OUTPUT, batch)

    def _alloc(self, graph: str, direction: Direction, batch: int) -> HostBuffer:
        with self._lock:
            self._check_open()
            layout = buffer_layout(self._graph(graph).graph, direction, batch)
            handle, data = c_void_p(), c_void_p()
            self._check(
                self._fn.calrt_buffer_create(self._dev, layout.nbytes, byref(handle)),
                f"create a {direction.value} buffer",
            )
            try:
                self._check(self._fn.calrt_buffer_data(self._dev, handle, byref(data)), "map a buffer")
            except BaseException:
                self._fn.calrt_buffer_release(self._dev, handle)
                raise
            assert data.value is not None
            storage = np.ctypeslib.as_array(ctypes.cast(data, ctypes.POINTER(ctypes.c_uint8)), shape=(layout.nbytes,))
            buf = HostBuffer(next(self._buffer_ids), layout, storage, native=handle)
            self._buffers[buf.id] = buf
            return buf

    def release_buffer(self, buffer: HostBuffer) -> None:
        with self._lock:
            if self._buffers.get(buffer.id) is not buffer:
                raise InvalidArgument(f"{buffer!r} does not belong to this device or was released")
            buffer.check_releasable()
            self._check(self._fn.calrt_buffer_release(self._dev, buffer.native), f"release buffer {buffer.id}")
            buffer.mark_released()
            del self._buffers[buffer.id]

    def _let_go(self, buffer: HostBuffer) -> None:
        with self._lock:
            if self._closed or self._buffers.get(buffer.id) is not buffer:
                return
            if buffer.state in (BufferState.IN_FLIGHT, BufferState.QUARANTINED):
                self._release_when_free.add(buffer.id)
                return
            self.release_buffer(buffer)

    def _give_back(self, buffer: HostBuffer) -> None:
        buffer.give_back()
        if buffer.id in self._release_when_free and not self._closed:
            self._release_when_free.discard(buffer.id)
            self.release_buffer(buffer)

    # -- jobs ----------------------------------------------------------------------------------

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
        lanes = tuple(kv)
        with self._lock:
            self._check_open()
            plan = self._graph(model_name)
            self._check_job_buffers(plan, inputs, outputs)
            if len(lanes) != inputs.batch:
                raise InvalidArgument(
                    f"graph {plan.name!r} at B{inputs.batch} needs kv= with {inputs.batch} "
                    f"entries (a KvSeqId per lane, None for an inactive lane), got {len(lanes)}"
                )
            kv_arr = (c_uint64 * max(len(lanes), 1))(*[L.KV_NONE if s is None else int(s) for s in lanes])
            desc = L.CalrtJobDesc(
                plan.name.encode(),
                inputs.native,
                outputs.native,
                eng.code,
                inputs.batch,
                len(lanes),
                kv_arr,
                int(generation),
            )
        job_id = c_uint64()
        submit_ns = time.monotonic_ns()
        with self._unlocked_call():  # C ABI §8: submit is thread-safe; calctl does not serialise it
            rc = self._fn.calrt_job_submit(self._dev, byref(desc), byref(job_id))
        self._check(rc, f"submit {plan.name!r}")
        with self._lock:
            job = Job(
                id=JobId(job_id.value),
                graph=plan.name,
                model=plan.model,
                chips=plan.chips,
                engine=eng,
                generation=generation,
                batch=inputs.batch,
                kv=lanes,
                submit_ns=submit_ns,
            )
            inputs.lend(job.id)
            outputs.lend(job.id)
            self._jobs[job.id] = _NativeJob(job, inputs, outputs)
            while len(self._jobs) > HISTORY:
                old_id, old = next(iter(self._jobs.items()))
                if old.result is None:
                    break
                del self._jobs[old_id]
        for listener in self._submit_listeners:
            listener(job)
        return job

    def on_submit(self, listener: Callable[[Job], None]) -> None:
        self._submit_listeners.append(listener)

    def wait(self, job: Job, timeout: float) -> JobResult:
        rec = self._record(job)
        if rec.result is None:
            info = L.CalrtJobInfo()
            with self._unlocked_call(blocking=True):
                rc = self._fn.calrt_job_wait(self._dev, job.id, _ms(timeout), byref(info))  # GIL released
            if rc == RuntimeStatus.TIMEOUT:
                raise Timeout(
                    f"job {job.id} ({job.graph}) not finished after {timeout:g} s; it stays in flight and keeps its buffers",
                    job=job.id,
                )
            if rc != RuntimeStatus.OK and rec.result is None:
                self._check(rc, f"wait for job {job.id}", job=job.id)
            if rc == RuntimeStatus.OK:
                self._retire(rec, info)
        assert rec.result is not None
        return _result_or_raise(rec.result)

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
            if status is RuntimeStatus.UNKNOWN_DMA_STATE:
                rec.inputs.quarantine()
                rec.outputs.quarantine()
                self._quarantined[rec.job.id] = rec
            else:
                self._give_back(rec.inputs)
                self._give_back(rec.outputs)
            for chip in rec.job.chips:
                self._trace.append(
                    TraceEvent(
                        job=rec.job.id,
                        chip=chip,
                        model=rec.job.model,
                        graph=rec.job.graph,
                        engine=rec.job.engine,
                        generation=rec.job.generation,
                        submit_ns=int(info.submit_ns) or rec.job.submit_ns,
                        start_ns=result.start_ns,
                        end_ns=result.end_ns,
                        state=state,
                        status=status,
                    )
                )
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
                raise InvalidArgument(
                    f"job {job.id} is not known to this device (never submitted here, or older than the last {HISTORY} jobs)"
                )
            return rec

    # -- KV / observation -------------------------------------------------------------------------

    @property
    def kv(self) -> CalrtKvManager:
        return self._kv

    def memory_usage(self) -> tuple[ChipMemory, ...]:
        out = []
        # per-chip queries are thread-safe (C ABI §8): not serialised
        for c in range(self._topology.chips):
            mem = L.CalrtMemory()
            with self._unlocked_call():
                rc = self._fn.calrt_memory_usage(self._dev, c, byref(mem))
            if rc == RuntimeStatus.NOT_SUPPORTED:  # vendor gap: per-chip usage unknown -> None, never 0
                out.append(ChipMemory(chip=c, used_bytes=None, total_bytes=self._topology.dram_bytes[c]))
                continue
            self._check(rc, f"query chip {c} memory")
            out.append(ChipMemory(chip=c, used_bytes=_u64(mem.used_bytes), total_bytes=_u64(mem.total_bytes)))
        return tuple(out)

    def counters(self) -> tuple[ChipCounters, ...]:
        out = []
        for c in range(self._topology.chips):
            cnt = L.CalrtCounters()
            with self._unlocked_call():
                rc = self._fn.calrt_chip_counters(self._dev, c, byref(cnt))
            if rc == RuntimeStatus.NOT_SUPPORTED:
                out.append(ChipCounters(chip=c, pending=None, finished=None, failed=None))
                continue
            self._check(rc, f"query chip {c} counters")
            out.append(
                ChipCounters(chip=c, pending=_u64(cnt.pending), finished=_u64(cnt.finished), failed=_u64(cnt.failed))
            )
        return tuple(out)

    def health(self) -> tuple[ChipHealth, ...]:
        out = []
        for c in range(self._topology.chips):
            h = c_uint32()
            with self._unlocked_call():
                rc = self._fn.calrt_chip_health(self._dev, c, byref(h))
            if rc == RuntimeStatus.NOT_SUPPORTED:
                out.append(ChipHealth(chip=c, health=Health.UNKNOWN, detail="not reported by the runtime"))
                continue
            self._check(rc, f"query chip {c} health")
            out.append(ChipHealth(chip=c, health=Health.from_code(int(h.value))))
        return tuple(out)

    def telemetry(self) -> tuple[ChipTelemetry, ...]:
        """libcalrt exports no temperature, power, frequency, throttle or reset-count query (calrt.h): those
        are null and listed as vendor gaps; queue depth is the chip's pending counter where it reports one."""
        pending = {c.chip: c.pending for c in self.counters()}
        return tuple(
            telemetry_gaps(
                ChipTelemetry(chip=c, queue_depth=pending.get(c)),
                "libcalrt has no per-chip query for it (vendor gap, 001 §15)",
            )
            for c in range(self._topology.chips)
        )

    def trace(self, *, since_ns: int = 0) -> tuple[TraceEvent, ...]:
        with self._lock:
            return tuple(e for e in self._trace if e.submit_ns >= since_ns)

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
        try:
            sc = ResetScope(scope)
        except ValueError:
            raise InvalidArgument(f"reset scope {scope!r}: expected chip or board") from None
        if sc is ResetScope.CHIP and (chip is None or not 0 <= chip < self._topology.chips):
            raise InvalidArgument(f"a chip reset needs chip=0..{self._topology.chips - 1}, got {chip!r}")
        with self._lock:
            self._check_open()
            self._check(self._fn.calrt_reset(self._dev, sc.code, chip or 0), f"{sc.value} reset")
            affected = set(range(self._topology.chips)) if sc is ResetScope.BOARD else {chip}
            for job_id, rec in list(self._quarantined.items()):
                if affected.intersection(rec.job.chips):
                    del self._quarantined[job_id]
                    self._give_back(rec.inputs)
                    self._give_back(rec.outputs)
            for rec in list(self._jobs.values()):
                if rec.result is None and affected.intersection(rec.job.chips):
                    self._observe(rec)  # the reset aborted it: retire it now so its buffers come back
            if sc is ResetScope.BOARD:
                self._unconfigured()

    # -- internals ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("the device is closed")

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

    def _graph(self, name: str) -> GraphPlan:
        return resolve_graph(self._current, name)

    def _check_job_buffers(self, plan: GraphPlan, inputs: HostBuffer, outputs: HostBuffer) -> None:
        check_job_buffers(self._buffers, plan, inputs, outputs)


class CalrtKvManager:
    """:class:`calctl.runtime.interface.KvManager` over the ``calrt_kv_*`` functions."""

    def __init__(self, rt: CalrtRuntime) -> None:
        self._rt = rt

    def _call(self, what: str, fn_name: str, *args: object) -> None:
        rt = self._rt
        with rt._unlocked_call():  # KV calls are thread-safe (C ABI §8): calctl keeps no KV state to guard
            rc = getattr(rt._fn, fn_name)(rt._dev, *args)
        rt._check(rc, what)

    def can_allocate(self, model: str, n: int = 1) -> bool:
        yes = c_uint32()
        self._call(f"kv can_allocate {model!r}", "calrt_kv_can_allocate", model.encode(), n, byref(yes))
        return bool(yes.value)

    def allocate(self, model: str) -> KvSeqId:
        seq = c_uint64()
        self._call(f"kv allocate {model!r}", "calrt_kv_allocate", model.encode(), byref(seq))
        return KvSeqId(seq.value)

    def append(self, seq: KvSeqId, n: int) -> int:
        pos = c_uint32()
        self._call(f"kv append to sequence {seq}", "calrt_kv_append", seq, n, byref(pos))
        return int(pos.value)

    def commit(self, seq: KvSeqId) -> KvLength:
        self._call(f"kv commit sequence {seq}", "calrt_kv_commit", seq)
        return self.length(seq)

    def rollback(self, seq: KvSeqId) -> KvLength:
        self._call(f"kv roll back sequence {seq}", "calrt_kv_rollback", seq)
        return self.length(seq)

    def remove_tokens_at_end(self, seq: KvSeqId, n: int) -> KvLength:
        self._call(f"kv remove {n} tokens from sequence {seq}", "calrt_kv_remove_tokens_at_end", seq, n)
        return self.length(seq)

    def free(self, seq: KvSeqId) -> None:
        self._call(f"kv free sequence {seq}", "calrt_kv_free", seq)

    def length(self, seq: KvSeqId) -> KvLength:
        committed, reserved = c_uint32(), c_uint32()
        self._call(f"kv length of sequence {seq}", "calrt_kv_length", seq, byref(committed), byref(reserved))
        return KvLength(committed=int(committed.value), reserved=int(reserved.value))


def _result_or_raise(result: JobResult) -> JobResult:
    if result.state is JobState.SUCCEEDED:
        return result
    raise error_class(result.status)(
        f"job {result.job.id} ({result.job.graph}) {result.state.value}: {result.detail}", job=result.job.id
    )


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
    rt: CalrtRuntime | None = None
    try:
        if board_lock.board_key() != "default":
            locks.append(board_lock.acquire())
        rt = CalrtRuntime(L.load_library(path))
        identity = rt.identity()
        if identity.software_model:
            for lock in locks:
                lock.release()
            locks = [board_lock.process_local()]
        elif identity.board is not None:
            if board_lock.canonical_board(identity.board) not in {lock.board for lock in locks}:
                locks.append(board_lock.acquire(identity.board))
        elif not locks:
            locks.append(board_lock.acquire())
    except BaseException:
        if rt is not None:
            rt.close()
        for lock in locks:
            lock.release()
        raise
    rt._board_locks = locks  # released by close()
    return rt
