"""What kind of thing a path is: the name of an ``st_mode``, and why a path cannot be a directory.

It sits in the lowest layer so that the safe file reader (``calctl.signing.files``), the output writer
(``calctl.records``), the cache directory and the CLI's report directory name file kinds in the same words.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

#: The kinds of thing an ``st_mode`` can be: the stat test that recognises each, and its name.
_KINDS: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISREG, "regular file"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
)


def kind_name(mode: int) -> str:
    """ "regular file", "directory", "FIFO", ... for an ``st_mode``; "special file" for anything else."""
    return next((name for test, name in _KINDS if test(mode)), "special file")


def kind_phrase(mode: int) -> str:
    """ "a regular file", "a directory", "a FIFO", ... for an ``st_mode`` (every kind's article is "a")."""
    return f"a {kind_name(mode)}"


def directory_problem(path: Path) -> str | None:
    """Why ``path`` cannot be, or be made, a directory, or None: it or the nearest ancestor that exists is not a
    directory (a symlink to one is fine), or cannot be inspected (a symlink loop). Creates nothing."""
    probe = path
    while True:
        try:
            mode = os.stat(probe).st_mode
        except (FileNotFoundError, NotADirectoryError):
            if probe.parent == probe:
                return None
            probe = probe.parent
            continue
        except OSError as exc:
            return f"cannot be inspected ({exc.strerror or exc})"
        if stat.S_ISDIR(mode):
            return None
        where = "is" if probe == path else f"{probe}, in its path, is"
        return f"{where} {kind_phrase(mode)}, not a directory"


def report_directory_problem(path: Path, *, depth: int = 3, limit: int = 10_000) -> str | None:
    """Why calctl may not write a report into the existing directory ``path``, or None: an entry in it (down to
    ``depth`` levels, the first ``limit`` entries) that is neither a regular file nor a directory. A FIFO, a
    device, a socket or a symlink where a report file goes would stop the run at its very end, after all its
    work, with nothing written; it is found before the run starts instead."""
    seen = 0
    todo = [(path, 0)]
    while todo:
        where, level = todo.pop()
        try:
            entries = list(os.scandir(where))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            return f"{where} cannot be listed ({exc.strerror or exc})"
        for entry in entries:
            seen += 1
            if seen > limit:
                return None
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError as exc:
                return f"holds {entry.path}, which cannot be inspected ({exc.strerror or exc})"
            if stat.S_ISDIR(mode):
                if level + 1 < depth:
                    todo.append((Path(entry.path), level + 1))
            elif not stat.S_ISREG(mode):
                return (
                    f"holds {entry.path}, which is {kind_phrase(mode)}, not a regular file; calctl writes regular "
                    "files only into a report directory and never replaces anything else"
                )
    return None
