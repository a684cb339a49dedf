"""Hardened YAML loading for manifests and configs.

PyYAML's safe loader plus the refusals a signed-package reader needs:
documents of more than :data:`MAX_NODES` nodes or taking more than
:data:`MAX_PARSE_SECONDS` of the parsing thread's CPU time (a byte limit alone does not bound the work: a 4 MiB
flow list is 2 million nodes), documents over a size limit (read no further than the limit, and only from a
regular file: a FIFO never blocks the reader), anchors/aliases (an "alias bomb"
expands exponentially), duplicate mapping keys (YAML lets the last one win
silently, so two readers could disagree about one manifest), integers of more
than :data:`MAX_INT_DIGITS` digits (Python refuses to convert ints of thousands
of digits to text, so such a value would crash whatever prints it), and
numbers YAML 1.1 reads other than they look (``010`` is octal 8, ``2:10`` base-60
130; hex ``0x10`` stays 16), and
non-finite floats (``.nan``, ``.inf``, or ``1e999`` which overflows to inf): no
number in a manifest or config is meant to be one, and NaN compares false to
every bound a schema or a tolerance check applies.

This module parses; it does not know any schema.
"""

from __future__ import annotations

import math
import os
import stat
import time
from pathlib import Path
from typing import Any

import yaml

from calctl import jsonsafe
from calctl.errors import ConfigError, PackageFormatError
from calctl.signing.files import NotReadable, read_regular

#: Manifests and configs are small; anything bigger is refused before parsing.
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
#: Longest integer literal accepted (digits, without sign, prefix or '_'): 2**64 has 20, 0x-hex 16.
MAX_INT_DIGITS = 40


#: Most nodes (scalars, sequences, mappings) one document may hold: the sample manifest has ~1,700, a dense
#: 400B model's ~10,000; a 4 MiB flow list ``[1,1,1,...]`` has 2 million (it took 272 s and 1.4 GB to parse).
MAX_NODES = 50_000
#: CPU time of the parsing thread one document may take, checked at every node. The thread's own CPU time, not
#: the wall clock: a manifest's verdict must not change with the host's load (beside 8 CPU burners and a test suite
#: the 11 ms parse of the sample manifest once took longer than 10 s of wall clock, and the package "failed").
MAX_PARSE_SECONDS = 10.0
#: Deepest nesting of sequences/mappings, the JSON documents' figure (``jsonsafe.MAX_DEPTH``): counted on libyaml's
#: events, before the Python composer recurses once a level (issue 54: one bound for every reader).
MAX_DEPTH = jsonsafe.MAX_DEPTH

try:  # libyaml's scanner and parser (C); the composer and constructor below stay Python, so the limits apply
    _Parser: Any = yaml._yaml.CParser
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _Parser = None


if _Parser is not None:

    class _Base(_Parser, yaml.composer.Composer, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        """libyaml's events composed in Python: nodes are counted one by one as they are built."""

        def __init__(self, stream: str | bytes) -> None:
            _Parser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

        get_single_node = yaml.composer.Composer.get_single_node
        compose_document = yaml.composer.Composer.compose_document
        check_node = yaml.composer.Composer.check_node
        get_node = yaml.composer.Composer.get_node

else:  # pragma: no cover
    _Base = yaml.SafeLoader  # type: ignore[misc]


class _StrictLoader(_Base):
    """A safe loader that rejects aliases and duplicate keys and bounds the nodes and the time it spends."""

    nodes = 0
    deadline = 0.0
    source = ""

    def _count_node(self, mark: Any) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise yaml.constructor.ConstructorError(
                None, None, f"more than {MAX_NODES} YAML nodes (a manifest or config is far smaller)", mark
            )
        if time.thread_time() > self.deadline:
            raise yaml.constructor.ConstructorError(
                None, None, f"parsing took more than the {MAX_PARSE_SECONDS:g} s of CPU time it may", mark
            )

    def compose_node(self, parent, index):
        self._count_node(self.peek_event().start_mark)
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(
                None, None, f"YAML alias *{event.anchor} is not allowed (anchors/aliases are refused)", event.start_mark
            )
        event = self.peek_event()
        if getattr(event, "anchor", None) is not None:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"YAML anchor &{event.anchor} is not allowed (anchors/aliases are refused)",
                event.start_mark,
            )
        return yaml.composer.Composer.compose_node(self, parent, index)

    def construct_yaml_int(self, node):
        text = str(node.value).replace("_", "").lstrip("+-")
        _refuse_ambiguous_number(node)
        if len(text) > 1 and text[0] == "0" and text[1].isdigit():
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"integer {node.value!r} has a leading zero: YAML 1.1 reads it as octal "
                f"{super().construct_yaml_int(node)}, YAML 1.2 as decimal; write it without the zero (or quote it)",
                node.start_mark,
            )
        if text[:2].lower() == "0b":  # 0x is an integer to YAML 1.1 and 1.2 alike; 0b to YAML 1.1 only
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"integer {node.value!r} is YAML 1.1 binary: PyYAML reads it as {super().construct_yaml_int(node)}, "
                "YAML 1.2 as a string; write the decimal value (or quote it)",
                node.start_mark,
            )
        digits = len(text[2:] if text[:2].lower() in ("0x", "0o", "0b") else text)
        if digits > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {digits} digits (at most {MAX_INT_DIGITS} are accepted)", node.start_mark
            )
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node):
        _refuse_ambiguous_number(node)
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise yaml.constructor.ConstructorError(
                None, None, f"non-finite number {node.value!r} is refused (numbers must be finite)", node.start_mark
            )
        return value

    def construct_mapping(self, node, deep=False):
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hashable = key in seen
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "mapping key is not a scalar", key_node.start_mark
                ) from None
            if hashable:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _refuse_ambiguous_number(node: Any) -> None:
    """YAML 1.1's base-60 numbers (``2:10`` is 130 to PyYAML) and digit separators (``3_84`` is 384): both are
    strings to YAML 1.2 readers, so another reader of the signed manifest would see another value."""
    if "_" in str(node.value):
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"{node.value!r} uses YAML 1.1 digit separators: PyYAML reads it as a number, YAML 1.2 as a string; "
            "write the digits alone (or quote it)",
            node.start_mark,
        )
    if ":" in str(node.value):
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"{node.value!r} is a YAML 1.1 base-60 number, not what it looks like: write the value or quote it",
            node.start_mark,
        )


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)


def loads(text: str | bytes, *, source: str) -> Any:
    """Parse one YAML document strictly; errors name ``source`` and the line."""
    try:
        deadline = time.thread_time() + MAX_PARSE_SECONDS
        _count_nodes(text, deadline)
        loader = _StrictLoader(text)
        loader.deadline = deadline
        try:
            # Anchors alone are harmless, but there is no reason for them in a manifest
            # and refusing them keeps the rule simple to state.
            return _construct(loader)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = exc.problem or exc.context or "invalid YAML"
        raise PackageFormatError(f"malformed YAML at {where}: {problem}", path=source) from None
    except yaml.YAMLError as exc:
        raise PackageFormatError(f"malformed YAML: {exc}", path=source) from None
    except RecursionError:
        raise PackageFormatError("YAML nesting too deep", path=source) from None


_NODE_EVENTS = (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent, yaml.AliasEvent)
_OPEN_EVENTS = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE_EVENTS = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _count_nodes(text: str | bytes, deadline: float) -> None:
    """Count the document's nodes on libyaml's events alone, before any Python node is built.

    Events cost a few microseconds each in C; building and resolving nodes in Python costs ten times that and
    keeps them all in memory. So a 2-million-node flow list is refused after the first :data:`MAX_NODES`
    events, well under a second. (The composer counts again, for the pure-Python fallback.)
    """
    if _Parser is None:  # pragma: no cover
        return
    parser = _Parser(text)
    try:
        n = depth = 0
        while True:
            event = parser.get_event()
            if event is None:
                return
            if isinstance(event, _OPEN_EVENTS):
                depth += 1
                if depth > MAX_DEPTH:
                    why = f"nested more than {MAX_DEPTH} levels deep (the limit for a manifest or config)"
                    raise yaml.constructor.ConstructorError(None, None, why, event.start_mark)
            elif isinstance(event, _CLOSE_EVENTS):
                depth -= 1
            if isinstance(event, _NODE_EVENTS):
                n += 1
                if n > MAX_NODES or (n % 1024 == 0 and time.thread_time() > deadline):
                    why = (
                        f"more than {MAX_NODES} YAML nodes (a manifest or config is far smaller)"
                        if n > MAX_NODES
                        else f"parsing took more than the {MAX_PARSE_SECONDS:g} s of CPU time it may"
                    )
                    raise yaml.constructor.ConstructorError(None, None, why, event.start_mark)
    finally:
        parser.dispose()


def _construct(loader: _StrictLoader) -> Any:
    node = loader.get_single_node()
    if node is None:
        return None
    return loader.construct_document(node)


def read_document(path: Path, name: str, max_bytes: int, kind: str, *, limit_note: str = "") -> bytes:
    """The bytes of the ``kind`` ("JSON", "YAML") document at ``path``, a regular file of at most ``max_bytes``;
    else a PackageFormatError naming it ``name`` and saying why (missing, too large, not a regular file)."""
    try:
        return read_regular(path, max_bytes)
    except NotReadable as exc:
        if exc.missing:
            raise PackageFormatError("file not found", path=name) from None
        if "byte limit" in exc.reason:
            raise PackageFormatError(f"larger than the {max_bytes} byte limit{limit_note}", path=name) from None
        raise PackageFormatError(f"{exc.reason}, expected a {kind} file", path=name) from None


def load_file(path: Path, *, display: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Read and parse ``path`` with a size limit checked before reading it all."""
    name = display or str(path)
    data = read_document(path, name, max_bytes, "YAML", limit_note=" for YAML documents")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PackageFormatError(f"not UTF-8 (byte {exc.start})", path=name) from None
    return loads(text, source=name)


def load_config(path: Path, *, name: str, what: str, max_bytes: int, hint: str) -> Any:
    """A user's YAML file given on the command line (a fault plan, a board profile, a targets file): a regular
    file of at most ``max_bytes``, read with this module's strict loader; else ConfigError (exit 2) that names
    it ``name`` (``--targets PATH``) and says what it is (``what``: "the targets file"), with ``hint``."""
    try:  # O_NONBLOCK: a FIFO given as the file is refused, not waited on for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {what}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{name}: {what} is not a regular file")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ConfigError(f"{name}: {what} is larger than {max_bytes} bytes")
    # No inf/nan, no 1_000, 2:10 or 010 that PyYAML reads as another number, no duplicate keys or anchors; the
    # errors name the file and the line.
    try:
        return loads(data, source=str(path))
    except PackageFormatError as exc:
        raise ConfigError(str(exc), hint=hint) from None
