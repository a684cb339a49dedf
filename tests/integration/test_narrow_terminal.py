"""At 80 columns (a pty of that width), tables wrap between words: no identifier is split across lines."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_PACKAGES, TEST_PUB

GRAPHS = ("model_a_prefill", "model_a_decode", "model_b_prefill", "model_b_decode")


def _in_pty(*args: str, columns: int = 80, cwd: Path | None = None) -> str:
    """Run calctl on a pseudo-terminal ``columns`` wide; return what it showed."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["TERM"] = "dumb"
    proc = subprocess.Popen(
        [sys.executable, "-m", "calctl", *args],
        stdin=follower,
        stdout=follower,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=300)
    os.close(leader)
    return b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "│" in line or "┃" in line]


@pytest.mark.parametrize(
    ("args", "identifiers"),
    [
        (("inspect", str(FIXTURE_PACKAGES / "combined"), "--trusted-key", str(TEST_PUB)), GRAPHS),
        (
            ("budget", str(FIXTURE_PACKAGES / "combined"), "--trusted-key", str(TEST_PUB)),
            ("code_and_commands", "allocator_fragmentation", "runtime_metadata", "workspace_peak", "M_required"),
        ),
        (("warmup", str(FIXTURE_PACKAGES / "combined"), "--trusted-key", str(TEST_PUB)), GRAPHS),
    ],
    ids=["inspect", "budget", "warmup"],
)
def test_tables_at_80_columns_keep_identifiers_whole(args: tuple[str, ...], identifiers: tuple[str, ...]) -> None:
    text = _in_pty(*args)
    lines = _table_lines(text)
    assert lines, text[-2000:]
    assert max(len(line) for line in lines) <= 80
    cells = " ".join(part.strip() for line in lines for part in line.replace("┃", "│").split("│"))
    for name in identifiers:
        assert name in cells.split(), (name, text[-3000:])


# ---------------------------------------------------------------------------
# poc, bench and accept at 80 columns: every line fits, tables keep identifiers whole, and no sentence the
# report holds is cut (prose wraps between words; a cell too narrow for a word shows an ellipsis)


def _prose(text: str) -> str:
    """What the run showed outside its tables, as one line with single spaces (wrapped lines joined)."""
    return " ".join(" ".join(line.split()) for line in text.splitlines() if line.strip() and not _boxed(line))


def _boxed(line: str) -> bool:
    return any(ch in line for ch in "│┃┏┡└━─")


def _cells(text: str) -> list[str]:
    return " ".join(part.strip() for line in _table_lines(text) for part in line.replace("┃", "│").split("│")).split()


def _assert_fits(text: str, identifiers: tuple[str, ...]) -> None:
    lines = text.splitlines()
    assert lines
    too_long = [line for line in lines if len(line) > 80]
    assert not too_long, too_long
    cells = _cells(text)
    for name in identifiers:
        assert name in cells, (name, text[-3000:])


def _assert_shown_whole(text: str, sentences: list[str]) -> None:
    prose = _prose(text)
    for sentence in sentences:
        assert " ".join(sentence.split()) in prose, (sentence, prose[-3000:])


def test_poc_at_80_columns(tmp_path: Path) -> None:
    report = tmp_path / "poc.json"
    text = _in_pty(
        "poc", "combined", str(FIXTURE_PACKAGES / "combined"), "--trusted-key", str(TEST_PUB),
        "--expect-models", "model-a,model-b", "--rounds", "2", "--time-scale", "4", "--report", str(report),
    )  # fmt: skip
    doc = json.loads(report.read_text(encoding="utf-8"))
    _assert_fits(text, ("overlap_ratio", "efficiency", "round", "configure"))
    _assert_shown_whole(text, [*doc["reasons"], doc["capability"], f"report: {report}"])


def test_bench_at_80_columns(tmp_path: Path) -> None:
    """fault-isolation prints one block per phase: its evidence lines wrapped at 80, never cropped (issue 31)."""
    out = tmp_path / "bench"
    text = _in_pty("bench", "--scenario", "fault-isolation", "--time-scale", "2", "--report", str(out))
    doc = json.loads((out / "bench-report.json").read_text(encoding="utf-8"))
    _assert_fits(text, ())
    assert len(doc["phases"]) >= 5
    shown = [p["scope_granted"] for p in doc["phases"]] + [i for p in doc["phases"] for i in p["b_impact"]]
    _assert_shown_whole(text, [*shown, *doc["notes"]])
    for phase in doc["phases"]:
        assert f"phase {phase['phase']}" in text


def test_accept_at_80_columns(tmp_path: Path) -> None:
    out = tmp_path / "accept"
    # A relative report directory: the paths it prints fit 80 columns (pytest's tmp_path alone can be longer
    # than a line, and a path is never broken to fit).
    text = _in_pty("accept", "--only", "G0,M0", "--report", "accept", cwd=tmp_path)
    doc = json.loads((out / "report.json").read_text(encoding="utf-8"))
    ids = tuple(w for r in doc["rows"] for w in f"{r['id']} {r['title']}".split())
    _assert_fits(text, (*ids, "NOT", "MEASURED"))
    measured = [r for r in doc["rows"] if r["id"] in ("G0", "M0")]
    reasons = [r["reason"] for r in measured if r["verdict"] != "GO"]
    assert reasons  # M0's soak is short of 24 h: NOT MEASURED with its reason, wrapped
    _assert_shown_whole(text, [*reasons, doc["summary"], "accept/report.html"])
