"""M1/M2 of the executor-modes scenario on a busy host (issue 53: "M1/M2 are judged on the device's clock so a busy
host does not leave them unmeasured, or the page explains exactly why not").

M2 is about the chip (ping/pong hides one job's transfers behind the other's compute): where the runtime stamps
its jobs, its throughput and P99 are judged on the device's clock, so a saturated host decides it all the same.
M1's regression is the host's waiting by nature: on a saturated host it stays inconclusive, saying exactly why
and what would measure it. Synthetic rounds, no device.
"""

from __future__ import annotations

from pathlib import Path

from calctl.report import StepStatus
from calctl.runners.acceptance.milestones import judge_m1, judge_m2
from calctl.runners.acceptance.rows import GateDecision, StepEvidence
from calctl.runners.bench.executor_modes.judge import ExecutorModesResult, judge
from calctl.runners.bench.executor_modes.plan import ExecutorModesOptions, ModeRound
from calctl.runners.device import DeviceSpec
from calctl.runners.traffic import RequestRecord
from calctl.serving.config import ExecutorMode
from calctl.serving.outcomes import RequestOutcome
from calctl.signing.policy import TrustPolicy

#: A host far past its CPU count: every host-clock figure is inconclusive.
BUSY = [50.0, 52.0]


def _round(mode: ExecutorMode, i: int, wall: float, busy: float | None, e2e: list[float]) -> ModeRound:
    records = [
        RequestRecord(
            "model-a", "executor-modes", 100.0 + i, 16, 5, outcome=RequestOutcome.OK, end=100.0 + i + x, tokens=5
        )
        for x in e2e
    ]
    # the chips' share of each request's E2E
    device: list[float | None] | None = None if busy is None else [x * busy / wall for x in e2e]
    return ModeRound(mode, i, int((100.0 + i) * 1e9), wall, records, [[1, 2, 3, 4, 5]] * len(e2e), busy, device)


def _rounds(stamped: bool, *, pingpong_busy: float = 0.30) -> dict[ExecutorMode, list[ModeRound]]:
    """Host-bound rounds (the host's clock sees the same wall time in every mode, with noise), while the chips
    were busy 0.50 s a round in sync and async(1) and ``pingpong_busy`` in ping/pong."""
    noise = [0.0, 0.05, -0.04, 0.08, -0.06, 0.02]
    out: dict[ExecutorMode, list[ModeRound]] = {}
    for mode, busy in ((ExecutorMode.SYNC, 0.50), (ExecutorMode.ASYNC, 0.50), (ExecutorMode.PINGPONG, pingpong_busy)):
        out[mode] = [
            _round(mode, i, 1.0 + n, busy if stamped else None, [0.6 + n + 0.05 * k for k in range(5)])
            for i, n in enumerate(noise)
        ]
    return out


def _judge(rounds: dict[ExecutorMode, list[ModeRound]], load: list[float]) -> ExecutorModesResult:
    opts = ExecutorModesOptions(Path("pkg"), TrustPolicy(), rounds=6)
    return judge(opts, DeviceSpec(), "model-a", rounds, [], [], load)


def test_m2_is_decided_on_the_device_clock_beside_a_saturated_host() -> None:
    result = _judge(_rounds(stamped=True), BUSY)
    gain, p99 = result.m2.checks[0], result.m2.checks[1]
    assert result.options["clock"] == {"M1": "host", "M2": "device"}
    assert result.m2.verdict == "met", result.m2.document()
    assert gain.passed is True and "device clock" in gain.detail and gain.estimate.mean is not None
    assert gain.estimate.mean > 0.6  # 0.50 s -> 0.30 s of chip-busy time a round
    assert p99.passed is True and "device clock" in p99.detail
    assert "host saturated" not in gain.detail


def test_m1_on_a_saturated_host_says_it_is_host_time_and_shows_the_device_clock() -> None:
    result = _judge(_rounds(stamped=True), BUSY)
    assert result.m1.verdict == "inconclusive"
    for c in result.m1.checks[:2]:
        assert c.passed is None and "host saturated: load average up to 52.0" in c.detail
        assert "only the host's clock measures it" in c.detail
    (note,) = result.m1.notes
    assert note.startswith("on the device's clock") and "P50 +0.0 %" in note


def test_without_job_stamps_m2_falls_back_to_the_host_clock_and_a_busy_host_leaves_it_undecided() -> None:
    result = _judge(_rounds(stamped=False), BUSY)
    assert result.options["clock"] == {"M1": "host", "M2": "host"}
    assert result.m2.verdict == "inconclusive" and "host saturated" in result.m2.checks[0].detail
    assert result.m1.notes == ()


def test_a_gain_not_met_on_a_busy_host_with_no_trace_is_inconclusive_naming_the_in_flight_share() -> None:
    result = _judge(_rounds(stamped=True, pingpong_busy=0.50), BUSY)
    gain = result.m2.checks[0]
    assert gain.passed is None and "two jobs were in flight for unknown" in gain.detail
    idle = _judge(_rounds(stamped=True, pingpong_busy=0.50), [0.5])  # an idle host: not met is not met
    assert idle.m2.checks[0].passed is False and idle.m2.verdict == "not met"


def _evidence(result: ExecutorModesResult) -> dict[str, StepEvidence]:
    doc = {"runs": [result.document()]}
    files = {"report": "executor-modes/bench-report.json"}
    return {"executor-modes": StepEvidence("executor-modes", StepStatus.PASS, document=doc, files=files)}


def test_the_accept_rows_say_which_clock_and_what_would_measure_m1() -> None:
    steps = _evidence(_judge(_rounds(stamped=True), BUSY))
    m1 = judge_m1(steps)
    assert m1.verdict is GateDecision.NOT_MEASURED and m1.key_figure == "M1 inconclusive (host clock)"
    assert "only the host's clock measures it" in m1.reason
    assert "load average stays below its CPU count" in m1.how_to_measure
    assert any(e.startswith("on the device's clock") for e in m1.evidence)
    m2 = judge_m2(steps)  # met on the device's clock; the 24 h ping/pong soak is still missing
    assert m2.verdict is GateDecision.NOT_MEASURED and "throughput and P99 met" in m2.reason
    assert any("device clock" in e for e in m2.evidence)
