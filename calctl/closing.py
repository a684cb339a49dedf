"""``with`` for an object that has a ``close()``: :class:`Closes`."""

from __future__ import annotations

from typing import TypeVar

_C = TypeVar("_C", bound="Closes")


class Closes:
    """A context manager that is itself: ``with x:`` gives ``x`` and calls ``x.close()`` on every way out."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
