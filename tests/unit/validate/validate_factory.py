"""Small factories for validation tests: copy a fixture package, mutate it, reseal it.

``reseal`` regenerates model_memory_reserved_info.txt from the (possibly edited)
memory plan, recomputes the provenance subjects and re-signs with the test key,
so a mutated package passes HASH and SIG and is rejected only by the rule the
mutation targets.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from calctl.compiler import writer
from calctl.package.model import MANIFEST, RESERVED_INFO
from calctl.signing import keys, seal
from tests.conftest import FIXTURE_PACKAGES, TEST_KEY, TEST_PUB

__all__ = [
    "TEST_KEY",
    "TEST_PUB",
    "copy_package",
    "edit_json",
    "edit_manifest",
    "read_manifest",
    "reseal",
    "validate_json",
]


def copy_package(dst_parent: Path, kind: str = "combined", name: str | None = None) -> Path:
    dst = dst_parent / (name or f"pkg-{kind}")
    shutil.copytree(FIXTURE_PACKAGES / kind, dst)
    return dst


def read_manifest(root: Path) -> dict[str, Any]:
    return yaml.safe_load((root / MANIFEST).read_text())


def edit_manifest(root: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    doc = read_manifest(root)
    edit(doc)
    (root / MANIFEST).write_bytes(writer.dump_manifest(doc))


def edit_json(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def reseal(root: Path, *, reserved_info: bool = True, provenance: bool = True, key: Path = TEST_KEY) -> None:
    """Make the mutated package internally sealed again (hash and signature pass)."""
    if reserved_info:
        doc = read_manifest(root)
        (root / RESERVED_INFO).write_bytes(
            writer.render_reserved_info(doc["memory_plan"], doc["device_cfg"]["chip_dram_bytes"])
        )
    if provenance:
        writer.refresh_provenance(root)
    seal.seal(root, keys.load_private(key))


def validate_json(cli: Callable[..., Any], pkg: Path, *extra: Any) -> tuple[int, dict[str, Any]]:
    """Run ``calctl validate PKG --format json --trusted-key TEST_PUB`` in-process."""
    r = cli("validate", pkg, "--trusted-key", TEST_PUB, "--format", "json", *extra)
    text = r.out + r.err
    assert "Traceback" not in text and "internal error" not in text, text
    return r.code, r.json
