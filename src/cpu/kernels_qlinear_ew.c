/* kernels_qlinear_ew.c - CPU kernels of com.microsoft QLinearAdd and QLinearMul (the reference,
 * src/ops/contrib_qlinear.c, has ORT's float steps): B the shape of A, a scalar, or A's trailing
 * dims (a bias), A a scalar against a full B, and any other broadcast row by row (bcast.h). The same
 * float32 operations in the same order as the reference, so the same integers; the per-operand
 * terms from 256-entry tables (computed again, never fused, on AVX-512), rows spread over the pool
 * from 64K elements. */
#include <math.h>
#include <string.h>

#include "core/threadpool.h"
#include "cpu/bcast.h"
#include "cpu/kernels.h"

static bool is_q8(kiln_dtype dt) { return dt == KILN_DTYPE_UINT8 || dt == KILN_DTYPE_INT8; }

static int q8_load(kiln_dtype dt, const void *p, int64_t i)
{
    return dt == KILN_DTYPE_INT8 ? ((const int8_t *)p)[i] : ((const uint8_t *)p)[i];
}

static bool qparams(const kiln_value *s, const kiln_value *z, kiln_dtype dt, float *scale, int *zp)
{
    if (!s || s->dtype != KILN_DTYPE_FLOAT32 || s->numel != 1) return false;
    if (z && (z->dtype != dt || z->numel != 1)) return false;
    *scale = *(const float *)s->data;
    *zp = z ? q8_load(dt, z->data, 0) : 0;
    return true;
}

typedef struct qew_job {
    const uint8_t *a, *b; /* bytes of the full operand and of the other (bn values, cycled) */
    uint8_t *c;
    int64_t n, bn;
    bool mul, is_signed, scalar;
    int lo, hi, za, zb, zc;
    float rmul, t_const, rac, rbc, fixed;
    float ta[256], tb[256]; /* per-code terms, indexed by the byte: fixed + code * rac, code * rbc */
    int64_t row;            /* elements per parallel piece: B's count when it cycles */
    bool general;           /* any other broadcast: C's rows (bc) */
    kiln_bcast_rows bc;
    bool avx512;
} qew_job;

static inline int code(bool sg, uint8_t byte) { return sg ? (int8_t)byte : byte; }

/* lrintf(v) clamped to [lo, hi]: v clamped to one past the range first (which keeps |v| < 2^22
 * and the final clamp's result) */
static inline int round_clamped(float v, int lo, int hi)
{
    v = v < (float)(lo - 1) ? (float)(lo - 1) : v > (float)(hi + 1) ? (float)(hi + 1) : v;
    int q = (int)kiln_rint_small(v);
    return q < lo ? lo : q > hi ? hi : q;
}

/* c[i] for i in [0, n) from a[as * i] and b[bs * i] (strides 0 or 1) */
static void qew_span(const qew_job *j, const uint8_t *a, int as, const uint8_t *b, int bs, uint8_t *c, int64_t n)
{
    float a_lo = (float)(j->lo - j->zc), a_hi = (float)(j->hi - j->zc);
    for (int64_t i = 0; i < n; i++) {
        uint8_t ab = a[as * i], bb = b[bs * i];
        int r;
        if (j->mul) {
            float v = (float)(code(j->is_signed, ab) - j->za) * (float)(code(j->is_signed, bb) - j->zb) * j->rmul;
            v = v < a_lo ? a_lo : v;
            v = v > a_hi ? a_hi : v;
            r = round_clamped(v, j->lo - j->zc, j->hi - j->zc) + j->zc;
        } else {
            r = round_clamped(j->scalar ? j->t_const + j->ta[ab] : j->ta[ab] + j->tb[bb], j->lo, j->hi);
        }
        c[i] = (uint8_t)(j->is_signed ? (uint8_t)(int8_t)r : (uint8_t)r);
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86 1
/* qew_span with AVX-512: the same float32 operations (multiplies and adds, never fused) */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void qew_span_avx512(const qew_job *j, const uint8_t *a,
                                                                                 int as, const uint8_t *b, int bs,
                                                                                 uint8_t *c, int64_t n)
{
    const __m512 a_lo = _mm512_set1_ps((float)(j->lo - j->zc)), a_hi = _mm512_set1_ps((float)(j->hi - j->zc));
    const __m512i lo = _mm512_set1_epi32(j->lo), hi = _mm512_set1_epi32(j->hi), zc = _mm512_set1_epi32(j->zc);
    const __m512i za = _mm512_set1_epi32(j->za), zb = _mm512_set1_epi32(j->zb);
    const __m512 rmul = _mm512_set1_ps(j->rmul), rac = _mm512_set1_ps(j->rac), rbc = _mm512_set1_ps(j->rbc);
    const __m512 fixed = _mm512_set1_ps(j->fixed), tconst = _mm512_set1_ps(j->t_const);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m128i ab = as ? _mm_maskz_loadu_epi8(k, a + i) : _mm_set1_epi8((char)a[0]);
        __m128i bb = bs ? _mm_maskz_loadu_epi8(k, b + i) : _mm_set1_epi8((char)b[0]);
        __m512i ai = j->is_signed ? _mm512_cvtepi8_epi32(ab) : _mm512_cvtepu8_epi32(ab);
        __m512i bi = j->is_signed ? _mm512_cvtepi8_epi32(bb) : _mm512_cvtepu8_epi32(bb);
        __m512i q;
        if (j->mul) {
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(ai, za)), _mm512_cvtepi32_ps(_mm512_sub_epi32(bi, zb)));
            v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, rmul), a_lo), a_hi);
            q = _mm512_add_epi32(_mm512_cvtps_epi32(v), zc);
        } else {
            __m512 ta = _mm512_mul_ps(_mm512_cvtepi32_ps(ai), rac);
            __m512 v = j->scalar ? _mm512_add_ps(tconst, ta)
                                 : _mm512_add_ps(_mm512_add_ps(fixed, ta), _mm512_mul_ps(_mm512_cvtepi32_ps(bi), rbc));
            /* clamped to one past the range first: cvtps2dq of a huge value would wrap */
            v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps((float)(j->lo - 1))), _mm512_set1_ps((float)(j->hi + 1)));
            q = _mm512_cvtps_epi32(v);
        }
        q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
        _mm512_mask_cvtepi32_storeu_epi8(c + i, k, q);
    }
}
#endif

static void qew_range(void *ctx, int64_t r0, int64_t r1)
{
    const qew_job *j = ctx;
    int last = j->bc.rank - 1;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *a, *b;
        int as = 1, bs;
        int64_t i, n;
        if (j->general) { /* C's rows, each operand a row of its own or one value */
            int64_t oa, ob;
            kiln_bcast_rows_at(&j->bc, r, &oa, &ob);
            i = r * j->bc.inner, n = j->bc.inner;
            a = j->a + oa, b = j->b + ob, as = j->bc.sa[last] != 0, bs = j->bc.sb[last] != 0;
        } else { /* rows of bn elements when B cycles, else chunks of `row` elements against B's own */
            i = r * j->row, n = j->n - i < j->row ? j->n - i : j->row;
            a = j->a + i, b = j->bn == 1 ? j->b : j->bn == j->n ? j->b + i : j->b, bs = j->bn == 1 ? 0 : 1;
        }
#if HAVE_X86
        if (j->avx512) {
            qew_span_avx512(j, a, as, b, bs, j->c + i, n);
            continue;
        }
#endif
        qew_span(j, a, as, b, bs, j->c + i, n);
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
    if (!B || B->dtype != dt || !is_q8(dt) || !qparams(kiln_run_in(c, 1), kiln_run_in(c, 2), dt, &sa, &za) ||
        !qparams(kiln_run_in(c, 4), kiln_run_in(c, 5), dt, &sb, &zb) || !qparams(kiln_run_in(c, 6), kiln_run_in(c, 7), dt, &sc, &zc))
        return n->op->run(c);
    if (!C->numel) return KILN_OK;
    bool swap = A->numel == 1 && B->numel != 1;
    const kiln_value *full = swap ? B : A, *other = swap ? A : B;
    qew_job job, *j = &job; /* 2 KB of tables: on the stack */
    memset(j, 0, sizeof *j);
    j->general = full->numel != C->numel || !(other->numel == 1 || other->numel == C->numel || trailing(other, C));
    if (j->general && (A->numel == 1 || B->numel == 1 || !kiln_bcast_rows_setup(&j->bc, A, B, C)))
        return n->op->run(c);
    j->a = full->data, j->b = other->data, j->c = C->data, j->n = C->numel, j->bn = other->numel;
    j->mul = !strcmp(n->op_type, "QLinearMul"), j->is_signed = dt == KILN_DTYPE_INT8;
    j->lo = j->is_signed ? -128 : 0, j->hi = j->is_signed ? 127 : 255, j->zc = zc;
    float rac = sa / sc, rbc = sb / sc;
    j->rmul = sa * sb / sc;
    if (swap) { /* the reference's operand swap for a scalar A */
        float t = rac;
        rac = rbc, rbc = t;
        int z = za;
        za = zb, zb = z;
    }
    j->za = za, j->zb = zb;
    j->scalar = swap || B->numel == 1;
    float fixed = (float)zc - (rac * (float)za + rbc * (float)zb);
    for (int byte = 0; byte < 256; byte++) {
        float v = (float)code(j->is_signed, (uint8_t)byte);
        j->ta[byte] = j->scalar ? v * rac : fixed + v * rac;
        j->tb[byte] = v * rbc;
    }
    if (j->scalar) j->t_const = fixed + (float)code(j->is_signed, j->b[0]) * rbc;
    j->rac = rac, j->rbc = rbc, j->fixed = fixed;
    j->row = j->bn == 1 || j->bn == j->n ? 4096 : j->bn;
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
