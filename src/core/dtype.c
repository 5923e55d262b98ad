/* dtype.c - element type facts and conversions. */
#include "core/dtype.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#endif

static const struct {
    const char *name;
    size_t size;
} dtype_facts[KILN_DTYPE_COUNT_] = {
    [KILN_DTYPE_UNDEFINED] = {"undefined", 0},
    [KILN_DTYPE_FLOAT32] = {"float32", 4},
    [KILN_DTYPE_UINT8] = {"uint8", 1},
    [KILN_DTYPE_INT8] = {"int8", 1},
    [KILN_DTYPE_UINT16] = {"uint16", 2},
    [KILN_DTYPE_INT16] = {"int16", 2},
    [KILN_DTYPE_INT32] = {"int32", 4},
    [KILN_DTYPE_INT64] = {"int64", 8},
    [KILN_DTYPE_STRING] = {"string", sizeof(char *)},
    [KILN_DTYPE_BOOL] = {"bool", 1},
    [KILN_DTYPE_FLOAT16] = {"float16", 2},
    [KILN_DTYPE_FLOAT64] = {"float64", 8},
    [KILN_DTYPE_UINT32] = {"uint32", 4},
    [KILN_DTYPE_UINT64] = {"uint64", 8},
    [KILN_DTYPE_COMPLEX64] = {"complex64", 8},
    [KILN_DTYPE_COMPLEX128] = {"complex128", 16},
    [KILN_DTYPE_BFLOAT16] = {"bfloat16", 2},
    [KILN_DTYPE_FLOAT8E4M3FN] = {"float8e4m3fn", 1},
    [KILN_DTYPE_FLOAT8E4M3FNUZ] = {"float8e4m3fnuz", 1},
    [KILN_DTYPE_FLOAT8E5M2] = {"float8e5m2", 1},
    [KILN_DTYPE_FLOAT8E5M2FNUZ] = {"float8e5m2fnuz", 1},
    [KILN_DTYPE_UINT4] = {"uint4", 1},
    [KILN_DTYPE_INT4] = {"int4", 1},
    [KILN_DTYPE_FLOAT4E2M1] = {"float4e2m1", 1},
    [KILN_DTYPE_FLOAT8E8M0] = {"float8e8m0", 1},
    [KILN_DTYPE_UINT2] = {"uint2", 1},
    [KILN_DTYPE_INT2] = {"int2", 1},
};

bool kiln_dtype_valid(kiln_dtype dt)
{
    return dt > KILN_DTYPE_UNDEFINED && dt < KILN_DTYPE_COUNT_;
}

const char *kiln_dtype_name(kiln_dtype dt)
{
    return (unsigned)dt < KILN_DTYPE_COUNT_ ? dtype_facts[dt].name : "undefined";
}

size_t kiln_dtype_size(kiln_dtype dt)
{
    return (unsigned)dt < KILN_DTYPE_COUNT_ ? dtype_facts[dt].size : 0;
}

bool kiln_dtype_is_lowp_float(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_FLOAT8E4M3FN:
    case KILN_DTYPE_FLOAT8E4M3FNUZ:
    case KILN_DTYPE_FLOAT8E5M2:
    case KILN_DTYPE_FLOAT8E5M2FNUZ:
    case KILN_DTYPE_FLOAT8E8M0:
    case KILN_DTYPE_FLOAT4E2M1: return true;
    default: return false;
    }
}

bool kiln_dtype_is_float(kiln_dtype dt)
{
    return dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT64 || dt == KILN_DTYPE_FLOAT16 ||
           dt == KILN_DTYPE_BFLOAT16 || kiln_dtype_is_lowp_float(dt);
}

bool kiln_dtype_is_signed_int(kiln_dtype dt)
{
    return dt == KILN_DTYPE_INT8 || dt == KILN_DTYPE_INT16 || dt == KILN_DTYPE_INT32 ||
           dt == KILN_DTYPE_INT64 || dt == KILN_DTYPE_INT4 || dt == KILN_DTYPE_INT2;
}

bool kiln_dtype_is_unsigned_int(kiln_dtype dt)
{
    return dt == KILN_DTYPE_UINT8 || dt == KILN_DTYPE_UINT16 || dt == KILN_DTYPE_UINT32 ||
           dt == KILN_DTYPE_UINT64 || dt == KILN_DTYPE_UINT4 || dt == KILN_DTYPE_UINT2;
}

bool kiln_dtype_is_int(kiln_dtype dt)
{
    return kiln_dtype_is_signed_int(dt) || kiln_dtype_is_unsigned_int(dt);
}

/* ---- float16 / bfloat16 ---- */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float kiln_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t kiln_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t exp = (u >> 23) & 0xff, man = u & 0x7fffff;
    if (exp == 0xff) return sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0);
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f) return sign | 0x7c00;
    if (e <= 0) {
        if (e < -10) return sign;
        man |= 0x800000;
        int shift = 14 - e;
        uint32_t half = 1u << (shift - 1);
        uint32_t r = man >> shift, rem = man & ((1u << shift) - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return sign | (uint16_t)r;
    }
    uint32_t r = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++; /* may carry into Inf: correct */
    return sign | (uint16_t)r;
}

float kiln_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx,f16c"))) static void f16_array_f16c(const uint16_t *h, float *to, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(to + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++) to[i] = kiln_f16_to_f32(h[i]);
}
#endif

void kiln_half_to_f32_array(const uint16_t *h, float *to, int64_t n, bool bf16)
{
    if (bf16) {
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)h[i] << 16;
            memcpy(to + i, &u, sizeof u);
        }
        return;
    }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned ea, eb, ec, ed; /* F16C: CPUID 1 ECX bit 29, read directly (clang 14 has no "f16c" builtin name) */
    if (__builtin_cpu_supports("avx") && __get_cpuid(1, &ea, &eb, &ec, &ed) && (ec >> 29 & 1)) {
        f16_array_f16c(h, to, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) to[i] = kiln_f16_to_f32(h[i]);
}

uint16_t kiln_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* ---- generic element access ---- */

static double lowp_or_half_to_f64(kiln_dtype dt, const void *base, int64_t i)
{
    switch (dt) {
    case KILN_DTYPE_FLOAT16: return kiln_f16_to_f32(((const uint16_t *)base)[i]);
    case KILN_DTYPE_BFLOAT16: return kiln_bf16_to_f32(((const uint16_t *)base)[i]);
    default: return kiln_lowp_to_f32(dt, ((const uint8_t *)base)[i]);
    }
}

double kiln_load_f64(kiln_dtype dt, const void *base, int64_t i)
{
    switch (dt) {
    case KILN_DTYPE_FLOAT32: return ((const float *)base)[i];
    case KILN_DTYPE_FLOAT64: return ((const double *)base)[i];
    case KILN_DTYPE_INT8:
    case KILN_DTYPE_INT4:
    case KILN_DTYPE_INT2: return ((const int8_t *)base)[i];
    case KILN_DTYPE_UINT8:
    case KILN_DTYPE_UINT4:
    case KILN_DTYPE_UINT2:
    case KILN_DTYPE_BOOL: return ((const uint8_t *)base)[i];
    case KILN_DTYPE_INT16: return ((const int16_t *)base)[i];
    case KILN_DTYPE_UINT16: return ((const uint16_t *)base)[i];
    case KILN_DTYPE_INT32: return ((const int32_t *)base)[i];
    case KILN_DTYPE_UINT32: return ((const uint32_t *)base)[i];
    case KILN_DTYPE_INT64: return (double)((const int64_t *)base)[i];
    case KILN_DTYPE_UINT64: return (double)((const uint64_t *)base)[i];
    default: return lowp_or_half_to_f64(dt, base, i);
    }
}

static int64_t f64_to_i64_sat(double v)
{
    if (isnan(v)) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

int64_t kiln_load_i64(kiln_dtype dt, const void *base, int64_t i)
{
    switch (dt) {
    case KILN_DTYPE_INT64: return ((const int64_t *)base)[i];
    case KILN_DTYPE_UINT64: return (int64_t)((const uint64_t *)base)[i];
    case KILN_DTYPE_INT32: return ((const int32_t *)base)[i];
    case KILN_DTYPE_UINT32: return ((const uint32_t *)base)[i];
    case KILN_DTYPE_INT16: return ((const int16_t *)base)[i];
    case KILN_DTYPE_UINT16: return ((const uint16_t *)base)[i];
    case KILN_DTYPE_INT8:
    case KILN_DTYPE_INT4:
    case KILN_DTYPE_INT2: return ((const int8_t *)base)[i];
    case KILN_DTYPE_UINT8:
    case KILN_DTYPE_UINT4:
    case KILN_DTYPE_UINT2:
    case KILN_DTYPE_BOOL: return ((const uint8_t *)base)[i];
    default: return f64_to_i64_sat(kiln_load_f64(dt, base, i));
    }
}

uint64_t kiln_load_u64(kiln_dtype dt, const void *base, int64_t i)
{
    if (dt == KILN_DTYPE_UINT64) return ((const uint64_t *)base)[i];
    if (kiln_dtype_is_float(dt)) {
        double v = kiln_load_f64(dt, base, i);
        if (isnan(v) || v <= 0) return (uint64_t)f64_to_i64_sat(v);
        if (v >= 18446744073709551615.0) return UINT64_MAX;
        return (uint64_t)v;
    }
    return (uint64_t)kiln_load_i64(dt, base, i);
}

void kiln_store_i64(kiln_dtype dt, void *base, int64_t i, int64_t v)
{
    switch (dt) {
    case KILN_DTYPE_INT64: ((int64_t *)base)[i] = v; return;
    case KILN_DTYPE_UINT64: ((uint64_t *)base)[i] = (uint64_t)v; return;
    case KILN_DTYPE_INT32: ((int32_t *)base)[i] = (int32_t)v; return;
    case KILN_DTYPE_UINT32: ((uint32_t *)base)[i] = (uint32_t)v; return;
    case KILN_DTYPE_INT16: ((int16_t *)base)[i] = (int16_t)v; return;
    case KILN_DTYPE_UINT16: ((uint16_t *)base)[i] = (uint16_t)v; return;
    case KILN_DTYPE_INT8: ((int8_t *)base)[i] = (int8_t)v; return;
    case KILN_DTYPE_UINT8: ((uint8_t *)base)[i] = (uint8_t)v; return;
    case KILN_DTYPE_INT4: { /* wrap to 4 bits, sign-extend */
        int8_t w = (int8_t)((uint8_t)((uint64_t)v << 4)) >> 4;
        ((int8_t *)base)[i] = w;
        return;
    }
    case KILN_DTYPE_UINT4: ((uint8_t *)base)[i] = (uint8_t)(v & 0xf); return;
    case KILN_DTYPE_INT2: {
        int8_t w = (int8_t)((uint8_t)((uint64_t)v << 6)) >> 6;
        ((int8_t *)base)[i] = w;
        return;
    }
    case KILN_DTYPE_UINT2: ((uint8_t *)base)[i] = (uint8_t)(v & 0x3); return;
    case KILN_DTYPE_BOOL: ((uint8_t *)base)[i] = v != 0; return;
    default:
        /* strings, complex numbers, undefined: no number to store (and kiln_store_f64 would
         * come back here forever) */
        if (kiln_dtype_is_float(dt)) kiln_store_f64(dt, base, i, (double)v);
        return;
    }
}

void kiln_store_u64(kiln_dtype dt, void *base, int64_t i, uint64_t v)
{
    if (kiln_dtype_is_float(dt)) kiln_store_f64(dt, base, i, (double)v);
    else kiln_store_i64(dt, base, i, (int64_t)v);
}

void kiln_store_f64(kiln_dtype dt, void *base, int64_t i, double v)
{
    switch (dt) {
    case KILN_DTYPE_FLOAT32: ((float *)base)[i] = (float)v; return;
    case KILN_DTYPE_FLOAT64: ((double *)base)[i] = v; return;
    case KILN_DTYPE_FLOAT16: ((uint16_t *)base)[i] = kiln_f32_to_f16((float)v); return;
    case KILN_DTYPE_BFLOAT16: ((uint16_t *)base)[i] = kiln_f32_to_bf16((float)v); return;
    case KILN_DTYPE_BOOL: ((uint8_t *)base)[i] = v != 0; return;
    case KILN_DTYPE_UINT64:
        ((uint64_t *)base)[i] = (isnan(v) || v <= 0) ? (uint64_t)f64_to_i64_sat(v)
                                : v >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)v;
        return;
    default:
        if (kiln_dtype_is_lowp_float(dt)) {
            ((uint8_t *)base)[i] = kiln_lowp_from_f32(dt, (float)v, true);
            return;
        }
        kiln_store_i64(dt, base, i, f64_to_i64_sat(v));
        return;
    }
}
