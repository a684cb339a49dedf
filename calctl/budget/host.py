"""The mock's host-side resident memory in budget terms (issue 32: memory in proportion to the model).

On the mock device the "chip DRAM" of 001 §8.1 is the serving process's own memory. This module
splits that process's resident set into the terms ``calctl budget`` names, each from what the
process actually holds, not from the manifest's regions:

* ``W_compiled``: the bytes of the decoder's weight arrays (``decoder.Weights.nbytes``: quantised
  blocks as stored, fp16 rows, and any float32 copy the fallback or BLAS prefill keeps);
* ``KV``: the tokens the live sequences hold at the mock's fp32 cache rate
  (:func:`calctl.budget.kv.kv_bytes_per_token`); a cache is allocated zeroed for its whole
  ``max_seq`` but only the pages its tokens touch are resident;
* ``workspace_peak``: the activations of a job while it runs; freed after it, so a resident set
  taken between jobs holds none of it. The manifest's ``workspace_peak`` is its bound;
* ``runtime_overhead``: the process before any model is loaded (interpreter, numpy, the native
  kernels, the mock board and its threads), measured, not estimated.

:func:`host_breakdown` checks the sum of the first, second and fourth against a measured resident
set within :data:`TOLERANCE_BYTES` plus :data:`TOLERANCE_SHARE` of the sum (allocator pages, Python
objects, glibc arenas), and a measured peak against the same plus the workspace bound. Sizes only:
nothing here times anything. Reading ``/proc`` is Linux-only; elsewhere the figures are ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: Slack of the check: allocator pages and arenas, Python objects, the import-time tables of a model.
TOLERANCE_BYTES = 16 * 1024 * 1024
TOLERANCE_SHARE = 0.05

W_COMPILED = "W_compiled"
KV = "KV"
WORKSPACE = "workspace_peak"
RUNTIME_OVERHEAD = "runtime_overhead"


def proc_status_bytes(field: str = "VmRSS", pid: int | str = "self") -> int | None:
    """``field`` (VmRSS, VmHWM, ...) of ``/proc/<pid>/status`` in bytes; None where it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def reset_peak(pid: int | str = "self") -> bool:
    """Reset ``VmHWM`` to the current resident set (Linux ``clear_refs`` 5); False where not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class HostTerm:
    name: str
    bytes: int
    detail: str


@dataclass(frozen=True)
class HostBreakdown:
    """What the process holds, by budget term, against what was measured."""

    terms: tuple[HostTerm, ...]
    measured_rss: int  # VmRSS between jobs
    measured_peak: int | None  # VmHWM over the jobs (None: the peak could not be reset)

    def term(self, name: str) -> int:
        return next(t.bytes for t in self.terms if t.name == name)

    @property
    def resident(self) -> int:
        """The terms resident between jobs: weights, KV and the runtime (the workspace is freed)."""
        return sum(t.bytes for t in self.terms if t.name != WORKSPACE)

    @property
    def tolerance(self) -> int:
        return TOLERANCE_BYTES + int(TOLERANCE_SHARE * self.resident)

    @property
    def unexplained(self) -> int:
        """Measured minus accounted (negative: the process holds less than the terms say)."""
        return self.measured_rss - self.resident

    @property
    def rss_ok(self) -> bool:
        return abs(self.unexplained) <= self.tolerance

    @property
    def peak_ok(self) -> bool | None:
        if self.measured_peak is None:
            return None
        return self.measured_peak <= self.resident + self.term(WORKSPACE) + self.tolerance

    def document(self) -> dict[str, object]:
        return {
            "terms": [{"name": t.name, "bytes": t.bytes, "detail": t.detail} for t in self.terms],
            "accounted_resident_bytes": self.resident,
            "measured_rss_bytes": self.measured_rss,
            "measured_peak_bytes": self.measured_peak,
            "unexplained_bytes": self.unexplained,
            "tolerance_bytes": self.tolerance,
            "rss_ok": self.rss_ok,
            "peak_ok": self.peak_ok,
        }


def host_breakdown(
    *,
    weights_bytes: int,
    kv_tokens: int,
    kv_bytes_per_token: int,
    workspace_bytes: int,
    runtime_bytes: int,
    measured_rss: int,
    measured_peak: int | None = None,
) -> HostBreakdown:
    """The breakdown from what the process holds (see the module text for where each figure comes from)."""
    terms = (
        HostTerm(W_COMPILED, weights_bytes, "decoder weight arrays as held (blocks, fp16 rows, float32 copies)"),
        HostTerm(KV, kv_tokens * kv_bytes_per_token, f"{kv_tokens} live tokens x {kv_bytes_per_token} B (fp32 cache)"),
        HostTerm(
            WORKSPACE, workspace_bytes, "bound on one job's activations (manifest workspace_peak), freed after it"
        ),
        HostTerm(RUNTIME_OVERHEAD, runtime_bytes, "the process before the model loaded (measured VmRSS)"),
    )
    return HostBreakdown(terms, measured_rss, measured_peak)


__all__ = [
    "KV",
    "RUNTIME_OVERHEAD",
    "TOLERANCE_BYTES",
    "TOLERANCE_SHARE",
    "WORKSPACE",
    "W_COMPILED",
    "HostBreakdown",
    "HostTerm",
    "host_breakdown",
    "proc_status_bytes",
    "reset_peak",
]
