"""The board's own first steps of ``bringup`` and ``accept``: the readiness check, the self-test, the burn-in.

A pipeline about the model is worth nothing on a board that is not ready (the level-1 gate a scheduler runs
first, as ``dcgmi diag -r 1`` does), so ``bringup`` and ``accept`` begin with what ``calctl device check``,
``calctl device selftest`` and ``calctl burn-in`` measure (issue 51 item 6, docs/runners.md §6):

=========  ===============================================================  ========================
level      board steps, in order                                              then
=========  ===============================================================  ========================
quick      ``device-check``                                                   the model's steps
standard   ``device-check``, ``selftest``                                     the model's steps
long       ``device-check``, ``selftest``, ``burn-in``                        the model's steps
=========  ===============================================================  ========================

A board step a level does not run is SKIP saying which level runs it and the command that runs it alone.

* ``device-check`` (:func:`run_check`): ABI and versions, topology, per-chip health and one known-answer job
  per chip. Not ready (FAIL: which chip, why; ERROR: no device) stops the pipeline there, its reason first;
  every later step is SKIP saying so.
* ``selftest`` (:func:`run_board_selftest`): host<->device transfers and memory patterns per chip. A FAIL row
  (a stuck bit at an address, a chip at half its bandwidth) fails the step, naming the row; the pipeline goes
  on, so the report still says what the model did on that board. Without a board profile
  (``--board-profile``, docs/runtime.md §8) the transfer rows are NOT JUDGED with their figures: the step says
  NOT JUDGED and the pipeline's verdict does not turn on it.
* ``burn-in`` (:func:`run_board_burnin`): both chips at full load for the level's minutes (bring-up 10, accept
  30; ``--burn-in-minutes`` overrides), telemetry against the board profile's ``telemetry`` limits, else the
  runtime's own (docs/burn-in.md). A FAIL row (temperature, power, throttle, ECC, a frozen sensor, a failed
  job) fails the step naming the figure, the chip and the limit; the pipeline goes on. A WARN row (within 5 %
  of a limit) makes the step WARN. Rows NOT JUDGED (the runtime does not report the figure, no limit is
  known) leave the step NOT JUDGED, which does not turn the pipeline's verdict.

Each step writes its own report (``device-check.json``, ``selftest.json``, ``burn-in.json`` with
``burn-in.png``) into the run's directory. This module runs them and sums up their figures; it renders
nothing and decides no pipeline's verdict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calctl import records
from calctl.runners.device import DeviceSpec
from calctl.runtime import DeviceKind

CHECK = "device-check"
SELFTEST = "selftest"
#: The levels whose pipelines run the self-test after the check (every level runs the check).
SELFTEST_LEVELS = ("standard", "long")
#: Where a pipeline's board step writes its own report, inside the run's directory.
CHECK_FILE = "device-check.json"
SELFTEST_FILE = "selftest.json"
BURNIN = "burn-in"
#: The levels whose pipelines load the board to its limits after the self-test.
BURNIN_LEVELS = ("long",)
BURNIN_FILE = "burn-in.json"
BURNIN_PLOT = "burn-in.png"
CONFORMANCE = "conformance"
CONFORMANCE_FILE = "conformance.json"


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
    plot: Path | None = None  # its picture, when it draws one (the burn-in's telemetry traces)

    @property
    def failed(self) -> bool:
        return self.exit_code != 0


def selftest_skip_reason(level: str) -> str | None:
    """Why a pipeline at ``level`` runs no self-test (None: it runs one)."""
    if level in SELFTEST_LEVELS:
        return None
    return f"the self-test runs at --level {' and '.join(SELFTEST_LEVELS)}; --level {level} runs the check only"


SELFTEST_HOW = "`--level standard`, or `calctl device selftest` on its own"


def burnin_skip_reason(level: str) -> str | None:
    """Why a pipeline at ``level`` runs no burn-in (None: it runs one)."""
    if level in BURNIN_LEVELS:
        return None
    return f"the burn-in runs at --level {' and '.join(BURNIN_LEVELS)}; --level {level} does not load the board"


BURNIN_HOW = "`--level long`, or `calctl burn-in --minutes N` on its own"


def conformance_skip_reason(device: DeviceSpec) -> str | None:
    """Why a pipeline on ``device`` runs no conformance suite (None: it runs one, at the pipeline's level)."""
    if device.kind is DeviceKind.CALRT:
        return None
    return (
        "the ABI conformance suite checks a vendor's CalRT library (--device calrt); the mock board is calctl's "
        "own model of that ABI"
    )


CONFORMANCE_HOW = "`--device calrt`, or `calctl device conformance --calrt-lib PATH` on its own"


def burnin_interval(minutes: float) -> float:
    """Seconds between telemetry samples for a burn-in of ``minutes``: 1 s (``calctl burn-in``'s default) down
    to 0.1 s, so even a burn-in of seconds has the samples its sensor row judges (at least 5)."""
    return min(1.0, max(0.1, minutes * 60.0 / 30.0))


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


def run_board_burnin(
    device: DeviceSpec, out_dir: Path, *, minutes: float, board_profile: Path | None = None
) -> BoardStepResult:
    """``calctl burn-in --minutes minutes`` on ``device`` (limits from ``board_profile``'s ``telemetry`` block,
    else the runtime's own), its report written to ``out_dir/burn-in.json`` and its picture to
    ``out_dir/burn-in.png``."""
    from calctl.runners.burnin import BurnInLimits, run_burnin

    t0 = time.perf_counter()
    limits = BurnInLimits.from_profile(board_profile) if board_profile is not None else BurnInLimits()
    out_dir.mkdir(parents=True, exist_ok=True)
    report = run_burnin(
        device, minutes=minutes, limits=limits, interval_s=burnin_interval(minutes), plot=out_dir / BURNIN_PLOT
    )
    doc = report.document()
    rows = [r for r in doc.get("rows") or [] if isinstance(r, dict)]
    verdict, detail = report.verdict, ""
    failing = [r for r in rows if r.get("status") == "FAIL"]
    warned = [r for r in rows if r.get("status") == "WARN"]
    unjudged = [r for r in rows if r.get("status") == "NOT JUDGED"]
    if failing:  # every failing row, naming its figure, chip and limit
        detail = "; ".join(_burnin_reason(r) for r in failing)
    elif report.exit_code != 0:
        detail = report.error or f"the burn-in ended {report.verdict}"
    elif warned:
        detail = "; ".join(_burnin_reason(r) for r in warned)
    elif verdict == "WARN" and unjudged:  # only rows it could not judge: figures, not a warning of its own
        verdict = "NOT JUDGED"
        detail = (
            "not judged: "
            + "; ".join(_burnin_reason(r) for r in unjudged)
            + " (the figures are reported and the verdict does not turn on them)"
        )
    path = _write(out_dir / BURNIN_FILE, doc)
    figure = burnin_figure(rows, minutes) if rows else "no row graded"
    plot = Path(report.pictures["plot"]) if report.pictures.get("plot") else None
    seconds = time.perf_counter() - t0
    return BoardStepResult(BURNIN, verdict, figure, detail, seconds, report.exit_code, doc, path, plot)


def run_board_conformance(device: DeviceSpec, out_dir: Path, *, level: str) -> BoardStepResult:
    """``calctl device conformance --level level`` on ``device``'s library (the bundled combined sample package),
    its report written to ``out_dir/conformance.json``. A FAIL names every check that failed and its ABI clauses
    (docs/calrt-c-abi.md §13): a broken shim fails the pipeline here, whatever the model's steps see."""
    from calctl.errors import CalctlError
    from calctl.runners.conformance import failing_rows, run_conformance

    assert device.calrt_lib is not None  # conformance_skip_reason: only a calrt device runs it
    t0 = time.perf_counter()
    try:
        report = run_conformance(device.calrt_lib, level=level)
    except CalctlError as exc:  # the library does not load: the device check already said so, this says it too
        seconds = time.perf_counter() - t0
        return BoardStepResult(CONFORMANCE, "ERROR", "no check ran", exc.message, seconds, exc.exit_code)
    doc = report.document()
    counts = doc.get("counts") or {}
    total = sum(counts.values())
    failing = failing_rows(doc)
    figure = f"{counts.get('PASS', 0)}/{total} checks PASS at --level {level}"
    if counts.get("UNSUPPORTED"):
        figure += f", {counts['UNSUPPORTED']} UNSUPPORTED"
    figure += "".join(f", {counts[v]} {v}" for v in ("FAIL", "TIMEOUT") if counts.get(v))
    detail = "; ".join(failing) if failing else (report.error or "")
    path = _write(out_dir / CONFORMANCE_FILE, doc)
    seconds = time.perf_counter() - t0
    return BoardStepResult(CONFORMANCE, report.verdict, figure, detail, seconds, report.exit_code, doc, path)


def _burnin_reason(row: dict[str, Any]) -> str:
    return f"chip {row.get('chip')} {row.get('figure')}: {row.get('detail')}"


def burnin_figure(rows: list[dict[str, Any]], minutes: float) -> str:
    """``10 min: chip 0 71.3/90 C, 33.2/45 W, throttled 0 s, 1204 jobs; chip 1 ...``: the burn-in at a glance."""
    by_chip: dict[Any, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_chip.setdefault(r.get("chip"), {})[str(r.get("figure"))] = r
    parts = []
    for chip, got in sorted(by_chip.items(), key=lambda kv: str(kv[0])):
        bits = []
        for figure, unit in (("temperature", "C"), ("power", "W")):
            row = got.get(figure)
            if row is None or row.get("value") is None:
                bits.append(f"{figure} n/a")
            else:
                limit = row.get("limit")
                bits.append(
                    f"{row['value']:g}" + (f"/{limit:g}" if isinstance(limit, (int, float)) else "") + f" {unit}"
                )
        throttle = got.get("throttle")
        if throttle is not None and throttle.get("value") is not None:
            bits.append(f"throttled {throttle['value']:g} s")
        jobs = got.get("jobs")
        if jobs is not None and jobs.get("value") is not None:
            bits.append(f"{jobs['value']} jobs")
        parts.append(f"chip {chip} " + ", ".join(bits))
    bad = [f"chip {r.get('chip')} {r.get('figure')}" for r in rows if r.get("status") == "FAIL"]
    return f"{minutes:g} min: " + "; ".join(parts) + (f"; FAIL: {', '.join(bad)}" if bad else "")


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


def board_figures(
    check: dict[str, Any] | None,
    selftest: dict[str, Any] | None,
    burnin: dict[str, Any] | None = None,
    conformance: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The board steps' figures as a pipeline's report.json carries them: each chip's readiness and known
    answer, each self-test row with its figure, threshold and status, each burn-in row with its value, limit
    and status and each chip's telemetry over the load, the conformance suite's counts and every check that
    failed with its clauses (None: the step did not run)."""
    out: dict[str, Any] = {CHECK: None, CONFORMANCE: None, SELFTEST: None, BURNIN: None}
    if check:
        out[CHECK] = {
            "verdict": check.get("verdict"),
            "ready": check.get("ready"),
            "error": check.get("error"),
            "chips": check.get("chips"),
            "file": CHECK_FILE,
        }
    if conformance:
        out[CONFORMANCE] = {
            "verdict": conformance.get("verdict"),
            "error": conformance.get("error"),
            "library": conformance.get("library"),
            "level": conformance.get("level"),
            "counts": conformance.get("counts"),
            "failed": [
                {k: c.get(k) for k in ("name", "verdict", "clauses", "detail")}
                for c in conformance.get("checks") or []
                if isinstance(c, dict) and c.get("verdict") in ("FAIL", "TIMEOUT")
            ],
            "file": CONFORMANCE_FILE,
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
    if burnin:
        telemetry: dict[str, Any] = burnin["telemetry"] if isinstance(burnin.get("telemetry"), dict) else {}
        out[BURNIN] = {
            "verdict": burnin.get("verdict"),
            "error": burnin.get("error"),
            "minutes": burnin.get("minutes"),
            "limits": burnin.get("limits"),
            "rows": [
                {k: r.get(k) for k in ("chip", "figure", "status", "value", "limit", "detail")}
                for r in burnin.get("rows") or []
                if isinstance(r, dict)
            ],
            "chips": burnin.get("chips"),
            "telemetry": telemetry.get("chips"),  # per chip: average and highest power, hottest, throttled, ECC
            "file": BURNIN_FILE,
            "plot": BURNIN_PLOT
            if isinstance(burnin.get("pictures"), dict) and burnin["pictures"].get("plot")
            else None,
        }
    return out


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    records.write_json(path, doc)
    return path


__all__ = [
    "BURNIN",
    "BURNIN_FILE",
    "BURNIN_HOW",
    "BURNIN_LEVELS",
    "BURNIN_PLOT",
    "CHECK",
    "CHECK_FILE",
    "CONFORMANCE",
    "CONFORMANCE_FILE",
    "CONFORMANCE_HOW",
    "SELFTEST",
    "SELFTEST_FILE",
    "SELFTEST_HOW",
    "SELFTEST_LEVELS",
    "BoardStepResult",
    "board_figures",
    "burnin_figure",
    "burnin_interval",
    "burnin_skip_reason",
    "conformance_skip_reason",
    "run_board_burnin",
    "run_board_conformance",
    "run_board_selftest",
    "run_check",
    "selftest_figure",
    "selftest_skip_reason",
]
