"""Prompts from a local dataset file for ``calctl bench --dataset FILE`` (docs/bench.md "Datasets").

Synthetic token ids overstate a server's speed (no tokenizer work, no real length mix), so ``calctl bench`` can
replay prompts a person hands it, in the layouts ``vllm bench serve`` users already have. The layout is told by
the file's first non-blank character:

* ``[`` – **ShareGPT**: a JSON array of ``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt",
  "value": ...}, ...]}`` (``user``/``assistant`` too). The prompt is the first human turn; the request's
  ``max_tokens`` is the first reply's length in tokens, estimated as characters / 4 (the client has no
  tokenizer; ``--output-len`` overrides it). Entries without a human turn followed by a reply are skipped and
  counted, as vLLM does.
* anything else – **JSONL**, one object a line, each with exactly one of ``"prompt"`` (text, or a list of token
  ids) and ``"messages"`` (a chat: ``[{"role": ..., "content": ...}]``, sent to ``/v1/chat/completions``), and
  optionally ``"max_tokens"`` (alias ``"output_len"``) and ``"timestamp"`` (seconds). When every line has a
  timestamp the file is a **timed trace**: requests are sent at those offsets from the first, not at
  ``--rate``.

Bounded before anything costs: a regular file of at most :data:`MAX_DATASET_BYTES`, at most
:data:`MAX_ENTRIES` entries, every prompt at most :data:`MAX_PROMPT_CHARS` characters. Every JSON value goes
through :mod:`calctl.jsonsafe` (depth 64, digit runs): a JSONL line is scanned and parsed on its own, at most
:data:`MAX_LINE_BYTES` and :data:`MAX_ENTRY_VALUES` values; a ShareGPT array is scanned once in bounded memory
(the array at most :data:`MAX_ENTRIES` elements, any list or object inside at most
:data:`MAX_CONVERSATION_ITEMS` entries) and its elements are then decoded one at a time, each at most :data:`MAX_LINE_BYTES` and
:data:`MAX_ENTRY_VALUES` values, and dropped once its first exchange is taken: memory grows with what is kept
(the prompts), not with the document (``json.loads`` of a 256 MiB array built gigabytes of objects). A bad line
or entry is a usage error (exit 2) naming the file, the line (or entry) and the field or limit. Nothing here
sends a request.
"""

from __future__ import annotations

import itertools
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from calctl import jsonsafe
from calctl.errors import UsageError
from calctl.jsonsafe import window
from calctl.loadgen.workload import LengthDist, PlannedRequest, arrival_times

MAX_DATASET_BYTES = 256 * 1024 * 1024
MAX_ENTRIES = 1_000_000
MAX_PROMPT_CHARS = 1_000_000
MAX_PROMPT_IDS = 1_000_000
MAX_OUTPUT_TOKENS = 1_000_000
#: Largest JSONL line or ShareGPT entry: a prompt of MAX_PROMPT_CHARS characters is at most 4 MiB of UTF-8 (6 MiB
#: written as JSON escapes), and a ShareGPT conversation carries its replies too.
MAX_LINE_BYTES = 16 * 1024 * 1024
#: Values (openings and commas) of one JSONL line or ShareGPT entry: a prompt of MAX_PROMPT_IDS token ids and some.
MAX_ENTRY_VALUES = MAX_PROMPT_IDS + 4096
#: Entries of any list or object inside one ShareGPT conversation (its turns, say): real ones hold a few hundred.
MAX_CONVERSATION_ITEMS = 65536
#: Values of a whole ShareGPT document (its largest possible element count times a conversation's, bounded again by
#: the byte cap: this only ends a scan of pathological structure early).
MAX_DOCUMENT_VALUES = 64 * 1024 * 1024
CHARS_PER_TOKEN = 4  # the reply-length estimate of a ShareGPT entry (OpenAI's rule of thumb for English)


@dataclass(frozen=True)
class DatasetEntry:
    """One request's prompt: text, token ids or a chat (exactly one), and what the file says of its output."""

    text: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    output_len: int | None = None
    timestamp: float | None = None


@dataclass(frozen=True)
class Dataset:
    path: Path
    layout: str  # sharegpt | jsonl | trace
    entries: tuple[DatasetEntry, ...]
    skipped: int = 0

    def document(self) -> dict[str, Any]:
        chats = sum(1 for e in self.entries if e.messages is not None)
        return {
            "path": str(self.path),
            "layout": self.layout,
            "entries": len(self.entries),
            "chats": chats,
            "skipped": self.skipped,
        }


def load_dataset(path: Path) -> Dataset:
    """Read and check ``path`` (see the module docstring); :class:`UsageError` naming the problem."""
    with _open(path) as f:
        opening = _first_byte(f)
        if opening >= 0 and window(f, opening, opening + 1) == b"[":
            entries, skipped = _sharegpt(path, f, opening)
            layout = "sharegpt"
        else:
            entries, skipped = _jsonl(path, f), 0
            layout = "jsonl"
    if layout == "jsonl":
        stamped = sum(1 for e in entries if e.timestamp is not None)
        if 0 < stamped < len(entries):
            raise UsageError(
                f"{path}: {stamped} of {len(entries)} lines have a timestamp: a timed trace needs one on every line"
            )
        layout = "trace" if stamped else "jsonl"
    if not entries:
        raise UsageError(f"{path}: no usable prompt" + (f" ({skipped} entries skipped)" if skipped else ""))
    return Dataset(path, layout, tuple(entries), skipped)


def _open(path: Path) -> BinaryIO:
    """The dataset file opened for reading, after its checks (a regular file of at most MAX_DATASET_BYTES)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UsageError(f"--dataset {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"--dataset {path}: not a regular file (a dataset is a JSON or JSONL file)")
    if st.st_size > MAX_DATASET_BYTES:
        raise UsageError(f"--dataset {path}: {st.st_size} bytes, more than the {MAX_DATASET_BYTES} a dataset may have")
    try:
        return open(path, "rb")  # the caller's with-block closes it
    except OSError as exc:
        raise UsageError(f"--dataset {path}: {exc.strerror or exc}") from None


def _first_byte(f: BinaryIO) -> int:
    """Offset of the file's first non-blank byte, -1 if it has none (read in pieces: never the whole file)."""
    offset = 0
    while piece := f.read(1 << 16):
        stripped = piece.lstrip()
        if stripped:
            return offset + len(piece) - len(stripped)
        offset += len(piece)
        if offset > MAX_DATASET_BYTES:
            break
    return -1


def _loads(path: Path, data: bytes, where: str) -> Any:
    """One line or entry, bounded (:data:`MAX_LINE_BYTES`, :data:`MAX_ENTRY_VALUES`, jsonsafe's depth)."""
    if len(data) > MAX_LINE_BYTES:
        raise UsageError(
            f"{path}: {where} is more than the {MAX_LINE_BYTES:,} bytes a dataset line or entry may have "
            "(calctl.loadgen.dataset.MAX_LINE_BYTES)"
        )
    try:
        return jsonsafe.loads(data, max_values=MAX_ENTRY_VALUES)
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: {where} is not UTF-8 text (byte {exc.start})") from None
    except jsonsafe.JsonRefused as exc:
        raise UsageError(f"{path}: {where}: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"{path}: {where} is not JSON: {exc}") from None


def _lines(f: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """``(number, bytes)`` of each line, read one at a time and at most MAX_LINE_BYTES + 1 bytes of each."""
    f.seek(0)
    n, total = 0, 0
    while line := f.readline(MAX_LINE_BYTES + 1):
        n += 1
        total += len(line)
        if total > MAX_DATASET_BYTES:  # the file grew while being read
            raise UsageError(f"{f.name}: more than the {MAX_DATASET_BYTES} bytes a dataset may have")
        yield n, line.rstrip(b"\n")


def _jsonl(path: Path, f: BinaryIO) -> list[DatasetEntry]:
    out: list[DatasetEntry] = []
    for n, line in _lines(f):
        if not line.strip():
            continue
        if len(out) >= MAX_ENTRIES:
            raise UsageError(f"{path}: more than {MAX_ENTRIES} entries")
        doc = _loads(path, line, f"line {n}")
        if not isinstance(doc, dict):
            raise UsageError(f"{path}: line {n}: expected a JSON object, got {type(doc).__name__}")
        out.append(_entry(path, f"line {n}", doc))
    return out


def _entry(path: Path, where: str, doc: dict[str, Any]) -> DatasetEntry:
    has = [k for k in ("prompt", "messages") if k in doc]
    if len(has) != 1:
        raise UsageError(f"{path}: {where}: expected exactly one of 'prompt' and 'messages', found {has or 'neither'}")
    out_len = doc.get("max_tokens", doc.get("output_len"))
    output = None if out_len is None else _count(path, where, "max_tokens", out_len, MAX_OUTPUT_TOKENS)
    stamp = doc.get("timestamp")
    ts = None
    if stamp is not None:
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp) or stamp < 0:
            raise UsageError(f"{path}: {where}: 'timestamp' must be a finite number of seconds >= 0, got {stamp!r}")
        ts = float(stamp)
    if "messages" in doc:
        return DatasetEntry(messages=_messages(path, where, doc["messages"]), output_len=output, timestamp=ts)
    prompt = doc["prompt"]
    if isinstance(prompt, str):
        return DatasetEntry(text=_text(path, where, "prompt", prompt), output_len=output, timestamp=ts)
    if isinstance(prompt, list):
        if not 1 <= len(prompt) <= MAX_PROMPT_IDS:
            raise UsageError(f"{path}: {where}: 'prompt' holds {len(prompt)} token ids, expected 1 to {MAX_PROMPT_IDS}")
        ids = tuple(_count(path, where, "prompt", t, 2**31 - 1, minimum=0) for t in prompt)
        return DatasetEntry(prompt_ids=ids, output_len=output, timestamp=ts)
    raise UsageError(f"{path}: {where}: 'prompt' must be text or a list of token ids, got {type(prompt).__name__}")


def _messages(path: Path, where: str, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise UsageError(f"{path}: {where}: 'messages' must be a non-empty list of {{role, content}}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise UsageError(f"{path}: {where}: messages[{i}] must be {{'role': text, 'content': text}}")
        role = _text(path, where, f"messages[{i}].role", m["role"])
        out.append((role, _text(path, where, f"messages[{i}].content", m["content"])))
    if sum(len(c) for _, c in out) > MAX_PROMPT_CHARS:
        raise UsageError(f"{path}: {where}: the chat holds more than {MAX_PROMPT_CHARS} characters")
    return tuple(out)


def _text(path: Path, where: str, field: str, value: str) -> str:
    if not value:
        raise UsageError(f"{path}: {where}: '{field}' is empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate written as a JSON escape ("\ud800"): no request could carry it
        raise UsageError(
            f"{path}: {where}: '{field}' holds {value[exc.start]!r} at character {exc.start}, which is not a Unicode "
            "character (a lone surrogate): text must encode as UTF-8"
        ) from None
    if len(value) > MAX_PROMPT_CHARS:
        raise UsageError(f"{path}: {where}: '{field}' holds {len(value)} characters, more than {MAX_PROMPT_CHARS}")
    return value


def _count(path: Path, where: str, field: str, value: Any, maximum: int, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise UsageError(f"{path}: {where}: '{field}' must be an integer from {minimum} to {maximum}, got {value!r}")
    return value


_HUMAN = frozenset({"human", "user"})
_REPLY = frozenset({"gpt", "assistant", "chatgpt", "bard", "bing"})


def _elements(path: Path, f: BinaryIO, opening: int) -> Iterator[tuple[int, bytes]]:
    """The ShareGPT array's elements, one at a time, after one bounded scan of the whole file."""
    try:
        bounds = jsonsafe.array_elements(
            f, opening, lambda offset: MAX_ENTRIES if offset == opening else MAX_CONVERSATION_ITEMS, MAX_DOCUMENT_VALUES
        )
    except jsonsafe.JsonRefused as exc:
        what = str(exc).replace(f"opening at byte {opening:,}", "of the file (its conversations)")
        raise UsageError(
            f"{path}: {what} (calctl.loadgen.dataset: MAX_ENTRIES {MAX_ENTRIES:,} conversations in a file, "
            f"MAX_CONVERSATION_ITEMS {MAX_CONVERSATION_ITEMS:,} entries in a list or object of one)"
        ) from None
    except ValueError as exc:
        raise UsageError(f"{path}: a ShareGPT file is one JSON array of conversations: {exc}") from None
    close = int(bounds[-1])
    if window(f, close + 1, close + 1 + (1 << 16)).strip():  # (then the elements are read from the start)
        raise UsageError(f"{path}: a ShareGPT file is one JSON array of conversations, and nothing after it")
    f.seek(int(bounds[0]) + 1)
    for i in range(len(bounds) - 1):
        start, end = int(bounds[i]) + 1, int(bounds[i + 1])
        if end - start > MAX_LINE_BYTES:  # refused by its size, never read
            raise UsageError(
                f"{path}: entry {i} is {end - start:,} bytes, more than the {MAX_LINE_BYTES:,} a dataset line or "
                "entry may have (calctl.loadgen.dataset.MAX_LINE_BYTES)"
            )
        element = f.read(end - start)  # the elements follow each other: one forward read, no seek
        f.read(1)  # the comma (or the closing bracket)
        if i == len(bounds) - 2 and not element.strip():
            break  # ``[]`` or a trailing comma
        yield i, element


def _sharegpt(path: Path, f: BinaryIO, opening: int) -> tuple[list[DatasetEntry], int]:
    out: list[DatasetEntry] = []
    skipped = 0
    for i, element in _elements(path, f, opening):
        item = _loads(path, element, f"entry {i}")
        pair = _first_exchange(item)
        if pair is None:
            skipped += 1
            continue
        prompt, reply = pair
        _text(path, f"entry {i}", "conversations[].value", prompt)
        if len(prompt) > MAX_PROMPT_CHARS:
            raise UsageError(
                f"{path}: entry {i}: the human turn holds {len(prompt)} characters, more than {MAX_PROMPT_CHARS}"
            )
        estimate = min(MAX_OUTPUT_TOKENS, max(1, round(len(reply) / CHARS_PER_TOKEN)))
        out.append(DatasetEntry(text=prompt, output_len=estimate))
    return out, skipped


def _first_exchange(item: Any) -> tuple[str, str] | None:
    """The first human turn with a non-empty text and the reply right after it; None when there is none."""
    turns = item.get("conversations") if isinstance(item, dict) else None
    if not isinstance(turns, list):
        return None
    for a, b in itertools.pairwise(turns):
        if not (isinstance(a, dict) and isinstance(b, dict)):
            continue
        if a.get("from") in _HUMAN and b.get("from") in _REPLY:
            prompt, reply = a.get("value"), b.get("value")
            if isinstance(prompt, str) and prompt and isinstance(reply, str) and reply:
                return prompt, reply
    return None


def _order(n_entries: int, n: int, rng: np.random.Generator) -> Iterator[int]:
    """``n`` entry indices: a seeded permutation, repeated when more requests than entries are asked."""
    while n > 0:
        perm = rng.permutation(n_entries)
        for i in perm[:n]:
            yield int(i)
        n -= min(n, n_entries)


def dataset_workload(
    ds: Dataset,
    *,
    seed: int,
    stream: int,
    rate: float,
    duration_s: float,
    burstiness: float,
    output: LengthDist | None,
    max_requests: int,
) -> list[PlannedRequest]:
    """The requests of one model in one phase, from ``ds``: a timed trace keeps its own offsets (those within
    ``duration_s``); otherwise arrivals at ``rate`` as :func:`~calctl.loadgen.workload.build_workload`
    draws them, prompts in a seeded order. ``output`` (``--output-len``) overrides the file's lengths; an entry
    without one takes 128."""
    rng = np.random.default_rng([seed, stream, 1])
    if ds.layout == "trace":
        first = min(e.timestamp or 0.0 for e in ds.entries)
        timed = sorted(((e.timestamp or 0.0) - first, i) for i, e in enumerate(ds.entries))
        picks = [(t, i) for t, i in timed if t < duration_s][:max_requests]
    else:
        times = arrival_times(rate, duration_s, burstiness, rng, max_requests)
        picks = list(zip((float(t) for t in times), _order(len(ds.entries), len(times), rng), strict=False))
    drawn = output.sample(rng, len(picks)) if output is not None else None
    out = []
    for k, (t, i) in enumerate(picks):
        e = ds.entries[i]
        max_tokens = int(drawn[k]) if drawn is not None else (e.output_len or 128)
        out.append(PlannedRequest(t, e.prompt_ids or (), max_tokens, text=e.text, messages=e.messages))
    return out


__all__ = ["MAX_DATASET_BYTES", "MAX_ENTRIES", "Dataset", "DatasetEntry", "dataset_workload", "load_dataset"]
