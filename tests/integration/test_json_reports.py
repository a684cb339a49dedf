"""Every command's ``--format json`` is one report (``report/v1``): header, ``verdict`` and ``exit_code``.

Each command runs in-process; its JSON must pass the one schema, and the exit code it states must be the
process's. docs/cli.md "Verdicts": the last line of every run is its verdict, and so is its JSON.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calctl.package import schemas
from tests.conftest import FIXTURE_PACKAGES, TEST_KEY, TEST_PUB, Cli, assert_no_traceback

TRUST = ("--trusted-key", str(TEST_PUB))
COMBINED = FIXTURE_PACKAGES / "combined"
SINGLE = FIXTURE_PACKAGES / "single"
REPLICA = FIXTURE_PACKAGES / "replica"


def _corrupt(tmp: Path) -> Path:
    bad = tmp / "bad"
    shutil.copytree(COMBINED, bad)
    (bad / "model-b" / "golden" / "expected_tokens.npy").write_bytes(b"not the sealed bytes")
    return bad


def _fifo(tmp: Path) -> Path:
    fifo = tmp / "pkg.fifo"
    os.mkfifo(fifo)
    return fifo


def _sealed_copy(tmp: Path) -> Path:
    copy = tmp / "copy"
    shutil.copytree(SINGLE, copy)
    return copy


def _report_dir(tmp: Path, board: str) -> Path:
    """A board's report directory: a report.json with a figure and its interval."""
    d = tmp / board
    d.mkdir()
    doc = {"command": "device selftest", "verdict": "PASS", "device": "mock", "device_label": "mock",
           "rows": [{"name": "h2d chip 0", "status": "PASS", "figure_gbps": 3.0,
                     "interval": {"mean": 3.0, "ci_low": 2.9, "ci_high": 3.1}}]}  # fmt: skip
    (d / "report.json").write_text(json.dumps(doc))
    return d


def _hf(tmp: Path) -> Path:
    from tests.unit.compiler.checkpoint_factory import write_hf_dir

    d, _, _ = write_hf_dir(tmp / "hf", "llama")
    return d


def _gguf(tmp: Path) -> Path:
    from tests.unit.compiler.checkpoint_factory import write_gguf, write_hf_dir

    d, cfg, weights = write_hf_dir(tmp / "hf", "llama")
    return write_gguf(tmp / "tiny.gguf", d, cfg, weights)


#: command -> (argv from a scratch directory, the exit code it must have). Each argv gets --format json.
CASES: dict[str, tuple[Callable[[Path], list[Any]], int]] = {
    "keygen": (lambda t: ["keygen", t / "k"], 0),
    "sample-package": (lambda t: ["sample-package", t / "s", "--key", TEST_KEY, "--kind", "single"], 0),
    "pack": (lambda t: ["pack", _sealed_copy(t), "--key", TEST_KEY], 0),
    "sign": (lambda t: ["sign", _sealed_copy(t), "--key", TEST_KEY], 0),
    "verify": (lambda t: ["verify", COMBINED, *TRUST], 0),
    "verify-fail": (lambda t: ["verify", _corrupt(t), *TRUST], 1),
    # refused before the command had a report: main prints one (the exit code's word, the cause in "error")
    "verify-refused": (lambda t: ["verify", _fifo(t), *TRUST], 1),
    "inspect-refused": (lambda t: ["inspect", _fifo(t), *TRUST], 1),
    "budget-refused": (lambda t: ["budget", _corrupt(t), *TRUST], 1),
    "device info-refused": (lambda t: ["device", "info", "--device", "calrt", "--calrt-lib", t / "absent.so"], 3),
    "inspect": (lambda t: ["inspect", COMBINED, *TRUST], 0),
    "import": (lambda t: ["import", "hf", _hf(t), t / "imported", "--key", TEST_KEY], 0),
    "import-gguf": (lambda t: ["import", "gguf", _gguf(t), t / "imported", "--key", TEST_KEY], 0),
    "combine": (lambda t: ["combine", SINGLE, SINGLE, t / "combined", "--key", TEST_KEY, *TRUST], 0),
    "validate": (lambda t: ["validate", COMBINED, *TRUST], 0),
    "validate-fail": (lambda t: ["validate", _corrupt(t), *TRUST], 1),
    "rules": (lambda t: ["rules"], 0),
    "explain": (lambda t: ["explain", "CHIP003"], 0),
    "budget": (lambda t: ["budget", COMBINED, *TRUST], 0),
    "device info": (lambda t: ["device", "info"], 0),
    "device check": (lambda t: ["device", "check"], 0),
    "device check-refused": (lambda t: ["device", "check", "--device", "calrt", "--calrt-lib", t / "absent.so"], 3),
    "device reset": (lambda t: ["device", "reset", "--scope", "chip", "--chip", "0"], 0),
    "device selftest": (lambda t: ["device", "selftest", "--repeats", "1"], 0),
    "device list": (lambda t: ["device", "list"], 0),
    "report merge": (lambda t: ["report", "merge", _report_dir(t, "b0"), _report_dir(t, "b1"), "--out", t / "f"], 0),
    "report compare": (lambda t: ["report", "compare", _report_dir(t, "b0"), _report_dir(t, "b1")], 0),
    "run-golden": (lambda t: ["run-golden", COMBINED, *TRUST], 0),
    "run-golden-fail": (lambda t: ["run-golden", _corrupt(t), *TRUST], 1),
    "warmup": (lambda t: ["warmup", COMBINED, *TRUST, "--iterations", "3"], 0),
    "poc combined": (
        lambda t: ["poc", "combined", COMBINED, *TRUST, "--expect-models", "model-a,model-b", "--rounds", "2"],
        0,
    ),
    "bringup": (lambda t: ["bringup", SINGLE, *TRUST, "--level", "quick", "--report", t / "b"], 0),
    "soak": (lambda t: ["soak", COMBINED, *TRUST, "--cycles", "1", "--traffic-seconds", "0.3", "--report", t / "s"], 0),
    "soak-refused": (lambda t: ["soak", _corrupt(t), *TRUST, "--cycles", "1", "--report", t / "s"], 1),
    "accept": (lambda t: ["accept", COMBINED, *TRUST, "--only", "G0", "--level", "quick", "--report", t / "a"], 0),
    # an in-process scenario: its body may not replace the header's device_label or the report's seconds
    "bench": (lambda t: ["bench", "--scenario", "isolation", "--requests", "10", "--report", t / "b"], 0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_command_json_is_one_report(cli: Cli, tmp_path: Path, case: str) -> None:
    argv, code = CASES[case]
    r = cli(*argv(tmp_path), "--format", "json")
    assert_no_traceback(r)
    assert r.code == code, (r.code, r.err[-2000:])
    doc = r.json
    problems = list(schemas.iter_errors("report/v1", doc))
    assert not problems, problems
    assert doc["exit_code"] == r.code and next(iter(doc)) == "schema_version"
    assert doc["command"] == case.removesuffix("-fail").removesuffix("-refused").removesuffix("-gguf")
    if case.endswith("-refused"):
        assert doc["verdict"] != "PASS" and doc["error"], doc


def test_a_refused_soak_is_a_failed_check_that_says_why(cli: Cli, tmp_path: Path) -> None:
    """A package that fails validation is FAIL, exit 1 (docs/cli.md: a bad package), never ERROR with exit 1,
    and the report says why (the error was kept out of the document)."""
    argv, _ = CASES["soak-refused"]
    doc = cli(*argv(tmp_path), "--format", "json").json
    assert doc["status"] == "error" and doc["verdict"] == "FAIL" and doc["exit_code"] == 1
    assert "failed validation" in doc["error"]
    saved = (tmp_path / "s" / "soak-report.json").read_text()
    assert '"verdict": "FAIL"' in saved and "failed validation" in saved
