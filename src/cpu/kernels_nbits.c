/* kernels_nbits.c - com.microsoft MatMulNBits on float32 A and scales with constant weights:
 * per block a scale s and an offset -z*s prepared once at compile time (n->kernel_state), so
 * that y[n] = sum over blocks of s * dot(q, a) + (-z s) * sum(a). Where the node quantizes A to
 * int8 (accuracy_level 4, kiln_nbits_quantizes_a) every M runs src/cpu/nbits_q8.c. Otherwise up
 * to GEMV_MAX_M rows of A run the dequantize-on-the-fly GEMV (quantized bytes read once for all
 * rows, 16 weights per step widened to float: AVX-512 or AVX2+FMA by the CPU, portable C
 * otherwise), spread over N on the thread pool; more rows run the sgemm with A packed once and
 * W^T as its implicit operand, each tile's weights dequantized straight into the micro-kernel's
 * panels (nbits_f32.c; 128-token prompts 1.3-1.5x faster than dequantizing [1024, K] float
 * panels of W and packing them again). g_idx, float16 and weights fed at run time run the
 * reference. Measured (scripts/bench_peer.py, K = N = 4096, M = 1, block 128, 2 threads, shared
 * machine): 0.56 ms against ONNX Runtime's 0.35-0.37 ms at accuracy_level 0 (1.5-1.6x). Tried
 * and slower here: masks in place of shifts with A scaled by 16^-k (cvtepu32, 0.80 ms), 8 rows
 * of B per pass (0.91 ms), software prefetch (no change). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/scratch.h"
#include "core/threadpool.h"
#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "cpu/nbits_f32.h"
#include "cpu/nbits_q8.h"
#include "cpu/target.h"
#include "ops/llm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { GEMV_MAX_M = 8, ROWS_PER_TASK = 8 };

/* The prepared weights: B as given (read in place), per block scale and -zero*scale. */
typedef struct nbits_state {
    const uint8_t *q;   /* [N, n_blocks, blob], borrowed from the initializer */
    float *scale;       /* [N, n_blocks] per block */
    float *off;         /* [N, n_blocks] -z * scale for float zero points, else NULL */
    uint8_t *zq;        /* [N, n_blocks] uint8 zero points, else NULL; neither: all 2^(bits-1) */
    kiln_nbits_q8_w w;  /* the same weights for nbits_q8.c */
    kiln_nbits_f32_w f; /* and for nbits_f32.c */
    bool q8;            /* A quantized to int8 per block (kiln_nbits_quantizes_a) */
    const kiln_value *b_init;
    int level;          /* 2: AVX-512, 1: AVX2+FMA, 0: portable */
} nbits_state;

static void state_free(void *p)
{
    nbits_state *s = p;
    if (!s) return;
    free(s->scale);
    free(s->off);
    free(s->zq);
    free(s);
}

/* Block i's zero-point term per unit of sum(a), -z * scale: z its own zero point, or without
 * zero points zrest, the part of the common one the caller did not take off q itself. */
static inline float blk_off(const nbits_state *st, int64_t i, float zrest)
{
    return st->off ? st->off[i] : -(st->zq ? (float)st->zq[i] : zrest) * st->scale[i];
}

/* One call: A rows padded to n_blocks * block_size (zeros past K) with per-block sums. */
typedef struct gemv_job {
    const kiln_nbits_params *p;
    const nbits_state *st;
    const float *a;    /* [M, Kp] */
    const float *asum; /* [M, n_blocks] */
    const float *bias;
    float *y;          /* [M, N] */
    int64_t M, Kp;
} gemv_job;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* Rows [n0, n1) of Y for every row of A, NT rows of B at a time (NT independent accumulator
 * chains: one chain is bound by the FMA latency); the NT rows' bytes stay in L1 across A's rows. */
enum { NT = 4, PF_BYTES = 512 };

/* Prefetches, for each of a strip's NT rows (row bytes each, the strip at `strip`), the line
 * PF_BYTES past offset off, or past the row's end the same row of the next strip: rows of a
 * short K make a strip one 4 KB page, where the hardware prefetchers stop. Never faults. */
static inline void prefetch_strip(const uint8_t *strip, int64_t off, int64_t row)
{
    int64_t o = off + PF_BYTES;
    const uint8_t *p = o < row ? strip + o : strip + NT * row + (o - row);
    for (int r = 0; r < NT; r++) _mm_prefetch((const char *)(p + r * row), _MM_HINT_T0);
}

__attribute__((target("avx512f,avx512bw"))) static void gemv_rows_avx512(const gemv_job *j, int64_t n0, int64_t n1)
{
    const kiln_nbits_params *p = j->p;
    int64_t nb = p->n_blocks, bs = p->block_size, row = nb * p->blob;
    /* without offsets 4-bit weights take the common zero point off in their table */
    bool common = !j->st->off && !j->st->zq;
    float zq = common && p->bits == 4 ? (float)j->st->w.zero : 0.0f, zrest = (float)j->st->w.zero - zq;
    for (int64_t nt = n0; nt < n1; nt += NT) {
        int64_t nn = n1 - nt < NT ? n1 - nt : NT;
        for (int64_t m = 0; m < j->M; m++) {
            __m512 tot[NT];
            float zsum[NT] = {0};
            for (int r = 0; r < NT; r++) tot[r] = _mm512_setzero_ps();
            const float *am = j->a + m * j->Kp, *asum = j->asum + m * nb;
            for (int64_t blk = 0; blk < nb; blk++) {
                __m512 acc[NT];
                for (int r = 0; r < NT; r++) acc[r] = _mm512_setzero_ps();
                const uint8_t *q = j->st->q + nt * row + blk * p->blob;
                const float *a = am + blk * bs;
                if (m == 0 && (blk * p->blob) % 64 < p->blob) prefetch_strip(j->st->q + nt * row, blk * p->blob, row);
                if (p->bits == 4) {
                    /* 8 bytes broadcast to the 16 lanes as 64-bit words, lane i shifted right by
                     * 4 * (i / 2) within dword i % 2: lane i holds element perm4(i), the order
                     * nbits_run stored A in, in its low 4 bits; vpermps reads only those bits of
                     * an index, so a table of 0..15 as floats converts it (no mask, no cvt). */
                    const __m512i sh = _mm512_set_epi32(28, 28, 24, 24, 20, 20, 16, 16, 12, 12, 8, 8, 4, 4, 0, 0);
                    const __m512 lut = _mm512_sub_ps(_mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                     _mm512_set1_ps(zq)); /* q - z without offsets */
                    for (int64_t u = 0; u < bs; u += 16) {
                        __m512 av = _mm512_loadu_ps(a + u);
#pragma GCC unroll 4
                        for (int r = 0; r < NT; r++) { /* rows past nn repeat row nn - 1 */
                            const uint8_t *qr = q + (r < nn ? r : nn - 1) * row + u / 2;
                            int64_t q8;
                            memcpy(&q8, qr, 8); /* rows of odd blobs are not 8-byte aligned */
                            __m512i x = _mm512_set1_epi64(q8);
                            __m512 w = _mm512_permutexvar_ps(_mm512_srlv_epi32(x, sh), lut);
                            acc[r] = _mm512_fmadd_ps(w, av, acc[r]);
                        }
                    }
                } else {
                    for (int64_t u = 0; u < bs; u += 16) {
                        __m512 av = _mm512_loadu_ps(a + u);
#pragma GCC unroll 4
                        for (int r = 0; r < NT; r++) {
                            const uint8_t *qr = q + (r < nn ? r : nn - 1) * row + u;
                            __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qr)));
                            acc[r] = _mm512_fmadd_ps(w, av, acc[r]);
                        }
                    }
                }
#pragma GCC unroll 4
                for (int r = 0; r < NT; r++) { /* rows past nn repeat row nn - 1; only nn are stored */
                    int64_t i = (nt + (r < nn ? r : nn - 1)) * j->st->w.ns + blk;
                    tot[r] = _mm512_fmadd_ps(acc[r], _mm512_set1_ps(j->st->scale[i]), tot[r]);
                    if (!common || zrest) zsum[r] += blk_off(j->st, i, zrest) * asum[blk];
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < NT; r++) { /* a constant bound keeps tot and acc in registers */
                if (r >= nn) break;
                j->y[m * p->N + nt + r] = _mm512_reduce_add_ps(tot[r]) + zsum[r] + (j->bias ? j->bias[nt + r] : 0.0f);
            }
        }
    }
}

__attribute__((target("avx2,fma"))) static void gemv_rows_avx2(const gemv_job *j, int64_t n0, int64_t n1)
{
    const kiln_nbits_params *p = j->p;
    int64_t nb = p->n_blocks, bs = p->block_size, row = nb * p->blob;
    for (int64_t nt = n0; nt < n1; nt += NT) {
        int64_t nn = n1 - nt < NT ? n1 - nt : NT;
        for (int64_t m = 0; m < j->M; m++) {
            __m256 tot[NT];
            float zsum[NT] = {0};
            for (int r = 0; r < NT; r++) tot[r] = _mm256_setzero_ps();
            const float *am = j->a + m * j->Kp, *asum = j->asum + m * nb;
            for (int64_t blk = 0; blk < nb; blk++) {
                __m256 acc[NT];
                for (int r = 0; r < NT; r++) acc[r] = _mm256_setzero_ps();
                const uint8_t *q = j->st->q + nt * row + blk * p->blob;
                const float *a = am + blk * bs;
                if (m == 0 && (blk * p->blob) % 64 < p->blob) prefetch_strip(j->st->q + nt * row, blk * p->blob, row);
                if (p->bits == 4) {
                    /* 4 bytes broadcast to the 8 lanes, lane i shifted right by 4 i: element i */
                    const __m256i sh = _mm256_set_epi32(28, 24, 20, 16, 12, 8, 4, 0), m4 = _mm256_set1_epi32(15);
                    for (int64_t u = 0; u < bs; u += 16) {
                        __m256 a0 = _mm256_loadu_ps(a + u), a1 = _mm256_loadu_ps(a + u + 8);
#pragma GCC unroll 4
                        for (int r = 0; r < NT; r++) { /* rows past nn repeat row nn - 1 */
                            const uint8_t *qr = q + (r < nn ? r : nn - 1) * row + u / 2;
                            int32_t w0, w1;
                            memcpy(&w0, qr, 4), memcpy(&w1, qr + 4, 4);
                            __m256i x0 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w0), sh), m4);
                            __m256i x1 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w1), sh), m4);
                            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(x0), a0, acc[r]);
                            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(x1), a1, acc[r]);
                        }
                    }
                } else {
                    for (int64_t u = 0; u < bs; u += 16) {
                        __m256 a0 = _mm256_loadu_ps(a + u), a1 = _mm256_loadu_ps(a + u + 8);
#pragma GCC unroll 4
                        for (int r = 0; r < NT; r++) {
                            __m128i b = _mm_loadu_si128((const __m128i *)(q + (r < nn ? r : nn - 1) * row + u));
                            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), a0, acc[r]);
                            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8))), a1, acc[r]);
                        }
                    }
                }
#pragma GCC unroll 4
                for (int r = 0; r < NT; r++) { /* rows past nn repeat row nn - 1; only nn are stored */
                    int64_t i = (nt + (r < nn ? r : nn - 1)) * j->st->w.ns + blk;
                    tot[r] = _mm256_fmadd_ps(acc[r], _mm256_set1_ps(j->st->scale[i]), tot[r]);
                    zsum[r] += blk_off(j->st, i, (float)j->st->w.zero) * asum[blk];
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < NT; r++) { /* a constant bound keeps tot and acc in registers */
                if (r >= nn) break;
                __m128 h = _mm_add_ps(_mm256_castps256_ps128(tot[r]), _mm256_extractf128_ps(tot[r], 1));
                h = _mm_add_ps(h, _mm_movehl_ps(h, h));
                h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
                j->y[m * p->N + nt + r] = _mm_cvtss_f32(h) + zsum[r] + (j->bias ? j->bias[nt + r] : 0.0f);
            }
        }
    }
}
#endif

static void gemv_rows_c(const gemv_job *j, int64_t n0, int64_t n1)
{
    const kiln_nbits_params *p = j->p;
    int64_t nb = p->n_blocks, bs = p->block_size;
    for (int64_t m = 0; m < j->M; m++)
        for (int64_t n = n0; n < n1; n++) {
            float tot = 0;
            const uint8_t *q = j->st->q + n * nb * p->blob;
            for (int64_t blk = 0; blk < nb; blk++, q += p->blob) {
                const float *a = j->a + m * j->Kp + blk * bs;
                float acc = 0;
                for (int64_t u = 0; u < bs; u++) acc += (float)kiln_nbits_q_at(q, u, (int)p->bits) * a[u];
                int64_t i = n * j->st->w.ns + blk;
                tot += acc * j->st->scale[i] + blk_off(j->st, i, (float)j->st->w.zero) * j->asum[m * nb + blk];
            }
            j->y[m * p->N + n] = tot + (j->bias ? j->bias[n] : 0.0f);
        }
}

static void gemv_task(void *ctx, int64_t t0, int64_t t1)
{
    const gemv_job *j = ctx;
    int64_t n0 = t0 * ROWS_PER_TASK, n1 = t1 * ROWS_PER_TASK < j->p->N ? t1 * ROWS_PER_TASK : j->p->N;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (j->st->level == 2) return gemv_rows_avx512(j, n0, n1);
    if (j->st->level == 1) return gemv_rows_avx2(j, n0, n1);
#endif
    gemv_rows_c(j, n0, n1);
}

/* W^T as the sgemm's implicit op(B) at the sgemm's level: each tile's weights dequantized
 * straight into the micro-kernel's panels (nbits_f32.c). */
typedef struct wt_pack {
    const kiln_nbits_f32_w *w;
    kiln_gemm_level level;
} wt_pack;

static void wt_pack_b(void *ctx, float *dst, int64_t p0, int64_t kc, int64_t j0, int64_t n, int w)
{
    const wt_pack *j = ctx;
    kiln_nbits_f32_pack(j->level, j->w, dst, p0, kc, j0, n, w);
}

/* A [M, K] as the sgemm's packed A: rows [i0, i0 + m) of columns [p0, p0 + kc), micro-panels
 * [kc][w], rows past m zero. */
typedef struct a_pack {
    const float *A;
    int64_t K;
} a_pack;

static void a_pack_rows(void *ctx, float *dst, int64_t p0, int64_t kc, int64_t i0, int64_t m, int w)
{
    const a_pack *j = ctx;
    for (int64_t r0 = 0; r0 < m; r0 += w, dst += kc * w)
        for (int r = 0; r < w; r++) {
            const float *src = j->A + (i0 + r0 + r) * j->K + p0;
            if (r0 + r < m)
                for (int64_t k = 0; k < kc; k++) dst[k * w + r] = src[k];
            else
                for (int64_t k = 0; k < kc; k++) dst[k * w + r] = 0.0f;
        }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_A_PACK16 1
KILN_TARGET_BEGIN("avx512f")
#include "cpu/avx512_util.h"

/* a_pack_rows for panels of at most 16 rows: 16 columns of the panel's rows transposed in
 * registers per step, the columns' first w lanes stored (a panel row is w floats) */
static void a_pack_rows16(void *ctx, float *dst, int64_t p0, int64_t kc, int64_t i0, int64_t m, int w)
{
    const a_pack *j = ctx;
    if (w > 16) return a_pack_rows(ctx, dst, p0, kc, i0, m, w);
    for (int64_t r0 = 0; r0 < m; r0 += w, dst += kc * w) {
        int rows = m - r0 < w ? (int)(m - r0) : w;
        const float *src = j->A + (i0 + r0) * j->K + p0;
        for (int64_t k = 0; k < kc; k += 16) {
            __mmask16 live = kiln_lanes(kc - k);
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < rows ? _mm512_maskz_loadu_ps(live, src + i * j->K + k) : _mm512_setzero_ps();
            kiln_transpose16(r);
            int n = kc - k < 16 ? (int)(kc - k) : 16;
            for (int i = 0; i < n; i++) _mm512_mask_storeu_ps(dst + (k + i) * w, kiln_lanes(w), r[i]);
        }
    }
}

KILN_TARGET_END
#endif

static kiln_status nbits_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_nbits_params *p = n->params;
    const nbits_state *st = n->kernel_state;
    const kiln_value *A = kiln_run_in(c, NB_A), *bias = kiln_run_in(c, NB_BIAS);
    if (!st || kiln_run_in(c, NB_B) != st->b_init || A->dtype != KILN_DTYPE_FLOAT32) return kiln_cpu_reference(c);
    KILN_TRY(kiln_nbits_check(c, p));
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t K = p->K, N = p->N, M = A->numel / K, nb = p->n_blocks, Kp = nb * p->block_size;
    if (!M) return KILN_OK;
    kiln_threadpool *pool = kiln_run_threadpool(c);
    struct kiln_scratch *scr = kiln_run_scratch(c);
    if (st->q8) {
        kiln_status rc = kiln_nbits_q8_gemm(KILN_NBITS_Q8_AUTO, pool, scr, &st->w, M, A->data, bias ? bias->data : NULL, Y->data);
        return rc ? kiln_run_fail(c, rc, "int8 MatMulNBits failed (%s)", kiln_status_name(rc)) : KILN_OK;
    }
    if (M > GEMV_MAX_M) {
        /* A packed once; W^T dequantized tile by tile into the micro-kernel's panels */
        kiln_gemm_ctx g = {.pool = pool, .scratch = scr, .level = kiln_gemm_level_detect(), .pack_b_panels = true};
        a_pack ap = {A->data, K};
        wt_pack wp = {&st->f, g.level};
        kiln_gemm_packed_a *pa = NULL;
        kiln_gemm_pack_fn pack = a_pack_rows;
#if HAVE_A_PACK16
        if (g.level == KILN_GEMM_LEVEL_AVX512) pack = a_pack_rows16;
#endif
        kiln_status rc = kiln_gemm_packed_a_create_from(&g, M, K, pack, &ap, &pa);
        kiln_gemm_epilogue ep = {.bias = bias ? (const float *)bias->data : NULL};
        if (!rc) rc = kiln_sgemm_packed_a(&g, pa, N, NULL, 0, wt_pack_b, &wp, Y->data, N, &ep);
        kiln_gemm_packed_a_free(pa);
        return rc ? kiln_run_fail(c, rc, "sgemm failed (%s)", kiln_status_name(rc)) : KILN_OK;
    }
    float *a = kiln_scratch_get(scr, (size_t)(M * (Kp + nb)) * sizeof *a);
    if (!a) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    float *asum = a + M * Kp;
    for (int64_t m = 0; m < M; m++) {
        const float *src = (const float *)A->data + m * K;
        memcpy(a + m * Kp, src, (size_t)K * sizeof *a);
        memset(a + m * Kp + K, 0, (size_t)(Kp - K) * sizeof *a);
        if (st->level == 2 && p->bits == 4) /* lane i of each 16 holds element perm4(i) */
            for (int64_t u = 0; u < Kp; u += 16) {
                float t[16];
                memcpy(t, a + m * Kp + u, sizeof t);
                for (int i = 0; i < 16; i++) a[m * Kp + u + i] = t[(i & 1) * 8 + i / 2];
            }
        for (int64_t blk = 0; blk < nb; blk++) {
            float s = 0;
            for (int64_t u = 0; u < p->block_size; u++) s += a[m * Kp + blk * p->block_size + u];
            asum[m * nb + blk] = s;
        }
    }
    gemv_job j = {p, st, a, asum, bias ? bias->data : NULL, Y->data, M, Kp};
    bool small = (double)M * (double)N * (double)K < KILN_NBITS_MIN_PARALLEL_MACS; /* see nbits_q8.h */
    kiln_threadpool_parallel_for(small ? NULL : pool, (N + ROWS_PER_TASK - 1) / ROWS_PER_TASK, gemv_task, &j);
    kiln_scratch_put(scr, a);
    return KILN_OK;
}

/* Prepares the scales and offsets of constant float32 weights (no g_idx); NULL otherwise. */
static kiln_kernel_fn select_nbits(kiln_node *n)
{
    const kiln_nbits_params *p = n->params;
    if (!p || n->n_in < 3 || !kiln_ir_is_f32(n->in[NB_A]) || (n->n_in > NB_GIDX && n->in[NB_GIDX])) return NULL;
    const kiln_value *B = kiln_ir_constant(n->in[NB_B]), *S = kiln_ir_constant(n->in[NB_SCALES]);
    const kiln_value *zp = n->n_in > NB_ZP && n->in[NB_ZP] ? kiln_ir_constant(n->in[NB_ZP]) : NULL;
    bool has_zp = n->n_in > NB_ZP && n->in[NB_ZP];
    int64_t nb = p->N * p->n_blocks;
    if (!B || !S || (has_zp && !zp) || B->dtype != KILN_DTYPE_UINT8 || B->numel != nb * p->blob ||
        S->dtype != KILN_DTYPE_FLOAT32 || S->numel != nb)
        return NULL;
    if (zp && !(zp->dtype == KILN_DTYPE_UINT8 && zp->numel == p->N * ((p->n_blocks * p->bits + 7) / 8)) &&
        !(zp->dtype == KILN_DTYPE_FLOAT32 && zp->numel == nb))
        return NULL;
    if (n->kernel_state) return nbits_run;
    /* zero points kept as given: a byte per block (uint8), -z * scale (float), or none */
    int64_t ns = p->n_blocks;
    bool fzp = zp && zp->dtype != KILN_DTYPE_UINT8;
    nbits_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->scale = malloc((size_t)nb * sizeof *st->scale);
    if (fzp) st->off = malloc((size_t)nb * sizeof *st->off);
    else if (zp) st->zq = malloc((size_t)nb);
    if (!st->scale || (fzp && !st->off) || (zp && !fzp && !st->zq)) {
        state_free(st);
        return NULL;
    }
    st->q = B->data, st->b_init = B, st->q8 = kiln_nbits_quantizes_a(n, fzp);
    st->w = (kiln_nbits_q8_w){p->K, p->N, p->block_size, st->q, st->scale, st->zq, 1 << (p->bits - 1), ns};
    st->f = (kiln_nbits_f32_w){p->K, p->N, p->block_size, (int)p->bits, st->q, st->scale, st->off, st->zq,
                               1 << (p->bits - 1), ns};
    for (int64_t r = 0; r < p->N; r++)
        for (int64_t blk = 0; blk < p->n_blocks; blk++) {
            float s, z;
            kiln_nbits_block(p, S, zp, r, blk, &s, &z);
            st->scale[r * ns + blk] = s;
            if (st->off) st->off[r * ns + blk] = -z * s;
            if (st->zq) st->zq[r * ns + blk] = (uint8_t)z;
        }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) st->level = 2;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) st->level = 1;
#endif
    n->kernel_state = st;
    n->kernel_state_free = state_free;
    return nbits_run;
}

static const kiln_cpu_kernel kernels[] = {{"com.microsoft", "MatMulNBits", select_nbits}};

KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_nbits, kernels);
