"""Layout and path-safety rules (LAY): what is in the package directory, not what it means.

A package is a tree of regular files with safe relative names (docs/package-format.md, 001
§6.3); these rules look at names, types and sizes only. Whether a listed file's
bytes are right is HASH; whether a referenced file exists is MAN007.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from calctl import textsafe
from calctl.package import reader, yamlsafe
from calctl.package.model import COMPATIBILITY, MANIFEST, PROVENANCE, RESERVED_INFO
from calctl.package.rules.base import Finding, PackageRule, Rule
from calctl.package.rules.context import EntryKind, ReadProblem, ValidationContext, path_problem, shown
from calctl.signing import seal
from calctl.signing.files import CHECKSUMS, SIGNATURE

#: Files every package carries at its top level (docs/package-format.md). The signature is SIG001's business.
REQUIRED_FILES = (MANIFEST, RESERVED_INFO, CHECKSUMS, COMPATIBILITY, PROVENANCE)
#: Package-level files that are not referenced from the manifest.
PACKAGE_LEVEL_FILES = frozenset({MANIFEST, RESERVED_INFO, CHECKSUMS, SIGNATURE, COMPATIBILITY, PROVENANCE})
#: model_memory_reserved_info.txt is a short text table.
RESERVED_INFO_MAX_BYTES = 1024 * 1024
#: Per-document ceilings of the strict parsers, checked before anything is parsed.
DOCUMENT_LIMITS = {
    MANIFEST: yamlsafe.DEFAULT_MAX_BYTES,
    COMPATIBILITY: reader.MAX_JSON_BYTES,
    PROVENANCE: reader.MAX_JSON_BYTES,
    CHECKSUMS: seal.MAX_CHECKSUM_FILE,
    RESERVED_INFO: RESERVED_INFO_MAX_BYTES,
}


class EntryTypes(Rule):
    """Every entry is a regular file or a directory: no symlinks, devices, FIFOs or sockets.

    A package holds regular files only. Every symlink is refused, whether it stays inside the package or leaves it (a
    link inside can be re-pointed after signing; a link outside makes the loader read unsigned host files). Device
    files, FIFOs and sockets are refused because reading them blocks or touches hardware. The validator never follows a
    link while walking or reading the package, and a directory it cannot list is reported, not silently ignored.
    """

    id = "LAY001"
    sections = ("docs/package-format.md", "001 §6.3", "001 §6.4")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        assert ctx.root is not None
        for rel, error in ctx.walk.errors:
            yield self.problem(f"cannot be listed or inspected: {error}", file=rel)
        count = 0
        for e in ctx.walk.entries.values():
            count += 1
            if e.kind is EntryKind.SYMLINK:
                target = e.target or "?"
                where = "leaves the package" if _link_leaves(ctx, e.rel, target) else "points inside the package"
                yield self.problem(
                    f"is a symlink to {target!r} ({where}); packages hold regular files only",
                    file=e.rel,
                    expected="regular file",
                    found="symlink",
                )
            elif e.kind not in (EntryKind.FILE, EntryKind.DIR):
                yield self.problem(
                    f"is a {e.kind.value}; packages hold regular files only",
                    file=e.rel,
                    expected="regular file",
                    found=e.kind.value,
                )
        yield self.note(f"{count} entries, all regular files or directories")


def _link_leaves(ctx: ValidationContext, rel: str, target: str) -> bool:
    assert ctx.root is not None
    if target.startswith("/"):
        return True
    depth = len(rel.split("/")) - 1
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


class PathSafety(Rule):
    """Every path (on disk, in checksums, manifest and provenance) is a safe relative POSIX path.

    Paths are package-relative POSIX names: no absolute paths, no '..', no empty or '.' components, no backslashes, no
    control characters (C0, DEL, C1) or Unicode line separators (U+2028, U+2029), valid UTF-8, bounded length: the rules
    of checksums.sha256, so every reader splits a name the same way. This covers the names on disk, the paths in
    checksums.sha256, every file the manifest names (sections, parameters, tokenizer, golden) and the provenance
    subjects, so no field can make a loader reach outside the package. Two names that differ only by case are refused
    too, and so are two names that differ only by Unicode normalisation ('café' as NFC and as NFD): on a
    case-insensitive or normalisation-insensitive file system (macOS, some archive extractors) they are one file.
    """

    id = "LAY002"
    sections = ("docs/package-format.md", "001 §6.3", "001 §10.4")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        assert ctx.root is not None
        checked = 0
        lower: dict[str, str] = {}
        for rel in ctx.walk.entries:
            checked += 1
            problem = path_problem(rel)
            if problem:
                yield self.problem(f"unsafe file name: {problem}", file=_printable(rel))
            other = lower.setdefault(textsafe.caseless(rel), rel)
            if other != rel:
                yield self.problem(
                    f"differs from {_printable(other)!r} only by letter case or Unicode normalisation (NFC/NFD)",
                    file=_printable(rel),
                )
        doc = ctx.manifest.doc
        if doc is not None:
            for pointer, value in _manifest_paths(doc, ""):
                checked += 1
                problem = path_problem(value) if isinstance(value, str) else None
                if problem:
                    yield self.problem(f"unsafe path {value!r}: {problem}", file=MANIFEST, field=pointer)
        prov = ctx.provenance.doc
        if prov is not None and isinstance(prov.get("subject"), list):
            for i, subject in enumerate(prov["subject"]):
                name = subject.get("name") if isinstance(subject, dict) else None
                if isinstance(name, str):
                    checked += 1
                    problem = path_problem(name)
                    if problem:
                        yield self.problem(
                            f"unsafe subject name {name!r}: {problem}", file=PROVENANCE, field=f"/subject/{i}/name"
                        )
        # checksums.sha256 lines with unsafe paths make it unparseable; HASH001 reports that line.
        yield self.note(f"{checked} paths are safe relative POSIX paths")


_printable = shown


def _manifest_paths(node: Any, pointer: str) -> Iterator[tuple[str, Any]]:
    """Every value under a ``file`` key, and the tokenizer ``config`` path, in a raw manifest document."""
    if isinstance(node, dict):
        for k, v in node.items():
            p = f"{pointer}/{k}"
            if k == "file" or (k == "config" and pointer.endswith("/tokenizer")):
                yield p, v
            else:
                yield from _manifest_paths(v, p)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _manifest_paths(v, f"{pointer}/{i}")


class HiddenFiles(Rule):
    """No hidden files or directories (a name starting with '.').

    Hidden entries (.DS_Store, .git, editor swap files, half-written '.tmp' files) are invisible in a normal listing and
    are refused by `calctl pack`, so a package containing one was not produced by the packer (001 §6.2 item 7: the
    combined package must come from the compiler/packer, not be assembled by hand).
    """

    id = "LAY003"
    sections = ("docs/package-format.md", "001 §6.3")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        n = 0
        for rel in ctx.walk.entries:
            n += 1
            if rel.split("/")[-1].startswith("."):
                yield self.problem("hidden file or directory", file=_printable(rel))
        yield self.note(f"no hidden entries among {n}")


class RequiredFiles(Rule):
    """The package-level files exist: manifest, reserved-memory info, checksums, compatibility, provenance.

    Every package carries manifest.yaml, model_memory_reserved_info.txt, checksums.sha256, compatibility.json and
    build-provenance.json at its top level (the 001 §6.3 directory contract plus the §15.1 deliverables: compatibility
    matrix, provenance, memory report). The detached signature checksums.sha256.sig is checked by SIG001, so that
    --allow-unsigned can downgrade it.
    """

    id = "LAY004"
    sections = ("docs/package-format.md", "001 §6.3", "001 §15.1 items 5-7")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        for name in REQUIRED_FILES:
            entry = ctx.entry(name)
            if entry is None:
                yield self.problem(f"required package file {name} is missing", file=name)
            elif entry.kind is not EntryKind.FILE:
                yield self.problem(
                    f"required package file {name} is a {entry.kind.value}, not a regular file", file=name
                )
        yield self.note(f"{len(REQUIRED_FILES)} package-level files checked: {', '.join(REQUIRED_FILES)}")


class SizeLimitsRule(Rule):
    """File sizes, total size and file count stay within the limits; small documents stay small.

    A single file may not exceed the per-file limit (default 64 GiB: the reference board package holds two ~8.5 GiB
    parameter blobs, 001 §3), the package may not exceed the total limit (256 GiB) or the file-count limit (10,000). The
    structured documents have their own small ceilings, checked before they are parsed: manifest.yaml 4 MiB,
    compatibility.json and build-provenance.json 16 MiB, checksums.sha256 64 MiB, model_memory_reserved_info.txt 1 MiB.
    A file over its limit is neither hashed nor parsed; HASH001 and the content rules say they skipped it.
    """

    id = "LAY005"
    sections = ("docs/package-format.md", "001 §3")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        limits = ctx.policy.limits
        files = ctx.walk.files
        total = sum(e.size for e in files)
        for e in files:
            if e.size > limits.max_file_bytes:
                yield self.problem(
                    "file is over the per-file size limit",
                    file=e.rel,
                    expected=f"<= {limits.max_file_bytes} bytes",
                    found=f"{e.size} bytes",
                )
        for name, limit in DOCUMENT_LIMITS.items():
            doc = ctx.entry(name)
            if doc is not None and doc.size > limit:
                yield self.problem(
                    "document is over its size limit",
                    file=name,
                    expected=f"<= {limit} bytes",
                    found=f"{doc.size} bytes",
                )
        if total > limits.max_total_bytes:
            yield self.problem(
                "package is over the total size limit",
                expected=f"<= {limits.max_total_bytes} bytes",
                found=f"{total} bytes",
            )
        if len(ctx.walk.entries) > limits.max_files:
            yield self.problem(
                "package has too many entries" + ("; the walk stopped there" if ctx.walk.truncated else ""),
                expected=f"<= {limits.max_files}",
                found=f"more than {limits.max_files}" if ctx.walk.truncated else len(ctx.walk.entries),
            )
        yield self.note(f"{len(files)} files, {total} bytes, all within limits")


class AccountedFiles(PackageRule):
    """Every file is a package-level file or is named by the manifest: no stray files.

    The manifest must account for everything a package ships (001 §10.4: nothing is found by guessing). A file that is
    neither a package-level file (manifest, reserved-memory info, checksums, signature, compatibility, provenance) nor
    named by a section, parameter tensor, tokenizer or golden entry is refused: it is either a leftover of a
    hand-assembled package or content a loader might pick up by name. Files the manifest names but that are absent are
    MAN007.
    """

    id = "LAY006"
    sections = ("docs/package-format.md", "001 §6.3", "001 §10.4")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        referenced = {r.rel for r in ctx.references}
        n = 0
        for e in ctx.walk.entries.values():
            if e.kind is EntryKind.DIR:
                continue
            n += 1
            if e.rel not in PACKAGE_LEVEL_FILES and e.rel not in referenced:
                yield self.problem("not named by the manifest and not a package-level file", file=_printable(e.rel))
        yield self.note(f"all {n} files are package-level or named by the manifest")


class ArchiveExtraction(Rule):
    """A packed package (.tar) extracts safely: no absolute, '..', link, device or oversized member.

    A .tar package is checked member by member before anything is written (calctl.package.archive): absolute names,
    '..', hard or symbolic links, devices and FIFOs, oversized members, duplicate members and corrupt archives are
    refused. When this fails nothing was extracted, so every other rule reports a skip naming LAY007. A directory
    package passes trivially.
    """

    id = "LAY007"
    needs = frozenset()
    sections = ("docs/package-format.md", "001 §6.3")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        if ctx.root is None:
            yield self.problem(f"the package archive was refused: {ctx.archive_error}", file=ctx.display)
            return
        if ctx.is_archive:
            yield self.note(f"archive extracted safely ({len(ctx.walk.entries)} entries)")
        else:
            yield self.note("a package directory, not an archive")


class TextLineEnds(Rule):
    """The package's text files end their lines with LF only, with no byte order mark.

    manifest.yaml, checksums.sha256, compatibility.json and build-provenance.json are read by people and their tools
    as much as by calctl (model_memory_reserved_info.txt too: MEM006 reads it by LF-only lines and names the line a
    stray CR breaks). A carriage return splits lines for a YAML or JSON parser
    (and for Python's ``str.splitlines``) but not for ``grep``, ``awk`` or ``sha256sum -c``: a CR-only manifest is one
    line to ``grep``, and a CR glued onto a line hides it from a line tool while a parser still reads it. A byte
    order mark is invisible in a pager and changes the first key's bytes. What a reviewer reads and what calctl
    checks must be the same lines, so each CR (the first named by line and byte offset) and a BOM are findings;
    `calctl pack` and the importer write LF only.
    """

    id = "LAY008"
    sections = ("docs/package-format.md", "001 §6.3")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        checked = []
        for name, limit in DOCUMENT_LIMITS.items():
            if name == RESERVED_INFO:
                continue  # MEM006's
            entry = ctx.entry(name)
            if entry is None or entry.kind is not EntryKind.FILE:
                continue  # LAY004 names a missing or non-regular package file
            try:
                raw = ctx.read_bytes(name, limit)
            except ReadProblem:
                continue  # LAY005 and each document's own rule name a file that cannot be read within its limit
            checked.append(name)
            if raw.startswith(b"\xef\xbb\xbf"):
                yield self.problem("starts with a UTF-8 byte order mark", file=name, expected="no byte order mark")
            cr = raw.find(b"\r")
            if cr >= 0:
                line = raw.count(b"\n", 0, cr) + 1
                count = raw.count(b"\r")
                kind = "CRLF line ends" if raw[cr + 1 : cr + 2] == b"\n" else "a carriage return"
                yield self.problem(
                    f"{kind} at line {line} (byte {cr}; {count} carriage return(s) in all): line tools and parsers "
                    "would read different lines",
                    file=name,
                    expected="lines ending in LF only",
                )
        yield self.note(f"LF-only line ends, no byte order mark: {', '.join(checked)}")


RULES: tuple[type[Rule], ...] = (
    EntryTypes,
    PathSafety,
    HiddenFiles,
    RequiredFiles,
    SizeLimitsRule,
    AccountedFiles,
    ArchiveExtraction,
    TextLineEnds,
)
