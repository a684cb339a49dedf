"""Which parameter tensors an architecture family has, and their shapes.

One table, :data:`FAMILIES`, maps ``architecture.family`` to a function that
returns ``{tensor name: shape}`` for an :class:`~calctl.package.model.Architecture`.
The validator (GOLD006) compares a package's ``params.tensors`` with it, so the
architecture numbers (``d_model``, ``n_heads``, ``d_ff``, ...) a budget or a
runtime trusts are the numbers the weights were really built with (001 §8.1: the
capacity plan is computed from them).

Adding a family means adding one entry here; nothing else in the validator
changes. This module reads no file and knows nothing about where tensors lie
(offsets and files are GOLD005 and MAN009).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from calctl.errors import PackageError
from calctl.package.model import Architecture

Shapes = dict[str, tuple[int, ...]]


def _tiny_decoder(a: Architecture) -> Shapes:
    """calctl's reference decoder (calctl.model.tiny): RMSNorm, GQA attention, SwiGLU MLP."""
    d, h, kvh, hd, f, v = a.d_model, a.n_heads, a.n_kv_heads, a.head_dim, a.d_ff, a.vocab_size
    out: Shapes = {"embed": (v, d)}
    for i in range(a.n_layers):
        out[f"layers.{i}.attn_norm"] = (d,)
        out[f"layers.{i}.wq"] = (d, h * hd)
        out[f"layers.{i}.wk"] = (d, kvh * hd)
        out[f"layers.{i}.wv"] = (d, kvh * hd)
        out[f"layers.{i}.wo"] = (h * hd, d)
        out[f"layers.{i}.mlp_norm"] = (d,)
        out[f"layers.{i}.w_gate"] = (d, f)
        out[f"layers.{i}.w_up"] = (d, f)
        out[f"layers.{i}.w_down"] = (f, d)
    out["final_norm"] = (d,)
    if not a.tie_embeddings:
        out["lm_head"] = (d, v)
    return out


#: ``architecture.family`` -> its tensor table. Exact names (001 §10.4: no fuzzy matching).
FAMILIES: Mapping[str, Callable[[Architecture], Shapes]] = {
    "calctl-tiny-decoder": _tiny_decoder,
}


def known_families() -> tuple[str, ...]:
    return tuple(sorted(FAMILIES))


def expected_tensor_shapes(arch: Architecture) -> dict[str, tuple[int, ...]]:
    """Every parameter tensor ``arch`` has, by name, with its shape.

    Raises :class:`PackageError` for a family with no table (the rule reports it
    as a finding naming the known families).
    """
    build = FAMILIES.get(arch.family)
    if build is None:
        raise PackageError(
            f"architecture family {arch.family!r} has no known tensor layout (known: {', '.join(known_families())})",
            field="architecture/family",
        )
    return build(arch)


__all__ = ["FAMILIES", "expected_tensor_shapes", "known_families"]
