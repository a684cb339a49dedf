"""Issue 16 fuzzing: manifest values and tar member lists never crash a command or reach configure.

* Manifest values: one leaf of the fixture manifest is replaced by a value of
  another type, an integral float, a non-finite number, a huge integer or odd
  unicode; the package is resealed (so only the value is wrong). ``validate``
  must answer 0, 1 or 2 with a report (never an internal error), and a package
  it refuses must be refused by the runner before ``configure``.
* Tar member lists: an archive of arbitrary names (``..``, absolute, clashing,
  over-long, unicode), types (file, directory, link, FIFO) and sizes. Extraction
  either succeeds or raises :class:`PackageFormatError`, ``validate`` refuses
  the archive with exit 1 and a report, and the runner stops before ``configure``.
"""

from __future__ import annotations

import contextlib
import io
import math
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calctl.compiler import writer
from calctl.errors import CheckFailed, PackageFormatError
from calctl.package import archive
from calctl.package.model import MANIFEST
from calctl.runners.context import RunContext
from calctl.runners.device import DeviceSpec
from calctl.signing import keys, seal
from calctl.signing.policy import make_policy
from tests.conftest import FIXTURE_PACKAGES, TEST_KEY, TEST_PUB, Cli
from tests.unit.validate.validate_factory import validate_json

pytestmark = pytest.mark.slow  # every manifest leaf fuzzed: its file is scheduled first

BASE = FIXTURE_PACKAGES / "combined"
PRIVATE = keys.load_private(TEST_KEY)
HUGE = "__HUGE_INTEGER__"


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaves(v, (*path, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _leaves(v, (*path, i))]
    return [path]


DOC = yaml.safe_load((BASE / MANIFEST).read_text())
LEAVES = _leaves(DOC)


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


# Numeric leaves are where integral floats and non-finite numbers bite; they are drawn more often.
NUMERIC = [p for p in LEAVES if isinstance(_at(DOC, p), (int, float)) and not isinstance(_at(DOC, p), bool)]

values = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=0, max_value=10**6).map(float),  # integral floats: 384.0
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 5e-324]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(HUGE),  # an integer of thousands of digits (Python's int-string limit)
    st.text(max_size=12),  # unicode, control characters, U+2028, ...
    st.sampled_from(["model-a\n", "model-b", "..", "/etc/passwd", "\u2028", "０", ""]),
    st.booleans(),
    st.none(),
    st.lists(st.integers(min_value=-3, max_value=400), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
paths = st.one_of(st.sampled_from(LEAVES), st.sampled_from(NUMERIC))


def _write_manifest(root: Path, path: tuple[Any, ...], value: Any) -> None:
    doc = yaml.safe_load((root / MANIFEST).read_text())
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    text = writer.dump_manifest(doc).decode()
    if value == HUGE:
        text = text.replace(HUGE, "7" * 5000)
    (root / MANIFEST).write_text(text)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(path=paths, value=values)
def test_manifest_values_never_crash_and_refused_never_reach_configure(
    cli: Cli, path: tuple[Any, ...], value: Any
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="calctl-fuzz-"))
    try:
        root = tmp / "pkg"
        shutil.copytree(BASE, root)
        _write_manifest(root, path, value)
        writer.refresh_provenance(root)
        seal.seal(root, PRIVATE)
        code, doc = validate_json(cli, root)  # asserts: no traceback, no internal error, JSON printed
        assert code in (0, 1, 2)
        assert code == (0 if doc["ok"] else 1)
        assert not [c for c in doc["checks"] if c["status"] == "error"]
        if code != 0:
            _assert_refused_before_configure(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _assert_refused_before_configure(pkg: Path) -> None:
    """The runner on the mock refuses ``pkg`` as a failed check and never configures the board."""
    ctx = RunContext(pkg, trust=make_policy([TEST_PUB]), device=DeviceSpec())
    with ctx, pytest.raises(CheckFailed):
        ctx.prepare()
    assert not ctx.configured
    assert "configure" not in [s.name for s in ctx.log.records]


NAMES = st.one_of(
    st.sampled_from(
        ["pkg", "pkg/a", "pkg/a/b", "pkg/../x", "/abs", "pkg/./a", "pkg//a", "a", "pkg/" + "n" * 300, "pkg/\u2028", ""]
    ),
    st.lists(st.sampled_from(["pkg", "a", "b", "..", ".", "é", "x" * 100]), min_size=1, max_size=4).map("/".join),
)
MEMBER = st.tuples(NAMES, st.sampled_from(["file", "dir", "symlink", "hardlink", "fifo"]), st.integers(0, 64))


def _tar_of(path: Path, members: list[tuple[str, str, int]]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, size in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            elif kind in ("symlink", "hardlink"):
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = "pkg/a"
                tf.addfile(info)
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
                tf.addfile(info)
            else:
                info.size = size
                tf.addfile(info, io.BytesIO(b"z" * size))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(members=st.lists(MEMBER, max_size=8))
def test_tar_member_lists_are_refused_or_extracted_never_crash(cli: Cli, members: list[tuple[str, str, int]]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="calctl-fuzz-tar-"))
    try:
        tar = tmp / "p.tar"
        try:
            _tar_of(tar, members)
        except (ValueError, OSError):
            return  # tarfile itself cannot write this list; nothing to test
        dest = tmp / "out"
        dest.mkdir()
        with contextlib.suppress(PackageFormatError):  # refused, with a message: the contract
            archive.extract_package(tar, dest)
        code, doc = validate_json(cli, tar, "--trusted-key", TEST_PUB)
        assert code in (0, 1, 2)
        assert code == 1 and not doc["ok"], "an arbitrary member list is no package"
        _assert_refused_before_configure(tar)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
