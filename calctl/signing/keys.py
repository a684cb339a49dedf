"""Ed25519 key files and the trust store.

Keys are PEM (PKCS#8 private key, SubjectPublicKeyInfo public key) so that
``openssl pkeyutl -verify -pubin -inkey KEY.pub -rawin`` can check a package
signature without calctl. A key id is the first 16 hex digits of the SHA-256 of
the raw 32-byte public key.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from calctl.errors import UsageError
from calctl.signing.files import NotReadable, read_regular

TRUST_DIR_ENV = "CALCTL_TRUSTED_KEYS"
MAX_KEY_FILE_BYTES = 64 * 1024


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class TrustedKey:
    key: Ed25519PublicKey
    key_id: str
    source: str


def generate(prefix: Path) -> tuple[Path, Path]:
    """Write ``PREFIX.key`` (0600) and ``PREFIX.pub``; refuse to overwrite either."""
    priv_path = Path(f"{prefix}.key")
    pub_path = Path(f"{prefix}.pub")
    for p in (priv_path, pub_path):
        if p.exists() or p.is_symlink():
            raise UsageError(
                f"{p}: already exists; refusing to overwrite a key",
                hint="choose another PREFIX or remove the old files",
            )
    if not priv_path.parent.is_dir():
        raise UsageError(f"{priv_path.parent}: directory does not exist")
    key = Ed25519PrivateKey.generate()
    priv_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pub_pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(priv_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(priv_pem)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        fd = os.open(pub_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        priv_path.unlink()
        raise
    with os.fdopen(fd, "wb") as fh:
        fh.write(pub_pem)
        fh.flush()
        os.fsync(fh.fileno())
    return priv_path, pub_path


def _read_small(path: Path, what: str) -> bytes:
    try:
        return read_regular(path, MAX_KEY_FILE_BYTES)
    except NotReadable as exc:
        if exc.missing:
            raise UsageError(f"{path}: {what} not found") from None
        raise UsageError(f"{path}: {exc.reason}, expected a {what} file") from None


def _load_pem(path: Path, what: str, load: Callable[[bytes], Any], want: type, *, hint: str, pem: str = "a PEM") -> Any:
    """The Ed25519 ``what`` ("private key", "public key") in the PEM file ``path``, or a UsageError saying why not."""
    data = _read_small(path, what)
    try:
        key = load(data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise UsageError(f"{path}: not {pem} {what} ({exc})", hint=hint) from None
    if not isinstance(key, want):
        raise UsageError(f"{path}: is a {type(key).__name__}, expected an Ed25519 {what}")
    return key


def load_private(path: Path) -> Ed25519PrivateKey:
    load = functools.partial(serialization.load_pem_private_key, password=None)
    hint = "create one with `calctl keygen PREFIX`"
    key: Ed25519PrivateKey = _load_pem(
        path, "private key", load, Ed25519PrivateKey, hint=hint, pem="an unencrypted PEM"
    )
    return key


def load_public(path: Path) -> TrustedKey:
    hint = "pass the PREFIX.pub written by `calctl keygen`"
    key: Ed25519PublicKey = _load_pem(
        path, "public key", serialization.load_pem_public_key, Ed25519PublicKey, hint=hint
    )
    return TrustedKey(key=key, key_id=key_id(key), source=str(path))


def trust_store(explicit: list[Path] | None, *, env: dict[str, str] | None = None) -> list[TrustedKey]:
    """Keys from ``--trusted-key`` plus every ``*.pub`` in ``$CALCTL_TRUSTED_KEYS``."""
    keys: list[TrustedKey] = [load_public(p) for p in explicit or []]
    environ = os.environ if env is None else env
    trust_dir = environ.get(TRUST_DIR_ENV)
    if trust_dir:
        d = Path(trust_dir)
        if not d.is_dir():
            raise UsageError(f"{TRUST_DIR_ENV}={trust_dir}: not a directory of *.pub keys")
        keys.extend(load_public(p) for p in sorted(d.glob("*.pub")))
    unique: dict[str, TrustedKey] = {}
    for k in keys:
        unique.setdefault(k.key_id, k)
    return list(unique.values())
