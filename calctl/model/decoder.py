"""The decoder-only transformer the mock board runs, in numpy, for every supported family.

One Llama-shaped block (RMSNorm, RoPE, grouped-query attention, SiLU-gated MLP)
with the family differences as explicit :class:`~calctl.package.model.Architecture`
fields, so nothing is inferred from a family name:

* ``attn_bias`` – q/k/v projections carry a bias (Qwen2);
* ``qk_norm`` – an RMSNorm over ``head_dim`` on every query and key head before RoPE (Qwen3);
* ``head_dim`` – explicit, not ``d_model / n_heads`` (Qwen3);
* ``tie_embeddings`` – the LM head is the embedding matrix;
* ``rope_style`` – ``interleaved`` rotates pairs ``(2i, 2i+1)`` (the calctl tiny
  decoder, llama.cpp's "normal" mode), ``half`` rotates ``(i, i + head_dim/2)``
  (Hugging Face ``rotate_half``, llama.cpp's NeoX mode); ``rope_theta``, ``norm_eps``.

Parameters use the names of :func:`calctl.package.architecture.expected_tensor_shapes`;
matrices are stored ``[in, out]`` (``y = x @ W``).

Two independent code paths:

* :func:`reference_logits` recomputes the whole sequence with a causal mask, no
  cache, head by head, in float64 by default. Compilers use it for golden data.
* :func:`prepare` + :class:`KvCache` + :func:`prefill` / :func:`decode_step` is
  the cached float32 path the mock device runs, with fused QKV and gate/up
  matrices and the KV cache in device memory.

Golden runs compare the second against the first, so a KV-cache bug (or an
injected KV corruption) shows up as a logit or token mismatch. This module does
no file I/O except :func:`load_params` (reads param blobs).
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from calctl.model.native import KERNEL_DTYPES, LayerDesc, kernels, layer_desc
from calctl.model.quant import QUANT_DTYPES, QuantTensor, quantised_nbytes, stored_rows
from calctl.package.architecture import expected_tensor_shapes
from calctl.package.model import NUMPY_DTYPE, Architecture, ParamTensor

Params = Mapping[str, Any]  # np.ndarray, or QuantTensor for quantised weights

ROPE_STYLES = ("interleaved", "half")


def param_layout(arch: Architecture) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of every parameter tensor, in blob order."""
    return list(expected_tensor_shapes(arch).items())


def init_params(arch: Architecture, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Deterministic random weights with enough logit spread for stable greedy golden."""
    params: dict[str, np.ndarray] = {}
    for name, shape in param_layout(arch):
        if name.endswith("norm"):
            arr = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name == "embed":
            arr = 0.5 * rng.standard_normal(shape)
        elif len(shape) == 1:  # biases
            arr = 0.1 * rng.standard_normal(shape)
        else:
            arr = rng.standard_normal(shape) / np.sqrt(shape[0])
        params[name] = arr.astype(np.float32)
    return params


def load_params(root: Path, tensors: tuple[ParamTensor, ...], *, keep_dtype: bool = False) -> dict[str, Any]:
    """Read parameter tensors from their blobs (offset/shape/dtype from the manifest).

    Float tensors come back as float32 unless ``keep_dtype``; quantised ones (q4_0, q4_1, q8_0) as a
    :class:`~calctl.model.quant.QuantTensor` holding their blocks with ``keep_dtype``, else dequantised to float32.
    """
    out: dict[str, Any] = {}
    for t in tensors:
        if t.dtype in QUANT_DTYPES:
            try:
                rows, cols = stored_rows(t.name, t.shape)
                if cols % 32:
                    raise ValueError(f"tensor {t.name}: {t.dtype} rows of {cols} weights are not a multiple of 32")
                count = quantised_nbytes(t.dtype, rows, cols)
            except ValueError as exc:
                raise ValueError(f"{t.file}: {exc}") from None
            raw = np.fromfile(root / t.file, dtype=np.uint8, count=count, offset=t.offset)
            if raw.size != count:
                raise ValueError(f"{t.file}: tensor {t.name} needs {count} bytes at offset {t.offset}, file too short")
            try:
                q = QuantTensor(t.name, t.dtype, t.shape, raw.reshape(rows, -1))
            except ValueError as exc:
                raise ValueError(f"{t.file}: {exc}") from None
            out[t.name] = q if keep_dtype else q.dequantize()
            continue
        if t.dtype not in NUMPY_DTYPE:
            raise ValueError(f"{t.file}: tensor {t.name} has dtype {t.dtype}, which numpy cannot hold")
        dtype = np.dtype(NUMPY_DTYPE[t.dtype]).newbyteorder("<")
        count = int(np.prod(t.shape))
        arr = np.fromfile(root / t.file, dtype=dtype, count=count, offset=t.offset)
        if arr.size != count:
            raise ValueError(f"{t.file}: tensor {t.name} needs {count} elements at offset {t.offset}, file too short")
        arr = arr.reshape(t.shape)
        out[t.name] = arr.astype(arr.dtype.newbyteorder("=")) if keep_dtype else arr.astype(np.float32, copy=False)
    return out


def _check_style(arch: Architecture) -> None:
    if arch.rope_style not in ROPE_STYLES:
        raise ValueError(f"rope_style {arch.rope_style!r}: expected one of {', '.join(ROPE_STYLES)}")


# ---------------------------------------------------------------------------
# Reference path: full recompute, no cache, head by head (independent of the cached path)


def _ref_rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def inv_frequencies(arch: Architecture, factors: np.ndarray | None) -> np.ndarray:
    """float64 ``[head_dim/2]``: ``rope_theta^(-2i/head_dim)``, divided by the per-pair factors when given."""
    hd = arch.head_dim
    inv = arch.rope_theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    return inv if factors is None else inv / np.asarray(factors, dtype=np.float64)


def _ref_rope(x: np.ndarray, pos: np.ndarray, arch: Architecture, factors: np.ndarray | None) -> np.ndarray:
    """Rotate one head ``x [T, head_dim]`` by its positions, written out per style."""
    hd = x.shape[-1]
    inv = inv_frequencies(arch, factors)
    ang = pos.astype(np.float64)[:, None] * inv[None, :]
    c, s = np.cos(ang).astype(x.dtype), np.sin(ang).astype(x.dtype)
    if arch.rope_style == "interleaved":
        a, b = x[:, 0::2], x[:, 1::2]
        out = np.empty_like(x)
        out[:, 0::2] = a * c - b * s
        out[:, 1::2] = a * s + b * c
        return out
    half = hd // 2
    rotated = np.concatenate([-x[:, half:], x[:, :half]], axis=1)  # Hugging Face rotate_half
    return x * np.concatenate([c, c], axis=1) + rotated * np.concatenate([s, s], axis=1)


def reference_logits(
    params: Params,
    arch: Architecture,
    tokens: np.ndarray,
    *,
    dtype: type[np.floating] = np.float64,
    last_only: bool = False,
) -> np.ndarray:
    """Logits ``[T, vocab]`` (or ``[1, vocab]`` with ``last_only``), recomputing causal attention in ``dtype``."""
    _check_style(arch)
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    t = tokens.shape[0]
    h, kvh, hd = arch.n_heads, arch.n_kv_heads, arch.head_dim
    group = h // kvh
    p64 = {k: np.asarray(v, dtype=dtype) for k, v in params.items()}  # no copy when already ``dtype``
    pos = np.arange(t)
    factors = p64.get("rope_freq_factors") if arch.rope_freq_factors else None
    x = p64["embed"][tokens]
    causal = np.tril(np.ones((t, t), dtype=bool))
    for i in range(arch.n_layers):
        p = f"layers.{i}."
        a = _ref_rms(x, p64[p + "attn_norm"], arch.norm_eps)
        q, k, v = a @ p64[p + "wq"], a @ p64[p + "wk"], a @ p64[p + "wv"]
        if arch.attn_bias:
            q, k, v = q + p64[p + "bq"], k + p64[p + "bk"], v + p64[p + "bv"]
        heads = []
        keys, values = [], []
        for g in range(kvh):
            kg = k[:, g * hd : (g + 1) * hd]
            if arch.qk_norm:
                kg = _ref_rms(kg, p64[p + "k_norm"], arch.norm_eps)
            keys.append(_ref_rope(kg, pos, arch, factors))
            values.append(v[:, g * hd : (g + 1) * hd])
        for head in range(h):
            qh = q[:, head * hd : (head + 1) * hd]
            if arch.qk_norm:
                qh = _ref_rms(qh, p64[p + "q_norm"], arch.norm_eps)
            qh = _ref_rope(qh, pos, arch, factors)
            scores = qh @ keys[head // group].T / np.sqrt(hd)
            scores = np.where(causal, scores, -np.inf)
            w = np.exp(scores - scores.max(axis=-1, keepdims=True))
            heads.append((w / w.sum(axis=-1, keepdims=True)) @ values[head // group])
        x = x + np.concatenate(heads, axis=1) @ p64[p + "wo"]
        m = _ref_rms(x, p64[p + "mlp_norm"], arch.norm_eps)
        gate = m @ p64[p + "w_gate"]
        x = x + (gate / (1.0 + np.exp(-gate)) * (m @ p64[p + "w_up"])) @ p64[p + "w_down"]
    if last_only:
        x = x[-1:]
    x = _ref_rms(x, p64["final_norm"], arch.norm_eps)
    head_w = p64["embed"].T if arch.tie_embeddings else p64["lm_head"]
    return x @ head_w


def reference_generate(
    params: Params,
    arch: Architecture,
    prompt: np.ndarray,
    steps: int,
    *,
    dtype: type[np.floating] = np.float64,
    stop_margin: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy continuation by full recompute.

    Returns ``(tokens, margins, first_logits)``: the greedy tokens, the top-1 minus
    top-2 logit margin at each step, and the logits after the prompt. With
    ``stop_margin`` generation stops before the first step whose margin is below
    it (that step's margin is still returned, its token is not).
    """
    converted = {k: np.asarray(v, dtype=dtype) for k, v in params.items()}  # once, not per step
    seq = [int(t) for t in np.asarray(prompt).reshape(-1)]
    out: list[int] = []
    margins: list[float] = []
    first: np.ndarray | None = None
    for _ in range(steps):
        logits = reference_logits(converted, arch, np.array(seq), dtype=dtype, last_only=True)[0]
        if first is None:
            first = logits
        top2 = np.sort(logits)[-2:]
        margins.append(float(top2[1] - top2[0]))
        if stop_margin is not None and margins[-1] < stop_margin:
            break
        nxt = int(np.argmax(logits))
        out.append(nxt)
        seq.append(nxt)
    assert first is not None, "steps must be >= 1"
    return np.array(out, dtype=np.int32), np.array(margins), first


# ---------------------------------------------------------------------------
# Cached path: what the mock device executes


@dataclass(frozen=True)
class Linear:
    """``y = x @ W`` for ``x [n, in]``: on the stored rows with the native kernel, else on a float32 matrix.

    ``data`` is the weight as the package stores it, one row per output feature (``fp16 [out, in]`` or the
    quantised blocks of :mod:`calctl.model.quant`), read by the native kernel, which dequantises inside the
    kernel and accumulates in fp32. ``w`` is the float32 ``[in, out]`` matrix numpy multiplies with: kept for
    fp16/fp32 weights (BLAS is the faster prefill there) and, for quantised weights, only when the native
    kernel is unavailable (the numpy fallback). Several ``parts`` are computed one after the other and
    concatenated (a fusion of differently stored matrices).
    """

    w: np.ndarray | None
    data: np.ndarray | None = None
    dtype: str = "fp32"
    rows: int = 0  # output features
    cols: int = 0  # input features
    parts: tuple[Linear, ...] = ()

    @property
    def native(self) -> bool:
        return self.data is not None or any(p.native for p in self.parts)

    @property
    def nbytes(self) -> int:
        """Bytes of weights held (stored rows and float32 copy)."""
        own = (self.data.nbytes if self.data is not None else 0) + (self.w.nbytes if self.w is not None else 0)
        return own + sum(p.nbytes for p in self.parts)

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``x @ W``; into ``out`` (float32 ``[n, out_features]``, C-contiguous) when given, which is returned."""
        if self.parts:
            y = np.concatenate([p(x) for p in self.parts], axis=1)
        else:
            k = _native_kernels() if self.data is not None else None
            if k is not None and self.data is not None and (self.w is None or x.shape[0] <= NATIVE_MAX_TOKENS):
                xs = np.ascontiguousarray(x, dtype=np.float32)
                direct = out is not None and out.dtype == np.float32 and out.flags.c_contiguous
                y = out if direct and out is not None else np.empty((xs.shape[0], self.rows), np.float32)
                k.gemm(self.dtype, self.data, self.rows, self.cols, xs, y)
                if y is out:
                    return out
            else:
                assert self.w is not None, "quantised weights without the native kernel keep a float32 copy"
                y = x @ self.w
        if out is None:
            return y
        out[...] = y
        return out


#: fp16 weights: at most this many tokens go through the native kernel, more through BLAS on the float32 copy.
NATIVE_MAX_TOKENS = 8


@dataclass(frozen=True)
class Embedding:
    """The token embedding ``[vocab, d_model]``: float32, or stored rows the native kernel dequantises."""

    table: np.ndarray | None  # float32 [vocab, d_model]
    stored: QuantTensor | None = None

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        if self.stored is None:
            assert self.table is not None
            return self.table[tokens]
        k = _native_kernels()
        q = self.stored
        if k is not None:
            return k.rows(q.dtype, q.data, q.rows, q.cols, tokens)
        return QuantTensor(q.name, q.dtype, (len(tokens), q.cols), q.data[tokens]).dequantize_rows()

    @property
    def nbytes(self) -> int:
        return (self.table.nbytes if self.table is not None else 0) + (
            self.stored.nbytes if self.stored is not None else 0
        )


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: np.ndarray
    wqkv: Linear  # [d_model, (n_heads + 2 n_kv_heads) * head_dim]
    bqkv: np.ndarray | None
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None
    wo: Linear
    mlp_norm: np.ndarray
    w_gate_up: Linear  # [d_model, 2 d_ff]
    w_down: Linear


@dataclass(frozen=True)
class Weights:
    """The weights laid out for the cached path (fused matrices, the LM head ready for a GEMV).

    Quantised weights (q4_0, q4_1, q8_0) stay in their stored blocks and fp16 weights keep their stored values,
    one row per output feature, when the native kernel builds (:mod:`calctl.model.native`): decode is
    memory-bound, and the kernel reads 2x (fp16) to 3.2-3.8x (q8_0/q4_1/q4_0) fewer bytes per token than a
    float32 copy, computing on exactly the stored weights.
    """

    arch: Architecture
    embed: Embedding
    layers: tuple[LayerWeights, ...]
    final_norm: np.ndarray
    head: Linear  # the LM head (the embedding itself when tied)
    rope_factors: np.ndarray | None = None  # float64 [head_dim/2] (arch.rope_freq_factors)

    @property
    def native(self) -> bool:
        return self.head.native or any(lw.wqkv.native for lw in self.layers)

    @property
    def nbytes(self) -> int:
        """Bytes of weights this object holds (what the mock keeps resident per chip)."""
        mats = sum(lw.wqkv.nbytes + lw.wo.nbytes + lw.w_gate_up.nbytes + lw.w_down.nbytes for lw in self.layers)
        tied_shared = self.arch.tie_embeddings and self.embed.stored is not None and self.head.data is not None
        head = 0 if tied_shared else self.head.nbytes
        return mats + head + self.embed.nbytes

    @cached_property
    def native_layers(self) -> tuple[tuple[LayerDesc, tuple[object, ...]], ...] | None:
        """Each layer's descriptor for the fused native decode layer, or None when a layer cannot take it.

        Every weight matrix must be one stored matrix the kernel reads (no fused parts, no float32-only weight).
        """
        arch = self.arch
        if arch.head_dim % 2 or arch.rope_style not in ROPE_STYLES:
            return None
        out = []
        for lw in self.layers:
            mats = (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down)
            if any(m.parts or m.data is None or m.dtype not in KERNEL_DTYPES for m in mats):
                return None
            out.append(
                layer_desc(
                    (arch.d_model, arch.n_heads, arch.n_kv_heads, arch.head_dim, arch.d_ff),
                    arch.norm_eps,
                    arch.rope_style,
                    (lw.attn_norm, lw.bqkv, lw.q_norm, lw.k_norm, lw.mlp_norm),
                    tuple((m.dtype, m.data) for m in mats if m.data is not None),
                )
            )
        return tuple(out)

    @cached_property
    def native_stack(self) -> ctypes.Array[LayerDesc] | None:
        """:attr:`native_layers`' descriptors as one array, in layer order (what the native decode step takes); the
        arrays they address stay alive in :attr:`native_layers`."""
        layers = self.native_layers
        if layers is None:
            return None
        return (LayerDesc * len(layers))(*(desc for desc, _ in layers))

    def logits(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """LM head of hidden rows ``x [n, d_model]`` (or one row ``[d_model]``), into ``out`` when given."""
        if x.ndim == 1:
            return self.head(x[None, :], None if out is None else out.reshape(1, -1))[0]
        return self.head(x, out)


_native_kernels = kernels


def _stored_linear(params: Params, names: tuple[str, ...], native: bool) -> Linear:
    """One (fused) ``[in, out]`` linear from the named parameters, keeping their stored form where it can."""
    arrs = [params[n] for n in names]
    quant = [a for a in arrs if isinstance(a, QuantTensor)]
    if (quant and len(quant) != len(arrs)) or len({getattr(a, "dtype", None) for a in arrs}) > 1:
        return Linear(None, parts=tuple(_stored_linear(params, (n,), native) for n in names))
    if quant:
        data = np.concatenate([q.data for q in quant], axis=0) if len(quant) > 1 else quant[0].data
        rows, cols = sum(q.rows for q in quant), quant[0].cols
        if native:
            return Linear(None, np.ascontiguousarray(data), quant[0].dtype, rows, cols)
        w = np.concatenate([np.asarray(q, dtype=np.float32) for q in quant], axis=1)
        return Linear(w, None, quant[0].dtype, rows, cols)
    w = np.ascontiguousarray(np.concatenate([np.asarray(a, dtype=np.float32) for a in arrs], axis=1))
    cols, rows = w.shape
    if native and all(np.asarray(a).dtype == np.float16 for a in arrs):
        stored = np.concatenate([np.asarray(a) for a in arrs], axis=1)
        return Linear(w, np.ascontiguousarray(stored.T, dtype=np.float16), "fp16", rows, cols)
    return Linear(w, None, "fp32", rows, cols)


def prepare(params: Params, arch: Architecture, *, native: bool = True) -> Weights:
    """Fuse ``params`` into the layout :func:`prefill`, :func:`decode_step` and :func:`decode_batch` use.

    Quantised tensors (:class:`~calctl.model.quant.QuantTensor`) and fp16 tensors are kept as stored for the
    native kernel when ``native`` is allowed and the kernel builds on this machine; otherwise everything is
    float32 for numpy (the fallback, same results to float32 rounding).
    """
    _check_style(arch)
    use_native = native and _native_kernels() is not None

    def f32(name: str) -> np.ndarray:
        return np.ascontiguousarray(params[name], dtype=np.float32)

    layers = []
    for i in range(arch.n_layers):
        p = f"layers.{i}."
        layers.append(
            LayerWeights(
                attn_norm=f32(p + "attn_norm"),
                wqkv=_stored_linear(params, (p + "wq", p + "wk", p + "wv"), use_native),
                bqkv=np.concatenate([f32(p + "bq"), f32(p + "bk"), f32(p + "bv")]) if arch.attn_bias else None,
                q_norm=f32(p + "q_norm") if arch.qk_norm else None,
                k_norm=f32(p + "k_norm") if arch.qk_norm else None,
                wo=_stored_linear(params, (p + "wo",), use_native),
                mlp_norm=f32(p + "mlp_norm"),
                w_gate_up=_stored_linear(params, (p + "w_gate", p + "w_up"), use_native),
                w_down=_stored_linear(params, (p + "w_down",), use_native),
            )
        )
    raw_embed = params["embed"]
    if isinstance(raw_embed, QuantTensor) and use_native:
        embed = Embedding(None, raw_embed)
        head_tied: Linear | None = Linear(None, raw_embed.data, raw_embed.dtype, raw_embed.rows, raw_embed.cols)
    else:
        table = f32("embed")
        embed = Embedding(table)
        head_tied = None
        if arch.tie_embeddings:
            stored = np.asarray(raw_embed)
            half = use_native and not isinstance(raw_embed, QuantTensor) and stored.dtype == np.float16
            head_tied = Linear(  # the float32 matrix is the table itself, transposed without a copy
                table.T,
                np.ascontiguousarray(stored) if half else None,
                "fp16" if half else "fp32",
                arch.vocab_size,
                arch.d_model,
            )
    head = (
        head_tied if arch.tie_embeddings and head_tied is not None else _stored_linear(params, ("lm_head",), use_native)
    )
    return Weights(
        arch=arch,
        embed=embed,
        layers=tuple(layers),
        final_norm=f32("final_norm"),
        head=head,
        rope_factors=np.asarray(params["rope_freq_factors"], dtype=np.float64) if arch.rope_freq_factors else None,
    )


def lazy_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """float32 zeros whose pages become resident only when written: a KV cache holds its tokens, not its capacity.

    An anonymous private mapping (freed when the array is). ``np.zeros`` is lazy as well, but numpy advises the
    kernel to back large arrays with 2 MiB huge pages, so the first token of every layer made 2 MiB of each
    ``[max_seq, kv_heads, head_dim]`` slice resident: SmolLM2's 8 lanes held their whole 2048-token capacity
    (755 MB) after a 300-token prompt.
    """
    n = int(np.prod(shape)) * 4
    if n == 0:
        return np.zeros(shape, np.float32)
    return np.frombuffer(mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.float32).reshape(shape)


@dataclass
class KvCache:
    """Per-sequence K/V storage: ``k, v`` are ``[layers, max_seq, kv_heads, head_dim]`` float32.

    ``length`` is the committed length; positions ``>= length`` hold garbage.
    """

    k: np.ndarray
    v: np.ndarray
    length: int = 0

    @classmethod
    def empty(cls, arch: Architecture, max_seq: int) -> KvCache:
        shape = (arch.n_layers, max_seq, arch.n_kv_heads, arch.head_dim)
        return cls(lazy_zeros(shape), lazy_zeros(shape))

    def clear(self) -> None:
        """Empty the cache and give its pages back (a wipe that does not make every page resident)."""
        self.k, self.v, self.length = lazy_zeros(self.k.shape), lazy_zeros(self.v.shape), 0

    @property
    def capacity(self) -> int:
        return self.k.shape[1]


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * w


def _final_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """The final RMS norm of hidden states ``x [..., d]``, NaN for a row past the bound float32 can normalise.

    The norm is scale-invariant, so any finite hidden state has a defined output; float32 computes it while the
    row's sum of squares is finite, i.e. up to magnitudes of about ``sqrt(FLT_MAX / d)`` (7.7e17 for SmolLM2's
    576). Past that the mean square is inf, ``1 / sqrt(inf)`` is 0 and the logits came out all 0.0 (issue #55: a
    kernel race left a garbage hidden state): finite, so nothing downstream saw a fault. Such a row is NaN instead,
    which every consumer of the logits already refuses (the serving engine's output check, the golden check).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        ms = np.mean(x * x, axis=-1, keepdims=True)
        out = x * (1.0 / np.sqrt(ms + eps)) * w
    past = ~np.isfinite(ms)
    return np.where(past, np.float32(np.nan), out) if past.any() else out


def _rope_tables(start: int, n: int, arch: Architecture, factors: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    inv = inv_frequencies(arch, factors)
    ang = np.arange(start, start + n, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32)[:, None, :], np.sin(ang).astype(np.float32)[:, None, :]


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, style: str) -> np.ndarray:
    """Rotate ``x [T, heads, head_dim]``; ``cos``/``sin`` are ``[T, 1, head_dim/2]``."""
    half = x.shape[-1] // 2
    if style == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> np.ndarray:
    """Causal attention of queries at ``start..start+n`` over cached ``k, v [L, kv_heads, head_dim]``."""
    n, h, hd = q.shape
    total, kvh, _ = k.shape
    group = h // kvh
    # [kvh, group*n, hd] x [kvh, hd, L] -> [kvh, group*n, L]
    qg = q.reshape(n, kvh, group, hd).transpose(1, 2, 0, 3).reshape(kvh, group * n, hd)
    scores = np.matmul(qg, k.transpose(1, 2, 0)) * np.float32(1.0 / np.sqrt(hd))
    if n > 1:
        future = np.arange(total)[None, :] > (start + np.arange(n))[:, None]  # [n, L]
        scores = scores.reshape(kvh, group, n, total)
        scores[:, :, future] = -np.inf
        scores = scores.reshape(kvh, group * n, total)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    out = np.matmul(scores, v.transpose(1, 0, 2))  # [kvh, group*n, hd]
    return out.reshape(kvh, group, n, hd).transpose(2, 0, 1, 3).reshape(n, h * hd)


def _project_qkv(lw: LayerWeights, x: np.ndarray, arch: Architecture) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One layer's Q ``[n, heads, hd]``, K and V ``[n, kv_heads, hd]`` of ``x [n, d]`` (normed, before RoPE)."""
    n = x.shape[0]
    h, kvh, hd = arch.n_heads, arch.n_kv_heads, arch.head_dim
    qw, kw = h * hd, kvh * hd
    qkv = lw.wqkv(_rms(x, lw.attn_norm, arch.norm_eps))
    if lw.bqkv is not None:
        qkv += lw.bqkv
    q = qkv[:, :qw].reshape(n, h, hd)
    k = qkv[:, qw : qw + kw].reshape(n, kvh, hd)
    if lw.q_norm is not None and lw.k_norm is not None:
        q = _rms(q, lw.q_norm, arch.norm_eps)
        k = _rms(k, lw.k_norm, arch.norm_eps)
    return q, k, qkv[:, qw + kw :].reshape(n, kvh, hd)


def _mlp_residual(lw: LayerWeights, x: np.ndarray, arch: Architecture) -> np.ndarray:
    """``x`` plus one layer's SwiGLU MLP of it (the post-attention half of a block)."""
    gu = lw.w_gate_up(_rms(x, lw.mlp_norm, arch.norm_eps))
    gate, up = gu[:, : arch.d_ff], gu[:, arch.d_ff :]
    return x + lw.w_down(gate / (1.0 + np.exp(-gate)) * up)


def _weights(params: Params | Weights, arch: Architecture) -> Weights:
    return params if isinstance(params, Weights) else prepare(params, arch)


def _forward_cached(w: Weights, tokens: np.ndarray, cache: KvCache, start: int) -> np.ndarray:
    """Run ``tokens`` at positions ``start..`` writing K/V into the cache; return the last logits."""
    arch = w.arch
    n = tokens.shape[0]
    end = start + n
    if end > cache.capacity:
        raise ValueError(f"sequence of {end} tokens exceeds the cache capacity {cache.capacity}")
    cos, sin = _rope_tables(start, n, arch, w.rope_factors)
    x = w.embed(tokens)
    # A weight that overflows (or an inf times 0) gives non-finite logits, which the golden comparison and
    # GOLD010 name; numpy's RuntimeWarning would only reach the user's terminal (issue 54).
    with np.errstate(over="ignore", invalid="ignore"):
        for i, lw in enumerate(w.layers):
            q, k, v = _project_qkv(lw, x, arch)
            cache.k[i, start:end] = _rope(k, cos, sin, arch.rope_style)
            cache.v[i, start:end] = v
            attn = _attend(_rope(q, cos, sin, arch.rope_style), cache.k[i, :end], cache.v[i, :end], start)
            x = _mlp_residual(lw, x + lw.wo(attn), arch)
        cache.length = end
        last = _final_norm(x[-1], w.final_norm, arch.norm_eps)
        return np.asarray(w.logits(last), dtype=np.float32)


def prefill(params: Params | Weights, arch: Architecture, tokens: np.ndarray, cache: KvCache) -> np.ndarray:
    """Fill the cache from position 0 with ``tokens``; logits ``[vocab]`` of the last one."""
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    return _forward_cached(_weights(params, arch), tokens, cache, 0)


def decode_step(params: Params | Weights, arch: Architecture, token: int, position: int, cache: KvCache) -> np.ndarray:
    """One decode step at ``position`` (== committed KV length, 000 §9.2).

    On the native kernels this is :func:`decode_batch` of one lane (the step the mock runs); otherwise the
    cached forward of one token.
    """
    w = _weights(params, arch)
    if w.native and _native_kernels() is not None:
        return decode_batch(w, arch, np.array([token]), np.array([position]), [cache])[0]
    return _forward_cached(w, np.array([token], dtype=np.int64), cache, position)


def _cache_addresses(caches: list[KvCache]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Base addresses and layer strides of the lanes' K and V caches, or None if one is not plain float32 rows."""
    for c in caches:
        for a in (c.k, c.v):
            if a.dtype != np.float32 or not a.flags.c_contiguous or a.ndim != 4:
                return None
    return (
        np.array([c.k.ctypes.data for c in caches], np.int64),
        np.array([c.k.strides[0] for c in caches], np.int64),
        np.array([c.v.ctypes.data for c in caches], np.int64),
        np.array([c.v.strides[0] for c in caches], np.int64),
    )


def decode_batch(
    params: Params | Weights,
    arch: Architecture,
    tokens: np.ndarray,
    positions: np.ndarray,
    caches: list[KvCache],
    out: np.ndarray | None = None,
) -> np.ndarray:
    """One decode step of several sequences at once: logits ``[n, vocab]`` (written into ``out`` when given).

    Lane ``i`` runs ``tokens[i]`` at ``positions[i]`` (its committed KV length) against ``caches[i]``. The
    weight matrices see all lanes as one ``[n, d]`` batch (one GEMM per matrix, each weight dequantised and read
    once per eight lanes by the native kernel); attention is per lane over its own cache, all lanes in one
    native call when the weights are on the native kernels (numpy, lane by lane, otherwise). Same results as
    ``n`` single-lane steps, to float32 rounding.
    """
    w = _weights(params, arch)
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    pos = np.ascontiguousarray(np.asarray(positions, dtype=np.int64).reshape(-1))
    n = tokens.shape[0]
    if pos.shape[0] != n or len(caches) != n:
        raise ValueError(f"{n} tokens, {pos.shape[0]} positions and {len(caches)} caches: one of each per lane")
    if out is not None and out.shape != (n, arch.vocab_size):
        raise ValueError(f"logits out {out.shape} is not [{n}, {arch.vocab_size}]")
    for c, p in zip(caches, pos, strict=True):
        if p + 1 > c.capacity:
            raise ValueError(f"sequence of {p + 1} tokens exceeds the cache capacity {c.capacity}")
    eps = arch.norm_eps
    ang = pos.astype(np.float64)[:, None] * inv_frequencies(arch, w.rope_factors)[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    k_native = _native_kernels() if w.native else None
    addresses = _cache_addresses(caches) if k_native is not None else None
    x = np.ascontiguousarray(w.embed(tokens), dtype=np.float32)
    stack = w.native_stack if k_native is not None and addresses is not None else None
    if k_native is not None and addresses is not None and stack is not None:
        k_native.decode_layers(stack, x, cos, sin, addresses, pos)  # every layer in one native call
    else:
        x = _decode_layers(w, x, cos[:, None, :], sin[:, None, :], pos, caches, addresses)
    for cache, p in zip(caches, pos, strict=True):
        cache.length = int(p) + 1
    with np.errstate(over="ignore", invalid="ignore"):  # as in _forward_cached: the golden check names NaN logits
        if out is not None:
            return w.logits(_final_norm(x, w.final_norm, eps), out)
        return np.asarray(w.logits(_final_norm(x, w.final_norm, eps)), dtype=np.float32)


def _decode_layers(
    w: Weights,
    x: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    pos: np.ndarray,
    caches: list[KvCache],
    addresses: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None,
) -> np.ndarray:
    """The layers of :func:`decode_batch` in numpy around the weight GEMMs (attention native when ``addresses``)."""
    arch = w.arch
    n = x.shape[0]
    qw = arch.n_heads * arch.head_dim
    k_native = _native_kernels() if addresses is not None else None
    with np.errstate(over="ignore", invalid="ignore"):  # non-finite values are named by the golden check instead
        for i, lw in enumerate(w.layers):
            q, k, v = _project_qkv(lw, x, arch)
            q = _rope(q, cos, sin, arch.rope_style)
            k = _rope(k, cos, sin, arch.rope_style)
            if k_native is not None and addresses is not None:
                kb, ks, vb, vs = addresses
                attn = k_native.attend(
                    np.ascontiguousarray(q, np.float32), np.ascontiguousarray(k, np.float32),
                    np.ascontiguousarray(v, np.float32), kb + i * ks, vb + i * vs, pos, arch.n_kv_heads,
                )  # fmt: skip
            else:
                attn = np.empty((n, qw), np.float32)
                for lane, (cache, p) in enumerate(zip(caches, pos, strict=True)):
                    cache.k[i, p] = k[lane]
                    cache.v[i, p] = v[lane]
                    attn[lane] = _attend(q[lane : lane + 1], cache.k[i, : p + 1], cache.v[i, : p + 1], int(p))[0]
            x = _mlp_residual(lw, x + lw.wo(attn), arch)
    return x
