"""Scenario ``fault-isolation``: the F0/F1/F2 grade from injected faults on A while B is measured (001 §12 Phase 4, §13.4).

The serving engine runs in-process on the **mock** board (faults are armed at
run time with ``MockRuntime.arm_fault``; a board needs the vendor's own fault
injection, so ``--device calrt`` is refused). B gets a steady closed-loop load
(two clients, fixed 16-token prompts and 16-token greedy outputs) from start to
end; its success and end-to-end latency are measured per phase. Phases, in
order (each at least :data:`PHASE_MIN_S`, longer while B has had fewer device jobs than a P99 needs, up to
:data:`PHASE_MAX_S` on a loaded host, then until both models are Ready):

==================  =========================================================  ==================
phase               what happens to A                                          class (001 §11.3)
==================  =========================================================  ==================
baseline            light traffic, no fault: B's reference latency             –
invalid-tensor      prompts longer than the context and empty prompts: 400    request
kv-exhausted        48 concurrent requests against 16 KV lanes + 4 waiting:  resource
                    429 beyond capacity
submit-busy         DeviceBusy on A's decode submits: 3 (retried) and then 7   resource
                    in a row (more than the bounded backoff allows)
wait-timeout        one A decode job hangs; the engine's job timeout fires     runtime
ccu-exception       one A decode job ends in a CCU exception                   runtime
drain-deadline      A reloads while long requests run, drain deadline 0.1 s    lifecycle
unload-reload       A reloads normally (drain completes)                       lifecycle
==================  =========================================================  ==================

A fault plan on the board (``DeviceSpec.fault_plan``, ``--fault-plan`` of
``calctl accept``) is armed by the board as it is: its rules fire at their own
ordinals, counted from the board's open, in whatever phase that is (the
``faults_fired`` of each phase shows where). Its ``wait_timeout`` and
``ccu_exception`` rules also say how far such a fault reaches on this board:
the wait-timeout and ccu-exception phases arm their fault with the plan's
``reset_scope`` for that kind (default chip), so a plan whose CCU fault takes
the whole board makes the ccu-exception phase a board-wide fault.

Per phase the evidence row holds: what A saw (outcomes by class), the recovery
scope the runtime granted (from the supervisor's recovery records: chip reset
of A's chip, board reset, or none) and which aliases it touched, and whether
**B was impacted**: any B request failed or was refused, B left Ready, or B's
P99 job latency **on the device's clock** (each B job's ``end - submit`` from
the runtime's own stamps: its queueing on the device plus its run) exceeded
its baseline P99 by more than 25 % (the 001 §13.2 tail gate). That gate
follows the one decision rule (:func:`calctl.checks.stats.decide`): judged
only from at least :data:`calctl.runners.bench.gates.MIN_SAMPLES` ``p99``
jobs in the baseline and in the phase, impacted when the bootstrap CI of the
phase's P99 lies above the gate, not impacted when it lies at or below, else
not judged. B's end-to-end latency on the host (what its clients waited,
host overhead included) is reported beside it and never decides the grade: a
starved host is not a fault domain of the board. A phase whose latency could
not be judged and whose class could still lower the grade makes the verdict
**NOT JUDGED** (exit 0), naming the phase and its sample counts.

Grade, from observation only (001 §13.4):

* **F0** – a request- or resource-level fault on A (invalid, KV exhausted,
  submit busy) impacted B;
* **F1** – those were isolated, but a runtime fault (timeout, CCU) or a
  lifecycle action (drain deadline, unload/reload) impacted B;
* **F2** – nothing on A impacted B.

A combined calbin reconfigures as a whole (001 §11.2): reloading A drains and
reloads B too, which the lifecycle rows show, so a combined package grades F1
at best. On the mock these are mock results: they show the tool and the
engine's isolation logic, not a board's fault domains (docs/runtime.md §5).
"""

from calctl.runners.bench.fault_isolation.plan import FAULT_ISOLATION_TIME_SCALE
from calctl.runners.bench.fault_isolation.run import FAULT_ISOLATION, run_fault_isolation

__all__ = ["FAULT_ISOLATION", "FAULT_ISOLATION_TIME_SCALE", "run_fault_isolation"]
