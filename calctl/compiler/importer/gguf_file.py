"""Read a llama.cpp GGUF file: metadata, dequantised weights, and a rebuilt tokenizer.

* Weights: ``gguf.GGUFReader`` maps the file; every tensor is dequantised to
  float32 by ``gguf.quants.dequantize`` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, the
  K-quants and whatever else that library covers). A type it cannot dequantise
  is refused by name.
* Llama's Q/K rows: llama.cpp's converter permutes ``q_proj``/``k_proj`` rows
  (per head, the two RoPE halves interleaved) so that its "normal" RoPE rotates
  adjacent pairs. :func:`unpermute_rope_rows` undoes it, so the package holds
  Hugging Face row order and runs with ``rope_style: half``, exactly as the HF
  original. Qwen2/Qwen3 are stored unpermuted (NeoX RoPE) and are left alone.
* Tokenizer: ``tokenizer.ggml.*`` (tokens, merges, token types, BOS/EOS, the
  ``pre`` splitting rule) become a ``tokenizers`` byte-level BPE tokenizer;
  ``tokenizer.chat_template`` goes into ``tokenizer_config.json``. Only the GPT-2
  style BPE (``tokenizer.ggml.model = gpt2``) is rebuilt; SentencePiece
  vocabularies are refused with what to use instead.

This module reads the file; it writes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from calctl import limits
from calctl.compiler.importer.families import CheckpointError, FamilyConfig, from_gguf_metadata
from calctl.compiler.importer.gguf_header import ArrayRef, GgufHeader, read_header
from calctl.model.quant import QuantTensor
from calctl.package import tokenizer_file

# tokenizer.ggml.pre -> the regex llama.cpp splits with before BPE (llama-vocab.cpp); None = GPT-2's own.
_LLAMA3_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS: dict[str, str] = {
    "default": "gpt2",
    "gpt2": "gpt2",
    "gpt-2": "gpt2",
    "smollm": "digits+gpt2",
    "starcoder": "digits+gpt2",
    "refact": "digits+gpt2",
    "llama3": "llama3",
    "llama-bpe": "llama3",
    "qwen2": "qwen2",
}
TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4
#: GGUF value types (gguf.GGUFValueType): the integer ones, BOOL and STRING.
_INTEGER_TYPES, _BOOL_TYPE, _STRING_TYPE = (0, 1, 2, 3, 4, 5, 10, 11), 7, 8


@dataclass(frozen=True)
class GgufCheckpoint:
    path: Path
    config: FamilyConfig
    params: dict[str, Any]  # np.ndarray, or QuantTensor for kept blocks
    tokenizer_json: bytes
    tokenizer_config: dict[str, Any]
    quant_types: tuple[str, ...]
    ignored_metadata: tuple[str, ...] = ()  # keys read but not used (names, licence, scores), for the import notes


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``permute(w, n_head)`` of Q/K rows (convert_hf_to_gguf.py, LlamaModel)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's own permutation (for tests that write GGUF files like its converter does)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class _Seen(dict[str, Any]):
    """The metadata, remembering every key a reader looked up: the rest is reported as ignored."""

    def __init__(self, items: dict[str, Any]) -> None:
        super().__init__(items)
        self.used: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.used.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.used.add(key)
        return super().__contains__(key)


#: Metadata a GGUF may carry that says nothing the package needs (names, licences, the converter's file type).
_DESCRIPTIVE = ("general.",)


def _check_counts(meta: dict[str, Any], path: Path, arch: str) -> None:
    """Every integer the file declares under ``<arch>.`` or ``tokenizer.`` against its limit (calctl.limits); a
    mixture of experts is refused by name (the families here are dense), not read as a dense model."""
    for key, value in meta.items():
        if isinstance(value, bool) or not isinstance(value, int) or not key.startswith((f"{arch}.", "tokenizer.")):
            continue
        field = key.removeprefix(f"{arch}.").removeprefix("tokenizer.ggml.")
        too_big = limits.over_limit(field, value)
        if too_big:
            raise CheckpointError(path, f"{key}: {too_big}")
    for key in ("expert_count", "expert_used_count"):
        n = meta.get(f"{arch}.{key}")
        if n:
            raise CheckpointError(
                path, f"{arch}.{key} {n}: a mixture of experts; calctl imports dense {arch} models only"
            )


def _check_token_ids(meta: dict[str, Any], path: Path, n_tokens: int) -> None:
    """Every ``tokenizer.ggml.*_token_id`` names a token of the vocabulary (none is dropped for being out of it)."""
    for key in sorted(k for k in meta if k.startswith("tokenizer.ggml.") and k.endswith("_token_id")):
        value = meta[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n_tokens:
            raise CheckpointError(
                path,
                f"{key} {value!r} is outside the vocabulary (ids 0..{n_tokens - 1}: "
                f"tokenizer.ggml.tokens holds {n_tokens:,})",
            )


def _gguf_names(cfg: FamilyConfig) -> list[tuple[str, str, tuple[int, ...], bool]]:
    """``(gguf name, package name, numpy shape as stored, transpose)``."""
    d, f, v, hd = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.head_dim
    qw, kw = cfg.n_heads * hd, cfg.n_kv_heads * hd
    out: list[tuple[str, str, tuple[int, ...], bool]] = [("token_embd.weight", "embed", (v, d), False)]
    for i in range(cfg.n_layers):
        b, p = f"blk.{i}.", f"layers.{i}."
        out += [
            (b + "attn_norm.weight", p + "attn_norm", (d,), False),
            (b + "attn_q.weight", p + "wq", (qw, d), True),
            (b + "attn_k.weight", p + "wk", (kw, d), True),
            (b + "attn_v.weight", p + "wv", (kw, d), True),
        ]
        if cfg.attn_bias:
            out += [
                (b + "attn_q.bias", p + "bq", (qw,), False),
                (b + "attn_k.bias", p + "bk", (kw,), False),
                (b + "attn_v.bias", p + "bv", (kw,), False),
            ]
        if cfg.qk_norm:
            out += [
                (b + "attn_q_norm.weight", p + "q_norm", (hd,), False),
                (b + "attn_k_norm.weight", p + "k_norm", (hd,), False),
            ]
        out += [
            (b + "attn_output.weight", p + "wo", (d, qw), True),
            (b + "ffn_norm.weight", p + "mlp_norm", (d,), False),
            (b + "ffn_gate.weight", p + "w_gate", (f, d), True),
            (b + "ffn_up.weight", p + "w_up", (f, d), True),
            (b + "ffn_down.weight", p + "w_down", (d, f), True),
        ]
    out.append(("output_norm.weight", "final_norm", (d,), False))
    if not cfg.tie_embeddings:
        out.append(("output.weight", "lm_head", (v, d), True))
    return out


def _dequantize(t: Any, path: Path) -> np.ndarray:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = tuple(int(x) for x in reversed(list(t.shape)))
    try:
        qtype = GGMLQuantizationType(int(t.tensor_type))
        if qtype is GGMLQuantizationType.F32:
            arr = np.asarray(t.data, dtype=np.float32)
        elif qtype is GGMLQuantizationType.F16:
            arr = np.asarray(t.data, dtype=np.float16).astype(np.float32)
        else:
            arr = dequantize(np.asarray(t.data), qtype)
        return np.asarray(arr, dtype=np.float32).reshape(shape)
    except NotImplementedError:
        raise CheckpointError(
            path, f"tensor {t.name}: gguf cannot dequantise type {t.tensor_type!s}", hint="re-quantise to Q8_0/Q4_K/F16"
        ) from None
    except (ValueError, TypeError) as exc:
        raise CheckpointError(path, f"tensor {t.name}: data does not fit shape {list(shape)} ({exc})") from None


#: GGUF tensor types kept in their blocks with ``keep_blocks`` (the ones the decoder's kernels compute on).
KEPT_BLOCKS = {"Q4_0": "q4_0", "Q4_1": "q4_1", "Q8_0": "q8_0"}


def _blocks(t: Any, name: str, shape: tuple[int, ...], transpose: bool) -> QuantTensor | None:
    """The tensor's own blocks as a :class:`QuantTensor` in package shape, or None for other types."""
    kind = KEPT_BLOCKS.get(getattr(t.tensor_type, "name", ""))
    if kind is None:
        return None
    package_shape = (shape[1], shape[0]) if transpose else shape
    raw = np.asarray(t.data, dtype=np.uint8).reshape(shape[0], -1)  # GGML rows: out features (embed: tokens)
    try:
        return QuantTensor(name, kind, package_shape, np.ascontiguousarray(raw))
    except ValueError:  # a layout the kernels do not take (e.g. a row not whole blocks): dequantise instead
        return None


@dataclass(frozen=True)
class _Tensor:
    """One tensor as the dequantiser needs it (the shape of ``gguf.ReaderTensor``): GGUF-order dims, type, data."""

    name: str
    shape: tuple[int, ...]
    tensor_type: Any  # gguf.GGMLQuantizationType
    data: np.ndarray


def _tensors(h: GgufHeader) -> dict[str, _Tensor]:
    """Every tensor's type and byte range checked against the file, its data a view of the mapped file."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    out: dict[str, _Tensor] = {}
    spans: list[tuple[int, int, str]] = []  # (offset, end, name) of each tensor's bytes, from the data start
    for t in h.tensors:
        if t.offset % h.alignment:
            raise CheckpointError(
                h.path,
                f"tensor {t.name}: data offset {t.offset:,} is not a multiple of general.alignment {h.alignment} "
                f"({t.offset % h.alignment} byte(s) past {t.offset - t.offset % h.alignment:,}); a GGUF writer "
                "aligns every tensor's data, so its bytes would be read shifted",
            )
        try:
            qtype = GGMLQuantizationType(t.ggml_type)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise CheckpointError(h.path, f"tensor {t.name}: unknown GGML type {t.ggml_type}") from None
        inner = t.dims[0] if t.dims else 1
        if inner % block:
            raise CheckpointError(
                h.path, f"tensor {t.name}: a row of {inner} elements is not whole {qtype.name} blocks of {block}"
            )
        n_bytes = t.elements // block * type_size
        end = h.data_start + t.offset + n_bytes
        if end > h.size:
            raise CheckpointError(
                h.path,
                f"truncated: tensor {t.name} needs bytes {h.data_start + t.offset}..{end}, the file has {h.size}",
            )
        spans.append((t.offset, t.offset + n_bytes, t.name))
        rows = tuple(reversed(t.dims)) or (1,)
        data = h.tensor_data(t, n_bytes)
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            data = data.view(np.dtype("f4" if qtype is GGMLQuantizationType.F32 else "f2").newbyteorder(h.order))
            data = data.reshape(rows)
        else:
            data = data.reshape(*rows[:-1], rows[-1] // block * type_size)
        out[t.name] = _Tensor(t.name, t.dims, qtype, data)
    _refuse_overlaps(h.path, spans)
    return out


def _refuse_overlaps(path: Path, spans: list[tuple[int, int, str]]) -> None:
    """Refuse two tensors whose bytes share the data section (one's offset inside the other's bytes): a writer
    gives each tensor its own bytes, and a shared range makes one tensor's weights another's."""
    reach, owner = 0, None  # the furthest byte any earlier tensor (by offset) covers, and that tensor
    for start, end, name in sorted(spans):
        if owner is not None and start < reach and end > start:
            o_start, _, o_name = owner
            raise CheckpointError(
                path,
                f"tensors {o_name} (data offset {o_start:,}, bytes up to {reach:,}) and {name} (data offset "
                f"{start:,}) overlap: each tensor's data must have its own bytes",
            )
        if end > reach:
            reach, owner = end, (start, end, name)


def _check_table(h: GgufHeader, cfg: FamilyConfig) -> None:
    """The tensor table holds exactly what the family and ``block_count`` imply, in the shapes the metadata
    implies (plus llama.cpp's ``rope_freqs.weight``): an extra tensor is refused by name, never skipped."""
    table = {t.name: t for t in h.tensors}
    names = _gguf_names(cfg)
    if len(table) > len(names) + 1:
        raise CheckpointError(
            h.path,
            f"{len(table):,} tensors, more than the {len(names) + 1:,} a {cfg.family} of {cfg.n_layers} blocks has "
            "(with rope_freqs.weight)",
            hint="expected exactly the tensors llama.cpp's converter writes for this family and block_count",
        )
    for gname, _, shape, _ in names:  # names and shapes first: no array is decoded for a file that lacks them
        found = table.get(gname)
        if found is None:
            raise CheckpointError(h.path, f"no tensor {gname} (expected shape {list(shape)} for {cfg.family})")
        stored = tuple(reversed(found.dims))
        if stored != shape:
            raise CheckpointError(
                h.path, f"tensor {gname} has shape {list(stored)}, the metadata implies {list(shape)}"
            )
    expected = {g for g, _, _, _ in names} | {"rope_freqs.weight"}
    extra = [t.name for t in h.tensors if t.name not in expected]
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        raise CheckpointError(
            h.path,
            f"{len(h.tensors):,} tensors, {len(extra):,} of them not part of a {cfg.family} of "
            f"{cfg.n_layers} blocks ({shown})",
            hint="expected exactly the tensors llama.cpp's converter writes for this family and block_count",
        )


def _rope_factors(freqs: _Tensor, cfg: FamilyConfig, path: Path) -> np.ndarray:
    factors = _dequantize(freqs, path).reshape(-1)
    if factors.shape != (cfg.head_dim // 2,):
        raise CheckpointError(
            path, f"tensor rope_freqs.weight: expected {cfg.head_dim // 2} factors (head_dim / 2), found {factors.size}"
        )
    # llama.cpp's divisors each lie between 1 and the scaling factor (convert_hf_to_gguf.py, LlamaModel): the range
    # import hf and validate (GOLD009) hold them to.
    low, high = limits.ROPE_FACTOR.minimum, limits.ROPE_FACTOR.maximum
    bad = np.flatnonzero(~(np.isfinite(factors) & (factors >= low) & (factors <= high)))
    if bad.size:
        i = int(bad[0])
        raise CheckpointError(
            path,
            f"tensor rope_freqs.weight[{i}] = {float(factors[i]):.7g}: expected a factor from {low:g} to {high:g}"
            + (f" ({bad.size} of {factors.size} are outside)" if bad.size > 1 else ""),
        )
    return factors


def read_gguf(path: Path, *, keep_blocks: bool = False) -> GgufCheckpoint:
    """Read and check a GGUF file; CheckpointError (exit 2) naming the file and what was expected otherwise.

    With ``keep_blocks`` the Q4_0/Q4_1/Q8_0 matrices stay in their blocks (:class:`QuantTensor`, Llama's Q/K
    rows un-permuted by moving whole rows); everything else is dequantised to float32.
    """
    path = Path(path)
    if not path.is_file():
        what = "not a regular file" if path.exists() else "no such file"  # a FIFO is never opened: it would block
        raise CheckpointError(path, f"{what}; expected a GGUF model file")
    h = read_header(path)  # every declared count against the file's size and calctl.limits; no library reader
    meta = _Seen({k: v for k, v in h.metadata.items()})
    arch = str(meta.get("general.architecture"))
    _check_counts(meta, path, arch)
    tokens_ref = h.metadata.get("tokenizer.ggml.tokens")
    n_tokens = tokens_ref.count if isinstance(tokens_ref, ArrayRef) else None
    cfg = from_gguf_metadata(
        meta, path, has_output=any(t.name == "output.weight" for t in h.tensors), n_tokens=n_tokens
    )
    if n_tokens is not None:
        _check_token_counts(h, meta, cfg, n_tokens)
    rotary = meta.get(f"{arch}.rope.dimension_count")
    if rotary is not None and rotary != cfg.head_dim:
        raise CheckpointError(
            path, f"{arch}.rope.dimension_count {rotary!r}: expected head_dim {cfg.head_dim} (partial RoPE is not run)"
        )
    if cfg.family == "qwen2" or any(t.name == "blk.0.attn_q.bias" for t in h.tensors):
        cfg = replace(cfg, attn_bias=True)
    _check_table(h, cfg)
    tensors = _tensors(h)  # every byte range inside the file; views, nothing read yet
    meta = _decoded(h, meta)  # before any weight is read: an empty or repeated token is refused at once
    _check_vocab_arrays(h, meta)
    params: dict[str, Any] = {}
    cfg = _rope_scaling(tensors.get("rope_freqs.weight"), cfg, path, arch, params)  # Llama 3: per-pair divisors
    for gname, name, shape, transpose in _gguf_names(cfg):
        found = tensors.get(gname)
        if found is None:
            raise CheckpointError(path, f"no tensor {gname} (expected shape {list(shape)} for {cfg.family})")
        stored = tuple(int(x) for x in reversed(list(found.shape)))
        if stored != shape:
            raise CheckpointError(path, f"tensor {gname} has shape {list(stored)}, the metadata implies {list(shape)}")
        params[name] = _weight(found, name, (shape, transpose), cfg, path, keep_blocks=keep_blocks)
    tok_json, tok_cfg = build_tokenizer(meta, path, context=cfg.max_position_embeddings)
    quant = tuple(sorted({t.tensor_type.name for t in tensors.values()}))
    ignored = tuple(sorted(k for k in h.metadata if k not in meta.used))
    return GgufCheckpoint(
        path=path,
        config=cfg,
        params=params,
        tokenizer_json=tok_json,
        tokenizer_config=tok_cfg,
        quant_types=quant,
        ignored_metadata=ignored,
    )


def _check_token_counts(h: GgufHeader, meta: _Seen, cfg: FamilyConfig, n_tokens: int) -> None:
    """The tokenizer's token count within the vocabulary, its token ids and its merges' count in bounds."""
    if n_tokens > cfg.vocab_size:
        raise CheckpointError(
            h.path,
            f"tokenizer.ggml.tokens holds {n_tokens:,} tokens, more than the model's vocabulary of "
            f"{cfg.vocab_size:,} (token_embd.weight rows): the extra ids would have no embedding",
        )
    _check_token_ids(meta, h.path, n_tokens)
    _check_merge_count(h, h.path, n_tokens)


def _rope_scaling(
    freqs: _Tensor | None, cfg: FamilyConfig, path: Path, arch: str, params: dict[str, Any]
) -> FamilyConfig:
    """The config with llama.cpp's per-pair RoPE divisors (the tensor rope_freqs.weight, Llama 3 scaling) or the
    metadata's linear factors (families); either goes into ``params["rope_freq_factors"]``."""
    if freqs is None:
        if cfg.rope_factors is not None:
            params["rope_freq_factors"] = np.array(cfg.rope_factors, dtype=np.float32)
        return cfg
    if cfg.rope_factors is not None:
        raise CheckpointError(
            path,
            f"{arch}.rope.scaling.factor and the tensor rope_freqs.weight both scale RoPE; expected one of them "
            "(llama.cpp's converter writes rope_freqs.weight for Llama 3 scaling and no linear factor)",
        )
    factors = _rope_factors(freqs, cfg, path)
    params["rope_freq_factors"] = factors.astype(np.float32)
    return replace(cfg, rope_factors=tuple(float(f) for f in factors))


def _weight(
    t: _Tensor, name: str, layout: tuple[tuple[int, ...], bool], cfg: FamilyConfig, path: Path, *, keep_blocks: bool
) -> Any:
    """One checked weight: Q4_0/Q4_1/Q8_0 blocks kept (``keep_blocks``) or float32, Llama's Q/K rows un-permuted,
    transposed where the package's layout wants it; CheckpointError on NaN or infinite values."""
    shape, transpose = layout
    q = _blocks(t, name, shape, transpose) if keep_blocks else None
    if q is not None:
        if cfg.family == "llama" and name.endswith((".wq", ".wk")):
            heads = cfg.n_heads if name.endswith(".wq") else cfg.n_kv_heads
            q = q.take_rows(unpermute_rope_rows(np.arange(q.rows), heads))
        if not np.all(np.isfinite(q.dequantize_rows())):
            raise CheckpointError(path, f"tensor {t.name} holds NaN or infinite values")
        return q
    arr = _dequantize(t, path)
    if cfg.family == "llama" and name.endswith((".wq", ".wk", ".bq", ".bk")):
        arr = unpermute_rope_rows(arr, cfg.n_heads if name.endswith((".wq", ".bq")) else cfg.n_kv_heads)
    if not np.all(np.isfinite(arr)):
        raise CheckpointError(path, f"tensor {t.name} holds NaN or infinite values")
    return np.ascontiguousarray(arr.T) if transpose else arr


def _check_merge_count(h: GgufHeader, path: Path, n_tokens: int) -> None:
    """The merges' count held to the bound a tokenizer.json is (4 per token, plus 1,024), before they are decoded
    or the tokenizers library builds them (issue 54)."""
    merges = h.metadata.get("tokenizer.ggml.merges")
    top = tokenizer_file.MERGES_PER_ENTRY * n_tokens + 1024
    if isinstance(merges, ArrayRef) and merges.count > top:
        raise CheckpointError(
            path,
            f"tokenizer.ggml.merges holds {merges.count:,} entries, more than {top:,} "
            f"({tokenizer_file.MERGES_PER_ENTRY} per token of tokenizer.ggml.tokens, plus 1,024; "
            "calctl.package.tokenizer_file.MERGES_PER_ENTRY)",
        )


def _decoded(h: GgufHeader, meta: _Seen) -> _Seen:
    """``meta`` with the tokenizer's arrays decoded (tokens distinct and non-empty, token types one per token)."""
    if isinstance(h.metadata.get("tokenizer.ggml.tokens"), ArrayRef):
        meta["tokenizer.ggml.tokens"] = h.strings("tokenizer.ggml.tokens", distinct=True)
    if isinstance(h.metadata.get("tokenizer.ggml.merges"), ArrayRef):
        meta["tokenizer.ggml.merges"] = h.strings("tokenizer.ggml.merges")
    types = h.metadata.get("tokenizer.ggml.token_type")
    if isinstance(types, ArrayRef):
        n = len(meta["tokenizer.ggml.tokens"]) if isinstance(meta.get("tokenizer.ggml.tokens"), list) else 0
        if types.count != n:
            raise CheckpointError(
                h.path, f"tokenizer.ggml.token_type holds {types.count:,} entries, tokenizer.ggml.tokens {n:,}"
            )
        meta["tokenizer.ggml.token_type"] = h.numbers("tokenizer.ggml.token_type")
    return meta


#: llama.cpp's ``enum llama_token_type`` (llama.h): UNDEFINED 0, NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4,
#: UNUSED 5, BYTE 6.
TOKEN_TYPES = range(7)


def _check_vocab_arrays(h: GgufHeader, meta: _Seen) -> None:
    """What the tokenizer arrays and flags hold, by value (issue 54): every ``tokenizer.ggml.*_token_ids`` id
    inside the vocabulary, every token type one of llama.cpp's, the scores one finite number per token, and
    ``tokenizer.ggml.add_*`` flags stored as BOOL. A key named by index and value, before any weight is read."""
    tokens = meta.get("tokenizer.ggml.tokens")
    n = len(tokens) if isinstance(tokens, list) else 0
    for key in sorted(k for k in h.metadata if k.startswith("tokenizer.ggml.") and k.endswith("_token_ids")):
        ref = h.metadata[key]
        if not isinstance(ref, ArrayRef) or ref.etype not in _INTEGER_TYPES:
            raise CheckpointError(h.path, f"{key}: expected an array of token ids (integers), found {ref!r}")
        ids = np.asarray(h.numbers(key), dtype=np.int64)
        bad = np.flatnonzero((ids < 0) | (ids >= n))
        if bad.size:
            i = int(bad[0])
            raise CheckpointError(
                h.path,
                f"{key}[{i}] = {int(ids[i])} is outside the vocabulary (ids 0..{n - 1}: tokenizer.ggml.tokens "
                f"holds {n:,})" + (f"; {bad.size} of its {ids.size} ids are outside" if bad.size > 1 else ""),
            )
    types = meta.get("tokenizer.ggml.token_type")
    if isinstance(types, list) and types:
        arr = np.asarray(types, dtype=np.float64)
        bad = np.flatnonzero(~np.isin(arr, np.arange(len(TOKEN_TYPES))))
        if bad.size:
            i = int(bad[0])
            raise CheckpointError(
                h.path,
                f"tokenizer.ggml.token_type[{i}] = {types[i]!r}: expected one of llama.cpp's token types "
                f"0..{len(TOKEN_TYPES) - 1} (llama_token_type: 1 normal, 3 control, 4 user-defined, 6 byte, ...)",
            )
    scores = h.metadata.get("tokenizer.ggml.scores")
    if scores is not None:
        if not isinstance(scores, ArrayRef) or scores.etype in (_STRING_TYPE, _BOOL_TYPE):
            raise CheckpointError(h.path, f"tokenizer.ggml.scores: expected an array of numbers, found {scores!r}")
        if scores.count != n:
            raise CheckpointError(
                h.path,
                f"tokenizer.ggml.scores holds {scores.count:,} entries, tokenizer.ggml.tokens {n:,}: expected one "
                "score per token",
            )
        values = np.asarray(h.numbers("tokenizer.ggml.scores"), dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            i = int(bad[0])
            raise CheckpointError(
                h.path,
                f"tokenizer.ggml.scores[{i}] = {float(values[i])!r}: expected a finite number"
                + (f" ({bad.size} of {values.size} are not)" if bad.size > 1 else ""),
            )
    for key in sorted(k for k in h.metadata if k.startswith("tokenizer.ggml.add_")):
        value = h.metadata[key]
        if not isinstance(value, bool):
            raise CheckpointError(
                h.path, f"{key}: expected a BOOL (true or false), found {value!r} ({type(value).__name__})"
            )


def _pre_tokenizer(kind: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(
        add_prefix_space=False, trim_offsets=True, use_regex=kind != "llama3" and kind != "qwen2"
    )
    if kind == "gpt2":
        return byte_level
    if kind == "digits+gpt2":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    regex = _LLAMA3_RE if kind == "llama3" else _QWEN2_RE
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False), byte_level])


def build_tokenizer(meta: dict[str, Any], path: Path, *, context: int) -> tuple[bytes, dict[str, Any]]:
    """``tokenizer.json`` bytes and a ``tokenizer_config.json`` mapping from ``tokenizer.ggml.*``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    model = meta.get("tokenizer.ggml.model")
    if model is None:
        raise CheckpointError(path, "no tokenizer.ggml.model: the file carries no tokenizer (expected gpt2 BPE)")
    if model != "gpt2":
        raise CheckpointError(
            path,
            f"tokenizer.ggml.model {model!r}: only the GPT-2 style byte-level BPE ('gpt2') is rebuilt from GGUF",
            hint="import the Hugging Face directory of this model instead (calctl import hf)",
        )
    tokens = meta.get("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges")
    if not isinstance(tokens, list) or not tokens or not isinstance(merges, list):
        raise CheckpointError(path, "tokenizer.ggml.tokens and tokenizer.ggml.merges must be non-empty string arrays")
    _check_token_ids(meta, path, len(tokens))
    pre = meta.get("tokenizer.ggml.pre", "default")
    kind = PRE_TOKENIZERS.get(str(pre))
    if kind is None:
        raise CheckpointError(
            path,
            f"tokenizer.ggml.pre {pre!r}: unknown pre-tokenizer",
            hint=f"supported: {', '.join(sorted(PRE_TOKENIZERS))}",
        )
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = []
    for m in merges:
        a, sep, b = str(m).partition(" ")
        if not sep:
            raise CheckpointError(path, f"tokenizer.ggml.merges entry {m!r} is not 'left right'")
        pairs.append((a, b))
    try:
        tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    except Exception as exc:
        raise CheckpointError(path, f"tokenizer.ggml.*: tokenizers cannot build a BPE from them ({exc})") from None
    tok.pre_tokenizer = _pre_tokenizer(kind)
    tok.decoder = decoders.ByteLevel()
    special = [
        AddedToken(t, special=types[i] == TOKEN_CONTROL, normalized=False)
        for i, t in enumerate(tokens)
        if i < len(types) and types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    ]
    tok.add_special_tokens([a for a in special if a.special])
    tok.add_tokens([a for a in special if not a.special])

    def token(key: str) -> str | None:
        i = meta.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    cfg = {
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "chat_template": meta.get("tokenizer.chat_template"),
        "model_max_length": context,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
    }
    canon = json.dumps(json.loads(tok.to_str()), indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    return canon.encode("utf-8"), {k: v for k, v in cfg.items() if v is not None}
