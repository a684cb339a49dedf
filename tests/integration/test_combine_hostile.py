"""Hostile ``calctl combine``: an OUT inside an input package, two models with one alias, a tampered input."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from tests.conftest import TEST_KEY, TEST_PUB, Cli, CopyFixture
from tests.unit.compiler.checkpoint_factory import write_hf_dir
from tests.unit.validate.validate_factory import edit_manifest, reseal, validate_json

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


def _swap_offsets(root: Path, a: str, b: str) -> None:
    """Map tensors ``a`` and ``b`` (same shape) to each other's bytes: same blob, another model."""

    def edit(doc: dict) -> None:
        tensors = {t["name"]: t for m in doc["models"] for t in m["params"]["tensors"] if t["name"] in (a, b)}
        tensors[a]["offset"], tensors[b]["offset"] = tensors[b]["offset"], tensors[a]["offset"]

    edit_manifest(root, edit)
    reseal(root)


def test_a_replica_by_files_only_is_refused_naming_the_tensors_that_differ(cli: Cli, tmp_path: Path) -> None:
    # Issue 54: the same blob and tokenizer, two tensors' offsets swapped: combine wrote a signed "replica".
    a = _pkg(cli, tmp_path, "A", "m", 1)
    b = tmp_path / "B"
    shutil.copytree(a, b)
    _swap_offsets(b, "layers.0.wk", "layers.0.wv")
    r = cli("combine", a, b, tmp_path / "AB", "--key", TEST_KEY, *TRUST, "--alias-a", "x", "--alias-b", "y")
    text = " ".join(r.err.split())
    assert r.code == 1, r.err
    assert "not the same weights" in text and "layers.0.wk, layers.0.wv" in text, text
    assert not (tmp_path / "AB").exists()


def test_a_replica_of_one_package_twice_is_still_written(cli: Cli, tmp_path: Path) -> None:
    a = _pkg(cli, tmp_path, "A", "m", 1)
    r = cli("combine", a, a, tmp_path / "AA", "--key", TEST_KEY, *TRUST, "--format", "json")
    assert r.code == 0 and r.json["kind"] == "replica", r.out + r.err
    code, doc = validate_json(cli, tmp_path / "AA")
    assert code == 0 and {c["id"]: c["status"] for c in doc["checks"]}["GOLD008"] == "pass"


def test_validate_flags_a_replica_whose_chips_hold_different_weights(cli: Cli, tmp_path: Path) -> None:
    a = _pkg(cli, tmp_path, "A", "m", 1)
    assert cli("combine", a, a, tmp_path / "AA", "--key", TEST_KEY, *TRUST).code == 0
    _swap_offsets(tmp_path / "AA", "layers.1.wk", "layers.1.wv")  # both models' names: the second model's pair
    code, doc = validate_json(cli, tmp_path / "AA")
    gold8 = [c for c in doc["checks"] if c["id"] == "GOLD008"]
    assert code == 1 and gold8[0]["status"] == "fail", gold8
    assert "layers.1.wk, layers.1.wv" in gold8[0]["message"], gold8


def test_a_verified_input_whose_tensor_lies_past_its_blob_exits_1_naming_it(cli: Cli, tmp_path: Path) -> None:
    a = _pkg(cli, tmp_path, "A", "m", 1)

    def edit(doc: dict) -> None:
        doc["models"][0]["params"]["tensors"][-1]["offset"] += 10**9

    edit_manifest(a, edit)
    reseal(a)
    r = cli("combine", a, a, tmp_path / "AA", "--key", TEST_KEY, *TRUST)
    text = " ".join(r.err.split())
    # Refused by validate's rules before any tensor is hashed (it was exit 70, then the extent check's exit 1).
    assert r.code == 1 and "does not validate: GOLD005" in text and "runs past the end" in text, text
    assert "internal error" not in text
    assert not (tmp_path / "AA").exists()


def _edit_tensors(root: Path, edit: Callable[[list[dict]], None]) -> None:
    edit_manifest(root, lambda doc: edit(doc["models"][0]["params"]["tensors"]))
    reseal(root)


def test_a_verified_input_whose_tensors_overlap_or_name_a_missing_file_exits_1(cli: Cli, tmp_path: Path) -> None:
    a = _pkg(cli, tmp_path, "A", "m", 1)
    b = tmp_path / "B"
    shutil.copytree(a, b)

    def over_and_over(tensors: list[dict]) -> None:  # 200 names for the largest tensor's bytes: 200 x the hashing
        big = max(tensors, key=lambda t: t["shape"][0] * t["shape"][-1])
        tensors += [{**big, "name": f"copy{i}"} for i in range(200)]

    _edit_tensors(a, over_and_over)
    r = cli("combine", a, a, tmp_path / "AA", "--key", TEST_KEY, *TRUST)
    text = " ".join(r.err.split())
    assert r.code == 1 and "does not validate: GOLD005" in text and "copy0 and copy1 overlap" in text, text

    def missing(tensors: list[dict]) -> None:
        tensors[0]["file"] = tensors[0]["file"].replace("param_blk0", "nope")

    _edit_tensors(b, missing)
    r = cli("combine", b, b, tmp_path / "BB", "--key", TEST_KEY, *TRUST)
    text = " ".join(r.err.split())
    assert r.code == 1 and "nope.bin" in text and "internal error" not in text, text
