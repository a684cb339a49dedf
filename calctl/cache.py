"""Where calctl keeps what it builds on first use: the one rule for the cache directory.

``$CALCTL_CACHE_DIR``, else ``$XDG_CACHE_HOME/calctl``, else ``~/.cache/calctl``.
The bundled sample packages (``calctl.compiler.bundled``), the reference board
(``calctl.runtime._native.build``) and the native weight kernels
(``calctl.model.native``) each keep a sub-folder of it. It sits in the lowest
layer so every folder may use it. This module names the directory; it creates
nothing and reads nothing from it.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable that overrides the cache directory.
CACHE_DIR_ENV = "CALCTL_CACHE_DIR"


def cache_dir() -> Path:
    """The calctl cache directory (it may not exist yet)."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "calctl"
