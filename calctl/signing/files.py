"""The names of the seal files a package carries (coreutils checksums + detached signature)."""

from __future__ import annotations

CHECKSUMS = "checksums.sha256"
SIGNATURE = "checksums.sha256.sig"
#: Files whose digest is not in checksums.sha256 (the seal itself).
SEAL_FILES = frozenset({CHECKSUMS, SIGNATURE})

__all__ = ["CHECKSUMS", "SEAL_FILES", "SIGNATURE"]
