"""``calctl bench`` knows no scenario by name: a scenario registered in the one table runs, is refused the options
it does not read and is reported from that table alone (issue 48 item 3; docs/bench.md §7)."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import calctl
from calctl.errors import Interrupted, UsageError
from calctl.runners.bench import scenarios
from calctl.runners.bench.base import BenchOptions, Scenario, ScenarioInterrupted, ScenarioResult, Table
from tests.conftest import Cli

ROOT = Path(calctl.__file__).parent


def _demo(run: Callable[[BenchOptions, Callable[[str], None]], ScenarioResult]) -> Scenario:
    return Scenario(
        "demo",
        "a scenario the CLI has never heard of",
        run,
        needs_url=False,
        options=("PKG", "--device", "--time-scale"),
        default_package=None,  # builds its own: no package is resolved
    )


@pytest.fixture
def register(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Scenario], None]]:
    def add(s: Scenario) -> None:
        monkeypatch.setitem(scenarios.SCENARIOS, s.name, s)

    yield add


def _measured(opts: BenchOptions, log: Callable[[str], None]) -> ScenarioResult:
    log("demo: measuring")
    return ScenarioResult(
        "demo",
        "MEASURED",
        tables=(Table("demo figures", ("what", "value"), (("answer", 42),)),),
        body={"answer": 42, "device_seen": opts.device.kind.value if opts.device else None},
        notes=("measured only",),
        mock_result=True,
    )


def test_a_registered_scenario_runs_reports_and_renders_without_the_cli_naming_it(
    cli: Cli, register: Callable[[Scenario], None], tmp_path: Path
) -> None:
    register(_demo(_measured))
    r = cli("bench", "--scenario", "demo", "--report", tmp_path / "r")
    assert r.code == 0, r.err
    assert "calctl bench --scenario demo in-process on the mock device" in r.err
    assert "plan: a scenario the CLI has never heard of" in r.err and "demo: measuring" in r.err
    assert "demo figures" in r.out and "answer" in r.out and "measured only" in r.out
    doc = json.loads((tmp_path / "r" / "bench-report.json").read_text())
    assert doc["scenario"] == "demo" and doc["verdict"] == "MEASURED" and doc["answer"] == 42
    assert doc["device_seen"] == "mock" and doc["exit_code"] == 0
    # the options rules come from the table too
    bad = cli("bench", "--scenario", "demo", "--url", "http://127.0.0.1:1", "--report", tmp_path / "u")
    assert bad.code == 2 and "--scenario demo runs the engine in-process: --url does not apply" in bad.err
    listed = cli("bench", "--scenario", "nope", "--report", tmp_path / "n")
    assert listed.code == 2 and "demo" in listed.err


def test_an_interrupt_ends_a_registered_scenario_interrupted_with_what_it_kept(
    cli: Cli, register: Callable[[Scenario], None], tmp_path: Path
) -> None:
    def interrupted(opts: BenchOptions, log: Callable[[str], None]) -> ScenarioResult:
        kept = ScenarioResult("demo", "INTERRUPTED", notes=("interrupted (SIGTERM) in phase two",), mock_result=True)
        raise ScenarioInterrupted(Interrupted("SIGTERM"), kept)

    register(_demo(interrupted))
    r = cli("bench", "--scenario", "demo", "--report", tmp_path / "r")
    doc = json.loads((tmp_path / "r" / "bench-report.json").read_text())
    assert r.code == 130 and doc["verdict"] == "INTERRUPTED"
    assert doc["notes"] == ["interrupted (SIGTERM) in phase two"]


def test_an_error_while_stopping_for_an_interrupt_is_part_of_the_interrupt(
    cli: Cli, register: Callable[[Scenario], None], tmp_path: Path
) -> None:
    def teardown_fails(opts: BenchOptions, log: Callable[[str], None]) -> ScenarioResult:
        try:
            raise Interrupted("SIGINT")
        finally:
            raise RuntimeError("loop closed")  # a teardown that fails behind the interrupt

    register(_demo(teardown_fails))
    r = cli("bench", "--scenario", "demo", "--report", tmp_path / "r")
    doc = json.loads((tmp_path / "r" / "bench-report.json").read_text())
    assert r.code == 130 and doc["verdict"] == "INTERRUPTED"
    assert doc["notes"][0].endswith("before the scenario finished: nothing was judged")
    assert doc["notes"][1] == "while stopping: RuntimeError: loop closed"


def test_an_error_with_no_interrupt_behind_it_is_not_an_interrupt(
    register: Callable[[Scenario], None], tmp_path: Path
) -> None:
    from calctl.cli.bench_cmds import _run

    def fails(opts: BenchOptions, log: Callable[[str], None]) -> ScenarioResult:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        _run(_demo(fails), BenchOptions(out_dir=tmp_path))


@pytest.mark.parametrize(
    ("name", "given", "message"),
    [
        (None, {"--sweep"}, None),  # --sweep selects the sweep scenario
        ("nope", set(), "expected one of ab, interference"),
        ("ab", {"--sweep"}, "--sweep belongs to --scenario sweep, not ab"),
    ],
)
def test_choose_reads_the_table(name: str | None, given: set[str], message: str | None) -> None:
    if message is None:
        assert scenarios.choose(name, given).name == "sweep"
        assert scenarios.choose(None, set()).name == scenarios.DEFAULT_SCENARIO
        return
    with pytest.raises(UsageError, match=message):
        scenarios.choose(name, given)


@pytest.mark.parametrize(
    ("name", "given", "message"),
    [
        ("batch", {"--requests"}, r"--requests applies to --scenario isolation only \(use --max-requests for batch\)"),
        ("ab", {"--time-scale"}, "drives the server at --url: PKG, --device, --time-scale and --fault-plan"),
        ("batch", {"--fault-plan"}, "--fault-plan applies to --scenario fault-isolation and isolation, not to batch"),
        ("fault-isolation", {"--sweep-levels"}, "--sweep-levels needs --sweep"),
    ],
)
def test_check_options_refuses_what_a_scenario_does_not_read(name: str, given: set[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        scenarios.check_options(scenarios.SCENARIOS[name], given)
    scenarios.check_options(scenarios.SCENARIOS["isolation"], {"--requests", "--fault-plan", "PKG"})


def test_bench_turns_no_base_exception_into_a_report() -> None:
    """Interrupts are caught as KeyboardInterrupt; cleanup is try/finally or an ExitStack (issue 48)."""
    files = [
        ROOT / "cli" / "bench_cmds.py",
        ROOT / "runners" / "traffic.py",
        *(ROOT / "runners" / "bench").rglob("*.py"),
    ]
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ExceptHandler) and "BaseException" in ast.dump(node.type or ast.Name("")):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert bad == []


def test_the_bench_cli_names_no_scenario_in_its_code() -> None:
    """Only help text may speak of scenarios by name; no comparison or lookup in the code does."""
    tree = ast.parse((ROOT / "cli" / "bench_cmds.py").read_text(encoding="utf-8"))
    names = set(scenarios.SCENARIOS) | {"bundled-replica", "own"}
    found = [
        f"line {cmp.lineno}: {side.value!r}"
        for cmp in ast.walk(tree)
        if isinstance(cmp, ast.Compare)
        for side in (cmp.left, *cmp.comparators)
        if isinstance(side, ast.Constant) and side.value in names
    ]
    assert found == []


def _bench_sources() -> list[Path]:
    return [
        ROOT / "cli" / "bench_cmds.py",
        ROOT / "runners" / "traffic.py",
        *sorted((ROOT / "runners" / "bench").rglob("*.py")),
        *sorted((ROOT / "loadgen").rglob("*.py")),
    ]


def test_bench_functions_are_at_most_120_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in _bench_sources()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 120
    ]
    assert long == []


def test_bench_functions_are_at_most_complexity_15() -> None:
    """McCabe complexity by ruff's C901 (a development dependency)."""
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--isolated",
            "--no-cache",  # tests never write into the checkout (ruff's cache is .ruff_cache/ there)
            "--select",
            "C901",
            "--config",
            "lint.mccabe.max-complexity=15",
            "--output-format",
            "concise",
            *map(str, _bench_sources()),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
