"""KV admission limits for the serving core (000 §5.1 ``CapacityBudget``), from the budget.

The AdmissionController needs two numbers per model: how many KV tokens it may
hold in total (``max_kv_tokens``) and how many sequences may be active at once
(``max_sequences``). Both come from the same §8.1/§8.2 evaluation as ``calctl
budget``, so the server never admits what the budget would call NO-GO, and both
are capped by what the package compiled: the KV region (``kv.bytes``) and the
KV lanes (``kv.max_sequences``). The budget can only lower those, never raise them.

Pure functions of a loaded :class:`Model` (and optionally its :class:`Package`,
so that other models and shared regions on the same chip count). No I/O, no
clock, no device.
"""

from __future__ import annotations

from dataclasses import replace

from calctl.budget.builders import model_chip_load, package_chip_load
from calctl.budget.kv import kv_bytes_per_token
from calctl.budget.plan import (
    ChipLoad,
    Estimates,
    Source,
    WorkspaceOverride,
    evaluate,
    largest_passing,
)
from calctl.budget.policy import BudgetPolicy, BudgetVerdict
from calctl.package.model import Model, Package


def _chip_load(model: Model, chip: int, chip_dram_bytes: int, package: Package | None) -> ChipLoad:
    if package is not None:
        return package_chip_load(package, chip, chip_dram_bytes=chip_dram_bytes)
    return ChipLoad(
        chip=chip,
        dram_bytes=chip_dram_bytes,
        dram_source=Source.CONFIG,
        models=(model_chip_load(model, chip, (), workspace=WorkspaceOverride()),),
    )


def _chips(model: Model, chip: int | None) -> tuple[int, ...]:
    if chip is None:
        return model.target_chips
    if chip not in model.target_chips:
        raise ValueError(f"model {model.alias!r} does not run on chip {chip} (targets {model.target_chips})")
    return (chip,)


def max_kv_tokens(
    model: Model,
    chip_dram_bytes: int,
    policy: BudgetPolicy = BudgetPolicy(),
    *,
    package: Package | None = None,
    chip: int | None = None,
    estimates: Estimates = Estimates(),
) -> int:
    """Total KV tokens (over all active sequences) ``model`` may hold on its chip(s).

    The largest multiple of ``kv.block_tokens`` such that the chip is still GO
    under ``policy`` with that much KV (other terms at the model's declared point,
    other models on the chip at theirs), and no more than the compiled KV region
    ``kv.bytes`` holds. Counted at the full-attention rate; 0 means nothing fits.
    For a model split over chips, the tightest chip decides (``chip`` picks one).
    """
    load_model = model_chip_load(model, model.target_chips[0])
    block = load_model.block_tokens
    whole_rate = kv_bytes_per_token(load_model.shape, load_model.kv_dtype) * block
    compiled_blocks = model.kv.bytes // whole_rate if whole_rate else 0
    best = compiled_blocks
    for c in _chips(model, chip):
        load = _chip_load(model, c, chip_dram_bytes, package)
        rate = next(m for m in load.models if m.alias == model.alias).chip_kv_bytes_per_token() * block

        def fits(blocks: int, load: ChipLoad = load, rate: int = rate) -> bool:
            budget = evaluate(load, policy, estimates, kv_override={model.alias: blocks * rate})
            return budget.verdict is BudgetVerdict.GO

        best = min(best, largest_passing(fits, compiled_blocks))
    return best * block


def max_sequences(
    model: Model,
    chip_dram_bytes: int,
    policy: BudgetPolicy = BudgetPolicy(),
    *,
    context: int | None = None,
    package: Package | None = None,
    chip: int | None = None,
    estimates: Estimates = Estimates(),
) -> int:
    """Active sequences of ``context`` tokens (default: the model's context limit) that stay GO.

    Capped by the compiled KV lanes ``kv.max_sequences``; 0 means not even one fits.
    """
    best = model.kv.max_sequences
    for c in _chips(model, chip):
        load = _chip_load(model, c, chip_dram_bytes, package)

        def fits(n: int, load: ChipLoad = load) -> bool:
            return _go_with(load, policy, estimates, model.alias, context, n)

        best = min(best, largest_passing(fits, model.kv.max_sequences))
    return best


def _go_with(
    load: ChipLoad, policy: BudgetPolicy, estimates: Estimates, alias: str, context: int | None, sequences: int
) -> bool:
    """GO with ``alias`` at (context, sequences) and every other model on the chip at its defaults."""
    models = tuple(
        replace(m, default_context=context if context is not None else m.default_context, default_sequences=sequences)
        if m.alias == alias
        else m
        for m in load.models
    )
    return evaluate(replace(load, models=models), policy, estimates).verdict is BudgetVerdict.GO
