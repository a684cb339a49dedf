"""The combined-calbin PoC: exactly the fixed flow of 001 §6.4, with S1/S2 evidence (001 §1, §13.2; §12 Phases 2–3).

In this order, each step logged with its status (a step that is not reached is
logged SKIP with the reason, so a report shows, e.g., that configure never ran):

1. ``open device`` (CreateVDevice);
2. ``validate package`` – the static validator with the exact expected model
   set (MAN004) and the device's runtime version;
3. ``load package``, ``create calbin`` (CreateCalbin; a calbin the runtime
   refuses is exit 1);
4. ``check names and chip targets`` – on the calbin's own plan: the model
   aliases are exactly ``--expect-models`` (exact strings, as a set), each
   model is SCHIP on one chip of its own with exactly one prefill and one
   decode graph there, graph names are unique, and no section of a model
   carries a chip mask other than its chip (no overreach, no cross-chip or
   cross-model section). Any problem exits 1 **before configure**;
5. ``configure`` – exactly once;
6. ``allocate A/B buffers`` – each model its own prefill and decode buffers,
   never shared;
7. ``golden A``, ``golden B`` – one after the other; then, when a decode graph compiles profiles B > 1,
   ``batch profiles`` – both models' profiles against their B1 twins at once, from two threads
   (:mod:`calctl.checks.batch_golden`; not logged for a B1-only package);
8. ``concurrent rounds`` – per round: A alone, B alone, then A and B together
   from two threads (each a prefill + greedy decode of its prompt), timed on
   the device's clock from the runtime's per-chip job stamps
   (:func:`calctl.runners.overlap.device_seconds`); the host's wall time of
   each phase is kept beside it and the difference reported as host overhead.
   After the requested rounds, while a gate's interval still straddles its
   limit, one more round at a time up to ``max_rounds`` (the level's budget);
9. ``verify outputs`` – every output of every round against its reference
   (no crosstalk, 001 §13.1): the golden tokens, or for the second replica
   alias (same weights and prompt as the first) a shorter prompt, checked
   against its own first isolated run, so that outputs of the two chips differ
   and crosstalk would show (Phase 2: "different prompts, different lengths");
10. ``overlap verdict`` – overlap_ratio, throughput_efficiency and the
    per-chip trace share, each with a bootstrap CI over rounds, judged by the
    one decision rule (:func:`calctl.runners.overlap.judge`): S2 when every
    CI lies on its passing side (trace share above 25 %, overlap above 0,
    efficiency above 0.80), S1 when one lies on the failing side (reasons
    name the evidence), NOT JUDGED with the intervals and the round count
    when one still straddles its limit after the budget;
11. ``drain``, ``reset configuration``, ``release`` (the RunContext teardown).

On the mock the verdict shows that the tool tells S1 from S2; it is not
evidence about a board (docs/runtime.md §5): the report says so. This module does not
print or write files.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calctl.checks.batch_golden import batch_profiles, run_batch_golden
from calctl.checks.stats import until_decided
from calctl.checks.steps import GoldenData, GreedyProgress, JobBuffers, StepTimedOut, at_once, greedy_run, step_name
from calctl.errors import CheckFailed, UsageError
from calctl.package.model import ChipMode, GraphKind, Package, mask_of_chips
from calctl.report import Report, StepStatus
from calctl.runners.context import RunContext
from calctl.runners.device import DeviceSpec
from calctl.runners.driver import Ended, Opening, Run, RunState, RunStep, drive
from calctl.runners.golden import GoldenResult, first_mismatch
from calctl.runners.golden import judge as judge_golden
from calctl.runners.overlap import (
    NOT_JUDGED,
    ConcurrencyVerdict,
    JobSpan,
    OverlapRound,
    device_seconds,
    host_overhead,
    joint_share,
    judge,
)
from calctl.runners.steps import RunOutcome, StepLog, StepNote
from calctl.runners.trace import Mark
from calctl.runtime import GenerationId, Runtime
from calctl.runtime.calbin import CalbinPlan
from calctl.signing.policy import TrustPolicy

#: Default mock time_scale for the PoC: simulated jobs long enough (12–20 ms) that the
#: Python host overhead of the mock (well under 1 ms a job) does not dominate the measurement.
POC_MOCK_TIME_SCALE = 4.0
#: 001 §13.1: "at least 1000 requests without cross-model token, logits, KV or sequence-id crosstalk".
CROSSTALK_GATE_REQUESTS = 1000
GENERATION = GenerationId(1)


# ---------------------------------------------------------------------------
# Step 4: exact names and chip targets, on the calbin's own plan


def check_combined_calbin(plan: CalbinPlan, expect_models: tuple[str, ...]) -> list[str]:
    """Every reason the calbin is not a two-model combined calbin with exactly ``expect_models`` (001 §6.1, §6.4)."""
    pkg: Package = plan.package
    problems: list[str] = []
    aliases = [m.alias for m in pkg.models]
    dup_aliases = sorted(a for a, n in Counter(aliases).items() if n > 1)
    if dup_aliases:
        problems.append(f"duplicate model alias {', '.join(map(repr, dup_aliases))}")
    if set(aliases) != set(expect_models):
        problems.append(
            f"the calbin's models {sorted(set(aliases))} are not exactly the expected {sorted(expect_models)}"
        )
    graph_names = [g.name for g in pkg.graphs]
    dup_graphs = sorted(g for g, n in Counter(graph_names).items() if n > 1)
    if dup_graphs:
        problems.append(f"duplicate graph name {', '.join(map(repr, dup_graphs))}")
    owner: dict[int, str] = {}
    for m in pkg.models:
        if m.chip_mode is not ChipMode.SCHIP or len(m.target_chips) != 1:
            problems.append(
                f"model {m.alias!r} is {m.chip_mode.value} on chips {list(m.target_chips)}; "
                "each model must be SCHIP on exactly one chip"
            )
            continue
        chip = m.target_chips[0]
        if chip in owner:
            problems.append(f"models {owner[chip]!r} and {m.alias!r} both target chip {chip}; each needs its own chip")
        owner.setdefault(chip, m.alias)
        mask = mask_of_chips([chip])
        kinds = Counter(g.kind for g in m.graphs)
        if kinds[GraphKind.PREFILL] != 1 or kinds[GraphKind.DECODE] != 1 or len(m.graphs) != 2:
            problems.append(
                f"model {m.alias!r} has {kinds[GraphKind.PREFILL]} prefill and {kinds[GraphKind.DECODE]} "
                "decode graphs; expected exactly one of each"
            )
        for g in m.graphs:
            if g.chip_mode is not ChipMode.SCHIP or tuple(g.target_chips) != (chip,):
                problems.append(
                    f"graph {g.name!r} of {m.alias!r} is {g.chip_mode.value} on chips {list(g.target_chips)}, "
                    f"expected SCHIP on chip {chip}"
                )
        for sec in m.all_sections():
            if sec.chip_mask != mask:
                # 001 §6.2 item 4: A's sections never carry B's chip, and there is no cross-chip section.
                problems.append(
                    f"section {sec.name!r} of {m.alias!r} has chipMask {sec.chip_mask:#x}; "
                    f"the model is on chip {chip} (mask {mask:#x} only)"
                )
    if len(pkg.models) != 2:
        problems.append(f"the calbin holds {len(pkg.models)} model(s); the combined PoC needs two, one per chip")
    return problems


def parse_expect_models(text: str) -> tuple[str, ...]:
    """``--expect-models A,B``: exactly two distinct, non-empty aliases (exact strings; no trimming of inner text)."""
    items = tuple(p.strip() for p in text.split(","))
    if len(items) != 2 or any(not p for p in items) or items[0] == items[1]:
        raise UsageError(f"--expect-models {text!r}: expected two different aliases, e.g. model-a,model-b")
    return items


# ---------------------------------------------------------------------------
# Rounds


@dataclass(frozen=True)
class Workload:
    """What one model runs in every round, and what its output is checked against."""

    alias: str
    prompt: tuple[int, ...]
    n_tokens: int
    reference: str  # "golden" or "isolated run" (the second replica alias, see the module docstring)


@dataclass(frozen=True)
class RoundResult:
    index: int
    t_a: float  # device seconds (the runtime's job stamps; host seconds when it reports none)
    t_b: float
    t_joint: float
    tokens_a: int
    tokens_b: int
    overlap_ratio: float
    throughput_efficiency: float
    both_busy_fraction: float | None  # per-chip trace: share of the less busy chip's time with both computing
    clock: str = "device"  # "device": from job stamps; "host": the runtime reported none
    host_a_s: float | None = None  # the host's wall time of each phase, for the host overhead
    host_b_s: float | None = None
    host_joint_s: float | None = None


@dataclass(frozen=True)
class Mismatch:
    alias: str
    round: int
    phase: str  # alone | joint
    step: str
    position: int  # output token index
    expected: int | None
    got: int | None

    def describe(self) -> str:
        return (
            f"{self.alias}: round {self.round} ({self.phase}): {self.step}: output token {self.position}: "
            f"expected {self.expected}, got {self.got}"
        )


class _Checker:
    """Checks every output against its workload's reference and keeps the evidence (001 §13.1)."""

    def __init__(self, workloads: dict[str, Workload], golden: dict[str, GoldenData]) -> None:
        self.workloads = workloads
        self.reference: dict[str, tuple[int, ...] | None] = {
            a: golden[a].tokens[: w.n_tokens] if w.reference == "golden" else None for a, w in workloads.items()
        }
        self.mismatches: list[Mismatch] = []
        self.generations = 0
        self.tokens = 0
        self._lock = threading.Lock()

    def check(self, alias: str, rnd: int, phase: str, got: tuple[int, ...]) -> None:
        with self._lock:
            ref = self.reference[alias]
            if ref is None:  # the first isolated run of a non-golden workload becomes its reference
                self.reference[alias] = ref = got
            self.generations += 1
            self.tokens += len(got)
            bad = first_mismatch(ref, got)
            if bad is not None:
                self.mismatches.append(
                    Mismatch(
                        alias,
                        rnd,
                        phase,
                        step_name(bad),
                        bad,
                        ref[bad] if bad < len(ref) else None,
                        got[bad] if bad < len(got) else None,
                    )
                )


def _workloads(pkg: Package, aliases: tuple[str, ...], golden: dict[str, GoldenData]) -> dict[str, Workload]:
    out: dict[str, Workload] = {}
    first = golden[aliases[0]]
    for i, alias in enumerate(aliases):
        g = golden[alias]
        if i == 1 and g.prompt == first.prompt:
            # Replica (Phase 2): same weights, same golden prompt -> identical outputs would hide crosstalk.
            # Give the second alias a shorter prompt; its first isolated run becomes the reference.
            cut = max(1, (2 * len(g.prompt)) // 3)
            out[alias] = Workload(alias, g.prompt[:cut], len(g.tokens), "isolated run")
        else:
            out[alias] = Workload(alias, g.prompt, len(g.tokens), "golden")
        cap = pkg.model(alias).decode.max_seq
        w = out[alias]
        if len(w.prompt) + w.n_tokens - 1 > cap:
            out[alias] = Workload(alias, w.prompt, cap - len(w.prompt) + 1, w.reference)
    return out


def _generate(rt: Runtime, pkg: Package, w: Workload, bufs: JobBuffers, timeout_s: float) -> tuple[int, ...]:
    progress = GreedyProgress(w.alias)
    greedy_run(
        rt,
        pkg.model(w.alias),
        w.prompt,
        w.n_tokens,
        progress=progress,
        generation=GENERATION,
        step_timeout_s=timeout_s,
        buffers=bufs,
    )
    return tuple(progress.tokens)


def _joint(
    rt: Runtime, pkg: Package, loads: list[Workload], bufs: dict[str, JobBuffers], timeout_s: float
) -> tuple[float, int, int, list[tuple[int, ...]]]:
    """A and B together, one thread each, released by one barrier. Returns (seconds, start_ns, end_ns, outputs)."""
    outputs: list[tuple[int, ...] | None] = [None] * len(loads)
    errors: list[Exception | None] = [None] * len(loads)
    barrier = threading.Barrier(len(loads) + 1)

    def work(i: int) -> None:
        try:
            barrier.wait()
            outputs[i] = _generate(rt, pkg, loads[i], bufs[loads[i].alias], timeout_s)
        except Exception as exc:  # handed to the main thread below (a signal reaches the main thread only)
            errors[i] = exc

    threads = [
        threading.Thread(target=work, args=(i,), name=f"poc-{w.alias}", daemon=True) for i, w in enumerate(loads)
    ]
    for t in threads:
        t.start()
    joined = False
    try:
        barrier.wait()
        start_ns, t0 = time.monotonic_ns(), time.perf_counter()
        for t in threads:
            t.join()
        seconds, end_ns = time.perf_counter() - t0, time.monotonic_ns()
        joined = True
    finally:
        if not joined:  # Ctrl-C: let the workers finish their bounded workloads before the teardown drains the board
            barrier.abort()
            for t in threads:
                t.join(timeout_s)
    failures = [e for e in errors if e is not None]
    if failures:
        raise next((e for e in failures if isinstance(e, StepTimedOut)), failures[0])
    return seconds, start_ns, end_ns, [o for o in outputs if o is not None]


def _spans(rt: Runtime, since_ns: int, until_ns: int, aliases: tuple[str, ...]) -> list[JobSpan] | None:
    """The phase's jobs on the device's clock (submitted in [since, until]), or None when one has no stamps."""
    out: list[JobSpan] = []
    for e in rt.trace(since_ns=since_ns):
        if e.submit_ns > until_ns or e.model not in aliases:
            continue
        if e.start_ns is None or e.end_ns is None:
            return None
        out.append(JobSpan(e.chip, e.submit_ns / 1e9, e.start_ns / 1e9, e.end_ns / 1e9))
    return out or None


def _device_time(spans: list[JobSpan] | None) -> float | None:
    """The longer chip's device time of a phase (its compute and any wait the device imposed)."""
    if spans is None:
        return None
    per_chip = device_seconds(spans)
    return max(per_chip.values()) if per_chip else None


# ---------------------------------------------------------------------------
# The runner


def run_poc_combined(
    package: Path,
    *,
    trust: TrustPolicy,
    device: DeviceSpec,
    expect_models: tuple[str, ...],
    rounds: int = 8,
    max_rounds: int | None = None,
    step_timeout_s: float = 30.0,
    require_s2: bool = False,
    log: StepLog | None = None,
) -> Report:
    """``calctl poc combined``: the 001 §6.4 flow. Verdict S1/S2 when it ran to the end, else FAIL/TIMEOUT/ERROR.

    Exit 0 for S1 or S2 (both are findings), unless ``require_s2`` makes S1 exit 1;
    exit 1 for a refused package or any output mismatch; 4 for a hang; 3 for a
    device error; 130 for Ctrl-C. NOT JUDGED (a gate's interval still straddles
    its limit after ``max_rounds``, default 4 x ``rounds``) exits 0 like S1,
    and 1 under ``require_s2``. On the mock the time scale defaults to
    :data:`POC_MOCK_TIME_SCALE`.
    """
    if rounds < 2:
        raise UsageError(f"--rounds {rounds}: at least 2 rounds are needed for a confidence interval (001 §13.2)")
    budget = max(rounds, max_rounds if max_rounds is not None else 4 * rounds)
    if len(expect_models) != 2 or len(set(expect_models)) != 2:
        raise UsageError("--expect-models: expected two different aliases, e.g. model-a,model-b")
    device = device.with_default_time_scale(POC_MOCK_TIME_SCALE)
    poc = _Poc(expect_models, rounds, budget, step_timeout_s, require_s2)

    def lifecycle(name: str, call: Callable[[RunContext], Any]) -> RunStep:
        return RunStep(name, lambda s, note: call(_ctx(s)), logged=False)  # RunContext logs it

    steps = [
        lifecycle("open device", RunContext.open_device),
        lifecycle("validate package", RunContext.validate),
        RunStep("load package", poc.load, logged=False),
        lifecycle("create calbin", RunContext.create_calbin),
        RunStep("check names and chip targets", poc.check_names),
        lifecycle("configure", RunContext.configure),
        RunStep("allocate A/B buffers", poc.allocate),
        RunStep("golden", poc.run_goldens, logged=False, logs=tuple(f"golden {a}" for a in expect_models)),
        RunStep("batch profiles", poc.batch_profiles, logged=False, logs=()),
        RunStep("concurrent rounds", poc.concurrent_rounds),
        RunStep("verify outputs", poc.verify_outputs),
        RunStep("overlap verdict", poc.overlap_verdict),
    ]
    run = Run(
        "poc combined",
        device,
        steps,
        poc.report,
        package=package,
        trust=trust,
        opening=Opening.CONTEXT,
        skip_unreached=True,
        expect_models=expect_models,
    )
    return drive(run, log=log)


def _ctx(s: RunState) -> RunContext:
    assert s.ctx is not None
    return s.ctx


@dataclass
class _Poc:
    """The PoC's settings and what its steps established so far: kept when a later step fails, so the report
    keeps the evidence (the goldens, the rounds, the crosstalk checks)."""

    expect: tuple[str, ...]
    rounds: int
    budget: int
    timeout_s: float
    require_s2: bool
    body: dict[str, Any] = field(default_factory=dict)
    goldens: list[GoldenResult] = field(default_factory=list)
    checker: _Checker | None = None
    verdict: ConcurrencyVerdict | None = None
    aliases: tuple[str, ...] = ()
    bufs: dict[str, JobBuffers] = field(default_factory=dict)
    golden: dict[str, GoldenData] = field(default_factory=dict)
    results: list[RoundResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.body.update(expect_models=list(self.expect), rounds_requested=self.rounds, rounds_budget=self.budget)

    @property
    def marks(self) -> list[Mark]:
        marks: list[Mark] = self.body.setdefault("marks", [])  # the picture shades these phases
        return marks

    def mark(self, label: str, start_ns: int) -> None:
        self.marks.append(Mark(label, start_ns / 1e9, time.monotonic_ns() / 1e9))

    # -- the steps (001 §6.4), in order -------------------------------------------------------------

    def load(self, s: RunState, note: StepNote) -> None:
        pkg = _ctx(s).load()
        self.aliases = tuple(m.alias for m in pkg.models if m.alias in self.expect)
        self.body["phase"] = (
            "001 §12 Phase 2 (one model on both chips)" if pkg.kind == "replica" else "001 §12 Phase 3 (two models)"
        )

    def check_names(self, s: RunState, note: StepNote) -> None:
        ctx = _ctx(s)
        assert ctx.calbin is not None and ctx.pkg is not None
        pkg = ctx.pkg
        problems = check_combined_calbin(ctx.calbin.plan, self.expect)
        if problems:
            raise CheckFailed("combined calbin refused before configure (001 §6.4): " + "; ".join(problems))
        placement = {a: (pkg.model(a).target_chips[0], [g.name for g in pkg.model(a).graphs]) for a in self.aliases}
        self.body["placement"] = {a: {"chip": chip, "graphs": graphs} for a, (chip, graphs) in placement.items()}
        note.detail = "; ".join(f"{a} -> chip{chip} ({', '.join(graphs)})" for a, (chip, graphs) in placement.items())

    def allocate(self, s: RunState, note: StepNote) -> None:
        pkg, rt = _ctx(s).pkg, s.rt
        assert pkg is not None
        for a in self.aliases:
            m = pkg.model(a)
            pi, po = s.hold(rt.job_buffers(m.prefill.name))
            di, do = s.hold(rt.job_buffers(m.decode.name))
            self.bufs[a] = JobBuffers(pi, po, di, do)
        ids = {a: b.ids for a, b in self.bufs.items()}
        shared = set(ids[self.aliases[0]]) & set(ids[self.aliases[1]])
        if shared:  # pragma: no cover - a runtime bug: buffers are per allocation
            raise CheckFailed(f"buffers {sorted(shared)} are shared between the models")
        self.body["buffers"] = {a: list(v) for a, v in ids.items()}
        note.detail = "; ".join(f"{a}: buffers {list(v)}" for a, v in ids.items()) + " (none shared)"

    def run_goldens(self, s: RunState, note: StepNote) -> None:
        """A golden, then B golden (serially, 001 §12 Phase 2 step 2), each a logged step."""
        pkg = _ctx(s).pkg
        assert pkg is not None
        self.golden = {a: GoldenData.load(pkg, a) for a in self.aliases}
        for a in self.aliases:
            with s.log.step(f"golden {a}") as step_note:
                self._golden(s.rt, pkg, a, step_note)

    def _golden(self, rt: Runtime, pkg: Package, a: str, note: StepNote) -> None:
        golden, progress = self.golden[a], GreedyProgress(a)
        g0, m0 = time.perf_counter(), time.monotonic_ns()
        try:
            greedy_run(
                rt,
                pkg.model(a),
                golden.prompt,
                len(golden.tokens),
                progress=progress,
                generation=GENERATION,
                step_timeout_s=self.timeout_s,
                buffers=self.bufs[a],
            )
        except StepTimedOut:
            self.goldens.append(judge_golden(golden, progress, time.perf_counter() - g0))
            raise
        r = judge_golden(golden, progress, time.perf_counter() - g0)
        self.mark(f"golden {a}", m0)
        self.goldens.append(r)
        if not r.ok:
            raise CheckFailed(f"golden failed: {r.reason}")
        note.detail = f"{len(r.got_tokens)} tokens exact, logits max |err| {r.prefill_max_abs_err:.2g}"

    def batch_profiles(self, s: RunState, note: StepNote) -> None:
        pkg = _ctx(s).pkg
        assert pkg is not None
        _batch_profiles(s.rt, pkg, self.aliases, s.log, self.timeout_s, self.body)

    def concurrent_rounds(self, s: RunState, note: StepNote) -> None:
        pkg = _ctx(s).pkg
        assert pkg is not None
        loads = _workloads(pkg, self.aliases, self.golden)
        self.body["workloads"] = [
            {"alias": w.alias, "prompt_tokens": len(w.prompt), "output_tokens": w.n_tokens, "reference": w.reference}
            for w in loads.values()
        ]
        self.checker = _Checker(loads, self.golden)
        rounds = _PocRounds(s.rt, pkg, loads, self.bufs, self.timeout_s, self.checker, self)
        ran = until_decided(rounds.one, lambda: _verdict(self.results).decided, first=self.rounds, budget=self.budget)
        results = self.results
        self.body.update(rounds=results, rounds_run=ran, host_overhead=_host_overhead(results))
        clock = (
            "device clock (the runtime's job stamps)"
            if all(r.clock == "device" for r in results)
            else ("HOST clock: the runtime reported no job timestamps")
        )
        wa, wb = self.aliases
        note.detail = (
            f"{ran} rounds ({self.rounds} requested, budget {self.budget}) of {wa} alone, {wb} alone, both "
            f"together; on the {clock}: mean joint {sum(r.t_joint for r in results) / ran * 1e3:.1f} ms vs "
            f"serial {sum(r.t_a + r.t_b for r in results) / ran * 1e3:.1f} ms; host overhead "
            f"{self.body['host_overhead']['share_of_host_time']:.0%} of the host's time"
        )

    def verify_outputs(self, s: RunState, note: StepNote) -> None:
        checker = self.checker
        assert checker is not None
        note.detail = f"{checker.generations} generations, {checker.tokens} tokens checked"
        if checker.mismatches:
            first = checker.mismatches[0]
            raise CheckFailed(
                f"output mismatch (crosstalk?): {first.describe()}"
                + (f" and {len(checker.mismatches) - 1} more" if len(checker.mismatches) > 1 else "")
            )
        note.detail += ", all equal to their reference (no crosstalk)"

    def overlap_verdict(self, s: RunState, note: StepNote) -> None:
        verdict = _verdict(self.results)
        o, e = verdict.overlap_ratio, verdict.throughput_efficiency
        note.detail = (
            f"{verdict.verdict}: overlap_ratio {_f(o.mean)} [{_f(o.ci_low)}, {_f(o.ci_high)}], "
            f"efficiency {_f(e.mean)} [{_f(e.ci_low)}, {_f(e.ci_high)}] over {len(self.results)} rounds"
        )
        if verdict.verdict == NOT_JUDGED:
            note.detail += "; NOT JUDGED: " + "; ".join(verdict.reasons) + _host_blame(self.body.get("host_overhead"))
        if verdict.verdict != "S2":
            note.status = StepStatus.WARN
        self.verdict = verdict

    # -- the report ------------------------------------------------------------------------------

    def report(self, s: RunState, ended: Ended) -> Report:
        ctx, body, verdict, checker = _ctx(s), self.body, self.verdict, self.checker
        body["golden"] = self.goldens
        if checker is not None:
            body["crosstalk"] = _crosstalk(checker)
        if verdict is not None:
            body["overlap_ratio"] = verdict.overlap_ratio.as_dict()
            body["throughput_efficiency"] = verdict.throughput_efficiency.as_dict()
            body["both_busy_fraction"] = verdict.both_busy_fraction
            body["per_chip_trace_share"] = verdict.trace_share.as_dict() if verdict.trace_share else None
            body["decisions"] = {k: d.as_dict() for k, d in verdict.decisions.items()}
            body["reasons"] = list(verdict.reasons)
        software = ctx.versions is not None and bool(ctx.versions.software_model)
        body["capability"] = _capability(s.run.device, verdict, ended.outcome, software=software)
        fail_on: frozenset[str] = frozenset()
        error = ended.error
        if ended.stopped or verdict is None:
            final = ended.outcome.value
        elif self.require_s2 and verdict.verdict != "S2":
            final, fail_on = verdict.verdict, frozenset({verdict.verdict})
            error = "S2 was required (--require-s2): " + "; ".join(verdict.reasons)
        else:
            final = verdict.verdict
        return s.finish(final, body, error, fail_on=fail_on)


def _crosstalk(checker: _Checker) -> dict[str, Any]:
    return {
        "checked_generations": checker.generations,
        "checked_tokens": checker.tokens,
        "mismatches": [m.describe() for m in checker.mismatches[:20]],
        "mismatch_count": len(checker.mismatches),
        "gate_requests": CROSSTALK_GATE_REQUESTS,
        "meets_gate": checker.generations >= CROSSTALK_GATE_REQUESTS and not checker.mismatches,
        "note": f"001 §13.1 asks for >= {CROSSTALK_GATE_REQUESTS} requests without crosstalk; "
        f"{checker.generations} generation(s) were checked here",
    }


@dataclass
class _PocRounds:
    """One round: A alone, B alone, then A and B together, each output checked; its times on the device's clock."""

    rt: Runtime
    pkg: Package
    loads: dict[str, Workload]
    bufs: dict[str, JobBuffers]
    timeout_s: float
    checker: _Checker
    poc: _Poc

    def timed(self, alias: str, label: str, k: int) -> tuple[float, float | None, tuple[int, ...]]:
        s, m0 = time.perf_counter(), time.monotonic_ns()
        out = _generate(self.rt, self.pkg, self.loads[alias], self.bufs[alias], self.timeout_s)
        host = time.perf_counter() - s
        m1 = time.monotonic_ns()
        self.poc.mark(label, m0)
        self.checker.check(alias, k, "alone", out)
        return host, _device_time(_spans(self.rt, m0, m1, (alias,))), out

    def one(self) -> None:
        results = self.poc.results
        wa, wb = (self.loads[x] for x in self.poc.aliases)
        k = len(results)
        h_a, d_a, out_a = self.timed(wa.alias, "A alone", k)
        h_b, d_b, out_b = self.timed(wb.alias, "B alone", k)
        h_j, w0, w1, (joint_a, joint_b) = _joint(self.rt, self.pkg, [wa, wb], self.bufs, self.timeout_s)
        self.poc.marks.append(Mark("A+B joint", w0 / 1e9, w1 / 1e9))
        self.checker.check(wa.alias, k, "joint", joint_a)
        self.checker.check(wb.alias, k, "joint", joint_b)
        spans = _spans(self.rt, w0, w1, (wa.alias, wb.alias))
        d_j = _device_time(spans)
        # The device's clock when it stamped every phase with some time; else the host's (a shim without
        # job stamps, or a mock time scale so small that every modelled job lasts 0 ns).
        device = (d_a, d_b, d_j) if d_a and d_b and d_j else None  # None, or a 0 ns job: not on the device
        t_a, t_b, t_j = device if device is not None else (h_a, h_b, h_j)
        rnd = OverlapRound(t_a, t_b, t_j, len(out_a), len(out_b), len(joint_a) + len(joint_b))
        share = joint_share(spans) if spans is not None else None
        clock = "device" if device is not None else "host"
        results.append(
            RoundResult(
                k, t_a, t_b, t_j, len(out_a), len(out_b), rnd.overlap_ratio, rnd.efficiency, share, clock, h_a, h_b, h_j
            )
        )


def _batch_profiles(
    rt: Runtime, pkg: Package, aliases: tuple[str, ...], log: StepLog, timeout_s: float, body: dict[str, Any]
) -> None:
    """Every compiled decode profile B > 1 of both models against B1 twins, A and B at once from two threads
    (:mod:`calctl.checks.batch_golden`): a batch that crosses lanes or chips, or an inactive lane that writes
    KV, fails here before the rounds (000 §7.3; 001 §13.1 no crosstalk)."""
    profiles = {a: batch_profiles(pkg.model(a)) for a in aliases}
    if not any(profiles.values()):  # B1 only: nothing beyond the goldens, and 001 §6.4's flow stays as it is
        body["batch_profiles"] = {}
        return
    with log.step("batch profiles") as note:
        results = at_once(
            lambda a: run_batch_golden(rt, pkg, a, generation=GENERATION, step_timeout_s=timeout_s),
            aliases,
            name="poc-batch",
        )
        body["batch_profiles"] = {a: list(results[a]) for a in aliases}
        failed = next((r for a in aliases for r in results[a] if not r.ok), None)
        if failed is not None:
            raise CheckFailed(f"batch profile failed: {failed.reason}")
        note.detail = (
            "; ".join(f"{a}: {', '.join(f'B{r.batch}' for r in results[a]) or 'B1 only'}" for a in aliases)
            + ": every lane equal to its B1 twin (A and B at once)"
        )


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _verdict(results: list[RoundResult]) -> ConcurrencyVerdict:
    return judge(
        [OverlapRound(r.t_a, r.t_b, r.t_joint, r.tokens_a, r.tokens_b, r.tokens_a + r.tokens_b) for r in results],
        shares=[r.both_busy_fraction for r in results],
    )


def _host_overhead(results: list[RoundResult]) -> dict[str, Any]:
    """What the host added beyond the device's time, summed over the rounds (never part of the verdict)."""
    host = sum((r.host_a_s or 0) + (r.host_b_s or 0) + (r.host_joint_s or 0) for r in results)
    dev = sum(r.t_a + r.t_b + r.t_joint for r in results)
    on_device = all(r.clock == "device" for r in results)
    added = sum(
        host_overhead(h or 0.0, d)
        for r in results
        for h, d in ((r.host_a_s, r.t_a), (r.host_b_s, r.t_b), (r.host_joint_s, r.t_joint))
    )
    return {
        "clock": "device" if on_device else "host",
        "host_seconds": round(host, 6),
        "device_seconds": round(dev, 6) if on_device else None,
        "host_added_seconds": round(added, 6) if on_device else None,
        "share_of_host_time": (added / host) if on_device and host > 0 else 0.0,
        "note": "host time (submission gaps, thread hand-offs, a starved thread) beyond the device's own job "
        "intervals; reported, never judged",
    }


def _host_blame(overhead: dict[str, Any] | None) -> str:
    if not overhead or overhead.get("clock") != "device":
        return " (the runtime reports no job timestamps; the host's clock cannot decide S1/S2)"
    return (
        f" (the host added {overhead['share_of_host_time']:.0%} of the host's time: a loaded host submits the two "
        "chips' jobs too unevenly for the interval to close; rerun with more --rounds or on a quieter host)"
    )


def _capability(
    device: DeviceSpec, verdict: ConcurrencyVerdict | None, outcome: RunOutcome, *, software: bool = False
) -> str:
    """What the run may be cited for (001 §1 C0–C4, S1/S2; docs/runtime.md §5)."""
    if software and not device.is_mock:  # a software model (the reference board): about the model, never a board
        measured = (
            f"measured {verdict.verdict} " if verdict is not None and outcome is RunOutcome.PASS else "no verdict "
        )
        return (
            f"not evidence: {measured}on a software model of a board (no hardware); it shows the tool and the "
            "library tell S1 from S2. The board's dual-chip concurrency stays C3 until a run on a Calculet board "
            "with a vendor combined calbin measures it (001 §1, §6.4; docs/runtime.md §5)"
        )
    if device.is_mock:
        return (
            "not evidence: a mock result shows the tool tells S1 from S2; the board's dual-chip concurrency stays "
            "C3 until a --device calrt run with a vendor combined calbin measures it (001 §1, §6.4)"
        )
    if verdict is None or outcome is not RunOutcome.PASS:
        return "no claim: the PoC did not run to its verdict on this board"
    if verdict.verdict == "S2":
        return (
            "measured S2 on this board for this package digest and runtime version (001 §13.2 evidence, C0 for this "
            "configuration); S2 for the product still needs the §13.2 latency and §13.1 1000-request gates"
        )
    return "measured S1 only on this board for this package and runtime: the chips did not compute concurrently"


__all__ = [
    "CROSSTALK_GATE_REQUESTS",
    "POC_MOCK_TIME_SCALE",
    "Mismatch",
    "RoundResult",
    "Workload",
    "check_combined_calbin",
    "parse_expect_models",
    "run_poc_combined",
]
