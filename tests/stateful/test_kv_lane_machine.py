"""KvLaneManager against a plain-dict reference model (000 §17.2).

Random reserve / begin_update (prefill and decode appends) / commit / rollback /
remove-tail / release / confirm / cancel / deadline / fault / recover
sequences; after every step the real manager must equal the model lane by lane
and ``check_invariants()`` must pass: lane uniqueness, length ranges, terminal
resources reclaimed, Unknown never reused.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from calctl.serving.core import JobId, KvCapacity, KvLaneManager, KvState, LaneId, ModelGenerationId, RequestId

LANES, TOKENS, MAX_SEQ = 4, 64, 32
FREE, RES, ACT, UPD, UNK, REL = (
    KvState.FREE,
    KvState.RESERVED,
    KvState.ACTIVE,
    KvState.UPDATING,
    KvState.UNKNOWN,
    KvState.RELEASING,
)


def _free_lane() -> dict[str, Any]:
    return {
        "state": FREE,
        "owner": None,
        "gen": None,
        "committed": 0,
        "reserved": 0,
        "pending": 0,
        "job": None,
        "done": False,
    }


class KvLaneMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kv = KvLaneManager(KvCapacity(LANES, TOKENS, MAX_SEQ, remove_tail=True))
        self.model: dict[LaneId, dict[str, Any]] = {LaneId(i): _free_lane() for i in range(LANES)}
        self.gen = ModelGenerationId(1)
        self.next_owner = 0
        self.next_job = 1
        self.ever_unknown: set[LaneId] = set()

    # -- helpers ----------------------------------------------------------------------------

    def _lanes(self, *states: KvState) -> list[LaneId]:
        return [i for i, m in self.model.items() if m["state"] in states]

    def _reserved_total(self) -> int:
        return sum(m["reserved"] for m in self.model.values() if m["state"] is not FREE)

    def _after_txn(self, lane: LaneId) -> None:
        m = self.model[lane]
        if m["done"] and m["state"] in (RES, ACT):  # the owner finished while the job ran: release on drain
            assert self.kv.release(lane) is REL
            m["state"] = REL

    # -- rules ------------------------------------------------------------------------------

    @rule(tokens=st.integers(1, MAX_SEQ + 2))
    def reserve(self, tokens: int) -> None:
        owner = RequestId(f"r{self.next_owner}")
        self.next_owner += 1
        if tokens > MAX_SEQ:
            try:
                self.kv.reserve(owner, self.gen, tokens)
            except Exception as exc:
                assert type(exc).__name__ == "InvariantViolation"
                return
            raise AssertionError("reserve beyond max_seq was accepted")
        free = self._lanes(FREE)
        expect = min(free) if free and self._reserved_total() + tokens <= TOKENS else None
        got = self.kv.reserve(owner, self.gen, tokens)
        assert got == expect
        if got is not None:
            assert got not in self.ever_unknown or self.model[got]["state"] is FREE
            self.model[got] = {**_free_lane(), "state": RES, "owner": owner, "gen": self.gen, "reserved": tokens}

    @precondition(lambda self: self._lanes(RES, ACT))
    @rule(data=st.data())
    def submit(self, data: st.DataObject) -> None:
        lane = data.draw(st.sampled_from(self._lanes(RES, ACT)))
        m = self.model[lane]
        room = m["reserved"] - m["committed"]
        if room < 1:
            return
        tokens = data.draw(st.integers(1, room)) if m["state"] is RES else 1  # prefill: a prompt; decode: 1
        job = JobId(self.next_job)
        self.next_job += 1
        self.kv.begin_update(lane, job, m["committed"], tokens)
        m.update(state=UPD, pending=tokens, job=job, prev=m["state"])

    @precondition(lambda self: self._lanes(UPD))
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        lane = data.draw(st.sampled_from(self._lanes(UPD)))
        m = self.model[lane]
        assert self.kv.commit(lane, m["job"]) == m["committed"] + m["pending"]
        m.update(state=ACT, committed=m["committed"] + m["pending"], pending=0, job=None)
        self._after_txn(lane)

    @precondition(lambda self: self._lanes(UPD))
    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        lane = data.draw(st.sampled_from(self._lanes(UPD)))
        m = self.model[lane]
        self.kv.rollback(lane, m["job"])
        m.update(state=ACT if m["committed"] else RES, pending=0, job=None)
        self._after_txn(lane)

    @precondition(lambda self: self._lanes(ACT))
    @rule(data=st.data())
    def remove_tail(self, data: st.DataObject) -> None:
        lane = data.draw(st.sampled_from(self._lanes(ACT)))
        m = self.model[lane]
        n = data.draw(st.integers(1, m["committed"]))
        assert self.kv.remove_tail(lane, n) == m["committed"] - n
        m["committed"] -= n
        if m["committed"] == 0:
            m["state"] = RES

    @precondition(lambda self: any(not self.model[i]["done"] for i in self._lanes(RES, ACT, UPD, UNK)))
    @rule(data=st.data(), why=st.sampled_from(["finish", "cancel", "deadline"]))
    def owner_done(self, data: st.DataObject, why: str) -> None:
        """The request finished, was cancelled or expired: release now, or after its job drains."""
        lane = data.draw(st.sampled_from([i for i in self._lanes(RES, ACT, UPD, UNK) if not self.model[i]["done"]]))
        m = self.model[lane]
        m["done"] = True
        if m["state"] in (RES, ACT):
            assert self.kv.release(lane) is REL
            m["state"] = REL
        elif m["state"] is UNK:
            assert self.kv.release(lane) is UNK

    @precondition(lambda self: self._lanes(REL))
    @rule(data=st.data())
    def confirm(self, data: st.DataObject) -> None:
        lane = data.draw(st.sampled_from(self._lanes(REL)))
        self.kv.confirm_released(lane)
        self.model[lane] = _free_lane()

    @precondition(lambda self: self._lanes(RES, ACT, UPD, REL))
    @rule(data=st.data())
    def fault(self, data: st.DataObject) -> None:
        """Timeout / CCU fault: the lane becomes Unknown whatever it was doing."""
        lane = data.draw(st.sampled_from(self._lanes(RES, ACT, UPD, REL)))
        self.kv.mark_unknown(lane)
        self.model[lane].update(state=UNK, pending=0, job=None)
        self.ever_unknown.add(lane)

    @precondition(lambda self: self._lanes(UNK))
    @rule(data=st.data())
    def recover(self, data: st.DataObject) -> None:
        lane = data.draw(st.sampled_from(self._lanes(UNK)))
        self.kv.recover(lane)
        self.model[lane] = _free_lane()

    @rule()
    def new_generation(self) -> None:
        self.gen = ModelGenerationId(self.gen + 1)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def matches_model(self) -> None:
        self.kv.check_invariants()
        for lane, m in self.model.items():
            v = self.kv.lane(lane)
            assert (v.state, v.owner, v.generation, v.committed_len, v.reserved_len, v.pending_tokens, v.job) == (
                m["state"],
                m["owner"],
                m["gen"],
                m["committed"],
                m["reserved"],
                m["pending"],
                m["job"],
            ), (lane, v, m)
            assert 0 <= m["committed"] <= m["reserved"] <= MAX_SEQ
        assert self.kv.reserved_tokens == self._reserved_total() <= TOKENS
        owners = [(m["gen"], m["owner"]) for m in self.model.values() if m["state"] is not FREE]
        assert len(owners) == len(set(owners))  # one lane per sequence per generation
        assert self.kv.free_lanes == len(self._lanes(FREE))


KvLaneMachine.TestCase.settings = settings(
    max_examples=75, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestKvLaneMachine = KvLaneMachine.TestCase
