/* kernels_gqa.c - com.microsoft GroupQueryAttention on float32: the call validated by the
 * registry's kiln_gqa_prepare (so every seqlens_k and position id is in range), present K and V
 * written once (past rows copied unless present shares past's buffer, new rows rotated, the
 * rest zeroed as ONNX Runtime leaves it), then per task a (batch, head, block of query rows),
 * each query row rotated into the task's scratch: scores over the row's causal / local window,
 * softcap, bias, softmax (with the sink or smooth-softmax term) and the weighted sum of V, each
 * 8 floats at a time.
 * Tasks are spread over the thread pool. Without present outputs, the reference kernel runs. */
#include <math.h>
#include <string.h>

#include "core/scratch.h"
#include "core/threadpool.h"
#include "cpu/kernels.h"
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
static void rotate(const kiln_gqa_call *g, const float *x, float *out, int64_t pos)
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
