"""Scheduler / dual-model configuration: schema, field-path errors, manifest cross-check (000 §15, 001 §10.4)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from calctl.errors import ConfigError
from calctl.package.model import InactiveLanePolicy, Package
from calctl.package.reader import load_manifest
from calctl.serving.config import (
    ConfigFieldError,
    cross_check_dual_model,
    cross_check_scheduler,
    load_dual_model_config,
    load_scheduler_config,
    scheduler_settings,
)
from calctl.serving.core import ModelGenerationId, ProfileRefused, Scheduler, TenantId

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "packages"

SCHEDULER_000_S15 = """\
schema: calculet-scheduler/v1
model_alias: model-a
admission:
  max_waiting_requests: 128
  max_waiting_prompt_tokens: 262144
  deadline_default_ms: 120000
queues:
  decode_weight: 8
  short_prefill_weight: 4
  medium_prefill_weight: 2
  long_prefill_weight: 1
  short_prefill_max_tokens: 512
  medium_prefill_max_tokens: 4096
batch:
  profiles: [1]
  batching_window_us: 0
executor:
  max_inflight: 1
  fixed_engine: false
recovery:
  max_resets_per_10min: 2
  restart_on_unknown_dma: true
"""

DUAL_001_S104 = """\
schema: calculet-dual-model/v1
device:
  type: pcie
  expected_chips: 2
  combined_calbin: /models/dual-a-b
models:
  - alias: model-a
    chip_id: 0
    prefill_graph: model_a_prefill
    decode_graph: model_a_decode
    context_limit: 256
    max_inflight: 1
    max_waiting_requests: 64
  - alias: model-b
    chip_id: 1
    prefill_graph: model_b_prefill
    decode_graph: model_b_decode
    context_limit: 256
    max_inflight: 1
    max_waiting_requests: 64
recovery:
  allow_session_reset: false
  restart_process_on_unknown_dma: true
"""


@pytest.fixture(scope="module")
def combined() -> Package:
    return load_manifest(FIXTURES / "combined")


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _edit(text: str, fn) -> str:
    doc = yaml.safe_load(text)
    fn(doc)
    return yaml.safe_dump(doc, sort_keys=False)


def test_000_s15_example_loads_and_builds_a_scheduler(tmp_path: Path, combined: Package) -> None:
    """000 §15: the report's example is a valid configuration; it cross-checks and drives the core."""
    cfg = load_scheduler_config(_write(tmp_path, "sched.yaml", SCHEDULER_000_S15))
    assert cfg.batch.profiles == (1,) and cfg.queues.decode_weight == 8 and cfg.admission.deadline_default_ms == 120000
    cross_check_scheduler(cfg, combined)
    model = combined.model("model-a")
    settings = scheduler_settings(cfg, model, max_sequences=model.kv.max_sequences, max_kv_tokens=4096)
    assert settings.admission.context_limit == 256 and settings.prefill_graph == "model_a_prefill"
    assert [p.graph for p in settings.profiles] == ["model_a_decode"]
    Scheduler(settings, generation=ModelGenerationId(1))


def test_001_s104_example_loads_and_cross_checks(tmp_path: Path, combined: Package) -> None:
    """001 §10.4: the report's dual-model example (with the fixture's graph names and context) is valid."""
    cfg = load_dual_model_config(_write(tmp_path, "dual.yaml", DUAL_001_S104))
    assert [(m.alias, m.chip_id) for m in cfg.models] == [("model-a", 0), ("model-b", 1)]
    cross_check_dual_model(cfg, combined)
    assert cfg.model("model-b").effective_scheduler().executor.max_inflight == 1


def test_api_max_body_mb_is_read_in_bytes(tmp_path: Path) -> None:
    assert load_dual_model_config(_write(tmp_path, "dual.yaml", DUAL_001_S104)).max_body_bytes is None
    text = _edit(DUAL_001_S104, lambda d: d.__setitem__("api", {"max_body_mb": 0.5}))
    assert load_dual_model_config(_write(tmp_path, "dual.yaml", text)).max_body_bytes == 512 * 1024


def test_tenants_map_and_extensions(tmp_path: Path) -> None:
    """000 §5.3: tenant weights and quotas come from configuration; 'default' covers unlisted tenants."""
    text = (
        SCHEDULER_000_S15 + "tenants:\n  gold: {weight: 3, max_active_sequences: 4, qps: 10}\n  default: {weight: 1}\n"
    )
    cfg = load_scheduler_config(_write(tmp_path, "s.yaml", text))
    assert cfg.tenants["gold"].weight == 3 and cfg.tenants["gold"].qps == 10
    pkg = load_manifest(FIXTURES / "single")
    settings = scheduler_settings(cfg, pkg.model("model-a"), max_sequences=4, max_kv_tokens=1024)
    assert settings.admission.tenant(TenantId("gold")).max_active_sequences == 4
    assert settings.admission.tenant(TenantId("anyone")).weight == 1


@pytest.mark.parametrize(
    ("mutate", "field", "fragment"),
    [
        (lambda d: d.__setitem__("schema", "calculet-scheduler/v2"), "/schema", "calculet-scheduler/v1"),
        (
            lambda d: d["admission"].pop("deadline_default_ms"),
            "/admission/deadline_default_ms",
            "required field is missing",
        ),
        (
            lambda d: d["admission"].__setitem__("max_waiting_requests", 0),
            "/admission/max_waiting_requests",
            "less than the minimum",
        ),
        (lambda d: d["queues"].__setitem__("decode_weight", "8"), "/queues/decode_weight", "not of type 'integer'"),
        (
            lambda d: d["queues"].__setitem__("short_prefill_max_tokens", 5000),
            "/queues/short_prefill_max_tokens",
            "must be below",
        ),
        (lambda d: d["batch"].__setitem__("profiles", []), "/batch/profiles", "should be non-empty"),
        (lambda d: d["batch"].__setitem__("profiles", [1, 1]), "/batch/profiles", "non-unique"),
        (lambda d: d["batch"].__setitem__("batching_window_us", -1), "/batch/batching_window_us", "minimum"),
        (lambda d: d["batch"].__setitem__("chunked_prefill", True), "/batch/chunked_prefill", "unknown field"),
        (
            lambda d: d["batch"].__setitem__("profile_thresholds", {"8": 6}),
            "/batch/profile_thresholds/8",
            "not in batch.profiles",
        ),
        (lambda d: d["executor"].__setitem__("max_inflight", 3), "/executor/max_inflight", "maximum"),
        (
            lambda d: d["recovery"].__setitem__("restart_on_unknown_dma", "yes"),
            "/recovery/restart_on_unknown_dma",
            "boolean",
        ),
        (
            lambda d: d.__setitem__("tenants", {"t": {"weight": 0}}),
            "/tenants/t/weight",
            "less than or equal to the minimum",
        ),
        (lambda d: d.__setitem__("tenants", {"t": {"qps": 1}}), "/tenants/t/weight", "required field is missing"),
        (lambda d: d.__setitem__("model_alias", "bad alias!"), "/model_alias", "does not match"),
    ],
)
def test_each_bad_scheduler_field_is_named(tmp_path: Path, mutate, field: str, fragment: str) -> None:
    """000 §15: a bad field fails with a ConfigError naming the file and the field path."""
    path = _write(tmp_path, "sched.yaml", _edit(SCHEDULER_000_S15, mutate))
    with pytest.raises(ConfigError) as info:
        load_scheduler_config(path)
    err = info.value
    assert isinstance(err, ConfigFieldError), str(err)
    assert field in err.fields, (err.fields, str(err))
    line = next(ln for ln in str(err).splitlines() if f": {field}: " in ln)
    assert line.startswith(f"{path}: {field}: ") and fragment in line, line


@pytest.mark.parametrize(
    ("mutate", "field", "fragment"),
    [
        (lambda d: d["device"].__setitem__("type", "usb"), "/device/type", "is not one of"),
        (lambda d: d["models"][1].__setitem__("chip_id", 2), "/models/1/chip_id", "outside the 2 expected chips"),
        (lambda d: d["models"][1].__setitem__("chip_id", -1), "/models/1/chip_id", "minimum"),
        (lambda d: d["models"][1].__setitem__("chip_id", 0), "/models/1/chip_id", "already used by /models/0"),
        (lambda d: d["models"][1].__setitem__("alias", "model-a"), "/models/1/alias", "already used"),
        (lambda d: d["models"][0].pop("decode_graph"), "/models/0/decode_graph", "required field is missing"),
        (lambda d: d["models"][0].__setitem__("max_inflight", 0), "/models/0/max_inflight", "minimum"),
        (lambda d: d["recovery"].pop("allow_session_reset"), "/recovery/allow_session_reset", "required"),
        (lambda d: d.__setitem__("api", {"max_body_mb": 0}), "/api/max_body_mb", "minimum"),
        (lambda d: d.__setitem__("api", {"max_body_mb": "4M"}), "/api/max_body_mb", "number"),
        (lambda d: d.__setitem__("api", {"max_body_mb": 1e9}), "/api/max_body_mb", "maximum"),
        (
            lambda d: d["models"][0].__setitem__("scheduler", {"batch": {"profiles": [1]}}),
            "/models/0/scheduler/admission",
            "required",
        ),
        (
            lambda d: d["models"][0].__setitem__(
                "scheduler", {**yaml.safe_load(SCHEDULER_000_S15), "model_alias": "model-a"}
            ),
            "/models/0/scheduler/admission/max_waiting_requests",
            "disagrees with /models/0/max_waiting_requests 64",
        ),
    ],
)
def test_each_bad_dual_field_is_named(tmp_path: Path, mutate, field: str, fragment: str) -> None:
    """001 §10.4: a bad field fails with a ConfigError naming the file and the field path."""
    path = _write(tmp_path, "dual.yaml", _edit(DUAL_001_S104, mutate))
    with pytest.raises(ConfigFieldError) as info:
        load_dual_model_config(path)
    assert field in info.value.fields, (info.value.fields, str(info.value))
    line = next(ln for ln in str(info.value).splitlines() if f": {field}: " in ln)
    assert fragment in line, line


def test_yaml_problems_are_config_errors(tmp_path: Path) -> None:
    """Malformed YAML, duplicate keys and missing files are ConfigErrors naming the file (no traceback)."""
    with pytest.raises(ConfigError, match=r"dup\.yaml"):
        load_scheduler_config(_write(tmp_path, "dup.yaml", SCHEDULER_000_S15 + "model_alias: again\n"))
    with pytest.raises(ConfigError, match=r"bad\.yaml"):
        load_scheduler_config(_write(tmp_path, "bad.yaml", "schema: [unclosed\n"))
    with pytest.raises(ConfigError, match=r"missing\.yaml"):
        load_scheduler_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigFieldError, match=r"list\.yaml: /: "):
        load_scheduler_config(_write(tmp_path, "list.yaml", "- 1\n"))


def test_cross_check_b8_that_the_package_lacks(tmp_path: Path, combined: Package) -> None:
    """000 §15: 'a B8 in the configuration that the calbin does not have fails at start-up'."""
    text = _edit(SCHEDULER_000_S15, lambda d: d["batch"].__setitem__("profiles", [1, 8]))
    cfg = load_scheduler_config(_write(tmp_path, "sched.yaml", text))
    with pytest.raises(ConfigFieldError) as info:
        cross_check_scheduler(cfg, combined)
    assert str(info.value) == (
        f"{tmp_path / 'sched.yaml'}: /batch/profiles/1: profile B8 is not compiled in decode graph "
        "'model_a_decode' (it has B1)"
    )


def test_cross_check_unknown_alias(tmp_path: Path, combined: Package) -> None:
    cfg = load_scheduler_config(_write(tmp_path, "s.yaml", SCHEDULER_000_S15.replace("model-a", "model-A")))
    with pytest.raises(ConfigFieldError, match=r"/model_alias: 'model-A' is not a model of the package"):
        cross_check_scheduler(cfg, combined)  # exact match only, no case folding (001 §10.4)


def _with_decode(pkg: Package, profiles: tuple[int, ...], policy: InactiveLanePolicy | None) -> Package:
    model = pkg.models[0]
    graphs = tuple(
        dataclasses.replace(g, batch_profiles=profiles, inactive_lane_policy=policy) if g.kind.value == "decode" else g
        for g in model.graphs
    )
    return dataclasses.replace(pkg, models=(dataclasses.replace(model, graphs=graphs), *pkg.models[1:]))


def test_cross_check_b4_needs_an_inactive_lane_contract(tmp_path: Path, combined: Package) -> None:
    """000 §7.3: a compiled B4 without a mask contract is refused; with one it builds B4 profiles."""
    text = _edit(SCHEDULER_000_S15, lambda d: d["batch"].__setitem__("profiles", [1, 4]))
    cfg = load_scheduler_config(_write(tmp_path, "s.yaml", text))
    with pytest.raises(
        ConfigFieldError, match=r"/batch/profiles/1: profile B4 of graph 'model_a_decode' has no inactive-lane contract"
    ):
        cross_check_scheduler(cfg, _with_decode(combined, (1, 4), None))
    pkg = _with_decode(combined, (1, 4), InactiveLanePolicy("lane_valid", writes_kv=False, returns_logits=True))
    cross_check_scheduler(cfg, pkg)
    settings = scheduler_settings(cfg, pkg.models[0], max_sequences=16, max_kv_tokens=4096)
    b4 = settings.profiles[1]
    assert (
        b4.compiled_batch == 4 and b4.inactive_lanes is not None and b4.inactive_lanes.valid_mask_input == "lane_valid"
    )
    Scheduler(settings, generation=ModelGenerationId(1))
    with pytest.raises(ProfileRefused):  # the core refuses it on its own too
        Scheduler(
            dataclasses.replace(settings, profiles=(dataclasses.replace(b4, inactive_lanes=None),)),
            generation=ModelGenerationId(1),
        )


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["models"][1].__setitem__("chip_id", 2) or d["device"].__setitem__("expected_chips", 3),
            "/models/1/chip_id: 2 is not one of the package's chips [0, 1]",
        ),
        (
            lambda d: d["models"][0].__setitem__("chip_id", 1) or d["models"][1].__setitem__("chip_id", 0),
            "/models/0/chip_id: model 'model-a' targets chips [0], not 1",
        ),
        (
            lambda d: d["models"][0].__setitem__("prefill_graph", "model_a_prefil"),
            "/models/0/prefill_graph: no graph named 'model_a_prefil'",
        ),
        (
            lambda d: d["models"][0].__setitem__("decode_graph", "model_b_decode"),
            "/models/0/decode_graph: graph 'model_b_decode' is the decode "
            "graph of model 'model-b', not a decode graph of 'model-a'",
        ),
        (
            lambda d: d["models"][0].__setitem__("decode_graph", "model_a_prefill"),
            "/models/0/decode_graph: graph 'model_a_prefill' is the prefill graph of model 'model-a'",
        ),
        (
            lambda d: d["models"][1].__setitem__("context_limit", 4096),
            "/models/1/context_limit: 4096 exceeds model 'model-b' context limit 256",
        ),
        (
            lambda d: d["models"][1].__setitem__("alias", "model-c"),
            "/models/1/alias: 'model-c' is not a model of the package",
        ),
        (lambda d: d["models"].pop(1), "/models: package model 'model-b' has no entry"),
        (
            lambda d: d["device"].__setitem__("expected_chips", 4),
            "/device/expected_chips: 4 does not match the package's chip_nums 2",
        ),
        (
            lambda d: d["models"][0].__setitem__(
                "scheduler",
                {
                    **yaml.safe_load(SCHEDULER_000_S15),
                    "batch": {"profiles": [8], "batching_window_us": 0},
                    "admission": {
                        "max_waiting_requests": 64,
                        "max_waiting_prompt_tokens": 1000,
                        "deadline_default_ms": 1000,
                    },
                },
            ),
            "/models/0/scheduler/batch/profiles/0: profile B8 is not compiled",
        ),
    ],
)
def test_dual_cross_check_names_the_field(tmp_path: Path, combined: Package, mutate, message: str) -> None:
    """001 §10.4: chip, graph, context or profile mismatches fail at start-up, naming the field."""
    path = _write(tmp_path, "dual.yaml", _edit(DUAL_001_S104, mutate))
    cfg = load_dual_model_config(path)
    with pytest.raises(ConfigFieldError) as info:
        cross_check_dual_model(cfg, combined)
    assert any(line.startswith(f"{path}: {message}") for line in str(info.value).splitlines()), str(info.value)


def test_step_estimate_floor_is_settable_from_yaml(tmp_path: Path, combined: Package) -> None:
    """000 §7.2 rule 4 (issue 19): the floor under the measured step time comes from the YAML; out of
    range it is refused with its field path."""
    text = _edit(SCHEDULER_000_S15, lambda d: d["batch"].update(step_estimate_floor_us=2500))
    cfg = load_scheduler_config(_write(tmp_path, "s.yaml", text))
    model = combined.model("model-a")
    settings = scheduler_settings(cfg, model, max_sequences=4, max_kv_tokens=1024)
    assert settings.decode.step_estimate_s == pytest.approx(0.0025)
    assert Scheduler(settings, generation=ModelGenerationId(1)).decode.step_estimate == pytest.approx(0.0025)
    bad = _edit(SCHEDULER_000_S15, lambda d: d["batch"].update(step_estimate_floor_us=-1))
    with pytest.raises(ConfigFieldError, match="/batch/step_estimate_floor_us"):
        load_scheduler_config(_write(tmp_path, "bad.yaml", bad))


def test_long_prefill_quota_from_yaml(tmp_path: Path, combined: Package) -> None:
    """000 §6, 001 §9.3 (issue 19): the long-prefill quota is configured under ``queues``; the default
    caps running long prefills at 1 and leaves waiting ones to the admission budgets."""
    model = combined.model("model-a")
    plain = scheduler_settings(
        load_scheduler_config(_write(tmp_path, "p.yaml", SCHEDULER_000_S15)), model, max_sequences=4, max_kv_tokens=64
    )
    assert (plain.long_prefill.max_waiting, plain.long_prefill.max_running) == (None, 1)
    text = _edit(
        SCHEDULER_000_S15, lambda d: d["queues"].update(long_prefill_max_waiting=3, long_prefill_max_running=2)
    )
    settings = scheduler_settings(
        load_scheduler_config(_write(tmp_path, "s.yaml", text)), model, max_sequences=4, max_kv_tokens=64
    )
    assert (settings.long_prefill.max_waiting, settings.long_prefill.max_running) == (3, 2)
    bad = _edit(SCHEDULER_000_S15, lambda d: d["queues"].update(long_prefill_max_waiting=0))
    with pytest.raises(ConfigFieldError, match="/queues/long_prefill_max_waiting"):
        load_scheduler_config(_write(tmp_path, "bad.yaml", bad))
