"""The one skeleton of a per-model device run: ``run-golden`` and ``warmup``.

Validate, configure, run one check per model (every alias, or exactly ``--model``) as a logged step,
tear down, one :class:`~calctl.report.Report`. A step that hangs keeps its partial result and lists the
models after it as not run; an exception ends the run with its outcome (a usage error is re-raised after
the teardown, exit 2). PASS only when every model's result is ok; else FAIL with each failure named.

The runners say only what differs: how one model is checked, how a result reads in its step, and what
the body holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from calctl.checks.steps import StepTimedOut
from calctl.package.model import Package
from calctl.report import Report, StepStatus
from calctl.runners.context import select_aliases
from calctl.runners.device import DeviceSpec
from calctl.runners.driver import Ended, Run, RunState, RunStep, drive
from calctl.runners.steps import RunOutcome, StepLog, StepNote
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
    hung: list[R] = []  # the partial result of a model that hung (StepTimedOut.partial)

    def one(alias: str) -> RunStep:
        def body(s: RunState, note: StepNote) -> R:
            assert s.ctx is not None and s.ctx.pkg is not None
            try:
                r = check.run(s.rt, s.ctx.pkg, alias)
            except StepTimedOut as exc:
                if isinstance(exc.partial, check.result_type):
                    hung.append(exc.partial)
                raise
            note.detail, note.status = check.detail(r), check.status(r)
            return r

        return RunStep(f"{check.step} {alias}", body)

    def steps(s: RunState) -> list[RunStep]:
        assert s.ctx is not None and s.ctx.pkg is not None
        return [one(alias) for alias in select_aliases(s.ctx.pkg, model)]

    def report(s: RunState, ended: Ended) -> Report:
        results = [r for r in s.results.values() if r is not None] + hung
        why = "hung" if isinstance(ended.exc, StepTimedOut) else f"failed ({type(ended.exc).__name__})"
        prefix = len(check.step) + 1
        not_run = (
            [{"alias": n[prefix:], "reason": f"not run: {ended.stopped_at[prefix:]} {why}"} for n in ended.not_run]
            if ended.stopped_at is not None
            else []
        )
        outcome, error = ended.outcome, ended.error
        failed = [r for r in results if not r.ok]
        if outcome is RunOutcome.PASS and failed:
            outcome, error = RunOutcome.FAIL, "; ".join(check.failure(r) for r in failed)
        return s.finish(outcome.value, check.body(results, not_run), error)

    run = Run(check.command, device, steps, report, package=package, trust=trust)
    return drive(run, log=log)


__all__ = ["ModelResult", "PerModelCheck", "run_per_model"]
