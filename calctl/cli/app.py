"""The calctl Typer application and the one place errors become exit codes.

Commands live in one module per noun; each exposes ``register(app)``. The list
``_COMMAND_MODULES`` below is explicit so the CLI surface is reviewable in one
place. Nothing here knows what a command does.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Annotated, Any

import typer

try:  # Typer >= 0.16 vendors its own click; catch the exceptions it really raises.
    _click_exc: Any = importlib.import_module("typer._click.exceptions")
except ImportError:  # pragma: no cover - older Typer on top of click
    _click_exc = importlib.import_module("click.exceptions")

from calctl import __version__
from calctl.cli import _output
from calctl.errors import CalctlError, ExitCode

app = typer.Typer(
    name="calctl",
    help="Validate, seal and budget calbin packages; run bring-up checks and serve models on a Calculet board "
    "(mock device by default).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)

_state = {"debug": False}

# Explicit registry: module path -> has register(app). Order = order in --help.
_COMMAND_MODULES: list[str] = [
    "calctl.cli.package_cmds",
    "calctl.cli.import_cmds",
    "calctl.cli.validate_cmds",
    "calctl.cli.budget_cmds",
    "calctl.cli.device_cmds",
    "calctl.cli.runner_cmds",
    "calctl.cli.serve_cmds",
    "calctl.cli.soak_bench_cmds",
]


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"calctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", envvar="CALCTL_DEBUG", help="Show tracebacks for errors.")] = False,
    version: Annotated[
        bool | None, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version.")
    ] = None,
) -> None:
    _state["debug"] = _state["debug"] or debug


def _load_commands() -> None:
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(app)


_load_commands()


def _debug_requested(argv: list[str]) -> bool:
    env = os.environ.get("CALCTL_DEBUG", "").strip().lower()
    return _state["debug"] or "--debug" in argv or env in {"1", "true", "yes", "on"}


def _print_error(cause: str, hint: str | None) -> None:
    _output.stderr.print(f"[bold red]error:[/] {cause}", markup=True, highlight=False)
    if hint:
        _output.stderr.print(f"[dim]hint:[/] {hint}", markup=True, highlight=False)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point. Returns (and exits with) a documented exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    _state["debug"] = False  # per invocation: in-process callers (tests) run main() many times
    command = typer.main.get_command(app)
    try:
        result = command.main(args=args, prog_name="calctl", standalone_mode=False)
        code = int(result) if isinstance(result, int) else ExitCode.OK
    except CalctlError as exc:
        if _debug_requested(args):
            traceback.print_exc()
        _print_error(_escape(str(exc)), _escape(exc.hint) if exc.hint else None)
        code = int(exc.exit_code)
    except typer.Exit as exc:
        code = int(exc.exit_code)
    except typer.Abort:
        _print_error("interrupted", None)
        code = ExitCode.INTERRUPTED
    except _click_exc.ClickException as exc:
        # Usage errors: show click's message (names the option) without a traceback.
        if type(exc).__name__ == "NoArgsIsHelpError" and exc.ctx is not None:
            _output.stdout.print(exc.ctx.get_help(), markup=False, highlight=False)
            return int(ExitCode.USAGE)
        if isinstance(exc, _click_exc.UsageError) and exc.ctx is not None:
            _output.stderr.print(exc.ctx.get_usage(), markup=False, highlight=False)
        _print_error(_escape(exc.format_message()), "run with --help for the options")
        code = ExitCode.USAGE
    except KeyboardInterrupt:
        _print_error("interrupted", None)
        code = ExitCode.INTERRUPTED
    except BrokenPipeError:
        code = ExitCode.OK
    except Exception as exc:  # a calctl bug: say so in one line
        if _debug_requested(args):
            traceback.print_exc()
        _print_error(
            _escape(f"internal error (a calctl bug): {type(exc).__name__}: {exc}"),
            "re-run with --debug for the traceback and report it",
        )
        code = ExitCode.USAGE
    sys.stdout.flush()
    return code


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def run() -> None:  # pragma: no cover - used by `python -m calctl`
    sys.exit(main())
