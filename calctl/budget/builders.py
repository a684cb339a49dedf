"""Budget plans built from a package or a Hugging Face config (001 §8.1-§8.2).

:func:`plan_from_package` takes an already loaded :class:`Package`: per chip, the
models the manifest places there, their sizes from the memory plan, else their
sections, else estimated. :func:`plan_from_config` takes a :class:`ModelShape`
from a config.json, optionally tensor-parallel over N identical chips. The types
they build and their evaluation are :mod:`calctl.budget.plan`. No I/O, no output.
"""

from __future__ import annotations

from collections.abc import Iterable

from calctl.budget.kv import kv_bytes, kv_heads_per_chip
from calctl.budget.plan import (
    CODE,
    DEFAULT_CHIP_DRAM_BYTES,
    IO,
    KV,
    RUNTIME,
    W_COMPILED,
    WORKSPACE,
    BudgetInput,
    BudgetPlan,
    ChipLoad,
    Component,
    Estimates,
    ModelLoad,
    Source,
    Stated,
    WorkspaceOverride,
)
from calctl.budget.shape import ModelShape, shape_from_package_model
from calctl.budget.units import canonical_dtype, human
from calctl.errors import UsageError
from calctl.package.model import MemoryRegion, Model, Package, SectionKind

#: The §8.1 term a memory-plan region no model on its chip owns counts towards.
_REGION_TERM = {
    SectionKind.PARAMS: W_COMPILED,
    SectionKind.KV: KV,
    SectionKind.WORKSPACE: WORKSPACE,
    SectionKind.CODE: CODE,
    SectionKind.COMMAND: CODE,
    SectionKind.IO: IO,
    SectionKind.RUNTIME: RUNTIME,
}


def _names(names: Iterable[str], limit: int = 3) -> str:
    items = list(names)
    shown = ", ".join(items[:limit])
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def model_chip_load(
    model: Model,
    chip: int,
    regions: tuple[MemoryRegion, ...] = (),
    *,
    kv_dtype: str | None = None,
    block_tokens: int | None = None,
    workspace: WorkspaceOverride = WorkspaceOverride(),
) -> ModelLoad:
    """One package model's share of ``chip``: sizes from the chip's memory-plan regions it
    owns, else from its sections on that chip, else estimated."""
    shape = shape_from_package_model(model)
    split = len(model.target_chips)
    own = [r for r in regions if r.owner == model.alias]
    sections = [s for s in model.all_sections() if chip in s.chips]

    def stated(kinds: set[SectionKind]) -> Stated | None:
        rs = [r for r in own if r.kind in kinds]
        if rs:
            return Stated(sum(r.size for r in rs), Source.MANIFEST, f"memory plan {_names(r.name for r in rs)}")
        ss = [s for s in sections if s.kind in kinds]
        if ss:
            return Stated(sum(s.size for s in ss), Source.MANIFEST, f"sections {_names(s.name for s in ss)}")
        return None

    weights = stated({SectionKind.PARAMS})
    if weights is None and model.params:
        total = sum(t.nbytes for t in model.params)
        weights = Stated(
            -(-total // split),
            Source.MANIFEST,
            f"params.tensors {total:,} bytes" + (f" / {split} chips" if split > 1 else ""),
        )

    kv_dt = kv_dtype or canonical_dtype(model.kv.dtype, f"{model.pointer}/kv/dtype")
    block = block_tokens or model.kv.block_tokens
    kv_src = "--kv-dtype" if kv_dtype else "manifest kv.dtype"
    block_src = "--block-tokens" if block_tokens else "manifest kv.block_tokens"
    heads = kv_heads_per_chip(shape.n_kv_heads, split)
    split_text = f"KV heads ceil({shape.n_kv_heads}/{split}) = {heads} per chip; " if split > 1 else ""

    if workspace.peak_bytes is not None:
        peak: Stated | None = Stated(workspace.peak_bytes, Source.CONFIG, "--workspace")
        prefill = decode = None
    else:
        peak = None
        prefill = (
            Stated(workspace.prefill_bytes, Source.CONFIG, "--prefill-workspace")
            if workspace.prefill_bytes is not None
            else Stated(model.workspace.prefill_peak_bytes, Source.MANIFEST, "manifest workspace.prefill_peak_bytes")
        )
        decode = (
            Stated(workspace.decode_bytes, Source.CONFIG, "--decode-workspace")
            if workspace.decode_bytes is not None
            else Stated(model.workspace.decode_peak_bytes, Source.MANIFEST, "manifest workspace.decode_peak_bytes")
        )

    return ModelLoad(
        alias=model.alias,
        shape=shape,
        split=split,
        weight_dtype=shape.dtype,
        kv_dtype=kv_dt,
        block_tokens=block,
        default_context=model.architecture.context_limit,
        default_sequences=model.kv.max_sequences,
        weights=weights,
        code_and_commands=stated({SectionKind.CODE, SectionKind.COMMAND}),
        io_staging=stated({SectionKind.IO}),
        runtime_metadata=stated({SectionKind.RUNTIME}),
        workspace_peak=peak,
        prefill_workspace=prefill,
        decode_workspace=decode,
        kv_detail=f"{split_text}{kv_dt} from {kv_src}, blocks of {block} tokens from {block_src}",
        reserved_workspace=_reserved(own, SectionKind.WORKSPACE),
        reserved_kv=_reserved(own, SectionKind.KV),
        reserved_kv_at=(model.architecture.context_limit, model.kv.max_sequences),
    )


def _reserved(own: list[MemoryRegion], kind: SectionKind) -> Stated | None:
    rs = [r for r in own if r.kind is kind]
    if not rs:
        return None
    return Stated(sum(r.size for r in rs), Source.MANIFEST, f"memory plan {_names(r.name for r in rs)}")


def _plan_notes(load_models: tuple[ModelLoad, ...], regions: tuple[MemoryRegion, ...]) -> tuple[str, ...]:
    """Where the package's own memory plan disagrees with what the budget counts."""
    notes = []
    for m in load_models:
        own = [r for r in regions if r.owner == m.alias]
        kv_region = sum(r.size for r in own if r.kind is SectionKind.KV)
        ctx, seq = m.default_context or 0, m.default_sequences
        need = kv_bytes(
            m.shape, context=ctx, sequences=seq, kv_dtype=m.kv_dtype, kv_heads=m.kv_heads, block_tokens=m.block_tokens
        )
        if kv_region and kv_region < need:
            notes.append(
                f"{m.alias}: the memory plan reserves {kv_region:,} bytes of KV but the formula needs "
                f"{need:,} at its declared {ctx} tokens x {seq} sequences"
            )
        ws_region = sum(r.size for r in own if r.kind is SectionKind.WORKSPACE)
        if ws_region and m.prefill_workspace is not None and ws_region < m.prefill_workspace.bytes:
            notes.append(
                f"{m.alias}: the memory plan reserves {ws_region:,} bytes of workspace, below the "
                f"prefill peak {m.prefill_workspace.bytes:,}"
            )
        if m.split > 1:
            notes.append(
                f"{m.alias} is split over {m.split} chips: manifest workspace peaks are taken as per-chip figures"
            )
    return tuple(notes)


def package_chip_load(
    pkg: Package,
    chip: int,
    *,
    chip_dram_bytes: int | None = None,
    kv_dtype: str | None = None,
    block_tokens: int | None = None,
    workspace: WorkspaceOverride = WorkspaceOverride(),
) -> ChipLoad:
    """What ``chip`` holds under ``pkg``: every model targeting it, plus regions no such model owns."""
    regions = pkg.regions_on(chip)
    on_chip = [m for m in pkg.models if chip in m.target_chips]
    loads = tuple(
        model_chip_load(m, chip, regions, kv_dtype=kv_dtype, block_tokens=block_tokens, workspace=workspace)
        for m in on_chip
    )
    aliases = {m.alias for m in on_chip}
    shared = tuple(
        Component(_REGION_TERM[r.kind], r.size, Source.MANIFEST, f"memory plan {r.name} (owner {r.owner})")
        for r in regions
        if r.owner not in aliases
    )
    if chip_dram_bytes is None:
        dram, dram_source = pkg.device_cfg.chip_dram_bytes, Source.MANIFEST
    else:
        dram, dram_source = chip_dram_bytes, Source.CONFIG
    return ChipLoad(
        chip=chip,
        dram_bytes=dram,
        dram_source=dram_source,
        models=loads,
        shared=shared,
        notes=_plan_notes(loads, regions),
    )


def plan_from_package(
    pkg: Package,
    *,
    chip_dram_bytes: int | None = None,
    kv_dtype: str | None = None,
    block_tokens: int | None = None,
    workspace: WorkspaceOverride = WorkspaceOverride(),
) -> BudgetPlan:
    """Per chip, each with the model(s) the manifest places on it (001 §8.2: A and B separately)."""
    chips = sorted({c for m in pkg.models for c in m.target_chips} | {r.chip for r in pkg.memory_plan})
    loads = tuple(
        package_chip_load(
            pkg, c, chip_dram_bytes=chip_dram_bytes, kv_dtype=kv_dtype, block_tokens=block_tokens, workspace=workspace
        )
        for c in chips
    )
    whole = tuple(
        model_chip_load(m, m.target_chips[0], (), kv_dtype=kv_dtype, block_tokens=block_tokens, workspace=workspace)
        for m in pkg.models
    )
    assumptions = [
        "the manifest declares no sliding window: every layer keeps the full context",
        "weights, code, commands, I/O and runtime: the memory plan's regions on each chip (else the model's sections)",
        "largest context and batch are memory what-ifs: the compiled package serves at most its context_limit and "
        "kv.max_sequences lanes (calctl.budget.capacity caps the serving core at both)",
    ]
    if kv_dtype or block_tokens:
        assumptions.append("KV dtype or block size overridden on the command line (what-if, not the compiled layout)")
    return BudgetPlan(
        input=BudgetInput(kind="package", name=pkg.name, path=str(pkg.root), version=pkg.version),
        loads=loads,
        models=whole,
        chips_per_model={m.alias: tuple(m.target_chips) for m in pkg.models},
        assumptions=tuple(assumptions),
    )


def plan_from_config(
    shape: ModelShape,
    *,
    path: str = "",
    chips: int = 1,
    chip_dram_bytes: int | None = None,
    weight_dtype: str | None = None,
    kv_dtype: str | None = None,
    block_tokens: int | None = None,
    workspace: WorkspaceOverride = WorkspaceOverride(),
    estimates: Estimates = Estimates(),
) -> BudgetPlan:
    """A Hugging Face model split tensor-parallel over ``chips`` identical chips."""
    if chips < 1:
        raise UsageError(f"chips {chips}: must be at least 1")
    notes = list(shape.assumptions)
    notes.append(f"attention windows: {shape.window_convention}")
    if chip_dram_bytes is None:
        dram, dram_source = DEFAULT_CHIP_DRAM_BYTES, Source.ESTIMATE
        notes.append(
            f"chip DRAM {human(dram)}: the reference board class, not a confirmed figure "
            "(001 §8.2: use the vendor's per-chip number, --chip-dram)"
        )
    else:
        dram, dram_source = chip_dram_bytes, Source.CONFIG
    w_dtype = weight_dtype or shape.dtype
    kv_dt = kv_dtype or shape.dtype
    if kv_dtype is None:
        notes.append(f"KV dtype {kv_dt}: the config's torch_dtype (set --kv-dtype)")
    block = block_tokens or 1
    if block_tokens is None:
        notes.append("no KV block rounding: a config states no layout (set --block-tokens for a paged layout)")
    notes.append(f"weights estimated from the config at {w_dtype}; a compiled package states W_compiled")
    if workspace.peak_bytes is None and (workspace.prefill_bytes is None or workspace.decode_bytes is None):
        notes.append(
            "workspace phases not given are estimated: prefill = activations of one prompt of the whole context "
            f"(B1, 000 §6), decode = one step over the active sequences, {estimates.activation_bits}-bit "
            "activations, tiled attention (no tokens x tokens score matrix)"
        )
    notes.append(
        f"code_and_commands and runtime_metadata: {human(estimates.code_and_commands_bytes)} and "
        f"{human(estimates.runtime_metadata_bytes)} per chip, estimates "
        "(001 §15.1 item 7 asks the compiler for a static/peak memory report)"
    )
    heads = kv_heads_per_chip(shape.n_kv_heads, chips)
    if chips > 1:
        notes.append(
            f"tensor parallel over {chips} chips: matrices split evenly (ceil), norms replicated, "
            f"KV heads ceil({shape.n_kv_heads}/{chips}) = {heads} per chip"
        )
    split_text = f"KV heads ceil({shape.n_kv_heads}/{chips}) = {heads} per chip; " if chips > 1 else ""
    kv_from = "--kv-dtype" if kv_dtype else "config torch_dtype"
    load = ModelLoad(
        alias=shape.name,
        shape=shape,
        split=chips,
        weight_dtype=w_dtype,
        kv_dtype=kv_dt,
        block_tokens=block,
        default_context=shape.context_limit,
        default_sequences=1,  # 001 §8.3: first round is B1
        workspace_peak=(
            Stated(workspace.peak_bytes, Source.CONFIG, "--workspace") if workspace.peak_bytes is not None else None
        ),
        prefill_workspace=(
            Stated(workspace.prefill_bytes, Source.CONFIG, "--prefill-workspace")
            if workspace.prefill_bytes is not None
            else None
        ),
        decode_workspace=(
            Stated(workspace.decode_bytes, Source.CONFIG, "--decode-workspace")
            if workspace.decode_bytes is not None
            else None
        ),
        kv_detail=f"{split_text}{kv_dt} from {kv_from}, "
        + (f"blocks of {block} tokens (--block-tokens)" if block_tokens else "no block rounding"),
    )
    loads = tuple(ChipLoad(chip=c, dram_bytes=dram, dram_source=dram_source, models=(load,)) for c in range(chips))
    return BudgetPlan(
        input=BudgetInput(kind="hf-config", name=shape.name, path=path),
        loads=loads,
        models=(load,),
        chips_per_model={shape.name: tuple(range(chips))},
        assumptions=tuple(notes),
    )
