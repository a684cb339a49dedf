"""The calctl command line. ``main`` is the console-script entry point.

``calctl --version`` and the top-level ``calctl --help`` are answered here from
:mod:`calctl.cli._commands`, before Typer (about 0.1 s of imports on its own)
is loaded; everything else, a command's own ``--help`` included, goes to
:func:`calctl.cli.app.main`.
"""

from __future__ import annotations

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


def run() -> None:  # pragma: no cover - `python -m calctl` and the console script
    sys.exit(main())
