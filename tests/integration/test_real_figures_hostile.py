"""Issue 54: the normalisation epsilon (``rms_norm_eps``, GGUF ``attention.layer_norm_rms_epsilon``, the manifest's
``norm_eps``) is a real-valued figure of the one table (``limits.NORM_EPS``): 1e308 was accepted by ``import hf``,
``import gguf`` and ``budget --hf-config`` (``validate``'s GOLD009 case is in test_validate_rule_cases)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TEST_KEY, Cli
from tests.unit.compiler.checkpoint_factory import tiny_config, write_hf_dir

BAD = [1e308, 0.0, -1e-5, 0.5, 1e-30, "1e-5", True]


def _said(value: object) -> str:
    return "expected a number" if isinstance(value, str | bool) else f"{value!r} is outside 1e-12..0.1"


@pytest.mark.parametrize("eps", BAD, ids=map(str, BAD))
def test_import_hf_refuses_an_rms_norm_eps_out_of_range(cli: Cli, tmp_path: Path, eps: object) -> None:
    cfg = tiny_config("llama")
    cfg["rms_norm_eps"] = eps
    d, _, _ = write_hf_dir(tmp_path / "hf", "llama", config=cfg)
    r = cli("import", "hf", d, tmp_path / "pkg", "--key", TEST_KEY)
    text = " ".join(r.err.split())
    assert r.code == 2 and "config.json" in text and "rms_norm_eps:" in text and _said(eps) in text, text
    assert "calctl.limits.NORM_EPS" in text or isinstance(eps, str | bool), text


@pytest.mark.parametrize("eps", [1e30, 0.0])
def test_import_gguf_refuses_a_layer_norm_rms_epsilon_out_of_range(cli: Cli, tmp_path: Path, eps: float) -> None:
    from tests.integration.test_declared_numbers_hostile import _f32, gguf_bytes, llama_metadata

    default = _f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    path = tmp_path / "eps.gguf"
    new = _f32("llama.attention.layer_norm_rms_epsilon", eps)
    path.write_bytes(gguf_bytes([new if b == default else b for b in llama_metadata()]))
    r = cli("import", "gguf", path, tmp_path / "pkg", "--key", TEST_KEY)
    text = " ".join(r.err.split())
    assert r.code == 2 and "llama.attention.layer_norm_rms_epsilon:" in text and "NORM_EPS" in text, text


@pytest.mark.parametrize("key", ["rms_norm_eps", "rope_theta"])
def test_budget_hf_config_refuses_a_real_figure_out_of_range(cli: Cli, tmp_path: Path, key: str) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**tiny_config("llama"), key: 1e308}))
    r = cli("budget", "--hf-config", cfg)
    text = " ".join((r.out + r.err).split())
    assert r.code == 2 and f"field '{key}'" in text and "1e+308 is outside" in text and "calctl.limits." in text, text
