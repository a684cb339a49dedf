"""The check framework: verdicts, results, the target, the session a check gets, expectations, job helpers,
the check registry and :func:`run_check` (one check in this process)."""

from __future__ import annotations

import contextlib
import ctypes
import enum
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
from calctl.runtime.buffers import HostBuffer
from calctl.runtime.errors import (
    NotSupported,
    RuntimeLayerError,
    RuntimeStatus,
)
from calctl.runtime.types import KvSeqId

DEFAULT_CHECK_TIMEOUT = 60.0
_MARK = "@@calctl-conformance@@ "


class ConformanceLevel(str, enum.Enum):
    """How hard the suite tries (``--level``): ``quick`` every promise once (under 30 s on the reference board);
    ``standard`` also holds a hung job past any plausible shim watchdog and runs thousands of jobs, each output
    against its twin, so a fault that shows once in N jobs has N to show in; ``long`` more of the same."""

    QUICK = "quick"
    STANDARD = "standard"
    LONG = "long"


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
    clauses: tuple[str, ...] = ()  # the C ABI clauses the check tries (clauses.py); a FAIL broke one of them

    def __post_init__(self) -> None:
        object.__setattr__(self, "clauses", tuple(self.clauses))  # a list after a JSON round trip

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["verdict"] = self.verdict.value
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> CheckResult:
        return cls(**{**doc, "verdict": Verdict(doc["verdict"])})


class ExpectationFailed(Exception):
    """A check's expectation did not hold: FAIL with the call, its arguments and what came back."""

    def __init__(
        self, detail: str, *, call: str | None = None, arguments: str | None = None, returned: str | None = None
    ):
        super().__init__(detail)
        self.detail, self.call, self.arguments, self.returned = detail, call, arguments, returned


class Abandoned(ExpectationFailed):
    """A FAIL after which the check's process cannot go on (threads stuck inside the library): the device is
    left as it is, and the remaining checks run in a fresh process."""


class Unsupported(Exception):
    """The runtime refused (NOT_SUPPORTED), or the check needs something this target lacks."""


# ---------------------------------------------------------------------------
# The target and what a check gets


@dataclass(frozen=True)
class ConformanceTarget:
    """What the suite runs against: ``mock``, or ``calrt`` with a library; and the package the checks load."""

    device: DeviceKind
    package: Path
    library: Path | None = None
    level: ConformanceLevel = ConformanceLevel.QUICK

    def describe(self) -> dict[str, Any]:
        return {
            "device": self.device.value,
            "library": str(self.library) if self.library else None,
            "package": str(self.package),
            "level": self.level.value,
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

    def __init__(self, target: ConformanceTarget) -> None:
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

    @property
    def level(self) -> ConformanceLevel:
        return self.target.level

    def open_raw(self) -> Runtime:
        if self.native:
            from calctl.runtime._native import lib as L

            if L.call_log() is None:  # in this process (tests): an in-memory log, for the concurrency counts
                L.install_call_log(L.CallLog())
            return open_runtime("calrt", calrt_lib=self.target.library)
        return open_runtime("mock")

    def calls(self) -> Any:
        """The process's CalRT call log (native targets): who is inside which call, and how many at once."""
        from calctl.runtime._native import lib as L

        return L.call_log()

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

    def armed_prefill(self, rt: Runtime, fault: str, alias: str) -> tuple[Job, KvSeqId, HostBuffer, HostBuffer]:
        """Arm ``fault`` and submit the prefill of ``alias`` that hits it: (job, seq, inputs, outputs)."""
        self.arm(rt, fault)
        return prefill_job(rt, self.package, alias)

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


@contextlib.contextmanager
def held_jobs(rt: Runtime, ms: int) -> Iterator[None]:
    """Jobs that start inside the block compute ``ms`` ms longer (the ``delay_ms`` test hook), cleared on leaving;
    Unsupported where the library lacks the hook."""
    raw = _unwrap(rt)
    try:
        raw.arm_test_fault("delay_ms", ms)
    except NotSupported:
        raise Unsupported("the library lacks the calrt_ext_fault_set test hook (delay_ms) this check needs") from None
    try:
        yield
    finally:
        raw.arm_test_fault("delay_ms", 0)


def raw_job_info(rt: Runtime, job: Job, wait_ms: int | None = None) -> tuple[int, Any]:
    """``calrt_job_query`` (or ``calrt_job_wait`` with ``wait_ms``) straight into the library: the status and the
    ``calrt_job_info`` the shim fills in, before calctl has observed (and released) the job."""
    from calctl.runtime._native import lib as L

    raw = _unwrap(rt)
    info = L.CalrtJobInfo()
    if wait_ms is None:
        rc = raw._fn.calrt_job_query(raw._dev, job.id, ctypes.byref(info))
    else:
        rc = raw._fn.calrt_job_wait(raw._dev, job.id, wait_ms, ctypes.byref(info))
    return int(rc), info


def raw_submit(
    rt: Runtime,
    graph: str,
    inputs: HostBuffer | Any,
    outputs: HostBuffer | Any,
    kv: KvSeqId | Sequence[KvSeqId | None] | None = None,
) -> tuple[int, int]:
    """``calrt_job_submit`` straight into the library, past calctl's own checks (what a shim answers): engine
    AUTO, ``kv`` the lane's sequence (reserved by the caller) or none at B1, or one per lane (None: inactive) at
    B = its length. ``inputs``/``outputs`` are calctl buffers or raw ``calrt_buffer`` handles. Returns (status,
    job id; 0 unless OK)."""
    from calctl.runtime._native import lib as L

    raw = _unwrap(rt)
    per_lane: list[KvSeqId | None] = list(kv) if isinstance(kv, (list, tuple)) else [cast(KvSeqId | None, kv)]
    lanes = (ctypes.c_uint64 * len(per_lane))(*(L.KV_NONE if q is None else int(q) for q in per_lane))
    native = [b.native if isinstance(b, HostBuffer) else b for b in (inputs, outputs)]
    desc = L.CalrtJobDesc(graph.encode(), native[0], native[1], 0, len(per_lane), len(per_lane), lanes, 0)
    job = ctypes.c_uint64()
    rc = int(raw._fn.calrt_job_submit(raw._dev, ctypes.byref(desc), ctypes.byref(job)))
    return rc, int(job.value) if rc == RuntimeStatus.OK else 0


def expect_submit_refused(
    rt: Runtime,
    graph: str,
    buffers: tuple[HostBuffer, HostBuffer],
    kv: KvSeqId | Sequence[KvSeqId | None],
    detail: str,
    *,
    arguments: str,
) -> None:
    """A ``raw_submit`` the library must refuse with INVALID_ARGUMENT; a job it accepts is waited for (its buffers
    are the caller's to reuse) before the FAIL."""
    status, job = raw_submit(rt, graph, buffers[0], buffers[1], kv=kv)
    if status == RuntimeStatus.OK:
        raw_call(rt, "calrt_job_wait", job, 30_000, None)
    expect_code(status, RuntimeStatus.INVALID_ARGUMENT, detail, call="calrt_job_submit", arguments=arguments)


def raw_call(rt: Runtime, name: str, *args: Any) -> int:
    """One ``calrt_*`` function straight into the library with the device first; its status."""
    raw = _unwrap(rt)
    return int(getattr(raw._fn, name)(raw._dev, *args))


def expect_code(status: int, want: RuntimeStatus, detail: str, *, call: str, arguments: str | None = None) -> None:
    """A raw call's status must be ``want``; a FAIL names the call, its arguments and both codes."""
    got = RuntimeStatus(status).name if status in RuntimeStatus._value2member_map_ else "undefined"
    expect(
        status == want,
        f"{detail} must return {want.name} ({int(want)})",
        call=call,
        arguments=arguments,
        returned=f"status {status} {got}",
    )


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
        code = int(status)  # the code once, with its name when it is one of the ABI's (C ABI §4)
        name = RuntimeStatus(code).name if code in RuntimeStatus._value2member_map_ else None
        return f"{type(exc).__name__} (status {code}{' ' + name if name else ''}): {exc}"
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------
# Expectations


def expect(
    condition: bool, detail: str, *, call: str | None = None, arguments: str | None = None, returned: Any = None
) -> None:
    if not condition:
        raise ExpectationFailed(
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
        raise ExpectationFailed(
            f"{call} must raise {names}", call=call, arguments=_args(args, kwargs), returned=_returned(exc)
        ) from None
    raise ExpectationFailed(
        f"{call} must raise {names}", call=call, arguments=_args(args, kwargs), returned=_short(value)
    )


def expect_status(exc: BaseException, status: RuntimeStatus, call: str) -> None:
    got = getattr(exc, "status", None)
    expect(got == status, f"{call} must report status {int(status)} {status.name}", call=call, returned=_returned(exc))


def expect_wait_error(
    rt: Runtime, job: Job, error: type[BaseException], status: RuntimeStatus, why: str, timeout: float = 10
) -> BaseException:
    """``rt.wait(job, timeout)`` raises ``error`` carrying ``status`` (the C ABI's code for it); the error."""
    exc = expect_raises(error, f"rt.wait ({why})", rt.wait, job, timeout)
    expect_status(exc, status, "calrt_job_wait")
    return exc


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


def decode_mask(pkg: Package, alias: str) -> str | None:
    """The decode graph's inactive-lane mask input (``inactive_lane_policy.mask_input``, 000 §7.3), or None."""
    policy = pkg.model(alias).decode.inactive_lane_policy
    return policy.mask_input if policy is not None else None


def write_decode(inputs: HostBuffer, token: int, position: int, *, mask: str | None = "lane_valid") -> None:
    """One active B1 decode lane. The lane's mask (``lane_valid``) is written 1 wherever the layout has it: a
    package with batch profiles keeps the mask input at B1 too, and a 0 there is an inactive lane whose
    ``kv`` must be CALRT_KV_NONE (C ABI §6), so a job naming a sequence would be refused."""
    write_decode_lanes(inputs, [token], [position], [True], mask=mask)


def write_decode_lanes(
    inputs: HostBuffer,
    tokens: Sequence[int],
    positions: Sequence[int],
    valid: Sequence[bool],
    *,
    mask: str | None = "lane_valid",
) -> None:
    """A decode job's inputs at its batch profile B: a token, a position and a mask value per lane (an inactive
    lane's token and position are 0; the mask written wherever the layout has it, 000 §7.3)."""
    batch = inputs.batch
    if not len(tokens) == len(positions) == len(valid) == batch:
        raise ValueError(
            f"decode inputs of B{batch}: {len(tokens)} tokens, {len(positions)} positions, {len(valid)} lanes"
        )
    inputs.write("tokens", np.array([[t if v else 0] for t, v in zip(tokens, valid, strict=True)], np.int32))
    inputs.write("positions", np.array([p if v else 0 for p, v in zip(positions, valid, strict=True)], np.int32))
    if mask is not None and mask in inputs.names:
        inputs.write(mask, np.array([1 if v else 0 for v in valid], np.uint8))
    elif not all(valid):
        raise ValueError(f"B{batch} decode inputs with inactive lanes need the mask input {mask!r}")


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


# ---------------------------------------------------------------------------
# The checks


@dataclass(frozen=True)
class ConformanceCheck:
    """One registered check (:func:`check`): its name, its title and the function that runs it."""

    name: str
    title: str
    run: Callable[[Session], str | None]  # returns the PASS detail
    native_only: bool = False  # a property of the C library itself (the mock has no C ABI)
    clauses: tuple[str, ...] = ()  # the C ABI clauses it tries (clauses.py, docs/calrt-c-abi.md §13)
    seconds: dict[ConformanceLevel, float] = field(
        default_factory=dict
    )  # its own bound per level, when above --check-timeout

    def timeout(self, level: ConformanceLevel, check_timeout: float) -> float:
        """The bound the runner gives it: ``--check-timeout``, or more where its level needs more (a long run)."""
        return max(check_timeout, self.seconds.get(level, 0.0))


CHECKS: list[ConformanceCheck] = []


def check(
    name: str,
    title: str,
    *,
    clauses: tuple[str, ...],
    native_only: bool = False,
    seconds: dict[ConformanceLevel, float] | None = None,
) -> Callable[[Callable[[Session], str | None]], Callable[[Session], str | None]]:
    def register(fn: Callable[[Session], str | None]) -> Callable[[Session], str | None]:
        CHECKS.append(ConformanceCheck(name, title, fn, native_only, tuple(clauses), dict(seconds or {})))
        return fn

    return register


def checks_for(device: DeviceKind) -> list[ConformanceCheck]:
    return [c for c in CHECKS if device is DeviceKind.CALRT or not c.native_only]


# ---------------------------------------------------------------------------
# Running


def run_check(check: ConformanceCheck, target: ConformanceTarget) -> CheckResult:
    """Run one check in this process. Exceptions become FAIL / UNSUPPORTED rows; nothing escapes."""
    session = Session(target)
    t0 = time.monotonic()
    verdict, detail = Verdict.PASS, ""
    call = arguments = returned = None
    try:
        detail = check.run(session) or ""
    except ExpectationFailed as exc:
        verdict, detail, call, arguments, returned = Verdict.FAIL, exc.detail, exc.call, exc.arguments, exc.returned
        if isinstance(exc, Abandoned):
            session.evidence["abandoned"] = True
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
        check.name,
        check.title,
        verdict,
        time.monotonic() - t0,
        detail,
        call,
        arguments,
        returned,
        session.evidence,
        check.clauses,
    )
