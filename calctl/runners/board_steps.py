"""The board's own first steps of ``bringup`` and ``accept``: the readiness check, then the self-test.

A pipeline about the model is worth nothing on a board that is not ready (the level-1 gate a scheduler runs
first, as ``dcgmi diag -r 1`` does), so ``bringup`` and ``accept`` begin with what ``calctl device check`` and
``calctl device selftest`` measure (issue 51 item 6, docs/runners.md §2.2):

=========  ===============================================================  ========================
level      board steps, in order                                              then
=========  ===============================================================  ========================
quick      ``device-check``                                                   the model's steps
standard   ``device-check``, ``selftest``                                     the model's steps
long       ``device-check``, ``selftest``                                     the model's steps
=========  ===============================================================  ========================

(the long level's burn-in is not in this calctl yet: ``long`` runs the standard board steps.)

* ``device-check`` (:func:`run_check`): ABI and versions, topology, per-chip health and one known-answer job
  per chip. Not ready (FAIL: which chip, why; ERROR: no device) stops the pipeline there, its reason first;
  every later step is SKIP saying so.
* ``selftest`` (:func:`run_board_selftest`): host<->device transfers and memory patterns per chip. A FAIL row
  (a stuck bit at an address, a chip at half its bandwidth) fails the step, naming the row; the pipeline goes
  on, so the report still says what the model did on that board. Without a board profile
  (``--board-profile``, docs/runtime.md §8) the transfer rows are NOT JUDGED with their figures: the step says
  NOT JUDGED and the pipeline's verdict does not turn on it.

Each step writes its own report (``device-check.json``, ``selftest.json``) into the run's directory. This
module runs the two and sums up their figures; it renders nothing and decides no pipeline's verdict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calctl import records
from calctl.runners.device import DeviceSpec

CHECK = "device-check"
SELFTEST = "selftest"
#: The levels whose pipelines run the self-test after the check (every level runs the check).
SELFTEST_LEVELS = ("standard", "long")
#: Where a pipeline's board step writes its own report, inside the run's directory.
CHECK_FILE = "device-check.json"
SELFTEST_FILE = "selftest.json"


@dataclass(frozen=True)
class BoardStepResult:
    """One board step as a pipeline shows it: its report's verdict, the figure a person reads first, why."""

    name: str
    verdict: str  # the step's own report's verdict: PASS | WARN | FAIL | NOT JUDGED | ERROR | TIMEOUT | INTERRUPTED
    key_figure: str
    detail: str
    seconds: float
    exit_code: int
    document: dict[str, Any] = field(default_factory=dict)  # the step's own report (device check / selftest)
    path: Path | None = None  # where that report was written

    @property
    def failed(self) -> bool:
        return self.exit_code != 0


def selftest_skip_reason(level: str) -> str | None:
    """Why a pipeline at ``level`` runs no self-test (None: it runs one)."""
    if level in SELFTEST_LEVELS:
        return None
    return f"the self-test runs at --level {' and '.join(SELFTEST_LEVELS)}; --level {level} runs the check only"


SELFTEST_HOW = "`--level standard`, or `calctl device selftest` on its own"


def run_check(device: DeviceSpec, out_dir: Path, *, step_timeout_s: float) -> BoardStepResult:
    """``calctl device check`` on ``device``, its report written to ``out_dir/device-check.json``."""
    from calctl.runners.board_check import check_board

    t0 = time.perf_counter()
    report = check_board(device, step_timeout_s=step_timeout_s)
    doc = report.document()
    chips = [c for c in doc.get("chips") or [] if isinstance(c, dict)]
    ready = [c for c in chips if c.get("ready")]
    if chips and len(ready) == len(chips) and report.exit_code == 0:
        answers = ", ".join(f"chip {c['chip']} {c['known_answer']['model']}" for c in chips)
        figure = f"{len(ready)}/{len(chips)} chips ready (known answers: {answers})"
    elif chips:
        down = ", ".join(f"chip {c['chip']}" for c in chips if not c.get("ready"))
        figure = f"NOT READY: {down}; {len(ready)}/{len(chips)} chips ready"
    else:
        figure = "no chip checked"
    detail = ""
    if report.exit_code != 0:  # the reason first: which chip and why, or why there is no device
        detail = report.error or "; ".join(report.reasons) or f"the check ended {report.verdict}"
    elif report.verdict == "WARN":
        detail = "; ".join(
            f"chip {c['chip']}: health unknown, ready on its known answer"
            for c in chips
            if c.get("health") == "unknown"
        )
    path = _write(out_dir / CHECK_FILE, doc)
    return BoardStepResult(CHECK, report.verdict, figure, detail, time.perf_counter() - t0, report.exit_code, doc, path)


def run_board_selftest(
    device: DeviceSpec, out_dir: Path, *, board_profile: Path | None = None, seed: int = 0
) -> BoardStepResult:
    """``calctl device selftest`` on ``device`` (against ``board_profile`` when given), its report written to
    ``out_dir/selftest.json``."""
    from calctl.runners.selftest import BoardProfile, run_selftest

    t0 = time.perf_counter()
    profile = BoardProfile.load(board_profile) if board_profile is not None else None
    report = run_selftest(device, profile=profile, seed=seed)
    doc = report.document()
    rows = [r for r in doc.get("rows") or [] if isinstance(r, dict)]
    figure = selftest_figure(rows) if rows else "no row measured"
    detail = ""
    if report.exit_code != 0:
        detail = report.error or f"the self-test ended {report.verdict}"
    elif report.verdict == "NOT JUDGED":
        unsupported = [r for r in rows if r.get("status") == "UNSUPPORTED"]
        detail = (
            str(unsupported[0]["detail"])
            if unsupported
            else "no board profile to judge the transfer figures against (--board-profile FILE, docs/runtime.md "
            "§8); the figures are reported and the verdict does not turn on them"
        )
    path = _write(out_dir / SELFTEST_FILE, doc)
    return BoardStepResult(
        SELFTEST, report.verdict, figure, detail, time.perf_counter() - t0, report.exit_code, doc, path
    )


def selftest_figure(rows: list[dict[str, Any]]) -> str:
    """``patterns 8/8 PASS; transfers 8 NOT JUDGED (h2d 2.99-3.01 GB/s, d2h ...)``: the rows at a glance."""
    patterns = [r for r in rows if r.get("direction") == "memory"]
    transfers = [r for r in rows if r.get("direction") in ("h2d", "d2h")]
    parts = []
    if patterns:
        passed = sum(1 for r in patterns if r.get("status") == "PASS")
        failed = [r["name"] for r in patterns if r.get("status") == "FAIL"]
        parts.append(
            f"memory patterns {passed}/{len(patterns)} PASS" + (f", FAIL: {', '.join(failed)}" if failed else "")
        )
    if transfers:
        counts: dict[str, int] = {}
        for r in transfers:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        rates = []
        for d in ("h2d", "d2h"):
            got = [r["figure_gbps"] for r in transfers if r.get("direction") == d and "stability" not in r["name"]]
            got = [g for g in got if isinstance(g, (int, float))]
            if got:
                rates.append(f"{d} {min(got):.2f}-{max(got):.2f} GB/s")
        failed = [r["name"] for r in transfers if r.get("status") == "FAIL"]
        parts.append(
            "transfers "
            + ", ".join(f"{n} {s}" for s, n in counts.items())
            + (f" ({', '.join(rates)} on the device clock)" if rates else "")
            + (f", FAIL: {', '.join(failed)}" if failed else "")
        )
    return "; ".join(parts)


def board_figures(check: dict[str, Any] | None, selftest: dict[str, Any] | None) -> dict[str, Any]:
    """The board steps' figures as a pipeline's report.json carries them: each chip's readiness and known
    answer, each self-test row with its figure, threshold and status (None: the step did not run)."""
    out: dict[str, Any] = {CHECK: None, SELFTEST: None}
    if check:
        out[CHECK] = {
            "verdict": check.get("verdict"),
            "ready": check.get("ready"),
            "error": check.get("error"),
            "chips": check.get("chips"),
            "file": CHECK_FILE,
        }
    if selftest:
        out[SELFTEST] = {
            "verdict": selftest.get("verdict"),
            "error": selftest.get("error"),
            "profile": selftest.get("profile"),
            "rows": [
                {k: r.get(k) for k in ("name", "status", "figure_gbps", "threshold_gbps", "detail")}
                for r in selftest.get("rows") or []
                if isinstance(r, dict)
            ],
            "file": SELFTEST_FILE,
        }
    return out


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    records.write_json(path, doc)
    return path


__all__ = [
    "CHECK",
    "CHECK_FILE",
    "SELFTEST",
    "SELFTEST_FILE",
    "SELFTEST_HOW",
    "SELFTEST_LEVELS",
    "BoardStepResult",
    "board_figures",
    "run_board_selftest",
    "run_check",
    "selftest_figure",
    "selftest_skip_reason",
]
