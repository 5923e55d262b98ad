/* nbits_f32.c - MatMulNBits' 4-bit weights dequantized into the sgemm's micro-panels (see
 * nbits_f32.h). The weights are [N, K] with K contiguous, the panels [k][columns]: each tile of
 * them is transposed on the way. AVX-512 takes 16 rows x 32 elements per step and transposes
 * the bytes (two unpacks and a vpermd per 64 of them) before widening, so every vector it
 * converts, scales and stores is one row of the panel; AVX2 takes 8 x 8 and transposes floats.
 * 8-bit weights, K tails and columns short of a tile run the portable code. */
#include "cpu/nbits_f32.h"

#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "cpu/avx2_util.h"
#endif

/* Block i's zero-point term per unit of the scale's product, -z * scale. */
static inline float blk_off(const kiln_nbits_f32_w *w, int64_t i)
{
    return w->off ? w->off[i] : -(float)(w->zp ? w->zp[i] : w->zero) * w->scale[i];
}

static float w_at(const kiln_nbits_f32_w *w, int64_t n, int64_t k)
{
    int64_t blk = k / w->block_size, i = n * w->ns + blk, nb = (w->K + w->block_size - 1) / w->block_size;
    const uint8_t *q = w->q + (n * nb + blk) * (w->block_size * w->bits / 8);
    return (float)kiln_nbits_q_at(q, k % w->block_size, w->bits) * w->scale[i] + blk_off(w, i);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* 8 weight rows, elements [k0, k0 + kc8) (k0 and kc8 multiples of 8: a group of 8 never
 * straddles a block, blocks being 16 or more), widened, scaled and transposed 8x8 at a time
 * into rows of k of the micro-panel (row stride ld floats); each block's 8 scales and offsets
 * are read once. */
__attribute__((target("avx2,fma"))) static void rows8_avx2(const kiln_nbits_f32_w *w, int64_t n0, int64_t k0,
                                                          int64_t kc8, float *d, int ld)
{
    const __m256i sh = _mm256_set_epi32(28, 24, 20, 16, 12, 8, 4, 0), m4 = _mm256_set1_epi32(15);
    int64_t bs = w->block_size, rowb = (w->K + bs - 1) / bs * (bs / 2);
    const uint8_t *q0 = w->q + n0 * rowb;
    for (int64_t k = 0; k < kc8;) {
        int64_t blk = (k0 + k) / bs, end = (blk + 1) * bs - k0 < kc8 ? (blk + 1) * bs - k0 : kc8;
        float sv[8], ov[8];
        for (int c = 0; c < 8; c++) {
            int64_t i = (n0 + c) * w->ns + blk;
            sv[c] = w->scale[i], ov[c] = blk_off(w, i);
        }
        for (; k < end; k += 8, d += 8 * ld) {
            const uint8_t *q = q0 + (k0 + k) / 2;
            __m256 r[8];
            for (int c = 0; c < 8; c++) {
                int32_t b4;
                memcpy(&b4, q + c * rowb, 4);
                __m256 x = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b4), sh), m4));
                r[c] = _mm256_fmadd_ps(x, _mm256_set1_ps(sv[c]), _mm256_set1_ps(ov[c]));
            }
            kiln_transpose8(r);
            for (int c = 0; c < 8; c++) _mm256_storeu_ps(d + c * ld, r[c]);
        }
    }
}

enum { PF_AHEAD = 256 }; /* bytes of a row prefetched ahead of its step; never faults */

/* The 16 scales and offsets of block blk for rows [n0, n0 + 16), rows ns floats apart (16 ns fits
 * an int32: the caller checks). */
__attribute__((target("avx512f"))) static void scales16(const kiln_nbits_f32_w *w, int64_t n0, int64_t blk, __m512 *s,
                                                       __m512 *o)
{
    const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int32_t)w->ns));
    int64_t i = n0 * w->ns + blk;
    *s = _mm512_i32gather_ps(rows, w->scale + i, 4);
    if (w->off) {
        *o = _mm512_i32gather_ps(rows, w->off + i, 4);
    } else if (w->zp) {
        uint8_t z[16];
        for (int r = 0; r < 16; r++) z[r] = w->zp[i + r * w->ns];
        __m512 zf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)z)));
        *o = _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), zf), *s);
    } else {
        *o = _mm512_mul_ps(_mm512_set1_ps(-(float)w->zero), *s);
    }
}

/* 16 weight rows, elements [k0, k0 + kc32) (k0 and kc32 multiples of 32), into 16 columns of
 * the micro-panel (row stride ld floats). Per step each row's 16 bytes go to lane r / 4 of
 * register r % 4; bytes unpacked pairwise (8-bit, then 16-bit) leave in lane l dword t byte j's
 * 4 rows 4l..4l+3, and vpermd gathers dword t of every lane into lane t: byte j of all 16 rows
 * in row order, its low nibbles element 2j, its high nibbles element 2j + 1. */
__attribute__((target("avx512f,avx512bw"))) static void rows16_avx512(const kiln_nbits_f32_w *w, int64_t n0, int64_t k0,
                                                                     int64_t kc32, float *d, int ld)
{
    const __m512i lanes = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    const __m512i m4 = _mm512_set1_epi32(15);
    int64_t bs = w->block_size, rowb = (w->K + bs - 1) / bs * (bs / 2);
    const uint8_t *q0 = w->q + n0 * rowb;
    __m512 s, o;
    for (int64_t k = 0; k < kc32; k += 32, d += 32 * ld) {
        const uint8_t *q = q0 + (k0 + k) / 2;
        if (((k0 + k) / 2) % 64 == 0) /* 16 streams: ahead of the hardware prefetchers */
            for (int r = 0; r < 16; r++) _mm_prefetch((const char *)(q + r * rowb + PF_AHEAD), _MM_HINT_T0);
        __m512i z[4];
        for (int i = 0; i < 4; i++) {
            z[i] = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(q + i * rowb)));
            z[i] = _mm512_inserti32x4(z[i], _mm_loadu_si128((const __m128i *)(q + (4 + i) * rowb)), 1);
            z[i] = _mm512_inserti32x4(z[i], _mm_loadu_si128((const __m128i *)(q + (8 + i) * rowb)), 2);
            z[i] = _mm512_inserti32x4(z[i], _mm_loadu_si128((const __m128i *)(q + (12 + i) * rowb)), 3);
        }
        __m512i lo01 = _mm512_unpacklo_epi8(z[0], z[1]), hi01 = _mm512_unpackhi_epi8(z[0], z[1]);
        __m512i lo23 = _mm512_unpacklo_epi8(z[2], z[3]), hi23 = _mm512_unpackhi_epi8(z[2], z[3]);
        __m512i t[4] __attribute__((aligned(64)));
        t[0] = _mm512_permutexvar_epi32(lanes, _mm512_unpacklo_epi16(lo01, lo23)); /* bytes 0..3 */
        t[1] = _mm512_permutexvar_epi32(lanes, _mm512_unpackhi_epi16(lo01, lo23)); /* 4..7 */
        t[2] = _mm512_permutexvar_epi32(lanes, _mm512_unpacklo_epi16(hi01, hi23)); /* 8..11 */
        t[3] = _mm512_permutexvar_epi32(lanes, _mm512_unpackhi_epi16(hi01, hi23)); /* 12..15 */
        const __m128i *bytes = (const __m128i *)t;
        if (k == 0 || (k0 + k) % bs == 0) scales16(w, n0, (k0 + k) / bs, &s, &o);
        for (int j = 0; j < 16; j++) {
            if (bs == 16 && j == 8) scales16(w, n0, (k0 + k) / bs + 1, &s, &o); /* two blocks a step */
            __m512i x = _mm512_cvtepu8_epi32(_mm_load_si128(bytes + j));
            __m512 e0 = _mm512_cvtepi32_ps(_mm512_and_si512(x, m4)), e1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(x, 4));
            _mm512_storeu_ps(d + 2 * j * ld, _mm512_fmadd_ps(e0, s, o));
            _mm512_storeu_ps(d + (2 * j + 1) * ld, _mm512_fmadd_ps(e1, s, o));
        }
    }
}
#endif

void kiln_nbits_f32_pack(kiln_gemm_level level, const kiln_nbits_f32_w *w, float *dst, int64_t p0, int64_t kc,
                         int64_t j0, int64_t n, int width)
{
    if (level == KILN_GEMM_LEVEL_AUTO) level = kiln_gemm_level_detect();
    for (int64_t c0 = 0; c0 < n; c0 += width, dst += kc * width) {
        int cols = n - c0 < width ? (int)(n - c0) : width;
        int64_t k = 0;
        int c = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
        if (level == KILN_GEMM_LEVEL_AVX512 && w->bits == 4 && p0 % 32 == 0 && w->ns <= INT32_MAX / 16 &&
            __builtin_cpu_supports("avx512bw")) {
            k = kc - kc % 32;
            for (; c + 16 <= cols; c += 16) rows16_avx512(w, j0 + c0 + c, p0, k, dst + c, width);
        } else if (level >= KILN_GEMM_LEVEL_AVX2 && w->bits == 4 && p0 % 8 == 0) {
            k = kc - kc % 8;
            for (; c + 8 <= cols; c += 8) rows8_avx2(w, j0 + c0 + c, p0, k, dst + c, width);
        }
#endif
        for (int cc = 0; cc < width; cc++) /* what the tiles left: the last rows of k, the last columns */
            for (int64_t kk = cc < c ? k : 0; kk < kc; kk++)
                dst[kk * width + cc] = cc < cols ? w_at(w, j0 + c0 + cc, p0 + kk) : 0.0f;
    }
}
