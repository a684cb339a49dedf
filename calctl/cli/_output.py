"""Rendering: tables for people, JSON/JUnit for machines. One renderer each.

JSON and JUnit go to stdout; logs, progress and error lines go to stderr, so a
``--format json`` run can be piped straight into ``jq``.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

from calctl.records import dumps


def _width(stream: TextIO) -> int | None:
    # Logs and CI captures are not terminals: do not truncate tables to 80 columns there.
    return None if stream.isatty() else 200


stdout = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
stderr = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))


class Format(str, enum.Enum):
    table = "table"
    json = "json"
    junit = "junit"


def emit_json(document: dict[str, Any]) -> None:
    """Print one JSON document to stdout with ``schema_version`` first."""
    sys.stdout.write(dumps(document) + "\n")
    sys.stdout.flush()


def make_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    return table


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    stdout.print(make_table(title, columns, rows))


def info(message: str) -> None:
    """A log line for people: stderr, never mixed into machine output."""
    stderr.print(message)


VERDICT_STYLE = {
    "PASS": "bold green",
    "GO": "bold green",
    "OK": "bold green",
    "S2": "bold green",
    "WARN": "bold yellow",
    "S1": "bold yellow",
    "SKIP": "yellow",
    "FAIL": "bold red",
    "NO-GO": "bold red",
    "ERROR": "bold red",
}


def styled_verdict(verdict: str) -> str:
    style = VERDICT_STYLE.get(verdict.upper())
    return f"[{style}]{verdict}[/]" if style else verdict
