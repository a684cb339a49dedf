"""Scenarios ``ab`` (``--mode isolated|joint|all``) and ``interference`` (001 §9.4, §12 Phase 3, §13.2).

``ab`` against a server at ``--url``:

* ``isolated`` – each model of ``--models`` alone, one phase each;
* ``joint`` – all models together, one phase; gate: B's success rate;
* ``all`` – A isolated, B isolated, then A+B joint with the *same* seeded
  workloads, then the 001 §13.2 comparison (:func:`metrics.compare`:
  throughput_efficiency and overlap_ratio with paired bootstrap CIs over
  steady-state windows) and gates (:mod:`gates`): efficiency >= 0.80, the
  overlap CI above 0, each model's P99 TTFT and TPOT within 25 % of isolation,
  B's success rate >= 99.9 % (with whether A was saturated).

``interference``: the four prefill/decode pairs of 001 §9.4, with a
prefill-heavy workload (prompts of 96–192 tokens, one output token: the chip
runs prefill jobs) and a decode-heavy one (prompts of 4–16 tokens, 32–64 output
tokens: the chip runs decode jobs). Each model's two workloads are measured in
isolation once; each pair then runs jointly, and is judged like ``all``: the
observation of 001 §9.4 per pair (TTFT for the prefill side, TPOT for the
decode side) with its P99 degradation, and the pair's efficiency.

Open-loop rates are per model (``--rate``). Whether the overlap and efficiency
figures say anything about concurrency depends on the load: far below each
model's capacity, joint and isolated runs serve the same tokens whatever the
hardware does; near it, a serialising runtime shows (docs/bench.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from calctl.checks import host
from calctl.checks.stats import Percentiles
from calctl.errors import UsageError
from calctl.loadgen.dataset import dataset_workload
from calctl.loadgen.http import HttpTarget, PhaseResult, device_trace, run_phase, served_models
from calctl.loadgen.metrics import (
    Comparison,
    ModelStats,
    compare,
    default_window,
    refused_all,
    saturated,
    window_rates,
)
from calctl.loadgen.workload import LengthDist, PlannedRequest, build_workload
from calctl.runners.bench import gates as G
from calctl.runners.bench.base import (
    BenchOptions,
    Mode,
    Scenario,
    ScenarioInterrupted,
    ScenarioResult,
    Table,
    interrupted_note,
)
from calctl.runners.bench.plot import BarGroup, plot_ab, plot_pairs
from calctl.runners.overlap import Interval, joint_share_in

Log = Callable[[str], None]


def _target(opts: BenchOptions) -> HttpTarget:
    if not opts.url:
        raise UsageError("--url is required: this scenario drives a running server (e.g. `calctl serve`)")
    return HttpTarget(opts.url, opts.api_key, opts.temperature, opts.request_timeout_s)


def _check_models(target: HttpTarget, models: Sequence[str], need: int | None) -> None:
    if need is not None and len(models) != need:
        raise UsageError(f"--models: this mode needs exactly {need} models (A,B), got {len(models)}")
    if not models:
        raise UsageError("--models: name at least one model alias, e.g. --models model-a,model-b")
    served = served_models(target)
    missing = [m for m in models if m not in served]
    if missing:
        raise UsageError(
            f"--models: {', '.join(missing)} not served (ready) at {target.url}; it serves: "
            f"{', '.join(served) or 'nothing'}"
        )


def _workload(
    opts: BenchOptions, stream: int, prompt: LengthDist | None = None, output: LengthDist | None = None
) -> list[PlannedRequest]:
    if opts.dataset is not None and prompt is None:  # --dataset: its prompts (the interference pairs keep theirs)
        return dataset_workload(
            opts.dataset,
            seed=opts.seed,
            stream=stream,
            rate=opts.rate,
            duration_s=opts.duration_s,
            burstiness=opts.burstiness,
            output=output or (opts.output if opts.output_given else None),
            max_requests=opts.max_requests,
        )
    return build_workload(
        seed=opts.seed,
        stream=stream,
        rate=opts.rate,
        duration_s=opts.duration_s,
        burstiness=opts.burstiness,
        prompt=prompt or opts.prompt,
        output=output or opts.output,
        tokens=opts.token_range,
        max_requests=opts.max_requests,
    )


def _phase(
    target: HttpTarget,
    opts: BenchOptions,
    workloads: dict[str, list[PlannedRequest]],
    label: str,
    log: Log,
    kinds: dict[str, str] | None = None,
) -> PhaseResult:
    n = sum(len(w) for w in workloads.values())
    log(f"  phase {label}: {n} request(s) over {opts.duration_s:g} s ({', '.join(workloads)})")
    load0 = host.load_now()
    res = run_phase(
        target,
        workloads,
        label=label,
        duration_s=opts.duration_s,
        grace_s=opts.grace_s,
        seed=opts.seed,
        kinds=kinds,
        max_concurrency=opts.max_concurrency,
    )
    res = dataclasses.replace(res, host_load=(load0, host.load_now()))
    ok = sum(1 for r in res.records if r.ok)
    log(f"    {ok}/{len(res.records)} succeeded in {res.t_end - res.t0:.1f} s")
    return res


def _summary(opts: BenchOptions, alias: str, phase: PhaseResult, workload: Sequence[PlannedRequest]) -> ModelStats:
    return phase.stats(alias, workload, slo=opts.slo, duration_s=opts.duration_s)


def _pn(p: Percentiles, *keys: str) -> str:
    """``4.1 / 9.8 ms (n=17)``: the percentiles asked for, and the sample count they rest on."""
    if p.count == 0:
        return "n/a (n=0)"
    values = " / ".join(_ms_bare(getattr(p, k)) for k in keys)
    return f"{values} ms (n={p.count})"


def _stats_rows(label: str, stats: Sequence[ModelStats]) -> list[tuple[object, ...]]:
    """Latency per model and phase: every percentile with its sample count."""
    return [
        (
            label,
            s.alias,
            f"{s.succeeded}/{s.requests}",
            _pn(s.ttft, "p50", "p99"),
            _pn(s.tpot, "p50", "p99"),
            _pn(s.itl, "p99"),
            _pn(s.e2e, "p99"),
        )
        for s in stats
    ]


def _rate_rows(label: str, stats: Sequence[ModelStats]) -> list[tuple[object, ...]]:
    """Throughput per model and phase."""
    return [
        (
            label,
            s.alias,
            _pct(s.success_rate),
            _num(s.tokens_per_s),
            _num(s.requests_per_s),
            _num(s.goodput_rps),
            "refused all" if refused_all(s) else "yes" if saturated(s) else "no",
        )
        for s in stats
    ]


STATS_COLUMNS = ("phase", "model", "ok/sent", "TTFT P50 / P99", "TPOT P50 / P99", "ITL P99", "E2E P99")
RATE_COLUMNS = ("phase", "model", "success", "tok/s", "req/s", "goodput req/s", "saturated")


def _ms_bare(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.1f}"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2%}"


def _gate_table(gates: Sequence[G.Gate], title: str = "gates (001 §13.2)") -> Table:
    rows = tuple(
        (
            g.name,
            g.rule,
            "n/a" if g.value is None else f"{g.value:.3f}",
            g.verdict,
            "" if g.samples is None else f"{g.samples} (>= {g.min_samples})",
            g.detail,
        )
        for g in gates
    )
    return Table(title, ("gate", "rule", "value", "verdict", "samples", "evidence"), rows)


def _comparison(
    opts: BenchOptions, a_iso: PhaseResult, b_iso: PhaseResult, joint: PhaseResult, a: str, b: str
) -> Comparison:
    w = opts.window_s or default_window(opts.duration_s)

    def rates(phase: PhaseResult, alias: str) -> np.ndarray:
        return window_rates(phase.of(alias), t0=phase.t0, duration_s=opts.duration_s, window_s=w)

    return compare(rates(a_iso, a), rates(b_iso, b), rates(joint, a), rates(joint, b), window_s=w, seed=opts.seed)


def _trace_evidence(target: HttpTarget, phase: PhaseResult) -> G.TraceEvidence:
    """From the server's per-chip trace of the joint phase (same host: CLOCK_MONOTONIC): the share of the less
    busy chip's busy time during which the other chip was busy too, on the device's clock."""
    lo, hi = int(phase.t0 * 1e9), int(phase.t_end * 1e9)
    body = device_trace(target, lo)
    if isinstance(body, str):
        return G.TraceEvidence(None, missing=body)
    intervals = [
        Interval(int(e["chip"]), e["start_ns"] / 1e9, e["end_ns"] / 1e9)
        for e in body["events"]
        if isinstance(e, dict)
        and isinstance(e.get("start_ns"), int)
        and isinstance(e.get("end_ns"), int)
        and e["end_ns"] > lo
        and e["start_ns"] < hi
    ]
    device = str(body.get("device")) if body.get("device") is not None else None
    if not intervals:
        return G.TraceEvidence(
            None,
            device,
            missing="the per-chip trace has no job inside the joint window (run the bench on the serving host: "
            "the window is read on CLOCK_MONOTONIC)",
        )
    return G.TraceEvidence(joint_share_in(intervals, (lo / 1e9, hi / 1e9)), device, len(intervals))


def run_ab(opts: BenchOptions, log: Log) -> ScenarioResult:
    target = _target(opts)
    models = opts.models
    _check_models(target, models, 2 if opts.mode is not Mode.ISOLATED else None)
    workloads = {m: _workload(opts, i) for i, m in enumerate(models)}
    iso: dict[str, PhaseResult] = {}
    stats_iso: dict[str, ModelStats] = {}
    joint: PhaseResult | None = None
    stats_joint: dict[str, ModelStats] = {}
    running = ""
    try:
        if opts.mode in (Mode.ISOLATED, Mode.ALL):
            for m in models:
                running = f"{m} isolated"
                iso[m] = _phase(target, opts, {m: workloads[m]}, running, log)
                stats_iso[m] = _summary(opts, m, iso[m], workloads[m])
        if opts.mode in (Mode.JOINT, Mode.ALL):
            running = "joint"
            joint = _phase(target, opts, workloads, "joint", log)
            stats_joint = {m: _summary(opts, m, joint, workloads[m]) for m in models}
    except KeyboardInterrupt as exc:  # SIGINT/SIGTERM mid-phase: the finished phases and their picture stay
        raise ScenarioInterrupted(exc, _ab_interrupted(opts, exc, running, iso, stats_iso)) from exc
    gates: list[G.Gate] = []
    cmp: Comparison | None = None
    trace: G.TraceEvidence | None = None
    load = G.Load(opts.duration_s, opts.rate)
    if opts.mode is Mode.ALL:
        a, b = models
        assert joint is not None
        cmp = _comparison(opts, iso[a], iso[b], joint, a, b)
        trace = _trace_evidence(target, joint)
        gates += G.concurrency_gates(cmp, trace)
        for m in models:
            gates += G.degradation_gates(stats_iso[m], stats_joint[m], load)
    if opts.mode in (Mode.JOINT, Mode.ALL):
        gates.append(G.b_success_gate(stats_joint[models[0]], stats_joint[models[1]], load))
    loads = [x for p in [*iso.values(), *([joint] if joint else [])] for x in p.host_load]
    if host.saturated(loads):
        gates = G.host_bound(gates, host.saturation_note(loads, "the phases"))
    verdict = G.verdict(gates)
    tables = _ab_tables(stats_iso, stats_joint)
    if gates:
        tables.append(_gate_table(gates))
    plot = opts.out_dir / "bench.png"
    verdicts = {g.name: g.verdict for g in gates}
    plot_ab(
        plot,
        rates=cmp.rates if cmp else None,
        window_s=cmp.window_s if cmp else None,
        bars=_ab_bars(models, stats_iso, stats_joint, verdicts),
        title=f"calctl bench ab --mode {opts.mode.value}: {verdict}",
        device=opts.target_device,
        names=(models[0], models[-1]),
    )
    body = {
        "mode": opts.mode.value,
        "phases": _ab_phases(iso, stats_iso, joint, stats_joint),
        "comparison": cmp.document() if cmp else None,
        "host_load": [round(x, 2) for x in loads],
        "overlap_ratio": cmp.overlap_ratio.as_dict() if cmp else None,
        "throughput_efficiency": cmp.throughput_efficiency.as_dict() if cmp else None,
        "per_chip_trace": (
            {
                "both_busy_fraction": trace.both_busy,
                "device": trace.device,
                "jobs": trace.jobs,
                "missing": trace.missing,
            }
            if trace is not None
            else None
        ),
    }
    notes = _refusal_notes({"isolated": stats_iso, "joint": stats_joint}) + _gate_notes(gates)
    return ScenarioResult(
        "ab",
        verdict,
        tuple(gates),
        tuple(tables),
        body,
        plot,
        tuple(notes),
        mock_result=_mock(opts),
    )


def _ab_tables(stats_iso: dict[str, ModelStats], stats_joint: dict[str, ModelStats]) -> list[Table]:
    rows = [r for m in stats_iso for r in _stats_rows("isolated", [stats_iso[m]])] + _stats_rows(
        "joint", list(stats_joint.values())
    )
    rate_rows = [r for m in stats_iso for r in _rate_rows("isolated", [stats_iso[m]])] + _rate_rows(
        "joint", list(stats_joint.values())
    )
    return [
        Table("latency per model and phase (successful requests; n = samples)", STATS_COLUMNS, tuple(rows)),
        Table("throughput per model and phase", RATE_COLUMNS, tuple(rate_rows)),
    ]


def _ab_bars(
    models: Sequence[str],
    stats_iso: dict[str, ModelStats],
    stats_joint: dict[str, ModelStats],
    verdicts: dict[str, str],
) -> list[BarGroup]:
    bars: list[BarGroup] = []
    for m in models:
        si, sj = stats_iso.get(m), stats_joint.get(m)
        for metric in ("ttft", "tpot"):
            pi = getattr(si, metric) if si else None
            pj = getattr(sj, metric) if sj else None
            bars.append(
                BarGroup(
                    f"{m} {metric.upper()}",
                    pi.p99 if pi else None,
                    pj.p99 if pj else None,
                    pi.count if pi else None,
                    pj.count if pj else None,
                    verdicts.get(f"p99_{metric}_degradation[{m}]"),
                    m,
                )
            )
    return bars


def _ab_phases(
    iso: dict[str, PhaseResult],
    stats_iso: dict[str, ModelStats],
    joint: PhaseResult | None,
    stats_joint: dict[str, ModelStats],
) -> dict[str, object]:
    return {
        **{f"{m} isolated": {"stats": stats_iso[m].document(), "seconds": iso[m].t_end - iso[m].t0} for m in stats_iso},
        **(
            {"joint": {"stats": {m: s.document() for m, s in stats_joint.items()}, "seconds": joint.t_end - joint.t0}}
            if joint is not None and stats_joint
            else {}
        ),
    }


def _ab_interrupted(
    opts: BenchOptions,
    exc: KeyboardInterrupt,
    running: str,
    iso: dict[str, PhaseResult],
    stats_iso: dict[str, ModelStats],
) -> ScenarioResult:
    """The report of an ``ab`` run a signal ended: every finished isolated phase, its table and picture."""
    finished = [f"{m} isolated" for m in stats_iso]
    plot = opts.out_dir / "bench.png"
    plot_ab(
        plot,
        rates=None,
        window_s=None,
        bars=_ab_bars(opts.models, stats_iso, {}, {}),
        title=f"calctl bench ab --mode {opts.mode.value}: INTERRUPTED in {running or 'start-up'}",
        device=opts.target_device,
        names=(opts.models[0], opts.models[-1]),
    )
    body = {
        "mode": opts.mode.value,
        "phases": _ab_phases(iso, stats_iso, None, {}),
        "interrupted_in": running or None,
        "phases_finished": finished,
        "comparison": None,
        "overlap_ratio": None,
        "throughput_efficiency": None,
        "per_chip_trace": None,
    }
    return ScenarioResult(
        "ab",
        "INTERRUPTED",
        tables=tuple(_ab_tables(stats_iso, {})),
        body=body,
        plot=plot,
        notes=(interrupted_note(exc, running, finished),),
        mock_result=_mock(opts),
    )


def _refusal_notes(phases: dict[str, dict[str, ModelStats]]) -> list[str]:
    """A line per phase and model the server refused outright: that is no load result (nor saturation)."""
    return [
        f"{alias} {phase}: {why}: the server refused the load, so this phase measures nothing of serving"
        for phase, stats in phases.items()
        for alias, s in stats.items()
        if (why := refused_all(s)) is not None
    ]


def _gate_notes(gates: Sequence[G.Gate]) -> list[str]:
    return [f"failing gate: {g.name}: {g.full}" for g in G.failing(gates)] + [
        f"not judged: {g.name}: {g.note or g.detail}" for g in G.not_judged(gates)
    ]


def _mock(opts: BenchOptions) -> bool | None:
    return {"mock": True, "calrt": False}.get(opts.target_device)


# ---------------------------------------------------------------------------
# interference (001 §9.4)

PREFILL_HEAVY = ("prefill", LengthDist.parse("uniform:96:192"), LengthDist.parse("1"))
DECODE_HEAVY = ("decode", LengthDist.parse("uniform:4:16"), LengthDist.parse("uniform:32:64"))
#: 001 §9.4: (A's work, B's work, what to watch).
PAIRS = (
    (PREFILL_HEAVY, PREFILL_HEAVY, "DRAM/DMA/power peaks, TTFT"),
    (PREFILL_HEAVY, DECODE_HEAVY, "does a long task slow B's TPOT"),
    (DECODE_HEAVY, PREFILL_HEAVY, "symmetry, shared-queue bias"),
    (DECODE_HEAVY, DECODE_HEAVY, "steady-state throughput, bandwidth"),
)


def run_interference(opts: BenchOptions, log: Log) -> ScenarioResult:
    target = _target(opts)
    _check_models(target, opts.models, 2)
    a, b = opts.models
    work = {
        (m, kind[0]): _workload(opts, i, kind[1], kind[2])
        for i, m in enumerate((a, b))
        for kind in (PREFILL_HEAVY, DECODE_HEAVY)
    }
    iso: dict[tuple[str, str], PhaseResult] = {}
    iso_stats: dict[tuple[str, str], ModelStats] = {}
    rows: list[tuple[object, ...]] = []
    rate_rows: list[tuple[object, ...]] = []
    pair_docs: list[dict[str, object]] = []
    pair_bars: list[tuple[str, list[BarGroup]]] = []
    running = ""
    try:
        for (m, k), wl in work.items():
            running = f"{m} {k}-heavy isolated"
            iso[(m, k)] = _phase(target, opts, {m: wl}, running, log, kinds={m: f"{k}-heavy"})
            iso_stats[(m, k)] = _summary(opts, m, iso[(m, k)], wl)
            rows += _stats_rows(f"{k}-heavy alone", [iso_stats[(m, k)]])
            rate_rows += _rate_rows(f"{k}-heavy alone", [iso_stats[(m, k)]])
        gates = _interference_pairs(opts, target, log, work, iso, iso_stats, rows, rate_rows, pair_docs, pair_bars)
    except KeyboardInterrupt as exc:  # SIGINT/SIGTERM mid-phase: the finished phases and their picture stay
        running = next((str(d["running"]) for d in pair_docs if "running" in d), running)
        done = [d for d in pair_docs if "running" not in d]
        finished = [f"{m} {k}-heavy isolated" for m, k in iso_stats] + [str(d["pair"]) for d in done]
        plot = opts.out_dir / "bench.png"
        bars = pair_bars or [
            (
                "alone (no pair finished)",
                [
                    BarGroup(f"{m} {k} P99 TTFT", s.ttft.p99, None, s.ttft.count, None, None, m)
                    for (m, k), s in iso_stats.items()
                ],
            )
        ]
        plot_pairs(
            plot,
            bars,
            title=f"calctl bench interference: INTERRUPTED in {running or 'start-up'}",
            device=opts.target_device,
        )
        partial = ScenarioResult(
            "interference",
            "INTERRUPTED",
            tables=(
                Table("interference (001 §9.4): latency of the finished phases", STATS_COLUMNS, tuple(rows)),
                Table("interference (001 §9.4): throughput of the finished phases", RATE_COLUMNS, tuple(rate_rows)),
            ),
            body={
                "pairs": done,
                "alone": {f"{m} {k}-heavy": s.document() for (m, k), s in iso_stats.items()},
                "interrupted_in": running or None,
                "phases_finished": finished,
            },
            plot=plot,
            notes=(interrupted_note(exc, running, finished),),
            mock_result=_mock(opts),
        )
        raise ScenarioInterrupted(exc, partial) from exc
    verdict = G.verdict(gates)
    plot = opts.out_dir / "bench.png"
    plot_pairs(plot, pair_bars, title=f"calctl bench interference (001 §9.4): {verdict}", device=opts.target_device)
    tables = (
        Table("interference (001 §9.4): latency, each workload alone then each pair joint", STATS_COLUMNS, tuple(rows)),
        Table("interference (001 §9.4): throughput", RATE_COLUMNS, tuple(rate_rows)),
        _gate_table(gates, "interference pairs (001 §9.4), judged by the 001 §13.2 rules"),
    )
    notes = _gate_notes(gates)
    body = {
        "pairs": pair_docs,
        "workloads": {
            "prefill-heavy": {"prompt": PREFILL_HEAVY[1].spec, "output": PREFILL_HEAVY[2].spec},
            "decode-heavy": {"prompt": DECODE_HEAVY[1].spec, "output": DECODE_HEAVY[2].spec},
        },
    }
    return ScenarioResult(
        "interference",
        verdict,
        tuple(gates),
        tables,
        body,
        plot,
        tuple(notes),
        mock_result=_mock(opts),
    )


def _interference_pairs(
    opts: BenchOptions,
    target: HttpTarget,
    log: Log,
    work: dict[tuple[str, str], list[PlannedRequest]],
    iso: dict[tuple[str, str], PhaseResult],
    iso_stats: dict[tuple[str, str], ModelStats],
    rows: list[tuple[object, ...]],
    rate_rows: list[tuple[object, ...]],
    pair_docs: list[dict[str, object]],
    pair_bars: list[tuple[str, list[BarGroup]]],
) -> list[G.Gate]:
    """Each 001 §9.4 pair jointly, appended to ``rows``, ``pair_docs`` and ``pair_bars`` as it finishes (a
    pair still running is a ``{"running": name}`` entry of ``pair_docs``, removed when it ends)."""
    a, b = opts.models
    gates: list[G.Gate] = []
    load = G.Load(opts.duration_s, opts.rate)
    for wa, wb, watch in PAIRS:
        name = f"A {wa[0]} + B {wb[0]}"
        pair_docs.append({"running": name})
        joint = _phase(
            target,
            opts,
            {a: work[(a, wa[0])], b: work[(b, wb[0])]},
            name,
            log,
            kinds={a: f"{wa[0]}-heavy", b: f"{wb[0]}-heavy"},
        )
        loads = [x for p in (iso[(a, wa[0])], iso[(b, wb[0])], joint) for x in p.host_load]
        note = host.saturation_note(loads, f"pair {name}") if host.saturated(loads) else ""

        def judged(gs: list[G.Gate], note: str = note) -> list[G.Gate]:
            return G.host_bound(gs, note) if note else gs

        pair_gates: list[G.Gate] = []
        bars: list[BarGroup] = []
        docs = {}
        for m, w in ((a, wa), (b, wb)):
            si = iso_stats[(m, w[0])]
            sj = _summary(opts, m, joint, work[(m, w[0])])
            # 001 §9.4: the prefill side is watched through TTFT, the decode side through TPOT.
            metric = "ttft" if w[0] == "prefill" else "tpot"
            g = judged([x for x in G.degradation_gates(si, sj, load) if x.name.startswith(f"p99_{metric}")])
            pair_gates += [dataclasses.replace(x, name=f"{name}: {x.name}") for x in g]
            iv, jv = (si.ttft.p99, sj.ttft.p99) if metric == "ttft" else (si.tpot.p99, sj.tpot.p99)
            bars.append(
                BarGroup(
                    f"{m} {metric.upper()}",
                    iv,
                    jv,
                    getattr(si, metric).count,
                    getattr(sj, metric).count,
                    g[0].verdict if g else None,
                    m,
                )
            )
            rows += _stats_rows(f"{name}, joint", [sj])
            rate_rows += _rate_rows(f"{name}, joint", [sj])
            docs[m] = {"work": f"{w[0]}-heavy", "watched": metric, "isolated": si.document(), "joint": sj.document()}
        cmp = _comparison(opts, iso[(a, wa[0])], iso[(b, wb[0])], joint, a, b)
        eff = judged([x for x in G.concurrency_gates(cmp) if x.name == "throughput_efficiency"])
        pair_gates += [dataclasses.replace(x, name=f"{name}: {x.name}") for x in eff]
        gates += pair_gates
        pair_bars.append((name, bars))
        pair_docs.pop()  # the "running" entry
        pair_docs.append(
            {
                "pair": name,
                "observe": watch,
                "models": docs,
                "comparison": cmp.document(),
                "verdict": G.verdict(pair_gates),
            }
        )
    return gates


AB = Scenario(
    "ab",
    "A and B isolated and/or joint per --mode; 001 §13.2 overlap, efficiency, P99 and B-success gates",
    run_ab,
    needs_url=True,
    options=(
        "--url",
        "--models",
        "--mode",
        "--rate",
        "--duration",
        "--burstiness",
        "--prompt-len",
        "--output-len",
        "--slo-ttft",
        "--slo-tpot",
    ),
)
INTERFERENCE = Scenario(
    "interference",
    "the four prefill/decode pairs of 001 §9.4, each isolated vs joint",
    run_interference,
    needs_url=True,
    options=("--url", "--models", "--rate", "--duration", "--burstiness"),
)

__all__ = ["AB", "INTERFERENCE", "PAIRS", "run_ab", "run_interference"]
