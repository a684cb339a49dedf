"""Issue 54: ``inspect`` shows a package without validating it. Against every bad package the validate tests
build it never crashes, reads within bounds, and says plainly that what it shows is unverified."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from calctl.package import info
from tests.conftest import TEST_PUB, Cli
from tests.unit.validate import test_validate_bad_packages as bad
from tests.unit.validate import test_validate_rule_cases as rule_cases
from tests.unit.validate.validate_factory import copy_package, reseal

MUTATIONS: list[tuple[str, Callable[[Path], None]]] = [
    *((f"{c[2]}-{c[1].__name__}-{i}", c[1]) for i, c in enumerate(bad.CASES)),
    *((f"{c[0]}-{c[1].__name__}-{i}", c[1]) for i, c in enumerate(rule_cases.CASES)),
]


def _inspect(cli: Cli, root: Path) -> tuple[int, str]:
    r = cli("inspect", root, "--trusted-key", TEST_PUB, "--format", "json")
    text = r.out + r.err
    assert "Traceback" not in text and "internal error" not in text, text
    assert r.code in (0, 1, 2), text
    return r.code, r.out


@pytest.mark.parametrize("mutate", [m for _, m in MUTATIONS], ids=[n for n, _ in MUTATIONS])
def test_inspect_shows_a_hostile_package_as_unverified_or_refuses_it(
    tmp_path: Path, cli: Cli, mutate: Callable[[Path], None]
) -> None:
    root = copy_package(tmp_path)
    mutate(root)
    code, out = _inspect(cli, root)
    if code == 0:
        import json

        doc = json.loads(out)
        verification = doc["verification"]
        assert verification["verified"] is False and verification["files_hashed"] is False, verification


def test_the_table_says_unverified(tmp_path: Path, cli: Cli) -> None:
    r = cli("inspect", copy_package(tmp_path), "--trusted-key", TEST_PUB)
    assert r.code == 0 and "UNVERIFIED" in r.out and "calctl verify" in r.out, r.out


def test_a_package_directory_of_too_many_entries_is_listed_no_further_than_the_limit(
    tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(info, "MAX_LISTED", 50)
    root = copy_package(tmp_path)
    junk = root / "junk"
    junk.mkdir()
    for i in range(200):
        (junk / f"f{i}").write_bytes(b"")
    reseal(root)
    r = cli("inspect", root, "--trusted-key", TEST_PUB)
    assert r.code == 0 and "listing stopped at 50 entries" in " ".join(r.out.split()), r.out
