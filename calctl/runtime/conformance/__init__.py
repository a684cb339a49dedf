"""The runtime conformance suite: what calctl relies on from a runtime, checked one call at a time.

One suite for every backend: ``calctl device conformance --calrt-lib X.so``
runs it against a vendor shim (or the reference board, or the bookkeeping
stub), and the test suite runs it against the mock board as well
(``tests/unit/runtime/test_conformance.py``). Each check ends

* ``PASS``;
* ``FAIL``, with the call, its arguments and what came back;
* ``UNSUPPORTED``: the runtime answered NOT_SUPPORTED (or lacks the optional
  test hook a check needs); never counted as a pass;
* ``TIMEOUT``: the check did not end within its bound.

:func:`run_suite` runs the checks in a child process (``python -m
calctl.runtime.conformance``), one after another, and bounds each: a check
that hangs is killed with its process, reported as TIMEOUT, and the remaining
checks go on in a fresh child (one device per process, 001 §2.1, so a hung
device cannot be reused in the same process anyway). :func:`run_check` runs
one check in this process (the mock board, tests).

From the measurements the checks take, :func:`vendor_questions` answers the
vendor questions of 000 §20 and 001 §15.2 the ABI can reach (parallel chips,
in-flight jobs per chip, reset scope, per-chip memory, thread safety of
concurrent submit), each graded C0 (measured here), C1 (the symbol is there,
the behaviour was not shown) or C4 (refused) with its evidence (001 §1).
A grade is about the library it was measured on: the reference board's C0 is
evidence about the reference board, never about a Calculet board (docs/runtime.md §5).

This package opens devices and submits jobs; it does not render (the CLI does). Its modules: ``framework``
(results, the session, expectations, the registry), ``checks_*`` (the checks by area), ``child`` (the
child-process runner), ``vendor`` (the vendor questions).
"""

from __future__ import annotations

from calctl.runtime.conformance import (
    checks_batch,
    checks_boards,
    checks_compute,
    checks_concurrency,
    checks_device,
    checks_jobs,
    checks_kv_faults,
    checks_promises,
    checks_recovery,
    checks_telemetry,
)
from calctl.runtime.conformance.child import ConformanceSuiteResult, run_suite
from calctl.runtime.conformance.clauses import CLAUSE_IDS, CLAUSES, Clause
from calctl.runtime.conformance.framework import (
    CHECKS,
    DEFAULT_CHECK_TIMEOUT,
    CheckResult,
    ConformanceCheck,
    ConformanceLevel,
    ConformanceTarget,
    ExpectationFailed,
    Session,
    Unsupported,
    Verdict,
    check,
    checks_for,
    decode_mask,
    expect,
    expect_raises,
    expect_status,
    golden_prompt,
    prefill_job,
    run_check,
    write_decode,
    write_decode_lanes,
    write_prefill,
)
from calctl.runtime.conformance.vendor import VendorAnswer, vendor_questions

# The checks register themselves on import; the suite runs them area by area, in this order (the library and
# the device first, what the board computes last), and in registration order within an area.
_AREAS = tuple(
    m.__name__
    for m in (
        checks_device,
        checks_boards,
        checks_jobs,
        checks_kv_faults,
        checks_recovery,
        checks_promises,
        checks_concurrency,
        checks_compute,
        checks_batch,
        checks_telemetry,
    )
)
CHECKS.sort(key=lambda c: _AREAS.index(c.run.__module__))
CHECK_NAMES = tuple(c.name for c in CHECKS)

__all__ = [
    "CHECKS",
    "CHECK_NAMES",
    "CLAUSES",
    "CLAUSE_IDS",
    "DEFAULT_CHECK_TIMEOUT",
    "CheckResult",
    "Clause",
    "ConformanceCheck",
    "ConformanceLevel",
    "ConformanceSuiteResult",
    "ConformanceTarget",
    "ExpectationFailed",
    "Session",
    "Unsupported",
    "VendorAnswer",
    "Verdict",
    "check",
    "checks_for",
    "decode_mask",
    "expect",
    "expect_raises",
    "expect_status",
    "golden_prompt",
    "prefill_job",
    "run_check",
    "run_suite",
    "vendor_questions",
    "write_decode",
    "write_decode_lanes",
    "write_prefill",
]
