"""Reports a person can hand over (#53): every page says why on its first screen, and the terminal agrees.

These tests read the pages as text (the Chromium checks are in test_html_report.py): the verdict, the reasons
(violations, the error, NOT MEASURED rows with what would measure them), what the run saw, and no internals.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from calctl import html_report
from tests.conftest import Cli


def _reasons(html: str) -> list[str]:
    found = re.search(r'<ul class="reasons" id="reasons">(.*?)</ul>', html, re.S)
    return re.findall(r"<li>(.*?)</li>", found.group(1), re.S) if found else []


def _facts(html: str) -> dict[str, str]:
    found = re.search(r'<dl class="meta" id="facts">(.*?)</dl>', html, re.S)
    return dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", found.group(1), re.S)) if found else {}


def test_a_failed_soak_page_says_its_violations_requests_and_memory(cli: Cli, tmp_path: Path) -> None:
    """#53 item 2: soak-report.html showed the verdict word, the header and the picture, never why."""
    out = tmp_path / "soak"
    r = cli("soak", "--cycles", "2", "--traffic-seconds", "0.5", "--inject", "stale-completion", "--report", out)
    assert r.code == 1, r.err
    doc = json.loads((out / "soak-report.json").read_text())
    html = (out / "soak-report.html").read_text(encoding="utf-8")
    reasons = _reasons(html)
    assert reasons[0].startswith("DIAGNOSTIC: stale-completion injected on purpose"), reasons
    assert any(r.startswith("stale_generation: ") for r in reasons), reasons
    facts = _facts(html)
    assert facts["requests"].startswith(f"{doc['requests']['sent']} sent: "), facts
    assert "refused" in facts["what the counts mean"] and "intended" in facts["what the counts mean"]
    assert "chip0 max drift" in facts and "limit" in facts["chip0 max drift"]
    assert "serving process memory" in facts
    assert facts["injected"].startswith("DIAGNOSTIC: stale-completion injected on purpose")
    # the terminal says where the page is, and the same meaning of the counts (#53 items 7, 10)
    assert f"page: {out / 'soak-report.html'}" in r.out and "plot: None" not in r.out
    assert "refused: turned away before any token" in r.out
    # in a log: the plan at start and one progress line per cycle with its ETA (#53 item 5)
    assert "plan: 2 cycle(s) of load (golden + warm-up), 0.5 s of mixed traffic" in r.err
    assert "soak 1/2 cycles, " in r.err and "soak 2/2 cycles, " in r.err and " ETA " in r.err
    # the error and the violations are said once, by the table's last line, not again on stderr (#53 item 7)
    assert "violation[/]" not in r.err and "violation stale_generation" not in r.err


def test_soak_hours_zero_is_refused_before_anything_starts(cli: Cli) -> None:
    """#53 item 10: ``--hours`` help said 0 was allowed, then the soak refused it after 11.7 s."""
    r = cli("soak", "--hours", "0")
    assert r.code == 2 and "--hours" in r.err and "> 0" in r.err
    assert "using the bundled" not in r.err and "calctl soak:" not in r.err


def test_a_soak_ended_by_an_error_says_the_error_first_on_its_page(tmp_path: Path) -> None:
    """A FAIL for a deleted ELF was visible only inside the folded JSON."""
    doc = {
        "command": "soak",
        "verdict": "FAIL",
        "exit_code": 1,
        "device": "mock",
        "error": "load refused: programs/model-a/decode.elf: HASH001 missing file",
        "reasons": [],
        "interrupted": None,
    }
    assert _reasons(html_report.render(doc, tmp_path))[0] == doc["error"]
    interrupted = {
        **doc,
        "verdict": "INTERRUPTED",
        "error": "interrupted by SIGTERM",
        "interrupted": {"signal": "SIGTERM", "phase": "traffic", "cycle": 4, "at_s": 12.5},
        "facts": [["interrupted", "SIGTERM after 12.5 s, cycle 4 cut short while traffic"]],
    }
    html = html_report.render(interrupted, tmp_path)
    assert _reasons(html)[0] == "interrupted by SIGTERM"
    assert _facts(html)["interrupted"] == "SIGTERM after 12.5 s, cycle 4 cut short while traffic"


def test_soak_facts_name_the_signal_and_phase_of_an_interruption() -> None:
    from calctl.runners.soak.wording import facts

    doc = {
        "status": "interrupted",
        "cycles": 3,
        "cycles_planned": 10,
        "interrupted": {"signal": "SIGINT", "phase": "unload", "cycle": 4, "at_s": 9.25},
        "requests": {"sent": 10, "by_outcome": {"ok": 3, "unavailable": 7}},
        "errors": {},
        "memory": {"max_drift_bytes": {"0": 2**20}, "drift_limit_bytes": {0: 64 * 2**20}},
    }
    seen = dict(facts(doc))
    assert seen["interrupted"] == "SIGINT after 9.2 s, cycle 4 cut short while unload"
    assert seen["cycles"] == "3 of 10" and seen["chip0 max drift"] == "+1.0 MiB (limit 64.0 MiB)"
    assert seen["requests"].startswith("10 sent: 3 succeeded") and "7 refused" in seen["requests"]


@pytest.fixture
def tampered(tmp_path: Path) -> Path:
    """The bundled combined sample with one byte appended to one file: HASH001 names that file."""
    from calctl.compiler.bundled import bundled_package

    pkg = tmp_path / "tampered"
    shutil.copytree(bundled_package("combined"), pkg)
    with (pkg / "model-a" / "golden" / "prefill_logits.npy").open("ab") as f:
        f.write(b"x")
    return pkg


_FILE = "model-a/golden/prefill_logits.npy"


def test_every_command_names_the_file_rule_and_figure_of_a_refusal(cli: Cli, tampered: Path, tmp_path: Path) -> None:
    """#53 item 6: run-golden, serve ``(HASH001)`` and bringup ``verdict FAIL in 0.4 s`` did not name the file."""
    r = cli("run-golden", tampered, "--allow-unsigned")
    assert r.code == 1 and f"HASH001 {_FILE}: sha256 mismatch" in r.out, r.out[-800:]
    r = cli("bringup", tampered, "--allow-unsigned", "--level", "quick", "--report", tmp_path / "b")
    last = r.out.strip().splitlines()[-1]
    assert r.code == 1 and last.startswith("verdict FAIL in ") and "validate FAIL: " in last, last
    assert f"HASH001 {_FILE}: sha256 mismatch" in last, last
    r = cli("soak", tampered, "--allow-unsigned", "--cycles", "1", "--report", tmp_path / "s")
    assert r.code == 1 and f"HASH001 {_FILE}" in r.out
    assert "CheckFailed" not in r.out + r.err  # #53 item 7: no internal class name
    r = cli("serve", tampered, "--allow-unsigned", "--port", "0")
    assert r.code == 1 and f"HASH001 {_FILE}: sha256 mismatch" in r.err, r.err[-800:]


def test_calrt_without_a_library_says_how_to_give_one(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """#53 item 10: ``--device calrt`` without a library gave no hint in a runner's report."""
    monkeypatch.delenv("CALRT_LIBRARY", raising=False)
    r = cli("run-golden", "--device", "calrt")
    assert r.code == 3
    last = r.out.strip().splitlines()[-1]
    assert "--calrt-lib" in last and "CALRT_LIBRARY" in last and "calctl device build-reference" in last
