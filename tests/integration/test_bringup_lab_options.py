"""``calctl bringup --fault-plan`` and ``--format junit``: what a lab board's run needs (docs/lab.md).

A lab board with a fault plan runs bring-up on its simulated faults, and a lab's CI reads one JUnit testcase
per bring-up step. Before these options, bringup refused both (exit 2).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.conftest import Cli, assert_no_traceback

PLAN = """schema: calctl-fault-plan/v1
faults:
  - kind: corrupt_output
    probability: 1.0
    model: model-b
    magnitude: 4.0
"""


def test_bringup_runs_on_a_fault_plan_and_prints_junit(cli: Cli, tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    out = tmp_path / "report"
    result = cli("bringup", "--level", "quick", "--fault-plan", plan, "--report", out, "--format", "junit")
    assert_no_traceback(result)
    assert result.code == 1, result.err
    root = ET.fromstring(result.out)
    cases = {c.get("name"): c for c in root.iter("testcase")}
    steps = [
        "device-check",
        "conformance",
        "selftest",
        "burn-in",
        "validate",
        "budget",
        "run-golden",
        "warmup",
        "poc",
        "soak",
    ]
    assert list(cases) == steps
    # model-b's answers are corrupt: the board's known-answer check (the first step) fails on chip 1, and a
    # board that is not ready runs nothing else
    failure = cases["device-check"].find("failure")
    assert failure is not None and "model-b" in (failure.get("message") or "")
    assert root.get("failures") == "1" and root.get("skipped") == str(len(steps) - 1)
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"] == "FAIL" and doc["device_options"]["fault_plan"] == str(plan)
