"""Per-chip plans from packages and configs, exact searches, the grid, the serving-core API."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from calctl.budget import capacity
from calctl.budget.builders import plan_from_config, plan_from_package
from calctl.budget.evaluation import report_document, run_budget
from calctl.budget.plan import (
    COMPONENTS,
    Bound,
    Source,
    evaluate,
    max_context_on_chip,
    max_sequences_on_chip,
    passes,
)
from calctl.budget.policy import BudgetPolicy, BudgetVerdict
from calctl.budget.shape import ModelShape, load_hf_config
from calctl.errors import UsageError
from calctl.package.model import ChipMode, Package

MIB = 1024**2
POLICY = BudgetPolicy()


@pytest.mark.parametrize("kind", ["single", "combined", "replica"])
def test_every_fixture_package_is_go_on_its_own_chip_dram(packages: dict[str, Package], kind: str) -> None:
    pkg = packages[kind]
    report = run_budget(plan_from_package(pkg), POLICY)
    assert report.verdict is BudgetVerdict.GO
    for chip in report.chips:
        b = chip.budget
        assert b.dram_bytes == pkg.device_cfg.chip_dram_bytes
        assert [c.name for c in b.components] == list(COMPONENTS)
        assert b.verdict is BudgetVerdict.GO and b.static_bytes <= b.usable_bytes


def test_package_components_come_from_the_manifest(packages: dict[str, Package]) -> None:
    pkg = packages["combined"]
    chip0, chip1 = (evaluate(load, POLICY) for load in plan_from_package(pkg).loads)
    # Each chip is budgeted with its own model only (001 §8.2: A and B separately).
    assert (chip0.models, chip1.models) == (("model-a",), ("model-b",))
    region = {(r.chip, r.name): r.size for r in pkg.memory_plan}
    assert chip0.component("W_compiled").bytes == region[(0, "model-a.params")]
    assert chip1.component("W_compiled").bytes == region[(1, "model-b.params")]
    assert chip0.component("code_and_commands").bytes == region[(0, "model-a.code")] + region[(0, "model-a.command")]
    sources = {c.name: c.source for c in chip0.components}
    assert sources == {
        "W_compiled": Source.MANIFEST,
        "KV": Source.FORMULA,
        "workspace_peak": Source.MANIFEST,
        "code_and_commands": Source.MANIFEST,
        "io_staging": Source.MANIFEST,
        "runtime_metadata": Source.MANIFEST,
        "allocator_fragmentation": Source.ESTIMATE,
        "safety_guard": Source.POLICY,
    }
    # At the declared point (context_limit x kv.max_sequences) the formula equals the compiled KV region.
    assert chip0.component("KV").bytes == pkg.model("model-a").kv.bytes == region[(0, "model-a.kv")]
    # The prefill peak decides the workspace (001 §8.2), not the decode steady state.
    assert chip0.component("workspace_peak").bytes == pkg.model("model-a").workspace.prefill_peak_bytes
    assert chip0.notes == ()


def test_a_config_says_what_it_estimated(hf_shape: Callable[[str], ModelShape]) -> None:
    report = run_budget(plan_from_config(hf_shape("Llama-3.2-1B"), chips=2), POLICY, context=4096)
    doc = report_document(report)
    assert doc["chips"][0]["sources"]["W_compiled"] == "estimate"
    assert doc["chips"][0]["sources"]["KV"] == "formula"
    assert "estimate" in doc["chips"][0]["details"]["W_compiled"]
    assert any("16 GiB" in a and "--chip-dram" in a for a in doc["assumptions"])
    assert any("KV heads ceil(8/2) = 4 per chip" in a for a in doc["assumptions"])
    assert doc["models"][0]["kv_heads_per_chip"] == 4
    assert len(doc["chips"]) == 2


def test_max_context_is_exact_and_ends_on_a_block(hf_shape: Callable[[str], ModelShape]) -> None:
    plan = plan_from_config(hf_shape("Llama-3.2-3B"), block_tokens=16)
    load = plan.loads[0]
    result = max_context_on_chip(load, POLICY, sequences=1)
    assert result.bound is Bound.MEMORY  # 131072 tokens do not fit on 16 GiB
    m = result.value
    assert 0 < m < 131072
    assert passes(load, POLICY, context=m, sequences=1)
    assert not passes(load, POLICY, context=m + 1, sequences=1)
    assert m % 16 == 0  # one token more opens a new block


def test_max_sequences_is_exact(hf_shape: Callable[[str], ModelShape]) -> None:
    load = plan_from_config(hf_shape("Qwen2.5-1.5B-Instruct")).loads[0]
    result = max_sequences_on_chip(load, POLICY, context=32768)
    s = result.value
    assert s >= 1 and result.bound is Bound.MEMORY
    assert passes(load, POLICY, context=32768, sequences=s)
    assert not passes(load, POLICY, context=32768, sequences=s + 1)


def test_searches_stop_at_the_model_limit_and_at_zero(hf_shape: Callable[[str], ModelShape]) -> None:
    small = plan_from_config(hf_shape("SmolLM2-1.7B")).loads[0]
    assert max_context_on_chip(small, POLICY, sequences=1).value == 8192
    assert max_context_on_chip(small, POLICY, sequences=1).bound is Bound.MODEL_LIMIT
    big = plan_from_config(hf_shape("Qwen3-30B-A3B")).loads[0]  # 57 GiB of bf16 weights on one 16 GiB chip
    assert max_context_on_chip(big, POLICY, sequences=1).value == 0
    assert max_sequences_on_chip(big, POLICY, context=4096).value == 0


def test_package_search_with_tight_dram_is_memory_bound(packages: dict[str, Package]) -> None:
    policy = BudgetPolicy(guard_min_bytes=0)
    # 150 MiB chip: usable 120 MiB; model-a's fixed terms take ~116 MiB, KV gets the rest.
    load = plan_from_package(packages["single"], chip_dram_bytes=150 * MIB).loads[0]
    seqs = max_sequences_on_chip(load, policy, context=256)
    assert seqs.bound is Bound.MEMORY and 0 < seqs.value < 100
    assert passes(load, policy, context=256, sequences=seqs.value)
    assert not passes(load, policy, context=256, sequences=seqs.value + 1)
    ctx = max_context_on_chip(load, policy, sequences=seqs.value + 1)
    assert ctx.bound is Bound.MEMORY and ctx.value % 16 == 0  # kv.block_tokens = 16


def test_model_split_over_two_chips_halves_its_kv_heads(packages: dict[str, Package]) -> None:
    pkg = packages["single"]
    model = replace(pkg.model("model-a"), chip_mode=ChipMode.MCHIP, target_chips=(0, 1))
    split = replace(pkg, models=(model,), memory_plan=())
    loads = plan_from_package(split).loads
    assert [load.chip for load in loads] == [0, 1]
    kv = [evaluate(load, POLICY).component("KV").bytes for load in loads]
    assert kv == [pkg.model("model-a").kv.bytes // 2] * 2  # 2 KV heads, one per chip
    assert any("split over 2 chips" in n for n in loads[0].notes)


def test_grid_cells_agree_with_single_evaluations(hf_shape: Callable[[str], ModelShape]) -> None:
    plan = plan_from_config(hf_shape("Llama-3.2-1B"))
    report = run_budget(plan, POLICY, context=8192, grid=True)
    grid = report.grid
    assert grid is not None
    assert grid.contexts == (4096, 8192, 16384, 32768, 65536, 131072)
    assert grid.sequences == (1, 2, 4, 8, 16)
    verdicts = {cell.verdict for row in grid.cells for cell in row}
    assert verdicts == {BudgetVerdict.GO, BudgetVerdict.NO_GO}  # the grid shows the edge
    for row in grid.cells:
        for cell in row:
            b = evaluate(plan.loads[0], POLICY, context=cell.context, sequences=cell.sequences)
            assert (cell.verdict, cell.static_bytes) == (b.verdict, b.static_bytes)


def test_config_without_context_limit_needs_a_context(
    hf_config_doc: Callable[[str], dict[str, Any]], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    doc = hf_config_doc("Llama-3.2-1B")
    del doc["max_position_embeddings"]
    plan = plan_from_config(load_hf_config(write_config(doc)))
    with pytest.raises(UsageError, match="no context"):
        run_budget(plan, POLICY)
    assert run_budget(plan, POLICY, context=4096).verdict is BudgetVerdict.GO


# ---------------------------------------------------------------------------
# The serving core's view (000 §5.1 CapacityBudget)


def test_max_kv_tokens_is_capped_by_the_compiled_region(packages: dict[str, Package]) -> None:
    pkg = packages["combined"]
    a = pkg.model("model-a")
    # kv.bytes 2,097,152 at 512 bytes/token (2 x 2 layers x 2 heads x 16 x 4 B) = 4096 tokens
    assert capacity.max_kv_tokens(a, pkg.device_cfg.chip_dram_bytes) == 4096
    assert capacity.max_kv_tokens(a, pkg.device_cfg.chip_dram_bytes, package=pkg) == 4096
    assert capacity.max_sequences(a, pkg.device_cfg.chip_dram_bytes) == a.kv.max_sequences == 16


def test_max_kv_tokens_follows_the_budget_when_memory_binds(packages: dict[str, Package]) -> None:
    pkg = packages["combined"]
    a = pkg.model("model-a")
    policy = BudgetPolicy(guard_min_bytes=0)
    dram = 146 * MIB  # usable 116.8 MiB: ~1.3 MiB of KV after the fixed terms and fragmentation
    tokens = capacity.max_kv_tokens(a, dram, policy, package=pkg)
    assert 0 < tokens < 4096 and tokens % a.kv.block_tokens == 0
    load = plan_from_package(pkg, chip_dram_bytes=dram).loads[0]
    per_token = 512
    fits = evaluate(load, policy, kv_override={"model-a": tokens * per_token})
    next_block = evaluate(load, policy, kv_override={"model-a": (tokens + a.kv.block_tokens) * per_token})
    assert (fits.verdict, next_block.verdict) == (BudgetVerdict.GO, BudgetVerdict.NO_GO)

    seqs = capacity.max_sequences(a, dram, policy, package=pkg, context=256)
    assert seqs == tokens // 256  # each 256-token sequence is 16 whole blocks
