/* kernels_resize.c - float32 Resize / Upsample of plain tensors on the CPU, nearest and linear
 * (not antialiased, not tf_crop_and_resize), and nearest of 8-bit ones (a QDQ graph's Resize on
 * its quantized values, src/passes/fuse_qdq.c), where only the last one or two axes change (N and C
 * of an image, or the batch and channels of a 1-D signal: out = in at scale 1). The source
 * indices and weights along each axis are the reference's (src/ops/resize.h), computed once per
 * call; each output row then gathers from one input row (nearest) or blends two input rows into
 * a row buffer and takes two taps of it per output element (linear: rows first, then columns,
 * the reference's order of axes, in float32 where the reference sums in double). Rows are spread
 * over the pool. Other cases, blocked values (kernels_nchwc.c) and other dtypes take the
 * reference kernel. */
#include <stdlib.h>
#include <string.h>

#include "core/scratch.h"
#include "core/threadpool.h"
#include "cpu/kernels.h"
#include "ops/resize.h"

enum { ROW_MAX = 16384 }; /* input row length a task blends on its stack (floats) */

typedef struct resize_job {
    const float *x;
    float *y;
    const uint8_t *x8; /* an 8-bit X and Y (nearest only; x and y NULL) */
    uint8_t *y8;
    int64_t H, W, oh, ow, rows; /* rows: planes * oh */
    bool linear, rows_resized, cols_resized;
    const int64_t *y0, *y1, *x0, *x1; /* [oh], [oh], [ow], [ow] (nearest: y0 and x0 only) */
    const float *wy0, *wy1, *wx0, *wx1;
    int64_t rows_per_task;
} resize_job;

/* Nearest rows of 8-bit values (a QDQ graph's Resize on its quantized values, fuse_qdq.c). */
static void resize_rows8(const resize_job *j, int64_t begin, int64_t end)
{
    int64_t r1 = end * j->rows_per_task < j->rows ? end * j->rows_per_task : j->rows;
    for (int64_t r = begin * j->rows_per_task; r < r1; r++) {
        int64_t p = r / j->oh, oy = r % j->oh;
        const uint8_t *row = j->x8 + (p * j->H + j->y0[oy]) * j->W;
        uint8_t *y = j->y8 + r * j->ow;
        if (!j->cols_resized) memcpy(y, row, (size_t)j->ow);
        else
            for (int64_t ox = 0; ox < j->ow; ox++) y[ox] = row[j->x0[ox]];
    }
}

static void resize_rows(void *ctx, int64_t begin, int64_t end)
{
    const resize_job *j = ctx;
    if (j->x8) {
        resize_rows8(j, begin, end);
        return;
    }
    float tmp[ROW_MAX];
    int64_t r1 = end * j->rows_per_task < j->rows ? end * j->rows_per_task : j->rows;
    for (int64_t r = begin * j->rows_per_task; r < r1; r++) {
        int64_t p = r / j->oh, oy = r % j->oh;
        const float *plane = j->x + p * j->H * j->W;
        float *y = j->y + r * j->ow;
        const float *row = plane + j->y0[oy] * j->W;
        if (j->linear && j->rows_resized) {
            const float *row1 = plane + j->y1[oy] * j->W;
            float a = j->wy0[oy], b = j->wy1[oy];
            for (int64_t w = 0; w < j->W; w++) tmp[w] = a * row[w] + b * row1[w];
            row = tmp;
        }
        if (!j->cols_resized) {
            memcpy(y, row, (size_t)j->ow * sizeof *y);
        } else if (j->linear) {
            for (int64_t ox = 0; ox < j->ow; ox++) y[ox] = j->wx0[ox] * row[j->x0[ox]] + j->wx1[ox] * row[j->x1[ox]];
        } else {
            for (int64_t ox = 0; ox < j->ow; ox++) y[ox] = row[j->x0[ox]];
        }
    }
}

static kiln_status resize_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    kiln_resize_attrs a;
    char msg[200];
    bool byte = X->dtype == KILN_DTYPE_UINT8 || X->dtype == KILN_DTYPE_INT8;
    if (!Y || (X->dtype != KILN_DTYPE_FLOAT32 && !byte) || Y->dtype != X->dtype || X->rank < 1 ||
        !kiln_resize_parse(n, kiln_run_opset(c), X->rank, &a, msg, sizeof msg) || a.antialias ||
        a.ct == KILN_RESIZE_CT_TF_CROP || (a.mode != KILN_RESIZE_NEAREST && a.mode != KILN_RESIZE_LINEAR) ||
        (byte && a.mode != KILN_RESIZE_NEAREST))
        return kiln_cpu_reference(c);
    const kiln_value *scales = a.scales_in >= 0 ? kiln_run_in(c, a.scales_in) : NULL;
    const kiln_value *sizes = a.sizes_in >= 0 ? kiln_run_in(c, a.sizes_in) : NULL;
    if (scales && scales->numel == 0 && sizes) scales = NULL;
    int rank = X->rank;
    int64_t out[KILN_MAX_RANK];
    double scale[KILN_MAX_RANK];
    if (kiln_resize_plan(&a, rank, X->dims, scales, scales ? NULL : sizes, out, scale, msg, sizeof msg))
        return kiln_cpu_reference(c); /* the reference reports it */
    if (memcmp(out, Y->dims, (size_t)rank * sizeof *out)) return kiln_cpu_reference(c);
    /* the last two axes (one for a rank-1 X) as H and W; every other axis kept */
    int hx = rank >= 2 ? rank - 2 : -1;
    for (int k = 0; k < hx; k++)
        if (out[k] != X->dims[k] || scale[k] != 1.0) return kiln_cpu_reference(c);
    int64_t H = hx >= 0 ? X->dims[hx] : 1, W = X->dims[rank - 1], oh = hx >= 0 ? out[hx] : 1, ow = out[rank - 1];
    if (!Y->numel) return KILN_OK;
    if (!X->numel) return kiln_run_fail(c, KILN_ERR_SHAPE, "cannot resize an empty input to a non-empty output");
    if (W > ROW_MAX) return kiln_cpu_reference(c);
    resize_job j = {.x = byte ? NULL : X->data,
                    .y = byte ? NULL : Y->data,
                    .x8 = byte ? X->data : NULL,
                    .y8 = byte ? Y->data : NULL,
                    .H = H,
                    .W = W,
                    .oh = oh,
                    .ow = ow,
                    .linear = a.mode == KILN_RESIZE_LINEAR,
                    .rows_resized = hx >= 0 && (oh != H || scale[hx] != 1.0),
                    .cols_resized = ow != W || scale[rank - 1] != 1.0};
    j.rows = Y->numel / ow;
    /* per axis: i0 and i1 [n] then w0 and w1 [n] */
    kiln_scratch *scr = kiln_run_scratch(c);
    size_t bytes = (size_t)(oh + ow) * 2 * (sizeof(int64_t) + sizeof(float));
    char *buf = kiln_scratch_get(scr, bytes);
    if (!buf) return kiln_run_fail(c, KILN_ERR_NOMEM, "Resize: out of memory for its index tables");
    int64_t *iy0 = (int64_t *)buf, *iy1 = iy0 + oh, *ix0 = iy1 + oh, *ix1 = ix0 + ow;
    float *wy0 = (float *)(ix1 + ow), *wy1 = wy0 + oh, *wx0 = wy1 + oh, *wx1 = wx0 + ow;
    if (!j.rows_resized) {
        for (int64_t i = 0; i < oh; i++) iy0[i] = iy1[i] = i, wy0[i] = 1, wy1[i] = 0;
    } else if (j.linear) {
        kiln_resize_linear_taps(&a, scale[hx], H, oh, iy0, iy1, wy0, wy1);
    } else {
        kiln_resize_nearest_index(&a, scale[hx], H, oh, iy0);
    }
    if (j.linear && j.cols_resized) kiln_resize_linear_taps(&a, scale[rank - 1], W, ow, ix0, ix1, wx0, wx1);
    else if (j.cols_resized) kiln_resize_nearest_index(&a, scale[rank - 1], W, ow, ix0);
    j.y0 = iy0, j.y1 = iy1, j.x0 = ix0, j.x1 = ix1, j.wy0 = wy0, j.wy1 = wy1, j.wx0 = wx0, j.wx1 = wx1;
    j.rows_per_task = KILN_CPU_CHUNK / ow > 1 ? KILN_CPU_CHUNK / ow : 1;
    int64_t tasks = (j.rows + j.rows_per_task - 1) / j.rows_per_task;
    kiln_threadpool_parallel_for(Y->numel >= (1 << 14) ? kiln_run_threadpool(c) : NULL, tasks, resize_rows, &j);
    kiln_scratch_put(scr, buf);
    return KILN_OK;
}

static kiln_kernel_fn select_resize(kiln_node *n)
{
    if (n->n_in < 1 || n->n_out != 1 || !n->in[0]) return NULL;
    const kiln_type *t = &n->in[0]->type;
    bool byte = t->kind == KILN_VALUE_TENSOR && (t->dtype == KILN_DTYPE_UINT8 || t->dtype == KILN_DTYPE_INT8);
    return kiln_ir_is_f32(n->in[0]) || byte ? resize_run : NULL; /* 8-bit: nearest (run time) */
}

static const kiln_cpu_kernel kernels[] = {
    {"", "Resize", select_resize},
    {"", "Upsample", select_resize},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_resize, kernels);
