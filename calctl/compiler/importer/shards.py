"""Which safetensors files of a Hugging Face directory hold the weights, and which file holds each tensor.

A sharded checkpoint comes with ``model.safetensors.index.json``, whose ``weight_map`` names the file of every
tensor; transformers loads exactly the files it names, so calctl does too, and says which other
``*.safetensors`` files it left (Mistral repositories ship a ``consolidated.safetensors`` beside the shards).
Without an index, every ``*.safetensors`` file of the directory is read.

Nothing is merged silently (issue 54: shards defining one tensor twice were merged, the first one winning):

* a tensor defined by two files, twice in one file's header or twice in the index (a duplicate JSON key), is
  refused naming it and the files;
* file names that are the same name to a case- or normalisation-insensitive file system (``Shard.safetensors``
  and ``shard.safetensors``; ``café`` as NFC and NFD) are refused naming both: on macOS they are one file;
* an index naming a file that is absent, or anything but a plain file name (``../x``), is refused;
* a shard holding a tensor the index does not mention, or maps to another file, is refused (the index and the
  files disagree about the model; transformers would load the tensor anyway, or miss it);
* a tensor the index names that its file does not hold is refused.

Counts are bounded before any file is opened: :data:`calctl.limits.MAX_SHARDS` files, and their headers'
bytes together at most ``hf.MAX_HEADER_BYTES``. This module reads directory listings and the index; the
safetensors headers are read by :mod:`.hf`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calctl import jsonsafe, limits, textsafe
from calctl.compiler.importer.families import CheckpointError

INDEX_NAME = "model.safetensors.index.json"
SUFFIX = ".safetensors"
MAX_INDEX_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ShardPlan:
    """The weight files to read, in order, and the index's ``{tensor: file name}`` when there is one."""

    files: tuple[Path, ...]
    weight_map: Mapping[str, str] | None = None
    index: Path | None = None
    ignored: tuple[str, ...] = ()  # *.safetensors files the index does not name

    def notes(self) -> tuple[str, ...]:
        if not self.ignored:
            return ()
        return (
            f"{INDEX_NAME} names {len(self.files)} weight file(s); not read, as transformers does not read them: "
            + ", ".join(self.ignored),
        )


class DuplicateKey(ValueError):
    """A JSON object that states one key twice (``json`` keeps the last silently)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(key)
        seen[key] = value
    return seen


def refuse_twins(names: list[str], where: Path) -> None:
    """CheckpointError naming two file names that one case- or normalisation-insensitive file system would merge
    (written with ``ascii()``: the NFC and NFD spellings of a name print alike)."""
    first: dict[str, str] = {}
    for name in sorted(names):
        other = first.setdefault(textsafe.caseless(name), name)
        if other != name:
            raise CheckpointError(
                where,
                f"weight files {other!a} and {name!a} differ only by letter case or Unicode normalisation "
                "(NFC/NFD): one file on macOS and on some archive extractors; refusing rather than reading either",
            )


def plan(root: Path) -> ShardPlan:
    """The weight files of the directory ``root`` (see the module docstring); CheckpointError (exit 2) otherwise."""
    present = sorted(p.name for p in root.glob(f"*{SUFFIX}"))
    if not present:
        raise CheckpointError(root, f"no *{SUFFIX} file; expected the weights in safetensors format")
    most = limits.MAX_SHARDS.maximum
    if len(present) > most:
        raise CheckpointError(
            root, f"{len(present):,} *{SUFFIX} files: {limits.over_limit('weight_shards', len(present))}"
        )
    refuse_twins(present, root)
    index_path = root / INDEX_NAME
    if not index_path.exists():
        return ShardPlan(tuple(root / n for n in present))
    weight_map = read_index(index_path)
    named = sorted(set(weight_map.values()))
    refuse_twins(named, index_path)
    here = set(present)
    for name in named:
        if name not in here:
            tensor = next(t for t, f in weight_map.items() if f == name)
            raise CheckpointError(
                index_path,
                f"weight_map maps tensor {tensor} to {name!r}, which is not in {root} "
                f"(expected one of: {', '.join(present[:5])}{' ...' if len(present) > 5 else ''})",
            )
    ignored = tuple(n for n in present if n not in set(named))
    return ShardPlan(tuple(root / n for n in named), weight_map, index_path, ignored)


def read_index(path: Path) -> dict[str, str]:
    """``weight_map`` of a ``model.safetensors.index.json``: tensor name -> plain file name, no key twice."""
    if not path.is_file():  # a FIFO would block the read
        raise CheckpointError(path, "not a regular file; expected the safetensors index (JSON)")
    if path.stat().st_size > MAX_INDEX_BYTES:
        raise CheckpointError(path, f"larger than {MAX_INDEX_BYTES} bytes; not a safetensors index")
    try:
        doc = jsonsafe.loads(path.read_bytes(), object_pairs_hook=no_duplicate_keys)
    except DuplicateKey as exc:
        raise CheckpointError(
            path,
            f"key {exc.key!r} appears twice in one object (JSON readers keep the last silently); refusing rather "
            "than guessing which file holds the tensor",
        ) from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(path, f"is not valid JSON ({exc}); expected a safetensors index") from None
    if not isinstance(doc, dict):
        raise CheckpointError(path, f"is a JSON {type(doc).__name__}; expected an object with a weight_map")
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(
            path, f"weight_map: expected an object of tensor name -> file name, found {textsafe.clip(repr(weight_map))}"
        )
    for tensor, name in weight_map.items():
        if not (isinstance(name, str) and name.endswith(SUFFIX) and name == Path(name).name and "\\" not in name):
            raise CheckpointError(
                path,
                f"weight_map[{tensor!r}]: expected a *{SUFFIX} file name in the same directory, "
                f"found {textsafe.clip(repr(name))}",
            )
    return weight_map


def check_owners(owners: Mapping[str, Path], shards: ShardPlan) -> None:
    """The tensors each file holds (``owners``: tensor -> file) are those the index maps to it."""
    if shards.weight_map is None or shards.index is None:
        return
    wm = shards.weight_map
    for tensor, path in owners.items():
        if wm.get(tensor) != path.name:
            where = f"maps it to {wm[tensor]!r}" if tensor in wm else "does not mention it"
            raise CheckpointError(
                path,
                f"holds tensor {tensor}, but {INDEX_NAME} {where}: the index and the shards disagree",
                hint="re-save the checkpoint (save_pretrained writes the index and the shards together)",
            )
    for tensor, name in wm.items():
        if tensor not in owners:
            raise CheckpointError(shards.index, f"weight_map maps tensor {tensor} to {name!r}, which does not hold it")
