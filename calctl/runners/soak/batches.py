"""``calctl soak`` drives every compiled decode profile with inactive lanes (issue 50; 000 §7.3, §8).

Serving's default configuration decodes at B1 only (000 §15's example), so a soak on it never ran a batch job,
and a board whose inactive lanes write KV rows of live sequences passed it. The soak therefore serves each
alias with **every decode profile the package compiles** that serving accepts (B>1 needs an inactive-lane
contract whose lanes write no KV, 000 §7.3), with the profile thresholds set by rank: B1 when one request is
ready, the second profile when two are, the third when three are, and so on. The soak's few clients per alias
then form partial batches on every profile up to the number of clients: each B>1 job has inactive lanes, and
every answer is still held to its B1 twin (:mod:`calctl.runners.soak.verify`). A profile ranked above the
number of clients is never reached; :class:`LaneLog` counts the jobs per profile (and those with inactive
lanes), so the report says which profiles ran.

:class:`LaneLog` also remembers, per request, the batch and lane of every decode job it was in (an engine
launch tap, :meth:`~calctl.serving.engine.loop.EngineCore.add_taps`), so an ``output_mismatch`` names
the lane and profile of the job that returned the wrong token.

This module builds configurations and records lanes; it sends no request and judges nothing.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from dataclasses import dataclass

from calctl.package.model import Package
from calctl.serving.config import BatchConfig, SchedulerConfig, default_scheduler_config
from calctl.serving.core.scheduler import DecodeJob, PrefillJob
from calctl.serving.engine.output import LaunchTap

#: Requests whose lanes are remembered at most (the oldest are forgotten first; a checked request is dropped).
MAX_REMEMBERED = 4096


def usable_profiles(pkg: Package, alias: str) -> tuple[int, ...]:
    """The decode profiles of ``alias`` serving accepts: B1, and B>1 with an inactive-lane contract whose lanes
    write no KV and that names its mask input (000 §7.3)."""
    decode = pkg.model(alias).decode
    policy = decode.inactive_lane_policy
    batched_ok = policy is not None and not policy.writes_kv and bool(policy.mask_input)
    return tuple(b for b in sorted(decode.batch_profiles) if b == 1 or batched_ok)


def batch_configs(pkg: Package) -> dict[str, SchedulerConfig]:
    """Per alias with a usable B>1 profile: the default scheduler configuration serving every usable profile,
    thresholds by rank (the smallest profile at 1 ready request, the next at 2, ...). Aliases with B1 alone keep
    the default (they are absent here)."""
    out: dict[str, SchedulerConfig] = {}
    for m in pkg.models:
        profiles = usable_profiles(pkg, m.alias)
        if not any(b > 1 for b in profiles):
            continue
        base = default_scheduler_config(m.alias)
        thresholds = {b: rank + 1 for rank, b in enumerate(profiles)}
        out[m.alias] = dataclasses.replace(base, batch=BatchConfig(profiles, 0, thresholds))
    return out


@dataclass(frozen=True)
class LanePlace:
    """Where one decode step of a request ran: the batch profile, its lane, and how many lanes were active."""

    batch: int
    lane: int
    active: int

    def text(self) -> str:
        inactive = self.batch - self.active
        return f"B{self.batch} lane {self.lane} ({self.active} active, {inactive} inactive)"


class LaneLog:
    """The lanes every request's decode jobs ran on, and the decode jobs per profile (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._places: dict[str, list[LanePlace]] = {}
        self.jobs: Counter[tuple[str, int]] = Counter()  # (alias, B) -> decode jobs
        self.partial: Counter[tuple[str, int]] = Counter()  # (alias, B) -> decode jobs with inactive lanes

    def tap(self, alias: str) -> LaunchTap:
        """The launch tap of ``alias``'s engine core."""

        def on_launch(job: PrefillJob | DecodeJob) -> None:
            if not isinstance(job, DecodeJob):
                return
            batch = job.batch
            b, n = batch.profile.compiled_batch, len(batch.request_ids)
            with self._lock:
                self.jobs[(alias, b)] += 1
                if n < b:
                    self.partial[(alias, b)] += 1
                for lane, rid in enumerate(batch.request_ids):
                    places = self._places.get(rid)
                    if places is None:
                        while len(self._places) >= MAX_REMEMBERED:
                            del self._places[next(iter(self._places))]
                        places = self._places[rid] = []
                    places.append(LanePlace(b, lane, n))

        return on_launch

    def pop(self, request_id: str) -> list[LanePlace]:
        """The places of ``request_id``'s decode jobs in order (forgotten afterwards)."""
        with self._lock:
            return self._places.pop(request_id, [])

    def document(self) -> dict[str, dict[str, dict[str, int]]]:
        """Per alias and profile: decode jobs, and those with inactive lanes."""
        with self._lock:
            out: dict[str, dict[str, dict[str, int]]] = {}
            for (alias, b), n in sorted(self.jobs.items()):
                out.setdefault(alias, {})[f"B{b}"] = {"jobs": n, "with_inactive_lanes": self.partial[(alias, b)]}
            return out


__all__ = ["MAX_REMEMBERED", "LaneLog", "LanePlace", "batch_configs", "usable_profiles"]
