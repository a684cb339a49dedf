"""What the DeviceSupervisor's lifecycle calls answer (000 §11–§12, 001 §11): typed, frozen values.

``load``, ``unload``, ``reload`` and ``rollback`` return one of these; callers in the process (the soak,
acceptance and bench runners) read their attributes, and the admin API (``POST /internal/models/{alias}/
{action}``, docs/serve.md) sends :meth:`to_json`, whose keys and order are the documented response. This
module decides nothing and touches no device: the supervisor builds the values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from calctl.serving.engine.device_check import DeviceCheck

#: ``serving`` after a failed load or reload that configured the retained package again (000 §11 step 11).
ROLLED_BACK = "rolled back to the previous package"
#: ``serving`` after a load refused before configure: nothing is on the device.
NOTHING_SERVED = "nothing (unloaded)"
#: ``serving`` after a reload refused before the lock: the old generation never stopped.
PREVIOUS_GENERATION = "previous generation"


@dataclass(frozen=True)
class LoadResult:
    """A load's answer: ``ok`` with the published ``generation`` and package ``digest``, or why not
    (``detail``) and what serves now (``serving``: :data:`NOTHING_SERVED`, :data:`ROLLED_BACK`, or None
    when nothing was touched)."""

    action: ClassVar[str] = "load"
    #: A failed load that rolled back names the digest it rolled back to (a reload's keeps serving its own).
    digest_on_rollback: ClassVar[bool] = True

    ok: bool
    detail: str | None = None
    serving: str | None = None
    generation: int | None = None
    digest: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"ok": self.ok, "action": self.action}
        if self.ok:
            doc["generation"] = self.generation
            doc["digest"] = self.digest
            return doc
        doc["detail"] = self.detail
        if self.serving is not None:
            doc["serving"] = self.serving
        if self.serving == ROLLED_BACK and self.digest_on_rollback:
            doc["digest"] = self.digest
        return doc


@dataclass(frozen=True)
class ReloadResult(LoadResult):
    """A reload's answer: as a load's; ``serving`` is :data:`PREVIOUS_GENERATION` when the check refused the
    package (the old generation never stopped) or :data:`ROLLED_BACK` when configure or golden failed."""

    action: ClassVar[str] = "reload"
    digest_on_rollback: ClassVar[bool] = False


@dataclass(frozen=True)
class UnloadResult:
    """An unload's answer (000 §12): the aliases taken down, whether the drain ended before its deadline,
    and the device check after it. ``ok`` False with only ``detail``: nothing was loaded."""

    action: ClassVar[str] = "unload"

    ok: bool
    aliases: tuple[str, ...] | None = None
    drained_in_time: bool | None = None
    device_check: DeviceCheck | None = None
    detail: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"ok": self.ok, "action": self.action}
        if self.device_check is not None:
            doc["aliases"] = list(self.aliases or ())
            doc["drained_in_time"] = self.drained_in_time
            doc["device_check"] = self.device_check.to_json()
        if self.detail is not None:
            doc["detail"] = self.detail
        return doc


@dataclass(frozen=True)
class RollbackResult:
    """A rollback's answer: the load (after an unload) or reload of the retained ``package`` that it ran
    (``via``), or no call at all (``via`` None) with ``refusal`` when no previous package is retained."""

    action: ClassVar[str] = "rollback"

    via: LoadResult | None
    package: str | None = None
    refusal: str | None = None

    @property
    def ok(self) -> bool:
        return self.via is not None and self.via.ok

    @property
    def detail(self) -> str | None:
        """Why the rollback failed, as the load or reload it ran says it (None when it succeeded)."""
        return self.via.detail if self.via is not None else self.refusal

    def to_json(self) -> dict[str, Any]:
        if self.via is None:
            return {"ok": False, "action": self.action, "detail": self.refusal}
        return {**self.via.to_json(), "action": self.action, "package": self.package}


#: What any lifecycle call answers: the runners and the admin API take any of them.
LifecycleResult = LoadResult | UnloadResult | RollbackResult


__all__ = [
    "NOTHING_SERVED",
    "PREVIOUS_GENERATION",
    "ROLLED_BACK",
    "LifecycleResult",
    "LoadResult",
    "ReloadResult",
    "RollbackResult",
    "UnloadResult",
]
