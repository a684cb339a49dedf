"""Shared fixtures: the test-only key, fixture packages, and an in-process CLI runner."""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

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
# Tables honour COLUMNS (calctl.cli._output); pytest-xdist workers get COLUMNS=80 from execnet, so every
# in-process run would lay out at another width than a plain run: tests pin their own width where it matters.
os.environ.pop("COLUMNS", None)
set_hypothesis_home_dir(SCRATCH / "hypothesis")
# No example database: a failure is reported with its minimal example and seed, not replayed from disk.
settings.register_profile("calctl", database=None)
settings.load_profile("calctl")


EXCLUSIVE_UNIT = "(exclusive tests)"


class _WorkerLock:
    """The ``flock`` this worker process holds on the session's lock file: none, shared or exclusive.

    Every test holds it shared, from before its fixtures are set up to after they are torn down; a test marked
    ``exclusive`` holds it exclusive, so it never shares the CPU with the other worker's test. Consecutive
    exclusive tests keep the exclusive hold from one to the next: the other worker cannot start a test in
    between, which this one would then have to wait out."""

    def __init__(self) -> None:
        self._file: IO[str] | None = None
        self.mode: int | None = None  # fcntl.LOCK_SH, fcntl.LOCK_EX or None

    def hold(self, mode: int | None) -> None:
        if mode == self.mode:
            return
        if mode is None:
            assert self._file is not None
            self._file.close()  # releases the lock
            self._file, self.mode = None, None
            return
        if self._file is None:
            self._file = open(os.environ[XDIST_LOCK], "a")  # noqa: SIM115 - closed by hold(None)
        fcntl.flock(self._file, mode)  # a conversion (shared <-> exclusive) when one is already held
        self.mode = mode


_LOCK = _WorkerLock()


def _under_xdist() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


def _is_exclusive(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("exclusive") is not None


def _exclusive_ids_file(worker: str) -> Path:
    return Path(os.environ[XDIST_LOCK]).with_name(f"exclusive-{worker}.txt")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """A worker tells the controller's scheduler (below) which tests are exclusive: the controller collects
    nothing itself, and a node id is all it sees of a test. Written before xdist reports the collection."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is not None:
        ids = [item.nodeid for item in session.items if _is_exclusive(item)]
        _exclusive_ids_file(worker).write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: `-p no:xdist` runs without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (a file runs on one worker: its module fixtures start one server, not two), with one
    change: the exclusive tests of every file are one more unit, handed out first. One worker runs them back
    to back under one exclusive hold, instead of waiting out the other worker's current test before each."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ExclusiveFirstScheduling(LoadFileScheduling):
        exclusive: frozenset[str] | None = None

        def schedule(self) -> None:
            if self.exclusive is None and self.collection_is_completed:
                found = sorted(Path(os.environ[XDIST_LOCK]).parent.glob("exclusive-*.txt"))
                self.exclusive = frozenset(found[0].read_text(encoding="utf-8").splitlines()) if found else frozenset()
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return EXCLUSIVE_UNIT if self.exclusive and nodeid in self.exclusive else super()._split_scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if EXCLUSIVE_UNIT in self.workqueue:
                self.workqueue.move_to_end(EXCLUSIVE_UNIT, last=False)
            super()._assign_work_unit(node)

    return ExclusiveFirstScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under xdist, take the lock before the test's fixtures (a module fixture's work is a test's work)."""
    if _under_xdist():
        _LOCK.hold(fcntl.LOCK_EX if _is_exclusive(item) else fcntl.LOCK_SH)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    if _under_xdist() and not (_is_exclusive(item) and _is_exclusive(nextitem)):
        _LOCK.hold(None)


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
