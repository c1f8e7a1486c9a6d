/* The kernels of hfadapt.spyre.dl16_native, built with the system C compiler on first use.

   hfadapt_round_dl16: the same steps as dl16._round_inplace: with a transfer, +-inf becomes
   +-host_inf; clamp to +-big (NaN passes); add and subtract a magic number of the value's sign and exponent shifted
   by the dropped mantissa bits (the FPU rounds to nearest even); zero |y| <= the largest float
   below the smallest normal; a rounded |y| past the largest finite value becomes ``over`` (the
   profile's overflow value: NaN, the card's 0x7FFF code, or +-inf) with the value's sign.
   hfadapt_sum_truncated: kernels.chunked_matmul's accumulation (kernels.truncate_partial_ on
   each of ``pieces`` fp32 partial products, then their sum in order) in one pass;
   hfadapt_sum_truncated_round: the same, then an optional bias over the last dimension, then
   the DL16 rounding, in one pass (a device linear's epilogue). */
#include <stdint.h>
#include <string.h>
/* An AVX2 build of each kernel beside the baseline one, chosen when the library loads (GCC's
   function multiversioning): eight floats a step where the CPU has them, never an illegal
   instruction where it does not. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif
static inline float round_one(float v, float maxf, float lam, int32_t shift, float big,
                              float over, float host_inf) {
    const float inf = __builtin_inff();
    if (host_inf > 0.0f && (v == inf || v == -inf)) v = v > 0.0f ? host_inf : -host_inf;
    v = v > big ? big : (v < -big ? -big : v);
    int32_t b;
    memcpy(&b, &v, 4);
    uint32_t mb = ((uint32_t)b & 0xFF800000u) + (uint32_t)shift;
    float m;
    memcpy(&m, &mb, 4);
    float y = (v + m) - m;
    y = (y >= -lam && y <= lam) ? 0.0f : y;
    return y > maxf ? over : (y < -maxf ? -over : y);
}

static inline float truncated(float x, uint32_t half, uint32_t keep) {
    uint32_t b;
    memcpy(&b, &x, 4);
    b = (b + half) & keep;
    float v;
    memcpy(&v, &b, 4);
    return v;
}

/* One row of `cols` values: the in-order sum of the pieces' truncated partials (piece p of
   this row starts at row + p * n), then the bias, then (when `maxf` > 0) the DL16 rounding. */
static inline void row_epilogue(const float* restrict row, int64_t pieces, int64_t n,
                                int64_t cols, uint32_t half, uint32_t keep,
                                const float* restrict bias, float maxf, float lam, int32_t shift,
                                float big, float over, float* restrict out) {
    for (int64_t c = 0; c < cols; c++) out[c] = truncated(row[c], half, keep);
    for (int64_t p = 1; p < pieces; p++) {
        const float* restrict piece = row + p * n;
        for (int64_t c = 0; c < cols; c++) out[c] = out[c] + truncated(piece[c], half, keep);
    }
    if (bias)
        for (int64_t c = 0; c < cols; c++) out[c] = out[c] + bias[c];
    if (maxf > 0.0f)
        for (int64_t c = 0; c < cols; c++)
            out[c] = round_one(out[c], maxf, lam, shift, big, over, 0.0f);
}

CLONES void hfadapt_round_dl16(float* x, int64_t n, float maxf, float lam, int32_t shift, float big,
                        float over, float host_inf, int nt) {
    #pragma omp parallel for schedule(static) num_threads(nt) if(n > 32768)
    for (int64_t i = 0; i < n; i++) x[i] = round_one(x[i], maxf, lam, shift, big, over, host_inf);
}

CLONES void hfadapt_sum_truncated(const float* parts, int64_t pieces, int64_t n, int32_t dropped,
                           float* out, int nt) {
    const uint32_t half = 1u << (dropped - 1);
    const uint32_t keep = ~((1u << dropped) - 1u);
    const int64_t block = 4096;
    #pragma omp parallel for schedule(static) num_threads(nt) if(n > 32768)
    for (int64_t i = 0; i < n; i += block) {
        int64_t len = n - i < block ? n - i : block;
        row_epilogue(parts + i, pieces, n, len, half, keep, 0, 0.0f, 0.0f, 0, 0.0f, 0.0f, out + i);
    }
}

CLONES void hfadapt_sum_truncated_round(const float* parts, int64_t pieces, int64_t n, int32_t dropped,
                                 const float* bias, int64_t cols, float maxf, float lam,
                                 int32_t shift, float big, float over, float* out, int nt) {
    const uint32_t half = 1u << (dropped - 1);
    const uint32_t keep = ~((1u << dropped) - 1u);
    const int64_t rows = n / cols;
    #pragma omp parallel for schedule(static) num_threads(nt) if(n > 32768)
    for (int64_t r = 0; r < rows; r++)
        row_epilogue(parts + r * cols, pieces, n, cols, half, keep, bias, maxf, lam, shift, big,
                     over, out + r * cols);
}
