"""Bad packages for the rules no other test named: each fails by its rule ID, within its own group.

Each case mutates a copy of the combined fixture the way a broken compiler or a hand edit would, reseals
it with the test key (so HASH and SIG pass) and expects the rule's ID to fail with a finding that names the
broken thing. The unmutated fixture is the good package: every rule passes on it, which
``test_rule_coverage.py`` checks for every registered rule.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calctl.package.rules import RULES, rule_by_id
from tests.conftest import Cli
from tests.unit.validate.validate_factory import copy_package, edit_json, edit_manifest, reseal, validate_json

Doc = dict[str, Any]


def _model(doc: Doc, alias: str) -> Doc:
    return next(m for m in doc["models"] if m["alias"] == alias)


def _graph(doc: Doc, name: str) -> Doc:
    return next(g for m in doc["models"] for g in m["graphs"] if g["name"] == name)


def _region(doc: Doc, name: str) -> Doc:
    return next(r for c in doc["memory_plan"]["chips"] for r in c["regions"] if r["name"] == name)


def _section(doc: Doc, name: str) -> Doc:
    for m in doc["models"]:
        for s in [*m["sections"], *(s for g in m["graphs"] for s in g["sections"])]:
            if s["name"] == name:
                return s
    raise KeyError(name)


def manifest_edit(edit: Callable[[Doc], None]) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        edit_manifest(root, edit)
        reseal(root)

    return mutate


# -- layout ---------------------------------------------------------------------------------


def manifest_cr_line_ends(root: Path) -> None:
    manifest = root / "manifest.yaml"
    manifest.write_bytes(manifest.read_bytes().replace(b"\n", b"\r"))  # one line to grep, many to YAML
    reseal(root)


def manifest_crlf_and_bom(root: Path) -> None:
    manifest = root / "manifest.yaml"
    manifest.write_bytes(b"\xef\xbb\xbf" + manifest.read_bytes().replace(b"\n", b"\r\n"))
    reseal(root)


def hidden_directory(root: Path) -> None:
    reseal(root)
    (root / "model-a" / ".cache").mkdir()  # an editor's or tool's leftover; sealing refuses hidden files


# -- manifest -------------------------------------------------------------------------------


def duplicate_section_name(doc: Doc) -> None:
    _section(doc, "model_b.runtime")["name"] = "model_b.io"


def decode_graph_missing(root: Path) -> None:
    def edit(doc: Doc) -> None:
        a = _model(doc, "model-a")
        a["graphs"] = [g for g in a["graphs"] if g["kind"] != "decode"]

    edit_manifest(root, edit)
    for p in sorted((root / "model-a/decode").iterdir()):
        p.unlink()
    (root / "model-a/decode").rmdir()
    reseal(root)


def kv_section_dangling(doc: Doc) -> None:
    _model(doc, "model-a")["kv"]["section"] = "model_a.kv_cache"


# -- chip -----------------------------------------------------------------------------------


def mask_beyond_chip_nums(doc: Doc) -> None:
    _section(doc, "model_b.kv")["chip_mask"] = 0b110  # chip 2 does not exist on a two-chip board


def two_models_in_a_single_package(doc: Doc) -> None:
    doc["package"]["kind"] = "single"


def command_blob_missing(root: Path) -> None:
    def edit(doc: Doc) -> None:
        g = _graph(doc, "model_b_decode")
        g["sections"] = [s for s in g["sections"] if not (s["kind"] == "command" and s["calcore"] == 1)]

    edit_manifest(root, edit)
    (root / "model-b/decode/ccu1_chip1.cmd").unlink()
    reseal(root)


# -- memory ---------------------------------------------------------------------------------


def regions_overlap(doc: Doc) -> None:
    io, rt = _region(doc, "model-a.io"), _region(doc, "model-a.runtime")
    io["size"] = rt["vaddr"] - io["vaddr"] + 4096  # the I/O region runs 4 KiB into the runtime region


def region_on_a_chip_its_owner_does_not_use(doc: Doc) -> None:
    chip1 = next(c for c in doc["memory_plan"]["chips"] if c["chip"] == 1)
    chip1["regions"].append(
        {
            "name": "model-a.scratch",
            "owner": "model-a",
            "kind": "workspace",
            "vaddr": 0x4000_0000,
            "size": 64 * 1024,
            "writable": True,
        }
    )


def section_outside_its_region(doc: Doc) -> None:
    _region(doc, "model-a.workspace")["size"] //= 2


def code_region_writable(doc: Doc) -> None:
    _region(doc, "model-a.code")["writable"] = True


def workspace_below_peak(doc: Doc) -> None:
    _model(doc, "model-b")["workspace"]["prefill_peak_bytes"] += 1


# -- tensors --------------------------------------------------------------------------------


def golden_token_outside_vocabulary(root: Path) -> None:
    path = root / "model-b/golden/expected_tokens.npy"
    tokens = np.load(path, allow_pickle=False)
    tokens[3] = 512  # model-b's vocabulary is 0..511
    np.save(path, tokens, allow_pickle=False)
    reseal(root)


def parameter_weight_not_finite(root: Path) -> None:
    # Issue 54: a NaN and an inf in model-a's layers.0.attn_norm (fp32, offset 98304 of param_blk0.bin), resealed.
    path = root / "model-a/params/param_blk0.bin"
    data = bytearray(path.read_bytes())
    data[98304 + 4 * 5 : 98304 + 4 * 7] = np.array([np.nan, np.inf], dtype="<f4").tobytes()
    path.write_bytes(bytes(data))
    reseal(root)


def parameter_tensors_overlap(doc: Doc) -> None:
    tensors = _model(doc, "model-a")["params"]["tensors"]
    tensors[2]["offset"] = tensors[1]["offset"]


def rope_theta_out_of_range(doc: Doc) -> None:
    _model(doc, "model-b")["architecture"]["rope_theta"] = 1e300  # finite, so YAML and the schema let it through


def norm_eps_out_of_range(doc: Doc) -> None:
    _model(doc, "model-a")["architecture"]["norm_eps"] = 1e308  # every normalised activation would be zero


# -- tokenizer ------------------------------------------------------------------------------


def tokenizer_does_not_load(root: Path) -> None:
    (root / "tokenizer/model-b/tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}\n')
    reseal(root)


def eos_token_maps_elsewhere(root: Path) -> None:
    edit_json(root / "tokenizer/model-a/tokenizer_config.json", lambda c: c.__setitem__("eos_token", "<|im_start|>"))
    reseal(root)


def added_token_id_past_vocabulary(root: Path) -> None:
    added = {"content": "<|im_end|>", "special": True}
    edit_json(
        root / "tokenizer/model-a/tokenizer_config.json",
        lambda c: c.__setitem__("added_tokens_decoder", {"1000000": added}),
    )
    reseal(root)


def added_token_declares_another_id(root: Path) -> None:
    def renumber(doc: dict[str, Any]) -> None:
        doc["added_tokens"][-1]["id"] = 999_999  # the library assigns its own id; every other tool reads this one

    edit_json(root / "tokenizer/model-a/tokenizer.json", renumber)
    reseal(root)


NESTED_LOOPS = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"


def chat_template_loops(root: Path) -> None:
    edit_json(root / "tokenizer/model-b/tokenizer_config.json", lambda c: c.__setitem__("chat_template", NESTED_LOOPS))
    reseal(root)


def chat_template_builds_a_huge_string(root: Path) -> None:
    doubling = "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
    edit_json(root / "tokenizer/model-a/tokenizer_config.json", lambda c: c.__setitem__("chat_template", doubling))
    reseal(root)


def pad_token_unknown(root: Path) -> None:
    edit_json(root / "tokenizer/model-b/tokenizer_config.json", lambda c: c.__setitem__("pad_token", "[PAD]"))
    reseal(root)


# (rule ID, mutation, text the failing finding must contain)
CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("LAY003", hidden_directory, "model-a/.cache"),
    ("LAY008", manifest_cr_line_ends, "a carriage return at line 1"),
    ("LAY008", manifest_crlf_and_bom, "CRLF line ends at line 1"),
    ("MAN002", manifest_edit(duplicate_section_name), "duplicate section name 'model_b.io'"),
    ("MAN003", decode_graph_missing, "model 'model-a' has 0 decode graphs"),
    ("MAN008", manifest_edit(kv_section_dangling), "'model_a.kv_cache'"),
    ("CHIP001", manifest_edit(mask_beyond_chip_nums), "section model_b.kv has mask bits beyond chip_nums=2"),
    ("CHIP002", manifest_edit(two_models_in_a_single_package), "a single package holds exactly one model"),
    ("CHIP007", command_blob_missing, "model_b_decode has no command blob for CalCore 1 on chip 1"),
    ("MEM001", manifest_edit(regions_overlap), "model-a.io (model-a) and model-a.runtime (model-a) overlap"),
    ("MEM003", manifest_edit(region_on_a_chip_its_owner_does_not_use), "model-a.scratch"),
    ("MEM004", manifest_edit(section_outside_its_region), "section model_a.workspace (workspace) on chip 0"),
    ("MEM007", manifest_edit(code_region_writable), "code region model-a.code"),
    ("MEM008", manifest_edit(workspace_below_peak), "workspace of 'model-b'"),
    ("GOLD003", golden_token_outside_vocabulary, "outside the vocabulary"),
    ("GOLD005", manifest_edit(parameter_tensors_overlap), "layers.0.attn_norm and layers.0.wq overlap"),
    ("GOLD009", manifest_edit(rope_theta_out_of_range), "rope_theta 1e+300 is outside 1..1e+10"),
    ("GOLD009", manifest_edit(norm_eps_out_of_range), "norm_eps 1e+308 is outside 1e-12..0.1"),
    (
        "GOLD010",
        parameter_weight_not_finite,
        "layers.0.attn_norm of 'model-a' holds 2 non-finite value(s); the first is element 5 = nan",
    ),
    ("TOK001", tokenizer_does_not_load, "does not load"),
    ("TOK004", eos_token_maps_elsewhere, "eos_token '<|im_start|>' of 'model-a'"),
    ("TOK002", added_token_id_past_vocabulary, "added_tokens_decoder['1000000']: id 1000000 is outside the vocabulary"),
    ("TOK004", pad_token_unknown, "pad_token: '[PAD]' is not a token of the tokenizer"),
    ("TOK002", added_token_declares_another_id, "declares id 999999, but the tokenizer gives it id"),
    ("TOK005", chat_template_loops, "chat template of 'model-b' is too costly to render 1 message(s)"),
    ("TOK005", chat_template_builds_a_huge_string, "'~' would make 2,097,152 characters"),
]


@pytest.mark.parametrize(("rule_id", "mutate", "says"), CASES, ids=[c[0] for c in CASES])
def test_bad_package_fails_by_the_rule_id(tmp_path: Path, cli: Cli, rule_id: str, mutate, says: str) -> None:
    rule = rule_by_id(rule_id)
    assert rule is not None
    root = copy_package(tmp_path)
    mutate(root)
    code, doc = validate_json(cli, root)
    assert code == 1 and doc["ok"] is False
    failing = [c for c in doc["checks"] if c["status"] in ("fail", "error")]
    mine = [c for c in failing if c["id"] == rule_id]
    assert mine, json.dumps([c for c in doc["checks"] if c["status"] != "pass"], indent=1)
    found = " | ".join(f"{c['file']} {c['field']} {c['message']}" for c in mine)
    assert says in found, found
    assert all(c["status"] == "fail" for c in mine), "a bad package is a failure, not a crashing rule"
    group_of = {r.id: r.group for r in RULES}
    other_groups = {c["id"] for c in failing if group_of[c["id"]] is not rule.group}
    assert not other_groups, f"{rule_id} case also failed rules of other groups: {sorted(other_groups)}"
    assert {c["id"] for c in doc["checks"]} == {r.id for r in RULES}  # every rule still reports
