"""The acceptance rows: gates G0–G5 (001 §17) and milestones M0–M4 (000 §19), and what their judges share.

Each row is a :class:`RowSpec` (id, title, the report's condition with its
section, the report's No-Go action) and a judge: a pure function from the
evidence steps of a run (:class:`StepEvidence`, by name) to a
:class:`RowResult` with a :class:`GateDecision` **GO**, **NO-GO** or
**NOT MEASURED**. The judges live by family: the gates in
:mod:`~calctl.runners.acceptance.gates`, the milestones in
:mod:`~calctl.runners.acceptance.milestones`; the table of them and the
evidence-file rule in :mod:`~calctl.runners.acceptance.judges`.

Rules every judge keeps:

* a row whose evidence step did not run (skipped, not applicable, interrupted,
  ended in an error) is NOT MEASURED with why and what would measure it
  (:func:`need` inside a :func:`judge`);
* a requirement of duration or count that was not reached (24 h, 100 cycles,
  8 h of switching) is NOT MEASURED with what was reached, unless what was
  measured already failed (then NO-GO);
* a NO-GO carries the report's action (001 §17 column 3; for M rows the
  consequence 000 §19 states).

This module does no I/O, runs nothing and prints nothing.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from calctl.report import StepStatus, step_status_of


class GateDecision(str, enum.Enum):
    """What a row concludes (docs/accept.md): not the PASS/FAIL words of a step (:class:`calctl.report.StepStatus`)."""

    GO = "GO"
    NO_GO = "NO-GO"
    NOT_MEASURED = "NOT MEASURED"


#: The statuses of an evidence step that ran to the end (:class:`calctl.report.StepStatus`, the words every
#: command's steps carry): its document holds what it measured, a failing measurement (FAIL) included. Only
#: these carry evidence a row may judge. A step that did not (SKIP: it does not apply; ERROR: it could not
#: measure, a device error, a timeout, a refused package; INTERRUPTED) says why in its ``detail``.
RAN: frozenset[StepStatus] = frozenset({StepStatus.PASS, StepStatus.WARN, StepStatus.FAIL})


def ran_status(verdict: str) -> StepStatus:
    """The status of an evidence step that ran to the end, from its own report's ``verdict``
    (:func:`calctl.report.step_status_of`: FAIL for a failed check, WARN for WARN/S1/NOT JUDGED, ERROR for a
    run that could not measure, else PASS). Only the FAIL/ERROR split matters to the rows: ERROR is "did not
    measure"."""
    status = step_status_of(verdict)
    return StepStatus.ERROR if status in (StepStatus.TIMEOUT, StepStatus.INTERRUPTED) else status


@dataclass(frozen=True)
class StepEvidence:
    """One evidence step of an acceptance run: its status, its own document and the files it kept.

    ``files`` maps a label to a path relative to the report directory.
    """

    name: str
    status: StepStatus
    seconds: float = 0.0
    key_figure: str = ""  # the one figure a person looks at first (with the step's own verdict word)
    detail: str = ""  # SKIP / ERROR / INTERRUPTED: why; WARN: what to look at
    document: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    @property
    def ran(self) -> bool:
        return self.status in RAN

    def to_dict(self) -> dict[str, Any]:
        """The step as every report lists it (``name``, ``status``, ``seconds``, ``detail``), with its figure
        and files."""
        return {
            "name": self.name,
            "status": self.status.value,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
            "key_figure": self.key_figure,
            "files": dict(self.files),
        }


@dataclass(frozen=True)
class RowSpec:
    id: str
    title: str
    condition: str  # the report's Go condition, paraphrased, with its section
    source: str
    no_go_action: str  # 001 §17 column 3, or the consequence 000 §19 states
    steps: tuple[str, ...]  # the evidence steps the row reads
    measured_by: str  # the command that measures it on its own (docs/accept.md)


@dataclass(frozen=True)
class RowResult:
    id: str
    title: str
    condition: str
    source: str
    verdict: GateDecision
    key_figure: str  # the one figure a person looks at first
    evidence: tuple[str, ...] = ()  # figures, with CIs where the source gives them
    files: dict[str, str] = field(default_factory=dict)  # label -> path relative to the report directory
    reason: str = ""  # NO-GO: what failed; NOT MEASURED: why not
    how_to_measure: str = ""  # NOT MEASURED: what would measure it
    action: str = ""  # NO-GO: the report's action
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "condition": self.condition,
            "source": self.source,
            "verdict": self.verdict.value,
            "key_figure": self.key_figure,
            "evidence": list(self.evidence),
            "files": dict(self.files),
            "reason": self.reason,
            "how_to_measure": self.how_to_measure,
            "action": self.action if self.verdict is GateDecision.NO_GO else "",
            "data": self.data,
        }


Steps = Mapping[str, StepEvidence]

# ---------------------------------------------------------------------------
# The rows

ACCEPT_LONG = "`calctl accept PKG --level long`"
REPLICA_HINT = (
    "needs a replica package (one model on both chips): `calctl sample-package --kind replica --key K OUT` "
    "or `calctl combine --replica ...`, then `calctl accept PKG --replica OUT`"
)

G0 = RowSpec(
    "G0",
    "per-chip capacity",
    "static budget and the load peak both leave the guard on every chip: static <= 80 % of the chip's DRAM and "
    "reserve >= max(1 GiB, 15 %), each chip on its own (001 §17 G0, §8.2)",
    "001 §17, §8",
    "shrink the model, context or batch; never force it in (001 §17: 缩模型/context/batch，禁止硬塞)",
    ("budget", "load-peak"),
    "`calctl budget PKG`; device memory at load: `calctl accept`",
)
G1 = RowSpec(
    "G1",
    "per-chip correctness",
    "golden passes on chip 0 and on chip 1, each on its own (001 §17 G1, §12 Phase 1, §13.1)",
    "001 §17, §12 Phase 1",
    "back to compiler/kernel debugging (001 §17: 回到 compiler/kernel 调试)",
    ("run-golden", "replica-golden"),
    "`calctl run-golden PKG`",
)
G2 = RowSpec(
    "G2",
    "replica isolation",
    "A0 on chip 0 and A1 on chip 1: at least 1,000 requests (different prompts, lengths, cancellation times) "
    "without buffer, KV, job or sequence-id crosstalk (001 §17 G2, §12 Phase 2, §13.1)",
    "001 §17, §12 Phase 2, §13.1",
    "do not enter the different-models phase (001 §17: 不进入不同模型阶段)",
    ("isolation",),
    "`calctl bench REPLICA --scenario isolation`",
)
G3 = RowSpec(
    "G3",
    "S2 concurrency",
    "the per-chip trace shows chip 0 and chip 1 computing together, overlap_ratio's CI above 0 and "
    "throughput_efficiency >= 0.80 (001 §17 G3, §13.2)",
    "001 §17, §13.2",
    "declare S1 only, investigate the global runtime lock / shared bottleneck (001 §17: 只声明 S1，调查全局锁/共享瓶颈)",
    ("poc",),
    "`calctl poc combined PKG --expect-models A,B`",
)
G4 = RowSpec(
    "G4",
    "fault domain",
    "at least F1 (request and resource faults isolated; CCU/timeout/reset may share the fault domain) and a "
    "deterministic recovery: every recovery succeeded and both models were Ready again (001 §17 G4, §13.4)",
    "001 §17, §13.4",
    "bind both aliases to one health state and take them out of service together "
    "(001 §17: 两 alias 绑定同一健康状态并同时摘流)",
    ("fault-isolation",),
    "`calctl bench PKG --scenario fault-isolation` (mock)",
)
G5 = RowSpec(
    "G5",
    "production",
    "24 h mixed soak, 100 lifecycle cycles and the rollback to the previous version (under traffic) all pass "
    "(001 §17 G5, §12 Phase 5, §13.3)",
    "001 §17, §13.3",
    "keep the single-model or the two-board plan (001 §17: 保留单模型或两板方案)",
    ("soak", "rollback"),
    "`calctl soak PKG --hours 24`; `calctl accept PKG --previous OLD_PKG` for the rollback",
)
M0 = RowSpec(
    "M0",
    "B1 stable",
    "a B1 package serves 24 h with no abort, busy-wait, crosstalk or leak, every error code visible (000 §19 M0)",
    "000 §19 M0",
    "B1 is not stable: fix it before building M1–M4 on it (000 §19 M0)",
    ("soak",),
    "`calctl soak PKG --hours 24`",
)
M1 = RowSpec(
    "M1",
    "async in-flight = 1",
    "behaviour equivalent to the synchronous baseline, P50 regression <= 3 %, P99 <= 5 % (000 §19 M1)",
    "000 §19 M1",
    "keep the synchronous executor: async in-flight=1 is not enabled (000 §19 M1)",
    ("executor-modes",),
    "`calctl bench PKG --scenario executor-modes`",
)
M2 = RowSpec(
    "M2",
    "ping/pong",
    "aggregate throughput +10 % or more, P99 regression <= 5 %, and 24 h without errors (000 §19 M2)",
    "000 §19 M2",
    "ping/pong is not enabled by default (000 §19 M2: 才默认启用)",
    ("executor-modes", "soak"),
    "`calctl bench PKG --scenario executor-modes`, then a 24 h soak",
)
M3 = RowSpec(
    "M3",
    "batch",
    "every lane correct, fill ratio / throughput / P99 meet the project's targets, a KV fault recoverable (000 §19 M3)",
    "000 §19 M3",
    "do not advertise continuous batching (000 §19 M3: 没有这些数据不宣传 continuous batching)",
    ("batch",),
    "`calctl bench PKG --scenario batch`",
)
M4 = RowSpec(
    "M4",
    "multi-model lifecycle",
    "100 load/unload cycles, an 8 h model-switching soak, resources back to baseline, generation isolation, "
    "one-call rollback to the old version (000 §19 M4)",
    "000 §19 M4",
    "no multi-model lifecycle in production: keep the resident set fixed, no hot load/unload or switching (000 §19 M4)",
    ("soak", "rollback"),
    "`calctl soak PKG --cycles 100` and `--hours 8`; `calctl accept PKG --previous OLD_PKG` for the rollback",
)

ROWS: tuple[RowSpec, ...] = (G0, G1, G2, G3, G4, G5, M0, M1, M2, M3, M4)

#: Requirements of duration and count (001 §13.3, 000 §19).
SOAK_HOURS_G5 = 24.0
LIFECYCLE_CYCLES = 100
SOAK_HOURS_M0 = 24.0
SOAK_HOURS_M2 = 24.0
SWITCH_HOURS_M4 = 8.0
ISOLATION_REQUESTS = 1000


# ---------------------------------------------------------------------------
# What the judges share


def row_result(spec: RowSpec, verdict: GateDecision, key: str, **kw: Any) -> RowResult:
    action = spec.no_go_action if verdict is GateDecision.NO_GO else ""
    return RowResult(spec.id, spec.title, spec.condition, spec.source, verdict, key, action=action, **kw)


def not_measured(spec: RowSpec, reason: str, how: str, **kw: Any) -> RowResult:
    return row_result(
        spec, GateDecision.NOT_MEASURED, kw.pop("key", "not measured"), reason=reason, how_to_measure=how, **kw
    )


def not_run(spec: RowSpec, steps: Steps, *names: str) -> RowResult | None:
    """NOT MEASURED when a step the row needs did not run, with the step's own reason."""
    for name in names:
        s = steps.get(name)
        if s is None:  # not reached yet (a checkpoint of a run still going)
            return not_measured(spec, f"{name}: not reached", f"let the run reach {name}: {spec.measured_by}")
        if not s.ran:
            what = {StepStatus.SKIP: "not run", StepStatus.INTERRUPTED: "interrupted"}.get(
                s.status, "could not measure"
            )
            how = s.document.get("how_to_measure") or spec.measured_by
            return not_measured(spec, f"{name} {what}: {s.detail}", how)
    return None


def step_files(*steps: StepEvidence | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for s in steps:
        if s is not None:
            out.update({f"{s.name}.{k}": v for k, v in s.files.items()})
    return out


def estimate(d: Mapping[str, Any] | None, fmt: str = ".3f") -> str:
    if not d or d.get("mean") is None:
        return "n/a"
    lo, hi = d.get("ci_low"), d.get("ci_high")
    ci = f" [{lo:{fmt}}, {hi:{fmt}}] 95 % CI" if lo is not None and hi is not None else " (no CI)"
    return f"{d['mean']:{fmt}}{ci}"


def gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.3f} GiB"


@dataclass(frozen=True)
class Reading:
    """What a judge read for its row (key figure, evidence lines, files, data); each decision is then one call."""

    spec: RowSpec
    key: str
    evidence: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    def go(self) -> RowResult:
        return row_result(
            self.spec, GateDecision.GO, self.key, evidence=self.evidence, files=self.files, data=self.data
        )

    def no_go(self, reason: str) -> RowResult:
        return row_result(
            self.spec,
            GateDecision.NO_GO,
            self.key,
            evidence=self.evidence,
            files=self.files,
            data=self.data,
            reason=reason,
        )

    def not_measured(self, reason: str, how: str) -> RowResult:
        return not_measured(
            self.spec, reason, how, key=self.key, evidence=self.evidence, files=self.files, data=self.data
        )


# ---------------------------------------------------------------------------
# A judge: a step not run is the row NOT MEASURED


class NotRun(Exception):
    """Raised by :func:`need`: a step the row reads did not run; ``row`` is the row NOT MEASURED saying why."""

    def __init__(self, row: RowResult) -> None:
        super().__init__(row.reason)
        self.row = row


def need(spec: RowSpec, steps: Steps, name: str) -> StepEvidence:
    """The evidence step ``name`` when it ran; else :class:`NotRun` (the row NOT MEASURED with the step's reason)."""
    row = not_run(spec, steps, name)
    if row is not None:
        raise NotRun(row)
    return steps[name]


Judge = Callable[[Steps], RowResult]


def judge(spec: RowSpec) -> Callable[[Callable[[RowSpec, Steps], RowResult]], Judge]:
    """The judge of ``spec``'s row: called with the steps; a :class:`NotRun` inside is the row's result."""

    def wrap(fn: Callable[[RowSpec, Steps], RowResult]) -> Judge:
        @functools.wraps(fn)
        def judged(steps: Steps) -> RowResult:
            try:
                return fn(spec, steps)
            except NotRun as not_ran:
                return not_ran.row

        return judged

    return wrap


__all__ = [
    "RAN",
    "ROWS",
    "GateDecision",
    "Judge",
    "NotRun",
    "Reading",
    "RowResult",
    "RowSpec",
    "StepEvidence",
    "Steps",
    "estimate",
    "gib",
    "judge",
    "need",
    "not_measured",
    "not_run",
    "ran_status",
    "row_result",
    "step_files",
]
