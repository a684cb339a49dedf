"""Warm-up of one model on a device: N iterations, per-graph latency and stability (001 §11.1, §12 Phase 1; 000 §18).

One iteration is the model's golden prompt through prefill plus ``decode_steps``
greedy decode jobs (B1), each job timed from submit until ``wait`` returned.
The first iteration is the cold one (first touch of buffers, caches, lazy
initialisation): it is checked like every other but, when there is more than
one, left out of the latency statistics, which describe the warm state.
Per graph the result holds P50/P90/P99 latency and the coefficient of
variation; a graph whose CV exceeds :data:`CV_WARN` is listed as ``unstable``
(a warning, not a failure: jitter says "measure again", not "wrong").

Errors are jobs the device failed and iterations whose tokens left the golden
sequence (a warm-up that computes wrong tokens is not warm). An iteration that
fails is counted and the next one starts fresh; once a chip of the model is
halted (it needs a reset) the warm-up stops rather than count the same fault N
times. ``ok`` is "no errors".

The per-model warm-up, :func:`run_warmup_model`, lives in ``calctl.checks.warmup``
(the serving engine calls it too, warm-up before Ready, 001 §11.1). :func:`run_warmup` is ``calctl warmup``:
validate, configure, every model (or one), teardown, one
:class:`~calctl.report.Report`. This module does not print or
write files.
"""

from __future__ import annotations

import time
from pathlib import Path

from calctl.checks.steps import StepTimedOut
from calctl.checks.warmup import CV_WARN, WarmupResult, run_warmup_model
from calctl.errors import CalctlError
from calctl.runners.context import (
    DeviceSpec,
    Outcome,
    Report,
    RunContext,
    StepLog,
    StepStatus,
    error_text,
    finish,
    outcome_of,
    reraise_usage,
    select_aliases,
)
from calctl.runtime import GenerationId
from calctl.signing.policy import TrustPolicy


def run_warmup(
    package: Path,
    *,
    trust: TrustPolicy,
    device: DeviceSpec,
    iterations: int,
    model: str | None = None,
    decode_steps: int = 8,
    step_timeout_s: float = 30.0,
    generation: GenerationId = GenerationId(0),
    log: StepLog | None = None,
) -> Report:
    """``calctl warmup``: ``iterations`` warm-up iterations of every model (or exactly ``model``).

    Verdict PASS when no model had an error (unstable latency is a WARN step,
    still PASS); FAIL otherwise; TIMEOUT (exit 4) when a step hung.
    """
    t0 = time.perf_counter()
    log = log or StepLog()
    results: list[WarmupResult] = []
    outcome, error = Outcome.PASS, None
    ctx = RunContext(package, trust=trust, device=device, log=log)
    try:
        with ctx:
            ctx.prepare()
            assert ctx.rt is not None and ctx.pkg is not None
            for alias in select_aliases(ctx.pkg, model):
                with log.step(f"warmup {alias}") as note:
                    try:
                        r = run_warmup_model(
                            ctx.rt,
                            ctx.pkg,
                            alias,
                            iterations=iterations,
                            generation=generation,
                            step_timeout_s=step_timeout_s,
                            decode_steps=decode_steps,
                        )
                    except StepTimedOut as exc:
                        if isinstance(exc.partial, WarmupResult):
                            results.append(exc.partial)
                        raise
                    results.append(r)
                    note.detail = describe(r)
                    if not r.ok:
                        note.status = StepStatus.FAIL
                    elif r.unstable:
                        note.status = StepStatus.WARN
    except (CalctlError, KeyboardInterrupt) as exc:
        reraise_usage(exc)
        outcome, error = outcome_of(exc), error_text(exc)
    if outcome is Outcome.PASS:
        failed = [r for r in results if not r.ok]
        if failed:
            outcome = Outcome.FAIL
            error = "; ".join(
                f"{r.alias}: {r.errors} error(s) in {r.iterations} iteration(s): {r.first_error}" for r in failed
            )
    body = {"iterations": iterations, "decode_steps": decode_steps, "cv_warn": CV_WARN, "models": results}
    return finish(ctx, "warmup", outcome.value, body, error, t0)


def describe(r: WarmupResult) -> str:
    """One line: per graph P50/P99 in ms and CV, errors, unstable graphs."""
    parts = []
    for graph, p in r.graphs.items():
        if p.count:
            cv = f"{p.cv:.2f}" if p.cv is not None else "n/a"
            parts.append(f"{graph} P50 {_ms(p.p50)} P99 {_ms(p.p99)} CV {cv}")
    text = f"{r.iterations} it, {r.errors} error(s); " + "; ".join(parts)
    if r.unstable:
        text += f"; unstable (CV CI above {CV_WARN}): {', '.join(r.unstable)}"
    if r.not_judged:
        text += f"; stability not judged (CV CI straddles {CV_WARN} or too few jobs): {', '.join(r.not_judged)}"
    if r.clock == "host":
        text += "; HOST clock (the runtime reports no job timestamps)"
    return text


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.2f} ms"


__all__ = ["CV_WARN", "WarmupResult", "describe", "run_warmup", "run_warmup_model"]
