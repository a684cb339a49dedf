"""Both backends keep their host-side bookkeeping through one base (calctl/runtime/bookkeeping.py), so they cannot
drift: buffer ownership, the current calbin, submit's checks and listeners, the trace."""

from __future__ import annotations

import pytest

from calctl.runtime._native.backend import CalrtRuntime
from calctl.runtime.bookkeeping import DeviceBookkeeping
from calctl.runtime.mock.board import MockRuntime

SHARED = (
    "__enter__",
    "__exit__",
    "alloc_inputs",
    "alloc_outputs",
    "current_calbin",
    "job_buffers",
    "on_submit",
    "release_buffer",
    "submit",
    "trace",
    "_check_open",
    "_give_back",
    "_graph",
    "_let_go",
    "_release_calbin",
    "_release_quarantined",
    "_settle",
    "_submit_plan",
    "_unconfigured",
)


@pytest.mark.parametrize("backend", [MockRuntime, CalrtRuntime], ids=["mock", "calrt"])
def test_a_backend_inherits_the_shared_bookkeeping_and_redefines_none_of_it(backend: type) -> None:
    assert issubclass(backend, DeviceBookkeeping)
    own = backend.__mro__[: backend.__mro__.index(DeviceBookkeeping)]  # the backend's classes above the base

    def defined(name: str) -> bool:
        return any(name in vars(cls) for cls in own)

    assert [name for name in SHARED if defined(name)] == [], f"{backend.__name__} redefines shared bookkeeping"
    assert all(defined(hook) for hook in ("_alloc", "_submit", "close"))
