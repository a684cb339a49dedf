"""Errors of the serving core.

Two kinds only, as in vLLM v1: "no room" is never an exception (the KV manager
returns ``None``, admission returns a result), so everything raised here is a
bug in the caller or in the core itself. :class:`InvariantViolation` is not a
:class:`calctl.errors.CalctlError`: there is no exit code for a broken
invariant, it must surface as a traceback in tests and logs.

:class:`ProfileRefused` is the exception to that rule: a batch profile whose
contract is unusable is a start-up configuration error (000 §7.3, §15), so it
is a :class:`calctl.errors.ConfigError`.

This module does not log or recover from anything.
"""

from __future__ import annotations

from calctl.errors import ConfigError


class InvariantViolation(RuntimeError):
    """A serving-core invariant (000 §4, §9.2) was broken, or an operation was illegal in the current state."""


class IllegalTransition(InvariantViolation):
    """A request state transition not allowed by the 000 §2/§4 state machine."""


class ProfileRefused(ConfigError):
    """A batch profile cannot be used (000 §7.3: B>1 without an inactive-lane mask contract; §8: undeclared)."""
