/* dynquant.c - the range and quantize passes of dynamic quantization and QuantizeLinear (dynquant.h). */
#include "cpu/dynquant.h"

#include <math.h>

#include "cpu/gemm.h"
#include "cpu/vecmath.h"
#include "ops/contrib_quant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86 1
#endif

enum {
    CHUNK = 1 << 15,   /* values per parallel chunk */
    MAX_CHUNKS = 256,  /* range partials kept on the stack; larger inputs take longer chunks */
};

typedef enum level { LEVEL_C, LEVEL_AVX2, LEVEL_AVX512 } level;

/* kiln_gemm_level_detect reads the CPU's flags, once probed */
static level detect(void)
{
    kiln_gemm_level g = kiln_gemm_level_detect();
    return g == KILN_GEMM_LEVEL_AVX512 ? LEVEL_AVX512 : g == KILN_GEMM_LEVEL_AVX2 ? LEVEL_AVX2 : LEVEL_C;
}

/* ---- range: lo/hi start at 0; *nan set when some value is NaN ---- */

static void range_c(const float *x, int64_t n, float *lo, float *hi, bool *nan)
{
    float a = *lo, b = *hi;
    bool bad = false;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        bad |= v != v;
        a = v < a ? v : a;
        b = v > b ? v : b;
    }
    *lo = a, *hi = b, *nan = bad;
}

#if HAVE_X86
__attribute__((target("avx2"))) static void range_avx2(const float *x, int64_t n, float *lo, float *hi, bool *nan)
{
    __m256 a = _mm256_setzero_ps(), b = a, a1 = a, b1 = a, bad = a;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 v = _mm256_loadu_ps(x + i), w = _mm256_loadu_ps(x + i + 8);
        bad = _mm256_or_ps(bad, _mm256_or_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q), _mm256_cmp_ps(w, w, _CMP_UNORD_Q)));
        a = _mm256_min_ps(a, v), b = _mm256_max_ps(b, v);
        a1 = _mm256_min_ps(a1, w), b1 = _mm256_max_ps(b1, w);
    }
    float la[8], lb[8];
    _mm256_storeu_ps(la, _mm256_min_ps(a, a1));
    _mm256_storeu_ps(lb, _mm256_max_ps(b, b1));
    float ra = 0.0f, rb = 0.0f;
    bool tail_bad;
    range_c(x + i, n - i, &ra, &rb, &tail_bad);
    for (int k = 0; k < 8; k++) ra = la[k] < ra ? la[k] : ra, rb = lb[k] > rb ? lb[k] : rb;
    *lo = ra, *hi = rb, *nan = tail_bad || _mm256_movemask_ps(bad);
}

__attribute__((target("avx512f"))) static void range_avx512(const float *x, int64_t n, float *lo, float *hi,
                                                            bool *nan)
{
    __m512 a = _mm512_setzero_ps(), b = a, a1 = a, b1 = a;
    __mmask16 bad = 0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 v = _mm512_loadu_ps(x + i), w = _mm512_loadu_ps(x + i + 16);
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(w, w, _CMP_UNORD_Q);
        a = _mm512_min_ps(a, v), b = _mm512_max_ps(b, v);
        a1 = _mm512_min_ps(a1, w), b1 = _mm512_max_ps(b1, w);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i); /* zeros: in range already */
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        a = _mm512_min_ps(a, v), b = _mm512_max_ps(b, v);
    }
    *lo = _mm512_reduce_min_ps(_mm512_min_ps(a, a1));
    *hi = _mm512_reduce_max_ps(_mm512_max_ps(b, b1));
    *nan = bad != 0;
}
#endif

static void range_one(const float *x, int64_t n, float *lo, float *hi, bool *nan)
{
    *lo = *hi = 0.0f;
#if HAVE_X86
    switch (detect()) {
    case LEVEL_AVX512: range_avx512(x, n, lo, hi, nan); return;
    case LEVEL_AVX2: range_avx2(x, n, lo, hi, nan); return;
    default: break;
    }
#endif
    range_c(x, n, lo, hi, nan);
}

typedef struct range_job {
    const float *x;
    int64_t n, chunk;
    float lo[MAX_CHUNKS], hi[MAX_CHUNKS];
    bool nan[MAX_CHUNKS];
} range_job;

static void range_chunks(void *ctx, int64_t begin, int64_t end)
{
    range_job *j = ctx;
    for (int64_t c = begin; c < end; c++) {
        int64_t i = c * j->chunk, m = j->n - i < j->chunk ? j->n - i : j->chunk;
        range_one(j->x + i, m, &j->lo[c], &j->hi[c], &j->nan[c]);
    }
}

bool kiln_cpu_range_f32(kiln_threadpool *pool, const float *x, int64_t n, float *mn, float *mx)
{
    bool nan = false;
    if (n <= CHUNK || kiln_threadpool_size(pool) < 2) {
        range_one(x, n, mn, mx, &nan);
        return !nan;
    }
    range_job j = {.x = x, .n = n, .chunk = CHUNK};
    if ((n + j.chunk - 1) / j.chunk > MAX_CHUNKS) j.chunk = (n + MAX_CHUNKS - 1) / MAX_CHUNKS;
    int64_t chunks = (n + j.chunk - 1) / j.chunk;
    kiln_threadpool_parallel_for(pool, chunks, range_chunks, &j);
    float lo = 0.0f, hi = 0.0f;
    for (int64_t c = 0; c < chunks; c++) {
        nan |= j.nan[c];
        lo = j.lo[c] < lo ? j.lo[c] : lo;
        hi = j.hi[c] > hi ? j.hi[c] : hi;
    }
    *mn = lo, *mx = hi;
    return !nan;
}

/* ---- quantization: rint(x / scale) + zp, saturated; a division, as the reference ---- */

typedef struct quant_job {
    const float *x;
    int64_t n;
    float scale, zp, lo, hi; /* lo, hi: the output range */
    bool y_signed;
    uint8_t *y;
} quant_job;

static void quantize_c(const quant_job *j, int64_t i0, int64_t i1)
{
    for (int64_t i = i0; i < i1; i++) {
        float q = rintf(j->x[i] / j->scale) + j->zp;
        q = fminf(j->hi, fmaxf(j->lo, q));
        j->y[i] = j->y_signed ? (uint8_t)(int8_t)q : (uint8_t)q;
    }
}

#if HAVE_X86
__attribute__((target("avx2"))) static void quantize_avx2(const quant_job *j, int64_t i0, int64_t i1)
{
    const __m256 vs = _mm256_set1_ps(j->scale), vz = _mm256_set1_ps(j->zp), vlo = _mm256_set1_ps(j->lo),
                 vhi = _mm256_set1_ps(j->hi);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int64_t i = i0;
    for (; i + 32 <= i1; i += 32) {
        __m256i q[4];
        for (int k = 0; k < 4; k++) {
            __m256 v = _mm256_div_ps(_mm256_loadu_ps(j->x + i + 8 * k), vs);
            v = _mm256_add_ps(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
            q[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, vlo), vhi));
        }
        /* in range already, so the saturating packs are exact; in-lane packs interleave the
         * 128-bit halves and the permutation restores the order */
        __m256i w16a = _mm256_packs_epi32(q[0], q[1]), w16b = _mm256_packs_epi32(q[2], q[3]);
        __m256i w = j->y_signed ? _mm256_packs_epi16(w16a, w16b) : _mm256_packus_epi16(w16a, w16b);
        _mm256_storeu_si256((__m256i *)(j->y + i), _mm256_permutevar8x32_epi32(w, order));
    }
    quantize_c(j, i, i1);
}

__attribute__((target("avx512f"))) static void quantize_avx512(const quant_job *j, int64_t i0, int64_t i1)
{
    const __m512 vs = _mm512_set1_ps(j->scale), vz = _mm512_set1_ps(j->zp), vlo = _mm512_set1_ps(j->lo),
                 vhi = _mm512_set1_ps(j->hi);
    for (int64_t i = i0; i < i1; i += 16) {
        __mmask16 m = i1 - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (i1 - i)) - 1);
        __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(m, j->x + i), vs);
        v = _mm512_add_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
        v = _mm512_min_ps(_mm512_max_ps(v, vlo), vhi);
        _mm512_mask_cvtepi32_storeu_epi8(j->y + i, m, _mm512_cvtps_epi32(v));
    }
}
#endif

static void quant_chunks(void *ctx, int64_t begin, int64_t end)
{
    const quant_job *j = ctx;
    int64_t i0 = begin * CHUNK, i1 = end * CHUNK < j->n ? end * CHUNK : j->n;
#if HAVE_X86
    switch (detect()) {
    case LEVEL_AVX512: quantize_avx512(j, i0, i1); return;
    case LEVEL_AVX2: quantize_avx2(j, i0, i1); return;
    default: break;
    }
#endif
    quantize_c(j, i0, i1);
}

void kiln_cpu_quantize(kiln_threadpool *pool, const float *x, int64_t n, float scale, int32_t zp, bool y_signed,
                       void *y)
{
    quant_job j = {.x = x, .n = n, .scale = scale, .zp = (float)zp, .lo = y_signed ? -128.0f : 0.0f,
                   .hi = y_signed ? 127.0f : 255.0f, .y_signed = y_signed, .y = y};
    kiln_threadpool_parallel_for(n <= CHUNK ? NULL : pool, (n + CHUNK - 1) / CHUNK, quant_chunks, &j);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* kiln_cpu_dequant_row 16 lanes at a time, the same products in the same order */
__attribute__((target("avx512f"))) static void dequant_row_avx512(const int32_t *acc, int64_t n, float a_scale,
                                                                  const float *b_scale, bool per_col, const float *bias,
                                                                  float *out)
{
    const __m512 as = _mm512_set1_ps(a_scale), one_scale = _mm512_set1_ps(a_scale * b_scale[0]);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
        __m512 s = per_col ? _mm512_mul_ps(as, _mm512_maskz_loadu_ps(k, b_scale + j)) : one_scale;
        __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(k, acc + j)), s);
        if (bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(k, bias + j));
        _mm512_mask_storeu_ps(out + j, k, y);
    }
}
#endif

void kiln_cpu_dequant_row(const int32_t *acc, int64_t n, float a_scale, const float *b_scale, bool per_col,
                          const float *bias, float *out)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (detect() == LEVEL_AVX512) {
        dequant_row_avx512(acc, n, a_scale, b_scale, per_col, bias, out);
        return;
    }
#endif
    const v4f one_scale = v4_splat(a_scale * b_scale[0]);
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        v4i v;
        memcpy(&v, acc + j, sizeof v);
        v4f y = __builtin_convertvector(v, v4f) * (per_col ? v4_splat(a_scale) * v4_load(b_scale + j) : one_scale);
        v4_store(out + j, bias ? y + v4_load(bias + j) : y);
    }
    for (; j < n; j++) {
        float y = (float)acc[j] * (a_scale * b_scale[per_col ? j : 0]);
        out[j] = bias ? y + bias[j] : y;
    }
}
