"""Issue 29 items 5 and 6: the acceptance summary and the cause of a step that could not measure.

The summary is computed from the rows, the steps and the exit code (calctl.runners.acceptance.run), no device.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from calctl.errors import ExitCode
from calctl.report import StepStatus
from calctl.runners.acceptance import evidence as accept_evidence
from calctl.runners.acceptance import run as accept_run
from calctl.runners.acceptance.rows import ROWS, GateDecision, RowResult, StepEvidence


def _rows(verdict: GateDecision) -> tuple[RowResult, ...]:
    return tuple(RowResult(s.id, s.title, s.condition, s.source, verdict, "k") for s in ROWS)


class _Line:
    def __init__(self, rows: tuple[RowResult, ...], steps: tuple[StepEvidence, ...]) -> None:
        self.rows, self.steps = rows, steps

    def summary_line(self) -> str:
        return accept_run.summary_line("finished", self.rows, self.steps)


def _report(rows: tuple[RowResult, ...], steps: tuple[StepEvidence, ...], code: int = 0) -> _Line:
    return _Line(rows, steps)


def _exit(rows: tuple[RowResult, ...], steps: tuple[StepEvidence, ...]) -> int:
    from calctl.report import exit_code_of

    return exit_code_of(accept_run._verdict("finished", rows, steps))


def test_a_device_error_with_no_row_measured_is_not_go() -> None:
    """Item 5: "GO (with rows NOT MEASURED): 0 GO, 0 NO-GO, 11 NOT MEASURED" with exit 3 was the old line."""
    steps = (
        StepEvidence("soak", StepStatus.ERROR, detail="soak error: BoardLocked: held by pid 7", document={}),
        StepEvidence("rollback", StepStatus.ERROR, detail="BoardLocked: held", document={"exit_code": 3}),
    )
    rows = _rows(GateDecision.NOT_MEASURED)
    code = _exit(rows, steps)
    assert code == int(ExitCode.DEVICE)
    line = _report(rows, steps, code).summary_line()
    assert not line.startswith("GO"), line
    assert line.startswith("ERROR (device error in soak, rollback)"), line


def test_no_row_measured_without_an_error_is_not_measured_not_go() -> None:
    line = _report(_rows(GateDecision.NOT_MEASURED), (), 0).summary_line()
    assert line.startswith("NOT MEASURED: 0 GO"), line


def test_a_refused_package_is_fail_not_go() -> None:
    steps = (StepEvidence("validate", StepStatus.ERROR, detail="the package failed validation: MAN007"),)
    rows = _rows(GateDecision.NOT_MEASURED)
    code = _exit(rows, steps)
    assert code == int(ExitCode.FAILED)
    assert not _report(rows, steps, code).summary_line().startswith("GO")


def _some_go() -> tuple[RowResult, ...]:
    return (*_rows(GateDecision.GO)[:2], *_rows(GateDecision.NOT_MEASURED)[2:])


def test_a_refused_replica_beside_go_rows_is_fail_not_go() -> None:
    """A ``--replica`` that validate-replica refused (tampered, or not a replica) left G2 unjudged: the run was
    GO, exit 0, beside G0/G1 GO."""
    steps = (StepEvidence("validate-replica", StepStatus.ERROR, detail="failed MAN001, HASH001", document={}),)
    assert _exit(_some_go(), steps) == int(ExitCode.FAILED)
    line = _report(_some_go(), steps).summary_line()
    assert line.startswith("FAIL (the package failed validation: validate-replica)"), line


def test_a_hung_step_beside_go_rows_is_timeout_exit_4() -> None:
    """A step whose run timed out (its report TIMEOUT, exit 4: the board needs a reset) made accept GO, exit 0."""
    steps = (StepEvidence("run-golden", StepStatus.ERROR, detail="did not finish", document={"exit_code": 4}),)
    assert _exit(_some_go(), steps) == int(ExitCode.TIMEOUT)
    line = _report(_some_go(), steps).summary_line()
    assert line.startswith("TIMEOUT (a step hung past its deadline: run-golden)"), line


def test_any_step_in_error_beside_go_rows_is_error_never_go() -> None:
    steps = (StepEvidence("batch", StepStatus.ERROR, detail="refused", document={"exit_code": 1}),)
    assert _exit(_some_go(), steps) == int(ExitCode.DEVICE)
    line = _report(_some_go(), steps).summary_line()
    assert line.startswith("ERROR (a step could not run: batch)"), line


def test_go_rows_with_rows_not_measured_still_read_go() -> None:
    rows = (*_rows(GateDecision.GO)[:4], *_rows(GateDecision.NOT_MEASURED)[4:])
    line = _report(rows, (), 0).summary_line()
    assert line.startswith(f"GO on 4 of {len(rows)} rows, {len(rows) - 4} NOT MEASURED ("), line  # #53 item 3


def test_a_soak_that_could_not_measure_names_its_cause(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Item 6: "G5 NOT MEASURED: soak could not measure: error." hid a BoardLocked naming its holder."""
    from contextlib import ExitStack

    from calctl.runners import soak as soak_lib
    from calctl.runners.acceptance.gates import judge_g5
    from calctl.runners.context import DeviceSpec
    from calctl.signing.policy import TrustPolicy

    cause = "BoardLocked: board default is in use by pid 4242 (calctl serve PKG)"
    doc: dict[str, Any] = {
        "status": "error",
        "verdict": "ERROR",
        "exit_code": 3,
        "error": cause,
        "cycles": 0,
        "violations": [],
        "files": {},
    }

    class _Report:
        exit_code = 3

        def document(self) -> dict[str, Any]:
            return dict(doc)

    monkeypatch.setattr(soak_lib, "run_soak", lambda config: _Report())

    class _Pkg:
        models: tuple[Any, ...] = ()

    cfg = accept_run.AcceptConfig(
        package=tmp_path, trust=TrustPolicy(), device=DeviceSpec(), level=accept_run.Level.QUICK, out_dir=tmp_path
    )
    state = accept_evidence.AcceptState(config=cfg, stack=ExitStack())
    monkeypatch.setattr(accept_evidence, "_need_main", lambda s: type("St", (), {"package": _Pkg()})())
    ev = accept_evidence.step_soak(state)
    assert ev.status is StepStatus.ERROR and "BoardLocked" in ev.detail and "pid 4242" in ev.detail, ev.detail
    assert ev.document["exit_code"] == 3
    g5 = judge_g5({"soak": ev})
    assert g5.verdict is GateDecision.NOT_MEASURED and "pid 4242" in g5.reason, g5.reason
    code = _exit((g5,), (ev,))
    assert code == int(ExitCode.DEVICE)


def test_a_step_summary_says_its_verdict_once() -> None:
    """Item 8: step summaries read "NO-GO: NO-GO: ..." when the runner's key figure already led with it."""
    assert accept_evidence._prefixed("NO-GO", "NO-GO: chip 0 static 14 GiB") == "NO-GO: chip 0 static 14 GiB"
    assert accept_evidence._prefixed("GO", "chip 0 0.1 GiB") == "GO: chip 0 0.1 GiB"


def test_load_peak_keeps_the_mock_label_where_it_goes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Item 8: load-peak.json put its description in ``note``, the field that carries the MOCK RESULT label."""
    import json
    from contextlib import ExitStack

    from calctl.runners.context import DeviceSpec
    from calctl.signing.policy import TrustPolicy, test_public_key
    from tests.conftest import FIXTURE_PACKAGES

    cfg = accept_run.AcceptConfig(
        package=FIXTURE_PACKAGES / "combined",
        trust=TrustPolicy((test_public_key(),)),
        device=DeviceSpec(),
        level=accept_run.Level.QUICK,
        out_dir=tmp_path,
    )
    monkeypatch.setattr(accept_evidence, "_need_main", lambda s: None)
    with ExitStack() as stack:
        ev = accept_evidence.step_load_peak(accept_evidence.AcceptState(config=cfg, stack=stack))
    doc = json.loads((tmp_path / "load-peak.json").read_text())
    assert ev.status is StepStatus.PASS and ev.ran
    assert doc["mock_result"] is True and "MOCK RESULT" in doc["note"], doc["note"]
    assert "GetMemoryUsage" in doc["memory_note"]


def test_a_step_without_the_package_it_needs_is_skipped_saying_how(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The PoC, isolation and fault-isolation need two models or a replica package: SKIPPED with why and how."""
    from contextlib import ExitStack

    from calctl.runners.context import DeviceSpec
    from calctl.signing.policy import TrustPolicy

    cfg = accept_run.AcceptConfig(
        package=tmp_path, trust=TrustPolicy(), device=DeviceSpec(), level=accept_run.Level.QUICK, out_dir=tmp_path
    )
    monkeypatch.setattr(accept_evidence, "_need_main", lambda s: None)
    state = accept_evidence.AcceptState(config=cfg, stack=ExitStack())
    said: dict[str, tuple[str, str]] = {}
    for name, run in (
        ("poc", accept_evidence.step_poc),
        ("isolation", accept_evidence.step_isolation),
        ("fault-isolation", accept_evidence.step_fault_isolation),
    ):
        ev = accept_run._run_step(accept_evidence.Step(name, (), run), state)
        assert ev.status is StepStatus.SKIP, ev
        said[name] = (ev.detail, ev.document["how_to_measure"])
    assert "two models, one per chip" in said["poc"][0] and "--replica PKG" in said["poc"][1]
    assert "replica package" in said["isolation"][0] and "--replica OUT" in said["isolation"][1]
    assert "two models" in said["fault-isolation"][0] and "combined package" in said["fault-isolation"][1]


def test_an_interrupt_in_the_teardown_still_ends_with_the_report(tmp_path: Path) -> None:
    """A SIGTERM while the board closes (after the last step) once raised out of run_accept: no final report."""
    from calctl.runners.context import DeviceSpec
    from calctl.signing.policy import TrustPolicy

    def interrupt() -> None:
        raise KeyboardInterrupt

    def budget(state: accept_evidence.AcceptState) -> StepEvidence:
        state.stack.callback(interrupt)  # where the device's close would be
        return StepEvidence("budget", StepStatus.PASS, 0.01, "ran")

    cfg = accept_run.AcceptConfig(
        package=tmp_path, trust=TrustPolicy(), device=DeviceSpec(), level=accept_run.Level.QUICK, out_dir=tmp_path
    )
    result = accept_run.run_accept(cfg, steps=(accept_evidence.Step("budget", ("G0",), budget),))
    assert result.verdict == "INTERRUPTED" and result.exit_code == 130
    on_disk = json.loads((tmp_path / accept_run.REPORT_FILE).read_text())
    assert (on_disk["status"], on_disk["verdict"], on_disk["exit_code"]) == ("interrupted", "INTERRUPTED", 130)


def test_a_burn_in_warn_is_among_the_page_reasons_beside_the_rows(tmp_path: Path) -> None:
    """Issue 53: the page's first screen says every reason. A burn-in WARN was shown in its step row only; the
    banner listed the rows that were not GO and said nothing of it."""
    import re

    from calctl.runners.board_steps import BURNIN
    from calctl.runners.context import DeviceSpec
    from calctl.signing.policy import TrustPolicy

    def burnin(state: accept_evidence.AcceptState) -> StepEvidence:
        return StepEvidence(
            BURNIN,
            StepStatus.WARN,
            0.01,
            key_figure="chip0 91 C max, throttled 12.0 s",
            detail="chip0 throttled for 12.0 s of 60 s: look at its cooling",
        )

    cfg = accept_run.AcceptConfig(
        package=tmp_path, trust=TrustPolicy(), device=DeviceSpec(), level=accept_run.Level.LONG, out_dir=tmp_path
    )
    accept_run.run_accept(cfg, steps=(accept_evidence.Step(BURNIN, (), burnin),))
    doc = json.loads((tmp_path / accept_run.REPORT_FILE).read_text())
    page = (tmp_path / "report.html").read_text()
    banner = re.search(r'<ul class="reasons" id="reasons">(.*?)</ul>', page, re.S)
    assert banner, page[:2000]
    assert "burn-in WARN" in banner.group(1) and "look at its cooling" in banner.group(1), banner.group(1)
    said = [r for r in doc.get("reasons", []) if "burn-in WARN" in r]
    assert said == [
        "board burn-in WARN: chip0 91 C max, throttled 12.0 s — chip0 throttled for 12.0 s of 60 s: look at its cooling"
    ]
    # the rows are still said, each with what would measure it
    g0 = next(r for r in doc["reasons"] if r.startswith("G0 NOT MEASURED"))
    assert "G0 NOT MEASURED" in banner.group(1) and ". To measure: " in g0, doc["reasons"]
