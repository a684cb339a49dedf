"""``calctl bench --sweep concurrency|rate``: one model's load swept up a ladder of levels, and its knee.

What ``genai-perf`` and ``perf_analyzer`` call a concurrency (or request-rate) sweep, over the same HTTP client
as the A/B bench (:mod:`calctl.loadgen.http`) and the same per-phase figures
(:func:`calctl.loadgen.metrics.summarize`): for each level, one phase of ``--duration`` seconds,

* ``concurrency``: a closed loop of N clients (``--max-concurrency`` N, every request sent as soon as a slot
  frees), N from ``--sweep-levels`` (default 1, 2, 4, 8, 16, 32);
* ``rate``: an open loop at R requests/s (default 0.5, 1, 2, 4, 8, 16), capped by ``--max-concurrency`` when
  given;

with the prompts of ``--dataset`` (or the synthetic ``--prompt-len``/``--output-len``). Per level: tokens/s,
requests/s, P50/P99 TTFT and TPOT with their sample counts, success rate and, with SLOs, goodput and SLO
attainment.

**The knee** (:func:`find_knee`): with ``--slo-ttft``/``--slo-tpot``, the highest level whose P99 TTFT and
TPOT both meet them and whose requests all succeeded, the most load the server takes within its SLOs; without
SLOs, the last level before throughput stops growing (less than 10 % more tokens/s for the next level) while
P99 TTFT keeps rising, the point past which more load only buys queueing. A level with too few samples for a
P99 (fewer than :data:`MIN_SAMPLES` successes, the gates' P99 rule) can be neither the knee nor the
reason the sweep stops: it is marked "too few samples".

The verdict is MEASURED: a sweep is a measurement, not a gate. The picture draws tokens/s and the P99 latencies
against the level, the SLO lines and the knee. Nothing here starts a server.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from calctl.checks import host
from calctl.errors import UsageError
from calctl.loadgen.http import HttpTarget, run_phase, served_models
from calctl.loadgen.metrics import REFUSALS, ModelStats, refused_all
from calctl.loadgen.workload import PlannedRequest, build_workload
from calctl.runners.bench.base import BenchOptions, Scenario, ScenarioResult, Table, ms_cell
from calctl.runners.bench.gates import MIN_SAMPLES as GATE_SAMPLES
from calctl.runners.plotting import device_label, pyplot, save

Log = Callable[[str], None]

DEFAULT_LEVELS = {"concurrency": (1.0, 2.0, 4.0, 8.0, 16.0, 32.0), "rate": (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)}
MAX_LEVELS = 16
GROWTH = 0.10  # below this relative gain in tokens/s the next level no longer buys throughput
MIN_SAMPLES = GATE_SAMPLES["p99"]  # successes a level needs for its P99 to count (the gates' rule)


@dataclass(frozen=True)
class SweepLevel:
    """One rung of the sweep: its load and what the model delivered under it."""

    level: float
    stats: ModelStats
    planned: int
    host_load: tuple[float, ...]

    @property
    def judged(self) -> bool:
        """Enough successes for a P99 (the gates' rule)."""
        return self.stats.ttft.count >= MIN_SAMPLES

    def document(self) -> dict[str, Any]:
        s = self.stats
        return {
            "level": self.level,
            "planned": self.planned,
            "sent": s.requests,
            "succeeded": s.succeeded,
            "success_rate": s.success_rate,
            "tokens_per_s": s.tokens_per_s,
            "requests_per_s": s.requests_per_s,
            "ttft_p50_s": s.ttft.p50,
            "ttft_p99_s": s.ttft.p99,
            "tpot_p50_s": s.tpot.p50,
            "tpot_p99_s": s.tpot.p99,
            "samples": s.ttft.count,
            "outcomes": dict(s.outcomes),
            "goodput_rps": s.goodput_rps,
            "slo_attainment": s.slo_attainment,
            "enough_samples": self.judged,
            "host_load": [round(x, 2) for x in self.host_load],
        }


@dataclass(frozen=True)
class Knee:
    level: float | None
    reason: str

    def document(self) -> dict[str, Any]:
        return {"level": self.level, "reason": self.reason}


def parse_levels(spec: str | None, sweep: str) -> tuple[float, ...]:
    """``--sweep-levels 1,2,4`` (increasing positive numbers; whole numbers for concurrency) or the default."""
    if spec is None:
        return DEFAULT_LEVELS[sweep]
    try:
        levels = tuple(float(x) for x in spec.split(","))
    except ValueError:
        raise UsageError(f"--sweep-levels {spec!r}: expected increasing numbers, e.g. 1,2,4,8") from None
    if not levels or len(levels) > MAX_LEVELS:
        raise UsageError(f"--sweep-levels {spec!r}: give 1 to {MAX_LEVELS} levels")
    if any(not (0 < x < 1e6) for x in levels) or any(b <= a for a, b in itertools.pairwise(levels)):
        raise UsageError(f"--sweep-levels {spec!r}: expected increasing numbers above 0 and below 1e6")
    if sweep == "concurrency" and any(x != int(x) or x > 4096 for x in levels):
        raise UsageError(f"--sweep-levels {spec!r}: concurrency levels are whole numbers from 1 to 4096")
    return levels


def find_knee(levels: Sequence[SweepLevel], *, slo_ttft: float | None, slo_tpot: float | None) -> Knee:
    """The knee of the sweep (module docstring)."""
    judged = [lv for lv in levels if lv.judged]
    if levels and all(refused_all(lv.stats) for lv in levels):
        return Knee(None, f"every request refused at every level ({_failures(levels)}): not a load problem")
    if not judged:
        if levels and all(lv.stats.succeeded == 0 for lv in levels):
            return Knee(None, f"no request succeeded at any level ({_failures(levels)}): not a load problem")
        return Knee(None, f"no level had {MIN_SAMPLES} successful requests for a P99: lengthen --duration")
    refused_above = next((lv for lv in levels if lv.level > judged[-1].level and refused_all(lv.stats)), None)
    if slo_ttft is not None or slo_tpot is not None:
        within = [lv for lv in judged if _meets(lv, slo_ttft, slo_tpot)]
        if not within:
            return Knee(
                None, f"no level met the SLOs ({_slo_text(slo_ttft, slo_tpot)}); the lowest was {judged[0].level:g}"
            )
        best = within[-1]
        after = [lv for lv in judged if lv.level > best.level]
        why = f"the highest level whose P99 met {_slo_text(slo_ttft, slo_tpot)} with every request served"
        if after:
            why += f"; at {after[0].level:g} " + _miss(after[0], slo_ttft, slo_tpot)
        return Knee(best.level, why)
    for cur, nxt in itertools.pairwise(judged):
        a, b = cur.stats.tokens_per_s or 0.0, nxt.stats.tokens_per_s or 0.0
        rising = (nxt.stats.ttft.p99 or 0.0) > (cur.stats.ttft.p99 or 0.0)
        if a > 0 and b < a * (1 + GROWTH) and rising:
            return Knee(
                cur.level,
                f"{nxt.level:g} gave {b:.1f} tokens/s against {a:.1f} (under {GROWTH:.0%} more) while P99 TTFT rose "
                f"{_ms(cur.stats.ttft.p99)} -> {_ms(nxt.stats.ttft.p99)}",
            )
    if refused_above is not None:
        # Not "extend the levels": the server refused the next level outright.
        return _refused_knee(judged[-1], refused_above)
    return Knee(None, f"throughput still grew at the last level ({judged[-1].level:g}): extend --sweep-levels")


def _refused_knee(last: SweepLevel, refused: SweepLevel) -> Knee:
    """The knee when every request of a level above the last measured one was refused: with 429 alone (the
    server's admission limits) the last level is the most load it took; with 400/404/503 the server stopped
    serving, which is no load figure at all."""
    why = f"at {refused.level:g} {refused_all(refused.stats)}"
    if set(refused.stats.outcomes) == {"capacity"}:
        return Knee(last.level, f"the last level served; {why} (its admission limits)")
    return Knee(None, f"{why}: not a load problem; the last level served was {last.level:g}")


def _failures(levels: Sequence[SweepLevel]) -> str:
    """The outcomes of the requests that did not succeed, over ``levels``: ``87 x 400 (invalid), timeout 2``."""
    counts: dict[str, int] = {}
    for lv in levels:
        for outcome, n in lv.stats.outcomes.items():
            if outcome != "ok":
                counts[outcome] = counts.get(outcome, 0) + n
    return (
        ", ".join(
            f"{v} x {REFUSALS[k]} ({k})" if k in REFUSALS else f"{k} {v}"
            for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
        )
        or "none"
    )


def _meets(lv: SweepLevel, ttft: float | None, tpot: float | None) -> bool:
    s = lv.stats
    if s.succeeded < s.requests:
        return False
    if ttft is not None and (s.ttft.p99 is None or s.ttft.p99 > ttft):
        return False
    return not (tpot is not None and s.tpot.p99 is not None and s.tpot.p99 > tpot)


def _miss(lv: SweepLevel, ttft: float | None, tpot: float | None) -> str:
    s = lv.stats
    if s.succeeded < s.requests:
        return f"{s.requests - s.succeeded} of {s.requests} requests did not succeed"
    if ttft is not None and (s.ttft.p99 is None or s.ttft.p99 > ttft):
        return f"P99 TTFT {_ms(s.ttft.p99)} > {_ms(ttft)}"
    return f"P99 TPOT {_ms(s.tpot.p99)} > {_ms(tpot)}"


def _slo_text(ttft: float | None, tpot: float | None) -> str:
    parts = ([f"TTFT <= {_ms(ttft)}"] if ttft is not None else []) + (
        [f"TPOT <= {_ms(tpot)}"] if tpot is not None else []
    )
    return " and ".join(parts)


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.1f} ms"


def _workload(opts: BenchOptions, sweep: str, level: float) -> list[PlannedRequest]:
    """The requests of one level. Concurrency: every request at offset 0 (a closed loop drains them), as many as
    could run: ``max_requests``. Rate: arrivals at ``level`` requests/s."""
    rate = opts.rate if sweep == "concurrency" else level
    if opts.dataset is not None:
        from calctl.loadgen.dataset import dataset_workload

        planned = dataset_workload(
            opts.dataset,
            seed=opts.seed,
            stream=0,
            rate=rate,
            duration_s=opts.duration_s,
            burstiness=opts.burstiness,
            output=opts.output if opts.output_given else None,
            max_requests=opts.max_requests,
        )
    else:
        planned = build_workload(
            seed=opts.seed,
            stream=0,
            rate=rate,
            duration_s=opts.duration_s,
            burstiness=opts.burstiness,
            prompt=opts.prompt,
            output=opts.output,
            tokens=opts.token_range,
            max_requests=opts.max_requests,
        )
    if sweep == "concurrency":
        planned = [dataclasses.replace(r, offset_s=0.0) for r in planned]
        if opts.dataset is not None and opts.dataset.layout != "trace" and len(planned) < opts.max_requests:
            # a closed loop sends as fast as slots free: plan enough requests to keep N clients busy
            planned = (planned * (opts.max_requests // max(1, len(planned)) + 1))[: opts.max_requests]
    return planned


def run_sweep(opts: BenchOptions, log: Log) -> ScenarioResult:
    sweep = opts.sweep or "concurrency"
    if not opts.url:
        raise UsageError("--sweep drives a running server: give --url (e.g. `calctl serve` on the mock)")
    if len(opts.models) != 1:
        raise UsageError(f"--sweep measures one model: give --models ALIAS (got {len(opts.models)})")
    if opts.dataset is not None and opts.dataset.layout == "trace":
        raise UsageError(
            f"--dataset {opts.dataset.path} is a timed trace: its timestamps fix the arrivals, so no {sweep} level "
            "could change them; sweep a file without timestamps, or replay the trace with the A/B bench"
        )
    target = HttpTarget(opts.url, opts.api_key, opts.temperature, opts.request_timeout_s)
    alias = opts.models[0]
    served = served_models(target)
    if alias not in served:
        raise UsageError(
            f"--models {alias}: not served (ready) at {opts.url}; it serves: {', '.join(served) or 'nothing'}"
        )
    levels: list[SweepLevel] = []
    for level in opts.sweep_levels or DEFAULT_LEVELS[sweep]:
        planned = _workload(opts, sweep, level)
        cap = int(level) if sweep == "concurrency" else opts.max_concurrency
        log(
            f"  concurrency {level:g}: a closed loop of {int(level)} client(s) for {opts.duration_s:g} s"
            if sweep == "concurrency"
            else f"  rate {level:g}/s: {len(planned)} request(s) over {opts.duration_s:g} s"
        )
        load0 = host.load_now()
        phase = run_phase(
            target,
            {alias: planned},
            label=f"{sweep} {level:g}",
            duration_s=opts.duration_s,
            grace_s=opts.grace_s,
            seed=opts.seed,
            max_concurrency=cap,
        )
        stats = phase.stats(alias, planned, slo=opts.slo, duration_s=opts.duration_s)
        levels.append(SweepLevel(level, stats, len(planned), (load0, host.load_now())))
        log(
            f"    {stats.succeeded}/{stats.requests} succeeded, {stats.tokens_per_s or 0:.1f} tokens/s, "
            f"P99 TTFT {_ms(stats.ttft.p99)}, P99 TPOT {_ms(stats.tpot.p99)}"
        )
    knee = find_knee(levels, slo_ttft=opts.slo.ttft_s, slo_tpot=opts.slo.tpot_s)
    plot = opts.out_dir / "bench.png"
    plot_sweep(
        plot, sweep, alias, levels, knee, slo_ttft=opts.slo.ttft_s, slo_tpot=opts.slo.tpot_s, device=opts.target_device
    )
    body = {
        "sweep": sweep,
        "model": alias,
        "dataset": opts.dataset.document() if opts.dataset is not None else None,
        "levels": [lv.document() for lv in levels],
        "knee": knee.document(),
        "slo": {"ttft_s": opts.slo.ttft_s, "tpot_s": opts.slo.tpot_s},
    }
    notes = [f"knee: {sweep} {knee.level:g}: {knee.reason}" if knee.level is not None else f"no knee: {knee.reason}"]
    for lv in levels:  # what the server said to the requests that did not succeed (a 400 is no queueing)
        if refused_all(lv.stats):
            notes.append(f"{sweep} {lv.level:g}: {refused_all(lv.stats)}")
        elif lv.stats.succeeded < lv.stats.requests:
            notes.append(
                f"{sweep} {lv.level:g}: {lv.stats.requests - lv.stats.succeeded} of {lv.stats.requests} requests did "
                f"not succeed ({_failures([lv])})"
            )
    loads = [x for lv in levels for x in lv.host_load]
    if host.saturated(loads):
        notes.append(host.saturation_note(loads, "the sweep"))
    return ScenarioResult(
        "sweep",
        "MEASURED",
        (),
        (_table(sweep, levels, knee),),
        body,
        plot,
        tuple(notes),
        mock_result={"mock": True, "calrt": False}.get(opts.target_device),
    )


def _table(sweep: str, levels: Sequence[SweepLevel], knee: Knee) -> Table:
    rows = tuple(
        (
            f"{lv.level:g}" + (" (knee)" if knee.level == lv.level else ""),
            f"{lv.stats.succeeded}/{lv.stats.requests}",
            f"{lv.stats.tokens_per_s or 0:.1f}",
            ms_cell(lv.stats.ttft.p50),
            ms_cell(lv.stats.ttft.p99),
            ms_cell(lv.stats.tpot.p99),
            "-" if lv.stats.slo_attainment is None else f"{lv.stats.slo_attainment:.0%}",
            "refused all" if refused_all(lv.stats) else "" if lv.judged else "too few samples",
        )
        for lv in levels
    )
    return Table(
        f"{sweep} sweep",
        (sweep, "ok/sent", "tokens/s", "TTFT P50", "TTFT P99", "TPOT P99", "SLO met", "note"),
        rows,
    )


def plot_sweep(
    path: Any,
    sweep: str,
    alias: str,
    levels: Sequence[SweepLevel],
    knee: Knee,
    *,
    slo_ttft: float | None,
    slo_tpot: float | None,
    device: str,
) -> None:
    """Tokens/s against the level (left), P99 TTFT and TPOT against the level with the SLO lines (right); the
    knee a vertical line on both."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = [lv.level for lv in levels]
    few = [lv.level for lv in levels if not lv.judged]
    ax1.plot(x, [lv.stats.tokens_per_s or 0.0 for lv in levels], "o-", color="#1f77b4")
    ax1.set_ylabel("tokens/s (successful requests)")
    ax2.plot(x, [(lv.stats.ttft.p99 or float("nan")) * 1e3 for lv in levels], "o-", color="#ff7f0e", label="P99 TTFT")
    ax2.plot(x, [(lv.stats.tpot.p99 or float("nan")) * 1e3 for lv in levels], "s-", color="#2ca02c", label="P99 TPOT")
    if few:  # hollow grey rings: a P99 of fewer than MIN_SAMPLES successes, shown but never the knee
        ys = [(lv.stats.ttft.p99 or float("nan")) * 1e3 for lv in levels if not lv.judged]
        ax2.plot(few, ys, "o", markersize=11, markerfacecolor="none", color="#7f7f7f", label=f"P99 of < {MIN_SAMPLES}")
    for slo, colour, name in ((slo_ttft, "#ff7f0e", "TTFT SLO"), (slo_tpot, "#2ca02c", "TPOT SLO")):
        if slo is not None:
            ax2.axhline(slo * 1e3, color=colour, linestyle=":", linewidth=1, label=name)
    ax2.set_ylabel("milliseconds")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests" if sweep == "concurrency" else "requests/s")
        ax.grid(True, alpha=0.3)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{v:g}" for v in x])
        ax.minorticks_off()
        if knee.level is not None:
            ax.axvline(knee.level, color="#d62728", linestyle="--", linewidth=1.2, label=f"knee ({knee.level:g})")
    ax2.legend(fontsize=8, loc="upper left")
    ax1.legend(
        ["tokens/s"] + ([f"knee ({knee.level:g})"] if knee.level is not None else []), fontsize=8, loc="upper left"
    )
    fig.suptitle(f"calctl bench --sweep {sweep}: {alias}; {device_label(device)}", fontsize=10)
    save(fig, path)


SWEEP = Scenario(
    "sweep",
    "one model at a ladder of concurrencies or rates (--sweep concurrency|rate): throughput and P99 per level, the knee",
    run_sweep,
    needs_url=True,
    selected_by="--sweep",
    options=(
        "--url",
        "--models",
        "--sweep",
        "--sweep-levels",
        "--dataset",
        "--max-concurrency",
        "--duration",
        "--slo-ttft",
        "--slo-tpot",
    ),
)

__all__ = ["SWEEP", "Knee", "SweepLevel", "find_knee", "parse_levels", "plot_sweep", "run_sweep"]
