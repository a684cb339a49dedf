"""Every scheduler default in one place (issue 48 item 2): the config dataclasses. The loader, the JSON schema's
``default`` keywords, the core's own defaults and docs/serving-core.md's table all agree with them."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calctl.serving import config as cfg
from calctl.serving.core.decode import DecodeScheduler
from calctl.serving.core.settings import DecodeOptions

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / "calctl" / "schemas" / "calculet-scheduler-v1.json").read_text(encoding="utf-8"))
DOC = (ROOT / "docs" / "serving-core.md").read_text(encoding="utf-8")


def _same(v: Any) -> Any:
    return v


#: schema path -> (config dataclass, its field, the field's value as the YAML/schema writes it)
DEFAULTS: dict[str, tuple[type, str, Callable[[Any], Any]]] = {
    "admission.decode_cost_weight": (cfg.AdmissionConfig, "decode_cost_weight", _same),
    "queues.long_prefill_max_running": (cfg.QueuesConfig, "long_prefill_max_running", _same),
    "batch.max_tenant_lane_share": (cfg.BatchConfig, "max_tenant_lane_share", _same),
    "batch.deadline_granularity_ms": (cfg.BatchConfig, "deadline_granularity_ms", _same),
    "batch.step_estimate_floor_us": (cfg.BatchConfig, "step_estimate_floor_us", _same),
    "executor.downgrade.to": (cfg.DowngradePolicy, "to", lambda m: m.value),
    "executor.downgrade.p99_regression": (cfg.DowngradePolicy, "p99_regression", _same),
    "executor.downgrade.p99_window": (cfg.DowngradePolicy, "p99_window", _same),
    "executor.downgrade.p99_min_samples": (cfg.DowngradePolicy, "p99_min_samples", _same),
    "executor.downgrade.consecutive_busy": (cfg.DowngradePolicy, "consecutive_busy", _same),
    "executor.downgrade.consecutive_timeouts": (cfg.DowngradePolicy, "consecutive_timeouts", _same),
    "executor.downgrade.pending_grace_ms": (cfg.DowngradePolicy, "pending_grace_s", lambda s: round(s * 1000)),
}


def _schema_defaults(node: dict[str, Any], path: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, sub in (node.get("properties") or {}).items():
        here = f"{path}.{key}" if path else key
        if isinstance(sub, dict):
            if "default" in sub:
                out[here] = sub["default"]
            out.update(_schema_defaults(sub, here))
    return out


def _code_default(path: str) -> Any:
    cls, name, to_yaml = DEFAULTS[path]
    return to_yaml(cfg.default_of(cls, name))


@pytest.mark.parametrize("path", sorted(DEFAULTS))
def test_the_schema_default_is_the_codes(path: str) -> None:
    assert _schema_defaults(SCHEMA).get(path) == _code_default(path), path


def test_every_schema_default_is_in_the_table() -> None:
    assert set(_schema_defaults(SCHEMA)) == set(DEFAULTS)


@pytest.mark.parametrize("path", sorted(DEFAULTS))
def test_the_docs_table_gives_the_codes_default(path: str) -> None:
    value = _code_default(path)
    shown = f"{value:.1f}" if isinstance(value, float) and value == int(value) else str(value)
    assert f"| `{path}` | `{shown}` |" in DOC, path


def test_the_core_takes_the_same_tenant_share() -> None:
    share = cfg.default_of(cfg.BatchConfig, "max_tenant_lane_share")
    assert cfg.default_of(DecodeOptions, "max_tenant_lane_share") == share
    assert inspect.signature(DecodeScheduler).parameters["max_tenant_lane_share"].default == share


def test_default_of_names_what_it_cannot_find() -> None:
    with pytest.raises(KeyError, match="has no default"):
        cfg.default_of(cfg.AdmissionConfig, "max_waiting_requests")
    with pytest.raises(KeyError, match="no field 'nope'"):
        cfg.default_of(cfg.AdmissionConfig, "nope")
