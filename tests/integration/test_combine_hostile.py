"""Hostile ``calctl combine``: an OUT inside an input package, two models with one alias, a tampered input."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import TEST_KEY, TEST_PUB, Cli, CopyFixture
from tests.unit.compiler.checkpoint_factory import write_hf_dir

TRUST = ("--trusted-key", str(TEST_PUB))


def _pkg(cli: Cli, tmp: Path, name: str, alias: str, seed: int) -> Path:
    d, _, _ = write_hf_dir(tmp / f"hf-{name}", "llama", seed=seed)
    out = tmp / name
    r = cli("import", "hf", d, out, "--key", TEST_KEY, "--alias", alias)
    assert r.code == 0, r.err
    return out


def test_out_inside_an_input_package_is_refused_and_the_input_still_verifies(cli: Cli, tmp_path: Path) -> None:
    a = _pkg(cli, tmp_path, "A", "m", 1)
    before = sorted(p.relative_to(a) for p in a.rglob("*"))
    r = cli("combine", a, a, a / "inside", "--key", TEST_KEY, *TRUST)
    assert r.code == 2, r.err
    assert "is inside the input package" in " ".join(r.err.split()) and "internal error" not in r.err, r.err
    assert sorted(p.relative_to(a) for p in a.rglob("*")) == before
    assert cli("verify", a, *TRUST).code == 0


def test_two_models_with_one_alias_are_refused(cli: Cli, tmp_path: Path) -> None:
    a = _pkg(cli, tmp_path, "A", "m", 1)
    b = _pkg(cli, tmp_path, "B", "m", 2)
    r = cli("combine", a, b, tmp_path / "AB", "--key", TEST_KEY, *TRUST)
    assert r.code == 2 and "both models would be alias 'm'" in r.err, r.err
    r = cli("combine", a, a, tmp_path / "AA", "--key", TEST_KEY, *TRUST, "--alias-a", "x", "--alias-b", "x")
    assert r.code == 2 and "alias 'x'" in r.err, r.err
    assert not (tmp_path / "AB").exists() and not (tmp_path / "AA").exists()


def test_a_tampered_manifest_in_an_input_exits_1_naming_it(cli: Cli, tmp_path: Path) -> None:
    a = _pkg(cli, tmp_path, "A", "m", 1)
    manifest = a / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace("context_limit", "context_limit ", 1))
    r = cli("combine", a, a, tmp_path / "AA", "--key", TEST_KEY, *TRUST)
    assert r.code == 1 and "manifest.yaml" in r.err, r.err
    assert not (tmp_path / "AA").exists()


def test_an_empty_golden_npy_in_an_input_exits_1_naming_it(cli: Cli, copy_fixture: CopyFixture, tmp_path: Path) -> None:
    # numpy reads an empty .npy with EOFError, which click takes for end of input: it was "interrupted", exit 130.
    a = copy_fixture("single")
    (a / "model-a/golden/prompt_ids.npy").write_bytes(b"")
    assert cli("pack", a, "--key", TEST_KEY).code == 0  # sealed again: only the .npy itself is wrong
    r = cli("combine", a, a, tmp_path / "AA", "--key", TEST_KEY, *TRUST)
    assert r.code == 1 and "prompt_ids.npy" in r.err and "interrupted" not in r.err, r.err
    assert not (tmp_path / "AA").exists()
