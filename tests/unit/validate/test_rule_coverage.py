"""Every validation rule is tested both ways: a bad package fails it by its ID, a good one passes it.

The bad half is checked by name: each rule ID in the registry must appear as a string in the code of at
least one other test module (comments and docstrings do not count), so a rule added later comes with the
test that names it. The good half is checked here: each rule passes on at least one of the good packages
(the committed fixtures, and the combined fixture re-signed with a key that is not the test-only one) and
fails on none of them.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

from calctl.package.rules import RULES
from calctl.signing import keys, seal
from tests.conftest import FIXTURE_PACKAGES, REPO, Cli
from tests.unit.validate.validate_factory import validate_json

RULE_ID = re.compile(r"\b[A-Z]+[0-9]{3}\b")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are module, class or function docstrings."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _ids_named_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip = _docstrings(tree)
    named: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            named.update(RULE_ID.findall(node.value))
    return named


def test_every_rule_id_is_named_by_another_test() -> None:
    here = Path(__file__).resolve()
    named_by: dict[str, list[str]] = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if path.resolve() == here:
            continue
        for rule_id in _ids_named_in(path):
            named_by.setdefault(rule_id, []).append(path.relative_to(REPO).as_posix())
    missing = [r.id for r in RULES if r.id not in named_by]
    assert not missing, (
        f"rule IDs no test names: {missing}. Each rule needs a bad package that fails it by that ID "
        "(see tests/unit/validate/test_validate_rule_cases.py and validate_factory.py)"
    )


def test_every_rule_passes_on_a_good_package(tmp_path: Path, cli: Cli) -> None:
    # The fixtures are signed with the published test-only key, which one rule only warns about: a package
    # sealed with a key of its own is the good package for that rule.
    own = tmp_path / "own-key"
    keys.generate(own)
    resigned = tmp_path / "combined-own-key"
    shutil.copytree(FIXTURE_PACKAGES / "combined", resigned)
    seal.seal(resigned, keys.load_private(Path(f"{own}.key")))
    packages = [FIXTURE_PACKAGES / k for k in ("single", "combined", "replica")] + [resigned]

    passed: dict[str, set[str]] = {r.id: set() for r in RULES}
    for pkg in packages:
        code, doc = validate_json(
            cli, pkg, "--trusted-key", f"{own}.pub", "--runtime-version", "0.7.6", "--profile", "1"
        )
        assert code == 0, [c for c in doc["checks"] if c["status"] in ("fail", "error")]
        statuses: dict[str, set[str]] = {}
        for c in doc["checks"]:
            statuses.setdefault(c["id"], set()).add(c["status"])
        for rule_id, seen in statuses.items():
            assert not seen & {"fail", "error"}, (pkg.name, rule_id, seen)
            if seen == {"pass"}:
                passed[rule_id].add(pkg.name)
    never = [rule_id for rule_id, where in passed.items() if not where]
    assert not never, f"rules that pass on no good package: {never}"
