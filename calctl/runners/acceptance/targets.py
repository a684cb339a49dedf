"""The project's targets (``calctl accept --targets FILE``): the figures a row judges against the project's goals.

000 §19 M3 asks that fill ratio, throughput and P99 "达项目目标" (meet the project's targets). Those are the
project's to set, not calctl's: there is no default, and without a file M3 is NOT MEASURED saying so and
naming the option. The file is ``calctl-accept-targets/v1`` YAML (``calctl/schemas/calctl-accept-targets-v1.json``,
docs/accept.md "Project targets"), read with the package's strict YAML reader; a bad file is a
:class:`~calctl.errors.ConfigError` (exit 2) naming the file, the field and the value, before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calctl.errors import ConfigError

SCHEMA_ID = "calctl-accept-targets/v1"
MAX_TARGETS_BYTES = 64 * 1024
DOCS = "docs/accept.md, 'Project targets'"


@dataclass(frozen=True)
class M3Targets:
    """000 §19 M3, for every batched profile against the B1 reference."""

    fill_ratio_min: float
    throughput_gain_min: float
    p99_itl_regression_max: float

    def to_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ProjectTargets:
    source: str  # the file they came from
    m3: M3Targets
    project: str | None = None
    origin: str | None = None  # the file's own ``source``: where the figures come from

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.source, "project": self.project, "source": self.origin, "M3": self.m3.to_dict()}

    @classmethod
    def from_document(cls, doc: Any, *, source: str) -> ProjectTargets:
        from calctl.package import schemas

        for where, message in schemas.iter_errors(SCHEMA_ID, doc):
            raise ConfigError(f"--targets {source}: {where}: {message}", hint=f"see {DOCS} for {SCHEMA_ID}")
        m3 = doc["M3"]
        return cls(
            source,
            M3Targets(
                float(m3["fill_ratio_min"]), float(m3["throughput_gain_min"]), float(m3["p99_itl_regression_max"])
            ),
            doc.get("project"),
            doc.get("source"),
        )

    @classmethod
    def load(cls, path: Path) -> ProjectTargets:
        """Read and check a targets file; :class:`ConfigError` (exit 2) names the file, the field and the value."""
        from calctl.package import yamlsafe

        hint = f"see {DOCS} for the {SCHEMA_ID} format"
        doc = yamlsafe.load_config(
            path, name=f"--targets {path}", what="the targets file", max_bytes=MAX_TARGETS_BYTES, hint=hint
        )
        return cls.from_document(doc, source=str(path))


__all__ = ["SCHEMA_ID", "M3Targets", "ProjectTargets"]
