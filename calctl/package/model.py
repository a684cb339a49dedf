"""The typed, frozen view of a calbin package (docs/package-format.md, 001 §6.3).

Values only: building a :class:`Package` from a schema-valid manifest document is
pure; reading files and checking hashes live in :mod:`calctl.package.reader` and
:mod:`calctl.signing`. Lookups are exact (001 §10.4: no fuzzy or substring
matching): ``package.model("model-a")`` either finds that alias or raises.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calctl.errors import PackageError

MANIFEST = "manifest.yaml"
RESERVED_INFO = "model_memory_reserved_info.txt"
COMPATIBILITY = "compatibility.json"
PROVENANCE = "build-provenance.json"

DTYPE_BYTES: Mapping[str, int] = {
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "fp16": 2,
    "float16": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp32": 4,
    "float32": 4,
}
#: Block-quantised parameter dtypes (GGML's blocks; docs/package-format.md "Quantised tensors"):
#: (weights a block, bytes a block). Only parameter tensors may have them; their size is per block, not per element.
QUANT_BLOCKS: Mapping[str, tuple[int, int]] = {"q4_0": (32, 18), "q4_1": (32, 20), "q8_0": (32, 34)}


def quant_block_axis(name: str, shape: tuple[int, ...]) -> int:
    """Length of the axis a quantised tensor's blocks run along: ``d_model`` of ``embed``, ``in`` of a matrix."""
    return shape[1] if name == "embed" else shape[0]


#: numpy dtype names for the dtypes numpy can hold (bf16 cannot).
NUMPY_DTYPE: Mapping[str, str] = {
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}


class GraphKind(str, enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


class ChipMode(str, enum.Enum):
    SCHIP = "SCHIP"  # single-chip graph: every section on its one target chip
    MCHIP = "MCHIP"  # multi-chip (tensor-parallel) graph


class SectionKind(str, enum.Enum):
    CODE = "code"
    COMMAND = "command"
    PARAMS = "params"
    KV = "kv"
    WORKSPACE = "workspace"
    IO = "io"
    RUNTIME = "runtime"

    @property
    def writable(self) -> bool:
        return self in (SectionKind.KV, SectionKind.WORKSPACE, SectionKind.IO, SectionKind.RUNTIME)


def chips_of_mask(mask: int) -> tuple[int, ...]:
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


def mask_of_chips(chips: tuple[int, ...] | list[int]) -> int:
    mask = 0
    for c in chips:
        mask |= 1 << c
    return mask


BATCH_DIM = "B"


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output. A dimension ``"B"`` is the batch profile in use."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]

    def concrete_shape(self, batch: int = 1) -> tuple[int, ...]:
        return tuple(batch if d == BATCH_DIM else int(d) for d in self.shape)

    def nbytes_at(self, batch: int = 1) -> int:
        n = DTYPE_BYTES[self.dtype]
        for d in self.concrete_shape(batch):
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.nbytes_at(1)


class AddressRange:
    """Something placed at ``[vaddr, end)`` of a chip's address space (a section, a memory-plan region)."""

    vaddr: int
    size: int

    @property
    def end(self) -> int:
        return self.vaddr + self.size


@dataclass(frozen=True)
class Section(AddressRange):
    """One loadable piece of a graph or model: its file (if any) and where it goes."""

    name: str
    kind: SectionKind
    chip_mask: int
    vaddr: int
    size: int
    file: str | None = None
    calcore: int | None = None
    offset: int = 0
    pointer: str = ""  # JSON-pointer-like location in the manifest, for messages

    @property
    def chips(self) -> tuple[int, ...]:
        return chips_of_mask(self.chip_mask)


@dataclass(frozen=True)
class InactiveLanePolicy:
    """000 §7.3: the explicit contract without which a B>1 profile is refused."""

    mask_input: str
    writes_kv: bool
    returns_logits: bool
    kv_manager_mode: str | None = None


@dataclass(frozen=True)
class Graph:
    name: str
    model_alias: str
    kind: GraphKind
    chip_mode: ChipMode
    target_chips: tuple[int, ...]
    batch_profiles: tuple[int, ...]
    max_seq: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    position_semantics: str
    valid_length_input: str | None
    inactive_lane_policy: InactiveLanePolicy | None
    sections: tuple[Section, ...]
    pointer: str = ""

    def input(self, name: str) -> TensorSpec:
        return self._tensor("input", self.inputs, name)

    def output(self, name: str) -> TensorSpec:
        return self._tensor("output", self.outputs, name)

    def _tensor(self, side: str, tensors: tuple[TensorSpec, ...], name: str) -> TensorSpec:
        for t in tensors:
            if t.name == name:
                return t
        raise PackageError(f"graph {self.name!r} has no {side} {name!r}", field=f"{self.pointer}/{side}s")

    @property
    def code_sections(self) -> tuple[Section, ...]:
        return tuple(s for s in self.sections if s.kind is SectionKind.CODE)


@dataclass(frozen=True)
class Dimensions:
    """A decoder's family and sizes: what a manifest's architecture and an imported checkpoint's config share."""

    family: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int


@dataclass(frozen=True)
class Architecture(Dimensions):
    context_limit: int
    dtype: str
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    eos_token_id: int | None = None
    # Family differences as explicit fields (docs/import.md), so a C decoder reads facts, not family names.
    rope_style: str = "interleaved"  # "interleaved": pairs (2i, 2i+1); "half": (i, i + head_dim/2), HF rotate_half
    attn_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # RMSNorm over head_dim on each query/key head before RoPE (Qwen3)
    max_position_embeddings: int | None = None  # the checkpoint's trained maximum; context_limit is the cap in use
    bos_token_id: int | None = None
    # Per-pair RoPE frequency divisors, tensor ``rope_freq_factors [head_dim/2]`` (Llama 3.x ``rope_scaling: llama3``;
    # llama.cpp's ``rope_freqs``): pair i rotates by position * rope_theta^(-2i/head_dim) / factor[i].
    rope_freq_factors: bool = False


@dataclass(frozen=True)
class ParamTensor:
    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        """Bytes in the blob; a quantised tensor is whole blocks (its element count must fill them)."""
        if self.dtype in QUANT_BLOCKS:
            weights, size = QUANT_BLOCKS[self.dtype]
            count = 1
            for d in self.shape:
                count *= d
            return -(-count // weights) * size
        n = DTYPE_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class KvSpec:
    dtype: str
    block_tokens: int
    max_sequences: int
    bytes: int
    section: str


@dataclass(frozen=True)
class Workspace:
    prefill_peak_bytes: int
    decode_peak_bytes: int


@dataclass(frozen=True)
class GoldenTensor:
    file: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    top_k: int


@dataclass(frozen=True)
class Golden:
    prompt: GoldenTensor
    prefill_logits: GoldenTensor
    decode_tokens: GoldenTensor
    tolerance: Tolerance


@dataclass(frozen=True)
class TokenizerRef:
    file: str
    vocab_size: int
    config: str | None = None


@dataclass(frozen=True)
class Model:
    alias: str
    name: str
    chip_mode: ChipMode
    target_chips: tuple[int, ...]
    architecture: Architecture
    tokenizer: TokenizerRef
    params: tuple[ParamTensor, ...]
    kv: KvSpec
    workspace: Workspace
    golden: Golden
    sections: tuple[Section, ...]
    graphs: tuple[Graph, ...]
    pointer: str = ""

    def graph(self, kind: GraphKind | str) -> Graph:
        """The one graph of ``kind``; a model with none or several is invalid."""
        kind = GraphKind(kind)
        found = [g for g in self.graphs if g.kind is kind]
        if len(found) != 1:
            raise PackageError(
                f"model {self.alias!r} has {len(found)} {kind.value} graphs, expected exactly 1",
                field=f"{self.pointer}/graphs",
            )
        return found[0]

    @property
    def prefill(self) -> Graph:
        return self.graph(GraphKind.PREFILL)

    @property
    def decode(self) -> Graph:
        return self.graph(GraphKind.DECODE)

    def all_sections(self) -> tuple[Section, ...]:
        return self.sections + tuple(s for g in self.graphs for s in g.sections)

    @property
    def kv_section(self) -> Section:
        for s in self.sections:
            if s.name == self.kv.section:
                return s
        raise PackageError(
            f"kv.section {self.kv.section!r} names no section of model {self.alias!r}",
            field=f"{self.pointer}/kv/section",
        )

    @property
    def kv_bytes_per_token(self) -> int:
        a = self.architecture
        return 2 * a.n_layers * a.n_kv_heads * a.head_dim * DTYPE_BYTES[self.kv.dtype]

    @property
    def param_files(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for t in self.params:
            seen.setdefault(t.file, None)
        return tuple(seen)


@dataclass(frozen=True)
class MemoryRegion(AddressRange):
    chip: int
    name: str
    owner: str
    kind: SectionKind
    vaddr: int
    size: int
    writable: bool
    pointer: str = ""


@dataclass(frozen=True)
class DeviceCfg:
    chip_nums: int
    calcore_num: int
    chip_dram_bytes: int


@dataclass(frozen=True)
class Package:
    """A loaded package. ``root`` is the directory it was read from."""

    root: Path
    name: str
    version: str
    kind: str
    device_cfg: DeviceCfg
    models: tuple[Model, ...]
    memory_plan: tuple[MemoryRegion, ...]
    document: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(m.alias for m in self.models)

    @property
    def graphs(self) -> tuple[Graph, ...]:
        """Every graph of every model, in manifest order."""
        return tuple(g for m in self.models for g in m.graphs)

    def model(self, alias: str) -> Model:
        """Exact alias lookup (001 §10.4). No case folding, no prefix matching."""
        for m in self.models:
            if m.alias == alias:
                return m
        raise PackageError(
            f"no model with alias {alias!r} (the package has: {', '.join(self.aliases)})",
            path=MANIFEST,
            field="/models",
        )

    def graph(self, name: str) -> Graph:
        for g in self.graphs:
            if g.name == name:
                return g
        raise PackageError(f"no graph named {name!r}", path=MANIFEST, field="/models")

    def regions_on(self, chip: int) -> tuple[MemoryRegion, ...]:
        return tuple(r for r in self.memory_plan if r.chip == chip)

    def path(self, rel: str) -> Path:
        return self.root / rel


# ---------------------------------------------------------------------------
# Construction from a schema-valid manifest document


def _tensor(d: Mapping[str, Any]) -> TensorSpec:
    return TensorSpec(name=d["name"], dtype=d["dtype"], shape=tuple(d["shape"]))


def _section(d: Mapping[str, Any], pointer: str) -> Section:
    return Section(
        name=d["name"],
        kind=SectionKind(d["kind"]),
        chip_mask=int(d["chip_mask"]),
        vaddr=int(d["vaddr"]),
        size=int(d["size"]),
        file=d.get("file"),
        calcore=d.get("calcore"),
        offset=int(d.get("offset", 0)),
        pointer=pointer,
    )


def _graph(d: Mapping[str, Any], alias: str, pointer: str) -> Graph:
    pol = d.get("inactive_lane_policy")
    return Graph(
        name=d["name"],
        model_alias=alias,
        kind=GraphKind(d["kind"]),
        chip_mode=ChipMode(d["chip_mode"]),
        target_chips=tuple(d["target_chips"]),
        batch_profiles=tuple(sorted(d["batch_profiles"])),
        max_seq=int(d["max_seq"]),
        inputs=tuple(_tensor(t) for t in d["inputs"]),
        outputs=tuple(_tensor(t) for t in d["outputs"]),
        position_semantics=d["csr"]["position_semantics"],
        valid_length_input=d["csr"].get("valid_length_input"),
        inactive_lane_policy=None if pol is None else InactiveLanePolicy(**pol),
        sections=tuple(_section(s, f"{pointer}/sections/{i}") for i, s in enumerate(d["sections"])),
        pointer=pointer,
    )


def _golden_tensor(d: Mapping[str, Any]) -> GoldenTensor:
    return GoldenTensor(file=d["file"], dtype=d["dtype"], shape=tuple(d["shape"]))


def _model(d: Mapping[str, Any], pointer: str) -> Model:
    arch = Architecture(**d["architecture"])
    g = d["golden"]
    return Model(
        alias=d["alias"],
        name=d["name"],
        chip_mode=ChipMode(d["chip_mode"]),
        target_chips=tuple(d["target_chips"]),
        architecture=arch,
        tokenizer=TokenizerRef(**d["tokenizer"]),
        params=tuple(
            ParamTensor(
                name=t["name"], file=t["file"], dtype=t["dtype"], shape=tuple(t["shape"]), offset=int(t["offset"])
            )
            for t in d["params"]["tensors"]
        ),
        kv=KvSpec(**d["kv"]),
        workspace=Workspace(**d["workspace"]),
        golden=Golden(
            prompt=_golden_tensor(g["prompt"]),
            prefill_logits=_golden_tensor(g["prefill_logits"]),
            decode_tokens=_golden_tensor(g["decode_tokens"]),
            tolerance=Tolerance(**g["tolerance"]),
        ),
        sections=tuple(_section(s, f"{pointer}/sections/{i}") for i, s in enumerate(d["sections"])),
        graphs=tuple(_graph(gr, d["alias"], f"{pointer}/graphs/{i}") for i, gr in enumerate(d["graphs"])),
        pointer=pointer,
    )


def package_from_document(root: Path, doc: Mapping[str, Any]) -> Package:
    """Build the typed package from a manifest that already passed the JSON Schema."""
    regions = []
    for ci, chip in enumerate(doc["memory_plan"]["chips"]):
        for ri, r in enumerate(chip["regions"]):
            regions.append(
                MemoryRegion(
                    chip=int(chip["chip"]),
                    name=r["name"],
                    owner=r["owner"],
                    kind=SectionKind(r["kind"]),
                    vaddr=int(r["vaddr"]),
                    size=int(r["size"]),
                    writable=bool(r["writable"]),
                    pointer=f"/memory_plan/chips/{ci}/regions/{ri}",
                )
            )
    pkg = doc["package"]
    return Package(
        root=root,
        name=pkg["name"],
        version=str(pkg["version"]),
        kind=pkg["kind"],
        device_cfg=DeviceCfg(**doc["device_cfg"]),
        models=tuple(_model(m, f"/models/{i}") for i, m in enumerate(doc["models"])),
        memory_plan=tuple(regions),
        document=doc,
    )
