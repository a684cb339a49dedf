"""Every promise of the C ABI has a conformance check that tries it, and every check says which promises it tries.

In the spirit of the validation rules' coverage test: a clause of ``calctl.runtime.conformance.clauses`` that no
check cites, a check that cites no clause or an unknown one, or a clause missing from (or stale in) the table of
docs/calrt-c-abi.md §13 fails the suite.
"""

from __future__ import annotations

import re

from calctl.cli._options import RunLevel
from calctl.runtime.conformance import CHECKS, CLAUSE_IDS, CLAUSES, ConformanceLevel
from tests.conftest import REPO

DOC = REPO / "docs" / "calrt-c-abi.md"
ROW = re.compile(r"^\| `(?P<id>[A-Z]+-\d+)` \| (?P<section>§\d+) \| (?P<promise>[^|]+) \| (?P<checks>[^|]+) \|$")


def _cited() -> dict[str, list[str]]:
    by: dict[str, list[str]] = {c.id: [] for c in CLAUSES}
    for check in CHECKS:
        for clause in check.clauses:
            by.setdefault(clause, []).append(check.name)
    return by


def test_clause_ids_are_unique_and_well_formed() -> None:
    ids = [c.id for c in CLAUSES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert all(re.fullmatch(r"[A-Z]+-\d+", i) for i in ids), ids


def test_every_check_cites_known_clauses() -> None:
    for check in CHECKS:
        assert check.clauses, f"check {check.name} cites no clause of docs/calrt-c-abi.md"
        unknown = set(check.clauses) - CLAUSE_IDS
        assert not unknown, f"check {check.name} cites unknown clauses {sorted(unknown)}"


def test_every_clause_has_a_check() -> None:
    untried = [clause for clause, checks in _cited().items() if not checks]
    assert not untried, f"clauses no conformance check tries: {untried}"


def test_the_abi_page_lists_every_clause_with_its_checks() -> None:
    rows = {m["id"]: m for line in DOC.read_text().splitlines() if (m := ROW.match(line))}
    cited = _cited()
    assert set(rows) == CLAUSE_IDS, (sorted(CLAUSE_IDS - set(rows)), sorted(set(rows) - CLAUSE_IDS))
    for clause in CLAUSES:
        row = rows[clause.id]
        assert row["section"] == clause.section, (clause.id, row["section"])
        named = set(re.findall(r"`([a-z_0-9]+)`", row["checks"]))
        assert named == set(cited[clause.id]), (clause.id, sorted(named), sorted(cited[clause.id]))


def test_the_cli_levels_are_the_suites() -> None:
    assert [x.value for x in RunLevel] == [x.value for x in ConformanceLevel]
