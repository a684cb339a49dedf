"""One process per board (001 §2.1, §3): an exclusive ``flock`` on a lock file per board.

CalRT 0.7.6 opens one physical device per process, and nothing in the shim stops a
second process from opening and configuring the same board under the first one.
``open_runtime("calrt")`` therefore takes an exclusive, non-blocking lock on
``<lock dir>/calrt-<board>.lock`` before it loads the library, and holds it until
the runtime is closed (the kernel drops it when the process dies, so a crashed
holder never leaves a stale lock). ``<board>`` is the ``CALRT_DEVICE`` value the
shim is given (``default`` when unset; a PCI address or device path in one
canonical spelling, :func:`canonical_board`), not the readable
``CALCTL_BOARD_ID`` label: two labels for one device must still collide.

The key is the board the shim reports when it exports ``calrt_ext_device_identity``
(docs/calrt-c-abi.md §10-11): a PCI address or serial, so every spelling of one
board collides. A software model (the reference board) has no board to share:
:func:`process_local` gives it a lock of its own process, and parallel processes
never collide.

The lock dir is ``$CALCTL_LOCK_DIR``, else ``$XDG_RUNTIME_DIR/calctl``, else
``/tmp/calctl-locks``. A second opener gets :class:`BoardLocked` (exit 3) naming
the holder's pid and command line, which the holder writes into the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sys
import weakref
from pathlib import Path

from calctl.runtime.errors import DeviceInUse
from calctl.runtime.selection import CALRT_DEVICE_ENV

LOCK_DIR_ENV = "CALCTL_LOCK_DIR"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_PCI = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


class BoardLocked(DeviceInUse):
    """Another process holds this board."""


def lock_dir() -> Path:
    if os.environ.get(LOCK_DIR_ENV):
        return Path(os.environ[LOCK_DIR_ENV])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "calctl"
    return Path("/tmp/calctl-locks")


def board_key() -> str:
    """The physical board this process asks the shim for."""
    return canonical_board(os.environ.get(CALRT_DEVICE_ENV, ""))


def canonical_board(name: str) -> str:
    """One key per board for spellings the shim treats alike: a PCI address in lower case with its domain
    (``01:00.0`` and ``0000:01:00.0`` are one device), a device path with its symlinks and ``.`` resolved.
    Anything else is taken as written. (A board named once by address and once left to the shim's default
    cannot be matched: nothing reports which board the default is, docs/calrt-c-abi.md.)"""
    name = name.strip()
    if not name:
        return "default"
    pci = _PCI.match(name)
    if pci:
        domain, bus, dev, fn = pci.groups()
        return f"{(domain or '0000').lower()}:{bus.lower()}:{dev.lower()}.{fn}"
    if name.startswith("/"):
        return os.path.realpath(name)
    return name


class BoardLock:
    """An exclusive lock on one board, held from :func:`acquire` until :meth:`release` (or process exit).

    ``path`` is None for a :func:`process_local` lock (a software model: nothing outside the process to lock)."""

    def __init__(self, path: Path | None, fd: int | None, board: str) -> None:
        self.path = path
        self.board = board
        self._fd: int | None = fd
        self._held = True
        # A runtime dropped without close() still lets go of its board when it is collected.
        self._finalizer = weakref.finalize(self, _close, fd) if fd is not None else None

    def release(self) -> None:
        self._fd = None
        self._held = False
        if self._finalizer is not None:
            self._finalizer()  # once: clears the holder line and closes the descriptor, which drops the flock

    @property
    def held(self) -> bool:
        return self._held


def process_local() -> BoardLock:
    """The lock of a software model: an identity of this process alone (one device per process, 001 §2.1),
    with no lock file, so software boards in parallel processes never collide."""
    return BoardLock(None, None, f"software-model-pid{os.getpid()}")


def acquire(board: str | None = None) -> BoardLock:
    """Lock ``board`` (default: :func:`board_key`) for this process, or raise :class:`BoardLocked`."""
    board = canonical_board(board) if board else board_key()
    directory = lock_dir()
    path = directory / f"calrt-{_UNSAFE.sub('_', board)[:96]}.lock"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise BoardLocked(
            f"board {board!r}: cannot open the lock file {path}: {exc.strerror or exc}",
            hint=f"set {LOCK_DIR_ENV} to a writable directory",
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _read_holder(fd)
        os.close(fd)
        raise BoardLocked(
            f"board {board!r} is already opened by another process ({holder}); lock file {path}",
            hint="one process per board (001 §2.1): stop that process, or select another board with "
            f"{CALRT_DEVICE_ENV}",
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}: {' '.join(sys.argv)[:400]}\n".encode(errors="replace"))
    return BoardLock(path, fd, board)


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    with contextlib.suppress(OSError):
        os.close(fd)


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 512, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown: the lock file names no pid"


__all__ = [
    "LOCK_DIR_ENV",
    "BoardLock",
    "BoardLocked",
    "acquire",
    "board_key",
    "canonical_board",
    "lock_dir",
    "process_local",
]
