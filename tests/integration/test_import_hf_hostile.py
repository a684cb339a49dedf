"""Issue 54, a hostile tester's findings against ``import hf`` and ``validate``: RoPE figures, weight shards, the
tokenizer config's tokens and ids. Each input is refused (exit 2 naming file, field and value), and what ``import``
writes is what ``validate`` accepts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.conftest import TEST_KEY, TEST_PUB, Cli
from tests.unit.compiler.checkpoint_factory import LLAMA3_SCALING, as_transformers5, tiny_config, write_hf_dir
from tests.unit.validate.validate_factory import reseal, validate_json


def _import(cli: Cli, src: Path, out: Path) -> Any:
    r = cli("import", "hf", src, out, "--key", TEST_KEY)
    assert "Traceback" not in r.err and "internal error" not in r.err, r.err
    return r


def _refused(cli: Cli, tmp_path: Path, src: Path, *says: str) -> None:
    out = tmp_path / "pkg"
    r = _import(cli, src, out)
    text = " ".join(r.err.split())
    assert r.code == 2, text
    for s in says:
        assert s in text, text
    assert not out.exists()


# ---------------------------------------------------------------------------------------------- 4. RoPE figures


def _llama(tmp_path: Path, **edits: Any) -> tuple[Path, dict[str, Any]]:
    cfg = tiny_config("llama")
    cfg.update(edits)
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama", config=cfg)
    return d, cfg


def _scaled(**scaling: Any) -> dict[str, Any]:
    return {**LLAMA3_SCALING, **scaling}


ROPE_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("llama3-factor-1e308", {"rope_scaling": _scaled(factor=1e308)}, "rope_scaling.factor: 1e+308 is outside 1..1024"),
    ("llama3-factor-nan", {"rope_scaling": _scaled(factor=float("nan"))}, "rope_scaling.factor: nan is outside"),
    (
        "linear-factor-inf",
        {"rope_scaling": {"rope_type": "linear", "factor": float("inf")}},
        "rope_scaling.factor: inf is outside",
    ),
    ("linear-factor-below-1", {"rope_scaling": {"type": "linear", "factor": 0.25}}, "rope_scaling.factor: 0.25"),
    ("linear-factor-missing", {"rope_scaling": {"type": "linear"}}, "rope_scaling.factor: missing"),
    ("factor-a-bool", {"rope_scaling": _scaled(factor=True)}, "rope_scaling.factor: expected a number, found True"),
    ("factor-a-string", {"rope_scaling": _scaled(factor="8")}, "rope_scaling.factor: expected a number, found '8'"),
    ("low-minus-zero", {"rope_scaling": _scaled(low_freq_factor=-0.0)}, "rope_scaling.low_freq_factor: -0.0"),
    ("high-1e300", {"rope_scaling": _scaled(high_freq_factor=1e300)}, "rope_scaling.high_freq_factor: 1e+300"),
    ("high-below-low", {"rope_scaling": _scaled(low_freq_factor=4.0, high_freq_factor=1.0)}, "must exceed"),
    (
        "original-context-huge",
        {"rope_scaling": _scaled(original_max_position_embeddings=10**9)},
        "original_max_position_embeddings: 1000000000 is over the limit",
    ),
    (
        "original-context-over-max",
        {"rope_scaling": _scaled(original_max_position_embeddings=4096)},
        "original_max_position_embeddings 4096 is over max_position_embeddings 512",
    ),
    ("theta-1e308", {"rope_theta": 1e308}, "rope_theta: 1e+308 is outside 1..1e+10"),
    ("theta-a-string", {"rope_theta": "10000"}, "rope_theta: expected a number, found '10000'"),
    ("partial-rotary", {"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5: expected 1.0"),
]


@pytest.mark.parametrize(("edits", "says"), [c[1:] for c in ROPE_CASES], ids=[c[0] for c in ROPE_CASES])
def test_a_rope_figure_out_of_range_is_refused_naming_field_value_and_range(
    cli: Cli, tmp_path: Path, edits: dict[str, Any], says: str
) -> None:
    d, _ = _llama(tmp_path, **edits)
    _refused(cli, tmp_path, d, "config.json:", says)


def test_a_transformers5_rope_parameters_factor_of_1e308_is_refused(cli: Cli, tmp_path: Path) -> None:
    d, cfg = _llama(tmp_path, rope_scaling=_scaled(factor=1e308))
    as_transformers5(d, cfg)
    _refused(cli, tmp_path, d, "rope_parameters.factor: 1e+308 is outside 1..1024", "calctl.limits.ROPE_FACTOR")


def _set_rope_factors(root: Path, values: np.ndarray) -> None:
    doc = yaml.safe_load((root / "manifest.yaml").read_text())
    t = next(t for t in doc["models"][0]["params"]["tensors"] if t["name"] == "rope_freq_factors")
    blob = root / t["file"]
    raw = bytearray(blob.read_bytes())
    raw[t["offset"] : t["offset"] + 4 * len(values)] = values.astype("<f4").tobytes()
    blob.write_bytes(bytes(raw))
    reseal(root)


@pytest.mark.parametrize("bad", [np.inf, np.nan, 0.0, 1e30])
def test_validate_and_run_golden_refuse_a_package_whose_rope_divisors_are_out_of_range(
    cli: Cli, tmp_path: Path, bad: float
) -> None:
    """A package sealed by hand or by an older importer (which wrote infinite divisors for a factor of 1e308)."""
    d, _ = _llama(tmp_path, rope_scaling=_scaled())
    pkg = tmp_path / "pkg"
    assert _import(cli, d, pkg).code == 0
    assert validate_json(cli, pkg)[0] == 0
    values = np.full(8, 2.0)
    values[3] = bad
    _set_rope_factors(pkg, values)
    code, doc = validate_json(cli, pkg)
    (gold,) = [c for c in doc["checks"] if c["id"] == "GOLD009"]
    assert code == 1 and gold["status"] == "fail", gold
    assert f"[3] = {float(np.float32(bad))!r}" in gold["message"] and "calctl.limits.ROPE_FACTOR" in gold["message"]
    r = cli("run-golden", pkg, "--trusted-key", TEST_PUB)
    assert r.code == 1 and "GOLD009" in r.out + r.err
