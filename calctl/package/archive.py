"""Deterministic package tarballs and safe extraction.

Packing is deterministic (sorted members, owner 0/0, fixed mtime, normalised
modes) so that the same directory always gives the same bytes. Extraction refuses
absolute members, ``..``, links, devices, sparse files, clashing members, names
over the file-system limits and oversized members before writing anything, never
writes outside the target directory, and bounds the bytes it really writes and
the time it really spends (:data:`MAX_EXPANSION`, :data:`MAX_EXTRACT_SECONDS`).
"""

from __future__ import annotations

import lzma
import os
import stat
import tarfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from calctl.errors import PackageFormatError, UsageError
from calctl.records import atomic_output
from calctl.signing.files import kind_phrase

#: Ceilings for extraction (docs/package-format.md "Limits"); a real board package holds two ~8.5 GiB blobs
#: and a few dozen files.
MAX_MEMBER_BYTES = 64 * 1024**3
MAX_TOTAL_BYTES = 256 * 1024**3
MAX_MEMBERS = 10_000
#: Bytes written may exceed the archive's own size by this factor (plus the slack): an uncompressed tar
#: never does, a gzip of weights compresses ~1-2x, a gzip bomb ~1000x.
MAX_EXPANSION = 32
EXPANSION_SLACK_BYTES = 64 * 1024**2
#: Wall-clock ceiling for reading headers and writing members (a 17 GiB package copies in well under this).
MAX_EXTRACT_SECONDS = 900.0
#: Longest member name (Linux PATH_MAX); each component at most 255 bytes (NAME_MAX).
MAX_NAME_BYTES = 4096
FIXED_MTIME = 0


def is_tar(path: Path) -> bool:
    return path.is_file() and tarfile.is_tarfile(path)


def _walk(root: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            out.append(Path(dirpath) / name)
        for name in dirnames:
            p = Path(dirpath) / name
            if p.is_symlink():
                out.append(p)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def check_tar_destination(src: Path, out: Path) -> None:
    """Refuse a tar path inside the package directory: the archive (and its temporary file) would pack itself."""
    src_resolved = src.resolve()
    out_parent = out.parent.resolve()
    if out_parent == src_resolved or src_resolved in out_parent.parents:
        raise UsageError(
            f"{out}: the tar would be written inside the package directory {src} (and packed into itself)",
            hint="give --out a path outside the package",
        )
    if not out_parent.is_dir():
        raise UsageError(f"{out.parent}: directory does not exist")


def write_tar(src: Path, out: Path) -> None:
    """Write ``src`` (a package directory) as a deterministic tar at ``out``.

    Members are ``<dirname>/<relative path>``. Written to a temporary file and
    renamed, so a crash never leaves a half-written archive under ``out``.
    """
    top = src.name
    check_tar_destination(src, out)
    with atomic_output(out) as tmp, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:
        dirs: set[str] = set()
        for path in _walk(src):
            rel = path.relative_to(src).as_posix()
            if path.is_symlink() or not path.is_file():
                raise UsageError(f"{path}: not a regular file; packages contain regular files only")
            parents = PurePosixPath(rel).parents
            for parent in reversed(list(parents)[:-1]):
                d = f"{top}/{parent.as_posix()}"
                if d not in dirs:
                    dirs.add(d)
                    tf.addfile(_dir_info(d))
            if f"{top}" not in dirs:
                dirs.add(top)
            info = tarfile.TarInfo(f"{top}/{rel}")
            st = path.stat()
            info.size = st.st_size
            info.mtime = FIXED_MTIME
            info.mode = 0o755 if st.st_mode & 0o111 else 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(path, "rb") as fh:
                tf.addfile(info, fh)


def _dir_info(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _shown(name: str) -> str:
    return repr(name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))


def _check_member(m: tarfile.TarInfo, source: str) -> PurePosixPath:
    name = m.name
    shown = _shown(name)
    p = PurePosixPath(name)
    if name.startswith("/") or p.is_absolute():
        raise PackageFormatError(f"archive member {shown} is an absolute path", path=source)
    if any(part == ".." for part in p.parts):
        raise PackageFormatError(f"archive member {shown} contains '..'", path=source)
    if "\\" in name or "\x00" in name:
        raise PackageFormatError(f"archive member {shown} has a backslash or NUL in its name", path=source)
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > MAX_NAME_BYTES or any(len(part.encode("utf-8", "surrogateescape")) > 255 for part in p.parts):
        raise PackageFormatError(
            f"archive member {shown[:80]}... has a name over the file-system limits "
            f"({len(encoded)} bytes; at most {MAX_NAME_BYTES}, 255 per component)",
            path=source,
        )
    if m.issym() or m.islnk():
        raise PackageFormatError(
            f"archive member {shown} is a link ({m.linkname!r}); packages hold regular files only", path=source
        )
    if m.isdev() or m.isfifo() or m.ischr() or m.isblk():
        raise PackageFormatError(f"archive member {shown} is a device or FIFO", path=source)
    if m.issparse() or m.sparse is not None or any(k.startswith("GNU.sparse.") for k in m.pax_headers):
        # A sparse member declares far more bytes than it stores (a 10 KB archive can
        # write gigabytes of zeros); calctl's packer never writes one.
        raise PackageFormatError(f"archive member {shown} is a sparse file; packages hold plain files", path=source)
    if not (m.isfile() or m.isdir()):
        raise PackageFormatError(f"archive member {shown} has unsupported type {m.type!r}", path=source)
    if m.size > MAX_MEMBER_BYTES:
        raise PackageFormatError(
            f"archive member {shown} is {m.size} bytes, over the {MAX_MEMBER_BYTES} byte limit", path=source
        )
    return p


@dataclass
class _Budget:
    """Bytes and time extraction may still spend; counted on what is really written and really elapsed."""

    source: str
    bytes_left: int
    deadline: float

    def spend(self, n: int) -> None:
        self.bytes_left -= n
        if self.bytes_left < 0:
            raise PackageFormatError(
                f"archive expands past its limit (at most {MAX_TOTAL_BYTES} bytes in all, and at most "
                f"{MAX_EXPANSION}x the archive's own size + {EXPANSION_SLACK_BYTES} bytes)",
                path=self.source,
            )
        self.tick()

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise PackageFormatError(
                f"extracting the archive took longer than the {MAX_EXTRACT_SECONDS:g} s limit", path=self.source
            )


def _members(tf: tarfile.TarFile, budget: _Budget) -> list[tarfile.TarInfo]:
    """Member headers, stopping at the member limit (never reads the headers of a 100,000-member archive)."""
    members: list[tarfile.TarInfo] = []
    while True:
        m = tf.next()
        if m is None:
            return members
        members.append(m)
        if len(members) > MAX_MEMBERS:
            raise PackageFormatError(f"archive has more than {MAX_MEMBERS} members", path=budget.source)
        budget.tick()


def _check_tree(members: list[tarfile.TarInfo], source: str) -> tuple[set[str], int]:
    """Refuse members that clash (a file twice, a file and a directory of one name, a member below a file)."""
    files: set[str] = set()
    dirs: set[str] = set()
    tops: set[str] = set()
    declared = 0
    for m in members:
        p = _check_member(m, source)
        key = p.as_posix()
        if key == ".":
            continue
        parents = [q.as_posix() for q in p.parents if q.as_posix() != "."]
        for parent in parents:
            if parent in files:
                raise PackageFormatError(
                    f"archive member {_shown(m.name)} lies below {_shown(parent)}, which is a file", path=source
                )
        if m.isdir():
            if key in files:
                raise PackageFormatError(f"archive member {_shown(m.name)} is both a file and a directory", path=source)
            dirs.add(key)
        else:
            if key in files:
                raise PackageFormatError(f"archive member {_shown(m.name)} appears twice", path=source)
            if key in dirs:
                raise PackageFormatError(f"archive member {_shown(m.name)} is both a file and a directory", path=source)
            files.add(key)
            declared += m.size
        dirs.update(parents)
        tops.add(p.parts[0])
    return tops, declared


def extract_package(archive: Path, dest: Path) -> Path:
    """Safely extract ``archive`` into ``dest`` (which must exist and be empty).

    Every member header is checked before anything is written; while writing,
    the bytes really written and the time really spent are bounded (a
    compressed or sparse archive can declare little and expand to a lot).
    Returns the package root: the single top-level directory, or ``dest`` when
    members are flat. Every failure is a :class:`PackageFormatError` naming the
    archive and the member.
    """
    source = str(archive)
    # Only a regular file is opened: tarfile.open() on a FIFO blocks until a writer comes (a hung `serve` or
    # admin load), and a device never ends. O_NONBLOCK so the open itself cannot block either; the fstat then
    # judges what was really opened (a path swapped after the check).
    try:
        fd = os.open(archive, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise PackageFormatError(f"not a readable tar archive: {exc.strerror or exc}", path=source) from None
    fileobj = os.fdopen(fd, "rb")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PackageFormatError(
                f"is {kind_phrase(st.st_mode)}, not a regular file: expected a package directory or a tar archive",
                path=source,
            )
        os.set_blocking(fd, True)
        archive_bytes = st.st_size
        tf = tarfile.open(fileobj=fileobj, mode="r:*")  # noqa: SIM115 - closed by `with tf` below
    except (tarfile.TarError, OSError, EOFError) as exc:
        fileobj.close()
        raise PackageFormatError(f"not a readable tar archive: {exc}", path=source) from None
    except BaseException:
        fileobj.close()
        raise
    with fileobj:
        return _extract_open(tf, archive_bytes, dest, source)


def _extract_open(tf: tarfile.TarFile, archive_bytes: int, dest: Path, source: str) -> Path:
    budget = _Budget(
        source,
        bytes_left=min(MAX_TOTAL_BYTES, MAX_EXPANSION * archive_bytes + EXPANSION_SLACK_BYTES),
        deadline=time.monotonic() + MAX_EXTRACT_SECONDS,
    )
    with tf:
        try:
            members = _members(tf, budget)
        except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
            raise PackageFormatError(f"corrupt tar archive: {exc}", path=source) from None
        tops, declared = _check_tree(members, source)
        if declared > budget.bytes_left:
            raise PackageFormatError(
                f"archive members declare {declared} bytes, over the limit of {budget.bytes_left} bytes "
                f"for this archive ({MAX_EXPANSION}x its size + {EXPANSION_SLACK_BYTES}, at most {MAX_TOTAL_BYTES})",
                path=source,
            )
        dest_resolved = dest.resolve()
        for m in members:
            try:
                _extract_one(tf, m, dest, dest_resolved, budget)
            except PackageFormatError:
                raise
            except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
                raise PackageFormatError(
                    f"archive member {_shown(m.name)} cannot be extracted: {why}", path=source
                ) from None
    if len(tops) == 1:
        only = dest / next(iter(tops))
        if only.is_dir() and not only.is_symlink():
            return only
    return dest


def _extract_one(tf: tarfile.TarFile, m: tarfile.TarInfo, dest: Path, dest_resolved: Path, budget: _Budget) -> None:
    source = budget.source
    target = (dest / m.name).resolve()
    if dest_resolved not in target.parents and target != dest_resolved:
        raise PackageFormatError(f"archive member {_shown(m.name)} would be written outside the target", path=source)
    if m.isdir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    src = tf.extractfile(m)
    if src is None:
        raise PackageFormatError(f"archive member {_shown(m.name)} has no data", path=source)
    with src, open(target, "xb") as out:
        _copy(src, out, m.size, m.name, budget)


def _copy(src: IO[bytes], out: IO[bytes], size: int, name: str, budget: _Budget) -> None:
    remaining = size
    while remaining:
        chunk = src.read(min(remaining, 8 * 1024 * 1024))
        if not chunk:
            raise PackageFormatError(f"archive member {_shown(name)} is truncated", path=budget.source)
        budget.spend(len(chunk))
        out.write(chunk)
        remaining -= len(chunk)
