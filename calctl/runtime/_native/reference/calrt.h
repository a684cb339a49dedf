/*
 * calrt.h -- the C ABI calctl expects from a thin vendor shim over CalRT 0.7.6.
 *
 * Normative text: docs/calrt-c-abi.md (this header is its machine-readable part;
 * calctl/runtime/_native/lib.py mirrors it with ctypes). ABI version 1.0.
 *
 * Conventions: every function returns calrt_status (0 = CALRT_OK) unless noted;
 * out-parameters are written only on CALRT_OK; all strings are NUL-terminated
 * UTF-8 and are copied by the callee (the caller may free them after the call);
 * every function is thread-safe for one device; calrt_job_wait and
 * calrt_job_wait_any block without holding any lock other calls need.
 */
#ifndef CALRT_H
#define CALRT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CALRT_ABI_MAJOR 1
#define CALRT_ABI_MINOR 0

#define CALRT_MAX_CHIPS 16
#define CALRT_MAX_DIMS 6
#define CALRT_VERSION_LEN 64
#define CALRT_UNKNOWN_U64 UINT64_MAX   /* "the runtime cannot tell" -- never reported as 0 */
#define CALRT_KV_NONE 0ULL              /* inactive lane in calrt_job_desc.kv */
#define CALRT_DIM_BATCH (-1)            /* the batch dimension "B" in a tensor shape */
#define CALRT_ALIGN 64                  /* tensor alignment inside a buffer */

typedef int32_t calrt_status;
enum {
    CALRT_OK = 0,
    CALRT_E_DEVICE_BUSY = 1,
    CALRT_E_TIMEOUT = 2,
    CALRT_E_ALREADY_CONFIGURED = 3,
    CALRT_E_NOT_CONFIGURED = 4,
    CALRT_E_INVALID_CALBIN = 5,
    CALRT_E_OUT_OF_MEMORY = 6,
    CALRT_E_CCU_EXCEPTION = 7,
    CALRT_E_UNKNOWN_DMA_STATE = 8,
    CALRT_E_DEVICE_LOST = 9,
    CALRT_E_INVALID_ARGUMENT = 10,
    CALRT_E_DEVICE_IN_USE = 11,
    CALRT_E_BUFFER_IN_USE = 12,
    CALRT_E_NOT_SUPPORTED = 13,
    CALRT_E_JOB_ABORTED = 14,
    CALRT_E_INTERNAL = 99
};

enum { CALRT_ENGINE_AUTO = 0, CALRT_ENGINE_PING = 1, CALRT_ENGINE_PONG = 2 };
enum { CALRT_GRAPH_PREFILL = 0, CALRT_GRAPH_DECODE = 1 };
enum { CALRT_JOB_QUEUED = 0, CALRT_JOB_RUNNING = 1, CALRT_JOB_SUCCEEDED = 2, CALRT_JOB_FAILED = 3, CALRT_JOB_ABORTED = 4 };
enum { CALRT_RESET_CHIP = 1, CALRT_RESET_BOARD = 2 };
enum { CALRT_HEALTH_OK = 0, CALRT_HEALTH_FAULTED = 1, CALRT_HEALTH_HUNG = 2, CALRT_HEALTH_UNKNOWN = 3 };
enum {
    CALRT_DTYPE_INT8 = 1, CALRT_DTYPE_UINT8 = 2, CALRT_DTYPE_INT16 = 3, CALRT_DTYPE_INT32 = 4,
    CALRT_DTYPE_INT64 = 5, CALRT_DTYPE_FP16 = 6, CALRT_DTYPE_BF16 = 7, CALRT_DTYPE_FP32 = 8
};

typedef struct calrt_device calrt_device;   /* opaque; one per process */
typedef struct calrt_calbin calrt_calbin;   /* opaque; owned by its device */
typedef struct calrt_buffer calrt_buffer;   /* opaque; owned by its device */
typedef uint64_t calrt_job_id;              /* 0 is never a valid job */
typedef uint64_t calrt_kv_seq;              /* 0 (CALRT_KV_NONE) is never a valid sequence */

typedef struct {
    char runtime[CALRT_VERSION_LEN];
    char driver[CALRT_VERSION_LEN];
    char firmware[CALRT_VERSION_LEN];
} calrt_versions;

typedef struct {
    uint32_t chips;
    uint32_t calcores_per_chip;
    uint64_t dram_bytes[CALRT_MAX_CHIPS];   /* CALRT_UNKNOWN_U64 when not reported */
} calrt_topology;

typedef struct {
    uint64_t used_bytes;
    uint64_t total_bytes;                   /* CALRT_UNKNOWN_U64 when not reported */
} calrt_memory;

typedef struct {
    uint64_t pending;
    uint64_t finished;
    uint64_t failed;
} calrt_counters;

typedef struct {
    const char *name;
    uint32_t dtype;                          /* CALRT_DTYPE_* */
    uint32_t rank;                           /* <= CALRT_MAX_DIMS */
    int64_t dims[CALRT_MAX_DIMS];            /* CALRT_DIM_BATCH marks the batch dimension */
} calrt_tensor_desc;

typedef struct {
    const char *name;                        /* exact graph (CalbinModel) name */
    const char *model;                       /* model alias: the KV namespace */
    uint32_t kind;                           /* CALRT_GRAPH_* */
    uint32_t chip_mask;                      /* target chips (tarChipN / section masks) */
    uint32_t max_seq;
    uint32_t n_batch_profiles;
    const uint32_t *batch_profiles;
    uint32_t n_inputs;
    const calrt_tensor_desc *inputs;
    uint32_t n_outputs;
    const calrt_tensor_desc *outputs;
    const char *valid_length_input;          /* CSR: prefill valid length tensor, or NULL */
    const char *positions_input;             /* CSR: decode positions tensor, or NULL */
    const char *lane_valid_input;            /* CSR: inactive-lane mask tensor, or NULL */
} calrt_graph_desc;

typedef struct {
    const char *alias;
    uint32_t chip_mask;
    uint32_t kv_max_sequences;
    uint32_t kv_max_seq;
} calrt_model_desc;

typedef struct {
    const char *path;                        /* package directory holding the vendor calbin */
    uint32_t n_graphs;
    const calrt_graph_desc *graphs;
    uint32_t n_models;
    const calrt_model_desc *models;
    uint32_t n_chips;
    const uint64_t *plan_bytes;              /* per chip: bytes the package's memory plan reserves */
} calrt_calbin_desc;

typedef struct {
    const char *graph;                       /* exact graph name */
    calrt_buffer *inputs;
    calrt_buffer *outputs;
    uint32_t engine;                         /* CALRT_ENGINE_* */
    uint32_t batch;                          /* one of the graph's batch profiles */
    uint32_t n_kv;                           /* == batch */
    const calrt_kv_seq *kv;                  /* per lane; CALRT_KV_NONE for an inactive lane */
    uint64_t generation;                     /* caller tag, echoed in calrt_job_info */
} calrt_job_desc;

typedef struct {
    calrt_job_id id;
    uint32_t state;                          /* CALRT_JOB_* */
    calrt_status status;                     /* why a FAILED/ABORTED job ended; CALRT_OK otherwise */
    uint32_t chip_mask;
    uint32_t engine;
    uint64_t generation;
    uint64_t submit_ns;                      /* CLOCK_MONOTONIC */
    uint64_t start_ns;                       /* 0 = never started */
    uint64_t end_ns;                         /* 0 = not ended / never started */
} calrt_job_info;

/* version / device */
calrt_status calrt_abi_version(uint32_t *major, uint32_t *minor);
calrt_status calrt_device_open(calrt_device **out);
calrt_status calrt_device_close(calrt_device *dev);
calrt_status calrt_versions_get(calrt_device *dev, calrt_versions *out);
calrt_status calrt_topology_get(calrt_device *dev, calrt_topology *out);
const char *calrt_status_string(calrt_status status);   /* static string, never NULL */

/* calbin / configuration */
calrt_status calrt_calbin_create(calrt_device *dev, const calrt_calbin_desc *desc, calrt_calbin **out);
calrt_status calrt_calbin_release(calrt_device *dev, calrt_calbin *calbin);
calrt_status calrt_configure(calrt_device *dev, calrt_calbin *calbin);
calrt_status calrt_reset_configuration(calrt_device *dev);

/* buffers */
calrt_status calrt_buffer_create(calrt_device *dev, uint64_t bytes, calrt_buffer **out);
calrt_status calrt_buffer_data(calrt_device *dev, calrt_buffer *buf, void **data);
calrt_status calrt_buffer_release(calrt_device *dev, calrt_buffer *buf);

/* jobs */
calrt_status calrt_job_submit(calrt_device *dev, const calrt_job_desc *desc, calrt_job_id *out);
calrt_status calrt_job_query(calrt_device *dev, calrt_job_id job, calrt_job_info *out);
calrt_status calrt_job_wait(calrt_device *dev, calrt_job_id job, uint32_t timeout_ms, calrt_job_info *out);
calrt_status calrt_job_wait_any(calrt_device *dev, const calrt_job_id *jobs, uint32_t n, uint32_t timeout_ms, uint32_t *index);
calrt_status calrt_job_release(calrt_device *dev, calrt_job_id job);

/* KV manager: one namespace per model alias */
calrt_status calrt_kv_can_allocate(calrt_device *dev, const char *model, uint32_t n, uint32_t *yes);
calrt_status calrt_kv_allocate(calrt_device *dev, const char *model, calrt_kv_seq *out);
calrt_status calrt_kv_append(calrt_device *dev, calrt_kv_seq seq, uint32_t n, uint32_t *position);
calrt_status calrt_kv_commit(calrt_device *dev, calrt_kv_seq seq);
calrt_status calrt_kv_rollback(calrt_device *dev, calrt_kv_seq seq);
calrt_status calrt_kv_remove_tokens_at_end(calrt_device *dev, calrt_kv_seq seq, uint32_t n);
calrt_status calrt_kv_free(calrt_device *dev, calrt_kv_seq seq);
calrt_status calrt_kv_length(calrt_device *dev, calrt_kv_seq seq, uint32_t *committed, uint32_t *reserved);

/* observation / recovery */
calrt_status calrt_memory_usage(calrt_device *dev, uint32_t chip, calrt_memory *out);   /* NOT_SUPPORTED: unknown */
calrt_status calrt_chip_counters(calrt_device *dev, uint32_t chip, calrt_counters *out); /* NOT_SUPPORTED: unknown */
calrt_status calrt_chip_health(calrt_device *dev, uint32_t chip, uint32_t *health);
calrt_status calrt_reset(calrt_device *dev, uint32_t scope, uint32_t chip);

#ifdef __cplusplus
}
#endif
#endif /* CALRT_H */
