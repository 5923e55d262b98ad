/* lstm_gates.h - one LSTM step's gates for one batch row, shared by the float and the
 * dynamically quantized LSTM kernels (kernels_lstm.c, kernels_dqlstm.c): with pre = gx + gh
 * (+ bias) over the gate blocks i, o, f, c of H values each, c = f c + i tanh(pre_c), h = o tanh(c);
 * sigmoid and tanh as vecmath.h's array functions (16 or 8 lanes where the CPU has them). */
#ifndef KILN_CPU_LSTM_GATES_H
#define KILN_CPU_LSTM_GATES_H

#include <stdint.h>

#include "cpu/vecmath.h"

/* gx, gh [4H]; bias [4H] or NULL; c, h [H] updated in place; tmp [4H] floats of scratch */
static inline void kiln_lstm_gates(const float *gx, const float *gh, const float *bias, float *c, float *h, int64_t H,
                                   float *tmp)
{
    for (int64_t k = 0; k < 4 * H; k++) tmp[k] = gx[k] + gh[k] + (bias ? bias[k] : 0.0f);
    kiln_vec_sigmoid(tmp, tmp, 3 * H); /* i, o, f */
    kiln_vec_tanh(tmp + 3 * H, tmp + 3 * H, H);
    const float *ig = tmp, *og = tmp + H, *fg = tmp + 2 * H, *cg = tmp + 3 * H;
    for (int64_t k = 0; k < H; k++) c[k] = fg[k] * c[k] + ig[k] * cg[k];
    kiln_vec_tanh(c, h, H);
    for (int64_t k = 0; k < H; k++) h[k] *= og[k];
}

#endif
