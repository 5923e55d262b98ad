/* lowp.c - 8-bit and 4-bit float formats: decoding by definition, encoding by searching the
 * (monotonic) table of non-negative codes, which is slow but obviously correct. */
#include <math.h>

#include "core/dtype.h"

typedef struct lowp_fmt {
    int ebits, mbits, bias;
    int sign_bit;      /* bit index of the sign, -1 when unsigned */
    uint8_t max_code;  /* largest finite non-negative code */
    bool has_inf;      /* E5M2 only */
    bool nan_is_0x80;  /* the FNUZ formats: 0x80 is NaN, there is no -0 */
    int nan_code;      /* positive NaN code, -1 when the format has none */
} lowp_fmt;

static bool lowp_fmt_of(kiln_dtype dt, lowp_fmt *f)
{
    switch (dt) {
    case KILN_DTYPE_FLOAT8E4M3FN: *f = (lowp_fmt){4, 3, 7, 7, 0x7e, false, false, 0x7f}; return true;
    case KILN_DTYPE_FLOAT8E4M3FNUZ: *f = (lowp_fmt){4, 3, 8, 7, 0x7f, false, true, 0x80}; return true;
    case KILN_DTYPE_FLOAT8E5M2: *f = (lowp_fmt){5, 2, 15, 7, 0x7b, true, false, 0x7f}; return true;
    case KILN_DTYPE_FLOAT8E5M2FNUZ: *f = (lowp_fmt){5, 2, 16, 7, 0x7f, false, true, 0x80}; return true;
    case KILN_DTYPE_FLOAT8E8M0: *f = (lowp_fmt){8, 0, 127, -1, 0xfe, false, false, 0xff}; return true;
    case KILN_DTYPE_FLOAT4E2M1: *f = (lowp_fmt){2, 1, 1, 3, 0x7, false, false, -1}; return true;
    default: return false;
    }
}

float kiln_lowp_to_f32(kiln_dtype dt, uint8_t code)
{
    lowp_fmt f;
    if (!lowp_fmt_of(dt, &f)) return NAN;
    if (f.nan_is_0x80 && code == 0x80) return NAN;
    if (f.nan_code >= 0 && !f.nan_is_0x80 && (code & 0x7f) == (f.nan_code & 0x7f) && f.sign_bit == 7)
        return NAN;
    if (dt == KILN_DTYPE_FLOAT8E8M0) return code == 0xff ? NAN : ldexpf(1.0f, (int)code - 127);
    bool neg = f.sign_bit >= 0 && ((code >> f.sign_bit) & 1);
    int e = (code >> f.mbits) & ((1 << f.ebits) - 1);
    int m = code & ((1 << f.mbits) - 1);
    if (f.has_inf && e == (1 << f.ebits) - 1) {
        if (m) return NAN;
        return neg ? -INFINITY : INFINITY;
    }
    float v = e == 0 ? ldexpf((float)m, 1 - f.bias - f.mbits)
                     : ldexpf((float)((1 << f.mbits) | m), e - f.bias - f.mbits);
    return neg ? -v : v;
}

uint8_t kiln_lowp_from_f32(kiln_dtype dt, float v, bool saturate)
{
    lowp_fmt f;
    if (!lowp_fmt_of(dt, &f)) return 0;
    uint8_t sign = 0;
    if (f.sign_bit >= 0 && signbit(v)) sign = (uint8_t)(1u << f.sign_bit);
    uint8_t nan = f.nan_code >= 0 ? (uint8_t)f.nan_code : f.max_code;
    if (isnan(v)) return nan;
    float a = fabsf(v);
    if (f.sign_bit < 0 && signbit(v) && a > 0) return nan; /* unsigned format, negative value */
    float maxv = kiln_lowp_to_f32(dt, f.max_code);
    if (isinf(a)) {
        if (saturate) return sign | f.max_code;
        if (f.has_inf) return sign | (uint8_t)(f.max_code + 1);
        return f.nan_is_0x80 ? nan : (uint8_t)(sign | nan);
    }
    /* nearest code, ties to the even code */
    uint8_t best = 0;
    for (int c = 0; c <= f.max_code; c++) {
        float cv = kiln_lowp_to_f32(dt, (uint8_t)c);
        if (cv <= a) best = (uint8_t)c;
        else break;
    }
    uint8_t code = best;
    if (best < f.max_code) {
        float lo = kiln_lowp_to_f32(dt, best), hi = kiln_lowp_to_f32(dt, (uint8_t)(best + 1));
        if (a - lo > hi - a || (a - lo == hi - a && (best & 1))) code = (uint8_t)(best + 1);
    } else if (a > maxv) {
        /* beyond the largest finite value: rounds back to it within half an ulp */
        float below = kiln_lowp_to_f32(dt, (uint8_t)(f.max_code - 1));
        float half_ulp = (maxv - below) / 2;
        if (!saturate && a >= maxv + half_ulp) {
            if (f.has_inf) return sign | (uint8_t)(f.max_code + 1);
            return f.nan_is_0x80 ? nan : (uint8_t)(sign | nan);
        }
        code = f.max_code;
    }
    if (code == 0 && f.nan_is_0x80) return 0; /* no negative zero */
    return sign | code;
}
