"""Trust policy shared by every command that loads a package.

``--trusted-key`` (repeatable), ``$CALCTL_TRUSTED_KEYS`` (a directory of
``*.pub``) and ``--allow-unsigned`` combine into one :class:`TrustPolicy`. The
bundled sample package is trusted through its published test-only key, and
only when the caller is using the bundled sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from calctl.signing.keys import TrustedKey, load_public, trust_store

TEST_KEY_NAME = "calctl-test-only-DO-NOT-TRUST"


@dataclass(frozen=True)
class TrustPolicy:
    keys: tuple[TrustedKey, ...] = field(default_factory=tuple)
    allow_unsigned: bool = False

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(k.key_id for k in self.keys)


def test_key_paths() -> tuple[Path, Path]:
    base = Path(str(resources.files("calctl").joinpath("_data", "keys")))
    return base / f"{TEST_KEY_NAME}.key", base / f"{TEST_KEY_NAME}.pub"


def test_public_key() -> TrustedKey:
    return load_public(test_key_paths()[1])


def make_policy(
    explicit: list[Path] | None, allow_unsigned: bool = False, *, trust_test_key: bool = False
) -> TrustPolicy:
    keys = trust_store(explicit)
    if trust_test_key and all(k.key_id != test_public_key().key_id for k in keys):
        keys.append(test_public_key())
    return TrustPolicy(keys=tuple(keys), allow_unsigned=allow_unsigned)
