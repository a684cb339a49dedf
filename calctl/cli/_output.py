"""Rendering: tables for people, JSON/JUnit for machines. One renderer each.

JSON and JUnit go to stdout; logs, progress and error lines go to stderr, so a
``--format json`` run can be piped straight into ``jq``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

#: Version of every JSON document calctl prints. Bump on an incompatible change.
SCHEMA_VERSION = "1"


def _width(stream: TextIO) -> int | None:
    # Logs and CI captures are not terminals: do not truncate tables to 80 columns there.
    return None if stream.isatty() else 200


stdout = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
stderr = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))


class Format(str, enum.Enum):
    table = "table"
    json = "json"
    junit = "junit"


def to_jsonable(obj: Any) -> Any:
    """Convert dataclasses, enums, paths and numpy scalars into plain JSON values.

    Non-finite floats become ``null``: a figure that cannot be measured is absent,
    never a fake number.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj) if isinstance(obj, (set, frozenset)) else obj
        return [to_jsonable(v) for v in items]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        return to_jsonable(obj.item())
    return obj


def dumps(document: dict[str, Any]) -> str:
    body = {"schema_version": SCHEMA_VERSION, **to_jsonable(document)}
    return json.dumps(body, indent=2, sort_keys=False, allow_nan=False)


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
