"""Tiny random checkpoints written in-test, in both formats, plus an independent numpy forward.

* :func:`write_hf_dir` – a Hugging Face directory (``config.json``, one
  ``model.safetensors`` written with the ``safetensors`` library, a real
  byte-level BPE ``tokenizer.json`` and a ChatML ``tokenizer_config.json``);
* :func:`write_gguf` – the same weights as a GGUF file through ``gguf``'s own
  writer, Llama Q/K rows permuted exactly as llama.cpp's converter does;
* :func:`hf_forward` – logits straight from the Hugging Face tensors (``[out, in]``
  matrices, ``rotate_half`` RoPE), float64, sharing no code with calctl.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from calctl.model import tokenizer as toklib

FAMILIES = ("llama", "qwen2", "qwen3")


LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,  # small, so a 16-wide head has pairs in all three bands
}


def tiny_config(family: str, *, tie: bool = False, vocab: int = 384, layers: int = 2) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model_type": family,
        "architectures": [
            {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[family]
        ],
        "hidden_size": 64,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "vocab_size": vocab,
        "max_position_embeddings": 512,
        "rope_theta": 10000.0 if family == "llama" else 1000000.0,
        "rms_norm_eps": 1e-5 if family == "llama" else 1e-6,
        "tie_word_embeddings": tie,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if family == "qwen3":
        cfg["head_dim"] = 24  # explicit and != hidden_size / heads (16)
        cfg["attention_bias"] = False
    return cfg


def _head_dim(cfg: dict[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def random_hf_weights(cfg: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    h, kvh, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], _head_dim(cfg)
    fam = cfg["model_type"]

    def mat(o: int, i: int) -> np.ndarray:
        return (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": (0.5 * rng.standard_normal((v, d))).astype(np.float32)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(d)
        w[p + "self_attn.q_proj.weight"] = mat(h * hd, d)
        w[p + "self_attn.k_proj.weight"] = mat(kvh * hd, d)
        w[p + "self_attn.v_proj.weight"] = mat(kvh * hd, d)
        if fam == "qwen2":
            for n, width in (("q", h * hd), ("k", kvh * hd), ("v", kvh * hd)):
                w[p + f"self_attn.{n}_proj.bias"] = (0.1 * rng.standard_normal(width)).astype(np.float32)
        if fam == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "self_attn.o_proj.weight"] = mat(d, h * hd)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        w[p + "mlp.gate_proj.weight"] = mat(f, d)
        w[p + "mlp.up_proj.weight"] = mat(f, d)
        w[p + "mlp.down_proj.weight"] = mat(d, f)
    w["model.norm.weight"] = norm(d)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = mat(v, d)
    return w


def as_transformers5(root: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """Rewrite a directory from :func:`write_hf_dir` in transformers 5's layout, as its ``save_pretrained`` does.

    ``rope_theta`` (and ``rope_scaling``) move under ``rope_parameters``, the chat template leaves
    ``tokenizer_config.json`` for ``chat_template.jinja``, and the EOS/BOS ids live in
    ``generation_config.json`` only. Returns the new config.
    """
    v5 = {k: v for k, v in cfg.items() if k not in ("rope_theta", "rope_scaling", "eos_token_id", "bos_token_id")}
    v5["rope_parameters"] = {"rope_type": "default", **(cfg.get("rope_scaling") or {}), "rope_theta": cfg["rope_theta"]}
    v5["dtype"] = v5.pop("torch_dtype", "float32")
    v5["transformers_version"] = "5.0.0"
    (root / "config.json").write_text(json.dumps(v5, indent=2))
    tok_cfg = json.loads((root / "tokenizer_config.json").read_text())
    (root / "chat_template.jinja").write_text(tok_cfg.pop("chat_template"))
    (root / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "transformers_version": "5.0.0"}
    (root / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return v5


def write_hf_dir(
    root: Path, family: str, *, seed: int = 0, tie: bool = False, config: dict[str, Any] | None = None
) -> tuple[Path, dict[str, Any], dict[str, np.ndarray]]:
    from safetensors.numpy import save_file

    cfg = config or tiny_config(family, tie=tie)
    weights = random_hf_weights(cfg, seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file(weights, str(root / "model.safetensors"), metadata={"format": "pt"})
    tok = toklib.train(cfg["vocab_size"])
    (root / "tokenizer.json").write_bytes(toklib.to_json(tok))
    (root / "tokenizer_config.json").write_bytes(toklib.tokenizer_config(cfg["max_position_embeddings"]))
    return root, cfg, weights


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute, restated."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(
    path: Path, hf_dir: Path, cfg: dict[str, Any], weights: dict[str, np.ndarray], qtype: str = "F32"
) -> Path:
    """The HF checkpoint as GGUF, the way llama.cpp's converter lays it out (names, metadata, permutation)."""
    import gguf

    fam = cfg["model_type"]
    h, kvh, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], _head_dim(cfg)
    w = gguf.GGUFWriter(str(path), fam)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(h)
    w.add_head_count_kv(kvh)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    if "head_dim" in cfg:
        w.add_key_length(hd)
        w.add_value_length(hd)
    tj = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    special = {a["content"] for a in tj.get("added_tokens", []) if a.get("special")}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab[toklib.EOS_TOKEN])
    w.add_chat_template(toklib.CHAT_TEMPLATE)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.q_norm.weight": "attn_q_norm.weight",
        "self_attn.k_norm.weight": "attn_k_norm.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    scaling = cfg.get("rope_scaling")
    if scaling:  # llama.cpp's convert_hf_to_gguf.py LlamaModel.generate_extra_tensors, restated
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        factors = []
        for freq in 1.0 / (cfg["rope_theta"] ** (np.arange(0, hd, 2) / hd)):
            wavelen = 2 * np.pi / freq
            if wavelen < old / high:
                factors.append(1.0)
            elif wavelen > old / low:
                factors.append(factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        w.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))
    for hf_name, arr in weights.items():
        if hf_name in names:
            gname = names[hf_name]
        else:
            _, _, layer, rest = hf_name.split(".", 3)
            gname = f"blk.{layer}.{per_layer[rest]}"
        if fam == "llama" and hf_name.endswith("q_proj.weight"):
            arr = permute(arr, h)
        if fam == "llama" and hf_name.endswith("k_proj.weight"):
            arr = permute(arr, kvh)
        q = gguf.GGMLQuantizationType[qtype]
        if arr.ndim == 2 and q not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(gname, gguf.quants.quantize(arr, q), raw_dtype=q)
        elif q is gguf.GGMLQuantizationType.F16 and arr.ndim == 2:
            w.add_tensor(gname, arr.astype(np.float16))
        else:
            w.add_tensor(gname, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def dequantized(weights: dict[str, np.ndarray], qtype: str) -> dict[str, np.ndarray]:
    """What a GGUF of ``qtype`` holds, back as float32 (the original for F32)."""
    import gguf

    q = gguf.GGMLQuantizationType[qtype]
    if q is gguf.GGMLQuantizationType.F32:
        return weights
    out = {}
    for k, a in weights.items():
        if a.ndim != 2:
            out[k] = a
        elif q is gguf.GGMLQuantizationType.F16:
            out[k] = a.astype(np.float16).astype(np.float32)
        else:
            out[k] = gguf.quants.dequantize(gguf.quants.quantize(a, q), q).reshape(a.shape)
    return out


def hf_forward(weights: dict[str, np.ndarray], cfg: dict[str, Any], tokens: list[int]) -> np.ndarray:
    """Logits ``[T, vocab]`` computed directly from Hugging Face tensors, float64 (transformers' math)."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    fam = cfg["model_type"]
    t = len(tokens)
    h, kvh, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], _head_dim(cfg)
    eps = cfg["rms_norm_eps"]

    def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return g * (x / np.sqrt((x**2).mean(-1, keepdims=True) + eps))

    inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, hd, 2) / hd)) if "rope_theta" in cfg else None
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(cfg.get("rope_parameters"), dict):  # transformers 5 nests the base too
        inv = 1.0 / (cfg["rope_parameters"]["rope_theta"] ** (np.arange(0, hd, 2) / hd))
    assert inv is not None, "the config names no rope_theta"
    if scaling and scaling.get("rope_type", "default") == "default":
        scaling = None
    if scaling and scaling.get("rope_type") == "linear":  # transformers' _compute_linear_scaling_rope_parameters
        inv = inv / scaling["factor"]
    elif scaling:  # transformers' _compute_llama3_parameters, restated
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * np.pi / inv
        inv_llama = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        inv = np.where(medium, smoothed, inv_llama)
    freqs = np.outer(np.arange(t), inv)
    emb = np.concatenate([freqs, freqs], -1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]

    def rotate_half(x: np.ndarray) -> np.ndarray:
        return np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], -1)

    x = w["model.embed_tokens.weight"][tokens]
    mask = np.triu(np.full((t, t), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms(x, w[p + "input_layernorm.weight"])
        q = a @ w[p + "self_attn.q_proj.weight"].T
        k = a @ w[p + "self_attn.k_proj.weight"].T
        v = a @ w[p + "self_attn.v_proj.weight"].T
        if fam == "qwen2":
            q, k, v = (
                q + w[p + "self_attn.q_proj.bias"],
                k + w[p + "self_attn.k_proj.bias"],
                v + w[p + "self_attn.v_proj.bias"],
            )
        q, k, v = q.reshape(t, h, hd), k.reshape(t, kvh, hd), v.reshape(t, kvh, hd)
        if fam == "qwen3":
            q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, h // kvh, axis=1), np.repeat(v, h // kvh, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", s, v).reshape(t, h * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        m = rms(x, w[p + "post_attention_layernorm.weight"])
        g = m @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (m @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T
