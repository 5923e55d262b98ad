/* kernels_layout.c - data movement.
 * float32 Transpose: the permutation is simplified first (size-1 axes dropped, output axes that
 * stay adjacent in X merged); then either the innermost axis stays innermost (a row copy per
 * outer index) or the copy runs in 32 x 32 tiles over the output's last axis and the axis that
 * is innermost in X, for each index of the other axes.
 * Concat of any fixed-size element type: Y's bytes are cut into equal ranges spread over the
 * pool, each filled by memcpy from the inputs' blocks it covers (Y is not zeroed first). */
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "core/threadpool.h"

#define TILE 32

typedef struct transpose_job {
    int rank;                   /* simplified rank, >= 1 */
    int64_t dims[KILN_MAX_RANK]; /* output dims, simplified */
    int64_t xs[KILN_MAX_RANK];  /* X's stride (elements) along each output axis */
    int64_t ys[KILN_MAX_RANK];  /* Y's row-major strides */
    int p;                      /* tile path: the output axis that is X's innermost (xs == 1) */
    int64_t per_chunk;          /* outer indices (tile path: tasks) per parallel chunk */
    int64_t l_step, l_blocks;   /* tile path: output last-axis columns per task, tasks per outer index */
    const float *x;
    float *y;
} transpose_job;

/* Offsets in X and Y of outer index t over the axes other than `skip1` and `skip2`. */
static void outer_offsets(const transpose_job *j, int64_t t, int skip1, int skip2, int64_t *ox, int64_t *oy)
{
    *ox = *oy = 0;
    for (int k = j->rank - 1; k >= 0; k--) {
        if (k == skip1 || k == skip2) continue;
        int64_t i = t % j->dims[k];
        t /= j->dims[k];
        *ox += i * j->xs[k];
        *oy += i * j->ys[k];
    }
}

static void rows_chunks(void *ctx, int64_t begin, int64_t end)
{
    const transpose_job *j = ctx;
    int last = j->rank - 1;
    int64_t len = j->dims[last], rows = j->ys[0] * j->dims[0] / len;
    int64_t t1 = end * j->per_chunk < rows ? end * j->per_chunk : rows;
    for (int64_t t = begin * j->per_chunk; t < t1; t++) {
        int64_t ox, oy;
        outer_offsets(j, t, last, -1, &ox, &oy);
        memcpy(j->y + oy, j->x + ox, (size_t)len * sizeof(float));
    }
}

/* Tasks [begin * per_chunk, end * per_chunk): task t is outer index t / l_blocks and columns
 * [l_step * (t % l_blocks), + l_step) of the output's last axis, copied in TILE x TILE tiles. */
static void tiles_chunks(void *ctx, int64_t begin, int64_t end)
{
    const transpose_job *j = ctx;
    int l = j->rank - 1, p = j->p;
    int64_t nl = j->dims[l], np = j->dims[p], xl = j->xs[l], yp = j->ys[p];
    int64_t tasks = j->ys[0] * j->dims[0] / (nl * np) * j->l_blocks;
    int64_t t1 = end * j->per_chunk < tasks ? end * j->per_chunk : tasks;
    for (int64_t t = begin * j->per_chunk; t < t1; t++) {
        int64_t ox, oy;
        outer_offsets(j, t / j->l_blocks, l, p, &ox, &oy);
        const float *x = j->x + ox;
        float *y = j->y + oy;
        int64_t lb = t % j->l_blocks * j->l_step, le = lb + j->l_step < nl ? lb + j->l_step : nl;
        for (int64_t p0 = 0; p0 < np; p0 += TILE)
            for (int64_t l0 = lb; l0 < le; l0 += TILE) {
                int64_t p1 = p0 + TILE < np ? p0 + TILE : np, l1 = l0 + TILE < le ? l0 + TILE : le;
                for (int64_t a = p0; a < p1; a++)
                    for (int64_t b = l0; b < l1; b++) y[a * yp + b] = x[a + b * xl];
            }
    }
}

static kiln_status transpose_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->dtype != KILN_DTYPE_FLOAT32 || Y->dtype != KILN_DTYPE_FLOAT32 || Y->numel != X->numel ||
        X->rank < 1)
        return kiln_cpu_reference(c);
    if (!X->numel) return KILN_OK;
    int rank = X->rank, perm[KILN_MAX_RANK], np = 0;
    const int64_t *pa = kiln_attr_ints(n, "perm", &np);
    bool seen[KILN_MAX_RANK] = {false};
    if (pa && np != rank) return kiln_cpu_reference(c);
    for (int k = 0; k < rank; k++) {
        int64_t v = pa ? pa[k] : rank - 1 - k;
        if (v < 0 || v >= rank || seen[v]) return kiln_cpu_reference(c); /* the reference reports it */
        seen[v] = true;
        perm[k] = (int)v;
    }
    int64_t xstr[KILN_MAX_RANK];
    xstr[rank - 1] = 1;
    for (int k = rank - 2; k >= 0; k--) xstr[k] = xstr[k + 1] * X->dims[k + 1];
    /* output axes in order, size-1 ones dropped, runs contiguous in X merged */
    transpose_job j = {.rank = 0, .x = X->data, .y = Y->data};
    for (int k = 0; k < rank; k++) {
        int64_t d = X->dims[perm[k]];
        if (d == 1) continue;
        if (j.rank && j.xs[j.rank - 1] == xstr[perm[k]] * d) {
            j.dims[j.rank - 1] *= d;
            j.xs[j.rank - 1] = xstr[perm[k]];
            continue;
        }
        j.dims[j.rank] = d;
        j.xs[j.rank++] = xstr[perm[k]];
    }
    if (!j.rank) { /* one element */
        j.dims[0] = 1;
        j.xs[0] = 1;
        j.rank = 1;
    }
    j.ys[j.rank - 1] = 1;
    for (int k = j.rank - 2; k >= 0; k--) j.ys[k] = j.ys[k + 1] * j.dims[k + 1];
    kiln_threadpool *pool = kiln_run_threadpool(c);
    int last = j.rank - 1;
    if (j.xs[last] == 1) {
        int64_t len = j.dims[last], rows = X->numel / len;
        j.per_chunk = len >= KILN_CPU_CHUNK ? 1 : KILN_CPU_CHUNK / len;
        kiln_threadpool_parallel_for(pool, (rows + j.per_chunk - 1) / j.per_chunk, rows_chunks, &j);
        return KILN_OK;
    }
    j.p = -1;
    for (int k = 0; k < last; k++)
        if (j.xs[k] == 1) j.p = k;
    if (j.p < 0) return kiln_cpu_reference(c); /* cannot happen: X's innermost axis is an output axis */
    /* a slice larger than a chunk is cut along the output's last axis (NHWC -> NCHW of one image
     * is a single slice) */
    int64_t nl = j.dims[last], nt = j.dims[j.p], slice = nl * nt, outer = X->numel / slice;
    j.l_step = nl;
    if (slice > KILN_CPU_CHUNK) {
        int64_t step = KILN_CPU_CHUNK / nt / TILE * TILE;
        j.l_step = step > TILE ? step : TILE;
        if (j.l_step > nl) j.l_step = nl;
    }
    j.l_blocks = (nl + j.l_step - 1) / j.l_step;
    int64_t tasks = outer * j.l_blocks, per = nt * j.l_step;
    j.per_chunk = per >= KILN_CPU_CHUNK ? 1 : KILN_CPU_CHUNK / per;
    kiln_threadpool_parallel_for(pool, (tasks + j.per_chunk - 1) / j.per_chunk, tiles_chunks, &j);
    return KILN_OK;
}

/* ---- Concat ---- */

/* Bytes of Y per parallel task */
enum { CONCAT_CHUNK = 64 << 10 };

typedef struct concat_job {
    int n;                 /* inputs */
    const char **x;        /* [n] input bytes */
    const int64_t *xblock; /* [n] bytes of input i per outer index */
    const int64_t *off;    /* [n] where input i's block starts in Y's block */
    int64_t yblock;        /* bytes of Y per outer index */
    int64_t total;         /* bytes of Y */
    char *y;
} concat_job;

/* Fills Y's bytes [begin * CONCAT_CHUNK, end * CONCAT_CHUNK). */
static void concat_chunks(void *ctx, int64_t begin, int64_t end)
{
    const concat_job *j = ctx;
    int64_t s = begin * CONCAT_CHUNK, e = end * CONCAT_CHUNK < j->total ? end * CONCAT_CHUNK : j->total;
    for (int64_t o = s / j->yblock; o * j->yblock < e; o++) {
        int64_t base = o * j->yblock;
        for (int i = 0; i < j->n; i++) {
            int64_t a = base + j->off[i], b = a + j->xblock[i]; /* input i's bytes in Y */
            int64_t lo = a > s ? a : s, hi = b < e ? b : e;
            if (lo < hi) memcpy(j->y + lo, j->x[i] + o * j->xblock[i] + (lo - a), (size_t)(hi - lo));
        }
    }
}

static kiln_status concat_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    kiln_value *Y = kiln_run_out(c, 0);
    int n_in = kiln_run_n_in(c);
    if (!Y || Y->kind != KILN_VALUE_TENSOR || Y->dtype == KILN_DTYPE_STRING || Y->rank < 1)
        return kiln_cpu_reference(c);
    int64_t a = kiln_attr_int(n, "axis", 0);
    if (a < 0) a += Y->rank;
    if (a < 0 || a >= Y->rank) return kiln_cpu_reference(c); /* the reference reports it */
    int axis = (int)a;
    int64_t inner = (int64_t)kiln_dtype_size(Y->dtype);
    for (int k = axis + 1; k < Y->rank; k++) inner *= Y->dims[k];
    /* every input present, of Y's type and rank, agreeing off the axis; the axis sizes sum up */
    int64_t along = 0;
    for (int i = 0; i < n_in; i++) {
        const kiln_value *x = kiln_run_in(c, i);
        if (!x || x->kind != KILN_VALUE_TENSOR || x->dtype != Y->dtype || x->rank != Y->rank)
            return kiln_cpu_reference(c);
        for (int k = 0; k < Y->rank; k++)
            if (k != axis && x->dims[k] != Y->dims[k]) return kiln_cpu_reference(c);
        along += x->dims[axis];
    }
    if (along != Y->dims[axis]) return kiln_cpu_reference(c);
    if (!Y->nbytes) return KILN_OK;
    const char **xs = malloc((size_t)n_in * sizeof *xs);
    int64_t *sizes = malloc(2 * (size_t)n_in * sizeof *sizes);
    if (!xs || !sizes) {
        free(xs);
        free(sizes);
        return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory for %d Concat inputs", n_in);
    }
    int64_t off = 0;
    for (int i = 0; i < n_in; i++) {
        const kiln_value *x = kiln_run_in(c, i);
        xs[i] = x->data;
        sizes[i] = x->dims[axis] * inner;
        sizes[n_in + i] = off;
        off += sizes[i];
    }
    concat_job j = {n_in, xs, sizes, sizes + n_in, Y->dims[axis] * inner, (int64_t)Y->nbytes, Y->data};
    kiln_threadpool_parallel_for(kiln_run_threadpool(c), (j.total + CONCAT_CHUNK - 1) / CONCAT_CHUNK,
                                 concat_chunks, &j);
    free(xs);
    free(sizes);
    return KILN_OK;
}

static kiln_kernel_fn select_concat(kiln_node *n) { return n->n_out >= 1 && n->n_in >= 1 ? concat_run : NULL; }
static kiln_kernel_fn select_transpose(kiln_node *n)
{
    return n->n_out >= 1 && n->n_in == 1 && kiln_ir_is_f32(n->in[0]) && kiln_ir_is_f32(n->out[0]) ? transpose_run : NULL;
}

static const kiln_cpu_kernel kernels[] = {
    {"", "Concat", select_concat},
    {"", "Transpose", select_transpose},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_layout, kernels);
