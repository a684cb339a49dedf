"""Every scheduler default in one place (issue 48 item 2): the config dataclasses. The loader, the JSON schema's
``default`` keywords, the core's own defaults and docs/serving-core.md's table all agree with them."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calctl.serving import config as cfg
from calctl.serving.core.decode import DecodeScheduler
from calctl.serving.core.prefill import PrefillThresholds, ServiceWeights
from calctl.serving.core.settings import DecodeOptions, LongPrefillQuota

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


# -- every default is in the table above, the core's mirrors agree, and the prose says the same ---------------

#: Fields whose default is "absent" (None, no entries) or that are not scheduler values (where the document sat).
_NO_VALUE = {("SchedulerConfig", "source"), ("SchedulerConfig", "pointer")}
_CONFIG_CLASSES = (
    cfg.AdmissionConfig,
    cfg.QueuesConfig,
    cfg.BatchConfig,
    cfg.DowngradePolicy,
    cfg.ExecutorConfig,
    cfg.TenantConfig,
    cfg.SchedulerConfig,
)


def test_every_default_of_the_config_dataclasses_is_in_the_table() -> None:
    """A new optional field with a value default is added to the schema, the docs table and DEFAULTS above."""
    listed = {(cls.__name__, name) for cls, name, _ in DEFAULTS.values()}
    unlisted = []
    for cls in _CONFIG_CLASSES:
        for f in dataclasses.fields(cls):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                continue  # required
            value = cfg.default_of(cls, f.name)
            if value is None or value == {} or dataclasses.is_dataclass(value) or (cls.__name__, f.name) in _NO_VALUE:
                continue  # absent means "no limit" / "the core's rule", or a nested block checked on its own
            if (cls.__name__, f.name) not in listed:
                unlisted.append(f"{cls.__name__}.{f.name} = {value!r}")
    assert unlisted == []


def test_the_cores_own_defaults_are_the_configs() -> None:
    """The core's settings carry defaults for callers that build them without a YAML file; they are the config's."""
    assert LongPrefillQuota().max_running == cfg.default_of(cfg.QueuesConfig, "long_prefill_max_running")
    assert LongPrefillQuota().max_waiting == cfg.default_of(cfg.QueuesConfig, "long_prefill_max_waiting")
    decode = DecodeOptions()
    assert decode.deadline_granularity_s * 1000 == cfg.default_of(cfg.BatchConfig, "deadline_granularity_ms")
    assert decode.step_estimate_s * 1e6 == cfg.default_of(cfg.BatchConfig, "step_estimate_floor_us")


#: Prose defaults of fields the YAML requires: the core's own (000 §15's example values).
_CORE_PROSE = {
    "short_prefill_max_tokens": PrefillThresholds().short_max_tokens,
    "medium_prefill_max_tokens": PrefillThresholds().medium_max_tokens,
}


def _prose_defaults() -> list[tuple[str, str]]:
    """(field, value) for every "default N" in docs/serving-core.md outside the table: the field is the nearest
    backticked name before it in the same paragraph or bullet."""
    out = []
    for block in re.split(r"\n\s*\n|\n\* ", DOC):
        for m in re.finditer(r"\b[Dd]efault:? ([0-9]+(?:\.[0-9]+)?|[a-z]+)", block):
            names = re.findall(r"`([^`]+)`", block[: m.start()])
            if names:
                out.append((names[-1], m.group(1)))
    return out


def test_the_docs_prose_gives_the_codes_defaults() -> None:
    leaves = {path.rsplit(".", 1)[-1]: path for path in DEFAULTS}
    checked, wrong = [], []
    for name, shown in _prose_defaults():
        leaf = next((lf for lf in [*leaves, *_CORE_PROSE] if re.search(rf"\b{lf}\b", name)), None)
        if leaf is None:
            continue
        value = _code_default(leaves[leaf]) if leaf in leaves else _CORE_PROSE[leaf]
        checked.append(leaf)
        if shown not in (str(value), f"{value:g}" if isinstance(value, float) else str(value)):
            wrong.append(f"{name}: docs say {shown}, code {value!r}")
    assert wrong == []
    assert {"max_tenant_lane_share", "step_estimate_floor_us", "long_prefill_max_running"} <= set(checked), checked
    weights = ServiceWeights()
    ratio = f"{weights.decode}:{weights.short}:{weights.medium}:{weights.long}"
    assert f"`decode:short:medium:long = {ratio}` by default" in DOC
