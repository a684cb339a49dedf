"""The promises of docs/calrt-c-abi.md, one ID each: what a conformance check cites when it tries one.

Every check names the clauses it provokes (``@check(..., clauses=(...))``) and a FAIL row names them too, so
a vendor reads which sentence of the ABI its shim broke. ``tests/unit/runtime/test_conformance_clauses.py``
keeps the two in step: a clause no check tries, a check that cites no clause, an ID cited that is not here,
or a clause missing from the table of docs/calrt-c-abi.md §13 fails the suite.

This module only lists the clauses; it checks nothing and imports no runtime.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Clause:
    """One promise of the C ABI: its ID, the section of docs/calrt-c-abi.md stating it, and the promise."""

    id: str
    section: str
    promise: str


CLAUSES: tuple[Clause, ...] = (
    Clause("LOAD-1", "§1", "every function of §7 is exported and calrt_abi_version reports 1.x"),
    Clause(
        "ENUM-1",
        "§11",
        "the optional enumeration lists distinct printable names and refuses a bad index or buffer with "
        "INVALID_ARGUMENT",
    ),
    Clause("CONV-1", "§3", "calrt_status_string returns a distinct static string for every code, never NULL"),
    Clause("CONV-2", "§3", "out-parameters are written only on CALRT_OK (calrt_job_wait also on TIMEOUT)"),
    Clause("CONV-3", "§3", "the callee copies every string and descriptor array: the caller may reuse them at once"),
    Clause("CONV-4", "§3", "what the runtime cannot tell is CALRT_UNKNOWN_U64 or NOT_SUPPORTED, never 0"),
    Clause("CONV-5", "§3", "times are nanoseconds on CLOCK_MONOTONIC; submit <= start <= end"),
    Clause("STATUS-1", "§4", "a refused call returns the documented status code, never OK and never another code"),
    Clause("OWN-1", "§5", "one device per process: a second calrt_device_open is DEVICE_IN_USE"),
    Clause("OWN-2", "§5", "calrt_device_close aborts jobs in flight, and their waiters return"),
    Clause("OWN-3", "§5", "calrt_calbin_release of the current calbin is DEVICE_BUSY; once unloaded it releases"),
    Clause("OWN-4", "§5", "one current calbin: calrt_configure while one is current is ALREADY_CONFIGURED"),
    Clause("OWN-5", "§5", "calrt_reset_configuration with a job not terminal is DEVICE_BUSY"),
    Clause("OWN-6", "§5", "a job owns its buffers from submit until terminal: release and resubmit are BUFFER_IN_USE"),
    Clause(
        "OWN-7", "§5", "after UNKNOWN_DMA_STATE the buffers stay quarantined until a reset covering the job's chips"
    ),
    Clause("OWN-8", "§5", "inputs and outputs must be two different buffers"),
    Clause(
        "OWN-9",
        "§5",
        "calrt_job_release of a job not terminal is DEVICE_BUSY; a released job is not found, and its id is never "
        "given to another job",
    ),
    Clause("LAYOUT-1", "§6", "a buffer smaller than the graph's layout at B (64-byte aligned tensors) is refused"),
    Clause("LAYOUT-2", "§6", "n_kv equals the batch, the batch is one of the graph's profiles, the engine is known"),
    Clause(
        "LAYOUT-3",
        "§6",
        "a token id outside the model's vocabulary (prefill or decode), or a prefill valid length of 0, is "
        "INVALID_ARGUMENT",
    ),
    Clause("KV-1", "§6", "a job writes exactly the reserved tokens at position == committed length, else refused"),
    Clause(
        "KV-2",
        "§6",
        "commit after a failed job is INVALID_ARGUMENT; rollback drops the reservation and keeps the committed tokens",
    ),
    Clause("KV-3", "§6", "every KV call on a sequence a job in flight is writing is DEVICE_BUSY, never OK"),
    Clause("KV-4", "§5", "KV sequences have a namespace and a capacity per model alias"),
    Clause("KV-5", "§7", "a freed sequence is not found: freeing it again or using it is INVALID_ARGUMENT"),
    Clause(
        "KV-6",
        "§6",
        "a job's K/V land at the positions it names: a decode at any position up to the context computes what a "
        "prefill of the same tokens computes",
    ),
    Clause(
        "KV-8",
        "§7",
        "calrt_kv_remove_tokens_at_end with tokens reserved, or of more tokens than committed, is INVALID_ARGUMENT "
        "and changes nothing",
    ),
    Clause(
        "KV-9",
        "§7",
        "calrt_kv_append past the sequence's capacity (the model's kv_max_seq) is INVALID_ARGUMENT and reserves nothing",
    ),
    Clause(
        "KV-7",
        "§5",
        "calrt_kv_free gives the sequence's slot back, whatever it holds; a sequence allocated after it is empty",
    ),
    Clause("BATCH-1", "§6", "an inactive lane (mask 0, CALRT_KV_NONE) writes no KV row of any sequence"),
    Clause("BATCH-2", "§6", "every active lane of a batch job computes what the same lane computes alone at B1"),
    Clause(
        "CALBIN-1",
        "§7",
        "calrt_calbin_create refuses a chip mask of 0, outside the board, or a graph's outside its model's with "
        "INVALID_CALBIN",
    ),
    Clause(
        "CFG-1", "§7", "without a configuration, submit, KV allocate and can-allocate and unload are NOT_CONFIGURED"
    ),
    Clause(
        "CFG-2",
        "§5",
        "calrt_reset_configuration frees every KV sequence and its slot: one allocated before is not found, and the "
        "next configuration grants the whole capacity",
    ),
    Clause("JOB-1", "§7", "the chip comes from the graph; query and wait echo generation, engine and chip mask"),
    Clause("JOB-2", "§7", "an inexact graph name is INVALID_ARGUMENT"),
    Clause(
        "JOB-3",
        "§7",
        "calrt_job_wait returns OK once the job is terminal (how it ended in the info), TIMEOUT after its deadline; "
        "the job, its buffers and KV unchanged",
    ),
    Clause(
        "JOB-4",
        "§7",
        "calrt_job_wait_any returns the index of a terminal job, or TIMEOUT once its deadline passed, never before",
    ),
    Clause("JOB-5", "§7", "a job reported SUCCEEDED has written its outputs; each output is its own inputs' result"),
    Clause("JOB-6", "§7", "a job that hangs never ends SUCCEEDED: it stays in flight until a reset aborts it"),
    Clause(
        "JOB-7",
        "§4",
        "DEVICE_BUSY refuses a submit without taking its buffers; a retry runs; a full queue is DEVICE_BUSY",
    ),
    Clause("JOB-8", "§7", "calrt_job_query never blocks; calrt_job_wait with timeout 0 is a poll that never blocks"),
    Clause(
        "JOB-9",
        "§7",
        "calrt_job_query of a terminal job reports the state, status and stamps its wait returned, every time",
    ),
    Clause("MEM-1", "§7", "calrt_memory_usage is bytes: total equals the topology's DRAM, used fits in it"),
    Clause("MEM-2", "§7", "a chip's usage grows by at least the weights loaded onto it, and only that chip's"),
    Clause(
        "MEM-3", "§7", "after an unload or a board reset the usage returns to its baseline (no leak across load cycles)"
    ),
    Clause(
        "OBS-1",
        "§7",
        "counters count pending jobs (queued ones too), SUCCEEDED ones as finished and every other end (FAILED, "
        "ABORTED) as failed, and a read clears nothing; health reports FAULTED or HUNG",
    ),
    Clause(
        "OBS-2",
        "§7",
        "calrt_memory_usage, calrt_chip_counters, calrt_chip_health and calrt_reset(CHIP) refuse a chip past the "
        "board with INVALID_ARGUMENT",
    ),
    Clause(
        "RESET-1",
        "§7",
        "a chip reset aborts the chip's jobs (queued ones too), frees its quarantine, empties its sequences",
    ),
    Clause("RESET-2", "§7", "a board reset drops the configuration and every KV sequence"),
    Clause(
        "RESET-3", "§12", "a reset returns only when its chips are idle: an aborted job's buffers are never written"
    ),
    Clause(
        "RESET-4",
        "§7",
        "a chip reset leaves the other chips' jobs running and their sequences kept; without chip scope it is "
        "NOT_SUPPORTED",
    ),
    Clause(
        "RESET-5",
        "§7",
        "a chip reset keeps the configuration: the chip's next job computes what it computed before the reset",
    ),
    Clause("FAULT-1", "§7", "a CCU exception fails its job and halts only its chip (DEVICE_LOST) until a reset"),
    Clause("THREAD-1", "§8", "every call of the first group is safe from several threads at once"),
    Clause("THREAD-2", "§8", "calrt_job_wait holds no lock while blocked"),
    Clause("TIME-1", "§8", "start_ns/end_ns are when the job ran on its chip, as the host observes it"),
    Clause(
        "COMPUTE-1", "§12", "outputs are a deterministic function of the inputs and match the package's golden data"
    ),
    Clause(
        "COMPUTE-2",
        "§12",
        "a prefill of the whole context computes what the package's model computes (its float64 reference)",
    ),
    Clause(
        "TELEM-1",
        "§15",
        "calrt_chip_telemetry honours the sized struct: a short size or a chip past the board refused, a later "
        "caller's larger struct answered",
    ),
    Clause(
        "TELEM-2",
        "§15",
        "telemetry is in degrees Celsius, watts and MHz, with only defined throttle bits; the thermal bit only near "
        "the temperature limit",
    ),
    Clause("TELEM-3", "§15", "the telemetry counters (throttled time, ECC, resets) never decrease"),
    Clause("TELEM-4", "§15", "under load temperature and power change: a sensor is never frozen"),
    Clause("TELEM-5", "§15", "a reported reset_count counts every chip or board reset that covered the chip"),
    Clause("TELEM-6", "§15", "a reading is the chip asked for: the chip that computes is the one whose power rises"),
)

CLAUSE_IDS = frozenset(c.id for c in CLAUSES)


def clause(clause_id: str) -> Clause:
    return next(c for c in CLAUSES if c.id == clause_id)
