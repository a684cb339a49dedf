"""Turning the shared options into run inputs, in one place: --device/--calrt-lib/--time-scale/--fault-plan/--seed
into a DeviceSpec, and --report DIR into a report directory (docs/cli.md, report directories).

:func:`device_options` gives a command the device and trust options as one :class:`DeviceArgs` value, so
the commands that run on a device (run-golden, warmup, poc, bringup, accept, soak, bench, serve) spell them
once; :func:`device_spec` alone serves a command with only --device/--calrt-lib. Nothing here opens a device.
"""

from __future__ import annotations

import functools
import inspect
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, get_type_hints

from calctl.cli._options import (
    AllowUnsignedOpt,
    CalrtLibOpt,
    DeviceChoice,
    DeviceOpt,
    FaultPlanOpt,
    SeedOpt,
    SerializeChipsOpt,
    TimeScaleOpt,
    TrustedKeyOpt,
    time_scale_opt,
)
from calctl.errors import UsageError

if TYPE_CHECKING:
    from calctl.runners.device import DeviceSpec
    from calctl.signing.policy import TrustPolicy


def device_spec(
    device: DeviceChoice,
    calrt_lib: Path | None,
    time_scale: float | None = None,
    fault_plan: Path | None = None,
    seed: int | None = None,
    serialize_chips: bool = False,
) -> DeviceSpec:
    from calctl.runners.device import DeviceSpec
    from calctl.runtime import DeviceKind

    kind = DeviceKind(device.value)
    lib = calrt_lib if kind is DeviceKind.CALRT else None
    if kind is DeviceKind.MOCK and calrt_lib is not None and str(calrt_lib) != os.environ.get("CALRT_LIBRARY"):
        raise UsageError("--calrt-lib applies to --device calrt only")
    check_fault_plan(fault_plan)
    return DeviceSpec(
        kind=kind,
        calrt_lib=lib,
        time_scale=time_scale,
        serialize_chips=serialize_chips,
        fault_plan=fault_plan,
        seed=seed,
    )


def check_fault_plan(fault_plan: Path | None) -> None:
    """A usage error unless ``--fault-plan`` names a regular file (a FIFO or a device is refused, never read)."""

    if fault_plan is None:
        return
    try:
        mode = fault_plan.stat().st_mode
    except OSError:
        raise UsageError(f"--fault-plan {fault_plan}: no such file") from None
    if not stat.S_ISREG(mode):
        from calctl.filekind import kind_phrase

        raise UsageError(f"--fault-plan {fault_plan}: is {kind_phrase(mode)}, not a regular file")


def check_board_profile(board_profile: Path | None) -> None:
    """``--board-profile`` read and checked before a pipeline starts: a bad one is a usage error (exit 2) naming
    the file and field, never a self-test step in ERROR minutes into the run."""
    if board_profile is not None:
        from calctl.runners.selftest import BoardProfile

        BoardProfile.load(board_profile)


def check_burnin_minutes(minutes: float | None, level: str) -> None:
    """``--burn-in-minutes`` at a level that runs no burn-in is a usage error (exit 2), never silently unused."""
    if minutes is None:
        return
    from calctl.runners.board_steps import burnin_skip_reason

    why = burnin_skip_reason(level)
    if why is not None:
        raise UsageError(f"--burn-in-minutes {minutes:g}: {why}; give --level long, or leave the option out")


def report_dir(report: Path | None, command: str) -> Path:
    """``--report DIR``, else the documented default ``$CALCTL_REPORT_DIR`` or ``./calctl-reports``/COMMAND-STAMP."""
    from calctl.records import REPORT_DIR_ENV, default_report_dir

    out = report if report is not None else default_report_dir(command)
    where = f"--report {out}" if report is not None else f"{REPORT_DIR_ENV}={os.environ.get(REPORT_DIR_ENV)}: {out}"
    # A FIFO, /dev/null or a symlink loop there was an internal error when the run made its directory.
    from calctl.filekind import directory_problem, report_directory_problem

    if problem := directory_problem(out) or report_directory_problem(out):
        raise UsageError(f"{where}: {problem}")
    return out


@dataclass(frozen=True)
class DeviceArgs:
    """The device and trust options of a command, as given (``device_options`` fills it; defaults: not given)."""

    device: DeviceChoice = DeviceChoice.mock
    calrt_lib: Path | None = None
    fault_plan: Path | None = None
    time_scale: float | None = None
    seed: int | None = None
    serialize_chips: bool = False
    trusted_key: list[Path] | None = None
    allow_unsigned: bool = False

    def __post_init__(self) -> None:
        check_fault_plan(self.fault_plan)  # every command, serve too (it reads the plan without a DeviceSpec)

    def spec(self) -> DeviceSpec:
        """The :class:`~calctl.runners.device.DeviceSpec` (a usage error names the option that is wrong)."""
        return device_spec(
            self.device, self.calrt_lib, self.time_scale, self.fault_plan, self.seed, self.serialize_chips
        )

    def package(self, pkg: Path | None) -> tuple[Path, TrustPolicy, bool]:
        """(path, trust policy, is the bundled sample) of the PKG argument under --trusted-key/--allow-unsigned."""
        from calctl.cli._package_arg import resolve_package

        return resolve_package(pkg, self.trusted_key, self.allow_unsigned)


R = TypeVar("R")

#: The ``dev`` parameter's default in a command's signature (``device_options`` replaces the parameter).
DEVICE_DEFAULTS = DeviceArgs()

#: The options :func:`device_options` may add, in --help order: name -> its ``Annotated`` type.
DEVICE_OPTIONS: dict[str, Any] = {
    "device": DeviceOpt,
    "calrt_lib": CalrtLibOpt,
    "fault_plan": FaultPlanOpt,
    "time_scale": TimeScaleOpt,
    "seed": SeedOpt,
    "serialize_chips": SerializeChipsOpt,
    "trusted_key": TrustedKeyOpt,
    "allow_unsigned": AllowUnsignedOpt,
}
#: What every device command takes; the others are asked for by name.
BASE_OPTIONS = ("device", "calrt_lib", "trusted_key", "allow_unsigned")


def device_options(*extra: str, time_scale: str = "1") -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Give a command its device and trust options as one ``dev: DeviceArgs`` parameter.

    The command's ``dev`` parameter is replaced, where it stands, by --device, --calrt-lib, --trusted-key and
    --allow-unsigned, plus the ``extra`` ones (``"fault_plan"``, ``"time_scale"``, ``"seed"``,
    ``"serialize_chips"``); ``time_scale`` is the words of the command's default --time-scale in its help."""
    unknown = set(extra) - set(DEVICE_OPTIONS)
    if unknown:
        raise ValueError(f"device_options: unknown option(s) {sorted(unknown)}")
    chosen = {n: a for n, a in DEVICE_OPTIONS.items() if n in BASE_OPTIONS or n in extra}
    if "time_scale" in chosen:
        chosen["time_scale"] = time_scale_opt(time_scale)
    return option_group("dev", DeviceArgs, chosen)


def option_group(
    param: str, group: type[Any], options: Mapping[str, Any]
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Several options arriving as one frozen dataclass value: the command's ``param`` parameter (annotated
    ``group``) is replaced, where it stands, by ``options`` (field name -> its ``Annotated`` type; the default
    is the field's in ``group()``), and the command is called with ``group(**those values)``. Typer reads
    the options from the signature as it reads any other; the fields not in ``options`` keep their defaults."""
    defaults = group()

    def wrap(fn: Callable[..., R]) -> Callable[..., R]:
        sig = inspect.signature(fn)
        hints = get_type_hints(fn, include_extras=True)
        params = list(sig.parameters.values())
        at = [p.name for p in params].index(param)
        added = [
            inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=getattr(defaults, n), annotation=a)
            for n, a in options.items()
        ]
        kept = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in params]
        parameters = [*kept[:at], *added, *kept[at + 1 :]]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> R:
            value = group(**{n: kwargs.pop(n) for n in options})
            return fn(**{param: value}, **kwargs)

        returns = hints.get("return", sig.return_annotation)
        setattr(command, "__signature__", sig.replace(parameters=parameters, return_annotation=returns))  # noqa: B010
        command.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": returns}
        return command

    return wrap
