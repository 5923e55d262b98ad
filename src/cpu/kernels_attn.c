/* kernels_attn.c - float32 Attention (ONNX opset 23, what src/passes/fuse_attention.c makes of
 * MatMul -> scale -> mask Add -> Softmax -> MatMul) in one pass per block of query rows:
 * S = scale * Q K^T on the packed sgemm, S += mask, row softmax (AVX-512 where the CPU has it),
 * Y = S V written straight into Y's layout. Blocks of (batch, head, query rows) are spread over
 * the thread pool; the score block [QB, total] stays in cache. Covered: 3-D (q_num_heads) and
 * 4-D inputs, grouped K/V heads, a float32 additive mask broadcast to [B, Hq, Sq, total] (keys
 * past its last dim are masked, as the spec pads), no past, not causal, no softcap, only Y.
 * Heads of up to 32 key columns run in one pass over the keys instead (flash_block: 16 query
 * rows per vector, running row maxima, nothing of size Sq x total written), where the packed
 * sgemm's 16-deep products and the passes over the scores cost more than the arithmetic: the
 * TTS-like encoder's 4 heads of 16 at 512 tokens, one Attention node, 0.60 ms on two threads by
 * the two-pass path, 0.50 by a first one-pass kernel (keys in the lanes), 0.40 by this one
 * (best of 20 runs, alternating processes); at 32 and 64 columns the two-pass path was faster
 * than the first one-pass kernel (2.62 against 2.71 ms, 4.3 against 5.5 ms, 12 heads at 512).
 * Everything else runs the reference kernel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/scratch.h"
#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "core/threadpool.h"
#include "cpu/vecmath.h"
#include "ops/util.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Query rows per block, and blocks per task: a task packs its head's K and V once for all its
 * blocks (up to QB * QG query rows) */
enum { QB = 64, QG = 4 };
/* Heads of up to this many V columns multiply the probabilities by V without packing it */
enum { PV_DIRECT_MAX = 128 };

/* One Attention call, shared by the threads that run its blocks. Row strides in elements. */
typedef struct attn_job {
    const float *q, *k, *v, *mask;
    float *y;
    int64_t B, Hq, group, Sq, total, Dk, Dv;
    int64_t q_b, q_h, q_s;   /* Q element (b, h, i, 0) at b*q_b + h*q_h + i*q_s */
    int64_t k_b, k_h, k_s;   /* same for K (kv head) */
    int64_t v_b, v_h, v_s;
    int64_t y_b, y_h, y_s;
    int64_t m_b, m_h, m_s;   /* mask strides over [B, Hq, Sq] (0 where broadcast); keys contiguous */
    int64_t m_len;           /* mask columns (<= total); keys past it are masked */
    float scale;
    int64_t q_blocks;        /* blocks of QB rows per (b, h) */
    int64_t q_tasks;         /* tasks per (b, h): groups of up to QG blocks */
    bool avx512;
    bool flash;              /* heads run by flash_task (AVX-512, small heads) */
    struct kiln_scratch *scratch; /* where the score blocks and packed K and V come from */
    kiln_status st;          /* first failure of any block (sgemm out of memory) */
} attn_job;

/* Softmax of a score row in place after adding the mask row m (NULL: none; keys at or past
 * m_len are -inf). A row with no attendable key (all -inf) becomes zeros, as the spec says. */
static void softmax_row_v4(float *s, int64_t n, const float *m, int64_t m_len)
{
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        float x = m ? (j < m_len ? s[j] + m[j] : -INFINITY) : s[j];
        s[j] = x;
        mx = x > mx ? x : mx;
    }
    if (mx == -INFINITY) {
        memset(s, 0, (size_t)n * sizeof *s);
        return;
    }
    v4f m4 = v4_splat(mx), acc = v4_splat(0.0f);
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        v4f e = v4_exp_flush(v4_load(s + j) - m4);
        v4_store(s + j, e);
        acc += e;
    }
    float sum = v4_hsum(acc);
    for (; j < n; j++) {
        float b[4] = {s[j] - mx, -INFINITY, -INFINITY, -INFINITY};
        v4f e = v4_exp_flush(v4_load(b));
        s[j] = e[0];
        sum += e[0];
    }
    float inv = 1.0f / sum;
    for (j = 0; j < n; j++) s[j] *= inv;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AVX512 __attribute__((target("avx512f")))

/* e^x for x <= 0, as softmax takes it (s - max): 2^n 2^f with n = round(x log2(e)), 2^f by its
 * degree-6 Taylor polynomial and the power of two by scalef (max relative error 2.3e-7); 0 below
 * ln FLT_MIN (no subnormals), NaN kept; no clamp above. 14 operations, against 16 for the Cephes
 * polynomial of v4_exp: the one-pass attention kernel (which the exponentials bound) 0.95-0.97
 * of that on one thread. */
static inline AVX512 __m512 exp16(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-87.33f), log2e = _mm512_set1_ps(1.44269504088896341f);
    __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(lo, x); /* NaN stays (max_ps returns its second operand) */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* f = x log2(e) - n in [-0.5, 0.5]: log2(e) as a float plus the rest, to keep the relative
     * error near 1e-7 down to e^-87 (without the rest 1.4e-6 there) */
    __m512 f = _mm512_fmadd_ps(x, _mm512_set1_ps(1.925962989e-8f), _mm512_fmsub_ps(x, log2e, n));
    __m512 p = _mm512_set1_ps(1.5403530393381608e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(~tiny, _mm512_scalef_ps(p, n));
}

/* With inv not NULL the row is left unnormalised (exponentials) and *inv receives the factor
 * that normalises it (0 for a row with no attendable key). */
static AVX512 void softmax_row_avx512(float *s, int64_t n, const float *m, int64_t m_len, float *inv)
{
    int64_t lim = m ? (m_len < n ? m_len : n) : n; /* keys past lim are -inf */
    __m512 mx16 = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j < lim; j += 16) {
        __mmask16 k = j + 16 <= lim ? (__mmask16)0xFFFF : (__mmask16)((1u << (lim - j)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(k, s + j);
        if (m) {
            x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(k, m + j));
            _mm512_mask_storeu_ps(s + j, k, x);
        }
        mx16 = _mm512_mask_max_ps(mx16, k, mx16, x);
    }
    float mx = _mm512_reduce_max_ps(mx16);
    /* a NaN anywhere: max_ps may have dropped it; the exp below carries it to the sum */
    if (mx == -INFINITY) {
        memset(s, 0, (size_t)n * sizeof *s);
        if (inv) *inv = 0.0f;
        return;
    }
    __m512 m16 = _mm512_set1_ps(mx), acc = _mm512_setzero_ps(), acc1 = acc, acc2 = acc, acc3 = acc;
    /* four independent exponentials per step: one alone is a chain of dependent FMAs */
    for (j = 0; j + 64 <= lim; j += 64) {
        __m512 e0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), m16));
        __m512 e1 = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j + 16), m16));
        __m512 e2 = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j + 32), m16));
        __m512 e3 = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j + 48), m16));
        _mm512_storeu_ps(s + j, e0);
        _mm512_storeu_ps(s + j + 16, e1);
        _mm512_storeu_ps(s + j + 32, e2);
        _mm512_storeu_ps(s + j + 48, e3);
        acc = _mm512_add_ps(acc, e0);
        acc1 = _mm512_add_ps(acc1, e1);
        acc2 = _mm512_add_ps(acc2, e2);
        acc3 = _mm512_add_ps(acc3, e3);
    }
    acc = _mm512_add_ps(_mm512_add_ps(acc, acc1), _mm512_add_ps(acc2, acc3));
    for (; j < lim; j += 16) {
        __mmask16 k = j + 16 <= lim ? (__mmask16)0xFFFF : (__mmask16)((1u << (lim - j)) - 1);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), m16));
        e = _mm512_maskz_mov_ps(k, e);
        _mm512_mask_storeu_ps(s + j, k, e);
        acc = _mm512_add_ps(acc, e);
    }
    float f = 1.0f / _mm512_reduce_add_ps(acc);
    if (inv) {
        *inv = f;
    } else {
        __m512 f16 = _mm512_set1_ps(f);
        for (j = 0; j < lim; j += 16) {
            __mmask16 k = j + 16 <= lim ? (__mmask16)0xFFFF : (__mmask16)((1u << (lim - j)) - 1);
            _mm512_mask_storeu_ps(s + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j), f16));
        }
    }
    if (lim < n) memset(s + lim, 0, (size_t)(n - lim) * sizeof *s);
}

/* acc[h][r][q] += sr[r][p] * v[p][16 q ..] over p < n, for four rows r and nv (1 to 4) vectors
 * of 16 columns (the last one's lanes `last`). At nv <= 2 even and odd p go to acc[0] and
 * acc[1], so there are 8 to 16 independent FMA chains at every width (4 alone leave the FMA
 * units waiting on latency); at nv > 2 only acc[0]. Inlined with nv a constant, the arrays
 * live in registers. */
static inline __attribute__((always_inline)) AVX512 void pv_sum(const float *const *sr, int64_t n, const float *v,
                                                                 int64_t v_s, int nv, __mmask16 last,
                                                                 __m512 acc[2][4][4])
{
    const int sets = nv <= 2 ? 2 : 1;
    int64_t p = 0;
    for (; p + sets <= n; p += sets) {
#pragma GCC unroll 2
        for (int h = 0; h < sets; h++) {
            const float *vr = v + (p + h) * v_s;
            __m512 vv[4];
#pragma GCC unroll 4
            for (int q = 0; q < nv; q++)
                vv[q] = q == nv - 1 ? _mm512_maskz_loadu_ps(last, vr + 16 * q) : _mm512_loadu_ps(vr + 16 * q);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                __m512 b = _mm512_set1_ps(sr[r][p + h]);
#pragma GCC unroll 4
                for (int q = 0; q < nv; q++) acc[h][r][q] = _mm512_fmadd_ps(b, vv[q], acc[h][r][q]);
            }
        }
    }
    if (p < n) { /* an odd last p */
        const float *vr = v + p * v_s;
#pragma GCC unroll 4
        for (int q = 0; q < nv; q++) {
            __m512 vq = q == nv - 1 ? _mm512_maskz_loadu_ps(last, vr + 16 * q) : _mm512_loadu_ps(vr + 16 * q);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) acc[0][r][q] = _mm512_fmadd_ps(_mm512_set1_ps(sr[r][p]), vq, acc[0][r][q]);
        }
    }
}

/* Four rows and nv vectors of 16 columns of the product below, from column c0: pv_sum over
 * all keys, each row scaled by its inv as it is stored. */
static inline __attribute__((always_inline)) AVX512 void pv_block(const float *const *sr, const float *inv, int rows,
                                                                   int64_t total, const float *v, int64_t v_s,
                                                                   int nv, __mmask16 last, float *y, int64_t y_s)
{
    __m512 acc[2][4][4];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
            for (int q = 0; q < nv; q++) acc[h][r][q] = _mm512_setzero_ps();
    pv_sum(sr, total, v, v_s, nv, last, acc);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        if (r >= rows) break;
        __m512 f = _mm512_set1_ps(inv[r]);
#pragma GCC unroll 4
        for (int q = 0; q < nv; q++)
            _mm512_mask_storeu_ps(y + r * y_s + 16 * q, q == nv - 1 ? last : (__mmask16)0xFFFF,
                                  _mm512_mul_ps(_mm512_add_ps(acc[0][r][q], acc[1][r][q]), f));
    }
}

/* y[r][0:dv] = inv[r] * sum over p < total of s[r][p] * v[p][0:dv], for r < rows: the probabilities
 * times V with both read where they are (no packing, which for the few columns of a head
 * costs more than the product). Four rows and up to 64 columns at a time (pv_block); a row
 * past `rows` repeats the last one and is not stored. */
static AVX512 void probs_times_v_avx512(const float *s, const float *inv, int64_t ld_s, int64_t rows, int64_t total,
                                        const float *v, int64_t v_s, int64_t dv, float *y, int64_t y_s)
{
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
        const float *sr[4];
        float iv[4];
        for (int r = 0; r < 4; r++) {
            int64_t i = r0 + r < rows ? r0 + r : rows - 1;
            sr[r] = s + i * ld_s;
            iv[r] = inv[i];
        }
        int n = rows - r0 < 4 ? (int)(rows - r0) : 4;
        for (int64_t c0 = 0; c0 < dv; c0 += 64) {
            int64_t w = dv - c0 < 64 ? dv - c0 : 64;
            int nv = (int)((w + 15) / 16);
            int64_t tail = w - 16 * (nv - 1);
            __mmask16 last = tail == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << tail) - 1);
            float *yc = y + r0 * y_s + c0;
            const float *vc = v + c0;
            switch (nv) {
            case 4: pv_block(sr, iv, n, total, vc, v_s, 4, last, yc, y_s); break;
            case 3: pv_block(sr, iv, n, total, vc, v_s, 3, last, yc, y_s); break;
            case 2: pv_block(sr, iv, n, total, vc, v_s, 2, last, yc, y_s); break;
            default: pv_block(sr, iv, n, total, vc, v_s, 1, last, yc, y_s); break;
            }
        }
    }
}

/* ---- heads of up to FLASH_MAX_DK key and FLASH_MAX_DV value columns: one pass over the keys ----
 * A tile holds 16 query rows, one per vector lane: scale * Q^T, the running maxima and sums of
 * exponentials, and the outputs transposed (one vector per V column). It walks the keys in
 * chunks of FKC: each key's scores for the 16 rows are one vector (FMAs of Q^T's rows by a
 * broadcast of K^T, packed once per task), so the row maxima, the rescaling where a maximum rose
 * and the sums are lane-wise operations, never a reduction across lanes; the exponentials go to
 * an L1 buffer and each is multiplied by broadcasts of its key's V row into the outputs, V read in
 * place. Each chunk runs against every tile of a block, phase by phase (scores, exponentials,
 * products), so the tiles' dependency chains overlap. Nothing of size Sq x total is written. With
 * 4 query rows per tile and the keys in the lanes instead (a cross-lane maximum per row and chunk,
 * broadcast loads of each exponential for the products), the TTS-like encoder's Attention at 512
 * tokens took 1.25-1.4 times as long (0.62 against 0.49 ms on two threads, 1.09 against 0.78 ms
 * on one, in-process alternation), the encoder end to end 1.15. Heads of 32 columns (MiniLM's):
 * the node alone 0.76-0.82 of the two-pass path, about 0.9 in the model (end to end 0.99-1.01);
 * of 64 (BERT's) 1.00-1.07, so those stay two-pass. */
enum { TR = 16, FKC = 64, FLASH_MAX_DK = 32, FLASH_MAX_DV = 128 };

typedef struct flash_tile {
    float qt[FLASH_MAX_DK][TR] __attribute__((aligned(64))); /* scale * Q^T */
    float o[FLASH_MAX_DV][TR] __attribute__((aligned(64)));  /* outputs, transposed, not yet normalised */
    float p[FKC][TR] __attribute__((aligned(64)));           /* a chunk's scores, then exponentials */
    float mx[TR] __attribute__((aligned(64)));               /* running maxima */
    float l[TR] __attribute__((aligned(64)));                /* sums of exponentials */
} flash_tile;

/* Scores of tile t's rows against the nk (<= FKC) keys whose K^T starts at kt ([Dk][ldk], zero
 * past the last key), plus the mask where there is one, into t->p; returns the rows' maxima over
 * the chunk. The mask: mk, the chunk's keys' values for every row (a mask broadcast over the
 * query rows), or mt, the rows' values transposed ([FKC][TR]), or neither. */
static inline __attribute__((always_inline)) AVX512 __m512 flash_scores(const attn_job *j, flash_tile *t,
                                                                         const float *kt, int64_t ldk, int64_t nk,
                                                                         const float *mk, const float (*mt)[TR])
{
    __m512 cm = _mm512_set1_ps(-INFINITY);
    for (int64_t k0 = 0; k0 < nk; k0 += 16) {
        __m512 acc[16];
#pragma GCC unroll 16
        for (int q = 0; q < 16; q++) acc[q] = _mm512_setzero_ps();
        const float *kp = kt + k0; /* one pointer: the 16 keys' broadcasts at fixed offsets */
        for (int64_t d = 0; d < j->Dk; d++, kp += ldk) {
            __m512 qv = _mm512_load_ps(t->qt[d]);
#pragma GCC unroll 16
            for (int q = 0; q < 16; q++) acc[q] = _mm512_fmadd_ps(qv, _mm512_set1_ps(kp[q]), acc[q]);
        }
        int64_t n = nk - k0 < 16 ? nk - k0 : 16;
#pragma GCC unroll 16
        for (int q = 0; q < 16; q++) {
            if (q >= n) break;
            __m512 x = acc[q];
            if (mk) x = _mm512_add_ps(x, _mm512_set1_ps(mk[k0 + q]));
            if (mt) x = _mm512_add_ps(x, _mm512_load_ps(mt[k0 + q]));
            _mm512_store_ps(t->p[k0 + q], x);
            cm = _mm512_max_ps(cm, x);
        }
    }
    return cm;
}

/* Tile t's running maxima raised to cover the chunk's (cm), what was summed so far scaled by
 * e^(old - new), the chunk's nk scores replaced by their exponentials and summed. */
static inline __attribute__((always_inline)) AVX512 void flash_exps(const attn_job *j, flash_tile *t, __m512 cm,
                                                                     int64_t nk)
{
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 old = _mm512_load_ps(t->mx), newm = _mm512_max_ps(cm, old);
    __mmask16 none = _mm512_cmp_ps_mask(newm, ninf, _CMP_EQ_OQ); /* nothing attendable yet: e^-inf = 0 */
    newm = _mm512_mask_mov_ps(newm, none, _mm512_setzero_ps());
    __m512 alpha = exp16(_mm512_sub_ps(old, newm)); /* 0 where nothing was summed yet */
    _mm512_store_ps(t->mx, _mm512_mask_mov_ps(newm, none, ninf));
    for (int64_t c = 0; c < j->Dv; c++) _mm512_store_ps(t->o[c], _mm512_mul_ps(_mm512_load_ps(t->o[c]), alpha));
    __m512 l0 = _mm512_mul_ps(_mm512_load_ps(t->l), alpha), l1 = _mm512_setzero_ps();
    int64_t q = 0;
    for (; q + 2 <= nk; q += 2) { /* two sums: the adds are a dependency chain */
        __m512 e0 = exp16(_mm512_sub_ps(_mm512_load_ps(t->p[q]), newm));
        __m512 e1 = exp16(_mm512_sub_ps(_mm512_load_ps(t->p[q + 1]), newm));
        _mm512_store_ps(t->p[q], e0);
        _mm512_store_ps(t->p[q + 1], e1);
        l0 = _mm512_add_ps(l0, e0), l1 = _mm512_add_ps(l1, e1);
    }
    if (q < nk) {
        __m512 e0 = exp16(_mm512_sub_ps(_mm512_load_ps(t->p[q]), newm));
        _mm512_store_ps(t->p[q], e0);
        l0 = _mm512_add_ps(l0, e0);
    }
    _mm512_store_ps(t->l, _mm512_add_ps(l0, l1));
}

/* t->o[c0 + c] += sum over keys q < nk of t->p[q] * v[q][c0 + c], for c < nc (1 or 16: inlined
 * with nc a constant, the accumulators live in registers). */
static inline __attribute__((always_inline)) AVX512 void flash_pv(const attn_job *j, flash_tile *t, const float *v,
                                                                   int64_t nk, int64_t c0, int nc)
{
    __m512 acc[16];
#pragma GCC unroll 16
    for (int c = 0; c < nc; c++) acc[c] = _mm512_load_ps(t->o[c0 + c]);
    const float *vr = v + c0;
    for (int64_t q = 0; q < nk; q++, vr += j->v_s) {
        __m512 pv = _mm512_load_ps(t->p[q]);
#pragma GCC unroll 16
        for (int c = 0; c < nc; c++) acc[c] = _mm512_fmadd_ps(pv, _mm512_set1_ps(vr[c]), acc[c]);
    }
#pragma GCC unroll 16
    for (int c = 0; c < nc; c++) _mm512_store_ps(t->o[c0 + c], acc[c]);
}

/* The chunk's exponentials of tile t times the nk rows of V from v, added into its outputs. */
static AVX512 void flash_pvs(const attn_job *j, flash_tile *t, const float *v, int64_t nk)
{
    int64_t c = 0;
    for (; c + 16 <= j->Dv; c += 16) flash_pv(j, t, v, nk, c, 16);
    for (; c < j->Dv; c++) flash_pv(j, t, v, nk, c, 1);
}

/* Query rows [i0, i0 + rows) (rows <= QB) of head h of batch b against kt (K^T of the head's
 * keys, [Dk][ldk], zero past total): each chunk of keys against every tile of the block, so the
 * chunk's K and V stay in L1 while the block's tiles use them. */
static AVX512 void flash_block(const attn_job *j, const float *kt, int64_t ldk, int64_t b, int64_t h, int64_t i0,
                               int64_t rows)
{
    const int64_t n_tiles = (rows + TR - 1) / TR;
    const float *v = j->v + b * j->v_b + h / j->group * j->v_h;
    const float *mask = j->mask ? j->mask + b * j->m_b + h * j->m_h : NULL;
    flash_tile tiles[QB / TR];
    float mt[FKC][TR] __attribute__((aligned(64)));
    for (int64_t ti = 0; ti < n_tiles; ti++) {
        flash_tile *t = &tiles[ti];
        for (int r = 0; r < TR; r++) {
            int64_t i = i0 + (ti * TR + r < rows ? ti * TR + r : rows - 1); /* past `rows`: the last, not stored */
            const float *q = j->q + b * j->q_b + h * j->q_h + i * j->q_s;
            for (int64_t d = 0; d < j->Dk; d++) t->qt[d][r] = j->scale * q[d];
        }
        _mm512_store_ps(t->mx, _mm512_set1_ps(-INFINITY));
        _mm512_store_ps(t->l, _mm512_setzero_ps());
        for (int64_t c = 0; c < j->Dv; c++) _mm512_store_ps(t->o[c], _mm512_setzero_ps());
    }
    int64_t lim = j->mask && j->m_len < j->total ? j->m_len : j->total; /* keys past lim are masked */
    for (int64_t kc = 0; kc < lim; kc += FKC) {
        int64_t nk = lim - kc < FKC ? lim - kc : FKC;
        __m512 cm[QB / TR];
        for (int64_t ti = 0; ti < n_tiles; ti++) {
            bool per_row = mask && j->m_s;
            if (per_row) { /* the tile's mask rows for the chunk, transposed */
                for (int r = 0; r < TR; r++) {
                    int64_t i = i0 + (ti * TR + r < rows ? ti * TR + r : rows - 1);
                    const float *mr = mask + i * j->m_s + kc;
                    for (int64_t q = 0; q < nk; q++) mt[q][r] = mr[q];
                }
            }
            cm[ti] = flash_scores(j, &tiles[ti], kt + kc, ldk, nk, mask && !per_row ? mask + kc : NULL,
                                  per_row ? (const float(*)[TR])mt : NULL);
        }
        for (int64_t ti = 0; ti < n_tiles; ti++) flash_exps(j, &tiles[ti], cm[ti], nk);
        for (int64_t ti = 0; ti < n_tiles; ti++) flash_pvs(j, &tiles[ti], v + kc * j->v_s, nk);
    }
    for (int64_t ti = 0; ti < n_tiles; ti++) {
        flash_tile *t = &tiles[ti];
        __m512 l = _mm512_load_ps(t->l);
        __mmask16 pos = _mm512_cmp_ps_mask(l, _mm512_setzero_ps(), _CMP_GT_OQ);
        __m512 inv = _mm512_maskz_div_ps(pos, _mm512_set1_ps(1.0f), l);          /* no attendable key: zeros */
        inv = _mm512_mask_mov_ps(inv, _mm512_cmp_ps_mask(l, l, _CMP_UNORD_Q), l); /* NaN somewhere: the row is NaN */
        float iv[TR] __attribute__((aligned(64)));
        _mm512_store_ps(iv, inv);
        for (int64_t r = 0; r < TR && ti * TR + r < rows; r++) {
            float *y = j->y + b * j->y_b + h * j->y_h + (i0 + ti * TR + r) * j->y_s;
            for (int64_t c = 0; c < j->Dv; c++) y[c] = t->o[c][r] * iv[r];
        }
    }
}

/* Task t of a job with j->flash: K^T of its head packed once, then its blocks. */
static AVX512 kiln_status flash_task(const attn_job *j, int64_t t)
{
    int64_t bh = t / j->q_tasks, b = bh / j->Hq, h = bh % j->Hq;
    const float *k = j->k + b * j->k_b + h / j->group * j->k_h;
    int64_t ldk = (j->total + FKC - 1) / FKC * FKC;
    float *kt = kiln_scratch_get(j->scratch, (size_t)(j->Dk * ldk) * sizeof *kt);
    if (!kt) return KILN_ERR_NOMEM;
    for (int64_t p = 0; p < j->total; p++)
        for (int64_t d = 0; d < j->Dk; d++) kt[d * ldk + p] = k[p * j->k_s + d];
    for (int64_t d = 0; d < j->Dk; d++) memset(kt + d * ldk + j->total, 0, (size_t)(ldk - j->total) * sizeof *kt);
    int64_t i0 = t % j->q_tasks * QG * QB, i1 = i0 + QG * QB < j->Sq ? i0 + QG * QB : j->Sq;
    for (int64_t i = i0; i < i1; i += QB) flash_block(j, kt, ldk, b, h, i, i1 - i < QB ? i1 - i : QB);
    kiln_scratch_put(j->scratch, kt);
    return KILN_OK;
}
#undef AVX512
#define HAVE_AVX512_SOFTMAX 1
#endif

/* One block of query rows from i0 of head h of batch b: scores, softmax, times V. */
static kiln_status attn_block(const attn_job *j, float *S, const kiln_gemm_ctx *g, const kiln_gemm_packed_b *kt,
                              const kiln_gemm_packed_b *vp, int64_t b, int64_t h, int64_t i0)
{
    int64_t rows = j->Sq - i0 < QB ? j->Sq - i0 : QB;
    const float *q = j->q + b * j->q_b + h * j->q_h + i0 * j->q_s;
    float *y = j->y + b * j->y_b + h * j->y_h + i0 * j->y_s;
    kiln_status st = kiln_sgemm_packed(g, false, rows, j->scale, q, j->q_s, kt, 0.0f, S, j->total, NULL);
    float inv[QB]; /* the rows' normalisation, applied to Y when V is read in place */
    for (int64_t r = 0; !st && r < rows; r++) {
        const float *m = j->mask ? j->mask + b * j->m_b + h * j->m_h + (i0 + r) * j->m_s : NULL;
#ifdef HAVE_AVX512_SOFTMAX
        if (j->avx512) {
            softmax_row_avx512(S + r * j->total, j->total, m, j->m_len, vp ? NULL : &inv[r]);
            continue;
        }
#endif
        softmax_row_v4(S + r * j->total, j->total, m, j->m_len);
    }
#ifdef HAVE_AVX512_SOFTMAX
    if (!st && !vp) {
        probs_times_v_avx512(S, inv, j->total, rows, j->total, j->v + b * j->v_b + h / j->group * j->v_h, j->v_s,
                             j->Dv, y, j->y_s);
        return st;
    }
#endif
    if (!st) st = kiln_sgemm_packed(g, false, rows, 1.0f, S, j->total, vp, 0.0f, y, j->y_s, NULL);
    return st;
}

static void attn_blocks(void *ctx, int64_t begin, int64_t end)
{
    attn_job *j = ctx;
#ifdef HAVE_AVX512_SOFTMAX
    if (j->flash) {
        for (int64_t t = begin; t < end; t++) {
            kiln_status st = flash_task(j, t);
            if (st) {
                __atomic_store_n(&j->st, st, __ATOMIC_RELAXED);
                return;
            }
        }
        return;
    }
#endif
    /* [QB, total] scores; from the session's scratch: a block this large was mapped and
     * faulted in afresh by every malloc (glibc serves 128 KiB and more with mmap) */
    float *S = kiln_scratch_get(j->scratch, (size_t)(QB * j->total) * sizeof *S);
    if (!S) {
        __atomic_store_n(&j->st, KILN_ERR_NOMEM, __ATOMIC_RELAXED);
        return;
    }
    kiln_gemm_ctx g = {.pool = NULL, .scratch = j->scratch};
    kiln_status st = KILN_OK;
    for (int64_t t = begin; t < end && !st; t++) {
        int64_t bh = t / j->q_tasks, b = bh / j->Hq, h = bh % j->Hq, hk = h / j->group;
        const float *k = j->k + b * j->k_b + hk * j->k_h, *v = j->v + b * j->v_b + hk * j->v_h;
        /* K^T [Dk, total] and V [total, Dv] packed once for this task's blocks */
        kiln_gemm_packed_b *kt = NULL, *vp = NULL;
        st = kiln_gemm_packed_b_create(&g, true, j->Dk, j->total, k, j->k_s, &kt);
        /* V read in place by the AVX-512 product (heads of up to PV_DIRECT_MAX columns), else packed */
        if (!st && !(j->avx512 && j->Dv <= PV_DIRECT_MAX))
            st = kiln_gemm_packed_b_create(&g, false, j->total, j->Dv, v, j->v_s, &vp);
        int64_t blk0 = t % j->q_tasks * QG, blk1 = blk0 + QG < j->q_blocks ? blk0 + QG : j->q_blocks;
        for (int64_t blk = blk0; blk < blk1 && !st; blk++)
            st = attn_block(j, S, &g, kt, vp, b, h, blk * QB);
        kiln_gemm_packed_b_free(kt);
        kiln_gemm_packed_b_free(vp);
    }
    if (st) __atomic_store_n(&j->st, st, __ATOMIC_RELAXED);
    kiln_scratch_put(j->scratch, S);
}

static kiln_status attn_execute(kiln_run_ctx *c, attn_job *jp);

static kiln_status attention_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *Q = kiln_run_in(c, 0), *K = kiln_run_in(c, 1), *V = kiln_run_in(c, 2);
    const kiln_value *M = kiln_run_in(c, 3);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || !K || !V || Q->dtype != KILN_DTYPE_FLOAT32 || K->dtype != KILN_DTYPE_FLOAT32 ||
        V->dtype != KILN_DTYPE_FLOAT32 || Y->dtype != KILN_DTYPE_FLOAT32 || (Q->rank != 3 && Q->rank != 4) ||
        K->rank != Q->rank || V->rank != Q->rank || (M && M->dtype != KILN_DTYPE_FLOAT32) ||
        (M && (M->rank < 1 || M->rank > 4)))
        return kiln_cpu_reference(c);
    bool r3 = Q->rank == 3;
    int64_t B = Q->dims[0], Hq, Hkv, Sq, Skv, Dk, Dv, Dq;
    if (r3) {
        Hq = kiln_attr_int(n, "q_num_heads", 0);
        Hkv = kiln_attr_int(n, "kv_num_heads", 0);
        if (Hq <= 0 || Hkv <= 0 || Q->dims[2] % Hq || K->dims[2] % Hkv || V->dims[2] % Hkv)
            return kiln_cpu_reference(c);
        Sq = Q->dims[1], Skv = K->dims[1], Dq = Q->dims[2] / Hq, Dk = K->dims[2] / Hkv, Dv = V->dims[2] / Hkv;
        if (V->dims[1] != Skv) return kiln_cpu_reference(c);
    } else {
        Hq = Q->dims[1], Hkv = K->dims[1], Sq = Q->dims[2], Skv = K->dims[2], Dq = Q->dims[3], Dk = K->dims[3],
        Dv = V->dims[3];
        if (V->dims[1] != Hkv || V->dims[2] != Skv) return kiln_cpu_reference(c);
    }
    if (Hkv <= 0 || Hq % Hkv || Dq != Dk || K->dims[0] != B || V->dims[0] != B) return kiln_cpu_reference(c);
    int64_t want_y[4] = {B, Hq, Sq, Dv}, want_y3[3] = {B, Sq, Hq * Dv};
    if (Y->rank != Q->rank || memcmp(Y->dims, r3 ? want_y3 : want_y, (size_t)Y->rank * sizeof(int64_t)))
        return kiln_cpu_reference(c);
    attn_job j = {.q = Q->data, .k = K->data, .v = V->data, .y = Y->data, .B = B, .Hq = Hq, .group = Hq / Hkv,
                  .Sq = Sq, .total = Skv, .Dk = Dk, .Dv = Dv};
    if (r3) {
        j.q_s = Hq * Dk, j.q_h = Dk, j.q_b = Sq * Hq * Dk;
        j.k_s = Hkv * Dk, j.k_h = Dk, j.k_b = Skv * Hkv * Dk;
        j.v_s = Hkv * Dv, j.v_h = Dv, j.v_b = Skv * Hkv * Dv;
        j.y_s = Hq * Dv, j.y_h = Dv, j.y_b = Sq * Hq * Dv;
    } else {
        j.q_s = Dk, j.q_h = Sq * Dk, j.q_b = Hq * Sq * Dk;
        j.k_s = Dk, j.k_h = Skv * Dk, j.k_b = Hkv * Skv * Dk;
        j.v_s = Dv, j.v_h = Skv * Dv, j.v_b = Hkv * Skv * Dv;
        j.y_s = Dv, j.y_h = Sq * Dv, j.y_b = Hq * Sq * Dv;
    }
    if (M) {
        int64_t want[4] = {B, Hq, Sq, Skv}, md[4] = {1, 1, 1, 1};
        for (int k = 0; k < M->rank; k++) md[4 - M->rank + k] = M->dims[k];
        for (int k = 0; k < 3; k++)
            if (md[k] != 1 && md[k] != want[k]) return kiln_cpu_reference(c); /* the reference reports it */
        if (md[3] > Skv) return kiln_cpu_reference(c);
        j.mask = M->data;
        j.m_len = md[3];
        j.m_s = md[2] == 1 ? 0 : md[3];
        j.m_h = md[1] == 1 ? 0 : md[2] * md[3];
        j.m_b = md[0] == 1 ? 0 : md[1] * md[2] * md[3];
    }
    const kiln_attr *sa = kiln_node_attr(n, "scale");
    j.scale = sa ? sa->f : (float)(1.0 / sqrt((double)Dq));
    if (!Y->numel) return KILN_OK;
    if (!Skv || !Dk) return kiln_cpu_reference(c); /* no keys: zeros (or NaN) as the reference decides */
    return attn_execute(c, &j);
}

kiln_status kiln_cpu_attn_f32(kiln_run_ctx *c, const kiln_cpu_attn *a)
{
    attn_job j = {.q = a->q, .k = a->k, .v = a->v, .mask = a->mask, .y = a->y, .B = a->B, .Hq = a->Hq,
                  .group = a->Hq / a->Hkv, .Sq = a->Sq, .total = a->total, .Dk = a->Dk, .Dv = a->Dv,
                  .q_b = a->q_b, .q_h = a->q_h, .q_s = a->q_s, .k_b = a->k_b, .k_h = a->k_h, .k_s = a->k_s,
                  .v_b = a->v_b, .v_h = a->v_h, .v_s = a->v_s, .y_b = a->y_b, .y_h = a->y_h, .y_s = a->y_s,
                  .m_b = a->m_b, .m_h = a->m_h, .m_s = a->m_s, .m_len = a->m_len, .scale = a->scale};
    if (!a->B || !a->Hq || !a->Sq || !a->Dv) return KILN_OK;
    return attn_execute(c, &j);
}

/* Runs a filled job (total and Dk positive) over the thread pool. */
static kiln_status attn_execute(kiln_run_ctx *c, attn_job *jp)
{
    attn_job j = *jp;
    j.q_blocks = (j.Sq + QB - 1) / QB;
    j.q_tasks = (j.q_blocks + QG - 1) / QG;
    j.avx512 = kiln_gemm_level_detect() == KILN_GEMM_LEVEL_AVX512;
#ifdef HAVE_AVX512_SOFTMAX
    j.flash = j.avx512 && j.Dk <= FLASH_MAX_DK && j.Dv <= FLASH_MAX_DV;
#endif
    j.scratch = kiln_run_scratch(c);
    /* under about 256K multiply-adds (the encoder's 4 heads at 16 tokens: 32K) on the calling
     * thread, as the GEMM decides (gemm.c) */
    double macs = (double)(j.B * j.Hq) * (double)j.Sq * (double)j.total * (double)(j.Dk + j.Dv);
    kiln_threadpool_parallel_for(macs < (double)(1 << 18) ? NULL : kiln_run_threadpool(c), j.B * j.Hq * j.q_tasks,
                                 attn_blocks, &j);
    kiln_status st = __atomic_load_n(&j.st, __ATOMIC_RELAXED);
    if (st) return kiln_run_fail(c, st, "Attention: sgemm failed (%s)", kiln_status_name(st));
    return KILN_OK;
}

static kiln_kernel_fn select_attention(kiln_node *n)
{
    if (n->n_in < 3 || n->n_in > 4 || n->n_out < 1) return NULL;
    for (int i = 1; i < n->n_out; i++)
        if (n->out[i]) return NULL; /* present key/value, qk output: the reference */
    if (!kiln_ir_is_f32(n->in[0]) || !kiln_ir_is_f32(n->in[1]) || !kiln_ir_is_f32(n->in[2])) return NULL;
    if (n->n_in == 4 && n->in[3] && !kiln_ir_is_f32(n->in[3])) return NULL;
    const kiln_attr *sc = kiln_node_attr(n, "softcap");
    const kiln_attr *sp = kiln_node_attr(n, "softmax_precision");
    if (kiln_attr_int(n, "is_causal", 0) || (sc && sc->f != 0.0f) || (sp && sp->i != KILN_DTYPE_FLOAT32) ||
        kiln_attr_int(n, "left_window_size", -1) >= 0 || kiln_attr_int(n, "right_window_size", -1) >= 0)
        return NULL;
    return attention_run;
}

static const kiln_cpu_kernel kernels[] = {{"", "Attention", select_attention}};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_attn, kernels);
