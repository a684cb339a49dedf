"""Read a Hugging Face model directory: ``config.json``, ``*.safetensors``, the tokenizer files.

Weights load through the ``safetensors`` numpy API; BF16 tensors (which numpy
cannot hold) are read from the same file by the offsets its header declares and
widened to float32 exactly. Tensor names follow ``transformers``' Llama/Qwen2/
Qwen3 modules and become the package's names (``calctl.package.architecture``),
matrices transposed to ``[in, out]``. Every shape is checked against the config
before anything is written.

Both layouts transformers writes are read: transformers 4 keeps the chat
template in ``tokenizer_config.json``; transformers 5 writes it to
``chat_template.jinja`` (``chat_template.json`` in between) and nests the RoPE
base under ``rope_parameters`` (:func:`.families.hf_rope`). A template found
beside the tokenizer config goes into the package's ``tokenizer_config.json``;
otherwise the tokenizer files are kept as they are (001 §8.3: each model keeps
its own). ``generation_config.json`` supplies the EOS/BOS ids when ``config.json``
has none (transformers' ``generate`` stops on its ``eos_token_id``).

A tensor in the weights that the config does not account for (a bias the
config does not declare, say) is refused by name rather than dropped.
This module reads files; it writes nothing.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from calctl import jsonsafe
from calctl.compiler.importer import shards
from calctl.compiler.importer.families import CheckpointError, FamilyConfig, from_hf_config, refuse_unknown_tokens
from calctl.compiler.importer.shards import ShardPlan, check_owners
from calctl.filekind import kind_phrase
from calctl.package import tokenizer_file
from calctl.package.tokenizer_ids import added_id_problems

MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: A safetensors header (JSON) read into memory: the largest shard of a 405B checkpoint has ~100 KB; the format
#: allows 100 MB, which parsed into Python objects costs a GiB (issue 54: memory is bounded before parsing).
MAX_HEADER_BYTES = 16 * 1024 * 1024
#: validate's figure for the same file (``calctl.package.tokenizer_file.MAX_TOKENIZER_BYTES``).
MAX_TOKENIZER_BYTES = tokenizer_file.MAX_TOKENIZER_BYTES
#: safetensors dtypes a weight may have (integer and bool tensors are not model weights).
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


@dataclass(frozen=True)
class HfCheckpoint:
    root: Path
    config: FamilyConfig
    params: dict[str, np.ndarray]  # package names, float32, [in, out]
    tokenizer_json: bytes
    tokenizer_config: dict[str, Any]
    tokenizer_config_bytes: bytes
    sources: tuple[Path, ...]  # every file read, for provenance
    notes: tuple[str, ...] = ()  # what the report should say (weight files the index leaves out)


#: The files of a Hugging Face directory that are read (or may be, by a later transformers layout) beside the
#: weights: each that exists must be a regular file (or a symlink to one, as in the hub's cache), never a FIFO
#: (a read blocks forever), a device (never ends), a directory or a symlink loop, which used to be skipped.
INPUT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "model.safetensors.index.json",
)


def refuse_special_files(root: Path) -> None:
    """CheckpointError naming the first of :data:`INPUT_FILES` in ``root`` that exists and is not a regular file
    (followed through symlinks), and what it is instead."""
    for name in INPUT_FILES:
        problem = _not_a_file(root / name)
        if problem:
            raise CheckpointError(root / name, f"{problem}; expected a regular file ({name} of a Hugging Face model)")


def _not_a_file(path: Path) -> str | None:
    """None if ``path`` is absent or a regular file (through symlinks), else what it is."""
    try:
        link = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be inspected ({exc.strerror or exc})"
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:  # a dangling symlink, a loop
        return f"is a symlink that cannot be followed ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    via = f"a symlink to {kind_phrase(mode)}" if stat.S_ISLNK(link.st_mode) else kind_phrase(mode)
    return f"is {via}, not a regular file"


def _read_json(path: Path, what: str) -> dict[str, Any]:
    problem = _not_a_file(path)
    if problem:
        raise CheckpointError(path, f"{problem}; expected {what}")
    if not path.is_file():
        raise CheckpointError(path, f"missing: a Hugging Face model directory has {what}")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise CheckpointError(path, f"larger than {MAX_CONFIG_BYTES} bytes; not {what}")
    try:
        doc = jsonsafe.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(path, f"is not valid JSON ({exc}); expected {what}") from None
    if not isinstance(doc, dict):
        raise CheckpointError(path, f"is a JSON {type(doc).__name__}; expected {what} (an object)")
    return doc


def hf_tensor_names(cfg: FamilyConfig) -> Iterator[tuple[str, str, tuple[int, ...], bool]]:
    """``(hf name, package name, hf shape, transpose)`` for every tensor the config needs."""
    d, f, v, hd = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.head_dim
    qw, kw = cfg.n_heads * hd, cfg.n_kv_heads * hd
    yield "model.embed_tokens.weight", "embed", (v, d), False
    for i in range(cfg.n_layers):
        hp, pp = f"model.layers.{i}.", f"layers.{i}."
        yield hp + "input_layernorm.weight", pp + "attn_norm", (d,), False
        yield hp + "self_attn.q_proj.weight", pp + "wq", (qw, d), True
        yield hp + "self_attn.k_proj.weight", pp + "wk", (kw, d), True
        yield hp + "self_attn.v_proj.weight", pp + "wv", (kw, d), True
        if cfg.attn_bias:
            yield hp + "self_attn.q_proj.bias", pp + "bq", (qw,), False
            yield hp + "self_attn.k_proj.bias", pp + "bk", (kw,), False
            yield hp + "self_attn.v_proj.bias", pp + "bv", (kw,), False
        if cfg.qk_norm:
            yield hp + "self_attn.q_norm.weight", pp + "q_norm", (hd,), False
            yield hp + "self_attn.k_norm.weight", pp + "k_norm", (hd,), False
        yield hp + "self_attn.o_proj.weight", pp + "wo", (d, qw), True
        yield hp + "post_attention_layernorm.weight", pp + "mlp_norm", (d,), False
        yield hp + "mlp.gate_proj.weight", pp + "w_gate", (f, d), True
        yield hp + "mlp.up_proj.weight", pp + "w_up", (f, d), True
        yield hp + "mlp.down_proj.weight", pp + "w_down", (d, f), True
    yield "model.norm.weight", "final_norm", (d,), False
    if not cfg.tie_embeddings:
        yield "lm_head.weight", "lm_head", (v, d), True


class _SafetensorsFile:
    """One ``.safetensors`` file: its header read strictly, tensors through the safetensors numpy API."""

    def __init__(self, path: Path, header_budget: int = MAX_HEADER_BYTES) -> None:
        """``header_budget``: the header bytes this file may still have (the shards' headers share one budget)."""
        from safetensors import safe_open

        self.path = path
        if not path.is_file():  # a FIFO would block the read below forever, a device never end
            raise CheckpointError(path, "not a regular file; expected a safetensors weights file")
        size = path.stat().st_size
        try:
            with path.open("rb") as fh:
                raw = fh.read(8)
                if len(raw) < 8:
                    raise CheckpointError(
                        path, f"truncated: {size} bytes, a safetensors file starts with an 8-byte header length"
                    )
                (n,) = struct.unpack("<Q", raw)
                if 8 + n > size:
                    raise CheckpointError(
                        path, f"truncated or not safetensors: header of {n} bytes in a {size}-byte file"
                    )
                if n > header_budget:
                    raise CheckpointError(
                        path,
                        f"a header of {n} bytes, over the {header_budget} bytes calctl still reads (the headers of "
                        f"all shards together: {MAX_HEADER_BYTES}; real ones ~100 KB)",
                    )
                header = jsonsafe.loads(fh.read(n), object_pairs_hook=shards.no_duplicate_keys)
        except shards.DuplicateKey as exc:
            raise CheckpointError(
                path,
                f"its header states the key {exc.key!r} twice (one tensor defined twice?); refusing rather than "
                "picking one",
            ) from None
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(path, f"not a safetensors file: cannot read its header ({exc})") from None
        if not isinstance(header, dict):
            raise CheckpointError(path, "not a safetensors file: the header is not a JSON object")
        self.data_start = 8 + n
        self.header = {k: v for k, v in header.items() if k != "__metadata__"}
        for name, info in self.header.items():
            offsets = info.get("data_offsets") if isinstance(info, dict) else None
            if not (
                isinstance(offsets, list)
                and len(offsets) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in offsets)
                and offsets[0] <= offsets[1]
            ):
                found = "no data_offsets" if offsets is None else f"data_offsets {offsets!r}"
                raise CheckpointError(
                    path,
                    f"header entry {name!r}: {found}; expected data_offsets [start, end], two integers with "
                    "0 <= start <= end (byte offsets into the data after the header)",
                )
        end = max((int(t["data_offsets"][1]) for t in self.header.values()), default=0)
        if self.data_start + end > size:
            raise CheckpointError(
                path, f"truncated: the header declares {self.data_start + end} bytes of data, the file has {size}"
            )
        try:
            self._handle: Any = safe_open(str(path), framework="np")
        except Exception as exc:  # safetensors raises its own SafetensorError (an Exception)
            raise CheckpointError(path, f"safetensors cannot open it: {exc}") from None

    def get(self, name: str) -> np.ndarray:
        info = self.header[name]
        if info.get("dtype") not in FLOAT_DTYPES:  # checked where read: an unused integer buffer is harmless
            raise CheckpointError(
                self.path,
                f"tensor {name}: dtype {info.get('dtype')!r} is not a floating-point weight; "
                f"expected one of {', '.join(FLOAT_DTYPES)}",
            )
        if info.get("dtype") == "BF16":  # numpy has no bfloat16: widen the raw 16 bits exactly
            start, stop = (int(x) for x in info["data_offsets"])
            count = (stop - start) // 2
            raw = np.fromfile(self.path, dtype="<u2", count=count, offset=self.data_start + start)
            return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])
        try:
            return np.asarray(self._handle.get_tensor(name))
        except Exception as exc:
            raise CheckpointError(self.path, f"tensor {name}: cannot read ({exc})") from None


def load_weights(shard_plan: ShardPlan, cfg: FamilyConfig) -> dict[str, np.ndarray]:
    """Every tensor ``cfg`` needs, by package name, float32 ``[in, out]``; CheckpointError naming file and tensor.

    A tensor defined by two files is refused naming both (it used to be merged, the first file winning), and with
    an index every file holds exactly the tensors the index maps to it (:mod:`.shards`).
    """
    files = list(shard_plan.files)
    index: dict[str, _SafetensorsFile] = {}
    header_bytes = 0
    for path in files:
        st = _SafetensorsFile(path, MAX_HEADER_BYTES - header_bytes)
        header_bytes += st.data_start - 8
        for k in st.header:
            prior = index.setdefault(k, st)
            if prior is not st:
                raise CheckpointError(
                    path,
                    f"tensor {k} is also defined in {prior.path.name}: two weight files define one tensor; "
                    "refusing rather than picking one",
                    hint="a checkpoint's shards each hold their own tensors (and the index says which)",
                )
    check_owners({k: st.path for k, st in index.items()}, shard_plan)
    out: dict[str, np.ndarray] = {}
    if cfg.rope_factors is not None:  # computed from config.json's rope_scaling, not stored in the weights
        out["rope_freq_factors"] = np.array(cfg.rope_factors, dtype=np.float32)
    where = ", ".join(p.name for p in files)
    for hf_name, name, shape, transpose in hf_tensor_names(cfg):
        found = index.get(hf_name)
        if found is None:
            raise CheckpointError(files[0].parent, f"no tensor {hf_name} in {where} (expected shape {list(shape)})")
        st = found
        declared = tuple(st.header[hf_name].get("shape", ()))
        if declared != shape:
            raise CheckpointError(
                st.path, f"tensor {hf_name} has shape {list(declared)}, config.json implies {list(shape)}"
            )
        with np.errstate(over="ignore", invalid="ignore"):  # an F64 past float32's range: refused below, no warning
            arr = st.get(hf_name).astype(np.float32, copy=False)
        if not np.all(np.isfinite(arr)):
            raise CheckpointError(
                st.path, f"tensor {hf_name} holds NaN or infinite values (or values past float32's range)"
            )
        out[name] = np.ascontiguousarray(arr.T) if transpose else arr
    used = {hf for hf, _, _, _ in hf_tensor_names(cfg)}
    for hf_name, st in index.items():
        harmless = (
            st.header[hf_name].get("dtype") not in FLOAT_DTYPES  # an integer buffer is not a weight
            or hf_name.endswith("rotary_emb.inv_freq")  # recomputed from rope_theta, as transformers does
            or (hf_name == "lm_head.weight" and cfg.tie_embeddings)  # tied: transformers uses the embedding
        )
        if hf_name not in used and not harmless:
            raise CheckpointError(
                st.path,
                f"tensor {hf_name} is not part of a {cfg.family} model as config.json describes it; "
                "refusing rather than dropping it",
                hint="a bias or norm the config does not declare (attention_bias, mlp_bias, ...) changes the model",
            )
    return out


def read_hf_dir(root: Path) -> HfCheckpoint:
    """Read and check a Hugging Face model directory; CheckpointError (exit 2) naming the file otherwise."""
    root = Path(root)
    if not root.is_dir():
        raise CheckpointError(root, "not a directory; expected a Hugging Face model directory (config.json, ...)")
    refuse_special_files(root)  # before any file is opened: a FIFO would block, a device never end
    cfg_path = root / "config.json"
    cfg = from_hf_config(_read_json(cfg_path, "config.json"), cfg_path)
    weight_files = shards.plan(root)
    tok_path = root / "tokenizer.json"
    if not tok_path.is_file():
        raise CheckpointError(tok_path, "missing: the model's tokenizer (tokenizer.json) is required")
    if tok_path.stat().st_size > MAX_TOKENIZER_BYTES:  # validate's limit for the same file (TOK001)
        raise CheckpointError(tok_path, f"larger than the {MAX_TOKENIZER_BYTES} bytes a tokenizer may have")
    try:  # bounded read and scan before the tokenizers library sees it (validate's TOK001 does the same)
        tok_bytes = tokenizer_file.read(tok_path, cfg.vocab_size)
    except tokenizer_file.TokenizerRefused as exc:
        raise CheckpointError(tok_path, str(exc)) from None
    except OSError as exc:
        raise CheckpointError(tok_path, f"cannot read it: {exc.strerror or exc}") from None
    tokenizer = _check_tokenizer(tok_path, tok_bytes)
    for where, problem in added_id_problems(tokenizer_file.declared_added_tokens(tok_bytes) or [], tokenizer):
        raise CheckpointError(tok_path, f"{where}: {problem}", hint="validate's TOK002 refuses the same file")
    tok_cfg_path = root / "tokenizer_config.json"
    tok_cfg = _read_json(tok_cfg_path, "tokenizer_config.json") if tok_cfg_path.is_file() else {}
    if not tok_cfg:
        raise CheckpointError(tok_cfg_path, "missing: tokenizer_config.json (eos_token, chat_template) is required")
    tok_cfg_bytes = tok_cfg_path.read_bytes()
    extra: list[Path] = []
    template, template_path = _chat_template_file(root)
    if template is not None and template_path is not None:
        extra.append(template_path)
        if tok_cfg.get("chat_template") != template:  # transformers 5 layout: the file wins, as it does there
            tok_cfg = {**tok_cfg, "chat_template": template}
            tok_cfg_bytes = (json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    # Before the weights are read (a large checkpoint takes minutes): the config's tokens are the tokenizer's.
    refuse_unknown_tokens(
        tok_cfg, tokenizer, min(tokenizer.get_vocab_size(with_added_tokens=True), cfg.vocab_size), tok_cfg_path
    )
    gen_path = root / "generation_config.json"
    if gen_path.is_file():
        extra.append(gen_path)
        cfg = _with_generation_ids(cfg, _read_json(gen_path, "generation_config.json"), gen_path)
    if weight_files.index is not None:
        extra.append(weight_files.index)
    params = load_weights(weight_files, cfg)
    return HfCheckpoint(
        root=root,
        config=cfg,
        params=params,
        tokenizer_json=tok_bytes,
        tokenizer_config=tok_cfg,
        tokenizer_config_bytes=tok_cfg_bytes,
        sources=(cfg_path, *weight_files.files, tok_path, tok_cfg_path, *extra),
        notes=weight_files.notes(),
    )


def _chat_template_file(root: Path) -> tuple[str | None, Path | None]:
    """The chat template transformers 5 (``chat_template.jinja``) or 4.4x (``chat_template.json``) saved, if any."""
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        if jinja.stat().st_size > MAX_CONFIG_BYTES:
            raise CheckpointError(jinja, f"larger than {MAX_CONFIG_BYTES} bytes; not a chat template")
        try:
            return jinja.read_text(encoding="utf-8"), jinja
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(
                jinja, f"cannot read it as UTF-8 text ({exc}); expected a Jinja chat template"
            ) from None
    legacy = root / "chat_template.json"
    if legacy.is_file():
        doc = _read_json(legacy, "chat_template.json")
        value = doc.get("chat_template")
        if not isinstance(value, str):
            raise CheckpointError(legacy, f"chat_template: expected a string, found {type(value).__name__}")
        return value, legacy
    return None, None


def _with_generation_ids(cfg: FamilyConfig, doc: dict[str, Any], where: Path) -> FamilyConfig:
    """EOS/BOS from ``generation_config.json`` where ``config.json`` states none."""
    from calctl.compiler.importer.families import _Cfg

    c = _Cfg(doc, where)
    v = cfg.vocab_size  # every id of the file is checked, used or not: a declared id past the vocabulary is wrong
    gen_eos, gen_bos = c.token_id("eos_token_id", v), c.token_id("bos_token_id", v)
    c.token_id("pad_token_id", v)
    for key in GENERATION_ID_FIELDS:  # checked, not applied (docs/import.md): an id past the vocabulary is wrong
        _generation_ids(doc, key, v, where)
    eos = cfg.eos_token_id if cfg.eos_token_id is not None else gen_eos
    bos = cfg.bos_token_id if cfg.bos_token_id is not None else gen_bos
    return replace(cfg, eos_token_id=eos, bos_token_id=bos)


#: ``generation_config.json`` fields that hold token ids and that calctl copies into provenance but does not apply
#: (serving decodes with the request's own parameters): each id is still checked against the vocabulary.
GENERATION_ID_FIELDS = (
    "decoder_start_token_id",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "suppress_tokens",
    "begin_suppress_tokens",
    "bad_words_ids",
    "force_words_ids",
    "sep_token_id",
)


def _generation_ids(doc: dict[str, Any], key: str, vocab: int, where: Path) -> None:
    """Every token id under ``key`` (an id, a list of ids, or a list of lists, as transformers takes them) is an
    integer in ``[0, vocab)``; CheckpointError naming the field, the index and the value otherwise."""
    value = doc.get(key)
    todo: list[tuple[str, Any, int]] = [(key, value, 0)]
    while todo:
        label, item, depth = todo.pop()
        if item is None and depth == 0:
            continue
        if isinstance(item, list) and depth < 3:
            todo.extend((f"{label}[{i}]", x, depth + 1) for i, x in reversed(list(enumerate(item))))
            continue
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise CheckpointError(where, f"{label}: expected a token id >= 0 (or lists of them), found {item!r}")
        if item >= vocab:
            raise CheckpointError(where, f"{label} {item} is outside the vocabulary (expected < vocab_size {vocab})")


def _check_tokenizer(path: Path, data: bytes) -> Any:
    """The tokenizer ``data`` (read from ``path``) loaded, or CheckpointError naming the file."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_buffer(data)  # any path bytes: from_file takes UTF-8 only
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise CheckpointError(path, f"the tokenizers library cannot load it: {exc}") from None
