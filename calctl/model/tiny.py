"""The bundled sample packages' name for the decoder: everything lives in :mod:`calctl.model.decoder`.

Kept so code written against ``calctl.model.tiny`` keeps working; new code imports
``calctl.model.decoder``.
"""

from __future__ import annotations

from calctl.model.decoder import (
    KvCache,
    Params,
    decode_step,
    init_params,
    load_params,
    param_layout,
    prefill,
    reference_generate,
    reference_logits,
)

__all__ = [
    "KvCache",
    "Params",
    "decode_step",
    "init_params",
    "load_params",
    "param_layout",
    "prefill",
    "reference_generate",
    "reference_logits",
]
