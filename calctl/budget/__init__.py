"""Per-chip capacity budget and GO/NO-GO (001 §8, decision gate G0 of §17).

A pure library the CLI (``calctl budget``), the bring-up pipeline and the serving
core all call:

* ``shape``: architecture numbers from a Hugging Face ``config.json`` or a manifest;
* ``kv`` and ``weights``: the §8.1 KV formula and a parameter-count estimate;
* ``policy``: the §8.2 limit and guard, and the verdict;
* ``plan``: per-chip loads, their evaluation and exact searches;
* ``builders``: those loads from a package or a Hugging Face config;
* ``evaluation``: a whole run (verdicts, searches, what-if grid) and its JSON document;
* ``capacity``: ``max_kv_tokens`` / ``max_sequences`` for admission (000 §5.1).

Nothing here prints, reads a package from disk, or talks to a device.
"""

from __future__ import annotations

from calctl.budget.builders import plan_from_config, plan_from_package
from calctl.budget.capacity import max_kv_tokens, max_sequences
from calctl.budget.evaluation import BudgetReport, report_document, run_budget
from calctl.budget.kv import kv_bytes, kv_bytes_per_token, kv_heads_per_chip
from calctl.budget.plan import (
    COMPONENTS,
    DEFAULT_CHIP_DRAM_BYTES,
    BudgetPlan,
    ChipBudget,
    ChipLoad,
    Component,
    Estimates,
    ModelLoad,
    Source,
    WorkspaceOverride,
    evaluate,
)
from calctl.budget.policy import BudgetPolicy, BudgetVerdict
from calctl.budget.shape import ModelShape, load_hf_config, shape_from_hf_config, shape_from_package_model
from calctl.budget.units import parse_size
from calctl.budget.weights import ParamCount, count_params, weight_bytes

__all__ = [
    "COMPONENTS",
    "DEFAULT_CHIP_DRAM_BYTES",
    "BudgetPlan",
    "BudgetPolicy",
    "BudgetReport",
    "BudgetVerdict",
    "ChipBudget",
    "ChipLoad",
    "Component",
    "Estimates",
    "ModelLoad",
    "ModelShape",
    "ParamCount",
    "Source",
    "WorkspaceOverride",
    "count_params",
    "evaluate",
    "kv_bytes",
    "kv_bytes_per_token",
    "kv_heads_per_chip",
    "load_hf_config",
    "max_kv_tokens",
    "max_sequences",
    "parse_size",
    "plan_from_config",
    "plan_from_package",
    "report_document",
    "run_budget",
    "shape_from_hf_config",
    "shape_from_package_model",
    "weight_bytes",
]
