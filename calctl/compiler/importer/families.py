"""The checkpoint families ``calctl import`` accepts, and their config as an explicit Architecture.

Every family is the Llama block; the differences become manifest fields
(docs/import.md) instead of being implied by the family name:

=========  ==========  =========  =======  ============================
family     attn_bias   qk_norm    rope     head_dim
=========  ==========  =========  =======  ============================
llama      config      no         half     config, else d_model / n_heads
qwen2      yes (q/k/v) no         half     config, else d_model / n_heads
qwen3      config      yes        half     config (explicit), else d_model / n_heads
=========  ==========  =========  =======  ============================

``rope: half`` is Hugging Face's ``rotate_half`` convention. GGUF stores Llama's
Q/K rows permuted for llama.cpp's interleaved RoPE; :mod:`.gguf_file` undoes
that, so every imported package holds Hugging Face row order.

Every architecture number the decoder needs comes from the checkpoint or is
refused naming the key: no family default stands in for a missing
``rope_theta``, ``rms_norm_eps`` or ``max_position_embeddings`` (a wrong RoPE
base builds a model that runs and talks nonsense). Both Hugging Face layouts are
read: transformers 4 (top-level ``rope_theta``, ``rope_scaling``) and
transformers 5 (``rope_parameters: {rope_type, rope_theta, ...}``); a config that
states the base in both places must agree.

RoPE types the decoder runs exactly: ``default`` (plain RoPE), ``linear``
(every frequency divided by ``factor``) and Llama 3.x ``llama3`` (per-pair
divisors); the scaled ones become the tensor ``rope_freq_factors`` (llama.cpp's
``rope_freqs``). Anything this cannot run exactly is refused, naming the config
key: other ``model_type`` values, other RoPE types (YaRN, dynamic, longrope),
sliding windows, a non-SiLU activation, MLP or output-projection biases. This
module is pure: no file I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from calctl import limits
from calctl.errors import UsageError
from calctl.package.model import Architecture, Dimensions
from calctl.package.tokenizer_ids import decoder_id_problems, unknown_special_tokens

SUPPORTED = ("llama", "qwen2", "qwen3")
SUPPORTED_TEXT = "llama (Llama 3.x, TinyLlama, SmolLM2), qwen2 (Qwen2, Qwen2.5), qwen3 (dense Qwen3)"


class CheckpointError(UsageError):
    """A checkpoint file is missing, truncated or not what the importer can run (exit 2)."""

    def __init__(self, path: object, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"{path}: {message}", hint=hint)
        self.path = str(path)


@dataclass(frozen=True)
class FamilyConfig(Dimensions):
    """A checkpoint's architecture as the importer reads it (before the context cap)."""

    max_position_embeddings: int
    rope_theta: float
    norm_eps: float
    tie_embeddings: bool
    attn_bias: bool
    qk_norm: bool
    bos_token_id: int | None
    eos_token_id: int | None
    rope_factors: tuple[float, ...] | None = None  # per-pair frequency divisors (Llama 3.x rope_scaling)

    def architecture(self, *, context: int, dtype: str, eos_token_id: int | None) -> Architecture:
        return Architecture(
            **{f.name: getattr(self, f.name) for f in fields(Dimensions)},
            context_limit=context,
            dtype=dtype,
            rope_theta=self.rope_theta,
            norm_eps=self.norm_eps,
            tie_embeddings=self.tie_embeddings,
            eos_token_id=eos_token_id,
            rope_style="half",
            attn_bias=self.attn_bias,
            qk_norm=self.qk_norm,
            max_position_embeddings=self.max_position_embeddings,
            bos_token_id=self.bos_token_id,
            rope_freq_factors=self.rope_factors is not None,
        )


def unsupported_family(where: object, key: str, value: object) -> CheckpointError:
    return CheckpointError(
        where,
        f"{key} {value!r} is not a supported family",
        hint=f"supported: {SUPPORTED_TEXT}",
    )


class _Cfg:
    def __init__(self, doc: Mapping[str, Any], where: object, prefix: str = "", label: str | None = None) -> None:
        """``prefix`` is prepended to every key looked up; ``label`` (default ``prefix``) to keys in messages."""
        self.doc, self.where, self.prefix = doc, where, prefix
        self.label = prefix if label is None else label

    def _err(self, key: str, what: str, found: object) -> CheckpointError:
        return CheckpointError(self.where, f"{self.label}{key}: expected {what}, found {found!r}")

    def integer(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        v = self.doc.get(self.prefix + key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self._err(key, f"an integer >= {minimum}", v)
        self._bound(key, v)
        return v

    def _bound(self, key: str, value: int) -> None:
        """The one table's limit for ``key`` (calctl.limits), checked before the number sizes any work."""
        too_big = limits.over_limit(key, value)
        if too_big:
            raise CheckpointError(self.where, f"{self.label}{key}: {too_big}")

    def number(self, key: str, default: float | None = None) -> float:
        v = self.doc.get(self.prefix + key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise self._err(key, "a finite number > 0", v)
        return float(v)

    def ranged(self, key: str) -> float:
        """A real number within its range in the one table (``limits.RANGE_BY_FIELD[key]``): finite, not a bool
        or a string, bounded before any RoPE table is computed from it (issue 54)."""
        v = self.doc.get(self.prefix + key)
        wrong = limits.out_of_range(key, v)
        if wrong or not isinstance(v, int | float):
            raise CheckpointError(self.where, f"{self.label}{key}: {wrong}")
        return float(v)

    def flag(self, key: str, default: bool) -> bool:
        v = self.doc.get(self.prefix + key, default)
        if not isinstance(v, bool):
            raise self._err(key, "true or false", v)
        return v

    def token_id(self, key: str, vocab: int | None = None) -> int | None:
        """The id at ``key`` (the first of a list: Llama 3 instruct's several EOS ids, the end-of-turn one first);
        every id of a list is checked, each below ``vocab`` when given (issue 54: only the first was)."""
        v = self.doc.get(self.prefix + key)
        if v is None:
            return None
        ids = v if isinstance(v, list) else [v]
        for n, i in enumerate(ids):
            name = f"{key}[{n}]" if isinstance(v, list) else key
            if isinstance(i, bool) or not isinstance(i, int) or i < 0:
                raise self._err(name, "a token id >= 0 (or a list of them, or null)", i)
            self._bound(key, i)
            if vocab is not None and i >= vocab:
                raise CheckpointError(
                    self.where, f"{self.label}{name} {i} is outside the vocabulary (expected < vocab_size {vocab})"
                )
        return ids[0] if ids else None


def refuse_unknown_tokens(doc: Mapping[str, Any], tok: Any, bound: int, where: object) -> None:
    """CheckpointError naming the first special token of a tokenizer config that the tokenizer lacks, or
    ``added_tokens_decoder`` id outside ``[0, bound)`` or not the tokenizer's (issue 54: an unknown ``eos_token``
    imported and the package failed its own TOK004; ids past the vocabulary imported). validate's TOK002/TOK004
    apply the same functions, so import never writes what validate refuses."""
    for field, problem in (*unknown_special_tokens(doc, tok), *decoder_id_problems(doc, tok, bound)):
        raise CheckpointError(where, f"{field}: {problem}")


def _check_shape(where: object, fc: FamilyConfig) -> FamilyConfig:
    if fc.n_heads % fc.n_kv_heads:
        raise CheckpointError(
            where, f"num_attention_heads {fc.n_heads} is not a multiple of num_key_value_heads {fc.n_kv_heads}"
        )
    if fc.head_dim % 2:
        raise CheckpointError(where, f"head_dim {fc.head_dim} is odd; RoPE rotates pairs and needs an even head_dim")
    return fc


#: RoPE types the decoder runs exactly (transformers ``ROPE_INIT_FUNCTIONS`` names); the scaled ones need llama.
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    """A config's RoPE as the importer read it, from either layout; ``params`` hold the scaling fields."""

    theta: float
    rope_type: str
    params: _Cfg | None  # the mapping the scaling fields are read from (None: plain RoPE)


def _missing(where: object, key: str, detail: str = "") -> CheckpointError:
    return CheckpointError(
        where,
        f"{key}: missing; the decoder needs it and calctl does not guess it{detail}",
        hint="state it in config.json as the checkpoint was trained (transformers writes every field)",
    )


def hf_rope(doc: Mapping[str, Any], where: object, model_type: str) -> RopeConfig:
    """RoPE base and scaling from a transformers 4 or 5 ``config.json``; CheckpointError naming the field."""
    params = doc.get("rope_parameters")
    scaling = doc.get("rope_scaling")
    top_theta = doc.get("rope_theta")
    block: Mapping[str, Any] | None = None
    label = ""
    if params is not None:  # transformers 5
        if not isinstance(params, Mapping):
            raise CheckpointError(where, f"rope_parameters: expected an object, found {params!r}")
        if "rope_theta" not in params and all(isinstance(v, Mapping) for v in params.values()) and params:
            raise CheckpointError(
                where,
                f"rope_parameters has one entry per layer type ({', '.join(map(str, params))}): "
                "per-layer RoPE is not supported",
            )
        block, label = params, "rope_parameters."
        if scaling not in (None, {}) and scaling != params:
            raise CheckpointError(
                where, f"rope_scaling {scaling!r} and rope_parameters {dict(params)!r} disagree; expected one of them"
            )
    elif scaling not in (None, {}):  # transformers 4
        if not isinstance(scaling, Mapping):
            raise CheckpointError(where, f"rope_scaling: expected an object or null, found {scaling!r}")
        block, label = scaling, "rope_scaling."
    theta_v = block.get("rope_theta") if block is not None and label == "rope_parameters." else None
    if theta_v is None and top_theta is None:
        raise _missing(where, "rope_theta", " (neither rope_theta nor rope_parameters.rope_theta is in config.json)")
    if theta_v is not None and top_theta is not None and theta_v != top_theta:
        raise CheckpointError(
            where, f"rope_theta {top_theta!r} and rope_parameters.rope_theta {theta_v!r} disagree; expected one value"
        )
    if theta_v is not None:
        theta = _Cfg(block or {}, where, label=label).ranged("rope_theta")
    else:
        theta = _Cfg(doc, where).ranged("rope_theta")
    partial = doc.get("partial_rotary_factor", 1.0)
    if partial != 1.0 or isinstance(partial, bool):  # transformers rotates only that share of head_dim
        raise CheckpointError(
            where, f"partial_rotary_factor {partial!r}: expected 1.0 (partial RoPE is not implemented by the decoder)"
        )
    rope_type = "default"
    if block is not None:
        rt = block.get("rope_type", block.get("type", "default"))
        key = f"{label}rope_type" if "rope_type" in block or "type" not in block else f"{label}type"
        if rt not in ROPE_TYPES:
            raise CheckpointError(
                where,
                f"{key} {rt!r}: this RoPE scaling is not implemented by the decoder",
                hint=f"implemented: {', '.join(ROPE_TYPES)} ({', '.join(ROPE_TYPES[1:])} for model_type llama)",
            )
        if rt != "default" and model_type != "llama":
            raise CheckpointError(
                where, f"{key} {rt!r}: scaled RoPE is implemented for model_type llama only, not {model_type!r}"
            )
        rope_type = str(rt)
    return RopeConfig(theta, rope_type, _Cfg(block, where, label=label) if rope_type != "default" and block else None)


@dataclass(frozen=True)
class _SizeKeys:
    """Where a checkpoint format states a decoder's sizes (the :class:`Dimensions` fields)."""

    n_layers: str
    d_model: str
    n_heads: str
    n_kv_heads: str
    head_dim: str
    d_ff: str
    vocab_size: str = "vocab_size"


_HF_SIZES = _SizeKeys(
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size"
)
_GGUF_SIZES = _SizeKeys(
    "block_count",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "feed_forward_length",
)


def _dimensions(c: _Cfg, family: str, keys: _SizeKeys, vocab_default: int | None = None) -> dict[str, Any]:
    """A decoder's family and sizes as FamilyConfig fields: KV heads default to the heads, head_dim to
    d_model / heads."""
    d = c.integer(keys.d_model)
    heads = c.integer(keys.n_heads)
    head_dim = c.integer(keys.head_dim) if c.doc.get(c.prefix + keys.head_dim) is not None else d // heads
    dims = Dimensions(
        family=family,
        n_layers=c.integer(keys.n_layers),
        d_model=d,
        n_heads=heads,
        n_kv_heads=c.integer(keys.n_kv_heads, heads),
        head_dim=head_dim,
        d_ff=c.integer(keys.d_ff),
        vocab_size=c.integer(keys.vocab_size, vocab_default),
    )
    return asdict(dims)


def from_hf_config(doc: Mapping[str, Any], where: object) -> FamilyConfig:
    """A Hugging Face ``config.json`` mapping as a :class:`FamilyConfig`; CheckpointError otherwise."""
    model_type = doc.get("model_type")
    if model_type not in SUPPORTED:
        raise unsupported_family(where, "model_type", model_type)
    c = _Cfg(doc, where)
    rope = hf_rope(doc, where, str(model_type))
    for key in ("rms_norm_eps", "max_position_embeddings"):
        if doc.get(key) is None:
            raise _missing(where, key)
    if doc.get("hidden_act", "silu") != "silu":
        raise CheckpointError(where, f"hidden_act {doc.get('hidden_act')!r}: expected 'silu' (SiLU-gated MLP)")
    if doc.get("mlp_bias"):
        raise CheckpointError(where, "mlp_bias true: MLP biases are not supported (expected false)")
    if doc.get("use_sliding_window"):
        raise CheckpointError(where, "use_sliding_window true: sliding-window attention is not supported")
    sizes = _dimensions(c, str(model_type), _HF_SIZES)
    attn_bias = True if model_type == "qwen2" else c.flag("attention_bias", False)
    fc = FamilyConfig(
        **sizes,
        max_position_embeddings=c.integer("max_position_embeddings"),
        rope_theta=rope.theta,
        norm_eps=c.ranged("rms_norm_eps"),
        tie_embeddings=c.flag("tie_word_embeddings", False),
        attn_bias=attn_bias,
        qk_norm=model_type == "qwen3",
        bos_token_id=c.token_id("bos_token_id", sizes["vocab_size"]),
        eos_token_id=c.token_id("eos_token_id", sizes["vocab_size"]),
    )
    c.token_id("pad_token_id", sizes["vocab_size"])  # not used by the decoder, but a declared id is an id
    if rope.params is not None and rope.rope_type == "llama3":
        fc = replace(fc, rope_factors=llama3_rope_factors(rope.params, fc))
    elif rope.params is not None and rope.rope_type == "linear":  # positions / factor == every frequency / factor
        if rope.params.doc.get("factor") is None:
            raise _missing(where, f"{rope.params.label}factor", " (rope_type linear needs it)")
        fc = replace(fc, rope_factors=(rope.params.ranged("factor"),) * (fc.head_dim // 2))
    return _check_shape(where, fc)


def llama3_rope_factors(s: _Cfg, fc: FamilyConfig) -> tuple[float, ...]:
    """Per-pair divisors of Llama 3's ``rope_scaling: llama3`` (transformers ``_compute_llama3_parameters``).

    Pairs whose wavelength is shorter than ``original_max_position_embeddings / high_freq_factor``
    keep their frequency, longer than ``... / low_freq_factor`` divide it by ``factor``, and the
    band between is interpolated: divisor ``1 / ((1 - smooth) / factor + smooth)``.
    """
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if s.doc.get(key) is None:  # transformers requires each of them too (no default)
            raise _missing(s.where, f"{s.label}{key}", " (rope_type llama3 needs it)")
    factor = s.ranged("factor")
    low, high = s.ranged("low_freq_factor"), s.ranged("high_freq_factor")
    old = s.integer("original_max_position_embeddings")
    if high <= low:
        raise CheckpointError(s.where, f"{s.label}high_freq_factor {high} must exceed {s.label}low_freq_factor {low}")
    if old > fc.max_position_embeddings:  # scaling stretches the trained context; it cannot shrink it
        raise CheckpointError(
            s.where,
            f"{s.label}original_max_position_embeddings {old} is over max_position_embeddings "
            f"{fc.max_position_embeddings}; expected the shorter context the model was first trained on",
        )
    out = []
    for i in range(0, fc.head_dim, 2):
        wavelen = 2 * math.pi * fc.rope_theta ** (i / fc.head_dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return tuple(out)


def from_gguf_metadata(
    meta: Mapping[str, Any], where: object, *, has_output: bool, n_tokens: int | None = None
) -> FamilyConfig:
    """GGUF key/value metadata (``general.architecture`` and ``<arch>.*``) as a :class:`FamilyConfig`;
    ``n_tokens``, the length of ``tokenizer.ggml.tokens`` when it is not decoded yet, is the default vocabulary."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED:
        raise unsupported_family(where, "general.architecture", arch)
    c = _Cfg(meta, where, prefix=f"{arch}.")
    linear = gguf_linear_factor(meta, str(arch), where)
    if meta.get(f"{arch}.attention.sliding_window") and arch != "qwen2":
        raise CheckpointError(where, f"{arch}.attention.sliding_window: sliding-window attention is not supported")
    for key in ("context_length", "rope.freq_base", "attention.layer_norm_rms_epsilon"):
        if meta.get(f"{arch}.{key}") is None:
            raise _missing(where, f"{arch}.{key}", " (a GGUF states it in its metadata)")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab_default = len(tokens) if isinstance(tokens, list) else n_tokens
    fc = FamilyConfig(
        **_dimensions(c, str(arch), _GGUF_SIZES, vocab_default),
        max_position_embeddings=c.integer("context_length"),
        rope_theta=c.ranged("rope.freq_base"),
        norm_eps=c.ranged("attention.layer_norm_rms_epsilon"),
        tie_embeddings=not has_output,
        attn_bias=False,  # set by the caller from the tensors present (qwen2 always has q/k/v bias)
        qk_norm=arch == "qwen3",
        bos_token_id=_Cfg(meta, where, "tokenizer.ggml.").token_id("bos_token_id"),
        eos_token_id=_Cfg(meta, where, "tokenizer.ggml.").token_id("eos_token_id"),
    )
    if linear is not None:  # positions / factor == every frequency / factor, as for config.json's linear
        fc = replace(fc, rope_factors=(linear,) * (fc.head_dim // 2))
    return _check_shape(where, fc)


def gguf_linear_factor(meta: Mapping[str, Any], arch: str, where: object) -> float | None:
    """The linear RoPE factor a GGUF states, or None for plain RoPE; CheckpointError for a scaling not run.

    llama.cpp (``llama_model::load_hparams``) reads ``rope.scaling.type`` with the default ``"linear"`` and the
    factor from ``rope.scaling.factor`` (older files: ``rope.scale_linear``): a factor without a type is linear
    scaling, applied here the same way and held to ``calctl.limits.ROPE_FACTOR``; never dropped. A factor of 1
    is no scaling. YaRN and the other types are refused, and so is a factor beside ``type: none``.
    """
    type_key = f"{arch}.rope.scaling.type"
    key = next((k for k in (f"{arch}.rope.scaling.factor", f"{arch}.rope.scale_linear") if k in meta), None)
    scaling = meta.get(type_key)
    factor = meta.get(key) if key is not None else None
    if scaling not in (None, "none", "linear"):
        raise CheckpointError(
            where, f"{type_key} {scaling!r}: this RoPE scaling is not implemented by the decoder (linear is)"
        )
    if factor is None:
        if scaling == "linear":
            raise _missing(where, f"{arch}.rope.scaling.factor", " (rope.scaling.type linear needs it)")
        return None
    assert key is not None
    wrong = limits.out_of_range("factor", factor)
    if wrong:
        implied = "" if scaling is not None else f" ({type_key} absent: llama.cpp reads that as linear scaling)"
        raise CheckpointError(where, f"{key}: {wrong}{implied}")
    if scaling == "none" and float(factor) != 1.0:
        raise CheckpointError(
            where,
            f"{key} {factor!r} beside {type_key} 'none': the file states a scaling factor and no scaling; "
            "expected one of them",
        )
    return None if float(factor) == 1.0 else float(factor)
