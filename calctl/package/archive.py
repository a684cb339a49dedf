"""Deterministic package tarballs and safe extraction.

Packing is deterministic (sorted members, owner 0/0, fixed mtime, normalised
modes) so that the same directory always gives the same bytes. Extraction refuses
absolute members, ``..``, links, devices, sparse files, clashing members, names
over the file-system limits and oversized members before writing anything, never
writes outside the target directory, and bounds the bytes it really writes and
the time it really spends (:data:`MAX_EXPANSION`, :data:`MAX_EXTRACT_SECONDS`).
"""

from __future__ import annotations

import bz2
import contextlib
import lzma
import os
import stat
import tarfile
import time
import zlib
from pathlib import Path, PurePosixPath
from typing import IO, Any, cast

from calctl import textsafe
from calctl.errors import PackageFormatError, UsageError
from calctl.filekind import kind_phrase
from calctl.records import atomic_output

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
#: Files and directories the members make below the top level (directories a member's path only implies count),
#: the same ceiling as LAY005's for a package directory; and the deepest member path, in components.
MAX_ENTRIES = MAX_MEMBERS
MAX_DEPTH = 32
#: Longest member name (Linux PATH_MAX); each component at most 255 bytes (NAME_MAX).
MAX_NAME_BYTES = 4096
#: One PAX or GNU long-name/long-link header's payload, checked from its 512-byte header before tarfile buffers
#: it (calctl writes a few hundred bytes per member); all of them together; and how many may precede one member.
MAX_EXTENDED_HEADER_BYTES = 1024 * 1024
MAX_EXTENDED_TOTAL_BYTES = 64 * 1024**2
MAX_EXTENDED_HEADERS_IN_A_ROW = 8
#: PAX records (``path=…``, ``mtime=…``) in all the PAX headers together, counted before tarfile parses one: it
#: parses them one by one in Python, and 64 headers of 1 MiB of 6-byte records (an 11 KB .tar.bz2) took 30 s.
#: GNU tar writes about 5 per member, Python's tarfile 1 or 2.
MAX_PAX_RECORDS = 100_000
#: Largest piece decompressed or copied between two budget checks (a signal is seen between pieces), and the
#: compressed input read between two checks of the deadline.
READ_CHUNK = 1024 * 1024
INPUT_CHUNK = 32 * 1024
#: Compressed streams one archive may hold (gzip members, bzip2 or xz streams): this many, plus one for every
#: this many bytes they decompress to. Starting a stream costs work whatever it holds; an empty gzip member is
#: 20 bytes, so a 12 MB file of them was 600,000 streams and 14 s of work before any other limit applied.
FREE_STREAMS = 64
BYTES_PER_STREAM = 16 * 1024
#: Memory an xz stream's decoder may need (its dictionary: ``xz -9`` needs 65 MiB); a header can declare 1.5 GiB.
MAX_XZ_MEMORY = 128 * 1024**2
#: CPU seconds of decompression any archive may spend before it must show :data:`MIN_DECOMPRESS_RATE`.
DECOMPRESS_FREE_CPU_S = 1.0
#: Bytes a decompressor must produce per CPU second it spends (real packages: hundreds of MB/s). An xz file of
#: 600,000 empty blocks, each declaring another dictionary size, spends seconds producing nothing.
MIN_DECOMPRESS_RATE = 1024**2
FIXED_MTIME = 0


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
    from calctl.records import check_output

    check_output(out, "--out")  # a FIFO, a device, a symlink or a directory there: refused before sealing


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
    """A member name (or link target) as quoted in a message: undecodable bytes as ``\\xNN``, and a name over
    :data:`calctl.textsafe.MAX_QUOTED` characters (a PAX path may be 1 MiB) as its head and tail, and length."""
    return textsafe.shorten(repr(name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")))


def _check_member(m: tarfile.TarInfo, source: str) -> tuple[str, ...]:
    """The member's path components (``.`` and empty ones dropped), once its name, type and size pass."""
    name = m.name
    shown = _shown(name)
    parts = tuple(part for part in name.split("/") if part not in ("", "."))
    if name.startswith("/"):
        raise PackageFormatError(f"archive member {shown} is an absolute path", path=source)
    if ".." in parts:
        raise PackageFormatError(f"archive member {shown} contains '..'", path=source)
    if "\\" in name or "\x00" in name:
        raise PackageFormatError(f"archive member {shown} has a backslash or NUL in its name", path=source)
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > MAX_NAME_BYTES or (
        len(encoded) > 255 and any(len(part.encode("utf-8", "surrogateescape")) > 255 for part in parts)
    ):
        raise PackageFormatError(
            f"archive member {shown[:80]}... has a name over the file-system limits "
            f"({len(encoded)} bytes; at most {MAX_NAME_BYTES}, 255 per component)",
            path=source,
        )
    if m.issym() or m.islnk():
        raise PackageFormatError(
            f"archive member {shown} is a link ({_shown(m.linkname)}); packages hold regular files only", path=source
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
    return parts


class _Tree:
    """The member checks, applied one header at a time as it is read (before the next header is).

    Besides each member's own checks, the tree the members make is bounded: at most :data:`MAX_ENTRIES` files and
    directories (a directory only implied by a member's path counts: 9,999 members each 52 directories deep made
    half a million directories), and no path deeper than :data:`MAX_DEPTH`.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.files: set[str] = set()
        self.dirs: set[str] = set()
        self.tops: set[str] = set()
        self.entries = 0
        self.declared = 0

    def add(self, m: tarfile.TarInfo) -> None:
        source = self.source
        parts = _check_member(m, source)
        if not parts:
            return
        key = "/".join(parts)
        if len(parts) > MAX_DEPTH:
            raise PackageFormatError(
                f"archive member {_shown(m.name)[:80]}... is {len(parts)} levels deep (at most {MAX_DEPTH})",
                path=source,
            )
        parents = ["/".join(parts[:i]) for i in range(1, len(parts))]
        for parent in parents:
            if parent in self.files:
                raise PackageFormatError(
                    f"archive member {_shown(m.name)} lies below {_shown(parent)}, which is a file", path=source
                )
        if m.isdir():
            if key in self.files:
                raise PackageFormatError(f"archive member {_shown(m.name)} is both a file and a directory", path=source)
            self._dir(key)
        else:
            if key in self.files:
                raise PackageFormatError(f"archive member {_shown(m.name)} appears twice", path=source)
            if key in self.dirs:
                raise PackageFormatError(f"archive member {_shown(m.name)} is both a file and a directory", path=source)
            self.files.add(key)
            self.entries += 1
            self.declared += m.size
        for parent in parents:
            self._dir(parent)
        self.tops.add(parts[0])
        if self.entries > MAX_ENTRIES:
            raise PackageFormatError(
                f"archive makes more than {MAX_ENTRIES} files and directories below its top level (directories "
                f"only implied by a member's path count), at member {_shown(m.name)[:80]}",
                path=source,
            )

    def _dir(self, key: str) -> None:
        if key not in self.dirs:
            self.dirs.add(key)
            if "/" in key:  # the top level is not counted (the package's own directory)
                self.entries += 1


class _Budget:
    """Bytes and time extraction may still spend, checked *before* the work they bound.

    ``bytes_left`` bounds the member bytes written (and what the declared sizes may add up to); ``stream_left``
    bounds the bytes decompressed (or read) from the archive in one pass, so nothing tarfile does can read
    further; ``deadline`` is checked inside every read, not only between members.
    """

    def __init__(self, source: str, archive_bytes: int, deadline: float) -> None:
        self.source = source
        self.bytes_left = min(MAX_TOTAL_BYTES, MAX_EXPANSION * archive_bytes + EXPANSION_SLACK_BYTES)
        self.limit = self.bytes_left
        self.deadline = deadline
        self.stream_left = 0
        self.extended_bytes = 0  # PAX / GNU long-name / long-link payloads read so far
        self.extended_in_row = 0
        self.pax_records = 0

    def new_pass(self) -> None:
        """One pass reads at most the member bytes allowed, their headers and the extended headers."""
        self.stream_left = self.limit + MAX_EXTENDED_TOTAL_BYTES + (MAX_MEMBERS + 2) * tarfile.BLOCKSIZE * 4
        self.extended_bytes = 0
        self.extended_in_row = 0
        self.pax_records = 0

    def spend(self, n: int) -> None:
        self.bytes_left -= n
        if self.bytes_left < 0:
            raise PackageFormatError(
                f"archive expands past its limit (at most {MAX_TOTAL_BYTES} bytes in all, and at most "
                f"{MAX_EXPANSION}x the archive's own size + {EXPANSION_SLACK_BYTES} bytes)",
                path=self.source,
            )
        self.tick()

    def read(self, n: int) -> None:
        """About to read ``n`` bytes of the (decompressed) archive stream."""
        self.stream_left -= n
        if self.stream_left < 0:
            raise PackageFormatError(
                f"reading the archive needs more than {self.limit} bytes of member data and headers "
                f"({MAX_EXPANSION}x its size + {EXPANSION_SLACK_BYTES}, at most {MAX_TOTAL_BYTES})",
                path=self.source,
            )
        self.tick()

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise PackageFormatError(
                f"extracting the archive took longer than the {MAX_EXTRACT_SECONDS:g} s limit", path=self.source
            )


class _Metered:
    """A read-only, forward-only view of the (decompressed) archive stream that charges every read to the budget.

    Reads are cut into :data:`READ_CHUNK` pieces, each charged (bytes and deadline) before it is decompressed,
    so a bomb is stopped at the limit, and a signal is seen between pieces, whatever tarfile asks for. A forward
    seek in a compressed stream is a metered read; going backwards is refused (two passes reopen instead).
    """

    def __init__(self, raw: IO[bytes], budget: _Budget, *, seekable: bool) -> None:
        self.raw = raw
        self.budget = budget
        self.seekable_raw = seekable
        self.pos = 0
        self.pushback = b""  # bytes read (and charged) already, given back to be read again

    def unread(self, data: bytes) -> None:
        """Give back bytes just read: the next read returns them first (the position goes back by as many)."""
        self.pushback = data + self.pushback
        self.pos -= len(data)

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            raise PackageFormatError("internal: an unbounded read of the archive", path=self.budget.source)
        parts: list[bytes] = []
        if self.pushback:
            given, self.pushback = self.pushback[:n], self.pushback[n:]
            parts.append(given)
            n -= len(given)
            self.pos += len(given)
        while n > 0:
            k = min(n, READ_CHUNK)
            self.budget.read(k)
            chunk = self.raw.read(k)
            self.budget.stream_left += k - len(chunk)  # charged before, for what was asked; kept, what was read
            if not chunk:
                break
            parts.append(chunk)
            n -= len(chunk)
            self.pos += len(chunk)
        return b"".join(parts)

    def seek(self, pos: int, whence: int = 0) -> int:
        target = {0: pos, 1: self.pos + pos}.get(whence)
        if target is None or target < 0:
            raise PackageFormatError("internal: unsupported seek in the archive", path=self.budget.source)
        if target == self.pos:
            return self.pos
        if self.pushback:  # only tarfile's header parsing gives bytes back, and it never seeks before reading them
            raise PackageFormatError("internal: a seek over bytes given back", path=self.budget.source)
        if self.seekable_raw:
            self.budget.tick()  # a plain tar: skipping costs nothing
            self.raw.seek(target)
            self.pos = target
            return self.pos
        if target < self.pos:
            raise PackageFormatError("internal: a backward seek in a compressed archive", path=self.budget.source)
        while self.pos < target:
            if not self.read(min(target - self.pos, READ_CHUNK)):
                break  # past the end: the next read returns nothing, and tarfile says "unexpected end of data"
        return self.pos


def _bounded_tarinfo(budget: _Budget) -> type[tarfile.TarInfo]:
    """A TarInfo whose extended headers are size-checked before tarfile buffers them, and sparse maps refused.

    tarfile reads a PAX or GNU long-name/long-link payload with one ``read(size)`` of whatever size the header
    declares (a 1 KB bz2 can declare 1 GiB); these are checked here, from the 512-byte header alone.
    """
    source = budget.source
    extended = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE, b"X")

    def sparse(self: tarfile.TarInfo, *args: Any) -> Any:
        member = args[0] if args and isinstance(args[0], tarfile.TarInfo) else self  # a PAX map: the member next
        raise PackageFormatError(
            f"archive member {_shown(member.name)} is a sparse file; packages hold plain files", path=source
        )

    class BoundedTarInfo(tarfile.TarInfo):
        def _proc_member(self, tarfile_: tarfile.TarFile) -> Any:
            if self.size < 0:  # base-256 size fields can be negative; tarfile would then seek backwards
                raise PackageFormatError(
                    f"archive member {_shown(self.name)} declares a negative size ({self.size})", path=source
                )
            if self.type in extended:
                what = "PAX" if self.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, b"X") else "GNU long-name/long-link"
                if self.size > MAX_EXTENDED_HEADER_BYTES:
                    raise PackageFormatError(
                        f"archive has a {what} header of {self.size} bytes, over the "
                        f"{MAX_EXTENDED_HEADER_BYTES} byte limit for one extended header",
                        path=source,
                    )
                budget.extended_in_row += 1
                budget.extended_bytes += self.size
                if budget.extended_in_row > MAX_EXTENDED_HEADERS_IN_A_ROW:
                    raise PackageFormatError(
                        f"archive has more than {MAX_EXTENDED_HEADERS_IN_A_ROW} extended headers before one member",
                        path=source,
                    )
                if budget.extended_bytes > MAX_EXTENDED_TOTAL_BYTES:
                    raise PackageFormatError(
                        f"archive's extended (PAX/GNU) headers exceed {MAX_EXTENDED_TOTAL_BYTES} bytes in all",
                        path=source,
                    )
            elif self.type == tarfile.GNUTYPE_SPARSE:
                sparse(self)
            else:
                budget.extended_in_row = 0
            return super()._proc_member(tarfile_)  # type: ignore[misc]

        def _proc_pax(self, tarfile_: tarfile.TarFile) -> Any:
            # tarfile parses a PAX header record by record in Python (~2 us each): count them, cheaply, first.
            stream = cast(_Metered, tarfile_.fileobj)
            buf = stream.read(self._block(self.size))  # type: ignore[attr-defined]
            budget.pax_records += buf.count(b"\n")
            if budget.pax_records > MAX_PAX_RECORDS:
                raise PackageFormatError(
                    f"archive's PAX headers hold more than {MAX_PAX_RECORDS} records in all", path=source
                )
            stream.unread(buf)
            return super()._proc_pax(tarfile_)  # type: ignore[misc]

        _proc_gnusparse_00 = sparse
        _proc_gnusparse_01 = sparse
        _proc_gnusparse_10 = sparse

    return BoundedTarInfo


#: The compressions a package archive may use, by the magic bytes their streams start with.
_MAGIC = {"gzip": b"\x1f\x8b", "bzip2": b"BZh", "xz": b"\xfd7zXZ\x00"}


def _compression(head: bytes) -> str | None:
    return next((kind for kind, magic in _MAGIC.items() if head.startswith(magic)), None)


class _Inflater:
    """A forward-only reader of a gzip, bzip2 or xz file of one or more concatenated streams.

    calctl's own loop over the decompressors rather than :mod:`gzip`/:mod:`bz2`/:mod:`lzma`'s file objects, so
    that the work an input can force is bounded where it is done: compressed bytes are read :data:`INPUT_CHUNK`
    at a time with the deadline checked before each piece, and every compressed stream (a gzip member, a bzip2 or
    xz stream) after the first must be paid for by what the streams decompress to (:data:`FREE_STREAMS` plus one
    per :data:`BYTES_PER_STREAM`) before it is started. 600,000 empty gzip members (12 MB) are refused at the
    65th, in milliseconds; ``pbzip2``'s one stream per 900 KB block never comes near the limit.
    """

    def __init__(self, raw: IO[bytes], kind: str, budget: _Budget) -> None:
        self.raw = raw
        self.kind = kind
        self.budget = budget
        self.pending = b""  # compressed bytes read from the file and not yet given to a decompressor
        self.dec: Any = None
        self.streams = 0
        self.produced = 0
        self.work_s = 0.0  # CPU seconds this thread spent inside the decompressors
        self.done = False

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes, fewer only at the end of the file."""
        parts: list[bytes] = []
        while not self.done and n > 0:
            if (self.dec is None or self.dec.eof) and not self._next_stream():
                self.done = True
                break
            data = self._decompress(n)
            if data:
                self.produced += len(data)
                parts.append(data)
                n -= len(data)
        return b"".join(parts)

    def _take(self) -> bytes:
        if self.pending:
            data, self.pending = self.pending, b""
            return data
        self.budget.tick()
        return self.raw.read(INPUT_CHUNK)

    def _next_stream(self) -> bool:
        """Start the next stream, if the file holds one (gzip and xz streams may be padded with zero bytes)."""
        magic = _MAGIC[self.kind]
        data = b""
        while len(data) < len(magic):
            chunk = self._take()
            if not chunk:
                break
            data += chunk
            if self.kind != "bzip2":
                data = data.lstrip(b"\0")
        if not data:
            return False
        if not data.startswith(magic):
            if self.streams == 0 or self.kind == "gzip":
                raise OSError(f"not a {self.kind} stream where stream {self.streams + 1} should begin")
            return False  # bzip2 and xz ignore trailing bytes that are no stream, as their tools do
        self.pending = data
        self.streams += 1
        allowed = FREE_STREAMS + self.produced // BYTES_PER_STREAM
        if self.streams > allowed:
            raise PackageFormatError(
                f"{self.kind} archive holds more than {allowed} compressed streams for the {self.produced} bytes "
                f"they decompress to (at most {FREE_STREAMS}, plus one per {BYTES_PER_STREAM} bytes decompressed)",
                path=self.budget.source,
            )
        if self.kind == "gzip":
            self.dec = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        elif self.kind == "bzip2":
            self.dec = bz2.BZ2Decompressor()
        else:
            self.dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=MAX_XZ_MEMORY)
        return True

    def _decompress(self, n: int) -> bytes:
        dec = self.dec
        wants = self.kind == "gzip" or dec.needs_input  # zlib keeps what it did not use; bz2 and lzma keep it inside
        data = (dec.unconsumed_tail if self.kind == "gzip" else b"") or (self._take() if wants else b"")
        if not data and wants:
            raise EOFError("Compressed file ended before the end-of-stream marker was reached")
        t0 = time.thread_time()
        try:
            out: bytes = dec.decompress(data, n)
        except lzma.LZMAError as exc:
            if "memory" in str(exc).lower():
                raise PackageFormatError(
                    f"xz stream {self.streams} needs more than the {MAX_XZ_MEMORY} bytes of memory its decoder may "
                    "use (its dictionary is declared larger)",
                    path=self.budget.source,
                ) from None
            raise
        finally:
            self.work_s += time.thread_time() - t0
        made = self.produced + len(out)
        if self.work_s > DECOMPRESS_FREE_CPU_S and made < MIN_DECOMPRESS_RATE * self.work_s:
            raise PackageFormatError(
                f"{self.kind} archive spent {self.work_s:.1f} s of CPU decompressing to {made} bytes (at least "
                f"{MIN_DECOMPRESS_RATE} bytes per CPU second after the first {DECOMPRESS_FREE_CPU_S:g} s): "
                "a decompression bomb (e.g. many empty blocks)",
                path=self.budget.source,
            )
        if dec.eof:
            self.pending = dec.unused_data
        return out


#: What decompressing or reading an archive raises on corrupt input (none of it is an interrupt).
_CORRUPT = (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError, ValueError)


def _open_regular(archive: Path, source: str) -> IO[bytes]:
    # Only a regular file is opened: open() on a FIFO blocks until a writer comes (a hung `serve` or admin
    # load), and a device never ends. O_NONBLOCK so the open itself cannot block either; the fstat then judges
    # what was really opened (a path swapped after the check).
    try:
        fd = os.open(archive, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise PackageFormatError(f"not a readable tar archive: {exc.strerror or exc}", path=source) from None
    fileobj = os.fdopen(fd, "rb")
    with contextlib.ExitStack() as refused:  # closed on any way out but the return
        refused.callback(fileobj.close)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PackageFormatError(
                f"is {kind_phrase(st.st_mode)}, not a regular file: expected a package directory or a tar archive",
                path=source,
            )
        os.set_blocking(fd, True)
        refused.pop_all()
    return fileobj


def is_tar(path: Path) -> bool:
    """Whether ``path`` is a regular file that looks like a (gzip/bzip2/xz-compressed) tar.

    Reads at most one 512-byte header (decompressing no more than that): never ``tarfile.is_tarfile``, which
    reads a whole PAX header of whatever size it declares. A compressed file is an archive by its magic; a
    corrupt one is then refused by :func:`extract_package`, naming the file.
    """
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as fh:
            head = fh.read(tarfile.BLOCKSIZE)
    except OSError:
        return False
    if _compression(head) is not None:
        return True
    if len(head) < tarfile.BLOCKSIZE:
        return False
    try:
        tarfile.TarInfo.frombuf(head, tarfile.ENCODING, "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True


def _open_pass(fileobj: IO[bytes], kind: str | None, budget: _Budget) -> tarfile.TarFile:
    fileobj.seek(0)
    budget.new_pass()
    raw: IO[bytes] = fileobj if kind is None else cast(IO[bytes], _Inflater(fileobj, kind, budget))
    stream = _Metered(raw, budget, seekable=kind is None)
    try:
        return tarfile.open(fileobj=cast(IO[bytes], stream), mode="r:", tarinfo=_bounded_tarinfo(budget))
    except PackageFormatError:
        raise
    except _CORRUPT as exc:
        if stream.pos < tarfile.BLOCKSIZE and kind is not None:
            raise PackageFormatError(
                f"corrupt {kind} tar archive: the stream ends or breaks inside its first header ({_why(exc)})",
                path=budget.source,
            ) from None
        raise PackageFormatError(f"not a readable tar archive: {_why(exc)}", path=budget.source) from None


def _why(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__


def extract_package(archive: Path, dest: Path) -> Path:
    """Safely extract ``archive`` into ``dest`` (which must exist and be empty).

    Two forward passes over the archive (so a compressed stream is never rewound). The first reads the member
    headers one by one and checks each before the next is read: its name, type and declared size against the
    limits, the declared sizes so far against what this archive may expand to, and extended (PAX/GNU) headers
    against their own limit before tarfile buffers them. Nothing is written unless every header passes. The
    second pass writes the members, bounding the bytes really written. Every read, in either pass, is charged
    to a byte budget and the deadline before it is decompressed. Returns the package root: the single
    top-level directory, or ``dest`` when members are flat. Every failure is a :class:`PackageFormatError`
    naming the archive (and the member), never an interrupt or an internal error.
    """
    source = str(archive)
    fileobj = _open_regular(archive, source)
    with fileobj:
        size = os.fstat(fileobj.fileno()).st_size
        kind = _compression(fileobj.read(8))
        budget = _Budget(source, size, time.monotonic() + MAX_EXTRACT_SECONDS)
        members, tree = _read_headers(fileobj, kind, budget)
        _write_members(fileobj, kind, budget, members, dest)
    if len(tree.tops) == 1:
        only = dest / next(iter(tree.tops))
        if only.is_dir() and not only.is_symlink():
            return only
    return dest


def _read_headers(fileobj: IO[bytes], kind: str | None, budget: _Budget) -> tuple[list[tarfile.TarInfo], _Tree]:
    """Pass 1: every header, each checked before the next is read (so before its data is skipped)."""
    tree = _Tree(budget.source)
    members: list[tarfile.TarInfo] = []
    with _open_pass(fileobj, kind, budget) as tf:
        while True:
            try:
                m = tf.next()
            except PackageFormatError:
                raise
            except _CORRUPT as exc:
                raise PackageFormatError(f"corrupt tar archive: {_why(exc)}", path=budget.source) from None
            if m is None:
                return members, tree
            members.append(m)
            if len(members) > MAX_MEMBERS:
                raise PackageFormatError(f"archive has more than {MAX_MEMBERS} members", path=budget.source)
            tree.add(m)
            if tree.declared > budget.bytes_left:
                raise PackageFormatError(
                    f"archive members declare {tree.declared} bytes (member {_shown(m.name)} declares {m.size}), "
                    f"over the limit of {budget.bytes_left} bytes for this archive ({MAX_EXPANSION}x its size + "
                    f"{EXPANSION_SLACK_BYTES}, at most {MAX_TOTAL_BYTES})",
                    path=budget.source,
                )
            budget.tick()


def _write_members(
    fileobj: IO[bytes], kind: str | None, budget: _Budget, members: list[tarfile.TarInfo], dest: Path
) -> None:
    """Pass 2: each member's data, where pass 1 found it, written as it comes (forward only, no rewinding).

    The headers are not parsed again: pass 1 checked them and recorded where each member's data lies. The
    members' paths were checked (no absolute path, no ``..``, no link of any kind is ever written), so a target
    is ``dest`` joined with the name; the check that it stays inside is on the string, and each directory is
    made once. (Resolving every target cost a ``lstat`` per path component per member.)
    """
    source = budget.source
    fileobj.seek(0)
    budget.new_pass()
    raw: IO[bytes] = fileobj if kind is None else cast(IO[bytes], _Inflater(fileobj, kind, budget))
    stream = _Metered(raw, budget, seekable=kind is None)
    root = os.path.abspath(dest)
    made: set[str] = {root}
    for m in members:
        target = os.path.normpath(os.path.join(root, m.name))
        if not target.startswith(root + os.sep) and not (target == root and m.isdir()):
            raise PackageFormatError(
                f"archive member {_shown(m.name)} would be written outside the target", path=source
            )
        directory = target if m.isdir() else os.path.dirname(target)
        if directory not in made:
            os.makedirs(directory, exist_ok=True)
            made.add(directory)
        if m.isdir():
            continue
        try:
            stream.seek(m.offset_data)
            with open(target, "xb") as out:
                _copy(stream, out, m.size, m.name, budget)
        except PackageFormatError:
            raise
        except _CORRUPT as exc:
            raise PackageFormatError(
                f"archive member {_shown(m.name)} cannot be extracted: {_why(exc)}", path=source
            ) from None
        budget.tick()


def _copy(src: _Metered, out: IO[bytes], size: int, name: str, budget: _Budget) -> None:
    remaining = size
    while remaining:
        chunk = src.read(min(remaining, READ_CHUNK))
        if not chunk:
            raise PackageFormatError(f"archive member {_shown(name)} is truncated", path=budget.source)
        budget.spend(len(chunk))
        out.write(chunk)
        remaining -= len(chunk)
