"""The fleet report: the report directories of several boards' runs merged into one table of boards x steps.

:func:`merge_reports` reads each board's report directory (its ``report.json``, read bounded), takes the
board's identity (the ``board.json`` the fan-out writes beside it, else the report's own ``board`` block,
else the directory's name), the package digest, the verdict and the per-step verdicts, adds a row for every
board whose run did not complete (an infrastructure ERROR naming the place or host and why), and writes
``fleet-report.json`` (``calctl-fleet-report/v1``, calctl/schemas) and ``fleet-report.html`` into the output
directory. The fleet's verdict is the worst row's, by the one verdict table (:data:`calctl.report.VERDICTS`),
so its exit code is the worst row's too.

A board whose run did not complete is never a FAIL: a FAIL says the board was measured and found wanting,
an ERROR row with ``infrastructure: true`` says it was not measured at all (a child that died, a host or an
exporter that went away, a report directory that holds no report).

This module runs nothing and opens no device: it reads documents and writes two files.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from calctl import __version__
from calctl.report import VERDICTS, Tone, exit_code_of, tone_of

SCHEMA = "calctl-fleet-report/v1"
FLEET_JSON = "fleet-report.json"
FLEET_HTML = "fleet-report.html"
#: The identity the fan-out writes into each board's directory before its run starts.
BOARD_FILE = "board.json"
#: The report a run leaves in its directory: report.json (every device command under --boards, bringup,
#: accept), soak-report.json (soak's own name).
REPORT_NAMES = ("report.json", "soak-report.json")
#: A report larger than this is not read (bringup's is ~100 KB; accept's long level a few MB).
MAX_REPORT_BYTES = 64 * 2**20
MAX_BOARD_FILE_BYTES = 64 * 2**10


class InfraError(NamedTuple):
    """A board whose run did not complete: its id, the place or host it was on, and why."""

    board_id: str
    place: str
    reason: str


@dataclass(frozen=True)
class BoardRow:
    """One board of the fleet: who it is, what it ran, its verdict and every step's."""

    board_id: str
    verdict: str
    command: str | None = None
    device: str | None = None  # the device kind: mock | calrt
    device_label: str | None = None  # what produced the result: mock, software model, board, unknown
    library: str | None = None  # the CalRT shim
    selector: str | None = None  # the CALRT_DEVICE value
    seed: int | None = None  # the mock's fault seed
    fault_plan: str | None = None
    place: str | None = None  # the host or lab place the run was on
    package_digest: str | None = None
    package: str | None = None  # name version
    steps: Mapping[str, str] = field(default_factory=dict)  # step -> its verdict word
    report_dir: str | None = None  # relative to the fleet's directory
    page: str | None = None  # the board's own report.html, relative to the fleet's directory
    reason: str = ""  # why the verdict is not a plain pass: the run's error or its first failing step
    infrastructure: bool = False  # the run did not complete: nothing was measured
    seconds: float | None = None

    @property
    def exit_code(self) -> int:
        return exit_code_of(self.verdict)

    def document(self) -> dict[str, Any]:
        return {
            "board_id": self.board_id,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "infrastructure": self.infrastructure,
            "reason": self.reason,
            "command": self.command,
            "device": self.device,
            "device_label": self.device_label,
            "library": self.library,
            "selector": self.selector,
            "seed": self.seed,
            "fault_plan": self.fault_plan,
            "place": self.place,
            "package": self.package,
            "package_digest": self.package_digest,
            "seconds": self.seconds,
            "steps": dict(self.steps),
            "report_dir": self.report_dir,
            "page": self.page,
        }


@dataclass(frozen=True)
class FleetReport:
    """The merged report: its verdict (the worst row's), every board's row, and the files written."""

    verdict: str
    boards: tuple[BoardRow, ...]
    steps: tuple[str, ...]
    out_dir: Path
    command: str | None = None
    started_at: str = ""
    reasons: tuple[str, ...] = ()
    note: str | None = None
    interrupted: str | None = None

    @property
    def exit_code(self) -> int:
        return exit_code_of(self.verdict)

    @property
    def json_path(self) -> Path:
        return self.out_dir / FLEET_JSON

    @property
    def html_path(self) -> Path:
        return self.out_dir / FLEET_HTML

    def document(self) -> dict[str, Any]:
        digests = sorted({b.package_digest for b in self.boards if b.package_digest})
        return {
            "schema": SCHEMA,
            "command": self.command,
            "board_command": _common_command(self.boards),
            "calctl_version": __version__,
            "started_at": self.started_at,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "reasons": list(self.reasons),
            "note": self.note,
            "interrupted": self.interrupted,
            "counts": counts(self.boards),
            "package_digests": digests,
            "step_names": list(self.steps),  # the table's columns (report/v1 keeps "steps" for step objects)
            "boards": [b.document() for b in self.boards],
        }


def counts(boards: Iterable[BoardRow]) -> dict[str, int]:
    out: dict[str, int] = {}
    for b in boards:
        out[b.verdict] = out.get(b.verdict, 0) + 1
    return out


# ---------------------------------------------------------------------------
# The worst verdict, by the one table


def severity(verdict: str) -> int:
    """How bad a final verdict is, for picking the fleet's: a clean pass 0 ... an interrupted run highest.

    From the verdict table alone: its tone (good < neutral < warn < bad), and among the bad ones its exit code
    (a failed check 1 < timeout 4 < device error 3 ranks below an internal error 70 and an interrupt 130:
    a run that was stopped or broke says less about the fleet than one that measured)."""
    word = VERDICTS.get(verdict)
    if word is None or word.code is None:
        return 0
    if word.tone is Tone.BAD:
        return 10 + {1: 0, 4: 1, 3: 2, 70: 3, 130: 4}.get(int(word.code), 2)
    return {Tone.GOOD: 0, Tone.NEUTRAL: 1, Tone.WARN: 2}[word.tone]


def worst(verdicts: Iterable[str]) -> str:
    """The worst of ``verdicts`` (the first of equals: every board GO is GO); PASS for none."""
    out: str | None = None
    for v in verdicts:
        if out is None or severity(v) > severity(out):
            out = v
    return out or "PASS"


# ---------------------------------------------------------------------------
# Reading one board's directory


class ReportUnreadable(Exception):
    """A report directory that cannot be read as a run's report (the row says why)."""


def read_bounded(path: Path, limit: int) -> Any:
    from calctl import jsonsafe

    try:
        st = path.lstat()
    except FileNotFoundError:
        raise ReportUnreadable(f"{path}: no such file") from None
    except OSError as exc:
        raise ReportUnreadable(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ReportUnreadable(f"{path}: not a regular file")
    if st.st_size > limit:
        raise ReportUnreadable(f"{path}: {st.st_size:,} bytes, more than the {limit:,} a report may hold")
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
        return jsonsafe.loads(data)
    except (OSError, ValueError) as exc:
        raise ReportUnreadable(f"{path}: not a JSON document ({exc})") from None


def report_path(report_dir: Path) -> Path | None:
    """The run's report in ``report_dir`` (report.json, else soak-report.json), or None."""
    for name in REPORT_NAMES:
        p = report_dir / name
        if p.is_file():
            return p
    return None


def read_report(report_dir: Path) -> dict[str, Any]:
    """The run's document in ``report_dir`` (bounded: size, nesting, values). ``ReportUnreadable`` with why."""
    path = report_path(report_dir)
    if path is None:
        if not report_dir.is_dir():
            raise ReportUnreadable(f"{report_dir}: not a directory")
        raise ReportUnreadable(f"{report_dir}: no {' or '.join(REPORT_NAMES)} (the run left no report)")
    doc = read_bounded(path, MAX_REPORT_BYTES)
    if not isinstance(doc, dict):
        raise ReportUnreadable(f"{path}: not a report (a JSON object expected)")
    if not isinstance(doc.get("verdict"), str) or doc["verdict"] not in VERDICTS:
        raise ReportUnreadable(f"{path}: verdict {doc.get('verdict')!r} is not a verdict of docs/cli.md")
    if VERDICTS[doc["verdict"]].code is None:  # a checkpoint (RUNNING) or a step's word: the run did not end
        raise ReportUnreadable(f"{path}: verdict {doc['verdict']!r} is not a run's final verdict (docs/cli.md)")
    return doc


def read_board_file(report_dir: Path) -> dict[str, Any]:
    """The identity the fan-out wrote beside the run (``board.json``), or {} when there is none or it is unreadable."""
    path = report_dir / BOARD_FILE
    if not path.exists():
        return {}
    try:
        doc = read_bounded(path, MAX_BOARD_FILE_BYTES)
    except ReportUnreadable:
        return {}
    return doc if isinstance(doc, dict) else {}


def _text(value: object) -> str | None:
    from calctl.textsafe import clip, plain

    if value is None or value == "":
        return None
    return clip(plain(value))


def _mapping(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = doc.get(key)
    return value if isinstance(value, Mapping) else {}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def step_verdicts(doc: Mapping[str, Any]) -> dict[str, str]:
    """Step -> verdict word of a run: a pipeline's ``summary`` (bringup), else its ``rows`` (accept's G/M rows,
    selftest's rows), else its ``steps`` (check, run-golden): the rows the run's own page shows."""
    for key in ("summary", "rows", "steps"):
        raw = doc.get(key)
        if not isinstance(raw, list):
            continue
        out: dict[str, str] = {}
        for r in raw:
            if not isinstance(r, Mapping):
                continue
            name = _text(r.get("step") or r.get("id") or r.get("name"))
            verdict = _text(r.get("verdict") or r.get("status"))
            if name and verdict and name not in out:
                out[name] = verdict
        if out:
            return out
    return {}


def _first_bad(doc: Mapping[str, Any], steps: Mapping[str, str]) -> str:
    error = _text(doc.get("error"))
    if error:
        return error
    for name, verdict in steps.items():
        if tone_of(verdict) is Tone.BAD:
            return f"{name} {verdict}"
    for name, verdict in steps.items():
        if tone_of(verdict) is Tone.WARN:
            return f"{name} {verdict}"
    return ""


def _relative(path: Path, out_dir: Path) -> str:
    try:
        return Path(os.path.relpath(path.resolve(), out_dir.resolve())).as_posix()
    except (OSError, ValueError):
        return path.as_posix()


def board_row(report_dir: Path, out_dir: Path) -> BoardRow:
    """The row of one board's report directory (an infrastructure ERROR row when it holds no readable report)."""
    ident = read_board_file(report_dir)
    link = _relative(report_dir, out_dir)
    board_id = _text(ident.get("id")) or report_dir.name
    place = _text(ident.get("place") or ident.get("host"))
    try:
        doc = read_report(report_dir)
    except ReportUnreadable as exc:
        return _incomplete_row(board_id, ident, place, link, f"the run did not complete: {exc}")
    own, options, pkg = (_mapping(doc, k) for k in ("board", "device_options", "package"))
    steps = step_verdicts(doc)
    page = report_path(report_dir)
    html = page.with_suffix(".html") if page is not None else None
    seed = _int(ident.get("seed"))
    if seed is None:
        seed = _int(own.get("seed")) if own else _int(options.get("seed"))
    verdict = str(doc["verdict"])
    name = " ".join(str(pkg[k]) for k in ("name", "version") if pkg.get(k))
    return BoardRow(
        _text(ident.get("id")) or _text(own.get("id")) or report_dir.name,
        verdict,
        command=_text(doc.get("command")),
        device=_text(doc.get("device")) or _text(ident.get("kind")),
        device_label=_text(doc.get("device_label")),
        library=_text(options.get("calrt_lib")) or _text(ident.get("library")),
        selector=_text(ident.get("device")) or _text(own.get("selector")),
        seed=seed,
        fault_plan=_text(options.get("fault_plan")) or _text(ident.get("fault_plan")),
        place=place,
        package_digest=_text(pkg.get("digest")),
        package=_text(name),
        steps=steps,
        report_dir=link,
        page=_relative(html, out_dir) if html is not None and html.is_file() else None,
        reason="" if severity(verdict) == 0 else _first_bad(doc, steps),
        seconds=float(doc["seconds"]) if isinstance(doc.get("seconds"), (int, float)) else None,
    )


def infra_row(error: InfraError | Sequence[str], out_dir: Path, report_dir: Path | None = None) -> BoardRow:
    """The ERROR row of a board whose run did not complete (``error``: board id, place or host, reason)."""
    board_id, place, reason = (str(x) for x in error)
    ident = read_board_file(report_dir) if report_dir is not None else {}
    return _incomplete_row(
        board_id,
        ident,
        _text(place),
        _relative(report_dir, out_dir) if report_dir is not None and report_dir.exists() else None,
        f"the run did not complete on {place}: {reason}" if place else f"the run did not complete: {reason}",
    )


def _incomplete_row(
    board_id: str, ident: dict[str, Any], place: str | None, report_dir: str | None, reason: str
) -> BoardRow:
    """The infrastructure ERROR row of a board whose run left no report: who the board file says it is, and why."""
    return BoardRow(
        board_id,
        "ERROR",
        device=_text(ident.get("kind")),
        library=_text(ident.get("library")),
        selector=_text(ident.get("device")),
        seed=_int(ident.get("seed")),
        fault_plan=_text(ident.get("fault_plan")),
        place=place,
        report_dir=report_dir,
        reason=reason,
        infrastructure=True,
    )


# ---------------------------------------------------------------------------
# Merging


MOCK_FLEET_NOTE = (
    "MOCK RESULT for {boards}: produced on simulated mock boards, not on Calculet boards; "
    "not evidence about a board's hardware (docs/runtime.md §5)"
)
MODEL_FLEET_NOTE = (
    "SOFTWARE MODEL RESULT for {boards}: produced on the reference board, a software model with no hardware "
    "(docs/runtime.md §7)"
)


def _order(rows: Sequence[BoardRow]) -> list[BoardRow]:
    """Every failing board first (worst first), then the rest, each group in the given order."""
    return sorted(rows, key=lambda r: -severity(r.verdict))


def merge_reports(
    report_dirs: Iterable[Path | str],
    out_dir: Path | str,
    *,
    infra_errors: Iterable[InfraError | Sequence[str]] = (),
    command: str | None = None,
    interrupted: str | None = None,
    write: bool = True,
) -> FleetReport:
    """Merge the report directories of several boards' runs into one fleet report, written into ``out_dir``.

    ``command``: what made the fleet report (``device check`` for ``--boards``, ``lab run``; default
    ``report merge``); the boards' own command is the document's ``board_command``.
    ``report_dirs``: one directory per board (its ``report.json``; a directory without a readable report is an
    infrastructure ERROR row). ``infra_errors``: (board id, place or host, reason) of boards whose run did not
    complete (a child that could not start, an exporter that went away); a board named there replaces its
    directory's row. ``interrupted``: the signal that stopped the fan-out (the fleet is INTERRUPTED and says so).
    Writes ``fleet-report.json`` and ``fleet-report.html`` (``write``) and returns the report.
    """
    out = Path(out_dir)
    dirs = [Path(d) for d in report_dirs]
    errors = [tuple(str(x) for x in e) for e in infra_errors]
    for e in errors:
        if len(e) != 3:
            raise ValueError(f"infra_errors: {e!r} is not (board_id, place, reason)")
    by_dir = {d: board_row(d, out) for d in dirs}
    named = {e[0] for e in errors}
    rows = [r for r in by_dir.values() if r.board_id not in named]
    dir_of = {r.board_id: d for d, r in by_dir.items()}
    rows += [infra_row(e, out, dir_of.get(e[0])) for e in errors]
    if not rows:
        raise ValueError("merge_reports: no report directory and no infrastructure error to merge")
    seen: dict[str, int] = {}
    for r in rows:
        seen[r.board_id] = seen.get(r.board_id, 0) + 1
    twice = sorted(b for b, n in seen.items() if n > 1)
    steps: list[str] = []
    for r in rows:
        steps.extend(s for s in r.steps if s not in steps)
    verdict = "INTERRUPTED" if interrupted else worst(r.verdict for r in rows)
    reasons = [f"{r.board_id} {r.verdict}: {r.reason}" for r in _order(rows) if severity(r.verdict) >= 10]
    if interrupted:
        reasons.insert(
            0, f"interrupted ({interrupted}): the boards' runs were stopped; their partial reports are below"
        )
    if twice:
        reasons.append(f"board id(s) {', '.join(twice)} appear in more than one report directory")
    digests = {r.package_digest for r in rows if r.package_digest}
    if len(digests) > 1:
        reasons.append(f"the boards ran {len(digests)} different packages (package digests differ)")
    report = FleetReport(
        verdict=verdict,
        boards=tuple(_order(rows)),
        steps=tuple(steps),
        out_dir=out,
        command=command or "report merge",
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        reasons=tuple(reasons),
        note=_note(rows),
        interrupted=interrupted,
    )
    if write:
        write_fleet(report)
    return report


def _common_command(rows: Sequence[BoardRow]) -> str | None:
    commands = {r.command for r in rows if r.command}
    return commands.pop() if len(commands) == 1 else None


def _note(rows: Sequence[BoardRow]) -> str | None:
    notes = []
    mock = [r.board_id for r in rows if r.device_label == "mock" or (r.device == "mock" and not r.device_label)]
    model = [r.board_id for r in rows if r.device_label == "software model"]
    if mock:
        notes.append(MOCK_FLEET_NOTE.format(boards=", ".join(mock)))
    if model:
        notes.append(MODEL_FLEET_NOTE.format(boards=", ".join(model)))
    return "; ".join(notes) or None


def write_fleet(report: FleetReport) -> None:
    """``fleet-report.json`` and ``fleet-report.html`` into the report's directory (atomically, each)."""
    from calctl.fleet import page
    from calctl.records import write_atomic, write_json

    report.out_dir.mkdir(parents=True, exist_ok=True)
    document = report.document()
    write_json(report.json_path, document)
    write_atomic(report.html_path, page.render(document))


__all__ = [
    "FLEET_HTML",
    "FLEET_JSON",
    "SCHEMA",
    "BoardRow",
    "FleetReport",
    "InfraError",
    "board_row",
    "merge_reports",
    "severity",
    "step_verdicts",
    "worst",
]
