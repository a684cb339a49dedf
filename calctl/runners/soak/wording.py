"""How a soak's requests are counted in words: one phrasing for the summary, the progress bar, bringup and accept.

A soak's mix asks for some endings on purpose (:mod:`calctl.runners.soak.mix`): only the ``cancel`` kind cancels,
only ``deadline`` sets a deadline (2–200 ms, which may expire queued or running) and only ``invalid`` sends a
prompt longer than the context (refused 400). Those endings are the workload's, neither successes nor failures;
"301 requests" where 85 succeeded said none of that (issue 31). The rest is split into what was refused before
any token (the model draining, loading or full: 503/429/404) and what failed after admission (a device error, a
client that got no end in time, a broken connection).

Pure text from the counts of ``soak-report.json`` ``requests``; nothing here judges a verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
