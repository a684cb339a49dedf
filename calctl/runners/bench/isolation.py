"""Scenario ``isolation``: gate G2, replica isolation (001 §12 Phase 2, §13.1, §17 G2).

Input: a **replica** package, one model under two aliases, A0 on chip 0 and A1
on chip 1, with identical architecture, weights and tokenizer (checked here
byte for byte; anything else is refused, exit 2). The serving engine runs
in-process on ``options.device`` (the mock by default, or ``--device calrt``):

1. **serial golden** (Phase 2 step 2): the engine's own readiness gate runs
   each alias's golden (logits, top-k, exact tokens; 001 §11.1), A0 then A1;
   then each alias's golden prompt is served through the engine alone, one
   after the other, and must give the golden tokens exactly;
2. **concurrent run** (Phase 2 step 3): ``options.requests`` requests (default
   1,000), interleaved across A0 and A1 in a seeded order and paced as a
   closed loop: at most :func:`in_flight` requests per alias at a time (its
   compiled batch, twice over), the next one sent as one ends, each with its
   deadline (``--request-timeout``, at least 60 s) counted from its admission,
   so that every request completes on a slow host and at a real board's step
   times (tens of ms). Requests still in flight overlap on both chips;
   each with its own prompt (seeded, unique, 1–48 tokens) and output length
   (1–24 tokens, greedy, EOS ignored); a seeded share is cancelled, at
   different times: before the first token, after k tokens (mid-decode), or by
   a timer that may fire while queued, while decoding or after the end;
3. **checks** (Phase 2 step 4; 001 §13.1 "no cross-model token, logits, KV,
   sequence id crosstalk"; §17 G2 "no buffer/KV/job crosstalk"), each counted
   pass/fail (:data:`CHECKS`): every output against the reference; every token
   from the submitting alias's generation; the engine's per-request and
   per-job records (``calctl.serving.records``) naming the submitting alias,
   its chip and generation; every traced job on its alias's chip; at the end
   the KV lanes, the device's KV sequences and per-chip memory back where they
   were before the run.

**The reference** is the package's own float64 model
(:func:`calctl.model.decoder.reference_logits` over the package's params,
the path that produced its golden data), teacher-forced on the output: output
token *i* must be the reference's greedy choice after the prompt and output
tokens ``0..i-1``. By induction that is exactly "equal to the greedy
reference, token for token" (one reference pass per request instead of one per
token). A completed request must also have all its ``max_tokens`` tokens; a
cancelled one is judged on what it received (a prefix). Where the reference's
top two logits lie within the package's golden tolerance of each other
(``2 * (atol + rtol * |logit|)``) either token is accepted and counted as a
near tie: a device computing in float32 may legitimately pick the other one.

For an output that differs, the other requests' verified outputs are searched
for the one it equals (a token stream delivered to the wrong request or chip:
the crosstalk source); if none matches, the device computed tokens no
reference produced (KV or logits corrupted on that chip).

G2 judges isolation, not patience: crosstalk is a wrong token, a job on the
wrong chip, KV or generation contamination, read from outputs, records and the
trace. A request that still times out is a **load outcome**: counted
(``requests.timed_out``) and reported with the host's load, never an
offender; its partial output is still checked token for token. When timeouts
leave fewer verified requests than were asked for, the verdict is **NOT
JUDGED** (exit 0) saying so, never GO on fewer requests.

Verdict **GO** when every check passed, **NO-GO** (exit 1) otherwise, naming
the first failing requests (request id, alias, chip, check, expected vs got)
and the 001 §17 action: do not enter the different-model phase. Fewer than
:data:`G2_MIN_REQUESTS` requests can still be GO for what was run, but
``requests.threshold_met`` is false and a note says that 001 §13.1 asks for
1,000. On the mock every figure is a **mock result** (docs/runtime.md §5):
a fault plan (``DeviceSpec.fault_plan``, e.g. ``kv_corruption`` or
``corrupt_output``) is live from the moment the device opens, so a fault that
hits the engine's load golden stops the run at the serial golden (NO-GO, no
request sent).

Evidence in ``options.out_dir``: ``isolation-requests.ndjson`` (one line per
request: plan, outcome, tokens, every check), ``records/records.ndjson`` (the
engine's own request and job records), ``isolation-trace.json`` (per-chip
trace, Perfetto) and ``bench.png``.

This module does not render tables for people beyond :class:`Table` rows, and
does not write ``bench-report.json`` (the CLI does).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calctl.errors import CheckFailed, UsageError
from calctl.model import decoder
from calctl.package import npy
from calctl.package.model import Package
from calctl.package.reader import load_manifest, package_root
from calctl.records import dumps_line
from calctl.runners.bench.base import BenchOptions, Scenario, ScenarioResult, Table
from calctl.runners.bench.gates import Gate
from calctl.runners.bench.plot import _device_label, _pyplot, _save
from calctl.runners.device import DeviceSpec
from calctl.runners.trace import busy_overlap, trace_slices, write_chrome_trace
from calctl.runners.traffic import ClientPlan, EngineLoop, EngineResult, TokenTap, drive_engine_request
from calctl.runtime.errors import RuntimeLayerError
from calctl.runtime.interface import FaultInjecting
from calctl.serving.config import default_scheduler_config
from calctl.serving.core.kv import KvState
from calctl.serving.engine import DeviceSupervisor, ServingEngine, SupervisorOptions
from calctl.serving.engine.metrics import EngineMetrics
from calctl.serving.outcomes import RequestOutcome
from calctl.serving.protocol import GenerationRequest, SamplingParams
from calctl.serving.records import RECORDS_FILE, RecordSink

Log = Callable[[str], None]

#: 001 §13.1: "at least 1000 requests" for the concurrency correctness row.
G2_MIN_REQUESTS = 1000
DEFAULT_REQUESTS = 1000
#: Default mock time scale: this scenario judges correctness, not latency, so jobs are short.
ISOLATION_TIME_SCALE = 0.1
PROMPT_TOKENS = (1, 48)  # uniform, inclusive
OUTPUT_TOKENS = (1, 24)
CANCEL_SHARE = 0.2  # of the requests, seeded
TIMER_CANCEL_S = 2.0  # a timer cancel fires uniformly within this many seconds after the submit
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

CANCEL_KINDS = ("after_submit", "mid_decode", "timer")


# ---------------------------------------------------------------------------
# The package: a replica, checked


@dataclass(frozen=True)
class Side:
    """One alias of the replica and where it runs."""

    alias: str
    chip: int
    graphs: tuple[str, ...]
    max_batch: int


@dataclass(frozen=True)
class Replica:
    sides: tuple[Side, Side]
    params_sha256: str
    tokenizer_sha256: str

    def side(self, alias: str) -> Side:
        return next(s for s in self.sides if s.alias == alias)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_replica(pkg: Package, root: Path, source: Path) -> Replica:
    """The package is one model under two aliases on chips 0 and 1; else UsageError (exit 2) saying what is needed."""
    need = (
        "--scenario isolation needs a replica package: one model under two aliases, A0 on chip 0 and A1 on chip 1, "
        "identical weights and tokenizer (`calctl sample-package --kind replica`, or `calctl combine` of one "
        "single-model package with itself)"
    )
    if pkg.kind != "replica" or len(pkg.models) != 2:
        raise UsageError(
            f"{source}: package kind {pkg.kind!r} with {len(pkg.models)} model(s) ({', '.join(pkg.aliases)}); {need}"
        )
    a, b = pkg.models
    chips = [m.target_chips for m in pkg.models]
    if sorted(chips) != [(0,), (1,)]:
        raise UsageError(
            f"{source}: {a.alias} targets chip(s) {list(a.target_chips)}, {b.alias} chip(s) {list(b.target_chips)}; "
            f"{need}"
        )
    if a.architecture != b.architecture:
        raise UsageError(f"{source}: {a.alias} and {b.alias} have different architectures; {need}")
    pa, pb = (decoder.load_params(root, m.params, keep_dtype=True) for m in (a, b))
    if pa.keys() != pb.keys():
        raise UsageError(f"{source}: {a.alias} and {b.alias} have different parameter tensors; {need}")
    h = hashlib.sha256()
    for name in sorted(pa):
        if pa[name].dtype != pb[name].dtype or not np.array_equal(pa[name], pb[name]):
            raise UsageError(f"{source}: parameter {name!r} of {b.alias} differs from {a.alias}'s; {need}")
        h.update(name.encode() + b"\0" + np.ascontiguousarray(pa[name]).tobytes())
    toks = []
    for m in (a, b):
        files = [m.tokenizer.file] + ([m.tokenizer.config] if m.tokenizer.config else [])
        toks.append(tuple(_sha256(root / f) for f in files))
    if toks[0] != toks[1]:
        raise UsageError(f"{source}: {a.alias} and {b.alias} have different tokenizer files; {need}")
    sides = []
    for m in sorted(pkg.models, key=lambda m: m.target_chips[0]):
        sides.append(
            Side(
                m.alias,
                m.target_chips[0],
                tuple(g.name for g in m.graphs),
                max((p for g in m.graphs for p in g.batch_profiles), default=1),
            )
        )
    return Replica((sides[0], sides[1]), h.hexdigest(), toks[0][0])


# ---------------------------------------------------------------------------
# The reference: the package's float64 model, teacher-forced


@dataclass(frozen=True)
class Verdict:
    """One output against the reference."""

    ok: bool
    first_mismatch: int | None = None  # output token index
    expected: int | None = None  # the reference's greedy token there
    got: int | None = None
    gap: float | None = None  # reference logit of the expected token minus that of the got one
    slack: float | None = None  # the tolerance a near tie may use
    near_ties: int = 0


class Reference:
    """Greedy reference of one model: :func:`calctl.model.decoder.reference_logits` in float64."""

    def __init__(self, pkg: Package, root: Path, alias: str) -> None:
        m = pkg.model(alias)
        self.arch = m.architecture
        self.params = {k: v.astype(np.float64) for k, v in decoder.load_params(root, m.params).items()}
        self.rtol, self.atol = m.golden.tolerance.rtol, m.golden.tolerance.atol

    def judge(self, prompt: tuple[int, ...], got: list[int]) -> Verdict:
        if not got:
            return Verdict(True)
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
            return Verdict(False, i, best, tok, gap, slack, ties)
        return Verdict(True, near_ties=ties)

    def greedy(self, prompt: tuple[int, ...], n: int) -> list[int]:
        tokens, _, _ = decoder.reference_generate(self.params, self.arch, np.array(prompt), max(1, n))
        return [int(t) for t in tokens]


# ---------------------------------------------------------------------------
# The workload


@dataclass(frozen=True)
class Planned:
    index: int
    request_id: str
    side: Side
    prompt: tuple[int, ...]
    max_tokens: int
    cancel: str  # "" | after_submit | mid_decode | timer
    cancel_after_tokens: int | None = None
    cancel_after_s: float | None = None

    def request(self) -> GenerationRequest:
        return GenerationRequest(
            self.request_id,
            self.side.alias,
            "isolation",
            self.prompt,
            self.max_tokens,
            SamplingParams(temperature=0.0),
            ignore_eos=True,
        )

    def plan(self) -> ClientPlan:
        return ClientPlan(
            f"isolation-{self.cancel or 'complete'}",
            cancel_after_tokens=self.cancel_after_tokens,
            cancel_after_s=self.cancel_after_s,
        )


#: Requests in flight per alias: its compiled decode batch times this (closed loop, 001 §13.1 still concurrent).
IN_FLIGHT_PER_LANE = 2


def in_flight(side: Side) -> int:
    """How many requests the closed loop keeps in flight on ``side`` (at least 4)."""
    return max(4, IN_FLIGHT_PER_LANE * side.max_batch)


def plan_workload(n: int, replica: Replica, *, vocab: int, context: int, seed: int) -> list[Planned]:
    """``n`` requests, half per alias, in a seeded interleaved order; unique prompts; seeded cancellations."""
    rng = np.random.default_rng(seed)
    sides = [replica.sides[i % 2] for i in range(n)]
    order = rng.permutation(n)
    seen: set[tuple[int, ...]] = set()
    out = []
    for k, i in enumerate(order):
        side = sides[int(i)]
        max_tokens = int(rng.integers(OUTPUT_TOKENS[0], OUTPUT_TOKENS[1] + 1))
        hi = max(PROMPT_TOKENS[0], min(PROMPT_TOKENS[1], context - max_tokens))
        while True:
            length = int(rng.integers(PROMPT_TOKENS[0], hi + 1))
            prompt = tuple(int(t) for t in rng.integers(3, vocab, size=length))
            if prompt not in seen:
                seen.add(prompt)
                break
        cancel, after_tokens, after_s = "", None, None
        if rng.random() < CANCEL_SHARE:
            cancel = CANCEL_KINDS[int(rng.integers(len(CANCEL_KINDS)))]
            if cancel == "mid_decode" and max_tokens < 2:
                cancel = "after_submit"
            if cancel == "after_submit":  # the next loop turn after the submit: queued or in its prefill
                after_s = 0.0
            elif cancel == "mid_decode":
                after_tokens = int(rng.integers(1, max_tokens))
            else:
                after_s = float(rng.uniform(0.0, TIMER_CANCEL_S))
        out.append(Planned(k, f"iso-{k:05d}", side, prompt, max_tokens, cancel, after_tokens, after_s))
    return out


# ---------------------------------------------------------------------------
# Judgement of one request


@dataclass
class Judged:
    planned: Planned
    result: EngineResult | None
    tokens: list[int]
    generations: frozenset[int]  # the submitting alias's generations during the run (more than one after a reset)
    verdict: Verdict = field(default_factory=lambda: Verdict(True))
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
            "near_ties": self.verdict.near_ties,
            "first_mismatch": self.verdict.first_mismatch,
            "expected_token": self.verdict.expected,
            "got_token": self.verdict.got,
            "expected_prefix": self.expected_prefix,
            "crosstalk_source": self.source,
            "checks": {**{c: True for c in self.passed}, **{c: False for c, _ in self.failures}},
            "failures": [{"check": c, "detail": d} for c, d in self.failures],
            "load_outcome": self.load_outcome,
            "ttft_s": None if rec is None or rec.ttft is None else round(rec.ttft, 6),
            "e2e_s": None if rec is None or rec.e2e is None else round(rec.e2e, 6),
        }


def judge_request(j: Judged, ref: Reference, record: dict[str, Any] | None) -> None:
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
    j.verdict = ref.judge(p.prompt, j.tokens)
    v = j.verdict
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
        if j.verdict.ok and len(j.tokens) >= CROSSTALK_MIN_TOKENS:
            by_head.setdefault(tuple(j.tokens[:CROSSTALK_MIN_TOKENS]), []).append(j)
    for j in judged:
        if j.verdict.ok:
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


@dataclass
class _SideState:
    """What the end-of-run KV check compares, per alias."""

    lanes: dict[str, int]
    reserved_tokens: int
    used_tokens: int
    inflight: int
    quarantined: int
    device_free_sequences: int | None

    def document(self) -> dict[str, Any]:
        return {
            "kv_lanes": self.lanes,
            "kv_reserved_tokens": self.reserved_tokens,
            "kv_used_tokens": self.used_tokens,
            "inflight_jobs": self.inflight,
            "quarantined_jobs": self.quarantined,
            "device_free_kv_sequences": self.device_free_sequences,
        }


def _free_sequences(rt: Any, alias: str, limit: int = 1 << 16) -> int | None:
    """How many more KV sequences the runtime would allocate for ``alias`` (None: it cannot tell)."""
    try:
        if not rt.kv.can_allocate(alias, 0):
            return 0
        lo, hi = 0, 1
        while hi <= limit and rt.kv.can_allocate(alias, hi):
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if rt.kv.can_allocate(alias, mid):
                lo = mid
            else:
                hi = mid
        return lo
    except (RuntimeLayerError, NotImplementedError):
        return None


def _side_state(sup: DeviceSupervisor, alias: str) -> _SideState:
    w = sup.workers[alias]
    snap = w.snapshot()
    return _SideState(
        dict(snap.kv_lanes),
        int(snap.kv_reserved_tokens),
        int(snap.kv_used_tokens),
        int(snap.inflight_jobs),
        int(snap.quarantined_jobs),
        _free_sequences(sup.rt, alias),
    )


def _memory(rt: Any) -> dict[int, int | None]:
    try:
        return {m.chip: m.used_bytes for m in rt.memory_usage()}
    except RuntimeLayerError:
        return {}


def _read_records(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not path.is_file():
        return out
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def _device_text(device: DeviceSpec, versions: Any) -> str:
    if device.is_mock:
        return "mock (simulated board; MOCK RESULT, not hardware evidence)"
    fw = f", firmware {versions.firmware}" if versions is not None and versions.firmware else ""
    return f"calrt via {device.calrt_lib or '$CALRT_LIBRARY'}{fw}"


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


class _Run:
    def __init__(self, opts: BenchOptions, log: Log) -> None:
        self.opts = opts
        self.log = log
        self.files: dict[str, str] = {}

    def run(self) -> ScenarioResult:
        opts = self.opts
        if opts.requests < 1:
            raise UsageError(f"--requests {opts.requests}: expected at least 1 (001 §13.1 asks for {G2_MIN_REQUESTS})")
        if opts.package is None or opts.trust is None:
            raise UsageError("--scenario isolation needs a replica package (PKG) and a trust policy")
        if opts.models:
            raise UsageError("--scenario isolation serves both aliases of the replica: --models does not apply")
        device = (opts.device or DeviceSpec()).with_default_time_scale(ISOLATION_TIME_SCALE)
        with package_root(opts.package) as root:
            pkg = load_manifest(root)
            replica = check_replica(pkg, root, opts.package)
            refs = {s.alias: Reference(pkg, root, s.alias) for s in replica.sides}
            golden = {s.alias: _golden_case(pkg, root, s.alias) for s in replica.sides}
            arch = pkg.model(replica.sides[0].alias).architecture
        opts.out_dir.mkdir(parents=True, exist_ok=True)
        self.replica, self.refs, self.device = replica, refs, device
        work = plan_workload(opts.requests, replica, vocab=arch.vocab_size, context=arch.context_limit, seed=opts.seed)
        records_dir = opts.out_dir / "records"
        sink = RecordSink.to_directory(records_dir)
        self.files["records_ndjson"] = str(records_dir / RECORDS_FILE)
        self.golden_rows: list[dict[str, Any]] = []
        self.judged: list[Judged] = []
        self.before: dict[str, _SideState] = {}
        self.after: dict[str, _SideState] = {}
        self.mem_before: dict[int, int | None] = {}
        self.mem_after: dict[int, int | None] = {}
        self.events: tuple[Any, ...] = ()
        self.versions: Any = None
        self.generations: dict[str, set[int]] = {}
        self.recoveries: list[dict[str, Any]] = []
        self.faults_fired: list[dict[str, Any]] | None = None  # None: not a mock, nothing injected by calctl
        self.wall_s = 0.0
        self.in_flight: dict[str, int] = {}
        self.seconds: dict[str, float] = {}  # where the run's time went: load, serial golden, serve, judge
        self.start_error: str | None = None
        self.drained = True
        try:
            with device.open() as rt:
                self.versions = rt.versions()
                sup = DeviceSupervisor(
                    rt,
                    trust=opts.trust,
                    scheduler_configs={
                        s.alias: default_scheduler_config(s.alias, max_waiting_requests=max(128, len(work)))
                        for s in replica.sides
                    },
                    options=SupervisorOptions(warmup_iterations=1),
                    metrics=EngineMetrics(records=sink),
                )
                try:
                    self.log(
                        f"  loading {opts.package} on {_device_text(device, self.versions)}"
                        + (f" (time scale {device.time_scale:g})" if device.is_mock else "")
                    )
                    try:
                        t_load = time.monotonic()
                        sup.start(opts.package)  # golden + warm-up of A0 then A1 before Ready (001 §11.1)
                        self.seconds["load_golden_warmup"] = time.monotonic() - t_load
                    except CheckFailed as exc:
                        # Only the load gate's golden/warm-up is this scenario's verdict; a package that fails
                        # validation, the budget or the device fit is the CLI's error (exit 1, its own message).
                        if not _load_gate_failure(exc.message, replica):
                            raise
                        self.start_error = exc.message
                        self.log(f"  serial golden failed at load: {exc.message}")
                    if self.start_error is None:
                        self._serve(sup, rt, work, golden)
                finally:
                    sup.shutdown(5.0)
        finally:
            sink.close()
        return self.result(work)

    def _serve(
        self,
        sup: DeviceSupervisor,
        rt: Any,
        work: list[Planned],
        golden: dict[str, tuple[tuple[int, ...], list[int]]],
    ) -> None:
        engine = ServingEngine(sup)
        self.generations = {a: {w.generation} for a, w in sup.workers.items()}
        recoveries0 = len(sup.recoveries)
        timeout = max(60.0, self.opts.request_timeout_s)
        since = time.monotonic_ns()
        taps: dict[str, TokenTap] = {}

        def submit(req: GenerationRequest) -> TokenTap:
            tap = TokenTap(engine.submit(req))
            taps[req.request_id] = tap
            return tap

        with EngineLoop("isolation") as loop:
            t_golden = time.monotonic()
            for side in self.replica.sides:  # 001 §12 Phase 2 step 2: serially, one side then the other
                prompt, want = golden[side.alias]
                req = GenerationRequest(
                    f"iso-golden-{side.alias}",
                    side.alias,
                    "isolation",
                    prompt,
                    len(want),
                    SamplingParams(temperature=0.0),
                    ignore_eos=True,
                )
                res = loop.submit(
                    drive_engine_request(submit, req, ClientPlan("isolation-golden"), timeout_s=timeout)
                ).result(timeout + 10)
                got = taps[req.request_id].tokens if req.request_id in taps else []
                ok = res.record.ok and got == want
                at = next((i for i, (x, y) in enumerate(zip(want, got, strict=False)) if x != y), None)
                self.golden_rows.append(
                    {
                        "alias": side.alias,
                        "chip": side.chip,
                        "load_gate": "passed",
                        "served_ok": ok,
                        "expected_tokens": want,
                        "got_tokens": got,
                        "first_mismatch": at if at is not None else (None if ok else min(len(want), len(got))),
                        "outcome": res.record.outcome.value,
                    }
                )
                self.log(f"  serial golden {side.alias} (chip {side.chip}): {'ok' if ok else 'MISMATCH'}")
            self._wait_idle(sup)
            self.seconds["serial_golden"] = time.monotonic() - t_golden
            self.before = {s.alias: _side_state(sup, s.alias) for s in self.replica.sides}
            self.mem_before = _memory(rt)
            self.in_flight = {s.alias: in_flight(s) for s in self.replica.sides}
            self.log(
                f"  {len(work)} requests over {', '.join(s.alias for s in self.replica.sides)} in a closed loop "
                f"({', '.join(f'{a}: {n} in flight' for a, n in self.in_flight.items())}; deadline {timeout:g} s "
                f"from admission), {sum(1 for p in work if p.cancel)} of them cancelled on a cue"
            )

            async def everything() -> list[EngineResult]:
                slots = {a: asyncio.Semaphore(n) for a, n in self.in_flight.items()}

                async def one(p: Planned) -> EngineResult:
                    async with slots[p.side.alias]:
                        return await drive_engine_request(
                            submit, p.request(), p.plan(), timeout_s=timeout, from_admission=True
                        )

                return await asyncio.gather(*(one(p) for p in work))

            t0 = time.monotonic()
            # closed loop: each slot serves its share one request after another, each within its own deadline
            per_slot = max(1, -(-len(work) // max(1, sum(self.in_flight.values()))))
            results = loop.submit(everything()).result((timeout + 10) * per_slot + 30)
            self.wall_s = time.monotonic() - t0
            self.seconds["serve"] = self.wall_s
        self.drained = self._wait_idle(sup)
        # A reset during the run (a fault) republishes the aliases under a new generation: those count as theirs.
        for rec in sup.recoveries[recoveries0:]:
            self.recoveries.append(
                {
                    "alias": rec.alias,
                    "reason": rec.reason,
                    "scope": rec.scope,
                    "ok": rec.ok,
                    "generations": rec.generations,
                }
            )
            for alias, gen in rec.generations.items():
                self.generations.setdefault(alias, set()).add(gen)
        for alias, w in sup.workers.items():
            self.generations[alias].add(w.generation)
        self.after = {s.alias: _side_state(sup, s.alias) for s in self.replica.sides}
        self.mem_after = _memory(rt)
        with contextlib.suppress(RuntimeLayerError):
            self.events = rt.trace(since_ns=since)
        if isinstance(rt, FaultInjecting):  # the mock says which faults of the plan fired
            self.faults_fired = [
                {"kind": f.kind.value, "graph": f.graph, "model": f.model, "chips": list(f.chips), "job": f.job}
                for f in rt.injected_faults()
            ]
        self.judged = [
            Judged(
                p,
                r,
                taps[p.request_id].tokens if p.request_id in taps else [],
                frozenset(self.generations[p.side.alias]),
            )
            for p, r in zip(work, results, strict=True)
        ]
        self.log(f"  served in {self.wall_s:.1f} s; judging against the package reference")

    @staticmethod
    def _wait_idle(sup: DeviceSupervisor, timeout_s: float = 30.0) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            # idle, and settled: a recovery after a fault ends in Ready (or Failed) before the KV is judged
            if all(
                w.inflight() == 0 and w.live_requests() == 0 and (w.is_ready() or w.failed is not None)
                for w in sup.workers.values()
            ):
                return True
            time.sleep(0.01)
        return False

    # -- judgement ---------------------------------------------------------------------------------

    def result(self, work: list[Planned]) -> ScenarioResult:
        t_judge = time.monotonic()
        t = Tally()
        self._golden_checks(t)
        records = _read_records(Path(self.files["records_ndjson"]))
        self._request_checks(t, {r["request_id"]: r for r in records if r.get("record") == "request"})
        self._job_checks(t, [r for r in records if r.get("record") == "job"])
        self._trace_checks(t)
        self._kv_checks(t)
        go = t.clean and self.start_error is None
        checks = t.documents()
        requests = self._requests_document(work)
        # The decision rule: GO only on the requests asked for, all verified; timeouts (a load outcome) that
        # leave fewer is NOT JUDGED, never GO and never an offender.
        undecided = go and requests["timed_out"] > 0
        verdict = "NOT JUDGED" if undecided else "GO" if go else "NO-GO"
        self._write_requests()
        trace_doc = self._trace_document()
        plot = self.opts.out_dir / "bench.png"
        self.files["plot"] = str(plot)
        plot_isolation(plot, self, verdict, checks)
        self.seconds["judge_and_evidence"] = time.monotonic() - t_judge
        gates = tuple(
            Gate(
                f"G2.{name}",
                CHECKS[name],
                float(c["fail"]),
                c["fail"] == 0 and (name != "serial_golden" or self.start_error is None),
                f"{c['pass']} passed, {c['fail']} failed"
                + (f"; first: {c['first_failure']}" if c["first_failure"] else ""),
                samples=c["pass"] + c["fail"],
            )
            for name, c in checks.items()
        )
        table = Table(
            "G2 replica isolation (001 §12 Phase 2, §13.1)" + (" (MOCK)" if self.device.is_mock else ""),
            ("check", "pass", "fail", "first failure"),
            tuple((n, c["pass"], c["fail"], (c["first_failure"] or "")[:160]) for n, c in checks.items()),
        )
        body = {
            "gate": "G2",
            "package": str(self.opts.package),
            "sides": [
                {
                    "alias": s.alias,
                    "chip": s.chip,
                    "graphs": list(s.graphs),
                    "generations": sorted(self.generations.get(s.alias, ())),
                }
                for s in self.replica.sides
            ],
            "replica": {"params_sha256": self.replica.params_sha256, "tokenizer_sha256": self.replica.tokenizer_sha256},
            "device": self.device.kind.value,
            "device_text": _device_text(self.device, self.versions),
            "device_options": self.device.describe(),
            "runtime": None
            if self.versions is None
            else {"runtime": self.versions.runtime, "firmware": self.versions.firmware, "abi": self.versions.abi},
            "workload": {
                "requests": self.opts.requests,
                "prompt_tokens": list(PROMPT_TOKENS),
                "output_tokens": list(OUTPUT_TOKENS),
                "cancel_share": CANCEL_SHARE,
                "timer_cancel_within_s": TIMER_CANCEL_S,
                "submission": "closed loop, interleaved across the aliases in a seeded order: at most "
                + ", ".join(f"{a}: {n}" for a, n in self.in_flight.items())
                + " in flight, each request's deadline counted from its admission",
                "in_flight": dict(self.in_flight),
                "deadline_s": max(60.0, self.opts.request_timeout_s),
                "alias_switches": sum(1 for a, b in itertools.pairwise(work) if a.side is not b.side),
                "temperature": 0.0,
                "ignore_eos": True,
                "seed": self.opts.seed,
                "reference": "the package's float64 model (calctl.model.decoder.reference_logits), teacher-forced",
            },
            "serial_golden": self.golden_rows,
            "load_error": self.start_error,
            "requests": requests,
            "checks": checks,
            "crosstalk": t.offenders,
            "recoveries": self.recoveries,
            "faults_fired": self.faults_fired,
            "kv": {
                s.alias: {
                    "before": self.before[s.alias].document() if s.alias in self.before else None,
                    "after": self.after[s.alias].document() if s.alias in self.after else None,
                }
                for s in self.replica.sides
            },
            "memory_used_bytes": {"before": self.mem_before, "after": self.mem_after},
            "trace": trace_doc,
            "no_go_action": None if go else NO_GO_ACTION,
            "phase_seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "files": dict(self.files),
        }
        return ScenarioResult(
            "isolation",
            verdict,
            0 if go else 1,
            gates,
            (table,),
            body,
            plot,
            tuple(self._notes(go, t.offenders, requests)),
            mock_result=self.device.is_mock,
        )

    def _golden_checks(self, t: Tally) -> None:
        if self.start_error is not None:
            failed = next((s for s in self.replica.sides if self.start_error.startswith(f"{s.alias}:")), None)
            for s in self.replica.sides:
                t.add("serial_golden", s is not failed, f"{s.alias} (chip {s.chip}): {self.start_error}")
            t.offend(
                "load-golden",
                failed,
                "serial_golden",
                f"the engine's load gate refused Ready: {self.start_error}; no request was sent",
            )
        for row in self.golden_rows:
            side = self.replica.side(row["alias"])
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

    def _request_checks(self, t: Tally, records: dict[str, dict[str, Any]]) -> None:
        for j in self.judged:
            judge_request(j, self.refs[j.planned.side.alias], records.get(j.planned.request_id))
        find_sources(self.judged)
        detailed = 0
        for j in self.judged:
            p = j.planned
            for name in j.passed:
                t.add(name, True)
            for name, detail in j.failures:
                t.add(name, False, f"{p.request_id} ({p.side.alias}, chip {p.side.chip}): {detail}")
            if not j.failures:
                continue
            if not j.verdict.ok and detailed < DETAILED:  # the reference's own continuation, for people
                detailed += 1
                at = j.verdict.first_mismatch or 0
                j.expected_prefix = j.tokens[:at] + self.refs[p.side.alias].greedy(
                    p.prompt + tuple(j.tokens[:at]), min(PREFIX, max(1, len(j.tokens) - at))
                )
            start = max(0, (j.verdict.first_mismatch or 0) - 4)  # a window that shows where the streams part
            name, detail = j.failures[0]
            t.offend(
                p.request_id,
                p.side,
                name,
                detail,
                checks_failed=[c for c, _ in j.failures],
                cancel=p.cancel or None,
                outcome=j.outcome,
                first_mismatch=j.verdict.first_mismatch,
                from_token=start,
                expected_prefix=None if j.expected_prefix is None else j.expected_prefix[start : start + PREFIX],
                got_prefix=j.tokens[start : start + PREFIX],
                source=j.source,
            )

    def _requests_document(self, work: list[Planned]) -> dict[str, Any]:
        sent = len(self.judged)

        def count(pred: Callable[[Judged], bool], side: Side | None = None) -> int:
            return sum(1 for j in self.judged if (side is None or j.planned.side is side) and pred(j))

        ok, cancelled = RequestOutcome.OK.value, RequestOutcome.CANCELLED.value
        return {
            "sent": sent,
            "completed": count(lambda j: j.outcome == ok),
            "cancelled": count(lambda j: j.outcome == cancelled),
            "timed_out": count(lambda j: j.load_outcome is not None),
            "failed": count(
                lambda j: j.result is not None and j.result.record.outcome.is_error and j.load_outcome is None
            ),
            "planned": len(work),
            "not_sent": len(work) - sent,
            "by_alias": {
                s.alias: {
                    "chip": s.chip,
                    "sent": count(lambda j: True, s),
                    "completed": count(lambda j: j.outcome == ok, s),
                    "cancelled": count(lambda j: j.outcome == cancelled, s),
                }
                for s in self.replica.sides
            },
            "cancel_cues": {k: sum(1 for p in work if p.cancel == k) for k in CANCEL_KINDS},
            # where the cancellations really landed: a cue may fire before, during or after the output
            "cancelled_before_first_token": count(lambda j: j.outcome == cancelled and not j.tokens),
            "cancelled_mid_decode": count(lambda j: j.outcome == cancelled and bool(j.tokens)),
            "cue_after_the_end": count(lambda j: bool(j.planned.cancel) and j.outcome == ok),
            "output_tokens": sum(len(j.tokens) for j in self.judged),
            "near_ties": sum(j.verdict.near_ties for j in self.judged),
            "threshold": G2_MIN_REQUESTS,
            "threshold_met": sent >= G2_MIN_REQUESTS,
            "wall_s": round(self.wall_s, 3),
        }

    def _notes(self, go: bool, offenders: list[dict[str, Any]], requests: dict[str, Any]) -> list[str]:
        notes = []
        if requests["timed_out"]:
            notes.append(
                f"{'NOT JUDGED: ' if go else ''}{requests['timed_out']} request(s) timed out (a load outcome: the "
                "host or the device was too slow for the deadline, never counted as crosstalk); "
                f"{requests['sent'] - requests['timed_out']} were verified. Rerun on a less loaded host or with a "
                "longer --request-timeout to judge all of them"
            )
        if not go:
            notes.append(f"NO-GO: {NO_GO_ACTION}")
            for o in offenders[:10]:
                notes.append(
                    f"failing gate {o['check']}: {o['request_id']} ({o['alias']}, chip {o['chip']}): {o['detail']}"
                    + (
                        f"; from output token {o['from_token']}: expected {o['expected_prefix']}, got {o['got_prefix']}"
                        if o.get("expected_prefix")
                        else ""
                    )
                    + (f"; source: {o['source']}" if o.get("source") else "")
                )
            if len(offenders) > 10:
                notes.append(f"failing gate: and {len(offenders) - 10} more offenders (the crosstalk list)")
        if requests["sent"] < G2_MIN_REQUESTS:
            notes.append(
                f"{requests['sent']} requests: 001 §13.1 asks for at least {G2_MIN_REQUESTS}; this verdict covers "
                "only what was run (requests.threshold_met false)"
            )
        if self.faults_fired:
            hit = sorted({o["alias"] for o in offenders if o["request_id"].startswith("iso-") and o["alias"]})
            notes.append(
                f"{len(self.faults_fired)} fault(s) of the fault plan fired "
                f"({', '.join(sorted({f['kind'] + ' on ' + str(f['graph'] or f['model']) for f in self.faults_fired}))})"
                f"; offending requests on: {', '.join(hit) or 'none'} (a corruption that changes no greedy token, "
                "or hits a sequence's last step, is invisible in the output)"
            )
        if self.recoveries:
            notes.append(
                f"{len(self.recoveries)} recovery(ies) during the run: "
                + "; ".join(
                    f"{r['scope']} reset for a {r['reason']} of {r['alias']}" + ("" if r["ok"] else " (FAILED)")
                    for r in self.recoveries
                )
            )
        if requests["near_ties"]:
            notes.append(
                f"{requests['near_ties']} output token(s) where the reference's top two logits lie within the "
                "golden tolerance: either token accepted"
            )
        if self.device.is_mock:
            notes.append(
                "MOCK RESULT: the replica ran on the simulated board; this shows the tool and the engine's isolation, "
                "not a Calculet board's (docs/runtime.md §5)"
            )
        return notes

    def _job_checks(self, t: Tally, jobs: list[dict[str, Any]]) -> None:
        """Every job record (001 §14) on its own alias's graph, chip and generation, within the compiled batch."""
        for r in jobs:
            alias = r.get("model_alias")
            side = next((s for s in self.replica.sides if s.alias == alias), None)
            problems = []
            if side is None:
                problems.append(f"model_alias {alias!r} is neither side")
            else:
                gens = self.generations.get(side.alias, set())
                if r.get("graph") not in side.graphs:
                    problems.append(f"graph {r.get('graph')!r} is not one of {alias}'s")
                if r.get("chips") != [side.chip]:
                    problems.append(f"chips {r.get('chips')}, {alias} is on chip {side.chip}")
                if r.get("generation") not in gens:
                    problems.append(f"generation {r.get('generation')}, {alias} served {sorted(gens)}")
                if not isinstance(r.get("lanes"), int) or not 1 <= r["lanes"] <= side.max_batch:
                    problems.append(f"lanes {r.get('lanes')}, compiled at most {side.max_batch}")
            detail = f"job {r.get('job_id')} ({alias}): {'; '.join(problems)}"
            t.add("job_records", not problems, detail)
            if problems:
                t.offend(f"job-{r.get('job_id')}", side, "job_records", detail)

    def _trace_checks(self, t: Tally) -> None:
        """Every traced job (the runtime's own per-chip trace) on its alias's chip, graph and generation."""
        for e in self.events:
            side = next((s for s in self.replica.sides if s.alias == e.model), None)
            problems = []
            if side is None:
                problems.append(f"model {e.model!r} is neither side")
            else:
                gens = self.generations.get(side.alias, set())
                if e.chip != side.chip:
                    problems.append(f"ran on chip {e.chip}, {side.alias} is on chip {side.chip}")
                if e.graph not in side.graphs:
                    problems.append(f"graph {e.graph!r} is not one of {side.alias}'s")
                if int(e.generation) not in gens:
                    problems.append(f"generation {int(e.generation)}, {side.alias} served {sorted(gens)}")
            detail = f"traced job {int(e.job)} ({e.model}, chip {e.chip}): {'; '.join(problems)}"
            t.add("trace_chips", not problems, detail)
            if problems:
                t.offend(f"job-{int(e.job)}", side, "trace_chips", detail)

    def _kv_checks(self, t: Tally) -> None:
        """At the end, per alias: lanes, reserved/used KV, jobs, the device's KV sequences and memory as before."""
        if self.start_error is not None:
            return
        free = KvState.FREE.value
        for s in self.replica.sides:
            b, a = self.before[s.alias], self.after[s.alias]
            problems = []
            busy = {k: v for k, v in a.lanes.items() if k != free and v}
            if busy:
                problems.append(f"KV lanes not free: {busy}")
            if a.reserved_tokens or a.used_tokens:
                problems.append(f"{a.reserved_tokens} reserved and {a.used_tokens} used KV tokens left")
            if a.inflight or a.quarantined:
                problems.append(f"{a.inflight} job(s) in flight, {a.quarantined} quarantined")
            if a.lanes.get(free) != b.lanes.get(free):
                problems.append(f"{a.lanes.get(free, 0)} free lanes, {b.lanes.get(free, 0)} before the run")
            if a.device_free_sequences != b.device_free_sequences:
                problems.append(
                    f"the device allocates {a.device_free_sequences} more KV sequences, "
                    f"{b.device_free_sequences} before the run"
                )
            mb, ma = self.mem_before.get(s.chip), self.mem_after.get(s.chip)
            if mb is not None and ma is not None and ma != mb:
                problems.append(f"chip {s.chip} memory used {ma} bytes, {mb} before the run")
            if not self.drained:
                problems.append("requests still live 30 s after the last one ended")
            detail = f"{s.alias} (chip {s.chip}): {'; '.join(problems)}"
            t.add("kv_released", not problems, detail)
            if problems:
                t.offend(f"kv-{s.alias}", s, "kv_released", detail)

    def _write_requests(self) -> None:
        path = self.opts.out_dir / "isolation-requests.ndjson"
        with path.open("w", encoding="utf-8") as f:
            for j in self.judged:
                f.write(dumps_line(j.document()))
        self.files["requests_ndjson"] = str(path)

    def _trace_document(self) -> dict[str, Any]:
        slices = trace_slices(self.events)
        doc: dict[str, Any] = {"jobs": len(self.events), "both_busy_fraction": None, "per_chip_jobs": {}}
        for s in self.replica.sides:
            doc["per_chip_jobs"][str(s.chip)] = sum(1 for e in self.events if e.chip == s.chip)
        if slices:
            t0, t1 = min(x.start for x in slices), max(x.end for x in slices)
            both = sum(e - s for s, e in busy_overlap(slices))
            doc["both_busy_fraction"] = round(both / (t1 - t0), 4) if t1 > t0 else None
            path = self.opts.out_dir / "isolation-trace.json"
            write_chrome_trace(
                path,
                slices,
                device=self.device.kind.value,
                metadata={"scenario": "isolation", "mock_result": self.device.is_mock},
            )
            self.files["trace"] = str(path)
        doc["note"] = (
            "Phase 2 step 5 evidence: the share of the run during which both chips had a job running; "
            "G3 judges S2, this scenario does not"
        )
        return doc


def _load_gate_failure(message: str, replica: Replica) -> bool:
    """The supervisor's "golden + warm-up before Ready" refusal (001 §11.1) of one of the replica's aliases."""
    return any(
        message.startswith((f"{s.alias}: golden check failed", f"{s.alias}: warm-up had")) for s in replica.sides
    )


def _golden_case(pkg: Package, root: Path, alias: str) -> tuple[tuple[int, ...], list[int]]:
    g = pkg.model(alias).golden
    prompt = npy.load(root / g.prompt.file).reshape(-1)
    tokens = npy.load(root / g.decode_tokens.file).reshape(-1)
    return tuple(int(t) for t in prompt), [int(t) for t in tokens]


def plot_isolation(path: Path, run: _Run, verdict: str, checks: dict[str, dict[str, Any]]) -> None:
    """Requests over time per side (offenders in red) and the check counts."""
    plt = _pyplot()
    fig, (ax, ax_c) = plt.subplots(1, 2, figsize=(14, 5), width_ratios=[3, 2])
    colours = {run.replica.sides[0].alias: "#1f77b4", run.replica.sides[1].alias: "#ff7f0e"}
    sent = [j.result.record.sent for j in run.judged if j.result is not None]
    t0 = min(sent, default=0.0)
    for j in run.judged:
        rec = j.result.record if j.result is not None else None
        if rec is None or rec.end is None:
            continue
        bad = bool(j.failures)
        ax.plot(
            [rec.sent - t0, rec.end - t0],
            [j.planned.index, j.planned.index],
            color="#d62728" if bad else colours[j.planned.side.alias],
            linewidth=1.6 if bad else 0.6,
            alpha=1.0 if bad else 0.6,
        )
        if j.outcome == RequestOutcome.CANCELLED.value:
            ax.plot([rec.end - t0], [j.planned.index], marker="x", markersize=2.5, color="#555555")
    for alias, c in colours.items():
        ax.plot([], [], color=c, label=f"{alias} (chip {run.replica.side(alias).chip})")
    ax.plot([], [], color="#d62728", label="failed a check")
    ax.plot([], [], marker="x", linestyle="", color="#555555", label="cancelled")
    ax.set_xlabel("time since the first request (s)")
    ax.set_ylabel("request (submission order)")
    ax.legend(fontsize=8, loc="lower right")
    names = list(CHECKS)
    y = np.arange(len(names))
    totals = [max(1, checks[n]["pass"] + checks[n]["fail"]) for n in names]
    passed = [checks[n]["pass"] / t for n, t in zip(names, totals, strict=True)]
    failed = [checks[n]["fail"] / t for n, t in zip(names, totals, strict=True)]
    ax_c.barh(y, passed, color="#2ca02c", label="pass")
    ax_c.barh(y, failed, left=passed, color="#d62728", label="fail")
    for i, n in enumerate(names):
        ax_c.text(1.01, i, f"{checks[n]['pass']}/{checks[n]['pass'] + checks[n]['fail']}", va="center", fontsize=7)
    ax_c.set_yticks(y, names, fontsize=8)
    ax_c.set_xlim(0, 1.18)
    ax_c.invert_yaxis()
    ax_c.set_xlabel("share of the items checked (requests, jobs, sides) that passed")
    ax_c.legend(fontsize=8, loc="lower right")
    device = "mock" if run.device.is_mock else _device_text(run.device, run.versions)
    fig.suptitle(
        f"calctl bench isolation (G2): {verdict}; {len(run.judged)} requests over "
        f"{', '.join(s.alias for s in run.replica.sides)}\n{_device_label(device)}",
        fontsize=10,
    )
    _save(fig, path)


def run_isolation(options: BenchOptions, log: Log) -> ScenarioResult:
    """``calctl bench --scenario isolation``."""
    return _Run(options, log).run()


ISOLATION = Scenario(
    "isolation",
    "G2 replica isolation in-process: serial golden, then 1,000 concurrent requests over A0/A1 with cancellations, "
    "every output against the package reference, records, trace and KV checked (001 §12 Phase 2, §13.1)",
    run_isolation,
    needs_url=False,
    options=("PKG", "--requests", "--seed", "--time-scale", "--fault-plan", "--request-timeout"),
)

__all__ = [
    "CHECKS",
    "DEFAULT_REQUESTS",
    "G2_MIN_REQUESTS",
    "ISOLATION",
    "ISOLATION_TIME_SCALE",
    "Reference",
    "Replica",
    "check_replica",
    "plan_workload",
    "run_isolation",
]
