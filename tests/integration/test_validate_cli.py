"""Issue 3 acceptance from a real process: exit codes, JSON schema, JUnit, tar packages, fresh samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from calctl.package import archive, schemas
from calctl.package.rules import RULES
from tests.conftest import FIXTURE_PACKAGES, REPO, TEST_KEY, TEST_PUB, Cli


def _calctl(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "CALCTL_TRUSTED_KEYS"}
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "calctl", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=full_env,
        timeout=120,
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert "internal error" not in proc.stdout + proc.stderr, proc.stderr
    return proc


@pytest.mark.parametrize("kind", ["single", "combined", "replica"])
def test_fixture_package_exits_zero_with_schema_valid_json(kind: str) -> None:
    proc = _calctl("validate", FIXTURE_PACKAGES / kind, "--trusted-key", TEST_PUB, "--format", "json", "--fail-on-skip")
    assert proc.returncode == 0, proc.stdout
    doc = json.loads(proc.stdout)
    assert list(schemas.iter_errors("validate-report/v1", doc)) == []
    assert doc["ok"] and doc["skipped"] == 0
    assert {c["id"] for c in doc["checks"]} == {r.id for r in RULES}


def test_fresh_batched_sample_as_tar_validates_with_profiles(tmp_path: Path) -> None:
    out = tmp_path / "b16"
    tar = tmp_path / "b16.tar"
    proc = _calctl(
        "sample-package", out, "--kind", "combined", "--key", TEST_KEY, "--profiles", "1,4,8,16", "--tar", tar
    )
    assert proc.returncode == 0, proc.stderr
    proc = _calctl(
        "validate",
        tar,
        "--trusted-key",
        TEST_PUB,
        "--profile",
        "8",
        "--profile",
        "16",
        "--expect-models",
        "model-a,model-b",
        "--runtime-version",
        "0.7.6",
        "--format",
        "junit",
    )
    assert proc.returncode == 0, proc.stdout
    tree = ET.fromstring(proc.stdout)
    assert int(tree.get("failures", "-1")) == 0 and int(tree.get("errors", "-1")) == 0
    assert len(list(tree.iter("testcase"))) == len(RULES)


def test_tampered_package_exits_one_and_names_file(tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "pkg"
    shutil.copytree(FIXTURE_PACKAGES / "combined", root)
    with open(root / "model-b" / "params" / "param_blk0.bin", "r+b") as fh:
        fh.seek(4096)
        fh.write(b"\xff\xff\xff\xff")
    proc = _calctl("validate", root, "--trusted-key", TEST_PUB)
    assert proc.returncode == 1
    assert "HASH001" in proc.stdout and "model-b/params/param_blk0.bin" in proc.stdout
    archive.write_tar(root, tmp_path / "pkg.tar")
    proc = _calctl("validate", tmp_path / "pkg.tar", "--trusted-key", TEST_PUB, "--format", "json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["errors"] >= 1


def test_trust_from_environment_directory(tmp_path: Path) -> None:
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / "ci.pub").write_bytes(TEST_PUB.read_bytes())
    proc = _calctl("validate", FIXTURE_PACKAGES / "single", "--format", "json", env={"CALCTL_TRUSTED_KEYS": str(trust)})
    assert proc.returncode == 0, proc.stdout
    proc = _calctl("validate", FIXTURE_PACKAGES / "single", "--format", "json")
    assert proc.returncode == 1
    assert [c["id"] for c in json.loads(proc.stdout)["checks"] if c["status"] == "fail"] == ["SIG001"]


def test_usage_errors_exit_two(tmp_path: Path) -> None:
    assert _calctl("validate", tmp_path / "absent").returncode == 2
    proc = _calctl("explain", "XYZ999")
    assert proc.returncode == 2 and "XYZ999" in proc.stderr
    assert _calctl("validate", FIXTURE_PACKAGES / "single", "--profile", "zero").returncode == 2


def _at_width(monkeypatch: pytest.MonkeyPatch, width: int):
    import io

    from rich.console import Console

    from calctl.cli import _output

    buf = io.StringIO()
    monkeypatch.setattr(_output, "stdout", Console(file=buf, width=width, highlight=False, soft_wrap=True))
    return buf


def test_validate_of_the_bundled_sample_fits_one_80x40_screen(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21: failures and warnings in full, passes counted; the whole summary on one 80x40 terminal."""
    buf = _at_width(monkeypatch, 80)
    r = cli("validate")
    assert r.code == 0, r.err
    lines = buf.getvalue().splitlines()
    assert len(lines) <= 40, "\n".join(lines)
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    text = buf.getvalue()
    assert "WARN SIG002" in text and "test-only key" in text  # the warning, its text uncut
    assert "rule(s) passed" in text and "PASS LAY" not in text
    assert "verdict WARN" in text and "1 warning(s) (SIG002)" in text  # the warning named where it is counted


def test_validate_verbose_lists_every_rule(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from calctl.package.rules import RULES

    buf = _at_width(monkeypatch, 100)
    r = cli("validate", "--verbose")
    assert r.code == 0, r.err
    text = buf.getvalue()
    assert all(f" {rule.id} " in text for rule in RULES)
