"""Deterministic package tarballs and safe extraction.

Packing is deterministic (sorted members, owner 0/0, fixed mtime, normalised
modes) so that the same directory always gives the same bytes. Extraction refuses
absolute members, ``..``, links, devices and oversized members before writing
anything, and never writes outside the target directory.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path, PurePosixPath
from typing import IO

from calctl.errors import PackageFormatError, UsageError
from calctl.records import atomic_output

#: Default ceilings for extraction; a real board package holds two ~8.5 GiB blobs.
MAX_MEMBER_BYTES = 64 * 1024**3
MAX_TOTAL_BYTES = 256 * 1024**3
MAX_MEMBERS = 100_000
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


def write_tar(src: Path, out: Path) -> None:
    """Write ``src`` (a package directory) as a deterministic tar at ``out``.

    Members are ``<dirname>/<relative path>``. Written to a temporary file and
    renamed, so a crash never leaves a half-written archive under ``out``.
    """
    top = src.name
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


def _check_member(m: tarfile.TarInfo, source: str) -> PurePosixPath:
    name = m.name
    p = PurePosixPath(name)
    if name.startswith("/") or p.is_absolute():
        raise PackageFormatError(f"archive member {name!r} is an absolute path", path=source)
    if any(part == ".." for part in p.parts):
        raise PackageFormatError(f"archive member {name!r} contains '..'", path=source)
    if "\\" in name or "\x00" in name:
        raise PackageFormatError(f"archive member {name!r} has a backslash or NUL in its name", path=source)
    if m.issym() or m.islnk():
        raise PackageFormatError(
            f"archive member {name!r} is a link ({m.linkname!r}); packages hold regular files only", path=source
        )
    if m.isdev() or m.isfifo() or m.ischr() or m.isblk():
        raise PackageFormatError(f"archive member {name!r} is a device or FIFO", path=source)
    if not (m.isfile() or m.isdir()):
        raise PackageFormatError(f"archive member {name!r} has unsupported type {m.type!r}", path=source)
    if m.size > MAX_MEMBER_BYTES:
        raise PackageFormatError(
            f"archive member {name!r} is {m.size} bytes, over the {MAX_MEMBER_BYTES} byte limit", path=source
        )
    return p


def extract_package(archive: Path, dest: Path) -> Path:
    """Safely extract ``archive`` into ``dest`` (which must exist and be empty).

    Every member is checked before anything is written. Returns the package
    root: the single top-level directory, or ``dest`` when members are flat.
    """
    source = str(archive)
    try:
        tf = tarfile.open(archive, "r:*")  # noqa: SIM115 - opened here to map its errors, closed by `with tf` below
    except (tarfile.TarError, OSError) as exc:
        raise PackageFormatError(f"not a readable tar archive: {exc}", path=source) from None
    with tf:
        try:
            members = tf.getmembers()
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise PackageFormatError(f"corrupt tar archive: {exc}", path=source) from None
        if len(members) > MAX_MEMBERS:
            raise PackageFormatError(f"archive has {len(members)} members, over the {MAX_MEMBERS} limit", path=source)
        total = 0
        tops: set[str] = set()
        seen: set[str] = set()
        for m in members:
            p = _check_member(m, source)
            key = p.as_posix().rstrip("/")
            if m.isfile() and key in seen:
                raise PackageFormatError(f"archive member {m.name!r} appears twice", path=source)
            seen.add(key)
            total += m.size
            if p.parts:
                tops.add(p.parts[0])
        if total > MAX_TOTAL_BYTES:
            raise PackageFormatError(f"archive expands to {total} bytes, over the {MAX_TOTAL_BYTES} limit", path=source)
        dest_resolved = dest.resolve()
        for m in members:
            target = (dest / m.name).resolve()
            if dest_resolved not in target.parents and target != dest_resolved:
                raise PackageFormatError(f"archive member {m.name!r} would be written outside the target", path=source)
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tf.extractfile(m)
            if src is None:
                raise PackageFormatError(f"archive member {m.name!r} has no data", path=source)
            with src, open(target, "xb") as out:
                _copy(src, out, m.size, m.name, source)
    if len(tops) == 1:
        only = dest / next(iter(tops))
        if only.is_dir():
            return only
    return dest


def _copy(src: IO[bytes], out: IO[bytes], size: int, name: str, source: str) -> None:
    remaining = size
    while remaining:
        chunk = src.read(min(remaining, 8 * 1024 * 1024))
        if not chunk:
            raise PackageFormatError(f"archive member {name!r} is truncated", path=source)
        out.write(chunk)
        remaining -= len(chunk)
