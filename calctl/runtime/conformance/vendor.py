"""Vendor questions (000 §20, 001 §15.2) answered from the checks' measurements, graded (001 §1)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from calctl.runtime.conformance.framework import CheckResult, Verdict


@dataclass(frozen=True)
class VendorAnswer:
    question: str
    source: str  # report section
    grade: str  # C0 measured here | C1 symbol present, behaviour not shown | C4 refused
    answer: str
    evidence: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def vendor_questions(results: Sequence[CheckResult]) -> list[VendorAnswer]:
    by = {r.name: r for r in results}

    def shown(name: str) -> CheckResult | None:
        r = by.get(name)
        return r if r is not None and r.verdict is Verdict.PASS else None

    def not_shown(name: str, symbol: str) -> str:
        r = by.get(name)
        why = f"check {name} {r.verdict.value}" if r else f"check {name} not run"
        return f"{symbol} present; {why}"

    out: list[VendorAnswer] = []
    r = shown("concurrent_submit_two_chips")
    if r:
        ov = float(r.evidence.get("overlap_ms", 0.0))
        out.append(
            VendorAnswer(
                "Do two chips execute jobs at the same time?",
                "000 §20, 001 §15.2 item 2",
                "C0",
                "yes" if ov > 0 else "no: the chips' job intervals never overlapped (serialised, S1 at best)",
                f"{r.evidence.get('jobs')} jobs from two threads; chip intervals overlapped {ov:.1f} ms",
            )
        )
    else:
        out.append(
            VendorAnswer(
                "Do two chips execute jobs at the same time?",
                "000 §20, 001 §15.2 item 2",
                "C1",
                "not shown",
                not_shown("concurrent_submit_two_chips", "calrt_job_submit"),
            )
        )
    r = shown("two_in_flight_one_chip")
    if r:
        n = int(r.evidence.get("max_in_flight", 1))
        out.append(
            VendorAnswer(
                "How many jobs can be in flight on one chip (PING/PONG)?",
                "000 §20, 000 §14",
                "C0",
                f"{n}"
                + (" (a PING and a PONG job overlapped)" if n == 2 else " (the second job waited or was refused)"),
                r.detail,
            )
        )
    else:
        out.append(
            VendorAnswer(
                "How many jobs can be in flight on one chip (PING/PONG)?",
                "000 §20, 000 §14",
                "C1",
                "not shown",
                not_shown("two_in_flight_one_chip", "calrt_job_submit(engine)"),
            )
        )
    r = by.get("chip_vs_board_reset")
    if r is not None and r.verdict is Verdict.PASS:
        out.append(
            VendorAnswer(
                "What does a chip reset affect?",
                "001 §15.2 item 7",
                "C0",
                "only its own chip's jobs and KV; the configuration and the other chip stay",
                r.detail,
            )
        )
    elif r is not None and r.verdict is Verdict.UNSUPPORTED and r.evidence.get("chip_reset") is False:
        out.append(
            VendorAnswer(
                "What does a chip reset affect?",
                "001 §15.2 item 7",
                "C4",
                "no chip-scoped reset: every fault is board-wide (F0, 001 §11.3)",
                r.detail,
            )
        )
    else:
        out.append(
            VendorAnswer(
                "What does a chip reset affect?",
                "001 §15.2 item 7",
                "C1",
                "not shown",
                not_shown("chip_vs_board_reset", "calrt_reset"),
            )
        )
    r = by.get("memory_counters")
    if r is not None and r.verdict is Verdict.PASS:
        mem = "; ".join(
            f"chip {m['chip']} {m['loaded_bytes']} of {m['total_bytes']} B" for m in r.evidence.get("memory", [])
        )
        out.append(
            VendorAnswer("Is per-chip memory reported?", "001 §15.2 item 5", "C0", "yes, per chip", mem or r.detail)
        )
    elif r is not None and r.verdict is Verdict.UNSUPPORTED:
        out.append(
            VendorAnswer(
                "Is per-chip memory reported?",
                "001 §15.2 item 5",
                "C4",
                "no: NOT_SUPPORTED (calctl shows null, never 0)",
                r.detail,
            )
        )
    else:
        out.append(
            VendorAnswer(
                "Is per-chip memory reported?",
                "001 §15.2 item 5",
                "C1",
                "not shown",
                not_shown("memory_counters", "calrt_memory_usage"),
            )
        )
    r = shown("concurrent_submit_two_chips")
    if r:
        out.append(
            VendorAnswer(
                "Are submit and wait thread-safe across chips?",
                "001 §15.2 item 4",
                "C0",
                f"yes for {r.evidence.get('jobs')} jobs from two threads (no error, no crosstalk)",
                r.detail,
            )
        )
    else:
        out.append(
            VendorAnswer(
                "Are submit and wait thread-safe across chips?",
                "001 §15.2 item 4",
                "C1",
                "not shown",
                not_shown("concurrent_submit_two_chips", "calrt_job_submit/calrt_job_wait"),
            )
        )
    return out
