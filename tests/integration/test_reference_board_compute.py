"""The reference board's decoder against numpy, for the architecture flags of the C ABI model extension.

The bundled samples exercise the plain tiny decoder (run-golden, elsewhere). Here
one model of the combined fixture gains what the import families need (001 §8.3):
q/k/v biases (qwen2), q/k RMSNorm over head_dim (qwen3), tied embeddings,
rotate-half RoPE (HF Llama layout), with some tensors stored fp16 and bf16 so the
board's conversion is exercised too. The board's prefill and cached decode
steps must match a full-recompute numpy forward (float32) within 1e-4.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from calctl.model import decoder
from calctl.package.model import Architecture, Package, ParamTensor
from calctl.package.reader import load_manifest
from calctl.runtime import open_runtime
from calctl.runtime.conformance import golden_prompt, prefill_job, write_decode
from tests.conftest import FIXTURE_PACKAGES
from tests.integration.reference_board import _clean_reference_env, reference_board  # noqa: F401  (fixtures)

ALIAS = "model-a"


def _rope(x: np.ndarray, pos: np.ndarray, theta: float, half: bool) -> np.ndarray:
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = pos.astype(np.float64)[:, None] * inv[None, :]
    c, s = np.cos(ang).astype(np.float32)[:, None, :], np.sin(ang).astype(np.float32)[:, None, :]
    out = np.empty_like(x)
    if half:
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        out[..., : hd // 2], out[..., hd // 2 :] = x1 * c - x2 * s, x1 * s + x2 * c
    else:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = x1 * c - x2 * s, x1 * s + x2 * c
    return out


def _norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def reference(p: dict[str, np.ndarray], arch: Architecture, tokens: np.ndarray, *, half: bool) -> np.ndarray:
    """Full causal recompute, last-token logits; biases and q/k norm when the params hold them."""
    t, h, kvh, hd = len(tokens), arch.n_heads, arch.n_kv_heads, arch.head_dim
    x = p["embed"][tokens]
    pos = np.arange(t)
    mask = np.triu(np.full((t, t), -np.inf, np.float32), k=1)
    for i in range(arch.n_layers):
        L = f"layers.{i}."
        a = _norm(x, p[L + "attn_norm"], arch.norm_eps)
        q = a @ p[L + "wq"] + p.get(L + "bq", 0)
        k = a @ p[L + "wk"] + p.get(L + "bk", 0)
        v = (a @ p[L + "wv"] + p.get(L + "bv", 0)).reshape(t, kvh, hd)
        q, k = q.reshape(t, h, hd), k.reshape(t, kvh, hd)
        if L + "q_norm" in p:
            q, k = _norm(q, p[L + "q_norm"], arch.norm_eps), _norm(k, p[L + "k_norm"], arch.norm_eps)
        q, k = _rope(q, pos, arch.rope_theta, half), _rope(k, pos, arch.rope_theta, half)
        k, v = np.repeat(k, h // kvh, axis=1), np.repeat(v, h // kvh, axis=1)
        sc = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask[None]
        w = np.exp(sc - sc.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        x = x + np.einsum("hqk,khd->qhd", w, v).reshape(t, h * hd) @ p[L + "wo"]
        m = _norm(x, p[L + "mlp_norm"], arch.norm_eps)
        g = m @ p[L + "w_gate"]
        x = x + (g / (1 + np.exp(-g)) * (m @ p[L + "w_up"])) @ p[L + "w_down"]
    last = _norm(x[-1:], p["final_norm"], arch.norm_eps)
    head = p["embed"].T if arch.tie_embeddings else p["lm_head"]
    return (last @ head)[0].astype(np.float32)


def _variant(tmp: Path, *, bias: bool, qk_norm: bool, tied: bool) -> tuple[Package, dict[str, np.ndarray]]:
    root = tmp / "pkg"
    shutil.copytree(FIXTURE_PACKAGES / "combined", root)
    pkg = load_manifest(root)
    model = pkg.model(ALIAS)
    arch = model.architecture
    params = decoder.load_params(root, model.params)
    rng = np.random.default_rng(18)
    extra: list[tuple[str, np.ndarray, str]] = []
    for i in range(arch.n_layers):
        L = f"layers.{i}."
        if bias:
            extra += [
                (L + "bq", 0.3 * rng.standard_normal(arch.n_heads * arch.head_dim), "fp32"),
                (L + "bk", 0.3 * rng.standard_normal(arch.n_kv_heads * arch.head_dim), "fp16"),
                (L + "bv", 0.3 * rng.standard_normal(arch.n_kv_heads * arch.head_dim), "bf16"),
            ]
        if qk_norm:
            extra += [(L + n, 1 + 0.2 * rng.standard_normal(arch.head_dim), "fp32") for n in ("q_norm", "k_norm")]
    blob = root / ALIAS / "params" / "extra.bin"
    tensors = [t for t in model.params if not (tied and t.name == "lm_head")]
    with blob.open("wb") as f:
        for name, arr, dtype in extra:
            raw: np.ndarray  # the stored bytes' dtype (float32, float16 or bf16 as uint16)
            if dtype == "fp32":
                raw, back = arr.astype(np.float32), arr.astype(np.float32)
            elif dtype == "fp16":
                raw = arr.astype(np.float16)
                back = raw.astype(np.float32)
            else:  # bf16: the top half of a float32
                bits = (arr.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
                raw, back = bits, (bits.astype(np.uint32) << 16).view(np.float32)
            tensors.append(ParamTensor(name, f"{ALIAS}/params/extra.bin", dtype, arr.shape, f.tell()))
            f.write(raw.tobytes())
            params[name] = back
    if tied:
        params.pop("lm_head")
    new_arch = dataclasses.replace(arch, tie_embeddings=tied)
    new_model = dataclasses.replace(model, architecture=new_arch, params=tuple(tensors))
    return dataclasses.replace(pkg, models=(new_model, *pkg.models[1:])), params


@pytest.mark.parametrize(
    ("bias", "qk_norm", "tied", "half"),
    [(True, False, False, False), (False, True, False, False), (True, True, True, True)],
    ids=["qkv-bias", "qk-norm", "bias+qk-norm+tied+rotate-half"],
)
def test_board_matches_numpy(
    reference_board: Path,  # noqa: F811  (the imported fixture)
    tmp_path: Path,
    bias: bool,
    qk_norm: bool,
    tied: bool,
    half: bool,
) -> None:
    pkg, params = _variant(tmp_path, bias=bias, qk_norm=qk_norm, tied=tied)
    model = pkg.model(ALIAS)
    if half:
        object.__setattr__(model.architecture, "rope_style", "half")  # the field an importer records
    arch = model.architecture
    prompt = golden_prompt(pkg, ALIAS)
    with open_runtime("calrt", calrt_lib=reference_board) as rt:
        rt.configure(rt.create_calbin(pkg))
        job, seq, _, outputs = prefill_job(rt, pkg, ALIAS, prompt)
        assert rt.wait(job, 30).ok
        rt.kv.commit(seq)
        got, seqs = outputs.read("logits")[0], list(prompt)
        for _step in range(4):
            want = reference(params, arch, np.array(seqs), half=half)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
            token = int(np.argmax(got))
            with rt.job_buffers(model.decode.name) as (inputs, outs):
                rt.kv.append(seq, 1)
                write_decode(inputs, token, len(seqs))
                assert rt.wait(rt.submit(model.decode.name, inputs, outs, kv=[seq]), 30).ok
                rt.kv.commit(seq)
                got = outs.read("logits")[0].copy()
            seqs.append(token)
        # The plain package's numbers differ from this variant's: the flags really changed the compute.
        plain = decoder.reference_logits(
            decoder.load_params(pkg.root, load_manifest(pkg.root).model(ALIAS).params),
            load_manifest(pkg.root).model(ALIAS).architecture,
            np.array(prompt),
        )[-1]
        assert not np.allclose(reference(params, arch, np.array(prompt), half=half), plain, atol=1e-3)
