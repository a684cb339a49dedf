"""The G2 isolation scenario's pieces without an engine: replica check, workload, reference, crosstalk source."""

from __future__ import annotations

import itertools
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from calctl.errors import UsageError
from calctl.model import decoder
from calctl.package.reader import load_manifest
from calctl.runners.bench.isolation import (
    CANCEL_KINDS,
    IsolationReference,
    Judged,
    Planned,
    ReferenceMatch,
    check_replica,
    find_sources,
    plan_workload,
)
from tests.conftest import FIXTURE_PACKAGES

REPLICA = FIXTURE_PACKAGES / "replica"


def _replica(root: Path = REPLICA):
    return check_replica(load_manifest(root), root, root)


def test_the_replica_fixture_is_accepted_with_its_sides() -> None:
    rep = _replica()
    assert [(s.alias, s.chip) for s in rep.sides] == [("model-a0", 0), ("model-a1", 1)]
    assert "model_a0_decode" in rep.sides[0].graphs and "model_a1_prefill" in rep.sides[1].graphs
    assert rep.sides[0].max_batch == 1 and len(rep.params_sha256) == 64


@pytest.mark.parametrize("kind", ["combined", "single"])
def test_other_package_kinds_are_refused_naming_the_kind(kind: str) -> None:
    root = FIXTURE_PACKAGES / kind
    with pytest.raises(UsageError, match=f"package kind '{kind}'.*needs a replica package"):
        check_replica(load_manifest(root), root, root)


def test_a_replica_whose_weights_differ_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    shutil.copytree(REPLICA, root)
    pkg = load_manifest(root)
    t = next(t for t in pkg.model("model-a1").params if t.name == "layers.1.wo")
    blob = bytearray((root / t.file).read_bytes())
    blob[t.offset] ^= 0x40  # one bit of one weight of A1
    (root / t.file).write_bytes(bytes(blob))
    with pytest.raises(UsageError, match=re.escape("parameter 'layers.1.wo' of model-a1 differs from model-a0's")):
        check_replica(pkg, root, root)


def test_a_replica_whose_tokenizers_differ_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    shutil.copytree(REPLICA, root)
    pkg = load_manifest(root)
    a, b = pkg.model("model-a0").tokenizer.file, pkg.model("model-a1").tokenizer.file
    if a == b:
        pytest.fail("the replica fixture shares one tokenizer file: this test needs one per alias")
    (root / b).write_bytes((root / b).read_bytes() + b" ")  # one byte more in A1's tokenizer.json
    with pytest.raises(UsageError, match="different tokenizer files"):
        check_replica(pkg, root, root)


def test_the_workload_is_seeded_interleaved_unique_and_within_the_context() -> None:
    rep = _replica()
    work = plan_workload(301, rep, vocab=384, context=64, seed=5)
    assert work == plan_workload(301, rep, vocab=384, context=64, seed=5)
    assert work != plan_workload(301, rep, vocab=384, context=64, seed=6)
    by_alias = [sum(1 for p in work if p.side is s) for s in rep.sides]
    assert sorted(by_alias) == [150, 151]
    switches = sum(1 for a, b in itertools.pairwise(work) if a.side is not b.side)
    assert switches > 100  # interleaved, not 150 of one then 151 of the other
    assert len({p.prompt for p in work}) == 301 and len({p.request_id for p in work}) == 301
    assert all(len(p.prompt) + p.max_tokens <= 64 and len(p.prompt) >= 1 for p in work)
    assert all(3 <= t < 384 for p in work for t in p.prompt)
    cues = {k: [p for p in work if p.cancel == k] for k in CANCEL_KINDS}
    assert all(cues[k] for k in CANCEL_KINDS), {k: len(v) for k, v in cues.items()}
    assert 0.1 < sum(len(v) for v in cues.values()) / 301 < 0.3
    assert all(p.cancel_after_s == 0.0 for p in cues["after_submit"])
    assert all(1 <= (p.cancel_after_tokens or 0) < p.max_tokens for p in cues["mid_decode"])
    assert all(p.cancel_after_tokens is None and p.cancel_after_s is None for p in work if not p.cancel)


def _reference() -> IsolationReference:
    return IsolationReference(load_manifest(REPLICA), REPLICA, "model-a0")


def test_the_reference_accepts_its_own_greedy_tokens_and_names_a_changed_one() -> None:
    ref = _reference()
    prompt = (17, 203, 5, 99, 41)
    good = ref.greedy(prompt, 10)
    assert ref.judge(prompt, good).ok and ref.judge(prompt, good[:4]).ok and ref.judge(prompt, []).ok
    bad = list(good)
    bad[6] = (bad[6] + 1) % 384
    v = ref.judge(prompt, bad)
    assert not v.ok and v.first_mismatch == 6 and v.expected == good[6] and v.got == bad[6]
    assert v.gap is not None and v.slack is not None and v.gap > v.slack
    assert not ref.judge(prompt, [*good[:3], 999]).ok  # an id outside the vocabulary is never a tie


def test_a_near_tie_within_the_golden_tolerance_is_accepted_and_counted() -> None:
    ref = _reference()
    prompt = (8, 9, 10)
    good = ref.greedy(prompt, 4)
    row = decoder.reference_logits(ref.params, ref.arch, np.array(prompt + tuple(good[:1])))[-1]
    second = int(np.argsort(row)[-2])
    ref.atol = float(row.max() - row[second])  # the runner-up is now within tolerance of the top
    v = ref.judge(prompt, [good[0], second])
    assert v.ok and v.near_ties == 1


def _judged(i: int, side_index: int, tokens: list[int], ok: bool) -> Judged:
    rep = _replica()
    p = Planned(i, f"iso-{i:05d}", rep.sides[side_index], (3, 4, i + 5), len(tokens) or 1, "")
    j = Judged(p, None, tokens, frozenset({1}))
    if not ok:
        j.match = ReferenceMatch(False, 0, 1, tokens[0] if tokens else None, 1.0, 0.1)
    return j


def test_a_stream_delivered_to_the_wrong_request_names_its_source() -> None:
    a = _judged(1, 0, [10, 11, 12, 13], ok=True)
    b = _judged(2, 1, [20, 21, 22, 23, 24], ok=True)
    wrong = _judged(3, 0, [20, 21, 22], ok=False)  # A0's request got A1's stream
    corrupt = _judged(4, 1, [30, 31, 32, 33], ok=False)
    find_sources([a, b, wrong, corrupt])
    assert wrong.source is not None and "request iso-00002's (model-a1, chip 1)" in wrong.source
    assert "across chips" in wrong.source
    assert corrupt.source is not None and corrupt.source.startswith("no other request's output: chip 1")
    assert a.source is None and b.source is None


def test_a_timeout_is_a_load_outcome_never_an_offender_but_its_tokens_are_still_checked() -> None:
    """Issue 26: G2 judges isolation, not patience. A request that times out is counted as a load outcome; its
    partial output is still compared with the reference, so a wrong token in it remains crosstalk."""
    from calctl.runners.bench.isolation import judge_request
    from calctl.runners.traffic import EngineResult, RequestRecord
    from calctl.serving.outcomes import RequestOutcome

    ref = _reference()
    side = _replica().sides[0]
    prompt = (17, 203, 5, 99, 41)
    good = ref.greedy(prompt, 6)

    def judged(tokens: list[int]) -> Judged:
        rec = RequestRecord(side.alias, "isolation-complete", 0.0, len(prompt), 10)
        rec.outcome, rec.status, rec.error = RequestOutcome.TIMEOUT, 200, "no terminal event within 60 s"
        res = EngineResult(rec, "iso-00001", 1, token_generations=[1] * len(tokens))
        j = Judged(Planned(1, "iso-00001", side, prompt, 10, ""), res, tokens, frozenset({1}))
        record = {"model_alias": side.alias, "chips": [side.chip], "model_generation": 1, "output_tokens": 9}
        judge_request(j, ref, record)
        return j

    slow = judged(good[:4])
    assert slow.failures == [] and slow.load_outcome and "timed out" in slow.load_outcome
    assert "served" not in slow.passed  # neither passed nor failed: not evidence about isolation
    wrong = judged([*good[:2], (good[2] + 1) % 384])
    assert [c for c, _ in wrong.failures] == ["cancelled_prefix_of_reference"]
