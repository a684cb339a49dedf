"""A tiny decoder-only transformer in numpy: the model inside sample packages.

Llama-shaped (RMSNorm, RoPE, grouped-query attention, SiLU-gated MLP, tied
embeddings), float32. Two independent code paths:

* :func:`reference_logits` recomputes attention over the whole sequence with a
  causal mask and no cache. ``calctl sample-package`` runs it in float64 to
  write golden data (``dtype=np.float64``), so the golden bits do not depend on
  the float32 kernels of the BLAS and CPU at hand.
* :class:`KvCache` + :func:`prefill` / :func:`decode_step` is the cached path the
  mock device runs, with the KV cache living in device memory.

Golden runs compare the second against the first, so a KV-cache bug (or an
injected KV corruption) shows up as a logit or token mismatch.

This module does no file I/O except :func:`load_params` (reads param blobs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calctl.package.model import NUMPY_DTYPE, Architecture, ParamTensor

Params = Mapping[str, np.ndarray]


def param_layout(arch: Architecture) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of every parameter tensor, in blob order."""
    d, h, kvh, hd, f, v = arch.d_model, arch.n_heads, arch.n_kv_heads, arch.head_dim, arch.d_ff, arch.vocab_size
    out: list[tuple[str, tuple[int, ...]]] = [("embed", (v, d))]
    for i in range(arch.n_layers):
        out += [
            (f"layers.{i}.attn_norm", (d,)),
            (f"layers.{i}.wq", (d, h * hd)),
            (f"layers.{i}.wk", (d, kvh * hd)),
            (f"layers.{i}.wv", (d, kvh * hd)),
            (f"layers.{i}.wo", (h * hd, d)),
            (f"layers.{i}.mlp_norm", (d,)),
            (f"layers.{i}.w_gate", (d, f)),
            (f"layers.{i}.w_up", (d, f)),
            (f"layers.{i}.w_down", (f, d)),
        ]
    out.append(("final_norm", (d,)))
    if not arch.tie_embeddings:
        out.append(("lm_head", (d, v)))
    return out


def init_params(arch: Architecture, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Deterministic random weights with enough logit spread for stable greedy golden."""
    params: dict[str, np.ndarray] = {}
    for name, shape in param_layout(arch):
        if name.endswith("norm"):
            arr = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name == "embed":
            arr = 0.5 * rng.standard_normal(shape)
        else:
            arr = rng.standard_normal(shape) / np.sqrt(shape[0])
        params[name] = arr.astype(np.float32)
    return params


def load_params(root: Path, tensors: tuple[ParamTensor, ...]) -> dict[str, np.ndarray]:
    """Read parameter tensors from their blobs (offset/shape/dtype from the manifest)."""
    out: dict[str, np.ndarray] = {}
    for t in tensors:
        dtype = np.dtype(NUMPY_DTYPE[t.dtype])
        count = int(np.prod(t.shape))
        arr = np.fromfile(root / t.file, dtype=dtype, count=count, offset=t.offset)
        if arr.size != count:
            raise ValueError(f"{t.file}: tensor {t.name} needs {count} elements at offset {t.offset}, file too short")
        out[t.name] = arr.reshape(t.shape).astype(np.float32, copy=False)
    return out


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope_angles(
    positions: np.ndarray, head_dim: int, theta: float, dtype: type[np.floating] = np.float32
) -> tuple[np.ndarray, np.ndarray]:
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = positions.astype(np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    # x: [T, heads, hd]; rotate pairs (even, odd).
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _lm_head(params: Params, arch: Architecture, h: np.ndarray, dtype: type[np.floating] = np.float32) -> np.ndarray:
    w = params["embed"].T if arch.tie_embeddings else params["lm_head"]
    return (h @ w).astype(dtype)


def reference_logits(
    params: Params, arch: Architecture, tokens: np.ndarray, *, dtype: type[np.floating] = np.float32
) -> np.ndarray:
    """Logits ``[T, vocab]`` for every position, recomputing full causal attention.

    ``dtype`` is the arithmetic precision: the float32 weights are widened once and
    every activation stays in ``dtype`` (float64 for golden data).
    """
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    t = tokens.shape[0]
    h, kvh, hd = arch.n_heads, arch.n_kv_heads, arch.head_dim
    group = h // kvh
    params = {k: v.astype(dtype, copy=False) for k, v in params.items()}
    x = params["embed"][tokens]
    cos, sin = _rope_angles(np.arange(t), hd, arch.rope_theta, dtype)
    mask = np.triu(np.full((t, t), -np.inf, dtype=dtype), k=1)
    for i in range(arch.n_layers):
        p = f"layers.{i}."
        a = _rms_norm(x, params[p + "attn_norm"], arch.norm_eps)
        q = _rope((a @ params[p + "wq"]).reshape(t, h, hd), cos, sin)
        k = _rope((a @ params[p + "wk"]).reshape(t, kvh, hd), cos, sin)
        v = (a @ params[p + "wv"]).reshape(t, kvh, hd)
        k = np.repeat(k, group, axis=1)
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask[None]
        scores = scores - scores.max(axis=-1, keepdims=True)
        w = np.exp(scores)
        w /= w.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", w, v).reshape(t, h * hd)
        x = x + attn @ params[p + "wo"]
        m = _rms_norm(x, params[p + "mlp_norm"], arch.norm_eps)
        x = x + (_silu(m @ params[p + "w_gate"]) * (m @ params[p + "w_up"])) @ params[p + "w_down"]
    x = _rms_norm(x, params["final_norm"], arch.norm_eps)
    return _lm_head(params, arch, x, dtype)


def reference_generate(
    params: Params, arch: Architecture, prompt: np.ndarray, steps: int, *, dtype: type[np.floating] = np.float32
) -> tuple[np.ndarray, float]:
    """Greedy continuation by full recompute; also returns the smallest top-1 margin seen."""
    seq = list(np.asarray(prompt).reshape(-1))
    out: list[int] = []
    min_margin = float("inf")
    for _ in range(steps):
        logits = reference_logits(params, arch, np.array(seq), dtype=dtype)[-1]
        top2 = np.sort(logits)[-2:]
        min_margin = min(min_margin, float(top2[1] - top2[0]))
        nxt = int(np.argmax(logits))
        out.append(nxt)
        seq.append(nxt)
    return np.array(out, dtype=np.int32), min_margin


@dataclass
class KvCache:
    """Per-sequence K/V storage: ``k, v`` are ``[layers, max_seq, kv_heads, head_dim]``.

    ``length`` is the committed length; positions ``>= length`` hold garbage.
    """

    k: np.ndarray
    v: np.ndarray
    length: int = 0

    @classmethod
    def empty(cls, arch: Architecture, max_seq: int) -> KvCache:
        shape = (arch.n_layers, max_seq, arch.n_kv_heads, arch.head_dim)
        return cls(np.zeros(shape, np.float32), np.zeros(shape, np.float32))

    @property
    def capacity(self) -> int:
        return self.k.shape[1]


def _forward_cached(params: Params, arch: Architecture, tokens: np.ndarray, cache: KvCache, start: int) -> np.ndarray:
    """Run ``tokens`` at positions ``start..`` writing K/V into the cache; return last logits."""
    n = tokens.shape[0]
    if start + n > cache.capacity:
        raise ValueError(f"sequence of {start + n} tokens exceeds the cache capacity {cache.capacity}")
    h, kvh, hd = arch.n_heads, arch.n_kv_heads, arch.head_dim
    group = h // kvh
    x = params["embed"][tokens]
    cos, sin = _rope_angles(np.arange(start, start + n), hd, arch.rope_theta)
    end = start + n
    for i in range(arch.n_layers):
        p = f"layers.{i}."
        a = _rms_norm(x, params[p + "attn_norm"], arch.norm_eps)
        q = _rope((a @ params[p + "wq"]).reshape(n, h, hd), cos, sin)
        cache.k[i, start:end] = _rope((a @ params[p + "wk"]).reshape(n, kvh, hd), cos, sin)
        cache.v[i, start:end] = (a @ params[p + "wv"]).reshape(n, kvh, hd)
        out = np.empty((n, h, hd), np.float32)
        for j in range(n):  # query j attends to cached keys 0..start+j
            kk = cache.k[i, : start + j + 1]
            vv = cache.v[i, : start + j + 1]
            for head in range(h):
                g = head // group
                s = kk[:, g, :] @ q[j, head] / np.sqrt(hd)
                s = np.exp(s - s.max())
                out[j, head] = (s / s.sum()) @ vv[:, g, :]
        x = x + out.reshape(n, h * hd) @ params[p + "wo"]
        m = _rms_norm(x, params[p + "mlp_norm"], arch.norm_eps)
        x = x + (_silu(m @ params[p + "w_gate"]) * (m @ params[p + "w_up"])) @ params[p + "w_down"]
    cache.length = end
    last = _rms_norm(x[-1:], params["final_norm"], arch.norm_eps)
    return _lm_head(params, arch, last)[0]


def prefill(params: Params, arch: Architecture, tokens: np.ndarray, cache: KvCache) -> np.ndarray:
    """Fill the cache from position 0 with ``tokens``; logits ``[vocab]`` of the last one."""
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    return _forward_cached(params, arch, tokens, cache, 0)


def decode_step(params: Params, arch: Architecture, token: int, position: int, cache: KvCache) -> np.ndarray:
    """One decode step at ``position`` (== committed KV length, 000 §9.2)."""
    return _forward_cached(params, arch, np.array([token], dtype=np.int64), cache, position)
