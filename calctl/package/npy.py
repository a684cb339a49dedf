"""Reading ``.npy`` files, from any thread.

numpy parses an array's header with :func:`ast.literal_eval`. On CPython 3.11
two threads building an AST at once can make one of them fail with
``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905:
the depth counter is shared, and a thread switch in the middle of one
construction lets another move it). calctl reads golden data and prompts from
the threads that drive two chips at once, so every ``.npy`` read goes through
:func:`load`, which takes one process-wide lock around ``np.load``.
Pickled objects are never loaded.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from calctl.errors import PackageError

if TYPE_CHECKING:
    import numpy as np

_LOCK = threading.Lock()
#: numpy's own limit for a header (``max_header_size``), checked here before numpy reads the header.
MAX_HEADER_BYTES = 10_000


def load(path: str | Path, *, mmap_mode: Literal["r"] | None = None) -> np.ndarray:
    """``np.load(path, allow_pickle=False)`` under the lock; ``mmap_mode="r"`` maps the data instead of reading it.

    A file that is no .npy raises ValueError (an empty one too), a missing or unreadable one OSError."""
    import numpy as np  # here, not at import: `calctl validate` and the CLI start without numpy

    with _LOCK:
        try:
            _check_declared_size(np, path)
            return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
        except EOFError as exc:
            # An empty file. Callers catch ValueError for a file that is no .npy; an EOFError would reach click,
            # which reads it as the end of the user's input and exits "interrupted" (130).
            raise ValueError(f"not a .npy file: {exc}") from None


def load_member(root: Path, rel: str, *, what: str = "") -> np.ndarray:
    """The array in the package file ``rel`` under ``root``, read into memory; a PackageError naming ``rel``
    ("cannot read{what}: why") when it is missing, unreadable or no .npy."""
    import numpy as np

    try:
        return np.asarray(load(root / rel))
    except (OSError, ValueError) as exc:
        raise PackageError(f"cannot read{what}: {exc}", path=rel) from None


def _check_declared_size(np: Any, path: str | Path) -> None:
    """Refuse a header whose shape needs more bytes than the file holds, before numpy allocates the array.

    (A 100-byte file declaring ``shape: (20000000000,)`` made numpy allocate 74.5 GiB, refused or not by the
    kernel's overcommit policy.) Only a plain version 1-3 header is read here; numpy judges everything else.
    """
    from numpy.lib import format as npy_format

    with open(path, "rb") as fh:
        head = fh.read(12)
        if head[:6] == b"\x93NUMPY" and len(head) == 12:
            # numpy reads the whole header a file declares (version 2: up to 4 GiB) before it checks it against
            # its own 10,000-byte limit: check the declared length first.
            length = int.from_bytes(head[8:10] if head[6] == 1 else head[8:12], "little")
            if length > MAX_HEADER_BYTES:
                raise ValueError(
                    f"the header declares {length} bytes, over the {MAX_HEADER_BYTES} byte limit for a .npy header"
                )
        fh.seek(0)
        try:
            version = npy_format.read_magic(fh)
            if version == (1, 0):
                shape, _fortran, dtype = npy_format.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, _fortran, dtype = npy_format.read_array_header_2_0(fh)
            else:
                return
        except (ValueError, OSError, EOFError, SyntaxError, OverflowError, TypeError):
            return  # np.load says what is wrong, in its own words
        if dtype.hasobject:
            return
        count = 1
        for n in shape:
            count *= int(n)
        needed = count * dtype.itemsize
        held = os.fstat(fh.fileno()).st_size - fh.tell()
        if needed > held:
            shown = str(tuple(shape))
            shown = shown if len(shown) <= 80 else shown[:60] + f"... ({len(shape)} dimensions)"
            raise ValueError(
                f"the header declares shape {shown} of {dtype.str} ({needed} bytes), but the file holds "
                f"{held} bytes of data"
            )
