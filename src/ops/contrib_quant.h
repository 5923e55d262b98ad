/* contrib_quant.h - what the CPU provider's int8 kernels share with the com.microsoft quantized
 * matmul references (contrib_quant.c): the dynamic quantization parameters, computed one way. */
#ifndef KILN_OPS_CONTRIB_QUANT_H
#define KILN_OPS_CONTRIB_QUANT_H

#include <math.h>
#include <stdint.h>

/* uint8 scale and zero point of data in [minx, maxx] as ONNX Runtime's dynamic quantization
 * computes them (the range widened to include 0; scale 1 for an empty range), float32 math. */
static inline void kiln_dynquant_params(float minx, float maxx, float *scale, int32_t *zp)
{
    minx = fminf(minx, 0.0f);
    maxx = fmaxf(maxx, 0.0f);
    float s = maxx == minx ? 1.0f : (maxx - minx) / 255.0f;
    float z = 0.0f - minx / s;
    *scale = s;
    *zp = (int32_t)rintf(fmaxf(0.0f, fminf(255.0f, z)));
}

/* x quantized to uint8 with (scale, zp): rint(x / scale) + zp saturated (round half to even). */
static inline uint8_t kiln_dynquant_one(float x, float scale, int32_t zp)
{
    float q = rintf(x / scale) + (float)zp;
    return (uint8_t)fminf(255.0f, fmaxf(0.0f, q));
}

#endif
