"""Shared ``Annotated`` options, so every command spells them the same way.

``FormatOpt`` (table | json) is what a command that prints a document takes;
``ResultFormatOpt`` (table | json | junit) only the commands whose output is a
list of test results (``validate`` and the device runners), so each format is
offered exactly where it works. Nothing here does any work.

Every number option is declared with :func:`float_option` or :func:`int_option`: their parser reads the
option's text itself (ASCII decimal only: no ``inf``/``nan``, no ``1e309`` that overflows to infinity, no
``1_000``, ``0x10`` or non-ASCII digits) and checks the range, so a bad value is a usage error (exit 2)
naming the option and the value. A unit test walks the whole command tree and fails on a number option
declared any other way.
"""

from __future__ import annotations

import enum
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from calctl.cli._output import Format, TableJson


def _refuse(message: str) -> Exception:
    """The error a parser raises: Typer (>= 0.16) runs parsers as Pydantic validators and reports a
    ``PydanticCustomError``'s message as it is, under "Invalid value for '--option'"; older Typer (click
    types) reports a ``ValueError`` the same way."""
    if not _TYPER_VALIDATES_WITH_PYDANTIC:  # pragma: no cover - Typer on top of click
        return ValueError(message)
    from pydantic_core import PydanticCustomError

    return PydanticCustomError("calctl_number", message)


def _typer_version() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(p) for p in version("typer").split(".")[:2] if p.isdigit())


# Typer 0.16 began running parsers as Pydantic validators (its public release notes; no private module probed).
_TYPER_VALIDATES_WITH_PYDANTIC = _typer_version() >= (0, 16)


def _bound(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


class NumberParser:
    """The parser of a number option: text (or a declared default) to an ``int`` or a finite ``float`` in range.

    ``minimum``/``maximum`` are inclusive unless ``above``/``below`` make them exclusive."""

    def __init__(
        self,
        kind: type[int] | type[float],
        minimum: float | None = None,
        maximum: float | None = None,
        *,
        above: bool = False,
        below: bool = False,
    ) -> None:
        self.kind = kind
        self.minimum, self.maximum, self.above, self.below = minimum, maximum, above, below

    def expected(self) -> str:
        what = "a decimal integer (digits 0-9, optional sign)" if self.kind is int else "a finite decimal number"
        lo = None if self.minimum is None else f"{'>' if self.above else '>='} {_bound(self.minimum)}"
        hi = None if self.maximum is None else f"{'<' if self.below else '<='} {_bound(self.maximum)}"
        return " ".join([what, " and ".join(b for b in (lo, hi) if b)]).strip()

    def __call__(self, value: object) -> int | float:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise _refuse(f"{value!r} is not a number: expected {self.expected()}")
        if isinstance(value, str):
            from calctl import textsafe

            try:
                number: int | float = (textsafe.decimal_int if self.kind is int else textsafe.decimal_float)(value)
            except ValueError as exc:
                reason = "is not finite: expected" if "finite" in str(exc) else "is not"
                raise _refuse(f"{value!r} {reason} {self.expected()}") from None
        else:
            number = value
        if self.kind is float:
            number = float(number) + 0.0  # -0 is 0
            if not math.isfinite(number):
                raise _refuse(f"{value!r} is not finite: expected {self.expected()}")
        elif not isinstance(number, int):
            raise _refuse(f"{value!r} is not {self.expected()}")
        lo, hi = self.minimum, self.maximum
        if (lo is not None and (number <= lo if self.above else number < lo)) or (
            hi is not None and (number >= hi if self.below else number > hi)
        ):
            raise _refuse(f"{value!r} is out of range: expected {self.expected()}")
        return number


def float_option(
    *decls: str,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    **kwargs: Any,
) -> Any:
    """``typer.Option`` of a float: finite, ASCII decimal, ``min <= x <= max`` (or ``x > above``)."""
    if above is not None:
        if min is not None:
            raise ValueError("float_option: min and above exclude each other")
        parser = NumberParser(float, above, max, above=True)
    else:
        parser = NumberParser(float, min, max)
    return typer.Option(*decls, min=min, max=max, parser=parser, **kwargs)


def int_option(*decls: str, min: int | None = None, max: int | None = None, **kwargs: Any) -> Any:
    """``typer.Option`` of an int: ASCII decimal digits with an optional sign, ``min <= n <= max``."""
    return typer.Option(*decls, min=min, max=max, parser=NumberParser(int, min, max), **kwargs)


class DeviceChoice(str, enum.Enum):
    """``--device``: the values of :class:`calctl.runtime.DeviceKind`, which a command turns it into."""

    mock = "mock"
    calrt = "calrt"


class RunLevel(str, enum.Enum):
    """``--level`` of ``bringup`` and ``accept``: the values of ``calctl.runners.bringup.Level`` (which
    ``calctl.runners.acceptance`` uses too; a unit test keeps them equal), spelled here so that a command's
    ``--help`` imports no runner; the command turns it into the library's own enum."""

    QUICK = "quick"
    STANDARD = "standard"
    LONG = "long"


FormatOpt = Annotated[
    TableJson,
    typer.Option("--format", "-f", help="Output format: table for people, json (one document on stdout) for machines."),
]
ResultFormatOpt = Annotated[
    Format,
    typer.Option(
        "--format",
        "-f",
        help="Output format: table for people, json (one document on stdout), junit (JUnit XML for CI test reports).",
    ),
]

DeviceOpt = Annotated[
    DeviceChoice,
    typer.Option(
        "--device", help="mock (embedded simulated board, default) or calrt (real board via the CalRT C ABI)."
    ),
]
CalrtLibOpt = Annotated[
    Path | None,
    typer.Option(
        "--calrt-lib", envvar="CALRT_LIBRARY", help="Path of the CalRT C-ABI shim library (also CALRT_LIBRARY)."
    ),
]
TrustedKeyOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--trusted-key",
        help="Ed25519 public key (PEM) trusted to sign packages; repeatable. A directory of keys comes from "
        "CALCTL_TRUSTED_KEYS.",
    ),
]
AllowUnsignedOpt = Annotated[
    bool,
    typer.Option(
        "--allow-unsigned", help="Accept an unsigned or untrusted package, reported as a warning (never silently)."
    ),
]


def time_scale_opt(default: str = "1") -> Any:
    """``--time-scale`` of a command whose mock default is ``default`` (the words its help shows)."""
    return Annotated[
        float | None,
        float_option(
            "--time-scale",
            above=0.0,
            help=f"Mock only: multiply the simulated job times, a number > 0 (default {default}).",
        ),
    ]


TimeScaleOpt = time_scale_opt()
#: The default --time-scale of each run that sets its own (``with_default_time_scale`` in the runners), as the
#: help words it; a unit test keeps these equal to the runners' constants (help imports no runner).
POC_TIME_SCALE_HELP = "4: simulated jobs of 12-20 ms, well above the mock's host overhead"
BRINGUP_TIME_SCALE_HELP = "4 in the PoC step, 1 in the others"
ACCEPT_TIME_SCALE_HELP = (
    "each step's own: 4 for the PoC and batch, 0.1 for isolation (G2), 5 for fault isolation, 8 for executor "
    "modes, 1 for the others"
)
BENCH_TIME_SCALE_HELP = "per scenario: fault-isolation 5, executor-modes 8, batch 4, isolation 0.1"
FaultPlanOpt = Annotated[
    Path | None,
    typer.Option(
        "--fault-plan",
        help="Mock only: a calctl-fault-plan/v1 YAML of injected faults (docs/runtime.md, fault plans).",
    ),
]
SeedOpt = Annotated[
    int | None,
    int_option(
        "--seed",
        min=0,
        help="Seed of what is random in the run: on the mock it overrides the fault plan's seed; soak and bench "
        "also seed their traffic with it (default 0).",
    ),
]
SerializeChipsOpt = Annotated[
    bool,
    typer.Option("--serialize-chips", help="Mock only: a global runtime lock, so the chips never overlap (S1)."),
]
BoardProfileOpt = Annotated[
    Path | None,
    typer.Option(
        "--board-profile",
        help="The board's profile (YAML, docs/runtime.md §8) the self-test step judges its transfer rows against "
        "(without it they are NOT JUDGED, their figures reported) and the long level's burn-in its telemetry "
        "(without it: the runtime's own limits).",
    ),
]
BurnInMinutesOpt = Annotated[
    float | None,
    float_option(
        "--burn-in-minutes",
        above=0.0,
        help="Minutes of the burn-in step (--level long only; default: the level's, docs/burn-in.md).",
    ),
]
ReportFileOpt = Annotated[
    Path | None, typer.Option("--report", help="Write the JSON report here (on every path, a hang included).")
]
JobsOpt = Annotated[int | None, int_option("--jobs", "-j", min=1, max=256, help="Hashing threads (default: cores).")]


def _report_default(default: str) -> str:
    """``./calctl-reports/soak-<timestamp>`` as words a help column can wrap: a new ``soak-TIMESTAMP`` under it."""
    parent, _, name = default.rpartition("/")
    return f"a new {name.replace('<timestamp>', 'TIMESTAMP')} directory under {parent}" if parent else default


def report_dir_option(default: str, contents: str) -> Any:
    """``--report DIR`` of a command that writes a directory of evidence (soak, bench, bringup)."""
    return typer.Option(
        "--report",
        help=f"Report directory (default: {_report_default(default)}; docs/cli.md, report directories): {contents}.",
    )
