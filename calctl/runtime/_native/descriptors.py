"""The ctypes descriptors calctl hands the shim: a calbin's graphs, models and tensors, and a job (calrt.h).

:func:`calbin_desc` turns a checked :class:`CalbinPlan` into a ``calrt_calbin_desc`` and :func:`job_desc` a
submit's arguments into a ``calrt_job_desc``. Both only build structures: they call nothing, and the arrays a
descriptor points into are kept alive by the caller (``keep``, or the returned structure's own references)
for as long as the call that takes it lasts. The optional model extension is :mod:`ext`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from ctypes import c_uint32, c_uint64
from pathlib import Path

from calctl.package.model import GraphKind, TensorSpec
from calctl.runtime._native import lib as L
from calctl.runtime.buffers import HostBuffer
from calctl.runtime.calbin import CalbinPlan
from calctl.runtime.errors import InvalidCalbin
from calctl.runtime.types import Engine, GenerationId, KvSeqId


def calbin_desc(plan: CalbinPlan, keep: list[object]) -> L.CalrtCalbinDesc:
    """``calrt_calbin_desc`` of ``plan``; the arrays it points into are appended to ``keep``."""

    def tensors(specs: Sequence[TensorSpec]) -> tuple[int, ctypes.Array[L.CalrtTensorDesc]]:
        if any(len(t.shape) > L.MAX_DIMS or t.dtype not in L.DTYPE_CODES for t in specs):
            raise InvalidCalbin(
                f"package {plan.package.name!r}: a tensor has more than {L.MAX_DIMS} dims or a dtype the C ABI lacks"
            )
        arr = (L.CalrtTensorDesc * max(len(specs), 1))()
        for i, t in enumerate(specs):
            dims = (ctypes.c_int64 * L.MAX_DIMS)(*[L.DIM_BATCH if d == "B" else int(d) for d in t.shape])
            arr[i] = L.CalrtTensorDesc(t.name.encode(), L.DTYPE_CODES[t.dtype], len(t.shape), dims)
        keep.append(arr)
        return len(specs), arr

    graphs = (L.CalrtGraphDesc * len(plan.graphs))()
    for i, gp in enumerate(plan.graphs.values()):
        g = gp.graph
        profiles = (c_uint32 * len(g.batch_profiles))(*g.batch_profiles)
        n_in, ins = tensors(g.inputs)
        n_out, outs = tensors(g.outputs)
        lane_valid = g.inactive_lane_policy.mask_input if g.inactive_lane_policy else None
        positions = "positions" if g.kind is GraphKind.DECODE and any(t.name == "positions" for t in g.inputs) else None
        keep.append(profiles)
        graphs[i] = L.CalrtGraphDesc(
            g.name.encode(),
            gp.model.encode(),
            L.GRAPH_PREFILL if g.kind is GraphKind.PREFILL else L.GRAPH_DECODE,
            gp.chip_mask,
            g.max_seq,
            len(g.batch_profiles),
            profiles,
            n_in,
            ins,
            n_out,
            outs,
            g.valid_length_input.encode() if g.valid_length_input else None,
            positions.encode() if positions else None,
            lane_valid.encode() if lane_valid else None,
        )
    models = (L.CalrtModelDesc * len(plan.models))()
    for i, mp in enumerate(plan.models.values()):
        models[i] = L.CalrtModelDesc(
            mp.alias.encode(),
            sum(1 << c for c in mp.chips),
            mp.model.kv.max_sequences,
            max(g.max_seq for g in mp.model.graphs),
        )
    plan_bytes = (c_uint64 * len(plan.chip_plan_bytes))(*plan.chip_plan_bytes)
    keep.extend((graphs, models, plan_bytes))
    return L.CalrtCalbinDesc(
        str(Path(plan.package.root).resolve()).encode(),
        len(plan.graphs),
        graphs,
        len(plan.models),
        models,
        len(plan.chip_plan_bytes),
        plan_bytes,
    )


def job_desc(
    graph: str,
    inputs: HostBuffer,
    outputs: HostBuffer,
    engine: Engine,
    lanes: tuple[KvSeqId | None, ...],
    generation: GenerationId,
) -> L.CalrtJobDesc:
    """``calrt_job_desc`` of one submit: one KV sequence per lane, ``KV_NONE`` for an inactive lane."""
    kv_arr = (c_uint64 * max(len(lanes), 1))(*[L.KV_NONE if s is None else int(s) for s in lanes])
    return L.CalrtJobDesc(
        graph.encode(),
        inputs.native,
        outputs.native,
        engine.code,
        inputs.batch,
        len(lanes),
        kv_arr,
        int(generation),
    )
