"""Scenario ``executor-modes``: one workload under sync, async(1) and ping/pong, judged against M1 and M2 (000 §14, §19).

The serving engine runs in-process (default: the mock board) with
``executor.max_inflight: 2``; between rounds the scenario switches one alias's
executor mode with the operator action (:meth:`EngineCore.set_executor_mode`),
so every mode serves the same loaded package, the same warmed engine and the
same workload. A round is ``concurrency`` identical greedy requests sent
together (``prompt_tokens`` in, ``output_tokens`` out, EOS ignored); rounds
rotate the mode order so drift does not favour one mode. After warm-up rounds,
per mode:

* request latency: end-to-end (judged), TTFT and inter-token latency (shown);
* aggregate throughput: output tokens / round wall time;
* errors and the generated tokens (every request must produce the sync
  baseline's tokens: "behaviour equivalent", M1).

Deltas against sync are paired by round and bootstrapped over rounds (seeded,
95 %). A check follows the one decision rule (:func:`calctl.checks.stats.decide`):
**met** when its whole interval is on the good side of the limit, **not met**
when its whole interval is on the bad side, otherwise **inconclusive** (never
a made-up pass). While a milestone is inconclusive after ``rounds``, the
scenario measures one more round of every mode at a time, up to
``max_rounds`` (default 3 x ``rounds``; ``calctl accept`` sets it per level):

=====  =====================================================  ============
M1     async(1): P50 E2E regression <= 3 %, P99 <= 5 %,        000 §19 M1
       same tokens, no errors
M2     ping/pong: aggregate throughput >= +10 %, P99 E2E       000 §19 M2
       regression <= 5 %, same tokens, no errors
=====  =====================================================  ============

Request E2E and round throughput are measured on the host's clock (what a
client waits, host work included). On a saturated host they describe the
host, not the executor on the chip: when the 1-minute load average exceeded
the CPU count during the measured rounds, the latency and throughput checks
are **inconclusive** ("host saturated: load average X on N CPUs"), whatever
their interval says, and no more rounds are run for them (more rounds on a
saturated host decide nothing). The load is recorded in ``options.host_load``.

M2 also asks for 24 h without errors before ping/pong becomes the default;
that is a soak (``calctl soak``), not this scenario, and the report says so.

The trace of the ping/pong rounds is evidence, not decoration (000 §14: two in
flight is not two computing): the report gives how long two jobs were in flight
together on the chip, how long one job's transfers overlapped the other's
compute, and how long two computes overlapped (the mock never lets them).

On the mock these are **mock results**: the phase split (how much of a job is
h2d/d2h that ping/pong can hide) is an input of the mock, not a property of a
board. The scenario therefore runs twice on the mock: with the transfer-heavy
split where overlap is possible (30 % h2d, 40 % compute, 30 % d2h) and with a
compute-bound control (0 / 100 / 0) where ping/pong can only hide host time,
so the gain is seen to come from the modelled phases and nothing else. Only
the first is judged; a mock result grades nothing on the board (ping/pong
stays C1 there, docs/runtime.md §5, 001 §1).
"""

from calctl.runners.bench.executor_modes.judge import ExecutorModesResult, trace_evidence
from calctl.runners.bench.executor_modes.plan import (
    COMPUTE_BOUND,
    TRANSFER_HEAVY,
    ExecutorModesOptions,
    PhaseProfile,
)
from calctl.runners.bench.executor_modes.run import EXECUTOR_MODES, run_executor_modes, run_scenario

__all__ = [
    "COMPUTE_BOUND",
    "EXECUTOR_MODES",
    "TRANSFER_HEAVY",
    "ExecutorModesOptions",
    "ExecutorModesResult",
    "PhaseProfile",
    "run_executor_modes",
    "run_scenario",
    "trace_evidence",
]
