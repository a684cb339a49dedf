"""build-provenance.json against the package's files: is it stale, and refreshing it for a legitimate edit.

The provenance (an in-toto Statement with a SLSA provenance predicate, 001 §15.1 item 5) names every file of the
package with its SHA-256 (PROV002). A legitimate edit after the build (a corrected golden file, a new tokenizer
file) leaves those digests stale, and validate fails PROV002. ``calctl pack --refresh-provenance`` recomputes the
subjects and records the edit in the statement: who resealed it, when, with which key, and which subjects
changed (one ``runDetails.byproducts`` entry per reseal, so the history is kept). The build's own predicate
(builder, parameters) is never changed: the statement still says who built the package, and now also who edited
it after.

What this module does not do: sign or seal (calctl.signing.seal) or judge the package (the PROV rules).
"""

from __future__ import annotations

import getpass
import json
import socket
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from calctl import __version__, jsonsafe
from calctl.errors import PackageError
from calctl.package.model import PROVENANCE
from calctl.signing import seal
from calctl.signing.files import SEAL_FILES, read_regular

#: The largest provenance read, the figure of every JSON document in a package (``reader.MAX_JSON_BYTES``).
MAX_PROVENANCE_BYTES = 16 * 1024 * 1024

#: The name of a reseal's ``runDetails.byproducts`` entry.
RESEAL = "calctl pack --refresh-provenance"


@dataclass(frozen=True)
class Staleness:
    """How the provenance's subjects differ from the package's files now (empty: it describes this package)."""

    changed: tuple[str, ...] = ()  # a file whose digest differs
    missing: tuple[str, ...] = ()  # a file of the package the provenance does not name
    extra: tuple[str, ...] = ()  # a subject that is no file of the package

    def __bool__(self) -> bool:
        return bool(self.changed or self.missing or self.extra)

    def names(self) -> tuple[str, ...]:
        return self.changed + self.missing + self.extra

    def describe(self, limit: int = 3) -> str:
        """``2 changed (model-a/golden/prefill_logits.npy, ...), 1 not named (...)``."""
        parts = []
        for word, names in (("changed", self.changed), ("not named", self.missing), ("gone", self.extra)):
            if names:
                shown = ", ".join(names[:limit]) + (f", and {len(names) - limit} more" if len(names) > limit else "")
                parts.append(f"{len(names)} {word} ({shown})")
        return "; ".join(parts)


def _read(root: Path) -> dict[str, Any]:
    path = root / PROVENANCE
    try:  # bounded: bytes before reading, then depth and values (issue 54)
        doc = jsonsafe.loads(read_regular(path, MAX_PROVENANCE_BYTES))
    except (OSError, ValueError) as exc:  # NotReadable is an OSError
        raise PackageError(
            f"{path}: cannot read the provenance ({exc})", hint="validate names the PROV001 problem"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("subject"), list):
        raise PackageError(f"{path}: field 'subject': expected a list of subjects (PROV001)")
    return doc


def _current(root: Path, jobs: int | None) -> dict[str, str]:
    rels = [r for r in seal.sealed_files(root) if r not in SEAL_FILES and r != PROVENANCE]
    return seal.hash_files(root, rels, jobs)


def staleness(root: Path, jobs: int | None = None) -> Staleness:
    """How the provenance of ``root`` differs from its files (PackageError when it cannot be read)."""
    return _compare(_read(root), _current(root, jobs))


def _compare(doc: dict[str, Any], now: dict[str, str]) -> Staleness:
    named = {}
    for s in doc["subject"]:
        if isinstance(s, dict) and isinstance(s.get("digest"), dict):
            named[str(s.get("name"))] = s["digest"].get("sha256")
    return Staleness(
        changed=tuple(r for r in now if r in named and named[r] != now[r]),
        missing=tuple(r for r in now if r not in named),
        extra=tuple(r for r in named if r not in now),
    )


def resealer() -> str:
    """``user@host`` of the person resealing (what the provenance keeps as who)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry in a container
        user = "unknown"
    return f"{user}@{socket.gethostname() or 'unknown'}"


def refresh(root: Path, *, by: str, at: datetime, signer_key_id: str, jobs: int | None = None) -> Staleness:
    """Recompute the subjects of ``root``'s provenance from its files and record the reseal (who, when, key, which
    subjects changed); returns what was stale. The file is replaced atomically; the build's predicate stays."""
    from calctl.records import write_atomic

    doc = _read(root)
    now = _current(root, jobs)  # hashed once: a large package's files are read once for both
    stale = _compare(doc, now)
    doc["subject"] = [{"name": r, "digest": {"sha256": d}} for r, d in now.items()]
    predicate = doc.setdefault("predicate", {})
    run = predicate.setdefault("runDetails", {}) if isinstance(predicate, dict) else {}
    if isinstance(run, dict):
        kept = run.get("byproducts")
        byproducts: list[Any] = kept if isinstance(kept, list) else []
        byproducts.append(
            {
                "name": RESEAL,
                "annotations": {
                    "resealedBy": by,
                    "resealedOn": at.isoformat(timespec="seconds"),
                    "signerKeyId": signer_key_id,
                    "calctlVersion": __version__,
                    "changedSubjects": list(stale.names()),
                },
            }
        )
        run["byproducts"] = byproducts
    write_atomic(root / PROVENANCE, json.dumps(doc, indent=2) + "\n")
    return stale


__all__ = ["RESEAL", "Staleness", "refresh", "resealer", "staleness"]
