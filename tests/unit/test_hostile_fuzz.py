"""Issue 54: exit 70 never comes from an input. Hypothesis mutates each command's inputs (config.json, a
safetensors header, a GGUF header, tokenizer.json, the manifest) and every run must end in a documented exit
(0, 1 or 2) with no traceback and no "internal error", and the process's peak RSS must stay bounded.

Deterministic (``derandomize``) and bounded (a few dozen examples per input); calctl runs in-process, so a
crash is this test's failure, not a child's.
"""

from __future__ import annotations

import json
import resource
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from calctl import limits
from tests.conftest import FIXTURE_PACKAGES, TEST_KEY, TEST_PUB, CliResult, run_in_process
from tests.unit.compiler.checkpoint_factory import LLAMA3_SCALING, tiny_config, write_gguf, write_hf_dir
from tests.unit.validate.validate_factory import edit_manifest, reseal

FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
#: Growth of this process's peak RSS a whole fuzz run may cause (the inputs are tiny; a bomb of issue 54 took GiBs).
RSS_GROWTH_MB = 400

HOSTILE_INTS = st.sampled_from(
    [0, -1, 1, 3, 2**31 - 1, 2**31, 2**32 + 1, 2**63, 10**12, 10**30, limits.MAX_LAYERS.maximum + 1]
)
HOSTILE_VALUES = st.one_of(
    HOSTILE_INTS,
    st.sampled_from([None, True, "", "x" * 300, 1e12, -0.5, 1.5, [], {}, [1, 2], {"a": 1}]),
    st.integers(min_value=-(2**70), max_value=2**70),
)


def _deep(levels: int) -> Any:
    doc: Any = 1
    for _ in range(levels):
        doc = [doc]
    return doc


@pytest.fixture(scope="module")
def rss_guard() -> Iterator[None]:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    yield
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert after - before < RSS_GROWTH_MB, f"peak RSS grew {after - before:.0f} MB over the fuzz run"


def _clean(r: CliResult, what: str) -> None:
    text = r.out + r.err
    assert r.code in (0, 1, 2), f"{what}: exit {r.code}\n{text[-2000:]}"
    assert "Traceback" not in text and "internal error" not in text, f"{what}:\n{text[-2000:]}"


@pytest.fixture(scope="module")
def hf_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d, _, _ = write_hf_dir(tmp_path_factory.mktemp("fuzz") / "hf", "llama")
    return d


@pytest.fixture(scope="module")
def gguf_source(tmp_path_factory: pytest.TempPathFactory, hf_source: Path) -> bytes:
    cfg = tiny_config("llama")
    from safetensors.numpy import load_file

    path = write_gguf(
        tmp_path_factory.mktemp("fuzz") / "m.gguf", hf_source, cfg, load_file(str(hf_source / "model.safetensors"))
    )
    return path.read_bytes()


def _mutated_config(draw_key: str, value: Any) -> dict[str, Any]:
    cfg = tiny_config("llama")
    cfg[draw_key] = value
    return cfg


CONFIG_KEYS = st.sampled_from(
    [*tiny_config("llama"), "head_dim", "rope_scaling", "num_experts", "sliding_window", "layer_types", "text_config"]
)


@settings(FUZZ, max_examples=40)
@given(key=CONFIG_KEYS, value=HOSTILE_VALUES, deep=st.sampled_from([0, 0, 0, 70, 5000]))
@example(key="num_hidden_layers", value=2**31 - 1, deep=0)  # issue 54: 16 GiB of RSS
@pytest.mark.usefixtures("rss_guard")
def test_budget_hf_config_never_crashes(key: str, value: Any, deep: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "config.json"
        text = json.dumps(_mutated_config(key, "@DEEP@" if deep else value))
        cfg.write_text(text.replace('"@DEEP@"', "[" * deep + "1" + "]" * deep))
        _clean(run_in_process("budget", "--hf-config", cfg, "--format", "json"), f"budget {key}={value!r}")


@settings(FUZZ, max_examples=25)
@given(
    key=CONFIG_KEYS,
    value=HOSTILE_VALUES,
    rope=st.sampled_from([None, LLAMA3_SCALING, {"rope_type": "linear", "factor": 2.0}]),
    deep=st.sampled_from([0, 0, 0, 5000]),
    header=st.sampled_from([None, "deep", "offsets", "shape", "dtype"]),
)
@example(key="head_dim", value=10**12, rope=LLAMA3_SCALING, deep=0, header=None)  # issue 54: a hang
@example(key="head_dim", value=10**12, rope={"rope_type": "linear", "factor": 2.0}, deep=0, header=None)  # exit 70
@example(key="vocab_size", value=384, rope=None, deep=5000, header=None)  # config.json 5000 deep: exit 70
@example(key="vocab_size", value=384, rope=None, deep=0, header="deep")  # a deep safetensors header
@pytest.mark.usefixtures("rss_guard")
def test_import_hf_never_crashes(
    hf_source: Path, key: str, value: Any, rope: Any, deep: int, header: str | None
) -> None:
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "hf"
        shutil.copytree(hf_source, src)
        cfg = _mutated_config(key, value)
        if rope is not None:
            cfg["rope_scaling"] = rope
        text = json.dumps(cfg)
        (src / "config.json").write_text(text if not deep else "[" * deep + text + "]" * deep)
        if header is not None:
            _mutate_safetensors(src / "model.safetensors", header, value)
        r = run_in_process("import", "hf", src, Path(d) / "out", "--key", TEST_KEY)
        _clean(r, f"import hf {key}={value!r} header={header}")


def _mutate_safetensors(path: Path, how: str, value: Any) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    name = next(k for k in header if k != "__metadata__")
    if how == "deep":
        header["__metadata__"] = {"x": json.dumps(_deep(10))}
        header[name]["extra"] = "@DEEP@"
    elif how == "offsets":
        header[name]["data_offsets"] = [0, value] if isinstance(value, int) else value
    elif how == "shape":
        header[name]["shape"] = [value, value] if isinstance(value, int) else value
    else:
        header[name]["dtype"] = value if isinstance(value, str) else "I64"
    text = json.dumps(header).replace('"@DEEP@"', "[" * 5000 + "]" * 5000).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


#: GGUF fields a header declares: a scalar key's value, or an array's element type and length.
GGUF_SCALARS = (
    "llama.block_count",
    "llama.embedding_length",
    "llama.attention.head_count",
    "llama.vocab_size",
    "llama.context_length",
    "llama.feed_forward_length",
    "tokenizer.ggml.eos_token_id",
)
GGUF_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")


def _field_at(raw: bytes, key: str) -> int:
    """Offset of ``key``'s value (after its u32 type) in the header."""
    name = key.encode()
    return raw.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4


@settings(FUZZ, max_examples=40)
@given(
    how=st.sampled_from(["scalar", "array-length", "array-type", "counts", "u64", "byte", "truncate"]),
    pick=st.integers(min_value=0, max_value=100),
    big=st.sampled_from([0, 1, 7, 9, 13, 2**31, 2**32 - 1, 10**9, 2**63, 2**64 - 1]),
    at=st.integers(min_value=4, max_value=4096),
)
@example(how="scalar", pick=0, big=2**32 - 1, at=0)  # block_count: the 426-byte memory bomb of issue 54
@example(how="array-length", pick=0, big=10**9, at=0)  # 10^9 tokens: the endless loop of issue 54
@pytest.mark.usefixtures("rss_guard")
def test_import_gguf_never_crashes(gguf_source: bytes, how: str, pick: int, big: int, at: int) -> None:
    raw = bytearray(gguf_source)
    at = min(at, len(raw) - 8)
    if how == "scalar":
        at = _field_at(gguf_source, GGUF_SCALARS[pick % len(GGUF_SCALARS)])
        raw[at : at + 4] = struct.pack("<I", big % 2**32)
    elif how == "array-length":
        at = _field_at(gguf_source, GGUF_ARRAYS[pick % len(GGUF_ARRAYS)]) + 4
        raw[at : at + 8] = struct.pack("<Q", big)
    elif how == "array-type":
        at = _field_at(gguf_source, GGUF_ARRAYS[pick % len(GGUF_ARRAYS)])
        raw[at : at + 4] = struct.pack("<I", big % 2**32)
    elif how == "counts":
        at = 8 + 8 * (pick % 2)  # the tensor count, the key count
        raw[at : at + 8] = struct.pack("<Q", big)
    elif how == "u64":
        raw[at : at + 8] = struct.pack("<Q", big)
    elif how == "byte":
        raw[at] = pick % 256
    else:
        raw = raw[:at]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.gguf"
        path.write_bytes(bytes(raw))
        r = run_in_process("import", "gguf", path, Path(d) / "out", "--key", TEST_KEY)
        _clean(r, f"import gguf {how} at {at} = {big}")


def _tokenizer_mutation(doc: dict[str, Any], how: str, value: Any) -> None:
    vocab = doc["model"]["vocab"]
    if how == "vocab-id":
        vocab[list(vocab)[-1]] = value
    elif how == "added-id":
        doc["added_tokens"].append(
            {
                "content": "<x>",
                "id": value,
                "special": True,
                "lstrip": False,
                "rstrip": False,
                "single_word": False,
                "normalized": False,
            }
        )
    elif how == "post-processor":
        doc["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [value], "tokens": ["<s>"]}},
        }
    else:
        doc["normalizer"] = _deep(200)


MANIFEST_NUMBERS = st.sampled_from(
    [
        ("architecture", "n_layers"),
        ("architecture", "n_heads"),
        ("architecture", "head_dim"),
        ("architecture", "vocab_size"),
        ("architecture", "context_limit"),
        ("architecture", "eos_token_id"),
        ("tokenizer", "vocab_size"),
        ("kv", "max_sequences"),
        ("kv", "block_tokens"),
    ]
)


@settings(FUZZ, max_examples=20)
@given(
    target=st.one_of(
        MANIFEST_NUMBERS,
        st.sampled_from([("tokenizer.json", h) for h in ("vocab-id", "added-id", "post-processor", "deep")]),
    ),
    value=HOSTILE_VALUES,
)
@pytest.mark.usefixtures("rss_guard")
def test_validate_inspect_and_run_golden_never_crash(target: tuple[str, str], value: Any) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "pkg"
        shutil.copytree(FIXTURE_PACKAGES / "single", root)
        section, name = target
        if section == "tokenizer.json":
            path = root / "tokenizer" / "model-a" / "tokenizer.json"
            doc = json.loads(path.read_text())
            _tokenizer_mutation(doc, name, value)
            path.write_text(json.dumps(doc))
        else:
            edit_manifest(root, lambda doc: doc["models"][0][section].__setitem__(name, value))
        reseal(root)
        for args in (
            ("validate", root, "--format", "json"),
            ("inspect", root),
            ("run-golden", root, "--format", "json"),
        ):
            _clean(
                run_in_process(*args, "--trusted-key", TEST_PUB) if args[0] != "inspect" else run_in_process(*args),
                f"{args[0]} {section}.{name}={value!r}",
            )
