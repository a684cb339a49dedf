"""Fixtures for the runtime tests: sample packages, the CalRT stub build, and a backend harness.

The stub (tests/native/calrt_stub.c) is compiled once per session with the
system C compiler into a pytest tmp dir. Only a missing compiler skips the
calrt backend; a compile error fails the suite. Helpers live in runtime_helpers.py.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from calctl.package.model import Package
from calctl.runtime import Runtime, open_runtime
from tests.unit.runtime.runtime_helpers import NATIVE, Backend, package


def _compile(tmp: Path, name: str, *defines: str) -> Path:
    from calctl.runtime._native.build import SOURCE_DIR

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip(
            "no C compiler (cc or gcc) on PATH: cannot build tests/native/calrt_stub.c, so the calrt backend is untested here"
        )
    out = tmp / name
    cmd = [
        cc,
        "-std=c11",
        "-O1",
        "-fPIC",
        "-shared",
        "-pthread",
        "-Wall",
        "-Wextra",
        "-Werror",
        *defines,
        "-I",
        str(SOURCE_DIR),  # calrt.h and calrt_ext.h ship in the package
        "-o",
        str(out),
        str(NATIVE / "calrt_stub.c"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"building the CalRT stub failed:\n{' '.join(cmd)}\n{proc.stderr}"
    return out


@pytest.fixture(scope="session")
def calrt_stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of the compiled CalRT C-ABI stub library."""
    return _compile(tmp_path_factory.mktemp("calrt-stub"), "libcalrt_stub.so")


@pytest.fixture(scope="session")
def calrt_stub_without_kv_free(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stub built without ``calrt_kv_free``: a library missing one ABI symbol."""
    return _compile(tmp_path_factory.mktemp("calrt-stub-nokvfree"), "libcalrt_nokvfree.so", "-DCALRT_STUB_OMIT_KV_FREE")


@pytest.fixture(scope="session")
def calrt_stub_crashing_in_wait(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stub built so that ``calrt_job_wait`` aborts the process: a shim that crashes."""
    return _compile(tmp_path_factory.mktemp("calrt-stub-crash"), "libcalrt_crash.so", "-DCALRT_STUB_CRASH_IN_WAIT")


@pytest.fixture(scope="session")
def calrt_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference board, built the way ``calctl device build-reference`` builds it."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (cc or gcc) on PATH: cannot build the reference board")
    from calctl.runtime._native.build import build_reference

    return build_reference(tmp_path_factory.mktemp("calrt-reference")).library


@pytest.fixture(autouse=True)
def _no_stub_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "CALRT_STUB_FAULTS",
        "CALRT_STUB_PCI",
        "CALRT_STUB_ABI_MAJOR",
        "CALRT_LIBRARY",
        "CALRT_REF_FAULTS",
        "CALRT_REF_BOARD_LOCK",
        "CALRT_REF_TIME_SCALE",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def combined() -> Package:
    return package("combined")


@pytest.fixture(params=["mock", "calrt", "reference"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "mock":
        return Backend("mock", lambda: open_runtime("mock"))
    lib = request.getfixturevalue("calrt_stub" if request.param == "calrt" else "calrt_reference")
    return Backend(request.param, lambda: open_runtime("calrt", calrt_lib=lib))


@pytest.fixture
def rt(backend: Backend) -> Iterator[Runtime]:
    with backend.open() as runtime:
        yield runtime


@pytest.fixture
def configured(rt: Runtime, combined: Package) -> Runtime:
    rt.configure(rt.create_calbin(combined))
    return rt
