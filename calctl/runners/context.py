"""What every device runner shares: a device spec, a step log, and :class:`RunContext`.

:class:`RunContext` is the one place a runner gets a configured board from:

1. ``open device`` – ``open_runtime`` (001 §6.4 CreateVDevice);
2. ``validate`` – :func:`calctl.package.validate.validate` with the device's
   runtime version, so a failing package never reaches ``configure``
   (001 §16 PR1); the failing rule IDs become a :class:`CheckFailed` (exit 1);
3. ``load`` – the package read from the same bytes that were validated (its
   digest must equal the validated one), and its fit to the device: chip count,
   CalCores and per-chip DRAM (declared and reserved) against the device's
   topology (:func:`calctl.budget.device.device_fit`), so a manifest that
   raises ``chip_dram_bytes`` never reaches configure;
4. ``create calbin`` – and the sha256 of every program (code and command
   section) the calbin hands the runtime, per chip, each checked against the
   sealed ``checksums.sha256`` (the issue's "ran whatever was already loaded");
5. ``configure`` – exactly once.

Teardown runs on every path, Ctrl-C included (``with RunContext(...)``):
``drain`` (wait for in-flight jobs, else a board reset), ``reset
configuration``, ``release`` (calbin, device, extracted package). Each is a
logged step, so a report shows that the board was left clean.

:class:`StepLog` records named steps with status, duration and detail (the
PoC's "each step logged with its status"). :func:`header` is the block every
report starts with: device kind (mock results labelled as such, docs/runtime.md §5),
runtime versions, package digest and signer.

This module does not run models, judge results or render anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

from calctl.budget.device import device_fit
from calctl.errors import CalctlError, CheckFailed, ExitCode, StepTimeout, UsageError, interrupt_reason
from calctl.package.info import package_digest
from calctl.package.model import Package, SectionKind
from calctl.package.reader import load_manifest, package_root
from calctl.package.validate import ValidationPolicy, ValidationReport, validate
from calctl.report import MOCK_LABEL, Report, StepRecord, StepStatus, build_header, exit_code_of
from calctl.runners.trace import Mark, TraceSlice, plot_timeline, write_chrome_trace
from calctl.runtime import Calbin, DeviceKind, Health, Runtime, TraceEvent, Versions, open_runtime
from calctl.runtime.errors import InvalidCalbin, RuntimeLayerError
from calctl.runtime.types import JobState
from calctl.signing import seal
from calctl.signing.files import CHECKSUMS
from calctl.signing.policy import TrustPolicy

# ---------------------------------------------------------------------------
# Outcomes and the step log


class CalbinRefused(CheckFailed):
    """The runtime refused to create a calbin from the package (InvalidCalbin): exit 1, before configure."""


class Outcome(str, enum.Enum):
    """How a runner ended. ``exit_code`` is the documented process exit code (docs/cli.md)."""

    PASS = "PASS"
    FAIL = "FAIL"  # it ran and the thing checked is wrong (or the package was refused)
    TIMEOUT = "TIMEOUT"  # a step hung past its deadline
    ERROR = "ERROR"  # the device or runtime failed
    INTERRUPTED = "INTERRUPTED"  # SIGINT (Ctrl-C) or SIGTERM

    @property
    def exit_code(self) -> int:
        return exit_code_of(self.value)


def outcome_of(exc: BaseException) -> Outcome:
    """The outcome an exception stands for. Usage errors are not outcomes: callers re-raise them."""
    if isinstance(exc, KeyboardInterrupt):
        return Outcome.INTERRUPTED
    if isinstance(exc, StepTimeout):
        return Outcome.TIMEOUT
    if isinstance(exc, CalctlError) and exc.exit_code == ExitCode.FAILED:
        return Outcome.FAIL
    return Outcome.ERROR


def error_text(exc: BaseException) -> str:
    """What a report says about the exception that ended a step or a run (``interrupted (SIGTERM)`` for a signal)."""
    if isinstance(exc, KeyboardInterrupt):
        return interrupt_reason(exc)
    return str(exc) or type(exc).__name__


_STATUS_OF_OUTCOME = {
    Outcome.FAIL: StepStatus.FAIL,
    Outcome.TIMEOUT: StepStatus.TIMEOUT,
    Outcome.ERROR: StepStatus.ERROR,
    Outcome.INTERRUPTED: StepStatus.INTERRUPTED,
    Outcome.PASS: StepStatus.PASS,
}


@dataclass
class StepNote:
    """What a step body may set while it runs: its detail, and WARN/FAIL without raising."""

    detail: str = ""
    status: StepStatus = StepStatus.PASS


class StepLog:
    """Named steps in the order they ran. ``on_record`` (e.g. a stderr logger) sees each as it ends."""

    def __init__(self, on_record: Callable[[StepRecord], None] | None = None) -> None:
        self._records: list[StepRecord] = []
        self._on_record = on_record

    @property
    def records(self) -> tuple[StepRecord, ...]:
        return tuple(self._records)

    def add(self, name: str, status: StepStatus, seconds: float = 0.0, detail: str = "") -> StepRecord:
        rec = StepRecord(name, status, seconds, detail)
        self._records.append(rec)
        if self._on_record is not None:
            self._on_record(rec)
        return rec

    def skip(self, name: str, reason: str) -> StepRecord:
        return self.add(name, StepStatus.SKIP, 0.0, reason)

    def status_of(self, name: str) -> StepStatus | None:
        for rec in reversed(self._records):
            if rec.name == name:
                return rec.status
        return None

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[StepNote]:
        """Time the body; record its status (from an exception, or the note) and re-raise anything."""
        note = StepNote()
        t0 = time.perf_counter()
        try:
            yield note
        except UsageError as exc:
            self.add(name, StepStatus.ERROR, time.perf_counter() - t0, _detail(note, exc))
            raise
        except BaseException as exc:
            self.add(name, _STATUS_OF_OUTCOME[outcome_of(exc)], time.perf_counter() - t0, _detail(note, exc))
            raise
        self.add(name, note.status, time.perf_counter() - t0, note.detail)


def _detail(note: StepNote, exc: BaseException) -> str:
    what = error_text(exc)
    return f"{note.detail}; {what}" if note.detail else what


# ---------------------------------------------------------------------------
# Device spec


@dataclass(frozen=True)
class DeviceSpec:
    """Which device to open and, for the mock, how (docs/runtime.md: fault plans, time_scale, serialize_chips)."""

    kind: DeviceKind = DeviceKind.MOCK
    calrt_lib: Path | None = None
    time_scale: float | None = None  # mock only; None = the mock's own default
    serialize_chips: bool = False  # mock only: a modelled global runtime lock (S1)
    fault_plan: Path | None = None  # mock only: calctl-fault-plan/v1 YAML
    seed: int | None = None  # mock only: overrides the fault plan's seed

    def __post_init__(self) -> None:
        if self.kind is DeviceKind.CALRT:
            given = [
                flag
                for flag, on in (
                    ("--time-scale", self.time_scale is not None),
                    ("--serialize-chips", self.serialize_chips),
                    ("--fault-plan", self.fault_plan is not None),
                    ("--seed", self.seed is not None),
                )
                if on
            ]
            if given:
                raise UsageError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --device mock only")
        elif self.calrt_lib is not None:
            raise UsageError("--calrt-lib applies to --device calrt only")
        if self.time_scale is not None and not self.time_scale > 0:
            raise UsageError(f"--time-scale {self.time_scale}: expected a positive number")

    @property
    def is_mock(self) -> bool:
        return self.kind is DeviceKind.MOCK

    def with_default_time_scale(self, time_scale: float) -> DeviceSpec:
        """The same spec, with ``time_scale`` if the mock's is not set."""
        if not self.is_mock or self.time_scale is not None:
            return self
        return DeviceSpec(self.kind, self.calrt_lib, time_scale, self.serialize_chips, self.fault_plan, self.seed)

    def open(self) -> Runtime:
        if not self.is_mock:
            return open_runtime(self.kind, calrt_lib=self.calrt_lib)
        options: dict[str, Any] = {}
        if self.time_scale is not None:
            options["time_scale"] = self.time_scale
        if self.serialize_chips:
            options["serialize_chips"] = True
        if self.fault_plan is not None:
            options["fault_plan"] = self.fault_plan
        if self.seed is not None:
            options["seed"] = self.seed
        return open_runtime(self.kind, **options)

    def describe(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"kind": self.kind.value}
        if self.is_mock:
            doc.update(
                time_scale=self.time_scale if self.time_scale is not None else 1.0,
                serialize_chips=self.serialize_chips,
                fault_plan=str(self.fault_plan) if self.fault_plan else None,
                seed=self.seed,
            )
        else:
            doc["calrt_lib"] = str(self.calrt_lib) if self.calrt_lib else None
        return doc


# ---------------------------------------------------------------------------
# Programs actually handed to the runtime


@dataclass(frozen=True)
class ProgramDigest:
    """One program (code or command section) of the configured calbin, on one chip."""

    chip: int
    model: str
    graph: str
    section: str
    kind: str  # code | command
    calcore: int | None
    file: str
    sha256: str
    bytes: int
    sealed: bool  # equals the digest in the validated checksums.sha256


def program_digests(calbin: Calbin) -> tuple[ProgramDigest, ...]:
    """The sha256 of every program file the calbin's graphs load, per chip, from the calbin's own package root.

    These are the files the runtime loads for this calbin (the CalRT shim reads
    them from the same root), not whatever happens to be in a directory.
    """
    root = calbin.package.root
    try:
        sealed = seal.parse_checksums((root / CHECKSUMS).read_bytes())
    except (OSError, CalctlError):
        sealed = {}
    out: list[ProgramDigest] = []
    digests: dict[str, tuple[str, int]] = {}
    for gp in calbin.plan.graphs.values():
        for sec in gp.graph.sections:
            if sec.kind not in (SectionKind.CODE, SectionKind.COMMAND) or sec.file is None:
                continue
            if sec.file not in digests:
                data = (root / sec.file).read_bytes()
                digests[sec.file] = (hashlib.sha256(data).hexdigest(), len(data))
            digest, size = digests[sec.file]
            for chip in sec.chips:
                out.append(
                    ProgramDigest(
                        chip=chip,
                        model=gp.model,
                        graph=gp.name,
                        section=sec.name,
                        kind=sec.kind.value,
                        calcore=sec.calcore,
                        file=sec.file,
                        sha256=digest,
                        bytes=size,
                        sealed=sealed.get(sec.file) == digest,
                    )
                )
    return tuple(sorted(out, key=lambda p: (p.chip, p.graph, p.calcore if p.calcore is not None else -1, p.section)))


def programs_document(programs: Sequence[ProgramDigest]) -> list[dict[str, Any]]:
    """Per chip: the programs configured there (the report's ``programs``)."""
    chips: dict[int, list[dict[str, Any]]] = {}
    for p in programs:
        chips.setdefault(p.chip, []).append(
            {
                "model": p.model,
                "graph": p.graph,
                "section": p.section,
                "kind": p.kind,
                "calcore": p.calcore,
                "file": p.file,
                "sha256": p.sha256,
                "bytes": p.bytes,
                "sealed": p.sealed,
            }
        )
    return [{"chip": c, "programs": chips[c]} for c in sorted(chips)]


# ---------------------------------------------------------------------------
# Traces


def trace_slices(events: Sequence[TraceEvent], *, phases: bool = False) -> list[TraceSlice]:
    """Chrome-trace slices of the jobs that ran (a job aborted before it started has no interval).

    ``phases``: add each job's h2d/compute/d2h intervals as sub-slices where the runtime reports them.
    """
    out: list[TraceSlice] = []
    for e in events:
        if e.start_ns is None or e.end_ns is None:
            continue
        job = TraceSlice(
            chip=e.chip,
            start=e.start_ns / 1e9,
            end=e.end_ns / 1e9,
            model=e.model,
            graph=e.graph,
            engine=e.engine.value,
            job_id=int(e.job),
            generation=int(e.generation),
            ok=e.state is JobState.SUCCEEDED,
        )
        out.append(job)
        if phases and e.phases:
            out.extend(
                dataclasses.replace(job, start=p.start_ns / 1e9, end=p.end_ns / 1e9, phase=p.phase.value)
                for p in e.phases
            )
    return out


def write_trace_outputs(
    events: Sequence[TraceEvent],
    *,
    trace: Path | None,
    plot: Path | None,
    device: str,
    title: str,
    metadata: dict[str, Any],
    marks: Sequence[Mark] = (),
) -> dict[str, str | None]:
    """Write the Chrome/Perfetto JSON and/or the timeline PNG (``marks`` shaded behind it); return where they went."""
    slices = trace_slices(events)
    out: dict[str, str | None] = {"json": None, "plot": None}
    if trace is not None:
        write_chrome_trace(trace, slices, device=device, metadata=metadata)
        out["json"] = str(trace)
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        plot_timeline(plot, slices, title=title, device=device, marks=marks)
        out["plot"] = str(plot)
    return out


# ---------------------------------------------------------------------------
# RunContext


@dataclass
class _Snapshot:
    """What the teardown keeps after the device is gone."""

    events: tuple[TraceEvent, ...] = ()
    memory_before: list[dict[str, Any]] | None = None
    memory_after: list[dict[str, Any]] | None = None
    counters: list[dict[str, Any]] | None = None


class RunContext:
    """Validate, open, configure and tear down one package on one device. Use with ``with``.

    ``prepare()`` runs steps 1–5 of the module docstring; the PoC calls them one
    by one to put its own exact-name check between ``create calbin`` and
    ``configure`` (001 §6.4).
    """

    def __init__(
        self,
        package: Path,
        *,
        trust: TrustPolicy,
        device: DeviceSpec,
        log: StepLog | None = None,
        expect_models: tuple[str, ...] | None = None,
        drain_timeout_s: float = 10.0,
    ) -> None:
        self.path = Path(package)
        self.trust = trust
        self.device = device
        self.log = log or StepLog()
        self.expect_models = expect_models
        self.drain_timeout_s = drain_timeout_s
        self.validation: ValidationReport | None = None
        self.rt: Runtime | None = None
        self.versions: Versions | None = None
        self.pkg: Package | None = None
        self.calbin: Calbin | None = None
        self.configured = False
        self.programs: tuple[ProgramDigest, ...] = ()
        self.snapshot = _Snapshot()
        self.started_at = datetime.now(timezone.utc)
        self._t0_ns = time.monotonic_ns()
        self._stack = ExitStack()
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------

    def __enter__(self) -> RunContext:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def prepare(self) -> RunContext:
        self.open_device()
        self.validate()
        self.load()
        self.create_calbin()
        self.configure()
        return self

    def open_device(self) -> Runtime:
        with self.log.step("open device") as note:
            self.rt = self._stack.enter_context(self.device.open())
            self.versions = self.rt.versions()
            topo = self.rt.topology()
            note.detail = (
                f"{self.rt.kind.value}: {topo.chips} chips x {topo.calcores_per_chip} CalCores, "
                f"runtime {self.versions.runtime}"
            )
            self.snapshot.memory_before = _memory(self.rt)
        return self.rt

    def validate(self) -> ValidationReport:
        with self.log.step("validate package") as note:
            policy = ValidationPolicy(
                trust=self.trust,
                expect_models=self.expect_models,
                runtime_version=self.versions.runtime if self.versions else None,
            )
            report = validate(self.path, policy)
            self.validation = report
            warned = list(dict.fromkeys(c.id for c in report.warnings))
            note.detail = (
                f"{len(report.rule_ids())} rules, {len(report.failed_ids())} failing, {len(warned)} warning(s)"
                + (f": {', '.join(report.failed_ids())}" if report.errors else "")
            )
            if not report:
                findings = [f"{c.id}: {c.message}" for c in report.errors]
                shown = "; ".join(findings[:4]) + (f"; and {len(findings) - 4} more" if len(findings) > 4 else "")
                raise CheckFailed(
                    f"{self.path}: the package failed validation ({shown or 'rejected by policy'}); "
                    "it never reached configure",
                    hint=f"run `calctl validate {self.path}` for every finding",
                )
            if warned:
                note.status = StepStatus.WARN
                note.detail += f" ({', '.join(warned)})"
        return report

    def load(self) -> Package:
        with self.log.step("load package") as note:
            root = self._stack.enter_context(package_root(self.path))
            pkg = load_manifest(root)
            digest = _digest(root)
            if self.validation is not None and digest != self.validation.digest:
                raise CheckFailed(
                    f"{self.path}: checksums.sha256 changed between validation and loading",
                    hint="something is writing to the package; copy it somewhere read-only",
                )
            self.pkg = pkg
            note.detail = f"{pkg.name} {pkg.version} ({pkg.kind}): {', '.join(pkg.aliases)}"
            if self.rt is not None:
                self._check_device_fit(note)
        return pkg

    def _check_device_fit(self, note: StepNote) -> None:
        """The package's chips, CalCores and DRAM against the device's topology, before configure (001 §8.2)."""
        assert self.rt is not None and self.pkg is not None
        fit = device_fit(self.pkg, self.rt.topology())
        if not fit.ok:
            raise CheckFailed(
                f"{self.path}: the package does not fit the {self.rt.kind.value} device: {fit.summary()}; "
                "it never reached configure",
                hint="build the package for this board (device_cfg and memory_plan), or use the board it was built for",
            )
        note.detail += f"; device fit: {fit.summary()}"
        if fit.notes:
            note.status = StepStatus.WARN

    def create_calbin(self) -> Calbin:
        assert self.rt is not None and self.pkg is not None, "open_device() and load() first"
        with self.log.step("create calbin") as note:
            try:
                calbin = self.rt.create_calbin(self.pkg)
            except InvalidCalbin as exc:
                # 001 §6.4: names, chip targets or masks the runtime refuses -> exit before configure, as a failed check.
                raise CalbinRefused(exc.message, hint=exc.hint) from exc
            self.calbin = self._stack.enter_context(calbin)
            self.programs = program_digests(self.calbin)
            changed = sorted({p.file for p in self.programs if not p.sealed})
            note.detail = f"{len(self.calbin.graph_names)} graphs, {len({p.file for p in self.programs})} program files"
            if changed:
                raise CheckFailed(
                    f"program file(s) differ from the validated checksums: {', '.join(changed)}",
                    hint="the package changed after validation; re-validate and re-run",
                )
        return self.calbin

    def configure(self) -> None:
        assert self.rt is not None and self.calbin is not None, "create_calbin() first"
        with self.log.step("configure") as note:
            self.rt.configure(self.calbin)
            self.configured = True
            note.detail = f"calbin {self.calbin.id} configured once"

    # -- teardown ---------------------------------------------------------------------

    def close(self) -> None:
        """Drain, reset the configuration, release everything. Idempotent; never raises a device error."""
        if self._closed:
            return
        self._closed = True
        rt = self.rt
        try:
            if rt is not None:
                self._drain(rt)
                with contextlib.suppress(RuntimeLayerError):
                    self.snapshot.events = rt.trace(since_ns=self._t0_ns)
                if self.configured and rt.current_calbin is not None:
                    with contextlib.suppress(CalctlError), self.log.step("reset configuration") as note:
                        rt.reset_configuration()
                        note.detail = "ResetConfiguration"
                self.configured = False
                self.snapshot.memory_after = _memory(rt)
                self.snapshot.counters = _counters(rt)
        finally:
            with self.log.step("release") as note:
                try:
                    self._stack.close()  # calbin, device, extracted package: in reverse order of acquisition
                except RuntimeLayerError as exc:  # pragma: no cover - the device close itself failed
                    note.status = StepStatus.ERROR
                    note.detail = f"release failed: {exc}"
                else:
                    note.detail = self._release_detail()
            self.rt = None

    def _drain(self, rt: Runtime) -> None:
        with contextlib.suppress(CalctlError), self.log.step("drain") as note:
            deadline = time.monotonic() + self.drain_timeout_s
            pending = _pending(rt)
            hung = _hung(rt)
            while pending and not hung and time.monotonic() < deadline:
                time.sleep(0.01)
                pending, hung = _pending(rt), _hung(rt)
            if pending is None:
                note.detail = "the runtime reports no job counters"
                return
            if pending:
                # 000 §12: a job that never completes is reclaimed only by a reset; a hung chip will not drain.
                note.status = StepStatus.FAIL
                why = (
                    f"chip {', '.join(map(str, hung))} hung"
                    if hung
                    else f"not drained after {self.drain_timeout_s:g} s"
                )
                note.detail = f"{pending} job(s) still in flight ({why}); board reset"
                rt.reset("board")
                self.configured = False
                return
            note.detail = "no job in flight; counters closed (001 §13.3)"

    def _release_detail(self) -> str:
        before, after = self.snapshot.memory_before, self.snapshot.memory_after
        if not before or not after:
            return "calbin, buffers and device released"
        back = [
            a["chip"]
            for a, b in zip(after, before, strict=True)
            if a["used_bytes"] is not None and b["used_bytes"] is not None and a["used_bytes"] == b["used_bytes"]
        ]
        return f"calbin and device released; memory back to baseline on chip {', '.join(map(str, back)) or 'none'}"

    # -- observation -------------------------------------------------------------------

    def trace_events(self) -> tuple[TraceEvent, ...]:
        """Jobs of this run: live while open, the teardown's snapshot after."""
        if self.rt is not None and not self._closed:
            return self.rt.trace(since_ns=self._t0_ns)
        return self.snapshot.events

    def header(self, command: str) -> dict[str, Any]:
        """The block every report starts with (issue 6: device, runtime version, package digest, signer)."""
        rep = self.validation
        pkg = self.pkg
        return build_header(
            command,
            started_at=self.started_at,
            device=self.device.kind.value,
            device_options=self.device.describe(),
            versions=self.versions,
            package={
                "path": str(self.path),
                "name": pkg.name if pkg else None,
                "version": pkg.version if pkg else None,
                "kind": pkg.kind if pkg else None,
                "digest": rep.digest if rep is not None else None,  # a refused ValidationReport is falsy
                "signer_key_id": rep.signer_key_id if rep is not None else None,
            },
            validation=None
            if rep is None
            else {
                "ok": rep.ok,
                "failed_rules": list(rep.failed_ids()),
                "warnings": list(dict.fromkeys(c.id for c in rep.warnings)),
            },
        )

    def memory_document(self) -> dict[str, Any]:
        return {
            "before": self.snapshot.memory_before,
            "after": self.snapshot.memory_after,
            "counters_after": self.snapshot.counters,
        }


def _digest(root: Path) -> str | None:
    return package_digest(root)


def _pending(rt: Runtime) -> int | None:
    counters = rt.counters()
    if any(c.pending is None for c in counters):
        return None
    return sum(c.pending or 0 for c in counters)


def _hung(rt: Runtime) -> list[int]:
    try:
        return [h.chip for h in rt.health() if h.health is Health.HUNG]
    except RuntimeLayerError:
        return []


def _memory(rt: Runtime) -> list[dict[str, Any]] | None:
    try:
        return [{"chip": m.chip, "used_bytes": m.used_bytes, "total_bytes": m.total_bytes} for m in rt.memory_usage()]
    except RuntimeLayerError:
        return None


def _counters(rt: Runtime) -> list[dict[str, Any]] | None:
    try:
        return [
            {"chip": c.chip, "pending": c.pending, "finished": c.finished, "failed": c.failed} for c in rt.counters()
        ]
    except RuntimeLayerError:
        return None


def select_aliases(pkg: Package, model: str | None) -> tuple[str, ...]:
    """``--model``: the exact alias (001 §10.4, no fuzzy matching), or every alias. UsageError lists the aliases."""
    if model is None:
        return pkg.aliases
    if model not in pkg.aliases:
        raise UsageError(
            f"--model {model!r}: no model with exactly that alias; the package has: {', '.join(pkg.aliases)}"
        )
    return (model,)


# ---------------------------------------------------------------------------
# The report every runner returns


def finish(
    ctx: RunContext,
    command: str,
    verdict: str,
    body: dict[str, Any],
    error: str | None,
    t0: float,
    *,
    fail_on: frozenset[str] = frozenset(),
) -> Report:
    """Assemble the run's :class:`~calctl.report.Report` once ``ctx`` is closed (the teardown steps are part of
    the log); its exit code is the verdict's (``fail_on``: the run's policy, e.g. ``--require-s2``).

    A PASS with a step that warned is WARN (docs/cli.md "Verdicts": passed, exit 0, every warning named in
    ``warnings``), the word bringup and validate use for the same result.
    """
    warnings = [f"{s.name}: {s.detail}" for s in ctx.log.records if s.status is StepStatus.WARN]
    if verdict == Outcome.PASS.value and warnings:
        verdict = "WARN"
    return Report(
        command=command,
        verdict=verdict,
        header=ctx.header(command),
        steps=ctx.log.records,
        body={
            **body,
            "warnings": warnings,
            "programs": programs_document(ctx.programs),
            "memory": ctx.memory_document(),
        },
        error=error,
        seconds=time.perf_counter() - t0,
        fail_on=fail_on,
        events=ctx.trace_events(),
    )


def reraise_usage(exc: BaseException) -> None:
    """Usage and configuration errors are not run outcomes: let them reach the CLI as exit 2."""
    if isinstance(exc, CalctlError) and exc.exit_code == ExitCode.USAGE:
        raise exc


__all__ = [
    "MOCK_LABEL",
    "CalbinRefused",
    "DeviceSpec",
    "Outcome",
    "ProgramDigest",
    "Report",
    "RunContext",
    "StepLog",
    "StepNote",
    "StepRecord",
    "StepStatus",
    "error_text",
    "finish",
    "outcome_of",
    "program_digests",
    "programs_document",
    "reraise_usage",
    "select_aliases",
    "trace_slices",
    "write_trace_outputs",
]
