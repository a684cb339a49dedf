"""Where calctl keeps what it builds on first use: the one rule for the cache directory.

``$CALCTL_CACHE_DIR``, else ``$XDG_CACHE_HOME/calctl``, else ``~/.cache/calctl``.
The bundled sample packages (``calctl.compiler.bundled``), the reference board
(``calctl.runtime._native.build``) and the native weight kernels
(``calctl.model.native``) each keep a sub-folder of it. It sits in the lowest
layer so every folder may use it. This module names the directory and checks that it can be one; it
creates nothing and reads nothing from it.
"""

from __future__ import annotations

import os
from pathlib import Path

from calctl.errors import ConfigError
from calctl.filekind import directory_problem

#: Environment variable that overrides the cache directory.
CACHE_DIR_ENV = "CALCTL_CACHE_DIR"


def cache_dir() -> Path:
    """The calctl cache directory (it may not exist yet).

    A :class:`~calctl.errors.ConfigError` (exit 2) naming the variable when the directory, or an ancestor that
    exists, is not a directory (``CALCTL_CACHE_DIR=/dev/null``, a FIFO, a symlink loop): building into it was an
    internal error."""
    env = os.environ.get(CACHE_DIR_ENV)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if env:
        path, source = Path(env), f"{CACHE_DIR_ENV}={env}"
    else:
        path = (Path(xdg) if xdg else Path.home() / ".cache") / "calctl"
        source = f"XDG_CACHE_HOME={xdg}" if xdg else "the cache directory"
    if problem := directory_problem(path):
        raise ConfigError(f"{source}: {path}: {problem}")
    return path
