/* lstm_gates.h - one LSTM step's gates for one batch row, shared by the float and the
 * dynamically quantized LSTM kernels (kernels_lstm.c, kernels_dqlstm.c): with pre = gx + gh
 * (+ bias) over the gate blocks i, o, f, c of H values each, c = f c + i tanh(pre_c), h = o tanh(c),
 * sigmoid and tanh over 4-lane vectors (vecmath.h). */
#ifndef KILN_CPU_LSTM_GATES_H
#define KILN_CPU_LSTM_GATES_H

#include <math.h>
#include <stdint.h>

#include "cpu/vecmath.h"

/* gx, gh [4H]; bias [4H] or NULL; c, h [H] updated in place */
static inline void kiln_lstm_gates(const float *gx, const float *gh, const float *bias, float *c, float *h, int64_t H)
{
    int64_t k = 0;
    for (; k + 4 <= H; k += 4) {
        v4f p[4];
        for (int q = 0; q < 4; q++) {
            p[q] = v4_load(gx + q * H + k) + v4_load(gh + q * H + k);
            if (bias) p[q] += v4_load(bias + q * H + k);
        }
        v4f ig = v4_sigmoid(p[0]), og = v4_sigmoid(p[1]), fg = v4_sigmoid(p[2]), cg = v4_tanh(p[3]);
        v4f cn = fg * v4_load(c + k) + ig * cg;
        v4_store(c + k, cn);
        v4_store(h + k, og * v4_tanh(cn));
    }
    for (; k < H; k++) {
        float p[4];
        for (int q = 0; q < 4; q++) p[q] = gx[q * H + k] + gh[q * H + k] + (bias ? bias[q * H + k] : 0.0f);
        float ig = 1.0f / (1.0f + expf(-p[0])), og = 1.0f / (1.0f + expf(-p[1])), fg = 1.0f / (1.0f + expf(-p[2]));
        float cn = fg * c[k] + ig * tanhf(p[3]);
        c[k] = cn;
        h[k] = og * tanhf(cn);
    }
}

#endif
