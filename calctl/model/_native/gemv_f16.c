/* Weight GEMM/GEMV kernels for the mock's decoder, on the weights as the package stores them.
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
 * Decode is memory-bound: each token reads every weight once, so reading q4_1 (5 bits a weight) instead of fp16 reads
 * 3.2x fewer bytes. Up to four tokens share each dequantised block (prefill and batched decode lanes), so a batch
 * reads the weights once per four tokens, not once per token. Rows are split over `threads` OpenMP threads.
 *
 * Built at first use by calctl.model.native with the system C compiler (-O3 -march=native -fopenmp); it needs F16C,
 * FMA and AVX2 and refuses to build without them, in which case the decoder keeps using numpy.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#if !defined(__F16C__) || !defined(__FMA__) || !defined(__AVX2__)
#error "calctl gemv_f16 needs F16C, FMA and AVX2"
#endif

enum { DT_F16 = 0, DT_Q4_0 = 1, DT_Q4_1 = 2, DT_Q8_0 = 3 };
#define QK 32
#define TILE 4

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

/* 32 consecutive weights starting at block/column c of a row, as four vectors of eight floats. */
static inline void load32(int dtype, const uint8_t *row, int64_t c, __m256 w[4]) {
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

static inline float scalar_weight(int dtype, const uint8_t *row, int64_t c) {
    if (dtype == DT_F16) return h2f(row + 2 * c);
    int64_t b = c / QK, i = c % QK;
    if (dtype == DT_Q8_0) return (float)(int8_t)row[b * 34 + 2 + i] * h2f(row + b * 34);
    const uint8_t *blk = row + b * (dtype == DT_Q4_0 ? 18 : 20);
    const uint8_t *qs = blk + (dtype == DT_Q4_0 ? 2 : 4);
    int q = i < 16 ? (qs[i] & 0x0f) : (qs[i - 16] >> 4);
    return dtype == DT_Q4_0 ? (float)(q - 8) * h2f(blk) : (float)q * h2f(blk) + h2f(blk + 2);
}

/* One row against `nt` (1..TILE) tokens. */
static inline void row_tile(int dtype, const uint8_t *row, int64_t cols, const float *X, int64_t ldx, int nt, float *out) {
    int64_t vec = dtype == DT_F16 ? cols / QK * QK : cols;
    if (nt == 1) {
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
    for (int t = 0; t < TILE; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t c = 0; c < vec; c += QK) {
        __m256 w[4];
        load32(dtype, row, c, w);
        for (int t = 0; t < nt; t++) {
            const float *x = X + t * ldx + c;
            __m256 s = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
            s = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), s);
            s = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), s);
            acc[t] = _mm256_add_ps(acc[t], _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), s));
        }
    }
    for (int t = 0; t < nt; t++) {
        float s = hsum256(acc[t]);
        for (int64_t c = vec; c < cols; c++) s += scalar_weight(dtype, row, c) * X[t * ldx + c];
        out[t] = s;
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
    if (rows * cols * (n < TILE ? n : TILE) < (1 << 22)) threads = 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        int64_t r1 = r0 + 16 < rows ? r0 + 16 : rows;
        for (int64_t t0 = 0; t0 < n; t0 += TILE) {
            int nt = (int)(n - t0 < TILE ? n - t0 : TILE);
            for (int64_t r = r0; r < r1; r++) {
                float out[TILE];
                row_tile(dtype, W + r * rb, cols, X + t0 * ldx, ldx, nt, out);
                for (int t = 0; t < nt; t++) Y[(t0 + t) * ldy + r] = out[t];
            }
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
