"""Checksums and detached signatures over a package directory.

``checksums.sha256`` is coreutils format (``<hex>  <path>``, sorted by path,
every regular file except the checksum file and its signature), so
``sha256sum -c --strict checksums.sha256`` works inside a package.
``checksums.sha256.sig`` is the raw 64-byte Ed25519 signature over the exact
bytes of ``checksums.sha256`` (openssl ``pkeyutl -rawin`` verifies it).

Hashing streams each file in large chunks and runs files in parallel threads
(hashlib releases the GIL on large updates), so memory stays flat whatever the
file size.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from calctl import textsafe
from calctl.errors import PackageFormatError
from calctl.records import write_atomic
from calctl.signing.files import CHECKSUMS, SEAL_FILES, SIGNATURE, NotReadable, read_regular
from calctl.signing.keys import TrustedKey, key_id

CHUNK = 8 * 1024 * 1024
T = TypeVar("T")
_LINE = re.compile(r"([0-9a-f]{64}) [ *](.+)", re.DOTALL)
MAX_CHECKSUM_FILE = 64 * 1024 * 1024
#: Most entries checksums.sha256 may list: the most files a package may hold (calctl.package.archive.MAX_MEMBERS).
#: Counted before any line is parsed, so 100,000 entries for missing files cost one finding, not 100,000.
MAX_CHECKSUM_ENTRIES = 10_000
#: A raw Ed25519 signature is 64 bytes; anything much larger is not one.
MAX_SIGNATURE_FILE = 4096


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


class HashingStopped(Exception):
    """Hashing was abandoned because the caller stopped (a signal reached the main thread)."""


def sha256_file(path: Path, stop: threading.Event | None = None) -> str:
    """Stream the regular file ``path`` through SHA-256 with one reusable buffer.

    Opened without following a link and without blocking, and refused (OSError)
    unless it is a regular file, so a FIFO swapped in never hangs the hashing.
    ``stop`` is looked at between chunks: a worker thread hashing a 64 GiB file
    gives up within one chunk once it is set (:func:`stoppable_map`).
    """
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb", buffering=0) as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotReadable("is not a regular file")
        os.set_blocking(fd, True)
        if hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while True:
            if stop is not None and stop.is_set():
                raise HashingStopped(str(path))
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


def stoppable_map(fn: Callable[[str, threading.Event], T], items: list[str], jobs: int) -> list[T]:
    """``[fn(item, stop) for item in items]`` on ``jobs`` threads, in order.

    If the caller is interrupted (SIGINT raises KeyboardInterrupt in the main thread while it waits), ``stop``
    is set and queued items are cancelled, so the workers end within one chunk instead of hashing every file
    to its end before the interpreter may exit.
    """
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(items) or 1))) as pool:  # exit: shutdown(wait=True)
        with contextlib.ExitStack() as unfinished:  # run on the way out only if the map did not finish
            unfinished.callback(pool.shutdown, wait=False, cancel_futures=True)
            unfinished.callback(stop.set)  # first (last in, first out): the workers stop within one chunk
            done = list(pool.map(lambda item: fn(item, stop), items))
            unfinished.pop_all()
        return done


@dataclass(frozen=True)
class FileEntry:
    rel: str
    kind: str  # "file" | "symlink" | "special" | "unreadable"

    @property
    def phrase(self) -> str:
        """What the entry is, for messages: "a symlink", "a special file", "an unreadable directory"."""
        return _KIND_PHRASE.get(self.kind, f"a {self.kind}")


_KIND_PHRASE = {
    "file": "a regular file",
    "symlink": "a symlink",
    "special": "a special file (FIFO, socket or device)",
    "unreadable": "an unreadable directory",
}


def list_package_files(root: Path) -> list[FileEntry]:
    """Every entry under ``root`` that is not a directory, sorted by POSIX path.

    Symlinks are reported as such (never followed), so callers can refuse them.
    """
    entries: list[FileEntry] = []

    def unreadable(err: OSError) -> None:  # os.walk would otherwise skip the directory silently
        rel = Path(err.filename).relative_to(root).as_posix() if err.filename else "?"
        entries.append(FileEntry(rel, "unreadable"))

    for dirpath, dirnames, filenames in os.walk(root, followlinks=False, onerror=unreadable):
        base = Path(dirpath)
        for name in dirnames:
            p = base / name
            if p.is_symlink():
                entries.append(FileEntry(p.relative_to(root).as_posix(), "symlink"))
        for name in filenames:
            p = base / name
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                kind = "symlink"
            elif stat.S_ISREG(st.st_mode):
                kind = "file"
            else:
                kind = "special"
            entries.append(FileEntry(p.relative_to(root).as_posix(), kind))
    return sorted(entries, key=lambda e: e.rel.encode("utf-8", "surrogateescape"))


def sealed_files(root: Path) -> list[str]:
    return [e.rel for e in list_package_files(root) if e.kind == "file" and e.rel not in SEAL_FILES]


def hash_files(root: Path, rels: list[str], jobs: int | None = None) -> dict[str, str]:
    """SHA-256 of each relative path, computed in parallel; keeps the input order. Raises OSError."""
    digests = hash_files_checked(root, rels, jobs)
    for _rel, value in digests.items():
        if isinstance(value, OSError):
            raise value
    return {r: str(v) for r, v in digests.items()}


def hash_files_checked(root: Path, rels: list[str], jobs: int | None = None) -> dict[str, str | OSError]:
    """Like :func:`hash_files`, but a file that cannot be read yields its OSError instead of aborting the rest."""
    jobs = jobs or default_jobs()

    def size(r: str) -> int:
        try:
            return (root / r).stat().st_size
        except OSError:
            return 0

    def one(r: str, stop: threading.Event) -> str | OSError:
        try:
            return sha256_file(root / r, stop)
        except OSError as exc:
            return exc

    # Largest first so the long files start early and the pool drains evenly.
    order = sorted(rels, key=lambda r: -size(r))
    digests = dict(zip(order, stoppable_map(one, order, jobs), strict=True))
    return {r: digests[r] for r in rels}


def render_checksums(digests: dict[str, str]) -> bytes:
    lines = [f"{digests[rel]}  {rel}\n" for rel in sorted(digests, key=lambda r: r.encode("utf-8", "surrogateescape"))]
    return "".join(lines).encode("utf-8")


def checksum_line_problem(rel: str) -> str | None:
    """Why ``rel`` cannot be a path in checksums.sha256 (or in a package at all), or None.

    Paths are canonical, package-relative POSIX names that every reader splits
    the same way: no control characters (C0, DEL or C1), no Unicode line or
    paragraph separators, no bidirectional or invisible character (the terminal shows them reordered or not at
    all), no backslash (coreutils would unescape it), no empty,
    ``.`` or ``..`` component, no leading ``/``.
    """
    if not rel:
        return "empty path"
    if rel.startswith("/"):
        return "absolute path"
    if "\\" in rel:
        return "contains a backslash"
    for c in rel:
        o = ord(c)
        if o < 0x20 or 0x7F <= o <= 0x9F:
            return f"contains the control character U+{o:04X}"
        if c in LINE_SEPARATORS:
            return f"contains the line separator U+{o:04X}"
        if 0xD800 <= o <= 0xDFFF:
            return "name is not valid UTF-8"
        if not textsafe.is_safe(
            c
        ):  # a bidi override shows "evil\u202eexe.txt" as "eviltxt.exe"; a zero-width mark hides
            return f"contains the bidirectional or invisible character U+{o:04X}"
    parts = rel.split("/")
    if any(p == ".." for p in parts):
        return "contains '..'"
    if any(p in ("", ".") for p in parts):
        return "is not canonical (an empty or '.' component)"
    return None


#: Characters str.splitlines() (but not coreutils) treats as line breaks, besides the C0/C1 controls.
LINE_SEPARATORS = frozenset({"\u2028", "\u2029"})


#: The longest line of checksums.sha256: 64 hex digits, the separator pair and a path of PATH_MAX (4096) bytes.
MAX_CHECKSUM_LINE = 64 + 2 + 4096


def parse_checksums(data: bytes, source: str = CHECKSUMS) -> dict[str, str]:
    """Parse checksums.sha256 strictly; any odd line is an error naming it.

    The format is coreutils' (``sha256sum -c --strict``): lines end in ``\\n``
    and only ``\\n`` separates lines (never ``\\r``, ``\\f``, U+0085 or U+2028,
    which ``str.splitlines`` would also split on). calctl accepts a subset of what
    ``sha256sum -c --strict`` accepts, with the same meaning: exactly
    ``<64 lowercase hex> <space or *><path>\\n`` per line, the last line
    terminated, no comments, no blank lines, no escaped names, each path canonical
    and listed once (docs/package-format.md lists where calctl is stricter).
    """
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    if lines > MAX_CHECKSUM_ENTRIES:
        raise PackageFormatError(
            f"lists {lines} entries, more than the {MAX_CHECKSUM_ENTRIES} files a package may hold", path=source
        )
    # A line is at most a digest, two separators and a path of PATH_MAX bytes: checked on the bytes, before
    # any line is decoded, matched or quoted (an 8 MB line cost a minute and flooded the terminal).
    start = 0
    for lineno in range(1, lines + 1):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        if end - start > MAX_CHECKSUM_LINE:
            raise PackageFormatError(
                f"line {lineno} is {end - start:,} bytes, longer than the {MAX_CHECKSUM_LINE:,} a digest and a "
                "path can take",
                path=source,
            )
        start = end + 1
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PackageFormatError(f"not UTF-8 (byte {exc.start})", path=source) from None
    if not text:
        raise PackageFormatError("lists no files", path=source)
    if not text.endswith("\n"):
        raise PackageFormatError("the last line does not end in a newline ('\\n')", path=source)
    out: dict[str, str] = {}
    for lineno, line in enumerate(text[:-1].split("\n"), start=1):
        m = _LINE.fullmatch(line)
        if not m:
            raise PackageFormatError(
                f"line {lineno}: expected '<64 lowercase hex>  <path>', found {line[:80]!r}", path=source
            )
        digest, rel = m.group(1), m.group(2)
        if rel.startswith("./"):
            rel = rel[2:]
        problem = checksum_line_problem(rel)
        if problem:
            raise PackageFormatError(f"line {lineno}: unsafe path {rel!r}: {problem}", path=source)
        if rel in out:
            raise PackageFormatError(f"line {lineno}: {rel!r} listed twice", path=source)
        if rel in SEAL_FILES:
            raise PackageFormatError(f"line {lineno}: {rel!r} must not list itself or its signature", path=source)
        out[rel] = digest
    return out


def _atomic_write(path: Path, data: bytes) -> None:
    write_atomic(path, data)


def sealable_files(root: Path) -> list[str]:
    """The files ``checksums.sha256`` must list, after checking every entry; raises before anything is written.

    Every entry must be a regular file (no links, FIFOs, devices, unreadable
    directories), visible (no name starting with '.') and have a canonical UTF-8
    name that ``sha256sum -c`` reads back as the same path
    (:func:`checksum_line_problem`).
    """
    entries = list_package_files(root)
    for e in entries:
        shown = e.rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        if e.kind != "file":
            raise PackageFormatError(f"{shown} is {e.phrase}; packages hold regular files only", path=str(root))
        problem = checksum_line_problem(e.rel)
        if problem:
            raise PackageFormatError(f"{shown!r}: unsafe file name: {problem}", path=str(root))
        if e.rel not in SEAL_FILES and e.rel.split("/")[-1].startswith("."):
            raise PackageFormatError(f"{shown}: hidden files are not allowed in a package", path=str(root))
    return [e.rel for e in entries if e.rel not in SEAL_FILES]


def checksums_for(root: Path, jobs: int | None = None) -> bytes:
    """The checksums.sha256 bytes ``root`` should carry, computed and re-parsed without writing anything."""
    data = render_checksums(hash_files(root, sealable_files(root), jobs))
    parse_checksums(data)  # what we write must read back; never seal a file we cannot verify
    return data


def write_checksums(root: Path, jobs: int | None = None) -> bytes:
    data = checksums_for(root, jobs)
    _atomic_write(root / CHECKSUMS, data)
    return data


def sign(root: Path, key: Ed25519PrivateKey) -> str:
    """Sign the existing checksums.sha256; returns the signer's key id."""
    try:
        data = read_regular(root / CHECKSUMS, MAX_CHECKSUM_FILE)
    except NotReadable as exc:
        hint = "; run `calctl pack` first" if exc.missing else ""
        raise PackageFormatError(f"{exc.reason}{hint}", path=CHECKSUMS) from None
    parse_checksums(data)
    _atomic_write(root / SIGNATURE, key.sign(data))
    return key_id(key.public_key())


def seal(root: Path, key: Ed25519PrivateKey, jobs: int | None = None) -> str:
    """Write checksums then the signature. Returns the signer key id.

    Everything is checked and computed first (names, types, hashes, the new
    checksums re-parsed); only then are the two seal files replaced, each
    atomically. If anything fails the package is left exactly as it was: a
    stale signature is never left beside new checksums, and old checksums are
    put back if the signature cannot be written.
    """
    data = checksums_for(root, jobs)
    signature = key.sign(data)
    old: dict[str, bytes | None] = {}
    for name, limit in ((CHECKSUMS, MAX_CHECKSUM_FILE), (SIGNATURE, MAX_SIGNATURE_FILE)):
        try:
            old[name] = read_regular(root / name, limit)
        except NotReadable as exc:
            if not exc.missing:
                raise PackageFormatError(f"{exc.reason}; remove it and pack again", path=name) from None
            old[name] = None
    _atomic_write(root / CHECKSUMS, data)
    with contextlib.ExitStack() as unsigned:  # the signature not written: the old checksums back (or none)
        unsigned.callback(_put_back, root / CHECKSUMS, old[CHECKSUMS])
        _atomic_write(root / SIGNATURE, signature)
        unsigned.pop_all()
    return key_id(key.public_key())


def _put_back(path: Path, previous: bytes | None) -> None:
    """A seal file as it was before a failed seal: its old bytes, or no file."""
    with contextlib.suppress(OSError):
        if previous is None:
            path.unlink()
        else:
            _atomic_write(path, previous)


# ---------------------------------------------------------------------------
# Verification


@dataclass(frozen=True)
class SealFinding:
    check: str  # "hash" | "signature"
    file: str
    message: str


@dataclass
class SealReport:
    files_checked: int = 0
    bytes_hashed: int = 0
    signer: TrustedKey | None = None
    signature_present: bool = False
    findings: list[SealFinding] = field(default_factory=list)

    @property
    def hashes_ok(self) -> bool:
        return not any(f.check == "hash" for f in self.findings)

    @property
    def signature_ok(self) -> bool:
        return self.signer is not None

    @property
    def ok(self) -> bool:
        return not self.findings and self.signer is not None


def verify_hashes(root: Path, report: SealReport, jobs: int | None = None) -> dict[str, str] | None:
    try:
        raw = read_regular(root / CHECKSUMS, MAX_CHECKSUM_FILE)
    except NotReadable as exc:
        why = "missing: the package is not sealed (run `calctl pack`)" if exc.missing else exc.reason
        report.findings.append(SealFinding("hash", CHECKSUMS, why))
        return None
    try:
        listed = parse_checksums(raw)
    except PackageFormatError as exc:
        report.findings.append(SealFinding("hash", CHECKSUMS, exc.message.removeprefix(f"{CHECKSUMS}: ")))
        return None
    entries = {e.rel: e for e in list_package_files(root)}
    for rel, e in entries.items():
        if rel in SEAL_FILES:
            continue
        if e.kind != "file":
            report.findings.append(SealFinding("hash", rel, f"is {e.phrase}; packages hold regular files only"))
        elif rel not in listed:
            report.findings.append(
                SealFinding("hash", rel, "present in the package but not listed in checksums.sha256")
            )
    present = []
    for rel in listed:
        found = entries.get(rel)
        if found is None:
            report.findings.append(SealFinding("hash", rel, "listed in checksums.sha256 but missing from the package"))
        elif found.kind == "file":
            present.append(rel)
    digests = hash_files_checked(root, present, jobs)
    for rel, digest in digests.items():
        if isinstance(digest, OSError):
            report.findings.append(SealFinding("hash", rel, f"cannot be read: {digest.strerror or digest}"))
            continue
        report.files_checked += 1
        report.bytes_hashed += (root / rel).stat().st_size
        if digest != listed[rel]:
            report.findings.append(
                SealFinding(
                    "hash", rel, f"sha256 mismatch: checksums.sha256 says {listed[rel][:16]}…, file has {digest[:16]}…"
                )
            )
    return listed


def verify_signature(root: Path, trusted: list[TrustedKey], report: SealReport) -> None:
    try:
        sig = read_regular(root / SIGNATURE, MAX_SIGNATURE_FILE)
    except NotReadable as exc:
        why = "missing: the package is unsigned" if exc.missing else exc.reason
        report.findings.append(SealFinding("signature", SIGNATURE, why))
        return
    report.signature_present = True
    try:
        data = read_regular(root / CHECKSUMS, MAX_CHECKSUM_FILE)
    except NotReadable:
        return  # verify_hashes reports why checksums.sha256 cannot be read
    if len(sig) != 64:
        report.findings.append(
            SealFinding("signature", SIGNATURE, f"is {len(sig)} bytes, expected a 64-byte raw Ed25519 signature")
        )
        return
    if not trusted:
        report.findings.append(
            SealFinding("signature", SIGNATURE, "no trusted keys given (use --trusted-key PUB or CALCTL_TRUSTED_KEYS)")
        )
        return
    for tk in trusted:
        try:
            tk.key.verify(sig, data)
        except InvalidSignature:
            continue
        report.signer = tk
        return
    ids = ", ".join(f"{k.key_id} ({k.source})" for k in trusted)
    report.findings.append(
        SealFinding(
            "signature",
            SIGNATURE,
            f"does not verify with any trusted key; tried {ids}: signed "
            "by another key, or checksums.sha256 changed after signing",
        )
    )


def verify(root: Path, trusted: list[TrustedKey], jobs: int | None = None) -> SealReport:
    """Check every hash and the signature; collect every finding, not just the first."""
    report = SealReport()
    verify_hashes(root, report, jobs)
    verify_signature(root, trusted, report)
    return report
