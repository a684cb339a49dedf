"""Vendor questions (000 §20, 001 §15.2) answered from the checks' measurements, graded (001 §1).

One row per item of 000 §20 and of 001 §15.2, in the reports' order, each an entry of :data:`ROWS`: the
question, the report section, the checks whose PASS is its evidence and the function that grades it. A row is

* measured through the ABI: its figure and the check that measured it, graded **C0** (measured here),
  **C4** (the interface refused: NOT_SUPPORTED, ALREADY_CONFIGURED) or **C1** (the symbol is there but the
  check failed or did not run, so the behaviour was not shown);
* or "not measurable through ABI 1.x", graded **C3** (it needs the vendor's runtime, compiler or
  documents), with the exact question to put to the vendor in ``ask``.

A row that is partly measurable carries both: the grade of what was measured and ``ask`` for the rest.
A row about timing (chips in parallel, jobs in flight) is never graded from the shim's own time stamps alone:
it names the host-observed figure it also needs (``host``), and when that figure is missing or says otherwise
the row says so and is not C0.
Grades are about the library measured; the reference board's C0 is evidence about the reference board,
never about a Calculet board (docs/runtime.md §5).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from calctl.runtime.conformance.checks_concurrency import IN_FLIGHT_SPEEDUP, PARALLEL_SPEEDUP
from calctl.runtime.conformance.framework import CheckResult, Verdict

NOT_MEASURABLE = "not measurable through ABI 1.x"


@dataclass(frozen=True)
class VendorAnswer:
    question: str
    source: str  # report section and item
    grade: str  # C0 measured here | C1 symbol present, behaviour not shown | C3 needs the vendor | C4 refused
    answer: str
    evidence: str
    ask: str | None = None  # what to ask the vendor (the part the ABI cannot measure); None: fully answered

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Graded:
    """What a row's grading function found: the grade, the answer and the evidence behind it."""

    grade: str
    answer: str
    evidence: str


@dataclass(frozen=True)
class Results:
    """The checks' results by name, as the grading functions read them."""

    by: Mapping[str, CheckResult]

    def passed(self, *names: str) -> bool:
        return all(self.by.get(n) is not None and self.by[n].verdict is Verdict.PASS for n in names)

    def why_not(self, *names: str) -> str:
        parts = []
        for n in names:
            r = self.by.get(n)
            if r is None:
                parts.append(f"check {n} not run")
            elif r.verdict is not Verdict.PASS:
                parts.append(f"check {n} {r.verdict.value}")
        return "; ".join(parts) or "shown"

    def ev(self, name: str, key: str, default: Any = None) -> Any:
        r = self.by.get(name)
        return r.evidence.get(key, default) if r is not None else default

    def detail(self, name: str) -> str:
        return self.by[name].detail


@dataclass(frozen=True)
class VendorRow:
    """One vendor question: where it is asked, what to ask the vendor, and how the checks answer it.

    ``needs``: the checks whose PASS is the row's evidence; when one did not pass the row is C1 "not shown"
    naming ``symbol`` and the check, and ``grade`` is not called. ``host``: the host-observed figures (check,
    evidence key) a timing row needs beside the shim's stamps."""

    question: str
    source: str
    grade: Callable[[Results], Graded]
    ask: str | None = None
    needs: tuple[str, ...] = ()
    symbol: str = ""
    host: tuple[tuple[str, str], ...] = ()

    def answer(self, r: Results) -> VendorAnswer:
        if self.needs and not r.passed(*self.needs):
            graded = Graded("C1", "not shown", f"{self.symbol} present; {r.why_not(*self.needs)}")
        else:
            graded = self.grade(r)
        unseen = [f"{check}.{key}" for check, key in self.host if r.ev(check, key) is None]
        if graded.grade == "C0" and unseen:  # a timing row's stamps alone never grade C0
            graded = Graded(
                "C1", f"{graded.answer}; not confirmed by the host ({', '.join(unseen)} missing)", graded.evidence
            )
        return VendorAnswer(self.question, self.source, graded.grade, graded.answer, graded.evidence, self.ask)


def vendor_questions(results: Sequence[CheckResult]) -> list[VendorAnswer]:
    r = Results({x.name: x for x in results})
    return [row.answer(r) for row in ROWS]


def _agreement(stamps: bool, speedup: Any, claim: str, bursts: str, threshold: float) -> tuple[str, bool]:
    """A row's claim from the shim's own time stamps, with the host-observed speedup of bursts beside it; True
    when the two agree (a shim can stamp a job's start before taking a global lock, so the stamps alone never
    grade C0)."""
    if speedup is None:
        return f"{claim}; not confirmed: the host could not time the bursts", False
    host = float(speedup) >= threshold
    seen = f"the host saw {float(speedup):.2f}x the jobs per second ({bursts})"
    if host == stamps:
        return f"{claim}; {seen}", True
    return f"disagree: {claim} by the shim's time stamps, but {seen}", False


def _not_measurable(why: str) -> Callable[[Results], Graded]:
    return lambda r: Graded("C3", NOT_MEASURABLE, why)


def _fixed(grade: str, answer: str, *details: str) -> Callable[[Results], Graded]:
    """A row whose answer is fixed once its checks passed; its evidence is their details."""
    return lambda r: Graded(grade, answer, "; ".join(r.detail(n) for n in details))


# -- the grading functions of the measured rows --------------------------------------------------------------


def _parallel_text(r: Results) -> tuple[str, bool]:
    ov = float(r.ev("concurrent_submit_two_chips", "overlap_ms", 0.0))
    return _agreement(
        ov > 0,
        r.ev("concurrent_submit_two_chips", "host_speedup"),
        f"chips in parallel: {'yes' if ov > 0 else 'no'} ({ov:.1f} ms of overlap)",
        "both chips against one",
        PARALLEL_SPEEDUP,
    )


def _in_flight(r: Results) -> Graded:
    n = int(r.ev("two_in_flight_one_chip", "max_in_flight", 1))
    one, one_ok = _agreement(
        n == 2,
        r.ev("two_in_flight_one_chip", "host_speedup"),
        f"{n} in flight on one chip" + (" (a PING and a PONG job overlapped)" if n == 2 else ""),
        "PING/PONG alternating against AUTO",
        IN_FLIGHT_SPEEDUP,
    )
    two, two_ok = _parallel_text(r)
    return Graded(
        "C0" if one_ok and two_ok else "C1",
        f"{one}; {two}",
        f"{r.detail('two_in_flight_one_chip')}; {r.detail('concurrent_submit_two_chips')}",
    )


def _parallel(r: Results) -> Graded:
    ov = float(r.ev("concurrent_submit_two_chips", "overlap_ms", 0.0))
    text, agreed = _parallel_text(r)
    if agreed:
        text = ("yes" if ov > 0 else "no: the chips' job intervals never overlapped (serialised, S1 at best)") + (
            text.removeprefix(f"chips in parallel: {'yes' if ov > 0 else 'no'}")
        )
    return Graded("C0" if agreed else "C1", text, r.detail("concurrent_submit_two_chips"))


def _identity(r: Results) -> Graded:
    board = r.ev("versions_topology", "board")
    kind = r.ev("versions_topology", "device_kind")
    if board or kind == "software model":
        what = f"the shim reports board {board!r}" if board else "the shim reports a software model (no board)"
        detail = r.detail("versions_topology") if "versions_topology" in r.by else ""
        return Graded("C0", what + " (calrt_ext_device_identity); selecting a board is not in ABI 1.x", detail)
    return Graded(
        "C3",
        NOT_MEASURABLE,
        "no ABI 1.x function reports which board was opened (the library exports no calrt_ext_device_identity)",
    )


def _threads(r: Results) -> Graded:
    at_once = r.ev("concurrent_submit_two_chips", "inside_at_once")
    submits = r.ev("concurrent_submit_two_chips", "submit_at_once")
    jobs = r.ev("concurrent_submit_two_chips", "jobs")
    figure = f"yes for {jobs} jobs from several threads, every output its own prompt's"
    if at_once is not None:
        figure += f"; up to {at_once} threads inside the library at once ({submits} inside submit)"
    return Graded("C0", figure, r.detail("concurrent_submit_two_chips"))


def _memory(r: Results) -> Graded:
    counters, figures = r.by.get("memory_counters"), r.by.get("memory_figures")
    if counters is not None and counters.verdict is Verdict.PASS:
        if figures is None or figures.verdict is not Verdict.PASS:
            # the figures were never checked as bytes of their chip (MEM-1, MEM-2): reported, not graded
            return Graded(
                "C1",
                "not shown: calrt_memory_usage answers, but its figures were not shown to be bytes of the chip asked",
                f"calrt_memory_usage present; {r.why_not('memory_figures')}",
            )
        mem = "; ".join(
            f"chip {m['chip']}: {m['baseline_bytes']} B idle, {m['loaded_bytes']} B loaded of {m['total_bytes']} B"
            for m in counters.evidence.get("memory", [])
        )
        return Graded("C0", "DRAM: yes, per chip", mem or counters.detail)
    if counters is not None and counters.verdict is Verdict.UNSUPPORTED:
        return Graded("C4", "no: NOT_SUPPORTED (calctl shows null, never 0)", counters.detail)
    return Graded("C1", "not shown", f"calrt_memory_usage present; {r.why_not('memory_counters')}")


def _resets(r: Results) -> Graded:
    res = r.by.get("chip_vs_board_reset")
    if res is not None and res.verdict is Verdict.PASS:
        return Graded(
            "C0",
            "chip reset: only its chip's jobs and sequences (emptied), configuration and the other chip kept; board "
            "reset: every sequence gone, configuration dropped",
            res.detail,
        )
    if res is not None and res.verdict is Verdict.UNSUPPORTED and res.evidence.get("chip_reset") is False:
        return Graded("C4", "no chip-scoped reset: every fault is board-wide (F0, 001 §11.3)", res.detail)
    why = f"check chip_vs_board_reset {res.verdict.value}" if res is not None else "check chip_vs_board_reset not run"
    return Graded("C1", "not shown", f"calrt_reset present; {why}")


def _load_unload(r: Results) -> Graded:
    cycles = r.ev("memory_counters", "load_cycles", 0)
    return Graded(
        "C4",
        f"no independent per-model unload in ABI 1.x (one current calbin); the whole package loaded and "
        f"unloaded {cycles} times, memory back to baseline each time",
        r.detail("memory_counters"),
    )


def _telemetry(r: Results) -> str:
    rows = [r.by.get(n) for n in ("telemetry_struct", "telemetry_under_load")]
    if all(x is not None and x.verdict is Verdict.PASS for x in rows):
        return "shown (plausible units, monotonic counters, values change under load)"
    if any(x is not None and x.verdict is Verdict.UNSUPPORTED for x in rows):
        return "not exported (C4)"
    return f"not shown ({r.why_not('telemetry_struct', 'telemetry_under_load')})"


def _observability(r: Results) -> Graded:
    counters = r.ev("memory_counters", "counters_reported", False)
    return Graded(
        "C0",
        f"per-chip counters: {'yes' if counters else 'not reported'}; job timestamps on CLOCK_MONOTONIC "
        "(submit <= start <= end within the call window); per-chip telemetry (calrt_chip_telemetry, "
        f"docs/calrt-c-abi.md §15): {_telemetry(r)}",
        r.detail("job_states_timestamps"),
    )


_RESET_ASK = (
    "What exactly does each reset the runtime offers (session, chip, configuration, device) abort, free and "
    "keep: jobs, buffers, KV sequences, the configuration, the other chip's work?"
)

#: Every vendor question, in the reports' order: 000 §20 items 1-6, then 001 §15.2 items 1-10.
ROWS: tuple[VendorRow, ...] = (
    VendorRow(
        "Exact B4/B8/B16 tensor, CSR, inactive-lane mask and KV layout",
        "000 §20 item 1",
        _not_measurable(
            "calctl defines the buffer layout it writes (docs/calrt-c-abi.md §6); whether the vendor's B4/B8/B16 "
            "graphs read exactly that layout is inside the calbin"
        ),
        ask="For each batch profile (B4, B8, B16) of the calbin: the order, dims, dtype and alignment of every "
        "input and output tensor, the CSR fields and their per-lane meaning, what an inactive lane's mask "
        "value does (skipped, computed and discarded, or undefined), and the KV cache layout per lane; with "
        "a golden input/output pair per profile.",
    ),
    VendorRow(
        "Per-profile calbin, golden, capacity, performance and compatibility",
        "000 §20 item 2",
        _not_measurable("a deliverable of the compiler and the vendor's measurements, not a runtime behaviour"),
        ask="For each batch profile: the calbin, its golden data, the maximum sequences and context it holds, "
        "its measured prefill/decode latency and throughput on the board, and the runtime/driver/firmware "
        "versions it is compatible with.",
    ),
    VendorRow(
        "PING/PONG/parallel timing and the most jobs in flight",
        "000 §20 item 3, 000 §14",
        _in_flight,
        ask="Is the in-flight depth measured here a guarantee of the runtime, and what limits it (banks, "
        "queue depth per chip)?",
        needs=("two_in_flight_one_chip", "concurrent_submit_two_chips"),
        symbol="calrt_job_submit(engine)",
        host=(("two_in_flight_one_chip", "host_speedup"), ("concurrent_submit_two_chips", "host_speedup")),
    ),
    VendorRow(
        "A failed batch job: whole job or lane-level, and how far KV is contaminated",
        "000 §20 item 4",
        _fixed(
            "C0",
            "a failed job fails as a whole (one status per job in ABI 1.x); its sequence rolls back; the other "
            "chip keeps working",
            "ccu_fault",
        ),
        ask="When one lane of a batch job faults, does the whole job fail or only that lane? Which KV "
        "sequences can hold partly written K/V afterwards: that lane's, every lane's of the job, or other "
        "jobs' on the same chip? (ABI 1.x has one status per job, so lane-level failure is "
        f"{NOT_MEASURABLE}.)",
        needs=("ccu_fault",),
        symbol="calrt_job_wait",
    ),
    VendorRow(
        "Several resident calbins",
        "000 §20 item 5, 001 §2.4",
        _fixed("C4", "no: one current calbin; a second configure is ALREADY_CONFIGURED", "configuration"),
        ask="Will a runtime release hold several calbins resident and run jobs of each (an API for it, or "
        "only a combined calbin)?",
        needs=("configuration",),
        symbol="calrt_configure",
    ),
    VendorRow(
        "Chip affinity: does a job run on the chip its graph targets?",
        "000 §20 item 5, 001 §15.2 item 1",
        _fixed(
            "C0",
            "yes: the chip mask the shim echoes for a job is its graph's, and each chip's counters count its own jobs",
            "job_states_timestamps",
        ),
        ask="How does CalbinModel's chip target (tarChipN/chipMask) drive configure and SubmitJob in the "
        "runtime, and is it the only thing that decides where a job runs?",
        needs=("job_states_timestamps", "memory_counters"),
        symbol="calrt_job_query",
    ),
    VendorRow("Reset domains: what a chip reset and a board reset affect", "000 §20 item 5", _resets, ask=_RESET_ASK),
    VendorRow(
        "Several physical devices: versions, API, device selection",
        "000 §20 item 6, 000 §3",
        _identity,
        ask="How does a process choose among several boards after 0.7.6 (an API, or the CALRT_DEVICE variable "
        "calctl passes), from which runtime/driver/firmware versions, and does calrt_device_open of a board "
        "another process holds return DEVICE_IN_USE?",
    ),
    VendorRow(
        "How the CalbinModel chip target drives configure and SubmitJob",
        "001 §15.2 item 1",
        _fixed(
            "C0",
            "submit has no chip argument; the job ran on its graph's chip (chip mask echoed by query and wait)",
            "job_states_timestamps",
        ),
        ask="What does configure do with each CalbinModel's chip target (placement, memory plan), and does "
        "SubmitJob ever schedule a SCHIP model on another chip?",
        needs=("job_states_timestamps",),
        symbol="calrt_job_submit",
    ),
    VendorRow(
        "Do two SCHIP models of one calbin execute at the same time?",
        "001 §15.2 item 2",
        _parallel,
        ask="Provide the official minimal runner that runs the two models of a combined calbin at once, and "
        "its timeline (trace) on the board.",
        needs=("concurrent_submit_two_chips",),
        symbol="calrt_job_submit",
        host=(("concurrent_submit_two_chips", "host_speedup"),),
    ),
    VendorRow(
        "Are per-chip queue, job id, completion, DMA and sync unit isolated?",
        "001 §15.2 item 3",
        _fixed(
            "C0",
            "queue and completion: a hung or faulted chip leaves the other chip's jobs running and completing, "
            "a later job on the other chip completes first; DMA: a quarantine is released by a reset of its "
            "chip",
            "wait_timeout",
            "ccu_fault",
            "dma_quarantine",
        ),
        ask="Are the sync units (semaphores, barriers) and DMA engines per chip, or shared so that a fault on "
        f"one chip can stall the other? (sync units are {NOT_MEASURABLE}.)",
        needs=("wait_timeout", "ccu_fault", "dma_quarantine", "out_of_order_completion"),
        symbol="calrt_job_wait",
    ),
    VendorRow(
        "Are Submit and Wait from two threads to different chips thread-safe?",
        "001 §15.2 item 4",
        _threads,
        ask="Is concurrent SubmitJob/Wait on different chips guaranteed thread-safe by CalRT 0.7.6 itself, or "
        "must the shim serialise it (001 §20 lists past async and job-id races)?",
        needs=("concurrent_submit_two_chips", "blocked_wait_holds_no_lock"),
        symbol="calrt_job_submit/calrt_job_wait",
    ),
    VendorRow(
        "Per-chip DRAM/SRAM capacity, reserve and query API",
        "001 §15.2 item 5",
        _memory,
        ask="What are each chip's real DRAM and SRAM capacities and the runtime/firmware reserve, and is there a "
        f"per-chip SRAM query? (SRAM is {NOT_MEASURABLE}.)",
    ),
    VendorRow(
        "KV manager namespace per model/session and rollback on failure",
        "001 §15.2 item 6",
        _fixed(
            "C0",
            "one namespace per model; commit only after success, rollback after a failed job",
            "kv_lifecycle",
            "ccu_fault",
        ),
        ask="Does CalRT 0.7.6's KvManager keep sequences of two models apart itself, or must the shim keep "
        "the namespaces; and what is left in a sequence after a failed job (rolled back by the runtime, or "
        "by the caller)?",
        needs=("kv_lifecycle", "ccu_fault"),
        symbol="calrt_kv_*",
    ),
    VendorRow("Exact scope of session/chip/config/device reset", "001 §15.2 item 7", _resets, ask=_RESET_ASK),
    VendorRow(
        "Independent load/unload, or the whole-calbin lifecycle",
        "001 §15.2 item 8",
        _load_unload,
        ask="Can one model of a combined calbin be unloaded and reloaded while the other keeps serving? If "
        "not, what is the official lifecycle of the whole calbin (drain, ResetConfiguration, configure), "
        "how long does it take, and does memory return to baseline?",
        needs=("memory_counters", "configuration"),
        symbol="calrt_reset_configuration",
    ),
    VendorRow(
        "Per-chip trace, counters, temperature, power, frequency; clock domain",
        "001 §15.2 item 9",
        _observability,
        ask="Which per-chip temperature, power, frequency, throttle and reset-count queries does the runtime "
        "have, and in which clock domain are its job timestamps (device clock, or host CLOCK_MONOTONIC)? "
        f"(without the optional calrt_chip_telemetry, telemetry is {NOT_MEASURABLE}.)",
        needs=("memory_counters", "job_states_timestamps"),
        symbol="calrt_chip_counters",
    ),
    VendorRow(
        "Runtime/driver/firmware/compiler/calbin compatibility matrix",
        "001 §15.2 item 10",
        _fixed("C0", "versions reported", "versions_topology"),
        ask="Publish the matrix of runtime, driver, firmware, compiler and calbin versions that work together "
        f"(the matrix itself is {NOT_MEASURABLE}: only the versions of this library are).",
        needs=("versions_topology",),
        symbol="calrt_versions_get",
    ),
)
