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

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import numpy as np

_LOCK = threading.Lock()


def load(path: str | Path, *, mmap_mode: Literal["r"] | None = None) -> np.ndarray:
    """``np.load(path, allow_pickle=False)`` under the lock; ``mmap_mode="r"`` maps the data instead of reading it.

    A file that is no .npy raises ValueError (an empty one too), a missing or unreadable one OSError."""
    import numpy as np  # here, not at import: `calctl validate` and the CLI start without numpy

    with _LOCK:
        try:
            return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
        except EOFError as exc:
            # An empty file. Callers catch ValueError for a file that is no .npy; an EOFError would reach click,
            # which reads it as the end of the user's input and exits "interrupted" (130).
            raise ValueError(f"not a .npy file: {exc}") from None
