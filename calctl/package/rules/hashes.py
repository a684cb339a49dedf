"""Hash rules (HASH): checksums.sha256 lists every file and every listed file matches.

Hashing runs files in parallel and streams each in large chunks
(:meth:`ValidationContext.hashes`, :func:`calctl.signing.seal.sha256_file`).
Whether checksums.sha256 itself is authentic is SIG001.
"""

from __future__ import annotations

from collections.abc import Iterator

from calctl.package.rules.base import Finding, Need, Rule
from calctl.package.rules.context import EntryKind, ValidationContext
from calctl.signing import seal
from calctl.signing.files import CHECKSUMS, SEAL_FILES


class ListedFilesMatch(Rule):
    """checksums.sha256 parses, and every file it lists is present and has that SHA-256.

    checksums.sha256 is coreutils format (`sha256sum -c --strict` works inside the package), sorted, one line per file,
    never listing itself or the signature. Every listed file must be present, a regular file, and hash to the listed
    digest (001 §16 PR1: a bad hash is rejected before start-up). Files are hashed in parallel (--jobs) and streamed in
    8 MiB chunks, so memory stays flat for multi-GiB parameter blobs. A listed file over the size limit is not hashed
    and is reported as a skip (LAY005 fails it). Content rules (ELF, golden, tokenizer) parse only files that passed
    this check.
    """

    id = "HASH001"
    sections = ("docs/package-format.md", "001 §6.1", "001 §12 Phase 0 item 1", "001 §16 PR1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        state = ctx.checksums
        if state.listed is None:
            yield self.problem(str(state.error).removeprefix(f"{CHECKSUMS}: "), file=CHECKSUMS)
            return
        hashes = ctx.hashes
        for rel, want in state.listed.items():
            reason = ctx.hash_skip_reason(rel)
            if reason == "missing":
                yield self.problem("listed in checksums.sha256 but missing from the package", file=rel)
            elif reason is not None and reason.endswith("(LAY005)"):
                yield self.skip(f"not hashed: {reason}", file=rel)
            elif reason is not None:
                yield self.problem(f"listed in checksums.sha256 but {reason}", file=rel)
            elif rel in hashes.errors:
                yield self.problem(f"could not be hashed: {hashes.errors[rel]}", file=rel)
            elif hashes.digests[rel] != want:
                yield self.problem(
                    f"sha256 mismatch: checksums.sha256 says {want[:16]}…, the file has {hashes.digests[rel][:16]}…",
                    file=rel,
                    expected=want,
                    found=hashes.digests[rel],
                )
        jobs = ctx.policy.jobs or seal.default_jobs()
        yield self.note(f"{len(hashes.digests)} files, {hashes.bytes_hashed} bytes match ({jobs} hashing threads)")


class AllFilesListed(Rule):
    """Every regular file in the package (but the checksums and signature) is listed in checksums.sha256.

    A file that is not listed is not covered by the signature: a loader could read it although nobody signed it. Every
    regular file except checksums.sha256 and checksums.sha256.sig must be listed. Links and special files are LAY001's
    finding.
    """

    id = "HASH002"
    needs = frozenset({Need.ROOT, Need.CHECKSUMS})
    sections = ("docs/package-format.md", "001 §6.3")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        listed = ctx.checksums.listed
        assert listed is not None
        n = 0
        for e in ctx.walk.entries.values():
            if e.kind is not EntryKind.FILE or e.rel in SEAL_FILES:
                continue
            n += 1
            if e.rel not in listed:
                yield self.problem("present in the package but not listed in checksums.sha256", file=e.rel)
        yield self.note(f"all {n} files are listed")


RULES: tuple[type[Rule], ...] = (ListedFilesMatch, AllFilesListed)
