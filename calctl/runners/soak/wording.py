"""How a soak's requests are counted in words: one phrasing for the summary, the progress bar, bringup and accept.

A soak's mix asks for some endings on purpose (:mod:`calctl.runners.soak.mix`): only the ``cancel`` kind cancels,
only ``deadline`` sets a deadline (2–200 ms, which may expire queued or running) and only ``invalid`` sends a
prompt longer than the context (refused 400). Those endings are the workload's, neither successes nor failures;
"301 requests" where 85 succeeded said none of that (issue 31). The rest is split into what was refused before
any token (the model draining, loading or full: 503/429/404) and what failed after admission (a device error, a
client that got no end in time, a broken connection).

Pure text from the counts of ``soak-report.json`` ``requests`` (and, in :func:`facts`, the rest of that document:
the one summary the terminal and the page both show); nothing here judges a verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Outcomes (``RequestOutcome`` values) the mix asks for on purpose.
INTENDED = ("cancelled", "deadline", "invalid")
#: Outcomes refused before any token, with an HTTP error; every other outcome but ``ok`` failed.
REFUSED = ("unavailable", "capacity", "not_found")


def _listed(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


@dataclass(frozen=True)
class RequestCounts:
    sent: int
    succeeded: int
    intended: dict[str, int]
    refused: dict[str, int]
    failed: dict[str, int]
    open: int

    @classmethod
    def of(cls, sent: int, by_outcome: Mapping[str, int]) -> RequestCounts:
        by = {k: int(v) for k, v in by_outcome.items() if v}
        return cls(
            sent=int(sent),
            succeeded=by.get("ok", 0),
            intended={k: v for k, v in by.items() if k in INTENDED},
            refused={k: v for k, v in by.items() if k in REFUSED},
            failed={k: v for k, v in by.items() if k != "ok" and k not in INTENDED and k not in REFUSED},
            open=max(0, int(sent) - sum(by.values())),
        )

    @classmethod
    def of_report(cls, requests: Mapping[str, object]) -> RequestCounts:
        """From ``soak-report.json`` ``requests`` (``sent`` and ``by_outcome``)."""
        sent = requests.get("sent", 0)
        by = requests.get("by_outcome") or {}
        return cls.of(sent if isinstance(sent, int) else 0, by if isinstance(by, Mapping) else {})

    def phrase(self) -> str:
        """``164 sent: 107 succeeded, 40 ended as the mix intends (cancelled 26, ...), 17 refused (...), 0 failed``."""
        parts = [f"{self.succeeded} succeeded"]
        if self.intended:
            parts.append(f"{sum(self.intended.values())} ended as the mix intends ({_listed(self.intended)})")
        parts.append(f"{sum(self.refused.values())} refused" + (f" ({_listed(self.refused)})" if self.refused else ""))
        parts.append(f"{sum(self.failed.values())} failed" + (f" ({_listed(self.failed)})" if self.failed else ""))
        if self.open:
            parts.append(f"{self.open} still open")
        return f"{self.sent} sent: " + ", ".join(parts)

    def short(self) -> str:
        """``164 sent, 107 succeeded, 40 intended, 17 refused, 0 failed``: the same counts in a progress line."""
        return (
            f"{self.sent} sent, {self.succeeded} succeeded, {sum(self.intended.values())} intended, "
            f"{sum(self.refused.values())} refused, {sum(self.failed.values())} failed"
        )


def deadline_note(by_kind: Mapping[str, Mapping[str, int]]) -> str | None:
    """What became of the mix's ``deadline`` requests, said as expected (the engine logs each expiry)."""
    mine = by_kind.get("deadline") or {}
    total = sum(mine.values())
    if not total:
        return None
    expired = mine.get("deadline", 0)
    rest = {k: v for k, v in mine.items() if k != "deadline" and v}
    others = f"; the others: {_listed(rest)}" if rest else ""
    return (
        f"{expired} of {total} expired, as intended: the mix sets 2–200 ms deadlines to exercise expiry "
        f"(expected, not errors){others}"
    )


#: What "intended" and "refused" mean, said wherever the counts are (#53 item 7: a PASS beside more refused
#: than succeeded, with "intended" never explained, read as a broken board).
MEANING = (
    "intended: endings the mix asks for on purpose (cancel, 2–200 ms deadlines, prompts longer than the context "
    "refused 400); refused: turned away before any token while the soak itself had the model draining, loading "
    "or unloaded (503), or full (429): expected in a load/unload soak and not judged; failed: a device error, no "
    "end in time or a broken connection after admission, judged"
)


#: :data:`MEANING` in a sentence short enough for a step's detail (bringup's soak row, accept's soak step).
SHORT_MEANING = (
    "refused: turned away before any token while the soak had the model unloaded or loading (expected, not "
    "judged); intended: endings the mix asks for (cancel, deadline, invalid)"
)


def _mib(x: object) -> str:
    return f"{x / 1024**2:+.1f} MiB" if isinstance(x, (int, float)) and not isinstance(x, bool) else "n/a"


def _memory_facts(memory: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    limits = memory.get("drift_limit_bytes") or {}
    for chip, drift in sorted((memory.get("max_drift_bytes") or {}).items()):
        by_text = {str(k): v for k, v in limits.items()}  # int keys in the run, text keys in the JSON
        limit = by_text.get(str(chip))
        out.append((f"chip{chip} max drift", f"{_mib(drift)} (limit {_mib(limit).lstrip('+')})"))
    rss = memory.get("host_rss") or {}
    if isinstance(rss, Mapping) and rss.get("reference_bytes") is not None:
        out.append(
            (
                "serving process memory",
                f"max growth {_mib(rss.get('max_growth_bytes'))} after an unload, from "
                f"{_mib(rss.get('reference_bytes')).lstrip('+')} (limit {_mib(rss.get('limit_bytes')).lstrip('+')})",
            )
        )
    return out


def _mapping(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = doc.get(key)
    return value if isinstance(value, Mapping) else {}


def facts(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(check, result) lines of a soak's document: what it did and saw, for the terminal's table and the page's
    first screen alike (the interruption first, then cycles, requests and their meaning, errors, memory)."""
    out: list[tuple[str, str]] = []
    i = doc.get("interrupted")
    if isinstance(i, Mapping) and i.get("signal"):
        cut = f", cycle {i['cycle']} cut short while {i.get('phase')}" if i.get("cycle") is not None else ""
        out.append(("interrupted", f"{i['signal']} after {float(i.get('at_s') or 0):.1f} s{cut}"))
    inject = _mapping(doc, "settings").get("inject") or []
    if inject:  # a FAIL the run asked for: said first, so the page is not read as a broken board
        out.append(("injected", f"DIAGNOSTIC: {', '.join(map(str, inject))} injected on purpose; the soak must FAIL"))
    planned = doc.get("cycles_planned")
    out.append(("status", str(doc.get("status"))))
    out.append(("cycles", f"{doc.get('cycles')}" + (f" of {planned}" if planned else "")))
    req = _mapping(doc, "requests")
    out.append(("requests", RequestCounts.of_report(req).phrase()))
    out.append(("what the counts mean", MEANING))
    deadlines = deadline_note(req.get("by_kind") or {})
    if deadlines:
        out.append(("deadline requests", deadlines))
    errs = _mapping(doc, "errors")
    device = errs.get("device_errors") or {}
    out.append(
        (
            "device errors",
            ", ".join(f"{k} {v}" for k, v in sorted(device.items()))
            or ("none" if doc.get("runtime") else "not measured: the soak never reached the device"),
        )
    )
    lifecycle = errs.get("lifecycle") or {}
    out.append(("lifecycle errors", ", ".join(f"{k} {v}" for k, v in sorted(lifecycle.items())) or "none"))
    dropped = errs.get("stale_completions_dropped") or {}
    out.append(
        (
            "stale completions",
            f"{sum(dropped.values())} dropped by the engine, {errs.get('stale_completions_delivered', 0)} delivered",
        )
    )
    out.append(("recoveries", str(len(errs.get("recoveries") or []))))
    return out + _memory_facts(_mapping(doc, "memory"))
