"""Every row's judge, in the report's order, and the rule applied last: a GO needs its evidence files.

:func:`require_evidence_files` is applied when a report is rendered: a GO
whose evidence files are not all present in the report directory becomes
NOT MEASURED naming the missing file. Nothing is GO on the word of a document.
This module does no I/O except that existence check, runs nothing and prints nothing.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from calctl.runners.acceptance.gates import judge_g0, judge_g1, judge_g2, judge_g3, judge_g4, judge_g5
from calctl.runners.acceptance.milestones import judge_m0, judge_m1, judge_m2, judge_m3, judge_m4
from calctl.runners.acceptance.rows import ROWS, GateDecision, Judge, RowResult, Steps

JUDGES: dict[str, Judge] = {
    "G0": judge_g0,
    "G1": judge_g1,
    "G2": judge_g2,
    "G3": judge_g3,
    "G4": judge_g4,
    "G5": judge_g5,
    "M0": judge_m0,
    "M1": judge_m1,
    "M2": judge_m2,
    "M3": judge_m3,
    "M4": judge_m4,
}


def require_evidence_files(row: RowResult, report_dir: Path) -> RowResult:
    """A GO stays GO only when it names evidence files and every one exists in ``report_dir``."""
    if row.verdict is not GateDecision.GO:
        return row
    if not row.files:
        return replace(
            row,
            verdict=GateDecision.NOT_MEASURED,
            reason="no evidence file was kept for this row",
            how_to_measure="re-run `calctl accept`; a GO needs its evidence in the report directory",
        )
    missing = [p for p in row.files.values() if not _inside(report_dir, p)]
    if missing:
        return replace(
            row,
            verdict=GateDecision.NOT_MEASURED,
            reason=f"evidence file(s) missing from {report_dir}: {', '.join(missing)}",
            how_to_measure="re-run `calctl accept` into a fresh report directory",
        )
    return row


def _inside(report_dir: Path, rel: str) -> bool:
    """``rel`` names a file that exists inside ``report_dir`` (an absolute path or ``..`` leaving it does not)."""
    root = report_dir.resolve()
    target = (report_dir / rel).resolve()
    return target.is_relative_to(root) and target.is_file()


def judge_all(steps: Steps, report_dir: Path) -> tuple[RowResult, ...]:
    """Every row, in order, each judged and then held to its evidence files."""
    return tuple(require_evidence_files(JUDGES[spec.id](steps), report_dir) for spec in ROWS)


__all__ = ["JUDGES", "judge_all", "require_evidence_files"]
