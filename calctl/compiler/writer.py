"""Writing a calbin package: the pieces every calctl compiler shares.

A compiler (the bundled sample generator, ``calctl import``, ``calctl combine``)
decides *what* a model is: its architecture, weights, tokenizer files and golden
data (:class:`ModelContent`). This module decides *how* that becomes a package
(docs/package-format.md, 001 §6.3): parameter blobs, one ELF and one command blob per
(CalCore, chip) per graph, the per-chip address plan and memory regions, the
manifest, ``model_memory_reserved_info.txt``, compatibility and SLSA
provenance, then checksums and an Ed25519 signature, all written into a
temporary directory beside the output and renamed into place at the end, so a
failure leaves nothing half-written.

Output is byte-identical for identical content and key. This module writes
packages; it does not validate them (``calctl validate`` does).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from calctl import __version__, jsonsafe
from calctl.compiler import elfwriter
from calctl.errors import UsageError
from calctl.model.quant import QUANT_DTYPES, QuantTensor
from calctl.package.architecture import FP32_TENSORS, expected_tensor_shapes
from calctl.package.model import COMPATIBILITY, DTYPE_BYTES, MANIFEST, PROVENANCE, RESERVED_INFO, Architecture
from calctl.package.provenance import MAX_PROVENANCE_BYTES
from calctl.signing import seal
from calctl.signing.files import SEAL_FILES, read_regular

CHIP_NUMS = 2
CALCORE_NUM = 2
#: The mock board's per-chip local DRAM; matches the reference board class (001 §3, §8.2).
CHIP_DRAM_BYTES = 16 * 1024**3
EM_RISCV = 243
MIB = 1024 * 1024

# Per-chip virtual address plan. Different chips may reuse the same numbers (001 §6.2 item 1).
# Params start at PARAM_BASE; KV, workspace, I/O and runtime start at their base or, when the
# regions before them are larger, at the next 16 MiB boundary after them.
CODE_BASE, CODE_SIZE = 0x0010_0000, 1 * MIB
CMD_BASE, CMD_SIZE = 0x0020_0000, 1 * MIB
PARAM_BASE = 0x0100_0000
KV_BASE = 0x1000_0000
WS_BASE = 0x2000_0000
IO_BASE, IO_SIZE = 0x3000_0000, 4 * MIB
RT_BASE, RT_SIZE = 0x3800_0000, 8 * MIB
REGION_ALIGN = 16 * MIB
PARAM_DTYPES = ("fp32", "fp16")
#: Parameter dtypes a blob may hold as they were shipped (calctl.model.quant; docs/package-format.md).
QUANT_PARAM_DTYPES = QUANT_DTYPES


@dataclass(frozen=True)
class ModelPlacement:
    """Where one model goes: its alias, manifest name, directory and chip."""

    alias: str
    name: str
    dir: str
    chip: int


@dataclass(frozen=True)
class GoldenCase:
    """Golden data from the no-cache reference path (001 §6.1, §13.1)."""

    prompt: np.ndarray  # int32 [1, n]
    prefill_logits: np.ndarray  # float32 [1, vocab]
    decode_tokens: np.ndarray  # int32 [k]
    rtol: float
    atol: float
    top_k: int


@dataclass(frozen=True)
class ModelContent:
    """What a compiler decided about one model; :func:`write_model` lays it out."""

    arch: Architecture
    params: Mapping[str, Any] = field(
        repr=False
    )  # every name of expected_tensor_shapes(arch); np.ndarray | QuantTensor
    param_dtype: str  # fp32 | fp16: how the blobs store the float weights (QuantTensor params keep their blocks)
    tokenizer_json: bytes = field(repr=False)
    tokenizer_config: bytes = field(repr=False)
    tokenizer_vocab: int
    golden: GoldenCase = field(repr=False)
    max_sequences: int
    prefill_workspace: int
    decode_workspace: int
    kv_dtype: str = "fp32"
    block_tokens: int = 16
    explicit_family_fields: bool = True


def kv_bytes(arch: Architecture, kv_dtype: str, context: int, sequences: int, block_tokens: int) -> int:
    """001 §8.1 KV formula with block rounding of the context."""
    blocks = -(-context // block_tokens)
    return (
        2 * arch.n_layers * arch.n_kv_heads * arch.head_dim * blocks * block_tokens * sequences * DTYPE_BYTES[kv_dtype]
    )


def align(n: int, a: int) -> int:
    return n + (-n % a)


def deterministic_bytes(label: str, n: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"{label}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:n])


def command_blob(graph: str, chip: int, calcore: int, kind: str) -> bytes:
    header = b"CALCMD01" + chip.to_bytes(4, "little") + calcore.to_bytes(4, "little") + graph.encode().ljust(64, b"\0")
    return header + deterministic_bytes(f"cmd:{graph}:{chip}:{calcore}:{kind}", 1024 - len(header))


class Writer:
    """Writes files under a package root, creating folders as needed."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, rel: str, data: bytes) -> None:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


#: Architecture fields that state a family difference (docs/import.md).
FAMILY_FIELDS = ("rope_style", "attn_bias", "qk_norm", "rope_freq_factors")


def architecture_document(arch: Architecture, *, explicit: bool = True) -> dict[str, Any]:
    """The manifest's ``architecture`` mapping; unset fields are left out.

    ``explicit=False`` also leaves out family fields at their defaults (the bundled
    sample packages predate them and stay byte-identical).
    """
    defaults = Architecture.__dataclass_fields__
    return {
        k: v
        for k, v in arch.__dict__.items()
        if v is not None and (explicit or k not in FAMILY_FIELDS or v != defaults[k].default)
    }


def io_tensors(kind: str, context: int, vocab: int, profiles: list[int]) -> tuple[list[dict], list[dict]]:
    """The decoder I/O contract the mock executes (docs/runtime.md)."""
    if kind == "prefill":
        inputs = [
            {"name": "tokens", "dtype": "int32", "shape": [1, context]},
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


def param_blob(content: ModelContent, rel: str) -> tuple[bytes, list[dict[str, Any]]]:
    """The parameter blob (64-byte aligned tensors, little-endian) and its manifest tensor list."""
    blob = bytearray()
    tensors = []
    for name, shape in expected_tensor_shapes(content.arch).items():
        value = content.params[name]
        if isinstance(value, QuantTensor):  # kept in its blocks, byte for byte
            if value.shape != shape or name in FP32_TENSORS:
                raise ValueError(f"tensor {name}: {value.dtype} {list(value.shape)}, the architecture needs {shape}")
            dtype, data = value.dtype, np.ascontiguousarray(value.data).tobytes()
        else:
            dtype = "fp32" if name in FP32_TENSORS else content.param_dtype
            arr = np.ascontiguousarray(value, dtype={"fp32": "<f4", "fp16": "<f2"}[dtype])
            if arr.shape != shape:
                raise ValueError(f"tensor {name}: shape {arr.shape}, the architecture needs {shape}")
            data = arr.tobytes()
        tensors.append({"name": name, "file": rel, "dtype": dtype, "shape": list(shape), "offset": len(blob)})
        blob += data
        blob += b"\0" * (-len(blob) % 64)
    return bytes(blob), tensors


def write_model(
    w: Writer, m: ModelPlacement, content: ModelContent, decode_profiles: list[int]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Write one model's files; return its manifest entry and its memory regions."""
    arch = content.arch
    chip, mask = m.chip, 1 << m.chip
    tok_rel = f"tokenizer/{m.alias}/tokenizer.json"
    cfg_rel = f"tokenizer/{m.alias}/tokenizer_config.json"
    w.write(tok_rel, content.tokenizer_json)
    w.write(cfg_rel, content.tokenizer_config)

    param_rel = f"{m.dir}/params/param_blk0.bin"
    blob, ptensors = param_blob(content, param_rel)
    w.write(param_rel, blob)

    gold = content.golden
    g_rel = f"{m.dir}/golden"
    w.write(f"{g_rel}/prompt_ids.npy", npy(gold.prompt))
    w.write(f"{g_rel}/prefill_logits.npy", npy(gold.prefill_logits))
    w.write(f"{g_rel}/expected_tokens.npy", npy(gold.decode_tokens))

    kvb = kv_bytes(arch, content.kv_dtype, arch.context_limit, content.max_sequences, content.block_tokens)
    param_size = align(len(blob), 64 * 1024)
    kv_size = align(kvb, 64 * 1024)
    kv_base = max(KV_BASE, align(PARAM_BASE + param_size, REGION_ALIGN))
    ws_base = max(WS_BASE, align(kv_base + kv_size, REGION_ALIGN))
    ws_size = max(content.prefill_workspace, content.decode_workspace)
    io_base = max(IO_BASE, align(ws_base + ws_size, REGION_ALIGN))
    rt_base = max(RT_BASE, align(io_base + IO_SIZE, REGION_ALIGN))
    sections = [
        {
            "name": f"{m.name}.params.blk0",
            "kind": "params",
            "file": param_rel,
            "chip_mask": mask,
            "vaddr": PARAM_BASE,
            "size": len(blob),
        },
        {"name": f"{m.name}.kv", "kind": "kv", "chip_mask": mask, "vaddr": kv_base, "size": kvb},
        {"name": f"{m.name}.workspace", "kind": "workspace", "chip_mask": mask, "vaddr": ws_base, "size": ws_size},
        {"name": f"{m.name}.io", "kind": "io", "chip_mask": mask, "vaddr": io_base, "size": IO_SIZE},
        {"name": f"{m.name}.runtime", "kind": "runtime", "chip_mask": mask, "vaddr": rt_base, "size": RT_SIZE},
    ]
    graphs = []
    cursors = (CODE_BASE, CMD_BASE)
    for kind in ("prefill", "decode"):
        graph, cursors = _graph_entry(w, m, kind, [1] if kind == "prefill" else decode_profiles, arch, cursors)
        graphs.append(graph)
    entry = {
        "alias": m.alias,
        "name": m.name,
        "chip_mode": "SCHIP",
        "target_chips": [chip],
        "architecture": architecture_document(arch, explicit=content.explicit_family_fields),
        "tokenizer": {"file": tok_rel, "config": cfg_rel, "vocab_size": content.tokenizer_vocab},
        "params": {"tensors": ptensors},
        "kv": {
            "dtype": content.kv_dtype,
            "block_tokens": content.block_tokens,
            "max_sequences": content.max_sequences,
            "bytes": kvb,
            "section": f"{m.name}.kv",
        },
        "workspace": {"prefill_peak_bytes": content.prefill_workspace, "decode_peak_bytes": content.decode_workspace},
        "golden": _golden_entry(g_rel, gold),
        "sections": sections,
        "graphs": graphs,
    }

    regions = [
        _region(m.alias, "code", CODE_BASE, CODE_SIZE, False),
        _region(m.alias, "command", CMD_BASE, CMD_SIZE, False),
        _region(m.alias, "params", PARAM_BASE, param_size, False),
        _region(m.alias, "kv", kv_base, kv_size, True),
        _region(m.alias, "workspace", ws_base, ws_size, True),
        _region(m.alias, "io", io_base, IO_SIZE, True),
        _region(m.alias, "runtime", rt_base, RT_SIZE, True),
    ]
    return entry, regions


def _graph_entry(
    w: Writer, m: ModelPlacement, kind: str, profiles: list[int], arch: Architecture, cursors: tuple[int, int]
) -> tuple[dict[str, Any], tuple[int, int]]:
    """Write one graph's code and command files, one pair per CalCore; return its manifest entry and the next free
    (code, command) addresses."""
    chip, mask = m.chip, 1 << m.chip
    gname = f"{m.name}_{kind}"
    code_cursor, cmd_cursor = cursors
    gsections = []
    for core in range(CALCORE_NUM):
        text = deterministic_bytes(f"text:{gname}:{chip}:{core}", 2048 + 256 * core)
        elf = elfwriter.write_elf(
            machine=EM_RISCV,
            vaddr=code_cursor,
            text=text,
            bss=1024,
            binding=f"graph={gname};kind={kind};chip={chip};calcore={core}",
        )
        cmd = command_blob(gname, chip, core, kind)
        for section_kind, ext, suffix, data, vaddr, size in (
            ("code", "elf", "code", elf, code_cursor, len(text) + 1024),
            ("command", "cmd", "cmd", cmd, cmd_cursor, len(cmd)),
        ):
            rel = f"{m.dir}/{kind}/ccu{core}_chip{chip}.{ext}"
            w.write(rel, data)
            gsections.append(
                {
                    "name": f"{gname}.ccu{core}_chip{chip}.{suffix}",
                    "kind": section_kind,
                    "file": rel,
                    "chip_mask": mask,
                    "calcore": core,
                    "vaddr": vaddr,
                    "size": size,
                }
            )
        code_cursor = align(code_cursor + len(text) + 1024, 4096)
        cmd_cursor = align(cmd_cursor + len(cmd), 4096)
    inputs, outputs = io_tensors(kind, arch.context_limit, arch.vocab_size, profiles)
    policy = None
    if max(profiles) > 1:
        # 000 §7.3: the explicit inactive-lane contract a B>1 profile needs.
        policy = {
            "mask_input": "lane_valid",
            "writes_kv": False,
            "returns_logits": False,
            "kv_manager_mode": "per_lane",
        }
    graph = {
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
    return graph, (code_cursor, cmd_cursor)


def _golden_entry(g_rel: str, gold: GoldenCase) -> dict[str, Any]:
    """The manifest's ``golden`` entry of a model whose golden files are under ``g_rel``."""
    return {
        "prompt": {"file": f"{g_rel}/prompt_ids.npy", "dtype": "int32", "shape": list(gold.prompt.shape)},
        "prefill_logits": {
            "file": f"{g_rel}/prefill_logits.npy",
            "dtype": "float32",
            "shape": list(gold.prefill_logits.shape),
        },
        "decode_tokens": {
            "file": f"{g_rel}/expected_tokens.npy",
            "dtype": "int32",
            "shape": list(gold.decode_tokens.shape),
        },
        "tolerance": {"rtol": gold.rtol, "atol": gold.atol, "top_k": gold.top_k},
    }


def _region(owner: str, kind: str, vaddr: int, size: int, writable: bool) -> dict[str, Any]:
    return {"name": f"{owner}.{kind}", "owner": owner, "kind": kind, "vaddr": vaddr, "size": size, "writable": writable}


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


def compatibility_document(compiler: str = "calctl-sample-compiler") -> dict[str, Any]:
    return {
        "schema": "calculet-compatibility/v1",
        "runtime": {"name": "CalRT", "min": "0.7.6", "max_exclusive": "0.8.0"},
        "driver": {"name": "calculet", "min": "1.0.0", "max_exclusive": "2.0.0"},
        "compiler": {"name": compiler, "version": __version__},
        "elf": {"class": "ELF64", "data": "little", "machine": EM_RISCV, "machine_name": "EM_RISCV"},
        "device": {"chip_nums": CHIP_NUMS, "calcore_num": CALCORE_NUM, "kinds": ["mock"]},
    }


@dataclass(frozen=True)
class BuildInfo:
    """The SLSA provenance of one build: what was built how, from which inputs."""

    build_type: str
    builder: str
    invocation: str
    parameters: Mapping[str, Any]
    dependencies: tuple[Mapping[str, Any], ...] = ()  # resolvedDependencies: the source files and their digests

    @classmethod
    def by_calctl(
        cls,
        tool: str,
        invocation: str,
        parameters: Mapping[str, Any],
        *,
        build_type: str | None = None,
        dependencies: tuple[Mapping[str, Any], ...] = (),
    ) -> BuildInfo:
        """A build by calctl's ``tool``: builder ``urn:calctl:<tool>``, type ``urn:calctl:<build_type or tool>:v1``."""
        return cls(f"urn:calctl:{build_type or tool}:v1", f"urn:calctl:{tool}", invocation, parameters, dependencies)


def package_name(text: str, fallback: str) -> str:
    """``text`` as a manifest package name: runs of other characters become ``-``, at most 128, no leading
    ``-_.``; ``fallback`` when nothing is left."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:128].lstrip("-_.") or fallback


def provenance_document(root: Path, build: BuildInfo) -> dict[str, Any]:
    """An in-toto Statement v1 with a SLSA provenance v1 predicate over every package file."""
    rels = [r for r in seal.sealed_files(root) if r not in SEAL_FILES and r != PROVENANCE]
    digests = seal.hash_files(root, rels)
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": r, "digest": {"sha256": digests[r]}} for r in rels],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": build.build_type,
                "externalParameters": dict(build.parameters),
                "internalParameters": {"calctl_version": __version__},
                "resolvedDependencies": [dict(d) for d in build.dependencies],
            },
            "runDetails": {
                "builder": {"id": build.builder},
                "metadata": {"invocationId": build.invocation},
            },
        },
    }


def refresh_provenance(root: Path) -> None:
    """Recompute build-provenance.json subjects after the package files changed (the predicate stays)."""
    doc = jsonsafe.loads(read_regular(root / PROVENANCE, MAX_PROVENANCE_BYTES))
    rels = [r for r in seal.sealed_files(root) if r not in SEAL_FILES and r != PROVENANCE]
    digests = seal.hash_files(root, rels)
    doc["subject"] = [{"name": r, "digest": {"sha256": digests[r]}} for r in rels]
    (root / PROVENANCE).write_bytes(json_bytes(doc))


def json_bytes(doc: Any) -> bytes:
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


def check_output(out: Path) -> Path:
    """``out`` must not exist (or be an empty directory) and its parent must exist; returns the parent."""
    if out.is_symlink():
        raise UsageError(
            f"{out}: is a symbolic link; expected a new path or an empty directory", hint="choose a new output path"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out}: already exists and is not an empty directory", hint="choose a new output path")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{parent}: directory does not exist")
    return parent


def check_not_inside(out: Path, roots: Sequence[Path]) -> None:
    """``out`` must not lie inside any of ``roots`` (input packages): writing there would break their seal."""
    target = Path(os.path.abspath(out)).resolve()
    for root in roots:
        base = Path(root).resolve()
        if target == base or base in target.parents:
            raise UsageError(
                f"{out}: is inside the input package {root}; writing there would add files its checksums do not list",
                hint="choose an output path outside the input packages",
            )


@dataclass(frozen=True)
class PackageSpec:
    name: str
    kind: str  # single | combined | replica
    description: str
    compiler: str
    build: BuildInfo
    decode_profiles: tuple[int, ...] = (1,)


def write_package(
    out: Path,
    spec: PackageSpec,
    models: Sequence[tuple[ModelPlacement, Callable[[], ModelContent]]],
    key: Ed25519PrivateKey,
) -> Path:
    """Write and seal a package at ``out`` from its models, atomically (temp dir beside ``out``, then rename).

    Each model's content is produced by its callable only inside the temporary
    directory's lifetime, so a failing compiler step leaves nothing behind.
    """
    out = Path(out)
    parent = check_output(out)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    except OSError as exc:
        raise UsageError(
            f"{parent}: cannot create the package's temporary directory there ({exc.strerror})",
            hint="choose an output path in a writable directory",
        ) from exc
    with contextlib.ExitStack() as unfinished:  # any way out before the rename leaves no temporary tree
        unfinished.callback(shutil.rmtree, tmp, ignore_errors=True)
        w = Writer(tmp)
        entries: list[dict[str, Any]] = []
        chips: dict[int, list[dict[str, Any]]] = {}
        profiles = sorted(set(spec.decode_profiles))
        for plan, make in models:
            entry, regions = write_model(w, plan, make(), profiles)
            entries.append(entry)
            chips.setdefault(plan.chip, []).extend(regions)
        memory_plan = {"chips": [{"chip": c, "regions": chips[c]} for c in sorted(chips)]}
        manifest = {
            "schema": "calculet-package/v1",
            "package": {"name": spec.name, "version": "1.0.0", "kind": spec.kind, "description": spec.description},
            "device_cfg": {"chip_nums": CHIP_NUMS, "calcore_num": CALCORE_NUM, "chip_dram_bytes": CHIP_DRAM_BYTES},
            "models": entries,
            "memory_plan": memory_plan,
        }
        w.write(MANIFEST, dump_manifest(manifest))
        w.write(RESERVED_INFO, render_reserved_info(memory_plan, CHIP_DRAM_BYTES))
        w.write(COMPATIBILITY, json_bytes(compatibility_document(spec.compiler)))
        w.write(PROVENANCE, json_bytes(provenance_document(tmp, spec.build)))
        seal.seal(tmp, key)
        os.chmod(tmp, 0o755)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
        unfinished.pop_all()
    return out
