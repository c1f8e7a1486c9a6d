/* The kernels of hfadapt.spyre.dl16_native, built with the system C compiler on first use
   (hfadapt.spyre.native_build; the kernels it exports are declared once, in the exports block
   below).

   hfadapt_round_dl16: what dl16._round_inplace computes, bit for bit (checked on all 2^32
   float32 patterns, NaN for NaN: benchmarks/check_dl16_exhaustive.py), by integer steps: with a transfer, +-inf becomes +-host_inf;
   the bits are rounded to nearest even at DL16's mantissa (add half of the dropped field less
   one, plus the lowest kept bit, then clear the field: a carry moves into the exponent, as the
   FPU's rounding does); |y| <= the largest float below the smallest normal becomes +0; a |y|
   past the largest finite value becomes ``over`` (the profile's overflow value: NaN, the
   card's 0x7FFF code, or +-inf) with y's sign; a NaN stays itself. The torch path's clamp and
   magic addend keep +-inf out of float arithmetic; integer steps need neither.
   hfadapt_sum_truncated: kernels.chunked_matmul's accumulation (kernels.truncate_partial_ on
   each of ``pieces`` fp32 partial products, then their sum in order) in one pass;
   hfadapt_sum_truncated_round: the same, then an optional bias over the last dimension, then
   the DL16 rounding, in one pass (a device linear's epilogue).
   hfadapt_accumulate_truncated: one step of the same sum made a group of pieces at a time, so
   that only a group of partial products is held: ``acc`` becomes the group's sum (``first``)
   or ``acc`` plus each of its truncated pieces in order; the bias and the rounding follow
   when given, on the last group. Steps in order give hfadapt_sum_truncated_round's bits.
   hfadapt_layer_norm_dl16: kernels._layer_norm_dl16 over rows of ``cols`` values, one pass per
   row (layer_norm_row below says how), with each row's mean and rstd written out.
   hfadapt_softmax_floor: kernels._softmax_floor over the last dimension of ``rows`` rows of
   ``cols`` values, a block of rows at a time (it stays in the cache): the row max (NaN wins),
   exp(max(x - max, -87)) (a polynomial exp, within 2 ulp of fp32 exp on [-87, 0]: far below
   the DL16 rounding that follows), keys at or below -``code`` raised to ``floor`` when
   ``floor`` > 0, divided by their sum; each row's max is written to ``top``; then, when
   ``maxf`` > 0, the block's probabilities rounded to DL16 while they are in the cache. */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
/* Flush-to-zero for the softmax's division only: a masked key's probability, exp(-87) / sum,
   is an fp32 subnormal, and each subnormal result costs the FPU a microcode assist (a batch
   whose keys are one quarter padding ran 4.7x slower). With FTZ such a result is +0: the DL16
   rounding that follows makes every value below DL16's smallest normal +0 anyway, and an fp32
   result moves by less than 2^-126. No other result changes (FTZ acts on subnormal results
   only). The caller's mode is restored. */
#define FTZ_BEGIN unsigned int saved_csr_ = _mm_getcsr(); _mm_setcsr(saved_csr_ | 0x8000u);
#define FTZ_END _mm_setcsr(saved_csr_);
#else
#define FTZ_BEGIN
#define FTZ_END
#endif
/* AVX-512 and AVX2 builds of each kernel beside the baseline one, chosen when the library
   loads (GCC's function multiversioning): sixteen or eight floats a step where the CPU has
   them, never an illegal instruction where it does not. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif
/* Argument checks. Each exported kernel checks its sizes, shift amounts and codes before it
   touches memory, and returns 0, or the 1-based position of the first argument it refuses
   (hfadapt_amx_pack: its negative, beside its count of values that do not split): a bad
   argument becomes an error in Python (hfadapt.spyre.dl16_native's wrappers check first and
   name it), never a shift by a negative or too large amount (undefined: a 23-bit
   ``partial_mantissa_bits`` made every sum change sign), a division by zero or a loop
   that does not end. Each check runs once a call, not per value. */
#define CHECK(ok, position)                                                                  \
    do {                                                                                     \
        if (!(ok)) return (position);                                                        \
    } while (0)
/* a truncation or rounding that drops ``dropped`` of float32's 23 mantissa bits: at least one
   (half = 1 << (dropped - 1)) and not past the mantissa */
#define SHIFT_OK(dropped) ((dropped) >= 1 && (dropped) <= 23)
/* the rounding arguments (maxf, lam, rdrop, over) at ``at``: maxf 0 says "no rounding" where
   the kernel allows it (``required`` 0), else a finite maxf > 0, 0 <= lam < maxf, a valid
   shift */
#define CHECK_ROUNDING(maxf, lam, rdrop, at, required)                                       \
    do {                                                                                     \
        CHECK((maxf) >= 0.0f && (maxf) <= FLT_MAX && (!(required) || (maxf) > 0.0f), (at));  \
        CHECK((maxf) == 0.0f || ((lam) >= 0.0f && (lam) < (maxf)), (at) + 1);                \
        CHECK((maxf) == 0.0f || SHIFT_OK(rdrop), (at) + 2);                                  \
    } while (0)

/* The row programs' description (hfadapt_row_program), declared once: hfadapt.spyre.dl16_native
   declares the same layout as ctypes structures, and tests/spyre/test_native_binding.py reads
   this block and compares names, order, types and offsets. How an operand broadcasts against
   a row of its node's result: the same values (BINARY_FULL), a row vector over the last
   dimension (BINARY_COLUMN), one value per row (BINARY_ROW), one value (BINARY_SCALAR), or
   row ``rows_at[r]`` of the tensor for row r (PROGRAM_GATHER, ``rows_at`` the input of index
   ``at``); the ops: IEEE fp32 add, sub, mul and div (what torch's CPU kernels compute for
   float32: add and sub with alpha 1 are one rounded step, no reciprocal for div) and a sum
   over the last dimension; where an operand comes from: an input tensor, an earlier node, a
   number. */
/* begin row program ABI */
enum { BINARY_FULL = 0, BINARY_COLUMN = 1, BINARY_ROW = 2, BINARY_SCALAR = 3, PROGRAM_GATHER = 4 };
enum { OP_ADD = 0, OP_SUB = 1, OP_MUL = 2, OP_DIV = 3, OP_SUM = 4 };
enum { FROM_INPUT = 0, FROM_NODE = 1, FROM_NUMBER = 2 };
typedef struct {
    int64_t source; /* FROM_INPUT, FROM_NODE or FROM_NUMBER */
    int64_t kind;   /* BINARY_* or PROGRAM_GATHER */
    int64_t index;  /* of the input, node or number */
    int64_t at;     /* PROGRAM_GATHER: the input of the row numbers */
} row_operand;
typedef struct {
    int64_t op;         /* OP_* */
    int64_t kind;       /* the result: BINARY_FULL (a row) or BINARY_ROW (a value per row) */
    int64_t computed;   /* 0: nothing reads it, skipped */
    row_operand operand[2]; /* one for a sum, two for a binary op */
} row_node;
/* end row program ABI */

/* The kernels this library exports, declared once. hfadapt.spyre.dl16_native makes its ctypes
   bindings from this block (each parameter's type and name, in order); the compiler checks
   every definition below against its declaration here, and the build's
   -Werror=missing-prototypes refuses an exported function that is not declared here. Each
   returns 0, or the 1-based position of the first argument it refuses (hfadapt_amx_pack: its
   negative, else its count of values that do not split; hfadapt_amx_ready: 1 or 0). */
/* begin exports */
int hfadapt_round_dl16(float* x, int64_t n, float maxf, float lam, int32_t dropped, float over,
                       float host_inf, int threads);
int hfadapt_sum_truncated(const float* parts, int64_t pieces, int64_t n, int32_t dropped,
                          float* out, int threads);
int hfadapt_sum_truncated_round(const float* parts, int64_t pieces, int64_t n, int32_t dropped,
                                const float* bias, int64_t cols, float maxf, float lam,
                                int32_t rdrop, float over, float* out, int threads);
int hfadapt_accumulate_truncated(float* acc, const float* parts, int64_t pieces, int64_t n,
                                 int32_t dropped, int first, const float* bias, int64_t cols,
                                 float maxf, float lam, int32_t rdrop, float over, int threads);
int hfadapt_layer_norm_dl16(const float* x, int64_t rows, int64_t cols, const float* weight,
                            const float* bias, float eps, float maxf, float lam, int32_t rdrop,
                            float over, float* out, float* mean, float* rstd, int threads);
int hfadapt_aten_sum(const float* x, int64_t rows, int64_t cols, int lanes, float* out);
int hfadapt_row_program(int64_t rows, int64_t cols, int64_t nodes, const row_node* desc,
                        const int64_t* inputs, const float* numbers, const int64_t* outs,
                        int lanes, float maxf, float lam, int32_t rdrop, float over,
                        int threads);
int hfadapt_softmax_floor(const float* x, float* out, float* top, int64_t rows, int64_t cols,
                          float floor, float code, float maxf, float lam, int32_t rdrop,
                          float over, int threads);
int hfadapt_amx_ready(void);
int64_t hfadapt_amx_pack(const float* x, int64_t rows, int64_t depth, int64_t si, int64_t sk,
                         int role, int64_t rows_p, int64_t depth_p, uint16_t* out, int threads);
int hfadapt_amx_matmul(const uint16_t* ap, const uint16_t* bp, int64_t m, int64_t n,
                       int64_t depth_p, int64_t piece, int32_t dropped, const float* bias,
                       float maxf, float lam, int32_t rdrop, float over, float* out,
                       int threads);
/* end exports */

static inline float round_one(float v, float maxf, float lam, int32_t dropped, float over,
                              float host_inf) {
    const float inf = __builtin_inff();
    if (host_inf > 0.0f && (v == inf || v == -inf)) v = v > 0.0f ? host_inf : -host_inf;
    const uint32_t half = (1u << (dropped - 1)) - 1u, keep = ~((1u << dropped) - 1u);
    uint32_t b;
    memcpy(&b, &v, 4);
    const uint32_t r = (b + half + ((b >> dropped) & 1u)) & keep;
    const uint32_t mag = r & 0x7FFFFFFFu;
    uint32_t ob;
    memcpy(&ob, &over, 4);
    ob = (ob & 0x7FFFFFFFu) | (r & 0x80000000u);
    float y, a, signed_over;
    memcpy(&y, &r, 4);
    memcpy(&a, &mag, 4);
    memcpy(&signed_over, &ob, 4);
    y = a <= lam ? 0.0f : y;
    y = a > maxf ? signed_over : y;
    return v != v ? v : y;
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
   this row starts at row + p * n), added to what `out` holds when `accumulate`, then the
   bias, then (when `maxf` > 0) the DL16 rounding. */
static inline void row_epilogue(const float* restrict row, int64_t pieces, int64_t n,
                                int64_t cols, int accumulate, uint32_t half, uint32_t keep,
                                const float* restrict bias, float maxf, float lam, int32_t rdrop,
                                float over, float* restrict out) {
    if (accumulate)
        for (int64_t c = 0; c < cols; c++) out[c] = out[c] + truncated(row[c], half, keep);
    else
        for (int64_t c = 0; c < cols; c++) out[c] = truncated(row[c], half, keep);
    for (int64_t p = 1; p < pieces; p++) {
        const float* restrict piece = row + p * n;
        for (int64_t c = 0; c < cols; c++) out[c] = out[c] + truncated(piece[c], half, keep);
    }
    if (bias)
        for (int64_t c = 0; c < cols; c++) out[c] = out[c] + bias[c];
    if (maxf > 0.0f)
        for (int64_t c = 0; c < cols; c++)
            out[c] = round_one(out[c], maxf, lam, rdrop, over, 0.0f);
}

CLONES int hfadapt_round_dl16(float* x, int64_t n, float maxf, float lam, int32_t dropped,
                              float over, float host_inf, int threads) {
    CHECK(x != NULL || n == 0, 1);
    CHECK(n >= 0, 2);
    CHECK_ROUNDING(maxf, lam, dropped, 3, 1);
    CHECK(host_inf >= 0.0f && host_inf <= FLT_MAX, 7);
    CHECK(threads >= 1, 8);
    #pragma omp parallel for schedule(static) num_threads(threads) if(n > 32768)
    for (int64_t i = 0; i < n; i++) x[i] = round_one(x[i], maxf, lam, dropped, over, host_inf);
    return 0;
}

/* DL16 rounding of a span the caller has just written (it is still in the cache); built for
   each target like the kernels, since the caller's own target does not reach it. */
CLONES static void round_span(float* x, int64_t n, float maxf, float lam, int32_t dropped, float over) {
    for (int64_t i = 0; i < n; i++) x[i] = round_one(x[i], maxf, lam, dropped, over, 0.0f);
}

CLONES int hfadapt_sum_truncated(const float* parts, int64_t pieces, int64_t n, int32_t dropped,
                                 float* out, int threads) {
    CHECK(parts != NULL || n == 0, 1);
    CHECK(pieces >= 1, 2);
    CHECK(n >= 0, 3);
    CHECK(SHIFT_OK(dropped), 4);
    CHECK(out != NULL || n == 0, 5);
    CHECK(threads >= 1, 6);
    const uint32_t half = 1u << (dropped - 1);
    const uint32_t keep = ~((1u << dropped) - 1u);
    const int64_t block = 4096;
    #pragma omp parallel for schedule(static) num_threads(threads) if(n > 32768)
    for (int64_t i = 0; i < n; i += block) {
        int64_t len = n - i < block ? n - i : block;
        row_epilogue(parts + i, pieces, n, len, 0, half, keep, 0, 0.0f, 0.0f, 1, 0.0f, out + i);
    }
    return 0;
}

CLONES int hfadapt_sum_truncated_round(const float* parts, int64_t pieces, int64_t n,
                                       int32_t dropped, const float* bias, int64_t cols,
                                       float maxf, float lam, int32_t rdrop, float over,
                                       float* out, int threads) {
    CHECK(parts != NULL || n == 0, 1);
    CHECK(pieces >= 1, 2);
    CHECK(n >= 0, 3);
    CHECK(SHIFT_OK(dropped), 4);
    CHECK(cols >= 1 && n % cols == 0, 6);
    CHECK_ROUNDING(maxf, lam, rdrop, 7, 0);
    CHECK(out != NULL || n == 0, 11);
    CHECK(threads >= 1, 12);
    const uint32_t half = 1u << (dropped - 1);
    const uint32_t keep = ~((1u << dropped) - 1u);
    const int64_t rows = n / cols;
    #pragma omp parallel for schedule(static) num_threads(threads) if(n > 32768)
    for (int64_t r = 0; r < rows; r++)
        row_epilogue(parts + r * cols, pieces, n, cols, 0, half, keep, bias, maxf, lam, rdrop,
                     over, out + r * cols);
    return 0;
}

CLONES int hfadapt_accumulate_truncated(float* acc, const float* parts, int64_t pieces,
                                        int64_t n, int32_t dropped, int first, const float* bias,
                                        int64_t cols, float maxf, float lam, int32_t rdrop,
                                        float over, int threads) {
    CHECK(acc != NULL || n == 0, 1);
    CHECK(parts != NULL || n == 0, 2);
    CHECK(pieces >= 1, 3);
    CHECK(n >= 0, 4);
    CHECK(SHIFT_OK(dropped), 5);
    CHECK(first == 0 || first == 1, 6);
    CHECK(cols >= 1 && n % cols == 0, 8);
    CHECK_ROUNDING(maxf, lam, rdrop, 9, 0);
    CHECK(threads >= 1, 13);
    const uint32_t half = 1u << (dropped - 1);
    const uint32_t keep = ~((1u << dropped) - 1u);
    const int64_t rows = n / cols;
    #pragma omp parallel for schedule(static) num_threads(threads) if(n > 32768)
    for (int64_t r = 0; r < rows; r++)
        row_epilogue(parts + r * cols, pieces, n, cols, !first, half, keep, bias, maxf, lam,
                     rdrop, over, acc + r * cols);
    return 0;
}

typedef float v8f __attribute__((vector_size(32)));
typedef double v8d __attribute__((vector_size(64)));

/* One LayerNorm row of `cols` values with the statistics kept in DL16 (kernels._layer_norm_dl16):
   mean and mean of squares summed in double (both exact to far below fp32's last bit, so
   the order of the sum does not matter), taken to fp32 and rounded to DL16; the variance as
   E[x^2] - E[x]^2 with each step rounded; rstd = 1 / sqrt(var + eps) rounded; then
   ((x - mean) * rstd * weight + bias) in fp32 steps, rounded. */
static inline void layer_norm_row(const float* restrict x, int64_t cols,
                                  const float* restrict weight, const float* restrict bias,
                                  float eps, float maxf, float lam, int32_t rdrop, float over,
                                  float* restrict out, float* restrict mean_out,
                                  float* restrict rstd_out) {
    v8d lanes = {0}, lanes_sq = {0};
    const int64_t whole = cols & ~(int64_t)7;
    for (int64_t c = 0; c < whole; c += 8) {
        v8f f;
        memcpy(&f, x + c, sizeof f);
        const v8d v = __builtin_convertvector(f, v8d);
        lanes += v;
        lanes_sq += v * v;
    }
    double sum = 0.0, squares = 0.0;
    for (int j = 0; j < 8; j++) sum += lanes[j], squares += lanes_sq[j];
    for (int64_t c = whole; c < cols; c++) {
        const double v = (double)x[c];
        sum += v;
        squares += v * v;
    }
    const float mean = round_one((float)(sum / (double)cols), maxf, lam, rdrop, over, 0.0f);
    const float mean_sq = round_one((float)(squares / (double)cols), maxf, lam, rdrop, over, 0.0f);
    const float mm = round_one(mean * mean, maxf, lam, rdrop, over, 0.0f);
    const float var = round_one(mean_sq - mm, maxf, lam, rdrop, over, 0.0f);
    const float rstd = round_one(1.0f / __builtin_sqrtf(var + eps), maxf, lam, rdrop, over, 0.0f);
    for (int64_t c = 0; c < cols; c++) {
        float y = (x[c] - mean) * rstd;
        if (weight) y = y * weight[c];
        if (bias) y = y + bias[c];
        out[c] = y;
    }
    for (int64_t c = 0; c < cols; c++) out[c] = round_one(out[c], maxf, lam, rdrop, over, 0.0f);
    *mean_out = mean;
    *rstd_out = rstd;
}

CLONES int hfadapt_layer_norm_dl16(const float* x, int64_t rows, int64_t cols,
                                   const float* weight, const float* bias, float eps,
                                   float maxf, float lam, int32_t rdrop, float over, float* out,
                                   float* mean, float* rstd, int threads) {
    CHECK(x != NULL || rows == 0, 1);
    CHECK(rows >= 0, 2);
    CHECK(cols >= 1, 3);
    CHECK_ROUNDING(maxf, lam, rdrop, 7, 1);
    CHECK(out != NULL || rows == 0, 11);
    CHECK(mean != NULL || rows == 0, 12);
    CHECK(rstd != NULL || rows == 0, 13);
    CHECK(threads >= 1, 14);
    #pragma omp parallel for schedule(static) num_threads(threads) if(rows * cols > 32768)
    for (int64_t r = 0; r < rows; r++)
        layer_norm_row(x + r * cols, cols, weight, bias, eps, maxf, lam, rdrop, over,
                       out + r * cols, mean + r, rstd + r);
    return 0;
}

/* OP over a row's columns into ``o``, one loop per op (each vectorizes) */
#define BINARY_LOOPS(X, Y)                                                                   \
    switch (op) {                                                                           \
        case OP_ADD: for (int64_t c = 0; c < cols; c++) o[c] = (X) + (Y); break;           \
        case OP_SUB: for (int64_t c = 0; c < cols; c++) o[c] = (X) - (Y); break;           \
        case OP_MUL: for (int64_t c = 0; c < cols; c++) o[c] = (X) * (Y); break;           \
        default: for (int64_t c = 0; c < cols; c++) o[c] = (X) / (Y); break;               \
    }

/* A row program of the eager device (hfadapt.spyre.eager.fusion): a chain of binary ops and
   last-dimension sums over ``rows`` rows of ``cols`` values, run a row at a time so that the
   chain's intermediate values stay in the cache; each node's result rounded to DL16 as the op
   by op path rounds it. ``desc`` holds a row_node per node (the row program ABI above): its
   op, its result's kind (BINARY_FULL: a row of ``cols``; BINARY_ROW: one value per row),
   whether it is computed at all, then its operands (one for a sum, two for a binary op):
   where each comes from, how it broadcasts (PROGRAM_GATHER: e.g. a [batch, 1, queries, keys]
   mask beside [batch, heads, queries, keys] scores), its index and ``at``. ``outs[i]`` is
   where node i's result goes (a tensor of the result's size), or 0 (a node nothing reads
   after the program: kept in a scratch row).
   A sum adds in the order of ATen's CPU sum (aten_sum): the same fp32 result, so the same
   bits as torch's op followed by the rounding. */

static inline int64_t ceil_log2(int64_t x) {
    return x <= 2 ? 1 : 64 - __builtin_clzll((uint64_t)(x - 1));
}

/* ATen's row_sum (aten/src/ATen/native/cpu/SumKernel.cpp) over ``size`` units of W floats
   held as T (W = 1: scalars; else GCC vectors of W lanes, whose adds are lane by lane in fp32
   as ATen's vector adds are): four interleaved partial sums, each a cascade of four levels
   that adds blocks of 2^level_power units, then the tail units into the first, then the four
   in order. One text for every width (a loop over a runtime lane count stays scalar, 4x
   slower). */
#define DEFINE_ROW_SUM(NAME, T, W)                                                            \
    static inline void NAME(const float* restrict x, int64_t size, float* restrict out) {    \
        T acc[4][4], v;                                                                      \
        memset(acc, 0, sizeof acc);                                                          \
        const int64_t size_ilp = size / 4;                                                   \
        int64_t power = ceil_log2(size_ilp) / 4;                                             \
        power = power < 4 ? 4 : power;                                                       \
        const int64_t step = (int64_t)1 << power, mask = step - 1;                           \
        int64_t i = 0;                                                                       \
        for (; i + step <= size_ilp;) {                                                      \
            for (int64_t j = 0; j < step; ++j, ++i)                                          \
                for (int k = 0; k < 4; k++) {                                                \
                    memcpy(&v, x + (i * 4 + k) * W, sizeof v);                               \
                    acc[0][k] += v;                                                          \
                }                                                                            \
            for (int j = 1; j < 4; ++j) {                                                    \
                for (int k = 0; k < 4; k++) {                                                \
                    acc[j][k] += acc[j - 1][k];                                              \
                    memset(&acc[j - 1][k], 0, sizeof v);                                     \
                }                                                                            \
                if ((i & (mask << (j * power))) != 0) break;                                 \
            }                                                                                \
        }                                                                                    \
        for (; i < size_ilp; ++i)                                                            \
            for (int k = 0; k < 4; k++) {                                                    \
                memcpy(&v, x + (i * 4 + k) * W, sizeof v);                                   \
                acc[0][k] += v;                                                              \
            }                                                                                \
        for (int j = 1; j < 4; ++j)                                                          \
            for (int k = 0; k < 4; k++) acc[0][k] += acc[j][k];                              \
        for (int64_t t = size_ilp * 4; t < size; ++t) {                                      \
            memcpy(&v, x + t * W, sizeof v);                                                 \
            acc[0][0] += v;                                                                  \
        }                                                                                    \
        for (int k = 1; k < 4; k++) acc[0][0] += acc[0][k];                                  \
        memcpy(out, &acc[0][0], sizeof v);                                                   \
    }

typedef float v4f __attribute__((vector_size(16)));
typedef float v16f __attribute__((vector_size(64)));
DEFINE_ROW_SUM(row_sum_1, float, 1)
DEFINE_ROW_SUM(row_sum_4, v4f, 4)
DEFINE_ROW_SUM(row_sum_8, v8f, 8)
DEFINE_ROW_SUM(row_sum_16, v16f, 16)

/* ATen's CPU sum of ``n`` contiguous floats whose vectors have ``lanes`` (4, 8 or 16) lanes:
   vectorized_inner_sum from ``lanes`` values on, scalar_inner_sum below, added to the zero the
   output starts as */
static inline float aten_sum(const float* restrict x, int64_t n, int lanes) {
    float total = 0.0f;
    if (n >= lanes) {
        float part[16];
        const int64_t vecs = n / lanes;
        switch (lanes) {
            case 4: row_sum_4(x, vecs, part); break;
            case 16: row_sum_16(x, vecs, part); break;
            default: row_sum_8(x, vecs, part); break;
        }
        for (int64_t k = vecs * lanes; k < n; k++) total += x[k];
        for (int l = 0; l < lanes; l++) total += part[l];
    } else {
        row_sum_1(x, n, &total);
    }
    return 0.0f + total;
}

CLONES int hfadapt_aten_sum(const float* x, int64_t rows, int64_t cols, int lanes, float* out) {
    CHECK(x != NULL || rows == 0, 1);
    CHECK(rows >= 0, 2);
    CHECK(cols >= 0, 3);
    CHECK(lanes == 4 || lanes == 8 || lanes == 16, 4);
    CHECK(out != NULL || rows == 0, 5);
    for (int64_t r = 0; r < rows; r++) out[r] = aten_sum(x + r * cols, cols, lanes);
    return 0;
}

/* one operand of a node for row r: a row of values (returned) or one value (*v, NULL
   returned) */
static inline const float* program_operand(const row_operand* restrict f, int64_t r,
                                           int64_t cols, const int64_t* restrict inputs,
                                           const float* restrict numbers, float* const* rows_of,
                                           const float* restrict values, float* restrict v) {
    const int64_t from = f->source, kind = f->kind, index = f->index;
    if (from == FROM_NUMBER) {
        *v = numbers[index];
        return NULL;
    }
    if (from == FROM_NODE) {
        if (kind == BINARY_FULL) return rows_of[index];
        *v = values[index];
        return NULL;
    }
    const float* t = (const float*)(intptr_t)inputs[index];
    switch (kind) {
        case BINARY_FULL: return t + r * cols;
        case BINARY_COLUMN: return t;
        case BINARY_ROW: *v = t[r]; return NULL;
        case PROGRAM_GATHER: return t + ((const int64_t*)(intptr_t)inputs[f->at])[r] * cols;
        default: *v = t[0]; return NULL;
    }
}

/* Whether a row program's nodes are well formed: known ops and kinds, a node's operands read
   from earlier computed nodes of their own kind, a row where a row is read (a sum's operand;
   one operand of a binary op with a row result), inputs at addresses that are not null.
   1 when they are (the input and number indices the caller checks: it knows their count). */
static int program_ok(int64_t nodes, const row_node* desc, const int64_t* inputs) {
    for (int64_t i = 0; i < nodes; i++) {
        const row_node* d = desc + i;
        if (d->op < OP_ADD || d->op > OP_SUM || (d->kind != BINARY_FULL && d->kind != BINARY_ROW))
            return 0;
        if (!d->computed) continue;
        int rows_read = 0;
        for (int k = 0; k < (d->op == OP_SUM ? 1 : 2); k++) {
            const row_operand* f = &d->operand[k];
            const int64_t from = f->source, kind = f->kind, index = f->index;
            if (index < 0 || kind < BINARY_FULL || kind > PROGRAM_GATHER) return 0;
            if (from == FROM_NODE) {
                const row_node* node = desc + index;
                if (index >= i || !node->computed || node->kind != kind) return 0;
            } else if (from == FROM_INPUT) {
                if (!inputs[index] || (kind == PROGRAM_GATHER && (f->at < 0 || !inputs[f->at])))
                    return 0;
            } else if (from != FROM_NUMBER) {
                return 0;
            }
            rows_read += from != FROM_NUMBER &&
                         (kind == BINARY_FULL || kind == BINARY_COLUMN || kind == PROGRAM_GATHER);
        }
        if ((d->op == OP_SUM || d->kind == BINARY_FULL) && !rows_read) return 0;
    }
    return 1;
}

CLONES int hfadapt_row_program(int64_t rows, int64_t cols, int64_t nodes, const row_node* desc,
                               const int64_t* inputs, const float* numbers, const int64_t* outs,
                               int lanes, float maxf, float lam, int32_t rdrop, float over,
                               int threads) {
    CHECK(rows >= 0, 1);
    CHECK(cols >= 1, 2);
    CHECK(nodes >= 0, 3);
    CHECK(inputs != NULL, 5);
    CHECK(nodes == 0 || (desc != NULL && program_ok(nodes, desc, inputs)), 4);
    CHECK(numbers != NULL, 6);
    CHECK(outs != NULL || nodes == 0, 7);
    CHECK(lanes == 4 || lanes == 8 || lanes == 16, 8);
    CHECK_ROUNDING(maxf, lam, rdrop, 9, 1);
    CHECK(threads >= 1, 13);
    #pragma omp parallel num_threads(threads) if(rows * cols > 32768)
    {
        float* scratch = (float*)malloc(sizeof(float) * (size_t)(nodes * cols + nodes) + 64);
        float** rows_of = (float**)malloc(sizeof(float*) * (size_t)nodes + 8);
        float* values = scratch + nodes * cols;
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < nodes; i++) {
                const row_node* d = desc + i;
                if (!d->computed) continue;
                float* out = (float*)(intptr_t)outs[i];
                const float* x;
                float xs = 0.0f;
                x = program_operand(&d->operand[0], r, cols, inputs, numbers, rows_of, values, &xs);
                if (d->op == OP_SUM) {
                    const float s = round_one(aten_sum(x, cols, lanes), maxf, lam, rdrop, over, 0.0f);
                    values[i] = s;
                    if (out) out[r] = s;
                    continue;
                }
                const int op = (int)d->op;
                float ys = 0.0f;
                const float* y = program_operand(&d->operand[1], r, cols, inputs, numbers, rows_of, values, &ys);
                if (d->kind == BINARY_ROW) {
                    float s;
                    switch (op) {
                        case OP_ADD: s = xs + ys; break;
                        case OP_SUB: s = xs - ys; break;
                        case OP_MUL: s = xs * ys; break;
                        default: s = xs / ys; break;
                    }
                    s = round_one(s, maxf, lam, rdrop, over, 0.0f);
                    values[i] = s;
                    if (out) out[r] = s;
                    continue;
                }
                float* restrict o = out ? out + r * cols : scratch + i * cols;
                if (x && y) BINARY_LOOPS(x[c], y[c])
                else if (x) BINARY_LOOPS(x[c], ys)
                else BINARY_LOOPS(xs, y[c])
                /* the rounding in place while the row is in the cache, a loop of its own: fused
                   into the op's loop, GCC leaves the rounding's selects as branches */
                for (int64_t c = 0; c < cols; c++) o[c] = round_one(o[c], maxf, lam, rdrop, over, 0.0f);
                rows_of[i] = o;
            }
        }
        free(rows_of);
        free(scratch);
    }
    return 0;
}

/* The softmax's loops select between compared floats: without trapping math GCC makes those
   selects branch-free and vectorizes the loops (it changes no value: no reassociation, no
   contraction). Only here: the rounding kernels above run slower built that way. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif

/* exp(s) for s in [-87, 0] (and NaN): Cody-Waite reduction by ln 2, Cephes' expf polynomial,
   2^n by its bits. Branch-free, so a row's loop vectorizes. */
static inline float exp_neg(float s) {
    const float magic = 12582912.0f; /* 1.5 * 2^23: (t + magic) - magic rounds t to an integer */
    float t = s * 1.44269504088896341f;
    float n = (t + magic) - magic;
    n = n < -126.0f ? -126.0f : n;
    float r = s - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float e = p * (r * r) + r + 1.0f;
    int32_t k = (int32_t)n + 127;
    k = k < 1 ? 1 : k;
    uint32_t bits = (uint32_t)k << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return e * scale;
}

/* exp of a clamped shift ``s``, raised to ``floor`` (when > 0) for a key ``x`` at or below the
   -inf code */
static inline float floored_exp(float s, float x, float floor, float code) {
    const float e = exp_neg(s);
    return ((floor > 0.0f) & (x <= -code) & (e < floor)) ? floor : e;
}

typedef int32_t v16i __attribute__((vector_size(64)));

/* Rows are taken a block at a time (about SOFTMAX_BLOCK values, whole rows): each row's max
   (NaN wins: any NaN makes it NaN) and its clamped shift, then one flat loop makes the exps of
   the whole block (short rows, e.g. 29 keys, would leave most of a per-row loop in its scalar
   tail), then each row's sum (eight lanes) and division. */
#define SOFTMAX_BLOCK 4096

static inline void softmax_block(const float* restrict x, float* restrict o,
                                 float* restrict top, int64_t rows, int64_t cols, float floor,
                                 float code, const float* next, int64_t next_n) {
    const int64_t whole = cols & ~(int64_t)15;
    const int64_t whole8 = cols & ~(int64_t)7;
    for (int64_t r = 0; r < rows; r++) {
        const float* restrict in = x + r * cols;
        float* restrict row = o + r * cols;
        /* the max over 16 lanes and, beside it, whether any value is a NaN, as vector
           operations (GCC's vector extensions: a plain loop keeps them scalar, since without
           -ffinite-math-only the compiler may not reorder a max) */
        v16f m;
        v16i nan = {0};
        for (int j = 0; j < 16; j++) m[j] = -__builtin_inff();
        for (int64_t c = 0; c < whole; c += 16) {
            v16f v;
            memcpy(&v, in + c, sizeof v);
            const v16i greater = v > m;
            m = (v16f)(((v16i)v & greater) | ((v16i)m & ~greater));
            nan |= v != v;
        }
        float mx = -__builtin_inff();
        int32_t any = 0;
        for (int j = 0; j < 16; j++) mx = m[j] > mx ? m[j] : mx, any |= nan[j];
        for (int64_t c = whole; c < cols; c++) {
            float v = in[c];
            mx = v > mx ? v : mx;
            any |= (int32_t)(v != v);
        }
        if (any) mx = __builtin_nanf("");
        top[r] = mx;
        for (int64_t c = 0; c < cols; c++) {
            float s = in[c] - mx;
            row[c] = s < -87.0f ? -87.0f : s;
        }
    }
    const int64_t n = rows * cols;
    /* the next block's input is fetched while this one's exps are made (a cache line per 16
       values): its max loop then reads from the cache instead of waiting on memory */
    const int64_t whole_n = n & ~(int64_t)15;
    for (int64_t i0 = 0; i0 < whole_n; i0 += 16) {
        if (i0 < next_n) __builtin_prefetch(next + i0, 0, 3);
        for (int64_t i = i0; i < i0 + 16; i++) o[i] = floored_exp(o[i], x[i], floor, code);
    }
    for (int64_t i = whole_n; i < n; i++) o[i] = floored_exp(o[i], x[i], floor, code);
    for (int64_t r = 0; r < rows; r++) {
        float* restrict row = o + r * cols;
        float acc[8];
        for (int j = 0; j < 8; j++) acc[j] = 0.0f;
        for (int64_t c = 0; c < whole8; c += 8)
            for (int j = 0; j < 8; j++) acc[j] = acc[j] + row[c + j];
        float sum = acc[0];
        for (int j = 1; j < 8; j++) sum = sum + acc[j];
        for (int64_t c = whole8; c < cols; c++) sum = sum + row[c];
        for (int64_t c = 0; c < cols; c++) row[c] = row[c] / sum;
    }
}

CLONES int hfadapt_softmax_floor(const float* x, float* out, float* top, int64_t rows,
                                 int64_t cols, float floor, float code, float maxf, float lam,
                                 int32_t rdrop, float over, int threads) {
    CHECK(x != NULL || rows == 0, 1);
    CHECK(out != NULL || rows == 0, 2);
    CHECK(top != NULL || rows == 0, 3);
    CHECK(rows >= 0, 4);
    CHECK(cols >= 1, 5);
    CHECK(floor >= 0.0f && floor <= 1.0f, 6);
    CHECK(code >= 0.0f && code <= FLT_MAX, 7);
    CHECK_ROUNDING(maxf, lam, rdrop, 8, 0);
    CHECK(threads >= 1, 12);
    const int64_t per = cols >= SOFTMAX_BLOCK ? 1 : SOFTMAX_BLOCK / cols;
    #pragma omp parallel for schedule(static) num_threads(threads) if(rows * cols > 32768)
    for (int64_t r = 0; r < rows; r += per) {
        const int64_t count = rows - r < per ? rows - r : per;
        FTZ_BEGIN
        const int64_t ahead = rows - r - count < per ? rows - r - count : per;
        softmax_block(x + r * cols, out + r * cols, top + r, count, cols, floor, code,
                      x + (r + count) * cols, ahead * cols);
        FTZ_END
        if (maxf > 0.0f) round_span(out + r * cols, count * cols, maxf, lam, rdrop, over);
    }
    return 0;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

/* Products of DL16 operands on AMX's bf16 tiles (hfadapt.spyre.amx says when they are used).

   A DL16 value has at most 10 significant bits and an fp16 value 11, so each splits exactly
   into two bf16 values: hi, its top 16 bits, and lo = v - hi (at most 3 significant bits). A
   product a * b is then ah*bh + ah*bl + al*bh + al*bl, four products each exact in fp32, and
   a tile product (TDPBF16PS) adds them into an fp32 accumulator, in its own order and
   internal precision (the chunked product's contract, as MKL's order is on the fp32 path).

   hfadapt_amx_ready: 1 when the CPU has AMX's tiles and bf16 products and AVX-512, and the
   kernel grants this process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM), else 0.
   hfadapt_amx_pack: the split of an operand's values into tiles, zero padded to whole tiles:
   role 0, the left operand, [row block][k block][hi, lo][16 rows][32 k]; role 1, the right
   operand, [column block][k block][hi, lo][16 k pairs][16 columns][2] (the pairs' layout the
   tile product reads). Element (i, k) is x[i * si + k * sk], i a row (role 0) or a column
   (role 1). Returns how many values do not split exactly, are infinite or NaN (inf * 0 of a
   zero lo half would make a NaN), or lie outside [2^-40, 2^62] (the tiles treat bf16
   subnormals as zero, and flush subnormal sums: from 2^-40 on, every product of halves is a
   normal fp32 number): with any, the product must not be made here.
   hfadapt_amx_matmul: the chunked product of packed operands, a block of 32 x 32 outputs at a
   time: each ``piece`` of K (a multiple of 32) made in the tiles, its fp32 partials truncated
   (as ``truncated`` above) and added in order to the block's accumulator, then the bias and
   the DL16 rounding (when ``maxf`` > 0): row_epilogue's steps, without a pass through memory
   between the pieces. */
#if defined(__x86_64__) && defined(__GNUC__) && \
    ((!defined(__clang__) && __GNUC__ >= 11) || (defined(__clang__) && __clang_major__ >= 12))
#define HFADAPT_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

int hfadapt_amx_ready(void) {
#ifdef HFADAPT_AMX
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!((d >> 22) & 1u) || !((d >> 24) & 1u)) return 0; /* AMX-BF16, AMX-TILE */
    if (!((b >> 16) & 1u) || !((b >> 30) & 1u)) return 0; /* AVX512F, AVX512BW */
    /* ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: 0 once granted */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}

#ifdef HFADAPT_AMX
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw")))

/* split_bf16 for 16 values at once, as 32-bit lanes: hi's in the top half of *h (NaN as
   0x7FC0), lo's in the top half of *l; how many do not split */
AMX_TARGET static inline int split_16(__m512i u, __m512i* h, __m512i* l) {
    const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    const __m512i top = _mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000u));
    const __m512i ru = _mm512_castps_si512(
        _mm512_sub_ps(_mm512_castsi512_ps(u), _mm512_castsi512_ps(top)));
    const __mmask16 special = _mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32(0x7F800000));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7F800000));
    const __mmask16 inexact = _mm512_test_epi32_mask(ru, _mm512_set1_epi32(0xFFFF));
    const __mmask16 range = _mm512_test_epi32_mask(mag, mag) &
                            (_mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(0x2B800000)) |
                             _mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32(0x5E800000)));
    *h = _mm512_mask_mov_epi32(u, nan, _mm512_set1_epi32(0x7FC00000));
    *l = _mm512_maskz_mov_epi32((__mmask16)~special, ru);
    return __builtin_popcount((unsigned)(inexact | range | special));
}

/* the odd 16-bit words of two vectors: the top halves of their 32 lanes, in order */
static const uint16_t TOP_WORDS[32] __attribute__((aligned(64))) = {
    1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
    33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};

/* the 32 values of a line from ``k0`` (zero past ``depth``: masked loads, which read nothing
   past it) split into hi[0..32) and lo[0..32); how many do not split */
AMX_TARGET static inline int split_32(const float* line, int64_t k0, int64_t depth, uint16_t* hi,
                                      uint16_t* lo) {
    const int64_t n = depth - k0;
    const __mmask16 m0 = n >= 16 ? (__mmask16)0xFFFF : n > 0 ? (__mmask16)((1u << n) - 1u) : 0;
    const __mmask16 m1 = n >= 32   ? (__mmask16)0xFFFF
                         : n > 16 ? (__mmask16)((1u << (n - 16)) - 1u)
                                  : 0;
    __m512i h0, l0, h1, l1;
    int bad = split_16(_mm512_maskz_loadu_epi32(m0, line + k0), &h0, &l0);
    bad += split_16(_mm512_maskz_loadu_epi32(m1, line + k0 + 16), &h1, &l1);
    const __m512i top = _mm512_load_si512(TOP_WORDS);
    _mm512_storeu_si512(hi, _mm512_permutex2var_epi16(h0, top, h1));
    _mm512_storeu_si512(lo, _mm512_permutex2var_epi16(l0, top, l1));
    return bad;
}
#endif

/* v's two bf16 halves; 1 when they do not add up to v exactly, v is not finite, or it is out of
   the tiles' range */
static inline int split_bf16(float v, uint16_t* hi, uint16_t* lo) {
    uint32_t u, ru;
    memcpy(&u, &v, 4);
    const uint32_t mag = u & 0x7FFFFFFFu, top = u & 0xFFFF0000u;
    float h;
    memcpy(&h, &top, 4);
    const float r = v - h; /* exact: the low 16 bits of v's significand */
    memcpy(&ru, &r, 4);
    const int special = mag >= 0x7F800000u;
    const int nan = mag > 0x7F800000u;
    *hi = nan ? (uint16_t)0x7FC0u : (uint16_t)(u >> 16);
    *lo = special ? (uint16_t)0u : (uint16_t)(ru >> 16);
    const int range = mag != 0 && (mag < 0x2B800000u || mag >= 0x5E800000u); /* 2^-40, 2^62 */
    return special | ((ru & 0xFFFFu) != 0) | range;
}

#ifdef HFADAPT_AMX
/* the 32 values of k block ``kb`` of line ``i`` (a row of the left operand, a column of the
   right; contiguous, ``si`` apart) split into hi[0..32) and lo[0..32), zero past ``depth``
   and for a line past ``lines``; how many do not split */
AMX_TARGET static inline int64_t split_line(const float* x, int64_t i, int64_t lines,
                                            int64_t depth, int64_t si, int64_t kb,
                                            uint16_t* hi, uint16_t* lo) {
    if (i >= lines) {
        memset(hi, 0, 64);
        memset(lo, 0, 64);
        return 0;
    }
    return split_32(x + i * si, kb * 32, depth, hi, lo);
}

/* hfadapt_amx_pack's left operand from rows of contiguous values, a tile at a time (its 16
   rows of 32 values, written to 2 KiB in one place) */
AMX_TARGET static int64_t amx_pack_rows(const float* x, int64_t rows, int64_t depth, int64_t si,
                                        int64_t rows_p, int64_t depth_p, uint16_t* out, int threads) {
    const int64_t kbs = depth_p / 32;
    int64_t bad = 0;
    #pragma omp parallel for schedule(static) num_threads(threads) reduction(+:bad) if(rows * depth > 65536)
    for (int64_t b = 0; b < rows_p / 16; b++)
        for (int64_t kb = 0; kb < kbs; kb++) {
            uint16_t* tile = out + (b * kbs + kb) * 1024;
            for (int64_t r = 0; r < 16; r++)
                bad += split_line(x, b * 16 + r, rows, depth, si, kb, tile + r * 32, tile + 512 + r * 32);
        }
    return bad;
}

/* A tile of 16 lines' 32 values (``src``: 16 rows of 32 halves, 64-byte aligned) in the pairs'
   layout: row p of ``dst`` holds the values 2p and 2p + 1 of every line. As 32-bit units (a
   pair each) that is a 16 x 16 transpose, made in registers: units, then unit pairs, then
   128-bit lanes */
AMX_TARGET static inline void amx_pairs_transpose(const uint16_t* src, uint16_t* dst) {
    __m512i r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_load_si512(src + i * 32);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* r[4g + j], lane L: lines 4g..4g+3 of unit 4L + j */
    for (int g = 0; g < 16; g += 4) {
        r[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        r[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        r[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        r[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    for (int j = 0; j < 4; j++) {
        const __m512i v0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44);
        const __m512i v1 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xEE);
        const __m512i v2 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44);
        const __m512i v3 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xEE);
        _mm512_storeu_si512(dst + j * 32, _mm512_shuffle_i32x4(v0, v2, 0x88));
        _mm512_storeu_si512(dst + (4 + j) * 32, _mm512_shuffle_i32x4(v0, v2, 0xDD));
        _mm512_storeu_si512(dst + (8 + j) * 32, _mm512_shuffle_i32x4(v1, v3, 0x88));
        _mm512_storeu_si512(dst + (12 + j) * 32, _mm512_shuffle_i32x4(v1, v3, 0xDD));
    }
}

/* hfadapt_amx_pack's right operand from columns of contiguous values (a linear's weight
   rows), a tile at a time: its 16 columns' 32 values split into a [column][k] block in the
   cache, then turned into the pairs' layout (amx_pairs_transpose) */
AMX_TARGET static int64_t amx_pack_columns(const float* x, int64_t cols, int64_t depth,
                                           int64_t si, int64_t cols_p, int64_t depth_p,
                                           uint16_t* out, int threads) {
    const int64_t kbs = depth_p / 32;
    int64_t bad = 0;
    #pragma omp parallel for schedule(static) num_threads(threads) reduction(+:bad) if(cols * depth > 65536)
    for (int64_t b = 0; b < cols_p / 16; b++) {
        uint16_t hi[16 * 32] __attribute__((aligned(64)));
        uint16_t lo[16 * 32] __attribute__((aligned(64)));
        for (int64_t kb = 0; kb < kbs; kb++) {
            for (int64_t r = 0; r < 16; r++)
                bad += split_line(x, b * 16 + r, cols, depth, si, kb, hi + r * 32, lo + r * 32);
            uint16_t* tile = out + (b * kbs + kb) * 1024;
            amx_pairs_transpose(hi, tile);
            amx_pairs_transpose(lo, tile + 512);
        }
    }
    return bad;
}
#endif

CLONES int64_t hfadapt_amx_pack(const float* x, int64_t rows, int64_t depth, int64_t si,
                                int64_t sk, int role, int64_t rows_p, int64_t depth_p,
                                uint16_t* out, int threads) {
    CHECK(x != NULL || rows == 0 || depth == 0, -1);
    CHECK(rows >= 0, -2);
    CHECK(depth >= 0, -3);
    CHECK(si >= 0, -4);
    CHECK(sk >= 0, -5);
    CHECK(role == 0 || role == 1, -6);
    CHECK(rows_p >= rows && rows_p % 16 == 0, -7);
    CHECK(depth_p >= depth && depth_p % 32 == 0, -8);
    CHECK(out != NULL || rows_p == 0 || depth_p == 0, -9);
    CHECK(threads >= 1, -10);
    const int64_t kbs = depth_p / 32;
    int64_t bad = 0;
#ifdef HFADAPT_AMX
    if (role == 0 && sk == 1) return amx_pack_rows(x, rows, depth, si, rows_p, depth_p, out, threads);
    if (role == 1 && sk == 1) return amx_pack_columns(x, rows, depth, si, rows_p, depth_p, out, threads);
#endif
    #pragma omp parallel for schedule(static) num_threads(threads) reduction(+:bad) if(rows * depth > 65536)
    for (int64_t i = 0; i < rows_p; i++) {
        uint16_t* base = out + (i / 16) * kbs * 1024;
        const int64_t r = i % 16;
        for (int64_t kb = 0; kb < kbs; kb++) {
            uint16_t* tile = base + kb * 1024;
            for (int64_t q = 0; q < 32; q++) {
                const int64_t k = kb * 32 + q;
                const float v = i < rows && k < depth ? x[i * si + k * sk] : 0.0f;
                uint16_t hi, lo;
                bad += split_bf16(v, &hi, &lo);
                const int64_t at = role == 0 ? r * 32 + q : (q / 2) * 32 + r * 2 + (q & 1);
                tile[at] = hi;
                tile[at + 512] = lo;
            }
        }
    }
    return bad;
}

#ifdef HFADAPT_AMX
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* C tiles 0-3 += the four products of one k block's hi and lo tiles: the left tiles a0, a1
   (16 rows each), the right b0, b1 (16 columns each); 10 tile loads for 16 tile products */
#define AMX_K_BLOCK(a0, a1, b0, b1)                                                          \
    do {                                                                                     \
        _tile_loadd(4, (a0), 64); _tile_loadd(5, (a1), 64);                                  \
        _tile_loadd(6, (b0), 64); _tile_loadd(7, (b1), 64);                                  \
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);                                    \
        _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);                                    \
        _tile_loadd(6, (b0) + 512, 64); _tile_loadd(7, (b1) + 512, 64);                      \
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);                                    \
        _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);                                    \
        _tile_loadd(4, (a0) + 512, 64); _tile_loadd(5, (a1) + 512, 64);                      \
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);                                    \
        _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);                                    \
        _tile_loadd(6, (b0), 64); _tile_loadd(7, (b1), 64);                                  \
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);                                    \
        _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);                                    \
    } while (0)

/* acc (32 x 32) = part truncated (first), else acc + part truncated */
AMX_TARGET static inline void amx_accumulate(float* restrict acc, const float* restrict part,
                                             int first, uint32_t half, uint32_t keep) {
    const __m512i h = _mm512_set1_epi32((int)half), k = _mm512_set1_epi32((int)keep);
    for (int i = 0; i < 32 * 32; i += 16) {
        const __m512i b = _mm512_and_si512(_mm512_add_epi32(_mm512_load_si512(part + i), h), k);
        __m512 v = _mm512_castsi512_ps(b);
        if (!first) v = _mm512_add_ps(_mm512_load_ps(acc + i), v);
        _mm512_store_ps(acc + i, v);
    }
}
#endif

/* Rows of the left operand whose tiles stay in a core's L2 cache while they meet every
   column block */
#define AMX_ROWS_HELD 256

#ifdef HFADAPT_AMX
AMX_TARGET
#endif
int hfadapt_amx_matmul(const uint16_t* ap, const uint16_t* bp, int64_t m, int64_t n,
                       int64_t depth_p, int64_t piece, int32_t dropped, const float* bias,
                       float maxf, float lam, int32_t rdrop, float over, float* out, int threads) {
    CHECK(ap != NULL, 1);
    CHECK(bp != NULL, 2);
    CHECK(m >= 0, 3);
    CHECK(n >= 0, 4);
    CHECK(depth_p >= 32 && depth_p % 32 == 0, 5);
    CHECK(piece >= 32 && piece % 32 == 0, 6);
    CHECK(SHIFT_OK(dropped), 7);
    CHECK_ROUNDING(maxf, lam, rdrop, 9, 0);
    CHECK(out != NULL || m == 0 || n == 0, 13);
    CHECK(threads >= 1, 14);
#ifdef HFADAPT_AMX
    const int64_t mp = (m + 31) / 32 * 32, kbs = depth_p / 32, per = piece / 32;
    const int64_t held = (mp + AMX_ROWS_HELD - 1) / AMX_ROWS_HELD, cblocks = (n + 31) / 32;
    const uint32_t half = 1u << (dropped - 1), keep = ~((1u << dropped) - 1u);
    #pragma omp parallel num_threads(threads) if(m * n * depth_p > (1 << 22))
    {
        amx_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette = 1;
        for (int t = 0; t < 8; t++) {
            cfg.rows[t] = 16;
            cfg.colsb[t] = 64;
        }
        _tile_loadconfig(&cfg);
        float part[32 * 32] __attribute__((aligned(64)));
        float acc[32 * 32] __attribute__((aligned(64)));
        #pragma omp for collapse(2) schedule(static)
        for (int64_t s = 0; s < held; s++)
            for (int64_t cb = 0; cb < cblocks; cb++) {
                const int64_t n0 = cb * 32, last = (s + 1) * AMX_ROWS_HELD < mp ? (s + 1) * AMX_ROWS_HELD : mp;
                const uint16_t* b0 = bp + (n0 / 16) * kbs * 1024;
                const uint16_t* b1 = b0 + kbs * 1024;
                for (int64_t m0 = s * AMX_ROWS_HELD; m0 < last; m0 += 32) {
                    const uint16_t* a0 = ap + (m0 / 16) * kbs * 1024;
                    const uint16_t* a1 = a0 + kbs * 1024;
                    for (int64_t p = 0; p < kbs; p += per) {
                        const int64_t end = p + per < kbs ? p + per : kbs;
                        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                        for (int64_t kb = p; kb < end; kb++)
                            AMX_K_BLOCK(a0 + kb * 1024, a1 + kb * 1024, b0 + kb * 1024, b1 + kb * 1024);
                        _tile_stored(0, part, 128);
                        _tile_stored(1, part + 16, 128);
                        _tile_stored(2, part + 16 * 32, 128);
                        _tile_stored(3, part + 16 * 32 + 16, 128);
                        amx_accumulate(acc, part, p == 0, half, keep);
                    }
                    const int64_t rows = m - m0 < 32 ? m - m0 : 32, cols = n - n0 < 32 ? n - n0 : 32;
                    for (int64_t r = 0; r < rows; r++) {
                        float* restrict o = out + (m0 + r) * n + n0;
                        const float* restrict x = acc + r * 32;
                        for (int64_t c = 0; c < cols; c++) {
                            float v = bias ? x[c] + bias[n0 + c] : x[c];
                            o[c] = maxf > 0.0f ? round_one(v, maxf, lam, rdrop, over, 0.0f) : v;
                        }
                    }
                }
            }
        _tile_release();
    }
    return 0;
#else
    (void)bias; (void)over;
    return 1; /* no tiles in this build: hfadapt_amx_ready is 0 and nothing calls this */
#endif
}
