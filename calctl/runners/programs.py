"""The programs a configured calbin hands the runtime, per chip, each checked against the sealed checksums.

The issue's "ran whatever was already loaded": a report lists the sha256 of every program (code and
command section) the runtime loads for this calbin, and whether it is the one the package sealed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calctl.errors import CalctlError
from calctl.package.model import SectionKind
from calctl.runtime import Calbin
from calctl.signing import seal
from calctl.signing.files import CHECKSUMS


@dataclass(frozen=True)
class ProgramDigest:
    """One program (code or command section) of the configured calbin, on one chip."""

    chip: int
    model: str
    graph: str
    section: str
    kind: str  # code | command
    calcore: int | None
    file: str
    sha256: str
    bytes: int
    sealed: bool  # equals the digest in the validated checksums.sha256


def program_digests(calbin: Calbin) -> tuple[ProgramDigest, ...]:
    """The sha256 of every program file the calbin's graphs load, per chip, from the calbin's own package root.

    These are the files the runtime loads for this calbin (the CalRT shim reads
    them from the same root), not whatever happens to be in a directory.
    """
    root = calbin.package.root
    try:
        sealed = seal.parse_checksums((root / CHECKSUMS).read_bytes())
    except (OSError, CalctlError):
        sealed = {}
    out: list[ProgramDigest] = []
    digests: dict[str, tuple[str, int]] = {}
    for gp in calbin.plan.graphs.values():
        for sec in gp.graph.sections:
            if sec.kind not in (SectionKind.CODE, SectionKind.COMMAND) or sec.file is None:
                continue
            if sec.file not in digests:
                data = (root / sec.file).read_bytes()
                digests[sec.file] = (hashlib.sha256(data).hexdigest(), len(data))
            digest, size = digests[sec.file]
            for chip in sec.chips:
                out.append(
                    ProgramDigest(
                        chip=chip,
                        model=gp.model,
                        graph=gp.name,
                        section=sec.name,
                        kind=sec.kind.value,
                        calcore=sec.calcore,
                        file=sec.file,
                        sha256=digest,
                        bytes=size,
                        sealed=sealed.get(sec.file) == digest,
                    )
                )
    return tuple(sorted(out, key=lambda p: (p.chip, p.graph, p.calcore if p.calcore is not None else -1, p.section)))


def programs_document(programs: Sequence[ProgramDigest]) -> list[dict[str, Any]]:
    """Per chip: the programs configured there (the report's ``programs``)."""
    chips: dict[int, list[dict[str, Any]]] = {}
    for p in programs:
        chips.setdefault(p.chip, []).append(
            {
                "model": p.model,
                "graph": p.graph,
                "section": p.section,
                "kind": p.kind,
                "calcore": p.calcore,
                "file": p.file,
                "sha256": p.sha256,
                "bytes": p.bytes,
                "sealed": p.sealed,
            }
        )
    return [{"chip": c, "programs": chips[c]} for c in sorted(chips)]


__all__ = ["ProgramDigest", "program_digests", "programs_document"]
