"""Warm-up of one model on a device: N iterations, per-graph latency and stability (001 §11.1, §12 Phase 1; 000 §18).

One iteration is the model's golden prompt through prefill plus ``decode_steps``
greedy decode jobs (B1), each job timed on the device's clock (the runtime's
own start/end stamps; on the mock its modelled duration), and also on the host
(submit until ``wait`` returned): the difference is host overhead, reported
beside the latency and never judged. A runtime that stamps no job leaves only
the host figure, and the result says its clock is ``host``.
The first iteration is the cold one (first touch of buffers, caches, lazy
initialisation): it is checked like every other but, when there is more than
one, left out of the latency statistics, which describe the warm state.
Per graph the result holds P50/P90/P99 latency and the coefficient of
variation. Stability follows the one decision rule
(:func:`calctl.checks.stats.decide`): a graph is ``unstable`` when the
bootstrap CI of its CV lies above :data:`CV_WARN` (a warning, not a failure:
jitter says "measure again", not "wrong"), stable when it lies at or below,
and ``not_judged`` when it straddles the limit or rests on fewer than
:data:`CV_MIN_SAMPLES` jobs.

Errors are jobs the device failed and iterations whose tokens left the golden
sequence (a warm-up that computes wrong tokens is not warm). An iteration that
fails is counted and the next one starts fresh; once a chip of the model is
halted (it needs a reset) the warm-up stops rather than count the same fault N
times. ``ok`` is "no errors".

Both the serving engine (warm-up before Ready, 001 §11.1) and ``calctl warmup``
(``calctl.runners.warmup``) call :func:`run_warmup_model`. This module does not
print, write files or configure the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calctl.checks.golden import first_mismatch
from calctl.checks.stats import Decision, Percentiles, bootstrap, decide, percentiles
from calctl.checks.steps import GoldenData, GreedyProgress, StepTimedOut, greedy_run, step_name
from calctl.errors import raise_dropped_signal
from calctl.package.model import Package
from calctl.runtime import GenerationId, Health, Runtime
from calctl.runtime.errors import RuntimeLayerError

#: Coefficient of variation above which a graph's latency is reported unstable.
CV_WARN = 0.25
#: Fewest warm jobs of a graph its CV's interval is judged from.
CV_MIN_SAMPLES = 3


@dataclass(frozen=True)
class WarmupResult:
    alias: str
    ok: bool
    iterations: int  # iterations attempted
    errors: int
    graphs: dict[str, Percentiles]  # per graph name: latency seconds on ``clock`` (device stamps, else host)
    unstable: tuple[str, ...]  # graph names whose CV's CI lies above CV_WARN (a warning, not a failure)
    first_error: str | None = None  # what the first error was, naming model, iteration and step
    clock: str = "device"  # "device": the runtime's job stamps; "host": it reported none for some job
    host_graphs: dict[str, Percentiles] | None = None  # per graph: host latency (submit -> wait returned)
    not_judged: tuple[str, ...] = ()  # graphs whose stability the rule could not decide
    stability: dict[str, Decision] | None = None  # per graph: the decision on its CV


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

    Raises :class:`calctl.checks.steps.StepTimedOut` (exit 4) when a wait exceeds
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
    latencies: dict[str, list[tuple[float, float | None]]] = {model.prefill.name: [], model.decode.name: []}
    errors = 0
    first_error: str | None = None
    attempted = 0

    def result() -> WarmupResult:
        on_device = all(d is not None for v in latencies.values() for _, d in v)
        chosen = {g: [(d if on_device and d is not None else h) for h, d in v] for g, v in latencies.items()}
        graphs = {g: percentiles(v) for g, v in chosen.items()}
        stability = {g: stability_of(v, g) for g, v in chosen.items()}
        return WarmupResult(
            alias=alias,
            ok=errors == 0 and attempted == iterations,
            iterations=attempted,
            errors=errors,
            graphs=graphs,
            unstable=tuple(g for g, d in stability.items() if d.passed is False),
            first_error=first_error,
            clock="device" if on_device else "host",
            host_graphs={g: percentiles([h for h, _ in v]) for g, v in latencies.items()},
            not_judged=tuple(g for g, d in stability.items() if d.passed is None),
            stability=stability,
        )

    for i in range(iterations):
        raise_dropped_signal()  # a signal whose raise a GC callback dropped stops a long warm-up here
        attempted += 1
        progress = GreedyProgress(alias)
        keep: dict[str, list[tuple[float, float | None]]] = latencies if (i > 0 or iterations == 1) else {}
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


def _record(latencies: dict[str, list[tuple[float, float | None]]], progress: GreedyProgress) -> None:
    for t in progress.timings:
        latencies.setdefault(t.graph, []).append((t.seconds, t.device_seconds))


def _cv(x: np.ndarray) -> float:
    mean = float(np.mean(x))
    return float(np.std(x, ddof=1) / mean) if len(x) > 1 and mean > 0 else float("nan")


def stability_of(values: list[float], graph: str = "latency") -> Decision:
    """The decision rule on a graph's CV: passed (stable) when its CI lies at or below :data:`CV_WARN`."""
    return decide(
        bootstrap(values, _cv, seed=11),
        CV_WARN,
        above=False,
        min_samples=CV_MIN_SAMPLES,
        what=f"{graph} CV",
        fmt=".3f",
    )


def _halted(rt: Runtime, chips: tuple[int, ...]) -> bool:
    try:
        return any(h.health in (Health.FAULTED, Health.HUNG) for h in rt.health() if h.chip in chips)
    except RuntimeLayerError:  # the runtime cannot even report health: do not keep hammering it
        return True


__all__ = ["CV_MIN_SAMPLES", "CV_WARN", "WarmupResult", "run_warmup_model", "stability_of"]
