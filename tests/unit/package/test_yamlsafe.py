"""Strict manifest YAML: anchors/aliases, duplicate keys and oversize documents are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from calctl.errors import PackageFormatError
from calctl.package import yamlsafe


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("a: 1\na: 2\n", "duplicate key 'a'"),
        ("a: &x [1, 2]\nb: *x\n", "alias"),
        ("a: &x 1\n", "anchor &x"),
        ("a: [1\n", "malformed YAML"),
        ("? [1, 2]\n: 3\n", "not a scalar"),
        ("!!python/object:os.system {}\n", "malformed YAML"),
        # Numbers that are not what they look like (hostile test of issue 19): YAML 1.1 reads 010 as octal 8
        # and 2:10 as base-60 130, so `max_waiting_requests: 010` silently meant 8.
        ("max_waiting_requests: 010\n", "leading zero"),
        ("a: -007\n", "leading zero"),
        ("a: 2:10\n", "base-60"),
        ("a: 1:30.5\n", "base-60"),
        ("vocab_size: 3_84\n", "digit separators"),
        ("a: 1_000.5\n", "digit separators"),
        ("a: 0b1010\n", "'0b1010' is YAML 1.1 binary: PyYAML reads it as 10, YAML 1.2 as a string"),
        ("a: -0b1\n", "YAML 1.1 binary"),
        ("a: .inf\n", "non-finite"),
        ("a: 1.0e+309\n", "non-finite number '1.0e+309'"),
    ],
)
def test_refused_documents_name_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(PackageFormatError) as exc:
        yamlsafe.loads(text, source="manifest.yaml")
    assert fragment in str(exc.value)
    assert str(exc.value).startswith("manifest.yaml:")


def test_billion_laughs_is_refused_before_expansion() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    with pytest.raises(PackageFormatError, match=r"alias|anchor"):
        yamlsafe.loads(bomb, source="m.yaml")


def test_size_limit_is_checked_without_reading_everything(tmp_path: Path) -> None:
    big = tmp_path / "m.yaml"
    big.write_bytes(b"# " + b"x" * (yamlsafe.DEFAULT_MAX_BYTES + 10))
    with pytest.raises(PackageFormatError, match="byte limit"):
        yamlsafe.load_file(big)


def test_plain_documents_load() -> None:
    assert yamlsafe.loads("a: {b: [1, 0x10]}\n", source="m") == {"a": {"b": [1, 16]}}
    assert yamlsafe.loads("a: [0, -0, 10, 1000, 0.5, 0x0A, '010', '2:10', '1_000']\n", source="m") == {
        "a": [0, 0, 10, 1000, 0.5, 10, "010", "2:10", "1_000"]
    }
    assert yamlsafe.loads("", source="m") is None


def test_non_utf8_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "m.yaml"
    p.write_bytes(b"a: \xff\xfe\n")
    with pytest.raises(PackageFormatError, match="not UTF-8"):
        yamlsafe.load_file(p)


def _config(path: Path) -> object:
    return yamlsafe.load_config(path, name=f"--targets {path}", what="the targets file", max_bytes=64, hint="see docs")


def test_a_config_file_is_read_strictly_and_named_by_its_option(tmp_path: Path) -> None:
    import os

    from calctl.errors import ConfigError

    good = tmp_path / "ok.yaml"
    good.write_text("schema: x/v1\nseed: 3\n")
    assert _config(good) == {"schema": "x/v1", "seed": 3}
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * 64 + "\n")
    dup = tmp_path / "dup.yaml"
    dup.write_text("a: 1\na: 2\n")
    for path, message in (
        (tmp_path / "absent.yaml", f"--targets {tmp_path / 'absent.yaml'}: cannot read the targets file: No such file"),
        (fifo, f"--targets {fifo}: the targets file is not a regular file"),  # refused at once, never waited on
        (big, f"--targets {big}: the targets file is larger than 64 bytes"),
        (dup, "duplicate key 'a'"),
    ):
        with pytest.raises(ConfigError) as info:
            _config(path)
        assert message in str(info.value)
    with pytest.raises(ConfigError) as info:
        _config(dup)
    assert info.value.hint == "see docs"
