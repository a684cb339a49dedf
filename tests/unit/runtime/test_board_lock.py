"""One process per board (001 §2.1, §3): a second opener of the same calrt board is refused, naming the holder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from calctl.errors import ExitCode
from calctl.runtime import board_lock, open_runtime
from calctl.runtime.board_lock import BoardLocked
from tests.conftest import Cli

HOLDER = textwrap.dedent("""\
    import sys
    from calctl.runtime import board_lock
    lock = board_lock.acquire()
    print("held", flush=True)
    sys.stdin.read()  # hold until the test closes our stdin
    lock.release()
    """)


@pytest.fixture
def holder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[subprocess.Popen[str]]:
    monkeypatch.setenv("CALCTL_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("CALRT_DEVICE", "board-7")
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "serve-holder-marker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    yield p
    assert p.stdin is not None
    p.stdin.close()
    p.wait(timeout=30)


def test_a_second_process_is_refused_with_the_holders_pid_and_command(holder: subprocess.Popen[str]) -> None:
    with pytest.raises(BoardLocked) as err:
        open_runtime("calrt", "/nonexistent/libcalrt.so")  # the lock is taken before the library is loaded
    msg = str(err.value)
    assert f"pid {holder.pid}" in msg and "serve-holder-marker" in msg and "'board-7'" in msg, msg
    assert err.value.exit_code == ExitCode.DEVICE


def test_another_board_and_a_released_lock_are_free(
    holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALRT_DEVICE", "board-8")
    board_lock.acquire().release()
    monkeypatch.setenv("CALRT_DEVICE", "board-7")
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait(timeout=30)
    lock = board_lock.acquire()  # the holder is gone: the kernel dropped its flock
    assert lock.held
    lock.release()


def test_the_lock_file_is_never_followed_through_a_symlink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "locks"
    d.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (d / "calrt-evil.lock").symlink_to(victim)
    monkeypatch.setenv("CALCTL_LOCK_DIR", str(d))
    with pytest.raises(BoardLocked, match="cannot open the lock file"):
        board_lock.acquire("evil")
    assert victim.read_text() == "keep"


def test_a_dropped_lock_lets_go_of_the_board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    monkeypatch.setenv("CALCTL_LOCK_DIR", str(tmp_path))
    lock = board_lock.acquire("b")
    with pytest.raises(BoardLocked, match=f"pid {os.getpid()}"):
        board_lock.acquire("b")
    del lock
    gc.collect()
    board_lock.acquire("b").release()


@pytest.mark.parametrize(
    ("held", "second"),
    [
        ("0000:0a:00.0", "0000:0A:00.0"),  # PCI hex is case-insensitive
        ("0000:01:00.0", "01:00.0"),  # the short form names domain 0000
        ("0000:01:00.0", " 0000:01:00.0 "),
    ],
)
def test_two_spellings_of_one_pci_address_are_one_board(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: str, second: str
) -> None:
    """Hostile test of issue 19: the lock was keyed on the CALRT_DEVICE string, so `0000:0A:00.0` and
    `0000:0a:00.0` (the same board to the shim) took two locks and both processes configured the board."""
    monkeypatch.setenv("CALCTL_LOCK_DIR", str(tmp_path / "locks"))
    lock = board_lock.acquire(held)
    try:
        with pytest.raises(BoardLocked):
            board_lock.acquire(second)
    finally:
        lock.release()


def test_a_device_path_and_a_symlink_to_it_are_one_board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALCTL_LOCK_DIR", str(tmp_path / "locks"))
    dev = tmp_path / "calrt0"
    dev.write_text("")
    (tmp_path / "board").symlink_to(dev)
    lock = board_lock.acquire(str(dev))
    try:
        for other in (str(tmp_path / "board"), str(tmp_path / "." / "calrt0")):
            with pytest.raises(BoardLocked):
                board_lock.acquire(other)
    finally:
        lock.release()


# -- the lock follows the board the shim reports (calrt_ext_device_identity) ------------------------------

NATIVE_HOLDER = textwrap.dedent("""\
    import sys
    from calctl.runtime import open_runtime
    rt = open_runtime("calrt", calrt_lib=sys.argv[1])
    print("held", flush=True)
    sys.stdin.read()
    rt.close()
    """)


def _hold(library: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", NATIVE_HOLDER, str(library), "board-holder-marker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def _let_go(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None
    p.stdin.close()
    p.wait(timeout=30)


def test_two_run_golden_on_the_reference_board_at_once_both_pass(tmp_path: Path, calrt_reference: Path) -> None:
    """Issue 28: every process that loaded the reference board locked `calrt-default.lock`, so two CI jobs on
    one host collided (exit 3). A software model gets a lock of its own process: a third process holds the
    reference board the whole time, and two run-golden runs started together both pass."""
    env = {**os.environ, "CALCTL_LOCK_DIR": str(tmp_path / "locks")}
    env.pop("CALRT_DEVICE", None)
    holder = _hold(calrt_reference, env)
    try:
        cmd = [sys.executable, "-m", "calctl", "run-golden", "--device", "calrt", "--calrt-lib", str(calrt_reference)]
        runs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in "ab"]
        outs = [r.communicate(timeout=300) for r in runs]
    finally:
        _let_go(holder)
    for r, (out, err) in zip(runs, outs, strict=True):
        assert r.returncode == 0, out[-2000:] + err[-2000:]
        assert "verdict" in out and "Traceback" not in err
    assert not (tmp_path / "locks").exists() or not any((tmp_path / "locks").iterdir())  # no lock file at all


def test_a_second_serve_on_the_pci_address_a_process_holds_is_refused(tmp_path: Path, calrt_stub: Path) -> None:
    """A shim reporting a PCI address (the stub with CALRT_STUB_PCI) is locked on it. The holder opened the
    shim's default board (no CALRT_DEVICE); a second `calctl serve` names the same board by its address
    (CALRT_DEVICE) and is refused, exit 3, naming the holder. (Keyed on CALRT_DEVICE alone, `default` and
    `0000:01:00.0` were two locks and both processes opened the board.)"""
    env = {**os.environ, "CALCTL_LOCK_DIR": str(tmp_path / "locks"), "CALRT_STUB_PCI": "0000:01:00.0"}
    env.pop("CALRT_DEVICE", None)
    holder = _hold(calrt_stub, env)
    try:
        cmd = [sys.executable, "-m", "calctl", "serve", "--device", "calrt", "--calrt-lib", str(calrt_stub)]
        second = subprocess.run(
            [*cmd, "--host", "127.0.0.1", "--port", "0"],
            capture_output=True,
            text=True,
            env={**env, "CALRT_STUB_PCI": "01:00.0", "CALRT_DEVICE": "0000:01:00.0"},
            timeout=120,
        )
    finally:
        _let_go(holder)
    assert second.returncode == ExitCode.DEVICE, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"pid {holder.pid}" in second.stderr and "board-holder-marker" in second.stderr, second.stderr
    assert "'0000:01:00.0'" in second.stderr and "Traceback" not in second.stderr
    assert "status 11 11" not in second.stderr
    # Another board at another address is free.
    other = _hold(calrt_stub, {**env, "CALRT_STUB_PCI": "0000:02:00.0"})
    _let_go(other)


def test_conformance_on_a_board_another_process_holds_is_one_precondition_failure(
    cli: Cli,
    tmp_path: Path,
    calrt_stub: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 28: conformance beside another process on the board gave 4-5 check FAILs ("unexpected BoardLocked
    ... (status 11 11)"). Now: no check runs, one error names the holder, the status code once, exit 3."""
    monkeypatch.setenv("CALCTL_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("CALRT_STUB_PCI", "0000:03:00.0")
    monkeypatch.delenv("CALRT_DEVICE", raising=False)
    holder = _hold(calrt_stub, dict(os.environ))
    try:
        r = cli("device", "conformance", "--calrt-lib", calrt_stub, "--format", "json")
    finally:
        _let_go(holder)
    assert r.code == ExitCode.DEVICE, r.out[-1000:] + r.err[-1000:]
    assert f"pid {holder.pid}" in r.err and "board-holder-marker" in r.err and "11 11" not in r.err
    assert "FAIL" not in r.out
