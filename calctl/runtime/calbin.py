"""From a loaded package to a calbin plan the device can take (001 §6.4, §2.3–§2.4).

:func:`plan_calbin` is the check both backends run before handing a calbin to a
device: exact, unique graph names; every graph's chips inside the board and
inside its model's chips; an SCHIP graph on exactly one chip; no section whose
chip mask reaches beyond its graph's (or model's) chips; a memory plan whose
regions name real chips. Any failure is :class:`InvalidCalbin`, raised before
``configure`` (001 §6.4: "exit before configure on any mask overreach,
cross-chip section or duplicate name").

:class:`Calbin` is the handle a runtime returns from ``create_calbin``. This
module does not allocate device memory, execute anything or check that a
chip's plan fits its DRAM (that is ``configure``'s OutOfMemory).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from calctl.closing import Closes
from calctl.package.model import ChipMode, Graph, GraphKind, Model, Package, Section, mask_of_chips
from calctl.runtime.errors import InvalidCalbin
from calctl.runtime.types import Topology


@dataclass(frozen=True)
class GraphPlan:
    """One submittable graph (a CalbinModel, 001 §2.3) and where it runs."""

    graph: Graph
    model: str  # alias of the model the graph belongs to
    chips: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.graph.name

    @property
    def kind(self) -> GraphKind:
        return self.graph.kind

    @property
    def chip_mask(self) -> int:
        return mask_of_chips(self.chips)


@dataclass(frozen=True)
class ModelPlan:
    model: Model
    chips: tuple[int, ...]
    plan_bytes: Mapping[int, int]  # chip -> bytes of memory-plan regions this alias owns there

    @property
    def alias(self) -> str:
        return self.model.alias


@dataclass(frozen=True)
class CalbinPlan:
    package: Package
    graphs: Mapping[str, GraphPlan]
    models: Mapping[str, ModelPlan]
    chip_plan_bytes: tuple[int, ...]  # per board chip: the whole memory plan on it

    def graph(self, name: str) -> GraphPlan | None:
        """Exact lookup (001 §10.4): no case folding, no prefix matching."""
        return self.graphs.get(name)


def plan_calbin(package: Package, topology: Topology) -> CalbinPlan:
    """Check ``package`` against ``topology`` and return its plan, or raise :class:`InvalidCalbin`."""
    problems: list[str] = []
    cfg = package.device_cfg
    if cfg.chip_nums > topology.chips:
        problems.append(f"compiled for {cfg.chip_nums} chips, the board has {topology.chips}")
    if cfg.calcore_num != topology.calcores_per_chip:
        problems.append(f"compiled for {cfg.calcore_num} CalCores per chip, the board has {topology.calcores_per_chip}")
    board_mask = (1 << topology.chips) - 1

    graphs: dict[str, GraphPlan] = {}
    models: dict[str, ModelPlan] = {}
    for model in package.models:
        problems += _model_problems(model, board_mask, topology)
        for g in model.graphs:
            if g.name in graphs:
                problems.append(f"duplicate graph name {g.name!r}")
                continue
            problems += _graph_problems(g, model, board_mask, topology)
            graphs[g.name] = GraphPlan(graph=g, model=model.alias, chips=tuple(sorted(g.target_chips)))
        per_chip: dict[int, int] = {}
        for region in package.memory_plan:
            if region.owner == model.alias:
                per_chip[region.chip] = per_chip.get(region.chip, 0) + region.size
        models[model.alias] = ModelPlan(model=model, chips=tuple(sorted(model.target_chips)), plan_bytes=per_chip)

    chip_bytes = [0] * topology.chips
    for region in package.memory_plan:
        if not 0 <= region.chip < topology.chips:
            problems.append(
                f"memory plan region {region.name!r} is on chip {region.chip}, the board has 0..{topology.chips - 1}"
            )
            continue
        chip_bytes[region.chip] += region.size
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InvalidCalbin(
            f"package {package.name!r} cannot be a calbin on this board: {problems[0]}{more}",
            hint="; ".join(problems[1:6]) or "run `calctl validate` on the package for every finding",
        )
    return CalbinPlan(package=package, graphs=graphs, models=models, chip_plan_bytes=tuple(chip_bytes))


def _model_problems(model: Model, board_mask: int, topology: Topology) -> list[str]:
    """A model's chips on the board, and its sections' chip masks within the model's chips."""
    chips = list(model.target_chips)
    return _off_board(f"model {model.alias!r}", model.target_chips, board_mask, topology) + _overreach(
        model.sections,
        f"model {model.alias!r}",
        mask_of_chips(model.target_chips),
        f" beyond the model's chips {chips}",
    )


def _graph_problems(g: Graph, model: Model, board_mask: int, topology: Topology) -> list[str]:
    """A graph's chips on the board and within its model's, its chip mode, and its sections' chip masks."""
    problems = _off_board(f"graph {g.name!r}", g.target_chips, board_mask, topology)
    gmask = mask_of_chips(g.target_chips)
    if gmask & ~mask_of_chips(model.target_chips):
        problems.append(
            f"graph {g.name!r} targets chips {list(g.target_chips)} "
            f"outside model {model.alias!r}'s {list(model.target_chips)}"
        )
    if g.chip_mode is ChipMode.SCHIP and len(g.target_chips) != 1:
        problems.append(f"SCHIP graph {g.name!r} targets {len(g.target_chips)} chips, expected exactly 1")
    # 001 §6.4: a mask overreach means A could touch B's chip.
    return problems + _overreach(
        g.sections, f"graph {g.name!r}", gmask, f", beyond the graph's chips {list(g.target_chips)}"
    )


def _off_board(what: str, chips: tuple[int, ...], board_mask: int, topology: Topology) -> list[str]:
    """``what`` targets no chip, or a chip the board does not have."""
    if not chips or mask_of_chips(chips) & ~board_mask:
        return [f"{what} targets chips {list(chips)}, the board has 0..{topology.chips - 1}"]
    return []


def _overreach(sections: Iterable[Section], owner: str, mask: int, beyond: str) -> list[str]:
    """The sections of ``owner`` whose chip mask is empty or reaches past ``mask``."""
    return [
        f"section {sec.name!r} of {owner} has chipMask {sec.chip_mask:#x}{beyond}"
        for sec in sections
        if sec.chip_mask == 0 or sec.chip_mask & ~mask
    ]


class Calbin(Closes):
    """A calbin created on a device from a package. Release it (or use ``with``) when done.

    A configured calbin cannot be released; ``reset_configuration`` first.
    """

    def __init__(self, plan: CalbinPlan, calbin_id: int, release: Callable[[Calbin], None]) -> None:
        self.plan = plan
        self.id = calbin_id
        self._release = release
        self._lock = threading.Lock()
        self._released = False

    @property
    def package(self) -> Package:
        return self.plan.package

    @property
    def graph_names(self) -> tuple[str, ...]:
        return tuple(self.plan.graphs)

    @property
    def released(self) -> bool:
        return self._released

    def chips_of(self, graph: str) -> tuple[int, ...]:
        plan = self.plan.graph(graph)
        return () if plan is None else plan.chips

    def close(self) -> None:
        with self._lock:
            if self._released:
                return
            self._release(self)
            self._released = True

    def __repr__(self) -> str:
        return f"Calbin(id={self.id}, package={self.package.name!r}, graphs={list(self.graph_names)})"


# -- checks both backends make before a submit (one implementation, so they cannot drift) ---------


def resolve_graph(current: Calbin | None, name: str) -> GraphPlan:
    """The configured graph named exactly ``name`` (001 §10.4: no fuzzy matching)."""
    from calctl.runtime.errors import InvalidArgument, NotConfigured

    if current is None:
        raise NotConfigured(f"graph {name!r}: no calbin is configured")
    plan = current.plan.graph(name)
    if plan is None:
        raise InvalidArgument(
            f"no graph named exactly {name!r} in the configured calbin (it has: {', '.join(current.graph_names)})"
        )
    return plan


def check_job_buffers(owned: Mapping[int, Any], plan: GraphPlan, inputs: Any, outputs: Any) -> None:
    """A job's buffers belong to this device, match the graph and direction, and are the caller's (never shared)."""
    from calctl.runtime.buffers import BufferState, Direction
    from calctl.runtime.errors import BufferInUse, InvalidArgument

    if inputs is outputs:
        raise InvalidArgument("inputs and outputs must be two different buffers (a buffer is never shared)")
    pairs: tuple[tuple[Any, Direction], ...] = ((inputs, Direction.INPUT), (outputs, Direction.OUTPUT))
    for buf, direction in pairs:
        if buf.id not in owned or owned[buf.id] is not buf:
            raise InvalidArgument(f"{buf!r} does not belong to this device or was released")
        if buf.direction is not direction or buf.graph != plan.name:
            raise InvalidArgument(f"{buf!r} is not a {direction.value} buffer of graph {plan.name!r}")
        if buf.state is not BufferState.OWNED_BY_CALLER:
            raise BufferInUse(f"{buf!r} is owned by job {buf.job}; every job needs its own buffers", job=buf.job)
    if inputs.batch != outputs.batch:
        raise InvalidArgument(f"inputs are B{inputs.batch} but outputs are B{outputs.batch}")
