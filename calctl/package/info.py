"""Summaries of a package for ``calctl inspect`` and for every report's header.

The package digest is the SHA-256 of ``checksums.sha256``: it commits to every
file, so reports can name exactly what ran.

``inspect`` shows a package without validating it, as ``docker inspect`` or
``cosign tree`` show what they are given: every read is bounded (the manifest by
the reader's YAML and schema limits, the file listing by :data:`MAX_LISTED`,
the signature by its size), and the summary says what was checked
(``verification``: the signature over ``checksums.sha256`` and which key, if
any, verifies it) and what was not (file contents are never hashed here:
``calctl verify`` or ``validate`` does that). This module prints nothing.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from calctl.package import archive
from calctl.package.model import Package
from calctl.signing import seal
from calctl.signing.files import CHECKSUMS, NotReadable, read_regular
from calctl.signing.policy import TrustPolicy


def package_digest(root: Path) -> str | None:
    """SHA-256 of checksums.sha256, or None when it is missing or not a readable regular file."""
    try:
        return hashlib.sha256(read_regular(root / CHECKSUMS, seal.MAX_CHECKSUM_FILE)).hexdigest()
    except NotReadable:
        return None


def signer_of(root: Path, policy: TrustPolicy) -> str | None:
    """Key id of the trusted key that verifies the signature, or None."""
    report = seal.SealReport()
    seal.verify_signature(root, list(policy.keys), report)
    return report.signer.key_id if report.signer else None


#: Entries ``inspect`` lists at most: the most a package may hold (``validate``'s LAY005 figure).
MAX_LISTED = archive.MAX_MEMBERS


def _listing(root: Path) -> tuple[list[dict[str, Any]], bool]:
    """The package's entries (not directories), at most :data:`MAX_LISTED`, and whether the walk stopped there."""
    files: list[dict[str, Any]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(filenames) + [d for d in dirnames if (base / d).is_symlink()]:
            if len(files) >= MAX_LISTED:
                return files, True
            p = base / name
            try:
                st = p.lstat()
            except OSError:
                files.append({"path": p.relative_to(root).as_posix(), "bytes": 0, "type": "unreadable"})
                continue
            kind = "symlink" if stat.S_ISLNK(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "special"
            size = st.st_size if kind == "file" else 0
            files.append({"path": p.relative_to(root).as_posix(), "bytes": size, "type": kind})
    files.sort(key=lambda f: str(f["path"]).encode("utf-8", "surrogateescape"))
    return files, False


def describe(pkg: Package, policy: TrustPolicy) -> dict[str, Any]:
    files, truncated = _listing(pkg.root)
    chips = []
    for chip in sorted({r.chip for r in pkg.memory_plan}):
        regions = pkg.regions_on(chip)
        chips.append(
            {
                "chip": chip,
                "dram_bytes": pkg.device_cfg.chip_dram_bytes,
                "reserved_bytes": sum(r.size for r in regions),
                "regions": [
                    {
                        "name": r.name,
                        "owner": r.owner,
                        "kind": r.kind.value,
                        "vaddr": f"0x{r.vaddr:x}",
                        "size": r.size,
                        "writable": r.writable,
                    }
                    for r in sorted(regions, key=lambda r: r.vaddr)
                ],
            }
        )
    models = []
    for m in pkg.models:
        a = m.architecture
        models.append(
            {
                "alias": m.alias,
                "name": m.name,
                "chip_mode": m.chip_mode.value,
                "target_chips": list(m.target_chips),
                "architecture": {
                    "family": a.family,
                    "n_layers": a.n_layers,
                    "d_model": a.d_model,
                    "n_heads": a.n_heads,
                    "n_kv_heads": a.n_kv_heads,
                    "head_dim": a.head_dim,
                    "vocab_size": a.vocab_size,
                    "context_limit": a.context_limit,
                    "dtype": a.dtype,
                },
                "kv": {
                    "dtype": m.kv.dtype,
                    "max_sequences": m.kv.max_sequences,
                    "bytes": m.kv.bytes,
                    "bytes_per_token": m.kv_bytes_per_token,
                },
                "tokenizer": m.tokenizer.file,
                "graphs": [
                    {
                        "name": g.name,
                        "kind": g.kind.value,
                        "chip_mode": g.chip_mode.value,
                        "target_chips": list(g.target_chips),
                        "batch_profiles": list(g.batch_profiles),
                        "max_seq": g.max_seq,
                        "programs": [s.file for s in g.code_sections],
                    }
                    for g in m.graphs
                ],
            }
        )
    signer = signer_of(pkg.root, policy)
    return {
        "package": {"name": pkg.name, "version": pkg.version, "kind": pkg.kind, "path": str(pkg.root)},
        "digest": package_digest(pkg.root),
        "signer_key_id": signer,
        "verification": {
            "verified": False,
            "signature": f"verified by key {signer}" if signer else "no trusted key verifies it",
            "files_hashed": False,
            "note": "inspect shows the manifest as written; it does not hash files or run the validation rules: "
            "run `calctl verify` or `calctl validate` before trusting what it shows",
        },
        "device_cfg": {
            "chip_nums": pkg.device_cfg.chip_nums,
            "calcore_num": pkg.device_cfg.calcore_num,
            "chip_dram_bytes": pkg.device_cfg.chip_dram_bytes,
        },
        "models": models,
        "memory_plan": chips,
        "files": files,
        "files_truncated": truncated,
        "total_bytes": sum(int(f["bytes"]) for f in files),
    }
