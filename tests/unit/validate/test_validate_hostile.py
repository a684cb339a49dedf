"""Issue 16: hostile packages never reach a board, hang a command or crash it.

Every package here is built in the test, as an attacker or a careless packer
would, and resealed with the test key where the attack must survive the hash
and the signature. Each case asserts the exit code, the rule ID, and (for the
classes that reached a board before) that ``run-golden`` stops before
``configure``. Commands that used to hang run in a subprocess with a timeout.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calctl.compiler import sample
from calctl.package import archive, binding
from calctl.package.model import MANIFEST
from calctl.signing import keys, seal
from calctl.signing.files import CHECKSUMS, SIGNATURE
from tests.conftest import FIXTURE_PACKAGES, TEST_KEY, TEST_PUB, Cli
from tests.unit.validate.validate_factory import copy_package, edit_manifest, reseal, validate_json

REPO = Path(__file__).resolve().parents[3]
#: No command may take longer than this on a hostile package (they used to hang forever).
TIMEOUT_S = 120


def _model(doc: dict[str, Any], alias: str) -> dict[str, Any]:
    return next(m for m in doc["models"] if m["alias"] == alias)


def _section(doc: dict[str, Any], name: str) -> dict[str, Any]:
    for m in doc["models"]:
        for s in m["sections"] + [s for g in m["graphs"] for s in g["sections"]]:
            if s["name"] == name:
                return s
    raise KeyError(name)


def failing(doc: dict[str, Any]) -> set[str]:
    return {c["id"] for c in doc["checks"] if c["status"] in ("fail", "error")}


def calctl(*args: Any, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, bounded by TIMEOUT_S (a hang fails the test instead of stalling it)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    if env is None or "CALCTL_TRUSTED_KEYS" not in env:
        full_env.pop("CALCTL_TRUSTED_KEYS", None)
    r = subprocess.run(
        [sys.executable, "-m", "calctl", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=full_env,
        cwd=cwd,
    )
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert "internal error" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r


def run_golden_json(pkg: Path) -> tuple[int, dict[str, Any]]:
    r = calctl("run-golden", pkg, "--trusted-key", TEST_PUB, "--format", "json")
    return r.returncode, json.loads(r.stdout)


def assert_never_configured(doc: dict[str, Any]) -> None:
    steps = {s["name"]: s["status"] for s in doc["steps"]}
    assert "configure" not in steps, steps
    assert doc["exit_code"] == 1, doc.get("error")


def snapshot(root: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out


# ---------------------------------------------------------------------------
# Reaches the board although it is wrong: file/slot binding (CHIP008, MAN009)


def test_fixture_packages_pass_the_new_rules(tmp_path: Path, cli: Cli) -> None:
    for kind in ("single", "combined", "replica"):
        code, doc = validate_json(cli, FIXTURE_PACKAGES / kind)
        assert code == 0, failing(doc)
        status = {c["id"]: c["status"] for c in doc["checks"]}
        for rule_id in ("CHIP008", "MAN009", "GOLD006", "MAN006", "ELF001", "ELF003"):
            assert status[rule_id] == "pass", (kind, rule_id)


def test_other_models_command_blob_copied_over_is_refused_before_configure(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    shutil.copy(root / "model-b/prefill/ccu0_chip1.cmd", root / "model-a/prefill/ccu0_chip0.cmd")
    reseal(root)
    code, doc = validate_json(cli, root)
    assert code == 1 and failing(doc) == {"CHIP008"}
    messages = " ".join(c["message"] for c in doc["checks"] if c["id"] == "CHIP008")
    assert "graph" in messages and "chip" in messages
    code, run = run_golden_json(root)
    assert code == 1
    assert_never_configured(run)
    assert run["package"]["digest"], "a refused package's report still names the bytes it refused"


def test_command_section_pointing_at_another_models_file(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)

    def edit(doc: dict[str, Any]) -> None:
        s = _section(doc, "model_a_prefill.ccu0_chip0.cmd")
        s["file"] = "model-b/prefill/ccu0_chip1.cmd"

    edit_manifest(root, edit)
    (root / "model-a/prefill/ccu0_chip0.cmd").unlink()
    reseal(root)
    code, doc = validate_json(cli, root)
    assert code == 1
    assert {"CHIP008", "MAN009"} <= failing(doc)


def test_empty_command_stream_and_bad_header(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    header_only = binding.command_header("model_a_decode", 0, 1)
    (root / "model-a/decode/ccu1_chip0.cmd").write_bytes(header_only)
    (root / "model-a/decode/ccu0_chip0.cmd").write_bytes(b"NOTMAGIC" + bytes(200))
    reseal(root)
    code, doc = validate_json(cli, root)
    assert code == 1 and "CHIP008" in failing(doc)
    messages = [c["message"] for c in doc["checks"] if c["id"] == "CHIP008" and c["status"] == "fail"]
    assert any("no command stream" in m for m in messages), messages
    assert any("magic" in m for m in messages), messages


def test_model_a_loading_model_b_parameters(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)

    def edit(doc: dict[str, Any]) -> None:
        a, b = _model(doc, "model-a"), _model(doc, "model-b")
        a["params"] = json.loads(json.dumps(b["params"]))
        for s in a["sections"]:
            if s["kind"] == "params":
                s["file"] = "model-b/params/param_blk0.bin"
                s["size"] = next(x for x in b["sections"] if x["kind"] == "params")["size"]
        a["architecture"] = dict(b["architecture"], eos_token_id=a["architecture"]["eos_token_id"])

    edit_manifest(root, edit)
    (root / "model-a/params/param_blk0.bin").unlink()
    reseal(root)
    code, doc = validate_json(cli, root)
    assert code == 1 and "MAN009" in failing(doc)
    code, run = run_golden_json(root)
    assert_never_configured(run)


# ---------------------------------------------------------------------------
# Numbers that are not what they look like (MAN001), architecture vs tensors (GOLD006)

INTEGRAL_FLOATS: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("vocab_size", lambda d: _model(d, "model-a")["architecture"].__setitem__("vocab_size", 384.0)),
    ("n_layers", lambda d: _model(d, "model-a")["architecture"].__setitem__("n_layers", 2.0)),
    ("context_limit", lambda d: _model(d, "model-a")["architecture"].__setitem__("context_limit", 256.0)),
    ("tensor shape", lambda d: _model(d, "model-a")["params"]["tensors"][0].__setitem__("shape", [384.0, 64])),
    ("norm_eps nan", lambda d: _model(d, "model-a")["architecture"].__setitem__("norm_eps", math.nan)),
    ("rope_theta inf", lambda d: _model(d, "model-a")["architecture"].__setitem__("rope_theta", math.inf)),
    ("atol inf", lambda d: _model(d, "model-a")["golden"]["tolerance"].__setitem__("atol", math.inf)),
    ("rtol -inf", lambda d: _model(d, "model-b")["golden"]["tolerance"].__setitem__("rtol", -math.inf)),
]


@pytest.mark.parametrize(("what", "edit"), INTEGRAL_FLOATS, ids=[w for w, _ in INTEGRAL_FLOATS])
def test_integral_floats_and_non_finite_numbers_are_refused(tmp_path: Path, cli: Cli, what, edit) -> None:
    root = copy_package(tmp_path)
    edit_manifest(root, edit)
    reseal(root, reserved_info=False)
    code, doc = validate_json(cli, root)
    assert code == 1 and "MAN001" in failing(doc), what
    mine = [c for c in doc["checks"] if c["id"] == "MAN001" and c["status"] == "fail"]
    assert mine and all(c["file"] == MANIFEST for c in mine)


def test_non_finite_number_never_reaches_configure(tmp_path: Path) -> None:
    root = copy_package(tmp_path)
    edit_manifest(root, lambda d: _model(d, "model-a")["golden"]["tolerance"].__setitem__("atol", math.inf))
    reseal(root, reserved_info=False)
    code, run = run_golden_json(root)
    assert code == 1
    assert_never_configured(run)
    assert "MAN001" in run["validation"]["failed_rules"]


def test_huge_integer_is_a_finding_not_a_crash(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    text = (root / MANIFEST).read_text()
    text = text.replace("vocab_size: 384", "vocab_size: " + "9" * 5000, 1)
    (root / MANIFEST).write_text(text)
    reseal(root, reserved_info=False, provenance=True)
    code, doc = validate_json(cli, root)
    assert code == 1 and "MAN001" in failing(doc)
    assert any("5000 digits" in c["message"] for c in doc["checks"] if c["id"] == "MAN001")


def test_json_side_documents_refuse_non_finite_and_huge_numbers(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    text = (root / "compatibility.json").read_text()
    doc = json.loads(text)
    doc["device"]["chip_nums"] = "__X__"
    (root / "compatibility.json").write_text(json.dumps(doc).replace('"__X__"', "NaN"))
    reseal(root)
    code, report = validate_json(cli, root)
    assert code == 1 and "COMP001" in failing(report)
    (root / "compatibility.json").write_text(json.dumps(doc).replace('"__X__"', "1" * 6000))
    reseal(root)
    code, report = validate_json(cli, root)
    assert code == 1 and "COMP001" in failing(report)


def test_architecture_numbers_must_match_tensor_shapes(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    edit_manifest(root, lambda d: _model(d, "model-a")["architecture"].__setitem__("d_ff", 256))
    reseal(root)
    code, doc = validate_json(cli, root)
    assert code == 1 and failing(doc) == {"GOLD006"}
    shapes = [c for c in doc["checks"] if c["id"] == "GOLD006" and c["status"] == "fail"]
    assert any("w_gate" in c["message"] and c["expected"] == "[64, 256]" for c in shapes), shapes


def test_unknown_family_and_missing_tensor_fail_gold006(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    edit_manifest(root, lambda d: _model(d, "model-a")["architecture"].__setitem__("family", "gpt-neo"))
    reseal(root)
    code, doc = validate_json(cli, root)
    assert code == 1 and failing(doc) == {"GOLD006"}
    root2 = copy_package(tmp_path, name="pkg-2")

    def drop(d: dict[str, Any]) -> None:
        tensors = _model(d, "model-b")["params"]["tensors"]
        tensors[:] = [t for t in tensors if t["name"] != "final_norm"]

    edit_manifest(root2, drop)
    reseal(root2)
    code, doc = validate_json(cli, root2)
    assert code == 1 and "GOLD006" in failing(doc)
    assert any("final_norm" in c["message"] for c in doc["checks"] if c["id"] == "GOLD006")


# ---------------------------------------------------------------------------
# The memory plan against the device; budget validates and counts reserved regions


def test_raised_chip_dram_passes_validate_but_never_reaches_configure(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    edit_manifest(root, lambda d: d["device_cfg"].__setitem__("chip_dram_bytes", 64 * 1024**3))
    edit_compat = json.loads((root / "compatibility.json").read_text())
    if "chip_dram_bytes" in edit_compat.get("device", {}):
        edit_compat["device"]["chip_dram_bytes"] = 64 * 1024**3
        (root / "compatibility.json").write_text(json.dumps(edit_compat, indent=2) + "\n")
    reseal(root)
    code, doc = validate_json(cli, root)
    assert code == 0, failing(doc)  # consistent with itself: only the device can say it is wrong
    code, run = run_golden_json(root)
    assert code == 1
    assert_never_configured(run)
    steps = {s["name"]: s for s in run["steps"]}
    assert steps["load package"]["status"] == "FAIL"
    assert "chip_dram_bytes" in steps["load package"]["detail"]


def test_device_fit_is_a_pure_function_serve_can_call(tmp_path: Path) -> None:
    from calctl.budget.device import device_fit
    from calctl.package.reader import load_manifest
    from calctl.runtime.types import Topology

    pkg = load_manifest(FIXTURE_PACKAGES / "combined")
    assert device_fit(pkg, Topology(2, 2, (16 * 1024**3, 16 * 1024**3))).ok
    small = device_fit(pkg, Topology(2, 2, (8 * 1024**3, 16 * 1024**3)))
    assert not small.ok and "chip 0" in small.summary()
    assert not device_fit(pkg, Topology(1, 2, (16 * 1024**3,))).ok
    assert not device_fit(pkg, Topology(2, 4, (16 * 1024**3,) * 2)).ok
    unknown = device_fit(pkg, Topology(2, 2, (None, None)))
    assert unknown.ok and unknown.notes and "unchecked" in unknown.summary()


def test_budget_counts_a_reserved_workspace_region(tmp_path: Path, cli: Cli) -> None:
    def grow(size: int) -> Callable[[dict[str, Any]], None]:
        def edit(doc: dict[str, Any]) -> None:
            for chip in doc["memory_plan"]["chips"]:
                for r in chip["regions"]:
                    if r["name"] == "model-a.workspace":
                        r["size"] = size

        return edit

    root = copy_package(tmp_path)
    reserved = 250 * 1024**2  # more than the declared 96 MiB prefill peak; fits before the I/O region
    edit_manifest(root, grow(reserved))
    reseal(root)
    code, doc = validate_json(cli, root)
    assert code == 0, failing(doc)
    r = cli("budget", root, "--trusted-key", TEST_PUB, "--format", "json")
    assert r.code == 0, r.out + r.err
    chip0 = next(c for c in r.json["chips"] if c["chip"] == 0)
    assert chip0["components"]["workspace_peak"] == reserved, chip0["components"]
    assert "memory plan" in chip0["details"]["workspace_peak"]
    # At a DRAM where the declared peak would fit and the reservation does not, the verdict follows the reservation.
    r = cli("budget", root, "--trusted-key", TEST_PUB, "--format", "json", "--chip-dram", "330MiB", "--guard-min", "0")
    chip0 = next(c for c in r.json["chips"] if c["chip"] == 0)
    chip1 = next(c for c in r.json["chips"] if c["chip"] == 1)
    assert (chip0["verdict"], chip1["verdict"]) == ("NO-GO", "GO"), (chip0["reasons"], chip1["reasons"])

    huge = copy_package(tmp_path, name="huge")
    edit_manifest(huge, grow(20 * 1024**3))  # a 20 GiB region on a 16 GiB chip: never GO
    reseal(huge)
    r = cli("budget", huge, "--trusted-key", TEST_PUB)
    assert r.code == 1 and "failed validation" in r.out + r.err


def test_budget_validates_first_with_the_runners_trust_options(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    with open(root / "model-a/params/param_blk0.bin", "r+b") as fh:
        fh.write(b"\xff\xff\xff\xff")
    r = cli("budget", root, "--trusted-key", TEST_PUB)
    assert r.code == 1 and "HASH001" in r.out + r.err
    signed_by_other = copy_package(tmp_path, name="other")
    kp = tmp_path / "other-key"
    keys.generate(kp)
    seal.seal(signed_by_other, keys.load_private(Path(f"{kp}.key")))
    r = cli("budget", signed_by_other, "--trusted-key", TEST_PUB)
    assert r.code == 1 and "SIG001" in r.out + r.err
    r = cli("budget", signed_by_other, "--trusted-key", TEST_PUB, "--allow-unsigned", "--format", "json")
    assert r.code == 0, r.err
    assert "warning" in r.err and "SIG001" in r.err
    assert {w["id"] for w in r.json["validation"]["warnings"]} >= {"SIG001"}


# ---------------------------------------------------------------------------
# checksums.sha256 agrees with `sha256sum -c --strict`


def _sha256sum_accepts(root: Path) -> bool:
    sha256sum = shutil.which("sha256sum")
    assert sha256sum, "coreutils sha256sum is needed to check calctl against it"
    r = subprocess.run([sha256sum, "-c", "--strict", "--quiet", CHECKSUMS], cwd=root, capture_output=True, timeout=60)
    return r.returncode == 0


def _calctl_accepts(root: Path) -> bool:
    report = seal.SealReport()
    listed = seal.verify_hashes(root, report)
    return listed is not None and report.hashes_ok


def _hostile_checksums(root: Path) -> list[bytes]:
    da = seal.sha256_file(root / "a")
    db = seal.sha256_file(root / "b")
    good = f"{da}  a\n{db}  b\n"
    return [
        good.encode(),
        f"{da}  a\r{db}  b\n".encode(),  # \r inside a line: coreutils reads one line naming "a\r<hex>  b"
        f"{da}  a\r\n{db}  b\r\n".encode(),  # CRLF: coreutils strips the \r; calctl is stricter
        f"{da}  a\f{db}  b\n".encode(),
        f"{da}  a\x85{db}  b\n".encode(),
        f"{da}  a\u2028{db}  b\n".encode(),
        f"{da}  a\u2029{db}  b\n".encode(),
        f"{da}  a\x0b{db}  b\n".encode(),
        f"{da}  a\x1c{db}  b\n".encode(),
        f"{da}  a\n{db}  b".encode(),  # no final newline: coreutils accepts; calctl is stricter
        f"{da}  a\n\n{db}  b\n".encode(),  # blank line
        f"# comment\n{da}  a\n{db}  b\n".encode(),
        f"{da.upper()}  a\n{db}  b\n".encode(),
        f"{da} *a\n{db} *b\n".encode(),  # binary marker: both accept
        f"{da}  ./a\n{db}  b\n".encode(),
        f"{da}  a\n{da}  a\n{db}  b\n".encode(),
        f"{da}  a \n{db}  b\n".encode(),  # trailing space names another file
        f" {da}  a\n{db}  b\n".encode(),  # leading space: coreutils skips it; calctl is stricter
        f"{da}\ta\n{db}  b\n".encode(),
        f"\\{da}  a\n{db}  b\n".encode(),  # coreutils' escaped-name form
        f"SHA256 (a) = {da}\nSHA256 (b) = {db}\n".encode(),  # BSD form
        f"{da}  a\n".encode(),  # b not listed: both accept the file itself (HASH002 is another rule)
        b"",
        b"\n",
    ]


def test_checksums_parse_exactly_as_sha256sum_strict_or_stricter(tmp_path: Path) -> None:
    root = tmp_path / "sums"
    root.mkdir()
    (root / "a").write_bytes(b"alpha\n")
    (root / "b").write_bytes(b"beta\n")
    disagreements = []
    stricter = 0
    for data in _hostile_checksums(root):
        (root / CHECKSUMS).write_bytes(data)
        ours, theirs = _calctl_accepts(root), _sha256sum_accepts(root)
        if ours and not theirs:
            disagreements.append(data)
        stricter += theirs and not ours
    assert not disagreements, f"calctl accepts what `sha256sum -c --strict` rejects: {disagreements}"
    assert stricter >= 5  # CRLF, no final newline, uppercase, leading space, ... (docs/package-format.md)


def test_dot_component_is_reported_as_not_canonical_not_missing(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    text = (root / CHECKSUMS).read_text().replace("  model-a/params/", "  model-a/./params/", 1)
    (root / CHECKSUMS).write_text(text)
    (root / SIGNATURE).write_bytes(keys.load_private(TEST_KEY).sign((root / CHECKSUMS).read_bytes()))
    code, doc = validate_json(cli, root)
    assert code == 1
    hash001 = [c["message"] for c in doc["checks"] if c["id"] == "HASH001" and c["status"] == "fail"]
    assert hash001 and "not canonical" in hash001[0] and "missing" not in hash001[0], hash001


# ---------------------------------------------------------------------------
# Smaller: schema patterns, MAN006, ELF header tables, bss entry


def test_every_schema_pattern_refuses_a_trailing_newline() -> None:
    from calctl.package import schemas

    checked = 0
    for name in schemas.SCHEMA_FILES:
        text = json.dumps(schemas.load_schema(name))
        for pattern in set(_patterns(json.loads(text))):
            if not pattern.endswith("$"):
                continue
            checked += 1
            compiled = schemas._ecma(pattern)
            body = re.compile(pattern.removeprefix("^").removesuffix("$"))
            for value in ("model-a", "a" * 64, "0" * 64, "1.2.3", "12", "x/y.bin"):
                if compiled.search(value) and not body.fullmatch(value + "\n"):
                    assert re.search(pattern, value + "\n"), "Python's $ accepts a trailing newline"
                    assert compiled.search(value + "\n") is None, (name, pattern)
    assert checked >= 5


def _patterns(node: Any) -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "pattern" and isinstance(v, str):
                out.append(v)
            else:
                out.extend(_patterns(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(_patterns(v))
    return out


def test_alias_with_a_trailing_newline_fails_the_schema(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    edit_manifest(root, lambda d: _model(d, "model-a").__setitem__("name", "model_a\n"))
    reseal(root, reserved_info=False)
    code, doc = validate_json(cli, root)
    assert code == 1 and "MAN001" in failing(doc)


@pytest.fixture(scope="module")
def batched_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("batched") / "pkg"
    sample.build_sample(out, kind="single", key=keys.load_private(TEST_KEY), decode_profiles=(1, 4))
    return out


@pytest.mark.parametrize("mask", ["tokens", "positions", "missing_input"])
def test_man006_refuses_a_data_input_as_the_lane_mask(
    tmp_path: Path, cli: Cli, batched_package: Path, mask: str
) -> None:
    root = tmp_path / "pkg"
    shutil.copytree(batched_package, root)
    code, doc = validate_json(cli, root)
    assert code == 0 and {c["id"]: c["status"] for c in doc["checks"]}["MAN006"] == "pass"

    def edit(d: dict[str, Any]) -> None:
        g = next(g for g in d["models"][0]["graphs"] if g["kind"] == "decode")
        g["inactive_lane_policy"]["mask_input"] = mask

    edit_manifest(root, edit)
    reseal(root)
    code, doc = validate_json(cli, root)
    assert code == 1 and failing(doc) == {"MAN006"}


def _mutate_elf(root: Path, rel: str, edit: Callable[[bytearray], None]) -> None:
    data = bytearray((root / rel).read_bytes())
    edit(data)
    (root / rel).write_bytes(bytes(data))
    reseal(root)


ELF_MUTATIONS: list[tuple[str, Callable[[bytearray], None], str]] = [
    ("e_shoff past the end", lambda b: struct.pack_into("<Q", b, 0x28, len(b) + 4096), "ELF001"),
    ("e_shstrndx out of range", lambda b: struct.pack_into("<H", b, 0x3E, 9), "ELF001"),
    ("e_shentsize wrong", lambda b: struct.pack_into("<H", b, 0x3A, 32), "ELF001"),
    ("e_phoff past the end", lambda b: struct.pack_into("<Q", b, 0x20, len(b) - 8), "ELF001"),
]


@pytest.mark.parametrize(("what", "edit", "rule_id"), ELF_MUTATIONS, ids=[w for w, _, _ in ELF_MUTATIONS])
def test_elf_header_tables_are_checked(tmp_path: Path, cli: Cli, what, edit, rule_id) -> None:
    root = copy_package(tmp_path)
    _mutate_elf(root, "model-a/prefill/ccu0_chip0.elf", edit)
    code, doc = validate_json(cli, root)
    assert code == 1 and rule_id in failing(doc), (what, failing(doc))
    readelf = shutil.which("readelf")
    if readelf and what == "e_shoff past the end":  # calctl agrees with binutils
        r = subprocess.run(
            [readelf, "-S", str(root / "model-a/prefill/ccu0_chip0.elf")], capture_output=True, text=True
        )
        assert "Error" in r.stderr, r.stderr


def test_entry_point_in_the_bss_tail_fails_elf003(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    rel = "model-a/prefill/ccu0_chip0.elf"

    def edit(b: bytearray) -> None:
        phoff = struct.unpack_from("<Q", b, 0x20)[0]
        vaddr, filesz, memsz = struct.unpack_from("<QQQ", b, phoff + 16)[0], *struct.unpack_from("<QQ", b, phoff + 32)
        assert memsz > filesz
        struct.pack_into("<Q", b, 0x18, vaddr + filesz + 8)

    _mutate_elf(root, rel, edit)
    code, doc = validate_json(cli, root)
    assert code == 1 and failing(doc) == {"ELF003"}
    assert any("bss" in c["message"] for c in doc["checks"] if c["id"] == "ELF003")


# ---------------------------------------------------------------------------
# Hangs: FIFOs anywhere a file is read


def _fifo(path: Path) -> None:
    if path.exists():
        path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("name", [SIGNATURE, CHECKSUMS, MANIFEST])
def test_fifos_in_the_package_never_hang_a_command(tmp_path: Path, name: str) -> None:
    root = copy_package(tmp_path)
    _fifo(root / name)
    for command in ("verify", "inspect", "validate", "budget"):
        r = calctl(command, root, "--trusted-key", TEST_PUB)
        if command == "inspect" and name != MANIFEST:
            assert r.returncode in (0, 1) and "signer: unknown" in r.stdout  # a view: says it cannot verify
            continue
        assert r.returncode in (1, 2), (command, r.stdout, r.stderr)
        assert ("LAY001" if command == "budget" else "FIFO") in r.stdout + r.stderr, (command, r.stdout + r.stderr)
    key = Path(f"{tmp_path}/k")
    keys.generate(key)
    before = snapshot(root)
    r = calctl("pack", root, "--key", f"{key}.key")
    assert r.returncode in (1, 2) and snapshot(root) == before
    from calctl.package.info import package_digest

    assert name != CHECKSUMS or package_digest(root) is None  # serve's start-up digest: no hang, no crash


def test_a_fifo_in_the_trust_directory_is_a_clear_error(tmp_path: Path) -> None:
    trust = tmp_path / "trust"
    trust.mkdir()
    shutil.copy(TEST_PUB, trust / "release.pub")
    os.mkfifo(trust / "evil.pub")
    r = calctl("validate", FIXTURE_PACKAGES / "combined", env={"CALCTL_TRUSTED_KEYS": str(trust)})
    assert r.returncode == 2 and "FIFO" in r.stderr and "evil.pub" in r.stderr


@pytest.mark.parametrize("name", [SIGNATURE, CHECKSUMS])
@pytest.mark.parametrize("how", ["directory", "unreadable"])
def test_seal_files_that_are_directories_or_unreadable(
    tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch, name: str, how: str
) -> None:
    root = copy_package(tmp_path)
    if how == "directory":
        (root / name).unlink()
        (root / name).mkdir()
    else:
        # EACCES on open, whoever runs the test (root ignores mode bits, so the refusal is simulated at os.open).
        real_open = os.open

        def deny(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if os.fspath(path).endswith(os.sep + name):
                raise PermissionError(13, "Permission denied", os.fspath(path))
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", deny)
    for command in ("verify", "inspect", "validate"):
        r = cli(command, root, "--trusted-key", TEST_PUB)
        text = r.out + r.err
        assert r.code in ((0, 1) if command == "inspect" else (1,)), (command, text)
        assert "internal error" not in text and "Traceback" not in text, text
        assert "is a special" not in text and "is a unreadable" not in text
        if command != "inspect":
            assert ("a directory" if how == "directory" else "Permission denied") in text, (command, text)


# ---------------------------------------------------------------------------
# Internal errors from archives; tar limits count what is really written


def _tar(path: Path, members: list[tuple[str, bytes | None]]) -> Path:
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(
    ("members", "needle"),
    [
        ([("pkg/a", b"x"), ("pkg/a/b", b"y")], "which is a file"),
        ([("pkg/a", b"x"), ("pkg/a/", None)], "both a file and a directory"),
        ([("pkg/a", b"x"), ("pkg/a", b"y")], "appears twice"),
        ([("pkg/" + "n" * 300, b"x")], "file-system limits"),
        ([("pkg/" + "/".join(["d" * 200] * 30) + "/f", b"x")], "file-system limits"),
    ],
    ids=["file-then-below", "file-and-dir", "twice", "long-component", "long-path"],
)
def test_clashing_and_over_long_members_are_lay007_not_internal_errors(
    tmp_path: Path, cli: Cli, members, needle
) -> None:
    tar = _tar(tmp_path / "bad.tar", members)
    code, doc = validate_json(cli, tar)
    assert code == 1 and "LAY007" in failing(doc)
    assert any(needle in c["message"] for c in doc["checks"] if c["id"] == "LAY007")
    r = cli("inspect", tar)
    assert r.code == 1 and needle in r.out + r.err


def test_sparse_member_is_refused_before_writing(tmp_path: Path, cli: Cli) -> None:
    src = tmp_path / "sparse.bin"
    with open(src, "wb") as fh:
        fh.truncate(150 * 1024**2)  # 150 MB of holes
        fh.write(b"x")
    tar = tmp_path / "sparse.tar"
    r = subprocess.run(["tar", "--sparse", "--format=pax", "-cf", str(tar), "-C", str(tmp_path), "sparse.bin"])
    assert r.returncode == 0
    assert tar.stat().st_size < 1024**2
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(Exception) as exc_info:
        archive.extract_package(tar, dest)
    assert "sparse" in str(exc_info.value)
    assert sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()) == 0
    code, doc = validate_json(cli, tar)
    assert code == 1 and "LAY007" in failing(doc)


def test_gzip_bomb_stops_at_the_expansion_limit(tmp_path: Path, cli: Cli) -> None:
    tar = tmp_path / "bomb.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        info = tarfile.TarInfo("pkg/zeros.bin")
        info.size = 150 * 1024**2
        tf.addfile(info, io.BytesIO(bytes(info.size)))
    assert tar.stat().st_size < 1024**2
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(Exception) as exc_info:
        archive.extract_package(tar, dest)
    assert "limit" in str(exc_info.value)
    written = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    assert written <= archive.MAX_EXPANSION * tar.stat().st_size + archive.EXPANSION_SLACK_BYTES
    assert written < 150 * 1024**2
    code, doc = validate_json(cli, tar)
    assert code == 1 and "LAY007" in failing(doc)


def test_too_many_members_is_refused_without_reading_them_all(tmp_path: Path) -> None:
    tar = tmp_path / "many.tar"
    with tarfile.open(tar, "w") as tf:
        for i in range(archive.MAX_MEMBERS + 5):
            info = tarfile.TarInfo(f"pkg/f{i}")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    r = calctl("validate", tar, "--trusted-key", TEST_PUB, "--format", "json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert "LAY007" in failing(doc)
    assert any(f"more than {archive.MAX_MEMBERS} members" in c["message"] for c in doc["checks"])


# ---------------------------------------------------------------------------
# pack checks everything first and leaves the package exactly as it was


@pytest.mark.parametrize(
    "bad_name",
    [b"model-a/bad\xffname.txt", b"model-a/new\nline.txt", "model-a/sep\u2028name.txt".encode()],
    ids=["non-utf8", "newline", "u2028"],
)
def test_pack_refuses_bad_names_and_changes_nothing(tmp_path: Path, cli: Cli, bad_name: bytes) -> None:
    root = copy_package(tmp_path)
    with open(os.path.join(os.fsencode(root), bad_name), "wb") as fh:
        fh.write(b"stray\n")
    before = snapshot(root)
    r = cli("pack", root, "--key", TEST_KEY)
    assert r.code in (1, 2), r.out + r.err
    assert "internal error" not in r.out + r.err
    assert snapshot(root) == before


def test_pack_out_inside_the_package_is_refused_before_sealing(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    before = snapshot(root)
    r = cli("pack", root, "--key", TEST_KEY, "--out", root / "model-a" / "pkg.tar")
    assert r.code == 2 and "inside the package" in r.out + r.err
    assert snapshot(root) == before
    r = cli("pack", root, "--key", TEST_KEY, "--out", tmp_path / "pkg.tar")
    assert r.code == 0, r.err
    with tarfile.open(tmp_path / "pkg.tar") as tf:
        names = tf.getnames()
    assert not any(".tmp-" in n for n in names)


def test_pack_out_or_sample_tar_on_a_fifo_is_refused_before_anything_is_written(tmp_path: Path, cli: Cli) -> None:
    """The tar is renamed into place: over a FIFO (or, as root, a device) it replaced it, after sealing."""
    root = copy_package(tmp_path)
    fifo = tmp_path / "pkg.tar"
    os.mkfifo(fifo)
    before = snapshot(root)
    r = cli("pack", root, "--key", TEST_KEY, "--out", fifo)
    assert r.code == 2 and f"--out {fifo}: is a FIFO, not a regular file" in r.err, r.err
    assert snapshot(root) == before and not fifo.is_file()
    r = cli("sample-package", tmp_path / "new", "--key", TEST_KEY, "--tar", fifo)
    assert r.code == 2 and f"--tar {fifo}: is a FIFO" in r.err, r.err
    assert not (tmp_path / "new").exists() and not fifo.is_file()


# ---------------------------------------------------------------------------
# Messages


def test_non_utf8_name_is_printed_one_way_everywhere(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    with open(os.path.join(os.fsencode(root), b"model-a/x\xffy.bin"), "wb") as fh:
        fh.write(b"junk")
    code, doc = validate_json(cli, root)
    assert code == 1
    shown = {c["file"] for c in doc["checks"] if c["file"] and "x" in c["file"] and "y.bin" in c["file"]}
    assert shown == {"model-a/x\\xffy.bin"}, shown


def test_gzip_package_of_a_real_package_still_validates(tmp_path: Path, cli: Cli) -> None:
    tar = tmp_path / "pkg.tar"
    archive.write_tar(FIXTURE_PACKAGES / "combined", tar)
    gz = tmp_path / "pkg.tar.gz"
    gz.write_bytes(gzip.compress(tar.read_bytes()))
    code, doc = validate_json(cli, gz)
    assert code == 0, failing(doc)


def test_budget_hf_config_fifo_and_huge_integer(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    r = calctl("budget", "--hf-config", fifo)
    assert r.returncode == 2 and "FIFO" in r.stderr
    huge = tmp_path / "huge" / "config.json"
    huge.parent.mkdir()
    huge.write_text('{"num_hidden_layers": ' + "9" * 6000 + "}")
    r = calctl("budget", "--hf-config", huge)
    assert r.returncode == 2 and "number" in r.stderr
