"""Vendor questions (000 §20, 001 §15.2) answered from the checks' measurements, graded (001 §1).

One row per item of 000 §20 and of 001 §15.2, in the reports' order. A row is

* measured through the ABI: its figure and the check that measured it, graded **C0** (measured here),
  **C4** (the interface refused: NOT_SUPPORTED, ALREADY_CONFIGURED) or **C1** (the symbol is there but the
  check failed or did not run, so the behaviour was not shown);
* or "not measurable through ABI 1.x", graded **C3** (it needs the vendor's runtime, compiler or
  documents), with the exact question to put to the vendor in ``ask``.

A row that is partly measurable carries both: the grade of what was measured and ``ask`` for the rest.
Grades are about the library measured; the reference board's C0 is evidence about the reference board,
never about a Calculet board (docs/runtime.md §5).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def vendor_questions(results: Sequence[CheckResult]) -> list[VendorAnswer]:
    by = {r.name: r for r in results}

    def passed(*names: str) -> bool:
        return all(by.get(n) is not None and by[n].verdict is Verdict.PASS for n in names)

    def why_not(*names: str) -> str:
        parts = []
        for n in names:
            r = by.get(n)
            if r is None:
                parts.append(f"check {n} not run")
            elif r.verdict is not Verdict.PASS:
                parts.append(f"check {n} {r.verdict.value}")
        return "; ".join(parts) or "shown"

    def ev(name: str, key: str, default: Any = None) -> Any:
        r = by.get(name)
        return r.evidence.get(key, default) if r is not None else default

    def measured(
        question: str,
        source: str,
        checks: tuple[str, ...],
        symbol: str,
        answer: Callable[[], tuple[str, str, str]],  # (grade, answer, evidence) when the checks passed
        ask: str | None = None,
    ) -> VendorAnswer:
        if passed(*checks):
            grade, text, evidence = answer()
            return VendorAnswer(question, source, grade, text, evidence, ask)
        return VendorAnswer(question, source, "C1", "not shown", f"{symbol} present; {why_not(*checks)}", ask)

    def unmeasurable(question: str, source: str, why: str, ask: str) -> VendorAnswer:
        return VendorAnswer(question, source, "C3", NOT_MEASURABLE, why, ask)

    out: list[VendorAnswer] = []

    # -- 000 §20 -----------------------------------------------------------------------------------------
    out.append(
        unmeasurable(
            "Exact B4/B8/B16 tensor, CSR, inactive-lane mask and KV layout",
            "000 §20 item 1",
            "calctl defines the buffer layout it writes (docs/calrt-c-abi.md §6); whether the vendor's B4/B8/B16 "
            "graphs read exactly that layout is inside the calbin",
            "For each batch profile (B4, B8, B16) of the calbin: the order, dims, dtype and alignment of every "
            "input and output tensor, the CSR fields and their per-lane meaning, what an inactive lane's mask "
            "value does (skipped, computed and discarded, or undefined), and the KV cache layout per lane; with "
            "a golden input/output pair per profile.",
        )
    )
    out.append(
        unmeasurable(
            "Per-profile calbin, golden, capacity, performance and compatibility",
            "000 §20 item 2",
            "a deliverable of the compiler and the vendor's measurements, not a runtime behaviour",
            "For each batch profile: the calbin, its golden data, the maximum sequences and context it holds, "
            "its measured prefill/decode latency and throughput on the board, and the runtime/driver/firmware "
            "versions it is compatible with.",
        )
    )

    def in_flight() -> tuple[str, str, str]:
        n = int(ev("two_in_flight_one_chip", "max_in_flight", 1))
        one, one_ok = _agreement(
            n == 2,
            ev("two_in_flight_one_chip", "host_speedup"),
            f"{n} in flight on one chip" + (" (a PING and a PONG job overlapped)" if n == 2 else ""),
            "PING/PONG alternating against AUTO",
            IN_FLIGHT_SPEEDUP,
        )
        two, two_ok = _parallel_text()
        return (
            "C0" if one_ok and two_ok else "C1",
            f"{one}; {two}",
            f"{by['two_in_flight_one_chip'].detail}; {by['concurrent_submit_two_chips'].detail}",
        )

    def _parallel_text() -> tuple[str, bool]:
        ov = float(ev("concurrent_submit_two_chips", "overlap_ms", 0.0))
        return _agreement(
            ov > 0,
            ev("concurrent_submit_two_chips", "host_speedup"),
            f"chips in parallel: {'yes' if ov > 0 else 'no'} ({ov:.1f} ms of overlap)",
            "both chips against one",
            PARALLEL_SPEEDUP,
        )

    out.append(
        measured(
            "PING/PONG/parallel timing and the most jobs in flight",
            "000 §20 item 3, 000 §14",
            ("two_in_flight_one_chip", "concurrent_submit_two_chips"),
            "calrt_job_submit(engine)",
            in_flight,
            ask="Is the in-flight depth measured here a guarantee of the runtime, and what limits it (banks, "
            "queue depth per chip)?",
        )
    )
    out.append(
        measured(
            "A failed batch job: whole job or lane-level, and how far KV is contaminated",
            "000 §20 item 4",
            ("ccu_fault",),
            "calrt_job_wait",
            lambda: (
                "C0",
                "a failed job fails as a whole (one status per job in ABI 1.x); its sequence rolls back; the other "
                "chip keeps working",
                by["ccu_fault"].detail,
            ),
            ask="When one lane of a batch job faults, does the whole job fail or only that lane? Which KV "
            "sequences can hold partly written K/V afterwards: that lane's, every lane's of the job, or other "
            "jobs' on the same chip? (ABI 1.x has one status per job, so lane-level failure is "
            f"{NOT_MEASURABLE}.)",
        )
    )
    out.append(
        measured(
            "Several resident calbins",
            "000 §20 item 5, 001 §2.4",
            ("configuration",),
            "calrt_configure",
            lambda: (
                "C4",
                "no: one current calbin; a second configure is ALREADY_CONFIGURED",
                by["configuration"].detail,
            ),
            ask="Will a runtime release hold several calbins resident and run jobs of each (an API for it, or "
            "only a combined calbin)?",
        )
    )
    out.append(
        measured(
            "Chip affinity: does a job run on the chip its graph targets?",
            "000 §20 item 5, 001 §15.2 item 1",
            ("job_states_timestamps", "memory_counters"),
            "calrt_job_query",
            lambda: (
                "C0",
                "yes: the chip mask the shim echoes for a job is its graph's, and each chip's counters count "
                "its own jobs",
                by["job_states_timestamps"].detail,
            ),
            ask="How does CalbinModel's chip target (tarChipN/chipMask) drive configure and SubmitJob in the "
            "runtime, and is it the only thing that decides where a job runs?",
        )
    )
    out.append(_reset_row(by, "Reset domains: what a chip reset and a board reset affect", "000 §20 item 5"))

    def identity_row() -> VendorAnswer:
        board = ev("versions_topology", "board")
        kind = ev("versions_topology", "device_kind")
        ask = (
            "How does a process choose among several boards after 0.7.6 (an API, or the CALRT_DEVICE variable "
            "calctl passes), from which runtime/driver/firmware versions, and does calrt_device_open of a board "
            "another process holds return DEVICE_IN_USE?"
        )
        if board or kind == "software model":
            what = f"the shim reports board {board!r}" if board else "the shim reports a software model (no board)"
            return VendorAnswer(
                "Several physical devices: versions, API, device selection",
                "000 §20 item 6, 000 §3",
                "C0",
                what + " (calrt_ext_device_identity); selecting a board is not in ABI 1.x",
                by["versions_topology"].detail if "versions_topology" in by else "",
                ask,
            )
        return unmeasurable(
            "Several physical devices: versions, API, device selection",
            "000 §20 item 6, 000 §3",
            "no ABI 1.x function reports which board was opened (the library exports no calrt_ext_device_identity)",
            ask,
        )

    out.append(identity_row())

    # -- 001 §15.2 ---------------------------------------------------------------------------------------
    out.append(
        measured(
            "How the CalbinModel chip target drives configure and SubmitJob",
            "001 §15.2 item 1",
            ("job_states_timestamps",),
            "calrt_job_submit",
            lambda: (
                "C0",
                "submit has no chip argument; the job ran on its graph's chip (chip mask echoed by query and wait)",
                by["job_states_timestamps"].detail,
            ),
            ask="What does configure do with each CalbinModel's chip target (placement, memory plan), and does "
            "SubmitJob ever schedule a SCHIP model on another chip?",
        )
    )

    def parallel() -> tuple[str, str, str]:
        ov = float(ev("concurrent_submit_two_chips", "overlap_ms", 0.0))
        text, agreed = _parallel_text()
        if agreed:
            text = ("yes" if ov > 0 else "no: the chips' job intervals never overlapped (serialised, S1 at best)") + (
                text.removeprefix(f"chips in parallel: {'yes' if ov > 0 else 'no'}")
            )
        return "C0" if agreed else "C1", text, by["concurrent_submit_two_chips"].detail

    out.append(
        measured(
            "Do two SCHIP models of one calbin execute at the same time?",
            "001 §15.2 item 2",
            ("concurrent_submit_two_chips",),
            "calrt_job_submit",
            parallel,
            ask="Provide the official minimal runner that runs the two models of a combined calbin at once, and "
            "its timeline (trace) on the board.",
        )
    )
    out.append(
        measured(
            "Are per-chip queue, job id, completion, DMA and sync unit isolated?",
            "001 §15.2 item 3",
            ("wait_timeout", "ccu_fault", "dma_quarantine", "out_of_order_completion"),
            "calrt_job_wait",
            lambda: (
                "C0",
                "queue and completion: a hung or faulted chip leaves the other chip's jobs running and completing, "
                "a later job on the other chip completes first; DMA: a quarantine is released by a reset of its "
                "chip",
                "; ".join(by[n].detail for n in ("wait_timeout", "ccu_fault", "dma_quarantine")),
            ),
            ask="Are the sync units (semaphores, barriers) and DMA engines per chip, or shared so that a fault on "
            f"one chip can stall the other? (sync units are {NOT_MEASURABLE}.)",
        )
    )

    def threads() -> tuple[str, str, str]:
        at_once = ev("concurrent_submit_two_chips", "inside_at_once")
        submits = ev("concurrent_submit_two_chips", "submit_at_once")
        jobs = ev("concurrent_submit_two_chips", "jobs")
        figure = f"yes for {jobs} jobs from several threads, every output its own prompt's"
        if at_once is not None:
            figure += f"; up to {at_once} threads inside the library at once ({submits} inside submit)"
        return "C0", figure, by["concurrent_submit_two_chips"].detail

    out.append(
        measured(
            "Are Submit and Wait from two threads to different chips thread-safe?",
            "001 §15.2 item 4",
            ("concurrent_submit_two_chips", "blocked_wait_holds_no_lock"),
            "calrt_job_submit/calrt_job_wait",
            threads,
            ask="Is concurrent SubmitJob/Wait on different chips guaranteed thread-safe by CalRT 0.7.6 itself, or "
            "must the shim serialise it (001 §20 lists past async and job-id races)?",
        )
    )

    def memory_row() -> VendorAnswer:
        question, source = "Per-chip DRAM/SRAM capacity, reserve and query API", "001 §15.2 item 5"
        ask = (
            "What are each chip's real DRAM and SRAM capacities and the runtime/firmware reserve, and is there a "
            f"per-chip SRAM query? (SRAM is {NOT_MEASURABLE}.)"
        )
        r = by.get("memory_counters")
        figures = by.get("memory_figures")
        if r is not None and r.verdict is Verdict.PASS and (figures is None or figures.verdict is not Verdict.PASS):
            # the figures were never checked as bytes of their chip (MEM-1, MEM-2): reported, not graded
            return VendorAnswer(
                question,
                source,
                "C1",
                "not shown: calrt_memory_usage answers, but its figures were not shown to be bytes of the chip asked",
                f"calrt_memory_usage present; {why_not('memory_figures')}",
                ask,
            )
        if r is not None and r.verdict is Verdict.PASS:
            mem = "; ".join(
                f"chip {m['chip']}: {m['baseline_bytes']} B idle, {m['loaded_bytes']} B loaded of {m['total_bytes']} B"
                for m in r.evidence.get("memory", [])
            )
            return VendorAnswer(question, source, "C0", "DRAM: yes, per chip", mem or r.detail, ask)
        if r is not None and r.verdict is Verdict.UNSUPPORTED:
            return VendorAnswer(question, source, "C4", "no: NOT_SUPPORTED (calctl shows null, never 0)", r.detail, ask)
        return VendorAnswer(
            question, source, "C1", "not shown", f"calrt_memory_usage present; {why_not('memory_counters')}", ask
        )

    out.append(memory_row())
    out.append(
        measured(
            "KV manager namespace per model/session and rollback on failure",
            "001 §15.2 item 6",
            ("kv_lifecycle", "ccu_fault"),
            "calrt_kv_*",
            lambda: (
                "C0",
                "one namespace per model; commit only after success, rollback after a failed job",
                f"{by['kv_lifecycle'].detail}; {by['ccu_fault'].detail}",
            ),
            ask="Does CalRT 0.7.6's KvManager keep sequences of two models apart itself, or must the shim keep "
            "the namespaces; and what is left in a sequence after a failed job (rolled back by the runtime, or "
            "by the caller)?",
        )
    )
    out.append(_reset_row(by, "Exact scope of session/chip/config/device reset", "001 §15.2 item 7"))

    def load_unload() -> tuple[str, str, str]:
        cycles = ev("memory_counters", "load_cycles", 0)
        return (
            "C4",
            f"no independent per-model unload in ABI 1.x (one current calbin); the whole package loaded and "
            f"unloaded {cycles} times, memory back to baseline each time",
            by["memory_counters"].detail,
        )

    out.append(
        measured(
            "Independent load/unload, or the whole-calbin lifecycle",
            "001 §15.2 item 8",
            ("memory_counters", "configuration"),
            "calrt_reset_configuration",
            load_unload,
            ask="Can one model of a combined calbin be unloaded and reloaded while the other keeps serving? If "
            "not, what is the official lifecycle of the whole calbin (drain, ResetConfiguration, configure), "
            "how long does it take, and does memory return to baseline?",
        )
    )

    def observability() -> tuple[str, str, str]:
        counters = ev("memory_counters", "counters_reported", False)
        return (
            "C0",
            f"per-chip counters: {'yes' if counters else 'not reported'}; job timestamps on CLOCK_MONOTONIC "
            "(submit <= start <= end within the call window); per-chip telemetry (calrt_chip_telemetry, "
            f"docs/calrt-c-abi.md §15): {telemetry()}",
            by["job_states_timestamps"].detail,
        )

    def telemetry() -> str:
        rows = [by.get(n) for n in ("telemetry_struct", "telemetry_under_load")]
        if all(r is not None and r.verdict is Verdict.PASS for r in rows):
            return "shown (plausible units, monotonic counters, values change under load)"
        if any(r is not None and r.verdict is Verdict.UNSUPPORTED for r in rows):
            return "not exported (C4)"
        return f"not shown ({why_not('telemetry_struct', 'telemetry_under_load')})"

    out.append(
        measured(
            "Per-chip trace, counters, temperature, power, frequency; clock domain",
            "001 §15.2 item 9",
            ("memory_counters", "job_states_timestamps"),
            "calrt_chip_counters",
            observability,
            ask="Which per-chip temperature, power, frequency, throttle and reset-count queries does the runtime "
            "have, and in which clock domain are its job timestamps (device clock, or host CLOCK_MONOTONIC)? "
            f"(without the optional calrt_chip_telemetry, telemetry is {NOT_MEASURABLE}.)",
        )
    )
    out.append(
        measured(
            "Runtime/driver/firmware/compiler/calbin compatibility matrix",
            "001 §15.2 item 10",
            ("versions_topology",),
            "calrt_versions_get",
            lambda: ("C0", "versions reported", by["versions_topology"].detail),
            ask="Publish the matrix of runtime, driver, firmware, compiler and calbin versions that work together "
            f"(the matrix itself is {NOT_MEASURABLE}: only the versions of this library are).",
        )
    )
    return out


def _reset_row(by: dict[str, CheckResult], question: str, source: str) -> VendorAnswer:
    ask = (
        "What exactly does each reset the runtime offers (session, chip, configuration, device) abort, free and "
        "keep: jobs, buffers, KV sequences, the configuration, the other chip's work?"
    )
    r = by.get("chip_vs_board_reset")
    if r is not None and r.verdict is Verdict.PASS:
        return VendorAnswer(
            question,
            source,
            "C0",
            "chip reset: only its chip's jobs and sequences (emptied), configuration and the other chip kept; board "
            "reset: every sequence gone, configuration dropped",
            r.detail,
            ask,
        )
    if r is not None and r.verdict is Verdict.UNSUPPORTED and r.evidence.get("chip_reset") is False:
        return VendorAnswer(
            question, source, "C4", "no chip-scoped reset: every fault is board-wide (F0, 001 §11.3)", r.detail, ask
        )
    why = f"check chip_vs_board_reset {r.verdict.value}" if r is not None else "check chip_vs_board_reset not run"
    return VendorAnswer(question, source, "C1", "not shown", f"calrt_reset present; {why}", ask)
