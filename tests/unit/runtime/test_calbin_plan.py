"""create_calbin refuses, before configure, what 001 §6.4 says a runner must refuse: on both backends."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from calctl.package.model import DeviceCfg, Package
from calctl.runtime import Runtime
from calctl.runtime.calbin import plan_calbin
from calctl.runtime.errors import InvalidCalbin, RuntimeStatus
from calctl.runtime.types import Topology
from tests.unit.runtime.runtime_helpers import package

BOARD = Topology(chips=2, calcores_per_chip=2, dram_bytes=(16 << 30, 16 << 30))


def _with_graph(pkg: Package, alias: str, graph_name: str, **changes: Any) -> Package:
    models = []
    for m in pkg.models:
        if m.alias == alias:
            m = dataclasses.replace(
                m, graphs=tuple(dataclasses.replace(g, **changes) if g.name == graph_name else g for g in m.graphs)
            )
        models.append(m)
    return dataclasses.replace(pkg, models=tuple(models))


def _overreach(pkg: Package) -> Package:
    g = pkg.graph("model_a_prefill")
    return _with_graph(
        pkg,
        "model-a",
        "model_a_prefill",
        sections=(dataclasses.replace(g.sections[0], chip_mask=3), *g.sections[1:]),
    )


CASES = {
    "mask overreach": (_overreach, "chipMask 0x3, beyond the graph's chips"),
    "duplicate name": (
        lambda p: _with_graph(p, "model-b", "model_b_prefill", name="model_a_prefill"),
        "duplicate graph name",
    ),
    "chip outside the board": (
        lambda p: _with_graph(p, "model-a", "model_a_decode", target_chips=(2,)),
        "targets chips [2]",
    ),
    "graph outside its model": (
        lambda p: _with_graph(p, "model-a", "model_a_decode", target_chips=(1,)),
        "outside model 'model-a'",
    ),
    "SCHIP on two chips": (lambda p: _with_graph(p, "model-a", "model_a_decode", target_chips=(0, 1)), "SCHIP graph"),
    "CalCore count": (
        lambda p: dataclasses.replace(p, device_cfg=DeviceCfg(chip_nums=2, calcore_num=4, chip_dram_bytes=1)),
        "4 CalCores",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_refuses(case: str) -> None:
    broken, message = CASES[case]
    with pytest.raises(InvalidCalbin) as exc:
        plan_calbin(broken(package("combined")), BOARD)
    assert exc.value.status == RuntimeStatus.INVALID_CALBIN
    assert message in f"{exc.value} {exc.value.hint}"  # every finding is reported, the first in the message


def test_both_backends_refuse_before_configure(rt: Runtime) -> None:
    with pytest.raises(InvalidCalbin, match="chipMask"):
        rt.create_calbin(_overreach(package("combined")))
    assert rt.current_calbin is None


def test_plan_of_a_good_package() -> None:
    pkg = package("replica")
    plan = plan_calbin(pkg, BOARD)
    assert {n: g.chips for n, g in plan.graphs.items()} == {
        "model_a0_prefill": (0,),
        "model_a0_decode": (0,),
        "model_a1_prefill": (1,),
        "model_a1_decode": (1,),
    }
    assert plan.chip_plan_bytes == tuple(sum(r.size for r in pkg.regions_on(c)) for c in (0, 1))
    assert plan.models["model-a1"].plan_bytes == {1: plan.chip_plan_bytes[1]}
