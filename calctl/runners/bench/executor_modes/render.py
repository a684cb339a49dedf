"""Scenario ``executor-modes``, the result: gates from the judged run's checks, the tables and notes, and the
figures the timeline picture illustrates."""

from __future__ import annotations

from collections.abc import Sequence

from calctl.runners.bench.base import ScenarioResult, Table, ms_cell
from calctl.runners.bench.executor_modes.judge import ExecutorModesResult, pct_text
from calctl.runners.bench.gates import Gate


def scenario_result(runs: Sequence[ExecutorModesResult], *, mock: bool) -> ScenarioResult:
    """The bench result of the judged run (``runs[0]``) and, on the mock, its compute-bound control."""
    judged = runs[0]
    gates = tuple(
        Gate(f"{m.name}.{c.name}", c.rule, c.estimate.mean, c.passed, c.detail)
        for m in (judged.m1, judged.m2)
        for c in m.checks
    )
    verdicts = (judged.m1.verdict, judged.m2.verdict)
    verdict = "FAIL" if "not met" in verdicts else ("PASS" if all(v == "met" for v in verdicts) else "MEASURED")
    tables = [_modes_table(r) for r in runs] + [_evidence_table(runs)]
    notes = [
        f"M1 {judged.m1.verdict}, M2 {judged.m2.verdict}" + (f" ({judged.profile.label()})" if judged.profile else "")
    ]
    notes += list(judged.m2.notes) + judged.notes
    if len(runs) > 1:
        control = runs[1]
        notes.append(
            f"control {control.profile.label() if control.profile else ''}: M2 {control.m2.verdict}; "
            f"throughput gain {pct_text(control.m2.checks[0].estimate.mean)}: with no transfer to hide, ping/pong "
            "hides only host time"
        )
    return ScenarioResult(
        scenario="executor-modes",
        verdict=verdict,
        gates=gates,
        tables=tuple(tables),
        body={"runs": [r.document() for r in runs]},
        plot=judged.plot_path,
        notes=tuple(notes),
        mock_result=mock,
    )


def plot_notes(result: ExecutorModesResult) -> list[str]:
    """The figures the picture illustrates, with their CIs (they were only in the JSON)."""
    lines = []
    for m in (result.m1, result.m2):
        for c in m.checks:
            e = c.estimate
            ci = (
                f" [95 % CI {e.ci_low:+.1%}, {e.ci_high:+.1%}]"
                if e.ci_low is not None and e.ci_high is not None
                else ""
            )
            exact = c.rule.startswith("==")  # a count or an equality, not a relative change
            mean = "n/a" if e.mean is None else (f"{e.mean:g}" if exact else f"{e.mean:+.1%}")
            verdict = {True: "PASS", False: "FAIL", None: "NOT JUDGED"}[c.passed]
            lines.append(f"{m.name} {c.name}: {mean}{ci} ({c.rule}) -> {verdict}")
    return lines


def _modes_table(r: ExecutorModesResult) -> Table:
    rows = []
    for mode, s in r.per_mode.items():
        tp = s["throughput_tokens_per_s"]
        rows.append(
            (
                mode,
                s["requests"],
                s["errors"],
                ms_cell(s["e2e_s"]["p50"]),
                ms_cell(s["e2e_s"]["p99"]),
                ms_cell(s["ttft_s"]["p99"]),
                ms_cell(s["itl_s"]["p99"]),
                f"{tp['mean']:.1f} [{tp['ci_low'] or 0:.1f}, {tp['ci_high'] or 0:.1f}]"
                if tp["mean"] is not None
                else "n/a",
            )
        )
    title = (
        f"executor modes, {r.alias}" + (f", {r.profile.label()}" if r.profile else "") + (" (MOCK)" if r.mock else "")
    )
    return Table(
        title,
        ("mode", "requests", "errors", "P50 E2E", "P99 E2E", "P99 TTFT", "P99 ITL", "tokens/s [95 % CI]"),
        tuple(rows),
    )


def _evidence_table(runs: Sequence[ExecutorModesResult]) -> Table:
    rows = []
    for r in runs:
        e = r.evidence
        rows.append(
            (
                r.profile.name if r.profile else r.device,
                e.jobs,
                f"{e.busy_s:.3f}",
                f"{e.two_in_flight_s:.3f}",
                "n/a" if e.compute_overlap_s is None else f"{e.compute_overlap_s:.3f}",
                "n/a" if e.transfer_compute_overlap_s is None else f"{e.transfer_compute_overlap_s:.3f}",
            )
        )
    return Table(
        "ping/pong trace: two in flight is not two computing (seconds)",
        ("profile", "jobs", "busy", "two in flight", "two computing", "transfer || compute"),
        tuple(rows),
    )
