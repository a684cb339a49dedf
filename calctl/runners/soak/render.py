"""``calctl soak``, the report: ``soak-report.json``'s :class:`~calctl.report.Report` built from the
:class:`~calctl.runners.soak.state.SoakState` (a checkpoint while it runs, verdict RUNNING), and ``soak.png``."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from calctl.report import Report, build_header
from calctl.runners.plotting import save
from calctl.runners.soak import checks, evidence, host_memory, wording
from calctl.runners.soak.judge import device_errors, samples, verdict
from calctl.runners.soak.plan import SoakProgress
from calctl.runners.soak.state import EvidenceFiles, SoakState
from calctl.runners.telemetry import telemetry_document
from calctl.runtime.types import ChipMemory


def progress(s: SoakState) -> SoakProgress:
    """The live view for a progress bar."""
    with s.requests.lock:
        by = Counter(s.requests.by_outcome)
        sent = s.requests.sent
    gen = None
    if s.sup is not None and s.sup.cores:
        gen = max(w.generation for w in s.sup.cores.values())
    c = s.config
    return SoakProgress(
        phase=s.phase,
        elapsed_s=s.now_s(),
        cycles_done=s.cycles_done,
        cycles_total=c.cycles,
        deadline_s=c.hours * 3600 if c.hours is not None else None,
        requests=sent,
        violations=len(s.violations),
        generation=gen,
        max_drift_mib={k: (None if v is None else v / checks.MIB) for k, v in s.max_drift.items()},
        by_outcome=dict(by),
    )


def evidence_files(s: SoakState) -> EvidenceFiles:
    """The soak's evidence files (no picture yet)."""
    c = s.config
    return EvidenceFiles(report=str(c.out_dir / evidence.REPORT_FILE), events=str(c.out_dir / evidence.EVENTS_FILE))


def plot(s: SoakState) -> EvidenceFiles:
    """Draw ``soak.png``; the evidence files with it (a picture that failed is an event, never the soak's end)."""
    c = s.config
    out = evidence_files(s)
    try:
        fig = evidence.soak_figure(
            memory=s.memory_series,
            baseline={m.chip: m.used_bytes for m in s.baseline},
            limits=_drift_limits(s),
            latency=s.requests.latency,
            cycles=[(cy.loaded_s, cy.unloaded_s) for cy in s.cycles if cy.loaded_s is not None],
            title=_plot_title(s),
            device=c.device.kind.value,
            checks=_unload_checks(s),
            interrupted=(s.interrupted.at_s, s.interrupted.signal) if s.interrupted else None,
            ended=s.requests.ended,
            counts=dict(s.requests.by_outcome),
            sent=s.requests.sent,
            error=s.header.error,
        )
        save(fig, c.out_dir / evidence.PLOT_FILE, layout=False)
        out = dataclasses.replace(out, plot=str(c.out_dir / evidence.PLOT_FILE))
    except Exception as exc:
        s.events.write("plot_failed", error=f"{type(exc).__name__}: {exc}")
    return out


def _drift_limits(s: SoakState) -> dict[int, int | None]:
    """Per chip: the memory drift an unload may leave (None: the chip reports no total)."""
    return {m.chip: checks.drift_limit_bytes(m.total_bytes) if m.total_bytes else None for m in s.baseline}


def _unload_checks(s: SoakState) -> dict[int, list[tuple[float, int | None]]]:
    """Per chip: (time, drift) of every after-unload memory check (001 §13.3), for the picture."""
    out: dict[int, list[tuple[float, int | None]]] = {}
    for cy in s.cycles:
        if cy.unloaded_s is None:
            continue
        for d in cy.unload.drifts if cy.unload is not None else ():
            out.setdefault(d.chip, []).append((cy.unloaded_s, d.drift_bytes))
    return out


def _plot_title(s: SoakState) -> str:
    c = s.config
    planned = f" of {c.cycles} planned" if c.cycles is not None else ""
    title = f"calctl soak: {s.cycles_done} complete load/unload cycle(s){planned}"
    i = s.interrupted
    if i is not None:
        cut = f"; cycle {i.cycle} cut short while {i.phase}" if i.cycle is not None else ""
        title += f" - INTERRUPTED by {i.signal} at {i.at_s:.1f} s{cut}"
    return title


def report(s: SoakState) -> Report:
    """The soak's report as it stands."""
    c = s.config
    sup = s.sup
    with s.requests.lock:
        req: dict[str, Any] = {
            "sent": s.requests.sent,
            "open": s.requests.outstanding,
            "by_outcome": dict(s.requests.by_outcome),
            "by_model": {a: dict(v) for a, v in s.requests.by_alias_outcome.items()},
            "by_kind": {k: dict(v) for k, v in s.requests.by_kind_outcome.items()},
        }
        reasons = dict(s.requests.device_error_reasons)
    violations = s.violations.documents()
    stale_dropped = (
        {labels["model"]: int(v) for labels, v in samples(sup, "calctl_stale_completions_total")} if sup else {}
    )
    delivered = sum(v["occurrences"] for v in violations if v["kind"] == "stale_generation")
    limits = _drift_limits(s)
    h = s.header
    ev = h.files or evidence_files(s)
    header = build_header(
        "soak",
        started_at=s.started_at,
        device=c.device.kind.value,
        device_options=c.device.describe(),
        versions=h.runtime,
        package=h.package.document() if h.package else None,
        validation=h.validation.document() if h.validation else None,
    )
    header.setdefault("package", None)
    header.setdefault("validation", None)
    body: dict[str, Any] = {
        "status": s.status,
        "ok": s.status == "finished" and not violations if s.phase == "done" else None,
        "interrupted": s.interrupted.document() if s.interrupted else None,
        "cycles": s.cycles_done,
        "cycles_planned": c.cycles,
        "hours_planned": c.hours,
        "seconds": round(s.end_s if s.end_s is not None else s.now_s(), 3),
        "settings": {
            "traffic": c.traffic.value,
            "traffic_seconds": c.traffic_seconds,
            "traffic_requests": c.traffic_requests,
            "clients_per_model": c.clients_per_model,
            "seed": c.seed,
            "inject": sorted(i.value for i in c.inject),
            "warmup_iterations": c.warmup_iterations,
            "drain_deadline_s": c.drain_deadline_s,
            "checkpoint_interval_s": c.checkpoint_interval_s,
        },
        "violations": violations,
        "requests": req,
        "output_verification": s.verifier.document(),
        "errors": {
            "requests": {k: v for k, v in req["by_outcome"].items() if k not in ("ok", "cancelled")},
            "device_error_reasons": reasons,
            "device_errors": device_errors(sup) if sup else {},
            "lifecycle": dict(s.lifecycle_errors),
            "already_configured": sum(v for k, v in s.lifecycle_errors.items() if k.endswith("AlreadyConfigured")),
            "stale_completions_dropped": stale_dropped,
            "stale_completions_delivered": delivered,
            "drain_deadline_hits": s.drain_deadline_hits,
            "recoveries": [_recovery_doc(r) for r in sup.recoveries] if sup else [],
        },
        "memory": {
            "baseline": [mem_doc(m) for m in s.baseline],
            "drift_limit_bytes": limits,
            "max_drift_bytes": {str(k): v for k, v in s.max_drift.items()},
            "rule": "after every unload, each chip within max(64 MiB, 1 % of its local DRAM) of the baseline "
            "measured before the first load (001 §13.3)",
            "host_rss": _host_rss_doc(s),
        },
        "telemetry": telemetry_document(s.rt, final=False),  # per-chip power, temperature, throttle, ECC
        "cycle_records": [cy.document() for cy in s.cycles[-2000:]],
        "cycle_records_truncated": len(s.cycles) > 2000,
        "files": ev.document(),
    }
    # what the run saw, the same lines the terminal's table shows, for the page's first screen (#53 item 2)
    body["facts"] = [list(f) for f in wording.facts({**header, **body})]
    more = [f"... and {len(violations) - 10} more violation(s) in soak-report.json"] if len(violations) > 10 else []
    asked = [v for k, v in body["facts"] if k == "injected"]  # a failure the run asked for is said first
    return Report(
        "soak",
        verdict(s),
        header,
        body,
        reasons=(*asked, *(f"{v['kind']}: {v['message']}" for v in violations[:10]), *more),
        error=h.error,
        seconds=body.pop("seconds"),
        evidence={"report": ev.report, "events": ev.events},
        pictures={"plot": ev.plot} if ev.plot else {},
    )


def _host_rss_doc(s: SoakState) -> dict[str, Any]:
    ref = s.host_rss[0][1] if s.host_rss else None
    known = [r for _, r in s.host_rss if r is not None]
    return {
        "reference_bytes": ref,
        "limit_bytes": checks.host_rss_limit_bytes(ref) if ref is not None else None,
        "max_growth_bytes": max(known) - ref if ref is not None and known else None,
        "job_history_full_at_cycle": s.caches_full_at,
        "verdict": host_memory.judge(s.host_rss, s.caches_full_at, reported=s.history_reported).document(),
        "after_unload": [{"cycle": c, "rss_bytes": r} for c, r in s.host_rss[-2000:]],
        "rule": f"the serving process's VmRSS after every unload, judged by its trend: after a warm-up (the "
        f"first {host_memory.MIN_WARMUP_CYCLES} cycles, or until the runtime's job history filled if later), the "
        f"least-squares slope's 95 % interval must reach down to {host_memory.SLOPE_LIMIT_BYTES // 1024} KiB a "
        f"cycle or below; a run with fewer than {host_memory.MIN_TREND_CYCLES} cycles after the warm-up: within "
        "max(64 MiB, 10 %) of the first cycle's VmRSS (issues 32, 53)",
    }


def mem_doc(m: ChipMemory) -> dict[str, Any]:
    return {"chip": m.chip, "used_bytes": m.used_bytes, "total_bytes": m.total_bytes}


def recovery_doc(r: Any) -> dict[str, Any]:
    """A supervisor's RecoveryRecord as report JSON (soak adds its ``detail``; the bench's fault isolation does not)."""
    return {
        "alias": r.alias,
        "reason": r.reason,
        "runtime_status": r.runtime_status,
        "scope": r.scope,
        "affected_aliases": list(r.affected_aliases),
        "ok": r.ok,
        "seconds": round(r.seconds, 4),
    }


def _recovery_doc(r: Any) -> dict[str, Any]:
    return {**recovery_doc(r), "detail": r.detail}
