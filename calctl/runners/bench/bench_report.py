"""A bench scenario's :class:`~calctl.report.Report`: the header, the scenario's verdict, its gates and its body.

Built here, not in the CLI (issue 27: the CLI only renders). :func:`scenario_report` is the one way a
:class:`~calctl.runners.bench.base.ScenarioResult` becomes a report (``calctl bench``'s, and accept's step
files); the exit code is the report's, :func:`calctl.report.exit_code_of` the verdict. :func:`bench_report`
adds ``calctl bench``'s header (it labels the device, and says so when the server's device was not stated,
``--target-device``) and settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from calctl.report import Report, build_header, exit_code_of
from calctl.runners import telemetry
from calctl.runners.bench.base import BenchOptions, ScenarioResult

#: The note of a report against a server whose device was not stated.
UNSTATED_DEVICE_NOTE = (
    "the server's device was not stated (--target-device); do not read these "
    "numbers as board evidence unless you know it"
)

REPORT_FILE = "bench-report.json"


def scenario_report(
    command: str,
    result: ScenarioResult,
    header: Mapping[str, Any],
    *,
    lead: Mapping[str, Any] | None = None,
    files: Mapping[str, Any] | None = None,
    evidence: Mapping[str, str] | None = None,
) -> Report:
    """The report of one scenario's ``result``: its verdict, then ``lead`` (the command's own fields), the gates
    (and which failed or were not judged), the scenario's body, its notes (also the report's reasons) and
    ``files``; its picture under ``pictures``."""
    body: dict[str, Any] = {
        **(lead or {}),
        "gates": [g.document() for g in result.gates],
        "failing_gates": [g.name for g in result.gates if g.passed is False],
        "not_judged_gates": [g.name for g in result.gates if g.passed is None],
        **result.body,
        "notes": list(result.notes),
    }
    if files is not None:
        body["files"] = dict(files)
    return Report(
        command,
        result.verdict,
        header,
        body,
        reasons=tuple(result.notes),
        evidence=dict(evidence or {}),
        pictures={"plot": str(result.plot)} if result.plot else {},
    )


def with_device_telemetry(result: ScenarioResult, since: int) -> ScenarioResult:
    """``result`` with the telemetry of the devices the scenario opened in this process since ``since``
    (:func:`calctl.runners.telemetry.mark`): one block per device, or the result as it is when it opened none
    (a scenario against a server: that board's telemetry is the server's ``/metrics``)."""
    docs = telemetry.documents_since(since)
    if not docs:
        return result
    return dataclasses.replace(result, body={**result.body, "telemetry": docs[0] if len(docs) == 1 else docs})


def bench_report(
    opts: BenchOptions, result: ScenarioResult, scenario: str, started: datetime, seconds: float
) -> Report:
    """The report of one ``calctl bench`` run (``bench-report.json``, ``--format json``)."""
    mock = result.mock_result
    body_doc = getattr(result, "body", None)
    versions = body_doc.get("runtime") if isinstance(body_doc, dict) else None  # a board run here says what it is
    header = build_header(
        "bench", started_at=started, device=opts.target_device, mock_result=mock, versions=versions, scenario=scenario
    )
    if header["mock_result"] is None:
        header["note"] = UNSTATED_DEVICE_NOTE
    lead: dict[str, Any] = {
        "ok": exit_code_of(result.verdict) == 0,
        "seconds": round(seconds, 3),
        "target": {"url": opts.url, "models": list(opts.models)},
        "settings": {
            "mode": opts.mode.value,
            "rate_per_model": opts.rate,
            "duration_s": opts.duration_s,
            "burstiness": opts.burstiness,
            "prompt_len": opts.prompt.spec,
            "output_len": opts.output.spec,
            "slo_ttft_s": opts.slo.ttft_s,
            "slo_tpot_s": opts.slo.tpot_s,
            "seed": opts.seed,
            "max_requests": opts.max_requests,
            "request_timeout_s": opts.request_timeout_s,
            "window_s": opts.window_s,
            "temperature": opts.temperature,
            "token_range": [opts.token_range.low, opts.token_range.high],
        },
    }
    files = {
        **result.body.get("files", {}),  # a scenario's own evidence files (isolation: NDJSON, trace)
        "report": str(opts.out_dir / REPORT_FILE),
        "plot": str(result.plot) if result.plot else None,
    }
    return scenario_report(
        "bench", result, header, lead=lead, files=files, evidence={"report": str(opts.out_dir / REPORT_FILE)}
    )


__all__ = ["REPORT_FILE", "UNSTATED_DEVICE_NOTE", "bench_report", "scenario_report"]
