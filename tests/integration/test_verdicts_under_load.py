"""Issue 26: a defect the evidence shows is NO-GO at any host load, a healthy board never is.

Each case runs idle and with one CPU-bound process per core beside it (``tests/cpu_load.py``): the modelled
global runtime lock (``--serialize-chips``, G3), corrupted output (G1), a golden mismatch in the package (G1)
and KV corruption (G2) stay NO-GO, because they are decided from outputs, records and the device's own job
intervals, never from the host's clock; a board that answers the device check's known answers wrong is
stopped there (FAIL, naming the chip), at any load too. The reference board's ``CALRT_REF_BOARD_LOCK=1`` is in
tests/integration/test_reference_board_runners.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calctl.compiler import writer
from calctl.signing import keys, seal
from tests.conftest import FIXTURE_PACKAGES, TEST_KEY, TEST_PUB
from tests.cpu_load import busy_host

COMBINED = FIXTURE_PACKAGES / "combined"
REPLICA = FIXTURE_PACKAGES / "replica"
TRUST = ("--trusted-key", str(TEST_PUB))
pytestmark = pytest.mark.slow


@pytest.fixture(params=["idle", "loaded"])
def host(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "idle":
        yield "idle"
        return
    with busy_host():
        yield "loaded"


def _accept(only: str, pkg: Path, out: Path, *extra: str | Path) -> tuple[int, dict[str, Any], str]:
    from calctl.cli.app import main

    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        code = main(
            [str(a) for a in ("accept", pkg, *TRUST, "--only", only, *extra, "--report", out, "--format", "json")]
        )
    text = o.getvalue() + e.getvalue()
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]
    return code, {r["id"]: r for r in json.loads(o.getvalue())["rows"]}, e.getvalue()


def _plan(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(f"schema: calctl-fault-plan/v1\nfaults:\n  - {body}\n", encoding="utf-8")
    return path


def test_serialized_chips_are_g3_no_go(host: str, tmp_path: Path) -> None:
    code, rows, err = _accept("G3", COMBINED, tmp_path / "r", "--serialize-chips")
    assert code == 1, err[-2000:]
    assert rows["G3"]["verdict"] == "NO-GO" and rows["G3"]["key_figure"].startswith("S1"), (host, rows["G3"])
    assert "took turns" in rows["G3"]["reason"], rows["G3"]


def test_corrupt_output_is_g1_no_go(host: str, tmp_path: Path) -> None:
    # On a graph the device check's known answers do not run (they are the bundled combined sample's model-a and
    # model-b), so the check passes and run-golden shows the defect; the check's own catch is the next test.
    plan = _plan(tmp_path, "{kind: corrupt_output, job: 3, graph: model_a1_decode, magnitude: 8.0}")
    code, rows, err = _accept("G1", REPLICA, tmp_path / "r", "--fault-plan", plan)
    assert code == 1, err[-2000:]
    assert rows["G1"]["verdict"] == "NO-GO" and "model-a1" in rows["G1"]["reason"], (host, rows["G1"])


def test_a_board_that_answers_wrong_stops_accept_at_the_device_check(host: str, tmp_path: Path) -> None:
    """Issue 51 item 6: the known-answer job catches a chip that computes wrong before any row's evidence, at any
    host load, naming the chip."""
    plan = _plan(tmp_path, "{kind: corrupt_output, job: 3, graph: model_b_decode, magnitude: 8.0}")
    code, rows, err = _accept("G1", COMBINED, tmp_path / "r", "--fault-plan", plan)
    assert code == 1, err[-2000:]
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert doc["verdict"] == "FAIL" and doc["summary"].startswith("FAIL (the board is not ready: chip 1:"), (host, doc)
    assert rows["G1"]["verdict"] == "NOT MEASURED" and "the board is not ready" in rows["G1"]["reason"]


def test_a_golden_mismatch_is_g1_no_go(host: str, tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    shutil.copytree(COMBINED, pkg)
    tokens = pkg / "model-b" / "golden" / "expected_tokens.npy"
    want = np.load(tokens)
    want[3] = (int(want[3]) + 1) % 384  # the package's golden says another token than the model computes
    np.save(tokens, want)
    writer.refresh_provenance(pkg)
    seal.seal(pkg, keys.load_private(TEST_KEY))
    code, rows, err = _accept("G1", pkg, tmp_path / "r")
    assert code == 1, err[-2000:]
    assert rows["G1"]["verdict"] == "NO-GO" and "model-b" in rows["G1"]["reason"], (host, rows["G1"])


def test_kv_corruption_is_g2_no_go(host: str, tmp_path: Path) -> None:
    plan = _plan(tmp_path, "{kind: kv_corruption, probability: 0.5, model: model-a1}")  # not the check's models
    code, rows, err = _accept("G2", REPLICA, tmp_path / "r", "--fault-plan", plan)
    assert code == 1, err[-2000:]
    assert rows["G2"]["verdict"] == "NO-GO" and "chip" in rows["G2"]["reason"], (host, rows["G2"])
