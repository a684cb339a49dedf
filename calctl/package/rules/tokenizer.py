"""Tokenizer rules (TOK): one verified tokenizer per alias, agreeing with its model.

Tokenizers load with ``tokenizers.Tokenizer.from_buffer`` only after their hash
verified. A chat template is checked for cost only (TOK005): what it renders, and sampling configuration, belong
to serving.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from calctl import jsonsafe
from calctl.package import tokenizer_file
from calctl.package.model import Model, Package
from calctl.package.rules.base import Finding, PackageRule, Rule
from calctl.package.rules.context import MAX_TOKENIZER_BYTES, ReadProblem, ValidationContext
from calctl.package.tokenizer_ids import (
    added_id_problems,
    decoder_id_problems,
    ids_outside,
    token_text,
    unknown_special_tokens,
    vocabulary_problems,
)

MAX_CONFIG_BYTES = 4 * 1024 * 1024


def _loaded(ctx: ValidationContext, m: Model) -> tuple[Any, str | None]:
    reason = ctx.content_gate(m.tokenizer.file)
    if reason:
        return None, f"tokenizer checks skipped: {reason}"
    tok = ctx.tokenizer(m.tokenizer.file)
    if isinstance(tok, str):
        return None, "skipped: TOK001 failed for this file"
    return tok, None


class TokenizerLoads(PackageRule):
    """Each model's tokenizer is listed in checksums.sha256 and loads with tokenizers.Tokenizer.from_buffer.

    Every model carries its own tokenizer (001 §6.1; Phase 3: A and B each have their tokenizer), bound to the package
    by its hash (§13.1: alias and tokenizer/hash match one to one). The tokenizer.json must be listed in
    checksums.sha256 and load with the Hugging Face tokenizers library; the optional tokenizer_config.json must be a
    JSON object.
    """

    id = "TOK001"
    sections = ("001 §6.1", "001 §13.1", "001 §12 Phase 3 item 1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        listed = ctx.checksums.listed
        n = 0
        for m in ctx.pkg.models:
            field = f"{m.pointer}/tokenizer"
            for rel, what in ((m.tokenizer.file, "file"), (m.tokenizer.config, "config")):
                if rel is not None and listed is not None and rel not in listed and ctx.entry(rel) is not None:
                    yield self.problem(
                        f"tokenizer {what} is not bound by checksums.sha256", file=rel, field=f"{field}/{what}"
                    )
            reason = ctx.content_gate(m.tokenizer.file)
            if reason:
                yield self.skip(f"tokenizer checks skipped: {reason}", file=m.tokenizer.file, field=f"{field}/file")
            else:
                n += 1
                tok = ctx.tokenizer(m.tokenizer.file)
                if isinstance(tok, str):
                    yield self.problem(
                        f"does not load with tokenizers.Tokenizer.from_buffer: {tok}",
                        file=m.tokenizer.file,
                        field=f"{field}/file",
                    )
            if m.tokenizer.config is not None:
                yield from self._config(ctx, m.tokenizer.config, f"{field}/config")
        yield self.note(f"{n} tokenizers load")

    def _config(self, ctx: ValidationContext, rel: str, field: str) -> Iterator[Finding]:
        doc, gated = _verified_config(ctx, rel)
        if gated:
            yield self.skip(gated, file=rel, field=field)
        elif isinstance(doc, str):
            yield self.problem(doc, file=rel, field=field)


def _verified_config(ctx: ValidationContext, rel: str) -> tuple[dict[str, Any] | str | None, str | None]:
    """(the tokenizer config's object or why it is not one, None) once its hash verified; (None, the skip) before."""
    reason = ctx.content_gate(rel)
    if reason:
        return None, f"tokenizer config checks skipped: {reason}"
    return _config_doc(ctx, rel), None


def _config_doc(ctx: ValidationContext, rel: str) -> dict[str, Any] | str:
    try:
        raw = ctx.read_bytes(rel, MAX_CONFIG_BYTES)
        doc = jsonsafe.loads(raw)
    except ReadProblem as exc:
        return str(exc)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError, an integer of 5000 digits
        return f"not valid JSON: {str(exc)[:200]}"
    if not isinstance(doc, dict):
        return f"top level is {type(doc).__name__}, expected an object"
    return doc


class TokenizerVocab(PackageRule):
    """The tokenizer's vocabulary size equals the manifest's and fits the model's vocab_size.

    tokenizer.vocab_size in the manifest is what the loaded tokenizer reports, and it is at most architecture.vocab_size
    (the embedding may be padded, never smaller: a token id beyond it indexes outside the weights). A tokenizer of
    another model almost always differs here (001 §13.1).
    """

    id = "TOK002"
    sections = ("001 §13.1", "001 §6.1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        for m in ctx.pkg.models:
            field = f"{m.pointer}/tokenizer/vocab_size"
            if m.tokenizer.vocab_size > m.architecture.vocab_size:
                yield self.manifest_problem(
                    f"tokenizer of {m.alias!r} has more entries than the model's vocabulary",
                    field=field,
                    expected=f"<= {m.architecture.vocab_size}",
                    found=m.tokenizer.vocab_size,
                )
            tok, reason = _loaded(ctx, m)
            if tok is None:
                yield self.skip(str(reason), file=m.tokenizer.file, field=field)
                continue
            size = tok.get_vocab_size(with_added_tokens=True)
            if size != m.tokenizer.vocab_size:
                yield self.problem(
                    f"tokenizer of {m.alias!r} has a different vocabulary size than the manifest says",
                    file=m.tokenizer.file,
                    field=field,
                    expected=m.tokenizer.vocab_size,
                    found=size,
                )
            yield from self._ids_by_value(m, tok, field)
            yield from self._added_token_ids(ctx, m, tok)
            yield from self._config_ids(ctx, m, tok)
        yield self.note(
            "tokenizer vocabularies and every id they can produce agree with the manifest and model configs"
        )

    def _ids_by_value(self, m: Model, tok: Any, field: str) -> Iterator[Finding]:
        """Every id the tokenizer can produce is below both vocab sizes (issue 54: a count let id 1,000,000 pass),
        each id has one token, none is left without one, and the model's unk_token is in the vocabulary."""
        for problem in vocabulary_problems(tok):
            yield self.problem(
                f"tokenizer of {m.alias!r}: {problem}",
                file=m.tokenizer.file,
                field="model.vocab",
                expected="ids 0..n-1, one token each; unk_token in the vocabulary",
                found=problem.split(";")[0],
            )
        bound = min(m.tokenizer.vocab_size, m.architecture.vocab_size)
        outside, named = ids_outside(tok, bound)
        if outside:
            yield self.problem(
                f"tokenizer of {m.alias!r} can produce {outside} token id(s) outside the model's vocabulary: "
                + ", ".join(named),
                file=m.tokenizer.file,
                field=field,
                expected=f"every id < {bound} (tokenizer.vocab_size and architecture.vocab_size)",
                found=named[0].split(" ")[1],
            )

    def _added_token_ids(self, ctx: ValidationContext, m: Model, tok: Any) -> Iterator[Finding]:
        """tokenizer.json's own ``added_tokens`` ids by value: the library assigns its own ids, so an id the file
        declares that differs is read differently by every other tool (issue 54)."""
        try:
            declared = tokenizer_file.declared_added_tokens(ctx.read_bytes(m.tokenizer.file, MAX_TOKENIZER_BYTES))
        except ReadProblem:
            return  # it loaded a moment ago; TOK001 reports a file that changed under the validator
        problems = list(added_id_problems(declared or [], tok))
        for where, problem in problems[:20]:
            yield self.problem(
                f"tokenizer of {m.alias!r}: {where}: {problem}"
                + (f" ({len(problems)} entries in all)" if len(problems) > 20 else ""),
                file=m.tokenizer.file,
                field=f"{m.pointer}/tokenizer/file",
                expected="each added token's id the id the loaded tokenizer gives it",
                found=where,
            )

    def _config_ids(self, ctx: ValidationContext, m: Model, tok: Any) -> Iterator[Finding]:
        """The ids tokenizer_config.json declares (``added_tokens_decoder``) by value too: transformers adds them
        as declared, so an id past the vocabulary is a token id the weights do not have (issue 54)."""
        rel = m.tokenizer.config
        if rel is None:
            return
        doc, gated = _verified_config(ctx, rel)
        if gated or not isinstance(doc, dict):
            return  # TOK001 says why
        bound = min(m.tokenizer.vocab_size, m.architecture.vocab_size)
        for where, problem in decoder_id_problems(doc, tok, bound):
            yield self.problem(
                f"tokenizer config of {m.alias!r}: {where}: {problem}",
                file=rel,
                field=f"{m.pointer}/tokenizer/config",
                expected=f"ids < {bound}, each the id tokenizer.json gives its token",
                found=where,
            )


def _shared_ok(pkg: Package, a: Model, b: Model) -> bool:
    """A replica package may let its copies share one tokenizer when the architectures are identical."""
    return pkg.kind == "replica" and a.architecture == b.architecture


class OneTokenizerPerAlias(PackageRule):
    """Each alias has its own tokenizer under tokenizer/<alias>/; sharing only between identical replicas.

    alias and tokenizer must match one to one, and a mismatch fails at start-up (001 §13.1). The directory contract puts
    each model's tokenizer under tokenizer/<alias>/ (§6.3). A model whose tokenizer sits in another alias's directory,
    or two aliases sharing one tokenizer file, fail, except in a replica package whose copies have identical
    architectures (Phase 2: same tokenizer and weights on both chips).
    """

    id = "TOK003"
    sections = ("001 §13.1", "001 §6.3", "001 §12 Phase 2 item 1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        pkg = ctx.pkg
        models = {m.alias: m for m in pkg.models}
        users: dict[str, list[Model]] = {}
        for m in pkg.models:
            users.setdefault(m.tokenizer.file, []).append(m)
        for m in pkg.models:
            field = f"{m.pointer}/tokenizer/file"
            parts = PurePosixPath(m.tokenizer.file).parts
            owner = parts[1] if len(parts) >= 3 and parts[0] == "tokenizer" else None
            sharers = users[m.tokenizer.file]
            if len(sharers) > 1 and all(_shared_ok(pkg, sharers[0], o) for o in sharers[1:]):
                # Identical replicas may share one tokenizer, anywhere under tokenizer/.
                if not parts or parts[0] != "tokenizer":
                    yield self.manifest_problem(
                        f"shared tokenizer of {m.alias!r} is not under tokenizer/",
                        field=field,
                        expected="tokenizer/...",
                        found=m.tokenizer.file,
                    )
                continue
            if owner != m.alias:
                other = models.get(owner or "")
                if other is not None:
                    yield self.manifest_problem(
                        f"model {m.alias!r} uses the tokenizer of model {owner!r}",
                        field=field,
                        expected=f"tokenizer/{m.alias}/...",
                        found=m.tokenizer.file,
                    )
                else:
                    yield self.manifest_problem(
                        f"tokenizer of {m.alias!r} is not under tokenizer/{m.alias}/",
                        field=field,
                        expected=f"tokenizer/{m.alias}/...",
                        found=m.tokenizer.file,
                    )
        for rel, ms in users.items():
            for other in ms[1:]:
                if not _shared_ok(pkg, ms[0], other):
                    yield self.manifest_problem(
                        f"models {ms[0].alias!r} and {other.alias!r} share one tokenizer file {rel!r}",
                        field=f"{other.pointer}/tokenizer/file",
                    )
        yield self.note(f"{len(users)} tokenizer(s) for {len(pkg.models)} aliases, one to one")


class EndOfSequence(PackageRule):
    """The tokenizer config's special tokens are tokens of the tokenizer, and its eos_token maps to eos_token_id.

    Generation stops on eos_token_id. When tokenizer_config.json names an eos_token and the architecture declares
    eos_token_id, the tokenizer must map that token to that id; otherwise decode never stops (or stops on the wrong
    token), which golden token sequences would only catch by luck. Every special token the config names (bos, eos,
    unk, pad, sep, cls, mask, additional_special_tokens) must be a token of tokenizer.json: transformers would add an
    unknown one under a new id past the vocabulary, and calctl's tokenizer never produces it.
    """

    id = "TOK004"
    sections = ("001 §13.1", "001 §12 Phase 3 item 1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        n = 0
        for m in ctx.pkg.models:
            eos_id = m.architecture.eos_token_id
            cfg_rel = m.tokenizer.config
            if cfg_rel is None:
                continue
            field = f"{m.pointer}/architecture/eos_token_id"
            tok, reason = _loaded(ctx, m)
            if tok is None:
                yield self.skip(str(reason), file=m.tokenizer.file, field=field)
                continue
            doc, gated = _verified_config(ctx, cfg_rel)
            if gated or not isinstance(doc, dict):
                yield self.skip(gated or "skipped: TOK001 failed for the tokenizer config", file=cfg_rel, field=field)
                continue
            for where, problem in unknown_special_tokens(doc, tok):
                yield self.problem(
                    f"tokenizer config of {m.alias!r}: {where}: {problem}",
                    file=cfg_rel,
                    field=f"{m.pointer}/tokenizer/config",
                    expected="a token of tokenizer.json",
                    found=where,
                )
            if eos_id is None:
                continue
            eos = doc.get("eos_token")
            if isinstance(eos, dict):  # AddedToken form
                eos = eos.get("content")
            if not isinstance(eos, str):
                continue
            n += 1
            got = tok.token_to_id(eos)
            if got != eos_id:
                yield self.problem(
                    f"eos_token {eos!r} of {m.alias!r} maps to another id",
                    file=cfg_rel,
                    field=field,
                    expected=eos_id,
                    found="absent" if got is None else got,
                )
        yield self.note(f"{n} eos tokens agree with eos_token_id")


class ChatTemplateBounded(PackageRule):
    """The tokenizer config's chat template compiles and renders a short chat within the bounded sandbox.

    serve renders each model's chat template for every chat request (001 §9.2), in the sandbox and within the cost
    bounds the importer uses (calctl.package.chat_template: 1,000,000 template steps, strings of about a MiB plus
    four times the conversation). A template that does not compile, or that crosses a bound for one user message or
    a four-message chat with a system prompt (nested range(99999) loops, a string doubled forty times), would stall
    or refuse every request: it fails here, so serve and run-golden refuse the package at load. A template that is
    costly only for longer conversations is answered 400 for those requests.
    """

    id = "TOK005"
    sections = ("001 §9.2", "001 §13.1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        from calctl.package.chat_template import probe

        n = 0
        for m in ctx.pkg.models:
            rel = m.tokenizer.config
            if rel is None:
                continue
            field = f"{m.pointer}/tokenizer/config"
            doc, gated = _verified_config(ctx, rel)
            if gated or not isinstance(doc, dict):
                yield self.skip(gated or "skipped: TOK001 failed for the tokenizer config", file=rel, field=field)
                continue
            for name, source in _templates(doc.get("chat_template")):
                n += 1
                problem = probe(source, token_text(doc.get("bos_token")) or "", token_text(doc.get("eos_token")) or "")
                if problem:
                    yield self.problem(
                        f"chat template{name} of {m.alias!r} {problem}",
                        file=rel,
                        field=f"{field}/chat_template",
                        expected="a template that compiles and renders a short chat within the bounds",
                        found=problem.split(":")[0],
                    )
        yield self.note(f"{n} chat templates render a short chat within the bounds")


def _templates(value: object) -> list[tuple[str, str]]:
    """``(label, source)`` of a ``chat_template``: a string, or Hugging Face's list of ``{name, template}``."""
    if isinstance(value, str):
        return [("", value)]
    if isinstance(value, list):
        return [
            (f" {str(t.get('name'))[:40]!r}", t["template"])
            for t in value[:16]
            if isinstance(t, dict) and isinstance(t.get("template"), str)
        ]
    return []


RULES: tuple[type[Rule], ...] = (
    TokenizerLoads,
    TokenizerVocab,
    OneTokenizerPerAlias,
    EndOfSequence,
    ChatTemplateBounded,
)
