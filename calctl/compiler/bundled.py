"""The bundled sample packages that commands use when given no package.

They are built on first use into a cache directory (``$CALCTL_CACHE_DIR``, else
``$XDG_CACHE_HOME/calctl``, else ``~/.cache/calctl``) with the published
test-only key, so they work from a wheel install as well as from a checkout.
Building is deterministic; concurrent first uses race safely (one rename wins).

The combined sample compiles decode profiles B1 and B4 (:data:`DECODE_PROFILES`), so what the quick level of
``calctl accept`` measures includes a batched profile (M3, 000 §19; run-golden's B4 lanes against their B1
twins); the others compile B1 only. Serving still decodes at B1 unless a scheduler config asks for B4.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from calctl import __version__
from calctl.cache import cache_dir
from calctl.compiler.sample import GENERATOR_REVISION, KINDS, build_sample
from calctl.signing.keys import load_private
from calctl.signing.policy import test_key_paths

#: The decode profiles each bundled sample compiles (a kind not named: B1 only).
DECODE_PROFILES: dict[str, tuple[int, ...]] = {"combined": (1, 4)}


def bundled_package(kind: str = "combined", seed: int = 0) -> Path:
    """Path of the bundled sample of ``kind``, building it if needed."""
    if kind not in KINDS:
        raise ValueError(kind)
    profiles = DECODE_PROFILES.get(kind, (1,))
    name = f"{kind}-seed{seed}" + ("" if profiles == (1,) else "-b" + "-".join(map(str, profiles)))
    target = cache_dir() / "samples" / f"{__version__}-r{GENERATOR_REVISION}" / name
    if (target / "checksums.sha256.sig").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # a broken earlier attempt: start over
        shutil.rmtree(target, ignore_errors=True)
    key = load_private(test_key_paths()[0])
    try:
        build_sample(target, kind=kind, key=key, seed=seed, decode_profiles=profiles)
    except OSError:
        if not (target / "checksums.sha256.sig").is_file():
            raise
    return target
