"""``calctl report compare A B``: two runs' figures side by side, and whether a difference exceeds the runs'
own intervals (docs/report-compare.md).

A figure is what a report measured, matched by its place in the document with list items named by their
step, row, model or graph (so ``step_reports/warmup/models/model-a/graphs/model_a_decode`` on both sides):

* an **interval figure**: an estimate the run carries with its confidence interval (``mean``, ``ci_low``,
  ``ci_high``: the PoC's overlap and efficiency, a warm-up graph's stability, a self-test row's transfer rate);
* a **range figure**: a latency summary (``count``, ``p50``, ``min``, ``max``): its median, with the run's own
  spread from its fastest to its slowest sample as the interval;
* a **plain figure** (``figure_gbps`` and other rates without an interval): shown, with "no interval".

A difference is **beyond the intervals** when the two runs' intervals do not overlap (one lies wholly above
the other, by more than rounding): that is the only thing that makes compare exit 1, and the figure is named.
Figures on the host's clock (``host_*``) are shown and never judged: a busy host is not a slower board.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calctl.errors import UsageError

#: Keys of a plain figure (a number without an interval) that compare shows.
PLAIN_FIGURES = ("figure_gbps",)
#: What names a list item, in order, so lists are matched by name and not by position.
_ITEM_NAMES = ("step", "name", "id", "alias", "graph", "model")
#: Two values closer than this (relative) are the same figure (the reports round to about 1e-12 of it).
_SAME = 1e-9
#: Document parts that repeat a figure found elsewhere (a gate's decision restates its estimate).
_SKIP_KEYS = frozenset({"decisions", "schema_version", "started_at", "calctl_version"})


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    low: float | None = None
    high: float | None = None
    kind: str = "plain"  # ci | range | plain
    clock: str = "device"  # device | host

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None


@dataclass(frozen=True)
class FigureRow:
    name: str
    a: Figure | None
    b: Figure | None

    @property
    def difference(self) -> float | None:
        return self.b.value - self.a.value if self.a is not None and self.b is not None else None

    @property
    def relative(self) -> float | None:
        d = self.difference
        if d is None or self.a is None or self.a.value == 0:
            return None
        return d / abs(self.a.value)

    @property
    def judgement(self) -> str:
        """``beyond`` (the intervals are apart), ``within``, ``no interval``, ``host clock``, ``only in A/B``."""
        a, b = self.a, self.b
        if a is None or b is None:
            return "only in B" if a is None else "only in A"
        if a.clock == "host" or b.clock == "host":
            return "host clock: not judged"
        if not (a.has_interval and b.has_interval):
            return "no interval"
        assert a.low is not None and a.high is not None and b.low is not None and b.high is not None
        scale = max(abs(a.value), abs(b.value), 1e-30)
        gap = max(b.low - a.high, a.low - b.high)
        return "beyond" if gap > _SAME * scale else "within"

    def document(self) -> dict[str, Any]:
        def side(f: Figure | None) -> dict[str, Any] | None:
            if f is None:
                return None
            return {"value": f.value, "low": f.low, "high": f.high, "interval": f.kind, "clock": f.clock}

        return {
            "figure": self.name,
            "a": side(self.a),
            "b": side(self.b),
            "difference": self.difference,
            "relative": self.relative,
            "judgement": self.judgement,
            "beyond_interval": self.judgement == "beyond",
        }


@dataclass(frozen=True)
class ReportComparison:
    a: str
    b: str
    a_doc: Mapping[str, Any]
    b_doc: Mapping[str, Any]
    rows: tuple[FigureRow, ...]
    notes: tuple[str, ...]

    @property
    def beyond(self) -> list[FigureRow]:
        return [r for r in self.rows if r.judgement == "beyond"]

    @property
    def exit_code(self) -> int:
        return 1 if self.beyond else 0

    @property
    def verdict(self) -> str:
        return "FAIL" if self.beyond else "PASS"

    def document(self) -> dict[str, Any]:
        def who(doc: Mapping[str, Any], path: str) -> dict[str, Any]:
            pkg = doc.get("package") if isinstance(doc.get("package"), Mapping) else {}
            board = doc.get("board") if isinstance(doc.get("board"), Mapping) else {}
            return {
                "report": path,
                "command": doc.get("command"),
                "verdict": doc.get("verdict"),
                "device": doc.get("device"),
                "device_label": doc.get("device_label"),
                "board": board.get("id") if board else None,
                "package_digest": pkg.get("digest") if pkg else None,
                "started_at": doc.get("started_at"),
            }

        return {
            "a": who(self.a_doc, self.a),
            "b": who(self.b_doc, self.b),
            "beyond_interval": [r.name for r in self.beyond],
            "notes": list(self.notes),
            "figures": [r.document() for r in self.rows],
        }


# ---------------------------------------------------------------------------
# Reading


def load(path: Path, label: str) -> dict[str, Any]:
    """The report at ``path`` (a report.json, or a report directory). UsageError (exit 2) naming why not."""
    from calctl.fleet.merge import MAX_REPORT_BYTES, ReportUnreadable, read_bounded, report_path

    file = report_path(path) if path.is_dir() else path
    if file is None:
        raise UsageError(f"{label} {path}: a directory without report.json or soak-report.json")
    try:
        doc = read_bounded(file, MAX_REPORT_BYTES)
    except ReportUnreadable as exc:
        raise UsageError(f"{label}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("verdict"), str):
        raise UsageError(f"{label} {file}: not a calctl report (a JSON object with a verdict expected)")
    return doc


def _digest(doc: Mapping[str, Any]) -> str | None:
    pkg = doc.get("package")
    return str(pkg["digest"]) if isinstance(pkg, Mapping) and pkg.get("digest") else None


def _number(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(float(x)) else None


def _item_name(item: object, index: int) -> str:
    if isinstance(item, Mapping):
        for key in _ITEM_NAMES:
            v = item.get(key)
            if isinstance(v, str) and v:
                return v
    return str(index)


def figures(doc: Mapping[str, Any]) -> Iterator[Figure]:
    """Every figure of a report document (see the module's docstring), in document order."""
    yield from _walk(doc, "", "device")


def _walk(node: object, path: str, clock: str) -> Iterator[Figure]:
    if isinstance(node, Mapping):
        fig = _as_figure(node, path, clock)
        if fig is not None:
            yield fig
            return
        for key, value in node.items():
            k = str(key)
            if k in _SKIP_KEYS:
                continue
            here = f"{path}/{k}" if path else k
            if k in PLAIN_FIGURES and (n := _number(value)) is not None:
                interval = node.get("interval")
                yield _plain_or_interval(here, n, interval, clock)
                continue
            if k == "interval":
                continue  # a figure's own interval, read with the figure
            yield from _walk(value, here, "host" if k.startswith("host") else clock)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            name = _item_name(item, i)
            yield from _walk(item, f"{path}/{name}", "host" if name.startswith("host") else clock)


def _as_figure(node: Mapping[str, Any], path: str, clock: str) -> Figure | None:
    mean, low, high = (_number(node.get(k)) for k in ("mean", "ci_low", "ci_high"))
    if mean is not None and low is not None and high is not None and "limit" not in node:
        return Figure(path, mean, low, high, "ci", clock)
    count, p50, lo, hi = (_number(node.get(k)) for k in ("count", "p50", "min", "max"))
    if count and p50 is not None and lo is not None and hi is not None:
        return Figure(path, p50, lo, hi, "range", clock)
    return None


def _plain_or_interval(path: str, value: float, interval: object, clock: str) -> Figure:
    if isinstance(interval, Mapping):
        low, high = _number(interval.get("ci_low")), _number(interval.get("ci_high"))
        if low is not None and high is not None:
            return Figure(path, value, low, high, "ci", clock)
    return Figure(path, value, clock=clock)


# ---------------------------------------------------------------------------
# Comparing


def compare(a_path: Path, b_path: Path, *, allow_different_package: bool = False) -> ReportComparison:
    """Compare the reports at ``a_path`` and ``b_path``. UsageError (exit 2): unreadable input, or two different
    packages without ``allow_different_package``."""
    a, b = load(a_path, "A"), load(b_path, "B")
    notes: list[str] = []
    da, db = _digest(a), _digest(b)
    if da != db:
        what = f"A ran package {da or 'none'}, B ran {db or 'none'}"
        if not allow_different_package:
            raise UsageError(
                f"different packages: {what}; compare only with --allow-different-package (the figures then "
                "differ by the package as well as by the board)"
            )
        notes.append(f"different packages ({what}): a difference may be the package's")
    if a.get("command") != b.get("command"):
        notes.append(f"different commands: A is {a.get('command')!r}, B is {b.get('command')!r}")
    for side, doc in (("A", a), ("B", b)):
        if doc.get("device_label") in ("mock", "software model"):
            notes.append(f"{side} is a {doc['device_label']} result, not evidence about a board (docs/runtime.md §5)")
    fa = {f.name: f for f in figures(a)}
    fb = {f.name: f for f in figures(b)}
    names = list(fa) + [n for n in fb if n not in fa]
    rows = tuple(FigureRow(n, fa.get(n), fb.get(n)) for n in names)
    if not rows:
        notes.append("neither report carries a figure compare knows (an interval, a latency summary or a rate)")
    return ReportComparison(str(a_path), str(b_path), a, b, rows, tuple(notes))


__all__ = ["Figure", "FigureRow", "ReportComparison", "compare", "figures", "load"]
