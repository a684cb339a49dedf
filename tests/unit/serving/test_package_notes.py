"""What `calctl serve` says about the package it loads: its validation warnings and random sample weights."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from calctl.package.reader import load_manifest
from calctl.package.validate import ValidationPolicy, validate
from calctl.serving.engine.load_check import _log_package_notes
from calctl.signing.policy import make_policy
from tests.conftest import FIXTURE_PACKAGES, TEST_PUB


def test_serve_logs_the_test_only_key_and_the_sample_s_random_weights(caplog) -> None:
    root = FIXTURE_PACKAGES / "combined"
    report = validate(root, ValidationPolicy(trust=make_policy([TEST_PUB])))
    assert report and [w.id for w in report.warnings] == ["SIG002"]
    lp = SimpleNamespace(source=str(root), package=load_manifest(root))
    with caplog.at_level(logging.WARNING, logger="calctl.serve"):
        _log_package_notes(lp, report.warnings)  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records]
    assert any("SIG002" in line and "test-only key" in line for line in lines)
    noise = [line for line in lines if "random weights" in line]
    assert len(noise) == 1 and "model-a, model-b have" in noise[0] and "SmolLM2" in noise[0]
