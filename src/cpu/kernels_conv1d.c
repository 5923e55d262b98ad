/* kernels_conv1d.c - the CPU kernel of 1-D ConvTranspose in float32 (a TTS decoder's upsampling;
 * the 2-D one is in kernels_conv.c): per image and group, cols [M/g * k, L] = W_g^T X_g on the
 * sgemm, then each column scattered to its output positions (col2im), then the bias. The
 * geometry (pads, output_padding, output_shape, auto_pad) is the reference's
 * (kiln_nn_conv_transpose_geom). */
#include <string.h>

#include "core/scratch.h"
#include "cpu/gemm.h"
#include "cpu/kernels.h"
#include "ops/nn_internal.h"

static kiln_status convt1d_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0), *Wt = kiln_run_in(c, 1), *Bv = n->n_in > 2 ? kiln_run_in(c, 2) : NULL;
    kiln_value *Y = kiln_run_out(c, 0);
    if (!Y || X->rank != 3 || Wt->rank != 3 || Y->rank != 3 || X->dtype != KILN_DTYPE_FLOAT32 ||
        Wt->dtype != KILN_DTYPE_FLOAT32 || (Bv && (Bv->dtype != KILN_DTYPE_FLOAT32 || Bv->numel != Y->dims[1])))
        return kiln_cpu_reference(c);
    kiln_nn_geom g;
    char msg[160];
    int64_t group = kiln_attr_int(n, "group", 1);
    if (!kiln_nn_conv_transpose_geom(n, 1, X->dims, Wt->dims, Y->dims, &g, msg, sizeof msg) || group < 1 ||
        X->dims[1] % group || Wt->dims[0] != X->dims[1] || Y->dims[1] != Wt->dims[1] * group)
        return kiln_cpu_reference(c); /* the reference reports it */
    int64_t N = X->dims[0], C = X->dims[1], L = X->dims[2], Cg = C / group, Mg = Wt->dims[1], k = Wt->dims[2];
    int64_t OL = Y->dims[2], rows = Mg * k, s = g.strides[0], d = g.dilations[0], p = g.pads[0];
    if (!Y->numel) return KILN_OK;
    kiln_scratch *scratch = kiln_run_scratch(c);
    float *cols = kiln_scratch_get(scratch, (size_t)(rows * L > 0 ? rows * L : 1) * sizeof *cols);
    if (!cols) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory for a %lld x %lld column buffer", (long long)rows, (long long)L);
    kiln_gemm_ctx ctx = {.pool = kiln_run_threadpool(c), .scratch = scratch};
    kiln_status st = KILN_OK;
    const float *x = X->data, *w = Wt->data, *bias = Bv ? Bv->data : NULL;
    float *y = Y->data;
    for (int64_t b = 0; b < N && !st; b++)
        for (int64_t gi = 0; gi < group && !st; gi++) {
            /* W_g is [Cg, rows]: cols [rows, L] = W_g^T X_g */
            if (Cg) st = kiln_sgemm_ex(&ctx, true, false, rows, L, Cg, 1.0f, w + gi * Cg * rows, rows, x + (b * C + gi * Cg) * L, L,
                                       0.0f, cols, L, NULL);
            else memset(cols, 0, (size_t)(rows * L) * sizeof *cols);
            if (st) break;
            for (int64_t m = 0; m < Mg; m++) {
                float *yo = y + (b * Y->dims[1] + gi * Mg + m) * OL;
                float bv = bias ? bias[gi * Mg + m] : 0.0f;
                for (int64_t o = 0; o < OL; o++) yo[o] = bv;
                for (int64_t j = 0; j < k; j++) {
                    const float *cr = cols + (m * k + j) * L;
                    for (int64_t i = 0; i < L; i++) {
                        int64_t o = i * s - p + j * d;
                        if (o >= 0 && o < OL) yo[o] += cr[i];
                    }
                }
            }
        }
    kiln_scratch_put(scratch, cols);
    return st ? kiln_run_fail(c, st, "sgemm failed") : KILN_OK;
}

static kiln_kernel_fn select_convt1d(kiln_node *n)
{
    return n->n_in >= 2 && n->n_out >= 1 && kiln_ir_is_f32(n->in[0]) && kiln_ir_is_f32(n->in[1]) && n->in[0]->type.rank == 3 &&
                   n->in[1]->type.rank == 3
               ? convt1d_run
               : NULL;
}

static const kiln_cpu_kernel kernels[] = {
    {"", "ConvTranspose", select_convt1d},
};
KILN_CPU_KERNEL_TABLE(kiln_cpu_kernels_conv1d, kernels);
