/* kernels_qlinear_ew.c - CPU kernels of com.microsoft QLinearAdd and QLinearMul (the reference,
 * src/ops/contrib_qlinear.c, has ORT's float steps) for the shapes quantize_static writes: B the
 * shape of A, a scalar, or A's trailing dims (a bias), and A a scalar against a full B. The same
 * float32 operations in the same order as the reference, so the same integers; the per-operand
 * terms come from 256-entry tables, rows spread over the pool from 64K elements. Other broadcasts
 * take the reference kernel. */
#include <math.h>
#include <string.h>

#include "core/threadpool.h"
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
    float rmul, t_const;
    float ta[256], tb[256]; /* per-code terms, indexed by the byte */
} qew_job;

static inline int code(bool sg, uint8_t byte) { return sg ? (int8_t)byte : byte; }

static void qew_range(void *ctx, int64_t i0, int64_t i1)
{
    const qew_job *j = ctx;
    float a_lo = (float)(j->lo - j->zc), a_hi = (float)(j->hi - j->zc);
    for (int64_t i = i0; i < i1; i++) {
        uint8_t ab = j->a[i], bb = j->b[j->bn == 1 ? 0 : i % j->bn];
        long q;
        if (j->mul) {
            float v = (float)(code(j->is_signed, ab) - j->za) * (float)(code(j->is_signed, bb) - j->zb) * j->rmul;
            v = v < a_lo ? a_lo : v;
            v = v > a_hi ? a_hi : v;
            q = lrintf(v) + j->zc;
        } else {
            float v = j->scalar ? j->t_const + j->ta[ab] : j->ta[ab] + j->tb[bb];
            q = lrintf(v);
        }
        int r = q < j->lo ? j->lo : q > j->hi ? j->hi : (int)q;
        j->c[i] = (uint8_t)(j->is_signed ? (uint8_t)(int8_t)r : (uint8_t)r);
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
    bool swap = A->numel == 1 && B->numel != 1;
    const kiln_value *full = swap ? B : A, *other = swap ? A : B;
    if (full->numel != C->numel || !(other->numel == 1 || other->numel == C->numel || trailing(other, C)) || !C->numel)
        return C->numel ? n->op->run(c) : KILN_OK;
    qew_job job, *j = &job; /* 2 KB of tables: on the stack */
    memset(j, 0, sizeof *j);
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
    kiln_threadpool_parallel_for(C->numel < (1 << 16) ? NULL : kiln_run_threadpool(c), C->numel, qew_range, j);
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
