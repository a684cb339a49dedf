"""What an acceptance run is asked to do: its levels (the durations), its configuration, its report files.

Levels set the durations (:data:`LEVELS`); only ``long`` reaches the report's
24 h and 100-cycle requirements (001 §13.3, 000 §19), so quick and standard runs
leave G5, M0, M2 and M4 NOT MEASURED saying what they reached. Nothing here runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from calctl import records
from calctl.errors import UsageError
from calctl.runners.acceptance.rows import ROWS
from calctl.runners.acceptance.targets import ProjectTargets
from calctl.runners.bringup import Level  # one vocabulary: accept --level is bringup --level
from calctl.runners.device import DeviceSpec
from calctl.signing.policy import TrustPolicy

REPORT_FILE = "report.json"
PLOT_FILE = "accept.png"
JUNIT_FILE = "accept.junit.xml"


@dataclass(frozen=True)
class LevelSettings:
    soak_cycles: int | None  # exactly one of cycles and hours
    soak_hours: float | None
    soak_traffic_s: float  # seconds of mixed traffic per soak cycle
    step_timeout_s: float
    soak_checkpoint_s: float
    executor_rounds: int  # measured rounds per executor-modes profile (M1/M2); fewer: wider CIs, inconclusive sooner
    executor_max_rounds: int = 0  # the round budget while M1/M2 is inconclusive (the decision rule); 0: 3 x rounds
    rollback_traffic_s: float = 1.0  # seconds each rollback stage serves (previous, PKG, previous again)
    burnin_minutes: float = 0.0  # minutes both chips run at full load (0: the level runs no burn-in)


#: One row a level: soak cycles or hours, seconds of traffic a cycle, step timeout, soak checkpoint, executor
#: rounds and their budget, seconds a rollback stage serves, the burn-in's minutes (long only: 30 min beside
#: its 24 h soak, three times bring-up's; ``--burn-in-minutes`` overrides it).
LEVELS: dict[Level, LevelSettings] = {
    Level.QUICK: LevelSettings(3, None, 0.5, 30.0, 60.0, 3, 12, 1.0),  # CI: minutes on the mock
    Level.STANDARD: LevelSettings(20, None, 5.0, 30.0, 60.0, 8, 24, 5.0),  # a bench session, well under an hour
    # The report's durations: a 24 h soak (>= 100 cycles at 60 s of traffic each, 8 h of switching included).
    Level.LONG: LevelSettings(None, 24.0, 60.0, 60.0, 300.0, 30, 90, 60.0, burnin_minutes=30.0),
}

ROW_IDS = tuple(r.id for r in ROWS)


@dataclass(frozen=True)
class AcceptConfig:
    package: Path
    trust: TrustPolicy
    device: DeviceSpec
    level: Level
    out_dir: Path
    replica: Path | None = None  # a replica package for G2 (and G1/G3 when the main package lacks them)
    only: frozenset[str] | None = None  # row ids to measure; None: every row
    seed: int = 0
    previous: Path | None = None  # the version PKG replaces: the rollback step rolls forward from it and back
    board_profile: Path | None = None  # calculet-board-profile/v1 for the self-test (None: transfers NOT JUDGED)
    burnin_minutes: float | None = None  # the burn-in's minutes at a level that runs one (None: the level's own)
    targets: ProjectTargets | None = None  # the project's targets (--targets); None: M3 NOT MEASURED, saying so

    def __post_init__(self) -> None:
        if self.only is not None:
            bad = sorted(self.only - set(ROW_IDS))
            if bad or not self.only:
                raise UsageError(
                    f"--only {','.join(sorted(self.only))}: unknown row(s) {', '.join(bad) or '(none given)'}; "
                    f"expected some of {', '.join(ROW_IDS)}"
                )

    @property
    def settings(self) -> LevelSettings:
        s = LEVELS[self.level]
        return s if self.burnin_minutes is None else replace(s, burnin_minutes=self.burnin_minutes)

    def wants(self, *rows: str) -> bool:
        return self.only is None or any(r in self.only for r in rows)


def default_report_dir(now: datetime | None = None) -> Path:
    return records.default_report_dir("accept", now)


__all__ = [
    "JUNIT_FILE",
    "LEVELS",
    "PLOT_FILE",
    "REPORT_FILE",
    "ROW_IDS",
    "AcceptConfig",
    "Level",
    "LevelSettings",
    "default_report_dir",
]
