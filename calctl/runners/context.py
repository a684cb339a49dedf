"""Validate, open, configure and tear down one package on one device: :class:`RunContext`.

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
4. ``create calbin`` – and the sha256 of every program the calbin hands the
   runtime (:mod:`calctl.runners.programs`);
5. ``configure`` – exactly once.

Teardown runs on every path, Ctrl-C included (``with RunContext(...)``):
``drain`` (wait for in-flight jobs, else a board reset), ``reset
configuration``, ``release`` (calbin, device, extracted package). Each is a
logged step (:mod:`calctl.runners.steps`), so a report shows that the board was
left clean. :meth:`RunContext.header` is the run's header
(:func:`calctl.report.build_header`) and :func:`finish` its
:class:`~calctl.report.Report`.

What it uses lives beside it: the device spec in :mod:`calctl.runners.device`,
the step log and outcomes in :mod:`calctl.runners.steps`, the program digests in
:mod:`calctl.runners.programs`. A run opens its context through the one driver,
:mod:`calctl.runners.driver`, which also writes its files.
This module does not run models, judge results or render anything.
"""

from __future__ import annotations

import contextlib
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from calctl.budget.device import device_fit
from calctl.closing import Closes
from calctl.errors import CalctlError, CheckFailed, UsageError
from calctl.package.info import package_digest
from calctl.package.model import Package
from calctl.package.reader import load_manifest, package_root
from calctl.package.validate import ValidationPolicy, ValidationReport, validate
from calctl.report import Report, StepStatus, build_header
from calctl.runners.device import DeviceSpec
from calctl.runners.programs import ProgramDigest, program_digests, programs_document
from calctl.runners.steps import (
    RunOutcome,
    StepLog,
    StepNote,
)
from calctl.runners.telemetry import TelemetrySampler, sampler_of
from calctl.runtime import Calbin, Health, Runtime, TraceEvent, Versions
from calctl.runtime.errors import InvalidCalbin, RuntimeLayerError
from calctl.signing.policy import TrustPolicy


class CalbinRefused(CheckFailed):
    """The runtime refused to create a calbin from the package (InvalidCalbin): exit 1, before configure."""


@dataclass
class _Snapshot:
    """What the teardown keeps after the device is gone."""

    events: tuple[TraceEvent, ...] = ()
    memory_before: list[dict[str, Any]] | None = None
    memory_after: list[dict[str, Any]] | None = None
    counters: list[dict[str, Any]] | None = None


class RunContext(Closes):
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
        self.sampler: TelemetrySampler | None = None  # the device's telemetry, sampled through the run
        self.started_at = datetime.now(timezone.utc)
        self._t0_ns = time.monotonic_ns()
        self._stack = ExitStack()
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------

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
            self.sampler = sampler_of(self.rt)
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
                raise CheckFailed(
                    f"{self.path}: the package failed validation ({report.refusal()}); it never reached configure",
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
                if self.sampler is not None:
                    self.sampler.stop()  # a last sample while the device is still open
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

    def telemetry_document(self) -> dict[str, Any]:
        """The run's per-chip telemetry (:mod:`calctl.runners.telemetry`): power, temperature, throttling, ECC."""
        if self.sampler is None:
            return {"note": "telemetry was not sampled on this run", "chips": []}
        self.sampler.stop()
        return self.sampler.document(with_series=True)  # bounded (600 samples): the trace picture draws it

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
    if verdict == RunOutcome.PASS.value and warnings:
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
            "telemetry": ctx.telemetry_document(),
        },
        error=error,
        seconds=time.perf_counter() - t0,
        fail_on=fail_on,
        events=ctx.trace_events(),
    )


__all__ = ["CalbinRefused", "DeviceSpec", "RunContext", "finish", "select_aliases"]
