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
(the serving engine calls it too, warm-up before Ready, 001 §11.1). :func:`run_warmup` is ``calctl warmup``,
the per-model skeleton (:mod:`calctl.runners.per_model`) around it: validate, configure, every model (or
one), teardown, one :class:`~calctl.report.Report`; a hang lists the models after it as not run. This
module does not print or write files.
"""

from __future__ import annotations

from pathlib import Path

from calctl.checks.warmup import CV_WARN, WarmupResult, run_warmup_model
from calctl.report import Report, StepStatus
from calctl.runners.device import DeviceSpec
from calctl.runners.per_model import PerModelCheck, run_per_model
from calctl.runners.steps import StepLog
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
    check = PerModelCheck(
        command="warmup",
        step="warmup",
        result_type=WarmupResult,
        run=lambda rt, pkg, alias: run_warmup_model(
            rt,
            pkg,
            alias,
            iterations=iterations,
            generation=generation,
            step_timeout_s=step_timeout_s,
            decode_steps=decode_steps,
        ),
        detail=describe,
        status=lambda r: StepStatus.FAIL if not r.ok else StepStatus.WARN if r.unstable else StepStatus.PASS,
        failure=lambda r: f"{r.alias}: {r.errors} error(s) in {r.iterations} iteration(s): {r.first_error}",
        body=lambda results, not_run: {
            "iterations": iterations,
            "decode_steps": decode_steps,
            "cv_warn": CV_WARN,
            "models": list(results),
            "not_run": not_run,
        },
    )
    return run_per_model(check, package, trust=trust, device=device, model=model, log=log)


def describe(r: WarmupResult) -> str:
    """One line: per graph P50/P99 in ms and CV, errors, unstable graphs."""
    parts = []
    for graph, p in r.graphs.items():
        if p.count:
            cv = f"{p.cv:.2f}" if p.cv is not None else "n/a"
            word, tail = p.tail()  # max below 100 jobs: never a P99 of 19 samples
            parts.append(f"{graph} P50 {_ms(p.p50)} {word} {_ms(tail)} CV {cv}")
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
