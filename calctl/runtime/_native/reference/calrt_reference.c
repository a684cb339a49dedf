/*
 * calrt_reference.c -- the calctl reference board: the CalRT C ABI 1.0 (calrt.h) implemented
 * by a board model that really computes (docs/calrt-c-abi.md §12).
 *
 * It plays the part XRT's software emulation plays for XRT: the ctypes layer, the runners and
 * the serving engine run against real C threads, real completions and real numerics, with no
 * hardware. It is NOT a Calculet board and nothing it measures is evidence about one (docs/runtime.md §5).
 *
 * What it models:
 *   - one device per process, one current calbin, buffer ownership, job states with
 *     CLOCK_MONOTONIC timestamps, KV sequences per model alias, per-chip memory and counters,
 *     chip and board reset (the bookkeeping of the ABI, as tests/native/calrt_stub.c has it);
 *   - per chip a FIFO queue and two worker threads (one per ping/pong bank): jobs on different
 *     chips run at the same time; on one chip they start in submit order; an AUTO job runs alone,
 *     a PING and a PONG job may be in flight together (two-deep, 000 §14, 001 §9.3);
 *   - a job runs in three phases (h2d, compute, d2h) and a chip has one unit of each, so two jobs
 *     in flight on one chip overlap transfers with compute but never compute together;
 *   - time: prefill a + b*tokens, decode c + d*kv_tokens (the mock's defaults), times
 *     CALRT_REF_TIME_SCALE; the real compute time counts towards it;
 *   - compute: the package's decoder (RMSNorm, RoPE, GQA attention, SiLU MLP; optional q/k/v
 *     bias, q/k norm, untied lm_head), float32 with double accumulation, from the parameter
 *     blobs the calrt_ext_model_set extension names (calrt_ext.h); the KV cache of every sequence
 *     lives in board memory;
 *   - CALRT_REF_BOARD_LOCK=1: one board-wide lock around job execution (a global runtime lock),
 *     so the chips never overlap and a PoC must report S1.
 *
 * Fault switches: calrt_ext_fault_set(dev, fault, value), or CALRT_REF_FAULTS="busy=1,hang=1"
 * read at device open (names as in calrt_ext.h: busy, hang, ccu, dma, no_chip_memory,
 * no_chip_reset, reset_fail, delay_ms; reset_fail=N: the next N calrt_reset calls return
 * DEVICE_LOST and reset nothing).
 *
 * Mutants (compile-time switches, off in every build calctl makes; tests/unit/runtime builds them to prove
 * that `calctl device conformance` fails a shim with one realistic bug, docs/calrt-c-abi.md §13):
 *   -DCALRT_MUTANT_UNLOAD_LEAK        calrt_reset_configuration leaks 112.5 MiB of board memory per chip;
 *   -DCALRT_MUTANT_BOARD_RESET_KEEPS_KV  a board reset keeps every KV sequence with its length;
 *   -DCALRT_MUTANT_QUERY_NO_TAGS      calrt_job_query echoes no generation, engine or chip mask;
 *   -DCALRT_MUTANT_STALE_EVERY=N      every Nth job gets the previous job's logits;
 *   -DCALRT_MUTANT_SUBMIT_DEADLOCK    calrt_job_submit takes two locks in a chip-dependent order, so two
 *                                     threads submitting to the two chips at once deadlock;
 *   -DCALRT_MUTANT_ABI_MAJOR=N        calrt_abi_version reports N.0 (a shim built against another header);
 *   -DCALRT_MUTANT_RECONFIGURE        calrt_configure while a calbin is current replaces it (OK, not
 *                                     ALREADY_CONFIGURED);
 *   -DCALRT_MUTANT_BOARD_RESET_KEEPS_CONFIG  a board reset keeps the current calbin;
 *   -DCALRT_MUTANT_RELEASE_IN_FLIGHT  calrt_buffer_release of a buffer a job owns answers OK and drops the
 *                                     handle (the job's DMA would then write memory the caller gave back);
 *   -DCALRT_MUTANT_SUBMIT_OWNED_BUFFER  calrt_job_submit accepts a buffer a job in flight (or quarantine) owns;
 *   -DCALRT_MUTANT_GRAPH_PREFIX       graph names match by prefix (strncmp on the caller's length);
 *   -DCALRT_MUTANT_TIMEOUT_FREES_BUFFERS  a calrt_job_wait that times out hands the job's buffers back;
 *   -DCALRT_MUTANT_DMA_NO_QUARANTINE  a job that ends UNKNOWN_DMA_STATE gives its buffers back at once;
 *   -DCALRT_MUTANT_KV_FREE_IN_FLIGHT  calrt_kv_free succeeds on a sequence a job in flight is writing;
 *   -DCALRT_MUTANT_EARLY_DONE_EVERY=N  every Nth job is reported SUCCEEDED ~1 ms before its logits are written;
 *   -DCALRT_MUTANT_WATCHDOG_MS=N      a shim watchdog ends a job hung for N ms as SUCCEEDED, nothing written;
 *   -DCALRT_MUTANT_MEMORY_KIB         calrt_memory_usage reports KiB, not bytes;
 *   -DCALRT_MUTANT_MEMORY_USED_KIB    calrt_memory_usage reports the used figure in KiB (the total in bytes);
 *   -DCALRT_MUTANT_MEMORY_SWAPPED     calrt_memory_usage of chip c reports the other chip's figures;
 *   -DCALRT_MUTANT_RESET_NO_DRAIN     a reset returns while a job still computes; its DMA then writes the
 *                                     aborted job's outputs;
 *   -DCALRT_MUTANT_ANY_CHIP_MASK      calrt_calbin_create accepts chip masks of 0 and past the board;
 *   -DCALRT_MUTANT_SHORT_BUFFERS      calrt_job_submit accepts buffers shorter than the layout, n_kv != batch,
 *                                     a batch that is no profile and an unknown engine;
 *   -DCALRT_MUTANT_INACTIVE_LANE_KV   an inactive decode lane runs anyway, writing KV row 0 of the lane before's
 *                                     sequence;
 *   -DCALRT_MUTANT_GLOBAL_LOCK_EARLY_STAMP  one global lock around job execution, with start_ns stamped before
 *                                     the lock is taken (the time stamps show chips "in parallel");
 *   -DCALRT_MUTANT_KEEPS_KV_POINTER   calrt_job_submit keeps the caller's KV lane array and reads it at run time;
 *   -DCALRT_MUTANT_CHIP_RESET_ABORTS_ALL  a chip reset aborts the jobs of every chip (a board reset in disguise);
 *   -DCALRT_MUTANT_KV_ANY_MODEL       a job may name a sequence of another model (one KV namespace);
 *   -DCALRT_MUTANT_LANE_ORDER_REVERSED  a batch job's logits rows are written in reverse lane order (B>1);
 *   -DCALRT_MUTANT_KV_POS_PLUS_ONE    a B>1 decode job writes each lane's K/V row at position+1 (an off-by-one
 *                                     in the batched kernel's cache offset; B1 is right);
 *   -DCALRT_MUTANT_EARLY_DONE_WHEN_BUSY  a job is reported SUCCEEDED ~1 ms before its logits are written whenever
 *                                     the other chip is computing at the time (a completion raised before the
 *                                     output DMA, only under concurrency);
 *   -DCALRT_MUTANT_BUSY_SEQ_AS_INVALID  a submit naming a sequence a job in flight writes is INVALID_ARGUMENT,
 *                                     not DEVICE_BUSY (a status mapping swapped: "back off" becomes "your bug");
 *   -DCALRT_MUTANT_JOB_ID_REUSE       a job gets the lowest id no job record holds: a released job's id comes
 *                                     back at the next submit;
 *   -DCALRT_MUTANT_CHIP1_ON_CHIP0     every chip's jobs run on chip 0's units (one DMA engine and one compute
 *                                     unit behind two chip ids): results right, the chips' compute serialised
 *                                     (transfers still overlap it), start_ns stamped before the wait;
 *   -DCALRT_MUTANT_TIMEOUT_AS_ABORTED  a calrt_job_wait past its deadline returns JOB_ABORTED, not TIMEOUT;
 *   -DCALRT_MUTANT_QUERY_PREV_STAMPS  calrt_job_query reports the start/end stamps of the job submitted before
 *                                     (an off-by-one in the completion ring; calrt_job_wait is right);
 *   -DCALRT_MUTANT_WAIT_ZERO_FOREVER  calrt_job_wait with timeout 0 waits without a deadline (CalRT's Wait(0));
 *   -DCALRT_MUTANT_WAIT_TIMEOUT_NO_INFO  calrt_job_wait fills calrt_job_info only when the job is terminal;
 *   -DCALRT_MUTANT_KV_FREE_LEAKS_USED  calrt_kv_free of a sequence holding tokens never gives its slot back;
 *   -DCALRT_MUTANT_KV_REUSE_STALE_LENGTH  calrt_kv_allocate hands out the last freed slot with its old length;
 *   -DCALRT_MUTANT_KV_POS_OFF_PAST=N  a decode at position N or later writes its K/V row one position too far;
 *   -DCALRT_MUTANT_KV_POS_OFF_CHIP1   every decode on chip 1 writes its K/V row one position too far;
 *   -DCALRT_MUTANT_UNLOAD_LEAK_CHIP1  calrt_reset_configuration leaks 112.5 MiB on chip 1 only;
 *   -DCALRT_MUTANT_QUERY_RUNNING_AFTER_WAIT  calrt_job_query of a job a wait has seen end reports RUNNING;
 *   -DCALRT_MUTANT_CHIP_RESET_CLEARS_ALL_KV  a chip reset empties the sequences of every chip's models;
 *   -DCALRT_MUTANT_UNKNOWN_JOB_INTERNAL  an unknown job id is INTERNAL (99), not INVALID_ARGUMENT;
 *   -DCALRT_MUTANT_STAMPS_US          job time stamps in microseconds, not nanoseconds;
 *   -DCALRT_MUTANT_BATCH_COMPACT      a partly active batch job packs the active lanes' logits into rows 0..k-1;
 *   -DCALRT_MUTANT_CHIP_RESET_IGNORES_INDEX  a chip reset resets chip 0, whatever chip it names;
 *   -DCALRT_MUTANT_END_STAMP_AT_WAIT  end_ns is stamped when calrt_job_wait first sees the job done (0 before);
 *   -DCALRT_MUTANT_QUARANTINE_ANY_RESET  a reset of any chip frees every quarantined buffer;
 *   -DCALRT_MUTANT_REMOVE_TAIL_WHILE_RESERVED  calrt_kv_remove_tokens_at_end drops a pending reservation too;
 *   -DCALRT_MUTANT_WAIT_ANY_FIRST_INDEX  calrt_job_wait_any answers index 0 once any of its jobs is terminal;
 *   -DCALRT_MUTANT_TOKENS_WRAP        token ids are not range-checked: the embedding lookup wraps modulo vocab;
 *   -DCALRT_MUTANT_UNLOAD_KEEPS_KV    calrt_reset_configuration keeps every KV sequence (found after the unload);
 *   -DCALRT_MUTANT_PREFILL_ON_USED    a prefill into a sequence that holds tokens is accepted (rows from 0 again);
 *   -DCALRT_MUTANT_WAIT_TIMEOUT_US    calrt_job_wait reads its timeout as microseconds (returns TIMEOUT 1000x early);
 *   -DCALRT_MUTANT_WAIT_ANY_TIMEOUT_US  calrt_job_wait_any reads its timeout as microseconds;
 *   -DCALRT_MUTANT_KV_APPEND_PAST_CONTEXT  calrt_kv_append reserves one token past the context (`>` for `>=`); the
 *                                     kernel then overwrites the last cache row;
 *   -DCALRT_MUTANT_ROLLBACK_AFTER_FAIL_CLEARS  calrt_kv_rollback after a failed job empties the whole sequence;
 *   -DCALRT_MUTANT_COUNTERS_ABORTED_AS_FINISHED  an aborted job is counted finished, not failed;
 *   -DCALRT_MUTANT_CHIP_PAST_BOARD_CLAMPED  calrt_memory_usage, calrt_chip_counters and calrt_chip_health answer a
 *                                     chip past the board with the last chip's figures;
 *   -DCALRT_MUTANT_PREFILL_FEWER_THAN_RESERVED  a prefill whose valid length is below the reserved tokens runs; the
 *                                     commit then commits rows nothing wrote;
 *   -DCALRT_MUTANT_DECODE_POS_LANE0_ONLY  a batch decode checks lane 0's position only;
 *   -DCALRT_MUTANT_RELOAD_KEEPS_SLOTS  calrt_reset_configuration drops the sequences but keeps their pool slots
 *                                     taken: after a reload each model has fewer sequences;
 *   -DCALRT_MUTANT_STAMPS_REALTIME    job time stamps on CLOCK_REALTIME, not CLOCK_MONOTONIC;
 *   -DCALRT_MUTANT_CHIP_RESET_KEEPS_FAULT  a chip reset leaves the chip FAULTED (only a board reset clears it);
 *   -DCALRT_MUTANT_WAIT_ANY_FIRST_CHIP  calrt_job_wait_any looks only at the jobs on the first job's chip;
 *   -DCALRT_MUTANT_BOARD_RESET_LEAKS_PLAN  a board reset drops the configuration but never frees its memory;
 *   -DCALRT_MUTANT_AUTO_ECHO_BANK     an AUTO job's calrt_job_info reports the bank it was given (PING), not AUTO;
 *   -DCALRT_MUTANT_KV_FREE_REFUSES_RESERVED  calrt_kv_free of a sequence with a reservation pending is DEVICE_BUSY;
 *   -DCALRT_MUTANT_KV_APPEND_OUT_ON_REFUSAL  calrt_kv_append writes *position before it refuses;
 *   -DCALRT_MUTANT_PINGPONG_SHARED_STAGING  one logits staging area per chip: a PONG job's compute overwrites it
 *                                     while the PING job's d2h still reads it;
 *   -DCALRT_MUTANT_ROPE_TABLE_WRAP    rotary angles from a table of 128 positions, indexed modulo 128 (prefill and
 *                                     decode agree with each other, not with the model past position 127);
 *   -DCALRT_MUTANT_QUERY_VIA_WAIT_ZERO  calrt_job_query reads the state through CalRT's Wait(0), which has no
 *                                     deadline: a query of a job in flight blocks until it ends;
 *   -DCALRT_MUTANT_QUERY_BLOCKS_WHILE_COMPUTING  calrt_job_query takes the chip's compute lock: a query of a job
 *                                     that computes waits until it ends (a hung job, which never computes, is
 *                                     answered at once);
 *   -DCALRT_MUTANT_KEEPS_GRAPH_NAMES  calrt_calbin_create keeps the caller's graph-name pointers instead of
 *                                     copying the strings (a submit matches against whatever they hold now);
 *   -DCALRT_MUTANT_KEEPS_MODEL_ALIASES  calrt_calbin_create keeps the caller's model-alias pointers (KV calls and
 *                                     graphs resolve their model through whatever they hold now);
 *   -DCALRT_MUTANT_KV_CAPACITY_FIRST_MODEL  every model's KV pool is sized from the first model descriptor's
 *                                     kv_max_sequences (the loop reads models[0]);
 *   -DCALRT_MUTANT_FULL_BATCH_LAST_ROW  a B>1 decode with every lane active takes a fast path whose last lane's
 *                                     logits row is the row before it (a batch with an inactive lane is exact);
 *   -DCALRT_MUTANT_COUNTERS_CHIPS_SWAPPED  calrt_chip_counters of chip c reports the other chip's counters;
 *   -DCALRT_MUTANT_HEALTH_CHIPS_SWAPPED  calrt_chip_health of chip c reports the other chip's health;
 *   -DCALRT_MUTANT_REMOVE_TAIL_CLAMPS  calrt_kv_remove_tokens_at_end of more tokens than the sequence holds empties
 *                                     it and answers OK;
 *   -DCALRT_MUTANT_KV_LENGTH_SWAPPED  calrt_kv_length writes the reserved length into *committed and the committed
 *                                     into *reserved;
 *   -DCALRT_MUTANT_BUSY_WHEN_STARTED  a job's sequences are marked as being written when a worker starts it, not at
 *                                     submit: the KV calls on the sequence of a job still queued succeed;
 *   -DCALRT_MUTANT_TOPOLOGY_CORES_AS_CHIPS  calrt_topology_get counts the CalCores as chips (4 chips of 1 core,
 *                                     DRAM reported for each);
 *   -DCALRT_MUTANT_BUSY_PREFILL_ONLY  only a prefill marks its sequence as being written: the KV calls on the
 *                                     sequence of a decode job in flight succeed;
 *   -DCALRT_MUTANT_EARLY_DONE_AUTO_EVERY=N  as EARLY_DONE_EVERY, for every Nth job submitted on the AUTO engine
 *                                     (the one a sync-mode serving core asks for) only;
 *   -DCALRT_MUTANT_WATCHDOG_DECODE_MS=N  as WATCHDOG_MS, for decode jobs only (a watchdog tuned for decode steps);
 *   -DCALRT_MUTANT_RELEASED_WAIT_CACHED  calrt_job_wait of a released job answers OK from a cache of completions;
 *   -DCALRT_MUTANT_WAIT_TIMEOUT_32BIT  the waits' deadline is timeout_ms * 1000000 in 32 bits: 4295 ms is 33 us;
 *   -DCALRT_MUTANT_RESET_CHIP_PAST_BOARD  calrt_reset(CHIP) of a chip past the board answers OK and resets nothing;
 *   -DCALRT_MUTANT_PROFILES_FIRST_LAST  a graph keeps its first and last batch profiles only (B1 and B8 of 1,4,8);
 *   -DCALRT_MUTANT_LANES_OF_FOUR      a batch kernel unrolled by four: lane l >= 4 decodes at lane l - 4's position;
 *   -DCALRT_MUTANT_MEMORY_FREE_AS_USED  calrt_memory_usage reports the free bytes as used (GetMemoryUsage's other
 *                                     field);
 *   -DCALRT_MUTANT_BUSY_LANE0_ONLY    a job marks only lane 0's sequence as being written: the KV calls on another
 *                                     lane's sequence succeed while a batch job writes it;
 *   -DCALRT_MUTANT_FAILED_LANE0_ONLY  a failed job marks only lane 0's sequence failed: another lane's sequence
 *                                     commits the rows the failed job may have half written;
 *   -DCALRT_MUTANT_CCU_HALTS_CHIP0    a CCU exception halts chip 0, whichever chip raised it;
 *   -DCALRT_MUTANT_RESET_NO_DRAIN_CHIP1  as RESET_NO_DRAIN, for chip 1 only (the drain waits on chip 0's workers).
 *   -DCALRT_MUTANT_BOARD_RESET_NO_DRAIN  as RESET_NO_DRAIN, for a board reset only (the chip reset drains);
 *   -DCALRT_MUTANT_CHIP_RESET_LOSES_WEIGHTS  a chip reset clears the chip's memory and the weights are not loaded
 *                                     again: its next jobs succeed with other logits;
 *   -DCALRT_MUTANT_STAMPS_BACKWARD_AFTER_RESET  a reset restarts the chip's clock; the stamps keep the offset taken
 *                                     at open, so a job after the reset is stamped before it was submitted;
 *   -DCALRT_MUTANT_BOARD_RESET_KEEPS_FAULT  a board reset leaves a FAULTED chip FAULTED (the chip reset clears it);
 *   -DCALRT_MUTANT_QUEUE_FULL_OOM     a full chip queue refuses a submit with OUT_OF_MEMORY, not DEVICE_BUSY;
 *   -DCALRT_MUTANT_COUNTERS_CLEAR_ON_READ  calrt_chip_counters clears finished/failed when read (read-to-clear
 *                                     registers passed through);
 *   -DCALRT_MUTANT_PENDING_RUNNING_ONLY  pending counts the running jobs only, not the queued ones;
 *   -DCALRT_MUTANT_DUP_SEQ_LANES      a batch job naming one sequence in two lanes runs (each lane checked alone);
 *   -DCALRT_MUTANT_RESET_KEEPS_QUEUED  a chip reset aborts its running jobs only: the queued ones run after it;
 *   -DCALRT_MUTANT_TELEMETRY_CLOCK_GHZ  clock_mhz and clock_max_mhz in GHz;
 *   -DCALRT_MUTANT_TELEMETRY_POWER_BOARD  power_w is the board's (every chip's summed) for every chip;
 *   -DCALRT_MUTANT_KV_MAX_SEQ_FIRST_MODEL  every model's context (kv_max_seq) from the first model descriptor;
 *   -DCALRT_MUTANT_ABORTED_END_ZERO   a job aborted while it ran reports end_ns 0;
 *   -DCALRT_MUTANT_BOARD_RESET_KEEPS_QUARANTINE  a board reset leaves quarantined buffers quarantined (the chip
 *                                     reset lifts them);
 *   -DCALRT_MUTANT_START_AT_SUBMIT    start_ns is the runtime's enqueue stamp: a queued job reports it started at
 *                                     its submit;
 *   -DCALRT_MUTANT_CALBIN_RELEASE_AFTER_UNLOAD_BUSY  a calbin once configured is "in use" for ever: its release
 *                                     after calrt_reset_configuration is DEVICE_BUSY;
 *   -DCALRT_MUTANT_HEALTH_FAULT_ALL_CHIPS  calrt_chip_health reports FAULTED for every chip while one is faulted;
 *   -DCALRT_MUTANT_COUNTERS_FAILED_KEEPS_PENDING  a job that ends FAILED stays counted pending;
 *   -DCALRT_MUTANT_WAIT_ZERO_TIMEOUT_ON_DONE  calrt_job_wait with timeout 0 answers TIMEOUT, even of a job that
 *                                     ended (CalRT's Wait(0), "no deadline", kept away the wrong way);
 *   -DCALRT_MUTANT_CAN_ALLOCATE_UNCONFIGURED_INVALID  calrt_kv_can_allocate without a configuration is
 *                                     INVALID_ARGUMENT, not NOT_CONFIGURED;
 *   -DCALRT_MUTANT_HUNG_LATCH_STICKY  a chip once seen HUNG reports HUNG until a board reset;
 *   -DCALRT_MUTANT_CHIP_RESET_CLEARS_ALL_FAULTS  one board-wide fault latch: any chip reset clears every chip's fault;
 *   -DCALRT_MUTANT_GRAPH_MASK_NOT_MODEL  a graph's chip mask is not checked against its model's;
 *   -DCALRT_MUTANT_OUTPUT_SIZE_AT_B1  the outputs' size checked against the B1 layout (the manifest's [1, vocab]);
 *   -DCALRT_MUTANT_DMA_QUARANTINE_INPUTS_ONLY  after UNKNOWN_DMA_STATE only the inputs stay quarantined;
 *   -DCALRT_MUTANT_DECODE_TOKENS_UNCHECKED  token ids are range-checked on the prefill path only (a decode's wraps);
 *   (caught before they were written: -DCALRT_MUTANT_WAIT_TIMEOUT_ON_WAKEUP, a wait that returns TIMEOUT at any
 *   wake-up; -DCALRT_MUTANT_KV_LENGTH_FREED_ZERO, calrt_kv_length of an unknown sequence 0/0 OK;
 *   -DCALRT_MUTANT_CHIP_RESET_KEEPS_RESERVED, a chip reset empties the cache, not the reservation;
 *   -DCALRT_MUTANT_WAIT_RETURNS_JOB_STATUS, calrt_job_wait of a failed job returns its status code;
 *   -DCALRT_MUTANT_JOB_ID_PER_CHIP, job ids numbered per chip; -DCALRT_MUTANT_HEALTH_NEVER_HUNG, health never HUNG;
 *   -DCALRT_MUTANT_WAIT_ANY_TIMEOUT_ON_WAKEUP, the same for calrt_job_wait_any; -DCALRT_MUTANT_CAN_ALLOCATE_OFF_BY_ONE,
 *   calrt_kv_can_allocate refuses the last free slot; -DCALRT_MUTANT_SUBMIT_REFUSED_KEEPS_BUFFERS, a submit
 *   refused by its KV checks keeps the buffers; -DCALRT_MUTANT_LANE_MASK_I32, the lane mask read as int32;
 *   -DCALRT_MUTANT_RESET_NO_DRAIN_PONG, as RESET_NO_DRAIN for the PONG bank's jobs: the drain waits on AUTO and PING.)
 *
 * Inputs and outputs move like DMA: a job copies its input buffer at the start of h2d and writes
 * its output buffer at the end of d2h, both under the device mutex, and never after it was
 * aborted; a reset returns only when the workers of its chips have left the aborted jobs, so a
 * caller may free buffers, sequences and calbins as soon as it returns.
 */
#define _GNU_SOURCE
#ifdef CALRT_MUTANT_RESET_NO_DRAIN_PONG /* RESET_NO_DRAIN's machinery, its bug on the PONG bank's jobs only */
#define CALRT_MUTANT_RESET_NO_DRAIN 1
#define MUT_NO_DRAIN(j) ((j)->bank == CALRT_ENGINE_PONG)
#elif defined(CALRT_MUTANT_RESET_NO_DRAIN_CHIP1) /* RESET_NO_DRAIN's machinery, its bug on chip 1's jobs only */
#define CALRT_MUTANT_RESET_NO_DRAIN 1
#define MUT_NO_DRAIN(j) ((j)->info.chip_mask & 2u)
#elif defined(CALRT_MUTANT_BOARD_RESET_NO_DRAIN) /* RESET_NO_DRAIN's machinery, its bug on a board reset only */
#define CALRT_MUTANT_RESET_NO_DRAIN 1
#define MUT_NO_DRAIN(j) ((j)->mut_board_abort)
#elif defined(CALRT_MUTANT_RESET_NO_DRAIN)
#define MUT_NO_DRAIN(j) 1
#endif
#if defined(CALRT_MUTANT_EARLY_DONE_EVERY) || defined(CALRT_MUTANT_EARLY_DONE_WHEN_BUSY) || defined(CALRT_MUTANT_EARLY_DONE_AUTO_EVERY)
#define MUT_EARLY_DONE 1 /* the machinery of a completion raised before the outputs landed */
#endif
#include "calrt.h"
#include "calrt_ext.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define REF_CHIPS 2
#define REF_CALCORES 2
#define REF_BANKS 3 /* running slot per engine: AUTO, PING, PONG */
#define REF_WORKERS 2
#define REF_DRAM (16ULL << 30)
#define REF_BASELINE (64ULL << 20)
#define REF_MAX_LANES 64
#define REF_QUEUE_DEPTH 64

enum { PH_H2D = 0, PH_COMPUTE = 1, PH_D2H = 2 };

typedef struct {
    char *name;
    uint32_t dtype, rank;
    int64_t dims[CALRT_MAX_DIMS];
} tensor;

typedef struct {
    float *attn_norm, *wq, *wk, *wv, *wo, *mlp_norm, *w_gate, *w_up, *w_down;
    float *bq, *bk, *bv, *q_norm, *k_norm;
} layer_w;

typedef struct {
    int loaded;
    uint32_t n_layers, d, h, kvh, hd, ff, vocab, flags;
    double theta, eps;
    float *embed, *final_norm, *lm_head;
    layer_w *layers;
} net;

typedef struct {
    char *alias;
    uint32_t chip_mask, max_sequences, max_seq, live;
    net net;
} model;

typedef struct {
    char *name;
    model *model;
    uint32_t kind, chip_mask, max_seq, nprof;
    uint32_t prof[16];
    uint32_t nin, nout;
    tensor *in, *out;
    char *vlen, *pos, *lane;
} graph;

struct calrt_calbin {
    uint32_t ngraphs, nmodels;
    graph *graphs;
    model *models;
    char *path;
    uint64_t plan[CALRT_MAX_CHIPS];
    struct calrt_calbin *next;
#ifdef CALRT_MUTANT_CALBIN_RELEASE_AFTER_UNLOAD_BUSY
    int mut_was_current; /* the shim's "in use" flag, set by configure and never cleared */
#endif
};

struct calrt_buffer {
    unsigned char *data;
    uint64_t size;
    calrt_job_id owner;   /* job in flight (or quarantined) owning it, 0 = caller */
    uint32_t owner_mask;  /* chips of that job, so a reset knows whose buffers it frees */
    int quarantined;
    struct calrt_buffer *next;
};

typedef struct seq {
    calrt_kv_seq id;
    model *m;
    uint32_t committed, reserved;
    calrt_job_id busy;
    int last_failed;
    float *k, *v;         /* [layers][max_seq][kv_heads][head_dim]: board memory */
    struct seq *next;
} seq;

typedef struct job {
    calrt_job_info info;
    graph *g;
    calrt_buffer *in, *out;
    uint32_t batch, nkv, bank;
    calrt_kv_seq kv[REF_MAX_LANES];
    seq *seqs[REF_MAX_LANES];
    int fault;            /* 0, or CALRT_EXT_FAULT_HANG / _CCU / _DMA */
    int aborted;          /* a reset (or close) ended it; the worker must not touch its buffers */
    int hung;             /* running and hanging */
#ifdef CALRT_MUTANT_BOARD_RESET_NO_DRAIN
    int mut_board_abort;  /* a board reset aborted it */
#endif
    uint32_t tokens, kv_tokens;
    unsigned char *din;   /* the job's copy of its inputs (taken at h2d) */
    float *dout;          /* logits [batch][vocab] (copied out at d2h) */
    int compute_failed;
#ifdef CALRT_MUTANT_QUERY_RUNNING_AFTER_WAIT
    int mut_waited;       /* a calrt_job_wait saw it terminal */
#endif
#if defined(MUT_EARLY_DONE) || defined(CALRT_MUTANT_RESET_NO_DRAIN)
    int released;         /* calrt_job_release while a worker still holds it: the worker frees it */
#endif
#ifdef CALRT_MUTANT_KEEPS_KV_POINTER
    const calrt_kv_seq *caller_kv; /* the bug: the caller's array, read again when the job runs */
#endif
    struct job *next;     /* device list */
    struct job *qnext;    /* chip queue */
} job;

typedef struct {
    job *qhead, *qtail;
    uint32_t qlen;
    job *running[REF_BANKS];
    int unit_busy[3];
    uint32_t health;
#ifdef CALRT_MUTANT_HUNG_LATCH_STICKY
    int mut_hung_latch; /* the firmware's hang flag, which only a board reset clears */
#endif
    calrt_counters counters;
    pthread_t workers[REF_WORKERS];
#ifdef CALRT_MUTANT_PINGPONG_SHARED_STAGING
    float *mut_staging; /* (leaked at close: a mutant) */
    uint64_t mut_staging_n;
#endif
} chip;

struct calrt_device {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct calrt_calbin *calbins, *current;
    calrt_buffer *buffers;
    job *jobs;
    seq *seqs;
    uint64_t next_job, next_seq;
    chip chips[REF_CHIPS];
    int quit;
    int board_lock, board_busy;
    double time_scale;
    uint32_t f_busy, f_hang, f_ccu, f_dma, f_no_mem, f_no_chip_reset, f_reset_fail, delay_ms;
#ifdef CALRT_MUTANT_UNLOAD_LEAK
    uint64_t mut_leaked;         /* bytes lost per chip by every unload */
#endif
#ifdef CALRT_MUTANT_EARLY_DONE_AUTO_EVERY
    uint64_t mut_auto_jobs;      /* AUTO jobs that reached their d2h */
#endif
#ifdef CALRT_MUTANT_STALE_EVERY
    float *mut_last;             /* the last logits a job wrote */
    uint64_t mut_last_n;
#endif
#ifdef CALRT_MUTANT_QUERY_PREV_STAMPS
    uint64_t mut_ring[8][2];     /* start/end stamps of finished jobs by id % 8: the completion ring */
#endif
#ifdef CALRT_MUTANT_BOARD_RESET_LEAKS_PLAN
    uint64_t mut_board_leak[REF_CHIPS]; /* bytes a board reset never gave back, per chip */
#endif
#ifdef CALRT_MUTANT_RELEASED_WAIT_CACHED
    calrt_job_info mut_done[16]; /* the last completions released, by id % 16 */
#endif
#ifdef CALRT_MUTANT_RELOAD_KEEPS_SLOTS
    uint32_t mut_pool_taken[16]; /* the runtime's KV pool per model slot, which an unload never clears */
#endif
#ifdef CALRT_MUTANT_UNLOAD_LEAK_CHIP1
    uint64_t mut_leaked1;        /* bytes lost on chip 1 by every unload */
#endif
#ifdef CALRT_MUTANT_STAMPS_BACKWARD_AFTER_RESET
    uint64_t mut_open_ns, mut_reset_at[REF_CHIPS]; /* the device clock restarts at a reset; the offset is open's */
#endif
#ifdef CALRT_MUTANT_JOB_ID_PER_CHIP
    uint64_t mut_next_id[REF_CHIPS]; /* CalRT's job ids, numbered per chip queue */
#endif
#ifdef CALRT_MUTANT_KV_REUSE_STALE_LENGTH
    model *mut_freed_model;      /* the last freed slot: its model and its length, handed out again */
    uint32_t mut_freed_len;
#endif
};

typedef struct {
    calrt_device *d;
    uint32_t chip;
} worker_arg;

static pthread_mutex_t g_open_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_open = 0;
static worker_arg g_args[REF_CHIPS];

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static char *dupstr(const char *s) { return s ? strdup(s) : NULL; }

static uint32_t dtype_size(uint32_t d) {
    switch (d) {
    case CALRT_DTYPE_INT8: case CALRT_DTYPE_UINT8: return 1;
    case CALRT_DTYPE_INT16: case CALRT_DTYPE_FP16: case CALRT_DTYPE_BF16: return 2;
    case CALRT_DTYPE_INT32: case CALRT_DTYPE_FP32: return 4;
    case CALRT_DTYPE_INT64: return 8;
    default: return 0;
    }
}

static uint64_t tensor_bytes(const tensor *t, uint32_t batch) {
    uint64_t n = dtype_size(t->dtype);
    for (uint32_t i = 0; i < t->rank; i++) n *= (uint64_t)(t->dims[i] == CALRT_DIM_BATCH ? batch : t->dims[i]);
    return n;
}

/* Offset of tensor idx in a buffer laid out per the ABI (64-byte aligned, in order); *total gets the size. */
static uint64_t tensor_offset(const tensor *ts, uint32_t n, uint32_t idx, uint32_t batch, uint64_t *total) {
    uint64_t off = 0, found = 0;
    for (uint32_t i = 0; i < n; i++) {
        off += (CALRT_ALIGN - off % CALRT_ALIGN) % CALRT_ALIGN;
        if (i == idx) found = off;
        off += tensor_bytes(&ts[i], batch);
    }
    if (total) *total = off ? off : 1;
    return found;
}

static int find_tensor(const tensor *ts, uint32_t n, const char *name) {
    if (!name) return -1;
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(ts[i].name, name) == 0) return (int)i;
    return -1;
}

static int32_t read_i32(const graph *g, const unsigned char *data, int idx, uint32_t batch, uint32_t elem) {
    uint64_t off = tensor_offset(g->in, g->nin, (uint32_t)idx, batch, NULL) + 4ULL * elem;
    int32_t v;
    memcpy(&v, data + off, 4);
    return v;
}

#ifdef CALRT_MUTANT_LANE_MASK_I32
__attribute__((unused))
#endif
static uint8_t read_u8(const graph *g, const unsigned char *data, int idx, uint32_t batch, uint32_t elem) {
    return data[tensor_offset(g->in, g->nin, (uint32_t)idx, batch, NULL) + elem];
}

#ifdef CALRT_MUTANT_LANE_MASK_I32 /* the bug: the kernel's lane mask declared int32, the graph's is uint8 */
#define LANE_ON(g, data, idx, batch, l) (read_i32(g, data, idx, batch, l) != 0)
#else
#define LANE_ON(g, data, idx, batch, l) (read_u8(g, data, idx, batch, l) != 0)
#endif

static int lowest_chip(uint32_t mask) {
    for (int c = 0; c < REF_CHIPS; c++)
        if (mask >> c & 1) return c;
    return 0;
}

static seq *find_seq(calrt_device *d, calrt_kv_seq id) {
    for (seq *s = d->seqs; s; s = s->next)
        if (s->id == id) return s;
    return NULL;
}

static job *find_job(calrt_device *d, calrt_job_id id) {
    for (job *j = d->jobs; j; j = j->next)
        if (j->info.id == id) return j;
    return NULL;
}

static int terminal(uint32_t state) { return state >= CALRT_JOB_SUCCEEDED; }

#if defined(MUT_EARLY_DONE) || defined(CALRT_MUTANT_RESET_NO_DRAIN)
/* A worker holds the job (it runs on one of its chip's banks). */
static int picked(calrt_device *d, job *j) {
    chip *ch = &d->chips[lowest_chip(j->info.chip_mask)];
    for (int b = 0; b < REF_BANKS; b++)
        if (ch->running[b] == j) return 1;
    return 0;
}
#endif
#ifdef MUT_EARLY_DONE
static int known_buffer(calrt_device *d, calrt_buffer *b);
#endif
#ifdef CALRT_MUTANT_KEEPS_KV_POINTER
static int seq_storage(seq *s);
#endif
#ifdef CALRT_MUTANT_RESET_NO_DRAIN
#define RUN_STOP(d, j) (MUT_NO_DRAIN(j) ? (d)->quit : stop(d, j)) /* the bug: a started job ignores the abort */
#else
#define RUN_STOP(d, j) stop(d, j)
#endif

static void abs_deadline(uint64_t ns, struct timespec *ts) {
    ts->tv_sec = (time_t)(ns / 1000000000ULL);
    ts->tv_nsec = (long)(ns % 1000000000ULL);
}

static void wait_until(calrt_device *d, uint64_t deadline) {
    struct timespec ts;
    abs_deadline(deadline, &ts);
    pthread_cond_timedwait(&d->cv, &d->mu, &ts);
}

/* ------------------------------------------------------------------------- */
/* the decoder (float32 storage, double accumulation)                        */

static void matvec(const float *x, const float *w, uint32_t in, uint32_t out, const float *bias, float *y, double *acc) {
    for (uint32_t o = 0; o < out; o++) acc[o] = bias ? bias[o] : 0.0;
    for (uint32_t i = 0; i < in; i++) {
        double xi = x[i];
        const float *row = w + (uint64_t)i * out;
        for (uint32_t o = 0; o < out; o++) acc[o] += xi * row[o];
    }
    for (uint32_t o = 0; o < out; o++) y[o] = (float)acc[o];
}

static void rms_norm(const float *x, const float *w, uint32_t n, double eps, float *y) {
    double ss = 0;
    for (uint32_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (uint32_t i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
}

static void rope(float *x, uint32_t heads, uint32_t hd, uint32_t pos, double theta, int half) {
#ifdef CALRT_MUTANT_ROPE_TABLE_WRAP /* the bug: a cos/sin table of 128 positions, indexed modulo its size */
    pos %= 128;
#endif
    for (uint32_t i = 0; i < hd / 2; i++) {
        double inv = pow(theta, -(double)(2 * i) / hd);
        double ang = (double)pos * inv;
        float c = (float)cos(ang), s = (float)sin(ang);
        for (uint32_t hh = 0; hh < heads; hh++) {
            float *v = x + (uint64_t)hh * hd;
            uint32_t a = half ? i : 2 * i, b = half ? i + hd / 2 : 2 * i + 1;
            float x1 = v[a], x2 = v[b];
            v[a] = x1 * c - x2 * s;
            v[b] = x1 * s + x2 * c;
        }
    }
}

/* Run n tokens at positions start.. through the model, writing K/V into the sequence's cache;
 * logits of the last token go to out[vocab]. Returns 0, or -1 when memory runs out. */
static int forward(const net *m, seq *s, uint32_t max_seq, const int32_t *tokens, uint32_t n, uint32_t start, float *out) {
    uint32_t d = m->d, h = m->h, kvh = m->kvh, hd = m->hd, ff = m->ff, group = h / kvh;
    uint32_t qd = h * hd, kd = kvh * hd, end = start + n, wide = d > ff ? d : ff;
    if (wide < qd) wide = qd;
    if (wide < m->vocab) wide = m->vocab;
    float *x = malloc(sizeof(float) * (uint64_t)n * d), *a = malloc(sizeof(float) * d);
    float *q = malloc(sizeof(float) * (uint64_t)n * qd), *att = malloc(sizeof(float) * qd);
    float *g = malloc(sizeof(float) * ff), *u = malloc(sizeof(float) * ff), *t = malloc(sizeof(float) * wide);
    double *acc = malloc(sizeof(double) * wide), *sc = malloc(sizeof(double) * end);
    int rc = 0;
    if (!x || !a || !q || !att || !g || !u || !t || !acc || !sc) { rc = -1; goto done; }
#if defined(CALRT_MUTANT_TOKENS_WRAP) || defined(CALRT_MUTANT_DECODE_TOKENS_UNCHECKED) /* the kernel's lookup wraps */
    for (uint32_t i = 0; i < n; i++)
        memcpy(x + (uint64_t)i * d, m->embed + (uint64_t)((uint32_t)tokens[i] % m->vocab) * d, sizeof(float) * d);
#else
    for (uint32_t i = 0; i < n; i++) memcpy(x + (uint64_t)i * d, m->embed + (uint64_t)tokens[i] * d, sizeof(float) * d);
#endif
    uint64_t lstride = (uint64_t)max_seq * kd;
    double scale = 1.0 / sqrt((double)hd);
    for (uint32_t l = 0; l < m->n_layers; l++) {
        const layer_w *w = &m->layers[l];
        float *kc = s->k + l * lstride, *vc = s->v + l * lstride;
        for (uint32_t i = 0; i < n; i++) {
            float *qi = q + (uint64_t)i * qd, *ki = kc + (uint64_t)(start + i) * kd, *vi = vc + (uint64_t)(start + i) * kd;
            rms_norm(x + (uint64_t)i * d, w->attn_norm, d, m->eps, a);
            matvec(a, w->wq, d, qd, w->bq, qi, acc);
            matvec(a, w->wk, d, kd, w->bk, ki, acc);
            matvec(a, w->wv, d, kd, w->bv, vi, acc);
            if (m->flags & CALRT_EXT_QK_NORM) {
                for (uint32_t hh = 0; hh < h; hh++) rms_norm(qi + hh * hd, w->q_norm, hd, m->eps, qi + hh * hd);
                for (uint32_t hh = 0; hh < kvh; hh++) rms_norm(ki + hh * hd, w->k_norm, hd, m->eps, ki + hh * hd);
            }
            rope(qi, h, hd, start + i, m->theta, (m->flags & CALRT_EXT_ROPE_HALF) != 0);
            rope(ki, kvh, hd, start + i, m->theta, (m->flags & CALRT_EXT_ROPE_HALF) != 0);
        }
        for (uint32_t i = 0; i < n; i++) {
            uint32_t len = start + i + 1; /* query i attends to cached keys 0..start+i */
            const float *qi = q + (uint64_t)i * qd;
            for (uint32_t hh = 0; hh < h; hh++) {
                uint32_t kv = hh / group;
                double mx = -INFINITY, sum = 0;
                for (uint32_t p = 0; p < len; p++) {
                    const float *kp = kc + (uint64_t)p * kd + kv * hd;
                    double dot = 0;
                    for (uint32_t e = 0; e < hd; e++) dot += (double)qi[hh * hd + e] * kp[e];
                    sc[p] = dot * scale;
                    if (sc[p] > mx) mx = sc[p];
                }
                for (uint32_t p = 0; p < len; p++) sum += (sc[p] = exp(sc[p] - mx));
                for (uint32_t e = 0; e < hd; e++) {
                    double o = 0;
                    for (uint32_t p = 0; p < len; p++) o += sc[p] * vc[(uint64_t)p * kd + kv * hd + e];
                    att[hh * hd + e] = (float)(o / sum);
                }
            }
            float *xi = x + (uint64_t)i * d;
            matvec(att, w->wo, qd, d, NULL, t, acc);
            for (uint32_t e = 0; e < d; e++) xi[e] += t[e];
            rms_norm(xi, w->mlp_norm, d, m->eps, a);
            matvec(a, w->w_gate, d, ff, NULL, g, acc);
            matvec(a, w->w_up, d, ff, NULL, u, acc);
            for (uint32_t e = 0; e < ff; e++) g[e] = g[e] / (1.0f + expf(-g[e])) * u[e];
            matvec(g, w->w_down, ff, d, NULL, t, acc);
            for (uint32_t e = 0; e < d; e++) xi[e] += t[e];
        }
    }
    rms_norm(x + (uint64_t)(n - 1) * d, m->final_norm, d, m->eps, a);
    if (m->flags & CALRT_EXT_TIED_EMBEDDINGS) {
        for (uint32_t v = 0; v < m->vocab; v++) {
            const float *row = m->embed + (uint64_t)v * d;
            double dot = 0;
            for (uint32_t e = 0; e < d; e++) dot += (double)a[e] * row[e];
            out[v] = (float)dot;
        }
    } else {
        matvec(a, m->lm_head, d, m->vocab, NULL, out, acc);
    }
done:
    free(x); free(a); free(q); free(att); free(g); free(u); free(t); free(acc); free(sc);
    return rc;
}

/* Execute a job's graph on its private input copy: caches of active lanes updated, logits into dout. */
static int run_graph(job *j) {
    graph *gr = j->g;
    const net *m = &gr->model->net;
    uint32_t vocab = m->vocab;
    int tok = find_tensor(gr->in, gr->nin, "tokens");
    memset(j->dout, 0, sizeof(float) * (uint64_t)j->batch * vocab);
    if (gr->kind == CALRT_GRAPH_PREFILL) {
        int vl = find_tensor(gr->in, gr->nin, gr->vlen);
        uint32_t n = (uint32_t)read_i32(gr, j->din, vl, j->batch, 0);
        const int32_t *tokens = (const int32_t *)(j->din + tensor_offset(gr->in, gr->nin, (uint32_t)tok, j->batch, NULL));
#ifdef CALRT_MUTANT_KV_ANY_MODEL
        if (j->seqs[0]->m != gr->model) return 0;
#endif
        return forward(m, j->seqs[0], gr->model->max_seq, tokens, n, 0, j->dout);
    }
    int pos = find_tensor(gr->in, gr->nin, gr->pos), lane = find_tensor(gr->in, gr->nin, gr->lane);
#ifdef CALRT_MUTANT_BATCH_COMPACT
    uint32_t row = 0; /* the bug: the kernel packs the active lanes and writes their logits in that order */
#endif
    for (uint32_t l = 0; l < j->batch; l++) {
#ifdef CALRT_MUTANT_KV_ANY_MODEL /* (a foreign sequence's cache has another shape: not computed, no crash) */
        if (j->seqs[l] && j->seqs[l]->m != gr->model) continue;
#endif
        if (lane >= 0 && !LANE_ON(gr, j->din, lane, j->batch, l)) {
#ifdef CALRT_MUTANT_INACTIVE_LANE_KV /* the bug: the inactive lane runs on the lane before's sequence at position 0 */
            int32_t zero = 0;
            if (l > 0 && j->seqs[l - 1] &&
                forward(m, j->seqs[l - 1], gr->model->max_seq, &zero, 1, 0, j->dout + (uint64_t)l * vocab))
                return -1;
#endif
            continue;
        }
        int32_t token = read_i32(gr, j->din, tok, j->batch, l);
#ifdef CALRT_MUTANT_LANES_OF_FOUR /* the bug: the position is read from the lane's slot within a group of four */
        uint32_t p = (uint32_t)read_i32(gr, j->din, pos, j->batch, l % 4);
#else
        uint32_t p = (uint32_t)read_i32(gr, j->din, pos, j->batch, l);
#endif
#ifdef CALRT_MUTANT_KV_POS_PLUS_ONE /* the bug: the batched kernel's cache offset is one row too far */
        if (j->batch > 1 && p + 1 < gr->model->max_seq) p += 1;
#endif
#ifdef CALRT_MUTANT_KV_POS_OFF_PAST /* the bug: past the first cache page the row offset is one too far */
        if (p >= (CALRT_MUTANT_KV_POS_OFF_PAST) && p + 1 < gr->model->max_seq) p += 1;
#endif
#ifdef CALRT_MUTANT_KV_POS_OFF_CHIP1 /* the bug: chip 1's cache base is one row too far */
        if ((gr->model->chip_mask & 2) && p + 1 < gr->model->max_seq) p += 1;
#endif
#ifdef CALRT_MUTANT_KV_APPEND_PAST_CONTEXT /* the kernel clamps: the token past the context overwrites the last row */
        if (p >= gr->model->max_seq) p = gr->model->max_seq - 1;
#endif
#ifdef CALRT_MUTANT_BATCH_COMPACT
        if (forward(m, j->seqs[l], gr->model->max_seq, &token, 1, p, j->dout + (uint64_t)row++ * vocab)) return -1;
#else
        if (forward(m, j->seqs[l], gr->model->max_seq, &token, 1, p, j->dout + (uint64_t)l * vocab)) return -1;
#endif
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* job bookkeeping (device mutex held)                                       */

static void dequeue(chip *ch, job *j) {
    for (job **p = &ch->qhead; *p; p = &(*p)->qnext) {
        if (*p != j) continue;
        *p = j->qnext;
        if (ch->qtail == j) {
            ch->qtail = NULL;
            for (job *k = ch->qhead; k; k = k->qnext) ch->qtail = k;
        }
        ch->qlen--;
        j->qnext = NULL;
        return;
    }
}

#ifndef CALRT_REF_NO_TELEMETRY
static void telemetry_work(uint32_t chip_mask, uint64_t start_ns, uint64_t end_ns); /* the telemetry block below */
#endif
#ifdef CALRT_MUTANT_TELEMETRY_COUNTERS_RESET
static void mut_telemetry_reset(uint32_t mask, int board);
#endif

static void finish(calrt_device *d, job *j, uint32_t state, calrt_status status, int quarantine) {
    uint64_t t = now_ns();
#ifdef CALRT_MUTANT_END_STAMP_AT_WAIT /* the bug: the end is stamped by the wait that observes it */
    (void)t;
#elif defined(CALRT_MUTANT_ABORTED_END_ZERO) /* the bug: an aborted job's completion record is never written */
    if (j->info.start_ns && state != CALRT_JOB_ABORTED) j->info.end_ns = t > j->info.start_ns ? t : j->info.start_ns;
#else
    if (j->info.start_ns) j->info.end_ns = t > j->info.start_ns ? t : j->info.start_ns;
#endif
#ifndef CALRT_REF_NO_TELEMETRY
    if (j->info.start_ns) telemetry_work(j->info.chip_mask, j->info.start_ns, j->info.end_ns ? j->info.end_ns : t); /* it heats the chip */
#endif
    j->info.state = state;
    j->info.status = status;
#ifdef CALRT_MUTANT_QUERY_PREV_STAMPS
    d->mut_ring[j->info.id % 8][0] = j->info.start_ns, d->mut_ring[j->info.id % 8][1] = j->info.end_ns;
#endif
    for (int c = 0; c < REF_CHIPS; c++) {
        if (!(j->info.chip_mask >> c & 1)) continue;
#ifdef CALRT_MUTANT_COUNTERS_FAILED_KEEPS_PENDING /* the bug: the error path skips the pending decrement */
        if (state != CALRT_JOB_FAILED) d->chips[c].counters.pending--;
#else
        d->chips[c].counters.pending--;
#endif
#ifdef CALRT_MUTANT_COUNTERS_ABORTED_AS_FINISHED /* the bug: "ended without an error code" counted as finished */
        if (state == CALRT_JOB_SUCCEEDED || state == CALRT_JOB_ABORTED) d->chips[c].counters.finished++;
#else
        if (state == CALRT_JOB_SUCCEEDED) d->chips[c].counters.finished++;
#endif
        else d->chips[c].counters.failed++;
    }
#ifdef CALRT_MUTANT_DMA_NO_QUARANTINE /* the bug: the DMA state is unknown, the buffers are given back anyway */
    quarantine = 0;
#endif
    if (quarantine) {
        j->in->quarantined = j->out->quarantined = 1;
#ifdef CALRT_MUTANT_DMA_QUARANTINE_INPUTS_ONLY /* the bug: only the buffer the DMA read is held; the outputs go back */
        j->out->quarantined = 0, j->out->owner = 0, j->out->owner_mask = 0;
#endif
    } else {
        j->in->owner = j->out->owner = 0;
        j->in->owner_mask = j->out->owner_mask = 0;
    }
    for (uint32_t l = 0; l < j->nkv; l++) {
        seq *s = j->seqs[l];
        if (s && s->busy == j->info.id) {
            s->busy = 0;
#ifdef CALRT_MUTANT_FAILED_LANE0_ONLY /* the bug: the job's status lands on its first sequence only */
            s->last_failed = l == 0 && state != CALRT_JOB_SUCCEEDED;
#else
            s->last_failed = state != CALRT_JOB_SUCCEEDED;
#endif
        }
    }
#ifdef CALRT_MUTANT_RESET_NO_DRAIN
    if (picked(d, j)) { /* its worker still computes on them and frees them when it is done */
        pthread_cond_broadcast(&d->cv);
        return;
    }
#endif
    free(j->din); free(j->dout);
    j->din = NULL; j->dout = NULL;
    pthread_cond_broadcast(&d->cv);
}

static void abort_jobs(calrt_device *d, uint32_t mask, int include_running);

static int chips_idle(calrt_device *d, uint32_t mask) {
    for (int c = 0; c < REF_CHIPS; c++) {
        if (!(mask >> c & 1)) continue;
        for (int b = 0; b < REF_BANKS; b++)
#ifdef CALRT_MUTANT_RESET_NO_DRAIN_PONG /* the bug: the drain waits on the AUTO and PING banks' workers */
            if (b != CALRT_ENGINE_PONG && d->chips[c].running[b]) return 0;
#else
            if (d->chips[c].running[b]) return 0;
#endif
    }
    return 1;
}

/* ------------------------------------------------------------------------- */
/* the chip workers                                                          */

static job *startable(chip *ch) {
    job *head = ch->qhead;
    if (!head || ch->health != CALRT_HEALTH_OK) return NULL;
    for (int b = 0; b < REF_BANKS; b++)
        if (ch->running[b] && ch->running[b]->hung) return NULL; /* a hung job halts its chip */
    if (head->bank == CALRT_ENGINE_AUTO) {
        for (int b = 0; b < REF_BANKS; b++)
            if (ch->running[b]) return NULL;
        return head;
    }
    return ch->running[CALRT_ENGINE_AUTO] || ch->running[head->bank] ? NULL : head;
}


static double job_seconds(const calrt_device *d, const job *j) {
    /* the mock's default timing model (calctl/runtime/mock/timing.py), scaled */
    double base = j->g->kind == CALRT_GRAPH_PREFILL ? 0.004 + 0.00005 * j->tokens : 0.003 + 0.000005 * j->kv_tokens;
    return base * d->time_scale + d->delay_ms / 1000.0;
}

static int stop(const calrt_device *d, const job *j) { return j->aborted || d->quit; }

static int take_unit(calrt_device *d, chip *ch, job *j, int unit) {
    while (ch->unit_busy[unit] && !RUN_STOP(d, j)) pthread_cond_wait(&d->cv, &d->mu);
    if (RUN_STOP(d, j)) return 0;
    ch->unit_busy[unit] = 1;
    return 1;
}

static void give_unit(calrt_device *d, chip *ch, int unit) {
    ch->unit_busy[unit] = 0;
    pthread_cond_broadcast(&d->cv);
}

#ifdef MUT_EARLY_DONE
/* The bug: the job is reported SUCCEEDED, then its logits land ~1 ms later (a completion raised before the
 * last DMA of the outputs finished). */
static void early_done(calrt_device *d, job *j, uint64_t off, uint64_t n) {
    calrt_buffer *out = j->out;
    float *late = malloc(sizeof(float) * (n ? n : 1));
    if (late) memcpy(late, j->dout, sizeof(float) * n);
    finish(d, j, CALRT_JOB_SUCCEEDED, CALRT_OK, 0);
    pthread_mutex_unlock(&d->mu);
    struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
    pthread_mutex_lock(&d->mu);
    if (late && known_buffer(d, out) && off + sizeof(float) * n <= out->size) memcpy(out->data + off, late, sizeof(float) * n);
    free(late);
}
#endif

#ifdef CALRT_MUTANT_EARLY_DONE_WHEN_BUSY
/* Another chip than c is computing a job (the concurrency under which this shim's completion races its DMA). */
static int mut_other_chip_busy(calrt_device *d, uint32_t c) {
    for (uint32_t cc = 0; cc < REF_CHIPS; cc++)
        for (int b = 0; cc != c && b < REF_BANKS; b++)
            if (d->chips[cc].running[b] && !terminal(d->chips[cc].running[b]->info.state)) return 1;
    return 0;
}
#endif
#ifdef CALRT_MUTANT_LANE_ORDER_REVERSED
/* The bug: a batch's logits rows land in reverse lane order (row l gets lane B-1-l's logits). */
static void mut_reversed_rows(unsigned char *dst, const float *src, uint32_t batch, uint64_t n) {
    uint64_t row = batch ? n / batch : n;
    for (uint32_t l = 0; l < batch; l++) memcpy(dst + sizeof(float) * row * l, src + row * (batch - 1 - l), sizeof(float) * row);
}
#endif

/* Run one picked job to its end. Called and returns with the device mutex held; the mutex is
 * dropped while computing and while sleeping. An aborted job is left for the reset to finish. */
static void run_job(calrt_device *d, uint32_t c, job *j) {
#ifdef CALRT_MUTANT_CHIP1_ON_CHIP0 /* the bug: one core behind two chip ids; every chip's jobs take chip 0's units */
    chip *ch = &d->chips[0];
#else
    chip *ch = &d->chips[c];
#endif
    int held = 0;
#ifdef CALRT_MUTANT_GLOBAL_LOCK_EARLY_STAMP /* the bug: start_ns stamped before the global lock is taken */
    j->info.state = CALRT_JOB_RUNNING;
    j->info.start_ns = now_ns();
#endif
    if (d->board_lock) { /* CALRT_REF_BOARD_LOCK: one job on the whole board at a time */
        while (d->board_busy && !stop(d, j)) pthread_cond_wait(&d->cv, &d->mu);
        if (stop(d, j)) return;
        d->board_busy = held = 1;
    }
#ifdef CALRT_MUTANT_START_AT_SUBMIT /* the bug: the runtime's enqueue stamp reported as the start */
    j->info.state = CALRT_JOB_RUNNING;
    j->info.start_ns = j->info.submit_ns;
#elif !defined(CALRT_MUTANT_GLOBAL_LOCK_EARLY_STAMP)
    j->info.state = CALRT_JOB_RUNNING;
    j->info.start_ns = now_ns();
#endif
#ifdef CALRT_MUTANT_BUSY_WHEN_STARTED
    for (uint32_t l = 0; l < j->nkv; l++)
        if (j->seqs[l]) j->seqs[l]->busy = j->info.id;
#endif
    if (j->fault == CALRT_EXT_FAULT_HANG) {
        j->hung = 1;
#if defined(CALRT_MUTANT_WATCHDOG_MS) || defined(CALRT_MUTANT_WATCHDOG_DECODE_MS)
        /* the bug: a shim watchdog ends the hung job as a success, nothing written */
#ifdef CALRT_MUTANT_WATCHDOG_DECODE_MS /* tuned for decode steps: a prefill may take long */
        uint64_t bark = j->g->kind == CALRT_GRAPH_DECODE ? now_ns() + (uint64_t)(CALRT_MUTANT_WATCHDOG_DECODE_MS) * 1000000ULL
                                                        : UINT64_MAX / 2;
#else
        uint64_t bark = now_ns() + (uint64_t)(CALRT_MUTANT_WATCHDOG_MS) * 1000000ULL;
#endif
        while (!stop(d, j) && now_ns() < bark) wait_until(d, bark);
        if (!stop(d, j)) {
            j->hung = 0;
            finish(d, j, CALRT_JOB_SUCCEEDED, CALRT_OK, 0);
        }
#else
        while (!stop(d, j)) pthread_cond_wait(&d->cv, &d->mu);
#endif
        goto out;
    }
    static const double share[3] = {0.3, 0.4, 0.3}; /* h2d / compute / d2h, as the mock's default split */
    double total = job_seconds(d, j), debt = 0;
    for (int ph = PH_H2D; ph <= PH_D2H; ph++) {
        if (!take_unit(d, ch, j, ph)) goto out;
        uint64_t t0 = now_ns();
        if (ph == PH_H2D) {
            uint64_t need;
            tensor_offset(j->g->in, j->g->nin, 0, j->batch, &need);
#ifdef CALRT_MUTANT_SHORT_BUFFERS /* it copies what the buffer has */
            if (need > j->in->size) need = j->in->size;
#endif
#ifdef CALRT_MUTANT_KEEPS_KV_POINTER /* the bug: the lanes' sequences read from the caller's array now */
            for (uint32_t l = 0; l < j->nkv; l++) {
                seq *s = j->seqs[l] ? find_seq(d, j->caller_kv[l]) : NULL;
                if (s && seq_storage(s)) j->seqs[l] = s;
            }
#endif
            memcpy(j->din, j->in->data, need);
        } else if (ph == PH_COMPUTE && !j->fault) {
            pthread_mutex_unlock(&d->mu);
            int rc = run_graph(j);
            pthread_mutex_lock(&d->mu);
            if (rc) j->compute_failed = 1;
#ifdef CALRT_MUTANT_PINGPONG_SHARED_STAGING /* the bug: the chip's one staging area takes the logits */
            uint64_t want = sizeof(float) * (uint64_t)j->batch * j->g->model->net.vocab;
            if (ch->mut_staging_n < want) {
                free(ch->mut_staging);
                ch->mut_staging = malloc(want);
                ch->mut_staging_n = ch->mut_staging ? want : 0;
            }
            if (ch->mut_staging) memcpy(ch->mut_staging, j->dout, want);
#endif
        }
        double remaining = total * share[ph] - debt - (double)(now_ns() - t0) / 1e9;
        if (remaining > 0) {
            uint64_t until = now_ns() + (uint64_t)(remaining * 1e9);
            while (!RUN_STOP(d, j) && now_ns() < until) wait_until(d, until);
        }
        debt = remaining < 0 ? -remaining : 0;
        if (ph == PH_D2H && !RUN_STOP(d, j) && !j->fault && !j->compute_failed) {
            int lg = find_tensor(j->g->out, j->g->nout, "logits");
            uint64_t off = tensor_offset(j->g->out, j->g->nout, (uint32_t)lg, j->batch, NULL);
            uint64_t n = (uint64_t)j->batch * j->g->model->net.vocab;
#if defined(CALRT_MUTANT_SHORT_BUFFERS) || defined(CALRT_MUTANT_OUTPUT_SIZE_AT_B1) /* it writes what the buffer holds */
            if (off + sizeof(float) * n > j->out->size) n = off < j->out->size ? (j->out->size - off) / sizeof(float) : 0;
#endif
#ifdef CALRT_MUTANT_FULL_BATCH_LAST_ROW /* the bug: the full batch's last row is copied from the one before */
            {
                uint32_t act = 0;
                for (uint32_t l = 0; l < j->nkv; l++) act += j->seqs[l] != NULL;
                uint64_t row = n / (j->batch ? j->batch : 1);
                if (j->batch > 1 && act == j->batch) memcpy(j->dout + row * (j->batch - 1), j->dout + row * (j->batch - 2), sizeof(float) * row);
            }
#endif
#ifdef CALRT_MUTANT_EARLY_DONE_WHEN_BUSY
            if (mut_other_chip_busy(d, c)) {
                early_done(d, j, off, n);
                give_unit(d, ch, ph);
                goto out;
            }
#endif
#ifdef CALRT_MUTANT_EARLY_DONE_AUTO_EVERY
            if (j->bank == CALRT_ENGINE_AUTO && ++d->mut_auto_jobs % (CALRT_MUTANT_EARLY_DONE_AUTO_EVERY) == 0) {
                early_done(d, j, off, n);
                give_unit(d, ch, ph);
                goto out;
            }
#endif
#ifdef CALRT_MUTANT_EARLY_DONE_EVERY
            if (j->info.id % (CALRT_MUTANT_EARLY_DONE_EVERY) == 0) {
                early_done(d, j, off, n);
                give_unit(d, ch, ph);
                goto out;
            }
#endif
#ifdef CALRT_MUTANT_STALE_EVERY
            if (j->info.id % (CALRT_MUTANT_STALE_EVERY) == 0 && d->mut_last && d->mut_last_n >= n) {
                memcpy(j->out->data + off, d->mut_last, sizeof(float) * n); /* the bug: the previous job's output */
            } else {
                memcpy(j->out->data + off, j->dout, sizeof(float) * n);
            }
            free(d->mut_last);
            d->mut_last = malloc(sizeof(float) * n);
            if (d->mut_last) memcpy(d->mut_last, j->dout, sizeof(float) * n);
            d->mut_last_n = d->mut_last ? n : 0;
#elif defined(CALRT_MUTANT_LANE_ORDER_REVERSED)
            mut_reversed_rows(j->out->data + off, j->dout, j->batch, n);
#elif defined(CALRT_MUTANT_PINGPONG_SHARED_STAGING)
            memcpy(j->out->data + off, ch->mut_staging && ch->mut_staging_n >= sizeof(float) * n ? ch->mut_staging : j->dout,
                   sizeof(float) * n);
#else
            memcpy(j->out->data + off, j->dout, sizeof(float) * n);
#endif
        }
        give_unit(d, ch, ph);
        if (RUN_STOP(d, j)) goto out;
    }
#ifdef CALRT_MUTANT_RESET_NO_DRAIN
    if (terminal(j->info.state)) goto out; /* the reset ended it while it ran on */
#endif
    if (j->fault == CALRT_EXT_FAULT_CCU || j->fault == CALRT_EXT_FAULT_DMA) {
        int dma = j->fault == CALRT_EXT_FAULT_DMA;
        finish(d, j, CALRT_JOB_FAILED, dma ? CALRT_E_UNKNOWN_DMA_STATE : CALRT_E_CCU_EXCEPTION, dma);
#ifdef CALRT_MUTANT_CCU_HALTS_CHIP0 /* the bug: the exception handler halts the runtime's first chip */
        d->chips[0].health = CALRT_HEALTH_FAULTED;
#else
        d->chips[c].health = CALRT_HEALTH_FAULTED; /* the chip halts until a reset */
#endif
        abort_jobs(d, 1u << c, 0);
    } else if (j->compute_failed) {
        finish(d, j, CALRT_JOB_FAILED, CALRT_E_OUT_OF_MEMORY, 0);
    } else {
        finish(d, j, CALRT_JOB_SUCCEEDED, CALRT_OK, 0);
    }
out:
    if (held) {
        d->board_busy = 0;
        pthread_cond_broadcast(&d->cv);
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    calrt_device *d = wa->d;
    chip *ch = &d->chips[wa->chip];
    pthread_mutex_lock(&d->mu);
    for (;;) {
        job *j = NULL;
        while (!d->quit && !(j = startable(ch))) pthread_cond_wait(&d->cv, &d->mu);
        if (d->quit) break;
        dequeue(ch, j);
        ch->running[j->bank] = j;
        run_job(d, wa->chip, j);
        ch->running[j->bank] = NULL; /* the last touch of j: a reset finishes an aborted job after this */
#if defined(MUT_EARLY_DONE) || defined(CALRT_MUTANT_RESET_NO_DRAIN)
        if (terminal(j->info.state)) {
            free(j->din); free(j->dout);
            j->din = NULL; j->dout = NULL;
        }
        if (j->released) free(j); /* its record was released while this worker still held it */
#endif
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* Abort the jobs of the chips in mask. Queued ones end at once; with include_running, running
 * ones are told to stop, and they end (and their buffers come back) once their workers left. */
static void abort_jobs(calrt_device *d, uint32_t mask, int include_running) {
    int waiting = 0;
    for (job *j = d->jobs; j; j = j->next) {
        if (terminal(j->info.state) || !(j->info.chip_mask & mask) || j->aborted) continue;
        chip *ch = &d->chips[lowest_chip(j->info.chip_mask)];
        int picked = 0;
        for (int b = 0; b < REF_BANKS; b++) picked |= ch->running[b] == j;
        if (!picked) {
#ifdef CALRT_MUTANT_RESET_KEEPS_QUEUED /* the bug: a chip reset stops the running job; the queue runs on after it */
            if (mask != (1u << REF_CHIPS) - 1) continue;
#endif
            dequeue(ch, j);
            j->aborted = 1;
            finish(d, j, CALRT_JOB_ABORTED, CALRT_E_JOB_ABORTED, 0);
        } else if (include_running) {
            j->aborted = 1;
#ifdef CALRT_MUTANT_BOARD_RESET_NO_DRAIN
            j->mut_board_abort = mask == (1u << REF_CHIPS) - 1;
#endif
#ifdef CALRT_MUTANT_RESET_NO_DRAIN /* the bug: the job is reported aborted without waiting for its worker */
            if (MUT_NO_DRAIN(j)) {
                j->hung = 0;
                finish(d, j, CALRT_JOB_ABORTED, CALRT_E_JOB_ABORTED, 0);
            } else {
                waiting = 1;
            }
#else
            waiting = 1;
#endif
        }
    }
    if (!waiting) return;
    pthread_cond_broadcast(&d->cv);
    while (!chips_idle(d, mask)) pthread_cond_wait(&d->cv, &d->mu);
    for (job *j = d->jobs; j; j = j->next) {
        if (terminal(j->info.state) || !j->aborted) continue;
        j->hung = 0;
        finish(d, j, CALRT_JOB_ABORTED, CALRT_E_JOB_ABORTED, 0);
    }
}

/* ------------------------------------------------------------------------- */

static void parse_env(calrt_device *d) {
    const char *lock = getenv("CALRT_REF_BOARD_LOCK");
    d->board_lock = lock && *lock && strcmp(lock, "0") != 0;
#ifdef CALRT_MUTANT_GLOBAL_LOCK_EARLY_STAMP
    d->board_lock = 1; /* one global runtime lock, always */
#endif
    const char *scale = getenv("CALRT_REF_TIME_SCALE");
    d->time_scale = 1.0;
    if (scale && *scale) {
        char *end = NULL;
        double v = strtod(scale, &end);
        if (end && *end == 0 && v >= 0 && isfinite(v)) d->time_scale = v;
    }
    const char *env = getenv("CALRT_REF_FAULTS");
    if (!env) return;
    char *copy = strdup(env), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        uint32_t v = (uint32_t)strtoul(eq + 1, NULL, 10);
        if (!strcmp(tok, "busy")) d->f_busy = v;
        else if (!strcmp(tok, "hang")) d->f_hang = v;
        else if (!strcmp(tok, "ccu")) d->f_ccu = v;
        else if (!strcmp(tok, "dma")) d->f_dma = v;
        else if (!strcmp(tok, "no_chip_memory")) d->f_no_mem = v;
        else if (!strcmp(tok, "no_chip_reset")) d->f_no_chip_reset = v;
        else if (!strcmp(tok, "reset_fail")) d->f_reset_fail = v;
        else if (!strcmp(tok, "delay_ms")) d->delay_ms = v;
    }
    free(copy);
}

calrt_status calrt_ext_fault_set(calrt_device *d, uint32_t fault, uint32_t value) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = CALRT_OK;
    switch (fault) {
    case CALRT_EXT_FAULT_BUSY: d->f_busy = value; break;
    case CALRT_EXT_FAULT_HANG: d->f_hang = value; break;
    case CALRT_EXT_FAULT_CCU: d->f_ccu = value; break;
    case CALRT_EXT_FAULT_DMA: d->f_dma = value; break;
    case CALRT_EXT_FAULT_NO_CHIP_MEMORY: d->f_no_mem = value; break;
    case CALRT_EXT_FAULT_NO_CHIP_RESET: d->f_no_chip_reset = value; break;
    case CALRT_EXT_FAULT_RESET_FAIL: d->f_reset_fail = value; break;
    case CALRT_EXT_FAULT_DELAY_MS: d->delay_ms = value; break;
    default: rc = CALRT_E_INVALID_ARGUMENT;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_abi_version(uint32_t *major, uint32_t *minor) {
    if (!major || !minor) return CALRT_E_INVALID_ARGUMENT;
#ifdef CALRT_MUTANT_ABI_MAJOR
    *major = CALRT_MUTANT_ABI_MAJOR; /* the bug: built against another header */
#else
    *major = CALRT_ABI_MAJOR;
#endif
    *minor = CALRT_ABI_MINOR;
    return CALRT_OK;
}

const char *calrt_status_string(calrt_status s) {
    switch (s) {
    case CALRT_OK: return "ok";
    case CALRT_E_DEVICE_BUSY: return "device busy";
    case CALRT_E_TIMEOUT: return "timeout";
    case CALRT_E_ALREADY_CONFIGURED: return "already configured";
    case CALRT_E_NOT_CONFIGURED: return "not configured";
    case CALRT_E_INVALID_CALBIN: return "invalid calbin";
    case CALRT_E_OUT_OF_MEMORY: return "out of memory";
    case CALRT_E_CCU_EXCEPTION: return "CCU exception";
    case CALRT_E_UNKNOWN_DMA_STATE: return "unknown DMA state";
    case CALRT_E_DEVICE_LOST: return "device lost";
    case CALRT_E_INVALID_ARGUMENT: return "invalid argument";
    case CALRT_E_DEVICE_IN_USE: return "device in use";
    case CALRT_E_BUFFER_IN_USE: return "buffer in use";
    case CALRT_E_NOT_SUPPORTED: return "not supported";
    case CALRT_E_JOB_ABORTED: return "job aborted";
    default: return "internal error";
    }
}

calrt_status calrt_device_open(calrt_device **out) {
    if (!out) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_open_mu);
    if (g_open) {
        pthread_mutex_unlock(&g_open_mu);
        return CALRT_E_DEVICE_IN_USE;
    }
    calrt_device *d = calloc(1, sizeof *d);
    if (!d) {
        pthread_mutex_unlock(&g_open_mu);
        return CALRT_E_INTERNAL;
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&d->cv, &attr);
    pthread_condattr_destroy(&attr);
    d->next_job = d->next_seq = 1;
#ifdef CALRT_MUTANT_STAMPS_BACKWARD_AFTER_RESET
    d->mut_open_ns = now_ns();
#endif
#ifdef CALRT_MUTANT_JOB_ID_PER_CHIP
    for (int c = 0; c < REF_CHIPS; c++) d->mut_next_id[c] = 1;
#endif
    parse_env(d);
    int started = 0;
    for (uint32_t c = 0; c < REF_CHIPS; c++) {
        g_args[c].d = d;
        g_args[c].chip = c;
        for (int w = 0; w < REF_WORKERS; w++) {
            if (pthread_create(&d->chips[c].workers[w], NULL, worker_main, &g_args[c]) != 0) goto fail;
            started++;
        }
    }
    g_open = 1;
    pthread_mutex_unlock(&g_open_mu);
    *out = d;
    return CALRT_OK;
fail:
    pthread_mutex_lock(&d->mu);
    d->quit = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    for (int i = 0; i < started; i++) pthread_join(d->chips[i / REF_WORKERS].workers[i % REF_WORKERS], NULL);
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
    pthread_mutex_unlock(&g_open_mu);
    return CALRT_E_INTERNAL;
}

static void free_net(net *m) {
    free(m->embed); free(m->final_norm); free(m->lm_head);
    for (uint32_t l = 0; m->layers && l < m->n_layers; l++) {
        layer_w *w = &m->layers[l];
        free(w->attn_norm); free(w->wq); free(w->wk); free(w->wv); free(w->wo); free(w->mlp_norm);
        free(w->w_gate); free(w->w_up); free(w->w_down); free(w->bq); free(w->bk); free(w->bv);
        free(w->q_norm); free(w->k_norm);
    }
    free(m->layers);
    memset(m, 0, sizeof *m);
}

static void free_calbin(struct calrt_calbin *cb) {
    for (uint32_t i = 0; i < cb->ngraphs; i++) {
        graph *g = &cb->graphs[i];
        for (uint32_t k = 0; g->in && k < g->nin; k++) free(g->in[k].name);
        for (uint32_t k = 0; g->out && k < g->nout; k++) free(g->out[k].name);
#ifndef CALRT_MUTANT_KEEPS_GRAPH_NAMES
        free(g->name);
#endif
        free(g->in); free(g->out); free(g->vlen); free(g->pos); free(g->lane);
    }
    for (uint32_t i = 0; i < cb->nmodels; i++) {
#ifndef CALRT_MUTANT_KEEPS_MODEL_ALIASES
        free(cb->models[i].alias);
#endif
        free_net(&cb->models[i].net);
    }
    free(cb->graphs); free(cb->models); free(cb->path); free(cb);
}

static void free_seq(seq *s) {
    free(s->k); free(s->v); free(s);
}

static void free_seqs(calrt_device *d) {
    for (seq *s = d->seqs, *n; s; s = n) { n = s->next; free_seq(s); }
    d->seqs = NULL;
}

calrt_status calrt_device_close(calrt_device *d) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    abort_jobs(d, (1u << REF_CHIPS) - 1, 1);
    d->quit = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    for (int c = 0; c < REF_CHIPS; c++)
        for (int w = 0; w < REF_WORKERS; w++) pthread_join(d->chips[c].workers[w], NULL);
    for (job *j = d->jobs, *n; j; j = n) { n = j->next; free(j->din); free(j->dout); free(j); }
    for (calrt_buffer *b = d->buffers, *n; b; b = n) { n = b->next; free(b->data); free(b); }
    for (struct calrt_calbin *c = d->calbins, *n; c; c = n) { n = c->next; free_calbin(c); }
    free_seqs(d);
#ifdef CALRT_MUTANT_STALE_EVERY
    free(d->mut_last);
#endif
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
    pthread_mutex_lock(&g_open_mu);
    g_open = 0;
    pthread_mutex_unlock(&g_open_mu);
    return CALRT_OK;
}

calrt_status calrt_versions_get(calrt_device *d, calrt_versions *out) {
    if (!d || !out) return CALRT_E_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    snprintf(out->runtime, sizeof out->runtime, "0.7.6");
    snprintf(out->driver, sizeof out->driver, "1.0.0");
    snprintf(out->firmware, sizeof out->firmware, "reference (software model, no hardware)");
    return CALRT_OK;
}

calrt_status calrt_ext_device_identity(calrt_device *d, calrt_ext_identity *out) {
    if (!d || !out) return CALRT_E_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out); /* no board, so no PCI address: every process has its own */
    out->kind = CALRT_EXT_DEVICE_SOFTWARE_MODEL;
    return CALRT_OK;
}

calrt_status calrt_topology_get(calrt_device *d, calrt_topology *out) {
    if (!d || !out) return CALRT_E_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
#ifdef CALRT_MUTANT_TOPOLOGY_CORES_AS_CHIPS /* the bug: CalRT's core count read as the chip count */
    out->chips = REF_CHIPS * REF_CALCORES;
    out->calcores_per_chip = 1;
    for (int c = 0; c < CALRT_MAX_CHIPS; c++) out->dram_bytes[c] = c < (int)out->chips ? REF_DRAM : CALRT_UNKNOWN_U64;
#else
    out->chips = REF_CHIPS;
    out->calcores_per_chip = REF_CALCORES;
    for (int c = 0; c < CALRT_MAX_CHIPS; c++) out->dram_bytes[c] = c < REF_CHIPS ? REF_DRAM : CALRT_UNKNOWN_U64;
#endif
    return CALRT_OK;
}

static int copy_tensors(tensor **dst, const calrt_tensor_desc *src, uint32_t n) {
    *dst = calloc(n ? n : 1, sizeof(tensor));
    if (!*dst || (n && !src)) return 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!src[i].name || src[i].rank > CALRT_MAX_DIMS || !dtype_size(src[i].dtype)) return 0;
        for (uint32_t k = 0; k < src[i].rank; k++)
            if (src[i].dims[k] != CALRT_DIM_BATCH && (src[i].dims[k] < 1 || src[i].dims[k] > (1 << 24))) return 0;
        (*dst)[i].name = strdup(src[i].name);
        (*dst)[i].dtype = src[i].dtype;
        (*dst)[i].rank = src[i].rank;
        memcpy((*dst)[i].dims, src[i].dims, sizeof src[i].dims);
    }
    return 1;
}

calrt_status calrt_calbin_create(calrt_device *d, const calrt_calbin_desc *desc, calrt_calbin **out) {
    if (!d || !desc || !out || !desc->path) return CALRT_E_INVALID_ARGUMENT;
    struct stat st;
    if (stat(desc->path, &st) != 0 || !S_ISDIR(st.st_mode)) return CALRT_E_INVALID_CALBIN;
    if (desc->n_graphs == 0 || desc->n_models == 0 || desc->n_chips > REF_CHIPS || !desc->graphs || !desc->models ||
        (desc->n_chips && !desc->plan_bytes))
        return CALRT_E_INVALID_CALBIN;
    struct calrt_calbin *cb = calloc(1, sizeof *cb);
    if (!cb) return CALRT_E_INTERNAL;
    cb->path = strdup(desc->path);
    cb->nmodels = desc->n_models;
    cb->models = calloc(desc->n_models, sizeof(model));
    cb->ngraphs = desc->n_graphs;
    cb->graphs = calloc(desc->n_graphs, sizeof(graph));
    calrt_status rc = cb->models && cb->graphs ? CALRT_OK : CALRT_E_INTERNAL;
    for (uint32_t i = 0; rc == CALRT_OK && i < desc->n_models; i++) {
        const calrt_model_desc *m = &desc->models[i];
#ifdef CALRT_MUTANT_KEEPS_MODEL_ALIASES /* the bug: the caller's string, not a copy */
        cb->models[i].alias = (char *)m->alias;
#else
        cb->models[i].alias = dupstr(m->alias);
#endif
        cb->models[i].chip_mask = m->chip_mask;
#ifdef CALRT_MUTANT_KV_CAPACITY_FIRST_MODEL /* the bug: the loop reads the first descriptor's capacity */
        cb->models[i].max_sequences = desc->models[0].kv_max_sequences;
#else
        cb->models[i].max_sequences = m->kv_max_sequences;
#endif
#ifdef CALRT_MUTANT_KV_MAX_SEQ_FIRST_MODEL /* the bug: the loop reads the first descriptor's context */
        cb->models[i].max_seq = desc->models[0].kv_max_seq;
#else
        cb->models[i].max_seq = m->kv_max_seq;
#endif
#ifdef CALRT_MUTANT_ANY_CHIP_MASK /* the bug: chip masks are not checked against the board */
        if (!m->alias) rc = CALRT_E_INVALID_CALBIN;
#else
        if (!m->alias || m->chip_mask == 0 || m->chip_mask >> REF_CHIPS) rc = CALRT_E_INVALID_CALBIN;
#endif
        for (uint32_t k = 0; rc == CALRT_OK && k < i; k++)
            if (!strcmp(cb->models[k].alias, m->alias)) rc = CALRT_E_INVALID_CALBIN;
    }
    for (uint32_t i = 0; i < desc->n_graphs && rc == CALRT_OK; i++) {
        const calrt_graph_desc *gd = &desc->graphs[i];
        graph *g = &cb->graphs[i];
#ifdef CALRT_MUTANT_KEEPS_GRAPH_NAMES /* the bug: the caller's string, not a copy */
        g->name = (char *)gd->name;
#else
        g->name = dupstr(gd->name);
#endif
        g->kind = gd->kind;
        g->chip_mask = gd->chip_mask;
        g->max_seq = gd->max_seq;
        g->vlen = dupstr(gd->valid_length_input);
        g->pos = dupstr(gd->positions_input);
        g->lane = dupstr(gd->lane_valid_input);
        g->nin = gd->n_inputs;
        g->nout = gd->n_outputs;
        if (!copy_tensors(&g->in, gd->inputs, gd->n_inputs) || !copy_tensors(&g->out, gd->outputs, gd->n_outputs)) rc = CALRT_E_INVALID_CALBIN;
#ifdef CALRT_MUTANT_ANY_CHIP_MASK
        if (!g->name || !gd->model || gd->kind > CALRT_GRAPH_DECODE || gd->n_batch_profiles == 0 ||
            gd->n_batch_profiles > 16 || !gd->batch_profiles)
            rc = CALRT_E_INVALID_CALBIN;
#else
        if (!g->name || !gd->model || gd->kind > CALRT_GRAPH_DECODE || gd->chip_mask == 0 || gd->chip_mask >> REF_CHIPS ||
            gd->n_batch_profiles == 0 || gd->n_batch_profiles > 16 || !gd->batch_profiles)
            rc = CALRT_E_INVALID_CALBIN;
#endif
        for (uint32_t k = 0; rc == CALRT_OK && k < gd->n_batch_profiles; k++) {
            if (gd->batch_profiles[k] == 0 || gd->batch_profiles[k] > REF_MAX_LANES) rc = CALRT_E_INVALID_CALBIN;
#ifdef CALRT_MUTANT_PROFILES_FIRST_LAST /* the bug: the profile table is read as a (min, max) pair */
            if (k != 0 && k + 1 != gd->n_batch_profiles) continue;
#endif
            g->prof[g->nprof++] = gd->batch_profiles[k];
        }
        for (uint32_t k = 0; rc == CALRT_OK && k < i; k++)
            if (!strcmp(cb->graphs[k].name, g->name)) rc = CALRT_E_INVALID_CALBIN; /* duplicate name */
        for (uint32_t k = 0; rc == CALRT_OK && k < cb->nmodels; k++)
            if (!strcmp(cb->models[k].alias, gd->model)) g->model = &cb->models[k];
#ifdef CALRT_MUTANT_ANY_CHIP_MASK
        if (rc == CALRT_OK && !g->model) rc = CALRT_E_INVALID_CALBIN;
#elif defined(CALRT_MUTANT_GRAPH_MASK_NOT_MODEL) /* the bug: a graph's chips are not checked against its model's */
        if (rc == CALRT_OK && !g->model) rc = CALRT_E_INVALID_CALBIN;
#else
        if (rc == CALRT_OK && (!g->model || (g->chip_mask & ~g->model->chip_mask))) rc = CALRT_E_INVALID_CALBIN;
#endif
        /* one chip per graph on this board: an MCHIP graph needs cross-chip compute it does not model */
        if (rc == CALRT_OK && (g->chip_mask & (g->chip_mask - 1))) rc = CALRT_E_INVALID_CALBIN;
    }
    for (uint32_t c = 0; c < desc->n_chips && rc == CALRT_OK; c++) cb->plan[c] = desc->plan_bytes[c];
    if (rc != CALRT_OK) {
        free_calbin(cb);
        return rc;
    }
    pthread_mutex_lock(&d->mu);
    cb->next = d->calbins;
    d->calbins = cb;
    pthread_mutex_unlock(&d->mu);
    *out = cb;
    return CALRT_OK;
}

static int known_calbin(calrt_device *d, struct calrt_calbin *cb) {
    for (struct calrt_calbin *p = d->calbins; p; p = p->next)
        if (p == cb) return 1;
    return 0;
}

calrt_status calrt_calbin_release(calrt_device *d, calrt_calbin *cb) {
    if (!d || !cb) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = CALRT_E_INVALID_ARGUMENT;
#ifdef CALRT_MUTANT_CALBIN_RELEASE_AFTER_UNLOAD_BUSY /* the bug: once configured, always "in use" */
    if (d->current == cb || cb->mut_was_current) {
#else
    if (d->current == cb) {
#endif
        rc = CALRT_E_DEVICE_BUSY;
    } else {
        for (struct calrt_calbin **p = &d->calbins; *p; p = &(*p)->next) {
            if (*p == cb) {
                *p = cb->next;
                free_calbin(cb);
                rc = CALRT_OK;
                break;
            }
        }
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* extension: model v1                                                       */

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static int safe_relative(const char *p) {
    if (!p || !*p || p[0] == '/') return 0;
    for (const char *s = p; *s;) {
        const char *e = strchr(s, '/');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n == 0 || (n == 2 && s[0] == '.' && s[1] == '.')) return 0;
        s += n + (e ? 1 : 0);
    }
    return 1;
}

static uint32_t block_bytes(uint32_t dtype) {
    switch (dtype) {
    case CALRT_EXT_DTYPE_Q4_0: return 18;
    case CALRT_EXT_DTYPE_Q4_1: return 20;
    case CALRT_EXT_DTYPE_Q8_0: return 34;
    default: return 0;
    }
}

static FILE *open_param(const char *root, const calrt_ext_param *p) {
    if (!safe_relative(p->file)) return NULL;
    size_t plen = strlen(root) + strlen(p->file) + 2;
    char *path = malloc(plen);
    if (!path) return NULL;
    snprintf(path, plen, "%s/%s", root, p->file);
    FILE *f = fopen(path, "rb");
    free(path);
    return f;
}

/* A matrix kept in GGML blocks, dequantised to float32 in the manifest's layout: `rows` x `cols` stored (blocks
 * along cols), written transposed (out[c * rows + r]) unless `row_major` (the embedding). The board then computes
 * in float32 on exactly the dequantised weights, as the mock's numpy path does. NULL on any problem. */
static float *read_blocks(const char *root, const calrt_ext_param *p, uint64_t rows, uint64_t cols, int row_major) {
    uint32_t bb = block_bytes(p->dtype);
    if (!bb || cols % 32 || rows * cols != p->elements || p->elements == 0 || p->elements > (1ULL << 32)) return NULL;
    FILE *f = open_param(root, p);
    if (!f) return NULL;
    size_t nbytes = (size_t)(rows * (cols / 32) * bb);
    unsigned char *raw = malloc(nbytes);
    float *out = malloc(sizeof(float) * p->elements);
    int ok = raw && out && fseeko(f, (off_t)p->offset, SEEK_SET) == 0 && fread(raw, 1, nbytes, f) == nbytes;
    fclose(f);
    for (uint64_t r = 0; ok && r < rows; r++) {
        for (uint64_t b = 0; b < cols / 32; b++) {
            const unsigned char *blk = raw + (r * (cols / 32) + b) * bb;
            uint16_t h;
            memcpy(&h, blk, 2);
            float d = half_to_float(h), m = 0.0f;
            if (p->dtype == CALRT_EXT_DTYPE_Q4_1) {
                memcpy(&h, blk + 2, 2);
                m = half_to_float(h);
            }
            for (int i = 0; i < 32; i++) {
                float w;
                if (p->dtype == CALRT_EXT_DTYPE_Q8_0) {
                    w = (float)(int8_t)blk[2 + i] * d;
                } else {
                    const unsigned char *qs = blk + (p->dtype == CALRT_EXT_DTYPE_Q4_0 ? 2 : 4);
                    int q = i < 16 ? (qs[i] & 0x0f) : (qs[i - 16] >> 4);
                    w = p->dtype == CALRT_EXT_DTYPE_Q4_0 ? (float)(q - 8) * d : (float)q * d + m;
                }
                uint64_t c = b * 32 + (uint64_t)i;
                out[row_major ? r * cols + c : c * rows + r] = w;
            }
        }
    }
    free(raw);
    if (!ok) { free(out); return NULL; }
    return out;
}

/* Read one parameter tensor as float32; NULL on any problem. */
static float *read_param(const char *root, const calrt_ext_param *p) {
    uint32_t size = dtype_size(p->dtype);
    if (p->elements == 0 || p->elements > (1ULL << 32) ||
        (p->dtype != CALRT_DTYPE_FP32 && p->dtype != CALRT_DTYPE_FP16 && p->dtype != CALRT_DTYPE_BF16))
        return NULL;
    FILE *f = open_param(root, p); /* refuses a path outside the package root */
    if (!f) return NULL;
    float *out = malloc(sizeof(float) * p->elements);
    unsigned char *raw = size == 4 ? (unsigned char *)out : malloc((size_t)size * p->elements);
    int ok = out && raw && fseeko(f, (off_t)p->offset, SEEK_SET) == 0 && fread(raw, size, p->elements, f) == p->elements;
    fclose(f);
    if (ok && size == 2) {
        for (uint64_t i = 0; i < p->elements; i++) {
            uint16_t h;
            memcpy(&h, raw + 2 * i, 2);
            if (p->dtype == CALRT_DTYPE_BF16) {
                uint32_t bits = (uint32_t)h << 16;
                memcpy(&out[i], &bits, 4);
            } else {
                out[i] = half_to_float(h);
            }
        }
    }
    if (size == 2) free(raw);
    if (!ok) { free(out); return NULL; }
    return out;
}

/* The graph I/O contract the board computes (the calctl tiny-decoder contract, docs/runtime.md). */
static int graph_contract_ok(const graph *g, uint32_t vocab) {
    if (g->nout != 1 || strcmp(g->out[0].name, "logits") || g->out[0].dtype != CALRT_DTYPE_FP32 || g->out[0].rank != 2 ||
        g->out[0].dims[1] != (int64_t)vocab)
        return 0;
    int tok = find_tensor(g->in, g->nin, "tokens");
    if (tok < 0 || g->in[tok].dtype != CALRT_DTYPE_INT32 || g->in[tok].rank != 2) return 0;
    if (g->kind == CALRT_GRAPH_PREFILL) {
        int vl = find_tensor(g->in, g->nin, g->vlen);
        if (g->out[0].dims[0] != 1 || g->in[tok].dims[0] != 1 || g->in[tok].dims[1] < 1) return 0;
        if (g->in[tok].dims[1] > (int64_t)g->model->max_seq) return 0;
        if (vl < 0 || g->in[vl].dtype != CALRT_DTYPE_INT32) return 0;
        for (uint32_t k = 0; k < g->nprof; k++)
            if (g->prof[k] != 1) return 0;
        return 1;
    }
    int pos = find_tensor(g->in, g->nin, g->pos), lane = find_tensor(g->in, g->nin, g->lane);
    if (g->out[0].dims[0] != CALRT_DIM_BATCH || g->in[tok].dims[0] != CALRT_DIM_BATCH || g->in[tok].dims[1] != 1) return 0;
    if (pos < 0 || g->in[pos].dtype != CALRT_DTYPE_INT32) return 0;
    if (g->lane && (lane < 0 || g->in[lane].dtype != CALRT_DTYPE_UINT8)) return 0;
    return 1;
}

calrt_status calrt_ext_model_set(calrt_device *d, calrt_calbin *cb, const calrt_ext_model_desc *desc) {
    if (!d || !cb || !desc) return CALRT_E_INVALID_ARGUMENT;
    if (desc->version != CALRT_EXT_MODEL_VERSION) return CALRT_E_NOT_SUPPORTED;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = !known_calbin(d, cb) ? CALRT_E_INVALID_ARGUMENT : d->current == cb ? CALRT_E_DEVICE_BUSY : CALRT_OK;
    pthread_mutex_unlock(&d->mu);
    if (rc != CALRT_OK) return rc;
    model *m = NULL;
    for (uint32_t i = 0; desc->alias && i < cb->nmodels; i++)
        if (!strcmp(cb->models[i].alias, desc->alias)) m = &cb->models[i];
    if (!m) return CALRT_E_INVALID_ARGUMENT;
    uint32_t L = desc->n_layers, D = desc->d_model, H = desc->n_heads, KVH = desc->n_kv_heads, HD = desc->head_dim;
    uint32_t FF = desc->d_ff, V = desc->vocab_size;
    if (!L || !D || !H || !KVH || !HD || !FF || !V || H % KVH || HD % 2 || L > 4096 || D > 65536 || FF > 262144 ||
        V > 1048576 || H * HD > 65536 || !(desc->rope_theta > 0) || !(desc->norm_eps > 0) || (desc->n_params && !desc->params))
        return CALRT_E_INVALID_CALBIN;
    net n;
    memset(&n, 0, sizeof n);
    n.n_layers = L; n.d = D; n.h = H; n.kvh = KVH; n.hd = HD; n.ff = FF; n.vocab = V;
    n.flags = desc->flags; n.theta = desc->rope_theta; n.eps = desc->norm_eps;
    n.layers = calloc(L, sizeof(layer_w));
    if (!n.layers) return CALRT_E_OUT_OF_MEMORY;
    rc = CALRT_OK;
    for (uint32_t i = 0; rc == CALRT_OK && i < desc->n_params; i++) {
        const calrt_ext_param *p = &desc->params[i];
        float **slot = NULL;
        uint64_t want = 0;
        layer_w *w = p->layer < L ? &n.layers[p->layer] : NULL;
        int per_layer = p->role >= CALRT_EXT_ATTN_NORM;
        if (per_layer && !w) { rc = CALRT_E_INVALID_CALBIN; break; }
        switch (p->role) {
        case CALRT_EXT_EMBED: slot = &n.embed; want = (uint64_t)V * D; break;
        case CALRT_EXT_FINAL_NORM: slot = &n.final_norm; want = D; break;
        case CALRT_EXT_LM_HEAD: slot = &n.lm_head; want = (uint64_t)D * V; break;
        case CALRT_EXT_ATTN_NORM: slot = &w->attn_norm; want = D; break;
        case CALRT_EXT_WQ: slot = &w->wq; want = (uint64_t)D * H * HD; break;
        case CALRT_EXT_WK: slot = &w->wk; want = (uint64_t)D * KVH * HD; break;
        case CALRT_EXT_WV: slot = &w->wv; want = (uint64_t)D * KVH * HD; break;
        case CALRT_EXT_WO: slot = &w->wo; want = (uint64_t)H * HD * D; break;
        case CALRT_EXT_MLP_NORM: slot = &w->mlp_norm; want = D; break;
        case CALRT_EXT_W_GATE: slot = &w->w_gate; want = (uint64_t)D * FF; break;
        case CALRT_EXT_W_UP: slot = &w->w_up; want = (uint64_t)D * FF; break;
        case CALRT_EXT_W_DOWN: slot = &w->w_down; want = (uint64_t)FF * D; break;
        case CALRT_EXT_BQ: slot = &w->bq; want = (uint64_t)H * HD; break;
        case CALRT_EXT_BK: slot = &w->bk; want = (uint64_t)KVH * HD; break;
        case CALRT_EXT_BV: slot = &w->bv; want = (uint64_t)KVH * HD; break;
        case CALRT_EXT_Q_NORM: slot = &w->q_norm; want = HD; break;
        case CALRT_EXT_K_NORM: slot = &w->k_norm; want = HD; break;
        default: rc = CALRT_E_INVALID_CALBIN;
        }
        if (rc != CALRT_OK) break;
        if (*slot || p->elements != want) { rc = CALRT_E_INVALID_CALBIN; break; } /* duplicate or wrong size */
        if (block_bytes(p->dtype)) { /* [in, out] = [first, second] of the role's shape; stored [out][in] */
            uint64_t in, out;
            switch (p->role) {
            case CALRT_EXT_EMBED: in = V; out = D; break; /* stored as it is: [vocab][d_model] */
            case CALRT_EXT_LM_HEAD: case CALRT_EXT_WQ: case CALRT_EXT_WK: case CALRT_EXT_WV:
            case CALRT_EXT_W_GATE: case CALRT_EXT_W_UP: in = D; out = want / D; break;
            case CALRT_EXT_WO: in = (uint64_t)H * HD; out = D; break;
            case CALRT_EXT_W_DOWN: in = FF; out = D; break;
            default: in = out = 0; /* a vector is never kept in blocks */
            }
            int embed = p->role == CALRT_EXT_EMBED;
            *slot = in ? read_blocks(cb->path, p, embed ? in : out, embed ? out : in, embed) : NULL;
            if (!*slot) rc = CALRT_E_INVALID_CALBIN;
        } else if (!(*slot = read_param(cb->path, p))) {
            rc = CALRT_E_INVALID_CALBIN;
        }
    }
    /* every tensor the flags call for must be there, and none the flags rule out */
    int tied = (n.flags & CALRT_EXT_TIED_EMBEDDINGS) != 0, bias = (n.flags & CALRT_EXT_QKV_BIAS) != 0;
    int qkn = (n.flags & CALRT_EXT_QK_NORM) != 0;
    if (rc == CALRT_OK && (!n.embed || !n.final_norm || (!tied != !!n.lm_head))) rc = CALRT_E_INVALID_CALBIN;
    for (uint32_t l = 0; rc == CALRT_OK && l < L; l++) {
        layer_w *w = &n.layers[l];
        if (!w->attn_norm || !w->wq || !w->wk || !w->wv || !w->wo || !w->mlp_norm || !w->w_gate || !w->w_up || !w->w_down ||
            !bias != !w->bq || !bias != !w->bk || !bias != !w->bv || !qkn != !w->q_norm || !qkn != !w->k_norm)
            rc = CALRT_E_INVALID_CALBIN;
    }
    n.loaded = 1;
    for (uint32_t i = 0; rc == CALRT_OK && i < cb->ngraphs; i++) {
        graph *g = &cb->graphs[i];
        if (g->model == m && !graph_contract_ok(g, V)) rc = CALRT_E_INVALID_CALBIN;
    }
    if (rc != CALRT_OK) {
        free_net(&n);
        return rc;
    }
    pthread_mutex_lock(&d->mu);
    if (d->current == cb) {
        rc = CALRT_E_DEVICE_BUSY;
        free_net(&n);
    } else {
        free_net(&m->net);
        m->net = n;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

/* ------------------------------------------------------------------------- */

calrt_status calrt_configure(calrt_device *d, calrt_calbin *cb) {
    if (!d || !cb) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = known_calbin(d, cb) ? CALRT_OK : CALRT_E_INVALID_ARGUMENT;
#ifndef CALRT_MUTANT_RECONFIGURE /* the bug: a second configure silently replaces the current calbin */
    if (rc == CALRT_OK && d->current) rc = CALRT_E_ALREADY_CONFIGURED;
#endif
    for (int c = 0; rc == CALRT_OK && c < REF_CHIPS; c++) {
        if (d->chips[c].health != CALRT_HEALTH_OK) rc = CALRT_E_DEVICE_LOST;
        else if (REF_BASELINE + cb->plan[c] > REF_DRAM) rc = CALRT_E_OUT_OF_MEMORY;
    }
    /* the board computes: a model without its description (calrt_ext_model_set) cannot run */
    for (uint32_t i = 0; rc == CALRT_OK && i < cb->nmodels; i++)
        if (!cb->models[i].net.loaded) rc = CALRT_E_INVALID_CALBIN;
    if (rc == CALRT_OK) {
        for (uint32_t i = 0; i < cb->nmodels; i++) cb->models[i].live = 0;
#ifdef CALRT_MUTANT_RELOAD_KEEPS_SLOTS /* the bug: the slots the unload took from the pool are still taken */
        for (uint32_t i = 0; i < cb->nmodels && i < 16; i++) cb->models[i].live = d->mut_pool_taken[i];
#endif
        d->current = cb;
#ifdef CALRT_MUTANT_CALBIN_RELEASE_AFTER_UNLOAD_BUSY
        cb->mut_was_current = 1;
#endif
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_reset_configuration(calrt_device *d) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = CALRT_OK;
    if (!d->current) rc = CALRT_E_NOT_CONFIGURED;
    for (job *j = d->jobs; rc == CALRT_OK && j; j = j->next)
        if (!terminal(j->info.state)) rc = CALRT_E_DEVICE_BUSY;
    if (rc == CALRT_OK) {
#ifdef CALRT_MUTANT_RELOAD_KEEPS_SLOTS /* the sequences are dropped without giving their slots back */
        for (uint32_t i = 0; i < d->current->nmodels && i < 16; i++) d->mut_pool_taken[i] += d->current->models[i].live;
#endif
#ifndef CALRT_MUTANT_UNLOAD_KEEPS_KV /* the bug: the sequences outlive the configuration they belong to */
        free_seqs(d);
#endif
        d->current = NULL;
#ifdef CALRT_MUTANT_UNLOAD_LEAK
        d->mut_leaked += 117964800ULL; /* the bug: 112.5 MiB per chip never given back */
#endif
#ifdef CALRT_MUTANT_UNLOAD_LEAK_CHIP1
        d->mut_leaked1 += 117964800ULL; /* the bug: chip 1's arena is freed through chip 0's allocator */
#endif
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_buffer_create(calrt_device *d, uint64_t bytes, calrt_buffer **out) {
    if (!d || !out || bytes == 0 || bytes > (1ULL << 34)) return CALRT_E_INVALID_ARGUMENT;
    calrt_buffer *b = calloc(1, sizeof *b);
    if (!b) return CALRT_E_OUT_OF_MEMORY;
    b->data = calloc(1, bytes);
    if (!b->data) { free(b); return CALRT_E_OUT_OF_MEMORY; }
    b->size = bytes;
    pthread_mutex_lock(&d->mu);
    b->next = d->buffers;
    d->buffers = b;
    pthread_mutex_unlock(&d->mu);
    *out = b;
    return CALRT_OK;
}

static int known_buffer(calrt_device *d, calrt_buffer *b) {
    for (calrt_buffer *p = d->buffers; p; p = p->next)
        if (p == b) return 1;
    return 0;
}

calrt_status calrt_buffer_data(calrt_device *d, calrt_buffer *b, void **data) {
    if (!d || !b || !data) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = known_buffer(d, b) ? CALRT_OK : CALRT_E_INVALID_ARGUMENT;
    if (rc == CALRT_OK) *data = b->data;
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_buffer_release(calrt_device *d, calrt_buffer *b) {
    if (!d || !b) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = CALRT_E_INVALID_ARGUMENT;
    for (calrt_buffer **p = &d->buffers; *p; p = &(*p)->next) {
        if (*p != b) continue;
#ifdef CALRT_MUTANT_RELEASE_IN_FLIGHT /* the bug: job ownership is not checked; the handle is dropped */
        if (b->owner && !b->quarantined) {
            *p = b->next; /* (unlinked but not freed, so the job in flight does not crash this mutant) */
            rc = CALRT_OK;
        } else
#endif
#ifdef CALRT_MUTANT_TIMEOUT_FREES_BUFFERS /* a job in flight still points at it: unlink, never free (no crash) */
        int live = 0;
        for (job *j = d->jobs; j; j = j->next) live |= !terminal(j->info.state) && (j->in == b || j->out == b);
        if (live && !b->owner && !b->quarantined) {
            *p = b->next;
            rc = CALRT_OK;
            break;
        }
#endif
        if (b->owner || b->quarantined) {
            rc = CALRT_E_BUFFER_IN_USE;
        } else {
            *p = b->next;
            free(b->data);
            free(b);
            rc = CALRT_OK;
        }
        break;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

static graph *find_graph(calrt_device *d, const char *name) {
    if (!d->current || !name) return NULL;
    for (uint32_t i = 0; i < d->current->ngraphs; i++)
#ifdef CALRT_MUTANT_GRAPH_PREFIX /* the bug: compares only as many characters as the caller gave */
        if (*name && !strncmp(d->current->graphs[i].name, name, strlen(name))) return &d->current->graphs[i];
#else
        if (!strcmp(d->current->graphs[i].name, name)) return &d->current->graphs[i];
#endif
    return NULL;
}

/* 000 §9.2: the job writes exactly the reserved tokens, at position == committed length; also the
 * inputs this board computes on (token ids, valid length) must be in range. Resolves j->seqs. */
static calrt_status check_job(calrt_device *d, graph *g, const calrt_job_desc *desc, job *j) {
#ifdef CALRT_MUTANT_SHORT_BUFFERS /* the bug: n_kv is not compared with the batch */
    if (!desc->kv || desc->n_kv > REF_MAX_LANES) return CALRT_E_INVALID_ARGUMENT;
#else
    if (desc->n_kv != desc->batch || !desc->kv) return CALRT_E_INVALID_ARGUMENT;
#endif
    const unsigned char *data = desc->inputs->data;
    int vlen = find_tensor(g->in, g->nin, g->vlen), pos = find_tensor(g->in, g->nin, g->pos);
    int lane = find_tensor(g->in, g->nin, g->lane), tok = find_tensor(g->in, g->nin, "tokens");
    uint32_t vocab = g->model->net.vocab;
#ifdef CALRT_MUTANT_TOKENS_WRAP
    (void)vocab;
#endif
    for (uint32_t l = 0; l < desc->batch; l++) {
        int active = lane < 0 || LANE_ON(g, data, lane, desc->batch, l);
        calrt_kv_seq id = desc->kv[l];
        if (!active) {
            if (id != CALRT_KV_NONE) return CALRT_E_INVALID_ARGUMENT;
            continue;
        }
        seq *s = find_seq(d, id);
#ifdef CALRT_MUTANT_KV_ANY_MODEL /* the bug: one KV namespace; a sequence of another model is taken */
        if (!s) return CALRT_E_INVALID_ARGUMENT;
#else
        if (!s || s->m != g->model) return CALRT_E_INVALID_ARGUMENT;
#endif
#ifdef CALRT_MUTANT_BUSY_SEQ_AS_INVALID /* the bug: "in use, back off" mapped to "invalid argument" */
        if (s->busy) return CALRT_E_INVALID_ARGUMENT;
#else
        if (s->busy) return CALRT_E_DEVICE_BUSY;
#endif
#ifndef CALRT_MUTANT_DUP_SEQ_LANES /* the bug: each lane checked alone; one sequence in two lanes runs */
        for (uint32_t k = 0; k < l; k++)
            if (desc->kv[k] == id) return CALRT_E_INVALID_ARGUMENT;
#endif
        uint32_t writes = 1;
        if (g->kind == CALRT_GRAPH_PREFILL) {
#ifndef CALRT_MUTANT_PREFILL_ON_USED /* the bug: a prefill does not ask whether the sequence is empty */
            if (s->committed != 0) return CALRT_E_INVALID_ARGUMENT;
#endif
            int32_t n = read_i32(g, data, vlen, desc->batch, 0);
            if (n < 1 || n > g->in[tok].dims[1]) return CALRT_E_INVALID_ARGUMENT;
            writes = (uint32_t)n;
#ifndef CALRT_MUTANT_TOKENS_WRAP /* the bug: token ids are not range-checked */
            for (int32_t i = 0; i < n; i++) {
                int32_t t = read_i32(g, data, tok, desc->batch, (uint32_t)i);
                if (t < 0 || (uint32_t)t >= vocab) return CALRT_E_INVALID_ARGUMENT;
            }
#endif
            j->tokens = writes;
        } else {
#ifdef CALRT_MUTANT_DECODE_POS_LANE0_ONLY /* the bug: the position is checked for lane 0 (written for B1) */
            if (l == 0 && (uint32_t)read_i32(g, data, pos, desc->batch, l) != s->committed) return CALRT_E_INVALID_ARGUMENT;
#else
            if ((uint32_t)read_i32(g, data, pos, desc->batch, l) != s->committed) return CALRT_E_INVALID_ARGUMENT;
#endif
            int32_t t = read_i32(g, data, tok, desc->batch, l);
#if !defined(CALRT_MUTANT_TOKENS_WRAP) && !defined(CALRT_MUTANT_DECODE_TOKENS_UNCHECKED) /* the bug: prefill only */
            if (t < 0 || (uint32_t)t >= vocab) return CALRT_E_INVALID_ARGUMENT;
#else
            (void)t;
#endif
            j->kv_tokens += s->committed + 1;
        }
#ifdef CALRT_MUTANT_PREFILL_FEWER_THAN_RESERVED /* the bug: "no more than reserved" for "exactly reserved" */
        if (s->reserved - s->committed < writes || (g->kind != CALRT_GRAPH_PREFILL && s->reserved - s->committed != writes))
            return CALRT_E_INVALID_ARGUMENT;
#else
        if (s->reserved - s->committed != writes) return CALRT_E_INVALID_ARGUMENT;
#endif
        j->seqs[l] = s;
    }
    return CALRT_OK;
}

/* KV storage of a sequence in board memory, allocated on its first job. */
static int seq_storage(seq *s) {
    if (s->k) return 1;
    const net *m = &s->m->net;
    uint64_t n = (uint64_t)m->n_layers * s->m->max_seq * m->kvh * m->hd;
    s->k = malloc(sizeof(float) * n);
    s->v = malloc(sizeof(float) * n);
    if (s->k && s->v) return 1;
    free(s->k); free(s->v);
    s->k = s->v = NULL;
    return 0;
}

#ifdef CALRT_MUTANT_SUBMIT_DEADLOCK
/* The bug: a chip's queue lock, then the other chip's, taken in an order that depends on the chip.
 * One submit at a time never notices; two threads submitting to the two chips at once deadlock. */
static pthread_mutex_t g_mut_chip_lock[2] = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};
static calrt_status submit_unlocked(calrt_device *d, const calrt_job_desc *desc, calrt_job_id *out);

calrt_status calrt_job_submit(calrt_device *d, const calrt_job_desc *desc, calrt_job_id *out) {
    int c = 0;
    if (d && desc && desc->graph) {
        pthread_mutex_lock(&d->mu);
        graph *g = d->current ? find_graph(d, desc->graph) : NULL;
        if (g) c = lowest_chip(g->chip_mask) & 1;
        pthread_mutex_unlock(&d->mu);
    }
    pthread_mutex_lock(&g_mut_chip_lock[c]);
    struct timespec pause = {0, 300000}; /* a slow register write between the two */
    nanosleep(&pause, NULL);
    pthread_mutex_lock(&g_mut_chip_lock[!c]);
    calrt_status rc = submit_unlocked(d, desc, out);
    pthread_mutex_unlock(&g_mut_chip_lock[!c]);
    pthread_mutex_unlock(&g_mut_chip_lock[c]);
    return rc;
}

static calrt_status submit_unlocked(calrt_device *d, const calrt_job_desc *desc, calrt_job_id *out) {
#else
calrt_status calrt_job_submit(calrt_device *d, const calrt_job_desc *desc, calrt_job_id *out) {
#endif
#ifdef CALRT_MUTANT_SHORT_BUFFERS /* the bug: the engine is not checked (an unknown one runs as AUTO) */
    if (!d || !desc || !out || !desc->inputs || !desc->outputs || desc->batch > REF_MAX_LANES || desc->batch == 0)
        return CALRT_E_INVALID_ARGUMENT;
#else
    if (!d || !desc || !out || !desc->inputs || !desc->outputs || desc->engine > CALRT_ENGINE_PONG || desc->batch > REF_MAX_LANES ||
        desc->batch == 0)
        return CALRT_E_INVALID_ARGUMENT;
#endif
    job *j = calloc(1, sizeof *j);
    if (!j) return CALRT_E_OUT_OF_MEMORY;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = CALRT_OK;
    graph *g = NULL;
    uint64_t need_in = 0, need_out = 0;
    if (!d->current) rc = CALRT_E_NOT_CONFIGURED;
    else if (!(g = find_graph(d, desc->graph))) rc = CALRT_E_INVALID_ARGUMENT;
    if (rc == CALRT_OK) {
        int prof_ok = 0;
        for (uint32_t k = 0; k < g->nprof; k++) prof_ok |= g->prof[k] == desc->batch;
        tensor_offset(g->in, g->nin, 0, desc->batch, &need_in);
        tensor_offset(g->out, g->nout, 0, desc->batch, &need_out);
#ifdef CALRT_MUTANT_OUTPUT_SIZE_AT_B1 /* the bug: the outputs' size checked against the manifest's B1 layout */
        tensor_offset(g->out, g->nout, 0, 1, &need_out);
#endif
#ifdef CALRT_MUTANT_SHORT_BUFFERS /* the bug: sizes and the profile are not checked, one buffer may be both */
        (void)prof_ok;
        if (!known_buffer(d, desc->inputs) || !known_buffer(d, desc->outputs)) rc = CALRT_E_INVALID_ARGUMENT;
#else
        if (!prof_ok || desc->inputs == desc->outputs || !known_buffer(d, desc->inputs) || !known_buffer(d, desc->outputs) ||
            desc->inputs->size < need_in || desc->outputs->size < need_out)
            rc = CALRT_E_INVALID_ARGUMENT;
#endif
#ifndef CALRT_MUTANT_SUBMIT_OWNED_BUFFER /* the bug: a buffer a job in flight owns is accepted again */
        else if (desc->inputs->owner || desc->outputs->owner || desc->inputs->quarantined || desc->outputs->quarantined)
            rc = CALRT_E_BUFFER_IN_USE;
#endif
    }
    int c = g ? lowest_chip(g->chip_mask) : 0;
    if (rc == CALRT_OK && d->chips[c].health == CALRT_HEALTH_FAULTED) rc = CALRT_E_DEVICE_LOST;
#ifdef CALRT_MUTANT_SUBMIT_REFUSED_KEEPS_BUFFERS /* the bug: the buffers are taken before the KV checks */
    if (rc == CALRT_OK) desc->inputs->owner = desc->outputs->owner = UINT64_MAX;
#endif
    if (rc == CALRT_OK) rc = check_job(d, g, desc, j);
    if (rc == CALRT_OK) {
        uint32_t inflight = d->chips[c].qlen;
        for (int b = 0; b < REF_BANKS; b++) inflight += d->chips[c].running[b] != NULL;
#ifdef CALRT_MUTANT_QUEUE_FULL_OOM /* the bug: no free queue entry reported as an allocation failure */
        if (inflight >= REF_QUEUE_DEPTH) rc = CALRT_E_OUT_OF_MEMORY;
#else
        if (inflight >= REF_QUEUE_DEPTH) rc = CALRT_E_DEVICE_BUSY; /* the chip's queue is full: back off */
#endif
    }
    if (rc == CALRT_OK && d->f_busy) {
        d->f_busy--;
        rc = CALRT_E_DEVICE_BUSY;
    }
    if (rc == CALRT_OK) {
        j->din = malloc(need_in);
        j->dout = malloc(sizeof(float) * (uint64_t)desc->batch * g->model->net.vocab);
        if (!j->din || !j->dout) rc = CALRT_E_OUT_OF_MEMORY;
        for (uint32_t l = 0; rc == CALRT_OK && l < desc->batch; l++)
            if (j->seqs[l] && !seq_storage(j->seqs[l])) rc = CALRT_E_OUT_OF_MEMORY;
    }
    if (rc != CALRT_OK) {
        pthread_mutex_unlock(&d->mu);
        free(j->din); free(j->dout); free(j);
        return rc;
    }
#ifdef CALRT_MUTANT_JOB_ID_REUSE /* the bug: the lowest id no record holds, so a released job's id comes back */
    j->info.id = 1;
    while (find_job(d, j->info.id)) j->info.id++;
#elif defined(CALRT_MUTANT_JOB_ID_PER_CHIP) /* the bug: CalRT's per-chip job id passed as the device's */
    j->info.id = d->mut_next_id[c]++;
#else
    j->info.id = d->next_job++;
#endif
    j->info.state = CALRT_JOB_QUEUED;
    j->info.chip_mask = g->chip_mask;
    j->info.engine = desc->engine;
#ifdef CALRT_MUTANT_AUTO_ECHO_BANK /* the bug: the engine field reports the bank the scheduler picked */
    if (desc->engine == CALRT_ENGINE_AUTO) j->info.engine = CALRT_ENGINE_PING;
#endif
    j->info.generation = desc->generation;
    j->info.submit_ns = now_ns();
    j->g = g;
    j->in = desc->inputs;
    j->out = desc->outputs;
    j->batch = desc->batch;
    j->bank = desc->engine > CALRT_ENGINE_PONG ? CALRT_ENGINE_AUTO : desc->engine;
    j->nkv = desc->n_kv;
    memcpy(j->kv, desc->kv, sizeof(calrt_kv_seq) * desc->n_kv);
#ifdef CALRT_MUTANT_KEEPS_KV_POINTER
    j->caller_kv = desc->kv;
#endif
    if (d->f_hang) { d->f_hang--; j->fault = CALRT_EXT_FAULT_HANG; }
    else if (d->f_ccu) { d->f_ccu--; j->fault = CALRT_EXT_FAULT_CCU; }
    else if (d->f_dma) { d->f_dma--; j->fault = CALRT_EXT_FAULT_DMA; }
    j->in->owner = j->out->owner = j->info.id;
    j->in->owner_mask = j->out->owner_mask = g->chip_mask;
    for (uint32_t l = 0; l < j->nkv; l++)
#ifdef CALRT_MUTANT_BUSY_LANE0_ONLY /* the bug: the in-flight mark written for B1 (the first lane's sequence) */
        if (j->seqs[l] && l == 0) { j->seqs[l]->busy = j->info.id; j->seqs[l]->last_failed = 0; }
#elif defined(CALRT_MUTANT_BUSY_PREFILL_ONLY) /* the bug: the mark written with the prefill path only */
        if (j->seqs[l]) { if (g->kind == CALRT_GRAPH_PREFILL) j->seqs[l]->busy = j->info.id; j->seqs[l]->last_failed = 0; }
#elif defined(CALRT_MUTANT_BUSY_WHEN_STARTED) /* the bug: marked by the worker (run_job), not here */
        if (j->seqs[l]) j->seqs[l]->last_failed = 0;
#else
        if (j->seqs[l]) { j->seqs[l]->busy = j->info.id; j->seqs[l]->last_failed = 0; }
#endif
    d->chips[c].counters.pending++;
    j->next = d->jobs;
    d->jobs = j;
    chip *ch = &d->chips[c];
    if (ch->qtail) ch->qtail->qnext = j;
    else ch->qhead = j;
    ch->qtail = j;
    ch->qlen++;
    *out = j->info.id;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return CALRT_OK;
}

#ifdef CALRT_MUTANT_STAMPS_REALTIME /* the bug: the device clock is converted to wall-clock time */
static void mut_realtime(calrt_job_info *out) { /* the offset taken once, as a device clock's would be */
    static uint64_t off;
    if (!off) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        off = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec - now_ns();
    }
    if (out->submit_ns) out->submit_ns += off;
    if (out->start_ns) out->start_ns += off;
    if (out->end_ns) out->end_ns += off;
}
#endif

#ifdef CALRT_MUTANT_STAMPS_BACKWARD_AFTER_RESET /* the bug: a reset restarts the chip's clock; the offset is stale */
static void mut_device_clock(const calrt_device *d, const job *j, calrt_job_info *out) {
    int c = lowest_chip(j->info.chip_mask);
    if (!d->mut_reset_at[c] || j->info.start_ns < d->mut_reset_at[c]) return;
    uint64_t back = d->mut_reset_at[c] - d->mut_open_ns;
    if (out->start_ns) out->start_ns -= back;
    if (out->end_ns) out->end_ns -= back;
}
#endif

calrt_status calrt_job_query(calrt_device *d, calrt_job_id id, calrt_job_info *out) {
    if (!d || !out) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    job *j = find_job(d, id);
#ifdef CALRT_MUTANT_QUERY_VIA_WAIT_ZERO /* the bug: the status is read by a Wait(0), i.e. until the job ends */
    while (j && !terminal(j->info.state)) {
        pthread_cond_wait(&d->cv, &d->mu);
        j = find_job(d, id);
    }
#endif
#ifdef CALRT_MUTANT_QUERY_BLOCKS_WHILE_COMPUTING /* the bug: the answer waits for the chip's compute lock */
    while (j && j->info.state == CALRT_JOB_RUNNING && !j->hung) {
        pthread_cond_wait(&d->cv, &d->mu);
        j = find_job(d, id);
    }
#endif
    if (j) *out = j->info;
#ifdef CALRT_MUTANT_QUERY_NO_TAGS
    if (j) out->generation = 0, out->engine = 0, out->chip_mask = 0; /* the bug: the tags are not echoed */
#endif
#ifdef CALRT_MUTANT_QUERY_PREV_STAMPS /* the bug: a terminal job's stamps read from the ring slot before its own */
    if (j && terminal(j->info.state) && d->mut_ring[(j->info.id - 1) % 8][1])
        out->start_ns = d->mut_ring[(j->info.id - 1) % 8][0], out->end_ns = d->mut_ring[(j->info.id - 1) % 8][1];
#endif
#ifdef CALRT_MUTANT_QUERY_RUNNING_AFTER_WAIT /* the bug: the wait consumed the completion event the query reads */
    if (j && j->mut_waited) out->state = CALRT_JOB_RUNNING, out->status = CALRT_OK;
#endif
#ifdef CALRT_MUTANT_STAMPS_US
    if (j) out->submit_ns /= 1000, out->start_ns /= 1000, out->end_ns /= 1000; /* the bug: device microseconds */
#endif
#ifdef CALRT_MUTANT_STAMPS_REALTIME
    if (j) mut_realtime(out);
#endif
#ifdef CALRT_MUTANT_STAMPS_BACKWARD_AFTER_RESET
    if (j) mut_device_clock(d, j, out);
#endif
    pthread_mutex_unlock(&d->mu);
#ifdef CALRT_MUTANT_UNKNOWN_JOB_INTERNAL /* the bug: CalRT's "no such job" exception falls to the default code */
    return j ? CALRT_OK : CALRT_E_INTERNAL;
#else
    return j ? CALRT_OK : CALRT_E_INVALID_ARGUMENT;
#endif
}

calrt_status calrt_job_wait(calrt_device *d, calrt_job_id id, uint32_t timeout_ms, calrt_job_info *out) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000ULL;
#ifdef CALRT_MUTANT_WAIT_TIMEOUT_32BIT /* the bug: the product is taken in 32 bits before it is widened */
    deadline = now_ns() + (uint64_t)(uint32_t)(timeout_ms * 1000000U);
#endif
#ifdef CALRT_MUTANT_WAIT_TIMEOUT_US /* the bug: CalRT's wait takes microseconds; the milliseconds passed through */
    deadline = now_ns() + (uint64_t)timeout_ms * 1000ULL;
#endif
#ifdef CALRT_MUTANT_WAIT_ZERO_FOREVER /* the bug: CalRT's Wait(0) means "no deadline", passed through as is */
    if (timeout_ms == 0) deadline = now_ns() + 3600ULL * 1000000000ULL;
#endif
    pthread_mutex_lock(&d->mu);
    for (;;) {
        job *j = find_job(d, id);
#ifdef CALRT_MUTANT_RELEASED_WAIT_CACHED /* the bug: the completion cache outlives the job record */
        if (!j && id && d->mut_done[id % 16].id == id) {
            if (out) *out = d->mut_done[id % 16];
            pthread_mutex_unlock(&d->mu);
            return CALRT_OK;
        }
#endif
#ifdef CALRT_MUTANT_UNKNOWN_JOB_INTERNAL
        if (!j) { pthread_mutex_unlock(&d->mu); return CALRT_E_INTERNAL; }
#else
        if (!j) { pthread_mutex_unlock(&d->mu); return CALRT_E_INVALID_ARGUMENT; }
#endif
#ifdef CALRT_MUTANT_WAIT_ZERO_TIMEOUT_ON_DONE /* the bug: CalRT's Wait(0) avoided by answering a poll TIMEOUT */
        if (timeout_ms == 0) {
            if (out) *out = j->info;
            pthread_mutex_unlock(&d->mu);
            return CALRT_E_TIMEOUT;
        }
#endif
        if (terminal(j->info.state) || now_ns() >= deadline) {
#ifdef CALRT_MUTANT_END_STAMP_AT_WAIT
            if (terminal(j->info.state) && j->info.start_ns && !j->info.end_ns) j->info.end_ns = now_ns();
#endif
#ifdef CALRT_MUTANT_WAIT_TIMEOUT_NO_INFO /* the bug: the info is filled only for a terminal job */
            if (out && terminal(j->info.state)) *out = j->info;
#else
            if (out) *out = j->info;
#endif
#ifdef CALRT_MUTANT_QUERY_RUNNING_AFTER_WAIT
            if (terminal(j->info.state)) j->mut_waited = 1;
#endif
#ifdef CALRT_MUTANT_STAMPS_US
            if (out) out->submit_ns /= 1000, out->start_ns /= 1000, out->end_ns /= 1000;
#endif
#ifdef CALRT_MUTANT_STAMPS_REALTIME
            if (out) mut_realtime(out);
#endif
#ifdef CALRT_MUTANT_STAMPS_BACKWARD_AFTER_RESET
            if (out) mut_device_clock(d, j, out);
#endif
#ifdef CALRT_MUTANT_TIMEOUT_AS_ABORTED /* the bug: a wait that timed out reports the job aborted */
            calrt_status rc = terminal(j->info.state) ? CALRT_OK : CALRT_E_JOB_ABORTED;
#elif defined(CALRT_MUTANT_WAIT_RETURNS_JOB_STATUS) /* the bug: CalRT's Wait throws the job's error; passed on */
            calrt_status rc = terminal(j->info.state) ? (calrt_status)j->info.status : CALRT_E_TIMEOUT;
#else
            calrt_status rc = terminal(j->info.state) ? CALRT_OK : CALRT_E_TIMEOUT;
#endif
#ifdef CALRT_MUTANT_TIMEOUT_FREES_BUFFERS /* the bug: a timed-out wait hands the job's buffers back */
            if (rc == CALRT_E_TIMEOUT) j->in->owner = j->out->owner = 0, j->in->owner_mask = j->out->owner_mask = 0;
#endif
            pthread_mutex_unlock(&d->mu);
            return rc;
        }
        wait_until(d, deadline); /* releases the device mutex while blocked */
#ifdef CALRT_MUTANT_WAIT_TIMEOUT_ON_WAKEUP /* the bug: any wake-up of the condition variable taken for the deadline */
        deadline = now_ns();
#endif
    }
}

calrt_status calrt_job_wait_any(calrt_device *d, const calrt_job_id *ids, uint32_t n, uint32_t timeout_ms, uint32_t *index) {
    if (!d || !ids || !index || n == 0) return CALRT_E_INVALID_ARGUMENT;
    uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000ULL;
#ifdef CALRT_MUTANT_WAIT_TIMEOUT_32BIT
    deadline = now_ns() + (uint64_t)(uint32_t)(timeout_ms * 1000000U);
#endif
#ifdef CALRT_MUTANT_WAIT_ANY_TIMEOUT_US /* the bug: CalRT's wait takes microseconds; the milliseconds passed through */
    deadline = now_ns() + (uint64_t)timeout_ms * 1000ULL;
#endif
    pthread_mutex_lock(&d->mu);
    for (;;) {
        for (uint32_t i = 0; i < n; i++) {
            job *j = find_job(d, ids[i]);
            if (!j) { pthread_mutex_unlock(&d->mu); return CALRT_E_INVALID_ARGUMENT; }
#ifdef CALRT_MUTANT_WAIT_ANY_FIRST_CHIP /* the bug: the wait is on the first job's chip queue only */
            job *first = find_job(d, ids[0]);
            if (first && j->info.chip_mask != first->info.chip_mask) continue;
#endif
#ifdef CALRT_MUTANT_WAIT_ANY_FIRST_INDEX /* the bug: "something finished" answered as index 0 */
            if (terminal(j->info.state)) { *index = 0; pthread_mutex_unlock(&d->mu); return CALRT_OK; }
#else
            if (terminal(j->info.state)) { *index = i; pthread_mutex_unlock(&d->mu); return CALRT_OK; }
#endif
        }
        if (now_ns() >= deadline) { pthread_mutex_unlock(&d->mu); return CALRT_E_TIMEOUT; }
        wait_until(d, deadline);
#ifdef CALRT_MUTANT_WAIT_ANY_TIMEOUT_ON_WAKEUP /* the bug: any wake-up of the condition variable taken for the deadline */
        deadline = now_ns();
#endif
    }
}

calrt_status calrt_job_release(calrt_device *d, calrt_job_id id) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
#ifdef CALRT_MUTANT_UNKNOWN_JOB_INTERNAL
    calrt_status rc = CALRT_E_INTERNAL;
#else
    calrt_status rc = CALRT_E_INVALID_ARGUMENT;
#endif
    for (job **p = &d->jobs; *p; p = &(*p)->next) {
        if ((*p)->info.id != id) continue;
        if (!terminal((*p)->info.state)) { rc = CALRT_E_DEVICE_BUSY; break; }
        job *j = *p;
        *p = j->next;
#ifdef CALRT_MUTANT_RELEASED_WAIT_CACHED
        d->mut_done[j->info.id % 16] = j->info;
#endif
#if defined(MUT_EARLY_DONE) || defined(CALRT_MUTANT_RESET_NO_DRAIN)
        if (picked(d, j)) { /* its worker still holds it and frees it */
            j->released = 1;
            rc = CALRT_OK;
            break;
        }
#endif
        free(j->din); free(j->dout); free(j);
        rc = CALRT_OK;
        break;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

static model *find_model(calrt_device *d, const char *alias) {
    if (!d->current || !alias) return NULL;
    for (uint32_t i = 0; i < d->current->nmodels; i++)
        if (!strcmp(d->current->models[i].alias, alias)) return &d->current->models[i];
    return NULL;
}

calrt_status calrt_kv_can_allocate(calrt_device *d, const char *alias, uint32_t n, uint32_t *yes) {
    if (!d || !yes) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = CALRT_OK;
    model *m = find_model(d, alias);
#ifdef CALRT_MUTANT_CAN_ALLOCATE_UNCONFIGURED_INVALID /* the bug: the alias is looked up first */
    if (!m) rc = CALRT_E_INVALID_ARGUMENT;
#else
    if (!d->current) rc = CALRT_E_NOT_CONFIGURED;
    else if (!m) rc = CALRT_E_INVALID_ARGUMENT;
#endif
#ifdef CALRT_MUTANT_CAN_ALLOCATE_OFF_BY_ONE /* the bug: "<" where the pool may be filled to the last slot */
    else *yes = (uint64_t)m->live + n < m->max_sequences;
#else
    else *yes = (uint64_t)m->live + n <= m->max_sequences;
#endif
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_kv_allocate(calrt_device *d, const char *alias, calrt_kv_seq *out) {
    if (!d || !out) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = CALRT_OK;
    model *m = find_model(d, alias);
    seq *s = NULL;
    if (!d->current) rc = CALRT_E_NOT_CONFIGURED;
    else if (!m) rc = CALRT_E_INVALID_ARGUMENT;
    else if (m->live >= m->max_sequences) rc = CALRT_E_OUT_OF_MEMORY;
    else if (!(s = calloc(1, sizeof *s))) rc = CALRT_E_OUT_OF_MEMORY;
    if (rc == CALRT_OK) {
        s->id = d->next_seq++;
        s->m = m;
#ifdef CALRT_MUTANT_KV_REUSE_STALE_LENGTH /* the bug: the pool slot's length is not cleared when it is reused */
        if (d->mut_freed_model == m) s->committed = s->reserved = d->mut_freed_len, d->mut_freed_model = NULL;
#endif
        s->next = d->seqs;
        d->seqs = s;
        m->live++;
        *out = s->id;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

/* Look up an idle sequence; returns the status to report when it is missing or busy. */
static calrt_status idle_seq(calrt_device *d, calrt_kv_seq id, seq **out) {
    seq *s = find_seq(d, id);
    if (!s) return CALRT_E_INVALID_ARGUMENT;
    if (s->busy) return CALRT_E_DEVICE_BUSY;
    *out = s;
    return CALRT_OK;
}

calrt_status calrt_kv_append(calrt_device *d, calrt_kv_seq id, uint32_t n, uint32_t *position) {
    if (!d || !position) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    seq *s = NULL;
    calrt_status rc = idle_seq(d, id, &s);
#ifdef CALRT_MUTANT_KV_APPEND_OUT_ON_REFUSAL /* the bug: the out-parameter is written before the checks */
    if (s) *position = s->reserved;
#endif
#ifdef CALRT_MUTANT_KV_APPEND_PAST_CONTEXT /* the bug: one token past the context is let through */
    if (rc == CALRT_OK && (n == 0 || (uint64_t)s->reserved + n > (uint64_t)s->m->max_seq + 1)) rc = CALRT_E_INVALID_ARGUMENT;
#else
    if (rc == CALRT_OK && (n == 0 || (uint64_t)s->reserved + n > s->m->max_seq)) rc = CALRT_E_INVALID_ARGUMENT;
#endif
    if (rc == CALRT_OK) { *position = s->reserved; s->reserved += n; }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_kv_commit(calrt_device *d, calrt_kv_seq id) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    seq *s = NULL;
    calrt_status rc = idle_seq(d, id, &s);
    if (rc == CALRT_OK && s->last_failed && s->reserved > s->committed) rc = CALRT_E_INVALID_ARGUMENT;
    if (rc == CALRT_OK) s->committed = s->reserved;
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_kv_rollback(calrt_device *d, calrt_kv_seq id) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    seq *s = NULL;
    calrt_status rc = idle_seq(d, id, &s);
#ifdef CALRT_MUTANT_ROLLBACK_AFTER_FAIL_CLEARS /* the bug: which rows a failed job wrote is unknown: drop them all */
    if (rc == CALRT_OK && s->last_failed) s->committed = 0;
#endif
    if (rc == CALRT_OK) { s->reserved = s->committed; s->last_failed = 0; }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_kv_remove_tokens_at_end(calrt_device *d, calrt_kv_seq id, uint32_t n) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    seq *s = NULL;
    calrt_status rc = idle_seq(d, id, &s);
#ifdef CALRT_MUTANT_REMOVE_TAIL_WHILE_RESERVED /* the bug: a pending reservation is not refused, just dropped */
    if (rc == CALRT_OK && n > s->committed) rc = CALRT_E_INVALID_ARGUMENT;
#elif defined(CALRT_MUTANT_REMOVE_TAIL_CLAMPS) /* the bug: too many tokens empty the sequence */
    if (rc == CALRT_OK && s->reserved != s->committed) rc = CALRT_E_INVALID_ARGUMENT;
    if (rc == CALRT_OK && n > s->committed) n = s->committed;
#else
    if (rc == CALRT_OK && (s->reserved != s->committed || n > s->committed)) rc = CALRT_E_INVALID_ARGUMENT;
#endif
    if (rc == CALRT_OK) s->committed = s->reserved = s->committed - n;
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_kv_free(calrt_device *d, calrt_kv_seq id) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    seq *s = NULL;
    calrt_status rc = idle_seq(d, id, &s);
#ifdef CALRT_MUTANT_KV_FREE_REFUSES_RESERVED /* the bug: a pending reservation is taken for a job in flight */
    if (rc == CALRT_OK && s->reserved > s->committed) rc = CALRT_E_DEVICE_BUSY;
#endif
#ifdef CALRT_MUTANT_KV_FREE_IN_FLIGHT /* the bug: the job writing it is not checked (unlinked, not freed: no crash) */
    if (rc == CALRT_E_DEVICE_BUSY) {
        s = find_seq(d, id);
        for (seq **p = &d->seqs; *p; p = &(*p)->next) {
            if (*p == s) { *p = s->next; break; }
        }
        s->m->live--;
        pthread_mutex_unlock(&d->mu);
        return CALRT_OK;
    }
#endif
    if (rc == CALRT_OK) {
        for (seq **p = &d->seqs; *p; p = &(*p)->next) {
            if (*p == s) { *p = s->next; break; }
        }
#ifdef CALRT_MUTANT_KV_REUSE_STALE_LENGTH
        d->mut_freed_model = s->m, d->mut_freed_len = s->committed;
#endif
#ifdef CALRT_MUTANT_KV_FREE_LEAKS_USED /* the bug: a slot that holds tokens goes back to no pool */
        if (!s->committed)
#endif
        s->m->live--;
        free_seq(s);
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_kv_length(calrt_device *d, calrt_kv_seq id, uint32_t *committed, uint32_t *reserved) {
    if (!d || !committed || !reserved) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    seq *s = find_seq(d, id);
#ifdef CALRT_MUTANT_KV_LENGTH_SWAPPED /* the bug: the two out-parameters the other way round */
    if (s) { *committed = s->reserved; *reserved = s->committed; }
#else
    if (s) { *committed = s->committed; *reserved = s->reserved; }
#endif
    pthread_mutex_unlock(&d->mu);
#ifdef CALRT_MUTANT_KV_LENGTH_FREED_ZERO /* the bug: the runtime's lookup answers an empty default for any id */
    if (!s) { *committed = *reserved = 0; return CALRT_OK; }
#endif
    return s ? CALRT_OK : CALRT_E_INVALID_ARGUMENT;
}

calrt_status calrt_memory_usage(calrt_device *d, uint32_t chip, calrt_memory *out) {
#ifdef CALRT_MUTANT_CHIP_PAST_BOARD_CLAMPED /* the bug: the index is clamped to the board, not refused */
    if (chip >= REF_CHIPS) chip = REF_CHIPS - 1;
#endif
    if (!d || !out || chip >= REF_CHIPS) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = d->f_no_mem ? CALRT_E_NOT_SUPPORTED : CALRT_OK;
    if (rc == CALRT_OK) {
        uint32_t src = chip;
#ifdef CALRT_MUTANT_MEMORY_SWAPPED /* the bug: the other chip's figures */
        src = REF_CHIPS - 1 - chip;
#endif
        out->used_bytes = REF_BASELINE + (d->current ? d->current->plan[src] : 0);
#ifdef CALRT_MUTANT_UNLOAD_LEAK
        out->used_bytes += d->mut_leaked;
#endif
#ifdef CALRT_MUTANT_UNLOAD_LEAK_CHIP1
        if (src == 1) out->used_bytes += d->mut_leaked1;
#endif
#ifdef CALRT_MUTANT_BOARD_RESET_LEAKS_PLAN
        out->used_bytes += d->mut_board_leak[src];
#endif
        out->total_bytes = REF_DRAM;
#ifdef CALRT_MUTANT_MEMORY_KIB /* the bug: KiB, not bytes */
        out->used_bytes /= 1024;
        out->total_bytes /= 1024;
#endif
#ifdef CALRT_MUTANT_MEMORY_USED_KIB /* the bug: the used figure in KiB, the total in bytes */
        out->used_bytes /= 1024;
#endif
#ifdef CALRT_MUTANT_MEMORY_FREE_AS_USED /* the bug: the runtime's free figure copied into used */
        out->used_bytes = out->total_bytes - out->used_bytes;
#endif
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_chip_counters(calrt_device *d, uint32_t chip, calrt_counters *out) {
#ifdef CALRT_MUTANT_CHIP_PAST_BOARD_CLAMPED /* the bug: the index is clamped to the board, not refused */
    if (chip >= REF_CHIPS) chip = REF_CHIPS - 1;
#endif
    if (!d || !out || chip >= REF_CHIPS) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
#ifdef CALRT_MUTANT_COUNTERS_CHIPS_SWAPPED /* the bug: the runtime numbers the chips the other way round here */
    chip = REF_CHIPS - 1 - chip;
#endif
    *out = d->chips[chip].counters;
#ifdef CALRT_MUTANT_COUNTERS_CLEAR_ON_READ /* the bug: the hardware's read-to-clear registers, passed through */
    d->chips[chip].counters.finished = d->chips[chip].counters.failed = 0;
#endif
#ifdef CALRT_MUTANT_PENDING_RUNNING_ONLY /* the bug: pending read from the busy banks, the queue not counted */
    out->pending = 0;
    for (int b = 0; b < REF_BANKS; b++) out->pending += d->chips[chip].running[b] && !terminal(d->chips[chip].running[b]->info.state);
#endif
    pthread_mutex_unlock(&d->mu);
    return CALRT_OK;
}

calrt_status calrt_chip_health(calrt_device *d, uint32_t chip, uint32_t *health) {
#ifdef CALRT_MUTANT_CHIP_PAST_BOARD_CLAMPED /* the bug: the index is clamped to the board, not refused */
    if (chip >= REF_CHIPS) chip = REF_CHIPS - 1;
#endif
    if (!d || !health || chip >= REF_CHIPS) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
#ifdef CALRT_MUTANT_HEALTH_CHIPS_SWAPPED /* the bug: the runtime numbers the chips the other way round here */
    chip = REF_CHIPS - 1 - chip;
#endif
    *health = d->chips[chip].health;
#ifdef CALRT_MUTANT_HEALTH_FAULT_ALL_CHIPS /* the bug: the board's fault register read for every chip */
    for (int cc = 0; cc < REF_CHIPS; cc++)
        if (d->chips[cc].health == CALRT_HEALTH_FAULTED) *health = CALRT_HEALTH_FAULTED;
#endif
#ifndef CALRT_MUTANT_HEALTH_NEVER_HUNG /* the bug: health is the fault latch only; a hung job is not looked at */
    for (int b = 0; b < REF_BANKS; b++) {
        job *j = d->chips[chip].running[b];
        if (j && j->hung && !terminal(j->info.state)) *health = CALRT_HEALTH_HUNG;
    }
#ifdef CALRT_MUTANT_HUNG_LATCH_STICKY /* the bug: a hang once seen is reported until a board reset */
    if (*health == CALRT_HEALTH_HUNG) d->chips[chip].mut_hung_latch = 1;
    if (d->chips[chip].mut_hung_latch && *health == CALRT_HEALTH_OK) *health = CALRT_HEALTH_HUNG;
#endif
#endif
    pthread_mutex_unlock(&d->mu);
    return CALRT_OK;
}

calrt_status calrt_reset(calrt_device *d, uint32_t scope, uint32_t chip) {
#ifdef CALRT_MUTANT_RESET_CHIP_PAST_BOARD /* the bug: the chip index is not checked; its mask covers no chip */
    if (!d || (scope != CALRT_RESET_CHIP && scope != CALRT_RESET_BOARD) || (scope == CALRT_RESET_CHIP && chip >= 32))
        return CALRT_E_INVALID_ARGUMENT;
#else
    if (!d || (scope != CALRT_RESET_CHIP && scope != CALRT_RESET_BOARD) || (scope == CALRT_RESET_CHIP && chip >= REF_CHIPS))
        return CALRT_E_INVALID_ARGUMENT;
#endif
    pthread_mutex_lock(&d->mu);
    if (scope == CALRT_RESET_CHIP && d->f_no_chip_reset) {
        pthread_mutex_unlock(&d->mu);
        return CALRT_E_NOT_SUPPORTED;
    }
    if (d->f_reset_fail) { /* the reset itself fails: nothing is reset (docs/runtime.md §4 reset_failure) */
        d->f_reset_fail--;
        pthread_mutex_unlock(&d->mu);
        return CALRT_E_DEVICE_LOST;
    }
#ifdef CALRT_MUTANT_CHIP_RESET_IGNORES_INDEX /* the bug: the runtime's reset takes no chip id; chip 0 it is */
    chip = 0;
#endif
    uint32_t mask = scope == CALRT_RESET_BOARD ? (1u << REF_CHIPS) - 1 : 1u << chip;
#ifdef CALRT_MUTANT_STAMPS_BACKWARD_AFTER_RESET
    for (int c = 0; c < REF_CHIPS; c++)
        if (mask >> c & 1) d->mut_reset_at[c] = now_ns();
#endif
#ifdef CALRT_MUTANT_CHIP_RESET_ABORTS_ALL /* the bug: the chip reset is the runtime's board reset underneath */
    abort_jobs(d, (1u << REF_CHIPS) - 1, 1);
#endif
    abort_jobs(d, mask, 1); /* returns once the workers of these chips left their jobs */
    for (calrt_buffer *b = d->buffers; b; b = b->next) {
#ifdef CALRT_MUTANT_QUARANTINE_ANY_RESET /* the bug: every quarantine is lifted, whichever chip was reset */
        if (b->quarantined || (b->owner_mask & mask)) b->quarantined = 0, b->owner = 0, b->owner_mask = 0;
#elif defined(CALRT_MUTANT_BOARD_RESET_KEEPS_QUARANTINE) /* the bug: the quarantine is lifted on the chip-reset path */
        if ((b->owner_mask & mask) && !(scope == CALRT_RESET_BOARD && b->quarantined))
            b->quarantined = 0, b->owner = 0, b->owner_mask = 0;
#else
        if (b->owner_mask & mask) b->quarantined = 0, b->owner = 0, b->owner_mask = 0; /* DMA state known again */
#endif
    }
    for (int c = 0; c < REF_CHIPS; c++)
#ifdef CALRT_MUTANT_CHIP_RESET_KEEPS_FAULT /* the bug: the fault latch is cleared by the board reset only */
        if ((mask >> c & 1) && scope == CALRT_RESET_BOARD) d->chips[c].health = CALRT_HEALTH_OK;
#elif defined(CALRT_MUTANT_CHIP_RESET_CLEARS_ALL_FAULTS) /* the bug: one board-wide fault latch, cleared by any reset */
        if (1) d->chips[c].health = CALRT_HEALTH_OK;
#elif defined(CALRT_MUTANT_BOARD_RESET_KEEPS_FAULT) /* the bug: the fault latch is cleared by the chip reset only */
        if ((mask >> c & 1) && scope == CALRT_RESET_CHIP) d->chips[c].health = CALRT_HEALTH_OK;
#else
        if (mask >> c & 1) d->chips[c].health = CALRT_HEALTH_OK;
#endif
#ifdef CALRT_MUTANT_HUNG_LATCH_STICKY
    for (int c = 0; c < REF_CHIPS && scope == CALRT_RESET_BOARD; c++) d->chips[c].mut_hung_latch = 0;
#endif
    if (scope == CALRT_RESET_BOARD) {
#ifndef CALRT_MUTANT_BOARD_RESET_KEEPS_KV /* the bug: every sequence survives the board reset */
        free_seqs(d);
#endif
#ifdef CALRT_MUTANT_BOARD_RESET_LEAKS_PLAN /* the bug: the reset drops the calbin, not the arena it took */
        for (int c = 0; c < REF_CHIPS && d->current; c++) d->mut_board_leak[c] += d->current->plan[c];
#endif
#ifndef CALRT_MUTANT_BOARD_RESET_KEEPS_CONFIG /* the bug: the calbin stays current across a board reset */
        d->current = NULL;
#endif
    } else {
        for (seq *s = d->seqs; s; s = s->next)
#ifdef CALRT_MUTANT_CHIP_RESET_CLEARS_ALL_KV /* the bug: the runtime's KvManager is cleared whole */
            if (!s->busy || (s->m->chip_mask & mask))
#else
            if (s->m->chip_mask & mask)
#endif
#ifdef CALRT_MUTANT_CHIP_RESET_KEEPS_RESERVED /* the bug: the reset empties the cache, not the reservation */
                s->committed = 0, s->busy = 0, s->last_failed = 0;
#else
                s->committed = s->reserved = 0, s->busy = 0, s->last_failed = 0;
#endif
#ifdef CALRT_MUTANT_CHIP_RESET_LOSES_WEIGHTS /* the bug: the chip's DRAM is cleared; the weights are not loaded again */
        for (uint32_t i = 0; d->current && i < d->current->nmodels; i++) {
            model *m = &d->current->models[i];
            if ((m->chip_mask & mask) && m->net.final_norm) memset(m->net.final_norm, 0, sizeof(float) * m->net.d);
        }
#endif
    }
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
#ifdef CALRT_MUTANT_TELEMETRY_COUNTERS_RESET
    mut_telemetry_reset(mask, scope == CALRT_RESET_BOARD);
#endif
    return CALRT_OK;
}

/* ------------------------------------------------------------------------- */
/* Optional device memory calls (calrt_ext.h; docs/calrt-c-abi.md §14): CalRT 0.7.6 WriteMem/ReadMem with a chip
 * id (001 §2.3). A window of REF_MEM_WINDOW bytes per chip at REF_MEM_BASE (above the firmware reserve the mock
 * models), allocated on first use and really written; transfers timed like the mock's (docs/runtime.md §8): one
 * engine per chip and direction at 3 GB/s, a 5 GB/s host link shared by the chips whose engines are busy when a
 * transfer starts, 5 us each. The call returns at the modelled end and stamps the DMA on CLOCK_MONOTONIC, so a
 * busy host delays the return, never the stamps. One device per process: the windows are the process's. */
#ifndef CALRT_REF_NO_MEM /* -DCALRT_REF_NO_MEM: a shim without the optional calls (tests: graded UNSUPPORTED, C4) */
#include <errno.h> /* EINTR: here, beside its one use in this optional block */

#define REF_MEM_BASE (64ull << 20)
#define REF_MEM_WINDOW (64ull << 20)
#define REF_MEM_CHIP_BPS 3e9
#define REF_MEM_LINK_BPS 5e9
#define REF_MEM_LATENCY_NS 5000ull

static struct {
    pthread_mutex_t mu;
    uint8_t *window[REF_CHIPS];
    uint64_t free_ns[REF_CHIPS][2]; /* [chip][to_device]: when its engine is free on the device clock */
} g_mem = {.mu = PTHREAD_MUTEX_INITIALIZER};

__attribute__((destructor)) static void mem_free_windows(void) {
    for (int c = 0; c < REF_CHIPS; c++) {
        free(g_mem.window[c]);
        g_mem.window[c] = NULL;
    }
}

calrt_status calrt_mem_window(calrt_device *d, uint32_t chip, uint64_t *address, uint64_t *bytes) {
    if (!d || !address || !bytes || chip >= REF_CHIPS) return CALRT_E_INVALID_ARGUMENT;
    *address = REF_MEM_BASE;
    *bytes = REF_MEM_WINDOW;
    return CALRT_OK;
}

static calrt_status mem_transfer(calrt_device *d, uint32_t chip, uint64_t address, uint8_t *host, uint64_t bytes,
                                 int to_device, calrt_mem_timing *timing) {
    if (!d || (!host && bytes) || chip >= REF_CHIPS || address < REF_MEM_BASE || bytes > REF_MEM_WINDOW ||
        address - REF_MEM_BASE > REF_MEM_WINDOW - bytes)
        return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = d->current ? CALRT_E_DEVICE_BUSY
                      : d->chips[chip].health != CALRT_HEALTH_OK ? CALRT_E_DEVICE_LOST
                                                                 : CALRT_OK;
    pthread_mutex_unlock(&d->mu);
    if (rc != CALRT_OK) return rc;
    pthread_mutex_lock(&g_mem.mu);
    if (!g_mem.window[chip] && !(g_mem.window[chip] = calloc(1, REF_MEM_WINDOW))) {
        pthread_mutex_unlock(&g_mem.mu);
        return CALRT_E_OUT_OF_MEMORY;
    }
    uint64_t now = now_ns(), start = g_mem.free_ns[chip][to_device] > now ? g_mem.free_ns[chip][to_device] : now;
    int sharing = 1;
    for (int c = 0; c < REF_CHIPS; c++)
        if (c != (int)chip && (g_mem.free_ns[c][0] > start || g_mem.free_ns[c][1] > start)) sharing++;
    double rate = REF_MEM_LINK_BPS / sharing < REF_MEM_CHIP_BPS ? REF_MEM_LINK_BPS / sharing : REF_MEM_CHIP_BPS;
    uint64_t end = start + REF_MEM_LATENCY_NS + (uint64_t)((double)bytes / rate * 1e9);
    g_mem.free_ns[chip][to_device] = end;
    uint8_t *mem = g_mem.window[chip] + (address - REF_MEM_BASE);
    pthread_mutex_unlock(&g_mem.mu);
    if (bytes) {
        if (to_device)
            memcpy(mem, host, bytes);
        else
            memcpy(host, mem, bytes);
    }
    struct timespec until = {.tv_sec = (time_t)(end / 1000000000ull), .tv_nsec = (long)(end % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR) {
    }
    if (timing) timing->start_ns = start, timing->end_ns = end;
    return CALRT_OK;
}

calrt_status calrt_write_mem(calrt_device *d, uint32_t chip, uint64_t address, const void *data, uint64_t bytes,
                             calrt_mem_timing *timing) {
    return mem_transfer(d, chip, address, (uint8_t *)(uintptr_t)data, bytes, 1, timing);
}

calrt_status calrt_read_mem(calrt_device *d, uint32_t chip, uint64_t address, void *out, uint64_t bytes,
                            calrt_mem_timing *timing) {
    return mem_transfer(d, chip, address, (uint8_t *)out, bytes, 0, timing);
}
#endif /* CALRT_REF_NO_MEM */

/* Enumeration (calrt_ext.h, docs/calrt-c-abi.md §11): the reference board is one board, "reference0". It has
 * no hardware to select, so any CALRT_DEVICE opens the same model (§10); the name only labels it. */
static const char REF_BOARD_NAME[] = "reference0";

calrt_status calrt_ext_device_count(uint32_t *count) {
    if (!count) return CALRT_E_INVALID_ARGUMENT;
    *count = 1;
    return CALRT_OK;
}

calrt_status calrt_ext_device_name(uint32_t index, char *buf, uint32_t len) {
    if (!buf || index != 0 || len < sizeof REF_BOARD_NAME) return CALRT_E_INVALID_ARGUMENT;
    memcpy(buf, REF_BOARD_NAME, sizeof REF_BOARD_NAME);
    return CALRT_OK;
}
/* ------------------------------------------------------------------------- */
/* Optional per-chip telemetry (calrt_ext.h; docs/calrt-c-abi.md §15). A first-order thermal model per chip, driven
 * by the work the board computes: a chip draws REF_TEL_IDLE_W idle and REF_TEL_MAX_W while a job runs on it (from
 * its start to its end stamp, scaled by the clock while throttled); its temperature relaxes towards
 * ambient + power x REF_TEL_C_PER_W with time constant REF_TEL_TAU_S; the reported power is averaged over
 * REF_TEL_POWER_TAU_S. At REF_TEL_LIMIT_C it throttles (half clock) until it has cooled REF_TEL_HYSTERESIS_C below.
 * Healthy full load settles at 75 C, under the limit. ECC counters stay 0 (the model has no memory errors);
 * reset_count is not kept (CALRT_UNKNOWN_U64). One device per process: the state is the process's and, like a
 * real board's temperature, outlives a close. Mutants (tests: conformance must FAIL them naming the clause):
 *   -DCALRT_MUTANT_TELEMETRY_FROZEN      every reading is the first one (a stuck sensor);
 *   -DCALRT_MUTANT_TELEMETRY_DECREASING  the ECC and throttle counters go down between readings;
 *   -DCALRT_MUTANT_TELEMETRY_MILLIDEGREES  temperatures in milli-degrees Celsius;
 *   -DCALRT_MUTANT_TELEMETRY_POWER_MW    power and its limit in milliwatts;
 *   -DCALRT_MUTANT_TELEMETRY_SAMPLE_US   sample_ns in microseconds (the sensor hub's clock, passed through);
 *   -DCALRT_MUTANT_TELEMETRY_CHIPS_SWAPPED  chip c reports the other chip's sensors;
 *   -DCALRT_MUTANT_TELEMETRY_EXACT_SIZE  any size but version 1's is refused (a newer caller's larger struct too);
 *   -DCALRT_MUTANT_TELEMETRY_COUNTERS_RESET  reset_count and the ECC count are kept in firmware RAM that a board
 *                                        reset clears (they count since the last board reset, not power-on);
 *   -DCALRT_MUTANT_TELEMETRY_THROTTLE_WHEN_BUSY  the thermal throttle bit is set whenever the chip computes (the
 *                                        firmware's busy clock gating reported as thermal), however cold. */
#ifndef CALRT_REF_NO_TELEMETRY /* -DCALRT_REF_NO_TELEMETRY: a shim without the call (tests: UNSUPPORTED, C4) */
#define REF_TEL_AMBIENT_C 35.0
#define REF_TEL_C_PER_W 1.0
#define REF_TEL_IDLE_W 6.0
#define REF_TEL_MAX_W 40.0
#define REF_TEL_TAU_S 10.0
#define REF_TEL_POWER_TAU_S 0.5
#define REF_TEL_LIMIT_C 90.0
#define REF_TEL_HYSTERESIS_C 5.0
#define REF_TEL_POWER_LIMIT_W 45.0
#define REF_TEL_CLOCK_MHZ 1000.0

static struct {
    pthread_mutex_t mu;
    int started;
    struct {
        double temp_c, power_w;
        uint64_t t_ns, throttled_ns;
        int throttled;
    } chip[REF_CHIPS];
#ifdef CALRT_MUTANT_TELEMETRY_FROZEN
    int have_first[REF_CHIPS];
    calrt_telemetry first[REF_CHIPS];
#endif
#ifdef CALRT_MUTANT_TELEMETRY_DECREASING
    uint64_t reads;
#endif
#ifdef CALRT_MUTANT_TELEMETRY_COUNTERS_RESET
    uint64_t resets[REF_CHIPS], ecc[REF_CHIPS];
#endif
} g_tel = {.mu = PTHREAD_MUTEX_INITIALIZER};

#ifdef CALRT_MUTANT_TELEMETRY_COUNTERS_RESET
static void mut_telemetry_reset(uint32_t mask, int board) { /* the bug: a board reset clears the counters */
    pthread_mutex_lock(&g_tel.mu);
    for (int c = 0; c < REF_CHIPS; c++) {
        if (!(mask >> c & 1)) continue;
        if (board) g_tel.resets[c] = g_tel.ecc[c] = 0;
        else g_tel.resets[c]++, g_tel.ecc[c] += 3;
    }
    pthread_mutex_unlock(&g_tel.mu);
}
#endif

static void tel_start(uint64_t now) { /* under g_tel.mu: every chip idle at ambient + idle power */
    if (g_tel.started) return;
    g_tel.started = 1;
    for (int c = 0; c < REF_CHIPS; c++) {
        g_tel.chip[c].temp_c = REF_TEL_AMBIENT_C + REF_TEL_IDLE_W * REF_TEL_C_PER_W;
        g_tel.chip[c].power_w = REF_TEL_IDLE_W;
        g_tel.chip[c].t_ns = now;
    }
}

static void tel_advance(int c, uint64_t until, int busy) { /* under g_tel.mu: chip c from its last time to `until` */
    if (until <= g_tel.chip[c].t_ns) return;
    double dt = (double)(until - g_tel.chip[c].t_ns) / 1e9;
    double clock = g_tel.chip[c].throttled ? 0.5 : 1.0;
    double p = busy ? REF_TEL_IDLE_W + (REF_TEL_MAX_W - REF_TEL_IDLE_W) * clock : REF_TEL_IDLE_W;
    double target = REF_TEL_AMBIENT_C + p * REF_TEL_C_PER_W;
    g_tel.chip[c].temp_c = target + (g_tel.chip[c].temp_c - target) * exp(-dt / REF_TEL_TAU_S);
    g_tel.chip[c].power_w = p + (g_tel.chip[c].power_w - p) * exp(-dt / REF_TEL_POWER_TAU_S);
    if (g_tel.chip[c].throttled) g_tel.chip[c].throttled_ns += until - g_tel.chip[c].t_ns;
    if (g_tel.chip[c].temp_c >= REF_TEL_LIMIT_C) g_tel.chip[c].throttled = 1;
    else if (g_tel.chip[c].temp_c < REF_TEL_LIMIT_C - REF_TEL_HYSTERESIS_C) g_tel.chip[c].throttled = 0;
    g_tel.chip[c].t_ns = until;
}

static void telemetry_work(uint32_t chip_mask, uint64_t start_ns, uint64_t end_ns) {
    pthread_mutex_lock(&g_tel.mu);
    tel_start(start_ns);
    for (int c = 0; c < REF_CHIPS; c++) {
        if (!(chip_mask >> c & 1)) continue;
        tel_advance(c, start_ns, 0);
        tel_advance(c, end_ns, 1);
    }
    pthread_mutex_unlock(&g_tel.mu);
}

calrt_status calrt_chip_telemetry(calrt_device *d, uint32_t chip, calrt_telemetry *out) {
    if (!d || !out || chip >= REF_CHIPS || out->size < CALRT_TELEMETRY_V1_SIZE) return CALRT_E_INVALID_ARGUMENT;
#ifdef CALRT_MUTANT_TELEMETRY_EXACT_SIZE /* the bug: "size == sizeof" where the ABI says "size >= version 1's" */
    if (out->size != CALRT_TELEMETRY_V1_SIZE) return CALRT_E_INVALID_ARGUMENT;
#endif
    calrt_telemetry t;
    memset(&t, 0, sizeof t);
    uint64_t now = now_ns();
    pthread_mutex_lock(&g_tel.mu);
    tel_start(now);
#ifdef CALRT_MUTANT_TELEMETRY_CHIPS_SWAPPED /* the bug: the sensor hub numbers the chips the other way round */
    chip = REF_CHIPS - 1 - chip;
#endif
    tel_advance((int)chip, now, 0);
    t.size = out->size < sizeof t ? out->size : (uint32_t)sizeof t;
    t.version = CALRT_TELEMETRY_VERSION;
    t.sample_ns = now;
#ifdef CALRT_MUTANT_TELEMETRY_SAMPLE_US /* the bug: the sensor hub's microsecond stamp, passed through */
    t.sample_ns = now / 1000;
#endif
    t.temperature_c = g_tel.chip[chip].temp_c;
    t.temperature_limit_c = REF_TEL_LIMIT_C;
    t.power_w = g_tel.chip[chip].power_w;
    t.power_limit_w = REF_TEL_POWER_LIMIT_W;
    t.clock_max_mhz = REF_TEL_CLOCK_MHZ;
    t.clock_mhz = g_tel.chip[chip].throttled ? REF_TEL_CLOCK_MHZ / 2 : REF_TEL_CLOCK_MHZ;
#ifdef CALRT_MUTANT_TELEMETRY_CLOCK_GHZ /* the bug: the clock driver's GHz, passed through */
    t.clock_max_mhz /= 1000.0;
    t.clock_mhz /= 1000.0;
#endif
#ifdef CALRT_MUTANT_TELEMETRY_POWER_BOARD /* the bug: the board's one power rail reported for every chip */
    for (int cc = 0; cc < REF_CHIPS; cc++)
        if (cc != (int)chip) tel_advance(cc, now, 0), t.power_w += g_tel.chip[cc].power_w;
#endif
    t.throttle_reasons = g_tel.chip[chip].throttled ? CALRT_THROTTLE_THERMAL : 0;
    t.throttled_ns = g_tel.chip[chip].throttled_ns;
    t.ecc_correctable = 0;
    t.ecc_uncorrectable = 0;
    t.reset_count = CALRT_UNKNOWN_U64;
#ifdef CALRT_MUTANT_TELEMETRY_MILLIDEGREES /* the bug: milli-degrees where the ABI says degrees */
    t.temperature_c *= 1000.0;
    t.temperature_limit_c *= 1000.0;
#endif
#ifdef CALRT_MUTANT_TELEMETRY_POWER_MW /* the bug: the power rail's register in milliwatts, passed through */
    t.power_w *= 1000.0;
    t.power_limit_w *= 1000.0;
#endif
#ifdef CALRT_MUTANT_TELEMETRY_COUNTERS_RESET
    t.reset_count = g_tel.resets[chip];
    t.ecc_correctable = g_tel.ecc[chip];
#endif
#ifdef CALRT_MUTANT_TELEMETRY_THROTTLE_WHEN_BUSY /* the bug: busy clock gating reported as a thermal throttle */
    if (g_tel.chip[chip].power_w > REF_TEL_IDLE_W + 1.0) t.throttle_reasons |= CALRT_THROTTLE_THERMAL;
#endif
#ifdef CALRT_MUTANT_TELEMETRY_DECREASING /* the bug: counters that run backwards (a wrapped or reset register) */
    g_tel.reads++;
    t.ecc_correctable = 1000 - g_tel.reads % 1000;
    t.throttled_ns = 1000000000ull - g_tel.reads % 1000;
#endif
#ifdef CALRT_MUTANT_TELEMETRY_FROZEN /* the bug: the sensor answers its first reading forever */
    if (!g_tel.have_first[chip]) g_tel.have_first[chip] = 1, g_tel.first[chip] = t;
    t = g_tel.first[chip];
#endif
    pthread_mutex_unlock(&g_tel.mu);
    memcpy(out, &t, t.size);
    out->size = t.size;
    return CALRT_OK;
}
#endif /* CALRT_REF_NO_TELEMETRY */
