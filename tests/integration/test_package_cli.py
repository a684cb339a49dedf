"""Issue 2 acceptance: keygen, sample-package, pack, sign, verify, inspect from the command line."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_PACKAGES, REPO, TEST_PUB, Cli, CopyFixture, assert_no_traceback


@pytest.fixture
def keypair(tmp_path: Path, cli: Cli) -> tuple[Path, Path]:
    r = cli("keygen", tmp_path / "k")
    assert r.code == 0, r.err
    return tmp_path / "k.key", tmp_path / "k.pub"


@pytest.fixture
def sealed(tmp_path: Path, cli: Cli, keypair: tuple[Path, Path]) -> tuple[Path, Path]:
    key, pub = keypair
    r = cli("sample-package", tmp_path / "p", "--kind", "combined", "--key", key)
    assert r.code == 0, r.err
    return tmp_path / "p", pub


def test_acceptance_chain_exits_zero(sealed: tuple[Path, Path], cli: Cli) -> None:
    pkg, pub = sealed
    r = cli("verify", pkg, "--trusted-key", pub)
    assert r.code == 0, r.out + r.err
    assert "verified" in r.out


def test_keygen_mode_and_refuses_overwrite(tmp_path: Path, cli: Cli, keypair: tuple[Path, Path]) -> None:
    key, _pub = keypair
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    before = key.read_bytes()
    r = cli("keygen", tmp_path / "k")
    assert r.code == 2 and "refusing to overwrite" in r.err
    assert key.read_bytes() == before
    assert_no_traceback(r)


def _verify_json(cli: Cli, pkg: Path, pub: Path):
    r = cli("verify", pkg, "--trusted-key", pub, "--format", "json")
    assert_no_traceback(r)
    return r.code, r.json


@pytest.mark.parametrize(
    "victim",
    [
        "manifest.yaml",
        "model-a/params/param_blk0.bin",
        "model-b/decode/ccu1_chip1.elf",
        "tokenizer/model-a/tokenizer.json",
        "compatibility.json",
        "build-provenance.json",
        "model-b/golden/expected_tokens.npy",
    ],
)
def test_flipping_one_byte_of_any_file_fails_naming_it(sealed: tuple[Path, Path], cli: Cli, victim: str) -> None:
    pkg, pub = sealed
    path = pkg / victim
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    code, doc = _verify_json(cli, pkg, pub)
    assert code == 1 and doc["ok"] is False
    assert [f["file"] for f in doc["findings"]] == [victim]
    assert "mismatch" in doc["findings"][0]["message"]


def test_deleted_file_is_named(sealed: tuple[Path, Path], cli: Cli) -> None:
    pkg, pub = sealed
    (pkg / "model-a/prefill/ccu0_chip0.cmd").unlink()
    code, doc = _verify_json(cli, pkg, pub)
    assert code == 1
    assert doc["findings"][0]["file"] == "model-a/prefill/ccu0_chip0.cmd"
    assert "missing" in doc["findings"][0]["message"]


def test_unlisted_file_is_named(sealed: tuple[Path, Path], cli: Cli) -> None:
    pkg, pub = sealed
    (pkg / "model-a" / "extra.bin").write_bytes(b"x")
    code, doc = _verify_json(cli, pkg, pub)
    assert code == 1
    assert doc["findings"][0]["file"] == "model-a/extra.bin" and "not listed" in doc["findings"][0]["message"]


def test_signature_by_another_key_fails_naming_the_keys(sealed: tuple[Path, Path], cli: Cli, tmp_path: Path) -> None:
    pkg, pub = sealed
    assert cli("keygen", tmp_path / "other").code == 0
    assert cli("sign", pkg, "--key", tmp_path / "other.key").code == 0
    code, doc = _verify_json(cli, pkg, pub)
    assert code == 1
    f = doc["findings"][0]
    assert f["file"] == "checksums.sha256.sig" and "does not verify with any trusted key" in f["message"]
    assert doc["trusted_key_ids"][0] in f["message"]
    # The other key does verify it.
    code, doc = _verify_json(cli, pkg, tmp_path / "other.pub")
    assert code == 0 and doc["signer_key_id"]


def test_unsigned_fails_unless_allowed_and_then_warns(sealed: tuple[Path, Path], cli: Cli) -> None:
    pkg, pub = sealed
    (pkg / "checksums.sha256.sig").unlink()
    code, doc = _verify_json(cli, pkg, pub)
    assert code == 1 and "unsigned" in doc["findings"][0]["message"]
    r = cli("verify", pkg, "--trusted-key", pub, "--allow-unsigned", "--format", "json")
    assert r.code == 0 and r.json["findings"][0]["severity"] == "warning"


def test_pack_reseals_after_a_change(
    sealed: tuple[Path, Path], cli: Cli, keypair: tuple[Path, Path], tmp_path: Path
) -> None:
    pkg, pub = sealed
    key, _ = keypair
    (pkg / "model-a" / "notes.txt").write_text("added\n")
    assert _verify_json(cli, pkg, pub)[0] == 1
    r = cli("pack", pkg, "--key", key, "--out", tmp_path / "p.tar")
    assert r.code == 0, r.err
    assert _verify_json(cli, pkg, pub)[0] == 0
    # The tar verifies too, and packing twice gives identical bytes.
    assert _verify_json(cli, tmp_path / "p.tar", pub)[0] == 0
    assert cli("pack", pkg, "--key", key, "--out", tmp_path / "q.tar").code == 0
    assert (tmp_path / "p.tar").read_bytes() == (tmp_path / "q.tar").read_bytes()
    with tarfile.open(tmp_path / "p.tar") as tf:
        names = tf.getnames()
        assert names == sorted(names) or names[0] == "p"
        assert all(m.uid == 0 and m.mtime == 0 for m in tf.getmembers())


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="coreutils sha256sum is not installed")
@pytest.mark.parametrize("kind", ["single", "combined", "replica"])
def test_sha256sum_strict_passes_in_every_sample(kind: str) -> None:
    proc = subprocess.run(
        ["sha256sum", "-c", "--strict", "--quiet", "checksums.sha256"],
        cwd=FIXTURE_PACKAGES / kind,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _openssl_has_rawin() -> bool:
    if shutil.which("openssl") is None:
        return False
    proc = subprocess.run(["openssl", "pkeyutl", "-help"], capture_output=True, text=True)
    return "-rawin" in proc.stdout + proc.stderr


@pytest.mark.skipif(not _openssl_has_rawin(), reason="openssl with `pkeyutl -rawin` (OpenSSL >= 3.0) is not installed")
def test_signature_checks_with_openssl(sealed: tuple[Path, Path]) -> None:
    pkg, pub = sealed
    cmd = [
        "openssl",
        "pkeyutl",
        "-verify",
        "-pubin",
        "-inkey",
        str(pub),
        "-rawin",
        "-in",
        "checksums.sha256",
        "-sigfile",
        "checksums.sha256.sig",
    ]
    ok = subprocess.run(cmd, cwd=pkg, capture_output=True, text=True)
    assert ok.returncode == 0 and "Signature Verified Successfully" in ok.stdout
    sums = pkg / "checksums.sha256"
    sums.write_bytes(sums.read_bytes().replace(b"  ", b" *", 1))
    bad = subprocess.run(cmd, cwd=pkg, capture_output=True, text=True)
    assert bad.returncode != 0


# --- hostile manifests -------------------------------------------------------------

HOSTILE = {
    "malformed": b"schema: calculet-package/v1\nmodels: [\n",
    "alias_bomb": b"a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
    b"c: [*b, *b, *b, *b, *b, *b, *b, *b]\n",
    "list": b"- schema: calculet-package/v1\n- models: []\n",
    "duplicate_key": b"schema: calculet-package/v1\nschema: calculet-package/v1\n",
    "wrong_type": b"schema: calculet-package/v1\npackage: 7\ndevice_cfg: {}\nmodels: {}\nmemory_plan: []\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_manifest_one_line_reason(copy_fixture: CopyFixture, cli: Cli, name: str) -> None:
    pkg = copy_fixture("combined")
    (pkg / "manifest.yaml").write_bytes(HOSTILE[name])
    r = cli("inspect", pkg)
    assert r.code in (1, 2)
    assert_no_traceback(r)
    lines = [line for line in r.err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "manifest.yaml" in lines[0], r.err


def test_hundred_megabyte_manifest_is_refused_quickly(copy_fixture: CopyFixture, cli: Cli) -> None:
    pkg = copy_fixture("single")
    with open(pkg / "manifest.yaml", "wb") as fh:
        fh.write(b"# padding\n" * (10 * 1024 * 1024))
    r = cli("inspect", pkg)
    assert r.code == 1 and "byte limit" in r.err
    assert_no_traceback(r)


def _tar_with(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> None:
    with tarfile.open(path, "w") as tf:
        for info, data in members:
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("member", ["../x", "/tmp/calctl-abs-escape", "pkg/../../x"])
def test_tar_escapes_are_refused_and_nothing_is_written(tmp_path: Path, cli: Cli, member: str) -> None:
    t = tmp_path / "evil.tar"
    _tar_with(t, [(tarfile.TarInfo("pkg/manifest.yaml"), b"schema: x\n"), (tarfile.TarInfo(member), b"pwned")])
    before = set(tmp_path.parent.iterdir())
    r = cli("verify", t, "--trusted-key", TEST_PUB)
    assert r.code == 1, r.err
    assert "absolute" in r.err or "'..'" in r.err
    assert_no_traceback(r)
    assert not Path("/tmp/calctl-abs-escape").exists()
    assert not (tmp_path / "x").exists() and not (tmp_path.parent / "x").exists()
    assert set(tmp_path.parent.iterdir()) == before


@pytest.mark.parametrize("kind", ["sym", "hard", "dev"])
def test_tar_links_and_devices_are_refused(tmp_path: Path, cli: Cli, kind: str) -> None:
    info = tarfile.TarInfo("pkg/thing")
    if kind == "sym":
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    elif kind == "hard":
        info.type, info.linkname = tarfile.LNKTYPE, "pkg/manifest.yaml"
    else:
        info.type = tarfile.CHRTYPE
    t = tmp_path / "evil.tar"
    _tar_with(t, [(tarfile.TarInfo("pkg/manifest.yaml"), b"schema: x\n"), (info, b"")])
    r = cli("inspect", t)
    assert r.code == 1 and ("link" in r.err or "device" in r.err)
    assert_no_traceback(r)


def test_not_a_package_is_a_usage_error(tmp_path: Path, cli: Cli) -> None:
    r = cli("verify", tmp_path / "nope", "--trusted-key", TEST_PUB)
    assert r.code == 2 and "no such file" in r.err
    (tmp_path / "junk").write_bytes(b"\x00" * 100)
    r = cli("inspect", tmp_path / "junk")
    assert r.code == 1 and "neither a package directory nor a tar" in r.err


def test_inspect_json_shows_both_aliases_and_chips(cli: Cli) -> None:
    r = cli("inspect", FIXTURE_PACKAGES / "combined", "--trusted-key", TEST_PUB, "--format", "json")
    assert r.code == 0, r.err
    doc = r.json
    assert doc["schema_version"] == "1"
    chips = {m["alias"]: m["target_chips"] for m in doc["models"]}
    assert chips == {"model-a": [0], "model-b": [1]}
    assert doc["signer_key_id"] and len(doc["digest"]) == 64
    assert {c["chip"] for c in doc["memory_plan"]} == {0, 1}


def test_bundled_default_is_built_and_trusted(cli: Cli) -> None:
    r = cli("verify", "--format", "json")
    assert r.code == 0, r.err
    assert r.json["signer_key_id"]
    assert os.environ["CALCTL_CACHE_DIR"] in r.json["package"]


def test_json_goes_to_stdout_and_logs_to_stderr(cli: Cli) -> None:
    r = cli("inspect", "--format", "json")
    json.loads(r.out)  # nothing but the document on stdout
    assert "bundled" in r.err


def test_debug_shows_a_traceback_only_when_asked(tmp_path: Path, cli: Cli) -> None:
    (tmp_path / "junk").write_bytes(b"\x00" * 100)
    assert "Traceback" not in cli("inspect", tmp_path / "junk").err
    assert "Traceback" in cli("--debug", "inspect", tmp_path / "junk").err


def test_console_script_runs_out_of_process(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "calctl", "inspect", str(FIXTURE_PACKAGES / "single"), "--format", "json"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["package"]["kind"] == "single"


def test_wheel_ships_schemas_and_test_key(tmp_path: Path) -> None:
    """The bundled default must work from a non-editable install: its data must be in the wheel.

    The wheel is built from a copy of the sources (setuptools writes build/ and *.egg-info next to them), so
    the checkout is left as it was. A wheel that cannot be built is a failure: it is what `pip install .` does.
    """
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "calctl", src / "calctl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "wheel"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"pip wheel failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    (wheel,) = out.glob("calctl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "calctl/schemas/calculet-package-v1.json" in names
    assert "calctl/_data/keys/calctl-test-only-DO-NOT-TRUST.key" in names
    assert "calctl/_data/keys/calctl-test-only-DO-NOT-TRUST.pub" in names


def test_unreadable_file_is_reported_not_fatal(sealed: tuple[Path, Path], cli: Cli) -> None:
    pkg, pub = sealed
    if os.geteuid() == 0:
        # root reads everything: make the file unreadable by turning it into a directory-shaped obstacle instead
        victim = pkg / "model-a/golden/prompt_ids.npy"
        victim.unlink()
        victim.mkdir()
        (victim / "x").write_bytes(b"")
        code, doc = _verify_json(cli, pkg, pub)
        assert code == 1
        files = {f["file"] for f in doc["findings"]}
        assert "model-a/golden/prompt_ids.npy" in files and "model-a/golden/prompt_ids.npy/x" in files
        return
    victim = pkg / "model-a/golden/prompt_ids.npy"
    victim.chmod(0)
    code, doc = _verify_json(cli, pkg, pub)
    assert code == 1 and any("cannot be read" in f["message"] for f in doc["findings"])


def test_symlinked_checksums_are_refused(sealed: tuple[Path, Path], cli: Cli, tmp_path: Path) -> None:
    pkg, pub = sealed
    real = tmp_path / "elsewhere.sha256"
    (pkg / "checksums.sha256").rename(real)
    (pkg / "checksums.sha256").symlink_to(real)
    code, doc = _verify_json(cli, pkg, pub)
    assert code == 1 and any("symlink" in f["message"] for f in doc["findings"])
