"""The architecture numbers a budget needs, read from a Hugging Face ``config.json``
or from a package manifest (001 §8.1, §8.4 "KV/sequence: config formula").

:class:`ModelShape` is the one typed view both inputs produce: layers, heads,
GQA KV heads, head_dim (explicit when the config states it: Qwen3 and Gemma-2 do
not satisfy ``head_dim = hidden / heads``), MLP widths, MoE experts, tied
embeddings and the per-layer attention window. Every guess made while reading a
config (a default for an absent field, the sliding-window convention) is kept in
``assumptions`` so the report can say it.

This module does not compute bytes (``kv``, ``weights``) and does not judge
anything (``policy``). It reads one file and raises :class:`UsageError` naming
the file and field for anything missing or malformed; it never guesses a
required number.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calctl import jsonsafe, limits
from calctl.budget.units import canonical_dtype
from calctl.errors import UsageError
from calctl.package.model import Model
from calctl.signing.files import NotReadable, read_regular

#: A config file larger than this is not a config.json.
_MAX_CONFIG_BYTES = 4 * 1024 * 1024

# Families whose MLP is a plain up/down pair (no gate projection). Everything else
# in the Llama lineage (llama, mistral, qwen*, gemma*, phi3, smollm) is gated.
_UNGATED = frozenset({"gpt2", "gpt_neox", "gpt_bigcode", "gptj", "opt", "bloom", "falcon", "phi", "starcoder2", "mpt"})
_KNOWN_GATED = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "gemma2",
        "gemma3",
        "gemma3_text",
        "phi3",
        "olmo",
        "olmo2",
        "olmoe",
        "granite",
        "granitemoe",
        "internlm2",
        "deepseek",
        "yi",
    }
)
# Gemma-2/3 wrap attention and MLP in pre+post norms: four RMSNorms per layer.
_SANDWICH_NORMS = frozenset({"gemma2", "gemma3", "gemma3_text"})
# Per-head q/k RMSNorm (head_dim weights each).
_QK_NORM = frozenset({"qwen3", "qwen3_moe", "gemma3", "gemma3_text"})
# Qwen2 attention always carries q/k/v biases (the config has no attention_bias field).
_QKV_BIAS = frozenset({"qwen2", "qwen2_moe"})
# transformers config classes whose tie_word_embeddings defaults to True.
_TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text"})


@dataclass(frozen=True)
class MoeShape:
    """Routed experts of a mixture-of-experts MLP (Qwen-MoE, Mixtral, OLMoE conventions)."""

    n_experts: int
    experts_per_token: int
    expert_intermediate: int
    #: Total width of always-on shared experts (0 = none).
    shared_intermediate: int = 0
    #: Qwen2-MoE gates its shared expert with a hidden -> 1 projection.
    shared_gate: bool = False
    #: Layer indices whose MLP is the expert block; the others are dense.
    sparse_layers: tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelShape:
    """The numbers of one decoder-only model that the budget formulas use."""

    name: str
    family: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    #: Dense MLP width (layers without experts); 0 if every layer is an expert layer.
    intermediate: int
    vocab: int
    tie_embeddings: bool
    #: Largest position the model supports (max_position_embeddings / context_limit); None = unstated.
    context_limit: int | None
    #: Weight dtype the model declares (canonical spelling, see ``units.DTYPE_BITS``).
    dtype: str
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    gated_mlp: bool = True
    norms_per_layer: int = 2
    qk_norm: bool = False
    moe: MoeShape | None = None
    #: Per layer: None = full attention, else the sliding-window length in tokens. Empty = all full.
    layer_windows: tuple[int | None, ...] = ()
    #: Which convention decided ``layer_windows`` (said in the report).
    window_convention: str = "none: every layer keeps the full context"
    assumptions: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.layer_windows and len(self.layer_windows) != self.n_layers:
            raise ValueError(f"layer_windows has {len(self.layer_windows)} entries for {self.n_layers} layers")

    @property
    def windows(self) -> tuple[int | None, ...]:
        return self.layer_windows or (None,) * self.n_layers

    @property
    def q_width(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.n_kv_heads * self.head_dim

    def is_sparse(self, layer: int) -> bool:
        return self.moe is not None and layer in self.moe.sparse_layers


# ---------------------------------------------------------------------------
# Hugging Face config.json


class _Reader:
    """Typed field access on a config document; every error names the file and field."""

    def __init__(self, doc: Mapping[str, Any], where: str) -> None:
        self.doc = doc
        self.where = where

    def _err(self, key: str, message: str) -> UsageError:
        return UsageError(f"{self.where}: field {key!r}: {message}")

    def has(self, key: str) -> bool:
        return self.doc.get(key) is not None

    def get_int(self, key: str, *, minimum: int = 1, required: bool = True, why: str = "") -> int | None:
        value = self.doc.get(key)
        if value is None:
            if required:
                raise self._err(key, f"missing{f' ({why})' if why else ''}")
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._err(key, f"expected an integer, found {json.dumps(value)}")
        if value < minimum:
            raise self._err(key, f"{value} is below the minimum {minimum}")
        too_big = limits.over_limit(key, value)  # before any loop runs per layer or expert (issue 54)
        if too_big:
            raise self._err(key, too_big)
        return value

    def req(self, key: str, *, minimum: int = 1, why: str = "") -> int:
        value = self.get_int(key, minimum=minimum, why=why)
        assert value is not None
        return value

    def get_bool(self, key: str) -> bool | None:
        value: bool | None = self._optional(key, bool, "true or false")
        return value

    def get_str(self, key: str) -> str | None:
        value: str | None = self._optional(key, str, "a string")
        return value

    def _optional(self, key: str, kind: type, expected: str) -> Any:
        """The field if present (not null) and a ``kind``, None if absent; else the error saying ``expected``."""
        value = self.doc.get(key)
        if value is not None and not isinstance(value, kind):
            raise self._err(key, f"expected {expected}, found {json.dumps(value)}")
        return value

    def ranges(self) -> None:
        """Every real-valued figure of the one table the config states (``rms_norm_eps``, ``rope_theta``, ...)
        finite and in range, as ``import hf`` holds them (issue 54: ``rms_norm_eps: 1e308`` was accepted)."""
        for key, r in limits.RANGE_BY_FIELD.items():  # top-level figures; rope_scaling's are its own object
            if r in (limits.ROPE_THETA, limits.NORM_EPS) and self.doc.get(key) is not None:
                wrong = limits.out_of_range(key, self.doc[key])
                if wrong:
                    raise self._err(key, wrong)

    def int_list(self, key: str) -> list[int] | None:
        value = self.doc.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise self._err(key, "expected a list of integers")
        if len(value) > limits.MAX_LAYERS.maximum:
            raise self._err(
                key, f"{len(value)} entries, more than the {limits.MAX_LAYERS.maximum:,} layers a model may have"
            )
        return list(value)


def load_hf_config(path: Path) -> ModelShape:
    """Read a Hugging Face ``config.json`` file into a :class:`ModelShape`."""
    path = Path(path)
    try:
        # A regular file only: a FIFO or device never blocks the command (issue 16).
        data = read_regular(path, _MAX_CONFIG_BYTES)
    except NotReadable as exc:
        if exc.missing:
            raise UsageError(f"--hf-config {path}: no such file") from None
        if path.is_dir():
            raise UsageError(f"--hf-config {path}: is a directory", hint="give the config.json file itself") from None
        if "byte limit" in exc.reason:
            raise UsageError(f"{path}: larger than {_MAX_CONFIG_BYTES} bytes; not a config.json") from None
        raise UsageError(f"--hf-config {path}: {exc.reason}") from None
    try:
        doc = jsonsafe.loads(data)
    except jsonsafe.JsonRefused as exc:  # too deep, or an integer of thousands of digits
        raise UsageError(f"{path}: {exc}; not a config.json") from None
    except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError
        raise UsageError(f"{path}: malformed JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: top level is {type(doc).__name__}, expected an object")
    default_name = path.parent.name if path.name == "config.json" else path.stem
    return shape_from_hf_config(doc, where=str(path), default_name=default_name)


def shape_from_hf_config(
    doc: Mapping[str, Any], *, where: str = "config.json", default_name: str = "model"
) -> ModelShape:
    """Build a :class:`ModelShape` from a parsed ``config.json`` mapping."""
    notes: list[str] = []
    if "num_hidden_layers" not in doc and isinstance(doc.get("text_config"), dict):
        # Multimodal wrappers (Gemma-3, LLaVA) keep the language model under text_config.
        notes.append("read the language model from text_config (the vision part is not budgeted)")
        outer = doc
        doc = {**doc["text_config"]}
        doc.setdefault("torch_dtype", outer.get("torch_dtype"))
        where = f"{where}: text_config"
    r = _Reader(doc, where)
    r.ranges()
    family = (r.get_str("model_type") or "").lower()
    name = r.get_str("_name_or_path") or default_name

    if r.has("kv_lora_rank"):
        raise UsageError(
            f"{where}: field 'kv_lora_rank': multi-head latent attention is outside the 001 §8.1 KV formula",
            hint="budget such a model from its compiled package, whose manifest states the KV layout",
        )

    n_layers = r.req("num_hidden_layers")
    hidden = r.req("hidden_size")
    n_heads = r.req("num_attention_heads")
    vocab = r.req("vocab_size")

    kv_heads = r.get_int("num_key_value_heads", required=False)
    if kv_heads is None:
        kv_heads = n_heads
        notes.append(f"no num_key_value_heads: multi-head attention assumed ({n_heads} KV heads)")
    if n_heads % kv_heads:
        raise UsageError(
            f"{where}: field 'num_key_value_heads': {kv_heads} does not divide num_attention_heads {n_heads} (GQA groups)"
        )

    head_dim = r.get_int("head_dim", required=False)
    if head_dim is None:
        if hidden % n_heads:
            raise UsageError(
                f"{where}: field 'head_dim': missing, and hidden_size {hidden} is not a multiple of "
                f"num_attention_heads {n_heads}"
            )
        head_dim = hidden // n_heads
        notes.append(f"head_dim = hidden_size / num_attention_heads = {head_dim} (the config states none)")
    elif head_dim * n_heads != hidden:
        notes.append(f"head_dim {head_dim} from the config (hidden_size / heads would give {hidden / n_heads:g})")

    moe = _moe_shape(r, n_layers, notes)
    all_sparse = moe is not None and len(moe.sparse_layers) == n_layers
    intermediate = r.get_int("intermediate_size", required=not all_sparse, why="width of the dense MLP") or 0

    tie = r.get_bool("tie_word_embeddings")
    if tie is None:
        tie = family in _TIED_BY_DEFAULT
        notes.append(
            f"no tie_word_embeddings: {'tied' if tie else 'separate'} embeddings assumed "
            f"(the {family or 'generic'} default)"
        )

    limit = r.get_int("max_position_embeddings", required=False)

    dtype_name = r.get_str("torch_dtype") or r.get_str("dtype")
    if dtype_name is None:
        dtype = "bf16"
        notes.append("no torch_dtype: bf16 weights assumed")
    else:
        dtype = canonical_dtype(dtype_name, f"{where}: field 'torch_dtype'")

    attention_bias = r.get_bool("attention_bias")
    if family in _QKV_BIAS:
        qkv_bias, o_bias = True, False
    else:
        qkv_bias = o_bias = bool(attention_bias)

    gated = family not in _UNGATED
    if family not in _UNGATED and family not in _KNOWN_GATED:
        notes.append(f"model_type {family or '(none)'!r}: gated MLP (gate, up, down) assumed")

    windows, convention = _layer_windows(r, family, n_layers)

    return ModelShape(
        name=name,
        family=family or "unknown",
        n_layers=n_layers,
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=vocab,
        tie_embeddings=tie,
        context_limit=limit,
        dtype=dtype,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=bool(r.get_bool("mlp_bias")),
        gated_mlp=gated,
        norms_per_layer=4 if family in _SANDWICH_NORMS else 2,
        qk_norm=family in _QK_NORM,
        moe=moe,
        layer_windows=windows,
        window_convention=convention,
        assumptions=tuple(notes),
    )


def _moe_shape(r: _Reader, n_layers: int, notes: list[str]) -> MoeShape | None:
    n_experts = 0
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        value = r.get_int(key, minimum=0, required=False)
        if value:
            n_experts = value
            break
    if not n_experts:
        return None
    top_k = r.req("num_experts_per_tok", why="experts routed per token")
    if top_k > n_experts:
        raise UsageError(f"{r.where}: field 'num_experts_per_tok': {top_k} is more than the {n_experts} experts")
    expert = r.get_int("moe_intermediate_size", required=False)
    if expert is None:
        expert = r.req("intermediate_size", why="expert width (no moe_intermediate_size)")
    shared, shared_gate = 0, False
    qwen_shared = r.get_int("shared_expert_intermediate_size", minimum=0, required=False)
    if qwen_shared:
        shared, shared_gate = qwen_shared, True
    else:
        n_shared = r.get_int("n_shared_experts", minimum=0, required=False)
        if n_shared:
            shared = n_shared * expert
    only_dense = set(r.int_list("mlp_only_layers") or [])
    step = r.get_int("decoder_sparse_step", required=False) or 1
    first_dense = r.get_int("first_k_dense_replace", minimum=0, required=False) or 0
    freq = r.get_int("moe_layer_freq", required=False) or 1
    sparse = tuple(
        i for i in range(n_layers) if i not in only_dense and i >= first_dense and (i + 1) % step == 0 and i % freq == 0
    )
    if len(sparse) != n_layers:
        notes.append(
            f"{len(sparse)} of {n_layers} layers use experts (mlp_only_layers / decoder_sparse_step / "
            "first_k_dense_replace)"
        )
    return MoeShape(
        n_experts=n_experts,
        experts_per_token=top_k,
        expert_intermediate=expert,
        shared_intermediate=shared,
        shared_gate=shared_gate,
        sparse_layers=sparse,
    )


def _layer_windows(r: _Reader, family: str, n_layers: int) -> tuple[tuple[int | None, ...], str]:
    """Per-layer sliding windows and the convention that produced them.

    Conventions, in order: an explicit ``layer_types`` list; Gemma-2 (even layers
    slide); Gemma-3 (every ``sliding_window_pattern``-th layer is full); Qwen2
    (``use_sliding_window`` and layers >= ``max_window_layers`` slide); otherwise a
    ``sliding_window`` applies to every layer (Mistral, Phi-3).
    """
    window = r.get_int("sliding_window", required=False)
    types = r.doc.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise UsageError(f"{r.where}: field 'layer_types': expected a list of strings")
        if len(types) != n_layers:
            raise UsageError(f"{r.where}: field 'layer_types': {len(types)} entries for {n_layers} layers")
        sliding = [t == "sliding_attention" for t in types]
        if not any(sliding):
            return (), "layer_types: every layer full_attention"
        if window is None:
            raise UsageError(
                f"{r.where}: field 'sliding_window': missing, but layer_types declares sliding_attention layers"
            )
        n = sum(sliding)
        return (
            tuple(window if s else None for s in sliding),
            f"layer_types: {n} sliding_attention layers (window {window}), {n_layers - n} full_attention",
        )
    if family == "gemma2":
        if window is None:
            return (), "gemma2 without sliding_window: every layer full"
        wins = tuple(window if i % 2 == 0 else None for i in range(n_layers))
        return wins, f"gemma2: even layers slide (window {window}), odd layers full attention"
    if family in ("gemma3", "gemma3_text") and window is not None:
        pattern = r.get_int("sliding_window_pattern", required=False) or 6
        wins = tuple(window if (i + 1) % pattern else None for i in range(n_layers))
        return wins, f"gemma3: every {pattern}th layer full attention, the others slide (window {window})"
    if "use_sliding_window" in r.doc:
        if not r.get_bool("use_sliding_window") or window is None:
            return (), "use_sliding_window is false: every layer keeps the full context (sliding_window ignored)"
        first = r.get_int("max_window_layers", minimum=0, required=False)
        first = n_layers if first is None else first
        wins = tuple(window if i >= first else None for i in range(n_layers))
        return wins, f"qwen2 convention: layers >= max_window_layers {first} slide (window {window})"
    if window is not None:
        return (window,) * n_layers, f"sliding_window {window} on every layer (mistral/phi-3 convention)"
    return (), "none: every layer keeps the full context"


# ---------------------------------------------------------------------------
# Package manifest


def shape_from_package_model(model: Model) -> ModelShape:
    """The manifest's architecture numbers for one model (docs/package-format.md: "the numbers needed for budgeting")."""
    a = model.architecture
    return ModelShape(
        name=model.alias,
        family=a.family,
        n_layers=a.n_layers,
        hidden=a.d_model,
        n_heads=a.n_heads,
        n_kv_heads=a.n_kv_heads,
        head_dim=a.head_dim,
        intermediate=a.d_ff,
        vocab=a.vocab_size,
        tie_embeddings=a.tie_embeddings,
        context_limit=a.context_limit,
        dtype=canonical_dtype(a.dtype, f"{model.pointer}/architecture/dtype"),
        window_convention="the manifest declares no sliding window: every layer keeps the full context",
    )
