"""Conformance that a broken shim cannot pass: broken copies of the reference board, one bug each.

Each mutant is the reference board's own source (calctl/runtime/_native/reference/calrt_reference.c)
compiled with one ``-DCALRT_MUTANT_*`` switch, at test time; nothing prebuilt is committed. The full
suite runs against it through ``calctl device conformance`` (child processes, as a vendor runs it):
it must exit 1 with a FAIL row for the check that owns the bug. The unmodified board passes the same
suite (test_conformance.py::test_suite_runs_in_child_processes_and_grades_the_vendor_questions).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from calctl.package import schemas
from calctl.runtime.conformance import CHECK_NAMES
from tests.conftest import TEST_KEY, Cli, assert_no_traceback

#: switch -> (the check whose FAIL row must name the bug, words its detail must contain)
pytestmark = pytest.mark.slow  # a compiled mutant and the whole suite in child processes per case

MUTANTS = {
    "-DCALRT_MUTANT_UNLOAD_LEAK": ("memory_counters", "memory"),
    "-DCALRT_MUTANT_BOARD_RESET_KEEPS_KV": ("chip_vs_board_reset", "after a board reset"),
    "-DCALRT_MUTANT_QUERY_NO_TAGS": ("job_states_timestamps", "calrt_job_query must echo"),
    "-DCALRT_MUTANT_STALE_EVERY=64": ("concurrent_submit_two_chips", "another job's output"),
    "-DCALRT_MUTANT_SUBMIT_DEADLOCK": ("concurrent_submit_two_chips", "deadlock"),
    "-DCALRT_MUTANT_RECONFIGURE": ("configuration", "calrt_configure of the current calbin while one is current"),
    "-DCALRT_MUTANT_BOARD_RESET_KEEPS_CONFIG": ("chip_vs_board_reset", "a board reset must drop the configuration"),
    "-DCALRT_MUTANT_RELEASE_IN_FLIGHT": ("buffer_ownership", "calrt_buffer_release of the inputs of job"),
    "-DCALRT_MUTANT_SUBMIT_OWNED_BUFFER": ("buffer_ownership", "calrt_job_submit with the inputs of job"),
    "-DCALRT_MUTANT_GRAPH_PREFIX": ("exact_graph_names", "inexact graph name"),
    "-DCALRT_MUTANT_TIMEOUT_FREES_BUFFERS": ("wait_timeout", "after its wait timed out must return BUFFER_IN_USE"),
    "-DCALRT_MUTANT_DMA_NO_QUARANTINE": ("dma_quarantine", "quarantined buffer must return BUFFER_IN_USE"),
}


#: #50's kinds: switch -> (the check whose FAIL row names the bug, words of its detail, a clause the row cites,
#: the --level it needs, whether it needs a package with batch profiles)
ISSUE_50 = {
    "-DCALRT_MUTANT_KV_FREE_IN_FLIGHT": ("kv_busy_in_flight", "calrt_kv_free of sequence", "KV-3", "quick", False),
    "-DCALRT_MUTANT_EARLY_DONE_EVERY=500": ("long_run", "all zeros (nothing written)", "JOB-5", "standard", False),
    "-DCALRT_MUTANT_WATCHDOG_MS=3000": ("hung_job_held", "ended SUCCEEDED", "JOB-6", "standard", False),
    # a watchdog tuned for decode steps (at --level long only the check runs: it ends the decode after 3 s)
    "-DCALRT_MUTANT_WATCHDOG_DECODE_MS=3000": ("hung_job_held", "hung decode job", "JOB-6", "long", False),
    # the same kind on the AUTO engine only (the serving core's sync mode): the long run submits there too
    "-DCALRT_MUTANT_EARLY_DONE_AUTO_EVERY=150": ("long_run", "all zeros (nothing written)", "JOB-5", "long", False),
    # half a minute: past standard's 10 s hold, inside long's 60 s
    "-DCALRT_MUTANT_WATCHDOG_MS=30000": ("hung_job_held", "ended SUCCEEDED", "JOB-6", "long", False),
    "-DCALRT_MUTANT_MEMORY_KIB": ("memory_figures", "the topology 17179869184 B of DRAM", "MEM-1", "quick", False),
    "-DCALRT_MUTANT_MEMORY_USED_KIB": ("memory_figures", "fewer than the weights", "MEM-2", "quick", False),
    "-DCALRT_MUTANT_MEMORY_SWAPPED": ("memory_figures", "fewer than the weights", "MEM-2", "quick", False),
    "-DCALRT_MUTANT_RESET_NO_DRAIN": (
        "reset_drains_jobs",
        "written after calrt_reset returned",
        "RESET-3",
        "quick",
        False,
    ),
    "-DCALRT_MUTANT_ANY_CHIP_MASK": ("raw_refusals", "chip mask 0x0", "CALBIN-1", "quick", False),
    "-DCALRT_MUTANT_SHORT_BUFFERS": ("raw_refusals", "one element short", "LAYOUT-1", "quick", False),
    "-DCALRT_MUTANT_INACTIVE_LANE_KV": ("batch_lanes", "wrote a KV row it does not own", "BATCH-1", "quick", True),
    "-DCALRT_MUTANT_KEEPS_KV_POINTER": ("descriptor_copies", "sequence", "CONV-3", "quick", False),
    # more a vendor team could ship: a chip reset that is the board reset underneath; one KV namespace
    "-DCALRT_MUTANT_CHIP_RESET_ABORTS_ALL": ("reset_drains_jobs", "aborted job", "RESET-4", "quick", False),
    "-DCALRT_MUTANT_KV_ANY_MODEL": ("raw_refusals", "with a sequence of model-a", "KV-4", "quick", False),
}


#: More a vendor team under deadline could ship, each a promise of docs/calrt-c-abi.md nothing tried before (or
#: tried too loosely): switch -> (the check, words of its detail, a clause its row cites, needs a batch package)
VENDOR_DEADLINE = {
    "-DCALRT_MUTANT_LANE_ORDER_REVERSED": (
        "batch_lanes",
        "logits differ from the same lane run alone",
        "BATCH-2",
        True,
    ),
    "-DCALRT_MUTANT_KV_POS_PLUS_ONE": ("batch_lanes", "logits differ from the same lane run alone", "BATCH-2", True),
    "-DCALRT_MUTANT_EARLY_DONE_WHEN_BUSY": ("long_run", "all zeros (nothing written)", "JOB-5", False),
    "-DCALRT_MUTANT_BUSY_SEQ_AS_INVALID": ("kv_busy_in_flight", "must be refused with DEVICE_BUSY", "STATUS-1", False),
    "-DCALRT_MUTANT_JOB_ID_REUSE": (
        "raw_refusals",
        "a released job's id is never given to another job",
        "OWN-9",
        False,
    ),
    "-DCALRT_MUTANT_CHIP1_ON_CHIP0": (
        "stamps_are_run_time",
        "start_ns was stamped before the job could run",
        "TIME-1",
        False,
    ),
    "-DCALRT_MUTANT_GLOBAL_LOCK_EARLY_STAMP": (
        "stamps_are_run_time",
        "a shared core or a global lock",
        "TIME-1",
        False,
    ),
    "-DCALRT_MUTANT_TIMEOUT_AS_ABORTED": ("wait_timeout", "must raise Timeout", "JOB-3", False),
    "-DCALRT_MUTANT_QUERY_PREV_STAMPS": (
        "job_states_timestamps",
        "must report its own stamps, the ones calrt_job_wait returned",
        "CONV-5",
        False,
    ),
    # waits and queries
    "-DCALRT_MUTANT_WAIT_ZERO_FOREVER": ("wait_timeout", "with timeout 0 on job", "JOB-8", False),
    "-DCALRT_MUTANT_WAIT_TIMEOUT_NO_INFO": ("hung_job_held", "must fill calrt_job_info", "CONV-2", False),
    "-DCALRT_MUTANT_QUERY_RUNNING_AFTER_WAIT": ("job_states_timestamps", "after its wait returned", "JOB-9", False),
    "-DCALRT_MUTANT_UNKNOWN_JOB_INTERNAL": ("raw_refusals", "of an unknown job must return", "STATUS-1", False),
    "-DCALRT_MUTANT_STAMPS_US": ("job_states_timestamps", "must report its own stamps", "CONV-5", False),
    "-DCALRT_MUTANT_END_STAMP_AT_WAIT": ("job_states_timestamps", "polled until it ended", "CONV-5", False),
    "-DCALRT_MUTANT_WAIT_ANY_FIRST_INDEX": ("wait_timeout", "must answer the index of the job", "JOB-4", False),
    # raw inputs calctl never writes
    "-DCALRT_MUTANT_TOKENS_WRAP": ("token_refusals", "a prefill with token", "LAYOUT-3", False),
    # KV sequences: slots, positions
    "-DCALRT_MUTANT_KV_FREE_LEAKS_USED": ("kv_lifecycle", "must grant the whole capacity", "KV-7", False),
    "-DCALRT_MUTANT_KV_REUSE_STALE_LENGTH": ("kv_lifecycle", "must be empty", "KV-7", False),
    "-DCALRT_MUTANT_REMOVE_TAIL_WHILE_RESERVED": ("kv_lifecycle", "with a token reserved", "KV-8", False),
    "-DCALRT_MUTANT_PREFILL_ON_USED": ("kv_lifecycle", "a prefill into sequence", "KV-1", False),
    "-DCALRT_MUTANT_UNLOAD_KEEPS_KV": ("configuration", "allocated before calrt_reset_configuration", "CFG-2", False),
    "-DCALRT_MUTANT_KV_POS_OFF_PAST=128": ("kv_positions", "differs from a prefill of the same", "KV-6", False),
    "-DCALRT_MUTANT_KV_POS_OFF_CHIP1": ("kv_positions", "model-b: the B1 decode at position", "KV-6", False),
    "-DCALRT_MUTANT_BATCH_COMPACT": ("batch_lanes", "logits differ from the same lane run alone", "BATCH-2", True),
    # resets and memory on one chip only
    "-DCALRT_MUTANT_CHIP_RESET_CLEARS_ALL_KV": ("chip_vs_board_reset", "sequence on the other chip", "RESET-4", False),
    "-DCALRT_MUTANT_CHIP_RESET_IGNORES_INDEX": ("chip_vs_board_reset", "chip 1 reset empties", "RESET-1", False),
    "-DCALRT_MUTANT_UNLOAD_LEAK_CHIP1": ("memory_counters", "chip 1: memory not back to baseline", "MEM-3", False),
    "-DCALRT_MUTANT_QUARANTINE_ANY_RESET": ("dma_quarantine", "stay quarantined", "OWN-7", False),
    # telemetry (§15)
    "-DCALRT_MUTANT_TELEMETRY_POWER_MW": ("telemetry_struct", "power_w", "TELEM-2", False),
    "-DCALRT_MUTANT_TELEMETRY_SAMPLE_US": ("telemetry_struct", "sample_ns", "TELEM-2", False),
    "-DCALRT_MUTANT_TELEMETRY_CHIPS_SWAPPED": (
        "telemetry_attribution",
        "the readings are not the chip",
        "TELEM-6",
        False,
    ),
    "-DCALRT_MUTANT_TELEMETRY_EXACT_SIZE": ("telemetry_struct", "a caller's larger struct", "TELEM-1", False),
    "-DCALRT_MUTANT_TELEMETRY_COUNTERS_RESET": ("telemetry_across_resets", "reset_count", "TELEM-5", False),
    "-DCALRT_MUTANT_TELEMETRY_THROTTLE_WHEN_BUSY": ("telemetry_under_load", "(thermal) at", "TELEM-2", False),
    # deadlines in the wrong unit, a wait_any on one chip's queue
    "-DCALRT_MUTANT_WAIT_TIMEOUT_US": ("wait_timeout", "the wait must last its timeout", "JOB-3", False),
    "-DCALRT_MUTANT_WAIT_ANY_TIMEOUT_US": ("wait_timeout", "must return TIMEOUT after its deadline", "JOB-4", False),
    "-DCALRT_MUTANT_WAIT_ANY_FIRST_CHIP": ("wait_timeout", "must answer the index of the job", "JOB-4", False),
    # KV: the context's end, a reservation the job does not fill, rollback after partial work, lanes past lane 0,
    # the pool across a reload
    "-DCALRT_MUTANT_KV_APPEND_PAST_CONTEXT": ("kv_lifecycle", "one token past the capacity", "KV-9", False),
    "-DCALRT_MUTANT_PREFILL_FEWER_THAN_RESERVED": (
        "kv_lifecycle",
        "KV-1: calrt_job_submit of a prefill of",
        "KV-1",
        False,
    ),
    "-DCALRT_MUTANT_ROLLBACK_AFTER_FAIL_CLEARS": ("ccu_fault", "must drop only its reservation", "KV-2", False),
    "-DCALRT_MUTANT_DECODE_POS_LANE0_ONLY": ("batch_lanes", "whose lane 2 names position", "KV-1", True),
    "-DCALRT_MUTANT_RELOAD_KEEPS_SLOTS": ("configuration", "the next configuration must grant", "CFG-2", False),
    # observation, clocks and recovery
    "-DCALRT_MUTANT_COUNTERS_ABORTED_AS_FINISHED": ("wait_timeout", "must count it failed", "OBS-1", False),
    "-DCALRT_MUTANT_CHIP_PAST_BOARD_CLAMPED": ("memory_counters", "calrt_memory_usage of chip 2", "OBS-2", False),
    "-DCALRT_MUTANT_STAMPS_REALTIME": ("job_states_timestamps", "times must be CLOCK_MONOTONIC", "CONV-5", False),
    "-DCALRT_MUTANT_CHIP_RESET_KEEPS_FAULT": ("ccu_fault", "must report OK again", "FAULT-1", False),
    "-DCALRT_MUTANT_BOARD_RESET_LEAKS_PLAN": ("memory_counters", "after a board reset dropped", "MEM-3", False),
    "-DCALRT_MUTANT_AUTO_ECHO_BANK": ("job_states_timestamps", "submitted 11, auto (0)", "JOB-1", False),
    "-DCALRT_MUTANT_KV_FREE_REFUSES_RESERVED": ("kv_lifecycle", "tokens reserved and no job in flight", "KV-7", False),
    "-DCALRT_MUTANT_KV_APPEND_OUT_ON_REFUSAL": ("kv_lifecycle", "leave *position unwritten", "CONV-2", False),
    "-DCALRT_MUTANT_PINGPONG_SHARED_STAGING": ("concurrent_submit_two_chips", "not their own prompt's", "JOB-5", False),
    "-DCALRT_MUTANT_ROPE_TABLE_WRAP": ("golden_compute", "a prefill of the whole context", "COMPUTE-2", False),
    "-DCALRT_MUTANT_QUERY_VIA_WAIT_ZERO": (
        "wait_timeout",
        "calrt_job_query of job 1 in flight never blocks",
        "JOB-8",
        False,
    ),
    "-DCALRT_MUTANT_QUERY_BLOCKS_WHILE_COMPUTING": (
        "query_while_computing",
        "calrt_job_query of a job that computes",
        "JOB-8",
        False,
    ),
    "-DCALRT_MUTANT_KEEPS_GRAPH_NAMES": ("calbin_descriptor_copies", "reads the caller's descriptor", "CONV-3", False),
    "-DCALRT_MUTANT_KEEPS_MODEL_ALIASES": (
        "calbin_descriptor_copies",
        "reads the caller's descriptor",
        "CONV-3",
        False,
    ),
    "-DCALRT_MUTANT_KV_CAPACITY_FIRST_MODEL": ("kv_capacity_per_model", "must grant 16 and refuse 17", "KV-4", False),
    "-DCALRT_MUTANT_FULL_BATCH_LAST_ROW": ("batch_lanes", "B4, lane 3 (active): logits differ", "BATCH-2", True),
    "-DCALRT_MUTANT_REMOVE_TAIL_CLAMPS": ("kv_lifecycle", "from a sequence holding", "KV-8", False),
    "-DCALRT_MUTANT_KV_LENGTH_SWAPPED": ("kv_lifecycle", "the refused remove-tail leaves", "KV-8", False),
    "-DCALRT_MUTANT_COUNTERS_CHIPS_SWAPPED": ("wait_timeout", "the chip counts one pending job", "OBS-1", False),
    "-DCALRT_MUTANT_HEALTH_CHIPS_SWAPPED": ("ccu_fault", "whose job failed, reports FAULTED", "FAULT-1", False),
    "-DCALRT_MUTANT_BUSY_WHEN_STARTED": ("kv_busy_in_flight", "must return DEVICE_BUSY (1)", "KV-3", False),
    "-DCALRT_MUTANT_TOPOLOGY_CORES_AS_CHIPS": ("memory_figures", "unexpected InvalidArgument", "MEM-1", False),
    # the board reset frees the configuration the un-drained job still computes on: the check's process dies
    "-DCALRT_MUTANT_BOARD_RESET_NO_DRAIN": ("reset_drains_jobs", "the check's process died", "RESET-3", False),
    "-DCALRT_MUTANT_BUSY_PREFILL_ONLY": ("kv_busy_in_flight", "while decode job", "KV-3", False),
    "-DCALRT_MUTANT_WAIT_TIMEOUT_32BIT": ("wait_timeout", "does not fit 32 bits", "JOB-3", False),
    "-DCALRT_MUTANT_RESET_CHIP_PAST_BOARD": ("memory_counters", "calrt_reset(CHIP) of chip 2", "OBS-2", False),
    "-DCALRT_MUTANT_PROFILES_FIRST_LAST": ("batch_lanes", "LAYOUT-2: a B4 decode of model-a", "LAYOUT-2", True),
    "-DCALRT_MUTANT_LANES_OF_FOUR": ("batch_lanes", "lane 4 (active): logits differ", "BATCH-2", True),
    "-DCALRT_MUTANT_MEMORY_FREE_AS_USED": ("memory_figures", "fewer than the weights", "MEM-2", False),
    "-DCALRT_MUTANT_BUSY_LANE0_ONLY": ("batch_lanes", "lane 3 of B4 decode job", "KV-3", True),
    "-DCALRT_MUTANT_FAILED_LANE0_ONLY": ("batch_lanes", "that failed, must return INVALID_ARGUMENT", "KV-2", True),
    "-DCALRT_MUTANT_CCU_HALTS_CHIP0": ("ccu_fault", "chip 1, whose job failed, reports FAULTED", "FAULT-1", False),
    "-DCALRT_MUTANT_RESET_NO_DRAIN_CHIP1": ("reset_drains_jobs", "by a chip reset of chip 1, yet", "RESET-3", False),
    "-DCALRT_MUTANT_RELEASED_WAIT_CACHED": (
        "job_states_timestamps",
        "released once its wait saw it end",
        "OWN-9",
        False,
    ),
    # what a reset keeps (the configuration, the clock) and drops (faults, queued jobs); counters; the queue's end;
    # telemetry units and attribution; the second model's context
    "-DCALRT_MUTANT_CHIP_RESET_LOSES_WEIGHTS": (
        "reset_drains_jobs",
        "computes other logits than before it",
        "RESET-5",
        False,
    ),
    "-DCALRT_MUTANT_STAMPS_BACKWARD_AFTER_RESET": (
        "reset_drains_jobs",
        "times must be CLOCK_MONOTONIC ns within its calls",
        "CONV-5",
        False,
    ),
    "-DCALRT_MUTANT_BOARD_RESET_KEEPS_FAULT": ("ccu_fault", "a board reset ends the fault", "FAULT-1", False),
    "-DCALRT_MUTANT_RESET_KEEPS_QUEUED": ("wait_timeout", "must end ABORTED", "RESET-1", False),
    "-DCALRT_MUTANT_ABORTED_END_ZERO": ("wait_timeout", "must report when it ended", "CONV-5", False),
    "-DCALRT_MUTANT_COUNTERS_CLEAR_ON_READ": ("memory_counters", "a read must not clear them", "OBS-1", False),
    "-DCALRT_MUTANT_PENDING_RUNNING_ONLY": ("reset_drains_jobs", "pending, queued ones too", "OBS-1", False),
    "-DCALRT_MUTANT_QUEUE_FULL_OOM": ("busy_retry", "is a full queue", "JOB-7", False),
    "-DCALRT_MUTANT_DUP_SEQ_LANES": ("batch_lanes", "both name sequence", "KV-1", True),
    "-DCALRT_MUTANT_TELEMETRY_CLOCK_GHZ": ("telemetry_struct", "clock_max_mhz 1 is outside", "TELEM-2", False),
    "-DCALRT_MUTANT_TELEMETRY_POWER_BOARD": ("telemetry_attribution", "at least half as much", "TELEM-6", False),
    "-DCALRT_MUTANT_KV_MAX_SEQ_FIRST_MODEL": ("kv_capacity_per_model", "calrt_kv_append of", "KV-9", False),
    "-DCALRT_MUTANT_BOARD_RESET_KEEPS_QUARANTINE": ("dma_quarantine", "a board reset covers chip", "OWN-7", False),
    "-DCALRT_MUTANT_START_AT_SUBMIT": ("stamps_are_run_time", "was still QUEUED behind job", "TIME-1", False),
    "-DCALRT_MUTANT_CALBIN_RELEASE_AFTER_UNLOAD_BUSY": (
        "configuration",
        "calrt_reset_configuration unloaded must succeed",
        "OWN-3",
        False,
    ),
    "-DCALRT_MUTANT_HEALTH_FAULT_ALL_CHIPS": ("ccu_fault", "halts only its chip", "FAULT-1", False),
    "-DCALRT_MUTANT_COUNTERS_FAILED_KEEPS_PENDING": ("ccu_fault", "the chip counts no job pending", "OBS-1", False),
    "-DCALRT_MUTANT_WAIT_ZERO_TIMEOUT_ON_DONE": ("wait_timeout", "with timeout 0 (a poll) of job", "JOB-8", False),
    "-DCALRT_MUTANT_CAN_ALLOCATE_UNCONFIGURED_INVALID": (
        "configuration",
        "calrt_kv_can_allocate before any configuration",
        "CFG-1",
        False,
    ),
    "-DCALRT_MUTANT_HUNG_LATCH_STICKY": ("wait_timeout", "it must report OK again", "OBS-1", False),
    "-DCALRT_MUTANT_CHIP_RESET_CLEARS_ALL_FAULTS": ("ccu_fault", "only a reset covering the chip", "FAULT-1", False),
    "-DCALRT_MUTANT_GRAPH_MASK_NOT_MODEL": ("raw_refusals", "outside its model's chips", "CALBIN-1", False),
    "-DCALRT_MUTANT_OUTPUT_SIZE_AT_B1": (
        "batch_lanes",
        "whose outputs buffer holds one lane's logits",
        "LAYOUT-1",
        True,
    ),
    "-DCALRT_MUTANT_DMA_QUARANTINE_INPUTS_ONLY": (
        "dma_quarantine",
        "calrt_buffer_release of the outputs",
        "OWN-7",
        False,
    ),
    "-DCALRT_MUTANT_DECODE_TOKENS_UNCHECKED": ("token_refusals", "a decode with token", "LAYOUT-3", False),
    "-DCALRT_MUTANT_WAIT_RETURNS_JOB_STATUS": ("ccu_fault", "must return OK with status CCU_EXCEPTION", "JOB-3", False),
    # caught by the checks as they stood: kept so that they stay caught
    "-DCALRT_MUTANT_KV_LENGTH_FREED_ZERO": (
        "configuration",
        "allocated before calrt_reset_configuration",
        "CFG-2",
        False,
    ),
    "-DCALRT_MUTANT_CHIP_RESET_KEEPS_RESERVED": ("chip_vs_board_reset", "reset empties", "RESET-1", False),
    "-DCALRT_MUTANT_HEALTH_NEVER_HUNG": ("wait_timeout", "the chip reports HUNG", "OBS-1", False),
    "-DCALRT_MUTANT_CAN_ALLOCATE_OFF_BY_ONE": ("configuration", "the next configuration must grant", "CFG-2", False),
    "-DCALRT_MUTANT_SUBMIT_REFUSED_KEEPS_BUFFERS": (
        "raw_refusals",
        "must return INVALID_ARGUMENT (10)",
        "LAYOUT-2",
        False,
    ),
    "-DCALRT_MUTANT_LANE_MASK_I32": ("batch_lanes", "LAYOUT-2: a B4 decode of model-a", "LAYOUT-2", True),
    "-DCALRT_MUTANT_RESET_NO_DRAIN_PONG": ("reset_drains_jobs", "written after calrt_reset returned", "RESET-3", False),
}


@pytest.fixture(scope="module")
def batch_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from calctl.compiler.sample import build_sample
    from calctl.signing.keys import load_private

    out = tmp_path_factory.mktemp("batch-sample") / "p"
    return build_sample(out, kind="combined", key=load_private(TEST_KEY), decode_profiles=(1, 4, 8))


@pytest.mark.parametrize("define", list(ISSUE_50), ids=lambda d: d.removeprefix("-DCALRT_MUTANT_").replace("=", "-"))
def test_conformance_fails_each_kind_of_issue_50_naming_the_clause(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory, batch_sample: Path, define: str
) -> None:
    """#50: a broken copy of the reference board per kind; the FAIL row names the check, the call and the ABI
    clause (docs/calrt-c-abi.md §13) it broke. The unmodified board passes the same (test_conformance.py)."""
    library = _mutant(tmp_path_factory, define)
    check, words, clause, level, batch = ISSUE_50[define]
    args = ["--package", batch_sample] if batch else []
    if level == "long":  # the one check the kind needs: the whole long level is minutes
        args += ["--check", check]
    r = cli("device", "conformance", "--calrt-lib", library, "--level", level, "--format", "json", *args)
    assert_no_traceback(r)
    assert r.code == 1, (define, r.out[-2000:], r.err[-2000:])
    row = {c["name"]: c for c in r.json["checks"]}[check]
    assert row["verdict"] == "FAIL" and words in row["detail"], (define, row)
    assert clause in row["clauses"] and row["call"], (define, row)


def test_a_global_lock_stamped_early_never_grades_parallel_c0(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """#50 (i): one global lock, start_ns stamped before taking it. The stamps show the chips overlapping; the
    host-observed bursts do not, so the vendor rows say the two disagree and are not C0."""
    library = _mutant(tmp_path_factory, "-DCALRT_MUTANT_GLOBAL_LOCK_EARLY_STAMP")
    r = cli(
        "device", "conformance", "--calrt-lib", library, "--level", "quick", "--format", "json",
        "--check", "concurrent_submit_two_chips", "--check", "two_in_flight_one_chip",
    )  # fmt: skip
    assert_no_traceback(r)
    rows = {q["source"].split(",")[0]: q for q in r.json["vendor_questions"]}
    for item in ("001 §15.2 item 2", "000 §20 item 3"):
        assert rows[item]["grade"] == "C1" and "disagree" in rows[item]["answer"], rows[item]


def _mutant(tmp_path_factory: pytest.TempPathFactory, define: str) -> Path:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (cc or gcc) on PATH: cannot build the reference board's mutants")
    from calctl.runtime._native.build import build_reference

    name = define.removeprefix("-DCALRT_MUTANT_").split("=")[0].lower()
    return build_reference(tmp_path_factory.mktemp(f"mutant-{name}"), defines=(define,)).library


@pytest.mark.parametrize("define", list(MUTANTS), ids=lambda d: d.removeprefix("-DCALRT_MUTANT_"))
def test_conformance_fails_a_broken_reference_board_naming_the_check(
    cli: Cli,
    tmp_path_factory: pytest.TempPathFactory,
    define: str,
) -> None:
    library = _mutant(tmp_path_factory, define)
    check, words = MUTANTS[define]
    r = cli(
        "device", "conformance", "--calrt-lib", library, "--check-timeout", "30", "--format", "json",
        "--level", "quick",
    )  # fmt: skip
    assert_no_traceback(r)
    assert r.code == 1, (define, r.out[-2000:], r.err[-2000:])
    rows = {c["name"]: c for c in r.json["checks"]}
    row = rows[check]
    assert row["verdict"] == "FAIL", (define, row)
    assert words in row["detail"], (define, row["detail"])
    assert row["call"], row  # the row names the call that showed it
    if define == "-DCALRT_MUTANT_SUBMIT_DEADLOCK":
        assert "calrt_job_submit" in row["call"], row
    # A bug fails its own check: every check after an abandoned process still ran, in a fresh one.
    assert [c["name"] for c in r.json["checks"]] == list(CHECK_NAMES)


def test_a_shim_of_another_abi_major_is_the_abi_version_fail_row(
    cli: Cli,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """calctl's loader refuses the library (exit 3 for every other command); conformance reports the refusal
    as abi_version's FAIL row, exit 1, and runs no other check."""
    library = _mutant(tmp_path_factory, "-DCALRT_MUTANT_ABI_MAJOR=2")
    r = cli("device", "conformance", "--calrt-lib", library, "--format", "json")
    assert_no_traceback(r)
    assert r.code == 1, (r.out[-2000:], r.err[-2000:])
    assert [(c["name"], c["verdict"], c["call"], c["returned"]) for c in r.json["checks"]] == [
        ("abi_version", "FAIL", "calrt_abi_version", "'2.0'")
    ]
    assert r.json["abi"] == "2.0" and "no other check ran" in r.json["note"]
    assert not list(schemas.iter_errors("report/v1", r.json)) and r.json["exit_code"] == 1  # the one report schema
    assert "C ABI 2.0: calctl needs 1.x" in r.json["checks"][0]["detail"]
    r = cli("device", "info", "--device", "calrt", "--calrt-lib", library)
    assert r.code == 3 and "C ABI 2.0 is incompatible" in r.err, (r.out, r.err)


def test_a_file_that_is_no_library_is_still_exit_3(cli: Cli, tmp_path: Path) -> None:
    fake = tmp_path / "libcalrt_shim.so"
    fake.write_text("not a library\n")
    r = cli("device", "conformance", "--calrt-lib", fake)
    assert_no_traceback(r)
    assert r.code == 3 and "cannot load" in r.err, (r.out, r.err)


def test_a_mutant_build_is_keyed_apart_from_the_board(tmp_path: Path) -> None:
    from calctl.errors import UsageError
    from calctl.runtime._native.build import build_reference, source_digest

    assert source_digest(("-DCALRT_MUTANT_UNLOAD_LEAK",)) != source_digest()
    with pytest.raises(UsageError, match="expected -DNAME"):
        build_reference(tmp_path, defines=("-O0 -DX",))


@pytest.mark.parametrize("define", list(VENDOR_DEADLINE), ids=lambda d: d.removeprefix("-DCALRT_MUTANT_").split("=")[0])
def test_conformance_fails_more_vendor_bugs_naming_the_clause(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory, batch_sample: Path, define: str
) -> None:
    """Only the check that owns the bug runs (``--check``): the full suite on each is the issue-50 test's job."""
    library = _mutant(tmp_path_factory, define)
    check, words, clause, batch = VENDOR_DEADLINE[define]
    args = ["--package", batch_sample] if batch else []
    r = cli(
        "device", "conformance", "--calrt-lib", library, "--level", "quick", "--format", "json", "--check", check,
        *args,
    )  # fmt: skip
    assert_no_traceback(r)
    assert r.code == 1, (define, r.out[-2000:], r.err[-2000:])
    row = {c["name"]: c for c in r.json["checks"]}[check]
    assert row["verdict"] == "FAIL" and words in row["detail"], (define, row)
    assert clause in row["clauses"] and row["call"], (define, row)
