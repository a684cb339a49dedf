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
   per-job records (``calctl.serving.record_sink``) naming the submitting alias,
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

The package is cut along the run: ``plan.py`` (the replica checked, the golden
case, the seeded workload), ``run.py`` (the engine serving it, what it left
behind), ``judge.py`` (the reference, every check, the verdict) and
``render.py`` (the scenario result, its evidence files and picture). It does
not render tables for people beyond :class:`Table` rows, and does not write
``bench-report.json`` (the CLI does).
"""

from calctl.runners.bench.isolation.judge import (
    CHECKS,
    IsolationReference,
    Judged,
    Observation,
    ReferenceMatch,
    Tally,
    find_sources,
    judge_request,
    judge_run,
)
from calctl.runners.bench.isolation.plan import (
    CANCEL_KINDS,
    DEFAULT_REQUESTS,
    G2_MIN_REQUESTS,
    ISOLATION_TIME_SCALE,
    Planned,
    Replica,
    Side,
    check_replica,
    in_flight,
    plan_workload,
)
from calctl.runners.bench.isolation.render import plot_isolation, scenario_result
from calctl.runners.bench.isolation.run import ISOLATION, run_isolation

__all__ = [
    "CANCEL_KINDS",
    "CHECKS",
    "DEFAULT_REQUESTS",
    "G2_MIN_REQUESTS",
    "ISOLATION",
    "ISOLATION_TIME_SCALE",
    "IsolationReference",
    "Judged",
    "Observation",
    "Planned",
    "ReferenceMatch",
    "Replica",
    "Side",
    "Tally",
    "check_replica",
    "find_sources",
    "in_flight",
    "judge_request",
    "judge_run",
    "plan_workload",
    "plot_isolation",
    "run_isolation",
    "scenario_result",
]
