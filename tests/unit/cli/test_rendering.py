"""Rendering details of issue 21: steps once on a terminal, footers, verdict words, widths, sizes."""

from __future__ import annotations

import pytest

from calctl.cli import _output, runner_cmds
from calctl.cli._output import Format
from calctl.report import StepStatus
from tests.conftest import Cli


def test_steps_are_listed_once_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the live progress is a transient status line; the steps table lists each step once."""
    logged: list[str] = []
    monkeypatch.setattr(_output, "info", logged.append)
    for console in (_output.stdout, _output.stderr):
        monkeypatch.setattr(console, "_force_terminal", True)
    with runner_cmds._live_log(Format.table) as log:
        log.add("configure", StepStatus.PASS, 0.01, "calbin 1 configured once")
    assert logged == []
    with runner_cmds._live_log(Format.json) as log:  # machine output on stdout: progress lines on stderr
        log.add("configure", StepStatus.PASS, 0.01, "calbin 1 configured once")
    assert len(logged) == 1 and "configure" in logged[0]


def test_steps_are_logged_line_by_line_when_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    logged: list[str] = []
    monkeypatch.setattr(_output, "info", logged.append)
    for console in (_output.stdout, _output.stderr):
        monkeypatch.setattr(console, "_force_terminal", False)
    with runner_cmds._live_log(Format.table) as log:
        log.add("configure", StepStatus.PASS, 0.01, "calbin 1 configured once")
    assert len(logged) == 1


def test_a_refused_package_footer_says_so_instead_of_none() -> None:
    header = {"device": "mock", "runtime": {"runtime": "0.7.6"}, "package": {"path": "/p", "name": None}}
    line = runner_cmds.provenance_line(header)
    assert "None" not in line and "n/a" not in line.split(";")[1] and "refused before it was loaded" in line
    header["package"] = {"path": "/p", "name": "pkg", "version": "1.0", "digest": "ab", "signer_key_id": "k"}
    assert runner_cmds.provenance_line(header).endswith("package pkg 1.0 sha256:ab, signer k")


def test_sizes_for_people() -> None:
    assert _output.mib(17179869184) == "16.00 GiB"
    assert _output.mib(64 * 1024**2) == "64.0 MiB"
    assert _output.mib(None) == "n/a"


def test_every_table_column_has_a_header() -> None:
    with pytest.raises(ValueError, match="header"):
        _output.make_table("t", ["chip", ""], [])


def test_warmup_stability_is_never_blank() -> None:
    assert runner_cmds._stability(0.05, False, 0.25) == "stable"
    assert "unstable" in runner_cmds._stability(0.4, True, 0.25)
    assert runner_cmds._stability(None, False, 0.25).startswith("n/a")


def test_soak_progress_and_summary_count_requests_the_same_way() -> None:
    from calctl.cli import soak_cmds

    by = {"ok": 163, "cancelled": 28, "deadline": 12, "invalid": 7, "unavailable": 26}
    line = soak_cmds._requests_line(236, by)
    assert line == (
        "236 sent: 163 succeeded, 47 ended as the mix intends (cancelled 28, deadline 12, invalid 7), "
        "26 refused (unavailable 26), 0 failed"
    )
    assert soak_cmds._requests_line(236, by, short=True) == (
        "236 sent, 163 succeeded, 47 intended, 26 refused, 0 failed"
    )
    assert "rejected" not in line


def test_soak_names_what_failed_and_what_is_still_open() -> None:
    from calctl.runners.soak.wording import RequestCounts, deadline_note

    counts = RequestCounts.of(301, {"ok": 85, "unavailable": 189, "device_error": 4, "timeout": 1, "deadline": 20})
    assert counts.phrase() == (
        "301 sent: 85 succeeded, 20 ended as the mix intends (deadline 20), 189 refused (unavailable 189), "
        "5 failed (device_error 4, timeout 1), 2 still open"
    )
    note = deadline_note({"deadline": {"deadline": 7, "ok": 5, "unavailable": 1}, "plain": {"ok": 3}})
    assert note is not None and note.startswith("7 of 13 expired, as intended") and "ok 5, unavailable 1" in note
    assert deadline_note({"plain": {"ok": 3}}) is None


def test_soak_keeps_the_engines_expected_deadline_lines_and_repeats_off_stderr() -> None:
    import logging

    from calctl.cli._logs import quiet_engine_log

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("calctl.serve")
    keep = Keep()
    logger.addHandler(keep)
    try:
        with quiet_engine_log():
            logger.warning(
                "request %s on %s ended before output: %s", "soak-a-1", "model-a", "deadline expired in Ready"
            )
            logger.warning("request %s on %s ended before output: %s", "soak-a-2", "model-a", "chip 0 reset")
            logger.warning("pkg: model-a has random weights")
            logger.warning("pkg: model-a has random weights")
        logger.warning("request %s on %s ended before output: %s", "x", "model-a", "deadline expired in Ready")
    finally:
        logger.removeHandler(keep)
    assert seen == [
        "request soak-a-2 on model-a ended before output: chip 0 reset",
        "pkg: model-a has random weights",
        "request x on model-a ended before output: deadline expired in Ready",  # outside a soak: shown
    ]


def test_the_poc_figures_bounds_are_printed_with_them() -> None:
    assert "0.5" in runner_cmds.OVERLAP_BOUNDS and "1.01" in runner_cmds.OVERLAP_BOUNDS


def test_sigterm_and_sigint_raise_interrupted_once_and_the_handlers_come_back() -> None:
    import os
    import signal

    from calctl.cli._signals import interruptible
    from calctl.errors import Interrupted, interrupt_reason

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as caught, interruptible():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes of the main thread
            pass
    assert caught.value.signal_name == "SIGTERM" and interrupt_reason(caught.value) == "interrupted (SIGTERM)"
    assert signal.getsignal(signal.SIGTERM) is before
    with interruptible():  # a second signal while the first is being handled is ignored
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
        except Interrupted:
            os.kill(os.getpid(), signal.SIGINT)  # ignored: the teardown goes on
            for _ in range(1000):
                pass
    assert signal.getsignal(signal.SIGINT) is not None  # restored to what it was


def test_a_signal_after_the_measurement_waits_for_the_report_and_a_second_is_ignored() -> None:
    """docs/cli.md "Signals": once a command's measurement (its inner context) is over, a first signal is
    deferred while the report is written whole; main exits 130 after it. A second one is ignored (never 143)."""
    import os
    import signal

    from calctl.cli._signals import interruptible, signal_deferred
    from calctl.errors import Interrupted

    before = signal.getsignal(signal.SIGTERM)
    with interruptible():  # main's
        with interruptible():  # the command's measurement
            pass
        os.kill(os.getpid(), signal.SIGTERM)  # while the report is written
        for _ in range(1000):
            pass
        written = True
        os.kill(os.getpid(), signal.SIGTERM)  # a second one: ignored
        for _ in range(1000):
            pass
        assert written and signal_deferred() == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before
    with interruptible():  # the next command starts clean
        assert signal_deferred() is None
    with pytest.raises(Interrupted), interruptible():  # raised during a measurement: not a deferred one
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
        assert signal_deferred() is None


def test_an_error_while_unwinding_an_interrupt_is_part_of_the_interrupt() -> None:
    from calctl.errors import Interrupted, interrupt_behind

    try:
        try:
            raise Interrupted("SIGTERM")
        except KeyboardInterrupt:
            raise RuntimeError("Event loop is closed") from None
    except RuntimeError as exc:
        found = interrupt_behind(exc)
    assert isinstance(found, Interrupted) and found.signal_name == "SIGTERM"
    assert interrupt_behind(RuntimeError("plain")) is None


def test_a_signal_python_wrapped_while_a_lazy_import_defined_a_class_is_an_interrupt(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A SIGTERM that lands in a descriptor's ``__set_name__`` (a library's class, defined by a command's lazy
    import) reaches calctl as ``RuntimeError: Error calling __set_name__ ...``: still exit 130, not a calctl bug."""
    from calctl.cli.app import _run_command
    from calctl.errors import ExitCode, Interrupted

    class Signalled:
        def __set_name__(self, owner: type, name: str) -> None:
            raise Interrupted("SIGTERM")

    class Command:
        def main(self, **_: object) -> int:
            type("LazyNamespace", (), {"data": Signalled()})  # what defining a class in a module does
            return 0

    code, cause = _run_command(Command(), ["validate"])
    assert (code, cause) == (ExitCode.INTERRUPTED, "interrupted (SIGTERM)")
    err = capsys.readouterr().err
    assert "internal error" not in err and "interrupted (SIGTERM)" in err


def test_a_table_far_wider_than_the_console_prints_as_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    buf = io.StringIO()
    monkeypatch.setattr(_output, "stdout", Console(file=buf, width=100, highlight=False))
    long = "a DeviceBusy on 3, then 7 consecutive A decode submits with bounded backoff and no reset " * 2
    _output.print_rows("evidence", ["phase", "injected", "granted", "B impacted"], [["submit-busy", long, long, "no"]])
    lines = buf.getvalue().splitlines()
    assert all(len(line) <= 100 for line in lines)
    assert lines[0] == "evidence" and lines[1] == "phase submit-busy" and "  injected: a DeviceBusy" in lines[2]
    buf.truncate(0)
    buf.seek(0)
    _output.print_rows("small", ["phase", "B ok"], [["baseline", "12/12"]])
    assert "┃ phase" in buf.getvalue()  # a table that fits stays a table


def test_budget_explains_its_memory_what_ifs(cli: Cli) -> None:
    r = cli("budget")
    assert r.code == 0, r.err
    assert "largest batch at the given context" in r.out
    assert "memory what-ifs" in r.out and "serves at most 16 lane(s)" in r.out


def test_junit_says_a_warn_where_ci_shows_it() -> None:
    """#53 item 10: a WARN step was a passed testcase with nothing to say it was a warning."""
    import xml.etree.ElementTree as ET

    from calctl.cli import _output

    cases = [
        _output.JunitCase("validate package", "calctl.run-golden", warning="SIG002: signed by the test-only key"),
        _output.JunitCase("golden model-a", "calctl.run-golden", output="16/16 tokens exact"),
    ]
    root = ET.fromstring(_output.junit_xml("calctl run-golden", [_output.JunitSuite("s", cases)]).split("\n", 1)[1])
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["warnings"] == "1: validate package: SIG002: signed by the test-only key"
    outs = [c.findtext("system-out") for c in root.iter("testcase")]
    assert outs[0] == "WARN: SIG002: signed by the test-only key" and outs[1] == "16/16 tokens exact"
    assert root.get("failures") == "0"  # still a pass
