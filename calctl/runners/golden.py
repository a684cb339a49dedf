"""Golden correctness of one model on a device (001 §12 Phase 1, §13.1 "单模型 golden"; 000 §18).

:func:`run_golden_model` runs the model's golden prompt through prefill and
greedy decode on an already configured runtime and judges three things against
the package's golden data, each with the tolerance the package declares:

* the prefill logits, ``allclose`` with the package's rtol/atol;
* top-k agreement: the same set of k highest logits (k from the package);
* the exact output token sequence.

The first failure, in step order, becomes the result's ``reason``: it names the
model, the step (``prefill`` or ``decode[k]``) and the position (vocabulary
index for logits, output token index and KV position for tokens).

The per-model check, :func:`run_golden_model`, lives in ``calctl.checks.golden``
(the serving engine calls it too, golden before Ready, 001 §11.1). :func:`run_golden` is ``calctl
run-golden``: validate, configure, every model (or one), teardown, one
:class:`~calctl.report.Report`; a hang stops the run with the
models after it listed as not run. This module does not print or write files.
"""

from __future__ import annotations

import time
from pathlib import Path

from calctl.checks.golden import GoldenResult, LogitCheck, check_logits, first_mismatch, judge, run_golden_model
from calctl.checks.steps import StepTimedOut
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
    t0 = time.perf_counter()
    log = log or StepLog()
    results: list[GoldenResult] = []
    not_run: list[dict[str, str]] = []
    outcome, error = Outcome.PASS, None
    ctx = RunContext(package, trust=trust, device=device, log=log)
    try:
        with ctx:
            ctx.prepare()
            assert ctx.rt is not None and ctx.pkg is not None
            aliases = select_aliases(ctx.pkg, model)
            for i, alias in enumerate(aliases):
                with log.step(f"golden {alias}") as note:
                    try:
                        r = run_golden_model(
                            ctx.rt, ctx.pkg, alias, generation=generation, step_timeout_s=step_timeout_s
                        )
                    except StepTimedOut as exc:
                        if isinstance(exc.partial, GoldenResult):
                            results.append(exc.partial)
                        not_run.extend({"alias": a, "reason": f"not run: {alias} hung"} for a in aliases[i + 1 :])
                        raise
                    except BaseException as exc:
                        not_run.extend(
                            {"alias": a, "reason": f"not run: {alias} failed ({type(exc).__name__})"}
                            for a in aliases[i + 1 :]
                        )
                        raise
                    results.append(r)
                    note.detail = _detail(r)
                    if not r.ok:
                        note.status = StepStatus.FAIL
    except (CalctlError, KeyboardInterrupt) as exc:
        reraise_usage(exc)
        outcome, error = outcome_of(exc), error_text(exc)
    if outcome is Outcome.PASS:
        failed = [r for r in results if not r.ok]
        if failed:
            outcome, error = Outcome.FAIL, "; ".join(r.reason or r.alias for r in failed)
    body = {"models": results, "not_run": not_run, "step_timeout_s": step_timeout_s}
    return finish(ctx, "run-golden", outcome.value, body, error, t0)


def _detail(r: GoldenResult) -> str:
    if not r.ok:
        return r.reason or "failed"
    err = f"{r.prefill_max_abs_err:.2g}" if r.prefill_max_abs_err is not None else "n/a"
    return f"logits max |err| {err}, top-k agree, {len(r.got_tokens)}/{len(r.expected_tokens)} tokens exact"


__all__ = ["GoldenResult", "LogitCheck", "check_logits", "first_mismatch", "judge", "run_golden", "run_golden_model"]
