"""The bundled sample packages that commands use when given no package.

They are built on first use into a cache directory (``$CALCTL_CACHE_DIR``, else
``$XDG_CACHE_HOME/calctl``, else ``~/.cache/calctl``) with the published
test-only key, so they work from a wheel install as well as from a checkout.
Building is deterministic; concurrent first uses race safely (one rename wins).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from calctl import __version__
from calctl.cache import cache_dir
from calctl.compiler.sample import GENERATOR_REVISION, KINDS, build_sample
from calctl.signing.keys import load_private
from calctl.signing.policy import test_key_paths


def bundled_package(kind: str = "combined", seed: int = 0) -> Path:
    """Path of the bundled sample of ``kind``, building it if needed."""
    if kind not in KINDS:
        raise ValueError(kind)
    target = cache_dir() / "samples" / f"{__version__}-r{GENERATOR_REVISION}" / f"{kind}-seed{seed}"
    if (target / "checksums.sha256.sig").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # a broken earlier attempt: start over
        shutil.rmtree(target, ignore_errors=True)
    key = load_private(test_key_paths()[0])
    try:
        build_sample(target, kind=kind, key=key, seed=seed)
    except OSError:
        if not (target / "checksums.sha256.sig").is_file():
            raise
    return target
