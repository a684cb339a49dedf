"""Summaries of a package for ``calctl inspect`` and for every report's header.

The package digest is the SHA-256 of ``checksums.sha256``: it commits to every
file, so reports can name exactly what ran.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

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


def describe(pkg: Package, policy: TrustPolicy) -> dict[str, Any]:
    files = []
    for e in seal.list_package_files(pkg.root):
        size = (pkg.root / e.rel).lstat().st_size
        files.append({"path": e.rel, "bytes": size, "type": e.kind})
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
    return {
        "package": {"name": pkg.name, "version": pkg.version, "kind": pkg.kind, "path": str(pkg.root)},
        "digest": package_digest(pkg.root),
        "signer_key_id": signer_of(pkg.root, policy),
        "device_cfg": {
            "chip_nums": pkg.device_cfg.chip_nums,
            "calcore_num": pkg.device_cfg.calcore_num,
            "chip_dram_bytes": pkg.device_cfg.chip_dram_bytes,
        },
        "models": models,
        "memory_plan": chips,
        "files": files,
        "total_bytes": sum(f["bytes"] for f in files),
    }
