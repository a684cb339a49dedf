"""Shared fixtures: the test-only key, fixture packages, and an in-process CLI runner."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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
# The lock of `exclusive` tests lives in the controller's scratch; its workers inherit the variable.
XDIST_LOCK = "CALCTL_TESTS_XDIST_LOCK"
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ[XDIST_LOCK] = str(SCRATCH / "xdist.lock")
else:
    # A pytest-xdist worker inherits the controller's environment, its cache directory included: each worker
    # process has a cache of its own, like any other session.
    os.environ["CALCTL_CACHE_DIR"] = str(SCRATCH / "cache")
# The calrt board lock (calctl.runtime.board_lock) lives in the session's scratch: concurrent test runs on
# one machine never collide on the shared /tmp lock of the "default" board.
os.environ["CALCTL_LOCK_DIR"] = str(SCRATCH / "locks")
os.environ.pop("CALCTL_TRUSTED_KEYS", None)
os.environ.pop("CALCTL_DEBUG", None)
set_hypothesis_home_dir(SCRATCH / "hypothesis")
# No example database: a failure is reported with its minimal example and seed, not replayed from disk.
settings.register_profile("calctl", database=None)
settings.load_profile("calctl")


@pytest.fixture(autouse=True)
def _exclusive_under_xdist(request: pytest.FixtureRequest) -> Iterator[None]:
    """The suite runs on two pytest-xdist workers (pyproject addopts). A test marked ``exclusive`` judges
    wall-clock figures (S2 overlap, P99 gates, the F grade) and must not share the CPU with the other
    worker's test: it holds an exclusive lock that every other test holds shared, so it runs alone."""
    with xdist_lock(exclusive=request.node.get_closest_marker("exclusive") is not None):
        yield


@contextlib.contextmanager
def xdist_lock(*, exclusive: bool) -> Iterator[None]:
    """The lock of ``exclusive`` tests, for a module fixture that itself measures elapsed time (it runs before
    the function-scoped autouse fixture takes the lock). Held by a test that is already exclusive, it is the
    same process's second open file description: take it only from fixtures, never inside an exclusive test."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    with open(os.environ[XDIST_LOCK], "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def json(self):  # type: ignore[no-untyped-def]
        import json

        return json.loads(self.out)


@pytest.fixture
def cli(capsys):  # type: ignore[no-untyped-def]
    """Run calctl in-process: ``cli("verify", str(pkg))`` -> CliResult."""
    from calctl.cli.app import main

    def run(*args: str) -> CliResult:
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


@pytest.fixture
def copy_fixture(tmp_path: Path):  # type: ignore[no-untyped-def]
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


def assert_passed(doc: dict) -> None:  # type: ignore[type-arg]
    """A runner's JSON report passed: PASS, or WARN whose only warnings are the test-only signing key (SIG002).

    Packages signed with the published test key always warn (docs/cli.md "Verdicts"); any other warning fails.
    """
    assert doc["verdict"] in ("PASS", "WARN"), doc["verdict"]
    if doc["verdict"] == "WARN":
        others = [w for w in doc["warnings"] if "SIG002" not in w]
        assert doc["warnings"] and not others, doc["warnings"]
