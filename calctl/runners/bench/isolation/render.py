"""G2 isolation, the report: the scenario result (gates, table, body, notes) and its evidence files.

:func:`scenario_result` turns an :class:`~calctl.runners.bench.isolation.judge.Observation` and its
:class:`~calctl.runners.bench.isolation.judge.IsolationJudgement` into the :class:`ScenarioResult` the CLI renders,
writing ``isolation-requests.ndjson``, ``isolation-trace.json`` and ``bench.png`` beside it.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np

from calctl.records import dumps_line
from calctl.runners.bench.base import BenchOptions, ScenarioResult, Table
from calctl.runners.bench.gates import Gate
from calctl.runners.bench.isolation.judge import CHECKS, NO_GO_ACTION, IsolationJudgement, Observation
from calctl.runners.bench.isolation.plan import (
    CANCEL_SHARE,
    G2_MIN_REQUESTS,
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    TIMER_CANCEL_S,
)
from calctl.runners.device import DeviceSpec
from calctl.runners.plotting import device_label, pyplot, save
from calctl.runners.trace import busy_overlap, trace_slices, write_chrome_trace
from calctl.serving.outcomes import RequestOutcome


def device_text(device: DeviceSpec, versions: Any) -> str:
    """The device the replica ran on, for the log and the report (a mock result says so)."""
    if device.is_mock:
        return "mock (simulated board; MOCK RESULT, not hardware evidence)"
    fw = f", firmware {versions.firmware}" if versions is not None and versions.firmware else ""
    return f"calrt via {device.calrt_lib or '$CALRT_LIBRARY'}{fw}"


def scenario_result(
    opts: BenchOptions, obs: Observation, judged: IsolationJudgement, *, t_judge: float
) -> ScenarioResult:
    """The scenario's result, its evidence files written to ``opts.out_dir`` (``t_judge``: when judging began)."""
    write_requests(opts.out_dir, obs)
    trace_doc = trace_document(opts.out_dir, obs)
    plot = opts.out_dir / "bench.png"
    obs.files["plot"] = str(plot)
    plot_isolation(plot, obs, judged.verdict, judged.checks)
    obs.seconds["judge_and_evidence"] = time.monotonic() - t_judge
    gates = tuple(
        Gate(
            f"G2.{name}",
            CHECKS[name],
            float(c["fail"]),
            c["fail"] == 0 and (name != "serial_golden" or obs.start_error is None),
            f"{c['pass']} passed, {c['fail']} failed"
            + (f"; first: {c['first_failure']}" if c["first_failure"] else ""),
            samples=c["pass"] + c["fail"],
        )
        for name, c in judged.checks.items()
    )
    table = Table(
        "G2 replica isolation (001 §12 Phase 2, §13.1)" + (" (MOCK)" if obs.device.is_mock else ""),
        ("check", "pass", "fail", "first failure"),
        tuple((n, c["pass"], c["fail"], (c["first_failure"] or "")[:160]) for n, c in judged.checks.items()),
    )
    return ScenarioResult(
        "isolation",
        judged.verdict,
        gates,
        (table,),
        _body(opts, obs, judged, trace_doc),
        plot,
        tuple(notes(obs, judged)),
        mock_result=obs.device.is_mock,
    )


def _body(
    opts: BenchOptions, obs: Observation, judged: IsolationJudgement, trace_doc: dict[str, Any]
) -> dict[str, Any]:
    replica, device, versions = obs.replica, obs.device, obs.versions
    return {
        "gate": "G2",
        "package": str(opts.package),
        "sides": [
            {
                "alias": s.alias,
                "chip": s.chip,
                "graphs": list(s.graphs),
                "generations": sorted(obs.generations.get(s.alias, ())),
            }
            for s in replica.sides
        ],
        "replica": {"params_sha256": replica.params_sha256, "tokenizer_sha256": replica.tokenizer_sha256},
        "device": device.kind.value,
        "device_text": device_text(device, versions),
        "device_options": device.describe(),
        "runtime": None
        if versions is None
        else {"runtime": versions.runtime, "firmware": versions.firmware, "abi": versions.abi},
        "workload": {
            "requests": opts.requests,
            "prompt_tokens": list(PROMPT_TOKENS),
            "output_tokens": list(OUTPUT_TOKENS),
            "cancel_share": CANCEL_SHARE,
            "timer_cancel_within_s": TIMER_CANCEL_S,
            "submission": "closed loop, interleaved across the aliases in a seeded order: at most "
            + ", ".join(f"{a}: {n}" for a, n in obs.in_flight.items())
            + " in flight, each request's deadline counted from its admission",
            "in_flight": dict(obs.in_flight),
            "deadline_s": max(60.0, opts.request_timeout_s),
            "alias_switches": sum(1 for a, b in itertools.pairwise(obs.work) if a.side is not b.side),
            "temperature": 0.0,
            "ignore_eos": True,
            "seed": opts.seed,
            "reference": "the package's float64 model (calctl.model.decoder.reference_logits), teacher-forced",
        },
        "serial_golden": obs.golden_rows,
        "load_error": obs.start_error,
        "requests": judged.requests,
        "checks": judged.checks,
        "crosstalk": judged.offenders,
        "recoveries": obs.recoveries,
        "faults_fired": obs.faults_fired,
        "kv": {
            s.alias: {
                "before": dataclasses.asdict(obs.before[s.alias]) if s.alias in obs.before else None,
                "after": dataclasses.asdict(obs.after[s.alias]) if s.alias in obs.after else None,
            }
            for s in replica.sides
        },
        "memory_used_bytes": {"before": obs.mem_before, "after": obs.mem_after},
        "trace": trace_doc,
        "no_go_action": None if judged.go else NO_GO_ACTION,
        "phase_seconds": {k: round(v, 3) for k, v in obs.seconds.items()},
        "files": dict(obs.files),
    }


def _offender_note(o: dict[str, Any]) -> str:
    return (
        f"failing gate {o['check']}: {o['request_id']} ({o['alias']}, chip {o['chip']}): {o['detail']}"
        + (
            f"; from output token {o['from_token']}: expected {o['expected_prefix']}, got {o['got_prefix']}"
            if o.get("expected_prefix")
            else ""
        )
        + (f"; source: {o['source']}" if o.get("source") else "")
    )


def notes(obs: Observation, judged: IsolationJudgement) -> list[str]:
    """The result's notes for people: timeouts, the NO-GO action and offenders, the threshold, faults, the mock."""
    go, offenders, requests = judged.go, judged.offenders, judged.requests
    out = []
    if requests["timed_out"]:
        out.append(
            f"{'NOT JUDGED: ' if go else ''}{requests['timed_out']} request(s) timed out (a load outcome: the "
            "host or the device was too slow for the deadline, never counted as crosstalk); "
            f"{requests['sent'] - requests['timed_out']} were verified. Rerun on a less loaded host or with a "
            "longer --request-timeout to judge all of them"
        )
    if not go:
        out.append(f"NO-GO: {NO_GO_ACTION}")
        out.extend(_offender_note(o) for o in offenders[:10])
        if len(offenders) > 10:
            out.append(f"failing gate: and {len(offenders) - 10} more offenders (the crosstalk list)")
    if requests["sent"] < G2_MIN_REQUESTS:
        out.append(
            f"{requests['sent']} requests: 001 §13.1 asks for at least {G2_MIN_REQUESTS}; this verdict covers "
            "only what was run (requests.threshold_met false)"
        )
    if obs.faults_fired:
        hit = sorted({o["alias"] for o in offenders if o["request_id"].startswith("iso-") and o["alias"]})
        out.append(
            f"{len(obs.faults_fired)} fault(s) of the fault plan fired "
            f"({', '.join(sorted({f['kind'] + ' on ' + str(f['graph'] or f['model']) for f in obs.faults_fired}))})"
            f"; offending requests on: {', '.join(hit) or 'none'} (a corruption that changes no greedy token, "
            "or hits a sequence's last step, is invisible in the output)"
        )
    if obs.recoveries:
        out.append(
            f"{len(obs.recoveries)} recovery(ies) during the run: "
            + "; ".join(
                f"{r['scope']} reset for a {r['reason']} of {r['alias']}" + ("" if r["ok"] else " (FAILED)")
                for r in obs.recoveries
            )
        )
    if requests["near_ties"]:
        out.append(
            f"{requests['near_ties']} output token(s) where the reference's top two logits lie within the "
            "golden tolerance: either token accepted"
        )
    if obs.device.is_mock:
        out.append(
            "MOCK RESULT: the replica ran on the simulated board; this shows the tool and the engine's isolation, "
            "not a Calculet board's (docs/runtime.md §5)"
        )
    return out


def write_requests(out_dir: Path, obs: Observation) -> None:
    """``isolation-requests.ndjson``: one line per request, its plan, outcome, tokens and every check."""
    path = out_dir / "isolation-requests.ndjson"
    with path.open("w", encoding="utf-8") as f:
        for j in obs.judged:
            f.write(dumps_line(j.document()))
    obs.files["requests_ndjson"] = str(path)


def trace_document(out_dir: Path, obs: Observation) -> dict[str, Any]:
    """The report's ``trace`` (jobs per chip, the share both chips were busy) and ``isolation-trace.json``."""
    slices = trace_slices(obs.events)
    doc: dict[str, Any] = {"jobs": len(obs.events), "both_busy_fraction": None, "per_chip_jobs": {}}
    for s in obs.replica.sides:
        doc["per_chip_jobs"][str(s.chip)] = sum(1 for e in obs.events if e.chip == s.chip)
    if slices:
        t0, t1 = min(x.start for x in slices), max(x.end for x in slices)
        both = sum(e - s for s, e in busy_overlap(slices))
        doc["both_busy_fraction"] = round(both / (t1 - t0), 4) if t1 > t0 else None
        path = out_dir / "isolation-trace.json"
        write_chrome_trace(
            path,
            slices,
            device=obs.device.kind.value,
            metadata={"scenario": "isolation", "mock_result": obs.device.is_mock},
        )
        obs.files["trace"] = str(path)
    doc["note"] = (
        "Phase 2 step 5 evidence: the share of the run during which both chips had a job running; "
        "G3 judges S2, this scenario does not"
    )
    return doc


def plot_isolation(path: Path, obs: Observation, verdict: str, checks: dict[str, dict[str, Any]]) -> None:
    """Requests over time per side (offenders in red) and the check counts."""
    plt = pyplot()
    fig, (ax, ax_c) = plt.subplots(1, 2, figsize=(14, 5), width_ratios=[3, 2])
    colours = {obs.replica.sides[0].alias: "#1f77b4", obs.replica.sides[1].alias: "#ff7f0e"}
    sent = [j.result.record.sent for j in obs.judged if j.result is not None]
    t0 = min(sent, default=0.0)
    for j in obs.judged:
        rec = j.result.record if j.result is not None else None
        if rec is None or rec.end is None:
            continue
        bad = bool(j.failures)
        ax.plot(
            [rec.sent - t0, rec.end - t0],
            [j.planned.index, j.planned.index],
            color="#d62728" if bad else colours[j.planned.side.alias],
            linewidth=1.6 if bad else 0.6,
            alpha=1.0 if bad else 0.6,
        )
        if j.outcome == RequestOutcome.CANCELLED.value:
            ax.plot([rec.end - t0], [j.planned.index], marker="x", markersize=2.5, color="#555555")
    for alias, c in colours.items():
        ax.plot([], [], color=c, label=f"{alias} (chip {obs.replica.side(alias).chip})")
    ax.plot([], [], color="#d62728", label="failed a check")
    ax.plot([], [], marker="x", linestyle="", color="#555555", label="cancelled")
    ax.set_xlabel("time since the first request (s)")
    ax.set_ylabel("request (submission order)")
    ax.legend(fontsize=8, loc="lower right")
    names = list(CHECKS)
    y = np.arange(len(names))
    totals = [max(1, checks[n]["pass"] + checks[n]["fail"]) for n in names]
    passed = [checks[n]["pass"] / t for n, t in zip(names, totals, strict=True)]
    failed = [checks[n]["fail"] / t for n, t in zip(names, totals, strict=True)]
    ax_c.barh(y, passed, color="#2ca02c", label="pass")
    ax_c.barh(y, failed, left=passed, color="#d62728", label="fail")
    for i, n in enumerate(names):
        ax_c.text(1.01, i, f"{checks[n]['pass']}/{checks[n]['pass'] + checks[n]['fail']}", va="center", fontsize=7)
    ax_c.set_yticks(y, names, fontsize=8)
    ax_c.set_xlim(0, 1.18)
    ax_c.invert_yaxis()
    ax_c.set_xlabel("share of the items checked (requests, jobs, sides) that passed")
    ax_c.legend(fontsize=8, loc="lower right")
    device = "mock" if obs.device.is_mock else device_text(obs.device, obs.versions)
    fig.suptitle(
        f"calctl bench isolation (G2): {verdict}; {len(obs.judged)} requests over "
        f"{', '.join(s.alias for s in obs.replica.sides)}\n{device_label(device)}",
        fontsize=10,
    )
    save(fig, path)
