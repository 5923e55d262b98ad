/* dtype.h - element types: classification, conversions of the reduced-precision floats, and
 * generic element loads/stores used by the reference kernels. */
#ifndef KILN_CORE_DTYPE_H
#define KILN_CORE_DTYPE_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"

bool kiln_dtype_valid(kiln_dtype dt);
/* float16/32/64, bfloat16, float8 variants, float4: types whose values are reals. */
bool kiln_dtype_is_float(kiln_dtype dt);
/* every signed and unsigned integer width, sub-byte ones included (not bool) */
bool kiln_dtype_is_int(kiln_dtype dt);
bool kiln_dtype_is_signed_int(kiln_dtype dt);
bool kiln_dtype_is_unsigned_int(kiln_dtype dt);
/* 8-bit and 4-bit float formats stored as one code byte per element */
bool kiln_dtype_is_lowp_float(kiln_dtype dt);

float kiln_f16_to_f32(uint16_t h);
uint16_t kiln_f32_to_f16(float f); /* round to nearest even */
float kiln_bf16_to_f32(uint16_t h);
uint16_t kiln_f32_to_bf16(float f); /* round to nearest even */
/* to[i] = float of h[i] (float16, or bfloat16 when bf16) for i < n: F16C 8 at a time where the CPU
 * has it (exact: every float16 is a float), shifts for bfloat16 */
void kiln_half_to_f32_array(const uint16_t *h, float *to, int64_t n, bool bf16);

/* 8-bit and 4-bit float codes (FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ,
 * FLOAT8E8M0, FLOAT4E2M1). Encoding rounds to nearest even; with saturate, values beyond the
 * largest finite value clamp to it (ONNX Cast's `saturate`), else become Inf or NaN where the
 * format has them (NaN for formats without Inf). */
float kiln_lowp_to_f32(kiln_dtype dt, uint8_t code);
uint8_t kiln_lowp_from_f32(kiln_dtype dt, float v, bool saturate);

/* FLOAT8E8M0 encoding with an explicit rounding of the mantissa (Cast-24's round_mode);
 * kiln_lowp_from_f32 rounds up. The sign is ignored; NaN and Inf give 0xff, and so does
 * rounding past the largest code unless saturate. */
typedef enum kiln_e8m0_round {
    KILN_E8M0_ROUND_UP,
    KILN_E8M0_ROUND_DOWN,
    KILN_E8M0_ROUND_NEAREST,
} kiln_e8m0_round;
uint8_t kiln_e8m0_from_f32(float v, bool saturate, kiln_e8m0_round mode);

/* Element i of an array of dtype dt, converted. Integers convert exactly where they fit;
 * float to integer truncates toward zero (C semantics, out-of-range saturates). bool is 0/1.
 * Not for STRING or complex types. */
double kiln_load_f64(kiln_dtype dt, const void *base, int64_t i);
int64_t kiln_load_i64(kiln_dtype dt, const void *base, int64_t i);
uint64_t kiln_load_u64(kiln_dtype dt, const void *base, int64_t i);
/* Stores v into element i, converting: float types round (lowp formats saturate, as ONNX
 * Cast does by default), integer types truncate toward zero and wrap modulo 2^bits like a C
 * cast of the integer value, bool stores v != 0. */
void kiln_store_f64(kiln_dtype dt, void *base, int64_t i, double v);
void kiln_store_i64(kiln_dtype dt, void *base, int64_t i, int64_t v);
void kiln_store_u64(kiln_dtype dt, void *base, int64_t i, uint64_t v);

#endif
