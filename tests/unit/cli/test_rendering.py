"""Rendering details of issue 21: steps once on a terminal, footers, verdict words, widths, sizes."""

from __future__ import annotations

import pytest

from calctl.cli import _output, runner_cmds
from calctl.cli._output import Format
from calctl.runners.context import StepStatus


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
