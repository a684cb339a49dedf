"""Scheduler and dual-model configuration: load, validate, cross-check (000 §15, 001 §10.4).

Two YAML documents, each with a JSON Schema in ``calctl/schemas/``:

* ``calculet-scheduler/v1`` (000 §15): one alias's admission budgets (its engine core),
  queue weights and thresholds, batch profiles, executor and recovery knobs,
  plus an optional ``tenants`` map (weights and quotas, 000 §5.3);
* ``calculet-dual-model/v1`` (001 §10.4): which alias runs on which chip with
  which exact prefill/decode graphs and context, optionally with a per-model
  ``scheduler`` block in the scheduler schema.

Loading is ``yaml.SafeLoader`` through :mod:`calctl.package.yamlsafe` (which
also refuses duplicate keys and anchors, so two readers can never disagree on
a file), then JSON Schema, then cross-field rules. :func:`cross_check_scheduler`
and :func:`cross_check_dual_model` then compare the configuration with the
signed package manifest: a profile the package does not compile (B8 when it
has B1), an unknown graph, a chip or context mismatch all fail at start-up
(000 §15, 001 §10.4). Every error is a :class:`ConfigFieldError` naming the
file and the field path (``dual.yaml: /models/1/chip_id: ...``) and lists all
problems, not just the first.

:func:`scheduler_settings` turns a checked configuration, the package model
and the capacity plan's numbers into the core's
:class:`~calctl.serving.core.scheduler.SchedulerSettings`.

This module does not compute the capacity plan (``calctl.budget`` does) and
never guesses: no defaults are taken from the package for fields the schema
requires, and no name is matched by prefix or case.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calctl.errors import ConfigError, PackageError
from calctl.package import yamlsafe
from calctl.package.model import Graph, GraphKind, Model, Package
from calctl.package.schemas import pointer as _pointer
from calctl.package.schemas import validator as _validator
from calctl.serving.core.admission import AdmissionPolicy, CapacityBudget, TenantPolicy
from calctl.serving.core.decode import DEFAULT_MAX_TENANT_LANE_SHARE, BatchProfile, InactiveLaneContract
from calctl.serving.core.ids import TenantId
from calctl.serving.core.prefill import PrefillThresholds, ServiceWeights
from calctl.serving.core.settings import DecodeOptions, LongPrefillQuota, SchedulerSettings

SCHEDULER_SCHEMA = "calculet-scheduler/v1"
DUAL_MODEL_SCHEMA = "calculet-dual-model/v1"
DEFAULT_TENANT = "default"

Problem = tuple[str, str]  # (field pointer, message)


class ConfigFieldError(ConfigError):
    """A configuration file is invalid; ``problems`` lists every (field pointer, message)."""

    def __init__(self, source: str, problems: Sequence[Problem], *, hint: str | None = None) -> None:
        lines = [f"{source}: {where}: {msg}" for where, msg in problems]
        super().__init__("\n".join(lines), hint=hint)
        self.source = source
        self.problems = tuple(problems)

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(where for where, _ in self.problems)


# -- values ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdmissionConfig:
    max_waiting_requests: int
    max_waiting_prompt_tokens: int
    deadline_default_ms: int
    decode_cost_weight: float = 1.0


@dataclass(frozen=True)
class QueuesConfig:
    decode_weight: int
    short_prefill_weight: int
    medium_prefill_weight: int
    long_prefill_weight: int
    short_prefill_max_tokens: int
    medium_prefill_max_tokens: int
    long_prefill_max_waiting: int | None = None  # 000 §6, 001 §9.3 long-prefill quota
    long_prefill_max_running: int = 1


@dataclass(frozen=True)
class BatchConfig:
    profiles: tuple[int, ...]
    batching_window_us: int
    profile_thresholds: Mapping[int, int] = field(default_factory=dict)
    max_tenant_lane_share: float = DEFAULT_MAX_TENANT_LANE_SHARE
    deadline_granularity_ms: float = 0.0
    step_estimate_floor_us: int = 0  # the floor under the measured decode step time (000 §7.2 rule 4)


class ExecutorMode(str, enum.Enum):
    """How an engine core drives its chip (000 §14, §19 M1/M2; docs/executor.md)."""

    SYNC = "sync"  # submit, then wait inline for that job: nothing overlaps (the baseline)
    ASYNC = "async"  # one job in flight, completions on their own thread
    PINGPONG = "pingpong"  # two jobs in flight on alternating ping/pong banks

    @property
    def max_inflight(self) -> int:
        return 2 if self is ExecutorMode.PINGPONG else 1


@dataclass(frozen=True)
class DowngradePolicy:
    """The ping/pong downgrade monitor's thresholds (000 §14). Defaults follow 000 §19 M2."""

    to: ExecutorMode = ExecutorMode.ASYNC
    p99_regression: float = 0.05
    p99_baseline_s: float | None = None  # None: measured while running with one job in flight
    p99_window: int = 200
    p99_min_samples: int = 50
    consecutive_busy: int = 3
    consecutive_timeouts: int = 1
    pending_grace_s: float = 2.0

    def __post_init__(self) -> None:
        if self.to is ExecutorMode.PINGPONG:
            raise ConfigError("executor.downgrade.to must be sync or async")


@dataclass(frozen=True)
class ExecutorConfig:
    max_inflight: int
    fixed_engine: bool
    mode: ExecutorMode | None = None  # None: sync for max_inflight 1, pingpong for 2
    downgrade: DowngradePolicy = field(default_factory=DowngradePolicy)

    @property
    def effective_mode(self) -> ExecutorMode:
        if self.mode is not None:
            return self.mode
        return ExecutorMode.PINGPONG if self.max_inflight >= 2 else ExecutorMode.SYNC


@dataclass(frozen=True)
class RecoveryConfig:
    max_resets_per_10min: int
    restart_on_unknown_dma: bool


@dataclass(frozen=True)
class TenantConfig:
    weight: float
    max_active_sequences: int | None = None
    max_waiting_tokens: int | None = None
    qps: float | None = None


@dataclass(frozen=True)
class SchedulerConfig:
    """A validated ``calculet-scheduler/v1`` document (000 §15)."""

    model_alias: str
    admission: AdmissionConfig
    queues: QueuesConfig
    batch: BatchConfig
    executor: ExecutorConfig
    recovery: RecoveryConfig
    tenants: Mapping[str, TenantConfig] = field(default_factory=dict)
    source: str = "<scheduler>"
    pointer: str = ""  # where the document sits inside its file ("/models/0/scheduler" in a dual config)


@dataclass(frozen=True)
class DeviceConfig:
    type: str
    expected_chips: int
    combined_calbin: str
    package_digest: str | None = None  # calctl extension: the served package must have this digest


@dataclass(frozen=True)
class DualModelEntry:
    """One ``models[i]`` of 001 §10.4."""

    alias: str
    chip_id: int
    prefill_graph: str
    decode_graph: str
    context_limit: int
    max_inflight: int
    max_waiting_requests: int
    scheduler: SchedulerConfig | None = None
    pointer: str = ""

    def effective_scheduler(self) -> SchedulerConfig:
        """The per-model scheduler block, or 000 §15 defaults carrying this entry's limits."""
        if self.scheduler is not None:
            return self.scheduler
        return default_scheduler_config(
            self.alias, max_waiting_requests=self.max_waiting_requests, max_inflight=self.max_inflight
        )


@dataclass(frozen=True)
class DualRecoveryConfig:
    allow_session_reset: bool
    restart_process_on_unknown_dma: bool


@dataclass(frozen=True)
class DualModelConfig:
    """A validated ``calculet-dual-model/v1`` document (001 §10.4)."""

    device: DeviceConfig
    models: tuple[DualModelEntry, ...]
    recovery: DualRecoveryConfig
    source: str = "<dual-model>"
    base_dir: Path | None = None  # the file's directory: a relative combined_calbin is relative to it
    max_body_bytes: int | None = None  # api.max_body_mb (None: the server's default; docs/serve.md "Request size")

    def model(self, alias: str) -> DualModelEntry:
        for m in self.models:
            if m.alias == alias:
                return m
        raise KeyError(alias)


def default_scheduler_config(alias: str, *, max_waiting_requests: int = 128, max_inflight: int = 1) -> SchedulerConfig:
    """The 000 §15 example values (B1 only, no batching window)."""
    return SchedulerConfig(
        model_alias=alias,
        admission=AdmissionConfig(max_waiting_requests, 262144, 120000),
        queues=QueuesConfig(8, 4, 2, 1, 512, 4096),
        batch=BatchConfig((1,), 0),
        executor=ExecutorConfig(max_inflight, False),
        recovery=RecoveryConfig(2, True),
    )


# -- loading --------------------------------------------------------------------------------------


def load_scheduler_config(path: str | Path) -> SchedulerConfig:
    """Read, schema-validate and parse a ``calculet-scheduler/v1`` YAML file."""
    source = str(path)
    return parse_scheduler_config(_read(Path(path), source), source=source)


def load_dual_model_config(path: str | Path) -> DualModelConfig:
    """Read, schema-validate and parse a ``calculet-dual-model/v1`` YAML file."""
    source = str(path)
    config = parse_dual_model_config(_read(Path(path), source), source=source)
    return dataclasses.replace(config, base_dir=Path(path).resolve().parent)


def parse_scheduler_config(doc: Any, *, source: str, at: str = "") -> SchedulerConfig:
    """Validate and parse an already-loaded scheduler document; ``at`` prefixes field paths."""
    problems = _schema_problems(SCHEDULER_SCHEMA, doc, at)
    if problems:
        raise ConfigFieldError(source, problems)
    config = _scheduler_from_doc(doc, source, at)
    problems = list(_scheduler_rules(config, at))
    if problems:
        raise ConfigFieldError(source, problems)
    return config


def parse_dual_model_config(doc: Any, *, source: str) -> DualModelConfig:
    """Validate and parse an already-loaded dual-model document."""
    problems = _schema_problems(DUAL_MODEL_SCHEMA, doc, "")
    if problems:
        raise ConfigFieldError(source, problems)
    entries: list[DualModelEntry] = []
    seen_alias: dict[str, int] = {}
    seen_chip: dict[int, int] = {}
    for i, m in enumerate(doc["models"]):
        at = f"/models/{i}"
        if m["alias"] in seen_alias:
            problems.append((f"{at}/alias", f"{m['alias']!r} is already used by /models/{seen_alias[m['alias']]}"))
        seen_alias.setdefault(m["alias"], i)
        if m["chip_id"] in seen_chip:  # 001 §4: one model per chip
            problems.append(
                (f"{at}/chip_id", f"chip {m['chip_id']} is already used by /models/{seen_chip[m['chip_id']]}")
            )
        seen_chip.setdefault(m["chip_id"], i)
        if m["chip_id"] >= doc["device"]["expected_chips"]:
            problems.append(
                (f"{at}/chip_id", f"{m['chip_id']} is outside the {doc['device']['expected_chips']} expected chips")
            )
        sched: SchedulerConfig | None = None
        if "scheduler" in m:
            block = dict(m["scheduler"])
            block.setdefault("schema", SCHEDULER_SCHEMA)
            block.setdefault("model_alias", m["alias"])
            try:
                sched = parse_scheduler_config(block, source=source, at=f"{at}/scheduler")
            except ConfigFieldError as exc:
                problems.extend(exc.problems)
            else:
                problems.extend(_entry_vs_scheduler(m, sched, at))
        entries.append(
            DualModelEntry(
                alias=m["alias"],
                chip_id=m["chip_id"],
                prefill_graph=m["prefill_graph"],
                decode_graph=m["decode_graph"],
                context_limit=m["context_limit"],
                max_inflight=m["max_inflight"],
                max_waiting_requests=m["max_waiting_requests"],
                scheduler=sched,
                pointer=at,
            )
        )
    if problems:
        raise ConfigFieldError(source, problems)
    dev = doc["device"]
    rec = doc["recovery"]
    return DualModelConfig(
        device=DeviceConfig(
            dev["type"], dev["expected_chips"], dev["combined_calbin"], normalize_digest(dev.get("package_digest"))
        ),
        models=tuple(entries),
        recovery=DualRecoveryConfig(rec["allow_session_reset"], rec["restart_process_on_unknown_dma"]),
        source=source,
        max_body_bytes=mib_bytes(doc.get("api", {}).get("max_body_mb")),
    )


def mib_bytes(mib: float | None) -> int | None:
    """A size in MiB (a float, as the CLI and the config give it) in whole bytes; None stays None."""
    return None if mib is None else int(mib * 2**20)


# -- the package being served (001 §10.4: a mismatch fails at start-up) ----------------------------


def normalize_digest(digest: str | None) -> str | None:
    """A package digest as ``package_digest`` returns it (lower-case hex, no ``sha256:`` prefix)."""
    if digest is None:
        return None
    d = digest.strip().lower().removeprefix("sha256:")
    if len(d) != 64 or any(c not in "0123456789abcdef" for c in d):
        raise ConfigError(f"package digest {digest!r}: expected 64 hex digits (optionally prefixed sha256:)")
    return d


def check_served_package(
    config: DualModelConfig | None, source: Path, digest: str | None, *, pinned: str | None = None
) -> None:
    """Fail unless ``source`` (the package path given to serve or load) is the one the configuration names.

    * ``device.combined_calbin``: the same path, after resolving symlinks (relative to the config file);
    * ``device.package_digest`` and ``pinned`` (``--pin-digest``): the package's digest, exactly.
    Every mismatch is reported, each as ``file: /field: message`` (a digest pin outside a file names the option).
    """
    problems: list[Problem] = []
    if config is not None:
        named = Path(config.device.combined_calbin).expanduser()
        if not named.is_absolute() and config.base_dir is not None:
            named = config.base_dir / named
        if named.resolve() != Path(source).resolve():
            problems.append(
                (
                    "/device/combined_calbin",
                    f"names {config.device.combined_calbin} ({named.resolve()}), but the package being served is "
                    f"{Path(source).resolve()}",
                )
            )
        want = config.device.package_digest
        if want is not None and want != digest:
            problems.append(("/device/package_digest", f"pins {want}, but the package's digest is {digest or 'none'}"))
    if problems:
        assert config is not None
        raise ConfigFieldError(config.source, problems)
    if pinned is not None and normalize_digest(pinned) != digest:
        raise ConfigError(
            f"--pin-digest {pinned}: the package {Path(source)} has digest {digest or 'none (no checksums.sha256)'}",
            hint="serve the pinned package, or pin the digest `calctl inspect` prints for this one",
        )


# -- cross-check against the package manifest (000 §15, 001 §10.4) --------------------------------


def cross_check_scheduler(config: SchedulerConfig, package: Package) -> None:
    """Fail (listing every mismatch) unless the package serves this scheduler configuration as written."""
    problems = list(_scheduler_vs_package(config, package))
    if problems:
        raise ConfigFieldError(config.source, problems, hint="the configuration must match the signed manifest")


def cross_check_dual_model(config: DualModelConfig, package: Package) -> None:
    """Fail (listing every mismatch) unless chips, graphs, contexts and profiles agree with the package."""
    problems: list[Problem] = []
    chips = list(range(package.device_cfg.chip_nums))
    if config.device.expected_chips != package.device_cfg.chip_nums:
        problems.append(
            (
                "/device/expected_chips",
                f"{config.device.expected_chips} does not match the package's chip_nums {package.device_cfg.chip_nums}",
            )
        )
    configured = {m.alias for m in config.models}
    for alias in package.aliases:
        if alias not in configured:  # a combined calbin is configured and reset as a whole (001 §11.2)
            problems.append(
                ("/models", f"package model {alias!r} has no entry (a combined package serves all its models)")
            )
    for entry in config.models:
        problems.extend(_model_entry_vs_package(entry, package, chips))
    if problems:
        raise ConfigFieldError(config.source, problems, hint="the configuration must match the signed manifest")


def _model_entry_vs_package(entry: DualModelEntry, package: Package, chips: list[int]) -> Iterator[Problem]:
    """The mismatches of one ``models`` entry: its model, chip, graphs, context limit and own scheduler."""
    at = entry.pointer
    model = _find_model(package, entry.alias)
    if model is None:
        yield (f"{at}/alias", f"{entry.alias!r} is not a model of the package ({_names(package.aliases)})")
        return
    if entry.chip_id not in chips:
        yield (f"{at}/chip_id", f"{entry.chip_id} is not one of the package's chips {chips}")
    elif entry.chip_id not in model.target_chips:
        yield (f"{at}/chip_id", f"model {entry.alias!r} targets chips {list(model.target_chips)}, not {entry.chip_id}")
    yield from _entry_graph_vs_package(entry, "prefill_graph", entry.prefill_graph, GraphKind.PREFILL, package, chips)
    yield from _entry_graph_vs_package(entry, "decode_graph", entry.decode_graph, GraphKind.DECODE, package, chips)
    arch_ctx = model.architecture.context_limit
    if entry.context_limit > arch_ctx:
        yield (f"{at}/context_limit", f"{entry.context_limit} exceeds model {entry.alias!r} context limit {arch_ctx}")
    if entry.scheduler is not None:
        yield from _scheduler_vs_package(entry.scheduler, package)


def _entry_graph_vs_package(
    entry: DualModelEntry, fld: str, name: str, kind: GraphKind, package: Package, chips: list[int]
) -> Iterator[Problem]:
    """The mismatches of one graph an entry names (``fld``): it exists, is ``kind`` of the entry's model, runs on
    the entry's chip and holds its context."""
    at = entry.pointer
    graph = _find_graph(package, name)
    if graph is None:
        yield (f"{at}/{fld}", f"no graph named {name!r} in the package")
        return
    if graph.model_alias != entry.alias or graph.kind is not kind:
        yield (
            f"{at}/{fld}",
            f"graph {name!r} is the {graph.kind.value} graph of model {graph.model_alias!r}, "
            f"not a {kind.value} graph of {entry.alias!r}",
        )
        return
    if entry.chip_id in chips and entry.chip_id not in graph.target_chips:
        yield (f"{at}/{fld}", f"graph {name!r} targets chips {list(graph.target_chips)}, not {entry.chip_id}")
    if entry.context_limit > graph.max_seq:
        yield (f"{at}/context_limit", f"{entry.context_limit} exceeds graph {name!r} max_seq {graph.max_seq}")


def batch_profiles(config: SchedulerConfig, model: Model) -> tuple[BatchProfile, ...]:
    """The configured profiles as the package declares them (call after the cross-check)."""
    decode = model.decode
    profiles: list[BatchProfile] = []
    for b in config.batch.profiles:
        if b not in decode.batch_profiles:
            raise ConfigFieldError(config.source, [(f"{config.pointer}/batch/profiles", f"B{b} is not compiled")])
        pol = decode.inactive_lane_policy
        contract = None
        if pol is not None:
            contract = InactiveLaneContract(
                valid_mask_input=pol.mask_input,
                writes_kv=pol.writes_kv,
                returns_logits=pol.returns_logits,
                kv_mode=pol.kv_manager_mode,
            )
        profiles.append(BatchProfile(decode.name, b, decode.max_seq, contract if b > 1 else None))
    return tuple(profiles)


def scheduler_settings(
    config: SchedulerConfig,
    model: Model,
    *,
    max_sequences: int,
    max_kv_tokens: int,
    context_limit: int | None = None,
) -> SchedulerSettings:
    """Core settings from a cross-checked configuration, the package model and the capacity plan's numbers."""
    ctx = min(model.architecture.context_limit, model.prefill.max_seq, model.decode.max_seq)
    if context_limit is not None:
        ctx = min(ctx, context_limit)
    tenants = {
        TenantId(name): TenantPolicy(t.weight, t.max_active_sequences, t.max_waiting_tokens, t.qps)
        for name, t in config.tenants.items()
        if name != DEFAULT_TENANT
    }
    default = config.tenants.get(DEFAULT_TENANT)
    default_policy = (
        TenantPolicy(default.weight, default.max_active_sequences, default.max_waiting_tokens, default.qps)
        if default is not None
        else TenantPolicy()
    )
    a, q, b = config.admission, config.queues, config.batch
    return SchedulerSettings(
        budget=CapacityBudget(
            max_sequences=max_sequences,
            max_kv_tokens=max_kv_tokens,
            max_waiting_requests=a.max_waiting_requests,
            max_waiting_prompt_tokens=a.max_waiting_prompt_tokens,
            max_inflight_jobs=config.executor.max_inflight,
        ),
        max_seq=ctx,
        admission=AdmissionPolicy(
            context_limit=ctx,
            deadline_default_s=a.deadline_default_ms / 1000.0,
            decode_weight=a.decode_cost_weight,
            tenants=tenants,
            default_tenant=default_policy,
        ),
        prefill_graph=model.prefill.name,
        profiles=batch_profiles(config, model),
        prefill_thresholds=PrefillThresholds(q.short_prefill_max_tokens, q.medium_prefill_max_tokens),
        service_weights=ServiceWeights(
            q.decode_weight, q.short_prefill_weight, q.medium_prefill_weight, q.long_prefill_weight
        ),
        decode=DecodeOptions(
            batching_window_s=b.batching_window_us / 1e6,
            profile_thresholds=dict(b.profile_thresholds) or None,
            max_tenant_lane_share=b.max_tenant_lane_share,
            deadline_granularity_s=b.deadline_granularity_ms / 1000.0,
            step_estimate_s=b.step_estimate_floor_us / 1e6,
        ),
        long_prefill=LongPrefillQuota(q.long_prefill_max_waiting, q.long_prefill_max_running),
    )


# -- internals ------------------------------------------------------------------------------------


def _read(path: Path, source: str) -> Any:
    try:
        return yamlsafe.load_file(path, display=source)
    except PackageError as exc:  # the YAML reader speaks package errors; this is a config file
        raise ConfigError(str(exc)) from None


def _schema_problems(schema: str, doc: Any, at: str) -> list[Problem]:
    problems: list[Problem] = []
    for err in _validator(schema).iter_errors(doc):
        where = at + (_pointer(err.absolute_path) if err.absolute_path else "")
        if err.validator == "required":
            missing = str(err.message).split("'")[1] if "'" in err.message else ""
            problems.append((f"{where}/{missing}", "required field is missing"))
        elif err.validator == "additionalProperties" and isinstance(err.instance, dict):
            allowed = set((err.schema.get("properties") or {}).keys())  # type: ignore[union-attr,unused-ignore]
            for key in err.instance:
                if key not in allowed:
                    hint = f" (allowed: {', '.join(sorted(allowed))})" if allowed else ""
                    problems.append((f"{where}/{key}", f"unknown field{hint}"))
        else:
            msg = err.message if len(err.message) <= 200 else err.message[:197] + "..."
            problems.append((where or "/", msg))
    return sorted(set(problems))


def default_of(cls: type, name: str) -> Any:
    """The default of field ``name`` of the config dataclass ``cls``: the one place a scheduler default is written
    (the loader fills omitted fields from it; the JSON schema's ``default`` and docs/serving-core.md's table are
    checked against it by tests/unit/serving/test_scheduler_defaults.py)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            raise KeyError(f"{cls.__name__}.{name} has no default")
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def _scheduler_from_doc(doc: Mapping[str, Any], source: str, at: str) -> SchedulerConfig:
    a, q, b, e, r = (doc[k] for k in ("admission", "queues", "batch", "executor", "recovery"))
    return SchedulerConfig(
        model_alias=doc["model_alias"],
        admission=AdmissionConfig(
            a["max_waiting_requests"],
            a["max_waiting_prompt_tokens"],
            a["deadline_default_ms"],
            float(a.get("decode_cost_weight", default_of(AdmissionConfig, "decode_cost_weight"))),
        ),
        queues=QueuesConfig(
            q["decode_weight"],
            q["short_prefill_weight"],
            q["medium_prefill_weight"],
            q["long_prefill_weight"],
            q["short_prefill_max_tokens"],
            q["medium_prefill_max_tokens"],
            q.get("long_prefill_max_waiting"),
            int(q.get("long_prefill_max_running", default_of(QueuesConfig, "long_prefill_max_running"))),
        ),
        batch=BatchConfig(
            profiles=tuple(b["profiles"]),
            batching_window_us=b["batching_window_us"],
            profile_thresholds={int(k): v for k, v in (b.get("profile_thresholds") or {}).items()},
            max_tenant_lane_share=float(
                b.get("max_tenant_lane_share", default_of(BatchConfig, "max_tenant_lane_share"))
            ),
            deadline_granularity_ms=float(
                b.get("deadline_granularity_ms", default_of(BatchConfig, "deadline_granularity_ms"))
            ),
            step_estimate_floor_us=int(
                b.get("step_estimate_floor_us", default_of(BatchConfig, "step_estimate_floor_us"))
            ),
        ),
        executor=ExecutorConfig(
            e["max_inflight"],
            e["fixed_engine"],
            ExecutorMode(e["mode"]) if "mode" in e else None,
            _downgrade(e.get("downgrade") or {}),
        ),
        recovery=RecoveryConfig(r["max_resets_per_10min"], r["restart_on_unknown_dma"]),
        tenants={
            name: TenantConfig(t["weight"], t.get("max_active_sequences"), t.get("max_waiting_tokens"), t.get("qps"))
            for name, t in (doc.get("tenants") or {}).items()
        },
        source=source,
        pointer=at,
    )


def _downgrade(d: Mapping[str, Any]) -> DowngradePolicy:
    """The ``executor.downgrade`` block; cross-field problems are reported by :func:`_scheduler_rules`."""
    base = DowngradePolicy()
    return DowngradePolicy(
        to=ExecutorMode(d.get("to", base.to.value)),
        p99_regression=float(d.get("p99_regression", base.p99_regression)),
        p99_baseline_s=float(d["p99_baseline_ms"]) / 1000.0 if "p99_baseline_ms" in d else None,
        p99_window=int(d.get("p99_window", base.p99_window)),
        p99_min_samples=int(d.get("p99_min_samples", base.p99_min_samples)),
        consecutive_busy=int(d.get("consecutive_busy", base.consecutive_busy)),
        consecutive_timeouts=int(d.get("consecutive_timeouts", base.consecutive_timeouts)),
        pending_grace_s=float(d.get("pending_grace_ms", base.pending_grace_s * 1000)) / 1000.0,
    )


def _scheduler_rules(config: SchedulerConfig, at: str) -> Iterable[Problem]:
    e = config.executor
    if e.effective_mode.max_inflight > e.max_inflight:  # 001 §9.3: 2 in flight only when configured
        yield (
            f"{at}/executor/mode",
            f"{e.effective_mode.value} needs max_inflight 2, the configuration has {e.max_inflight}",
        )
    if e.fixed_engine and e.effective_mode is ExecutorMode.PINGPONG:
        yield (
            f"{at}/executor/fixed_engine",
            "pingpong alternates the ping and pong banks; it cannot use one fixed engine",
        )
    if e.downgrade.p99_min_samples > e.downgrade.p99_window:
        yield (
            f"{at}/executor/downgrade/p99_min_samples",
            f"{e.downgrade.p99_min_samples} exceeds p99_window {e.downgrade.p99_window}",
        )
    q = config.queues
    if q.short_prefill_max_tokens >= q.medium_prefill_max_tokens:
        yield (
            f"{at}/queues/short_prefill_max_tokens",
            f"{q.short_prefill_max_tokens} must be below medium_prefill_max_tokens {q.medium_prefill_max_tokens}",
        )
    for b, _th in config.batch.profile_thresholds.items():
        if b not in config.batch.profiles:
            yield (f"{at}/batch/profile_thresholds/{b}", f"B{b} is not in batch.profiles {list(config.batch.profiles)}")


def _entry_vs_scheduler(m: Mapping[str, Any], sched: SchedulerConfig, at: str) -> Iterable[Problem]:
    if sched.model_alias != m["alias"]:
        yield (f"{at}/scheduler/model_alias", f"{sched.model_alias!r} does not match the entry's alias {m['alias']!r}")
    if sched.executor.max_inflight != m["max_inflight"]:
        yield (
            f"{at}/scheduler/executor/max_inflight",
            f"{sched.executor.max_inflight} disagrees with {at}/max_inflight {m['max_inflight']}",
        )
    if sched.admission.max_waiting_requests != m["max_waiting_requests"]:
        yield (
            f"{at}/scheduler/admission/max_waiting_requests",
            f"{sched.admission.max_waiting_requests} disagrees with {at}/max_waiting_requests "
            f"{m['max_waiting_requests']}",
        )


def _scheduler_vs_package(config: SchedulerConfig, package: Package) -> Iterable[Problem]:
    at = config.pointer
    model = _find_model(package, config.model_alias)
    if model is None:
        yield (f"{at}/model_alias", f"{config.model_alias!r} is not a model of the package ({_names(package.aliases)})")
        return
    decode = model.decode
    compiled = list(decode.batch_profiles)
    for i, b in enumerate(config.batch.profiles):
        where = f"{at}/batch/profiles/{i}"
        if b not in compiled:
            yield (
                where,
                f"profile B{b} is not compiled in decode graph {decode.name!r} "
                f"(it has {', '.join(f'B{c}' for c in compiled)})",
            )
        elif b > 1 and decode.inactive_lane_policy is None:
            yield (where, f"profile B{b} of graph {decode.name!r} has no inactive-lane contract (000 §7.3)")
        elif b > 1 and decode.inactive_lane_policy is not None and decode.inactive_lane_policy.writes_kv:
            yield (where, f"profile B{b} of graph {decode.name!r} lets inactive lanes write KV (000 §7.3)")


def _find_model(package: Package, alias: str) -> Model | None:
    for m in package.models:
        if m.alias == alias:
            return m
    return None


def _find_graph(package: Package, name: str) -> Graph | None:
    return next((g for g in package.graphs if g.name == name), None)


def _names(names: Iterable[str]) -> str:
    listed = ", ".join(repr(n) for n in names)
    return f"it has {listed}" if listed else "it has none"
