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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from calctl.errors import PackageFormatError
from calctl.records import write_atomic
from calctl.signing.files import CHECKSUMS, SEAL_FILES, SIGNATURE
from calctl.signing.keys import TrustedKey, key_id

CHUNK = 8 * 1024 * 1024
_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")
MAX_CHECKSUM_FILE = 64 * 1024 * 1024


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def sha256_file(path: Path) -> str:
    """Stream ``path`` through SHA-256 with one reusable buffer."""
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        if hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):
                os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


@dataclass(frozen=True)
class FileEntry:
    rel: str
    kind: str  # "file" | "symlink" | "dir" | "special"


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

    def one(r: str) -> str | OSError:
        try:
            return sha256_file(root / r)
        except OSError as exc:
            return exc

    # Largest first so the long files start early and the pool drains evenly.
    order = sorted(rels, key=lambda r: -size(r))
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(order) or 1))) as pool:
        digests = dict(zip(order, pool.map(one, order), strict=True))
    return {r: digests[r] for r in rels}


def render_checksums(digests: dict[str, str]) -> bytes:
    lines = [f"{digests[rel]}  {rel}\n" for rel in sorted(digests, key=lambda r: r.encode("utf-8", "surrogateescape"))]
    return "".join(lines).encode("utf-8")


def parse_checksums(data: bytes, source: str = CHECKSUMS) -> dict[str, str]:
    """Parse coreutils-format checksums strictly; any odd line is an error naming it."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PackageFormatError(f"not UTF-8 (byte {exc.start})", path=source) from None
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _LINE.match(line)
        if not m:
            raise PackageFormatError(f"line {lineno}: expected '<64 hex>  <path>', found {line[:80]!r}", path=source)
        digest, rel = m.group(1), m.group(2)
        if rel.startswith("./"):
            rel = rel[2:]
        p = PurePosixPath(rel)
        if rel.startswith("/") or any(part in ("..", "") for part in rel.split("/")) or "\\" in rel:
            raise PackageFormatError(f"line {lineno}: unsafe path {rel!r}", path=source)
        if rel in out:
            raise PackageFormatError(f"line {lineno}: {rel!r} listed twice", path=source)
        if str(p) in SEAL_FILES:
            raise PackageFormatError(f"line {lineno}: {rel!r} must not list itself or its signature", path=source)
        out[rel] = digest
    if not out:
        raise PackageFormatError("lists no files", path=source)
    return out


def _atomic_write(path: Path, data: bytes) -> None:
    write_atomic(path, data)


def write_checksums(root: Path, jobs: int | None = None) -> bytes:
    entries = list_package_files(root)
    bad = [e for e in entries if e.kind != "file"]
    if bad:
        raise PackageFormatError(f"{bad[0].rel} is a {bad[0].kind}; packages hold regular files only", path=str(root))
    rels = [e.rel for e in entries if e.rel not in SEAL_FILES and not e.rel.split("/")[-1].startswith(".")]
    hidden = [e.rel for e in entries if e.rel.split("/")[-1].startswith(".") and e.rel not in SEAL_FILES]
    if hidden:
        raise PackageFormatError(f"{hidden[0]}: hidden files are not allowed in a package", path=str(root))
    data = render_checksums(hash_files(root, rels, jobs))
    _atomic_write(root / CHECKSUMS, data)
    return data


def sign(root: Path, key: Ed25519PrivateKey) -> str:
    """Sign the existing checksums.sha256; returns the signer's key id."""
    try:
        data = (root / CHECKSUMS).read_bytes()
    except FileNotFoundError:
        raise PackageFormatError("missing; run `calctl pack` first", path=CHECKSUMS) from None
    parse_checksums(data)
    _atomic_write(root / SIGNATURE, key.sign(data))
    return key_id(key.public_key())


def seal(root: Path, key: Ed25519PrivateKey, jobs: int | None = None) -> str:
    """Write checksums then the signature. Returns the signer key id."""
    sig = root / SIGNATURE
    if sig.exists():
        sig.unlink()  # a stale signature must never sit beside new checksums
    write_checksums(root, jobs)
    return sign(root, key)


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
    if (root / CHECKSUMS).is_symlink():
        report.findings.append(
            SealFinding("hash", CHECKSUMS, "is a symlink; the seal must be a regular file in the package")
        )
        return None
    try:
        raw = (root / CHECKSUMS).read_bytes()
    except FileNotFoundError:
        report.findings.append(SealFinding("hash", CHECKSUMS, "missing: the package is not sealed (run `calctl pack`)"))
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
            report.findings.append(SealFinding("hash", rel, f"is a {e.kind}; packages hold regular files only"))
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
    sig_path = root / SIGNATURE
    if sig_path.is_symlink() or (root / CHECKSUMS).is_symlink():
        report.findings.append(
            SealFinding("signature", SIGNATURE, "the seal files must be regular files, not symlinks")
        )
        return
    try:
        sig = sig_path.read_bytes()
    except FileNotFoundError:
        report.findings.append(SealFinding("signature", SIGNATURE, "missing: the package is unsigned"))
        return
    report.signature_present = True
    try:
        data = (root / CHECKSUMS).read_bytes()
    except FileNotFoundError:
        return  # already reported by verify_hashes
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
