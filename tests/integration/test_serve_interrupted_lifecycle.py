"""A signal's ``Interrupted`` in the middle of a lifecycle call (a runner's ``start``/``reload`` runs on the main
thread) is cleaned up like any failure: no alias is left Configuring or Warming (001 §11.1), the calbin the
configure created is released (000 §12), and the interrupt still propagates."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from calctl.errors import Interrupted
from calctl.runtime import open_runtime
from calctl.serving.engine import DeviceSupervisor, SupervisorOptions
from calctl.signing.policy import make_policy
from tests.conftest import TEST_PUB
from tests.integration.serve_harness import COMBINED


@contextmanager
def _served() -> Iterator[tuple[DeviceSupervisor, Any]]:
    with open_runtime("mock", time_scale=0.05) as rt:
        sup = DeviceSupervisor(rt, trust=make_policy([TEST_PUB]), options=SupervisorOptions(warmup_iterations=1))
        try:
            sup.start(COMBINED)
            yield sup, rt
        finally:
            sup.shutdown(2.0)


def _interrupt(*args: Any, **kwargs: Any) -> Any:
    raise Interrupted("SIGTERM")  # what the signal handler raises in the main thread (calctl.errors)


@pytest.mark.parametrize("step", ["configure", "golden"])
def test_an_interrupted_reload_leaves_every_alias_failed_and_releases_the_calbin(
    step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _served() as (sup, rt):
        if step == "configure":
            monkeypatch.setattr(rt, "configure", _interrupt)
        else:
            monkeypatch.setattr(sup, "_golden_and_warmup", _interrupt)
        with pytest.raises(Interrupted):
            sup.reload()
        states = {a: c.state.value for a, c in sup.cores.items()}
        assert set(states.values()) == {"Failed"}, states
        assert all("failed" in why for why in sup.failures.values()), sup.failures
        assert sup._calbin is None  # released: nothing holds the configuration any more
