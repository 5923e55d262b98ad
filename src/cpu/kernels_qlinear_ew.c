/* kernels_qlinear_ew.c - CPU kernels of com.microsoft QLinearAdd and QLinearMul (the reference,
 * src/ops/contrib_qlinear.c, has ORT's float steps): B the shape of A, a scalar, or A's trailing
 * dims (a bias), A a scalar against a full B, and any other broadcast row by row (bcast.h). The same
 * float32 operations as the reference, so the same integers: Add's two fused multiply-adds (fmaf,
 * or FMA on AVX-512), Mul's product and sum never fused (AVX-512 with explicit rounding, which
 * the compiler does not contract); a 256-entry table of the results for a scalar operand; rows
 * spread over the pool from 64K elements. */
#include <math.h>
#include <string.h>

#include "core/threadpool.h"
#include "cpu/bcast.h"
#include "cpu/kernels.h"
#include "ops/quant_internal.h"

static bool is_q8(kiln_dtype dt) { return dt == KILN_DTYPE_UINT8 || dt == KILN_DTYPE_INT8; }

typedef struct qew_job {
    const uint8_t *x, *y; /* bytes of ORT's first operand (C's shape or a row) and of its second (yn values, cycled) */
    uint8_t *c;
    int64_t n, yn;
    bool mul, is_signed;
    int lo, hi, zx, zy, zc;
    float rx, ry, rmul, fixed; /* Add: sx / sc, sy / sc, zc - fma(rx, zx, ry * zy); Mul: sx * sy / sc */
    float ty[256];             /* Add: fma(y, ry, fixed), indexed by y's byte */
    uint8_t lut[256];          /* y one value: C's byte, indexed by x's byte */
    int64_t row;               /* elements per parallel piece: y's count when it cycles */
    bool general;              /* any other broadcast: C's rows (bc) */
    bool swap;                 /* x is B, y is A */
    kiln_bcast_rows bc;
    bool avx512;
} qew_job;

static inline int code(bool sg, uint8_t byte) { return sg ? (int8_t)byte : byte; }

/* C's code for the bytes xb, yb: the reference's float steps, clamped to one past the range (NaN to
 * the low end, which keeps |v| < 2^22 and the final clamp's result) and rounded half to even */
static inline int qew_one(const qew_job *j, uint8_t xb, uint8_t yb)
{
    int x = code(j->is_signed, xb), y = code(j->is_signed, yb);
    float v = j->mul ? (float)((x - j->zx) * (y - j->zy)) * j->rmul + (float)j->zc : fmaf((float)x, j->rx, j->ty[yb]);
    int q = (int)kiln_rint_small(kiln_clampf(v, (float)(j->lo - 1), (float)(j->hi + 1)));
    return q < j->lo ? j->lo : q > j->hi ? j->hi : q;
}

/* c[i] for i in [0, n) from x[i] and y[ys * i] (ys 0 or 1) */
static void qew_span(const qew_job *j, const uint8_t *x, const uint8_t *y, int ys, uint8_t *c, int64_t n)
{
    for (int64_t i = 0; i < n; i++) c[i] = (uint8_t)qew_one(j, x[i], y[ys * i]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86 1
/* round to nearest for the _round_ intrinsics: an immediate, which a const variable is not at -O0 */
#define QEW_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* qew_span with AVX-512: Add by FMA, Mul by a multiply and an add with explicit rounding (never fused) */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void qew_span_avx512(const qew_job *j, const uint8_t *x,
                                                                                 const uint8_t *y, int ys, uint8_t *c,
                                                                                 int64_t n)
{
    const __m512 v_lo = _mm512_set1_ps((float)(j->lo - 1)), v_hi = _mm512_set1_ps((float)(j->hi + 1));
    const __m512i lo = _mm512_set1_epi32(j->lo), hi = _mm512_set1_epi32(j->hi);
    const __m512i zx = _mm512_set1_epi32(j->zx), zy = _mm512_set1_epi32(j->zy);
    const __m512 zc = _mm512_set1_ps((float)j->zc), rmul = _mm512_set1_ps(j->rmul);
    const __m512 rx = _mm512_set1_ps(j->rx), ry = _mm512_set1_ps(j->ry), fixed = _mm512_set1_ps(j->fixed);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m128i xb = _mm_maskz_loadu_epi8(k, x + i);
        __m128i yb = ys ? _mm_maskz_loadu_epi8(k, y + i) : _mm_set1_epi8((char)y[0]);
        __m512i xi = j->is_signed ? _mm512_cvtepi8_epi32(xb) : _mm512_cvtepu8_epi32(xb);
        __m512i yi = j->is_signed ? _mm512_cvtepi8_epi32(yb) : _mm512_cvtepu8_epi32(yb);
        __m512 v;
        if (j->mul) {
            __m512i p = _mm512_mullo_epi32(_mm512_sub_epi32(xi, zx), _mm512_sub_epi32(yi, zy));
            /* explicit rounding: the two steps stay unfused, as in ORT */
            v = _mm512_add_round_ps(_mm512_mul_round_ps(_mm512_cvtepi32_ps(p), rmul, QEW_RN), zc, QEW_RN);
        } else {
            v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(xi), rx, _mm512_fmadd_ps(_mm512_cvtepi32_ps(yi), ry, fixed));
        }
        /* clamped to one past the range first (NaN to the low end): cvtps2dq of a huge value would wrap */
        v = _mm512_min_ps(_mm512_max_ps(v, v_lo), v_hi);
        __m512i q = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(v), lo), hi);
        _mm512_mask_cvtepi32_storeu_epi8(c + i, k, q);
    }
}
#endif

static void qew_range(void *ctx, int64_t r0, int64_t r1)
{
    const qew_job *j = ctx;
    int last = j->bc.rank - 1;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *x, *y;
        int ys;
        int64_t i, n;
        if (j->general) { /* C's rows: x a row of its own, y a row or one value */
            int64_t oa, ob;
            kiln_bcast_rows_at(&j->bc, r, &oa, &ob);
            i = r * j->bc.inner, n = j->bc.inner;
            x = j->swap ? j->x + ob : j->x + oa, y = j->swap ? j->y + oa : j->y + ob;
            ys = (j->swap ? j->bc.sa[last] : j->bc.sb[last]) != 0;
        } else { /* rows of yn elements when y cycles, else chunks of `row` elements against y's own */
            i = r * j->row, n = j->n - i < j->row ? j->n - i : j->row;
            x = j->x + i, y = j->yn == j->n ? j->y + i : j->y, ys = 1;
            if (j->yn == 1) { /* one value: the table */
                for (int64_t e = 0; e < n; e++) j->c[i + e] = j->lut[x[e]];
                continue;
            }
        }
#if HAVE_X86
        if (j->avx512) {
            qew_span_avx512(j, x, y, ys, j->c + i, n);
            continue;
        }
#endif
        qew_span(j, x, y, ys, j->c + i, n);
    }
}

/* whether B's dims are C's trailing dims (leading 1s allowed) */
static bool trailing(const kiln_value *B, const kiln_value *C)
{
    if (B->rank > C->rank) return false;
    for (int k = 0; k < B->rank; k++) {
        int64_t bd = B->dims[B->rank - 1 - k], cd = C->dims[C->rank - 1 - k];
        if (bd != cd && !(bd == 1 && B->numel == 1)) return false;
    }
    return true;
}

static kiln_status qew_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 3);
    kiln_value *C = kiln_run_out(c, 0);
    kiln_dtype dt = A->dtype;
    float sa, sb, sc;
    int za, zb, zc;
    if (!B || B->dtype != dt || !is_q8(dt) ||
        !kiln_contrib_q8_params(kiln_run_in(c, 1), kiln_run_in(c, 2), dt, &sa, &za) ||
        !kiln_contrib_q8_params(kiln_run_in(c, 4), kiln_run_in(c, 5), dt, &sb, &zb) ||
        !kiln_contrib_q8_params(kiln_run_in(c, 6), kiln_run_in(c, 7), dt, &sc, &zc))
        return kiln_cpu_reference(c);
    if (!C->numel) return KILN_OK;
    qew_job job, *j = &job; /* 1.3 KB of tables: on the stack */
    memset(j, 0, sizeof *j);
    j->swap = kiln_contrib_qbinary_swaps(A, C);
    const kiln_value *X = j->swap ? B : A, *Y = j->swap ? A : B;
    j->general = X->numel != C->numel || !(Y->numel == 1 || Y->numel == C->numel || trailing(Y, C));
    if (j->general && (A->numel == 1 || B->numel == 1 || !kiln_bcast_rows_setup(&j->bc, A, B, C)))
        return kiln_cpu_reference(c);
    j->x = X->data, j->y = Y->data, j->c = C->data, j->n = C->numel, j->yn = Y->numel;
    j->mul = !strcmp(n->op_type, "QLinearMul"), j->is_signed = dt == KILN_DTYPE_INT8;
    j->lo = j->is_signed ? -128 : 0, j->hi = j->is_signed ? 127 : 255, j->zc = zc;
    float sx = j->swap ? sb : sa, sy = j->swap ? sa : sb;
    j->zx = j->swap ? zb : za, j->zy = j->swap ? za : zb;
    j->rx = sx / sc, j->ry = sy / sc, j->rmul = sa * sb / sc;
    j->fixed = (float)zc - fmaf(j->rx, (float)j->zx, j->ry * (float)j->zy);
    for (int byte = 0; byte < 256 && !j->mul; byte++)
        j->ty[byte] = fmaf((float)code(j->is_signed, (uint8_t)byte), j->ry, j->fixed);
    if (!j->general && j->yn == 1)
        for (int byte = 0; byte < 256; byte++) j->lut[byte] = (uint8_t)qew_one(j, (uint8_t)byte, j->y[0]);
    j->row = j->yn == 1 || j->yn == j->n ? KILN_CPU_CHUNK : j->yn;
#if HAVE_X86
    j->avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl");
#endif
    int64_t pieces = j->general ? j->bc.rows : (j->n + j->row - 1) / j->row;
    kiln_threadpool_parallel_for(C->numel < (1 << 16) ? NULL : kiln_run_threadpool(c), pieces, qew_range, j);
    return KILN_OK;
}

static kiln_kernel_fn select_qew(kiln_node *n)
{
    return n->n_in >= 7 && n->in[0] && is_q8(n->in[0]->type.dtype) ? qew_run : NULL;
}

static const kiln_cpu_kernel kernels[] = {
    {"com.microsoft", "QLinearAdd", select_qew},
    {"com.microsoft", "QLinearMul", select_qew},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_qlinear_ew, kernels);
