"""A whole budget run: every chip's verdict, the searches, the what-if grid, the JSON document.

:func:`run_budget` evaluates a :class:`BudgetPlan` at one point (context tokens x
active sequences; ``None`` = each model's default), searches each chip for the
largest context and sequence count that stay GO, and optionally fills a
context x sequences grid. :func:`report_document` is the JSON shape ``calctl
budget --format json`` prints and ``calctl bringup`` embeds.

Board-level figures are the worst chip's: the verdict is GO only if every chip
is GO (001 §8.2: each chip on its own), ``max_context``/``max_sequences`` are
the minimum over chips. This module does not print or read files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calctl.budget.kv import kv_bytes, kv_bytes_per_token
from calctl.budget.plan import (
    BudgetInput,
    BudgetPlan,
    ChipBudget,
    Estimates,
    SearchResult,
    evaluate,
    max_context_on_chip,
    max_sequences_on_chip,
)
from calctl.budget.policy import RECOMMENDED_LIMITS, BudgetPolicy, BudgetVerdict
from calctl.budget.units import DTYPE_BITS
from calctl.budget.weights import count_params


@dataclass(frozen=True)
class ChipReport:
    budget: ChipBudget
    #: None for a chip that holds no model (only shared regions).
    max_context: SearchResult | None
    max_sequences: SearchResult | None


@dataclass(frozen=True)
class ModelSummary:
    """One whole model (all its chips) at the evaluated point."""

    alias: str
    chips: tuple[int, ...]
    context: int
    sequences: int
    context_limit: int | None
    weight_dtype: str
    kv_dtype: str
    block_tokens: int
    kv_heads: int
    kv_heads_per_chip: int
    head_dim: int
    n_layers: int
    kv_bytes: int
    kv_bytes_per_token: int
    #: Estimated parameter count (config input only; a package states bytes, not counts).
    params: int | None
    window_convention: str


@dataclass(frozen=True)
class GridCell:
    context: int
    sequences: int
    verdict: BudgetVerdict
    #: The tightest chip: largest static share of its usable budget.
    chip: int
    static_bytes: int
    usable_bytes: int


@dataclass(frozen=True)
class Grid:
    contexts: tuple[int, ...]
    sequences: tuple[int, ...]
    cells: tuple[tuple[GridCell, ...], ...]  # [context][sequences]


@dataclass(frozen=True)
class BudgetReport:
    input: BudgetInput
    policy: BudgetPolicy
    context: int | None
    sequences: int | None
    chips: tuple[ChipReport, ...]
    models: tuple[ModelSummary, ...]
    kv_bytes: int
    kv_bytes_per_token: int
    max_context: SearchResult | None
    max_sequences: SearchResult | None
    verdict: BudgetVerdict
    assumptions: tuple[str, ...]
    grid: Grid | None = None


def _tightest(results: list[SearchResult | None]) -> SearchResult | None:
    found = [r for r in results if r is not None]
    return min(found, key=lambda r: r.value) if found else None


def default_grid_axes(
    plan: BudgetPlan, context: int | None, sequences: int | None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Contexts: the context limit and five halvings (plus the asked context); sequences 1..16 (plus the asked)."""
    limits = [m.shape.context_limit for m in plan.models if m.shape.context_limit is not None]
    asked = [m.context(context) for m in plan.models if context is not None or m.default_context is not None]
    top = min(limits) if limits else max(asked, default=4096)
    contexts = {top >> k for k in range(6)} | set(asked)
    seqs = {1, 2, 4, 8, 16} | {m.sequences(sequences) for m in plan.models}
    return tuple(sorted(c for c in contexts if c >= 1)), tuple(sorted(seqs))


def run_grid(
    plan: BudgetPlan,
    policy: BudgetPolicy,
    estimates: Estimates,
    contexts: tuple[int, ...],
    sequences: tuple[int, ...],
) -> Grid:
    rows = []
    for c in contexts:
        row = []
        for s in sequences:
            budgets = [evaluate(load, policy, estimates, context=c, sequences=s) for load in plan.loads if load.models]
            worst = max(budgets, key=lambda b: (b.static_bytes - b.usable_bytes, b.static_bytes))
            verdict = BudgetVerdict.GO if all(b.verdict is BudgetVerdict.GO for b in budgets) else BudgetVerdict.NO_GO
            row.append(GridCell(c, s, verdict, worst.chip, worst.static_bytes, worst.usable_bytes))
        rows.append(tuple(row))
    return Grid(contexts=contexts, sequences=sequences, cells=tuple(rows))


def run_budget(
    plan: BudgetPlan,
    policy: BudgetPolicy = BudgetPolicy(),
    estimates: Estimates = Estimates(),
    *,
    context: int | None = None,
    sequences: int | None = None,
    grid: bool = False,
    grid_contexts: tuple[int, ...] | None = None,
    grid_sequences: tuple[int, ...] | None = None,
) -> BudgetReport:
    """Evaluate every chip of ``plan`` at (``context``, ``sequences``) and search its limits."""
    chips = []
    for load in plan.loads:
        budget = evaluate(load, policy, estimates, context=context, sequences=sequences)
        if load.models:
            mc: SearchResult | None = max_context_on_chip(load, policy, estimates, sequences=sequences)
            ms: SearchResult | None = max_sequences_on_chip(load, policy, estimates, context=context)
        else:
            mc = ms = None
        chips.append(ChipReport(budget, mc, ms))

    models = []
    for m in plan.models:
        ctx, seq = m.context(context), m.sequences(sequences)
        models.append(
            ModelSummary(
                alias=m.alias,
                chips=tuple(plan.chips_per_model.get(m.alias, ())),
                context=ctx,
                sequences=seq,
                context_limit=m.shape.context_limit,
                weight_dtype=m.weight_dtype,
                kv_dtype=m.kv_dtype,
                block_tokens=m.block_tokens,
                kv_heads=m.shape.n_kv_heads,
                kv_heads_per_chip=m.kv_heads,
                head_dim=m.shape.head_dim,
                n_layers=m.shape.n_layers,
                # The whole model: every KV head, wherever it lives.
                kv_bytes=kv_bytes(
                    m.shape, context=ctx, sequences=seq, kv_dtype=m.kv_dtype, block_tokens=m.block_tokens
                ),
                kv_bytes_per_token=kv_bytes_per_token(m.shape, m.kv_dtype),
                params=count_params(m.shape).total if m.weights is None else None,
                window_convention=m.shape.window_convention,
            )
        )

    assumptions = list(plan.assumptions)
    if not policy.within_recommendation:
        lo, hi = RECOMMENDED_LIMITS
        assumptions.append(f"limit {policy.limit:g} is outside the {lo:g}-{hi:g} band of 001 §8.2")
    grid_result = None
    if grid or grid_contexts or grid_sequences:
        dc, ds = default_grid_axes(plan, context, sequences)
        grid_result = run_grid(plan, policy, estimates, grid_contexts or dc, grid_sequences or ds)

    verdict = BudgetVerdict.GO if all(c.budget.verdict is BudgetVerdict.GO for c in chips) else BudgetVerdict.NO_GO
    return BudgetReport(
        input=plan.input,
        policy=policy,
        context=context,
        sequences=sequences,
        chips=tuple(chips),
        models=tuple(models),
        kv_bytes=sum(m.kv_bytes for m in models),
        kv_bytes_per_token=sum(m.kv_bytes_per_token for m in models),
        max_context=_tightest([c.max_context for c in chips]),
        max_sequences=_tightest([c.max_sequences for c in chips]),
        verdict=verdict,
        assumptions=tuple(assumptions),
        grid=grid_result,
    )


def _search(result: SearchResult | None) -> tuple[int | None, str | None]:
    return (None, None) if result is None else (result.value, result.bound.value)


def report_document(report: BudgetReport) -> dict[str, Any]:
    """The ``calctl budget --format json`` document (without ``schema_version``, added by the renderer)."""
    chips = []
    for c in report.chips:
        b = c.budget
        mc, mc_bound = _search(c.max_context)
        ms, ms_bound = _search(c.max_sequences)
        chips.append(
            {
                "chip": b.chip,
                "models": list(b.models),
                "components": {x.name: x.bytes for x in b.components},
                "sources": {x.name: x.source.value for x in b.components},
                "details": {x.name: x.detail for x in b.components},
                "static_bytes": b.static_bytes,
                "required_bytes": b.required_bytes,
                "dram_bytes": b.dram_bytes,
                "limit_bytes": b.limit_bytes,
                "guard_bytes": b.guard_bytes,
                "usable_bytes": b.usable_bytes,
                "headroom_bytes": b.headroom_bytes,
                "verdict": b.verdict.value,
                "reasons": list(b.reasons),
                "notes": list(b.notes),
                "max_context": mc,
                "max_context_bound": mc_bound,
                "max_sequences": ms,
                "max_sequences_bound": ms_bound,
            }
        )
    mc, mc_bound = _search(report.max_context)
    ms, ms_bound = _search(report.max_sequences)
    p = report.policy
    doc: dict[str, Any] = {
        "input": {
            "kind": report.input.kind,
            "name": report.input.name,
            "path": report.input.path,
            "version": report.input.version,
        },
        "device": {
            # Every chip of one plan has the same local DRAM (device_cfg, --chip-dram or the default).
            "chips": len(report.chips),
            "chip_dram_bytes": report.chips[0].budget.dram_bytes if report.chips else None,
            "source": report.chips[0].budget.dram_source.value if report.chips else None,
        },
        "policy": {
            "limit": p.limit,
            "guard_fraction": p.guard_fraction,
            "guard_min_bytes": p.guard_min_bytes,
            "rule": "GO iff static <= floor(limit x DRAM) and DRAM - static >= max(guard_min, ceil(guard_fraction x DRAM))",
        },
        "context": report.context,
        "batch": report.sequences,
        "verdict": report.verdict.value,
        "chips": chips,
        "models": [
            {
                "alias": m.alias,
                "chips": list(m.chips),
                "context": m.context,
                "sequences": m.sequences,
                "context_limit": m.context_limit,
                "weight_dtype": m.weight_dtype,
                "kv_dtype": m.kv_dtype,
                "kv_bits": DTYPE_BITS[m.kv_dtype],
                "block_tokens": m.block_tokens,
                "n_layers": m.n_layers,
                "kv_heads": m.kv_heads,
                "kv_heads_per_chip": m.kv_heads_per_chip,
                "head_dim": m.head_dim,
                "kv_bytes": m.kv_bytes,
                "kv_bytes_per_token": m.kv_bytes_per_token,
                "params_estimate": m.params,
                "attention_windows": m.window_convention,
            }
            for m in report.models
        ],
        "kv_bytes": report.kv_bytes,
        "kv_bytes_per_token": report.kv_bytes_per_token,
        "max_context": mc,
        "max_context_bound": mc_bound,
        "max_sequences": ms,
        "max_sequences_bound": ms_bound,
        "assumptions": list(report.assumptions),
    }
    if report.grid is not None:
        g = report.grid
        doc["grid"] = {
            "contexts": list(g.contexts),
            "batches": list(g.sequences),
            "cells": [
                [
                    {
                        "context": x.context,
                        "batch": x.sequences,
                        "verdict": x.verdict.value,
                        "chip": x.chip,
                        "static_bytes": x.static_bytes,
                        "usable_bytes": x.usable_bytes,
                    }
                    for x in row
                ]
                for row in g.cells
            ],
        }
    return doc
