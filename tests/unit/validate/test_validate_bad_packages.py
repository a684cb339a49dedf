"""Per-group resealed bad packages: each is rejected by exactly its group's rule.

Every package here is mutated and then resealed with the test key (reserved
info regenerated, provenance refreshed, checksums re-signed) unless the group
under test is the seal itself, so HASH and SIG pass and the only failing rules
belong to the group under test. The rule ID must be in the CLI's JSON output.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calctl.compiler import elfwriter, writer
from calctl.package import elfdefs
from calctl.package.model import PROVENANCE, RESERVED_INFO
from calctl.signing import keys, seal
from calctl.signing.files import SIGNATURE
from tests.conftest import Cli
from tests.unit.validate.validate_factory import copy_package, edit_json, edit_manifest, reseal, validate_json

GROUP_PREFIX = {
    "layout": "LAY",
    "manifest": "MAN",
    "hash": "HASH",
    "signature": "SIG",
    "chip": "CHIP",
    "elf": "ELF",
    "memory": "MEM",
    "tensors": "GOLD",
    "tokenizer": "TOK",
    "compat": ("COMP", "PROV"),
}


def _model(doc: dict[str, Any], alias: str) -> dict[str, Any]:
    return next(m for m in doc["models"] if m["alias"] == alias)


def _graph(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(g for m in doc["models"] for g in m["graphs"] if g["name"] == name)


def _region(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for c in doc["memory_plan"]["chips"] for r in c["regions"] if r["name"] == name)


# -- mutations (each leaves the package sealed unless it targets the seal) -----------------


def stray_file(root: Path) -> None:
    (root / "model-a" / "notes.txt").write_text("left over from a hand-assembled package\n")
    reseal(root)


def batched_decode_without_lane_contract(root: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        _graph(doc, "model_a_decode")["batch_profiles"] = [1, 4]

    edit_manifest(root, edit)
    reseal(root)


def provenance_changed_after_sealing(root: Path) -> None:
    with open(root / PROVENANCE, "a") as fh:
        fh.write("\n")  # checksums.sha256 (and its signature) still name the old bytes


def signed_by_untrusted_key(root: Path) -> None:
    kp = root.parent / "other"
    keys.generate(kp)
    seal.seal(root, keys.load_private(Path(f"{kp}.key")))


def unsigned(root: Path) -> None:
    (root / SIGNATURE).unlink()


def model_a_kv_on_both_chips(root: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        kv = next(s for s in _model(doc, "model-a")["sections"] if s["kind"] == "kv")
        kv["chip_mask"] = 3  # 001 §3: a section of A carrying chip1's mask

    edit_manifest(root, edit)
    reseal(root)


def missing_ccu1_elf(root: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        g = _graph(doc, "model_a_prefill")
        g["sections"] = [s for s in g["sections"] if not (s["kind"] == "code" and s["calcore"] == 1)]

    edit_manifest(root, edit)
    (root / "model-a/prefill/ccu1_chip0.elf").unlink()
    reseal(root)


def _rewrite_elf(root: Path, rel: str, **overrides: Any) -> None:
    import yaml

    doc = yaml.safe_load((root / "manifest.yaml").read_text())
    section = next(s for m in doc["models"] for g in m["graphs"] for s in g["sections"] if s.get("file") == rel)
    graph = next(g for m in doc["models"] for g in m["graphs"] for s in g["sections"] if s.get("file") == rel)
    chip = section["chip_mask"].bit_length() - 1
    args: dict[str, Any] = {
        "machine": writer.EM_RISCV,
        "vaddr": section["vaddr"],
        "text": b"\x13" * 2048,
        "bss": 1024,
        "binding": f"graph={graph['name']};kind={graph['kind']};chip={chip};calcore={section['calcore']}",
    }
    args.update(overrides)
    (root / rel).write_bytes(elfwriter.write_elf(**args))


def elf_for_x86(root: Path) -> None:
    _rewrite_elf(root, "model-a/prefill/ccu0_chip0.elf", machine=62)
    reseal(root)


def elf_writable_and_executable(root: Path) -> None:
    p = root / "model-b/decode/ccu0_chip1.elf"
    data = bytearray(p.read_bytes())
    ph = elfwriter.EHDR_SIZE  # first program header is the PT_LOAD
    struct.pack_into("<I", data, ph + 4, elfdefs.PF_R | elfdefs.PF_W | elfdefs.PF_X)
    p.write_bytes(bytes(data))
    reseal(root)


def elf_bound_to_other_chip(root: Path) -> None:
    _rewrite_elf(root, "model-a/decode/ccu1_chip0.elf", binding="graph=model_a_decode;kind=decode;chip=1;calcore=1")
    reseal(root)


def kv_region_too_small(root: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        _region(doc, "model-a.kv")["size"] = 1024 * 1024  # the KV formula needs 2 MiB

    edit_manifest(root, edit)
    reseal(root)


def dram_too_small(root: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["device_cfg"]["chip_dram_bytes"] = 64 * 1024 * 1024

    edit_manifest(root, edit)
    reseal(root)


def reserved_info_disagrees(root: Path) -> None:
    reseal(root)  # sealed first, then edit and re-seal without regenerating
    p = root / RESERVED_INFO
    p.write_text(p.read_text().replace("model-b.kv model-b kv", "model-b.kv model-b workspace"))
    reseal(root, reserved_info=False)


def reserved_info_cr_glued_to_the_kv_line(root: Path) -> None:
    # Issue 54: grep and awk see one line 'region model-b.params ... r--\rregion model-b.kv ...' (no KV region
    # line at all); str.splitlines() saw two and MEM006 passed.
    reseal(root)
    p = root / RESERVED_INFO
    text = p.read_bytes().decode()
    assert "r--\nregion model-b.kv " in text
    p.write_bytes(text.replace("r--\nregion model-b.kv ", "r--\rregion model-b.kv ").encode())
    reseal(root, reserved_info=False)


def unicode_normalisation_twins(root: Path) -> None:
    # Issue 54: 'café.npy' in NFC and in NFD are one file on macOS and to some extractors; LAY002 compared case only.
    (root / "model-a" / "caf\u00e9.npy").write_bytes(b"")
    (root / "model-a" / "cafe\u0301.npy").write_bytes(b"")
    reseal(root)


def param_blob_larger_than_section(root: Path) -> None:
    with open(root / "model-b/params/param_blk0.bin", "ab") as fh:
        fh.write(b"\0" * 4096)  # tensors still fit; the section no longer holds the file
    reseal(root)


def golden_prompt_wrong_shape(root: Path) -> None:
    np.save(root / "model-a/golden/prompt_ids.npy", np.arange(5, dtype=np.int32).reshape(1, 5), allow_pickle=False)
    reseal(root)


def golden_pickle(root: Path) -> None:
    np.save(root / "model-b/golden/expected_tokens.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    reseal(root)


def prefill_max_seq_too_short(root: Path) -> None:
    edit_manifest(root, lambda doc: _graph(doc, "model_b_prefill").__setitem__("max_seq", 8))
    reseal(root)


def tokenizer_vocab_mismatch(root: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        _model(doc, "model-a")["tokenizer"]["vocab_size"] = 383

    edit_manifest(root, edit)
    reseal(root)


def _edit_tokenizer(root: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    edit_json(root / "tokenizer" / "model-a" / "tokenizer.json", edit)
    reseal(root)


def tokenizer_vocab_id_past_the_vocabulary(root: Path) -> None:
    # Issue 54: 384 entries, one of them id 1,000,000 (TOK002 counted entries, validate passed, pack sealed it).
    def edit(doc: dict[str, Any]) -> None:
        vocab = doc["model"]["vocab"]
        vocab[list(vocab)[-1]] = 1_000_000

    _edit_tokenizer(root, edit)


def tokenizer_vocab_id_twice_and_one_missing(root: Path) -> None:
    # Issue 54: the count stays right and every id is in range, but one id has two tokens and one has none.
    def edit(doc: dict[str, Any]) -> None:
        vocab = doc["model"]["vocab"]
        last = list(vocab)[-1]
        vocab[last] = vocab[list(vocab)[-2]]

    _edit_tokenizer(root, edit)


def tokenizer_unk_token_not_in_the_vocabulary(root: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["model"]["unk_token"] = "<never-a-token>"

    _edit_tokenizer(root, edit)


def tokenizer_post_processor_id_past_the_vocabulary(root: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [70000], "tokens": ["<s>"]}},
        }

    _edit_tokenizer(root, edit)


def alias_uses_other_tokenizer(root: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        tok = _model(doc, "model-a")["tokenizer"]
        tok["file"] = "tokenizer/model-b/tokenizer.json"
        tok["config"] = "tokenizer/model-b/tokenizer_config.json"

    edit_manifest(root, edit)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (root / "tokenizer/model-a" / name).unlink()
    (root / "tokenizer/model-a").rmdir()
    reseal(root)


def compat_device_disagrees(root: Path) -> None:
    edit_json(root / "compatibility.json", lambda d: d["device"].__setitem__("chip_nums", 4))
    reseal(root)


def provenance_subject_digest_wrong(root: Path) -> None:
    reseal(root)

    def edit(d: dict[str, Any]) -> None:
        d["subject"][0]["digest"]["sha256"] = "0" * 64

    edit_json(root / PROVENANCE, edit)
    reseal(root, provenance=False)


CASES: list[tuple[str, Callable[[Path], None], str, tuple[str, ...]]] = [
    ("layout", stray_file, "LAY006", ()),
    ("manifest", batched_decode_without_lane_contract, "MAN006", ()),
    ("manifest", lambda root: None, "MAN004", ("--expect-models", "model-a")),
    ("manifest", lambda root: None, "MAN004", ("--expect-models", "model-a,model-b,model-c")),
    ("manifest", lambda root: None, "MAN005", ("--profile", "8")),
    ("hash", provenance_changed_after_sealing, "HASH001", ()),
    ("signature", signed_by_untrusted_key, "SIG001", ()),
    ("signature", unsigned, "SIG001", ()),
    ("chip", model_a_kv_on_both_chips, "CHIP003", ()),
    ("chip", model_a_kv_on_both_chips, "CHIP004", ()),
    ("chip", missing_ccu1_elf, "CHIP006", ()),
    ("elf", elf_for_x86, "ELF002", ()),
    ("elf", elf_writable_and_executable, "ELF005", ()),
    ("elf", elf_bound_to_other_chip, "ELF006", ()),
    ("memory", kv_region_too_small, "MEM005", ()),
    ("memory", dram_too_small, "MEM002", ()),
    ("memory", reserved_info_disagrees, "MEM006", ()),
    ("memory", reserved_info_cr_glued_to_the_kv_line, "MEM006", ()),
    ("layout", unicode_normalisation_twins, "LAY002", ()),
    ("memory", param_blob_larger_than_section, "MEM009", ()),
    ("tensors", golden_prompt_wrong_shape, "GOLD001", ()),
    ("tensors", golden_pickle, "GOLD001", ()),
    ("tensors", prefill_max_seq_too_short, "GOLD002", ()),
    ("tensors", prefill_max_seq_too_short, "GOLD004", ()),
    ("tokenizer", tokenizer_vocab_mismatch, "TOK002", ()),
    ("tokenizer", tokenizer_vocab_id_past_the_vocabulary, "TOK002", ()),
    ("tokenizer", tokenizer_post_processor_id_past_the_vocabulary, "TOK002", ()),
    ("tokenizer", tokenizer_vocab_id_twice_and_one_missing, "TOK002", ()),
    ("tokenizer", tokenizer_unk_token_not_in_the_vocabulary, "TOK002", ()),
    ("tokenizer", alias_uses_other_tokenizer, "TOK003", ()),
    ("compat", compat_device_disagrees, "COMP001", ()),
    ("compat", lambda root: None, "COMP002", ("--runtime-version", "0.8.0")),
    ("compat", provenance_subject_digest_wrong, "PROV002", ()),
]


@pytest.mark.parametrize(
    ("group", "mutate", "rule_id", "extra"), CASES, ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)]
)
def test_bad_package_rejected_by_its_group_only(
    tmp_path: Path, cli: Cli, group: str, mutate, rule_id: str, extra
) -> None:
    root = copy_package(tmp_path)
    mutate(root)
    code, doc = validate_json(cli, root, *extra)
    assert code == 1
    assert doc["ok"] is False
    failing = {c["id"] for c in doc["checks"] if c["status"] in ("fail", "error")}
    assert rule_id in failing, json.dumps([c for c in doc["checks"] if c["status"] != "pass"], indent=1)
    prefixes = GROUP_PREFIX[group]
    prefixes = prefixes if isinstance(prefixes, tuple) else (prefixes,)
    others = {i for i in failing if not i.startswith(prefixes)}
    assert not others, f"{rule_id} case also failed rules of other groups: {sorted(others)}"
    assert not [c for c in doc["checks"] if c["status"] == "error"]
    # Every rule still appears in the report.
    from calctl.package.rules import RULES

    assert {c["id"] for c in doc["checks"]} == {r.id for r in RULES}


def test_unsigned_allowed_is_a_warning_never_silent(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    unsigned(root)
    code, doc = validate_json(cli, root, "--allow-unsigned")
    assert code == 0 and doc["ok"] is True
    sig = [c for c in doc["checks"] if c["id"] == "SIG001"]
    assert [c["status"] for c in sig] == ["warn"]
    assert "unsigned" in sig[0]["message"] and "--allow-unsigned" in sig[0]["message"]
    code, doc = validate_json(cli, root, "--allow-unsigned", "--fail-on-warn")
    assert code == 1 and doc["ok"] is False


def test_untrusted_key_allowed_is_a_warning(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    signed_by_untrusted_key(root)
    code, doc = validate_json(cli, root, "--allow-unsigned")
    assert code == 0
    assert [c["status"] for c in doc["checks"] if c["id"] == "SIG001"] == ["warn"]


def test_chip_mask_case_names_field_and_expected(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    model_a_kv_on_both_chips(root)
    _, doc = validate_json(cli, root)
    chip3 = [c for c in doc["checks"] if c["id"] == "CHIP003" and c["status"] == "fail"]
    assert len(chip3) == 1
    c = chip3[0]
    assert c["file"] == "manifest.yaml"
    assert c["field"] == "/models/0/sections/1/chip_mask"
    assert c["expected"] == "0x1" and c["found"] == "0x3"
    assert "cross-chip" in c["message"]
    # CHIP005: the widened KV section now overlaps model-b's KV region on chip 1.
    assert any(c["id"] == "CHIP005" and c["status"] == "fail" and "model-b" in c["message"] for c in doc["checks"])


def test_hash_failure_makes_content_rules_skip_that_file_with_reason(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    p = root / "model-a/prefill/ccu0_chip0.elf"
    data = bytearray(p.read_bytes())
    data[18] ^= 0xFF  # e_machine, not resealed
    p.write_bytes(bytes(data))
    code, doc = validate_json(cli, root)
    assert code == 1
    hash_fail = [c for c in doc["checks"] if c["id"] == "HASH001" and c["status"] == "fail"]
    assert [c["file"] for c in hash_fail] == ["model-a/prefill/ccu0_chip0.elf"]
    skips = [c for c in doc["checks"] if c["id"].startswith("ELF") and c["status"] == "skip"]
    assert {c["id"] for c in skips} == {"ELF001", "ELF002", "ELF003", "ELF004", "ELF005", "ELF006"}
    assert all(c["file"] == "model-a/prefill/ccu0_chip0.elf" for c in skips)
    assert all("ELF checks skipped: HASH001 failed for this file" in c["message"] for c in skips)


def test_schema_failure_skips_manifest_dependent_rules_with_reason(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    edit_manifest(root, lambda d: d["device_cfg"].__setitem__("chip_nums", "two"))
    reseal(root, reserved_info=False)
    code, doc = validate_json(cli, root, "--fail-on-skip")
    assert code == 1
    man1 = [c for c in doc["checks"] if c["id"] == "MAN001"]
    assert man1 and all(c["status"] == "fail" for c in man1)
    assert man1[0]["field"] == "/device_cfg/chip_nums"
    chip = [c for c in doc["checks"] if c["id"] == "CHIP003"]
    assert [c["status"] for c in chip] == ["skip"]
    assert "manifest failed MAN001 schema check" in chip[0]["message"]


def test_symlink_and_fifo_are_layout_failures(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    os.symlink("/etc/passwd", root / "model-a" / "golden" / "passwd")
    os.symlink("prompt_ids.npy", root / "model-a" / "golden" / "inside")
    os.mkfifo(root / "model-b" / "pipe")
    code, doc = validate_json(cli, root)
    assert code == 1
    lay1 = {c["file"]: c["message"] for c in doc["checks"] if c["id"] == "LAY001" and c["status"] == "fail"}
    assert "leaves the package" in lay1["model-a/golden/passwd"]
    assert "points inside the package" in lay1["model-a/golden/inside"]
    assert "FIFO" in lay1["model-b/pipe"]


def test_symlinked_listed_file_is_never_read(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    target = tmp_path / "outside.json"
    target.write_bytes((root / "compatibility.json").read_bytes())
    (root / "compatibility.json").unlink()
    os.symlink(target, root / "compatibility.json")
    code, doc = validate_json(cli, root)
    assert code == 1
    comp = [c for c in doc["checks"] if c["id"] == "COMP001"]
    assert comp[0]["status"] == "fail" and "symlink" in comp[0]["message"]


def test_huge_sparse_file_is_not_hashed(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    with open(root / "model-b/params/param_blk0.bin", "r+b") as fh:
        fh.truncate(65 * 1024**3)  # sparse: over the 64 GiB per-file limit
    code, doc = validate_json(cli, root)
    assert code == 1
    lay5 = [c for c in doc["checks"] if c["id"] == "LAY005" and c["status"] == "fail"]
    assert lay5 and lay5[0]["file"] == "model-b/params/param_blk0.bin"
    hash1 = [c for c in doc["checks"] if c["id"] == "HASH001" and c["file"] == "model-b/params/param_blk0.bin"]
    assert [c["status"] for c in hash1] == ["skip"]


def test_missing_required_files(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    (root / RESERVED_INFO).unlink()
    (root / "build-provenance.json").unlink()
    code, doc = validate_json(cli, root)
    assert code == 1
    lay4 = {c["file"]: c["message"] for c in doc["checks"] if c["id"] == "LAY004" and c["status"] == "fail"}
    assert set(lay4) == {RESERVED_INFO, "build-provenance.json"}
    for name, message in lay4.items():
        assert name in message and "missing" in message  # the message names the file, not only the file field


def test_required_file_that_is_a_directory_is_named(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    (root / "build-provenance.json").unlink()
    (root / "build-provenance.json").mkdir()
    code, doc = validate_json(cli, root)
    assert code == 1
    lay4 = [c for c in doc["checks"] if c["id"] == "LAY004" and c["status"] == "fail"]
    assert [c["file"] for c in lay4] == ["build-provenance.json"]
    assert "build-provenance.json is a directory, not a regular file" in lay4[0]["message"]
    prov2 = [c for c in doc["checks"] if c["id"] == "PROV002"]
    assert prov2[0]["status"] == "skip" and "PROV001" in prov2[0]["message"]


def test_manifest_naming_a_directory_fails_man007(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)

    def edit(doc: dict[str, Any]) -> None:
        _model(doc, "model-b")["golden"]["prompt"]["file"] = "model-b/golden"

    edit_manifest(root, edit)
    reseal(root)
    code, doc = validate_json(cli, root)
    assert code == 1
    man7 = [c for c in doc["checks"] if c["id"] == "MAN007" and c["status"] == "fail"]
    assert man7 and "directory" in man7[0]["message"] and man7[0]["field"] == "/models/1/golden/prompt/file"
    gold = [c for c in doc["checks"] if c["id"] == "GOLD001" and c["file"] == "model-b/golden"]
    assert [c["status"] for c in gold] == ["skip"] and "MAN007" in gold[0]["message"]


def test_identical_replicas_may_share_one_tokenizer(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path, "replica")

    def edit(doc: dict[str, Any]) -> None:
        tok = _model(doc, "model-a1")["tokenizer"]
        tok["file"] = "tokenizer/model-a0/tokenizer.json"
        tok["config"] = "tokenizer/model-a0/tokenizer_config.json"

    edit_manifest(root, edit)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (root / "tokenizer/model-a1" / name).unlink()
    (root / "tokenizer/model-a1").rmdir()
    reseal(root)
    code, doc = validate_json(cli, root, "--fail-on-skip")
    assert code == 0, [c for c in doc["checks"] if c["status"] != "pass"]
    # The same sharing in a replica whose copies differ is refused.
    edit_manifest(root, lambda d: _model(d, "model-a1")["architecture"].__setitem__("rope_theta", 500000.0))
    reseal(root)
    code, doc = validate_json(cli, root)
    assert code == 1
    # GOLD008 too: copies of a replica with different architectures are not one model twice.
    assert {c["id"] for c in doc["checks"] if c["status"] == "fail"} == {"TOK003", "GOLD008"}


def test_a_package_directory_whose_name_is_not_utf8_validates(tmp_path: Path, cli: Cli) -> None:
    """A directory name with undecodable bytes (b'pkg\\xff') is a path like any other: every rule passes
    (the tokenizer was handed to tokenizers as a UTF-8 str and failed TOK001)."""
    root = copy_package(tmp_path)
    odd = Path(os.fsdecode(os.fsencode(tmp_path) + b"/pkg\xff"))
    root.rename(odd)
    code, doc = validate_json(cli, odd)
    failing = [c["id"] for c in doc["checks"] if c["status"] == "fail"]
    assert code == 0 and failing == [], failing
    assert any(c["id"] == "TOK001" and c["status"] == "pass" for c in doc["checks"])


def test_a_stray_cr_in_the_reserved_info_is_named_by_line(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    reserved_info_cr_glued_to_the_kv_line(root)
    _, doc = validate_json(cli, root)
    mem6 = [c for c in doc["checks"] if c["id"] == "MEM006" and c["status"] == "fail"]
    assert any("control character '\\r'" in c["message"] for c in mem6), mem6
    assert any("model-b.kv" in c["message"] and "missing" in c["message"] for c in mem6), mem6


def test_nfc_and_nfd_twins_are_named(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    unicode_normalisation_twins(root)
    _, doc = validate_json(cli, root)
    lay2 = [c for c in doc["checks"] if c["id"] == "LAY002" and c["status"] == "fail"]
    assert len(lay2) == 1 and "Unicode normalisation" in lay2[0]["message"], lay2
