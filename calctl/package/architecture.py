"""Which parameter tensors a model of each architecture family has, and their shapes.

One table row per tensor: its name (``{i}`` for the layer index), its shape as
architecture symbols, and the architecture flag that makes it present. Every
decoder family shares the Llama block; the differences are explicit manifest
fields (``attn_bias``, ``qk_norm``, ``tie_embeddings``, ``head_dim``) rather than
something inferred from the family name, so a C implementation reads the same
facts (docs/import.md). Matrices are ``[in, out]`` (``y = x @ W``).

Pure: no I/O, no numpy. The mock's decoder (``calctl.model.decoder``) and the
compilers use it to lay out params; validation checks manifests against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from calctl.package.model import Architecture

#: Families whose tensors this table knows. ``calctl-tiny-decoder`` is the bundled sample model.
DECODER_FAMILIES = ("calctl-tiny-decoder", "llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class TensorRow:
    name: str  # "{i}" is the layer index
    shape: tuple[str, ...]  # symbols of _dims()
    when: str | None = None  # architecture flag that must hold: attn_bias, qk_norm, untied


_DECODER_ROWS: tuple[TensorRow, ...] = (
    TensorRow("embed", ("vocab", "d_model")),
    TensorRow("layers.{i}.attn_norm", ("d_model",)),
    TensorRow("layers.{i}.wq", ("d_model", "q_width")),
    TensorRow("layers.{i}.wk", ("d_model", "kv_width")),
    TensorRow("layers.{i}.wv", ("d_model", "kv_width")),
    TensorRow("layers.{i}.bq", ("q_width",), when="attn_bias"),
    TensorRow("layers.{i}.bk", ("kv_width",), when="attn_bias"),
    TensorRow("layers.{i}.bv", ("kv_width",), when="attn_bias"),
    TensorRow("layers.{i}.q_norm", ("head_dim",), when="qk_norm"),
    TensorRow("layers.{i}.k_norm", ("head_dim",), when="qk_norm"),
    TensorRow("layers.{i}.wo", ("q_width", "d_model")),
    TensorRow("layers.{i}.mlp_norm", ("d_model",)),
    TensorRow("layers.{i}.w_gate", ("d_model", "d_ff")),
    TensorRow("layers.{i}.w_up", ("d_model", "d_ff")),
    TensorRow("layers.{i}.w_down", ("d_ff", "d_model")),
    TensorRow("final_norm", ("d_model",)),
    TensorRow("lm_head", ("d_model", "vocab"), when="untied"),
)

#: family -> its tensor rows (in blob order).
TENSOR_TABLE: Mapping[str, tuple[TensorRow, ...]] = {family: _DECODER_ROWS for family in DECODER_FAMILIES}


def _dims(arch: Architecture) -> dict[str, int]:
    return {
        "vocab": arch.vocab_size,
        "d_model": arch.d_model,
        "q_width": arch.n_heads * arch.head_dim,
        "kv_width": arch.n_kv_heads * arch.head_dim,
        "head_dim": arch.head_dim,
        "d_ff": arch.d_ff,
    }


def _flag(arch: Architecture, when: str | None) -> bool:
    if when is None:
        return True
    if when == "untied":
        return not arch.tie_embeddings
    return bool(getattr(arch, when, False))


def expected_tensor_shapes(arch: Architecture) -> dict[str, tuple[int, ...]]:
    """Every parameter tensor ``arch`` needs, name -> shape, in blob order.

    Raises KeyError naming the family when the table has no rows for it.
    """
    rows = TENSOR_TABLE.get(arch.family)
    if rows is None:
        raise KeyError(f"architecture family {arch.family!r} is not one of {', '.join(TENSOR_TABLE)}")
    dims = _dims(arch)
    out: dict[str, tuple[int, ...]] = {}
    for layer in range(arch.n_layers):
        for row in rows:
            if "{i}" in row.name and _flag(arch, row.when):
                out[row.name.format(i=layer)] = tuple(dims[s] for s in row.shape)
    # Model-level tensors around the layers, in table order: embed first, the rest after the layers.
    head = {r.name: tuple(dims[s] for s in r.shape) for r in rows[:1] if _flag(arch, r.when)}
    tail = {r.name: tuple(dims[s] for s in r.shape) for r in rows[1:] if "{i}" not in r.name and _flag(arch, r.when)}
    return {**head, **out, **tail}
