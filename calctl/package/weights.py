"""The identity of a model's weights: one SHA-256 per parameter tensor, over the bytes the model reads.

A replica package is the same model on both chips (001 §12 Phase 2 item 1), and
"the same" is a fact of the bytes each tensor name maps to, not of file names or
of whole blobs: two manifests that share one blob but swap two tensors' offsets
(or names, or dtypes) describe two different models (issue 54: such a "replica"
was written by ``combine`` and passed ``validate``). :func:`tensor_digests` is
what ``combine`` and GOLD008 compare; :func:`differing` names the tensors that
differ.

Reading is bounded: a tensor's range is checked against its file's size before
it is read, in pieces of at most 8 MiB. This module decides nothing about
packages; it raises :class:`~calctl.errors.PackageError` (exit 1) for a tensor
that lies past the end of its file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path

from calctl.errors import PackageError
from calctl.package.model import Model, ParamTensor

PIECE = 8 * 1024 * 1024


def tensor_identity(t: ParamTensor, content: str) -> str:
    """What must be equal for two tensors of one name to be the same weight: dtype, shape and bytes."""
    return f"{t.dtype}{list(t.shape)}:{content}"


def range_digest(path: Path, offset: int, nbytes: int, *, what: str) -> str:
    """SHA-256 of ``nbytes`` bytes of ``path`` from ``offset``; PackageError if the file is shorter."""
    size = path.stat().st_size
    if offset + nbytes > size:
        raise PackageError(
            f"{what} needs bytes {offset}..{offset + nbytes}, the file holds {size}",
            path=str(path),
            hint="the manifest and its blob disagree; rebuild the package",
        )
    h = hashlib.sha256()
    with path.open("rb") as fh:
        fh.seek(offset)
        left = nbytes
        while left:
            piece = fh.read(min(PIECE, left))
            if not piece:  # the file shrank while it was read
                raise PackageError(f"{what}: the file ended while it was read", path=str(path))
            h.update(piece)
            left -= len(piece)
    return h.hexdigest()


def tensor_digests(root: Path, m: Model, *, read: Callable[[ParamTensor], str] | None = None) -> dict[str, str]:
    """``{tensor name: identity}`` of every parameter tensor of ``m`` in the package at ``root``.

    ``read`` may supply a tensor's content digest (GOLD008 passes one that reuses whole-file hashes);
    by default each tensor's byte range is hashed.
    """

    if read is None:
        check_extent(root, m)

    def default(t: ParamTensor) -> str:
        return range_digest(root / t.file, t.offset, t.nbytes, what=f"tensor {t.name} of {m.alias!r}")

    digest = read or default
    return {t.name: tensor_identity(t, digest(t)) for t in m.params}


def check_extent(root: Path, m: Model) -> None:
    """PackageError unless each file's tensors together fit in it: tensors that overlap or repeat one range
    would make hashing them cost more than the file (50,000 tensors over one 1 GB blob: 50 TB)."""
    spans: dict[str, int] = {}
    for t in m.params:
        spans[t.file] = spans.get(t.file, 0) + t.nbytes
    for rel, total in spans.items():
        path = root / rel
        if not path.is_file() or path.is_symlink():
            raise PackageError(
                f"a parameter file of {m.alias!r} is missing or not a regular file (MAN007)", path=str(path)
            )
        size = path.stat().st_size
        if total > size:
            raise PackageError(
                f"the tensors of {m.alias!r} in it declare {total} bytes, the file holds {size}: they overlap or "
                "run past its end (GOLD005)",
                path=str(path),
            )


def differing(a: Mapping[str, str], b: Mapping[str, str]) -> list[str]:
    """Names of the tensors that are not the same in ``a`` and ``b`` (present in one only, or different)."""
    return sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))


def describe(names: list[str], shown: int = 5) -> str:
    """``'a, b, c and 4 more'``: the differing tensors for a message."""
    head = ", ".join(names[:shown])
    return head + (f" and {len(names) - shown} more" if len(names) > shown else "")
