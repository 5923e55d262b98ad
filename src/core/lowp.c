/* lowp.c - 8-bit and 4-bit float formats, bit-exact with ONNX's reference (ml_dtypes): decoding
 * by definition, encoding by rounding to nearest even at the format's precision and then
 * checking the code against the largest finite one. */
#include <math.h>
#include <string.h>

#include "core/dtype.h"

typedef struct lowp_fmt {
    int ebits, mbits, bias;
    uint8_t max_code; /* largest finite non-negative code */
    bool has_inf;     /* E5M2 only: code max_code + 1 is Inf */
    bool fnuz;        /* 0x80 is the only NaN, there is no -0 */
    bool has_nan;     /* FLOAT4E2M1 has neither NaN nor Inf */
    uint8_t nan_code; /* positive NaN code as ml_dtypes produces it */
} lowp_fmt;

static bool lowp_fmt_of(kiln_dtype dt, lowp_fmt *f)
{
    switch (dt) {
    case KILN_DTYPE_FLOAT8E4M3FN: *f = (lowp_fmt){4, 3, 7, 0x7e, false, false, true, 0x7f}; return true;
    case KILN_DTYPE_FLOAT8E4M3FNUZ: *f = (lowp_fmt){4, 3, 8, 0x7f, false, true, true, 0x80}; return true;
    case KILN_DTYPE_FLOAT8E5M2: *f = (lowp_fmt){5, 2, 15, 0x7b, true, false, true, 0x7e}; return true;
    case KILN_DTYPE_FLOAT8E5M2FNUZ: *f = (lowp_fmt){5, 2, 16, 0x7f, false, true, true, 0x80}; return true;
    case KILN_DTYPE_FLOAT4E2M1: *f = (lowp_fmt){2, 1, 1, 0x7, false, false, false, 0}; return true;
    default: return false;
    }
}

float kiln_lowp_to_f32(kiln_dtype dt, uint8_t code)
{
    if (dt == KILN_DTYPE_FLOAT8E8M0) return code == 0xff ? NAN : ldexpf(1.0f, (int)code - 127);
    lowp_fmt f;
    if (!lowp_fmt_of(dt, &f)) return NAN;
    int sign_bit = 1 + f.ebits + f.mbits - 1;
    uint8_t mag = code & (uint8_t)((1u << sign_bit) - 1);
    bool neg = (code >> sign_bit) & 1;
    if (f.fnuz && code == 0x80) return NAN;
    if (f.has_nan && !f.fnuz && mag > f.max_code + (f.has_inf ? 1 : 0)) return NAN;
    if (f.has_inf && mag == f.max_code + 1) return neg ? -INFINITY : INFINITY;
    int e = mag >> f.mbits;
    int m = mag & ((1 << f.mbits) - 1);
    float v = e == 0 ? ldexpf((float)m, 1 - f.bias - f.mbits)
                     : ldexpf((float)((1 << f.mbits) | m), e - f.bias - f.mbits);
    return neg ? -v : v;
}

/* Non-negative code of |v| rounded to nearest even with an unbounded exponent range above;
 * returns a value > max_code (possibly > 255) on overflow. */
static int lowp_round(const lowp_fmt *f, double a)
{
    if (a == 0) return 0;
    int ex;
    frexp(a, &ex);
    int e = ex - 1, emin = 1 - f->bias;
    if (e < emin) e = emin;
    double n = rint(ldexp(a, f->mbits - e)); /* exact scaling; rint rounds half to even */
    int full = 1 << (f->mbits + 1);
    if (n >= full) {
        n /= 2;
        e++;
    }
    if (n < (1 << f->mbits)) return (int)n; /* subnormal (or zero) */
    int field = e + f->bias;
    if (field > (1 << f->ebits)) return 0x1ff;
    return (field << f->mbits) | ((int)n - (1 << f->mbits));
}

uint8_t kiln_lowp_from_f32(kiln_dtype dt, float v, bool saturate)
{
    if (dt == KILN_DTYPE_FLOAT8E8M0) return kiln_e8m0_from_f32(v, saturate, KILN_E8M0_ROUND_UP);
    lowp_fmt f;
    if (!lowp_fmt_of(dt, &f)) return 0;
    uint8_t sign = (uint8_t)(signbit(v) ? 1u << (f.ebits + f.mbits) : 0);
    if (isnan(v)) {
        if (!f.has_nan) return (uint8_t)(sign ^ 0x8); /* ml_dtypes gives a zero of the other sign */
        return f.fnuz ? f.nan_code : (uint8_t)(sign | f.nan_code);
    }
    int code = isinf(v) ? 0x1ff : lowp_round(&f, fabs((double)v));
    if (code > f.max_code) {
        /* FLOAT4E2M1 has neither Inf nor NaN: ml_dtypes clamps it whatever `saturate` says */
        if (saturate || !f.has_nan) code = f.max_code;
        else if (f.has_inf) code = f.max_code + 1;
        else return f.fnuz ? f.nan_code : (uint8_t)(sign | f.nan_code);
    }
    if (code == 0 && f.fnuz) return 0;
    return (uint8_t)(sign | code);
}

uint8_t kiln_e8m0_from_f32(float v, bool saturate, kiln_e8m0_round mode)
{
    uint32_t bits;
    memcpy(&bits, &v, 4);
    uint32_t e = (bits >> 23) & 0xff;
    if (e == 0xff) return 0xff; /* NaN and Inf */
    bool up = false;
    switch (mode) {
    case KILN_E8M0_ROUND_UP: up = (bits & 0x7fffff) != 0; break;
    case KILN_E8M0_ROUND_NEAREST: {
        /* guard bit set and (round, sticky or "lsb") set, with lsb as ONNX defines it */
        bool g = bits & 0x400000, r = bits & 0x200000, s = bits & 0x1fffff;
        up = g && (r || s || e > 0);
        break;
    }
    case KILN_E8M0_ROUND_DOWN: break;
    }
    if (up && saturate && e == 0xfe) up = false;
    return (uint8_t)(e + up);
}
