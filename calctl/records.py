"""Machine-readable records: the one JSON form of every document calctl writes.

``dumps`` is used by the CLI's ``--format json``, by report files and by the
soak's evidence log alike, so a figure is rendered the same way everywhere.
Nothing here prints or knows about terminals (that is ``calctl.cli._output``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from pathlib import Path
from typing import Any

#: Version of every JSON document calctl prints. Bump on an incompatible change.
SCHEMA_VERSION = "1"


def to_jsonable(obj: Any) -> Any:
    """Convert dataclasses, enums, paths and numpy scalars into plain JSON values.

    Non-finite floats become ``null``: a figure that cannot be measured is absent,
    never a fake number.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj) if isinstance(obj, (set, frozenset)) else obj
        return [to_jsonable(v) for v in items]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        return to_jsonable(obj.item())
    return obj


def dumps(document: dict[str, Any]) -> str:
    body = {"schema_version": SCHEMA_VERSION, **to_jsonable(document)}
    return json.dumps(body, indent=2, sort_keys=False, allow_nan=False)


__all__ = ["SCHEMA_VERSION", "dumps", "to_jsonable"]
