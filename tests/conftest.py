"""Shared fixtures: the test-only key, fixture packages, and an in-process CLI runner."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
FIXTURE_PACKAGES = FIXTURES / "packages"
TEST_KEY = FIXTURES / "keys" / "calctl-test-only-DO-NOT-TRUST.key"
TEST_PUB = FIXTURES / "keys" / "calctl-test-only-DO-NOT-TRUST.pub"

# Nothing a test run keeps goes into the checkout or the user's home: one scratch directory per session,
# removed at exit, holds the bundled-sample cache and Hypothesis's storage (it caches constants and Unicode
# tables even with no example database). pytest's own cache is off in pyproject.toml (-p no:cacheprovider).
SCRATCH = Path(tempfile.mkdtemp(prefix="calctl-tests-"))
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)
os.environ.setdefault("CALCTL_CACHE_DIR", str(SCRATCH / "cache"))
if "PYTEST_XDIST_WORKER" in os.environ:
    # A pytest-xdist worker inherits the controller's environment, its cache directory included: each worker
    # process has a cache of its own, like any other session.
    os.environ["CALCTL_CACHE_DIR"] = str(SCRATCH / "cache")
# The calrt board lock (calctl.runtime.board_lock) lives in the session's scratch: concurrent test runs on
# one machine never collide on the shared /tmp lock of the "default" board.
os.environ["CALCTL_LOCK_DIR"] = str(SCRATCH / "locks")
os.environ.pop("CALCTL_TRUSTED_KEYS", None)
os.environ.pop("CALCTL_DEBUG", None)
# Tables honour COLUMNS (calctl.cli._output); pytest-xdist workers get COLUMNS=80 from execnet, so every
# in-process run would lay out at another width than a plain run: tests pin their own width where it matters.
os.environ.pop("COLUMNS", None)
set_hypothesis_home_dir(SCRATCH / "hypothesis")
# No example database: a failure is reported with its minimal example and seed, not replayed from disk.
settings.register_profile("calctl", database=None)
settings.load_profile("calctl")


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        import json

        return json.loads(self.out)


class Cli(Protocol):
    """The ``cli`` fixture's type: run calctl in-process with ``args`` (each one passed through ``str``)."""

    def __call__(self, *args: object) -> CliResult: ...


def run_in_process(*args: object) -> CliResult:
    """Run calctl in-process with stdout and stderr captured here: the ``cli`` fixture's run for a module- or
    session-scoped fixture, which cannot use capsys."""
    import contextlib
    import io

    from calctl.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """Run calctl in-process: ``cli("verify", pkg)`` -> CliResult."""
    from calctl.cli.app import main

    def run(*args: object) -> CliResult:
        capsys.readouterr()
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture
def test_key() -> Path:
    return TEST_KEY


@pytest.fixture
def test_pub() -> Path:
    return TEST_PUB


class CopyFixture(Protocol):
    """The ``copy_fixture`` fixture's type: copy a fixture package into tmp_path, return the copy."""

    def __call__(self, kind: str = "combined") -> Path: ...


@pytest.fixture
def copy_fixture(tmp_path: Path) -> CopyFixture:
    """Copy a fixture package (single|combined|replica) into tmp_path and return its path."""

    def copy(kind: str = "combined") -> Path:
        dst = tmp_path / f"pkg-{kind}"
        shutil.copytree(FIXTURE_PACKAGES / kind, dst)
        return dst

    return copy


def assert_no_traceback(result: CliResult) -> None:
    text = result.out + result.err
    assert "Traceback" not in text, text
    assert "internal error" not in text, text


def assert_passed(doc: dict) -> None:
    """A runner's JSON report passed: PASS, or WARN whose only warnings are the test-only signing key (SIG002).

    Packages signed with the published test key always warn (docs/cli.md "Verdicts"); any other warning fails.
    """
    assert doc["verdict"] in ("PASS", "WARN"), doc["verdict"]
    if doc["verdict"] == "WARN":
        others = [w for w in doc["warnings"] if "SIG002" not in w]
        assert doc["warnings"] and not others, doc["warnings"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files with a test marked ``slow`` run first, the rest after them, each group in collection order.

    pytest-xdist (``--dist loadfile --no-loadscope-reorder`` in pyproject.toml) hands the files to its workers in
    this order, one at a time as a worker frees up: the long files start while the many short ones are still
    queued to even out the end of the run, and no long file is left to start last with the other worker idle
    (xdist's own order, by number of tests, put files of a few long tests at the end).
    """
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: collection order within each group
