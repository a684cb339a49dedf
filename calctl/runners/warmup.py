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

The serving engine calls :func:`run_warmup_model` after golden at load time
(warm-up before Ready, 001 §11.1). :func:`run_warmup` is ``calctl warmup``:
validate, configure, every model (or one), teardown, one
:class:`~calctl.runners.context.RunReport`. This module does not print or
write files.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from calctl.errors import CalctlError
from calctl.package.model import Package
from calctl.runners.context import (
    DeviceSpec,
    Outcome,
    RunContext,
    RunReport,
    StepLog,
    StepStatus,
    error_text,
    finish,
    outcome_of,
    reraise_usage,
    select_aliases,
)
from calctl.runners.golden import first_mismatch
from calctl.runners.stats import Percentiles, percentiles
from calctl.runners.steps import GoldenData, GreedyProgress, StepTimedOut, greedy_run, step_name
from calctl.runtime import GenerationId, Health, Runtime
from calctl.runtime.errors import RuntimeLayerError
from calctl.signing.policy import TrustPolicy

#: Coefficient of variation above which a graph's latency is reported unstable.
CV_WARN = 0.25


@dataclass(frozen=True)
class WarmupResult:
    alias: str
    ok: bool
    iterations: int  # iterations attempted
    errors: int
    graphs: dict[str, Percentiles]  # per graph name: host latency seconds (submit -> wait returned)
    unstable: tuple[str, ...]  # graph names whose CV exceeded CV_WARN (a warning, not a failure)
    first_error: str | None = None  # what the first error was, naming model, iteration and step


def run_warmup_model(
    rt: Runtime,
    pkg: Package,
    alias: str,
    *,
    iterations: int,
    generation: GenerationId = GenerationId(0),
    step_timeout_s: float = 30.0,
    decode_steps: int = 8,
) -> WarmupResult:
    """Warm ``alias`` up on ``rt`` (``pkg`` must be configured there) for ``iterations`` iterations.

    Raises :class:`calctl.runners.steps.StepTimedOut` (exit 4) when a wait exceeds
    ``step_timeout_s``; its ``partial`` is the WarmupResult of the iterations before.
    """
    if iterations < 1:
        raise ValueError("iterations must be >= 1")
    if decode_steps < 0:
        raise ValueError("decode_steps must be >= 0")
    model = pkg.model(alias)
    golden = GoldenData.load(pkg, alias)
    room = model.decode.max_seq - len(golden.prompt)
    n_tokens = 1 + max(0, min(decode_steps, room))
    expected = golden.tokens[:n_tokens]
    latencies: dict[str, list[float]] = {model.prefill.name: [], model.decode.name: []}
    errors = 0
    first_error: str | None = None
    attempted = 0

    def result() -> WarmupResult:
        graphs = {g: percentiles(v) for g, v in latencies.items()}
        unstable = tuple(g for g, p in graphs.items() if p.cv is not None and p.cv > CV_WARN)
        return WarmupResult(
            alias=alias,
            ok=errors == 0 and attempted == iterations,
            iterations=attempted,
            errors=errors,
            graphs=graphs,
            unstable=unstable,
            first_error=first_error,
        )

    for i in range(iterations):
        attempted += 1
        progress = GreedyProgress(alias)
        keep: dict[str, list[float]] = latencies if (i > 0 or iterations == 1) else {}
        try:
            greedy_run(
                rt,
                model,
                golden.prompt,
                n_tokens,
                progress=progress,
                generation=generation,
                step_timeout_s=step_timeout_s,
            )
        except StepTimedOut as exc:
            _record(keep, progress)
            errors += 1
            first_error = first_error or f"iteration {i}: {exc}"
            exc.partial = result()
            raise
        except RuntimeLayerError as exc:
            _record(keep, progress)
            errors += 1
            first_error = first_error or f"{alias}: iteration {i}: {progress.current_step or 'setup'}: {exc.message}"
            if _halted(rt, model.target_chips):
                first_error += " (a chip of the model is halted; warm-up stopped)"
                break
            continue
        _record(keep, progress)
        bad = first_mismatch(expected, tuple(progress.tokens))
        if bad is not None:
            errors += 1
            first_error = first_error or (
                f"{alias}: iteration {i}: {step_name(bad)}: output token {bad} is {progress.tokens[bad]}, "
                f"golden {expected[bad]}"
            )
    return result()


def _record(latencies: dict[str, list[float]], progress: GreedyProgress) -> None:
    for t in progress.timings:
        latencies.setdefault(t.graph, []).append(t.seconds)


def _halted(rt: Runtime, chips: tuple[int, ...]) -> bool:
    try:
        return any(h.health in (Health.FAULTED, Health.HUNG) for h in rt.health() if h.chip in chips)
    except RuntimeLayerError:  # the runtime cannot even report health: do not keep hammering it
        return True


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
) -> RunReport:
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
    return finish(ctx, "warmup", outcome.value, outcome.exit_code, body, error, t0)


def describe(r: WarmupResult) -> str:
    """One line: per graph P50/P99 in ms and CV, errors, unstable graphs."""
    parts = []
    for graph, p in r.graphs.items():
        if p.count:
            cv = f"{p.cv:.2f}" if p.cv is not None else "n/a"
            parts.append(f"{graph} P50 {_ms(p.p50)} P99 {_ms(p.p99)} CV {cv}")
    text = f"{r.iterations} it, {r.errors} error(s); " + "; ".join(parts)
    if r.unstable:
        text += f"; unstable (CV > {CV_WARN}): {', '.join(r.unstable)}"
    return text


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.2f} ms"


__all__ = ["CV_WARN", "WarmupResult", "describe", "run_warmup", "run_warmup_model"]
