"""Rendering: tables for people, JSON/JUnit for machines. One renderer each.

JSON and JUnit go to stdout; logs, progress and error lines go to stderr, so a
``--format json`` run can be piped straight into ``jq``. The one verdict
vocabulary (docs/cli.md "Verdicts") is styled here. Nothing here decides a
verdict or knows what a command does.
"""

from __future__ import annotations

import enum
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console
from rich.padding import Padding
from rich.segment import Segment
from rich.table import Table

from calctl import textsafe
from calctl.errors import ExitCode
from calctl.records import dumps
from calctl.report import VERDICTS, Report, Tone, tone_of

#: Tables are laid out for this many columns when stdout is not a terminal (logs, CI captures) and
#: ``COLUMNS`` does not say otherwise; a terminal gets its own width. Wide columns wrap inside their cell.
LOG_WIDTH = 100


def _width(stream: TextIO) -> int | None:
    """``COLUMNS`` when set (piped output included, as ``ls`` and ``git`` do), else the terminal's, else LOG_WIDTH."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isascii() and columns.isdigit() and 20 <= int(columns) <= 1000:  # not "٣٠" (Arabic-Indic 30)
        return int(columns)
    return None if stream.isatty() else LOG_WIDTH


class SafeConsole(Console):
    """A rich Console through which no input text acts on the terminal (calctl.textsafe).

    Every string is made terminal-safe before rich lays it out (control characters and surrogates escaped), a
    string whose markup does not parse is printed as text instead of raising ``MarkupError``, and, as the last
    guard, no segment of text reaches the stream with a control character (rich's own styling and cursor
    control are not text segments). Callers still escape package strings with ``textsafe.markup``.
    """

    def render_str(self, text: str, **kwargs: Any) -> Any:
        from rich.errors import MarkupError

        text = textsafe.plain(text, multiline=True)
        try:
            return super().render_str(text, **kwargs)
        except MarkupError:
            return super().render_str(text, **{**kwargs, "markup": False, "emoji": False})

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        safe = (
            seg
            if seg.control or textsafe.is_safe(seg.text, multiline=True)
            else Segment(textsafe.plain(seg.text, multiline=True), seg.style, seg.control)
            for seg in buffer
        )
        return super()._render_buffer(safe)


def _soft_wrap(stream: TextIO) -> bool:
    """Lines are left whole (soft-wrapped) for a log, a pipe or a file, where a reader greps or copies them; on
    a terminal, which would fold them at its edge inside a word, rich wraps them between words at its width."""
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return True


stdout = SafeConsole(highlight=False, soft_wrap=_soft_wrap(sys.stdout), width=_width(sys.stdout))
stderr = SafeConsole(stderr=True, highlight=False, soft_wrap=_soft_wrap(sys.stderr), width=_width(sys.stderr))


class TableJson(str, enum.Enum):
    """``--format`` of a command that prints a document: a table for people or one JSON document."""

    table = "table"
    json = "json"


class Format(str, enum.Enum):
    """``--format`` of a command that produces test results: also JUnit XML for CI."""

    table = "table"
    json = "json"
    junit = "junit"


def is_json(format: TableJson | Format) -> bool:
    return format.value == "json"


#: Whether this invocation printed its report on stdout (``calctl.cli.app.main`` resets it): a command that
#: ended on an error before it had a report gets one from ``main`` under ``--format json``.
printed: dict[str, bool] = {"report": False}


def emit_json(report: Report) -> None:
    """Print the report's JSON document to stdout (``schema_version`` first, then the header, ``verdict`` and
    ``exit_code``): the one way a command prints JSON, so every ``--format json`` has its verdict and exit code."""
    sys.stdout.write(dumps(report.document()) + "\n")
    sys.stdout.flush()
    printed["report"] = True


def make_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    if any(not c.strip() for c in columns):
        raise ValueError(f"every table column needs a header: {list(columns)}")
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    plain = [[_plain(c) for c in row] for row in cells]
    framed = 3 * len(columns) + 1  # the borders and each cell's padding
    natural, words = _column_widths(columns, plain)
    # A table whose words do not fit inside its frame drops the outer frame and edge padding (4 characters)
    # before any word is shortened.
    tight = sum(words) > stdout.width - framed
    table = Table(title=title, title_justify="left", header_style="bold", show_edge=not tight, pad_edge=not tight)
    room = stdout.width - (framed - 4 if tight else framed)
    for col, width in zip(columns, _fit(natural, words, plain, room), strict=True):
        # Wrap between words, never inside one: a word longer than its column is shortened with an ellipsis.
        table.add_column(col, overflow="ellipsis", width=width)
    for row in cells:
        table.add_row(*row)
    return table


def _plain(cell: str) -> str:
    """The text a cell shows (its markup rendered away), for measuring."""
    from rich.errors import MarkupError
    from rich.text import Text

    try:
        return Text.from_markup(cell).plain
    except MarkupError:
        return cell


def _column_widths(columns: Sequence[str], plain: list[list[str]]) -> tuple[list[int], list[int]]:
    """Each column's natural width (its longest line) and its longest word, header included."""
    natural, words = [], []
    for i, col in enumerate(columns):
        texts = [row[i] for row in plain if i < len(row)] + [col]
        lines = [line for t in texts for line in t.splitlines()] or [""]
        natural.append(max(len(line) for line in lines))
        words.append(max((len(w) for t in texts for w in t.split()), default=1))
    return natural, words


def _fit(natural: list[int], words: list[int], plain: list[list[str]], room: int) -> list[int]:
    """Column widths that fit ``room``. Each column starts at its natural width; then, until the table fits,
    the widest of the columns allowed at that stage gives way: sentences wrap down to their longest word,
    then a sentence's long words are shortened (to 12), then short multi-word cells wrap, and last any word
    is shortened (to 8). Identifiers in short cells are the last thing cut."""
    prose = []
    for i in range(len(natural)):
        column = [row[i] for row in plain if i < len(row)]
        prose.append(sum(len(c.split()) for c in column) > 2 * max(1, len(column)))
    width = list(natural)
    everyone = range(len(width))
    stages = (
        [(i, words[i]) for i in everyone if prose[i]],
        [(i, min(words[i], 12)) for i in everyone if prose[i]],
        [(i, words[i]) for i in everyone],
        [(i, min(words[i], 8)) for i in everyone],
    )
    for floors in stages:
        while sum(width) > room:
            movable = [i for i, floor in floors if width[i] > floor]
            if not movable:
                break
            width[max(movable, key=lambda i: width[i])] -= 1
    return width


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    stdout.print(make_table(title, columns, rows))


def print_rows(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A table when it roughly fits the console; else one block per row (first cell as its heading, then
    ``column: value`` lines), so long cells wrap as sentences instead of being folded mid-word."""
    rows = [list(r) for r in rows]
    plain = [[_plain("" if v is None else str(v)) for v in row] for row in rows]
    natural = sum(_column_widths(columns, plain)[0]) + 3 * len(columns) + 1
    if natural <= 1.5 * stdout.width or not rows:  # a little wrapping inside cells still reads as a table
        stdout.print(make_table(title, columns, rows))
        return
    if title:
        stdout.print(f"[bold]{title}[/]")
    for row in rows:
        stdout.print(f"[bold]{columns[0]} {'' if row[0] is None else row[0]}[/]")
        for name, value in zip(columns[1:], row[1:], strict=False):
            if value not in (None, ""):  # wrapped between words at the console's width, never cropped
                stdout.print(Padding(f"[dim]{name}:[/] {value}", (0, 0, 0, 2)), soft_wrap=False)


def info(message: str) -> None:
    """A log line for people: stderr, never mixed into machine output."""
    stderr.print(message)


def mib(n: int | float | None) -> str:
    """A byte count for people: MiB below 1 GiB, else GiB (``n/a`` when unknown)."""
    if n is None:
        return "n/a"
    if abs(n) >= 1024**3:
        return f"{n / 1024**3:.2f} GiB"
    return f"{n / 1024**2:.1f} MiB"


# ---------------------------------------------------------------------------
# Verdicts: one vocabulary across commands (docs/cli.md "Verdicts").

#: The terminal's style of each tone. Which word has which tone is calctl.report.VERDICTS, the one table the page
#: (calctl.html_report) reads too (#48 item 2).
TONE_STYLE = {Tone.GOOD: "bold green", Tone.WARN: "bold yellow", Tone.BAD: "bold red", Tone.NEUTRAL: "bold"}


def styled_verdict(verdict: str) -> str:
    """The word in its tone's style; a word outside the vocabulary (a table's ``yes``) is printed as it is."""
    if verdict.upper() not in VERDICTS:
        return verdict
    return f"[{TONE_STYLE[tone_of(verdict)]}]{verdict}[/]"


#: Words with no exit code that say the thing was not run or not offered: JUnit's ``skipped`` (never a pass).
_NOT_RUN = frozenset({"SKIP", "UNSUPPORTED"})


def junit_outcome(verdict: str) -> str | None:
    """JUnit's outcome of a step's or a check's word, from its exit code in calctl.report.VERDICTS: a failed check
    (exit 1) ``failure``, any other non-zero code (device error, timeout, interrupt, internal error) ``error``,
    a word that says it did not run ``skipped``, everything else passed (None)."""
    word = VERDICTS.get(verdict)
    if word is None or word.code is None:
        return "skipped" if verdict in _NOT_RUN else None
    if word.code == ExitCode.OK:
        return None
    return "failure" if word.code == ExitCode.FAILED else "error"


def warning_summary(ids: Iterable[str]) -> str:
    """``N warning(s) (ID, ID)``: every warning counted is named."""
    named = list(dict.fromkeys(ids))
    return f"{len(named)} warning(s)" + (f" ({', '.join(named)})" if named else "")


# ---------------------------------------------------------------------------
# JUnit XML: the one renderer (validate and the runners build suites of cases).

# Characters XML 1.0 cannot carry at all, even escaped: replaced by U+FFFD.
_XML_BAD = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(text: object) -> str:
    return _XML_BAD.sub("\ufffd", "" if text is None else str(text))


@dataclass(frozen=True)
class JunitCase:
    """One testcase. ``outcome`` None = passed; else failure | error | skipped with its message."""

    name: str
    classname: str
    seconds: float | None = None
    outcome: str | None = None
    message: str = ""
    kind: str = ""  # the failure/error ``type`` attribute
    text: str = ""  # body of the failure/error element
    output: str = ""  # system-out
    #: A passed case with something to look at (a WARN step or rule). JUnit has no such outcome, so it is said
    #: where CI shows it: first in system-out (``WARN: ...``) and in the suite's ``warnings`` property; a
    #: passed case alone hid it (#53 item 10).
    warning: str = ""


@dataclass(frozen=True)
class JunitSuite:
    name: str
    cases: Sequence[JunitCase]
    properties: Sequence[tuple[str, str]] = field(default_factory=tuple)


def junit_xml(name: str, suites: Sequence[JunitSuite]) -> str:
    """JUnit XML (the Jenkins/GitLab schema) of ``suites``; every string is made XML-safe first."""
    root = ET.Element("testsuites", name=xml_safe(name))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for s in suites:
        suite = ET.SubElement(root, "testsuite", name=xml_safe(s.name))
        warned = [f"{c.name}: {c.warning}" for c in s.cases if c.warning and c.outcome is None]
        properties = [*s.properties, *([("warnings", f"{len(warned)}: " + "; ".join(warned))] if warned else [])]
        if properties:
            props = ET.SubElement(suite, "properties")
            for key, value in properties:
                ET.SubElement(props, "property", name=xml_safe(key), value=xml_safe(value))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for c in s.cases:
            attrs = {"classname": xml_safe(c.classname), "name": xml_safe(c.name)}
            if c.seconds is not None:
                attrs["time"] = f"{c.seconds:.4f}"
            case = ET.SubElement(suite, "testcase", attrs)
            counts["tests"] += 1
            if c.outcome in ("failure", "error"):
                el = ET.SubElement(case, c.outcome, message=xml_safe(c.message), type=xml_safe(c.kind or c.outcome))
                el.text = xml_safe(c.text or c.message)
                counts["failures" if c.outcome == "failure" else "errors"] += 1
            elif c.outcome == "skipped":
                ET.SubElement(case, "skipped", message=xml_safe(c.message))
                counts["skipped"] += 1
            elif c.outcome is not None:
                raise ValueError(f"JUnit outcome {c.outcome!r}: expected failure, error, skipped or None")
            out = "\n".join(x for x in (f"WARN: {c.warning}" if c.warning else "", c.output) if x)
            if out:
                ET.SubElement(case, "system-out").text = xml_safe(out)
        for k, v in counts.items():
            suite.set(k, str(v))
            totals[k] += v
    for k, v in totals.items():
        root.set(k, str(v))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def emit_junit(name: str, suites: Sequence[JunitSuite]) -> None:
    sys.stdout.write(junit_xml(name, suites))
    sys.stdout.flush()
    printed["report"] = True
