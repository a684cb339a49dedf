"""The runtime conformance suite: what calctl relies on from a runtime, checked one call at a time.

One suite for every backend: ``calctl device conformance --calrt-lib X.so``
runs it against a vendor shim (or the reference board, or the bookkeeping
stub), and the test suite runs it against the mock board as well
(``tests/unit/runtime/test_conformance.py``). Each check ends

* ``PASS``;
* ``FAIL``, with the call, its arguments and what came back;
* ``UNSUPPORTED``: the runtime answered NOT_SUPPORTED (or lacks the optional
  test hook a check needs); never counted as a pass;
* ``TIMEOUT``: the check did not end within its bound.

:func:`run_suite` runs the checks in a child process (``python -m
calctl.runtime.conformance``), one after another, and bounds each: a check
that hangs is killed with its process, reported as TIMEOUT, and the remaining
checks go on in a fresh child (one device per process, 001 §2.1, so a hung
device cannot be reused in the same process anyway). :func:`run_check` runs
one check in this process (the mock board, tests).

From the measurements the checks take, :func:`vendor_questions` answers the
vendor questions of 000 §20 and 001 §15.2 the ABI can reach (parallel chips,
in-flight jobs per chip, reset scope, per-chip memory, thread safety of
concurrent submit), each graded C0 (measured here), C1 (the symbol is there,
the behaviour was not shown) or C4 (refused) with its evidence (001 §1).
A grade is about the library it was measured on: the reference board's C0 is
evidence about the reference board, never about a Calculet board (docs/runtime.md §5).

This module opens devices and submits jobs; it does not render (the CLI does).
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from calctl.errors import CalctlError
from calctl.package import npy
from calctl.package.model import Package
from calctl.package.reader import load_manifest
from calctl.runtime import DeviceKind, Job, Runtime, open_runtime
from calctl.runtime.buffers import BufferState, HostBuffer
from calctl.runtime.errors import (
    AlreadyConfigured,
    BufferInUse,
    CcuException,
    DeviceBusy,
    DeviceInUse,
    DeviceLost,
    InvalidArgument,
    JobAborted,
    NotConfigured,
    NotSupported,
    RuntimeLayerError,
    RuntimeStatus,
    Timeout,
    UnknownDmaState,
)
from calctl.runtime.types import Engine, GenerationId, Health, JobState, KvLength, KvSeqId

DEFAULT_CHECK_TIMEOUT = 60.0
_MARK = "@@calctl-conformance@@ "


class Verdict(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    UNSUPPORTED = "UNSUPPORTED"
    TIMEOUT = "TIMEOUT"


@dataclass(frozen=True)
class CheckResult:
    name: str
    title: str
    verdict: Verdict
    seconds: float
    detail: str = ""
    call: str | None = None  # FAIL/UNSUPPORTED: the call that did it
    arguments: str | None = None
    returned: str | None = None  # what came back (a value, or an exception with its status)
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["verdict"] = self.verdict.value
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> CheckResult:
        return cls(**{**doc, "verdict": Verdict(doc["verdict"])})


class CheckFailed(Exception):
    """A check's expectation did not hold: FAIL with the call, its arguments and what came back."""

    def __init__(
        self, detail: str, *, call: str | None = None, arguments: str | None = None, returned: str | None = None
    ):
        super().__init__(detail)
        self.detail, self.call, self.arguments, self.returned = detail, call, arguments, returned


class Unsupported(Exception):
    """The runtime refused (NOT_SUPPORTED), or the check needs something this target lacks."""


# ---------------------------------------------------------------------------
# The target and what a check gets


@dataclass(frozen=True)
class Target:
    """What the suite runs against: ``mock``, or ``calrt`` with a library; and the package the checks load."""

    device: DeviceKind
    package: Path
    library: Path | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "device": self.device.value,
            "library": str(self.library) if self.library else None,
            "package": str(self.package),
        }


class _CallLog:
    def __init__(self) -> None:
        self.last: tuple[str, str] | None = None


class _Recorder:
    """A runtime (or its KV manager) that remembers the last call made through it, for FAIL rows."""

    def __init__(self, target: Any, prefix: str, log: _CallLog) -> None:
        self._target, self._prefix, self._log = target, prefix, log

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name == "kv":
            return _Recorder(attr, self._prefix + "kv.", self._log)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._log.last = (self._prefix + name, _args(args, kwargs))
            return attr(*args, **kwargs)

        return call

    def __enter__(self) -> _Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self._target.close()


class Session:
    """What a check gets: the target, its package, ways to open a device, and a place for evidence."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._package: Package | None = None
        self.log = _CallLog()
        self.evidence: dict[str, Any] = {}

    @property
    def package(self) -> Package:
        if self._package is None:
            self._package = load_manifest(self.target.package)
        return self._package

    @property
    def native(self) -> bool:
        return self.target.device is DeviceKind.CALRT

    def open_raw(self) -> Runtime:
        if self.native:
            return open_runtime("calrt", calrt_lib=self.target.library)
        return open_runtime("mock")

    def open(self) -> Runtime:
        self.log.last = ("open_runtime", f"{self.target.device.value}, {self.target.library}")
        return cast(Runtime, _Recorder(self.open_raw(), "rt.", self.log))

    @contextlib.contextmanager
    def configured(self) -> Iterator[Runtime]:
        with self.open() as rt:
            rt.configure(rt.create_calbin(self.package))
            yield rt

    def pair(self) -> tuple[str, str]:
        """Two aliases of the package on different chips (A first), or Unsupported."""
        models = list(self.package.models)
        for a in models:
            for b in models:
                if a is not b and not set(a.target_chips) & set(b.target_chips):
                    return a.alias, b.alias
        raise Unsupported(f"package {self.package.name!r} has no two models on different chips; this check needs them")

    def chip_of(self, alias: str) -> int:
        return self.package.model(alias).target_chips[0]

    def arm(self, rt: Runtime, fault: str) -> None:
        """Make the next submitted job hit ``fault`` (busy | hang | ccu | dma); Unsupported without a hook."""
        raw = _unwrap(rt)
        self.log.last = ("arm fault", fault)
        arm = getattr(raw, "arm_test_fault", None)
        if arm is not None:
            try:
                arm(fault)
            except NotSupported as exc:
                raise Unsupported(f"{exc} (the check needs it to produce a {fault} job)") from None
            return
        from calctl.runtime.mock import FaultKind, FaultRule

        kind = {
            "busy": FaultKind.DEVICE_BUSY,
            "hang": FaultKind.WAIT_TIMEOUT,
            "ccu": FaultKind.CCU_EXCEPTION,
            "dma": FaultKind.UNKNOWN_DMA_STATE,
        }[fault]
        raw.arm_fault(FaultRule(kind=kind, at=(1,)))

    def reset_chip_or_board(self, rt: Runtime, chip: int) -> str:
        """Recover ``chip``: a chip reset where granted, else a board reset (and reconfigure). Returns the scope."""
        try:
            rt.reset("chip", chip=chip)
            return "chip"
        except NotSupported:
            rt.reset("board")
            rt.configure(rt.create_calbin(self.package))
            return "board"


def _unwrap(rt: Runtime) -> Any:
    return rt._target if isinstance(rt, _Recorder) else rt


def _args(args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    parts = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


def _short(value: Any) -> str:
    if isinstance(value, HostBuffer):
        return f"<{value.direction.value} buffer {value.id} of {value.graph!r} B{value.batch}>"
    if isinstance(value, Job):
        return f"<job {value.id} {value.graph!r}>"
    if isinstance(value, Package):
        return f"<package {value.name!r}>"
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _returned(exc: BaseException) -> str:
    if isinstance(exc, RuntimeLayerError):
        status = exc.status
        name = status.name if isinstance(status, RuntimeStatus) else str(status)
        return f"{type(exc).__name__} (status {int(status)} {name}): {exc}"
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------
# Expectations


def expect(
    condition: bool, detail: str, *, call: str | None = None, arguments: str | None = None, returned: Any = None
) -> None:
    if not condition:
        raise CheckFailed(
            detail, call=call, arguments=arguments, returned=None if returned is None else _short(returned)
        )


def expect_raises(
    error: type[BaseException] | tuple[type[BaseException], ...],
    call: str,
    fn: Callable[..., Any],
    *args: Any,
    **kwargs: Any,
) -> BaseException:
    """Call ``fn``; the error it must raise comes back. Anything else is a FAIL naming the call."""
    names = error.__name__ if isinstance(error, type) else " or ".join(e.__name__ for e in error)
    try:
        value = fn(*args, **kwargs)
    except error as exc:
        return exc
    except NotSupported as exc:
        raise Unsupported(f"{call}: {exc}") from None
    except (RuntimeLayerError, CalctlError) as exc:
        raise CheckFailed(
            f"{call} must raise {names}", call=call, arguments=_args(args, kwargs), returned=_returned(exc)
        ) from None
    raise CheckFailed(f"{call} must raise {names}", call=call, arguments=_args(args, kwargs), returned=_short(value))


def expect_status(exc: BaseException, status: RuntimeStatus, call: str) -> None:
    got = getattr(exc, "status", None)
    expect(got == status, f"{call} must report status {int(status)} {status.name}", call=call, returned=_returned(exc))


# ---------------------------------------------------------------------------
# Job helpers (the tiny-decoder I/O contract, docs/runtime.md)


def golden_prompt(pkg: Package, alias: str) -> np.ndarray:
    m = pkg.model(alias)
    return npy.load(pkg.root / m.golden.prompt.file).reshape(-1).astype(np.int32)


def write_prefill(inputs: HostBuffer, prompt: np.ndarray) -> None:
    tokens = np.zeros(inputs.layout.slot("tokens").shape, np.int32)
    tokens[0, : len(prompt)] = prompt
    inputs.write("tokens", tokens)
    inputs.write("n_tokens", np.array([len(prompt)], np.int32))


def write_decode(inputs: HostBuffer, token: int, position: int) -> None:
    inputs.write("tokens", np.array([[token]], np.int32))
    inputs.write("positions", np.array([position], np.int32))


def prefill_job(
    rt: Runtime, pkg: Package, alias: str, prompt: np.ndarray | None = None, **submit: Any
) -> tuple[Job, KvSeqId, HostBuffer, HostBuffer]:
    """Allocate a sequence and buffers, reserve, submit one prefill. Returns (job, seq, inputs, outputs)."""
    m = pkg.model(alias)
    prompt = golden_prompt(pkg, alias) if prompt is None else prompt
    seq = rt.kv.allocate(alias)
    inputs, outputs = rt.alloc_inputs(m.prefill.name), rt.alloc_outputs(m.prefill.name)
    write_prefill(inputs, prompt)
    rt.kv.append(seq, len(prompt))
    job = rt.submit(m.prefill.name, inputs, outputs, kv=[seq], **submit)
    return job, seq, inputs, outputs


def _overlap_ns(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> int:
    """Total time during which some interval of ``a`` and some interval of ``b`` both run."""

    def union(xs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for s, e in sorted(xs):
            if out and s <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], e))
            else:
                out.append((s, e))
        return out

    total, ua, ub = 0, union(a), union(b)
    for s1, e1 in ua:
        for s2, e2 in ub:
            total += max(0, min(e1, e2) - max(s1, s2))
    return total


# ---------------------------------------------------------------------------
# The checks


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    run: Callable[[Session], str | None]  # returns the PASS detail
    native_only: bool = False  # a property of the C library itself (the mock has no C ABI)


CHECKS: list[Check] = []


def check(
    name: str, title: str, *, native_only: bool = False
) -> Callable[[Callable[[Session], str | None]], Callable[[Session], str | None]]:
    def register(fn: Callable[[Session], str | None]) -> Callable[[Session], str | None]:
        CHECKS.append(Check(name, title, fn, native_only))
        return fn

    return register


@check("abi_version", "calrt_abi_version reports 1.x and every 1.0 symbol is exported", native_only=True)
def _abi_version(s: Session) -> str:
    from calctl.runtime._native import lib as L

    library = L.load_library(s.target.library)
    major, minor = library.abi
    expect(
        major == L.ABI_MAJOR and minor >= L.ABI_MINOR,
        f"C ABI {major}.{minor}: calctl needs {L.ABI_MAJOR}.x",
        call="calrt_abi_version",
    )
    s.evidence.update(abi=f"{major}.{minor}", extensions=sorted(library.extensions))
    ext = ", ".join(sorted(library.extensions)) or "none"
    return f"C ABI {major}.{minor}; {len(L.SIGNATURES)} functions exported; optional extensions: {ext}"


@check("status_strings", "calrt_status_string names every status code and never returns NULL", native_only=True)
def _status_strings(s: Session) -> str:
    from calctl.runtime._native import lib as L

    fn = L.load_library(s.target.library).fn.calrt_status_string
    seen: dict[str, int] = {}
    for status in RuntimeStatus:
        if status is RuntimeStatus.LIBRARY:
            continue
        raw = fn(int(status))
        expect(
            bool(raw),
            f"status {int(status)} has no string",
            call="calrt_status_string",
            arguments=str(int(status)),
            returned=raw,
        )
        text = raw.decode("utf-8", "replace")
        expect(
            status is RuntimeStatus.OK or text not in seen,
            f"status {int(status)} and {seen.get(text)} share the string {text!r}",
            call="calrt_status_string",
            arguments=str(int(status)),
            returned=text,
        )
        seen[text] = int(status)
    for undefined in (15, 98, 12345, -1):
        raw = fn(undefined)
        expect(
            bool(raw),
            f"an undefined code {undefined} must still get a string",
            call="calrt_status_string",
            arguments=str(undefined),
            returned=raw,
        )
    return f"{len(seen)} distinct strings; undefined codes answered"


@check("versions_topology", "versions are reported; topology has 1-16 chips and DRAM per chip or unknown, never 0")
def _versions(s: Session) -> str:
    with s.open() as rt:
        v = rt.versions()
        topo = rt.topology()
    for name in ("runtime", "driver", "firmware"):
        expect(
            bool(getattr(v, name).strip()),
            f"calrt_versions_get reports a {name} version",
            call="rt.versions",
            returned=v,
        )
    expect(
        1 <= topo.chips <= 16 and topo.calcores_per_chip >= 1, "a plausible topology", call="rt.topology", returned=topo
    )
    for c, dram in enumerate(topo.dram_bytes):
        expect(dram is None or dram > 0, f"chip {c}: DRAM 0 means unknown reported as 0 (001 §14)", returned=topo)
    s.evidence.update(runtime=v.runtime, driver=v.driver, firmware=v.firmware, chips=topo.chips)
    shape = f"{topo.chips} chips x {topo.calcores_per_chip} CalCores"
    return f"runtime {v.runtime}, driver {v.driver}, firmware {v.firmware}; {shape}"


@check("one_device_per_process", "a second device open is DEVICE_IN_USE; open works again after close")
def _one_device(s: Session) -> str:
    with s.open():
        exc = expect_raises(DeviceInUse, "open_runtime (second device)", s.open_raw)
        expect_status(exc, RuntimeStatus.DEVICE_IN_USE, "calrt_device_open")
    with s.open():
        pass
    return "second open refused with DEVICE_IN_USE (11); reopened after close"


@check("configuration", "one current calbin: AlreadyConfigured / NotConfigured")
def _configuration(s: Session) -> str:
    pkg = s.package
    alias = pkg.models[0].alias
    with s.open() as rt:
        expect_raises(NotConfigured, "rt.alloc_inputs", rt.alloc_inputs, pkg.models[0].prefill.name)
        expect_raises(NotConfigured, "rt.reset_configuration", rt.reset_configuration)
        expect_raises(NotConfigured, "rt.kv.allocate", rt.kv.allocate, alias)
        first, second = rt.create_calbin(pkg), rt.create_calbin(pkg)
        rt.configure(first)
        for calbin in (first, second):
            exc = expect_raises(AlreadyConfigured, "rt.configure (while one is current)", rt.configure, calbin)
            expect_status(exc, RuntimeStatus.ALREADY_CONFIGURED, "calrt_configure")
        rt.reset_configuration()
        expect(
            rt.current_calbin is None,
            "no current calbin after reset_configuration",
            call="rt.current_calbin",
            returned=rt.current_calbin,
        )
        rt.configure(second)
        expect(
            rt.current_calbin is second,
            "the second calbin is current",
            call="rt.current_calbin",
            returned=rt.current_calbin,
        )
    return "NotConfigured before configure; AlreadyConfigured (3) on a second configure; reconfigure after reset"


@check("exact_graph_names", "graph names are exact: no prefix, case or alias matching")
def _exact_names(s: Session) -> str:
    pkg = s.package
    m = pkg.models[0]
    name = m.prefill.name
    wrong = [name[:-1], name.upper(), name + "_", m.alias]
    with s.configured() as rt:
        inputs, outputs = rt.alloc_inputs(name), rt.alloc_outputs(name)
        for w in wrong:
            expect_raises(InvalidArgument, f"rt.submit({w!r})", rt.submit, w, inputs, outputs, kv=[None])
        if s.native:  # the shim itself, behind calctl's own check
            status = _raw_submit(_unwrap(rt), wrong[0], inputs, outputs)
            expect(
                status == RuntimeStatus.INVALID_ARGUMENT,
                "calrt_job_submit with an inexact graph name must return INVALID_ARGUMENT (10)",
                call="calrt_job_submit",
                arguments=f"graph={wrong[0]!r}",
                returned=f"status {status}",
            )
    return f"{len(wrong)} inexact names refused" + ("; the C library refused one directly (10)" if s.native else "")


def _raw_submit(rt: Any, graph: str, inputs: HostBuffer, outputs: HostBuffer) -> int:
    """calrt_job_submit straight into the library, past calctl's own checks (what a shim answers)."""
    from calctl.runtime._native import lib as L

    kv = (ctypes.c_uint64 * 1)(L.KV_NONE)
    desc = L.CalrtJobDesc(graph.encode(), inputs.native, outputs.native, 0, inputs.batch, 1, kv, 0)
    job = ctypes.c_uint64()
    return int(rt._fn.calrt_job_submit(rt._dev, ctypes.byref(desc), ctypes.byref(job)))


@check(
    "buffer_ownership", "buffers: exact layout, never shared, owned by a job in flight (BufferInUse), released after"
)
def _buffers(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    pa, pb = pkg.model(a).prefill.name, pkg.model(b).prefill.name
    with s.configured() as rt:
        inputs, outputs = rt.alloc_inputs(pa), rt.alloc_outputs(pa)
        expect_raises(InvalidArgument, "rt.submit (inputs as outputs)", rt.submit, pa, inputs, inputs, kv=[None])
        expect_raises(
            InvalidArgument,
            "rt.submit (another graph's buffer)",
            rt.submit,
            pa,
            rt.alloc_inputs(pb),
            outputs,
            kv=[None],
        )
        expect_raises(InvalidArgument, "inputs.write (wrong shape)", inputs.write, "tokens", np.zeros((1, 3), np.int32))
        rt.release_buffer(outputs)
        expect(outputs.state is BufferState.RELEASED, "a released buffer is RELEASED", returned=outputs.state)
        expect_raises(InvalidArgument, "rt.release_buffer (twice)", rt.release_buffer, outputs)
        # A job in flight owns its buffers (held there by a hang until a reset).
        s.arm(rt, "hang")
        job, seq, ins, outs = prefill_job(rt, pkg, a)
        for buf in (ins, outs):
            expect(buf.state is BufferState.IN_FLIGHT, "a submitted job's buffer is IN_FLIGHT", returned=buf.state)
            expect_raises(BufferInUse, "rt.release_buffer (owned by a job in flight)", rt.release_buffer, buf)
        expect_raises(BufferInUse, "outputs.read (owned by a job in flight)", outs.read, "logits")
        expect_raises(
            BufferInUse,
            "rt.submit (inputs owned by a job in flight)",
            rt.submit,
            pa,
            ins,
            rt.alloc_outputs(pa),
            kv=[seq],
        )
        detail = "inexact use refused; in-flight buffers BufferInUse"
        if s.native:
            raw = _unwrap(rt)
            status = int(raw._fn.calrt_buffer_release(raw._dev, ins.native))
            expect(
                status == RuntimeStatus.BUFFER_IN_USE,
                "calrt_buffer_release of a buffer a job owns must return BUFFER_IN_USE (12)",
                call="calrt_buffer_release",
                arguments="<inputs of the job in flight>",
                returned=f"status {status}",
            )
            detail += "; the C library refused a release directly (12)"
        scope = s.reset_chip_or_board(rt, s.chip_of(a))
        expect_raises(JobAborted, f"rt.wait (after a {scope} reset)", rt.wait, job, 10)
        if scope == "chip":
            rt.release_buffer(ins)
            rt.release_buffer(outs)
        with rt.job_buffers(pkg.model(a).decode.name) as (i2, o2):
            expect(
                i2.state is BufferState.OWNED_BY_CALLER, "job_buffers hands out caller-owned buffers", returned=i2.state
            )
        expect(
            i2.state is BufferState.RELEASED and o2.state is BufferState.RELEASED,
            "job_buffers releases on exit",
            returned=i2.state,
        )
    return detail + f"; given back by a {scope} reset"


@check("job_states_timestamps", "job states end SUCCEEDED; submit <= start <= end on CLOCK_MONOTONIC; tags echoed")
def _timestamps(s: Session) -> str:
    pkg = s.package
    a, _ = s.pair() if len(pkg.models) > 1 else (pkg.models[0].alias, None)
    with s.configured() as rt:
        t0 = time.monotonic_ns()
        job, seq, _, outputs = prefill_job(rt, pkg, a, generation=GenerationId(7), engine=Engine.PING)
        first = rt.query(job)
        expect(
            first.state in (JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED),
            "a fresh job is queued, running or done",
            returned=first.state,
        )
        result = rt.wait(job, 10)
        t1 = time.monotonic_ns()
        expect(result.ok and result.status is RuntimeStatus.OK, "the job succeeded", call="rt.wait", returned=result)
        start, end = result.start_ns, result.end_ns
        expect(
            start is not None and end is not None,
            "a finished job has start and end times",
            call="calrt_job_wait",
            returned=result,
        )
        assert start is not None and end is not None
        expect(
            t0 <= start <= end <= t1,
            f"times must be CLOCK_MONOTONIC ns within the call window: {t0} <= {start} <= {end} <= {t1}",
            call="calrt_job_wait",
            returned=result,
        )
        expect(job.chips == pkg.model(a).target_chips, "the chip comes from the graph", returned=job.chips)
        events = [e for e in rt.trace() if e.job == job.id]
        expect(bool(events), "the trace has the job", call="rt.trace")
        e = events[0]
        expect(
            (e.chip, e.graph, e.generation, e.engine) == (job.chips[0], pkg.model(a).prefill.name, 7, Engine.PING),
            "the trace echoes chip, graph, generation and engine",
            returned=e,
        )
        expect(t0 <= e.submit_ns <= start, "submit_ns precedes start_ns", returned=e)
        expect(rt.query(job).state is JobState.SUCCEEDED, "query keeps the terminal state", returned=rt.query(job))
        n = len(golden_prompt(pkg, a))
        expect(
            rt.kv.commit(seq) == KvLength(n, n), "commit after success", call="rt.kv.commit", returned=rt.kv.length(seq)
        )
        logits = outputs.read("logits")
        expect(bool(np.isfinite(logits).all()), "logits are finite", returned=logits)
    return f"queued/running -> succeeded; {(end - start) / 1e6:.2f} ms on chip {job.chips[0]}; generation and engine echoed"


@check("wait_timeout", "a wait past its deadline is TIMEOUT; the job stays in flight with its buffers and KV")
def _wait_timeout(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    ca = s.chip_of(a)
    with s.configured() as rt:
        s.arm(rt, "hang")
        job, seq, inputs, _outputs = prefill_job(rt, pkg, a)
        t0 = time.monotonic()
        exc = expect_raises(Timeout, "rt.wait (0.2 s on a hung job)", rt.wait, job, 0.2)
        waited = time.monotonic() - t0
        expect_status(exc, RuntimeStatus.TIMEOUT, "calrt_job_wait")
        expect(
            waited >= 0.15,
            f"the wait must last its timeout (0.2 s), it returned after {waited:.3f} s",
            call="calrt_job_wait",
        )
        expect(not rt.query(job).state.terminal, "the job is still in flight after the timeout", returned=rt.query(job))
        expect(rt.wait_any([job], 0.05) == [], "wait_any on the hung job times out empty", call="rt.wait_any")
        expect(inputs.state is BufferState.IN_FLIGHT, "the job keeps its buffers", returned=inputs.state)
        expect_raises(DeviceBusy, "rt.kv.commit (sequence being written)", rt.kv.commit, seq)
        expect_raises(DeviceBusy, "rt.reset_configuration (job in flight)", rt.reset_configuration)
        pending = rt.counters()[ca].pending
        expect(pending in (None, 1), "the chip counts one pending job", call="rt.counters", returned=pending)
        health = {h.chip: h.health for h in rt.health()}[ca]
        expect(
            health in (Health.HUNG, Health.UNKNOWN),
            "the chip reports HUNG (or unknown)",
            call="rt.health",
            returned=health,
        )
        job_b, _, _, _ = prefill_job(rt, pkg, b)
        expect(rt.wait(job_b, 10).ok, "the other chip keeps working while one hangs", call="rt.wait")
        scope = s.reset_chip_or_board(rt, ca)
        aborted = expect_raises(JobAborted, "rt.wait (hung job after a reset)", rt.wait, job, 5)
        expect_status(aborted, RuntimeStatus.JOB_ABORTED, "calrt_job_wait")
        expect(rt.query(job).state is JobState.ABORTED, "the hung job ends ABORTED", returned=rt.query(job))
        if scope == "chip":
            expect(
                rt.kv.length(seq) == KvLength(0, 0),
                "a chip reset empties the chip's sequences",
                call="rt.kv.length",
                returned=rt.kv.length(seq),
            )
        job2, _, _, _ = prefill_job(rt, pkg, a)
        expect(rt.wait(job2, 10).ok, "the chip works again after the reset", call="rt.wait")
    return (
        f"TIMEOUT after {waited:.2f} s; job, buffers and KV kept; other chip unaffected; recovered by a {scope} reset"
    )


@check("wait_any", "wait_any returns terminal jobs; concurrent waiters on two threads")
def _wait_any(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    with s.configured() as rt:
        job_a, _, _, _ = prefill_job(rt, pkg, a, generation=GenerationId(1))
        job_b, _, _, _ = prefill_job(rt, pkg, b, generation=GenerationId(2))
        done: set[int] = set()
        deadline = time.monotonic() + 20
        while len(done) < 2 and time.monotonic() < deadline:
            got = rt.wait_any([job_a, job_b], 10)
            expect(bool(got), "wait_any returned nothing within 10 s", call="rt.wait_any")
            expect(all(rt.query(j).state.terminal for j in got), "wait_any returns only terminal jobs", returned=got)
            done.update(j.id for j in got)
        expect(done == {job_a.id, job_b.id}, "both jobs came back", returned=done)
        results: dict[str, Any] = {}

        def worker(alias: str) -> None:
            try:
                job, _, _, _ = prefill_job(rt, pkg, alias)
                results[alias] = rt.wait(job, 10).ok
            except Exception as exc:  # reported below as the thread's outcome
                results[alias] = _returned(exc)

        threads = [threading.Thread(target=worker, args=(x,)) for x in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        expect(results == {a: True, b: True}, "two threads each submit and wait on their own chip", returned=results)
    return "wait_any over two chips; two concurrent waiter threads"


@check("out_of_order_completion", "a later job on the other chip completes first; wait_any returns it alone")
def _out_of_order(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    with s.configured() as rt:
        s.arm(rt, "hang")
        first, _, _, _ = prefill_job(rt, pkg, a)
        second, _, _, out_b = prefill_job(rt, pkg, b)
        got = rt.wait_any([first, second], 10)
        expect(
            [j.id for j in got] == [second.id],
            "only the later job is done",
            call="rt.wait_any",
            returned=[j.id for j in got],
        )
        expect(
            rt.wait(second, 10).ok and not rt.query(first).state.terminal,
            "the earlier job is still in flight",
            returned=rt.query(first),
        )
        expect(bool(np.isfinite(out_b.read("logits")).all()), "the later job's outputs are readable", returned=None)
        scope = s.reset_chip_or_board(rt, s.chip_of(a))
        expect_raises(JobAborted, "rt.wait (the earlier job after a reset)", rt.wait, first, 5)
    return f"job {second.id} completed before job {first.id}; the earlier one aborted by a {scope} reset"


@check("busy_retry", "DEVICE_BUSY refuses a submit without taking the buffers; a retry succeeds")
def _busy(s: Session) -> str:
    pkg = s.package
    m = pkg.models[0]
    prompt = golden_prompt(pkg, m.alias)
    with s.configured() as rt:
        s.arm(rt, "busy")
        seq = rt.kv.allocate(m.alias)
        with rt.job_buffers(m.prefill.name) as (inputs, outputs):
            write_prefill(inputs, prompt)
            rt.kv.append(seq, len(prompt))
            exc = expect_raises(
                DeviceBusy, "rt.submit (armed busy)", rt.submit, m.prefill.name, inputs, outputs, kv=[seq]
            )
            expect_status(exc, RuntimeStatus.DEVICE_BUSY, "calrt_job_submit")
            expect(
                inputs.state is BufferState.OWNED_BY_CALLER,
                "a refused submit leaves the buffers with the caller",
                returned=inputs.state,
            )
            expect(
                rt.wait(rt.submit(m.prefill.name, inputs, outputs, kv=[seq]), 10).ok,
                "the retry succeeds",
                call="rt.wait",
            )
    return "BUSY (1) left buffers with the caller; the retry succeeded"


@check("kv_lifecycle", "KV: capacity per model, allocate / append / commit / rollback / remove-tail / free")
def _kv(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    mb = pkg.model(b)
    cap = mb.kv.max_sequences
    with s.configured() as rt:
        expect(
            rt.kv.can_allocate(b, cap) and not rt.kv.can_allocate(b, cap + 1),
            f"can_allocate answers the capacity {cap}",
            call="rt.kv.can_allocate",
        )
        seqs = [rt.kv.allocate(b) for _ in range(cap)]
        expect(len(set(seqs)) == cap, "every sequence id is distinct", returned=seqs)
        expect(rt.kv.can_allocate(a, 1), "one namespace per model", call="rt.kv.can_allocate", arguments=repr(a))
        expect_raises(RuntimeLayerError, "rt.kv.allocate (beyond capacity)", rt.kv.allocate, b)
        rt.kv.free(seqs[0])
        expect(rt.kv.can_allocate(b, 1), "a freed sequence is capacity again", call="rt.kv.can_allocate")
        expect_raises(InvalidArgument, "rt.kv.allocate (unknown model)", rt.kv.allocate, a + "-no-such-model")
        for q in seqs[1:]:
            rt.kv.free(q)
        job, seq, _, outputs = prefill_job(rt, pkg, a)
        rt.wait(job, 10)
        n = rt.kv.commit(seq).committed
        token = int(np.argmax(outputs.read("logits")[0]))
        decode = pkg.model(a).decode.name
        with rt.job_buffers(decode) as (inputs, outs):
            pos = rt.kv.append(seq, 1)
            expect(pos == n, "append reserves at the committed length", call="rt.kv.append", returned=pos)
            write_decode(inputs, token, n + 1)  # wrong: the position must be the committed length (000 §9.2)
            expect_raises(
                InvalidArgument,
                "rt.submit (decode position != committed length)",
                rt.submit,
                decode,
                inputs,
                outs,
                kv=[seq],
            )
            expect(
                rt.kv.rollback(seq) == KvLength(n, n),
                "rollback drops the reservation",
                call="rt.kv.rollback",
                returned=rt.kv.length(seq),
            )
            rt.kv.append(seq, 1)
            write_decode(inputs, token, n)
            rt.wait(rt.submit(decode, inputs, outs, kv=[seq]), 10)
            expect(
                rt.kv.commit(seq) == KvLength(n + 1, n + 1),
                "commit after the decode",
                call="rt.kv.commit",
                returned=rt.kv.length(seq),
            )
        expect(
            rt.kv.remove_tokens_at_end(seq, 1) == KvLength(n, n),
            "remove_tokens_at_end shortens",
            call="rt.kv.remove_tokens_at_end",
            returned=rt.kv.length(seq),
        )
        rt.kv.free(seq)
        expect_raises(InvalidArgument, "rt.kv.length (freed sequence)", rt.kv.length, seq)
    return f"capacity {cap}; namespaces per model; commit/rollback/remove-tail/free at position {n}"


@check("ccu_fault", "a CCU exception fails the job, halts only its chip (DEVICE_LOST) until a reset; KV rolls back")
def _ccu(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    ca = s.chip_of(a)
    with s.configured() as rt:
        s.arm(rt, "ccu")
        job, seq, inputs, _ = prefill_job(rt, pkg, a)
        exc = expect_raises(CcuException, "rt.wait (armed ccu)", rt.wait, job, 10)
        expect_status(exc, RuntimeStatus.CCU_EXCEPTION, "calrt_job_wait")
        expect(rt.query(job).state is JobState.FAILED, "the job ends FAILED", returned=rt.query(job))
        health = {h.chip: h.health for h in rt.health()}
        expect(
            health[ca] in (Health.FAULTED, Health.UNKNOWN),
            "its chip reports FAULTED",
            call="rt.health",
            returned=health,
        )
        expect_raises(InvalidArgument, "rt.kv.commit (the writing job failed)", rt.kv.commit, seq)
        rt.kv.rollback(seq)
        rt.release_buffer(inputs)
        expect_raises(DeviceLost, "rt.submit (on the halted chip)", prefill_job, rt, pkg, a)
        job_b, _, _, _ = prefill_job(rt, pkg, b)
        expect(rt.wait(job_b, 10).ok, "the other chip keeps working", call="rt.wait")
        scope = s.reset_chip_or_board(rt, ca)
        job2, _, _, _ = prefill_job(rt, pkg, a)
        expect(rt.wait(job2, 10).ok, "the chip works after the reset", call="rt.wait")
    return f"CCU_EXCEPTION (7); chip {ca} DEVICE_LOST until a {scope} reset; the other chip unaffected"


@check("dma_quarantine", "UNKNOWN_DMA_STATE keeps the buffers quarantined until a reset covering the chip")
def _dma(s: Session) -> str:
    pkg = s.package
    _, b = s.pair()
    with s.configured() as rt:
        s.arm(rt, "dma")
        job, _, inputs, outputs = prefill_job(rt, pkg, b)
        exc = expect_raises(UnknownDmaState, "rt.wait (armed dma)", rt.wait, job, 10)
        expect_status(exc, RuntimeStatus.UNKNOWN_DMA_STATE, "calrt_job_wait")
        expect(inputs.state is BufferState.QUARANTINED, "the buffers are quarantined", returned=inputs.state)
        expect_raises(BufferInUse, "rt.release_buffer (quarantined)", rt.release_buffer, inputs)
        scope = s.reset_chip_or_board(rt, s.chip_of(b))
        if scope == "chip":
            rt.release_buffer(inputs)
            rt.release_buffer(outputs)
    return f"UNKNOWN_DMA_STATE (8); buffers held until a {scope} reset"


@check("memory_counters", "per-chip memory and counters are reported (or null, never 0); memory returns to baseline")
def _memory(s: Session) -> str:
    pkg = s.package
    with s.open() as rt:
        baseline = rt.memory_usage()
        reported = [m.used_bytes is not None for m in baseline]
        for m in baseline:
            expect(
                m.used_bytes is None or m.used_bytes > 0,
                f"chip {m.chip}: used bytes 0 means unknown is reported as 0 (001 §14)",
                call="rt.memory_usage",
                returned=m,
            )
        rt.configure(rt.create_calbin(pkg))
        loaded = rt.memory_usage()
        for before, cfg in zip(baseline, loaded, strict=True):
            if before.used_bytes is not None and cfg.used_bytes is not None:
                expect(
                    cfg.used_bytes >= before.used_bytes,
                    f"chip {cfg.chip}: configuring must not lower memory use",
                    returned=(before.used_bytes, cfg.used_bytes),
                )
        counts_before = {c.chip: c for c in rt.counters()}
        for model in pkg.models:
            job, seq, _, _ = prefill_job(rt, pkg, model.alias)
            expect(rt.wait(job, 10).ok, f"a {model.alias} prefill succeeds", call="rt.wait")
            rt.kv.free(seq)
        counts = {c.chip: c for c in rt.counters()}
        for chip, c in counts.items():
            before_finished = counts_before[chip].finished
            if c.finished is None or before_finished is None:
                continue
            jobs = sum(1 for model in pkg.models if chip in model.target_chips)
            expect(
                c.pending == 0 and c.finished - before_finished == jobs,
                f"chip {chip}: counters close ({jobs} finished, 0 pending)",
                call="rt.counters",
                returned=c,
            )
        rt.reset_configuration()
        unloaded = rt.memory_usage()
        tolerance = [max(64 << 20, (m.total_bytes or 0) // 100) for m in baseline]
        for before, now, tol in zip(baseline, unloaded, tolerance, strict=True):
            if before.used_bytes is not None and now.used_bytes is not None:
                expect(
                    abs(now.used_bytes - before.used_bytes) <= tol,
                    f"chip {now.chip}: memory back to baseline after reset_configuration",
                    returned=(before.used_bytes, now.used_bytes),
                )
        s.evidence["memory"] = [
            {
                "chip": m.chip,
                "baseline_bytes": m.used_bytes,
                "loaded_bytes": lm.used_bytes,
                "total_bytes": m.total_bytes,
            }
            for m, lm in zip(baseline, loaded, strict=True)
        ]
        s.evidence["counters_reported"] = [c.finished is not None for c in counts.values()]
    if not any(reported):
        raise Unsupported(
            "calrt_memory_usage returned NOT_SUPPORTED on every chip (calctl reports null); counters checked"
        )
    return "per-chip memory " + ", ".join(
        f"chip {m['chip']}: {m['baseline_bytes']} -> {m['loaded_bytes']} B" for m in s.evidence["memory"]
    )


@check("chip_vs_board_reset", "a chip reset empties that chip's KV only; a board reset also drops the configuration")
def _resets(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    ca = s.chip_of(a)
    with s.configured() as rt:
        seqs = {}
        for alias in (a, b):
            job, seq, _, _ = prefill_job(rt, pkg, alias)
            rt.wait(job, 10)
            seqs[alias] = (seq, rt.kv.commit(seq))
        calbin = rt.current_calbin
        chip_scope = True
        try:
            rt.reset("chip", chip=ca)
        except NotSupported:
            chip_scope = False
        if chip_scope:
            expect(
                rt.kv.length(seqs[a][0]) == KvLength(0, 0),
                f"chip {ca} reset empties {a}'s sequence (kept allocated)",
                call="rt.kv.length",
                returned=rt.kv.length(seqs[a][0]),
            )
            expect(
                rt.kv.length(seqs[b][0]) == seqs[b][1],
                f"chip {ca} reset leaves {b}'s sequence on the other chip",
                call="rt.kv.length",
                returned=rt.kv.length(seqs[b][0]),
            )
            expect(rt.current_calbin is calbin, "a chip reset keeps the configuration", returned=rt.current_calbin)
            job, _, _, _ = prefill_job(rt, pkg, b)
            expect(rt.wait(job, 10).ok, "the other chip runs after a chip reset", call="rt.wait")
        rt.reset("board")
        expect(rt.current_calbin is None, "a board reset drops the configuration", returned=rt.current_calbin)
        expect_raises(
            NotConfigured, "rt.alloc_inputs (after a board reset)", rt.alloc_inputs, pkg.model(a).prefill.name
        )
        rt.configure(rt.create_calbin(pkg))
        job, _, _, _ = prefill_job(rt, pkg, a)
        expect(rt.wait(job, 10).ok, "configure works again after a board reset (no AlreadyConfigured)", call="rt.wait")
    s.evidence["chip_reset"] = chip_scope
    if not chip_scope:
        raise Unsupported(
            "calrt_reset(CHIP) returned NOT_SUPPORTED (board reset only; checked: it drops the configuration)"
        )
    return f"chip {ca} reset emptied {a}'s KV only and kept the configuration; board reset dropped it"


@check(
    "concurrent_submit_two_chips",
    "two threads submit and wait on two chips at once: all succeed, no crosstalk, overlap measured",
)
def _concurrent(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    rounds = 12
    with s.configured() as rt:
        errors: list[str] = []
        outputs: dict[str, list[np.ndarray]] = {a: [], b: []}
        barrier = threading.Barrier(2)

        def worker(alias: str) -> None:
            try:
                barrier.wait(10)
                for _ in range(rounds):
                    job, seq, _, out = prefill_job(rt, pkg, alias)
                    result = rt.wait(job, 10)
                    if not result.ok:
                        errors.append(f"{alias}: job {job.id} {result.state.value}")
                    outputs[alias].append(out.read("logits").copy())
                    rt.kv.free(seq)
            except Exception as exc:  # a thread-safety failure is the finding
                errors.append(f"{alias}: {_returned(exc)}")

        t0 = time.monotonic_ns()
        threads = [threading.Thread(target=worker, args=(x,)) for x in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        expect(
            not errors,
            f"{len(errors)} failures under concurrent submit",
            call="rt.submit / rt.wait from two threads",
            returned=errors[:3],
        )
        for alias, outs in outputs.items():
            expect(
                len(outs) == rounds and all(np.array_equal(outs[0], o) for o in outs),
                f"{alias}: every round gives the same logits (no crosstalk)",
                returned=len(outs),
            )
        events = [e for e in rt.trace(since_ns=t0) if e.start_ns and e.end_ns]
        ca, cb = s.chip_of(a), s.chip_of(b)
        ia = [(int(e.start_ns or 0), int(e.end_ns or 0)) for e in events if e.chip == ca]
        ib = [(int(e.start_ns or 0), int(e.end_ns or 0)) for e in events if e.chip == cb]
        busy_a = sum(e - s_ for s_, e in ia)
        overlap = _overlap_ns(ia, ib)
        s.evidence.update(
            rounds=rounds, jobs=2 * rounds, overlap_ms=overlap / 1e6, chip_a_busy_ms=busy_a / 1e6, chips=[ca, cb]
        )
    return f"{2 * rounds} jobs from two threads, no error; chips {ca}/{cb} overlapped {overlap / 1e6:.1f} ms"


@check("two_in_flight_one_chip", "a PING and a PONG job are both accepted on one chip and complete in order")
def _two_in_flight(s: Session) -> str:
    pkg = s.package
    m = pkg.models[0]
    pairs, best = 3, 0  # the largest overlap of three PING/PONG pairs: one late thread wake must not decide
    with s.configured() as rt:
        for _ in range(pairs):
            first, s1, _, o1 = prefill_job(rt, pkg, m.alias, engine=Engine.PING)
            try:
                second, s2, _, o2 = prefill_job(rt, pkg, m.alias, engine=Engine.PONG)
            except DeviceBusy:
                rt.wait(first, 10)
                s.evidence.update(max_in_flight=1, refused="DEVICE_BUSY")
                return "a second job on the chip was refused with DEVICE_BUSY: one in flight"
            r1, r2 = rt.wait(first, 10), rt.wait(second, 10)
            expect(r1.ok and r2.ok, "both jobs succeed", call="rt.wait", returned=(r1.state, r2.state))
            assert r1.start_ns and r2.start_ns and r1.end_ns and r2.end_ns
            expect(
                r1.start_ns <= r2.start_ns,
                "jobs on one chip start in submit order",
                returned=(r1.start_ns, r2.start_ns),
            )
            expect(
                bool(np.array_equal(o1.read("logits"), o2.read("logits"))),
                "both lanes computed the same prompt alike",
                returned=None,
            )
            best = max(best, min(r1.end_ns, r2.end_ns) - max(r1.start_ns, r2.start_ns))
            rt.kv.free(s1)
            rt.kv.free(s2)
        s.evidence.update(max_in_flight=2 if best > 0 else 1, overlap_ms=best / 1e6, chip=m.target_chips[0])
    mode = "two in flight" if best > 0 else "serialised"
    return f"{pairs} pairs accepted and completed in order; largest overlap {best / 1e6:.2f} ms ({mode})"


@check(
    "blocked_wait_holds_no_lock",
    "while one thread is blocked in wait, other threads submit, wait, query and use KV (C ABI §8, GIL released)",
)
def _blocked_wait(s: Session) -> str:
    pkg = s.package
    a, b = s.pair()
    with s.configured() as rt:
        s.arm(rt, "hang")
        hung, _, _, _ = prefill_job(rt, pkg, a)
        outcome: list[BaseException] = []

        def waiter() -> None:
            try:
                rt.wait(hung, 60)
            except CalctlError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        raw = _unwrap(rt)
        deadline = time.monotonic() + 10
        while s.native and raw._blocked == 0 and time.monotonic() < deadline:  # inside calrt_job_wait
            time.sleep(0.005)
        done = 0
        for _ in range(4):  # all of this runs while the waiter sits in the C call
            job, seq, _, _ = prefill_job(rt, pkg, b)
            expect(
                rt.wait(job, 10).ok,
                "a job on the other chip completes while a thread is blocked in wait",
                call="rt.wait",
            )
            rt.kv.commit(seq)
            rt.kv.free(seq)
            expect(not rt.query(hung).state.terminal, "the hung job is still in flight", returned=rt.query(hung))
            done += 1
        expect(
            thread.is_alive(),
            "the waiter is still blocked (it must not have returned early)",
            call="rt.wait",
            returned=outcome,
        )
        scope = s.reset_chip_or_board(rt, s.chip_of(a))
        thread.join(10)
        expect(
            not thread.is_alive() and [type(e) for e in outcome] == [JobAborted],
            "the waiter returns JobAborted after the reset",
            returned=[_returned(e) for e in outcome],
        )
    return f"{done} submit/wait/KV rounds on chip {s.chip_of(b)} while a thread was blocked in wait; released by a {scope} reset"


@check("close_aborts_waiters", "closing the device with a thread blocked in wait aborts its job and lets it return")
def _close(s: Session) -> str:
    pkg = s.package
    outcome: list[BaseException] = []
    with s.open() as rt:
        rt.configure(rt.create_calbin(pkg))
        s.arm(rt, "hang")
        job, _, _, _ = prefill_job(rt, pkg, pkg.models[0].alias)

        def waiter() -> None:
            try:
                rt.wait(job, 30)
            except CalctlError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.1)  # let the waiter block in wait; close must abort it whether or not it got there
    thread.join(10)
    expect(not thread.is_alive(), "the waiter returned after close", call="rt.close")
    expect(
        [type(e) for e in outcome] == [JobAborted],
        "the waiter got JobAborted",
        returned=[_returned(e) for e in outcome],
    )
    with s.open():
        pass
    return "the blocked waiter got JobAborted; the device reopened"


@check("deterministic_outputs", "outputs are a deterministic function of the inputs")
def _deterministic(s: Session) -> str:
    pkg = s.package
    alias = pkg.models[0].alias
    prompt = golden_prompt(pkg, alias)
    with s.configured() as rt:
        outs = []
        for p in (prompt, prompt, prompt[::-1].copy()):
            job, seq, _, outputs = prefill_job(rt, pkg, alias, p)
            rt.wait(job, 10)
            outs.append(outputs.read("logits").copy())
            rt.kv.free(seq)
    expect(bool(np.array_equal(outs[0], outs[1])), "the same prompt gives the same logits", returned=None)
    expect(not np.allclose(outs[0], outs[2]), "a different prompt gives different logits", returned=None)
    return "same inputs, same logits; other inputs, other logits"


@check("golden_compute", "the package's golden data: prefill logits within tolerance, greedy decode tokens exact")
def _golden(s: Session) -> str:
    pkg = s.package
    with s.configured() as rt:
        for m in pkg.models:
            g, tol = m.golden, m.golden.tolerance
            prompt = golden_prompt(pkg, m.alias)
            want = npy.load(pkg.root / g.prefill_logits.file).astype(np.float32).reshape(1, -1)
            tokens = npy.load(pkg.root / g.decode_tokens.file).reshape(-1).astype(np.int64)
            job, seq, _, outputs = prefill_job(rt, pkg, m.alias, prompt)
            rt.wait(job, 30)
            got = outputs.read("logits").reshape(1, -1)
            close = np.isclose(got, want, rtol=tol.rtol, atol=tol.atol)
            if not close.all():
                idx = int(np.argmax(~close.reshape(-1)))
                raise CheckFailed(
                    f"graph {m.prefill.name!r}: logits[0, {idx}] = {got.reshape(-1)[idx]:.6g}, expected "
                    f"{want.reshape(-1)[idx]:.6g} (rtol {tol.rtol:g}, atol {tol.atol:g}); "
                    f"{int((~close).sum())} of {close.size} values outside, max |err| {float(np.abs(got - want).max()):.3g}",
                    call="calrt_job_submit / calrt_job_wait",
                    arguments=f"graph={m.prefill.name!r}, prompt of {len(prompt)} tokens",
                    returned=f"logits[0, {idx}] = {got.reshape(-1)[idx]:.6g}",
                )
            rt.kv.commit(seq)
            token, position = int(np.argmax(got[0])), len(prompt)
            for step, expected in enumerate(tokens):
                if token != int(expected):
                    raise CheckFailed(
                        f"graph {m.decode.name!r}: greedy token {step} (position {position}) is {token}, "
                        f"expected {int(expected)}",
                        call="calrt_job_submit / calrt_job_wait",
                        arguments=f"graph={m.decode.name!r}, position={position}",
                        returned=f"token {token}",
                    )
                if step == len(tokens) - 1:
                    break
                with rt.job_buffers(m.decode.name) as (inputs, outs):
                    rt.kv.append(seq, 1)
                    write_decode(inputs, token, position)
                    rt.wait(rt.submit(m.decode.name, inputs, outs, kv=[seq]), 30)
                    rt.kv.commit(seq)
                    token = int(np.argmax(outs.read("logits")[0]))
                position += 1
            rt.kv.free(seq)
    return ", ".join(
        f"{m.alias}: logits within tolerance, {len(npy.load(pkg.root / m.golden.decode_tokens.file).reshape(-1))} tokens exact"
        for m in pkg.models
    )


CHECK_NAMES = tuple(c.name for c in CHECKS)


def checks_for(device: DeviceKind) -> list[Check]:
    return [c for c in CHECKS if device is DeviceKind.CALRT or not c.native_only]


# ---------------------------------------------------------------------------
# Running


def run_check(check: Check, target: Target) -> CheckResult:
    """Run one check in this process. Exceptions become FAIL / UNSUPPORTED rows; nothing escapes."""
    session = Session(target)
    t0 = time.monotonic()
    verdict, detail = Verdict.PASS, ""
    call = arguments = returned = None
    try:
        detail = check.run(session) or ""
    except CheckFailed as exc:
        verdict, detail, call, arguments, returned = Verdict.FAIL, exc.detail, exc.call, exc.arguments, exc.returned
    except Unsupported as exc:
        verdict, detail = Verdict.UNSUPPORTED, str(exc)
    except NotSupported as exc:
        verdict, detail = Verdict.UNSUPPORTED, str(exc)
        call, arguments = session.log.last or (None, None)
        returned = _returned(exc)
    except Exception as exc:  # any other error is the check's finding: the call that raised it
        verdict, detail = Verdict.FAIL, f"unexpected {type(exc).__name__}"
        call, arguments = session.log.last or (None, None)
        returned = _returned(exc)
        if not isinstance(exc, CalctlError):
            detail += " (" + "".join(traceback.format_exception_only(type(exc), exc)).strip() + ")"
    return CheckResult(
        check.name, check.title, verdict, time.monotonic() - t0, detail, call, arguments, returned, session.evidence
    )


@dataclass(frozen=True)
class SuiteReport:
    target: Target
    results: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        return all(r.verdict in (Verdict.PASS, Verdict.UNSUPPORTED) for r in self.results)

    def counts(self) -> dict[str, int]:
        return {v.value: sum(1 for r in self.results if r.verdict is v) for v in Verdict}


def run_suite(
    target: Target,
    names: Sequence[str] | None = None,
    *,
    check_timeout: float = DEFAULT_CHECK_TIMEOUT,
    on_result: Callable[[CheckResult], None] | None = None,
) -> SuiteReport:
    """Run the checks in child processes, each bounded by ``check_timeout`` seconds."""
    todo = [c for c in checks_for(target.device) if names is None or c.name in names]
    results: list[CheckResult] = []
    while todo:
        got = _run_child(target, todo, check_timeout, on_result)
        results.extend(got)
        todo = todo[len(got) :]
    return SuiteReport(target, tuple(results))


def _run_child(
    target: Target, todo: list[Check], check_timeout: float, on_result: Callable[[CheckResult], None] | None
) -> list[CheckResult]:
    spec = json.dumps({**target.describe(), "checks": [c.name for c in todo]})
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "calctl.runtime.conformance", spec],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its own process group: a hung child is killed with whatever it started
        )
        lines: queue.Queue[str | None] = queue.Queue()

        def reader() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith(_MARK):
                    lines.put(line[len(_MARK) :])
            lines.put(None)

        threading.Thread(target=reader, daemon=True).start()
        results: list[CheckResult] = []
        try:
            for c in todo:
                started = time.monotonic()
                deadline = started + check_timeout + 30  # startup and imports get their own margin
                begun = False
                result: CheckResult | None = None
                while result is None:
                    try:
                        line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        result = CheckResult(
                            c.name,
                            c.title,
                            Verdict.TIMEOUT,
                            time.monotonic() - started,
                            f"did not finish within {check_timeout:g} s; the check's process was killed"
                            if begun
                            else "the check's process did not start it in time",
                        )
                        break
                    if line is None:
                        proc.wait(10)
                        err.seek(0)
                        tail = err.read()[-600:].strip()
                        result = CheckResult(
                            c.name,
                            c.title,
                            Verdict.FAIL,
                            time.monotonic() - started,
                            f"the check's process died ({_exit_text(proc.returncode)})" + (f": {tail}" if tail else ""),
                        )
                        break
                    doc = json.loads(line)
                    if doc.get("event") == "begin":
                        begun, started, deadline = True, time.monotonic(), time.monotonic() + check_timeout
                    else:
                        result = CheckResult.from_dict(doc["result"])
                results.append(result)
                if on_result is not None:
                    on_result(result)
                if result.verdict is Verdict.TIMEOUT or (result.verdict is Verdict.FAIL and proc.poll() is not None):
                    break
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return results


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit {code}"


def _child_main(spec_text: str) -> int:
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing shim leaves a row, not a core file
    spec = json.loads(spec_text)
    target = Target(
        DeviceKind(spec["device"]), Path(spec["package"]), Path(spec["library"]) if spec.get("library") else None
    )
    by_name = {c.name: c for c in CHECKS}
    for name in spec["checks"]:
        print(_MARK + json.dumps({"event": "begin", "check": name}), flush=True)
        result = run_check(by_name[name], target)
        print(_MARK + json.dumps({"event": "result", "result": result.to_dict()}, default=str), flush=True)
    return 0


# ---------------------------------------------------------------------------
# Vendor questions (000 §20, 001 §15.2) answered from the checks


@dataclass(frozen=True)
class VendorAnswer:
    question: str
    source: str  # report section
    grade: str  # C0 measured here | C1 symbol present, behaviour not shown | C4 refused
    answer: str
    evidence: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def vendor_questions(results: Sequence[CheckResult]) -> list[VendorAnswer]:
    by = {r.name: r for r in results}

    def shown(name: str) -> CheckResult | None:
        r = by.get(name)
        return r if r is not None and r.verdict is Verdict.PASS else None

    def not_shown(name: str, symbol: str) -> str:
        r = by.get(name)
        why = f"check {name} {r.verdict.value}" if r else f"check {name} not run"
        return f"{symbol} present; {why}"

    out: list[VendorAnswer] = []
    r = shown("concurrent_submit_two_chips")
    if r:
        ov = float(r.evidence.get("overlap_ms", 0.0))
        out.append(
            VendorAnswer(
                "Do two chips execute jobs at the same time?",
                "000 §20, 001 §15.2 item 2",
                "C0",
                "yes" if ov > 0 else "no: the chips' job intervals never overlapped (serialised, S1 at best)",
                f"{r.evidence.get('jobs')} jobs from two threads; chip intervals overlapped {ov:.1f} ms",
            )
        )
    else:
        out.append(
            VendorAnswer(
                "Do two chips execute jobs at the same time?",
                "000 §20, 001 §15.2 item 2",
                "C1",
                "not shown",
                not_shown("concurrent_submit_two_chips", "calrt_job_submit"),
            )
        )
    r = shown("two_in_flight_one_chip")
    if r:
        n = int(r.evidence.get("max_in_flight", 1))
        out.append(
            VendorAnswer(
                "How many jobs can be in flight on one chip (PING/PONG)?",
                "000 §20, 000 §14",
                "C0",
                f"{n}"
                + (" (a PING and a PONG job overlapped)" if n == 2 else " (the second job waited or was refused)"),
                r.detail,
            )
        )
    else:
        out.append(
            VendorAnswer(
                "How many jobs can be in flight on one chip (PING/PONG)?",
                "000 §20, 000 §14",
                "C1",
                "not shown",
                not_shown("two_in_flight_one_chip", "calrt_job_submit(engine)"),
            )
        )
    r = by.get("chip_vs_board_reset")
    if r is not None and r.verdict is Verdict.PASS:
        out.append(
            VendorAnswer(
                "What does a chip reset affect?",
                "001 §15.2 item 7",
                "C0",
                "only its own chip's jobs and KV; the configuration and the other chip stay",
                r.detail,
            )
        )
    elif r is not None and r.verdict is Verdict.UNSUPPORTED and r.evidence.get("chip_reset") is False:
        out.append(
            VendorAnswer(
                "What does a chip reset affect?",
                "001 §15.2 item 7",
                "C4",
                "no chip-scoped reset: every fault is board-wide (F0, 001 §11.3)",
                r.detail,
            )
        )
    else:
        out.append(
            VendorAnswer(
                "What does a chip reset affect?",
                "001 §15.2 item 7",
                "C1",
                "not shown",
                not_shown("chip_vs_board_reset", "calrt_reset"),
            )
        )
    r = by.get("memory_counters")
    if r is not None and r.verdict is Verdict.PASS:
        mem = "; ".join(
            f"chip {m['chip']} {m['loaded_bytes']} of {m['total_bytes']} B" for m in r.evidence.get("memory", [])
        )
        out.append(
            VendorAnswer("Is per-chip memory reported?", "001 §15.2 item 5", "C0", "yes, per chip", mem or r.detail)
        )
    elif r is not None and r.verdict is Verdict.UNSUPPORTED:
        out.append(
            VendorAnswer(
                "Is per-chip memory reported?",
                "001 §15.2 item 5",
                "C4",
                "no: NOT_SUPPORTED (calctl shows null, never 0)",
                r.detail,
            )
        )
    else:
        out.append(
            VendorAnswer(
                "Is per-chip memory reported?",
                "001 §15.2 item 5",
                "C1",
                "not shown",
                not_shown("memory_counters", "calrt_memory_usage"),
            )
        )
    r = shown("concurrent_submit_two_chips")
    if r:
        out.append(
            VendorAnswer(
                "Are submit and wait thread-safe across chips?",
                "001 §15.2 item 4",
                "C0",
                f"yes for {r.evidence.get('jobs')} jobs from two threads (no error, no crosstalk)",
                r.detail,
            )
        )
    else:
        out.append(
            VendorAnswer(
                "Are submit and wait thread-safe across chips?",
                "001 §15.2 item 4",
                "C1",
                "not shown",
                not_shown("concurrent_submit_two_chips", "calrt_job_submit/calrt_job_wait"),
            )
        )
    return out


if __name__ == "__main__":  # the child process of run_suite
    sys.exit(_child_main(sys.argv[1]))
