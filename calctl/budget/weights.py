"""Parameter counts and weight bytes estimated from a model's shape (001 §8.1 ``W_compiled``).

Used only when a package does not state its compiled weights (001 §8.4: the
parameter map of a compiled package is the real source). The count covers
embeddings (plus a separate LM head unless tied), attention (q, k, v, o with
GQA widths and any biases, q/k norms), the MLP (gated: gate, up, down; or
up, down), MoE experts (every routed expert plus the router, plus shared
experts and their gate) and the RMSNorm vectors. For Llama-3.2-1B it gives the
published 1,235,814,400.

An estimate is not ``W_compiled``: a compiler quantises, pads, adds scales and
may keep some tensors wider. Under tensor parallelism the matrices split
evenly across chips (ceiling), the norm vectors are replicated. This module
does not read files and does not judge anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from calctl.budget.shape import ModelShape
from calctl.budget.units import DTYPE_BITS, bits_to_bytes


@dataclass(frozen=True)
class ParamCount:
    """Parameters by part. ``norms`` are vectors replicated on every chip; the rest split."""

    embedding: int
    lm_head: int
    attention: int
    mlp: int
    experts: int
    shared_experts: int
    norms: int

    @property
    def matrices(self) -> int:
        return self.embedding + self.lm_head + self.attention + self.mlp + self.experts + self.shared_experts

    @property
    def total(self) -> int:
        return self.matrices + self.norms


def count_params(shape: ModelShape) -> ParamCount:
    """Parameter count of a decoder-only transformer with this shape."""
    h = shape.hidden
    q, kv = shape.q_width, shape.kv_width
    attention = h * q + 2 * h * kv + q * h
    if shape.qkv_bias:
        attention += q + 2 * kv
    if shape.o_bias:
        attention += h
    norms_per_layer = shape.norms_per_layer * h + (2 * shape.head_dim if shape.qk_norm else 0)

    mats = 3 if shape.gated_mlp else 2
    dense = mats * h * shape.intermediate + (
        (2 if shape.gated_mlp else 1) * shape.intermediate + h if shape.mlp_bias else 0
    )
    mlp = experts = shared = 0
    for layer in range(shape.n_layers):
        if shape.is_sparse(layer):
            moe = shape.moe
            assert moe is not None
            experts += moe.n_experts * mats * h * moe.expert_intermediate + h * moe.n_experts  # + router
            shared += mats * h * moe.shared_intermediate + (h if moe.shared_gate else 0)
        else:
            mlp += dense
    return ParamCount(
        embedding=shape.vocab * h,
        lm_head=0 if shape.tie_embeddings else shape.vocab * h,
        attention=shape.n_layers * attention,
        mlp=mlp,
        experts=experts,
        shared_experts=shared,
        norms=shape.n_layers * norms_per_layer + h,  # + the final norm
    )


def weight_bytes(count: ParamCount, dtype: str, *, chips: int = 1) -> int:
    """Bytes of weights on one chip when the model is split over ``chips`` (tensor parallel)."""
    bits = DTYPE_BITS[dtype]
    return -(-bits_to_bytes(count.matrices * bits) // chips) + bits_to_bytes(count.norms * bits)
