"""Property test: whatever is done to a package, validate answers with a verdict, never a crash.

Mutations: bytes of any file, truncation, manifest values and types, random
YAML, ELF header and program-header fields, junk content, symlinks, FIFOs and
huge sparse files. Some are resealed with the test key (so the content rules
run on the garbage), the rest are not (so the hash must catch them).

Properties: exit code in {0, 1, 2}; no traceback and no "internal error";
every registered rule in the report; no rule in status error; a skip is always
explained by a failing rule; every unresealed change to a sealed file exits 1.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calctl.compiler import writer
from calctl.package.model import MANIFEST
from calctl.package.rules import RULES
from calctl.signing import keys, seal
from calctl.signing.files import SEAL_FILES
from tests.conftest import FIXTURE_PACKAGES, TEST_KEY, Cli
from tests.unit.validate.validate_factory import validate_json

BASE = FIXTURE_PACKAGES / "combined"
FILES = sorted(p.relative_to(BASE).as_posix() for p in BASE.rglob("*") if p.is_file())
HASHED = [f for f in FILES if f not in SEAL_FILES]
ELFS = [f for f in FILES if f.endswith(".elf")]
CONTENT = [f for f in FILES if f.endswith((".npy", ".json", ".txt", ".cmd", ".bin"))]
ALL_IDS = {r.id for r in RULES}
PRIVATE = keys.load_private(TEST_KEY)

# ELF64 little-endian header and program-header fields: (offset, struct format).
ELF_FIELDS = {
    "EI_CLASS": (4, "<B"),
    "EI_DATA": (5, "<B"),
    "e_type": (16, "<H"),
    "e_machine": (18, "<H"),
    "e_entry": (24, "<Q"),
    "e_phoff": (32, "<Q"),
    "e_shoff": (40, "<Q"),
    "e_phentsize": (54, "<H"),
    "e_phnum": (56, "<H"),
    "e_shnum": (60, "<H"),
    "e_shstrndx": (62, "<H"),
}
for _i in (0, 1):
    base = 64 + 56 * _i
    ELF_FIELDS.update(
        {
            f"ph{_i}.p_type": (base, "<I"),
            f"ph{_i}.p_flags": (base + 4, "<I"),
            f"ph{_i}.p_offset": (base + 8, "<Q"),
            f"ph{_i}.p_vaddr": (base + 16, "<Q"),
            f"ph{_i}.p_filesz": (base + 32, "<Q"),
            f"ph{_i}.p_memsz": (base + 40, "<Q"),
        }
    )


@dataclass(frozen=True)
class Mutation:
    kind: str
    args: tuple[Any, ...]
    reseal: bool

    @property
    def breaks_the_seal(self) -> bool:
        """Every kind changes a sealed file (hashed, or checksums.sha256 / its signature themselves)."""
        return not self.reseal


def _leaf_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _leaf_paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _leaf_paths(v, (*prefix, i))
    return out


MANIFEST_DOC = yaml.safe_load((BASE / MANIFEST).read_text())
MANIFEST_PATHS = _leaf_paths(MANIFEST_DOC)

values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2, 3, 255, 2**32, 2**64 - 1, 2**64, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        ["../../etc/passwd", "/etc/passwd", "model-a", "SCHIP", "MCHIP", "B", "", "tokenizer/model-b/tokenizer.json"]
    ),
    st.lists(st.integers(min_value=-3, max_value=70), max_size=4),
    st.just({}),
    st.just({"x": 1}),
)

mutations = st.one_of(
    st.builds(
        lambda f, pos, x: Mutation("flip", (f, pos, x), False),
        st.sampled_from(FILES),
        st.integers(min_value=0, max_value=10**7),
        st.integers(min_value=1, max_value=255),
    ),
    st.builds(
        lambda f, frac: Mutation("truncate", (f, frac), False),
        st.sampled_from(HASHED),
        st.floats(min_value=0, max_value=0.99),
    ),
    st.builds(
        lambda i, v, delete, r: Mutation("manifest", (i, v, delete), r),
        st.integers(min_value=0, max_value=len(MANIFEST_PATHS) - 1),
        values,
        st.booleans(),
        st.booleans(),
    ),
    st.builds(
        lambda t, r: Mutation("yaml", (t,), r),
        st.one_of(
            st.text(max_size=200), st.sampled_from(["{", "a: &x 1\nb: *x\n", "a: 1\na: 2\n", "- 1\n- 2\n", "", "null"])
        ),
        st.booleans(),
    ),
    st.builds(
        lambda f, field, v, r: Mutation("elf", (f, field, v), r),
        st.sampled_from(ELFS),
        st.sampled_from(sorted(ELF_FIELDS)),
        st.one_of(
            st.sampled_from([0, 1, 2, 3, 4, 5, 7, 62, 243, 0xFFFF, 2**31]),
            st.integers(min_value=0, max_value=2**64 - 1),
        ),
        st.booleans(),
    ),
    st.builds(
        lambda f, data, r: Mutation("junk", (f, data), r),
        st.sampled_from(CONTENT),
        st.binary(max_size=300),
        st.booleans(),
    ),
    st.builds(lambda f, outside: Mutation("symlink", (f, outside), False), st.sampled_from(HASHED), st.booleans()),
    st.builds(lambda f: Mutation("huge", (f,), False), st.sampled_from(HASHED)),
    st.builds(lambda f: Mutation("fifo", (f,), False), st.sampled_from(HASHED)),
)


def _apply(root: Path, m: Mutation) -> bool:
    """Apply ``m``; returns False when it changed nothing (then no verdict is implied)."""
    if m.kind == "flip":
        rel, pos, x = m.args
        p = root / rel
        data = bytearray(p.read_bytes())
        if not data:
            return False
        data[pos % len(data)] ^= x
        p.write_bytes(bytes(data))
    elif m.kind == "truncate":
        rel, frac = m.args
        p = root / rel
        size = p.stat().st_size
        if size == 0:
            return False
        with open(p, "r+b") as fh:
            fh.truncate(int(size * frac))
    elif m.kind == "manifest":
        i, value, delete = m.args
        doc = yaml.safe_load((root / MANIFEST).read_text())
        path = MANIFEST_PATHS[i]
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        if delete:
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
        new = writer.dump_manifest(doc)
        if new == (root / MANIFEST).read_bytes():
            return False
        (root / MANIFEST).write_bytes(new)
    elif m.kind == "yaml":
        (root / MANIFEST).write_text(m.args[0])
    elif m.kind == "elf":
        rel, field, value = m.args
        offset, fmt = ELF_FIELDS[field]
        p = root / rel
        before = p.read_bytes()
        data = bytearray(before)
        struct.pack_into(fmt, data, offset, value % (1 << (8 * struct.calcsize(fmt))))
        if bytes(data) == before:
            return False
        p.write_bytes(bytes(data))
    elif m.kind == "junk":
        rel, junk = m.args
        if (root / rel).read_bytes() == junk:
            return False
        (root / rel).write_bytes(junk)
    elif m.kind == "symlink":
        rel, outside = m.args
        p = root / rel
        p.unlink()
        os.symlink("/etc/hostname" if outside else os.path.relpath(root / MANIFEST, p.parent), p)
    elif m.kind == "huge":
        with open(root / m.args[0], "r+b") as fh:
            fh.truncate(65 * 1024**3)  # sparse, over the per-file limit
    elif m.kind == "fifo":
        p = root / m.args[0]
        p.unlink()
        os.mkfifo(p)
    if m.reseal:
        with contextlib.suppress(Exception):
            writer.refresh_provenance(root)
        seal.seal(root, PRIVATE)
    return True


@settings(
    max_examples=45,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(m=mutations)
def test_mutated_packages_get_a_verdict_never_a_crash(cli: Cli, m: Mutation) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="calctl-hyp-"))
    try:
        root = tmp / "pkg"
        shutil.copytree(BASE, root)
        changed = _apply(root, m)
        code, doc = validate_json(cli, root)  # asserts no traceback / internal error
        assert code in (0, 1, 2)
        assert code == (0 if doc["ok"] else 1)
        assert {c["id"] for c in doc["checks"]} == ALL_IDS
        crashed = [c for c in doc["checks"] if c["status"] == "error"]
        assert not crashed, crashed
        statuses = {c["status"] for c in doc["checks"]}
        if "skip" in statuses:
            assert "fail" in statuses, [c for c in doc["checks"] if c["status"] == "skip"]
        if changed and m.breaks_the_seal:
            assert code == 1, f"unresealed change {m} was accepted"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
