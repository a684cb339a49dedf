"""One process per board (001 §2.1, §3): a second opener of the same calrt board is refused, naming the holder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from calctl.errors import ExitCode
from calctl.runtime import board_lock, open_runtime
from calctl.runtime.board_lock import BoardLocked

HOLDER = textwrap.dedent("""\
    import sys
    from calctl.runtime import board_lock
    lock = board_lock.acquire()
    print("held", flush=True)
    sys.stdin.read()  # hold until the test closes our stdin
    lock.release()
    """)


@pytest.fixture
def holder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
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


def test_a_second_process_is_refused_with_the_holders_pid_and_command(holder) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BoardLocked) as err:
        open_runtime("calrt", "/nonexistent/libcalrt.so")  # the lock is taken before the library is loaded
    msg = str(err.value)
    assert f"pid {holder.pid}" in msg and "serve-holder-marker" in msg and "'board-7'" in msg, msg
    assert err.value.exit_code == ExitCode.DEVICE


def test_another_board_and_a_released_lock_are_free(holder, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CALRT_DEVICE", "board-8")
    board_lock.acquire().release()
    monkeypatch.setenv("CALRT_DEVICE", "board-7")
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
