/* requant.c - requant.h's loops, portable and AVX-512. */
#include "cpu/requant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86 1
#endif

#if HAVE_X86
/* kiln_cpu_requant_one on 16 lanes, v holding the sums with the bias added */
__attribute__((target("avx512f"))) static inline __m512i requant16(__m512i v, __m512 vm, __m512 vlo, __m512 vhi,
                                                                   __m512i vz)
{
    __m512 f = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v), vm), vlo), vhi);
    return _mm512_add_epi32(_mm512_cvtps_epi32(f), vz);
}

static inline __mmask16 lanes16(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

__attribute__((target("avx512f"))) static void rows_avx512(const int32_t *c, int64_t ldc, int64_t m, int64_t n,
                                                           const float *mult, const int32_t *bias, float lo, float hi,
                                                           int32_t zp, uint8_t *t, int64_t ldt)
{
    __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
    __m512i vz = _mm512_set1_epi32(zp);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = lanes16(n - j);
        __m512 vm = _mm512_maskz_loadu_ps(k, mult + j);
        __m512i vb = bias ? _mm512_maskz_loadu_epi32(k, bias + j) : _mm512_setzero_si512();
        for (int64_t i = 0; i < m; i++) {
            __m512i v = _mm512_add_epi32(_mm512_maskz_loadu_epi32(k, c + i * ldc + j), vb);
            _mm512_mask_cvtepi32_storeu_epi8(t + i * ldt + j, k, requant16(v, vm, vlo, vhi, vz));
        }
    }
}

__attribute__((target("avx512f"))) static void line_avx512(const float *yf, const int32_t *c, int64_t n, uint32_t bias,
                                                           float mult, float lo, float hi, int32_t zp, uint8_t *y)
{
    __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi), vm = _mm512_set1_ps(mult);
    __m512i vz = _mm512_set1_epi32(zp), vb = _mm512_set1_epi32((int32_t)bias);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = lanes16(n - i);
        __m512i v = yf ? _mm512_cvttps_epi32(_mm512_maskz_loadu_ps(k, yf + i)) : _mm512_maskz_loadu_epi32(k, c + i);
        _mm512_mask_cvtepi32_storeu_epi8(y + i, k, requant16(_mm512_add_epi32(v, vb), vm, vlo, vhi, vz));
    }
}
#endif

void kiln_cpu_requant_rows(const int32_t *c, int64_t ldc, int64_t m, int64_t n, const float *mult, const int32_t *bias,
                           float lo, float hi, int32_t zp, uint8_t *t, int64_t ldt)
{
#if HAVE_X86
    if (__builtin_cpu_supports("avx512f")) {
        rows_avx512(c, ldc, m, n, mult, bias, lo, hi, zp, t, ldt);
        return;
    }
#endif
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            uint32_t b = bias ? (uint32_t)bias[j] : 0;
            t[i * ldt + j] = kiln_cpu_requant_one((int32_t)((uint32_t)c[i * ldc + j] + b), mult[j], lo, hi, zp);
        }
}

void kiln_cpu_requant_line(const float *yf, const int32_t *c, int64_t n, uint32_t bias, float mult, float lo, float hi,
                           int32_t zp, uint8_t *y)
{
#if HAVE_X86
    if (__builtin_cpu_supports("avx512f")) {
        line_avx512(yf, c, n, bias, mult, lo, hi, zp, y);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        int32_t s = yf ? (int32_t)yf[i] : c[i];
        y[i] = kiln_cpu_requant_one((int32_t)((uint32_t)s + bias), mult, lo, hi, zp);
    }
}
