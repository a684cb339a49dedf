"""``calctl pack`` over an edited package (#53 item 5): it warns about stale provenance (PROV002) instead of saying
"sealed, signed", and ``--refresh-provenance`` reseals a legitimate edit, keeping who and when."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import Cli

_EDITED = "model-a/golden/prefill_logits.npy"


@pytest.fixture
def edited(cli: Cli, tmp_path: Path) -> tuple[Path, Path]:
    """(a copy of the bundled combined sample with one file edited after its build, a key pair's prefix)."""
    from calctl.compiler.bundled import bundled_package

    pkg = tmp_path / "pkg"
    shutil.copytree(bundled_package("combined"), pkg)
    with (pkg / _EDITED).open("ab") as f:
        f.write(b"\\x00")
    assert cli("keygen", tmp_path / "k").code == 0
    return pkg, tmp_path / "k"


def _provenance(pkg: Path) -> dict:
    return json.loads((pkg / "build-provenance.json").read_text())


def test_pack_over_stale_provenance_warns_and_names_the_file(cli: Cli, edited: tuple[Path, Path]) -> None:
    pkg, key = edited
    r = cli("pack", pkg, "--key", f"{key}.key")
    assert r.code == 0
    assert (
        r.out.startswith("WARN sealed") and _EDITED in r.out and "PROV002" in r.out and "--refresh-provenance" in r.out
    )
    r = cli("pack", pkg, "--key", f"{key}.key", "--format", "json")
    assert r.json["verdict"] == "WARN" and r.json["provenance"]["status"] == "stale"
    assert r.json["provenance"]["changed"] == [_EDITED]
    v = cli("validate", pkg, "--trusted-key", f"{key}.pub", "--format", "json")
    assert v.code == 1 and "PROV002" in {c["id"] for c in v.json["checks"] if c["status"] == "fail"}


def test_refresh_provenance_reseals_a_legitimate_edit_and_keeps_who_and_when(
    cli: Cli, edited: tuple[Path, Path]
) -> None:
    pkg, key = edited
    builder = _provenance(pkg)["predicate"]["runDetails"]["builder"]
    r = cli("pack", pkg, "--key", f"{key}.key", "--refresh-provenance")
    assert r.code == 0 and f"refreshed build-provenance.json: 1 changed ({_EDITED})" in r.out, r.out
    v = cli("validate", pkg, "--trusted-key", f"{key}.pub")
    assert v.code == 0, v.out
    run = _provenance(pkg)["predicate"]["runDetails"]
    assert run["builder"] == builder  # who built it is kept
    (reseal,) = run["byproducts"]
    notes = reseal["annotations"]
    assert reseal["name"] == "calctl pack --refresh-provenance" and notes["changedSubjects"] == [_EDITED]
    assert "@" in notes["resealedBy"] and notes["resealedOn"].endswith("+00:00")
    signer = cli("pack", pkg, "--key", f"{key}.key", "--format", "json").json
    assert notes["signerKeyId"] == signer["signer_key_id"] and signer["provenance"]["status"] == "current"
    assert signer["verdict"] == "PASS"
    assert cli("pack", pkg, "--key", f"{key}.key", "--refresh-provenance").code == 0
    assert len(_provenance(pkg)["predicate"]["runDetails"]["byproducts"]) == 2  # the history is kept


def test_refresh_of_an_unreadable_provenance_is_refused_and_changes_nothing(
    cli: Cli, edited: tuple[Path, Path]
) -> None:
    pkg, key = edited
    (pkg / "build-provenance.json").write_text("{not json")
    before = (pkg / "checksums.sha256").read_bytes()
    r = cli("pack", pkg, "--key", f"{key}.key", "--refresh-provenance")
    assert r.code == 1 and "build-provenance.json" in r.err and "Traceback" not in r.err
    assert (pkg / "checksums.sha256").read_bytes() == before
    assert (pkg / "build-provenance.json").read_text() == "{not json"


def test_refresh_without_a_provenance_is_refused_before_anything_is_written(
    cli: Cli, edited: tuple[Path, Path]
) -> None:
    pkg, key = edited
    (pkg / "build-provenance.json").unlink()
    before = (pkg / "checksums.sha256").read_bytes()
    r = cli("pack", pkg, "--key", f"{key}.key", "--refresh-provenance")
    assert r.code == 1 and "build-provenance.json: no such file" in r.err
    assert (pkg / "checksums.sha256").read_bytes() == before


@pytest.mark.parametrize(
    "doc",
    [b'{"subject": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b'{"subject": [' + b'"",' * 3_000_000 + b'""]}'],
    ids=["nested-1e5", "3M-empty-strings"],
)
def test_pack_reads_a_hostile_provenance_through_the_bounded_loader(
    cli: Cli, edited: tuple[Path, Path], doc: bytes
) -> None:
    """A provenance nested 100,000 deep ended ``pack`` in a RecursionError (exit 70); 3 million empty strings
    were all built as Python objects first (issue 54)."""
    pkg, key = edited
    (pkg / "build-provenance.json").write_bytes(doc)
    r = cli("pack", pkg, "--key", f"{key}.key", "--refresh-provenance")
    assert r.code == 1, (r.out, r.err)
    assert "build-provenance.json" in r.err and "a JSON document may" in r.err, r.err
