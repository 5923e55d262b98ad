/* vecmath.h - 4-lane float vectors (GCC/clang vector extensions, SSE2/NEON width) and the
 * vector exp, tanh, erf and Gelu the float32 kernels share. Loads and stores go through memcpy:
 * no alignment is assumed, and a store may overwrite the very elements it was loaded from
 * (in-place kernels). */
#ifndef KILN_CPU_VECMATH_H
#define KILN_CPU_VECMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef uint32_t v4u __attribute__((vector_size(16)));

static inline v4f v4_load(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void v4_store(float *p, v4f v) { memcpy(p, &v, sizeof v); }
static inline v4f v4_splat(float s) { return (v4f){s, s, s, s}; }

/* m ? a : b per lane, m a comparison result (all ones or all zeros). */
static inline v4f v4_sel(v4i m, v4f a, v4f b) { return (v4f)(((v4i)a & m) | ((v4i)b & ~m)); }

static inline float v4_hsum(v4f v) { return (v[0] + v[1]) + (v[2] + v[3]); }

/* e^x within about 2 ulp (Cephes expf polynomial); overflows to +inf above ~88.72, flushes
 * through the denormals to 0 below ~-103.9, NaN in gives NaN out. */
static inline v4f v4_exp(v4f x)
{
    const v4f hi = v4_splat(89.0f), lo = v4_splat(-104.0f), magic = v4_splat(12582912.0f); /* 1.5 * 2^23 */
    x = v4_sel(x > hi, hi, x);
    x = v4_sel(x < lo, lo, x);
    v4f t = x * v4_splat(1.44269504088896341f) + magic; /* round(x / ln 2) in the low mantissa bits */
    v4f n = t - magic;
    v4f r = x - n * v4_splat(0.693359375f) - n * v4_splat(-2.12194440e-4f);
    v4f p = v4_splat(1.9875691500e-4f);
    p = p * r + v4_splat(1.3981999507e-3f);
    p = p * r + v4_splat(8.3334519073e-3f);
    p = p * r + v4_splat(4.1665795894e-2f);
    p = p * r + v4_splat(1.6666665459e-1f);
    p = p * r + v4_splat(5.0000001201e-1f);
    p = p * r * r + r + v4_splat(1.0f);
    /* 2^n as two factors so that n in [-150, 129] stays within the exponent range */
    v4u ni = (v4u)t - (v4u)magic;
    v4u n1 = (v4u)((v4i)ni >> 1), n2 = ni - n1;
    v4f s1 = (v4f)((n1 + 127u) << 23), s2 = (v4f)((n2 + 127u) << 23);
    return p * s1 * s2;
}

/* e^x as v4_exp, but 0 wherever the result would be subnormal (x below ln FLT_MIN, about -87.34):
 * subnormal arithmetic is tens of times slower on x86, and Softmax rows with a large spread
 * would otherwise run through it for most of their elements. */
static inline v4f v4_exp_flush(v4f x)
{
    const v4f lo = v4_splat(-87.33f);
    v4i tiny = x < lo;
    return v4_sel(tiny, v4_splat(0.0f), v4_exp(v4_sel(tiny, lo, x)));
}

/* 1 / (1 + e^-x) */
static inline v4f v4_sigmoid(v4f x) { return v4_splat(1.0f) / (v4_splat(1.0f) + v4_exp(-x)); }

/* tanh x: the Cephes odd polynomial below |x| 0.625, else sign(x) (1 - 2 / (e^(2|x|) + 1)) */
static inline v4f v4_tanh(v4f x)
{
    v4i sign = (v4i)x & (v4i){INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN};
    v4f ax = (v4f)((v4i)x & ~sign);
    v4f big = v4_splat(1.0f) - v4_splat(2.0f) / (v4_exp(ax + ax) + v4_splat(1.0f));
    v4f z = x * x, p = v4_splat(-5.70498872745e-3f);
    p = p * z + v4_splat(2.06390887954e-2f);
    p = p * z + v4_splat(-5.37397155531e-2f);
    p = p * z + v4_splat(1.33314422036e-1f);
    p = p * z + v4_splat(-3.33332819422e-1f);
    v4f small = p * z * x + x;
    return v4_sel(ax < v4_splat(0.625f), small, (v4f)((v4i)big | sign));
}

/* erf x as the rational x P(x^2) / Q(x^2) of Eigen's fast float erf (x clamped to [-4, 4]):
 * relative error below 5e-7. */
static inline v4f v4_erf(v4f x)
{
    x = v4_sel(x > v4_splat(4.0f), v4_splat(4.0f), x);
    x = v4_sel(x < v4_splat(-4.0f), v4_splat(-4.0f), x);
    v4f z = x * x, p = v4_splat(-2.72614225801306e-10f), q = v4_splat(-1.45660718464996e-05f);
    p = p * z + v4_splat(2.77068142495902e-08f);
    p = p * z + v4_splat(-2.10102402082508e-06f);
    p = p * z + v4_splat(-5.69250639462346e-05f);
    p = p * z + v4_splat(-7.34990630326855e-04f);
    p = p * z + v4_splat(-2.95459980854025e-03f);
    p = p * z + v4_splat(-1.60960333262415e-02f);
    q = q * z + v4_splat(-2.13374055278905e-04f);
    q = q * z + v4_splat(-1.68282697438203e-03f);
    q = q * z + v4_splat(-7.37332916720468e-03f);
    q = q * z + v4_splat(-1.42647390514189e-02f);
    return x * p / q;
}

/* Gelu, 0.5 x (1 + erf(x / sqrt 2)); below x / sqrt 2 = -2 (erf < -0.995) the sum cancels, and
 * those lanes take 0.5 x erfc(-x / sqrt 2) instead (scalar, rare in practice). */
static inline v4f v4_gelu(v4f v)
{
    v4f z = v * v4_splat(0.70710678118654752f);
    v4i low = z < v4_splat(-2.0f);
    v4f r = v4_splat(0.5f) * v * (v4_splat(1.0f) + v4_erf(z));
    if ((low[0] | low[1]) | (low[2] | low[3]))
        for (int k = 0; k < 4; k++)
            if (low[k]) r[k] = 0.5f * v[k] * erfcf(-z[k]);
    return r;
}

/* Gelu's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
static inline v4f v4_gelu_tanh(v4f v)
{
    return v4_splat(0.5f) * v *
           (v4_splat(1.0f) + v4_tanh(v4_splat(0.7978845608028654f) * (v + v4_splat(0.044715f) * v * v * v)));
}

#endif
