"""Build the reference board (``reference/calrt_reference.c``) with the system C compiler.

``calctl device build-reference`` and the test suite both call
:func:`build_reference`, so what CI tests is what a user builds. The C source
ships inside the package (a wheel install has it too); nothing prebuilt is
shipped or committed. The library goes to a directory outside the checkout:
``--out DIR``, else ``<calctl cache>/calrt-reference/<source digest>/``
(``$CALCTL_CACHE_DIR``, else ``$XDG_CACHE_HOME/calctl``, else
``~/.cache/calctl``), keyed by the sha256 of the sources and the compile
command, so an edited source is rebuilt and an unchanged one is reused.
``defines`` adds ``-D`` switches (the test suite builds the reference board's
``CALRT_MUTANT_*`` broken copies that way; they are part of the digest).
Concurrent builds race safely: each compiles to its own temporary file and one
atomic rename wins.

The compiler is ``$CC`` if set, else ``cc``, else ``gcc``. A missing compiler
or a failed compile is a :class:`UsageError` (exit 2: the environment), with
the command and the compiler's own message. This module builds; it never loads
the library (``lib.load_library`` does).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from calctl.cache import cache_dir
from calctl.errors import UsageError
from calctl.records import atomic_output, write_atomic

SOURCE_DIR = Path(__file__).resolve().parent / "reference"
SOURCES = ("calrt_reference.c", "calrt.h", "calrt_ext.h")
LIBRARY_NAME = "libcalrt_reference.so"
FLAGS = ("-std=c11", "-O2", "-fPIC", "-shared", "-pthread", "-Wall", "-Wextra", "-Werror")


@dataclass(frozen=True)
class BuildResult:
    library: Path
    digest: str  # sha256 over the sources and the compile flags
    command: tuple[str, ...]  # the compile command that produced it (or would have)
    reused: bool  # True: an identical earlier build was found and kept


def source_digest(defines: Sequence[str] = ()) -> str:
    """sha256 over every source file and the compile flags: the key of a build."""
    h = hashlib.sha256()
    for name in SOURCES:
        data = (SOURCE_DIR / name).read_bytes()
        h.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    h.update(" ".join((*FLAGS, *defines)).encode())
    return h.hexdigest()


def find_compiler() -> str:
    """``$CC``, else ``cc``, else ``gcc``; UsageError naming what was looked for when none is found."""
    env = os.environ.get("CC", "").strip()
    if env:
        first = shlex.split(env)[0]
        if shutil.which(first) is None:
            raise UsageError(f"CC={env!r}: {first} is not an executable on PATH")
        return env
    for name in ("cc", "gcc"):
        if shutil.which(name):
            return name
    raise UsageError(
        "no C compiler: neither $CC nor cc nor gcc is on PATH",
        hint="install one (e.g. apt-get install gcc) to build the reference board",
    )


def default_out_dir(digest: str) -> Path:
    return cache_dir() / "calrt-reference" / digest[:16]


def build_reference(out_dir: Path | None = None, *, force: bool = False, defines: Sequence[str] = ()) -> BuildResult:
    """Compile the reference board into ``out_dir`` (default: the cache, keyed by digest); its path.

    ``defines``: extra ``-DNAME[=VALUE]`` switches (the ``CALRT_MUTANT_*`` broken copies)."""
    bad = [d for d in defines if not d.startswith("-D") or len(d) < 3 or any(c.isspace() for c in d)]
    if bad:
        raise UsageError(f"reference board define {bad[0]!r}: expected -DNAME or -DNAME=VALUE")
    missing = [n for n in SOURCES if not (SOURCE_DIR / n).is_file()]
    if missing:
        raise UsageError(
            f"reference board source {SOURCE_DIR / missing[0]} is missing: the calctl install is incomplete"
        )
    digest = source_digest(defines)
    target_dir = Path(out_dir) if out_dir is not None else default_out_dir(digest)
    library = target_dir / LIBRARY_NAME
    stamp = target_dir / (LIBRARY_NAME + ".sha256")
    cc = find_compiler()
    command = (
        *shlex.split(cc),
        *FLAGS,
        *defines,
        "-I",
        str(SOURCE_DIR),
        "-o",
        str(library),
        str(SOURCE_DIR / "calrt_reference.c"),
        "-lm",
    )
    if not force and library.is_file() and _read(stamp) == digest:
        return BuildResult(library, digest, command, reused=True)
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {target_dir}: cannot create the directory: {exc.strerror or exc}") from None
    if not target_dir.is_dir():
        raise UsageError(f"--out {target_dir}: not a directory")
    with atomic_output(library, mode=0o755) as tmp:  # the compiler writes the temporary file; one rename publishes it
        run = [*command[: command.index("-o") + 1], str(tmp), *command[command.index("-o") + 2 :]]
        try:
            proc = subprocess.run(run, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UsageError(f"compiling the reference board failed: {' '.join(run)}: {exc}") from None
        if proc.returncode != 0:
            raise UsageError(
                f"compiling the reference board failed (exit {proc.returncode}): {' '.join(run)}\n{proc.stderr.strip()}"
            )
    write_atomic(stamp, digest + "\n")
    return BuildResult(library, digest, command, reused=False)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None
