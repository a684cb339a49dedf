"""The report contract: every rule in every report, JSON schema, JUnit XML, exit codes, the library API."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from calctl.package import schemas
from calctl.package.rules import RULES, Group, Rule, Severity, Status, rule_by_id
from calctl.package.rules.base import Finding, Need
from calctl.package.rules.context import ValidationContext
from calctl.package.validate import REPORT_SCHEMA, ValidationPolicy, ValidationReport, run_rules, validate
from calctl.signing.policy import make_policy
from tests.conftest import FIXTURE_PACKAGES, REPO, TEST_PUB, Cli
from tests.unit.validate.validate_factory import copy_package, reseal, validate_json

ALL_IDS = [r.id for r in RULES]


def _policy(**kw) -> ValidationPolicy:
    return ValidationPolicy(trust=make_policy([TEST_PUB]), **kw)


# -- registry, rules, explain, docs ---------------------------------------------------------


def test_registry_ids_are_stable_unique_and_documented() -> None:
    assert len(ALL_IDS) == len(set(ALL_IDS))
    prefixes = {
        Group.LAYOUT: ("LAY",),
        Group.MANIFEST: ("MAN",),
        Group.HASH: ("HASH",),
        Group.SIGNATURE: ("SIG",),
        Group.CHIP: ("CHIP",),
        Group.ELF: ("ELF",),
        Group.MEMORY: ("MEM",),
        Group.TENSORS: ("GOLD",),
        Group.TOKENIZER: ("TOK",),
        Group.COMPAT: ("COMP", "PROV"),
    }
    for r in RULES:
        assert re.fullmatch(r"[A-Z]{3,4}[0-9]{3}", r.id), r.id
        assert r.id.startswith(prefixes[r.group]), r.id
        assert r.__doc__ and r.summary().endswith("."), r.id
        assert len(r.explanation) > 80, r.id
        # A report section (000/001 §N) or this project's own documentation (docs/<page>.md [§N]).
        assert r.sections and all(re.match(r"(000|001) §|docs/[a-z-]+\.md", s) for s in r.sections), r.id
    assert {r.group for r in RULES} == set(Group)
    for group in Group:  # IDs within a group are numbered 001, 002, ... without gaps
        for prefix in prefixes[group]:
            nums = sorted(int(r.id[len(prefix) :]) for r in RULES if r.group is group and r.id.startswith(prefix))
            assert nums == list(range(1, len(nums) + 1)), (prefix, nums)


def test_rules_command_lists_every_rule(cli: Cli) -> None:
    r = cli("rules", "--format", "json")
    assert r.code == 0
    assert [d["id"] for d in r.json["rules"]] == ALL_IDS
    r = cli("rules")
    assert r.code == 0
    for rule_id in ALL_IDS:
        assert rule_id in r.out


@pytest.mark.parametrize("rule_id", ALL_IDS)
def test_explain_prints_the_rule(cli: Cli, rule_id: str) -> None:
    r = cli("explain", rule_id.lower())
    assert r.code == 0, r.err
    rule = rule_by_id(rule_id)
    assert rule is not None
    assert rule_id in r.out and rule.sections[0] in r.out
    j = cli("explain", rule_id, "--format", "json").json
    assert j["id"] == rule_id and j["explanation"] == rule.explanation


def test_explain_unknown_id_is_a_usage_error(cli: Cli) -> None:
    r = cli("explain", "NOPE042")
    assert r.code == 2
    assert "NOPE042" in r.err and "Traceback" not in r.err


def test_docs_rules_md_is_generated_from_the_code() -> None:
    from calctl.package.rules.docs import render

    path = REPO / "docs" / "rules.md"
    assert path.read_text(encoding="utf-8") == render(), (
        "docs/rules.md is stale: run `python -m calctl.package.rules.docs > docs/rules.md`"
    )
    for rule_id in ALL_IDS:
        assert f"### {rule_id}" in render()


# -- fixtures validate clean ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["single", "combined", "replica"])
def test_fixture_packages_validate_with_no_skip(cli: Cli, kind: str) -> None:
    code, doc = validate_json(
        cli, FIXTURE_PACKAGES / kind, "--fail-on-skip", "--runtime-version", "0.7.6", "--profile", "1"
    )
    assert code == 0, [c for c in doc["checks"] if c["status"] != "pass"]
    assert doc["ok"] is True and doc["errors"] == 0 and doc["skipped"] == 0
    assert [c["id"] for c in doc["checks"]] == ALL_IDS  # one entry per rule, in registry order
    not_pass = {c["id"]: c["status"] for c in doc["checks"] if c["status"] != "pass"}
    assert not_pass == {"SIG002": "warn"}  # signed by the published test-only key
    assert doc["signer_key_id"] == "77618e5f0004d00a"
    assert re.fullmatch(r"[0-9a-f]{64}", doc["digest"])


def test_bundled_default_package_validates(cli: Cli) -> None:
    r = cli("validate", "--format", "json")
    assert r.code == 0, r.out
    assert r.json["ok"] is True
    assert "bundled combined sample" in r.err


# -- JSON and JUnit --------------------------------------------------------------------------


def test_json_report_validates_against_its_schema(cli: Cli, tmp_path: Path) -> None:
    root = copy_package(tmp_path)
    (root / "model-a/params/param_blk0.bin").write_bytes(b"tampered")
    for pkg in (FIXTURE_PACKAGES / "combined", root):
        r = cli("validate", pkg, "--trusted-key", TEST_PUB, "--format", "json")
        doc = r.json
        assert next(iter(doc)) == "schema_version"
        assert list(schemas.iter_errors(REPORT_SCHEMA, doc)) == []
        assert doc["errors"] == sum(c["status"] in ("fail", "error") for c in doc["checks"])
        assert doc["warnings"] == sum(c["status"] == "warn" for c in doc["checks"])
        assert r.code == (0 if doc["ok"] else 1)
    assert r.code == 1


def test_junit_is_valid_xml_with_one_testcase_per_rule(cli: Cli, tmp_path: Path) -> None:
    root = copy_package(tmp_path)
    os_name = root / "model-b" / "bad\x01name"
    os_name.write_bytes(b"x")  # a control character must not break the XML
    r = cli("validate", root, "--trusted-key", TEST_PUB, "--format", "junit")
    assert r.code == 1
    tree = ET.fromstring(r.out)
    assert tree.tag == "testsuites"
    cases = tree.findall("./testsuite/testcase")
    assert [c.get("name", "").split()[0] for c in cases] == ALL_IDS
    failed = {c.get("name", "").split()[0] for c in cases if c.find("failure") is not None}
    assert {"LAY002", "LAY006", "HASH002"} <= failed
    assert int(tree.get("tests", "0")) == len(ALL_IDS)
    assert int(tree.get("failures", "0")) == len(failed)
    for suite in tree.findall("testsuite"):
        assert int(suite.get("tests", "0")) == len(suite.findall("testcase"))


def test_junit_skip_and_fail_on_skip(cli: Cli, tmp_path: Path) -> None:
    root = copy_package(tmp_path)
    (root / "manifest.yaml").write_text("models: [\n")
    reseal(root, reserved_info=False, provenance=True)
    r = cli("validate", root, "--trusted-key", TEST_PUB, "--format", "junit")
    tree = ET.fromstring(r.out)
    skipped = [c for c in tree.iter("testcase") if c.find("skipped") is not None]
    assert skipped and int(tree.get("skipped", "0")) == len(skipped)
    assert all("MAN001" in (c.findall("skipped")[0].get("message") or "") for c in skipped)


def test_junit_fail_on_warn_turns_the_warning_into_a_failure(cli: Cli) -> None:
    r = cli("validate", FIXTURE_PACKAGES / "single", "--trusted-key", TEST_PUB, "--format", "junit", "--fail-on-warn")
    assert r.code == 1
    tree = ET.fromstring(r.out)
    failed = [c.get("name", "").split()[0] for c in tree.iter("testcase") if c.find("failure") is not None]
    assert failed == ["SIG002"]
    r = cli("validate", FIXTURE_PACKAGES / "single", "--trusted-key", TEST_PUB, "--format", "junit")
    assert r.code == 0 and int(ET.fromstring(r.out).get("failures", "-1")) == 0


def test_table_output_names_failures(cli: Cli, tmp_path: Path) -> None:
    root = copy_package(tmp_path)
    (root / "model-a/golden/prompt_ids.npy").write_bytes(b"\x93NUMPY garbage")
    r = cli("validate", root, "--trusted-key", TEST_PUB)
    assert r.code == 1
    assert "HASH001" in r.out and "FAIL" in r.out and "model-a/golden/prompt_ids.npy" in r.out
    assert "failed HASH001" in r.out


# -- options ---------------------------------------------------------------------------------


def test_usage_errors_exit_2(cli: Cli, tmp_path: Path) -> None:
    assert cli("validate", tmp_path / "nope").code == 2
    assert cli("validate", FIXTURE_PACKAGES / "combined", "--runtime-version", "latest").code == 2
    assert cli("validate", FIXTURE_PACKAGES / "combined", "--expect-models", "a,,b").code == 2
    assert cli("validate", FIXTURE_PACKAGES / "combined", "--trusted-key", tmp_path / "missing.pub").code == 2
    assert cli("validate", FIXTURE_PACKAGES / "combined", "--jobs", "0").code == 2
    assert cli("rules", "--format", "junit").code == 2


def test_expect_models_is_exact(cli: Cli) -> None:
    pkg = FIXTURE_PACKAGES / "combined"
    assert validate_json(cli, pkg, "--expect-models", "model-b,model-a")[0] == 0
    code, doc = validate_json(cli, pkg, "--expect-models", "model-a,model")  # no substring matching
    assert code == 1
    msgs = [c["message"] for c in doc["checks"] if c["id"] == "MAN004" and c["status"] == "fail"]
    assert any("'model' is not in the package" in m for m in msgs)
    assert any("'model-b' is not one of the expected" in m for m in msgs)


def test_profiles_must_be_compiled(cli: Cli, tmp_path: Path) -> None:
    from calctl.compiler.sample import build_sample
    from calctl.signing.keys import load_private
    from tests.conftest import TEST_KEY

    pkg = build_sample(tmp_path / "b4", kind="single", key=load_private(TEST_KEY), decode_profiles=(1, 4))
    assert validate_json(cli, pkg, "--profile", "4", "--profile", "1", "--fail-on-skip")[0] == 0
    code, doc = validate_json(cli, pkg, "--profile", "8")
    assert code == 1 and {c["id"] for c in doc["checks"] if c["status"] == "fail"} == {"MAN005"}


def test_trust_directory_from_environment(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / "test.pub").write_bytes(TEST_PUB.read_bytes())
    monkeypatch.setenv("CALCTL_TRUSTED_KEYS", str(trust))
    r = cli("validate", FIXTURE_PACKAGES / "single", "--format", "json")
    assert r.code == 0 and r.json["signer_key_id"] == "77618e5f0004d00a"


def test_tar_package(cli: Cli, tmp_path: Path) -> None:
    from calctl.package.archive import write_tar

    tar = tmp_path / "pkg.tar"
    write_tar(FIXTURE_PACKAGES / "replica", tar)
    code, doc = validate_json(cli, tar, "--fail-on-skip")
    assert code == 0
    assert next(c for c in doc["checks"] if c["id"] == "LAY007")["message"].startswith("archive extracted safely")


def test_unsafe_tar_is_lay007_and_everything_else_skips(cli: Cli, tmp_path: Path) -> None:
    import tarfile

    tar = tmp_path / "evil.tar"
    with tarfile.open(tar, "w") as tf:
        info = tarfile.TarInfo("pkg/escape")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tf.addfile(info)
    code, doc = validate_json(cli, tar)
    assert code == 1
    by_status = {c["id"]: c["status"] for c in doc["checks"]}
    assert by_status.pop("LAY007") == "fail"
    assert set(by_status.values()) == {"skip"}
    assert all("LAY007" in c["message"] for c in doc["checks"] if c["status"] == "skip")
    assert len(by_status) == len(ALL_IDS) - 1
    code, doc = validate_json(cli, tmp_path / "evil.tar", "--fail-on-skip")
    assert code == 1


def test_non_package_file_is_lay007(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("not a package")
    code, doc = validate_json(cli, f)
    assert code == 1
    assert next(c for c in doc["checks"] if c["id"] == "LAY007")["status"] == "fail"


# -- library API -----------------------------------------------------------------------------


def test_library_report_truthiness_and_fields(tmp_path: Path) -> None:
    good = validate(FIXTURE_PACKAGES / "combined", _policy())
    assert good and good.ok and not good.errors
    assert [w.id for w in good.warnings] == ["SIG002"]
    assert not validate(FIXTURE_PACKAGES / "combined", _policy(fail_on_warn=True))
    root = copy_package(tmp_path)
    (root / "model-b/decode/ccu1_chip1.cmd").write_bytes(b"")
    bad = validate(root, _policy())
    assert not bad and bad.ok is False
    assert bad.failed_ids() == ("HASH001",)
    assert bad.status_of("HASH001") is Status.FAIL and bad.status_of("ELF001") is Status.PASS
    assert bad.errors[0].file == "model-b/decode/ccu1_chip1.cmd"
    unsigned = validate(FIXTURE_PACKAGES / "single")  # default policy trusts nobody
    assert not unsigned and unsigned.failed_ids() == ("SIG001",)


def test_jobs_do_not_change_the_verdict() -> None:
    a = validate(FIXTURE_PACKAGES / "combined", _policy(jobs=1))
    b = validate(FIXTURE_PACKAGES / "combined", _policy(jobs=8))
    assert [(c.id, c.status) for c in a.checks] == [(c.id, c.status) for c in b.checks]


class _Crashes(Rule):
    """A rule that crashes on everything (test only)."""

    id = "TST001"
    group = Group.LAYOUT
    needs = frozenset({Need.ROOT})

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        yield self.note("about to crash")
        raise ZeroDivisionError("division by zero in a rule")


class _Warns(Rule):
    """A warning-severity rule that always finds something (test only)."""

    id = "TST002"
    group = Group.LAYOUT
    severity = Severity.WARNING

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        yield self.problem("always", file="x")


def test_a_crashing_rule_reports_error_not_a_traceback() -> None:
    ctx = ValidationContext(FIXTURE_PACKAGES / "single", display="single", policy=_policy())
    checks = run_rules(ctx, (_Crashes, _Warns, *RULES[:2]))
    crash = [c for c in checks if c.id == "TST001"]
    assert [c.status for c in crash] == [Status.ERROR]
    assert "ZeroDivisionError: division by zero in a rule" in crash[0].message
    assert [c.status for c in checks if c.id == "TST002"] == [Status.WARN]
    report = ValidationReport("single", checks)
    assert not report.ok and report.failed_ids() == ("TST001",)


def test_a_crashing_registered_rule_via_cli(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from calctl.package.rules import memory

    def boom(self, ctx):
        raise KeyError("unexpected")

    monkeypatch.setattr(memory.KvSize, "check", boom)
    code, doc = validate_json(cli, FIXTURE_PACKAGES / "combined")
    assert code == 1
    mem5 = [c for c in doc["checks"] if c["id"] == "MEM005"]
    assert [c["status"] for c in mem5] == ["error"] and "KeyError" in mem5[0]["message"]
    assert {c["id"] for c in doc["checks"]} == set(ALL_IDS)


def test_a_refusal_names_every_failing_rule_with_its_file_and_how_many_more() -> None:
    """#53 item 6: a refusal said ``(HASH001)`` without the file, or four findings of the first rule only."""
    from calctl.package.rules.base import Group, Severity, Status
    from calctl.package.validate import RuleFinding, ValidationReport

    def finding(rule: str, file: str, message: str, status: Status = Status.FAIL) -> RuleFinding:
        group = Group.MANIFEST if rule.startswith("MAN") else Group.HASH
        return RuleFinding(status, message, file=file, id=rule, group=group, severity=Severity.ERROR)

    many = tuple(finding("MAN007", "manifest.yaml", f"names 'x{i}.bin', which is not in the package") for i in range(6))
    missing = finding("HASH001", "model-a/x0.bin", "listed in checksums.sha256 but missing from the package")
    report = ValidationReport("pkg", (*many, missing, finding("LAY001", "a", "fine", Status.PASS)))
    said = report.refusal(limit=4)
    assert "HASH001 model-a/x0.bin: listed in checksums.sha256 but missing from the package" in said
    assert said.startswith("MAN007 manifest.yaml: names 'x0.bin'") and said.endswith("; and 3 more MAN007")
    assert "LAY001" not in said
    assert ValidationReport("pkg", ()).refusal() == "rejected by policy"
