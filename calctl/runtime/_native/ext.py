"""The optional "model v1" extension of the C ABI: what a computing board needs to run a package's model.

A vendor calbin carries its own compiled program, so a thin shim over CalRT
never needs this. The reference board (``reference/calrt_reference.c``)
computes the decoder itself, so after ``calrt_calbin_create`` calctl hands it,
per model, the architecture numbers and a table of parameter tensors: for each,
its role (embedding, a layer's q projection, ...), the blob file relative to
the package directory, the byte offset, the dtype and the element count
(docs/calrt-c-abi.md §11). The board reads and converts the blobs itself: q4_0, q4_1
and q8_0 matrices (GGML blocks, ``CALRT_EXT_DTYPE_Q*``) are dequantised to float32 at load.

Tensor names are the package's (``calctl.model.decoder.param_layout``):
``embed``, ``final_norm``, ``lm_head`` and ``layers.N.<role>``. Optional
families (001 §8.3 first targets) are flags derived from what the package
holds: q/k/v biases (``bq``/``bk``/``bv``), q/k RMSNorm (``q_norm``/``k_norm``),
an untied ``lm_head``. This module builds ctypes structures; it calls nothing.
"""

from __future__ import annotations

import re

from calctl.package.model import Model
from calctl.runtime._native import lib as L
from calctl.runtime.errors import InvalidCalbin

_LAYER = re.compile(r"layers\.(\d+)\.([a-z_]+)")
_PARAM_DTYPES = {
    "fp32": 8,
    "float32": 8,
    "fp16": 6,
    "float16": 6,
    "bf16": 7,
    "bfloat16": 7,
    # GGML blocks (calrt_ext.h CALRT_EXT_DTYPE_Q*): the board dequantises them to float32 at load
    "q4_0": 0x101,
    "q4_1": 0x102,
    "q8_0": 0x103,
}
_ROPE_HALF_STYLES = {"half", "neox", "rotate_half"}


def model_desc(model: Model, keep: list[object]) -> L.CalrtExtModelDesc:
    """The ``calrt_ext_model_desc`` of ``model``; ctypes objects that must outlive the call go to ``keep``."""
    arch = model.architecture
    params = (L.CalrtExtParam * max(len(model.params), 1))()
    names: set[str] = set()
    for i, t in enumerate(model.params):
        role, layer = _role(model.alias, t.name, arch.n_layers)
        if t.dtype not in _PARAM_DTYPES:
            raise InvalidCalbin(
                f"model {model.alias!r}: parameter {t.name!r} has dtype {t.dtype!r}; the reference board reads fp32, fp16, "
                "bf16, q4_0, q4_1 or q8_0"
            )
        elements = 1
        for d in t.shape:
            elements *= d
        file = t.file.encode()
        keep.append(file)
        params[i] = L.CalrtExtParam(role, layer, file, t.offset, _PARAM_DTYPES[t.dtype], elements)
        names.add(t.name.split(".")[-1])
    flags = 0
    if arch.tie_embeddings:
        flags |= L.EXT_TIED_EMBEDDINGS
    if "bq" in names:
        flags |= L.EXT_QKV_BIAS
    if "q_norm" in names:
        flags |= L.EXT_QK_NORM
    # A rotate-half RoPE (HF Llama layout) is an architecture field when the importer records one.
    if str(getattr(arch, "rope_style", "")).lower() in _ROPE_HALF_STYLES:
        flags |= L.EXT_ROPE_HALF
    alias, family = model.alias.encode(), arch.family.encode()
    keep.extend([params, alias, family])
    return L.CalrtExtModelDesc(
        L.EXT_MODEL_VERSION,
        alias,
        family,
        arch.n_layers,
        arch.d_model,
        arch.n_heads,
        arch.n_kv_heads,
        arch.head_dim,
        arch.d_ff,
        arch.vocab_size,
        flags,
        float(arch.rope_theta),
        float(arch.norm_eps),
        len(model.params),
        params,
    )


def _role(alias: str, name: str, n_layers: int) -> tuple[int, int]:
    if name in L.EXT_ROLES:
        return L.EXT_ROLES[name], 0
    m = _LAYER.fullmatch(name)
    if m and m.group(2) in L.EXT_LAYER_ROLES and int(m.group(1)) < n_layers:
        return L.EXT_LAYER_ROLES[m.group(2)], int(m.group(1))
    raise InvalidCalbin(
        f"model {alias!r}: parameter tensor {name!r} has no role in the C ABI model extension "
        f"(expected embed, final_norm, lm_head or layers.<0..{n_layers - 1}>.<{'|'.join(L.EXT_LAYER_ROLES)}>)",
        hint="docs/calrt-c-abi.md §11 lists the roles a computing board understands",
    )
