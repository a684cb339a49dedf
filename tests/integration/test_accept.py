"""Issue 20 acceptance: ``calctl accept``, the G0–G5 / M0–M4 report from evidence (docs/accept.md).

The quick level on the mock (combined package + replica package) runs twice, split by ``--only``: the rows
here (G0–G2, G5, M0, M3, M4, with ``--previous``: the rollback), and the timed rows G3/G4 under a fault plan
in test_accept_timed.py, so the two runs go to different pytest-xdist workers; the same quick level through
the C reference board is test_accept_reference_board.py (helpers: accept_harness.py). Without ``--previous``
the rollback rows say NOT MEASURED and how; a ``--previous`` that is PKG itself, or another package's models,
is refused.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from calctl.package import schemas
from tests.conftest import TEST_KEY, TEST_PUB
from tests.integration.accept_harness import (
    COMBINED,
    OTHER_ROWS,
    REPLICA,
    ROW_IDS,
    TRUST,
    assert_rows_shape,
    quick_level,
    rows_by_id,
    run_accept,
)
from tests.integration.reference_board import _clean_reference_env  # noqa: F401  (autouse: no CALRT_* leaks in)

pytestmark = pytest.mark.slow  # the quick level's untimed rows: one run, its 1000-request isolation included


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second signed version of the combined fixture (same models, other weights: seed 1), built now with the
    test-only key, as `calctl sample-package --kind combined --seed 1` would: the version PKG replaces."""
    from calctl.compiler.sample import build_sample
    from calctl.signing.keys import load_private

    return build_sample(
        tmp_path_factory.mktemp("previous") / "combined-v0", kind="combined", key=load_private(TEST_KEY), seed=1
    )


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory, previous: Path) -> tuple[int, dict[str, Any], Path, str]:
    return quick_level(tmp_path_factory.mktemp("accept-quick") / "report", ",".join(OTHER_ROWS), "--previous", previous)


def test_quick_level_reports_every_row_go_or_not_measured_with_the_reason(quick) -> None:
    code, doc, out, _ = quick
    assert code == 0, doc["summary"]
    rows = assert_rows_shape(doc, out, OTHER_ROWS)
    # What the quick level measures on the mock, exactly:
    for rid in ("G0", "G1", "G2"):
        assert rows[rid]["verdict"] == "GO", rows[rid]
    # The durations of the report are not reached at the quick level: said with what was reached.
    assert rows["G5"]["verdict"] == "NOT MEASURED" and "/100 cycles" in rows["G5"]["reason"]
    assert "h/24 h" in rows["G5"]["reason"] and "--level long" in rows["G5"]["how_to_measure"]
    assert rows["M0"]["verdict"] == "NOT MEASURED" and "h/24 h" in rows["M0"]["reason"]
    assert rows["M4"]["verdict"] == "NOT MEASURED" and "h/8 h" in rows["M4"]["reason"]
    assert rows["M3"]["verdict"] == "NOT MEASURED" and "B4" in rows["M3"]["reason"]  # the fixture is B1 only


def test_quick_level_isolation_is_the_default_thousand_requests(quick) -> None:
    """G2's evidence: ``bench --scenario isolation`` at its default of 1000 requests (001 §13.1), all judged."""
    _, doc, out, _ = quick
    iso = json.loads((out / "isolation" / "bench-report.json").read_text())
    assert iso["scenario"] == "isolation" and iso["verdict"] == "GO" and iso["mock_result"] is True
    assert iso["requests"]["sent"] == 1000 and iso["requests"]["threshold_met"] is True
    assert iso["requests"]["failed"] == 0 and iso["crosstalk"] == []
    assert all(c["fail"] == 0 for c in iso["checks"].values()) and iso["checks"]["served"]["pass"] == 1000
    assert rows_by_id(doc)["G2"]["key_figure"] == "1000 requests, 0 offender(s)"


def test_quick_level_files_json_junit_and_picture(quick) -> None:
    _, doc, out, _ = quick
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["rows"] == doc["rows"] and on_disk["status"] == "finished"
    assert (out / "accept.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("soak/soak-report.json", "soak/events.ndjson", "run-golden.png", "rollback.json"):
        assert (out / name).is_file(), name
    rb = json.loads((out / "rollback.json").read_text())
    assert rb["ok"] is True and rb["problems"] == [], rb["problems"]
    assert list(schemas.iter_errors("report/v1", rb)) == [] and (rb["verdict"], rb["exit_code"]) == ("PASS", 0)
    assert rb["command"] == "accept rollback" and rb["device_label"].startswith("mock")
    reports = [p for p in out.rglob("*.json") if "trace" not in p.name and "records" not in p.parts]
    assert {"validate.json", "budget.json", "load-peak.json", "report.json"} <= {p.name for p in reports}
    for path in reports:  # every report file of the run is one report, like every --format json
        problems = list(schemas.iter_errors("report/v1", json.loads(path.read_text())))
        assert problems == [], (path.relative_to(out), problems)
    assert rb["digests"]["previous"] != rb["digests"]["package"]  # a version change, not PKG reloaded onto itself
    suite = ET.parse(out / "accept.junit.xml").getroot().find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    board = cases[0]  # the board first, passed
    assert board.get("name") == "board device-check"
    assert [e.tag for e in board] == ["system-out"] and "2/2 chips ready" in (board.findtext("system-out") or "")
    cases = cases[1:]
    assert [c.get("name", "").split()[0] for c in cases] == ROW_IDS
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert len(skipped) == doc["counts"]["NOT MEASURED"] and suite.get("failures") == "0"
    for c in skipped:
        assert (c.find("skipped").get("message") or "").startswith("NOT MEASURED: ")  # type: ignore[union-attr]


def test_with_previous_the_rollback_rolls_forward_and_back_under_traffic(quick, previous: Path) -> None:
    """Issue 29 item 7, with ``--previous``: the old version serves, PKG is rolled forward onto it and one call
    takes it back, all while clients stream to both models (001 §17 G5, 000 §19 M4)."""
    _, doc, out, _ = quick
    rb = json.loads((out / "rollback.json").read_text())
    assert rb["previous"] == str(previous) and rb["package"] == str(COMBINED)
    assert [a["action"] for a in rb["actions"]] == ["start", "reload", "rollback"]
    assert all(a["ok"] for a in rb["actions"]) and rb["actions"][-1]["package"] == str(previous)
    stages = {s["stage"]: s for s in rb["stages"]}
    assert list(stages) == ["serving-previous", "roll-forward", "serving-package", "rollback", "rolled-back"]
    want = [rb["digests"][k] for k in ("previous", "package", "previous")]
    assert [stages[n]["serving_digest"] for n in ("serving-previous", "serving-package", "rolled-back")] == want
    for alias in ("model-a", "model-b"):
        gens = [stages[n]["generations"][alias] for n in ("serving-previous", "serving-package", "rolled-back")]
        assert gens[0] < gens[1] < gens[2], gens
        for name, st in stages.items():  # under traffic: every stage served, nothing failed but 503s
            assert set(st["requests"][alias]) <= {"ok", "unavailable"}, (name, st["requests"])
            if not name.startswith(("roll-forward", "rollback")):
                assert st["requests"][alias].get("ok", 0) > 0, (name, st["requests"])
        assert stages["rolled-back"]["probe"][alias] == stages["serving-previous"]["probe"][alias]
    # "no request got tokens of two generations", recomputed from the file
    per_request = [r for st in stages.values() for r in st["request_generations"]]
    assert per_request and all(len(r["token_generations"]) <= 1 for r in per_request)
    assert {r["outcome"] for r in per_request} <= {"ok", "unavailable"}
    assert rb["probe_changed_with_version"] == {"model-a": True, "model-b": True}  # other weights, other tokens
    rows = rows_by_id(doc)
    for rid in ("G5", "M4"):
        assert rows[rid]["key_figure"].endswith("rollback ok"), rows[rid]
        assert "rollback.report" in rows[rid]["files"] and "no --previous" not in rows[rid]["reason"]
        assert any(
            e.startswith("rollback: combined-v0 -> combined -> rollback to combined-v0") for e in rows[rid]["evidence"]
        )


def test_without_previous_the_rollback_rows_say_not_measured_and_how(tmp_path: Path) -> None:
    """Issue 29 item 7, without ``--previous``: no rollback is run (PKG reloaded onto itself is no version
    change) and M4 says its rollback part is NOT MEASURED, and how to measure it."""
    out = tmp_path / "r"
    code, stdout, _ = run_accept("accept", COMBINED, *TRUST, "--only", "M4", "--report", out, "--format", "table")
    assert code == 0, stdout[-3000:]
    doc = json.loads((out / "report.json").read_text())
    steps = {s["name"]: s for s in doc["steps"]}
    # The step words of every report (docs/cli.md), the why in "detail".
    assert steps["rollback"]["status"] == "SKIP" and "no --previous" in steps["rollback"]["detail"]
    assert not (out / "rollback.json").exists()
    m4 = rows_by_id(doc)["M4"]
    assert doc["verdict"] == "NOT MEASURED" and doc["exit_code"] == 0  # no row GO: never a GO verdict
    assert m4["verdict"] == "NOT MEASURED" and m4["key_figure"].endswith("rollback not measured"), m4
    assert "rollback not run: no --previous package given" in m4["reason"] and "3/100" in m4["reason"]
    assert m4["how_to_measure"].startswith("`calctl accept PKG --level long --previous OLD_PKG`")
    assert "rollback.report" not in m4["files"]
    flat = " ".join(stdout.split())
    assert "M4 NOT MEASURED:" in flat and "no --previous package given" in flat and "--previous OLD_PKG" in flat


def test_previous_naming_pkg_itself_is_no_version_change(tmp_path: Path) -> None:
    from calctl.runners.acceptance.rollback import RollbackRun, SamePackage
    from calctl.runners.device import DeviceSpec
    from calctl.signing.policy import make_policy

    run = RollbackRun(
        package=COMBINED,
        previous=COMBINED,
        device=DeviceSpec(),
        trust=make_policy([TEST_PUB]),
        traffic_s=0.1,
        stage_timeout_s=5.0,
    )
    with pytest.raises(SamePackage, match="same package as PKG"):
        run.run()


def test_a_previous_with_other_models_or_none_is_refused_before_any_step(tmp_path: Path) -> None:
    """--previous is validated up front, with PKG's aliases: a replica (model-a0/a1) or a FIFO is exit 1 naming
    the finding before a step runs (the rollback is the last step: after the soak)."""
    for name, prev in (("replica", REPLICA), ("fifo", tmp_path / "pipe")):
        if name == "fifo":
            os.mkfifo(prev)
        out = tmp_path / name
        code, _, err = run_accept("accept", COMBINED, *TRUST, "--only", "M4", "--previous", prev, "--report", out)
        assert code == 1, err[-2000:]
        assert f"--previous {prev}: the package failed validation" in " ".join(err.split()), err
        assert not (out / "report.json").exists()  # refused before the first step
    _, _, err = run_accept(
        "accept", COMBINED, *TRUST, "--only", "M4", "--previous", REPLICA, "--report", tmp_path / "x"
    )
    assert "MAN004" in err and "PKG serves model-a, model-b" in " ".join(err.split()), err


def test_previous_with_the_same_files_under_a_rewritten_checksum_file_is_no_version_change(tmp_path: Path) -> None:
    import shutil

    from calctl.runners.acceptance.rollback import RollbackRun, SamePackage
    from calctl.runners.device import DeviceSpec
    from calctl.signing.keys import load_private
    from calctl.signing.policy import make_policy
    from calctl.signing.seal import sign

    copy = tmp_path / "resealed"
    shutil.copytree(COMBINED, copy)
    sums = copy / "checksums.sha256"
    sums.write_bytes(b"".join(reversed(sums.read_bytes().splitlines(keepends=True))))  # same files, other bytes
    sign(copy, load_private(TEST_KEY))
    run = RollbackRun(
        package=COMBINED,
        previous=copy,
        device=DeviceSpec(),
        trust=make_policy([TEST_PUB]),
        traffic_s=0.1,
        stage_timeout_s=5.0,
    )
    with pytest.raises(SamePackage, match="holds the same files as PKG"):
        run.run()


def test_a_replica_that_is_refused_is_fail_exit_1_and_g2_says_it_was_refused(tmp_path: Path) -> None:
    """A ``--replica`` that validate-replica refuses (here: the combined package, not a replica) made the run
    GO, exit 0, and G2 said no replica "was given"."""
    code, stdout, _ = run_accept(
        "accept", COMBINED, "--replica", COMBINED, *TRUST, "--only", "G0,G2", "--report", tmp_path / "a",
        "--format", "json",
    )  # fmt: skip
    doc = json.loads(stdout)
    assert code == 1 and doc["verdict"] == "FAIL" and doc["exit_code"] == 1, doc["summary"]
    assert doc["summary"].startswith("FAIL (the package failed validation: validate-replica)"), doc["summary"]
    g2 = rows_by_id(doc)["G2"]
    assert g2["verdict"] == "NOT MEASURED" and "was refused by the validate-replica step" in g2["reason"], g2
    assert "none was given" not in g2["reason"]
