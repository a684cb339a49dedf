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

Output is byte-identical for the same kind, seed, profiles and key, on any
numpy/BLAS/CPU, with one bounded exception: golden logits are float64 reference
values rounded to a 2**-16 grid (:func:`golden_logits`), so a last-bit float64
difference moves a logit by at most one grid step, and only when it sits on a
rounding midpoint; such packages still pass ``run-golden`` against each other's
golden data.
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
    MIB,
    BuildInfo,
    GoldenCase,
    ModelContent,
    ModelPlacement,
    PackageSpec,
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
    "GENERATOR_REVISION",
    "GOLDEN_LOGIT_STEP",
    "GOLDEN_MARGIN",
    "GOLDEN_TOLERANCE",
    "KINDS",
    "build_sample",
    "golden_logits",
    "plan_models",
]


@dataclass(frozen=True)
class SampleModel:
    plan: ModelPlacement
    arch: Architecture
    weight_seed: int
    max_sequences: int


def _tiny_arch(n_layers: int, n_kv_heads: int, d_ff: int, vocab_size: int) -> Architecture:
    """The sample models' decoder: 64 wide, 4 heads of 16, fp32; the two models differ in these four numbers."""
    return Architecture(
        family="calctl-tiny-decoder",
        n_layers=n_layers,
        d_model=64,
        n_heads=4,
        n_kv_heads=n_kv_heads,
        head_dim=16,
        d_ff=d_ff,
        vocab_size=vocab_size,
        context_limit=CONTEXT,
        dtype="fp32",
        rope_theta=10000.0,
        norm_eps=1e-5,
        tie_embeddings=False,
    )


def _arch_a() -> Architecture:
    return _tiny_arch(n_layers=2, n_kv_heads=2, d_ff=128, vocab_size=384)


def _arch_b() -> Architecture:
    return _tiny_arch(n_layers=3, n_kv_heads=1, d_ff=160, vocab_size=512)


def plan_models(kind: str, seed: int) -> list[SampleModel]:
    a = SampleModel(ModelPlacement("model-a", "model_a", "model-a", 0), _arch_a(), seed * 1000 + 1, 16)
    if kind == "single":
        return [a]
    if kind == "combined":
        b = SampleModel(ModelPlacement("model-b", "model_b", "model-b", 1), _arch_b(), seed * 1000 + 2, 16)
        return [a, b]
    if kind == "replica":
        return [
            replace(a, plan=ModelPlacement("model-a0", "model_a0", "model-a0", 0)),
            replace(a, plan=ModelPlacement("model-a1", "model_a1", "model-a1", 1)),
        ]
    raise UsageError(f"--kind {kind!r}: expected one of {', '.join(KINDS)}")


#: Bumped whenever the bytes a (kind, seed, profiles, key) produces change, so a cache of bundled samples
#: built by an older generator of the same calctl version is not reused (2: float64 golden on a 2**-16 grid).
GENERATOR_REVISION = 2
#: Golden logits are float64 reference logits rounded to multiples of this step (2**-16 ≈ 1.5e-5), then
#: stored as float32, which holds every multiple exactly below 2**8 in magnitude. Two machines whose float64
#: arithmetic differs in the last bits (another BLAS kernel, thread count or libm) write the same bytes unless
#: a logit sits within that difference of a rounding midpoint; then the two values are one step apart, far
#: inside the golden tolerance (GOLDEN_TOLERANCE), so each machine's package passes against the other's data.
GOLDEN_LOGIT_STEP = 2.0**-16
#: The tolerance written into every sample package (the golden runner compares with numpy ``allclose``).
GOLDEN_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4, "top_k": 5}
#: A prompt is used only if every greedy top-1 and the prefill top-k boundary lead by at least this much, so
#: a float32 device (or another machine's rounding) cannot pick a different token or top-k set.
GOLDEN_MARGIN = 1e-3


def golden_logits(logits: np.ndarray) -> np.ndarray:
    """float64 logits -> the float32 golden values: rounded to GOLDEN_LOGIT_STEP, exactly representable."""
    logits = np.asarray(logits, dtype=np.float64)
    steps = np.round(logits / GOLDEN_LOGIT_STEP)  # round half to even: no platform choice involved
    if not np.all(np.abs(steps) < 2**24):
        raise ValueError("golden logits of 256 or more in magnitude cannot be stored exactly on the golden grid")
    return (steps * GOLDEN_LOGIT_STEP).astype(np.float32)


def _topk_margin(logits: np.ndarray, k: int) -> float:
    """How far the k-th largest logit leads the (k+1)-th: the top-k set is stable within this."""
    desc = np.sort(logits)[::-1]
    return float(desc[k - 1] - desc[k]) if desc.size > k else float("inf")


def _golden(params: dict[str, np.ndarray], arch: Architecture, tok: Tokenizer, alias: str) -> GoldenCase:
    """Pick the first built-in prompt whose greedy path and prefill top-k have clear margins (float64 reference)."""
    k = int(GOLDEN_TOLERANCE["top_k"])
    for text in GOLDEN_PROMPTS:
        ids = np.array(tok.encode(text).ids, dtype=np.int32)
        tokens, margins, first = decoder.reference_generate(params, arch, ids, DECODE_GOLDEN_STEPS, dtype=np.float64)
        if float(margins.min()) >= GOLDEN_MARGIN and _topk_margin(first, k) >= GOLDEN_MARGIN:
            return GoldenCase(
                prompt=ids.reshape(1, -1),
                prefill_logits=golden_logits(first).reshape(1, -1),
                decode_tokens=tokens,
                rtol=GOLDEN_TOLERANCE["rtol"],
                atol=GOLDEN_TOLERANCE["atol"],
                top_k=k,
            )
    raise UsageError(
        f"model {alias}: no built-in golden prompt has greedy and top-{k} margins of {GOLDEN_MARGIN:g} with these "
        "weights",
        hint="choose another --seed",
    )


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
        golden=_golden(params, arch, tok, m.plan.alias),
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
        build=BuildInfo.by_calctl("sample-package", f"sample-{kind}-seed{seed}", params),
        decode_profiles=tuple(profiles),
    )
    models = [(m.plan, functools.partial(_content, m)) for m in plan_models(kind, seed)]
    return write_package(Path(out), spec, models, key)
