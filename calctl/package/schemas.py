"""Access to the JSON Schemas shipped in ``calctl/schemas/`` (also ``schemas/`` at the repo root).

Validation is stricter than stock jsonschema in three ways, each a hole a
hostile manifest used: ``integer`` means a Python int (not ``384.0``),
``number`` means a finite one (not NaN or infinity), and a ``pattern``'s final
``$`` matches only at the end of the string (not before a trailing newline).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
from collections.abc import Iterator
from importlib import resources
from typing import Any

import jsonschema

from calctl import textsafe

SCHEMA_FILES = {
    "calculet-package/v1": "calculet-package-v1.json",
    "calculet-compatibility/v1": "calculet-compatibility-v1.json",
    "build-provenance/v1": "build-provenance-v1.json",
    "calculet-scheduler/v1": "calculet-scheduler-v1.json",
    "calculet-dual-model/v1": "calculet-dual-model-v1.json",
    "validate-report/v1": "validate-report-v1.json",
    "report/v1": "report-v1.json",
    "calculet-board-profile/v1": "calculet-board-profile-v1.json",
    "calctl-fleet-report/v1": "calctl-fleet-report-v1.json",
    "calctl-accept-targets/v1": "calctl-accept-targets-v1.json",
}


@functools.cache
def load_schema(name: str) -> dict[str, Any]:
    """The schema document for ``name`` (a key of SCHEMA_FILES or a file name)."""
    filename = SCHEMA_FILES.get(name, name)
    text = resources.files("calctl").joinpath("schemas", filename).read_text(encoding="utf-8")
    return json.loads(text)


def _is_integer(_checker: Any, instance: Any) -> bool:
    # jsonschema counts 384.0 as an integer (JSON Schema's "mathematical" integer); a
    # manifest's integers are Python ints, so an integral float is refused where an
    # integer is meant (it crashed shape arithmetic after configure).
    return isinstance(instance, int) and not isinstance(instance, bool)


def _is_number(_checker: Any, instance: Any) -> bool:
    if isinstance(instance, bool):
        return False
    if isinstance(instance, int):
        return True
    return isinstance(instance, float) and math.isfinite(instance)


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    """``pattern`` with ECMA-262 semantics: a final ``$`` matches only at the very end.

    Python's ``$`` also matches before a trailing newline, so ``"model-a\\n"``
    passed ``^[A-Za-z0-9._-]+$``. Schemas keep the portable ``^...$`` spelling;
    this checks it as JSON Schema means it.
    """
    if not validator.is_type(instance, "string"):
        return
    if _ecma(pattern).search(instance) is None:
        bad = sorted({c for c in instance if not textsafe.is_safe(c)})
        if bad and _ecma(pattern).search("".join(c for c in instance if textsafe.is_safe(c))) is not None:
            # The value is fine but for characters that would act on a terminal or hide text: say which.
            shown = ", ".join(textsafe.plain(c) for c in bad[:8])
            yield jsonschema.ValidationError(
                f"{textsafe.plain(repr(instance))} holds control, bidirectional or surrogate characters "
                f"({shown}); a name, version or path cannot hold them"
            )
            return
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


@functools.cache
def _ecma(pattern: str) -> re.Pattern[str]:
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


@functools.cache
def validator(name: str) -> jsonschema.protocols.Validator:
    schema = load_schema(name)
    base = jsonschema.validators.validator_for(schema)
    base.check_schema(schema)
    strict = jsonschema.validators.extend(
        base,
        validators={"pattern": _pattern},
        type_checker=base.TYPE_CHECKER.redefine_many({"integer": _is_integer, "number": _is_number}),
    )
    return strict(schema, format_checker=base.FORMAT_CHECKER)


def pointer(path: Any) -> str:
    """JSON-pointer-like rendering of a jsonschema error path: ``/models/0/alias``."""
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path) if path else "/"


#: Schema violations reported for one document; the search stops at the next one. (A 13 MB compatibility.json
#: of one million bad list entries made a million findings: 148 s and 4.5 GB before the report was printed.)
MAX_SCHEMA_ERRORS = 100


def iter_errors(name: str, instance: Any) -> Iterator[tuple[str, str]]:
    """Yield ``(pointer, message)`` for each schema violation, in document order: at most
    :data:`MAX_SCHEMA_ERRORS` of them, then one ``("/", "more than N schema violations…")`` if there are more."""
    found = list(itertools.islice(validator(name).iter_errors(instance), MAX_SCHEMA_ERRORS + 1))
    errors = sorted(found[:MAX_SCHEMA_ERRORS], key=lambda e: (list(map(str, e.absolute_path)), e.message))
    for err in errors:
        yield pointer(err.absolute_path), _short(err)
    if len(found) > MAX_SCHEMA_ERRORS:
        yield (
            "/",
            (
                f"more than {MAX_SCHEMA_ERRORS} schema violations; the first {MAX_SCHEMA_ERRORS} found are listed "
                "and the document was searched no further"
            ),
        )


def _short(err: jsonschema.ValidationError) -> str:
    msg = textsafe.shorten(err.message)  # a quoted 60 KB value: its head and tail, and its length
    if len(msg) > 300:
        msg = msg[:297] + "..."
    return msg
