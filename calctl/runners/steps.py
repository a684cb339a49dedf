"""How a runner's steps and runs end: :class:`RunOutcome`, the exception each stands for, and the step log.

:class:`StepLog` records named steps with status, duration and detail (the PoC's "each step logged with
its status"); :func:`outcome_of` is the one mapping of an exception to an outcome (a usage error is not
one: :func:`reraise_usage`). The status words and the exit codes are :mod:`calctl.report`'s.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from calctl.errors import CalctlError, ExitCode, StepTimeout, UsageError, interrupt_reason
from calctl.report import StepRecord, StepStatus, exit_code_of


class RunOutcome(str, enum.Enum):
    """How a runner ended. ``exit_code`` is the documented process exit code (docs/cli.md)."""

    PASS = "PASS"
    FAIL = "FAIL"  # it ran and the thing checked is wrong (or the package was refused)
    TIMEOUT = "TIMEOUT"  # a step hung past its deadline
    ERROR = "ERROR"  # the device or runtime failed
    INTERRUPTED = "INTERRUPTED"  # SIGINT (Ctrl-C) or SIGTERM

    @property
    def exit_code(self) -> int:
        return exit_code_of(self.value)


def outcome_of(exc: BaseException) -> RunOutcome:
    """The outcome an exception stands for. A usage error at the start of a run is not one (the CLI refuses the
    call with exit 2); one raised by a step once the run is under way is ERROR, so the run keeps its evidence."""
    if isinstance(exc, KeyboardInterrupt):
        return RunOutcome.INTERRUPTED
    if isinstance(exc, StepTimeout):
        return RunOutcome.TIMEOUT
    if isinstance(exc, CalctlError) and exc.exit_code == ExitCode.FAILED:
        return RunOutcome.FAIL
    return RunOutcome.ERROR


def error_text(exc: BaseException) -> str:
    """What a report says about the exception that ended a step or a run (``interrupted (SIGTERM)`` for a signal)."""
    if isinstance(exc, KeyboardInterrupt):
        return interrupt_reason(exc)
    return str(exc) or type(exc).__name__


_STATUS_OF_OUTCOME = {
    RunOutcome.FAIL: StepStatus.FAIL,
    RunOutcome.TIMEOUT: StepStatus.TIMEOUT,
    RunOutcome.ERROR: StepStatus.ERROR,
    RunOutcome.INTERRUPTED: StepStatus.INTERRUPTED,
    RunOutcome.PASS: StepStatus.PASS,
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

    def step(self, name: str) -> _Timed:
        """``with log.step(name) as note:``: time the body; record its status (from an exception, or the note) and
        let anything raised go on."""
        return _Timed(self, name)


class _Timed:
    """One logged step while it runs (:meth:`StepLog.step`): its exit sees every exception and re-raises it."""

    def __init__(self, log: StepLog, name: str) -> None:
        self.log, self.name, self.note = log, name, StepNote()
        self.t0 = time.perf_counter()

    def __enter__(self) -> StepNote:
        self.t0 = time.perf_counter()
        return self.note

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        seconds = time.perf_counter() - self.t0
        if exc is None:
            self.log.add(self.name, self.note.status, seconds, self.note.detail)
        elif isinstance(exc, UsageError):
            self.log.add(self.name, StepStatus.ERROR, seconds, _detail(self.note, exc))
        else:
            self.log.add(self.name, _STATUS_OF_OUTCOME[outcome_of(exc)], seconds, _detail(self.note, exc))


def _detail(note: StepNote, exc: BaseException) -> str:
    what = error_text(exc)
    return f"{note.detail}; {what}" if note.detail else what


def reraise_usage(exc: BaseException) -> None:
    """Usage and configuration errors are not run outcomes: let them reach the CLI as exit 2."""
    if isinstance(exc, CalctlError) and exc.exit_code == ExitCode.USAGE:
        raise exc


__all__ = [
    "RunOutcome",
    "StepLog",
    "StepNote",
    "StepRecord",
    "StepStatus",
    "error_text",
    "outcome_of",
    "reraise_usage",
]
