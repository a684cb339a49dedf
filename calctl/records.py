"""Machine-readable records: the one JSON form of every document calctl writes.

``dumps`` is used by the CLI's ``--format json``, by report files and by the
soak's evidence log alike, so a figure is rendered the same way everywhere.
:func:`write_json` / :func:`write_atomic` / :func:`atomic_output` are the one
way calctl writes a file a reader may look at while it is written.
Nothing here prints or knows about terminals (that is ``calctl.cli._output``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import math
import os
import stat
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from calctl.errors import UsageError
from calctl.filekind import kind_phrase

#: Version of every JSON document calctl prints. Bump on an incompatible change.
SCHEMA_VERSION = "1"


def to_jsonable(obj: Any) -> Any:
    """Convert dataclasses, enums, paths and numpy scalars into plain JSON values.

    Non-finite floats become ``null``: a figure that cannot be measured is absent,
    never a fake number.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj) if isinstance(obj, (set, frozenset)) else obj
        return [to_jsonable(v) for v in items]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        return to_jsonable(obj.item())
    return obj


def dumps(document: dict[str, Any], *, versioned: bool = True, indent: int | None = 2) -> str:
    """The one JSON form: ``schema_version`` first (``versioned``), typed values made plain, no NaN.

    ``versioned=False`` for a format that is not calctl's own (a Chrome trace); ``indent=None`` gives
    one compact line (an NDJSON record, :func:`dumps_line`).
    """
    body = {"schema_version": SCHEMA_VERSION, **to_jsonable(document)} if versioned else to_jsonable(document)
    separators = (",", ":") if indent is None else None
    return json.dumps(body, indent=indent, separators=separators, sort_keys=False, allow_nan=False)


def dumps_line(record: dict[str, Any]) -> str:
    """One NDJSON line (no ``schema_version``: the file's first record or its documentation says it)."""
    return dumps(record, versioned=False, indent=None) + "\n"


def output_problem(path: Path | str) -> str | None:
    """Why calctl may not write a file at ``path`` (it exists and is not a regular file), or None.

    An output replaces a regular file only: renaming over a FIFO, a device (``--report /dev/null`` as root would
    leave a JSON file in ``/dev``), a symlink or a directory would destroy what is there."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be inspected: {exc.strerror or exc}"
    if stat.S_ISREG(mode):
        return None
    return (
        f"is {kind_phrase(mode)}, not a regular file; calctl writes regular files only and never replaces anything else"
    )


def check_output(path: Path | str, option: str | None = None) -> None:
    """A usage error (exit 2) naming ``option`` and ``path`` unless an output may be written at ``path``."""
    problem = output_problem(path)
    if problem is not None:
        raise UsageError(f"{option + ' ' if option else ''}{path}: {problem}")


@contextlib.contextmanager
def atomic_output(path: Path, *, mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the body returns, it becomes ``path`` in one rename.

    The one atomic writer of calctl (reports, checksums, signatures, tars, PNGs,
    traces): a reader, or a crash, never sees a half-written file under ``path``.
    The temporary name keeps the suffix (matplotlib picks the format from it) and
    is unique per process and thread. The data is fsync'ed before the rename and
    the directory after it; on any exception the temporary file is removed and
    ``path`` is left as it was. ``path`` must be a regular file or absent (:func:`output_problem`): a FIFO, a
    device, a symlink or a directory there is a usage error, never replaced.
    """
    path = Path(path)
    check_output(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}-{threading.get_ident()}{path.suffix}")
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"{tmp}: the writer produced no file")
        os.chmod(tmp, mode)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        check_output(path)  # nothing put a FIFO or a device there while the body ran
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    with contextlib.suppress(OSError):  # not every file system lets a directory be fsync'ed
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def write_atomic(path: Path, data: bytes | str, *, mode: int = 0o644) -> None:
    """Write ``data`` (text is UTF-8) to ``path`` atomically (:func:`atomic_output`)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_output(path, mode=mode) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)


#: Where soak, bench and bringup write their evidence when ``--report`` is not given (docs/cli.md).
REPORT_DIR_ENV = "CALCTL_REPORT_DIR"
DEFAULT_REPORT_BASE = "calctl-reports"


def default_report_dir(command: str, now: datetime | None = None) -> Path:
    """``$CALCTL_REPORT_DIR/<command>-<YYYYmmdd-HHMMSS>``, by default under ``./calctl-reports`` (one directory to
    ignore in version control, instead of one per run in the current directory)."""
    base = Path(os.environ.get(REPORT_DIR_ENV) or DEFAULT_REPORT_BASE)
    return base / f"{command}-{(now or datetime.now()).strftime('%Y%m%d-%H%M%S')}"


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write one JSON document (:func:`dumps`, newline-terminated) to ``path`` atomically."""
    write_atomic(path, dumps(document) + "\n")


__all__ = [
    "DEFAULT_REPORT_BASE",
    "REPORT_DIR_ENV",
    "SCHEMA_VERSION",
    "atomic_output",
    "default_report_dir",
    "dumps",
    "dumps_line",
    "to_jsonable",
    "write_atomic",
    "write_json",
]
