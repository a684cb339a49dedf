/* Half-precision weight GEMV for the mock's decoder: y = W x with W fp16 [rows, cols] row-major, x and y fp32.
 *
 * Decode on the mock is memory-bound: every token reads every weight once. Reading the package's fp16 weights as
 * they are stored (instead of a float32 copy) halves the bytes per token. Two rows at a time, sixteen columns per
 * step with two fp32 FMA accumulators per row, and a software prefetch two rows ahead (measured ~1.4x faster than
 * four rows with one accumulator each on the 2-core reference machine). Built at first use by calctl.model.native
 * with the system C compiler (-O3 -march=native); it needs F16C, FMA and AVX2 and refuses to build without them,
 * in which case the decoder keeps using numpy. No threads: the mock runs one compute thread per chip.
 */
#include <immintrin.h>
#include <stdint.h>

#if !defined(__F16C__) || !defined(__FMA__) || !defined(__AVX2__)
#error "calctl gemv_f16 needs F16C, FMA and AVX2"
#endif

static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    return _mm_cvtss_f32(lo);
}

static inline __m256 load8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

int calctl_gemv_f16(const uint16_t *W, const float *x, float *y, int64_t rows, int64_t cols) {
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const uint16_t *w0 = W + r * cols, *w1 = w0 + cols;
        __m256 a0 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps();
        __m256 a1 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
        int64_t c = 0;
        for (; c + 16 <= cols; c += 16) {
            _mm_prefetch((const char *)(w0 + c + 2 * cols), _MM_HINT_T0);
            _mm_prefetch((const char *)(w1 + c + 2 * cols), _MM_HINT_T0);
            __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
            a0 = _mm256_fmadd_ps(load8(w0 + c), x0, a0);
            b0 = _mm256_fmadd_ps(load8(w0 + c + 8), x1, b0);
            a1 = _mm256_fmadd_ps(load8(w1 + c), x0, a1);
            b1 = _mm256_fmadd_ps(load8(w1 + c + 8), x1, b1);
        }
        float s0 = hsum256(_mm256_add_ps(a0, b0)), s1 = hsum256(_mm256_add_ps(a1, b1));
        for (; c < cols; c++) {
            s0 += _cvtsh_ss(w0[c]) * x[c];
            s1 += _cvtsh_ss(w1[c]) * x[c];
        }
        y[r] = s0;
        y[r + 1] = s1;
    }
    for (; r < rows; r++) {
        float s = 0.0f;
        for (int64_t c = 0; c < cols; c++) s += _cvtsh_ss(W[r * cols + c]) * x[c];
        y[r] = s;
    }
    return 0;
}
