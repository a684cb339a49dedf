"""The calctl Typer application and the one place errors become exit codes.

Commands live in one module per noun; each exposes ``register(app)``. The table
``calctl.cli._commands.COMMANDS`` is explicit so the CLI surface is reviewable
in one place: command name -> the module that registers it and the one line
``calctl --help`` lists for it. A command module is imported only when its command runs (or its
own ``--help`` is asked for), so ``calctl --help`` and ``calctl --version``
import no numpy, matplotlib, FastAPI or tokenizers; a unit test keeps the lines
equal to each command's own docstring. Nothing here knows what a command does.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import os
import re
import sys
import traceback
from typing import Any, ClassVar

import typer
from typer.core import TyperGroup

from calctl import __version__
from calctl.cli import _output
from calctl.cli._commands import COMMANDS as _COMMANDS
from calctl.cli._commands import ROOT_HELP
from calctl.cli._signals import interruptible, signal_deferred, signal_fired
from calctl.errors import CalctlError, ExitCode, interrupt_behind, interrupt_reason

# Explicit registry: module path -> has register(app). Every command they register must be listed in
# calctl.cli._commands.COMMANDS (a unit test checks it); one that is not yet is still found, by importing
# the modules not named there when the command list is needed.
_COMMAND_MODULES: list[str] = [
    "calctl.cli.package_cmds",
    "calctl.cli.import_cmds",
    "calctl.cli.validate_cmds",
    "calctl.cli.budget_cmds",
    "calctl.cli.device_cmds",
    "calctl.cli.runner_cmds",
    "calctl.cli.serve_cmds",
    "calctl.cli.soak_cmds",
    "calctl.cli.bench_cmds",
    "calctl.cli.accept_cmds",
    "calctl.cli.fleet_cmds",
    "calctl.cli.burnin_cmds",
    "calctl.cli.lab_cmds",
]
_EXTRA_MODULES: list[str] = [m for m in _COMMAND_MODULES if m not in {mod for mod, _ in _COMMANDS.values()}]


def _reflow(text: str | None) -> str | None:
    """Join the lines of each paragraph: help text reads as sentences, never broken where the source wrapped."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines() if line.strip()) for p in paragraphs)


def _polish(cmd: Any) -> Any:
    """Reflow the help of a command tree, and show flags without a ``<bool>`` value placeholder."""
    cmd.help = _reflow(cmd.help)
    ctx = typer.Context(cmd, info_name=cmd.name)
    for param in cmd.get_params(ctx):  # includes --help
        if getattr(param, "is_flag", False) and not getattr(param, "count", False):
            param.metavar = ""
            if param.name == "help" and param.default is None:
                # A group's unset --help (``device`` in ``calctl device info --help``) is None, and Typer builds
                # a Pydantic adapter (about 0.1 s of imports) to coerce None; False is a bool and skips that.
                param.default = False
        if getattr(param, "help", None):
            param.help = _reflow(param.help)
    for sub in getattr(cmd, "commands", {}).values():
        _polish(sub)
    return cmd


class _LazyGroup(TyperGroup):
    """The root group: lists commands from ``_COMMANDS`` and imports a command's module only to run it."""

    _loaded: ClassVar[dict[str, Any]] = {}
    _listing: ClassVar[bool] = False

    def list_commands(self, ctx: Any) -> list[str]:
        names = list(_COMMANDS)
        for module in _EXTRA_MODULES:
            names += [n for n in self._module_group(module).commands if n not in names]
        return names

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        entry = _COMMANDS.get(cmd_name)
        if entry is not None and self._listing:
            return typer.core.TyperCommand(name=cmd_name, help=entry[1])
        modules = [entry[0]] if entry is not None else list(_EXTRA_MODULES)
        for module in modules:
            cmd = self._module_group(module).commands.get(cmd_name)
            if cmd is not None:
                return cmd
        return None

    def get_help_option(self, ctx: Any) -> Any:
        """None: :func:`main` answers the root ``--help`` itself, and Typer would build a Pydantic adapter (about
        0.1 s of imports) to coerce an unset root ``--help`` before every sub-command's own ``--help``."""
        return None

    def format_help(self, ctx: Any, formatter: Any) -> None:
        type(self)._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            type(self)._listing = False

    @classmethod
    def _module_group(cls, module: str) -> Any:
        group = cls._loaded.get(module)
        if group is None:
            holder = typer.Typer(rich_markup_mode="rich")
            importlib.import_module(module).register(holder)
            group = _polish(typer.main.get_group(holder))
            cls._loaded[module] = group
        return group


app = typer.Typer(
    name="calctl",
    cls=_LazyGroup,
    help=ROOT_HELP,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)

_state = {"debug": False}


@app.callback()
def _root() -> None:
    """The root group takes no options of its own: ``--debug`` and ``--version`` are read by :func:`main`
    before Typer parses anything, so a sub-command's ``--help`` coerces no value (Typer builds a Pydantic
    adapter, about 0.1 s of imports, for the first option value it coerces)."""


def _root_options(args: list[str]) -> tuple[list[str], bool, bool]:
    """Split the leading root options off ``args``: (the rest, --debug given, --version given)."""
    debug = version = False
    while args and args[0] in ("--debug", "--version"):
        debug = debug or args[0] == "--debug"
        version = version or args[0] == "--version"
        args = args[1:]
    return args, debug, version


def _debug_requested(argv: list[str]) -> bool:
    env = os.environ.get("CALCTL_DEBUG", "").strip().lower()
    return _state["debug"] or "--debug" in argv or env in {"1", "true", "yes", "on"}


def _print_error(cause: str, hint: str | None) -> None:
    _output.stderr.print(f"[bold red]error:[/] {cause}", markup=True, highlight=False)
    if hint:
        _output.stderr.print(f"[dim]hint:[/] {hint}", markup=True, highlight=False)


def root_command() -> Any:
    """The click command of the whole CLI (its root group polished like every sub-command)."""
    return _polish(typer.main.get_command(app))


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point. Returns (and exits with) a documented exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    _state["debug"] = False  # per invocation: in-process callers (tests) run main() many times
    _output.printed["report"] = False
    args, _state["debug"], version = _root_options(args)
    if version:
        typer.echo(f"calctl {__version__}")
        return int(ExitCode.OK)
    if not args or args[0] in ("--help", "-h"):
        from calctl.cli import root_help

        _output.stdout.print(root_help(), markup=False, highlight=False, end="")
        return int(ExitCode.OK if args else ExitCode.USAGE)
    from calctl.cli import _boards

    _boards.ARGV[:] = args  # what a board's child process runs again (--boards)
    command = root_command()
    code, cause = _run_command(command, args)
    if code not in (ExitCode.OK, ExitCode.USAGE) and not _output.printed["report"] and _json_requested(args):
        _print_error_report(command, args, int(code), cause)
    sys.stdout.flush()
    return code


def _run_command(command: Any, args: list[str]) -> tuple[int, str]:
    """Run the command: its exit code, and why it ended early (for the report main prints when the command could
    not). The only place that turns an error into an exit code."""
    try:
        # SIGTERM (timeout, CI, systemd) ends every command like Ctrl-C: exit 130 after its clean-up (an
        # extracted package's temporary tree included), never the interpreter's silent exit 143.
        with interruptible():
            result = command.main(args=args, prog_name="calctl", standalone_mode=False)
            late = signal_deferred()  # a signal deferred while the finished run wrote its report
        return _finished(int(result) if isinstance(result, int) else ExitCode.OK, late)
    except CalctlError as exc:
        if _debug_requested(args):
            traceback.print_exc()
        _print_error(_escape(str(exc)), _escape(exc.hint) if exc.hint else None)
        return int(exc.exit_code), str(exc)
    except typer.Exit as exc:
        return int(exc.exit_code), ""
    except typer.Abort as exc:
        return _aborted(exc, args)
    except typer.TyperException as exc:
        return _usage_error(exc), ""
    except KeyboardInterrupt as exc:
        return _interrupted(exc)
    except BrokenPipeError:
        return ExitCode.OK, ""
    except Exception as exc:  # a calctl bug: say so in one line
        interrupt = interrupt_behind(exc)
        if interrupt is not None:  # an interrupt Python wrapped (a lazy import's class) or a cleanup it broke
            return _interrupted(interrupt)
        if _debug_requested(args):
            traceback.print_exc()
        return _internal_error(f"{type(exc).__name__}: {exc}")


def _interrupted(exc: KeyboardInterrupt) -> tuple[int, str]:
    cause = interrupt_reason(exc)
    _print_error(cause, None)
    return ExitCode.INTERRUPTED, cause


def _finished(code: int, late: str | None) -> tuple[int, str]:
    """The exit code of a command that returned, and the cause when a signal ended it."""
    cause = ""
    fired = signal_fired()
    if code == ExitCode.INTERRUPTED and fired is not None and late is None and not _output.printed["report"]:
        # Typer turns an interrupt that escaped the command into a plain 130: say which signal, once.
        cause = f"interrupted ({fired}{', Ctrl-C' if fired == 'SIGINT' else ''})"
        _print_error(cause, None)
    if late is not None:
        _print_error(f"{late} arrived after the run ended; its report was written whole with its verdict", None)
        code = ExitCode.INTERRUPTED
    return code, cause


def _aborted(exc: typer.Abort, args: list[str]) -> tuple[int, str]:
    """Click turns an EOFError escaping a command into Abort: that is a library's "end of data" (a truncated
    gzip, an empty .npy) that calctl failed to map to a refusal, never a signal (signals arrive as
    KeyboardInterrupt / typer.Exit(130)). Only a signal is an interrupt."""
    eof = exc.__cause__ if isinstance(exc.__cause__, EOFError) else None
    if eof is None:
        _print_error("interrupted", None)
        return ExitCode.INTERRUPTED, ""
    if _debug_requested(args):
        traceback.print_exception(eof)
    return _internal_error(f"EOFError: {eof}")


def _internal_error(what: str) -> tuple[int, str]:
    """Say in one line that calctl has a bug; a bug is not a usage error (exit 2): say so in the code too."""
    cause = f"internal error (a calctl bug): {what}"
    _print_error(_escape(cause), "re-run with --debug for the traceback and report it")
    return ExitCode.INTERNAL, cause


def _usage_error(exc: typer.TyperException) -> int:
    """Usage errors (Typer's public base of its click exceptions): the message names the option; no traceback."""
    if type(exc).__name__ == "NoArgsIsHelpError":
        # Building the exception rendered the help already (Typer's rich help prints as it formats).
        message = exc.format_message()
        if message.strip():
            _output.stdout.print(message, markup=False, highlight=False)
        return ExitCode.USAGE
    usage_ctx = getattr(exc, "ctx", None)  # a usage error carries the context of the command it was for
    if usage_ctx is not None:
        _output.stderr.print(usage_ctx.get_usage(), markup=False, highlight=False)
    _print_error(_escape(exc.format_message()), _usage_hint(exc))
    return ExitCode.USAGE


def _json_requested(args: list[str]) -> bool:
    """``--format json`` (or ``-f json``, ``--format=json``) among the arguments."""
    for i, a in enumerate(args):
        if a in ("--format", "-f") and i + 1 < len(args) and args[i + 1] == "json":
            return True
        if a in ("--format=json", "-fjson"):
            return True
    return False


def _print_error_report(root: Any, args: list[str], code: int, cause: str) -> None:
    """The one JSON document ``--format json`` promises, for a command that ended before it had a report (a
    refused input, an absent device library, a signal): its verdict is the exit code's word, ``error`` the cause.
    A usage error (exit 2) prints none: the command never ran."""
    from calctl.report import Report, build_header, verdict_of_exit_code

    names, group = [], root
    ctx = typer.Context(root, info_name="calctl")
    for a in args:
        try:
            sub = group.get_command(ctx, a) if hasattr(group, "get_command") else None
        except Exception:  # the name only labels the report
            sub = None
        if sub is None:
            break
        names.append(a)
        group, ctx = sub, typer.Context(sub, info_name=a, parent=ctx)
    name = " ".join(names) or "calctl"
    report = Report(name, verdict_of_exit_code(code), build_header(name), error=cause or None)
    with contextlib.suppress(BrokenPipeError):
        _output.emit_json(report)


def _usage_hint(exc: Any) -> str:
    """The hint under a usage error: the closest command names for a mistyped command, else --help."""
    match = re.match(r"No such command '(.+?)'\.", exc.format_message())
    ctx = getattr(exc, "ctx", None)
    if match and ctx is not None:
        group = ctx.command
        names = group.list_commands(ctx) if hasattr(group, "list_commands") else []
        close = difflib.get_close_matches(match.group(1), names, n=3, cutoff=0.6)
        prog = ctx.command_path
        if close and "did you mean" not in exc.format_message().lower():
            return f"did you mean {' or '.join(repr(c) for c in close)}? (`{prog} --help` lists every command)"
        return f"`{prog} --help` lists every command"
    return "run with --help for the options"


def _escape(text: str) -> str:
    """An error or hint for the terminal: markup escaped, control characters and surrogates shown escaped."""
    from calctl import textsafe

    return textsafe.markup(text, multiline=True)


def run() -> None:  # pragma: no cover - used by `python -m calctl`
    sys.exit(main())
