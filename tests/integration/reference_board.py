"""The reference board for integration tests, built exactly as ``calctl device build-reference`` builds it.

Import the ``reference_board`` fixture into a test module. The library goes to one
directory under the session's pytest base temp, so the second module that asks
reuses the first build (the build is keyed by the source digest).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from calctl.runtime._native.build import build_reference

REF_ENV = ("CALRT_REF_FAULTS", "CALRT_REF_BOARD_LOCK", "CALRT_REF_TIME_SCALE", "CALRT_LIBRARY")


@pytest.fixture(scope="session")
def reference_board(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (cc or gcc) on PATH: cannot build the reference board")
    return build_reference(tmp_path_factory.getbasetemp() / "calrt-reference").library


@pytest.fixture(autouse=True)
def _clean_reference_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in REF_ENV:
        monkeypatch.delenv(var, raising=False)
