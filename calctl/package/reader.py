"""Open a package directory or tarball and build the typed :class:`Package`.

``open_package`` is what commands use: it accepts a directory or a ``.tar``,
extracts a tar safely into a temporary directory that lives as long as the
context, parses the manifest strictly and checks it against its JSON Schema.
It does not verify hashes or signatures (``calctl.signing``) and does not run
the validation rules (``calctl.package.rules``).
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from calctl import jsonsafe
from calctl.errors import PackageError, PackageFormatError, UsageError
from calctl.package import archive, schemas, yamlsafe
from calctl.package.model import COMPATIBILITY, MANIFEST, PROVENANCE, Package, package_from_document

MAX_JSON_BYTES = 16 * 1024 * 1024
#: Values (objects, arrays, strings, numbers) in one JSON document, counted before its schema is checked: the
#: schema check costs microseconds per value (1.5 million list entries: 7.5 s). A provenance of 10,000 files
#: holds about 50,000.
MAX_JSON_VALUES = jsonsafe.MAX_VALUES


def read_manifest_document(root: Path) -> dict[str, Any]:
    """The manifest as a mapping, strictly parsed. Raises PackageFormatError."""
    doc = yamlsafe.load_file(root / MANIFEST, display=MANIFEST)
    if not isinstance(doc, dict):
        found = "empty" if doc is None else type(doc).__name__
        raise PackageFormatError(
            f"top level is {found}, expected a mapping (schema calculet-package/v1)", path=MANIFEST
        )
    return doc


def manifest_errors(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return list(schemas.iter_errors("calculet-package/v1", doc))


def load_manifest(root: Path) -> Package:
    """Parse and schema-check the manifest; raise on the first problem, naming the field."""
    doc = read_manifest_document(root)
    errors = manifest_errors(doc)
    if errors:
        pointer, message = errors[0]
        more = f" (and {len(errors) - 1} more; run `calctl validate` for all)" if len(errors) > 1 else ""
        raise PackageError(f"{message}{more}", path=MANIFEST, field=pointer)
    return package_from_document(root, doc)


def read_json_document(root: Path, name: str, schema: str | None = None) -> dict[str, Any]:
    data = yamlsafe.read_document(root / name, name, MAX_JSON_BYTES, "JSON")
    try:
        doc = jsonsafe.loads(
            data,
            object_pairs_hook=_no_duplicates(name),
            parse_constant=_no_constant(name),
            parse_int=_bounded_int(name),
            parse_float=_finite_float(name),
        )
    except jsonsafe.JsonRefused as exc:
        raise PackageFormatError(_TOO_MANY if exc.kind == "values" else str(exc), path=name) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackageFormatError(f"malformed JSON: {exc}", path=name) from None
    if not isinstance(doc, dict):
        raise PackageFormatError(f"top level is {type(doc).__name__}, expected an object", path=name)
    _bound_values(doc, name)
    if schema:
        errors = list(schemas.iter_errors(schema, doc))
        if errors:
            pointer, message = errors[0]
            raise PackageError(message, path=name, field=pointer)
    return doc


_TOO_MANY = f"more than {MAX_JSON_VALUES} JSON values (a compatibility or provenance document is far smaller)"


def _bound_values(doc: Any, source: str) -> None:
    """Refuse a document of more than :data:`MAX_JSON_VALUES` values; stops counting at the limit."""
    count = 0
    stack = [doc]
    while stack:
        value = stack.pop()
        count += 1
        if count > MAX_JSON_VALUES:
            raise PackageFormatError(_TOO_MANY, path=source)
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _no_duplicates(source: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise PackageFormatError(f"duplicate key {k!r}", path=source)
            out[k] = v
        return out

    return hook


def _no_constant(source: str) -> Callable[[str], Any]:
    def hook(name: str) -> Any:
        # Python's json accepts NaN/Infinity, which JSON does not; numbers here must be finite.
        raise PackageFormatError(f"{name} is not a JSON number (non-finite numbers are refused)", path=source)

    return hook


def _bounded_int(source: str) -> Callable[[str], int]:
    def hook(text: str) -> int:
        digits = len(text.lstrip("-"))
        if digits > yamlsafe.MAX_INT_DIGITS:
            raise PackageFormatError(
                f"an integer of {digits} digits (at most {yamlsafe.MAX_INT_DIGITS} are accepted)", path=source
            )
        return int(text)

    return hook


def _finite_float(source: str) -> Callable[[str], float]:
    def hook(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise PackageFormatError(f"{text[:40]} overflows to a non-finite number", path=source)
        return value

    return hook


def read_compatibility(root: Path) -> dict[str, Any]:
    return read_json_document(root, COMPATIBILITY, "calculet-compatibility/v1")


def read_provenance(root: Path) -> dict[str, Any]:
    return read_json_document(root, PROVENANCE, "build-provenance/v1")


@contextlib.contextmanager
def package_root(path: Path) -> Iterator[Path]:
    """Yield a directory holding the package at ``path`` (a directory or a tar)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory", hint="give a package directory or .tar")
    if path.is_dir():
        yield path
        return
    if not archive.is_tar(path):
        raise PackageFormatError("neither a package directory nor a tar archive", path=str(path))
    with tempfile.TemporaryDirectory(prefix="calctl-pkg-") as tmp:
        yield archive.extract_package(path, Path(tmp))


@contextlib.contextmanager
def open_package(path: Path) -> Iterator[Package]:
    """Open a package directory or tar and yield the schema-checked :class:`Package`."""
    with package_root(path) as root:
        yield load_manifest(root)
