"""What the mock board computes: the package's decoder on the package's params.

The mock executes the numpy decoder (:mod:`calctl.model.decoder`: the calctl
tiny sample model and the imported Llama / Qwen2 / Qwen3 families) with the
weights read from the package's param blobs and a real KV cache per sequence,
so golden runs, KV corruption and cross-model crosstalk are genuinely
detectable (docs/runtime.md). It accepts only graphs with the decoder's I/O contract
(the one :mod:`calctl.compiler.sample` and :mod:`calctl.compiler.importer` write):

* prefill: inputs ``tokens [1, N] int32`` and ``n_tokens [1] int32`` (the CSR
  valid length), output ``logits [1, vocab] float32``;
* decode: inputs ``tokens [B, 1] int32``, ``positions [B] int32`` (== committed
  KV length, 000 §9.2) and, for B > 1, ``lane_valid [B] uint8`` (000 §7.3),
  output ``logits [B, vocab] float32``; an inactive lane writes no KV and
  returns zero logits.

Anything else is refused at ``create_calbin`` with InvalidCalbin: the mock does
not pretend to run a model it cannot run. This module computes; it does not
schedule, time or validate KV bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calctl.model import decoder
from calctl.model.native import trim_heap
from calctl.package.architecture import DECODER_FAMILIES
from calctl.package.model import Architecture, Graph, GraphKind, Model, Package
from calctl.runtime.buffers import HostBuffer
from calctl.runtime.errors import InvalidCalbin

#: Families the mock can execute.
MOCK_FAMILIES = DECODER_FAMILIES


@dataclass(frozen=True)
class LoadedModel:
    alias: str
    arch: Architecture
    params: decoder.Weights
    max_seq: int  # KV capacity of one sequence (largest graph max_seq)
    max_sequences: int

    def empty_cache(self) -> decoder.KvCache:
        return decoder.KvCache.empty(self.arch, self.max_seq)


def _io(
    graph: Graph,
) -> tuple[dict[str, tuple[str, tuple[int | str, ...]]], dict[str, tuple[str, tuple[int | str, ...]]]]:
    return ({t.name: (t.dtype, t.shape) for t in graph.inputs}, {t.name: (t.dtype, t.shape) for t in graph.outputs})


def check_io_contract(model: Model, graph: Graph) -> None:
    """Raise InvalidCalbin unless ``graph`` has the decoder's I/O contract."""
    vocab = model.architecture.vocab_size
    ins, outs = _io(graph)
    problems: list[str] = []
    if outs.get("logits") != ("float32", ("B" if graph.kind is GraphKind.DECODE else 1, vocab)) or len(outs) != 1:
        problems.append(f"outputs {sorted(outs)} are not exactly logits [B, {vocab}] float32")
    if graph.kind is GraphKind.PREFILL:
        tok = ins.get("tokens")
        if tok is None or tok[0] != "int32" or len(tok[1]) != 2 or tok[1][0] != 1 or not isinstance(tok[1][1], int):
            problems.append("input tokens is not int32 [1, N]")
        if ins.get("n_tokens") != ("int32", (1,)) or graph.valid_length_input != "n_tokens":
            problems.append("input n_tokens int32 [1] is not the CSR valid_length_input")
        if set(ins) != {"tokens", "n_tokens"}:
            problems.append(f"inputs {sorted(ins)} are not exactly tokens, n_tokens")
    else:
        if ins.get("tokens") != ("int32", ("B", 1)) or ins.get("positions") != ("int32", ("B",)):
            problems.append("inputs are not tokens int32 [B, 1] and positions int32 [B]")
        expected = {"tokens", "positions"}
        if max(graph.batch_profiles) > 1:
            expected.add("lane_valid")
            pol = graph.inactive_lane_policy
            if (
                ins.get("lane_valid") != ("uint8", ("B",))
                or pol is None
                or pol.mask_input != "lane_valid"
                or pol.writes_kv
            ):
                problems.append(
                    "a B>1 profile needs lane_valid uint8 [B] as the inactive-lane mask that writes no KV (000 §7.3)"
                )
        if set(ins) != expected:
            problems.append(f"inputs {sorted(ins)} are not exactly {sorted(expected)}")
    if graph.position_semantics != "committed_kv_length":
        problems.append(f"position semantics {graph.position_semantics!r} is not committed_kv_length")
    if problems:
        raise InvalidCalbin(
            f"the mock board cannot execute graph {graph.name!r}: {problems[0]}",
            hint="the mock runs the calctl decoder I/O contract (docs/runtime.md); use --device calrt for other packages",
        )


_blas_limited = False


def single_threaded_blas() -> None:
    """Keep BLAS to one thread per calling thread, process-wide (threadpoolctl).

    The mock computes each chip's jobs on that chip's own thread; on the 2-core
    reference machine two chips are two cores. A multi-threaded BLAS inside each
    would oversubscribe the cores, and its spinning threads slow a 135M model's
    decode several-fold on a loaded machine.
    """
    global _blas_limited
    if not _blas_limited:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")
        _blas_limited = True


def load_model(package: Package, model: Model) -> LoadedModel:
    """Check every graph's I/O contract and read the params; InvalidCalbin on any problem."""
    single_threaded_blas()
    if model.architecture.family not in MOCK_FAMILIES or model.architecture.rope_style not in decoder.ROPE_STYLES:
        raise InvalidCalbin(
            f"the mock board cannot execute model {model.alias!r}: architecture family {model.architecture.family!r} "
            f"(rope_style {model.architecture.rope_style!r}) is not one of {', '.join(MOCK_FAMILIES)}",
            hint="the mock runs the numpy decoder families (docs/import.md); use --device calrt for other packages",
        )
    for g in model.graphs:
        check_io_contract(model, g)
    try:
        params = decoder.load_params(package.root, model.params, keep_dtype=True)
    except (OSError, ValueError, KeyError) as exc:
        raise InvalidCalbin(f"model {model.alias!r}: cannot read params: {exc}") from None
    expected = decoder.param_layout(model.architecture)
    missing = [name for name, _ in expected if name not in params]
    if missing:
        raise InvalidCalbin(f"model {model.alias!r}: params lack {', '.join(missing[:5])}")
    wrong = [f"{n} {params[n].shape} (expected {s})" for n, s in expected if params[n].shape != s]
    if wrong:
        raise InvalidCalbin(f"model {model.alias!r}: parameter shapes differ from the architecture: {wrong[0]}")
    prepared = decoder.prepare(params, model.architecture)
    del params  # the tensors as read; prepare fused them into new arrays
    trim_heap()
    return LoadedModel(
        alias=model.alias,
        arch=model.architecture,
        params=prepared,
        max_seq=max(g.max_seq for g in model.graphs),
        max_sequences=model.kv.max_sequences,
    )


def prefill_length(inputs: HostBuffer) -> int:
    return int(inputs.device_view("n_tokens")[0])


def decode_lanes(inputs: HostBuffer) -> list[tuple[int, int, int]]:
    """``(lane, token, position)`` of every active lane."""
    tokens = inputs.device_view("tokens")
    positions = inputs.device_view("positions")
    valid = inputs.device_view("lane_valid") if "lane_valid" in inputs.names else np.ones(inputs.batch, np.uint8)
    return [(i, int(tokens[i, 0]), int(positions[i])) for i in range(inputs.batch) if valid[i]]


def run_graph(
    model: LoadedModel,
    kind: GraphKind,
    inputs: HostBuffer,
    outputs: HostBuffer,
    caches: Sequence[decoder.KvCache | None],
) -> None:
    """Execute one job: read inputs, update the caches of the active lanes, write logits."""
    logits = outputs.device_view("logits")
    if kind is GraphKind.PREFILL:
        n = prefill_length(inputs)
        tokens = inputs.device_view("tokens")[0, :n]
        cache = caches[0]
        assert cache is not None
        logits[0] = decoder.prefill(model.params, model.arch, tokens, cache)
        return
    lanes = decode_lanes(inputs)
    n = len(lanes)
    # The usual batch, lanes 0..n-1 active: their logits are computed straight into the output buffer (no copy);
    # every row no active lane writes is zero.
    leading = [lane for lane, _, _ in lanes] == list(range(n))
    logits[n if leading else 0 :] = 0.0
    if not lanes:
        return
    active = [caches[lane] for lane, _, _ in lanes]
    assert all(c is not None for c in active)
    out = decoder.decode_batch(
        model.params,
        model.arch,
        np.array([t for _, t, _ in lanes]),
        np.array([p for _, _, p in lanes]),
        [c for c in active if c is not None],
        out=logits[:n] if leading else None,
    )  # the active lanes' GEMVs as one GEMM
    if not leading:
        for row, (lane, _, _) in enumerate(lanes):
            logits[lane] = out[row]
