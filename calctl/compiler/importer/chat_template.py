"""Render a checkpoint's chat template at import with its cost bounded.

A chat template is code a checkpoint declares (``tokenizer.chat_template`` in a
GGUF, ``chat_template`` in ``tokenizer_config.json`` or ``chat_template.jinja``).
jinja2's sandbox stops attribute tricks and caps one ``range`` at 100,000, but
not two nested ones: ``{% for i in range(99999) %}{% for j in range(99999) %}``
ran for hours at import, and ``{{ 'x' * 10**9 }}`` allocates a gigabyte
(issue 54). :func:`render_bounded` renders with

* at most :data:`MAX_TEMPLATE_STEPS` template lines executed (counted by a trace
  function on the template's own frames only; a real template runs a few hundred);
* ``*`` and ``**`` on strings, lists and numbers refused past
  :data:`MAX_RENDERED_CHARS` characters or items, or an exponent over 64 bits;

and raises :class:`TemplateTooCostly` otherwise. This module renders; it does
not decide what a refusal means for the import.
"""

from __future__ import annotations

import operator
import sys
from types import FrameType
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

#: Template lines one rendering may execute.
MAX_TEMPLATE_STEPS = 1_000_000
#: Characters (or list items) one ``*`` may produce; a rendered prompt of one message is a few hundred.
MAX_RENDERED_CHARS = 1 << 20


class TemplateTooCostly(TemplateError):
    """The template crossed one of this module's bounds while rendering."""


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(n, int) and len(seq) * n > MAX_RENDERED_CHARS:
                    raise TemplateTooCostly(
                        f"'*' would make {len(seq) * n:,} characters or items (at most {MAX_RENDERED_CHARS:,})"
                    )
            return operator.mul(left, right)
        if isinstance(right, int) and abs(right) > 64 and isinstance(left, int) and abs(left) > 1:
            raise TemplateTooCostly(f"'**' with an exponent of {right} (at most 64)")
        return operator.pow(left, right)


def render_bounded(template: str, **context: Any) -> str:
    """``template`` rendered with ``context`` in jinja2's immutable sandbox, within this module's bounds."""
    steps = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal steps
        if event == "line":
            steps += 1
            if steps > MAX_TEMPLATE_STEPS:
                raise TemplateTooCostly(f"the template ran more than {MAX_TEMPLATE_STEPS:,} steps for one message")
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == "<template>" else None

    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    compiled = env.from_string(template)
    before = sys.gettrace()
    sys.settrace(calls)
    try:
        return compiled.render(**context)
    finally:
        sys.settrace(before)
