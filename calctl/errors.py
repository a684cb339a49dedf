"""The one error hierarchy of calctl and the exit codes it maps to.

Every expected failure is a :class:`CalctlError` subclass carrying its exit code
and, where useful, a hint saying what to do about it. The CLI catches them in one
place (``calctl.cli.app.main``) and prints one line of cause plus the hint.

This module does not print anything and knows nothing about the CLI.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Documented process exit codes (docs/cli.md)."""

    OK = 0  # passed
    FAILED = 1  # checked, and the thing checked failed
    USAGE = 2  # usage, input or configuration error
    DEVICE = 3  # device / runtime error
    TIMEOUT = 4  # a step did not finish within its deadline
    INTERNAL = 70  # a calctl bug (sysexits.h EX_SOFTWARE): never the usage code 2
    INTERRUPTED = 130  # Ctrl-C


class CalctlError(Exception):
    """Base of every expected calctl failure."""

    exit_code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(CalctlError):
    """Bad arguments or input the user can fix (exit 2)."""

    exit_code = ExitCode.USAGE


class ConfigError(CalctlError):
    """A configuration file or setting is invalid (exit 2)."""

    exit_code = ExitCode.USAGE


class PackageError(CalctlError):
    """A package was read and is not acceptable (exit 1).

    ``path`` names the file inside (or of) the package, ``field`` a JSON-pointer-like
    location inside it when there is one.
    """

    exit_code = ExitCode.FAILED

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        where = ": ".join(p for p in (path, field) if p)
        super().__init__(f"{where}: {message}" if where else message, hint=hint)
        self.path = path
        self.field = field


class PackageFormatError(PackageError):
    """The package cannot even be parsed (malformed YAML, wrong top-level type, ...)."""


class IntegrityError(PackageError):
    """A hash or signature does not verify."""


class CheckFailed(CalctlError):
    """A check ran to completion and its verdict is FAIL (exit 1)."""

    exit_code = ExitCode.FAILED


class DeviceError(CalctlError):
    """Base of every runtime-layer failure (exit 3).

    ``status`` is the runtime's own status code when there is one (CalRT C ABI,
    docs/calrt-c-abi.md), so a bench log can be matched against vendor logs.
    """

    exit_code = ExitCode.DEVICE
    default_status: int = -1

    def __init__(self, message: str, *, status: int | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = self.default_status if status is None else status


class StepTimeout(CalctlError):
    """A step exceeded its deadline (exit 4)."""

    exit_code = ExitCode.TIMEOUT


class _Signal:
    """The signal a long command's handler caught (``calctl.cli._signals``), kept after its raise."""

    name: str | None = None


def note_signal(name: str | None) -> None:
    """Record (or, with None, forget) the signal the command's handler caught."""
    _Signal.name = name


def signal_unraised() -> str | None:
    """The signal caught, if any, for a loop to raise at its next boundary.

    The handler raises :class:`Interrupted` wherever the main thread is, and where that is a weakref callback or a
    ``__del__`` run by the garbage collector, Python prints "Exception ignored" and drops it: the run would go on to
    the end and exit 0 after a SIGTERM. A pipeline that has not stopped for a signal checks this between its steps."""
    return _Signal.name


def raise_dropped_signal() -> None:
    """Raise :class:`Interrupted` for a signal whose raise was dropped (:func:`signal_unraised`): a loop's boundary."""
    if _Signal.name is not None:
        raise Interrupted(_Signal.name)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived during a long command (exit 130, like Ctrl-C).

    A :class:`KeyboardInterrupt`, so every ``except KeyboardInterrupt`` teardown
    path treats a ``timeout``/CI/systemd SIGTERM exactly like Ctrl-C. Raised by
    the handler of :func:`calctl.cli._signals.interruptible`.
    """

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


def reason_of(exc: CalctlError) -> str:
    """An error as a report says it: a device error keeps its kind, the runtime's word for what failed
    (``BoardLocked: held by pid 7``); any other error is its message alone (``CheckFailed: ...`` showed calctl's
    internal class name to a person, #53 item 7)."""
    return f"{type(exc).__name__}: {exc}" if isinstance(exc, DeviceError) else str(exc)


def interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The interrupt ``exc`` was raised while unwinding from, if any (its ``__context__`` chain, ``exc`` first).

    A cleanup step that fails during the teardown of an interrupt (a stream posting into a loop that is already
    closed) is part of the interrupt, not a new failure: the run still ended INTERRUPTED. So is an interrupt that
    Python wrapped: a signal that lands in a descriptor's ``__set_name__`` while a module defines a class (a lazy
    import) surfaces as ``RuntimeError: Error calling __set_name__ ...`` with the interrupt as its context.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return cur
        seen.add(id(cur))
        cur = cur.__context__
    return None


def interrupt_reason(exc: BaseException) -> str:
    """``interrupted (SIGTERM)``, ``interrupted (SIGINT)``: how an interrupted step or run says why it stopped."""
    name = exc.signal_name if isinstance(exc, Interrupted) else "SIGINT"
    return f"interrupted ({name}{', Ctrl-C' if name == 'SIGINT' else ''})"
