/*
 * calrt_ext.h -- optional, versioned extensions to the calctl CalRT C ABI 1.x (docs/calrt-c-abi.md §11).
 *
 * Nothing here is required. calctl looks each symbol up after loading a shim and
 * uses it only when present; a thin vendor shim over CalRT 0.7.6 exports none of
 * them (the vendor calbin carries its own tensors and architecture). The
 * reference board (calrt_reference.c) needs the model extension, because it
 * computes the model itself from the package's parameter blobs.
 *
 *   calrt_ext_model_set   "model v1": a model's architecture and its parameter table,
 *                         given after calrt_calbin_create and before calrt_configure.
 *                         Returns NOT_SUPPORTED for a desc->version it does not know.
 *   calrt_ext_fault_set   test hook: arm a fault (codes below) on the open device, so a
 *                         conformance run can show timeouts, CCU/DMA failures and resets.
 *                         A production shim must not export it.
 *   calrt_ext_device_identity  which board the open device is: a stable identifier (a PCI
 *                         address such as "0000:01:00.0", or a serial) and whether it is
 *                         hardware or a software model. calctl keys its board lock on the
 *                         identifier and labels every result of a software model as such.
 *                         A production shim should export it (the ABI 1.1 candidate of
 *                         docs/calrt-c-abi.md §10).
 */
#ifndef CALRT_EXT_H
#define CALRT_EXT_H

#include "calrt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CALRT_EXT_MODEL_VERSION 1

/* calrt_ext_model_desc.flags */
#define CALRT_EXT_TIED_EMBEDDINGS 0x1u   /* logits = h @ embed^T (no lm_head tensor) */
#define CALRT_EXT_QKV_BIAS 0x2u          /* bq/bk/bv added after the q/k/v projections (qwen2) */
#define CALRT_EXT_QK_NORM 0x4u           /* RMSNorm over head_dim of q and k before RoPE (qwen3) */
#define CALRT_EXT_ROPE_HALF 0x8u         /* RoPE rotates halves (HF "rotate_half"); default: (even, odd) pairs */

/* calrt_ext_param.role: what a tensor is; per-layer roles carry calrt_ext_param.layer */
enum {
    CALRT_EXT_EMBED = 1,       /* [vocab, d_model] */
    CALRT_EXT_FINAL_NORM = 2,  /* [d_model] */
    CALRT_EXT_LM_HEAD = 3,     /* [d_model, vocab] (absent with CALRT_EXT_TIED_EMBEDDINGS) */
    CALRT_EXT_ATTN_NORM = 10,  /* [d_model] */
    CALRT_EXT_WQ = 11,         /* [d_model, n_heads * head_dim] */
    CALRT_EXT_WK = 12,         /* [d_model, n_kv_heads * head_dim] */
    CALRT_EXT_WV = 13,         /* [d_model, n_kv_heads * head_dim] */
    CALRT_EXT_WO = 14,         /* [n_heads * head_dim, d_model] */
    CALRT_EXT_MLP_NORM = 15,   /* [d_model] */
    CALRT_EXT_W_GATE = 16,     /* [d_model, d_ff] */
    CALRT_EXT_W_UP = 17,       /* [d_model, d_ff] */
    CALRT_EXT_W_DOWN = 18,     /* [d_ff, d_model] */
    CALRT_EXT_BQ = 19,         /* [n_heads * head_dim]     (CALRT_EXT_QKV_BIAS) */
    CALRT_EXT_BK = 20,         /* [n_kv_heads * head_dim]  (CALRT_EXT_QKV_BIAS) */
    CALRT_EXT_BV = 21,         /* [n_kv_heads * head_dim]  (CALRT_EXT_QKV_BIAS) */
    CALRT_EXT_Q_NORM = 22,     /* [head_dim]               (CALRT_EXT_QK_NORM) */
    CALRT_EXT_K_NORM = 23      /* [head_dim]               (CALRT_EXT_QK_NORM) */
};

/* calrt_ext_param.dtype of a matrix kept in GGML blocks (docs/package-format.md "Quantised tensors"): 32 weights
 * a block, one fp16 scale d (q4_1: and an fp16 min m) then the quants; q4: low nibbles are weights 0..15, high
 * nibbles 16..31. The blocks run along the stored rows: the embedding's rows are its [vocab] axis, every other
 * matrix is stored transposed (one row per output feature, [out][in / 32] blocks). `elements` counts weights. */
enum {
    CALRT_EXT_DTYPE_Q4_0 = 0x101,  /* 18-byte blocks: w = (q - 8) * d */
    CALRT_EXT_DTYPE_Q4_1 = 0x102,  /* 20-byte blocks: w = q * d + m */
    CALRT_EXT_DTYPE_Q8_0 = 0x103   /* 34-byte blocks: w = (int8) q * d */
};

typedef struct {
    uint32_t role;             /* CALRT_EXT_* above */
    uint32_t layer;            /* per-layer roles: 0..n_layers-1; else 0 */
    const char *file;          /* relative to calrt_calbin_desc.path; no absolute path, no ".." */
    uint64_t offset;           /* bytes into the file */
    uint32_t dtype;            /* CALRT_DTYPE_FP32 / FP16 / BF16, little-endian, or CALRT_EXT_DTYPE_Q* below */
    uint64_t elements;         /* number of elements (row-major, shape as the role says) */
} calrt_ext_param;

typedef struct {
    uint32_t version;          /* CALRT_EXT_MODEL_VERSION */
    const char *alias;         /* a model of the calbin (calrt_model_desc.alias) */
    const char *family;        /* architecture family, informational */
    uint32_t n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab_size;
    uint32_t flags;            /* CALRT_EXT_* flags */
    double rope_theta;
    double norm_eps;
    uint32_t n_params;
    const calrt_ext_param *params;
} calrt_ext_model_desc;

calrt_status calrt_ext_model_set(calrt_device *dev, calrt_calbin *calbin, const calrt_ext_model_desc *desc);

/* calrt_ext_fault_set(dev, fault, value): test hook */
enum {
    CALRT_EXT_FAULT_BUSY = 1,            /* the next N submits return DEVICE_BUSY */
    CALRT_EXT_FAULT_HANG = 2,            /* the next N jobs never finish until a reset */
    CALRT_EXT_FAULT_CCU = 3,             /* the next N jobs fail with CCU_EXCEPTION; their chip halts */
    CALRT_EXT_FAULT_NO_CHIP_MEMORY = 4,  /* calrt_memory_usage returns NOT_SUPPORTED */
    CALRT_EXT_FAULT_DELAY_MS = 5,        /* every job takes at least N ms more */
    CALRT_EXT_FAULT_DMA = 6,             /* the next N jobs fail with UNKNOWN_DMA_STATE; buffers held until reset */
    CALRT_EXT_FAULT_NO_CHIP_RESET = 7,   /* calrt_reset(CHIP) returns NOT_SUPPORTED */
    CALRT_EXT_FAULT_RESET_FAIL = 8       /* the next N calrt_reset calls return DEVICE_LOST and reset nothing */
};

calrt_status calrt_ext_fault_set(calrt_device *dev, uint32_t fault, uint32_t value);

/* calrt_ext_device_identity(dev, &out): which board was opened */
#define CALRT_EXT_ID_LEN 64
enum {
    CALRT_EXT_DEVICE_UNKNOWN = 0,         /* the shim cannot tell */
    CALRT_EXT_DEVICE_HARDWARE = 1,        /* a physical board */
    CALRT_EXT_DEVICE_SOFTWARE_MODEL = 2   /* a simulator or reference model: no hardware */
};

typedef struct {
    char id[CALRT_EXT_ID_LEN];  /* PCI address or serial of the opened board; "" for a software model */
    uint32_t kind;              /* CALRT_EXT_DEVICE_* */
} calrt_ext_identity;

calrt_status calrt_ext_device_identity(calrt_device *dev, calrt_ext_identity *out);

/* Optional enumeration (docs/calrt-c-abi.md §11): the boards this host has, before any device is open, so
 * `calctl device list` and `--boards all` need no boards file. Both or neither.
 *   calrt_ext_device_count  *count = the number of boards (0: none).
 *   calrt_ext_device_name   the CALRT_DEVICE value that opens board `index` (0 .. count-1), NUL-terminated in
 *                           `buf` of `len` bytes: INVALID_ARGUMENT for an index past the count, a NULL buffer or a
 *                           name that does not fit (names are at most CALRT_EXT_ID_LEN - 1 bytes). */
calrt_status calrt_ext_device_count(uint32_t *count);
calrt_status calrt_ext_device_name(uint32_t index, char *buf, uint32_t len);

/* Optional device memory calls (docs/calrt-c-abi.md §14): CalRT 0.7.6 WriteMem/ReadMem with a chip id (001 §2.3).
 * A shim exports all three or none; calctl device selftest grades a shim without them UNSUPPORTED (C4).
 *   calrt_mem_window  the window of `chip`'s memory a self-test may overwrite: [*address, *address + *bytes).
 *   calrt_write_mem   copy `bytes` from `data` to `chip` at `address`; returns when the DMA is done.
 *   calrt_read_mem    copy `bytes` from `chip` at `address` to `out`; returns when the DMA is done.
 * Both copies refuse with INVALID_ARGUMENT outside the window or the board, DEVICE_BUSY while a calbin is
 * configured (the window is its memory), DEVICE_LOST on a chip that is not healthy. `timing` (may be NULL)
 * receives the DMA's start and end on the device clock (CLOCK_MONOTONIC ns), 0 and 0 when not stamped. */
typedef struct {
    uint64_t start_ns;
    uint64_t end_ns;
} calrt_mem_timing;

calrt_status calrt_mem_window(calrt_device *dev, uint32_t chip, uint64_t *address, uint64_t *bytes);
calrt_status calrt_write_mem(calrt_device *dev, uint32_t chip, uint64_t address, const void *data, uint64_t bytes,
                             calrt_mem_timing *timing);
calrt_status calrt_read_mem(calrt_device *dev, uint32_t chip, uint64_t address, void *out, uint64_t bytes,
                            calrt_mem_timing *timing);

#ifdef __cplusplus
}
#endif
#endif /* CALRT_EXT_H */
