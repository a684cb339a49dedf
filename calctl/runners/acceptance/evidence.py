"""The evidence steps of ``calctl accept``: each calls a runner calctl already has and keeps its files.

The evidence comes from the runners calctl already has; this module only
calls them, keeps their files in one report directory and hands their
documents (:class:`~calctl.runners.acceptance.rows.StepEvidence`) to the
judges (:mod:`~calctl.runners.acceptance.judges`):

step              runner                                                  rows
================  =====================================================  ==============
device-check      the board ready? (``calctl device check``)              every row
conformance       the vendor library against every ABI promise            every row
                  (``calctl device conformance``; --device calrt)
selftest          transfers, memory patterns (``calctl device selftest``;  every row
                  standard and long levels)
burn-in           both chips at full load, telemetry against limits       every row
                  (``calctl burn-in``; long level)
validate          static validation (``calctl validate``)                  every row
budget            per-chip capacity plan (``calctl budget``)               G0
load-peak         configure on the device, per-chip memory at load         G0
run-golden        golden of every model (``calctl run-golden``)            G1
replica-golden    golden of the ``--replica`` package's models             G1
poc               the combined PoC, S1/S2 (``calctl poc combined``)        G3
isolation         bench scenario ``isolation`` on the replica package      G2
fault-isolation   bench scenario ``fault-isolation`` (mock only)           G4
executor-modes    bench scenario ``executor-modes``                        M1, M2
batch             bench scenario ``batch``                                 M3
soak              ``calctl soak``: load/unload cycles, mixed traffic       G5, M0, M2, M4
rollback          ``--previous`` -> PKG -> one-call rollback, under traffic  G5, M4
================  =====================================================  ==============

The board steps come first (:mod:`calctl.runners.board_steps`): a board that
is not ready stops the run at ``device-check`` (every later step SKIP saying
so, every row NOT MEASURED with that reason, the verdict FAIL, or ERROR when
there is no device); a self-test or burn-in FAIL makes the verdict FAIL and
the run goes on; a self-test or burn-in NOT JUDGED (no board profile, a figure
the runtime does not report) is reported as such.

A step that does not apply (no replica package, ``--device calrt`` for a
mock-only scenario, a row not asked for with ``--only``) is SKIP with the
reason and what would make it apply; a step that raises is ERROR with the
error; Ctrl-C/SIGTERM makes the current and every later step INTERRUPTED. A
step that ran is PASS, WARN or FAIL by its own report's verdict
(:func:`~calctl.runners.acceptance.rows.ran_status`): the step words of every
report (:class:`calctl.report.StepStatus`), the why in ``detail``.

It judges nothing and writes no report: :mod:`~calctl.runners.acceptance.run`
runs the steps in order and checkpoints ``report.json``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from calctl import records
from calctl.errors import CalctlError, ExitCode, Interrupted, UsageError, reason_of
from calctl.report import RESERVED, Report, StepStatus, build_header
from calctl.runners import board_steps, bringup
from calctl.runners.acceptance.plan import ROW_IDS, AcceptConfig
from calctl.runners.acceptance.rows import StepEvidence, ran_status
from calctl.runners.context import RunContext
from calctl.runners.steps import outcome_of


@dataclass
class AcceptState:
    config: AcceptConfig
    stack: ExitStack
    main: bringup.BringupState | None = None  # the main package, validated and loaded
    replica: bringup.BringupState | None = None
    steps: dict[str, StepEvidence] = field(default_factory=dict)
    log: Callable[[str], None] = lambda line: None
    telemetry_mark: int = 0  # calctl.runners.telemetry.mark() when the run started: the devices it opened

    @property
    def out(self) -> Path:
        return self.config.out_dir

    def rel(self, path: str | Path | None) -> str | None:
        """A path relative to the report directory (the form row files take), or None."""
        if path is None:
            return None
        p = Path(path)
        try:
            return str(p.resolve().relative_to(self.out.resolve()))
        except ValueError:
            return str(p)

    def files(self, **paths: str | Path | None) -> dict[str, str]:
        return {k: r for k, v in paths.items() if (r := self.rel(v)) is not None}

    def two_model(self, why: str, how: str) -> tuple[Path, bringup.BringupState]:
        """The package with two models (one per chip): the main one if it has them, else the replica;
        neither: the step is SKIP saying ``why`` and ``how``."""
        for st in (self.main, self.replica):
            if st is not None and st.package is not None and len(st.package.models) == 2:
                return st.config.package, st
        raise Skip(why, how)

    def replica_pkg(self, why: str, how: str) -> Path:
        """The replica package (one model on both chips), the main one or ``--replica``; neither: SKIP."""
        for st in (self.main, self.replica):
            if st is not None and st.package is not None and st.package.kind == "replica":
                return st.config.package
        if self.replica is not None:  # one was given: the validate-replica step refused it (its ERROR says why)
            raise Skip(
                f"{why.split(' and ')[0]}: --replica {self.config.replica} was refused by the validate-replica step",
                "fix what validate-replica names (`calctl validate` lists every finding), then run accept again",
            )
        raise Skip(why, how)


class Skip(Exception):
    """A step that does not apply: SKIP with this reason (and, optionally, what would make it apply)."""

    def __init__(self, reason: str, how: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.how = how


@dataclass(frozen=True)
class Step:
    name: str
    rows: tuple[str, ...]
    run: Callable[[AcceptState], StepEvidence]


# ---------------------------------------------------------------------------
# The steps


def _bringup_state(cfg: AcceptConfig, package: Path, out: Path) -> bringup.BringupState:
    bcfg = bringup.BringupConfig(
        package=package, trust=cfg.trust, device=cfg.device, level=bringup.Level.QUICK, out_dir=out, command="accept"
    )
    return bringup.BringupState(config=bcfg, stack=ExitStack())


def _board_evidence(state: AcceptState, r: board_steps.BoardStepResult) -> StepEvidence:
    """A board step as evidence: its own report's verdict as the step word (NOT JUDGED: WARN, its detail says
    the figures were not judged), its report kept beside the others. A board step the signal interrupted (its
    runner reports INTERRUPTED rather than raising) ends the whole run, as for the other runners."""
    if r.verdict == "INTERRUPTED":
        raise Interrupted("SIGTERM" if "SIGTERM" in f"{r.detail} {r.document.get('error')}" else "SIGINT")
    status = StepStatus.ERROR if r.exit_code not in (0, int(ExitCode.FAILED)) else ran_status(r.verdict)
    document = {**r.document, "exit_code": r.exit_code}
    return StepEvidence(
        r.name,
        status,
        r.seconds,
        r.key_figure if r.verdict == status.value else f"{r.verdict}: {r.key_figure}",
        r.detail,
        document=document,
        files=state.files(report=r.path, plot=r.plot),
    )


def step_device_check(state: AcceptState) -> StepEvidence:
    """``calctl device check`` first: a board that is not ready stops the run (:mod:`calctl.runners.acceptance.run`)."""
    cfg = state.config
    return _board_evidence(
        state, board_steps.run_check(cfg.device, state.out, step_timeout_s=cfg.settings.step_timeout_s)
    )


def _at_its_level(state: AcceptState, skip_reason: Callable[[str], str | None], how: str) -> None:
    """A board step the run's level does not run (the self-test at quick, the burn-in below long) is a SKIP
    saying how to run it."""
    why = skip_reason(state.config.level.value)
    if why is not None:
        raise Skip(why, how)


def step_conformance(state: AcceptState) -> StepEvidence:
    cfg = state.config
    why = board_steps.conformance_skip_reason(cfg.device)
    if why is not None:
        raise Skip(why, board_steps.CONFORMANCE_HOW)
    return _board_evidence(state, board_steps.run_board_conformance(cfg.device, state.out, level=cfg.level.value))


def step_selftest(state: AcceptState) -> StepEvidence:
    cfg = state.config
    _at_its_level(state, board_steps.selftest_skip_reason, board_steps.SELFTEST_HOW)
    return _board_evidence(
        state, board_steps.run_board_selftest(cfg.device, state.out, board_profile=cfg.board_profile, seed=cfg.seed)
    )


def step_burnin(state: AcceptState) -> StepEvidence:
    cfg = state.config
    _at_its_level(state, board_steps.burnin_skip_reason, board_steps.BURNIN_HOW)
    return _board_evidence(
        state,
        board_steps.run_board_burnin(
            cfg.device, state.out, minutes=cfg.settings.burnin_minutes, board_profile=cfg.board_profile
        ),
    )


def _write_report(path: Path, step: str, st: bringup.BringupState, o: bringup.StepOutcome) -> None:
    """A step's own file: one report like every other (``verdict``, ``exit_code``, the header; report/v1)."""
    command = f"accept {step}"
    header = build_header(command, package=str(st.config.package))
    own = {k: v for k, v in (o.document or {}).items() if k not in RESERVED}
    records.write_json(path, Report(command, o.verdict, header, own).document())


def _validate_one(state: AcceptState, st: bringup.BringupState, name: str) -> StepEvidence:
    o = bringup.VALIDATE.run(st)
    state.stack.enter_context(st.stack)
    path = state.out / f"{name}.json"
    _write_report(path, name, st, o)
    refused = o.exit_code != 0
    return StepEvidence(
        name,
        StepStatus.ERROR if refused else ran_status(o.verdict),
        o.seconds,
        o.key_figure,
        f"the package failed validation: {o.detail}" if refused else o.detail if o.verdict == StepStatus.WARN else "",
        document=o.document or {},
        files=state.files(report=path),
    )


def step_validate(state: AcceptState) -> StepEvidence:
    state.main = _bringup_state(state.config, state.config.package, state.out)
    ev = _validate_one(state, state.main, "validate")
    if not ev.ran:
        state.main.package = None
    return ev


def step_validate_replica(state: AcceptState) -> StepEvidence:
    cfg = state.config
    if cfg.replica is None:
        raise Skip("no --replica package given")
    state.replica = _bringup_state(cfg, cfg.replica, state.out / "replica")
    ev = _validate_one(state, state.replica, "validate-replica")
    if ev.ran and state.replica.package is not None and state.replica.package.kind != "replica":
        state.replica.package = None
        return replace(
            ev,
            status=StepStatus.ERROR,
            detail=f"--replica {cfg.replica}: the package is not a replica package (one model on both chips)",
        )
    return ev


def _need_main(state: AcceptState) -> bringup.BringupState:
    if state.main is None or state.main.package is None:
        raise Skip("the package did not pass validation")
    return state.main


def step_budget(state: AcceptState) -> StepEvidence:
    st = _need_main(state)
    o = bringup.BUDGET.run(st)
    path = state.out / "budget.json"
    _write_report(path, "budget", st, o)
    status = ran_status(o.verdict)
    return StepEvidence(
        "budget",
        status,
        o.seconds,
        _prefixed(o.verdict, o.key_figure),
        o.detail if status is not StepStatus.PASS else "",
        document=o.document or {},
        files=state.files(budget=path),
    )


def step_load_peak(state: AcceptState) -> StepEvidence:
    """Configure the package on the device and read each chip's memory while it is loaded (001 §8.4)."""
    _need_main(state)
    cfg = state.config
    t0 = time.perf_counter()
    with RunContext(cfg.package, trust=cfg.trust, device=cfg.device) as ctx:
        ctx.prepare()
        assert ctx.rt is not None
        try:
            mem = [
                {"chip": m.chip, "used_bytes": m.used_bytes, "total_bytes": m.total_bytes}
                for m in ctx.rt.memory_usage()
            ]
        except CalctlError as exc:
            mem = []
            note = f"memory_usage failed: {exc}"
        else:
            note = "per-chip device memory while the package is configured (GetMemoryUsage)"
        header = ctx.header("accept load-peak")
    body = {
        "chips": mem,
        "before": ctx.snapshot.memory_before,
        "after": ctx.snapshot.memory_after,
        "memory_note": note,  # "note" is the header's MOCK RESULT label (docs/runtime.md §5): never overwritten
        "actions": [r.name + ": " + r.status.value for r in ctx.log.records],
    }
    doc = Report("accept load-peak", "PASS" if mem else "WARN", header, body).document()  # as its step says
    path = state.out / "load-peak.json"
    records.write_json(path, doc)
    figure = ", ".join(
        f"chip {m['chip']} " + ("n/a" if m["used_bytes"] is None else f"{m['used_bytes'] / 2**20:.0f} MiB") for m in mem
    )
    # a board that does not report its memory: the step ran, and says so (G0 is NOT MEASURED)
    status, seconds = (StepStatus.PASS if mem else StepStatus.WARN), time.perf_counter() - t0
    return StepEvidence("load-peak", status, seconds, figure, "" if mem else note, doc, state.files(report=path))


def _golden(state: AcceptState, st: bringup.BringupState, name: str) -> StepEvidence:
    o = bringup.GOLDEN.run(st)
    _raise_if_interrupted(o)
    pkg = st.package
    assert pkg is not None
    doc: dict[str, Any] = records.to_jsonable(o.document or {})
    per_model = [
        {
            "alias": r["alias"],
            "ok": r["ok"],
            "reason": r.get("reason"),
            "chips": list(pkg.model(r["alias"]).target_chips),
        }
        for r in doc.get("models", [])
    ]
    doc = {**doc, "per_model": per_model, "package_name": pkg.name}
    path = st.config.out_dir / f"{o.name}.json"
    records.write_json(path, doc)
    return _ran(state, name, o, doc, path, failed=o.exit_code not in (0, int(ExitCode.FAILED)), figure=o.key_figure)


def step_golden(state: AcceptState) -> StepEvidence:
    return _golden(state, _need_main(state), "run-golden")


def step_replica_golden(state: AcceptState) -> StepEvidence:
    if state.replica is None or state.replica.package is None:
        raise Skip("no valid --replica package", "`--replica PKG`")
    return _golden(state, state.replica, "replica-golden")


def step_poc(state: AcceptState) -> StepEvidence:
    _need_main(state)
    _, st = state.two_model(
        "the PoC needs a combined or replica package (two models, one per chip)",
        "`calctl sample-package --kind combined ...` as PKG, or `--replica PKG`",
    )
    st.config = replace(st.config, level=state.config.level)
    o = bringup.POC.run(st)
    _raise_if_interrupted(o)
    doc: dict[str, Any] = records.to_jsonable(o.document or {})
    path = st.config.out_dir / "poc.json"
    records.write_json(path, doc)
    failed = o.verdict not in ("S1", "S2", "NOT JUDGED", "FAIL")
    return _ran(state, "poc", o, doc, path, failed=failed, figure=_prefixed(o.verdict, o.key_figure))


def _ran(
    state: AcceptState, name: str, o: bringup.StepOutcome, doc: dict[str, Any], path: Path, *, failed: bool, figure: str
) -> StepEvidence:
    """A bring-up step's outcome as evidence: ERROR with its detail when it could not run (``failed``), else its
    verdict as the step word, its report, trace and picture kept."""
    if failed:
        return StepEvidence(name, StepStatus.ERROR, o.seconds, o.key_figure, o.detail, doc, state.files(report=path))
    files = state.files(report=path, trace=o.files.get("json"), plot=o.files.get("plot"))
    status = ran_status(o.verdict)
    return StepEvidence(name, status, o.seconds, figure, o.detail if status is not StepStatus.PASS else "", doc, files)


def _prefixed(verdict: str | None, figure: str) -> str:
    """``VERDICT: figure``, without saying the verdict twice when the figure already starts with it."""
    if not verdict or figure.startswith(f"{verdict}:") or figure == verdict:
        return figure
    return f"{verdict}: {figure}"


def _raise_if_interrupted(o: bringup.StepOutcome) -> None:
    """The runners turn Ctrl-C into an INTERRUPTED report; here it ends the whole acceptance run."""
    if o.verdict == "INTERRUPTED":
        raise Interrupted("SIGTERM" if "SIGTERM" in (o.detail or "") else "SIGINT")


def _scenario(state: AcceptState, name: str, package: Path) -> StepEvidence:
    """Run bench scenario ``name`` in-process; its report and picture go to ``<report>/<name>/``."""
    from calctl.runners.bench.base import BenchOptions
    from calctl.runners.bench.bench_report import scenario_report
    from calctl.runners.bench.scenarios import SCENARIOS

    cfg = state.config
    scenario = SCENARIOS.get(name)
    if scenario is None:
        raise Skip(f"this calctl has no bench scenario {name!r}")
    out = state.out / name
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    opts = BenchOptions(
        out_dir=out,
        package=package,
        trust=cfg.trust,
        device=cfg.device,
        seed=cfg.seed,
        rounds=cfg.settings.executor_rounds if name == "executor-modes" else None,
        max_rounds=(cfg.settings.executor_max_rounds or None) if name == "executor-modes" else None,
    )
    try:
        result = scenario.run(opts, state.log)
    except UsageError as exc:
        raise Skip(f"the {name} scenario cannot run here: {exc}") from None
    doc = scenario_report(
        f"accept {name}",
        result,
        build_header(
            f"accept {name}",
            device=cfg.device.kind.value,
            device_options=cfg.device.describe(),
            mock_result=result.mock_result,
            package=str(package),
            scenario=name,
        ),
    ).document()
    path = out / "bench-report.json"
    records.write_json(path, doc)
    files = state.files(**{**_body_files(result.body), "report": path, "plot": result.plot})
    files = {k: v for k, v in files.items() if (state.out / v).is_file()}  # only what is really there
    summary = f"{result.verdict}" + (f": {result.notes[0]}" if result.notes else "")
    return StepEvidence(name, ran_status(result.verdict), time.perf_counter() - t0, summary, document=doc, files=files)


def _body_files(body: dict[str, Any]) -> dict[str, str]:
    """Files a scenario names in its body: ``files: {label: path}``, and each run's ``trace`` / ``plot``."""
    out: dict[str, str] = {}
    named = body.get("files")
    if isinstance(named, dict):
        out.update({str(k): v for k, v in named.items() if isinstance(v, str)})
    for i, run in enumerate(body.get("runs") or []):
        if isinstance(run, dict):
            out.update({f"run{i}_{k}": run[k] for k in ("trace", "plot") if isinstance(run.get(k), str)})
    return out


def step_isolation(state: AcceptState) -> StepEvidence:
    _need_main(state)
    pkg = state.replica_pkg(
        "G2 needs a replica package (one model on both chips) and none was given",
        "`calctl sample-package --kind replica --key K OUT`, then `calctl accept PKG --replica OUT`",
    )
    return _scenario(state, "isolation", pkg)


def step_fault_isolation(state: AcceptState) -> StepEvidence:
    _need_main(state)
    if not state.config.device.is_mock:
        raise Skip(
            "fault-isolation arms faults with the mock board's fault injection; a board needs the vendor's own",
            "inject faults with the vendor's tools and measure B with `calctl bench --url ... --mode joint`",
        )
    pkg, _ = state.two_model("fault-isolation needs two models, one per chip", "a combined package, or `--replica PKG`")
    return _scenario(state, "fault-isolation", pkg)


def step_executor_modes(state: AcceptState) -> StepEvidence:
    _need_main(state)
    return _scenario(state, "executor-modes", state.config.package)


def step_batch(state: AcceptState) -> StepEvidence:
    """The batch scenario (its KV-fault phase on the mock), with the project's targets M3 judges it against
    (``project_targets``: None without ``--targets``) beside its document."""
    _need_main(state)
    ev = _scenario(state, "batch", state.config.package)
    targets = state.config.targets
    return replace(ev, document={**ev.document, "project_targets": targets.to_dict() if targets else None})


def step_soak(state: AcceptState) -> StepEvidence:
    from calctl.runners.soak import SoakConfig, run_soak

    st = _need_main(state)
    assert st.package is not None
    cfg, s = state.config, state.config.settings
    out = state.out / "soak"
    t0 = time.perf_counter()
    # Accept builds its own soak (the soak knows nothing of accept): the level's cycles or hours, its seconds of
    # traffic a cycle, step timeout and checkpoint interval.
    soak = SoakConfig(
        cfg.package,
        cfg.trust,
        cfg.device,
        out_dir=out,
        hours=s.soak_hours,  # long: 24 h; the shorter levels count cycles
        cycles=s.soak_cycles,
        traffic_seconds=s.soak_traffic_s,
        job_timeout_s=s.step_timeout_s,
        seed=cfg.seed,
        checkpoint_interval_s=s.soak_checkpoint_s,
    )
    report = run_soak(soak)
    doc = {
        **report.document(),
        "decode_profiles": {m.alias: list(m.decode.batch_profiles) for m in st.package.models},
        "executor_mode": "default",
    }
    files_doc = doc.get("files") or {}
    files = state.files(report=out / "soak-report.json", events=out / "events.ndjson", plot=files_doc.get("plot"))
    files = {k: v for k, v in files.items() if (state.out / v).is_file()}
    if doc["status"] == "interrupted":
        what = doc.get("interrupted") or {}
        raise Interrupted(str(what.get("signal") or "SIGINT") if isinstance(what, dict) else "SIGINT")
    summary = (
        f"{doc.get('cycles')} cycles, {float(doc.get('seconds') or 0) / 3600:.2f} h, "
        f"{len(doc['violations'])} violation(s)"
    )
    if doc["status"] in ("finished", "aborted"):
        return StepEvidence("soak", ran_status(report.verdict), time.perf_counter() - t0, summary, "", doc, files)
    # The soak's own error (a BoardLocked naming its holder, a refused package): the row says why, not "error".
    why = doc.get("error") or f"the soak ended {doc['status']}; see soak/events.ndjson"
    doc.setdefault("exit_code", report.exit_code)
    return StepEvidence(
        "soak", StepStatus.ERROR, time.perf_counter() - t0, summary, f"soak {doc['status']}: {why}", doc, files
    )


PREVIOUS_HOW = (
    "`calctl accept PKG --previous OLD_PKG` (OLD_PKG: the version PKG replaces; docs/accept.md, the rollback step)"
)


def step_rollback(state: AcceptState) -> StepEvidence:
    """000 §19 M4 / 001 §17 G5: serve ``--previous``, roll forward to PKG and back in one call, under traffic.

    Without ``--previous`` there is no old version to go back to: SKIP, so G5 and M4 are NOT MEASURED
    saying so (reloading PKG onto itself exercises the mechanism, not a version change)."""
    from calctl.runners.acceptance.rollback import RollbackRun, SamePackage

    _need_main(state)
    cfg = state.config
    if cfg.previous is None:
        raise Skip(
            "no --previous package given: the one-call rollback to the old version was not exercised", PREVIOUS_HOW
        )
    t0 = time.perf_counter()
    run = RollbackRun(
        package=cfg.package,
        previous=cfg.previous,
        device=cfg.device,
        trust=cfg.trust,
        traffic_s=cfg.settings.rollback_traffic_s,
        stage_timeout_s=cfg.settings.step_timeout_s,
        log=state.log,
    )
    try:
        result = run.run()
    except SamePackage as exc:
        raise Skip(f"{exc}: no version change to roll back", PREVIOUS_HOW) from None
    except CalctlError as exc:  # the previous version refused or the board failed: the row says which
        ev = error_evidence("rollback", exc, time.perf_counter() - t0)
        return replace(ev, detail=f"--previous {cfg.previous} -> PKG -> rollback: {ev.detail}")
    ok = result.ok
    detail = (
        "served --previous, rolled forward to PKG and back in one call under traffic; "
        "each version golden + warm-up before publish"
        if ok
        else "; ".join(result.problems[:5])
    )
    doc = Report(
        "accept rollback",
        "PASS" if ok else "FAIL",
        build_header(
            "accept rollback",
            device=cfg.device.kind.value,
            device_options=cfg.device.describe(),
            package=str(cfg.package),
        ),
        {**result.document(), "detail": detail},
    ).document()
    path = state.out / "rollback.json"
    records.write_json(path, doc)
    status, seconds = (StepStatus.PASS if ok else StepStatus.FAIL), time.perf_counter() - t0
    return StepEvidence(
        "rollback", status, seconds, result.summary(), "" if ok else detail, doc, state.files(report=path)
    )


#: The evidence steps, in order. ``rows``: the rows that read the step (``--only`` runs just those).
STEPS: tuple[Step, ...] = (
    Step(board_steps.CHECK, ROW_IDS, step_device_check),
    Step(board_steps.CONFORMANCE, ROW_IDS, step_conformance),
    Step(board_steps.SELFTEST, ROW_IDS, step_selftest),
    Step(board_steps.BURNIN, ROW_IDS, step_burnin),
    Step("validate", ROW_IDS, step_validate),
    Step("validate-replica", ("G1", "G2", "G3", "G4"), step_validate_replica),
    Step("budget", ("G0",), step_budget),
    Step("load-peak", ("G0",), step_load_peak),
    Step("run-golden", ("G1",), step_golden),
    Step("replica-golden", ("G1",), step_replica_golden),
    Step("poc", ("G3",), step_poc),
    Step("isolation", ("G2",), step_isolation),
    Step("fault-isolation", ("G4",), step_fault_isolation),
    Step("executor-modes", ("M1", "M2"), step_executor_modes),
    Step("batch", ("M3",), step_batch),
    Step("soak", ("G5", "M0", "M2", "M4"), step_soak),
    Step("rollback", ("G5", "M4"), step_rollback),
)


# ---------------------------------------------------------------------------
# The run


def error_evidence(name: str, exc: Exception, seconds: float) -> StepEvidence:
    """A step that raised: ERROR with the error and its exit code (a non-calctl error is a calctl bug)."""
    if not isinstance(exc, CalctlError):
        return StepEvidence(
            name,
            StepStatus.ERROR,
            seconds,
            detail=f"internal error (a calctl bug): {type(exc).__name__}: {exc}",
            document={"exit_code": int(ExitCode.INTERNAL), "internal_error": True},
        )
    # The code of the step's word (ERROR 3, TIMEOUT 4, FAIL 1). A usage or input error here came up mid-run
    # (a file the step reads changed or vanished): ERROR too, naming it, so the other rows' evidence is kept.
    code = outcome_of(exc).exit_code
    return StepEvidence(name, StepStatus.ERROR, seconds, detail=reason_of(exc), document={"exit_code": code})


__all__ = [
    "PREVIOUS_HOW",
    "STEPS",
    "AcceptState",
    "Skip",
    "Step",
    "error_evidence",
]
