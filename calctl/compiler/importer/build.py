"""Turn a read checkpoint into a sealed single-model package (``calctl import hf|gguf``).

What comes from where:

* architecture: the checkpoint's config (:mod:`.families`), ``context_limit``
  = ``--context`` (default ``min(max_position_embeddings, 4096)``, 001 §8.3: 4K);
* weights: stored ``fp16`` (default) or ``fp32`` parameter blobs;
* KV region: 001 §8.1 with the real layer/KV-head/head_dim numbers, the context
  cap, ``--sequences`` lanes and 16-token blocks, fp32 (what the mock's cache
  holds) – the same bytes ``calctl budget --hf-config config.json --context C
  --batch S --kv-dtype fp32 --block-tokens 16`` prints;
* workspace: the activations of one whole-context prefill (including the
  ``heads x context x context`` score matrix the numpy decoder materialises)
  and of one decode step, fp32;
* golden: the float64 no-cache reference path (``calctl.model.decoder``) on the
  stored (rounded) weights, on a fixed list of prompts, the chat-templated one
  first; the first prompt whose greedy path keeps a clear top-1 margin is used,
  its decode tokens cut before the first near-tie. Before anything is written the
  cached float32 path the mock runs must reproduce it within the tolerance the
  manifest states.

This module decides content; :mod:`calctl.compiler.writer` writes the package.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from calctl import textsafe
from calctl.compiler.importer.families import CheckpointError, FamilyConfig, refuse_unknown_tokens
from calctl.compiler.writer import (
    PARAM_DTYPES,
    BuildInfo,
    GoldenCase,
    ModelContent,
    ModelPlacement,
    PackageSpec,
    package_name,
    write_package,
)
from calctl.errors import UsageError
from calctl.model import decoder
from calctl.model.quant import QuantTensor
from calctl.package.architecture import FP32_TENSORS
from calctl.package.model import Architecture
from calctl.package.tokenizer_ids import ids_outside, token_text, vocabulary_problems
from calctl.signing import seal

if TYPE_CHECKING:
    from calctl.compiler.importer.gguf_file import GgufCheckpoint
    from calctl.compiler.importer.hf import HfCheckpoint

#: ``--dtype gguf``: keep a GGUF's Q4_0/Q4_1/Q8_0 blocks as shipped, the other weights fp16 (docs/import.md).
KEEP_BLOCKS = "gguf"
DEFAULT_CONTEXT_CAP = 4096
DEFAULT_SEQUENCES = 4
#: Decode batch profiles an import compiles (``--profiles``): B>1 lets ``calctl serve`` batch the lanes' GEMVs.
DEFAULT_PROFILES = (1, 2, 4, 8)
#: What the package schema allows a decode graph's ``batch_profiles`` to hold.
ALLOWED_PROFILES = (1, 2, 4, 8, 16, 32)
BLOCK_TOKENS = 16
GOLDEN_STEPS = 8
#: Golden tolerance for the mock's float32 cached path against the float64 reference (both on the stored weights).
GOLDEN_RTOL = 1e-3
GOLDEN_ATOL = 2e-3
GOLDEN_TOP_K = 5
#: A greedy step is kept in the golden token sequence only while top-1 leads top-2 by this much (>> atol).
GOLDEN_MARGIN = 0.05

CHAT_PROMPT = "What is the capital of France?"
PLAIN_PROMPTS = (
    "The capital of France is",
    "Prefill reads the whole prompt; decode adds one token at a time.",
    "Hello, how are you today?",
)
ALIAS_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class ImportOptions:
    alias: str
    chip: int = 0
    context: int | None = None
    dtype: str = "fp16"
    sequences: int = DEFAULT_SEQUENCES
    name: str | None = None
    profiles: tuple[int, ...] = DEFAULT_PROFILES


@dataclass(frozen=True)
class Checkpoint:
    """What a reader produced, whatever the format."""

    kind: str  # hf | gguf
    config: FamilyConfig
    params: Mapping[str, Any]  # np.ndarray, or QuantTensor for kept blocks
    tokenizer_json: bytes
    tokenizer_config: Mapping[str, Any]
    sources: tuple[Path, ...]
    notes: tuple[str, ...] = ()
    tokenizer_config_file: bytes | None = None  # the original bytes, kept as they are (Hugging Face)

    @classmethod
    def of(cls, kind: str, read: HfCheckpoint | GgufCheckpoint, **extra: Any) -> Checkpoint:
        """A reader's result as a Checkpoint: the model config, weights and tokenizer every reader yields, plus
        what is particular to the format (``sources``, ``notes``, the original tokenizer config bytes)."""
        return cls(
            kind=kind,
            config=read.config,
            params=read.params,
            tokenizer_json=read.tokenizer_json,
            tokenizer_config=read.tokenizer_config,
            **extra,
        )


def default_alias(stem: str) -> str:
    alias = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")[:64]
    return alias or "model"


def check_options(opts: ImportOptions) -> None:
    if not ALIAS_RE.match(opts.alias):
        raise UsageError(f"--alias {opts.alias!r}: expected lowercase letters, digits, '.', '_' or '-' (1-64)")
    if opts.chip not in (0, 1):
        raise UsageError(f"--chip {opts.chip}: expected 0 or 1 (the board has two chips)")
    if opts.dtype not in (*PARAM_DTYPES, KEEP_BLOCKS):
        raise UsageError(f"--dtype {opts.dtype!r}: expected one of {', '.join((*PARAM_DTYPES, KEEP_BLOCKS))}")
    if opts.context is not None and not 16 <= opts.context <= 1 << 20:
        raise UsageError(f"--context {opts.context}: expected 16..{1 << 20} tokens")
    if not 1 <= opts.sequences <= 64:
        raise UsageError(f"--sequences {opts.sequences}: expected 1..64")
    check_profiles(opts.profiles)


def parse_profiles(text: str) -> tuple[int, ...]:
    """``--profiles 1,2,4,8`` as sorted unique integers (UsageError on anything else)."""
    try:
        values = tuple(sorted({textsafe.decimal_int(p) for p in text.split(",") if p.strip()}))
    except ValueError:
        raise UsageError(f"--profiles {text!r}: expected comma-separated integers such as 1,2,4,8") from None
    check_profiles(values)
    return values


def check_profiles(profiles: tuple[int, ...]) -> None:
    shown = ",".join(map(str, profiles))
    bad = [p for p in profiles if p not in ALLOWED_PROFILES]
    if bad or 1 not in profiles:
        raise UsageError(
            f"--profiles {shown}: expected 1 plus any of {', '.join(map(str, ALLOWED_PROFILES[1:]))}",
            hint="B1 serves a lone stream; a B>1 profile is one decode job for up to B lanes",
        )


def _context(cfg: FamilyConfig, requested: int | None) -> int:
    if requested is None:
        return min(cfg.max_position_embeddings, DEFAULT_CONTEXT_CAP)
    if requested > cfg.max_position_embeddings:
        raise UsageError(
            f"--context {requested}: larger than the model's max_position_embeddings {cfg.max_position_embeddings}"
        )
    return requested


def _tokenizer_source(ck: Checkpoint) -> Path:
    """The file the tokenizer came from: ``tokenizer.json`` of a directory, else the GGUF file."""
    return next((p for p in ck.sources if p.name == "tokenizer.json"), ck.sources[0])


def _check_tokenizer_config(ck: Checkpoint, tok: Any, bound: int) -> None:
    """The special tokens and ``added_tokens_decoder`` ids of the tokenizer config (:func:`.families.refuse_unknown_tokens`;
    ``import hf`` checked them before reading the weights, a GGUF's config is checked here)."""
    where = next((p for p in ck.sources if p.name == "tokenizer_config.json"), ck.sources[0])
    refuse_unknown_tokens(ck.tokenizer_config, tok, bound, where)


def _tokenizer(ck: Checkpoint) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(ck.tokenizer_json.decode("utf-8"))
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise CheckpointError(_tokenizer_source(ck), f"the tokenizer does not load: {exc}") from None


def _eos_id(ck: Checkpoint, tok: Any) -> int | None:
    text = token_text(ck.tokenizer_config.get("eos_token"))
    if text is not None:
        i = tok.token_to_id(text)
        if i is not None:
            return int(i)
    return ck.config.eos_token_id


def render_chat(template: str, cfg: Mapping[str, Any], content: str) -> str:
    """The chat template rendered for one user message, as Hugging Face renders it."""
    from jinja2 import TemplateError

    from calctl.package.chat_template import render_bounded

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    return render_bounded(
        template,
        messages=[{"role": "user", "content": content}],
        add_generation_prompt=True,
        bos_token=token_text(cfg.get("bos_token")) or "",
        eos_token=token_text(cfg.get("eos_token")) or "",
        raise_exception=raise_exception,
    )


def golden_prompts(ck: Checkpoint, tok: Any) -> tuple[list[tuple[str, list[int]]], list[str]]:
    """The fixed prompts as ``(label, ids)``, the chat-templated one first when the model has a template; notes."""
    from calctl.package.chat_template import TemplateTooCostly

    out: list[tuple[str, list[int]]] = []
    notes: list[str] = []
    template = ck.tokenizer_config.get("chat_template")
    if isinstance(template, str) and template:
        try:
            text = render_chat(template, ck.tokenizer_config, CHAT_PROMPT)
            out.append((f"chat: {CHAT_PROMPT}", tok.encode(text, add_special_tokens=False).ids))
        except TemplateTooCostly as exc:  # serve would run it for every request: refused, not noted
            raise CheckpointError(
                _tokenizer_source(ck) if ck.kind == "gguf" else ck.sources[0].parent,
                f"the chat template is too costly to render ({exc})",
                hint="a real chat template renders one message in a few hundred steps",
            ) from None
        except Exception as exc:  # jinja2 raises many types; golden still runs on the plain prompts
            notes.append(f"the chat template does not render ({type(exc).__name__}: {exc}); golden uses plain prompts")
    else:
        notes.append("no chat_template in the tokenizer config; golden uses plain prompts")
    for p in PLAIN_PROMPTS:
        out.append((p, tok.encode(p, add_special_tokens=False).ids))
    return [(label, ids) for label, ids in out if ids], notes


def make_golden(
    params: Mapping[str, np.ndarray], arch: Architecture, prompts: list[tuple[str, list[int]]]
) -> tuple[GoldenCase, str]:
    """Golden data from the float64 reference on the first prompt with a clear greedy margin."""
    vocab = arch.vocab_size
    params64 = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    for label, ids in prompts:
        ids = [i for i in ids if i < vocab]
        if not ids or len(ids) + GOLDEN_STEPS > arch.context_limit:
            continue
        prompt = np.array(ids, dtype=np.int32)
        tokens, _, first = decoder.reference_generate(params64, arch, prompt, GOLDEN_STEPS, stop_margin=GOLDEN_MARGIN)
        if len(tokens) == 0:
            continue
        keep = len(tokens)
        return (
            GoldenCase(
                prompt=prompt.reshape(1, -1),
                prefill_logits=first.reshape(1, -1).astype(np.float32),
                decode_tokens=tokens[:keep].astype(np.int32),
                rtol=GOLDEN_RTOL,
                atol=GOLDEN_ATOL,
                top_k=GOLDEN_TOP_K,
            ),
            label,
        )
    raise CheckpointError(
        "golden",
        f"no fixed prompt gives a greedy first token with a top-1 margin of at least {GOLDEN_MARGIN}",
        hint="the weights may be degenerate (all-equal logits)",
    )


def self_check(weights: decoder.Weights, arch: Architecture, gold: GoldenCase) -> float:
    """Run the cached float32 path (what the mock executes) on the golden; the max |logit error|."""
    cache = decoder.KvCache.empty(arch, int(gold.prompt.shape[1]) + len(gold.decode_tokens) + 1)
    logits = decoder.prefill(weights, arch, gold.prompt[0], cache)
    want = gold.prefill_logits[0]
    err = float(np.max(np.abs(logits - want)))
    if not np.allclose(logits, want, rtol=gold.rtol, atol=gold.atol):
        raise CheckpointError(
            "golden", f"the mock's float32 path differs from the float64 reference by {err:.3g} (> atol {gold.atol})"
        )
    got, tok = [], int(np.argmax(logits))
    for _ in range(len(gold.decode_tokens)):
        got.append(tok)
        tok = int(np.argmax(decoder.decode_step(weights, arch, tok, cache.length, cache)))
    if got != gold.decode_tokens.tolist():
        raise CheckpointError(
            "golden", f"the mock's float32 path decodes {got}, the reference {gold.decode_tokens.tolist()}"
        )
    return err


def workspace_bytes(arch: Architecture, batch: int = 1) -> tuple[int, int]:
    """(prefill peak, decode peak) fp32 activation bytes of the numpy decoder, rounded up to MiB.

    The decode peak is that of a ``batch``-lane step (the largest decode profile): every lane has its own
    activations, scores and logits row.
    """
    c, d, f = arch.context_limit, arch.d_model, arch.d_ff
    qkv = (arch.n_heads + 2 * arch.n_kv_heads) * arch.head_dim
    per_token = 3 * d + qkv + 3 * f + arch.n_heads * arch.head_dim
    prefill = 4 * (c * per_token + arch.n_heads * c * c + arch.vocab_size)
    decode = 4 * batch * (per_token + arch.n_heads * c + arch.vocab_size)
    mib = 1024 * 1024
    return -(-prefill // mib) * mib, -(-decode // mib) * mib


def stored(params: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    """The weights exactly as the blobs will hold them: float32, or quantised blocks kept (``dtype`` gguf)."""
    if dtype == "fp32":
        return {k: np.asarray(v, dtype=np.float32) for k, v in params.items()}
    out: dict[str, Any] = {}
    for k, v in params.items():
        if isinstance(v, QuantTensor) and dtype == KEEP_BLOCKS:
            out[k] = v
            continue
        if k in FP32_TENSORS:
            out[k] = np.asarray(v, dtype=np.float32)
            continue
        with np.errstate(over="ignore", invalid="ignore"):  # refused below by name, never a RuntimeWarning
            h = np.asarray(v, dtype=np.float16)
        if not np.all(np.isfinite(h)):
            raise CheckpointError(k, "does not fit fp16 (values beyond +-65504); import with --dtype fp32")
        out[k] = h.astype(np.float32)
    return out


def weight_dtype(params: Mapping[str, Any], dtype: str) -> str:
    """The architecture's ``dtype``: the option, or with kept blocks the dtype most weight matrices have."""
    if dtype != KEEP_BLOCKS:
        return dtype
    kinds = [v.dtype if isinstance(v, QuantTensor) else "fp16" for k, v in params.items() if k not in FP32_TENSORS]
    return max(sorted(set(kinds)), key=kinds.count)


def model_content(ck: Checkpoint, opts: ImportOptions) -> tuple[ModelContent, dict[str, Any]]:
    """Decide everything about the model; returns the content and a summary for the report."""
    tok = _tokenizer(ck)
    context = _context(ck.config, opts.context)
    if opts.dtype == KEEP_BLOCKS and ck.kind != "gguf":
        raise UsageError(f"--dtype {KEEP_BLOCKS}: keeps a GGUF file's blocks; a {ck.kind} import takes fp16 or fp32")
    params = stored(ck.params, opts.dtype)
    arch = ck.config.architecture(
        context=context, dtype=weight_dtype(params, opts.dtype), eos_token_id=_eos_id(ck, tok)
    )
    prefix = "tokenizer.ggml." if ck.kind == "gguf" else ""
    for key, tid in (("eos_token_id", arch.eos_token_id), ("bos_token_id", arch.bos_token_id)):
        if tid is not None and tid >= arch.vocab_size:
            raise CheckpointError(
                ck.sources[0],
                f"{prefix}{key} {tid} is outside the vocabulary (expected < vocab_size {arch.vocab_size})",
            )
    vocab = int(tok.get_vocab_size(with_added_tokens=True))
    if vocab > arch.vocab_size:
        raise CheckpointError(
            _tokenizer_source(ck),
            f"the tokenizer has {vocab} entries, more than the model's vocab_size {arch.vocab_size}",
        )
    for problem in vocabulary_problems(tok):  # TOK002's check by value: import never writes what validate refuses
        raise CheckpointError(_tokenizer_source(ck), f"model.vocab: {problem}")
    outside, named = ids_outside(tok, vocab)  # by value, not by count (issue 54): TOK002 would refuse the package
    if outside:
        raise CheckpointError(
            _tokenizer_source(ck),
            f"the tokenizer can produce {outside} token id(s) outside its {vocab} entries and the model's "
            f"vocab_size {arch.vocab_size}: {', '.join(named)}",
        )
    _check_tokenizer_config(ck, tok, min(vocab, arch.vocab_size))
    prompts, notes = golden_prompts(ck, tok)
    if arch.eos_token_id is None:  # llama.cpp warns too: such a model only stops at the token limit
        eos_from = (
            f"{prefix}eos_token_id"
            if ck.kind == "gguf"
            else "eos_token_id (config.json, generation_config.json) or eos_token (tokenizer_config.json)"
        )
        notes.append(
            f"{ck.sources[0].name}: no end-of-sequence token ({eos_from}): generation never stops on its own, "
            "every request runs to its max_tokens"
        )
    gold, label = make_golden(params, arch, prompts)
    err = self_check(decoder.prepare(params, arch), arch, gold)
    if ck.tokenizer_config_file is not None:
        tok_cfg = ck.tokenizer_config_file
    else:
        cfg = {**ck.tokenizer_config, "model_max_length": context}
        tok_cfg = (json.dumps(cfg, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
    pre, dec = workspace_bytes(arch, max(opts.profiles))
    content = ModelContent(
        arch=arch,
        params=params,
        param_dtype="fp16" if opts.dtype == KEEP_BLOCKS else opts.dtype,
        tokenizer_json=ck.tokenizer_json,
        tokenizer_config=tok_cfg,
        tokenizer_vocab=vocab,
        golden=gold,
        max_sequences=opts.sequences,
        prefill_workspace=pre,
        decode_workspace=dec,
        block_tokens=BLOCK_TOKENS,
    )
    summary = {
        "family": arch.family,
        "layers": arch.n_layers,
        "parameters": int(sum(int(np.prod(v.shape)) for v in params.values())),
        "context": context,
        "dtype": arch.dtype,
        "decode_profiles": list(opts.profiles),
        "golden_prompt": label,
        "golden_tokens": len(gold.decode_tokens),
        "golden_self_check_max_abs_err": err,
        "notes": notes,
    }
    return content, summary


def import_checkpoint(out: Path, ck: Checkpoint, opts: ImportOptions, key: Ed25519PrivateKey) -> dict[str, Any]:
    """Write the sealed single-model package for ``ck`` at ``out``; returns a summary."""
    check_options(opts)
    content, summary = model_content(ck, opts)
    name = opts.name or f"{opts.alias}-{ck.kind}"
    model_name = re.sub(r"[^A-Za-z0-9_]+", "_", opts.alias)
    plan = ModelPlacement(alias=opts.alias, name=model_name, dir=opts.alias, chip=opts.chip)
    deps = tuple(
        {"uri": f"file:{p.name}", "digest": {"sha256": seal.sha256_file(p.resolve())}}
        for p in ck.sources
        if p.is_file()
    )
    spec = PackageSpec(
        name=package_name(name, "imported"),
        kind="single",
        description=f"{ck.config.family} checkpoint imported by calctl import {ck.kind} for the mock device "
        "(numpy decoder); not a real board program",
        compiler=f"calctl-import-{ck.kind}",
        build=BuildInfo.by_calctl(
            "import",
            f"import-{ck.kind}-{opts.alias}",
            build_type=f"import-{ck.kind}",
            parameters={
                "source": ck.kind,
                "alias": opts.alias,
                "chip": opts.chip,
                "context": content.arch.context_limit,
                "dtype": opts.dtype,
                "sequences": opts.sequences,
                "decode_profiles": list(opts.profiles),
            },
            dependencies=deps,
        ),
        decode_profiles=opts.profiles,
    )
    write_package(Path(out), spec, [(plan, lambda: content)], key)
    notes = [*ck.notes, *summary.pop("notes")]
    return {**summary, "path": str(out), "alias": opts.alias, "chip": opts.chip, "notes": notes}


def read_hf(root: Path) -> Checkpoint:
    """A Hugging Face model directory as a :class:`Checkpoint`."""
    from calctl.compiler.importer.hf import read_hf_dir

    hf = read_hf_dir(root)
    return Checkpoint.of("hf", hf, sources=hf.sources, tokenizer_config_file=hf.tokenizer_config_bytes, notes=hf.notes)


def read_gguf_file(path: Path, *, keep_blocks: bool = False) -> Checkpoint:
    """A GGUF file as a :class:`Checkpoint` (weights dequantised or, ``keep_blocks``, Q4_0/Q4_1/Q8_0 kept as shipped;
    Llama Q/K rows back in HF order)."""
    from calctl.compiler.importer.gguf_file import read_gguf

    g = read_gguf(path, keep_blocks=keep_blocks)
    return Checkpoint.of(
        "gguf",
        g,
        sources=(g.path,),
        notes=(
            f"GGUF tensor types: {', '.join(g.quant_types)} "
            + (
                "(Q4_0/Q4_1/Q8_0 kept as shipped, the rest dequantised)"
                if keep_blocks
                else "(dequantised with gguf.quants)"
            ),
            *(
                [f"GGUF metadata not used ({len(g.ignored_metadata)} keys): {', '.join(g.ignored_metadata)}"]
                if g.ignored_metadata
                else []
            ),
        ),
    )
