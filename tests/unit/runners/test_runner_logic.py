"""Runner logic that needs no device: golden judgement, the PoC's pre-configure check, the step log,
device specs and the bring-up pipeline's dependency rules (issue 6)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calctl.checks.steps import GoldenData, GreedyProgress, step_name
from calctl.errors import CheckFailed, ExitCode, StepTimeout, UsageError
from calctl.package.model import ChipMode, Package, Tolerance
from calctl.package.reader import load_manifest
from calctl.report import Report, StepStatus
from calctl.runners.bringup import BringupConfig, BringupState, BringupStep, Level, StepOutcome, run_bringup
from calctl.runners.device import DeviceSpec
from calctl.runners.golden import check_logits, first_mismatch, judge
from calctl.runners.poc import check_combined_calbin, parse_expect_models
from calctl.runners.steps import RunOutcome, StepLog, outcome_of
from calctl.runtime import DeviceKind
from calctl.runtime.calbin import CalbinPlan
from calctl.runtime.errors import CcuException
from calctl.signing.policy import TrustPolicy

PACKAGES = Path(__file__).resolve().parents[3] / "fixtures" / "packages"


@pytest.fixture(scope="module")
def combined() -> Package:
    return load_manifest(PACKAGES / "combined")


# ---------------------------------------------------------------------------
# golden judgement


def test_check_logits_allclose_worst_index_and_topk() -> None:
    want = np.array([0.0, 5.0, 1.0, 4.0, 3.0], np.float32)
    ok = check_logits(want + 1e-6, want, rtol=1e-4, atol=1e-4, top_k=2)
    assert ok.allclose and ok.topk_agree and ok.max_abs_err < 1e-5
    got = want.copy()
    got[2] += 0.5
    bad = check_logits(got, want, rtol=1e-4, atol=1e-4, top_k=2)
    assert not bad.allclose and bad.worst_index == 2 and bad.max_abs_err == pytest.approx(0.5)
    assert bad.topk_agree  # 1 and 3 are still the two highest
    swapped = check_logits(np.array([0, 5, 4.5, 1, 3], np.float32), want, rtol=1, atol=10, top_k=2)
    assert swapped.allclose and not swapped.topk_agree and swapped.got_topk == (1, 2)
    assert not check_logits(np.array([np.nan, 5, 1, 4, 3]), want, rtol=1, atol=1, top_k=1).allclose


def test_first_mismatch() -> None:
    assert first_mismatch((1, 2, 3), (1, 2, 3)) is None
    assert first_mismatch((1, 2, 3), (1, 9, 3)) == 1
    assert first_mismatch((1, 2, 3), (1, 2)) == 2
    assert [step_name(i) for i in range(3)] == ["prefill", "decode[0]", "decode[1]"]


def _golden(tokens: tuple[int, ...] = (7, 8, 9, 10)) -> GoldenData:
    logits = np.linspace(0, 1, 16, dtype=np.float32)
    return GoldenData("model-x", (1, 2, 3), logits, tokens, Tolerance(rtol=1e-4, atol=1e-4, top_k=3))


def test_judge_names_model_step_and_position() -> None:
    g = _golden()
    good = GreedyProgress("model-x", prefill_logits=g.prefill_logits.copy(), tokens=[7, 8, 9, 10])
    r = judge(g, good, 0.1)
    assert r.ok and r.reason is None and r.first_mismatch is None and r.topk_agree

    wrong_token = GreedyProgress("model-x", prefill_logits=g.prefill_logits.copy(), tokens=[7, 8, 4, 10])
    r = judge(g, wrong_token, 0.1)
    assert not r.ok and r.first_mismatch == 2
    # output token 2 comes from decode[1], written at KV position len(prompt) + 1 = 4
    assert r.reason == "model-x: decode[1]: output token 2, KV position 4: expected 9, got 4"

    logits = g.prefill_logits.copy()
    logits[5] += 1.0
    r = judge(g, GreedyProgress("model-x", prefill_logits=logits, tokens=[7, 8, 9, 10]), 0.1)
    assert not r.ok and not r.prefill_allclose
    assert r.reason is not None and r.reason.startswith("model-x: prefill:") and "vocab index 5" in r.reason
    assert "prompt position 2" in r.reason

    r = judge(g, GreedyProgress("model-x"), 0.1)
    assert not r.ok and "prefill" in (r.reason or "") and r.got_tokens == ()


# ---------------------------------------------------------------------------
# the PoC's check before configure (001 §6.4)


def _plan(pkg: Package) -> CalbinPlan:
    return CalbinPlan(package=pkg, graphs={}, models={}, chip_plan_bytes=())


def _with_model(pkg: Package, index: int, **changes: Any) -> Package:
    models = list(pkg.models)
    models[index] = dataclasses.replace(models[index], **changes)
    return dataclasses.replace(pkg, models=tuple(models))


def test_combined_check_accepts_the_sample(combined: Package) -> None:
    assert check_combined_calbin(_plan(combined), ("model-b", "model-a")) == []  # a set: order-insensitive


def test_combined_check_names_are_exact(combined: Package) -> None:
    problems = check_combined_calbin(_plan(combined), ("model-a", "Model-B"))
    assert len(problems) == 1 and "not exactly the expected" in problems[0]
    assert check_combined_calbin(_plan(combined), ("model-a", "model-b ")) != []


def test_combined_check_refuses_mask_overreach(combined: Package) -> None:
    b = combined.models[1]
    sections = (dataclasses.replace(b.sections[0], chip_mask=3), *b.sections[1:])
    problems = check_combined_calbin(_plan(_with_model(combined, 1, sections=sections)), ("model-a", "model-b"))
    assert any("chipMask 0x3" in p and b.sections[0].name in p for p in problems)


def test_combined_check_refuses_cross_chip_graph_section(combined: Package) -> None:
    a = combined.models[0]
    g = a.graphs[0]
    graph = dataclasses.replace(g, sections=(dataclasses.replace(g.sections[0], chip_mask=2), *g.sections[1:]))
    problems = check_combined_calbin(
        _plan(_with_model(combined, 0, graphs=(graph, *a.graphs[1:]))), ("model-a", "model-b")
    )
    assert any(g.sections[0].name in p and "chip 0" in p for p in problems)


def test_combined_check_refuses_duplicate_names_and_shared_chips(combined: Package) -> None:
    a, b = combined.models
    renamed = tuple(dataclasses.replace(g, name=a.graphs[i].name) for i, g in enumerate(b.graphs))
    problems = check_combined_calbin(_plan(_with_model(combined, 1, graphs=renamed)), ("model-a", "model-b"))
    assert any("duplicate graph name" in p for p in problems)
    dup = dataclasses.replace(combined, models=(a, dataclasses.replace(b, alias="model-a")))
    assert any("duplicate model alias" in p for p in check_combined_calbin(_plan(dup), ("model-a", "model-b")))
    same_chip = _with_model(combined, 1, target_chips=(0,))
    assert any("both target chip 0" in p for p in check_combined_calbin(_plan(same_chip), ("model-a", "model-b")))
    mchip = _with_model(combined, 1, chip_mode=ChipMode.MCHIP, target_chips=(0, 1))
    assert any("MCHIP" in p for p in check_combined_calbin(_plan(mchip), ("model-a", "model-b")))
    single = dataclasses.replace(combined, models=(a,))
    assert any("holds 1 model" in p for p in check_combined_calbin(_plan(single), ("model-a",)))


def test_parse_expect_models() -> None:
    assert parse_expect_models("model-a,model-b") == ("model-a", "model-b")
    for bad in ("model-a", "model-a,model-a", "a,b,c", "model-a,"):
        with pytest.raises(UsageError):
            parse_expect_models(bad)


# ---------------------------------------------------------------------------
# step log, outcomes, device spec


def test_step_log_records_status_from_exceptions() -> None:
    seen: list[str] = []
    log = StepLog(on_record=lambda r: seen.append(r.name))
    with log.step("ok") as note:
        note.detail = "fine"
    with pytest.raises(CheckFailed), log.step("bad"):
        raise CheckFailed("golden mismatch")
    with pytest.raises(StepTimeout), log.step("hang"):
        raise StepTimeout("too slow")
    with pytest.raises(CcuException), log.step("device"):
        raise CcuException("ccu")
    with pytest.raises(KeyboardInterrupt), log.step("ctrl-c"):
        raise KeyboardInterrupt
    log.skip("later", "not reached")
    assert [(r.name, r.status) for r in log.records] == [
        ("ok", StepStatus.PASS),
        ("bad", StepStatus.FAIL),
        ("hang", StepStatus.TIMEOUT),
        ("device", StepStatus.ERROR),
        ("ctrl-c", StepStatus.INTERRUPTED),
        ("later", StepStatus.SKIP),
    ]
    assert seen == ["ok", "bad", "hang", "device", "ctrl-c", "later"]
    assert log.records[1].detail == "golden mismatch"


def test_outcome_exit_codes() -> None:
    assert outcome_of(CheckFailed("x")).exit_code == ExitCode.FAILED
    assert outcome_of(StepTimeout("x")).exit_code == ExitCode.TIMEOUT
    assert outcome_of(CcuException("x")).exit_code == ExitCode.DEVICE
    assert outcome_of(KeyboardInterrupt()).exit_code == ExitCode.INTERRUPTED
    assert RunOutcome.PASS.exit_code == 0


def test_device_spec_keeps_mock_options_off_calrt() -> None:
    with pytest.raises(UsageError, match="--time-scale, --serialize-chips"):
        DeviceSpec(kind=DeviceKind.CALRT, time_scale=2.0, serialize_chips=True)
    with pytest.raises(UsageError, match="--calrt-lib"):
        DeviceSpec(calrt_lib=Path("/x.so"))
    with pytest.raises(UsageError):
        DeviceSpec(time_scale=0.0)
    assert DeviceSpec().with_default_time_scale(4.0).time_scale == 4.0
    assert DeviceSpec(time_scale=2.0).with_default_time_scale(4.0).time_scale == 2.0
    assert DeviceSpec().describe()["time_scale"] == 1.0


# ---------------------------------------------------------------------------
# bring-up pipeline: dependencies, skips, verdict, extension


def _step(
    name: str,
    verdict: str,
    needs: tuple[str, ...] = (),
    calls: list[str] | None = None,
    applies: str | None = None,
) -> BringupStep:
    def run(state: object) -> StepOutcome:
        if calls is not None:
            calls.append(name)
        if verdict == "RAISE-INT":
            raise KeyboardInterrupt
        return StepOutcome(name, verdict, f"{name} figure", 0.01)

    return BringupStep(name, needs, run, lambda state: applies)


def _outcomes(report: Report) -> list[StepOutcome]:
    """A bring-up report's steps, as the pipeline ran them."""
    assert report.steps is not None
    steps = [s for s in report.steps if isinstance(s, StepOutcome)]
    assert len(steps) == len(report.steps), report.steps
    return steps


def _config(tmp_path: Path) -> BringupConfig:
    return BringupConfig(
        package=tmp_path, trust=TrustPolicy(), device=DeviceSpec(), level=Level.QUICK, out_dir=tmp_path / "out"
    )


def test_bringup_failing_step_skips_its_dependents_with_the_reason(tmp_path: Path) -> None:
    calls: list[str] = []
    steps = (
        _step("validate", "PASS", calls=calls),
        _step("budget", "NO-GO", ("validate",), calls),
        _step("run-golden", "PASS", ("validate", "budget"), calls),
        _step("warmup", "PASS", ("run-golden",), calls),
        _step("independent", "PASS", ("validate",), calls),
    )
    report = run_bringup(_config(tmp_path), steps=steps)
    assert calls == ["validate", "budget", "independent"]
    by_name = {s.name: s for s in _outcomes(report)}
    assert [s.name for s in _outcomes(report)] == ["validate", "budget", "run-golden", "warmup", "independent"]
    assert by_name["run-golden"].verdict == "SKIP" and "needs budget NO-GO" in by_name["run-golden"].detail
    assert by_name["warmup"].verdict == "SKIP" and "needs run-golden SKIP" in by_name["warmup"].detail
    assert report.verdict == "FAIL" and report.exit_code == 1
    assert [s["step"] for s in report.document()["summary"]] == [s.name for s in steps]


def test_bringup_extension_step_runs_after_the_others_and_not_applicable_is_skip(tmp_path: Path) -> None:
    calls: list[str] = []
    steps = (
        _step("validate", "PASS", calls=calls),
        _step("poc", "S2", ("validate",), calls, applies="single-model package"),
        _step("soak", "WARN", ("validate",), calls),
    )
    report = run_bringup(_config(tmp_path), steps=steps)
    assert calls == ["validate", "soak"]
    assert (
        _outcomes(report)[1].verdict == "SKIP" and "does not apply: single-model package" in _outcomes(report)[1].detail
    )
    assert report.verdict == "WARN" and report.exit_code == 0


def test_a_step_that_raised_is_recorded_with_its_words_code_and_the_other_steps_are_kept(tmp_path: Path) -> None:
    def raising(name: str, exc: Exception) -> BringupStep:
        def run(state: object) -> StepOutcome:
            raise exc

        return BringupStep(name, (), run)

    steps = (
        _step("a", "PASS"),
        raising("device", CcuException("chip 0 halted")),
        # mid-run, a file the step reads vanished: ERROR naming it (exit 2 is for a call refused up front)
        raising("input", UsageError("pkgc: no such file or directory")),
        raising("output", FileExistsError(17, "File exists", "rep/soak")),
        raising("bug", ZeroDivisionError("float division by zero")),
        _step("z", "PASS"),
    )
    report = run_bringup(_config(tmp_path), steps=steps)
    got = {s.name: (s.verdict, s.exit_code, s.detail) for s in _outcomes(report)}
    assert got["device"][:2] == ("ERROR", 3) and "chip 0 halted" in got["device"][2]
    assert got["input"][:2] == ("ERROR", 3) and got["input"][2].startswith(
        "pkgc: no such file"
    )  # no class name (#53 item 7)
    assert got["output"][:2] == ("ERROR", 3) and got["output"][2] == "rep/soak: File exists"
    assert got["bug"][:2] == ("INTERNAL ERROR", 70) and "ZeroDivisionError" in got["bug"][2]
    assert got["z"][0] == "PASS"  # the pipeline went on: nothing measured is lost
    assert report.verdict == "ERROR" and report.exit_code == 3  # the first failing step's word


def test_bringup_timeout_exit_code_and_interrupt_stops_the_pipeline(tmp_path: Path) -> None:
    report = run_bringup(_config(tmp_path), steps=(_step("a", "PASS"), _step("b", "TIMEOUT"), _step("c", "PASS")))
    assert report.verdict == "TIMEOUT" and report.exit_code == 4 and _outcomes(report)[2].verdict == "PASS"
    calls: list[str] = []
    report = run_bringup(
        _config(tmp_path), steps=(_step("a", "RAISE-INT", calls=calls), _step("b", "PASS", calls=calls))
    )
    assert calls == ["a"] and report.exit_code == 130 and report.verdict == "INTERRUPTED"
    skipped = _outcomes(report)[1]
    assert skipped.verdict == "SKIP" and "interrupted" in skipped.detail


def test_a_steps_exit_code_is_its_verdicts_and_the_pipeline_words_a_failed_check_fail(tmp_path: Path) -> None:
    """Bring-up decides verdicts; every exit code is calctl.report.exit_code_of one (docs/cli.md)."""
    codes = {v: StepOutcome("s", v, "", 0.0).exit_code for v in ("PASS", "WARN", "GO", "NO-GO", "S1", "SKIP")}
    assert codes == {"PASS": 0, "WARN": 0, "GO": 0, "NO-GO": 1, "S1": 0, "SKIP": 0}
    assert StepOutcome("poc", "S1", "", 0.0, fail_on=frozenset({"S1"})).exit_code == 1  # the step's own policy
    policy_failed = BringupStep("poc", (), lambda state: StepOutcome("poc", "S1", "", 0.0, fail_on=frozenset({"S1"})))
    report = run_bringup(_config(tmp_path), steps=(policy_failed, _step("z", "ERROR")))
    assert report.verdict == "FAIL" and report.exit_code == 1  # the first failing step: a failed check


def test_a_poc_not_judged_makes_bringup_warn_never_pass(tmp_path: Path) -> None:
    """An undecided gate is not a pass: a PoC NOT JUDGED (its interval straddling after the round budget) left
    bring-up at PASS, "every check passed"."""
    report = run_bringup(_config(tmp_path), steps=(_step("a", "PASS"), _step("poc", "NOT JUDGED")))
    assert report.verdict == "WARN" and report.exit_code == 0
    assert run_bringup(_config(tmp_path), steps=(_step("a", "PASS"), _step("poc", "S2"))).verdict == "PASS"


@pytest.mark.parametrize("verdict, word", [("FAIL", "FAIL"), ("ERROR", "ERROR"), ("TIMEOUT", "TIMEOUT")])
def test_a_board_that_is_not_ready_stops_bringup_with_its_reason_first(tmp_path: Path, verdict: str, word: str) -> None:
    """Issue 51 item 6: nothing is worth running on a board that is not ready (DCGM's level-1 gate)."""
    calls: list[str] = []

    def check(state: object) -> StepOutcome:
        calls.append("device-check")
        return StepOutcome("device-check", verdict, "NOT READY: chip 1", 0.01, "chip 1: wrong answer: model-b")

    steps = (
        BringupStep("device-check", (), check, stops=True),
        _step("validate", "PASS", calls=calls),  # needs nothing: only the stop keeps it from running
        _step("budget", "GO", ("validate",), calls),
    )
    report = run_bringup(_config(tmp_path), steps=steps)
    assert calls == ["device-check"]
    assert report.verdict == word and report.error == "device-check: chip 1: wrong answer: model-b"
    for skipped in _outcomes(report)[1:]:
        assert skipped.verdict == "SKIP" and skipped.detail == f"not run: the board is not ready (device-check {word})"
    assert report.header["package"]["not_validated"].startswith("the board is not ready")
    # the page's first screen: the error (chip and why), then the stopped steps in one line, not one line each
    assert report.reasons == (f"validate, budget not run: the board is not ready (device-check {word})",)


def test_a_ready_board_or_a_failing_step_that_does_not_stop_lets_the_pipeline_go_on(tmp_path: Path) -> None:
    calls: list[str] = []
    ready = BringupStep("device-check", (), lambda state: StepOutcome("device-check", "WARN", "", 0.0), stops=True)
    selftest = BringupStep("selftest", (), lambda state: StepOutcome("selftest", "FAIL", "", 0.0, "memory chip 1"))
    report = run_bringup(_config(tmp_path), steps=(ready, selftest, _step("validate", "PASS", calls=calls)))
    assert calls == ["validate"]  # a self-test FAIL is a FAIL step; the model's steps still run on that board
    assert report.verdict == "FAIL" and report.error == "selftest: memory chip 1"


def test_a_selftest_not_judged_is_reported_and_does_not_turn_the_verdict(tmp_path: Path) -> None:
    """No board profile: the transfer rows are NOT JUDGED with their figures; the pipeline stays PASS (a PoC NOT
    JUDGED still makes it WARN: its gate was undecided)."""

    def not_judged(name: str, warns: bool) -> BringupStep:
        return BringupStep(
            name, (), lambda state: StepOutcome(name, "NOT JUDGED", "8 NOT JUDGED", 0.0), not_judged_warns=warns
        )

    report = run_bringup(_config(tmp_path), steps=(_step("a", "PASS"), not_judged("selftest", False)))
    assert report.verdict == "PASS" and _outcomes(report)[1].verdict == "NOT JUDGED"
    assert run_bringup(_config(tmp_path), steps=(not_judged("poc", True),)).verdict == "WARN"


def test_the_board_steps_come_first_at_their_levels() -> None:
    from calctl.runners import bringup
    from calctl.runners.acceptance.evidence import STEPS as ACCEPT_STEPS

    board_first = ["device-check", "conformance", "selftest", "burn-in", "validate"]
    assert [s.name for s in bringup.STEPS][:5] == board_first
    assert [s.name for s in ACCEPT_STEPS][:5] == board_first
    assert bringup.DEVICE_CHECK.stops and not bringup.SELFTEST_STEP.not_judged_warns
    assert not bringup.BURNIN_STEP.stops and not bringup.BURNIN_STEP.not_judged_warns  # a FAIL: the run goes on
    assert bringup.BURNIN_STEP.needs == ("device-check",)  # a self-test FAIL does not keep the burn-in from running

    def applies(step: BringupStep, level: Level) -> str | None:
        state = BringupState(config=dataclasses.replace(_config(Path(".")), level=level), stack=None)  # type: ignore[arg-type]
        return step.applies(state)

    assert applies(bringup.SELFTEST_STEP, Level.STANDARD) is None and applies(bringup.SELFTEST_STEP, Level.LONG) is None
    quick = applies(bringup.SELFTEST_STEP, Level.QUICK)
    assert quick is not None and "--level standard" in quick and "calctl device selftest" in quick
    assert applies(bringup.BURNIN_STEP, Level.LONG) is None
    for level in (Level.QUICK, Level.STANDARD):
        why = applies(bringup.BURNIN_STEP, level)
        assert why is not None and "runs at --level long" in why and "calctl burn-in --minutes N" in why


def test_the_burn_in_minutes_are_a_level_setting_an_option_overrides() -> None:
    from calctl.runners.acceptance.plan import LEVELS as ACCEPT_LEVELS
    from calctl.runners.acceptance.plan import AcceptConfig
    from calctl.runners.bringup import LEVELS

    assert LEVELS[Level.LONG].burnin_minutes == 10.0 and ACCEPT_LEVELS[Level.LONG].burnin_minutes == 30.0
    assert all(
        LEVELS[lv].burnin_minutes == 0 == ACCEPT_LEVELS[lv].burnin_minutes for lv in (Level.QUICK, Level.STANDARD)
    )
    config = dataclasses.replace(_config(Path(".")), level=Level.LONG)
    assert config.settings.burnin_minutes == 10.0
    assert dataclasses.replace(config, burnin_minutes=0.05).settings.burnin_minutes == 0.05
    assert dataclasses.replace(config, burnin_minutes=0.05).settings.warmup_iterations == 200  # nothing else moves
    accept = AcceptConfig(Path("p"), TrustPolicy(), DeviceSpec(), Level.LONG, Path("o"), burnin_minutes=2.0)
    assert accept.settings.burnin_minutes == 2.0 and accept.settings.soak_hours == 24.0


def _burnin_report(monkeypatch: pytest.MonkeyPatch, verdict: str, rows: list[dict[str, Any]]) -> None:
    import calctl.runners.burnin as burnin

    def fake(device: object, **kwargs: Any) -> Report:
        return Report("burn-in", verdict, {"device": "mock"}, {"minutes": kwargs["minutes"], "rows": rows})

    monkeypatch.setattr(burnin, "run_burnin", fake)


def _row(chip: int, figure: str, status: str, detail: str) -> dict[str, Any]:
    return {"chip": chip, "figure": figure, "status": status, "value": None, "limit": None, "detail": detail}


def test_a_burn_in_with_rows_it_could_not_judge_is_not_judged_and_a_warn_row_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The burn-in's own WARN covers both a figure near its limit and a figure not reported: in a pipeline the
    first is a WARN, the second NOT JUDGED (the figures reported, the verdict not turned)."""
    from calctl.runners.board_steps import run_board_burnin

    _burnin_report(
        monkeypatch,
        "WARN",
        [_row(0, "temperature", "NOT JUDGED", "temperature: not reported by the runtime"), _row(0, "jobs", "PASS", "")],
    )
    r = run_board_burnin(DeviceSpec(), tmp_path, minutes=0.01)
    assert r.verdict == "NOT JUDGED" and r.exit_code == 0
    assert r.detail.startswith("not judged: chip 0 temperature: temperature: not reported by the runtime")
    assert (tmp_path / "burn-in.json").is_file() and r.path == tmp_path / "burn-in.json"
    _burnin_report(
        monkeypatch,
        "WARN",
        [
            _row(1, "power", "WARN", "43 W is within 5% of the limit 45 W"),
            _row(0, "temperature", "NOT JUDGED", "temperature: not reported by the runtime"),
        ],
    )
    r = run_board_burnin(DeviceSpec(), tmp_path, minutes=0.01)
    assert r.verdict == "WARN" and r.detail == "chip 1 power: 43 W is within 5% of the limit 45 W"
    _burnin_report(
        monkeypatch,
        "FAIL",
        [_row(c, "temperature", "FAIL", f"9{c} C is over the limit 85 C") for c in (0, 1)],
    )
    r = run_board_burnin(DeviceSpec(), tmp_path, minutes=0.01)
    assert r.verdict == "FAIL" and r.exit_code == 1  # every failing row, each naming its chip and the limit
    assert (
        r.detail == "chip 0 temperature: 90 C is over the limit 85 C; chip 1 temperature: 91 C is over the limit 85 C"
    )


@pytest.mark.parametrize("where", ["live line", "teardown"])
def test_an_interrupt_between_steps_or_in_the_teardown_still_returns_the_report(tmp_path: Path, where: str) -> None:
    """A SIGTERM that lands after a step returned (the CLI printing its live line) or while the device closes
    once raised out of run_bringup, and bringup exited 130 with no report.json."""
    calls: list[str] = []

    def closing(state: BringupState) -> StepOutcome:
        state.stack.callback(_raise_interrupt)  # the device's teardown is where the signal lands
        return StepOutcome("a", "PASS", "a figure", 0.01)

    def show(o: StepOutcome) -> None:
        if where == "live line" and o.name == "a":
            raise KeyboardInterrupt

    steps = (BringupStep("a", (), closing), _step("b", "PASS", calls=calls), _step("c", "PASS", calls=calls))
    report = run_bringup(_config(tmp_path), steps=steps, on_step=show)
    assert report.verdict == "INTERRUPTED" and report.exit_code == 130
    got = [(s.name, s.verdict) for s in _outcomes(report)]
    if where == "live line":
        assert calls == [] and got == [("a", "PASS"), ("b", "SKIP"), ("c", "SKIP")]
    else:  # every step ran; the teardown after them was interrupted
        assert calls == ["b", "c"] and got == [("a", "PASS"), ("b", "PASS"), ("c", "PASS")]
    assert all("interrupted" in s.detail for s in _outcomes(report) if s.verdict == "SKIP")


def _raise_interrupt() -> None:
    raise KeyboardInterrupt


def test_a_bringup_step_lists_the_common_step_word_and_keeps_its_own_verdict() -> None:
    """bringup's steps said ``"status": "GO"`` / ``"S2"`` where every other command's steps use the step words
    of calctl.report.StepStatus (docs/cli.md); the step's own word is kept as ``verdict``."""
    words = {v: StepOutcome("s", v, "", 0.0).to_dict() for v in ("GO", "S2", "S1", "NOT JUDGED", "NO-GO", "WARN")}
    assert {v: d["status"] for v, d in words.items()} == {
        "GO": "PASS", "S2": "PASS", "S1": "WARN", "NOT JUDGED": "WARN", "NO-GO": "FAIL", "WARN": "WARN",
    }  # fmt: skip
    assert all(d["verdict"] == v for v, d in words.items())
    assert StepOutcome("poc", "S1", "", 0.0, fail_on=frozenset({"S1"})).to_dict()["status"] == "FAIL"
    assert StepOutcome("soak", "SKIP", "", 0.0, "skipped: needs warmup FAIL").to_dict()["status"] == "SKIP"


@pytest.mark.parametrize(
    ("raise_after", "where"),
    [
        ("a", "after a, before b started"),  # the live line of a finished step
        ("b", "after b, the last step"),  # the last step's line, or the teardown
    ],
)
def test_a_signal_between_steps_is_named_in_the_report(tmp_path: Path, raise_after: str, where: str) -> None:
    """A SIGTERM that lands outside every step (the live line, the teardown) interrupts no step, so none is
    INTERRUPTED: the skipped steps and the run's error still name the signal and where it came."""
    from calctl.errors import Interrupted

    def on_step(outcome: StepOutcome) -> None:
        if outcome.name == raise_after:
            raise Interrupted("SIGTERM")

    calls: list[str] = []
    steps = (_step("a", "PASS", calls=calls), _step("b", "PASS", calls=calls), _step("c", "PASS", calls=calls))
    report = run_bringup(_config(tmp_path), steps=steps[:2] if raise_after == "b" else steps, on_step=on_step)
    assert report.verdict == "INTERRUPTED" and report.exit_code == 130
    assert report.error == f"interrupted (SIGTERM) {where}"
    assert not [s for s in _outcomes(report) if s.verdict == "INTERRUPTED"]
    for s in _outcomes(report):
        assert s.verdict == "SKIP" if s.name not in calls else s.verdict == "PASS"
        if s.verdict == "SKIP":
            assert s.detail == f"not run: the pipeline was interrupted (SIGTERM) {where}"


def test_an_interrupt_is_the_reports_error_even_after_a_failed_step(tmp_path: Path) -> None:
    """The run's verdict is INTERRUPTED, so its one line says the signal and where (not an earlier step's FAIL),
    and every step it kept from running says so too, whether the signal came in a step or between two."""
    from calctl.errors import Interrupted

    def interrupted_in(name: str) -> BringupStep:
        def run(state: object) -> StepOutcome:
            raise Interrupted("SIGTERM")

        return BringupStep(name, (), run)

    report = run_bringup(_config(tmp_path), steps=(_step("a", "FAIL"), interrupted_in("b"), _step("c", "PASS")))
    assert report.verdict == "INTERRUPTED" and report.exit_code == 130
    assert report.error == "b: interrupted (SIGTERM)"
    assert _outcomes(report)[2].detail == "not run: the pipeline was interrupted (SIGTERM) in b"

    def on_step(outcome: StepOutcome) -> None:
        if outcome.name == "a":
            raise Interrupted("SIGINT")

    report = run_bringup(_config(tmp_path), steps=(_step("a", "FAIL"), _step("b", "PASS")), on_step=on_step)
    assert report.verdict == "INTERRUPTED" and report.exit_code == 130
    assert report.error == "interrupted (SIGINT, Ctrl-C) after a, before b started"
