"""The names of the seal files a package carries, and the one safe way to read a small file.

:func:`read_regular` is how calctl opens any file whose type it does not control
(seal files, manifests, JSON side documents, trust-store keys): the path is
``lstat``-ed and opened with ``O_NOFOLLOW | O_NONBLOCK``, and its type is
checked on the open descriptor, so a FIFO, a device or a symlink is refused
instead of hanging the command or reading something else, and the read stops
one byte past ``limit``. This module holds no policy about what a file means.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from calctl.filekind import kind_phrase

CHECKSUMS = "checksums.sha256"
SIGNATURE = "checksums.sha256.sig"
#: Files whose digest is not in checksums.sha256 (the seal itself).
SEAL_FILES = frozenset({CHECKSUMS, SIGNATURE})


class NotReadable(OSError):
    """A file could not be read safely. ``reason`` is a phrase that completes "<path> ...": "is a FIFO"."""

    def __init__(self, reason: str, *, missing: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.missing = missing


def read_regular(path: Path | str, limit: int, *, head: bool = False) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``); raises :class:`NotReadable` otherwise.

    Never follows a final symlink, never blocks on a FIFO, never opens a device
    for reading, never reads more than ``limit + 1`` bytes. With ``head=True``
    a larger file is not an error: its first ``limit`` bytes are returned.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise NotReadable("is missing", missing=True) from None
    except OSError as exc:
        raise NotReadable(f"cannot be inspected: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise NotReadable(f"is {kind_phrase(st.st_mode)}, not a regular file")
    if st.st_size > limit and not head:
        raise NotReadable(f"is {st.st_size} bytes, over the {limit} byte limit for this file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise NotReadable("is missing", missing=True) from None
    except OSError as exc:
        raise NotReadable(f"cannot be opened: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between lstat and open
            raise NotReadable(f"is {kind_phrase(st.st_mode)}, not a regular file")
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        chunks: list[bytes] = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, min(limit + 1 - got, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except NotReadable:
        raise
    except OSError as exc:
        raise NotReadable(f"cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if head:
        return data[:limit]
    if len(data) > limit:
        raise NotReadable(f"grew over the {limit} byte limit while being read")
    return data


__all__ = ["CHECKSUMS", "SEAL_FILES", "SIGNATURE", "NotReadable", "read_regular"]
