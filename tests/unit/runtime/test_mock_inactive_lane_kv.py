"""The mock's ``inactive_lane_kv`` fault writes where a shim that ignores the inactive-lane contract would (#50).

Such a shim runs an inactive lane anyway, on the sequence its lane slot still maps to (the nearest active lane
before it), at the position the lane carries. The serving engine pads inactive lanes with lane 0's token and
position: in a one-lane batch the stray write is lane 0's own row with lane 0's own token (no change), in a
two-lane batch it lands on the second sequence at lane 0's position, a row that sequence already holds when it
is longer. The fault used to write into the first active lane's sequence only, which with the engine's padding
is the row that lane writes itself; a soak on a 1,4,8 package passed it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from calctl.package.reader import load_manifest
from calctl.runners.bench.batch import build_batch_sample
from calctl.runtime import Runtime, open_runtime
from calctl.runtime.conformance import decode_mask, golden_prompt, prefill_job
from calctl.runtime.mock import FaultKind, FaultPlan, FaultRule
from calctl.runtime.types import KvSeqId

ALIAS = "model-a"


@pytest.fixture(scope="module")
def pkg_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_batch_sample(tmp_path_factory.mktemp("b") / "pkg")


def _prefilled(rt: Runtime, pkg: object, prompt: np.ndarray) -> KvSeqId:
    job, seq, _, _ = prefill_job(rt, pkg, ALIAS, prompt)  # type: ignore[arg-type]
    assert rt.wait(job, 30).ok
    rt.kv.commit(seq)
    return seq


def _engine_step(rt: Runtime, pkg: object, seqs: list[KvSeqId], batch: int) -> None:
    """One decode step the way the serving engine pads it: inactive lanes mirror lane 0's token and position."""
    m = pkg.model(ALIAS)  # type: ignore[attr-defined]
    positions = [rt.kv.append(q, 1) for q in seqs]
    n = len(seqs)
    tokens = [5 + i for i in range(n)] + [5] * (batch - n)
    pos = positions + [positions[0]] * (batch - n)
    valid = [True] * n + [False] * (batch - n)
    with rt.job_buffers(m.decode.name, batch) as (inputs, outputs):
        inputs.write("tokens", np.array([[t] for t in tokens], np.int32))  # padded lanes keep lane 0's values
        inputs.write("positions", np.array(pos, np.int32))
        inputs.write(str(decode_mask(pkg, ALIAS)), np.array(valid, np.uint8))  # type: ignore[arg-type]
        job = rt.submit(m.decode.name, inputs, outputs, kv=[*seqs, *([None] * (batch - n))])
        assert rt.wait(job, 30).ok
    for q in seqs:
        rt.kv.commit(q)


def _caches(rt: Runtime, seqs: list[KvSeqId]) -> list[np.ndarray]:
    """Each sequence's K cache ``[layers, max_seq, kv_heads, head_dim]`` as the mock board holds it."""
    return [rt._kv.sequence(q).cache.k.copy() for q in seqs]  # type: ignore[attr-defined]


def _run(pkg_root: Path, faulty: bool, prompts: list[np.ndarray], batch: int) -> list[np.ndarray]:
    pkg = load_manifest(pkg_root)
    rules = (FaultRule(kind=FaultKind.INACTIVE_LANE_KV, probability=1.0),) if faulty else ()
    with open_runtime("mock", fault_plan=FaultPlan(rules=rules)) as rt:
        rt.configure(rt.create_calbin(pkg))
        seqs = [_prefilled(rt, pkg, p) for p in prompts]
        _engine_step(rt, pkg, seqs, batch)
        return _caches(rt, seqs)


def test_a_one_lane_batch_padded_like_the_engine_changes_nothing(pkg_root: Path) -> None:
    """The stray write is lane 0's own row with lane 0's own token: what a real shim writes there anyway."""
    prompt = golden_prompt(load_manifest(pkg_root), ALIAS)
    healthy, broken = _run(pkg_root, False, [prompt], 4), _run(pkg_root, True, [prompt], 4)
    assert np.array_equal(healthy[0], broken[0])


def test_a_two_lane_batch_overwrites_a_row_the_second_sequence_holds(pkg_root: Path) -> None:
    """Lane 1's sequence is longer than lane 0's: the inactive lanes write its row at lane 0's position."""
    prompt = golden_prompt(load_manifest(pkg_root), ALIAS)
    short, long = prompt[:4], np.concatenate([prompt, prompt])[:12]
    healthy = _run(pkg_root, False, [short, long], 4)
    broken = _run(pkg_root, True, [short, long], 4)
    assert np.array_equal(healthy[0], broken[0])  # lane 0's own sequence is untouched
    diff = np.nonzero(np.any(healthy[1] != broken[1], axis=tuple(i for i in range(healthy[1].ndim) if i != 1)))[0]
    assert list(diff) == [4], diff  # exactly the row at lane 0's position (4), inside the 12 it holds
