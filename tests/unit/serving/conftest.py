"""Fixtures for the serving-core unit tests (helpers live in serving_helpers.py)."""

from __future__ import annotations

import pytest

from tests.unit.serving.serving_helpers import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
