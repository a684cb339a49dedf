"""``calctl soak``: are the memory figures of the chip asked for? One model loaded at a time (issue 50, MEM-2).

The soak's ``memory_figures`` check after the first load (:func:`calctl.runners.soak.checks.check_memory_units`)
holds each chip's figure to the weights the package put on it. With both models of a combined package loaded at
once it cannot tell a shim that reports chip 1's figures for chip 0 and back: the two chips' plans are about the
same size, so each swapped figure still grew by at least its chip's weights, and the soak would judge every
drift on the wrong chip. So before the first load, where the package puts its models on different chips, the
soak loads each model alone (the package cut to that model and its memory plan), reads every chip's figure, and
unloads it again: the model's own chips must grow by at least its weights, every other chip by less than half
of that. A shim that cannot do this load is not judged here (the first load of the soak reports it).

This module reads figures and unloads what it loaded; it decides no verdict (the soak's judge does).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from calctl.package.model import Package, SectionKind
from calctl.runtime.errors import RuntimeLayerError
from calctl.runtime.interface import Runtime


@dataclass(frozen=True)
class Misattributed:
    """A chip whose figure moved with a model loaded on another chip, or did not move with its own."""

    chip: int
    alias: str
    model_chips: tuple[int, ...]
    grown: int
    weights: int  # the model's weights on its own chips
    own_grown: int  # what its own chips' figures grew by

    def message(self) -> str:
        where = ", ".join(str(c) for c in self.model_chips)
        if self.chip in self.model_chips:
            return (
                f"chip {self.chip}: loading {self.alias} alone (weights {self.weights} B on chip {where}) raised "
                f"calrt_memory_usage by {self.grown} B: fewer than the weights, so the figure is not this chip's"
            )
        return (
            f"chip {self.chip}: loading {self.alias} alone, which sits on chip {where}, raised chip {self.chip}'s "
            f"calrt_memory_usage by {self.grown} B (its own chip's by {self.own_grown} B): the figures are "
            "attributed to the wrong chip"
        )


def alone(pkg: Package, alias: str) -> Package:
    """``pkg`` cut to one model and its memory plan: a load whose chips are known."""
    others = {m.alias for m in pkg.models} - {alias}
    return dataclasses.replace(
        pkg, models=(pkg.model(alias),), memory_plan=tuple(r for r in pkg.memory_plan if r.owner not in others)
    )


def weights_on(pkg: Package, alias: str, chip: int) -> int:
    """Bytes of ``alias``'s parameter sections on ``chip``."""
    return sum(
        int(sec.size)
        for sec in pkg.model(alias).sections
        if sec.kind is SectionKind.PARAMS and (int(sec.chip_mask) >> chip) & 1
    )


def separable(pkg: Package) -> bool:
    """Two or more models, no chip shared: a model loaded alone tells its chips apart from the others'."""
    chips = [set(m.target_chips) for m in pkg.models]
    return len(chips) > 1 and all(not (a & b) for i, a in enumerate(chips) for b in chips[i + 1 :])


def probe(rt: Runtime, pkg: Package) -> list[Misattributed]:
    """Load each model of ``pkg`` alone on ``rt`` (unconfigured, idle), read every chip's figure, unload it.
    Returns what disagrees; empty when the figures follow the models (or a figure is not reported, or the
    shim refuses the load: nothing to judge)."""
    found: list[Misattributed] = []
    if not separable(pkg):
        return found
    try:
        before = {m.chip: m.used_bytes for m in rt.memory_usage()}
    except RuntimeLayerError:
        return found
    for m in pkg.models:
        cut = alone(pkg, m.alias)
        try:
            calbin = rt.create_calbin(cut)
        except RuntimeLayerError:
            return found
        with calbin:  # released again after the unload
            try:
                rt.configure(calbin)
            except RuntimeLayerError:
                return found
            try:
                during = {x.chip: x.used_bytes for x in rt.memory_usage()}
            except RuntimeLayerError:  # no figure while loaded: nothing to judge (the soak's own checks say so)
                return found
            finally:
                rt.reset_configuration()
        grown: dict[int, int] = {}
        for c, b in before.items():
            d = during.get(c)
            if b is not None and d is not None:
                grown[c] = d - b
        chips = tuple(m.target_chips)
        weights = sum(weights_on(cut, m.alias, c) for c in chips)
        own = max((grown[c] for c in chips if c in grown), default=0)
        for c, g in sorted(grown.items()):
            mine = c in chips
            if (mine and g < weights_on(cut, m.alias, c)) or (not mine and g > max(1 << 20, own // 2)):
                found.append(Misattributed(c, m.alias, chips, g, weights, own))
    return found


__all__ = ["Misattributed", "alone", "probe", "separable", "weights_on"]
