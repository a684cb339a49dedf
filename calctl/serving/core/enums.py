"""The one enum base of the serving core's hot-path states (000 §2, §6, §9.1, §10)."""

from __future__ import annotations

import enum


class IdentityEnum(enum.Enum):
    """An :class:`enum.Enum` hashed by identity.

    Members are singletons compared by identity; hashing by identity keeps the hot-path
    set/dict lookups in C (Enum's default ``__hash__`` is a Python-level function).
    """

    __hash__ = object.__hash__
