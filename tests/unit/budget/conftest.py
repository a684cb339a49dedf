"""Shared paths and small factories for the budget tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calctl.budget.shape import ModelShape, load_hf_config
from calctl.package.model import Package
from calctl.package.reader import load_manifest

ROOT = Path(__file__).resolve().parents[3]
HF_ASSETS = ROOT / "tests" / "assets" / "hf"
FIXTURE_PACKAGES = ROOT / "fixtures" / "packages"
PACKAGE_KINDS = ("single", "combined", "replica")


@pytest.fixture
def hf_shape() -> Callable[[str], ModelShape]:
    """Load ``tests/assets/hf/<name>/config.json``."""
    return lambda name: load_hf_config(HF_ASSETS / name / "config.json")


@pytest.fixture
def hf_config_doc() -> Callable[[str], dict[str, Any]]:
    """The parsed config.json of an asset, for tests that edit a field."""
    return lambda name: json.loads((HF_ASSETS / name / "config.json").read_text())


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    """Write a config mapping to a temporary config.json and return its path."""

    def write(doc: dict[str, Any], name: str = "model") -> Path:
        d = tmp_path / name
        d.mkdir(parents=True, exist_ok=True)
        path = d / "config.json"
        path.write_text(json.dumps(doc))
        return path

    return write


@pytest.fixture(scope="session")
def packages() -> dict[str, Package]:
    return {kind: load_manifest(FIXTURE_PACKAGES / kind) for kind in PACKAGE_KINDS}


@pytest.fixture
def hf_assets_dir() -> Path:
    return HF_ASSETS


@pytest.fixture
def fixture_packages_dir() -> Path:
    return FIXTURE_PACKAGES


@pytest.fixture(autouse=True)
def _debug_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test with tracebacks off.

    ``calctl.cli.app`` keeps ``--debug`` in a module-level flag that a ``--debug`` run
    elsewhere in the session leaves set; these tests check that errors print no traceback.
    """
    from calctl.cli import app

    monkeypatch.setitem(app._state, "debug", False)
    monkeypatch.delenv("CALCTL_DEBUG", raising=False)
