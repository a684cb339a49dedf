"""Render a chat template with its cost bounded: at import, at validate and for every request ``serve`` answers.

A chat template is code a checkpoint or package declares (``tokenizer.chat_template`` in a GGUF,
``chat_template`` in ``tokenizer_config.json`` or ``chat_template.jinja``). jinja2's sandbox stops attribute
tricks and caps one ``range`` at 100,000, but not two nested ones:
``{% for i in range(99999) %}{% for j in range(99999) %}`` ran for hours at import, and ``{{ 'x' * 10**9 }}``
allocates a gigabyte (issue 54). :class:`BoundedTemplate` renders in jinja2's immutable sandbox with

* at most :data:`MAX_TEMPLATE_STEPS` template lines executed per rendering (counted by a trace function on the
  template's own frames only; a real template runs a few hundred for a short chat);
* every string or list the template makes (``*``, ``+``, ``%``, ``~``, a filter, a method call) and the rendered
  text itself within a budget of :data:`MAX_RENDERED_CHARS` plus four times the characters of the context it
  was given (a long conversation renders a long prompt; a template cannot multiply it); a number argument over
  that budget (``'x'.center(10**9)``, ``'{:>999999999}'.format(x)``) and ``**`` exponents over 64 are refused
  before the call;
* everything those operations make or are handed, in all, within :data:`WORK_FACTOR` budgets (a list grown by
  ``+`` in a loop of 99,999 steps copied 5e9 items within the step bound); no ``lipsum``; a macro recursing
  without end is a refusal, not a RecursionError;

and raises :class:`TemplateTooCostly` otherwise. :func:`probe` renders the conversations ``validate`` (TOK005)
tries. This module renders; it does not decide what a refusal means (exit 2 at import, a finding at validate,
a 400 for one request at serve).
"""

from __future__ import annotations

import functools
import operator
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from types import FrameType
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

#: Template lines one rendering may execute.
MAX_TEMPLATE_STEPS = 1_000_000
#: Characters (or list items) a template may make beyond four times what it was given; a rendered prompt of one
#: message is a few hundred.
MAX_RENDERED_CHARS = 1 << 20
#: Context size multiplier in the budget (a template that repeats each message once or twice is real).
_CONTEXT_FACTOR = 4
#: Characters and items all the operations of one rendering may make or be handed, in multiples of the budget:
#: a list grown by ``+`` in a loop of 99,999 steps copied 5e9 items (51 s) within the step bound.
WORK_FACTOR = 64
#: A width or precision of a million or more in a ``%`` or ``str.format`` format string.
_WIDTH = re.compile(r"%[-+ #0]*\.?[0-9]{7,}|:[^{}]*?[0-9]{7,}[^{}]*\}")


class TemplateTooCostly(TemplateError):
    """The template crossed one of this module's bounds while rendering."""


def _size(value: object) -> int:
    return len(value) if isinstance(value, str | list | tuple | dict | range) else 0


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.budget = threading.local()  # the current rendering's budgets, per rendering thread
        self.filters = {name: self._bounded(f) for name, f in self.filters.items()}
        self.globals.pop("lipsum", None)  # 99,999 paragraphs of lorem ipsum took a minute in one call

    def limit(self) -> int:
        return int(getattr(self.budget, "chars", MAX_RENDERED_CHARS))

    def start(self, limit: int) -> None:
        self.budget.chars = limit
        self.budget.work = 0

    def charge(self, n: int, what: str) -> None:
        """Count ``n`` characters or items made or handed over against the rendering's work budget."""
        work = int(getattr(self.budget, "work", 0)) + n
        self.budget.work = work
        if work > WORK_FACTOR * self.limit():
            raise TemplateTooCostly(
                f"{what}: the template made or handled more than {WORK_FACTOR * self.limit():,} characters or "
                "items in all (a loop copying a growing string or list)"
            )

    def check(self, value: object, what: str) -> Any:
        if _size(value) > self.limit():
            raise TemplateTooCostly(f"{what} made {_size(value):,} characters or items (at most {self.limit():,})")
        self.charge(_size(value), what)
        return value

    def _check_args(self, args: Iterable[Any], what: str) -> None:
        for a in args:
            self.charge(_size(a), what)
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > self.limit():
                raise TemplateTooCostly(f"{what} was given {a:,} (at most {self.limit():,})")

    def _bounded(self, f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)  # keeps jinja's pass_context/pass_environment marks
        def run(*args: Any, **kwargs: Any) -> Any:
            if f.__name__ == "do_format" and any(isinstance(a, str) and _WIDTH.search(a) for a in args):
                raise TemplateTooCostly("a filter (format) was given a width of a million or more")
            self._check_args([*args, *kwargs.values()], f"a filter ({getattr(f, '__name__', 'filter')})")
            return self.check(f(*args, **kwargs), f"a filter ({getattr(f, '__name__', 'filter')})")

        return run

    def call(self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(__obj, "__name__", "a call")
        self._check_args([*args, *kwargs.values()], f"{name}()")
        owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)  # str.format arrives wrapped
        if isinstance(owner, str) and name == "format" and _WIDTH.search(owner):
            raise TemplateTooCostly("format() with a width of a million or more")
        if isinstance(owner, str) and name == "replace" and args:
            old, new = str(args[0]), str(args[1]) if len(args) > 1 else ""
            made = len(owner) + (owner.count(old) if old else len(owner) + 1) * len(new)
            if made > self.limit():
                raise TemplateTooCostly(f"replace() would make {made:,} characters (at most {self.limit():,})")
        return self.check(super().call(__context, __obj, *args, **kwargs), f"{name}()")

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        limit = self.limit()
        if operator_name == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(n, int) and len(seq) * n > limit:
                    raise TemplateTooCostly(f"'*' would make {len(seq) * n:,} characters or items (at most {limit:,})")
            return self.check(operator.mul(left, right), "'*'")
        if operator_name == "**":
            if isinstance(right, int) and abs(right) > 64 and isinstance(left, int) and abs(left) > 1:
                raise TemplateTooCostly(f"'**' with an exponent of {right} (at most 64)")
            return operator.pow(left, right)
        if operator_name == "%" and isinstance(left, str) and _WIDTH.search(left):
            raise TemplateTooCostly("'%' with a width of a million or more")
        if operator_name == "+" and _size(left) + _size(right) > limit:
            raise TemplateTooCostly(f"'+' would make {_size(left) + _size(right):,} characters (at most {limit:,})")
        return self.check(super().call_binop(context, operator_name, left, right), f"'{operator_name}'")


def _context_chars(value: object, depth: int = 0) -> int:
    """Characters of the strings in a rendering's context (messages are lists of dicts of strings)."""
    if isinstance(value, str):
        return len(value)
    if depth > 8:
        return 0
    if isinstance(value, Mapping):
        return sum(_context_chars(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_context_chars(v, depth + 1) for v in value)
    return 0


class BoundedTemplate:
    """A chat template compiled once in the bounded sandbox; :meth:`render` may run in many threads at once."""

    def __init__(self, source: str, *, keep_trailing_newline: bool = True, **globals: Any) -> None:
        self.env = _BoundedEnvironment(
            trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=keep_trailing_newline
        )
        self.env.globals.update(globals)
        self.template = self.env.from_string(source)  # TemplateSyntaxError (a TemplateError) if it does not compile
        env = self.env

        def str_join(seq: Iterable[Any]) -> str:  # ``a ~ b``: the parts measured before they are joined
            parts = [str(x) for x in seq]
            total = sum(map(len, parts))
            if total > env.limit():
                raise TemplateTooCostly(f"'~' would make {total:,} characters (at most {env.limit():,})")
            env.charge(total, "'~'")
            return "".join(parts)

        self.template.root_render_func.__globals__["str_join"] = str_join

    def render(self, **context: Any) -> str:
        """The template over ``context``, within this module's bounds; :class:`TemplateTooCostly` otherwise."""
        limit = MAX_RENDERED_CHARS + _CONTEXT_FACTOR * _context_chars(context)
        self.env.start(limit)
        steps = 0

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            nonlocal steps
            if event == "line":
                steps += 1
                if steps > MAX_TEMPLATE_STEPS:
                    raise TemplateTooCostly(f"the template ran more than {MAX_TEMPLATE_STEPS:,} steps")
            return local

        def calls(frame: FrameType, event: str, arg: Any) -> Any:
            return local if frame.f_code.co_filename == "<template>" else None

        before = sys.gettrace()
        sys.settrace(calls)
        try:
            out: list[str] = []
            total = 0
            for piece in self.template.generate(**context):
                total += len(piece)
                if total > limit:
                    raise TemplateTooCostly(f"the rendered text passed {limit:,} characters")
                out.append(piece)
            return "".join(out)
        except (RecursionError, MemoryError) as exc:  # a macro calling itself, say: a cost, not a crash
            raise TemplateTooCostly(f"the template ran out of {type(exc).__name__[:-5].lower()}") from None
        finally:
            sys.settrace(before)


def render_bounded(template: str, **context: Any) -> str:
    """``template`` compiled and rendered once with ``context`` (names the template calls, such as
    ``raise_exception``, included), within this module's bounds."""
    return BoundedTemplate(template).render(**context)


#: The conversations ``validate`` renders: one user message (what ``import`` renders for golden), then a short
#: chat with a system prompt.
PROBES: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "user", "content": "Hello"},),
    (
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "What is 2 + 2?"},
    ),
)


def probe(source: str, bos_token: str = "", eos_token: str = "") -> str | None:
    """Why ``source`` cannot be served (it does not compile, or one of :data:`PROBES` crosses a bound), else None.
    A template that refuses a probe's messages (``raise_exception``) or fails on them otherwise is not a cost
    problem: None."""

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    try:
        template = BoundedTemplate(source, raise_exception=raise_exception)
    except TemplateError as exc:
        return f"does not compile: {str(exc)[:200]}"
    for messages in PROBES:
        try:
            template.render(
                messages=list(messages), add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token
            )
        except TemplateTooCostly as exc:
            return f"is too costly to render {len(messages)} message(s): {exc}"
        except Exception:  # jinja raises many types for a template the probe's messages break
            continue
    return None
