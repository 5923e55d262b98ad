/* winograd.c - 3x3 stride-1 float32 convolutions by Winograd's F(2x2, 3x3) (see winograd.h).
 *
 * With g a 3x3 filter, d a 4x4 input tile and the 2x2 output tile y:
 *     U = G g G^T,  V = B^T d B,  y = A^T (U .* V) A,
 *     G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1],  B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],
 *     A^T = [1 1 1 0; 0 1 -1 -1].
 * Summed over the input channels, U .* V for each of the 16 points xi = (i, j) of the tile is a
 * GEMM: M_xi [mg, tiles] = U_xi [mg, cg] * V_xi [cg, tiles]. A call runs over blocks of tile rows
 * in three parallel phases: the input transform (V, per channel and tile row), the 16 GEMMs
 * (one per point, each on one thread), and the output transform with bias, residual and
 * activation (per output channel and tile row). */
#include "cpu/winograd.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/scratch.h"
#include "cpu/kernels.h"

struct kiln_winograd {
    int64_t mg, cg;
    kiln_gemm_packed_a *u[16]; /* U_xi [mg, cg], xi = i * 4 + j */
};

void kiln_cpu_winograd_free(kiln_winograd *wg)
{
    if (!wg) return;
    for (int xi = 0; xi < 16; xi++) kiln_gemm_packed_a_free(wg->u[xi]);
    free(wg);
}

kiln_winograd *kiln_cpu_winograd_pack(const float *w, int64_t mg, int64_t cg)
{
    if (mg <= 0 || cg <= 0) return NULL;
    kiln_winograd *wg = calloc(1, sizeof *wg);
    float *u = malloc((size_t)(16 * mg * cg) * sizeof *u); /* [16][mg][cg] */
    if (!wg || !u) {
        free(wg);
        free(u);
        return NULL;
    }
    wg->mg = mg, wg->cg = cg;
    for (int64_t m = 0; m < mg; m++)
        for (int64_t c = 0; c < cg; c++) {
            const float *g = w + (m * cg + c) * 9;
            float gg[4][3]; /* G g */
            for (int k = 0; k < 3; k++) {
                gg[0][k] = g[k];
                gg[1][k] = 0.5f * (g[k] + g[3 + k] + g[6 + k]);
                gg[2][k] = 0.5f * (g[k] - g[3 + k] + g[6 + k]);
                gg[3][k] = g[6 + k];
            }
            for (int i = 0; i < 4; i++) { /* (G g) G^T */
                float r[4] = {gg[i][0], 0.5f * (gg[i][0] + gg[i][1] + gg[i][2]),
                              0.5f * (gg[i][0] - gg[i][1] + gg[i][2]), gg[i][2]};
                for (int j = 0; j < 4; j++) u[((i * 4 + j) * mg + m) * cg + c] = r[j];
            }
        }
    kiln_gemm_ctx ctx = {0};
    for (int xi = 0; xi < 16; xi++)
        if (kiln_gemm_packed_a_create(&ctx, mg, cg, u + xi * mg * cg, cg, &wg->u[xi])) {
            kiln_cpu_winograd_free(wg);
            wg = NULL;
            break;
        }
    free(u);
    return wg;
}

/* One call's block of tile rows [ty0, ty0 + rows), tw tiles each: t = (ty - ty0) * tw + tx. */
typedef struct wino_job {
    const kiln_winograd *wg;
    kiln_gemm_ctx serial; /* the GEMMs of the second phase, one thread each */
    const float *P;
    int64_t hq, wq, oh, ow, tw;
    int64_t ty0, rows, T; /* T = rows * tw */
    float *V;             /* [16][cg][T] */
    float *M;             /* [16][mg][T] */
    const float *bias, *res;
    const kiln_act *act;
    float *y;
    atomic_int st; /* the first GEMM failure */
} wino_job;

/* Sixteen tiles side by side: GCC/clang vectors that the AVX-512 clones of the transforms run
 * as one register and the portable ones as several. Reads of a vector may run up to 16 floats
 * past a row's last tile (into the next row, or the slack the buffers carry: SLACK); what the
 * lanes past the last tile compute is never stored. */
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
enum { VW = 16, SLACK = KILN_WINOGRAD_SLACK };

/* *v = p[0..16) (no alignment assumed; a function returning v16f would change the ABI). */
static inline __attribute__((always_inline)) void v16_load(v16f *v, const float *p) { memcpy(v, p, sizeof *v); }

/* B^T d B for the tiles whose padded columns start at 2k, 2k+1, 2k+2, 2k+3: e and o are the
 * even and odd padded columns of the four rows, at k and k + 1; v[xi] gets V_xi. */
static inline __attribute__((always_inline)) void input_tile(const v16f e[4], const v16f o[4], const v16f e1[4],
                                                             const v16f o1[4], v16f v[16])
{
    v16f re[4] = {e[0] - e[2], e[1] + e[2], e[2] - e[1], e[1] - e[3]};
    v16f ro[4] = {o[0] - o[2], o[1] + o[2], o[2] - o[1], o[1] - o[3]};
    v16f re1[4] = {e1[0] - e1[2], e1[1] + e1[2], e1[2] - e1[1], e1[1] - e1[3]};
    v16f ro1[4] = {o1[0] - o1[2], o1[1] + o1[2], o1[2] - o1[1], o1[1] - o1[3]};
    for (int i = 0; i < 4; i++) {
        v[i * 4 + 0] = re[i] - re1[i];
        v[i * 4 + 1] = ro[i] + re1[i];
        v[i * 4 + 2] = re1[i] - ro[i];
        v[i * 4 + 3] = ro[i] - ro1[i];
    }
}

/* Items are (channel, tile row) pairs. */
static inline __attribute__((always_inline)) void input_rows(const wino_job *j, int64_t begin, int64_t end)
{
    int64_t cg = j->wg->cg, xs = cg * j->T, tw = j->tw;
    for (int64_t it = begin; it < end; it++) {
        int64_t c = it / j->rows, r = it % j->rows, ty = j->ty0 + r;
        const float *er[4], *orow[4];
        for (int q = 0; q < 4; q++) {
            er[q] = j->P + ((c * 2 + 0) * j->hq + 2 * ty + q) * j->wq;
            orow[q] = j->P + ((c * 2 + 1) * j->hq + 2 * ty + q) * j->wq;
        }
        float *v = j->V + c * j->T + r * tw;
        for (int64_t k = 0; k < tw; k += VW) {
            v16f e[4], o[4], e1[4], o1[4], t[16];
            for (int q = 0; q < 4; q++) {
                v16_load(&e[q], er[q] + k), v16_load(&o[q], orow[q] + k);
                v16_load(&e1[q], er[q] + k + 1), v16_load(&o1[q], orow[q] + k + 1);
            }
            input_tile(e, o, e1, o1, t);
            if (k + VW <= tw) {
                for (int xi = 0; xi < 16; xi++) memcpy(v + xi * xs + k, &t[xi], sizeof t[xi]);
            } else {
                for (int xi = 0; xi < 16; xi++) memcpy(v + xi * xs + k, &t[xi], (size_t)(tw - k) * sizeof(float));
            }
        }
    }
}

static void input_transform(void *ctx, int64_t begin, int64_t end) { input_rows(ctx, begin, end); }

/* Items are the 16 points. */
static void point_gemms(void *ctx, int64_t begin, int64_t end)
{
    wino_job *j = ctx;
    int64_t cg = j->wg->cg, mg = j->wg->mg, T = j->T;
    for (int64_t xi = begin; xi < end; xi++) {
        kiln_status st = kiln_sgemm_packed_a(&j->serial, j->wg->u[xi], T, j->V + xi * cg * T, T, NULL, NULL,
                                             j->M + xi * mg * T, T, NULL);
        if (st) {
            int none = KILN_OK;
            atomic_compare_exchange_strong(&j->st, &none, (int)st);
        }
    }
}

/* A^T m A for sixteen tiles: the outputs of row 0 (y00, y01) and row 1 (y10, y11). */
static inline __attribute__((always_inline)) void output_tile(const v16f m[16], v16f y[4])
{
    v16f s0[4], s1[4];
    for (int c = 0; c < 4; c++) {
        s0[c] = m[c] + m[4 + c] + m[8 + c];
        s1[c] = m[4 + c] - m[8 + c] - m[12 + c];
    }
    y[0] = s0[0] + s0[1] + s0[2];
    y[1] = s0[1] - s0[2] - s0[3];
    y[2] = s1[0] + s1[1] + s1[2];
    y[3] = s1[1] - s1[2] - s1[3];
}

/* The first n of a0 b0 a1 b1 ... a15 b15 to d. */
static inline __attribute__((always_inline)) void store_pairs(float *d, const v16f *a_, const v16f *b_, int64_t n)
{
    v16f a = *a_, b = *b_;
    v16f p[2];
#if defined(__clang__)
    p[0] = __builtin_shufflevector(a, b, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    p[1] = __builtin_shufflevector(a, b, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
#else
    p[0] = __builtin_shuffle(a, b, (v16i){0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23});
    p[1] = __builtin_shuffle(a, b, (v16i){8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31});
#endif
    if (n >= 2 * VW) memcpy(d, p, sizeof p);
    else memcpy(d, p, (size_t)n * sizeof *d);
}

/* Items are (output channel, tile row) pairs. */
static inline __attribute__((always_inline)) void output_rows(const wino_job *j, int64_t begin, int64_t end)
{
    int64_t mg = j->wg->mg, xs = mg * j->T, ow = j->ow, oh = j->oh;
    for (int64_t it = begin; it < end; it++) {
        int64_t co = it / j->rows, r = it % j->rows, oy = 2 * (j->ty0 + r);
        const float *m = j->M + co * j->T + r * j->tw;
        float *y0 = j->y + (co * oh + oy) * ow, *y1 = oy + 1 < oh ? y0 + ow : NULL;
        for (int64_t k = 0; 2 * k < ow; k += VW) {
            v16f t[16], y[4];
            for (int xi = 0; xi < 16; xi++) v16_load(&t[xi], m + xi * xs + k);
            output_tile(t, y);
            store_pairs(y0 + 2 * k, &y[0], &y[1], ow - 2 * k);
            if (y1) store_pairs(y1 + 2 * k, &y[2], &y[3], ow - 2 * k);
        }
        if (j->bias || j->res || j->act->kind != KILN_ACT_NONE) {
            float b = j->bias ? j->bias[co] : 0.0f;
            const float *res = j->res ? j->res + (co * oh + oy) * ow : NULL;
            kiln_cpu_act_apply_sum(j->act, y0, res, ow, b);
            if (y1) kiln_cpu_act_apply_sum(j->act, y1, res ? res + ow : NULL, ow, b);
        }
    }
}

static void output_transform(void *ctx, int64_t begin, int64_t end) { output_rows(ctx, begin, end); }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f"))) static void input_transform_avx512(void *ctx, int64_t begin, int64_t end)
{
    input_rows(ctx, begin, end);
}

__attribute__((target("avx512f"))) static void output_transform_avx512(void *ctx, int64_t begin, int64_t end)
{
    output_rows(ctx, begin, end);
}
#endif

enum { BLOCK_FLOATS = 1 << 20 }; /* V and M of one block of tile rows: 4 MB, within L2 */

kiln_status kiln_cpu_winograd_run(const kiln_gemm_ctx *ctx, const kiln_winograd *wg, const float *P, int64_t hq,
                                  int64_t wq, int64_t oh, int64_t ow, const float *bias, const float *res,
                                  const kiln_act *act, float *y)
{
    int64_t th = (oh + 1) / 2, tw = (ow + 1) / 2, mg = wg->mg, cg = wg->cg;
    if (th == 0 || tw == 0) return KILN_OK;
    int64_t rows = BLOCK_FLOATS / (16 * (cg + mg) * tw);
    rows = rows < 1 ? 1 : rows > th ? th : rows;
    wino_job j = {.wg = wg, .serial = {.scratch = ctx->scratch, .level = ctx->level}, .P = P, .hq = hq, .wq = wq,
                  .oh = oh, .ow = ow, .tw = tw, .bias = bias, .res = res, .act = act, .y = y};
    atomic_init(&j.st, KILN_OK);
    j.V = kiln_scratch_get(ctx->scratch, (size_t)(16 * cg * rows * tw) * sizeof *j.V);
    j.M = kiln_scratch_get(ctx->scratch, (size_t)(16 * mg * rows * tw + SLACK) * sizeof *j.M);
    kiln_parallel_fn in = input_transform, out = output_transform;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (kiln_gemm_level_detect() == KILN_GEMM_LEVEL_AVX512) in = input_transform_avx512, out = output_transform_avx512;
#endif
    kiln_status st = j.V && j.M ? KILN_OK : KILN_ERR_NOMEM;
    if (j.M) memset(j.M + 16 * mg * rows * tw, 0, SLACK * sizeof *j.M); /* read by the last row's vectors */
    /* the 16 GEMMs side by side, one thread each, while that keeps the threads busy */
    bool side_by_side = kiln_threadpool_size(ctx->pool) <= 8;
    for (j.ty0 = 0; j.ty0 < th && !st; j.ty0 += j.rows) {
        j.rows = th - j.ty0 < rows ? th - j.ty0 : rows;
        j.T = j.rows * tw;
        kiln_threadpool_parallel_for(ctx->pool, cg * j.rows, in, &j);
        if (side_by_side) {
            kiln_threadpool_parallel_for(ctx->pool, 16, point_gemms, &j);
            st = (kiln_status)atomic_load(&j.st);
        } else {
            for (int xi = 0; xi < 16 && !st; xi++)
                st = kiln_sgemm_packed_a(ctx, wg->u[xi], j.T, j.V + xi * cg * j.T, j.T, NULL, NULL,
                                         j.M + xi * mg * j.T, j.T, NULL);
        }
        if (!st) kiln_threadpool_parallel_for(ctx->pool, mg * j.rows, out, &j);
    }
    kiln_scratch_put(ctx->scratch, j.V);
    kiln_scratch_put(ctx->scratch, j.M);
    return st;
}
