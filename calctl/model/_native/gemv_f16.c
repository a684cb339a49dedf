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
 * X and Y are fp32. Every weight is dequantised inside the kernel, in registers, and multiplied in fp32 with fp32
 * accumulation: the result is the dequantised matrix times X up to fp32 summation order. Nothing is quantised on
 * the activation side (llama.cpp rounds X to 8 bits for its integer dot products; this kernel does not, so it agrees
 * with the float reference to fp32 rounding).
 *
 * Batching: up to TILE (8) tokens share each dequantised block, one independent accumulator per token (eight FMA
 * chains in flight, what two FMA pipes with a 4-cycle latency need), so a batched decode step of 8 lanes dequantises
 * and reads every weight once, not once per lane. With AVX-512 (-march=native on a CPU that has it) a block is two
 * 16-float vectors and a q4 block is dequantised by two table permutes (the 16 values q*d+m of the block's scale
 * looked up by nibble); without it, four 8-float vectors. Rows are split over `threads` OpenMP threads.
 *
 * calctl_attend_decode is one decode step's attention for a batch of lanes, each over its own KV cache: it writes
 * the lane's new K/V row at its position and attends its query heads over positions 0..position (grouped-query
 * heads share their KV head), softmax in fp32 with a polynomial exp (about 1 ulp). Lanes and heads are split over
 * the threads.
 *
 * Built at first use by calctl.model.native with the system C compiler (-O3 -march=native -fopenmp); it needs F16C,
 * FMA and AVX2 and refuses to build without them, in which case the decoder keeps using numpy.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
#define ALWAYS_INLINE static inline __attribute__((always_inline))

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

/* One row against NT (1..TILE, a constant after inlining) tokens. Each token has two accumulators (the block's two
 * halves) and, for one or two tokens, two more for odd blocks: enough independent FMA chains to hide the latency. */
ALWAYS_INLINE void row_tile(int dtype, const uint8_t *row, int64_t cols, const float *X, int64_t ldx, int NT,
                            float *out) {
    int64_t vec = cols / QK * QK, c = 0;
    __m512 acc[TILE][4];
    for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = _mm512_setzero_ps();
    if (NT <= 2) {
        for (; c + 2 * QK <= vec; c += 2 * QK) {
            __m512 w[2], u[2];
            load32(dtype, row, c, w);
            load32(dtype, row, c + QK, u);
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
        load32(dtype, row, c, w);
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

/* Y[n, rows] (leading dimension ldy) = X[n, cols] (leading dimension ldx) times W[rows, cols]^T.
 * Returns 0, or -1 for a dtype/shape the kernel does not take (quantised cols must be a multiple of 32). */
int calctl_wgemm(int dtype, const uint8_t *W, int64_t rows, int64_t cols, const float *X, int64_t ldx, int64_t n,
                 float *Y, int64_t ldy, int threads) {
    int64_t rb = row_bytes(dtype, cols);
    if (rb < 0 || rows < 0 || cols < 0 || n < 0 || (dtype != DT_F16 && cols % QK)) return -1;
    if (threads < 1) threads = 1;
    /* Little work: stay on the calling thread. A fork/join costs a few microseconds on an idle machine and a
     * scheduler slice on a loaded one, so only large GEMMs (the LM head, prefill, batched lanes) are split. */
    if (rows * cols * (n < TILE ? n : TILE) < (1 << 21)) threads = 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        int64_t r1 = r0 + 16 < rows ? r0 + 16 : rows;
        for (int64_t t0 = 0; t0 < n; t0 += TILE) {
            int nt = (int)(n - t0 < TILE ? n - t0 : TILE);
            gemm_block(dtype, W, rb, r0, r1, cols, X + t0 * ldx, ldx, nt, Y + t0 * ldy, ldy);
        }
    }
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
static int attend(int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const float *q, int64_t ldq,
                  const float *knew, const float *vnew, int64_t ldkv, const int64_t *kc, const int64_t *vc,
                  const int64_t *pos, float *out, int threads) {
    if (n < 0 || heads < 1 || kv_heads < 1 || hd < 1 || heads % kv_heads) return -1;
    int64_t kw = kv_heads * hd, group = heads / kv_heads, maxlen = 0, work = 0;
    for (int64_t l = 0; l < n; l++) {
        if (pos[l] < 0) return -1;
        memcpy((float *)(intptr_t)kc[l] + pos[l] * kw, knew + l * ldkv, (size_t)kw * sizeof(float));
        memcpy((float *)(intptr_t)vc[l] + pos[l] * kw, vnew + l * ldkv, (size_t)kw * sizeof(float));
        maxlen = pos[l] + 1 > maxlen ? pos[l] + 1 : maxlen;
        work += pos[l] + 1;
    }
    if (threads < 1) threads = 1;
    if (work * heads * hd < (1 << 18)) threads = 1;
    const float scale = 1.0f / sqrtf((float)hd);
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *scores = malloc((size_t)(maxlen + 8) * sizeof(float));
        float *acc = malloc((size_t)hd * sizeof(float));
        if (scores == NULL || acc == NULL) {
#pragma omp atomic write
            failed = 1;
        } else {
#pragma omp for schedule(dynamic, 1)
            for (int64_t job = 0; job < n * heads; job++) {
                int64_t l = job / heads, h = job % heads, g = h / group, len = pos[l] + 1;
                const float *qh = q + l * ldq + h * hd;
                const float *K = (const float *)(intptr_t)kc[l] + g * hd, *V = (const float *)(intptr_t)vc[l] + g * hd;
                float mx = -INFINITY;
                for (int64_t j = 0; j < len; j++) {
                    float s = dot(qh, K + j * kw, hd) * scale;
                    scores[j] = s;
                    mx = s > mx ? s : mx;
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
                float inv = 1.0f / hsum256(vsum);
                for (int64_t d = 0; d < hd; d++) acc[d] = 0.0f;
                for (int64_t jj = 0; jj < len; jj++) {
                    const float *v = V + jj * kw;
                    float w = scores[jj];
                    for (int64_t d = 0; d < hd; d++) acc[d] += w * v[d];
                }
                float *o = out + l * heads * hd + h * hd;
                for (int64_t d = 0; d < hd; d++) o[d] = acc[d] * inv;
            }
        }
        free(scores);
        free(acc);
    }
    return failed ? -1 : 0;
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
    int64_t need = n * (d + rows + qw + 2 * ff);
    float *buf = malloc((size_t)need * sizeof(float));
    if (buf == NULL) return -1;
    float *a = buf, *qkv = a + n * d, *att = qkv + n * rows, *gu = att + n * qw;
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
