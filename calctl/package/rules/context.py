"""Facts about one package that the rules share, computed once and lazily.

:class:`ValidationContext` walks the package without following links, parses the
manifest strictly, parses ``checksums.sha256``, hashes every listed file in
parallel (streaming, :func:`calctl.signing.seal.sha256_file`), reads
``compatibility.json`` and ``build-provenance.json``, and parses ELF programs
into plain values. Each fact records its own failure instead of raising, so a
rule can say *why* it skips ("HASH001 failed for this file").

Two trust boundaries are kept here, in one place:

* nothing is read through a symlink or from a non-regular file (001 §6.3: a
  package is regular files only), and reads are size-capped;
* bytes are handed to third-party parsers (pyelftools, numpy, tokenizers) only
  after their SHA-256 matched ``checksums.sha256`` (:meth:`content_gate`).
  The hardened YAML/JSON/line parsers of calctl read the small structured
  documents regardless, so their own findings are reported too.

This module makes no verdicts: rules do.
"""

from __future__ import annotations

import enum
import functools
import os
import stat
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from calctl import textsafe
from calctl.errors import CalctlError
from calctl.filekind import kind_name
from calctl.package import npy, reader, schemas, tokenizer_file
from calctl.package.elfdefs import (
    PN_XNUM,
    PT_NOTE,
)
from calctl.package.model import COMPATIBILITY, MANIFEST, PROVENANCE, Package, package_from_document
from calctl.package.rules.base import Need
from calctl.signing import seal
from calctl.signing.files import CHECKSUMS, SIGNATURE, NotReadable, read_regular
from calctl.signing.keys import TrustedKey

if TYPE_CHECKING:  # pragma: no cover - typing only
    from calctl.package.validate import ValidationPolicy

#: Longest relative path / path component accepted (POSIX NAME_MAX, and a sane total).
MAX_PATH_CHARS = 1024
MAX_COMPONENT_BYTES = 255
#: Largest ELF program the validator parses, and largest PT_NOTE it reads.
MAX_ELF_BYTES = 1024 * 1024**2
MAX_NOTE_BYTES = 1024 * 1024
SIGNATURE_MAX_BYTES = 4096
MAX_TOKENIZER_BYTES = tokenizer_file.MAX_TOKENIZER_BYTES
NPY_READ_WHOLE_BYTES = 64 * 1024**2


def crash_types() -> tuple[type[BaseException], ...]:
    """What a rule or a parser may raise on hostile input that is not an interrupt: any Exception, and the Rust
    panic of a pyo3 extension (tokenizers), ``pyo3_runtime.PanicException``, which derives from BaseException.

    Call it in the ``except`` clause: the clause is evaluated once the exception exists, so the panic types of
    every extension loaded by then are there; Ctrl-C, SIGTERM (KeyboardInterrupt) and SystemExit never are.
    """
    return (Exception, *(t for t in BaseException.__subclasses__() if t.__module__ == "pyo3_runtime"))


class EntryKind(str, enum.Enum):
    FILE = "regular file"
    DIR = "directory"
    SYMLINK = "symlink"
    FIFO = "FIFO"
    SOCKET = "socket"
    CHAR_DEVICE = "character device"
    BLOCK_DEVICE = "block device"
    OTHER = "special file"


def _kind_of(mode: int) -> EntryKind:
    return EntryKind(kind_name(mode))  # the values are calctl.filekind's kind names


@dataclass(frozen=True)
class Entry:
    """One thing under the package root (never followed if a link)."""

    rel: str
    kind: EntryKind
    size: int
    target: str | None = None  # symlink target, as stored


@dataclass(frozen=True)
class Walk:
    entries: dict[str, Entry]
    errors: tuple[tuple[str, str], ...]  # (relative dir, OS error) for directories that could not be listed
    #: The walk stopped past the entry limit (LAY005): the rules look at no more than that many entries.
    truncated: bool = False

    @property
    def files(self) -> list[Entry]:
        return [e for e in self.entries.values() if e.kind is EntryKind.FILE]


@dataclass(frozen=True)
class ManifestState:
    doc: dict[str, Any] | None = None
    parse_error: str | None = None
    schema_errors: tuple[tuple[str, str], ...] = ()
    package: Package | None = None
    build_error: str | None = None


@dataclass(frozen=True)
class JsonState:
    doc: dict[str, Any] | None = None
    parse_error: str | None = None
    schema_errors: tuple[tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        return self.doc is not None and not self.schema_errors


@dataclass(frozen=True)
class ChecksumState:
    listed: dict[str, str] | None = None
    error: str | None = None


@dataclass(frozen=True)
class HashState:
    digests: dict[str, str] = field(default_factory=dict)  # rel -> sha256 of the file as found
    errors: dict[str, str] = field(default_factory=dict)  # rel -> why it could not be hashed
    bytes_hashed: int = 0


@dataclass(frozen=True)
class SignatureState:
    signer: TrustedKey | None = None
    problem: str | None = None


@dataclass(frozen=True)
class FileReference:
    """A file the manifest names, and where (JSON-pointer-like) it names it."""

    rel: str
    pointer: str
    model: str


@dataclass(frozen=True)
class ElfSegment:
    index: int
    type: int
    flags: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int


@dataclass(frozen=True)
class ElfNote:
    name: str
    type: int
    desc: bytes


@dataclass(frozen=True)
class ElfInfo:
    """The parts of an ELF program the rules look at, as plain values."""

    elf_class: str  # "ELF32" | "ELF64"
    data: str  # "little" | "big"
    machine: int
    machine_name: str
    e_type: str
    entry: int
    segments: tuple[ElfSegment, ...]
    notes: tuple[ElfNote, ...]
    file_size: int
    headers: ElfHeaderTables = field(default_factory=lambda: ElfHeaderTables())


@dataclass(frozen=True)
class ElfSectionHeader:
    index: int
    type: int
    offset: int
    size: int


@dataclass(frozen=True)
class ElfHeaderTables:
    """Where the ELF header says its program and section header tables are (raw e_* fields)."""

    phoff: int = 0
    phnum: int = 0
    phentsize: int = 0
    shoff: int = 0
    shnum: int = 0
    shentsize: int = 0
    shstrndx: int = 0
    #: The section headers, when the table lies inside the file (else empty).
    sections: tuple[ElfSectionHeader, ...] = ()


#: More section headers than this is not a CalCore program (the sample has 4); nor more program headers (2).
MAX_SECTION_HEADERS = 4096
MAX_PROGRAM_HEADERS = 4096


def path_problem(rel: str) -> str | None:
    """Why ``rel`` is not a safe package-relative POSIX path, or None (001 §6.3).

    The checksums.sha256 rules (:func:`calctl.signing.seal.checksum_line_problem`:
    no control or line-separator characters, no backslash, canonical, UTF-8)
    plus the file-system length limits.
    """
    problem = seal.checksum_line_problem(rel)
    if problem:
        return problem
    if len(rel) > MAX_PATH_CHARS:
        return f"longer than {MAX_PATH_CHARS} characters"
    if any(len(p.encode("utf-8")) > MAX_COMPONENT_BYTES for p in rel.split("/")):
        return f"a component is longer than {MAX_COMPONENT_BYTES} bytes"
    return None


def shown(rel: str) -> str:
    """A file name as every message prints it: undecodable bytes as ``\\xNN``, the same everywhere."""
    return printable(rel) if rel else "(empty)"


def printable(text: str) -> str:
    """``text`` safe to show anywhere (calctl.textsafe.plain): undecodable bytes (os's surrogateescape) as
    ``\\xNN``, other lone surrogates as ``\\udNNN``, control and bidi characters escaped (``\\x1b``)."""
    return textsafe.plain(text)


def _walk(root: Path, limit: int) -> Walk:
    """Every entry under ``root``, not following links; stops once past ``limit`` entries (LAY005 fails it)."""
    entries: dict[str, Entry] = {}
    errors: list[tuple[str, str]] = []
    stack: list[tuple[Path, str]] = [(root, "")]
    truncated = False
    while stack and not truncated:
        directory, prefix = stack.pop()
        try:
            with os.scandir(directory) as it:
                children = list(it)
        except OSError as exc:
            errors.append((prefix or ".", exc.strerror or str(exc)))
            continue
        for child in children:
            if len(entries) > limit:
                truncated = True
                break
            rel = f"{prefix}{child.name}"
            try:
                st = child.stat(follow_symlinks=False)
            except OSError as exc:
                errors.append((rel, exc.strerror or str(exc)))
                continue
            kind = _kind_of(st.st_mode)
            target = None
            if kind is EntryKind.SYMLINK:
                try:
                    target = os.readlink(child.path)
                except OSError:
                    target = None
            entries[rel] = Entry(rel, kind, st.st_size if kind is EntryKind.FILE else 0, target)
            if kind is EntryKind.DIR:
                stack.append((Path(child.path), rel + "/"))
    ordered = dict(sorted(entries.items(), key=lambda kv: kv[0].encode("utf-8", "surrogateescape")))
    return Walk(ordered, tuple(errors), truncated)


class ReadProblem(Exception):
    """A package file could not be read safely; the message says why."""


class ValidationContext:
    """Everything the rules may ask about one package. Facts are computed on first use."""

    def __init__(
        self,
        root: Path | None,
        *,
        display: str,
        policy: ValidationPolicy,
        archive_error: str | None = None,
        is_archive: bool = False,
    ) -> None:
        self.root = root
        self.display = display
        self.policy = policy
        self.archive_error = archive_error
        self.is_archive = is_archive

    # -- walking and reading ---------------------------------------------------

    @functools.cached_property
    def walk(self) -> Walk:
        assert self.root is not None
        return _walk(self.root, self.policy.limits.max_files)

    def entry(self, rel: str) -> Entry | None:
        return self.walk.entries.get(rel)

    def read_bytes(self, rel: str, limit: int) -> bytes:
        """Read a regular file of the package, never through a link, at most ``limit`` bytes."""
        return self._read(rel, limit, head=False)

    def read_head(self, rel: str, n: int) -> bytes:
        """The first ``n`` bytes of a regular package file (fewer if it is shorter), never through a link."""
        return self._read(rel, n, head=True)

    def _read(self, rel: str, n: int, *, head: bool) -> bytes:
        """``rel`` if it is a safe path to a regular file of the walk (at most ``n`` bytes unless ``head``): its
        first ``n`` bytes; else a ReadProblem saying why."""
        problem = path_problem(rel)
        if problem:
            raise ReadProblem(f"unsafe path ({problem})")
        e = self.entry(rel)
        if e is None:
            raise ReadProblem("missing")
        if e.kind is not EntryKind.FILE:
            raise ReadProblem(f"is a {e.kind.value}, not a regular file")
        if not head and e.size > n:
            raise ReadProblem(f"is {e.size} bytes, over the {n} byte limit for this file")
        assert self.root is not None
        try:
            return read_regular(self.root / rel, n, head=head)
        except NotReadable as exc:
            raise ReadProblem(exc.reason) from None

    def regular_file(self, rel: str) -> bool:
        e = self.entry(rel) if path_problem(rel) is None else None
        return e is not None and e.kind is EntryKind.FILE

    # -- manifest --------------------------------------------------------------

    @functools.cached_property
    def manifest(self) -> ManifestState:
        assert self.root is not None
        e = self.entry(MANIFEST)
        if e is None:
            return ManifestState(parse_error="manifest.yaml is missing")
        if e.kind is not EntryKind.FILE:
            return ManifestState(parse_error=f"manifest.yaml is a {e.kind.value}, not a regular file")
        try:
            doc = reader.read_manifest_document(self.root)
        except CalctlError as exc:
            return ManifestState(parse_error=str(exc))
        errors = tuple(reader.manifest_errors(doc))
        if errors:
            return ManifestState(doc=doc, schema_errors=errors)
        try:
            pkg = package_from_document(self.root, doc)
        except Exception as exc:  # schema-valid but not buildable: reported by MAN001
            return ManifestState(doc=doc, build_error=f"{type(exc).__name__}: {exc}")
        return ManifestState(doc=doc, package=pkg)

    @property
    def package(self) -> Package | None:
        return self.manifest.package if self.root is not None else None

    @property
    def pkg(self) -> Package:
        """The typed Package, for a rule that needs :attr:`Need.MANIFEST` (the runner skips it otherwise)."""
        pkg = self.package
        assert pkg is not None, "a rule read the manifest without Need.MANIFEST"
        return pkg

    # -- checksums and hashes --------------------------------------------------

    @functools.cached_property
    def checksums(self) -> ChecksumState:
        try:
            raw = self.read_bytes(CHECKSUMS, seal.MAX_CHECKSUM_FILE)
        except ReadProblem as exc:
            return ChecksumState(error=f"checksums.sha256 {exc}")
        try:
            return ChecksumState(listed=seal.parse_checksums(raw))
        except CalctlError as exc:
            return ChecksumState(error=str(exc))

    def hash_skip_reason(self, rel: str) -> str | None:
        """Why a listed file is not hashed at all (it is then never trusted)."""
        e = self.entry(rel)
        if e is None:
            return "missing"
        if e.kind is not EntryKind.FILE:
            return f"is a {e.kind.value} (LAY001)"
        if e.size > self.policy.limits.max_file_bytes:
            return f"is {e.size} bytes, over the {self.policy.limits.max_file_bytes} byte limit (LAY005)"
        return None

    @functools.cached_property
    def hashes(self) -> HashState:
        """SHA-256 of every listed, present, regular file within the size limit; parallel, largest first."""
        listed = self.checksums.listed or {}
        todo = [rel for rel in listed if self.hash_skip_reason(rel) is None]
        todo.sort(key=lambda r: -self.walk.entries[r].size)
        assert self.root is not None
        root = self.root

        def one(rel: str, stop: threading.Event) -> tuple[str, str | None, str | None]:
            try:
                return rel, seal.sha256_file(root / rel, stop), None
            except OSError as exc:
                return rel, None, f"cannot read: {exc.strerror or exc}"

        digests: dict[str, str] = {}
        errors: dict[str, str] = {}
        jobs = self.policy.jobs or seal.default_jobs()
        # stoppable: a SIGINT while a worker hashes a 64 GiB file ends it within a chunk, not at the file's end
        for rel, digest, error in seal.stoppable_map(one, todo, jobs):
            if digest is not None:
                digests[rel] = digest
            else:
                errors[rel] = error or "unreadable"
        total = sum(self.walk.entries[r].size for r in digests)
        return HashState(digests=digests, errors=errors, bytes_hashed=total)

    def content_gate(self, rel: str) -> str | None:
        """None when ``rel`` is a regular file whose SHA-256 matched ``checksums.sha256``; else why not.

        Content checks (ELF, golden, tokenizer) only parse verified bytes, so a
        mutated file is reported by HASH001 and its content checks say they skipped.
        """
        problem = path_problem(rel)
        if problem:
            return f"the path is unsafe ({problem}, LAY002)"
        e = self.entry(rel)
        if e is None:
            return "the file is missing (MAN007)"
        if e.kind is not EntryKind.FILE:
            return f"the file is a {e.kind.value} ({'MAN007' if e.kind is EntryKind.DIR else 'LAY001'})"
        if e.size > self.policy.limits.max_file_bytes:
            return "the file is over the size limit (LAY005)"
        listed = self.checksums.listed
        if listed is None:
            return "checksums.sha256 is missing or unparseable (HASH001)"
        if rel not in listed:
            return "the file is not listed in checksums.sha256 (HASH002)"
        digest = self.hashes.digests.get(rel)
        if digest is None:
            return f"HASH001 failed for this file ({self.hashes.errors.get(rel, 'not hashed')})"
        if digest != listed[rel]:
            return "HASH001 failed for this file (sha256 mismatch)"
        return None

    # -- signature -------------------------------------------------------------

    @functools.cached_property
    def signature(self) -> SignatureState:
        """Ed25519 over the exact bytes of checksums.sha256 by a trusted key (001 §6.3, 000 §11 step 2)."""
        from cryptography.exceptions import InvalidSignature

        try:
            sig = self.read_bytes(SIGNATURE, SIGNATURE_MAX_BYTES)
        except ReadProblem as exc:
            text = "missing: the package is unsigned" if str(exc) == "missing" else str(exc)
            return SignatureState(problem=f"checksums.sha256.sig {text}")
        if len(sig) != 64:
            return SignatureState(
                problem=f"checksums.sha256.sig is {len(sig)} bytes, expected a 64-byte raw Ed25519 signature"
            )
        try:
            data = self.read_bytes(CHECKSUMS, seal.MAX_CHECKSUM_FILE)
        except ReadProblem as exc:
            return SignatureState(problem=f"nothing to verify: checksums.sha256 {exc}")
        keys = self.policy.trust.keys
        if not keys:
            return SignatureState(problem="no trusted keys given (use --trusted-key PUB or CALCTL_TRUSTED_KEYS)")
        for tk in keys:
            try:
                tk.key.verify(sig, data)
            except InvalidSignature:
                continue
            return SignatureState(signer=tk)
        ids = ", ".join(f"{k.key_id} ({k.source})" for k in keys)
        return SignatureState(
            problem=f"does not verify with any trusted key (tried {ids}): signed by another key, "
            "or checksums.sha256 changed after signing"
        )

    # -- what the manifest refers to ---------------------------------------------

    @functools.cached_property
    def references(self) -> tuple[FileReference, ...]:
        """Every file the typed manifest names, with the pointer that names it."""
        pkg = self.package
        if pkg is None:
            return ()
        refs: list[FileReference] = []
        for m in pkg.models:
            for s in m.all_sections():
                if s.file is not None:
                    refs.append(FileReference(s.file, f"{s.pointer}/file", m.alias))
            for i, t in enumerate(m.params):
                refs.append(FileReference(t.file, f"{m.pointer}/params/tensors/{i}/file", m.alias))
            refs.append(FileReference(m.tokenizer.file, f"{m.pointer}/tokenizer/file", m.alias))
            if m.tokenizer.config is not None:
                refs.append(FileReference(m.tokenizer.config, f"{m.pointer}/tokenizer/config", m.alias))
            for key in ("prompt", "prefill_logits", "decode_tokens"):
                refs.append(FileReference(getattr(m.golden, key).file, f"{m.pointer}/golden/{key}/file", m.alias))
        return tuple(refs)

    # -- loaded content (verified bytes only) -------------------------------------

    def _memo(self, kind: str, rel: str, load: Any) -> Any:
        cache: dict[tuple[str, str], Any] = self.__dict__.setdefault("_content_cache", {})
        key = (kind, rel)
        if key not in cache:
            try:
                cache[key] = load(rel)
            except crash_types() as exc:  # third-party parsers raise anything (even pyo3 panics)
                text = str(exc).splitlines()[0][:300] if str(exc) else ""
                cache[key] = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        return cache[key]

    def npy(self, rel: str) -> Any:
        """A verified ``.npy`` file as an array (memory-mapped when large), or why it does not load."""
        assert self.root is not None
        root = self.root

        def load(r: str) -> Any:
            # Small files are read whole (clear numpy errors, e.g. for pickled objects); big ones mapped.
            mmap: Literal["r"] | None = "r" if self.walk.entries[r].size > NPY_READ_WHOLE_BYTES else None
            return npy.load(root / r, mmap_mode=mmap)

        return self._memo("npy", rel, load)

    def tokenizer(self, rel: str) -> Any:
        """A verified ``tokenizer.json`` loaded with ``tokenizers.Tokenizer.from_buffer``, or why not."""
        from tokenizers import Tokenizer

        def load(r: str) -> Any:
            e = self.walk.entries[r]
            if e.size > MAX_TOKENIZER_BYTES:
                raise ReadProblem(f"is {e.size} bytes, over the {MAX_TOKENIZER_BYTES} byte limit for tokenizers")
            # Read by Python (never through a link, any path bytes), not by the library: tokenizers' from_file
            # takes a UTF-8 str and fails on a directory name that is not UTF-8.
            data = self.read_bytes(r, MAX_TOKENIZER_BYTES)
            # The largest vocabulary a model using this file declares (the schema holds it within the table).
            declared = [m.architecture.vocab_size for m in self.pkg.models if m.tokenizer.file == r]
            try:  # the library's cost bounded, by the model's own size, before it sees the bytes (issue 54)
                tokenizer_file.check(data, max(declared) if declared else None)
            except tokenizer_file.TokenizerRefused as exc:
                raise ReadProblem(str(exc)) from None
            return Tokenizer.from_buffer(data)

        return self._memo("tokenizer", rel, load)

    # -- JSON side documents ---------------------------------------------------

    def _json(self, name: str, schema: str) -> JsonState:
        e = self.entry(name)
        if e is None:
            return JsonState(parse_error=f"{name} is missing")
        if e.kind is not EntryKind.FILE:
            return JsonState(parse_error=f"{name} is a {e.kind.value}, not a regular file")
        assert self.root is not None
        try:
            doc = reader.read_json_document(self.root, name)
        except CalctlError as exc:
            return JsonState(parse_error=str(exc))
        return JsonState(doc=doc, schema_errors=tuple(schemas.iter_errors(schema, doc)))

    @functools.cached_property
    def compatibility(self) -> JsonState:
        return self._json(COMPATIBILITY, "calculet-compatibility/v1")

    @functools.cached_property
    def provenance(self) -> JsonState:
        return self._json(PROVENANCE, "build-provenance/v1")

    # -- ELF -------------------------------------------------------------------

    def elf(self, rel: str) -> ElfInfo | str:
        """Parse a verified ELF program once; returns the parsed values or why it does not parse."""
        cache: dict[str, ElfInfo | str] = self.__dict__.setdefault("_elf_cache", {})
        if rel not in cache:
            cache[rel] = self._parse_elf_file(rel)
        return cache[rel]

    def _parse_elf_file(self, rel: str) -> ElfInfo | str:
        assert self.root is not None
        e = self.walk.entries[rel]
        if e.size > MAX_ELF_BYTES:
            return f"larger than the {MAX_ELF_BYTES} byte limit for programs"
        try:
            fd = os.open(self.root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            return f"cannot open: {exc.strerror or exc}"
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced after the walk: never read a FIFO
                return "is no longer a regular file"
            os.set_blocking(fd, True)
            try:
                return _parse_elf(fh, e.size)
            except Exception as exc:  # pyelftools raises many types on malformed input
                return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    # -- prerequisites ---------------------------------------------------------

    def unmet(self, needs: frozenset[Need]) -> str | None:
        """The reason a rule with these needs must skip, or None."""
        if self.root is None:
            if not needs:
                return None
            return f"the package archive was refused (LAY007: {self.archive_error})"
        if Need.MANIFEST in needs and self.package is None:
            m = self.manifest
            if m.parse_error:
                return f"manifest failed MAN001 ({m.parse_error})"
            if m.schema_errors:
                return f"manifest failed MAN001 schema check ({len(m.schema_errors)} error(s))"
            return f"manifest failed MAN001 ({m.build_error})"
        if Need.CHECKSUMS in needs and self.checksums.listed is None:
            return f"checksums.sha256 is missing or unparseable (HASH001: {self.checksums.error})"
        if Need.COMPATIBILITY in needs and not self.compatibility.ok:
            return "compatibility.json failed COMP001"
        if Need.PROVENANCE in needs and not self.provenance.ok:
            return "build-provenance.json failed PROV001"
        return None


def _parse_elf(fh: Any, size: int) -> ElfInfo:
    from elftools.elf.elffile import ELFFile
    from elftools.elf.enums import ENUM_E_MACHINE

    elf = ELFFile(fh)
    machine_raw = elf.header["e_machine"]
    if isinstance(machine_raw, str):
        machine = int(ENUM_E_MACHINE.get(machine_raw, -1))
        machine_name = machine_raw
    else:
        machine = int(machine_raw)
        machine_name = next((k for k, v in ENUM_E_MACHINE.items() if v == machine and k != "_default_"), str(machine))
    little = bool(elf.little_endian)
    segments: list[ElfSegment] = []
    notes: list[ElfNote] = []
    hdr = elf.header
    phnum = _program_header_count(elf, size)
    ph_fits = (
        phnum <= MAX_PROGRAM_HEADERS
        and int(hdr["e_phentsize"]) == (56 if elf.elfclass == 64 else 32)
        and int(hdr["e_phoff"]) + phnum * int(hdr["e_phentsize"]) <= size
    )
    note_budget = MAX_NOTE_BYTES
    # Only a table the file can hold is read (ELF001 reports one it cannot): e_phnum = PN_XNUM takes the count
    # from section 0's sh_info, up to 2**32-1, and pyelftools would read that many headers from anywhere.
    for i in range(phnum if ph_fits else 0):
        # The header only: get_segment() would build Dynamic/Interp objects that read more data.
        h = elf._get_segment_header(i)
        ptype = h["p_type"]
        ptype_num = _PT_NUM.get(ptype, -1) if isinstance(ptype, str) else int(ptype)
        seg = ElfSegment(
            index=i,
            type=ptype_num,
            flags=int(h["p_flags"]),
            offset=int(h["p_offset"]),
            vaddr=int(h["p_vaddr"]),
            filesz=int(h["p_filesz"]),
            memsz=int(h["p_memsz"]),
        )
        segments.append(seg)
        if seg.type == PT_NOTE and seg.filesz <= note_budget and seg.offset + seg.filesz <= size:
            note_budget -= seg.filesz  # all notes together, not each: a table of 4096 notes reads at most this
            fh.seek(seg.offset)
            notes.extend(_parse_notes(fh.read(seg.filesz), little))
    shoff, shnum, shentsize = int(hdr["e_shoff"]), int(hdr["e_shnum"]), int(hdr["e_shentsize"])
    sections: list[ElfSectionHeader] = []
    if (
        0 < shnum <= MAX_SECTION_HEADERS
        and shoff + shnum * shentsize <= size
        and shentsize == (64 if elf.elfclass == 64 else 40)
    ):
        for i in range(shnum):
            sh = elf._get_section_header(i)
            sh_type = sh["sh_type"]
            type_num = _SHT_NUM.get(sh_type, -1) if isinstance(sh_type, str) else int(sh_type)
            sections.append(ElfSectionHeader(i, type_num, int(sh["sh_offset"]), int(sh["sh_size"])))
    tables = ElfHeaderTables(
        phoff=int(hdr["e_phoff"]),
        phnum=phnum,
        phentsize=int(hdr["e_phentsize"]),
        shoff=shoff,
        shnum=shnum,
        shentsize=shentsize,
        shstrndx=int(hdr["e_shstrndx"]),
        sections=tuple(sections),
    )
    return ElfInfo(
        headers=tables,
        elf_class=f"ELF{elf.elfclass}",
        data="little" if little else "big",
        machine=machine,
        machine_name=machine_name,
        e_type=str(elf.header["e_type"]),
        entry=int(elf.header["e_entry"]),
        segments=tuple(segments),
        notes=tuple(notes),
        file_size=size,
    )


def _program_header_count(elf: Any, size: int) -> int:
    """e_phnum, or with PN_XNUM (0xffff) section 0's sh_info, read only if section 0 lies inside the file."""
    hdr = elf.header
    phnum = int(hdr["e_phnum"])
    if phnum < PN_XNUM:
        return phnum
    shoff, shentsize = int(hdr["e_shoff"]), int(hdr["e_shentsize"])
    if shoff == 0 or shentsize != (64 if elf.elfclass == 64 else 40) or shoff + shentsize > size:
        return phnum  # no section 0 to take the count from: the 0xffff entries are what the header says
    return int(elf._get_section_header(0)["sh_info"])


def _pt_numbers() -> dict[str, int]:
    from elftools.elf import enums

    out: dict[str, int] = {}
    for name in dir(enums):
        if name.startswith("ENUM_P_TYPE"):
            out.update({k: v for k, v in getattr(enums, name).items() if isinstance(v, int)})
    return out


_PT_NUM = _pt_numbers()


def _sht_numbers() -> dict[str, int]:
    from elftools.elf import enums

    return {k: v for k, v in enums.ENUM_SH_TYPE_BASE.items() if isinstance(v, int)}


_SHT_NUM = _sht_numbers()


def _parse_notes(data: bytes, little: bool) -> Iterator[ElfNote]:
    fmt = "<III" if little else ">III"
    off = 0
    while off + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from(fmt, data, off)
        off += 12
        name_end = off + namesz
        desc_off = off + namesz + (-namesz % 4)
        desc_end = desc_off + descsz
        if desc_end > len(data):
            return
        name = data[off:name_end].rstrip(b"\0").decode("ascii", "replace")
        yield ElfNote(name=name, type=ntype, desc=data[desc_off:desc_end])
        off = desc_end + (-descsz % 4)
