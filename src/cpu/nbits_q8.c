/* nbits_q8.c - 4-bit MatMulNBits weights against A quantized to int8 per block (see nbits_q8.h).
 *
 * A byte of B holds elements 2i (low nibble) and 2i+1 (high nibble) of its block, so 64 bytes of
 * a weight row are 128 elements: their low nibbles are the even elements, the high nibbles the odd
 * ones. Each row of A is quantized once per call into the same order, 128 bytes per step of 128
 * elements (the 64 even elements, then the 64 odd ones), so two u8 x s8 dot products of 64 bytes
 * (vpdpbusd) sum a step into 16 int32 lanes of 8 consecutive elements each: a lane never straddles
 * a block (blocks are 16 or more). Each lane is then converted to float and multiplied by its
 * block's weight scale and A scale. A zero point z common to all blocks (no zero_points input)
 * starts each lane's integer sum at -z * (sum of the lane's 8 quantized A values), so the
 * weights' (q - z) are exact and nothing more is read; per-block zero points (a byte each)
 * enter once per row as sum over blocks of (-z s) * (A scale * sum of A's quantized block).
 * Scale rows are read with their last step masked (no padding). Integer sums are exact; only
 * the order of the float sums differs between levels. Columns are spread over the pool; each
 * task reads its weight rows one after another, so each thread streams one sequential range of
 * memory (with AVX-512, each step of the weights split once for up to 3 rows of A). From
 * GEMM_MIN_M rows of A the blocked GEMM below runs instead (the weights unpacked once per call
 * into panels of 16 columns, A broadcast 4 bytes at a time: 128-token prompts 2.5-3.5x faster
 * on AVX2). */
#include "cpu/nbits_q8.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core/scratch.h"
#include "core/threadpool.h"
#include "ops/llm.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu/avx2_util.h"
#endif

enum { COLS_PER_TASK = 8, PF_ROW = 2048 };

kiln_nbits_q8_level kiln_nbits_q8_level_detect(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        return KILN_NBITS_Q8_AVX512VNNI;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return KILN_NBITS_Q8_AVX2;
#endif
    return KILN_NBITS_Q8_BASELINE;
}

bool kiln_nbits_q8_level_supported(kiln_nbits_q8_level level)
{
    if (level == KILN_NBITS_Q8_AUTO || level == KILN_NBITS_Q8_BASELINE) return true;
    if (level < 0 || level >= KILN_NBITS_Q8_LEVELS) return false;
    return level <= kiln_nbits_q8_level_detect();
}

const char *kiln_nbits_q8_level_name(kiln_nbits_q8_level level)
{
    static const char *const names[] = {"auto", "baseline", "avx2", "avx512vnni"};
    return level >= 0 && level < KILN_NBITS_Q8_LEVELS ? names[level] : "?";
}

/* One call: A's rows quantized and laid out for the kernels. */
typedef struct q8_job {
    const kiln_nbits_q8_w *w;
    int64_t M, nb, steps;   /* blocks per row, steps of 128 elements per row */
    const int8_t *qa;       /* [M, steps, 128]: per step the even elements, then the odd ones */
    const float *sl;        /* [M, steps, 16]: the A scale of each lane's block (0 past the blocks) */
    const int32_t *zi;      /* [M, steps, 16]: -zero * the lane's sum of quantized A (0 with zp) */
    const float *cz;        /* [M, nbz]: A scale * sum of the quantized block (0 past the blocks) */
    int64_t nbz;            /* nb rounded up to 16 */
    const float *bias;      /* [N] or NULL */
    float *y;               /* [M, N] */
    kiln_nbits_q8_level level;
} q8_job;

/* Scale offset of zmm lane l (elements 8l .. 8l + 7 of a step) from the step's first block. */
static inline int lane_block(int l, int64_t bs) { return (int)(8 * l / bs); }

/* sum over the nb blocks of (-zp[b] * sc[b]) * cz[b]; 0 without zero points */
static float zero_term(const uint8_t *zp, const float *sc, const float *cz, int64_t nb)
{
    float s = 0;
    for (int64_t b = 0; zp && b < nb; b++) s += -(float)zp[b] * sc[b] * cz[b];
    return s;
}

/* Scales of step z's lanes start at block base; fewer than 8 are left in the row's last steps. */
static inline int64_t scales_left(int64_t nb, int64_t base) { return nb - base < 8 ? nb - base : 8; }

/* Weight row n's bytes of step z; the last partial step comes from a zero-padded copy. */
static inline const uint8_t *step_bytes(const uint8_t *row, const uint8_t *tail, int64_t z, int64_t full)
{
    return z < full ? row + 64 * z : tail;
}

static void cols_c(const q8_job *j, int64_t n0, int64_t n1)
{
    const kiln_nbits_q8_w *w = j->w;
    int64_t bs = w->block_size, rowb = j->nb * bs / 2, full = rowb / 64, ns = w->ns;
    uint8_t tail[64] = {0};
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = w->q + n * rowb;
        if (full < j->steps) memcpy(tail, row + 64 * full, (size_t)(rowb - 64 * full));
        for (int64_t m = 0; m < j->M; m++) {
            float acc = 0;
            for (int64_t z = 0; z < j->steps; z++) {
                const uint8_t *x = step_bytes(row, tail, z, full);
                const int8_t *a = j->qa + (m * j->steps + z) * 128;
                int64_t base = z * 128 / bs, left = scales_left(j->nb, base), e = (m * j->steps + z) * 16;
                const float *s = w->scale + n * ns + base;
                for (int l = 0; l < 16; l++) {
                    if (lane_block(l, bs) >= left) break; /* past the row's blocks */
                    int32_t d = j->zi[e + l];
                    for (int b = 4 * l; b < 4 * l + 4; b++) d += (x[b] & 15) * a[b] + (x[b] >> 4) * a[64 + b];
                    acc += (float)d * (s[lane_block(l, bs)] * j->sl[e + l]);
                }
            }
            acc += zero_term(w->zp ? w->zp + n * ns : NULL, w->scale + n * ns, j->cz + m * j->nbz, j->nb);
            j->y[m * w->N + n] = acc + (j->bias ? j->bias[n] : 0.0f);
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The rows of A (MR of them, 1 to 3: more run the blocked GEMM) against the weight rows one
 * after another, so a thread's columns are one sequential stream of memory; each step of the
 * weights is split into nibbles and its scales gathered once for the MR rows. (Strips of 4 weight
 * rows, step by step, were 4 streams of a few lines each, of one 4 KB page where K = 2048, which
 * the hardware prefetchers follow poorly: tests/bench/bench_nbits_q8, 2 threads of a Zen 4 VM, one
 * row of A, K = 2048: 16-19 GB/s against 25-30 here, where a plain load loop reads 27.6.) Steps
 * alternate between two accumulators per row of A; prefetches run PF_ROW bytes ahead, into the
 * next weight rows. wide: blocks of 128 or more (one scale per step); common: no per-block zero
 * points. MR, wide and common are constants at every call. */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vnni"))) void
rows_avx512vnni_body(const q8_job *j, int64_t n0, int64_t n1, const int MR, const bool wide, const bool common)
{
    const kiln_nbits_q8_w *w = j->w;
    int64_t bs = w->block_size, nb = j->nb, rowb = nb * bs / 2, full = rowb / 64, ns = w->ns, steps = j->steps;
    const int lb = __builtin_ctzll((unsigned long long)bs); /* log2 of the block */
    const __m512i idx = _mm512_srlv_epi32(_mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120),
                                          _mm512_set1_epi32(lb)); /* lane_block */
    const __m512i m4 = _mm512_set1_epi8(15);
    uint8_t tail[64] = {0};
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = w->q + n * rowb;
        const float *sc = w->scale + n * ns;
        if (full < steps) memcpy(tail, row + 64 * full, (size_t)(rowb - 64 * full));
        __m512 acc[3][2];
        for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        for (int64_t z0 = 0; z0 < steps; z0 += 2) {
#pragma GCC unroll 2
            for (int u = 0; u < 2; u++) {
                int64_t z = z0 + u, base = z * 128 >> lb; /* no division in the loop */
                if (z >= steps) break;
                _mm_prefetch((const char *)(row + 64 * z + PF_ROW), _MM_HINT_T0);
                __m512i x = _mm512_loadu_si512(step_bytes(row, tail, z, full));
                __m512i lo = _mm512_and_si512(x, m4), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
                __mmask16 km = (__mmask16)((1u << scales_left(nb, base)) - 1);
                __m512 s = wide ? _mm512_set1_ps(sc[base])
                                : _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps(km, sc + base));
#pragma GCC unroll 3
                for (int i = 0; i < MR; i++) {
                    int64_t e = i * steps + z;
                    const int8_t *a = j->qa + e * 128;
                    __m512i d = common ? _mm512_loadu_si512(j->zi + e * 16) : _mm512_setzero_si512();
                    d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(d, lo, _mm512_loadu_si512(a)), hi, _mm512_loadu_si512(a + 64));
                    __m512 sa = _mm512_mul_ps(s, _mm512_loadu_ps(j->sl + e * 16));
                    acc[i][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sa, acc[i][u]);
                }
            }
        }
        for (int i = 0; i < MR; i++) {
            __m512 t = _mm512_add_ps(acc[i][0], acc[i][1]);
            for (int64_t b = 0; !common && b < nb; b += 16) { /* t -= (zp * s) * cz */
                __mmask16 k = nb - b >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nb - b)) - 1);
                __m128i zb = _mm512_castsi512_si128(_mm512_maskz_loadu_epi8((__mmask64)k, w->zp + n * ns + b));
                __m512 zs = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(zb)), _mm512_maskz_loadu_ps(k, sc + b));
                t = _mm512_fnmadd_ps(zs, _mm512_loadu_ps(j->cz + i * j->nbz + b), t);
            }
            j->y[i * w->N + n] = _mm512_reduce_add_ps(t) + (j->bias ? j->bias[n] : 0.0f);
        }
    }
}

/* rows_avx512vnni_body with the block width and the kind of zero point fixed at compile time. */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vnni"))) void
rows_avx512vnni(const q8_job *j, int64_t n0, int64_t n1, const int MR)
{
    bool wide = j->w->block_size >= 128, common = !j->w->zp;
    if (wide && common) rows_avx512vnni_body(j, n0, n1, MR, true, true);
    else if (wide) rows_avx512vnni_body(j, n0, n1, MR, true, false);
    else if (common) rows_avx512vnni_body(j, n0, n1, MR, false, true);
    else rows_avx512vnni_body(j, n0, n1, MR, false, false);
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void cols_avx512vnni(const q8_job *j, int64_t n0, int64_t n1)
{
    if (j->M == 1) rows_avx512vnni(j, n0, n1, 1);
    else if (j->M == 2) rows_avx512vnni(j, n0, n1, 2);
    else rows_avx512vnni(j, n0, n1, 3);
}

__attribute__((target("avx2,fma"))) static float hsum256(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

/* zero_term 8 blocks at a time (the sum in another order) */
__attribute__((target("avx2,fma"))) static float zero_term_avx2(const uint8_t *zp, const float *sc, const float *cz, int64_t nb)
{
    if (!zp) return 0;
    __m256 t = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m256 z = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(zp + b))));
        t = _mm256_fnmadd_ps(_mm256_mul_ps(z, _mm256_loadu_ps(sc + b)), _mm256_loadu_ps(cz + b), t);
    }
    return hsum256(t) + zero_term(zp + b, sc + b, cz + b, nb - b);
}

/* As rows_avx512vnni_body, a step as two halves of 32 bytes: vpmaddubsw (no saturation: 15 * 127
 * * 2 fits int16), the even and odd nibbles' pairs added in int16 (4 products: fits), vpmaddwd
 * against ones sums them into int32 lanes of 8 elements. Blocks of 128 or more span the step:
 * both halves are added in int16 too (8 products) and take one scale (no gather); smaller
 * blocks gather their lanes' scales with a masked load (no copy of a row's last scales). Each
 * row of A reads a weight row in turn (again from L1 after the first). */
static inline __attribute__((always_inline, target("avx2,fma"))) void
rows_avx2_body(const q8_job *j, int64_t n0, int64_t n1, const bool wide, const bool common)
{
    const kiln_nbits_q8_w *w = j->w;
    int64_t bs = w->block_size, nb = j->nb, rowb = nb * bs / 2, full = rowb / 64, ns = w->ns, steps = j->steps;
    const int lb = __builtin_ctzll((unsigned long long)bs); /* log2 of the block */
    int32_t li[16];
    for (int l = 0; l < 16; l++) li[l] = lane_block(l, bs);
    const __m256i idx0 = _mm256_loadu_si256((const __m256i *)li), idx1 = _mm256_loadu_si256((const __m256i *)(li + 8));
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    uint8_t tail[64] = {0};
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = w->q + n * rowb;
        const float *sc = w->scale + n * ns;
        if (full < steps) memcpy(tail, row + 64 * full, (size_t)(rowb - 64 * full));
        for (int64_t m = 0; m < j->M; m++) {
            __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
            for (int64_t z0 = 0; z0 < steps; z0 += 2) {
#pragma GCC unroll 2
                for (int u = 0; u < 2; u++) {
                    int64_t z = z0 + u, base = z * 128 >> lb, e = m * steps + z; /* no division */
                    if (z >= steps) break;
                    const uint8_t *x = step_bytes(row, tail, z, full);
                    const __m256i *a = (const __m256i *)(j->qa + e * 128), *zi = (const __m256i *)(j->zi + e * 16);
                    const float *sl = j->sl + e * 16;
                    if (m == 0) _mm_prefetch((const char *)(row + 64 * z + PF_ROW), _MM_HINT_T0);
                    __m256i x0 = _mm256_loadu_si256((const __m256i *)x), x1 = _mm256_loadu_si256((const __m256i *)(x + 32));
                    __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(x0, m4), _mm256_loadu_si256(a)),
                                                  _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(x0, 4), m4),
                                                                       _mm256_loadu_si256(a + 2)));
                    __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(x1, m4), _mm256_loadu_si256(a + 1)),
                                                  _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(x1, 4), m4),
                                                                       _mm256_loadu_si256(a + 3)));
                    const __m256 sa0 = _mm256_loadu_ps(sl);
                    if (wide) {
                        __m256i d = _mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones);
                        if (common)
                            d = _mm256_add_epi32(d, _mm256_add_epi32(_mm256_loadu_si256(zi), _mm256_loadu_si256(zi + 1)));
                        __m256 s = _mm256_mul_ps(_mm256_set1_ps(sc[base]), sa0);
                        acc[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), s, acc[u]);
                    } else {
                        const __m256i km = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)scales_left(nb, base)), iota);
                        __m256 sv = _mm256_maskload_ps(sc + base, km);
                        __m256i d0 = _mm256_madd_epi16(p0, ones), d1 = _mm256_madd_epi16(p1, ones);
                        if (common) {
                            d0 = _mm256_add_epi32(d0, _mm256_loadu_si256(zi));
                            d1 = _mm256_add_epi32(d1, _mm256_loadu_si256(zi + 1));
                        }
                        __m256 s0 = _mm256_mul_ps(_mm256_permutevar8x32_ps(sv, idx0), sa0);
                        __m256 s1 = _mm256_mul_ps(_mm256_permutevar8x32_ps(sv, idx1), _mm256_loadu_ps(sl + 8));
                        acc[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), s0, acc[u]);
                        acc[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), s1, acc[u]);
                    }
                }
            }
            float t = hsum256(_mm256_add_ps(acc[0], acc[1]));
            t += zero_term_avx2(common ? NULL : w->zp + n * ns, sc, j->cz + m * j->nbz, nb);
            j->y[m * w->N + n] = t + (j->bias ? j->bias[n] : 0.0f);
        }
    }
}

/* rows_avx2_body with the block width and the kind of zero point fixed at compile time (fewer
 * live registers: the accumulators stay out of the stack). */
__attribute__((target("avx2,fma"))) static void cols_avx2(const q8_job *j, int64_t n0, int64_t n1)
{
    bool wide = j->w->block_size >= 128, common = !j->w->zp;
    if (wide && common) rows_avx2_body(j, n0, n1, true, true);
    else if (wide) rows_avx2_body(j, n0, n1, true, false);
    else if (common) rows_avx2_body(j, n0, n1, false, true);
    else rows_avx2_body(j, n0, n1, false, false);
}
#endif

/* One call's preparation of A: row m quantized into flat (element order), then laid out as
 * q8_job's qa, sl and cz. */
typedef struct prep_job {
    const float *A;
    int64_t K, bs, nb, steps, nbz;  /* nbz: nb rounded up to 16 */
    int8_t *flat, *qa;  /* [M, steps * 128] each */
    float *sa, *sl, *cz; /* [M, nbz], [M, steps, 16], [M, nbz] */
    int32_t *zi;        /* [M, steps, 16] */
    int32_t zero;       /* the common zero point, or 0 with per-block offsets */
    kiln_nbits_q8_level level;
} prep_job;

/* Blocks of row a quantized into flat, their scales into sa and scale * sum into c. */
static void quant_row_c(const prep_job *j, const float *a, int8_t *flat, float *sa, float *c)
{
    for (int64_t b = 0; b < j->nb; b++) {
        int64_t len = j->K - b * j->bs < j->bs ? j->K - b * j->bs : j->bs;
        sa[b] = kiln_nbits_quantize_a(a + b * j->bs, len, flat + b * j->bs);
        int32_t sum = 0;
        for (int64_t i = 0; i < len; i++) sum += flat[b * j->bs + i];
        c[b] = sa[b] * (float)sum;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* quant_row_c 16 floats at a time, bit for bit: the maximum is exact, the product one rounding,
 * max/min with the bound second keep a NaN out as the comparisons do, and vcvtps2dq rounds half
 * to even as the 1.5 * 2^23 trick does in the default rounding mode. */
__attribute__((target("avx512f,avx512bw"))) static void quant_row_avx512(const prep_job *j, const float *a, int8_t *flat,
                                                                         float *sa, float *c)
{
    for (int64_t b = 0; b < j->nb; b++) {
        int64_t len = j->K - b * j->bs < j->bs ? j->K - b * j->bs : j->bs;
        const float *x = a + b * j->bs;
        __m512 mx = _mm512_setzero_ps();
        for (int64_t i = 0; i < len; i += 16) {
            __mmask16 k = len - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (len - i)) - 1);
            mx = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(k, x + i)), mx);
        }
        float amax = _mm512_reduce_max_ps(mx), inv = amax > 0 ? 127.0f / amax : 0.0f;
        __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
        __m512i sum = _mm512_setzero_si512();
        for (int64_t i = 0; i < len; i += 16) {
            __mmask16 k = len - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (len - i)) - 1);
            __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), vinv), lo), hi);
            __m512i q = _mm512_maskz_mov_epi32(k, _mm512_cvtps_epi32(v));
            sum = _mm512_add_epi32(sum, q);
            _mm512_mask_cvtepi32_storeu_epi8(flat + b * j->bs + i, k, q);
        }
        sa[b] = amax / 127.0f;
        c[b] = sa[b] * (float)_mm512_reduce_add_epi32(sum);
    }
}

/* 128 bytes of flat as 64 even then 64 odd elements: bytes split within 16-byte lanes, the
 * halves gathered by 64-bit and 128-bit permutes. */
__attribute__((target("avx512f,avx512bw"))) static void interleave_avx512(const int8_t *flat, int8_t *dst, int64_t steps)
{
    const __m512i eo = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    const __m512i q = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
    for (int64_t z = 0; z < steps; z++) {
        __m512i a = _mm512_permutexvar_epi64(q, _mm512_shuffle_epi8(_mm512_loadu_si512(flat + z * 128), eo));
        __m512i b = _mm512_permutexvar_epi64(q, _mm512_shuffle_epi8(_mm512_loadu_si512(flat + z * 128 + 64), eo));
        _mm512_storeu_si512(dst + z * 128, _mm512_shuffle_i64x2(a, b, 0x44));
        _mm512_storeu_si512(dst + z * 128 + 64, _mm512_shuffle_i64x2(a, b, 0xee));
    }
}
#endif

static void prep_task(void *ctx, int64_t m0, int64_t m1)
{
    const prep_job *j = ctx;
    int64_t steps = j->steps, ns = j->nbz;
    for (int64_t m = m0; m < m1; m++) {
        int8_t *flat = j->flat + m * steps * 128, *dst = j->qa + m * steps * 128;
        float *sa = j->sa + m * ns, *c = j->cz + m * ns;
        memset(flat, 0, (size_t)(steps * 128));
        for (int64_t b = 0; b < ns; b++) sa[b] = c[b] = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
        if (j->level == KILN_NBITS_Q8_AVX512VNNI) {
            quant_row_avx512(j, j->A + m * j->K, flat, sa, c);
            interleave_avx512(flat, dst, steps);
        } else
#endif
        {
            quant_row_c(j, j->A + m * j->K, flat, sa, c);
            for (int64_t z = 0; z < steps; z++)
                for (int p = 0; p < 64; p++) {
                    dst[z * 128 + p] = flat[z * 128 + 2 * p];
                    dst[z * 128 + 64 + p] = flat[z * 128 + 2 * p + 1];
                }
        }
        for (int64_t z = 0; z < steps; z++)
            for (int l = 0; l < 16; l++) {
                int32_t sum = 0;
                for (int e = 0; e < 8; e++) sum += flat[z * 128 + 8 * l + e];
                j->sl[(m * steps + z) * 16 + l] = sa[(z * 128 + 8 * l) / j->bs];
                j->zi[(m * steps + z) * 16 + l] = -j->zero * sum;
            }
    }
}

static void q8_task(void *ctx, int64_t t0, int64_t t1)
{
    const q8_job *j = ctx;
    int64_t n0 = t0 * COLS_PER_TASK, n1 = t1 * COLS_PER_TASK < j->w->N ? t1 * COLS_PER_TASK : j->w->N;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (j->level == KILN_NBITS_Q8_AVX512VNNI) return cols_avx512vnni(j, n0, n1);
    if (j->level == KILN_NBITS_Q8_AVX2) return cols_avx2(j, n0, n1);
#endif
    cols_c(j, n0, n1);
}

/* ---- The blocked GEMM (M >= GEMM_MIN_M): W unpacked once per call, reused by every row ----
 *
 * Columns go in panels of NR = 16: a task unpacks a panel's 4-bit weights into bytes 0..15 laid
 * out as [nb * bs / 4 groups][16 columns][4 elements] (the 4 consecutive elements of a group
 * are what one 32-bit lane of vpdpbusd / vpmaddubsw + vpmaddwd sums), with the panel's scales
 * and zero points as [nb][16], then runs all M rows of A against it, MR rows at a time, each 4
 * bytes of A broadcast to every lane. Per block and output, in this order at every level: d =
 * the exact integer dot of q and quantized A over the block, d -= zero point * (sum of A's
 * quantized block), acc = fma((float)d, w scale * A scale, acc); then y = acc + bias. Every
 * level computes the same float operations in the same order, so the results are bitwise equal
 * across levels (tests/unit/test_nbits_q8.c checks it). */
enum { GEMM_MIN_M = 4, NR = 16 };

typedef struct gm_job {
    const kiln_nbits_q8_w *w;
    int64_t M, nb, kp;        /* kp: nb * block_size, A's padded row length */
    const int8_t *qa;         /* [M, kp] in element order, zeros past K */
    const float *sa;          /* [M, nbz] A scale per block */
    const int32_t *suma;      /* [M, nbz] sum of A's quantized block */
    int64_t nbz;
    const float *bias;
    float *y;
    uint8_t *work;            /* [slots][slot_bytes] */
    int64_t slot_bytes, panels;
    atomic_int_fast64_t next;
    kiln_nbits_q8_level level;
} gm_job;

/* One panel's unpacked weights. */
typedef struct gm_panel {
    uint8_t *q;     /* [kp / 4][NR][4] */
    float *sw;      /* [nb][NR] weight scales, 0 past the columns */
    int32_t *zw;    /* [nb][NR] zero points */
} gm_panel;

static void gm_pack_c(const gm_job *j, int64_t n0, const gm_panel *pn)
{
    const kiln_nbits_q8_w *w = j->w;
    int64_t bs = w->block_size, rowb = j->nb * bs / 2;
    for (int c = 0; c < NR; c++) {
        int64_t n = n0 + c < w->N ? n0 + c : -1;
        const uint8_t *row = n >= 0 ? w->q + n * rowb : NULL;
        for (int64_t k = 0; k < j->kp; k += 2) {
            uint8_t b = row ? row[k / 2] : 0;
            uint8_t *d = pn->q + ((k / 4) * NR + c) * 4 + k % 4;
            d[0] = b & 15, d[1] = b >> 4;
        }
        for (int64_t b = 0; b < j->nb; b++) {
            pn->sw[b * NR + c] = n >= 0 ? w->scale[n * w->ns + b] : 0.0f;
            pn->zw[b * NR + c] = n < 0 ? 0 : w->zp ? w->zp[n * w->ns + b] : w->zero;
        }
    }
}

static void gm_rows_c(const gm_job *j, const gm_panel *pn, int64_t n0)
{
    const kiln_nbits_q8_w *w = j->w;
    int64_t bs = w->block_size, cols = w->N - n0 < NR ? w->N - n0 : NR;
    for (int64_t m = 0; m < j->M; m++) {
        const int8_t *a = j->qa + m * j->kp;
        for (int64_t c = 0; c < cols; c++) {
            float acc = 0;
            for (int64_t b = 0; b < j->nb; b++) {
                int32_t d = 0;
                for (int64_t k = b * bs; k < (b + 1) * bs; k++) d += pn->q[((k / 4) * NR + c) * 4 + k % 4] * a[k];
                d -= pn->zw[b * NR + c] * j->suma[m * j->nbz + b];
                float s = pn->sw[b * NR + c] * j->sa[m * j->nbz + b];
                acc = fmaf((float)d, s, acc);
            }
            j->y[m * w->N + n0 + c] = acc + (j->bias ? j->bias[n0 + c] : 0.0f);
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* gm_pack_c: 8 columns x 32 elements at a time, nibbles split into element order and the
 * 32-bit groups transposed into the panel. */
__attribute__((target("avx2,fma"))) static void gm_pack_avx2(const gm_job *j, int64_t n0, const gm_panel *pn)
{
    const kiln_nbits_q8_w *w = j->w;
    int64_t bs = w->block_size, rowb = j->nb * bs / 2;
    if (n0 + NR > w->N) return gm_pack_c(j, n0, pn);
    const __m128i m4 = _mm_set1_epi8(15);
    for (int h = 0; h < NR; h += 8) {
        const uint8_t *row = w->q + (n0 + h) * rowb;
        int64_t k = 0;
        for (; k + 32 <= j->kp; k += 32) {
            __m256i r[8];
            for (int c = 0; c < 8; c++) {
                __m128i b = _mm_loadu_si128((const __m128i *)(row + c * rowb + k / 2));
                __m128i lo = _mm_and_si128(b, m4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m4);
                r[c] = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
            }
            /* 8x8 transpose of 32-bit groups: out[t] = group t of columns 0..7 */
            __m256 g[8];
            for (int c = 0; c < 8; c++) g[c] = _mm256_castsi256_ps(r[c]);
            kiln_transpose8(g);
            float *d = (float *)(pn->q + (k / 4) * NR * 4) + h;
            for (int t = 0; t < 8; t++) _mm256_storeu_ps(d + t * NR, g[t]);
        }
        for (; k < j->kp; k += 2) /* a last block of 16 */
            for (int c = 0; c < 8; c++) {
                uint8_t b = row[c * rowb + k / 2], *d = pn->q + ((k / 4) * NR + h + c) * 4 + k % 4;
                d[0] = b & 15, d[1] = b >> 4;
            }
    }
    for (int c = 0; c < NR; c++)
        for (int64_t b = 0; b < j->nb; b++) {
            int64_t n = n0 + c;
            pn->sw[b * NR + c] = w->scale[n * w->ns + b];
            pn->zw[b * NR + c] = w->zp ? w->zp[n * w->ns + b] : w->zero;
        }
}

/* Rows [m0, m0 + MR) against one panel: vpmaddubsw (15 * 127 * 2 fits int16) sums pairs of
 * bytes into int16 lanes, up to 8 groups (32 elements: 8 * 3810 fits) added in int16, then
 * vpmaddwd against ones widens them into the block's int32 sums. */
static inline __attribute__((always_inline, target("avx2,fma"))) void
gm_block_avx2(const gm_job *j, const gm_panel *pn, int64_t n0, int64_t m0, const int MR)
{
    const kiln_nbits_q8_w *w = j->w;
    int64_t bs = w->block_size, sub = bs < 32 ? bs : 32;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4][2];
    #pragma GCC unroll 8
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const int8_t *a0 = j->qa + m0 * j->kp;
    for (int64_t b = 0; b < j->nb; b++) {
        __m256i d[4][2];
        #pragma GCC unroll 8
        for (int i = 0; i < MR; i++) d[i][0] = d[i][1] = _mm256_setzero_si256();
        for (int64_t k0 = b * bs; k0 < (b + 1) * bs; k0 += sub) {
            __m256i s16[4][2];
            #pragma GCC unroll 8
            for (int i = 0; i < MR; i++) s16[i][0] = s16[i][1] = _mm256_setzero_si256();
            const uint8_t *q = pn->q + k0 * NR;
            for (int64_t k = k0; k < k0 + sub; k += 4, q += 4 * NR) {
                __m256i w0 = _mm256_loadu_si256((const __m256i *)q), w1 = _mm256_loadu_si256((const __m256i *)(q + 32));
                #pragma GCC unroll 8
                for (int i = 0; i < MR; i++) {
                    int32_t a4;
                    memcpy(&a4, a0 + i * j->kp + k, 4);
                    __m256i av = _mm256_set1_epi32(a4);
                    s16[i][0] = _mm256_add_epi16(s16[i][0], _mm256_maddubs_epi16(w0, av));
                    s16[i][1] = _mm256_add_epi16(s16[i][1], _mm256_maddubs_epi16(w1, av));
                }
            }
            #pragma GCC unroll 8
            for (int i = 0; i < MR; i++) {
                d[i][0] = _mm256_add_epi32(d[i][0], _mm256_madd_epi16(s16[i][0], ones));
                d[i][1] = _mm256_add_epi32(d[i][1], _mm256_madd_epi16(s16[i][1], ones));
            }
        }
        #pragma GCC unroll 8
        for (int h = 0; h < 2; h++) {
            __m256 sw = _mm256_loadu_ps(pn->sw + b * NR + 8 * h);
            __m256i zw = _mm256_loadu_si256((const __m256i *)(pn->zw + b * NR + 8 * h));
            #pragma GCC unroll 8
            for (int i = 0; i < MR; i++) {
                int64_t e = (m0 + i) * j->nbz + b;
                __m256i t = _mm256_sub_epi32(d[i][h], _mm256_mullo_epi32(zw, _mm256_set1_epi32(j->suma[e])));
                acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(sw, _mm256_set1_ps(j->sa[e])), acc[i][h]);
            }
        }
    }
    int64_t cols = w->N - n0 < NR ? w->N - n0 : NR;
    #pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        float out[NR];
        _mm256_storeu_ps(out, acc[i][0]), _mm256_storeu_ps(out + 8, acc[i][1]);
        float *y = j->y + (m0 + i) * w->N + n0;
        for (int64_t c = 0; c < cols; c++) y[c] = out[c] + (j->bias ? j->bias[n0 + c] : 0.0f);
    }
}

__attribute__((target("avx2,fma"))) static void gm_rows_avx2(const gm_job *j, const gm_panel *pn, int64_t n0)
{
    int64_t m = 0;
    for (; m + 4 <= j->M; m += 4) gm_block_avx2(j, pn, n0, m, 4);
    for (; m < j->M; m++) gm_block_avx2(j, pn, n0, m, 1);
}

/* As gm_block_avx2 with vpdpbusd: 16 columns in one register, the int32 sums directly. */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vnni"))) void
gm_block_avx512vnni(const gm_job *j, const gm_panel *pn, int64_t n0, int64_t m0, const int MR)
{
    const kiln_nbits_q8_w *w = j->w;
    int64_t bs = w->block_size;
    __m512 acc[8];
    #pragma GCC unroll 8
    for (int i = 0; i < MR; i++) acc[i] = _mm512_setzero_ps();
    const int8_t *a0 = j->qa + m0 * j->kp;
    for (int64_t b = 0; b < j->nb; b++) {
        __m512i d[8];
        #pragma GCC unroll 8
        for (int i = 0; i < MR; i++) d[i] = _mm512_setzero_si512();
        const uint8_t *q = pn->q + b * bs * NR;
        for (int64_t k = b * bs; k < (b + 1) * bs; k += 4, q += 4 * NR) {
            __m512i wv = _mm512_loadu_si512(q);
            #pragma GCC unroll 8
            for (int i = 0; i < MR; i++) {
                int32_t a4;
                memcpy(&a4, a0 + i * j->kp + k, 4);
                d[i] = _mm512_dpbusd_epi32(d[i], wv, _mm512_set1_epi32(a4));
            }
        }
        __m512 sw = _mm512_loadu_ps(pn->sw + b * NR);
        __m512i zw = _mm512_loadu_si512(pn->zw + b * NR);
        #pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            int64_t e = (m0 + i) * j->nbz + b;
            __m512i t = _mm512_sub_epi32(d[i], _mm512_mullo_epi32(zw, _mm512_set1_epi32(j->suma[e])));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(sw, _mm512_set1_ps(j->sa[e])), acc[i]);
        }
    }
    int64_t cols = w->N - n0 < NR ? w->N - n0 : NR;
    #pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        float out[NR];
        _mm512_storeu_ps(out, acc[i]);
        float *y = j->y + (m0 + i) * w->N + n0;
        for (int64_t c = 0; c < cols; c++) y[c] = out[c] + (j->bias ? j->bias[n0 + c] : 0.0f);
    }
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void gm_rows_avx512vnni(const gm_job *j, const gm_panel *pn,
                                                                                       int64_t n0)
{
    int64_t m = 0;
    for (; m + 8 <= j->M; m += 8) gm_block_avx512vnni(j, pn, n0, m, 8);
    for (; m + 4 <= j->M; m += 4) gm_block_avx512vnni(j, pn, n0, m, 4);
    for (; m < j->M; m++) gm_block_avx512vnni(j, pn, n0, m, 1);
}
#endif

/* One slot of the pool: panels taken from the shared counter until none are left. */
static void gm_slot(void *ctx, int64_t s0, int64_t s1)
{
    gm_job *j = ctx;
    for (int64_t s = s0; s < s1; s++) {
        uint8_t *base = j->work + s * j->slot_bytes;
        gm_panel pn = {base, (float *)(base + j->kp * NR), (int32_t *)(base + j->kp * NR) + j->nb * NR};
        for (;;) {
            int64_t t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
            if (t >= j->panels) break;
            int64_t n0 = t * NR;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
            if (j->level == KILN_NBITS_Q8_AVX512VNNI) {
                gm_pack_avx2(j, n0, &pn);
                gm_rows_avx512vnni(j, &pn, n0);
                continue;
            }
            if (j->level == KILN_NBITS_Q8_AVX2) {
                gm_pack_avx2(j, n0, &pn);
                gm_rows_avx2(j, &pn, n0);
                continue;
            }
#endif
            gm_pack_c(j, n0, &pn);
            gm_rows_c(j, &pn, n0);
        }
    }
}

/* A's rows quantized for the GEMM: element order, scales and integer sums per block. */
typedef struct gprep_job {
    const float *A;
    int64_t K, bs, nb, kp, nbz;
    int8_t *qa;
    float *sa;
    int32_t *suma;
} gprep_job;

static void gprep_task(void *ctx, int64_t m0, int64_t m1)
{
    const gprep_job *j = ctx;
    for (int64_t m = m0; m < m1; m++) {
        int8_t *qa = j->qa + m * j->kp;
        memset(qa, 0, (size_t)j->kp);
        for (int64_t b = 0; b < j->nb; b++) {
            int64_t len = j->K - b * j->bs < j->bs ? j->K - b * j->bs : j->bs;
            j->sa[m * j->nbz + b] = kiln_nbits_quantize_a(j->A + m * j->K + b * j->bs, len, qa + b * j->bs);
            int32_t sum = 0;
            for (int64_t i = 0; i < len; i++) sum += qa[b * j->bs + i];
            j->suma[m * j->nbz + b] = sum;
        }
    }
}

static kiln_status q8_gemm_blocked(kiln_nbits_q8_level level, struct kiln_threadpool *pool, struct kiln_scratch *scratch,
                                   const kiln_nbits_q8_w *w, int64_t M, const float *A, const float *bias, float *Y)
{
    int64_t bs = w->block_size, nb = (w->K + bs - 1) / bs, kp = nb * bs, nbz = nb;
    int64_t slots = kiln_threadpool_size(pool), panels = (w->N + NR - 1) / NR;
    if (slots > panels) slots = panels;
    int64_t slot_bytes = (kp * NR + nb * NR * 8 + 63) / 64 * 64;
    size_t bytes = (size_t)(M * kp) + (size_t)(M * nbz) * 8 + (size_t)(slots * slot_bytes) + 64;
    uint8_t *buf = kiln_scratch_get(scratch, bytes);
    if (!buf) return KILN_ERR_NOMEM;
    uint8_t *work = buf; /* 64-byte aligned, slot_bytes a multiple of 64 */
    float *sa = (float *)(work + slots * slot_bytes);
    int32_t *suma = (int32_t *)(sa + M * nbz);
    int8_t *qa = (int8_t *)(suma + M * nbz);
    gprep_job pj = {A, w->K, bs, nb, kp, nbz, qa, sa, suma};
    kiln_threadpool_parallel_for(M >= 8 ? pool : NULL, M, gprep_task, &pj);
    gm_job j = {w, M, nb, kp, qa, sa, suma, nbz, bias, Y, work, slot_bytes, panels, 0, level};
    atomic_init(&j.next, 0);
    kiln_threadpool_parallel_for(pool, slots, gm_slot, &j);
    kiln_scratch_put(scratch, buf);
    return KILN_OK;
}

kiln_status kiln_nbits_q8_gemm(kiln_nbits_q8_level level, struct kiln_threadpool *pool, struct kiln_scratch *scratch,
                               const kiln_nbits_q8_w *w, int64_t M, const float *A, const float *bias, float *Y)
{
    if (!w || M < 0 || w->K <= 0 || w->N <= 0 || w->block_size < 16 || w->block_size > 256 ||
        (w->block_size & (w->block_size - 1)) || w->ns < (w->K + w->block_size - 1) / w->block_size ||
        (!w->zp && (w->zero < 0 || w->zero > 15)) || !kiln_nbits_q8_level_supported(level) ||
        (M && (!A || !Y || !w->q || !w->scale)))
        return KILN_ERR_INVALID_ARG;
    if (!M) return KILN_OK;
    if (level == KILN_NBITS_Q8_AUTO) level = kiln_nbits_q8_level_detect();
    if (M >= GEMM_MIN_M) return q8_gemm_blocked(level, pool, scratch, w, M, A, bias, Y);
    int64_t K = w->K, bs = w->block_size, nb = (K + bs - 1) / bs, steps = (nb * bs + 127) / 128, nbz = (nb + 15) / 16 * 16;
    size_t bytes = (size_t)(2 * M * steps * 128) + (size_t)(2 * M * steps * 16 + 2 * M * nbz) * sizeof(float);
    float *fl = kiln_scratch_get(scratch, bytes);
    if (!fl) return KILN_ERR_NOMEM;
    float *sl = fl, *cz = sl + M * steps * 16, *sa = cz + M * nbz;
    int32_t *zi = (int32_t *)(sa + M * nbz);
    int8_t *qa = (int8_t *)(zi + M * steps * 16), *flat = qa + M * steps * 128;
    prep_job pj = {A, K, bs, nb, steps, nbz, flat, qa, sa, sl, cz, zi, w->zp ? 0 : w->zero, level};
    kiln_threadpool_parallel_for(M >= 8 ? pool : NULL, M, prep_task, &pj); /* a few rows: not worth a wake-up */
    q8_job j = {w, M, nb, steps, qa, sl, zi, cz, nbz, bias, Y, level};
    /* a small product (a toy model's decode step) runs here: waking a worker costs more */
    bool small = (double)M * (double)w->N * (double)K < KILN_NBITS_MIN_PARALLEL_MACS;
    kiln_threadpool_parallel_for(small ? NULL : pool, (w->N + COLS_PER_TASK - 1) / COLS_PER_TASK, q8_task, &j);
    kiln_scratch_put(scratch, fl);
    return KILN_OK;
}
