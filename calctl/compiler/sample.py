"""``calctl sample-package``: the reference "mock compiler".

Writes a complete, valid, signed package for the mock device: per model a tiny
decoder-only transformer (weights as param blobs), a trained byte-level BPE
tokenizer, one ELF and one command blob per (CalCore, chip) per graph, golden
data computed by the no-cache reference path, a memory plan, compatibility and
SLSA provenance, then checksums and an Ed25519 signature.

Kinds (001 §6.1, §8.3, §12 Phase 2):

* ``single``   – model A on chip0;
* ``combined`` – model A on chip0 and a different model B on chip1 (SCHIP each);
* ``replica``  – the same model on both chips (two aliases, identical weights).

Output is byte-identical for the same kind, seed, profiles and key.
The package layout itself is written by :mod:`calctl.compiler.writer`; this
module only decides the sample models. It does not validate them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from tokenizers import Tokenizer

from calctl.compiler.writer import (
    CHIP_DRAM_BYTES,
    EM_RISCV,
    MIB,
    BuildInfo,
    GoldenCase,
    ModelContent,
    ModelPlan,
    PackageSpec,
    dump_manifest,
    kv_bytes,
    refresh_provenance,
    render_reserved_info,
    write_package,
)
from calctl.errors import UsageError
from calctl.model import decoder
from calctl.model import tokenizer as toklib
from calctl.package.model import Architecture

KINDS = ("single", "combined", "replica")
CONTEXT = 256
DECODE_GOLDEN_STEPS = 16
PREFILL_WORKSPACE = 96 * MIB
DECODE_WORKSPACE = 16 * MIB

GOLDEN_PROMPTS = (
    "The board has two chips, and each chip runs its own model.",
    "Prefill reads the whole prompt; decode adds one token at a time.",
    "Hello, how are you today? The engineer reads the trace.",
)

__all__ = [
    "CHIP_DRAM_BYTES",
    "EM_RISCV",
    "KINDS",
    "build_sample",
    "dump_manifest",
    "kv_bytes",
    "plan_models",
    "refresh_provenance",
    "render_reserved_info",
]


@dataclass(frozen=True)
class SampleModel:
    plan: ModelPlan
    arch: Architecture
    weight_seed: int
    max_sequences: int


def _arch_a() -> Architecture:
    return Architecture(
        family="calctl-tiny-decoder",
        n_layers=2,
        d_model=64,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        d_ff=128,
        vocab_size=384,
        context_limit=CONTEXT,
        dtype="fp32",
        rope_theta=10000.0,
        norm_eps=1e-5,
        tie_embeddings=False,
    )


def _arch_b() -> Architecture:
    return Architecture(
        family="calctl-tiny-decoder",
        n_layers=3,
        d_model=64,
        n_heads=4,
        n_kv_heads=1,
        head_dim=16,
        d_ff=160,
        vocab_size=512,
        context_limit=CONTEXT,
        dtype="fp32",
        rope_theta=10000.0,
        norm_eps=1e-5,
        tie_embeddings=False,
    )


def plan_models(kind: str, seed: int) -> list[SampleModel]:
    a = SampleModel(ModelPlan("model-a", "model_a", "model-a", 0), _arch_a(), seed * 1000 + 1, 16)
    if kind == "single":
        return [a]
    if kind == "combined":
        b = SampleModel(ModelPlan("model-b", "model_b", "model-b", 1), _arch_b(), seed * 1000 + 2, 16)
        return [a, b]
    if kind == "replica":
        return [
            replace(a, plan=ModelPlan("model-a0", "model_a0", "model-a0", 0)),
            replace(a, plan=ModelPlan("model-a1", "model_a1", "model-a1", 1)),
        ]
    raise UsageError(f"--kind {kind!r}: expected one of {', '.join(KINDS)}")


def _golden(params: dict[str, np.ndarray], arch: Architecture, tok: Tokenizer) -> GoldenCase:
    """Pick the first built-in prompt whose greedy path has a clear top-1 margin."""
    for text in GOLDEN_PROMPTS:
        ids = np.array(tok.encode(text).ids, dtype=np.int32)
        tokens, margins, first = decoder.reference_generate(params, arch, ids, DECODE_GOLDEN_STEPS)
        if float(margins.min()) >= 1e-3:
            return GoldenCase(
                prompt=ids.reshape(1, -1),
                prefill_logits=first.reshape(1, -1).astype(np.float32),
                decode_tokens=tokens,
                rtol=1e-4,
                atol=1e-4,
                top_k=5,
            )
    raise RuntimeError("no golden prompt with a clear greedy margin; change the seed")


def _content(m: SampleModel) -> ModelContent:
    tok = toklib.train(m.arch.vocab_size)
    arch = replace(m.arch, eos_token_id=tok.token_to_id(toklib.EOS_TOKEN))
    params = decoder.init_params(arch, np.random.default_rng(m.weight_seed))
    return ModelContent(
        arch=arch,
        params=params,
        param_dtype="fp32",
        tokenizer_json=toklib.to_json(tok),
        tokenizer_config=toklib.tokenizer_config(arch.context_limit),
        tokenizer_vocab=tok.get_vocab_size(),
        golden=_golden(params, arch, tok),
        max_sequences=m.max_sequences,
        prefill_workspace=PREFILL_WORKSPACE,
        decode_workspace=DECODE_WORKSPACE,
        explicit_family_fields=False,
    )


def build_sample(
    out: Path,
    *,
    kind: str,
    key: Ed25519PrivateKey,
    seed: int = 0,
    decode_profiles: tuple[int, ...] = (1,),
    name: str | None = None,
) -> Path:
    """Write a sealed sample package at ``out`` (must not exist, or be an empty directory)."""
    if kind not in KINDS:
        raise UsageError(f"--kind {kind!r}: expected one of {', '.join(KINDS)}")
    profiles = sorted(set(decode_profiles))
    bad = [p for p in profiles if p not in (1, 4, 8, 16)]
    if bad or 1 not in profiles:
        raise UsageError(f"--profiles {','.join(map(str, profiles))}: expected 1 plus any of 4, 8, 16")
    if seed < 0 or seed > 2**31:
        raise UsageError(f"--seed {seed}: expected 0..{2**31}")
    params = {"kind": kind, "seed": seed, "decode_profiles": profiles}
    spec = PackageSpec(
        name=name or f"calctl-sample-{kind}",
        kind=kind,
        description=f"calctl sample package ({kind}, seed {seed}) for the mock device; not a real board program",
        compiler="calctl-sample-compiler",
        build=BuildInfo(
            build_type="urn:calctl:sample-package:v1",
            builder="urn:calctl:sample-package",
            invocation=f"sample-{kind}-seed{seed}",
            parameters=params,
        ),
        decode_profiles=tuple(profiles),
    )
    models = [(m.plan, functools.partial(_content, m)) for m in plan_models(kind, seed)]
    return write_package(Path(out), spec, models, key)
