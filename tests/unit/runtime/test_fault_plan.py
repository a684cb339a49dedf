"""The fault-plan format (calctl-fault-plan/v1): what is accepted, what is refused and how it is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from calctl.errors import ConfigError
from calctl.runtime import open_runtime
from calctl.runtime.mock import FaultKind, FaultPlan, MockRuntime
from calctl.runtime.mock.faults import FaultInjector
from calctl.runtime.types import ResetScope
from tests.conftest import FIXTURE_PACKAGES, TEST_PUB, Cli, assert_no_traceback

EXAMPLE = """\
schema: calctl-fault-plan/v1
seed: 7
faults:
  - kind: wait_timeout
    job: 3
    graph: model_a_decode
    reset_scope: board
  - kind: corrupt_output
    probability: 0.05
    model: model-b
    magnitude: 2.0
  - kind: device_busy
    probability: 0.1
    chip: 1
    max_count: 2
  - kind: memory_leak
    unload: [1, 4]
    model: model-a
    bytes: 1048576
"""


def test_the_documented_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(EXAMPLE)
    plan = FaultPlan.load(path)
    assert plan.seed == 7
    hang, corrupt, busy, leak = plan.rules
    assert (hang.kind, hang.at, hang.graph, hang.reset_scope) == (
        FaultKind.WAIT_TIMEOUT,
        (3,),
        "model_a_decode",
        ResetScope.BOARD,
    )
    assert (corrupt.probability, corrupt.model, corrupt.magnitude) == (0.05, "model-b", 2.0)
    assert (busy.chip, busy.max_count, busy.reset_scope) == (1, 2, ResetScope.CHIP)
    assert (leak.at, leak.leak_bytes) == ((1, 4), 1048576)
    with open_runtime("mock", fault_plan=path) as rt:  # a path is accepted by the factory too
        assert isinstance(rt, MockRuntime)
        assert rt.injected_faults() == ()


@pytest.mark.parametrize(
    ("faults", "message"),
    [
        ([{"kind": "explode", "job": 1}], "explode"),
        ([{"kind": "ccu_exception"}], "exactly one of 'probability' and 'job'"),
        ([{"kind": "ccu_exception", "job": 1, "probability": 0.5}], "exactly one"),
        ([{"kind": "ccu_exception", "probability": 1.5}], "1.5"),
        ([{"kind": "ccu_exception", "job": 0}], "/faults/0/job"),
        ([{"kind": "memory_leak", "job": 1}], "use 'unload'"),
        ([{"kind": "device_busy", "job": 1, "reset_scope": "board"}], "reset_scope applies only"),
        ([{"kind": "ccu_exception", "job": 1, "magnitude": 2}], "magnitude applies only"),
        ([{"kind": "memory_leak", "unload": 1, "graph": "g"}], "per model"),
        ([{"kind": "host_memory_leak", "unload": 1}], "host_memory_leak needs bytes"),
        ([{"kind": "host_memory_leak", "job": 1, "bytes": 4096}], "use 'unload'"),
        ([{"kind": "ccu_exception", "job": 1, "bytes": 4096}], "bytes applies only"),
        ([{"kind": "ccu_exception", "job": 1, "colour": "red"}], "colour"),
        ([{"kind": "reset_failure", "job": 1}], "fires on resets; use 'reset', not 'job'"),
        ([{"kind": "ccu_exception", "reset": 1}], "use 'job', not 'reset'"),
        ([{"kind": "reset_failure", "reset": 1, "model": "model-a"}], "per reset"),
        ([{"kind": "reset_failure", "reset": 1, "reset_scope": "board"}], "reset_scope applies only"),
    ],
)
def test_bad_rules_are_refused_with_their_location(faults: list[dict], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FaultPlan.from_document({"schema": "calctl-fault-plan/v1", "faults": faults}, source="plan.yaml")


def test_bad_documents_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="schema"):
        FaultPlan.from_document({"schema": "other/v9", "faults": []})
    with pytest.raises(ConfigError, match="faults"):
        FaultPlan.from_document({"schema": "calctl-fault-plan/v1"})
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: [unclosed\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        FaultPlan.load(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        FaultPlan.load(tmp_path / "missing.yaml")
    code = tmp_path / "code.yaml"
    code.write_text("!!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError):
        FaultPlan.load(code)  # safe_load: never constructs Python objects


def test_probability_draws_depend_only_on_seed_rule_and_ordinal() -> None:
    plan = FaultPlan.from_document(
        {
            "schema": "calctl-fault-plan/v1",
            "faults": [
                {"kind": "corrupt_output", "probability": 0.5, "graph": "a"},
                {"kind": "corrupt_output", "probability": 0.5, "graph": "b"},
            ],
        }
    )

    def fired(seed: int, order: list[str]) -> dict[str, list[int]]:
        inj = FaultInjector(plan, seed)
        out: dict[str, list[int]] = {"a": [], "b": []}
        for g in order:
            for d in inj.on_submit(graph=g, model="m", chips=(0,)):
                out[g].append(d.ordinal)
        return out

    interleaved = fired(3, ["a", "b"] * 20)
    grouped = fired(3, ["a"] * 20 + ["b"] * 20)
    assert interleaved == grouped  # another interleaving of the two graphs: the same faults
    assert 0 < len(interleaved["a"]) < 20
    assert fired(4, ["a", "b"] * 20) != interleaved
    capped = FaultInjector(
        FaultPlan.from_document(
            {"schema": "calctl-fault-plan/v1", "faults": [{"kind": "device_busy", "probability": 1.0, "max_count": 2}]}
        )
    )
    assert [len(capped.on_submit(graph="g", model="m", chips=(0,))) for _ in range(4)] == [1, 1, 0, 0]


def test_the_example_in_docs_runtime_md_is_valid() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "runtime.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    plan = FaultPlan.from_document(yaml.safe_load(block), source="docs/runtime.md")
    assert [r.kind for r in plan.rules] == [
        FaultKind.WAIT_TIMEOUT,
        FaultKind.CORRUPT_OUTPUT,
        FaultKind.DEVICE_BUSY,
        FaultKind.MEMORY_LEAK,
    ]


@pytest.mark.parametrize(
    ("field", "fragment"),
    [
        ("magnitude: .nan", "non-finite number '.nan'"),
        ("magnitude: .inf", "non-finite number '.inf'"),
        ("magnitude: 1.0e+309", "non-finite number '1.0e+309'"),
        ("magnitude: 2:10", "base-60"),
        ("max_count: 1_000", "digit separators"),
        ("max_count: 010", "leading zero"),
        ("max_count: 0b11", "YAML 1.1 binary"),
    ],
)
def test_numbers_that_are_not_what_they_look_like_are_refused_naming_the_line(
    tmp_path: Path, field: str, fragment: str
) -> None:
    """The plan is read with the package's strict YAML reader: PyYAML alone took nan, inf, 2:10 (130) and 1_000."""
    path = tmp_path / "plan.yaml"
    path.write_text(f"schema: calctl-fault-plan/v1\nfaults:\n  - {{kind: corrupt_output, job: [3], {field}}}\n")
    with pytest.raises(ConfigError, match="line 3") as exc:
        FaultPlan.load(path)
    assert fragment in str(exc.value) and str(path) in str(exc.value)


@pytest.mark.parametrize("chips, chip", [(2, 2), (2, 7), (1, 1)])
def test_a_rule_on_a_chip_the_board_lacks_is_refused_naming_file_field_value_and_chips(
    tmp_path: Path, chips: int, chip: int
) -> None:
    """A rule filtered to a chip the board does not have never fires: a run would pass for the wrong reason."""
    path = tmp_path / "plan.yaml"
    path.write_text(
        "schema: calctl-fault-plan/v1\nfaults:\n  - {kind: device_busy, probability: 0.5, chip: 0}\n"
        f"  - {{kind: ccu_exception, probability: 0.5, chip: {chip}}}\n"
    )
    with pytest.raises(ConfigError) as exc:
        open_runtime("mock", fault_plan=path, chips=chips)
    text = str(exc.value)
    assert f"{path}: /faults/1/chip: chip {chip} is not on this board" in text, text
    assert f"{chips} chip" in text and f"(0..{chips - 1})" in text, text
    with open_runtime("mock", fault_plan=path, chips=chip + 1) as rt:  # the same plan on a board that has it
        assert rt.topology().chips == chip + 1


def test_a_runner_given_a_plan_for_a_chip_the_board_lacks_exits_2(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text("schema: calctl-fault-plan/v1\nfaults:\n  - {kind: ccu_exception, probability: 1.0, chip: 3}\n")
    r = cli("run-golden", FIXTURE_PACKAGES / "combined", "--trusted-key", TEST_PUB, "--fault-plan", path)
    assert_no_traceback(r)
    assert r.code == 2 and f"{path}: /faults/0/chip: chip 3 is not on this board, which has 2 chips" in r.err, r.err
