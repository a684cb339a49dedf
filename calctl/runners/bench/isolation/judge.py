"""G2 isolation, the judgement: every output against the package reference, and the end-of-run checks.

:class:`IsolationReference` is the package's float64 model, teacher-forced on an output (:class:`ReferenceMatch`: where
an output first leaves the reference's greedy tokens, beyond the golden tolerance). :func:`judge_request` runs
one request's checks, :func:`find_sources` names the request a wrong stream belongs to, and :func:`judge_run`
counts every check of :data:`CHECKS` over what the run observed (:class:`Observation`) into an :class:`IsolationJudgement`.
Nothing here serves a request or draws; ``run.py`` serves, ``render.py`` writes the report.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calctl.model import decoder
from calctl.package.model import Package
from calctl.runners.bench.isolation.plan import CANCEL_KINDS, G2_MIN_REQUESTS, Planned, Replica, Side
from calctl.runners.bench.kv_at_rest import KvAtRest
from calctl.runners.device import DeviceSpec
from calctl.runners.traffic import EngineResult
from calctl.serving.outcomes import RequestOutcome

CROSSTALK_MIN_TOKENS = 3  # an equal stream of at least this many tokens names a source (vocab^-3 by chance)
DETAILED = 20  # failing requests given an expected-vs-got prefix from the reference
PREFIX = 12  # tokens shown of an expected or received prefix
NO_GO_ACTION = "do not enter the different-model phase (001 §17 G2): find and fix the crosstalk first"

#: check name -> what passing means (the order is the report's).
CHECKS: dict[str, str] = {
    "serial_golden": "each alias's golden, serially before the concurrent run: the engine's load gate "
    "(logits, top-k, tokens; 001 §11.1) and the golden prompt served through the engine alone, token for token",
    "served": "every request completed or was cancelled on its cue; none refused, failed or timed out",
    "completed_equals_reference": "a completed request's tokens equal the package reference's greedy tokens, "
    "all max_tokens of them",
    "cancelled_prefix_of_reference": "a cancelled request's tokens (and a failed one's partial output) are a "
    "prefix of the reference's",
    "own_generation": "every token carried the submitting alias's generation",
    "request_record": "the engine's request record names the submitting alias, its chip, its generation and "
    "the tokens delivered",
    "job_records": "every job record names one of its alias's own graphs, the alias's chip and generation, "
    "and at most the compiled batch of lanes",
    "trace_chips": "every traced job of an alias ran on that alias's chip, in its generation",
    "kv_released": "at the end, per alias: every KV lane free, no reserved or used KV tokens, no job in flight "
    "or quarantined, the device's free KV sequences and per-chip memory back to their level before the run",
}

# ---------------------------------------------------------------------------
# The reference: the package's float64 model, teacher-forced


@dataclass(frozen=True)
class ReferenceMatch:
    """One output against the reference: where it first leaves the greedy tokens, and by how much."""

    ok: bool
    first_mismatch: int | None = None  # output token index
    expected: int | None = None  # the reference's greedy token there
    got: int | None = None
    gap: float | None = None  # reference logit of the expected token minus that of the got one
    slack: float | None = None  # the tolerance a near tie may use
    near_ties: int = 0


class IsolationReference:
    """Greedy reference of one model: :func:`calctl.model.decoder.reference_logits` in float64."""

    def __init__(self, pkg: Package, root: Path, alias: str) -> None:
        m = pkg.model(alias)
        self.arch = m.architecture
        self.params = {k: v.astype(np.float64) for k, v in decoder.load_params(root, m.params).items()}
        self.rtol, self.atol = m.golden.tolerance.rtol, m.golden.tolerance.atol

    def judge(self, prompt: tuple[int, ...], got: list[int]) -> ReferenceMatch:
        if not got:
            return ReferenceMatch(True)
        seq = np.array(list(prompt) + got[:-1], dtype=np.int64)
        logits = decoder.reference_logits(self.params, self.arch, seq)[len(prompt) - 1 :]
        ties = 0
        for i, (row, tok) in enumerate(zip(logits, got, strict=True)):
            best = int(np.argmax(row))
            if tok == best:
                continue
            slack = 2.0 * (self.atol + self.rtol * abs(float(row[best])))
            gap = float(row[best] - row[tok]) if 0 <= tok < row.shape[0] else float("inf")
            if gap <= slack:
                ties += 1
                continue
            return ReferenceMatch(False, i, best, tok, gap, slack, ties)
        return ReferenceMatch(True, near_ties=ties)

    def greedy(self, prompt: tuple[int, ...], n: int) -> list[int]:
        tokens, _, _ = decoder.reference_generate(self.params, self.arch, np.array(prompt), max(1, n))
        return [int(t) for t in tokens]


# ---------------------------------------------------------------------------
# Judgement of one request


@dataclass
class Judged:
    planned: Planned
    result: EngineResult | None
    tokens: list[int]
    generations: frozenset[int]  # the submitting alias's generations during the run (more than one after a reset)
    match: ReferenceMatch = field(default_factory=lambda: ReferenceMatch(True))
    failures: list[tuple[str, str]] = field(default_factory=list)  # (check, detail)
    passed: list[str] = field(default_factory=list)
    source: str | None = None
    expected_prefix: list[int] | None = None
    load_outcome: str | None = None  # a timeout: the load's outcome, not an isolation failure

    @property
    def outcome(self) -> str:
        return "not run" if self.result is None else self.result.record.outcome.value

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        if ok:
            self.passed.append(name)
        else:
            self.failures.append((name, detail))

    def document(self) -> dict[str, Any]:
        p = self.planned
        rec = self.result.record if self.result is not None else None
        return {
            "request_id": p.request_id,
            "alias": p.side.alias,
            "chip": p.side.chip,
            "generations": sorted(self.generations),
            "order": p.index,
            "prompt_tokens": len(p.prompt),
            "max_tokens": p.max_tokens,
            "cancel": p.cancel or None,
            "cancel_after_tokens": p.cancel_after_tokens,
            "cancel_after_s": None if p.cancel_after_s is None else round(p.cancel_after_s, 4),
            "outcome": self.outcome,
            "finish": rec.finish if rec else None,
            "error": rec.error if rec else None,
            "tokens": self.tokens,
            "near_ties": self.match.near_ties,
            "first_mismatch": self.match.first_mismatch,
            "expected_token": self.match.expected,
            "got_token": self.match.got,
            "expected_prefix": self.expected_prefix,
            "crosstalk_source": self.source,
            "checks": {**{c: True for c in self.passed}, **{c: False for c, _ in self.failures}},
            "failures": [{"check": c, "detail": d} for c, d in self.failures],
            "load_outcome": self.load_outcome,
            "ttft_s": None if rec is None or rec.ttft is None else round(rec.ttft, 6),
            "e2e_s": None if rec is None or rec.e2e is None else round(rec.e2e, 6),
        }


def judge_request(j: Judged, ref: IsolationReference, record: dict[str, Any] | None) -> None:
    """Every per-request check of one request (the end-of-run checks are separate)."""
    p, res = j.planned, j.result
    outcome = res.record.outcome if res is not None else None
    if outcome is RequestOutcome.TIMEOUT:
        # A load outcome (the host or the device was too slow for the deadline), not crosstalk: counted in
        # requests.timed_out, never an offender. Its partial output is still checked below.
        j.load_outcome = f"timed out: {res.record.error}" if res is not None else "timed out"
    else:
        served = outcome in (RequestOutcome.OK, RequestOutcome.CANCELLED)
        j.check(
            "served",
            served,
            f"ended {outcome.value if outcome else 'never'}"
            + (f": {res.record.error}" if res is not None and res.record.error else ""),
        )
    j.match = ref.judge(p.prompt, j.tokens)
    v = j.match
    mismatch = (
        ""
        if v.ok
        else f"output token {v.first_mismatch} is {v.got}, the reference's greedy token is {v.expected} "
        f"(reference logit gap {v.gap:.4g} > tolerance {v.slack:.3g})"
    )
    if res is not None and outcome is RequestOutcome.OK:
        j.check(
            "completed_equals_reference",
            v.ok and len(j.tokens) == p.max_tokens,
            mismatch or f"{len(j.tokens)} tokens delivered, max_tokens {p.max_tokens} (finish {res.record.finish})",
        )
    elif outcome is RequestOutcome.CANCELLED or j.tokens:  # a failed request's partial output is compared too
        j.check(
            "cancelled_prefix_of_reference",
            v.ok and len(j.tokens) <= p.max_tokens,
            (mismatch or f"{len(j.tokens)} tokens delivered, more than max_tokens {p.max_tokens}")
            + ("" if outcome is RequestOutcome.CANCELLED else " (the partial output of a failed request)"),
        )
    gens = res.token_generations if res is not None else []
    wrong = [g for g in gens if g not in j.generations]
    j.check(
        "own_generation",
        not wrong,
        f"{len(wrong)} token(s) carried generation {sorted({str(g) for g in wrong})}, "
        f"{p.side.alias} served {sorted(j.generations)}",
    )
    if res is None or res.synchronous_rejection:
        return
    if record is None and res.record.status not in (None, 200) and not j.tokens:
        return  # refused at admission (e.g. the alias recovering from a fault): never ran, the engine keeps no record
    if record is None:
        j.check("request_record", False, "the engine wrote no request record for it")
        return
    problems = []
    if record.get("model_alias") != p.side.alias:
        problems.append(f"model_alias {record.get('model_alias')!r}")
    if record.get("chips") != [p.side.chip]:
        problems.append(f"chips {record.get('chips')}")
    if record.get("model_generation") not in j.generations:
        problems.append(f"model_generation {record.get('model_generation')}")
    if record.get("output_tokens") != len(j.tokens) and outcome is not RequestOutcome.TIMEOUT:
        # (a timed-out stream: the engine may have produced tokens after the client stopped reading)
        problems.append(f"output_tokens {record.get('output_tokens')} but {len(j.tokens)} delivered")
    j.check(
        "request_record",
        not problems,
        f"record says {', '.join(problems)}; submitted to {p.side.alias} on chip {p.side.chip}, "
        f"generation(s) {sorted(j.generations)}",
    )


def find_sources(judged: list[Judged]) -> None:
    """For each output that differs from its reference, the request whose verified output it equals."""
    by_head: dict[tuple[int, ...], list[Judged]] = {}
    for j in judged:
        if j.match.ok and len(j.tokens) >= CROSSTALK_MIN_TOKENS:
            by_head.setdefault(tuple(j.tokens[:CROSSTALK_MIN_TOKENS]), []).append(j)
    for j in judged:
        if j.match.ok:
            continue
        if len(j.tokens) >= CROSSTALK_MIN_TOKENS:
            for other in by_head.get(tuple(j.tokens[:CROSSTALK_MIN_TOKENS]), []):
                m = min(len(j.tokens), len(other.tokens))
                if other is not j and j.tokens[:m] == other.tokens[:m]:
                    o = other.planned
                    j.source = (
                        f"its tokens are request {o.request_id}'s ({o.side.alias}, chip {o.side.chip}), which match "
                        "that request's own reference: a token stream delivered to the wrong request"
                        + (" across chips" if o.side.chip != j.planned.side.chip else "")
                    )
                    break
        if j.source is None:
            j.source = (
                f"no other request's output: chip {j.planned.side.chip} computed tokens no reference produced "
                "(KV, buffer or logits corrupted)"
            )


# ---------------------------------------------------------------------------
# The run

# ---------------------------------------------------------------------------
# What the run observed


@dataclass
class Observation:
    """Everything the run saw: filled by ``run.py``, read by the checks here and by ``render.py``."""

    replica: Replica
    device: DeviceSpec
    work: list[Planned]
    files: dict[str, str] = field(default_factory=dict)
    versions: Any = None
    golden_rows: list[dict[str, Any]] = field(default_factory=list)
    judged: list[Judged] = field(default_factory=list)
    before: dict[str, KvAtRest] = field(default_factory=dict)
    after: dict[str, KvAtRest] = field(default_factory=dict)
    mem_before: dict[int, int | None] = field(default_factory=dict)
    mem_after: dict[int, int | None] = field(default_factory=dict)
    events: tuple[Any, ...] = ()
    generations: dict[str, set[int]] = field(default_factory=dict)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    faults_fired: list[dict[str, Any]] | None = None  # None: not a mock, nothing injected by calctl
    wall_s: float = 0.0
    in_flight: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # where the run's time went: load, golden, serve, judge
    start_error: str | None = None
    drained: bool = True


def read_records(path: Path) -> list[dict[str, Any]]:
    """The engine's request and job records (NDJSON), none when the file was never written."""
    out: list[dict[str, Any]] = []
    if not path.is_file():
        return out
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


# ---------------------------------------------------------------------------
# The counts


class Tally:
    """Pass/fail counts per check (:data:`CHECKS`), the first failure of each, and the offenders in order."""

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {c: [0, 0] for c in CHECKS}
        self.firsts: dict[str, str] = {}
        self.offenders: list[dict[str, Any]] = []

    def add(self, check: str, ok: bool, detail: str = "") -> None:
        self.counts[check][0 if ok else 1] += 1
        if not ok:
            self.firsts.setdefault(check, detail)

    def offend(self, what: str, side: Side | None, check: str, detail: str, **extra: Any) -> None:
        """One offending request, job or side (the ``crosstalk`` list)."""
        self.offenders.append(
            {
                "request_id": what,
                "alias": side.alias if side else None,
                "chip": side.chip if side else None,
                "check": check,
                "detail": detail,
                **extra,
            }
        )

    def item(self, check: str, what: str, side: Side | None, subject: str, problems: list[str]) -> None:
        """One job or side judged on ``problems`` (none: it passed); a failure is also an offender."""
        detail = f"{subject}: {'; '.join(problems)}"
        self.add(check, not problems, detail)
        if problems:
            self.offend(what, side, check, detail)

    @property
    def clean(self) -> bool:
        return all(fail == 0 for _, fail in self.counts.values())

    def documents(self) -> dict[str, dict[str, Any]]:
        return {
            name: {
                "rule": rule,
                "pass": self.counts[name][0],
                "fail": self.counts[name][1],
                "first_failure": self.firsts.get(name),
            }
            for name, rule in CHECKS.items()
        }


# ---------------------------------------------------------------------------
# The checks of the whole run


def _golden_checks(t: Tally, obs: Observation) -> None:
    if obs.start_error is not None:
        failed = next((s for s in obs.replica.sides if obs.start_error.startswith(f"{s.alias}:")), None)
        for s in obs.replica.sides:
            t.add("serial_golden", s is not failed, f"{s.alias} (chip {s.chip}): {obs.start_error}")
        t.offend(
            "load-golden",
            failed,
            "serial_golden",
            f"the engine's load gate refused Ready: {obs.start_error}; no request was sent",
        )
    for row in obs.golden_rows:
        side = obs.replica.side(row["alias"])
        detail = (
            f"golden prompt served alone gave {row['got_tokens'][:PREFIX]}, golden "
            f"{row['expected_tokens'][:PREFIX]} (first mismatch at token {row['first_mismatch']})"
        )
        t.add("serial_golden", row["served_ok"], f"{side.alias} (chip {side.chip}): {detail}")
        if not row["served_ok"]:
            t.offend(
                f"iso-golden-{side.alias}",
                side,
                "serial_golden",
                detail,
                expected_prefix=row["expected_tokens"][:PREFIX],
                got_prefix=row["got_tokens"][:PREFIX],
            )


def _request_checks(
    t: Tally, obs: Observation, refs: dict[str, IsolationReference], records: dict[str, dict[str, Any]]
) -> None:
    for j in obs.judged:
        judge_request(j, refs[j.planned.side.alias], records.get(j.planned.request_id))
    find_sources(obs.judged)
    detailed = 0
    for j in obs.judged:
        p = j.planned
        for name in j.passed:
            t.add(name, True)
        for name, detail in j.failures:
            t.add(name, False, f"{p.request_id} ({p.side.alias}, chip {p.side.chip}): {detail}")
        if not j.failures:
            continue
        if not j.match.ok and detailed < DETAILED:  # the reference's own continuation, for people
            detailed += 1
            at = j.match.first_mismatch or 0
            j.expected_prefix = j.tokens[:at] + refs[p.side.alias].greedy(
                p.prompt + tuple(j.tokens[:at]), min(PREFIX, max(1, len(j.tokens) - at))
            )
        start = max(0, (j.match.first_mismatch or 0) - 4)  # a window that shows where the streams part
        name, detail = j.failures[0]
        t.offend(
            p.request_id,
            p.side,
            name,
            detail,
            checks_failed=[c for c, _ in j.failures],
            cancel=p.cancel or None,
            outcome=j.outcome,
            first_mismatch=j.match.first_mismatch,
            from_token=start,
            expected_prefix=None if j.expected_prefix is None else j.expected_prefix[start : start + PREFIX],
            got_prefix=j.tokens[start : start + PREFIX],
            source=j.source,
        )


def _job_checks(t: Tally, obs: Observation, jobs: list[dict[str, Any]]) -> None:
    """Every job record (001 §14) on its own alias's graph, chip and generation, within the compiled batch."""
    for r in jobs:
        alias = r.get("model_alias")
        side = obs.replica.find(alias)
        problems = []
        if side is None:
            problems.append(f"model_alias {alias!r} is neither side")
        else:
            gens = obs.generations.get(side.alias, set())
            if r.get("graph") not in side.graphs:
                problems.append(f"graph {r.get('graph')!r} is not one of {alias}'s")
            if r.get("chips") != [side.chip]:
                problems.append(f"chips {r.get('chips')}, {alias} is on chip {side.chip}")
            if r.get("generation") not in gens:
                problems.append(f"generation {r.get('generation')}, {alias} served {sorted(gens)}")
            if not isinstance(r.get("lanes"), int) or not 1 <= r["lanes"] <= side.max_batch:
                problems.append(f"lanes {r.get('lanes')}, compiled at most {side.max_batch}")
        t.item("job_records", f"job-{r.get('job_id')}", side, f"job {r.get('job_id')} ({alias})", problems)


def _trace_checks(t: Tally, obs: Observation) -> None:
    """Every traced job (the runtime's own per-chip trace) on its alias's chip, graph and generation."""
    for e in obs.events:
        side = obs.replica.find(e.model)
        problems = []
        if side is None:
            problems.append(f"model {e.model!r} is neither side")
        else:
            gens = obs.generations.get(side.alias, set())
            if e.chip != side.chip:
                problems.append(f"ran on chip {e.chip}, {side.alias} is on chip {side.chip}")
            if e.graph not in side.graphs:
                problems.append(f"graph {e.graph!r} is not one of {side.alias}'s")
            if int(e.generation) not in gens:
                problems.append(f"generation {int(e.generation)}, {side.alias} served {sorted(gens)}")
        t.item(
            "trace_chips", f"job-{int(e.job)}", side, f"traced job {int(e.job)} ({e.model}, chip {e.chip})", problems
        )


def _kv_problems(obs: Observation, s: Side) -> list[str]:
    """What is not back where it was before the run on ``s``: KV lanes and tokens, jobs, KV sequences, memory."""
    problems = obs.after[s.alias].problems_against(obs.before[s.alias], since="the run", free_lanes="free lanes")
    mb, ma = obs.mem_before.get(s.chip), obs.mem_after.get(s.chip)
    if mb is not None and ma is not None and ma != mb:
        problems.append(f"chip {s.chip} memory used {ma} bytes, {mb} before the run")
    if not obs.drained:
        problems.append("requests still live 30 s after the last one ended")
    return problems


def _kv_checks(t: Tally, obs: Observation) -> None:
    """At the end, per alias: lanes, reserved/used KV, jobs, the device's KV sequences and memory as before."""
    if obs.start_error is not None:
        return
    for s in obs.replica.sides:
        t.item("kv_released", f"kv-{s.alias}", s, f"{s.alias} (chip {s.chip})", _kv_problems(obs, s))


def requests_document(obs: Observation) -> dict[str, Any]:
    """The report's ``requests``: how many were sent, how they ended, per alias and per cancel cue."""
    judged, work = obs.judged, obs.work
    sent = len(judged)

    def count(pred: Callable[[Judged], bool], side: Side | None = None) -> int:
        return sum(1 for j in judged if (side is None or j.planned.side is side) and pred(j))

    ok, cancelled = RequestOutcome.OK.value, RequestOutcome.CANCELLED.value
    return {
        "sent": sent,
        "completed": count(lambda j: j.outcome == ok),
        "cancelled": count(lambda j: j.outcome == cancelled),
        "timed_out": count(lambda j: j.load_outcome is not None),
        "failed": count(lambda j: j.result is not None and j.result.record.outcome.is_error and j.load_outcome is None),
        "planned": len(work),
        "not_sent": len(work) - sent,
        "by_alias": {
            s.alias: {
                "chip": s.chip,
                "sent": count(lambda j: True, s),
                "completed": count(lambda j: j.outcome == ok, s),
                "cancelled": count(lambda j: j.outcome == cancelled, s),
            }
            for s in obs.replica.sides
        },
        "cancel_cues": {k: sum(1 for p in work if p.cancel == k) for k in CANCEL_KINDS},
        # where the cancellations really landed: a cue may fire before, during or after the output
        "cancelled_before_first_token": count(lambda j: j.outcome == cancelled and not j.tokens),
        "cancelled_mid_decode": count(lambda j: j.outcome == cancelled and bool(j.tokens)),
        "cue_after_the_end": count(lambda j: bool(j.planned.cancel) and j.outcome == ok),
        "output_tokens": sum(len(j.tokens) for j in judged),
        "near_ties": sum(j.match.near_ties for j in judged),
        "threshold": G2_MIN_REQUESTS,
        "threshold_met": sent >= G2_MIN_REQUESTS,
        "wall_s": round(obs.wall_s, 3),
    }


@dataclass(frozen=True)
class IsolationJudgement:
    """The run judged: GO / NO-GO / NOT JUDGED, the per-check counts, the offenders and the request counts."""

    verdict: str
    go: bool
    checks: dict[str, dict[str, Any]]
    offenders: list[dict[str, Any]]
    requests: dict[str, Any]


def judge_run(obs: Observation, refs: dict[str, IsolationReference]) -> IsolationJudgement:
    """Every check of :data:`CHECKS` over the run; the decision rule of G2."""
    t = Tally()
    _golden_checks(t, obs)
    records = read_records(Path(obs.files["records_ndjson"]))
    _request_checks(t, obs, refs, {r["request_id"]: r for r in records if r.get("record") == "request"})
    _job_checks(t, obs, [r for r in records if r.get("record") == "job"])
    _trace_checks(t, obs)
    _kv_checks(t, obs)
    go = t.clean and obs.start_error is None
    requests = requests_document(obs)
    # The decision rule: GO only on the requests asked for, all verified; timeouts (a load outcome) that
    # leave fewer is NOT JUDGED, never GO and never an offender.
    undecided = go and requests["timed_out"] > 0
    verdict = "NOT JUDGED" if undecided else "GO" if go else "NO-GO"
    return IsolationJudgement(verdict, go, t.documents(), t.offenders, requests)
