"""The options of the DeviceSupervisor and of each engine core, and the values the lifecycle keeps
(000 §11–§12, §14–§15, 001 §10.4, §11)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from calctl.package.model import Package
from calctl.serving.config import DowngradePolicy, ExecutorMode

#: The engine's one clock type (seconds, monotonic): a core and its device take it as an argument (STYLE.md).
Clock = Callable[[], float]


@dataclass
class SupervisorOptions:
    warmup_iterations: int = 3
    step_timeout_s: float = 30.0
    drain_deadline_s: float = 30.0
    job_timeout_s: float = 30.0
    # The ``recovery`` block (000 §15, 001 §10.4); None: take it from the configuration being served.
    allow_session_reset: bool | None = None
    restart_process_on_unknown_dma: bool | None = None
    max_resets_per_10min: int | None = None
    restart_on_unknown_dma: bool | None = None
    recovery_drain_s: float = 2.0  # how long in-flight work may finish before a reset (001 §11.3 "drain")
    evidence_dir: Path | None = None  # recovery evidence files; None: $CALCTL_RECOVERY_DIR, else memory only
    evidence_window_s: float = 10.0  # trace kept from before the fault
    evidence_keep: int = 16


@dataclass
class CoreOptions:
    """``mode``/``fixed_engine``/``downgrade`` come from the scheduler configuration's ``executor`` block
    (000 §15); ``chip_exclusive``: no other alias runs on this core's chip (its counters are ours)."""

    job_timeout_s: float = 30.0
    poll_s: float = 0.02
    mode: ExecutorMode = ExecutorMode.SYNC
    fixed_engine: bool = False
    downgrade: DowngradePolicy = field(default_factory=DowngradePolicy)
    chip_exclusive: bool = True


@dataclass(frozen=True)
class LoadPolicy:
    """What this supervisor may load (000 §11 step 1 "resolve trusted package path"; 001 §10.4).

    ``pinned_digest`` (``--pin-digest``): every load, reload and rollback must be this exact package.
    ``package_roots`` (``--package-root``): directories an admin load may name a package under; the package
    given at start-up is always allowed. Empty: only packages served before (start-up, current, previous).
    ``fail_unclean_unload``: an unload whose device check (000 §12) finds memory left in use, a pending job or
    an unhealthy chip fails (409, aliases Failed). ``calctl serve`` sets it; False (the soak runner, which
    judges memory drift across cycles itself) reports the check and ends Unloaded."""

    pinned_digest: str | None = None
    package_roots: tuple[Path, ...] = ()
    fail_unclean_unload: bool = False


@dataclass(frozen=True)
class LoadedPackage:
    source: Path
    root: Path
    package: Package
    digest: str | None
    temp_dir: Path | None = None


@dataclass(frozen=True)
class LifecycleEvent:
    at: float
    alias: str
    state: str
    detail: str = ""


__all__ = ["CoreOptions", "LifecycleEvent", "LoadPolicy", "LoadedPackage", "SupervisorOptions"]
