/*
 * calrt_stub.c -- a minimal, deterministic implementation of the calctl CalRT C ABI (calrt.h).
 *
 * Built by the test suite (tests/unit/runtime/conftest.py) into a temporary
 * directory, so the ctypes marshalling in calctl/runtime/_native is exercised
 * against real C. The headers are the package's (calctl/runtime/_native/reference/).
 * It is the "bookkeeping-only" library; the computing board is
 * calctl/runtime/_native/reference/calrt_reference.c. It is NOT a board model: no numerics beyond "outputs are a
 * deterministic function of the inputs", no parallelism beyond per-chip
 * timestamps. What it does implement faithfully is the ABI's bookkeeping:
 * status codes, one device per process, one current calbin, buffer ownership,
 * job states, the KV manager's lengths, per-chip counters, resets.
 *
 * Jobs run "virtually": at submit a job gets start/end times on its chip's
 * timeline (one job at a time per chip, CALRT_STUB delay_ms each, default 0);
 * it is retired (outputs written, buffers given back) the first time any call
 * observes the clock past its end.
 *
 * Fault switches: calrt_stub_set_fault(dev, fault, value) (also exported as the
 * calrt_ext.h test hook calrt_ext_fault_set), or the
 * env var CALRT_STUB_FAULTS="busy=1,hang=1,delay_ms=20" read at device open.
 *   busy=N            the next N submits return CALRT_E_DEVICE_BUSY
 *   hang=N            the next N jobs never finish (until a reset)
 *   ccu=N             the next N jobs fail with CALRT_E_CCU_EXCEPTION; their chip halts
 *   dma=N             the next N jobs fail with CALRT_E_UNKNOWN_DMA_STATE; buffers held until reset
 *   no_chip_memory=1  calrt_memory_usage returns CALRT_E_NOT_SUPPORTED (a vendor gap)
 *   no_chip_reset=1   calrt_reset(CHIP) returns CALRT_E_NOT_SUPPORTED (0.7.6: board reset only)
 *   delay_ms=N        every job takes N ms
 * CALRT_STUB_ABI_MAJOR=N makes calrt_abi_version report major N (incompatibility tests).
 * Compile with -DCALRT_STUB_OMIT_KV_FREE to leave out calrt_kv_free (missing-symbol tests), and with
 * -DCALRT_STUB_CRASH_IN_WAIT to make calrt_job_wait abort the process (crashing-shim tests).
 */
#define _GNU_SOURCE
#include "calrt.h"
#include "calrt_ext.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define STUB_CHIPS 2
#define STUB_CALCORES 2
#define STUB_DRAM (16ULL << 30)
#define STUB_BASELINE (64ULL << 20)
#define STUB_MAX_LANES 64
#define STUB_NEVER UINT64_MAX

enum {
    CALRT_STUB_FAULT_BUSY = 1,
    CALRT_STUB_FAULT_HANG = 2,
    CALRT_STUB_FAULT_CCU = 3,
    CALRT_STUB_FAULT_NO_CHIP_MEMORY = 4,
    CALRT_STUB_FAULT_DELAY_MS = 5,
    CALRT_STUB_FAULT_DMA = 6,
    CALRT_STUB_FAULT_NO_CHIP_RESET = 7
};

typedef struct {
    char *name;
    uint32_t dtype, rank;
    int64_t dims[CALRT_MAX_DIMS];
} tensor;

typedef struct {
    char *alias;
    uint32_t chip_mask, max_sequences, max_seq, live;
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
    uint64_t plan[CALRT_MAX_CHIPS];
    struct calrt_calbin *next;
};

struct calrt_buffer {
    unsigned char *data;
    uint64_t size;
    calrt_job_id owner;   /* job in flight (or quarantined) owning it, 0 = caller */
    uint32_t owner_mask;  /* chips of that job, so a reset knows whose buffers it frees */
    int quarantined;
    struct calrt_buffer *next;
};

typedef struct job {
    calrt_job_info info;
    uint64_t due_ns;      /* when the job ends on its chip's timeline; 0 = not scheduled (hung or behind a hang) */
    int hang, fail;       /* fail: a status the job ends with (CCU / DMA) */
    graph *g;
    calrt_buffer *in, *out;
    uint32_t batch, nkv;
    calrt_kv_seq kv[STUB_MAX_LANES];
    struct job *next;
} job;

typedef struct seq {
    calrt_kv_seq id;
    model *m;
    uint32_t committed, reserved;
    calrt_job_id busy;
    int last_failed;
    struct seq *next;
} seq;

struct calrt_device {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct calrt_calbin *calbins, *current;
    calrt_buffer *buffers;
    job *jobs;
    seq *seqs;
    uint64_t next_job, next_seq;
    uint64_t busy_until[STUB_CHIPS];
    calrt_counters counters[STUB_CHIPS];
    uint32_t health[STUB_CHIPS];
    uint32_t f_busy, f_hang, f_ccu, f_dma, f_no_mem, f_no_chip_reset, delay_ms;
};

static pthread_mutex_t g_open_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_open = 0;

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

static int32_t read_i32(const graph *g, const calrt_buffer *b, int idx, uint32_t batch, uint32_t elem) {
    uint64_t off = tensor_offset(g->in, g->nin, (uint32_t)idx, batch, NULL) + 4ULL * elem;
    int32_t v;
    memcpy(&v, b->data + off, 4);
    return v;
}

static uint8_t read_u8(const graph *g, const calrt_buffer *b, int idx, uint32_t batch, uint32_t elem) {
    return b->data[tensor_offset(g->in, g->nin, (uint32_t)idx, batch, NULL) + elem];
}

static int lowest_chip(uint32_t mask) {
    for (int c = 0; c < STUB_CHIPS; c++)
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

/* Deterministic "compute": every output byte is a function of all input bytes. */
static void compute(job *j) {
    uint64_t in_total, out_total, h = 1469598103934665603ULL;
    tensor_offset(j->g->in, j->g->nin, 0, j->batch, &in_total);
    for (uint64_t i = 0; i < in_total && i < j->in->size; i++) h = (h ^ j->in->data[i]) * 1099511628211ULL;
    h ^= (uint64_t)strlen(j->g->name) * 0x9E3779B97F4A7C15ULL;
    for (uint32_t t = 0; t < j->g->nout; t++) {
        const tensor *ts = &j->g->out[t];
        uint64_t off = tensor_offset(j->g->out, j->g->nout, t, j->batch, &out_total);
        uint64_t n = tensor_bytes(ts, j->batch);
        if (ts->dtype == CALRT_DTYPE_FP32) {
            for (uint64_t k = 0; k < n / 4; k++) {
                h ^= h << 13; h ^= h >> 7; h ^= h << 17;
                float v = (float)((int64_t)(h % 2001) - 1000) / 100.0f;
                memcpy(j->out->data + off + 4 * k, &v, 4);
            }
        } else {
            for (uint64_t k = 0; k < n; k++) {
                h ^= h << 13; h ^= h >> 7; h ^= h << 17;
                j->out->data[off + k] = (unsigned char)h;
            }
        }
    }
}

static void finish(calrt_device *d, job *j, uint32_t state, calrt_status status, int quarantine, uint64_t end_ns) {
    if (j->info.start_ns) j->info.end_ns = end_ns > j->info.start_ns ? end_ns : j->info.start_ns;
    j->info.state = state;
    j->info.status = status;
    for (int c = 0; c < STUB_CHIPS; c++) {
        if (!(j->info.chip_mask >> c & 1)) continue;
        d->counters[c].pending--;
        if (state == CALRT_JOB_SUCCEEDED) d->counters[c].finished++;
        else d->counters[c].failed++;
    }
    if (quarantine) {
        j->in->quarantined = j->out->quarantined = 1;
    } else {
        j->in->owner = j->out->owner = 0;
        j->in->owner_mask = j->out->owner_mask = 0;
    }
    for (uint32_t l = 0; l < j->nkv; l++) {
        seq *s = j->kv[l] ? find_seq(d, j->kv[l]) : NULL;
        if (s && s->busy == j->info.id) {
            s->busy = 0;
            s->last_failed = state != CALRT_JOB_SUCCEEDED;
        }
    }
    pthread_cond_broadcast(&d->cv);
}

static void abort_chip_jobs(calrt_device *d, uint32_t chip_mask, int include_running) {
    uint64_t t = now_ns();
    for (job *j = d->jobs; j; j = j->next) {
        if (terminal(j->info.state) || !(j->info.chip_mask & chip_mask)) continue;
        int started = j->info.start_ns && j->info.start_ns <= t;
        if (started && !include_running) continue;
        if (!started) j->info.start_ns = 0;
        finish(d, j, CALRT_JOB_ABORTED, CALRT_E_JOB_ABORTED, 0, t);
    }
}

/* Retire every job whose time has come. Called with the device mutex held. */
static void advance(calrt_device *d) {
    uint64_t t = now_ns();
    for (job *j = d->jobs; j; j = j->next) {
        if (terminal(j->info.state)) continue;
        if (j->info.state == CALRT_JOB_QUEUED && j->info.start_ns && j->info.start_ns <= t) j->info.state = CALRT_JOB_RUNNING;
        if (j->hang || j->due_ns == 0 || j->due_ns > t) continue;
        int c = lowest_chip(j->info.chip_mask);
        if (j->fail == CALRT_E_CCU_EXCEPTION || j->fail == CALRT_E_UNKNOWN_DMA_STATE) {
            finish(d, j, CALRT_JOB_FAILED, j->fail, j->fail == CALRT_E_UNKNOWN_DMA_STATE, j->due_ns);
            d->health[c] = CALRT_HEALTH_FAULTED;
            abort_chip_jobs(d, 1u << c, 0);
            d->busy_until[c] = t;
        } else {
            compute(j);
            finish(d, j, CALRT_JOB_SUCCEEDED, CALRT_OK, 0, j->due_ns);
        }
    }
}

static void fill_info(job *j, calrt_job_info *out) {
    if (out) *out = j->info;
}

static void deadline_ts(uint64_t ns, struct timespec *ts) {
    ts->tv_sec = (time_t)(ns / 1000000000ULL);
    ts->tv_nsec = (long)(ns % 1000000000ULL);
}

static void parse_env_faults(calrt_device *d) {
    const char *env = getenv("CALRT_STUB_FAULTS");
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
        else if (!strcmp(tok, "delay_ms")) d->delay_ms = v;
    }
    free(copy);
}

/* ------------------------------------------------------------------------- */

calrt_status calrt_stub_set_fault(calrt_device *d, uint32_t fault, uint32_t value) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = CALRT_OK;
    switch (fault) {
    case CALRT_STUB_FAULT_BUSY: d->f_busy = value; break;
    case CALRT_STUB_FAULT_HANG: d->f_hang = value; break;
    case CALRT_STUB_FAULT_CCU: d->f_ccu = value; break;
    case CALRT_STUB_FAULT_DMA: d->f_dma = value; break;
    case CALRT_STUB_FAULT_NO_CHIP_MEMORY: d->f_no_mem = value; break;
    case CALRT_STUB_FAULT_NO_CHIP_RESET: d->f_no_chip_reset = value; break;
    case CALRT_STUB_FAULT_DELAY_MS: d->delay_ms = value; break;
    default: rc = CALRT_E_INVALID_ARGUMENT;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

/* The same switches under the optional test-hook name of calrt_ext.h, which `calctl device conformance` uses. */
calrt_status calrt_ext_fault_set(calrt_device *d, uint32_t fault, uint32_t value) { return calrt_stub_set_fault(d, fault, value); }

calrt_status calrt_abi_version(uint32_t *major, uint32_t *minor) {
    if (!major || !minor) return CALRT_E_INVALID_ARGUMENT;
    const char *env = getenv("CALRT_STUB_ABI_MAJOR");
    *major = env ? (uint32_t)strtoul(env, NULL, 10) : CALRT_ABI_MAJOR;
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
    parse_env_faults(d);
    g_open = 1;
    pthread_mutex_unlock(&g_open_mu);
    *out = d;
    return CALRT_OK;
}

static void free_calbin(struct calrt_calbin *cb) {
    for (uint32_t i = 0; i < cb->ngraphs; i++) {
        graph *g = &cb->graphs[i];
        for (uint32_t k = 0; k < g->nin; k++) free(g->in[k].name);
        for (uint32_t k = 0; k < g->nout; k++) free(g->out[k].name);
        free(g->in); free(g->out); free(g->name); free(g->vlen); free(g->pos); free(g->lane);
    }
    for (uint32_t i = 0; i < cb->nmodels; i++) free(cb->models[i].alias);
    free(cb->graphs); free(cb->models); free(cb);
}

static void free_seqs(calrt_device *d) {
    for (seq *s = d->seqs, *n; s; s = n) { n = s->next; free(s); }
    d->seqs = NULL;
}

calrt_status calrt_device_close(calrt_device *d) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    for (job *j = d->jobs, *n; j; j = n) { n = j->next; free(j); }
    for (calrt_buffer *b = d->buffers, *n; b; b = n) { n = b->next; free(b->data); free(b); }
    for (struct calrt_calbin *c = d->calbins, *n; c; c = n) { n = c->next; free_calbin(c); }
    free_seqs(d);
    pthread_mutex_unlock(&d->mu);
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
    pthread_mutex_lock(&g_open_mu);
    g_open = 0;
    pthread_mutex_unlock(&g_open_mu);
    return CALRT_OK;
}

/* Which board is open: CALRT_STUB_PCI="0000:01:00.0" makes the stub a "hardware" board at that PCI
 * address (to test the board lock across processes); unset, it cannot tell (kind unknown). */
calrt_status calrt_ext_device_identity(calrt_device *d, calrt_ext_identity *out) {
    if (!d || !out) return CALRT_E_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    const char *pci = getenv("CALRT_STUB_PCI");
    if (pci && *pci) {
        snprintf(out->id, sizeof out->id, "%s", pci);
        out->kind = CALRT_EXT_DEVICE_HARDWARE;
    }
    return CALRT_OK;
}

calrt_status calrt_versions_get(calrt_device *d, calrt_versions *out) {
    if (!d || !out) return CALRT_E_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    snprintf(out->runtime, sizeof out->runtime, "0.7.6");
    snprintf(out->driver, sizeof out->driver, "1.0.0");
    snprintf(out->firmware, sizeof out->firmware, "stub");
    return CALRT_OK;
}

calrt_status calrt_topology_get(calrt_device *d, calrt_topology *out) {
    if (!d || !out) return CALRT_E_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    out->chips = STUB_CHIPS;
    out->calcores_per_chip = STUB_CALCORES;
    for (int c = 0; c < CALRT_MAX_CHIPS; c++) out->dram_bytes[c] = c < STUB_CHIPS ? STUB_DRAM : CALRT_UNKNOWN_U64;
    return CALRT_OK;
}

static int copy_tensors(tensor **dst, const calrt_tensor_desc *src, uint32_t n) {
    *dst = calloc(n ? n : 1, sizeof(tensor));
    for (uint32_t i = 0; i < n; i++) {
        if (!src[i].name || src[i].rank > CALRT_MAX_DIMS || !dtype_size(src[i].dtype)) return 0;
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
    if (desc->n_graphs == 0 || desc->n_models == 0 || desc->n_chips > STUB_CHIPS) return CALRT_E_INVALID_CALBIN;
    struct calrt_calbin *cb = calloc(1, sizeof *cb);
    cb->nmodels = desc->n_models;
    cb->models = calloc(desc->n_models, sizeof(model));
    for (uint32_t i = 0; i < desc->n_models; i++) {
        const calrt_model_desc *m = &desc->models[i];
        cb->models[i].alias = dupstr(m->alias);
        cb->models[i].chip_mask = m->chip_mask;
        cb->models[i].max_sequences = m->kv_max_sequences;
        cb->models[i].max_seq = m->kv_max_seq;
    }
    cb->ngraphs = desc->n_graphs;
    cb->graphs = calloc(desc->n_graphs, sizeof(graph));
    calrt_status rc = CALRT_OK;
    for (uint32_t i = 0; i < desc->n_graphs && rc == CALRT_OK; i++) {
        const calrt_graph_desc *gd = &desc->graphs[i];
        graph *g = &cb->graphs[i];
        g->name = dupstr(gd->name);
        g->kind = gd->kind;
        g->chip_mask = gd->chip_mask;
        g->max_seq = gd->max_seq;
        g->vlen = dupstr(gd->valid_length_input);
        g->pos = dupstr(gd->positions_input);
        g->lane = dupstr(gd->lane_valid_input);
        g->nin = gd->n_inputs;
        g->nout = gd->n_outputs;
        if (!copy_tensors(&g->in, gd->inputs, gd->n_inputs) || !copy_tensors(&g->out, gd->outputs, gd->n_outputs)) rc = CALRT_E_INVALID_CALBIN;
        if (!g->name || !gd->model || gd->chip_mask == 0 || gd->chip_mask >> STUB_CHIPS || gd->n_batch_profiles == 0 || gd->n_batch_profiles > 16)
            rc = CALRT_E_INVALID_CALBIN;
        for (uint32_t k = 0; rc == CALRT_OK && k < gd->n_batch_profiles; k++) g->prof[g->nprof++] = gd->batch_profiles[k];
        for (uint32_t k = 0; rc == CALRT_OK && k < i; k++)
            if (!strcmp(cb->graphs[k].name, g->name)) rc = CALRT_E_INVALID_CALBIN;   /* duplicate name */
        for (uint32_t k = 0; rc == CALRT_OK && k < cb->nmodels; k++)
            if (!strcmp(cb->models[k].alias, gd->model)) g->model = &cb->models[k];
        if (rc == CALRT_OK && (!g->model || (g->chip_mask & ~g->model->chip_mask))) rc = CALRT_E_INVALID_CALBIN;
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

calrt_status calrt_calbin_release(calrt_device *d, calrt_calbin *cb) {
    if (!d || !cb) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = CALRT_E_INVALID_ARGUMENT;
    if (d->current == cb) {
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

calrt_status calrt_configure(calrt_device *d, calrt_calbin *cb) {
    if (!d || !cb) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = CALRT_OK;
    if (d->current) rc = CALRT_E_ALREADY_CONFIGURED;
    for (int c = 0; rc == CALRT_OK && c < STUB_CHIPS; c++) {
        if (d->health[c] != CALRT_HEALTH_OK) rc = CALRT_E_DEVICE_LOST;
        else if (STUB_BASELINE + cb->plan[c] > STUB_DRAM) rc = CALRT_E_OUT_OF_MEMORY;
    }
    if (rc == CALRT_OK) {
        for (uint32_t i = 0; i < cb->nmodels; i++) cb->models[i].live = 0;
        d->current = cb;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_reset_configuration(calrt_device *d) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    advance(d);
    calrt_status rc = CALRT_OK;
    if (!d->current) rc = CALRT_E_NOT_CONFIGURED;
    for (job *j = d->jobs; rc == CALRT_OK && j; j = j->next)
        if (!terminal(j->info.state)) rc = CALRT_E_DEVICE_BUSY;
    if (rc == CALRT_OK) {
        free_seqs(d);
        d->current = NULL;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_buffer_create(calrt_device *d, uint64_t bytes, calrt_buffer **out) {
    if (!d || !out || bytes == 0) return CALRT_E_INVALID_ARGUMENT;
    calrt_buffer *b = calloc(1, sizeof *b);
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
    advance(d);
    calrt_status rc = CALRT_E_INVALID_ARGUMENT;
    for (calrt_buffer **p = &d->buffers; *p; p = &(*p)->next) {
        if (*p != b) continue;
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
        if (!strcmp(d->current->graphs[i].name, name)) return &d->current->graphs[i];
    return NULL;
}

/* 000 §9.2: the job writes exactly the reserved tokens, at position == committed length. */
static calrt_status check_kv(calrt_device *d, graph *g, const calrt_job_desc *desc) {
    if (desc->n_kv != desc->batch || !desc->kv) return CALRT_E_INVALID_ARGUMENT;
    int vlen = find_tensor(g->in, g->nin, g->vlen), pos = find_tensor(g->in, g->nin, g->pos);
    int lane = find_tensor(g->in, g->nin, g->lane);
    for (uint32_t l = 0; l < desc->batch; l++) {
        int active = lane < 0 || read_u8(g, desc->inputs, lane, desc->batch, l);
        calrt_kv_seq id = desc->kv[l];
        if (!active) {
            if (id != CALRT_KV_NONE) return CALRT_E_INVALID_ARGUMENT;
            continue;
        }
        seq *s = find_seq(d, id);
        if (!s || s->m != g->model) return CALRT_E_INVALID_ARGUMENT;
        if (s->busy) return CALRT_E_DEVICE_BUSY;
        for (uint32_t k = 0; k < l; k++)
            if (desc->kv[k] == id) return CALRT_E_INVALID_ARGUMENT;
        uint32_t writes = 1;
        if (g->kind == CALRT_GRAPH_PREFILL) {
            if (s->committed != 0) return CALRT_E_INVALID_ARGUMENT;
            if (vlen >= 0) writes = (uint32_t)read_i32(g, desc->inputs, vlen, desc->batch, 0);
        } else if (pos >= 0 && (uint32_t)read_i32(g, desc->inputs, pos, desc->batch, l) != s->committed) {
            return CALRT_E_INVALID_ARGUMENT;
        }
        if (s->reserved - s->committed != writes) return CALRT_E_INVALID_ARGUMENT;
    }
    return CALRT_OK;
}

calrt_status calrt_job_submit(calrt_device *d, const calrt_job_desc *desc, calrt_job_id *out) {
    if (!d || !desc || !out || !desc->inputs || !desc->outputs || desc->engine > CALRT_ENGINE_PONG || desc->batch > STUB_MAX_LANES)
        return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    advance(d);
    calrt_status rc = CALRT_OK;
    graph *g = NULL;
    if (!d->current) rc = CALRT_E_NOT_CONFIGURED;
    else if (!(g = find_graph(d, desc->graph))) rc = CALRT_E_INVALID_ARGUMENT;
    if (rc == CALRT_OK) {
        int prof_ok = 0;
        for (uint32_t k = 0; k < g->nprof; k++) prof_ok |= g->prof[k] == desc->batch;
        uint64_t need_in, need_out;
        tensor_offset(g->in, g->nin, 0, desc->batch, &need_in);
        tensor_offset(g->out, g->nout, 0, desc->batch, &need_out);
        if (!prof_ok || desc->inputs == desc->outputs || !known_buffer(d, desc->inputs) || !known_buffer(d, desc->outputs) ||
            desc->inputs->size < need_in || desc->outputs->size < need_out)
            rc = CALRT_E_INVALID_ARGUMENT;
        else if (desc->inputs->owner || desc->outputs->owner || desc->inputs->quarantined || desc->outputs->quarantined)
            rc = CALRT_E_BUFFER_IN_USE;
    }
    int chip = g ? lowest_chip(g->chip_mask) : 0;
    for (int c = 0; rc == CALRT_OK && c < STUB_CHIPS; c++)
        if ((g->chip_mask >> c & 1) && d->health[c] == CALRT_HEALTH_FAULTED) rc = CALRT_E_DEVICE_LOST;
    if (rc == CALRT_OK) rc = check_kv(d, g, desc);
    if (rc == CALRT_OK && d->f_busy) {
        d->f_busy--;
        rc = CALRT_E_DEVICE_BUSY;
    }
    if (rc != CALRT_OK) {
        pthread_mutex_unlock(&d->mu);
        return rc;
    }
    job *j = calloc(1, sizeof *j);
    uint64_t t = now_ns();
    j->info.id = d->next_job++;
    j->info.state = CALRT_JOB_QUEUED;
    j->info.chip_mask = g->chip_mask;
    j->info.engine = desc->engine;
    j->info.generation = desc->generation;
    j->info.submit_ns = t;
    j->g = g;
    j->in = desc->inputs;
    j->out = desc->outputs;
    j->batch = desc->batch;
    j->nkv = desc->n_kv;
    memcpy(j->kv, desc->kv, sizeof(calrt_kv_seq) * desc->n_kv);
    uint64_t start = d->busy_until[chip] > t ? d->busy_until[chip] : t;
    if (start == STUB_NEVER) {
        /* queued behind a hung job: never starts until a reset aborts it */
    } else if (d->f_hang) {
        d->f_hang--;
        j->hang = 1;
        j->info.start_ns = start;
        d->busy_until[chip] = STUB_NEVER;
    } else {
        if (d->f_ccu) { d->f_ccu--; j->fail = CALRT_E_CCU_EXCEPTION; }
        else if (d->f_dma) { d->f_dma--; j->fail = CALRT_E_UNKNOWN_DMA_STATE; }
        j->info.start_ns = start;
        j->due_ns = start + (uint64_t)d->delay_ms * 1000000ULL + 1;
        d->busy_until[chip] = j->due_ns;
    }
    j->in->owner = j->out->owner = j->info.id;
    j->in->owner_mask = j->out->owner_mask = g->chip_mask;
    for (uint32_t l = 0; l < j->nkv; l++) {
        seq *s = j->kv[l] ? find_seq(d, j->kv[l]) : NULL;
        if (s) { s->busy = j->info.id; s->last_failed = 0; }
    }
    for (int c = 0; c < STUB_CHIPS; c++)
        if (g->chip_mask >> c & 1) d->counters[c].pending++;
    j->next = d->jobs;
    d->jobs = j;
    *out = j->info.id;
    pthread_mutex_unlock(&d->mu);
    return CALRT_OK;
}

calrt_status calrt_job_query(calrt_device *d, calrt_job_id id, calrt_job_info *out) {
    if (!d || !out) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    advance(d);
    job *j = find_job(d, id);
    if (j) fill_info(j, out);
    pthread_mutex_unlock(&d->mu);
    return j ? CALRT_OK : CALRT_E_INVALID_ARGUMENT;
}

static uint64_t next_wake(calrt_device *d, uint64_t deadline) {
    uint64_t wake = deadline;
    for (job *j = d->jobs; j; j = j->next)
        if (!terminal(j->info.state) && !j->hang && j->due_ns && j->due_ns < wake) wake = j->due_ns;
    return wake;
}

calrt_status calrt_job_wait(calrt_device *d, calrt_job_id id, uint32_t timeout_ms, calrt_job_info *out) {
#ifdef CALRT_STUB_CRASH_IN_WAIT
    abort(); /* a shim that crashes the process (conformance must report it, not die with it) */
#endif
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000ULL;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        advance(d);
        job *j = find_job(d, id);
        if (!j) { pthread_mutex_unlock(&d->mu); return CALRT_E_INVALID_ARGUMENT; }
        if (terminal(j->info.state) || now_ns() >= deadline) {
            fill_info(j, out);
            calrt_status rc = terminal(j->info.state) ? CALRT_OK : CALRT_E_TIMEOUT;
            pthread_mutex_unlock(&d->mu);
            return rc;
        }
        struct timespec ts;
        deadline_ts(next_wake(d, deadline), &ts);
        pthread_cond_timedwait(&d->cv, &d->mu, &ts);   /* releases the device mutex while blocked */
    }
}

calrt_status calrt_job_wait_any(calrt_device *d, const calrt_job_id *ids, uint32_t n, uint32_t timeout_ms, uint32_t *index) {
    if (!d || !ids || !index || n == 0) return CALRT_E_INVALID_ARGUMENT;
    uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000ULL;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        advance(d);
        for (uint32_t i = 0; i < n; i++) {
            job *j = find_job(d, ids[i]);
            if (!j) { pthread_mutex_unlock(&d->mu); return CALRT_E_INVALID_ARGUMENT; }
            if (terminal(j->info.state)) { *index = i; pthread_mutex_unlock(&d->mu); return CALRT_OK; }
        }
        if (now_ns() >= deadline) { pthread_mutex_unlock(&d->mu); return CALRT_E_TIMEOUT; }
        struct timespec ts;
        deadline_ts(next_wake(d, deadline), &ts);
        pthread_cond_timedwait(&d->cv, &d->mu, &ts);
    }
}

calrt_status calrt_job_release(calrt_device *d, calrt_job_id id) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    advance(d);
    calrt_status rc = CALRT_E_INVALID_ARGUMENT;
    for (job **p = &d->jobs; *p; p = &(*p)->next) {
        if ((*p)->info.id != id) continue;
        if (!terminal((*p)->info.state)) { rc = CALRT_E_DEVICE_BUSY; break; }
        job *j = *p;
        *p = j->next;
        free(j);
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
    if (!d->current) rc = CALRT_E_NOT_CONFIGURED;
    else if (!m) rc = CALRT_E_INVALID_ARGUMENT;
    else *yes = m->live + n <= m->max_sequences;
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_kv_allocate(calrt_device *d, const char *alias, calrt_kv_seq *out) {
    if (!d || !out) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = CALRT_OK;
    model *m = find_model(d, alias);
    if (!d->current) rc = CALRT_E_NOT_CONFIGURED;
    else if (!m) rc = CALRT_E_INVALID_ARGUMENT;
    else if (m->live >= m->max_sequences) rc = CALRT_E_OUT_OF_MEMORY;
    else {
        seq *s = calloc(1, sizeof *s);
        s->id = d->next_seq++;
        s->m = m;
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
    advance(d);
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
    if (rc == CALRT_OK && (n == 0 || s->reserved + n > s->m->max_seq)) rc = CALRT_E_INVALID_ARGUMENT;
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
    if (rc == CALRT_OK) { s->reserved = s->committed; s->last_failed = 0; }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_kv_remove_tokens_at_end(calrt_device *d, calrt_kv_seq id, uint32_t n) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    seq *s = NULL;
    calrt_status rc = idle_seq(d, id, &s);
    if (rc == CALRT_OK && (s->reserved != s->committed || n > s->committed)) rc = CALRT_E_INVALID_ARGUMENT;
    if (rc == CALRT_OK) s->committed = s->reserved = s->committed - n;
    pthread_mutex_unlock(&d->mu);
    return rc;
}

#ifndef CALRT_STUB_OMIT_KV_FREE
calrt_status calrt_kv_free(calrt_device *d, calrt_kv_seq id) {
    if (!d) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    seq *s = NULL;
    calrt_status rc = idle_seq(d, id, &s);
    if (rc == CALRT_OK) {
        for (seq **p = &d->seqs; *p; p = &(*p)->next) {
            if (*p == s) { *p = s->next; break; }
        }
        s->m->live--;
        free(s);
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}
#endif

calrt_status calrt_kv_length(calrt_device *d, calrt_kv_seq id, uint32_t *committed, uint32_t *reserved) {
    if (!d || !committed || !reserved) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    advance(d);
    seq *s = find_seq(d, id);
    if (s) { *committed = s->committed; *reserved = s->reserved; }
    pthread_mutex_unlock(&d->mu);
    return s ? CALRT_OK : CALRT_E_INVALID_ARGUMENT;
}

calrt_status calrt_memory_usage(calrt_device *d, uint32_t chip, calrt_memory *out) {
    if (!d || !out || chip >= STUB_CHIPS) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    calrt_status rc = d->f_no_mem ? CALRT_E_NOT_SUPPORTED : CALRT_OK;
    if (rc == CALRT_OK) {
        out->used_bytes = STUB_BASELINE + (d->current ? d->current->plan[chip] : 0);
        out->total_bytes = STUB_DRAM;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

calrt_status calrt_chip_counters(calrt_device *d, uint32_t chip, calrt_counters *out) {
    if (!d || !out || chip >= STUB_CHIPS) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    advance(d);
    *out = d->counters[chip];
    pthread_mutex_unlock(&d->mu);
    return CALRT_OK;
}

calrt_status calrt_chip_health(calrt_device *d, uint32_t chip, uint32_t *health) {
    if (!d || !health || chip >= STUB_CHIPS) return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    advance(d);
    *health = d->health[chip];
    for (job *j = d->jobs; j; j = j->next)
        if (j->hang && !terminal(j->info.state) && (j->info.chip_mask >> chip & 1)) *health = CALRT_HEALTH_HUNG;
    pthread_mutex_unlock(&d->mu);
    return CALRT_OK;
}

calrt_status calrt_reset(calrt_device *d, uint32_t scope, uint32_t chip) {
    if (!d || (scope != CALRT_RESET_CHIP && scope != CALRT_RESET_BOARD) || (scope == CALRT_RESET_CHIP && chip >= STUB_CHIPS))
        return CALRT_E_INVALID_ARGUMENT;
    pthread_mutex_lock(&d->mu);
    if (scope == CALRT_RESET_CHIP && d->f_no_chip_reset) {
        pthread_mutex_unlock(&d->mu);
        return CALRT_E_NOT_SUPPORTED;
    }
    advance(d);
    uint32_t mask = scope == CALRT_RESET_BOARD ? (1u << STUB_CHIPS) - 1 : 1u << chip;
    abort_chip_jobs(d, mask, 1);
    for (calrt_buffer *b = d->buffers; b; b = b->next) {
        if (b->owner_mask & mask) b->quarantined = 0, b->owner = 0, b->owner_mask = 0;   /* DMA state known again */
    }
    uint64_t t = now_ns();
    for (int c = 0; c < STUB_CHIPS; c++) {
        if (!(mask >> c & 1)) continue;
        d->health[c] = CALRT_HEALTH_OK;
        d->busy_until[c] = t;
    }
    if (scope == CALRT_RESET_BOARD) {
        free_seqs(d);
        d->current = NULL;
    } else {
        for (seq *s = d->seqs; s; s = s->next)
            if (s->m->chip_mask & mask) s->committed = s->reserved = 0, s->busy = 0, s->last_failed = 0;
    }
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return CALRT_OK;
}

/* ------------------------------------------------------------------------------------------------------------
 * Enumeration (calrt_ext.h, docs/calrt-c-abi.md §11): the boards of the host, before any device is open.
 * CALRT_STUB_BOARDS="0000:01:00.0,0000:02:00.0" lists those names (at most 64, each under CALRT_EXT_ID_LEN
 * bytes); unset or empty, one board: CALRT_STUB_PCI, else "stub0". The stub opens the same model whichever
 * name CALRT_DEVICE holds (it has one board; docs/calrt-c-abi.md §10). -DCALRT_STUB_ENUM_OVERFLOW builds a
 * broken one (a name written into a buffer too short for it) for the conformance check's own test. */
#define STUB_ENUM_MAX 64

static uint32_t stub_enum_names(char names[][CALRT_EXT_ID_LEN], uint32_t max) {
    const char *list = getenv("CALRT_STUB_BOARDS");
    uint32_t n = 0;
    if (list && *list) {
        const char *p = list;
        while (*p && n < max) {
            const char *end = strchr(p, ',');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            if (len > 0) {
                if (len >= CALRT_EXT_ID_LEN) len = CALRT_EXT_ID_LEN - 1;
                memcpy(names[n], p, len);
                names[n][len] = '\0';
                n++;
            }
            if (!end) break;
            p = end + 1;
        }
        return n;
    }
    const char *pci = getenv("CALRT_STUB_PCI");
    snprintf(names[0], CALRT_EXT_ID_LEN, "%s", (pci && *pci) ? pci : "stub0");
    return 1;
}

calrt_status calrt_ext_device_count(uint32_t *count) {
    if (!count) return CALRT_E_INVALID_ARGUMENT;
    char names[STUB_ENUM_MAX][CALRT_EXT_ID_LEN];
    *count = stub_enum_names(names, STUB_ENUM_MAX);
    return CALRT_OK;
}

calrt_status calrt_ext_device_name(uint32_t index, char *buf, uint32_t len) {
    char names[STUB_ENUM_MAX][CALRT_EXT_ID_LEN];
    uint32_t n = stub_enum_names(names, STUB_ENUM_MAX);
    if (!buf || index >= n) return CALRT_E_INVALID_ARGUMENT;
    size_t need = strlen(names[index]) + 1;
#ifdef CALRT_STUB_ENUM_OVERFLOW /* a broken shim: fills a buffer too short for the name before refusing it */
    if (need > len) {
        memcpy(buf, names[index], len);
        return CALRT_E_INVALID_ARGUMENT;
    }
#endif
    if (need > len) return CALRT_E_INVALID_ARGUMENT;
    memcpy(buf, names[index], need);
    return CALRT_OK;
}
