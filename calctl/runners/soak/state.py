"""``calctl soak``, the state: what a soak has seen so far, shared by the run (which fills it), the judge
(which adds violations to it) and the render (which turns it into the report at every checkpoint)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from calctl.package.model import Package
from calctl.runners.soak import checks, evidence
from calctl.runners.soak.clients import RequestBook, SubmitCounter
from calctl.runners.soak.plan import SoakConfig
from calctl.runners.soak.verify import OutputVerifier
from calctl.runtime.errors import RuntimeLayerError
from calctl.runtime.interface import Runtime
from calctl.runtime.types import ChipCounters, ChipMemory, Topology, Versions
from calctl.serving.engine import DeviceSupervisor


@dataclass(frozen=True)
class PackageFacts:
    """The package the soak was given, as the report's header names it."""

    path: str
    name: str
    version: str
    kind: str
    aliases: tuple[str, ...]
    digest: str | None
    signer_key_id: str | None

    def document(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "aliases": list(self.aliases)}


@dataclass(frozen=True)
class ValidationFacts:
    """The up-front validation: accepted or not, the rules that failed and those that warned."""

    ok: bool
    failed_rules: tuple[str, ...]
    warnings: tuple[str, ...]

    def document(self) -> dict[str, Any]:
        return {"ok": self.ok, "failed_rules": list(self.failed_rules), "warnings": list(self.warnings)}


@dataclass(frozen=True)
class EvidenceFiles:
    """The soak's files in its report folder (``plot``: None until the picture is drawn, or when it failed)."""

    report: str
    events: str
    plot: str | None = None

    def document(self) -> dict[str, str | None]:
        return {"report": self.report, "events": self.events, "plot": self.plot}


@dataclass
class SoakHeader:
    """What the run learns for its report's header as it goes: the package and its validation (before the
    device), the runtime's versions (once the device is open), the error that ended it, the files it left."""

    package: PackageFacts | None = None
    validation: ValidationFacts | None = None
    runtime: Versions | None = None  # the header's runtime block (report.versions_document)
    error: str | None = None  # why the run stopped outside a cycle (the report's ``error``)
    files: EvidenceFiles | None = None  # set at the end, with the picture


@dataclass
class Interruption:
    """Where SIGINT/SIGTERM cut the soak short: the signal, the phase, the cycle it cut (None: between
    cycles), when, and per alias the requests the engine still held at shutdown."""

    signal: str
    phase: str
    cycle: int | None
    at_s: float
    engine_requests_left: dict[str, int] = field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"signal": self.signal, "phase": self.phase, "cycle": self.cycle, "at_s": self.at_s}
        if self.engine_requests_left:
            doc["engine_requests_left"] = dict(self.engine_requests_left)
        return doc


@dataclass(frozen=True)
class LoadRecord:
    """A cycle's load: how long it took and why it failed, or the generations it published, each alias's golden +
    warm-up time (Warming -> Ready) and the warm-up iterations."""

    ok: bool
    seconds: float
    error: str | None = None
    generations: Mapping[str, int] = field(default_factory=dict)
    golden_warmup_s: Mapping[str, float | None] = field(default_factory=dict)
    warmup_iterations: int = 0

    def document(self) -> dict[str, Any]:
        if not self.ok:
            return {"ok": False, "error": self.error, "seconds": self.seconds}
        return {
            "ok": True,
            "seconds": self.seconds,
            "generations": dict(self.generations),
            "golden_warmup_s": dict(self.golden_warmup_s),
            "warmup_iterations": self.warmup_iterations,
        }


@dataclass(frozen=True)
class UnloadRecord:
    """A cycle's unload and what the checks after it measured: per-chip drift, this process's VmRSS, the job
    counters with the jobs the host submitted in the cycle, the cycle's request outcomes and latency."""

    seconds: float
    drained_in_time: bool
    drifts: tuple[checks.ChipDrift, ...]
    host_rss_bytes: int | None
    counters: tuple[ChipCounters, ...]
    submitted_in_cycle: Mapping[int, int]
    requests: Mapping[str, int]
    latency: Mapping[str, Mapping[str, Any]]
    new_violations: int

    def memory_document(self) -> list[dict[str, Any]]:
        return [d.document() for d in self.drifts]

    def counters_document(self) -> list[dict[str, Any]]:
        return [
            {
                "chip": a.chip,
                "pending": a.pending,
                "finished": a.finished,
                "failed": a.failed,
                "submitted_in_cycle": self.submitted_in_cycle.get(a.chip, 0),
            }
            for a in self.counters
        ]

    def document(self) -> dict[str, Any]:
        """The cycle record's keys from the unload on (``unload`` to ``new_violations``)."""
        return {
            "unload": {"ok": True, "seconds": self.seconds, "drained_in_time": self.drained_in_time},
            "memory_after_unload": self.memory_document(),
            "host_rss_bytes": self.host_rss_bytes,
            "counters": self.counters_document(),
            "requests": dict(self.requests),
            "latency": {a: dict(v) for a, v in self.latency.items()},
            "new_violations": self.new_violations,
        }


@dataclass
class Cycle:
    """One load/unload cycle: when it started, loaded and unloaded (seconds since the start), its load and unload
    records, and the interrupt that cut it short."""

    index: int
    started_s: float
    loaded_s: float | None = None  # None: the load failed or has not ended
    unloaded_s: float | None = None
    load: LoadRecord | None = None  # set when the load ends, ok or not
    unload: UnloadRecord | None = None  # set when the unload succeeded (a failed one is a violation)
    interrupted: Interruption | None = None  # the signal that cut this cycle short
    traffic_s: float | None = None  # how long its traffic phase lasted (the seconds, or longer for the floor)

    def document(self) -> dict[str, Any]:
        """The report's ``cycle_records`` entry."""
        doc: dict[str, Any] = {"cycle": self.index, "started_s": round(self.started_s, 3)}
        if self.load is not None:
            doc["load"] = self.load.document()
        if self.traffic_s is not None:
            doc["traffic_s"] = self.traffic_s
        if self.unload is not None:
            doc.update(self.unload.document())
        if self.interrupted is not None:
            i = self.interrupted
            doc["interrupted"] = {"signal": i.signal, "phase": i.phase, "at_s": i.at_s}
        return doc


class SoakState:
    """Everything a soak has measured and found so far (the run's threads write it under its locks)."""

    def __init__(self, config: SoakConfig) -> None:
        self.config = config
        self.t0 = time.monotonic()
        self.started_at = datetime.now(timezone.utc)
        config.out_dir.mkdir(parents=True, exist_ok=True)
        self.events = evidence.EventLog(config.out_dir / evidence.EVENTS_FILE, self.t0)
        self.violations = checks.ViolationBook()
        self.requests = RequestBook()
        self.verifier = OutputVerifier()  # every answer against its prompt's B1 twin (verify.py)
        self.cycles: list[Cycle] = []
        self.lifecycle_errors: Counter[str] = Counter()
        self.drain_deadline_hits = 0
        self.memory_series: dict[int, evidence.Series] = {}
        self.baseline: list[ChipMemory] = []
        self.topology: Topology | None = None
        self.dram: dict[int, int | None] = {}  # per chip, as the topology reports it (the drift limit's base)
        self.max_drift: dict[int, int | None] = {}
        self.host_rss: list[tuple[int, int | None]] = []  # (cycle, VmRSS after its unload) of this process
        self.caches_full_at: int | None = None  # first cycle at whose unload the runtime's job history was full
        self.history_reported = False  # the runtime says how full its job history is (KeepsJobHistory)
        self.header = SoakHeader()
        self.error_verdict = "ERROR"
        self.phase = "starting"
        self.status = "running"
        self.rt: Runtime | None = None
        self.manifest: Package | None = None  # the package's manifest, read once up front
        self.submits = SubmitCounter()
        self.sup: DeviceSupervisor | None = None
        self._lock = threading.RLock()
        self.cycles_done = 0
        self.end_s: float | None = None
        self.interrupted: Interruption | None = None

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    def cycle_index(self) -> int | None:
        return self.cycles[-1].index if self.cycles else None

    def violate(self, v: checks.Violation) -> None:
        if self.violations.add(v):
            self.events.write("violation", kind=v.kind, message=v.message, cycle=v.cycle, detail=dict(v.detail))

    def sample_memory(self) -> list[ChipMemory] | None:
        """Per-chip memory now, added to the picture's series (None: no runtime, or it does not report memory)."""
        rt = self.rt
        if rt is None:
            return None
        try:
            mem = list(rt.memory_usage())
        except (RuntimeLayerError, AttributeError):
            return None
        t = self.now_s()
        for m in mem:
            if m.used_bytes is not None:
                self.memory_series.setdefault(m.chip, evidence.Series()).add(t, float(m.used_bytes))
        return mem


def read_counters(rt: Any) -> list[ChipCounters]:
    """The chips' job counters (none when the runtime cannot say)."""
    try:
        return list(rt.counters())
    except RuntimeLayerError:
        return []
