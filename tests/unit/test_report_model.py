"""The one report model: the verdict -> exit code table, the header's device label, the document's shape."""

from __future__ import annotations

import pytest

from calctl.errors import ExitCode
from calctl.report import (
    MOCK_LABEL,
    SOFTWARE_MODEL_LABEL,
    VERDICTS,
    Report,
    StepRecord,
    StepStatus,
    build_header,
    exit_code_of,
    verdict_of_exit_code,
)


def test_every_final_verdict_has_the_exit_code_docs_cli_md_gives_it() -> None:
    documented = {
        "PASS": 0,
        "WARN": 0,
        "FAIL": 1,
        "NOT JUDGED": 0,
        "MEASURED": 0,
        "ERROR": 3,
        "TIMEOUT": 4,
        "INTERRUPTED": 130,
        "GO": 0,
        "NO-GO": 1,
        "NOT MEASURED": 0,
        "S1": 0,
        "S2": 0,
        "F0": 1,
        "F1": 0,
        "F2": 0,
        "INTERNAL ERROR": 70,
    }
    assert {v: exit_code_of(v) for v in documented} == documented
    assert all(word.code != ExitCode.USAGE for word in VERDICTS.values())  # exit 2 is a usage error, never a verdict


def test_a_policy_turns_a_passing_word_into_a_failed_check_and_nothing_else() -> None:
    assert exit_code_of("S1", fail_on={"S1"}) == 1 and exit_code_of("S1") == 0  # --require-s2
    assert exit_code_of("WARN", fail_on={"WARN"}) == 1  # --fail-on-warn
    assert exit_code_of("ERROR", fail_on={"ERROR"}) == 3  # never softens a device error into 1


def test_a_word_outside_the_vocabulary_or_a_step_word_is_refused() -> None:
    with pytest.raises(ValueError, match="not in the vocabulary"):
        exit_code_of("OK")
    with pytest.raises(ValueError, match="not a final verdict"):
        exit_code_of("SKIP")
    with pytest.raises(ValueError):
        Report("x", "GOOD")


def test_an_exit_code_reads_back_as_its_verdict() -> None:
    for word in ("PASS", "FAIL", "ERROR", "TIMEOUT", "INTERRUPTED", "INTERNAL ERROR"):
        assert verdict_of_exit_code(exit_code_of(word)) == word
    assert verdict_of_exit_code(2) == "ERROR"  # a usage error inside a pipeline step: the step could not run


def test_the_header_labels_mock_software_model_and_board_results() -> None:
    mock = build_header("x", device="mock", device_options={"kind": "mock"})
    assert mock["device_label"] == "mock" and mock["mock_result"] is True and mock["note"] == MOCK_LABEL
    ref = build_header("x", device="calrt", versions={"firmware": "reference (software model, no hardware)"})
    assert ref["device_label"] == "software model" and ref["mock_result"] is False
    assert ref["note"] == SOFTWARE_MODEL_LABEL
    board = build_header("x", device="calrt", versions={"firmware": "cal-fw 2.1"})
    assert board["device_label"] == "board" and board["note"] is None
    unread = build_header("x", device="calrt")
    assert unread["device_label"] == "unknown" and unread["note"] is None
    server = build_header("x", device="unknown")
    assert server["device_label"] == "unknown" and server["mock_result"] is None
    assert "device" not in build_header("keygen")  # a command that used no device says nothing about one


def test_the_document_puts_the_header_then_the_verdict_and_refuses_a_body_that_sets_it() -> None:
    steps = (StepRecord("open device", StepStatus.PASS, 0.01), StepRecord("golden", StepStatus.FAIL, 0.2, "bad"))
    r = Report("run-golden", "FAIL", build_header("run-golden", device="mock"), {"models": []}, steps=steps)
    doc = r.document()
    assert list(doc)[:3] == ["command", "calctl_version", "started_at"]
    assert doc["verdict"] == "FAIL" and doc["exit_code"] == 1 == r.exit_code and doc["error"] is None
    assert [s["status"] for s in doc["steps"]] == ["PASS", "FAIL"] and doc["models"] == []
    with pytest.raises(ValueError, match="exit_code"):
        Report("x", "PASS", body={"exit_code": 0})
    header = build_header("bench", device="mock", mock_result=True)
    assert Report("bench", "PASS", header, {"device": "mock"}).document()["device_label"] == "mock"  # repeated: fine
    with pytest.raises(ValueError, match="device_label"):
        Report("bench", "PASS", header, {"device_label": "a board"})
    assert Report("x", "RUNNING").document()["exit_code"] is None  # a checkpoint has no exit code yet


def test_an_internal_error_exits_70_not_the_usage_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from calctl.cli import app
    from calctl.signing import keys

    def boom(*_a: object, **_k: object) -> None:
        raise ZeroDivisionError("a calctl bug")

    monkeypatch.setattr(keys, "generate", boom)
    code = app.main(["keygen", "/nonexistent/k"])
    assert code == ExitCode.INTERNAL == 70
    assert "internal error (a calctl bug)" in capsys.readouterr().err
