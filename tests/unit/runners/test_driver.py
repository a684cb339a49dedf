"""The run driver (calctl.runners.driver): declared steps, preconditions, the end of a run, its files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calctl.errors import CheckFailed, StepTimeout, UsageError, note_signal
from calctl.report import Report, StepRecord, StepStatus
from calctl.runners.device import DeviceSpec
from calctl.runners.driver import Ended, Opening, Run, RunState, RunStep, drive, write_report
from calctl.runners.serving_stack import ServingStack
from calctl.runners.steps import RunOutcome, StepLog, StepNote
from calctl.signing.policy import make_policy
from tests.conftest import FIXTURE_PACKAGES, TEST_PUB


def _records(report: Report) -> list[StepRecord]:
    return [r for r in report.steps or () if isinstance(r, StepRecord)]


def _bare(steps: list[RunStep], seen: list[Ended] | None = None) -> Run:
    """A run on the mock device alone whose report keeps the steps and how they ended."""

    def report(s: RunState, ended: Ended) -> Report:
        if seen is not None:
            seen.append(ended)
        return Report("device selftest", ended.outcome.value, steps=s.log.records, error=ended.error)

    return Run("device selftest", DeviceSpec(), steps, report, opening=Opening.BARE)


def _ok(detail: str = "done") -> RunStep:
    def body(s: RunState, note: StepNote) -> str:
        note.detail = detail
        return detail

    return RunStep(detail, body)


def test_a_step_whose_precondition_failed_is_skip_naming_it() -> None:
    def failing(s: RunState, note: StepNote) -> None:
        note.status, note.detail = StepStatus.FAIL, "wrong answer"

    steps = [
        RunStep("a", failing),
        RunStep("b", lambda s, n: None, needs=("a",)),
        RunStep("c", lambda s, n: None, needs=("never",)),
        RunStep("d", lambda s, n: None, skip=lambda s: "not at this level"),
    ]
    report = drive(_bare(steps))
    by = {r.name: r for r in _records(report)}
    assert by["a"].status is StepStatus.FAIL
    assert (by["b"].status, by["b"].detail) == (StepStatus.SKIP, "because a FAIL")
    assert (by["c"].status, by["c"].detail) == (StepStatus.SKIP, "because never did not run")
    assert (by["d"].status, by["d"].detail) == (StepStatus.SKIP, "not at this level")


def test_a_later_step_reads_an_earlier_steps_result() -> None:
    got: list[str] = []
    steps = [_ok("first"), RunStep("second", lambda s, n: got.append(s.result("first")), needs=("first",))]
    assert drive(_bare(steps)).verdict == "PASS"
    assert got == ["first"]


@pytest.mark.parametrize(
    ("exc", "outcome", "status"),
    [
        (CheckFailed("refused"), RunOutcome.FAIL, StepStatus.FAIL),
        (StepTimeout("hung"), RunOutcome.TIMEOUT, StepStatus.TIMEOUT),
        (KeyboardInterrupt(), RunOutcome.INTERRUPTED, StepStatus.INTERRUPTED),
    ],
)
def test_an_exception_ends_the_run_with_its_outcome_and_the_steps_after_it_not_run(
    exc: BaseException, outcome: RunOutcome, status: StepStatus
) -> None:
    def boom(s: RunState, note: StepNote) -> None:
        raise exc

    seen: list[Ended] = []
    report = drive(_bare([_ok("a"), RunStep("b", boom), _ok("c")], seen))
    assert report.verdict == outcome.value and report.exit_code == outcome.exit_code
    assert [(r.name, r.status) for r in _records(report)] == [("a", StepStatus.PASS), ("b", status)]
    assert (seen[0].stopped_at, seen[0].not_run, seen[0].exc) == ("b", ("c",), exc)


def test_a_usage_error_is_raised_after_the_teardown_and_a_bug_is_not_a_verdict() -> None:
    def usage(s: RunState, note: StepNote) -> None:
        raise UsageError("--model x: no such alias")

    def bug(s: RunState, note: StepNote) -> None:
        raise ZeroDivisionError

    with pytest.raises(UsageError):
        drive(_bare([RunStep("a", usage)]))
    with pytest.raises(ZeroDivisionError):
        drive(_bare([RunStep("a", bug)]))


def test_a_signal_whose_raise_was_dropped_stops_the_run_at_the_next_step() -> None:
    log = StepLog()
    try:
        note_signal("SIGTERM")
        report = drive(_bare([_ok("a")]), log=log)
    finally:
        note_signal(None)
    assert report.verdict == "INTERRUPTED" and report.exit_code == 130
    assert report.error == "interrupted (SIGTERM)" and log.records == ()


def test_run_golden_stops_at_a_dropped_signal_with_the_models_not_run(tmp_path: Path) -> None:
    """On 72b1e7d only bringup and accept looked for a signal whose raise the garbage collector dropped:
    run-golden went on to PASS, exit 0, after a SIGTERM."""
    from calctl.runners.golden import run_golden

    trust = make_policy([TEST_PUB], False)
    try:
        note_signal("SIGTERM")
        report = run_golden(FIXTURE_PACKAGES / "combined", trust=trust, device=DeviceSpec())
    finally:
        note_signal(None)
    assert report.verdict == "INTERRUPTED" and report.exit_code == 130
    assert report.body["models"] == []
    names = [s.name for s in report.steps or ()]
    assert "configure" in names and not any(n.startswith("golden ") for n in names)
    assert names[-1] == "release"  # the board was torn down


def test_write_report_writes_the_json_and_its_page_beside_it(tmp_path: Path) -> None:
    report = drive(_bare([_ok("a")]))
    write_report(report, tmp_path / "report.json")
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["verdict"] == "PASS" and doc["steps"][0]["name"] == "a"
    assert (tmp_path / "report.html").is_file()


def test_a_step_that_serves_gets_the_stack_and_it_closes_before_the_device() -> None:
    stacks: list[ServingStack] = []

    def serve(s: RunState, note: StepNote) -> None:
        stacks.append(s.serving())
        assert s.serving() is stacks[0]  # one stack a run

    run = Run(
        "device selftest",
        DeviceSpec(),
        [RunStep("serve", serve, serving=True)],
        lambda s, ended: Report("device selftest", ended.outcome.value, steps=s.log.records),
        trust=make_policy([TEST_PUB], False),
        opening=Opening.BARE,
    )
    assert drive(run).verdict == "PASS"
    assert len(stacks) == 1 and stacks[0]._closed is True


def test_only_the_driver_turns_an_interrupt_into_a_report() -> None:
    """``except BaseException`` in the runners and the device checks only in the driver: every other path cleans
    up with ``finally``, a context manager, or a worker thread's ``except Exception`` (a signal reaches the main
    thread only). The packages listed still have their own (issue 48, moving onto the driver)."""
    root = Path(__file__).resolve().parents[3] / "calctl"
    pending = ("runners/soak/", "runners/acceptance/", "runners/bench/")
    found = [
        f"{p.relative_to(root)}:{n}"
        for folder in ("runners", "checks")
        for p in sorted((root / folder).rglob("*.py"))
        if not str(p.relative_to(root)).startswith(pending)
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if line.strip().startswith("except BaseException")
    ]
    assert [f.split(":")[0] for f in found] == ["runners/driver.py"], found


def test_a_run_that_says_so_lists_its_steps_not_reached_as_skip_before_the_teardown() -> None:
    def boom(s: RunState, note: StepNote) -> None:
        raise CheckFailed("refused")

    steps = [RunStep("a", boom), RunStep("loop", lambda s, n: None, logged=False, logs=("loop x", "loop y")), _ok("c")]
    run = _bare(steps)
    report = drive(Run(run.command, run.device, steps, run.report, opening=Opening.BARE, skip_unreached=True))
    assert [(r.name, r.status.value, r.detail) for r in _records(report)] == [
        ("a", "FAIL", "refused"),
        ("loop x", "SKIP", "not reached: a ended FAIL"),
        ("loop y", "SKIP", "not reached: a ended FAIL"),
        ("c", "SKIP", "not reached: a ended FAIL"),
    ]
    assert report.verdict == "FAIL"
