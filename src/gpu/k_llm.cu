/* k_llm.cu - the llm family's GPU kernels. MatMulNBits with up to 8 rows of A: float16 A with 4
 * bits in blocks of 128 or 256 takes the tensor-core kernel (weights copied ahead by cp.async,
 * nibbles to halves by LOP3, mma with A as the B operand); other 4-bit power-of-two blocks of 32
 * or more the staged kernel (A as float in shared memory, 16-byte weight loads, nibbles to floats
 * by byte permutation); the rest a warp per output column over the column's packed 32-bit words;
 * fp32 partial sums per K split. Larger M dequantizes the
 * weight for cuBLAS. GroupQueryAttention: one thread per K/V element writes the
 * present cache, then one block per (query row, head, batch row) attends: its warps take the
 * keys in turn with an online softmax (fp32) and combine through shared memory. The RMS
 * normalizations give a block to each row; rotary is one thread per element. */
#include <math.h>

#include "gpu/k_llm.h"
#include "gpu/kcommon.cuh"

extern "C" unsigned kiln_gpu_blocks(int64_t n, unsigned block);

#define BLOCK 256
#define WARPS (BLOCK / 32)

/* A float32 or float16 value of a parameter tensor (scales, typed zero points), as float. */
__device__ __forceinline__ float load_param(int dt, const void *p, int64_t i)
{
    if (dt == KILN_DTYPE_FLOAT16) return kiln_to_f<kiln_gpu_half>(((const kiln_gpu_half *)p)[i]);
    if (dt == KILN_DTYPE_BFLOAT16) return kiln_to_f<kiln_gpu_bf16>(((const kiln_gpu_bf16 *)p)[i]);
    return ((const float *)p)[i];
}

/* ---- MatMulNBits ---- */

/* Scale and zero point of block blk of column n. */
__device__ __forceinline__ void nbits_block(const kiln_gpu_nbits &a, int64_t n, int64_t blk, float *scale, float *zero)
{
    int64_t i = n * a.n_blocks + blk;
    *scale = load_param(a.s_dtype, a.scales, i);
    if (a.zp_mode == KILN_GPU_ZP_NONE) {
        *zero = (float)(1 << (a.bits - 1));
    } else if (a.zp_mode == KILN_GPU_ZP_PACKED) {
        const uint8_t *z = (const uint8_t *)a.zp;
        if (a.bits == 8) *zero = (float)z[i];
        else *zero = (float)((z[n * ((a.n_blocks + 1) / 2) + blk / 2] >> (4 * (blk & 1))) & 15);
    } else {
        *zero = load_param(a.s_dtype, a.zp, i);
    }
}

/* Column n's sum of row m from K split blockIdx.y: into part, or with one split straight into Y
 * (plus the bias), so that no finishing kernel runs. */
template <typename T>
__device__ __forceinline__ void store_sum(const kiln_gpu_nbits &a, int64_t m, int64_t n, float v, float *part)
{
    if (gridDim.y > 1) {
        part[((int64_t)blockIdx.y * a.M + m) * a.N + n] = v;
        return;
    }
    if (a.bias) v += kiln_to_f<T>(((const T *)a.bias)[n]);
    ((T *)a.Y)[m * a.N + n] = kiln_from_f<T>(v);
}

/* grid (ceil(N / WARPS), splits): warp w of block x takes column n = x * WARPS + w and the
 * words [sp * per, (sp + 1) * per) of its packed row (per = ceil(words / splits)). Each word
 * holds 8 (4 bits) or 4 (8 bits) consecutive k of one block (blobs are multiples of 8 bytes). */
template <typename T>
__global__ void nbits_gemv_kernel(kiln_gpu_nbits a, int64_t per, float *part)
{
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t n = (int64_t)blockIdx.x * WARPS + w;
    if (n >= a.N) return; /* the whole warp: no block-wide synchronisation below */
    const T *A = (const T *)a.A;
    const int64_t words = a.n_blocks * a.blob / 4;
    const uint32_t *row = (const uint32_t *)(a.B + n * a.n_blocks * a.blob);
    const int64_t begin = (int64_t)blockIdx.y * per;
    const int64_t end = begin + per < words ? begin + per : words;
    const int per_word = 32 / (int)a.bits;
    float acc[KILN_GPU_NBITS_GEMV_MAX_M];
#pragma unroll
    for (int m = 0; m < KILN_GPU_NBITS_GEMV_MAX_M; m++) acc[m] = 0.0f;
    for (int64_t wi = begin + lane; wi < end; wi += 32) {
        uint32_t word = row[wi];
        int64_t byte = wi * 4, blk = byte / a.blob;
        int64_t k0 = blk * a.block_size + (byte % a.blob) * 8 / a.bits;
        float sc, zr;
        nbits_block(a, n, blk, &sc, &zr);
        for (int t = 0; t < per_word; t++) {
            int64_t k = k0 + t;
            if (k >= a.K) break; /* the last block's padding */
            uint32_t q = a.bits == 4 ? (word >> (4 * t)) & 15u : (word >> (8 * t)) & 255u;
            float wv = ((float)q - zr) * sc;
#pragma unroll
            for (int m = 0; m < KILN_GPU_NBITS_GEMV_MAX_M; m++)
                if (m < a.M) acc[m] += kiln_to_f<T>(A[m * a.K + k]) * wv;
        }
    }
#pragma unroll
    for (int m = 0; m < KILN_GPU_NBITS_GEMV_MAX_M; m++) {
        if (m >= a.M) break;
        float v = kiln_warp_sum(acc[m]);
        if (lane == 0) store_sum<T>(a, m, n, v, part);
    }
}

/* Eight consecutive elements of A from p as float: one 16-byte (float32: two) load when vec. */
template <typename T>
__device__ __forceinline__ void load8(const T *p, bool vec, float *o)
{
    if (vec && sizeof(T) == 2) {
        uint4 u = *(const uint4 *)p;
        const T *h = (const T *)&u;
#pragma unroll
        for (int j = 0; j < 8; j++) o[j] = kiln_to_f<T>(h[j]);
    } else if (vec && sizeof(T) == 4) {
        float4 x = ((const float4 *)p)[0], y = ((const float4 *)p)[1];
        o[0] = x.x, o[1] = x.y, o[2] = x.z, o[3] = x.w, o[4] = y.x, o[5] = y.y, o[6] = y.z, o[7] = y.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) o[j] = kiln_to_f<T>(p[j]);
    }
}

/* 4 bits, power-of-two block size 2^bs_shift (16 to 256): grid (ceil(N / WARPS), splits); warp
 * w of block x takes column n = x * WARPS + w, and its lanes the 32-bit words [sp * per, (sp +
 * 1) * per) of the packed row in turn. Rows hold blocks back to back, so word i is k = 8 i to
 * 8 i + 7 of block 8 i >> bs_shift: a warp reads 128 contiguous bytes of weights and 32 * 8
 * contiguous elements of each row of A (16-byte loads), and the lanes of one block load the
 * same scale and zero point. K past the last full word is read element by element. */
template <typename T>
__global__ void nbits_gemv4_kernel(kiln_gpu_nbits a, int bs_shift, int64_t per, float *part)
{
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t n = (int64_t)blockIdx.x * WARPS + w;
    if (n >= a.N) return; /* the whole warp */
    const T *A = (const T *)a.A;
    const int64_t words = a.n_blocks * a.blob / 4;
    const uint32_t *row = (const uint32_t *)(a.B + n * a.n_blocks * a.blob);
    const int64_t begin = (int64_t)blockIdx.y * per;
    const int64_t end = begin + per < words ? begin + per : words;
    const bool vec = (a.K & 7) == 0 && ((uintptr_t)A & 15) == 0;
    float acc[KILN_GPU_NBITS_GEMV_MAX_M];
#pragma unroll
    for (int m = 0; m < KILN_GPU_NBITS_GEMV_MAX_M; m++) acc[m] = 0.0f;
#pragma unroll 2
    for (int64_t wi = begin + lane; wi < end; wi += 32) {
        const uint32_t q = row[wi];
        const int64_t k0 = wi * 8;
        float sc, zr;
        nbits_block(a, n, k0 >> bs_shift, &sc, &zr);
        float wv[8];
#pragma unroll
        for (int j = 0; j < 8; j++) wv[j] = ((float)((q >> (4 * j)) & 15u) - zr) * sc;
        const bool full = k0 + 8 <= a.K;
#pragma unroll
        for (int m = 0; m < KILN_GPU_NBITS_GEMV_MAX_M; m++) {
            if (m >= a.M) break;
            const T *Am = A + m * a.K + k0;
            float av[8];
            if (full) {
                load8<T>(Am, vec, av);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) av[j] = k0 + j < a.K ? kiln_to_f<T>(Am[j]) : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < 8; j++) acc[m] += av[j] * wv[j];
        }
    }
#pragma unroll
    for (int m = 0; m < KILN_GPU_NBITS_GEMV_MAX_M; m++) {
        if (m >= a.M) break;
        float v = kiln_warp_sum(acc[m]);
        if (lane == 0) store_sum<T>(a, m, n, v, part);
    }
}

/* 4 bits in power-of-two blocks of 32 to 256 weights (blobs of 16 to 128 bytes: a 16-byte load,
 * a chunk of 32 weights, stays within one block), B 16-byte aligned. grid (blocks, splits),
 * gv_smem(M, kper) bytes of dynamic shared memory. A block stages rows [0, M) of A over its
 * split's k range [y * kper, (y + 1) * kper) as float in shared memory, 36 floats for each 32 k:
 * the 32 values (zeros past K) and their sum; the lanes' 16-byte reads, 36 floats apart, fall in
 * different banks. Its warps then take groups of GV_COLS consecutive columns, group g, g + WARPS
 * * blocks, ..., and the lanes the chunks of the range in turn, GV_U chunks of each column at a
 * time; the next chunks' loads are issued before the current ones are used (and the first ones
 * before the staging).
 *
 * A nibble becomes a float without a conversion instruction: a byte permutation puts it in bits
 * 16-19 of 0x3F000000, the float 0.5 + q / 256 exactly. A chunk's sum is then
 * sum a (q - z) = 256 sum a f - (128 + z) sum a, its scale folded into both factors. */
#define GV_COLS 1
#define GV_U 4
#define GV_BLOCKS_PER_SM 3 /* resident blocks of one row's kernel a multiprocessor, its grid */
#define GV_PAD(k) ((k) + (((k) >> 5) << 2))
#if defined(KILN_HIP)
#define GV_SMEM_MAX (64 * 1024)
#else
#define GV_SMEM_MAX (96 * 1024)
#endif

static int64_t gv_smem(int64_t M, int64_t kper) { return M * GV_PAD(kper) * (int64_t)sizeof(float); }

/* GV_U chunks of GV_COLS columns: the packed weights and, per chunk, 256 * scale and
 * (128 + zero point) * scale. */
struct gv_chunks {
    uint4 q[GV_COLS][GV_U];
    float s2[GV_COLS][GV_U], zc[GV_COLS][GV_U];
};

/* Chunks c, c + 32, ... (below ce) of columns n0, n0 + 1, ...: zeros past the ends. */
__device__ __forceinline__ void gv_fetch(const kiln_gpu_nbits &a, int bs_shift, int64_t n0, int64_t c, int64_t ce,
                                         gv_chunks &x)
{
    const int64_t rowbytes = a.n_blocks * a.blob;
#pragma unroll
    for (int u = 0; u < GV_U; u++) {
        const int64_t ci = c + 32 * u;
#pragma unroll
        for (int j = 0; j < GV_COLS; j++) {
            const int64_t n = n0 + j;
            x.q[j][u] = make_uint4(0u, 0u, 0u, 0u);
            x.s2[j][u] = x.zc[j][u] = 0.0f;
            if (ci < ce && n < a.N) {
                x.q[j][u] = ((const uint4 *)(a.B + n * rowbytes))[ci];
                float sc, z;
                nbits_block(a, n, (ci << 5) >> bs_shift, &sc, &z);
                x.s2[j][u] = 256.0f * sc;
                x.zc[j][u] = (128.0f + z) * sc;
            }
        }
    }
}

/* acc[j][m] += the chunks' products with the staged rows (As: this split's, row stride rowf;
 * chunk ci at (ci - cb) * 36). */
template <int MM>
__device__ __forceinline__ void gv_dot(const gv_chunks &x, const float *As, int rowf, int64_t M, int64_t cb,
                                       int64_t c, int64_t ce, float (&acc)[GV_COLS][MM])
{
#pragma unroll
    for (int u = 0; u < GV_U; u++) {
        const int64_t ci = c + 32 * u;
        if (ci >= ce) break;
        const float *Ak = As + (ci - cb) * 36;
#pragma unroll
        for (int j = 0; j < GV_COLS; j++) {
            const uint32_t qw[4] = {x.q[j][u].x, x.q[j][u].y, x.q[j][u].z, x.q[j][u].w};
            float f[32];
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const uint32_t lo = qw[t] & 0x0F0F0F0Fu, hi = (qw[t] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    f[8 * t + 2 * i] = __uint_as_float(__byte_perm(lo, 0x3F000000u, 0x7054u | (i << 8)));
                    f[8 * t + 2 * i + 1] = __uint_as_float(__byte_perm(hi, 0x3F000000u, 0x7054u | (i << 8)));
                }
            }
#pragma unroll
            for (int m = 0; m < MM; m++) {
                if (m >= M) break;
                const float4 *Am = (const float4 *)(Ak + m * rowf);
                float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float4 v = Am[e];
                    s[e & 3] += v.x * f[4 * e] + v.y * f[4 * e + 1] + v.z * f[4 * e + 2] + v.w * f[4 * e + 3];
                }
                const float asum = Ak[m * rowf + 32];
                acc[j][m] += x.s2[j][u] * ((s[0] + s[1]) + (s[2] + s[3])) - x.zc[j][u] * asum;
            }
        }
    }
}

template <typename T, int MM>
__global__ void __launch_bounds__(BLOCK, MM == 1 ? GV_BLOCKS_PER_SM : 1) nbits_gemv16_kernel(kiln_gpu_nbits a, int bs_shift, int64_t kper, float *part)
{
    extern __shared__ float4 gv_staged[];
    float *As = (float *)gv_staged;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t kpad = a.n_blocks << bs_shift; /* K rounded up to whole blocks */
    const int64_t kb = (int64_t)blockIdx.y * kper;
    const int kn = kb < kpad ? (int)((kb + kper < kpad ? kb + kper : kpad) - kb) : 0; /* a multiple of 32 */
    const int rowf = (int)GV_PAD(kper);
    const int64_t cb = kb >> 5, ce = cb + (kn >> 5);
    const int64_t groups = (a.N + GV_COLS - 1) / GV_COLS, gstep = (int64_t)gridDim.x * WARPS;
    const int64_t iters = ((kn >> 5) + 32 * GV_U - 1) / (32 * GV_U); /* per column group */
    int64_t g = (int64_t)blockIdx.x * WARPS + w, it = 0;
    gv_chunks cur, nxt;
    if (g < groups && iters) gv_fetch(a, bs_shift, g * GV_COLS, cb + lane, ce, cur);
    /* staging: a thread takes 8 consecutive k, the 4 threads of a chunk sum it */
    const T *A = (const T *)a.A;
    const bool vec = (a.K & 7) == 0 && ((uintptr_t)A & 15) == 0;
    for (int m = 0; m < a.M; m++) {
        for (int base = 0; base < kn; base += BLOCK * 8) {
            const int k = base + threadIdx.x * 8;
            const int64_t kk = kb + k;
            const T *src = A + m * a.K + kk;
            float v[8];
            if (k < kn && kk + 8 <= a.K) {
                load8<T>(src, vec, v);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = k < kn && kk + j < a.K ? kiln_to_f<T>(src[j]) : 0.0f;
            }
            float sum = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
            sum += __shfl_xor_sync(KILN_FULL_MASK, sum, 1);
            sum += __shfl_xor_sync(KILN_FULL_MASK, sum, 2);
            if (k < kn) {
                float *d = As + m * rowf + GV_PAD(k);
                ((float4 *)d)[0] = make_float4(v[0], v[1], v[2], v[3]);
                ((float4 *)d)[1] = make_float4(v[4], v[5], v[6], v[7]);
                if ((threadIdx.x & 3) == 0) As[m * rowf + GV_PAD(k) + 32] = sum;
            }
        }
    }
    __syncthreads();
    float acc[GV_COLS][MM];
#pragma unroll
    for (int j = 0; j < GV_COLS; j++)
#pragma unroll
        for (int m = 0; m < MM; m++) acc[j][m] = 0.0f;
    while (g < groups) {
        /* the next item: the next chunks of this group, or the next group's first */
        int64_t g2 = g, it2 = it + 1;
        if (it2 >= iters) g2 += gstep, it2 = 0;
        const bool more = g2 < groups;
        if (more && iters) gv_fetch(a, bs_shift, g2 * GV_COLS, cb + lane + it2 * 32 * GV_U, ce, nxt);
        if (iters) gv_dot<MM>(cur, As, rowf, a.M, cb, cb + lane + it * 32 * GV_U, ce, acc);
        if (it + 1 >= iters) {
#pragma unroll
            for (int j = 0; j < GV_COLS; j++)
#pragma unroll
                for (int m = 0; m < MM; m++) {
                    if (m >= a.M) break;
                    const float v = kiln_warp_sum(acc[j][m]);
                    if (lane == 0 && g * GV_COLS + j < a.N) store_sum<T>(a, m, g * GV_COLS + j, v, part);
                    acc[j][m] = 0.0f;
                }
        }
        cur = nxt;
        g = g2, it = it2;
    }
}

/* The block-size shift of a (0 when not a power of two of 16 to 256) and whether the staged
 * kernel takes it. */
static int nbits_shift(const kiln_gpu_nbits *a)
{
    for (int sh = 4; sh <= 8; sh++)
        if (((int64_t)1 << sh) == a->block_size) return sh;
    return 0;
}

static bool gv_takes(const kiln_gpu_nbits *a)
{
    return a->bits == 4 && nbits_shift(a) >= 5 && a->blob == a->block_size / 2 && ((uintptr_t)a->B & 15) == 0 &&
           (a->dtype == KILN_DTYPE_FLOAT32 || a->dtype == KILN_DTYPE_FLOAT16);
}

/* The staged kernel's k range per split (a multiple of 32). */
static int64_t gv_kper(const kiln_gpu_nbits *a, int splits)
{
    int64_t kpad = a->n_blocks * a->block_size, per = (kpad + splits - 1) / splits;
    return (per + 31) / 32 * 32;
}

#if !defined(KILN_HIP)
/* 4 bits in blocks of 128 or 256, float16 A and Y, B, scales and zero points 16/4/4-byte aligned:
 * the products on tensor cores (mma m16n8k16, float accumulators), the rows of A as the 8 columns
 * of the mma's B operand. grid (blocks, splits), tc_smem(M, groups) bytes of dynamic shared
 * memory. Blocks stay resident (TC_BLOCKS_PER_SM a multiprocessor) and take tiles of 16 columns
 * (the rows of the mma's A operand) in turn; their warps take the groups of 128 k of a tile in
 * turn and add their sums in shared memory at the tile's end.
 *
 * Lane (g, q) = (lane / 4, lane % 4) needs 16 bytes (32 k) of columns n0 + g and n0 + g + 8 at
 * group offset 16 q, and the 4-byte words holding their scales and zero points: it copies them
 * with cp.async into its own slots of a ring of TC_STAGES groups, TC_STAGES - 1 groups ahead of
 * the one it computes, so that many loads are in flight without holding registers, and no other
 * thread reads its slots (no synchronisation but its own wait). Each 32-bit word's 8 nibbles become
 * four half pairs by one LOP3 each (0x6400 | q is the half 1024 + q; 0x6400 | q << 4 is 1024 + 16
 * q), the registers of two mmas. The k order inside an mma is the lanes' own, so the block stages
 * A in the matching order once (tc_stage): for each group, word and row of A the half pairs (a0,
 * a4), (a2, a6), (a1 / 16, a5 / 16), (a3 / 16, a7 / 16), and per group and row P = 1024 x the sum
 * of those halves and Q = sum a. The mma sums (1024 + q) a exactly in float, and a group adds
 * scale * (C - P - zero * Q). */
#define TC_COLS 16
/* The ring's groups (5 in flight while one is computed) and the resident blocks a multiprocessor
 * (the grid's bound): measured on an H100 against 3 blocks of 4 stages, a decode step's GEMVs
 * 2304 -> 2068 us (bench_gemv_gpu.cu); overridable for such measurements */
#ifndef TC_STAGES
#define TC_STAGES 6
#endif
#ifndef TC_BLOCKS_PER_SM
#define TC_BLOCKS_PER_SM 2
#endif
#define TC_SMEM_MAX (227 * 1024 / TC_BLOCKS_PER_SM - 1024) /* that many blocks in 228 KB */
#define TC_RED_BYTES (WARPS * TC_COLS * 8 * 4) /* the warps' sums of a tile */
#define TC_RING_BYTES (TC_STAGES * BLOCK * 48) /* a slot: 2 x 16 bytes of weights, 2 + 2 words */

/* Bytes of shared memory for M rows over `groups` groups: sums, ring, staged halves and P/Q. */
static int64_t tc_smem(int64_t M, int64_t groups) { return TC_RED_BYTES + TC_RING_BYTES + groups * (256 * M + 64); }
/* a group of the most rows fits (kiln_gpu_nbits_splits' loop ends) */
static_assert(TC_RED_BYTES + TC_RING_BYTES + 256 * KILN_GPU_NBITS_GEMV_MAX_M + 64 <= TC_SMEM_MAX, "tensor-core GEMV ring too large");

__device__ __forceinline__ uint32_t tc_lop(uint32_t w, uint32_t mask)
{
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "r"(mask), "r"(0x64006400u)); /* (w & mask) | c */
    return r;
}

__device__ __forceinline__ void tc_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t tc_pair(__half lo, __half hi)
{
    return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}

__device__ __forceinline__ void tc_copy16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}

__device__ __forceinline__ void tc_copy4(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}

/* A ring slot of this thread: weights w[r] of column r (0: n0 + g, 1: n0 + g + 8), the words
 * holding its scale s[r] and zero point z[r]. Slot arrays are [stage][r][BLOCK]: consecutive
 * threads, consecutive addresses. */
struct tc_ring {
    uint4 *w;
    uint32_t *s, *z;
};

/* One thread's columns of a tile, as 32-bit offsets (tc_takes bounds N x row bytes): of its 16
 * weight bytes in each row (w), of the rows' first scales in elements (s) and, packed, of the rows'
 * first zero-point bytes (z). */
struct tc_cols {
    uint32_t w[2], s[2], z[2];
};

__device__ __forceinline__ tc_cols tc_columns(const kiln_gpu_nbits &a, int64_t t, int g, int q)
{
    tc_cols c;
    const int64_t n0 = t * TC_COLS;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t n = n0 + g + 8 * r < a.N ? n0 + g + 8 * r : a.N - 1;
        c.w[r] = (uint32_t)(n * a.n_blocks * a.blob + 16 * q);
        c.s[r] = (uint32_t)(n * a.n_blocks);
        c.z[r] = (uint32_t)(n * ((a.n_blocks + 1) / 2));
    }
    return c;
}

/* Queues the copies of group j (in block blk) of the columns c into stage st. SF32: scales (and
 * typed zero points) are float32; ZPM: the zero-point form. */
template <bool SF32, int ZPM>
__device__ __forceinline__ void tc_issue(const kiln_gpu_nbits &a, const tc_ring &ring, int st, const tc_cols &c,
                                         uint32_t j, uint32_t blk)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int slot = (st * 2 + r) * BLOCK + threadIdx.x;
        const uint32_t e = c.s[r] + blk;
        tc_copy16(ring.w + slot, a.B + c.w[r] + j * 64);
        tc_copy4(ring.s + slot, (const uint32_t *)a.scales + (SF32 ? e : e >> 1));
        if (ZPM == KILN_GPU_ZP_PACKED) tc_copy4(ring.z + slot, (const uint32_t *)a.zp + ((c.z[r] + (blk >> 1)) >> 2));
        if (ZPM == KILN_GPU_ZP_TYPED) tc_copy4(ring.z + slot, (const uint32_t *)a.zp + (SF32 ? e : e >> 1));
    }
}

/* Scale and zero point of block blk of column r of c from the slot's words. */
template <bool SF32, int ZPM>
__device__ __forceinline__ void tc_params(const tc_cols &c, int r, uint32_t blk, uint32_t sw, uint32_t zw, float *scale,
                                          float *zero)
{
    const uint32_t e = c.s[r] + blk;
    *scale = SF32 ? __uint_as_float(sw) : __half2float(__ushort_as_half((unsigned short)(sw >> (16 * (e & 1)))));
    if (ZPM == KILN_GPU_ZP_NONE) {
        *zero = 8.0f;
    } else if (ZPM == KILN_GPU_ZP_PACKED) {
        const uint32_t zi = c.z[r] + (blk >> 1);
        *zero = (float)((zw >> (8 * (zi & 3) + 4 * (blk & 1))) & 15u);
    } else {
        *zero = SF32 ? __uint_as_float(zw) : __half2float(__ushort_as_half((unsigned short)(zw >> (16 * (e & 1)))));
    }
}

/* Stages rows [0, M) of A over groups [jb, jb + gn) (see above): Bs [gn][4][M][4] uint4, PQ [gn][4]
 * float4 {P(2q), P(2q + 1), Q(2q), Q(2q + 1)}. */
__device__ __forceinline__ void tc_stage(const kiln_gpu_nbits &a, int64_t jb, int gn, uint4 *Bs, float4 *PQ)
{
    const int M = (int)a.M;
    const __half *A = (const __half *)a.A;
    const bool vec = (a.K & 7) == 0 && ((uintptr_t)A & 15) == 0;
    float *pq = (float *)PQ;
    for (int e = threadIdx.x; e < gn * 16; e += BLOCK) pq[e] = 0.0f;
    __syncthreads();
    /* entry e: q = e % 4, word i = e / 4 % 4, (group, row) = e / 16: the 16 entries of one group
     * and row are 16 consecutive lanes, summed by shuffles (every lane of a warp takes the same
     * number of turns: the shuffles need the whole warp) */
    const int total = gn * M * 16;
    for (int e0 = 0; e0 < total; e0 += BLOCK) {
        const int e = e0 + (int)threadIdx.x;
        const bool on = e < total;
        const int q = e & 3, i = (e >> 2) & 3, r = e >> 4, m = r % M, jl = r / M;
        const int64_t k0 = ((jb + jl) << 7) + 32 * q + 8 * i;
        __half h[8];
        if (on && vec && k0 + 8 <= a.K) {
            *(uint4 *)h = *(const uint4 *)(A + m * a.K + k0);
        } else {
#pragma unroll
            for (int t = 0; t < 8; t++) h[t] = on && k0 + t < a.K ? A[m * a.K + k0 + t] : __float2half(0.0f);
        }
        __half d[4];
        const __half sixteenth = __float2half(0.0625f);
#pragma unroll
        for (int t = 0; t < 4; t++) d[t] = __hmul(h[2 * t + 1], sixteenth);
        if (on)
            Bs[((jl * 4 + i) * M + m) * 4 + q] = make_uint4(tc_pair(h[0], h[4]), tc_pair(h[2], h[6]),
                                                            tc_pair(d[0], d[2]), tc_pair(d[1], d[3]));
        float qs = 0.0f, ps = 0.0f;
#pragma unroll
        for (int t = 0; t < 8; t++) qs += __half2float(h[t]);
#pragma unroll
        for (int t = 0; t < 4; t++) ps += __half2float(h[2 * t]) + __half2float(d[t]);
#pragma unroll
        for (int o = 1; o < 16; o <<= 1) {
            qs += __shfl_xor_sync(KILN_FULL_MASK, qs, o);
            ps += __shfl_xor_sync(KILN_FULL_MASK, ps, o);
        }
        if (on && (e & 15) == 0) {
            pq[(jl * 4 + (m >> 1)) * 4 + (m & 1)] = 1024.0f * ps;
            pq[(jl * 4 + (m >> 1)) * 4 + 2 + (m & 1)] = qs;
        }
    }
    __syncthreads();
}

/* r += group jl's sums (in block blk) from stage st (r: column c.w[0]'s rows 2q, 2q + 1, then
 * column c.w[1]'s). */
template <bool SF32, int ZPM>
__device__ __forceinline__ void tc_dot(const tc_ring &ring, int st, const uint4 *Bs, const float4 *PQ, int M,
                                       const tc_cols &c, int jl, uint32_t blk, int g, int q, float (&r)[4])
{
    const int s0 = st * 2 * BLOCK + threadIdx.x, s1 = s0 + BLOCK;
    const uint4 w0 = ring.w[s0], w1 = ring.w[s1];
    float sl, zl, sh, zh;
    tc_params<SF32, ZPM>(c, 0, blk, ring.s[s0], ring.z[s0], &sl, &zl);
    tc_params<SF32, ZPM>(c, 1, blk, ring.s[s1], ring.z[s1], &sh, &zh);
    float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint32_t wl[4] = {w0.x, w0.y, w0.z, w0.w}, wh[4] = {w1.x, w1.y, w1.z, w1.w};
    const uint4 *Bj = Bs + (jl * 4 * M + g) * 4 + q;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint4 b = g < M ? Bj[i * M * 4] : make_uint4(0u, 0u, 0u, 0u);
        const uint32_t l8 = wl[i] >> 8, h8 = wh[i] >> 8;
        tc_mma(c0, tc_lop(wl[i], 0x000F000Fu), tc_lop(wh[i], 0x000F000Fu), tc_lop(l8, 0x000F000Fu),
               tc_lop(h8, 0x000F000Fu), b.x, b.y);
        tc_mma(c1, tc_lop(wl[i], 0x00F000F0u), tc_lop(wh[i], 0x00F000F0u), tc_lop(l8, 0x00F000F0u),
               tc_lop(h8, 0x00F000F0u), b.z, b.w);
    }
    const float4 pq = PQ[jl * 4 + q];
    r[0] += sl * ((c0[0] + c1[0]) - pq.x - zl * pq.z);
    r[1] += sl * ((c0[1] + c1[1]) - pq.y - zl * pq.w);
    r[2] += sh * ((c0[2] + c1[2]) - pq.x - zh * pq.z);
    r[3] += sh * ((c0[3] + c1[3]) - pq.y - zh * pq.w);
}

template <bool SF32, int ZPM>
__global__ void __launch_bounds__(BLOCK, TC_BLOCKS_PER_SM) nbits_tc_kernel(kiln_gpu_nbits a, int bs_shift, int gper,
                                                                         float *part)
{
    extern __shared__ float4 tc_smem_base[];
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, q = lane & 3, M = (int)a.M;
    const int ngroups = (int)((a.K + 127) >> 7), sh7 = bs_shift - 7; /* a group's block: j >> sh7 */
    const int jb = (int)blockIdx.y * gper;
    const int je = jb + gper < ngroups ? jb + gper : ngroups;
    const int gn = je > jb ? je - jb : 0;
    const int64_t tiles = (a.N + TC_COLS - 1) / TC_COLS;
    unsigned char *base = (unsigned char *)tc_smem_base;
    float *red = (float *)base; /* [WARPS][16 columns][8 rows] */
    tc_ring ring;
    ring.w = (uint4 *)(base + TC_RED_BYTES);
    ring.s = (uint32_t *)(ring.w + TC_STAGES * 2 * BLOCK);
    ring.z = ring.s + TC_STAGES * 2 * BLOCK;
    float4 *PQ = (float4 *)(base + TC_RED_BYTES + TC_RING_BYTES);
    uint4 *Bs = (uint4 *)(PQ + gn * 4);
    /* warp w's items: tiles blockIdx.x, + gridDim.x, ...; in each, local groups w, w + WARPS, ...;
     * the issue cursor (tile it, group il, columns ic) runs TC_STAGES - 1 items ahead */
    int64_t it = blockIdx.x;
    int il = w;
    tc_cols ic = tc_columns(a, it, g, q);
    auto issue = [&](int st) {
        if (it < tiles && il < gn) {
            const uint32_t j = (uint32_t)(jb + il);
            tc_issue<SF32, ZPM>(a, ring, st, ic, j, j >> sh7);
            il += WARPS;
            if (il >= gn) {
                il = w, it += gridDim.x;
                if (it < tiles) ic = tc_columns(a, it, g, q);
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    kiln_pdl_trigger();
    if (!a.const_weights) kiln_pdl_wait();
#pragma unroll
    for (int st = 0; st < TC_STAGES - 1; st++) issue(st);
    kiln_pdl_wait(); /* A and Y: the kernel ahead's */
    tc_stage(a, jb, gn, Bs, PQ);
    int st = 0;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        const tc_cols c = tc_columns(a, t, g, q);
        float r[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int jl = w; jl < gn; jl += WARPS) {
            issue(st == 0 ? TC_STAGES - 1 : st - 1);
            asm volatile("cp.async.wait_group %0;" ::"n"(TC_STAGES - 1) : "memory");
            tc_dot<SF32, ZPM>(ring, st, Bs, PQ, M, c, jl, (uint32_t)(jb + jl) >> sh7, g, q, r);
            st = st + 1 == TC_STAGES ? 0 : st + 1;
        }
        red[(w * TC_COLS + g) * 8 + 2 * q] = r[0];
        red[(w * TC_COLS + g) * 8 + 2 * q + 1] = r[1];
        red[(w * TC_COLS + g + 8) * 8 + 2 * q] = r[2];
        red[(w * TC_COLS + g + 8) * 8 + 2 * q + 1] = r[3];
        __syncthreads();
        if (threadIdx.x < TC_COLS * 8) {
            const int cc = threadIdx.x / 8, m = threadIdx.x % 8;
            const int64_t n = t * TC_COLS + cc;
            if (m < M && n < a.N) {
                float v = 0.0f;
#pragma unroll
                for (int k = 0; k < WARPS; k++) v += red[(k * TC_COLS + cc) * 8 + m];
                store_sum<kiln_gpu_half>(a, m, n, v, part);
            }
        }
        __syncthreads();
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
}
#endif

static bool tc_takes(const kiln_gpu_nbits *a)
{
#if defined(KILN_HIP)
    (void)a;
    return false;
#else
    return a->bits == 4 && (a->block_size == 128 || a->block_size == 256) && a->blob == a->block_size / 2 &&
           ((uintptr_t)a->B & 15) == 0 && ((uintptr_t)a->scales & 3) == 0 && ((uintptr_t)a->zp & 3) == 0 &&
           a->dtype == KILN_DTYPE_FLOAT16 && (a->s_dtype == KILN_DTYPE_FLOAT16 || a->s_dtype == KILN_DTYPE_FLOAT32) &&
           a->N * a->n_blocks * a->blob < ((int64_t)1 << 31); /* the kernel's 32-bit offsets */
#endif
}

/* Y[m, n] = sum over splits of part + bias[n]. */
template <typename T>
__global__ void nbits_finish_kernel(kiln_gpu_nbits a, int splits, const float *part)
{
    KILN_GRID_LOOP(i, a.M * a.N)
    {
        int64_t n = i % a.N;
        float v = a.bias ? kiln_to_f<T>(((const T *)a.bias)[n]) : 0.0f;
        for (int sp = 0; sp < splits; sp++) v += part[(int64_t)sp * a.M * a.N + i];
        ((T *)a.Y)[i] = kiln_from_f<T>(v);
    }
}

template <typename T>
__global__ void nbits_dequant_kernel(kiln_gpu_nbits a, T *W)
{
    KILN_GRID_LOOP(i, a.N * a.K)
    {
        int64_t n = i / a.K, k = i - n * a.K;
        int64_t blk = k / a.block_size, in = k - blk * a.block_size;
        const uint8_t *b = a.B + (n * a.n_blocks + blk) * a.blob;
        unsigned q = a.bits == 8 ? b[in] : (b[in / 2] >> (4 * (in & 1))) & 15u;
        float sc, zr;
        nbits_block(a, n, blk, &sc, &zr);
        W[i] = kiln_from_f<T>(((float)q - zr) * sc);
    }
}

template <typename T>
__global__ void nbits_bias_kernel(kiln_gpu_nbits a)
{
    KILN_GRID_LOOP(i, a.M * a.N)
    {
        T *Y = (T *)a.Y;
        Y[i] = kiln_from_f<T>(kiln_to_f<T>(Y[i]) + kiln_to_f<T>(((const T *)a.bias)[i % a.N]));
    }
}

extern "C" int kiln_gpu_nbits_splits(const kiln_gpu_nbits *a)
{
    int64_t sms = a->sm_count > 0 ? a->sm_count : 1;
#if !defined(KILN_HIP)
    if (tc_takes(a)) {
        /* a block per 16 columns; K split while the columns leave multiprocessors idle (each
         * split 4 groups at least) or the staged rows exceed TC_SMEM_MAX */
        int64_t tiles = (a->N + TC_COLS - 1) / TC_COLS, groups = (a->K + 127) / 128;
        int64_t splits = (sms + tiles - 1) / tiles, most = groups / 4;
        if (splits > most) splits = most;
        if (splits < 1) splits = 1;
        while (tc_smem(a->M, (groups + splits - 1) / splits) > TC_SMEM_MAX) splits++;
        return (int)splits;
    }
#endif
    if (gv_takes(a)) {
        /* a block per multiprocessor, a lane at least one chunk per split, the staged rows
         * within GV_SMEM_MAX */
        int64_t blocks = (a->N + WARPS * GV_COLS - 1) / (WARPS * GV_COLS);
        int64_t splits = (sms + blocks - 1) / blocks, most = a->n_blocks * a->block_size / 1024;
        if (splits > most) splits = most;
        if (splits < 1) splits = 1;
        while (gv_smem(a->M, gv_kper(a, (int)splits)) > GV_SMEM_MAX) splits++;
        return (int)splits;
    }
    int64_t words = a->n_blocks * a->blob / 4;
    int64_t want = sms * 4 * WARPS; /* warps to fill the device */
    int64_t splits = (want + a->N - 1) / a->N;
    int64_t most = words / 64; /* at least two words per lane in each split */
    if (splits > most) splits = most;
    if (splits > 32) splits = 32;
    return splits < 1 ? 1 : (int)splits;
}

/* The staged kernel's launch (MM: its bound on the rows of A); its shared memory above 48 KB
 * is granted on a device's first use (a failure is the launch's error). */
template <typename T, int MM>
static gpuError_t gv_launch(gpuStream_t s, const kiln_gpu_nbits *a, int splits, float *part)
{
    static unsigned granted;
    gpuError_t e = kiln_gpu_grant_smem(&granted, nbits_gemv16_kernel<T, MM>, GV_SMEM_MAX);
    if (e != gpuSuccess) return e;
    int64_t kper = gv_kper(a, splits);
    /* GV_BLOCKS_PER_SM blocks a multiprocessor in all, each taking its columns in turn */
    int64_t blocks = (a->N + WARPS * GV_COLS - 1) / (WARPS * GV_COLS), most = (GV_BLOCKS_PER_SM * (int64_t)a->sm_count + splits - 1) / splits;
    if (most < 1) most = 1;
    dim3 grid((unsigned)(blocks < most ? blocks : most), (unsigned)splits);
    nbits_gemv16_kernel<T, MM><<<grid, BLOCK, (size_t)gv_smem(a->M, kper), s>>>(*a, nbits_shift(a), kper, part);
    return gpuSuccess;
}

template <typename T>
static gpuError_t gv_launch(gpuStream_t s, const kiln_gpu_nbits *a, int splits, float *part)
{
    if (a->M == 1) return gv_launch<T, 1>(s, a, splits, part);
    return gv_launch<T, KILN_GPU_NBITS_GEMV_MAX_M>(s, a, splits, part);
}

/* The tensor-core kernel's launch; shared memory above 48 KB granted on a device's first use. */
#if !defined(KILN_HIP)
template <bool SF32, int ZPM>
static gpuError_t tc_launch(gpuStream_t s, const kiln_gpu_nbits *a, int splits, float *part)
{
    static unsigned granted;
    gpuError_t e = kiln_gpu_grant_smem(&granted, nbits_tc_kernel<SF32, ZPM>, TC_SMEM_MAX);
    if (e != gpuSuccess) return e;
    int64_t groups = (a->K + 127) / 128, gper = (groups + splits - 1) / splits;
    int64_t tiles = (a->N + TC_COLS - 1) / TC_COLS, most = TC_BLOCKS_PER_SM * (int64_t)a->sm_count / splits;
    if (most < 1) most = 1;
    dim3 grid((unsigned)(tiles < most ? tiles : most), (unsigned)splits);
    /* programmatic dependent launch: the first weights load while the kernel ahead finishes */
    return kiln_launch_pdl(KILN_PDL_PREFETCH, nbits_tc_kernel<SF32, ZPM>, grid, dim3(BLOCK), (size_t)tc_smem(a->M, gper), s, *a,
                           nbits_shift(a), (int)gper, part);
}

#endif

/* The tensor-core kernel for a's scale dtype and zero-point form. */
static gpuError_t tc_launch(gpuStream_t s, const kiln_gpu_nbits *a, int splits, float *part)
{
#if defined(KILN_HIP)
    (void)s, (void)a, (void)splits, (void)part;
    return kiln_gpu_bad_arg();
#else
    const bool f32 = a->s_dtype == KILN_DTYPE_FLOAT32;
    if (a->zp_mode == KILN_GPU_ZP_NONE)
        return f32 ? tc_launch<true, KILN_GPU_ZP_NONE>(s, a, splits, part) : tc_launch<false, KILN_GPU_ZP_NONE>(s, a, splits, part);
    if (a->zp_mode == KILN_GPU_ZP_PACKED)
        return f32 ? tc_launch<true, KILN_GPU_ZP_PACKED>(s, a, splits, part)
                   : tc_launch<false, KILN_GPU_ZP_PACKED>(s, a, splits, part);
    return f32 ? tc_launch<true, KILN_GPU_ZP_TYPED>(s, a, splits, part) : tc_launch<false, KILN_GPU_ZP_TYPED>(s, a, splits, part);
#endif
}

extern "C" gpuError_t kiln_gpu_nbits_gemv(gpuStream_t s, const kiln_gpu_nbits *a, int splits, float *part)
{
    if (a->M <= 0 || a->N <= 0) return gpuSuccess;
    int64_t words = a->n_blocks * a->blob / 4, per = (words + splits - 1) / splits;
    dim3 grid(kiln_gpu_blocks(a->N, WARPS), (unsigned)splits);
    /* 4 bits in blocks of a power of two: A staged (blocks of 32 or more) or the word kernel */
    int shift = nbits_shift(a);
    bool pow2 = a->bits == 4 && a->blob == a->block_size / 2 && shift >= 4;
    gpuError_t ge = gpuSuccess;
    if (tc_takes(a)) ge = tc_launch(s, a, splits, part);
    else if (gv_takes(a) && a->dtype == KILN_DTYPE_FLOAT32) ge = gv_launch<float>(s, a, splits, part);
    else if (gv_takes(a)) ge = gv_launch<kiln_gpu_half>(s, a, splits, part);
    else if (pow2 && a->dtype == KILN_DTYPE_FLOAT32) nbits_gemv4_kernel<float><<<grid, BLOCK, 0, s>>>(*a, shift, per, part);
    else if (pow2 && a->dtype == KILN_DTYPE_FLOAT16)
        nbits_gemv4_kernel<kiln_gpu_half><<<grid, BLOCK, 0, s>>>(*a, shift, per, part);
    else if (a->dtype == KILN_DTYPE_FLOAT32) nbits_gemv_kernel<float><<<grid, BLOCK, 0, s>>>(*a, per, part);
    else if (a->dtype == KILN_DTYPE_FLOAT16) nbits_gemv_kernel<kiln_gpu_half><<<grid, BLOCK, 0, s>>>(*a, per, part);
    else return kiln_gpu_bad_arg();
    gpuError_t e = ge != gpuSuccess ? ge : gpuGetLastError();
    if (e != gpuSuccess || splits == 1) return e; /* one split wrote Y itself */
    unsigned nb = kiln_gpu_blocks(a->M * a->N, BLOCK);
    if (a->dtype == KILN_DTYPE_FLOAT32) nbits_finish_kernel<float><<<nb, BLOCK, 0, s>>>(*a, splits, part);
    else nbits_finish_kernel<kiln_gpu_half><<<nb, BLOCK, 0, s>>>(*a, splits, part);
    return gpuGetLastError();
}

extern "C" gpuError_t kiln_gpu_nbits_dequant(gpuStream_t s, const kiln_gpu_nbits *a, void *W)
{
    if (a->N <= 0 || a->K <= 0) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(a->N * a->K, BLOCK);
    if (a->dtype == KILN_DTYPE_FLOAT32) nbits_dequant_kernel<float><<<nb, BLOCK, 0, s>>>(*a, (float *)W);
    else if (a->dtype == KILN_DTYPE_FLOAT16) nbits_dequant_kernel<kiln_gpu_half><<<nb, BLOCK, 0, s>>>(*a, (kiln_gpu_half *)W);
    else return kiln_gpu_bad_arg();
    return gpuGetLastError();
}

extern "C" gpuError_t kiln_gpu_nbits_bias(gpuStream_t s, const kiln_gpu_nbits *a)
{
    if (a->M <= 0 || a->N <= 0 || !a->bias) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(a->M * a->N, BLOCK);
    if (a->dtype == KILN_DTYPE_FLOAT32) nbits_bias_kernel<float><<<nb, BLOCK, 0, s>>>(*a);
    else if (a->dtype == KILN_DTYPE_FLOAT16) nbits_bias_kernel<kiln_gpu_half><<<nb, BLOCK, 0, s>>>(*a);
    else return kiln_gpu_bad_arg();
    return gpuGetLastError();
}

/* ---- rotary ---- */

/* Element i of head row x (H values) with the first rd rotated by the cache rows cr, sr
 * (rd / 2 values each), in float. */
template <typename T>
__device__ __forceinline__ float rotate_at(const T *x, int64_t i, int64_t rd, bool interleaved, const T *cr, const T *sr)
{
    float v = kiln_to_f<T>(x[i]);
    if (i >= rd) return v;
    int64_t half = rd / 2, j = interleaved ? i / 2 : i % half;
    float cs = kiln_to_f<T>(cr[j]), sn = kiln_to_f<T>(sr[j]);
    if (interleaved) return (i & 1) ? v * cs + kiln_to_f<T>(x[i - 1]) * sn : v * cs - kiln_to_f<T>(x[i + 1]) * sn;
    return i < half ? v * cs - kiln_to_f<T>(x[i + half]) * sn : v * cs + kiln_to_f<T>(x[i - half]) * sn;
}

template <typename T>
__global__ void rotary_kernel(const T *x, T *y, int64_t B, int64_t S, int64_t Nh, int64_t H, int64_t rd, bool rank3,
                              bool interleaved, const int64_t *pos, int64_t offset, const T *cs, const T *sn)
{
    KILN_GRID_LOOP(e, B * S * Nh * H)
    {
        int64_t i = e % H, r = e / H, s, b;
        if (rank3) { /* [B, S, Nh, H] */
            s = (r / Nh) % S;
            b = r / (Nh * S);
        } else { /* [B, Nh, S, H] */
            s = r % S;
            b = r / (S * Nh);
        }
        int64_t p = pos ? pos[b * S + s] : offset + s, half = rd / 2;
        y[e] = kiln_from_f<T>(rotate_at<T>(x + (e - i), i, rd, interleaved, cs + p * half, sn + p * half));
    }
}

extern "C" gpuError_t kiln_gpu_rotary(gpuStream_t s, int dtype, const void *x, void *y, int64_t B, int64_t S,
                                      int64_t Nh, int64_t H, int64_t rd, bool rank3, bool interleaved,
                                      const int64_t *pos, int64_t offset, const void *cos, const void *sin)
{
    int64_t n = B * S * Nh * H;
    if (n <= 0) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(n, BLOCK);
#define ROT(T) rotary_kernel<T><<<nb, BLOCK, 0, s>>>((const T *)x, (T *)y, B, S, Nh, H, rd, rank3, interleaved, pos, \
                                                    offset, (const T *)cos, (const T *)sin)
    if (dtype == KILN_DTYPE_FLOAT32) ROT(float);
    else if (dtype == KILN_DTYPE_FLOAT16) ROT(kiln_gpu_half);
    else if (dtype == KILN_DTYPE_BFLOAT16) ROT(kiln_gpu_bf16);
    else return kiln_gpu_bad_arg();
#undef ROT
    return gpuGetLastError();
}

/* ---- kiln.SiluMul ---- */

/* y[r, i] = silu(g[r * stride + i]) * u[r * stride + i] in float over rows of n elements (stride
 * n: two tensors; 2n with u = g + n: the packed form; kiln_silu_mul_rows), grid-stride */
template <typename T>
__global__ void silu_mul_kernel(const T *g, const T *u, T *y, int64_t total, int64_t n, int64_t stride)
{
    kiln_pdl_trigger(); /* the GEMV after it may start loading its weights */
    kiln_pdl_wait();    /* launched early itself (kiln_launch_pdl) */
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t at = stride == n ? i : i / n * stride + i % n;
        float gv = kiln_to_f(g[at]);
        y[i] = kiln_from_f<T>(gv / (1.0f + __expf(-gv)) * kiln_to_f(u[at]));
    }
}

extern "C" gpuError_t kiln_gpu_silu_mul(gpuStream_t s, int dtype, const void *g, const void *u, void *y, int64_t total,
                                        int64_t n, int64_t stride)
{
    if (total <= 0) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(total, BLOCK);
    gpuError_t e;
#define SILU(T)                                                                                                        \
    e = kiln_launch_pdl(KILN_PDL_ALL, silu_mul_kernel<T>, dim3(nb), dim3(BLOCK), 0, s, (const T *)g, (const T *)u, (T *)y, total, n, \
                        stride)
    if (dtype == KILN_DTYPE_FLOAT32) SILU(float);
    else if (dtype == KILN_DTYPE_FLOAT16) SILU(kiln_gpu_half);
    else if (dtype == KILN_DTYPE_BFLOAT16) SILU(kiln_gpu_bf16);
    else return kiln_gpu_bad_arg();
#undef SILU
    return e;
}

/* ---- GroupQueryAttention ---- */

/* Head row (b, s, hd) of the given Q (hd < N), K (N <= hd < N + Nkv) or V (hd >= N + Nkv). */
template <typename T>
__device__ __forceinline__ const T *qkv_row(const kiln_gpu_gqa &a, int64_t b, int64_t s, int64_t hd)
{
    if (a.packed) return (const T *)a.q + ((b * a.S + s) * (a.N + 2 * a.Nkv) + hd) * a.H;
    if (hd < a.N) return (const T *)a.q + ((b * a.S + s) * a.N + hd) * a.H;
    if (hd < a.N + a.Nkv) return (const T *)a.k + ((b * a.S + s) * a.Nkv + hd - a.N) * a.H;
    return (const T *)a.v + ((b * a.S + s) * a.Nkv + hd - a.N - a.Nkv) * a.H;
}

/* Rotary position of new row s of batch row b (kiln_gqa_position). */
__device__ __forceinline__ int64_t gqa_pos(const kiln_gpu_gqa &a, int64_t b, int64_t s)
{
    if (a.pos) return a.pos[b * a.S + s];
    if (a.first_prompt) return s;
    return (int64_t)a.seqlens[b] + 1 - a.S + s;
}

/* Rows of the past kept before the new ones (kiln_gqa_past_rows). */
__device__ __forceinline__ int64_t gqa_past_rows(const kiln_gpu_gqa &a, int64_t b)
{
    return !a.has_past || a.first_prompt ? 0 : (int64_t)a.seqlens[b] + 1 - a.S;
}

/* Whether batch row b's seqlens_k fits the buffers and new row s's rotary position the caches
 * (what kiln_gqa_prepare checks on the host when seqlens_k is there); reports when not. */
__device__ __forceinline__ bool gqa_row_ok(const kiln_gpu_gqa &a, int64_t b, int64_t s)
{
    int64_t sl = a.seqlens[b], rows = gqa_past_rows(a, b), p = a.rd ? gqa_pos(a, b, s) : 0;
    bool ok = sl >= 0 && sl < a.L && (a.first_prompt || sl + 1 >= a.S) && rows >= 0 &&
              (!a.has_past || rows <= a.past_len) && rows + a.S <= a.L && p >= 0 && (!a.rd || p < a.rot_rows) &&
              (!a.bias || sl + 1 <= a.bias_s);
    if (!ok && a.bad) atomicCAS(a.bad, 0, a.bad_code);
    return ok;
}

/* Element d of new row s of KV head h: K rotated (rounded to T, as the reference stores it) or V. */
template <typename T>
__device__ __forceinline__ T gqa_new_kv(const kiln_gpu_gqa &a, bool key, int64_t b, int64_t s, int64_t h, int64_t d)
{
    const T *x = qkv_row<T>(a, b, s, a.N + (key ? 0 : a.Nkv) + h);
    if (!key || !a.rd) return x[d];
    int64_t p = gqa_pos(a, b, s), half = a.rd / 2;
    return kiln_from_f<T>(rotate_at<T>(x, d, a.rd, a.interleaved, (const T *)a.cos + p * half, (const T *)a.sin + p * half));
}

/* Unshared: every element (b, h, t, d) of kc and vc [B, Nkv, L, H]: past row, new row or 0. */
template <typename T>
__global__ void gqa_present_kernel(kiln_gpu_gqa a)
{
    KILN_GRID_LOOP(e, a.B * a.Nkv * a.L * a.H)
    {
        int64_t d = e % a.H, t = (e / a.H) % a.L, bh = e / (a.H * a.L), h = bh % a.Nkv, b = bh / a.Nkv;
        int64_t rows = gqa_past_rows(a, b);
        T kv, vv;
        bool ok = true;
        for (int64_t s = 0; s < a.S && ok; s++) ok = gqa_row_ok(a, b, s);
        if (!ok) {
            kv = vv = kiln_from_f<T>(0.0f);
        } else if (t < rows) {
            int64_t at = (bh * a.past_len + t) * a.H + d;
            kv = ((const T *)a.past_k)[at];
            vv = ((const T *)a.past_v)[at];
        } else if (t < rows + a.S) {
            kv = gqa_new_kv<T>(a, true, b, t - rows, h, d);
            vv = gqa_new_kv<T>(a, false, b, t - rows, h, d);
        } else {
            kv = vv = kiln_from_f<T>(0.0f);
        }
        ((T *)a.kc)[e] = kv;
        ((T *)a.vc)[e] = vv;
    }
}

/* Shared buffer: the new rows only, (b, h, s, d) at row past_rows(b) + s of [B, Nkv, L, H]. */
template <typename T>
__global__ void gqa_append_kernel(kiln_gpu_gqa a)
{
    KILN_GRID_LOOP(e, a.B * a.Nkv * a.S * a.H)
    {
        int64_t d = e % a.H, s = (e / a.H) % a.S, bh = e / (a.H * a.S), h = bh % a.Nkv, b = bh / a.Nkv;
        if (!gqa_row_ok(a, b, s)) continue;
        int64_t at = (bh * a.L + gqa_past_rows(a, b) + s) * a.H + d;
        ((T *)a.kc)[at] = gqa_new_kv<T>(a, true, b, s, h, d);
        ((T *)a.vc)[at] = gqa_new_kv<T>(a, false, b, s, h, d);
    }
}

#define HEAD_PER_LANE (KILN_GPU_GQA_MAX_HEAD / 32)
#define GQA_KEYS 4 /* keys a warp takes at a time */

/* The keys query row i of batch row b sees (kiln_gqa_window): [*start, *start + *len). */
__device__ __forceinline__ void gqa_window(const kiln_gpu_gqa &a, int64_t b, int64_t i, int64_t *start, int64_t *len)
{
    int64_t total = (int64_t)a.seqlens[b] + 1;
    int64_t causal = (a.has_past && !a.first_prompt ? total - a.S : 0) + i + 1;
    if (causal > total) causal = total;
    *start = 0, *len = causal;
    if (a.window >= 0 && causal > a.window) *start = causal - a.window, *len = a.window;
}

/* Query row i of head h (batch row b), rotated and rounded to T as the reference keeps it, in
 * the lane's registers: q[k] is element lane + 32 k. */
template <typename T>
__device__ __forceinline__ void gqa_query(const kiln_gpu_gqa &a, int64_t b, int64_t i, int64_t h, int lane,
                                          float (&q)[HEAD_PER_LANE])
{
    const T *qr = qkv_row<T>(a, b, i, h);
    const int64_t p = a.rd ? gqa_pos(a, b, i) : 0, half = a.rd / 2;
#pragma unroll
    for (int k = 0; k < HEAD_PER_LANE; k++) {
        const int64_t d = lane + 32 * k;
        if (d >= a.H) q[k] = 0.0f;
        else if (!a.rd) q[k] = kiln_to_f<T>(qr[d]);
        else
            q[k] = kiln_to_f<T>(kiln_from_f<T>(
                rotate_at<T>(qr, d, a.rd, a.interleaved, (const T *)a.cos + p * half, (const T *)a.sin + p * half)));
    }
}

/* The online-softmax state a warp of query head h starts from: nothing weighed (m -inf, l 0, acc
 * 0), or, for the one warp of a row that takes it (first), a head sink (or smooth_softmax's 0)
 * as one more logit with a zero value row. */
template <typename T>
__device__ __forceinline__ void gqa_state_init(const kiln_gpu_gqa &a, int64_t h, bool first, float &m, float &l,
                                               float (&acc)[HEAD_PER_LANE])
{
    m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int k = 0; k < HEAD_PER_LANE; k++) acc[k] = 0.0f;
    if (first && (a.sink || a.smooth)) {
        m = a.sink ? kiln_to_f<T>(((const T *)a.sink)[h]) : 0.0f;
        l = 1.0f;
    }
}

/* One warp's keys of query row i of head h (batch row b): GQA_KEYS keys at a time (their loads
 * in flight together, the dot products' shuffles interleaved), keys j0 + u for j0 = first,
 * first + step, ... below end. Lanes split the dot product over d and keep their d's of the
 * weighted V sum, with the running maximum m and sum l of an online softmax. */
template <typename T>
__device__ __forceinline__ void gqa_warp_keys(const kiln_gpu_gqa &a, const float (&q)[HEAD_PER_LANE], const T *kb,
                                              const T *vb, int64_t b, int64_t h, int64_t i, int64_t first, int64_t end,
                                              int64_t step, float &m, float &l, float (&acc)[HEAD_PER_LANE])
{
    const int lane = threadIdx.x % 32;
    const int64_t H = a.H;
    for (int64_t j0 = first; j0 < end; j0 += step) {
        float dot[GQA_KEYS];
#pragma unroll
        for (int u = 0; u < GQA_KEYS; u++) {
            const T *kr = kb + (j0 + u) * H;
            dot[u] = 0.0f;
            if (j0 + u < end)
#pragma unroll
                for (int k = 0; k < HEAD_PER_LANE; k++) {
                    int64_t d = lane + 32 * k;
                    if (d < H) dot[u] += q[k] * kiln_to_f<T>(kr[d]);
                }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int u = 0; u < GQA_KEYS; u++) dot[u] += __shfl_xor_sync(KILN_FULL_MASK, dot[u], o);
        float sc[GQA_KEYS], mn = m;
#pragma unroll
        for (int u = 0; u < GQA_KEYS; u++) {
            const int64_t j = j0 + u;
            sc[u] = -INFINITY;
            if (j >= end) continue;
            sc[u] = dot[u] * a.scale;
            if (a.softcap > 0.0f) sc[u] = a.softcap * tanhf(sc[u] / a.softcap);
            if (a.bias) sc[u] += kiln_to_f<T>(((const T *)a.bias)[b * a.bias_b + h * a.bias_h + i * a.bias_s + j]);
            mn = fmaxf(mn, sc[u]);
        }
        if (mn == -INFINITY) continue; /* every logit so far is -inf: nothing to weigh yet */
        const float corr = expf(m - mn);
        float e[GQA_KEYS];
        l *= corr;
#pragma unroll
        for (int u = 0; u < GQA_KEYS; u++) {
            e[u] = sc[u] == -INFINITY ? 0.0f : expf(sc[u] - mn);
            l += e[u];
        }
#pragma unroll
        for (int k = 0; k < HEAD_PER_LANE; k++) {
            int64_t d = lane + 32 * k;
            if (d >= H) continue;
            float v = acc[k] * corr;
#pragma unroll
            for (int u = 0; u < GQA_KEYS; u++) {
                /* loaded whatever the weight (so with K's loads), added only where it is not 0 */
                const float x = j0 + u < end ? kiln_to_f<T>((vb + (j0 + u) * H)[d]) : 0.0f;
                v += e[u] != 0.0f ? e[u] * x : 0.0f;
            }
            acc[k] = v;
        }
        m = mn;
    }
}

/* y [H] from the partial softmax states of n key runs at part (float [n][H + 2]: maximum, sum,
 * unnormalized sums; written by other blocks, so read past L1), elements t0, t0 + tstep, ... */
template <typename T>
__device__ __forceinline__ void gqa_combine_row(const kiln_gpu_gqa &a, const float *part, int n, T *y, int t0,
                                                int tstep)
{
    const int64_t stride = a.H + 2;
    float M = -INFINITY;
    for (int c = 0; c < n; c++) {
        const float mc = kiln_load_l2(part + c * stride), lc = kiln_load_l2(part + c * stride + 1);
        if (lc > 0.0f && mc > M) M = mc;
    }
    for (int64_t d = t0; d < a.H; d += tstep) {
        float sum = 0.0f, o = 0.0f;
        for (int c = 0; c < n; c++) {
            const float *pc = part + c * stride;
            const float lc = kiln_load_l2(pc + 1);
            if (lc > 0.0f) {
                float f = expf(kiln_load_l2(pc) - M);
                sum += lc * f;
                o += kiln_load_l2(pc + 2 + d) * f;
            }
        }
        y[d] = kiln_from_f<T>(sum > 0.0f ? o / sum : 0.0f);
    }
}

/* grid (S * splits, N, B), BLOCK threads: split c of query row i of head h of batch row b. The
 * row's keys are cut into `splits` equal runs, and warp w takes GQA_KEYS keys at a time, w, w +
 * WARPS, ... of run c's groups of GQA_KEYS (gqa_warp_keys). A head sink (or smooth_softmax's 0)
 * is one more logit with a zero value row, taken by warp 0 of run 0. One split writes the
 * output; several write their maximum, sum and unnormalized sums to part for
 * gqa_combine_kernel. */
template <typename T>
__global__ void gqa_attn_kernel(kiln_gpu_gqa a)
{
    kiln_pdl_trigger(); /* the GEMV after it may start loading its weights */
    __shared__ float wm[WARPS], wl[WARPS];
    __shared__ float wacc[WARPS][KILN_GPU_GQA_MAX_HEAD];
    const int64_t i = blockIdx.x / a.splits, h = blockIdx.y, b = blockIdx.z;
    const int split = (int)(blockIdx.x % a.splits);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t H = a.H, hk = h / (a.N / a.Nkv);
    T *y = (T *)a.y + ((b * a.S + i) * a.N + h) * a.H;
    float *part = a.splits > 1 ? a.part + ((((b * a.N + h) * a.S + i) * a.splits + split) * (a.H + 2)) : NULL;
    if (!gqa_row_ok(a, b, i)) {
        for (int64_t d = threadIdx.x; d < a.H; d += BLOCK) y[d] = kiln_from_f<T>(0.0f);
        if (part && threadIdx.x == 0) part[0] = -INFINITY, part[1] = 0.0f; /* the combine writes zeros too */
        return;
    }
    float q[HEAD_PER_LANE];
    gqa_query<T>(a, b, i, h, lane, q);
    int64_t start, len;
    gqa_window(a, b, i, &start, &len);
    if (a.splits > 1) { /* this block's run of the keys */
        const int64_t per = (len + a.splits - 1) / a.splits, s0 = start + split * per;
        const int64_t s1 = s0 + per < start + len ? s0 + per : start + len;
        start = s0, len = s1 > s0 ? s1 - s0 : 0;
    }
    const T *kb = (const T *)a.kc + (b * a.Nkv + hk) * a.L * H;
    const T *vb = (const T *)a.vc + (b * a.Nkv + hk) * a.L * H;
    float m, l, acc[HEAD_PER_LANE];
    gqa_state_init<T>(a, h, w == 0 && split == 0, m, l, acc);
    gqa_warp_keys<T>(a, q, kb, vb, b, h, i, start + GQA_KEYS * w, start + len, GQA_KEYS * WARPS, m, l, acc);
    if (lane == 0) wm[w] = m, wl[w] = l;
#pragma unroll
    for (int k = 0; k < HEAD_PER_LANE; k++) {
        int64_t d = lane + 32 * k;
        if (d < H) wacc[w][d] = acc[k];
    }
    __syncthreads();
    for (int64_t d = threadIdx.x; d < H; d += BLOCK) {
        float M = -INFINITY;
        for (int k = 0; k < WARPS; k++)
            if (wl[k] > 0.0f && wm[k] > M) M = wm[k];
        float sum = 0.0f, o = 0.0f;
        for (int k = 0; k < WARPS; k++)
            if (wl[k] > 0.0f) {
                float f = expf(wm[k] - M);
                sum += wl[k] * f;
                o += wacc[k][d] * f;
            }
        if (part) {
            part[2 + d] = o;
            if (d == 0) part[0] = M, part[1] = sum;
        } else {
            y[d] = kiln_from_f<T>(sum > 0.0f ? o / sum : 0.0f);
        }
    }
}

/* grid (S, N, B): the splits' states of query row i of head h of batch row b combined, as the
 * warps' are within a block. */
template <typename T>
__global__ void gqa_combine_kernel(kiln_gpu_gqa a)
{
    kiln_pdl_trigger(); /* the GEMV after it may start loading its weights */
    const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    gqa_combine_row<T>(a, a.part + ((b * a.N + h) * a.S + i) * a.splits * (a.H + 2), a.splits,
                       (T *)a.y + ((b * a.S + i) * a.N + h) * a.H, threadIdx.x, blockDim.x);
}

/* Key runs of at least this many keys in the decode kernel (fewer runs to combine). */
#define GQA_DECODE_RUN 16
/* Threads of a decode block: G query heads, gqa_decode_warps(G) warps each. */
#define GQA_DECODE_THREADS 512

/* Warps a query head of the decode kernel: up to 4, within GQA_DECODE_THREADS. */
__host__ __device__ __forceinline__ int gqa_decode_warps(int64_t G)
{
    return G <= 4 ? 4 : (int)(GQA_DECODE_THREADS / 32 / G);
}

/* Decode (S = 1), grid (splits, Nkv, B), 32 G W threads for the G = N / Nkv query heads of a
 * KV head (G <= KILN_GPU_GQA_DECODE_MAX_G) and W = gqa_decode_warps(G): warps g W .. g W + W - 1
 * take query head hk G + g over run c of the row's keys, W keys apart (gqa_warp_keys), so the
 * heads' warps read each K and V row together (from L1 after the first); the W warps of a head
 * are combined in shared memory. The runs are of GQA_DECODE_RUN keys or more, `runs` of them
 * (the rest of the grid returns at once). With a shared buffer, the block whose run holds the
 * new row writes it (K rotated) first and reads it back; unshared, gqa_present_kernel has
 * written it. One run writes the output; several write their states to part and take a ticket
 * each: the last one combines them and puts the ticket back to zero. */
template <typename T>
__global__ void __launch_bounds__(GQA_DECODE_THREADS) gqa_decode_kernel(kiln_gpu_gqa a)
{
    kiln_pdl_trigger(); /* the GEMV after it may start loading its weights */
    kiln_pdl_wait();    /* launched early itself (kiln_launch_pdl) */
    __shared__ int last;
    __shared__ float wm[GQA_DECODE_THREADS / 32], wl[GQA_DECODE_THREADS / 32];
    __shared__ float wacc[GQA_DECODE_THREADS / 32][KILN_GPU_GQA_MAX_HEAD];
    const int64_t hk = blockIdx.y, b = blockIdx.z, G = a.N / a.Nkv, H = a.H;
    const int W = gqa_decode_warps(G), split = (int)blockIdx.x, wid = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = wid / W, w = wid % W;
    const int64_t h = hk * G + g;
    T *y = (T *)a.y + (b * a.N + h) * H;
    if (!gqa_row_ok(a, b, 0)) { /* every block of the row returns here: no tickets */
        if (split == 0 && w == 0)
            for (int64_t d = lane; d < H; d += 32) y[d] = kiln_from_f<T>(0.0f);
        return;
    }
    int64_t start, len;
    gqa_window(a, b, 0, &start, &len);
    int64_t per = (len + a.splits - 1) / a.splits;
    if (per < GQA_DECODE_RUN) per = GQA_DECODE_RUN;
    const int runs = len > 0 ? (int)((len + per - 1) / per) : 1;
    if (split >= runs) return;
    T *kc = (T *)a.kc + (b * a.Nkv + hk) * a.L * H;
    T *vc = (T *)a.vc + (b * a.Nkv + hk) * a.L * H;
    if (a.shared && split == (len > 0 ? (int)((len - 1) / per) : 0)) {
        const int64_t row = gqa_past_rows(a, b) * H;
        for (int64_t d = threadIdx.x; d < H; d += blockDim.x) {
            kc[row + d] = gqa_new_kv<T>(a, true, b, 0, hk, d);
            vc[row + d] = gqa_new_kv<T>(a, false, b, 0, hk, d);
        }
        __syncthreads(); /* the block reads the row back */
    }
    const int64_t s0 = start + split * per, s1 = s0 + per < start + len ? s0 + per : start + len;
    float q[HEAD_PER_LANE];
    gqa_query<T>(a, b, 0, h, lane, q);
    float m, l, acc[HEAD_PER_LANE];
    gqa_state_init<T>(a, h, split == 0 && w == 0, m, l, acc);
    gqa_warp_keys<T>(a, q, kc, vc, b, h, 0, s0 + GQA_KEYS * w, s1, GQA_KEYS * W, m, l, acc);
    if (lane == 0) wm[wid] = m, wl[wid] = l;
#pragma unroll
    for (int k = 0; k < HEAD_PER_LANE; k++) {
        const int64_t d = lane + 32 * k;
        if (d < H) wacc[wid][d] = acc[k];
    }
    __syncthreads();
    /* the head's W warps combined, by its first warp */
    float *part = runs > 1 ? a.part + (b * a.N + h) * a.splits * (H + 2) : NULL;
    if (w == 0) {
        float M = -INFINITY, sum = 0.0f;
        for (int k = g * W; k < g * W + W; k++)
            if (wl[k] > 0.0f && wm[k] > M) M = wm[k];
        for (int k = g * W; k < g * W + W; k++)
            if (wl[k] > 0.0f) sum += wl[k] * expf(wm[k] - M);
        for (int64_t d = lane; d < H; d += 32) {
            float o = 0.0f;
            for (int k = g * W; k < g * W + W; k++)
                if (wl[k] > 0.0f) o += wacc[k][d] * expf(wm[k] - M);
            if (runs == 1) y[d] = kiln_from_f<T>(sum > 0.0f ? o / sum : 0.0f);
            else part[split * (H + 2) + 2 + d] = o;
        }
        if (runs > 1 && lane == 0) part[split * (H + 2)] = M, part[split * (H + 2) + 1] = sum;
    }
    if (runs == 1) return;
    __threadfence(); /* the states are visible before the ticket */
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t *ticket = a.tickets + b * a.Nkv + hk;
        last = atomicAdd(ticket, 1) == runs - 1;
        if (last) *ticket = 0; /* every run has taken its ticket */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* the runs combined: the head's W warps take its elements in turn */
    gqa_combine_row<T>(a, part, runs, y, w * 32 + lane, 32 * W);
}

template <typename T>
static gpuError_t gqa_launch(gpuStream_t s, const kiln_gpu_gqa &a)
{
    const bool decode = a.decode;
    if (a.shared && !decode) {
        gqa_append_kernel<T><<<kiln_gpu_blocks(a.B * a.Nkv * a.S * a.H, BLOCK), BLOCK, 0, s>>>(a);
    } else if (!a.shared) {
        gqa_present_kernel<T><<<kiln_gpu_blocks(a.B * a.Nkv * a.L * a.H, BLOCK), BLOCK, 0, s>>>(a);
    }
    gpuError_t e = gpuGetLastError();
    if (e != gpuSuccess) return e;
    if (decode)
        return kiln_launch_pdl(KILN_PDL_ALL, gqa_decode_kernel<T>, dim3((unsigned)a.splits, (unsigned)a.Nkv, (unsigned)a.B),
                               dim3((unsigned)(32 * (a.N / a.Nkv) * gqa_decode_warps(a.N / a.Nkv))), 0, s, a);
    gqa_attn_kernel<T><<<dim3((unsigned)(a.S * a.splits), (unsigned)a.N, (unsigned)a.B), BLOCK, 0, s>>>(a);
    if (a.splits > 1) {
        if ((e = gpuGetLastError()) != gpuSuccess) return e;
        gqa_combine_kernel<T><<<dim3((unsigned)a.S, (unsigned)a.N, (unsigned)a.B), 128, 0, s>>>(a);
    }
    return gpuGetLastError();
}

extern "C" int kiln_gpu_gqa_splits(int64_t rows, int64_t L, int sm_count)
{
    int64_t want = 2 * (int64_t)(sm_count > 0 ? sm_count : 1);
    if (rows >= want || L < 128) return 1;
    int64_t splits = (want + rows - 1) / rows, most = L / 16; /* runs of 16 keys at the longest buffer */
    if (splits > most) splits = most;
    if (splits > 32) splits = 32;
    return splits < 1 ? 1 : (int)splits;
}

extern "C" gpuError_t kiln_gpu_gqa_run(gpuStream_t s, const kiln_gpu_gqa *a)
{
    if (a->B <= 0 || a->S <= 0 || a->H <= 0) return gpuSuccess;
    if (a->H > KILN_GPU_GQA_MAX_HEAD || a->S * (a->splits > 0 ? a->splits : 1) > INT32_MAX || a->N > 65535 ||
        a->B > 65535 || a->splits < 1 || (a->splits > 1 && !a->part))
        return kiln_gpu_bad_arg();
    if (a->dtype == KILN_DTYPE_FLOAT32) return gqa_launch<float>(s, *a);
    if (a->dtype == KILN_DTYPE_FLOAT16) return gqa_launch<kiln_gpu_half>(s, *a);
    return kiln_gpu_bad_arg();
}

/* ---- RMS normalizations ---- */

/* Row r's value j: x (+ skip + bias, rounded to T as the sum tensor is), in float. */
template <typename T>
__device__ __forceinline__ float rms_value(const T *x, const T *skip, int64_t skip_n, const T *bias, int64_t r, int64_t h,
                                           int64_t j)
{
    int64_t i = r * h + j;
    if (!skip) return kiln_to_f<T>(x[i]);
    /* a 64-bit modulo costs tens of instructions: only a skip broadcast over rows takes it */
    float v = kiln_to_f<T>(x[i]) + kiln_to_f<T>(skip[i < skip_n ? i : i % skip_n]);
    if (bias) v += kiln_to_f<T>(bias[j]);
    return kiln_to_f<T>(kiln_from_f<T>(v));
}

/* One block per row. */
template <typename T>
__global__ void rms_rows_kernel(const T *x, const T *skip, int64_t skip_n, const T *bias, const T *scale, int64_t scale_n,
                                T *y, T *sum, float *mean, float *inv, int64_t rows, int64_t h, float eps)
{
    kiln_pdl_trigger(); /* the GEMV after it may start loading its weights */
    kiln_pdl_wait();    /* launched early itself (kiln_launch_pdl) */
    __shared__ float part[WARPS];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float ss = 0.0f;
        for (int64_t j = threadIdx.x; j < h; j += BLOCK) {
            float v = rms_value<T>(x, skip, skip_n, bias, r, h, j);
            if (sum) sum[r * h + j] = kiln_from_f<T>(v);
            ss += v * v;
        }
        ss = kiln_warp_sum(ss);
        if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
        __syncthreads();
        float tot = 0.0f;
        for (int k = 0; k < WARPS; k++) tot += part[k];
        __syncthreads(); /* part is rewritten by the next row */
        float iv = 1.0f / sqrtf(tot / (float)h + eps);
        for (int64_t j = threadIdx.x; j < h; j += BLOCK)
            y[r * h + j] = kiln_from_f<T>(rms_value<T>(x, skip, skip_n, bias, r, h, j) * iv *
                                          kiln_to_f<T>(scale[j < scale_n ? j : j % scale_n]));
        if (threadIdx.x == 0) {
            if (inv) inv[r] = iv;
            if (mean) mean[r] = 0.0f;
        }
    }
}

/* Rows of h <= RMS_VALS * blockDim.x: one block per row, each thread holding its RMS_VALS
 * values (j = threadIdx.x + t * blockDim.x) in registers, so that every load of the row is in
 * flight at once and the row is read once. */
#define RMS_VALS 8
#define RMS_MAX_THREADS 1024

template <typename T>
__global__ void __launch_bounds__(RMS_MAX_THREADS) rms_held_kernel(const T *x, const T *skip, int64_t skip_n,
                                                                   const T *bias, const T *scale, int64_t scale_n,
                                                                   T *y, T *sum, float *mean, float *inv, int64_t h,
                                                                   float eps)
{
    kiln_pdl_trigger(); /* the GEMV after it may start loading its weights */
    kiln_pdl_wait();    /* launched early itself (kiln_launch_pdl) */
    __shared__ float part[RMS_MAX_THREADS / 32];
    const int64_t r = blockIdx.x;
    const int nt = blockDim.x, nw = nt / 32;
    float v[RMS_VALS], sc[RMS_VALS];
    float ss = 0.0f;
#pragma unroll
    for (int t = 0; t < RMS_VALS; t++) {
        const int64_t j = threadIdx.x + (int64_t)t * nt;
        v[t] = j < h ? rms_value<T>(x, skip, skip_n, bias, r, h, j) : 0.0f;
        sc[t] = j < h ? kiln_to_f<T>(scale[j < scale_n ? j : j % scale_n]) : 0.0f;
        ss += v[t] * v[t];
    }
    if (sum)
#pragma unroll
        for (int t = 0; t < RMS_VALS; t++) {
            const int64_t j = threadIdx.x + (int64_t)t * nt;
            if (j < h) sum[r * h + j] = kiln_from_f<T>(v[t]);
        }
    ss = kiln_warp_sum(ss);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int k = 0; k < nw; k++) tot += part[k];
    const float iv = 1.0f / sqrtf(tot / (float)h + eps);
#pragma unroll
    for (int t = 0; t < RMS_VALS; t++) {
        const int64_t j = threadIdx.x + (int64_t)t * nt;
        if (j < h) y[r * h + j] = kiln_from_f<T>(v[t] * iv * sc[t]);
    }
    if (threadIdx.x == 0) {
        if (inv) inv[r] = iv;
        if (mean) mean[r] = 0.0f;
    }
}

/* Eight consecutive values of T at p from o: one 16-byte (float32: two) store. */
template <typename T>
__device__ __forceinline__ void store8(T *p, const float *o)
{
    if (sizeof(T) == 2) {
        uint4 u;
        T *h = (T *)&u;
#pragma unroll
        for (int j = 0; j < 8; j++) h[j] = kiln_from_f<T>(o[j]);
        *(uint4 *)p = u;
    } else {
        ((float4 *)p)[0] = make_float4(o[0], o[1], o[2], o[3]);
        ((float4 *)p)[1] = make_float4(o[4], o[5], o[6], o[7]);
    }
}

/* rms_held_kernel for rows whose tensors are 16-byte aligned with h a multiple of 8, skip a
 * whole [rows, h] or one row, scale [h]: thread t holds values 8t to 8t + 7, each tensor read
 * with one 16-byte load a thread (three loads in flight, not 24). */
template <typename T>
__global__ void __launch_bounds__(RMS_MAX_THREADS) rms_vec_kernel(const T *x, const T *skip, bool skip_row,
                                                                  const T *bias, const T *scale, T *y, T *sum,
                                                                  float *mean, float *inv, int64_t h, float eps)
{
    kiln_pdl_trigger(); /* the GEMV after it may start loading its weights */
    kiln_pdl_wait();    /* launched early itself (kiln_launch_pdl) */
    __shared__ float part[RMS_MAX_THREADS / 32];
    const int64_t r = blockIdx.x, j = (int64_t)threadIdx.x * 8;
    const int nw = blockDim.x / 32;
    const bool in = j < h;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, t[8];
    if (in) {
        load8<T>(x + r * h + j, true, v);
        load8<T>(scale + j, true, sc);
        if (skip) {
            load8<T>(skip + (skip_row ? 0 : r * h) + j, true, t);
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] += t[k];
            if (bias) {
                load8<T>(bias + j, true, t);
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] += t[k];
            }
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = kiln_to_f<T>(kiln_from_f<T>(v[k])); /* the sum, rounded to T */
            if (sum) store8<T>(sum + r * h + j, v);
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) ss += v[k] * v[k];
    ss = kiln_warp_sum(ss);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int k = 0; k < nw; k++) tot += part[k];
    const float iv = 1.0f / sqrtf(tot / (float)h + eps);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = v[k] * iv * sc[k];
    if (in) store8<T>(y + r * h + j, v);
    if (threadIdx.x == 0) {
        if (inv) inv[r] = iv;
        if (mean) mean[r] = 0.0f;
    }
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" gpuError_t kiln_gpu_rms_rows(gpuStream_t s, int dtype, const void *x, const void *skip, int64_t skip_n,
                                        const void *bias, const void *scale, int64_t scale_n, void *y, void *sum,
                                        float *mean, float *inv, int64_t rows, int64_t h, float eps)
{
    if (rows <= 0 || h <= 0) return gpuSuccess;
    unsigned nb = rows < INT32_MAX ? (unsigned)rows : (unsigned)INT32_MAX;
    bool fits = h <= (int64_t)RMS_VALS * RMS_MAX_THREADS && rows < INT32_MAX;
    bool vec = fits && h % 8 == 0 && scale_n == h && (!skip || skip_n == h || skip_n == rows * h) && aligned16(x) &&
               aligned16(y) && aligned16(scale) && (!skip || aligned16(skip)) && (!bias || aligned16(bias)) &&
               (!sum || aligned16(sum));
    /* threads: the fewest warps that hold the row, RMS_VALS values each */
    int64_t nt = ((h + RMS_VALS - 1) / RMS_VALS + 31) / 32 * 32;
    gpuError_t e;
#define RMS_LAUNCH(T)                                                                                                  \
    do {                                                                                                               \
        if (vec)                                                                                                       \
            e = kiln_launch_pdl(KILN_PDL_ALL, rms_vec_kernel<T>, dim3(nb), dim3((unsigned)nt), 0, s, (const T *)x, (const T *)skip,  \
                                skip_n == h, (const T *)bias, (const T *)scale, (T *)y, (T *)sum, mean, inv, h, eps);  \
        else if (fits)                                                                                                 \
            e = kiln_launch_pdl(KILN_PDL_ALL, rms_held_kernel<T>, dim3(nb), dim3((unsigned)nt), 0, s, (const T *)x, (const T *)skip, \
                                skip_n, (const T *)bias, (const T *)scale, scale_n, (T *)y, (T *)sum, mean, inv, h,    \
                                eps);                                                                                  \
        else                                                                                                           \
            e = kiln_launch_pdl(KILN_PDL_ALL, rms_rows_kernel<T>, dim3(nb), dim3(BLOCK), 0, s, (const T *)x, (const T *)skip,        \
                                skip_n, (const T *)bias, (const T *)scale, scale_n, (T *)y, (T *)sum, mean, inv, rows, \
                                h, eps);                                                                               \
    } while (0)
    if (dtype == KILN_DTYPE_FLOAT32) RMS_LAUNCH(float);
    else if (dtype == KILN_DTYPE_FLOAT16) RMS_LAUNCH(kiln_gpu_half);
    else if (dtype == KILN_DTYPE_BFLOAT16) RMS_LAUNCH(kiln_gpu_bf16);
    else return kiln_gpu_bad_arg();
#undef RMS_LAUNCH
    return e;
}
