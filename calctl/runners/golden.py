"""``calctl run-golden``: golden correctness of every model (or one) on a device (001 §12 Phase 1; 000 §18).

What one model's check judges (prefill logits, top-k, exact tokens; the first failure named by model,
step and position) is :func:`calctl.checks.golden.run_golden_model`, which the serving engine calls too
(golden before Ready, 001 §11.1). The run around it is the per-model skeleton
(:mod:`calctl.runners.per_model`): validate, configure, every model, teardown, one
:class:`~calctl.report.Report`; a hang stops the run with the models after it listed as not run.
This module does not print or write files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from calctl.checks.batch_golden import run_batch_golden
from calctl.checks.golden import GoldenResult, LogitCheck, check_logits, first_mismatch, judge, run_golden_model
from calctl.package.model import Package
from calctl.report import Report, StepStatus
from calctl.runners.device import DeviceSpec
from calctl.runners.per_model import PerModelCheck, run_per_model
from calctl.runners.steps import StepLog
from calctl.runtime import GenerationId, Runtime
from calctl.signing.policy import TrustPolicy


def run_golden(
    package: Path,
    *,
    trust: TrustPolicy,
    device: DeviceSpec,
    model: str | None = None,
    step_timeout_s: float = 30.0,
    generation: GenerationId = GenerationId(0),
    log: StepLog | None = None,
) -> Report:
    """``calctl run-golden``: every model of ``package`` (or exactly ``model``) on ``device``.

    Verdict PASS only when every model passed; FAIL names the first failing model,
    step and position; TIMEOUT (exit 4) keeps the models that finished and the
    partial result of the one that hung. Usage errors (an unknown ``--model``)
    raise :class:`calctl.errors.UsageError` after the teardown.
    """
    check = PerModelCheck(
        command="run-golden",
        step="golden",
        result_type=GoldenResult,
        run=lambda rt, pkg, alias: golden_with_batches(
            rt, pkg, alias, generation=generation, step_timeout_s=step_timeout_s
        ),
        detail=_detail,
        status=lambda r: StepStatus.PASS if r.ok else StepStatus.FAIL,
        failure=lambda r: r.reason or r.alias,
        body=lambda results, not_run: {"models": list(results), "not_run": not_run, "step_timeout_s": step_timeout_s},
    )
    return run_per_model(check, package, trust=trust, device=device, model=model, log=log)


def golden_with_batches(
    rt: Runtime, pkg: Package, alias: str, *, generation: GenerationId, step_timeout_s: float
) -> GoldenResult:
    """The B1 golden check, then (when it passed) every compiled decode profile B > 1 against its B1 twins
    (:mod:`calctl.checks.batch_golden`): a board that computes B1 right but crosses lanes or writes KV from an
    inactive lane fails here, naming the profile and lane."""
    result = run_golden_model(rt, pkg, alias, generation=generation, step_timeout_s=step_timeout_s)
    if not result.ok:
        return result
    batches = run_batch_golden(rt, pkg, alias, generation=generation, step_timeout_s=step_timeout_s)
    failed = next((b for b in batches if not b.ok), None)
    return dataclasses.replace(
        result, batch=batches, ok=failed is None, reason=failed.reason if failed is not None else None
    )


def _detail(r: GoldenResult) -> str:
    if not r.ok:
        return r.reason or "failed"
    err = f"{r.prefill_max_abs_err:.2g}" if r.prefill_max_abs_err is not None else "n/a"
    text = f"logits max |err| {err}, top-k agree, {len(r.got_tokens)}/{len(r.expected_tokens)} tokens exact"
    if r.batch:
        profiles = ", ".join(f"B{b.batch}" for b in r.batch)
        text += f"; {profiles}: every lane equal to its B1 twin (active-lane patterns with gaps included)"
    return text


__all__ = ["GoldenResult", "LogitCheck", "check_logits", "first_mismatch", "judge", "run_golden", "run_golden_model"]
