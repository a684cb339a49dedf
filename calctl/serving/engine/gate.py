"""Golden + warm-up, the gate to Ready after a load or a recovery (000 §11 step 9; 001 §11.1, §11.2, §13.3).

An alias is Ready only after its golden prompt gave the golden answer and its
warm-up ran without an error, on the generation it will serve. After a load the
whole package passes or fails (:func:`golden_and_warmup`); after a recovery's
reset each alias is judged on its own (:func:`verify_each`, 001 §11.2 "分别
golden/warmup"): a wrong golden answer takes out that alias only (001 §11.3: a
numerical mismatch is the model generation's scope), while a device error
leaves the board's state unknown for all of them.
"""

from __future__ import annotations

import time

from calctl.checks.golden import run_golden_model
from calctl.checks.warmup import run_warmup_model
from calctl.errors import CheckFailed
from calctl.package.model import Package
from calctl.runtime.interface import Runtime
from calctl.runtime.types import GenerationId as RtGenerationId
from calctl.serving.engine.metrics import EngineMetrics
from calctl.serving.engine.options import SupervisorOptions


class GoldenMismatch(CheckFailed):
    """An alias's golden prompt gave the wrong answer on a board that ran it (001 §11.3: the alias's scope)."""


def golden_and_warmup(
    rt: Runtime, pkg: Package, aliases: list[str], gen: int, options: SupervisorOptions, metrics: EngineMetrics
) -> None:
    """Golden + warm-up of each alias in turn; :class:`GoldenMismatch` at the first wrong golden answer,
    CheckFailed for a warm-up with errors; a device error propagates as the device raised it."""
    for alias in aliases:
        t0 = time.monotonic()
        g = run_golden_model(rt, pkg, alias, generation=RtGenerationId(gen), step_timeout_s=options.step_timeout_s)
        if not g.ok:
            raise GoldenMismatch(f"{alias}: golden check failed before Ready: {g.reason}")
        if options.warmup_iterations > 0:
            w = run_warmup_model(
                rt,
                pkg,
                alias,
                iterations=options.warmup_iterations,
                generation=RtGenerationId(gen),
                step_timeout_s=options.step_timeout_s,
            )
            if not w.ok:
                raise CheckFailed(f"{alias}: warm-up had {w.errors} error(s) in {w.iterations} iterations")
        metrics.lifecycle.labels(alias, "warmup").observe(time.monotonic() - t0)


def verify_each(
    rt: Runtime, pkg: Package, aliases: list[str], gen: int, options: SupervisorOptions, metrics: EngineMetrics
) -> dict[str, str]:
    """A recovery's golden + warm-up, alias by alias: {alias: why} for each whose golden answer was wrong, to
    leave service alone (001 §11.1 Warming -> Failed: mismatch). A device error or a warm-up with errors
    raises: every alias of the recovery is then Failed (001 §11.3: the board's state is unknown)."""
    wrong: dict[str, str] = {}
    for alias in aliases:
        try:
            golden_and_warmup(rt, pkg, [alias], gen, options, metrics)
        except GoldenMismatch as exc:
            wrong[alias] = str(exc)
    return wrong


__all__ = ["GoldenMismatch", "golden_and_warmup", "verify_each"]
