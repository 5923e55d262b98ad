/* kernels_gqa.c - com.microsoft GroupQueryAttention on float32: the call validated by the
 * registry's kiln_gqa_prepare (so every seqlens_k and position id is in range), present K and V
 * written once (past rows copied unless present shares past's buffer, new rows rotated, the
 * rest zeroed as ONNX Runtime leaves it), then per task a (batch, head, block of query rows),
 * each query row rotated into the task's scratch: scores over the row's causal / local window,
 * softcap, bias, softmax (with the sink or smooth-softmax term) and the weighted sum of V, each
 * 8 floats at a time; on AVX-512, prompts by blocks of query rows and keys (block_tasks) and
 * decode steps by the query heads of a KV head together (group_tasks).
 * Tasks are spread over the thread pool. Without present outputs, the reference kernel runs. */
#include <math.h>
#include <string.h>

#include "core/scratch.h"
#include "core/threadpool.h"
#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "cpu/target.h"
#include "ops/llm.h"

typedef float v8f __attribute__((vector_size(32), aligned(4)));

static inline __attribute__((always_inline)) float dot(const float *a, const float *b, int64_t n)
{
    v8f acc0 = {0}, acc1 = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 += *(const v8f *)(a + i) * *(const v8f *)(b + i);
        acc1 += *(const v8f *)(a + i + 8) * *(const v8f *)(b + i + 8);
    }
    for (; i + 8 <= n; i += 8) acc0 += *(const v8f *)(a + i) * *(const v8f *)(b + i);
    acc0 += acc1;
    float s = 0;
    for (int k = 0; k < 8; k++) s += acc0[k];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline __attribute__((always_inline)) void axpy(float *y, float a, const float *x, int64_t n)
{
    int64_t i = 0;
    v8f av = {a, a, a, a, a, a, a, a};
    for (; i + 8 <= n; i += 8) *(v8f *)(y + i) += av * *(const v8f *)(x + i);
    for (; i < n; i++) y[i] += a * x[i];
}

/* Row x [H] rotated into out (rd first dims; the rest copied); cs/sn at the row's position. */
static inline __attribute__((always_inline)) void rotate(const kiln_gqa_call *g, const float *x, float *out,
                                                         int64_t pos)
{
    int64_t half = g->rd / 2, H = g->H;
    const float *cs = (const float *)g->cos->data + pos * half, *sn = (const float *)g->sin->data + pos * half;
    if (g->interleaved)
        for (int64_t j = 0; j < half; j++) {
            out[2 * j] = x[2 * j] * cs[j] - x[2 * j + 1] * sn[j];
            out[2 * j + 1] = x[2 * j + 1] * cs[j] + x[2 * j] * sn[j];
        }
    else
        for (int64_t j = 0; j < half; j++) {
            out[j] = x[j] * cs[j] - x[j + half] * sn[j];
            out[j + half] = x[j + half] * cs[j] + x[j] * sn[j];
        }
    memcpy(out + g->rd, x + g->rd, (size_t)(H - g->rd) * sizeof *out);
}

typedef struct gqa_job {
    const kiln_gqa_call *g;
    const float *q;    /* the input's Q rows (stride qs per token), rotated by the task that reads them */
    int64_t qs;        /* floats per token of q */
    float *scores;     /* per task: present_len floats, then H for the rotated query row */
    int64_t rows;      /* query rows per task */
    int64_t chunks;    /* tasks per (b, h) */
} gqa_job;

/* Tasks [t0, t1); inlined into gqa_task and, built for AVX2 and FMA, into gqa_task_avx2 (the
 * 8-float vectors are two SSE halves otherwise). */
static inline __attribute__((always_inline)) void gqa_tasks(const gqa_job *j, int64_t t0, int64_t t1)
{
    const kiln_gqa_call *g = j->g;
    int64_t H = g->H, L = g->present_len, group = g->N / g->Nkv;
    for (int64_t t = t0; t < t1; t++) {
        int64_t bh = t / j->chunks, ch = t % j->chunks, b = bh / g->N, h = bh % g->N;
        const float *kh = (const float *)g->present_k->data + (b * g->Nkv + h / group) * L * H;
        const float *vh = (const float *)g->present_v->data + (b * g->Nkv + h / group) * L * H;
        float *p = j->scores + t * (L + H), *qrot = p + L;
        bool sinked = g->sink || g->smooth;
        float sink = g->sink ? ((const float *)g->sink->data)[h] : 0.0f;
        int64_t i1 = (ch + 1) * j->rows < g->S ? (ch + 1) * j->rows : g->S;
        for (int64_t i = ch * j->rows; i < i1; i++) {
            const float *q = j->q + (b * g->S + i) * j->qs + h * H;
            if (g->rd) rotate(g, q, qrot, kiln_gqa_position(g, b, i)), q = qrot;
            float *y = (float *)g->y->data + ((b * g->S + i) * g->N + h) * H;
            int64_t start, len;
            kiln_gqa_window(g, b, i, &start, &len);
            const float *bias = g->bias ? (const float *)g->bias->data + b * g->bias_b + h * g->bias_h + i * g->bias_s : NULL;
            float mx = sinked ? sink : -INFINITY;
            for (int64_t k = start; k < start + len; k++) {
                float s = dot(q, kh + k * H, H) * g->scale;
                if (g->softcap > 0) s = g->softcap * tanhf(s / g->softcap);
                if (bias) s += bias[k];
                p[k] = s;
                mx = s > mx ? s : mx;
            }
            float sum = sinked ? expf(sink - mx) : 0.0f;
            for (int64_t k = start; k < start + len; k++) sum += p[k] = expf(p[k] - mx);
            memset(y, 0, (size_t)H * sizeof *y);
            if (!(sum > 0)) continue;
            float inv = 1.0f / sum;
            for (int64_t k = start; k < start + len; k++) axpy(y, p[k] * inv, vh + k * H, H);
        }
    }
}

static void gqa_task(void *ctx, int64_t t0, int64_t t1) { gqa_tasks(ctx, t0, t1); }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2,fma"))) static void gqa_task_avx2(void *ctx, int64_t t0, int64_t t1) { gqa_tasks(ctx, t0, t1); }

static bool has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_GQA_AVX512 1
KILN_TARGET_BEGIN("avx512f")
#include "cpu/act512.h"
#include "cpu/avx512_util.h"

/* ---- Prompts on AVX-512: QB query rows of one head at a time against 16 keys at a time, keys
 * read from a transposed copy of present K, so each score tile is QB x 16 lanes of broadcast
 * multiply-adds (no horizontal sums); softmax online over the tiles (a running maximum and sum
 * per row, the weighted V rows rescaled when the maximum grows), each row's V rows summed in
 * registers over its own window only. Heads of 16k dims up to GQA_BLOCK_MAX_H (others run
 * gqa_tasks); prompts of under GQA_BLOCK_MIN_S rows run group_tasks below. Measured on one node (packed QKV, 8 / 4
 * heads of 64 dims, rotary, a 64-token first prompt, one thread, `kiln bench`, which also
 * allocates the two 256-row present outputs): 0.44 -> 0.29 ms. */
enum { QB = 8, GQA_BLOCK_MAX_H = 256, GQA_BLOCK_MIN_S = 4 };

typedef struct block_job {
    const kiln_gqa_call *g;
    const float *q; /* as gqa_job */
    int64_t qs;
    float *kt; /* [B, Nkv, tiles, H, 16]: key k of a tile in lane k % 16, zeros past the keys */
    int64_t tiles; /* key tiles per (b, kv head): every window ends within them */
    int64_t blocks; /* row blocks per (b, h) */
} block_job;

/* Task t: tile t % tiles of (b, kv head) t / tiles of present K transposed into kt. */
static void kt_tasks(void *ctx, int64_t t0, int64_t t1)
{
    const block_job *j = ctx;
    const kiln_gqa_call *g = j->g;
    int64_t H = g->H, L = g->present_len;
    for (int64_t t = t0; t < t1; t++) {
        int64_t bkv = t / j->tiles, k0 = t % j->tiles * 16, n = L - k0 < 16 ? L - k0 : 16;
        const float *k = (const float *)g->present_k->data + bkv * L * H + k0 * H;
        float *dst = j->kt + t * H * 16;
        for (int64_t d0 = 0; d0 < H; d0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) r[i] = i < n ? _mm512_loadu_ps(k + i * H + d0) : _mm512_setzero_ps();
            kiln_transpose16(r);
            for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + (d0 + i) * 16, r[i]);
        }
    }
}

/* y [64] += the V rows (row stride H) of the set lanes of live, weighted by p's lanes */
static inline __attribute__((always_inline)) void pv_add4(float *y, const float *v, int64_t H, const float *p,
                                                          __mmask16 live)
{
    __m512 a0 = _mm512_loadu_ps(y), a1 = _mm512_loadu_ps(y + 16), a2 = _mm512_loadu_ps(y + 32),
           a3 = _mm512_loadu_ps(y + 48);
    for (unsigned m = live; m; m &= m - 1) {
        int k = __builtin_ctz(m);
        __m512 pk = _mm512_set1_ps(p[k]);
        const float *vk = v + k * H;
        a0 = _mm512_fmadd_ps(pk, _mm512_loadu_ps(vk), a0);
        a1 = _mm512_fmadd_ps(pk, _mm512_loadu_ps(vk + 16), a1);
        a2 = _mm512_fmadd_ps(pk, _mm512_loadu_ps(vk + 32), a2);
        a3 = _mm512_fmadd_ps(pk, _mm512_loadu_ps(vk + 48), a3);
    }
    _mm512_storeu_ps(y, a0), _mm512_storeu_ps(y + 16, a1), _mm512_storeu_ps(y + 32, a2), _mm512_storeu_ps(y + 48, a3);
}

/* y [16] likewise */
static inline __attribute__((always_inline)) void pv_add1(float *y, const float *v, int64_t H, const float *p,
                                                          __mmask16 live)
{
    __m512 a0 = _mm512_loadu_ps(y);
    for (unsigned m = live; m; m &= m - 1) {
        int k = __builtin_ctz(m);
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[k]), _mm512_loadu_ps(v + k * H), a0);
    }
    _mm512_storeu_ps(y, a0);
}

/* row y [H] += the weighted V rows of the set lanes of live (H a multiple of 16) */
static inline __attribute__((always_inline)) void pv_add(float *y, const float *v, int64_t H, const float *p,
                                                         __mmask16 live)
{
    int64_t c = 0;
    for (; c + 64 <= H; c += 64) pv_add4(y + c, v + c, H, p, live);
    for (; c < H; c += 16) pv_add1(y + c, v + c, H, p, live);
}

/* rotate on 16 lanes: the first rd dims of x, not interleaved, rd / 2 a multiple of 16 */
static inline __attribute__((always_inline)) void rotate16(const kiln_gqa_call *g, const float *x, float *out,
                                                           int64_t pos)
{
    int64_t half = g->rd / 2;
    const float *cs = (const float *)g->cos->data + pos * half, *sn = (const float *)g->sin->data + pos * half;
    for (int64_t j = 0; j < half; j += 16) {
        __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + half), c = _mm512_loadu_ps(cs + j),
               s = _mm512_loadu_ps(sn + j);
        _mm512_storeu_ps(out + j, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)));
        _mm512_storeu_ps(out + j + half, _mm512_fmadd_ps(b, c, _mm512_mul_ps(a, s)));
    }
    memcpy(out + g->rd, x + g->rd, (size_t)(g->H - g->rd) * sizeof *out);
}

/* One query row's softmax so far over the tiles it has seen: the running maximum, the sum of
 * e^(score - max), and y, the V rows summed with those weights. */
typedef struct row_acc {
    float mx, sum;
    float *y; /* [H] */
} row_acc;

static void row_start(row_acc *a, const kiln_gqa_call *g, int64_t h, float *y)
{
    bool sinked = g->sink || g->smooth;
    a->mx = sinked ? (g->sink ? ((const float *)g->sink->data)[h] : 0.0f) : -INFINITY;
    a->sum = sinked ? 1.0f : 0.0f; /* the sink's e^(sink - max) */
    a->y = y;
    memset(y, 0, (size_t)g->H * sizeof *y);
}

/* Adds the keys k0 + lane of the set lanes of live to row a: s holds their q.k products; bias is
 * the row's attention_bias at key 0 (NULL: none); vh the (b, kv head)'s V rows. */
static inline __attribute__((always_inline)) void row_tile(const kiln_gqa_call *g, row_acc *a, __m512 s, __mmask16 live,
                                                           const float *bias, int64_t k0, const float *vh)
{
    int64_t H = g->H;
    __m512 v = _mm512_mul_ps(s, _mm512_set1_ps(g->scale));
    if (g->softcap > 0) {
        __m512 cap = _mm512_set1_ps(g->softcap);
        v = _mm512_mul_ps(cap, (__m512)kiln_a16_tanh((kiln_a16f)_mm512_div_ps(v, cap)));
    }
    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(live, bias + k0));
    float tmax = _mm512_mask_reduce_max_ps(live, v), m = tmax > a->mx ? tmax : a->mx;
    if (m == -INFINITY) return; /* every score so far -inf (a bias masking them all): weights 0, not NaN */
    if (m > a->mx) { /* rescale what was summed at the old maximum */
        float alpha = expf(a->mx - m);
        a->sum *= alpha;
        for (int64_t c = 0; c < H; c += 16)
            _mm512_storeu_ps(a->y + c, _mm512_mul_ps(_mm512_loadu_ps(a->y + c), _mm512_set1_ps(alpha)));
        a->mx = m;
    }
    __m512 p = _mm512_maskz_mov_ps(live, (__m512)kiln_a16_exp_flush((kiln_a16f)_mm512_sub_ps(v, _mm512_set1_ps(m))));
    a->sum += _mm512_reduce_add_ps(p);
    float pk[16];
    _mm512_storeu_ps(pk, p);
    pv_add(a->y, vh + k0 * H, H, pk, live);
}

/* Output row y [H] = a's weighted sum over its sum (zeros where nothing was attended). */
static void row_finish(const kiln_gqa_call *g, const row_acc *a, float *y)
{
    __m512 inv = _mm512_set1_ps(a->sum > 0 ? 1.0f / a->sum : 0.0f);
    for (int64_t c = 0; c < g->H; c += 16) _mm512_storeu_ps(y + c, _mm512_mul_ps(_mm512_loadu_ps(a->y + c), inv));
}

/* Query row i of batch row b of head h rotated (or copied) into out [H]. */
static void query_row(const kiln_gqa_call *g, const float *q, int64_t qs, int64_t b, int64_t i, int64_t h, float *out)
{
    const float *x = q + (b * g->S + i) * qs + h * g->H;
    if (g->rd && !g->interleaved && g->rd % 32 == 0) rotate16(g, x, out, kiln_gqa_position(g, b, i));
    else if (g->rd) rotate(g, x, out, kiln_gqa_position(g, b, i));
    else memcpy(out, x, (size_t)g->H * sizeof *out);
}

static const float *row_bias(const kiln_gqa_call *g, int64_t b, int64_t h, int64_t i)
{
    return g->bias ? (const float *)g->bias->data + b * g->bias_b + h * g->bias_h + i * g->bias_s : NULL;
}

/* Task t: query rows [blk * QB, +QB) of head h of batch row b. */
static void block_tasks(void *ctx, int64_t t0, int64_t t1)
{
    const block_job *j = ctx;
    const kiln_gqa_call *g = j->g;
    int64_t H = g->H, L = g->present_len, group = g->N / g->Nkv;
    float qrot[QB * GQA_BLOCK_MAX_H] __attribute__((aligned(64))),
        acc_y[QB * GQA_BLOCK_MAX_H] __attribute__((aligned(64)));
    for (int64_t t = t0; t < t1; t++) {
        int64_t bh = t / j->blocks, i0 = t % j->blocks * QB, b = bh / g->N, h = bh % g->N;
        int nr = g->S - i0 < QB ? (int)(g->S - i0) : QB;
        int64_t bkv = b * g->Nkv + h / group, start[QB], end[QB], lo = INT64_MAX, hi = 0;
        const float *vh = (const float *)g->present_v->data + bkv * L * H, *kt = j->kt + bkv * j->tiles * H * 16;
        row_acc acc[QB];
        for (int r = 0; r < nr; r++) {
            int64_t len;
            query_row(g, j->q, j->qs, b, i0 + r, h, qrot + r * H);
            kiln_gqa_window(g, b, i0 + r, &start[r], &len);
            end[r] = start[r] + len;
            lo = start[r] < lo ? start[r] : lo, hi = end[r] > hi ? end[r] : hi;
            row_start(&acc[r], g, h, acc_y + r * H);
        }
        memset(qrot + nr * H, 0, (size_t)((QB - nr) * H) * sizeof *qrot); /* rows past the block's end score 0 */
        for (int64_t k0 = lo / 16 * 16; k0 < hi; k0 += 16) {
            const float *kd = kt + k0 * H; /* tile k0 / 16: [H][16] */
            __m512 s[QB];
            for (int r = 0; r < QB; r++) s[r] = _mm512_setzero_ps();
            for (int64_t d = 0; d < H; d++) {
                __m512 w = _mm512_loadu_ps(kd + d * 16);
#pragma GCC unroll 8
                for (int r = 0; r < QB; r++) s[r] = _mm512_fmadd_ps(_mm512_set1_ps(qrot[r * H + d]), w, s[r]);
            }
            for (int r = 0; r < nr; r++) {
                __mmask16 live = kiln_lanes(end[r] - k0) & (__mmask16)~kiln_lanes(start[r] - k0);
                if (live) row_tile(g, &acc[r], s[r], live, row_bias(g, b, h, i0 + r), k0, vh);
            }
        }
        for (int r = 0; r < nr; r++) row_finish(g, &acc[r], (float *)g->y->data + ((b * g->S + i0 + r) * g->N + h) * H);
    }
}

/* ---- Decode steps and short prompts on AVX-512: per task one query row of the query heads of
 * one KV head (up to QB at a time), each KV row read once for them; 16 keys a step, their q.k
 * products summed as 16 vectors of H / 16 multiply-adds, one 16x16 transpose and 15 adds giving
 * the 16 scores in lanes; then the blocked kernels' online softmax and V sums (row_tile). */
typedef struct group_job {
    const kiln_gqa_call *g;
    const float *q;
    int64_t qs;
} group_job;

/* Task t: query row t % S of batch row b, KV head kvh ((b, kvh) = t / S). */
static void group_tasks(void *ctx, int64_t t0, int64_t t1)
{
    const group_job *j = ctx;
    const kiln_gqa_call *g = j->g;
    int64_t H = g->H, L = g->present_len, group = g->N / g->Nkv;
    float qrot[QB * GQA_BLOCK_MAX_H] __attribute__((aligned(64))),
        acc_y[QB * GQA_BLOCK_MAX_H] __attribute__((aligned(64)));
    for (int64_t t = t0; t < t1; t++) {
        int64_t bkv = t / g->S, i = t % g->S, b = bkv / g->Nkv, start, len;
        const float *kh = (const float *)g->present_k->data + bkv * L * H;
        const float *vh = (const float *)g->present_v->data + bkv * L * H;
        kiln_gqa_window(g, b, i, &start, &len);
        for (int64_t h0 = bkv % g->Nkv * group; h0 < (bkv % g->Nkv + 1) * group; h0 += QB) {
            int nh = (bkv % g->Nkv + 1) * group - h0 < QB ? (int)((bkv % g->Nkv + 1) * group - h0) : QB;
            row_acc acc[QB];
            for (int r = 0; r < nh; r++) {
                query_row(g, j->q, j->qs, b, i, h0 + r, qrot + r * H);
                row_start(&acc[r], g, h0 + r, acc_y + r * H);
            }
            for (int64_t k0 = start; k0 < start + len; k0 += 16) {
                int n = start + len - k0 < 16 ? (int)(start + len - k0) : 16;
                __mmask16 live = kiln_lanes(n);
                const float *krow[16]; /* past the window's end, its last row again (lanes not live) */
                for (int k = 0; k < 16; k++) krow[k] = kh + (k0 + (k < n ? k : n - 1)) * H;
                for (int r = 0; r < nh; r++) {
                    __m512 part[16];
                    for (int k = 0; k < 16; k++) part[k] = _mm512_setzero_ps();
                    for (int64_t c = 0; c < H; c += 16) { /* 16 independent chains */
                        __m512 qv = _mm512_loadu_ps(qrot + r * H + c);
#pragma GCC unroll 16
                        for (int k = 0; k < 16; k++)
                            part[k] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(krow[k] + c), part[k]);
                    }
                    kiln_transpose16(part);
                    for (int k = 1; k < 16; k++) part[0] = _mm512_add_ps(part[0], part[k]);
                    const float *bias = row_bias(g, b, h0 + r, i);
                    row_tile(g, &acc[r], part[0], live, bias, k0, vh);
                }
            }
            for (int r = 0; r < nh; r++)
                row_finish(g, &acc[r], (float *)g->y->data + ((b * g->S + i) * g->N + h0 + r) * H);
        }
    }
}

KILN_TARGET_END

/* Runs the call on the AVX-512 kernels where they apply (true), after present K and V are
 * written: prompts of GQA_BLOCK_MIN_S rows or more on block_tasks, the rest on group_tasks;
 * *rc is the call's status then. */
static bool gqa_avx512(kiln_run_ctx *c, const kiln_gqa_call *g, const float *q, int64_t qs, kiln_status *rc)
{
    int64_t H = g->H, B = g->B;
    if (H % 16 || H > GQA_BLOCK_MAX_H || kiln_gemm_level_detect() != KILN_GEMM_LEVEL_AVX512) return false;
    kiln_threadpool *pool = kiln_run_threadpool(c);
    *rc = KILN_OK;
    if (g->S < GQA_BLOCK_MIN_S) {
        group_job j = {g, q, qs};
        double macs = (double)B * (double)g->N * (double)g->S * (double)g->total * (double)(2 * H);
        kiln_threadpool_parallel_for(macs < (double)(1 << 15) ? NULL : pool, B * g->Nkv * g->S, group_tasks, &j);
        return true;
    }
    int64_t hi = 0; /* keys past every window's end are not read */
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < g->S; i++) {
            int64_t start, len;
            kiln_gqa_window(g, b, i, &start, &len);
            hi = start + len > hi ? start + len : hi;
        }
    block_job j = {g, q, qs, NULL, (hi + 15) / 16, (g->S + QB - 1) / QB};
    struct kiln_scratch *scr = kiln_run_scratch(c);
    j.kt = kiln_scratch_get(scr, (size_t)(B * g->Nkv * j.tiles * H * 16 + 1) * sizeof *j.kt);
    if (!j.kt) {
        *rc = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        return true;
    }
    double macs = (double)B * (double)g->N * (double)g->S * (double)hi * (double)(2 * H);
    kiln_threadpool *p = macs < (double)(1 << 15) ? NULL : pool;
    kiln_threadpool_parallel_for(p, B * g->Nkv * j.tiles, kt_tasks, &j);
    kiln_threadpool_parallel_for(p, B * g->N * j.blocks, block_tasks, &j);
    kiln_scratch_put(scr, j.kt);
    return true;
}
#endif

static kiln_status gqa_run(kiln_run_ctx *c)
{
    kiln_gqa_call g;
    if (!kiln_run_out(c, 1) || !kiln_run_out(c, 2) || kiln_run_in(c, GQA_Q)->dtype != KILN_DTYPE_FLOAT32)
        return kiln_cpu_reference(c);
    KILN_TRY(kiln_gqa_prepare(c, &g));
    int64_t B = g.B, S = g.S, N = g.N, Nkv = g.Nkv, H = g.H, L = g.present_len, P = g.past_len;
    int64_t heads = g.packed ? N + 2 * Nkv : N, qs = heads * H;
    const float *qin = g.q->data;
    /* present K and V */
    for (int64_t b = 0; b < B; b++) {
        int64_t past = kiln_gqa_past_rows(&g, b);
        for (int64_t h = 0; h < Nkv; h++)
            for (int which = 0; which < 2; which++) {
                float *dst = (float *)(which ? g.present_v : g.present_k)->data + (b * Nkv + h) * L * H;
                if (!g.shared) {
                    if (past) memcpy(dst, (const float *)(which ? g.past_v : g.past_k)->data + (b * Nkv + h) * P * H,
                                     (size_t)(past * H) * sizeof *dst);
                    memset(dst + (past + S) * H, 0, (size_t)((L - past - S) * H) * sizeof *dst);
                }
                for (int64_t s = 0; s < S; s++) {
                    const float *src;
                    if (g.packed) src = qin + (b * S + s) * qs + (N + which * Nkv + h) * H;
                    else src = (const float *)(which ? g.v : g.k)->data + ((b * S + s) * Nkv + h) * H;
                    float *row = dst + (past + s) * H;
                    if (!which && g.rd) rotate(&g, src, row, kiln_gqa_position(&g, b, s));
                    else memcpy(row, src, (size_t)H * sizeof *row);
                }
            }
    }
#if HAVE_GQA_AVX512
    kiln_status rc;
    if (gqa_avx512(c, &g, qin, qs, &rc)) return rc;
#endif
    struct kiln_scratch *scr = kiln_run_scratch(c);
    kiln_threadpool *pool = kiln_run_threadpool(c);
    /* tasks: (b, h) x chunks of query rows, at most ~256 of them so the score rows stay small */
    int64_t bh = B * N, chunks = S, want = 256;
    if (bh * chunks > want) chunks = want / bh > 1 ? want / bh : 1;
    int64_t rows = (S + chunks - 1) / chunks;
    chunks = (S + rows - 1) / rows;
    float *buf = kiln_scratch_get(scr, (size_t)(bh * chunks * (L + H) + 1) * sizeof *buf);
    if (!buf) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    gqa_job j = {&g, qin, qs, buf, rows, chunks};
    kiln_parallel_fn task = gqa_task;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (has_avx2()) task = gqa_task_avx2;
#endif
    /* a decode step over a very short cache (under 32k multiply-adds in all) runs here; from there
     * the heads split over the threads (at 2^18 a mid-size model's decode ran its attention on one
     * thread for its first ~250 positions while the other waited: 4% of its generation speed) */
    double macs = (double)bh * (double)S * (double)g.total * (double)(2 * H);
    kiln_threadpool_parallel_for(macs < (double)(1 << 15) ? NULL : pool, bh * chunks, task, &j);
    kiln_scratch_put(scr, buf);
    return KILN_OK;
}

static kiln_kernel_fn select_gqa(kiln_node *n) { return n->n_in >= 1 && kiln_ir_is_f32(n->in[0]) ? gqa_run : NULL; }

static const kiln_cpu_kernel kernels[] = {{"com.microsoft", "GroupQueryAttention", select_gqa}};

KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_gqa, kernels);
