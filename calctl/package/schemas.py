"""Access to the JSON Schemas shipped in ``calctl/schemas/`` (also ``schemas/`` at the repo root)."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from importlib import resources
from typing import Any

import jsonschema

SCHEMA_FILES = {
    "calculet-package/v1": "calculet-package-v1.json",
    "calculet-compatibility/v1": "calculet-compatibility-v1.json",
    "build-provenance/v1": "build-provenance-v1.json",
    "calculet-scheduler/v1": "calculet-scheduler-v1.json",
    "calculet-dual-model/v1": "calculet-dual-model-v1.json",
    "validate-report/v1": "validate-report-v1.json",
}


@functools.cache
def load_schema(name: str) -> dict[str, Any]:
    """The schema document for ``name`` (a key of SCHEMA_FILES or a file name)."""
    filename = SCHEMA_FILES.get(name, name)
    text = resources.files("calctl").joinpath("schemas", filename).read_text(encoding="utf-8")
    return json.loads(text)


@functools.cache
def validator(name: str) -> jsonschema.protocols.Validator:
    schema = load_schema(name)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def pointer(path: Any) -> str:
    """JSON-pointer-like rendering of a jsonschema error path: ``/models/0/alias``."""
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path) if path else "/"


def iter_errors(name: str, instance: Any) -> Iterator[tuple[str, str]]:
    """Yield ``(pointer, message)`` for every schema violation, in document order."""
    errors = sorted(validator(name).iter_errors(instance), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    for err in errors:
        yield pointer(err.absolute_path), _short(err)


def _short(err: jsonschema.ValidationError) -> str:
    msg = err.message
    if len(msg) > 300:
        msg = msg[:297] + "..."
    return msg
