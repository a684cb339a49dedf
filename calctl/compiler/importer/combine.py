"""``calctl combine``: two single-model packages become one two-chip package (001 §6.1, §6.4, §12 Phase 2).

* two different models -> a **combined** package: A on chip 0, B on chip 1,
  each SCHIP with its own params, KV, workspace, tokenizer and golden data;
* the same model twice -> a **replica** package: the model on both chips
  under two aliases. "The same" is proven by the weights' digests (one SHA-256
  per tensor over the bytes it maps to, :mod:`calctl.package.weights`), the
  tokenizer's and the architecture: two inputs that share their files but map
  tensors differently are refused, naming the tensors that differ (issue 54).

Both inputs must verify (hashes and a trusted signature) and pass every
``validate`` rule before anything is read; their weights, tokenizer files and golden data are carried over byte for
byte in meaning (the params re-laid out for the new chip, ELFs and command
blobs regenerated with the new chip binding). The output is written by
:mod:`calctl.compiler.writer` (temp dir beside OUT, renamed at the end).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from calctl.compiler.writer import (
    BuildInfo,
    GoldenCase,
    ModelContent,
    ModelPlacement,
    PackageSpec,
    check_not_inside,
    package_name,
    write_package,
)
from calctl.errors import PackageError, UsageError
from calctl.model import decoder
from calctl.model.quant import QUANT_DTYPES
from calctl.package import npy, weights
from calctl.package.architecture import FP32_TENSORS
from calctl.package.model import Model, Package
from calctl.package.reader import load_manifest
from calctl.package.validate import ValidationPolicy, validate_root
from calctl.signing import seal
from calctl.signing.keys import TrustedKey
from calctl.signing.policy import TrustPolicy

ALIAS_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class InputModel:
    """One input of ``calctl combine``: a verified single-model package and its model."""

    root: Path
    package: Package
    model: Model
    digest: str  # over every tensor's bytes, the tokenizer and the architecture: equal digests = the same model
    files_digest: str  # over the parameter and tokenizer files alone (what "the same model" once meant)
    tensors: dict[str, str]  # tensor name -> dtype, shape and SHA-256 of its bytes (calctl.package.weights)


def _files_digest(pkg: Package, m: Model) -> str:
    h = hashlib.sha256()
    for rel in (*m.param_files, m.tokenizer.file):
        h.update(rel.rsplit("/", 1)[-1].encode() + b"\0" + seal.sha256_file(pkg.root / rel).encode())
    h.update(repr(m.architecture).encode())
    return h.hexdigest()


def _model_digest(pkg: Package, m: Model, tensors: dict[str, str]) -> str:
    h = hashlib.sha256(repr(m.architecture).encode())
    h.update(seal.sha256_file(pkg.root / m.tokenizer.file).encode())
    for name in sorted(tensors):
        h.update(f"{name}\0{tensors[name]}\n".encode())
    return h.hexdigest()


def open_source(root: Path, trusted: list[TrustedKey], allow_unsigned: bool) -> InputModel:
    """Verify one input package and take its one model; PackageError (exit 1) if it does not verify."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root}: not a package directory")
    report = seal.verify(root, trusted)
    bad = [f for f in report.findings if f.check != "signature" or not allow_unsigned]
    if bad:
        f = bad[0]
        raise PackageError(f"does not verify: {f.message}", path=f"{root}/{f.file}" if f.file else str(root))
    # Every rule, not only hashes and signature: combine must not carry a package validate refuses (a rope factor
    # of inf, an unknown eos_token) into a new signed one (issue 54).
    checked = validate_root(root, ValidationPolicy(trust=TrustPolicy(tuple(trusted), allow_unsigned)))
    if not checked.ok:
        raise PackageError(f"does not validate: {checked.refusal()}", path=str(root))
    pkg = load_manifest(root)
    if len(pkg.models) != 1:
        raise UsageError(
            f"{root}: has {len(pkg.models)} models ({', '.join(pkg.aliases)}); combine takes single-model packages"
        )
    m = pkg.models[0]
    tensors = weights.tensor_digests(root, m)  # exit 1 for a tensor past the end of its blob, before any copy
    return InputModel(
        root=root,
        package=pkg,
        model=m,
        digest=_model_digest(pkg, m, tensors),
        files_digest=_files_digest(pkg, m),
        tensors=tensors,
    )


def _kind(a: InputModel, b: InputModel) -> str:
    """``replica`` when the weights, tokenizer and architecture are the same; PackageError when the files
    are the same but the weights are not (a replica by name only)."""
    if a.digest == b.digest:
        return "replica"
    if a.files_digest == b.files_digest:
        differ = weights.differing(a.tensors, b.tensors)
        raise PackageError(
            f"{a.root} and {b.root} hold the same parameter and tokenizer files but not the same weights: "
            f"{len(differ)} tensor(s) differ ({weights.describe(differ)}); a replica is the same model twice",
            path=str(b.root),
            hint="rebuild the second package from the same checkpoint, or give two different models",
        )
    return "combined"


def _npy(pkg: Package, rel: str) -> np.ndarray:
    return npy.load_member(pkg.root, rel)


def content_of(src: InputModel) -> ModelContent:
    """The model of ``src`` as compiler content (weights back from its blobs)."""
    pkg, m = src.package, src.model
    dtypes = {t.dtype for t in m.params if t.name not in FP32_TENSORS}
    floats = dtypes - set(QUANT_DTYPES)  # quantised blocks are carried over byte for byte
    if len(floats) > 1 or not floats <= {"fp32", "fp16"}:
        raise PackageError(
            f"parameter dtypes {sorted(dtypes)}: combine re-lays out fp32 or fp16 blobs (with q4_0/q4_1/q8_0 kept)",
            path=str(src.root),
        )
    params = decoder.load_params(pkg.root, m.params, keep_dtype=bool(dtypes & set(QUANT_DTYPES)))
    g = m.golden
    tok_cfg = (pkg.root / m.tokenizer.config).read_bytes() if m.tokenizer.config else b"{}\n"
    return ModelContent(
        arch=m.architecture,
        params=params,
        param_dtype=next(iter(floats), "fp16"),
        tokenizer_json=(pkg.root / m.tokenizer.file).read_bytes(),
        tokenizer_config=tok_cfg,
        tokenizer_vocab=m.tokenizer.vocab_size,
        golden=GoldenCase(
            prompt=_npy(pkg, g.prompt.file),
            prefill_logits=_npy(pkg, g.prefill_logits.file),
            decode_tokens=_npy(pkg, g.decode_tokens.file),
            rtol=g.tolerance.rtol,
            atol=g.tolerance.atol,
            top_k=g.tolerance.top_k,
        ),
        max_sequences=m.kv.max_sequences,
        prefill_workspace=m.workspace.prefill_peak_bytes,
        decode_workspace=m.workspace.decode_peak_bytes,
        kv_dtype=m.kv.dtype,
        block_tokens=m.kv.block_tokens,
        explicit_family_fields=m.architecture.family != "calctl-tiny-decoder",
    )


def _plan(alias: str, chip: int) -> ModelPlacement:
    if not ALIAS_RE.match(alias):
        raise UsageError(f"alias {alias!r}: expected lowercase letters, digits, '.', '_' or '-' (1-64)")
    return ModelPlacement(alias=alias, name=re.sub(r"[^A-Za-z0-9_]+", "_", alias), dir=alias, chip=chip)


def combine(
    out: Path,
    a: InputModel,
    b: InputModel,
    key: Ed25519PrivateKey,
    *,
    alias_a: str | None = None,
    alias_b: str | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """Write the combined (different models) or replica (same model) package of ``a`` and ``b``."""
    check_not_inside(Path(out), (a.root, b.root))
    kind = _kind(a, b)
    if kind == "replica":
        base = a.model.alias
        pa, pb = _plan(alias_a or f"{base}-0", 0), _plan(alias_b or f"{base}-1", 1)
    else:
        pa, pb = _plan(alias_a or a.model.alias, 0), _plan(alias_b or b.model.alias, 1)
    if pa.alias == pb.alias:
        raise UsageError(
            f"both models would be alias {pa.alias!r}; give --alias-a and --alias-b",
            hint="aliases are matched exactly (001 §10.4), so two models need two names",
        )
    contents = {0: content_of(a), 1: content_of(b)}
    # The decode profiles both inputs compile (each has B1): the writer gives every model the same list.
    profiles = tuple(sorted(set(a.model.decode.batch_profiles) & set(b.model.decode.batch_profiles)))
    spec = PackageSpec(
        name=package_name(name or f"{pa.alias}+{pb.alias}-{kind}", kind),
        kind=kind,
        description=f"calctl combine ({kind}): {a.model.alias} on chip0, {b.model.alias} on chip1, for the mock device",
        compiler="calctl-combine",
        build=BuildInfo.by_calctl(
            "combine",
            f"combine-{kind}-{pa.alias}-{pb.alias}",
            {"kind": kind, "aliases": [pa.alias, pb.alias], "decode_profiles": list(profiles)},
            dependencies=tuple(
                {
                    "uri": f"package:{s.package.name}",
                    "digest": {"sha256": seal.sha256_file(s.root / "checksums.sha256")},
                }
                for s in (a, b)
            ),
        ),
        decode_profiles=profiles,
    )
    write_package(Path(out), spec, [(pa, lambda: contents[0]), (pb, lambda: contents[1])], key)
    return {"path": str(out), "kind": kind, "aliases": [pa.alias, pb.alias], "chips": [0, 1]}
