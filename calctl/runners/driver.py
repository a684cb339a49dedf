"""The one run driver: a run is a declared list of :class:`RunStep`; :func:`drive` runs it and returns its report.

A runner says only what is its own: which steps, in which order, what each needs, and how its results read
as a report (:class:`Run`). :func:`drive` owns everything around that, once for every runner:

* opening and closing the device: through :class:`~calctl.runners.context.RunContext` (validate, load,
  configure, and the teardown's drain/reset/release steps) or, for a run without a package, the device alone;
* the in-process serving stack (:class:`~calctl.runners.serving_stack.ServingStack`), started before the first
  step that serves and closed (drain, unload, loop) before the device, on every way out;
* the steps in order, each logged with the common step words (:class:`~calctl.report.StepStatus`); a step whose
  precondition failed is SKIP "because <earlier step> <word>"; a step's skip rule is SKIP with its reason;
* a step's result, kept by name for the steps after it and for the report (:meth:`RunState.result`);
* the end of a run that stopped early: its outcome (FAIL, ERROR, TIMEOUT, INTERRUPTED) from the exception, the
  step it stopped at and the steps that never ran (:class:`Ended`); a usage error is re-raised after the teardown
  (exit 2), and a signal that the garbage collector swallowed still stops the run at the next step;
* the files: :func:`write_outputs` writes report.json, report.html beside it and the pictures (trace, timeline).

This is the only place in the runners that catches :class:`BaseException`: a signal (SIGINT/SIGTERM arrive as
:class:`KeyboardInterrupt`) becomes the INTERRUPTED report, exit 130, with the evidence gathered so far.

Adding a step to a runner is one :class:`RunStep` line in its list and, if new, the body function beside it.
The header every device report starts with is :meth:`RunContext.header` (:func:`calctl.report.build_header`).
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from calctl.errors import CalctlError, raise_dropped_signal
from calctl.report import Report, StepStatus, build_header
from calctl.runners.context import RunContext, finish
from calctl.runners.device import DeviceSpec
from calctl.runners.steps import RunOutcome, StepLog, StepNote, error_text, outcome_of, reraise_usage
from calctl.runtime import Runtime
from calctl.signing.policy import TrustPolicy

if TYPE_CHECKING:  # the serving engine loads only for a run that serves
    from calctl.runners.serving_stack import ServingStack

T = TypeVar("T")

#: A step that ended with one of these words let the steps that need it run.
_DONE = frozenset({StepStatus.PASS, StepStatus.WARN})


@dataclass(frozen=True)
class RunStep:
    """One declared step of a run.

    ``body(session, note)`` does the work; what it returns is the step's result (:meth:`RunState.result`), what it
    sets on ``note`` its detail and status (WARN/FAIL without raising), what it raises ends the run.
    ``needs`` names earlier steps that must have ended PASS or WARN: otherwise this step is SKIP "because
    <name> <word>". ``skip`` returns why the step does not apply to this run (SKIP with that reason), or None.
    ``serving``: the step uses the in-process serving stack (:meth:`RunState.serving`), started before it.
    ``logged=False``: the body logs its own steps (the context's lifecycle, a loop of sub-steps).
    """

    name: str
    body: Callable[[RunState, StepNote], Any]
    needs: tuple[str, ...] = ()
    skip: Callable[[RunState], str | None] | None = None
    serving: bool = False
    logged: bool = True
    logs: tuple[str, ...] | None = None  # the step names it logs, when not its own name (a loop of sub-steps)

    @property
    def names(self) -> tuple[str, ...]:
        return self.logs if self.logs is not None else (self.name,)


class Opening(str, enum.Enum):
    """How :func:`drive` gets the device before the steps."""

    PREPARE = "prepare"  # RunContext: open device, validate, load, create calbin, configure (001 §6.4)
    CONTEXT = "context"  # RunContext entered, nothing opened: a step opens it (device check's own refusal words)
    BARE = "bare"  # the device alone, no package, no logged lifecycle (device selftest)
    NONE = "none"  # no device: each step runs its own (bringup's pipeline of runs)


@dataclass(frozen=True)
class Ended:
    """How the steps ended: PASS when every step ran (the report judges the results), else the outcome of what
    stopped them, the step it stopped at, and the steps that never ran."""

    outcome: RunOutcome = RunOutcome.PASS
    error: str | None = None
    stopped_at: str | None = None
    exc: BaseException | None = field(default=None, compare=False)  # what stopped them
    not_run: tuple[str, ...] = ()

    @property
    def stopped(self) -> bool:
        return self.outcome is not RunOutcome.PASS


@dataclass(frozen=True)
class Run:
    """A run: its command, its device, its steps (or a function of the opened session that declares them, when
    they depend on the package: one step per model) and how its session reads as a report."""

    command: str
    device: DeviceSpec
    steps: Sequence[RunStep] | Callable[[RunState], Sequence[RunStep]]
    report: Callable[[RunState, Ended], Report]
    package: Path | None = None
    trust: TrustPolicy | None = None
    opening: Opening = Opening.PREPARE
    serving_name: str = ""  # the engine loop's thread name (default: the command)
    expect_models: tuple[str, ...] | None = None  # the validation's exact aliases (the PoC's --expect-models)
    #: A run that stopped logs its steps not reached: SKIP "not reached: <last step> ended <word>".
    skip_unreached: bool = False


@dataclass
class RunState:
    """What the steps of one run share: the log, the opened context or device, the results by step name."""

    run: Run
    log: StepLog
    ctx: RunContext | None = None
    results: dict[str, Any] = field(default_factory=dict)
    t0: float = field(default_factory=time.perf_counter)
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    bare_rt: Runtime | None = None
    versions: Any = None  # the device's versions (a bare run: the header's runtime block)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _serving: ServingStack | None = None

    @property
    def rt(self) -> Runtime:
        rt = self.ctx.rt if self.ctx is not None else self.bare_rt
        assert rt is not None, "the device is not open"
        return rt

    def header(self) -> dict[str, Any]:
        """The block the run's report starts with: :meth:`RunContext.header` (device, runtime, package,
        validation), or for a run on the device alone the same block without a package. Both are
        :func:`calctl.report.build_header`'s: a field every report carries is added there."""
        if self.ctx is not None:
            return self.ctx.header(self.run.command)
        return build_header(
            self.run.command,
            started_at=self.started_at,
            device=self.run.device.kind.value,
            device_options=self.run.device.describe(),
            versions=self.versions,
        )

    def hold(self, resource: contextlib.AbstractContextManager[T]) -> T:
        """Enter ``resource`` (job buffers, a loop) for the rest of the run: released before the device."""
        return self._stack.enter_context(resource)

    def result(self, name: str) -> Any:
        """What step ``name`` returned (None when it did not run or returned nothing)."""
        return self.results.get(name)

    def serving(self) -> ServingStack:
        """The run's in-process serving stack over its device, closed before the device."""
        from calctl.runners.serving_stack import ServingStack

        if self._serving is None:
            assert self.run.trust is not None, "a run that serves needs a trust policy"
            self._serving = self._stack.enter_context(
                ServingStack(self.rt, trust=self.run.trust, name=self.run.serving_name or self.run.command)
            )
        return self._serving

    def report(
        self,
        verdict: str,
        body: dict[str, Any],
        *,
        error: str | None,
        reasons: Iterable[str] = (),
        pictures: Mapping[str, str] | None = None,
        logged: bool = True,
        events: bool = False,
    ) -> Report:
        """This run's report: its header, its logged steps (``logged``), its duration and (``events``) the
        device's jobs for the trace writer."""
        return Report(
            command=self.run.command,
            verdict=verdict,
            header=self.header(),
            steps=self.log.records if logged else None,
            body=body,
            reasons=tuple(reasons),
            error=error,
            seconds=time.perf_counter() - self.t0,
            pictures=dict(pictures or {}),
            events=self.ctx.trace_events() if events and self.ctx is not None else (),
        )

    def finish(
        self, verdict: str, body: dict[str, Any], error: str | None, *, fail_on: frozenset[str] = frozenset()
    ) -> Report:
        """The report of a run through :class:`RunContext` (header, steps, programs, memory, telemetry, trace)."""
        assert self.ctx is not None
        return finish(self.ctx, self.run.command, verdict, body, error, self.t0, fail_on=fail_on)


def drive(run: Run, *, log: StepLog | None = None) -> Report:
    """Open the device, run the steps in order, tear down, and return ``run.report`` of what happened."""
    session = RunState(run, log or StepLog())
    declared: list[RunStep] = []
    try:
        with _opened(session):
            declared.extend(run.steps(session) if callable(run.steps) else run.steps)
            with _Unreached(session, declared):
                for step in declared:
                    _one(session, step)
                raise_dropped_signal()  # one that came in the last step
        ended = Ended()
    except BaseException as exc:  # the one place a run's end becomes a report (module docstring)
        reraise_usage(exc)
        if not isinstance(exc, (CalctlError, KeyboardInterrupt)):
            raise  # a calctl bug: the CLI's entry reports INTERNAL ERROR
        ended = _ended(session, declared, exc)
    return run.report(session, ended)


@contextlib.contextmanager
def _opened(session: RunState) -> Iterator[None]:
    run = session.run
    with session._stack:  # the serving stack closes first (entered last), then the context or the device
        if run.opening is Opening.NONE:
            yield
            return
        if run.opening is Opening.BARE:
            session.bare_rt = session._stack.enter_context(run.device.open())
            session.versions = session.bare_rt.versions()
            yield
            return
        assert run.package is not None and run.trust is not None, "a run through RunContext needs a package"
        session.ctx = ctx = RunContext(
            run.package, trust=run.trust, device=run.device, log=session.log, expect_models=run.expect_models
        )
        session._stack.enter_context(ctx)
        if run.opening is Opening.PREPARE:
            ctx.prepare()
        yield


def _one(session: RunState, step: RunStep) -> None:
    raise_dropped_signal()  # the handler's raise was dropped (a GC callback): stop here, as it meant to
    session.results.pop(step.name, None)
    why = _precondition(session, step)
    if why is not None:
        session.log.skip(step.name, why)
        return
    if step.serving:
        session.serving()
    if not step.logged:
        session.results[step.name] = step.body(session, StepNote())
        return
    with session.log.step(step.name) as note:
        session.results[step.name] = step.body(session, note)


class _Unreached:
    """Around the steps of a run that says so (``Run.skip_unreached``): when one raises, every declared step name
    not logged yet is SKIP "not reached: <the last step logged> ended <its word>", before the teardown's steps."""

    def __init__(self, session: RunState, declared: Sequence[RunStep]) -> None:
        self.session, self.declared = session, declared

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        log = self.session.log
        if exc is None or not self.session.run.skip_unreached:
            return
        last = log.records[-1].name if log.records else "start"
        done = {r.name for r in log.records}
        for name in (n for step in self.declared for n in step.names):
            if name not in done:
                log.skip(name, f"not reached: {last} ended {outcome_of(exc).value}")


def _precondition(session: RunState, step: RunStep) -> str | None:
    for need in step.needs:
        status = session.log.status_of(need)
        if status not in _DONE:
            return f"because {need} {'did not run' if status is None else status.value}"
    return step.skip(session) if step.skip is not None else None


def _ended(session: RunState, declared: Sequence[RunStep], exc: BaseException) -> Ended:
    names = [n for s in declared for n in s.names]
    ran = {
        r.name for r in session.log.records if r.status is not StepStatus.SKIP or not r.detail.startswith("not reached")
    }
    stopped_at = next((n for n in reversed(names) if n in ran), None)
    after = names[names.index(stopped_at) + 1 :] if stopped_at is not None else names
    return Ended(
        outcome=outcome_of(exc),
        error=error_text(exc),
        stopped_at=stopped_at,
        exc=exc,
        not_run=tuple(after),
    )


# ---------------------------------------------------------------------------
# The files a run leaves: report.json, report.html, the pictures


def write_outputs(
    report: Report,
    *,
    report_path: Path | None = None,
    trace: Path | None = None,
    plot: Path | None = None,
    title: str | None = None,
) -> Report:
    """Write the run's trace and timeline picture (when asked), then report.json and its page beside it.

    The returned report names the trace files in its body (``trace``), as report.json does."""
    report = report.with_body(trace=write_pictures(report, trace=trace, plot=plot, title=title))
    if report_path is not None:
        write_report(report, report_path)
    return report


def write_pictures(
    report: Report, *, trace: Path | None, plot: Path | None, title: str | None = None
) -> dict[str, str | None]:
    """A device run's per-chip trace (Chrome/Perfetto JSON) and its timeline picture, when asked: the files."""
    from calctl.runners.telemetry import telemetry_points
    from calctl.runners.trace import warm_iterations, write_trace_outputs

    if trace is None and plot is None:
        return {"json": None, "plot": None}
    return write_trace_outputs(
        report.events,
        trace=trace,
        plot=plot,
        device=report.header["device"],
        title=title or f"calctl {report.command}",
        metadata={"package_digest": report.header["package"]["digest"], "command": report.command},
        marks=report.body.get("marks") or (),
        latency=report.command == "warmup",
        latency_iterations=warm_iterations(report),  # the picture's figures are the table's (cold iteration out)
        telemetry=telemetry_points(report.body.get("telemetry")),  # each chip's °C and W beside the work
    )


def write_report(report: Report, path: Path) -> None:
    """report.json at ``path`` and report.html beside it: the one writer of a run's report files."""
    from calctl import html_report
    from calctl.records import write_json

    document = report.document()
    write_json(path, document)
    html_report.write(document, path)


__all__ = [
    "Ended",
    "Opening",
    "Run",
    "RunState",
    "RunStep",
    "drive",
    "write_outputs",
    "write_pictures",
    "write_report",
]
