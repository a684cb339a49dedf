"""``calctl sample-package``: the reference "mock compiler".

Writes a complete, valid, signed package for the mock device: per model a tiny
decoder-only transformer (weights as param blobs), a trained byte-level BPE
tokenizer, one ELF and one command blob per (CalCore, chip) per graph, golden
data computed by the no-cache reference path, a memory plan, compatibility and
SLSA provenance, then checksums and an Ed25519 signature.

Kinds (001 §6.1, §8.3, §12 Phase 2):

* ``single``   – model A on chip0;
* ``combined`` – model A on chip0 and a different model B on chip1 (SCHIP each);
* ``replica``  – the same model on both chips (two aliases, identical weights).

Output is byte-identical for the same kind, seed, profiles and key, on any
numpy/BLAS/CPU, with one bounded exception: golden logits are float64 reference
values rounded to a 2**-16 grid (:func:`golden_logits`), so a last-bit float64
difference moves a logit by at most one grid step, and only when it sits on a
rounding midpoint; such packages still pass ``run-golden`` against each other's
golden data. This module writes packages; it does not validate them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from calctl import __version__
from calctl.compiler import elfwriter
from calctl.errors import UsageError
from calctl.model import tiny
from calctl.model import tokenizer as toklib
from calctl.package.model import COMPATIBILITY, DTYPE_BYTES, MANIFEST, PROVENANCE, RESERVED_INFO, Architecture
from calctl.signing import seal
from calctl.signing.files import SEAL_FILES

KINDS = ("single", "combined", "replica")
#: Bumped whenever the bytes a (kind, seed, profiles, key) produces change, so a cache of bundled samples
#: built by an older generator of the same calctl version is not reused (2: float64 golden on a 2**-16 grid).
GENERATOR_REVISION = 2
CHIP_NUMS = 2
CALCORE_NUM = 2
#: The mock board's per-chip local DRAM; matches the reference board class (001 §3, §8.2).
CHIP_DRAM_BYTES = 16 * 1024**3
EM_RISCV = 243
CONTEXT = 256
DECODE_GOLDEN_STEPS = 16
MIB = 1024 * 1024

# Per-chip virtual address plan. Different chips may reuse the same numbers (001 §6.2 item 1).
CODE_BASE, CODE_SIZE = 0x0010_0000, 1 * MIB
CMD_BASE, CMD_SIZE = 0x0020_0000, 1 * MIB
PARAM_BASE = 0x0100_0000
KV_BASE = 0x1000_0000
WS_BASE = 0x2000_0000
IO_BASE, IO_SIZE = 0x3000_0000, 4 * MIB
RT_BASE, RT_SIZE = 0x3800_0000, 8 * MIB
PREFILL_WORKSPACE = 96 * MIB
DECODE_WORKSPACE = 16 * MIB

GOLDEN_PROMPTS = (
    "The board has two chips, and each chip runs its own model.",
    "Prefill reads the whole prompt; decode adds one token at a time.",
    "Hello, how are you today? The engineer reads the trace.",
)


@dataclass(frozen=True)
class ModelPlan:
    alias: str
    name: str
    dir: str
    chip: int
    arch: Architecture
    weight_seed: int
    max_sequences: int


def _arch_a() -> Architecture:
    return Architecture(
        family="calctl-tiny-decoder",
        n_layers=2,
        d_model=64,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        d_ff=128,
        vocab_size=384,
        context_limit=CONTEXT,
        dtype="fp32",
        rope_theta=10000.0,
        norm_eps=1e-5,
        tie_embeddings=False,
    )


def _arch_b() -> Architecture:
    return Architecture(
        family="calctl-tiny-decoder",
        n_layers=3,
        d_model=64,
        n_heads=4,
        n_kv_heads=1,
        head_dim=16,
        d_ff=160,
        vocab_size=512,
        context_limit=CONTEXT,
        dtype="fp32",
        rope_theta=10000.0,
        norm_eps=1e-5,
        tie_embeddings=False,
    )


def plan_models(kind: str, seed: int) -> list[ModelPlan]:
    a = ModelPlan("model-a", "model_a", "model-a", 0, _arch_a(), seed * 1000 + 1, 16)
    if kind == "single":
        return [a]
    if kind == "combined":
        return [a, ModelPlan("model-b", "model_b", "model-b", 1, _arch_b(), seed * 1000 + 2, 16)]
    if kind == "replica":
        return [
            replace(a, alias="model-a0", name="model_a0", dir="model-a0", chip=0),
            replace(a, alias="model-a1", name="model_a1", dir="model-a1", chip=1),
        ]
    raise UsageError(f"--kind {kind!r}: expected one of {', '.join(KINDS)}")


def kv_bytes(arch: Architecture, kv_dtype: str, context: int, sequences: int, block_tokens: int) -> int:
    """001 §8.1 KV formula with block rounding of the context."""
    blocks = -(-context // block_tokens)
    return (
        2 * arch.n_layers * arch.n_kv_heads * arch.head_dim * blocks * block_tokens * sequences * DTYPE_BYTES[kv_dtype]
    )


def _align(n: int, a: int) -> int:
    return n + (-n % a)


def _deterministic_bytes(label: str, n: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"{label}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:n])


def _command_blob(graph: str, chip: int, calcore: int, kind: str) -> bytes:
    header = b"CALCMD01" + chip.to_bytes(4, "little") + calcore.to_bytes(4, "little") + graph.encode().ljust(64, b"\0")
    return header + _deterministic_bytes(f"cmd:{graph}:{chip}:{calcore}:{kind}", 1024 - len(header))


class _Writer:
    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, rel: str, data: bytes) -> None:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


#: Golden logits are float64 reference logits rounded to multiples of this step (2**-16 ≈ 1.5e-5), then
#: stored as float32, which holds every multiple exactly below 2**8 in magnitude. Two machines whose float64
#: arithmetic differs in the last bits (another BLAS kernel, thread count or libm) write the same bytes unless
#: a logit sits within that difference of a rounding midpoint; then the two values are one step apart, far
#: inside the golden tolerance (GOLDEN_TOLERANCE), so each machine's package passes against the other's data.
GOLDEN_LOGIT_STEP = 2.0**-16
#: The tolerance written into every sample package (the golden runner compares with numpy ``allclose``).
GOLDEN_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4, "top_k": 5}
#: A prompt is used only if every greedy top-1 and the prefill top-k boundary lead by at least this much, so
#: a float32 device (or another machine's rounding) cannot pick a different token or top-k set.
GOLDEN_MARGIN = 1e-3


def golden_logits(logits: np.ndarray) -> np.ndarray:
    """float64 logits -> the float32 golden values: rounded to GOLDEN_LOGIT_STEP, exactly representable."""
    logits = np.asarray(logits, dtype=np.float64)
    steps = np.round(logits / GOLDEN_LOGIT_STEP)  # round half to even: no platform choice involved
    if not np.all(np.abs(steps) < 2**24):
        raise ValueError("golden logits of 256 or more in magnitude cannot be stored exactly on the golden grid")
    return (steps * GOLDEN_LOGIT_STEP).astype(np.float32)


def _topk_margin(logits: np.ndarray, k: int) -> float:
    """How far the k-th largest logit leads the (k+1)-th: the top-k set is stable within this."""
    desc = np.sort(logits)[::-1]
    return float(desc[k - 1] - desc[k]) if desc.size > k else float("inf")


def _golden(
    params: dict[str, np.ndarray], arch: Architecture, tok: Any, alias: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pick the first built-in prompt whose greedy path and prefill top-k have clear margins (float64 reference)."""
    k = int(GOLDEN_TOLERANCE["top_k"])
    for text in GOLDEN_PROMPTS:
        ids = np.array(tok.encode(text).ids, dtype=np.int32)
        tokens, margin = tiny.reference_generate(params, arch, ids, DECODE_GOLDEN_STEPS, dtype=np.float64)
        logits = tiny.reference_logits(params, arch, ids, dtype=np.float64)[-1]
        if margin >= GOLDEN_MARGIN and _topk_margin(logits, k) >= GOLDEN_MARGIN:
            return ids.reshape(1, -1), golden_logits(logits).reshape(1, -1), tokens
    raise UsageError(
        f"model {alias}: no built-in golden prompt has greedy and top-{k} margins of {GOLDEN_MARGIN:g} with these "
        "weights",
        hint="choose another --seed",
    )


def _npy(arr: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _io_tensors(kind: str, vocab: int, profiles: list[int]) -> tuple[list[dict], list[dict]]:
    if kind == "prefill":
        inputs = [
            {"name": "tokens", "dtype": "int32", "shape": [1, CONTEXT]},
            {"name": "n_tokens", "dtype": "int32", "shape": [1]},
        ]
        return inputs, [{"name": "logits", "dtype": "float32", "shape": [1, vocab]}]
    inputs = [
        {"name": "tokens", "dtype": "int32", "shape": ["B", 1]},
        {"name": "positions", "dtype": "int32", "shape": ["B"]},
    ]
    if max(profiles) > 1:
        inputs.append({"name": "lane_valid", "dtype": "uint8", "shape": ["B"]})
    return inputs, [{"name": "logits", "dtype": "float32", "shape": ["B", vocab]}]


def _build_model(w: _Writer, m: ModelPlan, decode_profiles: list[int]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Write one model's files; return its manifest entry and its memory regions."""
    arch = m.arch
    chip, mask = m.chip, 1 << m.chip
    tok = toklib.train(arch.vocab_size)
    eos = tok.token_to_id(toklib.EOS_TOKEN)
    arch = replace(arch, eos_token_id=eos)
    tok_rel = f"tokenizer/{m.alias}/tokenizer.json"
    cfg_rel = f"tokenizer/{m.alias}/tokenizer_config.json"
    w.write(tok_rel, toklib.to_json(tok))
    w.write(cfg_rel, toklib.tokenizer_config(arch.context_limit))

    params = tiny.init_params(arch, np.random.default_rng(m.weight_seed))
    blob = bytearray()
    ptensors = []
    param_rel = f"{m.dir}/params/param_blk0.bin"
    for name, shape in tiny.param_layout(arch):
        arr = np.ascontiguousarray(params[name], dtype="<f4")
        ptensors.append({"name": name, "file": param_rel, "dtype": "fp32", "shape": list(shape), "offset": len(blob)})
        blob += arr.tobytes()
        blob += b"\0" * (-len(blob) % 64)
    w.write(param_rel, bytes(blob))

    prompt, logits, dec_tokens = _golden(params, arch, tok, m.alias)
    g_rel = f"{m.dir}/golden"
    w.write(f"{g_rel}/prompt_ids.npy", _npy(prompt))
    w.write(f"{g_rel}/prefill_logits.npy", _npy(logits))
    w.write(f"{g_rel}/expected_tokens.npy", _npy(dec_tokens))

    block = 16
    kvb = kv_bytes(arch, "fp32", arch.context_limit, m.max_sequences, block)
    param_size = _align(len(blob), 64 * 1024)
    kv_size = _align(kvb, 64 * 1024)
    sections = [
        {
            "name": f"{m.name}.params.blk0",
            "kind": "params",
            "file": param_rel,
            "chip_mask": mask,
            "vaddr": PARAM_BASE,
            "size": len(blob),
        },
        {"name": f"{m.name}.kv", "kind": "kv", "chip_mask": mask, "vaddr": KV_BASE, "size": kvb},
        {
            "name": f"{m.name}.workspace",
            "kind": "workspace",
            "chip_mask": mask,
            "vaddr": WS_BASE,
            "size": PREFILL_WORKSPACE,
        },
        {"name": f"{m.name}.io", "kind": "io", "chip_mask": mask, "vaddr": IO_BASE, "size": IO_SIZE},
        {"name": f"{m.name}.runtime", "kind": "runtime", "chip_mask": mask, "vaddr": RT_BASE, "size": RT_SIZE},
    ]
    graphs = []
    code_cursor, cmd_cursor = CODE_BASE, CMD_BASE
    for kind in ("prefill", "decode"):
        gname = f"{m.name}_{kind}"
        profiles = [1] if kind == "prefill" else decode_profiles
        gsections = []
        for core in range(CALCORE_NUM):
            text = _deterministic_bytes(f"text:{gname}:{chip}:{core}", 2048 + 256 * core)
            elf = elfwriter.write_elf(
                machine=EM_RISCV,
                vaddr=code_cursor,
                text=text,
                bss=1024,
                binding=f"graph={gname};kind={kind};chip={chip};calcore={core}",
            )
            elf_rel = f"{m.dir}/{kind}/ccu{core}_chip{chip}.elf"
            w.write(elf_rel, elf)
            gsections.append(
                {
                    "name": f"{gname}.ccu{core}_chip{chip}.code",
                    "kind": "code",
                    "file": elf_rel,
                    "chip_mask": mask,
                    "calcore": core,
                    "vaddr": code_cursor,
                    "size": len(text) + 1024,
                }
            )
            code_cursor = _align(code_cursor + len(text) + 1024, 4096)
            cmd = _command_blob(gname, chip, core, kind)
            cmd_rel = f"{m.dir}/{kind}/ccu{core}_chip{chip}.cmd"
            w.write(cmd_rel, cmd)
            gsections.append(
                {
                    "name": f"{gname}.ccu{core}_chip{chip}.cmd",
                    "kind": "command",
                    "file": cmd_rel,
                    "chip_mask": mask,
                    "calcore": core,
                    "vaddr": cmd_cursor,
                    "size": len(cmd),
                }
            )
            cmd_cursor = _align(cmd_cursor + len(cmd), 4096)
        inputs, outputs = _io_tensors(kind, arch.vocab_size, profiles)
        policy = None
        if max(profiles) > 1:
            # 000 §7.3: the explicit inactive-lane contract a B>1 profile needs.
            policy = {
                "mask_input": "lane_valid",
                "writes_kv": False,
                "returns_logits": False,
                "kv_manager_mode": "per_lane",
            }
        graphs.append(
            {
                "name": gname,
                "kind": kind,
                "chip_mode": "SCHIP",
                "target_chips": [chip],
                "batch_profiles": profiles,
                "max_seq": arch.context_limit,
                "inputs": inputs,
                "outputs": outputs,
                "csr": {
                    "position_semantics": "committed_kv_length",
                    "valid_length_input": "n_tokens" if kind == "prefill" else None,
                },
                "inactive_lane_policy": policy,
                "sections": gsections,
            }
        )
    entry = {
        "alias": m.alias,
        "name": m.name,
        "chip_mode": "SCHIP",
        "target_chips": [chip],
        "architecture": {k: v for k, v in arch.__dict__.items()},
        "tokenizer": {"file": tok_rel, "config": cfg_rel, "vocab_size": tok.get_vocab_size()},
        "params": {"tensors": ptensors},
        "kv": {
            "dtype": "fp32",
            "block_tokens": block,
            "max_sequences": m.max_sequences,
            "bytes": kvb,
            "section": f"{m.name}.kv",
        },
        "workspace": {"prefill_peak_bytes": PREFILL_WORKSPACE, "decode_peak_bytes": DECODE_WORKSPACE},
        "golden": {
            "prompt": {"file": f"{g_rel}/prompt_ids.npy", "dtype": "int32", "shape": list(prompt.shape)},
            "prefill_logits": {"file": f"{g_rel}/prefill_logits.npy", "dtype": "float32", "shape": list(logits.shape)},
            "decode_tokens": {
                "file": f"{g_rel}/expected_tokens.npy",
                "dtype": "int32",
                "shape": list(dec_tokens.shape),
            },
            "tolerance": dict(GOLDEN_TOLERANCE),
        },
        "sections": sections,
        "graphs": graphs,
    }
    regions = [
        {
            "name": f"{m.alias}.code",
            "owner": m.alias,
            "kind": "code",
            "vaddr": CODE_BASE,
            "size": CODE_SIZE,
            "writable": False,
        },
        {
            "name": f"{m.alias}.command",
            "owner": m.alias,
            "kind": "command",
            "vaddr": CMD_BASE,
            "size": CMD_SIZE,
            "writable": False,
        },
        {
            "name": f"{m.alias}.params",
            "owner": m.alias,
            "kind": "params",
            "vaddr": PARAM_BASE,
            "size": param_size,
            "writable": False,
        },
        {"name": f"{m.alias}.kv", "owner": m.alias, "kind": "kv", "vaddr": KV_BASE, "size": kv_size, "writable": True},
        {
            "name": f"{m.alias}.workspace",
            "owner": m.alias,
            "kind": "workspace",
            "vaddr": WS_BASE,
            "size": PREFILL_WORKSPACE,
            "writable": True,
        },
        {"name": f"{m.alias}.io", "owner": m.alias, "kind": "io", "vaddr": IO_BASE, "size": IO_SIZE, "writable": True},
        {
            "name": f"{m.alias}.runtime",
            "owner": m.alias,
            "kind": "runtime",
            "vaddr": RT_BASE,
            "size": RT_SIZE,
            "writable": True,
        },
    ]
    return entry, regions


def render_reserved_info(memory_plan: dict[str, Any], chip_dram_bytes: int) -> bytes:
    """``model_memory_reserved_info.txt``: the per-chip reservation in a line format people can read."""
    lines = [
        "# calculet model memory reservation, format 1",
        "# chip <n> dram <bytes>",
        "# region <name> <owner> <kind> <start hex> <end hex> <size bytes> <perm>",
        "# total <bytes reserved on the chip>",
    ]
    for chip in memory_plan["chips"]:
        lines.append(f"chip {chip['chip']} dram {chip_dram_bytes}")
        total = 0
        for r in sorted(chip["regions"], key=lambda r: r["vaddr"]):
            perm = "rw-" if r["writable"] else ("r-x" if r["kind"] == "code" else "r--")
            lines.append(
                f"region {r['name']} {r['owner']} {r['kind']} 0x{r['vaddr']:016x} "
                f"0x{r['vaddr'] + r['size']:016x} {r['size']} {perm}"
            )
            total += r["size"]
        lines.append(f"total {total}")
    return ("\n".join(lines) + "\n").encode()


def compatibility_document() -> dict[str, Any]:
    return {
        "schema": "calculet-compatibility/v1",
        "runtime": {"name": "CalRT", "min": "0.7.6", "max_exclusive": "0.8.0"},
        "driver": {"name": "calculet", "min": "1.0.0", "max_exclusive": "2.0.0"},
        "compiler": {"name": "calctl-sample-compiler", "version": __version__},
        "elf": {"class": "ELF64", "data": "little", "machine": EM_RISCV, "machine_name": "EM_RISCV"},
        "device": {"chip_nums": CHIP_NUMS, "calcore_num": CALCORE_NUM, "kinds": ["mock"]},
    }


def provenance_document(root: Path, parameters: dict[str, Any]) -> dict[str, Any]:
    """An in-toto Statement v1 with a SLSA provenance v1 predicate over every package file."""
    rels = [r for r in seal.sealed_files(root) if r not in SEAL_FILES and r != PROVENANCE]
    digests = seal.hash_files(root, rels)
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": r, "digest": {"sha256": digests[r]}} for r in rels],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": "urn:calctl:sample-package:v1",
                "externalParameters": parameters,
                "internalParameters": {"calctl_version": __version__},
                "resolvedDependencies": [],
            },
            "runDetails": {
                "builder": {"id": "urn:calctl:sample-package"},
                "metadata": {"invocationId": f"sample-{parameters['kind']}-seed{parameters['seed']}"},
            },
        },
    }


def refresh_provenance(root: Path) -> None:
    """Recompute build-provenance.json subjects after the package files changed."""
    doc = json.loads((root / PROVENANCE).read_text())
    params = doc["predicate"]["buildDefinition"]["externalParameters"]
    (root / PROVENANCE).write_bytes(_json(provenance_document(root, params)))


def _json(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=False) + "\n").encode()


class _ManifestDumper(yaml.SafeDumper):
    """Never emits anchors/aliases: the manifest reader refuses them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_manifest(doc: dict[str, Any]) -> bytes:
    text = yaml.dump(
        doc, Dumper=_ManifestDumper, sort_keys=False, default_flow_style=None, width=120, allow_unicode=True
    )
    return ("# calbin package manifest (calculet-package/v1); see docs/package-format.md\n" + text).encode()


def build_sample(
    out: Path,
    *,
    kind: str,
    key: Ed25519PrivateKey,
    seed: int = 0,
    decode_profiles: tuple[int, ...] = (1,),
    name: str | None = None,
) -> Path:
    """Write a sealed sample package at ``out`` (must not exist, or be an empty directory)."""
    if kind not in KINDS:
        raise UsageError(f"--kind {kind!r}: expected one of {', '.join(KINDS)}")
    profiles = sorted(set(decode_profiles))
    bad = [p for p in profiles if p not in (1, 4, 8, 16)]
    if bad or 1 not in profiles:
        raise UsageError(f"--profiles {','.join(map(str, profiles))}: expected 1 plus any of 4, 8, 16")
    if seed < 0 or seed > 2**31:
        raise UsageError(f"--seed {seed}: expected 0..{2**31}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out}: already exists and is not an empty directory", hint="choose a new output path")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{parent}: directory does not exist")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    try:
        w = _Writer(tmp)
        models: list[dict[str, Any]] = []
        chips: dict[int, list[dict[str, Any]]] = {}
        for m in plan_models(kind, seed):
            entry, regions = _build_model(w, m, profiles)
            models.append(entry)
            chips.setdefault(m.chip, []).extend(regions)
        memory_plan = {"chips": [{"chip": c, "regions": chips[c]} for c in sorted(chips)]}
        manifest = {
            "schema": "calculet-package/v1",
            "package": {
                "name": name or f"calctl-sample-{kind}",
                "version": "1.0.0",
                "kind": kind,
                "description": f"calctl sample package ({kind}, seed {seed}) for the mock device; not a real board program",
            },
            "device_cfg": {"chip_nums": CHIP_NUMS, "calcore_num": CALCORE_NUM, "chip_dram_bytes": CHIP_DRAM_BYTES},
            "models": models,
            "memory_plan": memory_plan,
        }
        w.write(MANIFEST, dump_manifest(manifest))
        w.write(RESERVED_INFO, render_reserved_info(memory_plan, CHIP_DRAM_BYTES))
        w.write(COMPATIBILITY, _json(compatibility_document()))
        params = {"kind": kind, "seed": seed, "decode_profiles": profiles}
        w.write(PROVENANCE, _json(provenance_document(tmp, params)))
        seal.seal(tmp, key)
        os.chmod(tmp, 0o755)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
