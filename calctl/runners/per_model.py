"""The one skeleton of a per-model device run: ``run-golden`` and ``warmup``.

Validate, configure, run one check per model (every alias, or exactly ``--model``) as a logged step,
tear down, one :class:`~calctl.report.Report`. A step that hangs keeps its partial result and lists the
models after it as not run; an exception ends the run with its outcome (a usage error is re-raised after
the teardown, exit 2). PASS only when every model's result is ok; else FAIL with each failure named.

The runners say only what differs: how one model is checked, how a result reads in its step, and what
the body holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from calctl.checks.steps import StepTimedOut
from calctl.errors import CalctlError
from calctl.package.model import Package
from calctl.report import Report, StepStatus
from calctl.runners.context import RunContext, finish, select_aliases
from calctl.runners.device import DeviceSpec
from calctl.runners.steps import RunOutcome, StepLog, error_text, outcome_of, reraise_usage
from calctl.runtime import Runtime
from calctl.signing.policy import TrustPolicy


class ModelResult(Protocol):
    @property
    def alias(self) -> str: ...

    @property
    def ok(self) -> bool: ...


R = TypeVar("R", bound=ModelResult)


@dataclass(frozen=True)
class PerModelCheck(Generic[R]):
    """What a per-model runner is: its command, its step name, and how one model is checked and read."""

    command: str  # run-golden | warmup
    step: str  # the step name before the alias: "golden model-a"
    result_type: type[R]  # the partial result a hang carries (StepTimedOut.partial)
    run: Callable[[Runtime, Package, str], R]
    detail: Callable[[R], str]  # the step's detail line
    status: Callable[[R], StepStatus]  # PASS, WARN or FAIL of the step
    failure: Callable[[R], str]  # what the run's error says about a failed model
    body: Callable[[Sequence[R], list[dict[str, str]]], dict[str, Any]]  # the report's body: results, not run


def run_per_model(
    check: PerModelCheck[R],
    package: Path,
    *,
    trust: TrustPolicy,
    device: DeviceSpec,
    model: str | None,
    log: StepLog | None,
) -> Report:
    t0 = time.perf_counter()
    log = log or StepLog()
    results: list[R] = []
    not_run: list[dict[str, str]] = []
    outcome, error = RunOutcome.PASS, None
    ctx = RunContext(package, trust=trust, device=device, log=log)
    try:
        with ctx:
            ctx.prepare()
            assert ctx.rt is not None and ctx.pkg is not None
            aliases = select_aliases(ctx.pkg, model)
            for i, alias in enumerate(aliases):
                with log.step(f"{check.step} {alias}") as note:
                    try:
                        r = check.run(ctx.rt, ctx.pkg, alias)
                    except StepTimedOut as exc:
                        if isinstance(exc.partial, check.result_type):
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
                    note.detail = check.detail(r)
                    note.status = check.status(r)
    except (CalctlError, KeyboardInterrupt) as exc:
        reraise_usage(exc)
        outcome, error = outcome_of(exc), error_text(exc)
    if outcome is RunOutcome.PASS:
        failed = [r for r in results if not r.ok]
        if failed:
            outcome, error = RunOutcome.FAIL, "; ".join(check.failure(r) for r in failed)
    return finish(ctx, check.command, outcome.value, check.body(results, not_run), error, t0)


__all__ = ["ModelResult", "PerModelCheck", "run_per_model"]
