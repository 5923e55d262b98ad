/* kernels_qconv.c - the CPU provider's ConvInteger and QLinearConv (1-D and 2-D, any group) on
 * the int8 GEMM (qgemm.h). Per image and group, the output pixels are the GEMM's rows:
 *   A [P, K] = im2col of X (K = kh * kw * C/group, over (ky, kx, c), read from a copy of the
 *              group's planes with channels innermost; taps in the padding hold x's zero point,
 *              so they contribute nothing once it is subtracted),
 *   B [K, M/group] = W^T of the group, packed once at compile time (W constant),
 *   C [P, M/group] int32, with W's per-channel zero points as B's per-column zero points,
 * and the tile epilogue writes C transposed into Y (NCHW): int32 for ConvInteger; for QLinearConv
 * the bias added to the int32 sum, then ORT's requantization (multiplier x_scale * w_scale[m] /
 * y_scale in float32, float(sum) times it, clamped to the output range less y's zero point,
 * rounded half to even, plus the zero point). Depthwise convolutions (group = C = M) run the
 * float depthwise kernel on exact integer values, other groups of one input channel a direct
 * loop. A fed W, 3-D and larger convolutions and malformed parameters run the
 * reference, which reports what is wrong. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/scratch.h"
#include "core/threadpool.h"
#include "cpu/kernels.h"
#include "cpu/qgemm.h"
#include "cpu/requant.h"
#include "ops/nn_internal.h"
#include "ops/util.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86 1
#endif

enum {
    CHUNK_A_BYTES = 1 << 20, /* im2col rows built per GEMM call, about */
    EP_ROWS = 64,            /* rows of a tile requantized at once before the transposed store */
    EP_COLS = 256,           /* columns of a tile at most: 8 panels of 32 (qgemm.c's TILE_PANELS) */
    DW_BLOCK = 256,          /* output columns per accumulator row of the direct loop */
};

static bool is_8bit(kiln_dtype dt) { return dt == KILN_DTYPE_UINT8 || dt == KILN_DTYPE_INT8; }

static bool ir_8bit(const kiln_ir_value *v)
{
    return v && v->type.kind == KILN_VALUE_TENSOR && is_8bit(v->type.dtype);
}

/* W^T per group, packed (kernel_state). */
typedef struct qconv_state {
    int64_t group;
    kiln_qgemm_packed_b **pb; /* [group] */
} qconv_state;

static void state_free(void *p)
{
    qconv_state *s = p;
    if (!s) return;
    for (int64_t g = 0; s->pb && g < s->group; g++) kiln_qgemm_packed_b_free(s->pb[g]);
    free(s->pb);
    free(s);
}

/* Packs the constant W [M, Cg, k..] of input wi as group B matrices [Cg * k.., M / group];
 * leaves kernel_state NULL (the reference runs) when W does not fit or memory is short. */
static void pack_w(kiln_node *n, int wi)
{
    const kiln_value *W = kiln_ir_constant(n->in[wi]);
    int64_t group = kiln_attr_int(n, "group", 1);
    if (!W || !is_8bit(W->dtype) || W->rank < 3 || W->rank > 4 || group < 1 || W->dims[0] % group || !W->numel)
        return;
    int64_t M = W->dims[0], Mg = M / group, K = W->numel / M, Cg = W->dims[1], kk = K / Cg;
    if (W->dims[1] == 1 && group > 1 && K <= 64) return; /* the direct loop (qconv_run) */
    qconv_state *s = calloc(1, sizeof *s);
    uint8_t *t = malloc((size_t)(K * Mg));
    if (!s || !t || !(s->pb = calloc((size_t)group, sizeof *s->pb))) goto fail;
    s->group = group;
    const uint8_t *w = W->data;
    kiln_qgemm_ctx ctx = {0};
    for (int64_t g = 0; g < group; g++) {
        for (int64_t m = 0; m < Mg; m++)
            for (int64_t ci = 0; ci < Cg; ci++)
                for (int64_t q = 0; q < kk; q++) t[(q * Cg + ci) * Mg + m] = w[(g * Mg + m) * K + ci * kk + q];
        if (kiln_qgemm_packed_b_create(&ctx, K, Mg, t, Mg, W->dtype == KILN_DTYPE_INT8, &s->pb[g])) goto fail;
    }
    free(t);
    n->kernel_state = s;
    n->kernel_state_free = state_free;
    return;
fail:
    free(t);
    state_free(s);
}

/* What the output epilogue needs: int32 (ConvInteger) or requantized 8-bit (QLinearConv). */
typedef struct qconv_out {
    bool qlinear;
    int32_t *y32;        /* ConvInteger: Y planes of this (image, group) */
    uint8_t *y8;         /* QLinearConv */
    int64_t P, p0;       /* pixels per plane, first pixel of this GEMM */
    const float *mult;   /* [Mg] of this group */
    const int32_t *bias; /* [Mg] or NULL */
    int32_t yzp, lo, hi;
} qconv_out;


static void out_tile(void *ctx, int32_t *c, int64_t ldc, int64_t i0, int64_t m, int64_t j0, int64_t n)
{
    const qconv_out *o = ctx;
    if (!o->qlinear) {
        for (int64_t j = 0; j < n; j++) {
            int32_t *y = o->y32 + (j0 + j) * o->P + o->p0 + i0;
            for (int64_t i = 0; i < m; i++) y[i] = c[i * ldc + j];
        }
        return;
    }
    float lo = (float)(o->lo - o->yzp), hi = (float)(o->hi - o->yzp);
    uint8_t t[EP_ROWS * EP_COLS];
    for (int64_t jb = 0; jb < n; jb += EP_COLS) {
        int64_t nb = n - jb < EP_COLS ? n - jb : EP_COLS;
        for (int64_t ib = 0; ib < m; ib += EP_ROWS) {
            int64_t mb = m - ib < EP_ROWS ? m - ib : EP_ROWS;
            const int32_t *cb = c + ib * ldc + jb;
            const float *mult = o->mult + j0 + jb;
            const int32_t *bias = o->bias ? o->bias + j0 + jb : NULL;
            kiln_cpu_requant_rows(cb, ldc, mb, nb, mult, bias, lo, hi, o->yzp, t, nb);
            for (int64_t j = 0; j < nb; j++) {
                uint8_t *y = o->y8 + (j0 + jb + j) * o->P + o->p0 + i0 + ib;
                for (int64_t i = 0; i < mb; i++) y[i] = t[i * nb + j];
            }
        }
    }
}

/* The geometry of one call, 2-D (a 1-D convolution has H = kh = oh = 1). */
typedef struct qgeom {
    int64_t N, C, H, W, M, group, Cg, Mg, kh, kw, oh, ow;
    int64_t sh, sw, dh, dw, ph, pw;
} qgeom;

/* im2col rows [p0 + begin, p0 + end) of one image's group into a, from xt, the group's pixels
 * with their Cg channels together ([H * W, Cg]); a row's K = kh * kw * Cg bytes run over
 * (ky, kx, c), the order the packed W^T uses. */
typedef struct im2col_job {
    const qgeom *q;
    const uint8_t *x; /* transpose_rows: the group's [Cg, H * W] planes; im2col_rows: xt */
    uint8_t *a;
    int64_t p0, K;
    uint8_t zp;
} im2col_job;

static void im2col_rows(void *ctx, int64_t begin, int64_t end)
{
    const im2col_job *j = ctx;
    const qgeom *q = j->q;
    size_t cg = (size_t)q->Cg;
    for (int64_t r = begin; r < end; r++) {
        int64_t p = j->p0 + r, oy = p / q->ow, ox = p % q->ow;
        uint8_t *d = j->a + r * j->K;
        int64_t iy0 = oy * q->sh - q->ph, ix0 = ox * q->sw - q->pw;
        bool inside_x = ix0 >= 0 && ix0 + (q->kw - 1) * q->dw < q->W;
        for (int64_t ky = 0; ky < q->kh; ky++, d += q->kw * cg) {
            int64_t iy = iy0 + ky * q->dh;
            if (iy < 0 || iy >= q->H) {
                memset(d, j->zp, (size_t)q->kw * cg);
                continue;
            }
            const uint8_t *xr = j->x + iy * q->W * (int64_t)cg;
            if (inside_x && q->dw == 1) {
                memcpy(d, xr + ix0 * (int64_t)cg, (size_t)q->kw * cg); /* kw pixels in a row */
                continue;
            }
            for (int64_t kx = 0; kx < q->kw; kx++) {
                int64_t ix = ix0 + kx * q->dw;
                if (ix >= 0 && ix < q->W) memcpy(d + kx * cg, xr + ix * (int64_t)cg, cg);
                else memset(d + kx * cg, j->zp, cg);
            }
        }
    }
}

/* Rows [begin, end) of the transpose of the [K, P] planes at x (from pixel p0): a [rows, K]. The
 * im2col of a pointwise convolution, and the NHWC copy (xt) the others' im2col reads. */
KILN_VECTORIZE static void transpose_rows(void *ctx, int64_t begin, int64_t end)
{
    const im2col_job *j = ctx;
    int64_t P = j->q->H * j->q->W, K = j->K;
    enum { T = 64 };
    for (int64_t r0 = begin; r0 < end; r0 += T) {
        int64_t r1 = r0 + T < end ? r0 + T : end;
        for (int64_t c = 0; c < K; c++) {
            const uint8_t *x = j->x + c * P + j->p0;
            for (int64_t r = r0; r < r1; r++) j->a[r * K + c] = x[r];
        }
    }
}

/* The depthwise-like case (one input channel per group): planes [begin, end) of N * M, direct. */
typedef struct direct_job {
    const qgeom *q;
    const uint8_t *x, *w;
    bool x_signed, w_signed;
    int32_t xzp;
    const int32_t *wzp; /* [M] */
    qconv_out o;        /* y32 / y8 for the whole output; mult, bias [M] */
} direct_job;

static inline int32_t ld8(const uint8_t *p, int64_t i, bool s) { return s ? (int32_t)(int8_t)p[i] : (int32_t)p[i]; }

/* Output columns [*lo, *hi) whose tap kx falls inside the row (ix = ox * sw - pw + kx * dw). */
static void tap_range(const qgeom *q, int64_t kx, int64_t *lo, int64_t *hi)
{
    int64_t off = q->pw - kx * q->dw, r = q->W - 1 + off;
    *lo = off <= 0 ? 0 : (off + q->sw - 1) / q->sw;
    *hi = r < 0 ? 0 : r / q->sw + 1;
    if (*hi > q->ow) *hi = q->ow;
}

/* acc[o - o0] += (x[o * sw + base] - xzp) * w over output columns [a, b), 8-bit x of either sign */
#define DW_TAP(T)                                                                                                      \
    do {                                                                                                               \
        const T *xs = (const T *)xr;                                                                                   \
        if (q->sw == 1)                                                                                                \
            for (int64_t o = a; o < b; o++) acc[o - o0] += ((int32_t)xs[o + base] - j->xzp) * w;                       \
        else                                                                                                           \
            for (int64_t o = a; o < b; o++) acc[o - o0] += ((int32_t)xs[o * q->sw + base] - j->xzp) * w;               \
    } while (0)

KILN_VECTORIZE static void direct_planes(void *ctx, int64_t begin, int64_t end)
{
    const direct_job *j = ctx;
    const qgeom *q = j->q;
    int64_t P = q->oh * q->ow, kk = q->kh * q->kw;
    float lo = (float)(j->o.lo - j->o.yzp), hi = (float)(j->o.hi - j->o.yzp);
    int64_t tlo[64], thi[64];
    for (int64_t kx = 0; kx < q->kw; kx++) tap_range(q, kx, &tlo[kx], &thi[kx]);
    for (int64_t t = begin; t < end; t++) {
        int64_t n = t / q->M, m = t % q->M, c = m / q->Mg;
        const uint8_t *x = j->x + (n * q->C + c) * q->H * q->W;
        int32_t wp[64]; /* kh * kw <= 64 (qconv_run) */
        for (int64_t i = 0; i < kk; i++) wp[i] = ld8(j->w, m * kk + i, j->w_signed) - j->wzp[m];
        float mult = j->o.qlinear ? j->o.mult[m] : 0.0f;
        uint32_t bias = j->o.bias ? (uint32_t)j->o.bias[m] : 0;
        for (int64_t oy = 0; oy < q->oh; oy++)
            for (int64_t o0 = 0; o0 < q->ow; o0 += DW_BLOCK) {
                int64_t nb = q->ow - o0 < DW_BLOCK ? q->ow - o0 : DW_BLOCK;
                int32_t acc[DW_BLOCK];
                memset(acc, 0, (size_t)nb * sizeof *acc);
                for (int64_t ky = 0; ky < q->kh; ky++) {
                    int64_t iy = oy * q->sh - q->ph + ky * q->dh;
                    if (iy < 0 || iy >= q->H) continue;
                    const uint8_t *xr = x + iy * q->W;
                    for (int64_t kx = 0; kx < q->kw; kx++) {
                        int32_t w = wp[ky * q->kw + kx];
                        int64_t a = tlo[kx] > o0 ? tlo[kx] : o0, b = thi[kx] < o0 + nb ? thi[kx] : o0 + nb;
                        int64_t base = kx * q->dw - q->pw; /* ix = o * sw + base */
                        if (!w || a >= b) continue;
                        if (j->x_signed) DW_TAP(int8_t);
                        else DW_TAP(uint8_t);
                    }
                }
                int64_t yi = (n * q->M + m) * P + oy * q->ow + o0;
                if (!j->o.qlinear)
                    for (int64_t i = 0; i < nb; i++) j->o.y32[yi + i] = acc[i];
                else
                    for (int64_t i = 0; i < nb; i++)
                        j->o.y8[yi + i] = kiln_cpu_requant_one((int32_t)((uint32_t)acc[i] + bias), mult, lo, hi, j->o.yzp);
            }
    }
}

/* ---- output channels as the GEMM's rows ----
 * C [Mg, cols] = (W_g - w_zp) (Xcol - x_zp): A is the group's weights as stored ([Mg, K], K over
 * (c, ky, kx)), B the im2col of the group's channels with the output pixels of every image as
 * its columns (image-major), built along the rows of the NCHW planes (a pointwise convolution of
 * one image reads the planes themselves), and the epilogue writes each row of C, one output
 * channel, straight into Y's planes: no transposes. Taken when W's zero point is one value and
 * the pixels outnumber half the channels (then packing W per call costs less than the
 * transposes it saves). */
typedef struct cols_job {
    const qgeom *q;
    const uint8_t *x; /* X */
    int64_t g, j0, n; /* group, the chunk's first column and its columns */
    uint8_t *b;       /* [K, n] */
    uint8_t zp;
} cols_job;

/* Row r = (c, ky, kx) of the im2col of one whole image (img) at d [P]: with stride 1 and the
 * output as wide as the input, the valid output rows are one shifted copy of the input plane,
 * then the columns whose tap falls in the padding (at most the pads at each end of a row) and
 * the rows outside the input get x's zero point. */
static void cols_plane(const cols_job *j, int64_t r, int64_t img, uint8_t *d)
{
    const qgeom *q = j->q;
    int64_t kk = q->kh * q->kw, c = r / kk, ky = r / q->kw % q->kh, kx = r % q->kw, lo, hi;
    tap_range(q, kx, &lo, &hi);
    int64_t s = kx * q->dw - q->pw, oh = q->oh, ow = q->ow, dy = ky * q->dh - q->ph; /* iy = oy + dy */
    int64_t y0 = dy < 0 ? -dy : 0, y1 = q->H - dy < oh ? q->H - dy : oh;
    if (y1 <= y0 || lo >= hi) {
        memset(d, j->zp, (size_t)(oh * ow));
        return;
    }
    const uint8_t *plane = j->x + (img * q->C + j->g * q->Cg + c) * q->H * q->W;
    /* d[oy * ow + ox] = plane[(oy + dy) * W + ox + s] over the valid rows, clipped to the plane */
    int64_t from = y0 * ow + (s < 0 ? -s : 0), to = y1 * ow - (s > 0 ? s : 0);
    memset(d, j->zp, (size_t)(y0 * ow));
    memcpy(d + from, plane + from + dy * ow + s, (size_t)(to - from));
    memset(d + y1 * ow, j->zp, (size_t)((oh - y1) * ow));
    for (int64_t oy = y0; oy < y1; oy++) { /* a few bytes a row: stores, not calls */
        uint8_t *row = d + oy * ow;
        for (int64_t ox = 0; ox < lo; ox++) row[ox] = j->zp;
        for (int64_t ox = hi; ox < ow; ox++) row[ox] = j->zp;
    }
}

/* Rows [begin, end) of the chunk's im2col, row r = (c, ky, kx): whole images by cols_plane
 * where it applies, otherwise for each output row (image, oy) the chunk overlaps, the input
 * row's taps, x's zero point in the padding. */
static void cols_rows(void *ctx, int64_t begin, int64_t end)
{
    const cols_job *j = ctx;
    const qgeom *q = j->q;
    int64_t kk = q->kh * q->kw, P = q->oh * q->ow, last = j->j0 + j->n;
    int64_t img0 = j->j0 / P, oy0 = j->j0 % P / q->ow, ox00 = j->j0 % q->ow; /* the chunk's first column */
    bool planes = q->sh == 1 && q->sw == 1 && q->ow == q->W && j->j0 % P == 0 && j->n % P == 0;
    for (int64_t r = begin; r < end; r++) {
        if (planes) {
            for (int64_t i = 0; i < j->n / P; i++) cols_plane(j, r, img0 + i, j->b + r * j->n + i * P);
            continue;
        }
        int64_t c = r / kk, ky = r / q->kw % q->kh, kx = r % q->kw, lo, hi;
        tap_range(q, kx, &lo, &hi);
        int64_t base = kx * q->dw - q->pw; /* ix = ox * sw + base */
        uint8_t *d = j->b + r * j->n - j->j0;
        for (int64_t col = j->j0, img = img0, oy = oy0, ox0 = ox00; col < last;) {
            int64_t ox1 = q->ow - ox0 < last - col ? q->ow : ox0 + (last - col);
            int64_t iy = oy * q->sh - q->ph + ky * q->dh, a = lo > ox0 ? lo : ox0, b = hi < ox1 ? hi : ox1;
            uint8_t *o = d + col - ox0; /* o[ox] is column (img, oy, ox) */
            if (iy < 0 || iy >= q->H || a >= b) {
                memset(o + ox0, j->zp, (size_t)(ox1 - ox0));
            } else {
                const uint8_t *src = j->x + ((img * q->C + j->g * q->Cg + c) * q->H + iy) * q->W;
                memset(o + ox0, j->zp, (size_t)(a - ox0));
                if (q->sw == 1) memcpy(o + a, src + a + base, (size_t)(b - a));
                else
                    for (int64_t ox = a; ox < b; ox++) o[ox] = src[ox * q->sw + base];
                memset(o + b, j->zp, (size_t)(ox1 - b));
            }
            col += ox1 - ox0;
            ox0 = 0;
            if (++oy == q->oh) oy = 0, img++;
        }
    }
}

/* The epilogue: rows are channels g0 + i, columns j0 + j of the chunk from column c0. */
typedef struct cols_out {
    qconv_out o;          /* y32 / y8: all of Y; mult and bias over all M channels */
    int64_t M, P, g0, c0;
} cols_out;

static void cols_tile(void *ctx, int32_t *c, int64_t ldc, int64_t i0, int64_t m, int64_t j0, int64_t n)
{
    const cols_out *t = ctx;
    const qconv_out *o = &t->o;
    float lo = (float)(o->lo - o->yzp), hi = (float)(o->hi - o->yzp);
    for (int64_t i = 0; i < m; i++) {
        int64_t ch = t->g0 + i0 + i;
        const int32_t *row = c + i * ldc - (t->c0 + j0); /* row[col] */
        for (int64_t col = t->c0 + j0, e = col + n; col < e;) {
            int64_t img = col / t->P, p = col % t->P, len = t->P - p < e - col ? t->P - p : e - col;
            int64_t yi = (img * t->M + ch) * t->P + p;
            if (!o->qlinear) memcpy(o->y32 + yi, row + col, (size_t)len * sizeof(int32_t));
            else
                kiln_cpu_requant_line(NULL, row + col, len, o->bias ? (uint32_t)o->bias[ch] : 0, o->mult[ch], lo, hi, o->yzp,
                             o->y8 + yi);
            col += len;
        }
    }
}

static kiln_status cols_conv(kiln_run_ctx *c, const qgeom *q, const kiln_value *X, const kiln_value *W, int32_t xz,
                             int32_t wz, const qconv_out *o_in)
{
    int64_t P = q->oh * q->ow, cols = q->N * P, K = q->Cg * q->kh * q->kw;
    bool planes = q->N == 1 && q->kh == 1 && q->kw == 1 && q->sh == 1 && q->sw == 1 && q->ph == 0 && q->pw == 0 &&
                  q->oh == q->H && q->ow == q->W;
    /* columns per GEMM: the chunk's im2col and its int32 sums about CHUNK_A_BYTES each */
    int64_t chunk = cols, by_k = CHUNK_A_BYTES / (K ? K : 1), by_c = CHUNK_A_BYTES / 4 / q->Mg;
    if (chunk > by_k) chunk = by_k;
    if (chunk > by_c) chunk = by_c;
    chunk = chunk < 256 ? (cols < 256 ? cols : 256) : chunk / 32 * 32;
    if (P <= chunk) chunk = chunk / P * P; /* whole images, for cols_plane */
    kiln_scratch *scr = kiln_run_scratch(c);
    uint8_t *b = planes ? NULL : kiln_scratch_get(scr, (size_t)(K * chunk) + 64);
    int32_t *cbuf = kiln_scratch_get(scr, (size_t)(q->Mg * chunk + 16) * sizeof(int32_t));
    kiln_status rc = KILN_OK;
    if ((!planes && !b) || !cbuf) {
        rc = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory for the im2col of %lld x %lld", (long long)K,
                           (long long)chunk);
        goto out;
    }
    kiln_threadpool *pool = kiln_run_threadpool(c);
    kiln_qgemm_ctx ctx = {.pool = pool, .scratch = scr};
    cols_out t = {.o = *o_in, .M = q->M, .P = P};
    t.o.y32 = kiln_run_out(c, 0)->data, t.o.y8 = kiln_run_out(c, 0)->data;
    for (int64_t g = 0; g < q->group && !rc; g++)
        for (int64_t j0 = 0; j0 < cols && !rc; j0 += chunk) {
            int64_t n = cols - j0 < chunk ? cols - j0 : chunk;
            const uint8_t *B = (const uint8_t *)X->data + g * q->Cg * P + j0;
            if (!planes) {
                cols_job j = {.q = q, .x = X->data, .g = g, .j0 = j0, .n = n, .b = b, .zp = (uint8_t)xz};
                kiln_threadpool_parallel_for(K * n < (1 << 16) ? NULL : pool, K, cols_rows, &j);
                B = b;
            }
            t.g0 = g * q->Mg, t.c0 = j0;
            kiln_qgemm_args ga = {.M = q->Mg, .N = n, .K = K, .A = (const uint8_t *)W->data + g * q->Mg * K, .lda = K,
                                  .a_signed = W->dtype == KILN_DTYPE_INT8, .a_zp = wz, .B = B,
                                  .ldb = planes ? P : n, .b_signed = X->dtype == KILN_DTYPE_INT8, .b_zp = &xz,
                                  .n_bzp = 1, .C = cbuf, .ldc = n, .tile = cols_tile, .tile_ctx = &t};
            if ((rc = kiln_qgemm(&ctx, &ga)))
                rc = kiln_run_fail(c, rc, "int8 GEMM of the convolution failed (%s)", kiln_status_name(rc));
        }
out:
    kiln_scratch_put(scr, cbuf);
    kiln_scratch_put(scr, b);
    return rc;
}

/* A scalar zero point of dtype dt (0 when absent); false otherwise. */
static bool scalar_zp(const kiln_value *zp, kiln_dtype dt, int32_t *v)
{
    *v = 0;
    if (!zp) return true;
    if (zp->numel != 1 || zp->dtype != dt) return false;
    *v = (int32_t)kiln_load_i64(zp->dtype, zp->data, 0);
    return true;
}

static bool scalar_f32(const kiln_value *v) { return v && v->dtype == KILN_DTYPE_FLOAT32 && v->numel == 1; }

/* X, W and attributes as a qgeom (and the resolved kiln_nn_geom g); false when the fast path
 * does not cover them. */
static bool geometry(const kiln_node *n, const kiln_value *X, const kiln_value *W, const kiln_value *Y, qgeom *q,
                     kiln_nn_geom *gp)
{
    if (X->rank != W->rank || (X->rank != 3 && X->rank != 4) || !Y || Y->rank != X->rank) return false;
    int nsp = X->rank - 2;
    kiln_nn_geom g;
    char msg[160];
    if (!kiln_nn_geom_parse(n, nsp, &g, msg, sizeof msg)) return false;
    memcpy(g.kernel, W->dims + 2, (size_t)nsp * sizeof(int64_t));
    int64_t od[KILN_MAX_RANK];
    if (!kiln_nn_geom_resolve(&g, X->dims + 2, od)) return false;
    *gp = g;
    memset(q, 0, sizeof *q);
    q->N = X->dims[0], q->C = X->dims[1], q->M = W->dims[0];
    q->group = kiln_attr_int(n, "group", 1);
    if (q->group < 1 || q->C % q->group || q->M % q->group || W->dims[1] * q->group != q->C) return false;
    q->Cg = q->C / q->group, q->Mg = q->M / q->group;
    int a = nsp == 2 ? 0 : -1; /* index of the H dim among the spatial ones */
    q->H = a == 0 ? X->dims[2] : 1, q->W = X->dims[X->rank - 1];
    q->kh = a == 0 ? W->dims[2] : 1, q->kw = W->dims[W->rank - 1];
    q->oh = a == 0 ? od[0] : 1, q->ow = od[nsp - 1];
    q->sh = a == 0 ? g.strides[0] : 1, q->sw = g.strides[nsp - 1];
    q->dh = a == 0 ? g.dilations[0] : 1, q->dw = g.dilations[nsp - 1];
    q->ph = a == 0 ? g.pads[0] : 0, q->pw = g.pads[nsp - 1];
    if (Y->dims[0] != q->N || Y->dims[1] != q->M || Y->dims[Y->rank - 1] != q->ow || (a == 0 && Y->dims[2] != q->oh))
        return false;
    return true;
}

/* Depthwise in float32, exactly: with a = x - x_zp and b = w - w_zp (each of magnitude below
 * 256), every partial sum of at most 64 products is an integer below 2^24, so the float kernel
 * (kiln_cpu_conv_depthwise) computes the int32 sums the int8 definition asks for, bit for bit;
 * then the bias and the requantization (or the int32 store) per plane. */
typedef struct dwf_job {
    const qgeom *q;
    const uint8_t *x;
    bool x_signed;
    int32_t xzp;
    float *xf;           /* [N * C, H * W] */
    const float *yf;     /* [N * M, P] */
    const qconv_out *o;
} dwf_job;

KILN_VECTORIZE static void dwf_in(void *ctx, int64_t begin, int64_t end)
{
    const dwf_job *j = ctx;
    int64_t hw = j->q->H * j->q->W;
    for (int64_t i = begin * hw; i < end * hw; i++)
        j->xf[i] = (float)((j->x_signed ? (int32_t)(int8_t)j->x[i] : (int32_t)j->x[i]) - j->xzp);
}

KILN_VECTORIZE static void dwf_out(void *ctx, int64_t begin, int64_t end)
{
    const dwf_job *j = ctx;
    const qconv_out *o = j->o;
    int64_t P = j->q->oh * j->q->ow;
    float lo = (float)(o->lo - o->yzp), hi = (float)(o->hi - o->yzp);
    for (int64_t t = begin; t < end; t++) {
        int64_t m = t % j->q->M;
        const float *yf = j->yf + t * P;
        if (!o->qlinear) {
            for (int64_t i = 0; i < P; i++) o->y32[t * P + i] = (int32_t)yf[i];
            continue;
        }
        kiln_cpu_requant_line(yf, NULL, P, o->bias ? (uint32_t)o->bias[m] : 0, o->mult[m], lo, hi, o->yzp, o->y8 + t * P);
    }
}

static kiln_status depthwise_float(kiln_run_ctx *c, const qgeom *q, const kiln_nn_geom *g, const kiln_value *X,
                                   const kiln_value *W, int32_t xz, const int32_t *wz, const qconv_out *o_in)
{
    kiln_scratch *scr = kiln_run_scratch(c);
    int64_t kk = q->kh * q->kw, P = q->oh * q->ow, planes = q->N * q->C;
    float *xf = kiln_scratch_get(scr, (size_t)(planes * q->H * q->W + 1) * sizeof(float));
    float *yf = kiln_scratch_get(scr, (size_t)(planes * P + 1) * sizeof(float));
    float *wf = kiln_scratch_get(scr, (size_t)(q->C * kk + 1) * sizeof(float));
    kiln_status rc = KILN_OK;
    if (!xf || !yf || !wf) {
        rc = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory for a depthwise convolution");
        goto out;
    }
    bool ws = W->dtype == KILN_DTYPE_INT8;
    for (int64_t m = 0; m < q->C; m++)
        for (int64_t i = 0; i < kk; i++) wf[m * kk + i] = (float)(ld8(W->data, m * kk + i, ws) - wz[m]);
    qconv_out o = *o_in;
    o.y32 = kiln_run_out(c, 0)->data, o.y8 = kiln_run_out(c, 0)->data;
    dwf_job j = {.q = q, .x = X->data, .x_signed = X->dtype == KILN_DTYPE_INT8, .xzp = xz, .xf = xf, .yf = yf, .o = &o};
    kiln_threadpool *pool = planes * q->H * q->W < (1 << 15) ? NULL : kiln_run_threadpool(c);
    kiln_threadpool_parallel_for(pool, planes, dwf_in, &j);
    static const kiln_act none = {.kind = KILN_ACT_NONE};
    if ((rc = kiln_cpu_conv_depthwise(c, g, xf, wf, NULL, &none, yf, q->N, q->C, q->H, q->W, q->oh, q->ow))) goto out;
    kiln_threadpool_parallel_for(planes * P < (1 << 15) ? NULL : kiln_run_threadpool(c), planes, dwf_out, &j);
out:
    kiln_scratch_put(scr, xf);
    kiln_scratch_put(scr, yf);
    kiln_scratch_put(scr, wf);
    return rc;
}

static kiln_status qconv_run(kiln_run_ctx *c, bool qlinear)
{
    const kiln_node *nd = kiln_run_node(c);
    int wi = qlinear ? 3 : 1;
    const kiln_value *X = kiln_run_in(c, 0), *W = kiln_run_in(c, wi);
    const kiln_value *xzp = kiln_run_in(c, 2), *wzp = kiln_run_in(c, qlinear ? 5 : 3);
    kiln_value *Y = kiln_run_out(c, 0);
    qgeom q;
    kiln_nn_geom geom;
    int32_t xz, yz = 0;
    if (!Y || !is_8bit(X->dtype) || !is_8bit(W->dtype) || !geometry(nd, X, W, Y, &q, &geom) ||
        !scalar_zp(xzp, X->dtype, &xz) || (wzp && (wzp->dtype != W->dtype || (wzp->numel != 1 && wzp->numel != q.M))))
        return kiln_cpu_reference(c);
    const kiln_value *xs = NULL, *ws = NULL, *ys = NULL, *B = NULL;
    if (qlinear) {
        xs = kiln_run_in(c, 1), ws = kiln_run_in(c, 4), ys = kiln_run_in(c, 6), B = kiln_run_in(c, 8);
        if (!is_8bit(Y->dtype) || !scalar_f32(xs) || !scalar_f32(ys) || !ws || ws->dtype != KILN_DTYPE_FLOAT32 ||
            (ws->numel != 1 && ws->numel != q.M) || !scalar_zp(kiln_run_in(c, 7), Y->dtype, &yz) ||
            (B && (B->dtype != KILN_DTYPE_INT32 || B->numel != q.M)))
            return kiln_cpu_reference(c);
    } else if (Y->dtype != KILN_DTYPE_INT32) {
        return kiln_cpu_reference(c);
    }
    bool direct = q.Cg == 1 && q.group > 1 && q.kh * q.kw <= 64;
    const qconv_state *st = nd->kernel_state;
    if (!direct && (!st || W != nd->in[wi]->init || st->group != q.group)) return kiln_cpu_reference(c);
    if (!Y->numel) return KILN_OK;

    /* per-channel parameters: W's zero points, the multipliers and the bias */
    kiln_scratch *scr = kiln_run_scratch(c);
    int32_t *wz = kiln_scratch_get(scr, (size_t)q.M * (2 * sizeof(int32_t) + sizeof(float)));
    if (!wz) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory for %lld channel parameters", (long long)q.M);
    int32_t *bias = wz + q.M;
    float *mult = (float *)(bias + q.M);
    for (int64_t m = 0; m < q.M; m++) {
        wz[m] = wzp ? (int32_t)kiln_load_i64(wzp->dtype, wzp->data, wzp->numel == 1 ? 0 : m) : 0;
        if (!qlinear) continue;
        float x_s = ((const float *)xs->data)[0], y_s = ((const float *)ys->data)[0];
        mult[m] = x_s * ((const float *)ws->data)[ws->numel == 1 ? 0 : m] / y_s;
        bias[m] = B ? ((const int32_t *)B->data)[m] : 0;
    }
    qconv_out o = {.qlinear = qlinear, .mult = mult, .bias = qlinear && B ? bias : NULL, .yzp = yz,
                   .lo = Y->dtype == KILN_DTYPE_INT8 ? -128 : 0, .hi = Y->dtype == KILN_DTYPE_INT8 ? 127 : 255};
    kiln_threadpool *pool = kiln_run_threadpool(c);
    kiln_status rc = KILN_OK;
    if (direct && q.group == q.C && q.M == q.C && X->rank == 4) {
        rc = depthwise_float(c, &q, &geom, X, W, xz, wz, &o);
        goto done;
    }
    bool one_wz = true;
    for (int64_t m = 1; m < q.M; m++) one_wz = one_wz && wz[m] == wz[0];
    if (!direct && one_wz && q.Mg <= 2 * q.N * q.oh * q.ow) {
        rc = cols_conv(c, &q, X, W, xz, wz[0], &o);
        goto done;
    }
    if (direct) {
        direct_job j = {.q = &q, .x = X->data, .w = W->data, .x_signed = X->dtype == KILN_DTYPE_INT8,
                        .w_signed = W->dtype == KILN_DTYPE_INT8, .xzp = xz, .wzp = wz, .o = o};
        j.o.y32 = Y->data, j.o.y8 = Y->data;
        kiln_threadpool_parallel_for(pool, q.N * q.M, direct_planes, &j);
        goto done;
    }
    int64_t P = q.oh * q.ow, K = q.Cg * q.kh * q.kw;
    int64_t rows = K ? CHUNK_A_BYTES / K : P;
    rows = rows < 64 ? 64 : rows;
    rows = rows > P ? P : rows;
    bool pointwise = q.kh == 1 && q.kw == 1 && q.sh == 1 && q.sw == 1 && q.ph == 0 && q.pw == 0 && q.oh == q.H &&
                     q.ow == q.W;
    uint8_t *a = kiln_scratch_get(scr, (size_t)(rows * K) + 64);
    int32_t *cbuf = kiln_scratch_get(scr, (size_t)(rows * q.Mg + 16) * sizeof(int32_t));
    uint8_t *xt = pointwise ? NULL : kiln_scratch_get(scr, (size_t)(q.H * q.W * q.Cg) + 64);
    if (!a || !cbuf || (!pointwise && !xt)) {
        kiln_scratch_put(scr, xt);
        kiln_scratch_put(scr, a);
        kiln_scratch_put(scr, cbuf);
        kiln_scratch_put(scr, wz);
        return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory for the im2col of %lld x %lld", (long long)rows,
                             (long long)K);
    }
    kiln_qgemm_ctx ctx = {.pool = pool, .scratch = scr};
    bool per_ch = wzp && wzp->numel != 1;
    for (int64_t n = 0; n < q.N && !rc; n++)
        for (int64_t g = 0; g < q.group && !rc; g++) {
            const uint8_t *xg = (const uint8_t *)X->data + (n * q.C + g * q.Cg) * q.H * q.W;
            o.mult = mult + g * q.Mg;
            o.bias = qlinear && B ? bias + g * q.Mg : NULL;
            o.y32 = (int32_t *)Y->data + (n * q.M + g * q.Mg) * P;
            o.y8 = (uint8_t *)Y->data + (n * q.M + g * q.Mg) * P;
            o.P = P;
            if (!pointwise) {
                im2col_job t = {.q = &q, .x = xg, .a = xt, .K = q.Cg};
                kiln_threadpool_parallel_for(pool, q.H * q.W, transpose_rows, &t);
            }
            for (int64_t p0 = 0; p0 < P && !rc; p0 += rows) {
                int64_t r = P - p0 < rows ? P - p0 : rows;
                im2col_job j = {.q = &q, .x = pointwise ? xg : xt, .a = a, .p0 = p0, .K = K, .zp = (uint8_t)xz};
                kiln_threadpool_parallel_for(pool, r, pointwise ? transpose_rows : im2col_rows, &j);
                o.p0 = p0;
                kiln_qgemm_args ga = {.M = r, .A = a, .lda = K, .a_signed = X->dtype == KILN_DTYPE_INT8, .a_zp = xz,
                                      .pb = st->pb[g], .b_zp = per_ch ? wz + g * q.Mg : wz,
                                      .n_bzp = per_ch ? q.Mg : 1, .C = cbuf, .ldc = q.Mg, .tile = out_tile,
                                      .tile_ctx = &o};
                rc = kiln_qgemm(&ctx, &ga);
            }
        }
    kiln_scratch_put(scr, xt);
    kiln_scratch_put(scr, cbuf);
    kiln_scratch_put(scr, a);
    if (rc) {
        kiln_scratch_put(scr, wz);
        return kiln_run_fail(c, rc, "int8 GEMM of the convolution failed (%s)", kiln_status_name(rc));
    }
done:
    kiln_scratch_put(scr, wz);
    return rc;
}

static kiln_status conv_integer_run(kiln_run_ctx *c) { return qconv_run(c, false); }
static kiln_status qlinear_conv_run(kiln_run_ctx *c) { return qconv_run(c, true); }

static kiln_kernel_fn select_conv_integer(kiln_node *n)
{
    if (n->n_in < 2 || !ir_8bit(n->in[0]) || !ir_8bit(n->in[1])) return NULL;
    pack_w(n, 1);
    return conv_integer_run;
}

static kiln_kernel_fn select_qlinear_conv(kiln_node *n)
{
    if (n->n_in < 8 || !ir_8bit(n->in[0]) || !ir_8bit(n->in[3])) return NULL;
    pack_w(n, 3);
    return qlinear_conv_run;
}

static const kiln_cpu_kernel kernels[] = {
    {"", "ConvInteger", select_conv_integer},
    {"", "QLinearConv", select_qlinear_conv},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_qconv, kernels);
