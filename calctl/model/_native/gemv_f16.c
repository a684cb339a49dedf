/* Weight GEMM/GEMV kernels for the mock's decoder, on the weights as the package stores them, and its decode attention.
 *
 *   Y[t, r] = sum_c W[r, c] * X[t, c]      for t < n tokens (lanes), r < rows, c < cols
 *
 * W is one of the package's parameter dtypes, row-major with one row per output feature:
 *
 *   0 fp16  rows x cols half floats
 *   1 q4_0  rows x cols/32 blocks of 18 bytes: fp16 d, 16 bytes of nibbles; w = (q - 8) * d
 *   2 q4_1  rows x cols/32 blocks of 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles; w = q * d + m
 *   3 q8_0  rows x cols/32 blocks of 34 bytes: fp16 d, 32 int8; w = q * d
 *
 * (the GGML block layouts: in a q4 block the low nibbles are elements 0..15, the high nibbles 16..31).
 * X and Y are fp32. Every weight is dequantised inside the kernel and multiplied with X with fp32 accumulation, so the
 * result is the dequantised matrix times X up to fp32 rounding. A GEMM of one or two tokens on a quantised dtype (a
 * decode step's GEMVs) does it in integers: each token's activations are written exactly enough as two 16-bit
 * integers per element (see "Decode GEMVs" below), and the weight blocks' nibbles or bytes are multiplied with them
 * exactly (vpmaddwd), which costs about half the instructions of converting every weight to a float. Nothing is
 * rounded to 8 bits as llama.cpp's integer dot products do.
 *
 * Batching (the float path: fp16 weights, prefills): up to TILE (8) tokens share each dequantised block, one
 * independent accumulator per token (eight FMA chains in flight, what two FMA pipes with a 4-cycle latency need), so
 * 8 tokens dequantise and read every weight once, not once per token. With AVX-512 (-march=native on a CPU that has it) a block is two
 * 16-float vectors and a q4 block is dequantised by two table permutes (the 16 values q*d+m of the block's scale
 * looked up by nibble); without it, four 8-float vectors. Rows are split over `threads` threads of the worker pool
 * below (chunks of 16 rows that the caller and any awake worker claim).
 *
 * Many tokens (a prefill): each 16-row strip is dequantised once to fp32 and multiplied with all the tokens by a
 * register-blocked kernel, FMA-bound: with AVX-512 sixteen tokens at a time (16 or more, see PANEL_MIN), with AVX2
 * 16 rows by 6 tokens (32 or more, see XMIN). Fewer: the tiled path above (with AVX-512 the block scales of a row
 * converted sixteen at a time and X copied to 64-byte lines when its rows are not on them).
 *
 * calctl_attend_decode is one decode step's attention for a batch of lanes, each over its own KV cache: it writes
 * the lane's new K/V row at its position and attends its query heads over positions 0..position (grouped-query
 * heads share their KV head), softmax in fp32 with a polynomial exp (about 1 ulp). Lanes and heads are split over
 * the threads.
 *
 * Built at first use by calctl.model.native with the system C compiler (-O3 -march=native -pthread); it needs F16C,
 * FMA and AVX2 and refuses to build without them, in which case the decoder keeps using numpy.
 */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#if !defined(__F16C__) || !defined(__FMA__) || !defined(__AVX2__)
#error "calctl gemv_f16 needs F16C, FMA and AVX2"
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define CALCTL_AVX512 1
#else
#define CALCTL_AVX512 0
#endif

enum { DT_F16 = 0, DT_Q4_0 = 1, DT_Q4_1 = 2, DT_Q8_0 = 3 };
#define QK 32
#define TILE 8
/* GEMMs with fewer multiply-adds (per eight tokens) than this run on the calling thread */
#ifndef GEMM_SPLIT_MACS
#define GEMM_SPLIT_MACS (1 << 16)
#endif
#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* Rows prefetched ahead of the one being read: a decode step streams ~100 MB of weights that no cache holds, and the
 * hardware prefetcher alone left each core waiting on memory (a SmolLM2 decode step's GEMVs ran 1.5x slower). */
#define PF_ROWS 8

/* Ask for row r of a matrix of rb-byte rows. The address is computed as an integer: past the last row it is a
 * prefetch of memory the matrix does not own, which never faults and only costs the bandwidth. */
static inline void prefetch_row(const uint8_t *W, int64_t rb, int64_t r) {
    for (int64_t o = 0; o < rb; o += 64) _mm_prefetch((const char *)((uintptr_t)W + (uintptr_t)(r * rb + o)), _MM_HINT_T0);
}

/* ---------------------------------------------------------------------------------------------------------------
 * The worker pool: a call is cut into chunks that any thread may claim, and the calling thread never waits for a
 * worker that has not started. A fork/join (OpenMP's) waits at its barrier for every thread of the team; on a
 * loaded host a worker the OS has not scheduled yet holds the caller for a whole time slice, and waking a sleeping
 * worker costs tens of microseconds on a VM, a decode step making ~150 such calls. Here the caller claims chunks
 * itself from the first one on; workers that are awake join in; the caller waits only for chunks a worker has
 * claimed and not finished. Workers poll for a few microseconds between calls (most of a decode layer's native calls
 * come less than that apart), then sleep on a condition variable.
 *
 * The claim word holds (generation << 32 | next chunk): a worker reads the job's fields after reading the word and
 * claims with a compare-and-swap of that exact word, so a claim succeeds only while that job is still open (the
 * word only grows). The caller closes the finished job before it rewrites the fields: it first stores a word of a
 * new generation whose chunk is CLAIM_CLOSED (past any job's total), then the fields, then the open word of the
 * generation after that. Without the closing word a worker could read the last job's exhausted word (its next
 * chunk == its total), be preempted, read the next job's fields while the caller was still writing them (a larger
 * total: the chunk looked open), and win its compare-and-swap, because the word had not changed yet. It then ran a
 * chunk of the next job before that job was published and counted it in `done`, so that job's caller stopped
 * waiting one chunk early and read (or freed) a buffer a worker was still writing: about one greedy SmolLM2 run in
 * 60-100 on two threads of a loaded host diverged, once from a hidden state that overflowed (issue #55;
 * ThreadSanitizer names the race once a delay widens the window). With the closing word, a field written for the
 * next job is only ever read after the word changed, and that compare-and-swap fails.
 */
#define CLAIM_CLOSED 0xffffffffu
typedef void (*chunk_fn)(void *ctx, int64_t chunk, int worker);
static pthread_mutex_t pool_call_mu = PTHREAD_MUTEX_INITIALIZER; /* one job at a time (several chips' threads) */

#define POOL_MAX 64
/* How long a worker polls for the next job before it sleeps, and the caller for a claimed chunk before it yields,
 * in pauses (~11 ns each on the reference machine). Short: a served decode step is followed by ~1 ms of Python on
 * the chip's, the engine's and the event loop's threads, and on two cores a worker polling for 100 us of it (8000
 * pauses, the earlier figure) held a core those threads needed. Measured with the SmolLM2 package served on the
 * mock, one stream, six alternating rounds: 14.5 -> 12.9 ms a token (the decoder alone in-process: no change). */
#define POOL_POLL 250
#define CALLER_POLL 2000
static struct {
    _Atomic uint64_t claim;
    _Atomic int64_t done;
    _Atomic(chunk_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int64_t total;
    _Atomic int team; /* workers 1..team-1 take part in the current job */
    _Atomic int sleepers;
    _Atomic int started; /* workers created */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t create_mu;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .create_mu = PTHREAD_MUTEX_INITIALIZER};

/* A test build's -DPOOL_RACE_WINDOW=N (0 otherwise: nothing is compiled in) steers the threads into the interleaving
 * that broke the pool (above) instead of waiting for a loaded host to preempt them there, about once in 10^6 pool
 * jobs: a worker that read an exhausted claim word waits, up to N pauses, for the caller to write the next job's
 * fields; the caller, once it wrote them, waits (up to N / 8 turns) for that worker to go on, then gives it N / 8
 * pauses before it opens the job (tests/unit/compiler/test_pool_determinism.py). */
#ifndef POOL_RACE_WINDOW
#define POOL_RACE_WINDOW 0
#endif
#if POOL_RACE_WINDOW > 0
static _Atomic uint64_t race_written; /* jobs whose fields a caller has written */
static _Atomic int race_parked;       /* workers waiting for that */
static void race_window_worker(int64_t idx, int worker) {
    if (worker == 0 || idx < atomic_load(&pool.total)) return;
    uint64_t seen = atomic_load(&race_written);
    atomic_fetch_add(&race_parked, 1);
    for (int k = 0; k < POOL_RACE_WINDOW && atomic_load(&race_written) == seen; k++) _mm_pause();
    atomic_fetch_sub(&race_parked, 1);
}
static void race_window_caller(void) {
    atomic_fetch_add(&race_written, 1);
    for (int k = 0; k < POOL_RACE_WINDOW / 8 && atomic_load(&race_parked) > 0; k++) {
        if (k < 64) _mm_pause();
        else sched_yield(); /* the parked worker was preempted: let it have this core */
    }
    for (int k = 0; k < POOL_RACE_WINDOW / 8; k++) _mm_pause();
}
#else
#define race_window_worker(idx, worker) ((void)(idx), (void)(worker))
#define race_window_caller() ((void)0)
#endif

/* Claim and run chunks of the job whose claim word was `w` until it is exhausted or replaced. */
static void pool_work(uint64_t w, int worker) {
    for (;;) {
        uint32_t gen = (uint32_t)(w >> 32);
        int64_t idx = (int64_t)(w & 0xffffffffu);
        race_window_worker(idx, worker);
        /* seq_cst, like the caller's stores: a field of a later job is read only after its closing word */
        chunk_fn fn = atomic_load(&pool.fn);
        void *ctx = atomic_load(&pool.ctx);
        int64_t total = atomic_load(&pool.total);
        int team = atomic_load(&pool.team);
        if (idx >= total || worker >= team) return; /* a closing word's CLAIM_CLOSED is past every total */
        if (atomic_compare_exchange_weak(&pool.claim, &w, w + 1)) {
            fn(ctx, idx, worker);
            atomic_fetch_add(&pool.done, 1);
            w = atomic_load(&pool.claim);
        } else if ((uint32_t)(w >> 32) != gen) {
            return; /* a newer job: the caller of that one publishes it again to the loop below */
        }
    }
}

static void *pool_main(void *arg) {
    int worker = (int)(intptr_t)arg;
    uint32_t seen = 0;
    for (;;) {
        uint64_t w = atomic_load(&pool.claim);
        /* ~3 us of polling (POOL_POLL pauses: ~11 ns each on the reference machine) before sleeping */
        for (int spin = 0; (uint32_t)(w >> 32) == seen && spin < POOL_POLL; spin++) {
            _mm_pause();
            w = atomic_load(&pool.claim);
        }
        if ((uint32_t)(w >> 32) == seen) {
            atomic_fetch_add(&pool.sleepers, 1);
            pthread_mutex_lock(&pool.mu);
            while ((uint32_t)((w = atomic_load(&pool.claim)) >> 32) == seen) pthread_cond_wait(&pool.cv, &pool.mu);
            pthread_mutex_unlock(&pool.mu);
            atomic_fetch_sub(&pool.sleepers, 1);
        }
        seen = (uint32_t)(w >> 32);
        pool_work(w, worker);
    }
    return NULL;
}

/* Start workers so that `threads` threads (the caller and threads-1 workers) exist; returns how many can take part. */
static int pool_ensure(int threads) {
    if (threads > POOL_MAX) threads = POOL_MAX;
    if (atomic_load(&pool.started) >= threads - 1) return threads;
    pthread_mutex_lock(&pool.create_mu);
    int have = atomic_load(&pool.started);
    while (have < threads - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, pool_main, (void *)(intptr_t)(have + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        atomic_store(&pool.started, ++have);
    }
    pthread_mutex_unlock(&pool.create_mu);
    return have + 1 < threads ? have + 1 : threads;
}

/* A forked child has the parent's pool state but none of its threads: forget them (they are started again). */
static void pool_atfork_child(void) {
    atomic_store(&pool.started, 0);
    atomic_store(&pool.sleepers, 0);
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.cv, NULL);
    pthread_mutex_init(&pool.create_mu, NULL);
    pthread_mutex_init(&pool_call_mu, NULL);
}
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static void pool_init(void) { pthread_atfork(NULL, NULL, pool_atfork_child); }

/* Run fn(ctx, chunk, worker) for chunk 0..total-1 on up to `threads` threads (worker 0 is the caller). */
static void pool_run(chunk_fn fn, void *ctx, int64_t total, int threads) {
    if (threads > 1 && total > 1) {
        pthread_once(&pool_once, pool_init);
        threads = pool_ensure(threads);
    }
    if (threads <= 1 || total <= 1 || total >= CLAIM_CLOSED || pthread_mutex_trylock(&pool_call_mu) != 0) {
        /* one thread, one chunk, more chunks than the claim word counts, or another chip's thread holds the pool:
         * this call runs on its own thread */
        for (int64_t i = 0; i < total; i++) fn(ctx, i, 0);
        return;
    }
    uint64_t gen = (atomic_load(&pool.claim) >> 32) + 1;
    atomic_store(&pool.claim, gen << 32 | CLAIM_CLOSED); /* the last job's word is gone before a field changes */
    atomic_store(&pool.fn, fn);
    atomic_store(&pool.ctx, ctx);
    atomic_store(&pool.total, total);
    atomic_store(&pool.team, threads);
    atomic_store(&pool.done, 0);
    race_window_caller();
    gen++;
    atomic_store(&pool.claim, gen << 32); /* opens the job: publishes the fields above (seq_cst) */
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.mu);
        pthread_cond_broadcast(&pool.cv);
        pthread_mutex_unlock(&pool.mu);
    }
    pool_work(gen << 32, 0);
    for (int spin = 0; atomic_load(&pool.done) < total; spin++) { /* chunks a worker claimed and is finishing */
        if (spin < CALLER_POLL) _mm_pause();
        else sched_yield(); /* that worker was preempted: let it have this core */
    }
    pthread_mutex_unlock(&pool_call_mu);
}

/* Scratch of `bytes` on 64-byte lines (a multiple of 64 bytes, as aligned_alloc wants), freed with free. */
static void *scratch_alloc(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

/* A buffer of at least `bytes` that the calling thread keeps for its later calls (the many-token path's packed
 * tokens and strips, 1-5 MB), mapped with mmap and unmapped when the thread ends. Not malloc: freeing a block that
 * large raises glibc's mmap threshold for the whole process, after which numpy's prefill temporaries of 0.1-1 MB
 * came from the heap and stayed (the serving process grew 60 MB over six long prompts). A request above
 * THREAD_BUF_KEEP gets a mapping of its own that the caller gives back with scratch_done, so no thread keeps more.
 * NULL if it cannot be had. One buffer a thread: a caller must not hold it across another call that takes it. */
#define THREAD_BUF_KEEP ((size_t)8 << 20)
typedef struct {
    void *p;
    size_t size;
} thread_buf;
static pthread_key_t thread_buf_key;
static pthread_once_t thread_buf_once = PTHREAD_ONCE_INIT;
static void thread_buf_free(void *v) {
    thread_buf *b = v;
    if (b->p != NULL) munmap(b->p, b->size);
    free(b);
}
static void thread_buf_init(void) { (void)pthread_key_create(&thread_buf_key, thread_buf_free); }
static size_t page_round(size_t bytes) { return (bytes + 4095) / 4096 * 4096; }
static void *map_anon(size_t size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}
static void *thread_scratch(size_t bytes) {
    if (bytes > THREAD_BUF_KEEP) return map_anon(page_round(bytes));
    pthread_once(&thread_buf_once, thread_buf_init);
    thread_buf *b = pthread_getspecific(thread_buf_key);
    if (b == NULL) {
        if ((b = calloc(1, sizeof *b)) == NULL) return NULL;
        if (pthread_setspecific(thread_buf_key, b) != 0) {
            free(b);
            return NULL;
        }
    }
    if (b->size < bytes) {
        if (b->p != NULL) munmap(b->p, b->size);
        b->size = page_round(bytes);
        if ((b->p = map_anon(b->size)) == NULL) b->size = 0;
    }
    return b->p;
}
/* The end of a thread_scratch(bytes) buffer's use: a one-off mapping goes back, the thread's own buffer stays. */
static void scratch_done(void *p, size_t bytes) {
    if (p != NULL && bytes > THREAD_BUF_KEEP) munmap(p, page_round(bytes));
}

static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    return _mm_cvtss_f32(lo);
}

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static int64_t row_bytes(int dtype, int64_t cols) {
    switch (dtype) {
    case DT_F16: return 2 * cols;
    case DT_Q4_0: return cols / QK * 18;
    case DT_Q4_1: return cols / QK * 20;
    case DT_Q8_0: return cols / QK * 34;
    default: return -1;
    }
}

static inline float scalar_weight(int dtype, const uint8_t *row, int64_t c) {
    if (dtype == DT_F16) return h2f(row + 2 * c);
    int64_t b = c / QK, i = c % QK;
    if (dtype == DT_Q8_0) return (float)(int8_t)row[b * 34 + 2 + i] * h2f(row + b * 34);
    const uint8_t *blk = row + b * (dtype == DT_Q4_0 ? 18 : 20);
    const uint8_t *qs = blk + (dtype == DT_Q4_0 ? 2 : 4);
    int q = i < 16 ? (qs[i] & 0x0f) : (qs[i - 16] >> 4);
    return dtype == DT_Q4_0 ? (float)(q - 8) * h2f(blk) : (float)q * h2f(blk) + h2f(blk + 2);
}

#if CALCTL_AVX512
/* 32 consecutive weights starting at column c of a row (c a multiple of 32), as two vectors of sixteen floats. */
ALWAYS_INLINE void load32(int dtype, const uint8_t *row, int64_t c, __m512 w[2]) {
    if (dtype == DT_F16) {
        const uint16_t *p = (const uint16_t *)row + c;
        w[0] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        w[1] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 16)));
        return;
    }
    int64_t b = c / QK;
    if (dtype == DT_Q8_0) {
        const uint8_t *blk = row + b * 34;
        __m512 d = _mm512_set1_ps(h2f(blk));
        __m128i q0 = _mm_loadu_si128((const __m128i *)(blk + 2)), q1 = _mm_loadu_si128((const __m128i *)(blk + 18));
        w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
        w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
        return;
    }
    const uint8_t *blk = row + b * (dtype == DT_Q4_0 ? 18 : 20);
    const uint8_t *qs = blk + (dtype == DT_Q4_0 ? 2 : 4);
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 d = _mm512_set1_ps(h2f(blk));
    /* the block's 16 possible weights, by nibble value (the same fp32 arithmetic as the scalar dequantiser) */
    __m512 table = dtype == DT_Q4_0 ? _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(8.0f)), d)
                                    : _mm512_fmadd_ps(iota, d, _mm512_set1_ps(h2f(blk + 2)));
    __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
    w[0] = _mm512_permutexvar_ps(bytes, table); /* the permute reads an index's low 4 bits: the low nibble */
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
}

/* A row's block scales as fp32, converted sixteen blocks at a time (a gather of the blocks' first four bytes): the
 * inner loop then broadcasts them from memory, a load, instead of converting each block's fp16 scale on the vector
 * ports the FMAs need. d[b] always; m[b] for q4_1. Exactly the values h2f gives. */
#define MAX_SCALE_BLOCKS 1024
static void row_scales(int dtype, const uint8_t *row, int64_t nb, float *d, float *m) {
    int bs = dtype == DT_Q4_0 ? 18 : dtype == DT_Q4_1 ? 20 : 34;
    const __m512i step = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(bs));
    for (int64_t b = 0; b < nb; b += 16) {
        int64_t left = nb - b;
        __mmask16 k = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512i words = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, step, row + b * bs, 1);
        _mm512_mask_storeu_ps(d + b, k, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words)));
        if (dtype == DT_Q4_1)
            _mm512_mask_storeu_ps(m + b, k, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(words, 16))));
    }
}

/* load32 of a quantised block with its scales already converted (row_scales). */
ALWAYS_INLINE void load32_scaled(int dtype, const uint8_t *row, int64_t c, const float *ds, const float *ms,
                                 __m512 w[2]) {
    int64_t b = c / QK;
    __m512 d = _mm512_set1_ps(ds[b]);
    if (dtype == DT_Q8_0) {
        const uint8_t *blk = row + b * 34;
        __m128i q0 = _mm_loadu_si128((const __m128i *)(blk + 2)), q1 = _mm_loadu_si128((const __m128i *)(blk + 18));
        w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
        w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
        return;
    }
    const uint8_t *qs = row + b * (dtype == DT_Q4_0 ? 18 : 20) + (dtype == DT_Q4_0 ? 2 : 4);
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 table = dtype == DT_Q4_0 ? _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(8.0f)), d)
                                    : _mm512_fmadd_ps(iota, d, _mm512_set1_ps(ms[b]));
    __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
    w[0] = _mm512_permutexvar_ps(bytes, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
}

/* One row against NT (1..TILE, a constant after inlining) tokens, SCALED: the block scales come from ds/ms. Each
 * token has two accumulators (the block's two halves) and, for one or two tokens, two more for odd blocks: enough
 * independent FMA chains to hide the latency. */
ALWAYS_INLINE void row_tile_with(int dtype, const uint8_t *row, int64_t cols, const float *X, int64_t ldx, int NT,
                                 float *out, int SCALED, const float *ds, const float *ms) {
    int64_t vec = cols / QK * QK, c = 0;
    __m512 acc[TILE][4];
    for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = _mm512_setzero_ps();
    if (NT <= 2) {
        for (; c + 2 * QK <= vec; c += 2 * QK) {
            __m512 w[2], u[2];
            if (SCALED) {
                load32_scaled(dtype, row, c, ds, ms, w);
                load32_scaled(dtype, row, c + QK, ds, ms, u);
            } else {
                load32(dtype, row, c, w);
                load32(dtype, row, c + QK, u);
            }
            for (int t = 0; t < NT; t++) {
                const float *x = X + t * ldx + c;
                acc[t][0] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(x), acc[t][0]);
                acc[t][1] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(x + 16), acc[t][1]);
                acc[t][2] = _mm512_fmadd_ps(u[0], _mm512_loadu_ps(x + 32), acc[t][2]);
                acc[t][3] = _mm512_fmadd_ps(u[1], _mm512_loadu_ps(x + 48), acc[t][3]);
            }
        }
    }
    for (; c < vec; c += QK) {
        __m512 w[2];
        if (SCALED) load32_scaled(dtype, row, c, ds, ms, w);
        else load32(dtype, row, c, w);
        for (int t = 0; t < NT; t++) {
            const float *x = X + t * ldx + c;
            acc[t][0] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(x), acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(x + 16), acc[t][1]);
        }
    }
    for (int t = 0; t < NT; t++) {
        __m512 a = _mm512_add_ps(acc[t][0], acc[t][1]);
        float s = _mm512_reduce_add_ps(NT <= 2 ? _mm512_add_ps(a, _mm512_add_ps(acc[t][2], acc[t][3])) : a);
        for (int64_t k = vec; k < cols; k++) s += scalar_weight(dtype, row, k) * X[t * ldx + k];
        out[t] = s;
    }
}

ALWAYS_INLINE void row_tile(int dtype, const uint8_t *row, int64_t cols, const float *X, int64_t ldx, int NT,
                            float *out) {
    int64_t nb = cols / QK;
    if (dtype == DT_F16 || nb > MAX_SCALE_BLOCKS) {
        row_tile_with(dtype, row, cols, X, ldx, NT, out, 0, NULL, NULL);
        return;
    }
    float ds[MAX_SCALE_BLOCKS], ms[MAX_SCALE_BLOCKS];
    row_scales(dtype, row, nb, ds, ms);
    row_tile_with(dtype, row, cols, X, ldx, NT, out, 1, ds, ms);
}
#else
/* 32 consecutive weights starting at column c of a row, as four vectors of eight floats. */
ALWAYS_INLINE void load32(int dtype, const uint8_t *row, int64_t c, __m256 w[4]) {
    if (dtype == DT_F16) {
        const uint16_t *p = (const uint16_t *)row + c;
        for (int k = 0; k < 4; k++) w[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8 * k)));
        return;
    }
    int64_t b = c / QK;
    if (dtype == DT_Q8_0) {
        const uint8_t *blk = row + b * 34;
        __m256 d = _mm256_set1_ps(h2f(blk));
        for (int k = 0; k < 4; k++) {
            __m128i q = _mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * k));
            w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
        }
        return;
    }
    const uint8_t *blk = row + b * (dtype == DT_Q4_0 ? 18 : 20);
    const uint8_t *qs = blk + (dtype == DT_Q4_0 ? 2 : 4);
    __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    __m128i mask = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    __m256 d = _mm256_set1_ps(h2f(blk));
    if (dtype == DT_Q4_0) {
        __m256i eight = _mm256_set1_epi32(8);
        for (int k = 0; k < 4; k++)
            w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[k]), eight)), d);
    } else {
        __m256 m = _mm256_set1_ps(h2f(blk + 2));
        for (int k = 0; k < 4; k++) w[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k])), d, m);
    }
}

/* One row against NT (1..TILE, a constant after inlining) tokens. */
ALWAYS_INLINE void row_tile(int dtype, const uint8_t *row, int64_t cols, const float *X, int64_t ldx, int NT,
                            float *out) {
    int64_t vec = cols / QK * QK;
    if (NT == 1) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int64_t c = 0; c < vec; c += QK) {
            __m256 w[4];
            load32(dtype, row, c, w);
            a0 = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(X + c), a0);
            a1 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(X + c + 8), a1);
            a2 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(X + c + 16), a2);
            a3 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(X + c + 24), a3);
        }
        float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        for (int64_t c = vec; c < cols; c++) s += scalar_weight(dtype, row, c) * X[c];
        out[0] = s;
        return;
    }
    __m256 acc[TILE];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t c = 0; c < vec; c += QK) {
        __m256 w[4];
        load32(dtype, row, c, w);
        for (int t = 0; t < NT; t++) {
            const float *x = X + t * ldx + c;
            acc[t] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(x), acc[t]);
            acc[t] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), acc[t]);
            acc[t] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), acc[t]);
            acc[t] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) {
        float s = hsum256(acc[t]);
        for (int64_t c = vec; c < cols; c++) s += scalar_weight(dtype, row, c) * X[t * ldx + c];
        out[t] = s;
    }
}
#endif

/* Rows r0..r1 against tokens t0..t0+NT, one dtype: the inner loop specialised per (dtype, NT) by inlining. */
ALWAYS_INLINE void rows_tile(int dtype, const uint8_t *W, int64_t rb, int64_t r0, int64_t r1, int64_t cols,
                             const float *X, int64_t ldx, int NT, float *Y, int64_t ldy) {
    for (int64_t r = r0; r < r1; r++) {
        float out[TILE];
        prefetch_row(W, rb, r + PF_ROWS);
        row_tile(dtype, W + r * rb, cols, X, ldx, NT, out);
        for (int t = 0; t < NT; t++) Y[t * ldy + r] = out[t];
    }
}

#define TILE_CASES(DT)                                                                                               \
    switch (nt) {                                                                                                    \
    case 1: rows_tile(DT, W, rb, r0, r1, cols, X, ldx, 1, Y, ldy); break;                                            \
    case 2: rows_tile(DT, W, rb, r0, r1, cols, X, ldx, 2, Y, ldy); break;                                            \
    case 3: rows_tile(DT, W, rb, r0, r1, cols, X, ldx, 3, Y, ldy); break;                                            \
    case 4: rows_tile(DT, W, rb, r0, r1, cols, X, ldx, 4, Y, ldy); break;                                            \
    case 5: rows_tile(DT, W, rb, r0, r1, cols, X, ldx, 5, Y, ldy); break;                                            \
    case 6: rows_tile(DT, W, rb, r0, r1, cols, X, ldx, 6, Y, ldy); break;                                            \
    case 7: rows_tile(DT, W, rb, r0, r1, cols, X, ldx, 7, Y, ldy); break;                                            \
    default: rows_tile(DT, W, rb, r0, r1, cols, X, ldx, 8, Y, ldy); break;                                           \
    }

static void gemm_block(int dtype, const uint8_t *W, int64_t rb, int64_t r0, int64_t r1, int64_t cols, const float *X,
                       int64_t ldx, int nt, float *Y, int64_t ldy) {
    switch (dtype) {
    case DT_F16: TILE_CASES(DT_F16); break;
    case DT_Q4_0: TILE_CASES(DT_Q4_0); break;
    case DT_Q4_1: TILE_CASES(DT_Q4_1); break;
    default: TILE_CASES(DT_Q8_0); break;
    }
}

#if CALCTL_AVX512
/* Many tokens (prefill, PANEL_MIN or more): each 16-row chunk is dequantised once into an fp32 strip, then multiplied
 * with the tokens as vectors of sixteen. X is first laid out as panels XP[token / 16][col][token % 16] (zeros past n);
 * Y[t0..t0+16, r] accumulates W[r, c] (broadcast from the strip) times XP[t0 / 16][c] over c, one accumulator per
 * (row, token vector), eight rows by two token vectors at a time: no dequantisation and no horizontal sum in the
 * inner loop, which is then FMA-bound. Each output is one fp32 sum in column order. */
#define PANEL_MIN 16
#define STRIP 16
#define PANEL_BYTES (1 << 20)

/* Rows r0..r1 of W dequantised to fp32, row-major, `cols` apart. */
static void dequant_strip(int dtype, const uint8_t *W, int64_t rb, int64_t r0, int64_t r1, int64_t cols, float *out) {
    int64_t vec = cols / QK * QK;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = W + r * rb;
        float *o = out + (r - r0) * cols;
        for (int64_t c = 0; c < vec; c += QK) {
            __m512 w[2];
            load32(dtype, row, c, w);
            _mm512_storeu_ps(o + c, w[0]);
            _mm512_storeu_ps(o + c + 16, w[1]);
        }
        for (int64_t c = vec; c < cols; c++) o[c] = scalar_weight(dtype, row, c);
    }
}

/* R (1..8) rows of the strip against TV (1..2) token vectors of the panels; stores the valid tokens' outputs. */
ALWAYS_INLINE void panel_tile(const float *strip, int64_t cols, int R, const float *xp, int64_t panel, int TV,
                              int64_t t0, int64_t n, float *Y, int64_t ldy, int64_t r) {
    __m512 acc[8][2];
    for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t c = 0; c < cols; c++) {
        __m512 x0 = _mm512_load_ps(xp + c * 16), x1 = TV > 1 ? _mm512_load_ps(xp + panel + c * 16) : x0;
        for (int i = 0; i < R; i++) {
            __m512 w = _mm512_set1_ps(strip[i * cols + c]);
            acc[i][0] = _mm512_fmadd_ps(w, x0, acc[i][0]);
            if (TV > 1) acc[i][1] = _mm512_fmadd_ps(w, x1, acc[i][1]);
        }
    }
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i idx = _mm512_mullo_epi32(lanes, _mm512_set1_epi32((int)ldy));
    for (int v = 0; v < TV; v++) {
        int64_t t = t0 + 16 * v, left = n - t;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        for (int i = 0; i < R; i++) _mm512_mask_i32scatter_ps(Y + t * ldy + r + i, m, idx, acc[i][v], 4);
    }
}

#define PANEL_TV(RR)                                                                                                 \
    do {                                                                                                             \
        if (tv2) panel_tile(strip + (i0)*cols, cols, RR, xp, panel, 2, t0, n, Y, ldy, r0 + i0);                     \
        else panel_tile(strip + (i0)*cols, cols, RR, xp, panel, 1, t0, n, Y, ldy, r0 + i0);                         \
    } while (0)

static void panel_rows(const float *strip, int64_t r0, int64_t nr, int64_t cols, const float *XP, int64_t n, float *Y,
                       int64_t ldy) {
    int64_t panel = cols * 16, ntv = (n + 15) / 16;
    for (int64_t v = 0; v < ntv; v += 2) {
        const float *xp = XP + v * panel;
        int tv2 = v + 1 < ntv;
        int64_t t0 = v * 16;
        for (int64_t i0 = 0; i0 < nr; i0 += 8) {
            switch (nr - i0 >= 8 ? 8 : nr - i0) {
            case 1: PANEL_TV(1); break;
            case 2: PANEL_TV(2); break;
            case 3: PANEL_TV(3); break;
            case 4: PANEL_TV(4); break;
            case 5: PANEL_TV(5); break;
            case 6: PANEL_TV(6); break;
            case 7: PANEL_TV(7); break;
            default: PANEL_TV(8); break;
            }
        }
    }
}
#endif

/* ---------------------------------------------------------------------------------------------------------------
 * Decode GEMVs (n <= QMAX tokens) on the quantised dtypes: activations as 16-bit integers, exact block products.
 *
 * Each token's row of X is cut into the weight blocks' 32-column blocks. A block with largest magnitude amax gets the
 * scale sx = amax / 32767 and every element x is written as sx * (hi + lo / LO_SCALE): hi = round(x / sx), lo =
 * round((x / sx - hi) * LO_SCALE), both 16-bit. What that leaves out is at most sx / (2 * LO_SCALE), 2^-32 of amax:
 * below fp32's own rounding unless the block holds an element over 2^8 times the others and the weights there are
 * about zero (against float64, the error relative to sum |w x| stayed at 1e-7..1e-6 over activations spanning
 * 10^-8.7..10^8.7; tests pin it). A weight block times hi and times lo is exact in integers (vpmaddwd: four products
 * of a nibble or int8 weight and a 16-bit value to each of eight int32 lanes, at most 4 * 128 * 32767 < 2^24, so the
 * lanes also convert to float exactly); q4_0's nibbles are made signed (q - 8) first, so its weights are exact like
 * q8_0's. The product is scaled by d * sx (for q4_1 plus m * sx * sum(x), sum(x) from the same parts) and the
 * blocks are summed in fp32. A row this cannot represent goes to the float path instead (quant_x says so): one
 * holding a NaN or an infinity (the float path propagates them as IEEE arithmetic does), or a block whose amax is
 * below QX_TINY (32767 / amax would overflow) or above QX_HUGE (its sums could overflow where the float path's do
 * not). One token's GEMV is bound by these instructions, not by memory: SmolLM2's q4_1 layers stream at about 14
 * GB/s of the 24-26 GB/s two cores can read on the reference machine. For more tokens the float path, which
 * converts each weight once for eight tokens, is faster, and takes them.
 */
#define QMAX 2
#define QTILE 2
#define QTAIL 8 /* rows of the last chunks of a GEMV */
/* The low part of an activation: what the high part's rounding left, in units of 1 / LO_SCALE of the high part's. */
#define LO_SCALE 65534.0f

static inline int32_t hsum_epi32(__m256i v) {
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    return _mm_cvtsi128_si32(s4);
}

#define QX_TINY 0x1p-100f
#define QX_HUGE 0x1p100f

/* One token's row x[cols] as x16 (per block b: 32 high parts, then 32 low parts, at x16 + 64 * b) and
 * sp[2 * b] = sx, sp[2 * b + 1] = sx * (sum(hi) + sum(lo) / LO_SCALE). The 32 parts of a block are in element order
 * for q8_0 and, for the q4 dtypes (`nibble_order`), in the order their in-lane nibble unpack gives (qrow_tile):
 * elements 0, 2, .., 14, 16, 18, .., 30, then 1, 3, .., 15, 17, .., 31. Returns 0, or -1 when the row is not for
 * this path: a NaN or an infinity, or a block whose amax is nonzero and below QX_TINY or above QX_HUGE. */
static int quant_x(const float *x, int64_t cols, int16_t *x16, float *sp, int nibble_order) {
    const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), odd = _mm256_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15);
    for (int64_t b = 0; b < cols / QK; b++) {
        const float *p = x + b * QK;
        __m256 a = _mm256_setzero_ps(), z = _mm256_setzero_ps();
        __m256 sign = _mm256_set1_ps(-0.0f);
        for (int k = 0; k < 4; k++) {
            __m256 v = _mm256_loadu_ps(p + 8 * k);
            a = _mm256_max_ps(a, _mm256_andnot_ps(sign, v));
            z = _mm256_add_ps(z, _mm256_mul_ps(v, _mm256_setzero_ps())); /* 0, or NaN for a NaN or infinity */
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        if (hsum256(z) != 0.0f || amax > QX_HUGE || (amax > 0.0f && amax < QX_TINY)) return -1;
        float sx = amax / 32767.0f, id = amax > 0.0f ? 32767.0f / amax : 0.0f;
        __m256 vid = _mm256_set1_ps(id), lo_scale = _mm256_set1_ps(LO_SCALE);
        __m256i hi[4], lo[4], sum = _mm256_setzero_si256(), sum_lo = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) { /* four groups of eight parts */
            __m256 e = nibble_order ? _mm256_i32gather_ps(p + 16 * (k & 1), k < 2 ? even : odd, 4)
                                    : _mm256_loadu_ps(p + 8 * k);
            __m256 v = _mm256_mul_ps(e, vid);
            hi[k] = _mm256_cvtps_epi32(v);
            lo[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(v, _mm256_cvtepi32_ps(hi[k])), lo_scale));
            sum = _mm256_add_epi32(sum, hi[k]);
            sum_lo = _mm256_add_epi32(sum_lo, lo[k]);
        }
        /* packs works within 128-bit lanes: permute4x64 puts the 16 values back in order */
        int16_t *out = x16 + 2 * QK * b;
        _mm256_store_si256((__m256i *)out, _mm256_permute4x64_epi64(_mm256_packs_epi32(hi[0], hi[1]), 0xd8));
        _mm256_store_si256((__m256i *)(out + 16), _mm256_permute4x64_epi64(_mm256_packs_epi32(hi[2], hi[3]), 0xd8));
        _mm256_store_si256((__m256i *)(out + 32), _mm256_permute4x64_epi64(_mm256_packs_epi32(lo[0], lo[1]), 0xd8));
        _mm256_store_si256((__m256i *)(out + 48), _mm256_permute4x64_epi64(_mm256_packs_epi32(lo[2], lo[3]), 0xd8));
        sp[2 * b] = sx;
        sp[2 * b + 1] = sx * ((float)hsum_epi32(sum) + (float)hsum_epi32(sum_lo) / LO_SCALE);
    }
    return 0;
}

/* One row against NT (1..QTILE, a constant after inlining) tokens' 16-bit activations; two accumulators per token
 * (even and odd blocks) so consecutive blocks' FMAs do not wait on each other.
 *
 * A q4 block's 16 bytes are unpacked without crossing the 128-bit lanes: broadcast to both lanes, shifted right as
 * 32-bit words by 0 (low lane) or 4 (high lane) bits and masked to the low nibble of every 16-bit word, they give
 * the low nibbles of the even bytes (elements 0, 2, .., 14) and the high nibbles of the even bytes (16, 18, .., 30);
 * shifted by 8 and 12, those of the odd bytes (1, .., 15 and 17, .., 31). quant_x wrote the activations in that
 * order. Widening the nibbles with vpmovzxbw, which crosses lanes, took 8.4 cycles a q4_1 block where this takes
 * 7.0 (one token, one thread, the rows in cache, on the reference machine). */
ALWAYS_INLINE void qrow_tile(int dtype, const uint8_t *row, int64_t nb, const int16_t *X16, int64_t ldq,
                             const float *SP, int64_t ldsp, int NT, float *out) {
    __m256 acc[QTILE], acc2[QTILE];
    __m128 macc[QTILE];
    for (int t = 0; t < NT; t++) {
        acc[t] = _mm256_setzero_ps();
        acc2[t] = _mm256_setzero_ps();
        macc[t] = _mm_setzero_ps();
    }
    const __m256i shift_a = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4), shift_b = _mm256_setr_epi32(8, 8, 8, 8, 12, 12, 12, 12);
    const __m256i nibble = _mm256_set1_epi32(0x000f000f), eight = _mm256_set1_epi16(8);
    const __m256 inv_lo = _mm256_set1_ps(1.0f / LO_SCALE);
    for (int64_t b = 0; b < nb; b++) {
        __m256i qa, qb;
        __m128 dm; /* (d, m) for q4_1, d for the others */
        if (dtype == DT_Q8_0) {
            const uint8_t *blk = row + b * 34;
            qa = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 2)));
            qb = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 18)));
            dm = _mm_cvtph_ps(_mm_set1_epi16(*(const int16_t *)blk));
        } else {
            const uint8_t *blk = row + b * (dtype == DT_Q4_0 ? 18 : 20);
            __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + (dtype == DT_Q4_0 ? 2 : 4))));
            qa = _mm256_and_si256(_mm256_srlv_epi32(raw, shift_a), nibble);
            qb = _mm256_and_si256(_mm256_srlv_epi32(raw, shift_b), nibble);
            if (dtype == DT_Q4_1) {
                int32_t dmw; /* d and m: two halves */
                memcpy(&dmw, blk, 4);
                dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dmw));
            } else { /* q4_0: the signed weights q - 8, times d */
                qa = _mm256_sub_epi16(qa, eight);
                qb = _mm256_sub_epi16(qb, eight);
                dm = _mm_cvtph_ps(_mm_set1_epi16(*(const int16_t *)blk));
            }
        }
        for (int t = 0; t < NT; t++) {
            const __m256i *x = (const __m256i *)(X16 + t * ldq + 2 * QK * b);
            __m256i ph = _mm256_add_epi32(_mm256_madd_epi16(qa, _mm256_load_si256(x)),
                                          _mm256_madd_epi16(qb, _mm256_load_si256(x + 1)));
            __m256i pl = _mm256_add_epi32(_mm256_madd_epi16(qa, _mm256_load_si256(x + 2)),
                                          _mm256_madd_epi16(qb, _mm256_load_si256(x + 3)));
            __m256 p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pl), inv_lo, _mm256_cvtepi32_ps(ph));
            __m128 sc = _mm_mul_ps(dm, _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(SP + t * ldsp + 2 * b))));
            if (dtype == DT_Q4_1) macc[t] = _mm_add_ps(macc[t], sc);
            if (b & 1) acc2[t] = _mm256_fmadd_ps(p, _mm256_broadcastss_ps(sc), acc2[t]);
            else acc[t] = _mm256_fmadd_ps(p, _mm256_broadcastss_ps(sc), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) {
        float s = hsum256(_mm256_add_ps(acc[t], acc2[t]));
        if (dtype == DT_Q4_1) s += _mm_cvtss_f32(_mm_shuffle_ps(macc[t], macc[t], 1));
        out[t] = s;
    }
}

typedef struct {
    int dtype;
    const uint8_t *W;
    int64_t rb, rows, nb, n, ldy, chunk_rows, ldq;
    int64_t big_chunks, tail; /* chunks of chunk_rows rows, then chunks of QTAIL rows from row `tail` on */
    const int16_t *X16;
    const float *SP;
    float *Y;
} qjob;

ALWAYS_INLINE void qrows(int dtype, const qjob *j, int64_t r0, int64_t r1, int64_t t0, int NT) {
    for (int64_t r = r0; r < r1; r++) {
        float out[TILE];
        prefetch_row(j->W, j->rb, r + PF_ROWS);
        qrow_tile(dtype, j->W + r * j->rb, j->nb, j->X16 + t0 * j->ldq, j->ldq, j->SP + 2 * t0 * j->nb, 2 * j->nb, NT,
                  out);
        for (int t = 0; t < NT; t++) j->Y[(t0 + t) * j->ldy + r] = out[t];
    }
}
#define QCASES(DT)                                                                                                   \
    switch (nt) {                                                                                                    \
    case 1: qrows(DT, j, r0, r1, t0, 1); break;                                                                      \
    default: qrows(DT, j, r0, r1, t0, 2); break;                                                                     \
    }

static void qchunk(void *ctx, int64_t chunk, int worker) {
    (void)worker;
    const qjob *j = ctx;
    int64_t r0, r1;
    if (chunk < j->big_chunks) {
        r0 = chunk * j->chunk_rows;
        r1 = r0 + j->chunk_rows < j->tail ? r0 + j->chunk_rows : j->tail;
    } else {
        r0 = j->tail + (chunk - j->big_chunks) * QTAIL;
        r1 = r0 + QTAIL < j->rows ? r0 + QTAIL : j->rows;
    }
    for (int64_t t0 = 0; t0 < j->n; t0 += QTILE) {
        int nt = (int)(j->n - t0 < QTILE ? j->n - t0 : QTILE);
        switch (j->dtype) {
        case DT_Q4_0: QCASES(DT_Q4_0); break;
        case DT_Q4_1: QCASES(DT_Q4_1); break;
        default: QCASES(DT_Q8_0); break;
        }
    }
}

#if !CALCTL_AVX512
/* ---------------------------------------------------------------------------------------------------------------
 * Many tokens without AVX-512 (a prefill, XMIN or more): dequantise once, then a register-blocked GEMM.
 *
 * Each 16-row chunk of W is dequantised once into an fp32 strip laid out by column, WS[c][16] (the 16 rows of
 * column c side by side: two vectors), and the tokens are packed in groups of XT (6): XP[g][c][6]. For each group
 * the micro-kernel keeps 2 x 6 accumulators (16 rows x 6 tokens) and, per column, loads the two row vectors and
 * broadcasts each token's x: twelve FMAs for two loads and six broadcasts, no dequantisation and no horizontal
 * sum in the inner loop (the tiled path dequantises every weight once per eight tokens and spends a load of X per
 * FMA). Each output is one fp32 sum in column order; Y's 16 rows of a token are stored as two vectors. On the
 * reference machine (Zen 3, two cores) SmolLM2's layer GEMMs of a 485-token prompt ran at 84-91 % of the FMA peak,
 * against 48-50 % on the tiled path; below 32 tokens the strip's dequantisation and transposition, paid once per
 * call, outweigh that (at 16 tokens 43 % against 47 %), so fewer tokens stay on the tiled path.
 */
#define XMIN 32
#define XT 6
#define XROWS 16

/* Eight vectors (rows) of eight floats, transposed in place (columns). */
static inline void transpose8(__m256 v[8]) {
    __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
    __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
    __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
    __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    v[0] = _mm256_permute2f128_ps(u0, u4, 0x20), v[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    v[2] = _mm256_permute2f128_ps(u2, u6, 0x20), v[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    v[4] = _mm256_permute2f128_ps(u0, u4, 0x31), v[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    v[6] = _mm256_permute2f128_ps(u2, u6, 0x31), v[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* Rows r0..r0+nr (nr <= 16) of W dequantised into ws[c * 16 + i] (rows past nr are zero): eight rows' 32-column
 * block at a time, each 8 x 8 tile transposed in registers. */
static void dequant_cols(int dtype, const uint8_t *W, int64_t rb, int64_t r0, int64_t nr, int64_t cols, float *ws) {
    int64_t vec = cols / QK * QK;
    for (int64_t h = 0; h < XROWS; h += 8) {
        for (int64_t c = 0; c < vec; c += QK) {
            __m256 w[8][4];
            for (int64_t i = 0; i < 8; i++) {
                if (h + i < nr) load32(dtype, W + (r0 + h + i) * rb, c, w[i]);
                else w[i][0] = w[i][1] = w[i][2] = w[i][3] = _mm256_setzero_ps();
            }
            for (int k = 0; k < 4; k++) {
                __m256 v[8];
                for (int i = 0; i < 8; i++) v[i] = w[i][k];
                transpose8(v);
                for (int j = 0; j < 8; j++) _mm256_store_ps(ws + (c + 8 * k + j) * XROWS + h, v[j]);
            }
        }
        for (int64_t c = vec; c < cols; c++) /* an fp16 matrix's last columns */
            for (int64_t i = 0; i < 8; i++)
                ws[c * XROWS + h + i] = h + i < nr ? scalar_weight(dtype, W + (r0 + h + i) * rb, c) : 0.0f;
    }
}

/* 16 rows of the strip against one packed group of XT tokens (zeros past n); stores rows r0..r0+nr of the group's
 * first nt tokens. The twelve accumulators are named variables: kept in an array, GCC stored them to the stack on
 * every column (twelve stores per twelve FMAs, a third of the speed). */
static void xtile(const float *ws, int64_t cols, const float *xp, float *Y, int64_t ldy, int64_t t0, int64_t nt,
                  int64_t r0, int64_t nr) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00,
           a40 = a00, a41 = a00, a50 = a00, a51 = a00;
    for (int64_t c = 0; c < cols; c++) {
        const float *x = xp + c * XT;
        __m256 w0 = _mm256_load_ps(ws + c * XROWS), w1 = _mm256_load_ps(ws + c * XROWS + 8), b;
#define XFMA(T, A0, A1)                                                                                              \
    b = _mm256_broadcast_ss(x + T);                                                                                  \
    A0 = _mm256_fmadd_ps(w0, b, A0);                                                                                 \
    A1 = _mm256_fmadd_ps(w1, b, A1)
        XFMA(0, a00, a01);
        XFMA(1, a10, a11);
        XFMA(2, a20, a21);
        XFMA(3, a30, a31);
        XFMA(4, a40, a41);
        XFMA(5, a50, a51);
#undef XFMA
    }
    float out[XT][XROWS];
    _mm256_storeu_ps(out[0], a00), _mm256_storeu_ps(out[0] + 8, a01);
    _mm256_storeu_ps(out[1], a10), _mm256_storeu_ps(out[1] + 8, a11);
    _mm256_storeu_ps(out[2], a20), _mm256_storeu_ps(out[2] + 8, a21);
    _mm256_storeu_ps(out[3], a30), _mm256_storeu_ps(out[3] + 8, a31);
    _mm256_storeu_ps(out[4], a40), _mm256_storeu_ps(out[4] + 8, a41);
    _mm256_storeu_ps(out[5], a50), _mm256_storeu_ps(out[5] + 8, a51);
    for (int64_t t = 0; t < nt; t++) memcpy(Y + (t0 + t) * ldy + r0, out[t], (size_t)nr * sizeof(float));
}

typedef struct {
    int dtype;
    const uint8_t *W;
    int64_t rb, rows, cols, n, ldy;
    const float *XP;
    float *strips; /* one strip of cols x 16 per worker */
    float *Y;
} xjob;

static void xchunk(void *ctx, int64_t chunk, int worker) {
    const xjob *j = ctx;
    int64_t r0 = chunk * XROWS, nr = j->rows - r0 < XROWS ? j->rows - r0 : XROWS;
    float *ws = j->strips + (int64_t)worker * j->cols * XROWS;
    dequant_cols(j->dtype, j->W, j->rb, r0, nr, j->cols, ws);
    for (int64_t t0 = 0; t0 < j->n; t0 += XT)
        xtile(ws, j->cols, j->XP + (t0 / XT) * j->cols * XT, j->Y, j->ldy, t0, j->n - t0 < XT ? j->n - t0 : XT, r0, nr);
}

/* The many-token path of calctl_wgemm (n >= XMIN, cols <= XMAX_COLS). The tokens go in blocks of ~1 MB of packed
 * activations (XP_BYTES) but at least XB_MIN tokens, so every strip's dequantisation serves at least 48 tokens,
 * and the calling thread's scratch (thread_scratch) stays 1-5 MB whatever the prompt's length. Wider rows take the
 * tiled path: a strip of 16 rows then outgrows the L2 cache, and blocks of few tokens dequantised it again and again
 * (1.3-1.8x slower than the tiled path at 28672 columns). */
#define XP_BYTES (1 << 20)
#define XB_MIN 48
#define XMAX_COLS 16384
static int xgemm(int dtype, const uint8_t *W, int64_t rb, int64_t rows, int64_t cols, const float *X, int64_t ldx,
                 int64_t n, float *Y, int64_t ldy, int threads) {
    int64_t tb = XP_BYTES / (cols * (int64_t)sizeof(float)) / XT * XT, chunks = (rows + XROWS - 1) / XROWS;
    tb = tb < XB_MIN ? XB_MIN : tb;
    tb = tb > n ? (n + XT - 1) / XT * XT : tb;
    if (threads > chunks) threads = (int)chunks; /* a strip for each thread that can have a chunk */
    if (threads < 1) threads = 1;
    int64_t packed = (tb * cols + 15) / 16 * 16; /* the strips after it on 64-byte lines */
    size_t bytes = (size_t)(packed + (int64_t)threads * cols * XROWS) * sizeof(float);
    float *xp = thread_scratch(bytes);
    if (xp == NULL) return -2;
    for (int64_t b0 = 0; b0 < n; b0 += tb) {
        int64_t nb = n - b0 < tb ? n - b0 : tb;
        for (int64_t g = 0; g < (nb + XT - 1) / XT; g++)
            for (int64_t c = 0; c < cols; c++)
                for (int64_t k = 0; k < XT; k++) {
                    int64_t t = g * XT + k;
                    xp[(g * cols + c) * XT + k] = t < nb ? X[(b0 + t) * ldx + c] : 0.0f;
                }
        xjob j = {dtype, W, rb, rows, cols, nb, ldy, xp, xp + packed, Y + b0 * ldy};
        pool_run(xchunk, &j, chunks, threads);
    }
    scratch_done(xp, bytes);
    return 0;
}
#endif

typedef struct {
    int dtype;
    const uint8_t *W;
    int64_t rb, rows, cols, ldx, n, ldy, chunk_rows;
    const float *X;
    float *Y;
    const float *XP;  /* the token panels, or NULL: the tiled path */
    float *strips;    /* one fp32 strip of chunk_rows x cols per worker (the panel path) */
} gemm_job;

static void gemm_chunk(void *ctx, int64_t chunk, int worker) {
    const gemm_job *j = ctx;
    int64_t r0 = chunk * j->chunk_rows, r1 = r0 + j->chunk_rows < j->rows ? r0 + j->chunk_rows : j->rows;
#if CALCTL_AVX512
    if (j->XP != NULL) {
        float *strip = j->strips + (int64_t)worker * j->chunk_rows * j->cols;
        dequant_strip(j->dtype, j->W, j->rb, r0, r1, j->cols, strip);
        panel_rows(strip, r0, r1 - r0, j->cols, j->XP, j->n, j->Y, j->ldy);
        return;
    }
#else
    (void)worker;
#endif
    for (int64_t t0 = 0; t0 < j->n; t0 += TILE) {
        int nt = (int)(j->n - t0 < TILE ? j->n - t0 : TILE);
        gemm_block(j->dtype, j->W, j->rb, r0, r1, j->cols, j->X + t0 * j->ldx, j->ldx, nt, j->Y + t0 * j->ldy, j->ldy);
    }
}

/* The decode path of calctl_wgemm (see "Decode GEMVs" above). Returns 0, -2 when its scratch cannot be had, or 1 when
 * a token's activations are not for it (quant_x), which the float path then computes. */
static int qgemm(int dtype, const uint8_t *W, int64_t rb, int64_t rows, int64_t cols, const float *X, int64_t ldx,
                 int64_t n, float *Y, int64_t ldy, int threads) {
    int64_t nb = cols / QK;
    int16_t *x16 = scratch_alloc((size_t)(2 * n * cols) * sizeof(int16_t));
    float *sp = scratch_alloc((size_t)(n * nb * 2) * sizeof(float));
    if (x16 == NULL || sp == NULL) {
        free(x16);
        free(sp);
        return -2;
    }
    for (int64_t t = 0; t < n; t++) {
        if (quant_x(X + t * ldx, cols, x16 + 2 * t * cols, sp + t * 2 * nb, dtype != DT_Q8_0) != 0) {
            free(x16);
            free(sp);
            return 1; /* for the float path */
        }
    }
    /* Chunks of up to 64 rows, at least four per thread: a thread then streams long runs of rows that its prefetches
     * stay within (16-row chunks, which the threads took in turns, ran 1.3x slower). The last 2 * QTAIL rows per
     * thread go in chunks of QTAIL, so that the threads end together: the caller waits for the last chunk a worker
     * claimed. */
    int64_t chunk = rows / (4 * (int64_t)threads);
    chunk = chunk < 16 ? 16 : chunk > 64 ? 64 : chunk;
    int64_t tail_rows = threads > 1 ? 2 * QTAIL * (int64_t)threads : 0;
    int64_t tail = rows > tail_rows ? rows - tail_rows : 0, big = (tail + chunk - 1) / chunk;
    qjob j = {dtype, W, rb, rows, nb, n, ldy, chunk, 2 * cols, big, tail, x16, sp, Y};
    pool_run(qchunk, &j, big + (rows - tail + QTAIL - 1) / QTAIL, threads);
    free(x16);
    free(sp);
    return 0;
}

/* Y[n, rows] (leading dimension ldy) = X[n, cols] (leading dimension ldx) times W[rows, cols]^T.
 * Returns 0, -1 for a dtype/shape the kernel does not take (quantised cols must be a multiple of 32), or -2 when its
 * scratch memory cannot be had. */
int calctl_wgemm(int dtype, const uint8_t *W, int64_t rows, int64_t cols, const float *X, int64_t ldx, int64_t n,
                 float *Y, int64_t ldy, int threads) {
    int64_t rb = row_bytes(dtype, cols);
    if (rb < 0 || rows < 0 || cols < 0 || n < 0 || (dtype != DT_F16 && cols % QK)) return -1;
    if (cols == 0) { /* empty sums: zeros (and no division by the row length below) */
        for (int64_t t = 0; t < n; t++)
            for (int64_t r = 0; r < rows; r++) Y[t * ldy + r] = 0.0f;
        return 0;
    }
    if (threads < 1) threads = 1;
    if (threads > POOL_MAX) threads = POOL_MAX;
    /* Little work: stay on the calling thread (a chunk hand-off costs a few microseconds). */
    if (rows * cols * (n < TILE ? n : TILE) < GEMM_SPLIT_MACS) threads = 1;
    if (dtype != DT_F16 && n <= QMAX) {
        int rc = qgemm(dtype, W, rb, rows, cols, X, ldx, n, Y, ldy, threads);
        if (rc <= 0) return rc; /* 1: activations the integer path cannot represent, computed below */
    }
#if !CALCTL_AVX512
    if (n >= XMIN && cols <= XMAX_COLS) return xgemm(dtype, W, rb, rows, cols, X, ldx, n, Y, ldy, threads);
#endif
    gemm_job j = {dtype, W, rb, rows, cols, ldx, n, ldy, 16, X, Y, NULL, NULL};
    float *buf = NULL;
#if CALCTL_AVX512
    if (n > 1 && n < PANEL_MIN && ((uintptr_t)X % 64 || ldx % 16)) {
        /* Several tokens' rows that are not on 64-byte lines: every vector load of X would split two cache lines
         * (an 8-token q4_1 GEMM ran 1.4x, the q8_0 LM head 1.6x slower). Copy them to aligned rows. */
        int64_t lda = (cols + 15) / 16 * 16;
        buf = scratch_alloc((size_t)(n * lda) * sizeof(float));
        if (buf == NULL) return -2;
        for (int64_t t = 0; t < n; t++) memcpy(buf + t * lda, X + t * ldx, (size_t)cols * sizeof(float));
        j.X = buf;
        j.ldx = lda;
    }
    if (n >= PANEL_MIN && ldy <= INT32_MAX / 16) {
        /* Tokens in blocks whose panels take at most ~1 MB (at least 16 tokens), so the scratch stays small and is
         * reused from the heap: freeing prefill-sized buffers of every size left glibc's heap 20 MB larger. */
        int64_t tb = (PANEL_BYTES / (cols * 64)) * 16;
        tb = tb < 16 ? 16 : tb > n ? (n + 15) / 16 * 16 : tb;
        int64_t panels = tb * cols;
        buf = scratch_alloc((size_t)(panels + (int64_t)threads * STRIP * cols) * sizeof(float));
        if (buf == NULL) return -2;
        j.XP = buf;
        j.strips = buf + panels;
        j.chunk_rows = STRIP;
        for (int64_t t0 = 0; t0 < n; t0 += tb) {
            int64_t nb = n - t0 < tb ? n - t0 : tb, ntv = (nb + 15) / 16;
            for (int64_t v = 0; v < ntv; v++)
                for (int64_t c = 0; c < cols; c++)
                    for (int64_t k = 0; k < 16; k++) {
                        int64_t t = v * 16 + k;
                        buf[(v * cols + c) * 16 + k] = t < nb ? X[(t0 + t) * ldx + c] : 0.0f;
                    }
            j.n = nb;
            j.Y = Y + t0 * ldy;
            pool_run(gemm_chunk, &j, (rows + j.chunk_rows - 1) / j.chunk_rows, threads);
        }
        free(buf);
        return 0;
    }
#endif
    pool_run(gemm_chunk, &j, (rows + j.chunk_rows - 1) / j.chunk_rows, threads);
    free(buf);
    return 0;
}

/* Dequantise rows idx[0..n) of W[rows, cols] into out[n, cols] fp32 (embedding lookups). */
int calctl_wrows(int dtype, const uint8_t *W, int64_t rows, int64_t cols, const int64_t *idx, int64_t n, float *out) {
    int64_t rb = row_bytes(dtype, cols);
    if (rb < 0 || (dtype != DT_F16 && cols % QK)) return -1;
    for (int64_t i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= rows) return -1;
        const uint8_t *row = W + idx[i] * rb;
        for (int64_t c = 0; c < cols; c++) out[i * cols + c] = scalar_weight(dtype, row, c);
    }
    return 0;
}

/* Kept for callers of the fp16 GEMV: y = W x, W fp16 [rows, cols]. */
int calctl_gemv_f16(const uint16_t *W, const float *x, float *y, int64_t rows, int64_t cols) {
    return calctl_wgemm(DT_F16, (const uint8_t *)W, rows, cols, x, cols, 1, y, rows, 1);
}

/* exp(x), eight at a time (softmax scores minus their maximum, the SiLU's exp(-gate)): Cephes' expf (range
 * reduction by ln 2, degree-5 polynomial), about 1 ulp; below -87.3 it is 0 like expf's underflow, above 88 it
 * saturates near 2^127 (the SiLU of such a gate is -0 either way). */
static inline __m256 exp256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.0f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

static inline float dot(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc2);
    }
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum256(_mm256_add_ps(acc, acc2));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* One decode step's attention over n lanes, each with its own cache.
 *
 *   q     [n, heads * hd]          the lanes' rotated queries
 *   knew  [n, kv_heads * hd]       the lanes' rotated new keys, vnew the same for values
 *   kc/vc n addresses of the lanes' caches for this layer, each [capacity, kv_heads, hd] fp32
 *   pos   [n]                      each lane's position (its committed KV length); it attends 0..pos
 *   out   [n, heads * hd]
 *
 * Writes knew/vnew at pos in each cache first. Returns 0, or -1 for a bad shape or an allocation failure. */
typedef struct {
    int64_t heads, hd, kw, group, ldq, scratch;
    const float *q;
    const int64_t *kc, *vc, *pos;
    float *out, *work, scale;
} attend_job;

/* scores[j] = scale * (q . K[j]) for j < len, the rows of K kw floats apart: four positions at a time, each a sum of
 * hd / 8 vector products reduced together (one horizontal sum a position cost as much as its products). */
static void qk_scores(const float *q, const float *K, int64_t kw, int64_t hd, int64_t len, float scale, float *scores) {
    int64_t j = 0;
    if (hd % 8 == 0) {
        const __m128 vscale = _mm_set1_ps(scale);
        for (; j + 4 <= len; j += 4) {
            const float *k0 = K + j * kw, *k1 = k0 + kw, *k2 = k1 + kw, *k3 = k2 + kw;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t d = 0; d < hd; d += 8) {
                __m256 qv = _mm256_loadu_ps(q + d);
                a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
                a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
                a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
                a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
            }
            /* hadd twice: [a0 a1 a2 a3] over each 128-bit half; the halves' sum is the four dot products */
            __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
            __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            _mm_storeu_ps(scores + j, _mm_mul_ps(sum, vscale));
        }
    }
    for (; j < len; j++) scores[j] = dot(q, K + j * kw, hd) * scale;
}

/* out[d] = inv * sum over j < len of w[j] * V[j][d], the rows of V kw floats apart: 32 (then 8) columns at a time
 * held in registers over all positions. */
static void weighted_rows(const float *w, const float *V, int64_t kw, int64_t hd, int64_t len, float inv, float *out) {
    int64_t d = 0;
    const __m256 vinv = _mm256_set1_ps(inv);
    for (; d + 32 <= hd; d += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t j = 0; j < len; j++) {
            const float *v = V + j * kw + d;
            __m256 wj = _mm256_broadcast_ss(w + j);
            a0 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v), a0);
            a1 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v + 8), a1);
            a2 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v + 16), a2);
            a3 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v + 24), a3);
        }
        _mm256_storeu_ps(out + d, _mm256_mul_ps(a0, vinv));
        _mm256_storeu_ps(out + d + 8, _mm256_mul_ps(a1, vinv));
        _mm256_storeu_ps(out + d + 16, _mm256_mul_ps(a2, vinv));
        _mm256_storeu_ps(out + d + 24, _mm256_mul_ps(a3, vinv));
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 a = _mm256_setzero_ps();
        for (int64_t j = 0; j < len; j++) a = _mm256_fmadd_ps(_mm256_broadcast_ss(w + j), _mm256_loadu_ps(V + j * kw + d), a);
        _mm256_storeu_ps(out + d, _mm256_mul_ps(a, vinv));
    }
    for (; d < hd; d++) {
        float a = 0.0f;
        for (int64_t j = 0; j < len; j++) a += w[j] * V[j * kw + d];
        out[d] = a * inv;
    }
}

/* One (lane, head) of the decode attention; `worker` picks that thread's scratch (scores). */
static void attend_chunk(void *ctx, int64_t job, int worker) {
    const attend_job *a = ctx;
    int64_t hd = a->hd, kw = a->kw, l = job / a->heads, h = job % a->heads, g = h / a->group, len = a->pos[l] + 1;
    float *scores = a->work + worker * a->scratch;
    const float *qh = a->q + l * a->ldq + h * hd;
    const float *K = (const float *)(intptr_t)a->kc[l] + g * hd, *V = (const float *)(intptr_t)a->vc[l] + g * hd;
    qk_scores(qh, K, kw, hd, len, a->scale, scores);
    float mx = -INFINITY;
    int nan = 0;
    for (int64_t j = 0; j < len; j++) {
        mx = scores[j] > mx ? scores[j] : mx;
        nan |= scores[j] != scores[j];
    }
    if (nan || !isfinite(mx)) { /* a NaN score, +inf (inf - inf) or every score -inf (0 / 0): NaN, as softmax gives */
        float *o = a->out + l * a->heads * hd + h * hd;
        for (int64_t d = 0; d < hd; d++) o[d] = NAN;
        return;
    }
    __m256 vmx = _mm256_set1_ps(mx), vsum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(scores + j), vmx));
        _mm256_storeu_ps(scores + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    if (j < len) { /* the tail through the same vector exp (padding lanes are zeroed by the mask) */
        float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t i = j; i < len; i++) tail[i - j] = scores[i] - mx;
        __m256 e = exp256(_mm256_loadu_ps(tail));
        _mm256_storeu_ps(tail, e);
        for (int64_t i = j; i < len; i++) scores[i] = tail[i - j];
        for (int64_t i = len - j; i < 8; i++) tail[i] = 0.0f;
        vsum = _mm256_add_ps(vsum, _mm256_loadu_ps(tail));
    }
    weighted_rows(scores, V, kw, hd, len, 1.0f / hsum256(vsum), a->out + l * a->heads * hd + h * hd);
}

static int attend(int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const float *q, int64_t ldq,
                  const float *knew, const float *vnew, int64_t ldkv, const int64_t *kc, const int64_t *vc,
                  const int64_t *pos, float *out, int threads) {
    if (n < 0 || heads < 1 || kv_heads < 1 || hd < 1 || heads % kv_heads) return -1;
    int64_t kw = kv_heads * hd, maxlen = 0, work = 0;
    for (int64_t l = 0; l < n; l++) {
        if (pos[l] < 0) return -1;
        memcpy((float *)(intptr_t)kc[l] + pos[l] * kw, knew + l * ldkv, (size_t)kw * sizeof(float));
        memcpy((float *)(intptr_t)vc[l] + pos[l] * kw, vnew + l * ldkv, (size_t)kw * sizeof(float));
        maxlen = pos[l] + 1 > maxlen ? pos[l] + 1 : maxlen;
        work += pos[l] + 1;
    }
    if (threads < 1) threads = 1;
    if (threads > POOL_MAX) threads = POOL_MAX;
    /* One lane's heads are split too: right after the QKV GEMM the workers are still polling, and a SmolLM2 step
     * at positions 40-100 took 3-4 % less than with one lane's attention on the calling thread (2^18 here). */
    if (work * heads * hd < (1 << 14)) threads = 1;
    attend_job a = {heads, hd, kw, heads / kv_heads, ldq, maxlen + 8, q, kc, vc, pos, out, NULL,
                    1.0f / sqrtf((float)hd)};
    a.work = scratch_alloc((size_t)(threads * a.scratch) * sizeof(float));
    if (a.work == NULL) return -1;
    pool_run(attend_chunk, &a, n * heads, threads);
    free(a.work);
    return 0;
}

int calctl_attend_decode(int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const float *q, const float *knew,
                         const float *vnew, const int64_t *kc, const int64_t *vc, const int64_t *pos, float *out,
                         int threads) {
    return attend(n, heads, kv_heads, hd, q, heads * hd, knew, vnew, kv_heads * hd, kc, vc, pos, out, threads);
}

/* out[d] = x[d] / sqrt(mean(x^2) + eps) * w[d] */
static void rms_row(const float *x, const float *w, int64_t d, float eps, float *out) {
    float ss = dot(x, x, d);
    float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int64_t i = 0; i < d; i++) out[i] = x[i] * inv * w[i];
}

/* Rotate `heads` heads of hd values at x by the position's cos/sin [hd/2]. */
static void rope_row(float *x, int64_t heads, int64_t hd, const float *cs, const float *sn, int half_style) {
    int64_t half = hd / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *v = x + h * hd;
        for (int64_t i = 0; i < half; i++) {
            int64_t ia = half_style ? i : 2 * i, ib = half_style ? i + half : 2 * i + 1;
            float a = v[ia], b = v[ib];
            v[ia] = a * cs[i] - b * sn[i];
            v[ib] = a * sn[i] + b * cs[i];
        }
    }
}

/* One decoder layer of one decode step for n lanes (what calctl.model.decoder.decode_batch computes per layer):
 *
 *   a = rms(x) ; qkv = a W_qkv (+ b_qkv) ; q/k heads rms-normed (qk_norm) then rotated ; attention over each lane's
 *   cache (its new K/V written at its position) ; x += attn W_o ; m = rms(x) ; [g u] = m W_gate_up ;
 *   x += (g * sigmoid(g) * u) W_down
 *
 * x [n, d_model] is updated in place; cos/sin [n, hd/2]; kc/vc/pos as calctl_attend_decode. The weight matrices are
 * (dtype, stored rows) pairs for calctl_wgemm. Returns 0, or -1 for a refused shape or an allocation failure. */
typedef struct {
    int64_t d_model, heads, kv_heads, hd, d_ff;
    float eps;
    int32_t half_style;
    const float *attn_norm, *bqkv, *q_norm, *k_norm, *mlp_norm; /* bqkv, q_norm, k_norm may be NULL */
    int32_t qkv_dtype, wo_dtype, gu_dtype, down_dtype;
    const uint8_t *wqkv, *wo, *w_gate_up, *w_down;
} calctl_layer;

int calctl_decode_layer(const calctl_layer *L, int64_t n, float *x, const float *cos, const float *sin,
                        const int64_t *kc, const int64_t *vc, const int64_t *pos, int threads) {
    int64_t d = L->d_model, hd = L->hd, qw = L->heads * hd, kw = L->kv_heads * hd, rows = qw + 2 * kw, ff = L->d_ff;
    if (n < 1 || d < 1 || hd < 2 || hd % 2 || L->heads % L->kv_heads) return -1;
    /* each buffer on 64-byte lines, so the GEMMs read their rows without copying them (when d, rows, qw and 2 ff
     * are multiples of 16, as in most models) */
    int64_t na = (n * d + 15) / 16 * 16, nq = (n * rows + 15) / 16 * 16, nt = (n * qw + 15) / 16 * 16;
    float *buf = scratch_alloc((size_t)(na + nq + nt + (n * 2 * ff + 15) / 16 * 16) * sizeof(float));
    if (buf == NULL) return -1;
    float *a = buf, *qkv = a + na, *att = qkv + nq, *gu = att + nt;
    int rc = 0;
    for (int64_t t = 0; t < n; t++) rms_row(x + t * d, L->attn_norm, d, L->eps, a + t * d);
    rc |= calctl_wgemm(L->qkv_dtype, L->wqkv, rows, d, a, d, n, qkv, rows, threads);
    for (int64_t t = 0; t < n && rc == 0; t++) {
        float *r = qkv + t * rows;
        if (L->bqkv)
            for (int64_t i = 0; i < rows; i++) r[i] += L->bqkv[i];
        if (L->q_norm && L->k_norm) {
            for (int64_t h = 0; h < L->heads; h++) rms_row(r + h * hd, L->q_norm, hd, L->eps, r + h * hd);
            for (int64_t h = 0; h < L->kv_heads; h++) rms_row(r + qw + h * hd, L->k_norm, hd, L->eps, r + qw + h * hd);
        }
        rope_row(r, L->heads + L->kv_heads, hd, cos + t * (hd / 2), sin + t * (hd / 2), L->half_style);
    }
    if (rc == 0) rc = attend(n, L->heads, L->kv_heads, hd, qkv, rows, qkv + qw, qkv + qw + kw, rows, kc, vc, pos, att,
                             threads);
    if (rc == 0) rc = calctl_wgemm(L->wo_dtype, L->wo, d, qw, att, qw, n, a, d, threads);
    if (rc == 0) {
        for (int64_t i = 0; i < n * d; i++) x[i] += a[i];
        for (int64_t t = 0; t < n; t++) rms_row(x + t * d, L->mlp_norm, d, L->eps, a + t * d);
        rc = calctl_wgemm(L->gu_dtype, L->w_gate_up, 2 * ff, d, a, d, n, gu, 2 * ff, threads);
    }
    if (rc == 0) {
        for (int64_t t = 0; t < n; t++) { /* h = g / (1 + exp(-g)) * u, written over g */
            float *g = gu + t * 2 * ff, *u = g + ff;
            int64_t i = 0;
            for (; i + 8 <= ff; i += 8) {
                __m256 gv = _mm256_loadu_ps(g + i);
                __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
                __m256 h = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
                _mm256_storeu_ps(g + i, _mm256_mul_ps(h, _mm256_loadu_ps(u + i)));
            }
            for (; i < ff; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        }
        rc = calctl_wgemm(L->down_dtype, L->w_down, d, ff, gu, 2 * ff, n, a, d, threads);
    }
    if (rc == 0)
        for (int64_t i = 0; i < n * d; i++) x[i] += a[i];
    free(buf);
    return rc;
}

/* Every layer of a decode step in one call (the Python caller holds the GIL once per step, not once per layer):
 * layer i of lane t reads and writes its K/V cache rows at kbase[t] + i * kstride[t] (V likewise). */
int calctl_decode_layers(const calctl_layer *L, int64_t layers, int64_t n, float *x, const float *cos,
                         const float *sin, const int64_t *kbase, const int64_t *kstride, const int64_t *vbase,
                         const int64_t *vstride, const int64_t *pos, int threads) {
    if (n < 1 || layers < 0) return -1;
    int64_t *rows = malloc((size_t)(2 * n) * sizeof(int64_t));
    if (rows == NULL) return -1;
    int rc = 0;
    for (int64_t i = 0; i < layers && rc == 0; i++) {
        for (int64_t t = 0; t < n; t++) {
            rows[t] = kbase[t] + i * kstride[t];
            rows[n + t] = vbase[t] + i * vstride[t];
        }
        rc = calctl_decode_layer(L + i, n, x, cos, sin, rows, rows + n, pos, threads);
    }
    free(rows);
    return rc;
}
