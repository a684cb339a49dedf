"""The calctl command line. ``main`` is the console-script entry point.

``calctl --version`` and the top-level ``calctl --help`` are answered here from
:mod:`calctl.cli._commands`, before Typer (about 0.1 s of imports on its own)
is loaded; everything else, a command's own ``--help`` included, goes to
:func:`calctl.cli.app.main`.
"""

from __future__ import annotations

import contextlib
import sys


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: returns the documented exit code (docs/cli.md)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:
        from calctl import __version__

        sys.stdout.write(f"calctl {__version__}\n")
        return 0
    if args in (["--help"], ["-h"]):
        sys.stdout.write(root_help())
        return 0
    from calctl.cli.app import main as app_main

    return app_main(args)


def root_help(width: int | None = None) -> str:
    """The top-level help: usage, the root options and every command with its one line."""
    import shutil
    import textwrap

    from calctl.cli._commands import COMMANDS, ROOT_HELP, ROOT_OPTIONS

    width = width or min(100, max(60, shutil.get_terminal_size((80, 24)).columns))

    def rows(title: str, items: list[tuple[str, str]]) -> list[str]:
        key = max(len(k) for k, _ in items) + 2
        out = [f"{title}:"]
        for k, text in items:
            lines = textwrap.wrap(text, width - key - 2, break_on_hyphens=False) or [""]
            out.append(f"  {k:<{key}}{lines[0]}")
            out += [f"  {'':<{key}}{line}" for line in lines[1:]]
        return out

    body = [
        "Usage: calctl [OPTIONS] COMMAND [ARGS]...",
        "",
        *textwrap.wrap(ROOT_HELP, width, initial_indent="  ", subsequent_indent="  "),
        "",
        *rows("Options", list(ROOT_OPTIONS)),
        "",
        *rows("Commands", [(name, line) for name, (_, line) in COMMANDS.items()]),
        "",
        *textwrap.wrap("Run `calctl COMMAND --help` for a command's options; docs/cli.md has the conventions.", width),
    ]
    return "\n".join(body) + "\n"


def _interrupted_report(args: list[str], cause: str) -> None:
    """``--format json`` promises one document: the INTERRUPTED one, unless the command printed its own."""
    try:
        from calctl.cli import _output, app

        if app._json_requested(args) and not _output.printed["report"]:
            app._print_error_report(app.root_command(), args, 130, cause)
    except Exception:  # interrupted while importing: the error line on stderr says it
        pass


def run() -> None:  # pragma: no cover - `python -m calctl` and the console script
    """The process: SIGINT and SIGTERM end it with exit 130 at every moment, never the interpreter's silent 143.

    :func:`calctl.cli.app.main` handles them while the command runs (``calctl.cli._signals``) and restores the
    handler it found when it returns. This one is that handler: before the command (imports) a signal stops
    the process, saying so; after it (the report printed, the interpreter flushing and shutting down) the
    signal is recorded and the exit is 130, as for a signal deferred while the report was written."""
    import signal

    from calctl.errors import Interrupted, interrupt_behind, interrupt_reason

    state: dict[str, str | bool] = {"done": False}

    def on_signal(signum: int, frame: object) -> None:
        if "fired" in state:
            return
        state["fired"] = signal.Signals(signum).name
        if not state["done"]:
            raise Interrupted(str(state["fired"]))

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        try:
            code = main()
        except Exception as exc:  # an interrupt Python wrapped while a module defined a class (its imports)
            interrupt = interrupt_behind(exc)
            if interrupt is None:
                raise
            raise interrupt from None
    except KeyboardInterrupt as exc:  # before the command's own handling began, or after it ended
        state["done"] = True
        sys.stderr.write(f"error: {interrupt_reason(exc)}\n")
        code = 130
        _interrupted_report(sys.argv[1:], interrupt_reason(exc))
    state["done"] = True
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
    # The interpreter's shutdown puts the default handlers back (a signal then would be the silent 143), but
    # leaves an ignored signal ignored: the run is over and its exit code decided, so ignore from here on.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    if "fired" in state and code != 130:
        sys.stderr.write(f"error: {state['fired']} arrived after the run ended; its report was written whole\n")
        code = 130
    sys.exit(code)
