/* vecmath_body.h - the vector math of vecmath.h, written once for any lane count: included
 * (no include guard) by vecmath.h for 4 lanes and by vecmath_wide.c for 8 and 16 under AVX2 and
 * AVX-512 targets, each time with VF, VI, VU (float, int32 and uint32 vectors of VM_LANES lanes)
 * and VM(name) (the prefixed function name) defined; it undefines them at its end. */

static inline VF VM(load)(const float *p)
{
    VF v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void VM(store)(float *p, VF v) { memcpy(p, &v, sizeof v); }
static inline VF VM(splat)(float s)
{
    VF v;
    for (int k = 0; k < VM_LANES; k++) v[k] = s;
    return v;
}

/* m ? a : b per lane, m a comparison result (all ones or all zeros). */
static inline VF VM(sel)(VI m, VF a, VF b) { return (VF)(((VI)a & m) | ((VI)b & ~m)); }

/* the lanes summed pairwise: (v0 + v1) + (v2 + v3) for 4 */
static inline float VM(hsum)(VF v)
{
    float s[VM_LANES];
    for (int k = 0; k < VM_LANES; k++) s[k] = v[k];
    for (int w = VM_LANES / 2; w > 0; w /= 2)
        for (int k = 0; k < w; k++) s[k] = s[2 * k] + s[2 * k + 1];
    return s[0];
}

/* e^x within about 2 ulp (Cephes expf polynomial); overflows to +inf above ~88.72, flushes
 * through the denormals to 0 below ~-103.9, NaN in gives NaN out. Always inlined, as tanh is:
 * GCC otherwise calls them per vector, passing 16 lanes through memory (Tanh over 819K floats
 * 0.66 -> 0.54 ms on one Zen 4 thread). */
static inline __attribute__((always_inline)) VF VM(exp)(VF x)
{
    const VF hi = VM(splat)(89.0f), lo = VM(splat)(-104.0f), magic = VM(splat)(12582912.0f); /* 1.5 * 2^23 */
    x = VM(sel)(x > hi, hi, x);
    x = VM(sel)(x < lo, lo, x);
    VF t = x * VM(splat)(1.44269504088896341f) + magic; /* round(x / ln 2) in the low mantissa bits */
    VF n = t - magic;
    VF r = x - n * VM(splat)(0.693359375f) - n * VM(splat)(-2.12194440e-4f);
    VF p = VM(splat)(1.9875691500e-4f);
    p = p * r + VM(splat)(1.3981999507e-3f);
    p = p * r + VM(splat)(8.3334519073e-3f);
    p = p * r + VM(splat)(4.1665795894e-2f);
    p = p * r + VM(splat)(1.6666665459e-1f);
    p = p * r + VM(splat)(5.0000001201e-1f);
    p = p * r * r + r + VM(splat)(1.0f);
    /* 2^n as two factors so that n in [-150, 129] stays within the exponent range */
    VU ni = (VU)t - (VU)magic;
    VU n1 = (VU)((VI)ni >> 1), n2 = ni - n1;
    VF s1 = (VF)((n1 + 127u) << 23), s2 = (VF)((n2 + 127u) << 23);
    return p * s1 * s2;
}

/* e^x as VM(exp), but 0 wherever the result would be subnormal (x below ln FLT_MIN, about -87.34):
 * subnormal arithmetic is tens of times slower on x86, and Softmax rows with a large spread
 * would otherwise run through it for most of their elements. */
static inline __attribute__((always_inline)) VF VM(exp_flush)(VF x)
{
    const VF lo = VM(splat)(-87.33f);
    VI tiny = x < lo;
    return VM(sel)(tiny, VM(splat)(0.0f), VM(exp)(VM(sel)(tiny, lo, x)));
}

/* 1 / (1 + e^-x) */
static inline VF VM(sigmoid)(VF x) { return VM(splat)(1.0f) / (VM(splat)(1.0f) + VM(exp)(-x)); }

/* tanh x as the odd rational x P(x^2) / Q(x^2) of degrees 13 and 6 (the minimax form of Eigen's
 * float tanh; ONNX Runtime's MLAS uses the same polynomials) on x clamped to [-9, 9], the result
 * clamped to [-1, 1] (so that it saturates to +-1 exactly): within 3.3e-7 of tanh everywhere
 * (relative 3.3e-7), NaN in gives NaN out; one division and ten FMAs, 2.7x the throughput of the
 * exp-based form it replaced. Always inlined (see exp). */
static inline __attribute__((always_inline)) VF VM(tanh)(VF x)
{
    const VF one = VM(splat)(1.0f), hi = VM(splat)(9.0f);
    x = VM(sel)(x > hi, hi, x);
    x = VM(sel)(x < -hi, -hi, x);
    VF z = x * x, p = VM(splat)(-2.76076847742355e-16f), q = VM(splat)(1.19825839466702e-06f);
    p = p * z + VM(splat)(2.00018790482477e-13f);
    p = p * z + VM(splat)(-8.60467152213735e-11f);
    p = p * z + VM(splat)(5.12229709037114e-08f);
    p = p * z + VM(splat)(1.48572235717979e-05f);
    p = p * z + VM(splat)(6.37261928875436e-04f);
    p = p * z + VM(splat)(4.89352455891786e-03f);
    q = q * z + VM(splat)(1.18534705686654e-04f);
    q = q * z + VM(splat)(2.26843463243900e-03f);
    q = q * z + VM(splat)(4.89352518554385e-03f);
    VF t = x * p / q;
    t = VM(sel)(t > one, one, t);
    return VM(sel)(t < -one, -one, t);
}

/* erf x as the rational x P(x^2) / Q(x^2) of Eigen's fast float erf (x clamped to [-4, 4]):
 * relative error below 5e-7. */
static inline VF VM(erf)(VF x)
{
    x = VM(sel)(x > VM(splat)(4.0f), VM(splat)(4.0f), x);
    x = VM(sel)(x < VM(splat)(-4.0f), VM(splat)(-4.0f), x);
    VF z = x * x, p = VM(splat)(-2.72614225801306e-10f), q = VM(splat)(-1.45660718464996e-05f);
    p = p * z + VM(splat)(2.77068142495902e-08f);
    p = p * z + VM(splat)(-2.10102402082508e-06f);
    p = p * z + VM(splat)(-5.69250639462346e-05f);
    p = p * z + VM(splat)(-7.34990630326855e-04f);
    p = p * z + VM(splat)(-2.95459980854025e-03f);
    p = p * z + VM(splat)(-1.60960333262415e-02f);
    q = q * z + VM(splat)(-2.13374055278905e-04f);
    q = q * z + VM(splat)(-1.68282697438203e-03f);
    q = q * z + VM(splat)(-7.37332916720468e-03f);
    q = q * z + VM(splat)(-1.42647390514189e-02f);
    return x * p / q;
}

/* Gelu, 0.5 x (1 + erf(x / sqrt 2)); below x / sqrt 2 = -2 (erf < -0.995) the sum cancels, and
 * those lanes take 0.5 x erfc(-x / sqrt 2) instead (scalar, rare in practice). */
static inline VF VM(gelu)(VF v)
{
    VF z = v * VM(splat)(0.70710678118654752f);
    VI low = z < VM(splat)(-2.0f);
    VF r = VM(splat)(0.5f) * v * (VM(splat)(1.0f) + VM(erf)(z));
    int any = 0;
    for (int k = 0; k < VM_LANES; k++) any |= low[k];
    if (any)
        for (int k = 0; k < VM_LANES; k++)
            if (low[k]) r[k] = 0.5f * v[k] * erfcf(-z[k]);
    return r;
}

/* Gelu's tanh approximation, 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as
 * x / (1 + e^(-2u)), the same value without the cancellation of 1 + tanh u where u is very
 * negative (there the sum would carry tanh's absolute error as a large relative one). */
static inline VF VM(gelu_tanh)(VF v)
{
    VF u = VM(splat)(0.7978845608028654f) * (v + VM(splat)(0.044715f) * v * v * v);
    return v / (VM(splat)(1.0f) + VM(exp)(VM(splat)(-2.0f) * u));
}

#undef VF
#undef VI
#undef VU
#undef VM_LANES
#undef VM
