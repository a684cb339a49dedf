"""Seeded fault injection for the mock board (docs/runtime.md, 001 §11.3, §12 Phase 4, §13.4).

A fault plan is a YAML document (``calctl-fault-plan/v1``, docs/runtime.md) of
rules. Each rule names a fault kind, *when* it fires (a probability per
matching event, or exact 1-based ordinals of matching events), optional exact
filters (graph, model alias, chip), a reset scope for faults that halt a chip,
and kind-specific knobs. Events are job submissions, except for
``memory_leak`` and ``host_memory_leak`` whose events are unloads of a model (``reset_configuration``) and
the reset faults whose events are resets (``reset_failure``, ``reset_chip_lost``: either scope;
``reset_takes_other_chip``: chip resets only).

Determinism: a rule counts *its own* matching events; whether the n-th one
fires depends only on (seed, rule index, n) through a counter-based hash, never
on a shared random stream. So the same plan and seed give the same faults,
and two threads submitting to different graphs do not perturb each other's
draws. (With no ``graph`` filter, concurrent submitters can still interleave
differently; filter by graph for exact reproducibility under concurrency.)

This module decides and records; the board (``board.py``) applies the effects.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np

from calctl.errors import ConfigError
from calctl.runtime.types import ResetScope

SCHEMA_ID = "calctl-fault-plan/v1"
MAX_PLAN_BYTES = 1024 * 1024


class FaultKind(str, enum.Enum):
    DEVICE_BUSY = "device_busy"  # submit refused with DeviceBusy
    WAIT_TIMEOUT = "wait_timeout"  # the job hangs until a reset; wait() times out
    CCU_EXCEPTION = "ccu_exception"  # the job fails with CcuException; the chip halts
    UNKNOWN_DMA_STATE = "unknown_dma_state"  # the job fails; buffers held until reset; the chip halts
    CORRUPT_OUTPUT = "corrupt_output"  # the job "succeeds" with perturbed logits
    KV_CORRUPTION = "kv_corruption"  # the job succeeds; the K/V it wrote are perturbed
    # A decode job's inactive lanes (lane_valid 0) write K/V anyway, into the first active lane's sequence at the
    # inactive lane's position (000 §7.3 broken); the job succeeds. No effect on a job with no inactive lane.
    INACTIVE_LANE_KV = "inactive_lane_kv"
    # The job reports SUCCEEDED but its logits are never written: the output buffer keeps what it held before
    # (a shim that signals completion before the output DMA). The KV it computed is written.
    UNWRITTEN_LOGITS = "unwritten_logits"
    MEMORY_LEAK = "memory_leak"  # unload does not return (some of) the model's memory
    HOST_MEMORY_LEAK = "host_memory_leak"  # unload keeps `bytes` of real host memory in the process (soak RSS check)
    RESET_FAILURE = "reset_failure"  # the reset itself fails: DeviceLost, nothing is reset (001 §11.3 row 6)
    # The reset returns OK but a chip it reset stays down (tenstorrent/tt-umd#2316: `tt-smi -r` exits 0 and the
    # device is gone): only a check after the reset can tell.
    RESET_CHIP_LOST = "reset_chip_lost"
    # A chip reset returns OK, its chip comes back, and another chip goes down with it (Xilinx/video-sdk#8: a
    # card-level reset leaves one chip unavailable; 001 §7.1: reset domains are not proven chip-local).
    RESET_TAKES_OTHER_CHIP = "reset_takes_other_chip"
    # Transfers (write_mem / read_mem, calctl.runtime.memory): the modelled link runs at `magnitude` x its rate.
    SLOW_LINK = "slow_link"  # the board's host link: every chip's transfers (default 0.25 x)
    SLOW_CHIP_TRANSFER = "slow_chip_transfer"  # one chip's DMA engine (filter `chip`; default 0.5 x: half bandwidth)
    # Reads of device memory (read_mem): what a memory pattern test must catch, at the address it names.
    STUCK_BIT = "stuck_bit"  # bit `bit` of the byte at `address` reads `stuck_at` on every read that covers it
    BIT_FLIP = "bit_flip"  # one bit of a read comes back flipped (at `address`, else a seeded place in the read)
    # Telemetry (thermal.py, docs/calrt-c-abi.md §15), from the job submission that fires them on, per chip (filter
    # `chip`; else every chip of the job): the job still runs, the chip's telemetry tells.
    # the chip's cooling fails: `magnitude` (default 4) times hotter per watt, past its limit, and it throttles
    FAN_FAILED = "fan_failed"
    STUCK_SENSOR = "stuck_sensor"  # the temperature reading freezes where it is (the chip heats on underneath)
    ECC_ERRORS = "ecc_errors"  # `count` (default 1) memory errors, `ecc: correctable` (default) or `uncorrectable`

    @property
    def halts_chip(self) -> bool:
        return self in (FaultKind.WAIT_TIMEOUT, FaultKind.CCU_EXCEPTION, FaultKind.UNKNOWN_DMA_STATE)

    @property
    def corrupts(self) -> bool:
        """The job succeeds and something it wrote is wrong (applied by the board after the compute)."""
        return self in (
            FaultKind.CORRUPT_OUTPUT,
            FaultKind.KV_CORRUPTION,
            FaultKind.INACTIVE_LANE_KV,
            FaultKind.UNWRITTEN_LOGITS,
        )

    @property
    def on_unload(self) -> bool:
        return self in (FaultKind.MEMORY_LEAK, FaultKind.HOST_MEMORY_LEAK)

    @property
    def on_reset(self) -> bool:
        return self in (FaultKind.RESET_FAILURE, FaultKind.RESET_CHIP_LOST, FaultKind.RESET_TAKES_OTHER_CHIP)

    @property
    def on_transfer(self) -> bool:
        return self in (FaultKind.SLOW_LINK, FaultKind.SLOW_CHIP_TRANSFER, FaultKind.STUCK_BIT, FaultKind.BIT_FLIP)

    @property
    def on_telemetry(self) -> bool:
        return self in (FaultKind.FAN_FAILED, FaultKind.STUCK_SENSOR, FaultKind.ECC_ERRORS)

    @property
    def trigger(self) -> str:
        """The plan key of its 1-based ordinals: ``job`` (submissions), ``unload``, ``reset`` or ``transfer``."""
        if self.on_transfer:
            return "transfer"
        return "unload" if self.on_unload else "reset" if self.on_reset else "job"


#: When an event-numbered rule fires: the Nth event (1-based), or any of a list of them.
_EVENT_NUMBERS: dict[str, Any] = {
    "oneOf": [
        {"type": "integer", "minimum": 1},
        {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1},
    ]
}
_RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["kind"],
    "properties": {
        "kind": {"enum": [k.value for k in FaultKind]},
        "probability": {"type": "number", "minimum": 0, "maximum": 1},
        "job": _EVENT_NUMBERS,
        "unload": _EVENT_NUMBERS,
        "reset": _EVENT_NUMBERS,
        "transfer": _EVENT_NUMBERS,
        "graph": {"type": "string", "minLength": 1},
        "model": {"type": "string", "minLength": 1},
        "chip": {"type": "integer", "minimum": 0},
        "reset_scope": {"enum": [s.value for s in ResetScope]},
        "max_count": {"type": "integer", "minimum": 1},
        "magnitude": {"type": "number", "exclusiveMinimum": 0},
        "bytes": {"type": "integer", "minimum": 1},
        "address": {"type": "integer", "minimum": 0},
        "bit": {"type": "integer", "minimum": 0, "maximum": 7},
        "stuck_at": {"enum": [0, 1]},
        "ecc": {"enum": ["correctable", "uncorrectable"]},
        "count": {"type": "integer", "minimum": 1},
    },
}

PLAN_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["schema", "faults"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "seed": {"type": "integer", "minimum": 0},
        "faults": {"type": "array", "items": _RULE_SCHEMA},
    },
}


@dataclass(frozen=True)
class FaultRule:
    kind: FaultKind
    probability: float | None = None
    at: tuple[int, ...] = ()  # exact 1-based ordinals of matching events (``job:`` / ``unload:``)
    graph: str | None = None
    model: str | None = None
    chip: int | None = None
    reset_scope: ResetScope = ResetScope.CHIP
    max_count: int | None = None
    magnitude: float = 1.0
    leak_bytes: int | None = None  # memory_leak: default the model's whole plan on each of its chips
    address: int | None = None  # stuck_bit (required), bit_flip (optional): a device address on the rule's chip
    bit: int = 0  # stuck_bit: which bit of that byte (0 = least significant)
    stuck_at: int = 0  # stuck_bit: the value the bit reads
    ecc: str = "correctable"  # ecc_errors: which counter
    count: int = 1  # ecc_errors: errors added each time it fires

    def matches(self, *, graph: str | None, model: str | None, chips: Sequence[int]) -> bool:
        if self.graph is not None and self.graph != graph:
            return False
        if self.model is not None and model is not None and self.model != model:
            return False
        return self.chip is None or self.chip in chips


@dataclass(frozen=True)
class FaultPlan:
    rules: tuple[FaultRule, ...] = ()
    seed: int = 0
    source: str = field(default="fault plan", compare=False)  # the file it came from, for errors

    def check_board(self, chips: int) -> None:
        """Refuse a rule whose ``chip`` is not a chip of a board of ``chips`` chips (it would never fire, and a
        run would pass for the wrong reason): :class:`ConfigError` (exit 2) naming file, field, value and chips."""
        for i, rule in enumerate(self.rules):
            if rule.chip is not None and not 0 <= rule.chip < chips:
                raise ConfigError(
                    f"{self.source}: /faults/{i}/chip: chip {rule.chip} is not on this board, which has {chips} "
                    f"chip{'s' if chips != 1 else ''} (0..{chips - 1})",
                    hint="a fault plan's chip must be one of the board's chips (calctl device info lists them)",
                )

    @classmethod
    def from_document(cls, doc: Any, *, source: str = "fault plan") -> FaultPlan:
        """Build a plan from a parsed document; :class:`ConfigError` names the field on any problem."""
        validator = jsonschema.Draft202012Validator(PLAN_SCHEMA)
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
        if errors:
            err = errors[0]
            where = "/" + "/".join(str(p) for p in err.absolute_path)
            raise ConfigError(
                f"{source}: {where}: {err.message}", hint=f"see docs/runtime.md for the {SCHEMA_ID} format"
            )
        rules = []
        for i, r in enumerate(doc["faults"]):
            rules.append(_rule(r, f"{source}: /faults/{i}"))
        return cls(rules=tuple(rules), seed=int(doc.get("seed", 0)), source=source)

    @classmethod
    def load(cls, path: Path) -> FaultPlan:
        from calctl.package import yamlsafe  # the package's strict YAML reader

        doc = yamlsafe.load_config(
            path,
            name=str(path),
            what="fault plan",
            max_bytes=MAX_PLAN_BYTES,
            hint=f"see docs/runtime.md for the {SCHEMA_ID} format",
        )
        return cls.from_document(doc, source=str(path))


#: A transfer fault's rate factor when the rule gives none: a link at a quarter, a chip at half its bandwidth.
_DEFAULT_MAGNITUDE = {FaultKind.SLOW_LINK: 0.25, FaultKind.SLOW_CHIP_TRANSFER: 0.5, FaultKind.FAN_FAILED: 4.0}


def _check_trigger(r: Mapping[str, Any], kind: FaultKind, where: str) -> None:
    """The rule fires on its kind's event: by probability or at listed event numbers, one of the two."""
    trigger_key = kind.trigger
    events = {"job": "job submissions", "unload": "unloads", "reset": "resets", "transfer": "transfers"}
    for wrong_key in sorted(set(events) - {trigger_key}):
        if wrong_key in r:
            raise ConfigError(
                f"{where}: {kind.value} fires on {events[trigger_key]}; use {trigger_key!r}, not {wrong_key!r}"
            )
    has_p, has_at = "probability" in r, trigger_key in r
    if has_p == has_at:
        raise ConfigError(f"{where}: give exactly one of 'probability' and {trigger_key!r}")
    if "reset_scope" in r and not kind.halts_chip:
        raise ConfigError(
            f"{where}: reset_scope applies only to faults that halt a chip (wait_timeout, ccu_exception, unknown_dma_state)"
        )


def _check_magnitude(r: Mapping[str, Any], kind: FaultKind, where: str) -> None:
    """A magnitude only on the kinds that take one, and within that kind's range."""
    if "magnitude" in r and (
        (not kind.corrupts and not kind.on_transfer and kind is not FaultKind.FAN_FAILED)
        or kind is FaultKind.UNWRITTEN_LOGITS
    ):
        raise ConfigError(
            f"{where}: magnitude applies only to corrupt_output, kv_corruption, inactive_lane_kv, slow_link, "
            "slow_chip_transfer and fan_failed"
        )
    if kind is FaultKind.FAN_FAILED and not float(r.get("magnitude", 4.0)) >= 1:
        raise ConfigError(
            f"{where}: fan_failed magnitude is how much hotter the chip runs per watt, >= 1; got {r['magnitude']}"
        )
    if kind.on_transfer and not 0 < float(r.get("magnitude", 0.5)) <= 1:
        raise ConfigError(f"{where}: {kind.value} magnitude is the rate kept, in (0, 1]; got {r['magnitude']}")


def _check_memory_and_ecc(r: Mapping[str, Any], kind: FaultKind, where: str) -> None:
    """address, bit and stuck_at only on memory faults (stuck_bit needs chip and address); ecc and count only on ecc_errors."""
    memory_keys = sorted({"address", "bit", "stuck_at"} & set(r))
    if memory_keys and kind not in (FaultKind.STUCK_BIT, FaultKind.BIT_FLIP):
        raise ConfigError(
            f"{where}: {', '.join(memory_keys)} appl{'ies' if len(memory_keys) == 1 else 'y'} only to stuck_bit and bit_flip"
        )
    if kind is FaultKind.BIT_FLIP and ("bit" in r or "stuck_at" in r):
        raise ConfigError(f"{where}: bit_flip flips a seeded bit; bit and stuck_at apply to stuck_bit")
    if kind is FaultKind.STUCK_BIT and ("address" not in r or "chip" not in r):
        raise ConfigError(f"{where}: stuck_bit needs chip and address (the device address of the stuck byte)")
    ecc_keys = sorted({"ecc", "count"} & set(r))
    if ecc_keys and kind is not FaultKind.ECC_ERRORS:
        raise ConfigError(
            f"{where}: {', '.join(ecc_keys)} appl{'ies' if len(ecc_keys) == 1 else 'y'} only to ecc_errors"
        )


def _check_filters(r: Mapping[str, Any], kind: FaultKind, where: str) -> None:
    """The graph/model/chip filters and bytes each kind's event can have."""
    if kind.on_transfer and ("graph" in r or "model" in r):
        raise ConfigError(f"{where}: {kind.value} is per transfer; filter with 'chip'")
    if "bytes" in r and not kind.on_unload:
        raise ConfigError(f"{where}: bytes applies only to memory_leak and host_memory_leak")
    if kind is FaultKind.HOST_MEMORY_LEAK and "bytes" not in r:
        raise ConfigError(f"{where}: host_memory_leak needs bytes (what each unload keeps in the process)")
    if kind.on_unload and "graph" in r:
        raise ConfigError(f"{where}: {kind.value} is per model; filter with 'model' or 'chip', not 'graph'")
    if kind.on_reset and ("graph" in r or "model" in r):
        raise ConfigError(f"{where}: {kind.value} is per reset; filter with 'chip' (a board reset touches every chip)")


def _rule(r: Mapping[str, Any], where: str) -> FaultRule:
    kind = FaultKind(r["kind"])
    trigger_key = kind.trigger
    _check_trigger(r, kind, where)
    _check_magnitude(r, kind, where)
    _check_memory_and_ecc(r, kind, where)
    _check_filters(r, kind, where)
    has_p = "probability" in r
    at = r.get(trigger_key, ())
    return FaultRule(
        kind=kind,
        probability=float(r["probability"]) if has_p else None,
        at=tuple(sorted(set([at] if isinstance(at, int) else at))),
        graph=r.get("graph"),
        model=r.get("model"),
        chip=r.get("chip"),
        reset_scope=ResetScope(r.get("reset_scope", "chip")),
        max_count=r.get("max_count"),
        magnitude=float(r.get("magnitude", _DEFAULT_MAGNITUDE.get(kind, 1.0))),
        leak_bytes=r.get("bytes"),
        address=r.get("address"),
        bit=int(r.get("bit", 0)),
        stuck_at=int(r.get("stuck_at", 0)),
        ecc=str(r.get("ecc", "correctable")),
        count=int(r.get("count", 1)),
    )


@dataclass(frozen=True)
class FaultDecision:
    """A rule that fires for one event. ``rng_key`` seeds any random perturbation it applies."""

    rule_index: int
    rule: FaultRule
    ordinal: int
    rng_key: int

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.rng_key)


@dataclass(frozen=True)
class InjectedFault:
    """One fault that happened, for reports and for the determinism check."""

    rule_index: int
    kind: FaultKind
    ordinal: int
    job: int | None
    graph: str | None
    model: str  # the alias ("" for a reset_failure: a reset is per chip or board, not per model)
    chips: tuple[int, ...]
    reset_scope: ResetScope | None


def _draw(seed: int, rule_index: int, ordinal: int, salt: str) -> int:
    h = hashlib.blake2b(f"{seed}/{rule_index}/{ordinal}/{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little")


class FaultInjector:
    """Counts matching events per rule and decides, deterministically, which rules fire.

    Not thread-safe on its own: the board calls it under the board lock.
    """

    def __init__(self, plan: FaultPlan, seed: int | None = None) -> None:
        self.plan = plan
        self.seed = plan.seed if seed is None else seed
        self._counts = [0] * len(plan.rules)
        self._fired = [0] * len(plan.rules)
        self._log: list[InjectedFault] = []

    @property
    def log(self) -> tuple[InjectedFault, ...]:
        return tuple(self._log)

    def add_rule(self, rule: FaultRule) -> int:
        """Arm one more rule at run time (tests and tools); its ordinals count from now."""
        self.plan = FaultPlan(rules=(*self.plan.rules, rule), seed=self.plan.seed)
        self._counts.append(0)
        self._fired.append(0)
        return len(self.plan.rules) - 1

    def on_submit(self, *, graph: str, model: str, chips: Sequence[int]) -> list[FaultDecision]:
        return self._decide(trigger="job", graph=graph, model=model, chips=chips)

    def on_unload(self, *, model: str, chips: Sequence[int]) -> list[FaultDecision]:
        return self._decide(trigger="unload", graph=None, model=model, chips=chips)

    def on_transfer(self, *, chip: int) -> list[FaultDecision]:
        """A write_mem or read_mem on ``chip``: the transfer rules (slow_link, slow_chip_transfer) that fire."""
        return self._decide(trigger="transfer", graph=None, model="", chips=(chip,))

    def on_reset(self, *, chips: Sequence[int], scope: ResetScope) -> list[FaultDecision]:
        """A reset of ``chips`` (every chip for a board reset): the reset rules that fire. A board reset leaves
        no other chip to take down, so ``reset_takes_other_chip`` counts chip resets only."""
        return self._decide(trigger="reset", graph=None, model="", chips=chips, reset_scope=scope)

    def record(
        self, decision: FaultDecision, *, job: int | None, graph: str | None, model: str, chips: Sequence[int]
    ) -> None:
        rule = decision.rule
        self._log.append(
            InjectedFault(
                rule_index=decision.rule_index,
                kind=rule.kind,
                ordinal=decision.ordinal,
                job=job,
                graph=graph,
                model=model,
                chips=tuple(chips),
                reset_scope=rule.reset_scope if rule.kind.halts_chip else None,
            )
        )

    def _decide(
        self,
        *,
        trigger: str,
        graph: str | None,
        model: str,
        chips: Sequence[int],
        reset_scope: ResetScope | None = None,
    ) -> list[FaultDecision]:
        out: list[FaultDecision] = []
        for i, rule in enumerate(self.plan.rules):
            if rule.kind.trigger != trigger:
                continue
            if rule.kind is FaultKind.RESET_TAKES_OTHER_CHIP and reset_scope is not ResetScope.CHIP:
                continue
            if not rule.matches(graph=graph, model=model if trigger in ("job", "unload") else None, chips=chips):
                continue
            self._counts[i] += 1
            n = self._counts[i]
            if rule.max_count is not None and self._fired[i] >= rule.max_count:
                continue
            fires = (
                _draw(self.seed, i, n, "p") / 2.0**64 < rule.probability
                if rule.probability is not None
                else n in rule.at
            )
            if fires:
                self._fired[i] += 1
                out.append(FaultDecision(rule_index=i, rule=rule, ordinal=n, rng_key=_draw(self.seed, i, n, "rng")))
        return out
